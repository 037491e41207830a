// SPDX-License-Identifier: MIT
/*
 * hybbox: box mode end to end inside the VM bench. The
 * model lies on an emulated NVMe drive; hybd (a separate process, kmod
 * backend) loads it into pools on both NUMA nodes; this program is the app.
 *
 *   hybbox gen MODEL N
 *       embedded mode: hyb_model_load() of the file, N greedy ids after the
 *       prompt, printed as one "ids: ..." line (the reference).
 *   hybbox box HYBD CONF MODEL IDS_FILE [kill] [hyb=PATH]
 *       drops the page cache, starts HYBD -f -c CONF, waits for its
 *       manifest, builds the model from it (hyb_model_load_manifest:
 *       read-only pool mappings) and checks: hybd read the drive with
 *       O_DIRECT, pools on two nodes, every tensor's bytes equal to the
 *       file's, writes fault, greedy ids identical to IDS_FILE; with hyb=,
 *       `hyb run --manifest vm` prints the same ids too. Then SIGTERM: hybd
 *       exits 0 and the app sees -ESHUTDOWN.
 *       With "kill": after half the tokens an UPLOAD is put in service and
 *       hybd is SIGKILLed mid-run. "A clear error, not a hang" means: the
 *       generation loop's per-token hyb_model_box_check() stops it with
 *       -EPIPE and a message naming the dead daemon; the request in flight
 *       completes with -EPIPE; new submits get -EPIPE; loading the manifest
 *       again fails with a message; the already-mapped weights stay readable
 *       and still equal the file (the kernel keeps destroyed pools while
 *       mapped) - each within a bounded time. With hyb=, a `hyb run
 *       --manifest` busy generating meanwhile exits 3 naming the dead hybd.
 *   hybbox offset MODEL TENSOR
 *       "FILE_OFF BYTES" of a tensor's data (run.sh finds its sectors).
 *   hybbox ioerr HYBD CONF MODEL BAD_OFF [hyb=PATH]
 *       MODEL lies on a drive whose reads of the sector holding byte BAD_OFF
 *       fail in QEMU's block layer. Embedded mode
 *       (O_DIRECT and buffered), `hyb run -m`, hybd -f and daemonised hybd
 *       must each fail in bounded time naming the file, a failed read and
 *       the 4096-byte block holding BAD_OFF, and publish nothing (no manifest,
 *       pools, pid file or queue daemon; an app asking gets an error).
 *       HYB_LOAD=mmap `hyb run -m` (weights read in place: the failed read
 *       is a SIGBUS) exits 1 naming a byte of that page and its tensor. Then
 *       hybd with that tensor left on storage (dram_budget) loads, fails an
 *       app's LOAD of it with -EIO (logged the same way) and keeps serving.
 *   hybbox serve HYBD CONF HYB_SERVE HYB
 *       hyb serve --manifest vm (HYB_SERVE: a dynamically linked hyb, with
 *       its HTTP library) on hybd's pools: a greedy completion over HTTP is
 *       the text `HYB run --manifest vm` prints; then hybd gets SIGTERM while
 *       a streamed completion runs: the stream still ends with [DONE] (the
 *       weights stay mapped), and the server exits 3 naming hybd's
 *       shutdown, in bounded time.
 *   hybbox hybrid HYBD CONF PLAN [hyb=PATH]
 *       hybrid decoding on hybd's cache: hybd serves PLAN
 *       (a hybctl plan model) with its CPU copy device, whose slots are a
 *       hybpool.ko pool; this process decodes in oracle mode on hybd's cache,
 *       every group load an UPLOAD on hybd's queue, and its logits must be
 *       bit-identical to CPU-only sparse decoding of the file. The cache is
 *       one app's: with hyb=, `hyb run --cache hybd` started meanwhile is
 *       refused, and once this process lets go it decodes on it. Then
 *       SIGTERM: hybd exits 0 and its slots pool is gone.
 *
 * Exit 0 when every check holds; details indented on stdout, measurements as
 * "HYBVM METRIC" lines.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <jansson.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cpu_kernels.h"
#include "hyb/generate.h"
#include "hyb/gguf.h"
#include "hyb/hybrid.h"
#include "hyb/manifest.h"
#include "hyb/model.h"
#include "hyb/testing.h"
#include "hyb/pool.h"
#include "hyb/sampler.h"
#include "hyb/tokenizer.h"
#include "../unit/as_seen.h"

#define PROMPT "Once upon a time in a box"
#define MAX_IDS 256
#define QUEUE 3		/* the hybd config's queue (hybtest uses the low ones) */

static pid_t daemon_pid, hyb_pid;
static bool daemon_started;

static void show_log(void);

static _Noreturn void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static _Noreturn void die(const char *fmt, ...)
{
	va_list ap;

	printf("  hybbox: ");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
	if (daemon_pid > 0)
		kill(daemon_pid, SIGKILL);
	if (hyb_pid > 0)
		kill(hyb_pid, SIGKILL);
	if (daemon_started) {
		printf("  hybd's log:\n");
		show_log();
	}
	exit(1);
}

static void note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void note(const char *fmt, ...)
{
	va_list ap;

	printf("  ");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
}

static void metric(const char *name, double v, const char *unit)
{
	printf("HYBVM METRIC %s %.3f %s\n", name, v, unit);
	fflush(stdout);
}

static double ms_since(double t0)
{
	return (hyb_now() - t0) * 1e3;
}

/* -- generation -------------------------------------------------------------- */

struct run {
	const struct hyb_model *m;
	int32_t ids[MAX_IDS];
	uint32_t n;
	uint32_t stop_after;	/* 0: never */
	bool check_box;
	int box_err;		/* what hyb_model_box_check said when it stopped us */
	char box_msg[512];	/* and its message (hyb_last_error) */
};

static int on_token(void *arg, int32_t tok)
{
	struct run *r = arg;

	if (r->n < MAX_IDS)
		r->ids[r->n++] = tok;
	if (r->check_box) {
		r->box_err = hyb_model_box_check(r->m);
		if (r->box_err) {
			snprintf(r->box_msg, sizeof(r->box_msg), "%s", hyb_last_error());
			return 1;
		}
	}
	return r->stop_after && r->n >= r->stop_after;
}

static int32_t *prompt_ids(const struct hyb_model *m, int *n)
{
	static int32_t ids[64];

	if (!m->tok)
		die("the model has no tokenizer");
	*n = hyb_tokenize(m->tok, PROMPT, strlen(PROMPT), true, ids, 64);
	if (*n <= 0 || *n > 64)
		die("cannot tokenize the prompt");
	return ids;
}

static struct hyb_ctx *new_ctx(const struct hyb_model *m)
{
	struct hyb_ctx_params p = { .n_ctx = 512, .n_threads = 1 };
	struct hyb_ctx *c = hyb_ctx_new(m, &p);

	if (!c)
		die("context: %s", hyb_last_error());
	return c;
}

/* Greedy generation of up to n tokens after prompt (the whole prompt when n_prompt > 0). */
static void generate(struct hyb_ctx *c, struct run *r, const int32_t *prompt, int n_prompt,
		     uint32_t n)
{
	struct hyb_sampler_params sp = hyb_sampler_defaults();
	struct hyb_gen_stats st;
	struct hyb_sampler *s;

	sp.temperature = 0;
	s = hyb_sampler_new(&sp, (int32_t)r->m->hp.n_vocab);
	if (!s)
		die("sampler");
	if (hyb_generate(c, r->m, s, prompt, (uint32_t)n_prompt, n, on_token, r, &st))
		die("generate: %s", hyb_last_error());
	hyb_sampler_free(s);
}

static int cmd_gen(const char *model, uint32_t n)
{
	double t0 = hyb_now(), t1, t2;
	struct hyb_model *m = hyb_model_load(model);
	struct run r = { .m = m };
	struct hyb_ctx *c;
	int32_t *p;
	int np;

	if (!m)
		die("%s", hyb_last_error());
	t1 = hyb_now();
	p = prompt_ids(m, &np);
	c = new_ctx(m);
	t2 = hyb_now();
	generate(c, &r, p, np, n);
	fprintf(stderr, "embedded mode: load %.0f ms, tokenize+context %.0f ms, %u tokens %.0f ms "
		"(%s kernels)\n", (t1 - t0) * 1e3, (t2 - t1) * 1e3, r.n, ms_since(t2),
		hyb_cpu_best()->name);
	printf("ids:");
	for (uint32_t i = 0; i < r.n; i++)
		printf(" %d", r.ids[i]);
	printf("\n");
	hyb_ctx_free(c);
	hyb_model_free(m);
	return 0;
}

/* -- box mode ---------------------------------------------------------------- */

static uint32_t read_ids(const char *path, int32_t *ids)
{
	FILE *f = fopen(path, "r");
	char word[32];
	uint32_t n = 0;

	if (!f || fscanf(f, "%31s", word) != 1 || strcmp(word, "ids:"))
		die("%s: no 'ids:' line (did the embedded run work?)", path);
	while (n < MAX_IDS && fscanf(f, "%d", &ids[n]) == 1)
		n++;
	fclose(f);
	if (!n)
		die("%s: no ids", path);
	return n;
}

