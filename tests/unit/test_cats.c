// SPDX-License-Identifier: MIT
/*
 * CATS activation sparsity (hyb/sparsity.h, docs/SPARSITY.md): the masked
 * activation, the sparse operator under a threshold against a scalar
 * reference, calibration quantiles against exact ones, the thresholds'
 * way through profile, plan and context, and the bad inputs each step
 * refuses.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "forward/ops.h"
#include "hyb/gguf.h"
#include "hyb/hybrid.h"
#include "hyb/model.h"
#include "hyb/threadpool.h"
#include "hyb/profile.h"
#include "hyb/sparsity.h"
#include "hyb/testing.h"
#include "sparse/sparse_op.h"
#include "test.h"

static uint64_t rng = 0x243f6a8885a308d3ull;

static float urand(void) /* [-1, 1) */
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static float silu(float g)
{
	return g / (1.0f + expf(-g));
}

TEST(cats_act_masks_below_threshold)
{
	enum { N = 3000 };
	float *g = malloc(sizeof(float) * N), *u = malloc(sizeof(float) * N);
	float *ref = malloc(sizeof(float) * N), *out = malloc(sizeof(float) * N);
	uint32_t kept = 0;

	CHECK(g && u && ref && out);
	for (int i = 0; i < N; i++) {
		g[i] = 4 * urand();
		u[i] = urand();
	}
	/* threshold 0 is the dense activation, bit for bit */
	memcpy(ref, g, sizeof(float) * N);
	hyb_ffn_act(ref, u, N, HYB_ACT_SILU);
	memcpy(out, g, sizeof(float) * N);
	hyb_ffn_act_cats(out, u, N, HYB_ACT_SILU, 0.0f);
	CHECK(!memcmp(ref, out, sizeof(float) * N));
	/* above it: the dense value where |silu(g)| > thr, exactly 0 elsewhere */
	memcpy(out, g, sizeof(float) * N);
	hyb_ffn_act_cats(out, u, N, HYB_ACT_SILU, 0.5f);
	for (int i = 0; i < N; i++) {
		const bool keep = fabsf(silu(g[i])) > 0.5f;

		CHECK_MSG(out[i] == (keep ? ref[i] : 0.0f), "i %d: g %g -> %g (dense %g)", i,
			  (double)g[i], (double)out[i], (double)ref[i]);
		kept += keep;
	}
	CHECK(kept > N / 5 && kept < N - N / 5); /* the threshold cut somewhere inside */
	free(g);
	free(u);
	free(ref);
	free(out);
}

