// SPDX-License-Identifier: MIT
/*
 * The device layer on the CPU device (libhyb/device/device.c, device_cpu.c): memory
 * and capacity, argument checks, copies, the modelled clock (serialization,
 * full duplex, kernel/copy overlap, events, pre-emption of reloads), the
 * sparse FFN kernel against the CPU operator, and the dense kernels
 * (rmsnorm, matvec, attention) against the CPU forward pass's code, bit for
 * bit, and against plain double arithmetic.
 *
 * Timing checks never depend on wall-clock luck: the host's own time between
 * two marks (real time minus the time spent inside device calls, both
 * measured) is the only slack, so a modelled interval D must read as
 * D <= dt <= D + own; modelled links and memories are made slow so that D
 * dwarfs own on a quiet machine, and the bounds stay correct on a busy one.
 */
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "forward/attention.h"
#include "cpu_kernels.h"
#include "device/device_internal.h"
#include "sparse/sparse_layer.h"
#include "hybrid/dense.h"
#include "hyb/device.h"
#include "hyb/hybrid.h"
#include "hyb/model.h"
#include "hyb/plan.h"
#include "hyb/tensor_type.h"
#include "hyb/testing.h"
#include "forward/ops.h"
#include "sparse/sparse_op.h"
#include "sparse/teal.h"
#include "test.h"

#define EPS 20e-6 /* clock reads around the marks */

static uint64_t g_rng = 1;

static uint32_t rnd(void)
{
	g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
	return (uint32_t)(g_rng >> 33);
}

static float rndf(void)
{
	return (float)((double)rnd() / 2147483648.0 * 2 - 1);
}

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);

	CHECK(p);
	return p;
}

