// SPDX-License-Identifier: MIT
/*
 * hybctl profile --teal: the statistics a profile prints for a ReLU
 * model's neurons (hyb/profile.h: hot share, Jaccard drift, cold
 * reactivation, co-activation lift), here of each projection group's
 * inputs above their thresholds (docs/SPARSITY.md#teal): an input channel
 * plays a neuron's part, as a row of TEAL's transposed layout does. The
 * calibration's sequences run again with the thresholds in force, so the
 * inputs are those TEAL decoding computes (as a CATS profile sees its
 * thresholded activations). They say what placing hot input rows on a
 * device could work with.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hybctl.h"
#include "hyb/model.h"
#include "hyb/profile.h"
#include "hyb/sparsity.h"

struct stats_probe {
	struct hyb_profile_collector *col[HYB_TEAL_INPUTS];
	const float *thr; /* [n_layer][HYB_TEAL_INPUTS] */
	float *act, *zero;
	size_t cap;       /* floats in act */
	size_t zcap;      /* floats in zero */
	bool failed;
};

/* An input probe (hyb_input_probe_fn): the inputs above the threshold, as a neuron's activity. */
static void probe(void *user, uint32_t layer, uint32_t input, uint32_t n, const float *x,
		  uint32_t ne)
{
	struct stats_probe *p = user;
	const size_t need = (size_t)n * ne;
	const float t = p->thr[(size_t)layer * HYB_TEAL_INPUTS + input];

	if (p->failed)
		return;
	if (need > p->cap) {
		free(p->act);
		p->act = malloc(sizeof(float) * need);
		p->cap = p->act ? need : 0;
	}
	if (n > p->zcap) {
		free(p->zero);
		p->zero = calloc(n, sizeof(float));
		p->zcap = p->zero ? n : 0;
	}
	if (!p->act || !p->zero) {
		p->failed = true;
		return;
	}
	for (size_t i = 0; i < need; i++)
		p->act[i] = fabsf(x[i]) > t ? x[i] : 0.0f;
	/* no predictor input here: a one-element zero row stands in for it */
	hyb_profile_probe(p->col[input], layer, 0, n, p->zero, p->act);
}

/* Each input group's dimension: the collector's "neurons". */
static uint32_t input_dim(const struct hyb_model *m, uint32_t input)
{
	const struct hyb_layer *L = &m->layers[0];

	switch (input) {
	case HYB_TEAL_QKV: return (uint32_t)L->wq.ne0;
	case HYB_TEAL_O: return (uint32_t)L->wo.ne0;
	case HYB_TEAL_GU: return (uint32_t)L->gate.ne0;
	default: return (uint32_t)L->down.ne0;
	}
}

static void print_stats(struct hyb_profile *const *prof, uint32_t n_layer)
{
	const uint32_t NI = HYB_TEAL_INPUTS;
	struct hyb_profile_summary s[HYB_TEAL_INPUTS];

	printf("TEAL inputs above their thresholds, the thresholds in force (%llu tokens, %u "
	       "sampled): an input is active where |x| > t\n",
	       (unsigned long long)prof[0]->n_tokens, prof[0]->n_samples);
	printf("layer");
	for (uint32_t i = 0; i < NI; i++)
		printf("  %8s act hot80 jacc", hyb_teal_input_name(i));
	printf("\n");
	for (uint32_t l = 0; l < n_layer; l++) {
		printf("%5u", l);
		for (uint32_t i = 0; i < NI; i++) {
			const struct hyb_profile_layer *L = &prof[i]->layers[l];

			printf("  %12.3f %5.3f %4.2f", 1.0 - L->sparsity, L->hot_share_80,
			       L->jaccard_adjacent);
		}
		printf("\n");
	}
	/*
	 * Beside each figure what inputs active at random with the same density
	 * p would give: hot share 0.80 (every input as active as the others),
	 * Jaccard distance 1 - p / (2 - p) (adjacent tokens independent).
	 */
	for (uint32_t i = 0; i < NI; i++) {
		const double a = (hyb_profile_summarize(prof[i], &s[i]), 1.0 - s[i].sparsity);

		printf("%-8s %5u inputs: active %.3f, hot share %.3f (80%% of activity, all "
		       "layers; uniform 0.800), jaccard %.3f (independent %.3f), cold "
		       "reactivation d>=3 max %.3f, co-activation lift %.2f (random %.2f)\n",
		       hyb_teal_input_name(i), prof[i]->n_ff, a, s[i].hot_share_80,
		       s[i].jaccard_adjacent, 1.0 - a / (2.0 - a), s[i].reactivation_cold_max,
		       s[i].coact_lift, s[i].coact_lift_random);
	}
}

int profile_teal_stats(struct hyb_ctx *c, const struct hyb_model *m, const float *thr,
		       int32_t *const *seqs, const uint32_t *lens, uint32_t n_seq,
		       uint32_t samples)
{
	const uint32_t L = m->hp.n_layer, NI = HYB_TEAL_INPUTS;
	struct stats_probe p = { .thr = thr };
	struct hyb_profile *prof[HYB_TEAL_INPUTS] = { 0 };
	float *logits = malloc(sizeof(float) * m->hp.n_vocab);
	int rc = -1;

	if (!logits)
		goto nomem;
	for (uint32_t i = 0; i < NI; i++)
		if (!(p.col[i] = hyb_profile_collector_new(L, 1, input_dim(m, i), samples,
							   hyb_teal_input_name(i))))
			goto fail;
	if (hyb_ctx_set_teal_thresholds(c, thr))
		goto fail;
	hyb_ctx_set_input_probe(c, probe, &p);
	for (uint32_t s = 0; s < n_seq && !p.failed; s++) {
		hyb_ctx_reset(c);
		for (uint32_t i = 0; i < NI; i++)
			hyb_profile_collector_begin_seq(p.col[i], (samples + n_seq - 1) / n_seq);
		if (hyb_ctx_eval(c, seqs[s], lens[s], logits, false))
			goto fail;
	}
	hyb_ctx_set_input_probe(c, NULL, NULL);
	hyb_ctx_set_teal_thresholds(c, NULL);
	if (p.failed)
		goto nomem;
	for (uint32_t i = 0; i < NI; i++) {
		prof[i] = hyb_profile_collector_finish(p.col[i]);
		p.col[i] = NULL;
		if (!prof[i])
			goto nomem;
	}
	print_stats(prof, L);
	rc = 0;
	goto out;
nomem:
	fprintf(stderr, "hybctl profile: out of memory for TEAL's statistics\n");
	goto out;
fail:
	fprintf(stderr, "hybctl profile: TEAL's statistics: %s\n", hyb_last_error());
out:
	hyb_ctx_set_input_probe(c, NULL, NULL);
	hyb_ctx_set_teal_thresholds(c, NULL);
	for (uint32_t i = 0; i < NI; i++) {
		hyb_profile_collector_free(p.col[i]);
		hyb_profile_free(prof[i]);
	}
	free(p.act);
	free(p.zero);
	free(logits);
	return rc;
}
