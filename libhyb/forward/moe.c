// SPDX-License-Identifier: MIT
/*
 * A mixture-of-experts FFN on the CPU (docs/MOE.md), in llama.cpp's
 * arithmetic (llm_graph_context::build_moe_ffn and ggml-cpu's mul_mat_id):
 *
 *   router logits -> softmax or sigmoid scores [+ selection bias, expert
 *   groups] -> the n_expert_used best, descending -> their scores as
 *   weights (renormalised, scaled: as the model says) -> per expert, gate
 *   and up over the tokens routed to it -> SwiGLU -> down -> each output
 *   times its weight, summed in rank order [+ shared experts] [a decode
 *   step's lowest-ranked ones a layer later: deferral].
 *
 * The experts run as one work queue over (expert, matrix, row chunk) units,
 * gate and up of every chosen expert in one pass and down in a second:
 * threads take units as they free up, so an expert many tokens chose does
 * not leave the others idle behind a per-expert barrier (KTransformers
 * section 3's dynamic scheduling).
 *
 * llama.cpp sums each output of an expert matrix column by column (vec_dot,
 * or the repacked gemv) except where it tiles K-quants (8+ columns): the
 * same sums here (hyb_moe_max_columns) keep the logits bit-identical to its
 * own.
 */
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "forward_internal.h"
#include "hyb/clock.h"
#include "moe.h"
#include "hybrid/moe_hybrid.h"
#include "ops.h"
#include "util/error.h"

/* weight rows a per-column pass keeps in L2 while its columns go by */
#define SUB_BYTES (192 * 1024)

struct hyb_moe_scratch {
	uint32_t nb;       /* tokens per batch */
	float *logits;     /* [nb][n_expert], then the probabilities */
	float *scores;     /* [n_expert] one token's selection scores (bias, groups) */
	float *plogits;    /* [n_expert] the next layer's router on this layer's input */
	int32_t *psel;     /* [K] the experts it would choose (the expert cache's prefetch) */
	float *pwt;        /* [K] */
	int32_t *sel;      /* [nb][K] chosen experts, by rank */
	float *wt;         /* [nb][K] their weights */
	uint32_t *start;   /* [n_expert + 1] first pair of each expert (expert-major order) */
	uint32_t *fill;    /* [n_expert] */
	uint32_t *active;  /* [n_expert] experts with pairs, ascending */
	uint32_t *tok;     /* [nb * K] token of pair j */
	uint32_t *ex;      /* [nb * K] expert of pair j */
	uint32_t *pos;     /* [nb * K] pair j of (token t, rank k) at t * K + k */
	void *xg;          /* [nb * K] the pairs' inputs in gate's dot type */
	void *xu;          /* ... in up's, when it differs (same_dot) */
	void *hq;          /* [nb * K] activations in down's dot type */
	size_t xg_stride, xu_stride, hq_stride;
	float *h, *u;      /* [nb * K][n_ff_exp] gate (then the activation) and up */
	float *out;        /* [nb * K][n_embd] expert outputs */
	float *sg, *su;    /* [nb][n_ff_shexp] shared expert's gate and up */
	float *so, *sgi;   /* [nb][n_embd] its output, [nb] its gate's logit */
	float *defer;      /* [n_embd] this layer's deferred experts' sum */
	float *pending;    /* [n_embd] the layer before's, due at this one */
	bool deferred;     /* defer holds one */
	/*
	 * Deferral beside the device (expert cache): the deferred experts the
	 * CPU computes wait, with the layer's routing, until the next layer's
	 * attention is on the device (hyb_fwd_moe_deferred); late: pending is
	 * not summed yet; the CPU's share of active[] from d_first, d_n of them.
	 */
	bool late;
	uint32_t d_layer, d_first, d_n, d_ki;
	uint32_t n_layer, n_expert;
	uint64_t *counts;  /* [n_layer][n_expert] times chosen */
	struct hyb_moe_stats stats;
};

static size_t dot_row(uint32_t type, uint64_t n)
{
	return hyb_row_bytes(hyb_vec_dot_type(type), n);
}

struct hyb_moe_scratch *hyb_moe_scratch_new(const struct hyb_model *m, uint32_t nb)
{
	const struct hyb_hparams *hp = &m->hp;
	const struct hyb_layer *L0 = &m->layers[hp->n_dense_lead];
	const size_t X = hp->n_expert, K = hp->n_expert_used, P = (size_t)nb * K;
	const size_t E = hp->n_embd, F = hp->n_ff_exp, S = hp->n_ff_shexp ? hp->n_ff_shexp
					: L0->up_shexp.ne1 * !!L0->up_shexp.data;
	struct hyb_moe_scratch *s = calloc(1, sizeof(*s));
	size_t xg = 0, xu = 0, hq = 0;

