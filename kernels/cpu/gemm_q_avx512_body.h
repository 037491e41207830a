/* SPDX-License-Identifier: MIT */
/*
 * AVX-512 quantized matrix kernels (Q4_0, Q8_0, Q4_K, Q6_K), written once and
 * compiled twice: by gemm_q_avx512.c with HYB_VNNI 0 and by
 * gemm_q_avx512vnni.c with HYB_VNNI 1. Only those two files include it.
 *
 * Two kernels per type:
 *
 * - direct (decode GEMV and small batches): DR rows x up to 4 columns read
 *   straight from the GGUF blocks; one zmm holds 64..128 weights of a row
 *   and is reused by every column of the tile. Memory-bound at ncols 1.
 *
 * - packed (prefill): 32 rows are repacked into a row-interleaved panel of
 *   unsigned bytes, 16 rows per zmm, 4 consecutive k per 32-bit lane. One
 *   vpdpbusd then multiplies 16 rows by a broadcast 4-byte group of one
 *   activation column: no horizontal sums, and each weight register serves
 *   NC columns. Per 32-element block the int32 lanes are converted once and
 *   scaled by (row scale x column scale) with one FMA.
 *
 * int8 products (why unsigned weights): vpdpbusd multiplies unsigned bytes
 * by signed bytes. Putting the weights on the unsigned side lets Q4_0/Q4_K
 * use their raw nibbles and Q6_K its raw 6-bit codes; the zero point
 * (8, 32, or 128 for Q8_0 flipped by xor 0x80) is paid back through the
 * activation block sums: dot(q - z, x) = dot(q, x) - z * sum(x), and
 * -z*sum(x) only depends on the column, so it is the accumulator's initial
 * value (a broadcast load, no extra instruction). The usual sign trick
 * (|w| times x*sign(w)) would cost a sign flip per product in the packed
 * layout, where x is broadcast and the sign varies by lane.
 *
 * Without VNNI a u8*s8 dot is vpmaddubsw + vpmaddwd + vpaddd; pair sums of
 * vpmaddubsw saturate at 32767, fine for weights <= 127 (nibbles, 6-bit)
 * but not for Q8_0's 0..255, so Q8_0 there uses the sign trick in the
 * direct kernel for every ncols.
 */
#include <immintrin.h>
#include <limits.h>
#include <string.h>

#include "cpu_internal.h"

#ifndef HYB_VNNI
#error "define HYB_VNNI before including gemm_q_avx512_body.h"
#endif

#define DR 4   /* rows of a direct tile */
#ifndef PF_TILES
#define PF_TILES 1 /* direct tiles ahead that software prefetch reads */
#endif
#ifndef PF_HINT
#define PF_HINT _MM_HINT_T1
#endif
#define DC 4   /* columns of a direct tile */
#define KCU 16  /* 32-element units of k per packed chunk (one K super-block) */

#define ALWAYS_INLINE static inline __attribute__((always_inline))

static inline int32_t ld32(const void *p)
{
	int32_t v;

	memcpy(&v, p, 4);
	return v;
}

/* acc += dot4(u, s) per 32-bit lane; u unsigned (<= 127 without VNNI), s signed */
ALWAYS_INLINE __m512i dot_us(__m512i acc, __m512i u, __m512i s)
{
#if HYB_VNNI
	return _mm512_dpbusd_epi32(acc, u, s);
#else
	return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s),
							_mm512_set1_epi16(1)));
#endif
}

/* acc += a.lo*b.lo + a.hi*b.hi over int16 pairs */
ALWAYS_INLINE __m512i dot_ww(__m512i acc, __m512i a, __m512i b)
{
#if HYB_VNNI
	return _mm512_dpwssd_epi32(acc, a, b);
#else
	return _mm512_add_epi32(acc, _mm512_madd_epi16(a, b));
#endif
}

ALWAYS_INLINE __m256i dot_ww256(__m256i acc, __m256i a, __m256i b)
{
#if HYB_VNNI
	return _mm256_dpwssd_epi32(acc, a, b);
#else
	return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
#endif
}

static inline int64_t min64(int64_t a, int64_t b)
{
	return a < b ? a : b;
}

/* ------------------------------------------------------------------------ */
/* activation side: per-column data shared by every row                     */

/* sum of the 32 int8 of a Q8_0 block */
static inline int32_t q8_block_sum(const struct hyb_block_q8_0 *b)
{
	__m256i v = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)b->qs),
				     _mm256_set1_epi8((char)0x80));
	__m256i s = _mm256_sad_epu8(v, _mm256_setzero_si256());
	__m128i t = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));

	t = _mm_add_epi64(t, _mm_unpackhi_epi64(t, t));
	return (int32_t)_mm_cvtsi128_si32(t) - 32 * 128;
}

static inline float f16_scalar(uint16_t h)
{
	return _cvtsh_ss(h);
}

/*
 * Prefetch [off, off + 64 * lines) of the next tile's DR rows. Row streams
 * of a few KiB are too short for the hardware prefetcher to ramp up on
 * (k = 4096 Q4_0 rows are 36 lines), so each tile pulls the next one in
 * while it computes.
 */
ALWAYS_INLINE void prefetch_rows(const uint8_t *const *nx, int64_t off, const int lines)
{
	for (int r = 0; r < DR; r++)
		for (int l = 0; l < lines; l++)
			_mm_prefetch((const char *)nx[r] + off + 64 * l, PF_HINT);
}

/* ------------------------------------------------------------------------ */
/* Q8_0 direct                                                              */

/*
 * Column data per pair of blocks: the 64 quants, the accumulator start
 * (lanes 0-7 block 0, 8-15 block 1; VNNI: -16*sum per lane, so the eight
 * lanes add up to -128*sum) and the scale per lane.
 */
struct q8d_col {
	__m512i q;
	__m512i init;
	__m512 d;
};

static void q8d_prepack(const void *x, int64_t nb, struct q8d_col *out)
{
	const struct hyb_block_q8_0 *b = x;

	for (int64_t p = 0; p < (nb + 1) / 2; p++) {
		const struct hyb_block_q8_0 *b0 = &b[2 * p];
		const int two = 2 * p + 1 < nb;
		__m256i q1 = two ? _mm256_loadu_si256((const __m256i *)b0[1].qs)
				 : _mm256_setzero_si256();
		int32_t s0 = 0, s1 = 0;
		float d1 = two ? f16_scalar(b0[1].d) : 0.0f;

#if HYB_VNNI
		s0 = -16 * q8_block_sum(b0);
		s1 = two ? -16 * q8_block_sum(b0 + 1) : 0;
#endif
		out[p].q = _mm512_inserti64x4(_mm512_castsi256_si512(
			_mm256_loadu_si256((const __m256i *)b0->qs)), q1, 1);
		out[p].init = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32(s0)),
						 _mm256_set1_epi32(s1), 1);
		out[p].d = _mm512_insertf32x8(_mm512_castps256_ps512(
			_mm256_set1_ps(f16_scalar(b0->d))), _mm256_set1_ps(d1), 1);
	}
}

/*
 * A row's block scales come from the same cache lines as its quants: one
 * 64-byte load at the step's start and vpermw spread them over their
 * blocks' lanes. (A gather of all the tile's scales costs fewer
 * instructions but stalls on this CPU: it is the first touch of new lines.)
 */
static const uint16_t q8d_didx[32] = {
	0, 0, 0, 0, 0, 0, 0, 0, 17, 17, 17, 17, 17, 17, 17, 17,
};