static double mono(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A point in time: the device clock and the host's own time so far. */
struct mark {
	double now, own;
};

static struct mark mark(struct hyb_device *d)
{
	struct hyb_device_stats st;
	struct mark m;

	hyb_device_stats(d, &st);
	m.own = mono() - st.inline_s;
	m.now = hyb_device_now(d);
	return m;
}

/* Check that the device time from a to b is the modelled D. */
#define CHECK_DT(a, b, D)                                                                   \
	do {                                                                                \
		const double dt_ = (b).now - (a).now, own_ = (b).own - (a).own;             \
		CHECK_MSG(dt_ >= (D) - 1e-9 && dt_ <= (D) + own_ + EPS,                     \
			  "device time %.6f s, modelled %.6f s, host's own time %.6f s", dt_, \
			  (double)(D), own_);                                               \
	} while (0)

static struct hyb_device *open_cpu(const struct hyb_device_config *cfg)
{
	struct hyb_device *d = hyb_device_open("cpu", cfg);

	CHECK_MSG(d, "open: %s", hyb_last_error());
	return d;
}

static hyb_dptr dalloc(struct hyb_device *d, uint64_t n)
{
	hyb_dptr p;

	CHECK_MSG(hyb_device_alloc(d, n, &p) == 0, "alloc %llu: %s", (unsigned long long)n,
		  hyb_device_error(d));
	return p;
}

static void sync_stream(struct hyb_device *d, enum hyb_stream s)
{
	struct hyb_device_event *ev = hyb_device_event_new(d);

	CHECK(ev);
	CHECK(hyb_device_record(d, s, ev) == 0);
	CHECK(hyb_device_sync(d, ev) == 0);
	CHECK(hyb_device_done(d, ev));
	hyb_device_event_free(d, ev);
}

static void sync_stream_rc(struct hyb_device *d, enum hyb_stream s, int want)
{
	struct hyb_device_event *ev = hyb_device_event_new(d);

	CHECK(ev);
	hyb_device_record(d, s, ev);
	CHECK_EQ_INT(hyb_device_sync(d, ev), want);
	hyb_device_event_free(d, ev);
}

/* ---- open, memory, arguments ------------------------------------------------------ */

TEST(dev_open_kinds)
{
	struct hyb_device_config bad = { .pcie_gbps = -1 };
	struct hyb_device *d;

	CHECK(!hyb_device_open("tpu", NULL));
	CHECK_MSG(strstr(hyb_last_error(), "tpu"), "%s", hyb_last_error());
	CHECK(!hyb_device_open(NULL, NULL) && hyb_last_error()[0]);
	CHECK(!hyb_device_open("cpu", &bad));
	CHECK_MSG(strstr(hyb_last_error(), "config"), "%s", hyb_last_error());

	d = hyb_device_open("cuda", NULL);
	if (d) {
		hyb_device_close(d);
		SKIP("this test binary has a CUDA device");
	}
	CHECK_MSG(strstr(hyb_last_error(), "without CUDA") || strstr(hyb_last_error(), "CUDA") ||
		  strstr(hyb_last_error(), "cuda"), "cuda open failed with '%s'", hyb_last_error());

	d = hyb_device_open("cpu", NULL);
	CHECK_MSG(d, "%s", hyb_last_error());
	CHECK(!strcmp(hyb_device_kind(d), "cpu"));
	CHECK(!strcmp(hyb_device_error(d), ""));
	CHECK_EQ_INT(hyb_device_capacity(d), 1ull << 30);
	CHECK_EQ_INT(hyb_device_used(d), 0);
	{
		struct hyb_device_config c;

		hyb_device_get_config(d, &c);
		CHECK_EQ_INT(c.capacity, 1ull << 30);
		CHECK_EQ_INT(c.chunk_bytes, 1 << 20);
		CHECK(c.pcie_gbps == 25 && c.pcie_lat_us == 8 && c.hbm_gbps == 2000 &&
		      c.launch_us == 5);
	}
	hyb_device_close(d);
	hyb_device_close(NULL);
}

TEST(dev_alloc_capacity)
{
	const uint64_t MB = 1 << 20;
	struct hyb_device_config cfg = { .capacity = 4 * MB };
	struct hyb_device *d = open_cpu(&cfg);
	hyb_dptr p[4], q, r, x;
	char *buf = xmalloc(MB);

	for (int i = 0; i < 4; i++) {
		p[i] = dalloc(d, MB);
		CHECK(p[i] % 256 == 0);
	}
	CHECK_EQ_INT(hyb_device_used(d), 4 * MB);
	CHECK_EQ_INT(hyb_device_alloc(d, 1, &x), -ENOMEM);
	CHECK_MSG(strstr(hyb_device_error(d), "1 bytes asked") &&
		  strstr(hyb_device_error(d), "4194304"), "%s", hyb_device_error(d));
	/* every byte is usable */
	memset(buf, 0x5a, MB);
	for (int i = 0; i < 4; i++)
		CHECK(hyb_device_h2d(d, HYB_STREAM_RELOAD, p[i], buf, MB) == 0);

	hyb_device_free(d, p[1]);
	CHECK_EQ_INT(hyb_device_used(d), 3 * MB);
	CHECK_EQ_INT(hyb_device_alloc(d, MB + 1, &x), -ENOMEM);
	q = dalloc(d, 100);
	CHECK(q % 256 == 0);
	CHECK_EQ_INT(hyb_device_used(d), 3 * MB + 100);
	r = dalloc(d, MB - 100);
	CHECK_EQ_INT(hyb_device_used(d), 4 * MB);
	CHECK_EQ_INT(hyb_device_alloc(d, 1, &x), -ENOMEM);
	CHECK_EQ_INT(hyb_device_alloc(d, 0, &x), -EINVAL);
	CHECK_EQ_INT(hyb_device_alloc(d, 1, NULL), -EINVAL);

	/* bad frees change nothing */
	hyb_device_free(d, 0);
	hyb_device_free(d, q + 4);
	CHECK_MSG(strstr(hyb_device_error(d), "not an allocation"), "%s", hyb_device_error(d));
	CHECK_EQ_INT(hyb_device_used(d), 4 * MB);

	hyb_device_free(d, q);
	hyb_device_free(d, r);
	for (int i = 0; i < 4; i++)
		if (i != 1)
			hyb_device_free(d, p[i]);
	CHECK_EQ_INT(hyb_device_used(d), 0);
	/* a big one is fine again, and close frees what is left */
	x = dalloc(d, 4 * MB);
	CHECK(hyb_device_h2d(d, HYB_STREAM_CRITICAL, x + 3 * MB, buf, MB) == 0);
	hyb_device_close(d); /* it waits for the copy, which reads buf until then */
	free(buf);
}

/* Another owner's memory (box mode: hybd's cache): addressable, not counted, never freed. */
TEST(dev_adopt_foreign_memory)
{
	const uint64_t MB = 1 << 20;
	struct hyb_device_config cfg = { .capacity = MB };
	struct hyb_device *d = open_cpu(&cfg);
	uint8_t *ext = aligned_alloc(4096, 2 * MB), *buf = xmalloc(MB);
	const hyb_dptr e = (hyb_dptr)(uintptr_t)ext;
	hyb_dptr p;

	CHECK(ext);
	memset(buf, 0x3c, MB);
	/* not adopted yet: the device refuses to touch it */
	CHECK_EQ_INT(hyb_device_d2h(d, HYB_STREAM_CRITICAL, buf, e, 64), -EINVAL);
	CHECK_MSG(strstr(hyb_device_error(d), "in no device allocation"), "%s",
		  hyb_device_error(d));
	CHECK(!hyb_device_adopt(d, e, 2 * MB));
	CHECK_EQ_INT(hyb_device_used(d), 0);
	p = dalloc(d, MB); /* the whole capacity is still ours */
	CHECK(!hyb_device_h2d(d, HYB_STREAM_RELOAD, e + MB, buf, MB));
	CHECK(ext[MB] == 0x3c && ext[2 * MB - 1] == 0x3c);
	/* an overrun, an overlap, a misaligned or empty range: refused */
	CHECK_EQ_INT(hyb_device_h2d(d, HYB_STREAM_RELOAD, e + MB + 1, buf, MB), -EINVAL);
	CHECK_EQ_INT(hyb_device_adopt(d, e + MB, 256), -EINVAL);
	CHECK_MSG(strstr(hyb_device_error(d), "overlap"), "%s", hyb_device_error(d));
	CHECK_EQ_INT(hyb_device_adopt(d, p, 256), -EINVAL);
	CHECK_EQ_INT(hyb_device_adopt(d, e + 2 * MB + 4, 256), -EINVAL);
	CHECK_EQ_INT(hyb_device_adopt(d, e + 4 * MB, 0), -EINVAL);
	/* free forgets it; close leaves it to its owner */
	hyb_device_free(d, e);
	CHECK_EQ_INT(hyb_device_used(d), MB);
	CHECK_EQ_INT(hyb_device_d2h(d, HYB_STREAM_CRITICAL, buf, e, 64), -EINVAL);
	CHECK(!hyb_device_adopt(d, e, 2 * MB));
	hyb_device_close(d);
	ext[0] = 1;  /* still ours: close did not unmap it */
	CHECK(ext[MB] == 0x3c);
	free(ext);
	free(buf);
}

TEST(dev_bad_arguments)
{
	struct hyb_device *d = open_cpu(NULL);
	struct hyb_device_event *ev = hyb_device_event_new(d);
	hyb_dptr p = dalloc(d, 4096), q;
	char buf[8192] = { 0 };

	CHECK(ev);
	CHECK(hyb_device_h2d(d, HYB_STREAM_CRITICAL, p, buf, 4096) == 0);
	sync_stream(d, HYB_STREAM_CRITICAL); /* buf is written below */
	CHECK_EQ_INT(hyb_device_h2d(d, HYB_STREAM_CRITICAL, p + 4000, buf, 200), -EINVAL);
	CHECK_MSG(strstr(hyb_device_error(d), "overrun"), "%s", hyb_device_error(d));
	CHECK_EQ_INT(hyb_device_d2h(d, HYB_STREAM_CRITICAL, buf, p - 1, 8), -EINVAL);
	CHECK_EQ_INT(hyb_device_d2h(d, HYB_STREAM_CRITICAL, buf, p, 4097), -EINVAL);
	CHECK_EQ_INT(hyb_device_h2d(d, (enum hyb_stream)3, p, buf, 8), -EINVAL);
	CHECK_MSG(strstr(hyb_device_error(d), "stream"), "%s", hyb_device_error(d));
	CHECK_EQ_INT(hyb_device_h2d(d, (enum hyb_stream)-1, p, buf, 8), -EINVAL);
	CHECK_EQ_INT(hyb_device_h2d(d, HYB_STREAM_CRITICAL, p, NULL, 8), -EINVAL);
	CHECK_EQ_INT(hyb_device_d2h(d, HYB_STREAM_CRITICAL, NULL, p, 8), -EINVAL);
	CHECK_EQ_INT(hyb_device_h2d(d, HYB_STREAM_CRITICAL, 12345, buf, 0), 0); /* no-op */
	CHECK_EQ_INT(hyb_device_add(d, HYB_STREAM_COMPUTE, p + 2, p + 64, 4), -EINVAL);
	CHECK_MSG(strstr(hyb_device_error(d), "aligned"), "%s", hyb_device_error(d));
	CHECK_EQ_INT(hyb_device_add(d, HYB_STREAM_COMPUTE, p, p + 2048, 1024), -EINVAL);
	CHECK_EQ_INT(hyb_device_add(d, HYB_STREAM_COMPUTE, p, p, 0), 0);
	CHECK_EQ_INT(hyb_device_record(d, HYB_STREAM_RELOAD, NULL), -EINVAL);
	CHECK_EQ_INT(hyb_device_wait(d, HYB_STREAM_RELOAD, NULL), -EINVAL);
	CHECK_EQ_INT(hyb_device_sync(d, NULL), -EINVAL);
	CHECK_EQ_INT(hyb_device_record(d, (enum hyb_stream)7, ev), -EINVAL);
	CHECK_EQ_INT(hyb_device_host_register(d, NULL, 8), -EINVAL);
	CHECK_EQ_INT(hyb_device_host_register(d, buf, 0), -EINVAL);
	CHECK_EQ_INT(hyb_device_host_register(d, buf, sizeof(buf)), 0);
	CHECK_EQ_INT(hyb_device_host_unregister(d, buf), 0);
	CHECK_EQ_INT(hyb_device_h2d(NULL, HYB_STREAM_CRITICAL, p, buf, 8), -EINVAL);

	/* freed memory is no longer a device address */
	hyb_device_free(d, p);
	CHECK_EQ_INT(hyb_device_h2d(d, HYB_STREAM_CRITICAL, p, buf, 8), -EINVAL);
	CHECK_MSG(strstr(hyb_device_error(d), "no device allocation"), "%s", hyb_device_error(d));

	/* and the device still works */
	q = dalloc(d, 8192);
	memset(buf, 7, sizeof(buf));
	CHECK(hyb_device_h2d(d, HYB_STREAM_CRITICAL, q, buf, sizeof(buf)) == 0);
	sync_stream(d, HYB_STREAM_CRITICAL);
	memset(buf, 0, sizeof(buf));
	CHECK(hyb_device_d2h(d, HYB_STREAM_CRITICAL, buf, q, sizeof(buf)) == 0);
	sync_stream(d, HYB_STREAM_CRITICAL);
	CHECK(buf[0] == 7 && buf[8191] == 7);

	void *h = hyb_device_host_alloc(d, 100);

	CHECK(h && (uintptr_t)h % 64 == 0);
	memset(h, 1, 100);
	hyb_device_host_free(d, h);
	hyb_device_event_free(d, ev);
	hyb_device_close(d);
}

TEST(dev_sticky_fault)
{
	struct hyb_device *d = open_cpu(NULL);
	struct hyb_device_event *ev = hyb_device_event_new(d);
	hyb_dptr p = dalloc(d, 4096), x;
	char buf[64] = { 0 };

	CHECK(hyb_device_h2d(d, HYB_STREAM_RELOAD, p, buf, 64) == 0);
	CHECK(hyb_device_record(d, HYB_STREAM_RELOAD, ev) == 0);
	CHECK_EQ_INT(hyb_device_fail(d, -EIO, "injected fault %d", 1), -EIO);
	CHECK_EQ_INT(hyb_device_h2d(d, HYB_STREAM_RELOAD, p, buf, 64), -EIO);
	CHECK_EQ_INT(hyb_device_alloc(d, 64, &x), -EIO);
	CHECK_EQ_INT(hyb_device_sync(d, ev), -EIO);
	CHECK(hyb_device_done(d, ev));
	CHECK(!strcmp(hyb_device_error(d), "injected fault 1"));
	hyb_device_free(d, p);
	CHECK_EQ_INT(hyb_device_used(d), 0);
	hyb_device_event_free(d, ev);
	hyb_device_close(d);
}

/* ---- copies and the modelled clock ------------------------------------------------- */

TEST(dev_copy_roundtrip)
{
	const uint64_t n = (1 << 20) + 13;
	struct hyb_device_config cfg = { .chunk_bytes = 64 << 10 };
	struct hyb_device *d = open_cpu(&cfg);
	unsigned char *a = xmalloc(n), *b = xmalloc(n);
	hyb_dptr p = dalloc(d, n + 1000);
	struct hyb_device_stats st;

	g_rng = 3;
	for (uint64_t i = 0; i < n; i++)
		a[i] = (unsigned char)rnd();
	/* a chunked reload in, then out again from an offset inside the allocation */
	CHECK(hyb_device_h2d(d, HYB_STREAM_RELOAD, p + 999, a, n) == 0);
	sync_stream(d, HYB_STREAM_RELOAD); /* the download must follow it: another stream */
	CHECK(hyb_device_d2h(d, HYB_STREAM_CRITICAL, b, p + 999, n) == 0);
	sync_stream(d, HYB_STREAM_CRITICAL);
	CHECK(!memcmp(a, b, n));
	CHECK(hyb_device_d2h(d, HYB_STREAM_COMPUTE, b, p + 1999, 17) == 0);
	sync_stream(d, HYB_STREAM_COMPUTE);
	CHECK(!memcmp(a + 1000, b, 17));

	hyb_device_stats(d, &st);
	CHECK_EQ_INT(st.h2d_bytes[HYB_STREAM_RELOAD], n);
	CHECK_EQ_INT(st.d2h_bytes[HYB_STREAM_CRITICAL], n);
	CHECK_EQ_INT(st.d2h_bytes[HYB_STREAM_COMPUTE], 17);
	CHECK_EQ_INT(st.copies[HYB_STREAM_RELOAD], 1);
	CHECK_EQ_INT(st.copies[HYB_STREAM_CRITICAL], 1);
	CHECK_EQ_INT(st.copies[HYB_STREAM_COMPUTE], 1);
	CHECK_EQ_INT(st.kernels, 0);
	CHECK_NEAR(st.copy_busy_s, 3 * 8e-6 + (2.0 * n + 17) / 25e9, 1e-9);
	CHECK(st.inline_s > 0);
	hyb_device_stats_reset(d);
	hyb_device_stats(d, &st);
	CHECK_EQ_INT(st.copies[HYB_STREAM_RELOAD], 0);
	CHECK(st.copy_busy_s == 0);
	free(a);
	free(b);
	hyb_device_close(d);
}

/* A slow link (10 MB/s) and memory (10 MB/s): modelled times of tens of ms. */
static const struct hyb_device_config slow = {
	.pcie_gbps = 0.01, .pcie_lat_us = 8, .hbm_gbps = 0.01, .launch_us = 5
};
#define N_COPY (256u << 10)
#define D_COPY (8e-6 + N_COPY / 1e7)
#define N_ADD (32768u) /* floats: 12 n bytes moved (y and x read, y written) */
#define D_ADD (5e-6 + 12.0 * N_ADD / 1e7)

TEST(dev_time_one_copy)
{
	struct hyb_device *d = open_cpu(&slow);
	struct hyb_device_event *ev = hyb_device_event_new(d), *never = hyb_device_event_new(d);
	char *buf = xmalloc(N_COPY);
	hyb_dptr p = dalloc(d, N_COPY);
	struct mark m0, m1;

	memset(buf, 1, N_COPY);
	CHECK(ev && never);
	/* an event never recorded is complete */
	CHECK(hyb_device_done(d, never));
	CHECK(hyb_device_sync(d, never) == 0);

	m0 = mark(d);
	CHECK(hyb_device_h2d(d, HYB_STREAM_CRITICAL, p, buf, N_COPY) == 0);
	CHECK(hyb_device_record(d, HYB_STREAM_CRITICAL, ev) == 0);
	m1 = mark(d);
	if (m1.own - m0.own < D_COPY / 2)
		CHECK(!hyb_device_done(d, ev));
	CHECK(hyb_device_sync(d, ev) == 0);
	m1 = mark(d);
	CHECK(hyb_device_done(d, ev));
	CHECK_DT(m0, m1, D_COPY);
	/* a second sync does not wait again */
	CHECK(hyb_device_sync(d, ev) == 0);
	m0 = mark(d);
	CHECK_DT(m1, m0, 0);
	free(buf);
	hyb_device_event_free(d, ev);
	hyb_device_event_free(d, never);
	hyb_device_close(d);
}

/*
 * Timed events (hyb_device_elapsed): the device's own time between two
 * points of a stream - two copies, a kernel that waited for a copy on
 * another stream, an idle stream across host time - whatever the host did.
 */
TEST(dev_elapsed_times_the_work)
{
	struct hyb_device *d = open_cpu(&slow);
	struct hyb_device_event *t[6], *untimed = hyb_device_event_new(d);
	char *buf = xmalloc(N_COPY);
	hyb_dptr p = dalloc(d, N_COPY), y = dalloc(d, 8 * N_ADD);
	struct mark m0, m1;
	double s = -1;

	for (int i = 0; i < 6; i++)
		CHECK((t[i] = hyb_device_event_new_timed(d)) != NULL);
	memset(buf, 1, N_COPY);
	m0 = mark(d);
	CHECK(hyb_device_record(d, HYB_STREAM_CRITICAL, t[0]) == 0);
	CHECK(hyb_device_h2d(d, HYB_STREAM_CRITICAL, p, buf, N_COPY) == 0);
	CHECK(hyb_device_record(d, HYB_STREAM_CRITICAL, t[1]) == 0);
	CHECK(hyb_device_h2d(d, HYB_STREAM_CRITICAL, p, buf, N_COPY) == 0);
	CHECK(hyb_device_record(d, HYB_STREAM_CRITICAL, t[2]) == 0);
	/* a kernel that waits for the first copy */
	CHECK(hyb_device_wait(d, HYB_STREAM_COMPUTE, t[1]) == 0);
	CHECK(hyb_device_record(d, HYB_STREAM_COMPUTE, t[3]) == 0);
	CHECK(hyb_device_add(d, HYB_STREAM_COMPUTE, y, y + 4 * N_ADD, N_ADD) == 0);
	CHECK(hyb_device_record(d, HYB_STREAM_COMPUTE, t[4]) == 0);
	m1 = mark(d);
	if (m1.own - m0.own < D_COPY / 2) {
		/* not completed yet: -EAGAIN, and the device goes on */
		CHECK_EQ_INT(hyb_device_elapsed(d, t[0], t[2], &s), -EAGAIN);
		CHECK(s == -1);
	}
	CHECK(hyb_device_sync(d, t[2]) == 0);
	CHECK(hyb_device_sync(d, t[4]) == 0);
	/* t[0] completed when recorded: the copy began the host's own time later */
	CHECK(hyb_device_elapsed(d, t[0], t[1], &s) == 0);
	CHECK_MSG(s >= D_COPY - 1e-9 && s <= D_COPY + (m1.own - m0.own) + 1e-9, "%.9f s", s);
	CHECK(hyb_device_elapsed(d, t[1], t[2], &s) == 0);
	CHECK_NEAR(s, D_COPY, 1e-9);
	CHECK(hyb_device_elapsed(d, t[1], t[3], &s) == 0);
	CHECK_NEAR(s, 0, 1e-9);
	CHECK(hyb_device_elapsed(d, t[3], t[4], &s) == 0);
	CHECK_NEAR(s, D_ADD, 1e-9);
	CHECK(hyb_device_elapsed(d, t[2], t[1], &s) == 0);
	CHECK_NEAR(s, -D_COPY, 1e-9);

	/* an idle stream: a timed event completes when recorded, by the host's clock */
	m0 = mark(d);
	CHECK(hyb_device_record(d, HYB_STREAM_RELOAD, t[0]) == 0);
	while (mark(d).own - m0.own < 0.02)
		;
	CHECK(hyb_device_record(d, HYB_STREAM_RELOAD, t[1]) == 0);
	m1 = mark(d);
	CHECK(hyb_device_sync(d, t[1]) == 0);
	CHECK(hyb_device_elapsed(d, t[0], t[1], &s) == 0);
	CHECK_MSG(s >= 0.02 - 1e-9 && s <= m1.now - m0.now + 1e-9,
		  "idle stream: %.6f s between records %.6f s apart", s, m1.now - m0.now);

	/* refused, the device usable after each: untimed, never recorded, too old */
	CHECK_EQ_INT(hyb_device_elapsed(d, untimed, t[1], &s), -EINVAL);
	CHECK_EQ_INT(hyb_device_elapsed(d, t[0], t[5], &s), -EINVAL);
	CHECK(strstr(hyb_device_error(d), "never recorded"));
	for (int i = 0; i < 1100; i++)
		CHECK(hyb_device_record(d, HYB_STREAM_RELOAD, t[1]) == 0);
	CHECK(hyb_device_sync(d, t[1]) == 0);
	CHECK_EQ_INT(hyb_device_elapsed(d, t[0], t[1], &s), -EINVAL);
	CHECK_MSG(strstr(hyb_device_error(d), "older"), "%s", hyb_device_error(d));
	CHECK_EQ_INT(hyb_device_elapsed(d, NULL, t[1], &s), -EINVAL);
	CHECK(hyb_device_h2d(d, HYB_STREAM_CRITICAL, p, buf, N_COPY) == 0);
	for (int i = 0; i < 6; i++)
		hyb_device_event_free(d, t[i]);
	hyb_device_event_free(d, untimed);
	hyb_device_close(d); /* waits for the copy, which reads buf until then */
	free(buf);
}

/*
 * Strict mode (HYB_DEVICE_STRICT=1, which the runner sets for every test):
 * host memory is touched when a copy completes, as a GPU's copy engine
 * touches it, so an engine that does not honour its events fails here
 * instead of on its first GPU.
 */
TEST(dev_strict_mode_catches_host_races)
{
	struct hyb_device *d;
	char *buf = xmalloc(N_COPY), *out;
	hyb_dptr p;

	setenv("HYB_DEVICE_STRICT", "1", 1);
	/* an upload's source rewritten before the host knew the copy had read it */
	d = open_cpu(&slow); /* 26 ms a copy: the host is always ahead */
	p = dalloc(d, N_COPY);
	memset(buf, 1, N_COPY);
	CHECK(hyb_device_h2d(d, HYB_STREAM_CRITICAL, p, buf, N_COPY) == 0);
	buf[N_COPY / 2] = 2;
	CHECK_EQ_INT(hyb_device_h2d(d, HYB_STREAM_CRITICAL, p, buf, 64), 0);
	sync_stream_rc(d, HYB_STREAM_CRITICAL, -EIO);
	CHECK_MSG(strstr(hyb_device_error(d), "rewritten before its upload on the critical"),
		  "%s", hyb_device_error(d));
	hyb_device_close(d);

	/* the same after the host waited: fine; a download reads NaN until it is waited for */
	d = open_cpu(&slow);
	p = dalloc(d, N_COPY);
	out = hyb_device_host_alloc(d, N_COPY);
	CHECK(hyb_device_h2d(d, HYB_STREAM_CRITICAL, p, buf, N_COPY) == 0);
	sync_stream(d, HYB_STREAM_CRITICAL);
	buf[0] = 3;
	CHECK(hyb_device_d2h(d, HYB_STREAM_RELOAD, out, p, N_COPY) == 0);
	CHECK((unsigned char)out[0] == 0xff && (unsigned char)out[N_COPY - 1] == 0xff);
	sync_stream(d, HYB_STREAM_RELOAD);
	CHECK(out[0] == 1 && out[N_COPY / 2] == 2 && out[N_COPY - 1] == 1);
	/* freeing pinned memory waits for the download landing there, as cudaFreeHost does */
	CHECK(hyb_device_d2h(d, HYB_STREAM_RELOAD, out, p, N_COPY) == 0);
	hyb_device_host_free(d, out);
	/* an upload from memory a download has not landed in yet is refused */
	out = hyb_device_host_alloc(d, N_COPY);
	CHECK(hyb_device_d2h(d, HYB_STREAM_RELOAD, out, p, N_COPY) == 0);
	CHECK_EQ_INT(hyb_device_h2d(d, HYB_STREAM_CRITICAL, p, out + 100, 8), -EIO);
	hyb_device_host_free(d, out);
	hyb_device_close(d);
	free(buf);
}

/* Strict mode's device-memory race detector (libhyb/device/device_race.h): ordering, not timing. */
static struct hyb_device *race_dev(hyb_dptr *p, char **buf)
{
	struct hyb_device *d = open_cpu(&slow);

	*p = dalloc(d, 8 * N_ADD);
	*buf = xmalloc(4 * N_ADD);
	memset(*buf, 0, 4 * N_ADD);
	return d;
}

/* An upload on RELOAD, ordered before an add on COMPUTE by a wait or by the host's sync. */
static void upload_then_add(struct hyb_device *d, hyb_dptr p, const char *buf,
			    struct hyb_device_event *ev, bool host_waits)
{
	CHECK(hyb_device_h2d(d, HYB_STREAM_RELOAD, p, buf, 4 * N_ADD) == 0);
	CHECK(hyb_device_record(d, HYB_STREAM_RELOAD, ev) == 0);
	if (host_waits)
		CHECK(hyb_device_sync(d, ev) == 0);
	else
		CHECK(hyb_device_wait(d, HYB_STREAM_COMPUTE, ev) == 0);
	CHECK_MSG(hyb_device_add(d, HYB_STREAM_COMPUTE, p + 4 * N_ADD, p, N_ADD) == 0, "%s",
		  hyb_device_error(d));
}

TEST(dev_strict_mode_catches_device_races)
{
	struct hyb_device *d;
	struct hyb_device_event *ev;
	hyb_dptr p;
	char *buf, src[64] = { 0 };

	setenv("HYB_DEVICE_STRICT", "1", 1);
	/* a kernel reading a slot an upload on another stream writes, nothing between: a race */
	d = race_dev(&p, &buf);
	CHECK(hyb_device_h2d(d, HYB_STREAM_RELOAD, p, buf, 4 * N_ADD) == 0);
	CHECK_EQ_INT(hyb_device_add(d, HYB_STREAM_COMPUTE, p + 4 * N_ADD, p, N_ADD), -EIO);
	CHECK_MSG(strstr(hyb_device_error(d), "an add kernel on the compute stream reads") &&
		  strstr(hyb_device_error(d), "an upload queued before it on the reload stream "
			 "writes"), "%s", hyb_device_error(d));
	hyb_device_close(d);
	free(buf);

	/* ordered by an event the compute stream waits for: fine, however long the copy takes */
	d = race_dev(&p, &buf);
	ev = hyb_device_event_new(d);
	upload_then_add(d, p, buf, ev, false);
	/* a download (after the upload) of what the kernel only reads races with nothing */
	CHECK(hyb_device_wait(d, HYB_STREAM_CRITICAL, ev) == 0);
	CHECK_MSG(hyb_device_d2h(d, HYB_STREAM_CRITICAL, buf, p, 4 * N_ADD) == 0, "%s",
		  hyb_device_error(d));
	/* an upload over what the queued kernel still reads: a race the other way */
	CHECK_EQ_INT(hyb_device_h2d(d, HYB_STREAM_RELOAD, p + 16, src, sizeof(src)), -EIO);
	CHECK_MSG(strstr(hyb_device_error(d), "an upload on the reload stream writes") &&
		  strstr(hyb_device_error(d), "an add kernel queued before it on the compute "
			 "stream reads"), "%s", hyb_device_error(d));
	hyb_device_event_free(d, ev);
	hyb_device_close(d);
	free(buf);

	/* ordered by the host having seen the copy complete: fine too */
	d = race_dev(&p, &buf);
	ev = hyb_device_event_new(d);
	upload_then_add(d, p, buf, ev, true);
	hyb_device_event_free(d, ev);
	hyb_device_close(d);
	free(buf);
}

/* Two operations: a on sa, b on sb; the modelled time until both are done. */
static void two_ops(int a, enum hyb_stream sa, int b, enum hyb_stream sb, double want)
{
	struct hyb_device *d = open_cpu(&slow);
	struct hyb_device_event *ea = hyb_device_event_new(d), *eb = hyb_device_event_new(d);
	char *buf = xmalloc(N_COPY), *down = xmalloc(N_COPY); /* an upload reads buf meanwhile */
	hyb_dptr p = dalloc(d, N_COPY), q = dalloc(d, N_COPY), y = dalloc(d, 8 * N_ADD);
	hyb_dptr y2 = dalloc(d, 8 * N_ADD); /* two kernels on two streams: their own memory */
	struct mark m0, m1;
	const int op[2] = { a, b };
	const enum hyb_stream s[2] = { sa, sb };

	memset(buf, 1, N_COPY);
	m0 = mark(d);
	for (int i = 0; i < 2; i++) {
		switch (op[i]) {
		case 0:
			CHECK(hyb_device_h2d(d, s[i], i ? q : p, buf, N_COPY) == 0);
			break;
		case 1:
			CHECK(hyb_device_d2h(d, s[i], down, i ? q : p, N_COPY) == 0);
			break;
		default:
			CHECK(hyb_device_add(d, s[i], i ? y2 : y, (i ? y2 : y) + 4 * N_ADD,
					     N_ADD) == 0);
		}
		CHECK(hyb_device_record(d, s[i], i ? eb : ea) == 0);
	}
	CHECK(hyb_device_sync(d, ea) == 0);
	CHECK(hyb_device_sync(d, eb) == 0);
	m1 = mark(d);
	CHECK_DT(m0, m1, want);
	free(buf);
	free(down);
	hyb_device_event_free(d, ea);
	hyb_device_event_free(d, eb);
	hyb_device_close(d);
}

enum { H2D, D2H, ADD };

/* The roofline's link and memory bandwidths, measured through the device layer: the model's back */
TEST(dev_measure_bw_gives_the_model)
{
	const struct hyb_device_config cfg = {
		.capacity = 64 << 20, .pcie_gbps = 12, .pcie_lat_us = 8, .hbm_gbps = 900,
		.launch_us = 5,
	};
	struct hyb_device *d = open_cpu(&cfg);
	struct hyb_device_stats st0, st1;
	struct hyb_device_bw bw;
	const uint64_t bytes = 32 << 20;

	hyb_device_stats(d, &st0);
	CHECK_MSG(hyb_device_measure_bw(d, bytes, 3, &bw) == 0, "%s", hyb_device_error(d));
	hyb_device_stats(d, &st1);
	/* the copy pays its latency, the add its launch: a little under the model, never over */
	CHECK_MSG(bw.pcie_gbps > 0.99 * 12 && bw.pcie_gbps <= 12.0 * (1 + 1e-9), "%g", bw.pcie_gbps);
	CHECK_MSG(bw.hbm_gbps > 0.9 * 900 && bw.hbm_gbps <= 900.0 * (1 + 1e-9), "%g", bw.hbm_gbps);
	/* one warm-up and three timed runs of each, on CRITICAL (whole copies) and COMPUTE */
	CHECK_EQ_INT(st1.h2d_bytes[HYB_STREAM_CRITICAL] - st0.h2d_bytes[HYB_STREAM_CRITICAL],
		     4 * bytes);
	CHECK_EQ_INT(st1.kernels - st0.kernels, 4);
	CHECK_EQ_INT(hyb_device_used(d), 0); /* nothing left allocated */
	/* bad sizes are refused, and a capacity too small fails cleanly */
	CHECK_EQ_INT(hyb_device_measure_bw(d, 1000, 3, &bw), -EINVAL);
	CHECK_EQ_INT(hyb_device_measure_bw(d, bytes, 0, &bw), -EINVAL);
	CHECK(hyb_device_measure_bw(d, 128 << 20, 1, &bw) == -ENOMEM);
	CHECK_EQ_INT(hyb_device_used(d), 0);
	hyb_device_close(d);
}

TEST(dev_time_serialize)
{
	/* same stream; same link from two streams; one compute engine */
	two_ops(H2D, HYB_STREAM_CRITICAL, H2D, HYB_STREAM_CRITICAL, 2 * D_COPY);
	two_ops(H2D, HYB_STREAM_CRITICAL, D2H, HYB_STREAM_CRITICAL, 2 * D_COPY);
	two_ops(H2D, HYB_STREAM_COMPUTE, H2D, HYB_STREAM_CRITICAL, 2 * D_COPY);
	two_ops(ADD, HYB_STREAM_COMPUTE, ADD, HYB_STREAM_CRITICAL, 2 * D_ADD);
}

TEST(dev_time_overlap)
{
	/* full duplex link; a kernel beside a reload; a kernel beside a copy */
	two_ops(H2D, HYB_STREAM_CRITICAL, D2H, HYB_STREAM_COMPUTE, D_COPY);
	two_ops(D2H, HYB_STREAM_RELOAD, H2D, HYB_STREAM_CRITICAL, D_COPY);
	two_ops(H2D, HYB_STREAM_RELOAD, ADD, HYB_STREAM_COMPUTE, D_COPY > D_ADD ? D_COPY : D_ADD);
	two_ops(ADD, HYB_STREAM_COMPUTE, D2H, HYB_STREAM_CRITICAL, D_COPY > D_ADD ? D_COPY : D_ADD);
}

TEST(dev_time_wait_orders_streams)
{
	struct hyb_device *d = open_cpu(&slow);
	struct hyb_device_event *ea = hyb_device_event_new(d), *eb = hyb_device_event_new(d);
	struct hyb_device_event *ec = hyb_device_event_new(d);
	char *buf = xmalloc(N_COPY);
	hyb_dptr p = dalloc(d, N_COPY), y = dalloc(d, 8 * N_ADD);
	struct mark m0, m1;

	memset(buf, 0, N_COPY);
	/* copy (RELOAD) -> kernel (COMPUTE): D_COPY + D_ADD */
	m0 = mark(d);
	CHECK(hyb_device_h2d(d, HYB_STREAM_RELOAD, p, buf, N_COPY) == 0);
	CHECK(hyb_device_record(d, HYB_STREAM_RELOAD, ea) == 0);
	CHECK(hyb_device_wait(d, HYB_STREAM_COMPUTE, ea) == 0);
	CHECK(hyb_device_add(d, HYB_STREAM_COMPUTE, y, y + 4 * N_ADD, N_ADD) == 0);
	CHECK(hyb_device_record(d, HYB_STREAM_COMPUTE, eb) == 0);
	/* a wait with no work after it still orders an event recorded after it */
	CHECK(hyb_device_wait(d, HYB_STREAM_CRITICAL, eb) == 0);
	CHECK(hyb_device_record(d, HYB_STREAM_CRITICAL, ec) == 0);
	CHECK(hyb_device_sync(d, ec) == 0);
	m1 = mark(d);
	CHECK(hyb_device_done(d, ea) && hyb_device_done(d, eb));
	CHECK_DT(m0, m1, D_COPY + D_ADD);

	/* kernel -> d2h of its result: D_ADD + D_COPY; waiting on a done event costs nothing */
	m0 = mark(d);
	CHECK(hyb_device_wait(d, HYB_STREAM_COMPUTE, ea) == 0);
	CHECK(hyb_device_add(d, HYB_STREAM_COMPUTE, y, y + 4 * N_ADD, N_ADD) == 0);
	CHECK(hyb_device_record(d, HYB_STREAM_COMPUTE, eb) == 0);
	CHECK(hyb_device_wait(d, HYB_STREAM_CRITICAL, eb) == 0);
	CHECK(hyb_device_d2h(d, HYB_STREAM_CRITICAL, buf, p, N_COPY) == 0);
	CHECK(hyb_device_record(d, HYB_STREAM_CRITICAL, ec) == 0);
	CHECK(hyb_device_sync(d, ec) == 0);
	m1 = mark(d);
	CHECK_DT(m0, m1, D_COPY + D_ADD);
	free(buf);
	hyb_device_event_free(d, ea);
	hyb_device_event_free(d, eb);
	hyb_device_event_free(d, ec);
	hyb_device_close(d);
}

/*
 * KAIROX 5.1: a 64 MiB reload in 1 MiB chunks, then a 64 KiB copy on a
 * priority stream: the copy waits for one chunk at most; the reload, and a
 * kernel waiting for it, end later by the copy's duration.
 */
static void preempt(enum hyb_stream ps)
{
	const uint64_t NR = 64u << 20, NC = 64u << 10;
	const struct hyb_device_config cfg = { .pcie_gbps = 0.1, .pcie_lat_us = 8,
					       .hbm_gbps = 0.01, .launch_us = 5 };
	const double bw = 1e8, lat = 8e-6, chunk = lat + (1 << 20) / bw;
	const double dr = lat + NR / bw, dc = lat + NC / bw, dk = 5e-6 + 12.0 * 1024 / 1e7;
	struct hyb_device *d = open_cpu(&cfg);
	struct hyb_device_event *er = hyb_device_event_new(d), *ec = hyb_device_event_new(d);
	struct hyb_device_event *ek = hyb_device_event_new(d);
	char *buf = xmalloc(NR);
	hyb_dptr p = dalloc(d, NR), q = dalloc(d, NC), y = dalloc(d, 8192);
	struct mark m0, mq, mc, mr;
	const enum hyb_stream ks = ps == HYB_STREAM_COMPUTE ? HYB_STREAM_CRITICAL :
							      HYB_STREAM_COMPUTE;

	memset(buf, 3, NR);
	m0 = mark(d);
	CHECK(hyb_device_h2d(d, HYB_STREAM_RELOAD, p, buf, NR) == 0);
	CHECK(hyb_device_record(d, HYB_STREAM_RELOAD, er) == 0);
	/* the kernel goes on the other priority stream: ps must not wait for it */
	CHECK(hyb_device_wait(d, ks, er) == 0);
	CHECK(hyb_device_add(d, ks, y, y + 4096, 1024) == 0);
	CHECK(hyb_device_record(d, ks, ek) == 0);
	mq = mark(d);
	if (mq.own - m0.own > dr / 2)
		SKIP("host too slow to queue while the reload runs (%.3f s)", mq.own - m0.own);
	CHECK(hyb_device_h2d(d, ps, q, buf, NC) == 0);
	CHECK(hyb_device_record(d, ps, ec) == 0);
	CHECK(hyb_device_sync(d, ec) == 0);
	mc = mark(d);
	/* at most one chunk (the first pays the latency) before the copy */
	CHECK_MSG(mc.now - mq.now >= dc - 1e-9 && mc.now - mq.now <= chunk + dc + mc.own - mq.own +
		  EPS, "priority copy took %.6f s, chunk %.6f s + copy %.6f s", mc.now - mq.now,
		  chunk, dc);
	if (mc.own - m0.own < dr / 2)
		CHECK(!hyb_device_done(d, er));
	CHECK(hyb_device_sync(d, er) == 0);
	mr = mark(d);
	CHECK_DT(m0, mr, dr + dc);
	CHECK(hyb_device_sync(d, ek) == 0);
	mr = mark(d);
	CHECK_DT(m0, mr, dr + dc + dk);
	free(buf);
	hyb_device_event_free(d, er);
	hyb_device_event_free(d, ec);
	hyb_device_event_free(d, ek);
	hyb_device_close(d);
}

TEST(dev_time_preempt_reload)
{
	preempt(HYB_STREAM_CRITICAL);
	preempt(HYB_STREAM_COMPUTE);
}

TEST(dev_time_reload_does_not_preempt)
{
	/* a copy on RELOAD queued behind another waits for all of it */
	struct hyb_device_config cfg = slow;
	struct hyb_device *d;
	char *buf = xmalloc(N_COPY);
	hyb_dptr p, q;
	struct mark m0, m1;
	struct hyb_device_event *ev;

	cfg.chunk_bytes = 4096;
	d = open_cpu(&cfg);
	ev = hyb_device_event_new(d);
	p = dalloc(d, N_COPY);
	q = dalloc(d, N_COPY);
	memset(buf, 0, N_COPY);
	m0 = mark(d);
	CHECK(hyb_device_h2d(d, HYB_STREAM_RELOAD, p, buf, N_COPY) == 0);
	CHECK(hyb_device_h2d(d, HYB_STREAM_RELOAD, q, buf, 4096) == 0);
	CHECK(hyb_device_record(d, HYB_STREAM_RELOAD, ev) == 0);
	CHECK(hyb_device_sync(d, ev) == 0);
	m1 = mark(d);
	CHECK_DT(m0, m1, D_COPY + 8e-6 + 4096 / 1e7);
	free(buf);
	hyb_device_event_free(d, ev);
	hyb_device_close(d);
}

/* ---- kernels ------------------------------------------------------------------------ */

TEST(dev_add_exact)
{
	struct hyb_device *d = open_cpu(NULL);
	const uint32_t n = 1000;
	float *x = xmalloc(4 * n), *y = xmalloc(4 * n), *r = xmalloc(4 * n);
	hyb_dptr px = dalloc(d, 4 * n), py = dalloc(d, 4 * n);
	struct hyb_device_stats st;

	g_rng = 5;
	for (uint32_t i = 0; i < n; i++) {
		x[i] = rndf();
		y[i] = rndf();
	}
	CHECK(hyb_device_h2d(d, HYB_STREAM_CRITICAL, px, x, 4 * n) == 0);
	CHECK(hyb_device_h2d(d, HYB_STREAM_CRITICAL, py, y, 4 * n) == 0);
	sync_stream(d, HYB_STREAM_CRITICAL);
	CHECK(hyb_device_add(d, HYB_STREAM_COMPUTE, py, px, n) == 0);
	CHECK(hyb_device_d2h(d, HYB_STREAM_COMPUTE, r, py, 4 * n) == 0);
	sync_stream(d, HYB_STREAM_COMPUTE);
	for (uint32_t i = 0; i < n; i++)
		CHECK(r[i] == y[i] + x[i]);
	hyb_device_stats(d, &st);
	CHECK_EQ_INT(st.kernels, 1);
	CHECK_EQ_INT(st.kernel_bytes, 12 * n);
	CHECK_NEAR(st.kernel_busy_s, 5e-6 + 12.0 * n / 2000e9, 1e-12);
	free(x);
	free(y);
	free(r);
	hyb_device_close(d);
}

/*
 * TEAL's projection on the CPU device: hyb_teal_gemv's bits (on two host
 * threads) for each type, the rows of the inputs above the threshold the
 * bytes counted; bad arguments refused.
 */
TEST(dev_teal_matvec_exact)
{
	const uint32_t types[] = { HYB_TYPE_F32, HYB_TYPE_F16, HYB_TYPE_Q8_0, HYB_TYPE_Q4_0 };
	const uint32_t n_in = 300, n_out = 256;
	struct hyb_device *d = open_cpu(NULL);
	struct hyb_threadpool *pool = hyb_threadpool_new(2);
	float *x = xmalloc(4 * n_in), *y = xmalloc(4 * n_out), *r = xmalloc(4 * n_out);
	uint32_t *idx = xmalloc(4 * n_in);
	float *val = xmalloc(4 * n_in);
	hyb_dptr px = dalloc(d, 4 * n_in), py = dalloc(d, 4 * n_out);
	struct hyb_device_stats st;

	CHECK(pool);
	g_rng = 77;
	for (uint32_t i = 0; i < n_in; i++)
		x[i] = rndf();
	CHECK(hyb_device_h2d(d, HYB_STREAM_CRITICAL, px, x, 4 * n_in) == 0);
	for (size_t k = 0; k < sizeof(types) / sizeof(types[0]); k++) {
		const uint64_t rb = hyb_row_bytes(types[k], n_out);
		uint8_t *w = hyb_test_rand_rows(types[k], n_in, n_out, 5 + k);
		hyb_dptr pw = dalloc(d, rb * n_in);
		const struct hyb_teal_mat m = { .type = types[k], .n_in = n_in, .n_out = n_out,
						.row_bytes = rb, .data = w };
		const struct hyb_dev_teal t = { .type = types[k], .n_in = n_in, .n_out = n_out,
						.w = pw, .x = px, .thr = 0.5f, .y = py };
		uint32_t n_act;

		CHECK(hyb_device_h2d(d, HYB_STREAM_CRITICAL, pw, w, rb * n_in) == 0);
		sync_stream(d, HYB_STREAM_CRITICAL);
		hyb_device_stats_reset(d);
		CHECK_MSG(hyb_device_teal_matvec(d, HYB_STREAM_COMPUTE, &t) == 0, "%s",
			  hyb_device_error(d));
		CHECK(hyb_device_d2h(d, HYB_STREAM_COMPUTE, y, py, 4 * n_out) == 0);
		sync_stream(d, HYB_STREAM_COMPUTE);
		n_act = hyb_teal_gemv(pool, &m, x, 0.5f, idx, val, r);
		CHECK_MSG(!memcmp(y, r, 4 * n_out), "%s: not hyb_teal_gemv's bits",
			  hyb_type_name(types[k]));
		CHECK(n_act > n_in / 3 && n_act < n_in * 2 / 3);
		hyb_device_stats(d, &st);
		CHECK_EQ_INT(st.kernel_bytes, n_act * rb + 4 * (n_in + n_out));
		/* columns 64..191 on their own (the rows at their stride): the same sums */
		{
			struct hyb_dev_teal c = t;

			c.w = pw + hyb_row_bytes(types[k], 64);
			c.n_out = 128;
			c.row_bytes = rb;
			CHECK_MSG(hyb_device_teal_matvec(d, HYB_STREAM_COMPUTE, &c) == 0, "%s",
				  hyb_device_error(d));
			CHECK(hyb_device_d2h(d, HYB_STREAM_COMPUTE, y, py, 4 * 128) == 0);
			sync_stream(d, HYB_STREAM_COMPUTE);
			CHECK_MSG(!memcmp(y, r + 64, 4 * 128), "%s: a slice of the columns differs",
				  hyb_type_name(types[k]));
			c.row_bytes = hyb_row_bytes(types[k], 128) - 4; /* shorter than a row */
			CHECK_EQ_INT(hyb_device_teal_matvec(d, HYB_STREAM_COMPUTE, &c), -EINVAL);
			CHECK(strstr(hyb_device_error(d), "stride"));
		}
		/* a batch of 3 rows, each with its own inputs: each row's own bits, the
		 * rows their union needs read once */
		{
			struct hyb_dev_teal b = t;
			float *xb = xmalloc(4 * 3 * n_in), *yb = xmalloc(4 * 3 * n_out);
			hyb_dptr pxb = dalloc(d, 4 * 3 * n_in), pyb = dalloc(d, 4 * 3 * n_out);
			uint32_t act[3];
			uint8_t *any = calloc(n_in, 1);
			uint64_t uni = 0;

			CHECK(any);
			for (uint32_t i = 0; i < 3 * n_in; i++)
				xb[i] = rndf();
			CHECK(hyb_device_h2d(d, HYB_STREAM_CRITICAL, pxb, xb, 4 * 3 * n_in) == 0);
			sync_stream(d, HYB_STREAM_CRITICAL);
			b.x = pxb;
			b.y = pyb;
			b.batch = 3;
			hyb_device_stats_reset(d);
			CHECK(hyb_device_teal_matvec(d, HYB_STREAM_COMPUTE, &b) == 0);
			CHECK(hyb_device_d2h(d, HYB_STREAM_COMPUTE, yb, pyb, 4 * 3 * n_out) == 0);
			sync_stream(d, HYB_STREAM_COMPUTE);
			for (uint32_t row = 0; row < 3; row++) {
				act[row] = hyb_teal_gemv(pool, &m, xb + row * n_in, 0.5f, idx, val, r);
				CHECK_MSG(!memcmp(yb + row * n_out, r, 4 * n_out), "%s: batch row %u",
					  hyb_type_name(types[k]), row);
				for (uint32_t a = 0; a < act[row]; a++) {
					uni += !any[idx[a]];
					any[idx[a]] = 1;
				}
			}
			hyb_device_stats(d, &st);
			CHECK_EQ_INT(st.kernel_bytes, uni * rb + 4 * 3 * (n_in + n_out));
			CHECK(uni < act[0] + act[1] + act[2]);
			free(xb);
			free(yb);
			free(any);
			hyb_device_free(d, pxb);
			hyb_device_free(d, pyb);
		}
		hyb_device_free(d, pw);
		free(w);
	}
	{
		struct hyb_dev_teal t = { .type = HYB_TYPE_F16, .n_in = n_in, .n_out = n_out,
					  .w = dalloc(d, 2 * n_in * n_out), .x = px, .y = py };
		struct hyb_dev_teal e = t;

		e.type = HYB_TYPE_Q4_K;
		CHECK_EQ_INT(hyb_device_teal_matvec(d, HYB_STREAM_COMPUTE, &e), -EINVAL);
		CHECK(strstr(hyb_device_error(d), "Q4_K"));
		e = t;
		e.thr = -1;
		CHECK_EQ_INT(hyb_device_teal_matvec(d, HYB_STREAM_COMPUTE, &e), -EINVAL);
		e.thr = NAN;
		CHECK_EQ_INT(hyb_device_teal_matvec(d, HYB_STREAM_COMPUTE, &e), -EINVAL);
		CHECK(strstr(hyb_device_error(d), "threshold"));
		e = t;
		e.type = HYB_TYPE_Q8_0;
		e.n_out = 100;
		CHECK_EQ_INT(hyb_device_teal_matvec(d, HYB_STREAM_COMPUTE, &e), -EINVAL);
		CHECK(strstr(hyb_device_error(d), "block"));
		e = t;
		e.n_in = n_in + 1;
		CHECK_EQ_INT(hyb_device_teal_matvec(d, HYB_STREAM_COMPUTE, &e), -EINVAL);
		e = t;
		e.y = px;
		CHECK_EQ_INT(hyb_device_teal_matvec(d, HYB_STREAM_COMPUTE, &e), -EINVAL);
		CHECK_EQ_INT(hyb_device_teal_matvec(d, HYB_STREAM_COMPUTE, NULL), -EINVAL);
		/* the device stays usable */
		CHECK(hyb_device_teal_matvec(d, HYB_STREAM_COMPUTE, &t) == 0);
		sync_stream(d, HYB_STREAM_COMPUTE);
	}
	hyb_threadpool_free(pool);
	free(x);
	free(y);
	free(r);
	free(idx);
	free(val);
	hyb_device_close(d);
}

/*
 * The FFN activation between gate/up and down: hyb_ffn_act's bits for every
 * activation; another act, overlapping or short arrays refused.
 */
TEST(dev_ffn_act_exact)
{
	struct hyb_device *d = open_cpu(NULL);
	const uint32_t n = 1003;
	const enum hyb_ffn_act acts[] = { HYB_ACT_SILU, HYB_ACT_GELU, HYB_ACT_RELU, HYB_ACT_RELU2,
					  HYB_ACT_DRELU };
	float *g = xmalloc(4 * n), *u = xmalloc(4 * n), *r = xmalloc(4 * n);
	hyb_dptr pg = dalloc(d, 4 * n), pu = dalloc(d, 4 * n);
	struct hyb_device_stats st;

	for (size_t a = 0; a < sizeof(acts) / sizeof(acts[0]); a++) {
		g_rng = 9 + a;
		/* gates across GeGLU's table and past its +-10 ends, both signs of u */
		for (uint32_t i = 0; i < n; i++) {
			g[i] = 12 * rndf();
			u[i] = rndf();
		}
		CHECK(hyb_device_h2d(d, HYB_STREAM_CRITICAL, pg, g, 4 * n) == 0);
		CHECK(hyb_device_h2d(d, HYB_STREAM_CRITICAL, pu, u, 4 * n) == 0);
		sync_stream(d, HYB_STREAM_CRITICAL);
		hyb_device_stats_reset(d);
		CHECK(hyb_device_ffn_act(d, HYB_STREAM_COMPUTE, pg, pu, n, acts[a]) == 0);
		CHECK(hyb_device_d2h(d, HYB_STREAM_COMPUTE, r, pg, 4 * n) == 0);
		sync_stream(d, HYB_STREAM_COMPUTE);
		hyb_ffn_act(g, u, n, acts[a]);
		CHECK_MSG(!memcmp(r, g, 4 * n), "activation %d differs", (int)acts[a]);
		hyb_device_stats(d, &st);
		CHECK_EQ_INT(st.kernels, 1);
		CHECK_EQ_INT(st.kernel_bytes, 12 * n);
	}
	CHECK_EQ_INT(hyb_device_ffn_act(d, HYB_STREAM_COMPUTE, pg, pu, n, (enum hyb_ffn_act)99),
		     -EINVAL);
	CHECK_MSG(strstr(hyb_device_error(d), "activation 99"), "%s", hyb_device_error(d));
	CHECK_EQ_INT(hyb_device_ffn_act(d, HYB_STREAM_COMPUTE, pg, pg + 64, 100, HYB_ACT_SILU),
		     -EINVAL);
	CHECK_MSG(strstr(hyb_device_error(d), "overlap"), "%s", hyb_device_error(d));
	CHECK_EQ_INT(hyb_device_ffn_act(d, HYB_STREAM_COMPUTE, pg, pu, n + 1, HYB_ACT_GELU),
		     -EINVAL);
	CHECK_EQ_INT(hyb_device_ffn_act(d, HYB_STREAM_COMPUTE, pg, pu, 0, HYB_ACT_SILU), 0);
	free(g);
	free(u);
	free(r);
	hyb_device_close(d);
}

/* A layer's FFN with some groups in device cache slots, in a scrambled order. */
struct layer {
	uint32_t type, E, F, GS, n_groups, n_slots;
	uint64_t rb, slot_bytes;
	void *data;
	const void **ptrs, **host;  /* every group; resident ones only */
	int32_t *table;
	hyb_dptr d_table, d_cache;
};

static void layer_make(struct hyb_device *d, struct layer *L, uint32_t type, uint32_t E,
		       uint32_t F, uint32_t GS)
{
	float *gate = xmalloc(4ull * E * F), *up = xmalloc(4ull * E * F);
	float *down = xmalloc(4ull * E * F);
	int32_t *perm = xmalloc(4ull * F);
	struct hyb_ffn_bundles b;
	char err[256];
	uint32_t k = 0;

	memset(L, 0, sizeof(*L));
	L->type = type;
	L->E = E;
	L->F = F;
	L->GS = GS;
	L->n_groups = (F + GS - 1) / GS;
	L->rb = hyb_row_bytes(type, E);
	for (uint64_t i = 0; i < (uint64_t)E * F; i++) {
		gate[i] = rndf();
		up[i] = rndf();
		down[i] = rndf();
	}
	for (uint32_t i = 0; i < F; i++)
		perm[i] = (int32_t)i;
	for (uint32_t i = F - 1; i > 0; i--) {
		const uint32_t j = rnd() % (i + 1);
		const int32_t t = perm[i];

		perm[i] = perm[j];
		perm[j] = t;
	}
	L->data = xmalloc(hyb_bundles_bytes(type, E, F));
	L->ptrs = xmalloc(sizeof(void *) * L->n_groups);
	L->host = xmalloc(sizeof(void *) * L->n_groups);
	L->table = xmalloc(4ull * L->n_groups);
	CHECK_MSG(hyb_bundles_build(type, E, F, GS, gate, up, down, perm, L->data, err,
				    sizeof(err)) == 0, "%s", err);
	CHECK(hyb_bundles_view(&b, type, E, F, GS, L->data, L->ptrs) == 0);

	/* groups 0, 2, 3, 5, ... (the last included) in slots (5k + 3) mod n_slots */
	for (uint32_t g = 0; g < L->n_groups; g++)
		if (g % 3 != 1 || g == L->n_groups - 1)
			k++;
	L->n_slots = k + 2;
	while (L->n_slots % 5 == 0)
		L->n_slots++;
	L->slot_bytes = (3ull * GS * L->rb + 63) / 64 * 64 + 64;
	L->d_cache = dalloc(d, L->n_slots * L->slot_bytes);
	L->d_table = dalloc(d, 4ull * L->n_groups);
	{
		/* empty slots hold garbage (NaN for F32): reading one would show */
		char *junk = xmalloc(L->n_slots * L->slot_bytes);

		memset(junk, 0xff, L->n_slots * L->slot_bytes);
		CHECK(hyb_device_h2d(d, HYB_STREAM_RELOAD, L->d_cache, junk,
				     L->n_slots * L->slot_bytes) == 0);
		sync_stream(d, HYB_STREAM_RELOAD);
		free(junk);
	}
	k = 0;
	for (uint32_t g = 0; g < L->n_groups; g++) {
		const uint32_t ng = F - g * GS < GS ? F - g * GS : GS;

		if (g % 3 == 1 && g != L->n_groups - 1) {
			L->table[g] = -1;
			L->host[g] = NULL;
			continue;
		}
		L->table[g] = (int32_t)((5 * k++ + 3) % L->n_slots);
		L->host[g] = L->ptrs[g];
		CHECK(hyb_device_h2d(d, HYB_STREAM_RELOAD,
				     L->d_cache + (uint64_t)L->table[g] * L->slot_bytes, L->ptrs[g],
				     3ull * ng * L->rb) == 0);
	}
	CHECK(hyb_device_h2d(d, HYB_STREAM_RELOAD, L->d_table, L->table, 4ull * L->n_groups) == 0);
	sync_stream(d, HYB_STREAM_RELOAD); /* made: every stream may use it */
	free(gate);
	free(up);
	free(down);
	free(perm);
}

static void layer_free(struct hyb_device *d, struct layer *L)
{
	hyb_device_free(d, L->d_cache);
	hyb_device_free(d, L->d_table);
	free(L->data);
	free(L->ptrs);
	free(L->host);
	free(L->table);
}

static bool resident(const struct layer *L, uint32_t i)
{
	return L->table[i / L->GS] >= 0;
}

/* The device kernel over (list, n) vs the CPU operator over the host bundles. */
static void ffn_compare(struct hyb_device *d, struct hyb_sparse_ffn_ctx *ctx, struct layer *L,
			enum hyb_ffn_act act, const uint32_t *list, uint32_t n, bool acc)
{
	const uint32_t E = L->E;
	float *xn = xmalloc(4ull * E), *y0 = xmalloc(4ull * E), *y = xmalloc(4ull * E);
	float *ref = xmalloc(4ull * E);
	hyb_dptr dx = dalloc(d, 4ull * E), dy = dalloc(d, 4ull * E), da = dalloc(d, 4ull * n + 4);
	struct hyb_device_event *in = hyb_device_event_new(d), *k = hyb_device_event_new(d);
	struct hyb_ffn_bundles hb = { .type = L->type, .n_embd = E, .n_ff = L->F,
				      .group_size = L->GS, .row_bytes = L->rb, .bundle = L->host };
	struct hyb_sparse_ffn_stats fst;
	struct hyb_device_stats st0, st1;
	struct hyb_dev_ffn f = { .type = L->type, .n_embd = E, .n_ff = L->F, .group_size = L->GS,
				 .act = act, .table = L->d_table, .cache = L->d_cache,
				 .slot_bytes = L->slot_bytes, .xn = dx, .active = da,
				 .n_active = n, .y = dy, .accumulate = acc };
	uint64_t bytes;

	for (uint32_t e = 0; e < E; e++) {
		xn[e] = rndf();
		y0[e] = rndf();
	}
	CHECK(hyb_device_h2d(d, HYB_STREAM_CRITICAL, dx, xn, 4ull * E) == 0);
	CHECK(hyb_device_h2d(d, HYB_STREAM_CRITICAL, dy, y0, 4ull * E) == 0);
	CHECK(hyb_device_h2d(d, HYB_STREAM_CRITICAL, da, list, 4ull * n) == 0);
	CHECK(hyb_device_record(d, HYB_STREAM_CRITICAL, in) == 0);
	CHECK(hyb_device_wait(d, HYB_STREAM_COMPUTE, in) == 0);
	sync_stream(d, HYB_STREAM_RELOAD); /* the cache is filled on RELOAD */
	hyb_device_stats(d, &st0);
	CHECK_MSG(hyb_device_sparse_ffn(d, HYB_STREAM_COMPUTE, &f) == 0, "%s",
		  hyb_device_error(d));
	hyb_device_stats(d, &st1);
	CHECK(hyb_device_record(d, HYB_STREAM_COMPUTE, k) == 0);
	CHECK(hyb_device_wait(d, HYB_STREAM_CRITICAL, k) == 0);
	CHECK(hyb_device_d2h(d, HYB_STREAM_CRITICAL, y, dy, 4ull * E) == 0);
	sync_stream(d, HYB_STREAM_CRITICAL);

	CHECK_MSG(hyb_sparse_ffn(ctx, NULL, &hb, act, xn, list, n, ref, &fst) == 0, "%s",
		  hyb_sparse_ffn_error(ctx));
	for (uint32_t e = 0; e < E; e++) {
		const float want = acc ? y0[e] + ref[e] : ref[e];

		CHECK_MSG(!memcmp(&y[e], &want, 4), "%s act %d acc %d n %u: y[%u] %g vs %g",
			  hyb_type_name(L->type), act, acc, n, e, y[e], want);
	}
	bytes = (fst.n_gate + fst.n_up + fst.n_nz) * L->rb + 4ull * n + 4ull * E * (acc ? 3 : 2);
	CHECK_EQ_INT(st1.kernels - st0.kernels, 1);
	CHECK_EQ_INT(st1.kernel_bytes - st0.kernel_bytes, bytes);
	CHECK_NEAR(st1.kernel_busy_s - st0.kernel_busy_s, 5e-6 + bytes / 2000e9, 1e-12);

	hyb_device_event_free(d, in);
	hyb_device_event_free(d, k);
	hyb_device_free(d, dx);
	hyb_device_free(d, dy);
	hyb_device_free(d, da);
	free(xn);
	free(y0);
	free(y);
	free(ref);
}

TEST(dev_sparse_ffn_matches_operator)
{
	static const uint32_t types[] = { HYB_TYPE_F32, HYB_TYPE_F16, HYB_TYPE_Q8_0,
					  HYB_TYPE_Q4_0 };
	static const enum hyb_ffn_act acts[] = { HYB_ACT_RELU, HYB_ACT_SILU, HYB_ACT_DRELU };
	/* a small layer, a larger one (the device's scratch grows), the small again */
	static const uint32_t shapes[][3] = { { 64, 200, 16 }, { 128, 300, 32 }, { 64, 200, 16 } };
	struct hyb_device *d = open_cpu(NULL);
	struct hyb_sparse_ffn_ctx *ctx = hyb_sparse_ffn_ctx_new(128, 300, 1);
	uint32_t *list = xmalloc(4 * 300);

	CHECK(ctx);
	g_rng = 11;
	for (size_t si = 0; si < 3; si++) {
		for (size_t ti = 0; ti < 4; ti++) {
			struct layer L;
			uint32_t n = 0;

			layer_make(d, &L, types[ti], shapes[si][0], shapes[si][1], shapes[si][2]);
			for (uint32_t i = 0; i < L.F; i++)
				if (resident(&L, i) && (rnd() % 2 || i == L.F - 1))
					list[n++] = i;
			for (size_t ai = 0; ai < 3; ai++) {
				ffn_compare(d, ctx, &L, acts[ai], list, n, false);
				ffn_compare(d, ctx, &L, acts[ai], list, n, true);
			}
			/* nothing listed: y = 0, or y unchanged when accumulating */
			ffn_compare(d, ctx, &L, HYB_ACT_SILU, list, 0, false);
			ffn_compare(d, ctx, &L, HYB_ACT_SILU, list, 0, true);
			/* every resident neuron */
			n = 0;
			for (uint32_t i = 0; i < L.F; i++)
				if (resident(&L, i))
					list[n++] = i;
			ffn_compare(d, ctx, &L, HYB_ACT_RELU, list, n, false);
			layer_free(d, &L);
		}
	}
	CHECK_EQ_INT(hyb_device_used(d), 0);
	free(list);
	hyb_sparse_ffn_ctx_free(ctx);
	hyb_device_close(d);
}

TEST(dev_sparse_ffn_rejects)
{
	struct hyb_device *d = open_cpu(NULL);
	struct hyb_sparse_ffn_ctx *ctx = hyb_sparse_ffn_ctx_new(64, 200, 1);
	struct layer L;
	const uint32_t E = 64;
	float y0[64], y[64];
	uint32_t list[4];
	hyb_dptr dx = dalloc(d, 4 * E), dy = dalloc(d, 4 * E), da = dalloc(d, 64);
	struct hyb_dev_ffn f;
	int32_t t0;

	g_rng = 21;
	layer_make(d, &L, HYB_TYPE_Q8_0, 64, 200, 16);
	f = (struct hyb_dev_ffn){ .type = L.type, .n_embd = E, .n_ff = L.F, .group_size = L.GS,
				  .act = HYB_ACT_RELU, .table = L.d_table, .cache = L.d_cache,
				  .slot_bytes = L.slot_bytes, .xn = dx, .active = da, .n_active = 3,
				  .y = dy };
	for (uint32_t e = 0; e < E; e++)
		y0[e] = (float)e;
	CHECK(hyb_device_h2d(d, HYB_STREAM_CRITICAL, dx, y0, sizeof(y0)) == 0);
	CHECK(hyb_device_h2d(d, HYB_STREAM_CRITICAL, dy, y0, sizeof(y0)) == 0);

	/* group 1 (neurons 16..31) is not resident */
	CHECK(L.table[1] < 0);
	list[0] = 0;
	list[1] = 17;
	list[2] = 40;
	CHECK(hyb_device_h2d(d, HYB_STREAM_CRITICAL, da, list, 12) == 0);
	sync_stream(d, HYB_STREAM_CRITICAL); /* list is rewritten below */
	CHECK_EQ_INT(hyb_device_sparse_ffn(d, HYB_STREAM_COMPUTE, &f), -EINVAL);
	CHECK_MSG(strstr(hyb_device_error(d), "neuron 17: group 1 not resident"), "%s",
		  hyb_device_error(d));
	CHECK(hyb_device_d2h(d, HYB_STREAM_CRITICAL, y, dy, sizeof(y)) == 0);
	sync_stream(d, HYB_STREAM_CRITICAL);
	CHECK(!memcmp(y, y0, sizeof(y)));

	/* a slot beyond the cache allocation */
	t0 = L.table[0];
	L.table[0] = (int32_t)L.n_slots;
	CHECK(hyb_device_h2d(d, HYB_STREAM_CRITICAL, L.d_table, L.table, 4) == 0);
	sync_stream(d, HYB_STREAM_CRITICAL);
	list[1] = 33;
	CHECK(hyb_device_h2d(d, HYB_STREAM_CRITICAL, da, list, 12) == 0);
	sync_stream(d, HYB_STREAM_CRITICAL); /* list is rewritten below */
	CHECK_EQ_INT(hyb_device_sparse_ffn(d, HYB_STREAM_COMPUTE, &f), -EINVAL);
	CHECK_MSG(strstr(hyb_device_error(d), "neuron 0: group 0 not resident"), "%s",
		  hyb_device_error(d));
	L.table[0] = t0;
	CHECK(hyb_device_h2d(d, HYB_STREAM_CRITICAL, L.d_table, L.table, 4) == 0);
	sync_stream(d, HYB_STREAM_CRITICAL);

	/* unordered list, index out of range */
	list[1] = 0;
	CHECK(hyb_device_h2d(d, HYB_STREAM_CRITICAL, da, list, 12) == 0);
	sync_stream(d, HYB_STREAM_CRITICAL); /* list is rewritten below */
	CHECK_EQ_INT(hyb_device_sparse_ffn(d, HYB_STREAM_COMPUTE, &f), -EINVAL);
	CHECK_MSG(strstr(hyb_device_error(d), "increasing"), "%s", hyb_device_error(d));
	list[1] = 33;
	list[2] = 200;
	CHECK(hyb_device_h2d(d, HYB_STREAM_CRITICAL, da, list, 12) == 0);
	sync_stream(d, HYB_STREAM_CRITICAL); /* list is rewritten below */
	CHECK_EQ_INT(hyb_device_sparse_ffn(d, HYB_STREAM_COMPUTE, &f), -EINVAL);
	list[2] = 40;
	CHECK(hyb_device_h2d(d, HYB_STREAM_CRITICAL, da, list, 12) == 0);
	sync_stream(d, HYB_STREAM_CRITICAL); /* list is rewritten below */

	/* bad shapes and arguments */
	{
		struct hyb_dev_ffn b = f;

		b.type = HYB_TYPE_Q4_K;
		CHECK_EQ_INT(hyb_device_sparse_ffn(d, HYB_STREAM_COMPUTE, &b), -EINVAL);
		CHECK_MSG(strstr(hyb_device_error(d), "Q4_K"), "%s", hyb_device_error(d));
		b = f;
		b.n_embd = 48;
		CHECK_EQ_INT(hyb_device_sparse_ffn(d, HYB_STREAM_COMPUTE, &b), -EINVAL);
		b = f;
		b.slot_bytes = 3ull * L.GS * L.rb - 1;
		CHECK_EQ_INT(hyb_device_sparse_ffn(d, HYB_STREAM_COMPUTE, &b), -EINVAL);
		b = f;
		b.xn = dx + 2;
		CHECK_EQ_INT(hyb_device_sparse_ffn(d, HYB_STREAM_COMPUTE, &b), -EINVAL);
		b = f;
		b.n_active = 17; /* 68 bytes of list in a 64-byte allocation */
		CHECK_EQ_INT(hyb_device_sparse_ffn(d, HYB_STREAM_COMPUTE, &b), -EINVAL);
		b = f;
		b.act = (enum hyb_ffn_act)9;
		CHECK_EQ_INT(hyb_device_sparse_ffn(d, HYB_STREAM_COMPUTE, &b), -EINVAL);
		b = f;
		b.group_size = 0;
		CHECK_EQ_INT(hyb_device_sparse_ffn(d, HYB_STREAM_COMPUTE, &b), -EINVAL);
		CHECK_EQ_INT(hyb_device_sparse_ffn(d, HYB_STREAM_COMPUTE, NULL), -EINVAL);
	}

	/* the device is still usable and right */
	CHECK_MSG(hyb_device_sparse_ffn(d, HYB_STREAM_COMPUTE, &f) == 0, "%s",
		  hyb_device_error(d));
	CHECK(hyb_device_d2h(d, HYB_STREAM_COMPUTE, y, dy, sizeof(y)) == 0);
	sync_stream(d, HYB_STREAM_COMPUTE);
	{
		struct hyb_ffn_bundles hb = { .type = L.type, .n_embd = E, .n_ff = L.F,
					      .group_size = L.GS, .row_bytes = L.rb,
					      .bundle = L.host };
		float ref[64];

		CHECK(ctx);
		CHECK(hyb_sparse_ffn(ctx, NULL, &hb, HYB_ACT_RELU, y0, list, 3, ref, NULL) == 0);
		CHECK(!memcmp(y, ref, sizeof(y)));
	}
	layer_free(d, &L);
	hyb_sparse_ffn_ctx_free(ctx);
	hyb_device_close(d);
}

/* ---- dense kernels: rmsnorm, matvec, attention -------------------------------------- */

/* Upload n bytes to a fresh allocation of `room` bytes (>= n) and wait for it. */
static hyb_dptr upload(struct hyb_device *d, const void *src, uint64_t n, uint64_t room)
{
	hyb_dptr p = dalloc(d, room);

	CHECK(hyb_device_h2d(d, HYB_STREAM_CRITICAL, p, src, n) == 0);
	sync_stream(d, HYB_STREAM_CRITICAL);
	return p;
}

/* Run, then read back n bytes at p after the COMPUTE stream's work. */
static void download(struct hyb_device *d, void *dst, hyb_dptr p, uint64_t n)
{
	struct hyb_device_event *k = hyb_device_event_new(d);

	CHECK(k);
	CHECK(hyb_device_record(d, HYB_STREAM_COMPUTE, k) == 0);
	CHECK(hyb_device_wait(d, HYB_STREAM_CRITICAL, k) == 0);
	CHECK(hyb_device_d2h(d, HYB_STREAM_CRITICAL, dst, p, n) == 0);
	sync_stream(d, HYB_STREAM_CRITICAL);
	hyb_device_event_free(d, k);
}

static bool same_bits(const void *a, const void *b, size_t n)
{
	return !memcmp(a, b, n);
}

TEST(dev_rmsnorm_exact)
{
	static const uint32_t ns[] = { 1, 7, 256, 4096 };
	static const float epss[] = { 1e-5f, 1e-6f, 0.0f };
	struct hyb_device *d = open_cpu(NULL);

	g_rng = 31;
	for (size_t ni = 0; ni < 4; ni++) {
		const uint32_t n = ns[ni];
		float *x = xmalloc(4ull * n), *w = xmalloc(4ull * n), *y = xmalloc(4ull * n);
		float *ref = xmalloc(4ull * n);
		hyb_dptr dx, dw, dy;

		for (uint32_t i = 0; i < n; i++) {
			x[i] = rndf() * 3;
			w[i] = rndf();
		}
		dx = upload(d, x, 4ull * n, 4ull * n);
		dw = upload(d, w, 4ull * n, 4ull * n);
		dy = dalloc(d, 4ull * n);
		for (size_t ei = 0; ei < 3; ei++) {
			struct hyb_device_stats st0, st1;

			hyb_device_stats(d, &st0);
			CHECK_MSG(hyb_device_rmsnorm(d, HYB_STREAM_COMPUTE, dy, dx, dw, n,
						     epss[ei]) == 0, "%s", hyb_device_error(d));
			hyb_device_stats(d, &st1);
			download(d, y, dy, 4ull * n);
			hyb_rmsnorm(ref, x, w, n, epss[ei]);
			CHECK_MSG(same_bits(y, ref, 4ull * n), "n %u eps %g", n, epss[ei]);
			CHECK_EQ_INT(st1.kernels - st0.kernels, 1);
			CHECK_EQ_INT(st1.kernel_bytes - st0.kernel_bytes, 12ull * n);
			CHECK_NEAR(st1.kernel_busy_s - st0.kernel_busy_s, 5e-6 + 12.0 * n / 2000e9,
				   1e-12);
		}
		/* in place (y == x), as the CPU does it */
		CHECK(hyb_device_rmsnorm(d, HYB_STREAM_COMPUTE, dx, dx, dw, n, 1e-5f) == 0);
		download(d, y, dx, 4ull * n);
		hyb_rmsnorm(ref, x, w, n, 1e-5f);
		CHECK(same_bits(y, ref, 4ull * n));
		hyb_device_free(d, dx);
		hyb_device_free(d, dw);
		hyb_device_free(d, dy);
		free(x);
		free(w);
		free(y);
		free(ref);
	}
	hyb_device_close(d);
}

/* A weight of n_out rows of n_in elements of `type`, from random floats. */
static void *make_weight(uint32_t type, uint32_t n_in, uint32_t n_out)
{
	const uint64_t rb = hyb_row_bytes(type, n_in);
	char *w = xmalloc(rb * n_out);
	float *row = xmalloc(4ull * n_in);

	for (uint32_t r = 0; r < n_out; r++) {
		for (uint32_t i = 0; i < n_in; i++)
			row[i] = rndf();
		CHECK(hyb_quantize_row_ref(type, row, w + r * rb, n_in) == 0);
	}
	free(row);
	return w;
}

/*
 * forward.c's matmul on the host for one column: x converted to the dot
 * type, then the kernel for the whole weight's row count, called on chunks
 * of `chunk` rows (0: all rows at once).
 */
static void host_matvec(uint32_t type, uint32_t n_in, uint32_t n_out, const void *w,
			const float *x, float *y, uint32_t chunk)
{
	const struct hyb_cpu_kernels *k = hyb_cpu_best();
	const uint32_t vt = hyb_vec_dot_type(type);
	const uint64_t rb = hyb_row_bytes(type, n_in), xb = hyb_row_bytes(vt, n_in);
	void *xq = xmalloc(xb);

	if (!chunk)
		chunk = n_out;
	k->quantize_act[vt](x, xq, n_in);
	for (uint32_t r0 = 0; r0 < n_out; r0 += chunk) {
		const uint32_t nr = n_out - r0 < chunk ? n_out - r0 : chunk;

		hyb_gemm_pick(k, type, n_out)(n_in, (const char *)w + r0 * rb, rb, nr, xq, xb, 1,
					      y + r0, n_out);
	}
	free(xq);
}

static void matvec_case(struct hyb_device *d, uint32_t type, uint32_t n_in, uint32_t n_out)
{
	const struct hyb_cpu_kernels *k = hyb_cpu_best();
	const uint64_t rb = hyb_row_bytes(type, n_in);
	void *w = make_weight(type, n_in, n_out);
	float *x = xmalloc(4ull * n_in), *y0 = xmalloc(4ull * n_out), *y = xmalloc(4ull * n_out);
	float *ref = xmalloc(4ull * n_out), *alt = xmalloc(4ull * n_out);
	float *wrow = xmalloc(4ull * n_in);
	/* x's rounding to the dot type bounds the error against exact arithmetic */
	const double rel = type == HYB_TYPE_F32 ? 1e-5 : type == HYB_TYPE_F16 ? 2e-3 : 2e-2;
	hyb_dptr dw, dx, dy;

	for (uint32_t i = 0; i < n_in; i++)
		x[i] = rndf() * 2;
	for (uint32_t r = 0; r < n_out; r++)
		y0[r] = rndf();
	dw = upload(d, w, rb * n_out, rb * n_out);
	dx = upload(d, x, 4ull * n_in, 4ull * n_in);
	dy = upload(d, y0, 4ull * n_out, 4ull * n_out);
	host_matvec(type, n_in, n_out, w, x, ref, 0);
	/* the forward pass cuts the rows into chunks of 16k: rows do not depend on it */
	for (uint32_t chunk = 16; chunk <= 48; chunk += 16) {
		host_matvec(type, n_in, n_out, w, x, alt, chunk);
		CHECK_MSG(same_bits(alt, ref, 4ull * n_out), "%s %ux%u: chunks of %u rows differ",
			  hyb_type_name(type), n_out, n_in, chunk);
	}
	for (int acc = 0; acc < 2; acc++) {
		struct hyb_dev_matvec m = { .type = type, .n_in = n_in, .n_out = n_out, .w = dw,
					    .x = dx, .y = dy, .accumulate = acc };
		struct hyb_device_stats st0, st1;
		const uint64_t bytes = rb * n_out + 4ull * n_in + 4ull * n_out * (acc ? 2 : 1);

		CHECK(hyb_device_h2d(d, HYB_STREAM_COMPUTE, dy, y0, 4ull * n_out) == 0);
		hyb_device_stats(d, &st0);
		CHECK_MSG(hyb_device_matvec(d, HYB_STREAM_COMPUTE, &m) == 0, "%s",
			  hyb_device_error(d));
		hyb_device_stats(d, &st1);
		download(d, y, dy, 4ull * n_out);
		for (uint32_t r = 0; r < n_out; r++) {
			const float want = acc ? y0[r] + ref[r] : ref[r];

			CHECK_MSG(same_bits(&y[r], &want, 4), "%s %ux%u acc %d: y[%u] %.9g vs %.9g",
				  hyb_type_name(type), n_out, n_in, acc, r, y[r], want);
		}
		CHECK_EQ_INT(st1.kernels - st0.kernels, 1);
		CHECK_EQ_INT(st1.kernel_bytes - st0.kernel_bytes, bytes);
		CHECK_NEAR(st1.kernel_busy_s - st0.kernel_busy_s, 5e-6 + bytes / 2000e9, 1e-12);
	}
	/* against exact arithmetic over the weight as stored (dequantized) */
	for (uint32_t r = 0; r < n_out; r++) {
		double s = 0, mag = 0;

		k->dequantize[type]((const char *)w + r * rb, wrow, n_in);
		for (uint32_t i = 0; i < n_in; i++) {
			s += (double)wrow[i] * x[i];
			mag += fabs((double)wrow[i] * x[i]);
		}
		CHECK_MSG(fabs(ref[r] - s) <= rel * mag + 1e-6,
			  "%s %ux%u: row %u %.7g vs exact %.7g (sum |wx| %g)", hyb_type_name(type),
			  n_out, n_in, r, ref[r], s, mag);
	}
	hyb_device_free(d, dw);
	hyb_device_free(d, dx);
	hyb_device_free(d, dy);
	free(w);
	free(x);
	free(y0);
	free(y);
	free(ref);
	free(alt);
	free(wrow);
}

TEST(dev_matvec_exact)
{
	static const uint32_t types[] = { HYB_TYPE_F32, HYB_TYPE_F16, HYB_TYPE_Q8_0,
					  HYB_TYPE_Q4_0 };
	/* row counts for each of the kernels hyb_gemm_pick chooses (ne1 % 8 == 0, 4, other) */
	static const uint32_t shapes[][2] = {
		{ 64, 48 }, { 256, 100 }, { 96, 37 }, { 512, 264 }, { 2048, 131 }, { 32, 1 },
	};
	struct hyb_device *d = open_cpu(NULL);

	g_rng = 41;
	for (size_t ti = 0; ti < 4; ti++)
		for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++)
			matvec_case(d, types[ti], shapes[si][0], shapes[si][1]);
	CHECK_EQ_INT(hyb_device_used(d), 0);
	hyb_device_close(d);
}

