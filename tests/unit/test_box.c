// SPDX-License-Identifier: MIT
/*
 * Box mode on the host (the VM bench runs the same with
 * hybd as its own process on hybpool.ko and the model on an emulated NVMe
 * drive): hybd runs in-process on the local backend, an "app" builds the
 * model from the manifest with hyb_model_load_manifest() and must generate
 * exactly the token ids the same file gives through hyb_model_load(); the
 * weights it computes on are the pools' read-only mappings; a daemon that
 * retires its manifest (-ESHUTDOWN) or dies (-EPIPE) is reported by
 * hyb_model_box_check() while the mapped weights stay readable; bad sources
 * and non-resident tensors are refused with a clear message.
 */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon/config.h"
#include "daemon/server.h"
#include "cpu_kernels.h"
#include "hyb/generate.h"
#include "hyb/gguf.h"
#include "hyb/manifest.h"
#include "hyb/model.h"
#include "hyb/pool.h"
#include "hyb/sampler.h"
#include "hyb/tensor_type.h"
#include "hyb/tokenizer.h"
#include "test.h"

#define N_GEN 24

/* -- a Q8_0 llama of our own (GQA, several layers) ------------------------ */

static float frand(uint32_t *s)
{
	*s ^= *s << 13, *s ^= *s >> 17, *s ^= *s << 5;
	return ((*s >> 8) / 16777216.0f - 0.5f) * 0.5f;
}

static const char *write_q8_model(const char *name, uint32_t layers)
{
	enum { E = 64, F = 192, V = 256, KV = 32 };
	static char path[512];
	struct hyb_gguf_writer *w = hyb_gguf_writer_new();
	void *bufs[64];
	int nb = 0;
	uint32_t seed = 12345;
	char tn[64];

	CHECK(w);
	hyb_gguf_set_str(w, "general.architecture", "llama");
	hyb_gguf_set_u32(w, "llama.block_count", layers);
	hyb_gguf_set_u32(w, "llama.embedding_length", E);
	hyb_gguf_set_u32(w, "llama.feed_forward_length", F);
	hyb_gguf_set_u32(w, "llama.attention.head_count", 4);
	hyb_gguf_set_u32(w, "llama.attention.head_count_kv", 2);
	hyb_gguf_set_u32(w, "llama.context_length", 256);
	hyb_gguf_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
#define T(nm, type, ne0, ne1)                                                          \
	do {                                                                           \
		uint64_t ne_[2] = { ne0, ne1 };                                        \
		uint64_t rb_ = hyb_row_bytes(type, ne0);                               \
		float row_[F];                                                         \
		uint8_t *d_ = malloc(rb_ * ne1);                                       \
		CHECK(d_ && nb < 64);                                                  \
		for (uint64_t r_ = 0; r_ < ne1; r_++) {                                \
			for (uint64_t i_ = 0; i_ < ne0; i_++)                          \
				row_[i_] = type == HYB_TYPE_F32 ? 1.0f + frand(&seed)   \
								: frand(&seed);         \
			CHECK(!hyb_quantize_row_ref(type, row_, d_ + r_ * rb_, ne0));  \
		}                                                                      \
		bufs[nb++] = d_;                                                       \
		CHECK(!hyb_gguf_writer_add_tensor(w, nm, type, ne1 > 1 ? 2 : 1, ne_, d_)); \
	} while (0)
	T("token_embd.weight", HYB_TYPE_Q8_0, E, V);
	for (uint32_t l = 0; l < layers; l++) {
#define N(s) (snprintf(tn, sizeof(tn), "blk.%u." s, l), tn)
		T(N("attn_norm.weight"), HYB_TYPE_F32, E, 1);
		T(N("attn_q.weight"), HYB_TYPE_Q8_0, E, E);
		T(N("attn_k.weight"), HYB_TYPE_Q8_0, E, KV);
		T(N("attn_v.weight"), HYB_TYPE_Q8_0, E, KV);
		T(N("attn_output.weight"), HYB_TYPE_Q8_0, E, E);
		T(N("ffn_norm.weight"), HYB_TYPE_F32, E, 1);
		T(N("ffn_gate.weight"), HYB_TYPE_Q8_0, E, F);
		T(N("ffn_up.weight"), HYB_TYPE_Q8_0, E, F);
		T(N("ffn_down.weight"), HYB_TYPE_Q8_0, F, E);
#undef N
	}
	T("output_norm.weight", HYB_TYPE_F32, E, 1);
	T("output.weight", HYB_TYPE_Q8_0, E, V);
#undef T
	snprintf(path, sizeof(path), "%s/%s", hyb_test_tmpdir(), name);
	CHECK_MSG(!hyb_gguf_writer_write_file(w, path), "%s", hyb_last_error());
	hyb_gguf_writer_free(w);
	while (nb)
		free(bufs[--nb]);
	return path;
}

