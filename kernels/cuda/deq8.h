/* SPDX-License-Identifier: MIT */
/*
 * Eight consecutive weights of a GGUF row, for the CUDA kernels' types
 * without a kernel of their own (Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K,
 * Q4_K, Q5_K, Q6_K, IQ4_XS): the values hyb's scalar dequantizers
 * (kernels/cpu/dequant.c, kquant_extra.c) compute, bit for bit. Each
 * product and sum is rounded on its own (__fmul_rn, __fadd_rn on the
 * device), as the CPU file computes them without contraction. The same
 * code builds as C on the host, where tests/unit/test_deq8.c holds it
 * against the CPU's dequantizers.
 *
 * Rows are GGUF blocks as they are: 2-byte aligned at best, so everything
 * is read a byte at a time (the compiler merges what it can).
 */
#ifndef HYB_CUDA_DEQ8_H
#define HYB_CUDA_DEQ8_H

#include <stdint.h>

#include "hyb/tensor_type.h"

#ifdef __CUDACC__
#include <cuda_fp16.h>
#define HYB_DQ static __host__ __device__ __forceinline__
#else
#include <string.h>
#define HYB_DQ static inline
#endif

#ifdef __CUDA_ARCH__
#define HYB_DQ_MUL(a, b) __fmul_rn((a), (b))
#define HYB_DQ_ADD(a, b) __fadd_rn((a), (b))
#define HYB_DQ_SUB(a, b) __fsub_rn((a), (b))
#else
#define HYB_DQ_MUL(a, b) ((a) * (b))
#define HYB_DQ_ADD(a, b) ((a) + (b))
#define HYB_DQ_SUB(a, b) ((a) - (b))
#endif

/* Bytes of a block and elements in it, of the types hyb_deq8 takes; 0: not one. */
HYB_DQ uint32_t hyb_deq8_block(uint32_t ty, uint32_t *elems)
{
	*elems = 256;
	switch (ty) {
	case HYB_TYPE_Q4_1: *elems = 32; return 20;
	case HYB_TYPE_Q5_0: *elems = 32; return 22;
	case HYB_TYPE_Q5_1: *elems = 32; return 24;
	case HYB_TYPE_IQ4_NL: *elems = 32; return 18;
	case HYB_TYPE_Q2_K: return 84;
	case HYB_TYPE_Q3_K: return 110;
	case HYB_TYPE_Q4_K: return 144;
	case HYB_TYPE_Q5_K: return 176;
	case HYB_TYPE_Q6_K: return 210;
	case HYB_TYPE_IQ4_XS: return 136;
	default: *elems = 0; return 0;
	}
}

HYB_DQ float hyb_dq_f16(const uint8_t *p)
{
	const uint32_t h = (uint32_t)p[0] | (uint32_t)p[1] << 8;
#ifdef __CUDA_ARCH__
	return __half2float(__ushort_as_half((unsigned short)h));
#else
	const uint32_t s = (h >> 15) << 31, e = (h >> 10) & 0x1f, m = h & 0x3ff;
	uint32_t bits;
	float f;

	if (e == 0) { /* zero and subnormals: m * 2^-24, exact */
		f = (float)m * 5.9604644775390625e-08f;
		return s ? -f : f;
	}
	bits = e == 31 ? s | 0x7f800000u | m << 13 : s | (e + 112) << 23 | m << 13;
	memcpy(&f, &bits, 4);
	return f;
#endif
}

HYB_DQ uint16_t hyb_dq_u16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

/* ggml-common.h kvalues_iq4nl (constant memory on the device: no local array) */
#define HYB_DQ_KVALUES { -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113 }
#ifdef __CUDACC__
static __constant__ int8_t hyb_dq_kvalues_dev[16] = HYB_DQ_KVALUES;
#endif

HYB_DQ float hyb_dq_iq4(int i)
{
#ifdef __CUDA_ARCH__
	return (float)hyb_dq_kvalues_dev[i];
#else
	static const int8_t v[16] = HYB_DQ_KVALUES;

	return (float)v[i];
#endif
}