/*
 * The K-quants of llama.cpp's Q4_K_M files (attention and head in Q4_K and
 * Q6_K): x goes to Q8_K (a float scale, 256 int8 and the sums of each 16)
 * and the forward pass's own kernels run, so the device gives its bits.
 */
TEST(dev_matvec_kquant_exact)
{
	static const uint32_t types[] = { HYB_TYPE_Q4_K, HYB_TYPE_Q6_K };
	/* every hyb_gemm_pick kernel (ne1 % 8 == 0, 4, other); 1, 2 and 16 super-blocks */
	static const uint32_t shapes[][2] = {
		{ 256, 48 }, { 512, 100 }, { 256, 37 }, { 1024, 264 }, { 4096, 24 }, { 256, 1 },
	};
	struct hyb_device *d = open_cpu(NULL);

	g_rng = 43;
	for (size_t ti = 0; ti < 2; ti++)
		for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++)
			matvec_case(d, types[ti], shapes[si][0], shapes[si][1]);
	CHECK_EQ_INT(hyb_device_used(d), 0);
	hyb_device_close(d);
}

/*
 * A group of matvecs in one launch (a layer's device experts): each item's
 * bits those of its own hyb_device_matvec, one kernel counted and one
 * launch's latency modelled; items that do not match or overlap refused.
 */
