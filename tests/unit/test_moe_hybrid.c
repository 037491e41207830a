// SPDX-License-Identifier: MIT
/*
 * The expert cache (libhyb/hybrid/moe_hybrid.c, docs/MOE.md): a MoE
 * model's hot experts computed on a device during decode. On the CPU
 * device the device runs the CPU's kernels, so the logits are the CPU-only
 * decode's bit for bit, whatever the policy moved; the runner's strict
 * device mode checks that no slot is read before its load is seen complete
 * or rewritten while a kernel may read it.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hyb/hyb.h"
#include "hyb/testing.h"
#include "test.h"

#define SMALL "--arch qwen3moe --experts 16 --experts-used 4 --expert-ffn 64 --hidden 128 " \
	      "--heads 4 --layers 3 --seed 5"
/* Mixtral's layout: llama's attention, which the device runs too */
#define SMALL_LLAMA "--arch llama --experts 16 --experts-used 4 --ffn 64 --hidden 128 --heads 4 " \
		    "--layers 3 --seed 5"
#define N_PROMPT 6
#define N_GEN 12

/* when set, decode_defer fills it with each layer's statistics (before the second prompt) */
static struct hyb_hybrid_layer_stats *layer_stats;

/*
 * A prompt, then N_GEN greedy steps, then a second prompt: every step's
 * logits into lg[N_GEN + 2][n_vocab], the two prompts' in the last rows.
 */
static int decode_defer(struct hyb_model *m, const struct hyb_hybrid_params *hy, uint32_t defer,
			float *lg, struct hyb_hybrid_stats *st, struct hyb_hybrid_offload *pl)
{
	/* the routers' logits the device computes are checked against the CPU's, bit for bit */
	struct hyb_ctx_params cp = { .n_ctx = 64, .n_threads = 2, .hybrid = hy,
				     .moe_defer = defer, .testing = HYB_TESTING_CHECK_ROUTERS };
	struct hyb_ctx *c = hyb_ctx_new(m, &cp);
	const uint32_t V = m->hp.n_vocab;
	float *last = malloc(sizeof(float) * V);
	int32_t toks[N_PROMPT];

	if (!c) {
		free(last);
		return -1;
	}
	CHECK(last != NULL);
	for (int i = 0; i < N_PROMPT; i++)
		toks[i] = (i * 53 + 7) % 400 + 3;
	CHECK(!hyb_ctx_eval(c, toks, N_PROMPT, last, false));
	memcpy(lg + (size_t)N_GEN * V, last, sizeof(float) * V);
	for (int t = 0; t < N_GEN; t++) {
		const float *p = t ? lg + (size_t)(t - 1) * V : last;
		int32_t best = 0;

		for (uint32_t v = 1; v < V; v++)
			best = p[v] > p[best] ? (int32_t)v : best;
		CHECK_MSG(!hyb_ctx_eval(c, &best, 1, lg + (size_t)t * V, false), "%s",
			  hyb_last_error());
	}
	if (st)
		hyb_ctx_hybrid_stats(c, st);
	for (uint32_t l = 0; layer_stats && l < m->hp.n_layer; l++)
		CHECK_MSG(!hyb_ctx_hybrid_layer_stats(c, l, &layer_stats[l]), "%s", hyb_last_error());
	if (layer_stats) {
		struct hyb_hybrid_layer_stats x;

		CHECK(hyb_ctx_hybrid_layer_stats(c, m->hp.n_layer, &x) == -EINVAL);
	}
	if (pl)
		hyb_ctx_hybrid_offload(c, pl);
	/* a second prompt after decoding */
	CHECK_MSG(!hyb_ctx_eval(c, toks, 3, lg + (size_t)(N_GEN + 1) * V, false), "%s",
		  hyb_last_error());
	free(last);
	hyb_ctx_free(c);
	return 0;
}

static int decode(struct hyb_model *m, const struct hyb_hybrid_params *hy, float *lg,
		  struct hyb_hybrid_stats *st, struct hyb_hybrid_offload *pl)
{
	return decode_defer(m, hy, 0, lg, st, pl);
}

/*
 * Every policy, with attention and head on the device too (qwen3moe's
 * attention with its Q/K norms, llama's plain), a second prompt after
 * decoding (the KV rows come back first).
 */
