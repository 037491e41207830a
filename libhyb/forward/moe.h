/* SPDX-License-Identifier: MIT */
/* The mixture-of-experts FFN on the CPU (moe.c, docs/MOE.md). */
#ifndef HYB_MOE_H
#define HYB_MOE_H

#include <stdint.h>

struct hyb_ctx;
struct hyb_model;
struct hyb_moe_scratch;

/* Scratch for batches of up to nb tokens of model m (n_expert > 0); NULL: out of memory. */
struct hyb_moe_scratch *hyb_moe_scratch_new(const struct hyb_model *m, uint32_t nb);
void hyb_moe_scratch_free(struct hyb_moe_scratch *s);
/* hyb_ctx_moe_stats and friends (hyb/model.h); s may be NULL (no experts) */
struct hyb_moe_stats;
void hyb_moe_stats_get(const struct hyb_moe_scratch *s, struct hyb_moe_stats *out);
void hyb_moe_stats_reset(struct hyb_moe_scratch *s);
const uint64_t *hyb_moe_counts(const struct hyb_moe_scratch *s, uint32_t layer);
/*
 * c->xn = layer l's MoE FFN of the nf rows of c->xn (in place). 0, or a
 * negative errno with the reason in hyb_last_error() (a router logit that
 * is not finite: -EDOM).
 */
int hyb_fwd_ffn_moe(struct hyb_ctx *c, uint32_t l, uint32_t nf);
/*
 * With an expert cache and deferral (docs/MOE.md): the deferred experts the
 * CPU computes, left by the layer before, and their sum, due at the next
 * MoE layer. The decode step calls it while the next layer's attention runs
 * on the device (KTransformers 5); hyb_fwd_ffn_moe calls it first otherwise.
 * Returns 0.
 */
int hyb_fwd_moe_deferred(struct hyb_ctx *c);
/*
 * The most columns of an expert matrix of this type and row count one
 * kernel call may take and keep llama.cpp's summation order (moe.c); 0: any.
 */
uint32_t hyb_moe_max_columns(uint32_t type, uint64_t rows);

#endif
