// SPDX-License-Identifier: MIT
/*
 * Hybrid decoding of plain models (libhyb/hybrid/plain_hybrid.h,
 * docs/HYBRID.md "Plain models"): attention blocks, head and whole FFNs on
 * the CPU device, the rest on the CPU; the CPU's bits at every budget and
 * both placements, across prompts and decode steps; TEAL's thresholds on
 * the CPU's share, one sequence or several; the refusals.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hyb/hyb.h"
#include "hyb/sparsity.h"
#include "test.h"

#define SMALL "--hidden 128 --ffn 512 --layers 4 --heads 4 --vocab 512 --seed 3"
#define N_PROMPT 6
#define N_GEN 12

/*
 * A prompt, N_GEN greedy steps, a second prompt of 3 tokens, 2 more steps:
 * every step's logits into lg[N_GEN + 4][n_vocab] (the prompts' last rows
 * where they fall).
 */
static int decode(struct hyb_model *m, const struct hyb_hybrid_params *hy, const float *thr,
		  float *lg, struct hyb_hybrid_stats *st, struct hyb_hybrid_offload *pl)
{
	struct hyb_ctx_params cp = { .n_ctx = 64, .n_threads = 2, .hybrid = hy };
	struct hyb_ctx *c = hyb_ctx_new(m, &cp);
	const uint32_t V = m->hp.n_vocab;
	int32_t toks[N_PROMPT], t;
	float *row = lg;

	if (!c)
		return -1;
	if (thr && hyb_ctx_set_teal_thresholds(c, thr)) {
		hyb_ctx_free(c);
		return -1;
	}
	for (int i = 0; i < N_PROMPT; i++)
		toks[i] = 3 + (int32_t)((i * 40503u) % (V - 3));
	if (hyb_ctx_eval(c, toks, N_PROMPT, row, false))
		goto fail;
	for (int g = 0; g < N_GEN; g++, row += V) {
		t = hyb_test_argmax(row, V);
		if (hyb_ctx_eval(c, &t, 1, row + V, false))
			goto fail;
	}
	/* a second prompt after decode steps: the device's KV rows come to the host */
	toks[0] = hyb_test_argmax(row, V);
	toks[1] = 17;
	toks[2] = 42;
	row += V;
	if (hyb_ctx_eval(c, toks, 3, row, false))
		goto fail;
	for (int g = 0; g < 2; g++, row += V) {
		t = hyb_test_argmax(row, V);
		if (hyb_ctx_eval(c, &t, 1, row + V, false))
			goto fail;
	}
	if (st)
		hyb_ctx_hybrid_stats(c, st);
	if (pl)
		hyb_ctx_hybrid_offload(c, pl);
	hyb_ctx_free(c);
	return 0;
fail:
	hyb_ctx_free(c);
	return -1;
}

/*
 * Budgets from nothing but attention to everything, both placements: the
 * CPU-only decode's logits bit for bit (the CPU device runs the CPU's
 * kernels), the parts placed growing with the budget.
 */
static void decodes_the_cpu_bits(const char *path)
{
	struct hyb_model *m = hyb_model_load(path);
	const double frac[] = { 0.15, 0.4, 0.7, 1.0, 2.0 };
	const enum hyb_policy pol[] = { HYB_POLICY_STATIC, HYB_POLICY_LAYER };
	const size_t n = (size_t)(N_GEN + 4) * 512;
	float *ref = malloc(sizeof(float) * n), *lg = malloc(sizeof(float) * n);
	bool some_ffn = false, all_ffn = false, partial_layer = false, prompt_dev = false;

	CHECK_MSG(m, "%s", hyb_last_error());
	CHECK(ref && lg && m->hp.n_vocab == 512);
	CHECK(!decode(m, NULL, NULL, ref, NULL, NULL));
	for (size_t p = 0; p < 2; p++) {
		uint32_t last_att = 0, last_ffn = 0;

		for (size_t i = 0; i < sizeof(frac) / sizeof(frac[0]); i++) {
			struct hyb_hybrid_params hy = {
				.device = "cpu", .policy = pol[p],
				.gpu_budget = (uint64_t)(m->weight_bytes * frac[i]),
			};
			struct hyb_hybrid_stats st;
			struct hyb_hybrid_offload pl;
			int first = -1;

			CHECK_MSG(!decode(m, &hy, NULL, lg, &st, &pl), "%s %.2f: %s",
				  hyb_policy_name(pol[p]), frac[i], hyb_last_error());
			for (size_t j = 0; j < n && first < 0; j++)
				if (memcmp(&ref[j], &lg[j], sizeof(float)))
					first = (int)(j / 512);
			CHECK_MSG(first < 0, "%s at %.0f%%: step %d's logits differ from the CPU's",
				  hyb_policy_name(pol[p]), 100 * frac[i], first);
			CHECK(pl.plain && !pl.experts && pl.cache_bytes == 0);
			CHECK(pl.attn_layers >= last_att && pl.ffn_layers >= last_ffn);
			if (pol[p] == HYB_POLICY_LAYER)
				CHECK_MSG(pl.attn_layers == pl.ffn_layers, "layer: %u attention, %u FFNs",
					  pl.attn_layers, pl.ffn_layers);
			last_att = pl.attn_layers;
			last_ffn = pl.ffn_layers;
			some_ffn |= pl.ffn_layers > 0 && pl.ffn_layers < m->hp.n_layer;
			all_ffn |= pl.ffn_layers == m->hp.n_layer && pl.head;
			partial_layer |= pol[p] == HYB_POLICY_LAYER && pl.ffn_layers > 0 &&
					 pl.ffn_layers < m->hp.n_layer;
			CHECK_EQ_INT(st.tokens, N_GEN + 2);
			/* the device FFNs' kernels timed by its clock; at most their in and out
			 * cross the link a step (none where the residual stays on the device) */
			CHECK(!pl.ffn_layers == !(st.dev_kernel_s > 0));
			CHECK(st.critical_bytes <= st.tokens * pl.ffn_layers * 128 * 4 * 2);
			/* both prompts batched on the device where the budget left room */
			CHECK_EQ_INT(st.prompt_batches, pl.prompt_batch ? 2 : 0);
			prompt_dev |= pl.prompt_batch > 0;
			fprintf(stderr, "%s %3.0f%%: attention %u, FFNs %u, head %d, %.2f MB, "
				"prompt batch %u\n", hyb_policy_name(pol[p]), 100 * frac[i],
				pl.attn_layers, pl.ffn_layers, pl.head,
				(pl.dense_bytes + pl.ffn_bytes) / 1e6, pl.prompt_batch);
		}
	}
	CHECK(some_ffn && all_ffn && partial_layer && prompt_dev);
	free(ref);
	free(lg);
	hyb_model_free(m);
}

