/* SPDX-License-Identifier: MIT */
/*
 * Shared timing harness of the peak_*.c register-only loops. Each loop body
 * issues independent multiply-adds into more accumulators than latency x
 * throughput needs, so it runs at the port limit. Best of several runs, as
 * the machine may be shared; cached per kind since it takes ~50 ms.
 */
#ifndef HYB_PEAK_COMMON_H
#define HYB_PEAK_COMMON_H

#include <stdatomic.h>
#include <time.h>

#include "cpu_internal.h"

/* CPU time of this thread: time-slicing on a busy machine does not count */
static inline double peak_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* iters of body(), each doing macs_per_iter multiply-adds; best rate of 5 */
static inline double peak_measure(void (*body)(long), long iters, double macs_per_iter)
{
	double best = 0;

	body(iters / 16); /* warm up: wake the wide units, settle the clock */
	for (int rep = 0; rep < 5; rep++) {
		double t = peak_now();

		body(iters);
		t = peak_now() - t;
		if (t > 0 && iters * macs_per_iter / t > best)
			best = iters * macs_per_iter / t;
	}
	return best;
}

static inline double peak_cached(_Atomic double *cache, void (*body)(long), long iters,
				 double macs_per_iter)
{
	double v = atomic_load(cache);

	if (v <= 0) {
		v = peak_measure(body, iters, macs_per_iter);
		atomic_store(cache, v);
	}
	return v;
}

#endif
