// SPDX-License-Identifier: MIT
/*
 * Sparse FFN decode: predictor -> active list -> neuron-aware operator.
 * Everything a step needs is allocated once per context; a step allocates
 * nothing.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sparse_layer.h"
#include "hyb/plan.h"
#include "sparse_op.h"
#include "sparse_ffn_kernels.h"

struct hyb_ffn_sparse {
	const struct hyb_model *m;
	struct hyb_sparse_ffn_ctx *op;
	struct hyb_predictor *pred;      /* [n_layer] */
	struct hyb_ffn_bundles *bundles; /* [n_layer] */
	const void **ptrs;               /* [n_layer][n_groups] */
	void *pred_scratch;
	uint32_t *active;                /* [n_ff] */
	float *prev;                     /* [n_embd] predictor input for the next layer */
	float *cur;                      /* [n_embd] */
	float *part;                     /* [n_embd] oracle mode: one group's partial */
	const float *thr;                /* [n_layer] CATS thresholds (the context's), or NULL */
	bool oracle;
	bool pi;                         /* a PowerInfer model file (hyb_pi_predictor_run) */
	struct hyb_sparse_stats st;
	struct hyb_sparse_stats *lst;    /* [n_layer] the same, per layer */
};

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

void hyb_unit_rms(float *y, const float *x, uint32_t n)
{
	double sum = 0;

	for (uint32_t i = 0; i < n; i++)
		sum += (double)x[i] * x[i];
	const float scale = sum > 0 ? (float)(1.0 / sqrt(sum / n)) : 0.0f;

	for (uint32_t i = 0; i < n; i++)
		y[i] = x[i] * scale;
}

/* Group size of a PowerInfer model's matrices seen as bundles (any: no group is absent). */
#define PI_GROUP 64

/*
 * A PowerInfer model file: its gate, up and ffn_down_t as they are (one type,
 * one the sparse operator computes) and its predictors; *scratch raised to
 * what they need.
 */
static int pi_layers(struct hyb_ffn_sparse *s, size_t *scratch, char *err, size_t errlen)
{
	const struct hyb_model *m = s->m;
	const struct hyb_hparams *hp = &m->hp;

	if (!m->powerinfer) {
		snprintf(err, errlen, "sparse decoding needs a plan or a PowerInfer model file");
		return -1;
	}
	for (uint32_t l = 0; l < hp->n_layer; l++) {
		const struct hyb_layer *L = &m->layers[l];
		size_t b;

		if (!L->fc1.data || !L->fc2.data) {
			snprintf(err, errlen, "blk.%u has no predictor (fc1, fc2): this PowerInfer "
				 "file decodes densely only (--dense)", l);
			return -1;
		}
		if (L->gate.type != L->down_t.type || L->up.type != L->down_t.type ||
		    !hyb_sparse_type_ok(L->down_t.type)) {
			snprintf(err, errlen, "blk.%u: ffn_gate %s, ffn_up %s, ffn_down_t %s: sparse "
				 "decoding takes one type of %s (--dense decodes it)", l,
				 hyb_type_name(L->gate.type), hyb_type_name(L->up.type),
				 hyb_type_name(L->down_t.type), hyb_sparse_type_list());
			return -1;
		}
		/* PowerInfer's arithmetic quantizes h over n_ff in the dot type's blocks */
		const uint32_t blk = hyb_type_info(hyb_vec_dot_type(L->down_t.type))->blck;

		if (hp->n_ff % blk) {
			snprintf(err, errlen, "blk.%u: ffn_down_t is %s, whose axpy reads h in blocks "
				 "of %u, and n_ff %u is not a multiple (PowerInfer cannot run this "
				 "file either): --dense decodes it", l,
				 hyb_type_name(L->down_t.type), blk, hp->n_ff);
			return -1;
		}
		s->bundles[l] = (struct hyb_ffn_bundles){
			.type = L->down_t.type, .n_embd = hp->n_embd, .n_ff = hp->n_ff,
			.group_size = PI_GROUP, .row_bytes = L->down_t.row_bytes,
			.rows = { L->gate.data, L->up.data, L->down_t.data },
		};
		b = hyb_pi_predictor_scratch_bytes(&L->fc1, &L->fc2);
		if (b > *scratch)
			*scratch = b;
	}
	s->pi = true;
	return 0;
}