static void cpu_bits(const char *name, const char *args, bool dense, bool shared)
{
	/* the last: lru deciding each layer after it ran (no prefetch from the layer before) */
	static const enum hyb_policy pol[] = { HYB_POLICY_STATIC, HYB_POLICY_LRU,
					       HYB_POLICY_TAM_ADAPTIVE, HYB_POLICY_LAYER,
					       HYB_POLICY_LRU };
	const size_t n_pol = sizeof(pol) / sizeof(pol[0]);
	struct hyb_model *m = hyb_model_load(hyb_test_synth(name, args));
	float *ref, *lg;
	size_t n;

	CHECK_MSG(m, "%s", hyb_last_error());
	n = (size_t)(N_GEN + 2) * m->hp.n_vocab;
	ref = malloc(sizeof(float) * n);
	lg = malloc(sizeof(float) * n);
	CHECK(ref && lg);
	CHECK(!decode(m, NULL, ref, NULL, NULL));
	for (size_t i = 0; i < n_pol; i++) {
		/* two thirds of the model's bytes: the dense parts take half of it where they go */
		struct hyb_hybrid_params hy = { .device = "cpu", .policy = pol[i],
						.gpu_budget = m->weight_bytes / 3 * 2,
						.no_prefetch = i + 1 == n_pol };
		struct hyb_hybrid_stats st;
		struct hyb_hybrid_offload pl;
		struct hyb_hybrid_layer_stats ls[8], sum = { 0 };
		int first = -1;

		CHECK(m->hp.n_layer <= 8);
		layer_stats = ls;
		CHECK_MSG(!decode(m, &hy, lg, &st, &pl), "%s: %s", hyb_policy_name(pol[i]),
			  hyb_last_error());
		layer_stats = NULL;
		/* the layers' statistics add up to the step's */
		for (uint32_t l = 0; l < m->hp.n_layer; l++) {
			sum.active += ls[l].active;
			sum.active_dev += ls[l].active_dev;
			sum.loads += ls[l].loads;
			CHECK(ls[l].active_dev <= ls[l].active);
		}
		CHECK_MSG(sum.active == st.active && sum.active_dev == st.active_dev &&
			  sum.loads == st.loads, "%s: layers %llu/%llu/%llu, step %llu/%llu/%llu",
			  hyb_policy_name(pol[i]), (unsigned long long)sum.active,
			  (unsigned long long)sum.active_dev, (unsigned long long)sum.loads,
			  (unsigned long long)st.active, (unsigned long long)st.active_dev,
			  (unsigned long long)st.loads);
		for (size_t j = 0; j < n && first < 0; j++)
			if (memcmp(&ref[j], &lg[j], sizeof(float)))
				first = (int)(j / m->hp.n_vocab);
		CHECK_MSG(first < 0, "%s %s: row %d's logits differ from the CPU's (%d, %d: the "
			  "prompts)", name, hyb_policy_name(pol[i]), first, N_GEN, N_GEN + 1);
		/* (a prompt's last layer runs for its last row alone, so the cache serves it too) */
		CHECK_MSG(st.tokens == N_GEN && st.active >= (uint64_t)N_GEN * 3 * 4,
			  "%s: %llu tokens, %llu routed experts", hyb_policy_name(pol[i]),
			  (unsigned long long)st.tokens, (unsigned long long)st.active);
		CHECK_MSG(st.active_dev > 0 && st.active_dev < st.active, "%s: %llu of %llu on the "
			  "device", hyb_policy_name(pol[i]), (unsigned long long)st.active_dev,
			  (unsigned long long)st.active);
		CHECK_MSG(pl.experts && pl.attn_layers == (dense ? m->hp.n_layer : 0) &&
			  (pl.head || !dense), "%s: attention of %u layers, head %d on the device",
			  name, pl.attn_layers, pl.head);
		CHECK_MSG(!pl.shared_bytes == !shared, "%s: shared experts (%llu bytes) on the "
			  "device: %s", name, (unsigned long long)pl.shared_bytes, pl.cache_note);
		/* the routers follow attention to the device */
		CHECK_MSG(!pl.router_bytes == !pl.attn_layers, "%s: routers (%llu bytes) on the "
			  "device: %s", name, (unsigned long long)pl.router_bytes, pl.cache_note);
		if (pol[i] == HYB_POLICY_STATIC || pol[i] == HYB_POLICY_LAYER)
			CHECK_MSG(st.loads == 0, "%s moved %llu experts", hyb_policy_name(pol[i]),
				  (unsigned long long)st.loads);
		if (pol[i] == HYB_POLICY_LRU)
			CHECK_MSG(st.loads > 0 && st.load_bytes > 0, "lru loaded nothing");
	}
	/* every expert resident: a prompt's last layer, on the CPU, must not take xn from the device */
	{
		struct hyb_hybrid_params hy = { .device = "cpu", .policy = HYB_POLICY_STATIC,
						.gpu_budget = m->weight_bytes * 2 };
		struct hyb_hybrid_stats st;

		CHECK_MSG(!decode(m, &hy, lg, &st, NULL), "%s", hyb_last_error());
		CHECK_MSG(!memcmp(ref, lg, sizeof(float) * n), "%s: every expert resident: the "
			  "logits differ from the CPU's", name);
		CHECK_EQ_INT(st.active_dev, st.active);
	}
	free(ref);
	free(lg);
	hyb_model_free(m);
}

