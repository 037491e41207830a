// SPDX-License-Identifier: MIT
/*
 * The dense llama forward pass on the CPU.
 *
 * Per layer: RMSNorm -> Q,K,V (one parallel job over all three matrices) ->
 * RoPE -> KV cache (F16) -> causal attention (parallel over token x head) ->
 * output projection -> RMSNorm -> gate,up (one job) -> activation -> down.
 * A batch of prompt tokens goes through each weight once as a GEMM; decode
 * is the same code with n == 1.
 *
 * Numerics follow llama.cpp's CPU path: activations are converted to the
 * weight type's dot-product format (F16, Q8_0, Q8_K, ...) before each
 * matmul, the KV cache is F16, and attention is its flash-attention loop
 * (the default on CPU).
 */
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "forward_internal.h"
#include "attention.h"
#include "attention_mla.h"
#include "moe.h"
#include "ops.h"
#include "hybrid/decode.h"
#include "hybrid/ffn_hybrid.h"
#include "hybrid/moe_hybrid.h"
#include "hybrid/plain_hybrid.h"
#include "model/model_stream.h"
#include "sparse/plan_ffn.h"
#include "sparse/sparse_layer.h"
#include "sparse/teal.h"
#include "util/error.h"

#define MAX_MATS 3
/* weight rows a column-group pass keeps in L2 while the groups go by */
#define INV_SUB_BYTES (192 * 1024)

/* ---- matmul: Y_i = W_i · X for up to three weights sharing X ---------- */

struct matmul_job {
	const struct hyb_cpu_kernels *k;
	const struct hyb_weight *w[MAX_MATS];
	float *y[MAX_MATS];
	int nw;
	const void *xq;
	size_t xq_stride;
	uint32_t n;
	uint64_t chunk_rows;
	uint64_t chunks[MAX_MATS]; /* per weight */
	uint64_t total_chunks;
	const uint32_t *seg[MAX_MATS]; /* (first column, columns) per kernel call (segments()) */
	uint32_t n_seg[MAX_MATS];      /* 0: every column in one call */
	atomic_ullong next;
};

/*
 * Threads take row chunks from a shared counter: contiguous rows stream well
 * and a thread that the OS delays does not hold the others up (the job runs
 * on hyb_threadpool_run_dynamic: a worker that has not started when the
 * caller runs out of chunks is not waited for).
 */
static void matmul_worker(void *arg, int ith, int nth)
{
	struct matmul_job *j = arg;
	(void)ith;
	(void)nth;

	for (;;) {
		uint64_t c = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
		int i = 0;

		if (c >= j->total_chunks)
			return;
		while (c >= j->chunks[i])
			c -= j->chunks[i++];
		const struct hyb_weight *w = j->w[i];
		uint64_t r0 = c * j->chunk_rows;
		uint64_t nr = w->ne1 - r0 < j->chunk_rows ? w->ne1 - r0 : j->chunk_rows;

		/* llama.cpp's summation order depends on the whole weight's rows */
		const uint64_t rows = w->fused_rows ? w->fused_rows : w->ne1;
		const hyb_gemm_fn fn = w->flat ? hyb_gemm_pick_flat(j->k, w->type, rows)
					       : hyb_gemm_pick(j->k, w->type, rows);

		const char *wr = (const char *)w->data + r0 * w->row_bytes;

		if (!j->n_seg[i]) {
			fn((int64_t)w->ne0, wr, w->row_bytes, (int64_t)nr, j->xq, j->xq_stride, j->n,
			   j->y[i] + r0, w->ne1);
			continue;
		}
		/* batch invariance: column segments, over rows in L2-sized blocks */
		uint64_t sub = (INV_SUB_BYTES / w->row_bytes) & ~15ull;

		sub = sub < 16 ? 16 : sub;
		for (uint64_t b = 0; b < nr; b += sub)
			for (uint32_t q = 0; q < j->n_seg[i]; q++) {
				const uint32_t c0 = j->seg[i][2 * q], nc = j->seg[i][2 * q + 1];

				fn((int64_t)w->ne0, wr + b * w->row_bytes, w->row_bytes,
				   (int64_t)(nr - b < sub ? nr - b : sub),
				   (const char *)j->xq + (size_t)c0 * j->xq_stride, j->xq_stride, nc,
				   j->y[i] + (size_t)c0 * w->ne1 + r0 + b, w->ne1);
			}
	}
}

/*
 * Batch invariance (hyb_ctx_params.batch_variant false): the kernel calls
 * that give every column of a pass the sums it would get in a pass of its
 * sequence alone. A run of several tokens (a prompt piece) is one call, as
 * alone; single tokens are grouped up to g columns, g being how many columns
 * the kernel sums exactly as one (hyb_gemm_invariant_cols; 0: any, and
 * then the whole pass is one call). Returns the segment count, 0: one call.
 */
static uint32_t segments(const struct hyb_ctx *c, const struct hyb_weight *w, uint32_t n,
			 uint32_t *seg)
{
	const uint32_t g = hyb_gemm_invariant_cols(c->k, w->type,
						   w->fused_rows ? w->fused_rows : w->ne1, w->flat);
	uint32_t ns = 0, c0 = 0;
	bool singles = false; /* the last segment groups single tokens */

	if (!c->invariant || !c->cols || !g)
		return 0;
	for (uint32_t r = 0; r < c->n_cols; r++) {
		const uint32_t len = c->cols[r];

		if (len == 1 && singles && seg[2 * ns - 1] < g) {
			seg[2 * ns - 1]++;
		} else {
			seg[2 * ns] = c0;
			seg[2 * ns + 1] = len;
			ns++;
			singles = len == 1;
		}
		c0 += len;
	}
	return c0 == n ? ns : 0;
}

