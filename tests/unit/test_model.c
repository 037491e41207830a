// SPDX-License-Identifier: MIT
/* The model loader and forward pass: real files, generated files, bad files. */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "hyb/generate.h"
#include "hyb/gguf.h"
#include "hyb/model.h"
#include "hyb/sampler.h"
#include "hyb/tensor_type.h"
#include "hyb/tokenizer.h"
#include "test.h"

#define TINY "models/llama-2-tiny-random.gguf"

static struct hyb_model *load_or_skip(const char *path)
{
	struct hyb_model *m;

	if (access(path, R_OK))
		SKIP("%s not present", path);
	m = hyb_model_load(path);
	CHECK_MSG(m, "load %s: %s", path, hyb_last_error());
	return m;
}

static struct hyb_ctx *ctx_threads(const struct hyb_model *m, int nth, uint32_t n_ctx)
{
	struct hyb_ctx_params p = { .n_ctx = n_ctx, .n_threads = nth };
	struct hyb_ctx *c = hyb_ctx_new(m, &p);

	CHECK_MSG(c, "ctx: %s", hyb_last_error());
	return c;
}

TEST(model_tiny_hparams)
{
	struct hyb_model *m = load_or_skip(hyb_test_shared(TINY));

	CHECK(!strcmp(m->hp.arch, "llama"));
	CHECK_EQ_INT(m->hp.n_embd, 8);
	CHECK_EQ_INT(m->hp.n_layer, 1);
	CHECK_EQ_INT(m->hp.n_ff, 32);
	CHECK_EQ_INT(m->hp.n_head, 2);
	CHECK_EQ_INT(m->hp.n_vocab, 32000);
	CHECK(m->tok != NULL);
	hyb_model_free(m);
}

/*
 * Greedy continuation of the tiny model, token for token as llama.cpp
 * (build of llama-cpp-python 0.3.36's vendored llama.cpp, llama-simple,
 * repetition penalty 1.0) produced it for the same prompt.
 */
TEST(model_tiny_greedy_matches_llamacpp)
{
	static const char prompt[] = "Hello, my name is";
	static const int32_t want[] = {
		30960, 16768, 5815, 17433, 357, 16021, 3852, 26270, 16404, 9069, 21352, 25997, 9645,
		20945, 16138, 2451, 19209, 19982, 8317, 15492, 19741, 8021, 29710, 4660, 29448, 3870,
		13706, 5702, 13947, 22372, 1136, 14007, 19982, 8317, 15492, 19741, 8021, 29710, 4660,
		29509,
	};
	const int n_want = (int)(sizeof(want) / sizeof(want[0]));
	struct hyb_model *m = load_or_skip(hyb_test_shared(TINY));
	struct hyb_ctx *c = ctx_threads(m, 2, 128);
	struct hyb_sampler_params sp = hyb_sampler_defaults();
	struct hyb_sampler *s = hyb_sampler_new(&sp, (int32_t)m->hp.n_vocab);
	float *logits = malloc(sizeof(float) * m->hp.n_vocab);
	int32_t ids[64];
	int n = hyb_tokenize(m->tok, prompt, strlen(prompt), true, ids, 64);

	CHECK(n > 1 && n < 64);
	CHECK_MSG(!hyb_ctx_eval(c, ids, (uint32_t)n, logits, false), "%s", hyb_last_error());
	for (int i = 0; i < n_want; i++) {
		int32_t tok = hyb_sampler_sample(s, logits);

		CHECK_MSG(tok == want[i], "token %d: hyb %d, llama.cpp %d", i, tok, want[i]);
		CHECK(!hyb_ctx_eval(c, &tok, 1, logits, false));
	}
	free(logits);
	hyb_sampler_free(s);
	hyb_ctx_free(c);
	hyb_model_free(m);
}

