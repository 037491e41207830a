// SPDX-License-Identifier: MIT
/*
 * Predictor kernels (see cpu_kernels.h) in plain C: separate multiplies and
 * adds, for CPUs without AVX2 and as the reference the SIMD levels are
 * checked against (within rounding: they fuse the multiply-adds).
 */
#include <math.h>
#include <string.h>

#include "cpu_internal.h"

/* the panel's outputs one column at a time, every k in order */
static void panel_gemm(int64_t K, const float *ap, const float *x, size_t xc, size_t xk,
		       float *y, size_t ys, unsigned nr, int acc, int64_t nc)
{
	for (int64_t c = 0; c < nc; c++) {
		float s[HYB_PANEL];

		for (unsigned i = 0; i < HYB_PANEL; i++)
			s[i] = acc && i < nr ? y[c * ys + i] : 0.0f;
		for (int64_t k = 0; k < K; k++) {
			const float xv = x[k * xk + c * xc];

			for (unsigned i = 0; i < HYB_PANEL; i++)
				s[i] += ap[k * HYB_PANEL + i] * xv;
		}
		memcpy(y + c * ys, s, nr * sizeof(float));
	}
}

static void fc2_sparse(float *lg, const uint16_t *w, size_t n_out, const float *h,
		       const uint32_t *nz, uint32_t n_nz, long lo, long hi)
{
	for (uint32_t q = 0; q < n_nz; q++) {
		const uint32_t u = nz[q];
		const uint16_t *wu = w + (size_t)u * n_out;

		for (long c = lo; c < hi; c++)
			lg[c] += h[u] * hyb_f16_to_f32(wu[c]);
	}
}

static void adam(float *w, const float *g, float *m, float *v, long lo, long hi, float lr,
		 float c1, float c2)
{
	for (long i = lo; i < hi; i++) {
		const float gi = g[i];

		m[i] = 0.9f * m[i] + 0.1f * gi;
		v[i] = 0.999f * v[i] + 0.001f * gi * gi;
		w[i] -= lr * (m[i] * c1) / (sqrtf(v[i] * c2) + 1e-8f);
	}
}

void hyb_fill_pred_ref(struct hyb_cpu_kernels *k)
{
	k->panel_gemm = panel_gemm;
	k->fc2_sparse = fc2_sparse;
	k->adam = adam;
}
