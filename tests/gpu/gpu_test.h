/* SPDX-License-Identifier: MIT */
/*
 * What the GPU tests share: a seeded xorshift generator, the GPU check and
 * the device-memory ceiling their timings are held against.
 */
#ifndef HYB_GPU_TEST_H
#define HYB_GPU_TEST_H

#include <stdint.h>
#include <stdio.h>

#include <cuda_runtime.h>

#include "cuda_kernels.h"
#include "test.h"

/* One generator per test file (each test runs in its own process). */
static uint64_t gpu_rng_state = 88172645463325252ull;

static inline uint64_t rnd(void)
{
	gpu_rng_state ^= gpu_rng_state << 13;
	gpu_rng_state ^= gpu_rng_state >> 7;
	gpu_rng_state ^= gpu_rng_state << 17;
	return gpu_rng_state;
}

/* uniform in [-1, 1) */
static inline float rndf(void)
{
	return (float)((double)(rnd() >> 11) / (double)(1ull << 53) * 2 - 1);
}

static inline void need_gpu(void)
{
	if (hyb_cuda_device_count() == 0)
		SKIP("no CUDA device");
}

/*
 * For a figure of the hardware (bandwidth, latency, copies overtaking
 * copies): cudaemu, the host emulation `make test` runs these tests on
 * (docs/CUDAEMU.md), runs every stream in order at the host's speed.
 */
static inline void need_gpu_hardware(void)
{
#ifdef HYB_CUDAEMU
	SKIP("a measurement of the GPU: cudaemu runs every stream in order on the host");
#endif
	need_gpu();
}

/*
 * Device-memory bandwidth as a device-to-device copy of 1 GiB gets it,
 * bytes read plus bytes written, best of 5 after a warm-up, timed by
 * events: the ceiling the kernels' GB/s are shares of, measured in the
 * same run (the datasheet's peak is never reached). 0 if it failed.
 */
static inline double gpu_copy_gbps(void)
{
	const size_t n = 1ull << 30;
	cudaEvent_t a = NULL, b = NULL;
	void *src = NULL, *dst = NULL;
	double best = 0;
	float ms;

	if (cudaMalloc(&src, n) != cudaSuccess || cudaMalloc(&dst, n) != cudaSuccess ||
	    cudaMemset(src, 1, n) != cudaSuccess || cudaEventCreate(&a) != cudaSuccess ||
	    cudaEventCreate(&b) != cudaSuccess)
		goto out;
	for (int r = 0; r <= 5; r++) {
		if (cudaEventRecord(a, 0) != cudaSuccess ||
		    cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, 0) != cudaSuccess ||
		    cudaEventRecord(b, 0) != cudaSuccess || cudaEventSynchronize(b) != cudaSuccess ||
		    cudaEventElapsedTime(&ms, a, b) != cudaSuccess)
			break;
		if (r > 0 && ms > 0 && 2.0 * n / (ms * 1e-3) / 1e9 > best)
			best = 2.0 * n / (ms * 1e-3) / 1e9;
	}
out:
	if (a)
		cudaEventDestroy(a);
	if (b)
		cudaEventDestroy(b);
	cudaFree(src);
	cudaFree(dst);
	cudaGetLastError();
	printf("    device memory: %.0f GB/s by a 1 GiB device-to-device copy (read + written)\n",
	       best);
	return best;
}

#endif
