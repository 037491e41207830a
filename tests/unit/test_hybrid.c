// SPDX-License-Identifier: MIT
/*
 * Hybrid decoding end to end on the CPU-executed device:
 * a small plan model, every balancer policy, a drift workload.
 *   - Oracle mode: the hybrid output is bit-identical to CPU-only sparse
 *     decoding, whatever the policy moved where (every listed neuron
 *     computed exactly once from the right bytes, merged in group order).
 *   - Normal mode: the cache never exceeds its slots, the device computes a
 *     share of the active neurons, static and layer never reload, the
 *     dynamic policies do under drift, and greedy tokens agree with the
 *     CPU-only path.
 *   - Dense parts on the device (attention blocks with their KV cache, the
 *     head): placed first within the budget; the layer policy places whole
 *     layers; oracle-mode output stays bit-identical to the CPU-only path
 *     (the CPU device runs forward.c's arithmetic), including prompt batches
 *     after decoded tokens (KV rows come back) and a reset; the device
 *     merge gives the host merge's bits.
 *   - Refusals: no plan, a budget that holds nothing, CUDA in a build
 *     without it.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hyb/hybrid.h"
#include "hyb/model.h"
#include "hyb/testing.h"
#include "hybrid/dense.h"
#include "test.h"

#define N_PROMPT 12
#define N_GEN 36
#define DRIFT 6
#define N_CTX 128

static struct hyb_ctx *ctx_new(const struct hyb_model *m, const struct hyb_hybrid_params *hy,
			       bool oracle)
{
	struct hyb_ctx_params p = {
		.n_ctx = N_CTX, .n_threads = 2, .ffn = HYB_FFN_SPARSE, .hybrid = hy,
		.testing = oracle ? HYB_TESTING_FFN_ORACLE : 0,
	};
	struct hyb_ctx *c = hyb_ctx_new(m, &p);

	CHECK_MSG(c, "%s", hyb_last_error());
	return c;
}

/* Greedy with a forced random token every DRIFT steps; ids[] receives the sequence. */
static void run(struct hyb_ctx *c, const struct hyb_model *m, const int32_t *force,
		int32_t *ids, float *logits_out)
{
	const uint32_t V = m->hp.n_vocab;
	float *lg = malloc(sizeof(float) * V);
	int32_t prompt[N_PROMPT];

	CHECK(lg);
	for (int i = 0; i < N_PROMPT; i++)
		prompt[i] = (int32_t)(3 + (uint32_t)(i * 2654435761u) % (V - 3));
	CHECK_MSG(!hyb_ctx_eval(c, prompt, N_PROMPT, lg, false), "%s", hyb_last_error());
	for (int i = 0; i < N_GEN; i++) {
		int32_t t = force ? force[i] : (i % DRIFT == DRIFT - 1 ?
				(int32_t)(3 + (uint32_t)(i * 40503u + 7) % (V - 3)) :
				hyb_test_argmax(lg, V));

		ids[i] = t;
		if (logits_out)
			memcpy(logits_out + (size_t)i * V, lg, sizeof(float) * V);
		CHECK_MSG(!hyb_ctx_eval(c, &t, 1, lg, false), "%s", hyb_last_error());
	}
	free(lg);
}

static struct hyb_model *load_plan(void)
{
	struct hyb_model *m = hyb_model_load(hyb_test_plan());

	CHECK_MSG(m, "%s", hyb_last_error());
	CHECK(m->group_size > 0);
	return m;
}

static uint64_t slot_bytes(const struct hyb_model *m)
{
	return 3ull * m->group_size * m->layers[0].plan.bundles.row_bytes;
}

/* Every attention block with its KV cache, the head and their buffers. */
static uint64_t dense_bytes(const struct hyb_model *m)
{
	uint64_t b = hyb_hdense_head_bytes(m) + hyb_hdense_buffer_bytes(m, true, true, true);

	for (uint32_t l = 0; l < m->hp.n_layer; l++)
		b += hyb_hdense_layer_bytes(m, l, N_CTX) + hyb_hdense_pred_bytes(m, l);
	return b;
}

/* Room for the dense parts and about a third of the model's FFN groups. */
static struct hyb_hybrid_params params(const struct hyb_model *m, enum hyb_policy p)
{
	return (struct hyb_hybrid_params){
		.device = "cpu", .policy = p,
		.gpu_budget = dense_bytes(m) + slot_bytes(m) * m->n_groups * m->hp.n_layer / 3 +
			      (1u << 20),
	};
}

TEST(hybrid_oracle_bit_identical_every_policy)
{
	struct hyb_model *m = load_plan();
	const uint32_t V = m->hp.n_vocab;
	struct hyb_ctx *ref = ctx_new(m, NULL, true);
	int32_t ids[N_GEN], ids2[N_GEN];
	float *lref = malloc(sizeof(float) * V * N_GEN), *lhy = malloc(sizeof(float) * V * N_GEN);

	CHECK(lref && lhy);
	run(ref, m, NULL, ids, lref);
	for (int p = 0; p < HYB_N_POLICIES; p++) {
		struct hyb_hybrid_params hy = params(m, (enum hyb_policy)p);
		struct hyb_ctx *c;
		struct hyb_hybrid_stats st;

		/* layer runs its CPU layers dense (llama.cpp -ngl): other sums */
		if (p == HYB_POLICY_LAYER)
			continue;
		c = ctx_new(m, &hy, true);
		run(c, m, ids, ids2, lhy);
		hyb_ctx_hybrid_stats(c, &st);
		CHECK_MSG(st.active_dev > 0, "%s: no neuron ran on the device",
			  hyb_policy_name((enum hyb_policy)p));
		for (int i = 0; i < N_GEN; i++)
			CHECK_MSG(!memcmp(lref + (size_t)i * V, lhy + (size_t)i * V,
					  sizeof(float) * V),
				  "%s: logits of step %d differ from CPU-only sparse decoding",
				  hyb_policy_name((enum hyb_policy)p), i);
		hyb_ctx_free(c);
	}
	hyb_ctx_free(ref);
	free(lref);
	free(lhy);
	hyb_model_free(m);
}

