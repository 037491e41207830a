// SPDX-License-Identifier: GPL-2.0
/*
 * Latency histograms in integer arithmetic (no FPU in the kernel): values in
 * ns fall into log-linear buckets, 2^HYB_HIST_SUB_BITS buckets per power of
 * two, exact below 2^HYB_HIST_SUB_BITS and capped at 2^HYB_HIST_MAX_SHIFT
 * (~18 minutes). A bucket spans at most 1/8 of its lower bound, so a
 * percentile reported at the bucket midpoint is within ~6% of the truth.
 */
#include <linux/bitops.h>
#include <linux/minmax.h>
#include <linux/string.h>

#include "hybpool.h"

#define SUB		(1U << HYB_HIST_SUB_BITS)

static unsigned int hyb_hist_index(u64 v)
{
	unsigned int m;

	if (v < SUB)
		return v;
	v = min_t(u64, v, (1ULL << HYB_HIST_MAX_SHIFT) - 1);
	m = fls64(v) - 1;	/* HYB_HIST_SUB_BITS .. HYB_HIST_MAX_SHIFT - 1 */
	return ((m - HYB_HIST_SUB_BITS + 1) << HYB_HIST_SUB_BITS) |
	       ((v >> (m - HYB_HIST_SUB_BITS)) & (SUB - 1));
}

u64 hyb_hist_bucket_low(unsigned int idx)
{
	unsigned int m;

	if (idx < SUB)
		return idx;
	m = (idx >> HYB_HIST_SUB_BITS) + HYB_HIST_SUB_BITS - 1;
	return (1ULL << m) | ((u64)(idx & (SUB - 1)) << (m - HYB_HIST_SUB_BITS));
}

static u64 hyb_hist_bucket_mid(unsigned int idx)
{
	unsigned int m;

	if (idx < SUB)
		return idx;
	m = (idx >> HYB_HIST_SUB_BITS) + HYB_HIST_SUB_BITS - 1;
	return hyb_hist_bucket_low(idx) + (1ULL << (m - HYB_HIST_SUB_BITS)) / 2;
}

void hyb_hist_add(struct hyb_hist *h, u64 ns)
{
	if (!h->count || ns < h->min)
		h->min = ns;
	if (ns > h->max)
		h->max = ns;
	h->count++;
	h->sum += ns;
	h->bucket[hyb_hist_index(ns)]++;
}

void hyb_hist_summary(const struct hyb_hist *h, struct hyb_hist_stat *out)
{
	/* Quantiles in units of 1/10000. */
	static const u32 q[] = { 5000, 9000, 9900, 9990 };
	u64 *dst[] = { &out->p50_ns, &out->p90_ns, &out->p99_ns, &out->p999_ns };
	unsigned int i, k = 0;
	u64 cum = 0;

	memset(out, 0, sizeof(*out));
	out->count = h->count;
	out->sum_ns = h->sum;
	out->min_ns = h->min;
	out->max_ns = h->max;
	if (!h->count)
		return;
	for (i = 0; i < HYB_HIST_BUCKETS && k < ARRAY_SIZE(q); i++) {
		cum += h->bucket[i];
		while (k < ARRAY_SIZE(q) && cum * 10000 >= (u64)q[k] * h->count) {
			*dst[k] = clamp_t(u64, hyb_hist_bucket_mid(i), h->min, h->max);
			k++;
		}
	}
}