	if (!s)
		return NULL;
	s->nb = nb;
	s->n_layer = hp->n_layer;
	s->n_expert = hp->n_expert;
	s->counts = calloc((size_t)hp->n_layer * X, sizeof(uint64_t));
	/* the widest row any layer's types need */
	for (uint32_t l = hp->n_dense_lead; l < hp->n_layer; l++) {
		const struct hyb_layer *L = &m->layers[l];

		if (dot_row(L->gate_exps.type, E) > xg)
			xg = dot_row(L->gate_exps.type, E);
		if (dot_row(L->up_exps.type, E) > xu)
			xu = dot_row(L->up_exps.type, E);
		if (dot_row(L->down_exps.type, F) > hq)
			hq = dot_row(L->down_exps.type, F);
	}
	s->xg_stride = xg;
	s->xu_stride = xu;
	s->hq_stride = hq;
	s->logits = malloc(sizeof(float) * nb * X);
	s->scores = malloc(sizeof(float) * X);
	s->plogits = malloc(sizeof(float) * X);
	s->psel = malloc(sizeof(int32_t) * K);
	s->pwt = malloc(sizeof(float) * K);
	s->defer = malloc(sizeof(float) * E);
	s->pending = malloc(sizeof(float) * E);
	s->sel = malloc(sizeof(int32_t) * P);
	s->wt = malloc(sizeof(float) * P);
	s->start = malloc(sizeof(uint32_t) * (X + 1));
	s->fill = malloc(sizeof(uint32_t) * X);
	s->active = malloc(sizeof(uint32_t) * X);
	s->tok = malloc(sizeof(uint32_t) * P);
	s->ex = malloc(sizeof(uint32_t) * P);
	s->pos = malloc(sizeof(uint32_t) * P);
	s->xg = malloc(xg * P);
	s->xu = malloc(xu * P);
	s->hq = malloc(hq * P);
	s->h = malloc(sizeof(float) * P * F);
	s->u = malloc(sizeof(float) * P * F);
	s->out = malloc(sizeof(float) * P * E);
	if (S) {
		s->sg = malloc(sizeof(float) * nb * S);
		s->su = malloc(sizeof(float) * nb * S);
		s->so = malloc(sizeof(float) * nb * E);
		s->sgi = malloc(sizeof(float) * nb);
	}
	if (!s->counts || !s->logits || !s->scores || !s->plogits || !s->psel || !s->pwt || !s->defer || !s->pending || !s->sel || !s->wt || !s->start || !s->fill || !s->active || !s->tok ||
	    !s->ex || !s->pos || !s->xg || !s->xu || !s->hq || !s->h || !s->u || !s->out ||
	    (S && (!s->sg || !s->su || !s->so || !s->sgi))) {
		hyb_moe_scratch_free(s);
		return NULL;
	}
	return s;
}

void hyb_moe_stats_get(const struct hyb_moe_scratch *s, struct hyb_moe_stats *out)
{
	if (s)
		*out = s->stats;
	else
		memset(out, 0, sizeof(*out));
}

void hyb_moe_stats_reset(struct hyb_moe_scratch *s)
{
	if (!s)
		return;
	memset(&s->stats, 0, sizeof(s->stats));
	memset(s->counts, 0, sizeof(uint64_t) * s->n_layer * s->n_expert);
}

const uint64_t *hyb_moe_counts(const struct hyb_moe_scratch *s, uint32_t layer)
{
	return s && layer < s->n_layer ? s->counts + (size_t)layer * s->n_expert : NULL;
}

void hyb_moe_scratch_free(struct hyb_moe_scratch *s)
{
	if (!s)
		return;
	free(s->counts);
	free(s->logits);
	free(s->scores);
	free(s->plogits);
	free(s->psel);
	free(s->pwt);
	free(s->defer);
	free(s->pending);
	free(s->sel);
	free(s->wt);
	free(s->start);
	free(s->fill);
	free(s->active);
	free(s->tok);
	free(s->ex);
	free(s->pos);
	free(s->xg);
	free(s->xu);
	free(s->hq);
	free(s->h);
	free(s->u);
	free(s->out);
	free(s->sg);
	free(s->su);
	free(s->so);
	free(s->sgi);
	free(s);
}

/* ---- routing ------------------------------------------------------------ */

/* The k best of v[0..n) (-INFINITY: never), best first; ties to the lower index. */
static void top_k(const float *v, uint32_t n, uint32_t k, int32_t *out)
{
	for (uint32_t i = 0; i < k; i++) {
		int32_t best = -1;

		for (uint32_t e = 0; e < n; e++) {
			bool taken = false;

			for (uint32_t q = 0; q < i && !taken; q++)
				taken = out[q] == (int32_t)e;
			if (!taken && (best < 0 || v[e] > v[best]))
				best = (int32_t)e;
		}
		out[i] = best;
	}
}

/*
 * DeepSeek V3's group limit (llm_graph_context::build_moe_ffn): a group's
 * score is the sum of its two best selection scores (ggml_sum_rows: a double
 * sum); the experts of all but the n_group_used best groups are out.
 */
static void limit_groups(const struct hyb_hparams *hp, float *sp)
{
	const uint32_t G = hp->n_expert_groups, per = hp->n_expert / G;
	float score[512];
	int32_t best[512], top2[2];
	bool keep[512] = { false };

	for (uint32_t g = 0; g < G; g++) {
		top_k(sp + g * per, per, 2, top2);
		score[g] = (float)((double)sp[g * per + top2[0]] + (double)sp[g * per + top2[1]]);
	}
	top_k(score, G, hp->n_group_used, best);
	for (uint32_t i = 0; i < hp->n_group_used; i++)
		keep[best[i]] = true;
	for (uint32_t e = 0; e < hp->n_expert; e++)
		if (!keep[e / per])
			sp[e] = -INFINITY;
}

