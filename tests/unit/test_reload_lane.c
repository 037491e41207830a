// SPDX-License-Identifier: MIT
/*
 * The RELOAD lane (libhyb/device/reload_lane.h) against a backend that
 * logs what it is given and lands a chunk when the test says so: copies
 * go out in chunks, never more than two outstanding; records and waits go
 * out in order behind them; a held record is "pending" until its chunks
 * are out; a blocking pump waits for chunks to land; a backend error sticks;
 * with its thread the lane submits the whole queue while the caller does
 * nothing.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "device/reload_lane.h"
#include "test.h"

enum { LOG_MAX = 64 };

struct fake {
	char log[LOG_MAX][48];
	int n_log;
	bool landed[2];          /* marker k's chunk has landed */
	int out;                 /* chunks given and not landed */
	int max_out;
	int waits;               /* marker_wait calls */
	int fail_copy_at;        /* copy number that fails (0: none) */
	int copies;
	const char *base;        /* the destination's start, for offsets in the log */
};

static void logf_(struct fake *f, const char *s)
{
	if (f->n_log < LOG_MAX)
		snprintf(f->log[f->n_log++], sizeof(f->log[0]), "%s", s);
}

static int f_copy(void *ctx, void *dst, const void *src, uint64_t n, int dir, int k)
{
	struct fake *f = ctx;
	char s[48];

	(void)src;
	if (++f->copies == f->fail_copy_at)
		return -EIO;
	CHECK_MSG(f->landed[k] || f->out == 0 || f->out < 2, "marker %d reused while out", k);
	f->landed[k] = false;
	f->out++;
	f->max_out = f->out > f->max_out ? f->out : f->max_out;
	snprintf(s, sizeof(s), "copy %ld+%llu d%d k%d", (long)((char *)dst - f->base),
		 (unsigned long long)n, dir, k);
	logf_(f, s);
	return 0;
}

static bool f_done(void *ctx, int k)
{
	struct fake *f = ctx;

	return f->landed[k];
}

/* the oldest outstanding chunk lands (the lane waits only for its oldest) */
static int f_mwait(void *ctx, int k)
{
	struct fake *f = ctx;

	f->waits++;
	f->landed[k] = true;
	f->out--;
	return 0;
}

static int f_record(void *ctx, void *ev)
{
	char s[48];

	snprintf(s, sizeof(s), "record %s", (const char *)ev);
	logf_(ctx, s);
	return 0;
}

static int f_wait(void *ctx, void *ev)
{
	char s[48];

	snprintf(s, sizeof(s), "wait %s", (const char *)ev);
	logf_(ctx, s);
	return 0;
}

/* the test lands marker k's chunk */
static void land(struct fake *f, int k)
{
	CHECK(!f->landed[k]);
	f->landed[k] = true;
	f->out--;
}

TEST(reload_lane_two_chunks_out_records_in_order)
{
	static char dst[5 << 10];
	static const char src[5 << 10];
	struct fake f = { .base = dst };
	const struct hyb_lane_ops ops = { &f, f_copy, f_done, f_mwait, f_record, f_wait, NULL };
	struct hyb_lane l;
	char ev_a[] = "a", ev_b[] = "b";

	hyb_lane_init(&l, &ops, 1 << 10);
	CHECK(hyb_lane_idle(&l));
	/* 5 KiB in 1 KiB chunks: two go out, the rest and the record wait */
	CHECK_EQ_INT(hyb_lane_copy(&l, dst, src, sizeof(dst), 1), 0);
	CHECK_EQ_INT(hyb_lane_record(&l, ev_a), 0);
	CHECK_EQ_INT(f.n_log, 2);
	CHECK(!hyb_lane_idle(&l) && hyb_lane_holds(&l, ev_a));
	CHECK_EQ_INT(hyb_lane_pump(&l, false, NULL), 0);
	CHECK_EQ_INT(f.n_log, 2);
	/* one lands: the third chunk goes out on its marker */
	land(&f, 0);
	CHECK_EQ_INT(hyb_lane_pump(&l, false, NULL), 0);
	CHECK_EQ_INT(f.n_log, 3);
	CHECK(!strcmp(f.log[2], "copy 2048+1024 d1 k0"));
	/* a wait on another stream's event, queued behind */
	CHECK_EQ_INT(hyb_lane_wait(&l, ev_b), 0);
	/* block until the record is out: the lane waits for chunks as it must */
	CHECK_EQ_INT(hyb_lane_pump(&l, true, ev_a), 0);
	CHECK(!hyb_lane_holds(&l, ev_a));
	CHECK_EQ_INT(f.n_log, 7);
	CHECK(!strcmp(f.log[0], "copy 0+1024 d1 k0") && !strcmp(f.log[1], "copy 1024+1024 d1 k1"));
	CHECK(!strcmp(f.log[3], "copy 3072+1024 d1 k1") && !strcmp(f.log[4], "copy 4096+1024 d1 k0"));
	CHECK(!strcmp(f.log[5], "record a") && !strcmp(f.log[6], "wait b"));
	CHECK(hyb_lane_idle(&l));
	CHECK_EQ_INT(f.max_out, 2);
	CHECK_EQ_INT(l.chunks, 5);
	/* the last two chunks may still be out; the lane being idle is all a new copy needs */
	CHECK(f.out <= 2);
	/* a blocking pump with nothing held returns at once */
	CHECK_EQ_INT(hyb_lane_pump(&l, true, NULL), 0);
	hyb_lane_free(&l);
}

