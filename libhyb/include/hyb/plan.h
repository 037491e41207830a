/* SPDX-License-Identifier: MIT */
/*
 * The plan GGUF: a model whose FFNs are reordered into neuron groups, with
 * predictors and an initial GPU placement (docs/PLAN.md; written by `hybctl plan`, read by libhyb and hybd).
 *
 * A plan file is a complete llama model: every tensor other than the FFN
 * matrices is copied from the source model unchanged (same name, type and
 * bytes), so dense and sparse decoding run from the same file.
 *
 * Keys (besides the source model's):
 *   hyb.plan.version         u32  HYB_PLAN_VERSION
 *   hyb.plan.group_size      u32  GS: neurons per group (the last group of a layer may be shorter)
 *   hyb.plan.gpu_budget      u64  bytes the placement was solved for
 *   hyb.plan.source          str  file name of the model the plan was made from
 *   hyb.plan.predictor_input str  "adjacent" (default when absent) or "same-layer"
 *                                 (enum hyb_pred_input, hyb/model.h)
 *
 * Tensors of layer L ("blk.L." prefix), n_groups = ceil(n_ff / GS):
 *   ffn_bundles   model FFN type, ne0 = n_embd, ne1 = 3 * n_ff. Group g holds
 *                 neurons [g*GS, min((g+1)*GS, n_ff)) in bundle order (ng of
 *                 them) and starts at row 3*g*GS: ng gate rows, then ng up
 *                 rows, then ng rows of down's columns (down transposed: row
 *                 i is the n_embd weights neuron i adds into the output).
 *                 One group = one contiguous bundle = one DMA (DynamicInfer C.2).
 *   ffn_perm      I32 [n_ff]: source-model index of each bundle-order neuron.
 *   ffn_gpu       I8 [n_groups]: 1 when the initial placement puts the group on the GPU.
 *   ffn_freq      F32 [n_groups]: profiled activation frequency of the group
 *                 (mean over its neurons of active tokens / tokens).
 *   fc1.weight    F16, ne0 = n_embd, ne1 = H (hidden size of this layer's predictor)
 *   fc1.bias      F32 [H]
 *   fc2.weight    F16, ne0 = n_ff, ne1 = H: stored transposed, row j = hidden
 *                 unit j's weights to every neuron (bundle order), so decoding
 *                 reads only the rows of units the ReLU left nonzero
 *                 (PowerInfer's own fc2 is [H -> n_ff] the other way round)
 *   fc2.bias      F32 [n_ff]
 * Predictor (PowerInfer 5.1): logit = fc2 · relu(fc1 · x + b1) + b2; neuron
 * predicted active when logit > 0 (the plan folds its chosen threshold into
 * fc2.bias). x is the layer's predictor input: by default as defined in
 * hyb/profile.h (the unit-RMS residual after layer L-1's attention); a plan
 * made from a PowerInfer GGUF keeps PowerInfer's own predictors, which read
 * the raw residual after layer L's attention ("same-layer").
 */
#ifndef HYB_PLAN_H
#define HYB_PLAN_H

#define HYB_PLAN_VERSION 1

#define HYB_PLAN_KEY_VERSION "hyb.plan.version"
#define HYB_PLAN_KEY_GROUP_SIZE "hyb.plan.group_size"
#define HYB_PLAN_KEY_GPU_BUDGET "hyb.plan.gpu_budget"
#define HYB_PLAN_KEY_SOURCE "hyb.plan.source"
#define HYB_PLAN_KEY_PRED_INPUT "hyb.plan.predictor_input"

/* ---- additions (hybctl plan) ---------------------------------- */

#include <stddef.h>
#include <stdint.h>

/* Tensor names of layer L: "blk.L." followed by one of these. */
#define HYB_PLAN_T_BUNDLES "ffn_bundles"
#define HYB_PLAN_T_PERM "ffn_perm"
#define HYB_PLAN_T_GPU "ffn_gpu"
#define HYB_PLAN_T_FREQ "ffn_freq"
#define HYB_PLAN_T_FC1_W "fc1.weight"
#define HYB_PLAN_T_FC1_B "fc1.bias"
#define HYB_PLAN_T_FC2_W "fc2.weight"
#define HYB_PLAN_T_FC2_B "fc2.bias"

struct hyb_threadpool;

/*
 * One layer's predictor in place (e.g. pointing into a loaded plan: the
 * F16 data of struct hyb_ffn_plan's fc1/fc2 and its two biases).
 */
struct hyb_predictor {
	uint32_t n_in, hidden, n_out;
	const uint16_t *fc1_w; /* F16 [hidden][n_in] */
	const float *fc1_b;    /* [hidden] */
	const uint16_t *fc2_w; /* F16 [hidden][n_out] (transposed) */
	const float *fc2_b;    /* [n_out], threshold folded in */
};

/* Bytes of scratch hyb_predictor_run needs (64-byte aligned pointer advised). */
size_t hyb_predictor_scratch_bytes(const struct hyb_predictor *p);

/*
 * Decode-time prediction for one input x[n_in] (the layer's predictor input,
 * hyb/profile.h): logits = fc2 · relu(fc1 · x + b1) + b2, both matrix-vector
 * products on the best CPU kernels (F16 GEMV, input converted to F16 once).
 * Writes the indices (bundle order) of the neurons with logit > 0 to
 * active[n_out] in ascending order and returns their count. logits[n_out]
 * may be NULL. pool: rows split over its threads; NULL runs on the caller.
 */
uint32_t hyb_predictor_run(const struct hyb_predictor *p, const float *x, struct hyb_threadpool *pool,
			   void *scratch, float *logits, uint32_t *active);

#endif