/* Batched prefill and token-by-token decode compute the same logits. */
static void prefill_vs_decode(const char *args, double tol)
{
	struct hyb_model *m = load_or_skip(hyb_test_synth("pd", args));
	const uint32_t n = 12, V = m->hp.n_vocab;
	struct hyb_ctx *a = ctx_threads(m, 2, 64), *b = ctx_threads(m, 2, 64);
	float *la = malloc(sizeof(float) * V * n), *lb = malloc(sizeof(float) * V * n);
	int32_t toks[12];
	double maxdiff = 0, scale = 0;

	for (uint32_t i = 0; i < n; i++)
		toks[i] = (int32_t)((i * 7919u + 3) % V);
	CHECK(!hyb_ctx_eval(a, toks, n, la, true));
	for (uint32_t i = 0; i < n; i++)
		CHECK(!hyb_ctx_eval(b, &toks[i], 1, lb + (size_t)i * V, false));
	for (size_t i = 0; i < (size_t)V * n; i++) {
		double d = fabs((double)la[i] - lb[i]);

		CHECK_MSG(isfinite(la[i]), "non-finite logit at %zu", i);
		maxdiff = d > maxdiff ? d : maxdiff;
		scale = fabs(lb[i]) > scale ? fabs(lb[i]) : scale;
	}
	CHECK_MSG(maxdiff <= tol * scale, "prefill vs decode: max diff %g, max |logit| %g",
		  maxdiff, scale);
	free(la);
	free(lb);
	hyb_ctx_free(a);
	hyb_ctx_free(b);
	hyb_model_free(m);
}

TEST(model_prefill_equals_decode_q8_0)
{
	prefill_vs_decode("--hidden 256 --ffn 512 --layers 2 --heads 4 --kv-heads 2 --type Q8_0",
			  1e-3);
}

TEST(model_prefill_equals_decode_f16)
{
	prefill_vs_decode("--hidden 128 --ffn 256 --layers 2 --heads 4 --type F16 --rope-neox",
			  1e-3);
}

TEST(model_prefill_equals_decode_q4_k_relu)
{
	prefill_vs_decode("--hidden 256 --ffn 512 --layers 2 --heads 2 --type Q4_K --act relu "
			  "--tied", 1e-3);
}

/* Rows are computed by the same kernel whatever thread runs them: results are bitwise equal. */
TEST(model_thread_count_does_not_change_logits)
{
	struct hyb_model *m = load_or_skip(hyb_test_synth("thr", "--hidden 256 --ffn 512 --layers 2 "
						 "--heads 4 --type Q4_0"));
	const uint32_t V = m->hp.n_vocab;
	struct hyb_ctx *a = ctx_threads(m, 1, 16), *b = ctx_threads(m, 2, 16);
	float *la = malloc(sizeof(float) * V * 5), *lb = malloc(sizeof(float) * V * 5);
	int32_t toks[5] = { 1, 50, 300, 7, 411 };

	CHECK(!hyb_ctx_eval(a, toks, 5, la, true));
	CHECK(!hyb_ctx_eval(b, toks, 5, lb, true));
	CHECK(!memcmp(la, lb, sizeof(float) * V * 5));
	free(la);
	free(lb);
	hyb_ctx_free(a);
	hyb_ctx_free(b);
	hyb_model_free(m);
}

TEST(model_eval_rejects_bad_tokens_and_full_context)
{
	struct hyb_model *m = load_or_skip(hyb_test_synth("bad", "--hidden 128 --ffn 256 --layers 1 "
						 "--heads 2 --type F32"));
	struct hyb_ctx *c = ctx_threads(m, 2, 4);
	float *logits = malloc(sizeof(float) * m->hp.n_vocab);
	int32_t toks[5] = { 1, 2, 3, 4, 5 }, bad = (int32_t)m->hp.n_vocab, neg = -1;

	CHECK_EQ_INT(hyb_ctx_eval(c, &bad, 1, logits, false), -EINVAL);
	CHECK(strstr(hyb_last_error(), "out of range"));
	CHECK_EQ_INT(hyb_ctx_eval(c, &neg, 1, logits, false), -EINVAL);
	CHECK_EQ_INT(hyb_ctx_eval(c, toks, 0, logits, false), -EINVAL);
	CHECK_EQ_INT(hyb_ctx_eval(c, toks, 5, logits, false), -ENOSPC);
	CHECK(strstr(hyb_last_error(), "context full"));
	CHECK(hyb_ctx_eval(c, toks, 4, logits, false) == 0);
	CHECK_EQ_INT(hyb_ctx_eval(c, toks, 1, logits, false), -ENOSPC);
	hyb_ctx_reset(c);
	CHECK(hyb_ctx_eval(c, toks, 1, logits, false) == 0);
	free(logits);
	hyb_ctx_free(c);
	hyb_model_free(m);
}

