// SPDX-License-Identifier: MIT
/*
 * hyb_device_predict on the "cuda" device (kernels/cuda/predict.cu) against
 * the "cpu" device and hyb_predictor_run: random F16 predictors at the 7B
 * shape (4096 -> 224 -> 11008) and small odd shapes (n_in % 64 == 32, n_out
 * not a multiple of 8 or 16, hidden past one staging segment, weights only
 * 2-byte aligned), several inputs each, every input both unit-RMS
 * normalised (the default) and as it is (raw_x: same-layer predictors, whose
 * CUDA sums have no scale to differ in). The active lists must be the CPU's
 * but for outputs whose host logit lies within 1e-3 of zero (where float
 * summation order may put them on the other side; on an AVX-512 host the
 * CUDA sums are the CPU's and the lists are identical: the test prints how
 * many calls were). gpu_pred_timing prints microseconds per call and the
 * bandwidth of the bytes a call must read against the device-memory
 * ceiling measured in the same run (a device-to-device copy). Skipped
 * without a GPU. HYB_GPU_TEST_SMALL=1 (host emulation of CUDA) runs fewer
 * inputs and timing iterations.
 */
#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "cuda_kernels.h"
#include "sparse/sparse_layer.h"
#include "gpu_test.h"
#include "hyb/device.h"
#include "hyb/plan.h"
#include "test.h"

#define MiB (1ull << 20)
#define NEAR_ZERO 1e-3

static bool small_run(void)
{
	const char *s = getenv("HYB_GPU_TEST_SMALL");

	return s && *s && strcmp(s, "0");
}

static struct hyb_device *open_kind(const char *kind)
{
	struct hyb_device_config cfg = { .capacity = 512 * MiB };
	struct hyb_device *d = hyb_device_open(kind, &cfg);

	CHECK_MSG(d, "open %s: %s", kind, hyb_last_error());
	return d;
}

#define OK(d, call)                                                                      \
	do {                                                                             \
		int rc_ = (call);                                                        \
		CHECK_MSG(rc_ == 0, "%s: %s -> %d (%s)", hyb_device_kind(d), #call, rc_, \
			  hyb_device_error(d));                                          \
	} while (0)

static void drain(struct hyb_device *d)
{
	struct hyb_device_event *ev = hyb_device_event_new(d);

	CHECK_MSG(ev, "event: %s", hyb_device_error(d));
	OK(d, hyb_device_record(d, HYB_STREAM_COMPUTE, ev));
	OK(d, hyb_device_sync(d, ev));
	hyb_device_event_free(d, ev);
}

/* ---- a random predictor ------------------------------------------------------------- */

/*
 * Scaled so that about half the hidden units fire and about a third of the
 * outputs are active (a trained 7B predictor: 40-60% and 10-40%).
 */
struct pred {
	uint32_t n_in, hidden, n_out;
	uint16_t *w1, *w2;
	float *b1, *b2;
	struct hyb_predictor hp;
};

static void make_pred(struct pred *P, uint32_t n_in, uint32_t hidden, uint32_t n_out)
{
	const float s1 = 1.7f / sqrtf((float)n_in), s2 = 2.0f / sqrtf((float)hidden);

	P->n_in = n_in;
	P->hidden = hidden;
	P->n_out = n_out;
	P->w1 = malloc(2ull * hidden * n_in);
	P->w2 = malloc(2ull * hidden * n_out);
	P->b1 = malloc(4ull * hidden);
	P->b2 = malloc(4ull * n_out);
	CHECK(P->w1 && P->w2 && P->b1 && P->b2);
	for (size_t i = 0; i < (size_t)hidden * n_in; i++)
		P->w1[i] = hyb_f32_to_f16(rndf() * s1);
	for (size_t i = 0; i < (size_t)hidden * n_out; i++)
		P->w2[i] = hyb_f32_to_f16(rndf() * s2);
	for (uint32_t i = 0; i < hidden; i++)
		P->b1[i] = rndf() * 0.3f;
	for (uint32_t i = 0; i < n_out; i++)
		P->b2[i] = rndf() * 0.5f - 0.4f;
	P->hp = (struct hyb_predictor){ .n_in = n_in, .hidden = hidden, .n_out = n_out,
					.fc1_w = P->w1, .fc1_b = P->b1, .fc2_w = P->w2,
					.fc2_b = P->b2 };
}

static void free_pred(struct pred *P)
{
	free(P->w1);
	free(P->w2);
	free(P->b1);
	free(P->b2);
}

/* x: a few large entries over a noise floor, like an attention output */
static void make_x(float *x, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		x[i] = rndf() * 3 + (rnd() % 29 == 0 ? 20 * rndf() : 0);
}

