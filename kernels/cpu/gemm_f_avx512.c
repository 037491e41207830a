// SPDX-License-Identifier: MIT
/*
 * AVX-512 kernels for float weights: F32, F16 (vcvtph2ps) and BF16 (a
 * 16-bit shift: this CPU class has no AVX512_BF16). Activations arrive in
 * the weight's own format and are widened to float once per call.
 *
 * Each output is summed in the order llama.cpp's AVX-512 build sums it, so
 * that the results are its results bit for bit:
 *
 * - tinyBLAS (llamafile sgemm, used for 2+ columns when k % 16 == 0 and the
 *   weight's rows % 4 == 0): one 16-lane accumulator per output over k in
 *   steps of 16, then _mm512_reduce_add_ps. 4 rows x 4 columns per tile.
 * - ggml_vec_dot_{f32,f16,bf16} (one column, or any count when tinyBLAS
 *   declines): F32/F16 four accumulators over steps of 64 added 0+2, 1+3,
 *   then 0+1 before the reduction; BF16 two over steps of 32, each reduced
 *   and added in double. Leftovers as in vec.cpp (F16/BF16 in double; F32
 *   as GCC vectorised its loop, see f32_tail). 4 rows per tile.
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "cpu_internal.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))
#define FR 4 /* tile rows */
#define FC 6 /* tinyBLAS tile columns (its own tile is 4 x 6 too) */
#define SUPER_BYTES (256 * 1024) /* weight rows kept in L2 while all columns pass */

enum ftype { F_F32, F_F16, F_BF16 };

static inline int64_t min64(int64_t a, int64_t b)
{
	return a < b ? a : b;
}

static inline __mmask16 tail_mask(int64_t n)
{
	return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1);
}

/* 16 (or fewer, masked) weights of type t at element i of row p, as floats */
ALWAYS_INLINE __m512 load_w(const enum ftype t, const void *p, int64_t i, __mmask16 m)
{
	switch (t) {
	case F_F16:
		return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i));
	case F_BF16:
		return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(
			_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i)), 16));
	default:
		return _mm512_maskz_loadu_ps(m, (const float *)p + i);
	}
}

static inline float w_at(const enum ftype t, const void *p, int64_t i)
{
	switch (t) {
	case F_F16:
		return _cvtsh_ss(((const uint16_t *)p)[i]);
	case F_BF16:
		return hyb_bf16_to_f32(((const uint16_t *)p)[i]);
	default:
		return ((const float *)p)[i];
	}
}

/* widen one activation column to float (exact) */
static void widen(const enum ftype t, const void *x, int64_t k, float *out)
{
	for (int64_t i = 0; i < k; i += 16) {
		const __mmask16 m = tail_mask(k - i);

		_mm512_mask_storeu_ps(out + i, m, load_w(t, x, i, m));
	}
}

/* ------------------------------------------------------------------------ */
/* tinyBLAS                                                                 */

ALWAYS_INLINE void tiny_tile(const enum ftype t, const int NC, int64_t k, const uint8_t *const *wr,
			     const float *const *xc, float *y, size_t ys, int nr)
{
	__m512 acc[FR][FC];
	float out[FR];

	for (int r = 0; r < FR; r++)
		for (int c = 0; c < NC; c++)
			acc[r][c] = _mm512_setzero_ps();
	for (int64_t i = 0; i < k; i += 16) {
		__m512 xv[FC];

		for (int c = 0; c < NC; c++)
			xv[c] = _mm512_loadu_ps(xc[c] + i);
#pragma GCC unroll 4
		for (int r = 0; r < FR; r++) {
			const __m512 wv = load_w(t, wr[r], i, 0xFFFF);

#pragma GCC unroll 6
			for (int c = 0; c < NC; c++)
				acc[r][c] = _mm512_fmadd_ps(wv, xv[c], acc[r][c]);
		}
	}
	/* unrolled: constant indices keep acc in registers through the loop above */
#pragma GCC unroll 6
	for (int c = 0; c < NC; c++) {
#pragma GCC unroll 4
		for (int r = 0; r < FR; r++)
			out[r] = _mm512_reduce_add_ps(acc[r][c]);
		memcpy(y + (size_t)c * ys, out, (size_t)nr * sizeof(float));
	}
}

ALWAYS_INLINE void tiny_run(const enum ftype t, const int NC, int64_t k, const uint8_t *w,
			    size_t ws, int64_t nrows, const float *const *xc, float *y, size_t ys)
{
	for (int64_t r0 = 0; r0 < nrows; r0 += FR) {
		const uint8_t *wr[FR];

		/* a short last tile repeats its last row rather than reading past it */
		for (int r = 0; r < FR; r++)
			wr[r] = w + (size_t)min64(r0 + r, nrows - 1) * ws;
		tiny_tile(t, NC, k, wr, xc, y + r0, ys, (int)min64(FR, nrows - r0));
	}
}

