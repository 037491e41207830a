// SPDX-License-Identifier: MIT
/*
 * The dense kernels of a decode step on CUDA (hyb/device.h: rmsnorm,
 * matvec, attention; PowerInfer 5.3 keeps the dense layers
 * on the GPU). The arithmetic is the CPU forward pass's (libhyb/forward/forward.c,
 * ops.c, attention.c) up to float summation order; where a rounding step is
 * part of that arithmetic (x converted to the weight's dot format, q and
 * k and v rounded to F16) it is done here the same way.
 *
 * rmsnorm: one block; squares rounded to float and summed in double, as
 *   hyb_rmsnorm does, so y is the CPU's to the last bit but for the order
 *   of the double sum (which almost never shows after rounding to float).
 *
 * matvec: one warp per row (grid-stride over rows, 16 warps a block, as
 *   many blocks as the occupancy API says fit: two per multiprocessor). Each block first stages x in shared
 *   memory in the weight's dot format, as the CPU converts it
 *   (hyb_vec_dot_type): Q8_0 blocks for Q4_0/Q8_0 weights, quantized as
 *   kernels/cpu/quant_act.c does (id = 127 / amax, round half to even; the
 *   same scheme as kernels/cuda/sparse_ffn.cu), so the integer block dots
 *   are the CPU's; Q8_K super-blocks for Q4_K/Q6_K weights (quant_act.c's
 *   hyb_quantize_q8_k_scalar: iscale = -127 / the element of largest |x|,
 *   the first one on a tie, d = 1 / iscale, the sums of each 16 quants);
 *   F16 for F16 weights; F32 as is. A lane then walks its
 *   share of the row several loads ahead (about 2 KiB in flight per warp),
 *   the warp adds its lanes with shuffles and lane 0 writes y[r] (or adds
 *   the rounded dot to it). Weights are GGUF blocks as they are: Q8_0 and
 *   Q4_0 blocks are only 2-byte aligned and are read 16 bits at a time;
 *   F16 and F32 rows that are 16-byte aligned are read 16 bytes at a time.
 *   K-quant rows (Q4_K 144-byte, Q6_K 210-byte super-blocks of 256) are
 *   also read 16 bits at a time; 8 lanes share a super-block (32 elements
 *   each), their integer dots are dp4a over the Q8_K quants and each
 *   sub-block's 6-bit (Q4_K, ggml's get_scale_min_k4 packing) or 8-bit
 *   (Q6_K) scale multiplies its integer sum, as the CPU's dot does; Q4_K's
 *   mins use the Q8_K sums of 16. Only the float sum's order differs.
 *   The other types (Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q5_K, IQ4_XS)
 *   take gen_dot.h: x staged as the CPU converts it, each weight
 *   dequantized as the CPU does (deq8.h), the products summed in float.
 *   Staging costs each block one pass over x from L2 (n_in * 4 bytes),
 *   small against the rows a block reads once n_out is a few thousand.
 *
 * attention, three kernels on the stream (flash-decoding):
 *   1. rope_store: RoPE on q and k with a cos/sin table the host computed
 *      with hyb_rope's own libm calls (bit-exact rotations), then k and v
 *      rounded to F16 into row pos of the caches.
 *   2. attn_part: a block per (chunk of positions, kv head, slice of at
 *      most 8 of its query heads). All the query heads of a GQA group read
 *      each K and V row once per block. Positions go in tiles of 64:
 *      scores by 8 lanes per position (4 positions per warp step, a
 *      3-shuffle reduction per head), an online softmax per head over the
 *      tiles (running max m, sum l, the accumulator rescaled when m grows),
 *      and V accumulated in float by threads that own a pair of dimensions
 *      and a residue class of positions (every V element loaded once).
 *      Why 8 lanes and not a warp per position: a warp-wide sum costs 5
 *      dependent shuffles per (position, head); 8 lanes of 4-byte loads
 *      still read whole 32-byte sectors of the row, and 3 shuffles sum
 *      the 4 positions of a warp step at once.
 *      q is rounded to F16 first, as the CPU does before its K.q dot. With
 *      one chunk the block writes out; otherwise (m, l, acc) per head and
 *      chunk go to the workspace.
 *   3. attn_combine (only when there are several chunks): per head,
 *      out = sum_c acc_c e^(m_c - M) / sum_c l_c e^(m_c - M), M = max m_c.
 *   The number of chunks is chosen so that one full wave of blocks runs
 *   (as many per multiprocessor as the occupancy API says fit, at most 4;
 *   chunks of whole tiles), so long contexts spread
 *   over the whole GPU and short ones need no combine. The CPU keeps its V
 *   sum in F16 (llama.cpp's flash attention); here it is float: results
 *   differ by that rounding (hyb/device.h allows it). Every sum has a fixed
 *   order: results are deterministic run to run.
 *   A graph's step reads the position from device memory (pos_at), so the
 *   kernels make the split themselves: the launch has the most chunks any
 *   position takes, blocks past the position's count return at once, and
 *   combine runs always and returns when one chunk wrote out. The split and
 *   the workspace layout are the by-value call's, so are the bits; RoPE's
 *   cos/sin come from a table of every position the host computed once.
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <type_traits>

#include "hyb/tensor_type.h"
#include "dense_cuda.h"
#include "occupancy.h"
#include "stage_q8_0.h"
#include "stage_q8_k.h"
#include "gen_dot.h"

#define WARP 32
#define FULL 0xffffffffu
#define QK 32               /* elements per Q8_0 / Q4_0 block */
#define Q8_BYTES 34
#define Q4_BYTES 18
#define QK_K 256            /* elements per K-quant super-block (Q4_K, Q6_K, Q8_K) */
#define Q4K_BYTES 144
#define Q6K_BYTES 210

#define MV_WARPS 16         /* matvec: warps (rows in flight) per block */
#define MV_THREADS (MV_WARPS * WARP)
#define MV_STEPS 8          /* matvec: loads a lane issues before using any */
#define KQ_LANES 8          /* K-quant matvec: lanes per super-block (32 elements each) */
#define KQ_SB (WARP / KQ_LANES)     /* super-blocks a warp takes per step */
#define KQ_STEPS 4          /* K-quant matvec: super-blocks a lane loads before using any */

#define NORM_THREADS 1024

#define AT_WARPS 8          /* attention: warps per block */
#define AT_THREADS (AT_WARPS * WARP)
#define AT_TILE 64          /* positions per tile */
#define AT_PW (AT_TILE / AT_WARPS)  /* positions per warp in a tile: 8 */
#define AT_HB 8             /* query heads per block at most */
#define AT_HD 256           /* head_dim at most */
#define AT_KJ (AT_HD / 2 / 8)       /* K pairs per lane at most (8 lanes per position) */
#define AT_MAX_CHUNKS 1024
#define AT_BLOCKS_PER_SM 4

static_assert(AT_PW == 8, "attn_part: a warp scores 8 positions per tile, 4 per step");
static_assert(AT_HB <= AT_WARPS, "attn_part: the softmax gives each head a warp");
static_assert(AT_TILE == 2 * WARP, "attn_part: the softmax gives each lane 2 positions");

static __device__ __forceinline__ float warp_sum(float v)
{
	for (int o = WARP / 2; o > 0; o /= 2)
		v += __shfl_xor_sync(FULL, v, o);
	return v;
}

static __device__ __forceinline__ float warp_max(float v)
{
	for (int o = WARP / 2; o > 0; o /= 2)
		v = fmaxf(v, __shfl_xor_sync(FULL, v, o));
	return v;
}

/* 4 bytes at a 2-byte aligned address (quants follow a 2-byte scale) */
static __device__ __forceinline__ uint32_t ld_u32_a2(const char *p)
{
	const unsigned short *q = (const unsigned short *)p;

	return (uint32_t)__ldg(q) | (uint32_t)__ldg(q + 1) << 16;
}

static __device__ __forceinline__ float h2f(unsigned short u)
{
	return __half2float(__ushort_as_half(u));
}

static __device__ __forceinline__ float ld_f16(const char *p)
{
	return h2f(__ldg((const unsigned short *)p));
}

/* element e (0..1) of a pair of f16 packed in u */
static __device__ __forceinline__ float f16_of(uint32_t u, int e)
{
	return h2f((unsigned short)(u >> (16 * e)));
}

static __device__ __forceinline__ unsigned short f2h_bits(float f)
{
	return __half_as_ushort(__float2half_rn(f));
}

static __host__ __device__ __forceinline__ uint32_t u32min(uint32_t a, uint32_t b)
{
	return a < b ? a : b;
}

static __host__ __device__ __forceinline__ uint32_t u32max(uint32_t a, uint32_t b)
{
	return a > b ? a : b;
}

static __host__ __device__ __forceinline__ uint64_t u64min(uint64_t a, uint64_t b)
{
	return a < b ? a : b;
}

/* ---- rmsnorm ---------------------------------------------------------------------- */

