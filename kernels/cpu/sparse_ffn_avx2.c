// SPDX-License-Identifier: MIT
/*
 * AVX2 sparse FFN kernels (AVX2 + FMA + F16C). Same shape as the AVX-512
 * body (sparse_ffn_avx512_body.h, which explains the tiles and the
 * prefetch) on 256-bit vectors: dots use vpmaddubsw + vpmaddwd with Q4_0
 * nibbles unsigned (zero point paid back through the activation sums) and
 * Q8_0 by the sign trick; axpys widen 8 bytes to 8 lanes per vector. Float
 * rows whose length is not a multiple of 16 finish in scalar code.
 */
#include <immintrin.h>
#include <string.h>

#include "blocks.h"
#include "sparse_ffn_kernels.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))
#define TR 4
#define PF_DIST 2 /* tiles ahead that the software prefetch reads */
#define PF_HINT _MM_HINT_T1

static inline int imin(int a, int b)
{
	return a < b ? a : b;
}

static inline float f16_at(const uint8_t *p)
{
	uint16_t h;

	memcpy(&h, p, 2);
	return _cvtsh_ss(h);
}

static inline float hsum8(__m256 v)
{
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));

	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	s = _mm_add_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

static inline int tile_rows(const void *const *rows, int n, int n_all, int i, const uint8_t **w,
			    const uint8_t **nx)
{
	const int nr = imin(TR, n - i);

	for (int r = 0; r < TR; r++) {
		w[r] = rows[i + imin(r, nr - 1)];
		nx[r] = rows[imin(i + PF_DIST * TR + r, n_all - 1)];
	}
	return nr;
}

/* ---- Q8_0 / Q4_0 ---------------------------------------------------------- */

#define SB 16 /* blocks per slice */

static inline uint16_t ld16(const uint8_t *p)
{
	uint16_t v;

	memcpy(&v, p, 2);
	return v;
}

/*
 * The F16 scales of blocks b0 .. b0+nbs-1 of row p (the rest 0) times v,
 * into out[0..16): four to a 64-bit register, then two conversions (see
 * block_scales() in sparse_ffn_avx512_body.h).
 */
ALWAYS_INLINE void block_scales(const uint8_t *p, size_t bsz, int64_t b0, int nbs,
				__m256 v0, __m256 v1, float *out)
{
	uint64_t q[4];

	for (int i = 0; i < 4; i++) {
		uint64_t t = 0;

		for (int l = 0; l < 4; l++) {
			const int j = 4 * i + l;

			if (nbs == SB || j < nbs)
				t |= (uint64_t)ld16(p + (b0 + j) * bsz) << (16 * l);
		}
		q[i] = t;
	}
	_mm256_store_ps(out, _mm256_mul_ps(_mm256_cvtph_ps(_mm_set_epi64x((long long)q[1],
									   (long long)q[0])),
					   v0));
	_mm256_store_ps(out + 8, _mm256_mul_ps(_mm256_cvtph_ps(_mm_set_epi64x((long long)q[3],
									       (long long)q[2])),
					       v1));
}

ALWAYS_INLINE void q_dot_slice(const int q4, const int R, int64_t b0, int nbs,
			       const uint8_t *const *w, const uint8_t *const *nx,
			       const struct hyb_sparse_x *x, __m256 *acc)
{
	const size_t bsz = q4 ? sizeof(struct hyb_block_q4_0) : sizeof(struct hyb_block_q8_0);
	const struct hyb_sparse_xblk *xb = x->blk;
	const __m256i ones = _mm256_set1_epi16(1);
	float sc[TR][SB] __attribute__((aligned(32)));

	/* the product of the two block scales, per row and block */
	for (int r = 0; r < R; r++)
		block_scales(w[r], bsz, b0, nbs, _mm256_loadu_ps(x->xd + b0),
			     _mm256_loadu_ps(x->xd + b0 + 8), sc[r]);
	for (int j = 0; j < nbs; j++) {
		const int64_t b = b0 + j;
		const __m256i xq = _mm256_loadu_si256((const __m256i *)xb[b].q);
		const __m256i corr = _mm256_loadu_si256((const __m256i *)xb[b].corr);

		if (!q4 || b % 3 == 0)
			for (int r = 0; r < R; r++)
				_mm_prefetch((const char *)nx[r] + b * bsz, PF_HINT);
#pragma GCC unroll 4
		for (int r = 0; r < R; r++) {
			const uint8_t *p = w[r] + b * bsz;
			__m256i d;

			if (q4) {
				const __m128i v = _mm_loadu_si128((const __m128i *)(p + 2));
				const __m256i t = _mm256_and_si256(
					_mm256_set_m128i(_mm_srli_epi16(v, 4), v),
					_mm256_set1_epi8(0x0F));

				d = _mm256_add_epi32(corr, _mm256_madd_epi16(
					_mm256_maddubs_epi16(t, xq), ones));
			} else {
				const __m256i t = _mm256_loadu_si256((const __m256i *)(p + 2));

				d = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(t, t),
									   _mm256_sign_epi8(xq, t)),
						      ones);
			}
			acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_set1_ps(sc[r][j]),
						 acc[r]);
		}
	}
}