TEST(plain_hybrid_cpu_device_decodes_the_cpu_bits)
{
	decodes_the_cpu_bits(hyb_test_synth("plain", SMALL " --act silu --type Q8_0"));
}

/*
 * Other layouts, the CPU's bits as llama's: Gemma 3 (GeGLU FFNs through
 * hyb_device_ffn_act; attention with sliding windows of 8 positions, which
 * the 20 decoded pass, a scaled q and a norm after the block, its own RoPE
 * base in the window layers; the norm after the FFN on the host), Phi-3's
 * LongRoPE factors, Qwen 2's biases, and a ReLU model's FFNs.
 */
TEST(plain_hybrid_other_layouts_decode_the_cpu_bits)
{
	decodes_the_cpu_bits(hyb_test_synth("plain-gemma3", SMALL " --arch gemma3 --swa 8 "
					    "--type Q8_0"));
	decodes_the_cpu_bits(hyb_test_synth("plain-phi3", SMALL " --arch phi3 --rope-scaling "
					    "longrope --rope-orig-ctx 32 --type Q8_0"));
	decodes_the_cpu_bits(hyb_test_synth("plain-qwen2", SMALL " --arch qwen2 --type Q8_0"));
	decodes_the_cpu_bits(hyb_test_synth("plain-relu", SMALL " --act relu --type Q8_0"));
}

/*
 * The same tokens, teacher-forced: a prompt of N_PROMPT (singly: token by
 * token, as decode steps), then one token a step; each step's logits into
 * lg[N_GEN][n_vocab].
 */
static int forced(struct hyb_model *m, const struct hyb_hybrid_params *hy, const float *thr,
		  const int32_t *toks, bool singly, float *lg)
{
	struct hyb_ctx_params cp = { .n_ctx = 64, .n_threads = 2, .hybrid = hy };
	struct hyb_ctx *c = hyb_ctx_new(m, &cp);
	const uint32_t V = m->hp.n_vocab;
	int rc = -1;

	if (!c || (thr && hyb_ctx_set_teal_thresholds(c, thr)))
		goto out;
	for (int t = 0; t < (singly ? N_PROMPT : 1); t++)
		if (hyb_ctx_eval(c, toks + t, singly ? 1 : N_PROMPT, lg, false))
			goto out;
	for (int g = 1; g < N_GEN; g++)
		if (hyb_ctx_eval(c, &toks[N_PROMPT + g - 1], 1, lg + (size_t)g * V, false))
			goto out;
	rc = 0;
out:
	hyb_ctx_free(c);
	return rc;
}

/* Mean over `steps` steps of |a - b| / |b| (L2 norms of each step's logits). */
static double rel_dist_n(const float *a, const float *b, uint32_t V, int steps)
{
	double sum = 0;

	for (int g = 0; g < steps; g++) {
		double d = 0, n = 0;

		for (uint32_t v = 0; v < V; v++) {
			const double x = a[(size_t)g * V + v], y = b[(size_t)g * V + v];

			d += (x - y) * (x - y);
			n += y * y;
		}
		sum += sqrt(d / n);
	}
	return sum / steps;
}

