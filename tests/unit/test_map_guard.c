// SPDX-License-Identifier: MIT
/*
 * The SIGBUS guard of file mappings (libhyb/format/map_guard.h): a model computed
 * in place (HYB_LOAD=mmap) whose file is truncated under it ends with a line
 * naming the file, the byte and the tensor, and exit status 1; faults that
 * are not in a guarded mapping still reach the application's own handler,
 * or kill as before. Each case runs in a child (the guard exits the process).
 * The real drive-error case is the VM test (tests/vm: hybbox ioerr).
 */
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "hyb/gguf.h"
#include "hyb/model.h"
#include "format/map_guard.h"
#include "test.h"

#define PAGE 4096u

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

static void copy_file(const char *from, const char *to)
{
	FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
	char buf[65536];
	size_t n;

	CHECK_MSG(a && b, "cannot copy %s to %s", from, to);
	while ((n = fread(buf, 1, sizeof(buf), a)) > 0)
		CHECK(fwrite(buf, 1, n, b) == n);
	fclose(a);
	CHECK(!fclose(b));
}

/* fork; the child runs fn with stderr in err_path and no core dumps; the wait status. */
static int in_child(void (*fn)(const char *), const char *arg, const char *err_path)
{
	pid_t pid = fork();
	int st;

	CHECK(pid >= 0);
	if (!pid) {
		const struct rlimit no_core = { 0, 0 };
		int fd = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);

		setrlimit(RLIMIT_CORE, &no_core);
		if (fd >= 0)
			dup2(fd, 2);
		fn(arg);
		_exit(0);
	}
	CHECK(waitpid(pid, &st, 0) == pid);
	return st;
}

static const char *tmp_path(const char *name)
{
	static char p[4][512];
	static int k;

	snprintf(p[k & 3], sizeof(p[0]), "%s/%s", hyb_test_tmpdir(), name);
	return p[k++ & 3];
}

/* where the truncation cuts: one page past the first page of tensor data */
static uint64_t cut_of(const struct hyb_gguf_file *g)
{
	return (g->data_offset + PAGE - 1) / PAGE * PAGE + PAGE;
}

/* child: load in place, truncate the file, decode a token (which must not return) */
static void decode_truncated(const char *path)
{
	struct hyb_model *m = hyb_model_load_mode(path, HYB_LOAD_MMAP);
	const struct hyb_ctx_params p = { .n_ctx = 16, .n_threads = 1 };
	struct hyb_ctx *c;
	const int32_t tok = 1;
	float *logits;

	if (!m) {
		fprintf(stderr, "load: %s\n", hyb_last_error());
		_exit(3);
	}
	if (truncate(path, (off_t)cut_of(m->gguf))) {
		perror("truncate");
		_exit(3);
	}
	c = hyb_ctx_new(m, &p);
	logits = malloc(sizeof(float) * m->hp.n_vocab);
	if (!c || !logits) {
		fprintf(stderr, "ctx: %s\n", hyb_last_error());
		_exit(3);
	}
	hyb_ctx_eval(c, &tok, 1, logits, false);
	fprintf(stderr, "the decode returned after its file was truncated\n");
	_exit(4);
}

TEST(map_guard_truncated_model_names_file_byte_and_tensor)
{
	const char *path = tmp_path("model.gguf"), *err_path = tmp_path("err");
	char name[256];
	unsigned long long byte, in_t;
	struct hyb_gguf_file *g;
	const char *e, *t;
	int st, k = 0;

	copy_file(hyb_test_shared("models/llama-2-tiny-random.gguf"), path);
	st = in_child(decode_truncated, path, err_path);
	e = slurp(err_path);
	CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == HYB_MAP_GUARD_EXIT,
		  "status %#x (want exit %d, not a signal): %s", st, HYB_MAP_GUARD_EXIT, e);
	CHECK_MSG(strstr(e, path) && strstr(e, "truncated"), "%s", e);
	t = strstr(e, "cannot read byte ");
	CHECK_MSG(t && sscanf(t, "cannot read byte %llu (tensor %255[^,], byte %llu of it)%n",
			      &byte, name, &in_t, &k) == 3 && k, "%s", e);

	/* the named byte is in the named tensor, past the cut, in the original file */
	CHECK_MSG(!hyb_gguf_open(hyb_test_shared("models/llama-2-tiny-random.gguf"), &g), "%s",
		  hyb_last_error());
	const struct hyb_gguf_tensor *tt = hyb_gguf_find_tensor(g, name);

	CHECK_MSG(tt, "no tensor '%s' in the model", name);
	CHECK_EQ_INT(byte, g->data_offset + tt->offset + in_t);
	CHECK(in_t < tt->nbytes);
	CHECK_MSG(byte >= cut_of(g), "byte %llu is before the cut %llu", byte,
		  (unsigned long long)cut_of(g));
	fprintf(stderr, "    %.*s", (int)strcspn(e, "\n") + 1, e);
	hyb_gguf_close(g);
}

/* a mapping of our own, outside every guard, of a file truncated under it: a real fault */
static void foreign_fault(const char *path)
{
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
	volatile const char *p;
	struct hyb_gguf_file *g;

	/* a guarded mapping exists, so the guard's handler is installed */
	if (hyb_gguf_open(hyb_test_shared("models/llama-2-tiny-random.gguf"), &g) ||
	    g->map_guard < 0)
		_exit(3);
	if (fd < 0 || ftruncate(fd, 2 * PAGE))
		_exit(3);
	p = mmap(NULL, 2 * PAGE, PROT_READ, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED || ftruncate(fd, 0))
		_exit(3);
	(void)p[PAGE];
	_exit(4);
}

static void app_handler(int sig, siginfo_t *si, void *uc)
{
	(void)uc;
	_exit(sig == SIGBUS && si->si_code > 0 ? 42 : 43);
}

static void foreign_fault_with_app_handler(const char *path)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = app_handler;
	sa.sa_flags = SA_SIGINFO;
	sigaction(SIGBUS, &sa, NULL);
	foreign_fault(path);
}

TEST(map_guard_leaves_other_faults_to_their_owner)
{
	const char *err_path = tmp_path("err");
	int st;

	/* the application's handler, set before the guard, still gets its faults */
	st = in_child(foreign_fault_with_app_handler, tmp_path("other"), err_path);
	CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 42, "status %#x: %s", st, slurp(err_path));
	/* none: the default action, as without the guard (and no report) */
	st = in_child(foreign_fault, tmp_path("other2"), err_path);
	CHECK_MSG(WIFSIGNALED(st) && WTERMSIG(st) == SIGBUS, "status %#x: %s", st,
		  slurp(err_path));
	CHECK_MSG(!strstr(slurp(err_path), "cannot read"), "%s", slurp(err_path));
}

TEST(map_guard_slots_are_given_back)
{
	const char *path = hyb_test_shared("models/llama-2-tiny-random.gguf");

	for (int i = 0; i < 3 * HYB_MAP_GUARD_SLOTS; i++) {
		struct hyb_gguf_file *g;

		CHECK_MSG(!hyb_gguf_open(path, &g), "%s", hyb_last_error());
		CHECK_MSG(g->map_guard >= 0, "open %d has no guard slot", i);
		hyb_gguf_close(g);
	}
}
