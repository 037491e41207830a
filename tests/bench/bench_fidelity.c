// SPDX-License-Identifier: MIT
/*
 * bench_fidelity PLAN [N_GEN] [THREADS]: how often sparse decoding picks the
 * token dense decoding picks (the target: >= 95% of positions over 20
 * prompts x 64 tokens). Per prompt, the dense context samples a continuation
 * (temperature 0.8, seeded: a synthetic model's greedy text falls into
 * loops that would make agreement trivial); then dense and sparse contexts
 * are fed the same tokens and their greedy choices compared at every
 * position. The prompts differ from `hybctl profile`'s built-in ones, so
 * the predictors are measured on text they were not trained on.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyb/generate.h"
#include "hyb/model.h"
#include "hyb/sampler.h"
#include "hyb/tokenizer.h"

static const char *const prompts[] = {
	"The committee met on Tuesday to discuss the budget for next year.",
	"Rain fell steadily over the harbour as the ships came in.",
	"To install the package, first update the list of sources.",
	"She opened the old notebook and read the first page aloud.",
	"The algorithm sorts the input in place using a heap.",
	"In the spring the farmers plant wheat and barley.",
	"A small cafe on the corner serves the best coffee in town.",
	"The patient reported a mild headache and some fatigue.",
	"Mountains rise sharply from the plain to the west.",
	"He wrote a letter to his brother explaining the delay.",
	"The orchestra tuned their instruments before the concert.",
	"Our quarterly results show growth in every region.",
	"The bridge was closed for repairs during the winter.",
	"Children played in the park until the sun went down.",
	"The function returns an error when the file is missing.",
	"Historians disagree about the causes of the war.",
	"Fresh bread and cheese were laid out on the table.",
	"The telescope captured images of a distant galaxy.",
	"Please remember to lock the door when you leave.",
	"The river flooded the valley after weeks of rain.",
};

static int32_t argmax(const float *v, uint32_t n)
{
	uint32_t best = 0;

	for (uint32_t i = 1; i < n; i++)
		if (v[i] > v[best])
			best = i;
	return (int32_t)best;
}

static void die(const char *what, const char *err)
{
	fprintf(stderr, "bench_fidelity: %s: %s\n", what, err);
	exit(1);
}

int main(int argc, char **argv)
{
	const uint32_t n_prompts = sizeof(prompts) / sizeof(prompts[0]);
	uint32_t n_gen = argc > 2 ? (uint32_t)atoi(argv[2]) : 64;
	int nth = argc > 3 ? atoi(argv[3]) : 0;
	struct hyb_model *m;
	struct hyb_ctx *dense, *sparse;
	uint64_t agree = 0, total = 0;
	struct hyb_sparse_stats st;

	if (argc < 2 || n_gen == 0) {
		fprintf(stderr, "usage: bench_fidelity PLAN [N_GEN] [THREADS]\n");
		return 2;
	}
	m = hyb_model_load(argv[1]);
	if (!m)
		die(argv[1], hyb_last_error());
	if (!m->group_size || !m->tok)
		die(argv[1], "not a plan with a tokenizer (hybctl plan)");
	struct hyb_ctx_params pd = { .n_ctx = 512, .n_threads = nth, .ffn = HYB_FFN_DENSE };
	struct hyb_ctx_params ps = { .n_ctx = 512, .n_threads = nth, .ffn = HYB_FFN_SPARSE };

	dense = hyb_ctx_new(m, &pd);
	sparse = dense ? hyb_ctx_new(m, &ps) : NULL;
	if (!sparse)
		die("context", hyb_last_error());
	float *ld = malloc(sizeof(float) * m->hp.n_vocab), *ls = malloc(sizeof(float) * m->hp.n_vocab);
	int32_t *toks = malloc(sizeof(int32_t) * 512);

	if (!ld || !ls || !toks)
		die("memory", "out of memory");
	printf("prompt  tokens  agree\n");
	for (uint32_t p = 0; p < n_prompts; p++) {
		struct hyb_sampler_params sp = hyb_sampler_defaults();
		struct hyb_sampler *s;
		int n = hyb_tokenize(m->tok, prompts[p], strlen(prompts[p]), true, toks, 256);
		uint64_t a0 = agree, t0 = total;

		if (n <= 0 || n > 256)
			die("tokenize", prompts[p]);
		sp.temperature = 0.8f;
		sp.top_k = 0;
		sp.top_p = 1.0f;
		sp.min_p = 0.0f;
		sp.seed = 1000 + p;
		s = hyb_sampler_new(&sp, (int32_t)m->hp.n_vocab);
		if (!s)
			die("sampler", "out of memory");
		hyb_ctx_reset(dense);
		hyb_ctx_reset(sparse);
		if (hyb_ctx_eval(dense, toks, (uint32_t)n, ld, false) ||
		    hyb_ctx_eval(sparse, toks, (uint32_t)n, ls, false))
			die("prefill", hyb_last_error());
		for (uint32_t i = 0; i < n_gen; i++) {
			int32_t next;

			/* the prefill is dense in both: its logits agree by construction */
			if (i > 0) {
				agree += argmax(ld, m->hp.n_vocab) == argmax(ls, m->hp.n_vocab);
				total++;
			}
			next = hyb_sampler_sample(s, ld);
			hyb_sampler_accept(s, next);
			if (hyb_ctx_eval(dense, &next, 1, ld, false) ||
			    hyb_ctx_eval(sparse, &next, 1, ls, false))
				die("decode", hyb_last_error());
		}
		printf("%6u  %6u  %5.1f%%\n", p, (unsigned)(total - t0),
		       100.0 * (agree - a0) / (total - t0));
		hyb_sampler_free(s);
	}
	hyb_ctx_sparse_stats(sparse, &st);
	printf("fidelity: sparse greedy token = dense on %.2f%% of %llu positions "
	       "(%u prompts x %u tokens); %.1f%% of FFN neurons predicted, %.1f%% fired\n",
	       100.0 * agree / total, (unsigned long long)total, n_prompts, n_gen,
	       100.0 * st.predicted / st.neurons, 100.0 * st.nonzero / st.neurons);
	free(ld);
	free(ls);
	free(toks);
	hyb_ctx_free(sparse);
	hyb_ctx_free(dense);
	hyb_model_free(m);
	return 0;
}