struct quant_job {
	const struct hyb_cpu_kernels *k;
	uint32_t vtype;
	const float *x;
	uint64_t ne;       /* elements per token */
	uint32_t n;
	void *out;
	size_t out_stride;
};

static void quant_worker(void *arg, int ith, int nth)
{
	struct quant_job *j = arg;
	long lo, hi;

	hyb_split(j->n, ith, nth, &lo, &hi);
	for (long t = lo; t < hi; t++)
		j->k->quantize_act[j->vtype](j->x + t * j->ne, (char *)j->out + t * j->out_stride,
					     (int64_t)j->ne);
}

/* Convert n rows of x (ne each) to the dot type of `type` into c->xq. */
static void convert_input(struct hyb_ctx *c, uint32_t type, const float *x, uint64_t ne,
			  uint32_t n)
{
	struct quant_job q = {
		.k = c->k, .vtype = hyb_vec_dot_type(type), .x = x, .ne = ne, .n = n,
		.out = c->xq, .out_stride = hyb_row_bytes(hyb_vec_dot_type(type), ne),
	};

	c->xq_stride = q.out_stride;
	if (n == 1 || hyb_threadpool_size(c->pool) == 1)
		quant_worker(&q, 0, 1);
	else
		hyb_threadpool_run(c->pool, quant_worker, &q);
}

/* Y_i[n][ne1_i] = W_i · X[n][ne0] for weights of the same input and type family. */
static void matmul(struct hyb_ctx *c, const float *x, uint32_t n, int nw,
		   const struct hyb_weight *const *w, float *const *y)
{
	struct matmul_job j = { .k = c->k, .nw = nw, .n = n };
	int nth = hyb_threadpool_size(c->pool);
	uint64_t rows = 0;

	/* One conversion serves every weight when their dot types agree (they do
	 * in every file llama.cpp writes; mixed types fall back to one job each). */
	for (int i = 1; i < nw; i++) {
		if (hyb_vec_dot_type(w[i]->type) != hyb_vec_dot_type(w[0]->type)) {
			for (int k = 0; k < nw; k++)
				matmul(c, x, n, 1, &w[k], &y[k]);
			return;
		}
	}
	convert_input(c, w[0]->type, x, w[0]->ne0, n);
	j.xq = c->xq;
	j.xq_stride = c->xq_stride;
	for (int i = 0; i < nw; i++) {
		j.w[i] = w[i];
		j.y[i] = y[i];
		rows += w[i]->ne1;
		if (n > 1) {
			j.seg[i] = c->seg + (size_t)i * 2 * c->n_rows;
			j.n_seg[i] = segments(c, w[i], n, c->seg + (size_t)i * 2 * c->n_rows);
		}
	}
	/* ~8 chunks per thread, multiples of 16 rows (the kernels' row tiles). */
	j.chunk_rows = (rows / ((uint64_t)nth * 8) + 15) & ~15ull;
	if (j.chunk_rows < 16)
		j.chunk_rows = 16;
	for (int i = 0; i < nw; i++) {
		j.chunks[i] = (w[i]->ne1 + j.chunk_rows - 1) / j.chunk_rows;
		j.total_chunks += j.chunks[i];
	}
	atomic_init(&j.next, 0);
	if (nth == 1)
		matmul_worker(&j, 0, 1);
	else
		hyb_threadpool_run_dynamic(c->pool, matmul_worker, &j);
}

void hyb_fwd_matmul(struct hyb_ctx *c, const float *x, uint32_t n, int nw,
		    const struct hyb_weight *const *w, float *const *y)
{
	matmul(c, x, n, nw, w, y);
}

/* ---- TEAL: input-sparse projections (docs/SPARSITY.md#teal) ------------ */

/*
 * The input x[n][ne] of layer l's projection group `in`: shown to the
 * calibration probe, then thresholded. Returns the transposed matrix that
 * computes one token's projections; otherwise x is masked in place for the
 * dense kernels (the same function) and NULL returned.
 */
static const struct hyb_teal_mat *teal_input(struct hyb_ctx *c, uint32_t l, uint32_t in, float *x,
					     uint32_t n, uint32_t ne)
{
	const size_t at = (size_t)l * HYB_TEAL_INPUTS + in;

	if (c->in_probe)
		c->in_probe(c->in_probe_user, l, in, n, x, ne);
	if (!c->teal_thr)
		return NULL;
	if (n == 1 && c->teal)
		return &c->teal->mat[at];
	hyb_teal_mask(x, (uint64_t)n * ne, c->teal_thr[at]);
	return NULL;
}

static void teal_count(struct hyb_ctx *c, uint32_t l, uint32_t in,
		       const struct hyb_teal_mat *t, uint32_t act)
{
	const uint64_t row = hyb_row_bytes(t->type, t->n_out);
	struct hyb_teal_stats *st[2] = {
		&c->teal_st,
		c->teal_layer_st ? &c->teal_layer_st[(size_t)l * HYB_TEAL_INPUTS + in] : NULL,
	};

	for (int i = 0; i < 2 && st[i]; i++) {
		st[i]->inputs += t->n_in;
		st[i]->active += act;
		st[i]->bytes += act * row;
		st[i]->dense_bytes += t->n_in * row;
	}
}