/* The same over the N_GEN steps. */
static double rel_dist(const float *a, const float *b, uint32_t V)
{
	return rel_dist_n(a, b, V, N_GEN);
}

/*
 * The real Gemma 3 270M (tests/data/fetch-models.sh) in hyb bench: at 40%
 * every attention block (sliding windows, scaled q, norms after the
 * blocks) and every GeGLU FFN goes to the device, not the head (a
 * 262144-token vocabulary), both placements decoding the CPU's greedy
 * tokens; at 1% the first layer does not fit, so layer is left out, said,
 * and static runs alone.
 */
TEST(plain_hybrid_gemma3_270m_on_the_device)
{
	const char *gemma = hyb_test_real_model("gemma3");
	char log[600], glog[700];

	snprintf(log, sizeof(log), "%s/gemma-bench.log", hyb_test_tmpdir());
	snprintf(glog, sizeof(glog), "%s/gemma-grep.log", hyb_test_tmpdir());
	CHECK_EQ_INT(hyb_test_sh(log, "build/hyb bench -m %s --gpu-budget 40%% -p 4 -n 6 -r 1 -t 2",
				 gemma), 0);
	CHECK_MSG(!hyb_test_sh(glog, "test $(grep -Ec '^(static|layer) .* 18\\+18f .* "
			       "100\\.0%%' %s) = 2", log),
		  "not both placements with 18 layers on the device and the CPU's tokens");
	CHECK_EQ_INT(hyb_test_sh(log, "build/hyb bench -m %s --gpu-budget 1%% -p 4 -n 6 -r 1 -t 2",
				 gemma), 0);
	CHECK(!hyb_test_sh(glog, "grep -q 'note: layer left out: .*holds no part' %s", log));
	CHECK(!hyb_test_sh(glog, "grep -Eq '^static .* 100\\.0%%' %s", log));
	CHECK(hyb_test_sh(glog, "grep -q '^layer ' %s", log) == 1);
}

/* TEAL's thresholds of path's model at the profile's sparsity 0.4, malloc'd. */
static float *teal_thresholds(const char *path, const struct hyb_model *m)
{
	char prof[700], log[700];
	float *thr = malloc(sizeof(float) * m->hp.n_layer * HYB_TEAL_INPUTS);

	snprintf(prof, sizeof(prof), "%s.teal.gguf", path);
	snprintf(log, sizeof(log), "%s/plain-teal.log", hyb_test_tmpdir());
	CHECK(thr);
	CHECK_EQ_INT(hyb_test_sh(log, "%s profile %s --teal --sparsity 0.4 --gen 16 -t 1 -o %s",
				 hyb_test_hybctl(), path, prof), 0);
	CHECK(!hyb_sparsity_teal_thresholds(prof, 0, thr, m->hp.n_layer));
	return thr;
}

/*
 * TEAL's thresholds on both sides (docs/SPARSITY.md#teal): the CPU's share
 * runs forward.c's TEAL, the device's attention blocks and FFNs
 * hyb_device_teal_matvec over TEAL's transposed weights (on the CPU device
 * the CPU's TEAL GEMV): decoded token by token, the CPU-only TEAL decode's
 * bits with every part on the device and with the FFNs alone there; a
 * prompt batched through the device near the CPU's; the thresholds cleared,
 * the dense bits; the CPU's FFNs' inputs counted per step.
 */
