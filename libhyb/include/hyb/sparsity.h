/* SPDX-License-Identifier: MIT */
/*
 * Training-free activation sparsity for SiLU and GELU FFNs: CATS (Lee et
 * al., "CATS: Contextually-Aware Thresholding for Sparsity in Large Language
 * Models", COLM 2024; docs/SPARSITY.md). Per layer l a threshold t_l, the
 * quantile of |act(gate · x)| at the target sparsity over calibration text;
 * a neuron whose |act(gate_i · x)| <= t_l contributes nothing: its up row
 * and down column are not read.
 *
 * Where thresholds live (GGUF keys):
 *   hyb.sparsity.mode       str        "cats"
 *   hyb.sparsity.target     f32        the sparsity the thresholds were set for
 *   hyb.sparsity.threshold  f32[n_layer]
 *   hyb.sparsity.quantiles  f32[n_layer * 101]  profiles only: layer l's
 *                           quantiles of |act(gate)| at 0, 1, ..., 100 %
 * A profile made with `hybctl profile --sparsity S` holds all four; a plan
 * made from it holds the first three, and a model with them (hyb_model
 * .ffn_thr) runs every context with them.
 *
 * TEAL (Liu et al., "Training-Free Activation Sparsity in Large Language
 * Models", ICLR 2025; docs/SPARSITY.md#teal) thresholds the *input* of every
 * projection instead: x_i counts as 0 when |x_i| <= t, so the weight
 * column x_i multiplies is not read. Four inputs per layer (enum
 * hyb_teal_input), each with its threshold; a TEAL profile holds
 *   hyb.sparsity.mode       str        "teal"
 *   hyb.sparsity.target     f32
 *   hyb.sparsity.threshold  f32[n_layer * 4]        (layer-major)
 *   hyb.sparsity.quantiles  f32[n_layer * 4 * 101]  of |input|
 *   hyb.sparsity.teal_alloc f32[n_layer * HYB_TEAL_LEVELS * 4]  optional:
 *                           layer l's sparsity per input at model sparsity
 *                           k * HYB_TEAL_STEP (TEAL's greedy allocation);
 *                           without it every input gets the model's
 *                           sparsity (the uniform allocation)
 *
 * Failures return a negative errno with the message in hyb_last_error().
 */
#ifndef HYB_SPARSITY_H
#define HYB_SPARSITY_H

#include <stdint.h>

#include "hyb/error.h"

#define HYB_SPARSITY_KEY_MODE "hyb.sparsity.mode"
#define HYB_SPARSITY_KEY_TARGET "hyb.sparsity.target"
#define HYB_SPARSITY_KEY_THRESHOLD "hyb.sparsity.threshold"
#define HYB_SPARSITY_KEY_QUANTILES "hyb.sparsity.quantiles"
#define HYB_SPARSITY_MODE_CATS "cats"
#define HYB_SPARSITY_MODE_TEAL "teal"
#define HYB_SPARSITY_KEY_TEAL_ALLOC "hyb.sparsity.teal_alloc"
/* TEAL allocations at model sparsity 0, 0.05, ..., 0.8 */
#define HYB_TEAL_LEVELS 17
#define HYB_TEAL_STEP 0.05
#define HYB_SPARSITY_N_QUANTILES 101

/* The value at fraction s (0..1) of a layer's quantile table, interpolated linearly. */
float hyb_sparsity_quantile_at(const float *q, double s);

/*
 * thr[n_layer] for sparsity s in (0, 1) from a profile's quantile table at
 * path; s == 0: the file's own thresholds (a profile's or a plan's).
 * -EINVAL: s out of range, no quantiles or thresholds (a profile made
 * without --sparsity, or not a profile), or another layer count; or the
 * reader's errno.
 */
int hyb_sparsity_thresholds(const char *path, double s, float *thr, uint32_t n_layer);

/*
 * The projection inputs TEAL thresholds, per layer: one threshold for the
 * projections that share an input (docs/SPARSITY.md#teal says why).
 */
enum hyb_teal_input {
	HYB_TEAL_QKV,   /* attn_norm(x): Q, K and V */
	HYB_TEAL_O,     /* the attention's output: O */
	HYB_TEAL_GU,    /* ffn_norm(x): gate and up */
	HYB_TEAL_DOWN,  /* act(gate) * up: down */
	HYB_TEAL_INPUTS
};

/* The name of an input ("qkv", "o", "gate_up", "down"). */
const char *hyb_teal_input_name(uint32_t input);

/*
 * TEAL thresholds thr[n_layer * HYB_TEAL_INPUTS] for sparsity s in (0, 1)
 * from a TEAL profile's quantiles (s == 0: its own thresholds), each
 * input's at its allocated sparsity where the profile has an allocation
 * (interpolated between levels; then s is at most the last level). The
 * same errors as hyb_sparsity_thresholds, and -EINVAL for a CATS profile.
 */
int hyb_sparsity_teal_thresholds(const char *path, double s, float *thr, uint32_t n_layer);

/* An allocation's (HYB_SPARSITY_KEY_TEAL_ALLOC's) sparsity for one input at model sparsity s. */
double hyb_teal_alloc_at(const float *alloc, uint32_t layer, uint32_t input, double s);

/*
 * 0 when the model's weights can take TEAL's transposed layout (F32, F16,
 * Q8_0, Q4_0, outputs in whole blocks), which is what makes TEAL decoding
 * read less; -EINVAL with the reason otherwise: its thresholds then still
 * apply (the same function, dense kernels), the speed does not.
 */
struct hyb_model;
int hyb_teal_layout_check(const struct hyb_model *m);

#endif
