// SPDX-License-Identifier: MIT
/* CPU rooflines (hyb/roofline.h): the kernel table's peak and GEMM ceiling. */
#include <stdlib.h>

#include "cpu_kernels.h"
#include "hyb/generate.h"
#include "hyb/model.h"
#include "hyb/roofline.h"
#include "hyb/tensor_type.h"
#include "hyb/threadpool.h"

const char *hyb_roofline_isa(void)
{
	return hyb_cpu_best()->name;
}

double hyb_roofline_peak_macs(uint32_t weight_type)
{
	return hyb_cpu_peak_macs(hyb_cpu_best(), weight_type);
}

struct gemm_job {
	const struct hyb_cpu_kernels *k;
	const struct hyb_weight *w;
	const void *xq;
	size_t xq_stride;
	int n_cols;
	float *y;
};

static void gemm_worker(void *arg, int ith, int nth)
{
	struct gemm_job *j = arg;
	long lo, hi;

	hyb_split((long)(j->w->ne1 / 16), ith, nth, &lo, &hi);
	lo *= 16;
	hi = ith == nth - 1 ? (long)j->w->ne1 : hi * 16;
	j->k->gemm[j->w->type]((int64_t)j->w->ne0, (const char *)j->w->data + lo * j->w->row_bytes,
			       j->w->row_bytes, hi - lo, j->xq, j->xq_stride, j->n_cols,
			       j->y + lo, j->w->ne1);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

double hyb_roofline_gemm_macs(const struct hyb_weight *w, int nth, int n_cols, int reps)
{
	const struct hyb_cpu_kernels *k = hyb_cpu_best();
	uint32_t vt = hyb_vec_dot_type(w->type);
	size_t stride = hyb_row_bytes(vt, w->ne0);
	float *x = malloc(sizeof(float) * w->ne0), *y = malloc(sizeof(float) * w->ne1 * n_cols);
	char *xq = malloc(stride * n_cols);
	struct hyb_threadpool *pool = hyb_threadpool_new(nth);
	double *t = calloc(reps, sizeof(double)), macs = -1;

	if (x && y && xq && pool && t) {
		for (int c = 0; c < n_cols; c++) {
			for (uint64_t i = 0; i < w->ne0; i++)
				x[i] = (float)((i * 7 + c * 13) % 17) / 8.0f - 1.0f;
			k->quantize_act[vt](x, xq + c * stride, (int64_t)w->ne0);
		}
		struct gemm_job j = { .k = k, .w = w, .xq = xq, .xq_stride = stride,
				      .n_cols = n_cols, .y = y };

		hyb_threadpool_run(pool, gemm_worker, &j);	/* warm-up */
		for (int r = 0; r < reps; r++) {
			double t0 = hyb_now();

			hyb_threadpool_run(pool, gemm_worker, &j);
			t[r] = hyb_now() - t0;
		}
		qsort(t, reps, sizeof(double), cmp_double);
		macs = (double)w->ne0 * w->ne1 * n_cols /
		       (reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]));
	}
	if (pool)
		hyb_threadpool_free(pool);
	free(x);
	free(y);
	free(xq);
	free(t);
	return macs;
}
