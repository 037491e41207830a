/* SPDX-License-Identifier: MIT */
/*
 * AVX-512 Q2_K, Q3_K, Q5_K and IQ4_XS kernels, written once and compiled
 * three times: by gemm_k_extra_avx512.c (HYB_VNNI 0), gemm_k_extra_avx512vnni.c
 * (HYB_VNNI 1, vpdpwssd for the scale multiply-add) and gemm_k_extra_amx.c
 * (HYB_AMX 1 too: the same kernels, whose packed prefill is the AMX level's
 * of gemm_q_avx512_body.h). Only those include it.
 *
 * Every output is summed as llama.cpp's x86 AVX-512 build sums it. Which of
 * its kernels runs depends on the weight's row count and the column count
 * (ggml-cpu.c ggml_compute_forward_mul_mat, tiled/tiled.cpp, repack.cpp):
 *
 * - fewer than 8 columns, not repacked: ggml_vec_dot_*_q8_K per (row,
 *   column), AVX2 branch of arch/x86/quants.c (M_DOT);
 * - 8 or more columns, not repacked: the tiled K-quant matmul, VNNI
 *   microkernel (tiled-kernel.cpp tiled_run_micro_vnni_8x16) (M_TILED);
 * - Q2_K with a row count divisible by 8 is repacked to q2_K_8x8 on
 *   AVX-512 (repack.cpp ggml_repack_get_optimal_repack_type): the first
 *   ncols - ncols % 4 columns go through ggml_gemm_q2_K_8x8_q8_K (M_GEMM),
 *   the others through ggml_gemv_q2_K_8x8_q8_K (M_GEMV).
 *
 * The integer dot products are exact in any grouping; what has to match is
 * which integer sums are converted to float and how those are scaled and
 * added. All four vec_dots sum 32 consecutive elements per 256-bit product,
 * so their 8 int32 lanes hold elements e with (e % 32) / 4 == lane; here a
 * 512-bit product holds 64 consecutive elements and lanes l and l + 8 fold
 * into llama.cpp's lane l. The offsets that llama.cpp applies per element
 * (Q3_K's -4) stay per element here too, so each lane's integer is the same.
 *
 * Here one kernel shape, direct: XR rows x up to XC columns per tile,
 * straight from the GGUF blocks, each row's unpacked block reused by every
 * column of the tile; the next tile's rows are prefetched (decode is
 * memory-bound). Prefill (M_TILED, M_GEMM) goes to the packed panels of
 * gemm_q_avx512_packed.h first, which sum alike.
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "cpu_internal.h"
#include "kquant_extra.h"

#ifndef HYB_VNNI
#error "define HYB_VNNI before including gemm_k_extra_avx512_body.h"
#endif
#ifndef HYB_AMX
#define HYB_AMX 0
#endif

#define XR 4 /* rows of a tile */
#define XC 4 /* columns of a tile */
#define XSUPER_BYTES (256 * 1024) /* weight rows that stay in L2 while every column group passes */

#define AI static inline __attribute__((always_inline))

enum xt { X_Q2, X_Q3, X_Q5, X_IQ4 };
enum xm { M_DOT, M_TILED, M_GEMV, M_GEMM };

static const size_t xt_bytes[] = { 84, 110, 176, 136 };

#include "avx512_dots.h"

/* per-word shift counts: words 0-15 (elements 0-31 of a 64) by a, words 16-31 by b */
static const uint16_t sh_pairs[5][32] = {
#define SH(a, b) { a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, \
		   b, b, b, b, b, b, b, b, b, b, b, b, b, b, b, b }
	SH(0, 2), SH(4, 6), SH(0, 1), SH(2, 3), SH(0, 4),
#undef SH
};
/* 2-bit codes of chunk j: (j % 2 ? 4,6 : 0,2); high bits of Q3_K/Q5_K chunk j: 2j, 2j+1 */
static const uint16_t sh_hbit[4][32] = {
#define SH(a, b) { a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, \
		   b, b, b, b, b, b, b, b, b, b, b, b, b, b, b, b }
	SH(0, 1), SH(2, 3), SH(4, 5), SH(6, 7),
#undef SH
};
/* Q3_K's high bits 2j, 2j+1 to bit 2: chunk 0 left by 2, 1; chunk j right by 2j - 2, 2j - 1 */
static const uint16_t sh_hbit2[4][32] = {
#define SH(a, b) { a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, \
		   b, b, b, b, b, b, b, b, b, b, b, b, b, b, b, b }
	SH(2, 1), SH(0, 1), SH(2, 3), SH(4, 5),
#undef SH
};
/* IQ4_XS nibbles: per 128-bit lane low, high, low, high */
static const uint16_t sh_iq4[32] = {
	0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4,
	0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4,
};