/* The sparse operator with a threshold against a scalar reference of the masked FFN. */
TEST(cats_sparse_op_matches_masked_reference)
{
	enum { E = 64, F = 256, GS = 32 };
	float *gate = malloc(sizeof(float) * F * E), *up = malloc(sizeof(float) * F * E);
	float *down = malloc(sizeof(float) * E * F), xn[E], y[E], ref[E] = { 0 };
	void *data = malloc(hyb_bundles_bytes(HYB_TYPE_F32, E, F));
	const void *ptrs[F / GS];
	struct hyb_ffn_bundles b;
	struct hyb_sparse_ffn_stats st;
	struct hyb_sparse_ffn_ctx *c = hyb_sparse_ffn_ctx_new(E, F, 2);
	struct hyb_threadpool *pool = hyb_threadpool_new(2);
	uint32_t list[F], above = 0;
	const float thr = 0.3f;
	char err[256];

	CHECK(gate && up && down && data && c && pool);
	for (int i = 0; i < F * E; i++) {
		gate[i] = urand() * 0.3f;
		up[i] = urand() * 0.3f;
		down[i] = urand() * 0.3f;
	}
	for (int e = 0; e < E; e++)
		xn[e] = urand();
	for (int i = 0; i < F; i++)
		list[i] = (uint32_t)i;
	CHECK_MSG(!hyb_bundles_build(HYB_TYPE_F32, E, F, GS, gate, up, down, NULL, data, err,
				     sizeof(err)), "%s", err);
	CHECK(!hyb_bundles_view(&b, HYB_TYPE_F32, E, F, GS, data, ptrs));
	for (int i = 0; i < F; i++) {
		double gd = 0, ud = 0;

		for (int e = 0; e < E; e++) {
			gd += (double)gate[(size_t)i * E + e] * xn[e];
			ud += (double)up[(size_t)i * E + e] * xn[e];
		}
		const double a = gd / (1 + exp(-gd));

		if (fabs(a) <= thr)
			continue;
		above++;
		for (int e = 0; e < E; e++)
			ref[e] += (float)(a * ud * down[(size_t)e * F + i]);
	}
	CHECK(above > F / 10 && above < F - F / 10);
	CHECK_MSG(!hyb_sparse_ffn_cats(c, pool, &b, HYB_ACT_SILU, xn, list, F, thr, y, &st), "%s",
		  hyb_sparse_ffn_error(c));
	CHECK_EQ_INT(st.n_gate, F);
	/* neurons within float rounding of the threshold may fall either way */
	CHECK_MSG(st.n_up + 2 >= above && st.n_up <= above + 2, "up %llu, above %u",
		  (unsigned long long)st.n_up, above);
	for (int e = 0; e < E; e++)
		CHECK_NEAR(y[e], ref[e], 1e-3 + 1e-3 * fabs(ref[e]));
	/* bad thresholds and a threshold on a ReLU FFN are refused, y untouched */
	y[0] = 12345.0f;
	CHECK(hyb_sparse_ffn_cats(c, pool, &b, HYB_ACT_SILU, xn, list, F, -1.0f, y, NULL) == -1);
	CHECK(hyb_sparse_ffn_cats(c, pool, &b, HYB_ACT_SILU, xn, list, F, NAN, y, NULL) == -1);
	CHECK(hyb_sparse_ffn_cats(c, pool, &b, HYB_ACT_RELU, xn, list, F, 0.1f, y, NULL) == -1);
	CHECK(strstr(hyb_sparse_ffn_error(c), "SiLU"));
	CHECK(y[0] == 12345.0f);
	hyb_threadpool_free(pool);
	hyb_sparse_ffn_ctx_free(c);
	free(gate);
	free(up);
	free(down);
	free(data);
}

static int cmp_float(const void *a, const void *b)
{
	const float x = *(const float *)a, y = *(const float *)b;

	return x < y ? -1 : x > y;
}

/* Calibration quantiles against the exact order statistics of what the probe saw. */
TEST(cats_calibration_quantiles)
{
	enum { L = 2, FF = 500, T = 40 };
	struct hyb_calib *cal = hyb_calib_new(L, FF);
	float *act = malloc(sizeof(float) * FF * T), *all = malloc(sizeof(float) * FF * T);
	float q[L * HYB_SPARSITY_N_QUANTILES];

	CHECK(cal && act && all);
	CHECK(hyb_calib_quantiles(cal, q) == -ENODATA); /* nothing seen yet */
	for (uint32_t l = 0; l < L; l++) {
		/* heavy-tailed, both signs, a few exact zeros: exp of a spread-out exponent */
		for (int i = 0; i < FF * T; i++) {
			const float v = expf(6 * urand() - (float)l);

			act[i] = i % 97 == 0 ? 0.0f : (i & 1 ? -v : v);
		}
		hyb_calib_probe(cal, l, 0, T, NULL, act);
		if (l == 0) /* layer 0 keeps these for the exact answer */
			for (int i = 0; i < FF * T; i++)
				all[i] = fabsf(act[i]);
	}
	CHECK(!hyb_calib_quantiles(cal, q));
	qsort(all, FF * T, sizeof(float), cmp_float);
	CHECK(q[0] == all[0]);
	CHECK(q[HYB_SPARSITY_N_QUANTILES - 1] == all[FF * T - 1]);
	for (int k = 5; k < 100; k += 5) {
		const float exact = all[(size_t)((double)k / 100 * (FF * T))];

		CHECK_MSG(fabsf(q[k] - exact) <= 0.01f * exact, "q%d %g, exact %g", k, (double)q[k],
			  (double)exact);
	}
	for (int k = 1; k < L * HYB_SPARSITY_N_QUANTILES; k++)
		if (k % HYB_SPARSITY_N_QUANTILES)
			CHECK(q[k] >= q[k - 1]);
	/* interpolation between percentiles */
	CHECK_NEAR(hyb_sparsity_quantile_at(q, 0.505), 0.5 * (q[50] + q[51]), 1e-6 * q[51]);
	hyb_calib_free(cal);
	free(act);
	free(all);
}

