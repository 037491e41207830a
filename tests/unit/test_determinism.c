// SPDX-License-Identifier: MIT
/*
 * Every decode path gives the same logits, bit for bit, run after run with
 * the same thread count (docs/DETERMINISM.md): dense, a plan's FFN computed
 * densely, a plan decoded sparsely, hybrid decoding on the CPU-executed
 * device, and a PowerInfer file decoded densely (ffn_down_t) and sparsely
 * (its predictors on every token). Each runs a prompt batch and greedy
 * decode steps RUNS times with 2 and with 3 threads (more threads than this
 * machine may have cores, so the OS interleaves them differently every run)
 * and compares the bytes of every logit.
 * Whether 2 and 3 threads agree with each other is printed; the paths
 * docs/DETERMINISM.md says agree are checked.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hyb/hybrid.h"
#include "hyb/model.h"
#include "hybrid/dense.h"
#include "test.h"

#define N_PROMPT 20
#define N_GEN 12
#define N_CTX 64
#define RUNS 3

/*
 * every position's logits of the prompt, then those of each greedy step;
 * st (may be NULL): a hybrid context's statistics at the end
 */
static float *run_once(const struct hyb_model *m, enum hyb_ffn_mode ffn,
		       const struct hyb_hybrid_params *hy, int nth, size_t *len,
		       struct hyb_hybrid_stats *st)
{
	const uint32_t V = m->hp.n_vocab;
	struct hyb_ctx_params p = { .n_ctx = N_CTX, .n_threads = nth, .ffn = ffn, .hybrid = hy };
	struct hyb_ctx *c = hyb_ctx_new(m, &p);
	float *lg = malloc(sizeof(float) * V * (N_PROMPT + N_GEN));
	int32_t toks[N_PROMPT];

	CHECK_MSG(c, "%s", hyb_last_error());
	CHECK(lg);
	for (int i = 0; i < N_PROMPT; i++)
		toks[i] = (int32_t)(3 + (uint32_t)(i * 2654435761u + 11) % (V - 3));
	CHECK_MSG(!hyb_ctx_eval(c, toks, N_PROMPT, lg, true), "%s", hyb_last_error());
	for (int i = 0; i < N_GEN; i++) {
		float *cur = lg + (size_t)V * (N_PROMPT + i);
		int32_t t = hyb_test_argmax(cur - V, V);

		CHECK_MSG(!hyb_ctx_eval(c, &t, 1, cur, false), "%s", hyb_last_error());
	}
	if (st)
		hyb_ctx_hybrid_stats(c, st);
	hyb_ctx_free(c);
	*len = sizeof(float) * V * (N_PROMPT + N_GEN);
	return lg;
}

/*
 * RUNS runs with 2 and with 3 threads each give the bytes of their thread
 * count's first run; returns whether 2 and 3 threads agreed too.
 */
static bool check_path(const char *what, const struct hyb_model *m, enum hyb_ffn_mode ffn,
		       const struct hyb_hybrid_params *hy)
{
	float *first[2] = { NULL, NULL };
	size_t len = 0;
	bool across;

	for (int k = 0; k < 2; k++) {
		const int nth = 2 + k;

		for (int r = 0; r < RUNS; r++) {
			float *lg = run_once(m, ffn, hy, nth, &len, NULL);

			if (!first[k]) {
				first[k] = lg;
				continue;
			}
			for (size_t i = 0; i < len / sizeof(float); i++)
				CHECK_MSG(!memcmp(&lg[i], &first[k][i], sizeof(float)),
					  "%s, %d threads: run %d differs from run 0 at logit %zu of "
					  "token %zu (%.9g vs %.9g)", what, nth, r,
					  i % m->hp.n_vocab, i / m->hp.n_vocab, lg[i], first[k][i]);
			free(lg);
		}
	}
	across = !memcmp(first[0], first[1], len);
	printf("    %s: %d runs each bit-identical with 2 and 3 threads; 2 vs 3 threads: %s\n",
	       what, RUNS, across ? "identical" : "differ");
	free(first[0]);
	free(first[1]);
	return across;
}