/* vpermw indices: word w of chunk j uses the scale of sub-block of 16 number 4j + w/8 */
static const uint16_t scale16_idx[4][32] = {
#define IDX(j) { 4 * j, 4 * j, 4 * j, 4 * j, 4 * j, 4 * j, 4 * j, 4 * j,                 \
		 4 * j + 1, 4 * j + 1, 4 * j + 1, 4 * j + 1, 4 * j + 1, 4 * j + 1, 4 * j + 1, \
		 4 * j + 1, 4 * j + 2, 4 * j + 2, 4 * j + 2, 4 * j + 2, 4 * j + 2, 4 * j + 2, \
		 4 * j + 2, 4 * j + 2, 4 * j + 3, 4 * j + 3, 4 * j + 3, 4 * j + 3, 4 * j + 3, \
		 4 * j + 3, 4 * j + 3, 4 * j + 3 }
	IDX(0), IDX(1), IDX(2), IDX(3),
#undef IDX
};

/* pshufb controls: int16 scale j of a 128-bit lane for the low 256 bits, j + 1 for the high */
static inline __m512i pick_pair(int j)
{
	const __m256i a = _mm256_set1_epi16((short)(2 * j | (2 * j + 1) << 8));
	const __m256i b = _mm256_set1_epi16((short)((2 * j + 2) | (2 * j + 3) << 8));

	return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
}

AI __m512i bcast256(const uint8_t *p)
{
	return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p));
}

static inline uint16_t ld16(const void *p)
{
	uint16_t v;

	memcpy(&v, p, 2);
	return v;
}

/* one weight row's super-block, unpacked: 4 chunks of 64 elements in order */
struct xrow {
	__m512i q[4];      /* codes as vpmaddubsw's unsigned operand (IQ4_XS: |value|) */
	__m512i s[4];      /* int16 scale of each word's two elements */
	__mmask64 neg[4];  /* IQ4_XS: negative values */
	__m256i mins;      /* Q2_K: 16 mins; Q5_K: 8 mins in the low half (int16) */
	float d, dmin;
};

AI void unpack_q2(const struct hyb_block_q2_k *b, struct xrow *o)
{
	const __m512i m3 = _mm512_set1_epi8(3);
	const __m128i raw = _mm_loadu_si128((const __m128i *)b->scales);
	const __m128i m4 = _mm_set1_epi8(0xF);
	const __m512i sc = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(_mm_and_si128(raw, m4)));

	o->mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), m4));
	for (int j = 0; j < 4; j++) {
		const __m512i sh = _mm512_loadu_si512(sh_pairs[j % 2]);

		o->q[j] = _mm512_and_si512(_mm512_srlv_epi16(bcast256(b->qs + 32 * (j / 2)), sh), m3);
		o->s[j] = _mm512_permutexvar_epi16(_mm512_loadu_si512(scale16_idx[j]), sc);
	}
	o->d = _cvtsh_ss(b->d);
	o->dmin = _cvtsh_ss(b->dmin);
}

AI void unpack_q3(const struct hyb_block_q3_k *b, struct xrow *o)
{
	const __m512i m3 = _mm512_set1_epi8(3), four = _mm512_set1_epi8(4);
	const __m512i hm = bcast256(b->hmask);
	uint32_t a0, a1, a2;
	const uint32_t k1 = 0x03030303, k2 = 0x0f0f0f0f;

	/*
	 * the 16 6-bit scales, as dequantize_row_q3_K unpacks them; built in
	 * registers (a store-and-reload of the words would stall store forwarding)
	 */
	memcpy(&a0, b->scales, 4);
	memcpy(&a1, b->scales + 4, 4);
	memcpy(&a2, b->scales + 8, 4);
	const __m128i s8 = _mm_sub_epi8(_mm_setr_epi32(
		(int)((a0 & k2) | ((a2 & k1) << 4)), (int)((a1 & k2) | (((a2 >> 2) & k1) << 4)),
		(int)(((a0 >> 4) & k2) | (((a2 >> 4) & k1) << 4)),
		(int)(((a1 >> 4) & k2) | (((a2 >> 6) & k1) << 4))), _mm_set1_epi8(32));
	const __m512i sc = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(s8));

	for (int j = 0; j < 4; j++) {
		const __m512i lo = _mm512_and_si512(_mm512_srlv_epi16(bcast256(b->qs + 32 * (j / 2)),
			_mm512_loadu_si512(sh_pairs[j % 2])), m3);
		/* the high bit moved to bit 2 of its byte (left for chunk 0's bits 0, 1) */
		const __m512i hb = j ? _mm512_srlv_epi16(hm, _mm512_loadu_si512(sh_hbit2[j])) :
				       _mm512_sllv_epi16(hm, _mm512_loadu_si512(sh_hbit2[0]));

		/* lo | (hb & 4) */
		o->q[j] = _mm512_ternarylogic_epi32(lo, hb, four, 0xF8);
		o->s[j] = _mm512_permutexvar_epi16(_mm512_loadu_si512(scale16_idx[j]), sc);
	}
	o->d = _cvtsh_ss(b->d);
	o->dmin = 0.0f;
}