TEST(dev_matvec_group_is_the_matvecs_in_one_launch)
{
	enum { N = 6, IN = 512, OUT = 96, B = 3 };
	static const uint32_t types[] = { HYB_TYPE_Q4_0, HYB_TYPE_Q4_K, HYB_TYPE_F16 };
	struct hyb_device *d = open_cpu(NULL);

	g_rng = 47;
	for (size_t ti = 0; ti < 3; ti++)
		for (uint32_t nb = 1; nb <= B; nb += B - 1)
			for (int acc = 0; acc < 2; acc++) {
				const uint32_t t = types[ti];
				const uint64_t rb = hyb_row_bytes(t, IN);
				struct hyb_dev_matvec m[N];
				float *x = xmalloc(4ull * IN * nb * N), *y0 = xmalloc(4ull * OUT * nb);
				float *ya = xmalloc(4ull * OUT * nb * N), *yb = xmalloc(4ull * OUT * nb * N);
				hyb_dptr dw[N], dx, dy;
				struct hyb_device_stats st0, st1;

				for (uint32_t i = 0; i < IN * nb * N; i++)
					x[i] = rndf() * 2;
				for (uint32_t i = 0; i < OUT * nb; i++)
					y0[i] = rndf();
				dx = upload(d, x, 4ull * IN * nb * N, 4ull * IN * nb * N);
				CHECK(hyb_device_alloc(d, 4ull * OUT * nb * N, &dy) == 0);
				for (int i = 0; i < N; i++) {
					void *w = make_weight(t, IN, OUT);

					dw[i] = upload(d, w, rb * OUT, rb * OUT);
					free(w);
					/* item 2 and 4 read the same input, as a token's experts do */
					m[i] = (struct hyb_dev_matvec){
						.type = t, .n_in = IN, .n_out = OUT, .w = dw[i],
						.x = dx + 4ull * IN * nb * (i == 4 ? 2 : i),
						.y = dy + 4ull * OUT * nb * i, .accumulate = acc,
						.batch = nb == 1 ? 0 : nb,
					};
				}
				for (int i = 0; i < N; i++) {
					CHECK(hyb_device_h2d(d, HYB_STREAM_COMPUTE, m[i].y, y0,
							     4ull * OUT * nb) == 0);
					CHECK_MSG(!hyb_device_matvec(d, HYB_STREAM_COMPUTE, &m[i]), "%s",
						  hyb_device_error(d));
				}
				download(d, ya, dy, 4ull * OUT * nb * N);
				for (int i = 0; i < N; i++)
					CHECK(hyb_device_h2d(d, HYB_STREAM_COMPUTE, m[i].y, y0,
							     4ull * OUT * nb) == 0);
				hyb_device_stats(d, &st0);
				CHECK_MSG(!hyb_device_matvec_group(d, HYB_STREAM_COMPUTE, m, N), "%s",
					  hyb_device_error(d));
				hyb_device_stats(d, &st1);
				download(d, yb, dy, 4ull * OUT * nb * N);
				CHECK_MSG(same_bits(ya, yb, 4ull * OUT * nb * N),
					  "%s batch %u acc %d: the group's outputs differ",
					  hyb_type_name(t), nb, acc);
				CHECK_EQ_INT(st1.kernels - st0.kernels, 1);
				const uint64_t bytes = N * (rb * OUT + nb * (4ull * IN + 4ull * OUT *
									       (acc ? 2 : 1)));

				CHECK_EQ_INT(st1.kernel_bytes - st0.kernel_bytes, bytes);
				CHECK_NEAR(st1.kernel_busy_s - st0.kernel_busy_s,
					   5e-6 + bytes / 2000e9, 1e-12);
				/* refused: another shape, an output that is another's input, too many */
				struct hyb_dev_matvec bad[2] = { m[0], m[1] };

				bad[1].n_out = OUT / 2;
				CHECK_EQ_INT(hyb_device_matvec_group(d, HYB_STREAM_COMPUTE, bad, 2),
					     -EINVAL);
				CHECK(strstr(hyb_device_error(d), "not item 0's type and shape"));
				bad[1] = m[1];
				bad[1].x = m[0].y;
				CHECK_EQ_INT(hyb_device_matvec_group(d, HYB_STREAM_COMPUTE, bad, 2),
					     -EINVAL);
				CHECK(strstr(hyb_device_error(d), "overlap"));
				CHECK_EQ_INT(hyb_device_matvec_group(d, HYB_STREAM_COMPUTE, m,
								     HYB_DEVICE_GROUP_MAX + 1), -EINVAL);
				CHECK_EQ_INT(hyb_device_matvec_group(d, HYB_STREAM_COMPUTE, NULL, 1),
					     -EINVAL);
				CHECK_EQ_INT(hyb_device_matvec_group(d, HYB_STREAM_COMPUTE, m, 0), 0);
				for (int i = 0; i < N; i++)
					hyb_device_free(d, dw[i]);
				hyb_device_free(d, dx);
				hyb_device_free(d, dy);
				free(x);
				free(y0);
				free(ya);
				free(yb);
			}
	CHECK_EQ_INT(hyb_device_used(d), 0);
	hyb_device_close(d);
}

