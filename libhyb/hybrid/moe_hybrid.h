/* SPDX-License-Identifier: MIT */
/*
 * The expert cache of a mixture-of-experts model (docs/MOE.md, "The expert
 * cache"): hot experts live in device slots and are computed there, the
 * others in place on the CPU (moe.c), each decode step; a balancer policy
 * (hyb/balancer.h, a layer's experts as its groups) moves experts between
 * the two through the device's RELOAD stream. moe.c calls it once per MoE
 * layer per decoded token, in layer order.
 */
#ifndef HYB_MOE_HYBRID_H
#define HYB_MOE_HYBRID_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hyb/hybrid.h"

struct hyb_hdense;
struct hyb_ctx;
struct hyb_moe_hybrid;

/*
 * NULL with a one-line reason in err: a type the device's matvec does not
 * take, a budget that holds no expert, the device not opening. p->bal.freq
 * (may be NULL: uniform) gives each layer's expert frequencies, [n_layer]
 * [n_expert] by model layer (a routing profile's blk.L.expert_freq). The
 * policy's initial experts are loaded before it returns. n_rows: 1 (one
 * sequence: decode steps go through the cache, prompts run on the CPU), or
 * a pass's rows with several sequences: every pass goes through the cache,
 * and its attention runs on the CPU, the whole budget the experts'.
 */
struct hyb_moe_hybrid *hyb_moe_hybrid_new(const struct hyb_model *m,
					  const struct hyb_hybrid_params *p, uint32_t n_ctx,
					  uint32_t n_rows, char *err, size_t errlen);
void hyb_moe_hybrid_free(struct hyb_moe_hybrid *h);

/*
 * Layer l of a decode step (one token) or a pass (nf tokens), experts
 * active[0..n) chosen by the router (ascending), expert e's pairs start[e]
 * .. start[e + 1] - 1, pair j of token tok[j] (moe.c's grouping): the
 * resident ones that have landed are queued on the device, each over its
 * tokens' rows of xn (n_embd floats each), and active[] is reordered so
 * that the CPU's come first; returns how many those are (the device has
 * the rest). -1 with err on a device error.
 */
int hyb_moe_hybrid_begin(struct hyb_moe_hybrid *h, uint32_t l, const float *xn, uint32_t nf,
			 const uint32_t *start, const uint32_t *tok, uint32_t *active, uint32_t n,
			 char *err, size_t errlen);
/*
 * After the CPU's experts: waits for the device's, writes expert e =
 * active[n_cpu + i]'s outputs (n_embd floats a pair) to out + start[e] *
 * n_embd on (moe.c's rows of its pairs), and lets the policy decide loads: this
 * layer's for the next token, unless they were decided from a prediction;
 * with next[0..n_next) (the next layer's router on this layer's input,
 * when hyb_moe_hybrid_prefetching), the next layer's for this token.
 * cpu_s: host seconds the CPU's experts took. 0, or -1 with err.
 */
int hyb_moe_hybrid_end(struct hyb_moe_hybrid *h, uint32_t l, const uint32_t *active,
		       uint32_t n_cpu, uint32_t n, const uint32_t *start, float *out, double cpu_s,
		       const uint32_t *next, uint32_t n_next, char *err, size_t errlen);
/*
 * After end: when begin queued the layer's shared expert on the device (a
 * decode step, shared experts placed there), its output (n_embd floats)
 * into so and its gate's logit into *logit (when the layer has a gate),
 * and true; false: the CPU computes it.
 */
bool hyb_moe_hybrid_shared_out(struct hyb_moe_hybrid *h, float *so, float *logit);
/*
 * Layer l's router on the device, after its attention block there
 * (moe_decode.c): queue queues the logits' matvec on COMPUTE (after the
 * block, before x comes down), 1 when it did, 0 when the router is on the
 * CPU; down sends them after x on CRITICAL; logits waits for them and
 * copies them (n_expert floats), 1 when it did, 0 when none are pending for
 * layer l. -1 on a device error.
 */
int hyb_moe_hybrid_router_queue(struct hyb_moe_hybrid *h, uint32_t l);
int hyb_moe_hybrid_router_down(struct hyb_moe_hybrid *h);
int hyb_moe_hybrid_router_logits(struct hyb_moe_hybrid *h, uint32_t l, float *logits);
/*
 * After router_logits for layer l, with prefetch: layer l + 1's router on
 * layer l's input (its prediction), computed on the device beside it; false
 * when the CPU is to compute it.
 */