static const char *bin(void)
{
	const char *b = getenv("HYB_BUILD");

	return b && *b ? b : "build";
}

/* A small SiLU model, its CATS profile at sparsity 0.5 and a plan; each made once. */
static void make_silu(char *model, char *prof, char *plan, size_t cap)
{
	char log[600];

	if (access(hyb_test_hybctl(), X_OK))
		SKIP("%s not built", hyb_test_hybctl());
	snprintf(model, cap, "%s/silu.gguf", hyb_test_tmpdir());
	snprintf(prof, cap, "%s/silu.profile.gguf", hyb_test_tmpdir());
	snprintf(plan, cap, "%s/silu.plan.gguf", hyb_test_tmpdir());
	snprintf(log, sizeof(log), "%s/make.log", hyb_test_tmpdir());
	if (hyb_test_sh(log, "(%s synth -o %s --hidden 128 --ffn 512 --layers 3 --heads 4 "
			"--vocab 512 --act silu --type F16 -t 1 && "
			"%s profile %s --sparsity 0.5 --gen 24 --samples 400 -t 1 -o %s && "
			"%s plan %s --profile %s --gpu-budget 64M -o %s -t 1)",
			hyb_test_hybctl(), model, hyb_test_hybctl(), model, prof,
			hyb_test_hybctl(), model, prof, plan)) {
		hyb_test_show_log(log);
		CHECK_MSG(0, "synth/profile/plan of a SiLU model failed");
	}
}

/*
 * The profile's thresholds give the target sparsity on the profiled text;
 * the plan carries them; its dense (prompt) path, its sparse decode and the
 * source model with the profile's thresholds compute the same function.
 */