TEST(plain_hybrid_teal_on_both_sides)
{
	const char *path = hyb_test_synth("plain", SMALL " --act silu --type Q8_0");
	struct hyb_model *m;
	float *thr, *dense, *teal, *hyb, *all;
	struct hyb_hybrid_params hy = { .device = "cpu", .policy = HYB_POLICY_STATIC };
	struct hyb_hybrid_offload pl;
	int32_t toks[N_PROMPT + N_GEN];
	double d_teal, d_hyb;
	const size_t n = (size_t)N_GEN * 512;

	m = hyb_model_load(path);
	CHECK_MSG(m, "%s", hyb_last_error());
	thr = teal_thresholds(path, m);
	dense = malloc(sizeof(float) * n);
	teal = malloc(sizeof(float) * n);
	hyb = malloc(sizeof(float) * n);
	all = malloc(sizeof(float) * n);
	CHECK(dense && teal && hyb && all);
	/* the dense model's greedy tokens, then everyone on them */
	{
		float *lg = malloc(sizeof(float) * (N_GEN + 4) * 512);

		CHECK(lg && !decode(m, NULL, NULL, lg, NULL, NULL));
		for (int i = 0; i < N_PROMPT; i++)
			toks[i] = 3 + (int32_t)((i * 40503u) % (512 - 3));
		for (int g = 0; g < N_GEN; g++)
			toks[N_PROMPT + g] = hyb_test_argmax(lg + (size_t)g * 512, 512);
		free(lg);
	}
	CHECK(!forced(m, NULL, NULL, toks, false, dense) &&
	      !forced(m, NULL, thr, toks, false, teal));
	hy.gpu_budget = (uint64_t)(m->weight_bytes * 0.7);
	CHECK_MSG(!forced(m, &hy, thr, toks, false, hyb), "%s", hyb_last_error());
	d_teal = rel_dist(teal, dense, 512);
	d_hyb = rel_dist(hyb, dense, 512);
	fprintf(stderr, "from the dense logits: CPU TEAL %.4f, hybrid TEAL %.4f\n", d_teal, d_hyb);
	/* the thresholds in force on the hybrid path, about as far from dense */
	CHECK(d_teal > 0 && d_hyb > 0.5 * d_teal && d_hyb < 2 * d_teal);
	/*
	 * Token by token (a prompt's rows take the GEMV on the device, the CPU's
	 * prompt its masked GEMM): every part on the device, then the FFNs alone
	 * there (dense_on_cpu), the CPU-only TEAL decode bit for bit
	 */
	CHECK(!forced(m, NULL, thr, toks, true, teal));
	hy.gpu_budget = m->weight_bytes * 2;
	for (int ffn_only = 0; ffn_only < 2; ffn_only++) {
		hy.dense_on_cpu = ffn_only;
		CHECK_MSG(!forced(m, &hy, thr, toks, true, all), "%s", hyb_last_error());
		CHECK_MSG(!memcmp(all, teal, sizeof(float) * n), "device TEAL%s: not the CPU's "
			  "TEAL bits (%.3g from them)", ffn_only ? " (FFNs)" : "",
			  rel_dist(all, teal, 512));
	}
	/*
	 * Every part on the device, the prompt as one batch there: each row's q, k
	 * and v are columns of its q|k|v projection, its o and FFN its own GEMVs,
	 * so the bits are the token-by-token decode's still
	 */
	hy.dense_on_cpu = false;
	{
		struct hyb_ctx_params cp = { .n_ctx = 64, .n_threads = 2, .hybrid = &hy };
		struct hyb_ctx *c = hyb_ctx_new(m, &cp);
		struct hyb_hybrid_stats hs;

		CHECK_MSG(c, "%s", hyb_last_error());
		CHECK(!hyb_ctx_set_teal_thresholds(c, thr));
		CHECK_MSG(!hyb_ctx_eval(c, toks, N_PROMPT, all, false), "%s", hyb_last_error());
		for (int g = 1; g < N_GEN; g++)
			CHECK(!hyb_ctx_eval(c, &toks[N_PROMPT + g - 1], 1, all + (size_t)g * 512,
					    false));
		hyb_ctx_hybrid_stats(c, &hs);
		hyb_ctx_hybrid_offload(c, &pl);
		CHECK_MSG(hs.prompt_batches == 1 && pl.attn_layers == m->hp.n_layer,
			  "%llu prompt batches, %u blocks", (unsigned long long)hs.prompt_batches,
			  pl.attn_layers);
		CHECK_MSG(!memcmp(all, teal, sizeof(float) * n), "a TEAL prompt batched on the "
			  "device: not the token-by-token bits (%.3g from them)",
			  rel_dist(all, teal, 512));
		hyb_ctx_free(c);
	}
	hy.dense_on_cpu = true;
	{
		struct hyb_ctx_params cp = { .n_ctx = 64, .n_threads = 2, .hybrid = &hy };
		struct hyb_ctx *c = hyb_ctx_new(m, &cp);
		float *lg = malloc(sizeof(float) * 512);

		CHECK_MSG(c && lg, "%s", hyb_last_error());
		hyb_ctx_hybrid_offload(c, &pl);
		CHECK(pl.attn_layers == 0 && pl.ffn_layers == m->hp.n_layer);
		/* a prompt under TEAL: its rows through the device's TEAL FFNs, batched, the
		 * CPU's masked GEMM's sums but for rounding */
		CHECK(!hyb_ctx_set_teal_thresholds(c, thr));
		{
			struct hyb_hybrid_stats hs;
			float *cpu_lg = malloc(sizeof(float) * n);

			CHECK(cpu_lg && !forced(m, NULL, thr, toks, false, cpu_lg));
			CHECK(!hyb_ctx_eval(c, toks, N_PROMPT, lg, false));
			hyb_ctx_hybrid_stats(c, &hs);
			CHECK_EQ_INT(hs.prompt_batches, 1);
			/* no farther from the CPU's prompt than the CPU's own prompt token by
			 * token is (thresholds amplify rounding: ~0.3 on this random model) */
			CHECK_MSG(rel_dist_n(lg, cpu_lg, 512, 1) <= rel_dist_n(teal, cpu_lg, 512, 1),
				  "a TEAL prompt on the device: %.3g from the CPU's (token by token: "
				  "%.3g)", rel_dist_n(lg, cpu_lg, 512, 1),
				  rel_dist_n(teal, cpu_lg, 512, 1));
			free(cpu_lg);
			hyb_ctx_reset(c);
		}
		CHECK(!hyb_ctx_set_teal_thresholds(c, NULL));
		CHECK(!hyb_ctx_eval(c, toks, N_PROMPT, lg, false));
		for (int g = 1; g < N_GEN; g++) {
			CHECK(!hyb_ctx_eval(c, &toks[N_PROMPT + g - 1], 1, lg, false));
			CHECK_MSG(!memcmp(lg, dense + (size_t)g * 512, sizeof(float) * 512),
				  "step %d: the thresholds cleared, not the dense bits", g);
		}
		hyb_ctx_free(c);
		free(lg);
	}
	hy.dense_on_cpu = false;
	/* one step: only the CPU's FFNs went through TEAL's GEMV (gate_up and down) */
	hy.gpu_budget = (uint64_t)(m->weight_bytes * 0.7);
	{
		struct hyb_ctx_params cp = { .n_ctx = 64, .n_threads = 2, .hybrid = &hy };
		struct hyb_ctx *c = hyb_ctx_new(m, &cp);
		struct hyb_teal_stats ts;

		CHECK(c && !hyb_ctx_set_teal_thresholds(c, thr));
		hyb_ctx_hybrid_offload(c, &pl);
		CHECK(pl.attn_layers == m->hp.n_layer && pl.ffn_layers > 0 &&
		      pl.ffn_layers < m->hp.n_layer);
		CHECK(!hyb_ctx_eval(c, toks, 3, hyb, false));
		hyb_ctx_teal_stats_reset(c); /* (the prompt's last row took the CPU's path) */
		CHECK(!hyb_ctx_eval(c, toks + 3, 1, hyb, false));
		hyb_ctx_teal_stats(c, &ts);
		CHECK_MSG(ts.inputs == (uint64_t)(m->hp.n_layer - pl.ffn_layers) * (128 + 512),
			  "%llu inputs", (unsigned long long)ts.inputs);
		CHECK(ts.active < ts.inputs);
		hyb_ctx_free(c);
	}
	/*
	 * TEAL's rows padded to 64 bytes (down's 136 to 192 on this model) do not
	 * all fit the tighter budgets: what did not fit keeps the model's weights
	 * and runs dense, said in the note, and the decode goes on
	 */
	{
		bool fallback = false;

		for (int i = 5; i <= 10; i++) {
			struct hyb_ctx_params cp = { .n_ctx = 64, .n_threads = 2, .hybrid = &hy };
			struct hyb_ctx *c;
			unsigned tb = 0, nb = 0, tf = 0, nf = 0;
			const char *at;

			hy.gpu_budget = (uint64_t)(m->weight_bytes * 0.1 * i);
			c = hyb_ctx_new(m, &cp);
			CHECK_MSG(c && !hyb_ctx_set_teal_thresholds(c, thr), "%s", hyb_last_error());
			hyb_ctx_hybrid_offload(c, &pl);
			at = strstr(pl.cache_note, "TEAL on ");
			CHECK_MSG(at && sscanf(at, "TEAL on %u of %u blocks and %u of %u FFNs", &tb,
					       &nb, &tf, &nf) == 4, "%s", pl.cache_note);
			CHECK_MSG(nb == pl.attn_layers && nf == pl.ffn_layers && tb <= nb && tf <= nf,
				  "%s", pl.cache_note);
			fallback |= tb < nb || tf < nf;
			CHECK_MSG(!hyb_ctx_eval(c, toks, 3, hyb, false) &&
				  !hyb_ctx_eval(c, toks + 3, 1, hyb, false), "%s", hyb_last_error());
			CHECK(isfinite(hyb[0]));
			hyb_ctx_free(c);
		}
		CHECK(fallback);
	}
	free(thr);
	free(dense);
	free(teal);
	free(hyb);
	free(all);
	hyb_model_free(m);
}

