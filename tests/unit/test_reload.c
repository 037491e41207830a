// SPDX-License-Identifier: MIT
/*
 * The reload service (daemon/reload.c) on the local backend: LOAD bytes equal
 * pread() of the file; completion order under mixed priorities with a gated
 * device lane (so the order is decided by the scheduler, not by timing);
 * the pre-emption bound (a critical request waits for at most the chunks in
 * flight in its lane: one on the storage lane, HYB_RELOAD_DEVICE_DEPTH on the
 * device lane, which keeps that many in flight on a device with marks);
 * per-request errors, a copy's failure reported by its mark's wait
 * included, that leave the other requests of the batch intact;
 * shutdown failing queued and half-done work with -ESHUTDOWN and later
 * submits with -EPIPE.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/reload.h"
#include "hyb/testing.h"
#include "test.h"

#define QID 3

/* -- helpers ------------------------------------------------------------- */

static const char *make_file(const char *name, uint64_t size)
{
	static char path[512];
	uint8_t *buf = malloc(size);
	uint32_t x = 2463534242u;
	int fd;

	CHECK(buf);
	for (uint64_t i = 0; i < size; i++) {
		x ^= x << 13, x ^= x >> 17, x ^= x << 5;
		buf[i] = (uint8_t)x;
	}
	snprintf(path, sizeof(path), "%s/%s", hyb_test_tmpdir(), name);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	CHECK(fd >= 0);
	CHECK(write(fd, buf, size) == (ssize_t)size);
	close(fd);
	free(buf);
	return path;
}

static void file_bytes(const char *path, uint64_t off, uint64_t len, uint8_t *out)
{
	int fd = open(path, O_RDONLY);

	CHECK(fd >= 0);
	CHECK(pread(fd, out, len, (off_t)off) == (ssize_t)len);
	close(fd);
}

static struct hyb_mempool *make_pool(struct hyb_backend *b, const char *name, uint64_t bytes,
				     uint8_t **base)
{
	struct hyb_mempool *p;
	size_t len;

	CHECK_MSG(!hyb_mempool_create(b, name, bytes, HYB_MEMPOOL_NODE_LOCAL, 0, 0, &p), "%s",
		  hyb_last_error());
	CHECK(!hyb_mempool_map(p, (void **)base, &len));
	return p;
}

static struct hyb_rq_req req(uint16_t op, uint8_t prio, uint32_t pool, uint64_t off, uint64_t len,
			     uint64_t aux, uint64_t tag)
{
	return (struct hyb_rq_req){ .op = op, .prio = prio, .pool_id = pool, .pool_off = off,
				    .len = len, .aux = aux, .tag = tag };
}

/* Reap n completions into cqe (any order), sorted by tag. */
static void reap_n(struct hyb_rq *c, struct hyb_rq_cqe *cqe, int n)
{
	int got = 0;

	while (got < n) {
		int r = hyb_rq_reap(c, cqe + got, (unsigned int)(n - got), 1, 10000000000ull);

		CHECK_MSG(r > 0, "reap: %d %s", r, hyb_last_error());
		got += r;
	}
	for (int i = 0; i < n; i++)
		for (int j = i + 1; j < n; j++)
			if (cqe[j].tag < cqe[i].tag) {
				struct hyb_rq_cqe t = cqe[i];

				cqe[i] = cqe[j];
				cqe[j] = t;
			}
}

/* Events in completion order. */
static pthread_mutex_t ev_lock = PTHREAD_MUTEX_INITIALIZER;
static struct hyb_reload_event evs[64];
static uint64_t ev_tags[64];
static char ev_msgs[64][256];
static int n_evs;

static void on_done(const struct hyb_reload_event *ev, void *arg)
{
	(void)arg;
	pthread_mutex_lock(&ev_lock);
	if (n_evs < 64) {
		evs[n_evs] = *ev;
		ev_tags[n_evs] = ev->req->tag;
		snprintf(ev_msgs[n_evs], sizeof(ev_msgs[0]), "%s", ev->msg);
		n_evs++;
	}
	pthread_mutex_unlock(&ev_lock);
}

static int event_of(uint64_t tag)
{
	for (int i = 0; i < n_evs; i++)
		if (ev_tags[i] == tag)
			return i;
	return -1;
}

static void wait_fetched(struct hyb_reload *r, uint64_t n)
{
	struct hyb_reload_stats st;

	for (int i = 0; i < 10000; i++) {
		hyb_reload_stats(r, &st);
		if (st.fetched >= n)
			return;
		usleep(1000);
	}
	CHECK_MSG(0, "the dispatcher fetched %llu of %llu requests", (unsigned long long)st.fetched,
		  (unsigned long long)n);
}

/*
 * A device whose copies block until the test opens the gate. With marks (the
 * default) the device lane keeps two chunks in flight on it; gate_ops_sync
 * has none, so the lane syncs every chunk.
 */
struct gate_dev {
	struct hyb_copydev d;
	pthread_mutex_t m;
	pthread_cond_t cv;
	int open;
	int calls;
	uint32_t next_token;
	int marks, outstanding, max_outstanding;
};

static int gate_upload(struct hyb_copydev *d, uint32_t slot, uint64_t off, const void *src,
		       uint64_t len, unsigned int prio)
{
	struct gate_dev *g = (struct gate_dev *)d;

	(void)slot, (void)off, (void)src, (void)prio;
	pthread_mutex_lock(&g->m);
	g->calls++;
	pthread_cond_broadcast(&g->cv);
	while (!g->open)
		pthread_cond_wait(&g->cv, &g->m);
	pthread_mutex_unlock(&g->m);
	d->bytes_copied += len;
	return 0;
}

static int gate_sync(struct hyb_copydev *d, unsigned int prio)
{
	(void)d, (void)prio;
	return 0;
}

static int gate_evict(struct hyb_copydev *d, uint32_t slot)
{
	(void)slot;
	d->evictions++;
	return 0;
}

static void gate_close(struct hyb_copydev *d)
{
	(void)d;
}

static int gate_mark(struct hyb_copydev *d, unsigned int prio, uint32_t *token)
{
	struct gate_dev *g = (struct gate_dev *)d;

	(void)prio;
	*token = g->next_token++;
	g->marks++;
	if (++g->outstanding > g->max_outstanding)
		g->max_outstanding = g->outstanding;
	return 0;
}

static int gate_wait(struct hyb_copydev *d, uint32_t token)
{
	struct gate_dev *g = (struct gate_dev *)d;

	/* the lane waits in the order it marked */
	CHECK_MSG(token + (uint32_t)g->outstanding == g->next_token, "token %u waited out of order",
		  token);
	g->outstanding--;
	return 0;
}