AI void unpack_q5(const struct hyb_block_q5_k *b, struct xrow *o)
{
	const __m512i m4 = _mm512_set1_epi8(0xF), one = _mm512_set1_epi8(1);
	const __m512i qh = bcast256(b->qh);
	uint32_t u0, u1, u2;

	/* the 8 scales and 8 mins as bytes, hyb_q4k_scales() on 32-bit words */
	memcpy(&u0, b->scales, 4);
	memcpy(&u1, b->scales + 4, 4);
	memcpy(&u2, b->scales + 8, 4);
	const uint64_t s64 = (uint64_t)(u0 & 0x3f3f3f3f) |
		(uint64_t)((u2 & 0x0f0f0f0f) | (((u0 >> 6) & 0x03030303) << 4)) << 32;
	const uint64_t m64 = (uint64_t)(u1 & 0x3f3f3f3f) |
		(uint64_t)(((u2 >> 4) & 0x0f0f0f0f) | (((u1 >> 6) & 0x03030303) << 4)) << 32;
	const __m512i sc = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)s64)));

	o->mins = _mm256_castsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)m64)));
	for (int j = 0; j < 4; j++) {
		const __m512i lo = _mm512_and_si512(_mm512_srlv_epi16(bcast256(b->qs + 32 * j),
			_mm512_loadu_si512(sh_pairs[4])), m4);
		const __m512i hb = _mm512_and_si512(_mm512_srlv_epi16(qh,
			_mm512_loadu_si512(sh_hbit[j])), one);

		o->q[j] = _mm512_or_si512(lo, _mm512_slli_epi16(hb, 4));
		o->s[j] = _mm512_shuffle_epi8(sc, pick_pair(2 * j));
	}
	o->d = _cvtsh_ss(b->d);
	o->dmin = _cvtsh_ss(b->dmin);
}

AI void unpack_iq4(const struct hyb_block_iq4_xs *b, struct xrow *o)
{
	const __m512i m4 = _mm512_set1_epi8(0xF);
	const __m128i kv128 = _mm_loadu_si128((const __m128i *)hyb_kvalues_iq4nl);
	/* VNNI: the levels + 128 (vpdpbusd's unsigned side), the zero point in x4_of */
	const __m512i kv = _mm512_broadcast_i32x4(HYB_VNNI ? _mm_xor_si128(kv128,
						_mm_set1_epi8((char)0x80)) : kv128);
	const __m512i sh = _mm512_loadu_si512(sh_iq4);
	uint32_t sl;

	/* ls - 32 as int16: nibble ib of scales_l, bits 2ib..2ib+1 of scales_h above */
	memcpy(&sl, b->scales_l, 4);
	const __m128i v = _mm_cvtsi32_si128((int)sl), m4s = _mm_set1_epi8(0xF);
	const __m128i lo = _mm_cvtepu8_epi16(_mm_unpacklo_epi8(_mm_and_si128(v, m4s),
							       _mm_and_si128(_mm_srli_epi16(v, 4), m4s)));
	const __m128i hi = _mm_and_si128(_mm_srlv_epi16(_mm_set1_epi16((short)b->scales_h),
							_mm_setr_epi16(0, 2, 4, 6, 8, 10, 12, 14)),
					 _mm_set1_epi16(3));
	const __m128i sw = _mm_sub_epi16(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi16(32));
#if HYB_VNNI
	const __m512i scd = _mm512_castsi256_si512(_mm256_cvtepi16_epi32(sw));
#else
	const __m512i sc = _mm512_broadcast_i32x4(sw);
#endif

	for (int j = 0; j < 4; j++) {
		/* 128-bit lanes [A, A, B, B] of the 32 bytes A|B of sub-blocks 2j, 2j + 1 */
		const __m512i v = bcast256(b->qs + 32 * j);
		const __m512i idx = _mm512_and_si512(_mm512_srlv_epi16(
			_mm512_shuffle_i64x2(v, v, _MM_SHUFFLE(1, 1, 0, 0)), sh), m4);
		const __m512i val = _mm512_shuffle_epi8(kv, idx);

#if HYB_VNNI
		/* int32 lanes 0-7 sub-block 2j's scale, 8-15 sub-block 2j + 1's */
		o->q[j] = val;
		o->s[j] = _mm512_permutexvar_epi32(_mm512_add_epi32(
			_mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
			_mm512_set1_epi32(2 * j)), scd);
#else
		o->neg[j] = _mm512_movepi8_mask(val);
		o->q[j] = _mm512_abs_epi8(val);
		o->s[j] = _mm512_shuffle_epi8(sc, pick_pair(2 * j));
#endif
	}
	o->d = _cvtsh_ss(b->d);
	o->dmin = 0.0f;
}

AI void unpack(const enum xt t, const uint8_t *blk, struct xrow *o)
{
	switch (t) {
	case X_Q2: unpack_q2((const struct hyb_block_q2_k *)blk, o); break;
	case X_Q3: unpack_q3((const struct hyb_block_q3_k *)blk, o); break;
	case X_Q5: unpack_q5((const struct hyb_block_q5_k *)blk, o); break;
	default: unpack_iq4((const struct hyb_block_iq4_xs *)blk, o); break;
	}
}

/*
 * the scaled integer dot of a row block and a Q8_K block, elements 0-127 and
 * 128-255; x4: Q3_K's 4 * x summed pair by pair per chunk (x4_of), the same
 * for every row
 */