/* A minimal llama model with the given architecture and matrix type, for more keys or tensors. */
static struct hyb_gguf_writer *model_writer(const char *arch, uint32_t mat_type,
					    bool drop_ffn_down)
{
	static float zeros[64 * 64];
	struct hyb_gguf_writer *w = hyb_gguf_writer_new();
	const char *mats[] = { "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
			       "ffn_down" };
	char key[64];
	uint64_t ne_mat[2] = { 32, 32 }, ne_vec[1] = { 32 }, ne_emb[2] = { 32, 64 };

	CHECK(w);
	hyb_gguf_set_str(w, "general.architecture", arch);
#define K(s, v)                                                     \
	do {                                                        \
		snprintf(key, sizeof(key), "%s." s, arch);          \
		hyb_gguf_set_u32(w, key, v);                            \
	} while (0)
	K("embedding_length", 32);
	K("block_count", 1);
	K("feed_forward_length", 32);
	K("attention.head_count", 2);
#undef K
	CHECK(!hyb_gguf_writer_add_tensor(w, "token_embd.weight", HYB_TYPE_F32, 2, ne_emb, zeros));
	CHECK(!hyb_gguf_writer_add_tensor(w, "output_norm.weight", HYB_TYPE_F32, 1, ne_vec, zeros));
	CHECK(!hyb_gguf_writer_add_tensor(w, "blk.0.attn_norm.weight", HYB_TYPE_F32, 1, ne_vec, zeros));
	CHECK(!hyb_gguf_writer_add_tensor(w, "blk.0.ffn_norm.weight", HYB_TYPE_F32, 1, ne_vec, zeros));
	for (int i = 0; i < 7; i++) {
		char name[64];

		if (drop_ffn_down && i == 6)
			break;
		snprintf(name, sizeof(name), "blk.0.%s.weight", mats[i]);
		CHECK(!hyb_gguf_writer_add_tensor(w, name, i == 0 ? mat_type : HYB_TYPE_F32, 2, ne_mat,
					      zeros));
	}
	return w;
}

static const char *write_writer(struct hyb_gguf_writer *w, const char *name)
{
	static char path[512];

	snprintf(path, sizeof(path), "%s/%s.gguf", hyb_test_tmpdir(), name);
	CHECK_MSG(!hyb_gguf_writer_write_file(w, path), "%s", hyb_last_error());
	hyb_gguf_writer_free(w);
	return path;
}

/* A minimal llama file with the given architecture and matrix type, written in-process. */
static const char *write_model(const char *arch, uint32_t mat_type, bool drop_ffn_down)
{
	char name[64];

	snprintf(name, sizeof(name), "m-%s-%u", arch, mat_type);
	return write_writer(model_writer(arch, mat_type, drop_ffn_down), name);
}

static void expect_load_error(const char *path, const char *needle)
{
	struct hyb_model *m = hyb_model_load(path);

	CHECK_MSG(!m, "%s loaded but should not", path);
	CHECK_MSG(strstr(hyb_last_error(), needle), "error '%s' does not mention '%s'",
		  hyb_last_error(), needle);
}

TEST(model_loads_minimal_file)
{
	struct hyb_model *m = hyb_model_load(write_model("llama", HYB_TYPE_F32, false));

	CHECK_MSG(m, "%s", hyb_last_error());
	CHECK(m->output.data == m->tok_embd.data); /* tied head */
	hyb_model_free(m);
}

TEST(model_refuses_unknown_architecture_by_name)
{
	expect_load_error(write_model("gpt2", HYB_TYPE_F32, false), "'gpt2'");
}

TEST(model_refuses_unsupported_type_by_name)
{
	/* Q8_1: a real ggml type (block 32, 36 bytes) hyb has no weight kernels for */
	expect_load_error(write_model("llama", HYB_TYPE_Q8_1, false), "Q8_1");
}

TEST(model_refuses_missing_tensor_by_name)
{
	expect_load_error(write_model("llama", HYB_TYPE_F32, true), "blk.0.ffn_down.weight");
}

