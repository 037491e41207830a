// SPDX-License-Identifier: MIT
/*
 * Several sequences in one hybrid context (libhyb/hybrid/decode_seqs.c,
 * docs/HYBRID.md "Several sequences"): the device runs every row's linear
 * parts, the sequences holding a device KV slot attend there and the
 * others on the CPU (APEX). On the CPU device:
 *   - oracle mode (the FFN whole on the CPU): every step's logits of every
 *     sequence, joining and leaving at any step, some attending on the
 *     device and some on the CPU, equal bit for bit those of the sequence
 *     alone in a one-sequence CPU context;
 *   - the split FFN (cached groups on the device, each decoded token's
 *     predicted neurons through the CPU's sparse operator): a sequence's
 *     logits in the batch equal the same sequence's alone in the same kind
 *     of context (batch invariance), and stay close to the CPU's dense ones;
 *   - the budget holds the device's KV for kv_seqs sequences; slots go to
 *     the first sequences opened and come back at close;
 *   - refusals: hyb_ctx_eval on such a context; the CLI's --parallel and
 *     --kv-seqs where they mean nothing; hyb bench --parallel's report.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hyb/gguf.h"
#include "hyb/hybrid.h"
#include "hyb/model.h"
#include "hyb/testing.h"
#include "hybrid/dense.h"
#include "test.h"

#define N_CTX 96
#define NSEQ 6
#define NGEN 10

static uint32_t prompt(uint32_t i, uint32_t V, int32_t *out)
{
	static const uint32_t len[NSEQ] = { 5, 1, 40, 17, 3, 9 };

	for (uint32_t t = 0; t < len[i]; t++)
		out[t] = (int32_t)((t * 37 + i * 101 + 11) % (V - 3) + 3);
	return len[i];
}

/* Every step's logits of sequence i alone in ctx c (one sequence): [1 + NGEN][V]. */
static float *alone_one(struct hyb_ctx *c, const struct hyb_model *m, uint32_t i)
{
	const uint32_t V = m->hp.n_vocab;
	float *lg = malloc(sizeof(float) * V * (NGEN + 1));
	int32_t toks[64];
	uint32_t n = prompt(i, V, toks);

	CHECK(lg);
	hyb_ctx_reset(c);
	CHECK_MSG(hyb_ctx_eval(c, toks, n, lg, false) == 0, "%s", hyb_last_error());
	for (uint32_t g = 0; g < NGEN; g++) {
		int32_t t = hyb_test_argmax(lg + (size_t)g * V, V);

		CHECK_MSG(hyb_ctx_eval(c, &t, 1, lg + (size_t)(g + 1) * V, false) == 0, "%s",
			  hyb_last_error());
	}
	return lg;
}

/*
 * The device's share: every dense part with KV for kv_seqs sequences and a
 * third of the groups; or (layers < n_layer) the first `layers` attention
 * blocks and less than another one's bytes for groups.
 */
static struct hyb_hybrid_params params_layers(const struct hyb_model *m, uint32_t kv_seqs,
					      uint32_t layers)
{
	const uint64_t ab = hyb_hdense_layer_bytes(m, 0, N_CTX * kv_seqs);
	uint64_t b = hyb_hdense_buffer_bytes(m, true, layers == m->hp.n_layer, true);

	if (layers == m->hp.n_layer)
		b += hyb_hdense_head_bytes(m) + 3ull * m->group_size *
			m->layers[0].plan.bundles.row_bytes * m->n_groups * m->hp.n_layer / 3;
	else
		b += ab / 2;
	for (uint32_t l = 0; l < layers; l++)
		b += hyb_hdense_layer_bytes(m, l, N_CTX * kv_seqs) + hyb_hdense_pred_bytes(m, l);
	return (struct hyb_hybrid_params){ .device = "cpu", .policy = HYB_POLICY_STATIC,
					   .gpu_budget = b + (320u << 10), .kv_seqs = kv_seqs };
}

static struct hyb_hybrid_params params(const struct hyb_model *m, uint32_t kv_seqs)
{
	return params_layers(m, kv_seqs, m->hp.n_layer);
}