ALWAYS_INLINE void q_dot_tile(const int q4, const int R, int64_t nb, const uint8_t *const *w,
			      const uint8_t *const *nx, const struct hyb_sparse_x *x, float *out)
{
	__m256 acc[TR];
	int64_t b0 = 0;

	for (int r = 0; r < R; r++)
		acc[r] = _mm256_setzero_ps();
	for (; b0 + SB <= nb; b0 += SB)
		q_dot_slice(q4, R, b0, SB, w, nx, x, acc);
	if (b0 < nb)
		q_dot_slice(q4, R, b0, (int)(nb - b0), w, nx, x, acc);
	for (int r = 0; r < R; r++)
		out[r] = hsum8(acc[r]);
}

/* 8 bytes at p widened to 8 int32 lanes (one vpmov[sz]xbd from memory), signed or not */
static inline __m256i widen8(const int sgn, const uint8_t *p)
{
	const __m128i v = _mm_loadl_epi64((const __m128i *)p);

	return sgn ? _mm256_cvtepi8_epi32(v) : _mm256_cvtepu8_epi32(v);
}

ALWAYS_INLINE void q_axpy_slice(const int q4, const int R, int64_t b0, int nbs,
				const uint8_t *const *w, const uint8_t *const *nx, const float *h,
				float *y)
{
	const size_t bsz = q4 ? sizeof(struct hyb_block_q4_0) : sizeof(struct hyb_block_q8_0);
	float sc[TR][SB] __attribute__((aligned(32)));
	float off[SB] __attribute__((aligned(32)));

	/* h * d per row and block; Q4_0's -8 as one add per block for the tile */
	for (int r = 0; r < R; r++)
		block_scales(w[r], bsz, b0, nbs, _mm256_set1_ps(h[r]), _mm256_set1_ps(h[r]), sc[r]);
	if (q4) {
		for (int i = 0; i < SB; i += 8) {
			__m256 o = _mm256_load_ps(sc[0] + i);

			for (int r = 1; r < R; r++)
				o = _mm256_add_ps(o, _mm256_load_ps(sc[r] + i));
			_mm256_store_ps(off + i, _mm256_mul_ps(o, _mm256_set1_ps(-8.0f)));
		}
	}
	for (int j = 0; j < nbs; j++) {
		const int64_t b = b0 + j;
		float *yb = y + 32 * b;
		__m256 y0 = _mm256_loadu_ps(yb), y1 = _mm256_loadu_ps(yb + 8);
		__m256 y2 = _mm256_loadu_ps(yb + 16), y3 = _mm256_loadu_ps(yb + 24);

		if (!q4 || b % 3 == 0)
			for (int r = 0; r < R; r++)
				_mm_prefetch((const char *)nx[r] + b * bsz, PF_HINT);
#pragma GCC unroll 4
		for (int r = 0; r < R; r++) {
			const uint8_t *p = w[r] + b * bsz;
			const __m256 sv = _mm256_set1_ps(sc[r][j]);
			__m256i a, c, e, f;

			if (q4) {
				/* bytes 0-7 and 8-15: low nibbles are elements 0-15, high 16-31 */
				const __m256i v0 = widen8(0, p + 2), v1 = widen8(0, p + 10);
				const __m256i m = _mm256_set1_epi32(0xF);

				a = _mm256_and_si256(v0, m);
				c = _mm256_and_si256(v1, m);
				e = _mm256_srli_epi32(v0, 4);
				f = _mm256_srli_epi32(v1, 4);
			} else {
				a = widen8(1, p + 2);
				c = widen8(1, p + 10);
				e = widen8(1, p + 18);
				f = widen8(1, p + 26);
			}
			y0 = _mm256_fmadd_ps(sv, _mm256_cvtepi32_ps(a), y0);
			y1 = _mm256_fmadd_ps(sv, _mm256_cvtepi32_ps(c), y1);
			y2 = _mm256_fmadd_ps(sv, _mm256_cvtepi32_ps(e), y2);
			y3 = _mm256_fmadd_ps(sv, _mm256_cvtepi32_ps(f), y3);
		}
		if (q4) {
			const __m256 o = _mm256_set1_ps(off[j]);

			y0 = _mm256_add_ps(y0, o);
			y1 = _mm256_add_ps(y1, o);
			y2 = _mm256_add_ps(y2, o);
			y3 = _mm256_add_ps(y3, o);
		}
		_mm256_storeu_ps(yb, y0);
		_mm256_storeu_ps(yb + 8, y1);
		_mm256_storeu_ps(yb + 16, y2);
		_mm256_storeu_ps(yb + 24, y3);
	}
}

