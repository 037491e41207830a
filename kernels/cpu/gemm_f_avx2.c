// SPDX-License-Identifier: MIT
/*
 * AVX2 kernels for float weights: F32, F16 (F16C vcvtph2ps) and BF16 (a
 * 16-bit shift). Activations are widened to float once per call.
 *
 * - direct (ncols < 4): 4 rows x up to 2 columns, 8 k per step; the k tail
 *   goes through a zero-padded copy, any k.
 * - packed: 16 rows transposed into row lanes (8 rows per ymm) in chunks of
 *   KC k, then 12 accumulators = 2 row groups x 6 columns, one broadcast
 *   activation per column and k.
 */
#include <immintrin.h>
#include <string.h>

#include "cpu_internal.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))
#define FR 4   /* direct tile rows */
#define FC 2   /* direct tile columns */
#define PR 16  /* packed panel rows */
#define PNC 6  /* packed tile columns */
#define KC 256 /* k per packed chunk: 16 x 256 floats = 16 KiB */

enum ftype { F_F32, F_F16, F_BF16 };

static inline int64_t min64(int64_t a, int64_t b)
{
	return a < b ? a : b;
}

/* 8 weights of type t at element i of row p, as floats */
ALWAYS_INLINE __m256 load8(const enum ftype t, const void *p, int64_t i)
{
	switch (t) {
	case F_F16:
		return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
	case F_BF16:
		return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(
			_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i))), 16));
	default:
		return _mm256_loadu_ps((const float *)p + i);
	}
}

/* the last n (< 8) elements from i, zero-padded */
ALWAYS_INLINE __m256 load_tail(const enum ftype t, const void *p, int64_t i, int n)
{
	uint8_t buf[32] = { 0 };
	const size_t es = t == F_F32 ? 4 : 2;

	memcpy(buf, (const uint8_t *)p + i * es, (size_t)n * es);
	return load8(t, buf, 0);
}

static void widen(const enum ftype t, const void *x, int64_t k, float *out)
{
	int64_t i = 0;

	for (; i + 8 <= k; i += 8)
		_mm256_storeu_ps(out + i, load8(t, x, i));
	if (i < k) {
		float tmp[8];

		_mm256_storeu_ps(tmp, load_tail(t, x, i, (int)(k - i)));
		memcpy(out + i, tmp, (size_t)(k - i) * sizeof(float));
	}
}

static inline float hsum8(__m256 v)
{
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));

	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	s = _mm_add_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

/* ------------------------------------------------------------------------ */
/* direct                                                                   */

ALWAYS_INLINE void ftile(const enum ftype t, const int NC, int64_t k, const uint8_t *const *wr,
			 const float *const *xc, float *y, size_t ys, int nr)
{
	__m256 acc[FR][FC];
	int64_t i = 0;

	for (int r = 0; r < FR; r++)
		for (int c = 0; c < NC; c++)
			acc[r][c] = _mm256_setzero_ps();
	for (; i + 8 <= k; i += 8) {
		__m256 xv[FC];

		for (int c = 0; c < NC; c++)
			xv[c] = _mm256_loadu_ps(xc[c] + i);
#pragma GCC unroll 4
		for (int r = 0; r < FR; r++) {
			const __m256 wv = load8(t, wr[r], i);

			for (int c = 0; c < NC; c++)
				acc[r][c] = _mm256_fmadd_ps(wv, xv[c], acc[r][c]);
		}
	}
	if (i < k) {
		__m256 xv[FC];

		for (int c = 0; c < NC; c++)
			xv[c] = load_tail(F_F32, xc[c], i, (int)(k - i));
		for (int r = 0; r < FR; r++) {
			const __m256 wv = load_tail(t, wr[r], i, (int)(k - i));

			for (int c = 0; c < NC; c++)
				acc[r][c] = _mm256_fmadd_ps(wv, xv[c], acc[r][c]);
		}
	}
	for (int c = 0; c < NC; c++)
		for (int r = 0; r < nr; r++)
			y[(size_t)c * ys + r] = hsum8(acc[r][c]);
}