struct hyb_ffn_sparse *hyb_ffn_sparse_new(const struct hyb_model *m, int n_threads, char *err,
					  size_t errlen)
{
	const struct hyb_hparams *hp = &m->hp;
	struct hyb_ffn_sparse *s = calloc(1, sizeof(*s));
	size_t scratch = 0;

	if (!s)
		goto oom;
	s->m = m;
	s->op = hyb_sparse_ffn_ctx_new(hp->n_embd, hp->n_ff, n_threads);
	s->pred = calloc(hp->n_layer, sizeof(*s->pred));
	s->bundles = calloc(hp->n_layer, sizeof(*s->bundles));
	s->ptrs = calloc((size_t)hp->n_layer * m->n_groups, sizeof(*s->ptrs));
	s->active = malloc(sizeof(*s->active) * hp->n_ff);
	s->prev = malloc(sizeof(float) * hp->n_embd);
	s->cur = malloc(sizeof(float) * hp->n_embd);
	s->part = malloc(sizeof(float) * hp->n_embd);
	s->lst = calloc(hp->n_layer, sizeof(*s->lst));
	if (!s->op || !s->pred || !s->bundles || !s->active || !s->prev || !s->cur || !s->part ||
	    !s->lst || (m->group_size && !s->ptrs))
		goto oom;
	if (!m->group_size) {
		if (pi_layers(s, &scratch, err, errlen)) {
			hyb_ffn_sparse_free(s);
			return NULL;
		}
		goto scratch;
	}
	for (uint32_t l = 0; l < hp->n_layer; l++) {
		const struct hyb_ffn_plan *P = &m->layers[l].plan;
		struct hyb_predictor *pr = &s->pred[l];
		size_t b;

		*pr = (struct hyb_predictor){
			.n_in = hp->n_embd, .hidden = P->hidden, .n_out = hp->n_ff,
			.fc1_w = P->fc1.data, .fc1_b = P->fc1_bias,
			.fc2_w = P->fc2.data, .fc2_b = P->fc2_bias,
		};
		b = hyb_predictor_scratch_bytes(pr);
		if (b > scratch)
			scratch = b;
		if (hyb_bundles_view(&s->bundles[l], P->bundles.type, hp->n_embd, hp->n_ff,
				     m->group_size, P->bundles.data,
				     s->ptrs + (size_t)l * m->n_groups)) {
			snprintf(err, errlen, "layer %u: bundles do not fit the sparse operator", l);
			hyb_ffn_sparse_free(s);
			return NULL;
		}
	}
scratch:
	if (posix_memalign(&s->pred_scratch, 64, scratch ? scratch : 64))
		goto oom;
	return s;
oom:
	snprintf(err, errlen, "out of memory for sparse decoding");
	hyb_ffn_sparse_free(s);
	return NULL;
}

void hyb_ffn_sparse_free(struct hyb_ffn_sparse *s)
{
	if (!s)
		return;
	hyb_sparse_ffn_ctx_free(s->op);
	free(s->pred);
	free(s->bundles);
	free(s->ptrs);
	free(s->pred_scratch);
	free(s->active);
	free(s->prev);
	free(s->cur);
	free(s->part);
	free(s->lst);
	free(s);
}

uint32_t hyb_ffn_sparse_predict(struct hyb_ffn_sparse *s, struct hyb_threadpool *pool, uint32_t l,
				const float *in, float *scores, uint32_t *active)
{
	if (s->pi)
		return hyb_pi_predictor_run(&s->m->layers[l].fc1, &s->m->layers[l].fc2,
					    s->m->powerinfer_threshold, in, pool, s->pred_scratch,
					    active);
	return hyb_predictor_run(&s->pred[l], in, pool, s->pred_scratch, scores, active);
}

bool hyb_ffn_sparse_has_scores(const struct hyb_ffn_sparse *s)
{
	return !s->pi;
}

const struct hyb_ffn_bundles *hyb_ffn_sparse_bundles(const struct hyb_ffn_sparse *s, uint32_t l)
{
	return &s->bundles[l];
}

void hyb_ffn_sparse_set_thresholds(struct hyb_ffn_sparse *s, const float *thr)
{
	s->thr = thr;
}

void hyb_ffn_sparse_set_oracle(struct hyb_ffn_sparse *s, bool on)
{
	s->oracle = on;
}

int hyb_ffn_sum_by_group(uint32_t n_embd, uint32_t group_size, const uint32_t *active,
			 uint32_t n_active, float *part, float *y, hyb_group_part_fn fn,
			 void *user)
{
	memset(y, 0, sizeof(float) * n_embd);
	for (uint32_t i = 0; i < n_active;) {
		const uint32_t g = active[i] / group_size;
		uint32_t j = i + 1;

		while (j < n_active && active[j] / group_size == g)
			j++;
		if (fn(user, g, active + i, j - i, part))
			return -1;
		for (uint32_t e = 0; e < n_embd; e++)
			y[e] += part[e];
		i = j;
	}
	return 0;
}

struct cpu_part {
	struct hyb_ffn_sparse *s;
	uint32_t l;
	const float *xn;
	struct hyb_sparse_ffn_stats *st;
};