static __global__ void __launch_bounds__(NORM_THREADS)
rmsnorm_kernel(float *y, const float *x, const float *__restrict__ w, uint32_t n, float eps)
{
	__shared__ double part[NORM_THREADS / WARP];
	/* a block a row */
	y += (size_t)blockIdx.x * n;
	x += (size_t)blockIdx.x * n;
	__shared__ float scale_sh;
	const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
	double s = 0;

	/* hyb_rmsnorm: each square rounded to float, the sum in double */
	for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
		const float v = x[i];

		s += (double)__fmul_rn(v, v);
	}
	for (int o = WARP / 2; o > 0; o /= 2)
		s += __shfl_xor_sync(FULL, s, o);
	if (lane == 0)
		part[warp] = s;
	__syncthreads();
	if (threadIdx.x == 0) {
		double sum = 0;

		for (uint32_t i = 0; i < blockDim.x / WARP; i++)
			sum += part[i];
		scale_sh = 1.0f / sqrtf((float)(sum / n) + eps);
	}
	__syncthreads();
	const float scale = scale_sh;

	/* y may be x: every x[i] was read above, and each i is read and written by one thread */
	for (uint32_t i = threadIdx.x; i < n; i += blockDim.x)
		y[i] = __fmul_rn(__fmul_rn(x[i], scale), w[i]);
}

extern "C" int hyb_cuda_rmsnorm(float *y, const float *x, const float *w, uint32_t n,
				uint32_t rows, float eps, void *stream)
{
	const uint32_t thr = u32min((n + WARP - 1) / WARP * WARP, NORM_THREADS);

	if (!n || !rows || rows > 0x7fffffffu)
		return -EINVAL;
	rmsnorm_kernel<<<rows, thr, 0, (cudaStream_t)stream>>>(y, x, w, n, eps);
	return (int)cudaGetLastError();
}

/* ---- matvec ----------------------------------------------------------------------- */

struct mv_k {
	const char *w;
	uint64_t rb;          /* bytes per row */
	const float *x;
	float *y;
	uint32_t k, n_out;
	int accumulate;
};

/*
 * x in shared memory in the dot format of weight type TY. Q8_0 (for Q8_0
 * and Q4_0 weights): int8 q[k], then float d[k / 32] (d already rounded to
 * f16), as quant_act.c's hyb_quantize_q8_0_scalar. A warp quantizes a
 * 32-element block: lane l holds element l. It loads MV_STEPS blocks before
 * the first reduction, so the staging costs one trip to L2, not eight.
 * Q8_K (for Q4_K and Q6_K weights): stage_q8_k.h.
 */
template <uint32_t TY>
static __device__ void mv_stage_x(const float *__restrict__ x, uint32_t k, unsigned char *sm)
{
	const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;

	if (TY == HYB_TYPE_Q4_K || TY == HYB_TYPE_Q6_K ||
	    (hyb_gen_type(TY) && hyb_gen_xblock(TY) == 256)) {
		hyb_stage_q8_k<MV_WARPS>(x, k, sm, warp, lane);
	} else if (hyb_gen_sums(TY)) {
		hyb_stage_q8_0<MV_WARPS, MV_STEPS, true>(x, k, sm, warp, lane);
	} else if (TY == HYB_TYPE_F32) {
		float *xs = (float *)sm;

		for (uint32_t e = threadIdx.x; e < k; e += MV_THREADS)
			xs[e] = x[e];
	} else if (TY == HYB_TYPE_F16) {
		__half *xh = (__half *)sm;

		for (uint32_t e = threadIdx.x; e < k; e += MV_THREADS)
			xh[e] = __float2half_rn(x[e]);
	} else {
		hyb_stage_q8_0<MV_WARPS, MV_STEPS>(x, k, sm, warp, lane);
	}
	__syncthreads();
}

/* Q8_0 row . x (this lane's share): block b = lane / 4 + 8j, quants 8 (lane % 4) .. + 8 */
static __device__ __forceinline__ float mv_dot_q8_0(const char *row, const unsigned char *sm,
						    uint32_t k, int lane)
{
	const int8_t *xq = (const int8_t *)sm;
	const float *xd = (const float *)(sm + k);
	const uint32_t nb = k / QK, sub = lane % 4;
	float acc = 0;

	for (uint32_t b0 = lane / 4; b0 < nb; b0 += 8 * MV_STEPS) {
		uint32_t v0[MV_STEPS], v1[MV_STEPS];
		float dw[MV_STEPS];

#pragma unroll
		for (int u = 0; u < MV_STEPS; u++) {
			const uint32_t b = b0 + 8 * u;

			v0[u] = v1[u] = 0;
			dw[u] = 0;
			if (b < nb) {
				const char *blk = row + (uint64_t)b * Q8_BYTES;

				dw[u] = ld_f16(blk);
				v0[u] = ld_u32_a2(blk + 2 + 8 * sub);
				v1[u] = ld_u32_a2(blk + 6 + 8 * sub);
			}
		}
#pragma unroll
		for (int u = 0; u < MV_STEPS; u++) {
			const uint32_t b = b0 + 8 * u;

			if (b < nb) {
				const int2 xv = *(const int2 *)(xq + b * QK + 8 * sub);
				const int s = __dp4a((int)v1[u], xv.y, __dp4a((int)v0[u], xv.x, 0));

				acc += (float)s * (dw[u] * xd[b]);
			}
		}
	}
	return acc;
}

/*
 * Q4_0 row . x: block b = lane / 2 + 16j, quant bytes 8p .. 8p + 8 (p = lane
 * % 2): their low nibbles are elements 8p .. 8p + 7, high nibbles 16 + 8p ..
 */
static __device__ __forceinline__ float mv_dot_q4_0(const char *row, const unsigned char *sm,
						    uint32_t k, int lane)
{
	const int8_t *xq = (const int8_t *)sm;
	const float *xd = (const float *)(sm + k);
	const uint32_t nb = k / QK, p = lane % 2;
	float acc = 0;

	for (uint32_t b0 = lane / 2; b0 < nb; b0 += 16 * MV_STEPS) {
		uint32_t v0[MV_STEPS], v1[MV_STEPS];
		float dw[MV_STEPS];

#pragma unroll
		for (int u = 0; u < MV_STEPS; u++) {
			const uint32_t b = b0 + 16 * u;

			v0[u] = v1[u] = 0;
			dw[u] = 0;
			if (b < nb) {
				const char *blk = row + (uint64_t)b * Q4_BYTES;

				dw[u] = ld_f16(blk);
				v0[u] = ld_u32_a2(blk + 2 + 8 * p);
				v1[u] = ld_u32_a2(blk + 6 + 8 * p);
			}
		}
#pragma unroll
		for (int u = 0; u < MV_STEPS; u++) {
			const uint32_t b = b0 + 16 * u;

			if (b < nb) {
				const int2 xl = *(const int2 *)(xq + b * QK + 8 * p);
				const int2 xh = *(const int2 *)(xq + b * QK + 16 + 8 * p);
				/* nibble - 8 per byte: fits a signed byte, no borrow */
				const uint32_t lo = 0x0f0f0f0fu, e8 = 0x08080808u;
				const int l0 = (int)__vsub4(v0[u] & lo, e8);
				const int l1 = (int)__vsub4(v1[u] & lo, e8);
				const int h0 = (int)__vsub4((v0[u] >> 4) & lo, e8);
				const int h1 = (int)__vsub4((v1[u] >> 4) & lo, e8);
				int s = __dp4a(l0, xl.x, 0);

				s = __dp4a(l1, xl.y, s);
				s = __dp4a(h0, xh.x, s);
				s = __dp4a(h1, xh.y, s);
				acc += (float)s * (dw[u] * xd[b]);
			}
		}
	}
	return acc;
}

static __device__ __forceinline__ uint32_t byte_at(uint32_t w, uint32_t i)
{
	return (w >> (8 * i)) & 0xff;
}

/*
 * The 6-bit scale and min of sub-block i (0..7) of a Q4_K super-block whose
 * 12 scale bytes are s0, s1, s2 (little endian): ggml's get_scale_min_k4,
 * kernels/cpu/blocks.h hyb_q4k_scales.
 */
static __device__ __forceinline__ void q4k_scale_min(uint32_t s0, uint32_t s1, uint32_t s2,
						     uint32_t i, int *sc, int *m)
{
	if (i < 4) {
		*sc = (int)(byte_at(s0, i) & 63);
		*m = (int)(byte_at(s1, i) & 63);
	} else {
		*sc = (int)((byte_at(s2, i - 4) & 0xf) | (byte_at(s0, i - 4) >> 6) << 4);
		*m = (int)((byte_at(s2, i - 4) >> 4) | (byte_at(s1, i - 4) >> 6) << 4);
	}
}

/*
 * Q4_K row . x (x in Q8_K): super-block b = lane / 8 + 4j, lane t = lane % 8
 * takes quant bytes 16t .. 16t + 15 (pair p = t / 2 of 32 bytes, half h =
 * t % 2): their low nibbles are elements 64p + 16h .. + 15 of sub-block 2p,
 * their high nibbles elements 64p + 32 + 16h .. of sub-block 2p + 1. Per
 * super-block, as the CPU's dot: d_x (d sum sc_j q.x - dmin sum m_j bsum_j).
 */