static const struct hyb_copydev_ops gate_ops = {
	.upload = gate_upload, .sync = gate_sync, .evict = gate_evict, .close = gate_close,
	.mark = gate_mark, .wait = gate_wait,
};

static const struct hyb_copydev_ops gate_ops_sync = {
	.upload = gate_upload, .sync = gate_sync, .evict = gate_evict, .close = gate_close,
};

static struct gate_dev gate = {
	.d = { .ops = &gate_ops, .name = "gate", .n_slots = 16, .slot_bytes = 1 << 20 },
	.m = PTHREAD_MUTEX_INITIALIZER,
	.cv = PTHREAD_COND_INITIALIZER,
};

static void gate_wait_calls(int n)
{
	pthread_mutex_lock(&gate.m);
	while (gate.calls < n)
		pthread_cond_wait(&gate.cv, &gate.m);
	pthread_mutex_unlock(&gate.m);
}

static void gate_set(int open)
{
	pthread_mutex_lock(&gate.m);
	gate.open = open;
	pthread_cond_broadcast(&gate.cv);
	pthread_mutex_unlock(&gate.m);
}

struct rig {
	struct hyb_backend *b;
	struct hyb_reload *r;
	struct hyb_rq *c;
};

static void rig_start(struct rig *g, const char *model, uint64_t chunk, struct hyb_copydev *dev)
{
	struct hyb_reload_config cfg = {
		.queue = QID, .model_path = model, .chunk = chunk, .dev = dev,
		.on_done = on_done,
	};
	char err[256];

	g->b = hyb_backend_open(HYB_BACKEND_LOCAL);
	CHECK_MSG(g->b, "%s", hyb_last_error());
	cfg.backend = g->b;
	g->r = hyb_reload_start(&cfg, err, sizeof(err));
	CHECK_MSG(g->r, "%s", err);
	CHECK_MSG(!hyb_rq_attach_client(g->b, QID, HYB_RQ_EVENTFD_NONE, &g->c), "%s",
		  hyb_last_error());
}

static void rig_stop(struct rig *g)
{
	hyb_reload_stop(g->r, NULL);
	hyb_rq_close(g->c);
	hyb_backend_close(g->b);
}

/* -- tests --------------------------------------------------------------- */

static void load_bytes_match_file(void)
{
	const uint64_t fsize = (6 << 20) + 777;
	const char *path = make_file("m.bin", fsize);
	const uint64_t r[][3] = {	/* pool_off, file_off, len */
		{ 0, 0, 4 << 20 }, { (4 << 20) + 4096, 4096 + 13, 100000 },
		{ (4 << 20) + 200003, 5, 1 }, { 5 << 20, fsize - 70000, 70000 },
		{ (6 << 20) + 123457, 2 << 20, (1 << 20) + 4097 },	/* pool ranges apart */
		{ 7864320 + 100, 8192 + 100, 300000 },	/* aligned alike: head, body, tail */
		{ 8200065, fsize - 5000, 5000 },	/* the same, tail block past EOF */
	};
	const int n = (int)(sizeof(r) / sizeof(r[0]));
	struct hyb_rq_cqe cqe[8];
	struct hyb_rq_req q[8];
	struct rig g;
	uint8_t *base, *ref = malloc(4 << 20);

	CHECK(n <= 8);
	struct hyb_mempool *p;

	rig_start(&g, path, 256 << 10, NULL);
	p = make_pool(g.b, "t-reload", 8 << 20, &base);
	for (int i = 0; i < n; i++)
		q[i] = req(HYB_RQ_LOAD, (uint8_t)(i % 4), hyb_mempool_id(p), r[i][0], r[i][2],
			   r[i][1], (uint64_t)i);
	CHECK_MSG(!hyb_rq_submit(g.c, q, (unsigned int)n), "%s", hyb_last_error());
	reap_n(g.c, cqe, n);
	for (int i = 0; i < n; i++) {
		CHECK_MSG(cqe[i].status == 0, "request %d: status %d (%s)", i, cqe[i].status,
			  ev_msgs[event_of((uint64_t)i)]);
		file_bytes(path, r[i][1], r[i][2], ref);
		CHECK_MSG(!memcmp(base + r[i][0], ref, r[i][2]), "request %d: bytes differ", i);
	}
	/* a 4 MiB load in 256 KiB chunks: 16 slices */
	CHECK_EQ_INT(evs[event_of(0)].slices, 16);
	hyb_mempool_close(p);
	rig_stop(&g);
	free(ref);
}

/* the storage lane's own reader */
TEST(reload_load_bytes_match_file)
{
	load_bytes_match_file();
}

/* the streaming engine, which the lane falls back to */
TEST(reload_load_bytes_match_file_stream_engine)
{
	setenv("HYB_RELOAD_STREAM", "1", 1);
	load_bytes_match_file();
}

/* Where the kernel refuses io_uring: the lane's reader cannot open, the
 * streaming engine's pread threads read instead, the bytes are the same. */
TEST(reload_load_bytes_match_file_without_io_uring)
{
	setenv(HYB_TESTING_ENV_NO_URING, "1", 1);
	load_bytes_match_file();
}

/*
 * The same completion order and bounds with one chunk in flight (sync per
 * chunk) and with two (marks): the second chunk in flight is picked by the
 * same rule, so a critical request that came while the LOW one's first chunk
 * was held waited for that chunk alone, the second critical for it and the
 * first critical's chunk.
 */