ALWAYS_INLINE void q8d_tile(const int NC, int64_t nb, const uint8_t *const *wr,
			    const uint8_t *const *nx,
			    const struct q8d_col *const *xc, __m512 acc[DR][DC])
{
	const __m512i didx = _mm512_loadu_si512(q8d_didx);
	const int64_t np = (nb + 1) / 2;

	for (int r = 0; r < DR; r++)
		for (int c = 0; c < NC; c++)
			acc[r][c] = _mm512_setzero_ps();
	for (int64_t p = 0; p < np; p++) {
		const int64_t off = p * 68;
		const int two = 2 * p + 1 < nb; /* an odd row ends with a single block */
		/* the scales' load must not pass the end of the row */
		const __mmask32 dm = two ? 0xFFFFFFFF : 0x1FFFF;

		prefetch_rows(nx, off, 2);
#pragma GCC unroll 4
		for (int r = 0; r < DR; r++) {
			const __m256i q0 = _mm256_loadu_si256((const __m256i *)(wr[r] + off + 2));
			const __m512i w = two ? _mm512_inserti64x4(_mm512_castsi256_si512(q0),
					_mm256_loadu_si256((const __m256i *)(wr[r] + off + 36)), 1)
					      : _mm512_zextsi256_si512(q0);
			const __m512 dw = _mm512_cvtph_ps(_mm512_castsi512_si256(
				_mm512_permutexvar_epi16(didx, _mm512_maskz_loadu_epi16(dm,
											wr[r] + off))));
#if HYB_VNNI
			const __m512i u = _mm512_xor_si512(w, _mm512_set1_epi8((char)0x80));
#else
			const __m512i u = _mm512_abs_epi8(w);
			const __mmask64 neg = _mm512_movepi8_mask(w);
#endif
#pragma GCC unroll 4
			for (int c = 0; c < NC; c++) {
				const struct q8d_col *xp = &xc[c][p];
#if HYB_VNNI
				const __m512i d = _mm512_dpbusd_epi32(xp->init, u, xp->q);
#else
				const __m512i s = _mm512_mask_sub_epi8(xp->q, neg,
								       _mm512_setzero_si512(), xp->q);
				const __m512i d = _mm512_madd_epi16(_mm512_maddubs_epi16(u, s),
								    _mm512_set1_epi16(1));
#endif
				acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d),
							    _mm512_mul_ps(dw, xp->d), acc[r][c]);
			}
		}
	}
}

/* ------------------------------------------------------------------------ */
/* Q4_0 direct                                                              */

/*
 * Column data per quad of blocks: elements 0-15 of each block (matching
 * the low nibbles), elements 16-31 (high nibbles), the accumulator start
 * (-8*sum spread as -2*sum over the block's 4 lanes) and the lane scales.
 */
struct q4d_col {
	__m512i lo, hi;
	__m512i init;
	__m512 d;
};

static void q4d_prepack(const void *x, int64_t nb, struct q4d_col *out)
{
	const struct hyb_block_q8_0 *b = x;

	for (int64_t q = 0; q < (nb + 3) / 4; q++) {
		int32_t init[16];
		float d[16];
		int8_t lo[64], hi[64];

		for (int i = 0; i < 4; i++) {
			const int64_t bi = 4 * q + i;
			const int have = bi < nb;
			const int32_t s = have ? -2 * q8_block_sum(&b[bi]) : 0;
			const float dx = have ? f16_scalar(b[bi].d) : 0.0f;

			for (int l = 0; l < 4; l++) {
				init[4 * i + l] = s;
				d[4 * i + l] = dx;
			}
			if (have) {
				memcpy(lo + 16 * i, b[bi].qs, 16);
				memcpy(hi + 16 * i, b[bi].qs + 16, 16);
			} else {
				memset(lo + 16 * i, 0, 16);
				memset(hi + 16 * i, 0, 16);
			}
		}
		out[q].lo = _mm512_loadu_si512(lo);
		out[q].hi = _mm512_loadu_si512(hi);
		out[q].init = _mm512_loadu_si512(init);
		out[q].d = _mm512_loadu_ps(d);
	}
}

/* the quants of n (1..4) blocks from p, block j in 128-bit lane j */
ALWAYS_INLINE __m512i q4_quad(const uint8_t *p, int n)
{
	__m512i w = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(p + 2)));

	if (n == 4) {
		w = _mm512_inserti32x4(w, _mm_loadu_si128((const __m128i *)(p + 20)), 1);
		w = _mm512_inserti32x4(w, _mm_loadu_si128((const __m128i *)(p + 38)), 2);
		return _mm512_inserti32x4(w, _mm_loadu_si128((const __m128i *)(p + 56)), 3);
	}
	w = _mm512_zextsi128_si512(_mm512_castsi512_si128(w));
	if (n > 1)
		w = _mm512_inserti32x4(w, _mm_loadu_si128((const __m128i *)(p + 20)), 1);
	if (n > 2)
		w = _mm512_inserti32x4(w, _mm_loadu_si128((const __m128i *)(p + 38)), 2);
	return w;
}

/* the 4 block scales (bytes 0, 18, 36, 54 of a quad) spread over 4 lanes each */
static const uint16_t q4d_didx[32] = {
	0, 0, 0, 0, 9, 9, 9, 9, 18, 18, 18, 18, 27, 27, 27, 27,
};

ALWAYS_INLINE void q4d_tile(const int NC, int64_t nb, const uint8_t *const *wr,
			    const uint8_t *const *nx,
			    const struct q4d_col *const *xc, __m512 acc[DR][DC])
{
	const __m512i didx = _mm512_loadu_si512(q4d_didx);
	const __m512i m4 = _mm512_set1_epi8(0x0F);

	for (int r = 0; r < DR; r++)
		for (int c = 0; c < NC; c++)
			acc[r][c] = _mm512_setzero_ps();
	for (int64_t q = 0; q < (nb + 3) / 4; q++) {
		const int64_t off = q * 72;
		const int n = (int)min64(4, nb - 4 * q);
		/* words of the scales' load that exist: 9 per block */
		const __mmask32 dm = n == 4 ? 0xFFFFFFFF : (__mmask32)((1u << (9 * n)) - 1);

		prefetch_rows(nx, off, 2);
#pragma GCC unroll 4
		for (int r = 0; r < DR; r++) {
			const __m512i w = q4_quad(wr[r] + off, n);
			const __m512 dw = _mm512_cvtph_ps(_mm512_castsi512_si256(
				_mm512_permutexvar_epi16(didx, _mm512_maskz_loadu_epi16(dm,
											wr[r] + off))));
			const __m512i lo = _mm512_and_si512(w, m4);
			const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), m4);

#pragma GCC unroll 4
			for (int c = 0; c < NC; c++) {
				const struct q4d_col *xp = &xc[c][q];
#if HYB_VNNI
				__m512i d = _mm512_dpbusd_epi32(xp->init, lo, xp->lo);

				d = _mm512_dpbusd_epi32(d, hi, xp->hi);
#else
				/* nibble products: |pair sum| <= 2*15*128, two of them fit int16 */
				__m512i p = _mm512_add_epi16(_mm512_maddubs_epi16(lo, xp->lo),
							     _mm512_maddubs_epi16(hi, xp->hi));
				__m512i d = _mm512_add_epi32(
					_mm512_madd_epi16(p, _mm512_set1_epi16(1)), xp->init);
#endif
				acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d),
							    _mm512_mul_ps(dw, xp->d), acc[r][c]);
			}
		}
	}
}

/* ------------------------------------------------------------------------ */
/* Q4_K direct                                                              */

/* shift counts per 16-bit word: low half of the zmm as is, high half >> 4 */
static const uint16_t shift_0_4[32] = {
	0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4,
};

/* unpack the 8 scales and 8 mins of a Q4_K block into two 64-bit byte vectors */
static inline void q4k_unpack(const uint8_t *s, uint64_t *sc, uint64_t *mn)
{
	uint32_t u0, u1, u2;

	memcpy(&u0, s, 4);
	memcpy(&u1, s + 4, 4);
	memcpy(&u2, s + 8, 4);
	*sc = (uint64_t)(u0 & 0x3f3f3f3f) |
	      (uint64_t)((u2 & 0x0f0f0f0f) | (((u0 >> 6) & 0x03030303) << 4)) << 32;
	*mn = (uint64_t)(u1 & 0x3f3f3f3f) |
	      (uint64_t)(((u2 >> 4) & 0x0f0f0f0f) | (((u1 >> 6) & 0x03030303) << 4)) << 32;
}

/*
 * pshufb controls picking int16 scale j (of 8 in a 128-bit lane) for the low
 * 256 bits and j+1 for the high 256 bits, for j = 0, 2, 4, 6.
 */
static inline __m512i pick_pair_ctrl(int j)
{
	const __m256i a = _mm256_set1_epi16((short)(2 * j | (2 * j + 1) << 8));
	const __m256i b = _mm256_set1_epi16((short)((2 * j + 2) | (2 * j + 3) << 8));

	return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
}