/* Rows r0.. (n, at most HYB_TEAL_ROWS) of y as one-token steps compute them. */
static void teal_rows(struct hyb_ctx *c, uint32_t l, uint32_t in, const struct hyb_teal_mat *t,
		      const float *x, uint32_t r0, uint32_t n, int nw,
		      const struct hyb_weight *const *w, float *const *y)
{
	uint32_t act[HYB_TEAL_ROWS];

	hyb_teal_gemv_rows(c->pool, t, x + (size_t)r0 * t->n_in, t->n_in, n,
			   c->teal_thr[(size_t)l * HYB_TEAL_INPUTS + in], c->teal_idx, c->teal_val,
			   act, nw == 1 ? y[0] + (size_t)r0 * t->n_out : c->teal_y,
			   t->n_out);
	for (uint32_t r = 0; r < n; r++) {
		size_t off = 0;

		teal_count(c, l, in, t, act[r]);
		for (int i = 0; nw > 1 && i < nw; i++) {
			memcpy(y[i] + (size_t)(r0 + r) * w[i]->ne1,
			       c->teal_y + (size_t)r * t->n_out + off, sizeof(float) * w[i]->ne1);
			off += w[i]->ne1;
		}
	}
}

/*
 * A pass of several sequences (batch.c): its one-token columns (decode
 * steps) get the sums a step of their sequence alone gets, TEAL's GEMV over
 * the transposed rows, which they read together (batch invariance,
 * docs/SERVE.md#teal); with batch_variant they stay in the dense GEMM of the
 * masked inputs, which reuses each weight across the columns. Returns
 * whether no row is left for the GEMM.
 */
static bool teal_singles(struct hyb_ctx *c, uint32_t l, uint32_t in, const float *x, uint32_t n,
			 int nw, const struct hyb_weight *const *w, float *const *y, bool after)
{
	const struct hyb_teal_mat *t;
	uint32_t r = 0, ones = 0;

	if (!c->teal_thr || !c->teal || !c->cols || !c->invariant || n < 2)
		return false;
	t = &c->teal->mat[(size_t)l * HYB_TEAL_INPUTS + in];
	for (uint32_t k = 0; k < c->n_cols; k++)
		ones += c->cols[k] == 1;
	if (!after && ones < n)
		return false; /* prompt pieces too: the GEMM first, then the singles */
	for (uint32_t k = 0; k < c->n_cols; r += c->cols[k++]) {
		uint32_t run = 0;

		while (k + run < c->n_cols && c->cols[k + run] == 1 && run < HYB_TEAL_ROWS)
			run++;
		if (run) {
			teal_rows(c, l, in, t, x, r, run, nw, w, y);
			k += run - 1;
			r += run - 1;
		}
	}
	return true;
}

/* Y_i = W_i · X for the nw weights of input `in` (as matmul), TEAL's way when it applies. */
static void project(struct hyb_ctx *c, uint32_t l, uint32_t in, float *x, uint32_t n, int nw,
		    const struct hyb_weight *const *w, float *const *y)
{
	const struct hyb_teal_mat *t = teal_input(c, l, in, x, n, (uint32_t)w[0]->ne0);
	float *out = nw == 1 ? y[0] : c->teal_y;
	size_t off = 0;

	if (!t) {
		if (!teal_singles(c, l, in, x, n, nw, w, y, false)) {
			matmul(c, x, n, nw, w, y);
			teal_singles(c, l, in, x, n, nw, w, y, true);
		}
		return;
	}
	teal_count(c, l, in, t, hyb_teal_gemv(c->pool, t, x,
					      c->teal_thr[(size_t)l * HYB_TEAL_INPUTS + in],
					      c->teal_idx, c->teal_val, out));
	for (int i = 0; nw > 1 && i < nw; i++) {
		memcpy(y[i], out + off, sizeof(float) * w[i]->ne1);
		off += w[i]->ne1;
	}
}

/* ---- attention --------------------------------------------------------- */

struct attn_job {
	struct hyb_ctx *c;
	const struct hyb_attn *a;   /* one per run */
	uint32_t n_a;
	long n_jobs, per_claim;
	atomic_long next;
};

/*
 * Jobs (token x head, or tiles) are independent: threads claim them as they
 * go; job numbers run through the runs in order.
 */
static void attn_worker(void *arg, int ith, int nth)
{
	struct attn_job *j = arg;
	void *tmp = (char *)j->c->attn_tmp + (size_t)ith * j->c->attn_tmp_stride;

	(void)nth;
	for (;;) {
		long lo = atomic_fetch_add_explicit(&j->next, j->per_claim, memory_order_relaxed);
		long hi = lo + j->per_claim < j->n_jobs ? lo + j->per_claim : j->n_jobs;

		if (lo >= j->n_jobs)
			return;
		long base = 0;

		for (uint32_t r = 0; r < j->n_a && lo < hi; r++) {
			const long nr = hyb_attend_jobs(&j->a[r]);

			if (lo < base + nr) {
				const long e = hi < base + nr ? hi : base + nr;

				hyb_attend_run(&j->a[r], lo - base, e - base, tmp);
				lo = e;
			}
			base += nr;
		}
	}
}

static void attend_all(struct hyb_ctx *c, const struct hyb_attn *a, uint32_t n_a)
{
	struct attn_job j = { .c = c, .a = a, .n_a = n_a };
	const int nth = hyb_threadpool_size(c->pool);

	for (uint32_t r = 0; r < n_a; r++)
		j.n_jobs += hyb_attend_jobs(&a[r]);
	/* about 4 claims per thread */
	j.per_claim = (j.n_jobs + 4 * nth - 1) / (4 * nth);
	atomic_init(&j.next, 0);
	hyb_threadpool_run_dynamic(c->pool, attn_worker, &j);
}

