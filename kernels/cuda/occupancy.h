/* SPDX-License-Identifier: MIT */
/*
 * Blocks of a kernel that fit on one multiprocessor, from the occupancy API
 * (registers, shared memory, threads), so a grid sized "k blocks per SM"
 * never lands one block past a cliff (a fourth block that does not fit
 * makes a second, nearly empty wave). C++ (CUDA) only: a memo per kernel,
 * filled at its first launch, keeps the query off the decode path.
 */
#ifndef HYB_CUDA_OCCUPANCY_H
#define HYB_CUDA_OCCUPANCY_H

#include <atomic>
#include <cstdint>

#include <cuda_runtime.h>

/* memo: 0, or (smem + 1) << 32 | blocks, for the last smem asked about */
static inline uint32_t hyb_occupancy(std::atomic<uint64_t> &memo, const void *kernel,
				     int threads, uint32_t smem)
{
	const uint64_t v = memo.load(std::memory_order_relaxed);
	int n = 0;

	if (v >> 32 == (uint64_t)smem + 1)
		return (uint32_t)v;
	if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem) !=
	    cudaSuccess || n < 1) {
		cudaGetLastError();
		n = 1;
	}
	memo.store(((uint64_t)smem + 1) << 32 | (uint32_t)n, std::memory_order_relaxed);
	return (uint32_t)n;
}

#endif