/* hybd -f -c CONF [-o KEY=VALUE]..., its output to /tmp/hybd.log. */
static pid_t start_hybd_with(const char *bin, const char *conf, const char *const *sets)
{
	const char *argv[32] = { bin, "-f", "-c", conf };
	int n = 4;
	pid_t pid;

	for (; sets && *sets; sets++) {
		if (n >= 30)
			die("too many hybd settings");
		argv[n++] = "-o";
		argv[n++] = *sets;
	}
	argv[n] = NULL;
	pid = fork();

	if (pid < 0)
		die("fork: %s", strerror(errno));
	if (!pid) {
		int fd = open("/tmp/hybd.log", O_WRONLY | O_CREAT | O_TRUNC, 0644);

		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		execv(bin, (char *const *)argv);
		_exit(127);
	}
	return pid;
}

static pid_t start_hybd(const char *bin, const char *conf)
{
	return start_hybd_with(bin, conf, NULL);
}

static void drop_caches(void)
{
	int fd = open("/proc/sys/vm/drop_caches", O_WRONLY);

	sync();
	if (fd < 0 || write(fd, "3\n", 2) != 2)
		die("cannot drop the page cache: %s", strerror(errno));
	close(fd);
}

/* "key=N" from hybd's load_done log line, -1 when absent. */
static long log_value(const char *key)
{
	char line[1024], *p;
	FILE *f = fopen("/tmp/hybd.log", "r");
	long v = -1;

	while (f && fgets(line, sizeof(line), f))
		if (strstr(line, "event=load_done") && (p = strstr(line, key)))
			v = strtol(p + strlen(key), NULL, 10);
	if (f)
		fclose(f);
	return v;
}

static void show_log(void)
{
	char line[512];
	FILE *f = fopen("/tmp/hybd.log", "r");

	while (f && fgets(line, sizeof(line), f))
		printf("  | %s", line);
	if (f)
		fclose(f);
}

/* Waits for hybd's manifest pool; the model built from it. */
static struct hyb_model *wait_ready(pid_t pid, const char *name, double *ready_ms)
{
	double t0 = hyb_now();
	struct hyb_model *m = NULL;
	int st;

	while (!m && ms_since(t0) < 60000) {
		if (waitpid(pid, &st, WNOHANG) == pid) {
			daemon_pid = 0;
			die("hybd exited (status %#x) before it was ready", st);
		}
		m = hyb_model_load_manifest(name);
		if (!m)
			usleep(20000);
	}
	if (!m) {
		die("no model from the manifest after 60 s: %s", hyb_last_error());
	}
	*ready_ms = ms_since(t0);
	return m;
}

/* Every resident tensor's bytes, as the app maps them, equal the file's. */
static void check_bytes(const struct hyb_model *m, const char *model)
{
	const struct hyb_manifest *mf = hyb_model_manifest(m);
	struct hyb_manifest_info mi;
	int fd = open(model, O_RDONLY);
	uint64_t total = 0;
	uint8_t *buf = NULL;
	size_t cap = 0;

	if (fd < 0)
		die("%s: %s", model, strerror(errno));
	hyb_manifest_info(mf, &mi);
	for (uint32_t i = 0; i < mi.n_tensors; i++) {
		const struct hyb_manifest_tensor *t = hyb_manifest_tensor(mf, i);
		const struct hyb_gguf_tensor *gt = NULL;

		for (uint64_t k = 0; k < m->gguf->n_tensors && !gt; k++)
			if (hyb_gguf_str_eq(m->gguf->tensors[k].name, t->name))
				gt = &m->gguf->tensors[k];
		if (!gt)
			die("tensor %s: not in the model", t->name);
		if (t->bytes > cap) {
			cap = t->bytes;
			buf = realloc(buf, cap);
			if (!buf)
				die("out of memory");
		}
		if (pread(fd, buf, t->bytes, (off_t)t->file_off) != (ssize_t)t->bytes)
			die("%s: short read", model);
		if (memcmp(buf, gt->data, t->bytes))
			die("tensor %s: the pool bytes differ from the file", t->name);
		total += t->bytes;
	}
	free(buf);
	close(fd);
	note("%u tensors, %.2f MiB: pool bytes identical to the file on NVMe", mi.n_tensors,
	     total / 1048576.0);
}

/* The weights live on both nodes (interleave placement), in read-only mappings. */
static void check_placement(const struct hyb_model *m)
{
	const struct hyb_manifest *mf = hyb_model_manifest(m);
	struct hyb_manifest_info mi;
	unsigned int on_node[2] = { 0, 0 };
	pid_t pid;
	int st;

	hyb_manifest_info(mf, &mi);
	for (uint32_t i = 0; i < mi.n_pools; i++) {
		const struct hyb_mf_pool *p = hyb_manifest_pool(mf, i);
		struct hyb_mempool_info pi;

		if (p->role != HYB_MF_ROLE_WEIGHTS || !p->used)
			continue;
		if (hyb_mempool_stat(m->image_backend, p->id, &pi))
			die("pool %s: %s", p->name, hyb_last_error());
		if (pi.node != p->node || pi.node < 0 || pi.node > 1)
			die("pool %s is on node %d, the manifest says %d", p->name, pi.node,
			    p->node);
		if (!(pi.flags & HYB_MEMPOOL_F_KERNEL))
			die("pool %s is not a hybpool.ko pool", p->name);
		on_node[pi.node]++;
		note("pool %s: node %d, %.2f MiB of tensors", p->name, pi.node, p->used / 1048576.0);
	}
	if (!on_node[0] || !on_node[1])
		die("weights on node 0: %u pools, node 1: %u (want both; %s)", on_node[0],
		    on_node[1], mi.placement);
	for (uint32_t l = 0; l < m->hp.n_layer; l++) {
		char name[64];
		const struct hyb_manifest_tensor *t;

		snprintf(name, sizeof(name), "blk.%u.ffn_up.weight", l);
		t = hyb_manifest_find(mf, name);
		if (!t || t->node != (int32_t)(l % 2))
			die("%s on node %d, interleave wants %u", name, t ? t->node : -1, l % 2);
	}
	pid = fork();
	if (!pid) {
		*(volatile uint8_t *)m->layers[0].wq.data = 1;
		_exit(0);
	}
	if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFSIGNALED(st) || WTERMSIG(st) != SIGSEGV)
		die("a write to the mapped weights did not fault (status %#x)", st);
	note("placement '%s': layers alternate nodes 0/1; writes to the weights fault",
	     mi.placement);
}

static void compare_ids(const int32_t *want, uint32_t n_want, const struct run *r, uint32_t n,
			const char *what)
{
	if (r->n < n || n > n_want)
		die("%s: %u ids, want %u", what, r->n, n);
	for (uint32_t i = 0; i < n; i++)
		if (r->ids[i] != want[i])
			die("%s: id %u is %d, embedded mode gave %d", what, i, r->ids[i], want[i]);
}

static int wait_exit(pid_t pid, double limit_ms)
{
	double t0 = hyb_now();
	int st;

	while (ms_since(t0) < limit_ms) {
		if (waitpid(pid, &st, WNOHANG) == pid)
			return st;
		usleep(10000);
	}
	return -1;
}

static void print_text(const struct hyb_model *m, const struct run *r)
{
	char piece[64];
	unsigned char text[1024];
	size_t k = 0;

	for (uint32_t i = 0; i < r->n; i++) {
		int n = hyb_token_to_piece(m->tok, r->ids[i], piece, sizeof(piece));

		if (n > 0 && k + (size_t)n < sizeof(text) - 1) {
			memcpy(text + k, piece, (size_t)n);
			k += (size_t)n;
		}
	}
	text[k] = 0;
	/* a random model's text: escape what is not printable ASCII (the console is parsed) */
	for (size_t i = 0; i < k; i++)
		if (text[i] < 0x20 || text[i] > 0x7e)
			text[i] = '.';
	note("text: \"%s%s\"", PROMPT, text);
}

/* -- `hyb run --manifest` (tools/hyb/cli_manifest.c) as a second app ---------- */

/* Starts `HYB run --manifest vm -p PROMPT -n N --print-ids -t 1`, output to files. */
static pid_t start_hyb_run(const char *hyb, uint32_t n)
{
	char num[16];
	pid_t pid;

	snprintf(num, sizeof(num), "%u", n);
	pid = fork();
	if (pid < 0)
		die("fork: %s", strerror(errno));
	if (!pid) {
		int out = open("/tmp/hyb.out", O_WRONLY | O_CREAT | O_TRUNC, 0644);
		int err = open("/tmp/hyb.err", O_WRONLY | O_CREAT | O_TRUNC, 0644);

		if (out >= 0 && err >= 0) {
			dup2(out, 1);
			dup2(err, 2);
		}
		execl(hyb, hyb, "run", "--manifest", "vm", "-p", PROMPT, "-n", num, "--print-ids",
		      "-t", "1", (char *)NULL);
		_exit(127);
	}
	return pid;
}