bool hyb_moe_hybrid_router_next_logits(struct hyb_moe_hybrid *h, uint32_t l, float *logits);
/* Whether end wants the next layer's predicted experts (a moving policy, prefetch not off). */
bool hyb_moe_hybrid_prefetching(const struct hyb_moe_hybrid *h);

struct hyb_device *hyb_moe_hybrid_device(const struct hyb_moe_hybrid *h);
/*
 * The attention blocks and head it placed on the device (dense.c), NULL when
 * none: then a decode step is forward.c's with moe.c asking the cache, else
 * moe_decode.c's.
 */
struct hyb_hdense *hyb_moe_hybrid_dense(const struct hyb_moe_hybrid *h);
void hyb_moe_hybrid_add_dense_time(struct hyb_moe_hybrid *h, double attn_s, double head_s);
/* The next layer's xn is the device's too (its attention ran there): begin need not send it. */
void hyb_moe_hybrid_xn_on_device(struct hyb_moe_hybrid *h, bool on);
void hyb_moe_hybrid_stats(const struct hyb_moe_hybrid *h, struct hyb_hybrid_stats *out);
void hyb_moe_hybrid_stats_reset(struct hyb_moe_hybrid *h);
/* hyb_ctx_hybrid_layer_stats (hyb/hybrid.h) for model layer l. */
int hyb_moe_hybrid_layer_stats(const struct hyb_moe_hybrid *h, uint32_t l,
			       struct hyb_hybrid_layer_stats *out);
void hyb_moe_hybrid_cache(const struct hyb_moe_hybrid *h, uint64_t *resident, uint64_t *slots);
void hyb_moe_hybrid_offload(const struct hyb_moe_hybrid *h, struct hyb_hybrid_offload *out);
/*
 * A decode step with the dense parts on the device (moe_decode.c): each
 * placed attention block there, x and xn back for the router and the CPU's
 * experts, the head there. 0, or -1 with err.
 */
int hyb_moe_decode_hybrid(struct hyb_ctx *c, int32_t token, float *logits, char *err,
			  size_t errlen);
/* Layer l's FFN of a decode step on c->xn, then the residual: c->x += it. 0, or -1 with err. */
int hyb_moe_decode_ffn(struct hyb_ctx *c, uint32_t l, char *err, size_t errlen);
/* KV rows: the device's to the host before a CPU prompt pass, the host's written after it. */
int hyb_moe_decode_kv_to_host(struct hyb_ctx *c, char *err, size_t errlen);
void hyb_moe_decode_kv_host_wrote(struct hyb_ctx *c);
void hyb_moe_decode_reset(struct hyb_ctx *c);

/*
 * Graph steps (moe_graph.c, docs/MOE.md "One graph a step"). refusal: why
 * this placement cannot take them (NULL: it can). set_graph: begin and end
 * run on g's executor from now on (NULL: as before). step_begin (before a
 * step's launch): the slots' load state as the step will see it; step_end
 * (after it ran): the loads the step's decisions left, issued. queue_layer:
 * layer l's device experts through the lists begin writes, the shared
 * expert, their outputs down. pos_at, host_pos: the step's position word.
 */
struct hyb_moe_graph;
const char *hyb_moe_hybrid_graph_refusal(const struct hyb_moe_hybrid *h);
void hyb_moe_hybrid_set_graph(struct hyb_moe_hybrid *h, struct hyb_moe_graph *g);
struct hyb_moe_graph *hyb_moe_hybrid_graph(const struct hyb_moe_hybrid *h);
/* asked for, and not turned off: off frees the graph, says why in the offload's note */
bool hyb_moe_hybrid_graph_wanted(const struct hyb_moe_hybrid *h);
void hyb_moe_hybrid_graph_off(struct hyb_moe_hybrid *h, const char *why);
void hyb_moe_hybrid_step_begin(struct hyb_moe_hybrid *h);
int hyb_moe_hybrid_step_end(struct hyb_moe_hybrid *h, char *err, size_t errlen);
int hyb_moe_hybrid_queue_layer(struct hyb_moe_hybrid *h, uint32_t l);
hyb_dptr hyb_moe_hybrid_pos_at(const struct hyb_moe_hybrid *h);
uint32_t *hyb_moe_hybrid_host_pos(const struct hyb_moe_hybrid *h);

/* out[l * n_expert + e]: the slot of expert e of layer l, or -1 */
int hyb_moe_hybrid_table(const struct hyb_moe_hybrid *h, int32_t *out);
double hyb_moe_hybrid_lambda(const struct hyb_moe_hybrid *h, uint32_t l);

#endif
