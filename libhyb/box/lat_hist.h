/* SPDX-License-Identifier: MIT */
/*
 * Latency histograms for the local reload queue, with the bucket scheme of
 * hybpool.ko (kmod/hist.c) so both backends report the same percentiles:
 * log-linear buckets, 2^HYB_LAT_SUB_BITS per power of two (exact below that),
 * values capped at 2^HYB_LAT_MAX_SHIFT ns. A bucket spans at most 1/8 of its
 * lower bound, so a percentile taken at the bucket midpoint is within ~6%.
 * Written afresh for userspace; no kernel code is shared.
 */
#ifndef HYB_LAT_HIST_H
#define HYB_LAT_HIST_H

#include <stdint.h>

#include "hyb/pool.h"

#define HYB_LAT_SUB_BITS	3
#define HYB_LAT_MAX_SHIFT	40
#define HYB_LAT_BUCKETS		((HYB_LAT_MAX_SHIFT - HYB_LAT_SUB_BITS + 1) << HYB_LAT_SUB_BITS)

struct hyb_lat_hist {
	uint64_t count;
	uint64_t sum;
	uint64_t min;
	uint64_t max;
	uint64_t bucket[HYB_LAT_BUCKETS];
};

void hyb_lat_add(struct hyb_lat_hist *h, uint64_t ns);
void hyb_lat_summary(const struct hyb_lat_hist *h, struct hyb_lat_stat *out);

#endif
