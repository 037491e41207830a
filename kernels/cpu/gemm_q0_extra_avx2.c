// SPDX-License-Identifier: MIT
/*
 * AVX2 Q4_1, Q5_0, Q5_1 and IQ4_NL kernels: 4 rows x up to 2 columns
 * straight from the GGUF blocks, for every ncols, as gemm_q_avx2.c does for
 * Q4_0: each row's 32-element block is unpacked once and multiplied by
 * every column of the tile.
 *
 * Summation: what llama.cpp's x86 AVX2 build adds, per output. For these
 * types that is also what its AVX-512 build adds (the vec_dot code is the
 * __AVX2__ branch in both, tinyBLAS_Q0_AVX works on 256-bit vectors in
 * both, the repacked IQ4_NL kernels convert whole-block integer dots in
 * both; VNNI only changes how the exact integers are formed), so these
 * kernels give llama.cpp's bits (tests/unit/test_kernels.c: its matmul
 * goldens, and the AVX-512 levels' results over more shapes):
 *
 * - Q4_1, Q5_1 (ggml_vec_dot_{q4_1,q5_1}_q8_1, every column count): lane l
 *   of block b is the exact dot of elements 4l..4l+3, acc = fma(float(lane),
 *   dw*dx, acc) per lane, then hsum_float_8, plus a scalar chain
 *   summs = fma(m, s, summs) (llama.cpp's C contracted by its build).
 * - Q5_0 (vec_dot for 1 column, tinyBLAS_Q0_AVX for more: the same
 *   arithmetic) as Q4_1 without the mins; its -16 zero point is paid back per
 *   lane through the activation's lane sums, so each lane holds exactly
 *   llama.cpp's integer.
 * - IQ4_NL with rows % 8 != 0: one column is ggml_vec_dot_iq4_nl_q8_0 (two
 *   chains, even and odd blocks, added lane by lane before the hsum; an odd
 *   last block added in scalar code, unfused as GCC leaves it when tuning
 *   for Zen; a generic-tuned build fuses it), more columns tinyBLAS_Q0_AVX (one
 *   chain). With rows % 8 == 0 llama.cpp repacks it (iq4_nl_8x8): per output
 *   acc = fma(float(dot of the whole block), dw*dx, acc), no lanes.
 *
 * The u8*s8 product is vpmaddubsw: Q4_1/Q5_1/Q5_0 codes (<= 31) are
 * unsigned and cannot saturate; IQ4_NL's levels (-127..113) use the sign
 * trick (|w| times x*sign(w)).
 */
#include <immintrin.h>
#include <string.h>

#include "cpu_internal.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))
#define TR 4 /* rows per tile */
#define TC 2 /* columns per tile */

static inline int64_t min64(int64_t a, int64_t b)
{
	return a < b ? a : b;
}

static inline float f16s(uint16_t h)
{
	return _cvtsh_ss(h);
}

static inline uint16_t ld16(const void *p)
{
	uint16_t v;

	memcpy(&v, p, 2);
	return v;
}

/* hsum_float_8 (ggml-cpu/arch/x86/quants.c): high half + low half, then pairs */
static inline float hsum8(__m256 v)
{
	__m128 s = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));

	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	s = _mm_add_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

static inline __m256i madd_ones(__m256i p16)
{
	return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
}

/* the four int32 lanes' total of each of a, b, c, d: [sum a, sum b, sum c, sum d] */
static inline __m128i hsum4_epi32(__m256i a, __m256i b, __m256i c, __m256i d)
{
	const __m256i t = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));

	return _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
}

/* next tile's rows into L2 (see gemm_q_avx2.c) */
ALWAYS_INLINE void prefetch_next(const uint8_t *const *nx, int64_t off)
{
	for (int r = 0; r < TR; r++)
		_mm_prefetch((const char *)nx[r] + off, _MM_HINT_T1);
}

/* ------------------------------------------------------------------------ */

/*
 * Kinds of tile: K_NL is IQ4_NL's tinyBLAS_Q0 (one chain), K_NL2 its vec_dot
 * (two chains), K_NLR its repacked kernels (whole-block dots).
 */