static struct hyb_ctx *seqs_ctx(const struct hyb_model *m, const struct hyb_hybrid_params *hy,
				uint32_t n_seq, bool oracle)
{
	struct hyb_ctx_params p = {
		.n_ctx = N_CTX, .n_threads = 2, .n_batch = 16, .n_seq = n_seq,
		.kv_size = N_CTX * n_seq, .hybrid = hy,
		.testing = oracle ? HYB_TESTING_FFN_ORACLE : 0,
	};
	struct hyb_ctx *c = hyb_ctx_new(m, &p);

	CHECK_MSG(c, "%s", hyb_last_error());
	return c;
}

/*
 * NSEQ sequences through c (n_seq 4): sequence i joins at step 2i when a
 * sequence is free, leaves after NGEN tokens, follows ref[i]'s greedy path.
 * Returns how many steps' logits differ from ref bit for bit; *rel the
 * largest difference relative to ref's largest logit.
 */
static uint32_t batched(struct hyb_ctx *c, const struct hyb_model *m, float *const *ref,
			double *rel, int *slot_of)
{
	const uint32_t V = m->hp.n_vocab;
	float *lg = malloc(sizeof(float) * V * NSEQ);
	int seq[NSEQ], gen[NSEQ];
	int32_t toks[NSEQ][64], next[NSEQ];
	uint32_t diff = 0, finished = 0;

	CHECK(lg);
	*rel = 0;
	for (uint32_t i = 0; i < NSEQ; i++)
		seq[i] = gen[i] = slot_of[i] = -1;
	for (uint32_t step = 0; finished < NSEQ; step++) {
		struct hyb_seq_tokens b[NSEQ];
		uint32_t nb = 0, who[NSEQ];

		CHECK(step < 200);
		for (uint32_t i = 0; i < NSEQ; i++) {
			if (gen[i] < 0 && step >= 2 * i) {
				uint32_t n = prompt(i, V, toks[i]);
				int s = hyb_ctx_seq_open(c, n + NGEN);

				if (s == -ENOSPC)
					continue;
				CHECK_MSG(s >= 0, "%s", hyb_last_error());
				seq[i] = s;
				gen[i] = 0;
				b[nb] = (struct hyb_seq_tokens){ s, toks[i], n };
			} else if (gen[i] >= 1 && gen[i] <= NGEN) {
				b[nb] = (struct hyb_seq_tokens){ seq[i], &next[i], 1 };
			} else {
				continue;
			}
			who[nb++] = i;
		}
		if (!nb)
			continue;
		CHECK_MSG(hyb_ctx_eval_seqs(c, b, nb, lg) == 0, "%s", hyb_last_error());
		for (uint32_t k = 0; k < nb; k++) {
			const uint32_t i = who[k];
			const float *want = ref[i] + (size_t)gen[i] * V, *got = lg + (size_t)k * V;
			float top = 0;

			for (uint32_t v = 0; v < V; v++)
				top = fmaxf(top, fabsf(want[v]));
			for (uint32_t v = 0; v < V; v++)
				*rel = fmax(*rel, fabs((double)want[v] - got[v]) / (top > 0 ? top : 1));
			diff += memcmp(want, got, sizeof(float) * V) != 0;
			next[i] = hyb_test_argmax(want, V);
			if (++gen[i] == NGEN + 1) {
				CHECK_EQ_INT(hyb_ctx_seq_close(c, seq[i]), 0);
				seq[i] = -1;
				finished++;
			}
		}
	}
	free(lg);
	return diff;
}

