/* SPDX-License-Identifier: MIT */
/*
 * The dense part of a hybrid model in device memory (PowerInfer 5.3 keeps
 * attention and the head on the GPU): per placed layer
 * the attention block's weights, its norms and its KV cache; the head; and
 * the residual stream's device copy. libhyb/hybrid/decode.c queues the
 * work; this file owns the bytes, the placement arithmetic and the KV
 * cache's two copies.
 *
 * KV cache. A placed layer's cache lives on both sides: prompts processed on
 * the CPU (prefill_cpu) land in the host cache, decoded tokens and prompts
 * run on the device in the device cache. Each side has a watermark, the
 * rows it holds; before a side reads a layer it is brought up to date by
 * one copy of the rows it lacks (rows are contiguous per layer).
 */
#ifndef HYB_HYBRID_DENSE_H
#define HYB_HYBRID_DENSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hyb/device.h"
#include "hyb/model.h"

struct hyb_hdense;

/* Device bytes of layer l's attention block (weights, norms, KV of n_ctx rows); 0: its
 * types cannot run on the device. */
uint64_t hyb_hdense_layer_bytes(const struct hyb_model *m, uint32_t l, uint32_t n_ctx);
/* Device bytes of the head (out_norm, output); 0: not supported. */
uint64_t hyb_hdense_head_bytes(const struct hyb_model *m);
/* Device bytes of layer l's activation predictor (fc1, fc2, biases); 0: not F16. */
uint64_t hyb_hdense_pred_bytes(const struct hyb_model *m, uint32_t l);
/* Device bytes of the buffers, given whether any layer, the head and any predictor are placed. */
uint64_t hyb_hdense_buffer_bytes(const struct hyb_model *m, bool any_layer, bool head,
				 bool any_pred);

/*
 * The layer whose attention output layer l's predictor reads: l - 1
 * (layer 0: 0) for HYB_PRED_ADJACENT (KAIROX 5.1), l itself for
 * HYB_PRED_SAME_LAYER (PowerInfer's predictors).
 */
uint32_t hyb_hdense_pred_source(const struct hyb_model *m, uint32_t l);

/*
 * Upload the placed parts (layers[l], head, preds[l]: layer l's predictor) to
 * d and wait for them. A predictor is placed only where the attention it
 * reads is (hyb_hdense_pred_source). NULL with a reason in err. Nothing
 * placed is fine.
 */
struct hyb_hdense *hyb_hdense_new(struct hyb_device *d, const struct hyb_model *m,
				  uint32_t n_ctx, const bool *layers, bool head, const bool *preds,
				  char *err, size_t errlen);
/*
 * The same with KV slots for kv_slots sequences of n_ctx rows each (0: no
 * KV on the device; hyb_hdense_new's single sequence is slot 0).
 */
struct hyb_hdense *hyb_hdense_new_seqs(struct hyb_device *d, const struct hyb_model *m,
				       uint32_t n_ctx, uint32_t kv_slots, const bool *layers,
				       bool head, const bool *preds, char *err, size_t errlen);
void hyb_hdense_free(struct hyb_hdense *hd);

bool hyb_hdense_layer_on(const struct hyb_hdense *hd, uint32_t l);
/*
 * TEAL's thresholds on the placed attention blocks (docs/SPARSITY.md#teal):
 * their q|k|v and o weights swapped for TEAL's transposed ones (t: the
 * layout, thr: [n_layer][HYB_TEAL_INPUTS], kept by the caller), a decode
 * step's projections then hyb_device_teal_matvec, a batch's rows each with
 * their own inputs; a block whose rows do not fit keeps the model's and
 * runs dense. t or thr NULL: the model's again. 0 or -1 (a device failure:
 * the blocks' weights are lost).
 */