static struct hyb_model *load(const char *path)
{
	struct hyb_model *m = hyb_model_load(path);

	CHECK_MSG(m, "%s: %s", path, hyb_last_error());
	return m;
}

/*
 * A plan of many small groups (the shared fixture's few large ones leave a
 * thread split little to reorder) and its source model in *src.
 */
static const char *plan_of_many_groups(char *src, size_t len)
{
	static char plan[512];
	char prof[512], log[512];
	const char *d = hyb_test_tmpdir();
	int rc;

	if (access(hyb_test_hybctl(), X_OK))
		SKIP("%s not built (run from the repository root after make)", hyb_test_hybctl());
	snprintf(src, len, "%s/det.gguf", d);
	snprintf(prof, sizeof(prof), "%s/det.profile.gguf", d);
	snprintf(plan, sizeof(plan), "%s/det.plan.gguf", d);
	snprintf(log, sizeof(log), "%s/det.log", d);
	rc = hyb_test_sh(log, "%s synth -o '%s' --hidden 256 --ffn 4096 --layers 2 --heads 4 "
			 "--vocab 512 --act relu --type Q8_0 -t 1 && %s profile '%s' -o '%s' "
			 "--gen 16 -t 1 && %s plan '%s' --profile '%s' --gpu-budget 4M "
			 "--group-size 32 --train-gflop 2 -o '%s' -t 1", hyb_test_hybctl(), src,
			 hyb_test_hybctl(), src, prof, hyb_test_hybctl(), src, prof, plan);
	if (rc)
		hyb_test_show_log(log);
	CHECK_MSG(rc == 0, "making the plan failed (exit %d)", rc);
	return plan;
}

TEST(determinism_dense)
{
	char src[512];
	struct hyb_model *m;

	plan_of_many_groups(src, sizeof(src));
	m = load(src);
	CHECK(!m->group_size && !m->powerinfer);
	/* rows are independent and attention splits by nth only past 512 positions */
	CHECK_MSG(check_path("dense", m, HYB_FFN_DENSE, NULL),
		  "dense decoding differs between 2 and 3 threads");
	hyb_model_free(m);
}

TEST(determinism_plan_dense)
{
	char src[512];
	struct hyb_model *m = load(plan_of_many_groups(src, sizeof(src)));

	check_path("plan, FFN dense", m, HYB_FFN_DENSE, NULL);
	hyb_model_free(m);
}

TEST(determinism_plan_sparse)
{
	char src[512];
	struct hyb_model *m = load(plan_of_many_groups(src, sizeof(src)));

	check_path("plan, sparse", m, HYB_FFN_SPARSE, NULL);
	hyb_model_free(m);
}

/* A budget for the dense parts and about a third of m's neuron groups. */
static uint64_t third_budget(const struct hyb_model *m)
{
	uint64_t dense = hyb_hdense_head_bytes(m) + hyb_hdense_buffer_bytes(m, true, true, true);
	const uint64_t slot = 3ull * m->group_size * m->layers[0].plan.bundles.row_bytes;

	for (uint32_t l = 0; l < m->hp.n_layer; l++)
		dense += hyb_hdense_layer_bytes(m, l, N_CTX) + hyb_hdense_pred_bytes(m, l);
	return dense + slot * m->n_groups * m->hp.n_layer / 3 + (1u << 20);
}

TEST(determinism_hybrid_cpu_device)
{
	char src[512];
	struct hyb_model *m = load(plan_of_many_groups(src, sizeof(src)));
	/* a policy that reads no clock (the adaptive ones weigh measured times:
	 * docs/DETERMINISM.md; below, on the virtual clock) */
	struct hyb_hybrid_params hy = {
		.device = "cpu", .policy = HYB_POLICY_STATIC, .gpu_budget = third_budget(m),
	};

	check_path("hybrid, CPU device", m, HYB_FFN_SPARSE, &hy);
	hyb_model_free(m);
}