TEST(hybrid_seqs_oracle_bits_device_and_cpu_attention)
{
	struct hyb_model *m = hyb_model_load(hyb_test_plan());
	struct hyb_ctx_params rp = { .n_ctx = N_CTX, .n_threads = 2, .n_batch = 16,
				     .ffn = HYB_FFN_DENSE };
	struct hyb_ctx *ref_c;
	float *ref[NSEQ];
	const struct hyb_hybrid_params hy = params(m, 2);
	struct hyb_ctx *c;
	struct hyb_hybrid_offload off;
	struct hyb_hybrid_stats st;
	int slot_of[NSEQ];
	double rel;

	CHECK_MSG(m, "%s", hyb_last_error());
	ref_c = hyb_ctx_new(m, &rp);
	CHECK_MSG(ref_c, "%s", hyb_last_error());
	for (uint32_t i = 0; i < NSEQ; i++)
		ref[i] = alone_one(ref_c, m, i);
	c = seqs_ctx(m, &hy, 4, true);
	hyb_ctx_hybrid_offload(c, &off);
	CHECK_EQ_INT(off.attn_layers, m->hp.n_layer);
	CHECK_EQ_INT(off.kv_seqs, 2);
	CHECK(off.seq_bytes > 0);
	CHECK_EQ_INT(batched(c, m, ref, &rel, slot_of), 0);
	hyb_ctx_hybrid_stats(c, &st);
	/* two of four at a time attend on the device, the others on the CPU */
	CHECK(st.seq_passes > 0 && st.seq_rows > 0);
	CHECK(st.attn_rows_dev > 0);
	CHECK(st.attn_rows_cpu > 0);
	CHECK_EQ_INT(st.attn_rows_dev + st.attn_rows_cpu, st.seq_rows * m->hp.n_layer);
	/* one-sequence calls are refused on it */
	{
		int32_t t = 5;
		float *lg = malloc(sizeof(float) * m->hp.n_vocab);

		CHECK(lg);
		CHECK_EQ_INT(hyb_ctx_eval(c, &t, 1, lg, false), -EINVAL);
		free(lg);
	}
	hyb_ctx_free(c);
	/* every sequence on the CPU's attention but the first: still the same bits */
	{
		const struct hyb_hybrid_params h1 = params(m, 1);

		c = seqs_ctx(m, &h1, 4, true);
		CHECK_EQ_INT(batched(c, m, ref, &rel, slot_of), 0);
		hyb_ctx_hybrid_stats(c, &st);
		CHECK(st.attn_rows_cpu > st.attn_rows_dev);
		hyb_ctx_free(c);
	}
	for (uint32_t i = 0; i < NSEQ; i++)
		free(ref[i]);
	hyb_ctx_free(ref_c);
	hyb_model_free(m);
}

/*
 * The split FFN: alone and in the batch the same bits, with every attention
 * block on the device and with only the first (the others' rows going down
 * and up around the CPU's blocks).
 */