static char *slurp(const char *path)
{
	static char buf[8192];
	FILE *f = fopen(path, "r");
	size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;

	if (f)
		fclose(f);
	buf[n] = 0;
	return buf;
}

/* 1: `hyb run` knows --manifest; 0: not hooked into tools/hyb/cli.c yet (noted). */
static int hyb_hooked(int st, const char *err)
{
	if (WIFEXITED(st) && WEXITSTATUS(st) == 2 && strstr(err, "manifest")) {
		note("hyb run --manifest: not wired into tools/hyb/cli.c yet (not tested)");
		return 0;
	}
	return 1;
}

static void check_hyb_run(const char *hyb, const int32_t *want, uint32_t n_want)
{
	pid_t pid = start_hyb_run(hyb, n_want);
	int st = wait_exit(pid, 60000);
	char *err, *ids;
	struct run r = { .n = 0 };
	int k = 0, v;

	if (st < 0) {
		kill(pid, SIGKILL);
		die("hyb run --manifest did not finish in 60 s");
	}
	err = slurp("/tmp/hyb.err");
	if (!hyb_hooked(st, err))
		return;
	if (!WIFEXITED(st) || WEXITSTATUS(st))
		die("hyb run --manifest: status %#x: %s", st, err);
	ids = strstr(err, "ids:");
	if (!ids)
		die("hyb run --manifest printed no ids: %s", err);
	ids += 4;
	while (r.n < MAX_IDS && sscanf(ids, "%d%n", &v, &k) == 1) {
		r.ids[r.n++] = v;
		ids += k;
	}
	compare_ids(want, n_want, &r, n_want, "hyb run --manifest");
	note("hyb run --manifest vm: the same %u ids", n_want);
}

static int cmd_box(const char *bin, const char *conf, const char *model, const char *ids_path,
		   const char *hyb, bool kill_it)
{
	int32_t want[MAX_IDS], *prompt;
	uint32_t n_want = read_ids(ids_path, want);
	struct hyb_manifest_info mi;
	struct hyb_model *m;
	struct hyb_ctx *c;
	struct run r = { .check_box = true };
	double ready_ms, t0;
	int np, st;

	/* a cold start: hybd must read the drive (O_DIRECT), not the page cache */
	drop_caches();
	daemon_pid = start_hybd(bin, conf);
	daemon_started = true;
	m = wait_ready(daemon_pid, "vm", &ready_ms);
	r.m = m;
	hyb_manifest_info(hyb_model_manifest(m), &mi);
	if (mi.pid != daemon_pid)
		die("the manifest names pid %d, hybd is %d", mi.pid, daemon_pid);
	note("hybd (pid %d) ready in %.0f ms; the app built the model from pool vm.manifest",
	     daemon_pid, ready_ms);
	metric(kill_it ? "box_hybd_ready_ms_kill_run" : "box_hybd_ready_ms", ready_ms, "ms");
	prompt = prompt_ids(m, &np);
	c = new_ctx(m);

	if (!kill_it) {
		long direct = log_value(" reads_direct="), reads = log_value(" reads=");

		if (direct <= 0)
			die("hybd read the model without O_DIRECT (reads_direct=%ld of %ld)", direct,
			    reads);
		note("hybd streamed it from NVMe with O_DIRECT into the pools (%ld of %ld reads)",
		     direct, reads);
		check_placement(m);
		check_bytes(m, model);
		t0 = hyb_now();
		generate(c, &r, prompt, np, n_want);
		if (r.box_err)
			die("hybd went away during the run: %s", r.box_msg);
		compare_ids(want, n_want, &r, n_want, "box mode");
		note("%u greedy ids identical to embedded mode (%.0f ms)", r.n, ms_since(t0));
		print_text(m, &r);
		if (hyb)
			check_hyb_run(hyb, want, n_want);
		kill(daemon_pid, SIGTERM);
		st = wait_exit(daemon_pid, 20000);
		if (st < 0)
			die("hybd did not exit within 20 s of SIGTERM");
		daemon_pid = 0;
		if (!WIFEXITED(st) || WEXITSTATUS(st)) {
			die("hybd exited with status %#x after SIGTERM, want 0", st);
		}
		if (hyb_model_box_check(m) != -ESHUTDOWN)
			die("after SIGTERM hyb_model_box_check did not say -ESHUTDOWN");
		note("SIGTERM: hybd exited 0; the app is told: %s", hyb_last_error());
	} else {
		struct hyb_rq_req q = { 0 };
		struct hyb_rq_cqe cqe;
		struct hyb_rq_stats rs;
		struct hyb_rq *rq;
		const struct hyb_manifest_tensor *t = hyb_manifest_find(hyb_model_manifest(m),
									"token_embd.weight");
		uint32_t half = n_want / 2;
		int32_t last;
		int ret;

		/* a second app, `hyb run --manifest`, busy when the kill comes */
		if (hyb)
			hyb_pid = start_hyb_run(hyb, 400);
		/* first half of the run with hybd alive */
		r.stop_after = half;
		generate(c, &r, prompt, np, n_want);
		compare_ids(want, n_want, &r, half, "box mode before the kill");
		/* a request in service: a paced upload (1 MiB at copy_bandwidth 1M) */
		if (!t || hyb_rq_attach_client(m->image_backend, QUEUE, HYB_RQ_EVENTFD_NONE, &rq))
			die("attach to queue %d: %s", QUEUE, hyb_last_error());
		q.op = HYB_RQ_UPLOAD;
		q.prio = HYB_RQ_LOW;
		q.pool_id = t->pool_id;
		q.pool_off = 0;
		q.len = 1 << 20;
		q.aux = 0;
		q.tag = 7;
		if (hyb_rq_submit(rq, &q, 1))
			die("submit: %s", hyb_last_error());
		t0 = hyb_now();
		do {
			usleep(5000);
			if (hyb_rq_stats(m->image_backend, QUEUE, &rs))
				die("queue stats: %s", hyb_last_error());
		} while (!rs.in_service && ms_since(t0) < 5000);
		if (!rs.in_service)
			die("hybd did not take the upload in 5 s");

		/* SIGKILL mid-run: the rest of the run must stop with a clear error */
		kill(daemon_pid, SIGKILL);
		t0 = hyb_now();
		r.stop_after = 0;
		last = r.ids[r.n - 1];
		generate(c, &r, &last, 1, MAX_IDS - r.n - 1);
		/* (an end-of-generation token may end the run first: then poll) */
		while (!r.box_err && ms_since(t0) < 5000) {
			usleep(1000);
			r.box_err = hyb_model_box_check(m);
			if (r.box_err)
				snprintf(r.box_msg, sizeof(r.box_msg), "%s", hyb_last_error());
		}
		if (r.box_err != -EPIPE)
			die("after SIGKILL the run %s (box check %d: %s)",
			    r.box_err ? "stopped with the wrong error" : "did not stop", r.box_err,
			    r.box_msg);
		metric("box_kill_detect_ms", ms_since(t0), "ms");
		note("hybd SIGKILLed after %u tokens: the run stopped %.1f ms later, after %u more "
		     "token(s), with -EPIPE: %s", half, ms_since(t0), r.n - half, r.box_msg);
		compare_ids(want, n_want, &r, r.n < n_want ? r.n : n_want,
			    "tokens decoded meanwhile");

		/* the upload in service when it died */
		ret = hyb_rq_reap(rq, &cqe, 1, 1, 5000000000ull);
		if (!(ret == 1 && cqe.status == -EPIPE && cqe.tag == 7) && ret != -EPIPE)
			die("the upload in flight: reap %d status %d, want -EPIPE", ret,
			    ret == 1 ? cqe.status : 0);
		metric("box_kill_reap_ms", ms_since(t0), "ms");
		/* (a NOP: the upload's pool is gone with hybd, which a submit checks first) */
		memset(&q, 0, sizeof(q));
		q.op = HYB_RQ_NOP;
		ret = hyb_rq_submit(rq, &q, 1);
		if (ret != -EPIPE)
			die("a submit after the death gave %d (%s), want -EPIPE", ret, strerror(-ret));
		note("the upload in flight failed with -EPIPE (%.1f ms after the kill); new "
		     "submits get -EPIPE", ms_since(t0));
		hyb_rq_close(rq);
		if (hyb_model_load_manifest("vm"))
			die("the manifest of a dead hybd still loads");
		note("loading it again: %s", hyb_last_error());
		st = wait_exit(daemon_pid, 5000);
		daemon_pid = 0;
		if (st < 0 || !WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL)
			die("hybd status %#x, want killed", st);
		check_bytes(m, model);
		note("the weights mapped before the death are still readable");
		if (hyb_pid) {
			char *err;

			st = wait_exit(hyb_pid, 5000);
			if (st < 0)
				die("hyb run --manifest still runs 5 s after hybd died");
			hyb_pid = 0;
			err = slurp("/tmp/hyb.err");
			if (hyb_hooked(st, err)) {
				if (!WIFEXITED(st) || WEXITSTATUS(st) != 3 || !strstr(err, "is gone"))
					die("hyb run --manifest: status %#x, want exit 3 and 'hybd "
					    "... is gone': %s", st, err);
				err = strstr(err, "hyb: hybd");
				err[strcspn(err, "\n")] = 0;
				note("hyb run --manifest, killed under it too: exit 3, \"%s\"", err);
			}
		}
	}
	hyb_ctx_free(c);
	hyb_model_free(m);
	return 0;
}