ALWAYS_INLINE void q4kd_tile(const int NC, int64_t nsb, const uint8_t *const *wr,
			    const uint8_t *const *nx,
			     const uint8_t *const *xc, __m512 acc[DR][DC])
{
	const __m512i sh = _mm512_loadu_si512(shift_0_4);
	const __m512i m4 = _mm512_set1_epi8(0x0F);
	const __m512i pc0 = pick_pair_ctrl(0), pc1 = pick_pair_ctrl(2);
	const __m512i pc2 = pick_pair_ctrl(4), pc3 = pick_pair_ctrl(6);
	/* bsums (16 x int16) times mins (8 x int16, each used twice) */
	const __m128i dup = _mm_setr_epi8(0, 1, 0, 1, 2, 3, 2, 3, 4, 5, 4, 5, 6, 7, 6, 7);
	__m256 macc[DR][DC];

	for (int r = 0; r < DR; r++)
		for (int c = 0; c < NC; c++) {
			acc[r][c] = _mm512_setzero_ps();
			macc[r][c] = _mm256_setzero_ps();
		}
	for (int64_t s = 0; s < nsb; s++) {
		prefetch_rows(nx, s * 144, 3);
#pragma GCC unroll 4
		for (int r = 0; r < DR; r++) {
			const struct hyb_block_q4_k *b = (const struct hyb_block_q4_k *)wr[r] + s;
			uint64_t sc8, mn8;

			q4k_unpack(b->scales, &sc8, &mn8);
			const __m512i sc = _mm512_broadcast_i32x4(
				_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc8)));
			const __m128i mn = _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)mn8));
			const __m256i mn2 = _mm256_inserti128_si256(
				_mm256_castsi128_si256(_mm_shuffle_epi8(mn, dup)),
				_mm_shuffle_epi8(mn, _mm_add_epi8(dup, _mm_set1_epi8(8))), 1);
			const __m512i s0 = _mm512_shuffle_epi8(sc, pc0);
			const __m512i s1 = _mm512_shuffle_epi8(sc, pc1);
			const __m512i s2 = _mm512_shuffle_epi8(sc, pc2);
			const __m512i s3 = _mm512_shuffle_epi8(sc, pc3);
			const __m512 d = _mm512_set1_ps(f16_scalar(b->d));
			const __m256 dmin = _mm256_set1_ps(-f16_scalar(b->dmin));
			__m512i q[4];

			for (int j = 0; j < 4; j++)
				q[j] = _mm512_and_si512(_mm512_srlv_epi16(
					_mm512_broadcast_i64x4(_mm256_loadu_si256(
						(const __m256i *)(b->qs + 32 * j))), sh), m4);
#pragma GCC unroll 4
			for (int c = 0; c < NC; c++) {
				const struct hyb_block_q8_k *xb =
					(const struct hyb_block_q8_k *)xc[c] + s;
				const __m512i *xq = (const __m512i *)xb->qs;
				__m512i ia = _mm512_setzero_si512();

				ia = dot_ww(ia, _mm512_maddubs_epi16(q[0], _mm512_loadu_si512(xq)), s0);
				ia = dot_ww(ia, _mm512_maddubs_epi16(q[1],
								     _mm512_loadu_si512(xq + 1)), s1);
				ia = dot_ww(ia, _mm512_maddubs_epi16(q[2],
								     _mm512_loadu_si512(xq + 2)), s2);
				ia = dot_ww(ia, _mm512_maddubs_epi16(q[3],
								     _mm512_loadu_si512(xq + 3)), s3);
				const __m512 dx = _mm512_set1_ps(xb->d);

				acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia),
							    _mm512_mul_ps(d, dx), acc[r][c]);
				__m256i im = _mm256_madd_epi16(
					_mm256_loadu_si256((const __m256i *)xb->bsums), mn2);

				macc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(im),
							     _mm256_mul_ps(dmin,
									   _mm512_castps512_ps256(dx)),
							     macc[r][c]);
			}
		}
	}
	for (int r = 0; r < DR; r++)
		for (int c = 0; c < NC; c++)
			acc[r][c] = _mm512_add_ps(acc[r][c], _mm512_zextps256_ps512(macc[r][c]));
}

/* ------------------------------------------------------------------------ */
/* Q6_K direct                                                              */

/* per-word shifts: elements 0-31 from qh bits 0-1 (<<4), 32-63 from bits 2-3 (<<2) */
static const uint16_t shift_4_2[32] = {
	4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4,
	2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
};
/* elements 64-95 from qh bits 4-5 (as is), 96-127 from bits 6-7 (>>2) */
static const uint16_t shift_0_2[32] = {
	0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
};
/* vpermw indices: word i of 64 elements uses sub-block scale 4g + i/8 */
static inline __m512i q6_scale_idx(int g)
{
	uint16_t idx[32];

	for (int i = 0; i < 32; i++)
		idx[i] = (uint16_t)(4 * g + i / 8);
	return _mm512_loadu_si512(idx);
}

/*
 * The 6-bit codes of half h (elements 128h..128h+127) of a Q6_K block:
 * a = elements 0-63, b = 64-127 of the half, values 0..63.
 */
ALWAYS_INLINE void q6k_codes(const struct hyb_block_q6_k *b, int h, __m512i sa, __m512i sb,
			     __m512i *a, __m512i *c)
{
	const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
	const __m512i ql = _mm512_loadu_si512(b->ql + 64 * h);
	const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(
		(const __m256i *)(b->qh + 32 * h)));
	const __m512i ha = _mm512_and_si512(_mm512_sllv_epi16(qh, sa), m30);
	const __m512i hb = _mm512_and_si512(_mm512_srlv_epi16(qh, sb), m30);

	/* 0xEA: (A & B) | C with A = ql, B = 0x0F, C = high bits */
	*a = _mm512_ternarylogic_epi32(ql, m4, ha, 0xEA);
	*c = _mm512_ternarylogic_epi32(_mm512_srli_epi16(ql, 4), m4, hb, 0xEA);
}

ALWAYS_INLINE void q6kd_tile(const int NC, int64_t nsb, const uint8_t *const *wr,
			    const uint8_t *const *nx,
			     const uint8_t *const *xc, __m512 acc[DR][DC])
{
	const __m512i sa = _mm512_loadu_si512(shift_4_2), sb = _mm512_loadu_si512(shift_0_2);
	const __m512i i0 = q6_scale_idx(0), i1 = q6_scale_idx(1);
	const __m512i i2 = q6_scale_idx(2), i3 = q6_scale_idx(3);

	for (int r = 0; r < DR; r++)
		for (int c = 0; c < NC; c++)
			acc[r][c] = _mm512_setzero_ps();
	for (int64_t s = 0; s < nsb; s++) {
		prefetch_rows(nx, s * 210, 4);
#pragma GCC unroll 4
		for (int r = 0; r < DR; r++) {
			const struct hyb_block_q6_k *b = (const struct hyb_block_q6_k *)wr[r] + s;
			/* scales as int16: words 0-15 used by vpermw, zmm upper half unused */
			const __m256i sc16 = _mm256_cvtepi8_epi16(
				_mm_loadu_si128((const __m128i *)b->scales));
			const __m512i sc = _mm512_castsi256_si512(sc16);
			/* -32 * scale: the codes' offset, paid back through the bsums */
			const __m256i scn = _mm256_sub_epi16(_mm256_setzero_si256(),
							     _mm256_slli_epi16(sc16, 5));
			const __m512i s0 = _mm512_permutexvar_epi16(i0, sc);
			const __m512i s1 = _mm512_permutexvar_epi16(i1, sc);
			const __m512i s2 = _mm512_permutexvar_epi16(i2, sc);
			const __m512i s3 = _mm512_permutexvar_epi16(i3, sc);
			const __m512 d = _mm512_set1_ps(f16_scalar(b->d));
			__m512i qa0, qb0, qa1, qb1;

			q6k_codes(b, 0, sa, sb, &qa0, &qb0);
			q6k_codes(b, 1, sa, sb, &qa1, &qb1);
#pragma GCC unroll 4
			for (int c = 0; c < NC; c++) {
				const struct hyb_block_q8_k *xb =
					(const struct hyb_block_q8_k *)xc[c] + s;
				const __m512i *xq = (const __m512i *)xb->qs;
				__m512i ia = _mm512_zextsi256_si512(_mm256_madd_epi16(
					_mm256_loadu_si256((const __m256i *)xb->bsums), scn));

				ia = dot_ww(ia, _mm512_maddubs_epi16(qa0, _mm512_loadu_si512(xq)), s0);
				ia = dot_ww(ia, _mm512_maddubs_epi16(qb0,
								     _mm512_loadu_si512(xq + 1)), s1);
				ia = dot_ww(ia, _mm512_maddubs_epi16(qa1,
								     _mm512_loadu_si512(xq + 2)), s2);
				ia = dot_ww(ia, _mm512_maddubs_epi16(qb1,
								     _mm512_loadu_si512(xq + 3)), s3);
				acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia),
							    _mm512_mul_ps(d, _mm512_set1_ps(xb->d)),
							    acc[r][c]);
			}
		}
	}
}