/* -- helpers --------------------------------------------------------------- */

static void start_hybd(const char *model, const char *name, const char *placement,
		       const char *pools_per_node, struct hybd **d)
{
	struct hybd_config c;
	char err[512];

	/* the app side opens AUTO: make that the local backend hybd uses here */
	setenv("HYB_BACKEND", "local", 1);
	hybd_config_defaults(&c);
	CHECK(!hybd_config_set(&c, "model", model, err, sizeof(err)));
	CHECK(!hybd_config_set(&c, "backend", "local", err, sizeof(err)));
	CHECK(!hybd_config_set(&c, "name", name, err, sizeof(err)));
	CHECK(!hybd_config_set(&c, "state_dir", hyb_test_tmpdir(), err, sizeof(err)));
	CHECK(!hybd_config_set(&c, "progress", "quiet", err, sizeof(err)));
	CHECK(!hybd_config_set(&c, "stats_interval", "0", err, sizeof(err)));
	CHECK(!hybd_config_set(&c, "gpu_slots", "2", err, sizeof(err)));
	CHECK(!hybd_config_set(&c, "slot_bytes", "64K", err, sizeof(err)));
	CHECK(!hybd_config_set(&c, "placement", placement, err, sizeof(err)));
	CHECK(!hybd_config_set(&c, "pools_per_node", pools_per_node, err, sizeof(err)));
	CHECK_MSG(!hybd_start(&c, NULL, NULL, d, err, sizeof(err)), "hybd: %s", err);
}

struct ids {
	int32_t v[N_GEN + 1];
	uint32_t n;
};

static int keep(void *arg, int32_t tok)
{
	struct ids *o = arg;

	if (o->n < N_GEN)
		o->v[o->n++] = tok;
	return 0;
}

/* Greedy ids after prompt (what `hyb run` does with --temp 0). */
static struct ids generate(const struct hyb_model *m, const int32_t *prompt, uint32_t np)
{
	struct hyb_ctx_params cp = { .n_ctx = np + N_GEN + 1, .n_threads = 1 };
	struct hyb_sampler_params sp = hyb_sampler_defaults();
	struct hyb_gen_stats st;
	struct ids o = { .n = 0 };
	struct hyb_sampler *s;
	struct hyb_ctx *c;

	sp.temperature = 0;
	c = hyb_ctx_new(m, &cp);
	CHECK_MSG(c, "%s", hyb_last_error());
	s = hyb_sampler_new(&sp, (int32_t)m->hp.n_vocab);
	CHECK(s);
	CHECK_MSG(!hyb_generate(c, m, s, prompt, np, N_GEN, keep, &o, &st),
		  "%s", hyb_last_error());
	hyb_sampler_free(s);
	hyb_ctx_free(c);
	return o;
}

static void check_same_ids(const struct ids *a, const struct ids *b, const char *what)
{
	CHECK_MSG(a->n == b->n, "%s: %u ids vs %u", what, a->n, b->n);
	for (uint32_t i = 0; i < a->n; i++)
		CHECK_MSG(a->v[i] == b->v[i], "%s: id %u is %d, the file gives %d", what, i,
			  b->v[i], a->v[i]);
}

/*
 * A write through the model's weights must fault: they are read-only pool
 * mappings. The local backend enforces that for shared pools only (its
 * private ones are plain process memory); kmod pools always are.
 */
static void check_read_only(const struct hyb_model *m, const char *name, const void *p)
{
	const struct hyb_manifest_tensor *t = hyb_manifest_find(hyb_model_manifest(m), name);
	struct hyb_mempool_info pi;
	pid_t pid;
	int st;

	CHECK(t && !hyb_mempool_stat(m->image_backend, t->pool_id, &pi));
	if (!(pi.flags & HYB_MEMPOOL_F_SHARED))
		return;
	pid = fork();
	CHECK(pid >= 0);
	if (!pid) {
		*(volatile uint8_t *)p = 1;
		_exit(0);
	}
	CHECK(waitpid(pid, &st, 0) == pid);
	CHECK_MSG(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV,
		  "a write to the weights did not fault (status %#x)", st);
}