TEST(cats_profile_plan_decode)
{
	char model[512], prof[512], plan[512];
	struct hyb_profile *p;
	struct hyb_model *ms, *mp;
	struct hyb_ctx *cs, *cd, *cp;
	struct hyb_test_agreement a1 = { 0 }, a2 = { 0 };
	float thr[3];

	make_silu(model, prof, plan, sizeof(model));
	p = hyb_profile_load(prof);
	CHECK_MSG(p, "%s", hyb_last_error());
	CHECK(p->cats_threshold && p->cats_quantiles);
	CHECK_NEAR(p->target_sparsity, 0.5, 1e-6);
	for (uint32_t l = 0; l < p->n_layer; l++) {
		/* measured on the profiling pass's own continuations, not the calibration's */
		CHECK_MSG(fabs(p->layers[l].sparsity - 0.5) < 0.08, "layer %u sparsity %g", l,
			  p->layers[l].sparsity);
		CHECK(p->cats_threshold[l] > 0);
	}
	/* a profile's thresholds at another sparsity come from its quantiles */
	CHECK(!hyb_sparsity_thresholds(prof, 0.7, thr, 3));
	for (int l = 0; l < 3; l++)
		CHECK(thr[l] > p->cats_threshold[l]);
	CHECK(!hyb_sparsity_thresholds(prof, 0, thr, 3));
	CHECK(!memcmp(thr, p->cats_threshold, sizeof(thr)));

	ms = hyb_model_load(model);
	mp = hyb_model_load(plan);
	CHECK_MSG(ms && mp, "%s", hyb_last_error());
	CHECK(!ms->ffn_thr && mp->ffn_thr);
	CHECK(!memcmp(mp->ffn_thr, p->cats_threshold, sizeof(float) * 3));
	cs = hyb_test_ctx(ms, HYB_FFN_DENSE);
	cd = hyb_test_ctx(mp, HYB_FFN_DENSE);
	cp = hyb_test_ctx(mp, HYB_FFN_SPARSE);
	CHECK(hyb_ctx_ffn_thresholds(cd) && hyb_ctx_ffn_thresholds(cp));
	CHECK(!hyb_ctx_ffn_thresholds(cs));
	CHECK(!hyb_ctx_set_ffn_thresholds(cs, p->cats_threshold));
	hyb_test_greedy_compare(cs, cd, ms->hp.n_vocab, 7, 16, 40, 0, &a1);
	hyb_test_greedy_compare(cd, cp, ms->hp.n_vocab, 7, 16, 40, 0, &a2);
	fprintf(stderr, "source+thresholds vs plan dense: %u/%u greedy, max rel %.2g; "
		"plan dense vs sparse: %u/%u, max rel %.2g\n", a1.agree, a1.total, a1.max_rel,
		a2.agree, a2.total, a2.max_rel);
	CHECK(a1.agree >= a1.total - 2 && a2.agree >= a2.total - 2);
	CHECK(a2.max_rel < 0.02);
	{
		struct hyb_sparse_stats st;

		hyb_ctx_sparse_stats(cp, &st);
		CHECK(st.layer_steps > 0);
		/* decode skips about the target share (text differs from the profile's) */
		CHECK_MSG(fabs(1.0 - (double)st.nonzero / st.neurons - 0.5) < 0.15,
			  "decode sparsity %g", 1.0 - (double)st.nonzero / st.neurons);
	}
	/* and without thresholds the plan is the dense model again: much closer to the source */
	CHECK(!hyb_ctx_set_ffn_thresholds(cd, NULL));
	CHECK(!hyb_ctx_set_ffn_thresholds(cs, NULL));
	memset(&a1, 0, sizeof(a1));
	hyb_test_greedy_compare(cs, cd, ms->hp.n_vocab, 7, 16, 40, 0, &a1);
	fprintf(stderr, "without thresholds: %u/%u greedy, max rel %.2g\n", a1.agree, a1.total,
		a1.max_rel);
	CHECK(a1.agree == a1.total && a1.max_rel < 1e-3);
	hyb_ctx_free(cs);
	hyb_ctx_free(cd);
	hyb_ctx_free(cp);
	hyb_model_free(ms);
	hyb_model_free(mp);
	hyb_profile_free(p);
}

