/* SPDX-License-Identifier: MIT */
/*
 * x quantized to Q8_0 blocks in shared memory, as kernels/cpu/quant_act.c's
 * hyb_quantize_q8_0_scalar (and llama.cpp's x86 build) does: d = amax / 127
 * kept as f16, q = round-half-even(x * 127 / amax); int8 q[k], then float
 * d[k / 32]. The staging of dense.cu's matvec and sparse_ffn.cu's ffn_up
 * for Q8_0 and Q4_0 weights. A warp quantizes a 32-element block (lane l
 * holds element l) and loads STEPS blocks before the first reduction: one
 * trip to L2 for them, not one a block. CUDA only; the caller syncs.
 * SUMS (Q8_1, for Q4_1 and Q5_1 weights): then also float s[k / 32] after
 * d, s = f16(d * sum of the block's quants) with d the unrounded scale, as
 * quant_act.c's hyb_quantize_q8_1_scalar.
 */
#ifndef HYB_CUDA_STAGE_Q8_0_H
#define HYB_CUDA_STAGE_Q8_0_H

#include <cuda_fp16.h>
#include <stdint.h>

template <int WARPS, int STEPS, bool SUMS = false>
static __device__ __forceinline__ void hyb_stage_q8_0(const float *__restrict__ x, uint32_t k,
						      unsigned char *sm, int warp, int lane)
{
	int8_t *xq = (int8_t *)sm;
	float *xd = (float *)(sm + k);
	float *xs = xd + k / 32;
	const uint32_t nb = k / 32;

	for (uint32_t b0 = warp; b0 < nb; b0 += WARPS * STEPS) {
		float v[STEPS];

#pragma unroll
		for (int u = 0; u < STEPS; u++) {
			const uint32_t b = b0 + WARPS * u;

			v[u] = b < nb ? __ldg(&x[b * 32 + lane]) : 0.0f;
		}
#pragma unroll
		for (int u = 0; u < STEPS; u++) {
			const uint32_t b = b0 + WARPS * u;
			float amax;

			if (b >= nb) /* warp-uniform */
				break;
			amax = fabsf(v[u]);
			for (int o = 16; o > 0; o /= 2)
				amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
			const float d = amax / 127.f;
			const float id = amax != 0.0f ? 127.f / amax : 0.0f;

			const int q = __float2int_rn(v[u] * id);

			xq[b * 32 + lane] = (int8_t)q;
			if (lane == 0)
				xd[b] = __half2float(__float2half_rn(d));
			if (SUMS) {
				int sum = q;

				for (int o = 16; o > 0; o /= 2)
					sum += __shfl_xor_sync(0xffffffffu, sum, o);
				if (lane == 0)
					xs[b] = __half2float(__float2half_rn(__fmul_rn(d, (float)sum)));
			}
		}
	}
}

#endif