/* -- a drive that fails reads ------------------------------ */

/*
 * hybbox offset MODEL TENSOR: "FILE_OFF BYTES" of a tensor's data, for run.sh
 * to find the drive sectors that hold it (debugfs bmap).
 */
static int cmd_offset(const char *model, const char *name)
{
	struct hyb_gguf_file *f;

	if (hyb_gguf_open(model, &f))
		die("%s", hyb_last_error());
	for (uint64_t i = 0; i < f->n_tensors; i++) {
		const struct hyb_gguf_tensor *t = &f->tensors[i];

		if (hyb_gguf_str_eq(t->name, name)) {
			printf("%llu %llu\n", (unsigned long long)(f->data_offset + t->offset),
			       (unsigned long long)t->nbytes);
			hyb_gguf_close(f);
			return 0;
		}
	}
	die("%s: no tensor %s", model, name);
}

/*
 * Is err the stream engine's report of the failed read: the model file named,
 * "read of N bytes at offset X failed: REASON" with X <= bad < X + N, the
 * reason a read error (EIO, or ENODATA: Linux's errno for an NVMe medium
 * error under O_DIRECT), and "the first bad block is bytes [B, B + 4096)"
 * holding bad? The reason goes to why.
 */
static bool names_bad_read(const char *err, const char *model, uint64_t bad, char *why,
			   size_t whylen)
{
	const char *p = strstr(err, "read of "), *q = strstr(err, "first bad block is bytes [");
	unsigned long long x, b0 = 0, b1 = 0;
	unsigned int n;
	int k = 0;

	snprintf(why, whylen, "(none)");
	if (!p || sscanf(p, "read of %u bytes at offset %llu failed: %n", &n, &x, &k) != 2 || !k)
		return false;
	snprintf(why, whylen, "%.*s", (int)strcspn(p + k, "\"\n"), p + k);
	if (!q || sscanf(q, "first bad block is bytes [%llu, %llu)", &b0, &b1) != 2)
		return false;
	return strstr(err, model) && x <= bad && bad < x + n && b0 <= bad && bad < b1 &&
	       b1 - b0 == 4096 &&
	       (!strncmp(why, strerror(EIO), strlen(strerror(EIO))) ||
		!strncmp(why, strerror(ENODATA), strlen(strerror(ENODATA))));
}

/* fork + exec argv, stdout and stderr to files; the pid. */
static pid_t spawn(const char *const *argv, const char *out, const char *err)
{
	pid_t pid = fork();

	if (pid < 0)
		die("fork: %s", strerror(errno));
	if (!pid) {
		int o = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		int e = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);

		if (o >= 0 && e >= 0) {
			dup2(o, 1);
			dup2(e, 2);
		}
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	return pid;
}

/* spawn, then its wait status; a program still running after ms is killed: what hangs. */
static int spawn_wait(const char *const *argv, const char *out, const char *err, int ms,
		      const char *what)
{
	pid_t pid = spawn(argv, out, err);
	int st = wait_exit(pid, ms);

	if (st < 0) {
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
		die("%s: still running after %d s", what, ms / 1000);
	}
	return st;
}

/* The first line of text that contains key ("" when none), without its newline. */
static const char *line_with(const char *text, const char *key)
{
	static char line[1024];
	const char *p = strstr(text, key), *b = p;

	line[0] = 0;
	if (!p)
		return line;
	while (b > text && b[-1] != '\n')
		b--;
	snprintf(line, sizeof(line), "%.*s", (int)strcspn(b, "\n"), b);
	return line;
}

/* Embedded mode, hyb_model_load(): no model, and the reason names the bad read. */
static void ioerr_embedded(const char *model, uint64_t bad, bool buffered)
{
	char why[128];
	struct hyb_model *m;
	double t0;

	/* (the engine's test switch for a filesystem without O_DIRECT) */
	if (buffered)
		setenv("HYB_STREAM_REFUSE_DIRECT", "1", 1);
	drop_caches();
	t0 = hyb_now();
	m = hyb_model_load(model);
	unsetenv("HYB_STREAM_REFUSE_DIRECT");
	if (m)
		die("embedded mode (%s): the model loaded although the drive fails byte %llu",
		    buffered ? "buffered" : "O_DIRECT", (unsigned long long)bad);
	if (!names_bad_read(hyb_last_error(), model, bad, why, sizeof(why)))
		die("embedded mode (%s): the error does not name %s, a read and the block holding "
		    "byte %llu with EIO/ENODATA: %s", buffered ? "buffered" : "O_DIRECT", model,
		    (unsigned long long)bad, hyb_last_error());
	note("embedded mode, %s reads: no model after %.0f ms: %s",
	     buffered ? "buffered" : "O_DIRECT", ms_since(t0), hyb_last_error());
	metric(buffered ? "ioerr_embedded_buffered_fail_ms" : "ioerr_embedded_direct_fail_ms",
	       ms_since(t0), "ms");
}

/* `hyb run -m MODEL`: exit 1, the bad read on stderr, no tokens. */
static void ioerr_hyb_run(const char *hyb, const char *model, uint64_t bad)
{
	const char *argv[] = { hyb, "run", "-m", model, "-p", PROMPT, "-n", "4", "--print-ids",
			       "-t", "1", NULL };
	double t0 = hyb_now();
	char why[128], *err;
	bool tokens;
	int st;

	drop_caches();
	st = spawn_wait(argv, "/tmp/hyb.out", "/tmp/hyb.err", 60000,
			"hyb run -m after the drive failed a read");
	tokens = strstr(slurp("/tmp/hyb.out"), "ids:") != NULL;
	err = slurp("/tmp/hyb.err");	/* (one static buffer) */
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 1 || tokens || strstr(err, "ids:"))
		die("hyb run -m: status %#x (want exit 1, no tokens): %s", st, err);
	if (!names_bad_read(err, model, bad, why, sizeof(why)))
		die("hyb run -m: the error does not name the bad read: %s", err);
	note("hyb run -m: exit 1 after %.0f ms, no tokens: \"%s\"", ms_since(t0),
	     line_with(err, "read of"));
}

/*
 * `HYB_LOAD=mmap hyb run -m MODEL`: the weights are computed in place, so the
 * failed read surfaces as SIGBUS when a kernel first touches the bad page.
 * The map guard (libhyb/format/map_guard.h) must turn it into exit 1 and a line
 * naming the file, a byte in the bad page and the tensor holding it - not a
 * death by signal.
 */
static void ioerr_hyb_run_mmap(const char *hyb, const char *model, uint64_t bad)
{
	const char *argv[] = { hyb, "run", "-m", model, "-p", PROMPT, "-n", "4", "--print-ids",
			       "-t", "1", NULL };
	double t0 = hyb_now();
	unsigned long long byte = 0;
	char name[128] = "", *err;
	const char *p;
	int st, k = 0;

	drop_caches();
	setenv("HYB_LOAD", "mmap", 1);
	st = spawn_wait(argv, "/tmp/hyb.out", "/tmp/hyb.err", 60000,
			"HYB_LOAD=mmap hyb run -m after the drive failed a read");
	unsetenv("HYB_LOAD");
	if (WIFSIGNALED(st))
		die("HYB_LOAD=mmap hyb run -m: killed by signal %d (%s), want exit 1 and a report",
		    WTERMSIG(st), strsignal(WTERMSIG(st)));
	err = slurp("/tmp/hyb.err");	/* (one static buffer) */
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 1)
		die("HYB_LOAD=mmap hyb run -m: status %#x (want exit 1): %s", st, err);
	p = strstr(err, "cannot read byte ");
	if (!strstr(err, model) || !p ||
	    sscanf(p, "cannot read byte %llu (tensor %127[^,],%n", &byte, name, &k) != 2 || !k ||
	    byte / 4096 != bad / 4096 || strcmp(name, "blk.1.ffn_up.weight"))
		die("HYB_LOAD=mmap hyb run -m: the report does not name byte %llu's page and "
		    "blk.1.ffn_up.weight: %s", (unsigned long long)bad, err);
	note("HYB_LOAD=mmap hyb run -m: exit 1 after %.0f ms: \"%s\"", ms_since(t0),
	     line_with(err, "cannot read"));
}

