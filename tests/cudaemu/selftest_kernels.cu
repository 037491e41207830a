// SPDX-License-Identifier: MIT
/* Kernels that test cudaemu itself (test_cudaemu.c): CUDA's semantics, not hyb's. */
#include <cuda_runtime.h>

#include "selftest.h"

static __global__ void reverse_kernel(const int *in, int *out, int n, bool barrier)
{
	__shared__ int s[1024];
	const int t = threadIdx.x;

	s[t] = in[blockIdx.x * n + t];
	if (barrier)
		__syncthreads();
	out[blockIdx.x * n + t] = s[n - 1 - t];
}

extern "C" int emu_reverse(const int *in, int *out, int n, int blocks, int barrier)
{
	reverse_kernel<<<blocks, n>>>(in, out, n, barrier != 0);
	return cudaGetLastError();
}

static __global__ void warp_ops_kernel(int *out)
{
	const unsigned full = 0xffffffffu;
	const int lane = threadIdx.x % 32;
	int *o = out + threadIdx.x * 6;
	int v = lane;

	o[0] = __shfl_xor_sync(full, lane, 5);
	o[1] = __shfl_up_sync(full, lane, 3);
	o[2] = __shfl_down_sync(full, lane, 3, 16);
	o[3] = __shfl_sync(full, lane * 10, 7, 8);
	o[4] = (int)__ballot_sync(full, (lane + threadIdx.x / 32) & 1);
	for (int d = 16; d > 0; d /= 2)
		v += __shfl_xor_sync(full, v, d);
	o[5] = v;
}

extern "C" int emu_warp_ops(int *out)
{
	warp_ops_kernel<<<1, 64>>>(out);
	return cudaGetLastError();
}

static __global__ void divergent_kernel(int *out)
{
	if (threadIdx.x % 32 < 16)
		out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (int)threadIdx.x, 1);
}

extern "C" int emu_divergent_shuffle(int *out)
{
	divergent_kernel<<<1, 32>>>(out);
	return cudaGetLastError();
}

static __global__ void deadlock_kernel(void)
{
	if (threadIdx.x == 0)
		__syncthreads();
	else
		__syncwarp();
}

extern "C" int emu_deadlock(void)
{
	deadlock_kernel<<<1, 32>>>();
	return cudaGetLastError();
}

static __global__ void dyn_smem_kernel(int *out)
{
	extern __shared__ int dyn[];

	dyn[threadIdx.x] = (int)threadIdx.x;
	__syncthreads();
	out[threadIdx.x] = dyn[blockDim.x - 1 - threadIdx.x];
}

extern "C" int emu_dyn_smem(int *out, size_t smem, int set_attr)
{
	if (set_attr && cudaFuncSetAttribute(dyn_smem_kernel,
					     cudaFuncAttributeMaxDynamicSharedMemorySize,
					     (int)smem) != cudaSuccess)
		return cudaGetLastError();
	dyn_smem_kernel<<<1, 32, smem>>>(out);
	return cudaGetLastError();
}

static __global__ void empty_kernel(void)
{
}

extern "C" int emu_launch_shape(unsigned gx, unsigned gy, unsigned bx, unsigned by, unsigned bz)
{
	empty_kernel<<<dim3(gx, gy), dim3(bx, by, bz)>>>();
	return cudaGetLastError();
}

static __global__ void past_end_kernel(int *p, int n)
{
	p[n + threadIdx.x * 1024] = 1; /* thread 1 writes 4 KiB past the end */
}

extern "C" int emu_write_past_end(int *p, int n)
{
	past_end_kernel<<<1, 2>>>(p, n);
	return cudaGetLastError();
}

static __global__ void axpb_kernel(const int *x, int *y, int n, int a, int b)
{
	const int i = blockIdx.x * blockDim.x + threadIdx.x;

	if (i < n)
		y[i] = a * x[i] + b;
}

/* its arguments die with this call: a captured launch must keep its own */
extern "C" int emu_axpb(const int *x, int *y, int n, int a, int b, cudaStream_t s)
{
	axpb_kernel<<<(n + 63) / 64, 64, 0, s>>>(x, y, n, a, b);
	return cudaGetLastError();
}