TEST(hybrid_policies_keep_their_invariants)
{
	struct hyb_model *m = load_plan();
	struct hyb_ctx *ref = ctx_new(m, NULL, false);
	int32_t ids[N_GEN], ids2[N_GEN];

	run(ref, m, NULL, ids, NULL);
	for (int p = 0; p < HYB_N_POLICIES; p++) {
		const enum hyb_policy pol = (enum hyb_policy)p;
		struct hyb_hybrid_params hy = params(m, pol);
		struct hyb_ctx *c = ctx_new(m, &hy, false);
		struct hyb_hybrid_stats st;
		struct hyb_hybrid_offload pl;
		uint64_t res, slots;

		run(c, m, ids, ids2, NULL);
		hyb_ctx_hybrid_stats(c, &st);
		hyb_ctx_hybrid_offload(c, &pl);
		hyb_ctx_hybrid_cache(c, &res, &slots);
		CHECK_MSG(res <= slots && slots > 0, "%s: %llu groups in %llu slots",
			  hyb_policy_name(pol), (unsigned long long)res,
			  (unsigned long long)slots);
		CHECK(slots * slot_bytes(m) + pl.dense_bytes <= hy.gpu_budget);
		CHECK_EQ_INT(pl.cache_bytes, slots * ((slot_bytes(m) + 255) / 256 * 256));
		CHECK_EQ_INT(st.tokens, N_GEN);
		CHECK_EQ_INT(st.layer_steps,
			     (uint64_t)N_GEN * (m->hp.n_layer - pl.dense_layers_cpu));
		CHECK(st.active_dev <= st.active && st.late <= st.active - st.active_dev);
		CHECK_MSG(st.active_dev > 0, "%s: nothing ran on the device", hyb_policy_name(pol));
		if (pol == HYB_POLICY_STATIC || pol == HYB_POLICY_LAYER)
			CHECK_MSG(st.loads == 0 && st.evicts == 0, "%s reloaded %llu groups",
				  hyb_policy_name(pol), (unsigned long long)st.loads);
		if (pol == HYB_POLICY_LRU || pol == HYB_POLICY_TOPK)
			CHECK_MSG(st.loads > 0, "%s never reloaded under drift",
				  hyb_policy_name(pol));
		/* a load moves one whole bundle: at least one neuron's three rows */
		CHECK(st.load_bytes >= st.loads * 3 * m->layers[0].plan.bundles.row_bytes);
		if (pol == HYB_POLICY_TAM || pol == HYB_POLICY_TAM_ADAPTIVE) {
			const double lam = hyb_ctx_hybrid_lambda(c, 0);

			CHECK_MSG(lam > 0 && lam < 1, "lambda %g", lam);
		} else {
			CHECK(isnan(hyb_ctx_hybrid_lambda(c, 0)));
		}
		hyb_ctx_free(c);
	}
	hyb_ctx_free(ref);
	hyb_model_free(m);
}

TEST(hybrid_greedy_agrees_with_cpu_sparse)
{
	struct hyb_model *m = load_plan();
	const uint32_t V = m->hp.n_vocab;
	struct hyb_ctx *ref = ctx_new(m, NULL, false);
	struct hyb_hybrid_params hy = params(m, HYB_POLICY_TAM_ADAPTIVE);
	struct hyb_ctx *c = ctx_new(m, &hy, false);
	float *lr = malloc(sizeof(float) * V * N_GEN), *lh = malloc(sizeof(float) * V * N_GEN);
	int32_t ids[N_GEN], ids2[N_GEN];
	int agree = 0, n = 0;

	CHECK(lr && lh);
	run(ref, m, NULL, ids, lr);
	run(c, m, ids, ids2, lh);
	for (int i = 0; i < N_GEN; i++) {
		agree += hyb_test_argmax(lr + (size_t)i * V, V) == hyb_test_argmax(lh + (size_t)i * V, V);
		n++;
	}
	/* the split only reorders float sums: near-ties may flip, little else */
	CHECK_MSG(agree >= n - 2, "greedy agreement %d/%d", agree, n);
	free(lr);
	free(lh);
	hyb_ctx_free(c);
	hyb_ctx_free(ref);
	hyb_model_free(m);
}

/*
 * Load-aware thresholds (DynamicInfer 4.4): on by default for the dynamic
 * policy, with the predictors on the device (scores copied down) and on the
 * CPU (dense parts kept there); they move work and keep greedy decoding
 * close to the one threshold's; off, and for other policies unless asked,
 * nothing moves; where they cannot apply they are refused.
 */
TEST(hybrid_load_aware_thresholds)
{
	struct hyb_model *m = load_plan();
	const uint32_t V = m->hp.n_vocab;
	struct hyb_ctx *ref = ctx_new(m, NULL, false);
	float *lr = malloc(sizeof(float) * V * N_GEN), *lh = malloc(sizeof(float) * V * N_GEN);
	int32_t ids[N_GEN], ids2[N_GEN];

	CHECK(lr && lh);
	run(ref, m, NULL, ids, lr);
	for (int k = 0; k < 5; k++) {
		struct hyb_hybrid_params hy = params(m, k == 3 ? HYB_POLICY_STATIC :
							  k == 4 ? HYB_POLICY_TAM : HYB_POLICY_DYNAMIC);
		struct hyb_hybrid_stats st;
		struct hyb_hybrid_offload pl;
		int agree = 0;

		hy.dense_on_cpu = k == 1;
		if (k == 1) /* the same third of the groups, nothing else */
			hy.gpu_budget -= dense_bytes(m);
		hy.thresholds = k == 2 ? HYB_THR_OFF : k == 3 ? HYB_THR_PAPER : HYB_THR_AUTO;
		struct hyb_ctx *c = ctx_new(m, &hy, false);

		run(c, m, ids, ids2, lh);
		hyb_ctx_hybrid_stats(c, &st);
		hyb_ctx_hybrid_offload(c, &pl);
		for (int i = 0; i < N_GEN; i++)
			agree += hyb_test_argmax(lr + (size_t)i * V, V) ==
				 hyb_test_argmax(lh + (size_t)i * V, V);
		printf("    case %d: predictors on the device %u, %.1f added and %.1f dropped a "
		       "token, greedy %d/%d\n", k, pl.predictors, (double)st.thr_added / N_GEN,
		       (double)st.thr_dropped / N_GEN, agree, N_GEN);
		CHECK(k == 1 ? pl.predictors == 0 : pl.predictors > 0);
		if (k == 2 || k == 4) {
			CHECK_EQ_INT(st.thr_added + st.thr_dropped, 0);
			CHECK_MSG(agree >= N_GEN - 2, "greedy agreement %d/%d", agree, N_GEN);
		} else {
			CHECK_MSG(st.thr_added > 0 && st.thr_dropped > 0,
				  "case %d: %llu added, %llu dropped", k,
				  (unsigned long long)st.thr_added,
				  (unsigned long long)st.thr_dropped);
			/* a skipped neuron changes the sums: within the error the one
			 * threshold had, most greedy tokens stay */
			CHECK_MSG(agree >= N_GEN * 3 / 4, "greedy agreement %d/%d", agree, N_GEN);
		}
		hyb_ctx_free(c);
	}

	/* where they cannot apply: the layer policy, an unknown mode */
	struct hyb_hybrid_params hy = params(m, HYB_POLICY_LAYER);
	struct hyb_ctx_params p = { .n_ctx = N_CTX, .n_threads = 1, .ffn = HYB_FFN_SPARSE,
				    .hybrid = &hy };

	hy.thresholds = HYB_THR_EXPECTED;
	CHECK(!hyb_ctx_new(m, &p));
	CHECK_MSG(strstr(hyb_last_error(), "layer policy"), "%s", hyb_last_error());
	hy = params(m, HYB_POLICY_DYNAMIC);
	hy.thresholds = (enum hyb_thresholds)9;
	CHECK(!hyb_ctx_new(m, &p));
	CHECK_MSG(strstr(hyb_last_error(), "threshold mode"), "%s", hyb_last_error());
	free(lr);
	free(lh);
	hyb_ctx_free(ref);
	hyb_model_free(m);
}

