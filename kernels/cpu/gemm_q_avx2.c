// SPDX-License-Identifier: MIT
/*
 * AVX2 quantized kernels (Q4_0, Q8_0, Q4_K, Q6_K): 4 rows x up to 2 columns
 * straight from the GGUF blocks, for every ncols. Each 32-element block of a
 * row is unpacked once and multiplied by every column of the tile;
 * AVX2's 16 registers hold 8 accumulators plus the temporaries. This is
 * the fallback level: decode is memory-bound and fine, prefill has no
 * packed kernel here (the AVX-512 levels have one).
 *
 * The u8*s8 product is vpmaddubsw: pair sums saturate at 32767, so signed
 * Q8_0 weights use the sign trick (|w| times x*sign(w)); nibbles and 6-bit
 * codes (<= 63) are unsigned already and their zero point is paid back
 * through the activation block sums, as in the AVX-512 kernels.
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

static inline float hsum8(__m256 v)
{
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));

	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	s = _mm_add_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

static inline __m256i madd_ones(__m256i p16)
{
	return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
}

/* sum of the 32 int8 of a block */
static inline int32_t sum32(const int8_t *q)
{
	__m256i v = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)q),
				     _mm256_set1_epi8((char)0x80));
	__m256i s = _mm256_sad_epu8(v, _mm256_setzero_si256());
	__m128i t = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));

	t = _mm_add_epi64(t, _mm_unpackhi_epi64(t, t));
	return (int32_t)_mm_cvtsi128_si32(t) - 32 * 128;
}

/*
 * Each tile prefetches the next tile's rows (into L2) as it goes: rows of a
 * few KiB are too short for the hardware prefetcher to ramp up on.
 */
ALWAYS_INLINE void prefetch_next(const uint8_t *const *nx, int64_t off, const int lines)
{
	for (int r = 0; r < TR; r++)
		for (int l = 0; l < lines; l++)
			_mm_prefetch((const char *)nx[r] + off + 64 * l, _MM_HINT_T1);
}

/* ------------------------------------------------------------------------ */
/* Q8_0 and Q4_0: x is the Q8_0 activation row                               */

/* per column, per block: the activation scale and (for Q4_0) -sum */
struct xblk {
	float d;
	int32_t negsum;
};

static void x_prepack(const uint8_t *x, int64_t nb, struct xblk *out)
{
	const struct hyb_block_q8_0 *b = (const struct hyb_block_q8_0 *)x;

	for (int64_t i = 0; i < nb; i++) {
		out[i].d = f16s(b[i].d);
		out[i].negsum = -sum32(b[i].qs);
	}
}

/* the 4 rows' scales of block b as floats, one 64-bit move instead of 4 inserts */
ALWAYS_INLINE __m128 row_scales(const uint8_t *const *wr, int64_t off)
{
	uint16_t h[TR];
	uint64_t v = 0;

	for (int r = 0; r < TR; r++) {
		memcpy(&h[r], wr[r] + off, 2);
		v |= (uint64_t)h[r] << (16 * r);
	}
	return _mm_cvtph_ps(_mm_cvtsi64_si128((long long)v));
}

ALWAYS_INLINE void q8_tile(const int NC, int64_t nb, const uint8_t *const *wr,
			   const uint8_t *const *nx, const uint8_t *const *xc,
			   const struct xblk *const *xp, float out[TR][TC])
{
	__m256 acc[TR][TC];
	__m256i bidx[TR];

	for (int r = 0; r < TR; r++) {
		bidx[r] = _mm256_set1_epi32(r);
		for (int c = 0; c < NC; c++)
			acc[r][c] = _mm256_setzero_ps();
	}
	for (int64_t b = 0; b < nb; b++) {
		const __m128 dw = row_scales(wr, b * 34);
		__m256i xv[TC];
		__m256 s4[TC];

		prefetch_next(nx, b * 34, 1);
		for (int c = 0; c < NC; c++) {
			xv[c] = _mm256_loadu_si256((const __m256i *)
				((const struct hyb_block_q8_0 *)xc[c] + b)->qs);
			s4[c] = _mm256_castps128_ps256(_mm_mul_ps(dw, _mm_set1_ps(xp[c][b].d)));
		}
#pragma GCC unroll 4
		for (int r = 0; r < TR; r++) {
			const struct hyb_block_q8_0 *wb = (const struct hyb_block_q8_0 *)wr[r] + b;
			const __m256i w = _mm256_loadu_si256((const __m256i *)wb->qs);
			const __m256i u = _mm256_sign_epi8(w, w);

#pragma GCC unroll 2
			for (int c = 0; c < NC; c++) {
				const __m256i p = madd_ones(_mm256_maddubs_epi16(u,
							_mm256_sign_epi8(xv[c], w)));

				acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p),
							    _mm256_permutevar8x32_ps(s4[c], bidx[r]),
							    acc[r][c]);
			}
		}
	}
	for (int r = 0; r < TR; r++)
		for (int c = 0; c < NC; c++)
			out[r][c] = hsum8(acc[r][c]);
}

