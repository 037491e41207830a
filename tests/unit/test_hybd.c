// SPDX-License-Identifier: MIT
/*
 * hybd (daemon/server.c, config.c, log.c, load.c, hybd.c) end to end on the
 * local backend: configuration errors name file and line; log lines are one
 * event each and parse back; a model generated here is loaded into pools and
 * every tensor (and plan bundle) the manifest names holds exactly the file's
 * bytes; reload requests are served; SIGTERM retires the manifest, fails
 * waiters with -ESHUTDOWN and destroys the pools; failures at start leave no
 * pool and no manifest. The real program (build/hybd) is run in the
 * foreground and as a daemon when it has been built; the kmod backend only
 * where /dev/hybpool exists (the VM bench covers the module).
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "daemon/config.h"
#include "daemon/copydev_cuda.h"
#include "daemon/load.h"
#include "daemon/manifest_write.h"
#include "daemon/server.h"
#include "hyb/gguf.h"
#include "hyb/manifest.h"
#include "hyb/plan.h"
#include "hyb/tensor_type.h"
#include "test.h"

#define E 64		/* n_embd */
#define V 128		/* vocabulary */

/* -- a model of our own -------------------------------------------------- */

static uint8_t *rand_bytes(size_t n, uint32_t seed)
{
	uint8_t *b = malloc(n);

	CHECK(b);
	for (size_t i = 0; i < n; i++) {
		seed ^= seed << 13, seed ^= seed >> 17, seed ^= seed << 5;
		b[i] = (uint8_t)seed;
	}
	return b;
}

/*
 * A llama-shaped GGUF with random bytes: n_layers layers of FFN n_ff (F16),
 * or with plan = group size, a plan file (F32 bundles of n_ff neurons).
 */
static const char *write_model(const char *name, uint32_t n_layers, uint32_t n_ff, uint32_t plan)
{
	static char paths[4][512];
	static int k;
	char *path = paths[k++ % 4];
	struct hyb_gguf_writer *w = hyb_gguf_writer_new();
	uint8_t *data = rand_bytes(64 << 20, 7 + n_ff);
	size_t used = 0;
	char tn[64];

#define T(nm, type, nd, a, b)                                                          \
	do {                                                                           \
		uint64_t ne_[2] = { a, b };                                            \
		uint64_t sz_ = hyb_row_bytes(type, a) * (nd == 2 ? b : 1);             \
		CHECK(used + sz_ <= (64u << 20));                                      \
		CHECK(!hyb_gguf_writer_add_tensor(w, nm, type, nd, ne_, data + used));     \
		used += sz_;                                                           \
	} while (0)
	CHECK(w);
	hyb_gguf_set_str(w, "general.architecture", "llama");
	hyb_gguf_set_u32(w, "llama.block_count", n_layers);
	hyb_gguf_set_u32(w, "llama.embedding_length", E);
	hyb_gguf_set_u32(w, "llama.feed_forward_length", n_ff);
	hyb_gguf_set_u32(w, "llama.attention.head_count", 4);
	if (plan) {
		hyb_gguf_set_u32(w, HYB_PLAN_KEY_VERSION, HYB_PLAN_VERSION);
		hyb_gguf_set_u32(w, HYB_PLAN_KEY_GROUP_SIZE, plan);
	}
	T("token_embd.weight", HYB_TYPE_F32, 2, E, V);
	for (uint32_t l = 0; l < n_layers; l++) {
#define N(s) (snprintf(tn, sizeof(tn), "blk.%u." s, l), tn)
		T(N("attn_norm.weight"), HYB_TYPE_F32, 1, E, 1);
		T(N("attn_q.weight"), HYB_TYPE_F16, 2, E, E);
		T(N("attn_k.weight"), HYB_TYPE_F16, 2, E, E);
		T(N("ffn_norm.weight"), HYB_TYPE_F32, 1, E, 1);
		if (plan) {
			T(N("ffn_bundles"), HYB_TYPE_F32, 2, E, 3 * n_ff);
		} else {
			T(N("ffn_gate.weight"), HYB_TYPE_F16, 2, E, n_ff);
			T(N("ffn_up.weight"), HYB_TYPE_F16, 2, E, n_ff);
			T(N("ffn_down.weight"), HYB_TYPE_F16, 2, n_ff, E);
		}
#undef N
	}
	T("output_norm.weight", HYB_TYPE_F32, 1, E, 1);
	T("output.weight", HYB_TYPE_F16, 2, E, V);
#undef T
	snprintf(path, 512, "%s/%s", hyb_test_tmpdir(), name);
	CHECK_MSG(!hyb_gguf_writer_write_file(w, path), "%s", hyb_last_error());
	hyb_gguf_writer_free(w);
	free(data);
	return path;
}

/*
 * Expert tensors for split_experts: per layer a router and gate/up/down
 * experts [E, 100, 8], [100, E, 8] (F16) and a 3-D "_exps" tensor of 8 rows,
 * too few to split; random bytes, not a model anyone runs.
 */
static const char *write_moe_model(const char *name, uint32_t n_layers)
{
	static char path[512];
	struct hyb_gguf_writer *w = hyb_gguf_writer_new();
	uint8_t *data = rand_bytes(8 << 20, 11);
	size_t used = 0;
	char tn[64];

#define T3(nm, type, nd, a, b, c)                                                      \
	do {                                                                           \
		uint64_t ne_[3] = { a, b, c };                                         \
		uint64_t sz_ = hyb_row_bytes(type, a) * (b) * (c);                     \
		CHECK(used + sz_ <= (8u << 20));                                       \
		CHECK(!hyb_gguf_writer_add_tensor(w, nm, type, nd, ne_, data + used)); \
		used += sz_;                                                           \
	} while (0)
	CHECK(w);
	hyb_gguf_set_str(w, "general.architecture", "qwen3moe");
	hyb_gguf_set_u32(w, "qwen3moe.block_count", n_layers);
	T3("token_embd.weight", HYB_TYPE_F32, 2, E, V, 1);
	for (uint32_t l = 0; l < n_layers; l++) {
#define N(s) (snprintf(tn, sizeof(tn), "blk.%u." s, l), tn)
		T3(N("attn_norm.weight"), HYB_TYPE_F32, 1, E, 1, 1);
		T3(N("ffn_gate_inp.weight"), HYB_TYPE_F32, 2, E, 8, 1);
		T3(N("ffn_gate_exps.weight"), HYB_TYPE_F16, 3, E, 100, 8);
		T3(N("ffn_up_exps.weight"), HYB_TYPE_F16, 3, E, 100, 8);
		T3(N("ffn_down_exps.weight"), HYB_TYPE_F16, 3, 100, E, 8);
		T3(N("ffn_tiny_exps.weight"), HYB_TYPE_F32, 3, 4, 8, 8);
#undef N
	}
	T3("output.weight", HYB_TYPE_F16, 2, E, V, 1);
#undef T3
	snprintf(path, sizeof(path), "%s/%s", hyb_test_tmpdir(), name);
	CHECK_MSG(!hyb_gguf_writer_write_file(w, path), "%s", hyb_last_error());
	hyb_gguf_writer_free(w);
	free(data);
	return path;
}

static uint8_t *read_file(const char *path, size_t *len)
{
	struct stat sb;
	uint8_t *b;
	int fd = open(path, O_RDONLY);

	CHECK(fd >= 0 && !fstat(fd, &sb));
	b = malloc((size_t)sb.st_size);
	CHECK(b && read(fd, b, (size_t)sb.st_size) == sb.st_size);
	close(fd);
	*len = (size_t)sb.st_size;
	return b;
}