#define SEQS 3
#define SEQ_STEPS 8

/*
 * Step k of the passes of SEQS sequences: sequence s joins at step s with
 * its prompt of 4, beside the others' single tokens, until it holds
 * 4 + SEQ_STEPS - SEQS. The step's runs for two contexts (sequence ids sa,
 * sb) into ba, bb, the sequences in who; returns how many. A run's next
 * token goes to toks[s][next_at(k, s)].
 */
static int join_step(int k, int32_t (*toks)[4 + SEQ_STEPS], const int *sa, const int *sb,
		     struct hyb_seq_tokens *ba, struct hyb_seq_tokens *bb, int *who)
{
	int n = 0;

	for (int s = 0; s <= k && s < SEQS; s++) {
		const int at = k == s ? 0 : 4 + (k - s - 1);
		const uint32_t len = k == s ? 4 : 1;

		if (at + len > 4 + SEQ_STEPS - SEQS)
			continue;
		ba[n] = (struct hyb_seq_tokens){ sa[s], toks[s] + at, len };
		bb[n] = (struct hyb_seq_tokens){ sb[s], toks[s] + at, len };
		who[n++] = s;
	}
	return n;
}

/* SEQS sequences opened in contexts a and b (ids into sa, sb), their prompts of 4 into toks. */
static void join_open(struct hyb_ctx *a, struct hyb_ctx *b, int *sa, int *sb,
		      int32_t (*toks)[4 + SEQ_STEPS])
{
	for (int s = 0; s < SEQS; s++) {
		sa[s] = hyb_ctx_seq_open(a, 4 + SEQ_STEPS);
		sb[s] = hyb_ctx_seq_open(b, 4 + SEQ_STEPS);
		CHECK(sa[s] >= 0 && sb[s] >= 0);
		for (int t = 0; t < 4; t++)
			toks[s][t] = 3 + (int32_t)((s * 977u + t * 40503u) % 509);
	}
}

