// SPDX-License-Identifier: MIT
/*
 * Scalar reference matrix kernels: one dot product per (row, column),
 * accumulated like llama.cpp's generic vec_dot code: an exact integer dot
 * per block, then one float multiply by the block scales. Float types sum
 * in double. Simple on purpose: the SIMD kernels are tested against these
 * (closely, not bit for bit). The summation orders of llama.cpp's AVX-512
 * build, which hyb's logits reproduce exactly, are in the AVX-512 kernels
 * and checked against llama.cpp itself (tests/unit/test_exact.c).
 */
#include "cpu_internal.h"

typedef float (*dot_fn)(int64_t k, const void *w, const void *x);

static void gemm_loop(dot_fn dot, HYB_GEMM_ARGS)
{
	for (int64_t c = 0; c < ncols; c++) {
		const char *xc = (const char *)x + c * x_stride;

		for (int64_t r = 0; r < nrows; r++)
			y[c * y_stride + r] = dot(k, (const char *)w + r * w_stride, xc);
	}
}

static float dot_f32(int64_t k, const void *w, const void *x)
{
	const float *a = w, *b = x;
	double s = 0;

	for (int64_t i = 0; i < k; i++)
		s += (double)a[i] * b[i];
	return (float)s;
}

static float dot_f16(int64_t k, const void *w, const void *x)
{
	const uint16_t *a = w, *b = x;
	double s = 0;

	for (int64_t i = 0; i < k; i++)
		s += (double)hyb_f16_to_f32(a[i]) * hyb_f16_to_f32(b[i]);
	return (float)s;
}

static float dot_bf16(int64_t k, const void *w, const void *x)
{
	const uint16_t *a = w, *b = x;
	double s = 0;

	for (int64_t i = 0; i < k; i++)
		s += (double)hyb_bf16_to_f32(a[i]) * hyb_bf16_to_f32(b[i]);
	return (float)s;
}

static float dot_q4_0(int64_t k, const void *w, const void *x)
{
	const struct hyb_block_q4_0 *a = w;
	const struct hyb_block_q8_0 *b = x;
	float s = 0;

	for (int64_t i = 0; i < k / HYB_QK4_0; i++) {
		int sumi = 0;

		for (int j = 0; j < HYB_QK4_0 / 2; j++) {
			sumi += ((a[i].qs[j] & 0xF) - 8) * b[i].qs[j];
			sumi += ((a[i].qs[j] >> 4) - 8) * b[i].qs[j + HYB_QK4_0 / 2];
		}
		s += sumi * hyb_f16_to_f32(a[i].d) * hyb_f16_to_f32(b[i].d);
	}
	return s;
}

static float dot_q8_0(int64_t k, const void *w, const void *x)
{
	const struct hyb_block_q8_0 *a = w, *b = x;
	float s = 0;

	for (int64_t i = 0; i < k / HYB_QK8_0; i++) {
		int sumi = 0;

		for (int j = 0; j < HYB_QK8_0; j++)
			sumi += a[i].qs[j] * b[i].qs[j];
		s += sumi * (hyb_f16_to_f32(a[i].d) * hyb_f16_to_f32(b[i].d));
	}
	return s;
}

/* ggml_vec_dot_q4_1_q8_1_generic: sum d*dx*dot + m*s, s = dx * sum(x) */
static float dot_q4_1(int64_t k, const void *w, const void *x)
{
	const struct hyb_block_q4_1 *a = w;
	const struct hyb_block_q8_1 *b = x;
	float s = 0;

	for (int64_t i = 0; i < k / HYB_QK4_0; i++) {
		int sumi = 0;

		for (int j = 0; j < HYB_QK4_0 / 2; j++) {
			sumi += (a[i].qs[j] & 0xF) * b[i].qs[j];
			sumi += (a[i].qs[j] >> 4) * b[i].qs[j + HYB_QK4_0 / 2];
		}
		s += (hyb_f16_to_f32(a[i].d) * hyb_f16_to_f32(b[i].d)) * sumi +
		     hyb_f16_to_f32(a[i].m) * hyb_f16_to_f32(b[i].s);
	}
	return s;
}

static float dot_q5_0(int64_t k, const void *w, const void *x)
{
	const struct hyb_block_q5_0 *a = w;
	const struct hyb_block_q8_0 *b = x;
	float s = 0;

	for (int64_t i = 0; i < k / HYB_QK4_0; i++) {
		int sumi = 0;

		for (int j = 0; j < HYB_QK4_0; j++)
			sumi += (hyb_q5_quant(a[i].qs, a[i].qh, j) - 16) * b[i].qs[j];
		s += (hyb_f16_to_f32(a[i].d) * hyb_f16_to_f32(b[i].d)) * sumi;
	}
	return s;
}