void hyb_fwd_attend(struct hyb_ctx *c, const struct hyb_attn *a)
{
	attend_all(c, a, 1);
}

const struct hyb_fwd_run *hyb_fwd_runs(const struct hyb_ctx *c, uint32_t n,
				       struct hyb_fwd_run *one, uint32_t *n_runs)
{
	if (c->runs) {
		*n_runs = c->n_runs;
		return c->runs;
	}
	*one = (struct hyb_fwd_run){ .t0 = 0, .n = n, .pos = c->n_past };
	*n_runs = 1;
	return one;
}

void hyb_fwd_attend_runs(struct hyb_ctx *c, const struct hyb_attn *a, uint32_t n)
{
	struct hyb_fwd_run one;
	uint32_t nr;
	const struct hyb_fwd_run *r = hyb_fwd_runs(c, n, &one, &nr);
	struct hyb_attn single, *as = nr == 1 ? &single : c->attn_runs;
	const size_t os = a->out_stride ? a->out_stride : a->q_stride;

	for (uint32_t i = 0; i < nr; i++) {
		as[i] = *a;
		as[i].q = a->q + (size_t)r[i].t0 * a->q_stride;
		as[i].out = a->out + (size_t)r[i].t0 * os;
		as[i].n_tokens = r[i].n;
		as[i].n_past = r[i].pos;
		as[i].blocks = r[i].blocks;
	}
	attend_all(c, as, nr);
}

/* The attention of layer l for a pass of n tokens, in llama.cpp's arithmetic. */
static void attend(struct hyb_ctx *c, uint32_t l, uint32_t n)
{
	const struct hyb_hparams *hp = &c->m->hp;
	const bool swa = c->m->layers[l].swa;
	const struct hyb_attn a = {
		.k = c->k, .q = c->q, .out = c->att,
		.kc = c->kcache + (size_t)l * c->kv_rows * c->kv_dim,
		.vc = c->vcache + (size_t)l * c->kv_rows * c->kv_dim,
		.q_stride = c->q_dim, .kv_stride = c->kv_dim,
		.out_stride = c->q_dim, .v_stride = c->kv_dim,
		.hd = hp->head_dim, .hd_v = hp->head_dim,
		.n_head = hp->n_head, .n_head_kv = hp->n_head_kv,
		.n_ctx = c->n_ctx,
		.n_split = hyb_threadpool_size(c->pool),
		/* a q scaled beforehand (Gemma) is attended with scale 1 */
		.scale = hp->q_scale ? 1.0f : 1.0f / sqrtf((float)hp->head_dim),
		.n_swa = swa ? hp->n_swa : 0,
		.sinks = c->m->layers[l].attn_sinks,
		.ggml23 = c->m->powerinfer,
	};

	hyb_fwd_attend_runs(c, &a, n);
}

/* ---- the layer loop ---------------------------------------------------- */

static void store_kv(struct hyb_ctx *c, uint32_t layer, uint32_t n)
{
	uint16_t *kc = c->kcache + (size_t)layer * c->kv_rows * c->kv_dim;
	uint16_t *vc = c->vcache + (size_t)layer * c->kv_rows * c->kv_dim;
	struct hyb_fwd_run one;
	uint32_t nr;
	const struct hyb_fwd_run *r = hyb_fwd_runs(c, n, &one, &nr);

	for (uint32_t i = 0; i < nr; i++)
		for (uint32_t t = 0; t < r[i].n; t++) {
			const size_t row = hyb_kv_row(r[i].blocks, r[i].pos + t);
			const size_t src = (size_t)(r[i].t0 + t) * c->kv_dim;

			c->k->quantize_act[HYB_TYPE_F16](c->kk + src, kc + row * c->kv_dim,
							 c->kv_dim);
			c->k->quantize_act[HYB_TYPE_F16](c->vv + src, vc + row * c->kv_dim,
							 c->kv_dim);
		}
}

void hyb_fwd_embed(struct hyb_ctx *c, const int32_t *tokens, uint32_t n)
{
	const struct hyb_weight *e = &c->m->tok_embd;

	for (uint32_t t = 0; t < n; t++)
		c->k->dequantize[e->type]((const char *)e->data + (uint64_t)tokens[t] * e->row_bytes,
					  c->x + (size_t)t * e->ne0, (int64_t)e->ne0);
	if (c->m->hp.embd_scale) /* ggml_scale */
		for (size_t i = 0; i < (size_t)n * e->ne0; i++)
			c->x[i] *= c->m->hp.embd_scale;
}

/* y[t][i] += b[i] for n rows of d (ggml_add of a bias) */
static void add_bias(float *y, const float *b, uint32_t n, size_t d)
{
	for (uint32_t t = 0; b && t < n; t++)
		for (size_t i = 0; i < d; i++)
			y[t * d + i] += b[i];
}

/*
 * RMS norm of each head_dim slice of n rows of heads heads, in place (Q/K
 * norms); a weight as wide as the row norms the row as a whole (OLMoE).
 */
static void norm_heads(float *x, const struct hyb_weight *w, uint32_t n, uint32_t heads,
		       uint32_t hd, float eps)
{
	if (w->data && heads > 1 && w->ne0 == (uint64_t)heads * hd) {
		hd *= heads;
		heads = 1;
	}
	for (size_t h = 0; w->data && h < (size_t)n * heads; h++)
		hyb_rmsnorm(x + h * hd, x + h * hd, w->data, hd, eps);
}