/* ------------------------------------------------------------------------ */
/* direct driver                                                            */

enum dtype { D_Q8_0, D_Q4_0, D_Q4_K, D_Q6_K };

ALWAYS_INLINE void direct_tile(const enum dtype t, const int NC, int64_t k,
			       const uint8_t *const *wr, const uint8_t *const *nx,
			       const void *const *xc,
			       __m512 acc[DR][DC])
{
	switch (t) {
	case D_Q8_0:
		q8d_tile(NC, k / 32, wr, nx, (const struct q8d_col *const *)xc, acc);
		break;
	case D_Q4_0:
		q4d_tile(NC, k / 32, wr, nx, (const struct q4d_col *const *)xc, acc);
		break;
	case D_Q4_K:
		q4kd_tile(NC, k / 256, wr, nx, (const uint8_t *const *)xc, acc);
		break;
	case D_Q6_K:
		q6kd_tile(NC, k / 256, wr, nx, (const uint8_t *const *)xc, acc);
		break;
	}
}

/* sum the lanes of DR accumulators into 4 floats, one per row */
static inline __m128 hsum4(__m512 a0, __m512 a1, __m512 a2, __m512 a3)
{
	/* fold 512 -> 256 -> 128 for each, then transpose-add the four */
	__m256 b0 = _mm256_add_ps(_mm512_castps512_ps256(a0), _mm512_extractf32x8_ps(a0, 1));
	__m256 b1 = _mm256_add_ps(_mm512_castps512_ps256(a1), _mm512_extractf32x8_ps(a1, 1));
	__m256 b2 = _mm256_add_ps(_mm512_castps512_ps256(a2), _mm512_extractf32x8_ps(a2, 1));
	__m256 b3 = _mm256_add_ps(_mm512_castps512_ps256(a3), _mm512_extractf32x8_ps(a3, 1));
	__m256 c01 = _mm256_hadd_ps(b0, b1), c23 = _mm256_hadd_ps(b2, b3);
	__m256 e = _mm256_hadd_ps(c01, c23);

	return _mm_add_ps(_mm256_castps256_ps128(e), _mm256_extractf128_ps(e, 1));
}

ALWAYS_INLINE void direct_run(const enum dtype t, const int NC, int64_t k, const uint8_t *w,
			      size_t ws, int64_t nrows, const void *const *xc, float *y,
			      size_t ys)
{
	for (int64_t r0 = 0; r0 < nrows; r0 += DR) {
		const uint8_t *wr[DR], *nx[DR];
		__m512 acc[DR][DC];
		float out[DR];

		/* a short last tile repeats its last row rather than reading past it */
		for (int r = 0; r < DR; r++) {
			wr[r] = w + (size_t)min64(r0 + r, nrows - 1) * ws;
			nx[r] = w + (size_t)min64(r0 + PF_TILES * DR + r, nrows - 1) * ws;
		}
		direct_tile(t, NC, k, wr, nx, xc, acc);
		for (int c = 0; c < NC; c++) {
			_mm_storeu_ps(out, hsum4(acc[0][c], acc[1][c], acc[2][c], acc[3][c]));
			for (int r = 0; r < DR && r0 + r < nrows; r++)
				y[(size_t)c * ys + r0 + r] = out[r];
		}
	}
}

static void direct_any(const enum dtype t, int64_t k, const uint8_t *w, size_t ws,
		       int64_t nrows, const void *const *xc, int nc, float *y, size_t ys)
{
	switch (t * DC + nc - 1) {
#define CASE(T, N) case T * DC + N - 1: direct_run(T, N, k, w, ws, nrows, xc, y, ys); break;
	CASE(D_Q8_0, 1) CASE(D_Q8_0, 2) CASE(D_Q8_0, 3) CASE(D_Q8_0, 4)
	CASE(D_Q4_0, 1) CASE(D_Q4_0, 2) CASE(D_Q4_0, 3) CASE(D_Q4_0, 4)
	CASE(D_Q4_K, 1) CASE(D_Q4_K, 2) CASE(D_Q4_K, 3) CASE(D_Q4_K, 4)
	CASE(D_Q6_K, 1) CASE(D_Q6_K, 2) CASE(D_Q6_K, 3) CASE(D_Q6_K, 4)
#undef CASE
	}
}

/*
 * Direct path for any ncols, DC columns at a time. Q8_0/Q4_0 need per-column
 * repacked activations (in scratch); the K-quants read Q8_K in place.
 */
static void direct_gemm(const enum dtype t, HYB_GEMM_ARGS)
{
	const int64_t nb = k / 32;
	size_t per_col = 0;
	uint8_t *xs = NULL;

	/* the scale gathers address rows by 32-bit offsets */
	if (w_stride > INT32_MAX / 8) {
		static const hyb_gemm_fn ref[] = { hyb_gemm_q8_0_scalar, hyb_gemm_q4_0_scalar,
						   hyb_gemm_q4_k_scalar, hyb_gemm_q6_k_scalar };

		ref[t](k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride);
		return;
	}

	if (t == D_Q8_0)
		per_col = (size_t)(nb + 1) / 2 * sizeof(struct q8d_col);
	else if (t == D_Q4_0)
		per_col = (size_t)(nb + 3) / 4 * sizeof(struct q4d_col);
	if (per_col) {
		xs = hyb_cpu_scratch(HYB_SCRATCH_X, per_col * DC);
		if (!xs) {
			(t == D_Q8_0 ? hyb_gemm_q8_0_scalar : hyb_gemm_q4_0_scalar)(
				k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride);
			return;
		}
	}
	for (int64_t c0 = 0; c0 < ncols; c0 += DC) {
		const int nc = (int)min64(DC, ncols - c0);
		const void *xc[DC];

		for (int c = 0; c < nc; c++) {
			const uint8_t *xcol = (const uint8_t *)x + (size_t)(c0 + c) * x_stride;

			if (t == D_Q8_0) {
				q8d_prepack(xcol, nb, (struct q8d_col *)(xs + c * per_col));
				xc[c] = xs + c * per_col;
			} else if (t == D_Q4_0) {
				q4d_prepack(xcol, nb, (struct q4d_col *)(xs + c * per_col));
				xc[c] = xs + c * per_col;
			} else {
				xc[c] = xcol;
			}
		}
		direct_any(t, k, w, w_stride, nrows, xc, nc, y + (size_t)c0 * y_stride,
			   y_stride);
	}
}

/* ------------------------------------------------------------------------ */
/* packed panel: repacking 16 rows into row-interleaved lanes               */

/*
 * Micro-tile shapes (measured on Cascade Lake): 48 rows x 4 columns for the
 * Q8_0-activated types, i.e. 12 int32 + 12 float accumulators, 3 weight
 * vectors and one broadcast: 7 loads per 12 vpdpbusd keeps the two load
 * ports below their limit while the 3 float operations per 16 rows and
 * block (convert, scale product, FMA) take the rest of the two vector
 * ports. The K-quants carry a third accumulator set (per super-block) and
 * use 32 rows x 4 columns.
 */
#define G8 3   /* row groups of 16, Q8_0 / Q4_0 */
#define GK 2   /* row groups of 16, Q4_K / Q6_K */
#define GMAX 3
#define NCP 4  /* columns per micro-tile */
#ifndef MK_TUNROLL
#define MK_TUNROLL 8
#endif
#define PRAGMA_(x) _Pragma(#x)
#define UNROLL(n) PRAGMA_(GCC unroll n)

