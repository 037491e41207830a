/* SPDX-License-Identifier: MIT */
/*
 * Hybrid GPU-CPU decoding of a plan model (and, with the same parameters
 * and statistics, a mixture of experts' expert cache: docs/MOE.md): per layer, the
 * predicted-active neurons whose group is resident in the device's neuron
 * cache run on the device, the rest run on the CPU in place on pool memory,
 * concurrently, and the two partial results are merged (PowerInfer 5.3). A
 * balancer policy (hyb/balancer.h) moves groups between the two as
 * activations drift, through the device's RELOAD stream (KAIROX 5-7), or in
 * box mode through hybd's reload queue into hybd's cache (enum
 * hyb_cache_src below).
 *
 * docs/HYBRID.md has the rest: the details.
 */
#ifndef HYB_HYBRID_H
#define HYB_HYBRID_H

#include <stdbool.h>
#include <stdint.h>

#include "hyb/balancer.h"
#include "hyb/device.h"
#include "hyb/model.h"

/*
 * Whose neuron cache (hyb/gpucache.h). Box mode (a model hybd serves, from
 * hyb_model_load_manifest) can compute on hybd's cache and load groups into
 * it through hybd's reload queue, so the copy engine, its priorities and
 * its statistics are hybd's; any other model has only its own. On hybd's
 * cache, gpu_budget is this app's device memory (dense parts, buffers) and
 * the groups get every slot of hybd's cache (hybd's gpu_cache sizes it).
 */
enum hyb_cache_src {
	HYB_CACHE_AUTO = 0,	/* hybd's when it publishes one this app can use, else own */
	HYB_CACHE_OWN,		/* device memory of this app, loaded on its RELOAD stream */
	HYB_CACHE_HYBD,		/* hybd's, or the context is refused with the reason */
};

/*
 * Load-aware thresholds (DynamicInfer 4.4, docs/BALANCER.md): every token
 * and layer, the predictor's scores go through hyb_balancer_select with the
 * cache as decided and the measured cost of a neuron on each side - cached
 * neurons the predictor scored just under its threshold join the device's
 * list, the CPU's lowest-scored ones are dropped, within the error the one
 * threshold had. AUTO: on (EXPECTED) for the dynamic policy, off otherwise;
 * never in oracle mode, for the layer policy or for a PowerInfer file's
 * predictors (they give no scores).
 */
enum hyb_thresholds {
	HYB_THR_AUTO = 0,
	HYB_THR_OFF,
	HYB_THR_EXPECTED,  /* a skipped neuron weighs p (hyb_balancer_select) */
	HYB_THR_PAPER,     /* ... weighs 1 - p, as the paper writes it */
};

struct hyb_hybrid_params {
	const char *device;            /* "cpu" or "cuda" */
	enum hyb_cache_src cache;
	uint64_t gpu_budget;           /* device bytes for the neuron cache and buffers */
	enum hyb_policy policy;
	struct hyb_device_config dev;  /* capacity: 0 means gpu_budget */
	struct hyb_balancer_params bal;/* tuning only: policy/shape/budget/freq are set here */
	bool dense_on_cpu;             /* attention and head stay on the CPU (the budget is
					* all for neuron groups) */
	bool no_prefetch;              /* MoE (the expert cache): decide a layer's loads after it
					* ran, for the next token, instead of from the layer
					* before's input through this layer's router (docs/MOE.md) */
	bool prefill_cpu;              /* prompt batches run on the CPU alone (by default the
					* placed attention blocks, the head and the cached
					* groups' FFN share, or a plain model's placed FFNs,
					* run on the device) */
	uint32_t prompt_batch;         /* at most this many tokens in a prompt batch on the
					* device (0: as many as its share of the budget holds,
					* up to 512; docs/HYBRID.md "Prompts") */
	enum hyb_thresholds thresholds;/* load-aware thresholds (below) */
	bool graph;                    /* MoE (the expert cache), one sequence: each decode step
					* one device graph, the CPU's share in its host functions
					* (KTransformers 3.3; docs/MOE.md "One graph a step");
					* where the placement does not allow it, the step is queued
					* as usual and hyb_hybrid_offload's graph_note says why */
	/*
	 * Several sequences (hyb_ctx_params.n_seq > 1, docs/HYBRID.md "Several
	 * sequences"): how many of them attend on the device, their KV cache in
	 * device memory (placed with the attention blocks, so fewer leave more
	 * of the budget to neuron groups); the others attend on the CPU over
	 * the KV cache in DRAM while the device runs the rest of the batch
	 * (APEX). Sequences get a device slot in the order they open while one
	 * is free (APEX's GPU-first rule). 0: every sequence (n_seq).
	 */
	uint32_t kv_seqs;
};