/*
 * The policies that decide from time (tam-adaptive's bottleneck test and
 * the others' windows) on the CPU device's virtual clock (hyb/device.h):
 * host time is the CPU share's modelled work, so their decisions, and the
 * split of every FFN sum with them, are the same on every run.
 */
TEST(determinism_hybrid_time_policies_virtual_clock)
{
	static const enum hyb_policy pol[] = { HYB_POLICY_TAM_ADAPTIVE, HYB_POLICY_LRU,
					       HYB_POLICY_DYNAMIC };
	char src[512];
	struct hyb_model *m = load(plan_of_many_groups(src, sizeof(src)));

	for (size_t i = 0; i < sizeof(pol) / sizeof(pol[0]); i++) {
		struct hyb_hybrid_params hy = {
			.device = "cpu", .policy = pol[i], .gpu_budget = third_budget(m),
			.dev = { .virtual_clock = true },
		};
		char what[64];

		snprintf(what, sizeof(what), "hybrid %s, virtual clock", hyb_policy_name(pol[i]));
		check_path(what, m, HYB_FFN_SPARSE, &hy);
		/* the times the policies read are the same numbers on every run; the
		 * wall clock's are not */
		for (int v = 1; v >= 0; v--) {
			struct hyb_hybrid_stats st[2];

			hy.dev.virtual_clock = v;
			for (int r = 0; r < 2; r++) {
				size_t len;

				free(run_once(m, HYB_FFN_SPARSE, &hy, 2, &len, &st[r]));
			}
			CHECK_MSG(!v || (st[0].cpu_ffn_s == st[1].cpu_ffn_s &&
					 st[0].stall_s == st[1].stall_s && st[0].loads == st[1].loads),
				  "%s: cpu %.9g / %.9g s, stalls %.9g / %.9g s, loads %llu / %llu",
				  what, st[0].cpu_ffn_s, st[1].cpu_ffn_s, st[0].stall_s,
				  st[1].stall_s, (unsigned long long)st[0].loads,
				  (unsigned long long)st[1].loads);
			CHECK_MSG(v || st[0].cpu_ffn_s != st[1].cpu_ffn_s,
				  "%s: the wall clock gave the CPU share the same time twice", what);
		}
	}
	hyb_model_free(m);
}

TEST(determinism_powerinfer_file)
{
	char src[512], pi[512], log[512];
	struct hyb_model *m;
	int rc;

	hyb_test_need_venv();
	if (access(hyb_test_hybctl(), X_OK))
		SKIP("%s not built (run from the repository root after make)", hyb_test_hybctl());
	snprintf(src, sizeof(src), "%s/src.gguf", hyb_test_tmpdir());
	snprintf(pi, sizeof(pi), "%s/pi.gguf", hyb_test_tmpdir());
	snprintf(log, sizeof(log), "%s/make.log", hyb_test_tmpdir());
	/* wide enough that both threads are at work in each down_t call */
	rc = hyb_test_sh(log, "%s synth -o '%s' --hidden 512 --ffn 8192 --layers 2 --heads 8 "
			 "--vocab 512 --act relu --type F16 -t 1 && .venv/bin/python "
			 "tests/oracle/powerinfer_gguf.py '%s' '%s' --predictor random --hidden 32 "
			 "--type Q8_0", hyb_test_hybctl(), src, src, pi);
	if (rc)
		hyb_test_show_log(log);
	CHECK_MSG(rc == 0, "making the PowerInfer model failed (exit %d)", rc);
	m = load(pi);
	CHECK(m->powerinfer);
	check_path("PowerInfer file, dense", m, HYB_FFN_DENSE, NULL);
	/* its predictors on every token, the prompt's too, and the sparse operator */
	CHECK_MSG(check_path("PowerInfer file, sparse", m, HYB_FFN_SPARSE, NULL),
		  "a PowerInfer file's sparse decoding differs between 2 and 3 threads");
	hyb_model_free(m);
}