/*
 * Scores: softmax (ggml_soft_max: ggml_v_expf, a double sum, one float
 * scale) or sigmoid (V3); plus the selection bias where the layer has one;
 * the K best, descending (ggml_argsort_top_k; ties, which its unstable sort
 * leaves open, go to the lower expert); their unbiased scores as weights,
 * renormalised and scaled where the model says so.
 */
static int route_into(struct hyb_ctx *c, uint32_t l, uint32_t nf, float *logits,
		      int32_t *sel_out, float *wt_out)
{
	const struct hyb_hparams *hp = &c->m->hp;
	const struct hyb_layer *L = &c->m->layers[l];
	struct hyb_moe_scratch *s = c->moe;
	const uint32_t X = hp->n_expert, K = hp->n_expert_used;

	for (uint32_t t = 0; t < nf; t++) {
		float *p = logits + (size_t)t * X, mx = -INFINITY, *sp = p;
		int32_t *sel = sel_out + (size_t)t * K;
		float *wt = wt_out + (size_t)t * K;

		for (uint32_t e = 0; e < X; e++) {
			if (!isfinite(p[e]))
				return hyb_error_set(-EDOM, "blk.%u.ffn_gate_inp.weight: the router's "
						     "logit for expert %u is %g (weights or input "
						     "not finite)", l, e, (double)p[e]);
			if (L->gate_inp_b) /* ggml_add of the router's bias */
				p[e] += L->gate_inp_b[e];
			mx = p[e] > mx ? p[e] : mx;
		}
		if (hp->expert_softmax_weight) {
			/* gpt-oss: the best logits, then ggml_soft_max over the chosen */
			float mk = -INFINITY;

			top_k(p, X, K, sel);
			for (uint32_t k = 0; k < K; k++) {
				wt[k] = p[sel[k]];
				mk = wt[k] > mk ? wt[k] : mk;
			}
			const float scale = (float)(1.0 / c->k->soft_max(K, wt, wt, mk));

			for (uint32_t k = 0; k < K; k++)
				wt[k] *= scale;
			continue;
		}
		if (hp->expert_sigmoid) {
			for (uint32_t e = 0; e < X; e++)
				p[e] = 1.0f / (1.0f + expf(-p[e]));
		} else {
			const float scale = (float)(1.0 / c->k->soft_max(X, p, p, mx));

			for (uint32_t e = 0; e < X; e++)
				p[e] *= scale;
		}
		if (L->exp_probs_b || hp->n_expert_groups > 1) {
			sp = s->scores;
			for (uint32_t e = 0; e < X; e++)
				sp[e] = L->exp_probs_b ? p[e] + L->exp_probs_b[e] : p[e];
			if (hp->n_expert_groups > 1)
				limit_groups(hp, sp);
		}
		top_k(sp, X, K, sel);
		for (uint32_t k = 0; k < K; k++)
			wt[k] = p[sel[k]];
		if (hp->expert_norm) {
			double sum = 0; /* ggml_sum_rows, clamped to F16's smallest normal */
			float f;

			for (uint32_t k = 0; k < K; k++)
				sum += (double)wt[k];
			f = (float)sum;
			f = f < 6.103515625e-5f ? 6.103515625e-5f : f;
			for (uint32_t k = 0; k < K; k++)
				wt[k] = wt[k] / f;
		}
		if (hp->expert_scale != 0.0f && hp->expert_scale != 1.0f)
			for (uint32_t k = 0; k < K; k++)
				wt[k] *= hp->expert_scale;
	}
	return 0;
}

static int route(struct hyb_ctx *c, uint32_t l, uint32_t nf)
{
	return route_into(c, l, nf, c->moe->logits, c->moe->sel, c->moe->wt);
}

/*
 * HYB_TESTING_CHECK_ROUTERS: the device's logits of a router against the
 * CPU's own (hyb/testing.h). 0, or -EIO naming the layer.
 */
static int check_router(struct hyb_ctx *c, const struct hyb_weight *router, const float *dev,
			uint32_t l, const char *what)
{
	const uint32_t X = c->m->hp.n_expert;
	float *mine = malloc(sizeof(float) * X);
	int rc = 0;

	if (!mine)
		return hyb_error_set(-ENOMEM, "out of memory");
	hyb_fwd_matmul(c, c->xn, 1, 1, &router, &mine);
	if (memcmp(mine, dev, sizeof(float) * X))
		rc = hyb_error_set(-EIO, "blk.%u.ffn_gate_inp.weight: the device's logits (%s) "
				   "differ from the CPU's", l, what);
	free(mine);
	return rc;
}

/*
 * The expert cache's prefetch (KAIROX 5.1's adjacent-layer prediction, at
 * expert granularity): layer l + 1's router on layer l's input, its K
 * choices into psel. Returns how many (0: no next expert layer, or a
 * router that is not finite - then nothing is prefetched); a negative
 * errno when HYB_TESTING_CHECK_ROUTERS finds the device's logits wrong.
 */
