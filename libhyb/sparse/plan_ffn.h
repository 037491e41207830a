/* SPDX-License-Identifier: MIT */
/*
 * The FFN of a plan layer computed densely over its bundles (hyb/plan.h):
 * every neuron, any number of tokens; and the dense down projection of a
 * PowerInfer model, whose down is stored transposed like a bundle's. Prefill always runs it (PowerInfer 5.3:
 * long inputs activate almost every neuron, so prefill goes dense); decode
 * runs it when sparse mode is off.
 */
#ifndef HYB_PLAN_FFN_H
#define HYB_PLAN_FFN_H

#include <stddef.h>
#include <stdint.h>

#include "cpu_kernels.h"
#include "hyb/model.h"
#include "hyb/threadpool.h"

struct hyb_ffn_plan_scratch;

/* Scratch for up to n_batch tokens on n_threads threads; NULL when out of memory. */
struct hyb_ffn_plan_scratch *hyb_ffn_plan_scratch_new(const struct hyb_model *m,
						      uint32_t n_batch, int n_threads);
void hyb_ffn_plan_scratch_free(struct hyb_ffn_plan_scratch *s);

/*
 * out[n][n_embd] = down(act(gate · x, up · x)) for layer L of a plan model.
 * xq: the n normalised inputs converted to hyb_vec_dot_type(bundle type),
 * xq_stride bytes apart. skip (NULL: none): groups g with skip[g] != 0 are
 * left out (a hybrid prompt batch computes them on the device). thr > 0:
 * a CATS threshold (hyb/sparsity.h), h = 0 where |act(gate)| <= thr.
 * need (NULL: every row every group): row t takes group g's neurons only
 * where need[t * n_groups + g] != 0, its other activations are zeroed, so
 * a row's sums never depend on what the other rows need (a batch of
 * several sequences, docs/HYBRID.md); a group no row needs is not read.
 */
void hyb_ffn_plan_dense(const struct hyb_cpu_kernels *k, struct hyb_threadpool *pool,
			struct hyb_ffn_plan_scratch *s, const struct hyb_model *m,
			const struct hyb_layer *L, const void *xq, size_t xq_stride, uint32_t n,
			const uint8_t *skip, const uint8_t *need, float thr, float *out);

/*
 * out[n][n_embd] = the down projection of act[n][n_ff] (activations) through
 * a PowerInfer model's ffn_down_t (hyb_layer.down_t, a row per neuron), on
 * the sparse operator's axpy kernel, split over the pool by neuron chunks.
 * The scratch must come from hyb_ffn_plan_scratch_new for at least n tokens.
 */
void hyb_ffn_down_t(struct hyb_threadpool *pool, struct hyb_ffn_plan_scratch *s,
		    const struct hyb_weight *down_t, const float *act, uint32_t n, float *out);

#endif