ALWAYS_INLINE void q4_tile(const int NC, int64_t nb, const uint8_t *const *wr,
			   const uint8_t *const *nx, const uint8_t *const *xc,
			   const struct xblk *const *xp, float out[TR][TC])
{
	const __m256i m4 = _mm256_set1_epi8(0x0F);
	/* low 128 bits as they are, high 128 bits >> 4: the two nibble halves */
	const __m256i sh = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
	__m256 acc[TR][TC];
	__m256i bidx[TR];

	for (int r = 0; r < TR; r++) {
		bidx[r] = _mm256_set1_epi32(r);
		for (int c = 0; c < NC; c++)
			acc[r][c] = _mm256_setzero_ps();
	}
	for (int64_t b = 0; b < nb; b++) {
		const __m128 dw = row_scales(wr, b * 18);
		__m256i xv[TC], corr[TC];
		__m256 s4[TC];

		prefetch_next(nx, b * 18, 1);
		for (int c = 0; c < NC; c++) {
			xv[c] = _mm256_loadu_si256((const __m256i *)
				((const struct hyb_block_q8_0 *)xc[c] + b)->qs);
			s4[c] = _mm256_castps128_ps256(_mm_mul_ps(dw, _mm_set1_ps(xp[c][b].d)));
			/* -8 * sum spread as -sum over the 8 lanes */
			corr[c] = _mm256_set1_epi32(xp[c][b].negsum);
		}
#pragma GCC unroll 4
		for (int r = 0; r < TR; r++) {
			const struct hyb_block_q4_0 *wb = (const struct hyb_block_q4_0 *)wr[r] + b;
			/* elements 0-15 in the low nibbles, 16-31 in the high ones */
			const __m256i u = _mm256_and_si256(_mm256_srlv_epi32(
				_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)wb->qs)),
				sh), m4);

#pragma GCC unroll 2
			for (int c = 0; c < NC; c++) {
				const __m256i p = _mm256_add_epi32(
					madd_ones(_mm256_maddubs_epi16(u, xv[c])), corr[c]);

				acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p),
							    _mm256_permutevar8x32_ps(s4[c], bidx[r]),
							    acc[r][c]);
			}
		}
	}
	for (int r = 0; r < TR; r++)
		for (int c = 0; c < NC; c++)
			out[r][c] = hsum8(acc[r][c]);
}

/* ------------------------------------------------------------------------ */
/* K-quants: x is the Q8_K activation row                                    */

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