static void split_invariant(struct hyb_model *m, const struct hyb_hybrid_params hy,
			    uint32_t want_layers)
{
	struct hyb_ctx_params rp = { .n_ctx = N_CTX, .n_threads = 2, .n_batch = 16,
				     .ffn = HYB_FFN_DENSE };
	struct hyb_ctx *c, *ref_c;
	float *alone_lg[NSEQ], *cpu[NSEQ];
	struct hyb_hybrid_stats st;
	struct hyb_hybrid_offload off;
	int slot_of[NSEQ];
	double rel;

	ref_c = hyb_ctx_new(m, &rp);
	CHECK_MSG(ref_c, "%s", hyb_last_error());
	/* each sequence alone through its own split context: one at a time */
	for (uint32_t i = 0; i < NSEQ; i++) {
		const uint32_t V = m->hp.n_vocab;
		int32_t toks[64];
		uint32_t n = prompt(i, V, toks);
		struct hyb_seq_tokens b;
		int s;

		cpu[i] = alone_one(ref_c, m, i);
		c = seqs_ctx(m, &hy, 4, false);
		alone_lg[i] = malloc(sizeof(float) * V * (NGEN + 1));
		CHECK(alone_lg[i]);
		s = hyb_ctx_seq_open(c, n + NGEN);
		CHECK(s >= 0);
		b = (struct hyb_seq_tokens){ s, toks, n };
		CHECK_MSG(hyb_ctx_eval_seqs(c, &b, 1, alone_lg[i]) == 0, "%s", hyb_last_error());
		for (uint32_t g = 0; g < NGEN; g++) {
			int32_t t = hyb_test_argmax(alone_lg[i] + (size_t)g * V, V);

			b = (struct hyb_seq_tokens){ s, &t, 1 };
			CHECK_MSG(hyb_ctx_eval_seqs(c, &b, 1, alone_lg[i] + (size_t)(g + 1) * V) == 0,
				  "%s", hyb_last_error());
		}
		hyb_ctx_free(c);
	}
	c = seqs_ctx(m, &hy, 4, false);
	hyb_ctx_hybrid_offload(c, &off);
	CHECK_EQ_INT(off.attn_layers, want_layers);
	CHECK_EQ_INT(batched(c, m, alone_lg, &rel, slot_of), 0);
	hyb_ctx_hybrid_stats(c, &st);
	CHECK(st.attn_rows_cpu > 0);
	printf("    %u attention blocks: the CPU computed %.1f%% of the neurons (sparse rows)\n",
	       want_layers, 100.0 * st.seq_neurons_cpu /
	       ((double)st.seq_rows * m->hp.n_ff * m->hp.n_layer));
	/* APEX's profile: every placed layer of every pass timed on the device */
	CHECK_EQ_INT(st.seq_layers, st.seq_passes * want_layers);
	CHECK(st.seq_linear_s > 0 && st.seq_dev_attn_s > 0 && st.cpu_attn_s > 0);
	/* decoded tokens' rows went through the sparse operator, their predictions */
	CHECK(st.seq_neurons_cpu > 0);
	CHECK(st.seq_neurons_cpu < st.seq_rows * m->hp.n_ff * m->hp.n_layer / 2);
	/* the cached groups' share ran on the device, the rest on the CPU */
	CHECK(st.seq_neurons_dev > 0);
	CHECK(st.seq_neurons_dev < st.seq_rows * m->hp.n_ff * m->hp.n_layer);
	hyb_ctx_free(c);
	/* the split sums differ from the CPU's in the last bits only */
	c = seqs_ctx(m, &hy, 4, false);
	(void)batched(c, m, cpu, &rel, slot_of);
	/* sparse rows skip what the predictor leaves out: close, as cats_hybrid bounds it */
	printf("    split FFN vs CPU: max relative logit difference %.2g\n", rel);
	CHECK(rel < 0.05);
	hyb_ctx_free(c);
	for (uint32_t i = 0; i < NSEQ; i++) {
		free(alone_lg[i]);
		free(cpu[i]);
	}
	hyb_ctx_free(ref_c);
}

TEST(hybrid_seqs_split_ffn_batch_invariant)
{
	struct hyb_model *m = hyb_model_load(hyb_test_plan());

	CHECK_MSG(m, "%s", hyb_last_error());
	split_invariant(m, params(m, 2), m->hp.n_layer);
	/* the smallest budget with one attention block and some groups on the device */
	{
		struct hyb_hybrid_params hy = params_layers(m, 2, 1);
		struct hyb_hybrid_offload off = { 0 };

		for (hy.gpu_budget -= 256u << 10; ; hy.gpu_budget += 8u << 10) {
			struct hyb_ctx_params p = { .n_ctx = N_CTX, .n_threads = 1, .n_batch = 16,
						    .n_seq = 4, .kv_size = N_CTX * 4, .hybrid = &hy };
			struct hyb_ctx *c = hyb_ctx_new(m, &p);

			if (c)
				hyb_ctx_hybrid_offload(c, &off);
			hyb_ctx_free(c);
			CHECK(off.attn_layers <= 1);
			if (off.attn_layers == 1 && off.cache_bytes > 0)
				break;
		}
		split_invariant(m, hy, 1);
	}
	hyb_model_free(m);
}

