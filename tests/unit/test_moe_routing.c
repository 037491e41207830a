// SPDX-License-Identifier: MIT
/*
 * The routing design of `hybctl synth --experts` (tools/hybctl/synth_moe.c)
 * measured by `hybctl profile` (tools/hybctl/profile_moe.c) end to end: the
 * designed model's own text is routed with the skew, reuse, co-selection and
 * drift the design states, and a --routing random file of the same shape is
 * not (so each check can fail). Then the profile's file format, synth's
 * thread independence and flags, and hybctl plan's refusal of MoE.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hyb/gguf.h"
#include "hyb/tensor_type.h"
#include "test.h"

#define SHAPE "--arch qwen3moe --hidden 256 --ffn 512 --layers 2 --heads 4 --vocab 512 " \
	      "--experts 64 --experts-used 8 --expert-ffn 32 --seed 7"
#define N_LAYER 2
#define N_EXPERT 64
#define K_USED 8

static const char *build_dir(void)
{
	const char *b = getenv("HYB_BUILD");

	return b && *b ? b : "build";
}

static int run(const char *fmt, const char *a, const char *b, const char *c)
{
	char cmd[2048];

	snprintf(cmd, sizeof(cmd), fmt, build_dir(), a, b, c);
	return system(cmd);
}

static void tmp(char *buf, size_t n, const char *name)
{
	snprintf(buf, n, "%s/%s", hyb_test_tmpdir(), name);
}

struct stats {
	double top10[N_LAYER], max_mean[N_LAYER], reuse1[N_LAYER], indep[N_LAYER];
	double lift[N_LAYER], drift[N_LAYER], hit_static[N_LAYER], hit_lru[N_LAYER];
	double freq_sum[N_LAYER];
	uint64_t n_tokens;
};

static void arr(const struct hyb_gguf_file *f, const char *key, double *out, uint64_t n,
		uint64_t stride)
{
	char k[96];
	const struct hyb_gguf_kv *kv;

	snprintf(k, sizeof(k), "hyb.moe_profile.%s", key);
	kv = hyb_gguf_get_arr(f, k, HYB_GGUF_VT_FLOAT64);
	CHECK_MSG(kv && kv->v.arr.n == n * stride, "%s missing or of the wrong length", k);
	for (uint64_t i = 0; i < n; i++)
		memcpy(&out[i], (const char *)kv->v.arr.data + i * stride * 8, 8);
}

/* synth with ROUTING, profile its own text, read the profile file back. */
static void synth_profile(const char *routing, struct stats *s)
{
	char model[512], prof[512], name[64];
	struct hyb_gguf_file *f;
	uint32_t u;

	snprintf(name, sizeof(name), "moe-%s.gguf", routing);
	tmp(model, sizeof(model), name);
	snprintf(name, sizeof(name), "moe-%s.prof.gguf", routing);
	tmp(prof, sizeof(prof), name);
	CHECK_MSG(run("%s/hybctl synth -o %s " SHAPE " --routing %s -t 2 >/dev/null", model,
		      routing, "") == 0, "synth --routing %s failed", routing);
	/* 20 built-in prompts, 128 tokens of the model's own text after each */
	CHECK_MSG(run("%s/hybctl profile %s --gen 128 -t 2 -o %s >/dev/null 2>&1", model, prof,
		      "") == 0, "profile of %s failed", model);
	CHECK_MSG(!hyb_gguf_open(prof, &f), "%s", hyb_last_error());
	CHECK(hyb_gguf_get_u32(f, "hyb.moe_profile.n_layer", &u) && u == N_LAYER);
	CHECK(hyb_gguf_get_u32(f, "hyb.moe_profile.n_expert", &u) && u == N_EXPERT);
	CHECK(hyb_gguf_get_u32(f, "hyb.moe_profile.n_expert_used", &u) && u == K_USED);
	CHECK(hyb_gguf_get_u32(f, "hyb.moe_profile.n_seqs", &u) && u == 20);
	{
		const struct hyb_gguf_kv *kv = hyb_gguf_find(f, "hyb.moe_profile.n_tokens");

		CHECK(kv && kv->type == HYB_GGUF_VT_UINT64);
		s->n_tokens = kv->v.u64;
	}
	/* each prompt (>= 5 tokens) and its generated tokens, but for the last sampled */
	CHECK_MSG(s->n_tokens >= 20 * (5 + 127) && s->n_tokens < 20 * (64 + 128),
		  "%llu tokens routed", (unsigned long long)s->n_tokens);
	arr(f, "top10_share", s->top10, N_LAYER, 1);
	arr(f, "max_mean", s->max_mean, N_LAYER, 1);
	arr(f, "reuse", s->reuse1, N_LAYER, 8);
	arr(f, "reuse_indep", s->indep, N_LAYER, 1);
	arr(f, "lift_top", s->lift, N_LAYER, 1);
	arr(f, "drift_jaccard", s->drift, N_LAYER, 1);
	arr(f, "hit_static", s->hit_static, N_LAYER, 1);
	arr(f, "hit_lru", s->hit_lru, N_LAYER, 1);
	for (uint32_t l = 0; l < N_LAYER; l++) {
		char nm[64];
		const struct hyb_gguf_tensor *t;
		double sum = 0;

		snprintf(nm, sizeof(nm), "blk.%u.expert_freq", l);
		t = hyb_gguf_find_tensor(f, nm);
		CHECK_MSG(t && t->type == HYB_TYPE_F32 && t->n_dims == 1 && t->ne[0] == N_EXPERT,
			  "%s missing or of the wrong shape", nm);
		for (uint32_t e = 0; e < N_EXPERT; e++) {
			float v;

			memcpy(&v, (const char *)t->data + 4 * e, 4);
			CHECK(v >= 0 && v <= 1);
			sum += v;
		}
		s->freq_sum[l] = sum;
	}
	hyb_gguf_close(f);
}

