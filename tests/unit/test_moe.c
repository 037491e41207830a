// SPDX-License-Identifier: MIT
/*
 * Mixture-of-experts models (docs/MOE.md): files that are wrong are refused
 * naming the key or tensor, a router gone non-finite is an error and not a
 * crash, the routing probe sees what the forward pass chose, and what MoE
 * cannot do yet (sparse, hybrid, CATS) says so. Exactness against llama.cpp
 * is in test_exact.c (exact_moe_*).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu_kernels.h"
#include "forward/moe.h"
#include "hyb/gguf.h"
#include "hyb/hybrid.h"
#include "hyb/model.h"
#include "hyb/tensor_type.h"
#include "test.h"

#define E 32   /* n_embd */
#define F 32   /* n_ff_exp */
#define V 64   /* vocab */

/* hybctl synth -o TMP/NAME.gguf ARGS; its path (two in use at a time). */
static const char *synth_file(const char *name, const char *args)
{
	static char paths[2][512];
	static int next;
	char *path = paths[next++ % 2], cmd[1536];

	if (access("build/hybctl", X_OK))
		SKIP("build/hybctl not built (run from the repository root after make)");
	snprintf(path, sizeof(paths[0]), "%s/%s.gguf", hyb_test_tmpdir(), name);
	snprintf(cmd, sizeof(cmd), "build/hybctl synth -o %s %s -t 2 >/dev/null", path, args);
	CHECK_MSG(system(cmd) == 0, "%s failed", cmd);
	return path;
}

struct moe_file {
	const char *arch;
	uint32_t meta_experts, used;   /* keys (0: no key) */
	uint32_t tensor_experts;       /* ne2 of the expert tensors */
	uint32_t router_rows;          /* ne1 of ffn_gate_inp */
	bool used_array;               /* expert_used_count as a per-layer array */
	bool nan_router;
};

/* A one-layer Mixtral-layout file (F32 weights, small random values) as described. */
static const char *write_moe(const char *name, const struct moe_file *d)
{
	static char path[512];
	static float buf[E * F * 16 + E * V];
	struct hyb_gguf_writer *w = hyb_gguf_writer_new();
	const uint64_t ne_emb[2] = { E, V }, ne_vec[1] = { E }, ne_mat[2] = { E, E };
	const uint64_t ne_router[2] = { E, d->router_rows };
	const uint64_t ne_gu[3] = { E, F, d->tensor_experts }, ne_dn[3] = { F, E, d->tensor_experts };
	const char *mats[] = { "attn_q", "attn_k", "attn_v", "attn_output" };
	char key[96], nm[64];
	uint32_t seed = 7;

	CHECK(w);
	for (size_t i = 0; i < sizeof(buf) / sizeof(buf[0]); i++) {
		seed = seed * 1664525u + 1013904223u;
		buf[i] = ((float)(seed >> 8) / 16777216.0f - 0.5f) * 0.2f;
	}
	hyb_gguf_set_str(w, "general.architecture", d->arch);
#define K(s, v)                                                       \
	do {                                                          \
		snprintf(key, sizeof(key), "%s." s, d->arch);         \
		hyb_gguf_set_u32(w, key, v);                          \
	} while (0)
	K("embedding_length", E);
	K("block_count", 1);
	K("feed_forward_length", F);
	K("attention.head_count", 2);
	if (d->meta_experts)
		K("expert_count", d->meta_experts);
	if (d->used && !d->used_array)
		K("expert_used_count", d->used);
#undef K
	if (d->used_array) {
		const uint32_t per_layer[1] = { d->used };

		snprintf(key, sizeof(key), "%s.expert_used_count", d->arch);
		hyb_gguf_set_arr(w, key, HYB_GGUF_VT_UINT32, per_layer, 1);
	}
	CHECK(!hyb_gguf_writer_add_tensor(w, "token_embd.weight", HYB_TYPE_F32, 2, ne_emb, buf));
	for (int i = 0; i < 3; i++) {
		const char *norms[] = { "output_norm", "blk.0.attn_norm", "blk.0.ffn_norm" };
		static const float ones[E] = { [0 ... E - 1] = 1.0f };

		snprintf(nm, sizeof(nm), "%s.weight", norms[i]);
		CHECK(!hyb_gguf_writer_add_tensor(w, nm, HYB_TYPE_F32, 1, ne_vec, ones));
	}
	for (int i = 0; i < 4; i++) {
		snprintf(nm, sizeof(nm), "blk.0.%s.weight", mats[i]);
		CHECK(!hyb_gguf_writer_add_tensor(w, nm, HYB_TYPE_F32, 2, ne_mat, buf));
	}
	if (d->nan_router) {
		static float nan_router[E * 64];

		memcpy(nan_router, buf, sizeof(nan_router));
		nan_router[3] = NAN;
		CHECK(!hyb_gguf_writer_add_tensor(w, "blk.0.ffn_gate_inp.weight", HYB_TYPE_F32, 2,
						  ne_router, nan_router));
	} else {
		CHECK(!hyb_gguf_writer_add_tensor(w, "blk.0.ffn_gate_inp.weight", HYB_TYPE_F32, 2,
						  ne_router, buf));
	}
	CHECK(!hyb_gguf_writer_add_tensor(w, "blk.0.ffn_gate_exps.weight", HYB_TYPE_F32, 3, ne_gu, buf));
	CHECK(!hyb_gguf_writer_add_tensor(w, "blk.0.ffn_up_exps.weight", HYB_TYPE_F32, 3, ne_gu, buf));
	CHECK(!hyb_gguf_writer_add_tensor(w, "blk.0.ffn_down_exps.weight", HYB_TYPE_F32, 3, ne_dn,
					  buf));
	snprintf(path, sizeof(path), "%s/moe-%s.gguf", hyb_test_tmpdir(), name);
	CHECK_MSG(!hyb_gguf_writer_write_file(w, path), "%s", hyb_last_error());
	hyb_gguf_writer_free(w);
	return path;
}