/* A device's copy of a predictor, the weights at byte offset off of their allocations. */
struct side {
	struct hyb_device *d;
	hyb_dptr w1a, w2a, b1, b2, x, active, count, logits;
	struct hyb_dev_predict p;
	float *lg;  /* the scores of the last predict, on the host */
};

static hyb_dptr dalloc(struct hyb_device *d, uint64_t bytes)
{
	hyb_dptr p = 0;

	OK(d, hyb_device_alloc(d, bytes, &p));
	return p;
}

static void put(struct hyb_device *d, hyb_dptr dst, const void *src, uint64_t len)
{
	OK(d, hyb_device_h2d(d, HYB_STREAM_COMPUTE, dst, src, len));
	drain(d);
}

static void upload(struct side *s, struct hyb_device *d, const struct pred *P, uint32_t off)
{
	const uint64_t n1 = 2ull * P->hidden * P->n_in, n2 = 2ull * P->hidden * P->n_out;

	s->d = d;
	s->w1a = dalloc(d, n1 + off);
	s->w2a = dalloc(d, n2 + off);
	s->b1 = dalloc(d, 4ull * P->hidden);
	s->b2 = dalloc(d, 4ull * P->n_out);
	s->x = dalloc(d, 4ull * P->n_in);
	s->active = dalloc(d, 4ull * P->n_out);
	s->count = dalloc(d, 4);
	s->logits = dalloc(d, 4ull * P->n_out);
	s->lg = malloc(4ull * P->n_out);
	CHECK(s->lg);
	put(d, s->w1a + off, P->w1, n1);
	put(d, s->w2a + off, P->w2, n2);
	put(d, s->b1, P->b1, 4ull * P->hidden);
	put(d, s->b2, P->b2, 4ull * P->n_out);
	s->p = (struct hyb_dev_predict){
		.n_in = P->n_in, .hidden = P->hidden, .n_out = P->n_out,
		.fc1_w = s->w1a + off, .fc1_b = s->b1, .fc2_w = s->w2a + off, .fc2_b = s->b2,
		.x = s->x, .active = s->active, .count = s->count, .logits = s->logits,
	};
}

static void release(struct side *s)
{
	hyb_dptr *p[] = { &s->w1a, &s->w2a, &s->b1, &s->b2, &s->x, &s->active, &s->count,
			  &s->logits };

	for (size_t i = 0; i < sizeof(p) / sizeof(p[0]); i++)
		hyb_device_free(s->d, *p[i]);
	free(s->lg);
}

/* Run the predictor on x; the list to out (n_out entries), the count returned. */
static uint32_t predict(struct side *s, const float *x, uint32_t *out)
{
	const uint32_t garbage = 0xdeadbeef;
	uint32_t cnt = 0;

	put(s->d, s->x, x, 4ull * s->p.n_in);
	put(s->d, s->count, &garbage, 4);
	OK(s->d, hyb_device_predict(s->d, HYB_STREAM_COMPUTE, &s->p));
	OK(s->d, hyb_device_d2h(s->d, HYB_STREAM_COMPUTE, &cnt, s->count, 4));
	drain(s->d);
	CHECK_MSG(cnt <= s->p.n_out, "%s: count %u > n_out %u", hyb_device_kind(s->d), cnt,
		  s->p.n_out);
	OK(s->d, hyb_device_d2h(s->d, HYB_STREAM_COMPUTE, out, s->active, 4ull * cnt));
	OK(s->d, hyb_device_d2h(s->d, HYB_STREAM_COMPUTE, s->lg, s->logits, 4ull * s->p.n_out));
	drain(s->d);
	return cnt;
}

/* ---- comparison ---------------------------------------------------------------------- */

struct tally {
	uint32_t calls, identical, flips, near_zero, active, outputs;
};

/*
 * One input through both devices and the host (unit RMS first, or as it is
 * with raw): the CPU device must be the host's bits; the CUDA list must be
 * strictly increasing and differ from the host's only at outputs whose host
 * logit is within NEAR_ZERO of 0.
 */