ALWAYS_INLINE void q_axpy_tile(const int q4, const int R, int64_t nb, const uint8_t *const *w,
			       const uint8_t *const *nx, const float *h, float *y)
{
	int64_t b0 = 0;

	for (; b0 + SB <= nb; b0 += SB)
		q_axpy_slice(q4, R, b0, SB, w, nx, h, y);
	if (b0 < nb)
		q_axpy_slice(q4, R, b0, (int)(nb - b0), w, nx, h, y);
}

/* ---- F16 / F32 ------------------------------------------------------------ */

ALWAYS_INLINE __m256 load_f(const int f16, const void *p, int64_t i)
{
	if (f16)
		return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
	return _mm256_loadu_ps((const float *)p + i);
}

static inline float scalar_f(const int f16, const void *p, int64_t i)
{
	if (f16)
		return _cvtsh_ss(((const uint16_t *)p)[i]);
	return ((const float *)p)[i];
}

ALWAYS_INLINE void f_dot_tile(const int f16, const int R, int64_t k, const uint8_t *const *w,
			      const uint8_t *const *nx, const void *x, float *out)
{
	const int esz = f16 ? 2 : 4;
	const int64_t k16 = k & ~(int64_t)15;
	__m256 acc[TR][2];
	int64_t i;

	for (int r = 0; r < R; r++)
		acc[r][0] = acc[r][1] = _mm256_setzero_ps();
	for (i = 0; i < k16; i += 16) {
		const __m256 x0 = load_f(f16, x, i), x1 = load_f(f16, x, i + 8);

		if (f16 ? i % 32 == 0 : 1)
			for (int r = 0; r < R; r++)
				_mm_prefetch((const char *)nx[r] + i * esz, PF_HINT);
#pragma GCC unroll 4
		for (int r = 0; r < R; r++) {
			acc[r][0] = _mm256_fmadd_ps(load_f(f16, w[r], i), x0, acc[r][0]);
			acc[r][1] = _mm256_fmadd_ps(load_f(f16, w[r], i + 8), x1, acc[r][1]);
		}
	}
	for (int r = 0; r < R; r++) {
		float s = hsum8(_mm256_add_ps(acc[r][0], acc[r][1]));

		for (i = k16; i < k; i++)
			s += scalar_f(f16, w[r], i) * scalar_f(f16, x, i);
		out[r] = s;
	}
}

ALWAYS_INLINE void f_axpy_tile(const int f16, const int R, int64_t k, const uint8_t *const *w,
			       const uint8_t *const *nx, const float *h, float *y)
{
	const int esz = f16 ? 2 : 4;
	const int64_t k16 = k & ~(int64_t)15;
	__m256 hv[TR];
	int64_t i;

	for (int r = 0; r < R; r++)
		hv[r] = _mm256_set1_ps(h[r]);
	for (i = 0; i < k16; i += 16) {
		__m256 y0 = _mm256_loadu_ps(y + i), y1 = _mm256_loadu_ps(y + i + 8);

		if (f16 ? i % 32 == 0 : 1)
			for (int r = 0; r < R; r++)
				_mm_prefetch((const char *)nx[r] + i * esz, PF_HINT);
#pragma GCC unroll 4
		for (int r = 0; r < R; r++) {
			y0 = _mm256_fmadd_ps(hv[r], load_f(f16, w[r], i), y0);
			y1 = _mm256_fmadd_ps(hv[r], load_f(f16, w[r], i + 8), y1);
		}
		_mm256_storeu_ps(y + i, y0);
		_mm256_storeu_ps(y + i + 8, y1);
	}
	for (; i < k; i++)
		for (int r = 0; r < R; r++)
			y[i] += h[r] * scalar_f(f16, w[r], i);
}

/* ---- drivers --------------------------------------------------------------- */

enum kind { K_F32, K_F16, K_Q8_0, K_Q4_0 };

ALWAYS_INLINE void dot_tile(const enum kind t, const int R, int64_t k, const uint8_t *const *w,
			    const uint8_t *const *nx, const struct hyb_sparse_x *x, float *out)
{
	if (t == K_F32 || t == K_F16)
		f_dot_tile(t == K_F16, R, k, w, nx, x->q, out);
	else
		q_dot_tile(t == K_Q4_0, R, k / 32, w, nx, x, out);
}