#define Q4K_SCALE_BYTES ((8 + 4 + 1) * 64)
#define Q6K_SCALE_BYTES (16 * 64)

/* bytes of one unit (Q8 family) or one super-block (K) in a packed chunk */
#define UW8(G) ((G) * 576)
#define SBW(G, SCB) (8 * (G) * 512 + (G) * (SCB))

/* bytes of one unit / super-block of a packed activation tile */
#define UX8 (NCP * 40)
#define SX4K (NCP * (256 + 16 + 4))
#define SX6K (NCP * (256 + 64 + 4))

/*
 * z[i] = [row i | row i+8], 32 bytes each (eight 4-byte groups). Returns
 * out[t] with lane r = group t of row r, rows in order 0..15.
 */
ALWAYS_INLINE void tr16x8(const __m512i z[8], __m512i out[8])
{
	const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
	const __m512i hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
	__m512i a[8], b[8];

	for (int i = 0; i < 4; i++) {
		a[2 * i] = _mm512_unpacklo_epi32(z[2 * i], z[2 * i + 1]);
		a[2 * i + 1] = _mm512_unpackhi_epi32(z[2 * i], z[2 * i + 1]);
	}
	for (int h = 0; h < 2; h++) {
		/* rows 4h..4h+3 (and 8+4h..): b[4h + j] holds groups j and j+4 */
		b[4 * h + 0] = _mm512_unpacklo_epi64(a[4 * h + 0], a[4 * h + 2]);
		b[4 * h + 1] = _mm512_unpackhi_epi64(a[4 * h + 0], a[4 * h + 2]);
		b[4 * h + 2] = _mm512_unpacklo_epi64(a[4 * h + 1], a[4 * h + 3]);
		b[4 * h + 3] = _mm512_unpackhi_epi64(a[4 * h + 1], a[4 * h + 3]);
	}
	for (int j = 0; j < 4; j++) {
		out[j] = _mm512_permutex2var_epi64(b[j], lo, b[4 + j]);
		out[j + 4] = _mm512_permutex2var_epi64(b[j], hi, b[4 + j]);
	}
}

ALWAYS_INLINE void store8(uint8_t *dst, const __m512i o[8])
{
	for (int t = 0; t < 8; t++)
		_mm512_store_si512(dst + 64 * t, o[t]);
}

ALWAYS_INLINE __m512i load_pair256(const uint8_t *a, const uint8_t *b)
{
	return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)),
				  _mm256_loadu_si256((const __m256i *)b), 1);
}

ALWAYS_INLINE __m512i gather_i32(const uint8_t *base, __m512i rowoff, int64_t off)
{
	return _mm512_i32gather_epi32(rowoff, base + off, 1);
}

/* 16 lanes of half floats at byte offset `off` of each row (low 16 bits) */
ALWAYS_INLINE __m512 gather_f16(const uint8_t *base, __m512i rowoff, int64_t off)
{
	return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(gather_i32(base, rowoff, off)));
}

struct panel {
	const uint8_t *base;   /* row 0 of the panel */
	__m512i rowoff[GMAX];  /* byte offsets of each lane's row from base, per group */
	const uint8_t *rp[16 * GMAX];
};

/* rows past the end repeat the last row: read in bounds, results discarded */
static void panel_rows(struct panel *p, int G, const uint8_t *w, size_t ws, int64_t r0,
		       int64_t nrows)
{
	int32_t off[16 * GMAX];

	p->base = w + (size_t)r0 * ws;
	for (int r = 0; r < 16 * G; r++) {
		int64_t rr = min64(r0 + r, nrows - 1) - r0;

		off[r] = (int32_t)(rr * (int64_t)ws);
		p->rp[r] = p->base + off[r];
	}
	for (int g = 0; g < G; g++)
		p->rowoff[g] = _mm512_loadu_si512(off + 16 * g);
}

ALWAYS_INLINE void pack_q8_0(const struct panel *p, const int G, int64_t u0, int nu,
			     uint8_t *dst)
{
	for (int u = 0; u < nu; u++) {
		const int64_t off = (u0 + u) * 34;
		uint8_t *du = dst + (size_t)u * UW8(G);

		for (int g = 0; g < G; g++) {
			const uint8_t *const *rp = p->rp + 16 * g;
			__m512i z[8], o[8];

			for (int i = 0; i < 8; i++)
				z[i] = _mm512_xor_si512(load_pair256(rp[i] + off + 2,
								     rp[i + 8] + off + 2),
							_mm512_set1_epi8((char)0x80));
			tr16x8(z, o);
			store8(du + 512 * g, o);
			_mm512_store_ps(du + 512 * G + 64 * g, gather_f16(p->base, p->rowoff[g], off));
		}
	}
}

ALWAYS_INLINE void pack_q4_0(const struct panel *p, const int G, int64_t u0, int nu,
			     uint8_t *dst)
{
	const __m512i shift = _mm512_setr_epi64(0, 0, 0x0004000400040004LL, 0x0004000400040004LL,
						0, 0, 0x0004000400040004LL, 0x0004000400040004LL);
	const __m512i m4 = _mm512_set1_epi8(0x0F);

	for (int u = 0; u < nu; u++) {
		const int64_t off = (u0 + u) * 18;
		uint8_t *du = dst + (size_t)u * UW8(G);

		for (int g = 0; g < G; g++) {
			const uint8_t *const *rp = p->rp + 16 * g;
			__m512i z[8], o[8];

			for (int i = 0; i < 8; i++) {
				/* [qs_i, qs_i, qs_i+8, qs_i+8] -> [lo_i, hi_i, lo_i+8, hi_i+8] */
				__m256i y = _mm256_inserti128_si256(
					_mm256_castsi128_si256(_mm_loadu_si128(
						(const __m128i *)(rp[i] + off + 2))),
					_mm_loadu_si128((const __m128i *)(rp[i + 8] + off + 2)), 1);
				__m512i d = _mm512_shuffle_i64x2(_mm512_castsi256_si512(y),
								 _mm512_castsi256_si512(y), 0x50);

				z[i] = _mm512_and_si512(_mm512_srlv_epi16(d, shift), m4);
			}
			tr16x8(z, o);
			store8(du + 512 * g, o);
			_mm512_store_ps(du + 512 * G + 64 * g, gather_f16(p->base, p->rowoff[g], off));
		}
	}
}

/* nu is a multiple of 8: whole super-blocks */
ALWAYS_INLINE void pack_q4_k(const struct panel *p, const int G, int64_t u0, int nu,
			     uint8_t *dst)
{
	const __m512i m4 = _mm512_set1_epi8(0x0F), m6 = _mm512_set1_epi32(63);
	const __m512i m2 = _mm512_set1_epi32(3), m4d = _mm512_set1_epi32(0xF);

	for (int s = 0; s < nu / 8; s++) {
		const int64_t off = (u0 / 8 + s) * 144;
		uint8_t *ds = dst + (size_t)s * SBW(G, Q4K_SCALE_BYTES);

		for (int g = 0; g < G; g++) {
			const uint8_t *const *rp = p->rp + 16 * g;
			uint8_t *sg = ds + 8 * G * 512 + g * Q4K_SCALE_BYTES;

			for (int jj = 0; jj < 4; jj++) {
				__m512i zl[8], zh[8], o[8];

				for (int i = 0; i < 8; i++) {
					__m512i v = load_pair256(rp[i] + off + 16 + 32 * jj,
								 rp[i + 8] + off + 16 + 32 * jj);

					zl[i] = _mm512_and_si512(v, m4);
					zh[i] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
				}
				tr16x8(zl, o);
				store8(ds + (2 * jj) * G * 512 + 512 * g, o);
				tr16x8(zh, o);
				store8(ds + (2 * jj + 1) * G * 512 + 512 * g, o);
			}
			/* scales of 16 rows at once, one 32-bit lane per row */
			const __m512i dd = gather_i32(p->base, p->rowoff[g], off);
			const __m512i u0v = gather_i32(p->base, p->rowoff[g], off + 4);
			const __m512i u1v = gather_i32(p->base, p->rowoff[g], off + 8);
			const __m512i u2v = gather_i32(p->base, p->rowoff[g], off + 12);
			const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd));
			const __m512 dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(
				_mm512_srli_epi32(dd, 16)));
			__m512i mn[8];

			for (int j = 0; j < 4; j++) {
				__m512i sc_lo = _mm512_and_si512(_mm512_srli_epi32(u0v, 8 * j), m6);
				__m512i m_lo = _mm512_and_si512(_mm512_srli_epi32(u1v, 8 * j), m6);
				__m512i sc_hi = _mm512_or_si512(
					_mm512_and_si512(_mm512_srli_epi32(u2v, 8 * j), m4d),
					_mm512_slli_epi32(_mm512_and_si512(
						_mm512_srli_epi32(u0v, 8 * j + 6), m2), 4));
				__m512i m_hi = _mm512_or_si512(
					_mm512_and_si512(_mm512_srli_epi32(u2v, 8 * j + 4), m4d),
					_mm512_slli_epi32(_mm512_and_si512(
						_mm512_srli_epi32(u1v, 8 * j + 6), m2), 4));

				_mm512_store_ps(sg + j * 64,
						_mm512_mul_ps(d, _mm512_cvtepi32_ps(sc_lo)));
				_mm512_store_ps(sg + (j + 4) * 64,
						_mm512_mul_ps(d, _mm512_cvtepi32_ps(sc_hi)));
				mn[j] = m_lo;
				mn[j + 4] = m_hi;
			}
			for (int i = 0; i < 4; i++)
				_mm512_store_si512(sg + (8 + i) * 64,
						   _mm512_or_si512(mn[2 * i],
								   _mm512_slli_epi32(mn[2 * i + 1], 16)));
			_mm512_store_ps(sg + 12 * 64, _mm512_sub_ps(_mm512_setzero_ps(), dmin));
		}
	}
}