/* Pools of the kmod backend whose names start with prefix; listed in names. */
static unsigned int pools_named(const char *prefix, char *names, size_t len)
{
	struct hyb_backend *b = hyb_backend_open(HYB_BACKEND_KMOD);
	uint32_t ids[HYB_MEMPOOL_MAX];
	unsigned int found = 0;
	int n;

	if (!b)
		die("kmod backend: %s", hyb_last_error());
	names[0] = 0;
	n = hyb_mempool_list(b, ids, HYB_MEMPOOL_MAX);
	if (n < 0)
		die("pool list: %s", hyb_last_error());
	for (int i = 0; i < n; i++) {
		struct hyb_mempool_info pi;
		size_t k = strlen(names);

		if (hyb_mempool_stat(b, ids[i], &pi) || strncmp(pi.name, prefix, strlen(prefix)))
			continue;
		found++;
		snprintf(names + k, len - k, " %s", pi.name);
	}
	hyb_backend_close(b);
	return found;
}

/*
 * hybd, in the foreground: while it loads, the app never gets a model from the
 * manifest; hybd exits 1 in bounded time; its log says which read failed; and
 * nothing is left published: no manifest pool or file, no weight pools, no
 * pid file, no daemon on its reload queue.
 */
static void ioerr_hybd(const char *bin, const char *conf, const char *model, uint64_t bad)
{
	static char set_model[600];
	const char *sets[] = { set_model, "name=bad", "state_dir=/tmp/hybd-bad", NULL };
	char why[128], names[512];
	struct hyb_backend *b;
	struct hyb_rq_stats qs;
	double t0 = hyb_now();
	int st = -1, polls = 0;
	char *log;

	snprintf(set_model, sizeof(set_model), "model=%s", model);
	drop_caches();
	daemon_pid = start_hybd_with(bin, conf, sets);
	daemon_started = true;
	while (ms_since(t0) < 60000) {
		struct hyb_model *m;

		if (waitpid(daemon_pid, &st, WNOHANG) == daemon_pid)
			break;
		st = -1;
		/* what an app waiting for the box sees meanwhile */
		m = hyb_model_load_manifest("bad");
		if (m)
			die("the app got a model from the manifest although hybd's load failed");
		polls++;
		usleep(5000);
	}
	if (st == -1)
		die("hybd still runs 60 s after the drive failed a read");
	daemon_pid = 0;
	log = slurp("/tmp/hybd.log");
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 1)
		die("hybd: status %#x after the failed load, want exit 1", st);
	if (!names_bad_read(line_with(log, "read of"), model, bad, why, sizeof(why)) ||
	    !strstr(line_with(log, "read of"), "error"))
		die("hybd's log has no error naming %s, a read and the block holding byte %llu",
		    model, (unsigned long long)bad);
	if (strstr(log, "event=load_done") || strstr(log, "event=ready"))
		die("hybd logged load_done/ready for a load that failed");
	note("hybd -f: exit 1 after %.0f ms (the app polled the manifest %d times, never a "
	     "model); its log: %s", ms_since(t0), polls, line_with(log, "read of"));
	metric("ioerr_hybd_exit_ms", ms_since(t0), "ms");

	if (hyb_model_load_manifest("bad"))
		die("a manifest of the failed load can be loaded");
	if (pools_named("bad.", names, sizeof(names)))
		die("pools of the failed load are left:%s", names);
	if (!access("/tmp/hybd-bad/bad.manifest", F_OK) || !access("/tmp/hybd-bad/bad.pid", F_OK))
		die("a manifest or pid file of the failed load is left in /tmp/hybd-bad");
	b = hyb_backend_open(HYB_BACKEND_KMOD);
	if (!b || hyb_rq_stats(b, QUEUE, &qs))
		die("queue %d stats: %s", QUEUE, hyb_last_error());
	if (qs.live)
		die("a daemon (pid %d) is still attached to queue %d", qs.daemon_pid, QUEUE);
	hyb_backend_close(b);
	hyb_model_load_manifest("bad");
	note("nothing published: no pools bad.*, no manifest file, queue %d free; an app asking "
	     "now is told: %s", QUEUE, hyb_last_error());
}

/* Is a process named hybd alive (a zombie counts: nobody reaped it yet)? */
static bool hybd_alive(void)
{
	DIR *d = opendir("/proc");
	struct dirent *e;
	bool alive = false;

	while (d && !alive && (e = readdir(d))) {
		char path[300], comm[32];
		FILE *f;

		if (e->d_name[0] < '0' || e->d_name[0] > '9')
			continue;
		snprintf(path, sizeof(path), "/proc/%s/comm", e->d_name);
		f = fopen(path, "r");
		if (!f)
			continue;
		alive = fgets(comm, sizeof(comm), f) && !strcmp(comm, "hybd\n");
		fclose(f);
	}
	if (d)
		closedir(d);
	return alive;
}

/*
 * hybd as a daemon (no -f): the starting process waits for the daemon's word,
 * so it must exit 1 with "did not start:" and the bad read, and the daemon
 * must be gone.
 */
static void ioerr_hybd_daemon(const char *bin, const char *conf, const char *model,
			      uint64_t bad)
{
	const char *argv[] = { bin, "-c", conf, "-m", model, "-n", "bad", "-o",
			       "state_dir=/tmp/hybd-bad", NULL };
	double t0 = hyb_now(), ms;
	char why[128], *err;
	int st;

	drop_caches();
	st = spawn_wait(argv, "/tmp/hybd.out", "/tmp/hybd.err", 60000,
			"hybd (daemon) after the drive failed a read");
	ms = ms_since(t0);
	err = slurp("/tmp/hybd.err");
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 1 || !strstr(err, "did not start") ||
	    !names_bad_read(err, model, bad, why, sizeof(why)))
		die("hybd (daemon): status %#x, want exit 1 and 'did not start: ...' naming the "
		    "bad read: %s", st, err);
	while (hybd_alive() && ms_since(t0) < 65000)
		usleep(10000);
	if (hybd_alive())
		die("the daemonised hybd is still alive after its failed load");
	note("hybd (daemon): exit 1 after %.0f ms, the daemon gone after %.0f ms: \"%s\"", ms,
	     ms_since(t0), line_with(err, "did not start"));
}

/* One LOAD of [file_off, +bytes) into page pool pool_id at 0; the completion's status. */
static int reload(struct hyb_rq *rq, uint32_t pool_id, const struct hyb_manifest_tensor *t,
		  uint64_t tag, double *ms)
{
	struct hyb_rq_req q = {
		.op = HYB_RQ_LOAD, .prio = HYB_RQ_CRITICAL, .pool_id = pool_id, .pool_off = 0,
		.len = t->bytes, .aux = t->file_off, .tag = tag,
	};
	struct hyb_rq_cqe cqe;
	double t0 = hyb_now();
	int ret;

	if (hyb_rq_submit(rq, &q, 1))
		die("submit LOAD of %s: %s", t->name, hyb_last_error());
	ret = hyb_rq_reap(rq, &cqe, 1, 1, 30000000000ull);
	if (ret != 1 || cqe.tag != tag)
		die("LOAD of %s: no completion within 30 s (reap %d)", t->name, ret);
	*ms = ms_since(t0);
	return cqe.status;
}

/*
 * hybd serving from the failing drive with the bad tensor left on storage
 * (dram_budget, page_pool): the load reads around the bad block and succeeds;
 * an app's LOAD of the bad tensor completes with -EIO in bounded time and
 * hybd logs the file and the bad block; hybd keeps serving (a LOAD of a good
 * paged tensor delivers the file's bytes); SIGTERM still exits 0.
 */