static void compare_one(struct side *gpu, struct side *cpu, const struct pred *P,
			const float *x, bool raw, struct tally *t)
{
	const uint32_t n_out = P->n_out;
	float *xu = malloc(4ull * P->n_in), *lg = malloc(4ull * n_out);
	uint32_t *ref = malloc(4ull * n_out), *got = malloc(4ull * n_out);
	uint32_t *cgot = malloc(4ull * n_out);
	uint8_t *in_ref = calloc(n_out, 1), *in_got = calloc(n_out, 1);
	void *scr = malloc(hyb_predictor_scratch_bytes(&P->hp) + 64);
	uint32_t n_ref, n_got, n_cpu, flips = 0, near = 0;

	CHECK(xu && lg && ref && got && cgot && in_ref && in_got && scr);
	gpu->p.raw_x = cpu->p.raw_x = raw;
	if (raw)
		memcpy(xu, x, 4ull * P->n_in);
	else
		hyb_unit_rms(xu, x, P->n_in);
	n_ref = hyb_predictor_run(&P->hp, xu, NULL, scr, lg, ref);
	n_cpu = predict(cpu, x, cgot);
	CHECK_EQ_INT(n_cpu, n_ref);
	CHECK(!memcmp(cgot, ref, 4ull * n_ref));
	CHECK(!memcmp(cpu->lg, lg, 4ull * n_out));
	n_got = predict(gpu, x, got);
	for (uint32_t i = 0; i < n_got; i++) {
		CHECK_MSG(got[i] < n_out && (i == 0 || got[i] > got[i - 1]),
			  "cuda list not increasing at %u: %u after %u", i, got[i],
			  i ? got[i - 1] : 0);
		in_got[got[i]] = 1;
	}
	for (uint32_t i = 0; i < n_ref; i++)
		in_ref[ref[i]] = 1;
	for (uint32_t r = 0; r < n_out; r++) {
		/* the scores (load-aware thresholds): the list's, close to the host's */
		CHECK_MSG((gpu->lg[r] > 0) == in_got[r] &&
				  fabs(gpu->lg[r] - lg[r]) <= NEAR_ZERO + 1e-4 * fabs(lg[r]),
			  "output %u: cuda score %.6g, host %.6g, listed %d", r, gpu->lg[r], lg[r],
			  in_got[r]);
		near += fabs(lg[r]) < NEAR_ZERO;
		if (in_got[r] == in_ref[r])
			continue;
		CHECK_MSG(fabs(lg[r]) < NEAR_ZERO,
			  "%u -> %u -> %u%s: output %u %s on cuda, host logit %.6g", P->n_in,
			  P->hidden, n_out, raw ? " (raw x)" : "", r,
			  in_got[r] ? "active" : "inactive", lg[r]);
		flips++;
	}
	t->calls++;
	t->identical += flips == 0 && n_got == n_ref;
	t->flips += flips;
	t->near_zero += near;
	t->active += n_ref;
	t->outputs += n_out;
	free(xu);
	free(lg);
	free(ref);
	free(got);
	free(cgot);
	free(in_ref);
	free(in_got);
	free(scr);
}

static void compare_shape(uint32_t n_in, uint32_t hidden, uint32_t n_out, uint32_t off,
			  int n_x)
{
	struct hyb_device *gd = open_kind("cuda"), *cd = open_kind("cpu");
	struct side gpu, cpu;
	struct tally t[2] = { { 0 } };
	struct pred P;
	float *x = malloc(4ull * n_in);

	CHECK(x);
	make_pred(&P, n_in, hidden, n_out);
	upload(&gpu, gd, &P, off);
	upload(&cpu, cd, &P, off);
	for (int i = 0; i < n_x; i++) {
		make_x(x, n_in);
		if (i == 1) /* an all-zero input: scale 0, h = relu(b1) */
			memset(x, 0, 4ull * n_in);
		for (int raw = 0; raw < 2; raw++)
			compare_one(&gpu, &cpu, &P, x, raw, &t[raw]);
	}
	for (int raw = 0; raw < 2; raw++)
		printf("    predict %4u -> %4u -> %5u%s%s: %u/%u calls identical to the CPU, "
		       "%u flips (%u logits within %g of 0), %.1f%% active\n", n_in, hidden,
		       n_out, off ? " (weights 2-byte aligned)" : "", raw ? " raw x" : "",
		       t[raw].identical, t[raw].calls, t[raw].flips, t[raw].near_zero, NEAR_ZERO,
		       100.0 * t[raw].active / t[raw].outputs);
	release(&gpu);
	release(&cpu);
	free_pred(&P);
	free(x);
	hyb_device_close(gd);
	hyb_device_close(cd);
}

TEST(gpu_pred_7b_shape)
{
	need_gpu();
	compare_shape(4096, 224, 11008, 0, small_run() ? 2 : 16);
}

TEST(gpu_pred_odd)
{
	const int n = small_run() ? 2 : 8;

	need_gpu();
	compare_shape(128, 48, 300, 0, n);   /* n_out % 8 != 0: element loads, 12 unfused */
	compare_shape(96, 50, 1000, 0, n);   /* n_in % 64 == 32, hidden % 4 != 0 */
	compare_shape(96, 50, 1000, 2, n);   /* fc1 and fc2 only 2-byte aligned */
	compare_shape(64, 1100, 200, 0, n);  /* hidden over two segments, many batches */
	compare_shape(64, 40, 20000, 0, n);  /* more than 256 tiles to compact */
	compare_shape(160, 40, 5, 0, n);     /* one partial tile */
}