static const struct moe_file good = {
	.arch = "llama", .meta_experts = 8, .used = 2, .tensor_experts = 8, .router_rows = 8,
};

static void expect_refused(const char *name, const struct moe_file *d, const char *needle)
{
	struct hyb_model *m = hyb_model_load(write_moe(name, d));

	CHECK_MSG(!m, "%s loaded but should not", name);
	hyb_model_free(m);
	CHECK_MSG(strstr(hyb_last_error(), needle), "%s: error '%s' does not mention '%s'", name,
		  hyb_last_error(), needle);
}

TEST(moe_loads_mixtral_layout)
{
	struct hyb_model *m = hyb_model_load(write_moe("good", &good));

	CHECK_MSG(m, "%s", hyb_last_error());
	CHECK(m->hp.n_expert == 8 && m->hp.n_expert_used == 2 && m->hp.n_ff_exp == F);
	CHECK(m->hp.expert_norm); /* Mixtral renormalises its top-k weights */
	CHECK(m->layers[0].gate_exps.ne2 == 8 && !m->layers[0].gate.data);
	/* a token reads 2 of the 8 experts: decode bytes count 2 */
	CHECK(hyb_model_decode_bytes(m) < (uint64_t)3 * 8 * E * F * sizeof(float));
	hyb_model_free(m);
}

TEST(moe_refuses_bad_counts_and_shapes_by_name)
{
	struct moe_file d;

	d = good;
	d.used = 9;
	expect_refused("used-over", &d, "expert_used_count 9 must be in 1..8");
	d = good;
	d.tensor_experts = 4; /* metadata says 8 */
	expect_refused("count-mismatch", &d, "blk.0.ffn_gate_exps.weight: expected shape [32, 32, 8]");
	d = good;
	d.router_rows = 6;
	expect_refused("router-shape", &d, "blk.0.ffn_gate_inp.weight: expected shape [32, 8]");
	d = good;
	d.meta_experts = 0;
	d.used = 0;
	expect_refused("no-count", &d, "ffn_gate_exps.weight holds experts");
	d = good;
	d.used_array = true;
	expect_refused("used-array", &d, "a count per layer is not supported");
	d = good;
	d.used = 0;
	expect_refused("used-zero", &d, "expert_used_count 0 must be in 1..8");
	d = good;
	d.meta_experts = 1000; /* refused before any tensor is read */
	expect_refused("too-many", &d, "expert_count 1000 is over 512");
	d = good;
	d.arch = "qwen3moe";
	d.meta_experts = 0;
	expect_refused("qwen3moe-dense", &d, "qwen3moe is a mixture of experts");
	d = good;
	d.arch = "qwen3";
	expect_refused("qwen3-experts", &d, "experts are not supported in qwen3");
}