TEST(hybrid_refuses_bad_setups)
{
	struct hyb_model *m = load_plan();
	struct hyb_hybrid_params hy = params(m, HYB_POLICY_TAM);
	struct hyb_ctx_params p = { .n_ctx = 64, .n_threads = 1, .hybrid = &hy };
	struct hyb_model *dense;

	hy.gpu_budget = 4096;
	CHECK(!hyb_ctx_new(m, &p));
	CHECK_MSG(strstr(hyb_last_error(), "holds nothing"), "%s", hyb_last_error());

	hy = params(m, HYB_POLICY_TAM);
	hy.device = "cuda";
	struct hyb_ctx *c = hyb_ctx_new(m, &p);

	/* this test binary links no CUDA: a clear refusal, never a crash */
	CHECK_MSG(!c && strstr(hyb_last_error(), "CUDA"), "%s", hyb_last_error());

	hy = params(m, HYB_POLICY_TAM);
	p.ffn = HYB_FFN_DENSE;
	CHECK(!hyb_ctx_new(m, &p));
	CHECK_MSG(strstr(hyb_last_error(), "dense"), "%s", hyb_last_error());

	dense = hyb_model_load(hyb_test_shared("models/llama-2-tiny-random.gguf"));
	CHECK_MSG(dense, "%s", hyb_last_error());
	/* a plain model decodes hybrid whole (test_plain_hybrid.c), never sparse */
	p.ffn = HYB_FFN_SPARSE;
	CHECK(!hyb_ctx_new(dense, &p));
	CHECK_MSG(strstr(hyb_last_error(), "plan"), "%s", hyb_last_error());
	p.ffn = HYB_FFN_AUTO;
	c = hyb_ctx_new(dense, &p);
	CHECK_MSG(c, "%s", hyb_last_error());
	{
		struct hyb_hybrid_offload pl;

		hyb_ctx_hybrid_offload(c, &pl);
		CHECK(pl.plain);
	}
	hyb_ctx_free(c);
	hyb_model_free(dense);
	hyb_model_free(m);
}

TEST(hybrid_dense_placement)
{
	struct hyb_model *m = load_plan();
	const uint32_t L = m->hp.n_layer;
	const uint64_t attn = hyb_hdense_layer_bytes(m, 0, N_CTX);
	struct hyb_hybrid_params hy = params(m, HYB_POLICY_TAM);
	struct hyb_hybrid_offload pl, pc;
	struct hyb_ctx *c;

	CHECK(attn > 0 && hyb_hdense_head_bytes(m) > 0);
	/* attention blocks and head first, the rest for groups */
	c = ctx_new(m, &hy, false);
	hyb_ctx_hybrid_offload(c, &pl);
	CHECK_EQ_INT(pl.attn_layers, L);
	CHECK(pl.head);
	CHECK_EQ_INT(pl.predictors, L);
	CHECK_EQ_INT(pl.dense_layers_cpu, 0);
	CHECK(pl.dense_bytes >= L * attn + hyb_hdense_head_bytes(m));
	CHECK(pl.cache_bytes > 0 && pl.dense_bytes + pl.cache_bytes <= hy.gpu_budget);
	hyb_ctx_free(c);

	/* dense_on_cpu: all of it for groups */
	hy.dense_on_cpu = true;
	c = ctx_new(m, &hy, false);
	hyb_ctx_hybrid_offload(c, &pc);
	CHECK(pc.attn_layers == 0 && !pc.head && pc.dense_bytes == 0);
	CHECK(pc.cache_bytes > pl.cache_bytes);
	hyb_ctx_free(c);

	/* room for one attention block and nothing else: a valid (if slow) setup */
	hy.dense_on_cpu = false;
	hy.gpu_budget = attn + hyb_hdense_buffer_bytes(m, true, false, false) + 64 * 1024;
	c = ctx_new(m, &hy, false);
	hyb_ctx_hybrid_offload(c, &pc);
	CHECK_EQ_INT(pc.attn_layers, 1);
	CHECK(!pc.head);
	hyb_ctx_free(c);

	/* layer: whole layers in order, the others dense on the CPU */
	hy = params(m, HYB_POLICY_LAYER);
	c = ctx_new(m, &hy, false);
	hyb_ctx_hybrid_offload(c, &pc);
	CHECK(pc.attn_layers >= 1 && pc.attn_layers < L);
	CHECK_EQ_INT(pc.dense_layers_cpu, L - pc.attn_layers);
	CHECK(!pc.head); /* llama.cpp offloads the output layer last */
	CHECK_EQ_INT(pc.cache_bytes,
		     pc.attn_layers * m->n_groups * ((slot_bytes(m) + 255) / 256 * 256));
	hyb_ctx_free(c);
	hyb_model_free(m);
}

