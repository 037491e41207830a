// SPDX-License-Identifier: MIT
/*
 * Dense FFN over a plan's bundles. Each thread takes a fixed share of whole
 * groups (a group is one contiguous bundle: its gate rows, up rows and down
 * columns stored as rows), runs gate and up as a small GEMM over the
 * group's rows, applies the activation, and adds the group's down rows
 * times their activations into the thread's own output rows (the sparse
 * operator's axpy kernel: down is stored transposed in bundles). The thread
 * outputs are summed at the end, in thread order. The shares are static so
 * that every run with the same thread count sums in the same order
 * (docs/DETERMINISM.md).
 */
#include <stdlib.h>
#include <string.h>

#include "plan_ffn.h"
#include "forward/ops.h"
#include "sparse_ffn_kernels.h"

struct thread_scratch {
	float *g, *u;   /* [n_batch][group_size] */
	float *out;     /* [n_batch][n_embd] partial output */
};

struct hyb_ffn_plan_scratch {
	int n_threads;
	uint32_t n_batch;
	size_t bytes;
	struct thread_scratch *t;
};

struct hyb_ffn_plan_scratch *hyb_ffn_plan_scratch_new(const struct hyb_model *m,
						      uint32_t n_batch, int n_threads)
{
	const size_t E = m->hp.n_embd, GS = m->group_size ? m->group_size : 1;
	struct hyb_ffn_plan_scratch *s = calloc(1, sizeof(*s));

	if (!s)
		return NULL;
	s->n_threads = n_threads;
	s->n_batch = n_batch;
	s->t = calloc((size_t)n_threads, sizeof(*s->t));
	if (!s->t)
		goto fail;
	for (int i = 0; i < n_threads; i++) {
		struct thread_scratch *t = &s->t[i];

		t->g = malloc(n_batch * GS * sizeof(float));
		t->u = malloc(n_batch * GS * sizeof(float));
		t->out = malloc(n_batch * E * sizeof(float));
		if (!t->g || !t->u || !t->out)
			goto fail;
		s->bytes += (2 * n_batch * GS + n_batch * E) * sizeof(float);
	}
	return s;
fail:
	hyb_ffn_plan_scratch_free(s);
	return NULL;
}

void hyb_ffn_plan_scratch_free(struct hyb_ffn_plan_scratch *s)
{
	if (!s)
		return;
	for (int i = 0; s->t && i < s->n_threads; i++) {
		free(s->t[i].g);
		free(s->t[i].u);
		free(s->t[i].out);
	}
	free(s->t);
	free(s);
}

struct dense_job {
	const struct hyb_cpu_kernels *k;
	const struct hyb_sparse_kernels *sk;
	struct hyb_ffn_plan_scratch *s;
	const struct hyb_model *m;
	const struct hyb_ffn_plan *P;
	const void *xq;
	size_t xq_stride;
	uint32_t n;
	const uint8_t *skip; /* groups computed elsewhere (NULL: none) */
	const uint8_t *need; /* [n][n_groups] rows that take each group (NULL: all) */
	float thr;           /* CATS threshold (0: none) */
	uint32_t n_run;      /* groups computed here */
};

/*
 * out[tok] += sum over nr rows i of act[tok * act_stride + i] * row i, for n
 * tokens: down stored transposed (a row per neuron). Each slice of rows is
 * run for every token while it is in cache, with the rows whose activation
 * is zero for that token left out: after ReLU (or CATS' threshold) most
 * are, and a batch then reads and multiplies only each token's own firing
 * neurons' rows, as the sparse operator does for one token (PowerInfer 5.1).
 * Which rows go in depends on the token alone, so its sums do not depend
 * on the batch.
 */
static void down_rows(hyb_sparse_axpy_fn axpy, uint32_t E, const char *down, uint64_t row_bytes,
		      uint32_t nr_all, const float *act, size_t act_stride, uint32_t n, float *out)
{
	const void *rows[HYB_SPARSE_MAX_ROWS];
	float h[HYB_SPARSE_MAX_ROWS];

	for (uint32_t i0 = 0; i0 < nr_all; i0 += HYB_SPARSE_MAX_ROWS) {
		const uint32_t nr = nr_all - i0 < HYB_SPARSE_MAX_ROWS ? nr_all - i0
								      : HYB_SPARSE_MAX_ROWS;

		for (uint32_t tok = 0; tok < n; tok++) {
			const float *a = act + tok * act_stride + i0;
			int k = 0;

			for (uint32_t i = 0; i < nr; i++) {
				if (a[i] == 0.0f)
					continue;
				rows[k] = down + (uint64_t)(i0 + i) * row_bytes;
				h[k++] = a[i];
			}
			if (k)
				axpy((int64_t)E, rows, h, k, out + (size_t)tok * E);
		}
	}
}