struct hyb_hybrid_stats {
	uint64_t tokens;          /* decode steps */
	uint64_t layer_steps;
	uint64_t active;          /* predicted-active neurons */
	uint64_t active_dev;      /* of those, computed on the device */
	uint64_t late;            /* resident but still loading: computed on the CPU */
	uint64_t bound_io;        /* balancer decisions whose bottleneck test said I/O-bound */
	uint64_t bound_cpu;       /* ... CPU-bound (hyb/balancer.h; the rest: neither) */
	uint64_t loads, evicts;   /* groups */
	uint64_t load_bytes;      /* RELOAD traffic */
	uint64_t critical_bytes;  /* inputs and partial results over the link */
	double predictor_s;       /* host clock in predictors */
	double balancer_s;        /* host clock in balancer decisions and issuing loads */
	double cpu_ffn_s;         /* host clock computing CPU-side neurons */
	double dev_ffn_s;         /* device FFN past the CPU's share: queue to partial result,
				   * counted in the steps where the device finished last */
	double dev_kernel_s;      /* device FFN kernels, every step with device work, by the
				   * device's clock (timed events: inputs in to partial out) */
	double stall_s;           /* host waiting for the device at merges */
	double ffn_s;             /* host clock in hybrid FFN layers, all of it */
	double attn_s;            /* host clock in attention blocks (device: to the copy-down) */
	double head_s;            /* host clock in the head */
	uint64_t thr_added;       /* load-aware thresholds: cached neurons under the
				   * predictor's threshold computed anyway */
	uint64_t thr_dropped;     /* ... neurons over it not computed (on the CPU's side) */
	double side_s;            /* of predictor_s and balancer_s: the next layer's decisions
				   * run beside the CPU's share of the FFN (the rest were on
				   * the critical path) */
	uint64_t prompt_batches;  /* prompt batches run on the device (docs/HYBRID.md) */
	uint64_t prompt_stream_bytes; /* FFN bundles streamed through the device for them */
	uint64_t seq_passes;      /* several sequences: passes (hyb_ctx_eval_seqs' steps) */
	uint64_t seq_rows;        /* ... their rows (tokens) */
	uint64_t attn_rows_dev;   /* ... rows attended on the device (placed layers) */
	uint64_t attn_rows_cpu;   /* ... rows of placed layers attended on the CPU (APEX) */
	double cpu_attn_s;        /* host clock in those CPU attentions */
	uint64_t seq_neurons_dev; /* ... FFN neurons times rows computed on the device */
	uint64_t seq_groups_cpu;  /* ... group-rows the CPU computed (its rows' predictions) */
	uint64_t seq_groups_all;  /* ... group-rows not on the device (all computed if dense) */
	uint64_t seq_neurons_cpu; /* ... decode rows' neurons the CPU computed, sparse */
	/*
	 * ... APEX's profile (section 3.2), measured online: device seconds of
	 * the placed layers' linear parts (q/k/v, wo, the cached FFN groups) and
	 * of their attention for the device's sequences, over seq_layers layers;
	 * with attn_rows_* and cpu_attn_s it gives N_G and N_C
	 */
	double seq_linear_s, seq_dev_attn_s;
	uint64_t seq_layers;
};

