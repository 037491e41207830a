// SPDX-License-Identifier: MIT
/*
 * The public API's boundary: libhyb.so exports hyb_* only, under its soname,
 * and an application outside the tree builds against an installed copy with
 * pkg-config alone (tests/api/app.c).
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyb/generate.h"
#include "hyb/gguf.h"
#include "hyb/model.h"
#include "hyb/planner.h"
#include "hyb/pool.h"
#include "hyb/profile.h"
#include "hyb/sampler.h"
#include "test.h"

/* The build folder: where hybctl is ($HYB_TEST_HYBCTL or build/hybctl). */
static void build_dir(char *buf, size_t len)
{
	const char *ctl = hyb_test_hybctl(), *slash = strrchr(ctl, '/');

	snprintf(buf, len, "%.*s", slash ? (int)(slash - ctl) : 1, slash ? ctl : ".");
}

TEST(api_so_exports_hyb_only)
{
	char b[PATH_MAX], log[PATH_MAX + 64], line[512];
	int bad = 0, n = 0;
	FILE *f;

	build_dir(b, sizeof(b));
	snprintf(log, sizeof(log), "%s/nm.log", hyb_test_tmpdir());
	if (hyb_test_sh(log, "test -f '%s/libhyb.so.0'", b))
		SKIP("%s/libhyb.so.0 is not built", b);
	CHECK_EQ_INT(hyb_test_sh(log, "nm -D --defined-only '%s/libhyb.so.0' | awk '{print $3}'",
				 b), 0);
	f = fopen(log, "r");
	CHECK(f);
	while (fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\n")] = 0;
		if (!strcmp(line, "HYB_0"))	/* the version node */
			continue;
		n++;
		if (strncmp(line, "hyb_", 4)) {
			if (bad++ < 10)
				fprintf(stderr, "    exported without the prefix: %s\n", line);
		}
	}
	fclose(f);
	CHECK_MSG(n > 100, "only %d symbols exported", n);
	CHECK_EQ_INT(bad, 0);
	CHECK_EQ_INT(hyb_test_sh(log, "objdump -p '%s/libhyb.so.0' | grep -q 'SONAME *libhyb.so.0'",
				 b), 0);
}

TEST(api_app_builds_with_pkg_config)
{
	const char *t = hyb_test_tmpdir();
	char b[PATH_MAX], log[PATH_MAX + 64];

	build_dir(b, sizeof(b));
	snprintf(log, sizeof(log), "%s/app.log", t);
	if (hyb_test_sh(log, "test -f '%s/libhyb.so.0' && test -f '%s/hyb.pc' && "
			"command -v pkg-config", b, b))
		SKIP("libhyb.so, hyb.pc or pkg-config missing");
	/* an installed copy under a prefix of its own, as make install lays it out */
	int rc = hyb_test_sh(log,
		"set -e; p='%s/prefix'; mkdir -p \"$p/include\" \"$p/lib/pkgconfig\"; "
		"cp -r libhyb/include/hyb \"$p/include/\"; cp -P '%s'/libhyb.so* \"$p/lib/\"; "
		"cp '%s/hyb.pc' \"$p/lib/pkgconfig/\"; "
		"export PKG_CONFIG_PATH=\"$p/lib/pkgconfig\"; "
		"cc -std=c11 -Wall -Wextra -Werror tests/api/app.c -o '%s/app' "
		"$(pkg-config --define-variable=prefix=\"$p\" --cflags --libs hyb); "
		"LD_LIBRARY_PATH=\"$p/lib\" ldd '%s/app' | grep -q \"$p/lib/libhyb.so.0\"; "
		"LD_LIBRARY_PATH=\"$p/lib\" '%s/app' '%s'",
		t, b, b, t, t, t, hyb_test_plan());
	if (rc)
		hyb_test_show_log(log);
	CHECK_EQ_INT(rc, 0);
	/* a bad file: the library's error, no crash */
	rc = hyb_test_sh(log, "LD_LIBRARY_PATH='%s/prefix/lib' '%s/app' /nonexistent.gguf", t, t);
	CHECK_EQ_INT(rc, 1);
}

static void *read_last_error(void *arg)
{
	*(const char **)arg = hyb_last_error();
	return NULL;
}

/* A failing call leaves its message for its own thread only (hyb/error.h). */
TEST(api_last_error_per_thread)
{
	struct hyb_backend *b = hyb_backend_open(HYB_BACKEND_LOCAL);
	struct hyb_mempool *p = NULL;
	const char *other = NULL;
	pthread_t t;
	int rc;

	CHECK(b);
	rc = hyb_mempool_create(b, "bad/name", 1 << 21, 0, 0, 0, &p);
	CHECK_MSG(rc < 0 && rc != -1, "rc %d: a negative errno", rc);
	CHECK_MSG(strstr(hyb_last_error(), "bad/name"), "message '%s'", hyb_last_error());
	CHECK_EQ_INT(pthread_create(&t, NULL, read_last_error, &other), 0);
	CHECK_EQ_INT(pthread_join(t, NULL), 0);
	CHECK(other && !*other);
	hyb_backend_close(b);
}

