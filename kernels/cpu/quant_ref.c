// SPDX-License-Identifier: MIT
/*
 * Reference weight quantizers, bit-identical to llama.cpp's
 * quantize_row_*_ref (ggml-quants.c). Bit-identity depends on doing the
 * same float operations in the same order: every expression below keeps
 * llama.cpp's evaluation order, and this file is compiled without FMA, as
 * ggml-base is, so nothing gets contracted.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "cpu_internal.h"
#include "quant_common.h"

static void quantize_q4_0(const float *x, struct hyb_block_q4_0 *y, int64_t n)
{
	for (int64_t i = 0; i < n / HYB_QK4_0; i++, x += HYB_QK4_0) {
		float amax = 0.0f, max = 0.0f;

		for (int j = 0; j < HYB_QK4_0; j++) {
			if (amax < fabsf(x[j])) {
				amax = fabsf(x[j]);
				max = x[j];
			}
		}
		const float d = max / -8;
		const float id = d ? 1.0f / d : 0.0f;

		y[i].d = hyb_f32_to_f16(d);
		for (int j = 0; j < HYB_QK4_0 / 2; j++) {
			const float x0 = x[j] * id;
			const float x1 = x[HYB_QK4_0 / 2 + j] * id;
			/* truncation toward zero, as llama.cpp's (int8_t) cast */
			const int xi0 = imin(15, (int8_t)(x0 + 8.5f));
			const int xi1 = imin(15, (int8_t)(x1 + 8.5f));

			y[i].qs[j] = (uint8_t)(xi0 | (xi1 << 4));
		}
	}
}

/* quantize_row_q4_1_ref: 16 levels from the block's min to its max */
static void quantize_q4_1(const float *x, struct hyb_block_q4_1 *y, int64_t n)
{
	for (int64_t i = 0; i < n / HYB_QK4_0; i++, x += HYB_QK4_0) {
		float min = FLT_MAX, max = -FLT_MAX;

		for (int j = 0; j < HYB_QK4_0; j++) {
			if (x[j] < min)
				min = x[j];
			if (x[j] > max)
				max = x[j];
		}
		const float d = (max - min) / ((1 << 4) - 1);
		const float id = d ? 1.0f / d : 0.0f;

		y[i].d = hyb_f32_to_f16(d);
		y[i].m = hyb_f32_to_f16(min);
		for (int j = 0; j < HYB_QK4_0 / 2; j++) {
			const float x0 = (x[j] - min) * id;
			const float x1 = (x[HYB_QK4_0 / 2 + j] - min) * id;
			const int xi0 = imin(15, (int8_t)(x0 + 0.5f));
			const int xi1 = imin(15, (int8_t)(x1 + 0.5f));

			y[i].qs[j] = (uint8_t)(xi0 | (xi1 << 4));
		}
	}
}

/* element j's 5-bit quant q into a Q5 block's nibbles and high bits, j in order */
static inline void q5_put(uint8_t *qs, uint32_t *qh, int j, unsigned q)
{
	if (j < 16)
		qs[j] = (uint8_t)(q & 0xF);
	else
		qs[j - 16] = (uint8_t)((qs[j - 16] & 0x0F) | ((q & 0xF) << 4));
	*qh |= ((q & 0x10u) >> 4) << j;
}

/* quantize_row_q5_0_ref: as Q4_0 with 32 levels */
static void quantize_q5_0(const float *x, struct hyb_block_q5_0 *y, int64_t n)
{
	for (int64_t i = 0; i < n / HYB_QK4_0; i++, x += HYB_QK4_0) {
		float amax = 0.0f, max = 0.0f;
		uint32_t qh = 0;

		for (int j = 0; j < HYB_QK4_0; j++) {
			if (amax < fabsf(x[j])) {
				amax = fabsf(x[j]);
				max = x[j];
			}
		}
		const float d = max / -16;
		const float id = d ? 1.0f / d : 0.0f;

		y[i].d = hyb_f32_to_f16(d);
		for (int j = 0; j < HYB_QK4_0; j++)
			q5_put(y[i].qs, &qh, j, (unsigned)imin(31, (int8_t)(x[j] * id + 16.5f)));
		memcpy(y[i].qh, &qh, 4);
	}
}