static int predict_next(struct hyb_ctx *c, uint32_t l)
{
	const struct hyb_hparams *hp = &c->m->hp;
	struct hyb_moe_scratch *s = c->moe;
	const struct hyb_weight *router;

	if (l + 1 >= hp->n_layer)
		return 0;
	router = &c->m->layers[l + 1].gate_inp;
	/* on the device beside layer l's router where it is there (moe_hybrid.c) */
	if (!hyb_moe_hybrid_router_next_logits(c->moe_hybrid, l, s->plogits))
		hyb_fwd_matmul(c, c->xn, 1, 1, &router, &s->plogits);
	else if (c->check_routers && check_router(c, router, s->plogits, l + 1, "prediction"))
		return -EIO;
	if (route_into(c, l + 1, 1, s->plogits, s->psel, s->pwt))
		return 0; /* layer l + 1 itself reports it */
	uint32_t n = 0;

	for (uint32_t k = 0; k < hp->n_expert_used; k++)
		if (s->psel[k] >= 0) /* group limits can leave fewer than K */
			s->psel[n++] = s->psel[k];
	return (int)n;
}

/* Pairs (token, rank) grouped by expert, tokens ascending within each (mul_mat_id's order). */
static uint32_t group_pairs(struct hyb_moe_scratch *s, uint32_t X, uint32_t K, uint32_t nf)
{
	uint32_t n_active = 0;

	memset(s->fill, 0, sizeof(uint32_t) * X);
	for (uint32_t i = 0; i < nf * K; i++)
		s->fill[s->sel[i]]++;
	s->start[0] = 0;
	for (uint32_t e = 0; e < X; e++) {
		s->start[e + 1] = s->start[e] + s->fill[e];
		if (s->fill[e])
			s->active[n_active++] = e;
		s->fill[e] = s->start[e];
	}
	for (uint32_t t = 0; t < nf; t++)
		for (uint32_t k = 0; k < K; k++) {
			uint32_t j = s->fill[s->sel[t * K + k]]++;

			s->tok[j] = t;
			s->ex[j] = (uint32_t)s->sel[t * K + k];
			s->pos[t * K + k] = j;
		}
	return n_active;
}

/* ---- the experts --------------------------------------------------------- */

/*
 * How many of an expert matrix's columns one kernel call may take and still
 * sum each output as llama.cpp's mul_mat_id (x86) does: it takes each
 * expert's columns one at a time through vec_dot, or through the repacked
 * gemv (Q4_0, Q4_K, IQ4_NL and, on AVX-512, Q2_K with rows % 8 == 0),
 * except the K-quants it tiles at 8+ columns. hyb's kernels sum every output
 * of the 32-element block types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1; IQ4_NL
 * repacked) the same way in a batch of any size, and of the repacked
 * K-quants in batches of up to 3 (llama.cpp's gemv order; from 4 its repacked
 * gemm's); the tiled K-quants' batch order is llama.cpp's own (below 8
 * columns both are vec_dot). tests/unit/test_moe.c holds the kernels to it.
 * Float weights go one at a time (tinyBLAS is not vec_dot). 0: no limit.
 */
uint32_t hyb_moe_max_columns(uint32_t type, uint64_t rows)
{
	switch (type) {
	case HYB_TYPE_Q8_0:
	case HYB_TYPE_Q4_0:
	case HYB_TYPE_Q4_1:
	case HYB_TYPE_Q5_0:
	case HYB_TYPE_Q5_1:
	case HYB_TYPE_Q3_K:
	case HYB_TYPE_Q5_K:
	case HYB_TYPE_Q6_K:
	case HYB_TYPE_IQ4_XS:
	case HYB_TYPE_MXFP4: /* repacked or vec_dot: each column its own chain */
		return 0;
	case HYB_TYPE_IQ4_NL:
		return rows % 8 ? 1 : 0;
	case HYB_TYPE_Q2_K:
	case HYB_TYPE_Q4_K:
		return rows % 8 ? 0 : 3;
	default:
		return 1;
	}
}

/*
 * One pass over chosen experts: units of (expert, matrix, row chunk), in
 * queues by NUMA node. Where hybd split the expert tensors by rows across
 * nodes (docs/NUMA.md), queue q holds the chunks of the rows on node
 * qnode[q]: a thread takes from its own node's queue first and then helps
 * the others, so the rows are read by local threads while no thread idles.
 * Unsplit tensors make one queue (node -1). Which thread computes a unit
 * never changes its bits.
 */
#define MAX_Q HYB_WEIGHT_MAX_PARTS

struct unit_seg {
	int m;             /* matrix */
	uint64_t r0, r1;   /* its rows in this queue (one part) */
	uint32_t n_chunks;
};

struct expert_job {
	uint32_t first;     /* the experts are s->active[first ..] */
	const struct hyb_cpu_kernels *k;
	const struct hyb_moe_scratch *s;
	const struct hyb_threadpool *pool;
	const struct hyb_weight *w[2];
	const void *x[2];
	size_t x_stride[2];
	float *y[2];
	int nw;
	uint64_t chunk;
	uint32_t n_active;
	bool invariant;
	uint32_t nq;
	int32_t qnode[MAX_Q];
	struct unit_seg seg[MAX_Q][2 * MAX_Q];
	uint32_t n_seg[MAX_Q];
	uint32_t per_expert[MAX_Q]; /* units of one expert in queue q */
	uint32_t n_units[MAX_Q];
	atomic_uint next[MAX_Q];
};