enum kind { K_Q41, K_Q51, K_Q50, K_NL, K_NL2, K_NLR };

ALWAYS_INLINE int kbsz(const enum kind t)
{
	return t == K_Q41 ? 20 : t == K_Q51 ? 24 : t == K_Q50 ? 22 : 18;
}

/* byte offsets of the low nibbles and of qh in a weight block */
ALWAYS_INLINE int kqs(const enum kind t)
{
	return t == K_Q41 ? 4 : t == K_Q51 ? 8 : t == K_Q50 ? 6 : 2;
}

ALWAYS_INLINE int kqh(const enum kind t)
{
	return t == K_Q50 ? 2 : 4;
}

/* Q8_1 activations (d, s, quants) for the types with a min, Q8_0 (d, quants) otherwise */
ALWAYS_INLINE int kmin(const enum kind t)
{
	return t == K_Q41 || t == K_Q51;
}

ALWAYS_INLINE int knl(const enum kind t)
{
	return t == K_NL || t == K_NL2 || t == K_NLR;
}

/* per column, per block: what the tile needs besides the quants */
struct xblk {
	float d;
	float s;         /* Q8_1: the block's s */
	int32_t corr[8]; /* Q5_0: -16 times each lane's 4 quants */
};

static void x_prepack(const enum kind t, const uint8_t *x, int64_t nb, struct xblk *out)
{
	const size_t xbs = kmin(t) ? sizeof(struct hyb_block_q8_1) : sizeof(struct hyb_block_q8_0);

	for (int64_t i = 0; i < nb; i++) {
		const uint8_t *b = x + (size_t)i * xbs;

		out[i].d = f16s(ld16(b));
		out[i].s = kmin(t) ? f16s(ld16(b + 2)) : 0.0f;
		if (t == K_Q50) {
			const __m256i q = _mm256_loadu_si256((const __m256i *)(b + 2));

			_mm256_storeu_si256((__m256i *)out[i].corr, _mm256_sub_epi32(
				_mm256_setzero_si256(),
				madd_ones(_mm256_maddubs_epi16(_mm256_set1_epi8(16), q))));
		}
	}
}

/* 4 halves at byte offset off of the 4 rows, as floats */
ALWAYS_INLINE __m128 row_halves(const uint8_t *const *wr, int64_t off)
{
	uint64_t v = 0;

	for (int r = 0; r < TR; r++)
		v |= (uint64_t)ld16(wr[r] + off) << (16 * r);
	return _mm_cvtph_ps(_mm_cvtsi64_si128((long long)v));
}

/*
 * The 32 codes of a weight block, element j in byte j: unsigned 0..31 for
 * Q4_1/Q5_0/Q5_1 (Q5_0's zero point is in the activation's corr), IQ4_NL's
 * signed levels.
 */
ALWAYS_INLINE __m256i weights(const enum kind t, const uint8_t *blk)
{
	/* low 128 bits as they are, high 128 bits >> 4: elements 0-15 and 16-31 */
	const __m256i sh = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
	__m256i u = _mm256_and_si256(_mm256_srlv_epi32(_mm256_broadcastsi128_si256(
		_mm_loadu_si128((const __m128i *)(blk + kqs(t)))), sh), _mm256_set1_epi8(0x0F));

	if (t == K_Q41)
		return u;
	if (knl(t))
		return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(
			_mm_loadu_si128((const __m128i *)hyb_kvalues_iq4nl)), u);
	{
		/* bit j of qh is bit 4 of element j: byte j takes qh's byte j / 8 */
		uint32_t qh;

		memcpy(&qh, blk + kqh(t), 4);
		const __m256i idx = _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL,
						       0x0303030303030303LL);
		const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
		const __m256i hb = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), idx);
		const __m256i on = _mm256_cmpeq_epi8(_mm256_and_si256(hb, bit), bit);

		return _mm256_or_si256(u, _mm256_and_si256(on, _mm256_set1_epi8(0x10)));
	}
}