/* The norm some architectures put on a block's output before the residual add. */
void hyb_fwd_post_norm(struct hyb_ctx *c, const struct hyb_weight *w, float *y, uint32_t n)
{
	const uint32_t E = c->m->hp.n_embd;

	for (uint32_t t = 0; w->data && t < n; t++)
		hyb_rmsnorm(y + (size_t)t * E, y + (size_t)t * E, w->data, E, c->m->hp.rms_eps);
}

void hyb_fwd_attention_core(struct hyb_ctx *c, uint32_t l, uint32_t n)
{
	const struct hyb_hparams *hp = &c->m->hp;
	const struct hyb_layer *L = &c->m->layers[l];
	struct hyb_rope rope = L->swa ? hp->rope_swa : hp->rope;

	if (hp->rope_short) /* LongRoPE: long factors for a context past the trained one */
		rope.freq_factors = c->n_ctx > hp->n_ctx_orig ? hp->rope_long : hp->rope_short;
	struct hyb_fwd_run one;
	uint32_t nr;
	const struct hyb_fwd_run *r = hyb_fwd_runs(c, n, &one, &nr);

	for (uint32_t i = 0; i < nr; i++)
		for (uint32_t t = r[i].t0; t < r[i].t0 + r[i].n; t++) {
			float cs[512], sn[512];

			hyb_rope_table(&rope, hp->n_rot, r[i].pos + t - r[i].t0, cs, sn);
			hyb_rope_apply(c->q + (size_t)t * c->q_dim, hp->n_head, hp->head_dim,
				       hp->n_rot, hp->rope_neox, cs, sn);
			hyb_rope_apply(c->kk + (size_t)t * c->kv_dim, hp->n_head_kv, hp->head_dim,
				       hp->n_rot, hp->rope_neox, cs, sn);
		}
	if (hp->q_scale)
		for (uint32_t i = 0; i < nr; i++)
			for (size_t e = (size_t)r[i].t0 * c->q_dim;
			     e < (size_t)(r[i].t0 + r[i].n) * c->q_dim; e++)
				c->q[e] *= hp->q_scale;
	store_kv(c, l, n);
	attend(c, l, n);
}

void hyb_fwd_attention(struct hyb_ctx *c, uint32_t l, uint32_t n)
{
	const struct hyb_hparams *hp = &c->m->hp;
	const struct hyb_layer *L = &c->m->layers[l];
	const struct hyb_weight *qkv[3] = { &L->wq, &L->wk, &L->wv };
	float *qkv_out[3] = { c->q, c->kk, c->vv };
	const struct hyb_weight *wo = &L->wo;
	const uint32_t E = hp->n_embd;

	for (uint32_t t = 0; t < n; t++)
		hyb_rmsnorm(c->xn + (size_t)t * E, c->x + (size_t)t * E, L->attn_norm.data, E,
			    hp->rms_eps);
	project(c, l, HYB_TEAL_QKV, c->xn, n, 3, qkv, qkv_out);
	add_bias(c->q, L->bq, n, c->q_dim);
	add_bias(c->kk, L->bk, n, c->kv_dim);
	add_bias(c->vv, L->bv, n, c->kv_dim);
	norm_heads(c->q, &L->q_norm, n, hp->n_head, hp->head_dim, hp->rms_eps);
	norm_heads(c->kk, &L->k_norm, n, hp->n_head_kv, hp->head_dim, hp->rms_eps);
	hyb_fwd_attention_core(c, l, n);
	project(c, l, HYB_TEAL_O, c->att, n, 1, &wo, &c->xn);
	add_bias(c->xn, L->bo, n, E);
	hyb_fwd_post_norm(c, &L->post_attn_norm, c->xn, n);
	for (size_t i = 0; i < (size_t)n * E; i++)
		c->x[i] += c->xn[i];
}

void hyb_fwd_ffn_norm(struct hyb_ctx *c, uint32_t l, const float *x, uint32_t nf)
{
	const struct hyb_hparams *hp = &c->m->hp;
	const uint32_t E = hp->n_embd;

	for (uint32_t t = 0; t < nf; t++)
		hyb_rmsnorm(c->xn + (size_t)t * E, x + (size_t)t * E, c->m->layers[l].ffn_norm.data,
			    E, hp->rms_eps);
}

/* The probe's view for calibration: act(gate) alone (hyb_ctx_set_ffn_probe_gate). */
static void probe_gate(struct hyb_ctx *c, uint32_t l, uint32_t nf)
{
	const struct hyb_hparams *hp = &c->m->hp;
	const size_t n = (size_t)nf * hp->n_ff;
	float *a = malloc(sizeof(float) * n);

	if (!a)
		return; /* the collector sees this batch missing: it counts tokens per layer */
	for (size_t i = 0; i < n; i++)
		a[i] = hyb_act_gate(hp->act, c->g[i]);
	c->probe(c->probe_user, l, c->n_past, nf, c->x, a);
	free(a);
}

void hyb_fwd_ffn_dense(struct hyb_ctx *c, uint32_t l, uint32_t nf)
{
	hyb_fwd_ffn_dense_skip(c, l, nf, NULL);
}

void hyb_fwd_ffn_dense_skip(struct hyb_ctx *c, uint32_t l, uint32_t nf, const uint8_t *skip)
{
	hyb_fwd_ffn_dense_rows(c, l, nf, skip, NULL);
}

