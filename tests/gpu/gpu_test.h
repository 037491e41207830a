/* SPDX-License-Identifier: MIT */
/* What the GPU tests share: a seeded xorshift generator and the GPU check. */
#ifndef HYB_GPU_TEST_H
#define HYB_GPU_TEST_H

#include <stdint.h>

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

#endif