struct attn_cfg {
	uint32_t n_head, n_head_kv, head_dim, n_rot, n_ctx, n_pos;
	bool neox;
};

/* RoPE in double, from its definition: pairs rotated by pos * base^(-2i / n_rot). */
static void naive_rope(float *x, const struct attn_cfg *c, uint32_t n_heads, uint32_t pos,
		       float scale, float base)
{
	for (uint32_t h = 0; h < n_heads; h++) {
		float *v = x + (size_t)h * c->head_dim;

		for (uint32_t i = 0; i < c->n_rot / 2; i++) {
			const double th = scale * pos * pow(base, -2.0 * i / c->n_rot);
			const uint32_t a = c->neox ? i : 2 * i, b = c->neox ? i + c->n_rot / 2 : a + 1;
			const double x0 = v[a], x1 = v[b];

			v[a] = (float)(x0 * cos(th) - x1 * sin(th));
			v[b] = (float)(x0 * sin(th) + x1 * cos(th));
		}
	}
}

/*
 * Positions 0..n_pos-1 one op at a time on the device, against the host
 * running the forward pass's steps (hyb_rope, F16 store, hyb_attend_run) on
 * its own copies, and against plain double attention over the F16 cache.
 */
static void attn_case(const struct attn_cfg *c, double *max_err)
{
	const float base = 10000.0f, scale = 0.5f;
	const struct hyb_rope rope = { .base = base, .freq_scale = scale, .attn_factor = 1.0f };
	const uint32_t hd = c->head_dim, qd = c->n_head * hd, kvd = c->n_head_kv * hd;
	const uint64_t cache = 2ull * c->n_ctx * kvd;
	const struct hyb_cpu_kernels *ck = hyb_cpu_best();
	struct hyb_device *d = open_cpu(NULL);
	float *q = xmalloc(4ull * qd), *k = xmalloc(4ull * kvd), *v = xmalloc(4ull * kvd);
	float *hq = xmalloc(4ull * qd), *hk = xmalloc(4ull * kvd), *nq = xmalloc(4ull * qd);
	float *out = xmalloc(4ull * qd), *ref = xmalloc(4ull * qd), *dq = xmalloc(4ull * qd);
	float *dk = xmalloc(4ull * kvd);
	double *sc = xmalloc(sizeof(double) * c->n_ctx);
	uint16_t *kc = xmalloc(cache), *vc = xmalloc(cache), *dkc = xmalloc(cache);
	void *tmp = xmalloc(hyb_attend_tmp_bytes(hd, 0));
	hyb_dptr pq = dalloc(d, 4ull * qd), pk = dalloc(d, 4ull * kvd), pv = dalloc(d, 4ull * kvd);
	hyb_dptr pkc = dalloc(d, cache), pvc = dalloc(d, cache), po = dalloc(d, 4ull * qd);
	struct hyb_dev_attn a = {
		.n_head = c->n_head, .n_head_kv = c->n_head_kv, .head_dim = hd, .n_rot = c->n_rot,
		.rope = &rope, .rope_neox = c->neox, .n_ctx = c->n_ctx,
		.q = pq, .k = pk, .v = pv, .kcache = pkc, .vcache = pvc, .out = po,
	};

	/* rows after pos are never read: garbage there (NaN in F16) would show */
	memset(dkc, 0xff, cache);
	CHECK(hyb_device_h2d(d, HYB_STREAM_CRITICAL, pkc, dkc, cache) == 0);
	CHECK(hyb_device_h2d(d, HYB_STREAM_CRITICAL, pvc, dkc, cache) == 0);
	memset(kc, 0, cache);
	memset(vc, 0, cache);
	for (uint32_t pos = 0; pos < c->n_pos; pos++) {
		struct hyb_attn ha = {
			.k = ck, .q = hq, .out = ref, .kc = kc, .vc = vc, .q_stride = qd,
			.kv_stride = kvd, .hd = hd, .n_head = c->n_head, .n_head_kv = c->n_head_kv,
			.n_tokens = 1, .n_past = pos, .n_ctx = c->n_ctx, .n_split = 1,
			.scale = 1.0f / sqrtf((float)hd),
		};
		struct hyb_device_stats st0, st1;
		const uint64_t bytes = 4ull * (pos + 1) * kvd + 16ull * kvd + 12ull * qd;

		for (uint32_t i = 0; i < qd; i++)
			q[i] = rndf() * 2;
		for (uint32_t i = 0; i < kvd; i++) {
			k[i] = rndf() * 2;
			v[i] = rndf();
		}
		CHECK(hyb_device_h2d(d, HYB_STREAM_CRITICAL, pq, q, 4ull * qd) == 0);
		CHECK(hyb_device_h2d(d, HYB_STREAM_CRITICAL, pk, k, 4ull * kvd) == 0);
		CHECK(hyb_device_h2d(d, HYB_STREAM_CRITICAL, pv, v, 4ull * kvd) == 0);
		sync_stream(d, HYB_STREAM_CRITICAL);
		a.pos = pos;
		hyb_device_stats(d, &st0);
		CHECK_MSG(hyb_device_attention(d, HYB_STREAM_COMPUTE, &a) == 0, "%s",
			  hyb_device_error(d));
		hyb_device_stats(d, &st1);
		CHECK_EQ_INT(st1.kernels - st0.kernels, 1);
		CHECK_EQ_INT(st1.kernel_bytes - st0.kernel_bytes, bytes);
		download(d, out, po, 4ull * qd);
		download(d, dq, pq, 4ull * qd);
		download(d, dk, pk, 4ull * kvd);

		/* the host: forward.c's steps */
		memcpy(hq, q, 4ull * qd);
		memcpy(hk, k, 4ull * kvd);
		hyb_rope(hq, c->n_head, hd, c->n_rot, pos, &rope, c->neox);
		hyb_rope(hk, c->n_head_kv, hd, c->n_rot, pos, &rope, c->neox);
		ck->quantize_act[HYB_TYPE_F16](hk, kc + (size_t)pos * kvd, kvd);
		ck->quantize_act[HYB_TYPE_F16](v, vc + (size_t)pos * kvd, kvd);
		hyb_attend_run(&ha, 0, hyb_attend_jobs(&ha), tmp);
		CHECK_MSG(same_bits(dq, hq, 4ull * qd) && same_bits(dk, hk, 4ull * kvd),
			  "pos %u: roped q or k differ", pos);
		for (uint32_t i = 0; i < qd; i++)
			CHECK_MSG(same_bits(&out[i], &ref[i], 4), "pos %u: out[%u] %.9g vs %.9g",
				  pos, i, out[i], ref[i]);

		/* plain arithmetic: RoPE in double, softmax and sums in double */
		memcpy(nq, q, 4ull * qd);
		naive_rope(nq, c, c->n_head, pos, scale, base);
		/* the angle recurrence in float drifts with the position */
		for (uint32_t i = 0; i < qd; i++)
			CHECK_NEAR(dq[i], nq[i], 1e-4 + 2e-6 * pos);
		for (uint32_t h = 0; h < c->n_head; h++) {
			const size_t g = (size_t)(h / (c->n_head / c->n_head_kv)) * hd;
			double mx = -INFINITY, sum = 0;

			for (uint32_t p = 0; p <= pos; p++) {
				double s = 0;

				for (uint32_t e = 0; e < hd; e++)
					s += (double)nq[h * hd + e] *
					     hyb_f16_to_f32(kc[(size_t)p * kvd + g + e]);
				sc[p] = s / sqrt((double)hd);
				mx = sc[p] > mx ? sc[p] : mx;
			}
			for (uint32_t p = 0; p <= pos; p++)
				sum += sc[p] = exp(sc[p] - mx);
			for (uint32_t e = 0; e < hd; e++) {
				double o = 0, err;

				for (uint32_t p = 0; p <= pos; p++)
					o += sc[p] * hyb_f16_to_f32(vc[(size_t)p * kvd + g + e]);
				err = fabs(o / sum - out[h * hd + e]);
				*max_err = err > *max_err ? err : *max_err;
				CHECK_MSG(err <= 1e-2, "pos %u head %u dim %u: %.6f vs exact %.6f", pos,
					  h, e, out[h * hd + e], o / sum);
			}
		}
	}
	/* the device's cache holds what the host's does, and nothing past the last row */
	download(d, dkc, pkc, cache);
	CHECK(same_bits(dkc, kc, 2ull * c->n_pos * kvd));
	download(d, dkc, pvc, cache);
	CHECK(same_bits(dkc, vc, 2ull * c->n_pos * kvd));
	if (c->n_pos < c->n_ctx)
		CHECK(dkc[(size_t)c->n_pos * kvd] == 0xffff);
	free(q);
	free(k);
	free(v);
	free(hq);
	free(hk);
	free(nq);
	free(out);
	free(ref);
	free(dq);
	free(dk);
	free(sc);
	free(kc);
	free(vc);
	free(dkc);
	free(tmp);
	hyb_device_close(d);
}

