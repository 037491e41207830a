// SPDX-License-Identifier: MIT
/*
 * Activation predictors at decode time (PowerInfer 5.1): per layer an MLP
 * with one hidden layer, logit = fc2 · relu(fc1 · x + b1) + b2, a neuron
 * predicted active when its logit is > 0 (the plan folds the threshold into
 * fc2.bias). The planner trains them (plan/predictor_train.c) and the plan
 * stores them in F16 (hyb/plan.h). fc1 runs on the CPU kernels' F16 GEMV,
 * fc2 on their fc2_sparse, over the hidden units the ReLU left nonzero.
 * A PowerInfer file's predictors run as its llama.cpp runs them (the end).
 */
#include <stdatomic.h>
#include <string.h>

#include "cpu_kernels.h"
#include "hyb/model.h"
#include "hyb/plan.h"
#include "hyb/tensor_type.h"
#include "hyb/threadpool.h"
#include "sparse_layer.h"

/* ---- parallel GEMM: y[c*ys + r] = W[r] · X[c] ---------------------------- */

#define CHUNK_ROWS 32

struct gemm_job {
	hyb_gemm_fn fn;
	int64_t k;
	const char *w;
	size_t w_stride;
	int64_t rows;
	const void *x;
	size_t x_stride;
	int64_t cols;
	float *y;
	size_t ys;
	atomic_long next;
};

static void gemm_worker(void *arg, int ith, int nth)
{
	struct gemm_job *j = arg;
	(void)ith;
	(void)nth;

	for (;;) {
		long c = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
		int64_t r0 = (int64_t)c * CHUNK_ROWS, nr;

		if (r0 >= j->rows)
			return;
		nr = j->rows - r0 < CHUNK_ROWS ? j->rows - r0 : CHUNK_ROWS;
		j->fn(j->k, j->w + (size_t)r0 * j->w_stride, j->w_stride, nr, j->x, j->x_stride,
		      j->cols, j->y + r0, j->ys);
	}
}

static void gemm(struct hyb_threadpool *pool, hyb_gemm_fn fn, size_t elem, int64_t k, const void *w,
		 int64_t rows, const void *x, int64_t cols, float *y, size_t ys)
{
	struct gemm_job j = { .fn = fn, .k = k, .w = w, .w_stride = (size_t)k * elem,
			      .rows = rows, .x = x, .x_stride = (size_t)k * elem, .cols = cols,
			      .y = y, .ys = ys };

	atomic_init(&j.next, 0);
	if (pool && rows > CHUNK_ROWS)
		hyb_threadpool_run(pool, gemm_worker, &j);
	else
		gemm_worker(&j, 0, 1);
}

/* ---- decode-time inference -------------------------------------------------- */

#define ALIGN64(n) (((n) + 63) & ~(size_t)63)

/*
 * Scratch: x in F16, h, the indices of h's nonzero units, logits. fc2 is
 * stored transposed (plan.h): the logits are b2 plus h_j times row j of fc2
 * for each hidden unit the ReLU left nonzero, so about half of fc2 is never
 * read, and every row read is one contiguous stream.
 */
size_t hyb_predictor_scratch_bytes(const struct hyb_predictor *p)
{
	return ALIGN64((size_t)p->n_in * 2) + ALIGN64((size_t)p->hidden * 4) +
	       ALIGN64((size_t)p->hidden * 4) + ALIGN64((size_t)p->n_out * 4) + 64;
}

struct fc2_job {
	const struct hyb_cpu_kernels *k;
	const struct hyb_predictor *p;
	const float *h;
	const uint32_t *nz;   /* hidden units with h > 0 */
	uint32_t n_nz;
	float *lg;
};

static void fc2_worker(void *arg, int ith, int nth)
{
	const struct fc2_job *j = arg;
	long lo, hi;

	/* column slices of whole cache lines per thread */
	hyb_split((long)(j->p->n_out + 15) / 16, ith, nth, &lo, &hi);
	lo *= 16;
	hi = hi * 16 < (long)j->p->n_out ? hi * 16 : (long)j->p->n_out;
	if (lo >= hi)
		return;
	memcpy(j->lg + lo, j->p->fc2_b + lo, sizeof(float) * (size_t)(hi - lo));
	j->k->fc2_sparse(j->lg, j->p->fc2_w, j->p->n_out, j->h, j->nz, j->n_nz, lo, hi);
}