/* prompt, decode, a prompt batch (CPU) after decoded tokens, decode, reset, again */
static void run_mixed(struct hyb_ctx *c, const struct hyb_model *m, float *out)
{
	const uint32_t V = m->hp.n_vocab;
	static const int32_t p1[5] = { 7, 99, 23, 301, 42 }, p2[4] = { 5, 77, 13, 400 };
	size_t k = 0;

	for (int round = 0; round < 2; round++) {
		CHECK_MSG(!hyb_ctx_eval(c, p1, 5, out + k++ * V, false), "%s",
			  hyb_last_error());
		for (int i = 0; i < 6; i++) {
			int32_t t = hyb_test_argmax(out + (k - 1) * V, V);

			CHECK_MSG(!hyb_ctx_eval(c, &t, 1, out + k++ * V, false),
				  "%s", hyb_last_error());
		}
		CHECK_MSG(!hyb_ctx_eval(c, p2, 4, out + k++ * V, false), "%s",
			  hyb_last_error());
		for (int i = 0; i < 6; i++) {
			int32_t t = hyb_test_argmax(out + (k - 1) * V, V);

			CHECK_MSG(!hyb_ctx_eval(c, &t, 1, out + k++ * V, false),
				  "%s", hyb_last_error());
		}
		hyb_ctx_reset(c);
	}
}

TEST(hybrid_dense_kv_follows_prompts_and_resets)
{
	struct hyb_model *m = load_plan();
	const uint32_t V = m->hp.n_vocab;
	const size_t n = 2 * 14;
	float *lr = calloc(n * V, sizeof(float)), *lh = calloc(n * V, sizeof(float));
	struct hyb_hybrid_params hy = params(m, HYB_POLICY_TAM_ADAPTIVE);
	struct hyb_ctx *ref = ctx_new(m, NULL, true), *c = ctx_new(m, &hy, true);
	struct hyb_hybrid_offload pl;

	CHECK(lr && lh);
	hyb_ctx_hybrid_offload(c, &pl);
	CHECK_EQ_INT(pl.attn_layers, m->hp.n_layer);
	run_mixed(ref, m, lr);
	run_mixed(c, m, lh);
	for (size_t i = 0; i < n; i++)
		CHECK_MSG(!memcmp(lr + i * V, lh + i * V, sizeof(float) * V),
			  "logits of eval %zu differ from CPU-only sparse decoding", i);
	/* the second round repeats the first: the reset forgot every row */
	CHECK(!memcmp(lh, lh + 14 * V, sizeof(float) * V * 14));
	hyb_ctx_free(c);
	hyb_ctx_free(ref);
	free(lr);
	free(lh);
	hyb_model_free(m);
}

/*
 * Prompt batches with the placed attention blocks and head on the device
 *, the FFN split by the cache. Oracle mode (FFN whole on
 * the CPU): with one attention block placed, or all of them, prompts and
 * decoded tokens interleaved, the logits are the CPU-only sparse decoder's
 * bit for bit (Q8_0 products add the same in one column as in a batch).
 * Otherwise the cached groups' share of each layer runs on the device, one
 * FFN kernel per token and layer more, and the logits stay close.
 * prefill_cpu: the prompt leaves the device alone.
 */
TEST(hybrid_prefill_on_the_device)
{
	struct hyb_model *m = load_plan();
	const uint32_t V = m->hp.n_vocab, L = m->hp.n_layer;
	const size_t n = 2 * 14;
	static const int32_t prompt[6] = { 11, 222, 33, 404, 5, 66 };
	float *lr = calloc(n * V, sizeof(float)), *lh = calloc(n * V, sizeof(float));
	struct hyb_hybrid_params hy = params(m, HYB_POLICY_LRU);
	struct hyb_ctx *ref = ctx_new(m, NULL, true), *c;
	struct hyb_hybrid_offload pl;
	struct hyb_device_stats ds;

	CHECK(lr && lh);
	run_mixed(ref, m, lr);
	for (int k = 0; k < 2; k++) {
		/* k = 1: room for one attention block; the other layers' run on the CPU */
		if (k)
			hy.gpu_budget = hyb_hdense_layer_bytes(m, 0, N_CTX) +
					hyb_hdense_buffer_bytes(m, true, false, false) + 64 * 1024;
		c = ctx_new(m, &hy, true);
		hyb_ctx_hybrid_offload(c, &pl);
		CHECK_EQ_INT(pl.attn_layers, k ? 1 : L);
		CHECK(!hyb_ctx_eval(c, prompt, 6, lh, false));
		hyb_ctx_hybrid_device_stats(c, &ds);
		/* per token and placed layer: two norms, q/k/v as one matvec (the plan's
		 * three share a type), o, the attention */
		CHECK_MSG(ds.kernels >= 6ull * 5 * pl.attn_layers, "%llu kernels for the prompt",
			  (unsigned long long)ds.kernels);
		hyb_ctx_reset(c);
		memset(lh, 0, n * V * sizeof(float));
		run_mixed(c, m, lh);
		for (size_t i = 0; i < n; i++)
			CHECK_MSG(!memcmp(lr + i * V, lh + i * V, sizeof(float) * V),
				  "%u attention blocks placed: logits of eval %zu differ from "
				  "CPU-only sparse decoding", pl.attn_layers, i);
		hyb_ctx_free(c);
	}
	/* the FFN split: one kernel more per row and layer than oracle mode's */
	{
		struct hyb_ctx *cpu = ctx_new(m, NULL, false), *o;
		float *lc = calloc(V, sizeof(float));
		struct hyb_device_stats dso;
		double amax = 0, d = 0;

		hy = params(m, HYB_POLICY_LRU);
		c = ctx_new(m, &hy, false);
		o = ctx_new(m, &hy, true);
		CHECK(lc && !hyb_ctx_eval(c, prompt, 6, lh, false));
		CHECK(!hyb_ctx_eval(o, prompt, 6, lr, false));
		CHECK(!hyb_ctx_eval(cpu, prompt, 6, lc, false));
		hyb_ctx_hybrid_device_stats(c, &ds);
		hyb_ctx_hybrid_device_stats(o, &dso);
		/* (the last layer's FFN runs for the one row that gives logits) */
		CHECK_MSG(ds.kernels == dso.kernels + 6ull * (L - 1) + 1,
			  "%llu kernels, oracle mode %llu", (unsigned long long)ds.kernels,
			  (unsigned long long)dso.kernels);
		for (uint32_t k = 0; k < V; k++) {
			amax = fmax(amax, fabs(lc[k]));
			d = fmax(d, fabs(lc[k] - lh[k]));
		}
		fprintf(stderr, "    FFN split: logits within %.2g of the largest\n", d / amax);
		CHECK(hyb_test_argmax(lc, V) == hyb_test_argmax(lh, V) && d <= 1e-4 * amax);
		hyb_ctx_free(o);
		hyb_ctx_free(c);
		hyb_ctx_free(cpu);
		free(lc);
	}
	/* prefill_cpu: the prompt leaves the device alone */
	hy = params(m, HYB_POLICY_LRU);
	hy.prefill_cpu = true;
	c = ctx_new(m, &hy, true);
	CHECK(!hyb_ctx_eval(c, prompt, 6, lh, false));
	hyb_ctx_hybrid_device_stats(c, &ds);
	CHECK_EQ_INT(ds.kernels, 0);
	hyb_ctx_free(c);
	hyb_ctx_free(ref);
	free(lr);
	free(lh);
	hyb_model_free(m);
}