TEST(hybrid_seqs_slots_follow_open_and_close)
{
	struct hyb_model *m = hyb_model_load(hyb_test_plan());
	const struct hyb_hybrid_params hy = params(m, 2);
	struct hyb_ctx *c;
	struct hyb_hybrid_stats st;
	int32_t t = 7;
	float *lg;
	int a, b, d;

	CHECK_MSG(m, "%s", hyb_last_error());
	lg = malloc(sizeof(float) * m->hp.n_vocab * 2);
	CHECK(lg);
	c = seqs_ctx(m, &hy, 3, true);
	a = hyb_ctx_seq_open(c, 8);
	b = hyb_ctx_seq_open(c, 8);
	d = hyb_ctx_seq_open(c, 8);
	CHECK(a >= 0 && b >= 0 && d >= 0);
	/* a and b hold the two slots, d attends on the CPU */
	{
		const struct hyb_seq_tokens bt[2] = { { a, &t, 1 }, { d, &t, 1 } };

		hyb_ctx_hybrid_stats_reset(c);
		CHECK_EQ_INT(hyb_ctx_eval_seqs(c, bt, 2, lg), 0);
		hyb_ctx_hybrid_stats(c, &st);
		CHECK_EQ_INT(st.attn_rows_dev, m->hp.n_layer);
		CHECK_EQ_INT(st.attn_rows_cpu, m->hp.n_layer);
	}
	/* b leaves: the next sequence opened takes its slot */
	CHECK_EQ_INT(hyb_ctx_seq_close(c, b), 0);
	CHECK_EQ_INT(hyb_ctx_seq_close(c, d), 0);
	d = hyb_ctx_seq_open(c, 8);
	CHECK(d >= 0);
	{
		const struct hyb_seq_tokens bt[1] = { { d, &t, 1 } };

		hyb_ctx_hybrid_stats_reset(c);
		CHECK_EQ_INT(hyb_ctx_eval_seqs(c, bt, 1, lg), 0);
		hyb_ctx_hybrid_stats(c, &st);
		CHECK_EQ_INT(st.attn_rows_dev, m->hp.n_layer);
		CHECK_EQ_INT(st.attn_rows_cpu, 0);
	}
	hyb_ctx_free(c);
	free(lg);
	hyb_model_free(m);
}

/* Read a whole small file (a log) into a static buffer. */
static const char *slurp_log(const char *path)
{
	static char buf[16384];
	FILE *f = fopen(path, "r");
	size_t n;

	CHECK(f);
	n = fread(buf, 1, sizeof(buf) - 1, f);
	buf[n] = 0;
	fclose(f);
	return buf;
}

/*
 * hyb bench --parallel: the four ways and APEX's model on the plan; the
 * options refused where they mean nothing.
 */
TEST(hybrid_seqs_bench_and_refusals)
{
	const char *plan = hyb_test_plan();
	char log[600];
	const char *out;

	if (access("build/hyb", X_OK))
		SKIP("build/hyb not built (run from the repository root after make)");
	snprintf(log, sizeof(log), "%s/bench.log", hyb_test_tmpdir());
	CHECK_EQ_INT(hyb_test_sh(log, "build/hyb bench -m %s --gpu-budget 60%% --parallel 4 "
				 "--kv-seqs 1 -p 8 -n 4 -r 1 -t 1", plan), 0);
	out = slurp_log(log);
	CHECK_MSG(strstr(out, "one by one") && strstr(out, "batch S") && strstr(out, "APEX N") &&
		  strstr(out, "device N") && strstr(out, "APEX model") &&
		  strstr(out, "(inequality 6)"), "%s", out);
	CHECK(hyb_test_sh(log, "build/hyb bench -m %s --gpu-budget 60%% --parallel 4 --kv-seqs 4",
			  plan) != 0);
	CHECK_MSG(strstr(slurp_log(log), "fewer than the 4 sequences"), "%s", slurp_log(log));
	CHECK(hyb_test_sh(log, "build/hyb run -m %s --parallel 2 -n 1", plan) != 0);
	CHECK_MSG(strstr(slurp_log(log), "hyb bench's and hyb serve's"), "%s", slurp_log(log));
	CHECK(hyb_test_sh(log, "build/hyb serve -m %s --parallel 2 --kv-seqs 1", plan) != 0);
	CHECK_MSG(strstr(slurp_log(log), "go with --gpu-budget"), "%s", slurp_log(log));
	CHECK(hyb_test_sh(log, "build/hyb serve -m %s --gpu-budget 60%% --parallel 2 "
			  "--kv-seqs 3", plan) != 0);
	CHECK_MSG(strstr(slurp_log(log), "more than the 2 requests"), "%s", slurp_log(log));
}