uint32_t hyb_predictor_run(const struct hyb_predictor *p, const float *x, struct hyb_threadpool *pool,
			   void *scratch, float *logits, uint32_t *active)
{
	const struct hyb_cpu_kernels *k = hyb_cpu_best();
	char *s = (char *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
	uint16_t *xh = (uint16_t *)s;
	float *h = (float *)(s + ALIGN64((size_t)p->n_in * 2));
	uint32_t *nz = (uint32_t *)((char *)h + ALIGN64((size_t)p->hidden * 4));
	float *lg = logits ? logits : (float *)((char *)nz + ALIGN64((size_t)p->hidden * 4));
	struct fc2_job j = { .k = k, .p = p, .h = h, .nz = nz, .lg = lg };
	uint32_t n = 0;

	k->quantize_act[HYB_TYPE_F16](x, xh, p->n_in);
	gemm(pool, hyb_gemm_pick(k, HYB_TYPE_F16, p->hidden), 2, p->n_in, p->fc1_w, p->hidden, xh,
	     1, h, p->hidden);
	for (uint32_t u = 0; u < p->hidden; u++) {
		float v = h[u] + p->fc1_b[u];

		h[u] = v > 0 ? v : 0;
		if (v > 0)
			nz[j.n_nz++] = u;
	}
	if (pool && p->n_out >= 4096)
		hyb_threadpool_run(pool, fc2_worker, &j);
	else
		fc2_worker(&j, 0, 1);
	for (uint32_t r = 0; r < p->n_out; r++)
		if (lg[r] > 0)
			active[n++] = r;
	return n;
}

/* ---- a PowerInfer file's predictor, as its llama.cpp runs it ----------------- */

/* y[r] = W[r] · xq for rows [0, rows) of w (x already in w's dot type) */
static void gemv(struct hyb_threadpool *pool, const struct hyb_weight *w, const void *xq,
		 size_t xq_bytes, float *y)
{
	struct gemm_job j = { .fn = hyb_gemm_pick(hyb_cpu_best(), w->type, w->ne1),
			      .k = (int64_t)w->ne0, .w = w->data, .w_stride = w->row_bytes,
			      .rows = (int64_t)w->ne1, .x = xq, .x_stride = xq_bytes, .cols = 1,
			      .y = y, .ys = w->ne1 };

	atomic_init(&j.next, 0);
	if (pool && j.rows > CHUNK_ROWS)
		hyb_threadpool_run(pool, gemm_worker, &j);
	else
		gemm_worker(&j, 0, 1);
}

size_t hyb_pi_predictor_scratch_bytes(const struct hyb_weight *fc1, const struct hyb_weight *fc2)
{
	return ALIGN64(hyb_row_bytes(hyb_vec_dot_type(fc1->type), fc1->ne0)) +
	       ALIGN64(fc1->ne1 * 4) +
	       ALIGN64(hyb_row_bytes(hyb_vec_dot_type(fc2->type), fc2->ne0)) +
	       ALIGN64(fc2->ne1 * 4) + 64;
}

/*
 * score = fc2 · relu(fc1 · x), each product as ggml's mul_mat computes it:
 * its input converted to the weight's dot type first (F16 weights: x and
 * the hidden activation rounded to F16), the dot per row. Neuron i is
 * active when score_i >= threshold (ggml skips score < threshold).
 */
uint32_t hyb_pi_predictor_run(const struct hyb_weight *fc1, const struct hyb_weight *fc2,
			      float threshold, const float *x, struct hyb_threadpool *pool,
			      void *scratch, uint32_t *active)
{
	const struct hyb_cpu_kernels *k = hyb_cpu_best();
	const uint32_t t1 = hyb_vec_dot_type(fc1->type), t2 = hyb_vec_dot_type(fc2->type);
	const size_t b1 = hyb_row_bytes(t1, fc1->ne0), b2 = hyb_row_bytes(t2, fc2->ne0);
	char *s = (char *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
	void *xq = s;
	float *h = (float *)(s + ALIGN64(b1));
	void *hq = (char *)h + ALIGN64(fc1->ne1 * 4);
	float *score = (float *)((char *)hq + ALIGN64(b2));
	uint32_t n = 0;

	k->quantize_act[t1](x, xq, (int64_t)fc1->ne0);
	gemv(pool, fc1, xq, b1, h);
	for (uint64_t u = 0; u < fc1->ne1; u++)
		h[u] = h[u] > 0 ? h[u] : 0;
	k->quantize_act[t2](h, hq, (int64_t)fc2->ne0);
	gemv(pool, fc2, hq, b2, score);
	for (uint32_t i = 0; i < fc2->ne1; i++)
		if (score[i] >= threshold)
			active[n++] = i;
	return n;
}