static void dense_group(const struct dense_job *j, struct thread_scratch *t, uint32_t g)
{
	const struct hyb_model *m = j->m;
	const uint32_t E = m->hp.n_embd, GS = m->group_size, n = j->n;
	const uint32_t first = g * GS, ng = m->hp.n_ff - first < GS ? m->hp.n_ff - first : GS;
	const struct hyb_weight *b = &j->P->bundles;
	const char *gate = (const char *)b->data + 3ull * first * b->row_bytes;
	const char *up = gate + (uint64_t)ng * b->row_bytes;
	const char *down = up + (uint64_t)ng * b->row_bytes;
	hyb_gemm_fn gemm = hyb_gemm_pick(j->k, b->type, ng);

	gemm((int64_t)E, gate, b->row_bytes, ng, j->xq, j->xq_stride, n, t->g, ng);
	gemm((int64_t)E, up, b->row_bytes, ng, j->xq, j->xq_stride, n, t->u, ng);
	hyb_ffn_act_cats(t->g, t->u, (uint64_t)n * ng, m->hp.act, j->thr);
	for (uint32_t tok = 0; j->need && tok < n; tok++)
		if (!j->need[(size_t)tok * m->n_groups + g])
			memset(t->g + (size_t)tok * ng, 0, sizeof(float) * ng);
	down_rows(j->sk->axpy[b->type], E, down, b->row_bytes, ng, t->g, ng, n, t->out);
}

/* Thread ith computes the groups of rank [n_run * ith / nth, n_run * (ith + 1) / nth)
 * among those not skipped. */
/* Group g runs here: not skipped, and some row takes it. */
static bool group_runs(const struct dense_job *j, uint32_t g)
{
	if (j->skip && j->skip[g])
		return false;
	if (!j->need)
		return true;
	for (uint32_t tok = 0; tok < j->n; tok++)
		if (j->need[(size_t)tok * j->m->n_groups + g])
			return true;
	return false;
}

static void dense_worker(void *arg, int ith, int nth)
{
	struct dense_job *j = arg;
	struct thread_scratch *t = &j->s->t[ith];
	const uint32_t lo = (uint32_t)((uint64_t)j->n_run * ith / nth);
	const uint32_t hi = (uint32_t)((uint64_t)j->n_run * (ith + 1) / nth);
	uint32_t rank = 0;

	memset(t->out, 0, (size_t)j->n * j->m->hp.n_embd * sizeof(float));
	for (uint32_t g = 0; g < j->m->n_groups && rank < hi; g++) {
		if (!group_runs(j, g))
			continue;
		if (rank++ >= lo)
			dense_group(j, t, g);
	}
}

/* out = the sum of the first nth threads' partial outputs */
static void sum_outputs(const struct hyb_ffn_plan_scratch *s, int nth, size_t len, float *out)
{
	memcpy(out, s->t[0].out, len * sizeof(float));
	for (int i = 1; i < nth; i++)
		for (size_t e = 0; e < len; e++)
			out[e] += s->t[i].out[e];
}

void hyb_ffn_plan_dense(const struct hyb_cpu_kernels *k, struct hyb_threadpool *pool,
			struct hyb_ffn_plan_scratch *s, const struct hyb_model *m,
			const struct hyb_layer *L, const void *xq, size_t xq_stride, uint32_t n,
			const uint8_t *skip, const uint8_t *need, float thr, float *out)
{
	struct dense_job j = {
		.k = k, .sk = hyb_sparse_best(), .s = s, .m = m, .P = &L->plan,
		.xq = xq, .xq_stride = xq_stride, .n = n, .skip = skip, .need = need, .thr = thr,
	};
	const size_t len = (size_t)n * m->hp.n_embd;
	int nth = hyb_threadpool_size(pool);

	for (uint32_t g = 0; g < m->n_groups; g++)
		j.n_run += group_runs(&j, g);
	if (nth == 1)
		dense_worker(&j, 0, 1);
	else
		hyb_threadpool_run(pool, dense_worker, &j);
	sum_outputs(s, nth, len, out);
}

/* ---- a PowerInfer model's down: ffn_down_t, a row per neuron --------------- */

struct down_t_job {
	hyb_sparse_axpy_fn axpy;
	struct hyb_ffn_plan_scratch *s;
	const struct hyb_weight *w;
	const float *act;
	uint32_t n_ff, n;
};

/* Thread ith adds the rows [n_ff * ith / nth, n_ff * (ith + 1) / nth): a static split,
 * so the sums are the same every run. */
static void down_t_worker(void *arg, int ith, int nth)
{
	struct down_t_job *j = arg;
	float *out = j->s->t[ith].out;
	const uint32_t E = (uint32_t)j->w->ne0;
	const uint32_t i0 = (uint32_t)((uint64_t)j->n_ff * ith / nth);
	const uint32_t i1 = (uint32_t)((uint64_t)j->n_ff * (ith + 1) / nth);

	memset(out, 0, (size_t)j->n * E * sizeof(float));
	down_rows(j->axpy, E, (const char *)j->w->data + (uint64_t)i0 * j->w->row_bytes,
		  j->w->row_bytes, i1 - i0, j->act + i0, j->n_ff, j->n, out);
}

void hyb_ffn_down_t(struct hyb_threadpool *pool, struct hyb_ffn_plan_scratch *s,
		    const struct hyb_weight *down_t, const float *act, uint32_t n, float *out)
{
	struct down_t_job j = {
		.axpy = hyb_sparse_best()->axpy[down_t->type], .s = s, .w = down_t, .act = act,
		.n_ff = (uint32_t)down_t->ne1, .n = n,
	};
	const int nth = hyb_threadpool_size(pool);

	if (nth == 1)
		down_t_worker(&j, 0, 1);
	else
		hyb_threadpool_run(pool, down_t_worker, &j);
	sum_outputs(s, nth, (size_t)n * down_t->ne0, out);
}