TEST(moe_nan_router_is_an_error_not_a_crash)
{
	struct moe_file d = good;
	struct hyb_ctx_params cp = { .n_ctx = 64, .n_threads = 2 };
	struct hyb_model *m;
	struct hyb_ctx *c;
	int32_t toks[3] = { 1, 5, 9 };
	float *lg = malloc(sizeof(float) * V * 3);

	d.nan_router = true;
	m = hyb_model_load(write_moe("nan", &d));
	CHECK_MSG(m, "%s", hyb_last_error());
	c = hyb_ctx_new(m, &cp);
	CHECK_MSG(c, "%s", hyb_last_error());
	CHECK(hyb_ctx_eval(c, toks, 3, lg, false) == -EDOM);
	CHECK_MSG(strstr(hyb_last_error(), "blk.0.ffn_gate_inp.weight") &&
		  strstr(hyb_last_error(), "not finite"), "error '%s'", hyb_last_error());
	/* the context stays usable for what comes next: the same answer, no crash */
	CHECK(hyb_ctx_eval(c, toks, 1, lg, false) == -EDOM);
	free(lg);
	hyb_ctx_free(c);
	hyb_model_free(m);
}

TEST(moe_refuses_what_it_cannot_do_yet)
{
	struct hyb_model *m = hyb_model_load(write_moe("modes", &good));
	struct hyb_ctx_params cp = { .n_ctx = 64, .n_threads = 1, .ffn = HYB_FFN_SPARSE };
	struct hyb_ctx *c;
	float thr[1] = { 0.1f };

	CHECK_MSG(m, "%s", hyb_last_error());
	CHECK(!hyb_ctx_new(m, &cp));
	CHECK_MSG(strstr(hyb_last_error(), "mixture-of-experts"), "%s", hyb_last_error());
	cp.ffn = HYB_FFN_AUTO;
	c = hyb_ctx_new(m, &cp);
	CHECK_MSG(c, "%s", hyb_last_error());
	CHECK(hyb_ctx_set_ffn_thresholds(c, thr) == -EINVAL);
	hyb_ctx_free(c);
	hyb_model_free(m);
}

struct routing {
	uint32_t calls, tokens, layer_seen;
	int32_t sel[16][2];
	float w[16][2];
};

static void probe(void *user, uint32_t layer, uint32_t pos0, uint32_t n, const int32_t *sel,
		  const float *w)
{
	struct routing *r = user;

	r->calls++;
	r->layer_seen |= 1u << layer;
	for (uint32_t t = 0; t < n && pos0 + t < 16; t++) {
		memcpy(r->sel[pos0 + t], sel + 2 * t, sizeof(r->sel[0]));
		memcpy(r->w[pos0 + t], w + 2 * t, sizeof(r->w[0]));
	}
	r->tokens += n;
}

/* The probe sees every token's choice: two distinct experts, best first, weights summing to 1. */
TEST(moe_probe_sees_the_routing)
{
	struct hyb_model *m = hyb_model_load(write_moe("probe", &good));
	struct hyb_ctx_params cp = { .n_ctx = 64, .n_threads = 2 };
	struct routing r = { 0 };
	int32_t toks[6] = { 1, 5, 9, 13, 40, 2 };
	float *lg = malloc(sizeof(float) * V);
	struct hyb_ctx *c;

	CHECK_MSG(m, "%s", hyb_last_error());
	c = hyb_ctx_new(m, &cp);
	CHECK(c && lg);
	hyb_ctx_set_moe_probe(c, probe, &r);
	CHECK(!hyb_ctx_eval(c, toks, 5, lg, false));
	CHECK(!hyb_ctx_eval(c, toks + 5, 1, lg, false));
	CHECK(r.calls == 2 && r.tokens == 6 && r.layer_seen == 1);
	for (int t = 0; t < 6; t++) {
		CHECK(r.sel[t][0] >= 0 && r.sel[t][0] < 8 && r.sel[t][1] >= 0 && r.sel[t][1] < 8);
		CHECK(r.sel[t][0] != r.sel[t][1]);
		CHECK(r.w[t][0] >= r.w[t][1] && r.w[t][1] > 0);
		CHECK_NEAR(r.w[t][0] + r.w[t][1], 1.0, 1e-6);
	}
	free(lg);
	hyb_ctx_free(c);
	hyb_model_free(m);
}

