/* SPDX-License-Identifier: MIT */
/*
 * The hybrid FFN engine behind hyb/hybrid.h: the decode-time FFN of a plan
 * model split between a device's neuron cache and the CPU, with a balancer
 * moving groups between them. forward.c calls it once per layer per decoded
 * token, in layer order.
 */
#ifndef HYB_FFN_HYBRID_H
#define HYB_FFN_HYBRID_H

#include <stddef.h>

#include "hyb/hybrid.h"
#include "hyb/threadpool.h"
#include "dense.h"

struct hyb_ffn_hybrid;

/*
 * NULL with a one-line reason in err. n_ctx: the context's rows (the KV cache
 * of layers whose attention goes to the device), a sequence's with several:
 * n_seq > 1 makes room on the device for passes of n_rows rows and the KV
 * of p->kv_seqs sequences (decode_seqs.c).
 */
struct hyb_ffn_hybrid *hyb_ffn_hybrid_new(const struct hyb_model *m,
					  const struct hyb_hybrid_params *p, bool oracle,
					  int n_threads, uint32_t n_ctx, uint32_t n_seq,
					  uint32_t n_rows, char *err, size_t errlen);
void hyb_ffn_hybrid_free(struct hyb_ffn_hybrid *h);
/*
 * CATS thresholds ([n_layer], kept by the caller; NULL: none): the device
 * and the CPU operator skip up and down of the predicted neurons at or
 * below them (docs/SPARSITY.md).
 */
void hyb_ffn_hybrid_set_thresholds(struct hyb_ffn_hybrid *h, const float *thr);

/*
 * One token's FFN of layer l: y[n_embd] from xn (the ffn_norm'ed input);
 * x_attn is the residual stream after layer l's attention. y may alias xn.
 * on_dev (only where hyb_ffn_hybrid_merge_on_device): xn is also in the
 * dense part's device xn, and the result is added to its device x instead
 * of written to y. Returns 0, or -1 with err (a device error: the context
 * cannot go on).
 */
int hyb_ffn_hybrid_layer(struct hyb_ffn_hybrid *h, struct hyb_threadpool *pool, uint32_t l,
			 const float *x_attn, const float *xn, float *y, bool on_dev,
			 char *err, size_t errlen);
/* A decode step begins (statistics). */
void hyb_ffn_hybrid_begin_token(struct hyb_ffn_hybrid *h);
/* Layer l's FFN merges on the device (its attention is there; not oracle mode). */
bool hyb_ffn_hybrid_merge_on_device(const struct hyb_ffn_hybrid *h, uint32_t l);
/* Layer l is computed dense on the CPU (layer policy, layer not on the device). */
bool hyb_ffn_hybrid_cpu_dense(const struct hyb_ffn_hybrid *h, uint32_t l);
/* Prompt batches run their placed attention blocks (and head) on the device. */
bool hyb_ffn_hybrid_prefill_on_device(const struct hyb_ffn_hybrid *h);
/*
 * A prompt batch's FFN of layer l, split like a decode step's by the cache:
 * split lists the neurons of every group whose bundle has landed on the
 * device and returns the per-group mask of those (1: the device computes
 * it, dense within the group), NULL when there is none (and always in
 * oracle mode, whose prompts keep the CPU batch's sums); the CPU's dense
 * pass skips them. ffn then computes them on the device for each of the n
 * rows of xn (n_embd floats each) into the rows of y, waited for.
 */
const uint8_t *hyb_ffn_hybrid_prefill_split(struct hyb_ffn_hybrid *h, uint32_t l);
int hyb_ffn_hybrid_prefill_ffn(struct hyb_ffn_hybrid *h, uint32_t l, const float *xn, uint32_t n,
			       float *y, char *err, size_t errlen);
/*
 * A prompt batch on the device (docs/HYBRID.md, "Prompts"): batch_cap is
 * the tokens one holds (0: none; prompts run token after token as above),
 * bufs its buffers. batch_ffn queues layer l's FFN of the n rows of the
 * batch's xn on COMPUTE, dense: the groups in the device cache from there,
 * every other group's bundles streamed through the device a piece at a
 * time; then x += the result. 0, or -1 with err.
 */
uint32_t hyb_ffn_hybrid_prefill_batch_cap(const struct hyb_ffn_hybrid *h);
/* An event for the batch's rows moving to and from the device. */
struct hyb_device_event *hyb_ffn_hybrid_batch_event(struct hyb_ffn_hybrid *h);
void hyb_ffn_hybrid_prefill_bufs(const struct hyb_ffn_hybrid *h, struct hyb_hdense_batch *b);
/*
 * Around a prompt's batches: borrow the cache slots the batch's buffers
 * live in (their groups evicted), and give them back (the groups reloaded).
 * 0, or -1 with err (return: err may be NULL when an error is already set).
 */
int hyb_ffn_hybrid_prefill_borrow(struct hyb_ffn_hybrid *h, char *err, size_t errlen);
int hyb_ffn_hybrid_prefill_return(struct hyb_ffn_hybrid *h, char *err, size_t errlen);
int hyb_ffn_hybrid_prefill_batch_ffn(struct hyb_ffn_hybrid *h, uint32_t l, uint32_t n,
				     char *err, size_t errlen);
