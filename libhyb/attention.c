// SPDX-License-Identifier: MIT
#include "attention.h"

#include <math.h>
#include <string.h>

/*
 * One (token, head) pair, as llama.cpp's CPU flash attention computes it
 * (ggml-cpu ops.cpp), which is its default on CPU. Doing the same arithmetic
 * is what makes greedy tokens agree with llama.cpp's on models whose logits
 * sit close together:
 *   - batches under 64 tokens (decode, short prompts; flash_attn_ext_f16_one_chunk):
 *     q rounded to F16, K·q in the F16 dot kernel, online softmax over
 *     positions in order, V accumulated in F16 and rescaled when the max grows;
 *   - batches of 64 or more (its tiled path): the same in F32 throughout.
 * Not reproduced: for single-token decode over 512+ cached positions
 * llama.cpp splits the positions between its threads and merges partial
 * softmaxes, so its own result depends on its thread count.
 */
void hyb_attend(const struct hyb_cpu_kernels *k, const float *q, const uint16_t *kc,
		const uint16_t *vc, size_t stride, uint32_t hd, uint32_t n_kv, float scale,
		bool f16, void *tmp, float *out)
{
	uint16_t *q16 = tmp, *acc16 = q16 + hd;
	float *acc = (float *)(acc16 + hd), *row = acc + hd;
	float S = 0, M = -INFINITY;

	if (f16) {
		k->quantize_act[HYB_TYPE_F16](q, q16, hd);
		memset(acc16, 0, sizeof(uint16_t) * hd);
	} else {
		memset(acc, 0, sizeof(float) * hd);
	}
	for (uint32_t p = 0; p < n_kv; p++) {
		const uint16_t *kr = kc + (size_t)p * stride, *v = vc + (size_t)p * stride;
		float s = 0, ms = 1.0f, vs = 1.0f;

		if (f16) {
			k->gemm[HYB_TYPE_F16](hd, kr, 0, 1, q16, 0, 1, &s, 1);
		} else {
			k->dequantize[HYB_TYPE_F16](kr, row, hd);
			for (uint32_t d = 0; d < hd; d++)
				s += row[d] * q[d];
		}
		s *= scale;
		if (s > M) {
			float m_old = M;

			M = s;
			ms = expf(m_old - M);
		} else {
			vs = expf(s - M);
		}
		if (f16) {
			for (uint32_t d = 0; ms != 1.0f && d < hd; d++)
				acc16[d] = hyb_f32_to_f16(hyb_f16_to_f32(acc16[d]) * ms);
			for (uint32_t d = 0; d < hd; d++)
				acc16[d] = hyb_f32_to_f16(hyb_f16_to_f32(acc16[d]) +
							  hyb_f16_to_f32(v[d]) * vs);
		} else {
			k->dequantize[HYB_TYPE_F16](v, row, hd);
			for (uint32_t d = 0; d < hd; d++)
				acc[d] = acc[d] * ms + row[d] * vs;
		}
		S = S * ms + vs;
	}
	const float s_inv = S == 0.0f ? 0.0f : 1.0f / S;

	for (uint32_t d = 0; d < hd; d++)
		out[d] = (f16 ? hyb_f16_to_f32(acc16[d]) : acc[d]) * s_inv;
}

