/* SPDX-License-Identifier: MIT */
/*
 * and_popcount (cpu_kernels.h) a word at a time: the scalar level's, and
 * the AVX2 level's built with -mpopcnt so __builtin_popcountll is one
 * instruction rather than a libgcc call.
 */
#ifndef HYB_POPCOUNT_COMMON_H
#define HYB_POPCOUNT_COMMON_H

#include "cpu_internal.h"

static inline void and_popcount_words(const uint64_t *a, const uint64_t *cols, uint32_t W,
				      const uint32_t *live, uint32_t n, uint32_t *out)
{
	for (uint32_t j = 0; j < n; j++) {
		const uint64_t *b = cols + (size_t)live[j] * W;
		uint64_t c = 0;

		for (uint32_t w = 0; w < W; w++)
			c += (uint64_t)__builtin_popcountll(a[w] & b[w]);
		out[j] = (uint32_t)c;
	}
}

#endif
