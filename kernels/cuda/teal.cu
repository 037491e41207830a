// SPDX-License-Identifier: MIT
/*
 * TEAL's input-sparse projection (docs/SPARSITY.md#teal, hyb/device.h
 * struct hyb_dev_teal): y = sum over inputs i with |x[i]| > thr of
 * x[i] * row_i, W transposed (a row of n_out elements per input). A decode
 * step's GEMV reads only the rows of its inputs above the threshold, which
 * is where TEAL's speed-up on a GPU comes from (TEAL, section 4.2). Up to
 * TEAL_ROWS rows of x go together (a prompt's, a pass's), each with its own
 * inputs, and read the union of theirs once:
 *
 *   1. select: one block lists the inputs above thr in any row, in
 *      increasing order (a ballot per warp, the warps' counts scanned), and
 *      each row's value of them, 0 where that row's is not above;
 *   2. part: a block per (tile of 256 outputs, split k of the list): each
 *      thread sums its output of every row over the split's inputs, in list
 *      order, in float (a row's 0s add nothing; the CPU device rounds the
 *      products to int8 where its level does: hyb/device.h says how far
 *      they agree); the list is staged in shared memory a chunk at a time;
 *   3. combine (several splits): y = the splits' sums in split order, so
 *      every run gives the same bits.
 *
 * The splits fill the GPU: a 4096-output projection is 16 tiles, so the
 * list is cut into enough splits for about two blocks a multiprocessor.
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <stdint.h>

#include "hyb/tensor_type.h"
#include "teal_cuda.h"

#define TILE 256      /* outputs a block */
#define SEL 1024      /* select's threads */
#define MAX_SPLITS 32
#define WARP 32
#define FULL 0xffffffffu

static __device__ __forceinline__ float f16_at(const uint8_t *p)
{
	return __half2float(__ushort_as_half(*(const unsigned short *)p));
}

/* Element o of a transposed row: the values the CPU's dequantizers give. */
template <uint32_t TY>
static __device__ __forceinline__ float w_at(const uint8_t *row, uint32_t o)
{
	if (TY == HYB_TYPE_F32)
		return ((const float *)row)[o];
	if (TY == HYB_TYPE_F16)
		return f16_at(row + 2ull * o);
	if (TY == HYB_TYPE_Q8_0) {
		const uint8_t *b = row + (o / 32) * 34ull;

		return f16_at(b) * (float)(int8_t)b[2 + o % 32];
	}
	/* Q4_0: element j < 16 the low nibble of byte j, else the high of byte j - 16 */
	const uint8_t *b = row + (o / 32) * 18ull;
	const uint32_t j = o % 32;
	const int q = j < 16 ? (b[2 + j] & 0xF) : (b[2 + j - 16] >> 4);

	return f16_at(b) * (float)(q - 8);
}

static __global__ void __launch_bounds__(SEL) teal_select(const float *__restrict__ x,
							   uint32_t n_in, uint32_t rows,
							   float thr, uint32_t *__restrict__ idx,
							   float *__restrict__ val,
							   uint32_t *__restrict__ count)
{
	__shared__ uint32_t warp_off[SEL / WARP];
	__shared__ uint32_t base, total;
	const uint32_t lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;

	if (threadIdx.x == 0)
		base = 0;
	__syncthreads();
	for (uint32_t i0 = 0; i0 < n_in; i0 += SEL) {
		const uint32_t i = i0 + threadIdx.x;
		uint32_t on = 0; /* bit r: row r's input i is above thr */

		for (uint32_t r = 0; i < n_in && r < rows; r++)
			on |= (uint32_t)(fabsf(x[(uint64_t)r * n_in + i]) > thr) << r;
		const uint32_t mask = __ballot_sync(FULL, on != 0);

		if (lane == 0)
			warp_off[warp] = __popc(mask);
		__syncthreads();
		if (warp == 0) {
			/* exclusive scan of the warps' counts */
			const uint32_t c = warp_off[lane];
			uint32_t s = c;

			for (int d = 1; d < WARP; d <<= 1) {
				const uint32_t t = __shfl_up_sync(FULL, s, d);

				if ((int)lane >= d)
					s += t;
			}
			warp_off[lane] = s - c;
			if (lane == WARP - 1)
				total = s;
		}
		__syncthreads();
		if (on) {
			const uint32_t at = base + warp_off[warp] + __popc(mask & ((1u << lane) - 1));

			idx[at] = i;
			for (uint32_t r = 0; r < rows; r++)
				val[(uint64_t)r * n_in + at] =
					on >> r & 1 ? x[(uint64_t)r * n_in + i] : 0.0f;
		}
		__syncthreads();
		if (threadIdx.x == 0)
			base += total;
		__syncthreads();
	}
	if (threadIdx.x == 0)
		*count = base;
}

