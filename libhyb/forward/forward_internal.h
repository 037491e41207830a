/* SPDX-License-Identifier: MIT */
/*
 * The context and the CPU steps of the forward pass (libhyb/forward/forward.c), for
 * the hybrid decode step (libhyb/hybrid/decode.c), which runs some of them on
 * the CPU and the rest on a device.
 */
#ifndef HYB_FORWARD_INTERNAL_H
#define HYB_FORWARD_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cpu_kernels.h"
#include "hyb/model.h"
#include "hyb/threadpool.h"

struct hyb_ctx {
	const struct hyb_model *m;
	const struct hyb_cpu_kernels *k;
	struct hyb_threadpool *pool;
	uint32_t n_ctx, n_past, n_batch;
	uint32_t q_dim, kv_dim;

	uint16_t *kcache;  /* [layer][pos][kv_dim] F16 */
	uint16_t *vcache;  /* [layer][pos][kv_dim] F16 */
	size_t kv_bytes;

	/* scratch for a batch of n_batch tokens */
	float *x, *xn, *q, *kk, *vv, *att, *g, *u;
	void *xq;          /* activations converted for the matmul in flight */
	size_t xq_stride;  /* bytes per token in xq */
	void *attn_tmp;    /* per thread scratch of attend() */
	size_t attn_tmp_stride;

	hyb_ffn_probe_fn probe;
	void *probe_user;
	bool probe_gate;   /* the probe sees act(gate) alone (calibration) */
	hyb_moe_probe_fn moe_probe;
	void *moe_probe_user;
	float *ffn_thr;    /* [n_layer] CATS thresholds (hyb/sparsity.h), or NULL */

	struct hyb_ffn_plan_scratch *plan; /* plan models: the FFN over bundles */
	struct hyb_ffn_sparse *sparse;     /* plan models decoding sparsely */
	struct hyb_ffn_hybrid *hybrid;     /* ... split between a device and the CPU */
	struct hyb_moe_scratch *moe;       /* mixture-of-experts models (moe.c) */
	struct hyb_mla_scratch *mla;       /* latent attention (attention_mla.c) */
	uint32_t moe_defer;                /* hyb_ctx_params.moe_defer */
};

/* Y_i[n][ne1_i] = W_i . X[n][ne0] for up to three weights sharing X, in llama.cpp's order. */
void hyb_fwd_matmul(struct hyb_ctx *c, const float *x, uint32_t n, int nw,
		    const struct hyb_weight *const *w, float *const *y);
/* Run an attention batch on the context's threads. */
struct hyb_attn;
void hyb_fwd_attend(struct hyb_ctx *c, const struct hyb_attn *a);
/* c->x[t] = the embedding of tokens[t]. */
void hyb_fwd_embed(struct hyb_ctx *c, const int32_t *tokens, uint32_t n);
/* Layer l's attention block for n tokens at c->n_past: c->x += attention. */
void hyb_fwd_attention(struct hyb_ctx *c, uint32_t l, uint32_t n);
/* c->xn[t] = ffn_norm(x[t]) for the nf rows at x. */
void hyb_fwd_ffn_norm(struct hyb_ctx *c, uint32_t l, const float *x, uint32_t nf);
/* c->xn = the dense FFN of layer l over the nf rows of c->xn (in place). */
void hyb_fwd_ffn_dense(struct hyb_ctx *c, uint32_t l, uint32_t nf);
/* The same without the groups g of a plan model with skip[g] != 0 (NULL: none). */
void hyb_fwd_ffn_dense_skip(struct hyb_ctx *c, uint32_t l, uint32_t nf, const uint8_t *skip);
/* y[t] = rms_norm(y[t]) * w for n rows: a block output's norm (Gemma); nothing when w has no data */
void hyb_fwd_post_norm(struct hyb_ctx *c, const struct hyb_weight *w, float *y, uint32_t n);
/* logits[t] for rows first..n-1 of c->x: out_norm, then the output matrix. */
void hyb_fwd_head(struct hyb_ctx *c, uint32_t first, uint32_t n, float *logits);

#endif