/* Prefill and decode route and compute the same: batch of 12 vs one at a time. */
TEST(moe_prefill_equals_decode)
{
	struct hyb_ctx_params cp = { .n_ctx = 64, .n_threads = 2 };
	int32_t toks[12];
	struct hyb_model *m;
	struct hyb_ctx *a, *b;
	float *la, *lb;
	double worst = 0;

	m = hyb_model_load(synth_file("moe-pd", "--arch qwen3moe --experts 16 --experts-used 4 "
				      "--expert-ffn 64 --hidden 128 --heads 4 --layers 2 --type Q8_0"));
	CHECK_MSG(m, "%s", hyb_last_error());
	a = hyb_ctx_new(m, &cp);
	b = hyb_ctx_new(m, &cp);
	la = malloc(sizeof(float) * m->hp.n_vocab * 12);
	lb = malloc(sizeof(float) * m->hp.n_vocab);
	CHECK(a && b && la && lb);
	for (int i = 0; i < 12; i++)
		toks[i] = (i * 37 + 11) % 500 + 1;
	CHECK(!hyb_ctx_eval(a, toks, 12, la, true));
	for (int i = 0; i < 12; i++) {
		CHECK(!hyb_ctx_eval(b, &toks[i], 1, lb, false));
		for (uint32_t v = 0; v < m->hp.n_vocab; v++) {
			double d = fabs(la[(size_t)i * m->hp.n_vocab + v] - lb[v]);

			worst = d > worst ? d : worst;
		}
	}
	/* only the summation order of batched matmuls differs */
	CHECK_MSG(worst < 2e-3, "prefill and decode logits differ by %g", worst);
	free(la);
	free(lb);
	hyb_ctx_free(a);
	hyb_ctx_free(b);
	hyb_model_free(m);
}

/*
 * hyb_moe_max_columns() lets the 32-element block types take all of an
 * expert's columns in one kernel call, and the repacked K-quants 3, because
 * each output is then summed exactly as alone (llama.cpp's mul_mat_id
 * order): hold the kernels to it. (The tiled K-quants' batches follow
 * llama.cpp's tiled order instead: exact_moe_* checks those.)
 */
TEST(moe_batched_columns_sum_like_single_columns)
{
	const struct hyb_cpu_kernels *k = hyb_cpu_best();
	const uint32_t types[] = { HYB_TYPE_Q8_0, HYB_TYPE_Q4_0, HYB_TYPE_Q4_1, HYB_TYPE_Q5_0,
				   HYB_TYPE_Q5_1, HYB_TYPE_IQ4_NL, HYB_TYPE_Q4_K, HYB_TYPE_Q2_K };
	const uint64_t rows[] = { 64, 36, 13, 768 };
	enum { KD = 512, C = 12 };
	float *w = malloc(sizeof(float) * KD * 768), *x = malloc(sizeof(float) * KD * C);
	float *y1 = malloc(sizeof(float) * 768 * C), *y2 = malloc(sizeof(float) * 768 * C);
	uint32_t s = 3, checked = 0;

	CHECK(w && x && y1 && y2);
	for (size_t i = 0; i < (size_t)KD * 768; i++) {
		s = s * 1664525u + 1013904223u;
		w[i] = (float)(s >> 8) / 16777216.0f - 0.5f;
	}
	for (size_t i = 0; i < (size_t)KD * C; i++) {
		s = s * 1664525u + 1013904223u;
		x[i] = (float)(s >> 8) / 16777216.0f - 0.5f;
	}
	for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++)
		for (size_t ri = 0; ri < sizeof(rows) / sizeof(rows[0]); ri++) {
			const uint32_t t = types[ti], vt = hyb_vec_dot_type(t);
			const uint64_t R = rows[ri];
			const uint32_t mc = hyb_moe_max_columns(t, R);
			const size_t rb = hyb_row_bytes(t, KD), xb = hyb_row_bytes(vt, KD);
			char *wq = malloc(rb * R), *xq = malloc(xb * C);
			hyb_gemm_fn fn = hyb_gemm_pick(k, t, R);

			if (t == HYB_TYPE_Q4_K || t == HYB_TYPE_Q2_K) {
				if (mc == 0) { /* unrepacked: llama.cpp tiles them */
					free(wq);
					free(xq);
					continue;
				}
			}
			CHECK(wq && xq);
			for (uint64_t r = 0; r < R; r++)
				CHECK(!hyb_quantize_row_ref(t, w + r * KD, wq + r * rb, KD));
			for (int c = 0; c < C; c++)
				k->quantize_act[vt](x + (size_t)c * KD, xq + c * xb, KD);
			for (int nc = 2; nc <= C && (!mc || nc <= (int)mc); nc++) {
				fn(KD, wq, rb, (int64_t)R, xq, xb, nc, y1, R);
				for (int c = 0; c < nc; c++)
					fn(KD, wq, rb, (int64_t)R, xq + c * xb, xb, 1, y2 + c * R, R);
				CHECK_MSG(!memcmp(y1, y2, sizeof(float) * R * nc),
					  "%s, %llu rows: %d columns in one call sum differently from "
					  "one at a time", hyb_type_name(t), (unsigned long long)R, nc);
				checked++;
			}
			free(wq);
			free(xq);
		}
	/* 5 types x 4 row counts x 11 batches, IQ4_NL's and the K-quants' allowed ones */
	CHECK_MSG(checked >= 5 * 4 * 11 + 2 * 11 + 2 * 2 * 2, "%u batches checked", checked);
	free(w);
	free(x);
	free(y1);
	free(y2);
}