/* RM: the rows a thread keeps sums for (1, or TEAL_ROWS for a batch of up to that) */
template <uint32_t TY, uint32_t RM>
static __global__ void __launch_bounds__(TILE) teal_part(const uint8_t *__restrict__ w,
							  uint64_t row_bytes, uint32_t n_in,
							  uint32_t n_out, uint32_t rows,
							  const uint32_t *__restrict__ idx,
							  const float *__restrict__ val,
							  const uint32_t *__restrict__ count,
							  uint32_t n_splits, float *__restrict__ out)
{
	__shared__ uint32_t si[TILE];
	__shared__ float sv[RM][TILE];
	const uint32_t o = blockIdx.x * TILE + threadIdx.x, k = blockIdx.y, n = *count;
	const uint32_t a0 = (uint32_t)((uint64_t)n * k / n_splits);
	const uint32_t a1 = (uint32_t)((uint64_t)n * (k + 1) / n_splits);
	float acc[RM];

#pragma unroll
	for (uint32_t r = 0; r < RM; r++)
		acc[r] = 0.0f;
	for (uint32_t c0 = a0; c0 < a1; c0 += TILE) {
		const uint32_t m = a1 - c0 < TILE ? a1 - c0 : TILE;

		__syncthreads(); /* the last chunk's readers are done */
		if (threadIdx.x < m) {
			si[threadIdx.x] = idx[c0 + threadIdx.x];
#pragma unroll
			for (uint32_t r = 0; r < RM; r++)
				sv[r][threadIdx.x] =
					r < rows ? val[(uint64_t)r * n_in + c0 + threadIdx.x] : 0.0f;
		}
		__syncthreads();
		if (o < n_out)
			for (uint32_t j = 0; j < m; j++) {
				const float wv = w_at<TY>(w + si[j] * row_bytes, o);

#pragma unroll
				for (uint32_t r = 0; r < RM; r++)
					acc[r] = fmaf(sv[r][j], wv, acc[r]);
			}
	}
	for (uint32_t r = 0; o < n_out && r < rows && r < RM; r++)
		out[((uint64_t)k * rows + r) * n_out + o] = acc[r];
}

static __global__ void teal_combine(const float *__restrict__ part, uint32_t n_out,
				    uint32_t rows, uint32_t n_splits, float *__restrict__ y)
{
	const uint32_t o = blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y;
	float s = 0.0f;

	if (o >= n_out)
		return;
	for (uint32_t k = 0; k < n_splits; k++)
		s += part[((uint64_t)k * rows + r) * n_out + o];
	y[(uint64_t)r * n_out + o] = s;
}

static uint32_t splits(uint32_t n_in, uint32_t n_out, int n_sm)
{
	const uint32_t tiles = (n_out + TILE - 1) / TILE;
	uint32_t k = (2u * (uint32_t)(n_sm > 0 ? n_sm : 1) + tiles - 1) / tiles;

	k = k < MAX_SPLITS ? k : MAX_SPLITS;
	/* at least a chunk of inputs a split */
	k = k < (n_in + TILE - 1) / TILE ? k : (n_in + TILE - 1) / TILE;
	return k ? k : 1;
}

static uint64_t al256(uint64_t b)
{
	return (b + 255) & ~255ull;
}

extern "C" uint64_t hyb_cuda_teal_work_bytes(uint32_t n_in, uint32_t n_out, uint32_t rows,
					     int n_sm)
{
	const uint32_t k = splits(n_in, n_out, n_sm);

	return al256(4ull * n_in) + al256(4ull * rows * n_in) + 256 +
	       (k > 1 ? al256(4ull * k * rows * n_out) : 0);
}

template <uint32_t TY, uint32_t RM>
static void part(const struct hyb_cuda_teal *t, const uint32_t *idx, const float *val,
		 const uint32_t *count, uint32_t k, float *out, cudaStream_t s)
{
	const dim3 grid((t->n_out + TILE - 1) / TILE, k);

	teal_part<TY, RM><<<grid, TILE, 0, s>>>((const uint8_t *)t->w, t->row_bytes, t->n_in,
						 t->n_out, t->rows, idx, val, count, k, out);
}

template <uint32_t TY>
static void part_rows(const struct hyb_cuda_teal *t, const uint32_t *idx, const float *val,
		      const uint32_t *count, uint32_t k, float *out, cudaStream_t s)
{
	if (t->rows == 1)
		part<TY, 1>(t, idx, val, count, k, out, s);
	else
		part<TY, HYB_CUDA_TEAL_ROWS>(t, idx, val, count, k, out, s);
}

extern "C" int hyb_cuda_teal(const struct hyb_cuda_teal *t, void *stream)
{
	const cudaStream_t s = (cudaStream_t)stream;
	const uint32_t k = splits(t->n_in, t->n_out, t->n_sm);
	uint8_t *ws = (uint8_t *)t->work;
	uint32_t *idx = (uint32_t *)ws;
	float *val = (float *)(ws + al256(4ull * t->n_in));
	uint32_t *count = (uint32_t *)(ws + al256(4ull * t->n_in) + al256(4ull * t->rows * t->n_in));
	float *out = k > 1 ? (float *)((uint8_t *)count + 256) : t->y;

	if (!t->work || !t->n_in || !t->n_out || !t->rows || t->rows > HYB_CUDA_TEAL_ROWS)
		return -EINVAL;
	teal_select<<<1, SEL, 0, s>>>(t->x, t->n_in, t->rows, t->thr, idx, val, count);
	switch (t->type) {
	case HYB_TYPE_F32:
		part_rows<HYB_TYPE_F32>(t, idx, val, count, k, out, s);
		break;
	case HYB_TYPE_F16:
		part_rows<HYB_TYPE_F16>(t, idx, val, count, k, out, s);
		break;
	case HYB_TYPE_Q8_0:
		part_rows<HYB_TYPE_Q8_0>(t, idx, val, count, k, out, s);
		break;
	case HYB_TYPE_Q4_0:
		part_rows<HYB_TYPE_Q4_0>(t, idx, val, count, k, out, s);
		break;
	default:
		return -EINVAL;
	}
	if (k > 1)
		teal_combine<<<dim3((t->n_out + TILE - 1) / TILE, t->rows), TILE, 0, s>>>(
			out, t->n_out, t->rows, k, t->y);
	return (int)cudaGetLastError();
}