/* 8 int32 lanes: lane l the exact dot of elements 4l..4l+3 (u already |w| for IQ4_NL) */
ALWAYS_INLINE __m256i lane_dot(const enum kind t, __m256i u, __m256i w, __m256i x,
			       const struct xblk *xb)
{
	if (knl(t))
		return madd_ones(_mm256_maddubs_epi16(u, _mm256_sign_epi8(x, w)));
	if (t == K_Q50)
		return _mm256_add_epi32(madd_ones(_mm256_maddubs_epi16(u, x)),
					_mm256_loadu_si256((const __m256i *)xb->corr));
	return madd_ones(_mm256_maddubs_epi16(u, x));
}

/* the lane-accumulating kinds: Q4_1, Q5_1, Q5_0, IQ4_NL (K_NL, K_NL2) */
ALWAYS_INLINE void lane_tile(const enum kind t, const int NC, int64_t nb,
			     const uint8_t *const *wr, const uint8_t *const *nx,
			     const uint8_t *const *xc, const struct xblk *const *xp,
			     float out[TR][TC])
{
	const size_t bsz = (size_t)kbsz(t);
	const size_t xbs = kmin(t) ? sizeof(struct hyb_block_q8_1) : sizeof(struct hyb_block_q8_0);
	const size_t xqo = kmin(t) ? 4 : 2;
	const int two = t == K_NL2;
	/* the blocks the vector chains take: all but an odd last one for K_NL2 */
	const int64_t nbv = two ? nb & ~(int64_t)1 : nb;
	__m256 acc[2][TR][TC], sm = _mm256_setzero_ps();
	__m256i bidx[TR];

	for (int r = 0; r < TR; r++) {
		bidx[r] = _mm256_set1_epi32(r);
		for (int c = 0; c < NC; c++) {
			acc[0][r][c] = _mm256_setzero_ps();
			acc[1][r][c] = _mm256_setzero_ps();
		}
	}
	for (int64_t b = 0; b < nbv; b++) {
		const __m128 dw = row_halves(wr, (int64_t)(b * bsz));
		const int ch = two ? (int)(b & 1) : 0;
		__m256i xv[TC];
		__m256 s4[TC];

		prefetch_next(nx, (int64_t)(b * bsz));
		for (int c = 0; c < NC; c++) {
			xv[c] = _mm256_loadu_si256((const __m256i *)(xc[c] + b * xbs + xqo));
			/* dw * dx of the 4 rows */
			s4[c] = _mm256_castps128_ps256(_mm_mul_ps(dw, _mm_set1_ps(xp[c][b].d)));
		}
		if (kmin(t)) {
			/* summs = fma(m, s, summs): lane c*4 + r for row r, column c */
			const __m128 m = row_halves(wr, (int64_t)(b * bsz + 2));

			sm = _mm256_fmadd_ps(_mm256_set_m128(m, m),
					     _mm256_set_m128(_mm_set1_ps(xp[NC - 1][b].s),
							     _mm_set1_ps(xp[0][b].s)), sm);
		}
#pragma GCC unroll 4
		for (int r = 0; r < TR; r++) {
			const __m256i w = weights(t, wr[r] + b * bsz);
			const __m256i u = knl(t) ? _mm256_sign_epi8(w, w) : w;

#pragma GCC unroll 2
			for (int c = 0; c < NC; c++) {
				const __m256i p = lane_dot(t, u, w, xv[c], &xp[c][b]);

				acc[ch][r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p),
								_mm256_permutevar8x32_ps(s4[c], bidx[r]),
								acc[ch][r][c]);
			}
		}
	}
	float ms[8];

	_mm256_storeu_ps(ms, sm);
	for (int r = 0; r < TR; r++)
		for (int c = 0; c < NC; c++) {
			out[r][c] = hsum8(two ? _mm256_add_ps(acc[0][r][c], acc[1][r][c])
					      : acc[0][r][c]);
			if (kmin(t))
				out[r][c] += ms[4 * c + r];
		}
	if (two && nbv < nb) {
		/* the odd last block: sumf += dx * dw * sumi in scalar code, unfused */
		const int64_t b = nbv;

		for (int r = 0; r < TR; r++) {
			const __m256i w = weights(t, wr[r] + b * bsz);
			const __m256i u = _mm256_sign_epi8(w, w);

			for (int c = 0; c < NC; c++) {
				const __m256i x = _mm256_loadu_si256((const __m256i *)(xc[c] + b * xbs +
										      xqo));
				const __m256i p = lane_dot(t, u, w, x, &xp[c][b]);
				const __m128i h = _mm_add_epi32(_mm256_castsi256_si128(p),
								_mm256_extracti128_si256(p, 1));
				const __m128i q = _mm_add_epi32(h, _mm_unpackhi_epi64(h, h));
				const int32_t sumi = _mm_cvtsi128_si32(q) +
						     _mm_extract_epi32(q, 1);

				out[r][c] += xp[c][b].d * f16s(ld16(wr[r] + b * bsz)) * (float)sumi;
			}
		}
	}
}