AI void xdot(const enum xt t, const struct xrow *w, const struct hyb_block_q8_k *xb,
	     const __m512i *x4, __m512i *lo, __m512i *hi)
{
	__m512i acc[2] = { _mm512_setzero_si512(), _mm512_setzero_si512() };

	for (int j = 0; j < 4; j++) {
		__m512i x = _mm512_loadu_si512(xb->qs + 64 * j);
		__m512i p;

#if HYB_VNNI
		if (t == X_IQ4) {
			/*
			 * levels + 128 times x in 4-element lanes, less 128 * their x
			 * (x4), times the lane's scale: each lane's integer is the
			 * sign trick's below, in fewer instructions
			 */
			acc[j / 2] = _mm512_add_epi32(acc[j / 2], _mm512_mullo_epi32(
				_mm512_dpbusd_epi32(x4[j], w->q[j], x), w->s[j]));
			continue;
		}
#endif
		if (t == X_IQ4) /* x with the sign of the value (ggml's mul_add_epi8) */
			x = _mm512_mask_sub_epi8(x, w->neg[j], _mm512_setzero_si512(), x);
		p = _mm512_maddubs_epi16(w->q[j], x);
		if (t == X_Q3) /* code - 4 per element: less 4 * x pair by pair */
			p = _mm512_sub_epi16(p, x4[j]);
		acc[j / 2] = dot_ww(acc[j / 2], p, w->s[j]);
	}
	*lo = acc[0];
	*hi = acc[1];
}

/*
 * What every row of a tile takes from a Q8_K block, per chunk: Q3_K's
 * 4 * (x[2i] + x[2i+1]) (exact in int16); IQ4_XS's (VNNI) -128 * the sum of
 * each 4 x, the zero point of its levels + 128
 */
AI void x4_of(const enum xt t, const struct hyb_block_q8_k *xb, __m512i *x4)
{
	for (int j = 0; j < 4; j++) {
		const __m512i x = _mm512_loadu_si512(xb->qs + 64 * j);

		if (t == X_Q3)
			_mm512_storeu_si512(&x4[j], _mm512_slli_epi16(_mm512_maddubs_epi16(
				_mm512_set1_epi8(1), x), 2));
#if HYB_VNNI
		else
			_mm512_storeu_si512(&x4[j], _mm512_sub_epi32(_mm512_setzero_si512(),
				_mm512_dpbusd_epi32(_mm512_setzero_si512(),
						    _mm512_set1_epi8((char)0x80), x)));
#endif
	}
}

static inline __m256i fold8(__m512i v)
{
	return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

/* hsum_float_8 (x86 quants.c): ((x0+x4) + (x2+x6)) + ((x1+x5) + (x3+x7)) */
static inline float hsum8(__m256 x)
{
	__m128 r = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));

	r = _mm_add_ps(r, _mm_movehl_ps(r, r));
	r = _mm_add_ss(r, _mm_movehdup_ps(r));
	return _mm_cvtss_f32(r);
}

static inline int32_t hsum_i32(__m256i v)
{
	__m128i t = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));

	t = _mm_add_epi32(t, _mm_unpackhi_epi64(t, t));
	t = _mm_add_epi32(t, _mm_shuffle_epi32(t, _MM_SHUFFLE(2, 3, 0, 1)));
	return _mm_cvtsi128_si32(t);
}

/*
 * The mins' integer: Q2_K per pair of sub-blocks of 16 (8 lanes, as its
 * vec_dot's madd); Q5_K its 4-lane madd of pairs of bsums (summed to one).
 */
AI __m256i xmins(const enum xt t, const struct xrow *w, const struct hyb_block_q8_k *xb)
{
	const __m256i bs = _mm256_loadu_si256((const __m256i *)xb->bsums);

	if (t == X_Q2)
		return _mm256_madd_epi16(w->mins, bs);
	const __m128i s = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));

	return _mm256_castsi128_si256(_mm_madd_epi16(_mm256_castsi256_si128(w->mins), s));
}

/*
 * XR rows (wr; nx: the next tile's, to prefetch) x NC columns, nb super-blocks.
 * Float parts by mode:
 * M_DOT: acc (8 lanes) per super-block: Q2_K acc = fma(-yd*dmin, float(mins
 *   madd), acc) first; then acc = fma(yd*d, float(sumi), acc); result
 *   hsum_float_8(acc), Q5_K plus summs = fma(-yd*dmin, float(mins), summs).
 * M_TILED: r = float(s1)*d, less dmin*float(s2) fused (Q2_K, Q5_K);
 *   acc = fma(r, yd, acc).
 * M_GEMV: acc = fma(float(isum), d*yd, acc), accm = fma(float(imin),
 *   dmin*yd, accm) per super-block; acc - accm.
 * M_GEMM: the same per half super-block (128 elements).
 */