static __device__ __forceinline__ float mv_dot_q4_k(const char *row, const unsigned char *sm,
						    uint32_t k, int lane)
{
	const int8_t *xq = (const int8_t *)sm;
	const float *xd = (const float *)(sm + k);
	const int16_t *bs = (const int16_t *)(sm + hyb_q8k_bsums_at(k));
	const uint32_t nb = k / QK_K, t = lane % KQ_LANES, p = t / 2, h = t % 2;
	const uint32_t lo = 0x0f0f0f0fu;
	float acc = 0;

	for (uint32_t b0 = lane / KQ_LANES; b0 < nb; b0 += KQ_SB * KQ_STEPS) {
		uint32_t q[KQ_STEPS][4], sc[KQ_STEPS][3], dd[KQ_STEPS];

#pragma unroll
		for (int u = 0; u < KQ_STEPS; u++) {
			const uint32_t b = b0 + KQ_SB * u;

			dd[u] = 0;
#pragma unroll
			for (int i = 0; i < 4; i++)
				q[u][i] = 0;
#pragma unroll
			for (int i = 0; i < 3; i++)
				sc[u][i] = 0;
			if (b < nb) {
				const char *blk = row + (uint64_t)b * Q4K_BYTES;

				dd[u] = ld_u32_a2(blk);  /* d, dmin */
#pragma unroll
				for (int i = 0; i < 3; i++)
					sc[u][i] = ld_u32_a2(blk + 4 + 4 * i);
#pragma unroll
				for (int i = 0; i < 4; i++)
					q[u][i] = ld_u32_a2(blk + 16 + 16 * t + 4 * i);
			}
		}
#pragma unroll
		for (int u = 0; u < KQ_STEPS; u++) {
			const uint32_t b = b0 + KQ_SB * u;

			if (b >= nb)
				continue;
			const int8_t *xb = xq + (uint64_t)b * QK_K + 64 * p + 16 * h;
			const int4 xl = *(const int4 *)xb;
			const int4 xh = *(const int4 *)(xb + 32);
			const int16_t *bb = bs + b * (QK_K / 16) + 4 * p + h;
			int sc_l, m_l, sc_h, m_h;
			int sl, sh;

			q4k_scale_min(sc[u][0], sc[u][1], sc[u][2], 2 * p, &sc_l, &m_l);
			q4k_scale_min(sc[u][0], sc[u][1], sc[u][2], 2 * p + 1, &sc_h, &m_h);
			/* nibbles 0..15 in each byte: non-negative as signed bytes */
			sl = __dp4a((int)(q[u][0] & lo), xl.x, 0);
			sl = __dp4a((int)(q[u][1] & lo), xl.y, sl);
			sl = __dp4a((int)(q[u][2] & lo), xl.z, sl);
			sl = __dp4a((int)(q[u][3] & lo), xl.w, sl);
			sh = __dp4a((int)((q[u][0] >> 4) & lo), xh.x, 0);
			sh = __dp4a((int)((q[u][1] >> 4) & lo), xh.y, sh);
			sh = __dp4a((int)((q[u][2] >> 4) & lo), xh.z, sh);
			sh = __dp4a((int)((q[u][3] >> 4) & lo), xh.w, sh);
			const int isum = sc_l * sl + sc_h * sh;
			const int msum = m_l * (int)bb[0] + m_h * (int)bb[2];
			const float dx = xd[b];

			acc += dx * f16_of(dd[u], 0) * (float)isum -
			       dx * f16_of(dd[u], 1) * (float)msum;
		}
	}
	return acc;
}

/*
 * Q6_K row . x (x in Q8_K): super-block b = lane / 8 + 4j; lane t = lane % 8
 * takes half n = t / 4 (elements 128n ..) and l = 8 (t % 4) .. + 7 of each
 * of its four quarters: element 128n + 32c + l is the low (c = 0, 1) or
 * high (c = 2, 3) nibble of ql[64n + 32 (c % 2) + l] with bits 2c, 2c + 1
 * of qh[32n + l] on top, minus 32; its sub-block of 16 is 8n + 2c + l / 16.
 */
static __device__ __forceinline__ float mv_dot_q6_k(const char *row, const unsigned char *sm,
						    uint32_t k, int lane)
{
	const int8_t *xq = (const int8_t *)sm;
	const float *xd = (const float *)(sm + k);
	const uint32_t nb = k / QK_K, t = lane % KQ_LANES, n = t / 4, l0 = 8 * (t % 4);
	const uint32_t is = l0 / 16;
	const uint32_t lo = 0x0f0f0f0fu, h2 = 0x03030303u, e32 = 0x20202020u;
	float acc = 0;

	for (uint32_t b0 = lane / KQ_LANES; b0 < nb; b0 += KQ_SB * KQ_STEPS) {
		uint32_t qa[KQ_STEPS][2], qb[KQ_STEPS][2], qh[KQ_STEPS][2], sc[KQ_STEPS][2];
		float dw[KQ_STEPS];

#pragma unroll
		for (int u = 0; u < KQ_STEPS; u++) {
			const uint32_t b = b0 + KQ_SB * u;

			dw[u] = 0;
#pragma unroll
			for (int i = 0; i < 2; i++)
				qa[u][i] = qb[u][i] = qh[u][i] = sc[u][i] = 0;
			if (b < nb) {
				const char *blk = row + (uint64_t)b * Q6K_BYTES;

#pragma unroll
				for (int i = 0; i < 2; i++) {
					qa[u][i] = ld_u32_a2(blk + 64 * n + l0 + 4 * i);
					qb[u][i] = ld_u32_a2(blk + 64 * n + 32 + l0 + 4 * i);
					qh[u][i] = ld_u32_a2(blk + 128 + 32 * n + l0 + 4 * i);
					sc[u][i] = ld_u32_a2(blk + 192 + 8 * n + 4 * i);
				}
				dw[u] = ld_f16(blk + 208);
			}
		}
#pragma unroll
		for (int u = 0; u < KQ_STEPS; u++) {
			const uint32_t b = b0 + KQ_SB * u;

			if (b >= nb)
				continue;
			const int8_t *xb = xq + (uint64_t)b * QK_K + 128 * n + l0;
			const int2 x0 = *(const int2 *)xb, x1 = *(const int2 *)(xb + 32);
			const int2 x2 = *(const int2 *)(xb + 64), x3 = *(const int2 *)(xb + 96);
			int s0 = 0, s1 = 0, s2 = 0, s3 = 0;

#pragma unroll
			for (int i = 0; i < 2; i++) {
				const uint32_t a = qa[u][i], c = qb[u][i], hh = qh[u][i];
				/* 6-bit quants 0..63 per byte, minus 32: signed bytes, no borrow */
				const int q0 = (int)__vsub4((a & lo) | (hh & h2) << 4, e32);
				const int q1 = (int)__vsub4((c & lo) | (hh >> 2 & h2) << 4, e32);
				const int q2 =
					(int)__vsub4((a >> 4 & lo) | (hh >> 4 & h2) << 4, e32);
				const int q3 =
					(int)__vsub4((c >> 4 & lo) | (hh >> 6 & h2) << 4, e32);

				s0 = __dp4a(q0, i ? x0.y : x0.x, s0);
				s1 = __dp4a(q1, i ? x1.y : x1.x, s1);
				s2 = __dp4a(q2, i ? x2.y : x2.x, s2);
				s3 = __dp4a(q3, i ? x3.y : x3.x, s3);
			}
			/* scales[8n + 2c + is]: bytes is and is + 2 of both words */
			const int isum = (int)(int8_t)byte_at(sc[u][0], is) * s0 +
					 (int)(int8_t)byte_at(sc[u][0], is + 2) * s1 +
					 (int)(int8_t)byte_at(sc[u][1], is) * s2 +
					 (int)(int8_t)byte_at(sc[u][1], is + 2) * s3;

			acc += (dw[u] * xd[b]) * (float)isum;
		}
	}
	return acc;
}

/* F16 row . x (x in F16): VEC, rows 16-byte aligned and k % 8 == 0: 8 elements a lane a step */
template <bool VEC>
static __device__ __forceinline__ float mv_dot_f16(const char *row, const unsigned char *sm,
						   uint32_t k, int lane)
{
	const __half *xh = (const __half *)sm;
	float acc = 0;

	if (VEC) {
		for (uint32_t e0 = 8 * lane; e0 < k; e0 += 8 * WARP * MV_STEPS) {
			uint4 w[MV_STEPS];

#pragma unroll
			for (int u = 0; u < MV_STEPS; u++) {
				const uint32_t e = e0 + 8 * WARP * u;

				w[u] = e < k ? __ldg((const uint4 *)(row + 2 * (uint64_t)e)) :
					       make_uint4(0, 0, 0, 0);
			}
#pragma unroll
			for (int u = 0; u < MV_STEPS; u++) {
				const uint32_t e = e0 + 8 * WARP * u;

				if (e >= k)
					continue;
				const uint4 xv = *(const uint4 *)(xh + e);
				const uint32_t xa[4] = { xv.x, xv.y, xv.z, xv.w };
				const uint32_t wa[4] = { w[u].x, w[u].y, w[u].z, w[u].w };

#pragma unroll
				for (int j = 0; j < 8; j++)
					acc = fmaf(f16_of(wa[j / 2], j % 2),
						   f16_of(xa[j / 2], j % 2), acc);
			}
		}
	} else {
		for (uint32_t e0 = lane; e0 < k; e0 += WARP * MV_STEPS) {
			float w[MV_STEPS];

#pragma unroll
			for (int u = 0; u < MV_STEPS; u++) {
				const uint32_t e = e0 + WARP * u;

				w[u] = e < k ? ld_f16(row + 2 * (uint64_t)e) : 0.0f;
			}
#pragma unroll
			for (int u = 0; u < MV_STEPS; u++) {
				const uint32_t e = e0 + WARP * u;

				if (e < k)
					acc = fmaf(w[u], __half2float(xh[e]), acc);
			}
		}
	}
	return acc;
}