/* unit u of queue q: its expert, matrix, first row and rows */
static void unit_of(const struct expert_job *j, uint32_t q, uint32_t u, uint32_t *e, int *m,
		    uint64_t *r0, uint64_t *nr)
{
	uint32_t rem = u % j->per_expert[q], i = 0;

	*e = j->s->active[j->first + u / j->per_expert[q]];
	while (rem >= j->seg[q][i].n_chunks)
		rem -= j->seg[q][i++].n_chunks;
	*m = j->seg[q][i].m;
	*r0 = j->seg[q][i].r0 + rem * j->chunk;
	*nr = j->seg[q][i].r1 - *r0 < j->chunk ? j->seg[q][i].r1 - *r0 : j->chunk;
}

/*
 * The first 16 rows (a GEMV tile) of the unit queue q hands out next, into
 * L2: the kernels prefetch each tile's successor, but nothing the first
 * tile of a unit, which would start on rows still in DRAM (for decode's
 * few columns a unit is one expert's matrix, tens of us).
 */
static void prefetch_unit(const struct expert_job *j, uint32_t q, uint32_t u)
{
	uint32_t e;
	int m;
	uint64_t r0, nr, run;

	if (u >= j->n_units[q])
		return;
	unit_of(j, q, u, &e, &m, &r0, &nr);
	const struct hyb_weight *w = j->w[m];
	const char *p = hyb_weight_rows(w, e, r0, &run);

	nr = nr < 16 ? nr : 16;
	for (uint64_t off = 0; off < nr * w->row_bytes; off += 64)
		__builtin_prefetch(p + off, 0, 2);
}

static void run_unit(const struct expert_job *j, uint32_t q, uint32_t u)
{
	const struct hyb_moe_scratch *s = j->s;
	uint32_t e;
	int m;
	uint64_t r0, nr, run;

	unit_of(j, q, u, &e, &m, &r0, &nr);
	const struct hyb_weight *w = j->w[m];
	const char *wr = hyb_weight_rows(w, e, r0, &run);
	const uint32_t j0 = s->start[e], nj = s->start[e + 1] - j0;
	/* llama.cpp picks its kernel by the whole tensor's rows (fused gate/up) */
	const uint64_t rows = w->fused_rows ? w->fused_rows : w->ne1;
	const hyb_gemm_fn fn = hyb_gemm_pick(j->k, w->type, rows);
	const char *x = (const char *)j->x[m] + (size_t)j0 * j->x_stride[m];
	float *y = j->y[m] + (size_t)j0 * w->ne1 + r0;
	/* batch invariance: columns grouped as the kernel sums them alike (forward.c) */
	const uint32_t mc = j->invariant ? hyb_gemm_invariant_cols(j->k, w->type, rows, false) :
			    hyb_moe_max_columns(w->type, rows);

	if (!mc || mc >= nj) {
		fn((int64_t)w->ne0, wr, w->row_bytes, (int64_t)nr, x, j->x_stride[m], nj, y, w->ne1);
		return;
	}
	/* rows in L2-sized blocks, each block reused by every column */
	uint64_t sub = (SUB_BYTES / w->row_bytes) & ~15ull;

	sub = sub < 16 ? 16 : sub;
	for (uint64_t b = 0; b < nr; b += sub)
		for (uint32_t c = 0; c < nj; c += mc)
			fn((int64_t)w->ne0, wr + b * w->row_bytes, w->row_bytes,
			   (int64_t)(nr - b < sub ? nr - b : sub), x + (size_t)c * j->x_stride[m],
			   j->x_stride[m], nj - c < mc ? nj - c : mc, y + (size_t)c * w->ne1 + b,
			   w->ne1);
}

static void expert_worker(void *arg, int ith, int nth)
{
	struct expert_job *j = arg;
	const int node = j->nq > 1 ? hyb_threadpool_node(j->pool, ith) : -1;
	uint32_t home = (uint32_t)ith % j->nq;

	(void)nth;
	for (uint32_t q = 0; q < j->nq; q++)
		if (j->qnode[q] == node && node >= 0)
			home = q;
	for (uint32_t k = 0; k < j->nq; k++) {
		const uint32_t q = (home + k) % j->nq;

		for (;;) {
			const uint32_t u = atomic_fetch_add_explicit(&j->next[q], 1,
								     memory_order_relaxed);

			if (u >= j->n_units[q])
				break;
			prefetch_unit(j, q, atomic_load_explicit(&j->next[q], memory_order_relaxed));
			run_unit(j, q, u);
		}
	}
}

/* The queue of node nd, added when new. */
static uint32_t queue_of(struct expert_job *j, int32_t nd)
{
	uint32_t q = 0;

	while (q < j->nq && j->qnode[q] != nd)
		q++;
	if (q == j->nq && j->nq < MAX_Q)
		j->qnode[j->nq++] = nd;
	return q < MAX_Q ? q : MAX_Q - 1;
}

static void add_seg(struct expert_job *j, uint32_t q, int m, uint64_t r0, uint64_t r1)
{
	struct unit_seg *g = &j->seg[q][j->n_seg[q]++];

	g->m = m;
	g->r0 = r0;
	g->r1 = r1;
	g->n_chunks = (uint32_t)((r1 - r0 + j->chunk - 1) / j->chunk);
	j->per_expert[q] += g->n_chunks;
}