TEST(dev_attention_exact)
{
	static const struct attn_cfg cfgs[] = {
		{ 8, 2, 64, 64, 48, 40, false },   /* GQA, normal RoPE */
		{ 8, 2, 64, 32, 48, 40, true },    /* GQA, NeoX RoPE on half the dims */
		{ 4, 4, 32, 32, 40, 40, true },    /* MHA, the whole cache */
		{ 4, 4, 128, 64, 33, 20, false },  /* MHA, partial RoPE */
		{ 2, 1, 256, 256, 8, 8, true },    /* the largest head */
	};
	double max_err = 0;

	g_rng = 51;
	for (size_t i = 0; i < sizeof(cfgs) / sizeof(cfgs[0]); i++)
		attn_case(&cfgs[i], &max_err);
	printf("attention vs double: max abs error %.2e\n", max_err);
}

TEST(dev_attention_long)
{
	/* past 256 positions: llama.cpp's split path with one split, as the device runs it */
	const struct attn_cfg c = { 8, 2, 64, 64, 272, 272, false };
	double max_err = 0;

	g_rng = 53;
	attn_case(&c, &max_err);
	printf("attention vs double over 272 positions: max abs error %.2e\n", max_err);
}

/* rc -EINVAL with msg in the error; the device is not faulted. */
#define CHECK_REJECT(call, msg)                                                            \
	do {                                                                               \
		const int rc_ = (call);                                                    \
		CHECK_MSG(rc_ == -EINVAL && strstr(hyb_device_error(d), (msg)),            \
			  "%s: rc %d, '%s' (want '%s')", #call, rc_, hyb_device_error(d),  \
			  (msg));                                                          \
		CHECK(!d->faulted);                                                        \
	} while (0)

