// SPDX-License-Identifier: MIT
/*
 * Activation converters (the vec_dot types), scalar. Q8_0 follows what
 * llama.cpp's x86 build runs (quantize_row_q8_0 in ggml-cpu/arch/x86):
 * id = 127/amax and round-half-even, which differs from the weight
 * reference (1/d and roundf) in the last bit now and then; Q8_1 likewise
 * (quantize_row_q8_1 there), with its sum. Q8_K is
 * llama.cpp's quantize_row_q8_K_ref, which its x86 build also uses.
 */
#include <math.h>
#include <string.h>

#include "cpu_internal.h"

/* Round to nearest, ties to even, for |v| < 2^22 (as llama.cpp's nearest_int). */
static inline int round_even(float v)
{
	float t = v + 12582912.f;
	int i;

	memcpy(&i, &t, sizeof(i));
	return (i & 0x007fffff) - 0x00400000;
}

void hyb_quantize_f32_scalar(const float *x, void *out, int64_t n)
{
	memmove(out, x, (size_t)n * sizeof(float));
}

void hyb_quantize_f16_scalar(const float *x, void *out, int64_t n)
{
	uint16_t *o = out;

	for (int64_t i = 0; i < n; i++)
		o[i] = hyb_f32_to_f16(x[i]);
}

void hyb_quantize_bf16_scalar(const float *x, void *out, int64_t n)
{
	uint16_t *o = out;

	for (int64_t i = 0; i < n; i++)
		o[i] = hyb_f32_to_bf16(x[i]);
}

void hyb_quantize_q8_0_scalar(const float *x, void *out, int64_t n)
{
	struct hyb_block_q8_0 *y = out;

	for (int64_t i = 0; i < n / HYB_QK8_0; i++, x += HYB_QK8_0) {
		float amax = 0.0f;

		for (int j = 0; j < HYB_QK8_0; j++)
			amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
		const float d = amax / 127.f;
		const float id = amax != 0.0f ? 127.f / amax : 0.0f;

		y[i].d = hyb_f32_to_f16(d);
		for (int j = 0; j < HYB_QK8_0; j++)
			y[i].qs[j] = (int8_t)round_even(x[j] * id);
	}
}

/*
 * llama.cpp's x86 quantize_row_q8_1 (AVX2 branch, which its AVX-512 builds
 * run): the quants as Q8_0's, and s = f16(d * float(sum of the quants)),
 * d the unrounded float scale.
 */
void hyb_quantize_q8_1_scalar(const float *x, void *out, int64_t n)
{
	struct hyb_block_q8_1 *y = out;

	for (int64_t i = 0; i < n / HYB_QK8_0; i++, x += HYB_QK8_0) {
		float amax = 0.0f;
		int sum = 0;

		for (int j = 0; j < HYB_QK8_0; j++)
			amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
		const float d = amax / 127.f;
		const float id = amax != 0.0f ? 127.f / amax : 0.0f;

		y[i].d = hyb_f32_to_f16(d);
		for (int j = 0; j < HYB_QK8_0; j++) {
			y[i].qs[j] = (int8_t)round_even(x[j] * id);
			sum += y[i].qs[j];
		}
		y[i].s = hyb_f32_to_f16(d * (float)sum);
	}
}

void hyb_quantize_q8_k_scalar(const float *x, void *out, int64_t n)
{
	struct hyb_block_q8_k *y = out;

	for (int64_t i = 0; i < n / HYB_QK_K; i++, x += HYB_QK_K) {
		float max = 0, amax = 0;

		for (int j = 0; j < HYB_QK_K; j++) {
			if (fabsf(x[j]) > amax) {
				amax = fabsf(x[j]);
				max = x[j];
			}
		}
		if (!amax) {
			memset(&y[i], 0, sizeof(y[i]));
			continue;
		}
		const float iscale = -127.f / max;

		for (int j = 0; j < HYB_QK_K; j++) {
			int v = round_even(iscale * x[j]);

			y[i].qs[j] = (int8_t)(v < 127 ? v : 127);
		}
		for (int j = 0; j < HYB_QK_K / 16; j++) {
			int sum = 0;

			for (int l = 0; l < 16; l++)
				sum += y[i].qs[16 * j + l];
			y[i].bsums[j] = (int16_t)sum;
		}
		y[i].d = 1 / iscale;
	}
}