AI void xtile(const enum xt t, const enum xm m, const int NC, int64_t nb,
	      const uint8_t *const *wr, const uint8_t *const *nx,
	      const struct hyb_block_q8_k *const *xc, float *y, size_t ys, int nr)
{
	const size_t bsz = xt_bytes[t];
	const int lines = (int)((bsz + 63) / 64);
	__m256 acc[XR][XC];
	float fa[XR][XC], fm[XR][XC];

	for (int r = 0; r < XR; r++)
		for (int c = 0; c < NC; c++) {
			acc[r][c] = _mm256_setzero_ps();
			fa[r][c] = fm[r][c] = 0.0f;
		}
	for (int64_t s = 0; s < nb; s++) {
		__m512i x4[XC][4]; /* Q3_K's and IQ4_XS's, once per column for the tile's rows */

		for (int r = 0; r < XR; r++)
			for (int l = 0; l < lines; l++)
				_mm_prefetch((const char *)nx[r] + s * (int64_t)bsz + 64 * l, _MM_HINT_T1);
		for (int c = 0; (t == X_Q3 || (HYB_VNNI && t == X_IQ4)) && c < NC; c++)
			x4_of(t, xc[c] + s, x4[c]);
#pragma GCC unroll 4
		for (int r = 0; r < XR; r++) {
			struct xrow w;

			unpack(t, wr[r] + s * (int64_t)bsz, &w);
#pragma GCC unroll 4
			for (int c = 0; c < NC; c++) {
				const struct hyb_block_q8_k *xb = xc[c] + s;
				const float yd = xb->d;
				__m512i lo, hi;
				__m256i mi = _mm256_setzero_si256();

				xdot(t, &w, xb, x4[c], &lo, &hi);
				if (t == X_Q2 || t == X_Q5)
					mi = xmins(t, &w, xb);
				if (m == M_DOT) {
					if (t == X_Q2)
						acc[r][c] = _mm256_fmadd_ps(_mm256_set1_ps(-yd * w.dmin),
							_mm256_cvtepi32_ps(mi), acc[r][c]);
					if (t == X_Q5)
						fm[r][c] = fmaf(-yd * w.dmin, (float)hsum_i32(mi), fm[r][c]);
					acc[r][c] = _mm256_fmadd_ps(_mm256_set1_ps(yd * w.d),
						_mm256_cvtepi32_ps(fold8(_mm512_add_epi32(lo, hi))),
						acc[r][c]);
				} else if (m == M_TILED) {
					float v = (float)_mm512_reduce_add_epi32(_mm512_add_epi32(lo, hi)) *
						  w.d;

					if (t == X_Q2 || t == X_Q5)
						v = fmaf(-w.dmin, (float)hsum_i32(mi), v);
					fa[r][c] = fmaf(v, yd, fa[r][c]);
				} else if (m == M_GEMV) {
					fa[r][c] = fmaf((float)_mm512_reduce_add_epi32(
						_mm512_add_epi32(lo, hi)), w.d * yd, fa[r][c]);
					fm[r][c] = fmaf((float)hsum_i32(mi), w.dmin * yd, fm[r][c]);
				} else {
					const __m128i m0 = _mm256_castsi256_si128(mi);
					const __m128i m1 = _mm256_extracti128_si256(mi, 1);
					const float dy = w.d * yd, my = w.dmin * yd;

					fa[r][c] = fmaf((float)_mm512_reduce_add_epi32(lo), dy, fa[r][c]);
					fm[r][c] = fmaf((float)hsum_i32(_mm256_castsi128_si256(m0)) , my,
							fm[r][c]);
					fa[r][c] = fmaf((float)_mm512_reduce_add_epi32(hi), dy, fa[r][c]);
					fm[r][c] = fmaf((float)hsum_i32(_mm256_castsi128_si256(m1)), my,
							fm[r][c]);
				}
			}
		}
	}
	for (int c = 0; c < NC; c++)
		for (int r = 0; r < nr; r++) {
			float v;

			if (m == M_DOT)
				v = t == X_Q5 ? hsum8(acc[r][c]) + fm[r][c] : hsum8(acc[r][c]);
			else if (m == M_TILED)
				v = fa[r][c];
			else
				v = fa[r][c] - fm[r][c];
			y[(size_t)c * ys + r] = v;
		}
}

static inline int64_t xmin64(int64_t a, int64_t b)
{
	return a < b ? a : b;
}

AI void xrun(const enum xt t, const enum xm m, const int NC, int64_t k, const uint8_t *w,
	     size_t ws, int64_t nrows, const struct hyb_block_q8_k *const *xc, float *y, size_t ys)
{
	for (int64_t r0 = 0; r0 < nrows; r0 += XR) {
		const uint8_t *wr[XR], *nx[XR];

		/* a short last tile repeats its last row rather than reading past it */
		for (int r = 0; r < XR; r++) {
			wr[r] = w + (size_t)xmin64(r0 + r, nrows - 1) * ws;
			nx[r] = w + (size_t)xmin64(r0 + XR + r, nrows - 1) * ws;
		}
		xtile(t, m, NC, k / HYB_QK_K, wr, nx, xc, y + r0, ys, (int)xmin64(XR, nrows - r0));
	}
}

#define XCASES(T, M)                                                              \
	case (T * 4 + M) * XC + 0: xrun(T, M, 1, k, w, ws, nrows, xc, y, ys); break; \
	case (T * 4 + M) * XC + 1: xrun(T, M, 2, k, w, ws, nrows, xc, y, ys); break; \
	case (T * 4 + M) * XC + 2: xrun(T, M, 3, k, w, ws, nrows, xc, y, ys); break; \
	case (T * 4 + M) * XC + 3: xrun(T, M, 4, k, w, ws, nrows, xc, y, ys); break;