static void tiny_any(const enum ftype t, int64_t k, const uint8_t *w, size_t ws, int64_t nrows,
		     const float *const *xc, int nc, float *y, size_t ys)
{
	switch (t * FC + nc - 1) {
#define CASE(T, N) case T * FC + N - 1: tiny_run(T, N, k, w, ws, nrows, xc, y, ys); break;
	CASE(F_F32, 1) CASE(F_F32, 2) CASE(F_F32, 3) CASE(F_F32, 4) CASE(F_F32, 5) CASE(F_F32, 6)
	CASE(F_F16, 1) CASE(F_F16, 2) CASE(F_F16, 3) CASE(F_F16, 4) CASE(F_F16, 5) CASE(F_F16, 6)
	CASE(F_BF16, 1) CASE(F_BF16, 2) CASE(F_BF16, 3) CASE(F_BF16, 4) CASE(F_BF16, 5)
	CASE(F_BF16, 6)
#undef CASE
	}
}

/* ------------------------------------------------------------------------ */
/* ggml_vec_dot_*                                                           */

/*
 * ggml_vec_dot_f32's leftover loop (n % 64 elements) as GCC vectorised it
 * in llama.cpp's build: products of 8, then of 4, rounded and added in
 * order, then the last n % 4 fused.
 */
static float f32_tail(float s, const float *w, const float *x, int64_t i, int64_t n)
{
	int64_t r = n - i;

	for (; r >= 8; r -= 8)
		for (int j = 0; j < 8; j++, i++)
			s = s + w[i] * x[i];
	if (r >= 4) {
		for (int j = 0; j < 4; j++, i++)
			s = s + w[i] * x[i];
		r -= 4;
	}
	for (; r > 0; r--, i++)
		s = fmaf(w[i], x[i], s);
	return s;
}

ALWAYS_INLINE void vdot_tile(const enum ftype t, int64_t k, const uint8_t *const *wr,
			     const float *x, float *y, int nr)
{
	const int A = t == F_BF16 ? 2 : 4; /* accumulators per row */
	const int64_t np = k / (16 * A) * (16 * A);
	__m512 acc[FR][4];

	for (int r = 0; r < FR; r++)
		for (int a = 0; a < A; a++)
			acc[r][a] = _mm512_setzero_ps();
	for (int64_t i = 0; i < np; i += 16 * A) {
		__m512 xv[4];

		for (int a = 0; a < A; a++)
			xv[a] = _mm512_loadu_ps(x + i + 16 * a);
#pragma GCC unroll 4
		for (int r = 0; r < FR; r++)
#pragma GCC unroll 4
			for (int a = 0; a < A; a++)
				acc[r][a] = _mm512_fmadd_ps(load_w(t, wr[r], i + 16 * a, 0xFFFF), xv[a],
							    acc[r][a]);
	}
#pragma GCC unroll 4
	for (int r = 0; r < FR; r++) {
		if (r >= nr)
			break;
		if (t == F_BF16) {
			/* sumf (double) += each accumulator's reduction */
			double s = 0.0;

			s += (double)_mm512_reduce_add_ps(acc[r][0]);
			s += (double)_mm512_reduce_add_ps(acc[r][1]);
			for (int64_t i = np; i < k; i++)
				s += (double)(w_at(t, wr[r], i) * x[i]);
			y[r] = (float)s;
		} else {
			const __m512 s4 = _mm512_add_ps(_mm512_add_ps(acc[r][0], acc[r][2]),
							_mm512_add_ps(acc[r][1], acc[r][3]));

			if (t == F_F32) {
				y[r] = f32_tail(_mm512_reduce_add_ps(s4), (const float *)wr[r], x, np,
						k);
			} else {
				double s = _mm512_reduce_add_ps(s4);

				for (int64_t i = np; i < k; i++)
					s += (double)(w_at(t, wr[r], i) * x[i]);
				y[r] = (float)s;
			}
		}
	}
}

/*
 * Rows shorter than a few KiB: FR consecutive rows are FR interleaved
 * streams inside the same pages, which the hardware prefetcher does not
 * follow (k = 576 F16 rows streamed at 9 GB/s on one core against 24 read
 * one after the other: docs/PERFORMANCE.md). A tile then takes rows i,
 * i + q, i + 2q, i + 3q of the call's rows: FR sequential streams. Each
 * output is summed as before.
 */
#define STREAM_ROW_BYTES 4096 /* rows of a page or more keep consecutive tiles */
#define STREAM_MIN_ROWS 4     /* rows per stream worth the split */