ALWAYS_INLINE void fdirect_run(const enum ftype t, const int NC, int64_t k, const uint8_t *w,
			       size_t ws, int64_t nrows, const float *const *xc, float *y,
			       size_t ys)
{
	for (int64_t r0 = 0; r0 < nrows; r0 += FR) {
		const uint8_t *wr[FR];

		for (int r = 0; r < FR; r++)
			wr[r] = w + (size_t)min64(r0 + r, nrows - 1) * ws;
		ftile(t, NC, k, wr, xc, y + r0, ys, (int)min64(FR, nrows - r0));
	}
}

static void fdirect(const enum ftype t, int64_t k, const uint8_t *w, size_t ws, int64_t nrows,
		    const float *const *xc, int nc, float *y, size_t ys)
{
	switch (t * FC + nc - 1) {
#define CASE(T, N) case T * FC + N - 1: fdirect_run(T, N, k, w, ws, nrows, xc, y, ys); break;
	CASE(F_F32, 1) CASE(F_F32, 2)
	CASE(F_F16, 1) CASE(F_F16, 2)
	CASE(F_BF16, 1) CASE(F_BF16, 2)
#undef CASE
	}
}

/* ------------------------------------------------------------------------ */
/* packed                                                                   */

/* in-register transpose of 8 rows of 8 floats */
ALWAYS_INLINE void tr8x8(__m256 r[8])
{
	__m256 t[8], u[8];

	for (int i = 0; i < 4; i++) {
		t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
		t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
	}
	/* u[4q + j], 128-bit lane l: rows 4q..4q+3 of column 4l + j */
	for (int q = 0; q < 2; q++) {
		u[4 * q + 0] = _mm256_shuffle_ps(t[4 * q], t[4 * q + 2], 0x44);
		u[4 * q + 1] = _mm256_shuffle_ps(t[4 * q], t[4 * q + 2], 0xEE);
		u[4 * q + 2] = _mm256_shuffle_ps(t[4 * q + 1], t[4 * q + 3], 0x44);
		u[4 * q + 3] = _mm256_shuffle_ps(t[4 * q + 1], t[4 * q + 3], 0xEE);
	}
	for (int j = 0; j < 4; j++) {
		r[j] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x20);     /* column j */
		r[4 + j] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x31); /* column 4 + j */
	}
}

/* panel chunk: kc (<= KC) steps of [16 floats: rows r0..r0+15] */
ALWAYS_INLINE void fpack(const enum ftype t, const uint8_t *const *rp, int64_t k0, int kc,
			 float *dst)
{
	for (int g = 0; g < 2; g++) {
		for (int i = 0; i < kc; i += 8) {
			const int n = kc - i < 8 ? kc - i : 8;
			__m256 r[8];

			for (int j = 0; j < 8; j++)
				r[j] = n == 8 ? load8(t, rp[8 * g + j], k0 + i)
					      : load_tail(t, rp[8 * g + j], k0 + i, n);
			tr8x8(r);
			for (int j = 0; j < n; j++)
				_mm256_store_ps(dst + (size_t)(i + j) * PR + 8 * g, r[j]);
		}
	}
}

ALWAYS_INLINE void fmk(const int NC, const float *p, int kc, const float *const *xc, float *const *y,
		       int nr, int first)
{
	__m256 acc[2][PNC];

	for (int c = 0; c < NC; c++)
		acc[0][c] = acc[1][c] = _mm256_setzero_ps();
	for (int i = 0; i < kc; i++) {
		const __m256 w0 = _mm256_load_ps(p + (size_t)i * PR);
		const __m256 w1 = _mm256_load_ps(p + (size_t)i * PR + 8);

#pragma GCC unroll 6
		for (int c = 0; c < NC; c++) {
			const __m256 xb = _mm256_broadcast_ss(xc[c] + i);

			acc[0][c] = _mm256_fmadd_ps(w0, xb, acc[0][c]);
			acc[1][c] = _mm256_fmadd_ps(w1, xb, acc[1][c]);
		}
	}
	for (int c = 0; c < NC; c++) {
		float out[16];

		_mm256_storeu_ps(out, acc[0][c]);
		_mm256_storeu_ps(out + 8, acc[1][c]);
		for (int r = 0; r < nr; r++)
			y[c][r] = first ? out[r] : y[c][r] + out[r];
	}
}