static void priority_order_and_preemption(const struct hyb_copydev_ops *ops)
{
	struct hyb_rq_cqe cqe[8];
	struct hyb_rq_req q;
	struct rig g;
	struct hyb_mempool *p;
	uint8_t *base;
	/* tag: priority; submitted one by one, each fetched on its own */
	const uint8_t prios[] = { HYB_RQ_LOW, HYB_RQ_NORMAL, HYB_RQ_CRITICAL, HYB_RQ_HIGH,
				  HYB_RQ_LOW, HYB_RQ_CRITICAL };
	const uint64_t want[] = { 2, 5, 3, 1, 100, 0, 4 };	/* completion order by tag */
	struct hyb_reload_stats st;

	gate.d.ops = ops;
	rig_start(&g, NULL, 64 << 10, &gate.d);
	p = make_pool(g.b, "t-order", 2 << 20, &base);
	/* tag 100: a LOW upload of 4 chunks; its first chunk holds the lane */
	q = req(HYB_RQ_UPLOAD, HYB_RQ_LOW, hyb_mempool_id(p), 0, 256 << 10, 0, 100);
	CHECK(!hyb_rq_submit(g.c, &q, 1));
	gate_wait_calls(1);
	for (unsigned int i = 0; i < sizeof(prios); i++) {
		q = req(HYB_RQ_UPLOAD, prios[i], hyb_mempool_id(p), 4096 * i, 4096, 1 + i, i);
		CHECK(!hyb_rq_submit(g.c, &q, 1));
		wait_fetched(g.r, 2 + i);
	}
	gate_set(1);
	reap_n(g.c, cqe, 7);
	for (int i = 0; i < 7; i++)
		CHECK_MSG(cqe[i].status == 0, "tag %llu: %d", (unsigned long long)cqe[i].tag,
			  cqe[i].status);
	CHECK_EQ_INT(n_evs, 7);
	for (int i = 0; i < 7; i++)
		CHECK_MSG(ev_tags[i] == want[i], "completion %d is tag %llu, expected %llu", i,
			  (unsigned long long)ev_tags[i], (unsigned long long)want[i]);
	/* the critical ones waited for the chunk in flight only */
	CHECK_EQ_INT(evs[event_of(2)].slices_waited, 1);
	CHECK_EQ_INT(evs[event_of(5)].slices_waited, 2);	/* that chunk + critical tag 2 */
	CHECK_EQ_INT(evs[event_of(100)].slices, 4);
	CHECK_EQ_INT(evs[event_of(100)].preempted, 1);
	hyb_reload_stats(g.r, &st);
	CHECK_EQ_INT(st.cls[HYB_RELOAD_CRITICAL].done, 2);
	CHECK_EQ_INT(st.cls[HYB_RELOAD_RELOAD].done, 2);
	CHECK_EQ_INT(st.cls[HYB_RELOAD_PREFETCH].done, 3);
	CHECK_EQ_INT(st.cls[HYB_RELOAD_CRITICAL].max_slices_waited, 2);
	CHECK_EQ_INT(st.cls[HYB_RELOAD_PREFETCH].preemptions, 1);
	CHECK_EQ_INT(st.slices, 3 + 4 + 3);
	if (ops->mark) {	/* every chunk marked and waited for, two at a time */
		CHECK_EQ_INT(gate.marks, 10);
		CHECK_EQ_INT(gate.outstanding, 0);
		CHECK_EQ_INT(gate.max_outstanding, HYB_RELOAD_DEVICE_DEPTH);
	} else {
		CHECK_EQ_INT(gate.marks, 0);
	}
	hyb_mempool_close(p);
	rig_stop(&g);
}

TEST(reload_priority_order_and_preemption)
{
	priority_order_and_preemption(&gate_ops);
}

TEST(reload_priority_order_one_in_flight)
{
	priority_order_and_preemption(&gate_ops_sync);
}

TEST(reload_critical_load_waits_at_most_one_chunk)
{
	const uint64_t fsize = 48 << 20;
	const char *path = make_file("big.bin", fsize);
	struct hyb_rq_cqe cqe[2];
	struct hyb_rq_req q;
	struct rig g;
	struct hyb_mempool *p;
	uint8_t *base, ref[65536];
	int ic, ib;

	struct hyb_reload_stats st;
	int fd = open(path, O_RDONLY);

	rig_start(&g, path, 1 << 20, NULL);
	p = make_pool(g.b, "t-bound", fsize, &base);
	/* cold if the kernel lets us: O_DIRECT reads, 48 chunks of 1 MiB */
	CHECK(fd >= 0 && !fdatasync(fd));
	posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
	close(fd);
	q = req(HYB_RQ_LOAD, HYB_RQ_LOW, hyb_mempool_id(p), 0, fsize - 65536, 0, 1);
	CHECK(!hyb_rq_submit(g.c, &q, 1));
	do {	/* the prefetch is under way */
		usleep(100);
		hyb_reload_stats(g.r, &st);
	} while (!st.slices);
	q = req(HYB_RQ_LOAD, HYB_RQ_CRITICAL, hyb_mempool_id(p), fsize - 65536, 65536,
		fsize - 65536, 2);
	CHECK(!hyb_rq_submit(g.c, &q, 1));
	reap_n(g.c, cqe, 2);
	CHECK(cqe[0].status == 0 && cqe[1].status == 0);
	ic = event_of(2);
	ib = event_of(1);
	CHECK(ic >= 0 && ib >= 0);
	if (evs[ib].done_ns < evs[ic].queued_ns)
		SKIP("the prefetch finished before the critical request arrived (fast disk)");
	CHECK_MSG(ic < ib, "the critical load finished after the prefetch");
	CHECK_MSG(evs[ic].slices_waited <= 1, "critical waited %u chunks", evs[ic].slices_waited);
	CHECK_EQ_INT(evs[ib].preempted, 1);
	CHECK_EQ_INT(evs[ib].slices, 48 - 1 + 1);	/* 47 MiB + 960 KiB */
	file_bytes(path, fsize - 65536, 65536, ref);
	CHECK(!memcmp(base + fsize - 65536, ref, 65536));
	hyb_mempool_close(p);
	rig_stop(&g);
}

/*
 * The device lane on the CPU device paced to a slow link (50 MB/s: a 64 KiB
 * chunk is ~1.3 ms on the link): it marks chunk k+1 before it waits for chunk
 * k, so two chunks are on the link at once and two marks outstanding, never
 * more; every mark is waited for once. A critical upload that comes in the
 * middle waits for the two chunks in flight (slices_waited <= 2) and, on the
 * link, finds at most one chunk still ahead of its own first chunk (the
 * older one has landed before the lane picks the next chunk): the software
 * bound that the copy engine's submission order needs.
 */