ALWAYS_INLINE void pack_q6_k(const struct panel *p, const int G, int64_t u0, int nu,
			     uint8_t *dst)
{
	const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);

	for (int s = 0; s < nu / 8; s++) {
		const int64_t off = (u0 / 8 + s) * 210;
		uint8_t *ds = dst + (size_t)s * SBW(G, Q6K_SCALE_BYTES);

		for (int g = 0; g < G; g++) {
			const uint8_t *const *rp = p->rp + 16 * g;
			float *sg = (float *)(ds + 8 * G * 512 + g * Q6K_SCALE_BYTES);

			for (int h = 0; h < 2; h++) {
				__m512i z[4][8], o[8];

				for (int i = 0; i < 8; i++) {
					const uint8_t *a = rp[i] + off, *b = rp[i + 8] + off;
					__m512i l0 = load_pair256(a + 64 * h, b + 64 * h);
					__m512i l1 = load_pair256(a + 64 * h + 32, b + 64 * h + 32);
					__m512i qh = load_pair256(a + 128 + 32 * h, b + 128 + 32 * h);

					/* 0xEA: (A & B) | C, low nibble | two high bits at 0x30 */
					z[0][i] = _mm512_ternarylogic_epi32(l0, m4, _mm512_and_si512(
						_mm512_slli_epi16(qh, 4), m30), 0xEA);
					z[1][i] = _mm512_ternarylogic_epi32(l1, m4, _mm512_and_si512(
						_mm512_slli_epi16(qh, 2), m30), 0xEA);
					z[2][i] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(l0, 4),
									    m4, _mm512_and_si512(qh, m30),
									    0xEA);
					z[3][i] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(l1, 4),
									    m4, _mm512_and_si512(
						_mm512_srli_epi16(qh, 2), m30), 0xEA);
				}
				for (int j = 0; j < 4; j++) {
					tr16x8(z[j], o);
					store8(ds + (4 * h + j) * G * 512 + 512 * g, o);
				}
			}
			const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(
				gather_i32(p->base, p->rowoff[g], off + 206), 16)));

			for (int q = 0; q < 4; q++) {
				__m512i v = gather_i32(p->base, p->rowoff[g], off + 192 + 4 * q);

				for (int j = 0; j < 4; j++) {
					/* sign-extend byte j of each lane */
					__m512i sj = _mm512_srai_epi32(_mm512_slli_epi32(v, 24 - 8 * j),
								       24);

					_mm512_store_ps(sg + (4 * q + j) * 16,
							_mm512_mul_ps(d, _mm512_cvtepi32_ps(sj)));
				}
			}
		}
	}
}

/* ------------------------------------------------------------------------ */
/* packed activations: per micro-tile of NCP columns, one pointer per unit  */

/*
 * Q8_0 columns (NULL: a zero column) into [unit][quants NCP x 32 | start
 * NCP x int32 | scale NCP x float]; start = -z * sum, z the weights' zero
 * point (128 for xor-flipped Q8_0, 8 for Q4_0).
 */
static void xpack_q8(const uint8_t *const *cols, int64_t nu, int32_t z, uint8_t *out)
{
	for (int64_t u = 0; u < nu; u++, out += UX8) {
		int32_t *init = (int32_t *)(out + NCP * 32);
		float *d = (float *)(out + NCP * 36);

		for (int c = 0; c < NCP; c++) {
			const struct hyb_block_q8_0 *b = cols[c] ?
				(const struct hyb_block_q8_0 *)cols[c] + u : NULL;

			if (b) {
				memcpy(out + 32 * c, b->qs, 32);
				init[c] = -z * q8_block_sum(b);
				d[c] = f16_scalar(b->d);
			} else {
				memset(out + 32 * c, 0, 32);
				init[c] = 0;
				d[c] = 0;
			}
		}
	}
}

/*
 * Q8_K columns into [super-block][quants NCP x 256 | extra | scale NCP x
 * float]. Extra for Q4_K: per column 4 int32 = sums of sub-blocks (2i, 2i+1)
 * as int16 pairs (for vpdpwssd with the mins); for Q6_K: per column 16 int32
 * = -32 * bsum (the codes' offset).
 */
static void xpack_k(const uint8_t *const *cols, int64_t nsb, int q6, uint8_t *out)
{
	const size_t sbx = q6 ? SX6K : SX4K, extra = q6 ? 64 : 16;

	for (int64_t s = 0; s < nsb; s++, out += sbx) {
		float *d = (float *)(out + NCP * (256 + extra));

		for (int c = 0; c < NCP; c++) {
			const struct hyb_block_q8_k *b = cols[c] ?
				(const struct hyb_block_q8_k *)cols[c] + s : NULL;
			int32_t *ex = (int32_t *)(out + NCP * 256 + extra * c);

			if (!b) {
				memset(out + 256 * c, 0, 256);
				memset(ex, 0, extra);
				d[c] = 0;
				continue;
			}
			memcpy(out + 256 * c, b->qs, 256);
			d[c] = b->d;
			if (q6) {
				for (int j = 0; j < 16; j++)
					ex[j] = -32 * b->bsums[j];
			} else {
				for (int i = 0; i < 4; i++) {
					const int16_t *bs = b->bsums + 4 * i;
					const uint16_t lo = (uint16_t)(bs[0] + bs[1]);
					const uint16_t hi = (uint16_t)(bs[2] + bs[3]);

					ex[i] = (int32_t)((uint32_t)lo | (uint32_t)hi << 16);
				}
			}
		}
	}
}

/* ------------------------------------------------------------------------ */
/* packed micro-kernels                                                     */

/*
 * Software prefetch of the next chunk's raw rows into L2, two lines per
 * unit of work: packing then reads from L2 rather than stalling on dozens
 * of scattered DRAM streams, and the transfers overlap the arithmetic.
 */
struct pf_slice {
	const void *const *a;
	int n;
};

ALWAYS_INLINE void pf_unit(struct pf_slice pf, int i)
{
	if (2 * i < pf.n)
		_mm_prefetch(pf.a[2 * i], _MM_HINT_T1);
	if (2 * i + 1 < pf.n)
		_mm_prefetch(pf.a[2 * i + 1], _MM_HINT_T1);
}

ALWAYS_INLINE void out_store(__m512 v, float *y, __mmask16 m, int first)
{
	if (!first)
		v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, y));
	_mm512_mask_storeu_ps(y, m, v);
}

ALWAYS_INLINE void mk_q8(const int G, const int NC, const uint8_t *wp, const uint8_t *xp, int nu,
			 struct pf_slice pf, float *const *y, const __mmask16 *m, int first)
{
	__m512 acc[GMAX][NCP];

