/* SPDX-License-Identifier: MIT */
/*
 * Hybrid decoding of a plain model: one in its own layout, with dense FFNs
 * (neither a plan's bundles nor a mixture's experts; docs/HYBRID.md "Plain
 * models"). Nothing in it can be cut finer than a layer's parts, so the
 * placement is static: the attention blocks (weights, norms, KV cache) and
 * the head go to the device as dense.c places them, then whole FFNs, in
 * layer order, while the budget lasts (PowerInfer 5.3's order: every byte
 * of these parts is read every token); the "layer" policy places whole
 * layers in order instead, then the head (llama.cpp's -ngl). The CPU runs
 * the rest with the context's own code, so TEAL thresholds cut its reads
 * (docs/SPARSITY.md#teal: TEAL's inputs have no hot rows to place, so the
 * split can be this static one); the device's parts run dense.
 */
#ifndef HYB_PLAIN_HYBRID_H
#define HYB_PLAIN_HYBRID_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hyb/device.h"
#include "hyb/hybrid.h"

struct hyb_ctx;
struct hyb_hdense;
struct hyb_hdense_batch;
struct hyb_plain_hybrid;

/*
 * NULL with a one-line reason in err: not a plain model, the device not
 * opening, a budget that holds no part, device memory failing. n_rows: 1
 * (one sequence), or a pass's rows with several sequences: they attend on
 * the CPU, and the budget is whole FFNs' (hyb_plain_hybrid_ffn_rows).
 */
struct hyb_plain_hybrid *hyb_plain_hybrid_new(const struct hyb_model *m,
					      const struct hyb_hybrid_params *p, uint32_t n_ctx,
					      uint32_t n_rows, char *err, size_t errlen);
void hyb_plain_hybrid_free(struct hyb_plain_hybrid *h);

struct hyb_device *hyb_plain_hybrid_device(const struct hyb_plain_hybrid *h);
void hyb_plain_hybrid_stats(const struct hyb_plain_hybrid *h, struct hyb_hybrid_stats *out);
void hyb_plain_hybrid_stats_reset(struct hyb_plain_hybrid *h);
void hyb_plain_hybrid_offload(const struct hyb_plain_hybrid *h, struct hyb_hybrid_offload *out);

/*
 * TEAL's thresholds on the device's FFNs too (docs/SPARSITY.md#teal): their
 * weights replaced by TEAL's transposed ones (t: the context's layout, thr:
 * [n_layer][HYB_TEAL_INPUTS]), each decode row's FFN then reading only the
 * rows of its inputs above the thresholds (hyb_device_teal_matvec), a
 * prompt's rows each with their own; t or thr NULL: the model's weights
 * again.
 * 0, or -errno with the message (the context is then lost).
 */
struct hyb_teal;
int hyb_plain_hybrid_set_teal(struct hyb_plain_hybrid *h, const struct hyb_teal *t,
			      const float *thr);

/* What plain_decode.c drives: dense.c's parts (NULL: none placed), and the FFNs. */
struct hyb_hdense *hyb_plain_hybrid_dense(const struct hyb_plain_hybrid *h);
bool hyb_plain_hybrid_ffn_on(const struct hyb_plain_hybrid *h, uint32_t l);
/*
 * Queue layer l's FFN on COMPUTE: over xn (n_embd floats, sent up first),
 * or with xn NULL over dense.c's device xn (its attention block ran there).
 */
int hyb_plain_hybrid_ffn_queue(struct hyb_plain_hybrid *h, uint32_t l, const float *xn);
/* Its output (n_embd floats) into y, waited for (Gemma's norm after it not taken). */
int hyb_plain_hybrid_ffn_out(struct hyb_plain_hybrid *h, float *y);
/*
 * Or x += its output on the device (COMPUTE), normed first where the model
 * has a norm after the FFN (Gemma): the residual stream stays there.
 */
int hyb_plain_hybrid_ffn_add(struct hyb_plain_hybrid *h, hyb_dptr x);
/*
 * Layer l's FFN over the n rows of a pass of several sequences (xn: n rows of
 * n_embd floats) into y, waited for: each row the one-token kernels' result,
 * so a row's sums do not depend on its batch. 0, or -errno with the message.
 */
int hyb_plain_hybrid_ffn_rows(struct hyb_plain_hybrid *h, uint32_t l, const float *xn,
			      uint32_t n, float *y);
/*
 * A prompt's batch on the device (plain_prefill.c): its rows (0: prompts
 * run on the CPU; what the placement left of the budget, docs/HYBRID.md
 * "Plain models"), and its buffers: x, xn, q, k, v, att for dense.c's
 * batched attention block, the FFN reading xn.
 */
uint32_t hyb_plain_hybrid_prompt_cap(const struct hyb_plain_hybrid *h);
const struct hyb_hdense_batch *hyb_plain_hybrid_prompt_bufs(const struct hyb_plain_hybrid *h);
/* n rows of n_embd floats up into dst (COMPUTE waits), or down from src (waited for). */
int hyb_plain_hybrid_rows_up(struct hyb_plain_hybrid *h, hyb_dptr dst, const float *src,
			     uint32_t n);
int hyb_plain_hybrid_rows_down(struct hyb_plain_hybrid *h, float *dst, hyb_dptr src,
			       uint32_t n);
/*
 * Layer l's FFN (on the device) over the batch's n rows of xn, queued on
 * COMPUTE into *y; with add, y normed first where the model has a norm
 * after the FFN (Gemma), then added to the batch's x.
 */
int hyb_plain_hybrid_ffn_batch(struct hyb_plain_hybrid *h, uint32_t l, uint32_t n, bool add,
			       hyb_dptr *y);
/* A prompt batch ran (hyb_hybrid_stats.prompt_batches). */
void hyb_plain_hybrid_prompt_done(struct hyb_plain_hybrid *h);
/*
 * At a decode step's end, all its device work done: its host seconds
 * (attention blocks, FFNs, of those the CPU's, head), and the device FFNs'
 * kernel time.
 */
void hyb_plain_hybrid_add_time(struct hyb_plain_hybrid *h, double attn_s, double ffn_s,
			       double cpu_ffn_s, double head_s);

/*
 * The context's decode step (plain_decode.c): one token through every
 * layer, each part where it was placed; logits[n_vocab]. 0, or -1 with err.
 */
int hyb_plain_decode(struct hyb_ctx *c, int32_t token, float *logits, char *err,
		     size_t errlen);
/*
 * A prompt of n tokens with a batch on the device (hyb_plain_hybrid_prompt_cap
 * > 0), in pieces of its rows: each part where it was placed, the rows
 * moving between host and device as the parts need them; logits as
 * hyb_ctx_eval's (every row's, or the last's). 0, or -1 with err.
 */
int hyb_plain_prefill(struct hyb_ctx *c, const int32_t *tokens, uint32_t n, float *logits,
		      bool all_logits, char *err, size_t errlen);
/* Before a prompt pass on the CPU: the rows decoded on the device to the host's KV cache. */
int hyb_plain_decode_kv_to_host(struct hyb_ctx *c, char *err, size_t errlen);
/* After it: the host wrote rows up to n_past. */
void hyb_plain_decode_kv_host_wrote(struct hyb_ctx *c);
/* The context was reset. */
void hyb_plain_decode_reset(struct hyb_ctx *c);

#endif
