// SPDX-License-Identifier: MIT
/*
 * Predictor kernels (see cpu_kernels.h) with AVX2 + FMA + F16C. Adam stays
 * the plain C one at this level.
 */
#include <immintrin.h>
#include <string.h>

#include "cpu_internal.h"

/*
 * The packed outer-product kernel for NC columns: the panel's 32 rows in
 * four registers per column, X broadcast one element at a time. Partial
 * panels go through an aligned buffer so the loads and stores stay whole.
 */
#define MK256(NC)                                                                        \
	static void mk256_##NC(int64_t K, const float *ap, const float *x, size_t xc,    \
			       size_t xk, float *y, size_t ys, unsigned nr, int acc)     \
	{                                                                                \
		__m256 a[NC][4];                                                         \
		float tmp[HYB_PANEL] __attribute__((aligned(32)));                       \
		for (int c = 0; c < NC; c++) {                                           \
			memset(tmp, 0, sizeof(tmp));                                     \
			if (acc)                                                         \
				memcpy(tmp, y + c * ys, nr * sizeof(float));             \
			for (int q = 0; q < 4; q++)                                      \
				a[c][q] = _mm256_load_ps(tmp + 8 * q);                   \
		}                                                                        \
		for (int64_t k = 0; k < K; k++) {                                        \
			__m256 w[4];                                                     \
			_Pragma("GCC unroll 4") for (int q = 0; q < 4; q++)              \
				w[q] = _mm256_load_ps(ap + k * HYB_PANEL + 8 * q);       \
			_Pragma("GCC unroll 16") for (int c = 0; c < NC; c++)            \
			{                                                                \
				const __m256 xb = _mm256_broadcast_ss(x + k * xk + c * xc); \
				_Pragma("GCC unroll 4") for (int q = 0; q < 4; q++)      \
					a[c][q] = _mm256_fmadd_ps(w[q], xb, a[c][q]);    \
			}                                                                \
		}                                                                        \
		for (int c = 0; c < NC; c++) {                                           \
			for (int q = 0; q < 4; q++)                                      \
				_mm256_store_ps(tmp + 8 * q, a[c][q]);                   \
			memcpy(y + c * ys, tmp, nr * sizeof(float));                     \
		}                                                                        \
	}

MK256(3)
MK256(1)

/* three columns at a time (12 accumulators of 16 registers), then one */
static void panel_gemm(int64_t K, const float *ap, const float *x, size_t xc, size_t xk,
		       float *y, size_t ys, unsigned nr, int acc, int64_t nc)
{
	hyb_panel_columns(mk256_3, 3, mk256_1, K, ap, x, xc, xk, y, ys, nr, acc, nc);
}

/* one hidden unit's row at a time, eight columns per fused multiply-add */
static void fc2_sparse(float *lg, const uint16_t *w, size_t n_out, const float *h,
		       const uint32_t *nz, uint32_t n_nz, long lo, long hi)
{
	long c;

	for (uint32_t q = 0; q < n_nz; q++) {
		const uint32_t u = nz[q];
		const uint16_t *wu = w + (size_t)u * n_out;
		const __m256 v = _mm256_set1_ps(h[u]);

		for (c = lo; c + 8 <= hi; c += 8) {
			const __m128i wh = _mm_loadu_si128((const __m128i *)(wu + c));
			const __m256 wc = _mm256_cvtph_ps(wh);

			_mm256_storeu_ps(lg + c, _mm256_fmadd_ps(v, wc, _mm256_loadu_ps(lg + c)));
		}
		for (; c < hi; c++)
			lg[c] += h[u] * hyb_f16_to_f32(wu[c]);
	}
}

void hyb_fill_pred_avx2(struct hyb_cpu_kernels *k)
{
	k->panel_gemm = panel_gemm;
	k->fc2_sparse = fc2_sparse;
}
