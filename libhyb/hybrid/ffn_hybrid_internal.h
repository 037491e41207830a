/* SPDX-License-Identifier: MIT */
/*
 * The hybrid FFN engine's state, shared by its files:
 *   ffn_hybrid.c         creation and teardown: box mode's cache, the
 *                        device, the balancer, buffers and slots; where a
 *                        layer runs
 *   ffn_hybrid_place.c   where the device budget goes: dense parts, then
 *                        neuron groups
 *   ffn_hybrid_cache.c   what is where in the device's neuron cache and how
 *                        it moves: the balancer's decisions carried out as
 *                        loads and evictions, loads followed until they land
 *   ffn_hybrid_layer.c   one token's FFN of one layer: predict, balance,
 *                        split, both halves, merge
 *   ffn_hybrid_dev.c     the device's half of a split: inputs up, the sparse
 *                        FFN kernel, the partial down or merged on the device
 *   ffn_hybrid_prefill.c a prompt batch's FFN: the cached groups' share on
 *                        the device
 *   ffn_hybrid_stats.c   statistics, and box mode's statistics file
 */
#ifndef HYB_FFN_HYBRID_INTERNAL_H
#define HYB_FFN_HYBRID_INTERNAL_H

#include <stdio.h>

#include "ffn_hybrid.h"

struct hyb_ffn_hybrid {
	const struct hyb_model *m;
	struct hyb_ffn_sparse *sp;      /* predictors and the CPU operator */
	const float *thr;               /* [n_layer] CATS thresholds (the context's), or NULL */
	struct hyb_device *dev;
	struct hyb_hybd_cache *hc;      /* box mode: hybd's cache and queue, else NULL */
	char stats_path[4200];          /* box mode: STATE_DIR/NAME.app.PID (hyb/app_stats.h) */
	double stats_t;                 /* when it was last written (CLOCK_MONOTONIC) */
	bool stats_written;
	struct hyb_balancer *bal;
	struct hyb_hdense *hd;          /* attention blocks and head on the device */
	bool oracle, layer_policy, prefill_cpu;
	bool post_norm; /* some layer has a norm after its FFN (Gemma 3) */
	bool image_pinned;              /* m->image registered with the device */
	bool cur_ready;                 /* cur holds this layer's unit-RMS input */
	struct hyb_hybrid_offload place;
	uint32_t E, F, GS, NG, L;
	uint64_t gs_recip;              /* hyb_group_recip(GS) (group_div.h) */
	uint64_t slot_bytes;

	/* device memory */
	hyb_dptr cache, tables, d_xn, d_list, d_y, d_ycpu;

	/* host: the neuron table mirror (pinned), slots */
	int32_t *table;                 /* [L][NG] global slot or -1 */
	bool *dirty;                    /* [L] table changed since the last upload */
	uint32_t *slot_base, *n_slots;  /* [L] */
	uint32_t *free_slot, *n_free;   /* [total] stacks, per layer at slot_base; [L] */
	uint32_t total_slots;
	struct hyb_device_event **slot_ev; /* [total] the slot's last load */
	/*
	 * Loads in flight, in issue order. RELOAD runs its copies in order, so
	 * polling the oldest one's event until one is not done gives every
	 * completion with one event query each (a query per resident group
	 * and layer would cost more than the FFN: cudaEventQuery is ~1 us).
	 */
	struct inflight { uint32_t slot, layer; uint64_t seq; bool done; } *fly;
	uint32_t fly_cap, fly_head, fly_n;
	uint64_t seq_issued, seq_done;   /* loads queued, loads known landed */
	uint64_t *slot_seq;              /* [total] the slot's last load */
	uint32_t *in_flight;             /* [L] loads of the layer in flight */

	/* pinned staging */
	float *h_xn, *h_y, *h_ycpu;     /* h_y: [E], oracle [NG][E] */
	uint32_t *h_list;

	/*
	 * Load-aware thresholds (DynamicInfer 4.4, ffn_hybrid_layer.c): on, the
	 * error model, each side's measured time per neuron (0: not yet) and the
	 * merge's (the CPU partial over the link).
	 */
	bool thr_on;
	enum hyb_select_err thr_err;
	double t_cpu_n, t_gpu_n, t_sync;
	double thr_gain, thr_cost;       /* running means: CPU time saved, search time, a call */
	uint64_t thr_calls;              /* calls while it does not pay */
	/*
	 * The next layer's decision beside the CPU's share of this one
	 * (ffn_hybrid_layer.c, decide_next): its layer, outcome and time;
	 * next_ready: layer l+1's set was predicted already (on the host)
	 */
	uint32_t side_l;
	int side_rc;
	char side_err[512];
	double side_s;
	bool next_ready;