/*
 * A copy of src with one key dropped or set to a u32 and one tensor renamed
 * (NULL: none), through the public GGUF reader and writer.
 */
static const char *rewrite(const char *src, const char *name, const char *key, long u32,
			   const char *from, const char *to)
{
	static char path[512];
	struct hyb_gguf_file *f;
	struct hyb_gguf_writer *w = hyb_gguf_writer_new();

	CHECK(w);
	CHECK_MSG(!hyb_gguf_open(src, &f), "%s", hyb_last_error());
	for (uint64_t i = 0; i < f->n_kv; i++)
		if (!key || !hyb_gguf_str_eq(f->kv[i].key, key))
			hyb_gguf_writer_copy_kv(w, &f->kv[i]);
	if (key && u32 >= 0)
		hyb_gguf_set_u32(w, key, (uint32_t)u32);
	for (uint64_t i = 0; i < f->n_tensors; i++) {
		const struct hyb_gguf_tensor *t = &f->tensors[i];
		char nm[128];

		snprintf(nm, sizeof(nm), "%.*s", (int)t->name.len, t->name.ptr);
		if (from && !strcmp(nm, from))
			snprintf(nm, sizeof(nm), "%s", to);
		CHECK(!hyb_gguf_writer_add_tensor(w, nm, t->type, t->n_dims, t->ne, t->data));
	}
	snprintf(path, sizeof(path), "%s/moe-%s.gguf", hyb_test_tmpdir(), name);
	CHECK_MSG(!hyb_gguf_writer_write_file(w, path), "%s", hyb_last_error());
	hyb_gguf_writer_free(w);
	hyb_gguf_close(f);
	return path;
}

static void expect_load_error(const char *path, const char *needle)
{
	struct hyb_model *m = hyb_model_load(path);

	CHECK_MSG(!m, "%s loaded but should not", path);
	hyb_model_free(m);
	CHECK_MSG(strstr(hyb_last_error(), needle), "error '%s' does not mention '%s'",
		  hyb_last_error(), needle);
}

/* deepseek2 files that are wrong or of the older converter: refused by name. */
TEST(moe_deepseek2_refuses_bad_files_by_name)
{
	char src[512];
	struct hyb_model *m;

	snprintf(src, sizeof(src), "%s", synth_file("ds2", "--arch deepseek2 --layers 2 "
		 "--experts 8 --experts-used 2 --expert-ffn 64 --head-dim 96 --q-lora 64 "
		 "--expert-groups 4:2 --hidden 128 --heads 2 --vocab 300"));
	m = hyb_model_load(src);
	CHECK_MSG(m, "%s", hyb_last_error());
	CHECK(m->hp.kv_lora == 192 && m->hp.n_rot == 32 && m->hp.mla_nope == 64 &&
	      m->hp.mla_v == 64 && m->hp.n_head_kv == 1 && m->hp.n_dense_lead == 1);
	CHECK(m->layers[0].gate.data && !m->layers[0].gate_exps.data); /* dense first layer */
	CHECK(m->layers[1].gate_exps.ne2 == 8 && m->layers[1].up_shexp.ne1 == 64);
	hyb_model_free(m);

	expect_load_error(rewrite(src, "ds-old", "deepseek2.attention.key_length_mla", -1, NULL,
				  NULL), "older converter");
	expect_load_error(rewrite(src, "ds-kvb", NULL, -1, "blk.0.attn_k_b.weight",
				  "blk.0.attn_kv_b.weight"), "blk.0.attn_kv_b.weight");
	expect_load_error(rewrite(src, "ds-kvheads", "deepseek2.attention.head_count_kv", 2, NULL,
				  NULL), "head_count_kv 1");
	expect_load_error(rewrite(src, "ds-gating", "deepseek2.expert_gating_func", 7, NULL, NULL),
			  "expert_gating_func 7 is not supported");
	expect_load_error(rewrite(src, "ds-lead", "deepseek2.leading_dense_block_count", 9, NULL,
				  NULL), "leading_dense_block_count 9");
	expect_load_error(rewrite(src, "ds-groups", "deepseek2.expert_group_count", 3, NULL, NULL),
			  "expert_group_count 3");
	expect_load_error(rewrite(src, "ds-vb", NULL, -1, "blk.1.attn_v_b.weight", "blk.1.x.weight"),
			  "blk.1.attn_v_b.weight is missing");
	expect_load_error(rewrite(src, "ds-nextn-all", "deepseek2.nextn_predict_layers", 2, NULL,
				  NULL), "nextn_predict_layers 2 leaves none");
	/* the last layer as V3's multi-token prediction layer: left out of the pass */
	m = hyb_model_load(rewrite(src, "ds-nextn", "deepseek2.nextn_predict_layers", 1, NULL,
				   NULL));
	CHECK_MSG(m, "%s", hyb_last_error());
	CHECK(m->hp.n_layer == 1);
	hyb_model_free(m);
}