void hyb_fwd_ffn_dense_rows(struct hyb_ctx *c, uint32_t l, uint32_t nf, const uint8_t *skip,
			    const uint8_t *need)
{
	const struct hyb_model *m = c->m;
	const struct hyb_hparams *hp = &m->hp;
	const struct hyb_layer *L = &m->layers[l];
	const struct hyb_weight *gu[2] = { &L->gate, &L->up };
	float *gu_out[2] = { c->g, c->u };
	const struct hyb_weight *down = &L->down;

	const float thr = c->ffn_thr ? c->ffn_thr[l] : 0.0f;

	if (m->group_size) {
		convert_input(c, L->plan.bundles.type, c->xn, hp->n_embd, nf);
		hyb_ffn_plan_dense(c->k, c->pool, c->plan, m, L, c->xq, c->xq_stride, nf, skip,
				   need, thr, c->xn);
		return;
	}
	project(c, l, HYB_TEAL_GU, c->xn, nf, 2, gu, gu_out);
	if (c->probe && c->probe_gate)
		probe_gate(c, l, nf);
	hyb_ffn_act_cats(c->g, c->u, (uint64_t)nf * hp->n_ff, hp->act, thr);
	if (c->probe && !c->probe_gate)
		c->probe(c->probe_user, l, c->n_past, nf, c->x, c->g);
	if (L->down_t.data)
		hyb_ffn_down_t(c->pool, c->plan, &L->down_t, c->g, nf, c->xn);
	else
		project(c, l, HYB_TEAL_DOWN, c->g, nf, 1, &down, &c->xn);
}

void hyb_fwd_head(struct hyb_ctx *c, uint32_t first, uint32_t n, float *logits)
{
	const struct hyb_hparams *hp = &c->m->hp;
	const struct hyb_weight *out = &c->m->output;
	const uint32_t E = hp->n_embd;

	for (uint32_t t = first; t < n; t++)
		hyb_rmsnorm(c->xn + (size_t)(t - first) * E, c->x + (size_t)t * E,
			    c->m->out_norm.data, E, hp->rms_eps);
	matmul(c, c->xn, n - first, 1, &out, &logits);
}

/*
 * A pass of several sequences through a plan's FFN on the CPU (batch.c):
 * each row of a one-token run (a decode step) through the sparse operator,
 * as that sequence alone decodes; the rows of prompt pieces dense, as a
 * prompt alone runs, in one GEMM whose rows take only their own neurons
 * (need), so that no row's sums depend on the others'.
 */
static int plan_rows_ffn(struct hyb_ctx *c, uint32_t l, float *xf, uint32_t nf, char *err,
			 size_t errlen)
{
	const uint32_t E = c->m->hp.n_embd, G = c->m->n_groups;
	uint32_t n_one = 0;

	for (uint32_t t = 0; t < nf; t++)
		n_one += c->row_one[t];
	if (n_one < nf) {
		/* the dense pass writes every row: the decode rows' inputs aside */
		for (uint32_t t = 0; t < nf; t++) {
			if (c->row_one[t])
				memcpy(c->ffn_xs + (size_t)t * E, c->xn + (size_t)t * E,
				       sizeof(float) * E);
			memset(c->need + (size_t)t * G, !c->row_one[t], G);
		}
		hyb_fwd_ffn_dense_rows(c, l, nf, NULL, c->need);
	}
	for (uint32_t t = 0; t < nf; t++) {
		const float *in = n_one < nf ? c->ffn_xs + (size_t)t * E : c->xn + (size_t)t * E;

		if (c->row_one[t] &&
		    hyb_ffn_sparse_layer_row(c->sparse, c->pool, l, xf + (size_t)t * E, in,
					     c->xn + (size_t)t * E, c->ffn_prev + (size_t)t * E,
					     err, errlen))
			return -1;
	}
	return 0;
}

/* Layer l's FFN for the nf rows at xf (c->x + row), added to them. */
static int layer_ffn(struct hyb_ctx *c, uint32_t l, float *xf, uint32_t nf, uint32_t n, char *err,
		     size_t errlen)
{
	const struct hyb_hparams *hp = &c->m->hp;
	const uint32_t E = hp->n_embd;
	int rc;

	hyb_fwd_ffn_norm(c, l, xf, nf);
	if (c->moe && l >= hp->n_dense_lead) {
		rc = hyb_fwd_ffn_moe(c, l, nf);
		if (rc) {
			snprintf(err, errlen, "%s", hyb_last_error());
			return rc;
		}
	} else if (c->plain_hybrid && c->kv && hyb_plain_hybrid_ffn_on(c->plain_hybrid, l)) {
		/* several sequences: a plain model's FFN on the device (plain_hybrid.h) */
		rc = hyb_plain_hybrid_ffn_rows(c->plain_hybrid, l, c->xn, nf, c->xn);
		if (rc) {
			snprintf(err, errlen, "%s", hyb_last_error());
			return rc;
		}
	} else if (c->sparse && !c->probe && c->runs && c->row_one) {
		rc = plan_rows_ffn(c, l, xf, nf, err, errlen);
		if (rc)
			return rc;
	} else if (c->sparse && !c->probe && (n == 1 || c->m->powerinfer)) {
		/* PowerInfer's predictors choose every token's neurons, the
		 * prompt's too (a plan's prompt runs dense: hyb/model.h) */
		for (uint32_t t = 0; t < nf; t++)
			if (hyb_ffn_sparse_layer(c->sparse, c->pool, l, xf + (size_t)t * E,
						 c->xn + (size_t)t * E, c->xn + (size_t)t * E, err,
						 errlen))
				return -1;
	} else {
		hyb_fwd_ffn_dense(c, l, nf);
	}
	hyb_fwd_post_norm(c, &c->m->layers[l].post_ffn_norm, c->xn, nf);
	for (size_t i = 0; i < (size_t)nf * E; i++)
		xf[i] += c->xn[i];
	return 0;
}

