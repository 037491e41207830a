/* SPDX-License-Identifier: MIT */
/*
 * Row . x for the weight types without a kernel of their own (deq8.h's:
 * Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q5_K, IQ4_XS, and Q4_K and Q6_K in
 * the sparse FFN; dense.cu keeps its own Q4_K and Q6_K matvec), shared by
 * dense.cu's matvec and sparse_ffn.cu's ffn_up. x is
 * staged in the CPU's dot type (hyb_vec_dot_type): Q8_0 blocks
 * (stage_q8_0.h) for Q5_0 and IQ4_NL, and for Q4_1 and Q5_1, whose Q8_1 has
 * the same quants and scale; Q8_K super-blocks (stage_q8_k.h) for the
 * K-quants and IQ4_XS. Each weight comes from hyb_deq8 (the CPU's
 * dequantized value, bit for bit) and meets its x as q * d in float: the
 * CPU's integer block dots up to float rounding. Q4_1 and Q5_1 take q * d
 * apart and add the min times the block sum of x once (Q8_1's s, rounded
 * to F16 as the CPU rounds it), as the CPU's dot does. Lane l takes elements
 * 8l .. 8l + 7 of every 256: a warp reads 256 consecutive elements a step.
 * CUDA only.
 */
#ifndef HYB_CUDA_GEN_DOT_H
#define HYB_CUDA_GEN_DOT_H

#include <stdint.h>

#include "deq8.h"

/* A type these kernels run through hyb_deq8. */
static __host__ __device__ constexpr bool hyb_gen_type(uint32_t t)
{
	return t == HYB_TYPE_Q4_1 || t == HYB_TYPE_Q5_0 || t == HYB_TYPE_Q5_1 ||
	       t == HYB_TYPE_IQ4_NL || t == HYB_TYPE_Q2_K || t == HYB_TYPE_Q3_K ||
	       t == HYB_TYPE_Q4_K || t == HYB_TYPE_Q5_K || t == HYB_TYPE_Q6_K ||
	       t == HYB_TYPE_IQ4_XS;
}

/* Elements per scale of the staged x: 256 where the dot type is Q8_K, else 32. */
static __host__ __device__ constexpr uint32_t hyb_gen_xblock(uint32_t t)
{
	return t == HYB_TYPE_Q2_K || t == HYB_TYPE_Q3_K || t == HYB_TYPE_Q4_K ||
			       t == HYB_TYPE_Q5_K || t == HYB_TYPE_Q6_K || t == HYB_TYPE_IQ4_XS
		       ? 256
		       : 32;
}

/* A type whose dot type is Q8_1: the staged x carries each block's sum (s). */
static __host__ __device__ constexpr bool hyb_gen_sums(uint32_t t)
{
	return t == HYB_TYPE_Q4_1 || t == HYB_TYPE_Q5_1;
}

/* Shared-memory bytes of x staged for type t, n elements. */
static __host__ __device__ inline uint64_t hyb_gen_stage_bytes(uint32_t t, uint64_t n)
{
	return hyb_gen_xblock(t) == 256 ? (n + n / 256 * 4 + n / 16 * 2 + 15) & ~15ull
					: n + n / 32 * (hyb_gen_sums(t) ? 8 : 4);
}

/* acc[r] += this lane's share of row[r] . x (warp_sum adds the lanes) */
template <uint32_t TY, int NR>
static __device__ __forceinline__ void hyb_gen_dot(const char *const *row, const unsigned char *sm,
						   uint32_t k, int lane, float *acc)
{
	const int8_t *xq = (const int8_t *)sm;
	const float *xd = (const float *)(sm + k);

	for (uint32_t c0 = 8 * (uint32_t)lane; c0 < k; c0 += 256) {
		const float d = xd[c0 / hyb_gen_xblock(TY)];
		const int2 q = *(const int2 *)(xq + c0);
		float x[8];

#pragma unroll
		for (int i = 0; i < 8; i++)
			x[i] = (float)(int8_t)((uint32_t)(i < 4 ? q.x : q.y) >> (8 * (i % 4))) * d;
#pragma unroll
		for (int r = 0; r < NR; r++) {
			float w[8], m;

			if (hyb_gen_sums(TY)) {
				/* the min times the block's x sum, once a block, as the CPU */
				hyb_deq8_q1(TY, (const uint8_t *)row[r], c0, w, &m);
				if (c0 % 32 == 0)
					acc[r] = fmaf(m, xd[k / 32 + c0 / 32], acc[r]);
			} else {
				hyb_deq8(TY, (const uint8_t *)row[r], c0, w);
			}
#pragma unroll
			for (int i = 0; i < 8; i++)
				acc[r] = fmaf(w[i], x[i], acc[r]);
		}
	}
}

#endif
