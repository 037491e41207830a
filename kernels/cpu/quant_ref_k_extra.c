// SPDX-License-Identifier: MIT
/*
 * Reference quantizers of Q2_K, Q3_K, Q5_K and IQ4_XS, bit-identical to
 * llama.cpp's quantize_row_{q2_K,q3_K,q5_K,iq4_xs}_ref (ggml-quants.c; IQ4_XS
 * is quantize_iq4_xs without importance weights). As in quant_ref.c every
 * expression keeps llama.cpp's evaluation order, integer truncations
 * included, and the file is compiled without FMA, as ggml-base is.
 */
#include <math.h>
#include <string.h>

#include "cpu_internal.h"
#include "kquant_extra.h"
#include "quant_common.h"

static void pack_2bit(const uint8_t *L, uint8_t *qs)
{
	for (int j = 0; j < HYB_QK_K; j += 128)
		for (int l = 0; l < 32; l++)
			qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) |
						  (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}

static void quantize_q2_k(const float *x, struct hyb_block_q2_k *y, int64_t n)
{
	uint8_t L[HYB_QK_K], Laux[16];
	float weights[16], mins[HYB_QK_K / 16], scales[HYB_QK_K / 16];
	const float q4scale = 15.f;

	for (int64_t i = 0; i < n / HYB_QK_K; i++, x += HYB_QK_K) {
		float max_scale = 0, max_min = 0;

		for (int j = 0; j < HYB_QK_K / 16; j++) {
			for (int l = 0; l < 16; l++)
				weights[l] = fabsf(x[16 * j + l]);
			scales[j] = hyb_make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j,
							 &mins[j], Laux, -0.5f, 0.1f, 15, 1);
			if (scales[j] > max_scale)
				max_scale = scales[j];
			if (mins[j] > max_min)
				max_min = mins[j];
		}
		if (max_scale > 0) {
			const float iscale = q4scale / max_scale;

			for (int j = 0; j < HYB_QK_K / 16; j++)
				y[i].scales[j] = (uint8_t)nearest_int(iscale * scales[j]);
			y[i].d = hyb_f32_to_f16(max_scale / q4scale);
		} else {
			memset(y[i].scales, 0, sizeof(y[i].scales));
			y[i].d = hyb_f32_to_f16(0.f);
		}
		if (max_min > 0) {
			const float iscale = q4scale / max_min;

			for (int j = 0; j < HYB_QK_K / 16; j++)
				y[i].scales[j] |= (uint8_t)(nearest_int(iscale * mins[j]) << 4);
			y[i].dmin = hyb_f32_to_f16(max_min / q4scale);
		} else {
			y[i].dmin = hyb_f32_to_f16(0.f);
		}
		for (int j = 0; j < HYB_QK_K / 16; j++) {
			const float d = hyb_f16_to_f32(y[i].d) * (y[i].scales[j] & 0xF);

			if (!d)
				continue;
			const float dm = hyb_f16_to_f32(y[i].dmin) * (y[i].scales[j] >> 4);

			for (int ii = 0; ii < 16; ii++) {
				const int l = nearest_int((x[16 * j + ii] + dm) / d);

				L[16 * j + ii] = (uint8_t)imax(0, imin(3, l));
			}
		}
		pack_2bit(L, y[i].qs);
	}
}

/* llama.cpp's make_q3_quants: symmetric levels -nmax..nmax-1, x^2-weighted refinement */
static float make_q3_quants(int n, int nmax, const float *x, int8_t *L)
{
	float max = 0, amax = 0;

	for (int i = 0; i < n; i++) {
		const float ax = fabsf(x[i]);

		if (ax > amax) {
			amax = ax;
			max = x[i];
		}
	}
	if (amax < GROUP_MAX_EPS) {
		memset(L, 0, (size_t)n);
		return 0.f;
	}
	const float iscale = -nmax / max;
	float sumlx = 0, suml2 = 0;

	for (int i = 0; i < n; i++) {
		const int l = imax(-nmax, imin(nmax - 1, nearest_int(iscale * x[i])));
		const float w = x[i] * x[i];

		L[i] = (int8_t)l;
		sumlx += w * x[i] * l;
		suml2 += w * l * l;
	}
	for (int itry = 0; itry < 5; itry++) {
		int n_changed = 0;

		for (int i = 0; i < n; i++) {
			const float w = x[i] * x[i];
			float slx = sumlx - w * x[i] * L[i];

			if (slx > 0) {
				float sl2 = suml2 - w * L[i] * L[i];
				int new_l = nearest_int(x[i] * sl2 / slx);

				new_l = imax(-nmax, imin(nmax - 1, new_l));
				if (new_l != L[i]) {
					slx += w * x[i] * new_l;
					sl2 += w * new_l * new_l;
					if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
						L[i] = (int8_t)new_l;
						sumlx = slx;
						suml2 = sl2;
						n_changed++;
					}
				}
			}
		}
		if (!n_changed)
			break;
	}
	for (int i = 0; i < n; i++)
		L[i] = (int8_t)(L[i] + nmax);
	return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