/* repacked IQ4_NL: per output one float chain of whole-block dots, 4 rows per vector */
ALWAYS_INLINE void nlr_tile(const int NC, int64_t nb, const uint8_t *const *wr,
			    const uint8_t *const *nx, const uint8_t *const *xc,
			    const struct xblk *const *xp, float out[TR][TC])
{
	__m128 acc[TC];

	for (int c = 0; c < NC; c++)
		acc[c] = _mm_setzero_ps();
	for (int64_t b = 0; b < nb; b++) {
		const __m128 dw = row_halves(wr, b * 18);
		__m256i xv[TC], p[TR][TC];

		prefetch_next(nx, b * 18);
		for (int c = 0; c < NC; c++)
			xv[c] = _mm256_loadu_si256((const __m256i *)(xc[c] + b * 34 + 2));
#pragma GCC unroll 4
		for (int r = 0; r < TR; r++) {
			const __m256i w = weights(K_NLR, wr[r] + b * 18);
			const __m256i u = _mm256_sign_epi8(w, w);

#pragma GCC unroll 2
			for (int c = 0; c < NC; c++)
				p[r][c] = lane_dot(K_NLR, u, w, xv[c], NULL);
		}
		for (int c = 0; c < NC; c++) {
			const __m128i s = hsum4_epi32(p[0][c], p[1][c], p[2][c], p[3][c]);

			/* col_scale * row_scale = dw * dx */
			acc[c] = _mm_fmadd_ps(_mm_cvtepi32_ps(s), _mm_mul_ps(dw, _mm_set1_ps(xp[c][b].d)),
					      acc[c]);
		}
	}
	for (int c = 0; c < NC; c++) {
		float o[4];

		_mm_storeu_ps(o, acc[c]);
		for (int r = 0; r < TR; r++)
			out[r][c] = o[r];
	}
}

/* ------------------------------------------------------------------------ */

ALWAYS_INLINE void run(const enum kind t, const int NC, int64_t k, const uint8_t *w, size_t ws,
		       int64_t nrows, const uint8_t *const *xc, const struct xblk *const *xp,
		       float *y, size_t ys)
{
	for (int64_t r0 = 0; r0 < nrows; r0 += TR) {
		const uint8_t *wr[TR], *nx[TR];
		float out[TR][TC];

		/* a short last tile repeats its last row rather than reading past it */
		for (int r = 0; r < TR; r++) {
			wr[r] = w + (size_t)min64(r0 + r, nrows - 1) * ws;
			nx[r] = w + (size_t)min64(r0 + TR + r, nrows - 1) * ws;
		}
		if (t == K_NLR)
			nlr_tile(NC, k / 32, wr, nx, xc, xp, out);
		else
			lane_tile(t, NC, k / 32, wr, nx, xc, xp, out);
		for (int c = 0; c < NC; c++)
			for (int r = 0; r < TR && r0 + r < nrows; r++)
				y[(size_t)c * ys + r0 + r] = out[r][c];
	}
}

