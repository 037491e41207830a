// SPDX-License-Identifier: MIT
/*
 * Expert tensors split by rows across NUMA nodes (docs/NUMA.md), laid out
 * as hybd's split_experts lays them in its pools - each part holding its
 * rows of every expert, at a stride of its own - here in ordinary memory
 * with the padding between experts poisoned. The CPU experts and the expert
 * cache must find every row where its part put it: the logits are the
 * unsplit model's, bit for bit, with any number of threads.
 */
#include <string.h>
#include <unistd.h>

#include "hyb/hybrid.h"
#include "hyb/model.h"
#include "test.h"

#define N_PROMPT 6
#define N_GEN 8

struct split_layer {
	struct hyb_weight_split sp[3];
	char *buf[3];
};

/*
 * w's rows as parts [0, 16), [16, ne1 - 32), [ne1 - 32, ne1) on nodes 0, 1
 * and 0 (two parts of one node share its queue), each expert's rows at a
 * stride padded by bytes of 0xff: a row read from the wrong place is NaN.
 */
static char *split_rows(struct hyb_weight *w, struct hyb_weight_split *sp)
{
	const uint64_t E = w->ne2, rb = w->row_bytes;
	const uint64_t cut[4] = { 0, 16, w->ne1 - 32, w->ne1 };
	const int32_t node[3] = { 0, 1, 0 };
	uint64_t off[3], total = 0;
	char *buf;

	CHECK(w->ne1 >= 64 && !w->split);
	memset(sp, 0, sizeof(*sp));
	sp->n = 3;
	for (int p = 0; p < 3; p++) {
		sp->row0[p + 1] = cut[p + 1];
		sp->stride[p] = (cut[p + 1] - cut[p]) * rb + 64 * (uint64_t)(p + 1) + 8;
		sp->node[p] = node[p];
		off[p] = total;
		total += E * sp->stride[p];
	}
	buf = malloc(total);
	CHECK(buf);
	memset(buf, 0xff, total);
	for (int p = 0; p < 3; p++) {
		sp->data[p] = buf + off[p];
		for (uint32_t e = 0; e < E; e++) {
			uint64_t run;
			const char *src = hyb_weight_rows(w, e, cut[p], &run);

			CHECK(run >= cut[p + 1] - cut[p]);
			memcpy(buf + off[p] + e * sp->stride[p], src, (cut[p + 1] - cut[p]) * rb);
		}
	}
	w->split = sp;
	w->data = sp->data[0]; /* as the box binds it: no way back to the file's layout */
	return buf;
}

/* A prompt and N_GEN greedy steps: each step's logits into lg[N_GEN + 1][n_vocab]. */
static int decode(const struct hyb_model *m, int nth, bool no_pin,
		  const struct hyb_hybrid_params *hy, float *lg)
{
	struct hyb_ctx_params cp = { .n_ctx = 64, .n_threads = nth, .numa_no_pin = no_pin,
				     .hybrid = hy };
	struct hyb_ctx *c = hyb_ctx_new(m, &cp);
	const uint32_t V = m->hp.n_vocab;
	int32_t toks[N_PROMPT];

	if (!c)
		return -1;
	for (int i = 0; i < N_PROMPT; i++)
		toks[i] = (i * 53 + 7) % 400 + 3;
	CHECK(!hyb_ctx_eval(c, toks, N_PROMPT, lg, false));
	for (int t = 0; t < N_GEN; t++) {
		int32_t best = hyb_test_argmax(lg + (size_t)t * V, V);

		CHECK_MSG(!hyb_ctx_eval(c, &best, 1, lg + (size_t)(t + 1) * V, false), "%s",
			  hyb_last_error());
	}
	hyb_ctx_free(c);
	return 0;
}

