// SPDX-License-Identifier: MIT
/*
 * The device layer on the CPU device (libhyb/device.c, device_cpu.c): memory
 * and capacity, argument checks, copies, the modelled clock (serialization,
 * full duplex, kernel/copy overlap, events, pre-emption of reloads) and the
 * sparse FFN kernel against the CPU operator.
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

#include "device_internal.h"
#include "hyb/device.h"
#include "hyb/tensor_type.h"
#include "sparse_ffn.h"
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
	char err[256];
	struct hyb_device *d = hyb_device_open("cpu", cfg, err, sizeof(err));

	CHECK_MSG(d, "open: %s", err);
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

/* ---- open, memory, arguments ------------------------------------------------------ */

TEST(dev_open_kinds)
{
	struct hyb_device_config bad = { .pcie_gbps = -1 };
	struct hyb_device *d;
	char err[256];

	CHECK(!hyb_device_open("tpu", NULL, err, sizeof(err)));
	CHECK_MSG(strstr(err, "tpu"), "%s", err);
	CHECK(!hyb_device_open(NULL, NULL, err, sizeof(err)) && err[0]);
	CHECK(!hyb_device_open("cpu", &bad, err, sizeof(err)));
	CHECK_MSG(strstr(err, "config"), "%s", err);
	CHECK(!hyb_device_open("tpu", NULL, NULL, 0)); /* no room for a message: no crash */

	err[0] = 0;
	d = hyb_device_open("cuda", NULL, err, sizeof(err));
	if (d) {
		hyb_device_close(d);
		SKIP("this test binary has a CUDA device");
	}
	CHECK_MSG(strstr(err, "without CUDA") || strstr(err, "CUDA") || strstr(err, "cuda"),
		  "cuda open failed with '%s'", err);

	d = hyb_device_open("cpu", NULL, err, sizeof(err));
	CHECK_MSG(d, "%s", err);
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
	free(buf);
	hyb_device_close(d);
}

TEST(dev_bad_arguments)
{
	struct hyb_device *d = open_cpu(NULL);
	struct hyb_device_event *ev = hyb_device_event_new(d);
	hyb_dptr p = dalloc(d, 4096), q;
	char buf[8192] = { 0 };

	CHECK(ev);
	CHECK(hyb_device_h2d(d, HYB_STREAM_CRITICAL, p, buf, 4096) == 0);
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
	CHECK(hyb_device_d2h(d, HYB_STREAM_CRITICAL, b, p + 999, n) == 0);
	sync_stream(d, HYB_STREAM_CRITICAL);
	CHECK(!memcmp(a, b, n));
	CHECK(hyb_device_d2h(d, HYB_STREAM_COMPUTE, b, p + 1999, 17) == 0);
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
#define N_ADD (32768u) /* floats: 8 n bytes moved */
#define D_ADD (5e-6 + 8.0 * N_ADD / 1e7)

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

/* Two operations: a on sa, b on sb; the modelled time until both are done. */
static void two_ops(int a, enum hyb_stream sa, int b, enum hyb_stream sb, double want)
{
	struct hyb_device *d = open_cpu(&slow);
	struct hyb_device_event *ea = hyb_device_event_new(d), *eb = hyb_device_event_new(d);
	char *buf = xmalloc(N_COPY);
	hyb_dptr p = dalloc(d, N_COPY), q = dalloc(d, N_COPY), y = dalloc(d, 8 * N_ADD);
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
			CHECK(hyb_device_d2h(d, s[i], buf, i ? q : p, N_COPY) == 0);
			break;
		default:
			CHECK(hyb_device_add(d, s[i], y, y + 4 * N_ADD, N_ADD) == 0);
		}
		CHECK(hyb_device_record(d, s[i], i ? eb : ea) == 0);
	}
	CHECK(hyb_device_sync(d, ea) == 0);
	CHECK(hyb_device_sync(d, eb) == 0);
	m1 = mark(d);
	CHECK_DT(m0, m1, want);
	free(buf);
	hyb_device_event_free(d, ea);
	hyb_device_event_free(d, eb);
	hyb_device_close(d);
}

enum { H2D, D2H, ADD };

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
	const double dr = lat + NR / bw, dc = lat + NC / bw, dk = 5e-6 + 8.0 * 1024 / 1e7;
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
	CHECK_EQ_INT(st.kernel_bytes, 8 * n);
	CHECK_NEAR(st.kernel_busy_s, 5e-6 + 8.0 * n / 2000e9, 1e-12);
	free(x);
	free(y);
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
	CHECK_EQ_INT(hyb_device_sparse_ffn(d, HYB_STREAM_COMPUTE, &f), -EINVAL);
	CHECK_MSG(strstr(hyb_device_error(d), "neuron 17: group 1 not resident"), "%s",
		  hyb_device_error(d));
	CHECK(hyb_device_d2h(d, HYB_STREAM_CRITICAL, y, dy, sizeof(y)) == 0);
	CHECK(!memcmp(y, y0, sizeof(y)));

	/* a slot beyond the cache allocation */
	t0 = L.table[0];
	L.table[0] = (int32_t)L.n_slots;
	CHECK(hyb_device_h2d(d, HYB_STREAM_CRITICAL, L.d_table, L.table, 4) == 0);
	list[1] = 33;
	CHECK(hyb_device_h2d(d, HYB_STREAM_CRITICAL, da, list, 12) == 0);
	CHECK_EQ_INT(hyb_device_sparse_ffn(d, HYB_STREAM_COMPUTE, &f), -EINVAL);
	CHECK_MSG(strstr(hyb_device_error(d), "neuron 0: group 0 not resident"), "%s",
		  hyb_device_error(d));
	L.table[0] = t0;
	CHECK(hyb_device_h2d(d, HYB_STREAM_CRITICAL, L.d_table, L.table, 4) == 0);

	/* unordered list, index out of range */
	list[1] = 0;
	CHECK(hyb_device_h2d(d, HYB_STREAM_CRITICAL, da, list, 12) == 0);
	CHECK_EQ_INT(hyb_device_sparse_ffn(d, HYB_STREAM_COMPUTE, &f), -EINVAL);
	CHECK_MSG(strstr(hyb_device_error(d), "increasing"), "%s", hyb_device_error(d));
	list[1] = 33;
	list[2] = 200;
	CHECK(hyb_device_h2d(d, HYB_STREAM_CRITICAL, da, list, 12) == 0);
	CHECK_EQ_INT(hyb_device_sparse_ffn(d, HYB_STREAM_COMPUTE, &f), -EINVAL);
	list[2] = 40;
	CHECK(hyb_device_h2d(d, HYB_STREAM_CRITICAL, da, list, 12) == 0);

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
