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

#endif
