// SPDX-License-Identifier: MIT
/*
 * hybd's reload statistics as `hybctl stalls` shows them
 * (libhyb/box/stalls.c, tools/hybctl/stalls.c): a reload service on the
 * local backend serves requests of every class (one of them failing); its
 * statistics written to a file read back equal, and the text and JSON
 * formatters show them per class; a file whose writer is gone, no file, a
 * junk file are each one line; hybd itself keeps STATE_DIR/NAME.stats from
 * start to shutdown; and build/hybctl, when built, prints the same JSON.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon/config.h"
#include "daemon/server.h"
#include "daemon/copydev.h"
#include "daemon/reload.h"
#include "hyb/stalls.h"
#include "hyb/gguf.h"
#include "hyb/tensor_type.h"
#include "test.h"

#define QID 5

static const char *make_file(const char *name, uint64_t size)
{
	static char path[512];
	uint8_t *buf = malloc(size);
	uint32_t x = 88172645u;
	int fd;

	CHECK(buf);
	for (uint64_t i = 0; i < size; i++) {
		x ^= x << 13, x ^= x >> 17, x ^= x << 5;
		buf[i] = (uint8_t)x;
	}
	snprintf(path, sizeof(path), "%s/%s", hyb_test_tmpdir(), name);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	CHECK(fd >= 0 && write(fd, buf, size) == (ssize_t)size);
	close(fd);
	free(buf);
	return path;
}

static struct hyb_rq_req req(uint16_t op, uint8_t prio, uint32_t pool, uint64_t off, uint64_t len,
			     uint64_t aux, uint64_t tag)
{
	return (struct hyb_rq_req){ .op = op, .prio = prio, .pool_id = pool, .pool_off = off,
				    .len = len, .aux = aux, .tag = tag };
}

static void reap_n(struct hyb_rq *c, struct hyb_rq_cqe *cqe, int n)
{
	for (int got = 0; got < n;) {
		int r = hyb_rq_reap(c, cqe + got, (unsigned int)(n - got), 1, 10000000000ull);

		CHECK_MSG(r > 0, "reap: %d %s", r, hyb_last_error());
		got += r;
	}
}

/* What a formatter printed (not inlined: GCC then sees the memstream's buffer as local). */
__attribute__((noinline)) static char *format(void (*fn)(FILE *f, const struct hyb_stalls_hybd *h),
		    const struct hyb_stalls_hybd *h)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);

	CHECK(f);
	fn(f, h);
	fclose(f);
	return buf;
}

static void text_fn(FILE *f, const struct hyb_stalls_hybd *h)
{
	hyb_stalls_print_text(f, h, NULL, 0);
}

/* The line of a class in the text table. */
static const char *class_row(const char *text, const char *cls)
{
	char want[32];
	const char *p;

	snprintf(want, sizeof(want), "\n%-9s ", cls);
	p = strstr(text, want);
	CHECK_MSG(p, "no row for %s in:\n%s", cls, text);
	return p + 1;
}

