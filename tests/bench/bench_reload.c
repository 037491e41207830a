// SPDX-License-Identifier: MIT
/*
 * bench_reload: reload op latency, queue -> data in pool,
 * by priority class, on an idle service and while a prefetch stream keeps
 * the storage lane busy, against the floor of one O_DIRECT pread() of the
 * same size measured in the same run.
 *
 *   bench_reload [--file PATH] [--mib N] [-n REQS] [--bundle KIB] [--chunk KIB]
 *                [--prefetch KIB] [--inflight N] [--think US] [--warm]
 *
 * The service (daemon/reload.c) runs as threads of this process on the local
 * backend: exactly what embedded mode runs; box mode adds the module's queue
 * round trip (bench_queue measures it). Requests are LOADs of a bundle-sized
 * range at a random 4 KiB-aligned offset of a file made here; unless --warm,
 * each range is dropped from the page cache first, so the read goes to the
 * disk (the NVMe -> DRAM tier). Latency is what the app sees: submit to the
 * completion reaped (the queue's wait + service, plus the app's wake-up).
 * Prints a table, then one "name value unit" line per figure.
 *
 * --upload cpu|cuda: the other half of the op (queue -> data in
 * pool / in GPU cache): UPLOADs of bundle-sized pool ranges into neuron-
 * cache slots of a copy device (daemon/copydev.h: hybd's CUDA engine, its
 * pool pinned, or the CPU device paced to --link-gbps), the busy phase with
 * prefetch uploads filling the link; the floor is one upload + sync on the
 * device itself, without the queue, in the same run. Also on the device
 * alone: the link's throughput in chunks, with a sync after every chunk (the
 * service before it kept two in flight) and with two chunks in flight
 * (mark/wait, as the service's device lane does, HYB_RELOAD_DEVICE_DEPTH).
 *
 * The bound: a critical request waits for at most the chunks in flight in
 * its lane when it comes (1 for LOADs, HYB_RELOAD_DEVICE_DEPTH for UPLOADs
 * on a device with marks); the foreground sends one request at a time, so
 * no critical is ever ahead of another. Above it, the bench says so and
 * exits 1 after printing its figures.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "daemon/copydev.h"
#include "daemon/copydev_cuda.h"
#include "daemon/reload.h"

#define QID 11

static struct {
	const char *file;
	uint64_t size;
	int n;
	uint64_t bundle, chunk, prefetch;
	int inflight;
	int think_us;
	int warm;
	const char *upload;	/* NULL: LOADs from the file; "cpu" or "cuda": UPLOADs */
	double link_gbps;	/* the CPU copy device's pace */
} opt = { NULL, 64ull << 20, 300, 256 << 10, 1 << 20, 4 << 20, 8, 500, 0, NULL, 25 };

/* Upload mode: the foreground's requests go to slots 0..3, the prefetches' to 4..7. */
#define N_SLOTS 8
static struct hyb_copydev *dev;