/* Every resident tensor and bundle the manifest names holds the file's bytes (read-only maps). */
static void check_against_file(struct hyb_backend *app, const struct hyb_manifest *m,
			       const char *model)
{
	struct hyb_manifest_info mi;
	struct hyb_mempool *pools[16] = { 0 };
	uint8_t *base[16] = { 0 }, *file;
	size_t flen, plen;

	hyb_manifest_info(m, &mi);
	CHECK(mi.n_pools <= 16);
	file = read_file(model, &flen);
	CHECK_EQ_INT(mi.model_size, flen);
	CHECK(!memcmp(mi.meta, file, mi.meta_len));
	for (uint32_t i = 0; i < mi.n_pools; i++) {
		const struct hyb_mf_pool *p = hyb_manifest_pool(m, i);

		CHECK_MSG(!hyb_mempool_open_id(app, p->id, &pools[i]), "pool %s: %s", p->name,
			  hyb_last_error());
		CHECK(!hyb_mempool_map(pools[i], (void **)&base[i], &plen));
		CHECK_EQ_INT(hyb_mempool_writable(pools[i]), 0);
	}
	for (uint32_t i = 0; i < mi.n_tensors; i++) {
		const struct hyb_manifest_tensor *t = hyb_manifest_tensor(m, i);

		CHECK(t->file_off + t->bytes <= flen);
		if (t->pool == HYB_MF_NO_POOL)
			continue;
		if (t->pool == HYB_MF_SPLIT) {
			/* each part: its rows of every expert (docs/NUMA.md) */
			const uint64_t rb = t->bytes / (t->ne[1] * t->ne[2]);

			for (uint32_t k = 0; k < t->n_parts; k++) {
				const struct hyb_mf_part *q = &t->parts[k];

				for (uint64_t e = 0; e < t->ne[2]; e++)
					CHECK_MSG(!memcmp(base[q->pool] + q->pool_off + e * q->stride,
							  file + t->file_off +
							  (e * t->ne[1] + q->row0) * rb, q->rows * rb),
						  "tensor %s: expert %llu, rows %llu+ differ from the "
						  "file", t->name, (unsigned long long)e,
						  (unsigned long long)q->row0);
			}
			continue;
		}
		CHECK_MSG(!memcmp(base[t->pool] + t->pool_off, file + t->file_off, t->bytes),
			  "tensor %s: pool bytes differ from the file", t->name);
	}
	for (uint32_t i = 0; i < mi.n_bundles; i++) {
		const struct hyb_mf_bundle *b = hyb_manifest_bundle_at(m, i);

		if (b->pool != HYB_MF_NO_POOL)
			CHECK_MSG(!memcmp(base[b->pool] + b->pool_off, file + b->file_off,
					  b->bytes), "bundle %u.%u differs", b->layer, b->group);
	}
	for (uint32_t i = 0; i < mi.n_pools; i++)
		hyb_mempool_close(pools[i]);
	free(file);
}

static void base_config(struct hybd_config *c, const char *model, const char *name)
{
	char err[256];

	hybd_config_defaults(c);
	CHECK(!hybd_config_set(c, "model", model, err, sizeof(err)));
	CHECK(!hybd_config_set(c, "backend", "local", err, sizeof(err)));
	CHECK(!hybd_config_set(c, "name", name, err, sizeof(err)));
	CHECK(!hybd_config_set(c, "state_dir", hyb_test_tmpdir(), err, sizeof(err)));
	CHECK(!hybd_config_set(c, "progress", "lines", err, sizeof(err)));
	CHECK(!hybd_config_set(c, "stats_interval", "0", err, sizeof(err)));
	CHECK(!hybd_config_set(c, "gpu_slots", "4", err, sizeof(err)));
	CHECK(!hybd_config_set(c, "slot_bytes", "64K", err, sizeof(err)));
}

static char *slurp(const char *path)
{
	size_t len;
	uint8_t *b = read_file(path, &len);
	char *s = realloc(b, len + 1);

	CHECK(s);
	s[len] = 0;
	return s;
}

static void open_log(const char *name, enum hlog_format f, char *path, size_t len)
{
	char err[256];

	snprintf(path, len, "%s/%s", hyb_test_tmpdir(), name);
	CHECK_MSG(!hlog_open(path, f, HLOG_DEBUG, err, sizeof(err)), "%s", err);
}

/* -- configuration and logs ---------------------------------------------- */

static const char *write_text(const char *name, const char *text)
{
	static char path[512];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", hyb_test_tmpdir(), name);
	f = fopen(path, "w");
	CHECK(f);
	fputs(text, f);
	fclose(f);
	return path;
}

TEST(hybd_config_file_and_errors)
{
	struct hybd_config c;
	char err[512];
	const char *p;

	hybd_config_defaults(&c);
	p = write_text("good.conf", "# hybd\n\nmodel = /m/x.gguf\n  backend=local  \n"
			"placement = explicit\nplace = blk.0.:0, *:1\nplace = output:0\n"
			"dram_budget = 2G\nchunk = 256K\nlog_format = json\nname = \"a b\"\n");
	CHECK(hybd_config_load(&c, p, err, sizeof(err)) < 0);
	CHECK_MSG(strstr(err, "good.conf:11:") && strstr(err, "name"), "%s", err);
	hybd_config_defaults(&c);
	p = write_text("good.conf", "# hybd\n\nmodel = /m/x.gguf\n  backend=local  \n"
			"placement = explicit\nplace = blk.0.:0, *:1\nplace = output:0\n"
			"dram_budget = 2G\nchunk = 256K\nlog_format = json\nnodes = 0-1\n"
			"log_file = \" /tmp/with space.log\"\n");
	CHECK_MSG(!hybd_config_load(&c, p, err, sizeof(err)), "%s", err);
	CHECK(!strcmp(c.model, "/m/x.gguf"));
	CHECK_EQ_INT(c.backend, HYB_BACKEND_LOCAL);
	CHECK_EQ_INT(c.place.n_rules, 3);
	CHECK_EQ_INT(c.place.rules[2].node, 0);
	CHECK_EQ_INT(c.place.dram_budget, 2ull << 30);
	CHECK_EQ_INT(c.chunk, 256 << 10);
	CHECK_EQ_INT(c.log_format, HLOG_JSON);
	CHECK_EQ_INT(c.place.n_nodes, 2);
	CHECK(!c.nodes_all);
	CHECK(!strcmp(c.log_file, " /tmp/with space.log"));
	CHECK(!hybd_config_check(&c, err, sizeof(err)));
	/* flags after the file win */
	CHECK(!hybd_config_set(&c, "chunk", "1M", err, sizeof(err)));
	CHECK_EQ_INT(c.chunk, 1 << 20);
	/* who may ask: any (the default), or effective uids and gids */
	CHECK_EQ_INT(c.clients.n, 0);
	CHECK_MSG(!hybd_config_set(&c, "clients", "uid:0,gid:990,uid:1000", err, sizeof(err)),
		  "%s", err);
	CHECK_EQ_INT(c.clients.n, 3);
	CHECK(!c.clients.ids[0].gid && c.clients.ids[0].id == 0);
	CHECK(c.clients.ids[1].gid && c.clients.ids[1].id == 990);
	CHECK(!c.clients.ids[2].gid && c.clients.ids[2].id == 1000);
	{
		struct hyb_rq_sender s = { .uid = 1001, .gid = 990, .pid = 7 };

		CHECK(hyb_reload_client_ok(&c.clients, &s));	/* by its group */
		s.gid = 1001;
		CHECK(!hyb_reload_client_ok(&c.clients, &s));
		s.uid = 1000;
		CHECK(hyb_reload_client_ok(&c.clients, &s));	/* by its uid */
	}
	CHECK(!hybd_config_set(&c, "clients", "any", err, sizeof(err)));
	CHECK_EQ_INT(c.clients.n, 0);

	/* each bad line: file:line and the reason */
	{
		static const struct {
			const char *text, *want;
		} bad[] = {
			{ "model = a\nthis is not a pair\n", "bad.conf:2: expected 'key = value'" },
			{ "\n\nfoo = 1\n", "bad.conf:3: unknown key 'foo'" },
			{ "queue = 16\n", "bad.conf:1: queue: '16' is not a number in 0..15" },
			{ "chunk = 1000\n", "multiple of 4096" },
			{ "dram_budget = 12Q\n", "dram_budget: '12Q'" },
			{ "= 5\n", "bad.conf:1: no key" },
			{ "backend = gpu\n", "backend: 'gpu'" },
			{ "device = gpu\n", "device: 'gpu' is not auto, cuda, cpu or none" },
			{ "cuda_device = -1\n", "cuda_device: '-1'" },
			{ "placement = random\n", "placement: 'random'" },
			{ "nodes = 0,x\n", "nodes: 'x' is not a node" },
			{ "log_level = loud\n", "log_level" },
			{ "name = way-too-long-instance-name\n", "name:" },
			{ "queue_depth = 0\n", "queue_depth" },
			{ "clients = root\n", "clients: 'root'" },
			{ "clients = uid:5,\n", "clients: empty" },
			{ "clients = uid:5,gid:x\n", "bad id after gid:" },
			{ "clients = uid:4294967295\n", "bad id after uid:" },
		};

		for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
			hybd_config_defaults(&c);
			p = write_text("bad.conf", bad[i].text);
			CHECK_MSG(hybd_config_load(&c, p, err, sizeof(err)) < 0, "accepted: %s",
				  bad[i].text);
			CHECK_MSG(strstr(err, bad[i].want), "'%s' -> '%s'", bad[i].text, err);
		}
	}
	/* a binary file: NUL bytes, one clear line */
	{
		char path[512];
		FILE *f;

		snprintf(path, sizeof(path), "%s/bin.conf", hyb_test_tmpdir());
		f = fopen(path, "w");
		fwrite("model = a\0b\n", 1, 12, f);
		fclose(f);
		CHECK(hybd_config_load(&c, path, err, sizeof(err)) < 0);
		CHECK_MSG(strstr(err, "bin.conf:1: NUL"), "%s", err);
	}
	CHECK(hybd_config_load(&c, "/nonexistent/h.conf", err, sizeof(err)) < 0);
	CHECK_MSG(strstr(err, "/nonexistent/h.conf: cannot open"), "%s", err);
	hybd_config_defaults(&c);
	CHECK(hybd_config_check(&c, err, sizeof(err)) < 0);
	CHECK_MSG(strstr(err, "no model"), "%s", err);
	CHECK(!hybd_config_set(&c, "model", "x", err, sizeof(err)));
	CHECK(!hybd_config_set(&c, "place", "blk.:0", err, sizeof(err)));
	CHECK(hybd_config_check(&c, err, sizeof(err)) < 0);
	CHECK_MSG(strstr(err, "explicit"), "%s", err);
}