TEST(reload_device_lane_keeps_two_chunks_in_flight)
{
	const uint64_t chunk = 64 << 10;
	struct hyb_copydev_cpu_stats ds;
	struct hyb_reload_stats st;
	struct hyb_copydev *dev;
	struct hyb_rq_cqe cqe[2];
	struct hyb_rq_req q;
	struct hyb_mempool *p;
	const uint8_t *slot;
	uint64_t valid;
	uint8_t *base;
	char err[256];
	struct rig g;
	int ic, il;

	dev = hyb_copydev_cpu_open(4, 2 << 20, 50000000, err, sizeof(err));
	CHECK_MSG(dev, "%s", err);
	rig_start(&g, NULL, chunk, dev);
	p = make_pool(g.b, "t-flight", 4 << 20, &base);
	for (uint32_t i = 0; i < (4 << 20); i++)
		base[i] = (uint8_t)(i * 7 + (i >> 13));

	/* alone: 16 chunks, two in flight from the second one on */
	q = req(HYB_RQ_UPLOAD, HYB_RQ_NORMAL, hyb_mempool_id(p), 0, 1 << 20, 0, 1);
	CHECK(!hyb_rq_submit(g.c, &q, 1));
	reap_n(g.c, cqe, 1);
	CHECK_EQ_INT(cqe[0].status, 0);
	CHECK(!hyb_copydev_cpu_stats(dev, &ds));
	CHECK_EQ_INT(ds.marks, 16);
	CHECK_EQ_INT(ds.waits, 16);
	CHECK_EQ_INT(ds.max_marks, HYB_RELOAD_DEVICE_DEPTH);
	CHECK_EQ_INT(ds.max_queued, HYB_RELOAD_DEVICE_DEPTH);
	CHECK_EQ_INT(evs[event_of(1)].slices, 16);
	/* 16 chunks of ~1.31 ms: the request completes after the last has landed */
	CHECK_MSG(evs[event_of(1)].done_ns - evs[event_of(1)].started_ns >= 20000000ull,
		  "1 MiB at 50 MB/s completed after %llu ns",
		  (unsigned long long)(evs[event_of(1)].done_ns - evs[event_of(1)].started_ns));
	slot = hyb_copydev_cpu_slot(dev, 0, &valid);
	CHECK_EQ_INT(valid, 1 << 20);
	CHECK(!memcmp(slot, base, 1 << 20));

	/* a critical upload in the middle of a 2 MiB prefetch (32 chunks, ~42 ms) */
	q = req(HYB_RQ_UPLOAD, HYB_RQ_LOW, hyb_mempool_id(p), 1 << 20, 2 << 20, 1, 2);
	CHECK(!hyb_rq_submit(g.c, &q, 1));
	do {	/* a few chunks in */
		usleep(1000);
		hyb_reload_stats(g.r, &st);
	} while (st.slices < 16 + 4);
	q = req(HYB_RQ_UPLOAD, HYB_RQ_CRITICAL, hyb_mempool_id(p), 3 << 20, chunk, 2, 3);
	CHECK(!hyb_rq_submit(g.c, &q, 1));
	reap_n(g.c, cqe, 2);
	CHECK_EQ_INT(cqe[0].status, 0);
	CHECK_EQ_INT(cqe[1].status, 0);
	ic = event_of(3);
	il = event_of(2);
	CHECK(ic >= 0 && il >= 0);
	if (evs[il].done_ns < evs[ic].queued_ns)
		SKIP("the prefetch finished before the critical upload arrived (a stalled test)");
	CHECK_MSG(ic < il, "the critical upload completed after the prefetch");
	CHECK_MSG(evs[ic].slices_waited >= 1 && evs[ic].slices_waited <= HYB_RELOAD_DEVICE_DEPTH,
		  "critical waited %u chunks", evs[ic].slices_waited);
	CHECK_EQ_INT(evs[il].preempted, 1);
	CHECK_EQ_INT(evs[il].slices, 32);
	CHECK(!hyb_copydev_cpu_stats(dev, &ds));
	CHECK_MSG(ds.max_ahead[HYB_RQ_CRITICAL] <= (HYB_RELOAD_DEVICE_DEPTH - 1) * chunk,
		  "%llu bytes were still to cross the link ahead of the critical chunk",
		  (unsigned long long)ds.max_ahead[HYB_RQ_CRITICAL]);
	CHECK_EQ_INT(ds.max_marks, HYB_RELOAD_DEVICE_DEPTH);
	CHECK_EQ_INT(ds.max_queued, HYB_RELOAD_DEVICE_DEPTH);
	CHECK_EQ_INT(ds.marks, 16 + 32 + 1);
	CHECK_EQ_INT(ds.waits, ds.marks);
	slot = hyb_copydev_cpu_slot(dev, 1, &valid);
	CHECK(valid == 2 << 20 && !memcmp(slot, base + (1 << 20), 2 << 20));
	slot = hyb_copydev_cpu_slot(dev, 2, &valid);
	CHECK(valid == chunk && !memcmp(slot, base + (3 << 20), chunk));
	hyb_reload_stats(g.r, &st);
	CHECK_MSG(st.cls[HYB_RELOAD_CRITICAL].max_slices_waited <= HYB_RELOAD_DEVICE_DEPTH, "%u",
		  st.cls[HYB_RELOAD_CRITICAL].max_slices_waited);
	hyb_mempool_close(p);
	rig_stop(&g);
	hyb_copydev_close(dev);
}

/*
 * The CPU device with faults: an upload into slot bad_upload fails when it is
 * issued, one into slot bad_wait when its mark is waited for (as CUDA reports
 * an asynchronous copy's failure).
 */
struct faulty_dev {
	struct hyb_copydev d;
	struct hyb_copydev *cpu;
	uint32_t bad_upload, bad_wait;
	uint32_t last_slot;
	uint32_t token_slot[HYB_COPYDEV_MARKS];
};

static int faulty_upload(struct hyb_copydev *d, uint32_t slot, uint64_t off, const void *src,
			 uint64_t len, unsigned int prio)
{
	struct faulty_dev *f = (struct faulty_dev *)d;

	if (slot == f->bad_upload)
		return -EFAULT;
	f->last_slot = slot;
	return f->cpu->ops->upload(f->cpu, slot, off, src, len, prio);
}

static int faulty_sync(struct hyb_copydev *d, unsigned int prio)
{
	struct faulty_dev *f = (struct faulty_dev *)d;

	return f->cpu->ops->sync(f->cpu, prio);
}

static int faulty_evict(struct hyb_copydev *d, uint32_t slot)
{
	struct faulty_dev *f = (struct faulty_dev *)d;

	return f->cpu->ops->evict(f->cpu, slot);
}

static void faulty_close(struct hyb_copydev *d)
{
	(void)d;
}

static int faulty_mark(struct hyb_copydev *d, unsigned int prio, uint32_t *token)
{
	struct faulty_dev *f = (struct faulty_dev *)d;
	int ret = f->cpu->ops->mark(f->cpu, prio, token);

	if (!ret)
		f->token_slot[*token % HYB_COPYDEV_MARKS] = f->last_slot;
	return ret;
}

static int faulty_wait(struct hyb_copydev *d, uint32_t token)
{
	struct faulty_dev *f = (struct faulty_dev *)d;
	int ret = f->cpu->ops->wait(f->cpu, token);

	return ret ? ret : f->token_slot[token % HYB_COPYDEV_MARKS] == f->bad_wait ? -EIO : 0;
}