	for (int g = 0; g < G; g++)
		for (int c = 0; c < NC; c++)
			acc[g][c] = _mm512_setzero_ps();
	for (int u = 0; u < nu; u++) {
		const uint8_t *wu = wp + (size_t)u * UW8(G), *xu = xp + (size_t)u * UX8;
		__m512i ia[GMAX][NCP];

		pf_unit(pf, u);
#pragma GCC unroll 4
		for (int c = 0; c < NC; c++) {
			const __m512i init = _mm512_set1_epi32(ld32(xu + NCP * 32 + 4 * c));

			for (int g = 0; g < G; g++)
				ia[g][c] = init;
		}
		UNROLL(MK_TUNROLL)
		for (int t = 0; t < 8; t++) {
			__m512i wv[GMAX];

			for (int g = 0; g < G; g++)
				wv[g] = _mm512_load_si512(wu + 512 * g + 64 * t);
#pragma GCC unroll 4
			for (int c = 0; c < NC; c++) {
				const __m512i xb = _mm512_set1_epi32(ld32(xu + 32 * c + 4 * t));

				for (int g = 0; g < G; g++)
					ia[g][c] = dot_us(ia[g][c], wv[g], xb);
			}
		}
#pragma GCC unroll 3
		for (int g = 0; g < G; g++) {
			const __m512 sw = _mm512_load_ps(wu + 512 * G + 64 * g);

#pragma GCC unroll 4
			for (int c = 0; c < NC; c++) {
				const __m512 dx = _mm512_set1_ps(((const float *)(xu + NCP * 36))[c]);

				acc[g][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[g][c]),
							    _mm512_mul_ps(sw, dx), acc[g][c]);
			}
		}
	}
	for (int c = 0; c < NC; c++)
		for (int g = 0; g < G; g++)
			out_store(acc[g][c], y[c] + 16 * g, m[g], first);
}

/*
 * Q4_K: per super-block, 8 units scaled by d*sc_j into fb, then the mins
 * (int16 pairs m_2i, m_2i+1 times the pair sums) by -dmin, then fb times
 * the column scale into acc.
 */
ALWAYS_INLINE void mk_q4k(const int G, const int NC, const uint8_t *wp, const uint8_t *xp,
			  int nsb, struct pf_slice pf, float *const *y, const __mmask16 *m,
			  int first)
{
	__m512 acc[GMAX][NCP];

	for (int g = 0; g < G; g++)
		for (int c = 0; c < NC; c++)
			acc[g][c] = _mm512_setzero_ps();
	for (int s = 0; s < nsb; s++) {
		const uint8_t *ws = wp + (size_t)s * SBW(G, Q4K_SCALE_BYTES);
		const uint8_t *xs = xp + (size_t)s * SX4K;
		const uint8_t *sc = ws + 8 * G * 512;
		__m512 fb[GMAX][NCP];
		__m512i ia[GMAX][NCP];

		for (int g = 0; g < G; g++)
			for (int c = 0; c < NC; c++)
				fb[g][c] = _mm512_setzero_ps();
		for (int j = 0; j < 8; j++) {
			const uint8_t *wu = ws + (size_t)j * G * 512;

			pf_unit(pf, s * 8 + j);
			for (int g = 0; g < G; g++)
				for (int c = 0; c < NC; c++)
					ia[g][c] = _mm512_setzero_si512();
#pragma GCC unroll 8
			for (int t = 0; t < 8; t++) {
				__m512i wv[GMAX];

				for (int g = 0; g < G; g++)
					wv[g] = _mm512_load_si512(wu + 512 * g + 64 * t);
#pragma GCC unroll 4
				for (int c = 0; c < NC; c++) {
					const __m512i xb = _mm512_set1_epi32(
						ld32(xs + 256 * c + 32 * j + 4 * t));

					for (int g = 0; g < G; g++)
						ia[g][c] = dot_us(ia[g][c], wv[g], xb);
				}
			}
			for (int g = 0; g < G; g++) {
				const __m512 sj = _mm512_load_ps(sc + g * Q4K_SCALE_BYTES + 64 * j);

				for (int c = 0; c < NC; c++)
					fb[g][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[g][c]), sj,
								   fb[g][c]);
			}
		}
		for (int g = 0; g < G; g++) {
			const uint8_t *sg = sc + g * Q4K_SCALE_BYTES;
			const __m512 ndmin = _mm512_load_ps(sg + 12 * 64);

			for (int c = 0; c < NC; c++) {
				__m512i im = _mm512_setzero_si512();

				for (int i = 0; i < 4; i++)
					im = dot_ww(im, _mm512_load_si512(sg + (8 + i) * 64),
						    _mm512_set1_epi32(ld32(xs + NCP * 256 + 16 * c + 4 * i)));
				fb[g][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(im), ndmin, fb[g][c]);
				acc[g][c] = _mm512_fmadd_ps(fb[g][c], _mm512_set1_ps(
					((const float *)(xs + NCP * 272))[c]), acc[g][c]);
			}
		}
	}
	for (int c = 0; c < NC; c++)
		for (int g = 0; g < G; g++)
			out_store(acc[g][c], y[c] + 16 * g, m[g], first);
}

/* Q6_K: sub-blocks of 16 = half a unit, started at -32 * bsum */
ALWAYS_INLINE void mk_q6k(const int G, const int NC, const uint8_t *wp, const uint8_t *xp,
			  int nsb, struct pf_slice pf, float *const *y, const __mmask16 *m,
			  int first)
{
	__m512 acc[GMAX][NCP];

	for (int g = 0; g < G; g++)
		for (int c = 0; c < NC; c++)
			acc[g][c] = _mm512_setzero_ps();
	for (int s = 0; s < nsb; s++) {
		const uint8_t *ws = wp + (size_t)s * SBW(G, Q6K_SCALE_BYTES);
		const uint8_t *xs = xp + (size_t)s * SX6K;
		const uint8_t *sc = ws + 8 * G * 512;
		__m512 fb[GMAX][NCP];
		__m512i ia[GMAX][NCP];

		for (int g = 0; g < G; g++)
			for (int c = 0; c < NC; c++)
				fb[g][c] = _mm512_setzero_ps();
		for (int j = 0; j < 16; j++) {
			const uint8_t *wu = ws + (size_t)(j / 2) * G * 512 + 256 * (j & 1);

			if (!(j & 1))
				pf_unit(pf, s * 8 + j / 2);
#pragma GCC unroll 4
			for (int c = 0; c < NC; c++) {
				const __m512i init = _mm512_set1_epi32(
					ld32(xs + NCP * 256 + 64 * c + 4 * j));

				for (int g = 0; g < G; g++)
					ia[g][c] = init;
			}
#pragma GCC unroll 4
			for (int t = 0; t < 4; t++) {
				__m512i wv[GMAX];

				for (int g = 0; g < G; g++)
					wv[g] = _mm512_load_si512(wu + 512 * g + 64 * t);
#pragma GCC unroll 4
				for (int c = 0; c < NC; c++) {
					const __m512i xb = _mm512_set1_epi32(
						ld32(xs + 256 * c + 16 * j + 4 * t));

					for (int g = 0; g < G; g++)
						ia[g][c] = dot_us(ia[g][c], wv[g], xb);
				}
			}
			for (int g = 0; g < G; g++) {
				const __m512 sj = _mm512_load_ps(sc + g * Q6K_SCALE_BYTES + 64 * j);

				for (int c = 0; c < NC; c++)
					fb[g][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[g][c]), sj,
								   fb[g][c]);
			}
		}
		for (int c = 0; c < NC; c++) {
			const __m512 dx = _mm512_set1_ps(((const float *)(xs + NCP * 320))[c]);

			for (int g = 0; g < G; g++)
				acc[g][c] = _mm512_fmadd_ps(fb[g][c], dx, acc[g][c]);
		}
	}
	for (int c = 0; c < NC; c++)
		for (int g = 0; g < G; g++)
			out_store(acc[g][c], y[c] + 16 * g, m[g], first);
}

enum ptype { P_Q8_0, P_Q4_0, P_Q4_K, P_Q6_K };