static void quantize_q3_k(const float *x, struct hyb_block_q3_k *y, int64_t n)
{
	int8_t L[HYB_QK_K];
	float scales[HYB_QK_K / 16];

	for (int64_t i = 0; i < n / HYB_QK_K; i++, x += HYB_QK_K) {
		float max_scale = 0, amax = 0;

		for (int j = 0; j < HYB_QK_K / 16; j++) {
			scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j);
			const float scale = fabsf(scales[j]);

			if (scale > amax) {
				amax = scale;
				max_scale = scales[j];
			}
		}
		memset(y[i].scales, 0, 12);
		if (max_scale) {
			const float iscale = -32.f / max_scale;

			for (int j = 0; j < HYB_QK_K / 16; j++) {
				/* llama.cpp keeps the rounded value in an int8_t before the clamp */
				int8_t l = (int8_t)nearest_int(iscale * scales[j]);

				l = (int8_t)(imax(-32, imin(31, l)) + 32);
				if (j < 8)
					y[i].scales[j] = l & 0xF;
				else
					y[i].scales[j - 8] |= (uint8_t)((l & 0xF) << 4);
				l >>= 4;
				y[i].scales[j % 4 + 8] |= (uint8_t)(l << (2 * (j / 4)));
			}
			y[i].d = hyb_f32_to_f16(1 / iscale);
		} else {
			y[i].d = hyb_f32_to_f16(0.f);
		}
		for (int j = 0; j < HYB_QK_K / 16; j++) {
			const float d = hyb_f16_to_f32(y[i].d) * hyb_q3k_scale(y[i].scales, j);

			if (!d)
				continue;
			for (int ii = 0; ii < 16; ii++) {
				const int l = nearest_int(x[16 * j + ii] / d);

				L[16 * j + ii] = (int8_t)(imax(-4, imin(3, l)) + 4);
			}
		}
		/* the high bit of element j goes to bit j / 32 of hmask[j % 32] */
		memset(y[i].hmask, 0, sizeof(y[i].hmask));
		for (int j = 0; j < HYB_QK_K; j++) {
			if (L[j] > 3) {
				y[i].hmask[j % 32] |= (uint8_t)(1 << (j / 32));
				L[j] -= 4;
			}
		}
		pack_2bit((const uint8_t *)L, y[i].qs);
	}
}

static void quantize_q5_k(const float *x, struct hyb_block_q5_k *y, int64_t n)
{
	uint8_t L[HYB_QK_K];

	for (int64_t i = 0; i < n / HYB_QK_K; i++, x += HYB_QK_K) {
		/* Q4_K's scales and mins, levels 0..31 (quantize_row_q5_K_ref) */
		hyb_quantize_q45k_levels(x, 31, -0.5f, 15, y[i].scales, &y[i].d, &y[i].dmin, L);
		memset(y[i].qh, 0, sizeof(y[i].qh));
		for (int c = 0; c < HYB_QK_K / 64; c++) {
			for (int l = 0; l < 32; l++) {
				int l1 = L[64 * c + l], l2 = L[64 * c + l + 32];

				if (l1 > 15) {
					l1 -= 16;
					y[i].qh[l] |= (uint8_t)(1 << (2 * c));
				}
				if (l2 > 15) {
					l2 -= 16;
					y[i].qh[l] |= (uint8_t)(2 << (2 * c));
				}
				y[i].qs[32 * c + l] = (uint8_t)(l1 | (l2 << 4));
			}
		}
	}
}

/* the level of hyb_kvalues_iq4nl nearest to x */
static int best_index_iq4(float x)
{
	return hyb_best_index_int8(16, hyb_kvalues_iq4nl, x);
}

