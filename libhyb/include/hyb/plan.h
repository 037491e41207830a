/* SPDX-License-Identifier: MIT */
/*
 * The plan GGUF: a model whose FFNs are reordered into neuron groups, with
 * predictors and an initial GPU placement (DESIGN.md "Weight layout in
 * pools"; written by `hybctl plan`, read by libhyb and hybd).
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
 *   fc2.weight    F16, ne0 = H, ne1 = n_ff (outputs in bundle order)
 *   fc2.bias      F32 [n_ff]
 * Predictor (PowerInfer 5.1): logit = fc2 · relu(fc1 · x + b1) + b2; neuron
 * predicted active when logit > 0 (the plan folds its chosen threshold into
 * fc2.bias). x is the layer's predictor input as defined in hyb/profile.h
 * (the unit-RMS residual after layer L-1's attention).
 */
#ifndef HYB_PLAN_H
#define HYB_PLAN_H

#define HYB_PLAN_VERSION 1

#define HYB_PLAN_KEY_VERSION "hyb.plan.version"
#define HYB_PLAN_KEY_GROUP_SIZE "hyb.plan.group_size"
#define HYB_PLAN_KEY_GPU_BUDGET "hyb.plan.gpu_budget"
#define HYB_PLAN_KEY_SOURCE "hyb.plan.source"

#endif