/*
 * Prompts of 32 tokens and more run as batches on the device (docs/HYBRID.md
 * "Prompts"): batched attention, the FFN dense there - cached groups in
 * place, the others streamed through two staging areas - in chunks of the
 * batch's capacity. Against the CPU-only sparse decoder: every row's logits
 * close and the same greedy tokens after the prompt; under the CPU device's
 * strict mode (the unit tests' default) a host or stream that did not honour
 * the events would fail. Also with the layer policy, whose CPU layers'
 * attention runs on the host between the device's FFNs, and a short prompt
 * (token after token, no batch).
 */
TEST(hybrid_prompt_batch_on_the_device)
{
	enum { NP = 100, NG = 8 };
	struct hyb_model *m = load_plan();
	const uint32_t V = m->hp.n_vocab;
	float *lr = calloc((size_t)NP * V, sizeof(float)), *lh = calloc((size_t)NP * V, sizeof(float));
	struct hyb_ctx *ref = ctx_new(m, NULL, false);
	int32_t prompt[NP], ids_r[NG], ids_h[NG];

	CHECK(lr && lh);
	for (int i = 0; i < NP; i++)
		prompt[i] = (int32_t)(3 + (uint32_t)(i * 2654435761u) % (V - 3));
	CHECK_MSG(!hyb_ctx_eval(ref, prompt, NP, lr, true), "%s", hyb_last_error());
	/* greedy continuation of the reference */
	{
		float *lg = calloc(V, sizeof(float));

		CHECK(lg);
		memcpy(lg, lr + (size_t)(NP - 1) * V, sizeof(float) * V);
		for (int i = 0; i < NG; i++) {
			ids_r[i] = hyb_test_argmax(lg, V);
			CHECK(!hyb_ctx_eval(ref, &ids_r[i], 1, lg, false));
		}
		free(lg);
	}
	for (int k = 0; k < 2; k++) {
		struct hyb_hybrid_params hy = params(m, k ? HYB_POLICY_LAYER : HYB_POLICY_STATIC);
		struct hyb_hybrid_offload pl;
		struct hyb_hybrid_stats st;
		struct hyb_ctx *c;
		double worst = 0;
		float *lg = calloc(V, sizeof(float));

		hy.prompt_batch = 40; /* 100 tokens: three batches */
		if (k) /* two whole layers: the others' attention on the host */
			hy.gpu_budget = 2 * (hyb_hdense_layer_bytes(m, 0, N_CTX) +
					     slot_bytes(m) * m->n_groups) +
					hyb_hdense_buffer_bytes(m, true, false, false) + (1u << 20);
		c = ctx_new(m, &hy, false);
		hyb_ctx_hybrid_offload(c, &pl);
		CHECK_MSG(pl.prompt_batch == 40, "%s: a prompt batch of %u tokens (%.2f MB)",
			  k ? "layer" : "static", pl.prompt_batch, pl.prompt_bytes / 1e6);
		CHECK_MSG(!k || (pl.attn_layers > 0 && pl.attn_layers < m->hp.n_layer), "%u of %u layers", pl.attn_layers, m->hp.n_layer);
		/* the batch borrows the cache's last slots: the same groups cached after it */
		const size_t nt = (size_t)m->hp.n_layer * m->n_groups;
		int32_t *t0 = malloc(4 * nt), *t1 = malloc(4 * nt);

		CHECK(t0 && t1 && !hyb_ctx_hybrid_table(c, t0));
		CHECK_MSG(!hyb_ctx_eval(c, prompt, NP, lh, true), "%s", hyb_last_error());
		CHECK(!hyb_ctx_hybrid_table(c, t1));
		for (size_t i = 0; i < nt; i++)
			CHECK_MSG((t0[i] >= 0) == (t1[i] >= 0), "group %zu %s the cache after the "
				  "prompt", i, t0[i] >= 0 ? "left" : "entered");
		free(t0);
		free(t1);
		hyb_ctx_hybrid_stats(c, &st);
		CHECK_EQ_INT(st.prompt_batches, 3);
		/* static moves nothing: these are the borrowed slots' groups coming back */
		CHECK_MSG(k || st.loads > 0, "no group reloaded after the prompt");
		CHECK(st.prompt_stream_bytes > 0);
		for (int i = 0; i < NP; i++) {
			const float *a = lr + (size_t)i * V, *b = lh + (size_t)i * V;
			double amax = 0, d = 0;

			for (uint32_t j = 0; j < V; j++) {
				amax = fmax(amax, fabs(a[j]));
				d = fmax(d, fabs(a[j] - b[j]));
			}
			worst = fmax(worst, d / amax);
		}
		memcpy(lg, lh + (size_t)(NP - 1) * V, sizeof(float) * V);
		for (int i = 0; i < NG; i++) {
			ids_h[i] = hyb_test_argmax(lg, V);
			CHECK(!hyb_ctx_eval(c, &ids_h[i], 1, lg, false));
		}
		fprintf(stderr, "    %s: %u attention blocks placed, %llu MB streamed, logits of "
			"%d rows within %.2g of the largest\n", k ? "layer" : "static",
			pl.attn_layers, (unsigned long long)(st.prompt_stream_bytes >> 20), NP, worst);
		CHECK_MSG(worst < 5e-3, "logits within %g", worst);
		CHECK_MSG(!memcmp(ids_r, ids_h, sizeof(ids_r)), "greedy tokens after the prompt differ");
		/* a short prompt: token after token */
		hyb_ctx_reset(c);
		hyb_ctx_hybrid_stats_reset(c);
		CHECK(!hyb_ctx_eval(c, prompt, 31, lh, false));
		hyb_ctx_hybrid_stats(c, &st);
		CHECK_EQ_INT(st.prompt_batches, 0);
		hyb_ctx_free(c);
		free(lg);
	}
	/* no batch: the placement says why (hyb serve and hyb run -v print it) */
	for (int k = 0; k < 2; k++) {
		struct hyb_hybrid_params hy = params(m, HYB_POLICY_STATIC);
		struct hyb_hybrid_offload pl;
		struct hyb_ctx *c;

		hy.prompt_batch = k ? 0 : 100000;
		hy.prefill_cpu = k;
		c = ctx_new(m, &hy, false);
		hyb_ctx_hybrid_offload(c, &pl);
		CHECK_EQ_INT(pl.prompt_batch, 0);
		CHECK_MSG(strstr(pl.prompt_note, k ? "--prefill-cpu; prompts run token after token" :
				 "a batch needs 100000; prompts run token after token"), "%s",
			  pl.prompt_note);
		hyb_ctx_free(c);
	}
	hyb_ctx_free(ref);
	free(lr);
	free(lh);
	hyb_model_free(m);
}