/*
 * One IQ4_XS super-block: llama.cpp's quantize_row_iq4_nl_impl(QK_K, 32, ...,
 * ntry 7) without importance weights (weights x^2): per sub-block the best
 * of 15 scales by weighted least squares, then 6-bit sub-block scales.
 */
static void quantize_iq4_xs_block(const float *x, struct hyb_block_iq4_xs *y)
{
	const int ntry = 7;
	const int8_t *values = hyb_kvalues_iq4nl;
	uint8_t L[HYB_QK_K] = { 0 };
	float scales[HYB_QK_K / 32], weight[32];
	float max_scale = 0, amax_scale = 0;

	memset(y->qs, 0, sizeof(y->qs));
	for (int ib = 0; ib < HYB_QK_K / 32; ib++) {
		const float *xb = x + 32 * ib;
		uint8_t *Lb = L + 32 * ib;
		float amax = 0, max = 0;

		for (int j = 0; j < 32; j++)
			weight[j] = xb[j] * xb[j];
		for (int j = 0; j < 32; j++) {
			const float ax = fabsf(xb[j]);

			if (ax > amax) {
				amax = ax;
				max = xb[j];
			}
		}
		if (amax < GROUP_MAX_EPS) {
			scales[ib] = 0;
			continue;
		}
		float d = -max / values[0];
		float id = 1 / d;
		float sumqx = 0, sumq2 = 0;

		for (int j = 0; j < 32; j++) {
			const int l = best_index_iq4(id * xb[j]);
			const float q = values[l], w = weight[j];

			Lb[j] = (uint8_t)l;
			sumqx += w * q * xb[j];
			sumq2 += w * q * q;
		}
		d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
		float best = d * sumqx;

		for (int itry = -ntry; itry <= ntry; itry++) {
			id = (itry + values[0]) / max;
			sumqx = sumq2 = 0;
			for (int j = 0; j < 32; j++) {
				const float q = values[best_index_iq4(id * xb[j])], w = weight[j];

				sumqx += w * q * xb[j];
				sumq2 += w * q * q;
			}
			if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
				d = sumqx / sumq2;
				best = d * sumqx;
			}
		}
		scales[ib] = d;
		if (fabsf(d) > amax_scale) {
			amax_scale = fabsf(d);
			max_scale = d;
		}
	}
	const float d = -max_scale / 32;
	const float id = d ? 1 / d : 0.f;

	y->d = hyb_f32_to_f16(d);
	y->scales_h = 0;
	for (int ib = 0; ib < HYB_QK_K / 32; ib++) {
		int l = imax(-32, imin(31, nearest_int(id * scales[ib])));
		const float dl = d * l;
		const float idl = dl ? 1 / dl : 0.f;

		for (int j = 0; j < 32; j++)
			L[32 * ib + j] = (uint8_t)best_index_iq4(idl * x[32 * ib + j]);
		l += 32;
		if (ib % 2 == 0)
			y->scales_l[ib / 2] = (uint8_t)(l & 0xF);
		else
			y->scales_l[ib / 2] |= (uint8_t)((l & 0xF) << 4);
		y->scales_h |= (uint16_t)((l >> 4) << (2 * ib));
	}
	for (int i = 0; i < HYB_QK_K / 32; i++)
		for (int j = 0; j < 16; j++)
			y->qs[16 * i + j] = (uint8_t)(L[32 * i + j] | (L[32 * i + 16 + j] << 4));
}

int hyb_quantize_k_extra_ref(uint32_t type, const float *x, void *out, int64_t n)
{
	if (n < 0 || n % HYB_QK_K)
		return -1;
	switch (type) {
	case HYB_TYPE_Q2_K:
		quantize_q2_k(x, out, n);
		return 0;
	case HYB_TYPE_Q3_K:
		quantize_q3_k(x, out, n);
		return 0;
	case HYB_TYPE_Q5_K:
		quantize_q5_k(x, out, n);
		return 0;
	case HYB_TYPE_IQ4_XS:
		for (int64_t i = 0; i < n / HYB_QK_K; i++)
			quantize_iq4_xs_block(x + i * HYB_QK_K, (struct hyb_block_iq4_xs *)out + i);
		return 0;
	default:
		return -1;
	}
}