/* (batch invariance: the segments above) */
void hyb_fwd_gather(struct hyb_ctx *c, const uint32_t *out, uint32_t n_out)
{
	const uint32_t E = c->m->hp.n_embd;

	for (uint32_t i = 0; i < n_out; i++)
		if (out[i] != i) {
			memcpy(c->x + (size_t)i * E, c->x + (size_t)out[i] * E, sizeof(float) * E);
			if (c->row_one) {
				c->row_one[i] = c->row_one[out[i]];
				memcpy(c->ffn_prev + (size_t)i * E, c->ffn_prev + (size_t)out[i] * E,
				       sizeof(float) * E);
			}
		}
	if (c->cols) {
		c->cols = c->ones;
		c->n_cols = n_out;
	}
}

static void layer_attention(struct hyb_ctx *c, uint32_t l, uint32_t n)
{
	if (c->m->hp.kv_lora)
		hyb_fwd_attention_mla(c, l, n);
	else
		hyb_fwd_attention(c, l, n);
}

/*
 * A pass of n tokens (one sequence at c->n_past, or c->runs): embed, the
 * layers, and logits row i for pass row out[i] (i < n_out, rows ascending).
 * llama.cpp drops the rows it returns no logits for before the last layer's
 * FFN (inp_out_ids): that FFN then sees only them and its matmuls add in
 * their one-column order. Same here (and less work), gathered to the front;
 * keep_all: every row goes through every FFN (a probe watches them all).
 */
static int pass(struct hyb_ctx *c, const int32_t *tokens, uint32_t n, const uint32_t *out,
		uint32_t n_out, bool keep_all, float *logits, char *err, size_t errlen)
{
	const struct hyb_hparams *hp = &c->m->hp;
	/* A model still streaming in (model_stream.c): each piece waits for its bytes. */
	int rc = hyb_model_wait_embd(c->m, err, errlen);

	if (rc)
		return rc;
	/* one sequence's rows from n_past on are written: the kept prefix ends there */
	if (!c->runs && c->n_kept > c->n_past)
		c->n_kept = c->n_past;
	/* which rows are decode steps (a plan's sparse FFN on several sequences) */
	for (uint32_t r = 0; c->row_one && c->runs && r < c->n_runs; r++)
		memset(c->row_one + c->runs[r].t0, c->runs[r].n == 1, c->runs[r].n);
	hyb_fwd_embed(c, tokens, n);
	for (uint32_t l = 0; l < hp->n_layer; l++) {
		const bool last = l + 1 == hp->n_layer;

		rc = hyb_model_wait_layer(c->m, l, err, errlen);
		if (rc)
			return rc;
		layer_attention(c, l, n);
		if (last && !keep_all && !n_out)
			return 0; /* prompt pieces that give no logits yet */
		if (last && !keep_all)
			hyb_fwd_gather(c, out, n_out);
		rc = layer_ffn(c, l, c->x, last && !keep_all ? n_out : n, n, err, errlen);
		if (rc)
			return rc;
	}
	rc = hyb_model_wait_head(c->m, err, errlen);
	if (rc)
		return rc;
	if (keep_all)
		hyb_fwd_gather(c, out, n_out);
	hyb_fwd_head(c, 0, n_out, logits);
	return 0;
}

/* ---- single blocks, for calibration (TEAL's allocation) ------------------ */

/* Layer l's attention and FFN over the n rows of c->x, one sequence from position 0. */
static int block(struct hyb_ctx *c, uint32_t l, uint32_t n)
{
	char err[256] = "";
	int rc;

	c->n_past = 0;
	c->n_kept = 0;
	layer_attention(c, l, n);
	rc = layer_ffn(c, l, c->x, n, n, err, sizeof(err));
	if (rc)
		return hyb_error_set(rc == -1 ? -EIO : rc, "%s", err);
	return 0;
}

static int block_check(const struct hyb_ctx *c, uint32_t n)
{
	if (!n || n > c->n_batch || n > c->n_ctx)
		return hyb_error_set(-EINVAL, "%u tokens: a block takes 1 to %u", n,
				     c->n_batch < c->n_ctx ? c->n_batch : c->n_ctx);
	if (c->hybrid || c->runs || c->m->hp.n_expert || c->m->group_size || c->m->powerinfer)
		return hyb_error_set(-EINVAL, "blocks are evaluated on a plain dense model's "
				     "CPU context");
	return hyb_model_wait(c->m); /* a block reads its layer's weights */
}

int hyb_ctx_block_inputs(struct hyb_ctx *c, const int32_t *tokens, uint32_t n, float *x)
{
	const struct hyb_hparams *hp = &c->m->hp;
	const size_t rows = (size_t)n * hp->n_embd;
	float *saved = c->teal_thr;
	int rc = block_check(c, n);

	for (uint32_t i = 0; !rc && i < n; i++)
		if (tokens[i] < 0 || (uint32_t)tokens[i] >= hp->n_vocab)
			rc = hyb_error_set(-EINVAL, "token id %d out of range [0, %u)", tokens[i],
					   hp->n_vocab);
	if (rc)
		return rc;
	c->teal_thr = NULL; /* the dense model's states */
	hyb_fwd_embed(c, tokens, n);
	for (uint32_t l = 0; l < hp->n_layer && !rc; l++) {
		memcpy(x + l * rows, c->x, sizeof(float) * rows);
		rc = block(c, l, n);
	}
	if (!rc)
		memcpy(x + hp->n_layer * rows, c->x, sizeof(float) * rows);
	c->teal_thr = saved;
	c->n_past = 0;
	return rc;
}

