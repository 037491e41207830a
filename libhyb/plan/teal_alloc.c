// SPDX-License-Identifier: MIT
/*
 * TEAL's block-wise greedy allocation (TEAL §4.2, docs/SPARSITY.md#teal):
 * how a layer's sparsity is shared between its projection inputs, so that
 * the inputs whose zeros hurt least carry more of it.
 *
 * Per layer, from every input at sparsity 0: try raising each input's
 * sparsity by one step, evaluate the layer alone on the calibration
 * tokens' dense inputs to it, and keep the step with the smallest rise of
 * the layer output's squared error per weight it skips (the paper picks the
 * smallest error; per weight skipped makes the steps of inputs of unequal
 * size comparable, since the budget is bytes). Each input's threshold is
 * the dense model's quantile at its sparsity, as TEAL sets them. When the
 * layer's weighted sparsity passes a level (k * HYB_TEAL_STEP), the
 * allocation at exactly that level is recorded, interpolated between the
 * steps around it. Every layer gets the same weighted sparsity, as TEAL
 * keeps it across blocks.
 */
#include "hyb/profile.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "hyb/model.h"
#include "hyb/sparsity.h"
#include "util/error.h"

#define STEP 0.05f /* one greedy move */
#define S_MAX 0.95f /* no input sparser than this */

/* Weights each input multiplies (its matrices' elements). */
static void input_weights(const struct hyb_model *m, uint32_t l, double *p)
{
	const struct hyb_layer *L = &m->layers[l];

	p[HYB_TEAL_QKV] = (double)L->wq.ne0 * (double)(L->wq.ne1 + L->wk.ne1 + L->wv.ne1);
	p[HYB_TEAL_O] = (double)L->wo.ne0 * (double)L->wo.ne1;
	p[HYB_TEAL_GU] = (double)L->gate.ne0 * (double)(L->gate.ne1 + L->up.ne1);
	p[HYB_TEAL_DOWN] = (double)L->down.ne0 * (double)L->down.ne1;
}

struct alloc_run {
	struct hyb_ctx *c;
	const struct hyb_model *m;
	uint32_t n_seqs;
	const uint32_t *lens;
	float **x;      /* per sequence: [n_layer + 1][len][n_embd] dense states */
	const float *quant;
	float *out;     /* scratch [longest][n_embd] */
};

/* Squared error of layer l's output at input sparsities s against the dense output. */
static int layer_error(struct alloc_run *r, uint32_t l, const float *s, double *err)
{
	const uint32_t E = r->m->hp.n_embd, L = r->m->hp.n_layer, NQ = HYB_SPARSITY_N_QUANTILES;
	float thr[HYB_TEAL_INPUTS];

	for (uint32_t i = 0; i < HYB_TEAL_INPUTS; i++)
		thr[i] = s[i] > 0 ? hyb_sparsity_quantile_at(r->quant + ((size_t)l * HYB_TEAL_INPUTS + i) *
							     NQ, s[i])
				  : 0.0f;
	*err = 0;
	for (uint32_t q = 0; q < r->n_seqs; q++) {
		const size_t rows = (size_t)r->lens[q] * E;
		const float *in = r->x[q] + l * rows, *want = r->x[q] + (l + 1) * rows;
		int rc = hyb_ctx_eval_block(r->c, l, in, r->lens[q], thr, r->out);

		if (rc)
			return rc;
		for (size_t e = 0; e < rows; e++) {
			const double d = (double)r->out[e] - want[e];

			*err += d * d;
		}
	}
	(void)L;
	return 0;
}

static int allocate_layer(struct alloc_run *r, uint32_t l, float *alloc)
{
	const uint32_t NI = HYB_TEAL_INPUTS;
	double p[HYB_TEAL_INPUTS], total = 0, err_cur = 0, w_prev = 0;
	float s[HYB_TEAL_INPUTS] = { 0 }, prev[HYB_TEAL_INPUTS] = { 0 };
	uint32_t level = 1;

	input_weights(r->m, l, p);
	for (uint32_t i = 0; i < NI; i++)
		total += p[i];
	memset(alloc, 0, sizeof(float) * NI); /* level 0: dense */
	while (level < HYB_TEAL_LEVELS) {
		double best_cost = INFINITY, best_err = 0, w = 0;
		int best = -1;

		for (uint32_t i = 0; i < NI; i++) {
			float t[HYB_TEAL_INPUTS];
			double e;
			int rc;

			if (s[i] + STEP > S_MAX + 1e-6f)
				continue;
			memcpy(t, s, sizeof(t));
			t[i] += STEP;
			rc = layer_error(r, l, t, &e);
			if (rc)
				return rc;
			const double cost = (e - err_cur) / (p[i] * STEP);

			if (cost < best_cost) {
				best_cost = cost;
				best = (int)i;
				best_err = e;
			}
		}
		if (best < 0)
			break;
		memcpy(prev, s, sizeof(prev));
		s[best] += STEP;
		err_cur = best_err;
		for (uint32_t i = 0; i < NI; i++)
			w += p[i] * s[i] / total;
		/* the levels this step passed: the allocation at each exactly */
		for (; level < HYB_TEAL_LEVELS && w >= level * HYB_TEAL_STEP - 1e-9; level++) {
			const double f = (level * HYB_TEAL_STEP - w_prev) / (w - w_prev);

			for (uint32_t i = 0; i < NI; i++)
				alloc[level * NI + i] = (float)(prev[i] + f * (s[i] - prev[i]));
		}
		w_prev = w;
	}
	/* levels no step reached (every input at S_MAX): the last allocation */
	for (; level < HYB_TEAL_LEVELS; level++)
		memcpy(alloc + level * NI, s, sizeof(s));
	return 0;
}

int hyb_teal_allocate(struct hyb_ctx *c, const struct hyb_model *m, const int32_t *const *seqs,
		      const uint32_t *lens, uint32_t n_seqs, const float *quant, float *alloc)
{
	const struct hyb_hparams *hp = &m->hp;
	struct alloc_run r = { .c = c, .m = m, .n_seqs = n_seqs, .lens = lens, .quant = quant };
	uint32_t longest = 0;
	int rc = 0;

	if (!n_seqs)
		return hyb_error_set(-EINVAL, "no calibration tokens to allocate on");
	r.x = calloc(n_seqs, sizeof(*r.x));
	for (uint32_t q = 0; q < n_seqs; q++)
		longest = lens[q] > longest ? lens[q] : longest;
	r.out = malloc(sizeof(float) * longest * hp->n_embd);
	if (!r.x || !r.out) {
		rc = hyb_error_set(-ENOMEM, "out of memory");
		goto out;
	}
	for (uint32_t q = 0; q < n_seqs && !rc; q++) {
		r.x[q] = malloc(sizeof(float) * (hp->n_layer + 1) * lens[q] * hp->n_embd);
		rc = r.x[q] ? hyb_ctx_block_inputs(c, seqs[q], lens[q], r.x[q])
			    : hyb_error_set(-ENOMEM, "out of memory");
	}
	for (uint32_t l = 0; l < hp->n_layer && !rc; l++)
		rc = allocate_layer(&r, l, alloc + (size_t)l * HYB_TEAL_LEVELS * HYB_TEAL_INPUTS);
out:
	for (uint32_t q = 0; r.x && q < n_seqs; q++)
		free(r.x[q]);
	free(r.x);
	free(r.out);
	return rc;
}