/* Where the dense parts went (after the placement). */
struct hyb_hybrid_offload {
	uint32_t attn_layers;     /* layers whose attention block is on the device */
	uint32_t predictors;      /* layers whose activation predictor runs on the device */
	bool head;                /* the head is on the device */
	uint32_t dense_layers_cpu;/* layer policy: layers computed dense on the CPU */
	uint64_t dense_bytes;     /* device bytes of attention blocks, KV and head */
	uint64_t cache_bytes;     /* device bytes of neuron cache slots */
	bool cache_hybd;          /* the slots are hybd's (box mode) */
	bool experts;             /* the cache holds a MoE model's experts (docs/MOE.md): the
				   * stats' neurons and groups are its routed experts */
	uint64_t shared_bytes;    /* ... and its shared experts are on the device: their bytes */
	uint64_t router_bytes;    /* ... and its routers (of the layers attending there) */
	char cache_note[256];     /* whose cache and why, one line */
	uint32_t prompt_batch;    /* tokens a prompt batch on the device holds (0: prompts
				   * run token after token, docs/HYBRID.md "Prompts") */
	uint64_t prompt_bytes;    /* the budget's bytes kept for that batch's buffers */
	uint32_t kv_seqs;         /* several sequences: those that attend on the device */
	uint64_t seq_bytes;       /* ... device bytes of the pass's rows (buffers) */
	bool plain;               /* a plain model (docs/HYBRID.md "Plain models"): its
				   * parts placed whole, none of the above caches */
	uint32_t ffn_layers;      /* ... layers whose whole FFN is on the device */
	uint64_t ffn_bytes;       /* ... their device bytes, with the FFN buffers */
	char prompt_note[160];    /* prompt_batch 0: why, and where prompts run instead */
	char graph_note[160];     /* MoE decode steps: one device graph each, or why not */
};

/*
 * Contexts (hyb_ctx_params.hybrid) decode through this when set. Reasons a
 * context refuses: the model is not a plan, the device cannot be opened, the
 * budget holds no group.
 */
struct hyb_ctx;
bool hyb_ctx_hybrid(const struct hyb_ctx *c);
void hyb_ctx_hybrid_stats(const struct hyb_ctx *c, struct hyb_hybrid_stats *out);
void hyb_ctx_hybrid_stats_reset(struct hyb_ctx *c);
/* lambda of layer l (tam policies), NAN for other policies or no hybrid. */
double hyb_ctx_hybrid_lambda(const struct hyb_ctx *c, uint32_t l);
/* Cache slots in use / owned, over all layers. */
void hyb_ctx_hybrid_cache(const struct hyb_ctx *c, uint64_t *resident, uint64_t *slots);
void hyb_ctx_hybrid_offload(const struct hyb_ctx *c, struct hyb_hybrid_offload *out);
/*
 * One MoE layer of the expert cache's decode steps since the last reset
 * (docs/MOE.md): routed (token, expert) pairs, those the device computed,
 * experts loaded into the cache for the layer, host seconds of the CPU's
 * share, seconds spent waiting for the device's.
 */
struct hyb_hybrid_layer_stats {
	uint64_t active, active_dev, loads;
	double cpu_s, stall_s;
};
/* Layer l's (zeros for a dense layer); -EINVAL without an expert cache or past the layers. */
int hyb_ctx_hybrid_layer_stats(const struct hyb_ctx *c, uint32_t l,
			       struct hyb_hybrid_layer_stats *out);
/*
 * The neuron table: out[l * n_groups + g] is the cache slot of group g of
 * layer l, or -1 (n_layer * n_groups entries). A slot whose load is still
 * in flight is listed. -1 without hybrid.
 */
int hyb_ctx_hybrid_table(const struct hyb_ctx *c, int32_t *out);
/* The device's configuration, defaults filled in (zeroed without hybrid). */
void hyb_ctx_hybrid_device_config(const struct hyb_ctx *c, struct hyb_device_config *out);
/* The device's counters (copies, kernels, bytes) since the context was made or reset. */
void hyb_ctx_hybrid_device_stats(const struct hyb_ctx *c, struct hyb_device_stats *out);
/*
 * The clock decode should be timed with: the device's host clock
 * (hyb_device_now: modelled on the CPU device), else CLOCK_MONOTONIC.
 */
double hyb_ctx_clock(struct hyb_ctx *c);

#endif