/* F32 row . x: VEC, rows 16-byte aligned and k % 4 == 0: 4 elements a lane a step */
template <bool VEC>
static __device__ __forceinline__ float mv_dot_f32(const char *row, const unsigned char *sm,
						   uint32_t k, int lane)
{
	const float *xs = (const float *)sm;
	float acc = 0;

	if (VEC) {
		for (uint32_t e0 = 4 * lane; e0 < k; e0 += 4 * WARP * MV_STEPS) {
			float4 w[MV_STEPS];

#pragma unroll
			for (int u = 0; u < MV_STEPS; u++) {
				const uint32_t e = e0 + 4 * WARP * u;

				w[u] = e < k ? __ldg((const float4 *)(row + 4 * (uint64_t)e)) :
					       make_float4(0, 0, 0, 0);
			}
#pragma unroll
			for (int u = 0; u < MV_STEPS; u++) {
				const uint32_t e = e0 + 4 * WARP * u;

				if (e >= k)
					continue;
				const float4 xv = *(const float4 *)(xs + e);

				acc = fmaf(w[u].x, xv.x, acc);
				acc = fmaf(w[u].y, xv.y, acc);
				acc = fmaf(w[u].z, xv.z, acc);
				acc = fmaf(w[u].w, xv.w, acc);
			}
		}
	} else {
		for (uint32_t e0 = lane; e0 < k; e0 += WARP * MV_STEPS) {
			float w[MV_STEPS];

#pragma unroll
			for (int u = 0; u < MV_STEPS; u++) {
				const uint32_t e = e0 + WARP * u;

				w[u] = e < k ? __ldg((const float *)(row + 4 * (uint64_t)e)) : 0.0f;
			}
#pragma unroll
			for (int u = 0; u < MV_STEPS; u++) {
				const uint32_t e = e0 + WARP * u;

				if (e < k)
					acc = fmaf(w[u], xs[e], acc);
			}
		}
	}
	return acc;
}

/* A block's share of one matvec: x staged, then its rows grid-stride. */
template <uint32_t TY, bool VEC>
static __device__ __forceinline__ void mv_block(const mv_k &a, unsigned char *sm)
{
	const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;

	mv_stage_x<TY>(a.x, a.k, sm);
	/* r is the same for the whole warp: the shuffles below see every lane */
	for (uint32_t r = blockIdx.x * MV_WARPS + warp; r < a.n_out; r += gridDim.x * MV_WARPS) {
		const char *row = a.w + (uint64_t)r * a.rb;
		float acc;

		if (TY == HYB_TYPE_Q8_0) {
			acc = mv_dot_q8_0(row, sm, a.k, lane);
		} else if (hyb_gen_type(TY) && TY != HYB_TYPE_Q4_K && TY != HYB_TYPE_Q6_K) {
			float g[1] = { 0.0f };

			hyb_gen_dot<TY, 1>(&row, sm, a.k, lane, g);
			acc = g[0];
		} else if (TY == HYB_TYPE_Q4_0) {
			acc = mv_dot_q4_0(row, sm, a.k, lane);
		} else if (TY == HYB_TYPE_Q4_K) {
			acc = mv_dot_q4_k(row, sm, a.k, lane);
		} else if (TY == HYB_TYPE_Q6_K) {
			acc = mv_dot_q6_k(row, sm, a.k, lane);
		} else if (TY == HYB_TYPE_F16) {
			acc = mv_dot_f16<VEC>(row, sm, a.k, lane);
		} else {
			acc = mv_dot_f32<VEC>(row, sm, a.k, lane);
		}
		acc = warp_sum(acc);
		if (lane == 0)
			a.y[r] = a.accumulate ? a.y[r] + acc : acc;
	}
}

/* 2 blocks of 512 threads a multiprocessor: 64 registers at most (a 65th would leave 1) */
template <uint32_t TY, bool VEC>
static __global__ void __launch_bounds__(MV_THREADS, 2) matvec_kernel(const mv_k a)
{
	extern __shared__ __align__(16) unsigned char sm[];

	mv_block<TY, VEC>(a, sm);
}

/*
 * A group of matvecs of one type and shape in one launch (a layer's device
 * experts, docs/MOE.md): grid row y is item y, each row of blocks what one
 * matvec_kernel launch has, so every output is that kernel's bit for bit.
 */
#define MV_GROUP 32 /* items a launch (their descriptors: 1.5 KiB of parameters) */
struct mv_g {
	mv_k it[MV_GROUP];
};

template <uint32_t TY, bool VEC>
static __global__ void __launch_bounds__(MV_THREADS, 2) matvec_group_kernel(const mv_g g)
{
	extern __shared__ __align__(16) unsigned char sm[];

	mv_block<TY, VEC>(g.it[blockIdx.y], sm);
}

/*
 * Matvecs listed in device memory (hyb/device.h hyb_dev_matvec_table):
 * grid row y is item y when the list has one; base is slot 0 and row 0.
 * Each block checks its own item - indices inside the arrays, a y row no
 * earlier item writes - and reports a bad one instead of computing it.
 */
struct mv_t {
	mv_k base;
	uint64_t w_stride;
	uint32_t n_w, n_x, n_y, max;
	const uint32_t *items;
	uint32_t *bad;     /* mapped host memory: [0] = 3, [1] the item; NULL: not reported */
};

static __device__ __forceinline__ void mv_t_report(const mv_t &t, uint32_t item)
{
	if (t.bad && threadIdx.x == 0) {
		((volatile uint32_t *)t.bad)[1] = item;
		__threadfence_system();
		((volatile uint32_t *)t.bad)[0] = 3;
	}
}

template <uint32_t TY, bool VEC>
static __global__ void __launch_bounds__(MV_THREADS, 2) matvec_table_kernel(const mv_t t)
{
	extern __shared__ __align__(16) unsigned char sm[];
	const uint32_t i = blockIdx.y, n = t.items[0];

	if (n > t.max) {
		if (i == 0 && blockIdx.x == 0)
			mv_t_report(t, n);
		return;
	}
	if (i >= n)
		return;
	const uint32_t *e = t.items + 1 + 3 * i;
	const uint32_t slot = e[0], xr = e[1], yr = e[2];
	bool ok = slot < t.n_w && xr < t.n_x && yr < t.n_y;

	for (uint32_t j = 0; j < i && ok; j++)
		ok = t.items[3 + 3 * j] != yr;
	if (!ok) {
		if (blockIdx.x == 0)
			mv_t_report(t, i);
		return;
	}
	mv_k a = t.base;

	a.w += slot * t.w_stride;
	a.x += (uint64_t)xr * a.k;
	a.y += (uint64_t)yr * a.n_out;
	mv_block<TY, VEC>(a, sm);
}

extern "C" uint32_t hyb_cuda_matvec_smem(uint32_t type, uint32_t n_in)
{
	switch (type) {
	case HYB_TYPE_F32:
		return 4 * n_in;
	case HYB_TYPE_F16:
		return (uint32_t)((2ull * n_in + 15) & ~15ull);
	case HYB_TYPE_Q8_0:
	case HYB_TYPE_Q4_0:
		return n_in + n_in / QK * 4;
	case HYB_TYPE_Q4_K:
	case HYB_TYPE_Q6_K:
		/* Q8_K: quants, a float d per 256, an int16 sum per 16 */
		/* (in 64 bits: a huge n_in is too much, not wrapped) */
		return (uint32_t)u64min(hyb_q8k_stage_bytes(n_in), UINT32_MAX);
	default:
		return hyb_gen_type(type) ? (uint32_t)u64min(hyb_gen_stage_bytes(type, n_in),
							     UINT32_MAX)
					  : 0;
	}
}