/* split_experts: the key, its dump, and the refusals a config check can make early */
TEST(hybd_config_split_experts)
{
	struct hybd_config c;
	char err[512], *s;
	FILE *f;

	hybd_config_defaults(&c);
	CHECK(!c.place.split_experts);
	CHECK(!hybd_config_set(&c, "model", "x", err, sizeof(err)));
	for (int i = 0; i < 2; i++) {
		CHECK(!hybd_config_set(&c, "split_experts", i ? "true" : "yes", err, sizeof(err)));
		CHECK(c.place.split_experts);
		CHECK(!hybd_config_set(&c, "split_experts", i ? "0" : "no", err, sizeof(err)));
		CHECK(!c.place.split_experts);
	}
	CHECK(hybd_config_set(&c, "split_experts", "maybe", err, sizeof(err)) < 0);
	CHECK_MSG(strstr(err, "split_experts: 'maybe'"), "%s", err);
	CHECK(!hybd_config_set(&c, "split_experts", "1", err, sizeof(err)));
	/* nodes = all: counted once resolved (hyb_numa_place) */
	CHECK_MSG(!hybd_config_check(&c, err, sizeof(err)), "%s", err);
	f = tmpfile();
	CHECK(f);
	hybd_config_print(&c, f);
	rewind(f);
	s = calloc(1, 8192);
	CHECK(s && fread(s, 1, 8191, f) > 0);
	fclose(f);
	CHECK_MSG(strstr(s, "\nsplit_experts = yes\n"), "%s", s);
	free(s);
	CHECK(!hybd_config_set(&c, "nodes", "1", err, sizeof(err)));
	CHECK(hybd_config_check(&c, err, sizeof(err)) < 0);
	CHECK_MSG(strstr(err, "split_experts needs 2 to 8 nodes; nodes = 1 lists 1"), "%s", err);
	CHECK(!hybd_config_set(&c, "nodes", "0-8", err, sizeof(err)));
	CHECK(hybd_config_check(&c, err, sizeof(err)) < 0);
	CHECK_MSG(strstr(err, "lists 9"), "%s", err);
	CHECK(!hybd_config_set(&c, "nodes", "0,1", err, sizeof(err)));
	CHECK_MSG(!hybd_config_check(&c, err, sizeof(err)), "%s", err);
	CHECK(!hybd_config_set(&c, "dram_budget", "1G", err, sizeof(err)));
	CHECK(hybd_config_check(&c, err, sizeof(err)) < 0);
	CHECK_MSG(strstr(err, "split_experts") && strstr(err, "dram_budget"), "%s", err);
	CHECK(!hybd_config_set(&c, "dram_budget", "0", err, sizeof(err)));
	CHECK(!hybd_config_set(&c, "placement", "explicit", err, sizeof(err)));
	CHECK(!hybd_config_set(&c, "place", "*:0", err, sizeof(err)));
	CHECK(hybd_config_check(&c, err, sizeof(err)) < 0);
	CHECK_MSG(strstr(err, "split_experts") && strstr(err, "explicit"), "%s", err);
}

TEST(hybd_log_lines_kv_and_json)
{
	char path[512], big[6000];
	struct hlog l;
	char *s, *line2;

	open_log("kv.log", HLOG_KV, path, sizeof(path));
	hlog_begin(&l, HLOG_INFO, "load_done");
	hlog_str(&l, "model", "/a b/c\"d.gguf");
	hlog_u64(&l, "bytes", 123);
	hlog_i64(&l, "status", -5);
	hlog_f64(&l, "gbps", 1.5);
	hlog_str(&l, "empty", "");
	hlog_end(&l);
	hlog_msg(HLOG_DEBUG, "dbg", "x=%d", 1);
	hlog_close();
	hlog_msg(HLOG_ERROR, "after_close", "not written");
	s = slurp(path);
	CHECK_MSG(!strncmp(s, "ts=20", 5) && strstr(s, "Z level=info event=load_done "
		  "model=\"/a b/c\\\"d.gguf\" bytes=123 status=-5 gbps=1.5 empty=\"\"\n"), "%s", s);
	line2 = strchr(s, '\n') + 1;
	CHECK_MSG(strstr(line2, "level=debug event=dbg msg=\"x=1\"\n"), "%s", line2);
	CHECK(!strstr(s, "after_close"));
	free(s);

	open_log("j.log", HLOG_JSON, path, sizeof(path));
	memset(big, 'x', sizeof(big) - 1);
	big[sizeof(big) - 1] = 0;
	hlog_begin(&l, HLOG_WARN, "reload_error");
	hlog_str(&l, "msg", "tab\there \"q\" \\ \n");
	hlog_f64(&l, "nan", 0.0 / 0.0);
	hlog_str(&l, "huge", big);	/* does not fit: dropped, the line stays valid */
	hlog_end(&l);
	hlog_close();
	s = slurp(path);
	CHECK_MSG(!strncmp(s, "{\"ts\":\"20", 9) && strstr(s, "\"level\":\"warn\",\"event\":"
		  "\"reload_error\",\"msg\":\"tab\\there \\\"q\\\" \\\\ \\n\",\"nan\":null,"
		  "\"trunc\":1}\n"), "%s", s);
	free(s);
	/* a log file that cannot be opened */
	CHECK(hlog_open("/nonexistent/dir/x.log", HLOG_KV, HLOG_INFO, path, sizeof(path)) < 0);
	CHECK_MSG(strstr(path, "/nonexistent/dir/x.log"), "%s", path);
}

/* -- the daemon in this process ------------------------------------------ */

static struct hyb_rq_req req(uint16_t op, uint8_t prio, uint32_t pool, uint64_t off, uint64_t len,
			     uint64_t aux, uint64_t tag)
{
	return (struct hyb_rq_req){ .op = op, .prio = prio, .pool_id = pool, .pool_off = off,
				    .len = len, .aux = aux, .tag = tag };
}