static void run_experts(struct hyb_ctx *c, uint32_t first, uint32_t n_active, int nw,
			const struct hyb_weight *const *w, const void *const *x,
			const size_t *x_stride, float *const *y)
{
	const int nth = hyb_threadpool_size(c->pool);
	struct expert_job j = { .first = first, .k = c->k, .s = c->moe, .pool = c->pool, .nw = nw,
				.n_active = n_active, .invariant = c->invariant && c->cols };
	const uint64_t rows = w[0]->ne1;

	for (int i = 0; i < nw; i++) {
		j.w[i] = w[i];
		j.x[i] = x[i];
		j.x_stride[i] = x_stride[i];
		j.y[i] = y[i];
	}
	/* ~8 units per thread, chunks a multiple of 16 rows (the kernels' tiles) */
	j.chunk = ((uint64_t)n_active * nw * rows / ((uint64_t)nth * 8) + 15) & ~15ull;
	if (j.chunk < 16)
		j.chunk = 16;
	if (j.chunk > rows)
		j.chunk = rows;
	/* each matrix's rows by the node they lie on (one part: one queue) */
	for (int i = 0; i < nw; i++) {
		const struct hyb_weight_split *sp = w[i]->split;

		if (!sp) {
			add_seg(&j, queue_of(&j, -1), i, 0, w[i]->ne1);
			continue;
		}
		for (uint32_t p = 0; p < sp->n; p++)
			add_seg(&j, queue_of(&j, sp->node[p]), i, sp->row0[p], sp->row0[p + 1]);
	}
	for (uint32_t q = 0; q < j.nq; q++) {
		j.n_units[q] = n_active * j.per_expert[q];
		atomic_init(&j.next[q], 0);
	}
	if (nth == 1)
		expert_worker(&j, 0, 1);
	else
		hyb_threadpool_run_dynamic(c->pool, expert_worker, &j);
}

/* Do gate and up take their input in the same format? (They do in every real file.) */
static bool same_dot(const struct hyb_layer *L)
{
	return hyb_vec_dot_type(L->up_exps.type) == hyb_vec_dot_type(L->gate_exps.type);
}

/* The pairs' inputs in the experts' dot types, and then their activations. */
struct pair_job {
	struct hyb_ctx *c;
	const struct hyb_layer *L;
	const float *xn;
	uint32_t n_pairs;
	int stage; /* 0: inputs, 1: activations */
};

static void pair_worker(void *arg, int ith, int nth)
{
	struct pair_job *pj = arg;
	const struct hyb_cpu_kernels *k = pj->c->k;
	struct hyb_moe_scratch *s = pj->c->moe;
	const struct hyb_layer *L = pj->L;
	const uint64_t E = L->gate_exps.ne0, F = L->gate_exps.ne1;
	long lo, hi;

	hyb_split(pj->n_pairs, ith, nth, &lo, &hi);
	for (long j = lo; j < hi; j++) {
		if (pj->stage == 0) {
			const float *x = pj->xn + (size_t)s->tok[j] * E;

			k->quantize_act[hyb_vec_dot_type(L->gate_exps.type)](
				x, (char *)s->xg + j * s->xg_stride, (int64_t)E);
			if (!same_dot(L))
				k->quantize_act[hyb_vec_dot_type(L->up_exps.type)](
					x, (char *)s->xu + j * s->xu_stride, (int64_t)E);
		} else {
			float *h = s->h + (size_t)j * F, *u = s->u + (size_t)j * F;

			/* gpt-oss: ggml_add_id of the expert's gate and up biases first */
			if (L->gate_exps_b)
				for (uint64_t i = 0; i < F; i++) {
					h[i] += L->gate_exps_b[(size_t)s->ex[j] * F + i];
					u[i] += L->up_exps_b[(size_t)s->ex[j] * F + i];
				}
			/* ggml_swiglu runs row by row: its vector tail is per row */
			hyb_ffn_act(h, u, F, pj->c->m->hp.act == HYB_ACT_SWIGLU_OAI ?
				    HYB_ACT_SWIGLU_OAI : HYB_ACT_SILU);
			k->quantize_act[hyb_vec_dot_type(L->down_exps.type)](
				h, (char *)s->hq + j * s->hq_stride, (int64_t)F);
		}
	}
}

static void run_pairs(struct hyb_ctx *c, const struct hyb_layer *L, const float *xn,
		      uint32_t n_pairs, int stage)
{
	struct pair_job pj = { .c = c, .L = L, .xn = xn, .n_pairs = n_pairs, .stage = stage };

	/* a decode step's few rows cost less than waking the threads */
	if ((uint64_t)n_pairs * L->gate_exps.ne0 < 65536 || hyb_threadpool_size(c->pool) == 1)
		pair_worker(&pj, 0, 1);
	else
		hyb_threadpool_run(c->pool, pair_worker, &pj);
}

/*
 * The shared expert: a dense SwiGLU FFN (or its output from the device:
 * on_dev), scaled by silu(g)/g = sigmoid(g) when gated.
 */