static void fmk_any(int nc, const float *p, int kc, const float *const *xc, float *const *y,
		    int nr, int first)
{
	switch (nc) {
#define CASE(N) case N: fmk(N, p, kc, xc, y, nr, first); break;
	CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6)
#undef CASE
	}
}

static int fpacked(const enum ftype t, int64_t k, const uint8_t *w, size_t ws, int64_t nrows,
		   const float *xf, size_t xfs, int64_t ncols, float *y, size_t ys)
{
	float *p = hyb_cpu_scratch(HYB_SCRATCH_W, (size_t)KC * PR * sizeof(float));

	if (!p)
		return -1;
	for (int64_t r0 = 0; r0 < nrows; r0 += PR) {
		const int nr = (int)min64(PR, nrows - r0);
		const uint8_t *rp[PR];

		for (int r = 0; r < PR; r++)
			rp[r] = w + (size_t)min64(r0 + r, nrows - 1) * ws;
		for (int64_t k0 = 0; k0 < k; k0 += KC) {
			const int kc = (int)min64(KC, k - k0);

			switch (t) {
			case F_F16:
				fpack(F_F16, rp, k0, kc, p);
				break;
			case F_BF16:
				fpack(F_BF16, rp, k0, kc, p);
				break;
			default:
				fpack(F_F32, rp, k0, kc, p);
				break;
			}
			for (int64_t c0 = 0; c0 < ncols; c0 += PNC) {
				const int nc = (int)min64(PNC, ncols - c0);
				const float *xc[PNC];
				float *yc[PNC];

				for (int c = 0; c < nc; c++) {
					xc[c] = xf + (size_t)(c0 + c) * xfs + k0;
					yc[c] = y + (size_t)(c0 + c) * ys + r0;
				}
				fmk_any(nc, p, kc, xc, yc, nr, k0 == 0);
			}
		}
	}
	return 0;
}

/* ------------------------------------------------------------------------ */

#define PACKED_MIN_COLS 4

static void fgemm(const enum ftype t, int64_t k, const void *w, size_t w_stride, int64_t nrows,
		  const void *x, size_t x_stride, int64_t ncols, float *y, size_t y_stride,
		  void (*fallback)(HYB_GEMM_ARGS))
{
	const float *xf = x;
	size_t xfs = x_stride / sizeof(float);

	if (hyb_gemm_trivial(k, nrows, ncols, y, y_stride))
		return;

	if (t != F_F32 || x_stride % sizeof(float)) {
		float *buf;

		xfs = ((size_t)k + 7) & ~(size_t)7;
		buf = hyb_cpu_scratch(HYB_SCRATCH_X, xfs * (size_t)ncols * sizeof(float));
		if (!buf) {
			fallback(k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride);
			return;
		}
		for (int64_t c = 0; c < ncols; c++)
			widen(t, (const uint8_t *)x + (size_t)c * x_stride, k, buf + c * xfs);
		xf = buf;
	}
	if (ncols >= PACKED_MIN_COLS &&
	    !fpacked(t, k, w, w_stride, nrows, xf, xfs, ncols, y, y_stride))
		return;
	for (int64_t c0 = 0; c0 < ncols; c0 += FC) {
		const int nc = (int)min64(FC, ncols - c0);
		const float *xc[FC];

		for (int c = 0; c < nc; c++)
			xc[c] = xf + (size_t)(c0 + c) * xfs;
		fdirect(t, k, w, w_stride, nrows, xc, nc, y + (size_t)c0 * y_stride, y_stride);
	}
}

static void gemm_f32(HYB_GEMM_ARGS)
{
	fgemm(F_F32, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride, hyb_gemm_f32_scalar);
}

static void gemm_f16(HYB_GEMM_ARGS)
{
	fgemm(F_F16, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride, hyb_gemm_f16_scalar);
}

static void gemm_bf16(HYB_GEMM_ARGS)
{
	fgemm(F_BF16, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride,
	      hyb_gemm_bf16_scalar);
}

void hyb_fill_f_avx2(struct hyb_cpu_kernels *kt)
{
	hyb_set_gemm(kt, HYB_TYPE_F32, gemm_f32);
	hyb_set_gemm(kt, HYB_TYPE_F16, gemm_f16);
	hyb_set_gemm(kt, HYB_TYPE_BF16, gemm_bf16);
}