static const struct hyb_copydev_ops faulty_ops = {
	.upload = faulty_upload, .sync = faulty_sync, .evict = faulty_evict,
	.close = faulty_close, .mark = faulty_mark, .wait = faulty_wait,
};

/*
 * A copy that fails - when issued or when waited for - fails its request
 * alone, with the device's reason; the other requests, those with chunks in
 * flight beside it included, land; the lane goes on serving; every mark is
 * waited for, the failed request's chunk in flight too.
 */
TEST(reload_failed_copy_fails_its_request_only)
{
	const uint64_t chunk = 64 << 10;
	struct hyb_copydev_cpu_stats ds;
	struct faulty_dev fd = { .d = { .ops = &faulty_ops, .name = "faulty" },
				 .bad_upload = 3, .bad_wait = 2 };
	struct hyb_rq_cqe cqe[5];
	struct hyb_rq_req q[5];
	struct hyb_mempool *p;
	const uint8_t *slot;
	uint64_t valid;
	uint8_t *base;
	char err[256];
	struct rig g;

	fd.cpu = hyb_copydev_cpu_open(8, 1 << 20, 0, err, sizeof(err));
	CHECK_MSG(fd.cpu, "%s", err);
	fd.d.n_slots = fd.cpu->n_slots;
	fd.d.slot_bytes = fd.cpu->slot_bytes;
	rig_start(&g, NULL, chunk, &fd.d);
	p = make_pool(g.b, "t-faulty", 4 << 20, &base);
	for (uint32_t i = 0; i < (4 << 20); i++)
		base[i] = (uint8_t)(i * 13 + (i >> 11));
	/* one priority: their chunks follow each other through the ring */
	q[0] = req(HYB_RQ_UPLOAD, HYB_RQ_NORMAL, hyb_mempool_id(p), 0, 256 << 10, 1, 0);
	q[1] = req(HYB_RQ_UPLOAD, HYB_RQ_NORMAL, hyb_mempool_id(p), 0, 256 << 10, 2, 1);
	q[2] = req(HYB_RQ_UPLOAD, HYB_RQ_NORMAL, hyb_mempool_id(p), 0, 256 << 10, 3, 2);
	q[3] = req(HYB_RQ_UPLOAD, HYB_RQ_NORMAL, hyb_mempool_id(p), 1 << 20, 200000, 4, 3);
	CHECK_MSG(!hyb_rq_submit(g.c, q, 4), "%s", hyb_last_error());
	reap_n(g.c, cqe, 4);
	CHECK_EQ_INT(cqe[0].status, 0);
	CHECK_EQ_INT(cqe[1].status, -EIO);
	CHECK_MSG(strstr(ev_msgs[event_of(1)], "slot 2") &&
		  strstr(ev_msgs[event_of(1)], strerror(EIO)), "%s", ev_msgs[event_of(1)]);
	/* stopped at the failure: at most the chunk in flight beside it followed */
	CHECK_MSG(evs[event_of(1)].slices <= 2, "%u chunks", evs[event_of(1)].slices);
	CHECK_EQ_INT(cqe[2].status, -EFAULT);
	CHECK_MSG(strstr(ev_msgs[event_of(2)], "slot 3"), "%s", ev_msgs[event_of(2)]);
	CHECK_EQ_INT(evs[event_of(2)].slices, 1);
	CHECK_EQ_INT(cqe[3].status, 0);
	slot = hyb_copydev_cpu_slot(fd.cpu, 1, &valid);
	CHECK(valid == 256 << 10 && !memcmp(slot, base, 256 << 10));
	slot = hyb_copydev_cpu_slot(fd.cpu, 4, &valid);
	CHECK(valid == 200000 && !memcmp(slot, base + (1 << 20), 200000));
	/* the lane goes on */
	q[4] = req(HYB_RQ_UPLOAD, HYB_RQ_CRITICAL, hyb_mempool_id(p), 2 << 20, 100000, 5, 4);
	CHECK(!hyb_rq_submit(g.c, &q[4], 1));
	reap_n(g.c, cqe, 1);
	CHECK_EQ_INT(cqe[0].status, 0);
	slot = hyb_copydev_cpu_slot(fd.cpu, 5, &valid);
	CHECK(valid == 100000 && !memcmp(slot, base + (2 << 20), 100000));
	rig_stop(&g);
	CHECK(!hyb_copydev_cpu_stats(fd.cpu, &ds));
	CHECK_EQ_INT(ds.waits, ds.marks);
	CHECK(ds.max_marks <= HYB_RELOAD_DEVICE_DEPTH);
	hyb_mempool_close(p);
	hyb_copydev_close(fd.cpu);
}

