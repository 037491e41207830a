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

/*
 * A pass's tokens of one sequence: rows t0 .. t0 + n - 1 of the pass, at
 * positions pos.. of their sequence, whose cache rows a block table maps
 * (hyb_kv_row; NULL: row = position).
 */
struct hyb_fwd_run {
	uint32_t t0, n, pos;
	const uint32_t *blocks;
	int seq;  /* the sequence (hyb_ctx_seq_open's id) */
};

struct hyb_attn;

struct hyb_ctx {
	const struct hyb_model *m;
	const struct hyb_cpu_kernels *k;
	struct hyb_threadpool *pool;
	uint32_t n_ctx, n_past, n_batch;
	uint32_t n_rows;   /* tokens a pass may hold: n_batch, + n_seq - 1 with sequences */
	uint32_t q_dim, kv_dim;

	uint16_t *kcache;  /* [layer][row][kv_dim] F16: row = position, or paged (kv) */
	uint16_t *vcache;  /* [layer][row][kv_dim] F16 */
	size_t kv_bytes;
	uint32_t kv_rows;  /* rows per layer */

	/*
	 * Several sequences (n_seq > 1, batch.c): a paged cache and the runs of
	 * the pass in flight. With one sequence runs is NULL: the pass is its
	 * tokens at n_past, rows = positions.
	 */
	uint32_t n_seq;
	struct hyb_kv_pages *kv;
	const struct hyb_fwd_run *runs;
	uint32_t n_runs;
	struct hyb_attn *attn_runs;  /* [n_seq] scratch of hyb_fwd_attend_runs */
	bool seq0_open;              /* one sequence: hyb_ctx_seq_open's state */
	/*
	 * One sequence's prefix cache (batch.c): its cache rows 0 .. n_kept
	 * hold these tokens' keys and values, as long as no evaluation has
	 * written below n_kept since (hyb_ctx_eval lowers it).
	 */
	int32_t *kept;
	uint32_t n_kept;
	/*
	 * Every output of a matmul summed as a one-column product sums it, at
	 * any batch size (batch invariance: hyb_gemm_invariant_cols).
	 */
	bool invariant;
	bool check_routers; /* HYB_TESTING_CHECK_ROUTERS (hyb/testing.h) */
	/* the pass's columns by sequence, for matmuls (runs, or single rows) */
	const uint32_t *cols;
	uint32_t n_cols;
	uint32_t *run_cols;  /* [n_seq] */
	/*
	 * A plan's sparse FFN over several sequences (forward.c plan_rows_ffn):
	 * row t of the pass belongs to a one-token run (a decode step); need
	 * [n_rows][n_groups] and ffn_xs [n_rows][n_embd] are its scratch
	 */
	uint8_t *row_one, *need;
	float *ffn_xs;
	float *ffn_prev;  /* [n_rows][n_embd]: each row's predictor state (sparse_layer.h) */
	uint32_t *ones;      /* [n_rows] all 1 */
	uint32_t *rows;      /* [n_rows] 0, 1, 2, ... (every row's logits) */
	uint32_t *seg;       /* [3][2 * n_rows] scratch of matmul's segments */

	/* scratch for a pass of n_rows tokens */
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
	/* TEAL (hyb/sparsity.h): [n_layer][HYB_TEAL_INPUTS] thresholds or NULL;
	 * the model's transposed layout; scratch of its GEMV */
	float *teal_thr;
	const struct hyb_teal *teal;
	uint32_t *teal_idx;
	float *teal_val, *teal_y;
	struct hyb_teal_stats teal_st;
	struct hyb_teal_stats *teal_layer_st; /* [n_layer][HYB_TEAL_INPUTS] */
	hyb_input_probe_fn in_probe;
	void *in_probe_user;

	struct hyb_ffn_plan_scratch *plan; /* plan models: the FFN over bundles */
	struct hyb_ffn_sparse *sparse;     /* plan models decoding sparsely */
	struct hyb_ffn_hybrid *hybrid;     /* ... split between a device and the CPU */
	struct hyb_moe_hybrid *moe_hybrid; /* MoE: decode's hot experts on a device */
	struct hyb_plain_hybrid *plain_hybrid; /* a plain model's parts on a device */
	struct hyb_moe_scratch *moe;       /* mixture-of-experts models (moe.c) */
	struct hyb_mla_scratch *mla;       /* latent attention (attention_mla.c) */
	uint32_t moe_defer;                /* hyb_ctx_params.moe_defer */
};