/* quantize_row_q5_1_ref: as Q4_1 with 32 levels (and no clamp, as there) */
static void quantize_q5_1(const float *x, struct hyb_block_q5_1 *y, int64_t n)
{
	for (int64_t i = 0; i < n / HYB_QK4_0; i++, x += HYB_QK4_0) {
		float min = FLT_MAX, max = -FLT_MAX;
		uint32_t qh = 0;

		for (int j = 0; j < HYB_QK4_0; j++) {
			if (x[j] < min)
				min = x[j];
			if (x[j] > max)
				max = x[j];
		}
		const float d = (max - min) / ((1 << 5) - 1);
		const float id = d ? 1.0f / d : 0.0f;

		y[i].d = hyb_f32_to_f16(d);
		y[i].m = hyb_f32_to_f16(min);
		for (int j = 0; j < HYB_QK4_0; j++)
			q5_put(y[i].qs, &qh, j, (uint8_t)((x[j] - min) * id + 0.5f));
		memcpy(y[i].qh, &qh, 4);
	}
}

/* best_index_int8: the level of `val` (ascending) nearest x, the lower on ties */
int hyb_best_index_int8(int n, const int8_t *val, float x)
{
	int ml = 0, mu = n - 1;

	if (x <= val[0])
		return 0;
	if (x >= val[n - 1])
		return n - 1;
	while (mu - ml > 1) {
		const int mav = (ml + mu) / 2;

		if (x < val[mav])
			mu = mav;
		else
			ml = mav;
	}
	return x - val[mu - 1] < val[mu] - x ? mu - 1 : mu;
}

/*
 * quantize_row_iq4_nl_ref = quantize_row_iq4_nl_impl(32, 32, ..., no
 * importance, ntry -1): the levels nearest x / (max / -127), max the
 * extreme value, then the least-squares scale for them (weights x^2); no
 * trial scales. A block with max |x| < 1e-15 gets scale 0 and, as there,
 * the previous block's levels (L lives across the row's blocks; zeros
 * before the first).
 */
/*
 * ggml-quants.c quantize_row_mxfp4_ref: the scale is the power of two that
 * puts the largest magnitude among the top levels (floor(log2 amax) - 2),
 * each element the level nearest it (the first of equals).
 */
static void quantize_mxfp4(const float *x, struct hyb_block_mxfp4 *y, int64_t n)
{
	for (int64_t i = 0; i < n / HYB_QK4_0; i++, x += HYB_QK4_0) {
		float amax = 0;

		for (int j = 0; j < HYB_QK4_0; j++)
			if (amax < fabsf(x[j]))
				amax = fabsf(x[j]);
		const uint8_t e = amax > 0 ? (uint8_t)(floorf(log2f(amax)) - 2 + 127) : 0;
		const float d = hyb_e8m0_half(e);

		y[i].e = e;
		for (int j = 0; j < HYB_QK4_0 / 2; j++) {
			uint8_t q[2];

			for (int h = 0; h < 2; h++) {
				const float v = x[j + h * HYB_QK4_0 / 2];
				float best = fabsf(hyb_kvalues_mxfp4[0] * d - v);

				q[h] = 0;
				for (uint8_t l = 1; l < 16; l++) {
					const float err = fabsf(hyb_kvalues_mxfp4[l] * d - v);

					if (err < best) {
						best = err;
						q[h] = l;
					}
				}
			}
			y[i].qs[j] = (uint8_t)(q[0] | q[1] << 4);
		}
	}
}