/* The weight lies inside one of the manifest's pools, at its tensor's offset. */
static void check_in_pool(const struct hyb_model *m, const char *name, const void *data)
{
	const struct hyb_manifest *mf = hyb_model_manifest(m);
	const struct hyb_manifest_tensor *t = hyb_manifest_find(mf, name);

	CHECK_MSG(t && t->pool != HYB_MF_NO_POOL, "%s not resident", name);
	CHECK_MSG(((uintptr_t)data - t->pool_off) % 4096 == 0,
		  "%s: %p is not at pool offset %llu of a mapping", name, data,
		  (unsigned long long)t->pool_off);
	CHECK(!((uintptr_t)data >= (uintptr_t)m->gguf->base &&
		(uintptr_t)data < (uintptr_t)m->gguf->base + m->gguf->size));
}

/* -- tests ------------------------------------------------------------------ */

TEST(box_tiny_llama_from_manifest_generates_the_file_ids)
{
	const char *model = hyb_test_shared("models/llama-2-tiny-random.gguf");
	struct hyb_model *f, *b, *bf;
	struct hybd *d;
	struct ids want, got;
	int32_t pa[64], pb[64];
	char mpath[600];
	const char *prompt = "Once upon a time, in a box";
	int na, nbx;

	if (access(model, R_OK))
		SKIP("%s not found", model);
	start_hybd(model, "bt", "interleave", "2", &d);
	f = hyb_model_load(model);
	CHECK_MSG(f, "%s", hyb_last_error());
	b = hyb_model_load_manifest("bt");
	CHECK_MSG(b, "%s", hyb_last_error());
	snprintf(mpath, sizeof(mpath), "%s/bt.manifest", hyb_test_tmpdir());
	CHECK(!strcmp(hybd_manifest_path(d), mpath));
	bf = hyb_model_load_manifest(mpath);
	CHECK_MSG(bf, "%s", hyb_last_error());

	CHECK(!memcmp(&f->hp, &b->hp, sizeof(f->hp)));
	CHECK_EQ_INT(f->weight_bytes, b->weight_bytes);
	CHECK(b->tok && f->tok);
	na = hyb_tokenize(f->tok, prompt, strlen(prompt), true, pa, 64);
	nbx = hyb_tokenize(b->tok, prompt, strlen(prompt), true, pb, 64);
	CHECK(na > 3 && na == nbx && !memcmp(pa, pb, sizeof(int32_t) * na));

	want = generate(f, pa, (uint32_t)na);
	CHECK_EQ_INT(want.n, N_GEN);
	got = generate(b, pb, (uint32_t)nbx);
	check_same_ids(&want, &got, "manifest pool");
	got = generate(bf, pb, (uint32_t)nbx);
	check_same_ids(&want, &got, "manifest file");

	check_in_pool(b, "token_embd.weight", b->tok_embd.data);
	check_in_pool(b, "blk.0.ffn_down.weight", b->layers[0].down.data);
	check_read_only(b, "blk.0.attn_q.weight", b->layers[0].wq.data);
	CHECK(!hyb_model_manifest(f) && hyb_model_manifest(b));
	CHECK_EQ_INT(hyb_model_box_check(b), 0);
	CHECK_EQ_INT(hyb_model_box_check(f), -EINVAL);
	CHECK(strstr(hyb_last_error(), "not a box-mode model"));
	hyb_model_free(bf);
	hyb_model_free(b);
	hyb_model_free(f);
	hybd_stop(d, "test");
}