static void split_keeps_the_bits(const char *name, const char *args, bool cache)
{
	char path[512], log[600];
	struct hyb_model *m;
	struct split_layer *sl;
	float *ref, *lg;
	size_t n;

	snprintf(path, sizeof(path), "%s/%s.gguf", hyb_test_tmpdir(), name);
	snprintf(log, sizeof(log), "%s/%s.log", hyb_test_tmpdir(), name);
	if (access(hyb_test_hybctl(), X_OK))
		SKIP("%s not built", hyb_test_hybctl());
	CHECK_MSG(!hyb_test_sh(log, "%s synth -o %s %s -t 2", hyb_test_hybctl(), path, args),
		  "hybctl synth %s", args);
	m = hyb_model_load(path);
	CHECK_MSG(m, "%s", hyb_last_error());
	n = (size_t)(N_GEN + 1) * m->hp.n_vocab;
	ref = malloc(sizeof(float) * n);
	lg = malloc(sizeof(float) * n);
	sl = calloc(m->hp.n_layer, sizeof(*sl));
	CHECK(ref && lg && sl);
	CHECK(!decode(m, 2, false, NULL, ref));
	for (uint32_t l = m->hp.n_dense_lead; l < m->hp.n_layer; l++) {
		struct hyb_layer *L = &m->layers[l];
		struct hyb_weight *w[3] = { &L->gate_exps, &L->up_exps, &L->down_exps };

		for (int i = 0; i < 3; i++)
			sl[l].buf[i] = split_rows(w[i], &sl[l].sp[i]);
	}
	/* nodes 0 and 1: pinned where both exist, else a clear refusal */
	if (access("/sys/devices/system/node/node1", F_OK)) {
		CHECK(decode(m, 2, false, NULL, lg) < 0);
		CHECK_MSG(strstr(hyb_last_error(), "NUMA node 1") &&
			  strstr(hyb_last_error(), "--no-numa-pin"), "%s", hyb_last_error());
	} else {
		CHECK_MSG(!decode(m, 2, false, NULL, lg), "%s", hyb_last_error());
		CHECK_MSG(!memcmp(ref, lg, sizeof(float) * n), "%s: pinned: other logits", name);
	}
	for (int nth = 1; nth <= 3; nth++) {
		CHECK_MSG(!decode(m, nth, true, NULL, lg), "%s", hyb_last_error());
		CHECK_MSG(!memcmp(ref, lg, sizeof(float) * n), "%s: split rows, %d threads: other "
			  "logits than unsplit", name, nth);
	}
	/* the expert cache loads an expert part by part (deepseek2: no expert cache) */
	if (cache) {
		struct hyb_hybrid_params hy = { .device = "cpu", .policy = HYB_POLICY_LRU,
						.gpu_budget = m->weight_bytes / 3 * 2 };

		CHECK_MSG(!decode(m, 2, true, &hy, lg), "%s", hyb_last_error());
		CHECK_MSG(!memcmp(ref, lg, sizeof(float) * n), "%s: split rows through the expert "
			  "cache: other logits", name);
	}
	for (uint32_t l = m->hp.n_dense_lead; l < m->hp.n_layer; l++)
		for (int i = 0; i < 3; i++)
			free(sl[l].buf[i]);
	hyb_model_free(m); /* (reads no weight) */
	free(sl);
	free(ref);
	free(lg);
}

TEST(moe_split_rows_keep_the_bits)
{
	/* 32-block type (any batch), a K-quant (columns in 3s), gate and up in one tensor */
	split_keeps_the_bits("split-q40", "--arch qwen3moe --experts 16 --experts-used 4 "
			     "--expert-ffn 64 --hidden 128 --heads 4 --layers 3 --seed 5 "
			     "--type Q4_0", true);
	split_keeps_the_bits("split-q4k", "--arch qwen3moe --experts 16 --experts-used 4 "
			     "--expert-ffn 256 --hidden 256 --heads 4 --layers 2 --seed 6 "
			     "--type Q4_K", true);
	split_keeps_the_bits("split-gu", "--arch deepseek2 --experts 8 --experts-used 2 "
			     "--expert-ffn 64 --head-dim 96 --q-lora 64 --hidden 128 --heads 2 "
			     "--layers 3 --vocab 300 --gate-up-exps --type Q8_0", false);
}