TEST(hybd_serves_then_shuts_down_on_sigterm)
{
	const char *model = write_model("m.gguf", 4, 256, 0);
	struct hybd_config cfg;
	struct hyb_backend *app;
	struct hyb_manifest *mp, *mf;
	const struct hyb_manifest_tensor *t;
	struct hyb_rq_cqe cqe[8];
	struct hyb_rq_req q[8];
	struct hyb_rq *c;
	struct hybd *d;
	char err[512], logp[512], *log;
	sigset_t mask;
	int sfd, n = 0, shut = 0;

	/* as hybd.c does: blocked everywhere, read from a signalfd */
	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	CHECK(!sigprocmask(SIG_BLOCK, &mask, NULL));
	sfd = signalfd(-1, &mask, SFD_CLOEXEC);
	CHECK(sfd >= 0);
	open_log("hybd.log", HLOG_KV, logp, sizeof(logp));
	base_config(&cfg, model, "t");
	CHECK(!hybd_config_set(&cfg, "copy_bandwidth", "1M", err, sizeof(err)));
	CHECK(!hybd_config_set(&cfg, "chunk", "16K", err, sizeof(err)));
	CHECK_MSG(!hybd_start(&cfg, NULL, NULL, &d, err, sizeof(err)), "%s", err);

	/* an app: finds the model through the manifest, file or pool */
	app = hyb_backend_open(HYB_BACKEND_LOCAL);
	CHECK(app);
	mf = hyb_manifest_open(hybd_manifest_path(d));
	CHECK_MSG(mf, "%s", hyb_last_error());
	mp = hyb_manifest_open_pool(app, "t.manifest");
	CHECK_MSG(mp, "%s", hyb_last_error());
	check_against_file(app, mf, model);
	check_against_file(app, mp, model);
	t = hyb_manifest_find(mp, "blk.2.ffn_up.weight");
	CHECK(t && t->pool != HYB_MF_NO_POOL && t->ne[0] == E && t->ne[1] == 256);
	CHECK_EQ_INT(t->type, HYB_TYPE_F16);

	/*
	 * reload requests: a LOAD of a tensor onto itself, an upload of another
	 * one (requests in different lanes are not ordered: never the same range),
	 * an error
	 */
	CHECK_MSG(!hyb_rq_attach_client(app, 0, HYB_RQ_EVENTFD_NONE, &c), "%s",
		  hyb_last_error());
	q[n++] = req(HYB_RQ_LOAD, HYB_RQ_CRITICAL, t->pool_id, t->pool_off, t->bytes, t->file_off,
		     0);
	{
		const struct hyb_manifest_tensor *u = hyb_manifest_find(mp, "output.weight");

		CHECK(u && u->bytes >= 16384);
		q[n++] = req(HYB_RQ_UPLOAD, HYB_RQ_HIGH, u->pool_id, u->pool_off, 16384, 1, 1);
	}
	q[n++] = req(HYB_RQ_LOAD, HYB_RQ_LOW, t->pool_id, t->pool_off, t->bytes, 1ull << 40, 2);
	CHECK(!hyb_rq_submit(c, q, (unsigned int)n));
	for (int got = 0; got < n;) {
		int r = hyb_rq_reap(c, cqe + got, 8, 1, 10000000000ull);

		CHECK(r > 0);
		got += r;
	}
	for (int i = 0; i < n; i++)
		CHECK_EQ_INT(cqe[i].status, cqe[i].tag == 2 ? -ERANGE : 0);
	check_against_file(app, mp, model);

	/* queued work when the signal comes: 8 uploads of 64 KiB at 1 MiB/s */
	for (int i = 0; i < 8; i++)
		q[i] = req(HYB_RQ_UPLOAD, HYB_RQ_NORMAL, t->pool_id, t->pool_off, 65536,
			   (uint64_t)i % 4, 10 + (uint64_t)i);
	CHECK(!hyb_rq_submit(c, q, 8));
	usleep(20000);
	CHECK(!kill(getpid(), SIGTERM));
	CHECK_EQ_INT(hybd_serve(d, sfd), SIGTERM);
	hybd_stop(d, "SIGTERM");
	for (int got = 0; got < 8;) {
		int r = hyb_rq_reap(c, cqe, 8, 1, 10000000000ull);

		CHECK_MSG(r > 0, "reap: %d", r);
		for (int i = 0; i < r; i++) {
			CHECK(cqe[i].status == 0 || cqe[i].status == -ESHUTDOWN);
			shut += cqe[i].status == -ESHUTDOWN;
		}
		got += r;
	}
	CHECK_MSG(shut >= 4, "only %d of 8 requests were failed by the shutdown", shut);
	q[0] = req(HYB_RQ_NOP, HYB_RQ_CRITICAL, 0, 0, 0, 0, 99);	/* (its pool is gone too) */
	CHECK_EQ_INT(hyb_rq_submit(c, q, 1), -EPIPE);
	/* the manifest is gone from both places before the pools went */
	CHECK_EQ_INT(hyb_manifest_live(mp), 0);
	CHECK(!hyb_manifest_open_pool(app, "t.manifest"));
	{
		char mpath[600];
		uint32_t ids[8];

		snprintf(mpath, sizeof(mpath), "%s/t.manifest", hyb_test_tmpdir());
		CHECK(access(mpath, F_OK) && errno == ENOENT);
		CHECK_EQ_INT(hyb_mempool_list(app, ids, 8), 0);
	}
	hlog_close();
	log = slurp(logp);
	{
		static const char *const events[] = {
			"event=start ", "event=backend kind=local", "event=load_done ",
			"event=pool name=t.n0 ", "event=device name=cpu", "event=reload_ready ",
			"event=ready manifest=", "event=reload_error ", "status=-34",
			"event=shutdown msg=SIGTERM", "event=manifest_retired ",
			"event=reload_stopped ", "event=stopped ",
		};
		const char *at = log;

		for (size_t i = 0; i < sizeof(events) / sizeof(events[0]); i++) {
			const char *p = strstr(at, events[i]);

			CHECK_MSG(p, "no '%s' (in order) in the log:\n%s", events[i], log);
			at = p;
		}
	}
	free(log);
	hyb_manifest_close(mp);
	hyb_manifest_close(mf);
	hyb_rq_close(c);
	hyb_backend_close(app);
	close(sfd);
}

TEST(hybd_plan_bundles_and_interleaved_pools)
{
	const char *model = write_model("plan.gguf", 3, 40, 16);	/* groups 16, 16, 8 */
	struct hyb_manifest_info mi;
	struct hybd_config cfg;
	struct hyb_backend *app;
	struct hyb_manifest *m;
	struct hybd *d;
	char err[512];

	base_config(&cfg, model, "p");
	CHECK(!hybd_config_set(&cfg, "pools_per_node", "3", err, sizeof(err)));
	CHECK(!hybd_config_set(&cfg, "placement", "interleave", err, sizeof(err)));
	CHECK_MSG(!hybd_start(&cfg, NULL, NULL, &d, err, sizeof(err)), "%s", err);
	app = hyb_backend_open(HYB_BACKEND_LOCAL);
	m = hyb_manifest_open_pool(app, "p.manifest");
	CHECK_MSG(m, "%s", hyb_last_error());
	hyb_manifest_info(m, &mi);
	CHECK(mi.flags & HYB_MF_F_PLAN);
	CHECK_EQ_INT(mi.group_size, 16);
	CHECK_EQ_INT(mi.n_bundles, 3 * 3);
	CHECK_EQ_INT(mi.n_pools, 3);
	CHECK(!strcmp(hyb_manifest_pool(m, 1)->name, "p.n0.1"));
	for (uint32_t l = 0; l < 3; l++) {
		const struct hyb_manifest_tensor *t;
		char nm[48];

		snprintf(nm, sizeof(nm), "blk.%u.ffn_bundles", l);
		t = hyb_manifest_find(m, nm);
		CHECK(t);
		for (uint32_t g = 0; g < 3; g++) {
			const struct hyb_mf_bundle *b = hyb_manifest_bundle(m, l, g);
			uint64_t row = E * 4;

			CHECK(b);
			CHECK_EQ_INT(b->n_neurons, g == 2 ? 8 : 16);
			CHECK_EQ_INT(b->bytes, 3 * b->n_neurons * row);
			CHECK_EQ_INT(b->pool_off, t->pool_off + 3 * g * 16 * row);
			CHECK_EQ_INT(b->file_off, t->file_off + 3 * g * 16 * row);
			CHECK_EQ_INT(b->pool, t->pool);
		}
	}
	check_against_file(app, m, model);
	hybd_stop(d, "test");
	hyb_manifest_close(m);
	hyb_backend_close(app);
}

/*
 * split_experts end to end on this host's one node: node 0 listed twice
 * stands in for two nodes (the parser refuses that; the placement does not
 * mind), so both parts land in node 0's pool, each expert's rows at its
 * part's offset and stride, as they would on two nodes. The VM suite runs
 * real nodes.
 */
TEST(hybd_split_experts_pools_hold_each_parts_rows)
{
	const char *model = write_moe_model("moe.gguf", 2);
	struct hyb_manifest_info mi;
	struct hybd_config cfg;
	struct hyb_backend *app;
	struct hyb_manifest *m;
	struct hybd *d;
	unsigned int n_split = 0;
	char err[512];

	base_config(&cfg, model, "x");
	CHECK(!hybd_config_set(&cfg, "split_experts", "yes", err, sizeof(err)));
	CHECK(!hybd_config_set(&cfg, "nodes", "0", err, sizeof(err)));
	CHECK(hybd_start(&cfg, NULL, NULL, &d, err, sizeof(err)) < 0);
	CHECK_MSG(strstr(err, "split_experts needs 2 to 8 nodes"), "%s", err);
	cfg.place.nodes[1] = 0;
	cfg.place.n_nodes = 2;
	CHECK(!hybd_config_set(&cfg, "pools_per_node", "2", err, sizeof(err)));
	CHECK_MSG(!hybd_start(&cfg, NULL, NULL, &d, err, sizeof(err)), "%s", err);
	app = hyb_backend_open(HYB_BACKEND_LOCAL);
	CHECK(app);
	m = hyb_manifest_open_pool(app, "x.manifest");
	CHECK_MSG(m, "%s", hyb_last_error());
	hyb_manifest_info(m, &mi);
	CHECK_EQ_INT(mi.version, HYB_MF_VERSION);
	CHECK_MSG(strstr(mi.placement, " split_experts"), "%s", mi.placement);
	CHECK_EQ_INT(mi.n_pools, 2);
	CHECK_EQ_INT(mi.paged_bytes, 0);
	for (uint32_t i = 0; i < mi.n_tensors; i++) {
		const struct hyb_manifest_tensor *t = hyb_manifest_tensor(m, i);

		if (!strstr(t->name, "_exps") || strstr(t->name, "tiny")) {
			CHECK_MSG(t->pool < mi.n_pools && !t->n_parts && t->node == 0, "%s",
				  t->name);
			continue;
		}
		/* 100 rows cut at 48, 64 at 32 */
		CHECK_MSG(t->pool == HYB_MF_SPLIT && t->node == -1 && t->n_parts == 2, "%s",
			  t->name);
		CHECK_EQ_INT(t->parts[1].row0, t->ne[1] == 100 ? 48 : 32);
		CHECK(t->parts[0].node == 0 && t->parts[1].node == 0);
		n_split++;
	}
	CHECK_EQ_INT(n_split, 6);
	CHECK_EQ_INT(mi.n_parts, 12);
	check_against_file(app, m, model);
	hybd_stop(d, "test");
	hyb_manifest_close(m);
	hyb_backend_close(app);
}