ALWAYS_INLINE void run_nc(const enum kind t, int64_t k, const uint8_t *w, size_t ws,
			  int64_t nrows, const uint8_t *const *xc, const struct xblk *const *xp,
			  int64_t nc, float *y, size_t ys)
{
	if (nc >= 2)
		run(t, 2, k, w, ws, nrows, xc, xp, y, ys);
	else
		run(t, 1, k, w, ws, nrows, xc, xp, y, ys);
}

static void gemm_any(const enum kind t, HYB_GEMM_ARGS, hyb_gemm_fn fallback)
{
	const int64_t nb = k / 32;
	struct xblk *xs;

	if (hyb_gemm_trivial(k, nrows, ncols, y, y_stride))
		return;
	xs = hyb_cpu_scratch(HYB_SCRATCH_X, (size_t)nb * TC * sizeof(*xs));
	if (!xs) {
		fallback(k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride);
		return;
	}
	for (int64_t c0 = 0; c0 < ncols; c0 += TC) {
		const uint8_t *xc[TC];
		const struct xblk *xp[TC];
		float *yc = y + (size_t)c0 * y_stride;

		/* a short last tile repeats its last column */
		for (int c = 0; c < TC; c++) {
			xc[c] = (const uint8_t *)x + (size_t)min64(c0 + c, ncols - 1) * x_stride;
			xp[c] = xs + min64(c, ncols - 1 - c0) * nb;
			if (c0 + c < ncols)
				x_prepack(t, xc[c], nb, xs + c * nb);
		}
		switch (t) {
		case K_Q41:
			run_nc(K_Q41, k, w, w_stride, nrows, xc, xp, ncols - c0, yc, y_stride);
			break;
		case K_Q51:
			run_nc(K_Q51, k, w, w_stride, nrows, xc, xp, ncols - c0, yc, y_stride);
			break;
		case K_Q50:
			run_nc(K_Q50, k, w, w_stride, nrows, xc, xp, ncols - c0, yc, y_stride);
			break;
		case K_NL:
			run_nc(K_NL, k, w, w_stride, nrows, xc, xp, ncols - c0, yc, y_stride);
			break;
		case K_NL2:
			run(K_NL2, 1, k, w, w_stride, nrows, xc, xp, yc, y_stride);
			break;
		case K_NLR:
			run_nc(K_NLR, k, w, w_stride, nrows, xc, xp, ncols - c0, yc, y_stride);
			break;
		}
	}
}

static void gemm_q4_1(HYB_GEMM_ARGS)
{
	gemm_any(K_Q41, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride,
		 hyb_gemm_q4_1_scalar);
}

static void gemm_q5_1(HYB_GEMM_ARGS)
{
	gemm_any(K_Q51, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride,
		 hyb_gemm_q5_1_scalar);
}

static void gemm_q5_0(HYB_GEMM_ARGS)
{
	gemm_any(K_Q50, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride,
		 hyb_gemm_q5_0_scalar);
}

/* unrepacked IQ4_NL (rows % 8 != 0): vec_dot for one column, tinyBLAS_Q0 from 2 */
static void gemm_iq4_nl_m1(HYB_GEMM_ARGS)
{
	gemm_any(ncols == 1 ? K_NL2 : K_NL, k, w, w_stride, nrows, x, x_stride, ncols, y,
		 y_stride, hyb_gemm_iq4_nl_scalar);
}

/* repacked IQ4_NL (iq4_nl_8x8, rows % 8 == 0): GEMV and GEMM add alike */
static void gemm_iq4_nl(HYB_GEMM_ARGS)
{
	gemm_any(K_NLR, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride,
		 hyb_gemm_iq4_nl_scalar);
}

void hyb_fill_q0_extra_avx2(struct hyb_cpu_kernels *kt)
{
	hyb_set_gemm(kt, HYB_TYPE_Q4_1, gemm_q4_1);
	hyb_set_gemm(kt, HYB_TYPE_Q5_1, gemm_q5_1);
	hyb_set_gemm(kt, HYB_TYPE_Q5_0, gemm_q5_0);
	hyb_set_gemm(kt, HYB_TYPE_IQ4_NL, gemm_iq4_nl_m1);
	kt->gemm[HYB_TYPE_IQ4_NL] = gemm_iq4_nl;
}