TEST(hybrid_device_merge_equals_host_merge)
{
	struct hyb_model *m = load_plan();
	const uint32_t V = m->hp.n_vocab;
	struct hyb_hybrid_params dev = params(m, HYB_POLICY_STATIC), host = dev;
	struct hyb_hybrid_offload pd, ph;
	struct hyb_hybrid_stats st;
	float *ld = malloc(sizeof(float) * V * N_GEN), *lh = malloc(sizeof(float) * V * N_GEN);
	int32_t ids[N_GEN], ids2[N_GEN];
	struct hyb_ctx *cd, *ch;

	CHECK(ld && lh);
	cd = ctx_new(m, &dev, false);
	hyb_ctx_hybrid_offload(cd, &pd);
	/* the same neuron cache, with attention and head on the CPU */
	host.dense_on_cpu = true;
	host.gpu_budget = dev.gpu_budget - pd.dense_bytes;
	ch = ctx_new(m, &host, false);
	hyb_ctx_hybrid_offload(ch, &ph);
	CHECK_EQ_INT(ph.cache_bytes, pd.cache_bytes);
	run(ch, m, NULL, ids, lh);
	run(cd, m, ids, ids2, ld);
	hyb_ctx_hybrid_stats(cd, &st);
	CHECK(st.active_dev > 0 && st.active_dev < st.active);
	for (int i = 0; i < N_GEN; i++)
		CHECK_MSG(!memcmp(lh + (size_t)i * V, ld + (size_t)i * V, sizeof(float) * V),
			  "step %d: merge on the device differs from the host merge", i);
	hyb_ctx_free(cd);
	hyb_ctx_free(ch);
	free(ld);
	free(lh);
	hyb_model_free(m);
}

TEST(hybrid_layer_policy_agrees_with_cpu_dense)
{
	struct hyb_model *m = load_plan();
	const uint32_t V = m->hp.n_vocab;
	struct hyb_hybrid_params hy = params(m, HYB_POLICY_LAYER);
	struct hyb_ctx_params p = { .n_ctx = N_CTX, .n_threads = 2, .ffn = HYB_FFN_DENSE };
	struct hyb_ctx *ref = hyb_ctx_new(m, &p), *c = ctx_new(m, &hy, false);
	float *lr = malloc(sizeof(float) * V * N_GEN), *lh = malloc(sizeof(float) * V * N_GEN);
	int32_t ids[N_GEN], ids2[N_GEN];
	int agree = 0;

	CHECK_MSG(ref, "%s", hyb_last_error());
	CHECK(lr && lh);
	run(ref, m, NULL, ids, lr);
	run(c, m, ids, ids2, lh);
	for (int i = 0; i < N_GEN; i++)
		agree += hyb_test_argmax(lr + (size_t)i * V, V) == hyb_test_argmax(lh + (size_t)i * V, V);
	/* device layers sum every neuron in another order: near-ties only */
	CHECK_MSG(agree >= N_GEN - 2, "greedy agreement %d/%d", agree, N_GEN);
	hyb_ctx_free(c);
	hyb_ctx_free(ref);
	free(lr);
	free(lh);
	hyb_model_free(m);
}

/* ---- same-layer predictors (PowerInfer's, HYB_PRED_SAME_LAYER) --------------------- */

/*
 * The hybrid path with hy in oracle mode, forced through ids: ref's logits to
 * the bit, and as many neurons predicted as the CPU-only path (predicted).
 */
static void check_same_layer_oracle(struct hyb_model *m, struct hyb_hybrid_params *hy,
				    const int32_t *ids, const float *ref, uint64_t predicted,
				    const char *what, struct hyb_hybrid_offload *pl,
				    struct hyb_hybrid_stats *st)
{
	const uint32_t V = m->hp.n_vocab;
	float *lh = malloc(sizeof(float) * V * N_GEN);
	int32_t ids2[N_GEN];
	struct hyb_ctx *c;

	CHECK(lh);
	c = ctx_new(m, hy, true);
	run(c, m, ids, ids2, lh);
	hyb_ctx_hybrid_offload(c, pl);
	hyb_ctx_hybrid_stats(c, st);
	CHECK_EQ_INT(st->layer_steps, (uint64_t)N_GEN * m->hp.n_layer);
	CHECK_MSG(st->active == predicted, "%s: %llu neurons predicted, CPU-only %llu", what,
		  (unsigned long long)st->active, (unsigned long long)predicted);
	for (int i = 0; i < N_GEN; i++)
		CHECK_MSG(!memcmp(ref + (size_t)i * V, lh + (size_t)i * V, sizeof(float) * V),
			  "%s: logits of step %d differ from CPU-only same-layer decoding", what,
			  i);
	hyb_ctx_free(c);
	free(lh);
}

/*
 * The test plan switched to same-layer prediction in memory: the hybrid path
 * (host or device predictors, any placement) gives CPU-only sparse decoding's
 * bits in oracle mode, and the mode changes what is predicted (so neither
 * path can pass by ignoring it: the adjacent hybrid path equals adjacent
 * CPU-only decoding, hybrid_oracle_bit_identical_every_policy).
 */
