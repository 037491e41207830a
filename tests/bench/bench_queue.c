// SPDX-License-Identifier: MIT
/*
 * bench_queue: the reload queue's round trip (app submit -> daemon wakes on
 * its eventfd -> fetch -> complete -> app wakes from its blocking reap) and
 * pool creation, through hyb/pool.h on either backend.
 *
 *   bench_queue [--backend local|kmod] [-n ROUND_TRIPS] [--pool-mib MIB] [--node N]
 *               [--shared]   (the pool with HYB_MEMPOOL_SHARED)
 *
 * The daemon is a thread of this process (with the module it could be any
 * process; the kernel path is the same). Prints one "name value unit" line
 * per figure, after a readable summary.
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "hyb/pool.h"

#define QID 7

static struct hyb_backend *be;
static atomic_int attached, stop;

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static void *daemon_main(void *arg)
{
	struct hyb_rq_req f[64];
	struct hyb_rq_done d[64];
	struct hyb_rq *rq;
	int n;

	(void)arg;
	if (hyb_rq_attach_daemon(be, QID, HYB_RQ_EVENTFD_NEW, &rq)) {
		fprintf(stderr, "bench_queue: %s\n", hyb_last_error());
		atomic_store(&attached, -1);
		return NULL;
	}
	atomic_store(&attached, 1);
	while (!atomic_load(&stop)) {
		if (hyb_rq_wait_work(rq, 50000000) < 0)
			break;
		while ((n = hyb_rq_fetch(rq, f, 64)) > 0) {
			for (int i = 0; i < n; i++) {
				d[i].id = f[i].id;
				d[i].status = 0;
				d[i].reserved = 0;
			}
			hyb_rq_complete(rq, d, (unsigned int)n);
		}
	}
	hyb_rq_close(rq);
	return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static int bench_rtt(int n)
{
	struct hyb_rq_req r;
	struct hyb_rq_cqe e;
	struct hyb_rq_stats st;
	struct hyb_rq *c;
	pthread_t t;
	uint64_t *lat = calloc((size_t)n, sizeof(*lat)), t0;
	int warm = n / 10 + 1;

	if (!lat || pthread_create(&t, NULL, daemon_main, NULL))
		return -1;
	while (!atomic_load(&attached))
		;
	if (atomic_load(&attached) < 0 ||
	    hyb_rq_attach_client(be, QID, HYB_RQ_EVENTFD_NONE, &c)) {
		fprintf(stderr, "bench_queue: %s\n", hyb_last_error());
		return -1;
	}
	memset(&r, 0, sizeof(r));
	r.op = HYB_RQ_NOP;
	r.prio = HYB_RQ_CRITICAL;
	for (int i = -warm; i < n; i++) {
		r.tag = (uint64_t)i;
		t0 = now_ns();
		if (hyb_rq_submit(c, &r, 1) || hyb_rq_reap(c, &e, 1, 1, 10000000000ULL) != 1) {
			fprintf(stderr, "bench_queue: round trip %d: %s\n", i, hyb_last_error());
			return -1;
		}
		if (i >= 0)
			lat[i] = now_ns() - t0;
	}
	hyb_rq_stats(be, QID, &st);
	atomic_store(&stop, 1);
	pthread_join(t, NULL);
	hyb_rq_close(c);
	qsort(lat, (size_t)n, sizeof(*lat), cmp_u64);
	printf("round trip (submit -> daemon wake -> complete -> app wake), %d trips:\n"
	       "  measured by the app: p50 %.1f us, p99 %.1f us, max %.1f us\n"
	       "  queue statistics:    stall p50 %.1f us p99 %.1f us (%llu stalls), queue wait "
	       "p50 %.1f us p99 %.1f us\n", n, lat[n / 2] / 1e3, lat[n * 99 / 100] / 1e3,
	       lat[n - 1] / 1e3, st.stall.p50_ns / 1e3, st.stall.p99_ns / 1e3,
	       (unsigned long long)st.stalls, st.queue_wait.p50_ns / 1e3,
	       st.queue_wait.p99_ns / 1e3);
	printf("queue_rtt_p50_us %.1f us\nqueue_rtt_p99_us %.1f us\nqueue_stall_p50_us %.1f us\n"
	       "queue_stall_p99_us %.1f us\n", lat[n / 2] / 1e3, lat[n * 99 / 100] / 1e3,
	       st.stall.p50_ns / 1e3, st.stall.p99_ns / 1e3);
	free(lat);
	return 0;
}

static int bench_create(uint64_t mib, int node, unsigned int flags)
{
	struct hyb_mempool_info pi;
	struct hyb_mempool *p;
	struct rusage r0, r1;
	volatile const char *a;
	uint64_t t0, t1, t2, sum = 0;
	size_t len;
	double gib = mib / 1024.0, read_s;
	char back[64] = "";

	t0 = now_ns();
	if (hyb_mempool_create(be, "bench-create", mib << 20, node, 0, flags, &p)) {
		fprintf(stderr, "bench_queue: %s\n", hyb_last_error());
		return -1;
	}
	t1 = now_ns();
	hyb_mempool_info(p, &pi);
	if (hyb_mempool_map(p, (void **)&a, &len)) {
		fprintf(stderr, "bench_queue: %s\n", hyb_last_error());
		return -1;
	}
	/* After map nothing may fault: one read per 4 KiB page, faults counted. */
	getrusage(RUSAGE_SELF, &r0);
	t2 = now_ns();
	for (size_t off = 0; off < len; off += 4096)
		sum += a[off];
	read_s = (now_ns() - t2) / 1e9;
	getrusage(RUSAGE_SELF, &r1);
	snprintf(back, sizeof(back), "%s%s%s%s%s",
		 pi.flags & HYB_MEMPOOL_F_KERNEL ? " kernel" : "",
		 pi.flags & HYB_MEMPOOL_F_HUGETLB ? " hugetlb" : "",
		 pi.flags & HYB_MEMPOOL_F_THP ? " thp" : "",
		 pi.flags & HYB_MEMPOOL_F_LOCKED ? " locked" : "",
		 pi.flags & HYB_MEMPOOL_F_SHARED ? " shared" : "");
	printf("pool of %llu MiB on node %d (%s ): create %.1f ms (%.1f ms in the backend) = "
	       "%.0f ms/GiB; %.0f%% in huge pages\n"
	       "  after map: %ld page faults touching every 4 KiB page (%.2f ms)%s\n",
	       (unsigned long long)mib, pi.node, back, (t1 - t0) / 1e6, pi.create_ns / 1e6,
	       pi.create_ns / 1e6 / gib, 100.0 * pi.huge_bytes / pi.bytes,
	       r1.ru_minflt - r0.ru_minflt, read_s * 1e3, sum ? " (not zero!)" : "");
	printf("pool_create_ms_per_gib %.1f ms\npool_huge_percent %.0f %%\n"
	       "pool_faults_after_map %ld faults\n", pi.create_ns / 1e6 / gib,
	       100.0 * pi.huge_bytes / pi.bytes, r1.ru_minflt - r0.ru_minflt);
	hyb_mempool_close(p);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "backend", 1, 0, 'b' }, { "pool-mib", 1, 0, 'm' }, { "node", 1, 0, 'N' },
		{ "shared", 0, 0, 's' }, { "help", 0, 0, 'h' }, { 0, 0, 0, 0 },
	};
	unsigned int flags = 0;
	enum hyb_backend_kind kind = HYB_BACKEND_LOCAL;
	uint64_t mib = 1024;
	int c, n = 20000, node = HYB_MEMPOOL_NODE_LOCAL, ret;

	while ((c = getopt_long(argc, argv, "n:h", opts, NULL)) != -1) {
		switch (c) {
		case 'b':
			kind = !strcmp(optarg, "kmod") ? HYB_BACKEND_KMOD : HYB_BACKEND_LOCAL;
			break;
		case 'n': n = atoi(optarg); break;
		case 'm': mib = strtoull(optarg, NULL, 10); break;
		case 'N': node = atoi(optarg); break;
		case 's': flags = HYB_MEMPOOL_SHARED; break;
		default:
			fprintf(stderr, "usage: bench_queue [--backend local|kmod] [-n TRIPS] "
				"[--pool-mib MIB] [--node N] [--shared]\n");
			return c == 'h' ? 0 : 2;
		}
	}
	if (n < 10 || !mib) {
		fprintf(stderr, "bench_queue: -n must be >= 10 and --pool-mib > 0\n");
		return 2;
	}
	be = hyb_backend_open(kind);
	if (!be) {
		fprintf(stderr, "bench_queue: %s\n", hyb_last_error());
		return 1;
	}
	printf("bench_queue: backend %s\n", hyb_backend_name(hyb_backend_kind(be)));
	ret = bench_rtt(n) || bench_create(mib, node, flags);
	hyb_backend_close(be);
	return ret ? 1 : 0;
}