/* Calls on one stream reuse the workspace: results stay the same call after call. */
TEST(gpu_pred_repeat)
{
	const uint32_t n_in = 256, hidden = 64, n_out = 2000;
	struct hyb_device *d;
	struct side s;
	struct pred P;
	float *x = malloc(4ull * n_in);
	uint32_t *a0 = malloc(4ull * n_out), *a1 = malloc(4ull * n_out), n0, n1 = 0;

	need_gpu();
	CHECK(x && a0 && a1);
	d = open_kind("cuda");
	make_pred(&P, n_in, hidden, n_out);
	upload(&s, d, &P, 0);
	make_x(x, n_in);
	n0 = predict(&s, x, a0);
	put(d, s.x, x, 4ull * n_in);
	for (int i = 0; i < 20; i++)
		OK(d, hyb_device_predict(d, HYB_STREAM_COMPUTE, &s.p));
	OK(d, hyb_device_d2h(d, HYB_STREAM_COMPUTE, &n1, s.count, 4));
	drain(d);
	CHECK_EQ_INT(n1, n0);
	OK(d, hyb_device_d2h(d, HYB_STREAM_COMPUTE, a1, s.active, 4ull * n1));
	drain(d);
	CHECK(!memcmp(a0, a1, 4ull * n0));
	release(&s);
	free_pred(&P);
	free(x);
	free(a0);
	free(a1);
	hyb_device_close(d);
}

/*
 * The 7B shape: microseconds per call (calls queued back to back, and one
 * at a time with a sync), and the bandwidth of the bytes a call must read -
 * fc1, the fc2 rows of the hidden units that fire, biases, x, the list -
 * against the device-memory ceiling measured in the same run.
 */
TEST(gpu_pred_timing)
{
	const uint32_t n_in = 4096, hidden = 224, n_out = 11008;
	const uint32_t iters = small_run() ? 2 : 500, alone = small_run() ? 1 : 100;
	struct hyb_device_event *ev;
	struct hyb_device *d;
	struct side s;
	struct pred P;
	float *x = malloc(4ull * n_in), *xu = malloc(4ull * n_in);
	uint32_t *act = malloc(4ull * n_out), cnt, fired = 0;
	double peak, t0, dt, lat, bytes;

	need_gpu_hardware();
	CHECK(x && xu && act);
	peak = gpu_copy_gbps();
	CHECK(peak > 0);
	d = open_kind("cuda");
	ev = hyb_device_event_new(d);
	CHECK(ev);
	make_pred(&P, n_in, hidden, n_out);
	upload(&s, d, &P, 0);
	make_x(x, n_in);
	cnt = predict(&s, x, act);
	/* hidden units that fire (double sums: near enough for a byte count) */
	hyb_unit_rms(xu, x, n_in);
	for (uint32_t u = 0; u < hidden; u++) {
		double a = P.b1[u];

		for (uint32_t i = 0; i < n_in; i++)
			a += (double)hyb_f16_to_f32(P.w1[(size_t)u * n_in + i]) *
			     hyb_f16_to_f32(hyb_f32_to_f16(xu[i]));
		fired += a > 0;
	}
	for (int i = 0; i < 10; i++)
		OK(d, hyb_device_predict(d, HYB_STREAM_COMPUTE, &s.p));
	drain(d);
	t0 = hyb_device_now(d);
	for (uint32_t i = 0; i < iters; i++)
		OK(d, hyb_device_predict(d, HYB_STREAM_COMPUTE, &s.p));
	drain(d);
	dt = (hyb_device_now(d) - t0) / iters;
	t0 = hyb_device_now(d);
	for (uint32_t i = 0; i < alone; i++) {
		OK(d, hyb_device_predict(d, HYB_STREAM_COMPUTE, &s.p));
		OK(d, hyb_device_record(d, HYB_STREAM_COMPUTE, ev));
		OK(d, hyb_device_sync(d, ev));
	}
	lat = (hyb_device_now(d) - t0) / alone;
	bytes = 2.0 * hidden * n_in + 2.0 * fired * n_out + 4.0 * (hidden + n_out + n_in) +
		4.0 * (cnt + 1);
	printf("    predict %u -> %u -> %u, %u units fire, %u active: %6.1f us/call queued, "
	       "%6.1f us alone, %5.2f MB read, %5.0f GB/s (%4.1f%% of the %.0f GB/s copy)\n", n_in,
	       hidden, n_out, fired, cnt, dt * 1e6, lat * 1e6, bytes / 1e6, bytes / dt / 1e9,
	       100 * bytes / dt / 1e9 / peak, peak);
	hyb_device_event_free(d, ev);
	release(&s);
	free_pred(&P);
	free(x);
	free(xu);
	free(act);
	hyb_device_close(d);
}