TEST(box_q8_model_in_several_pools_generates_the_file_ids)
{
	const char *model = write_q8_model("q8.gguf", 3);
	static const int32_t prompt[] = { 1, 17, 200, 3, 99, 42 };
	struct hyb_model *f, *b;
	struct hyb_manifest_info mi;
	struct hybd *d;
	struct ids want, got;

	start_hybd(model, "bq", "layer", "3", &d);
	f = hyb_model_load(model);
	CHECK_MSG(f, "%s", hyb_last_error());
	b = hyb_model_load_manifest("bq.manifest");
	CHECK_MSG(b, "%s", hyb_last_error());
	hyb_manifest_info(hyb_model_manifest(b), &mi);
	CHECK_MSG(mi.n_pools >= 3, "%u pools", mi.n_pools);
	CHECK(!b->tok);	/* no tokenizer metadata: ids only, as from the file */
	want = generate(f, prompt, 6);
	got = generate(b, prompt, 6);
	CHECK_EQ_INT(want.n, N_GEN);
	check_same_ids(&want, &got, "Q8_0 over 3 pools");
	for (uint32_t l = 0; l < 3; l++)
		CHECK(b->layers[l].gate.type == HYB_TYPE_Q8_0 && b->layers[l].wk.ne1 == 32);
	check_read_only(b, "output.weight", b->output.data);
	hyb_model_free(b);
	hyb_model_free(f);
	hybd_stop(d, "test");
}

TEST(box_check_reports_shutdown_and_death_weights_stay_readable)
{
	const char *model = write_q8_model("q8.gguf", 2);
	static const int32_t prompt[] = { 1, 5, 9 };
	struct hyb_model *f, *b1, *b2;
	struct hyb_mempool *mp;
	struct hybd *d1, *d2;
	struct ids want, got;

	f = hyb_model_load(model);
	CHECK_MSG(f, "%s", hyb_last_error());
	want = generate(f, prompt, 3);

	/* a clean shutdown: the manifest is retired, then the pools destroyed */
	start_hybd(model, "bs", "interleave", "1", &d1);
	b1 = hyb_model_load_manifest("bs");
	CHECK_MSG(b1, "%s", hyb_last_error());
	CHECK_EQ_INT(hyb_model_box_check(b1), 0);
	hybd_stop(d1, "test");
	CHECK_EQ_INT(hyb_model_box_check(b1), -ESHUTDOWN);
	CHECK_MSG(strstr(hyb_last_error(), "shut down") && strstr(hyb_last_error(), "bs.manifest"),
		  "%s", hyb_last_error());
	got = generate(b1, prompt, 3);	/* the mappings outlive the pools */
	check_same_ids(&want, &got, "after hybd stopped");
	CHECK(!hyb_model_load_manifest("bs"));
	CHECK_MSG(strstr(hyb_last_error(), "bs.manifest"), "%s", hyb_last_error());

	/*
	 * A death: the pools go without a retirement (what the kernel does when
	 * hybd is SIGKILLed; the VM bench kills a real one). Simulated here by
	 * destroying the manifest pool through hybd's own backend handle.
	 */
	start_hybd(model, "bk", "layer", "1", &d2);
	b2 = hyb_model_load_manifest("bk");
	CHECK_MSG(b2, "%s", hyb_last_error());
	CHECK(!hyb_mempool_open(hybd_backend(d2), "bk.manifest", &mp));
	CHECK(!hyb_mempool_destroy(mp));
	hyb_mempool_close(mp);
	CHECK_EQ_INT(hyb_model_box_check(b2), -EPIPE);
	CHECK_MSG(strstr(hyb_last_error(), "is gone") &&
		  strstr(hyb_last_error(), "without being retired"), "%s", hyb_last_error());
	got = generate(b2, prompt, 3);
	check_same_ids(&want, &got, "after the manifest pool went");
	hybd_stop(d2, "test");
	hyb_model_free(b2);
	hyb_model_free(b1);
	hyb_model_free(f);
}

