/* SPDX-License-Identifier: MIT */
/* Attention for one query vector over the F16 KV cache. */
#ifndef HYB_ATTENTION_H
#define HYB_ATTENTION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cpu_kernels.h"

/* Scratch bytes hyb_attend needs per thread for head dimension hd. */
static inline size_t hyb_attend_tmp_bytes(uint32_t hd)
{
	return 12 * (size_t)hd + 64;
}

/*
 * out[hd] = softmax(K q * scale) V over n_kv cached positions; K and V rows
 * are F16 with `stride` elements between positions. f16 selects llama.cpp's
 * small-batch arithmetic (see attention.c).
 */
void hyb_attend(const struct hyb_cpu_kernels *k, const float *q, const uint16_t *kc,
		const uint16_t *vc, size_t stride, uint32_t hd, uint32_t n_kv, float scale,
		bool f16, void *tmp, float *out);

#endif