TEST(hybd_budget_leaves_ffn_on_storage_for_on_demand_loads)
{
	const char *model = write_model("big.gguf", 6, 2048, 0);	/* ~4.8 MiB of FFN */
	struct hyb_manifest_info mi;
	const struct hyb_manifest_tensor *t = NULL;
	const struct hyb_mf_pool *page = NULL;
	struct hybd_config cfg;
	struct hyb_backend *app;
	struct hyb_manifest *m;
	struct hyb_mempool *pp;
	struct hyb_rq_cqe cqe;
	struct hyb_rq_req q;
	struct hyb_rq *c;
	struct hybd *d;
	uint8_t *pbase, *file;
	size_t flen, plen;
	char err[512];

	base_config(&cfg, model, "b");
	CHECK(!hybd_config_set(&cfg, "dram_budget", "4M", err, sizeof(err)));
	CHECK(!hybd_config_set(&cfg, "page_pool", "1M", err, sizeof(err)));
	CHECK_MSG(!hybd_start(&cfg, NULL, NULL, &d, err, sizeof(err)), "%s", err);
	app = hyb_backend_open(HYB_BACKEND_LOCAL);
	m = hyb_manifest_open(hybd_manifest_path(d));
	CHECK_MSG(m, "%s", hyb_last_error());
	hyb_manifest_info(m, &mi);
	CHECK(mi.flags & HYB_MF_F_PAGED || mi.paged_bytes);
	CHECK(mi.paged_bytes > 0 && mi.resident_bytes > 0);
	CHECK(mi.resident_bytes + (1 << 20) <= 4 << 20);
	for (uint32_t i = 0; i < mi.n_pools; i++)
		if (hyb_manifest_pool(m, i)->role == HYB_MF_ROLE_PAGE)
			page = hyb_manifest_pool(m, i);
	CHECK(page);
	for (uint32_t i = 0; i < mi.n_tensors && !t; i++)
		if (hyb_manifest_tensor(m, i)->pool == HYB_MF_NO_POOL)
			t = hyb_manifest_tensor(m, i);
	CHECK(t && hyb_numa_place_pageable(t->name));
	check_against_file(app, m, model);
	/* page it in: a LOAD of its file range into the page pool */
	CHECK(!hyb_rq_attach_client(app, 0, HYB_RQ_EVENTFD_NONE, &c));
	q = req(HYB_RQ_LOAD, HYB_RQ_CRITICAL, page->id, 4096, t->bytes, t->file_off, 1);
	CHECK(!hyb_rq_submit(c, &q, 1));
	CHECK_EQ_INT(hyb_rq_reap(c, &cqe, 1, 1, 10000000000ull), 1);
	CHECK_EQ_INT(cqe.status, 0);
	CHECK(!hyb_mempool_open_id(app, page->id, &pp));
	CHECK(!hyb_mempool_map(pp, (void **)&pbase, &plen));
	file = read_file(model, &flen);
	CHECK(!memcmp(pbase + 4096, file + t->file_off, t->bytes));
	free(file);
	hyb_mempool_close(pp);
	hyb_rq_close(c);
	hybd_stop(d, "test");
	hyb_manifest_close(m);
	hyb_backend_close(app);
}

static bool cancel_now(void *arg)
{
	return ++*(int *)arg >= 1;
}

/* hybd_start failed: it said why, and left no pool, no manifest, no queue daemon. */
static void check_nothing_left(const char *name)
{
	struct hyb_backend *b = hyb_backend_open(HYB_BACKEND_LOCAL);
	struct hyb_rq_stats st;
	char path[600];
	uint32_t ids[8];

	CHECK(b);
	CHECK_EQ_INT(hyb_mempool_list(b, ids, 8), 0);
	CHECK(!hyb_rq_stats(b, 0, &st));
	CHECK_EQ_INT(st.live, 0);
	snprintf(path, sizeof(path), "%s/%s.manifest", hyb_test_tmpdir(), name);
	CHECK(access(path, F_OK));
	hyb_backend_close(b);
}

TEST(hybd_start_failures_leave_nothing)
{
	const char *model = write_model("m.gguf", 2, 256, 0);
	struct hybd_config cfg;
	struct hybd *d, *d2;
	char err[512];
	int calls = 0;

	base_config(&cfg, "/nonexistent/model.gguf", "f");
	CHECK(hybd_start(&cfg, NULL, NULL, &d, err, sizeof(err)) < 0);
	CHECK_MSG(strstr(err, "/nonexistent/model.gguf"), "%s", err);
	check_nothing_left("f");

	/* not a GGUF */
	base_config(&cfg, write_text("junk.gguf", "this is not a model\n"), "f");
	CHECK(hybd_start(&cfg, NULL, NULL, &d, err, sizeof(err)) < 0);
	CHECK_MSG(strstr(err, "junk.gguf"), "%s", err);
	check_nothing_left("f");

	/* a node without memory */
	base_config(&cfg, model, "f");
	CHECK(!hybd_config_set(&cfg, "nodes", "7", err, sizeof(err)));
	CHECK(hybd_start(&cfg, NULL, NULL, &d, err, sizeof(err)) < 0);
	CHECK_MSG(strstr(err, "f.n7") && strstr(err, "node 7"), "%s", err);
	check_nothing_left("f");

	/* DRAM budget too small for the dense tensors */
	base_config(&cfg, model, "f");
	CHECK(!hybd_config_set(&cfg, "dram_budget", "100K", err, sizeof(err)));
	CHECK(!hybd_config_set(&cfg, "page_pool", "4K", err, sizeof(err)));
	CHECK(hybd_start(&cfg, NULL, NULL, &d, err, sizeof(err)) < 0);
	CHECK_MSG(strstr(err, "dram_budget") && strstr(err, "too small"), "%s", err);
	check_nothing_left("f");

	/* a shutdown signal during the load */
	base_config(&cfg, model, "f");
	CHECK(hybd_start(&cfg, cancel_now, &calls, &d, err, sizeof(err)) < 0);
	CHECK_MSG(strstr(err, "cancelled"), "%s", err);
	CHECK(calls >= 1);
	check_nothing_left("f");

	/* the same instance twice: the second is refused, the first unharmed */
	base_config(&cfg, model, "f");
	CHECK_MSG(!hybd_start(&cfg, NULL, NULL, &d, err, sizeof(err)), "%s", err);
	CHECK(hybd_start(&cfg, NULL, NULL, &d2, err, sizeof(err)) < 0);
	CHECK_MSG(strstr(err, "another hybd"), "%s", err);
	{
		struct hyb_manifest *m = hyb_manifest_open(hybd_manifest_path(d));

		CHECK_MSG(m, "%s", hyb_last_error());
		hyb_manifest_close(m);
	}
	/* another name, same queue: the queue has its daemon */
	base_config(&cfg, model, "g");
	CHECK(hybd_start(&cfg, NULL, NULL, &d2, err, sizeof(err)) < 0);
	CHECK_MSG(strstr(err, "queue 0"), "%s", err);
	hybd_stop(d, "test");
	check_nothing_left("f");
}

TEST(hybd_pools_over_the_pinned_cap_fail_cleanly)
{
	struct hybd_config cfg;
	struct hybd *d;
	char err[512];

	/* read once per process, at the first backend open */
	setenv("HYB_LOCAL_MAX_PINNED_MB", "2", 1);
	base_config(&cfg, write_model("m4.gguf", 8, 2048, 0), "f");
	CHECK(hybd_start(&cfg, NULL, NULL, &d, err, sizeof(err)) < 0);
	CHECK_MSG(strstr(err, "cannot create pool f.n0"), "%s", err);
	check_nothing_left("f");
}

/* -- the copy device ------------------------------------------------------ */

static bool exists_in_tmp(const char *name)
{
	char path[600];

	snprintf(path, sizeof(path), "%s/%s", hyb_test_tmpdir(), name);
	return !access(path, F_OK);
}

/*
 * device = cuda|auto|cpu without CUDA in this test binary (the Makefile links
 * tests without kernels/cuda): cuda fails at start naming the reason and
 * leaves nothing; auto runs the CPU device and logs why; the statistics file
 * is there while hybd runs. The GPU side is tests/gpu/test_copydev.c.
 */
