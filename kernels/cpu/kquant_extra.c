// SPDX-License-Identifier: MIT
/*
 * Q2_K, Q3_K, Q5_K and IQ4_XS at the scalar level: dequantization (the
 * arithmetic of llama.cpp's dequantize_row_*, ggml-quants.c) and the
 * reference matrix kernels (per super-block an exact integer dot, then the
 * block scales, as llama.cpp's generic vec_dot code; see gemm_scalar.c).
 */
#include "cpu_internal.h"
#include "kquant_extra.h"

/* ---- dequantization ---- */

static void dequantize_q2_k(const void *in, float *out, int64_t n)
{
	const struct hyb_block_q2_k *b = in;

	for (int64_t i = 0; i < n / HYB_QK_K; i++, out += HYB_QK_K) {
		const float d = hyb_f16_to_f32(b[i].d), min = hyb_f16_to_f32(b[i].dmin);

		for (int e = 0; e < HYB_QK_K; e++) {
			const uint8_t sc = b[i].scales[e / 16];
			const float dl = d * (sc & 0xF), ml = min * (sc >> 4);

			out[e] = dl * hyb_q2k_code(b[i].qs, e) - ml;
		}
	}
}

static void dequantize_q3_k(const void *in, float *out, int64_t n)
{
	const struct hyb_block_q3_k *b = in;

	for (int64_t i = 0; i < n / HYB_QK_K; i++, out += HYB_QK_K) {
		const float d = hyb_f16_to_f32(b[i].d);

		for (int e = 0; e < HYB_QK_K; e++) {
			const float dl = d * hyb_q3k_scale(b[i].scales, e / 16);

			out[e] = dl * (hyb_q3k_code(&b[i], e) - 4);
		}
	}
}

static void dequantize_q5_k(const void *in, float *out, int64_t n)
{
	const struct hyb_block_q5_k *b = in;

	for (int64_t i = 0; i < n / HYB_QK_K; i++, out += HYB_QK_K) {
		const float d = hyb_f16_to_f32(b[i].d), min = hyb_f16_to_f32(b[i].dmin);
		uint8_t sc[8], m[8];

		hyb_q4k_scales(b[i].scales, sc, m);
		for (int e = 0; e < HYB_QK_K; e++) {
			const float dl = d * sc[e / 32], ml = min * m[e / 32];

			out[e] = dl * hyb_q5k_code(&b[i], e) - ml;
		}
	}
}

static void dequantize_iq4_xs(const void *in, float *out, int64_t n)
{
	const struct hyb_block_iq4_xs *b = in;

	for (int64_t i = 0; i < n / HYB_QK_K; i++, out += HYB_QK_K) {
		const float d = hyb_f16_to_f32(b[i].d);

		for (int e = 0; e < HYB_QK_K; e++) {
			const float dl = d * hyb_iq4xs_scale(&b[i], e / 32);

			out[e] = dl * hyb_kvalues_iq4nl[hyb_iq4xs_index(&b[i], e)];
		}
	}
}

/* ---- reference dot products ---- */

static float dot_q2_k(int64_t k, const void *w, const struct hyb_block_q8_k *x)
{
	const struct hyb_block_q2_k *a = w;
	float s = 0;

	for (int64_t i = 0; i < k / HYB_QK_K; i++) {
		int sumi = 0, summ = 0;

		for (int j = 0; j < 16; j++) {
			int dot = 0;

			for (int l = 0; l < 16; l++)
				dot += hyb_q2k_code(a[i].qs, 16 * j + l) * x[i].qs[16 * j + l];
			sumi += (a[i].scales[j] & 0xF) * dot;
			summ += (a[i].scales[j] >> 4) * x[i].bsums[j];
		}
		s += hyb_f16_to_f32(a[i].d) * x[i].d * sumi;
		s -= hyb_f16_to_f32(a[i].dmin) * x[i].d * summ;
	}
	return s;
}

