/* SPDX-License-Identifier: MIT */
/* Causal attention of a batch of query tokens over the F16 KV cache. */
#ifndef HYB_ATTENTION_H
#define HYB_ATTENTION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cpu_kernels.h"

/* One layer's attention for a batch of n_tokens tokens at positions n_past.. */
struct hyb_attn {
	const struct hyb_cpu_kernels *k;
	const float *q;           /* token t, head h at q + t * q_stride + h * hd */
	float *out;               /* token t, head h at out + t * out_stride + h * hd_v */
	const uint16_t *kc, *vc;  /* position p, kv head g at kc + p * kv_stride + g * hd,
				   * vc + p * v_stride + g * hd_v */
	size_t q_stride, kv_stride, out_stride, v_stride;
	/* K and V widths: V narrower than K where it is a view of the K cache
	 * (DeepSeek's latent attention, attention_mla.c). 0 in hd_v, out_stride
	 * and v_stride: hd, q_stride and kv_stride. */
	uint32_t hd, hd_v, n_head, n_head_kv;
	uint32_t n_tokens, n_past;
	uint32_t n_ctx;           /* positions the cache holds */
	/*
	 * llama.cpp's thread count: for a single token over 512+ (padded)
	 * cache positions it splits the positions between its threads and
	 * merges their partial softmaxes, so its result depends on it.
	 */
	int n_split;
	float scale;
	/* a sliding-window layer: a query at p sees p - n_swa + 1 .. p (0: all) */
	uint32_t n_swa;
	/* a logit per head that joins every softmax with no value (gpt-oss's
	 * attention sinks); NULL: none */
	const float *sinks;
	/*
	 * A paged cache (kv_pages.h): position p is cache row
	 * blocks[p / HYB_KV_BLOCK] * HYB_KV_BLOCK + p % HYB_KV_BLOCK. NULL: row p.
	 */
	const uint32_t *blocks;
	/* PowerInfer's late-2023 ggml instead of llama.cpp's flash attention
	 * (a PowerInfer file, attention.c); its scratch: hyb_attend_tmp_bytes */
	bool ggml23;
};

/* Positions per block of a paged KV cache: vLLM's default (PagedAttention 4.2). */
#define HYB_KV_BLOCK_SHIFT 4
#define HYB_KV_BLOCK (1u << HYB_KV_BLOCK_SHIFT)

/* The cache row that holds position p under a block table (NULL: contiguous). */
static inline size_t hyb_kv_row(const uint32_t *blocks, uint32_t p)
{
	if (!blocks)
		return p;
	return ((size_t)blocks[p >> HYB_KV_BLOCK_SHIFT] << HYB_KV_BLOCK_SHIFT) |
	       (p & (HYB_KV_BLOCK - 1));
}

/* Scratch bytes one worker needs for head dimension hd; n_ctx_ggml23: the
 * context size where ggml23 runs are attended, else 0. */
size_t hyb_attend_tmp_bytes(uint32_t hd, uint32_t n_ctx_ggml23);
/* Independent jobs of a batch: split them between threads in any way. */
long hyb_attend_jobs(const struct hyb_attn *a);
/* Run jobs [lo, hi) with this worker's scratch. */
void hyb_attend_run(const struct hyb_attn *a, long lo, long hi, void *tmp);

#endif