TEST(hybrid_same_layer_oracle_bit_identical)
{
	struct hyb_model *m = load_plan();
	const uint32_t V = m->hp.n_vocab, L = m->hp.n_layer;
	float *ls = malloc(sizeof(float) * V * N_GEN);
	int32_t ids[N_GEN], ids2[N_GEN];
	struct hyb_sparse_stats sa, ss;
	struct hyb_hybrid_offload pl;
	struct hyb_hybrid_stats st;
	struct hyb_hybrid_params hy;
	struct hyb_ctx *c;

	CHECK(ls);
	CHECK_EQ_INT(m->pred_input, HYB_PRED_ADJACENT);
	c = ctx_new(m, NULL, true);
	run(c, m, NULL, ids, NULL);
	hyb_ctx_sparse_stats(c, &sa);
	hyb_ctx_free(c);

	m->pred_input = HYB_PRED_SAME_LAYER;
	c = ctx_new(m, NULL, true);
	run(c, m, ids, ids2, ls);
	hyb_ctx_sparse_stats(c, &ss);
	hyb_ctx_free(c);
	CHECK_MSG(ss.predicted > 0 && ss.predicted < ss.neurons, "same-layer predicted %llu of %llu",
		  (unsigned long long)ss.predicted, (unsigned long long)ss.neurons);
	/*
	 * The sets differ (the logits may not: with ReLU and high recall both
	 * sets hold every neuron that fires, and the others add zeros). Every
	 * hybrid run below predicts exactly the same-layer count.
	 */
	CHECK_MSG(ss.predicted != sa.predicted,
		  "same-layer and adjacent predict the same number of neurons (%llu)",
		  (unsigned long long)ss.predicted);

	/* everything dense and every predictor on the device, a third of the groups */
	hy = params(m, HYB_POLICY_TAM_ADAPTIVE);
	check_same_layer_oracle(m, &hy, ids, ls, ss.predicted,
				"tam-adaptive, predictors on the device", &pl, &st);
	CHECK_EQ_INT(pl.attn_layers, L);
	CHECK_EQ_INT(pl.predictors, L);
	CHECK(st.active_dev > 0 && st.active_dev < st.active);

	hy = params(m, HYB_POLICY_LRU);
	check_same_layer_oracle(m, &hy, ids, ls, ss.predicted, "lru", &pl, &st);
	CHECK(st.loads > 0 && st.active_dev > 0);

	/* the dense parts on the CPU: host predictors, a cache of a sixth of the groups */
	hy = params(m, HYB_POLICY_TOPK);
	hy.dense_on_cpu = true;
	hy.gpu_budget = slot_bytes(m) * m->n_groups * L / 6 + (1u << 20);
	check_same_layer_oracle(m, &hy, ids, ls, ss.predicted, "topk, dense on the CPU", &pl,
				&st);
	CHECK(pl.attn_layers == 0 && pl.predictors == 0);
	CHECK(st.active_dev > 0);

	/*
	 * One attention block (layer 0) with the head: room for the predictors
	 * that read it, and not for a second block. Same-layer: only layer 0's
	 * predictor reads it (adjacent: layers 0 and 1), the others run on the
	 * host.
	 */
	const uint64_t ab = hyb_hdense_layer_bytes(m, 0, N_CTX), pb = hyb_hdense_pred_bytes(m, 0);

	hy = params(m, HYB_POLICY_STATIC);
	hy.gpu_budget = ab + hyb_hdense_head_bytes(m) + 2 * pb +
			hyb_hdense_buffer_bytes(m, true, true, true) + (48u << 10);
	CHECK_MSG(hy.gpu_budget - ab < ab, "test plan: attention block %llu bytes, predictor %llu",
		  (unsigned long long)ab, (unsigned long long)pb);
	check_same_layer_oracle(m, &hy, ids, ls, ss.predicted, "one attention block", &pl,
				&st);
	CHECK_EQ_INT(pl.attn_layers, 1);
	CHECK_EQ_INT(pl.predictors, 1);
	m->pred_input = HYB_PRED_ADJACENT;
	c = ctx_new(m, &hy, true);
	hyb_ctx_hybrid_offload(c, &pl);
	CHECK_EQ_INT(pl.attn_layers, 1);
	CHECK_EQ_INT(pl.predictors, 2);
	hyb_ctx_free(c);

	free(ls);
	hyb_model_free(m);
}

/* The placement rule itself: a predictor goes where the attention it reads is. */
TEST(hybrid_same_layer_predictor_follows_its_attention)
{
	struct hyb_model *m = load_plan();
	const struct hyb_device_config dc = { .capacity = 64u << 20 };
	bool layers[3] = { true, false, true }, preds[3] = { true, true, true };
	char err[256];
	struct hyb_device *d;
	struct hyb_hdense *hd;

	CHECK_EQ_INT(m->hp.n_layer, 3);
	for (int mode = 0; mode < 2; mode++) {
		const bool same = mode == 1;

		m->pred_input = same ? HYB_PRED_SAME_LAYER : HYB_PRED_ADJACENT;
		CHECK_EQ_INT(hyb_hdense_pred_source(m, 0), 0);
		CHECK_EQ_INT(hyb_hdense_pred_source(m, 1), same ? 1 : 0);
		CHECK_EQ_INT(hyb_hdense_pred_source(m, 2), same ? 2 : 1);
		d = hyb_device_open("cpu", &dc);
		CHECK_MSG(d, "%s", hyb_last_error());
		hd = hyb_hdense_new(d, m, N_CTX, layers, false, preds, err, sizeof(err));
		CHECK_MSG(hd, "%s", err);
		CHECK(hyb_hdense_pred_on(hd, 0));
		CHECK(hyb_hdense_pred_on(hd, 1) == !same);  /* reads layer 0, or its own (CPU) */
		CHECK(hyb_hdense_pred_on(hd, 2) == same);   /* reads layer 1 (CPU), or its own */
		CHECK_EQ_INT(hyb_hdense_preds_on(hd), 2);
		hyb_hdense_free(hd);
		hyb_device_close(d);
	}
	hyb_model_free(m);
}