extern "C" int hyb_cuda_dense_setup(int smem_max)
{
	const void *k[] = {
		(const void *)matvec_kernel<HYB_TYPE_F32, false>,
		(const void *)matvec_kernel<HYB_TYPE_F32, true>,
		(const void *)matvec_kernel<HYB_TYPE_F16, false>,
		(const void *)matvec_kernel<HYB_TYPE_F16, true>,
		(const void *)matvec_kernel<HYB_TYPE_Q8_0, false>,
		(const void *)matvec_kernel<HYB_TYPE_Q4_0, false>,
		(const void *)matvec_kernel<HYB_TYPE_Q4_K, false>,
		(const void *)matvec_kernel<HYB_TYPE_Q6_K, false>,
		(const void *)matvec_kernel<HYB_TYPE_Q4_1, false>,
		(const void *)matvec_kernel<HYB_TYPE_Q5_0, false>,
		(const void *)matvec_kernel<HYB_TYPE_Q5_1, false>,
		(const void *)matvec_kernel<HYB_TYPE_IQ4_NL, false>,
		(const void *)matvec_kernel<HYB_TYPE_Q2_K, false>,
		(const void *)matvec_kernel<HYB_TYPE_Q3_K, false>,
		(const void *)matvec_kernel<HYB_TYPE_Q5_K, false>,
		(const void *)matvec_kernel<HYB_TYPE_IQ4_XS, false>,
		(const void *)matvec_group_kernel<HYB_TYPE_F32, false>,
		(const void *)matvec_group_kernel<HYB_TYPE_F32, true>,
		(const void *)matvec_group_kernel<HYB_TYPE_F16, false>,
		(const void *)matvec_group_kernel<HYB_TYPE_F16, true>,
		(const void *)matvec_group_kernel<HYB_TYPE_Q8_0, false>,
		(const void *)matvec_group_kernel<HYB_TYPE_Q4_0, false>,
		(const void *)matvec_group_kernel<HYB_TYPE_Q4_K, false>,
		(const void *)matvec_group_kernel<HYB_TYPE_Q6_K, false>,
		(const void *)matvec_group_kernel<HYB_TYPE_Q4_1, false>,
		(const void *)matvec_group_kernel<HYB_TYPE_Q5_0, false>,
		(const void *)matvec_group_kernel<HYB_TYPE_Q5_1, false>,
		(const void *)matvec_group_kernel<HYB_TYPE_IQ4_NL, false>,
		(const void *)matvec_group_kernel<HYB_TYPE_Q2_K, false>,
		(const void *)matvec_group_kernel<HYB_TYPE_Q3_K, false>,
		(const void *)matvec_group_kernel<HYB_TYPE_Q5_K, false>,
		(const void *)matvec_group_kernel<HYB_TYPE_IQ4_XS, false>,
		(const void *)matvec_table_kernel<HYB_TYPE_F32, false>,
		(const void *)matvec_table_kernel<HYB_TYPE_F32, true>,
		(const void *)matvec_table_kernel<HYB_TYPE_F16, false>,
		(const void *)matvec_table_kernel<HYB_TYPE_F16, true>,
		(const void *)matvec_table_kernel<HYB_TYPE_Q8_0, false>,
		(const void *)matvec_table_kernel<HYB_TYPE_Q4_0, false>,
		(const void *)matvec_table_kernel<HYB_TYPE_Q4_K, false>,
		(const void *)matvec_table_kernel<HYB_TYPE_Q6_K, false>,
		(const void *)matvec_table_kernel<HYB_TYPE_Q4_1, false>,
		(const void *)matvec_table_kernel<HYB_TYPE_Q5_0, false>,
		(const void *)matvec_table_kernel<HYB_TYPE_Q5_1, false>,
		(const void *)matvec_table_kernel<HYB_TYPE_IQ4_NL, false>,
		(const void *)matvec_table_kernel<HYB_TYPE_Q2_K, false>,
		(const void *)matvec_table_kernel<HYB_TYPE_Q3_K, false>,
		(const void *)matvec_table_kernel<HYB_TYPE_Q5_K, false>,
		(const void *)matvec_table_kernel<HYB_TYPE_IQ4_XS, false>,
	};

	for (size_t i = 0; i < sizeof(k) / sizeof(k[0]); i++) {
		const cudaError_t e =
			cudaFuncSetAttribute(k[i], cudaFuncAttributeMaxDynamicSharedMemorySize,
					     smem_max);

		if (e != cudaSuccess)
			return (int)e;
	}
	return 0;
}

/*
 * f(type, vec) for the kernels' template arguments (std::integral_constant
 * and std::bool_constant): the one switch over the types they take. -EINVAL
 * for another type.
 */
template <class F> static int mv_dispatch(uint32_t type, bool vec, F f)
{
#define MV_TY(t) std::integral_constant<uint32_t, t>()
	switch (type) {
	case HYB_TYPE_F32:
		vec ? f(MV_TY(HYB_TYPE_F32), std::true_type()) :
		      f(MV_TY(HYB_TYPE_F32), std::false_type());
		return 0;
	case HYB_TYPE_F16:
		vec ? f(MV_TY(HYB_TYPE_F16), std::true_type()) :
		      f(MV_TY(HYB_TYPE_F16), std::false_type());
		return 0;
	case HYB_TYPE_Q8_0: f(MV_TY(HYB_TYPE_Q8_0), std::false_type()); return 0;
	case HYB_TYPE_Q4_0: f(MV_TY(HYB_TYPE_Q4_0), std::false_type()); return 0;
	case HYB_TYPE_Q4_K: f(MV_TY(HYB_TYPE_Q4_K), std::false_type()); return 0;
	case HYB_TYPE_Q6_K: f(MV_TY(HYB_TYPE_Q6_K), std::false_type()); return 0;
	case HYB_TYPE_Q4_1: f(MV_TY(HYB_TYPE_Q4_1), std::false_type()); return 0;
	case HYB_TYPE_Q5_0: f(MV_TY(HYB_TYPE_Q5_0), std::false_type()); return 0;
	case HYB_TYPE_Q5_1: f(MV_TY(HYB_TYPE_Q5_1), std::false_type()); return 0;
	case HYB_TYPE_IQ4_NL: f(MV_TY(HYB_TYPE_IQ4_NL), std::false_type()); return 0;
	case HYB_TYPE_Q2_K: f(MV_TY(HYB_TYPE_Q2_K), std::false_type()); return 0;
	case HYB_TYPE_Q3_K: f(MV_TY(HYB_TYPE_Q3_K), std::false_type()); return 0;
	case HYB_TYPE_Q5_K: f(MV_TY(HYB_TYPE_Q5_K), std::false_type()); return 0;
	case HYB_TYPE_IQ4_XS: f(MV_TY(HYB_TYPE_IQ4_XS), std::false_type()); return 0;
	}
#undef MV_TY
	return -EINVAL;
}

/*
 * A row per warp, grid-stride: as many blocks as fit on the multiprocessors
 * at once; a group shares them among its items, MV_GROUP items a launch.
 */
template <uint32_t TY, bool VEC>
static void mv_launch(const mv_k *a, uint32_t n, uint32_t sms, uint32_t smem, cudaStream_t s)
{
	static std::atomic<uint64_t> occ{0}, occ_g{0};
	const uint32_t want = (a[0].n_out + MV_WARPS - 1) / MV_WARPS;

	if (n == 1) {
		const uint32_t per_sm = hyb_occupancy(occ, (const void *)matvec_kernel<TY, VEC>,
						      MV_THREADS, smem);

		matvec_kernel<TY, VEC><<<u32min(want, per_sm * sms), MV_THREADS, smem, s>>>(a[0]);
		return;
	}
	const uint32_t per_sm = hyb_occupancy(occ_g, (const void *)matvec_group_kernel<TY, VEC>,
					      MV_THREADS, smem);

	for (uint32_t i0 = 0; i0 < n; i0 += MV_GROUP) {
		const uint32_t k = u32min(MV_GROUP, n - i0);
		const dim3 grid(u32min(want, u32max(1, per_sm * sms / k)), k);
		mv_g g;

		for (uint32_t i = 0; i < k; i++)
			g.it[i] = a[i0 + i];
		matvec_group_kernel<TY, VEC><<<grid, MV_THREADS, smem, s>>>(g);
	}
}

extern "C" int hyb_cuda_matvec_group(const struct hyb_cuda_matvec *m, uint32_t n, void *stream)
{
	const cudaStream_t s = (cudaStream_t)stream;
	const uint64_t rb = hyb_row_bytes(m->type, m->n_in);
	const uint32_t smem = hyb_cuda_matvec_smem(m->type, m->n_in);
	const uint32_t sms = (uint32_t)(m->n_sm > 0 ? m->n_sm : 1);
	/* 16-byte loads need every row 16-byte aligned (every item's) */
	bool vec = rb % 16 == 0;
	mv_k *a;

	if (!n || !rb || !smem || !m->n_out || !m->n_in)
		return -EINVAL;
	for (uint32_t i = 0; i < n; i++) {
		if ((uintptr_t)m[i].w % (m->type == HYB_TYPE_F32 ? 4 : 2) || m[i].type != m->type ||
		    m[i].n_in != m->n_in || m[i].n_out != m->n_out ||
		    m[i].accumulate != m->accumulate)
			return -EINVAL;
		vec = vec && (uintptr_t)m[i].w % 16 == 0;
	}
	/* the K-quant kernels' block sizes are constants: they must be the rows' */
	if ((m->type == HYB_TYPE_Q4_K && rb != m->n_in / QK_K * Q4K_BYTES) ||
	    (m->type == HYB_TYPE_Q6_K && rb != m->n_in / QK_K * Q6K_BYTES))
		return -EINVAL;
	a = (mv_k *)malloc(sizeof(mv_k) * n);
	if (!a)
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++) {
		a[i].w = (const char *)m[i].w;
		a[i].rb = rb;
		a[i].x = m[i].x;
		a[i].y = m[i].y;
		a[i].k = m->n_in;
		a[i].n_out = m->n_out;
		a[i].accumulate = m->accumulate;
	}
	if (mv_dispatch(m->type, vec, [&](auto ty, auto v) {
		    mv_launch<decltype(ty)::value, decltype(v)::value>(a, n, sms, smem, s);
	    })) {
		free(a);
		return -EINVAL;
	}
	free(a);
	return (int)cudaGetLastError();
}

