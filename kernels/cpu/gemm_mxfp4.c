// SPDX-License-Identifier: MIT
/*
 * MXFP4 (gpt-oss's experts) times Q8_0 activations, with the sums of
 * llama.cpp's x86 build (ggml-cpu arch/x86), which has two:
 *
 * - rows % 8 == 0: the weights are repacked (mxfp4_8x8) and its GEMV and
 *   GEMM (gemv/gemm_q4_b32_8x8_q8_0_lut_avx, shared with IQ4_NL) keep one
 *   float chain per output: acc = fma(float(dot of block b), dw * dx, acc),
 *   block after block, whatever the column count;
 * - otherwise ggml_vec_dot_mxfp4_q8_0 for each column: 8 float lanes per
 *   chain, lane l of a block the exact sum of its products 4l..4l+3, even
 *   blocks in one chain and odd ones in another (pairs only), the two added
 *   lane by lane, hsum_float_8, then an odd last block in scalar code:
 *   sumf += d * sumi (not contracted).
 *
 * Integer dots are exact, so only those float steps must match. This is
 * the scalar level (fmaf: one rounding, as vfmadd); gemm_mxfp4_simd.h is
 * the same arithmetic in vector registers.
 */
#include <math.h>

#include "cpu_internal.h"

/* element e of a block (0-15: low nibbles, 16-31: high) */
static inline int level(const struct hyb_block_mxfp4 *b, int e)
{
	return hyb_kvalues_mxfp4[e < 16 ? b->qs[e] & 0xF : b->qs[e - 16] >> 4];
}

static inline int32_t dot_range(const struct hyb_block_mxfp4 *w, const struct hyb_block_q8_0 *x,
				int e0, int e1)
{
	int32_t s = 0;

	for (int e = e0; e < e1; e++)
		s += level(w, e) * x->qs[e];
	return s;
}

/* the repacked kernels' sum of one output: one fma chain of whole-block dots */
static float chain(const struct hyb_block_mxfp4 *wb, const struct hyb_block_q8_0 *xb, int64_t nb)
{
	float acc = 0.0f;

	for (int64_t b = 0; b < nb; b++)
		acc = fmaf((float)dot_range(&wb[b], &xb[b], 0, 32),
			   hyb_e8m0_half(wb[b].e) * hyb_f16_to_f32(xb[b].d), acc);
	return acc;
}

/* vec_dot's: two 8-lane chains of block pairs, hsum_float_8, an odd block apart */
static float vecdot(const struct hyb_block_mxfp4 *wb, const struct hyb_block_q8_0 *xb, int64_t nb)
{
	float a[2][8] = { { 0 } }, v[8], h[4], sumf;
	int64_t b = 0;

	for (; b + 1 < nb; b += 2)
		for (int p = 0; p < 2; p++) {
			const float d = hyb_f16_to_f32(xb[b + p].d) * hyb_e8m0_half(wb[b + p].e);

			for (int l = 0; l < 8; l++)
				a[p][l] = fmaf(d, (float)dot_range(&wb[b + p], &xb[b + p], 4 * l,
								   4 * l + 4),
					       a[p][l]);
		}
	/* hsum_float_8: halves, then pairs, then the last two */
	for (int l = 0; l < 8; l++)
		v[l] = a[0][l] + a[1][l];
	for (int l = 0; l < 4; l++)
		h[l] = v[l] + v[l + 4];
	sumf = (h[0] + h[2]) + (h[1] + h[3]);
	if (b < nb) {
		const float d = hyb_f16_to_f32(xb[b].d) * hyb_e8m0_half(wb[b].e);
		const float t = d * (float)dot_range(&wb[b], &xb[b], 0, 32);

		sumf += t;
	}
	return sumf;
}

static void each_output(HYB_GEMM_ARGS,
			float (*one)(const struct hyb_block_mxfp4 *, const struct hyb_block_q8_0 *,
				     int64_t))
{
	for (int64_t c = 0; c < ncols; c++)
		for (int64_t r = 0; r < nrows; r++)
			y[c * y_stride + r] = one(
				(const struct hyb_block_mxfp4 *)((const char *)w + r * w_stride),
				(const struct hyb_block_q8_0 *)((const char *)x + c * x_stride),
				k / HYB_QK8_0);
}

void hyb_gemm_mxfp4_chain_scalar(HYB_GEMM_ARGS)
{
	each_output(k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride, chain);
}

void hyb_gemm_mxfp4_vecdot_scalar(HYB_GEMM_ARGS)
{
	each_output(k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride, vecdot);
}