/* RoPE scaling (docs/MODELS.md): what llama.cpp reads, and clear errors for the rest. */
TEST(model_rope_scaling_keys)
{
	static const float freqs[8] = { 1, 1, 2, 4, 8, 8, 8, 8 }, bad[8] = { 1, 0 };
	const uint64_t ne8[1] = { 8 }, ne4[1] = { 4 };
	struct hyb_gguf_writer *w;
	struct hyb_model *m;

	w = model_writer("llama", HYB_TYPE_F32, false);
	hyb_gguf_set_str(w, "llama.rope.scaling.type", "yarn");
	hyb_gguf_set_f32(w, "llama.rope.scaling.factor", 4.0f);
	m = hyb_model_load(write_writer(w, "yarn"));
	CHECK_MSG(m, "%s", hyb_last_error());
	CHECK(m->hp.rope.freq_scale == 0.25f && m->hp.rope.ext_factor == 1.0f);
	/* get_mscale(4) cancelled by rope_yarn's own factor: 1 give or take rounding */
	CHECK_NEAR(m->hp.rope.attn_factor, 1.0, 1e-6);
	CHECK(m->hp.rope.corr_dims[1] > m->hp.rope.corr_dims[0]);
	hyb_model_free(m);

	w = model_writer("llama", HYB_TYPE_F32, false);
	hyb_gguf_set_str(w, "llama.rope.scaling.type", "none");
	hyb_gguf_set_f32(w, "llama.rope.scaling.factor", 4.0f);
	CHECK(!hyb_gguf_writer_add_tensor(w, "rope_freqs.weight", HYB_TYPE_F32, 1, ne8, freqs));
	m = hyb_model_load(write_writer(w, "none-freqs"));
	CHECK_MSG(m, "%s", hyb_last_error());
	CHECK(m->hp.rope.freq_scale == 1.0f && m->hp.rope.ext_factor == 0);
	CHECK(m->hp.rope.freq_factors && m->hp.rope.freq_factors[3] == 4.0f);
	hyb_model_free(m);

	w = model_writer("llama", HYB_TYPE_F32, false);
	hyb_gguf_set_str(w, "llama.rope.scaling.type", "longrope");
	expect_load_error(write_writer(w, "longrope"), "'longrope' is not supported");
	w = model_writer("llama", HYB_TYPE_F32, false);
	hyb_gguf_set_str(w, "llama.rope.scaling.type", "llama3");
	expect_load_error(write_writer(w, "llama3-nofreqs"), "rope_freqs.weight is missing");
	w = model_writer("llama", HYB_TYPE_F32, false);
	CHECK(!hyb_gguf_writer_add_tensor(w, "rope_freqs.weight", HYB_TYPE_F32, 1, ne4, freqs));
	expect_load_error(write_writer(w, "short-freqs"), "expected F32 [8]");
	w = model_writer("llama", HYB_TYPE_F32, false);
	CHECK(!hyb_gguf_writer_add_tensor(w, "rope_freqs.weight", HYB_TYPE_F32, 1, ne8, bad));
	expect_load_error(write_writer(w, "zero-freq"), "not a positive number");
	w = model_writer("llama", HYB_TYPE_F32, false);
	hyb_gguf_set_f32(w, "llama.rope.scaling.factor", -2.0f);
	expect_load_error(write_writer(w, "neg-factor"), "must be positive");
	w = model_writer("llama", HYB_TYPE_F32, false);
	hyb_gguf_set_u32(w, "llama.rope.scaling.type", 3);
	expect_load_error(write_writer(w, "type-u32"), "not a short string");
}

/* Each architecture's own tensors and keys, refused by name when missing or wrong. */
TEST(model_arch_errors_name_the_tensor)
{
	struct hyb_gguf_writer *w;

	expect_load_error(write_model("qwen2", HYB_TYPE_F32, false),
			  "blk.0.attn_q.bias is missing");
	expect_load_error(write_model("qwen3", HYB_TYPE_F32, false),
			  "blk.0.attn_q_norm.weight is missing");
	expect_load_error(write_model("gemma3", HYB_TYPE_F32, false),
			  "blk.0.attn_q_norm.weight is missing");
	/* phi3's ffn_up holds gate and up: 2 n_ff rows */
	expect_load_error(write_model("phi3", HYB_TYPE_F32, false), "blk.0.ffn_up.weight");
	expect_load_error(write_model("mamba", HYB_TYPE_F32, false),
			  "supported: llama, qwen2, qwen3, gemma3, phi3");
	w = model_writer("llama", HYB_TYPE_F32, false);
	hyb_gguf_set_u32(w, "llama.attention.value_length", 8);
	expect_load_error(write_writer(w, "vlen"), "value_length 8 differs from key_length 16");
	w = model_writer("gemma3", HYB_TYPE_F32, false);
	hyb_gguf_set_f32(w, "gemma3.final_logit_softcapping", 30.0f);
	expect_load_error(write_writer(w, "softcap"), "soft-capping is not supported");
	w = model_writer("llama", HYB_TYPE_F32, false);
	hyb_gguf_set_str(w, "llama.rope.scaling.type", "longrope");
	expect_load_error(write_writer(w, "llama-longrope"), "longrope for phi3");
}