TEST(moe_hybrid_cpu_device_decodes_the_cpu_bits)
{
	cpu_bits("mh", SMALL " --type Q8_0", true, false);
}

TEST(moe_hybrid_dense_on_device_decodes_the_cpu_bits)
{
	cpu_bits("mhl", SMALL_LLAMA " --type Q4_0", true, false);
}

/* The profile's hottest experts are the static policy's: a profile naming two experts puts those. */
/*
 * Expert deferral beside the device (KTransformers 5): the CPU's deferred
 * experts of a layer run while the next layer's attention is on the device
 * (llama's layout) or before the next layer's routing (qwen3moe's with
 * dense_on_cpu, attention on the CPU) - and the logits stay the CPU-only
 * deferral's bit for bit. The
 * control: deferral does change them.
 */
TEST(moe_hybrid_deferral_beside_the_device_keeps_the_cpu_bits)
{
	static const char *const args[2] = { SMALL, SMALL_LLAMA };

	for (int a = 0; a < 2; a++) {
		struct hyb_model *m = hyb_model_load(hyb_test_synth(a ? "defer_llama" : "defer", args[a]));
		float *ref, *lg, *plain;
		size_t n;

		CHECK_MSG(m, "%s", hyb_last_error());
		n = (size_t)(N_GEN + 2) * m->hp.n_vocab;
		ref = malloc(sizeof(float) * n);
		lg = malloc(sizeof(float) * n);
		plain = malloc(sizeof(float) * n);
		CHECK(ref && lg && plain);
		CHECK(!decode(m, NULL, plain, NULL, NULL));
		for (uint32_t d = 1; d <= 2; d++) {
			struct hyb_hybrid_params hy = { .device = "cpu", .policy = HYB_POLICY_LRU,
							.gpu_budget = m->weight_bytes / 3 * 2,
							.dense_on_cpu = !a };
			struct hyb_hybrid_offload pl;

			CHECK(!decode_defer(m, NULL, d, ref, NULL, NULL));
			CHECK_MSG(memcmp(ref, plain, sizeof(float) * n), "defer %u changed nothing",
				  d);
			CHECK_MSG(!decode_defer(m, &hy, d, lg, NULL, &pl), "%s", hyb_last_error());
			CHECK(a ? pl.attn_layers > 0 : pl.attn_layers == 0);
			CHECK_MSG(!memcmp(ref, lg, sizeof(float) * n),
				  "%s, defer %u: logits differ from the CPU's deferral", args[a], d);
		}
		free(ref);
		free(lg);
		free(plain);
		hyb_model_free(m);
	}
}