static void mk_any(const enum ptype t, int nc, const uint8_t *wp, const uint8_t *xp, int nu,
		   struct pf_slice pf, float *const *y, const __mmask16 *m, int first)
{
	if (t == P_Q8_0 || t == P_Q4_0) {
		switch (nc) {
#define CASE(N) case N: mk_q8(G8, N, wp, xp, nu, pf, y, m, first); break;
		CASE(1) CASE(2) CASE(3) CASE(4)
#undef CASE
		}
	} else if (t == P_Q4_K) {
		switch (nc) {
#define CASE(N) case N: mk_q4k(GK, N, wp, xp, nu / 8, pf, y, m, first); break;
		CASE(1) CASE(2) CASE(3) CASE(4)
#undef CASE
		}
	} else {
		switch (nc) {
#define CASE(N) case N: mk_q6k(GK, N, wp, xp, nu / 8, pf, y, m, first); break;
		CASE(1) CASE(2) CASE(3) CASE(4)
#undef CASE
		}
	}
}

static void pack_any(const enum ptype t, const struct panel *p, int64_t u0, int nu, uint8_t *dst)
{
	switch (t) {
	case P_Q8_0:
		pack_q8_0(p, G8, u0, nu, dst);
		break;
	case P_Q4_0:
		pack_q4_0(p, G8, u0, nu, dst);
		break;
	case P_Q4_K:
		pack_q4_k(p, GK, u0, nu, dst);
		break;
	case P_Q6_K:
		pack_q6_k(p, GK, u0, nu, dst);
		break;
	}
}

/* ------------------------------------------------------------------------ */
/* packed driver                                                            */

/* the lines of rows r0.. (clamped) in [off, off + len): the next chunk to pack */
static int pf_list(const void **a, const uint8_t *w, size_t ws, int64_t r0, int64_t nrows,
		   int rows, size_t off, size_t len)
{
	int n = 0;

	for (int r = 0; r < rows; r++) {
		const uint8_t *p = w + (size_t)min64(r0 + r, nrows - 1) * ws + off;
		const uintptr_t lo = (uintptr_t)p & ~(uintptr_t)63, hi = (uintptr_t)p + len;

		for (uintptr_t l = lo; l < hi; l += 64)
			a[n++] = (const void *)l;
	}
	return n;
}

/*
 * Rows in panels of 16*G, k in chunks of KCU units: the chunk's packed
 * codes (16*G x 512 bytes) stay in L1 while every column tile passes over
 * them. Returns -1 (nothing written) when scratch memory is not available.
 */
static int packed_gemm(const enum ptype t, HYB_GEMM_ARGS)
{
	const int kq = t == P_Q4_K || t == P_Q6_K;
	const int G = kq ? GK : G8, rows = 16 * G;
	const int64_t nu = k / 32, ntile = (ncols + NCP - 1) / NCP;
	/* bytes per unit of k: packed activations of a tile, raw weight row */
	const size_t xunit = t == P_Q4_K ? SX4K / 8 : t == P_Q6_K ? SX6K / 8 : UX8;
	const size_t wunit = t == P_Q8_0 ? 34 : t == P_Q4_0 ? 18 : t == P_Q4_K ? 18 : 27;
	const size_t chunk = kq ? KCU / 8 * SBW(G, t == P_Q4_K ? Q4K_SCALE_BYTES : Q6K_SCALE_BYTES)
			     : KCU * UW8(G);
	const size_t tile_bytes = (size_t)nu * xunit;
	/* lines per row of a chunk: at most KCU * 34 bytes (Q8_0), plus alignment */
	const int max_pf = rows * (KCU * 34 / 64 + 2);
	uint8_t *xs, *ws;
	const void **pfa;
	struct panel p;

	if (w_stride > INT32_MAX / 64)
		return -1;
	xs = hyb_cpu_scratch(HYB_SCRATCH_X, tile_bytes * (size_t)ntile);
	ws = hyb_cpu_scratch(HYB_SCRATCH_W, chunk);
	pfa = hyb_cpu_scratch(HYB_SCRATCH_P, (size_t)max_pf * sizeof(*pfa));
	if (!xs || !ws || !pfa)
		return -1;
	for (int64_t tt = 0; tt < ntile; tt++) {
		const uint8_t *cols[NCP];

		for (int c = 0; c < NCP; c++)
			cols[c] = tt * NCP + c < ncols ?
				  (const uint8_t *)x + (size_t)(tt * NCP + c) * x_stride : NULL;
		if (kq)
			xpack_k(cols, k / 256, t == P_Q6_K, xs + tt * tile_bytes);
		else
			xpack_q8(cols, nu, t == P_Q8_0 ? 128 : 8, xs + tt * tile_bytes);
	}
	for (int64_t r0 = 0; r0 < nrows; r0 += rows) {
		__mmask16 m[GMAX];

		for (int g = 0; g < G; g++) {
			const int64_t left = nrows - r0 - 16 * g;

			m[g] = left >= 16 ? 0xFFFF : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
		}
		panel_rows(&p, G, w, w_stride, r0, nrows);
		for (int64_t u0 = 0; u0 < nu; u0 += KCU) {
			const int cu = (int)min64(KCU, nu - u0);
			int npf = 0;

			/* the chunk after this one: the rest of the panel, or the next panel */
			if (u0 + KCU < nu)
				npf = pf_list(pfa, w, w_stride, r0, nrows, rows,
					      (size_t)(u0 + KCU) * wunit,
					      (size_t)min64(KCU, nu - u0 - KCU) * wunit);
			else if (r0 + rows < nrows)
				npf = pf_list(pfa, w, w_stride, r0 + rows, nrows, rows, 0,
					      (size_t)min64(KCU, nu) * wunit);
			pack_any(t, &p, u0, cu, ws);
			for (int64_t tt = 0; tt < ntile; tt++) {
				const int nc = (int)min64(NCP, ncols - tt * NCP);
				const int per = 2 * cu, first_pf = (int)(tt * per);
				struct pf_slice pf = { pfa + first_pf, npf - first_pf };
				float *yc[NCP];

				for (int c = 0; c < nc; c++)
					yc[c] = y + (size_t)(tt * NCP + c) * y_stride + r0;
				mk_any(t, nc, ws, xs + tt * tile_bytes + (size_t)u0 * xunit, cu, pf, yc,
				       m, u0 == 0);
			}
			/* what the arithmetic did not cover */
			for (int i = (int)(ntile * 2 * cu); i < npf; i++)
				_mm_prefetch(pfa[i], _MM_HINT_T1);
		}
	}
	return 0;
}

/* ------------------------------------------------------------------------ */
/* entry points                                                             */

/* below this many columns the direct kernel wins (no repacking to amortise) */
#ifndef PACKED_MIN_COLS
#define PACKED_MIN_COLS 4
#endif

#if HYB_VNNI
#define SFX(name) name##_avx512vnni
#else
#define SFX(name) name##_avx512
#endif

static void SFX(gemm_q8_0)(HYB_GEMM_ARGS)
{
	if (HYB_VNNI && ncols >= PACKED_MIN_COLS &&
	    !packed_gemm(P_Q8_0, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride))
		return;
	direct_gemm(D_Q8_0, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride);
}

static void SFX(gemm_q4_0)(HYB_GEMM_ARGS)
{
	if (ncols >= PACKED_MIN_COLS &&
	    !packed_gemm(P_Q4_0, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride))
		return;
	direct_gemm(D_Q4_0, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride);
}

static void SFX(gemm_q4_k)(HYB_GEMM_ARGS)
{
	if (ncols >= PACKED_MIN_COLS &&
	    !packed_gemm(P_Q4_K, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride))
		return;
	direct_gemm(D_Q4_K, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride);
}

static void SFX(gemm_q6_k)(HYB_GEMM_ARGS)
{
	if (ncols >= PACKED_MIN_COLS &&
	    !packed_gemm(P_Q6_K, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride))
		return;
	direct_gemm(D_Q6_K, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride);
}

static void SFX(fill_q)(struct hyb_cpu_kernels *kt)
{
	kt->gemm[HYB_TYPE_Q8_0] = SFX(gemm_q8_0);
	kt->gemm[HYB_TYPE_Q4_0] = SFX(gemm_q4_0);
	kt->gemm[HYB_TYPE_Q4_K] = SFX(gemm_q4_k);
	kt->gemm[HYB_TYPE_Q6_K] = SFX(gemm_q6_k);
}