TEST(model_missing_file_is_one_clear_error)
{
	expect_load_error("/nonexistent/model.gguf", "No such file");
}

/* The CLI: one clear line and a non-zero exit for bad input. */
TEST(model_cli_errors_exit_nonzero)
{
	char cmd[1024];

	CHECK(system("build/hyb run -m /nonexistent.gguf -p hi 2>/dev/null") != 0);
	CHECK(system("build/hyb run 2>/dev/null") != 0);
	CHECK(system("build/hyb frobnicate 2>/dev/null") != 0);
	snprintf(cmd, sizeof(cmd), "build/hyb run -m %s -p hi -n 4 --temp -1 2>/dev/null",
		 hyb_test_synth("cli", "--hidden 128 --ffn 256 --layers 1 --heads 2 --type Q8_0"));
	CHECK(system(cmd) != 0);
	CHECK(system("build/hybctl synth -o /nonexistent/dir/x.gguf 2>/dev/null") != 0);
}

/* End to end: the CLI generates text from a generated model and reports speed. */
/* The file out of the page cache: the streaming engine then reads it O_DIRECT (cold). */
static void evict(const char *path)
{
	int fd = open(path, O_RDONLY);

	CHECK(fd >= 0);
	CHECK(!posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED));
	close(fd);
}

TEST(model_cli_run_generates)
{
	char cmd[1024], out[4096] = "";
	FILE *p;
	size_t n;

	const char *model = hyb_test_synth("run", "--hidden 256 --ffn 512 --layers 2 --heads 4 "
					   "--type Q4_0");

	evict(model);	/* cold: the weights stream in behind the prompt */
	snprintf(cmd, sizeof(cmd), "build/hyb run -m %s -p 'Once upon a time' -n 16 2>&1", model);
	p = popen(cmd, "r");
	CHECK(p);
	n = fread(out, 1, sizeof(out) - 1, p);
	out[n] = 0;
	CHECK_MSG(pclose(p) == 0, "hyb run failed: %s", out);
	CHECK_MSG(strstr(out, "Once upon a time"), "%s", out);
	CHECK_MSG(strstr(out, "decode: "), "%s", out);
	CHECK_MSG(strstr(out, "tokens/s"), "%s", out);
	/* time to first token, and the weights that streamed in behind the prompt */
	CHECK_MSG(strstr(out, "first token: ") && strstr(out, "streamed in"), "%s", out);
}

/* Weights in huge-page memory or on the file mapping: the same bytes, the same logits. */
TEST(model_load_modes_agree)
{
	const char *path = hyb_test_synth("modes", "--hidden 256 --ffn 512 --layers 2 --heads 4 "
					  "--type Q6_K");
	struct hyb_model *a = hyb_model_load_mode(path, HYB_LOAD_HUGEPAGE);
	struct hyb_model *b = hyb_model_load_mode(path, HYB_LOAD_MMAP);
	int32_t toks[4] = { 1, 17, 99, 5 };

	CHECK(a && b);
	CHECK(a->image && !b->image);
	CHECK(((uintptr_t)a->image & ((2u << 20) - 1)) == 0);
	struct hyb_ctx *ca = ctx_threads(a, 2, 8), *cb = ctx_threads(b, 2, 8);
	float *la = malloc(sizeof(float) * a->hp.n_vocab * 4), *lb = malloc(sizeof(float) * b->hp.n_vocab * 4);

	CHECK(!hyb_ctx_eval(ca, toks, 4, la, true));
	CHECK(!hyb_ctx_eval(cb, toks, 4, lb, true));
	CHECK(!memcmp(la, lb, sizeof(float) * a->hp.n_vocab * 4));
	setenv("HYB_LOAD", "bogus", 1);
	CHECK(!hyb_model_load(path) && strstr(hyb_last_error(), "HYB_LOAD"));
	free(la);
	free(lb);
	hyb_ctx_free(ca);
	hyb_ctx_free(cb);
	hyb_model_free(a);
	hyb_model_free(b);
}

/* Read the whole file, so it is in the page cache (warm). */
static void warm(const char *path)
{
	char buf[65536];
	FILE *f = fopen(path, "rb");

	CHECK(f);
	while (fread(buf, 1, sizeof(buf), f) == sizeof(buf))
		;
	fclose(f);
}

