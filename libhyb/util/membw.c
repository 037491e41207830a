// SPDX-License-Identifier: MIT
#include "hyb/membw.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "hyb/generate.h"
#include "hyb/threadpool.h"

struct bw_job {
	const uint64_t *buf;
	size_t words;
	uint64_t sink[64];
};

static void read_worker(void *arg, int ith, int nth)
{
	struct bw_job *j = arg;
	long lo, hi;
	uint64_t a = 0, b = 0, c = 0, d = 0;

	hyb_split((long)(j->words / 8), ith, nth, &lo, &hi);
	/* Eight words per step in four independent chains: the compiler
	 * vectorises this to full-width loads; DRAM, not the core, is the limit. */
	for (long i = lo * 8; i < hi * 8; i += 8) {
		a ^= j->buf[i] ^ j->buf[i + 4];
		b ^= j->buf[i + 1] ^ j->buf[i + 5];
		c ^= j->buf[i + 2] ^ j->buf[i + 6];
		d ^= j->buf[i + 3] ^ j->buf[i + 7];
	}
	j->sink[ith % 64] = a ^ b ^ c ^ d;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

double hyb_measure_read_bw(int n_threads, size_t bytes, int reps)
{
	struct hyb_threadpool *pool = hyb_threadpool_new(n_threads);
	struct bw_job j = { 0 };
	double *t = calloc(reps > 0 ? reps : 1, sizeof(double)), med;
	void *buf;

	if (!pool || !t) {
		hyb_threadpool_free(pool);
		free(t);
		return -1;
	}
	buf = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED) {
		hyb_threadpool_free(pool);
		free(t);
		return -1;
	}
	madvise(buf, bytes, MADV_HUGEPAGE);
	memset(buf, 1, bytes); /* fault every page in before timing */
	j.buf = buf;
	j.words = bytes / 8;
	hyb_threadpool_run(pool, read_worker, &j); /* warm-up */
	for (int r = 0; r < reps; r++) {
		double t0 = hyb_now();

		hyb_threadpool_run(pool, read_worker, &j);
		t[r] = hyb_now() - t0;
	}
	qsort(t, reps, sizeof(double), cmp_double);
	med = t[reps / 2];
	munmap(buf, bytes);
	hyb_threadpool_free(pool);
	free(t);
	return (double)(j.words / 8 * 64) / med;
}
