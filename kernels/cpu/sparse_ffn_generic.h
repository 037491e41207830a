/* SPDX-License-Identifier: MIT */
/*
 * Sparse FFN kernels for the weight types that have no hand-written ones
 * (HYB_SPARSE_GEN_TYPES: Q4_1, Q5_0, Q5_1, IQ4_NL and the 256-element
 * K-quants). Written once and included by every level's file
 * (sparse_ffn_ref.c, sparse_ffn_avx2.c, sparse_ffn_avx512_body.h), so each
 * is compiled with its level's flags; only those files include it.
 *
 * dot: a sparse row dot is a GEMV on one row, so every row goes through
 * the dense GEMV of the level that prepared x (x->gemv, set by
 * hyb_sparse_prep_x() from that level's gemm_m1[], which takes any row
 * count): the dense path's arithmetic and SIMD code, no second kernel per
 * type to keep right. Rows are scattered, so the next one (the caller's
 * look-ahead included) is prefetched while this one runs.
 *
 * axpy: y += h * w needs w in float. Rows are dequantized (the dense
 * path's dequantize[]) a piece of SGEN_PIECE elements at a time - one
 * K-quant super-block, eight 32-blocks - into a stack buffer and added;
 * pieces outer, rows inner, so the piece of y stays in L1 across the rows,
 * and each row's next piece is prefetched before the other rows come
 * round. Per element the rows are added in order and nothing is rounded
 * (axpy_rounds stays false), so every level gives the same floats. At the
 * AVX-512 levels the 32-blocks (Q4_1, Q5_0, Q5_1, IQ4_NL: small real models'
 * FFNs) are dequantized and added 32 at a time in registers (sgen_axpy32):
 * the same operations per element as the scalar path, so the same floats.
 */
#ifndef HYB_SPARSE_FFN_GENERIC_H
#define HYB_SPARSE_FFN_GENERIC_H

#include <string.h>

#include "sparse_ffn_kernels.h"

#define SGEN_PIECE 256 /* a multiple of every block size */

#if defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#include <string.h>

#include "blocks.h"

/*
 * y[0..m) += hr * w for m elements (a multiple of 32) of a Q4_1/Q5_0/Q5_1/
 * IQ4_NL row, each weight as dequant.c computes it - (q - 16) * d,
 * q * d + m (a product, then a sum: no fused multiply-add), d * level -
 * and each y as the scalar loop adds it (the product, then the sum), in
 * registers. false for another type.
 */
static inline bool sgen_axpy32(uint32_t type, const uint8_t *p, int64_t m, float hr, float *y)
{
	const __m512 h = _mm512_set1_ps(hr);
	const bool q5 = type == HYB_TYPE_Q5_0 || type == HYB_TYPE_Q5_1;
	const bool min = type == HYB_TYPE_Q4_1 || type == HYB_TYPE_Q5_1;
	const uint32_t bb = type == HYB_TYPE_Q4_1 ? 20 : type == HYB_TYPE_Q5_0 ? 22
			  : type == HYB_TYPE_Q5_1 ? 24 : 18;
	const uint32_t qs_off = type == HYB_TYPE_Q4_1 ? 4 : type == HYB_TYPE_Q5_0 ? 6
			      : type == HYB_TYPE_Q5_1 ? 8 : 2;
	const __m256i levels = _mm256_broadcastsi128_si256(
		_mm_loadu_si128((const __m128i *)hyb_kvalues_iq4nl));
	const __m256i m4 = _mm256_set1_epi8(0xF);

	if (type != HYB_TYPE_Q4_1 && type != HYB_TYPE_Q5_0 && type != HYB_TYPE_Q5_1 &&
	    type != HYB_TYPE_IQ4_NL)
		return false;
	for (int64_t b = 0; b < m / 32; b++, p += bb, y += 32) {
		uint16_t dh, mh;
		uint32_t qh = 0;

		memcpy(&dh, p, 2);
		memcpy(&mh, p + 2, 2);
		const __m512 d = _mm512_set1_ps(_cvtsh_ss(dh));
		const __m128i q = _mm_loadu_si128((const __m128i *)(p + qs_off));
		/* elements 0..15 the low nibbles, 16..31 the high ones */
		__m256i v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), m4);

		if (q5) {
			memcpy(&qh, p + (type == HYB_TYPE_Q5_0 ? 2 : 4), 4);
			v = _mm256_mask_add_epi8(v, (__mmask32)qh, v, _mm256_set1_epi8(0x10));
		}
		if (type == HYB_TYPE_IQ4_NL)
			v = _mm256_shuffle_epi8(levels, v);
		else if (type == HYB_TYPE_Q5_0)
			v = _mm256_sub_epi8(v, _mm256_set1_epi8(16));
		for (int i = 0; i < 2; i++) {
			const __m128i v8 = i ? _mm256_extracti128_si256(v, 1)
					     : _mm256_castsi256_si128(v);
			__m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v8)), d);

			if (min)
				f = _mm512_add_ps(f, _mm512_set1_ps(_cvtsh_ss(mh)));
			_mm512_storeu_ps(y + 16 * i,
					 _mm512_add_ps(_mm512_loadu_ps(y + 16 * i), _mm512_mul_ps(h, f)));
		}
	}
	return true;
}
#endif