static float dot_q5_1(int64_t k, const void *w, const void *x)
{
	const struct hyb_block_q5_1 *a = w;
	const struct hyb_block_q8_1 *b = x;
	float s = 0;

	for (int64_t i = 0; i < k / HYB_QK4_0; i++) {
		int sumi = 0;

		for (int j = 0; j < HYB_QK4_0; j++)
			sumi += hyb_q5_quant(a[i].qs, a[i].qh, j) * b[i].qs[j];
		s += (hyb_f16_to_f32(a[i].d) * hyb_f16_to_f32(b[i].d)) * sumi +
		     hyb_f16_to_f32(a[i].m) * hyb_f16_to_f32(b[i].s);
	}
	return s;
}

static float dot_iq4_nl(int64_t k, const void *w, const void *x)
{
	const struct hyb_block_iq4_nl *a = w;
	const struct hyb_block_q8_0 *b = x;
	float s = 0;

	for (int64_t i = 0; i < k / HYB_QK4_0; i++) {
		int sumi = 0;

		for (int j = 0; j < HYB_QK4_0 / 2; j++) {
			sumi += hyb_kvalues_iq4nl[a[i].qs[j] & 0xF] * b[i].qs[j];
			sumi += hyb_kvalues_iq4nl[a[i].qs[j] >> 4] * b[i].qs[j + HYB_QK4_0 / 2];
		}
		s += (hyb_f16_to_f32(b[i].d) * hyb_f16_to_f32(a[i].d)) * sumi;
	}
	return s;
}

static float dot_q4_k(int64_t k, const void *w, const void *x)
{
	const struct hyb_block_q4_k *a = w;
	const struct hyb_block_q8_k *b = x;
	float s = 0;

	for (int64_t i = 0; i < k / HYB_QK_K; i++) {
		uint8_t sc[8], m[8];
		int sumi = 0, summ = 0;

		hyb_q4k_scales(a[i].scales, sc, m);
		for (int j = 0; j < 8; j++) {
			const uint8_t *q = a[i].qs + 32 * (j / 2);
			const int8_t *xq = b[i].qs + 32 * j;
			const int shift = 4 * (j & 1);
			int dot = 0;

			for (int l = 0; l < 32; l++)
				dot += ((q[l] >> shift) & 0xF) * xq[l];
			sumi += sc[j] * dot;
			summ += m[j] * (b[i].bsums[2 * j] + b[i].bsums[2 * j + 1]);
		}
		s += hyb_f16_to_f32(a[i].d) * b[i].d * sumi;
		s -= hyb_f16_to_f32(a[i].dmin) * b[i].d * summ;
	}
	return s;
}

/* The 6-bit quant of element e (0..255) of a Q6_K super-block, 0..63. */
static inline int q6_quant(const struct hyb_block_q6_k *a, int e)
{
	const int h = e / 128, l = e % 32, part = (e % 128) / 32;
	const uint8_t ql = a->ql[64 * h + l + 32 * (part & 1)];
	const uint8_t qh = a->qh[32 * h + l];

	return ((part < 2 ? ql & 0xF : ql >> 4) | (((qh >> (2 * part)) & 3) << 4));
}

static float dot_q6_k(int64_t k, const void *w, const void *x)
{
	const struct hyb_block_q6_k *a = w;
	const struct hyb_block_q8_k *b = x;
	float s = 0;

	for (int64_t i = 0; i < k / HYB_QK_K; i++) {
		int sumi = 0;

		for (int j = 0; j < 16; j++) {
			int dot = 0;

			for (int l = 0; l < 16; l++)
				dot += (q6_quant(&a[i], 16 * j + l) - 32) * b[i].qs[16 * j + l];
			sumi += a[i].scales[j] * dot;
		}
		s += hyb_f16_to_f32(a[i].d) * b[i].d * sumi;
	}
	return s;
}

void hyb_gemm_f32_scalar(HYB_GEMM_ARGS)
{
	gemm_loop(dot_f32, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride);
}

void hyb_gemm_f16_scalar(HYB_GEMM_ARGS)
{
	gemm_loop(dot_f16, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride);
}

void hyb_gemm_bf16_scalar(HYB_GEMM_ARGS)
{
	gemm_loop(dot_bf16, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride);
}

void hyb_gemm_q4_0_scalar(HYB_GEMM_ARGS)
{
	gemm_loop(dot_q4_0, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride);
}

void hyb_gemm_q8_0_scalar(HYB_GEMM_ARGS)
{
	gemm_loop(dot_q8_0, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride);
}

void hyb_gemm_q4_1_scalar(HYB_GEMM_ARGS)
{
	gemm_loop(dot_q4_1, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride);
}

void hyb_gemm_q5_0_scalar(HYB_GEMM_ARGS)
{
	gemm_loop(dot_q5_0, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride);
}

void hyb_gemm_q5_1_scalar(HYB_GEMM_ARGS)
{
	gemm_loop(dot_q5_1, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride);
}

void hyb_gemm_iq4_nl_scalar(HYB_GEMM_ARGS)
{
	gemm_loop(dot_iq4_nl, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride);
}

void hyb_gemm_q4_k_scalar(HYB_GEMM_ARGS)
{
	gemm_loop(dot_q4_k, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride);
}

void hyb_gemm_q6_k_scalar(HYB_GEMM_ARGS)
{
	gemm_loop(dot_q6_k, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride);
}