static int run_capture(const char *cmd, char *out, size_t len)
{
	FILE *p = popen(cmd, "r");
	size_t n;
	int st;

	CHECK(p);
	n = fread(out, 1, len - 1, p);
	out[n] = 0;
	st = pclose(p);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/*
 * 3 critical LOADs, 2 reload UPLOADs, 4 prefetch LOADs of which one past the
 * end of the file: the statistics round-trip through the file and both
 * formatters.
 */
TEST(stalls_reload_classes_round_trip_and_format)
{
	const char *model = make_file("m.bin", 2 << 20);
	struct hyb_reload_config rc = { .queue = QID, .model_path = model, .chunk = 64 << 10 };
	struct hyb_stalls_hybd h;
	struct hyb_reload_stats st;
	struct hyb_rq_cqe cqe[16];
	struct hyb_rq_req q[16];
	struct hyb_mempool *p;
	struct hyb_backend *b;
	struct hyb_reload *r;
	struct hyb_rq *c;
	char err[256], path[600];
	const char *row;
	char *text, *json;
	size_t len;
	uint8_t *base;
	int n = 0, errors = 0;

	b = hyb_backend_open(HYB_BACKEND_LOCAL);
	CHECK_MSG(b, "%s", hyb_last_error());
	rc.backend = b;
	rc.dev = hyb_copydev_cpu_open(4, 256 << 10, 0, err, sizeof(err));
	CHECK_MSG(rc.dev, "%s", err);
	r = hyb_reload_start(&rc, err, sizeof(err));
	CHECK_MSG(r, "%s", err);
	CHECK(!hyb_rq_attach_client(b, QID, HYB_RQ_EVENTFD_NONE, &c));
	CHECK_MSG(!hyb_mempool_create(b, "st", 4 << 20, HYB_MEMPOOL_NODE_LOCAL, 0, 0, &p), "%s",
		  hyb_last_error());
	CHECK(!hyb_mempool_map(p, (void **)&base, &len));
	for (int i = 0; i < 3; i++, n++)
		q[n] = req(HYB_RQ_LOAD, HYB_RQ_CRITICAL, hyb_mempool_id(p), (uint64_t)i << 20,
			   100000, (uint64_t)i * 4096, (uint64_t)n);
	for (int i = 0; i < 2; i++, n++)
		q[n] = req(HYB_RQ_UPLOAD, i ? HYB_RQ_NORMAL : HYB_RQ_HIGH, hyb_mempool_id(p), 0,
			   200000, (uint64_t)i, (uint64_t)n);
	for (int i = 0; i < 3; i++, n++)
		q[n] = req(HYB_RQ_LOAD, HYB_RQ_LOW, hyb_mempool_id(p), 3 << 20, 65536,
			   (uint64_t)i << 16, (uint64_t)n);
	q[n++] = req(HYB_RQ_LOAD, HYB_RQ_LOW, hyb_mempool_id(p), 0, 4096, 2 << 20, 99);
	CHECK(!hyb_rq_submit(c, q, (unsigned int)n));
	reap_n(c, cqe, n);
	for (int i = 0; i < n; i++) {
		CHECK_EQ_INT(cqe[i].status, cqe[i].tag == 99 ? -ERANGE : 0);
		errors += cqe[i].status != 0;
	}
	CHECK_EQ_INT(errors, 1);
	hyb_reload_stats(r, &st);
	CHECK_EQ_INT(st.cls[HYB_RELOAD_CRITICAL].done, 3);
	CHECK_EQ_INT(st.cls[HYB_RELOAD_RELOAD].done, 2);
	CHECK_EQ_INT(st.cls[HYB_RELOAD_PREFETCH].done, 3);
	CHECK_EQ_INT(st.cls[HYB_RELOAD_PREFETCH].failed, 1);

	/* the file hybd writes, read back as hybctl does */
	snprintf(path, sizeof(path), "%s/s.stats", hyb_test_tmpdir());
	CHECK_MSG(!hyb_reload_stats_write(&st, path), "%s", hyb_last_error());
	hyb_stalls_read(path, &h);
	CHECK_MSG(h.state == HYB_STALLS_RUNNING, "%s", h.why);
	CHECK_EQ_INT(h.pid, getpid());
	CHECK_EQ_INT(h.st.fetched, st.fetched);
	CHECK_EQ_INT(h.st.backlog, 0);
	for (int k = 0; k < HYB_RELOAD_CLASSES; k++) {
		const struct hyb_reload_class_stats *a = &st.cls[k], *e = &h.st.cls[k];

		CHECK_EQ_INT(e->done, a->done);
		CHECK_EQ_INT(e->failed, a->failed);
		CHECK_EQ_INT(e->bytes, a->bytes);
		CHECK_EQ_INT(e->preemptions, a->preemptions);
		CHECK_EQ_INT(e->wait.count, a->wait.count);
		CHECK_EQ_INT(e->wait.p50_ns, a->wait.p50_ns);
		CHECK_EQ_INT(e->wait.p99_ns, a->wait.p99_ns);
		CHECK_EQ_INT(e->service.p50_ns, a->service.p50_ns);
		CHECK_EQ_INT(e->service.p99_ns, a->service.p99_ns);
		CHECK(a->service.count == 0 || a->service.p50_ns > 0);
	}
	CHECK_EQ_INT(h.st.cls[HYB_RELOAD_CRITICAL].bytes, 300000);
	CHECK_EQ_INT(h.st.cls[HYB_RELOAD_RELOAD].bytes, 400000);
	CHECK_EQ_INT(h.st.cls[HYB_RELOAD_PREFETCH].bytes, 3 * 65536);

	/* text: a header and a row per class, numbers as in the statistics */
	text = format(text_fn, &h);
	CHECK_MSG(!strncmp(text, "hybd pid ", 9) && strstr(text, "9 requests fetched, 0 in "
		  "progress") && strstr(text, "CLASS ") && strstr(text, "WAIT p50 / p99"), "%s",
		  text);
	row = class_row(text, "critical");
	CHECK_MSG(!strncmp(row, "critical          3       0   293.0 KiB ", 40), "%.100s", row);
	row = class_row(text, "reload");
	CHECK_MSG(!strncmp(row, "reload            2       0   390.6 KiB ", 40), "%.100s", row);
	row = class_row(text, "prefetch");
	CHECK_MSG(!strncmp(row, "prefetch          4       1   192.0 KiB ", 40), "%.100s", row);
	CHECK_MSG(strstr(row, " us / ") || strstr(row, " ms / "), "%.100s", row);
	free(text);

	/* JSON: the same numbers, one object; python3 checks it parses and adds up */
	json = format(hyb_stalls_print_json, &h);
	CHECK_MSG(strstr(json, "{\"class\": \"prefetch\", \"requests\": 4, \"done\": 3, "
			 "\"errors\": 1, \"bytes\": 196608, ") &&
		  strstr(json, "{\"class\": \"critical\", \"requests\": 3, \"done\": 3, "
			 "\"errors\": 0, \"bytes\": 300000, ") && strstr(json, "\"running\": true"),
		  "%s", json);
	{
		char cmd[8192], out[256];
		FILE *f;

		snprintf(path, sizeof(path), "%s/s.json", hyb_test_tmpdir());
		f = fopen(path, "w");
		CHECK(f);
		fputs(json, f);
		fclose(f);
		snprintf(cmd, sizeof(cmd), "python3 -c 'import json,sys; "
			 "d = json.load(open(sys.argv[1])); c = d[\"classes\"]; "
			 "assert [x[\"class\"] for x in c] == [\"critical\", \"reload\", "
			 "\"prefetch\"]; assert sum(x[\"requests\"] for x in c) == d[\"fetched\"]; "
			 "assert c[0][\"wait\"][\"p50_ns\"] == %llu; print(\"ok\")' %s 2>&1",
			 (unsigned long long)st.cls[0].wait.p50_ns, path);
		CHECK_MSG(run_capture(cmd, out, sizeof(out)) == 0 && !strcmp(out, "ok\n"), "%s",
			  out);
	}
	free(json);
	hyb_mempool_close(p);
	hyb_rq_close(c);
	hyb_reload_stop(r, NULL);
	hyb_copydev_close(rc.dev);
	hyb_backend_close(b);
}

/* No hybd: no file, a file whose writer died, a junk file - one line each. */
TEST(stalls_no_hybd_is_one_line)
{
	struct hyb_reload_stats st = { .fetched = 7 };
	struct hyb_stalls_hybd h;
	char path[600], *s;
	pid_t pid;
	int status;
	FILE *f;

	snprintf(path, sizeof(path), "%s/none.stats", hyb_test_tmpdir());
	hyb_stalls_read(path, &h);
	CHECK_EQ_INT(h.state, HYB_STALLS_NONE);
	s = format(text_fn, &h);
	CHECK_MSG(!strncmp(s, "no hybd running (no statistics file ", 36) && strstr(s, path) &&
		  strchr(s, '\n') == s + strlen(s) - 1, "%s", s);
	free(s);
	s = format(hyb_stalls_print_json, &h);
	CHECK_MSG(!strncmp(s, "{\"running\": false, \"stats_file\": \"", 34) &&
		  strstr(s, "\"reason\": \"no hybd running"), "%s", s);
	free(s);

	/* written by a process that is gone (a killed hybd leaves its file) */
	snprintf(path, sizeof(path), "%s/gone.stats", hyb_test_tmpdir());
	pid = fork();
	CHECK(pid >= 0);
	if (!pid)
		_exit(hyb_reload_stats_write(&st, path) ? 1 : 0);
	CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && !WEXITSTATUS(status));
	hyb_stalls_read(path, &h);
	CHECK_EQ_INT(h.state, HYB_STALLS_GONE);
	CHECK_EQ_INT(h.pid, pid);
	s = format(text_fn, &h);
	CHECK_MSG(strstr(s, "no hybd running (pid ") && strstr(s, "is gone)\n") &&
		  strchr(s, '\n') == s + strlen(s) - 1, "%s", s);
	free(s);

	snprintf(path, sizeof(path), "%s/junk.stats", hyb_test_tmpdir());
	f = fopen(path, "w");
	CHECK(f);
	fputs("hello\n", f);
	fclose(f);
	hyb_stalls_read(path, &h);
	CHECK_EQ_INT(h.state, HYB_STALLS_BAD);
	CHECK_MSG(strstr(h.why, "not a reload statistics file"), "%s", h.why);

	/* the default path is hybd's: STATE_DIR/NAME.stats */
	setenv("HYB_STATE_DIR", "/some/dir", 1);
	hyb_stalls_path(path, sizeof(path), NULL, "inst");
	CHECK_MSG(!strcmp(path, "/some/dir/inst.stats"), "%s", path);
}