static void xany(enum xt t, enum xm m, int nc, int64_t k, const uint8_t *w, size_t ws,
		 int64_t nrows, const struct hyb_block_q8_k *const *xc, float *y, size_t ys)
{
	switch (((int)t * 4 + (int)m) * XC + nc - 1) {
	XCASES(X_Q2, M_DOT) XCASES(X_Q2, M_TILED) XCASES(X_Q2, M_GEMV) XCASES(X_Q2, M_GEMM)
	XCASES(X_Q3, M_DOT) XCASES(X_Q3, M_TILED)
	XCASES(X_Q5, M_DOT) XCASES(X_Q5, M_TILED)
	XCASES(X_IQ4, M_DOT) XCASES(X_IQ4, M_TILED)
	default: break;
	}
}
#undef XCASES

/* rows in super-tiles of about XSUPER_BYTES, each passed by every group of XC columns */
static void xgemm(enum xt t, enum xm m, HYB_GEMM_ARGS)
{
	int64_t rs = w_stride ? (int64_t)(XSUPER_BYTES / w_stride) / XR * XR : nrows;

	if (rs < XR)
		rs = XR;
	for (int64_t r0 = 0; r0 < nrows; r0 += rs) {
		const int64_t nr = xmin64(rs, nrows - r0);

		for (int64_t c0 = 0; c0 < ncols; c0 += XC) {
			const int nc = (int)xmin64(XC, ncols - c0);
			const struct hyb_block_q8_k *xc[XC];

			for (int c = 0; c < nc; c++)
				xc[c] = (const struct hyb_block_q8_k *)((const uint8_t *)x +
									(size_t)(c0 + c) * x_stride);
			xany(t, m, nc, k, (const uint8_t *)w + (size_t)r0 * w_stride, w_stride, nr, xc,
			     y + (size_t)c0 * y_stride + r0, y_stride);
		}
	}
}

#if HYB_AMX
#define XSFX(name) name##_amx
#elif HYB_VNNI
#define XSFX(name) name##_avx512vnni
#else
#define XSFX(name) name##_avx512
#endif

/*
 * not repacked: vec_dot below 8 columns, the tiled matmul from 8 (tiled.cpp
 * ggml_tiled_min_batch), whose sums the packed prefill kernel of
 * gemm_q_avx512_packed.h forms too, faster where it applies
 */
#define XENTRY(name, T, TYPE)                                                            \
	static void XSFX(name)(HYB_GEMM_ARGS)                                            \
	{                                                                                \
		if (hyb_gemm_trivial(k, nrows, ncols, y, y_stride))                      \
			return;                                                          \
		if (!XSFX(hyb_gemm_kx_packed)(TYPE, 0, k, w, w_stride, nrows, x, x_stride, \
					      ncols, y, y_stride))                       \
			return;                                                          \
		xgemm(T, ncols < 8 ? M_DOT : M_TILED, k, w, w_stride, nrows, x, x_stride, \
		      ncols, y, y_stride);                                               \
	}
XENTRY(gemm_q2_k_m1, X_Q2, HYB_TYPE_Q2_K)
XENTRY(gemm_q3_k, X_Q3, HYB_TYPE_Q3_K)
XENTRY(gemm_q5_k, X_Q5, HYB_TYPE_Q5_K)
XENTRY(gemm_iq4_xs, X_IQ4, HYB_TYPE_IQ4_XS)
#undef XENTRY

/*
 * Repacked Q2_K, one column: 16 rows a tile, M_GEMV's sums (the same
 * integers, each row's float chain the same: the same bits). xtile spent
 * 8 multiplies and 4 word permutes of the scales on a row's super-block,
 * then reduced its vectors to scalars for two scalar float chains (36% of
 * the DRAM read on one thread). Here:
 * - The codes are rearranged so that int32 lane l of every product is
 *   sub-block l: in chunk c, lane l takes the 4 codes 4c..4c+3 of
 *   sub-block l (one vpermd of the 64 code bytes, a shift by the
 *   sub-block's 2-bit position), the activations prepacked alike once
 *   per call. Four vpdpbusd leave lane l = the sub-block's integer dot
 *   (|.| <= 16 * 3 * 128, an int16), and one vpdpwssd by the 16 scales
 *   (int32 lanes, high words 0) scales them all.
 * - A transposing add tree turns 16 rows' vectors into one vector of 16
 *   row sums; one zmm FMA per chain serves 16 rows; d and dmin of the 16
 *   rows come in one gather.
 */
#define Q2G_ROWS 16

/* a + b pairwise: 128-bit lane of [a0+a2, b0+b2, a1+a3, b1+b3] */
AI __m512i red32(__m512i a, __m512i b)
{
	return _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
}

/* two red32 results: dword i of 128-bit lane L = the sum of lane L of input i */
AI __m512i red64(__m512i a, __m512i b)
{
	return _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
}

/* [a.L0 + a.L1, a.L2 + a.L3, b.L0 + b.L1, b.L2 + b.L3] (128-bit lanes) */
AI __m512i red128(__m512i a, __m512i b)
{
	return _mm512_add_epi32(_mm512_shuffle_i32x4(a, b, 0x88), _mm512_shuffle_i32x4(a, b, 0xDD));
}