static int next_at(int k, int s)
{
	return k == s ? 4 : 4 + (k - s);
}

/*
 * Gemma 3 under TEAL with every part on the device: GeGLU FFNs, sliding
 * windows, the scaled q and the norms after both blocks around TEAL's
 * projections there; token by token the CPU-only TEAL decode's bits.
 */
TEST(plain_hybrid_teal_gemma3_on_the_device)
{
	const char *path = hyb_test_synth("plain-gemma3-teal", SMALL " --arch gemma3 --swa 8 "
					  "--type Q8_0");
	struct hyb_model *m = hyb_model_load(path);
	struct hyb_hybrid_params hy = { .device = "cpu", .policy = HYB_POLICY_STATIC };
	struct hyb_hybrid_offload pl;
	const size_t n = (size_t)N_GEN * 512;
	float *thr, *cpu = malloc(sizeof(float) * n), *dev = malloc(sizeof(float) * n);
	int32_t toks[N_PROMPT + N_GEN];

	CHECK_MSG(m, "%s", hyb_last_error());
	CHECK(cpu && dev);
	thr = teal_thresholds(path, m);
	for (int i = 0; i < N_PROMPT + N_GEN; i++)
		toks[i] = 3 + (int32_t)((i * 40503u + 7) % (512 - 3));
	hy.gpu_budget = m->weight_bytes * 2;
	CHECK(!forced(m, NULL, thr, toks, true, cpu));
	CHECK_MSG(!forced(m, &hy, thr, toks, true, dev), "%s", hyb_last_error());
	CHECK_MSG(!memcmp(cpu, dev, sizeof(float) * n), "gemma3 device TEAL: %.3g from the "
		  "CPU's TEAL bits", rel_dist(dev, cpu, 512));
	{
		struct hyb_ctx_params cp = { .n_ctx = 64, .n_threads = 2, .hybrid = &hy };
		struct hyb_ctx *c = hyb_ctx_new(m, &cp);

		CHECK(c && !hyb_ctx_set_teal_thresholds(c, thr));
		hyb_ctx_hybrid_offload(c, &pl);
		CHECK_MSG(strstr(pl.cache_note, "TEAL on 4 of 4 blocks and 4 of 4 FFNs"), "%s",
			  pl.cache_note);
		hyb_ctx_free(c);
	}
	free(thr);
	free(cpu);
	free(dev);
	hyb_model_free(m);
}

/*
 * Several sequences (hyb_ctx_eval_seqs, hyb serve --parallel): their passes
 * attend on the CPU and run the placed FFNs on the device over all their
 * rows, prompt pieces and single tokens. Three sequences joining at
 * different steps get the CPU-only passes' logits bit for bit (Q8_0: the
 * CPU's GEMM sums a column as its GEMV does).
 */