/*
 * Each header family follows the convention (docs/API.md, "Errors"): bad
 * input gives a negative errno that says what went wrong, not -1, and a
 * message that names the culprit.
 */
TEST(api_families_return_errno_and_message)
{
	char path[PATH_MAX], out[PATH_MAX];
	struct hyb_gguf_file *f = (struct hyb_gguf_file *)1;
	/* more sequences than samples */
	struct hyb_profile prof = { .n_layer = 1, .n_embd = 8, .n_ff = 64, .active_words = 1,
				    .n_seqs = 1 };
	struct hyb_plan_opts o;
	int rc;

	/* gguf.h */
	snprintf(path, sizeof(path), "%s/no-such-model.gguf", hyb_test_tmpdir());
	CHECK_EQ_INT(hyb_gguf_open(path, &f), -ENOENT);
	CHECK(!f);
	CHECK_MSG(strstr(hyb_last_error(), path), "message '%s'", hyb_last_error());
	CHECK_EQ_INT(hyb_gguf_parse("GGML", 4, &f), -EINVAL);
	CHECK_MSG(strstr(hyb_last_error(), "magic"), "message '%s'", hyb_last_error());

	/* profile.h */
	CHECK(!hyb_profile_load(path));
	CHECK_MSG(strstr(hyb_last_error(), path), "message '%s'", hyb_last_error());
	snprintf(out, sizeof(out), "%s/api-profile.gguf", hyb_test_tmpdir());
	CHECK_EQ_INT(hyb_profile_save(&prof, out), -EINVAL);
	CHECK_MSG(strstr(hyb_last_error(), "inconsistent"), "message '%s'", hyb_last_error());

	/* planner.h: the model's load says why */
	hyb_plan_opts_default(&o);
	o.quiet = true;
	snprintf(out, sizeof(out), "%s/api-plan.gguf", hyb_test_tmpdir());
	rc = hyb_plan_make(path, &prof, &o, out);
	CHECK_EQ_INT(rc, -ENOENT);
	CHECK_MSG(strstr(hyb_last_error(), path), "message '%s'", hyb_last_error());

	/* model.h */
	CHECK(!hyb_model_load(path));
	CHECK_MSG(strstr(hyb_last_error(), path), "message '%s'", hyb_last_error());
	CHECK(!hyb_model_load_manifest(""));
	CHECK_MSG(strstr(hyb_last_error(), "empty"), "message '%s'", hyb_last_error());
}

/* The same for a model that loads: contexts, evaluation, generation. */
TEST(api_model_calls_return_errno_and_message)
{
	struct hyb_model *m = hyb_model_load(hyb_test_shared("models/llama-2-tiny-random.gguf"));
	struct hyb_ctx_params p = { .n_ctx = 4, .n_threads = 1 };
	struct hyb_sampler_params sp = hyb_sampler_defaults();
	struct hyb_sampler *s;
	struct hyb_gen_stats st;
	struct hyb_ctx *c;
	int32_t bad, toks[5] = { 1, 2, 3, 4, 5 };
	float *logits;

	if (!m)
		SKIP("%s", hyb_last_error());
	logits = malloc(sizeof(float) * m->hp.n_vocab);
	s = hyb_sampler_new(&sp, (int32_t)m->hp.n_vocab);
	CHECK(logits && s);
	CHECK_EQ_INT(hyb_model_box_check(m), -EINVAL);
	CHECK_MSG(strstr(hyb_last_error(), "not a box-mode model"), "message '%s'",
		  hyb_last_error());
	p.testing = 0x80000000u;
	CHECK(!hyb_ctx_new(m, &p));
	CHECK_MSG(strstr(hyb_last_error(), "testing switches"), "message '%s'", hyb_last_error());
	p.testing = 0;
	c = hyb_ctx_new(m, &p);
	CHECK_MSG(c, "%s", hyb_last_error());

	/* generate.h */
	CHECK_EQ_INT(hyb_generate(c, m, s, toks, 0, 1, NULL, NULL, &st), -EINVAL);
	CHECK_MSG(strstr(hyb_last_error(), "empty prompt"), "message '%s'", hyb_last_error());

	bad = (int32_t)m->hp.n_vocab;
	CHECK_EQ_INT(hyb_ctx_eval(c, &bad, 1, logits, false), -EINVAL);
	CHECK_MSG(strstr(hyb_last_error(), "out of range"), "message '%s'", hyb_last_error());
	CHECK_EQ_INT(hyb_ctx_eval(c, toks, 5, logits, false), -ENOSPC);
	CHECK_MSG(strstr(hyb_last_error(), "context full"), "message '%s'", hyb_last_error());
	CHECK_EQ_INT(hyb_ctx_eval(c, toks, 4, logits, false), 0);
	hyb_ctx_reset(c);
	CHECK_EQ_INT(hyb_generate(c, m, s, toks, 3, 5, NULL, NULL, &st), -ENOSPC);
	CHECK_MSG(strstr(hyb_last_error(), "context full"), "message '%s'", hyb_last_error());
	hyb_sampler_free(s);
	hyb_ctx_free(c);
	hyb_model_free(m);
	free(logits);
}