static float dot_q3_k(int64_t k, const void *w, const struct hyb_block_q8_k *x)
{
	const struct hyb_block_q3_k *a = w;
	float s = 0;

	for (int64_t i = 0; i < k / HYB_QK_K; i++) {
		int sumi = 0;

		for (int j = 0; j < 16; j++) {
			int dot = 0;

			for (int l = 0; l < 16; l++)
				dot += (hyb_q3k_code(&a[i], 16 * j + l) - 4) * x[i].qs[16 * j + l];
			sumi += hyb_q3k_scale(a[i].scales, j) * dot;
		}
		s += hyb_f16_to_f32(a[i].d) * x[i].d * sumi;
	}
	return s;
}

static float dot_q5_k(int64_t k, const void *w, const struct hyb_block_q8_k *x)
{
	const struct hyb_block_q5_k *a = w;
	float s = 0;

	for (int64_t i = 0; i < k / HYB_QK_K; i++) {
		uint8_t sc[8], m[8];
		int sumi = 0, summ = 0;

		hyb_q4k_scales(a[i].scales, sc, m);
		for (int j = 0; j < 8; j++) {
			int dot = 0;

			for (int l = 0; l < 32; l++)
				dot += hyb_q5k_code(&a[i], 32 * j + l) * x[i].qs[32 * j + l];
			sumi += sc[j] * dot;
			summ += m[j] * (x[i].bsums[2 * j] + x[i].bsums[2 * j + 1]);
		}
		s += hyb_f16_to_f32(a[i].d) * x[i].d * sumi;
		s -= hyb_f16_to_f32(a[i].dmin) * x[i].d * summ;
	}
	return s;
}

static float dot_iq4_xs(int64_t k, const void *w, const struct hyb_block_q8_k *x)
{
	const struct hyb_block_iq4_xs *a = w;
	float s = 0;

	for (int64_t i = 0; i < k / HYB_QK_K; i++) {
		int sumi = 0;

		for (int j = 0; j < 8; j++) {
			int dot = 0;

			for (int l = 0; l < 32; l++)
				dot += hyb_kvalues_iq4nl[hyb_iq4xs_index(&a[i], 32 * j + l)] *
				       x[i].qs[32 * j + l];
			sumi += hyb_iq4xs_scale(&a[i], j) * dot;
		}
		s += hyb_f16_to_f32(a[i].d) * x[i].d * sumi;
	}
	return s;
}

typedef float (*kdot_fn)(int64_t k, const void *w, const struct hyb_block_q8_k *x);

static void gemm_loop(kdot_fn dot, HYB_GEMM_ARGS)
{
	for (int64_t c = 0; c < ncols; c++) {
		const struct hyb_block_q8_k *xc =
			(const struct hyb_block_q8_k *)((const char *)x + c * x_stride);

		for (int64_t r = 0; r < nrows; r++)
			y[c * y_stride + r] = dot(k, (const char *)w + r * w_stride, xc);
	}
}

void hyb_gemm_q2_k_scalar(HYB_GEMM_ARGS)
{
	gemm_loop(dot_q2_k, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride);
}

void hyb_gemm_q3_k_scalar(HYB_GEMM_ARGS)
{
	gemm_loop(dot_q3_k, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride);
}

void hyb_gemm_q5_k_scalar(HYB_GEMM_ARGS)
{
	gemm_loop(dot_q5_k, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride);
}

void hyb_gemm_iq4_xs_scalar(HYB_GEMM_ARGS)
{
	gemm_loop(dot_iq4_xs, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride);
}

void hyb_fill_k_extra_scalar(struct hyb_cpu_kernels *k)
{
	hyb_set_gemm(k, HYB_TYPE_Q2_K, hyb_gemm_q2_k_scalar);
	hyb_set_gemm(k, HYB_TYPE_Q3_K, hyb_gemm_q3_k_scalar);
	hyb_set_gemm(k, HYB_TYPE_Q5_K, hyb_gemm_q5_k_scalar);
	hyb_set_gemm(k, HYB_TYPE_IQ4_XS, hyb_gemm_iq4_xs_scalar);
	k->dequantize[HYB_TYPE_Q2_K] = dequantize_q2_k;
	k->dequantize[HYB_TYPE_Q3_K] = dequantize_q3_k;
	k->dequantize[HYB_TYPE_Q5_K] = dequantize_q5_k;
	k->dequantize[HYB_TYPE_IQ4_XS] = dequantize_iq4_xs;
}