/* chunk c, lane l: code dword 8 (l / 8) + 4 (l % 2) + c, shifted by 2 ((l % 8) / 2) */
static const int32_t q2g_shift[16] = { 0, 0, 2, 2, 4, 4, 6, 6, 0, 0, 2, 2, 4, 4, 6, 6 };
static const int32_t q2g_src[16] = { 0, 4, 0, 4, 0, 4, 0, 4, 8, 12, 8, 12, 8, 12, 8, 12 };

/* a super-block's activations in the codes' order: chunk c, lane l = x[16 l + 4 c .. + 3] */
struct q2g_x {
	__m512i q[4];
};

static void q2g_prepack(const struct hyb_block_q8_k *x, int64_t nb, struct q2g_x *out)
{
	for (int64_t s = 0; s < nb; s++) {
		int32_t v[4][16];

		for (int c = 0; c < 4; c++)
			for (int l = 0; l < 16; l++)
				memcpy(&v[c][l], x[s].qs + 16 * l + 4 * c, 4);
		for (int c = 0; c < 4; c++)
			out[s].q[c] = _mm512_loadu_si512(v[c]);
	}
}

/*
 * Bits 2 and 3 of each byte's bit-matrix rows: (x >> s) & 3 with s = 0, 2, 4, 6
 * by qword, the shifts of q2g_shift (lanes 2k and 2k + 1 share theirs)
 */
static const uint64_t q2g_gfm[8] = {
	0x0102ull << 48, 0x0408ull << 48, 0x1020ull << 48, 0x4080ull << 48,
	0x0102ull << 48, 0x0408ull << 48, 0x1020ull << 48, 0x4080ull << 48,
};

/*
 * One vgf2p8affineqb for the shift and the mask (measured: +11% on the
 * tile in L2). In asm: the kernels are built without -mgfni, and the
 * caller checks the CPU (Cascade Lake has VNNI but not GFNI).
 */
AI __m512i gf_bits(__m512i x, __m512i m)
{
	__m512i r;

	__asm__("vgf2p8affineqb $0, %2, %1, %0" : "=v"(r) : "v"(x), "v"(m));
	return r;
}

/* a row's super-block: lane l = scale l times sub-block l's dot; the mins' madd (8 lanes) */
AI void q2g_row(const int gf, const uint8_t *p, const struct q2g_x *xq, __m256i bs, __m512i *isum,
		__m256i *imin)
{
	const __m512i m3 = _mm512_set1_epi8(3), sh = _mm512_loadu_si512(q2g_shift);
	const __m512i src = _mm512_loadu_si512(q2g_src);
	const __m128i raw = _mm_loadu_si128((const __m128i *)p), m4 = _mm_set1_epi8(0xF);
	const __m512i qs = _mm512_loadu_si512(p + 16);
	__m512i acc = _mm512_setzero_si512();
	const __m512i gm = _mm512_loadu_si512(q2g_gfm);

#pragma GCC unroll 4
	for (int c = 0; c < 4; c++) {
		const __m512i q = _mm512_permutexvar_epi32(_mm512_add_epi32(src, _mm512_set1_epi32(c)),
							   qs);

		/* codes <= 3: the pair sums stay far below int16's range */
		acc = dot_us(acc, gf ? gf_bits(q, gm) : _mm512_and_si512(_mm512_srlv_epi32(q, sh), m3),
			     xq->q[c]);
	}
	*isum = dot_ww(_mm512_setzero_si512(), acc, _mm512_cvtepu8_epi32(_mm_and_si128(raw, m4)));
	*imin = _mm256_madd_epi16(_mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), m4)), bs);
}

/* rows 2i, 2i + 1, 8 + 2i, 9 + 2i of the mins' tree sit in lanes i, 4 + i, 8 + i, 12 + i */
static const int32_t q2g_mperm[16] = { 0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15 };