static void shared_expert(struct hyb_ctx *c, const struct hyb_layer *L, uint32_t nf, bool on_dev)
{
	struct hyb_moe_scratch *s = c->moe;
	const struct hyb_weight *gu[2] = { &L->gate_shexp, &L->up_shexp };
	float *gu_out[2] = { s->sg, s->su };
	const struct hyb_weight *down = &L->down_shexp, *gi = &L->gate_inp_shexp;
	const uint64_t S = L->up_shexp.ne1, E = L->down_shexp.ne1;

	if (!on_dev) {
		hyb_fwd_matmul(c, c->xn, nf, 2, gu, gu_out);
		for (uint32_t t = 0; t < nf; t++)
			hyb_ffn_act(s->sg + (size_t)t * S, s->su + (size_t)t * S, S, HYB_ACT_SILU);
		hyb_fwd_matmul(c, s->sg, nf, 1, &down, &s->so);
	}
	if (!gi->data)
		return;
	if (!on_dev)
		hyb_fwd_matmul(c, c->xn, nf, 1, &gi, &s->sgi);
	for (uint32_t t = 0; t < nf; t++) {
		/* qwen2moe's graph: ggml_div(ggml_silu(g), g), one element per row */
		const float g = s->sgi[t], gate = g / (1.0f + expf(-g)) / g;

		for (uint64_t i = 0; i < E; i++)
			s->so[t * E + i] *= gate;
	}
}

/*
 * The CPU's experts active[first .. first + n) of layer L: gate and up in one
 * queue, the activations of all n_pairs pairs (stage 1: cheap, and those of
 * experts not run here are not read), then down.
 */
static void cpu_experts(struct hyb_ctx *c, const struct hyb_layer *L, uint32_t first,
			uint32_t n, uint32_t n_pairs)
{
	struct hyb_moe_scratch *s = c->moe;

	if (n) {
		const struct hyb_weight *w[2] = { &L->gate_exps, &L->up_exps };
		const void *x[2] = { s->xg, same_dot(L) ? s->xg : s->xu };
		const size_t xs[2] = { s->xg_stride, same_dot(L) ? s->xg_stride : s->xu_stride };
		float *y[2] = { s->h, s->u };

		run_experts(c, first, n, 2, w, x, xs, y);
	}
	run_pairs(c, L, c->xn, n_pairs, 1);
	if (n) {
		const struct hyb_weight *w[1] = { &L->down_exps };
		const void *x[1] = { s->hq };
		const size_t xs[1] = { s->hq_stride };
		float *y[1] = { s->out };

		run_experts(c, first, n, 1, w, x, xs, y);
	}
}

/*
 * One token: the CPU's share active[0 .. n_cpu) reordered so the experts
 * chosen at ranks Ki.. (deferred) come last, each part in ascending order
 * (the kernels' sums do not depend on the order experts run in). Returns
 * how many come first.
 */
static uint32_t defer_last(struct hyb_moe_scratch *s, uint32_t n_cpu, uint32_t Ki, uint32_t K)
{
	uint32_t tmp[64], n_now = 0, n_def = 0;

	if (n_cpu > 64)
		return n_cpu;
	for (uint32_t i = 0; i < n_cpu; i++) {
		bool def = false;

		for (uint32_t k = Ki; k < K; k++)
			def |= (uint32_t)s->sel[k] == s->active[i];
		if (def)
			tmp[n_def++] = s->active[i];
		else
			s->active[n_now++] = s->active[i];
	}
	memcpy(s->active + n_now, tmp, sizeof(uint32_t) * n_def);
	return n_now;
}

/*
 * d (+)= (o + the down bias of expert e, gpt-oss's ggml_add_id) * w: ggml_mul by
 * the weight, then ggml_add in rank order (a rounding each); first: d = it.
 */
static void add_expert(const struct hyb_layer *L, uint32_t e, float *d, const float *o, float w,
		       uint32_t E, bool first)
{
	const float *db = L->down_exps_b ? L->down_exps_b + (size_t)e * E : NULL;

	for (uint32_t i = 0; i < E; i++) {
		const float v = (db ? o[i] + db[i] : o[i]) * w;

		d[i] = first ? v : d[i] + v;
	}
}