static void ioerr_reload(const char *bin, const char *conf, const char *model, uint64_t bad)
{
	static char set_model[600];
	/* resident: the dense tensors and layer 0's FFN; layer 1's FFN on demand */
	const char *sets[] = { set_model, "name=bad", "state_dir=/tmp/hybd-bad",
			       "dram_budget=2124288", "page_pool=256K", NULL };
	const struct hyb_manifest_tensor *tb, *tg;
	struct hyb_manifest *mf = NULL;
	struct hyb_manifest_info mi;
	struct hyb_mempool *pp = NULL;
	struct hyb_backend *b;
	struct hyb_rq *rq;
	uint32_t page_id = 0;
	char why[128], *log = NULL;
	const char *line = "";
	uint8_t *ref;
	void *base;
	size_t plen;
	double t0 = hyb_now(), ms;
	int st, fd, ret;

	snprintf(set_model, sizeof(set_model), "model=%s", model);
	b = hyb_backend_open(HYB_BACKEND_KMOD);
	if (!b)
		die("kmod backend: %s", hyb_last_error());
	drop_caches();
	daemon_pid = start_hybd_with(bin, conf, sets);
	daemon_started = true;
	while (!mf && ms_since(t0) < 60000) {
		if (waitpid(daemon_pid, &st, WNOHANG) == daemon_pid) {
			daemon_pid = 0;
			die("hybd with layer 1 on demand exited (status %#x): its load should have "
			    "missed the bad block", st);
		}
		mf = hyb_manifest_open_pool(b, "bad.manifest");
		if (!mf)
			usleep(20000);
	}
	if (!mf)
		die("no manifest from hybd after 60 s: %s", hyb_last_error());
	hyb_manifest_info(mf, &mi);
	tb = hyb_manifest_find(mf, "blk.1.ffn_up.weight");
	tg = hyb_manifest_find(mf, "blk.1.ffn_down.weight");
	if (!tb || !tg || tb->pool != HYB_MF_NO_POOL || tg->pool != HYB_MF_NO_POOL ||
	    tb->file_off > bad || bad >= tb->file_off + tb->bytes || tb->node != tg->node)
		die("placement '%s': want blk.1.ffn_up (holding byte %llu) and ffn_down on demand "
		    "on one node (adjust dram_budget)", mi.placement, (unsigned long long)bad);
	for (uint32_t i = 0; i < mi.n_pools; i++) {
		const struct hyb_mf_pool *p = hyb_manifest_pool(mf, i);

		if (p->role == HYB_MF_ROLE_PAGE && p->node == tb->node) {
			page_id = p->id;
			if (hyb_mempool_open(b, p->name, &pp) || hyb_mempool_map(pp, &base, &plen))
				die("page pool %s: %s", p->name, hyb_last_error());
		}
	}
	if (!page_id)
		die("no page pool on node %d", tb->node);
	note("hybd ready in %.0f ms with %.2f MiB on demand (%s)", ms_since(t0),
	     mi.paged_bytes / 1048576.0, mi.placement);
	if (hyb_rq_attach_client(b, QUEUE, HYB_RQ_EVENTFD_NONE, &rq))
		die("attach to queue %d: %s", QUEUE, hyb_last_error());

	ret = reload(rq, page_id, tb, 1, &ms);
	if (ret != -EIO)
		die("LOAD of %s over the bad block: status %d (%s), want -EIO", tb->name, ret,
		    strerror(-ret));
	metric("ioerr_reload_fail_ms", ms, "ms");
	t0 = hyb_now();
	while (ms_since(t0) < 5000) {	/* (logged just after the completion) */
		log = slurp("/tmp/hybd.log");
		line = line_with(log, "event=reload_error");
		if (line[0])
			break;
		usleep(10000);
	}
	if (!names_bad_read(line, model, bad, why, sizeof(why)))
		die("hybd's reload_error line does not name %s, a read and the block holding byte "
		    "%llu: %s", model, (unsigned long long)bad, line);
	note("LOAD of %s: -EIO after %.0f ms; hybd logs: %s", tb->name, ms, strstr(line, "msg="));

	ret = reload(rq, page_id, tg, 2, &ms);
	if (ret)
		die("LOAD of %s after the failed one: status %d (%s), want 0", tg->name, ret,
		    strerror(-ret));
	ref = malloc(tg->bytes);
	fd = open(model, O_RDONLY);
	if (!ref || fd < 0 || pread(fd, ref, tg->bytes, (off_t)tg->file_off) != (ssize_t)tg->bytes)
		die("%s: cannot read %s", model, tg->name);
	close(fd);
	if (tg->bytes > plen || memcmp(base, ref, tg->bytes))
		die("LOAD of %s: the page pool's bytes differ from the file", tg->name);
	free(ref);
	note("hybd still serves: LOAD of %s (%.0f ms), bytes identical to the file", tg->name, ms);
	hyb_rq_close(rq);
	hyb_mempool_close(pp);
	hyb_manifest_close(mf);
	hyb_backend_close(b);
	kill(daemon_pid, SIGTERM);
	st = wait_exit(daemon_pid, 20000);
	if (st < 0)
		die("hybd did not exit within 20 s of SIGTERM");
	daemon_pid = 0;
	if (!WIFEXITED(st) || WEXITSTATUS(st))
		die("hybd exited with status %#x after SIGTERM, want 0", st);
	note("SIGTERM: hybd exited 0");
}

/*
 * hybbox ioerr HYBD CONF MODEL BAD_OFF [hyb=PATH]: MODEL lies on a drive
 * that fails the reads of the sectors holding file byte BAD_OFF (tests/vm/
 * run.sh: QEMU's blkdebug under an emulated NVMe drive). Every way of loading
 * must fail with a message naming the file and a read covering BAD_OFF, in
 * bounded time, and leave nothing marked ready.
 */
static int cmd_ioerr(const char *bin, const char *conf, const char *model, uint64_t bad,
		     const char *hyb)
{
	char names[512];

	if (pools_named("bad.", names, sizeof(names)))
		die("pools named bad.* exist before the test:%s", names);
	ioerr_embedded(model, bad, false);
	ioerr_embedded(model, bad, true);
	if (hyb) {
		ioerr_hyb_run(hyb, model, bad);
		ioerr_hyb_run_mmap(hyb, model, bad);
	}
	ioerr_hybd(bin, conf, model, bad);
	ioerr_hybd_daemon(bin, conf, model, bad);
	if (hyb) {
		const char *argv[] = { hyb, "run", "--manifest", "bad", "-p", PROMPT, "-n", "4",
				       "-t", "1", NULL };
		const int st = spawn_wait(argv, "/tmp/hyb.out", "/tmp/hyb.err", 20000,
					  "hyb run --manifest bad after hybd's failed load");
		char *err = slurp("/tmp/hyb.err");

		if (!WIFEXITED(st) || !WEXITSTATUS(st) || strstr(err, "ids:"))
			die("hyb run --manifest bad: status %#x, want an error: %s", st, err);
		note("hyb run --manifest bad (the app of the failed box): exit %d, \"%s\"",
		     WEXITSTATUS(st), line_with(err, "hyb:"));
	}
	ioerr_reload(bin, conf, model, bad);
	return 0;
}

/* -- hybrid decoding on hybd's cache --------------------------------------------- */

#define HQUEUE 4
#define HSTEPS 24

/* Logits of a prompt and HSTEPS greedy steps, a forced token every 5 (drift), oracle mode. */
static float *oracle_logits(const struct hyb_model *m, const struct hyb_hybrid_params *hy,
			   struct hyb_hybrid_stats *st, bool *on_hybd)
{
	struct hyb_ctx_params p = {
		.n_ctx = 128, .n_threads = 1, .ffn = HYB_FFN_SPARSE, .hybrid = hy,
		.testing = HYB_TESTING_FFN_ORACLE,
	};
	const uint32_t V = m->hp.n_vocab;
	float *lg = malloc(sizeof(float) * V * (HSTEPS + 1));
	struct hyb_ctx *c = hyb_ctx_new(m, &p);
	int n_prompt;
	const int32_t *prompt = prompt_ids(m, &n_prompt);

	if (!c || !lg)
		die("context: %s", c ? "out of memory" : hyb_last_error());
	if (hyb_ctx_eval(c, prompt, (uint32_t)n_prompt, lg, false))
		die("prompt: %s", hyb_last_error());
	for (int i = 0; i < HSTEPS; i++) {
		const float *l = lg + (size_t)i * V;
		int32_t t = 0;

		for (uint32_t v = 1; v < V; v++)
			if (l[v] > l[t])
				t = (int32_t)v;
		if (i % 5 == 4)
			t = (int32_t)(3 + (uint32_t)(i * 40503u + 7) % (V - 3));
		if (hyb_ctx_eval(c, &t, 1, lg + (size_t)(i + 1) * V, false))
			die("step %d: %s", i, hyb_last_error());
	}
	if (hy) {
		struct hyb_hybrid_offload pl;

		hyb_ctx_hybrid_stats(c, st);
		hyb_ctx_hybrid_offload(c, &pl);
		*on_hybd = pl.cache_hybd;
		note("hybrid: neuron cache: %s", pl.cache_note);
	}
	hyb_ctx_free(c);
	return lg;
}

/* `hyb run --manifest vmp --gpu-budget 50% --cache hybd`: its exit status, stderr in /tmp/hyb.err. */
static int hyb_run_on_cache(const char *hyb)
{
	const char *argv[] = { hyb, "run", "--manifest", "vmp", "-p", PROMPT, "-n", "8", "-t", "1",
			       "--gpu-budget", "50%", "--cache", "hybd", NULL };

	return spawn_wait(argv, "/tmp/hyb.out", "/tmp/hyb.err", 120000, "hyb run --cache hybd");
}

