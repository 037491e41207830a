// SPDX-License-Identifier: MIT
/*
 * AVX-512 kernels for float weights: F32, F16 (vcvtph2ps) and BF16 (a
 * 16-bit shift: this CPU class has no AVX512_BF16). Activations arrive in
 * the weight's own format and are widened to float once per call.
 *
 * - direct (ncols < 4): 4 rows x up to 4 columns, 16 k per step, masked
 *   loads for the k tail; any k.
 * - packed: 32 rows transposed into row lanes (16 rows per zmm) in chunks
 *   of KC k, then 24 accumulators = 2 row groups x 12 columns, one
 *   broadcast activation per column and k: 24 FMAs per 2 weight loads.
 */
#include <immintrin.h>
#include <string.h>

#include "cpu_internal.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))
#define FR 4   /* direct tile rows */
#define FC 4   /* direct tile columns */
#define PR 32  /* packed panel rows */
#define PNC 12 /* packed tile columns */
#define KC 128 /* k per packed chunk: 32 x 128 floats = 16 KiB */

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

/* widen one activation column to float */
static void widen(const enum ftype t, const void *x, int64_t k, float *out)
{
	for (int64_t i = 0; i < k; i += 16) {
		const __mmask16 m = tail_mask(k - i);

		_mm512_mask_storeu_ps(out + i, m, load_w(t, x, i, m));
	}
}

/* ------------------------------------------------------------------------ */
/* direct                                                                   */

ALWAYS_INLINE void ftile(const enum ftype t, const int NC, int64_t k, const uint8_t *const *wr,
			 const float *const *xc, float *y, size_t ys, int nr)
{
	__m512 acc[FR][FC];
	float out[16];

	for (int r = 0; r < FR; r++)
		for (int c = 0; c < NC; c++)
			acc[r][c] = _mm512_setzero_ps();
	for (int64_t i = 0; i < k; i += 16) {
		const __mmask16 m = tail_mask(k - i);
		__m512 xv[FC];

		for (int c = 0; c < NC; c++)
			xv[c] = _mm512_maskz_loadu_ps(m, xc[c] + i);
#pragma GCC unroll 4
		for (int r = 0; r < FR; r++) {
			const __m512 wv = load_w(t, wr[r], i, m);

#pragma GCC unroll 4
			for (int c = 0; c < NC; c++)
				acc[r][c] = _mm512_fmadd_ps(wv, xv[c], acc[r][c]);
		}
	}
	for (int c = 0; c < NC; c++) {
		for (int r = 0; r < nr; r++)
			out[r] = _mm512_reduce_add_ps(acc[r][c]);
		memcpy(y + (size_t)c * ys, out, (size_t)nr * sizeof(float));
	}
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
	CASE(F_F32, 1) CASE(F_F32, 2) CASE(F_F32, 3) CASE(F_F32, 4)
	CASE(F_F16, 1) CASE(F_F16, 2) CASE(F_F16, 3) CASE(F_F16, 4)
	CASE(F_BF16, 1) CASE(F_BF16, 2) CASE(F_BF16, 3) CASE(F_BF16, 4)
#undef CASE
	}
}

/* ------------------------------------------------------------------------ */
/* packed                                                                   */

/* in-register transpose of 16 rows of 16 floats */
ALWAYS_INLINE void tr16x16(__m512 r[16])
{
	__m512 t[16], u[16];

	for (int i = 0; i < 8; i++) {
		t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
		t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
	}
	/* per 128-bit lane: 4x4 blocks of rows 4q..4q+3 */
	for (int q = 0; q < 4; q++) {
		u[4 * q + 0] = _mm512_shuffle_ps(t[4 * q], t[4 * q + 2], 0x44);
		u[4 * q + 1] = _mm512_shuffle_ps(t[4 * q], t[4 * q + 2], 0xEE);
		u[4 * q + 2] = _mm512_shuffle_ps(t[4 * q + 1], t[4 * q + 3], 0x44);
		u[4 * q + 3] = _mm512_shuffle_ps(t[4 * q + 1], t[4 * q + 3], 0xEE);
	}
	/*
	 * u[4q + j], 128-bit lane l: rows 4q..4q+3 of column 4l + j. Gather the
	 * four row quads of each column: first pair quads (0,1) and (2,3)...
	 */
	for (int j = 0; j < 4; j++) {
		t[j] = _mm512_shuffle_f32x4(u[j], u[4 + j], 0x88);      /* lanes 0,2 of each */
		t[4 + j] = _mm512_shuffle_f32x4(u[j], u[4 + j], 0xDD);  /* lanes 1,3 */
		t[8 + j] = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0x88);
		t[12 + j] = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0xDD);
	}
	/* ...then join the halves: column 4l + j collects quads 0..3 in order */
	for (int j = 0; j < 4; j++) {
		r[j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88);        /* cols j */
		r[8 + j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0xDD);    /* cols 8 + j */
		r[4 + j] = _mm512_shuffle_f32x4(t[4 + j], t[12 + j], 0x88);   /* cols 4 + j */
		r[12 + j] = _mm512_shuffle_f32x4(t[4 + j], t[12 + j], 0xDD);  /* cols 12 + j */
	}
}