struct hyb_teal;
int hyb_hdense_set_teal(struct hyb_hdense *hd, const struct hyb_teal *t, const float *thr);
bool hyb_hdense_teal_on(const struct hyb_hdense *hd, uint32_t l);
bool hyb_hdense_head_on(const struct hyb_hdense *hd);
bool hyb_hdense_pred_on(const struct hyb_hdense *hd, uint32_t l);
uint32_t hyb_hdense_preds_on(const struct hyb_hdense *hd);
uint32_t hyb_hdense_layers_on(const struct hyb_hdense *hd);
/* Device bytes it holds. */
uint64_t hyb_hdense_bytes(const struct hyb_hdense *hd);

/* The residual stream's device copy: x, then xn (ffn_norm'ed), n_embd floats each. */
hyb_dptr hyb_hdense_x(const struct hyb_hdense *hd);
hyb_dptr hyb_hdense_xn(const struct hyb_hdense *hd);

/*
 * The host copies of x (and xn after it: 2 * n_embd floats, pinned; then the
 * predictions). up: queue x on CRITICAL and make COMPUTE wait for it. down:
 * queue x, with_xn also xn, after the work on COMPUTE so far, on CRITICAL
 * (one copy); ev completes when it landed.
 */
float *hyb_hdense_host_x(const struct hyb_hdense *hd);
int hyb_hdense_x_up(struct hyb_hdense *hd);
int hyb_hdense_x_down(struct hyb_hdense *hd, bool with_xn, struct hyb_device_event **ev);

/*
 * Queue layer l's predictor on COMPUTE, reading the device x (the residual
 * stream after the attention it follows: unit RMS first, or as it is for a
 * same-layer model), into prediction slot 0 or 1. pred_down queues the
 * copy of the slots written since the last one, after the work on COMPUTE
 * so far, on CRITICAL, apart from x's (KAIROX 5.1: the predictor stays off
 * the layer's critical path, the CPU starts on x as soon as it is down); the
 * other slot's host copy stays as it was. pred_wait waits for it (0 at once
 * when none is pending). Then hyb_hdense_predicted gives the slot's active
 * list (bundle order, increasing) and its length.
 */
int hyb_hdense_predict(struct hyb_hdense *hd, uint32_t l, int slot);
int hyb_hdense_pred_down(struct hyb_hdense *hd);
/* Adjacent mode: the slot layer j's prediction goes to (layer 0's own at layer 0: 0). */
static inline int hyb_hdense_pred_slot(uint32_t j)
{
	return (int)(j & 1);
}
int hyb_hdense_pred_wait(struct hyb_hdense *hd);
uint32_t hyb_hdense_predicted(const struct hyb_hdense *hd, int slot, const uint32_t **list);
/*
 * Scores mode (the load-aware thresholds, docs/BALANCER.md): the predictors
 * leave their scores (logits, n_ff floats) in the slots instead of the lists;
 * hyb_hdense_predicted_scores gives a slot's after the copy down. The
 * count is still the number of scores > 0; the list is not copied.
 */
/*
 * Layer l's predictor over n rows of x (n_embd floats each) on COMPUTE:
 * row t's count and active list at out + t * (1 + n_ff) words, as
 * hyb_hdense_predict leaves one row's (a pass of several sequences).
 */
int hyb_hdense_predict_rows(struct hyb_hdense *hd, uint32_t l, hyb_dptr x, uint32_t n,
			    hyb_dptr out);
void hyb_hdense_set_scores(struct hyb_hdense *hd, bool on);
const float *hyb_hdense_predicted_scores(const struct hyb_hdense *hd, int slot);

/*
 * Layer l's attention block for one token at pos, on COMPUTE: x += the
 * attention output, then xn = ffn_norm(x). The device's KV cache must hold
 * rows 0..pos-1 (hyb_hdense_kv_up).
 */
int hyb_hdense_attention(struct hyb_hdense *hd, uint32_t l, uint32_t pos);
/* logits[n_vocab] of the token in x (out_norm, output), copied back and waited for. */
int hyb_hdense_head(struct hyb_hdense *hd, float *logits);
/*
 * A graph's step (docs/DEVICE.md "Graphs"): layer l's block with the
 * position read from device memory at pos_at (the KV watermark is the
 * caller's to move, hyb_hdense_kv_dev_wrote, once the step ran; a TEAL
 * layer: -EINVAL); the head queued, its logits landing in
 * hyb_hdense_head_logits (pinned) when *ev completes.
 */