	/* per token */
	uint32_t *act, *act_next, *act0; /* [F] this layer, next layer, layer 0 */
	/*
	 * their scores (load-aware thresholds): in the device's prediction slots
	 * on the host (dense.c), or in lg_buf[layer & 1] from a host predictor
	 */
	const float *lg, *lg_next;
	float *lg_buf[2];                /* [F] */
	uint64_t *no_bits;               /* [F / 64] zeros: sel_emit lists the scores > 0 */
	uint32_t *all;                   /* [F] 0..F-1: a layer-policy layer's list */
	uint32_t n_act, n_act_next, n_act0;
	uint32_t *cpu_list;              /* [F] */
	uint32_t *dgroup;                /* [NG] oracle: k-th device group of the layer */
	uint32_t *load, *evict;          /* [NG] */
	int8_t *usable;                  /* [NG] scratch: -1 unknown, 0 no, 1 yes */
	uint8_t *pre_skip;               /* [NG] prefill: groups the device computes */
	uint32_t n_pre;                  /* prefill: their neurons, listed in h_list */
	float *cur, *y_cpu, *part;       /* [E] */
	struct hyb_balancer_feedback *fb; /* [L] */
	struct hyb_device_event *ev_in, *ev_k, *ev_out;
	struct hyb_device_event *ev_k0;  /* timed, as ev_k: the layer's kernels start */
	double t_layer_in, window_s, group_load_s;
	double host_bps;          /* the device config's host_gbps: the CPU share's modelled time */
	/*
	 * Loads with a sequence number above this were issued by this layer's
	 * own decision (same-layer mode; UINT64_MAX otherwise): late by
	 * construction, so not a sign for the bottleneck test (split_ffn).
	 */
	uint64_t seq_fresh;
	struct hyb_hybrid_stats st;

	/*
	 * Several sequences (decode_seqs.c): a pass's rows on the device
	 * (seq_rows of them, 0 with one sequence), the device's KV slots and
	 * which sequence holds each (-1: free); seq_slot[seq] the other way.
	 */
	uint32_t n_seq, seq_rows, kv_slots;
	struct hyb_hdense_batch sb;
	hyb_dptr sb_y;
	hyb_dptr sb_pred[2];              /* predictions of the pass's rows, by layer parity */
	uint32_t *h_pred[2];              /* ... on the host (pinned) */
	struct hyb_device_event *ev_seq;  /* the pass's copies */
	struct hyb_device_event *ev_prof[HYB_SEQ_PROF_EVENTS]; /* timed: APEX's profile */
	int32_t *slot_seq_of, *seq_slot;
	/*
	 * The decoded rows' CPU shares, a row to a thread (ffn_hybrid_seqs.c):
	 * each thread's own sparse operator context and list
	 */
	int row_threads;
	struct hyb_sparse_ffn_ctx **row_op;
	uint32_t **row_list;

	/*
	 * A prompt batch on the device (ffn_hybrid_prefill.c): its buffers, and
	 * the two staging areas the FFN bundles of uncached groups stream
	 * through, a piece of groups each, with the piece's list and table -
	 * all in the neuron cache's last slots, from `first` on, borrowed for
	 * the prompt: their groups are evicted for it and reloaded after
	 */
	struct prefill_ws {
		uint32_t want;          /* hyb_hybrid_params.prompt_batch */
		uint32_t cap, piece;    /* tokens a batch holds (0: off), groups a piece */
		uint64_t bytes;         /* all of it */
		uint32_t first;         /* the first slot borrowed */
		uint32_t *evicted;      /* [2 * total slots] (layer, group) pairs to reload */
		uint32_t n_evicted;
		hyb_dptr x, xn, y, q, k, v, att;
		hyb_dptr stage[2], list[2], table[2];
		uint32_t *h_list[2];    /* pinned */
		int32_t *h_table[2];
		uint32_t *groups;       /* [NG] scratch: a piece's groups */
		/* ev_pre: the last cached groups' kernel, which reads d_list and the tables */
		struct hyb_device_event *ev_copy[2], *ev_kern[2], *ev_x, *ev_pre;
		bool used[2];           /* a piece went through this staging area */
	} pw;
};

/* Group g's neurons: GS, fewer in the last group when GS does not divide F. */
static inline uint32_t group_neurons(const struct hyb_ffn_hybrid *h, uint32_t g)
{
	const uint32_t g0 = g * h->GS;

	return h->F - g0 < h->GS ? h->F - g0 : h->GS;
}

/* err: what failed and the device's reason; returns -1. */
static inline int dev_fail(struct hyb_ffn_hybrid *h, char *err, size_t errlen, const char *what)
{
	snprintf(err, errlen, "%s: %s", what, hyb_device_error(h->dev));
	return -1;
}

/*
 * Group g of layer l can be computed on the device: resident and its load
 * landed (h->usable caches the answer for one layer's split; -1 unknown).
 */