ALWAYS_INLINE void axpy_tile(const enum kind t, const int R, int64_t k, const uint8_t *const *w,
			     const uint8_t *const *nx, const float *h, float *y)
{
	if (t == K_F32 || t == K_F16)
		f_axpy_tile(t == K_F16, R, k, w, nx, h, y);
	else
		q_axpy_tile(t == K_Q4_0, R, k / 32, w, nx, h, y);
}

ALWAYS_INLINE void dot_any(const enum kind t, int64_t k, const void *const *rows, int n,
			   int n_pf, const struct hyb_sparse_x *x, float *out)
{
	for (int i = 0; i < n; i += TR) {
		const uint8_t *w[TR], *nx[TR];

		switch (tile_rows(rows, n, n + n_pf, i, w, nx)) {
		case 1: dot_tile(t, 1, k, w, nx, x, out + i); break;
		case 2: dot_tile(t, 2, k, w, nx, x, out + i); break;
		case 3: dot_tile(t, 3, k, w, nx, x, out + i); break;
		default: dot_tile(t, 4, k, w, nx, x, out + i); break;
		}
	}
}

ALWAYS_INLINE void axpy_any(const enum kind t, int64_t k, const void *const *rows,
			    const float *h, int n, int n_pf, float *y)
{
	for (int i = 0; i < n; i += TR) {
		const uint8_t *w[TR], *nx[TR];

		switch (tile_rows(rows, n, n + n_pf, i, w, nx)) {
		case 1: axpy_tile(t, 1, k, w, nx, h + i, y); break;
		case 2: axpy_tile(t, 2, k, w, nx, h + i, y); break;
		case 3: axpy_tile(t, 3, k, w, nx, h + i, y); break;
		default: axpy_tile(t, 4, k, w, nx, h + i, y); break;
		}
	}
}

#define ENTRY(name, T)                                                                      \
	static void dotp_##name(int64_t k, const void *const *rows, int n, int n_pf,       \
				const struct hyb_sparse_x *x, float *out)                   \
	{                                                                                   \
		dot_any(T, k, rows, n, n_pf, x, out);                                       \
	}                                                                                   \
	static void axpyp_##name(int64_t k, const void *const *rows, const float *h, int n,\
				 int n_pf, float *y)                                        \
	{                                                                                   \
		axpy_any(T, k, rows, h, n, n_pf, y);                                        \
	}                                                                                   \
	static void dot_##name(int64_t k, const void *const *rows, int n,                  \
			       const struct hyb_sparse_x *x, float *out)                    \
	{                                                                                   \
		dot_any(T, k, rows, n, 0, x, out);                                          \
	}                                                                                   \
	static void axpy_##name(int64_t k, const void *const *rows, const float *h, int n, \
				float *y)                                                   \
	{                                                                                   \
		axpy_any(T, k, rows, h, n, 0, y);                                           \
	}
ENTRY(f32, K_F32)
ENTRY(f16, K_F16)
ENTRY(q8_0, K_Q8_0)
ENTRY(q4_0, K_Q4_0)
#undef ENTRY

void hyb_sparse_fill_avx2(struct hyb_sparse_kernels *k)
{
	k->dot[HYB_TYPE_F32] = dot_f32;
	k->dot[HYB_TYPE_F16] = dot_f16;
	k->dot[HYB_TYPE_Q8_0] = dot_q8_0;
	k->dot[HYB_TYPE_Q4_0] = dot_q4_0;
	k->axpy[HYB_TYPE_F32] = axpy_f32;
	k->axpy[HYB_TYPE_F16] = axpy_f16;
	k->axpy[HYB_TYPE_Q8_0] = axpy_q8_0;
	k->axpy[HYB_TYPE_Q4_0] = axpy_q4_0;
	k->dot_pf[HYB_TYPE_F32] = dotp_f32;
	k->dot_pf[HYB_TYPE_F16] = dotp_f16;
	k->dot_pf[HYB_TYPE_Q8_0] = dotp_q8_0;
	k->dot_pf[HYB_TYPE_Q4_0] = dotp_q4_0;
	k->axpy_pf[HYB_TYPE_F32] = axpyp_f32;
	k->axpy_pf[HYB_TYPE_F16] = axpyp_f16;
	k->axpy_pf[HYB_TYPE_Q8_0] = axpyp_q8_0;
	k->axpy_pf[HYB_TYPE_Q4_0] = axpyp_q4_0;
}