/*
 * hyb_model_load_streaming: cold, the prompt computes while the weights
 * arrive, on exactly the bytes a whole load gives (every position's logits
 * bit for bit) and waits reach the end of the file; warm (the file in the
 * page cache), the model loads whole first, with the same logits.
 */
TEST(model_streaming_load_gives_the_same_logits)
{
	const char *path = hyb_test_synth("stream", "--hidden 512 --ffn 1376 --layers 6 --heads 8 "
				 "--vocab 8000 --type Q8_0");
	int32_t toks[5] = { 1, 17, 99, 5, 4000 };
	struct hyb_model *a = hyb_model_load(path);

	CHECK_MSG(a, "%s", hyb_last_error());
	CHECK(!a->stream);
	struct hyb_ctx *ca = ctx_threads(a, 2, 8);
	float *la = malloc(sizeof(float) * a->hp.n_vocab * 5),
	      *lb = malloc(sizeof(float) * a->hp.n_vocab * 5);

	CHECK(!hyb_ctx_eval(ca, toks, 5, la, true));
	for (int cold = 1; cold >= 0; cold--) {
		if (cold)
			evict(path);
		else
			warm(path);
		struct hyb_model *b = hyb_model_load_streaming(path);

		CHECK_MSG(b, "%s", hyb_last_error());
		CHECK_MSG(!b->stream == !cold && b->image, "%s load: streaming %d",
			  cold ? "cold" : "warm", b->stream != NULL);
		struct hyb_ctx *cb = ctx_threads(b, 2, 8);

		CHECK_MSG(!hyb_ctx_eval(cb, toks, 5, lb, true), "%s", hyb_last_error());
		CHECK_MSG(!memcmp(la, lb, sizeof(float) * a->hp.n_vocab * 5),
			  "%s logits differ from a whole load", cold ? "cold" : "warm");
		CHECK(!hyb_model_wait(b) && !hyb_model_loading(b));
		hyb_ctx_free(cb);
		hyb_model_free(b);
	}
	free(la);
	free(lb);
	hyb_ctx_free(ca);
	hyb_model_free(a);
}

/*
 * A read error in the last layer: the load still returns (the header is in),
 * and the prompt that reaches that layer fails with the load's error, naming
 * the file and offset; the model frees cleanly. Freeing a model whose load
 * is still running cancels it.
 */
TEST(model_streaming_load_errors_reach_the_prompt)
{
	const char *path = hyb_test_synth("streamfail", "--hidden 512 --ffn 1376 --layers 4 --heads 8 "
				 "--vocab 8000 --type Q8_0");
	char env[64];
	int32_t toks[3] = { 1, 2, 3 };
	struct hyb_model *a = hyb_model_load(path);

	CHECK_MSG(a, "%s", hyb_last_error());
	uint64_t bad = (uint64_t)((const uint8_t *)a->layers[3].down.data -
				  (const uint8_t *)a->image) + 1000;

	hyb_model_free(a);
	snprintf(env, sizeof(env), "%llu", (unsigned long long)bad);
	setenv("HYB_STREAM_FAULT", env, 1);
	evict(path);
	struct hyb_model *m = hyb_model_load_streaming(path);

	CHECK_MSG(m, "the header was fine: %s", hyb_last_error());
	struct hyb_ctx *c = ctx_threads(m, 2, 8);
	float *logits = malloc(sizeof(float) * m->hp.n_vocab);

	CHECK_EQ_INT(hyb_ctx_eval(c, toks, 3, logits, false), -EIO);
	CHECK_MSG(strstr(hyb_last_error(), "loading the model failed") &&
		  strstr(hyb_last_error(), "streamfail.gguf") &&
		  strstr(hyb_last_error(), "offset") &&
		  strstr(hyb_last_error(), "Input/output error"), "%s", hyb_last_error());
	CHECK_EQ_INT(hyb_model_wait(m), -EIO);
	CHECK(!hyb_model_loading(m));
	CHECK_MSG(strstr(hyb_last_error(), "loading the model failed"), "%s", hyb_last_error());
	hyb_ctx_free(c);
	hyb_model_free(m);
	unsetenv("HYB_STREAM_FAULT");

	for (int i = 0; i < 4; i++) {	/* freed at once, mid-load or not */
		evict(path);
		m = hyb_model_load_streaming(path);
		CHECK_MSG(m, "%s", hyb_last_error());
		hyb_model_free(m);
	}
	free(logits);
}