static inline bool group_usable(struct hyb_ffn_hybrid *h, uint32_t l, uint32_t g)
{
	if (h->usable[g] < 0) {
		const int32_t s = h->table[(size_t)l * h->NG + g];

		h->usable[g] = s >= 0 && h->slot_seq[s] <= h->seq_done;
	}
	return h->usable[g] > 0;
}

/* ---- ffn_hybrid_cache.c ---- */

/* Take note of the loads that have landed since the last poll (0, or an errno < 0). */
int hyb_ffn_hybrid_cache_poll(struct hyb_ffn_hybrid *h);
/* Wait until every load in flight has landed. */
int hyb_ffn_hybrid_cache_wait_all(struct hyb_ffn_hybrid *h);
/* err: a load's failure, hybd's reason in box mode, else the device's; returns -1. */
int hyb_ffn_hybrid_cache_fail(struct hyb_ffn_hybrid *h, char *err, size_t errlen, const char *what);
/*
 * The balancer's decision for layer l from its predicted set act[n], carried
 * out: evictions, then loads. Returns 0, or -1 with err.
 */
int hyb_ffn_hybrid_cache_balance(struct hyb_ffn_hybrid *h, uint32_t l, const uint32_t *act,
				 uint32_t n, char *err, size_t errlen);
/*
 * A prompt batch borrows slots [first, total slots): their loads waited
 * for, their groups evicted and listed in h->pw.evicted, the slots off the
 * free lists. Returning them puts them back and reloads those groups.
 * 0, or -1 (the device's or hybd's error).
 */
int hyb_ffn_hybrid_cache_borrow(struct hyb_ffn_hybrid *h, uint32_t first);
int hyb_ffn_hybrid_cache_return(struct hyb_ffn_hybrid *h, uint32_t first);
/* The starting cache, loaded before the first token; measures one group's load time. */
int hyb_ffn_hybrid_cache_warm(struct hyb_ffn_hybrid *h, char *err, size_t errlen);

/* ---- ffn_hybrid_dev.c: 0, or -1 on a device error (the caller says it: dev_fail) ---- */

/* The device list h_list[n_dev] and layer l's table go up, xn too unless on_dev. */
int hyb_ffn_hybrid_dev_inputs(struct hyb_ffn_hybrid *h, uint32_t l, const float *xn,
			      uint32_t n_dev, bool on_dev);
/* The sparse FFN kernel of layer l on the cache: list[n] of xn into y. */
struct hyb_dev_ffn hyb_ffn_hybrid_dev_ffn(const struct hyb_ffn_hybrid *h, uint32_t l, hyb_dptr xn,
					  hyb_dptr list, uint32_t n, hyb_dptr y);
/* After the kernels on COMPUTE: bytes of d_y down into h_y, ev_out recorded. */
int hyb_ffn_hybrid_dev_result(struct hyb_ffn_hybrid *h, uint64_t bytes);
/*
 * The device's half of layer l's split, queued: inputs up, the kernel over
 * h_list[n_dev] (oracle mode: one a group, each into its own partial), the
 * partial down unless on_dev. Returns 0, or -1 with err.
 */
int hyb_ffn_hybrid_dev_run(struct hyb_ffn_hybrid *h, uint32_t l, const float *xn, uint32_t n_dev,
			   bool on_dev, char *err, size_t errlen);
/* on_dev: the CPU partial up, both partials added into the device's residual stream. */
int hyb_ffn_hybrid_dev_merge(struct hyb_ffn_hybrid *h, uint32_t n_dev, uint32_t n_cpu);

/* ---- ffn_hybrid_prefill.c ---- */

/*
 * Size the prompt batch's buffers to fit in the neuron cache (h->pw) and
 * lay them out in its last slots, with their pinned host memory and events;
 * 0, or -1 out of memory.
 */
int hyb_ffn_hybrid_prefill_alloc(struct hyb_ffn_hybrid *h);
void hyb_ffn_hybrid_prefill_free(struct hyb_ffn_hybrid *h);

/* ---- ffn_hybrid_place.c ---- */

/* What the budget split decided, until the dense parts are on the device. */
struct hyb_ffn_budget {
	bool *on, *pred;        /* [L] the layer's attention block, its predictor on the device */
	bool head;
	uint64_t slots;         /* cache slots for neuron groups */
};
/* Device bytes of a pass's rows with several sequences (0 with one). */
uint64_t hyb_ffn_hybrid_seq_buf_bytes(const struct hyb_ffn_hybrid *h);
/*
 * The budget split and its checks (the budget holds this app's buffers in
 * box mode, and something in any mode): b->on and b->pred allocated, the
 * caller frees them. Returns 0, or -1 with err.
 */
int hyb_ffn_hybrid_place(struct hyb_ffn_hybrid *h, const struct hyb_hybrid_params *p,
			 uint32_t n_ctx, struct hyb_ffn_budget *b, char *err, size_t errlen);

#endif
