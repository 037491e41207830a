/* SPDX-License-Identifier: MIT */
/*
 * One decoded token of a hybrid context (hyb/hybrid.h): the layer loop that
 * runs each part where the placement put it and moves the residual stream
 * between the host and the device as it goes; and a prompt batch with its
 * dense parts on the device. forward.c calls them for hybrid contexts, and
 * the KV hooks around the prompt batches it runs on the CPU (prefill_cpu).
 */
#ifndef HYB_HYBRID_DECODE_H
#define HYB_HYBRID_DECODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct hyb_ctx;

/* logits[n_vocab] of token at position n_past; n_past advances. 0 or -1 with err. */
int hyb_decode_hybrid(struct hyb_ctx *c, int32_t token, float *logits, char *err,
		      size_t errlen);
/*
 * A prompt batch of n tokens at n_past with the placed attention blocks and
 * head on the device (hyb_ffn_hybrid_prefill_on_device); logits as
 * hyb_ctx_eval's. n_past advances. 0 or -1 with err.
 */
int hyb_prefill_hybrid(struct hyb_ctx *c, const int32_t *tokens, uint32_t n, float *logits,
		       bool all_logits, char *err, size_t errlen);
/*
 * A pass of several sequences (c->runs, hyb_ctx_eval_seqs) through a hybrid
 * context, docs/HYBRID.md "Several sequences": logits row i for pass row
 * out[i]. 0 or -1 with err.
 */
int hyb_decode_hybrid_runs(struct hyb_ctx *c, const int32_t *tokens, uint32_t n,
			   const uint32_t *out, uint32_t n_out, float *logits, char *err,
			   size_t errlen);
/* Before the CPU processes a batch: rows only the device holds come back. */
int hyb_decode_hybrid_kv_to_host(struct hyb_ctx *c, char *err, size_t errlen);
/* After it: the host holds every row up to n_past. */
void hyb_decode_hybrid_kv_host_wrote(struct hyb_ctx *c);
/* The context was reset. */
void hyb_decode_hybrid_reset(struct hyb_ctx *c);

#endif