/* What each step refuses, with a message naming the reason. */
TEST(cats_bad_input)
{
	char model[512], prof[512], plan[512], log[600], glog[600], relu[600], relu_prof[600];
	struct hyb_model *m;
	struct hyb_ctx *c;
	float thr[3] = { 0.1f, -0.2f, 0.1f }, t4[4];

	make_silu(model, prof, plan, sizeof(model));
	snprintf(log, sizeof(log), "%s/bad.log", hyb_test_tmpdir());
	snprintf(glog, sizeof(glog), "%s/grep.log", hyb_test_tmpdir());
	m = hyb_model_load(model);
	CHECK(m);
	c = hyb_test_ctx(m, HYB_FFN_AUTO);
	CHECK(hyb_ctx_set_ffn_thresholds(c, thr) == -EINVAL);
	CHECK(strstr(hyb_last_error(), "layer 1"));
	thr[1] = INFINITY;
	CHECK(hyb_ctx_set_ffn_thresholds(c, thr) == -EINVAL);
	CHECK(!hyb_ctx_ffn_thresholds(c));
	hyb_ctx_free(c);
	/* a profile of another model (another layer count); a sparsity outside (0, 1) */
	CHECK(hyb_sparsity_thresholds(prof, 0.5, t4, 4) == -EINVAL);
	CHECK(strstr(hyb_last_error(), "another model"));
	CHECK(hyb_sparsity_thresholds(prof, 1.0, t4, 3) == -EINVAL);
	CHECK(hyb_sparsity_thresholds(model, 0.5, t4, 3) == -EINVAL); /* no quantiles */
	CHECK(strstr(hyb_last_error(), "--sparsity"));
	CHECK(hyb_sparsity_thresholds("/nonexistent.gguf", 0.5, t4, 3) == -ENOENT);
	hyb_model_free(m);

	/* hybctl profile: a sparsity outside (0, 1) */
	CHECK(hyb_test_sh(log, "%s profile %s --sparsity 1.5", hyb_test_hybctl(), model) == 2);
	CHECK(!hyb_test_sh(glog, "grep -q 'outside (0, 1)' %s", log));
	/* a ReLU model given --sparsity: said, and profiled with its own sparsity */
	snprintf(relu, sizeof(relu), "%s/relu.gguf", hyb_test_tmpdir());
	snprintf(relu_prof, sizeof(relu_prof), "%s/relu.profile.gguf", hyb_test_tmpdir());
	CHECK(!hyb_test_sh(log, "(%s synth -o %s --hidden 128 --ffn 512 --layers 3 --heads 4 "
			   "--vocab 512 --act relu --type F16 -t 1 && %s profile %s --sparsity 0.5 "
			   "--gen 24 --samples 400 -t 1 -o %s)", hyb_test_hybctl(), relu,
			   hyb_test_hybctl(), relu, relu_prof));
	CHECK(!hyb_test_sh(glog, "grep -q 'sparse as it is: --sparsity is ignored' %s", log));
	/* plans: a SiLU model with a profile without thresholds, a ReLU one with them */
	CHECK(hyb_test_sh(log, "%s plan %s --profile %s --gpu-budget 64M -o %s/x.gguf",
			  hyb_test_hybctl(), model, relu_prof, hyb_test_tmpdir()) != 0);
	CHECK(!hyb_test_sh(glog, "grep -q 'profile has no CATS thresholds' %s", log));
	CHECK(hyb_test_sh(log, "%s plan %s --profile %s --gpu-budget 64M -o %s/x.gguf",
			  hyb_test_hybctl(), relu, prof, hyb_test_tmpdir()) != 0);
	CHECK(!hyb_test_sh(glog, "grep -q 'profile has CATS thresholds' %s", log));
	/* hyb: --sparsity without --cats; --cats on a ReLU model */
	CHECK(hyb_test_sh(log, "%s/hyb run -m %s -p hi -n 2 --sparsity 0.4", bin(), model) == 1);
	CHECK(!hyb_test_sh(glog, "grep -q 'needs --cats' %s", log));
	CHECK(hyb_test_sh(log, "%s/hyb run -m %s -p hi -n 2 --cats %s", bin(), relu, prof) == 1);
	CHECK(!hyb_test_sh(glog, "grep -q 'ReLU-family' %s", log));
}

/*
 * Hybrid decoding of a CATS plan on the CPU-executed device: the predictor
 * steers the cache, and each side computes the gate of every neuron it
 * holds and skips up and down at or below the threshold - exact CATS split
 * in two. Greedy tokens follow the CPU's CATS decode (a neuron at the
 * threshold may fall either side of it in the two sides' arithmetic).
 */
TEST(cats_hybrid_cpu_device)
{
	char model[512], prof[512], plan[512];
	struct hyb_model *m;
	struct hyb_ctx *cp, *ch;
	struct hyb_test_agreement a = { 0 };
	struct hyb_hybrid_stats hs;
	struct hyb_hybrid_params hy = { .device = "cpu", .policy = HYB_POLICY_STATIC };
	struct hyb_ctx_params p = { .n_ctx = 256, .n_threads = 2, .ffn = HYB_FFN_SPARSE,
				    .hybrid = &hy };

	make_silu(model, prof, plan, sizeof(model));
	m = hyb_model_load(plan);
	CHECK_MSG(m, "%s", hyb_last_error());
	hy.gpu_budget = m->gguf->size * 2 / 3; /* the dense parts and some groups */
	ch = hyb_ctx_new(m, &p);
	CHECK_MSG(ch, "%s", hyb_last_error());
	CHECK(hyb_ctx_ffn_thresholds(ch));
	cp = hyb_test_ctx(m, HYB_FFN_SPARSE);
	hyb_test_greedy_compare(cp, ch, m->hp.n_vocab, 11, 16, 40, 0, &a);
	hyb_ctx_hybrid_stats(ch, &hs);
	fprintf(stderr, "hybrid vs CPU CATS: %u/%u greedy, max rel %.2g; %.1f%% of predicted "
		"neurons on the device\n", a.agree, a.total, a.max_rel,
		100.0 * hs.active_dev / (hs.active ? hs.active : 1));
	CHECK(hs.active_dev > 0 && hs.active_dev < hs.active); /* both sides computed */
	CHECK(a.agree >= a.total - 1 && a.max_rel < 0.05);
	hyb_ctx_free(cp);
	hyb_ctx_free(ch);
	hyb_model_free(m);
}