TEST(moe_routing_designed_like_real_models_random_not)
{
	struct stats d, r;
	const double chance = (double)K_USED / N_EXPERT;

	if (access("build/hybctl", X_OK) && !getenv("HYB_BUILD"))
		SKIP("build/hybctl not built (run from the repository root after make)");
	synth_profile("real", &d);
	synth_profile("random", &r);
	for (int l = 0; l < N_LAYER; l++) {
		fprintf(stderr, "  layer %d  real: top10 %.3f max/mean %.2f reuse %.3f (indep %.3f) "
			"lift %.2f drift %.3f static %.3f lru %.3f\n"
			"           random: top10 %.3f max/mean %.2f reuse %.3f (indep %.3f) "
			"lift %.2f drift %.3f static %.3f lru %.3f\n", l, d.top10[l],
			d.max_mean[l], d.reuse1[l], d.indep[l], d.lift[l], d.drift[l],
			d.hit_static[l], d.hit_lru[l], r.top10[l], r.max_mean[l], r.reuse1[l],
			r.indep[l], r.lift[l], r.drift[l], r.hit_static[l], r.hit_lru[l]);
		/* a token's frequencies sum to the K experts it chose */
		CHECK_NEAR(d.freq_sum[l], K_USED, 1e-3);
		CHECK_NEAR(r.freq_sum[l], K_USED, 1e-3);
		/* (a) skew: the top 10% of experts take 2-4.5x their uniform share */
		CHECK_MSG(d.top10[l] >= 0.2 && d.top10[l] <= 0.45 && d.max_mean[l] >= 2.5,
			  "layer %d: top 10%% share %.3f, max/mean %.2f", l, d.top10[l],
			  d.max_mean[l]);
		CHECK_MSG(r.top10[l] < 0.2, "random layer %d: top 10%% share %.3f", l, r.top10[l]);
		/* (b) reuse at distance 1: 2.5x chance, well above independent tokens of the
		 * same popularity */
		CHECK_MSG(d.reuse1[l] >= 2.5 * chance && d.reuse1[l] >= d.indep[l] + 0.1,
			  "layer %d: reuse %.3f (chance %.3f, independent %.3f)", l, d.reuse1[l],
			  chance, d.indep[l]);
		CHECK_MSG(r.reuse1[l] < r.indep[l] + 0.1 && r.reuse1[l] < 2 * chance,
			  "random layer %d: reuse %.3f (independent %.3f)", l, r.reuse1[l],
			  r.indep[l]);
		/* (c) co-selection: the top pairs 5x independence, well above random's top */
		CHECK_MSG(d.lift[l] >= 5 && d.lift[l] >= 2 * r.lift[l],
			  "layer %d: top-pair lift %.2f (random %.2f)", l, d.lift[l], r.lift[l]);
		/* (d) drift: halves of a generation differ, and an LRU cache of 2K experts beats
		 * a static one of the profile's 2K most popular */
		CHECK_MSG(d.drift[l] < 0.6, "layer %d: drift jaccard %.3f", l, d.drift[l]);
		CHECK_MSG(d.hit_lru[l] > d.hit_static[l] + 0.02, "layer %d: LRU %.3f, static %.3f",
			  l, d.hit_lru[l], d.hit_static[l]);
		CHECK_MSG(r.hit_lru[l] < r.hit_static[l], "random layer %d: LRU %.3f, static %.3f",
			  l, r.hit_lru[l], r.hit_static[l]);
	}
}

