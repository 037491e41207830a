/* SPDX-License-Identifier: MIT */
/*
 * The small per-vector operations of the forward pass. Their arithmetic is
 * that of ggml's CPU ops as llama.cpp's x86 build computes them (double
 * sums, the RoPE angle recurrence, fused multiply-adds where its compiler
 * fuses, ggml_v_silu), so that hyb's logits are llama.cpp's bit for bit.
 */
#ifndef HYB_OPS_H
#define HYB_OPS_H

#include <stdbool.h>
#include <stdint.h>

#include "hyb/model.h"

/* y = x / rms(x) * w */
void hyb_rmsnorm(float *y, const float *x, const float *w, uint32_t n, float eps);
/*
 * Rotate the first n_rot dims of each of n_heads vectors of head_dim at
 * position pos; freq_scale multiplies the angles (1 / linear scaling factor).
 */
void hyb_rope(float *x, uint32_t n_heads, uint32_t head_dim, uint32_t n_rot, uint32_t pos,
	      float freq_scale, float base, bool neox);
/* g = act(g, u): the gated FFN nonlinearity, in place in g. */
void hyb_ffn_act(float *g, const float *u, uint64_t n, enum hyb_ffn_act act);

#endif