ALWAYS_INLINE void q4k_tile(const int NC, int64_t nsb, const uint8_t *const *wr,
			    const uint8_t *const *nx, const uint8_t *const *xc, float out[TR][TC])
{
	const __m256i m4 = _mm256_set1_epi8(0x0F);
	__m256 acc[TR][TC];

	for (int r = 0; r < TR; r++)
		for (int c = 0; c < NC; c++)
			acc[r][c] = _mm256_setzero_ps();
	for (int64_t s = 0; s < nsb; s++) {
		prefetch_next(nx, s * 144, 3);
#pragma GCC unroll 4
		for (int r = 0; r < TR; r++) {
			const struct hyb_block_q4_k *b = (const struct hyb_block_q4_k *)wr[r] + s;
			uint64_t sc8, mn8;
			__m256i ia[TC];

			q4k_unpack(b->scales, &sc8, &mn8);
			/* the 8 mins as int16, each twice: one per bsum (16 elements) */
			const __m128i mn = _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)mn8));
			const __m256i mn2 = _mm256_set_m128i(_mm_unpackhi_epi16(mn, mn),
							     _mm_unpacklo_epi16(mn, mn));

			for (int c = 0; c < NC; c++)
				ia[c] = _mm256_setzero_si256();
			for (int j = 0; j < 4; j++) {
				const __m256i q = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * j));
				const __m256i lo = _mm256_and_si256(q, m4);
				const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
				const __m256i s0 = _mm256_set1_epi16((short)((sc8 >> (16 * j)) & 0xFF));
				const __m256i s1 = _mm256_set1_epi16(
					(short)((sc8 >> (16 * j + 8)) & 0xFF));

				for (int c = 0; c < NC; c++) {
					const int8_t *xq = ((const struct hyb_block_q8_k *)xc[c] + s)->qs +
							   64 * j;
					const __m256i p0 = _mm256_maddubs_epi16(lo,
						_mm256_loadu_si256((const __m256i *)xq));
					const __m256i p1 = _mm256_maddubs_epi16(hi,
						_mm256_loadu_si256((const __m256i *)(xq + 32)));

					ia[c] = _mm256_add_epi32(ia[c], _mm256_add_epi32(
						_mm256_madd_epi16(p0, s0), _mm256_madd_epi16(p1, s1)));
				}
			}
			const float d = f16s(b->d), dmin = f16s(b->dmin);

			for (int c = 0; c < NC; c++) {
				const struct hyb_block_q8_k *xb = (const struct hyb_block_q8_k *)xc[c] + s;
				const __m256i im = _mm256_madd_epi16(
					_mm256_loadu_si256((const __m256i *)xb->bsums), mn2);

				acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[c]),
							    _mm256_set1_ps(d * xb->d), acc[r][c]);
				acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(im),
							    _mm256_set1_ps(-dmin * xb->d), acc[r][c]);
			}
		}
	}
	for (int r = 0; r < TR; r++)
		for (int c = 0; c < NC; c++)
			out[r][c] = hsum8(acc[r][c]);
}

ALWAYS_INLINE void q6k_tile(const int NC, int64_t nsb, const uint8_t *const *wr,
			    const uint8_t *const *nx, const uint8_t *const *xc, float out[TR][TC])
{
	const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
	__m256 acc[TR][TC];

	for (int r = 0; r < TR; r++)
		for (int c = 0; c < NC; c++)
			acc[r][c] = _mm256_setzero_ps();
	for (int64_t s = 0; s < nsb; s++) {
		prefetch_next(nx, s * 210, 4);
#pragma GCC unroll 4
		for (int r = 0; r < TR; r++) {
			const struct hyb_block_q6_k *b = (const struct hyb_block_q6_k *)wr[r] + s;
			const __m256i sc16 = _mm256_cvtepi8_epi16(
				_mm_loadu_si128((const __m128i *)b->scales));
			/* -32 * scale, paid back through the bsums */
			const __m256i scn = _mm256_sub_epi16(_mm256_setzero_si256(),
							     _mm256_slli_epi16(sc16, 5));
			__m256i ia[TC];

			for (int c = 0; c < NC; c++)
				ia[c] = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)
					((const struct hyb_block_q8_k *)xc[c] + s)->bsums), scn);
			for (int h = 0; h < 2; h++) {
				const __m256i l0 = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h));
				const __m256i l1 = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h +
											 32));
				const __m256i qh = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * h));
				__m256i q[4];

				/* the four 32-element quarters of this half, values 0..63 */
				q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4),
						       _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
				q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
						       _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
				q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
						       _mm256_and_si256(qh, m30));
				q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
						       _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
				for (int j = 0; j < 4; j++) {
					/* sub-blocks 8h + 2j (first 16) and 8h + 2j + 1 */
					const int sb = 8 * h + 2 * j;
					const __m256i scv = _mm256_set_m128i(
						_mm_set1_epi16(b->scales[sb + 1]),
						_mm_set1_epi16(b->scales[sb]));

					for (int c = 0; c < NC; c++) {
						const int8_t *xq = ((const struct hyb_block_q8_k *)xc[c] +
								    s)->qs + 128 * h + 32 * j;
						const __m256i p = _mm256_maddubs_epi16(q[j],
							_mm256_loadu_si256((const __m256i *)xq));

						ia[c] = _mm256_add_epi32(ia[c],
									 _mm256_madd_epi16(p, scv));
					}
				}
			}
			const float d = f16s(b->d);

			for (int c = 0; c < NC; c++)
				acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[c]), _mm256_set1_ps(
					d * ((const struct hyb_block_q8_k *)xc[c] + s)->d), acc[r][c]);
		}
	}
	for (int r = 0; r < TR; r++)
		for (int c = 0; c < NC; c++)
			out[r][c] = hsum8(acc[r][c]);
}