TEST(box_load_errors_are_clear)
{
	const char *model = write_q8_model("q8.gguf", 2);
	struct hybd_config c;
	struct hybd *d;
	char err[512], path[600];

	setenv("HYB_BACKEND", "local", 1);
	CHECK(!hyb_model_load_manifest("nope"));
	CHECK_MSG(strstr(hyb_last_error(), "nope.manifest"), "%s", hyb_last_error());
	CHECK(!hyb_model_load_manifest(""));
	CHECK_MSG(strstr(hyb_last_error(), "empty"), "%s", hyb_last_error());
	CHECK(!hyb_model_load_manifest("a-name-much-too-long-for-a-pool"));
	CHECK_MSG(strstr(hyb_last_error(), "too long"), "%s", hyb_last_error());
	snprintf(path, sizeof(path), "%s/none.manifest", hyb_test_tmpdir());
	CHECK(!hyb_model_load_manifest(path));
	CHECK_MSG(strstr(hyb_last_error(), "none.manifest"), "%s", hyb_last_error());
	CHECK(!hyb_model_load_manifest(NULL));

	/* a DRAM budget leaves FFN weights on storage: refused, naming one */
	hybd_config_defaults(&c);
	CHECK(!hybd_config_set(&c, "model", model, err, sizeof(err)));
	CHECK(!hybd_config_set(&c, "backend", "local", err, sizeof(err)));
	CHECK(!hybd_config_set(&c, "name", "bp", err, sizeof(err)));
	CHECK(!hybd_config_set(&c, "state_dir", hyb_test_tmpdir(), err, sizeof(err)));
	CHECK(!hybd_config_set(&c, "progress", "quiet", err, sizeof(err)));
	CHECK(!hybd_config_set(&c, "stats_interval", "0", err, sizeof(err)));
	CHECK(!hybd_config_set(&c, "dram_budget", "160K", err, sizeof(err)));
	CHECK(!hybd_config_set(&c, "page_pool", "8K", err, sizeof(err)));
	CHECK_MSG(!hybd_start(&c, NULL, NULL, &d, err, sizeof(err)), "hybd: %s", err);
	CHECK(!hyb_model_load_manifest("bp"));
	CHECK_MSG(strstr(hyb_last_error(), "not resident") && strstr(hyb_last_error(), "ffn_"),
		  "%s", hyb_last_error());
	hybd_stop(d, "test");
}

/* A mixture of experts and latent attention from hybd's pools: the file's ids. */
TEST(box_moe_model_generates_the_file_ids)
{
	static const int32_t prompt[] = { 1, 17, 200, 3, 99, 42 };
	char model[512], cmd[1024];
	struct hyb_model *f, *b;
	struct hybd *d;
	struct ids want, got;

	if (access("build/hybctl", X_OK))
		SKIP("build/hybctl not built (run from the repository root after make)");
	snprintf(model, sizeof(model), "%s/moe.gguf", hyb_test_tmpdir());
	snprintf(cmd, sizeof(cmd), "build/hybctl synth -o %s --arch deepseek2 --experts 8 "
		 "--experts-used 2 --expert-ffn 64 --head-dim 96 --q-lora 64 --hidden 128 --heads 2 "
		 "--layers 3 --vocab 300 -t 2 >/dev/null", model);
	CHECK(system(cmd) == 0);
	start_hybd(model, "bm", "layer", "2", &d);
	f = hyb_model_load(model);
	CHECK_MSG(f, "%s", hyb_last_error());
	b = hyb_model_load_manifest("bm.manifest");
	CHECK_MSG(b, "%s", hyb_last_error());
	CHECK(b->hp.n_expert == 8 && b->hp.kv_lora == 192 && b->layers[1].gate_exps.ne2 == 8);
	want = generate(f, prompt, 6);
	got = generate(b, prompt, 6);
	CHECK_EQ_INT(want.n, N_GEN);
	check_same_ids(&want, &got, "deepseek2 MoE from pools");
	check_read_only(b, "blk.1.ffn_gate_exps.weight", b->layers[1].gate_exps.data);
	hyb_model_free(b);
	hyb_model_free(f);
	hybd_stop(d, "test");
}

/*
 * Experts split by rows across nodes (split_experts, docs/NUMA.md): this
 * machine has one node, so node 0 is listed twice - two parts in node 0's
 * pools, laid out, published, read and bound as on two nodes. The app's
 * ids are the file's; every expert tensor has two parts; one node is refused.
 */