/*
 * The expert queue hands units to whichever thread is free, but each output
 * is summed by one kernel call in a fixed order: the logits are the same
 * bits for 1, 2 and 3 threads (docs/DETERMINISM.md), and a prompt split into
 * batches of 5 gives the same greedy tokens as one batch.
 */
TEST(moe_threads_and_batches_do_not_change_results)
{
	int32_t toks[12];
	float *ref = NULL, *lg;
	struct hyb_model *m;

	m = hyb_model_load(synth_file("moe-thr", "--arch deepseek2 --experts 16 --experts-used 4 "
				      "--expert-ffn 64 --head-dim 96 --q-lora 64 --hidden 128 "
				      "--heads 2 --layers 3 --type Q4_0"));
	CHECK_MSG(m, "%s", hyb_last_error());
	for (int i = 0; i < 12; i++)
		toks[i] = (i * 37 + 11) % 500 + 1;
	lg = malloc(sizeof(float) * m->hp.n_vocab * 12);
	CHECK(lg);
	for (int nth = 1; nth <= 3; nth++) {
		struct hyb_ctx_params cp = { .n_ctx = 64, .n_threads = nth };
		struct hyb_ctx *c = hyb_ctx_new(m, &cp);

		CHECK_MSG(c, "%s", hyb_last_error());
		CHECK(!hyb_ctx_eval(c, toks, 12, lg, true));
		if (!ref) {
			ref = malloc(sizeof(float) * m->hp.n_vocab * 12);
			CHECK(ref);
			memcpy(ref, lg, sizeof(float) * m->hp.n_vocab * 12);
		} else {
			CHECK_MSG(!memcmp(ref, lg, sizeof(float) * m->hp.n_vocab * 12),
				  "%d threads give other logits than 1", nth);
		}
		hyb_ctx_free(c);
	}
	{
		struct hyb_ctx_params cp = { .n_ctx = 64, .n_threads = 2, .n_batch = 5 };
		struct hyb_ctx *c = hyb_ctx_new(m, &cp);

		CHECK_MSG(c, "%s", hyb_last_error());
		CHECK(!hyb_ctx_eval(c, toks, 12, lg, true));
		for (int t = 0; t < 12; t++)
			CHECK_MSG(hyb_test_argmax(lg + (size_t)t * m->hp.n_vocab, m->hp.n_vocab) ==
				  hyb_test_argmax(ref + (size_t)t * m->hp.n_vocab, m->hp.n_vocab),
				  "batches of 5: another greedy token at position %d", t);
		hyb_ctx_free(c);
	}
	free(ref);
	free(lg);
	hyb_model_free(m);
}

static void greedy(struct hyb_model *m, uint32_t defer, const int32_t *prompt, int np, int n,
		   int32_t *out, float *last)
{
	struct hyb_ctx_params cp = { .n_ctx = 128, .n_threads = 2, .moe_defer = defer };
	struct hyb_ctx *c = hyb_ctx_new(m, &cp);
	float *lg = malloc(sizeof(float) * m->hp.n_vocab);

	CHECK_MSG(c && lg, "%s", hyb_last_error());
	CHECK(!hyb_ctx_eval(c, prompt, (uint32_t)np, lg, false));
	for (int i = 0; i < n; i++) {
		out[i] = hyb_test_argmax(lg, m->hp.n_vocab);
		CHECK(!hyb_ctx_eval(c, &out[i], 1, lg, false));
	}
	memcpy(last, lg, sizeof(float) * m->hp.n_vocab);
	free(lg);
	hyb_ctx_free(c);
}