/*
 * A Gemma 3 plan (GeGLU, CATS at 0.5, a norm after each FFN) through
 * several sequences: its FFN halves meet on the host, are normed, then
 * added; each sequence's logits are close to the CPU's. In oracle mode
 * (the FFN on the CPU) every attention block on the device, its sliding
 * windows (16 positions: prompts of up to 40), scaled q and norm after the
 * block there, two sequences attending there and the others on the CPU:
 * the CPU's bits.
 */
TEST(hybrid_seqs_gemma3_norm_after_the_ffn)
{
	char model[512], prof[512], plan[512], log[600];
	struct hyb_ctx_params rp = { .n_ctx = N_CTX, .n_threads = 2, .n_batch = 16,
				     .ffn = HYB_FFN_SPARSE };
	struct hyb_hybrid_params hy = { .device = "cpu", .policy = HYB_POLICY_STATIC };
	struct hyb_model *m;
	struct hyb_ctx *ref_c, *c;
	float *cpu[NSEQ];
	int slot_of[NSEQ];
	double rel;
	uint32_t diff;

	if (access(hyb_test_hybctl(), X_OK))
		SKIP("%s not built", hyb_test_hybctl());
	snprintf(model, sizeof(model), "%s/g.gguf", hyb_test_tmpdir());
	snprintf(prof, sizeof(prof), "%s/g.profile.gguf", hyb_test_tmpdir());
	snprintf(plan, sizeof(plan), "%s/g.plan.gguf", hyb_test_tmpdir());
	snprintf(log, sizeof(log), "%s/g.log", hyb_test_tmpdir());
	CHECK_MSG(!hyb_test_sh(log, "%s synth -o %s --arch gemma3 --hidden 128 --ffn 512 "
			       "--layers 3 --heads 4 --kv-heads 2 --vocab 512 --type Q8_0 -t 1 && "
			       "%s profile %s --sparsity 0.5 --gen 24 --samples 400 -t 1 -o %s && "
			       "%s plan %s --profile %s --gpu-budget 64M -o %s -t 1",
			       hyb_test_hybctl(), model, hyb_test_hybctl(), model, prof,
			       hyb_test_hybctl(), model, prof, plan), "gemma3 plan");
	m = hyb_model_load(plan);
	CHECK_MSG(m, "%s", hyb_last_error());
	CHECK(m->layers[0].post_ffn_norm.data);
	hy.gpu_budget = m->gguf->size * 2 / 3;
	ref_c = hyb_ctx_new(m, &rp);
	CHECK_MSG(ref_c, "%s", hyb_last_error());
	for (uint32_t i = 0; i < NSEQ; i++)
		cpu[i] = alone_one(ref_c, m, i);
	c = seqs_ctx(m, &hy, 4, false);
	diff = batched(c, m, cpu, &rel, slot_of);
	printf("    gemma3 plan, 4 sequences through the split FFN vs the CPU alone: %u of %u "
	       "steps' logits differ, max relative difference %.2g\n", diff, NSEQ * (NGEN + 1),
	       rel);
	CHECK(rel < 0.05);
	hyb_ctx_free(c);
	for (uint32_t i = 0; i < NSEQ; i++)
		free(cpu[i]);
	hyb_ctx_free(ref_c);
	{
		const struct hyb_hybrid_params h2 = params(m, 2);
		struct hyb_hybrid_offload off;
		struct hyb_hybrid_stats st;

		rp.ffn = HYB_FFN_DENSE;
		ref_c = hyb_ctx_new(m, &rp);
		CHECK_MSG(ref_c, "%s", hyb_last_error());
		for (uint32_t i = 0; i < NSEQ; i++)
			cpu[i] = alone_one(ref_c, m, i);
		c = seqs_ctx(m, &h2, 4, true);
		hyb_ctx_hybrid_offload(c, &off);
		CHECK_EQ_INT(off.attn_layers, m->hp.n_layer);
		CHECK_EQ_INT(batched(c, m, cpu, &rel, slot_of), 0);
		hyb_ctx_hybrid_stats(c, &st);
		CHECK(st.attn_rows_dev > 0 && st.attn_rows_cpu > 0);
		hyb_ctx_free(c);
		for (uint32_t i = 0; i < NSEQ; i++)
			free(cpu[i]);
		hyb_ctx_free(ref_c);
	}
	hyb_model_free(m);
}