/* Q4_K/Q5_K sub-block j's 6-bit scale and min (ggml's get_scale_min_k4) */
HYB_DQ void hyb_dq_k4_scale(const uint8_t *s, int j, int *sc, int *m)
{
	if (j < 4) {
		*sc = s[j] & 63;
		*m = s[j + 4] & 63;
	} else {
		*sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
		*m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
	}
}

/*
 * Q4_1 and Q5_1 apart: w[i] = q * d of elements c0 .. c0 + 7 and *m the
 * block's min, for a dot that adds m times its x's block sum once, as the
 * CPU's does (ggml_vec_dot_q4_1_q8_1: m * s).
 */
HYB_DQ void hyb_deq8_q1(uint32_t ty, const uint8_t *row, uint32_t c0, float *w, float *m)
{
	const uint8_t *b = row + (uint64_t)(c0 / 32) * (ty == HYB_TYPE_Q4_1 ? 20 : 24);
	const int e0 = (int)(c0 % 32);
	const float d = hyb_dq_f16(b);

	*m = hyb_dq_f16(b + 2);
	for (int i = 0; i < 8; i++) {
		const int j = e0 + i;
		int q = (b[(ty == HYB_TYPE_Q4_1 ? 4 : 8) + j % 16] >> (4 * (j / 16))) & 0xF;

		if (ty == HYB_TYPE_Q5_1)
			q |= ((b[4 + j / 8] >> (j % 8)) & 1) << 4;
		w[i] = HYB_DQ_MUL((float)q, d);
	}
}

/*
 * w[0..8) = elements c0 .. c0 + 7 of a row of type ty (c0 % 8 == 0). Types
 * hyb_deq8_block() does not know give zeros.
 */