TEST(dev_dense_rejects)
{
	struct hyb_device *d = open_cpu(NULL);
	const uint32_t n_in = 64, n_out = 16;
	const uint64_t rb = hyb_row_bytes(HYB_TYPE_Q8_0, n_in);
	void *w;
	float x[64], y[64], ref[64];
	hyb_dptr dw, dx, dy, buf = dalloc(d, 64 << 10);
	struct hyb_dev_matvec m, b;
	struct hyb_dev_attn a, e;
	struct hyb_device_stats st0, st1;
	struct hyb_device_ops ops;
	const struct hyb_rope plain = { .base = 10000, .freq_scale = 1, .attn_factor = 1 };
	const struct hyb_rope bad_base = { .base = NAN, .freq_scale = 1, .attn_factor = 1 };
	const struct hyb_device_ops *ops0 = d->ops;

	g_rng = 61;
	w = make_weight(HYB_TYPE_Q8_0, n_in, n_out);
	for (uint32_t i = 0; i < 64; i++)
		x[i] = rndf();
	dw = upload(d, w, rb * n_out, rb * n_out);
	dx = upload(d, x, sizeof(x), sizeof(x));
	dy = dalloc(d, 4 * n_out);
	m = (struct hyb_dev_matvec){ .type = HYB_TYPE_Q8_0, .n_in = n_in, .n_out = n_out,
				     .w = dw, .x = dx, .y = dy };
	hyb_device_stats(d, &st0);

	/* matvec */
	b = m;
	b.type = HYB_TYPE_BF16;
	CHECK_REJECT(hyb_device_matvec(d, HYB_STREAM_COMPUTE, &b), "BF16");
	b.type = HYB_TYPE_Q8_K; /* an activation type, never a weight */
	CHECK_REJECT(hyb_device_matvec(d, HYB_STREAM_COMPUTE, &b), "Q8_K not supported");
	b.type = 99;
	CHECK_REJECT(hyb_device_matvec(d, HYB_STREAM_COMPUTE, &b), "not supported");
	b = m;
	b.n_in = 48;
	CHECK_REJECT(hyb_device_matvec(d, HYB_STREAM_COMPUTE, &b), "not a multiple of the Q8_0");
	b = m;
	b.n_out = 0;
	CHECK_REJECT(hyb_device_matvec(d, HYB_STREAM_COMPUTE, &b), "zero size");
	b = m;
	b.n_out = n_out + 1; /* one row past the weight (and y) */
	CHECK_REJECT(hyb_device_matvec(d, HYB_STREAM_COMPUTE, &b), "matvec w: ");
	CHECK_MSG(strstr(hyb_device_error(d), "overrun"), "%s", hyb_device_error(d));
	b = m;
	b.w = dw + 1;
	CHECK_REJECT(hyb_device_matvec(d, HYB_STREAM_COMPUTE, &b), "aligned");
	b = m;
	b.x = dx + 16;
	CHECK_REJECT(hyb_device_matvec(d, HYB_STREAM_COMPUTE, &b), "matvec x");
	b = m;
	b.y = dx + 16; /* x's allocation has room for y, but they overlap */
	CHECK_REJECT(hyb_device_matvec(d, HYB_STREAM_COMPUTE, &b), "y overlaps x");
	b.y = dw;
	CHECK_REJECT(hyb_device_matvec(d, HYB_STREAM_COMPUTE, &b), "y overlaps w");
	b = m;
	b.x = 12345 * 256;
	CHECK_REJECT(hyb_device_matvec(d, HYB_STREAM_COMPUTE, &b), "no device allocation");
	CHECK_REJECT(hyb_device_matvec(d, HYB_STREAM_COMPUTE, NULL), "NULL");
	CHECK_REJECT(hyb_device_matvec(d, (enum hyb_stream)5, &m), "stream");
	CHECK_EQ_INT(hyb_device_matvec(NULL, HYB_STREAM_COMPUTE, &m), -EINVAL);

	/* rmsnorm */
	CHECK_REJECT(hyb_device_rmsnorm(d, HYB_STREAM_COMPUTE, dy, dx, dx, n_out, NAN), "eps");
	CHECK_REJECT(hyb_device_rmsnorm(d, HYB_STREAM_COMPUTE, dy, dx, dx, n_out, INFINITY),
		     "eps");
	CHECK_REJECT(hyb_device_rmsnorm(d, HYB_STREAM_COMPUTE, dy, dx, dx, n_out, -1e-5f), "eps");
	CHECK_REJECT(hyb_device_rmsnorm(d, HYB_STREAM_COMPUTE, dy, dx, dx, 0, 1e-5f), "zero");
	CHECK_REJECT(hyb_device_rmsnorm(d, HYB_STREAM_COMPUTE, dy, dx, dx, 17, 1e-5f), "overrun");
	CHECK_REJECT(hyb_device_rmsnorm(d, HYB_STREAM_COMPUTE, dx + 4, dx, dy, 8, 1e-5f),
		     "y overlaps x");
	CHECK_REJECT(hyb_device_rmsnorm(d, HYB_STREAM_COMPUTE, dy, dx, dy, 8, 1e-5f),
		     "y overlaps w");
	CHECK_REJECT(hyb_device_rmsnorm(d, HYB_STREAM_COMPUTE, dy + 2, dx, dx, 8, 1e-5f),
		     "aligned");

	/* attention: caches of 8 rows of 2 x 16 in buf, the vectors after them */
	a = (struct hyb_dev_attn){ .n_head = 4, .n_head_kv = 2, .head_dim = 16, .n_rot = 16,
				   .rope = &plain, .pos = 3, .n_ctx = 8,
				   .q = buf + 8192, .k = buf + 12288, .v = buf + 16384,
				   .kcache = buf, .vcache = buf + 2048, .out = buf + 20480 };
	e = a;
	e.pos = 8;
	CHECK_REJECT(hyb_device_attention(d, HYB_STREAM_COMPUTE, &e), "pos 8");
	e = a;
	e.n_head = 5;
	CHECK_REJECT(hyb_device_attention(d, HYB_STREAM_COMPUTE, &e), "multiple of n_head_kv");
	e = a;
	e.n_head_kv = 0;
	CHECK_REJECT(hyb_device_attention(d, HYB_STREAM_COMPUTE, &e), "zero size");
	e = a;
	e.head_dim = 15;
	e.n_rot = 14;
	CHECK_REJECT(hyb_device_attention(d, HYB_STREAM_COMPUTE, &e), "head_dim 15");
	e.head_dim = 258;
	CHECK_REJECT(hyb_device_attention(d, HYB_STREAM_COMPUTE, &e), "head_dim 258");
	e = a;
	e.n_rot = 18;
	CHECK_REJECT(hyb_device_attention(d, HYB_STREAM_COMPUTE, &e), "n_rot 18");
	e.n_rot = 7;
	CHECK_REJECT(hyb_device_attention(d, HYB_STREAM_COMPUTE, &e), "n_rot 7");
	e = a;
	e.rope = &bad_base;
	CHECK_REJECT(hyb_device_attention(d, HYB_STREAM_COMPUTE, &e), "rope");
	e.rope = NULL;
	CHECK_REJECT(hyb_device_attention(d, HYB_STREAM_COMPUTE, &e), "rope");
	e = a;
	e.q_scale = NAN;
	CHECK_REJECT(hyb_device_attention(d, HYB_STREAM_COMPUTE, &e), "q_scale");
	e.q_scale = -0.5f;
	CHECK_REJECT(hyb_device_attention(d, HYB_STREAM_COMPUTE, &e), "q_scale");
	e = a;
	e.out = a.q + 32;
	CHECK_REJECT(hyb_device_attention(d, HYB_STREAM_COMPUTE, &e), "out overlaps q");
	e = a;
	e.k = a.q;
	CHECK_REJECT(hyb_device_attention(d, HYB_STREAM_COMPUTE, &e), "k overlaps q");
	e = a;
	e.n_ctx = 40; /* the K cache runs into the V cache */
	CHECK_REJECT(hyb_device_attention(d, HYB_STREAM_COMPUTE, &e), "vcache overlaps kcache");
	e = a;
	e.kcache = buf + 1;
	CHECK_REJECT(hyb_device_attention(d, HYB_STREAM_COMPUTE, &e), "aligned");
	e = a;
	e.vcache = buf + (64 << 10) - 256;
	CHECK_REJECT(hyb_device_attention(d, HYB_STREAM_COMPUTE, &e), "overrun");
	e = a;
	e.n_ctx = 1u << 31;
	e.pos = 0;
	CHECK_REJECT(hyb_device_attention(d, HYB_STREAM_COMPUTE, &e), "overrun");
	CHECK_REJECT(hyb_device_attention(d, HYB_STREAM_COMPUTE, NULL), "NULL");

	/* nothing ran, nothing counted */
	hyb_device_stats(d, &st1);
	CHECK_EQ_INT(st1.kernels, st0.kernels);
	CHECK(st1.kernel_busy_s == st0.kernel_busy_s);

	/* an implementation without the kernels says so */
	ops = *ops0;
	ops.matvec = NULL;
	ops.attention = NULL;
	ops.rmsnorm = NULL;
	d->ops = &ops;
	CHECK_EQ_INT(hyb_device_matvec(d, HYB_STREAM_COMPUTE, &m), -ENOSYS);
	CHECK_MSG(!strcmp(hyb_device_error(d), "cpu device: no matvec kernel"), "%s",
		  hyb_device_error(d));
	CHECK_EQ_INT(hyb_device_attention(d, HYB_STREAM_COMPUTE, &a), -ENOSYS);
	CHECK_MSG(strstr(hyb_device_error(d), "no attention kernel"), "%s", hyb_device_error(d));
	CHECK_EQ_INT(hyb_device_rmsnorm(d, HYB_STREAM_COMPUTE, dy, dx, dx, 8, 0), -ENOSYS);
	CHECK_MSG(strstr(hyb_device_error(d), "no rmsnorm kernel"), "%s", hyb_device_error(d));
	CHECK(!d->faulted);
	d->ops = ops0;

	/* and the device still works, and right */
	CHECK_MSG(hyb_device_matvec(d, HYB_STREAM_COMPUTE, &m) == 0, "%s", hyb_device_error(d));
	download(d, y, dy, 4 * n_out);
	host_matvec(HYB_TYPE_Q8_0, n_in, n_out, w, x, ref, 0);
	CHECK(same_bits(y, ref, 4 * n_out));
	CHECK_MSG(hyb_device_attention(d, HYB_STREAM_COMPUTE, &a) == 0, "%s",
		  hyb_device_error(d));
	CHECK_MSG(hyb_device_rmsnorm(d, HYB_STREAM_COMPUTE, dy, dx, dx, n_out, 1e-6f) == 0, "%s",
		  hyb_device_error(d));
	download(d, y, dy, 4 * n_out);
	hyb_rmsnorm(ref, x, x, n_out, 1e-6f);
	CHECK(same_bits(y, ref, 4 * n_out));
	hyb_device_stats(d, &st1);
	CHECK_EQ_INT(st1.kernels - st0.kernels, 3);
	free(w);
	hyb_device_close(d);
}

/* w requantized to `type` from its dequantized values; the new rows are malloc'd */
static void *requant(struct hyb_weight *w, uint32_t type)
{
	const struct hyb_cpu_kernels *k = hyb_cpu_best();
	const uint64_t rb = hyb_row_bytes(type, w->ne0);
	char *out = xmalloc(rb * w->ne1);
	float *row = xmalloc(4 * w->ne0);

	CHECK(rb && k->dequantize[w->type]);
	for (uint64_t r = 0; r < w->ne1; r++) {
		k->dequantize[w->type]((const char *)w->data + r * w->row_bytes, row,
				       (int64_t)w->ne0);
		CHECK(hyb_quantize_row_ref(type, row, out + r * rb, (int64_t)w->ne0) == 0);
	}
	free(row);
	w->type = type;
	w->row_bytes = rb;
	w->data = out;
	return out;
}

/*
 * A plan model whose attention and head are a Q4_K_M file's types (wq, wk,
 * wo Q4_K; wv and the head Q6_K): the hybrid engine now places them on the
 * device, and in oracle mode its logits are the CPU-only sparse decoder's,
 * bit for bit, prompt (CPU) and decoded tokens (device attention) alike.
 * With the prompt's attention on the device too (the default), its K and V
 * rows are one-column products where the CPU's batch takes K-quant GEMM
 * sums: close, not the same bits.
 */
TEST(dev_hybrid_kquant_dense_bit_identical)
{
	enum { N_CTX = 64, N_PROMPT = 9, N_GEN = 12 };
	struct hyb_model *m = hyb_model_load(hyb_test_plan());
	CHECK_MSG(m, "%s", hyb_last_error());
	const uint32_t L = m->hp.n_layer, V = m->hp.n_vocab;
	void **bufs = xmalloc(sizeof(void *) * (4 * L + 1));
	float *lg[3] = { xmalloc(4ull * V * N_GEN), xmalloc(4ull * V * N_GEN),
			 xmalloc(4ull * V * N_GEN) };
	struct hyb_hybrid_params hy = { .device = "cpu", .policy = HYB_POLICY_TAM };
	double worst = 0;
	int agree = 0;
	struct hyb_hybrid_offload pl;
	int32_t toks[N_PROMPT + N_GEN];

	CHECK(m->output.data && m->hp.n_embd % 256 == 0);
	for (uint32_t l = 0; l < L; l++) {
		bufs[4 * l] = requant(&m->layers[l].wq, HYB_TYPE_Q4_K);
		bufs[4 * l + 1] = requant(&m->layers[l].wk, HYB_TYPE_Q4_K);
		bufs[4 * l + 2] = requant(&m->layers[l].wv, HYB_TYPE_Q6_K);
		bufs[4 * l + 3] = requant(&m->layers[l].wo, HYB_TYPE_Q4_K);
	}
	bufs[4 * L] = requant(&m->output, HYB_TYPE_Q6_K);
	/* every dense part and its buffers, then a third of the neuron groups */
	hy.gpu_budget = hyb_hdense_head_bytes(m) + hyb_hdense_buffer_bytes(m, true, true, true) +
			(1u << 20);
	for (uint32_t l = 0; l < L; l++) {
		CHECK_MSG(hyb_hdense_layer_bytes(m, l, N_CTX) > 0, "layer %u not placeable", l);
		hy.gpu_budget += hyb_hdense_layer_bytes(m, l, N_CTX) + hyb_hdense_pred_bytes(m, l);
	}
	CHECK(hyb_hdense_head_bytes(m) > 0);
	hy.gpu_budget += 3ull * m->group_size * m->layers[0].plan.bundles.row_bytes * m->n_groups *
			 L / 3;
	for (int i = 0; i < N_PROMPT + N_GEN; i++)
		toks[i] = (int32_t)(3 + (uint32_t)(i * 2654435761u) % (V - 3));
	for (int side = 0; side < 3; side++) {
		struct hyb_ctx_params p = {
			.n_ctx = N_CTX, .n_threads = 2, .ffn = HYB_FFN_SPARSE,
			.hybrid = side ? &hy : NULL, .testing = HYB_TESTING_FFN_ORACLE,
		};
		struct hyb_ctx *c;

		hy.prefill_cpu = side == 1;
		c = hyb_ctx_new(m, &p);

		CHECK_MSG(c, "%s", hyb_last_error());
		CHECK_MSG(!hyb_ctx_eval(c, toks, N_PROMPT, lg[side], false), "%s",
			  hyb_last_error());
		for (int i = 1; i < N_GEN; i++)
			CHECK_MSG(!hyb_ctx_eval(c, &toks[N_PROMPT + i], 1, lg[side] + (size_t)i * V,
						false), "%s", hyb_last_error());
		if (side) {
			hyb_ctx_hybrid_offload(c, &pl);
			CHECK_EQ_INT(pl.attn_layers, L);
			CHECK(pl.head);
		}
		hyb_ctx_free(c);
	}
	for (int i = 0; i < N_GEN; i++) {
		const float *a = lg[0] + (size_t)i * V, *b = lg[2] + (size_t)i * V;
		double amax = 0, d = 0;

		CHECK_MSG(!memcmp(a, lg[1] + (size_t)i * V, 4ull * V),
			  "logits of step %d differ from CPU-only sparse decoding", i);
		for (uint32_t k = 0; k < V; k++) {
			amax = fmax(amax, fabs(a[k]));
			d = fmax(d, fabs(a[k] - b[k]));
		}
		worst = fmax(worst, amax > 0 ? d / amax : d);
		agree += hyb_test_argmax(a, V) == hyb_test_argmax(b, V);
	}
	fprintf(stderr, "    prompt on the device: greedy %d/%d, logits within %.2g of the largest\n",
		agree, N_GEN, worst);
	CHECK_MSG(agree >= N_GEN - 1 && worst < 1e-2, "prompt on the device: greedy %d/%d, "
		  "logits within %g", agree, N_GEN, worst);
	hyb_model_free(m);
	for (uint32_t i = 0; i <= 4 * L; i++)
		free(bufs[i]);
	free(bufs);
	for (int i = 0; i < 3; i++)
		free(lg[i]);
}

/*
 * A batch (hyb/device.h: a prompt's tokens) is one kernel: its results are
 * the one-token kernels' run token after token (bit for bit where the
 * CPU device runs the same code: rmsnorm, attention, the sparse FFN; the
 * matvec's batch is the forward pass's prompt matmul, close to its
 * one-column sums), its modelled time one launch plus the larger of its
 * bytes over device memory and its arithmetic over the device's rate, and
 * sizes past the arrays, the cache or 64 bits are refused.
 */
TEST(dev_batch_kernels)
{
	enum { NB = 5, E = 256, NO = 64, HD = 32, NH = 4, NKV = 2, CTX = 16 };
	const struct hyb_device_config cfg = { .tflops = 1e-3 }; /* 10^9 flop/s: arithmetic-bound */
	struct hyb_device *d = open_cpu(&cfg);
	const struct hyb_rope rope = { .base = 10000, .freq_scale = 1, .attn_factor = 1 };
	const uint32_t qd = NH * HD, kvd = NKV * HD;
	const uint64_t rb = hyb_row_bytes(HYB_TYPE_Q8_0, E);
	float x[NB * E], nw[E], y1[NB * E], yb[NB * E], q[NB * qd], k[NB * kvd], v[NB * kvd];
	float o1[NB * qd], ob[NB * qd];
	void *w;
	hyb_dptr dw, dx, dy, dn, dq, dk, dv, dkc, dvc, dout;
	struct hyb_device_stats s0, s1;
	double amax = 0, dmax = 0;

	g_rng = 83;
	w = make_weight(HYB_TYPE_Q8_0, E, NO);
	for (uint32_t i = 0; i < NB * E; i++)
		x[i] = rndf();
	for (uint32_t i = 0; i < E; i++)
		nw[i] = 0.5f + rndf();
	dw = upload(d, w, rb * NO, rb * NO);
	dx = upload(d, x, sizeof(x), sizeof(x));
	dn = upload(d, nw, sizeof(nw), sizeof(nw));
	dy = dalloc(d, sizeof(yb));

	/* rmsnorm over rows */
	for (uint32_t t = 0; t < NB; t++)
		CHECK(hyb_device_rmsnorm(d, HYB_STREAM_COMPUTE, dy + 4ull * E * t, dx + 4ull * E * t,
					 dn, E, 1e-5f) == 0);
	download(d, y1, dy, sizeof(y1));
	CHECK(hyb_device_rmsnorm_rows(d, HYB_STREAM_COMPUTE, dy, dx, dn, E, NB, 1e-5f) == 0);
	download(d, yb, dy, sizeof(yb));
	CHECK_MSG(same_bits(y1, yb, sizeof(yb)), "rmsnorm of %d rows differs from one at a time",
		  NB);

	/* matvec: the batch as one kernel, one launch and its arithmetic */
	{
		struct hyb_dev_matvec m = { .type = HYB_TYPE_Q8_0, .n_in = E, .n_out = NO, .w = dw,
					    .x = dx, .y = dy };
		double want;

		for (uint32_t t = 0; t < NB; t++) {
			m.x = dx + 4ull * E * t;
			m.y = dy + 4ull * NO * t;
			CHECK(hyb_device_matvec(d, HYB_STREAM_COMPUTE, &m) == 0);
		}
		download(d, y1, dy, 4ull * NO * NB);
		m.x = dx;
		m.y = dy;
		m.batch = NB;
		hyb_device_stats(d, &s0);
		CHECK(hyb_device_matvec(d, HYB_STREAM_COMPUTE, &m) == 0);
		hyb_device_stats(d, &s1);
		download(d, yb, dy, 4ull * NO * NB);
		for (uint32_t i = 0; i < NO * NB; i++) {
			amax = fmax(amax, fabs(y1[i]));
			dmax = fmax(dmax, fabs(y1[i] - yb[i]));
		}
		CHECK_MSG(dmax <= 1e-5 * amax, "matvec batch: %g of %g", dmax, amax);
		CHECK_EQ_INT(s1.kernels - s0.kernels, 1);
		want = 5e-6 + 2.0 * NB * E * NO / 1e9;
		CHECK_MSG(fabs(s1.kernel_busy_s - s0.kernel_busy_s - want) < 1e-9,
			  "modelled %g s, want %g", s1.kernel_busy_s - s0.kernel_busy_s, want);
		m.batch = 1u << 31; /* past x and y */
		CHECK_REJECT(hyb_device_matvec(d, HYB_STREAM_COMPUTE, &m), "matvec x");
		m.batch = UINT32_MAX;
		m.n_in = 1u << 30;
		m.n_out = 1u << 30;
		CHECK_REJECT(hyb_device_matvec(d, HYB_STREAM_COMPUTE, &m), "too big");
	}

	/* attention: token t at pos + t, causal, as one token after another */
	for (uint32_t i = 0; i < NB * qd; i++)
		q[i] = rndf();
	for (uint32_t i = 0; i < NB * kvd; i++) {
		k[i] = rndf();
		v[i] = rndf();
	}
	{
		/* rows 0..2: F16 values of a small ramp, the same for both passes */
		uint16_t *rows = xmalloc(2ull * CTX * kvd);

		for (uint32_t i = 0; i < CTX * kvd; i++)
			rows[i] = (uint16_t)(0x2c00 + i % 512); /* 0.0625 .. */
		dkc = upload(d, rows, 2ull * CTX * kvd, 2ull * CTX * kvd);
		dvc = upload(d, rows, 2ull * CTX * kvd, 2ull * CTX * kvd);
		free(rows);
	}
	dout = dalloc(d, sizeof(ob));
	for (int pass = 0; pass < 2; pass++) {
		struct hyb_dev_attn a = {
			.n_head = NH, .n_head_kv = NKV, .head_dim = HD, .n_rot = HD, .rope = &rope,
			.pos = 3, .n_ctx = CTX, .kcache = dkc, .vcache = dvc,
		};

		/* the cache's rows before pos: the same for both passes */
		dq = upload(d, q, sizeof(q), sizeof(q));
		dk = upload(d, k, sizeof(k), sizeof(k));
		dv = upload(d, v, sizeof(v), sizeof(v));
		for (uint32_t t = 0; t < (pass ? 1 : NB); t++) {
			a.q = dq + 4ull * qd * t;
			a.k = dk + 4ull * kvd * t;
			a.v = dv + 4ull * kvd * t;
			a.out = dout + 4ull * qd * t;
			a.pos = 3 + t;
			a.batch = pass ? NB : 0;
			CHECK(hyb_device_attention(d, HYB_STREAM_COMPUTE, &a) == 0);
		}
		download(d, pass ? ob : o1, dout, sizeof(ob));
		if (pass) {
			a.pos = CTX - NB + 1; /* the last token past the cache */
			a.q = dq;
			a.k = dk;
			a.v = dv;
			a.out = dout;
			a.batch = NB;
			CHECK_REJECT(hyb_device_attention(d, HYB_STREAM_COMPUTE, &a),
				     "outside a cache of 16 rows");
		}
		hyb_device_free(d, dq);
		hyb_device_free(d, dk);
		hyb_device_free(d, dv);
	}
	CHECK_MSG(same_bits(o1, ob, sizeof(ob)), "attention of a batch differs from one token at "
		  "a time");

	/* the sparse FFN over cached groups, each token's xn */
	{
		struct layer L;
		struct hyb_dev_ffn f;
		uint32_t *act = xmalloc(4ull * 96), n = 0;
		hyb_dptr dact, dxn, dfy;
		float *xn = xmalloc(4ull * 64 * NB), *f1 = xmalloc(4ull * 64 * NB);
		float *fb = xmalloc(4ull * 64 * NB);

		layer_make(d, &L, HYB_TYPE_Q8_0, 64, 96, 8);
		for (uint32_t i = 0; i < 96; i++)
			if (resident(&L, i) && i % 2)
				act[n++] = i;
		for (uint32_t i = 0; i < 64 * NB; i++)
			xn[i] = rndf();
		dact = upload(d, act, 4ull * n, 4ull * 96);
		dxn = upload(d, xn, 4ull * 64 * NB, 4ull * 64 * NB);
		dfy = dalloc(d, 4ull * 64 * NB);
		f = (struct hyb_dev_ffn){ .type = L.type, .n_embd = 64, .n_ff = 96, .group_size = 8,
					  .act = HYB_ACT_SILU, .table = L.d_table, .cache = L.d_cache,
					  .slot_bytes = L.slot_bytes, .active = dact,
					  .n_active = n };
		for (uint32_t t = 0; t < NB; t++) {
			f.xn = dxn + 4ull * 64 * t;
			f.y = dfy + 4ull * 64 * t;
			CHECK(hyb_device_sparse_ffn(d, HYB_STREAM_COMPUTE, &f) == 0);
		}
		download(d, f1, dfy, 4ull * 64 * NB);
		f.xn = dxn;
		f.y = dfy;
		f.batch = NB;
		CHECK(hyb_device_sparse_ffn(d, HYB_STREAM_COMPUTE, &f) == 0);
		download(d, fb, dfy, 4ull * 64 * NB);
		CHECK_MSG(same_bits(f1, fb, 4ull * 64 * NB), "sparse ffn of a batch differs");
		f.batch = NB + 1; /* xn and y are NB rows */
		CHECK_REJECT(hyb_device_sparse_ffn(d, HYB_STREAM_COMPUTE, &f), "sparse ffn xn");
		layer_free(d, &L);
		free(act);
		free(xn);
		free(f1);
		free(fb);
	}
	CHECK_REJECT(hyb_device_rmsnorm_rows(d, HYB_STREAM_COMPUTE, dy, dx, dn, E, 0, 1e-5f),
		     "zero size");
	CHECK_REJECT(hyb_device_rmsnorm_rows(d, HYB_STREAM_COMPUTE, dy, dx, dn, E, NB + 1, 1e-5f),
		     "rmsnorm y");
	free(w);
	hyb_device_close(d);
}