TEST(hybd_device_cuda_without_cuda_auto_and_cpu)
{
	const char *model = write_model("m.gguf", 2, 256, 0);
	struct hybd_config cfg;
	struct hybd *d;
	char err[512], logp[512], *log, *printed = NULL;
	size_t plen = 0;
	FILE *f;

	hybd_config_defaults(&cfg);
	CHECK_EQ_INT(cfg.device, HYBD_DEV_AUTO);
	base_config(&cfg, model, "dv");
	CHECK(!hybd_config_set(&cfg, "device", "cuda", err, sizeof(err)));
	CHECK_EQ_INT(cfg.device, HYBD_DEV_CUDA);
	CHECK(!hybd_config_set(&cfg, "cuda_device", "3", err, sizeof(err)));
	CHECK_EQ_INT(cfg.cuda_device, 3);
	CHECK(hybd_config_set(&cfg, "cuda_device", "x", err, sizeof(err)) < 0);
	f = open_memstream(&printed, &plen);
	CHECK(f);
	hybd_config_print(&cfg, f);
	fclose(f);
	CHECK_MSG(strstr(printed, "\ndevice = cuda\ncuda_device = 3\n"), "%s", printed);
	free(printed);
	if (hyb_copydev_cuda_built())
		SKIP("this test binary has CUDA linked in: tests/gpu covers device = cuda");
	CHECK(!hybd_config_set(&cfg, "cuda_device", "0", err, sizeof(err)));
	open_log("dev.log", HLOG_KV, logp, sizeof(logp));
	CHECK(hybd_start(&cfg, NULL, NULL, &d, err, sizeof(err)) < 0);
	CHECK_MSG(strstr(err, "device = cuda: hybd was built without CUDA"), "%s", err);
	check_nothing_left("dv");
	CHECK(!exists_in_tmp("dv.gpucache") && !exists_in_tmp("dv.stats"));

	/* auto: the CPU device, saying why */
	CHECK(!hybd_config_set(&cfg, "device", "auto", err, sizeof(err)));
	CHECK_MSG(!hybd_start(&cfg, NULL, NULL, &d, err, sizeof(err)), "%s", err);
	CHECK(exists_in_tmp("dv.stats") && exists_in_tmp("dv.gpucache"));
	{
		/* the CPU device's slots: a shared pool apps find through the descriptor */
		struct hyb_gpucache_desc gc;
		char gp[600];

		snprintf(gp, sizeof(gp), "%s/dv.gpucache", hyb_test_tmpdir());
		CHECK_MSG(!hyb_gpucache_desc_read(gp, &gc), "%s", hyb_last_error());
		CHECK(gc.kind == HYB_GPUCACHE_HOST && gc.n_slots == 4 && gc.slot_bytes == 65536 &&
		      gc.pid == getpid() && !strcmp(gc.pool, "dv.gpucache") && gc.queue == cfg.queue);
	}
	hybd_stop(d, "test");
	CHECK(!exists_in_tmp("dv.stats") && !exists_in_tmp("dv.gpucache"));
	/* cpu */
	CHECK(!hybd_config_set(&cfg, "device", "cpu", err, sizeof(err)));
	CHECK_MSG(!hybd_start(&cfg, NULL, NULL, &d, err, sizeof(err)), "%s", err);
	hybd_stop(d, "test");
	check_nothing_left("dv");
	hlog_close();
	log = slurp(logp);
	CHECK_MSG(strstr(log, "event=error msg=\"device = cuda: hybd was built without CUDA"),
		  "%s", log);
	CHECK_MSG(strstr(log, "event=device name=cpu slots=4 slot_bytes=65536 ") &&
		  strstr(log, "cuda=\"hybd was built without CUDA") &&
		  strstr(log, "msg=\"device = cpu: GPU cache slots are host memory"), "%s", log);
	free(log);
}

/* gpu_cache sizes the cache in bytes: slots follow from slot_bytes; too small says so. */
TEST(hybd_gpu_cache_sets_the_slots)
{
	const char *model = write_model("gc.gguf", 2, 256, 0);
	struct hyb_gpucache_desc gc;
	struct hybd_config cfg;
	struct hybd *d;
	char err[512], gp[600];

	base_config(&cfg, model, "gc");
	CHECK(!hybd_config_set(&cfg, "device", "cpu", err, sizeof(err)));
	CHECK(!hybd_config_set(&cfg, "gpu_cache", "1M", err, sizeof(err)));
	CHECK_MSG(!hybd_start(&cfg, NULL, NULL, &d, err, sizeof(err)), "%s", err);
	snprintf(gp, sizeof(gp), "%s/gc.gpucache", hyb_test_tmpdir());
	CHECK_MSG(!hyb_gpucache_desc_read(gp, &gc), "%s", hyb_last_error());
	CHECK_EQ_INT(gc.n_slots, 16);	/* 1 MiB of 64 KiB slots */
	hybd_stop(d, "test");
	CHECK(!hybd_config_set(&cfg, "gpu_cache", "4K", err, sizeof(err)));
	CHECK(hybd_start(&cfg, NULL, NULL, &d, err, sizeof(err)) < 0);
	CHECK_MSG(strstr(err, "gpu_cache 4096 holds 0 slots of 65536 bytes"), "%s", err);
	check_nothing_left("gc");
}

/* Statistics files of apps that are gone are removed at start; a live app's stays. */
TEST(hybd_removes_dead_apps_files)
{
	const char *model = write_model("da.gguf", 2, 256, 0);
	struct hybd_config cfg;
	struct hybd *d;
	char err[512], dead[600], live[600], other[600];
	FILE *f;

	snprintf(dead, sizeof(dead), "%s/da.app.2147483000", hyb_test_tmpdir());
	snprintf(live, sizeof(live), "%s/da.app.%d", hyb_test_tmpdir(), (int)getpid());
	snprintf(other, sizeof(other), "%s/db.app.2147483000", hyb_test_tmpdir());
	for (int i = 0; i < 3; i++) {
		f = fopen(i == 0 ? dead : i == 1 ? live : other, "w");
		CHECK(f);
		fputs("hyb-app-stats 1\n", f);
		fclose(f);
	}
	base_config(&cfg, model, "da");
	CHECK_MSG(!hybd_start(&cfg, NULL, NULL, &d, err, sizeof(err)), "%s", err);
	CHECK(access(dead, F_OK) && !access(live, F_OK) && !access(other, F_OK));
	hybd_stop(d, "test");
	unlink(live);
	unlink(other);
}

/* The GPU cache descriptor file hybd publishes for apps (no GPU needed). */
TEST(hybd_gpucache_descriptor_file)
{
	struct hyb_gpucache_desc a = {
		.magic = HYB_GPUCACHE_MAGIC, .version = HYB_GPUCACHE_VERSION, .pid = 4242,
		.n_slots = 64, .slot_bytes = 2 << 20, .pci_bus_id = "0000:3b:00.0",
	}, b;
	char path[600];
	FILE *f;

	for (int i = 0; i < 64; i++)
		a.ipc_handle[i] = (uint8_t)(i * 7 + 1);
	snprintf(path, sizeof(path), "%s/x.gpucache", hyb_test_tmpdir());
	CHECK_MSG(!hyb_gpucache_desc_write(path, &a), "%s", hyb_last_error());
	CHECK_MSG(!hyb_gpucache_desc_read(path, &b), "%s", hyb_last_error());
	CHECK(!memcmp(&a, &b, sizeof(a)));
	/* wrong version, short, long, missing: one line each, nothing handed out */
	a.version = 9;
	CHECK(!hyb_gpucache_desc_write(path, &a));
	CHECK_EQ_INT(hyb_gpucache_desc_read(path, &b), -EINVAL);
	CHECK_MSG(strstr(hyb_last_error(), "version 9"), "%s", hyb_last_error());
	CHECK_EQ_INT(b.magic, 0);
	f = fopen(path, "w");
	CHECK(f);
	fwrite(&a, 1, 10, f);
	fclose(f);
	CHECK_EQ_INT(hyb_gpucache_desc_read(path, &b), -EINVAL);
	CHECK_MSG(strstr(hyb_last_error(), "not a GPU cache descriptor"), "%s", hyb_last_error());
	a.version = HYB_GPUCACHE_VERSION;
	f = fopen(path, "w");
	CHECK(f);
	fwrite(&a, 1, sizeof(a), f);
	fputc(0, f);
	fclose(f);
	CHECK_EQ_INT(hyb_gpucache_desc_read(path, &b), -EINVAL);
	CHECK_EQ_INT(hyb_gpucache_desc_read("/nonexistent/x.gpucache", &b),
		     -ENOENT);
	CHECK_MSG(strstr(hyb_last_error(), "/nonexistent/x.gpucache"), "%s", hyb_last_error());
	CHECK(hyb_gpucache_desc_write("/nonexistent/x.gpucache", &a) < 0);
	/* a host cache names its pool; an unknown kind is refused */
	a.kind = HYB_GPUCACHE_HOST;
	CHECK(!hyb_gpucache_desc_write(path, &a));
	CHECK_EQ_INT(hyb_gpucache_desc_read(path, &b), -EINVAL);
	CHECK_MSG(strstr(hyb_last_error(), "without a pool name"), "%s", hyb_last_error());
	snprintf(a.pool, sizeof(a.pool), "hyb.gpucache");
	CHECK(!hyb_gpucache_desc_write(path, &a));
	CHECK_MSG(!hyb_gpucache_desc_read(path, &b), "%s", hyb_last_error());
	CHECK(!strcmp(b.pool, "hyb.gpucache"));
	a.kind = 7;
	CHECK(!hyb_gpucache_desc_write(path, &a));
	CHECK_EQ_INT(hyb_gpucache_desc_read(path, &b), -EINVAL);
	CHECK_MSG(strstr(hyb_last_error(), "unknown"), "%s", hyb_last_error());
	a.kind = HYB_GPUCACHE_CUDA;
	/* without CUDA the app side says so */
	if (!hyb_copydev_cuda_built()) {
		void *base = &a;

		CHECK_EQ_INT(hyb_cuda_cache_open(&a, -1, &base), -ENODEV);
		CHECK(!base);
		CHECK_MSG(strstr(hyb_last_error(), "built without CUDA"), "%s", hyb_last_error());
	}
}