/* rows [0, 16) of w: y[r] = row r . x; the 16 rows from nx are prefetched meanwhile */
AI void q2g_tile(const int gf, int64_t nb, const uint8_t *w, size_t ws, const uint8_t *nx,
		     const struct hyb_block_q8_k *xb, const struct q2g_x *xq, float *y)
{
	const __m512i gidx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,
								   11, 12, 13, 14, 15),
						_mm512_set1_epi32((int)ws));
	const __m512i mperm = _mm512_loadu_si512(q2g_mperm);
	__m512 fa = _mm512_setzero_ps(), fm = _mm512_setzero_ps();
	const uint8_t *pf = nx, *pf_end = nx + Q2G_ROWS * ws;

	for (int64_t s = 0; s < nb; s++) {
		const size_t off = (size_t)s * 84;
		const __m256i bs = _mm256_loadu_si256((const __m256i *)xb[s].bsums);
		__m512i u[4], t[4];

#pragma GCC unroll 4
		for (int g = 0; g < 4; g++) {
			__m512i is[4];
			__m256i mi[4];

#pragma GCC unroll 4
			for (int i = 0; i < 4; i++) {
				const size_t ro = (size_t)(4 * g + i) * ws + off;

				/* the next tile in address order: 21 lines per super-block, its share */
				if (pf < pf_end)
					_mm_prefetch((const char *)pf, _MM_HINT_T1);
				if ((i == 0 || (g == 0 && i == 1)) && pf + 64 < pf_end) {
					_mm_prefetch((const char *)pf + 64, _MM_HINT_T1);
					pf += 64;
				}
				pf += 64;
				q2g_row(gf, w + ro, &xq[s], bs, &is[i], &mi[i]);
			}
			u[g] = red64(red32(is[0], is[1]), red32(is[2], is[3]));
			t[g] = red32(_mm512_inserti64x4(_mm512_castsi256_si512(mi[0]), mi[1], 1),
				     _mm512_inserti64x4(_mm512_castsi256_si512(mi[2]), mi[3], 1));
		}
		{
			const __m512i isum = red128(red128(u[0], u[1]), red128(u[2], u[3]));
			const __m512i imin = _mm512_permutexvar_epi32(
				mperm, red128(red64(t[0], t[1]), red64(t[2], t[3])));
			/* d | dmin << 16 of each row's block */
			const __m512i dd = _mm512_i32gather_epi32(gidx, w + off + 80, 1);
			const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd));
			const __m512 dm = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16)));
			const __m512 yd = _mm512_set1_ps(xb[s].d);

			fa = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(d, yd), fa);
			fm = _mm512_fmadd_ps(_mm512_cvtepi32_ps(imin), _mm512_mul_ps(dm, yd), fm);
		}
	}
	_mm512_storeu_ps(y, _mm512_sub_ps(fa, fm));
}

/*
 * y[r] for nrows >= 16 rows, one column; the last tile overlaps the one
 * before when nrows is not a multiple of 16 (its rows come out the same).
 * Returns -1 (nothing written) with fewer rows, rows too far apart to
 * gather, or no scratch memory.
 */
static int q2g_gemv(int64_t k, const uint8_t *w, size_t ws, int64_t nrows,
		    const struct hyb_block_q8_k *x, float *y)
{
	const int64_t nb = k / HYB_QK_K;
	/* GFNI only at the VNNI level (AVX-512 CPUs without VNNI have none) */
	const int gf = HYB_VNNI && hyb_cpu_gfni();
	struct q2g_x *xq;

	if (nrows < Q2G_ROWS || ws > INT32_MAX / Q2G_ROWS)
		return -1;
	xq = hyb_cpu_scratch(HYB_SCRATCH_X, (size_t)nb * sizeof(*xq));
	if (!xq)
		return -1;
	q2g_prepack(x, nb, xq);
	for (int64_t r0 = 0;; r0 += Q2G_ROWS) {
		const int64_t t = xmin64(r0, nrows - Q2G_ROWS);
		const int64_t n0 = xmin64(t + Q2G_ROWS, nrows - Q2G_ROWS);

		if (gf)
			q2g_tile(1, nb, w + (size_t)t * ws, ws, w + (size_t)n0 * ws, x, xq, y + t);
		else
			q2g_tile(0, nb, w + (size_t)t * ws, ws, w + (size_t)n0 * ws, x, xq, y + t);
		if (t + Q2G_ROWS >= nrows)
			break;
	}
	return 0;
}

/* repacked Q2_K (rows % 8 == 0): GEMM on ncols - ncols % 4 columns, GEMV on the rest */
static void XSFX(gemm_q2_k)(HYB_GEMM_ARGS)
{
	const int64_t n4 = ncols - ncols % 4;

	if (hyb_gemm_trivial(k, nrows, ncols, y, y_stride))
		return;
	if (n4 && XSFX(hyb_gemm_kx_packed)(HYB_TYPE_Q2_K, 1, k, w, w_stride, nrows, x, x_stride, n4,
					    y, y_stride))
		xgemm(X_Q2, M_GEMM, k, w, w_stride, nrows, x, x_stride, n4, y, y_stride);
	if (n4 + 1 == ncols && !q2g_gemv(k, w, w_stride, nrows,
					  (const void *)((const uint8_t *)x + (size_t)n4 * x_stride),
					  y + (size_t)n4 * y_stride))
		return;
	if (n4 < ncols)
		xgemm(X_Q2, M_GEMV, k, w, w_stride, nrows, (const uint8_t *)x + (size_t)n4 * x_stride,
		      x_stride, ncols - n4, y + (size_t)n4 * y_stride, y_stride);
}

void XSFX(hyb_fill_k_extra)(struct hyb_cpu_kernels *kt)
{
	hyb_set_gemm(kt, HYB_TYPE_Q2_K, XSFX(gemm_q2_k_m1));
	kt->gemm[HYB_TYPE_Q2_K] = XSFX(gemm_q2_k);
	hyb_set_gemm(kt, HYB_TYPE_Q3_K, XSFX(gemm_q3_k));
	hyb_set_gemm(kt, HYB_TYPE_Q5_K, XSFX(gemm_q5_k));
	hyb_set_gemm(kt, HYB_TYPE_IQ4_XS, XSFX(gemm_iq4_xs));
}