TEST(plain_hybrid_seqs_decode_the_cpu_bits)
{
	enum { S = SEQS, STEPS = SEQ_STEPS };
	const char *path = hyb_test_synth("plain", SMALL " --act silu --type Q8_0");
	struct hyb_model *m = hyb_model_load(path);
	struct hyb_hybrid_params hy = { .device = "cpu", .policy = HYB_POLICY_TAM_ADAPTIVE };
	struct hyb_ctx_params pc = { .n_ctx = 64, .n_threads = 2, .n_seq = S, .kv_size = S * 64 };
	struct hyb_ctx_params ph = pc;
	struct hyb_ctx *cc, *ch;
	struct hyb_hybrid_offload pl;
	struct hyb_hybrid_stats st;
	float *lc = malloc(sizeof(float) * 512 * S), *lh = malloc(sizeof(float) * 512 * S);
	int32_t toks[S][4 + STEPS];
	int sc[S], sh[S];
	uint32_t diff = 0, rows = 0;

	CHECK_MSG(m, "%s", hyb_last_error());
	CHECK(lc && lh);
	hy.gpu_budget = m->weight_bytes / 2;
	ph.hybrid = &hy;
	cc = hyb_ctx_new(m, &pc);
	ch = hyb_ctx_new(m, &ph);
	CHECK_MSG(cc && ch, "%s", hyb_last_error());
	hyb_ctx_hybrid_offload(ch, &pl);
	CHECK_MSG(pl.plain && pl.ffn_layers > 0 && pl.ffn_layers < m->hp.n_layer &&
		  pl.attn_layers == 0, "%u FFNs, %u attention blocks", pl.ffn_layers,
		  pl.attn_layers);
	join_open(cc, ch, sc, sh, toks);
	for (int s = 0; s < S; s++)
		CHECK(sh[s] == sc[s]);
	for (int k = 0; k < STEPS; k++) {
		struct hyb_seq_tokens bc[S], bh[S];
		int who[S];
		const int n = join_step(k, toks, sc, sh, bc, bh, who);

		CHECK(!hyb_ctx_eval_seqs(cc, bc, n, lc));
		CHECK_MSG(!hyb_ctx_eval_seqs(ch, bh, n, lh), "%s", hyb_last_error());
		for (int i = 0; i < n; i++) {
			const int s = who[i], at = next_at(k, s);

			diff += memcmp(lc + (size_t)i * 512, lh + (size_t)i * 512,
				       sizeof(float) * 512) != 0;
			rows++;
			toks[s][at] = hyb_test_argmax(lc + (size_t)i * 512, 512);
		}
	}
	hyb_ctx_hybrid_stats(ch, &st);
	CHECK_MSG(diff == 0 && rows >= 12, "%u of %u sequences' steps differ from the CPU's", diff,
		  rows);
	CHECK(st.critical_bytes > 0 && st.dev_kernel_s > 0);
	hyb_ctx_free(cc);
	hyb_ctx_free(ch);
	free(lc);
	free(lh);
	hyb_model_free(m);
}

/*
 * TEAL in the batches of several sequences: the passes attend on the CPU
 * with the thresholds, the CPU's FFNs take them, the device's run dense.
 * Three sequences joining at different steps get, row for row, the bits
 * each gets decoded alone in the same kind of context (a decode row takes
 * TEAL's one-token sums: docs/SERVE.md#teal); the thresholds are in force
 * (other logits than without them), and a pass of decode rows puts through
 * TEAL's GEMV every attention input and the CPU FFNs' only.
 */
TEST(plain_hybrid_teal_seqs_are_each_alone)
{
	enum { S = SEQS, STEPS = SEQ_STEPS, ROWS = 6, V = 512 };
	const char *path = hyb_test_synth("plain", SMALL " --act silu --type Q8_0");
	struct hyb_model *m = hyb_model_load(path);
	struct hyb_hybrid_params hy = { .device = "cpu", .policy = HYB_POLICY_TAM_ADAPTIVE };
	struct hyb_ctx_params p = { .n_ctx = 64, .n_threads = 2, .n_seq = S, .kv_size = S * 64,
				    .hybrid = &hy };
	struct hyb_ctx *cb, *cd, *ca;
	struct hyb_hybrid_offload pl;
	struct hyb_teal_stats ts = { 0 };
	float *thr, *lb = calloc((size_t)S * ROWS * V, sizeof(float));
	float *l = malloc(sizeof(float) * V * S), *ld = malloc(sizeof(float) * V * S);
	int32_t toks[S][4 + STEPS];
	int nrow[S] = { 0 }, sb[S], sd[S];
	uint32_t diff = 0, same_dense = 0, rows = 0;

	CHECK_MSG(m, "%s", hyb_last_error());
	CHECK(lb && l && ld);
	thr = teal_thresholds(path, m);
	hy.gpu_budget = m->weight_bytes / 2;
	cb = hyb_ctx_new(m, &p);
	cd = hyb_ctx_new(m, &p);
	ca = hyb_ctx_new(m, &p);
	CHECK_MSG(cb && cd && ca, "%s", hyb_last_error());
	CHECK_MSG(!hyb_ctx_set_teal_thresholds(cb, thr) && !hyb_ctx_set_teal_thresholds(ca, thr),
		  "%s", hyb_last_error());
	hyb_ctx_hybrid_offload(cb, &pl);
	CHECK(pl.plain && pl.ffn_layers > 0 && pl.ffn_layers < m->hp.n_layer);
	join_open(cb, cd, sb, sd, toks);
	for (int k = 0; k < STEPS; k++) {
		struct hyb_seq_tokens bb[S], bd[S];
		int who[S];
		const int n = join_step(k, toks, sb, sd, bb, bd, who);

		if (k == S + 1) /* every sequence decoding */
			hyb_ctx_teal_stats_reset(cb);
		CHECK_MSG(!hyb_ctx_eval_seqs(cb, bb, n, l), "%s", hyb_last_error());
		CHECK(!hyb_ctx_eval_seqs(cd, bd, n, ld));
		if (k == S + 1) {
			CHECK(n == S);
			hyb_ctx_teal_stats(cb, &ts);
		}
		for (int i = 0; i < n; i++) {
			const int s = who[i], at = next_at(k, s);

			CHECK(nrow[s] < ROWS);
			memcpy(lb + ((size_t)s * ROWS + nrow[s]++) * V, l + (size_t)i * V,
			       sizeof(float) * V);
			same_dense += !memcmp(l + (size_t)i * V, ld + (size_t)i * V,
					      sizeof(float) * V);
			toks[s][at] = hyb_test_argmax(l + (size_t)i * V, V);
		}
	}
	/* each alone, on the tokens it got in the batch */
	for (int s = 0; s < S; s++) {
		const int sa = hyb_ctx_seq_open(ca, 4 + STEPS);

		CHECK(sa >= 0);
		for (int r = 0; r < nrow[s]; r++) {
			struct hyb_seq_tokens one = { sa, toks[s] + (r ? 3 + r : 0), r ? 1 : 4 };

			CHECK_MSG(!hyb_ctx_eval_seqs(ca, &one, 1, l), "%s", hyb_last_error());
			diff += memcmp(l, lb + ((size_t)s * ROWS + r) * V, sizeof(float) * V) != 0;
			rows++;
		}
		hyb_ctx_seq_close(ca, sa);
	}
	CHECK_MSG(diff == 0 && rows >= 12, "%u of %u rows differ from the sequence's alone", diff,
		  rows);
	CHECK_MSG(same_dense == 0, "%u of %u rows as without thresholds", same_dense, rows);
	CHECK_MSG(ts.inputs == (uint64_t)S * (m->hp.n_layer * (128 + 128) +
					      (m->hp.n_layer - pl.ffn_layers) * (128 + 512)),
		  "%llu TEAL inputs, %u FFNs on the device", (unsigned long long)ts.inputs,
		  pl.ffn_layers);
	CHECK(ts.active < ts.inputs);
	hyb_ctx_free(cb);
	hyb_ctx_free(cd);
	hyb_ctx_free(ca);
	free(thr);
	free(lb);
	free(l);
	free(ld);
	hyb_model_free(m);
}