static int cmd_hybrid(const char *bin, const char *conf, const char *plan, const char *hyb)
{
	static char slots[32];
	/* hybd's cache for a third of the groups: the app's groups get all of it */
	const char *const sets[] = {
		"model=/mnt/plan.gguf", "name=vmp", "queue=4", slots,
		"slot_bytes=auto", "copy_bandwidth=1G", "placement=layer", NULL,
	};
	/* lru under drift: loads every few steps; the budget all for groups */
	struct hyb_hybrid_params hy = { .device = "cpu", .policy = HYB_POLICY_LRU,
					.cache = HYB_CACHE_HYBD, .dense_on_cpu = true };
	struct hyb_hybrid_stats st;
	struct hyb_model *mf, *mb;
	struct hyb_rq_stats q0, q1;
	struct hyb_backend *b;
	float *ref, *box;
	bool on_hybd = false;
	double ready_ms;
	uint32_t V;
	int rc;

	if (strcmp(plan, "/mnt/plan.gguf"))
		die("the plan must be /mnt/plan.gguf (the hybd settings name it)");
	setenv("HYB_STATE_DIR", "/tmp/hybd", 1);	/* the config's state_dir: the .gpucache */
	mf = hyb_model_load(plan);
	if (!mf)
		die("%s", hyb_last_error());
	V = mf->hp.n_vocab;
	ref = oracle_logits(mf, NULL, NULL, NULL);
	snprintf(slots, sizeof(slots), "gpu_slots=%u", mf->hp.n_layer * mf->n_groups / 3);
	/* this app's device memory: buffers and room to spare (the groups are hybd's) */
	hy.gpu_budget = mf->gguf->size / 5;

	daemon_pid = start_hybd_with(bin, conf, sets);
	daemon_started = true;
	mb = wait_ready(daemon_pid, "vmp", &ready_ms);
	b = hyb_backend_open(HYB_BACKEND_KMOD);
	if (!b || hyb_rq_stats(b, HQUEUE, &q0))
		die("queue %d stats: %s", HQUEUE, hyb_last_error());

	if (hyb) {
		/* hybd's cache while this process holds it: refused, not shared */
		struct hyb_ctx_params p = { .n_ctx = 128, .n_threads = 1, .ffn = HYB_FFN_SPARSE,
					    .hybrid = &hy };
		struct hyb_ctx *hold = hyb_ctx_new(mb, &p);

		if (!hold)
			die("context on hybd's cache: %s", hyb_last_error());
		rc = hyb_run_on_cache(hyb);
		if (!WIFEXITED(rc) || WEXITSTATUS(rc) != 1 ||
		    !strstr(slurp("/tmp/hyb.err"), "in use by another app"))
			die("hyb run --cache hybd while another app holds the cache: status %#x: %s",
			    rc, slurp("/tmp/hyb.err"));
		note("hyb run --cache hybd while held: %s", line_with(slurp("/tmp/hyb.err"),
								      "in use"));
		hyb_ctx_free(hold);
	}

	box = oracle_logits(mb, &hy, &st, &on_hybd);
	if (!on_hybd)
		die("the context did not use hybd's cache");
	if (hyb_rq_stats(b, HQUEUE, &q1))
		die("queue %d stats: %s", HQUEUE, hyb_last_error());
	if (!st.loads || !st.active_dev || q1.submitted - q0.submitted < st.loads || q1.failed)
		die("%llu loads, %llu neurons on the device, %llu requests on hybd's queue (%llu "
		    "failed)", (unsigned long long)st.loads, (unsigned long long)st.active_dev,
		    (unsigned long long)(q1.submitted - q0.submitted),
		    (unsigned long long)q1.failed);
	for (int i = 0; i <= HSTEPS; i++)
		if (memcmp(ref + (size_t)i * V, box + (size_t)i * V, sizeof(float) * V))
			die("step %d: logits on hybd's cache differ from CPU-only sparse decoding "
			    "of the file", i);
	note("oracle logits of %d steps bit-identical to the file's; %llu group loads, all "
	     "%llu served by hybd (queue wait p50 %.0f us)", HSTEPS + 1,
	     (unsigned long long)st.loads, (unsigned long long)(q1.submitted - q0.submitted),
	     q1.queue_wait.p50_ns / 1e3);
	metric("hybrid_box_group_loads", (double)st.loads, "");

	if (hyb) {
		rc = hyb_run_on_cache(hyb);
		if (!WIFEXITED(rc) || WEXITSTATUS(rc) ||
		    !strstr(slurp("/tmp/hyb.err"), "neuron cache: hybd's"))
			die("hyb run --cache hybd: status %#x: %s", rc, slurp("/tmp/hyb.err"));
		note("hyb run --cache hybd: %s", line_with(slurp("/tmp/hyb.err"), "neuron cache: "));
	}
	free(ref);
	free(box);
	hyb_model_free(mb);
	hyb_model_free(mf);
	kill(daemon_pid, SIGTERM);
	rc = wait_exit(daemon_pid, 30000);
	daemon_pid = 0;
	if (rc < 0 || !WIFEXITED(rc) || WEXITSTATUS(rc))
		die("hybd did not exit 0 after SIGTERM (status %#x)", rc);
	{
		struct hyb_mempool *p;

		if (!hyb_mempool_open(b, "vmp.gpucache", &p))
			die("hybd's slots pool vmp.gpucache outlived it");
	}
	hyb_backend_close(b);
	return 0;
}

/* -- hyb serve --manifest (tools/hyb/cmd_serve.c) -------------------------------- */

#define SERVE_PORT 18080

static int http_open(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(SERVE_PORT) };
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct timeval tv = { .tv_sec = 60 };

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a))) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	return fd;
}

/* Sends a request (body NULL: GET); the connection, to read the answer from. */
static int http_send(const char *method, const char *path, const char *body)
{
	char req[1024];
	int fd = http_open(), n;

	if (fd < 0)
		die("cannot connect to hyb serve on port %d: %s", SERVE_PORT, strerror(errno));
	n = snprintf(req, sizeof(req), "%s %s HTTP/1.1\r\nHost: vm\r\nConnection: close\r\n"
		     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s", method,
		     path, body ? strlen(body) : 0, body ? body : "");
	if (write(fd, req, (size_t)n) != n)
		die("cannot send to hyb serve: %s", strerror(errno));
	return fd;
}

/* Everything until the server closes (malloc'd). */
static char *http_read(int fd)
{
	size_t cap = 1 << 16, n = 0;
	char *buf = malloc(cap);
	ssize_t r;

	while (buf && (r = read(fd, buf + n, cap - n - 1)) > 0) {
		n += (size_t)r;
		if (n + 1 == cap && !(buf = realloc(buf, cap *= 2)))
			break;
	}
	if (!buf)
		die("out of memory");
	buf[n] = 0;
	close(fd);
	return buf;
}

static int cmd_serve(const char *bin, const char *conf, const char *serve, const char *hyb)
{
	const char *run_argv[] = { hyb, "run", "--manifest", "vm", "-p", PROMPT, "-n", "16", "-t",
				   "1", NULL };
	const char *serve_argv[] = { serve, "serve", "--manifest", "vm", "--port", "18080", "-t",
				     "1", "--parallel", "2", NULL };
	char want[4096], got[4096], out[8192], *resp, *body;
	struct hyb_model *m;
	json_error_t je;
	json_t *j, *t;
	double ready_ms, t0;
	pid_t sp;
	int st, fd;

	daemon_pid = start_hybd(bin, conf);
	daemon_started = true;
	m = wait_ready(daemon_pid, "vm", &ready_ms);
	hyb_model_free(m);
	/* the reference: hyb run --manifest's text after the prompt */
	st = spawn_wait(run_argv, "/tmp/run.out", "/tmp/run.err", 60000, "hyb run --manifest");
	snprintf(out, sizeof(out), "%s", slurp("/tmp/run.out"));
	if (!WIFEXITED(st) || WEXITSTATUS(st) || strncmp(out, PROMPT, strlen(PROMPT)))
		die("hyb run --manifest: status %#x: %s%s", st, out, slurp("/tmp/run.err"));
	hyb_as_seen(out + strlen(PROMPT), strlen(out) - strlen(PROMPT) - 1, want);

	sp = spawn(serve_argv, "/tmp/serve.out", "/tmp/serve.err");
	hyb_pid = sp;
	for (t0 = hyb_now(); !strstr(slurp("/tmp/serve.err"), "listening on"); usleep(50000)) {
		if (waitpid(sp, &st, WNOHANG) == sp) {
			hyb_pid = 0;
			die("hyb serve exited (status %#x) before listening: %s", st,
			    slurp("/tmp/serve.err"));
		}
		if (ms_since(t0) > 60000)
			die("hyb serve not listening after 60 s: %s", slurp("/tmp/serve.err"));
	}
	note("hyb serve --manifest vm listening after %.0f ms", ms_since(t0));
	resp = http_read(http_send("POST", "/v1/completions", "{\"prompt\": \"" PROMPT "\", "
				   "\"max_tokens\": 16, \"temperature\": 0}"));
	body = strstr(resp, "\r\n\r\n");
	j = body ? json_loads(body + 4, JSON_ALLOW_NUL, &je) : NULL;
	t = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text");
	if (strncmp(resp, "HTTP/1.1 200", 12) || !json_is_string(t))
		die("hyb serve's completion: %.500s", resp);
	hyb_as_seen(json_string_value(t), json_string_length(t), got);
	if (strcmp(got, want))
		die("hyb serve --manifest answered \"%s\", hyb run --manifest printed \"%s\"", got,
		    want);
	note("a greedy completion over HTTP is hyb run --manifest's text: \"%s\"", got);
	json_decref(j);
	free(resp);

	/* hybd stops under a running stream */
	fd = http_send("POST", "/v1/completions", "{\"prompt\": \"" PROMPT "\", \"max_tokens\": "
		       "96, \"temperature\": 0, \"stream\": true}");
	usleep(300000);
	t0 = hyb_now();
	kill(daemon_pid, SIGTERM);
	if (wait_exit(daemon_pid, 30000) < 0)
		die("hybd did not exit 30 s after SIGTERM");
	daemon_pid = 0;
	resp = http_read(fd);
	if (!strstr(resp, "\"finish_reason\":\"length\"") || !strstr(resp, "data: [DONE]"))
		die("the stream running when hybd stopped did not finish (%.0f ms): ...%s\n"
		    "  hyb serve: %s", ms_since(t0),
		    resp + (strlen(resp) > 400 ? strlen(resp) - 400 : 0), slurp("/tmp/serve.err"));
	free(resp);
	st = wait_exit(sp, 30000);
	if (st < 0)
		die("hyb serve still runs 30 s after hybd stopped: %s", slurp("/tmp/serve.err"));
	hyb_pid = 0;
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 3 || !strstr(slurp("/tmp/serve.err"), "shut down"))
		die("hyb serve: status %#x (want exit 3 naming hybd's shutdown): %s", st,
		    slurp("/tmp/serve.err"));
	note("hybd stopped: the running stream finished, hyb serve exited 3 %.0f ms later: \"%s\"",
	     ms_since(t0), line_with(slurp("/tmp/serve.err"), "shut down"));
	return 0;
}