int hyb_hdense_attention_at(struct hyb_hdense *hd, uint32_t l, hyb_dptr pos_at);
int hyb_hdense_head_queue(struct hyb_hdense *hd, struct hyb_device_event **ev);
const float *hyb_hdense_head_logits(const struct hyb_hdense *hd);

/*
 * A prompt batch's buffers in device memory (docs/HYBRID.md, "Prompts"):
 * x and xn [n][n_embd], q and att [n][q_dim], k and v [n][kv_dim].
 */
struct hyb_hdense_batch {
	hyb_dptr x, xn, q, k, v, att;
};
/*
 * Layer l's attention block for n tokens at positions pos.. on b (queued on
 * COMPUTE): x += attention, then xn = ffn_norm(x) for the FFN. The
 * one-token kernels' arithmetic, token after token (hyb/device.h).
 */
int hyb_hdense_attention_batch(struct hyb_hdense *hd, uint32_t l, uint32_t pos, uint32_t n,
			       const struct hyb_hdense_batch *b);
/*
 * The same block in three parts, for a pass of several sequences (batch of
 * the hybrid context, docs/HYBRID.md "Several sequences"), each queued on
 * COMPUTE: qkv: xn = attn_norm(x), q, k, v of the n rows (biases and Q/K
 * norms, before RoPE); attend: rows t0..t0 + n - 1, one sequence's tokens
 * at positions pos.., attend over KV slot `slot` (RoPE, their KV rows
 * stored there) into att; out: x += wo att, xn = ffn_norm(x). Rows whose
 * attention ran elsewhere have their att rows copied in between.
 */
int hyb_hdense_qkv_batch(struct hyb_hdense *hd, uint32_t l, uint32_t n,
			 const struct hyb_hdense_batch *b);
int hyb_hdense_attend_batch(struct hyb_hdense *hd, uint32_t l, uint32_t slot, uint32_t pos,
			    uint32_t t0, uint32_t n, const struct hyb_hdense_batch *b);
int hyb_hdense_out_batch(struct hyb_hdense *hd, uint32_t l, uint32_t n,
			 const struct hyb_hdense_batch *b);

/*
 * Bring one side's KV rows of the placed layers up to n rows. kc, vc: the
 * host caches ([layer][n_ctx][kv_dim] F16). up: host rows the device lacks
 * go up on CRITICAL (COMPUTE waits for them). down: device rows the host
 * lacks come back, waited for.
 */
int hyb_hdense_kv_up(struct hyb_hdense *hd, const uint16_t *kc, const uint16_t *vc,
		     uint32_t n);
int hyb_hdense_kv_down(struct hyb_hdense *hd, uint16_t *kc, uint16_t *vc, uint32_t n);
/* Rows [from, to) of every layer were written on the host (a prompt batch) / device. */
void hyb_hdense_kv_host_wrote(struct hyb_hdense *hd, uint32_t to);
void hyb_hdense_kv_dev_wrote(struct hyb_hdense *hd, uint32_t l, uint32_t to);
/* The context was reset: neither side holds any row. */
void hyb_hdense_kv_reset(struct hyb_hdense *hd);

/*
 * Two matvecs (an FFN's gate and up, attention's k and v): one launch
 * where they share type and shape (hyb_device_matvec_group), else two; the
 * same bits either way.
 */
static inline int hyb_hdense_matvec2(struct hyb_device *d, enum hyb_stream s,
				     const struct hyb_dev_matvec *a, const struct hyb_dev_matvec *b)
{
	const struct hyb_dev_matvec two[2] = { *a, *b };

	if (a->type == b->type && a->n_in == b->n_in && a->n_out == b->n_out &&
	    a->accumulate == b->accumulate && a->batch == b->batch)
		return hyb_device_matvec_group(d, s, two, 2);
	return hyb_device_matvec(d, s, a) || hyb_device_matvec(d, s, b) ? -1 : 0;
}

#endif