int hyb_fwd_ffn_moe(struct hyb_ctx *c, uint32_t l, uint32_t nf)
{
	const struct hyb_hparams *hp = &c->m->hp;
	const struct hyb_layer *L = &c->m->layers[l];
	struct hyb_moe_scratch *s = c->moe;
	const uint32_t K = hp->n_expert_used, E = hp->n_embd;
	const struct hyb_weight *router = &L->gate_inp;
	const double t0 = hyb_now();

	if (l == hp->n_dense_lead) /* a step's first MoE layer: nothing is due */
		s->deferred = s->late = false;
	/* deferred experts nobody ran beside the attention: now, before routing */
	hyb_fwd_moe_deferred(c);
	uint64_t *counts = s->counts + (size_t)l * hp->n_expert;
	double t1;
	uint32_t n_active;
	int rc;

	/* a decode step whose attention ran on the device: the router did too (moe_decode.c) */
	rc = c->moe_hybrid && nf == 1 ?
	     hyb_moe_hybrid_router_logits(c->moe_hybrid, l, s->logits) : 0;
	if (rc < 0)
		return hyb_error_set(-EIO, "router logits from the device: %s",
				     hyb_device_error(hyb_moe_hybrid_device(c->moe_hybrid)));
	if (!rc)
		hyb_fwd_matmul(c, c->xn, nf, 1, &router, &s->logits);
	else if (c->check_routers && (rc = check_router(c, router, s->logits, l, "routing")))
		return rc;
	rc = route(c, l, nf);
	if (rc)
		return rc;
	if (c->moe_probe)
		c->moe_probe(c->moe_probe_user, l, c->n_past, nf, s->sel, s->wt);
	n_active = group_pairs(s, hp->n_expert, K, nf);
	for (uint32_t i = 0; i < n_active; i++)
		counts[s->active[i]] += s->start[s->active[i] + 1] - s->start[s->active[i]];
	t1 = hyb_now();
	s->stats.router_s += t1 - t0;
	s->stats.layer_steps += nf;
	s->stats.expert_runs += n_active;
	s->stats.expert_bytes += n_active * (L->gate_exps.ne1 * L->gate_exps.row_bytes +
					     L->up_exps.ne1 * L->up_exps.row_bytes +
					     L->down_exps.ne1 * L->down_exps.row_bytes);

	/*
	 * A decode step with an expert cache: the device takes the resident
	 * experts (moe_hybrid.c), s->active is reordered with the CPU's first
	 */
	uint32_t n_cpu = n_active;
	double tc = t1;
	char err[256];

	/* one sequence: its decode steps; several: every pass (moe_hybrid.h) */
	const bool cached = c->moe_hybrid && (nf == 1 || c->kv);

	if (cached) {
		const int r = hyb_moe_hybrid_begin(c->moe_hybrid, l, c->xn, nf, s->start, s->tok,
						   s->active, n_active, err, sizeof(err));

		if (r < 0)
			return hyb_error_set(-EIO, "%s", err);
		n_cpu = (uint32_t)r;
		tc = hyb_now(); /* the CPU device ran the kernels inside begin */
	}
	/*
	 * Deferral beside the device: the CPU's deferred experts go last in its
	 * share and wait for the next layer's attention (hyb_fwd_moe_deferred).
	 */
	const uint32_t Ki = nf == 1 && l + 1 < hp->n_layer ? K - c->moe_defer : K;
	uint32_t n_now = n_cpu;

	if (c->moe_hybrid && Ki < K)
		n_now = defer_last(s, n_cpu, Ki, K);
	run_pairs(c, L, c->xn, nf * K, 0);
	cpu_experts(c, L, 0, n_now, nf * K);
	const double t2 = hyb_now();

	if (cached) {
		/* while the device works: which experts the next layer will want (one token) */
		const int n_pred = nf == 1 && hyb_moe_hybrid_prefetching(c->moe_hybrid) ?
				   predict_next(c, l) : 0;

		if (n_pred < 0)
			return n_pred;
		if (hyb_moe_hybrid_end(c->moe_hybrid, l, s->active, n_cpu, n_active, s->start,
				       s->out, t2 - tc, (const uint32_t *)s->psel, (uint32_t)n_pred, err,
				       sizeof(err)))
			return hyb_error_set(-EIO, "%s", err);
	}

	s->stats.experts_s += t2 - t1;
	/* the device's shared expert ran beside the CPU's experts (moe_hybrid.c) */
	if (L->up_shexp.data)
		shared_expert(c, L, nf, cached && hyb_moe_hybrid_shared_out(c->moe_hybrid, s->so,
									     s->sgi));
	s->stats.shared_s += hyb_now() - t2;

	/*
	 * Deferral (decode only, not in the last layer): the lowest-ranked
	 * experts' sum waits for the next MoE layer; the one due from the layer
	 * before joins this layer's output. Their weights stay those of all K.
	 */
	const bool due = nf == 1 && s->deferred;
	const bool late = c->moe_hybrid && Ki < K;

	/* each token's experts into its row (add_expert) */
	for (uint32_t t = 0; t < nf; t++) {
		float *y = c->xn + (size_t)t * E;

		for (uint32_t k = 0; k < (late ? Ki : K); k++)
			add_expert(L, (uint32_t)s->sel[t * K + k], k < Ki ? y : s->defer,
				   s->out + (size_t)s->pos[t * K + k] * E, s->wt[t * K + k], E,
				   k == (k < Ki ? 0 : Ki));
		if (L->up_shexp.data)
			for (uint32_t i = 0; i < E; i++)
				y[i] += s->so[(size_t)t * E + i];
	}
	if (due)
		for (uint32_t i = 0; i < E; i++)
			c->xn[i] += s->pending[i];
	s->deferred = Ki < K;
	if (late) {
		s->late = true;
		s->d_layer = l, s->d_first = n_now, s->d_n = n_cpu - n_now, s->d_ki = Ki;
	} else if (s->deferred) {
		memcpy(s->pending, s->defer, sizeof(float) * E);
	}
	return 0;
}

int hyb_fwd_moe_deferred(struct hyb_ctx *c)
{
	struct hyb_moe_scratch *s = c->moe;
	const uint32_t K = c->m->hp.n_expert_used, E = c->m->hp.n_embd;
	const double t0 = hyb_now();

	if (!s || !s->late)
		return 0;
	s->late = false;
	cpu_experts(c, &c->m->layers[s->d_layer], s->d_first, s->d_n, K);
	/* the sum as the layer would have taken it: ranks Ki.. in order */
	for (uint32_t k = s->d_ki; k < K; k++)
		add_expert(&c->m->layers[s->d_layer], (uint32_t)s->sel[k], s->defer,
			   s->out + (size_t)s->pos[k] * E, s->wt[k], E, k == s->d_ki);
	memcpy(s->pending, s->defer, sizeof(float) * E);
	s->stats.experts_s += hyb_now() - t0;
	return 0;
}