/* ------------------------------------------------------------------------ */

enum qtype { Q_Q8_0, Q_Q4_0, Q_Q4_K, Q_Q6_K };

ALWAYS_INLINE void run(const enum qtype t, const int NC, int64_t k, const uint8_t *w, size_t ws,
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
		switch (t) {
		case Q_Q8_0:
			q8_tile(NC, k / 32, wr, nx, xc, xp, out);
			break;
		case Q_Q4_0:
			q4_tile(NC, k / 32, wr, nx, xc, xp, out);
			break;
		case Q_Q4_K:
			q4k_tile(NC, k / 256, wr, nx, xc, out);
			break;
		case Q_Q6_K:
			q6k_tile(NC, k / 256, wr, nx, xc, out);
			break;
		}
		for (int c = 0; c < NC; c++)
			for (int r = 0; r < TR && r0 + r < nrows; r++)
				y[(size_t)c * ys + r0 + r] = out[r][c];
	}
}

static void gemm_any(const enum qtype t, HYB_GEMM_ARGS)
{
	const int64_t nb = k / 32;
	struct xblk *xs = NULL;

	if (hyb_gemm_trivial(k, nrows, ncols, y, y_stride))
		return;
	if (t == Q_Q8_0 || t == Q_Q4_0) {
		xs = hyb_cpu_scratch(HYB_SCRATCH_X, (size_t)nb * TC * sizeof(*xs));
		if (!xs) {
			(t == Q_Q8_0 ? hyb_gemm_q8_0_scalar : hyb_gemm_q4_0_scalar)(
				k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride);
			return;
		}
	}
	for (int64_t c0 = 0; c0 < ncols; c0 += TC) {
		const uint8_t *xc[TC];
		const struct xblk *xp[TC] = { NULL };
		float *yc = y + (size_t)c0 * y_stride;

		for (int c = 0; c < TC; c++) {
			xc[c] = (const uint8_t *)x + (size_t)min64(c0 + c, ncols - 1) * x_stride;
			if (xs) {
				x_prepack(xc[c], nb, xs + c * nb);
				xp[c] = xs + c * nb;
			}
		}
		if (ncols - c0 >= 2) {
			switch (t) {
			case Q_Q8_0: run(Q_Q8_0, 2, k, w, w_stride, nrows, xc, xp, yc, y_stride); break;
			case Q_Q4_0: run(Q_Q4_0, 2, k, w, w_stride, nrows, xc, xp, yc, y_stride); break;
			case Q_Q4_K: run(Q_Q4_K, 2, k, w, w_stride, nrows, xc, xp, yc, y_stride); break;
			case Q_Q6_K: run(Q_Q6_K, 2, k, w, w_stride, nrows, xc, xp, yc, y_stride); break;
			}
		} else {
			switch (t) {
			case Q_Q8_0: run(Q_Q8_0, 1, k, w, w_stride, nrows, xc, xp, yc, y_stride); break;
			case Q_Q4_0: run(Q_Q4_0, 1, k, w, w_stride, nrows, xc, xp, yc, y_stride); break;
			case Q_Q4_K: run(Q_Q4_K, 1, k, w, w_stride, nrows, xc, xp, yc, y_stride); break;
			case Q_Q6_K: run(Q_Q6_K, 1, k, w, w_stride, nrows, xc, xp, yc, y_stride); break;
			}
		}
	}
}

static void gemm_q8_0(HYB_GEMM_ARGS)
{
	gemm_any(Q_Q8_0, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride);
}

static void gemm_q4_0(HYB_GEMM_ARGS)
{
	gemm_any(Q_Q4_0, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride);
}

static void gemm_q4_k(HYB_GEMM_ARGS)
{
	gemm_any(Q_Q4_K, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride);
}

static void gemm_q6_k(HYB_GEMM_ARGS)
{
	gemm_any(Q_Q6_K, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride);
}

void hyb_fill_q_avx2(struct hyb_cpu_kernels *kt)
{
	hyb_set_gemm(kt, HYB_TYPE_Q8_0, gemm_q8_0);
	hyb_set_gemm(kt, HYB_TYPE_Q4_0, gemm_q4_0);
	hyb_set_gemm(kt, HYB_TYPE_Q4_K, gemm_q4_k);
	hyb_set_gemm(kt, HYB_TYPE_Q6_K, gemm_q6_k);
}