TEST(reload_errors_are_per_request)
{
	const uint64_t fsize = 1 << 20;
	const char *path = make_file("e.bin", fsize);
	struct hyb_copydev *dev;
	struct hyb_backend *other;
	struct hyb_mempool *p, *foreign;
	struct hyb_rq_cqe cqe[10];
	struct hyb_rq_req q[10];
	uint8_t *base, *fbase, ref[8192];
	uint64_t valid;
	struct rig g;
	char err[256];
	int n = 0;

	dev = hyb_copydev_cpu_open(4, 65536, 0, err, sizeof(err));
	CHECK_MSG(dev, "%s", err);
	rig_start(&g, path, 64 << 10, dev);
	p = make_pool(g.b, "t-err", 2 << 20, &base);
	other = hyb_backend_open(HYB_BACKEND_LOCAL);
	foreign = make_pool(other, "t-foreign", 2 << 20, &fbase);
	memset(base + (1 << 20), 0x5a, 8192);
	q[n++] = req(HYB_RQ_LOAD, HYB_RQ_NORMAL, hyb_mempool_id(p), 0, 8192, 100, 0);
	q[n++] = req(HYB_RQ_LOAD, HYB_RQ_NORMAL, hyb_mempool_id(p), 0, 8192, fsize - 100, 1);
	q[n++] = req(HYB_RQ_LOAD, HYB_RQ_CRITICAL, hyb_mempool_id(foreign), 0, 4096, 0, 2);
	q[n++] = req(HYB_RQ_UPLOAD, HYB_RQ_HIGH, hyb_mempool_id(p), 0, 4096, 4, 3);
	q[n++] = req(HYB_RQ_UPLOAD, HYB_RQ_HIGH, hyb_mempool_id(p), 0, 65537, 1, 4);
	q[n++] = req(HYB_RQ_UPLOAD, HYB_RQ_LOW, hyb_mempool_id(p), 1 << 20, 8192, 2, 5);
	q[n++] = req(HYB_RQ_NOP, HYB_RQ_LOW, 0, 0, 0, 0, 6);
	q[n++] = req(HYB_RQ_LOAD, HYB_RQ_LOW, hyb_mempool_id(p), 65536, 4096, 8192, 7);
	CHECK_MSG(!hyb_rq_submit(g.c, q, (unsigned int)n), "%s", hyb_last_error());
	reap_n(g.c, cqe, n);
	CHECK_EQ_INT(cqe[0].status, 0);
	CHECK_EQ_INT(cqe[1].status, -ERANGE);
	CHECK_MSG(strstr(ev_msgs[event_of(1)], "e.bin") && strstr(ev_msgs[event_of(1)], "past"),
		  "%s", ev_msgs[event_of(1)]);
	CHECK_EQ_INT(cqe[2].status, -EACCES);
	CHECK_MSG(strstr(ev_msgs[event_of(2)], "t-foreign"), "%s", ev_msgs[event_of(2)]);
	CHECK_EQ_INT(cqe[3].status, -EINVAL);	/* slot 4 of 0..3 */
	CHECK_EQ_INT(cqe[4].status, -ENOSPC);	/* more than a slot */
	CHECK_EQ_INT(cqe[5].status, 0);
	CHECK_EQ_INT(cqe[6].status, 0);
	CHECK_EQ_INT(cqe[7].status, 0);
	/* the good ones did their job */
	file_bytes(path, 100, 8192, ref);
	CHECK(!memcmp(base, ref, 8192));
	file_bytes(path, 8192, 4096, ref);
	CHECK(!memcmp(base + 65536, ref, 4096));
	CHECK(!memcmp(hyb_copydev_cpu_slot(dev, 2, &valid), base + (1 << 20), 8192));
	CHECK_EQ_INT(valid, 8192);
	CHECK_EQ_INT(fbase[0], 0);	/* nothing written into the foreign pool */

	/* refused at submit, with a clear reason: no such pool, range past the pool */
	q[0] = req(HYB_RQ_LOAD, HYB_RQ_NORMAL, 999999, 0, 4096, 0, 10);
	CHECK_EQ_INT(hyb_rq_submit(g.c, q, 1), -ENOENT);
	CHECK_MSG(strstr(hyb_last_error(), "does not exist"), "%s", hyb_last_error());
	q[0] = req(HYB_RQ_LOAD, HYB_RQ_NORMAL, hyb_mempool_id(p), (2 << 20) - 4096, 8192, 0, 11);
	CHECK_EQ_INT(hyb_rq_submit(g.c, q, 1), -EINVAL);
	CHECK_MSG(strstr(hyb_last_error(), "outside its pool"), "%s", hyb_last_error());

	/* evict empties the slot, with a pool range or without one (it is optional) */
	q[0] = req(HYB_RQ_EVICT, HYB_RQ_NORMAL, hyb_mempool_id(p), 0, 1, 2, 12);
	CHECK(!hyb_rq_submit(g.c, q, 1));
	reap_n(g.c, cqe, 1);
	CHECK_EQ_INT(cqe[0].status, 0);
	hyb_copydev_cpu_slot(dev, 2, &valid);
	CHECK_EQ_INT(valid, 0);
	q[0] = req(HYB_RQ_UPLOAD, HYB_RQ_NORMAL, hyb_mempool_id(p), 0, 4096, 3, 15);
	q[1] = req(HYB_RQ_EVICT, HYB_RQ_NORMAL, 0, 0, 0, 3, 16);
	CHECK_MSG(!hyb_rq_submit(g.c, q, 2), "%s", hyb_last_error());
	reap_n(g.c, cqe, 2);
	CHECK(cqe[0].status == 0 && cqe[1].status == 0);
	hyb_copydev_cpu_slot(dev, 3, &valid);
	CHECK_EQ_INT(valid, 0);
	q[0] = req(HYB_RQ_EVICT, HYB_RQ_NORMAL, 0, 4096, 0, 3, 17);	/* half a range */
	CHECK_EQ_INT(hyb_rq_submit(g.c, q, 1), -EINVAL);

	/* the file is gone: -ENOENT for that request, the next one still served */
	CHECK(!unlink(path));
	q[0] = req(HYB_RQ_LOAD, HYB_RQ_CRITICAL, hyb_mempool_id(p), 0, 4096, 0, 13);
	q[1] = req(HYB_RQ_UPLOAD, HYB_RQ_CRITICAL, hyb_mempool_id(p), 0, 4096, 1, 14);
	CHECK(!hyb_rq_submit(g.c, q, 2));
	reap_n(g.c, cqe, 2);
	CHECK_EQ_INT(cqe[0].status, -ENOENT);
	CHECK_MSG(strstr(ev_msgs[event_of(13)], "e.bin"), "%s", ev_msgs[event_of(13)]);
	CHECK_EQ_INT(cqe[1].status, 0);

	hyb_mempool_close(foreign);
	hyb_backend_close(other);
	hyb_mempool_close(p);
	rig_stop(&g);
	hyb_copydev_close(dev);
}

/*
 * The service pins the pool mappings it makes for the copy device (an
 * UPLOAD from a pinned mapping is one DMA on CUDA) and gives each back when
 * it lets the mapping go; a mapping already pinned by its owner (-EEXIST)
 * is used as it is and left to that owner.
 */
TEST(reload_pins_its_pool_mappings)
{
	const char *path = make_file("pin.bin", 1 << 20);
	struct hyb_copydev *dev;
	struct hyb_mempool *p;
	struct hyb_rq_cqe cqe[2];
	struct hyb_rq_req q[2];
	char err[256];
	uint8_t *base;
	struct rig g;

	dev = hyb_copydev_cpu_open(4, 65536, 0, err, sizeof(err));
	CHECK_MSG(dev, "%s", err);
	rig_start(&g, path, 64 << 10, dev);
	p = make_pool(g.b, "t-pin", 2 << 20, &base);
	CHECK_EQ_INT(dev->pinned, 0);
	q[0] = req(HYB_RQ_LOAD, HYB_RQ_NORMAL, hyb_mempool_id(p), 0, 8192, 0, 1);
	q[1] = req(HYB_RQ_UPLOAD, HYB_RQ_HIGH, hyb_mempool_id(p), 0, 8192, 0, 2);
	CHECK_MSG(!hyb_rq_submit(g.c, q, 2), "%s", hyb_last_error());
	reap_n(g.c, cqe, 2);
	CHECK_EQ_INT(cqe[0].status, 0);
	CHECK_EQ_INT(cqe[1].status, 0);
	/* one mapping of the pool, pinned once, for both requests */
	CHECK_EQ_INT(dev->pinned, 1);
	CHECK_EQ_INT(dev->pinned_bytes, 2 << 20);
	/* the same region pinned again (its owner, as hybd does at start): refused */
	CHECK_EQ_INT(hyb_copydev_pin(dev, base, 4096, false, err, sizeof(err)), -EEXIST);
	rig_stop(&g);
	CHECK_EQ_INT(dev->pinned, 0);
	CHECK_EQ_INT(dev->pinned_bytes, 0);
	/* now free: an owner may pin it, and unpin */
	CHECK_EQ_INT(hyb_copydev_pin(dev, base, 2 << 20, false, err, sizeof(err)), 0);
	hyb_copydev_unpin(dev, base, 2 << 20);
	CHECK_EQ_INT(dev->pinned, 0);
	hyb_mempool_close(p);
	hyb_copydev_close(dev);
}

