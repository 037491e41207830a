// SPDX-License-Identifier: MIT
/*
 * Dequantizing GEMV for decode: one warp per output row, each lane walking
 * every 32nd block of the row, partial sums reduced with shuffles. The
 * weights are read once, coalesced per block; x is read through the
 * read-only cache (it is shared by all rows).
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cuda_kernels.h"
#include "hyb/tensor_type.h"

#define WARP 32
#define ROWS_PER_BLOCK 4

struct __align__(2) blk_q8_0 {
	__half d;
	int8_t qs[32];
};

struct __align__(2) blk_q4_0 {
	__half d;
	uint8_t qs[16];
};

static __device__ __forceinline__ float warp_sum(float v)
{
	for (int o = WARP / 2; o > 0; o /= 2)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

static __global__ void gemv_q8_0(const char *w, size_t row_bytes, int64_t k, int64_t nrows,
				 const float *__restrict__ x, float *__restrict__ y)
{
	int64_t row = (int64_t)blockIdx.x * ROWS_PER_BLOCK + threadIdx.y;
	float acc = 0;

	if (row >= nrows)
		return;
	const blk_q8_0 *b = (const blk_q8_0 *)(w + row * row_bytes);
	for (int64_t i = threadIdx.x; i < k / 32; i += WARP) {
		const float *xb = x + i * 32;
		float s = 0;

		for (int j = 0; j < 32; j++)
			s += b[i].qs[j] * __ldg(&xb[j]);
		acc += s * __half2float(b[i].d);
	}
	acc = warp_sum(acc);
	if (threadIdx.x == 0)
		y[row] = acc;
}

static __global__ void gemv_q4_0(const char *w, size_t row_bytes, int64_t k, int64_t nrows,
				 const float *__restrict__ x, float *__restrict__ y)
{
	int64_t row = (int64_t)blockIdx.x * ROWS_PER_BLOCK + threadIdx.y;
	float acc = 0;

	if (row >= nrows)
		return;
	const blk_q4_0 *b = (const blk_q4_0 *)(w + row * row_bytes);
	for (int64_t i = threadIdx.x; i < k / 32; i += WARP) {
		const float *xb = x + i * 32;
		float s = 0;

		/* low nibbles are elements 0..15, high nibbles 16..31, both offset by 8 */
		for (int j = 0; j < 16; j++) {
			s += ((b[i].qs[j] & 0x0f) - 8) * __ldg(&xb[j]);
			s += ((b[i].qs[j] >> 4) - 8) * __ldg(&xb[j + 16]);
		}
		acc += s * __half2float(b[i].d);
	}
	acc = warp_sum(acc);
	if (threadIdx.x == 0)
		y[row] = acc;
}

static __global__ void gemv_f16(const char *w, size_t row_bytes, int64_t k, int64_t nrows,
				const float *__restrict__ x, float *__restrict__ y)
{
	int64_t row = (int64_t)blockIdx.x * ROWS_PER_BLOCK + threadIdx.y;
	float acc = 0;

	if (row >= nrows)
		return;
	const __half *r = (const __half *)(w + row * row_bytes);
	for (int64_t i = threadIdx.x; i < k; i += WARP)
		acc += __half2float(r[i]) * __ldg(&x[i]);
	acc = warp_sum(acc);
	if (threadIdx.x == 0)
		y[row] = acc;
}

extern "C" int hyb_cuda_gemv(uint32_t type, const void *w, size_t row_bytes, int64_t k,
			     int64_t nrows, const float *x, float *y, void *stream)
{
	dim3 block(WARP, ROWS_PER_BLOCK);
	dim3 grid((unsigned)((nrows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK));
	cudaStream_t s = (cudaStream_t)stream;

	if (k <= 0 || nrows <= 0 || row_bytes != hyb_row_bytes(type, (uint64_t)k))
		return -1;
	switch (type) {
	case HYB_TYPE_Q8_0:
		gemv_q8_0<<<grid, block, 0, s>>>((const char *)w, row_bytes, k, nrows, x, y);
		break;
	case HYB_TYPE_Q4_0:
		gemv_q4_0<<<grid, block, 0, s>>>((const char *)w, row_bytes, k, nrows, x, y);
		break;
	case HYB_TYPE_F16:
		gemv_f16<<<grid, block, 0, s>>>((const char *)w, row_bytes, k, nrows, x, y);
		break;
	default:
		return -1;
	}
	return (int)cudaGetLastError();
}

extern "C" int hyb_cuda_device_count(void)
{
	int n = 0;

	if (cudaGetDeviceCount(&n) != cudaSuccess)
		return 0;
	return n;
}