HYB_DQ void hyb_deq8(uint32_t ty, const uint8_t *row, uint32_t c0, float *w)
{
	uint32_t qk;
	const uint32_t bb = hyb_deq8_block(ty, &qk);
	const uint8_t *b = row + (uint64_t)(c0 / (qk ? qk : 1)) * bb;
	const int e0 = (int)(c0 % (qk ? qk : 1));

	switch (ty) {
	case HYB_TYPE_Q4_1:
	case HYB_TYPE_Q5_1:
	case HYB_TYPE_Q5_0:
	case HYB_TYPE_IQ4_NL: {
		/* 32 elements: element j's nibble is qs[j % 16] >> 4 (j / 16) */
		const float d = hyb_dq_f16(b);
		const float m = ty == HYB_TYPE_Q4_1 || ty == HYB_TYPE_Q5_1 ? hyb_dq_f16(b + 2) : 0;
		const uint8_t *qs = b + (ty == HYB_TYPE_Q4_1 ? 4 : ty == HYB_TYPE_Q5_0 ? 6
						   : ty == HYB_TYPE_Q5_1 ? 8 : 2);
		const uint8_t *qh = b + (ty == HYB_TYPE_Q5_0 ? 2 : 4);

		for (int i = 0; i < 8; i++) {
			const int j = e0 + i;
			int q = (qs[j % 16] >> (4 * (j / 16))) & 0xF;

			if (ty == HYB_TYPE_IQ4_NL) {
				w[i] = HYB_DQ_MUL(d, hyb_dq_iq4(q));
			} else if (ty == HYB_TYPE_Q4_1) {
				w[i] = HYB_DQ_ADD(HYB_DQ_MUL((float)q, d), m);
			} else {
				q |= ((qh[j / 8] >> (j % 8)) & 1) << 4;
				w[i] = ty == HYB_TYPE_Q5_0 ? HYB_DQ_MUL((float)(q - 16), d)
							   : HYB_DQ_ADD(HYB_DQ_MUL((float)q, d), m);
			}
		}
		return;
	}
	case HYB_TYPE_Q4_K:
	case HYB_TYPE_Q5_K: {
		/* 8 sub-blocks of 32: d * sc * q - dmin * m */
		const float d = hyb_dq_f16(b), dmin = hyb_dq_f16(b + 2);
		const int j = e0 / 32, c = j / 2, h = j % 2;
		const uint8_t *qs = b + (ty == HYB_TYPE_Q4_K ? 16 : 48);
		int sc, m;

		hyb_dq_k4_scale(b + 4, j, &sc, &m);
		const float dl = HYB_DQ_MUL(d, (float)sc), ml = HYB_DQ_MUL(dmin, (float)m);

		for (int i = 0; i < 8; i++) {
			const int l = (e0 + i) % 32;
			int q = (qs[32 * c + l] >> (4 * h)) & 0xF;

			if (ty == HYB_TYPE_Q5_K)
				q |= ((b[16 + l] >> (2 * c + h)) & 1) << 4;
			w[i] = HYB_DQ_SUB(HYB_DQ_MUL(dl, (float)q), ml);
		}
		return;
	}
	case HYB_TYPE_Q6_K: {
		/* halves of 128: 4 quarters of 32, each ql nibble + 2 bits of qh */
		const uint8_t *ql = b + 64 * (e0 / 128), *qh = b + 128 + 32 * (e0 / 128);
		const int8_t *sc = (const int8_t *)(b + 192) + 8 * (e0 / 128);
		const float d = hyb_dq_f16(b + 208);
		const int quarter = (e0 % 128) / 32;

		for (int i = 0; i < 8; i++) {
			const int l = (e0 + i) % 32;
			const int lo = (ql[l + 32 * (quarter % 2)] >> (4 * (quarter / 2))) & 0xF;
			const int q = (lo | ((qh[l] >> (2 * quarter)) & 3) << 4) - 32;

			w[i] = HYB_DQ_MUL(HYB_DQ_MUL(d, (float)sc[l / 16 + 2 * quarter]), (float)q);
		}
		return;
	}
	case HYB_TYPE_Q2_K:
	case HYB_TYPE_Q3_K: {
		/* 16 sub-blocks of 16; 2-bit codes in qs, Q3_K's third bit in hmask */
		const uint8_t *qs = b + (ty == HYB_TYPE_Q2_K ? 16 : 32);
		const int e = e0, j = e / 16;
		float dl, ml = 0;

		if (ty == HYB_TYPE_Q2_K) {
			const uint8_t s = b[j];

			dl = HYB_DQ_MUL(hyb_dq_f16(b + 80), (float)(s & 0xF));
			ml = HYB_DQ_MUL(hyb_dq_f16(b + 82), (float)(s >> 4));
		} else {
			const uint8_t *s = b + 96;
			const int lo = j < 8 ? s[j] & 0xF : s[j - 8] >> 4;

			dl = HYB_DQ_MUL(hyb_dq_f16(b + 108),
					(float)((lo | ((s[8 + j % 4] >> (2 * (j / 4))) & 3) << 4) - 32));
		}
		for (int i = 0; i < 8; i++) {
			const int x = e + i;
			int q = (qs[32 * (x / 128) + x % 32] >> (2 * ((x % 128) / 32))) & 3;

			if (ty == HYB_TYPE_Q2_K) {
				w[i] = HYB_DQ_SUB(HYB_DQ_MUL(dl, (float)q), ml);
			} else {
				q |= ((b[x % 32] >> (4 * (x / 128) + (x % 128) / 32)) & 1) << 2;
				w[i] = HYB_DQ_MUL(dl, (float)(q - 4));
			}
		}
		return;
	}
	case HYB_TYPE_IQ4_XS: {
		/* 8 sub-blocks of 32, 6-bit scales less 32, non-linear levels */
		const int ib = e0 / 32;
		const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) |
			       ((hyb_dq_u16(b + 2) >> (2 * ib)) & 3) << 4;
		const float dl = HYB_DQ_MUL(hyb_dq_f16(b), (float)(ls - 32));

		for (int i = 0; i < 8; i++) {
			const int jj = (e0 + i) % 32;
			const int q = (b[8 + 16 * ib + jj % 16] >> (4 * (jj / 16))) & 0xF;

			w[i] = HYB_DQ_MUL(dl, hyb_dq_iq4(q));
		}
		return;
	}
	default:
		for (int i = 0; i < 8; i++)
			w[i] = 0;
	}
}

#endif