extern "C" int hyb_cuda_matvec_table(const struct hyb_cuda_matvec_table *t, void *stream)
{
	const struct hyb_cuda_matvec *m = &t->m;
	const cudaStream_t s = (cudaStream_t)stream;
	const uint64_t rb = hyb_row_bytes(m->type, m->n_in);
	const uint32_t smem = hyb_cuda_matvec_smem(m->type, m->n_in);
	const uint32_t sms = (uint32_t)(m->n_sm > 0 ? m->n_sm : 1);
	const bool vec = rb % 16 == 0 && (uintptr_t)m->w % 16 == 0 && t->w_stride % 16 == 0;
	mv_t k;

	if (!rb || !smem || !m->n_out || !m->n_in || !t->max || !t->n_w || !t->n_x || !t->n_y ||
	    !t->items || (uintptr_t)m->w % (m->type == HYB_TYPE_F32 ? 4 : 2) ||
	    (t->n_w > 1 && t->w_stride % 16))
		return -EINVAL;
	if ((m->type == HYB_TYPE_Q4_K && rb != m->n_in / QK_K * Q4K_BYTES) ||
	    (m->type == HYB_TYPE_Q6_K && rb != m->n_in / QK_K * Q6K_BYTES))
		return -EINVAL;
	k.base.w = (const char *)m->w;
	k.base.rb = rb;
	k.base.x = m->x;
	k.base.y = m->y;
	k.base.k = m->n_in;
	k.base.n_out = m->n_out;
	k.base.accumulate = m->accumulate;
	k.w_stride = t->w_stride;
	k.n_w = t->n_w;
	k.n_x = t->n_x;
	k.n_y = t->n_y;
	k.max = t->max;
	k.items = t->items;
	k.bad = t->bad;
	if (mv_dispatch(m->type, vec, [&](auto ty, auto v) {
		    constexpr uint32_t TY = decltype(ty)::value;
		    constexpr bool VEC = decltype(v)::value;
		    static std::atomic<uint64_t> occ{0};
		    const uint32_t per_sm = hyb_occupancy(occ, (const void *)matvec_table_kernel<TY, VEC>,
							  MV_THREADS, smem);
		    const uint32_t want = (m->n_out + MV_WARPS - 1) / MV_WARPS;
		    const dim3 grid(u32min(want, u32max(1, per_sm * sms / t->max)), t->max);

		    matvec_table_kernel<TY, VEC><<<grid, MV_THREADS, smem, s>>>(k);
	    }))
		return -EINVAL;
	return (int)cudaGetLastError();
}

extern "C" int hyb_cuda_matvec(const struct hyb_cuda_matvec *m, void *stream)
{
	return hyb_cuda_matvec_group(m, 1, stream);
}

/* ---- attention 1: RoPE, the cache rows ---------------------------------------------- */

struct rope_k {
	float *q, *k;
	const float *v;
	unsigned short *kc, *vc;  /* row pos, kv head 0 (pos_at: row 0) */
	uint32_t n_head, hd, n_rot;
	int neox;
	float q_scale;  /* 0: none */
	float cs[HYB_CUDA_ROPE_MAX], sn[HYB_CUDA_ROPE_MAX];
	/* a graph's step (dense_cuda.h): the position and its row of the table, read here */
	const uint32_t *pos_at;
	const float *tab;
	uint32_t kvs, n_ctx;
	uint32_t *bad;
};

/* A position read from device memory; past the cache: reported once, and false. */
static __device__ __forceinline__ bool pos_ok(const uint32_t *pos_at, uint32_t n_ctx,
					      uint32_t *bad, uint32_t *pos, bool report)
{
	*pos = *pos_at;
	if (*pos < n_ctx)
		return true;
	if (report && bad && blockIdx.x == 0 && threadIdx.x == 0) {
		((volatile uint32_t *)bad)[1] = *pos;
		__threadfence_system();
		((volatile uint32_t *)bad)[0] = 2;
	}
	return false;
}

/* Block b < n_head: q head b; else kv head b - n_head (k roped, then k and v stored). */
static __global__ void __launch_bounds__(128) rope_store(const rope_k a)
{
	const uint32_t b = blockIdx.x, hd = a.hd;
	const bool is_q = b < a.n_head;
	const uint32_t g = is_q ? 0 : b - a.n_head;
	float *x = is_q ? a.q + (uint64_t)b * hd : a.k + (uint64_t)g * hd;
	unsigned short *kc = a.kc, *vc = a.vc;
	const float *cs = a.cs, *sn = a.sn;
	uint32_t pos;

	if (a.pos_at) {
		if (!pos_ok(a.pos_at, a.n_ctx, a.bad, &pos, true))
			return;
		kc += (uint64_t)pos * a.kvs;
		vc += (uint64_t)pos * a.kvs;
		cs = a.tab + (uint64_t)pos * a.n_rot;
		sn = cs + a.n_rot / 2;
	}
	for (uint32_t i = threadIdx.x; i < a.n_rot / 2; i += blockDim.x) {
		const uint32_t ia = a.neox ? i : 2 * i, ib = a.neox ? i + a.n_rot / 2 : 2 * i + 1;
		const float x0 = x[ia], x1 = x[ib];

		/* hyb_rope: one product rounded, the other fused */
		x[ia] = __fmaf_rn(x0, cs[i], -__fmul_rn(x1, sn[i]));
		x[ib] = __fmaf_rn(x0, sn[i], __fmul_rn(x1, cs[i]));
	}
	if (is_q) {
		/* forward.c: q *= q_scale after RoPE, one rounded product (uniform per block) */
		if (a.q_scale != 0.0f) {
			__syncthreads();
			for (uint32_t d = threadIdx.x; d < hd; d += blockDim.x)
				x[d] = __fmul_rn(x[d], a.q_scale);
		}
		return;
	}
	__syncthreads(); /* the block's writes to x are visible to the block after this */
	for (uint32_t d = threadIdx.x; d < hd; d += blockDim.x) {
		kc[(uint64_t)g * hd + d] = f2h_bits(x[d]);
		vc[(uint64_t)g * hd + d] = f2h_bits(a.v[(uint64_t)g * hd + d]);
	}
}

/* ---- attention 2: partial softmax-weighted sums over chunks of positions ------------- */

struct at_k {
	const float *q;               /* roped */
	const unsigned short *kc, *vc;
	uint32_t kv_stride;           /* n_head_kv * hd elements per cache row */
	uint32_t hd, group, hb, n_slices;
	uint32_t npos, chunk, n_chunks;
	float scale;
	float *out;
	float *part;                  /* [n_head][n_chunks][hd] */
	float *ml;                    /* [n_head][n_chunks][2]: m, l */
	/* a graph's step: npos, chunk, n_chunks, ml and the window's first row made here */
	const uint32_t *pos_at;
	uint32_t n_ctx, n_swa, max_chunks, n_head;
};

/* attn_plan's split of the positions (its chunk and count), for npos of them. */
static __host__ __device__ __forceinline__ void at_split(uint32_t npos, uint32_t max_chunks,
							 uint32_t *chunk, uint32_t *n_chunks)
{
	uint32_t c = (npos + max_chunks - 1) / max_chunks;

	c = (c + AT_TILE - 1) / AT_TILE * AT_TILE;
	*chunk = c;
	*n_chunks = (npos + c - 1) / c;
}

/* A graph's step: the window's first row, npos and the split, from the position in memory. */
static __device__ __forceinline__ bool at_dyn(const at_k &a, uint32_t *first, uint32_t *npos,
					      uint32_t *chunk, uint32_t *n_chunks)
{
	uint32_t pos;

	if (!pos_ok(a.pos_at, a.n_ctx, NULL, &pos, false)) /* rope_store reports it */
		return false;
	*first = a.n_swa && pos + 1 > a.n_swa ? pos + 1 - a.n_swa : 0;
	*npos = pos + 1 - *first;
	at_split(*npos, a.max_chunks, chunk, n_chunks);
	return true;
}

/* a pair of F16 at element 2 * dp of a cache row; A4: the caches are 4-byte aligned */
template <bool A4>
static __device__ __forceinline__ uint32_t ld_pair(const unsigned short *row, uint32_t dp)
{
	if (A4)
		return __ldg((const uint32_t *)row + dp);
	return (uint32_t)__ldg(row + 2 * dp) | (uint32_t)__ldg(row + 2 * dp + 1) << 16;
}

/*
 * Block (chunk c, kv head g * n_slices + slice): query heads h0 .. h0 + nh
 * of kv head g over positions [p0, p1). Threads: scores, 8 lanes per
 * position; softmax, a warp per head; V, thread t owns dimension pair dp =
 * t % np and positions pl, pl + R, ... of each tile (pl = t / np, R =
 * AT_THREADS / np) for all nh heads, and the R partial sums are added at
 * the end in pl order.
 */
struct at_blk {
	int lane, warp;
	uint32_t hd, np;                /* head_dim, its F16 pairs */
	uint32_t h0, nh;                /* query heads h0 .. h0 + nh */
	uint32_t c, p0, p1;             /* chunk c: positions [p0, p1) */
	uint32_t n_chunks;              /* of this position */
	float *ml;
	bool skip;                      /* a graph's step: a chunk past them, or a bad position */
	const unsigned short *kc, *vc;  /* kv head g's columns of the caches */
	/* scores: this lane's position group (4 a warp step) and its pairs dp = sub + 8j */
	uint32_t sub, grp;
	/* V: this thread's pair and residue class of positions */
	uint32_t R, dpv, pl;
	bool vown;
};

