// SPDX-License-Identifier: MIT
/*
 * Runs every registered test, each in a forked child with a time limit, and
 * ends with the line "N passed, N failed". Arguments are substrings: only
 * tests whose name contains one of them run. HYB_TEST_TIMEOUT (seconds,
 * default 600) bounds each test.
 */
#include <errno.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test.h"

#define EXIT_SKIP 77

static struct hyb_test *tests, **tests_tail = &tests;
static char tmpdir[256];

void hyb_test_register(struct hyb_test *t)
{
	*tests_tail = t;
	tests_tail = &t->next;
}

void hyb_test_fail(const char *file, int line, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "    %s:%d: ", file, line);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	fflush(NULL);
	_exit(1);
}

void hyb_test_skip(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "    skipped: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	fflush(NULL);
	_exit(EXIT_SKIP);
}

const char *hyb_test_shared(const char *rel)
{
	static char buf[4096];
	const char *base = getenv("HYB_SHARED");

	snprintf(buf, sizeof(buf), "%s/%s", base ? base : "../shared", rel);
	return buf;
}

const char *hyb_test_tmpdir(void)
{
	return tmpdir;
}

static int selected(const char *name, int argc, char **argv)
{
	if (argc < 2)
		return 1;
	for (int i = 1; i < argc; i++)
		if (strstr(name, argv[i]))
			return 1;
	return 0;
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int run_one(struct hyb_test *t, unsigned timeout)
{
	char cmd[512];
	int status;
	pid_t pid;

	snprintf(tmpdir, sizeof(tmpdir), "/tmp/hyb-test.%d.%s", (int)getpid(), t->name);
	if (mkdir(tmpdir, 0700) && errno != EEXIST)
		return 1;
	fflush(NULL);
	pid = fork();
	if (pid < 0)
		return 1;
	if (pid == 0) {
		alarm(timeout);
		t->fn();
		fflush(NULL);
		_exit(0);
	}
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
	if (system(cmd) != 0)
		fprintf(stderr, "    could not remove %s\n", tmpdir);
	if (WIFSIGNALED(status)) {
		fprintf(stderr, "    killed by signal %d%s\n", WTERMSIG(status),
			WTERMSIG(status) == SIGALRM ? " (time limit)" : "");
		return 1;
	}
	return WEXITSTATUS(status);
}

int main(int argc, char **argv)
{
	const char *to = getenv("HYB_TEST_TIMEOUT");
	unsigned timeout = to ? (unsigned)atoi(to) : 600;
	int passed = 0, failed = 0, skipped = 0;

	/*
	 * The CPU-executed device touches host memory when a copy completes, as
	 * a GPU does, and faults a host that does not honour its events
	 * (libhyb/device/device_cpu.c, "Strict mode"): every engine test then checks
	 * what the first GPU run would otherwise find. HYB_DEVICE_STRICT=0 turns
	 * it off.
	 */
	setenv("HYB_DEVICE_STRICT", "1", 0);
	for (struct hyb_test *t = tests; t; t = t->next) {
		if (!selected(t->name, argc, argv))
			continue;
		double t0 = now();
		int rc = run_one(t, timeout);
		double dt = now() - t0;

		if (rc == 0) {
			passed++;
			printf("ok   %-48s %7.2fs\n", t->name, dt);
		} else if (rc == EXIT_SKIP) {
			skipped++;
			printf("skip %-48s\n", t->name);
		} else {
			failed++;
			printf("FAIL %-48s %7.2fs\n", t->name, dt);
		}
		fflush(stdout);
	}
	if (skipped)
		printf("%d skipped (reasons above)\n", skipped);
	printf("%d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