TEST(box_split_experts_generate_the_file_ids)
{
	static const int32_t prompt[] = { 1, 17, 200, 3, 99, 42 };
	char model[512], cmd[1024], err[512];
	struct hyb_model *f, *b;
	struct hybd_config c;
	struct hybd *d;
	struct ids want, got;
	const struct hyb_manifest *mf;
	struct hyb_manifest_info mi;
	unsigned int n_split = 0;

	if (access("build/hybctl", X_OK))
		SKIP("build/hybctl not built (run from the repository root after make)");
	snprintf(model, sizeof(model), "%s/moe.gguf", hyb_test_tmpdir());
	/* merged gate/up experts: gate's rows on one part, up's on the other */
	snprintf(cmd, sizeof(cmd), "build/hybctl synth -o %s --arch qwen3moe --experts 8 "
		 "--experts-used 2 --expert-ffn 224 --hidden 128 --heads 4 --layers 3 --vocab 300 "
		 "--gate-up-exps --type Q4_0 -t 2 >/dev/null", model);
	CHECK(system(cmd) == 0);
	setenv("HYB_BACKEND", "local", 1);
	hybd_config_defaults(&c);
	CHECK(!hybd_config_set(&c, "model", model, err, sizeof(err)));
	CHECK(!hybd_config_set(&c, "backend", "local", err, sizeof(err)));
	CHECK(!hybd_config_set(&c, "name", "bs", err, sizeof(err)));
	CHECK(!hybd_config_set(&c, "state_dir", hyb_test_tmpdir(), err, sizeof(err)));
	CHECK(!hybd_config_set(&c, "progress", "quiet", err, sizeof(err)));
	CHECK(!hybd_config_set(&c, "stats_interval", "0", err, sizeof(err)));
	CHECK(!hybd_config_set(&c, "device", "none", err, sizeof(err)));
	CHECK(!hybd_config_set(&c, "split_experts", "yes", err, sizeof(err)));
	CHECK(hybd_config_set(&c, "split_experts", "maybe", err, sizeof(err)));
	CHECK_MSG(strstr(err, "split_experts"), "%s", err);
	CHECK(!hybd_config_set(&c, "nodes", "0", err, sizeof(err)));
	CHECK(hybd_start(&c, NULL, NULL, &d, err, sizeof(err)));
	CHECK_MSG(strstr(err, "split_experts needs 2 to 8 nodes"), "%s", err);
	c.place.nodes[1] = 0; /* (the parser refuses a node twice) */
	c.place.n_nodes = 2;
	CHECK_MSG(!hybd_start(&c, NULL, NULL, &d, err, sizeof(err)), "hybd: %s", err);
	f = hyb_model_load(model);
	CHECK_MSG(f, "%s", hyb_last_error());
	b = hyb_model_load_manifest("bs.manifest");
	CHECK_MSG(b, "%s", hyb_last_error());
	mf = hyb_model_manifest(b);
	hyb_manifest_info(mf, &mi);
	CHECK_MSG(strstr(mi.placement, "split_experts"), "%s", mi.placement);
	for (uint32_t i = 0; i < mi.n_tensors; i++) {
		const struct hyb_manifest_tensor *t = hyb_manifest_tensor(mf, i);

		if (!strstr(t->name, "_exps"))
			continue;
		CHECK_MSG(t->pool == HYB_MF_SPLIT && t->n_parts == 2 && t->parts[0].row0 == 0 &&
			  t->parts[1].row0 % 16 == 0 && t->parts[1].row0 + t->parts[1].rows ==
			  t->ne[1], "%s: %u parts", t->name, t->n_parts);
		n_split++;
	}
	CHECK_EQ_INT(n_split, 6);
	CHECK_EQ_INT(mi.n_parts, 12);
	CHECK(b->layers[1].down_exps.split && b->layers[1].down_exps.split->n == 2);
	/* the slices of the merged tensor: each wholly in one part */
	CHECK(b->layers[1].gate_exps.split && b->layers[1].gate_exps.split->n == 1 &&
	      b->layers[1].up_exps.split && b->layers[1].up_exps.split->n == 1 &&
	      b->layers[1].up_exps.split->data[0] != b->layers[1].gate_exps.split->data[0]);
	want = generate(f, prompt, 6);
	got = generate(b, prompt, 6);
	CHECK_EQ_INT(want.n, N_GEN);
	check_same_ids(&want, &got, "experts split by rows from pools");
	/* hybctl manifest shows the parts, as text and JSON */
	{
		char out[16384];
		FILE *p;
		size_t n;

		snprintf(cmd, sizeof(cmd), "build/hybctl manifest %s --tensors 2>&1; "
			 "build/hybctl manifest %s --json 2>&1", hybd_manifest_path(d),
			 hybd_manifest_path(d));
		p = popen(cmd, "r");
		CHECK(p);
		n = fread(out, 1, sizeof(out) - 1, p);
		out[n] = 0;
		pclose(p);
		CHECK_MSG(strstr(out, "(split by rows)") && strstr(out, "rows 0-223") &&
			  strstr(out, "rows 224-447") && strstr(out, "in its rows of 6 split") &&
			  strstr(out, "\"parts\": [{\"row0\": 0, \"rows\": 224, \"node\": 0"),
			  "%s", out);
	}
	hyb_model_free(b);
	hyb_model_free(f);
	hybd_stop(d, "test");
}