ALWAYS_INLINE void vdot_run(const enum ftype t, int64_t k, const uint8_t *w, size_t ws,
			    int64_t nrows, const float *x, float *y)
{
	const int64_t q = ws < STREAM_ROW_BYTES && nrows >= FR * STREAM_MIN_ROWS ? nrows / FR : 0;

	for (int64_t i = 0; i < q; i++) {
		const uint8_t *wr[FR];
		float out[FR];

		for (int r = 0; r < FR; r++)
			wr[r] = w + (size_t)(r * q + i) * ws;
		vdot_tile(t, k, wr, x, out, FR);
		for (int r = 0; r < FR; r++)
			y[r * q + i] = out[r];
	}
	for (int64_t r0 = q * FR; r0 < nrows; r0 += FR) {
		const uint8_t *wr[FR];

		for (int r = 0; r < FR; r++)
			wr[r] = w + (size_t)min64(r0 + r, nrows - 1) * ws;
		vdot_tile(t, k, wr, x, y + r0, (int)min64(FR, nrows - r0));
	}
}

static void vdot_any(const enum ftype t, int64_t k, const uint8_t *w, size_t ws, int64_t nrows,
		     const float *x, float *y)
{
	switch (t) {
	case F_F16:
		vdot_run(F_F16, k, w, ws, nrows, x, y);
		break;
	case F_BF16:
		vdot_run(F_BF16, k, w, ws, nrows, x, y);
		break;
	default:
		vdot_run(F_F32, k, w, ws, nrows, x, y);
		break;
	}
}

/* ------------------------------------------------------------------------ */

/* tiny: the weight's row count allows tinyBLAS (rows % 4 == 0) */
static void fgemm(const enum ftype t, int tiny, int64_t k, const void *w, size_t w_stride,
		  int64_t nrows, const void *x, size_t x_stride, int64_t ncols, float *y,
		  size_t y_stride, void (*fallback)(HYB_GEMM_ARGS))
{
	const float *xf = x;
	size_t xfs = x_stride / sizeof(float);

	if (hyb_gemm_trivial(k, nrows, ncols, y, y_stride))
		return;
	if (t != F_F32 || x_stride % sizeof(float)) {
		/* activations widened to float once per call, 64-byte aligned columns */
		float *buf;

		xfs = ((size_t)k + 15) & ~(size_t)15;
		buf = hyb_cpu_scratch(HYB_SCRATCH_X, xfs * (size_t)ncols * sizeof(float));
		if (!buf) {
			fallback(k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride);
			return;
		}
		for (int64_t c = 0; c < ncols; c++)
			widen(t, (const uint8_t *)x + (size_t)c * x_stride, k, buf + c * xfs);
		xf = buf;
	}
	if (tiny && ncols >= 2 && k % 16 == 0) {
		/* rows in super-tiles that stay in L2 while every column group passes */
		int64_t rs = w_stride ? (int64_t)(SUPER_BYTES / w_stride) / FR * FR : nrows;

		if (rs < FR)
			rs = FR;
		for (int64_t r0 = 0; r0 < nrows; r0 += rs) {
			const int64_t nr = min64(rs, nrows - r0);

			for (int64_t c0 = 0; c0 < ncols; c0 += FC) {
				const int nc = (int)min64(FC, ncols - c0);
				const float *xc[FC];

				for (int c = 0; c < nc; c++)
					xc[c] = xf + (size_t)(c0 + c) * xfs;
				tiny_any(t, k, (const uint8_t *)w + (size_t)r0 * w_stride, w_stride, nr,
					 xc, nc, y + (size_t)c0 * y_stride + r0, y_stride);
			}
		}
		return;
	}
	for (int64_t c = 0; c < ncols; c++)
		vdot_any(t, k, w, w_stride, nrows, xf + (size_t)c * xfs, y + (size_t)c * y_stride);
}

#define FGEMM(name, T, TINY, FB)                                                          \
	static void name(HYB_GEMM_ARGS)                                                   \
	{                                                                                 \
		fgemm(T, TINY, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride, FB); \
	}
FGEMM(gemm_f32, F_F32, 1, hyb_gemm_f32_scalar)
FGEMM(gemm_f16, F_F16, 1, hyb_gemm_f16_scalar)
FGEMM(gemm_bf16, F_BF16, 1, hyb_gemm_bf16_scalar)
FGEMM(gemm_f32_m1, F_F32, 0, hyb_gemm_f32_scalar)
FGEMM(gemm_f16_m1, F_F16, 0, hyb_gemm_f16_scalar)
FGEMM(gemm_bf16_m1, F_BF16, 0, hyb_gemm_bf16_scalar)

void hyb_fill_f_avx512(struct hyb_cpu_kernels *kt)
{
	hyb_set_gemm(kt, HYB_TYPE_F32, gemm_f32);
	hyb_set_gemm(kt, HYB_TYPE_F16, gemm_f16);
	hyb_set_gemm(kt, HYB_TYPE_BF16, gemm_bf16);
	kt->gemm_m1[HYB_TYPE_F32] = gemm_f32_m1;
	kt->gemm_m1[HYB_TYPE_F16] = gemm_f16_m1;
	kt->gemm_m1[HYB_TYPE_BF16] = gemm_bf16_m1;
}