/* into L2, as the hand-written kernels prefetch */
static inline void sgen_prefetch(const void *p, uint64_t bytes)
{
	for (uint64_t off = 0; off < bytes; off += 64)
		__builtin_prefetch((const char *)p + off, 0, 2);
}

/*
 * Rows this short are gathered into one buffer and go through the GEMV in
 * one call: for small models' rows (SmolLM2's 576 elements, Gemma 3's 640)
 * a call per row costs more than the row's own work. The gathered bytes come
 * from DRAM once, as they would anyway, and the GEMV reads them from L1/L2.
 */
#define SGEN_GATHER_BYTES 32768

static void sgen_dot_pf(int64_t k, const void *const *rows, int n, int n_pf,
			const struct hyb_sparse_x *x, float *out)
{
	const uint64_t rb = hyb_row_bytes(x->type, (uint64_t)k);

	if (rb * (uint64_t)n <= SGEN_GATHER_BYTES && n > 1) {
		_Alignas(64) uint8_t buf[SGEN_GATHER_BYTES];

		for (int r = 0; r < n; r++) {
			if (r + 1 < n + n_pf)
				sgen_prefetch(rows[r + 1], rb);
			memcpy(buf + (uint64_t)r * rb, rows[r], rb);
		}
		x->gemv(k, buf, rb, n, x->q, 0, 1, out, (size_t)n);
		return;
	}
	for (int r = 0; r < n; r++) {
		if (r + 1 < n + n_pf)
			sgen_prefetch(rows[r + 1], rb);
		x->gemv(k, rows[r], rb, 1, x->q, 0, 1, out + r, 1);
	}
}

static void sgen_dot(int64_t k, const void *const *rows, int n, const struct hyb_sparse_x *x,
		     float *out)
{
	sgen_dot_pf(k, rows, n, 0, x, out);
}

static inline void sgen_axpy(uint32_t type, int64_t k, const void *const *rows, const float *h,
			     int n, int n_pf, float *y)
{
	/* every level's dequantize[] of these types is the scalar one */
	const hyb_dequantize_fn dq = hyb_cpu_kernels(HYB_ISA_SCALAR)->dequantize[type];
	const uint64_t pb = hyb_row_bytes(type, SGEN_PIECE);
	float w[SGEN_PIECE];

	for (int64_t e0 = 0; e0 < k; e0 += SGEN_PIECE) {
		const int64_t m = k - e0 < SGEN_PIECE ? k - e0 : SGEN_PIECE;
		const int64_t left = k - e0 - m; /* elements after this piece */
		const uint64_t next = hyb_row_bytes(type, (uint64_t)(left < SGEN_PIECE ? left
										     : SGEN_PIECE));
		const uint64_t off = (uint64_t)(e0 / SGEN_PIECE) * pb;
		float *yp = y + e0;

		if (!left) /* the caller's next rows, while the last piece runs */
			for (int r = n; r < n + n_pf; r++)
				sgen_prefetch(rows[r], 2 * pb);
		for (int r = 0; r < n; r++) {
			const uint8_t *p = (const uint8_t *)rows[r] + off;
			const float hr = h[r];

			sgen_prefetch(p + pb, next);
#if defined(__AVX512BW__) && defined(__AVX512VL__)
			if (sgen_axpy32(type, p, m, hr, yp))
				continue;
#endif
			dq(p, w, m);
			for (int64_t i = 0; i < m; i++)
				yp[i] += hr * w[i];
		}
	}
}

/* the table entries of one type: dot and dot_pf are shared, the axpys know their type */
#define SGEN_AXPY(name, T)                                                                  \
	static void sgen_axpyp_##name(int64_t k, const void *const *rows, const float *h,   \
				      int n, int n_pf, float *y)                             \
	{                                                                                   \
		sgen_axpy(T, k, rows, h, n, n_pf, y);                                       \
	}                                                                                   \
	static void sgen_axpy_##name(int64_t k, const void *const *rows, const float *h,    \
				     int n, float *y)                                       \
	{                                                                                   \
		sgen_axpy(T, k, rows, h, n, 0, y);                                          \
	}
HYB_SPARSE_GEN_TYPES(SGEN_AXPY)
#undef SGEN_AXPY

static void sgen_fill(struct hyb_sparse_kernels *k)
{
#define SGEN_SET(name, T)                                                                   \
	k->dot[T] = sgen_dot;                                                               \
	k->dot_pf[T] = sgen_dot_pf;                                                         \
	k->axpy[T] = sgen_axpy_##name;                                                      \
	k->axpy_pf[T] = sgen_axpyp_##name;                                                  \
	k->axpy_rounds[T] = false;
	HYB_SPARSE_GEN_TYPES(SGEN_SET)
#undef SGEN_SET
}

#endif