static struct hyb_backend *be;
static struct hyb_mempool *pool;
static uint32_t pool_id;
static int file_fd = -1;
static atomic_int stop_bg;
static atomic_ullong bg_bytes;

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t rnd(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

struct lat {
	uint64_t *v;
	int n;
};

static double pct(struct lat *l, double p)
{
	if (!l->n)
		return 0;
	qsort(l->v, (size_t)l->n, sizeof(*l->v), cmp_u64);
	return l->v[(int)(p * (l->n - 1) + 0.5)] / 1e3;
}

/* A random range of len bytes, 4 KiB aligned, cold unless --warm. */
static uint64_t pick(uint64_t *seed, uint64_t len)
{
	uint64_t off = rnd(seed) % ((opt.size - len) / 4096 + 1) * 4096;

	if (!opt.warm && !opt.upload)
		posix_fadvise(file_fd, (off_t)off, (off_t)len, POSIX_FADV_DONTNEED);
	return off;
}

static void die(const char *what)
{
	fprintf(stderr, "bench_reload: %s: %s\n", what, hyb_last_error());
	exit(1);
}

/* One request at a time; latency submit -> reaped. */
static uint64_t one(struct hyb_rq *c, uint8_t prio, uint64_t *seed)
{
	struct hyb_rq_req q = { .op = opt.upload ? HYB_RQ_UPLOAD : HYB_RQ_LOAD, .prio = prio,
				.pool_id = pool_id, .len = opt.bundle };
	struct hyb_rq_cqe e;
	uint64_t t0;

	q.aux = q.pool_off = pick(seed, opt.bundle);
	if (opt.upload)
		q.aux = rnd(seed) % (N_SLOTS / 2);
	t0 = now_ns();
	if (hyb_rq_submit(c, &q, 1))
		die("submit");
	if (hyb_rq_reap(c, &e, 1, 1, 30000000000ull) != 1)
		die("reap");
	if (e.status) {
		fprintf(stderr, "bench_reload: a%s failed: %s\n", opt.upload ? "n upload" : " load",
			strerror(-e.status));
		exit(1);
	}
	return now_ns() - t0;
}

/* Keeps opt.inflight prefetch loads outstanding until told to stop. */
static void *prefetcher(void *arg)
{
	struct hyb_rq_req q = { .op = opt.upload ? HYB_RQ_UPLOAD : HYB_RQ_LOAD,
				.prio = HYB_RQ_LOW, .pool_id = pool_id, .len = opt.prefetch };
	uint64_t seed = 0x9e3779b97f4a7c15ull;
	struct hyb_rq_cqe e[64];
	struct hyb_rq *c;
	int out = 0, r;

	(void)arg;
	if (hyb_rq_attach_client(be, QID, HYB_RQ_EVENTFD_NONE, &c))
		die("attach");
	while (!atomic_load(&stop_bg) || out) {
		while (!atomic_load(&stop_bg) && out < opt.inflight) {
			q.aux = q.pool_off = pick(&seed, opt.prefetch);
			if (opt.upload)
				q.aux = N_SLOTS / 2 + rnd(&seed) % (N_SLOTS / 2);
			if (hyb_rq_submit(c, &q, 1))
				die("submit");
			out++;
		}
		r = hyb_rq_reap(c, e, 64, 1, 30000000000ull);
		if (r < 0)
			die("reap");
		for (int i = 0; i < r; i++)
			if (!e[i].status)
				atomic_fetch_add(&bg_bytes, opt.prefetch);
		out -= r;
	}
	hyb_rq_close(c);
	return NULL;
}

/* The floor: one O_DIRECT pread of a cold bundle, into the same pool memory. */
static void raw_pread(struct lat *l, uint64_t *seed)
{
	int fd = open(opt.file, O_RDONLY | O_DIRECT);
	uint8_t *base;
	size_t len;

	l->n = 0;
	if (fd < 0 || hyb_mempool_map(pool, (void **)&base, &len)) {
		if (fd >= 0)
			close(fd);
		return;
	}
	for (int i = 0; i < opt.n; i++) {
		uint64_t off = pick(seed, opt.bundle), t0 = now_ns();

		if (pread(fd, base + off, opt.bundle, (off_t)off) != (ssize_t)opt.bundle)
			break;
		l->v[l->n++] = now_ns() - t0;
	}
	close(fd);
}

/* Upload mode's floor: one upload of a bundle and its sync on the device, no queue. */
static void raw_upload(struct lat *l, const uint8_t *base, uint64_t *seed)
{
	l->n = 0;
	for (int i = 0; i < opt.n; i++) {
		uint64_t off = pick(seed, opt.bundle), t0 = now_ns();

		if (dev->ops->upload(dev, 0, 0, base + off, opt.bundle, HYB_RQ_CRITICAL) ||
		    dev->ops->sync(dev, HYB_RQ_CRITICAL))
			break;
		l->v[l->n++] = now_ns() - t0;
	}
}

/*
 * Upload mode: the link's throughput, opt.chunk at a time through the pool
 * (4 passes), on the device alone: inflight 1 syncs after every chunk,
 * 2 marks every chunk and waits for the one before it. GB/s, 0 on failure.
 */
static double raw_stream(const uint8_t *base, int inflight)
{
	const uint64_t slot = dev->slot_bytes;
	const uint64_t len = opt.chunk < slot ? opt.chunk : slot;
	const uint64_t n = 4 * (opt.size / len);
	uint32_t tok[2];
	uint64_t t0 = now_ns();

	for (uint64_t i = 0; i < n; i++) {
		uint64_t src = i * len % (opt.size - len + 1), off = i * len % (slot / len * len);

		if (dev->ops->upload(dev, (uint32_t)(i % N_SLOTS), off, base + src, len,
				     HYB_RQ_LOW))
			return 0;
		if (inflight < 2) {
			if (dev->ops->sync(dev, HYB_RQ_LOW))
				return 0;
			continue;
		}
		if (dev->ops->mark(dev, HYB_RQ_LOW, &tok[i % 2]) ||
		    (i && dev->ops->wait(dev, tok[(i - 1) % 2])))
			return 0;
	}
	if (inflight >= 2 && n && dev->ops->wait(dev, tok[(n - 1) % 2]))
		return 0;
	return (double)(n * len) / (double)(now_ns() - t0);
}

/* Upload mode: the copy device, the pool pinned for it and filled. */
static void open_dev(void)
{
	const uint64_t slot = opt.bundle > opt.prefetch ? opt.bundle : opt.prefetch;
	char err[512];
	uint8_t *base;
	size_t len;

	if (!strcmp(opt.upload, "cuda")) {
		struct hyb_copydev_cuda_config cc = { .n_slots = N_SLOTS, .slot_bytes = slot };

		dev = hyb_copydev_cuda_open(&cc, err, sizeof(err));
	} else if (!strcmp(opt.upload, "cpu")) {
		dev = hyb_copydev_cpu_open(N_SLOTS, slot, (uint64_t)(opt.link_gbps * 1e9), err,
					   sizeof(err));
	} else {
		snprintf(err, sizeof(err), "--upload %s: cpu or cuda", opt.upload);
	}
	if (!dev) {
		fprintf(stderr, "bench_reload: copy device: %s\n", err);
		exit(1);
	}
	if (hyb_mempool_map(pool, (void **)&base, &len))
		die("map");
	memset(base, 0x5a, len);
	if (hyb_copydev_pin(dev, base, len, false, err, sizeof(err)) && dev->ops->pin)
		printf("bench_reload: the pool is not pinned (%s): uploads are staged\n", err);
}

static const char *const cls_names[] = { "critical", "reload", "prefetch" };
static const uint8_t cls_prio[] = { HYB_RQ_CRITICAL, HYB_RQ_NORMAL, HYB_RQ_LOW };

static void usage(void)
{
	fprintf(stderr, "usage: bench_reload [--file PATH] [--mib N] [-n REQS] [--bundle KIB] "
		"[--chunk KIB] [--prefetch KIB] [--inflight N] [--think US] [--warm]\n"
		"                    [--upload cpu|cuda] [--link-gbps N]\n");
}

static int make_file(char *path, size_t len)
{
	const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
	uint64_t seed = 88172645463325252ull;
	size_t bs = 1 << 20;
	uint64_t *buf = malloc(bs);
	int fd;

	snprintf(path, len, "%s/hyb-bench-reload.%d.bin", dir, (int)getpid());
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	if (fd < 0 || !buf)
		return -1;
	for (uint64_t done = 0; done < opt.size; done += bs) {
		for (size_t i = 0; i < bs / 8; i++)
			buf[i] = rnd(&seed);
		if (write(fd, buf, bs) != (ssize_t)bs)
			return -1;
	}
	fsync(fd);
	close(fd);
	free(buf);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "file", 1, 0, 'f' }, { "mib", 1, 0, 'm' }, { "bundle", 1, 0, 'b' },
		{ "chunk", 1, 0, 'c' }, { "prefetch", 1, 0, 'p' }, { "inflight", 1, 0, 'i' },
		{ "think", 1, 0, 't' }, { "warm", 0, 0, 'w' }, { "help", 0, 0, 'h' },
		{ "upload", 1, 0, 'u' }, { "link-gbps", 1, 0, 'g' },
		{ 0, 0, 0, 0 },
	};
	struct lat idle[3], busy[2], raw;
	double link_sync = 0, link_two = 0;
	unsigned int bound = 1;
	struct hyb_reload_stats st0, st1;
	struct hyb_reload_config rc = { .queue = QID };
	struct hyb_reload *r;
	struct hyb_rq *c;
	char path[512], err[512];
	uint64_t seed = 12345, t_bg;
	double bg_gbs;
	pthread_t bg;
	int ch, made = 0;

	while ((ch = getopt_long(argc, argv, "n:h", lo, NULL)) != -1) {
		switch (ch) {
		case 'f': opt.file = optarg; break;
		case 'm': opt.size = strtoull(optarg, NULL, 10) << 20; break;
		case 'n': opt.n = atoi(optarg); break;
		case 'b': opt.bundle = strtoull(optarg, NULL, 10) << 10; break;
		case 'c': opt.chunk = strtoull(optarg, NULL, 10) << 10; break;
		case 'p': opt.prefetch = strtoull(optarg, NULL, 10) << 10; break;
		case 'i': opt.inflight = atoi(optarg); break;
		case 't': opt.think_us = atoi(optarg); break;
		case 'w': opt.warm = 1; break;
		case 'u': opt.upload = optarg; break;
		case 'g': opt.link_gbps = strtod(optarg, NULL); break;
		default: usage(); return ch == 'h' ? 0 : 2;
		}
	}
	if (opt.n < 10 || !opt.bundle || opt.bundle % 4096 || opt.chunk % 4096 || !opt.chunk ||
	    opt.prefetch % 4096 || !opt.prefetch || opt.inflight < 1 || opt.inflight > 64 ||
	    opt.size < 2 * opt.prefetch || opt.size < 2 * opt.bundle || !(opt.link_gbps > 0)) {
		fprintf(stderr, "bench_reload: sizes must be multiples of 4 KiB, -n >= 10, the "
			"file at least twice the largest request\n");
		return 2;
	}
	if (opt.upload) {
		opt.file = NULL; /* uploads read the pool: no file */
	} else if (!opt.file) {
		if (make_file(path, sizeof(path))) {
			fprintf(stderr, "bench_reload: cannot write %s: %s\n", path,
				strerror(errno));
			return 1;
		}
		opt.file = path;
		made = 1;
	} else {
		int fd = open(opt.file, O_RDONLY);
		off_t end = fd >= 0 ? lseek(fd, 0, SEEK_END) : -1;

		if (end < (off_t)(2 * opt.prefetch)) {
			fprintf(stderr, "bench_reload: %s is missing or too small\n", opt.file);
			return 1;
		}
		opt.size = (uint64_t)end & ~4095ull;
		close(fd);
	}
	file_fd = opt.upload ? -2 : open(opt.file, O_RDONLY);
	be = hyb_backend_open(HYB_BACKEND_LOCAL);
	if (!be || file_fd == -1) {
		fprintf(stderr, "bench_reload: %s\n", be ? strerror(errno) : hyb_last_error());
		return 1;
	}
	if (hyb_mempool_create(be, "bench-reload", opt.size, HYB_MEMPOOL_NODE_LOCAL, 0, 0, &pool))
		die("pool");
	pool_id = hyb_mempool_id(pool);
	if (opt.upload) {
		uint8_t *base;
		size_t len;

		open_dev();
		if (hyb_mempool_map(pool, (void **)&base, &len))
			die("map");
		raw = (struct lat){ calloc((size_t)opt.n, 8), 0 };
		raw_upload(&raw, base, &seed); /* before the service: one thread calls the device */
		link_sync = raw_stream(base, 1);
		if (dev->ops->mark && dev->ops->wait) {
			link_two = raw_stream(base, 2);
			bound = HYB_RELOAD_DEVICE_DEPTH;
		}
	}
	rc.backend = be;
	rc.model_path = opt.file;
	rc.chunk = opt.chunk;
	rc.dev = dev;
	r = hyb_reload_start(&rc, err, sizeof(err));
	if (!r) {
		fprintf(stderr, "bench_reload: %s\n", err);
		return 1;
	}
	if (hyb_rq_attach_client(be, QID, HYB_RQ_EVENTFD_NONE, &c))
		die("attach");
	for (int k = 0; k < 3; k++)
		idle[k] = (struct lat){ calloc((size_t)opt.n, 8), 0 };
	for (int k = 0; k < 2; k++)
		busy[k] = (struct lat){ calloc((size_t)opt.n, 8), 0 };
	if (opt.upload) {
		printf("bench_reload: a %.0f MiB pool -> %s copy device (%u slots%s); UPLOADs of %llu "
		       "KiB, chunk %llu KiB; %d per class\n", opt.size / 1048576.0, dev->name,
		       N_SLOTS, strcmp(dev->name, "cpu") ? "" : ", paced to --link-gbps",
		       (unsigned long long)(opt.bundle >> 10), (unsigned long long)(opt.chunk >> 10),
		       opt.n);
	} else {
		raw = (struct lat){ calloc((size_t)opt.n, 8), 0 };
		printf("bench_reload: %s, %.0f MiB, %s; LOADs of %llu KiB, chunk %llu KiB; %d per "
		       "class\n", opt.file, opt.size / 1048576.0, opt.warm ? "warm (page cache)" :
		       "cold (each range dropped from the page cache)",
		       (unsigned long long)(opt.bundle >> 10), (unsigned long long)(opt.chunk >> 10),
		       opt.n);
		raw_pread(&raw, &seed);
	}
	/* idle: classes interleaved, one request at a time */
	for (int i = 0; i < 5; i++)
		one(c, HYB_RQ_NORMAL, &seed);	/* warm-up */
	for (int i = 0; i < opt.n; i++)
		for (int k = 0; k < 3; k++)
			idle[k].v[idle[k].n++] = one(c, cls_prio[k], &seed);

	/* busy: the storage lane full of prefetches */
	hyb_reload_stats(r, &st0);
	printf("service side, idle: critical queued->started p50 %.1f us, started->done p50 %.1f "
	       "us p99 %.1f us\n", st0.cls[0].wait.p50_ns / 1e3, st0.cls[0].service.p50_ns / 1e3,
	       st0.cls[0].service.p99_ns / 1e3);
	pthread_create(&bg, NULL, prefetcher, NULL);
	usleep(50000);
	t_bg = now_ns();
	atomic_store(&bg_bytes, 0);
	for (int i = 0; i < opt.n; i++) {
		for (int k = 0; k < 2; k++) {
			busy[k].v[busy[k].n++] = one(c, cls_prio[k], &seed);
			usleep((useconds_t)(rnd(&seed) % (uint64_t)(opt.think_us + 1)));
		}
	}
	bg_gbs = (double)atomic_load(&bg_bytes) / (double)(now_ns() - t_bg);
	atomic_store(&stop_bg, 1);
	pthread_join(bg, NULL);
	hyb_reload_stats(r, &st1);

	const char *pre = opt.upload ? "upload" : "reload";

	printf("\nlatency queue -> data in %s, microseconds      p50       p99\n",
	       opt.upload ? "cache" : "pool");
	if (raw.n)
		printf("  floor: %s  %8.1f  %8.1f\n", opt.upload ?
		       "one upload + sync on the device alone" : "O_DIRECT pread, same size and memory",
		       pct(&raw, 0.5), pct(&raw, 0.99));
	for (int k = 0; k < 3; k++)
		printf("  idle service, %-9s                      %8.1f  %8.1f\n", cls_names[k],
		       pct(&idle[k], 0.5), pct(&idle[k], 0.99));
	for (int k = 0; k < 2; k++)
		printf("  with %d prefetches of %llu KiB in flight, %-8s %8.1f  %8.1f\n",
		       opt.inflight, (unsigned long long)(opt.prefetch >> 10), cls_names[k],
		       pct(&busy[k], 0.5), pct(&busy[k], 0.99));
	if (link_sync > 0)
		printf("  the link alone, %llu KiB chunks: %.2f GB/s with a sync per chunk, "
		       "%.2f GB/s with two in flight\n", (unsigned long long)(opt.chunk >> 10),
		       link_sync, link_two);
	printf("  prefetch throughput meanwhile: %.2f GB/s; critical waited at most %u chunk(s) "
	       "of other requests (bound: %u, the chunks in flight in its lane)\n", bg_gbs,
	       st1.cls[HYB_RELOAD_CRITICAL].max_slices_waited, bound);

	if (raw.n)
		printf("raw_%s_p50_us %.1f us\nraw_%s_p99_us %.1f us\n",
		       opt.upload ? "upload" : "pread", pct(&raw, 0.5),
		       opt.upload ? "upload" : "pread", pct(&raw, 0.99));
	for (int k = 0; k < 3; k++)
		printf("%s_idle_%s_p50_us %.1f us\n%s_idle_%s_p99_us %.1f us\n", pre,
		       cls_names[k], pct(&idle[k], 0.5), pre, cls_names[k], pct(&idle[k], 0.99));
	for (int k = 0; k < 2; k++)
		printf("%s_busy_%s_p50_us %.1f us\n%s_busy_%s_p99_us %.1f us\n", pre,
		       cls_names[k], pct(&busy[k], 0.5), pre, cls_names[k], pct(&busy[k], 0.99));
	printf("%s_busy_prefetch_gbps %.2f GB/s\n%s_critical_max_chunks_waited %u chunks\n", pre,
	       bg_gbs, pre, st1.cls[HYB_RELOAD_CRITICAL].max_slices_waited);
	printf("%s_critical_chunks_bound %u chunks\n", pre, bound);
	if (link_sync > 0)
		printf("raw_link_sync_per_chunk_gbps %.2f GB/s\n", link_sync);
	if (link_two > 0)
		printf("raw_link_two_in_flight_gbps %.2f GB/s\n", link_two);
	(void)st0;

	hyb_rq_close(c);
	hyb_reload_stop(r, NULL);
	if (dev)
		dev->ops->close(dev); /* unpins the pool first */
	hyb_mempool_close(pool);
	hyb_backend_close(be);
	if (file_fd >= 0)
		close(file_fd);
	if (made)
		unlink(path);
	if (st1.cls[HYB_RELOAD_CRITICAL].max_slices_waited > bound) {
		fprintf(stderr, "bench_reload: a critical request waited for %u chunks: above the "
			"bound of %u\n", st1.cls[HYB_RELOAD_CRITICAL].max_slices_waited, bound);
		return 1;
	}
	return 0;
}
