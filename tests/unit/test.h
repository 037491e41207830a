/* SPDX-License-Identifier: MIT */
/*
 * The test runner's interface. A test is a function declared with TEST();
 * it registers itself at start-up and runs in a child process of its own, so
 * a crash or a hang fails that test and not the run.
 *
 *   TEST(gguf_rejects_bad_magic) { CHECK(parse(...) < 0); }
 *
 * CHECK* stop the test at the first failure; SKIP("why") ends it as skipped
 * (counted apart, shown with its reason).
 */
#ifndef HYB_TEST_H
#define HYB_TEST_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

struct hyb_test {
	const char *name;
	void (*fn)(void);
	struct hyb_test *next;
};

void hyb_test_register(struct hyb_test *t);
_Noreturn void hyb_test_fail(const char *file, int line, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
_Noreturn void hyb_test_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Path under the shared test-data folder (../shared by default, $HYB_SHARED). */
const char *hyb_test_shared(const char *rel);
/* A fresh temporary directory for this test (removed by the runner). */
const char *hyb_test_tmpdir(void);
/*
 * A small sparse plan model (hybctl synth -> profile -> plan; 256/1024, 3
 * layers, ReLU, Q8_0), made once per test process in its tmpdir; SKIPs when
 * build/hybctl (or $HYB_TEST_HYBCTL) is missing. plan_fixture.c.
 */
const char *hyb_test_plan(void);
/* build/hybctl, or $HYB_TEST_HYBCTL. */
const char *hyb_test_hybctl(void);
/* Index of the largest of n values (the first on ties): the greedy token. plan_fixture.c */
int32_t hyb_test_argmax(const float *v, uint32_t n);
/* Greedy agreement of two contexts: counts and the largest logit differences. */
struct hyb_test_agreement {
	uint32_t agree, total;
	double max_diff; /* absolute */
	double max_rel;  /* relative to the largest logit of a's */
};
struct hyb_ctx;
/*
 * Both contexts are reset and fed a prompt of n_prompt (<= 64) pseudo-random
 * tokens (from seed), then a's greedy continuation of n_gen tokens; from
 * generated position `skip` on, counts where b's greedy pick agrees and
 * tracks the logit differences. plan_fixture.c
 */
/* A context of m: 256 positions, one thread, FFN mode ffn (enum hyb_ffn_mode). plan_fixture.c */
struct hyb_model;
struct hyb_ctx *hyb_test_ctx(const struct hyb_model *m, int ffn);
void hyb_test_greedy_compare(struct hyb_ctx *a, struct hyb_ctx *b, uint32_t V, uint32_t seed,
			     uint32_t n_prompt, uint32_t n_gen, uint32_t skip,
			     struct hyb_test_agreement *r);
/* Runs a shell command with its output in log; its exit status (-1: killed). shell_fixture.c */
int hyb_test_sh(const char *log, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* hybctl synth -o TMPDIR/NAME.gguf ARGS: the path (SKIPs without hybctl). shell_fixture.c */
const char *hyb_test_synth(const char *name, const char *args);
/*
 * n random GGUF rows of len elements of type (F32, F16, Q8_0, Q4_0: values
 * in [-1, 1), block scales in [0.01, 0.05)), malloc'd; the same for a seed
 * on every binary. rows_fixture.c
 */
uint8_t *hyb_test_rand_rows(uint32_t type, uint32_t n, uint32_t len, uint64_t seed);
/* The last 40 lines of a log on stderr, so a failure shows its cause. */
void hyb_test_show_log(const char *log);
/* .venv for the Python oracles (tests/oracle/venv.sh); SKIPs when it cannot exist here. */
void hyb_test_need_venv(void);
/*
 * A real model file (tests/data/fetch-models.sh NAME: smollm2, gemma3),
 * fetched once into models/; SKIPs when it cannot be had (offline). The
 * path stays valid for the process. shell_fixture.c
 */
const char *hyb_test_real_model(const char *name);

#define TEST(fn_name)                                                                  \
	static void fn_name(void);                                                     \
	static struct hyb_test fn_name##_entry = { #fn_name, fn_name, NULL };          \
	__attribute__((constructor)) static void fn_name##_register(void)              \
	{                                                                              \
		hyb_test_register(&fn_name##_entry);                                   \
	}                                                                              \
	static void fn_name(void)

#define CHECK(cond)                                                                    \
	do {                                                                           \
		if (!(cond))                                                           \
			hyb_test_fail(__FILE__, __LINE__, "%s", #cond);                \
	} while (0)

#define CHECK_MSG(cond, ...)                                                           \
	do {                                                                           \
		if (!(cond))                                                           \
			hyb_test_fail(__FILE__, __LINE__, __VA_ARGS__);                \
	} while (0)

#define CHECK_EQ_INT(a, b)                                                             \
	do {                                                                           \
		long long a_ = (long long)(a), b_ = (long long)(b);                    \
		if (a_ != b_)                                                          \
			hyb_test_fail(__FILE__, __LINE__, "%s == %s (%lld vs %lld)",   \
				      #a, #b, a_, b_);                                 \
	} while (0)

#define CHECK_NEAR(a, b, tol)                                                          \
	do {                                                                           \
		double a_ = (double)(a), b_ = (double)(b);                             \
		if (!(fabs(a_ - b_) <= (tol)))                                         \
			hyb_test_fail(__FILE__, __LINE__, "%s ~ %s (%g vs %g, tol %g)", \
				      #a, #b, a_, b_, (double)(tol));                  \
	} while (0)

#define SKIP(...) hyb_test_skip(__VA_ARGS__)

#endif