static void quantize_iq4_nl(const float *x, struct hyb_block_iq4_nl *y, int64_t n)
{
	const int8_t *values = hyb_kvalues_iq4nl;
	uint8_t L[HYB_QK4_0] = { 0 };

	for (int64_t i = 0; i < n / HYB_QK4_0; i++, x += HYB_QK4_0) {
		float amax = 0, max = 0, d = 0;

		for (int j = 0; j < HYB_QK4_0; j++) {
			if (fabsf(x[j]) > amax) {
				amax = fabsf(x[j]);
				max = x[j];
			}
		}
		if (amax >= GROUP_MAX_EPS) {
			const float id = 1 / (max / values[0]);
			float sumqx = 0, sumq2 = 0;

			for (int j = 0; j < HYB_QK4_0; j++) {
				const int l = hyb_best_index_int8(16, values, id * x[j]);
				const float q = values[l];
				const float w = x[j] * x[j];

				L[j] = (uint8_t)l;
				sumqx += w * q * x[j];
				sumq2 += w * q * q;
			}
			d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
		}
		y[i].d = hyb_f32_to_f16(d);
		for (int j = 0; j < HYB_QK4_0 / 2; j++)
			y[i].qs[j] = (uint8_t)(L[j] | (L[j + 16] << 4));
	}
}

static void quantize_q8_0(const float *x, struct hyb_block_q8_0 *y, int64_t n)
{
	for (int64_t i = 0; i < n / HYB_QK8_0; i++, x += HYB_QK8_0) {
		float amax = 0.0f;

		for (int j = 0; j < HYB_QK8_0; j++)
			amax = amax > fabsf(x[j]) ? amax : fabsf(x[j]);
		const float d = amax / ((1 << 7) - 1);
		const float id = d ? 1.0f / d : 0.0f;

		y[i].d = hyb_f32_to_f16(d);
		for (int j = 0; j < HYB_QK8_0; j++)
			y[i].qs[j] = (int8_t)roundf(x[j] * id);
	}
}

/*
 * Weighted search for scale and min of a sub-block with levels 0..nmax
 * (llama.cpp's make_qkx2_quants): start from the min/max fit, then try
 * nstep+1 perturbed inverse scales and keep the least weighted error of a
 * least-squares (scale, min) refit. Returns the scale, -min in *the_min.
 */
static float make_qkx2_quants(int n, int nmax, const float *x, const float *weights,
			      uint8_t *L, float *the_min, uint8_t *Laux, float rmin,
			      float rdelta, int nstep, int use_mad)
{
	float min = x[0], max = x[0];
	float sum_w = weights[0];
	float sum_x = sum_w * x[0];

	for (int i = 1; i < n; i++) {
		if (x[i] < min)
			min = x[i];
		if (x[i] > max)
			max = x[i];
		float w = weights[i];

		sum_w += w;
		sum_x += w * x[i];
	}
	if (min > 0)
		min = 0;
	if (max == min) {
		for (int i = 0; i < n; i++)
			L[i] = 0;
		*the_min = -min;
		return 0.f;
	}
	float iscale = nmax / (max - min);
	float scale = 1 / iscale;
	float best_error = 0;

	for (int i = 0; i < n; i++) {
		int l = nearest_int(iscale * (x[i] - min));

		L[i] = (uint8_t)imax(0, imin(nmax, l));
		float diff = scale * L[i] + min - x[i];

		diff = use_mad ? fabsf(diff) : diff * diff;
		best_error += weights[i] * diff;
	}
	if (nstep < 1) {
		*the_min = -min;
		return scale;
	}
	for (int is = 0; is <= nstep; is++) {
		iscale = (rmin + rdelta * is + nmax) / (max - min);
		float sum_l = 0, sum_l2 = 0, sum_xl = 0;

		for (int i = 0; i < n; i++) {
			int l = nearest_int(iscale * (x[i] - min));

			l = imax(0, imin(nmax, l));
			Laux[i] = (uint8_t)l;
			float w = weights[i];

			sum_l += w * l;
			sum_l2 += w * l * l;
			sum_xl += w * l * x[i];
		}
		float D = sum_w * sum_l2 - sum_l * sum_l;

		if (D > 0) {
			float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
			float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;

			if (this_min > 0) {
				this_min = 0;
				this_scale = sum_xl / sum_l2;
			}
			float cur_error = 0;

			for (int i = 0; i < n; i++) {
				float diff = this_scale * Laux[i] + this_min - x[i];

				diff = use_mad ? fabsf(diff) : diff * diff;
				cur_error += weights[i] * diff;
			}
			if (cur_error < best_error) {
				memcpy(L, Laux, (size_t)n);
				best_error = cur_error;
				scale = this_scale;
				min = this_min;
			}
		}
	}
	*the_min = -min;
	return scale;
}