int hyb_ctx_eval_block(struct hyb_ctx *c, uint32_t l, const float *x, uint32_t n,
		       const float *teal_thr, float *out)
{
	const struct hyb_hparams *hp = &c->m->hp;
	const size_t rows = (size_t)n * hp->n_embd;
	float *saved = c->teal_thr, *thr = NULL;
	int rc = block_check(c, n);

	if (!rc && l >= hp->n_layer)
		rc = hyb_error_set(-EINVAL, "layer %u of %u", l, hp->n_layer);
	if (!rc && teal_thr) {
		rc = hyb_teal_check(c->m);
		thr = rc ? NULL : calloc((size_t)hp->n_layer * HYB_TEAL_INPUTS, sizeof(float));
		if (!rc && !thr)
			rc = hyb_error_set(-ENOMEM, "out of memory");
		if (thr)
			memcpy(thr + (size_t)l * HYB_TEAL_INPUTS, teal_thr,
			       sizeof(float) * HYB_TEAL_INPUTS);
	}
	if (rc)
		return rc;
	c->teal_thr = thr;
	memcpy(c->x, x, sizeof(float) * rows);
	rc = block(c, l, n);
	if (!rc)
		memcpy(out, c->x, sizeof(float) * rows);
	c->teal_thr = saved;
	c->n_past = 0;
	free(thr);
	return rc;
}

static int eval_batch(struct hyb_ctx *c, const int32_t *tokens, uint32_t n, float *logits,
		      bool all_logits, char *err, size_t errlen)
{
	uint32_t last = n - 1;
	int rc;

	if (c->hybrid && n == 1)
		return hyb_decode_hybrid(c, tokens[0], logits, err, errlen);
	if (c->plain_hybrid) {
		if (n == 1)
			return hyb_plain_decode(c, tokens[0], logits, err, errlen);
		if (hyb_plain_hybrid_prompt_cap(c->plain_hybrid))
			return hyb_plain_prefill(c, tokens, n, logits, all_logits, err, errlen);
		if (hyb_plain_decode_kv_to_host(c, err, errlen))
			return -1;
	}
	if (c->moe_hybrid && hyb_moe_hybrid_dense(c->moe_hybrid)) {
		if (n == 1)
			return hyb_moe_decode_hybrid(c, tokens[0], logits, err, errlen);
		if (hyb_moe_decode_kv_to_host(c, err, errlen))
			return -1;
	}
	if (c->hybrid && hyb_ffn_hybrid_prefill_on_device(c->hybrid))
		return hyb_prefill_hybrid(c, tokens, n, logits, all_logits, err, errlen);
	/* a prompt batch on the CPU alone needs the rows decoded on the device */
	if (c->hybrid && hyb_decode_hybrid_kv_to_host(c, err, errlen))
		return -1;
	/* every token's logits, or only the last token's */
	rc = pass(c, tokens, n, all_logits ? c->rows : &last, all_logits ? n : 1,
		  all_logits || c->probe || c->moe_probe || c->in_probe, logits, err, errlen);
	if (rc)
		return rc;
	c->n_past += n;
	if (c->hybrid)
		hyb_decode_hybrid_kv_host_wrote(c);
	if (c->moe_hybrid)
		hyb_moe_decode_kv_host_wrote(c);
	if (c->plain_hybrid)
		hyb_plain_decode_kv_host_wrote(c);
	return 0;
}

int hyb_fwd_eval_runs(struct hyb_ctx *c, const int32_t *tokens, uint32_t n,
		      const uint32_t *out, uint32_t n_out, float *logits, char *err,
		      size_t errlen)
{
	if (c->hybrid)
		return hyb_decode_hybrid_runs(c, tokens, n, out, n_out, logits, err, errlen);
	return pass(c, tokens, n, out, n_out, false, logits, err, errlen);
}

int hyb_ctx_eval(struct hyb_ctx *c, const int32_t *tokens, uint32_t n, float *logits,
		 bool all_logits)
{
	const uint32_t V = c->m->hp.n_vocab;
	unsigned int since = hyb_error_count();
	char err[1024] = "";
	int rc;

	if (n == 0)
		return hyb_error_set(-EINVAL, "no tokens to evaluate");
	if ((c->hybrid || c->moe_hybrid || c->plain_hybrid) && c->kv)
		return hyb_error_set(-EINVAL, "a hybrid context of several sequences evaluates "
				     "through hyb_ctx_eval_seqs");
	if ((uint64_t)c->n_past + n > c->n_ctx)
		return hyb_error_set(-ENOSPC, "context full: %u + %u tokens exceed n_ctx %u",
				     c->n_past, n, c->n_ctx);
	for (uint32_t i = 0; i < n; i++) {
		if (tokens[i] < 0 || (uint32_t)tokens[i] >= V)
			return hyb_error_set(-EINVAL, "token id %d out of range [0, %u)",
					     tokens[i], V);
	}
	for (uint32_t done = 0; done < n;) {
		uint32_t nb = n - done < c->n_batch ? n - done : c->n_batch;
		float *dst = all_logits ? logits + (size_t)done * V : logits;

		/* Without all_logits each batch writes its last row to the same
		 * place; the final batch's is the one returned. */
		rc = eval_batch(c, tokens + done, nb, dst, all_logits, err, sizeof(err));
		if (rc) {
			/* -1: a step that kept no errno; the device, read or allocation
			 * that failed underneath has one (a fault: -EIO) */
			if (rc == -1)
				rc = hyb_error_cause(since, -EIO);
			return hyb_error_set(rc, "%s", err[0] ? err : "evaluation failed");
		}
		done += nb;
	}
	return 0;
}