/* The block's heads and positions, and this thread's share of each phase. */
static __device__ __forceinline__ at_blk at_block(const at_k &a)
{
	at_blk b;

	b.lane = threadIdx.x % WARP;
	b.warp = threadIdx.x / WARP;
	b.hd = a.hd;
	b.np = b.hd / 2;
	const uint32_t g = blockIdx.y / a.n_slices, slice = blockIdx.y % a.n_slices;
	b.h0 = g * a.group + slice * a.hb;
	b.nh = u32min(a.hb, a.group - slice * a.hb);
	b.c = blockIdx.x;
	uint32_t npos = a.npos, chunk = a.chunk, first = 0;

	b.n_chunks = a.n_chunks;
	b.ml = a.ml;
	b.skip = false;
	if (a.pos_at) {
		b.skip = !at_dyn(a, &first, &npos, &chunk, &b.n_chunks) || b.c >= b.n_chunks;
		b.ml = a.part + (uint64_t)a.n_head * b.n_chunks * a.hd;
	}
	b.p0 = b.c * chunk;
	b.p1 = u32min(npos, b.p0 + chunk);
	b.kc = a.kc + ((uint64_t)first * a.kv_stride + (uint64_t)g * b.hd);
	b.vc = a.vc + ((uint64_t)first * a.kv_stride + (uint64_t)g * b.hd);
	b.sub = b.lane % 8;
	b.grp = b.lane / 8;
	b.R = AT_THREADS / b.np;
	b.dpv = threadIdx.x % b.np;
	b.pl = threadIdx.x / b.np;
	b.vown = threadIdx.x < b.R * b.np;
	return b;
}

/* q into shared memory, rounded to F16 as the CPU has it; running max and sum cleared. */
static __device__ __forceinline__ void at_begin(const at_k &a, const at_blk &b,
						float (*qs)[AT_HD], float *mrun, float *lrun)
{
	for (uint32_t e = threadIdx.x; e < b.nh * b.hd; e += AT_THREADS) {
		const float v = a.q[(uint64_t)(b.h0 + e / b.hd) * b.hd + e % b.hd];

		/* the CPU rounds q to F16 for its K.q dot (attention.c, attend_row) */
		qs[e / b.hd][e % b.hd] = __half2float(__float2half_rn(v));
	}
	if (threadIdx.x < AT_HB) {
		mrun[threadIdx.x] = -INFINITY;
		lrun[threadIdx.x] = 0.0f;
	}
}

/* Scores of the tile's tn positions from t0 for every head; -inf past tn. */
template <bool A4>
static __device__ __forceinline__ void at_scores(const at_k &a, const at_blk &b, uint32_t t0,
						 uint32_t tn, const float (*qs)[AT_HD],
						 float (*sc)[AT_TILE])
{
	/* warp w, step s: position t0 + 8w + 4s + grp */
	uint32_t kr[2][AT_KJ];

#pragma unroll
	for (int s = 0; s < 2; s++) {
		const uint32_t i = AT_PW * b.warp + 4 * s + b.grp;
		const unsigned short *row = b.kc + (uint64_t)(t0 + i) * a.kv_stride;

#pragma unroll
		for (int j = 0; j < AT_KJ; j++) {
			const uint32_t dp = b.sub + 8 * j;

			kr[s][j] = i < tn && dp < b.np ? ld_pair<A4>(row, dp) : 0u;
		}
	}
	for (uint32_t hh = 0; hh < b.nh; hh++) {
#pragma unroll
		for (int s = 0; s < 2; s++) {
			const uint32_t i = AT_PW * b.warp + 4 * s + b.grp;
			float d = 0;

#pragma unroll
			for (int j = 0; j < AT_KJ; j++) {
				const uint32_t dp = b.sub + 8 * j;

				if (dp < b.np) {
					const float2 qv = *(const float2 *)&qs[hh][2 * dp];

					d = fmaf(f16_of(kr[s][j], 0), qv.x, d);
					d = fmaf(f16_of(kr[s][j], 1), qv.y, d);
				}
			}
			/* the 8 lanes of this position */
			d += __shfl_xor_sync(FULL, d, 4);
			d += __shfl_xor_sync(FULL, d, 2);
			d += __shfl_xor_sync(FULL, d, 1);
			if (b.sub == 0)
				sc[hh][i] = i < tn ? d * a.scale : -INFINITY;
		}
	}
}

/* Online softmax, warp hh for head hh, lane for positions lane and lane + 32: weights, alpha. */
static __device__ __forceinline__ void at_softmax(const at_blk &b, float (*sc)[AT_TILE],
						  float *alpha, float *mrun, float *lrun)
{
	if ((uint32_t)b.warp < b.nh) {
		const int hh = b.warp, lane = b.lane;
		const float s0 = sc[hh][lane], s1 = sc[hh][lane + WARP];
		const float m_old = mrun[hh];
		const float m_new = fmaxf(m_old, warp_max(fmaxf(s0, s1)));
		const float e0 = expf(s0 - m_new), e1 = expf(s1 - m_new);
		const float sum = warp_sum(e0 + e1);

		sc[hh][lane] = e0;
		sc[hh][lane + WARP] = e1;
		__syncwarp(); /* every lane has read mrun[hh] before lane 0 writes it */
		if (lane == 0) {
			/* m_old = -inf on the first tile: alpha = 0, nothing to rescale */
			const float al = expf(m_old - m_new);

			alpha[hh] = al;
			lrun[hh] = lrun[hh] * al + sum;
			mrun[hh] = m_new;
		}
	}
}

/* V: acc[hh] = acc[hh] * alpha[hh] + sum_p w[hh][p] V[p] over this thread's positions. */
template <bool A4>
static __device__ __forceinline__ void at_values(const at_k &a, const at_blk &b, uint32_t t0,
						 uint32_t tn, const float (*sc)[AT_TILE],
						 const float *alpha, float (&acc)[AT_HB][2])
{
	if (!b.vown)
		return;
#pragma unroll
	for (int u = 0; u < AT_HB; u++) {
		if ((uint32_t)u < b.nh) {
			acc[u][0] *= alpha[u];
			acc[u][1] *= alpha[u];
		}
	}
#pragma unroll 4
	for (uint32_t i = b.pl; i < tn; i += b.R) {
		const unsigned short *row = b.vc + (uint64_t)(t0 + i) * a.kv_stride;
		const uint32_t vp = ld_pair<A4>(row, b.dpv);
		const float v0 = f16_of(vp, 0), v1 = f16_of(vp, 1);

#pragma unroll
		for (int u = 0; u < AT_HB; u++) {
			if ((uint32_t)u < b.nh) {
				const float wgt = sc[u][i];

				acc[u][0] = fmaf(wgt, v0, acc[u][0]);
				acc[u][1] = fmaf(wgt, v1, acc[u][1]);
			}
		}
	}
}

/* The R partial sums, in pl order; then out, or the chunk's partial with its m and l. */
static __device__ __forceinline__ void at_end(const at_k &a, const at_blk &b, float *red,
					      const float *mrun, const float *lrun,
					      const float (&acc)[AT_HB][2])
{
	const uint32_t nh = b.nh, hd = b.hd;

	if (b.vown) {
#pragma unroll
		for (int u = 0; u < AT_HB; u++) {
			if ((uint32_t)u < nh) {
				float *r = &red[((uint64_t)b.pl * nh + u) * hd + 2 * b.dpv];

				r[0] = acc[u][0];
				r[1] = acc[u][1];
			}
		}
	}
	__syncthreads();
	for (uint32_t e = threadIdx.x; e < nh * hd; e += AT_THREADS) {
		const uint32_t hh = e / hd, d = e % hd, h = b.h0 + hh;
		float s = 0;

		for (uint32_t r = 0; r < b.R; r++)
			s += red[((uint64_t)r * nh + hh) * hd + d];
		if (b.n_chunks == 1) {
			a.out[(uint64_t)h * hd + d] = s * (1.0f / lrun[hh]);
		} else {
			const uint64_t pc = (uint64_t)h * b.n_chunks + b.c;

			a.part[pc * hd + d] = s;
			if (d == 0) {
				b.ml[2 * pc] = mrun[hh];
				b.ml[2 * pc + 1] = lrun[hh];
			}
		}
	}
}

template <bool A4>
static __global__ void __launch_bounds__(AT_THREADS) attn_part(const at_k a)
{
	__shared__ __align__(16) float qs[AT_HB][AT_HD];   /* q, rounded to F16 */
	__shared__ float sc[AT_HB][AT_TILE];               /* scores, then weights */
	__shared__ float alpha[AT_HB], mrun[AT_HB], lrun[AT_HB];
	__shared__ __align__(16) float red[AT_THREADS * 2 * AT_HB]; /* [R][nh][hd] */
	const at_blk b = at_block(a);
	float acc[AT_HB][2];

	if (b.skip) /* the whole block: its chunk is past this position's */
		return;
	at_begin(a, b, qs, mrun, lrun);
#pragma unroll
	for (int u = 0; u < AT_HB; u++)
		acc[u][0] = acc[u][1] = 0.0f;
	__syncthreads();
	for (uint32_t t0 = b.p0; t0 < b.p1; t0 += AT_TILE) {
		const uint32_t tn = u32min(AT_TILE, b.p1 - t0);

		at_scores<A4>(a, b, t0, tn, qs, sc);
		__syncthreads();
		at_softmax(b, sc, alpha, mrun, lrun);
		__syncthreads();
		at_values<A4>(a, b, t0, tn, sc, alpha, acc);
		__syncthreads(); /* sc and alpha are rewritten by the next tile */
	}
	at_end(a, b, red, mrun, lrun, acc);
}