/*
 * Symmetric levels -nmax..nmax-1 (llama.cpp's make_qx_quants without
 * importance weights): fit by the signed absolute maximum, then refine with
 * 18 perturbed inverse scales under the weighted least-squares criterion.
 * L gets level + nmax.
 */
static float make_qx_quants(int n, int nmax, const float *x, int8_t *L, int rmse_type)
{
	float max = 0, amax = 0;

	for (int i = 0; i < n; i++) {
		float ax = fabsf(x[i]);

		if (ax > amax) {
			amax = ax;
			max = x[i];
		}
	}
	if (amax < GROUP_MAX_EPS) {
		for (int i = 0; i < n; i++)
			L[i] = 0;
		return 0.f;
	}
	float iscale = -nmax / max;

	if (rmse_type == 0) {
		for (int i = 0; i < n; i++) {
			int l = nearest_int(iscale * x[i]);

			L[i] = (int8_t)(nmax + imax(-nmax, imin(nmax - 1, l)));
		}
		return 1 / iscale;
	}
	int return_early = 0;

	if (rmse_type < 0) {
		rmse_type = -rmse_type;
		return_early = 1;
	}
	/* weight of an element: x^2, 1, |x| or sqrt|x| by rmse_type 1..4 */
#define QX_WEIGHT(v) (rmse_type == 1 ? (v) * (v) : rmse_type == 2 ? 1 : \
		      rmse_type == 3 ? fabsf(v) : sqrtf(fabsf(v)))
	float sumlx = 0, suml2 = 0;

	for (int i = 0; i < n; i++) {
		int l = nearest_int(iscale * x[i]);

		l = imax(-nmax, imin(nmax - 1, l));
		L[i] = (int8_t)(l + nmax);
		float w = QX_WEIGHT(x[i]);

		sumlx += w * x[i] * l;
		suml2 += w * l * l;
	}
	float scale = suml2 ? sumlx / suml2 : 0.0f;

	if (return_early)
		return suml2 > 0 ? 0.5f * (scale + 1 / iscale) : 1 / iscale;
	float best = scale * sumlx;

	for (int is = -9; is <= 9; is++) {
		if (is == 0)
			continue;
		iscale = -(nmax + 0.1f * is) / max;
		sumlx = suml2 = 0;
		for (int i = 0; i < n; i++) {
			int l = nearest_int(iscale * x[i]);

			l = imax(-nmax, imin(nmax - 1, l));
			float w = QX_WEIGHT(x[i]);

			sumlx += w * x[i] * l;
			suml2 += w * l * l;
		}
		if (suml2 > 0 && sumlx * sumlx > best * suml2) {
			for (int i = 0; i < n; i++) {
				int l = nearest_int(iscale * x[i]);

				L[i] = (int8_t)(nmax + imax(-nmax, imin(nmax - 1, l)));
			}
			scale = sumlx / suml2;
			best = scale * sumlx;
		}
	}
#undef QX_WEIGHT
	return scale;
}