TEST(reload_destroyed_pool_is_enxio)
{
	struct hyb_rq_cqe cqe[3];
	struct hyb_rq_req q;
	struct rig g;
	struct hyb_mempool *p, *gone;
	uint8_t *base, *gbase;
	uint32_t gid;

	rig_start(&g, NULL, 64 << 10, &gate.d);
	p = make_pool(g.b, "t-keep", 2 << 20, &base);
	gone = make_pool(g.b, "t-gone", 2 << 20, &gbase);
	gid = hyb_mempool_id(gone);
	q = req(HYB_RQ_UPLOAD, HYB_RQ_CRITICAL, hyb_mempool_id(p), 0, 4096, 0, 1);
	CHECK(!hyb_rq_submit(g.c, &q, 1));
	gate_wait_calls(1);		/* the device lane is held */
	q = req(HYB_RQ_UPLOAD, HYB_RQ_LOW, gid, 0, 4096, 1, 2);
	CHECK(!hyb_rq_submit(g.c, &q, 1));
	wait_fetched(g.r, 2);
	CHECK(!hyb_mempool_destroy(gone));
	hyb_mempool_close(gone);
	gate_set(1);
	reap_n(g.c, cqe, 2);
	CHECK_EQ_INT(cqe[0].status, 0);
	CHECK_EQ_INT(cqe[1].status, -ENXIO);
	CHECK_MSG(strstr(ev_msgs[event_of(2)], "no pool"), "%s", ev_msgs[event_of(2)]);
	hyb_mempool_close(p);
	rig_stop(&g);
}

struct stopper {
	struct hyb_reload *r;
	struct hyb_reload_stats st;
};

static void *stop_thread(void *arg)
{
	struct stopper *s = arg;

	hyb_reload_stop(s->r, &s->st);
	return NULL;
}

TEST(reload_shutdown_fails_waiters)
{
	struct hyb_rq_cqe cqe[4];
	struct hyb_rq_req q[3];
	struct stopper s;
	pthread_t t;
	struct rig g;
	struct hyb_mempool *p;
	uint8_t *base;

	rig_start(&g, NULL, 64 << 10, &gate.d);
	p = make_pool(g.b, "t-stop", 2 << 20, &base);
	q[0] = req(HYB_RQ_UPLOAD, HYB_RQ_NORMAL, hyb_mempool_id(p), 0, 128 << 10, 0, 0);
	CHECK(!hyb_rq_submit(g.c, q, 1));
	gate_wait_calls(1);		/* its first of two chunks is in flight */
	q[0] = req(HYB_RQ_UPLOAD, HYB_RQ_CRITICAL, hyb_mempool_id(p), 0, 4096, 1, 1);
	q[1] = req(HYB_RQ_EVICT, HYB_RQ_LOW, hyb_mempool_id(p), 0, 1, 1, 2);
	CHECK(!hyb_rq_submit(g.c, q, 2));
	wait_fetched(g.r, 3);
	s.r = g.r;
	CHECK(!pthread_create(&t, NULL, stop_thread, &s));
	usleep(20000);
	gate_set(1);		/* the chunk in flight finishes: drained, not abandoned */
	pthread_join(t, NULL);
	reap_n(g.c, cqe, 3);
	CHECK_EQ_INT(cqe[0].status, -ESHUTDOWN);
	CHECK_EQ_INT(cqe[1].status, -ESHUTDOWN);
	CHECK_EQ_INT(cqe[2].status, -ESHUTDOWN);
	CHECK_EQ_INT(evs[event_of(0)].slices, 1);
	CHECK_MSG(strstr(ev_msgs[event_of(0)], "part way"), "%s", ev_msgs[event_of(0)]);
	CHECK_EQ_INT(s.st.cls[HYB_RELOAD_RELOAD].failed, 1);
	CHECK_EQ_INT(s.st.backlog, 0);
	/* nobody serves the queue now */
	CHECK_EQ_INT(hyb_rq_submit(g.c, q, 1), -EPIPE);
	hyb_rq_close(g.c);
	hyb_mempool_close(p);
	hyb_backend_close(g.b);
}

/*
 * hybd.conf `clients`: requests of a sender the policy does not name fail
 * with -EACCES and say who sent them; NOPs are answered; a policy naming
 * the sender's group admits it. (The local queue's sender is this process.)
 */