/* A plan of a small model of this arch (SiLU: a CATS profile at 0.5). */
static struct hyb_model *qwen_plan(const char *arch, const char *act)
{
	char model[512], prof[512], plan[512], log[600];
	struct hyb_model *m;

	snprintf(model, sizeof(model), "%s/%s-%s.gguf", hyb_test_tmpdir(), arch, act);
	snprintf(prof, sizeof(prof), "%s/%s-%s.profile.gguf", hyb_test_tmpdir(), arch, act);
	snprintf(plan, sizeof(plan), "%s/%s-%s.plan.gguf", hyb_test_tmpdir(), arch, act);
	snprintf(log, sizeof(log), "%s/%s-%s.log", hyb_test_tmpdir(), arch, act);
	if (hyb_test_sh(log, "(%s synth -o %s --arch %s --hidden 128 --ffn 512 --layers 3 "
			"--heads 4 --kv-heads 2 --vocab 512 %s%s --type Q8_0 -t 1 && "
			"%s profile %s %s --gen 24 --samples 400 -t 1 -o %s && "
			"%s plan %s --profile %s --gpu-budget 64M -o %s -t 1)",
			hyb_test_hybctl(), model, arch, strcmp(act, "gelu") ? "--act " : "",
			strcmp(act, "gelu") ? act : "", hyb_test_hybctl(), model,
			strcmp(act, "silu") && strcmp(act, "gelu") ? "" : "--sparsity 0.5", prof,
			hyb_test_hybctl(), model, prof, plan)) {
		hyb_test_show_log(log);
		CHECK_MSG(0, "synth/profile/plan of a %s %s model failed", arch, act);
	}
	m = hyb_model_load(plan);
	CHECK_MSG(m, "%s", hyb_last_error());
	CHECK(m->group_size > 0);
	CHECK(strcmp(arch, "qwen2") || m->layers[0].bq != NULL);
	CHECK(strcmp(arch, "qwen3") || m->layers[0].q_norm.data != NULL);
	return m;
}

/*
 * Plans of Qwen 2 and Qwen 3 models (q/k/v biases; per-head Q/K norms) and
 * of Phi-3 (gate and up fused in the file, q scaled before attention),
 * SiLU with a CATS profile as real models need, and of Gemma 3 (GeGLU,
 * sliding windows, norms after the blocks): the plan's dense and
 * sparse decoding agree. Hybrid decoding on the CPU device with every
 * attention block there (Qwen's biases and norms, Phi-3's and Gemma's
 * scaled q, Gemma's windows and norm after the block on the device,
 * hybrid/dense.c) gives the bits of the
 * same engine with attention on the CPU, in oracle mode (under CATS the
 * hybrid engine decodes from the predictor's lists, docs/SPARSITY.md, so
 * not the CPU-only decoder's exact set). A 40-token prompt as one batch on
 * the device (exact CATS there; Gemma's on the CPU) lands close to
 * CPU-only prefill.
 */
