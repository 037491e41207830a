// SPDX-License-Identifier: MIT
/* Log-linear latency histograms (see lat_hist.h for the bucket scheme). */
#include <string.h>

#include "lat_hist.h"

#define SUB (1U << HYB_LAT_SUB_BITS)

/* Bucket of a value: the power of two it falls in, then its top SUB_BITS below the leading one. */
static unsigned int hyb_lat_index(uint64_t ns)
{
	unsigned int top;

	if (ns < SUB)
		return (unsigned int)ns;
	if (ns >= 1ULL << HYB_LAT_MAX_SHIFT)
		ns = (1ULL << HYB_LAT_MAX_SHIFT) - 1;
	top = 63 - (unsigned int)__builtin_clzll(ns);
	return ((top - HYB_LAT_SUB_BITS + 1) << HYB_LAT_SUB_BITS) |
	       (unsigned int)((ns >> (top - HYB_LAT_SUB_BITS)) & (SUB - 1));
}

static uint64_t hyb_lat_bucket_low(unsigned int idx)
{
	unsigned int top;

	if (idx < SUB)
		return idx;
	top = (idx >> HYB_LAT_SUB_BITS) + HYB_LAT_SUB_BITS - 1;
	return (1ULL << top) | ((uint64_t)(idx & (SUB - 1)) << (top - HYB_LAT_SUB_BITS));
}

static uint64_t hyb_lat_bucket_mid(unsigned int idx)
{
	unsigned int top;

	if (idx < SUB)
		return idx;
	top = (idx >> HYB_LAT_SUB_BITS) + HYB_LAT_SUB_BITS - 1;
	return hyb_lat_bucket_low(idx) + ((1ULL << (top - HYB_LAT_SUB_BITS)) >> 1);
}

void hyb_lat_add(struct hyb_lat_hist *h, uint64_t ns)
{
	if (!h->count || ns < h->min)
		h->min = ns;
	if (ns > h->max)
		h->max = ns;
	h->count++;
	h->sum += ns;
	h->bucket[hyb_lat_index(ns)]++;
}

void hyb_lat_summary(const struct hyb_lat_hist *h, struct hyb_lat_stat *out)
{
	/* p50 p90 p99 p99.9, as parts per 10000 (integers, like the module). */
	static const uint64_t q[4] = { 5000, 9000, 9900, 9990 };
	uint64_t *dst[4] = { &out->p50_ns, &out->p90_ns, &out->p99_ns, &out->p999_ns };
	uint64_t cum = 0, v;
	unsigned int i, k = 0;

	memset(out, 0, sizeof(*out));
	out->count = h->count;
	out->sum_ns = h->sum;
	out->min_ns = h->min;
	out->max_ns = h->max;
	if (!h->count)
		return;
	for (i = 0; i < HYB_LAT_BUCKETS && k < 4; i++) {
		cum += h->bucket[i];
		while (k < 4 && cum * 10000 >= q[k] * h->count) {
			v = hyb_lat_bucket_mid(i);
			*dst[k++] = v < h->min ? h->min : v > h->max ? h->max : v;
		}
	}
}