/* -- the program ---------------------------------------------------------- */

static const char *hybd_bin(void)
{
	const char *e = getenv("HYBD");

	if (e)
		return e;
	if (access("build/hybd", X_OK))
		SKIP("build/hybd is not built (make all builds it)");
	return "build/hybd";
}

static pid_t spawn(const char *bin, const char *conf, const char *extra, const char *errpath)
{
	pid_t pid = fork();

	CHECK(pid >= 0);
	if (pid == 0) {
		int fd = open(errpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);

		dup2(fd, 2);
		execl(bin, bin, "-c", conf, extra, (char *)NULL);
		_exit(127);
	}
	return pid;
}

static int wait_file(const char *path, int ms)
{
	for (int i = 0; i < ms / 10; i++) {
		if (!access(path, F_OK))
			return 0;
		usleep(10000);
	}
	return -1;
}

static int exit_status(pid_t pid)
{
	int st;

	CHECK(waitpid(pid, &st, 0) == pid);
	CHECK_MSG(WIFEXITED(st), "hybd died of signal %d", WIFSIGNALED(st) ? WTERMSIG(st) : 0);
	return WEXITSTATUS(st);
}

TEST(hybd_program_foreground_daemon_and_bad_config)
{
	const char *bin = hybd_bin(), *model = write_model("m.gguf", 2, 256, 0);
	const char *dir = hyb_test_tmpdir();
	char conf_text[2048], mpath[600], errp[600], logp[600], pidp[600], *s;
	struct hyb_manifest_info mi;
	struct hyb_manifest *m;
	const char *conf;
	pid_t pid;
	FILE *f;
	int dpid = 0;

	snprintf(conf_text, sizeof(conf_text), "model = %s\nbackend = local\nstate_dir = %s\n"
		 "name = e2e\nstats_interval = 1\nlog_format = json\n", model, dir);
	conf = write_text("hybd.conf", conf_text);
	snprintf(mpath, sizeof(mpath), "%s/e2e.manifest", dir);
	snprintf(errp, sizeof(errp), "%s/stderr", dir);
	snprintf(logp, sizeof(logp), "%s/e2e.log", dir);
	snprintf(pidp, sizeof(pidp), "%s/e2e.pid", dir);

	/* foreground: JSON lines on stderr, SIGTERM -> exit 0, nothing left */
	pid = spawn(bin, conf, "-f", errp);
	CHECK_MSG(!wait_file(mpath, 20000), "no manifest after 20 s");
	m = hyb_manifest_open(mpath);
	CHECK(m);
	hyb_manifest_info(m, &mi);
	CHECK_EQ_INT(mi.pid, pid);
	CHECK_EQ_INT(mi.n_tensors, 1 + 2 * 7 + 2);
	hyb_manifest_close(m);
	usleep(1100000);	/* one statistics interval */
	CHECK(!kill(pid, SIGTERM));
	CHECK_EQ_INT(exit_status(pid), 0);
	CHECK(access(mpath, F_OK));
	s = slurp(errp);
	CHECK_MSG(strstr(s, "{\"ts\":") && strstr(s, "\"event\":\"ready\"") &&
		  strstr(s, "\"event\":\"stopped\""), "%s", s);
	free(s);

	/* daemon: returns once ready, logs to the state dir, pid file */
	pid = spawn(bin, conf, NULL, errp);
	CHECK_EQ_INT(exit_status(pid), 0);
	CHECK(!access(mpath, F_OK));
	f = fopen(pidp, "r");
	CHECK(f && fscanf(f, "%d", &dpid) == 1);
	fclose(f);
	CHECK(dpid > 1 && dpid != pid);
	CHECK(!kill(dpid, SIGTERM));
	for (int i = 0; i < 1000 && !kill(dpid, 0); i++)
		usleep(10000);
	CHECK_MSG(kill(dpid, 0) && errno == ESRCH, "the daemon did not exit");
	CHECK(access(mpath, F_OK) && access(pidp, F_OK));
	s = slurp(logp);
	CHECK_MSG(strstr(s, "\"event\":\"ready\"") && strstr(s, "\"event\":\"stopped\""), "%s", s);
	free(s);

	/* bad configuration: exit 2, file:line on stderr */
	conf = write_text("bad.conf", "model = x\nqueue = banana\n");
	pid = spawn(bin, conf, "-f", errp);
	CHECK_EQ_INT(exit_status(pid), 2);
	s = slurp(errp);
	CHECK_MSG(strstr(s, "bad.conf:2: queue: 'banana'"), "%s", s);
	free(s);
	/* a model that is not there: exit 1 with the reason */
	snprintf(conf_text, sizeof(conf_text), "model = %s/none.gguf\nbackend = local\n"
		 "state_dir = %s\n", dir, dir);
	conf = write_text("none.conf", conf_text);
	pid = spawn(bin, conf, "-f", errp);
	CHECK_EQ_INT(exit_status(pid), 1);
	s = slurp(errp);
	CHECK_MSG(strstr(s, "none.gguf") && strstr(s, "event=error"), "%s", s);
	free(s);
	/* the same as a daemon: the parent says why on the terminal */
	pid = spawn(bin, conf, NULL, errp);
	CHECK_EQ_INT(exit_status(pid), 1);
	s = slurp(errp);
	CHECK_MSG(strstr(s, "hybd: did not start: ") && strstr(s, "none.gguf"), "%s", s);
	free(s);
}

/* --split-experts is split_experts = yes; a node count it cannot use is a config error (2) */
TEST(hybd_program_split_experts_flag)
{
	const char *bin = hybd_bin(), *dir = hyb_test_tmpdir();
	char cmd[2048], outp[600], *s;
	const char *conf;

	snprintf(cmd, sizeof(cmd), "model = %s/none.gguf\nbackend = local\nnodes = 0,1\n", dir);
	conf = write_text("split.conf", cmd);
	snprintf(outp, sizeof(outp), "%s/split.out", dir);
	snprintf(cmd, sizeof(cmd), "%s -c %s --split-experts --check >%s 2>&1", bin, conf, outp);
	CHECK_EQ_INT(WEXITSTATUS(system(cmd)), 0);
	s = slurp(outp);
	CHECK_MSG(strstr(s, "\nsplit_experts = yes\n"), "%s", s);
	free(s);
	snprintf(cmd, sizeof(cmd), "%s -c %s --split-experts -o nodes=1 --check >%s 2>&1", bin, conf,
		 outp);
	CHECK_EQ_INT(WEXITSTATUS(system(cmd)), 2);
	s = slurp(outp);
	CHECK_MSG(strstr(s, "hybd: split_experts needs 2 to 8 nodes; nodes = 1 lists 1"), "%s", s);
	free(s);
	snprintf(cmd, sizeof(cmd), "%s --help >%s 2>&1", bin, outp);
	CHECK_EQ_INT(WEXITSTATUS(system(cmd)), 0);
	s = slurp(outp);
	CHECK_MSG(strstr(s, "--split-experts") && strstr(s, "split_experts = no"), "%s", s);
	free(s);
}