/* Rows of K-quants are whole super-blocks of 256, their scales 2-byte aligned. */
TEST(dev_matvec_kquant_rejects)
{
	static const uint32_t types[] = { HYB_TYPE_Q4_K, HYB_TYPE_Q6_K };
	struct hyb_device *d = open_cpu(NULL);
	const uint32_t n_in = 512, n_out = 8;
	hyb_dptr dw, dx, dy;

	g_rng = 47;
	dx = dalloc(d, 4 * n_in);
	dy = dalloc(d, 4 * n_out);
	for (size_t ti = 0; ti < 2; ti++) {
		const uint32_t t = types[ti];
		const uint64_t rb = hyb_row_bytes(t, n_in);
		struct hyb_dev_matvec m, b;
		struct hyb_device_stats st0, st1;
		char want[64];

		dw = dalloc(d, rb * n_out + 256);
		m = (struct hyb_dev_matvec){ .type = t, .n_in = n_in, .n_out = n_out, .w = dw,
					     .x = dx, .y = dy };
		hyb_device_stats(d, &st0);
		snprintf(want, sizeof(want), "n_in 288 not a multiple of the %s block (256)",
			 hyb_type_name(t));
		b = m;
		b.n_in = 288; /* a multiple of 32 (the other quantized types' block), not of 256 */
		CHECK_REJECT(hyb_device_matvec(d, HYB_STREAM_COMPUTE, &b), want);
		b.n_in = 128;
		CHECK_REJECT(hyb_device_matvec(d, HYB_STREAM_COMPUTE, &b), "not a multiple");
		b = m;
		b.w = dw + 1;
		CHECK_REJECT(hyb_device_matvec(d, HYB_STREAM_COMPUTE, &b), "aligned");
		b = m;
		b.n_out = n_out + 2; /* past the weight's allocation */
		CHECK_REJECT(hyb_device_matvec(d, HYB_STREAM_COMPUTE, &b), "matvec w: ");
		b = m;
		b.n_in = 2 * n_in; /* x too short */
		b.n_out = n_out / 2;
		CHECK_REJECT(hyb_device_matvec(d, HYB_STREAM_COMPUTE, &b), "matvec x");
		hyb_device_stats(d, &st1);
		CHECK_EQ_INT(st1.kernels - st0.kernels, 0);
		/* 2-byte aligned rows are taken (Q6_K's are never more) */
		b = m;
		b.w = dw + 2;
		CHECK_MSG(hyb_device_matvec(d, HYB_STREAM_COMPUTE, &b) == 0, "%s %s",
			  hyb_type_name(t), hyb_device_error(d));
		hyb_device_free(d, dw);
	}
	hyb_device_free(d, dx);
	hyb_device_free(d, dy);
	hyb_device_close(d);
}

/* A slow memory: the modelled time of a big kernel is launch + bytes / hbm. */
TEST(dev_time_dense)
{
	const struct hyb_device_config cfg = { .hbm_gbps = 0.01, .launch_us = 5 };
	const uint32_t n_in = 4096, n_out = 64, n = 4096;
	const uint64_t rb = hyb_row_bytes(HYB_TYPE_Q8_0, n_in);
	const double dm = 5e-6 + (rb * n_out + 4.0 * n_in + 4.0 * n_out) / 1e7;
	const double dn = 5e-6 + 12.0 * n / 1e7;
	struct hyb_device *d = open_cpu(&cfg);
	void *w;
	float *x = xmalloc(4ull * n_in);
	hyb_dptr dw, dx, dy, dz;
	struct hyb_dev_matvec m;
	struct mark m0, m1;

	g_rng = 71;
	w = make_weight(HYB_TYPE_Q8_0, n_in, n_out);
	for (uint32_t i = 0; i < n_in; i++)
		x[i] = rndf();
	dw = upload(d, w, rb * n_out, rb * n_out);
	dx = upload(d, x, 4ull * n_in, 4ull * n_in);
	dy = dalloc(d, 4ull * n);
	dz = dalloc(d, 4ull * n); /* the other stream's kernel writes its own memory */
	m = (struct hyb_dev_matvec){ .type = HYB_TYPE_Q8_0, .n_in = n_in, .n_out = n_out,
				     .w = dw, .x = dx, .y = dy };
	m0 = mark(d);
	CHECK(hyb_device_matvec(d, HYB_STREAM_COMPUTE, &m) == 0);
	sync_stream(d, HYB_STREAM_COMPUTE);
	m1 = mark(d);
	CHECK_DT(m0, m1, dm);

	/* kernels serialize on the compute engine, whichever stream queues them */
	m0 = mark(d);
	CHECK(hyb_device_matvec(d, HYB_STREAM_COMPUTE, &m) == 0);
	CHECK(hyb_device_rmsnorm(d, HYB_STREAM_CRITICAL, dz, dx, dx, n, 1e-5f) == 0);
	sync_stream(d, HYB_STREAM_CRITICAL);
	sync_stream(d, HYB_STREAM_COMPUTE);
	m1 = mark(d);
	CHECK_DT(m0, m1, dm + dn);
	hyb_device_free(d, dw);
	free(w);
	free(x);
	hyb_device_close(d);
}

/* ---- predictor ---------------------------------------------------------------------- */

TEST(dev_predict_matches_host_predictor)
{
	enum { N_IN = 128, HID = 48, N_OUT = 300 };
	struct hyb_device *d = open_cpu(NULL);
	uint16_t *w1 = xmalloc(2ull * HID * N_IN), *w2 = xmalloc(2ull * HID * N_OUT);
	float *b1 = xmalloc(4ull * HID), *b2 = xmalloc(4ull * N_OUT), *x = xmalloc(4ull * N_IN);
	float *xu = xmalloc(4ull * N_IN);
	uint32_t *ref = xmalloc(4ull * N_OUT), *got = xmalloc(4ull * N_OUT), cnt = 0;
	const struct hyb_predictor pr = { .n_in = N_IN, .hidden = HID, .n_out = N_OUT,
					  .fc1_w = w1, .fc1_b = b1, .fc2_w = w2, .fc2_b = b2 };
	void *scr = xmalloc(hyb_predictor_scratch_bytes(&pr) + 64);
	hyb_dptr d1, d2, db1, db2, dx, da, dc;
	struct hyb_dev_predict p;
	uint32_t n_ref;

	g_rng = 77;
	for (size_t i = 0; i < (size_t)HID * N_IN; i++)
		w1[i] = hyb_f32_to_f16(rndf() * 0.2f);
	for (size_t i = 0; i < (size_t)HID * N_OUT; i++)
		w2[i] = hyb_f32_to_f16(rndf() * 0.3f);
	for (int i = 0; i < HID; i++)
		b1[i] = rndf() * 0.1f;
	for (int i = 0; i < N_OUT; i++)
		b2[i] = rndf() * 0.2f - 0.05f;
	for (int i = 0; i < N_IN; i++)
		x[i] = rndf() * 5;
	hyb_unit_rms(xu, x, N_IN);
	n_ref = hyb_predictor_run(&pr, xu, NULL, scr, NULL, ref);
	CHECK(n_ref > 0 && n_ref < N_OUT);

	d1 = upload(d, w1, 2ull * HID * N_IN, 2ull * HID * N_IN);
	d2 = upload(d, w2, 2ull * HID * N_OUT, 2ull * HID * N_OUT);
	db1 = upload(d, b1, 4ull * HID, 4ull * HID);
	db2 = upload(d, b2, 4ull * N_OUT, 4ull * N_OUT);
	dx = upload(d, x, 4ull * N_IN, 4ull * N_IN);
	da = dalloc(d, 4ull * N_OUT);
	dc = dalloc(d, 4);
	p = (struct hyb_dev_predict){ .n_in = N_IN, .hidden = HID, .n_out = N_OUT, .fc1_w = d1,
				      .fc1_b = db1, .fc2_w = d2, .fc2_b = db2, .x = dx,
				      .active = da, .count = dc };
	CHECK_MSG(hyb_device_predict(d, HYB_STREAM_COMPUTE, &p) == 0, "%s", hyb_device_error(d));
	CHECK(hyb_device_d2h(d, HYB_STREAM_COMPUTE, &cnt, dc, 4) == 0);
	CHECK(hyb_device_d2h(d, HYB_STREAM_COMPUTE, got, da, 4ull * N_OUT) == 0);
	sync_stream(d, HYB_STREAM_COMPUTE);
	CHECK_EQ_INT(cnt, n_ref);
	CHECK(!memcmp(got, ref, 4ull * n_ref));

	/*
	 * raw_x (same-layer predictors): x as it is, hyb_predictor_run's bits
	 * on the raw input; the set differs from the unit-RMS one (x has RMS
	 * ~2.9, not 1), so the flag is not ignored. Then unit RMS again.
	 */
	{
		uint32_t *ref_raw = xmalloc(4ull * N_OUT), n_raw;
		struct hyb_dev_predict r = p;

		n_raw = hyb_predictor_run(&pr, x, NULL, scr, NULL, ref_raw);
		CHECK(n_raw > 0 && n_raw < N_OUT);
		CHECK(n_raw != n_ref || memcmp(ref_raw, ref, 4ull * n_ref));
		r.raw_x = true;
		CHECK_MSG(hyb_device_predict(d, HYB_STREAM_COMPUTE, &r) == 0, "%s",
			  hyb_device_error(d));
		CHECK(hyb_device_d2h(d, HYB_STREAM_COMPUTE, &cnt, dc, 4) == 0);
		CHECK(hyb_device_d2h(d, HYB_STREAM_COMPUTE, got, da, 4ull * N_OUT) == 0);
		sync_stream(d, HYB_STREAM_COMPUTE);
		CHECK_EQ_INT(cnt, n_raw);
		CHECK(!memcmp(got, ref_raw, 4ull * n_raw));
		/* the device's x is read only */
		float *xb = xmalloc(4ull * N_IN);

		CHECK(hyb_device_d2h(d, HYB_STREAM_COMPUTE, xb, dx, 4ull * N_IN) == 0);
		sync_stream(d, HYB_STREAM_COMPUTE);
		CHECK(!memcmp(xb, x, 4ull * N_IN));
		CHECK(hyb_device_predict(d, HYB_STREAM_COMPUTE, &p) == 0);
		CHECK(hyb_device_d2h(d, HYB_STREAM_COMPUTE, &cnt, dc, 4) == 0);
		CHECK(hyb_device_d2h(d, HYB_STREAM_COMPUTE, got, da, 4ull * N_OUT) == 0);
		sync_stream(d, HYB_STREAM_COMPUTE);
		CHECK_EQ_INT(cnt, n_ref);
		CHECK(!memcmp(got, ref, 4ull * n_ref));
		free(xb);
		free(ref_raw);
	}

	/* the scores as well: the host predictor's, bit for bit, and the same list */
	{
		float *lref = xmalloc(4ull * N_OUT), *lgot = xmalloc(4ull * N_OUT);
		struct hyb_dev_predict q = p;

		CHECK(hyb_predictor_run(&pr, xu, NULL, scr, lref, ref) == n_ref);
		q.logits = dalloc(d, 4ull * N_OUT);
		CHECK_MSG(hyb_device_predict(d, HYB_STREAM_COMPUTE, &q) == 0, "%s",
			  hyb_device_error(d));
		CHECK(hyb_device_d2h(d, HYB_STREAM_COMPUTE, &cnt, dc, 4) == 0);
		CHECK(hyb_device_d2h(d, HYB_STREAM_COMPUTE, got, da, 4ull * N_OUT) == 0);
		CHECK(hyb_device_d2h(d, HYB_STREAM_COMPUTE, lgot, q.logits, 4ull * N_OUT) == 0);
		sync_stream(d, HYB_STREAM_COMPUTE);
		CHECK_EQ_INT(cnt, n_ref);
		CHECK(!memcmp(got, ref, 4ull * n_ref));
		CHECK(!memcmp(lgot, lref, 4ull * N_OUT));
		/* the scores apart from the list */
		q.logits = da;
		CHECK(hyb_device_predict(d, HYB_STREAM_COMPUTE, &q) == -EINVAL);
		CHECK(strstr(hyb_device_error(d), "overlap"));
		free(lref);
		free(lgot);
	}

	/* bad arguments: -EINVAL, a message, no fault */
	struct hyb_dev_predict b = p;

	b.n_in = 100;
	CHECK(hyb_device_predict(d, HYB_STREAM_COMPUTE, &b) == -EINVAL);
	CHECK(strstr(hyb_device_error(d), "shape"));
	b = p;
	b.active = db2;
	CHECK(hyb_device_predict(d, HYB_STREAM_COMPUTE, &b) == -EINVAL);
	CHECK(strstr(hyb_device_error(d), "overlaps"));
	b = p;
	b.count = da + 8;
	CHECK(hyb_device_predict(d, HYB_STREAM_COMPUTE, &b) == -EINVAL);
	b = p;
	b.fc1_w = d1 + 1;
	CHECK(hyb_device_predict(d, HYB_STREAM_COMPUTE, &b) == -EINVAL);
	b = p;
	b.hidden = HID + 1;   /* fc1 runs past its allocation */
	CHECK(hyb_device_predict(d, HYB_STREAM_COMPUTE, &b) == -EINVAL);
	CHECK(hyb_device_predict(d, HYB_STREAM_COMPUTE, NULL) == -EINVAL);
	CHECK(hyb_device_predict(d, HYB_STREAM_COMPUTE, &p) == 0);
	hyb_device_close(d);
	free(w1);
	free(w2);
	free(b1);
	free(b2);
	free(x);
	free(xu);
	free(ref);
	free(got);
	free(scr);
}
