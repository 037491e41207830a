/* SPDX-License-Identifier: MIT */
/*
 * The neuron-aware sparse FFN operator on the CPU (PowerInfer §5.4,
 * digest_003 §2.5): one layer's FFN, stored in the plan's bundle layout
 * (hyb/plan.h), evaluated for a list of predicted-active neurons:
 *
 *   y = sum over listed neurons i of h_i * down_i,  h_i = act(gate_i · xn, up_i · xn)
 *
 * with act as enum hyb_ffn_act. For the ReLU family the gate comes first
 * and a neuron whose gate is <= 0 reads neither its up nor its down row
 * (exact: h is 0 then); any neuron whose h is exactly 0 skips its down row.
 * The rows are used where they are (the kernels of sparse_ffn_kernels.h):
 * no dense<->sparse conversion, no temporary matrix.
 *
 * Threads (§5.4: "split the neurons into small batches across cores"):
 * the listed neurons of the groups present here are cut into at most 16
 * units of whole kernel chunks, in bundle order, which threads take as they
 * go, so threads are balanced by the work actually listed, not by bundles;
 * each unit adds into its own partial y and one reduction sums them in unit
 * order. The units depend on the list alone: the same list gives the same
 * bits with any thread count and any scheduling (docs/DETERMINISM.md).
 */
#ifndef HYB_SPARSE_OP_H
#define HYB_SPARSE_OP_H

#include <stddef.h>
#include <stdint.h>

#include "cpu_kernels.h"
#include "hyb/model.h"
#include "hyb/threadpool.h"

/*
 * One layer's FFN as bundles. Group g holds neurons [g*GS, min((g+1)*GS,
 * n_ff)) (ng of them): ng gate rows, ng up rows, ng rows of down
 * transposed, each row n_embd elements of `type` (row_bytes apart), from
 * bundle[g]. bundle[g] == NULL: the group is not on this device and its
 * neurons are skipped (the hybrid engine computes them elsewhere).
 * bundle == NULL: the three matrices of a PowerInfer file as they are
 * instead (rows[0] gate, rows[1] up, rows[2] ffn_down_t; neuron i's row at
 * + i * row_bytes in each), every group present.
 */
struct hyb_ffn_bundles {
	uint32_t type;         /* hyb_sparse_type_ok() (sparse_ffn_kernels.h) */
	uint32_t n_embd, n_ff;
	uint32_t group_size;   /* GS */
	uint64_t row_bytes;    /* hyb_row_bytes(type, n_embd) */
	const void *const *bundle; /* [ceil(n_ff / GS)] */
	const void *rows[3];   /* bundle == NULL */
};

/* Counts of one call, over the groups present. */
struct hyb_sparse_ffn_stats {
	uint64_t n_gate; /* neurons whose gate was computed (listed and present) */
	uint64_t n_up;   /* neurons whose up was computed */
	uint64_t n_nz;   /* neurons with h != 0: down rows read */
};

/* Scratch for one layer shape, reused by every call (one caller at a time). */
struct hyb_sparse_ffn_ctx;

/*
 * For calls with b->n_embd <= n_embd, b->n_ff <= n_ff, on up to n_threads
 * threads (<= 0: one per online CPU). Kernels: hyb_sparse_best(). NULL when
 * out of memory or on zero sizes.
 */
struct hyb_sparse_ffn_ctx *hyb_sparse_ffn_ctx_new(uint32_t n_embd, uint32_t n_ff,
						   int n_threads);
void hyb_sparse_ffn_ctx_free(struct hyb_sparse_ffn_ctx *c);
/* Use the kernels of one ISA level (tests, benchmarks); -1 when the CPU lacks it. */
int hyb_sparse_ffn_set_isa(struct hyb_sparse_ffn_ctx *c, enum hyb_isa isa);
/* The message of the last failed call ("" after a success). */
const char *hyb_sparse_ffn_error(const struct hyb_sparse_ffn_ctx *c);