/* Normal mode: greedy decoding agrees with CPU-only same-layer decoding. */
TEST(hybrid_same_layer_greedy_agrees_with_cpu_sparse)
{
	struct hyb_model *m = load_plan();
	const uint32_t V = m->hp.n_vocab;
	float *lr = malloc(sizeof(float) * V * N_GEN), *lh = malloc(sizeof(float) * V * N_GEN);
	int32_t ids[N_GEN], ids2[N_GEN];
	struct hyb_hybrid_params hy;
	struct hyb_hybrid_stats st;
	struct hyb_ctx *ref, *c;
	uint64_t res, slots;
	int agree = 0;

	CHECK(lr && lh);
	m->pred_input = HYB_PRED_SAME_LAYER;
	hy = params(m, HYB_POLICY_TAM_ADAPTIVE);
	ref = ctx_new(m, NULL, false);
	c = ctx_new(m, &hy, false);
	run(ref, m, NULL, ids, lr);
	run(c, m, ids, ids2, lh);
	hyb_ctx_hybrid_stats(c, &st);
	hyb_ctx_hybrid_cache(c, &res, &slots);
	CHECK(res <= slots && st.active_dev > 0);
	CHECK(st.late <= st.active - st.active_dev);
	for (int i = 0; i < N_GEN; i++)
		agree += hyb_test_argmax(lr + (size_t)i * V, V) == hyb_test_argmax(lh + (size_t)i * V, V);
	CHECK_MSG(agree >= N_GEN - 2, "greedy agreement %d/%d", agree, N_GEN);
	hyb_ctx_free(c);
	hyb_ctx_free(ref);
	free(lr);
	free(lh);
	hyb_model_free(m);
}

/*
 * The bottleneck test in same-layer mode: a load decided at layer l cannot
 * land before layer l's split, so its neurons are late on any link. Those
 * must not read as an I/O-bound link (tam-adaptive would raise lambda
 * however fast the link is). lru moves groups on every step, so neurons
 * are late (4.5% here, past 5% in many steps): on a link 40x PCIe 4.0
 * (1000 GB/s, 1 us a copy) the statistics count them and fewer than 5% of
 * the decisions may be I/O-bound (counting fresh loads too made it 14%).
 */
TEST(hybrid_same_layer_fresh_loads_are_not_io_bound)
{
	struct hyb_model *m = load_plan();
	int32_t ids[N_GEN];
	struct hyb_hybrid_params hy;
	struct hyb_hybrid_stats st;
	struct hyb_ctx *c;
	double late, io;

	m->pred_input = HYB_PRED_SAME_LAYER;
	hy = params(m, HYB_POLICY_LRU);
	hy.dev.pcie_gbps = 1000;
	hy.dev.pcie_lat_us = 1;
	c = ctx_new(m, &hy, false);
	run(c, m, NULL, ids, NULL);
	hyb_ctx_hybrid_stats(c, &st);
	late = (double)st.late / (double)st.active;
	io = (double)st.bound_io / (double)st.layer_steps;
	fprintf(stderr, "    %llu loads; %.1f%% of active neurons late; decisions: %.1f%% I/O-bound, "
		"%.1f%% CPU-bound\n", (unsigned long long)st.loads, 100 * late, 100 * io,
		100.0 * st.bound_cpu / st.layer_steps);
	CHECK_MSG(late > 0.02, "%.1f%% late: the case does not test the rule", 100 * late);
	CHECK_MSG(io < 0.05, "%.1f%% of decisions I/O-bound on a fast link", 100 * io);
	hyb_ctx_free(c);
	hyb_model_free(m);
}

/* The command's load-aware thresholds: refusals with one clear line, and the report. */
static int cli(const char *args, char *out, size_t len)
{
	char cmd[1024];
	FILE *p;
	size_t n;

	snprintf(cmd, sizeof(cmd), "build/hyb run -m %s -p hello -n 8 %s 2>&1", hyb_test_plan(),
		 args);
	p = popen(cmd, "r");
	CHECK(p != NULL);
	n = fread(out, 1, len - 1, p);
	out[n] = 0;
	return pclose(p);
}

TEST(hybrid_cli_thresholds)
{
	static char out[65536];

	if (access("build/hyb", X_OK))
		SKIP("build/hyb not built (run from the repository root after make)");
	CHECK(cli("--gpu-budget 60% --thresholds sometimes", out, sizeof(out)) != 0);
	CHECK_MSG(strstr(out, "unknown --thresholds"), "%s", out);
	CHECK(cli("--thresholds expected", out, sizeof(out)) != 0);
	CHECK_MSG(strstr(out, "needs --gpu-budget"), "%s", out);
	CHECK(cli("--gpu-budget 60% --policy layer --thresholds paper", out, sizeof(out)) != 0);
	CHECK_MSG(strstr(out, "layer policy"), "%s", out);
	CHECK_MSG(cli("--gpu-budget 60% --policy dynamic", out, sizeof(out)) == 0, "%s", out);
	CHECK_MSG(strstr(out, "beside the CPU FFN"), "%s", out);
}

/* --prompt-batch: the batch's size on the device, said at the end; not with --prefill-cpu. */
TEST(hybrid_cli_prompt_batch)
{
	static char out[65536];
	char args[512], prompt[400];

	if (access("build/hyb", X_OK))
		SKIP("build/hyb not built (run from the repository root after make)");
	CHECK(cli("--gpu-budget 60% --prefill-cpu --prompt-batch 40", out, sizeof(out)) != 0);
	CHECK_MSG(strstr(out, "one or the other"), "%s", out);
	CHECK(cli("--gpu-budget 60% --prompt-batch 0", out, sizeof(out)) != 0);
	CHECK(cli("--gpu-budget 60% --prompt-batch 60000", out, sizeof(out)) != 0);
	CHECK_MSG(strstr(out, "does not fit in the neuron cache"), "%s", out);
	/* a prompt of more than 40 tokens: batches of 40 */
	prompt[0] = 0;
	for (int i = 0; i < 20; i++)
		strcat(prompt, "one two three ");
	snprintf(args, sizeof(args), "--gpu-budget 100%% --policy static --prompt-batch 40 -p '%s'",
		 prompt);
	CHECK_MSG(cli(args, out, sizeof(out)) == 0, "%s", out);

	const char *pr = strstr(out, "\nprompt: ");
	char want[64];
	int n = 0;

	CHECK_MSG(pr && sscanf(pr, "\nprompt: %d tokens", &n) == 1 && n > 40, "%s", out);
	snprintf(want, sizeof(want), "; %d batches streamed", (n + 39) / 40);
	CHECK_MSG(strstr(out, "batches of up to 40 tokens on the device") && strstr(out, want),
		  "want '%s': %s", want, out);
}