/*
 * Several sequences (docs/HYBRID.md "Several sequences"): a sequence opened
 * takes a free KV slot on the device, if any (APEX's GPU-first rule), and
 * gives it back at close; slot: its slot or -1 (it attends on the CPU).
 * seq_bufs: the pass's row buffers on the device, y [n_rows][n_embd] too,
 * and an event for its copies.
 * seq_ffn: layer l's cached groups (the split hyb_ffn_hybrid_prefill_split
 * made) over the n rows of the buffers' xn, into y, queued on COMPUTE.
 */
void hyb_ffn_hybrid_seq_open(struct hyb_ffn_hybrid *h, int seq);
void hyb_ffn_hybrid_seq_close(struct hyb_ffn_hybrid *h, int seq);
int hyb_ffn_hybrid_seq_slot(const struct hyb_ffn_hybrid *h, int seq);
void hyb_ffn_hybrid_seq_bufs(const struct hyb_ffn_hybrid *h, struct hyb_hdense_batch *b,
			     hyb_dptr *y, struct hyb_device_event **ev);
/*
 * Timed events of a pass's layer (decode_seqs.c's profile, APEX 3.2):
 * before q/k/v, after them, after the device's attention, after the wait
 * for the CPU's, after wo, around the FFN kernel.
 */
#define HYB_SEQ_PROF_EVENTS 7
struct hyb_device_event *const *hyb_ffn_hybrid_seq_prof(const struct hyb_ffn_hybrid *h);
/* Device seconds of a layer's linear parts and attention; layers: 1 once a layer. */
void hyb_ffn_hybrid_seq_profile(struct hyb_ffn_hybrid *h, double linear_s, double attn_s,
				uint32_t layers);
int hyb_ffn_hybrid_seq_ffn(struct hyb_ffn_hybrid *h, uint32_t l, uint32_t n, char *err,
			   size_t errlen);
/*
 * The pass's predictions by layer parity i (hyb_hdense_predict_rows' layout
 * for seq_rows rows), on the device and their pinned host copy; false when
 * there are none (no predictors, or oracle mode: passes then run dense).
 */
bool hyb_ffn_hybrid_seq_preds(const struct hyb_ffn_hybrid *h, int i, hyb_dptr *dev,
			      uint32_t **host);
/*
 * The decoded rows' CPU shares of layer l (a pass of several sequences):
 * for each row t of n with row_dense[t] == 0, the sparse operator over its
 * predicted neurons (preds + t * (1 + n_ff): a count, then the list)
 * outside the groups skip marks (the device's), every such neuron under
 * exact CATS, as one sequence's step computes it, into y[t]; rows to the
 * pool's threads as they come. 0 or -1 with err.
 */
int hyb_ffn_hybrid_seq_cpu_rows(struct hyb_ffn_hybrid *h, struct hyb_threadpool *pool,
				uint32_t l, const float *xn, uint32_t n, const uint32_t *preds,
				const uint8_t *row_dense, const uint8_t *skip, float *y, char *err,
				size_t errlen);
/* The pass's per-thread contexts (hyb_ffn_hybrid_free). */
void hyb_ffn_hybrid_seq_free(struct hyb_ffn_hybrid *h);
/* Group-rows of a pass's FFN the CPU computed, of all its (uncached) group-rows. */
void hyb_ffn_hybrid_seq_groups(struct hyb_ffn_hybrid *h, uint64_t cpu, uint64_t all);
/* Statistics of a pass: rows, and rows of placed layers attended on each side. */
void hyb_ffn_hybrid_seq_stats(struct hyb_ffn_hybrid *h, uint32_t rows, uint64_t dev_rows,
			      uint64_t cpu_rows, double cpu_attn_s);
/* The dense part on the device (NULL when nothing dense was placed). */
struct hyb_hdense *hyb_ffn_hybrid_dense(struct hyb_ffn_hybrid *h);
void hyb_ffn_hybrid_placement(const struct hyb_ffn_hybrid *h, struct hyb_hybrid_offload *out);
void hyb_ffn_hybrid_stats_add(struct hyb_ffn_hybrid *h, double attn_s, double head_s);

struct hyb_device *hyb_ffn_hybrid_device(struct hyb_ffn_hybrid *h);
void hyb_ffn_hybrid_stats(const struct hyb_ffn_hybrid *h, struct hyb_hybrid_stats *out);
void hyb_ffn_hybrid_stats_reset(struct hyb_ffn_hybrid *h);
double hyb_ffn_hybrid_lambda(const struct hyb_ffn_hybrid *h, uint32_t l);
void hyb_ffn_hybrid_cache(const struct hyb_ffn_hybrid *h, uint64_t *resident, uint64_t *slots);
/* hyb_ctx_hybrid_table() */
int hyb_ffn_hybrid_table(const struct hyb_ffn_hybrid *h, int32_t *out);

#endif
