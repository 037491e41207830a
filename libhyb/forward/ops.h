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
/* The cos and sin of RoPE's n_rot / 2 angles at position pos (hyb/model.h struct hyb_rope). */
void hyb_rope_table(const struct hyb_rope *r, uint32_t n_rot, uint32_t pos, float *cs,
		    float *sn);
/* Rotate the first n_rot dims of each of n_heads vectors of head_dim by a hyb_rope_table. */
void hyb_rope_apply(float *x, uint32_t n_heads, uint32_t head_dim, uint32_t n_rot, bool neox,
		    const float *cs, const float *sn);
/* Both: x rotated to position pos (n_rot <= 1024). */
void hyb_rope(float *x, uint32_t n_heads, uint32_t head_dim, uint32_t n_rot, uint32_t pos,
	      const struct hyb_rope *r, bool neox);
/*
 * YaRN's correction dims for n_rot rotary dims trained on n_ctx_orig
 * positions (ggml_rope_yarn_corr_dims).
 */
void hyb_rope_yarn_corr_dims(uint32_t n_rot, uint32_t n_ctx_orig, float base, float beta_fast,
			     float beta_slow, float dims[2]);
/* g = act(g, u): the gated FFN nonlinearity, in place in g. */
void hyb_ffn_act(float *g, const float *u, uint64_t n, enum hyb_ffn_act act);
/* act(gate) alone for one value: what a CATS threshold compares (docs/SPARSITY.md). */
float hyb_act_gate(enum hyb_ffn_act act, float g);
/* ggml's F16 GELU table [65536] (GeGLU's activation; devices copy it) */
const uint16_t *hyb_gelu_f16_table(void);
/*
 * hyb_ffn_act, then h = 0 wherever |act(g)| <= thr (CATS): the neurons a
 * sparse step skips. thr <= 0 is hyb_ffn_act itself.
 */
void hyb_ffn_act_cats(float *g, const float *u, uint64_t n, enum hyb_ffn_act act, float thr);

#endif