TEST(moe_hybrid_static_follows_the_frequencies)
{
	struct hyb_model *m = hyb_model_load(hyb_test_synth("mhf", SMALL " --type Q8_0"));
	const uint32_t L = m ? m->hp.n_layer : 0, X = m ? m->hp.n_expert : 0;
	struct hyb_ctx_params cp = { .n_ctx = 32, .n_threads = 1 };
	struct hyb_hybrid_params hy = { .device = "cpu", .policy = HYB_POLICY_STATIC,
					.dense_on_cpu = true };
	float *f;
	const float **freq;
	int32_t *table;
	uint64_t res, slots;
	struct hyb_ctx *c;

	CHECK_MSG(m, "%s", hyb_last_error());
	f = calloc((size_t)L * X, sizeof(float));
	freq = malloc(sizeof(*freq) * L);
	table = malloc(sizeof(int32_t) * L * X);
	CHECK(f && freq && table);
	for (uint32_t l = 0; l < L; l++) {
		freq[l] = f + (size_t)l * X;
		f[(size_t)l * X + (3 + l) % X] = 0.9f;
		f[(size_t)l * X + (11 + l) % X] = 0.8f;
	}
	hy.bal.freq = freq;
	/* room for two experts per layer and the buffers, not three */
	hy.gpu_budget = 2ull * L * 3 * (64 * 136 + 256) + 65536;
	cp.hybrid = &hy;
	c = hyb_ctx_new(m, &cp);
	CHECK_MSG(c, "%s", hyb_last_error());
	hyb_ctx_hybrid_cache(c, &res, &slots);
	CHECK_MSG(res == slots && slots >= L * 2, "%llu of %llu slots used",
		  (unsigned long long)res, (unsigned long long)slots);
	CHECK(!hyb_ctx_hybrid_table(c, table));
	for (uint32_t l = 0; l < L; l++) {
		CHECK_MSG(table[l * X + (3 + l) % X] >= 0 && table[l * X + (11 + l) % X] >= 0,
			  "layer %u: the hot experts are not resident", l);
	}
	hyb_ctx_free(c);
	/* a frequency outside [0, 1] is refused, naming it */
	f[5] = 1.5f;
	CHECK(!hyb_ctx_new(m, &cp));
	CHECK_MSG(strstr(hyb_last_error(), "frequency 1.5"), "%s", hyb_last_error());
	free(f);
	free(freq);
	free(table);
	hyb_model_free(m);
}

TEST(moe_hybrid_refuses_what_it_cannot_do)
{
	struct hyb_model *m = hyb_model_load(hyb_test_synth("mhr", SMALL " --type Q8_0"));
	struct hyb_hybrid_params hy = { .device = "cpu", .policy = HYB_POLICY_LRU,
					.gpu_budget = 20000 };
	struct hyb_ctx_params cp = { .n_ctx = 32, .n_threads = 1, .hybrid = &hy };

	CHECK_MSG(m, "%s", hyb_last_error());
	/* a budget below one expert and the buffers */
	CHECK(!hyb_ctx_new(m, &cp));
	CHECK_MSG(strstr(hyb_last_error(), "holds no expert"), "%s", hyb_last_error());
	hyb_model_free(m);
	/* experts of a type the device's matvec does not take */
	m = hyb_model_load(hyb_test_synth("mhq", SMALL " --type BF16"));
	CHECK_MSG(m, "%s", hyb_last_error());
	hy.gpu_budget = m->weight_bytes;
	CHECK(!hyb_ctx_new(m, &cp));
	CHECK_MSG(strstr(hyb_last_error(), "BF16") && strstr(hyb_last_error(), "on the CPU"),
		  "%s", hyb_last_error());
	hyb_model_free(m);
}

/* the types the device kernels run through kernels/cuda/deq8.h, here on the CPU device */
TEST(moe_hybrid_k_quant_experts_keep_the_cpu_bits)
{
	/* K-quant rows: widths of 256 */
	cpu_bits("mhk", "--arch qwen3moe --experts 16 --experts-used 4 --expert-ffn 256 "
		 "--hidden 256 --heads 4 --layers 3 --seed 5 --type Q5_K", true, false);
	cpu_bits("mhn", SMALL " --type IQ4_NL", true, false);
}

/* qwen2moe: its attention's q/k/v biases and its gated shared expert on the device too */
TEST(moe_hybrid_biases_on_device_decode_the_cpu_bits)
{
	cpu_bits("mhq2", "--arch qwen2moe --experts 16 --experts-used 4 --expert-ffn 64 "
		 "--hidden 128 --heads 4 --layers 3 --seed 5 --type Q8_0", true, true);
}

