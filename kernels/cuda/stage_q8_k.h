/* SPDX-License-Identifier: MIT */
/*
 * x quantized to Q8_K super-blocks in shared memory, as kernels/cpu/
 * quant_act.c's hyb_quantize_q8_k_scalar does: iscale = -127 / the element
 * of largest |x| (the first on a tie), q = round-half-even(iscale * x)
 * capped at 127, d = 1 / iscale, the sums of each 16 quants. Layout: int8
 * q[k], then float d[k / 256], then int16 bsums[k / 16]
 * (hyb_q8k_bsums_at). The staging of dense.cu's matvec and sparse_ffn.cu's
 * ffn_up for the weights whose dot type is Q8_K. CUDA only; the caller
 * syncs.
 */
#ifndef HYB_CUDA_STAGE_Q8_K_H
#define HYB_CUDA_STAGE_Q8_K_H

#include <stdint.h>

/* where the int16 sums of 16 start */
static __device__ __forceinline__ uint32_t hyb_q8k_bsums_at(uint32_t k)
{
	return k + 4 * (k / 256);
}

/* Shared-memory bytes of the staged x: quants, a float d per 256, an int16 sum per 16. */
static __host__ __device__ __forceinline__ uint64_t hyb_q8k_stage_bytes(uint64_t k)
{
	return (k + k / 256 * 4 + k / 16 * 2 + 15) & ~15ull;
}

/*
 * A warp per super-block, lane l holds elements 8l .. 8l + 7. max is found
 * as the largest (|x|, -index) over the warp; an all-zero block is all zero.
 */
template <int WARPS>
static __device__ void hyb_stage_q8_k(const float *__restrict__ x, uint32_t k, unsigned char *sm,
				      int warp, int lane)
{
	int8_t *xq = (int8_t *)sm;
	float *xd = (float *)(sm + k);
	int16_t *bs = (int16_t *)(sm + hyb_q8k_bsums_at(k));
	const uint32_t nb = k / 256;

	for (uint32_t b = warp; b < nb; b += WARPS) {
		const float *xb = x + (uint64_t)b * 256 + 8 * lane;
		float v[8], amax = 0.0f, mx = 0.0f;
		int idx = 256, sum = 0;
		uint32_t p0 = 0, p1 = 0;

#pragma unroll
		for (int i = 0; i < 8; i++)
			v[i] = xb[i];
#pragma unroll
		for (int i = 0; i < 8; i++) {
			if (fabsf(v[i]) > amax) {
				amax = fabsf(v[i]);
				mx = v[i];
				idx = 8 * lane + i;
			}
		}
		for (int o = 16; o > 0; o /= 2) {
			const float oa = __shfl_xor_sync(0xffffffffu, amax, o);
			const float om = __shfl_xor_sync(0xffffffffu, mx, o);
			const int oi = __shfl_xor_sync(0xffffffffu, idx, o);

			if (oa > amax || (oa == amax && oi < idx)) {
				amax = oa;
				mx = om;
				idx = oi;
			}
		}
		/* every lane holds the same amax and mx now: the branch is warp-uniform */
		if (amax != 0.0f) {
			const float iscale = __fdiv_rn(-127.f, mx);

#pragma unroll
			for (int i = 0; i < 8; i++) {
				const int q = min(__float2int_rn(__fmul_rn(iscale, v[i])), 127);
				const uint32_t byte = (uint32_t)(q & 0xff) << (8 * (i % 4));

				sum += q;
				if (i < 4)
					p0 |= byte;
				else
					p1 |= byte;
			}
			if (lane == 0)
				xd[b] = __fdiv_rn(1.0f, iscale);
		} else if (lane == 0) {
			xd[b] = 0.0f;
		}
		*(uint2 *)(xq + (uint64_t)b * 256 + 8 * lane) = make_uint2(p0, p1);
		sum += __shfl_xor_sync(0xffffffffu, sum, 1); /* lanes 2g, 2g + 1: elements 16g .. */
		if (lane % 2 == 0)
			bs[b * 16 + lane / 2] = (int16_t)sum;
	}
}

#endif