/*
 * Expert deferral (KTransformers section 5): 0 is no deferral, bit for bit;
 * the last layer defers nothing, so a model of one MoE layer is unchanged
 * too; with more layers decode changes and the prompt does not. The greedy
 * agreement with and without it is printed (on synthetic routing: a figure,
 * not a claim about trained models).
 */
#define DEFER_ARGS "--arch qwen3moe --experts 16 --experts-used 4 --expert-ffn 64 " \
		   "--hidden 128 --heads 4 --vocab 300 --layers "

TEST(moe_expert_deferral)
{
	const char *p1 = synth_file("defer1", DEFER_ARGS "1"), *p2 = synth_file("defer4",
										 DEFER_ARGS "4");
	int32_t prompt[8], a[48], b[48];
	float *la, *lb;
	struct hyb_model *m;

	for (int i = 0; i < 8; i++)
		prompt[i] = (i * 37 + 11) % 290 + 1;
	m = hyb_model_load(p1);
	CHECK_MSG(m, "%s", hyb_last_error());
	la = malloc(sizeof(float) * m->hp.n_vocab);
	lb = malloc(sizeof(float) * m->hp.n_vocab);
	CHECK(la && lb);
	greedy(m, 0, prompt, 8, 16, a, la);
	greedy(m, 2, prompt, 8, 16, b, lb);
	CHECK_MSG(!memcmp(a, b, sizeof(int32_t) * 16) &&
		  !memcmp(la, lb, sizeof(float) * m->hp.n_vocab),
		  "one MoE layer: deferral must change nothing (the last layer defers nothing)");
	hyb_model_free(m);

	m = hyb_model_load(p2);
	CHECK_MSG(m, "%s", hyb_last_error());
	{
		struct hyb_ctx_params cp = { .n_ctx = 64, .moe_defer = 4 };

		CHECK(!hyb_ctx_new(m, &cp)); /* all of K: nothing would be left to run */
		CHECK_MSG(strstr(hyb_last_error(), "deferral"), "%s", hyb_last_error());
	}
	greedy(m, 0, prompt, 8, 48, a, la);
	greedy(m, 0, prompt, 8, 48, b, lb);
	CHECK(!memcmp(la, lb, sizeof(float) * m->hp.n_vocab)); /* the baseline repeats */
	for (uint32_t d = 1; d <= 2; d++) {
		int same = 0, first = 48;

		greedy(m, d, prompt, 8, 48, b, lb);
		for (int i = 0; i < 48; i++) {
			same += a[i] == b[i];
			if (a[i] != b[i] && first == 48)
				first = i;
		}
		/* the prompt's pass is never deferred: the first token is the same */
		CHECK(a[0] == b[0]);
		CHECK_MSG(memcmp(la, lb, sizeof(float) * m->hp.n_vocab),
			  "deferring %u of 4 experts in 4 layers changed no logit", d);
		printf("    defer %u of 4: %d/48 greedy tokens as without, first difference at %d\n",
		       d, same, first);
	}
	free(la);
	free(lb);
	hyb_model_free(m);
}

/* glm4moe files that are wrong: refused by name; its MTP layers left out. */
TEST(moe_glm4moe_keys)
{
	char src[512];
	struct hyb_model *m;

	snprintf(src, sizeof(src), "%s", synth_file("glm", "--arch glm4moe --layers 3 --experts 8 "
		 "--experts-used 2 --expert-ffn 64 --hidden 128 --heads 2 --vocab 300"));
	m = hyb_model_load(src);
	CHECK_MSG(m, "%s", hyb_last_error());
	CHECK(m->hp.n_rot == m->hp.head_dim / 2 && m->hp.rope_neox && m->hp.expert_sigmoid &&
	      m->hp.expert_norm && m->hp.n_dense_lead == 1 && m->hp.n_ff_shexp == 64);
	CHECK(m->layers[1].exp_probs_b && m->layers[0].gate.data && m->layers[1].bq);
	hyb_model_free(m);
	expect_load_error(rewrite(src, "glm-gating", "glm4moe.expert_gating_func", 9, NULL, NULL),
			  "expert_gating_func 9 is not supported");
	expect_load_error(rewrite(src, "glm-nextn", "glm4moe.nextn_predict_layers", 3, NULL, NULL),
			  "nextn_predict_layers 3 leaves none");
	expect_load_error(rewrite(src, "glm-norm", NULL, -1, "blk.1.post_attention_norm.weight",
				  "blk.1.ffn_norm.weight"), "blk.1.post_attention_norm.weight is missing");
	m = hyb_model_load(rewrite(src, "glm-mtp", "glm4moe.nextn_predict_layers", 1, NULL, NULL));
	CHECK_MSG(m, "%s", hyb_last_error());
	CHECK(m->hp.n_layer == 2);
	hyb_model_free(m);
}

