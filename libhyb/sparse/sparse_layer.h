/* SPDX-License-Identifier: MIT */
/*
 * Sparse decode of a plan model's FFNs on the CPU: per
 * layer, the layer's predictor marks the neurons it expects to fire and the
 * neuron-aware operator (sparse/sparse_op.h, PowerInfer 5.4) computes only those.
 * A PowerInfer model file decodes the same way on its own matrices, with its
 * own predictors as its llama.cpp runs them, fed the layer's residual after
 * attention as it is, every token (the prompt's too: forward.c).
 *
 * Predictor input (hyb/profile.h): the residual stream after the previous
 * layer's attention at unit RMS — adjacent-layer prediction (KAIROX 5.1),
 * so the prediction for layer l can overlap layer l-1's FFN once a GPU is
 * involved. Layer 0 uses its own attention output.
 */
#ifndef HYB_SPARSE_LAYER_H
#define HYB_SPARSE_LAYER_H

#include <stdbool.h>
#include <stddef.h>

#include "hyb/model.h"
#include "sparse_op.h"
#include "hyb/threadpool.h"

struct hyb_ffn_sparse;

/* NULL when out of memory (reason in err). */
struct hyb_ffn_sparse *hyb_ffn_sparse_new(const struct hyb_model *m, int n_threads, char *err,
					  size_t errlen);
void hyb_ffn_sparse_free(struct hyb_ffn_sparse *s);

/*
 * One token's FFN of layer l: y[n_embd] from xn (the ffn_norm'ed input);
 * x_attn is the residual stream after layer l's attention. Layers must be
 * called in order 0..n_layer-1 for each token. Returns 0, or -1 with err.
 */
int hyb_ffn_sparse_layer(struct hyb_ffn_sparse *s, struct hyb_threadpool *pool, uint32_t l,
			 const float *x_attn, const float *xn, float *y, char *err,
			 size_t errlen);
/*
 * The same for one of several tokens decoded together, each with its own
 * state between layers: prev[n_embd], what the cross-layer predictor of
 * layer l + 1 reads (written at layer l).
 */
int hyb_ffn_sparse_layer_row(struct hyb_ffn_sparse *s, struct hyb_threadpool *pool, uint32_t l,
			     const float *x_attn, const float *xn, float *y, float *prev,
			     char *err, size_t errlen);

void hyb_ffn_sparse_stats(const struct hyb_ffn_sparse *s, struct hyb_sparse_stats *out);
/* The same for layer l alone (zeros past the last layer). */
void hyb_ffn_sparse_layer_stats(const struct hyb_ffn_sparse *s, uint32_t l,
				struct hyb_sparse_stats *out);

/*
 * Pieces the hybrid engine (hybrid/ffn_hybrid_layer.c) composes differently. predict:
 * the neurons layer l's predictor marks active for input `in` (already at
 * unit RMS), ascending, into active[n_ff]; returns their count (their scores,
 * the logits, into scores[n_ff] unless NULL). run: the CPU
 * operator over a list (or, in oracle mode, group by group: see
 * hyb_ffn_sparse_set_oracle). bundles: layer l's bundle view.
 */
uint32_t hyb_ffn_sparse_predict(struct hyb_ffn_sparse *s, struct hyb_threadpool *pool, uint32_t l,
				const float *in, float *scores, uint32_t *active);
/* The predictors give scores (scores[n_ff] of predict, when not NULL): a plan's do, a
 * PowerInfer file's do not (scores is then left alone). */
bool hyb_ffn_sparse_has_scores(const struct hyb_ffn_sparse *s);
int hyb_ffn_sparse_run(struct hyb_ffn_sparse *s, struct hyb_threadpool *pool, uint32_t l,
		       const float *xn, const uint32_t *active, uint32_t n_active, float *y,
		       struct hyb_sparse_ffn_stats *st, char *err, size_t errlen);
const struct hyb_ffn_bundles *hyb_ffn_sparse_bundles(const struct hyb_ffn_sparse *s,
						     uint32_t l);

/*
 * Oracle mode (tests, hyb/hybrid.h): the FFN output is summed group by group
 * in group order, each group's partial from one single-threaded operator
 * call, so any split of the groups between devices that computes every
 * listed neuron once from the right bytes gives bit-identical results.
 */
void hyb_ffn_sparse_set_oracle(struct hyb_ffn_sparse *s, bool on);
/*
 * CATS thresholds (hyb/sparsity.h; [n_layer], kept by the caller; NULL:
 * none): layers then list every neuron and the operator skips the up and
 * down rows of those at or below the threshold, instead of predicting.
 */
void hyb_ffn_sparse_set_thresholds(struct hyb_ffn_sparse *s, const float *thr);
/* y = sum over runs of active by group, in group order, of part(run) (oracle mode). */
typedef int (*hyb_group_part_fn)(void *user, uint32_t g, const uint32_t *active, uint32_t n,
				 float *part);
int hyb_ffn_sum_by_group(uint32_t n_embd, uint32_t group_size, const uint32_t *active,
			 uint32_t n_active, float *part, float *y, hyb_group_part_fn fn,
			 void *user);
void hyb_ffn_sparse_stats_reset(struct hyb_ffn_sparse *s);

/*
 * A PowerInfer file's predictor of one layer (hyb_layer fc1, fc2) as its
 * llama.cpp computes it (predictor.c): the neurons whose score is >=
 * threshold into active[fc2->ne1], ascending; returns their count. scratch:
 * hyb_pi_predictor_scratch_bytes().
 */
size_t hyb_pi_predictor_scratch_bytes(const struct hyb_weight *fc1, const struct hyb_weight *fc2);
uint32_t hyb_pi_predictor_run(const struct hyb_weight *fc1, const struct hyb_weight *fc2,
			      float threshold, const float *x, struct hyb_threadpool *pool,
			      void *scratch, uint32_t *active);

/* y = x at unit RMS (no weight): the predictor input of hyb/profile.h. */
void hyb_unit_rms(float *y, const float *x, uint32_t n);

#endif