/* Y_i[n][ne1_i] = W_i . X[n][ne0] for up to three weights sharing X, in llama.cpp's order. */
void hyb_fwd_matmul(struct hyb_ctx *c, const float *x, uint32_t n, int nw,
		    const struct hyb_weight *const *w, float *const *y);
/* Run an attention batch on the context's threads. */
void hyb_fwd_attend(struct hyb_ctx *c, const struct hyb_attn *a);
/*
 * The runs of the pass in flight: c->runs, or the one sequence's n tokens
 * at c->n_past (filled into *one).
 */
const struct hyb_fwd_run *hyb_fwd_runs(const struct hyb_ctx *c, uint32_t n,
				       struct hyb_fwd_run *one, uint32_t *n_runs);
/*
 * Attention of every run of the pass, as one parallel job: a is the
 * layer's attention for the pass's first token (q, out, cache bases of the
 * layer, strides, heads); each run gets its rows, positions and blocks.
 */
void hyb_fwd_attend_runs(struct hyb_ctx *c, const struct hyb_attn *a, uint32_t n);
/*
 * The pass of c->runs (several sequences): tokens[n] in run order; logits
 * row i for pass row out[i] (i < n_out, rows ascending). 0, or -1 with err.
 */
int hyb_fwd_eval_runs(struct hyb_ctx *c, const int32_t *tokens, uint32_t n,
		      const uint32_t *out, uint32_t n_out, float *logits, char *err,
		      size_t errlen);
/*
 * Rows out[i] of c->x to row i (out ascending), each then the one row of its
 * sequence for the matmuls that follow (the head after the last layer).
 */
void hyb_fwd_gather(struct hyb_ctx *c, const uint32_t *out, uint32_t n_out);
/* c->x[t] = the embedding of tokens[t]. */
void hyb_fwd_embed(struct hyb_ctx *c, const int32_t *tokens, uint32_t n);
/* Layer l's attention block for n tokens at c->n_past: c->x += attention. */
void hyb_fwd_attention(struct hyb_ctx *c, uint32_t l, uint32_t n);
/*
 * Its middle for the runs of the pass (c->runs): from the projections in
 * c->q, c->kk, c->vv (biases and Q/K norms applied) - RoPE, the KV rows stored,
 * attention into c->att. Rows of other runs are not touched.
 */
void hyb_fwd_attention_core(struct hyb_ctx *c, uint32_t l, uint32_t n);
/* c->xn[t] = ffn_norm(x[t]) for the nf rows at x. */
void hyb_fwd_ffn_norm(struct hyb_ctx *c, uint32_t l, const float *x, uint32_t nf);
/* c->xn = the dense FFN of layer l over the nf rows of c->xn (in place). */
void hyb_fwd_ffn_dense(struct hyb_ctx *c, uint32_t l, uint32_t nf);
/* The same without the groups g of a plan model with skip[g] != 0 (NULL: none). */
void hyb_fwd_ffn_dense_skip(struct hyb_ctx *c, uint32_t l, uint32_t nf, const uint8_t *skip);
/*
 * ... and a plan's rows taking only the groups need says ([nf][n_groups],
 * NULL: all; hyb_ffn_plan_dense). Other models ignore need.
 */
void hyb_fwd_ffn_dense_rows(struct hyb_ctx *c, uint32_t l, uint32_t nf, const uint8_t *skip,
			    const uint8_t *need);
/* y[t] = rms_norm(y[t]) * w for n rows: a block output's norm (Gemma); nothing when w has no data */
void hyb_fwd_post_norm(struct hyb_ctx *c, const struct hyb_weight *w, float *y, uint32_t n);
/* logits[t] for rows first..n-1 of c->x: out_norm, then the output matrix. */
void hyb_fwd_head(struct hyb_ctx *c, uint32_t first, uint32_t n, float *logits);

#endif