static int cpu_group_part(void *user, uint32_t g, const uint32_t *active, uint32_t n,
			  float *part)
{
	struct cpu_part *c = user;
	struct hyb_sparse_ffn_stats one;

	(void)g;
	if (hyb_sparse_ffn_cats(c->s->op, NULL, &c->s->bundles[c->l], c->s->m->hp.act, c->xn,
				active, n, c->s->thr ? c->s->thr[c->l] : 0.0f, part, &one))
		return -1;
	c->st->n_gate += one.n_gate;
	c->st->n_up += one.n_up;
	c->st->n_nz += one.n_nz;
	return 0;
}

int hyb_ffn_sparse_run(struct hyb_ffn_sparse *s, struct hyb_threadpool *pool, uint32_t l,
		       const float *xn, const uint32_t *active, uint32_t n_active, float *y,
		       struct hyb_sparse_ffn_stats *st, char *err, size_t errlen)
{
	const uint32_t E = s->m->hp.n_embd;
	int rc;

	if (s->oracle) {
		struct cpu_part c = { .s = s, .l = l, .xn = xn, .st = st };
		float *out = y == xn ? s->cur : y; /* y may alias xn: sum aside */

		memset(st, 0, sizeof(*st));
		rc = hyb_ffn_sum_by_group(E, s->bundles[l].group_size, active, n_active, s->part, out,
					  cpu_group_part, &c);
		if (!rc && out != y)
			memcpy(y, out, sizeof(float) * E);
	} else if (s->pi) {
		rc = hyb_sparse_ffn_pi(s->op, pool, &s->bundles[l], s->m->hp.act, xn, active,
				       n_active, y, st);
	} else {
		rc = hyb_sparse_ffn_cats(s->op, pool, &s->bundles[l], s->m->hp.act, xn, active,
					 n_active, s->thr ? s->thr[l] : 0.0f, y, st);
	}
	if (rc)
		snprintf(err, errlen, "layer %u: %s", l, hyb_sparse_ffn_error(s->op));
	return rc;
}

int hyb_ffn_sparse_layer(struct hyb_ffn_sparse *s, struct hyb_threadpool *pool, uint32_t l,
			 const float *x_attn, const float *xn, float *y, char *err,
			 size_t errlen)
{
	return hyb_ffn_sparse_layer_row(s, pool, l, x_attn, xn, y, s->prev, err, errlen);
}

int hyb_ffn_sparse_layer_row(struct hyb_ffn_sparse *s, struct hyb_threadpool *pool, uint32_t l,
			     const float *x_attn, const float *xn, float *y, float *prev,
			     char *err, size_t errlen)
{
	const struct hyb_model *m = s->m;
	const uint32_t E = m->hp.n_embd;
	struct hyb_sparse_ffn_stats ost;
	uint32_t n_active;
	double t0, t1, t2;

	t0 = now_s();
	if (s->thr) {
		/* CATS computes every gate and thresholds it exactly (docs/SPARSITY.md):
		 * no prediction, the operator skips the up and down rows */
		n_active = m->hp.n_ff;
		for (uint32_t i = 0; i < n_active; i++)
			s->active[i] = i;
	} else if (s->pi || m->pred_input == HYB_PRED_SAME_LAYER) {
		/* PowerInfer's predictors read this layer's residual as it is */
		n_active = hyb_ffn_sparse_predict(s, pool, l, x_attn, NULL, s->active);
	} else {
		/* This layer's predictor input is the previous layer's attention
		 * output; layer 0 has none before it and uses its own (hyb/profile.h). */
		hyb_unit_rms(s->cur, x_attn, E);
		n_active = hyb_ffn_sparse_predict(s, pool, l, l ? prev : s->cur, NULL, s->active);
		memcpy(prev, s->cur, sizeof(float) * E);
	}
	t1 = now_s();
	if (hyb_ffn_sparse_run(s, pool, l, xn, s->active, n_active, y, &ost, err, errlen))
		return -1;
	t2 = now_s();
	for (struct hyb_sparse_stats *o = &s->st; o; o = o == &s->st ? &s->lst[l] : NULL) {
		o->layer_steps++;
		o->neurons += m->hp.n_ff;
		o->predicted += n_active;
		o->nonzero += ost.n_nz;
		o->predictor_s += t1 - t0;
		o->ffn_s += t2 - t1;
	}
	return 0;
}

void hyb_ffn_sparse_stats(const struct hyb_ffn_sparse *s, struct hyb_sparse_stats *out)
{
	*out = s->st;
}

void hyb_ffn_sparse_layer_stats(const struct hyb_ffn_sparse *s, uint32_t l,
				struct hyb_sparse_stats *out)
{
	if (l < s->m->hp.n_layer)
		*out = s->lst[l];
	else
		memset(out, 0, sizeof(*out));
}

void hyb_ffn_sparse_stats_reset(struct hyb_ffn_sparse *s)
{
	memset(&s->st, 0, sizeof(s->st));
	memset(s->lst, 0, sizeof(*s->lst) * s->m->hp.n_layer);
}