/* What a plain model's hybrid context refuses, and what it leaves on the CPU. */
TEST(plain_hybrid_refusals)
{
	const char *silu = hyb_test_synth("plain", SMALL " --act silu --type Q8_0");
	struct hyb_model *m = hyb_model_load(silu);
	struct hyb_hybrid_params hy = { .device = "cpu", .policy = HYB_POLICY_TAM_ADAPTIVE,
					.gpu_budget = 1000 };
	struct hyb_ctx_params cp = { .n_ctx = 64, .n_threads = 1, .hybrid = &hy };
	struct hyb_hybrid_offload pl;
	struct hyb_ctx *c;

	CHECK_MSG(m, "%s", hyb_last_error());
	/* a budget that holds nothing */
	CHECK(!hyb_ctx_new(m, &cp));
	CHECK_MSG(strstr(hyb_last_error(), "holds no part of the model"), "%s", hyb_last_error());
	hy.gpu_budget = m->weight_bytes;
	/* a neuron policy places the parts statically: nothing to move */
	c = hyb_ctx_new(m, &cp);
	CHECK_MSG(c, "%s", hyb_last_error());
	hyb_ctx_hybrid_offload(c, &pl);
	CHECK(pl.plain && strstr(pl.cache_note, "static placement"));
	hyb_ctx_free(c);
	/* a prompt batch: as many rows as asked, none where they do not fit or with
	 * prefill_cpu (the CLI says so: cli_check_prompt_batch) */
	hy.gpu_budget = m->weight_bytes * 2;
	hy.prompt_batch = 40;
	c = hyb_ctx_new(m, &cp);
	CHECK_MSG(c, "%s", hyb_last_error());
	hyb_ctx_hybrid_offload(c, &pl);
	CHECK_EQ_INT(pl.prompt_batch, 40);
	CHECK_MSG(!pl.prompt_note[0], "%s", pl.prompt_note);
	hyb_ctx_free(c);
	hy.prompt_batch = 100000;
	c = hyb_ctx_new(m, &cp);
	CHECK_MSG(c, "%s", hyb_last_error());
	hyb_ctx_hybrid_offload(c, &pl);
	CHECK_EQ_INT(pl.prompt_batch, 0);
	CHECK_MSG(strstr(pl.prompt_note, "no room for the buffers of 100000 tokens; prompts on "
			 "the CPU"), "%s", pl.prompt_note);
	hyb_ctx_free(c);
	hy.prompt_batch = 0;
	hy.prefill_cpu = true;
	c = hyb_ctx_new(m, &cp);
	CHECK_MSG(c, "%s", hyb_last_error());
	hyb_ctx_hybrid_offload(c, &pl);
	CHECK_EQ_INT(pl.prompt_batch, 0);
	CHECK_MSG(!strcmp(pl.prompt_note, "--prefill-cpu; prompts on the CPU"), "%s",
		  pl.prompt_note);
	hyb_ctx_free(c);
	hyb_model_free(m);
}
