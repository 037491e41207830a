// SPDX-License-Identifier: MIT
/*
 * sel_scan and sel_emit (cpu_kernels.h) with AVX-512F: sixteen scores a
 * step, the candidates' indices and bins compressed and stored.
 * A step with lanes in a boundary bin (ba, bd: the greedy took part of
 * it, the first by index) settles those lanes one by one; that is a few
 * steps a layer.
 */
#include <immintrin.h>
#include <math.h>

#include "cpu_internal.h"

/*
 * Compress into a register, then a masked store: a compress straight to
 * memory is microcoded on Zen 4 (tens of cycles) and took 90% of the time.
 */
static inline uint32_t put(uint32_t *dst, __mmask16 m, __m512i v)
{
	const uint32_t c = (uint32_t)__builtin_popcount(m);

	_mm512_mask_storeu_epi32(dst, (__mmask16)((1u << c) - 1), _mm512_maskz_compress_epi32(m, v));
	return c;
}

/* The 16 cache bits of neurons i .. i + 15 (i a multiple of 16). */
static inline __mmask16 cached16(const uint64_t *res, uint32_t i)
{
	return (__mmask16)(res[i / 64] >> (i % 64));
}

static inline __m512i add_bins(__m512 v)
{
	const __m512 t = _mm512_mul_ps(_mm512_add_ps(v, _mm512_set1_ps(HYB_SEL_RANGE)),
				       _mm512_set1_ps(HYB_SEL_BINS / HYB_SEL_RANGE));
	const __m512i b = _mm512_cvttps_epi32(_mm512_min_ps(_mm512_max_ps(t, _mm512_set1_ps(0)),
							    _mm512_set1_ps(HYB_SEL_BINS)));

	/* t < 1: 0 (t >= 0 truncates there); t >= BINS - 1: BINS - 1 */
	return _mm512_min_epi32(b, _mm512_set1_epi32(HYB_SEL_BINS - 1));
}

static inline __m512i drop_bins(__m512 v)
{
	const __m512 t = _mm512_mul_ps(v, _mm512_set1_ps(HYB_SEL_BINS / HYB_SEL_RANGE));
	const __m512i b = _mm512_cvttps_epi32(_mm512_min_ps(t, _mm512_set1_ps(HYB_SEL_BINS)));

	return _mm512_min_epi32(b, _mm512_set1_epi32(HYB_SEL_BINS - 1));
}

/*
 * Scores i .. i + 15 (fewer at the end: lanes past n are none of these) and
 * their masks: over the threshold, cached, add and drop candidates.
 */
struct lanes {
	__m512 v;
	__mmask16 pos, r, ma, md;
};

static inline struct lanes lanes16(const float *x, const uint64_t *res, uint32_t n, uint32_t i)
{
	const __mmask16 in = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
	struct lanes q;
	__mmask16 fin;

	q.v = _mm512_maskz_loadu_ps(in, x + i);
	q.r = cached16(res, i) & in;
	q.pos = _mm512_mask_cmp_ps_mask(in, q.v, _mm512_setzero_ps(), _CMP_GT_OQ);
	fin = _mm512_mask_cmp_ps_mask(in, q.v, _mm512_set1_ps(-INFINITY), _CMP_GT_OQ);
	q.ma = q.r & ~q.pos & fin;
	q.md = ~q.r & q.pos;
	return q;
}

static void sel_scan(const float *x, const uint64_t *res, uint32_t n, uint32_t *add,
		     uint32_t *abin, uint32_t *na, uint32_t *drop, uint32_t *dbin, uint32_t *nd,
		     uint32_t *ng)
{
	const __m512i step = _mm512_set1_epi32(16);
	__m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
	uint32_t a = 0, d = 0, g = 0;

	for (uint32_t i = 0; i < n; i += 16) {
		const struct lanes q = lanes16(x, res, n, i);
		const __m512 v = q.v;
		const __mmask16 ma = q.ma, md = q.md;

		if (ma) {
			put(abin + a, ma, add_bins(v));
			a += put(add + a, ma, idx);
		}
		if (md) {
			put(dbin + d, md, drop_bins(v));
			d += put(drop + d, md, idx);
		}
		g += (uint32_t)__builtin_popcount(q.r & q.pos);
		idx = _mm512_add_epi32(idx, step);
	}
	*na = a;
	*nd = d;
	*ng = g;
}

static uint32_t sel_emit(const float *x, const uint64_t *res, uint32_t n, int32_t ba,
			 uint32_t ka, int32_t bd, uint32_t kd, uint32_t *sel)
{
	const __m512i step = _mm512_set1_epi32(16);
	const __m512i vba = _mm512_set1_epi32(ba), vbd = _mm512_set1_epi32(bd);
	__m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
	uint32_t m = 0, seen_a = 0, seen_d = 0;

	for (uint32_t i = 0; i < n; i += 16) {
		const struct lanes q = lanes16(x, res, n, i);
		const __m512 v = q.v;
		const __mmask16 ma = q.ma, md = q.md;
		__mmask16 keep = q.pos & ~md;

		if (ma) {
			const __m512i b = add_bins(v);
			__mmask16 tie = _mm512_mask_cmpeq_epi32_mask(ma, b, vba);

			keep |= _mm512_mask_cmpgt_epi32_mask(ma, b, vba);
			for (; tie; tie &= (__mmask16)(tie - 1))
				if (seen_a++ < ka)
					keep |= tie & (__mmask16)-tie;
		}
		if (md) {
			const __m512i b = drop_bins(v);
			__mmask16 tie = _mm512_mask_cmpeq_epi32_mask(md, b, vbd);

			/* kept: over the drop bin, and the ties past the first kd */
			keep |= _mm512_mask_cmpgt_epi32_mask(md, b, vbd);
			for (; tie; tie &= (__mmask16)(tie - 1))
				if (!(seen_d++ < kd))
					keep |= tie & (__mmask16)-tie;
		}
		m += put(sel + m, keep, idx);
		idx = _mm512_add_epi32(idx, step);
	}
	return m;
}

void hyb_fill_select_avx512(struct hyb_cpu_kernels *k)
{
	k->sel_scan = sel_scan;
	k->sel_emit = sel_emit;
}