/*
 * Several sequences through the expert cache (moe_hybrid.h): every pass's
 * routed experts, the resident ones over their tokens' rows on the device,
 * the rest on the CPU; attention on the CPU. On the CPU device each step's
 * logits of four sequences joining at different steps equal those of the
 * sequence alone on the CPU, bit for bit; some pairs ran on the device.
 */
TEST(moe_hybrid_several_sequences_keep_the_cpu_bits)
{
	static const char *const args[2] = { SMALL " --type Q8_0", SMALL_LLAMA " --type Q4_0" };

	for (int a = 0; a < 2; a++) {
		struct hyb_model *m = hyb_model_load(hyb_test_synth(a ? "ms_llama" : "ms", args[a]));
		const uint32_t V = m ? m->hp.n_vocab : 0, NS = 4;
		struct hyb_hybrid_params hy = { .device = "cpu", .policy = HYB_POLICY_LRU };
		struct hyb_ctx_params one = { .n_ctx = 64, .n_threads = 2, .n_batch = 16 };
		struct hyb_ctx_params many = { .n_ctx = 64, .n_threads = 2, .n_batch = 16,
					       .n_seq = NS, .kv_size = 64 * NS, .hybrid = &hy };
		struct hyb_ctx *ref, *c;
		struct hyb_hybrid_stats st;
		struct hyb_hybrid_offload pl;
		float *want, *got;
		int32_t toks[NS][N_PROMPT], next[NS];
		int seq[NS];

		CHECK_MSG(m, "%s", hyb_last_error());
		hy.gpu_budget = m->weight_bytes / 3 * 2;
		ref = hyb_ctx_new(m, &one);
		c = hyb_ctx_new(m, &many);
		CHECK_MSG(ref && c, "%s", hyb_last_error());
		hyb_ctx_hybrid_offload(c, &pl);
		CHECK(pl.experts && pl.attn_layers == 0);
		want = malloc(sizeof(float) * V * NS * (N_GEN + 1));
		got = malloc(sizeof(float) * V * NS);
		CHECK(want && got);
		/* each alone on the CPU: its prompt, then greedy */
		for (uint32_t i = 0; i < NS; i++) {
			float *w = want + (size_t)i * V * (N_GEN + 1);

			for (int t = 0; t < N_PROMPT; t++)
				toks[i][t] = (int32_t)((t * 37 + i * 101 + 11) % (V - 3) + 3);
			hyb_ctx_reset(ref);
			CHECK(!hyb_ctx_eval(ref, toks[i], N_PROMPT - (int)i, w, false));
			for (int g = 0; g < N_GEN; g++) {
				int32_t t = hyb_test_argmax(w + (size_t)g * V, V);

				CHECK(!hyb_ctx_eval(ref, &t, 1, w + (size_t)(g + 1) * V, false));
			}
		}
		/* together: sequence i joins at step i, its prompt beside the others' tokens */
		for (uint32_t step = 0; step < N_GEN + NS; step++) {
			struct hyb_seq_tokens b[4];
			uint32_t nb = 0, who[4];

			for (uint32_t i = 0; i < NS; i++) {
				const int g = (int)step - (int)i; /* its steps so far */

				if (g < 0 || g > N_GEN)
					continue;
				if (g == 0) {
					seq[i] = hyb_ctx_seq_open(c, N_PROMPT + N_GEN);
					CHECK(seq[i] >= 0);
					b[nb] = (struct hyb_seq_tokens){ seq[i], toks[i],
									 N_PROMPT - i };
				} else {
					b[nb] = (struct hyb_seq_tokens){ seq[i], &next[i], 1 };
				}
				who[nb++] = i;
			}
			if (!nb)
				continue;
			CHECK_MSG(!hyb_ctx_eval_seqs(c, b, nb, got), "%s", hyb_last_error());
			for (uint32_t k = 0; k < nb; k++) {
				const uint32_t i = who[k];
				const int g = (int)step - (int)i;
				const float *w = want + ((size_t)i * (N_GEN + 1) + (size_t)g) * V;

				CHECK_MSG(!memcmp(w, got + (size_t)k * V, sizeof(float) * V),
					  "%s: sequence %u step %d differs from alone on the CPU",
					  args[a], i, g);
				next[i] = hyb_test_argmax(w, V);
				if (g == N_GEN)
					CHECK_EQ_INT(hyb_ctx_seq_close(c, seq[i]), 0);
			}
		}
		hyb_ctx_hybrid_stats(c, &st);
		CHECK(st.active_dev > 0 && st.active_dev < st.active);
		hyb_ctx_free(ref);
		hyb_ctx_free(c);
		free(want);
		free(got);
		hyb_model_free(m);
	}
}