/* A GGUF hybd can load: 2 layers, F16 weights. */
static const char *write_model(void)
{
	static char path[512];
	struct hyb_gguf_writer *w = hyb_gguf_writer_new();
	uint8_t *data = calloc(1, 1 << 20);
	char tn[64];
	size_t used = 0;

#define T(nm, type, a, b)                                                              \
	do {                                                                           \
		uint64_t ne_[2] = { a, b };                                            \
		CHECK(!hyb_gguf_writer_add_tensor(w, nm, type, 2, ne_, data + used));      \
		used += hyb_row_bytes(type, a) * (b);                                  \
	} while (0)
	CHECK(w && data);
	hyb_gguf_set_str(w, "general.architecture", "llama");
	hyb_gguf_set_u32(w, "llama.block_count", 2);
	hyb_gguf_set_u32(w, "llama.embedding_length", 64);
	hyb_gguf_set_u32(w, "llama.feed_forward_length", 256);
	hyb_gguf_set_u32(w, "llama.attention.head_count", 4);
	T("token_embd.weight", HYB_TYPE_F32, 64, 128);
	for (int l = 0; l < 2; l++) {
		snprintf(tn, sizeof(tn), "blk.%d.ffn_up.weight", l);
		T(tn, HYB_TYPE_F16, 64, 256);
		snprintf(tn, sizeof(tn), "blk.%d.ffn_down.weight", l);
		T(tn, HYB_TYPE_F16, 256, 64);
	}
	T("output.weight", HYB_TYPE_F16, 64, 128);
#undef T
	snprintf(path, sizeof(path), "%s/m.gguf", hyb_test_tmpdir());
	CHECK_MSG(!hyb_gguf_writer_write_file(w, path), "%s", hyb_last_error());
	hyb_gguf_writer_free(w);
	free(data);
	return path;
}