/* gpt-oss files that are wrong: refused by name; hybrid decoding refused until the device has it */
TEST(moe_gptoss_refuses_bad_files_by_name)
{
	char src[512];
	struct hyb_model *m;
	struct hyb_hybrid_params hy = { .gpu_budget = 1u << 20, .device = "cpu" };
	struct hyb_ctx_params cp = { .n_ctx = 64, .n_threads = 1, .hybrid = &hy };

	snprintf(src, sizeof(src), "%s", synth_file("gptoss", "--arch gpt-oss --layers 2 "
		 "--experts 8 --experts-used 2 --expert-ffn 64 --hidden 128 --heads 2 "
		 "--head-dim 64 --vocab 300"));
	m = hyb_model_load(src);
	CHECK_MSG(m, "%s", hyb_last_error());
	CHECK(m->hp.expert_softmax_weight && m->hp.act == HYB_ACT_SWIGLU_OAI && m->hp.rope_neox &&
	      m->hp.n_swa == 16 && m->layers[0].swa && !m->layers[1].swa);
	CHECK(m->layers[1].attn_sinks && m->layers[1].bo && m->layers[1].gate_inp_b &&
	      m->layers[1].gate_exps_b && m->layers[1].up_exps_b && m->layers[1].down_exps_b);
	CHECK(!hyb_ctx_new(m, &cp));
	CHECK_MSG(strstr(hyb_last_error(), "hybrid decoding of gpt-oss is not supported"), "%s",
		  hyb_last_error());
	hyb_model_free(m);
	expect_load_error(rewrite(src, "gptoss-sinks", NULL, -1, "blk.1.attn_sinks.weight",
				  "blk.1.attn_sink.weight"), "blk.1.attn_sinks.weight");
	expect_load_error(rewrite(src, "gptoss-bias", NULL, -1, "blk.0.ffn_down_exps.bias",
				  "blk.0.ffn_down_exp.bias"), "blk.0.ffn_down_exps.bias");
	expect_load_error(rewrite(src, "gptoss-swa", "gpt-oss.attention.sliding_window", 0, NULL,
				  NULL), "sliding_window must be positive");
}

/*
 * The same router in a graph step (docs/MOE.md "One graph a step"): the
 * executor thread meets the NaN inside the graph's host functions; the
 * step fails with the tensor named, nothing hangs, and the context goes on
 * without graphs, failing the same way.
 */
TEST(moe_nan_router_in_a_graph_step_is_an_error)
{
	struct moe_file d = good;
	struct hyb_model *m;
	struct hyb_ctx *c;
	struct hyb_hybrid_offload pl;
	int32_t tok = 5;
	float *lg = malloc(sizeof(float) * V);

	d.nan_router = true;
	m = hyb_model_load(write_moe("nang", &d));
	CHECK_MSG(m, "%s", hyb_last_error());
	struct hyb_hybrid_params hy = { .device = "cpu", .policy = HYB_POLICY_LRU,
					.gpu_budget = m->weight_bytes * 4, .graph = true };
	struct hyb_ctx_params cp = { .n_ctx = 64, .n_threads = 2, .hybrid = &hy };

	c = hyb_ctx_new(m, &cp);
	CHECK_MSG(c, "%s", hyb_last_error());
	hyb_ctx_hybrid_offload(c, &pl);
	CHECK_MSG(!strcmp(pl.graph_note, "one device graph a step"), "%s", pl.graph_note);
	CHECK(hyb_ctx_eval(c, &tok, 1, lg, false) < 0);
	CHECK_MSG(strstr(hyb_last_error(), "blk.0.ffn_gate_inp.weight") &&
		  strstr(hyb_last_error(), "not finite"), "error '%s'", hyb_last_error());
	hyb_ctx_hybrid_offload(c, &pl);
	CHECK_MSG(strstr(pl.graph_note, "not one graph a step"), "%s", pl.graph_note);
	CHECK(hyb_ctx_eval(c, &tok, 1, lg, false) < 0);
	CHECK_MSG(strstr(hyb_last_error(), "not finite"), "error '%s'", hyb_last_error());
	free(lg);
	hyb_ctx_free(c);
	hyb_model_free(m);
}