/* -- experts split by rows across the nodes (docs/NUMA.md) ----------------- */

/* Every split tensor's parts: one per node, in pools on that node, bytes as in the file. */
static unsigned int check_parts(const struct hyb_model *m, const char *model)
{
	const struct hyb_manifest *mf = hyb_model_manifest(m);
	struct hyb_manifest_info mi;
	int fd = open(model, O_RDONLY);
	unsigned int n_split = 0;
	uint8_t *buf = NULL;

	if (fd < 0)
		die("%s: %s", model, strerror(errno));
	hyb_manifest_info(mf, &mi);
	for (uint32_t i = 0; i < mi.n_tensors; i++) {
		const struct hyb_manifest_tensor *t = hyb_manifest_tensor(mf, i);
		const bool expert = strstr(t->name, "_exps") != NULL;
		uint64_t rb;

		if (expert != (t->pool == HYB_MF_SPLIT))
			die("tensor %s: pool %u (split_experts splits exactly the expert tensors)",
			    t->name, t->pool);
		if (!expert)
			continue;
		if (t->n_parts != 2)
			die("tensor %s: %u parts, want one per node", t->name, t->n_parts);
		rb = t->bytes / (t->ne[1] * t->ne[2]);
		buf = realloc(buf, rb * t->ne[1]);
		if (!buf)
			die("out of memory");
		for (uint32_t k = 0; k < 2; k++) {
			const struct hyb_mf_part *p = &t->parts[k];
			const struct hyb_mf_pool *pool = hyb_manifest_pool(mf, p->pool);
			struct hyb_mempool_info pi;

			if (p->node != (int32_t)k || hyb_mempool_stat(m->image_backend, pool->id, &pi) ||
			    pi.node != (int)k)
				die("tensor %s: part %u on node %d, its pool %s on node %d (want %u)",
				    t->name, k, p->node, pool->name, pi.node, k);
			for (uint64_t e = 0; e < t->ne[2]; e++) {
				const off_t off = (off_t)(t->file_off + (e * t->ne[1] + p->row0) * rb);
				const void *in = hyb_model_box_addr(m, p->pool, p->pool_off +
								    e * p->stride, p->rows * rb);

				if (pread(fd, buf, p->rows * rb, off) != (ssize_t)(p->rows * rb))
					die("%s: short read", model);
				if (!in || memcmp(buf, in, p->rows * rb))
					die("tensor %s: expert %llu's rows on node %u differ from the "
					    "file", t->name, (unsigned long long)e, k);
			}
		}
		n_split++;
	}
	free(buf);
	close(fd);
	return n_split;
}

static int cmd_split(const char *bin, const char *conf, const char *model, const char *ids_path)
{
	const char *sets[] = { "split_experts=yes", "name=vms", NULL };
	char model_set[512];
	int32_t want[MAX_IDS], *prompt;
	uint32_t n_want = read_ids(ids_path, want);
	struct hyb_ctx_params cp = { .n_ctx = 512, .n_threads = 2 };
	struct hyb_model *m;
	struct hyb_ctx *c;
	struct run r = { .check_box = true };
	cpu_set_t mine;
	unsigned int n_split;
	double ready_ms;
	int np, st;

	snprintf(model_set, sizeof(model_set), "model=%s", model);
	{
		const char *all[] = { sets[0], sets[1], model_set, NULL };

		drop_caches();
		daemon_pid = start_hybd_with(bin, conf, all);
	}
	daemon_started = true;
	m = wait_ready(daemon_pid, "vms", &ready_ms);
	r.m = m;
	if (!m->hp.n_expert)
		die("%s is not a mixture of experts", model);
	n_split = check_parts(m, model);
	note("hybd split %u expert tensors by rows: node 0 and node 1 each hold their rows of "
	     "every expert, bytes as in the file", n_split);
	c = hyb_ctx_new(m, &cp);
	if (!c)
		die("context: %s", hyb_last_error());
	/* two threads, one per node: the caller (thread 0) on node 0's CPU */
	if (sched_getaffinity(0, sizeof(mine), &mine) || CPU_COUNT(&mine) != 1 ||
	    !CPU_ISSET(0, &mine))
		die("the app's thread 0 is not pinned to node 0's CPU (%d CPUs allowed)",
		    CPU_COUNT(&mine));
	/* ... and the pool's worker on node 1's */
	{
		DIR *dir = opendir("/proc/self/task");
		struct dirent *de;
		int on1 = 0;

		while (dir && (de = readdir(dir))) {
			char path[300], *st;

			if (de->d_name[0] == '.')
				continue;
			snprintf(path, sizeof(path), "/proc/self/task/%s/status", de->d_name);
			st = slurp(path);
			on1 += strstr(st, "Cpus_allowed_list:\t1\n") != NULL;
		}
		if (dir)
			closedir(dir);
		if (on1 != 1)
			die("%d threads pinned to node 1's CPU, want the pool's one worker", on1);
	}
	prompt = prompt_ids(m, &np);
	generate(c, &r, prompt, np, n_want);
	if (r.box_err)
		die("hybd went away during the run: %s", r.box_msg);
	compare_ids(want, n_want, &r, n_want, "experts split across nodes");
	note("%u greedy ids identical to embedded mode, with a thread pinned to each node's CPU",
	     r.n);
	hyb_ctx_free(c);
	hyb_model_free(m);
	kill(daemon_pid, SIGTERM);
	st = wait_exit(daemon_pid, 20000);
	daemon_pid = 0;
	if (st < 0 || !WIFEXITED(st) || WEXITSTATUS(st))
		die("hybd: status %#x after SIGTERM, want 0", st);
	return 0;
}

int main(int argc, char **argv)
{
	const char *hyb = NULL;
	bool kill_it = false;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 4 && !strcmp(argv[1], "gen"))
		return cmd_gen(argv[2], (uint32_t)atoi(argv[3]));
	if (argc == 4 && !strcmp(argv[1], "offset"))
		return cmd_offset(argv[2], argv[3]);
	if ((argc == 6 || argc == 7) && !strcmp(argv[1], "ioerr")) {
		if (argc == 7 && strncmp(argv[6], "hyb=", 4))
			die("unknown argument '%s'", argv[6]);
		return cmd_ioerr(argv[2], argv[3], argv[4], strtoull(argv[5], NULL, 10),
				 argc == 7 ? argv[6] + 4 : NULL);
	}
	if (argc == 6 && !strcmp(argv[1], "split"))
		return cmd_split(argv[2], argv[3], argv[4], argv[5]);
	if (argc == 6 && !strcmp(argv[1], "serve"))
		return cmd_serve(argv[2], argv[3], argv[4], argv[5]);
	if ((argc == 5 || argc == 6) && !strcmp(argv[1], "hybrid")) {
		if (argc == 6 && strncmp(argv[5], "hyb=", 4))
			die("unknown argument '%s'", argv[5]);
		return cmd_hybrid(argv[2], argv[3], argv[4], argc == 6 ? argv[5] + 4 : NULL);
	}
	if (argc >= 6 && !strcmp(argv[1], "box")) {
		for (int i = 6; i < argc; i++) {
			if (!strcmp(argv[i], "kill"))
				kill_it = true;
			else if (!strncmp(argv[i], "hyb=", 4))
				hyb = argv[i] + 4;
			else
				die("unknown argument '%s'", argv[i]);
		}
		return cmd_box(argv[2], argv[3], argv[4], argv[5], hyb, kill_it);
	}
	fprintf(stderr, "usage: hybbox gen MODEL N | hybbox box HYBD CONF MODEL IDS [kill] "
		"[hyb=PATH]\n       hybbox offset MODEL TENSOR | hybbox ioerr HYBD CONF MODEL "
		"BAD_OFF [hyb=PATH]\n       hybbox hybrid HYBD CONF PLAN [hyb=PATH]\n"
		"       hybbox serve HYBD CONF HYB_SERVE HYB | hybbox split HYBD CONF MOE IDS\n");
	return 2;
}