TEST(moe_routing_synth_flags_and_thread_independence)
{
	char a[512], b[512];

	if (access("build/hybctl", X_OK) && !getenv("HYB_BUILD"))
		SKIP("build/hybctl not built (run from the repository root after make)");
	tmp(a, sizeof(a), "moe-t1.gguf");
	tmp(b, sizeof(b), "moe-t2.gguf");
	/* a pure function of (seed, tensor, row): the same bytes for any thread count */
	CHECK(run("%s/hybctl synth -o %s " SHAPE " --topics 8 -t 1 %s%s >/dev/null", a, "", "") == 0);
	CHECK(run("%s/hybctl synth -o %s " SHAPE " --topics 8 -t 2 %s%s >/dev/null", b, "", "") == 0);
	CHECK_MSG(run("%.0scmp -s %s %s%s", a, b, "") == 0, "-t 1 and -t 2 wrote different files");
	/* the design changes the file; --random-weights is --routing random */
	CHECK(run("%s/hybctl synth -o %s " SHAPE " --random-weights -t 2 %s>/dev/null", b, "", "") == 0);
	CHECK(run("%.0scmp -s %s %s%s", a, b, "") != 0);
	CHECK(run("%s/hybctl synth -o %s " SHAPE " --routing fancy %s%s 2>/dev/null", a, "", "") != 0);
	CHECK(run("%s/hybctl synth -o %s --routing real %s%s 2>/dev/null", a, "", "") != 0);
	CHECK(run("%s/hybctl synth -o %s " SHAPE " --routing random --topics 8 %s%s 2>/dev/null", a,
		  "", "") != 0);
}

static int stderr_has(const char *path, const char *what)
{
	char buf[4096];
	FILE *f = fopen(path, "r");
	size_t n;

	if (!f)
		return 0;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	buf[n] = 0;
	fclose(f);
	return strstr(buf, what) != NULL;
}

TEST(moe_routing_plan_refused)
{
	char model[512], prof[512], err[512], plan[512];

	if (access("build/hybctl", X_OK) && !getenv("HYB_BUILD"))
		SKIP("build/hybctl not built (run from the repository root after make)");
	tmp(model, sizeof(model), "moe-plan.gguf");
	tmp(prof, sizeof(prof), "moe-plan.prof.gguf");
	tmp(err, sizeof(err), "moe-plan.err");
	tmp(plan, sizeof(plan), "moe-plan.plan");
	CHECK(run("%s/hybctl synth -o %s " SHAPE " --layers 1 -t 2 %s%s>/dev/null", model, "",
		  "") == 0);
	CHECK(run("%s/hybctl profile %s --gen 8 -t 2 -o %s >/dev/null 2>&1", model, prof, "") == 0);
	{
		char cmd[4096];

		snprintf(cmd, sizeof(cmd), "%s/hybctl plan %s --profile %s --gpu-budget 1G -o %s "
			 "2>%s", build_dir(), model, prof, plan, err);
		/* a routing profile */
		CHECK(system(cmd) != 0);
		CHECK(stderr_has(err, "routing profile: plans for MoE models do not exist yet"));
		/* a MoE model, whatever the profile */
		snprintf(cmd, sizeof(cmd), "%s/hybctl plan %s --profile %s --gpu-budget 1G -o %s "
			 "2>%s", build_dir(), model, model, plan, err);
		CHECK(system(cmd) != 0);
		CHECK(stderr_has(err, "mixture of 64 experts: plans for MoE models do not exist"));
		CHECK(access(plan, F_OK) != 0);
	}
	/* --sparsity (CATS) does not apply to MoE models: said, not ignored */
	CHECK(run("%s/hybctl profile %s --sparsity 0.5 -o %s 2>/dev/null >&2", model, prof, "") != 0);
}