TEST(cats_plans_of_qwen_and_phi3_decode_sparse_and_hybrid)
{
	static const char *const arch[4] = { "qwen2", "qwen3", "phi3", "gemma3" };

	if (access(hyb_test_hybctl(), X_OK))
		SKIP("%s not built", hyb_test_hybctl());
	for (int a = 0; a < 4; a++) {
		struct hyb_test_agreement ag = { 0 };
		struct hyb_model *m = qwen_plan(arch[a], a == 3 ? "gelu" : "silu");
		struct hyb_ctx *cd, *cp;

		cd = hyb_test_ctx(m, HYB_FFN_DENSE);
		cp = hyb_test_ctx(m, HYB_FFN_SPARSE);
		hyb_test_greedy_compare(cd, cp, m->hp.n_vocab, 7, 16, 40, 0, &ag);
		fprintf(stderr, "    %s plan dense vs sparse: %u/%u greedy, max rel %.2g\n",
			arch[a], ag.agree, ag.total, ag.max_rel);
		/* (Q8_0: a neuron at the threshold can fall either side of it in the two paths) */
		CHECK(ag.agree >= ag.total - 2 && ag.max_rel < 0.05);
		hyb_ctx_free(cd);
		hyb_ctx_free(cp);
		hyb_model_free(m);
		m = qwen_plan(arch[a], a == 3 ? "gelu" : "silu");

		const uint32_t V = m->hp.n_vocab;
		float *lr = calloc((size_t)V * 41, sizeof(float)), *lh = calloc((size_t)V * 41,
										 sizeof(float));
		int32_t toks[40];

		CHECK(lr && lh);
		for (int i = 0; i < 40; i++)
			toks[i] = (int32_t)(3 + (uint32_t)(i * 2654435761u) % (V - 3));
		for (int oracle = 1; oracle >= 0; oracle--) {
			struct hyb_hybrid_params hy = { .device = "cpu", .policy = HYB_POLICY_STATIC,
							.gpu_budget = m->weight_bytes };
			struct hyb_ctx_params p = {
				.n_ctx = 64, .n_threads = 2, .ffn = HYB_FFN_SPARSE,
				.testing = oracle ? HYB_TESTING_FFN_ORACLE : 0,
			};
			struct hyb_hybrid_params host = hy;
			struct hyb_ctx *c, *h;
			struct hyb_hybrid_offload pl;
			struct hyb_hybrid_stats st;
			double d = 0, amax = 0;

			/* oracle: the same hybrid engine with attention on the CPU; else CPU-only */
			host.dense_on_cpu = true;
			p.hybrid = oracle ? &host : NULL;
			c = hyb_ctx_new(m, &p);
			p.hybrid = &hy;
			h = hyb_ctx_new(m, &p);
			CHECK_MSG(c && h, "%s", hyb_last_error());
			hyb_ctx_hybrid_offload(h, &pl);
			CHECK_EQ_INT(pl.attn_layers, m->hp.n_layer);
			/*
			 * oracle: 6 prompt tokens, then one at a time; else the 40 as a
			 * batch, thresholds off (a neuron at a threshold would move the
			 * logits by more than the arithmetic does)
			 */
			if (!oracle)
				CHECK(!hyb_ctx_set_ffn_thresholds(c, NULL) &&
				      !hyb_ctx_set_ffn_thresholds(h, NULL));
			CHECK(!hyb_ctx_eval(c, toks, oracle ? 6 : 40, lr, false));
			CHECK(!hyb_ctx_eval(h, toks, oracle ? 6 : 40, lh, false));
			for (int t = 1; oracle && t <= 30; t++) {
				CHECK(!hyb_ctx_eval(c, &toks[5 + t], 1, lr + (size_t)t * V, false));
				CHECK(!hyb_ctx_eval(h, &toks[5 + t], 1, lh + (size_t)t * V, false));
			}
			hyb_ctx_hybrid_stats(h, &st);
			if (oracle) {
				int first = -1;

				for (int r = 0; r < 31 && first < 0; r++)
					if (memcmp(lr + (size_t)r * V, lh + (size_t)r * V, 4ull * V))
						first = r;
				CHECK_MSG(first < 0, "%s: hybrid decoding with attention on the device "
					  "is not the bits of attention on the CPU from row %d (0: the "
					  "prompt)", arch[a], first);
				CHECK(st.tokens == 30 && st.active_dev > 0);
			} else {
				/* Gemma's norm after the FFN: its prompts run on the CPU
				 * (ffn_hybrid.c prefill_cpu) */
				CHECK_EQ_INT(st.prompt_batches, a == 3 ? 0 : 1);
				for (uint32_t v = 0; v < V; v++) {
					amax = fmax(amax, fabs(lr[v]));
					d = fmax(d, fabs(lr[v] - lh[v]));
				}
				fprintf(stderr, "    %s: a 40-token prompt %s: logits within %.2g "
					"of the largest\n", arch[a], a == 3 ? "on the CPU" :
					"batched on the device", d / amax);
				CHECK(d < 1e-3 * amax && hyb_test_argmax(lr, V) == hyb_test_argmax(lh, V));
			}
			hyb_ctx_free(c);
			hyb_ctx_free(h);
		}
		free(lr);
		free(lh);
		hyb_model_free(m);
	}
}