/*
 * y[0..n_embd) = the FFN of xn over the listed neurons: active holds
 * n_active strictly increasing bundle-order indices < n_ff, or is NULL for
 * every neuron (dense / oracle mode; n_active is then ignored). Runs on
 * min(pool size, the ctx's n_threads) threads of pool (NULL: the calling
 * thread only). y may alias xn. st (may be NULL) receives the counts.
 * Returns 0, or -1 with y untouched on bad arguments (unsupported type,
 * n_embd not a multiple of the block size, shapes beyond the ctx's, an
 * index >= n_ff or out of order, an unknown act).
 */
int hyb_sparse_ffn(struct hyb_sparse_ffn_ctx *c, struct hyb_threadpool *pool,
		   const struct hyb_ffn_bundles *b, enum hyb_ffn_act act, const float *xn,
		   const uint32_t *active, uint32_t n_active, float *y,
		   struct hyb_sparse_ffn_stats *st);

/*
 * The same with a CATS threshold (hyb/sparsity.h) for a SiLU or GELU FFN: a
 * listed neuron whose |act(gate)| <= thr (hyb_act_gate) reads neither its up
 * nor its down row (h is taken as 0). thr == 0 is hyb_sparse_ffn; -1 for a
 * negative or non-finite thr, or thr > 0 with another act. A GELU FFN's h is
 * the dense pass's (hyb_ffn_act: ggml's F16 GELU table).
 */
int hyb_sparse_ffn_cats(struct hyb_sparse_ffn_ctx *c, struct hyb_threadpool *pool,
			const struct hyb_ffn_bundles *b, enum hyb_ffn_act act, const float *xn,
			const uint32_t *active, uint32_t n_active, float thr, float *y,
			struct hyb_sparse_ffn_stats *st);

/*
 * A PowerInfer file's FFN (b->bundle NULL: its own gate, up and ffn_down_t)
 * with the arithmetic of PowerInfer's ggml (docs/DETERMINISM.md): h of every
 * neuron (0 where not listed) is converted to the down rows' dot type before
 * the down axpy — rounded to F16 for F16 rows, quantized to Q8_0 in blocks
 * of 32 neurons for Q4_0 and Q8_0 rows — and a neuron whose converted h is 0
 * reads no down row. Two passes (gate and up, then down), each cut into
 * units as above: the same bits with any thread count. Returns 0, or -1 as
 * hyb_sparse_ffn, also when n_ff is not a multiple of the dot type's block.
 */
int hyb_sparse_ffn_pi(struct hyb_sparse_ffn_ctx *c, struct hyb_threadpool *pool,
		      const struct hyb_ffn_bundles *b, enum hyb_ffn_act act, const float *xn,
		      const uint32_t *active, uint32_t n_active, float *y,
		      struct hyb_sparse_ffn_stats *st);

/* Bytes of a layer's bundle tensor (3 * n_ff rows); 0 on bad arguments. */
uint64_t hyb_bundles_bytes(uint32_t type, uint32_t n_embd, uint32_t n_ff);

/*
 * Write a layer's bundle tensor of `type` (any type hyb_quantize_row_ref()
 * produces) to out (hyb_bundles_bytes() bytes) from dense float matrices in
 * llama's layout: gate and up [n_ff rows][n_embd], down [n_embd rows][n_ff].
 * perm[i] (n_ff entries, a permutation; NULL: identity) is the source
 * neuron of bundle-order neuron i, as the plan's ffn_perm. Rows are
 * quantized with hyb_quantize_row_ref(). Returns 0, or -1 with a message.
 */
int hyb_bundles_build(uint32_t type, uint32_t n_embd, uint32_t n_ff, uint32_t group_size,
		      const float *gate, const float *up, const float *down,
		      const int32_t *perm, void *out, char *err, size_t errlen);

/*
 * Describe a contiguous bundle tensor (data, as hyb_bundles_build() writes
 * it and the plan stores it) in *b, with ptrs (ceil(n_ff / GS) entries)
 * pointing at each group. Returns 0, or -1 on bad arguments.
 */
int hyb_bundles_view(struct hyb_ffn_bundles *b, uint32_t type, uint32_t n_embd, uint32_t n_ff,
		     uint32_t group_size, const void *data, const void **ptrs);

#endif
