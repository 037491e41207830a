// SPDX-License-Identifier: MIT
/* The small plan model sparse and hybrid decoding tests share, and their greedy pick (test.h). */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "hyb/model.h"
#include "test.h"

const char *hyb_test_hybctl(void)
{
	const char *b = getenv("HYB_TEST_HYBCTL");

	return b ? b : "build/hybctl";
}

const char *hyb_test_plan(void)
{
	static char plan[512];
	char model[512], prof[512], cmd[4096];

	if (plan[0])
		return plan;
	if (access(hyb_test_hybctl(), X_OK))
		SKIP("%s not built (run from the repository root after make)", hyb_test_hybctl());
	snprintf(model, sizeof(model), "%s/sd.gguf", hyb_test_tmpdir());
	snprintf(prof, sizeof(prof), "%s/sd.profile.gguf", hyb_test_tmpdir());
	snprintf(plan, sizeof(plan), "%s/sd.plan.gguf", hyb_test_tmpdir());
	snprintf(cmd, sizeof(cmd),
		 "%s synth -o %s --hidden 256 --ffn 1024 --layers 3 --heads 4 --vocab 512 "
		 "--act relu --type Q8_0 -t 1 >/dev/null && "
		 "%s profile %s -o %s --gen 48 -t 1 >/dev/null && "
		 "%s plan %s --profile %s --gpu-budget 4M -o %s -t 1 >/dev/null 2>&1",
		 hyb_test_hybctl(), model, hyb_test_hybctl(), model, prof, hyb_test_hybctl(), model, prof, plan);
	if (system(cmd) != 0) {
		plan[0] = 0;
		CHECK_MSG(0, "%s failed", cmd);
	}
	return plan;
}

int32_t hyb_test_argmax(const float *v, uint32_t n)
{
	uint32_t b = 0;

	for (uint32_t i = 1; i < n; i++)
		if (v[i] > v[b])
			b = i;
	return (int32_t)b;
}

void hyb_test_greedy_compare(struct hyb_ctx *a, struct hyb_ctx *b, uint32_t V, uint32_t seed,
			     uint32_t n_prompt, uint32_t n_gen, uint32_t skip,
			     struct hyb_test_agreement *r)
{
	float *la = malloc(sizeof(float) * V), *lb = malloc(sizeof(float) * V);
	int32_t toks[64];

	CHECK(la && lb && n_prompt <= 64);
	for (uint32_t i = 0; i < n_prompt; i++)
		toks[i] = (int32_t)(3 + (seed * 2654435761u + i * 40503u) % (V - 3));
	hyb_ctx_reset(a);
	hyb_ctx_reset(b);
	CHECK_MSG(!hyb_ctx_eval(a, toks, n_prompt, la, false), "%s", hyb_last_error());
	CHECK_MSG(!hyb_ctx_eval(b, toks, n_prompt, lb, false), "%s", hyb_last_error());
	for (uint32_t i = 0; i < n_gen; i++) {
		int32_t next = hyb_test_argmax(la, V);

		if (i >= skip) {
			double top = 0, diff = 0;

			r->agree += next == hyb_test_argmax(lb, V);
			r->total++;
			for (uint32_t v = 0; v < V; v++) {
				top = fmax(top, fabs(la[v]));
				diff = fmax(diff, fabs(la[v] - lb[v]));
			}
			r->max_diff = fmax(r->max_diff, diff);
			r->max_rel = fmax(r->max_rel, top > 0 ? diff / top : diff);
		}
		CHECK_MSG(!hyb_ctx_eval(a, &next, 1, la, false), "%s", hyb_last_error());
		CHECK_MSG(!hyb_ctx_eval(b, &next, 1, lb, false), "%s", hyb_last_error());
	}
	free(la);
	free(lb);
}

struct hyb_ctx *hyb_test_ctx(const struct hyb_model *m, int ffn)
{
	struct hyb_ctx_params p = { .n_ctx = 256, .n_threads = 1, .ffn = (enum hyb_ffn_mode)ffn };
	struct hyb_ctx *c = hyb_ctx_new(m, &p);

	CHECK_MSG(c, "%s", hyb_last_error());
	return c;
}