/*
 * One device graph a step (moe_graph.c, docs/MOE.md "One graph a step"):
 * the device's part captured at the second step and launched after, the
 * CPU's in the graph's host functions on the executor thread. On the CPU
 * device the logits stay the CPU-only decode's bit for bit, with and
 * without deferral, for moving and static policies, with the shared
 * expert's gate (qwen2moe); the steps are graphs (the offload says so) and
 * the device took experts. A placement without attention on the device
 * decodes as before and says why.
 */
TEST(moe_hybrid_graph_steps_decode_the_cpu_bits)
{
	static const char *const args[3] = {
		SMALL " --type Q8_0", SMALL_LLAMA " --type Q4_0",
		"--arch qwen2moe --experts 16 --experts-used 4 --expert-ffn 64 --hidden 128 "
		"--heads 4 --layers 3 --seed 5 --type Q8_0",
	};
	static const enum hyb_policy pol[] = { HYB_POLICY_TAM_ADAPTIVE, HYB_POLICY_STATIC,
					       HYB_POLICY_LRU };

	for (int a = 0; a < 3; a++) {
		char name[16];
		struct hyb_model *m;
		float *ref, *lg;
		size_t n;

		snprintf(name, sizeof(name), "graph%d", a);
		m = hyb_model_load(hyb_test_synth(name, args[a]));
		CHECK_MSG(m, "%s", hyb_last_error());
		n = (size_t)(N_GEN + 2) * m->hp.n_vocab;
		ref = malloc(sizeof(float) * n);
		lg = malloc(sizeof(float) * n);
		CHECK(ref && lg);
		for (uint32_t d = 0; d <= 2; d += 2) {
			CHECK(!decode_defer(m, NULL, d, ref, NULL, NULL));
			for (size_t i = 0; i < sizeof(pol) / sizeof(pol[0]); i++) {
				struct hyb_hybrid_params hy = { .device = "cpu", .policy = pol[i],
								.gpu_budget = m->weight_bytes / 3 * 2,
								.graph = true };
				struct hyb_hybrid_stats st;
				struct hyb_hybrid_offload pl;

				CHECK_MSG(!decode_defer(m, &hy, d, lg, &st, &pl), "%s", hyb_last_error());
				CHECK_MSG(!strcmp(pl.graph_note, "one device graph a step"), "%s: %s",
					  args[a], pl.graph_note);
				CHECK_MSG(!memcmp(ref, lg, sizeof(float) * n), "%s, %s, defer %u: graph "
					  "steps' logits differ from the CPU's", args[a],
					  hyb_policy_name(pol[i]), d);
				CHECK_EQ_INT(st.tokens, N_GEN);
				CHECK_MSG(st.active_dev > 0 && st.active_dev <= st.active,
					  "%llu of %llu on the device", (unsigned long long)st.active_dev,
					  (unsigned long long)st.active);
				CHECK(a < 2 || pl.shared_bytes > 0);
			}
		}
		/* attention on the CPU: no graph, and why */
		{
			struct hyb_hybrid_params hy = { .device = "cpu", .policy = HYB_POLICY_LRU,
							.gpu_budget = m->weight_bytes / 3 * 2,
							.graph = true, .dense_on_cpu = true };
			struct hyb_hybrid_offload pl;

			CHECK(!decode(m, &hy, lg, NULL, &pl));
			CHECK_MSG(strstr(pl.graph_note, "not one graph a step: the head"), "%s",
				  pl.graph_note);
		}
		free(ref);
		free(lg);
		hyb_model_free(m);
	}
}