/* ---- attention 3: the chunks' partials of each head merged ---------------------------- */

static __global__ void __launch_bounds__(AT_THREADS)
attn_combine(const float *__restrict__ part, const float *__restrict__ ml, float *out,
	     uint32_t hd, uint32_t n_chunks, const at_k dyn)
{
	__shared__ float wc[AT_MAX_CHUNKS];
	__shared__ float wred[AT_WARPS];
	__shared__ float mmax, linv;
	const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
	const uint32_t h = blockIdx.x;

	if (dyn.pos_at) { /* a graph's step: attn_part wrote out itself when one chunk did it */
		uint32_t first, npos, chunk;

		if (!at_dyn(dyn, &first, &npos, &chunk, &n_chunks) || n_chunks == 1)
			return;
		ml = part + (uint64_t)dyn.n_head * n_chunks * hd;
	}
	const float *m = ml + 2ull * h * n_chunks;
	const float *p = part + (uint64_t)h * n_chunks * hd;
	float v = -INFINITY;

	for (uint32_t c = threadIdx.x; c < n_chunks; c += AT_THREADS)
		v = fmaxf(v, m[2 * c]);
	v = warp_max(v);
	if (lane == 0)
		wred[warp] = v;
	__syncthreads();
	if (threadIdx.x == 0) {
		float mx = wred[0];

		for (int w = 1; w < AT_WARPS; w++)
			mx = fmaxf(mx, wred[w]);
		mmax = mx;
	}
	__syncthreads();
	/* the chunk weights, and l = sum l_c w_c in a fixed order (thread, warp, block) */
	v = 0;
	for (uint32_t c = threadIdx.x; c < n_chunks; c += AT_THREADS) {
		wc[c] = expf(m[2 * c] - mmax);
		v = fmaf(m[2 * c + 1], wc[c], v);
	}
	v = warp_sum(v);
	__syncthreads(); /* wred is reused */
	if (lane == 0)
		wred[warp] = v;
	__syncthreads();
	if (threadIdx.x == 0) {
		float l = 0;

		for (int w = 0; w < AT_WARPS; w++)
			l += wred[w];
		linv = 1.0f / l;
	}
	__syncthreads();
	for (uint32_t d = threadIdx.x; d < hd; d += AT_THREADS) {
		float s = 0;

		for (uint32_t c = 0; c < n_chunks; c++)
			s = fmaf(p[(uint64_t)c * hd + d], wc[c], s);
		out[(uint64_t)h * hd + d] = s * linv;
	}
}

/* ---- attention: host side ------------------------------------------------------------- */

struct at_plan {
	uint32_t group, hb, n_slices, chunk, n_chunks, max_chunks;
};

/*
 * attn_part blocks that fit on one multiprocessor (both variants; at most
 * AT_BLOCKS_PER_SM, the plan's aim). At 80 registers that is 3 on sm_90;
 * a min-blocks of 4 in its __launch_bounds__ makes ptxas spill, so the
 * grid follows the occupancy instead. The workspace (hyb_cuda_attn_work_bytes)
 * and the launch both come from attn_plan, so they agree.
 */
static uint32_t at_per_sm(void)
{
	static std::atomic<uint64_t> occ4{0}, occ2{0};
	const uint32_t a = hyb_occupancy(occ4, (const void *)attn_part<true>, AT_THREADS, 0);
	const uint32_t b = hyb_occupancy(occ2, (const void *)attn_part<false>, AT_THREADS, 0);

	return u32min(u32min(a, b), AT_BLOCKS_PER_SM);
}

static void attn_plan(uint32_t n_head, uint32_t n_head_kv, uint32_t npos, int n_sm,
		      struct at_plan *p)
{
	const uint32_t sms = (uint32_t)(n_sm > 0 ? n_sm : 1);
	uint32_t per_chunk;

	p->group = n_head / n_head_kv;
	p->hb = u32min(p->group, AT_HB);
	p->n_slices = (p->group + p->hb - 1) / p->hb;
	per_chunk = n_head_kv * p->n_slices;  /* blocks per chunk of positions */
	/* enough chunks for a full wave: every block that fits on every multiprocessor */
	p->max_chunks = u32min((at_per_sm() * sms + per_chunk - 1) / per_chunk, AT_MAX_CHUNKS);
	at_split(npos, p->max_chunks, &p->chunk, &p->n_chunks);
}

extern "C" uint64_t hyb_cuda_attn_work_bytes(uint32_t n_head, uint32_t n_head_kv,
					     uint32_t head_dim, int n_sm)
{
	struct at_plan p;

	if (!n_head || !n_head_kv || n_head % n_head_kv)
		return 0;
	attn_plan(n_head, n_head_kv, 1, n_sm, &p);
	return 4ull * n_head * p.max_chunks * (head_dim + 2);
}

extern "C" int hyb_cuda_attention(const struct hyb_cuda_attn *a, void *stream)
{
	const cudaStream_t s = (cudaStream_t)stream;
	const uint32_t hd = a->head_dim, kvs = a->n_head_kv * hd;
	const bool dyn = a->pos_at != NULL;
	/* a sliding window: the caches seen from row first on (a graph's step: the kernels' job) */
	const uint32_t first = dyn ? 0 : a->first;
	const unsigned short *kc0 = a->kcache + (uint64_t)first * kvs;
	const unsigned short *vc0 = a->vcache + (uint64_t)first * kvs;
	/* rows are 4-byte multiples (hd even): the window's first row keeps the base's alignment */
	const bool a4 = (uintptr_t)kc0 % 4 == 0 && (uintptr_t)vc0 % 4 == 0;
	struct at_plan p;
	rope_k r;
	at_k k;

	if (!a->n_head || !a->n_head_kv || a->n_head % a->n_head_kv || !hd || hd % 2 ||
	    hd > AT_HD || a->n_rot % 2 || a->n_rot > hd ||
	    ((uintptr_t)a->kcache | (uintptr_t)a->vcache) % 2)
		return -EINVAL;
	if (dyn ? !a->rope_tab || !a->n_ctx || !a->work : !a->rope || a->first > a->pos)
		return -EINVAL;
	attn_plan(a->n_head, a->n_head_kv, dyn ? 1 : a->pos + 1 - a->first, a->n_sm, &p);
	if (p.n_chunks > 1 && !a->work)
		return -EINVAL;
	memset(&r, 0, sizeof(r));
	r.q = a->q;
	r.k = a->k;
	r.v = a->v;
	r.kc = a->kcache + (dyn ? 0 : (uint64_t)a->pos * kvs);
	r.vc = a->vcache + (dyn ? 0 : (uint64_t)a->pos * kvs);
	r.n_head = a->n_head;
	r.hd = hd;
	r.n_rot = a->n_rot;
	r.neox = a->neox;
	r.q_scale = a->q_scale;
	if (dyn) {
		r.pos_at = a->pos_at;
		r.tab = a->rope_tab;
		r.kvs = kvs;
		r.n_ctx = a->n_ctx;
		r.bad = a->bad;
	} else {
		memcpy(r.cs, a->rope->cs, sizeof(r.cs));
		memcpy(r.sn, a->rope->sn, sizeof(r.sn));
	}
	rope_store<<<a->n_head + a->n_head_kv, 128, 0, s>>>(r);

	memset(&k, 0, sizeof(k));
	k.q = a->q;
	k.kc = kc0;
	k.vc = vc0;
	k.kv_stride = kvs;
	k.hd = hd;
	k.group = p.group;
	k.hb = p.hb;
	k.n_slices = p.n_slices;
	k.npos = dyn ? 0 : a->pos + 1 - a->first;
	k.chunk = p.chunk;
	k.n_chunks = p.n_chunks;
	k.scale = a->q_scale != 0.0f ? 1.0f : 1.0f / sqrtf((float)hd);
	k.out = a->out;
	k.part = (float *)a->work;
	k.ml = k.part + (uint64_t)a->n_head * p.n_chunks * hd;
	if (dyn) {
		k.pos_at = a->pos_at;
		k.n_ctx = a->n_ctx;
		k.n_swa = a->n_swa;
		k.max_chunks = p.max_chunks;
		k.n_head = a->n_head;
	}
	/* a graph's step: as many chunks as any position takes; the kernels skip the rest */
	const dim3 grid(dyn ? p.max_chunks : p.n_chunks, a->n_head_kv * p.n_slices);

	if (a4)
		attn_part<true><<<grid, AT_THREADS, 0, s>>>(k);
	else
		attn_part<false><<<grid, AT_THREADS, 0, s>>>(k);
	if (dyn || p.n_chunks > 1)
		attn_combine<<<a->n_head, AT_THREADS, 0, s>>>(k.part, k.ml, a->out, hd, p.n_chunks,
							       k);
	return (int)cudaGetLastError();
}