/* panel chunk: kc (<= KC) steps of [32 floats: rows r0..r0+31] */
ALWAYS_INLINE void fpack(const enum ftype t, const uint8_t *const *rp, int64_t k0, int kc,
			 float *dst)
{
	for (int g = 0; g < 2; g++) {
		for (int i = 0; i < kc; i += 16) {
			const __mmask16 m = tail_mask(kc - i);
			__m512 r[16];

			for (int j = 0; j < 16; j++)
				r[j] = load_w(t, rp[16 * g + j], k0 + i, m);
			tr16x16(r);
			for (int j = 0; j < 16 && i + j < kc; j++)
				_mm512_store_ps(dst + (size_t)(i + j) * PR + 16 * g, r[j]);
		}
	}
}

ALWAYS_INLINE void fmk(const int NC, const float *p, int kc, const float *xt,
		       float *const *y, const __mmask16 m[2], int first)
{
	__m512 acc[2][PNC];

	for (int c = 0; c < NC; c++)
		acc[0][c] = acc[1][c] = _mm512_setzero_ps();
	for (int i = 0; i < kc; i++) {
		const __m512 w0 = _mm512_load_ps(p + (size_t)i * PR);
		const __m512 w1 = _mm512_load_ps(p + (size_t)i * PR + 16);

#pragma GCC unroll 12
		for (int c = 0; c < NC; c++) {
			const __m512 xb = _mm512_set1_ps(xt[(size_t)i * PNC + c]);

			acc[0][c] = _mm512_fmadd_ps(w0, xb, acc[0][c]);
			acc[1][c] = _mm512_fmadd_ps(w1, xb, acc[1][c]);
		}
	}
	for (int c = 0; c < NC; c++) {
		for (int g = 0; g < 2; g++) {
			__m512 v = acc[g][c];

			if (!first)
				v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m[g], y[c] + 16 * g));
			_mm512_mask_storeu_ps(y[c] + 16 * g, m[g], v);
		}
	}
}

static void fmk_any(int nc, const float *p, int kc, const float *xt, float *const *y,
		    const __mmask16 m[2], int first)
{
	switch (nc) {
#define CASE(N) case N: fmk(N, p, kc, xt, y, m, first); break;
	CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6)
	CASE(7) CASE(8) CASE(9) CASE(10) CASE(11) CASE(12)
#undef CASE
	}
}

/*
 * Activations of each tile of PNC columns interleaved by k: [k][PNC] floats,
 * so the micro-kernel's broadcasts share one pointer (a dozen column
 * pointers would not stay in registers).
 */
static void xtile(const float *xf, size_t xfs, int64_t k, int64_t c0, int nc, float *out)
{
	for (int64_t i = 0; i < k; i++)
		for (int c = 0; c < PNC; c++)
			out[i * PNC + c] = c < nc ? xf[(size_t)(c0 + c) * xfs + i] : 0.0f;
}

static int fpacked(const enum ftype t, int64_t k, const uint8_t *w, size_t ws, int64_t nrows,
		   const float *xf, size_t xfs, int64_t ncols, float *y, size_t ys)
{
	float *p = hyb_cpu_scratch(HYB_SCRATCH_W, (size_t)KC * PR * sizeof(float));
	const int64_t ntile = (ncols + PNC - 1) / PNC;
	float *xt = hyb_cpu_scratch(HYB_SCRATCH_P, (size_t)ntile * k * PNC * sizeof(float));

	if (!p || !xt)
		return -1;
	for (int64_t tt = 0; tt < ntile; tt++)
		xtile(xf, xfs, k, tt * PNC, (int)min64(PNC, ncols - tt * PNC), xt + tt * k * PNC);
	for (int64_t r0 = 0; r0 < nrows; r0 += PR) {
		const int64_t nr = min64(PR, nrows - r0);
		const __mmask16 m[2] = { tail_mask(nr), tail_mask(nr > 16 ? nr - 16 : 0) };
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
				float *yc[PNC];

				for (int c = 0; c < nc; c++)
					yc[c] = y + (size_t)(c0 + c) * ys + r0;
				fmk_any(nc, p, kc, xt + (c0 / PNC * k + k0) * PNC, yc, m, k0 == 0);
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
	float *buf = NULL;

	if (t != F_F32 || x_stride % sizeof(float)) {
		/* activations widened to float once per call, 64-byte aligned columns */
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

void hyb_fill_f_avx512(struct hyb_cpu_kernels *kt)
{
	kt->gemm[HYB_TYPE_F32] = gemm_f32;
	kt->gemm[HYB_TYPE_F16] = gemm_f16;
	kt->gemm[HYB_TYPE_BF16] = gemm_bf16;
}