TEST(reload_lane_backend_error_sticks)
{
	static char dst[4 << 10];
	static const char src[4 << 10];
	struct fake f = { .base = dst, .fail_copy_at = 2 };
	const struct hyb_lane_ops ops = { &f, f_copy, f_done, f_mwait, f_record, f_wait, NULL };
	struct hyb_lane l;
	char ev[] = "e";

	hyb_lane_init(&l, &ops, 1 << 10);
	CHECK_EQ_INT(hyb_lane_copy(&l, dst, src, sizeof(dst), 0), -EIO);
	CHECK_EQ_INT(hyb_lane_record(&l, ev), -EIO);
	CHECK_EQ_INT(hyb_lane_pump(&l, true, NULL), -EIO);
	CHECK_EQ_INT(f.n_log, 1);
	hyb_lane_free(&l);
}

/* A link that lands a chunk 200 us after the thread starts waiting for it. */
struct slow {
	atomic_bool landed[2];
	atomic_int out, max_out, copies, records;
};

static int s_copy(void *ctx, void *dst, const void *src, uint64_t n, int dir, int k)
{
	struct slow *f = ctx;
	int o = atomic_fetch_add(&f->out, 1) + 1;

	(void)dst, (void)src, (void)n, (void)dir;
	atomic_store(&f->landed[k], false);
	if (o > atomic_load(&f->max_out))
		atomic_store(&f->max_out, o);
	atomic_fetch_add(&f->copies, 1);
	return 0;
}

static bool s_done(void *ctx, int k)
{
	return atomic_load(&((struct slow *)ctx)->landed[k]);
}

static int s_mwait(void *ctx, int k)
{
	struct slow *f = ctx;

	if (!atomic_load(&f->landed[k])) {
		usleep(200);
		atomic_store(&f->landed[k], true);
		atomic_fetch_sub(&f->out, 1);
	}
	return 0;
}

static int s_record(void *ctx, void *ev)
{
	(void)ev;
	atomic_fetch_add(&((struct slow *)ctx)->records, 1);
	return 0;
}

static int s_wait(void *ctx, void *ev)
{
	(void)ctx, (void)ev;
	return 0;
}

TEST(reload_lane_thread_keeps_the_link_busy)
{
	static char dst[16 << 10];
	static const char src[16 << 10];
	struct slow f = { 0 };
	const struct hyb_lane_ops ops = { &f, s_copy, s_done, s_mwait, s_record, s_wait, NULL };
	struct hyb_lane l;
	char ev[] = "e";
	int ms = 0;

	hyb_lane_init(&l, &ops, 1 << 10);
	CHECK_EQ_INT(hyb_lane_start(&l), 0);
	CHECK_EQ_INT(hyb_lane_copy(&l, dst, src, sizeof(dst), 1), 0);
	CHECK_EQ_INT(hyb_lane_record(&l, ev), 0);
	/* the caller pumps nothing: the thread submits all 16 chunks and the record */
	while (!hyb_lane_idle(&l) && ms++ < 5000)
		usleep(1000);
	CHECK_MSG(hyb_lane_idle(&l), "the lane still holds work after 5 s: %d chunks out of 16",
		  atomic_load(&f.copies));
	CHECK_EQ_INT(atomic_load(&f.copies), 16);
	CHECK_EQ_INT(atomic_load(&f.records), 1);
	CHECK_MSG(atomic_load(&f.max_out) <= 2, "%d chunks outstanding at once",
		  atomic_load(&f.max_out));
	/* a blocking pump for a held record returns once it is out */
	CHECK_EQ_INT(hyb_lane_copy(&l, dst, src, 4 << 10, 1), 0);
	CHECK_EQ_INT(hyb_lane_record(&l, ev), 0);
	CHECK_EQ_INT(hyb_lane_pump(&l, true, ev), 0);
	CHECK(!hyb_lane_holds(&l, ev));
	CHECK_EQ_INT(atomic_load(&f.records), 2);
	hyb_lane_free(&l);
}