/* device = cuda where it cannot be had: exit 1, the reason on stderr, nothing published */
TEST(hybd_program_device_cuda_unavailable)
{
	const char *bin = hybd_bin(), *model = write_model("m.gguf", 2, 256, 0);
	const char *dir = hyb_test_tmpdir(), *conf;
	char conf_text[1024], errp[600], *s;
	pid_t pid;

	snprintf(conf_text, sizeof(conf_text), "model = %s\nbackend = local\nstate_dir = %s\n"
		 "name = cu\ndevice = cuda\ncuda_device = 1023\n", model, dir);
	conf = write_text("cu.conf", conf_text);
	snprintf(errp, sizeof(errp), "%s/stderr", dir);
	pid = spawn(bin, conf, "-f", errp);
	CHECK_EQ_INT(exit_status(pid), 1);
	s = slurp(errp);
	/* a build without nvcc says so; one with CUDA names the missing GPU */
	CHECK_MSG(strstr(s, "event=error msg=\"device = cuda: ") &&
		  (strstr(s, "hybd was built without CUDA") || strstr(s, "CUDA device")), "%s", s);
	free(s);
	CHECK(!exists_in_tmp("cu.manifest") && !exists_in_tmp("cu.stats") &&
	      !exists_in_tmp("cu.gpucache"));
}

TEST(hybd_program_kmod_backend)
{
	const char *bin, *model, *dir = hyb_test_tmpdir();
	char conf_text[1024], errp[600];
	struct hyb_backend *app;
	struct hyb_manifest *m = NULL;
	const char *conf;
	pid_t pid;

	if (access("/dev/hybpool", F_OK))
		SKIP("no /dev/hybpool: the module's end-to-end run is in the VM bench");
	bin = hybd_bin();
	model = write_model("m.gguf", 2, 256, 0);
	snprintf(conf_text, sizeof(conf_text), "model = %s\nbackend = kmod\nstate_dir = %s\n"
		 "name = kt\nqueue = 9\n", model, dir);
	conf = write_text("k.conf", conf_text);
	snprintf(errp, sizeof(errp), "%s/stderr", dir);
	pid = spawn(bin, conf, "-f", errp);
	app = hyb_backend_open(HYB_BACKEND_KMOD);
	CHECK(app);
	for (int i = 0; i < 2000 && !m; i++) {
		m = hyb_manifest_open_pool(app, "kt.manifest");
		if (!m)
			usleep(10000);
	}
	CHECK_MSG(m, "no manifest pool from hybd");
	check_against_file(app, m, model);
	CHECK(!kill(pid, SIGTERM));
	CHECK_EQ_INT(exit_status(pid), 0);
	CHECK_EQ_INT(hyb_manifest_live(m), 0);
	hyb_manifest_close(m);
	hyb_backend_close(app);
}

TEST(hybd_hybctl_manifest_shows_the_placement)
{
	const char *model = write_model("m.gguf", 4, 256, 0);
	struct hybd_config cfg;
	struct hybd *d;
	char err[512], cmd[1400], out[65536];
	size_t n;
	FILE *p;

	if (access("build/hybctl", X_OK))
		SKIP("build/hybctl is not built");
	base_config(&cfg, model, "c");
	CHECK(!hybd_config_set(&cfg, "pools_per_node", "2", err, sizeof(err)));
	CHECK_MSG(!hybd_start(&cfg, NULL, NULL, &d, err, sizeof(err)), "%s", err);
	snprintf(cmd, sizeof(cmd), "build/hybctl manifest %s --json 2>&1", hybd_manifest_path(d));
	p = popen(cmd, "r");
	CHECK(p);
	n = fread(out, 1, sizeof(out) - 1, p);
	out[n] = 0;
	pclose(p);
	if (strstr(out, "unknown command"))
		SKIP("hybctl has no manifest command registered yet");
	CHECK_MSG(strstr(out, "\"placement\": \"layer nodes=0 pools_per_node=2\"") &&
		  strstr(out, "\"name\": \"c.n0.0\"") && strstr(out, "\"name\": \"c.n0.1\"") &&
		  strstr(out, "\"name\": \"blk.3.ffn_down.weight\", \"type\": \"F16\", "
			 "\"shape\": [256, 64], \"layer\": 3, \"node\": 0"), "%s", out);
	snprintf(cmd, sizeof(cmd), "build/hybctl manifest %s --tensors >/dev/null 2>&1 && "
		 "build/hybctl manifest %s --find output.weight >/dev/null 2>&1",
		 hybd_manifest_path(d), hybd_manifest_path(d));
	CHECK_EQ_INT(system(cmd), 0);
	snprintf(cmd, sizeof(cmd), "build/hybctl manifest %s --find nope >/dev/null 2>&1",
		 hybd_manifest_path(d));
	CHECK(WEXITSTATUS(system(cmd)) == 1);
	CHECK(WEXITSTATUS(system("build/hybctl manifest /nonexistent/x.manifest 2>/dev/null")) == 1);
	hybd_stop(d, "test");

	/*
	 * A split tensor on two nodes (a manifest built here: this host has one
	 * node): its parts in the tensor list and JSON, its rows counted on
	 * their nodes.
	 */
	{
		struct hyb_mf_model mm = { .path = "/m.gguf", .size = 1 << 20, .n_layers = 1,
					   .name = "s", .placement = "layer nodes=0,1 split_experts" };
		struct hyb_mf_builder *b = hyb_mf_builder_new(&mm);
		struct hyb_mf_pool p0 = { .id = 3, .node = 0, .role = HYB_MF_ROLE_WEIGHTS,
					  .bytes = 1 << 20, .used = 48 * 4 * 64, .name = "s.n0" };
		struct hyb_mf_pool p1 = { .id = 4, .node = 1, .role = HYB_MF_ROLE_WEIGHTS,
					  .bytes = 1 << 20, .used = 52 * 4 * 64 + 64, .name = "s.n1" };
		struct hyb_mf_tensor st = { .type = HYB_TYPE_F16, .n_dims = 3,
					    .ne = { 32, 100, 4, 1 }, .node = -1, .pool = HYB_MF_SPLIT,
					    .bytes = 100 * 4 * 64, .file_off = 8192 };
		struct hyb_mf_tensor nt = { .type = HYB_TYPE_F32, .n_dims = 1, .ne = { 16, 1, 1, 1 },
					    .node = 1, .pool = 1, .bytes = 64, .file_off = 4096 };
		struct hyb_mf_part a = { .pool = 0, .node = 0, .row0 = 0, .rows = 48,
					 .pool_off = 8192, .stride = 48 * 64 + 3328 };
		struct hyb_mf_part c = { .pool = 1, .node = 1, .row0 = 48, .rows = 52,
					 .pool_off = 4096 + 3072, .stride = 52 * 64 + 3072 };
		char path[600], scmd[2200];
		uint8_t *buf;
		size_t len;

		CHECK(b && !hyb_mf_add_pool(b, &p0) && hyb_mf_add_pool(b, &p1) == 1);
		CHECK(!hyb_mf_add_tensor(b, "blk.0.ffn_up_exps.weight", &st));
		CHECK(!hyb_mf_add_tensor(b, "blk.0.ffn_norm.weight", &nt));
		CHECK(!hyb_mf_add_part(b, "blk.0.ffn_up_exps.weight", &c));
		CHECK(!hyb_mf_add_part(b, "blk.0.ffn_up_exps.weight", &a));
		CHECK_MSG(!hyb_mf_build(b, &buf, &len, err, sizeof(err)), "%s", err);
		hyb_mf_builder_free(b);
		snprintf(path, sizeof(path), "%s/split.manifest", hyb_test_tmpdir());
		p = fopen(path, "w");
		CHECK(p && fwrite(buf, 1, len, p) == len);
		fclose(p);
		free(buf);
		snprintf(scmd, sizeof(scmd), "build/hybctl manifest %s --tensors 2>&1; "
			 "build/hybctl manifest %s --json 2>&1; "
			 "build/hybctl manifest %s --find blk.0.ffn_up_exps.weight 2>&1", path, path,
			 path);
		p = popen(scmd, "r");
		CHECK(p);
		n = fread(out, 1, sizeof(out) - 1, p);
		out[n] = 0;
		pclose(p);
		CHECK_MSG(strstr(out, "version 2") && strstr(out, "(split by rows)") &&
			  strstr(out, "rows 0-47") && strstr(out, "rows 48-99") &&
			  strstr(out, "stride 6400") &&
			  strstr(out, "node 0: 0 B resident in 0 tensors, 12 KiB in its rows of 1 "
				 "split expert tensors") &&
			  strstr(out, "node 1: 64 B resident in 1 tensors, 13 KiB in its rows of 1 "
				 "split expert tensors") &&
			  strstr(out, "\"node\": -1, \"pool\": null") &&
			  strstr(out, "\"parts\": [{\"row0\": 0, \"rows\": 48, \"node\": 0, "
				 "\"pool\": \"s.n0\", \"pool_off\": 8192, \"stride\": 6400}, "
				 "{\"row0\": 48, \"rows\": 52, \"node\": 1, \"pool\": \"s.n1\""),
			  "%s", out);
	}
}
