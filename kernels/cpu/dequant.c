// SPDX-License-Identifier: MIT
/* Dequantization to float, the same arithmetic as llama.cpp's dequantize_row_*. */
#include <string.h>

#include "cpu_internal.h"

void hyb_dequantize_f32(const void *in, float *out, int64_t n)
{
	memmove(out, in, (size_t)n * sizeof(float));
}

void hyb_dequantize_f16(const void *in, float *out, int64_t n)
{
	const uint16_t *h = in;

	for (int64_t i = 0; i < n; i++)
		out[i] = hyb_f16_to_f32(h[i]);
}

void hyb_dequantize_bf16(const void *in, float *out, int64_t n)
{
	const uint16_t *h = in;

	for (int64_t i = 0; i < n; i++)
		out[i] = hyb_bf16_to_f32(h[i]);
}

void hyb_dequantize_q4_0(const void *in, float *out, int64_t n)
{
	const struct hyb_block_q4_0 *b = in;

	for (int64_t i = 0; i < n / HYB_QK4_0; i++, out += HYB_QK4_0) {
		const float d = hyb_f16_to_f32(b[i].d);

		for (int j = 0; j < HYB_QK4_0 / 2; j++) {
			out[j] = ((b[i].qs[j] & 0xF) - 8) * d;
			out[j + HYB_QK4_0 / 2] = ((b[i].qs[j] >> 4) - 8) * d;
		}
	}
}

/* x0*d + m in this order, as dequantize_row_q4_1 (this file is compiled without FMA) */
void hyb_dequantize_q4_1(const void *in, float *out, int64_t n)
{
	const struct hyb_block_q4_1 *b = in;

	for (int64_t i = 0; i < n / HYB_QK4_0; i++, out += HYB_QK4_0) {
		const float d = hyb_f16_to_f32(b[i].d), m = hyb_f16_to_f32(b[i].m);

		for (int j = 0; j < HYB_QK4_0 / 2; j++) {
			out[j] = (b[i].qs[j] & 0xF) * d + m;
			out[j + HYB_QK4_0 / 2] = (b[i].qs[j] >> 4) * d + m;
		}
	}
}

void hyb_dequantize_q5_0(const void *in, float *out, int64_t n)
{
	const struct hyb_block_q5_0 *b = in;

	for (int64_t i = 0; i < n / HYB_QK4_0; i++, out += HYB_QK4_0) {
		const float d = hyb_f16_to_f32(b[i].d);

		for (int j = 0; j < HYB_QK4_0; j++)
			out[j] = (hyb_q5_quant(b[i].qs, b[i].qh, j) - 16) * d;
	}
}

void hyb_dequantize_q5_1(const void *in, float *out, int64_t n)
{
	const struct hyb_block_q5_1 *b = in;

	for (int64_t i = 0; i < n / HYB_QK4_0; i++, out += HYB_QK4_0) {
		const float d = hyb_f16_to_f32(b[i].d), m = hyb_f16_to_f32(b[i].m);

		for (int j = 0; j < HYB_QK4_0; j++)
			out[j] = hyb_q5_quant(b[i].qs, b[i].qh, j) * d + m;
	}
}

void hyb_dequantize_iq4_nl(const void *in, float *out, int64_t n)
{
	const struct hyb_block_iq4_nl *b = in;

	for (int64_t i = 0; i < n / HYB_QK4_0; i++, out += HYB_QK4_0) {
		const float d = hyb_f16_to_f32(b[i].d);

		for (int j = 0; j < HYB_QK4_0 / 2; j++) {
			out[j] = d * hyb_kvalues_iq4nl[b[i].qs[j] & 0xF];
			out[j + HYB_QK4_0 / 2] = d * hyb_kvalues_iq4nl[b[i].qs[j] >> 4];
		}
	}
}

void hyb_dequantize_mxfp4(const void *in, float *out, int64_t n)
{
	const struct hyb_block_mxfp4 *b = in;

	for (int64_t i = 0; i < n / HYB_QK4_0; i++, out += HYB_QK4_0) {
		const float d = hyb_e8m0_half(b[i].e);

		for (int j = 0; j < HYB_QK4_0 / 2; j++) {
			out[j] = hyb_kvalues_mxfp4[b[i].qs[j] & 0xF] * d;
			out[j + HYB_QK4_0 / 2] = hyb_kvalues_mxfp4[b[i].qs[j] >> 4] * d;
		}
	}
}

void hyb_dequantize_q8_0(const void *in, float *out, int64_t n)
{
	const struct hyb_block_q8_0 *b = in;

	for (int64_t i = 0; i < n / HYB_QK8_0; i++, out += HYB_QK8_0) {
		const float d = hyb_f16_to_f32(b[i].d);

		for (int j = 0; j < HYB_QK8_0; j++)
			out[j] = b[i].qs[j] * d;
	}
}

/* Q8_1 activations (for tests and tools): s is a by-product, not needed */
void hyb_dequantize_q8_1(const void *in, float *out, int64_t n)
{
	const struct hyb_block_q8_1 *b = in;

	for (int64_t i = 0; i < n / HYB_QK8_0; i++, out += HYB_QK8_0) {
		const float d = hyb_f16_to_f32(b[i].d);

		for (int j = 0; j < HYB_QK8_0; j++)
			out[j] = b[i].qs[j] * d;
	}
}

void hyb_dequantize_q4_k(const void *in, float *out, int64_t n)
{
	const struct hyb_block_q4_k *b = in;

	for (int64_t i = 0; i < n / HYB_QK_K; i++) {
		const float d = hyb_f16_to_f32(b[i].d);
		const float dmin = hyb_f16_to_f32(b[i].dmin);
		const uint8_t *q = b[i].qs;
		uint8_t sc[8], m[8];

		hyb_q4k_scales(b[i].scales, sc, m);
		for (int j = 0; j < 8; j += 2, q += 32) {
			const float d1 = d * sc[j], m1 = dmin * m[j];
			const float d2 = d * sc[j + 1], m2 = dmin * m[j + 1];

			for (int l = 0; l < 32; l++)
				*out++ = d1 * (q[l] & 0xF) - m1;
			for (int l = 0; l < 32; l++)
				*out++ = d2 * (q[l] >> 4) - m2;
		}
	}
}

void hyb_dequantize_q6_k(const void *in, float *out, int64_t n)
{
	const struct hyb_block_q6_k *b = in;

	for (int64_t i = 0; i < n / HYB_QK_K; i++) {
		const float d = hyb_f16_to_f32(b[i].d);
		const uint8_t *ql = b[i].ql, *qh = b[i].qh;
		const int8_t *sc = b[i].scales;

		for (int h = 0; h < HYB_QK_K; h += 128, out += 128, ql += 64, qh += 32, sc += 8) {
			for (int l = 0; l < 32; l++) {
				const int is = l / 16;
				const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
				const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
				const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
				const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;

				out[l + 0] = d * sc[is + 0] * q1;
				out[l + 32] = d * sc[is + 2] * q2;
				out[l + 64] = d * sc[is + 4] * q3;
				out[l + 96] = d * sc[is + 6] * q4;
			}
		}
	}
}

void hyb_dequantize_q8_k(const void *in, float *out, int64_t n)
{
	const struct hyb_block_q8_k *b = in;

	for (int64_t i = 0; i < n / HYB_QK_K; i++)
		for (int j = 0; j < HYB_QK_K; j++)
			*out++ = b[i].d * b[i].qs[j];
}