/*
 * A Gemma 3 plan (GeGLU, norms after attention and the FFN, sliding
 * windows) with a CATS profile: the sparse operator computes h as the dense
 * pass does (ggml's F16 GELU table) and skips |gelu(gate)| <= thr as the
 * dense CATS pass does, so the plan's sparse decoding agrees with its dense
 * decoding, and hybrid decoding on the CPU device with it.
 */
TEST(cats_gemma3_plan_decodes_sparse)
{
	struct hyb_test_agreement ag = { 0 };
	struct hyb_model *m;
	struct hyb_ctx *cd, *cp;
	struct hyb_sparse_stats st;

	if (access(hyb_test_hybctl(), X_OK))
		SKIP("%s not built", hyb_test_hybctl());
	m = qwen_plan("gemma3", "gelu");
	CHECK_EQ_INT(m->hp.act, HYB_ACT_GELU);
	cd = hyb_test_ctx(m, HYB_FFN_DENSE);
	cp = hyb_test_ctx(m, HYB_FFN_SPARSE);
	CHECK(hyb_ctx_sparse(cp));
	hyb_test_greedy_compare(cd, cp, m->hp.n_vocab, 7, 16, 40, 0, &ag);
	hyb_ctx_sparse_stats(cp, &st);
	printf("    gemma3 plan dense vs sparse: %u/%u greedy, max rel %.2g; %.1f%% of neurons "
	       "computed\n", ag.agree, ag.total, ag.max_rel, 100.0 * st.nonzero / st.neurons);
	CHECK(ag.agree >= ag.total - 2 && ag.max_rel < 0.05);
	/* CATS at 0.5: about half the neurons skipped */
	CHECK(st.nonzero < 0.7 * st.neurons && st.nonzero > 0.3 * st.neurons);
	hyb_ctx_free(cd);
	hyb_ctx_free(cp);
	/* hybrid on the CPU device: the device's share of GeGLU as the CPU computes it */
	for (int pol = 0; pol < 2; pol++) {
		struct hyb_hybrid_params hy = { .device = "cpu",
						.policy = pol ? HYB_POLICY_TAM_ADAPTIVE :
						HYB_POLICY_STATIC,
						.gpu_budget = m->gguf->size * 2 / 3 };
		struct hyb_ctx_params p = { .n_ctx = 256, .n_threads = 2, .ffn = HYB_FFN_SPARSE,
					    .hybrid = &hy };
		struct hyb_hybrid_stats hs;
		struct hyb_ctx *ch = hyb_ctx_new(m, &p);

		CHECK_MSG(ch, "%s", hyb_last_error());
		cp = hyb_test_ctx(m, HYB_FFN_SPARSE);
		memset(&ag, 0, sizeof(ag));
		hyb_test_greedy_compare(cp, ch, m->hp.n_vocab, 7, 16, 40, 0, &ag);
		hyb_ctx_hybrid_stats(ch, &hs);
		printf("    gemma3 plan hybrid (%s) vs CPU CATS: %u/%u greedy, max rel %.2g; %.1f%% "
		       "of listed neurons on the device\n", hyb_policy_name(hy.policy), ag.agree,
		       ag.total, ag.max_rel, 100.0 * hs.active_dev / (hs.active ? hs.active : 1));
		CHECK(hs.active_dev > 0 && hs.active_dev < hs.active);
		CHECK(ag.agree >= ag.total - 1 && ag.max_rel < 0.05);
		hyb_ctx_free(cp);
		hyb_ctx_free(ch);
	}
	hyb_model_free(m);
}