/*
 * A Q4_K or Q5_K super-block's levels (quantize_row_q4_K_ref and q5_K_ref):
 * make_qkx2_quants per sub-block of 32 with levels 0..nmax (rmin and nstep
 * its search), the eight scales and mins packed in 6 bits into s with d and
 * dmin, and every element's level, from those rounded scales, into L.
 */
void hyb_quantize_q45k_levels(const float *x, int nmax, float rmin, int nstep, uint8_t s[12],
			      uint16_t *d_out, uint16_t *dmin_out, uint8_t L[HYB_QK_K])
{
	uint8_t Laux[32];
	float weights[32], mins[HYB_QK_K / 32], scales[HYB_QK_K / 32];
	float max_scale = 0, max_min = 0; /* the min is subtracted: scales are >= 0 */

	for (int j = 0; j < HYB_QK_K / 32; j++) {
		float sum_x2 = 0;

		for (int l = 0; l < 32; l++)
			sum_x2 += x[32 * j + l] * x[32 * j + l];
		float av_x = sqrtf(sum_x2 / 32);

		for (int l = 0; l < 32; l++)
			weights[l] = av_x + fabsf(x[32 * j + l]);
		scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j],
					     Laux, rmin, 0.1f, nstep, 0);
		if (scales[j] > max_scale)
			max_scale = scales[j];
		if (mins[j] > max_min)
			max_min = mins[j];
	}
	float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
	float inv_min = max_min > 0 ? 63.f / max_min : 0.f;

	for (int j = 0; j < HYB_QK_K / 32; j++) {
		/* the uint8_t truncation is llama.cpp's, before the clamp */
		uint8_t ls = (uint8_t)nearest_int(inv_scale * scales[j]);
		uint8_t lm = (uint8_t)nearest_int(inv_min * mins[j]);

		ls = ls < 63 ? ls : 63;
		lm = lm < 63 ? lm : 63;
		if (j < 4) {
			s[j] = ls;
			s[j + 4] = lm;
		} else {
			s[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
			s[j - 4] |= (uint8_t)((ls >> 4) << 6);
			s[j] |= (uint8_t)((lm >> 4) << 6);
		}
	}
	*d_out = hyb_f32_to_f16(max_scale / 63.f);
	*dmin_out = hyb_f32_to_f16(max_min / 63.f);

	uint8_t sc[8], m[8];

	hyb_q4k_scales(s, sc, m);
	for (int j = 0; j < HYB_QK_K / 32; j++) {
		const float d = hyb_f16_to_f32(*d_out) * sc[j];

		if (!d)
			continue;
		const float dm = hyb_f16_to_f32(*dmin_out) * m[j];

		for (int ii = 0; ii < 32; ii++) {
			int l = nearest_int((x[32 * j + ii] + dm) / d);

			L[32 * j + ii] = (uint8_t)imax(0, imin(nmax, l));
		}
	}
}

static void quantize_q4_k(const float *x, struct hyb_block_q4_k *y, int64_t n)
{
	uint8_t L[HYB_QK_K];

	for (int64_t i = 0; i < n / HYB_QK_K; i++, x += HYB_QK_K) {
		hyb_quantize_q45k_levels(x, 15, -1.f, 20, y[i].scales, &y[i].d, &y[i].dmin, L);

		uint8_t *q = y[i].qs;

		for (int j = 0; j < HYB_QK_K; j += 64, q += 32)
			for (int l = 0; l < 32; l++)
				q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
	}
}

