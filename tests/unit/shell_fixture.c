// SPDX-License-Identifier: MIT
/* Shell commands and the Python oracle environment for tests (test.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test.h"

int hyb_test_sh(const char *log, const char *fmt, ...)
{
	char cmd[4096];
	va_list ap;
	int n, st;

	va_start(ap, fmt);
	n = vsnprintf(cmd, sizeof(cmd) - 64 - strlen(log), fmt, ap);
	va_end(ap);
	CHECK_MSG(n > 0 && (size_t)n < sizeof(cmd) - 64 - strlen(log), "command too long");
	snprintf(cmd + n, sizeof(cmd) - n, " >'%s' 2>&1", log);
	st = system(cmd);
	if (st == -1 || !WIFEXITED(st))
		return -1;
	return WEXITSTATUS(st);
}

const char *hyb_test_synth(const char *name, const char *args)
{
	static char paths[4][512]; /* a few in use at once */
	static unsigned int next;
	char *path = paths[next++ % 4], cmd[1536];

	if (access(hyb_test_hybctl(), X_OK))
		SKIP("%s not built (run from the repository root after make)", hyb_test_hybctl());
	snprintf(path, sizeof(paths[0]), "%s/%s.gguf", hyb_test_tmpdir(), name);
	snprintf(cmd, sizeof(cmd), "%s synth -o %s %s -t 2 >/dev/null", hyb_test_hybctl(), path,
		 args);
	CHECK_MSG(system(cmd) == 0, "%s failed", cmd);
	return path;
}

void hyb_test_show_log(const char *log)
{
	char line[512];
	long lines = 0, skip;
	FILE *f = fopen(log, "r");

	if (!f)
		return;
	while (fgets(line, sizeof(line), f))
		lines++;
	skip = lines > 40 ? lines - 40 : 0;
	rewind(f);
	for (long i = 0; fgets(line, sizeof(line), f); i++)
		if (i >= skip)
			fprintf(stderr, "    | %s", line);
	fclose(f);
}

void hyb_test_need_venv(void)
{
	char log[512], line[512] = "";
	FILE *f;
	int rc;

	snprintf(log, sizeof(log), "%s/venv.log", hyb_test_tmpdir());
	rc = hyb_test_sh(log, "bash tests/oracle/venv.sh");
	if (rc == 0)
		return;
	f = fopen(log, "r");
	if (f) {
		if (!fgets(line, sizeof(line), f))
			line[0] = 0;
		fclose(f);
		line[strcspn(line, "\n")] = 0;
	}
	if (rc == 3)
		SKIP("no Python oracle environment: %s", line);
	hyb_test_show_log(log);
	CHECK_MSG(0, "tests/oracle/venv.sh failed (exit %d)", rc);
}

const char *hyb_test_real_model(const char *name)
{
	static char paths[4][512];
	static const char *names[4];
	char log[512];
	FILE *f;
	int rc, i;

	for (i = 0; i < 4 && names[i]; i++)
		if (!strcmp(names[i], name))
			return paths[i];
	CHECK_MSG(i < 4, "too many real models");
	snprintf(log, sizeof(log), "%s/fetch-%s.log", hyb_test_tmpdir(), name);
	rc = hyb_test_sh(log, "bash tests/data/fetch-models.sh %s", name);
	if (rc == 3)
		SKIP("%s cannot be fetched here (offline?)", name);
	if (rc) {
		hyb_test_show_log(log);
		CHECK_MSG(0, "tests/data/fetch-models.sh %s failed (exit %d)", name, rc);
	}
	f = fopen(log, "r");
	CHECK(f);
	CHECK(fgets(paths[i], sizeof(paths[i]), f));
	fclose(f);
	paths[i][strcspn(paths[i], "\n")] = 0;
	names[i] = name;
	return paths[i];
}
