// SPDX-License-Identifier: MIT
/*
 * sel_scan and sel_emit (cpu_kernels.h) in plain C, every level without
 * AVX-512: stores without branches on the scores, which are as good as
 * random to a branch predictor (a third of a layer is over the threshold).
 */
#include <math.h>

#include "cpu_internal.h"

static inline bool cached(const uint64_t *res, uint32_t i)
{
	return (res[i / 64] >> (i % 64)) & 1;
}

static void sel_scan(const float *x, const uint64_t *res, uint32_t n, uint32_t *add,
		     uint32_t *abin, uint32_t *na, uint32_t *drop, uint32_t *dbin, uint32_t *nd,
		     uint32_t *ng)
{
	uint32_t a = 0, d = 0, g = 0;

	for (uint32_t i = 0; i < n; i++) {
		const float v = x[i];
		const bool r = cached(res, i), pos = v > 0;

		add[a] = i;
		abin[a] = pos ? 0 : hyb_sel_add_bin(v);
		a += r && !pos && v > -INFINITY;
		drop[d] = i;
		dbin[d] = pos ? hyb_sel_drop_bin(v) : 0;
		d += !r && pos;
		g += r && pos;
	}
	*na = a;
	*nd = d;
	*ng = g;
}

static uint32_t sel_emit(const float *x, const uint64_t *res, uint32_t n, int32_t ba,
			 uint32_t ka, int32_t bd, uint32_t kd, uint32_t *sel)
{
	uint32_t m = 0, seen_a = 0, seen_d = 0;

	for (uint32_t i = 0; i < n; i++) {
		const float v = x[i];
		const bool r = cached(res, i);
		bool take;

		if (v > 0) {
			take = true;
			if (!r) {
				const int32_t b = (int32_t)hyb_sel_drop_bin(v);

				take = !(b < bd || (b == bd && seen_d++ < kd));
			}
		} else {
			const int32_t b = r && v > -INFINITY ? (int32_t)hyb_sel_add_bin(v) : -1;

			take = b >= 0 && (b > ba || (b == ba && seen_a++ < ka));
		}
		sel[m] = i;
		m += take;
	}
	return m;
}

void hyb_fill_select_ref(struct hyb_cpu_kernels *k)
{
	k->sel_scan = sel_scan;
	k->sel_emit = sel_emit;
}