static void quantize_q6_k(const float *x, struct hyb_block_q6_k *y, int64_t n)
{
	int8_t L[HYB_QK_K];
	float scales[HYB_QK_K / 16];

	for (int64_t i = 0; i < n / HYB_QK_K; i++, x += HYB_QK_K) {
		float max_scale = 0, max_abs_scale = 0;

		for (int ib = 0; ib < HYB_QK_K / 16; ib++) {
			const float scale = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib, 1);

			scales[ib] = scale;
			if (fabsf(scale) > max_abs_scale) {
				max_abs_scale = fabsf(scale);
				max_scale = scale;
			}
		}
		if (max_abs_scale < GROUP_MAX_EPS) {
			memset(&y[i], 0, sizeof(y[i]));
			continue;
		}
		float iscale = -128.f / max_scale;

		y[i].d = hyb_f32_to_f16(1 / iscale);
		for (int ib = 0; ib < HYB_QK_K / 16; ib++)
			y[i].scales[ib] = (int8_t)imin(127, nearest_int(iscale * scales[ib]));
		for (int j = 0; j < HYB_QK_K / 16; j++) {
			float d = hyb_f16_to_f32(y[i].d) * y[i].scales[j];

			if (!d)
				continue;
			for (int ii = 0; ii < 16; ii++) {
				int l = nearest_int(x[16 * j + ii] / d);

				L[16 * j + ii] = (int8_t)(imax(-32, imin(31, l)) + 32);
			}
		}
		uint8_t *ql = y[i].ql, *qh = y[i].qh;

		for (int j = 0; j < HYB_QK_K; j += 128, ql += 64, qh += 32) {
			for (int l = 0; l < 32; l++) {
				const uint8_t q1 = L[j + l + 0] & 0xF;
				const uint8_t q2 = L[j + l + 32] & 0xF;
				const uint8_t q3 = L[j + l + 64] & 0xF;
				const uint8_t q4 = L[j + l + 96] & 0xF;

				ql[l + 0] = (uint8_t)(q1 | (q3 << 4));
				ql[l + 32] = (uint8_t)(q2 | (q4 << 4));
				qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) |
						  ((L[j + l + 64] >> 4) << 4) |
						  ((L[j + l + 96] >> 4) << 6));
			}
		}
	}
}

float hyb_make_qkx2_quants(int n, int nmax, const float *x, const float *weights, uint8_t *L,
			   float *the_min, uint8_t *Laux, float rmin, float rdelta, int nstep,
			   int use_mad)
{
	return make_qkx2_quants(n, nmax, x, weights, L, the_min, Laux, rmin, rdelta, nstep,
				use_mad);
}

int hyb_quantize_row_ref(uint32_t type, const float *x, void *out, int64_t n)
{
	const struct hyb_type_info *ti = hyb_type_info(type);

	if (!ti || n < 0 || n % ti->blck)
		return -1;
	switch (type) {
	case HYB_TYPE_F32:
		memcpy(out, x, (size_t)n * sizeof(float));
		return 0;
	case HYB_TYPE_F16:
		for (int64_t i = 0; i < n; i++)
			((uint16_t *)out)[i] = hyb_f32_to_f16(x[i]);
		return 0;
	case HYB_TYPE_BF16:
		for (int64_t i = 0; i < n; i++)
			((uint16_t *)out)[i] = hyb_f32_to_bf16(x[i]);
		return 0;
	case HYB_TYPE_Q4_0:
		quantize_q4_0(x, out, n);
		return 0;
	case HYB_TYPE_Q4_1:
		quantize_q4_1(x, out, n);
		return 0;
	case HYB_TYPE_Q5_0:
		quantize_q5_0(x, out, n);
		return 0;
	case HYB_TYPE_Q5_1:
		quantize_q5_1(x, out, n);
		return 0;
	case HYB_TYPE_IQ4_NL:
		quantize_iq4_nl(x, out, n);
		return 0;
	case HYB_TYPE_MXFP4:
		quantize_mxfp4(x, out, n);
		return 0;
	case HYB_TYPE_Q8_0:
		quantize_q8_0(x, out, n);
		return 0;
	case HYB_TYPE_Q4_K:
		quantize_q4_k(x, out, n);
		return 0;
	case HYB_TYPE_Q6_K:
		quantize_q6_k(x, out, n);
		return 0;
	default:
		return hyb_quantize_k_extra_ref(type, x, out, n);
	}
}