TEST(reload_clients_policy_refuses_others)
{
	const char *path = make_file("c.bin", 1 << 20);
	struct hyb_reload_config cfg = { .queue = QID, .model_path = path, .on_done = on_done };
	struct hyb_rq_cqe cqe[2];
	struct hyb_rq_req q[2];
	struct hyb_mempool *p;
	struct hyb_backend *b;
	struct hyb_reload *r;
	struct hyb_rq *c;
	uint8_t *base, ref[4096];
	char err[256], want[64];

	b = hyb_backend_open(HYB_BACKEND_LOCAL);
	CHECK_MSG(b, "%s", hyb_last_error());
	p = make_pool(b, "t-clients", 2 << 20, &base);
	cfg.backend = b;
	cfg.clients.n = 1;
	cfg.clients.ids[0].id = (uint32_t)geteuid() + 1;	/* someone else */
	r = hyb_reload_start(&cfg, err, sizeof(err));
	CHECK_MSG(r, "%s", err);
	CHECK_MSG(!hyb_rq_attach_client(b, QID, HYB_RQ_EVENTFD_NONE, &c), "%s", hyb_last_error());
	n_evs = 0;
	q[0] = req(HYB_RQ_LOAD, HYB_RQ_NORMAL, hyb_mempool_id(p), 0, 4096, 0, 1);
	q[1] = req(HYB_RQ_NOP, HYB_RQ_NORMAL, 0, 0, 0, 0, 2);
	CHECK_MSG(!hyb_rq_submit(c, q, 2), "%s", hyb_last_error());
	reap_n(c, cqe, 2);
	CHECK_EQ_INT(cqe[0].status, -EACCES);
	CHECK_EQ_INT(cqe[1].status, 0);
	snprintf(want, sizeof(want), "uid %u gid %u pid %d", (unsigned int)geteuid(),
		 (unsigned int)getegid(), (int)getpid());
	CHECK_MSG(event_of(1) >= 0 && strstr(ev_msgs[event_of(1)], want) &&
		  strstr(ev_msgs[event_of(1)], "not in clients"), "%s",
		  event_of(1) >= 0 ? ev_msgs[event_of(1)] : "no event");
	CHECK_EQ_INT(base[0], 0);	/* nothing was loaded */
	hyb_rq_close(c);
	hyb_reload_stop(r, NULL);

	/* the sender's group named: admitted, and the bytes arrive */
	cfg.clients.n = 2;
	cfg.clients.ids[1].gid = true;
	cfg.clients.ids[1].id = (uint32_t)getegid();
	r = hyb_reload_start(&cfg, err, sizeof(err));
	CHECK_MSG(r, "%s", err);
	CHECK_MSG(!hyb_rq_attach_client(b, QID, HYB_RQ_EVENTFD_NONE, &c), "%s", hyb_last_error());
	CHECK_MSG(!hyb_rq_submit(c, q, 1), "%s", hyb_last_error());
	reap_n(c, cqe, 1);
	CHECK_EQ_INT(cqe[0].status, 0);
	file_bytes(path, 0, 4096, ref);
	CHECK(!memcmp(base, ref, 4096));
	hyb_rq_close(c);
	hyb_reload_stop(r, NULL);
	hyb_mempool_close(p);
	hyb_backend_close(b);
}

TEST(reload_second_service_on_a_queue_is_refused)
{
	struct rig g;
	struct hyb_reload_config cfg = { .queue = QID };
	char err[256];

	rig_start(&g, NULL, 0, NULL);
	cfg.backend = g.b;
	CHECK(!hyb_reload_start(&cfg, err, sizeof(err)));
	CHECK_MSG(strstr(err, "queue 3"), "%s", err);
	cfg.chunk = 1000;
	CHECK(!hyb_reload_start(&cfg, err, sizeof(err)));
	CHECK_MSG(strstr(err, "multiple of 4096"), "%s", err);
	rig_stop(&g);
}

static const char *path_of_junk(void)
{
	static char p[512];
	FILE *f;

	snprintf(p, sizeof(p), "%s/junk", hyb_test_tmpdir());
	f = fopen(p, "w");
	fputs("hello\n", f);
	fclose(f);
	return p;
}

TEST(reload_stats_file_and_cpu_device_bandwidth)
{
	struct hyb_copydev *dev;
	struct hyb_reload_stats st;
	struct hyb_rq_cqe cqe[1];
	struct hyb_rq_req q;
	struct rig g;
	struct hyb_mempool *p;
	uint8_t *base;
	char err[256], path[512], line[1024];
	FILE *f;
	int lines = 0;

	/* 50 MB/s: 1 MiB takes ~21 ms */
	dev = hyb_copydev_cpu_open(2, 1 << 20, 50000000, err, sizeof(err));
	CHECK_MSG(dev, "%s", err);
	rig_start(&g, NULL, 256 << 10, dev);
	p = make_pool(g.b, "t-bw", 2 << 20, &base);
	q = req(HYB_RQ_UPLOAD, HYB_RQ_HIGH, hyb_mempool_id(p), 0, 1 << 20, 1, 9);
	CHECK(!hyb_rq_submit(g.c, &q, 1));
	reap_n(g.c, cqe, 1);
	CHECK_EQ_INT(cqe[0].status, 0);
	CHECK_MSG(cqe[0].service_ns + cqe[0].wait_ns >= 20000000ull,
		  "1 MiB at 50 MB/s took %llu ns",
		  (unsigned long long)(cqe[0].service_ns + cqe[0].wait_ns));
	hyb_reload_stats(g.r, &st);
	CHECK_EQ_INT(st.cls[HYB_RELOAD_RELOAD].done, 1);
	CHECK_EQ_INT(st.cls[HYB_RELOAD_RELOAD].bytes, 1 << 20);
	CHECK(st.cls[HYB_RELOAD_RELOAD].service.p50_ns >= 18000000ull);
	snprintf(path, sizeof(path), "%s/stats", hyb_test_tmpdir());
	CHECK_MSG(!hyb_reload_stats_write(&st, path), "%s", hyb_last_error());
	f = fopen(path, "r");
	CHECK(f);
	while (fgets(line, sizeof(line), f)) {
		if (lines == 2)
			CHECK_MSG(strstr(line, "class=reload done=1 ") &&
				  strstr(line, "bytes=1048576"), "%s", line);
		lines++;
	}
	fclose(f);
	CHECK_EQ_INT(lines, 4);
	{	/* and back */
		struct hyb_reload_stats back;
		int pid = 0;

		CHECK_MSG(!hyb_reload_stats_read(path, &back, &pid), "%s", hyb_last_error());
		CHECK_EQ_INT(pid, getpid());
		CHECK_EQ_INT(back.fetched, st.fetched);
		CHECK_EQ_INT(back.slices, st.slices);
		for (int k = 0; k < HYB_RELOAD_CLASSES; k++) {
			CHECK_EQ_INT(back.cls[k].done, st.cls[k].done);
			CHECK_EQ_INT(back.cls[k].bytes, st.cls[k].bytes);
			CHECK_EQ_INT(back.cls[k].service.p50_ns, st.cls[k].service.p50_ns);
			CHECK_EQ_INT(back.cls[k].total.p99_ns, st.cls[k].total.p99_ns);
			CHECK_EQ_INT(back.cls[k].wait.count, st.cls[k].wait.count);
		}
		CHECK(hyb_reload_stats_read("/nonexistent/s", &back, NULL));
		CHECK(hyb_reload_stats_read(path_of_junk(), &back, NULL));
		CHECK_MSG(strstr(hyb_last_error(), "not a reload statistics file"), "%s", hyb_last_error());
	}
	hyb_mempool_close(p);
	rig_stop(&g);
	hyb_copydev_close(dev);
}