/*
 * hybd publishes the file from start to shutdown; build/hybctl stalls (when
 * built) shows it next to the queues, as JSON and as text.
 */
TEST(stalls_hybd_publishes_and_hybctl_shows)
{
	const char *model = write_model(), *dir = hyb_test_tmpdir();
	struct hyb_stalls_hybd h;
	struct hybd_config cfg;
	struct hyb_rq_cqe cqe[4];
	struct hyb_rq_req q[4];
	struct hyb_backend *app;
	struct hyb_rq *c;
	struct hybd *d;
	char err[512], path[600], cmd[2048], out[16384];
	int rc;

	hybd_config_defaults(&cfg);
	CHECK(!hybd_config_set(&cfg, "model", model, err, sizeof(err)));
	CHECK(!hybd_config_set(&cfg, "backend", "local", err, sizeof(err)));
	CHECK(!hybd_config_set(&cfg, "name", "sx", err, sizeof(err)));
	CHECK(!hybd_config_set(&cfg, "state_dir", dir, err, sizeof(err)));
	CHECK(!hybd_config_set(&cfg, "progress", "quiet", err, sizeof(err)));
	CHECK(!hybd_config_set(&cfg, "stats_interval", "0", err, sizeof(err)));
	CHECK(!hybd_config_set(&cfg, "device", "cpu", err, sizeof(err)));
	CHECK(!hybd_config_set(&cfg, "gpu_slots", "2", err, sizeof(err)));
	CHECK(!hybd_config_set(&cfg, "slot_bytes", "64K", err, sizeof(err)));
	CHECK(!hybd_config_set(&cfg, "log_level", "error", err, sizeof(err)));
	CHECK_MSG(!hybd_start(&cfg, NULL, NULL, &d, err, sizeof(err)), "%s", err);
	hyb_stalls_path(path, sizeof(path), dir, "sx");
	hyb_stalls_read(path, &h);
	CHECK_MSG(h.state == HYB_STALLS_RUNNING && h.st.fetched == 0, "%s", h.why);

	app = hyb_backend_open(HYB_BACKEND_LOCAL);
	CHECK(app);
	CHECK(!hyb_rq_attach_client(app, 0, HYB_RQ_EVENTFD_NONE, &c));
	/* evictions: no pool is read, but a request names a range */
	q[0] = req(HYB_RQ_EVICT, HYB_RQ_CRITICAL, 1, 0, 4096, 1, 1);
	q[1] = req(HYB_RQ_EVICT, HYB_RQ_LOW, 1, 0, 4096, 0, 2);
	q[2] = req(HYB_RQ_EVICT, HYB_RQ_LOW, 1, 0, 4096, 7, 3);	/* no slot 7: -EINVAL */
	CHECK_MSG(!hyb_rq_submit(c, q, 3), "%s", hyb_last_error());
	reap_n(c, cqe, 3);
	hybd_stats_tick(d);
	hyb_stalls_read(path, &h);
	CHECK_MSG(h.state == HYB_STALLS_RUNNING, "%s", h.why);
	CHECK_EQ_INT(h.st.fetched, 3);
	CHECK_EQ_INT(h.st.cls[HYB_RELOAD_CRITICAL].done, 1);
	CHECK_EQ_INT(h.st.cls[HYB_RELOAD_PREFETCH].done, 1);
	CHECK_EQ_INT(h.st.cls[HYB_RELOAD_PREFETCH].failed, 1);

	if (!access("build/hybctl", X_OK)) {
		snprintf(cmd, sizeof(cmd), "build/hybctl stalls --backend local --stats %s --json "
			 "2>&1", path);
		rc = run_capture(cmd, out, sizeof(out));
		if (strstr(out, "unrecognized option"))
			SKIP("build/hybctl predates stalls --stats (rebuild it)");
		CHECK_MSG(rc == 0 && strstr(out, "\"hybd\": {\"running\": true, \"pid\": ") &&
			  strstr(out, "{\"class\": \"prefetch\", \"requests\": 2, \"done\": 1, "
				 "\"errors\": 1, "), "rc %d: %s", rc, out);
		snprintf(cmd, sizeof(cmd), "build/hybctl stalls --backend local --stats %s --json "
			 "| python3 -c 'import json,sys; d = json.load(sys.stdin); "
			 "assert len(d[\"queues\"]) == 16 and d[\"hybd\"][\"fetched\"] == 3; "
			 "print(\"ok\")' 2>&1", path);
		rc = run_capture(cmd, out, sizeof(out));
		CHECK_MSG(rc == 0 && !strcmp(out, "ok\n"), "rc %d: %s", rc, out);
		snprintf(cmd, sizeof(cmd), "build/hybctl stalls --backend local --stats %s -w "
			 "--count 2 2>&1", path);
		rc = run_capture(cmd, out, sizeof(out));
		CHECK_MSG(rc == 0 && strstr(out, "hybd pid ") && strstr(out, "\ncritical ") &&
			  strstr(out, "REQ/S"), "rc %d: %s", rc, out);
	}
	hyb_rq_close(c);
	hyb_backend_close(app);
	hybd_stop(d, "test");
	hyb_stalls_read(path, &h);
	CHECK_EQ_INT(h.state, HYB_STALLS_NONE);
	if (!access("build/hybctl", X_OK)) {
		/* no module and no hybd: one line per part, exit 1; local: the queues, exit 0 */
		snprintf(cmd, sizeof(cmd), "build/hybctl stalls --backend local --stats %s 2>&1",
			 path);
		rc = run_capture(cmd, out, sizeof(out));
		CHECK_MSG(rc == 0 && strstr(out, "no hybd running (no statistics file "),
			  "rc %d: %s", rc, out);
		if (access("/dev/hybpool", F_OK)) {
			snprintf(cmd, sizeof(cmd), "build/hybctl stalls --stats %s 2>&1", path);
			rc = run_capture(cmd, out, sizeof(out));
			CHECK_MSG(rc == 1 && strstr(out, "no hybd running"), "rc %d: %s", rc, out);
		}
	}
}
