/* SPDX-License-Identifier: MIT */
/*
 * Online neuron balancing: which FFN neuron groups of each
 * layer live in the device cache, decided per layer per decode step from the
 * predicted-active neurons of that layer. Pure policy: no device, no I/O. The
 * hybrid engine (libhyb/hybrid/ffn_hybrid_cache.c) asks for a decision, carries out the
 * loads and evictions on the device's RELOAD stream, and reports back what it
 * measured (struct hyb_balancer_feedback) for the adaptive policies.
 *
 * docs/BALANCER.md has the rest: the policies, their rules, the defaults.
 */
#ifndef HYB_BALANCER_H
#define HYB_BALANCER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hyb/error.h"

enum hyb_policy {
	HYB_POLICY_STATIC,
	HYB_POLICY_LAYER,
	HYB_POLICY_LRU,
	HYB_POLICY_TOPK,
	HYB_POLICY_DYNAMIC,
	HYB_POLICY_TAM,
	HYB_POLICY_TAM_ADAPTIVE,
	HYB_N_POLICIES
};

/* "static", "layer", "lru", "topk", "dynamic", "tam", "tam-adaptive". */
const char *hyb_policy_name(enum hyb_policy p);
/* 0, or -1 for an unknown name. */
int hyb_policy_parse(const char *name, enum hyb_policy *out);

struct hyb_balancer_params {
	enum hyb_policy policy;
	uint32_t n_layer;
	uint32_t n_ff, group_size;      /* groups per layer: ceil(n_ff / group_size) */
	uint64_t slot_budget;           /* cache slots (one group each) over all layers */
	const float *const *freq;       /* [n_layer][n_groups] profiled activation frequency */
	const int8_t *const *placement; /* [n_layer][n_groups] plan's placement (may be NULL) */
	/* tam, tam-adaptive (0: defaults, chosen and documented in balancer.c) */
	double lambda0, alpha, eps, lambda_min, lambda_max;
	/*
	 * tam, tam-adaptive: the group intensity that counts as a full
	 * activation; TAM's A_g = min(1, share / a_ref), share = active neurons
	 * / neurons of the group. KAIROX's threshold (1 - lambda) + eps is
	 * derived for binary A; with A_g a share, a group whose sustained share
	 * r is below 1 - lambda + eps never becomes a candidate, and lowering
	 * lambda (CPU_BOUND) raises that bar instead of making the policy more
	 * eager. 0 (the default): no constant - per layer, the mean profiled
	 * share of the groups the start set caches, so a group on like the ones
	 * worth a slot counts as a full activation, as a neuron does in the
	 * paper's binary A, at any sparsity and budget (balancer.c). A value in
	 * (0, 1]: that fixed reference for every layer (1: A_g = share).
	 */
	double a_ref;
	/* dynamic (0: defaults) */
	double dyn_lambda, phi_high;
	/* Transfer model for the communication constraint (DynamicInfer 4.3):
	 * seconds to load one group. 0: no window limit. */
	double group_load_s;
};

struct hyb_balancer;

/* NULL with a one-line reason in hyb_last_error() (bad parameters, out of memory). */
struct hyb_balancer *hyb_balancer_new(const struct hyb_balancer_params *p);
void hyb_balancer_free(struct hyb_balancer *b);
enum hyb_policy hyb_balancer_policy(const struct hyb_balancer *b);

/* K_l: cache slots layer l owns (sum over layers <= slot_budget). */
uint32_t hyb_balancer_slots(const struct hyb_balancer *b, uint32_t l);
/* The groups resident at start, before any step (|set| <= K_l). */
uint32_t hyb_balancer_initial(const struct hyb_balancer *b, uint32_t l, uint32_t *groups);
bool hyb_balancer_resident(const struct hyb_balancer *b, uint32_t l, uint32_t g);

/*
 * What the engine measured for layer l in its last step, on the device
 * clock (hyb_device_now). The bottleneck test (the paper leaves it open;
 * balancer.c documents the rule) reads these.
 */
struct hyb_balancer_feedback {
	double cpu_s;       /* host time computing the layer's CPU-side neurons */
	double dev_s;       /* device FFN time of the layer (queue to result) */
	double stall_s;     /* host time waiting for the device at the merge */
	double backlog_s;   /* reload work still queued when this decision is made */
	double window_s;    /* time the loads decided now have before they are used */
	uint32_t late;      /* active neurons whose group was loading, computed on the CPU;
			     * only loads an earlier decision issued (a load decided for
			     * this very step, same-layer prediction, cannot be on time) */
	uint32_t n_active;  /* predicted-active neurons of the step */
};

enum hyb_bottleneck { HYB_BOUND_NONE, HYB_BOUND_IO, HYB_BOUND_CPU };

/*
 * One decision for layer l (KAIROX Algorithm 1 for tam-adaptive): active
 * holds the n_active predicted-active neurons (bundle order, increasing) of
 * the step the decision prepares; fb (may be NULL) last step's figures.
 * Writes the groups to load to load[] and to evict to evict[] (each up to
 * K_l entries) and their counts; updates the resident set. Returns 0, or -1
 * on bad arguments (an index >= n_ff, active not strictly increasing, layer
 * out of range, NULL pointers), with the state unchanged and no loads.
 * O(n_active + n_groups log n_groups), no allocation.
 */
int hyb_balancer_step(struct hyb_balancer *b, uint32_t l, const uint32_t *active,
		      uint32_t n_active, const struct hyb_balancer_feedback *fb, uint32_t *load,
		      uint32_t *n_load, uint32_t *evict, uint32_t *n_evict);

/*
 * lambda of layer l (tam, tam-adaptive; dynamic: its lambda; 0 for the
 * others and for l out of range); the last bottleneck seen (NONE before any).
 */
double hyb_balancer_lambda(const struct hyb_balancer *b, uint32_t l);
enum hyb_bottleneck hyb_balancer_bottleneck(const struct hyb_balancer *b, uint32_t l);

/* Groups per layer: ceil(n_ff / group_size). */
uint32_t hyb_balancer_n_groups(const struct hyb_balancer *b);

/*
 * Replace params.group_load_s (e.g. once the engine has timed its warm
 * start's loads). 0, or -1 for a negative or non-finite value.
 */
int hyb_balancer_set_group_load(struct hyb_balancer *b, double group_load_s);

/*
 * Load-aware neuron selection (DynamicInfer 4.4, App. E.4): which neurons of
 * layer l to compute, given the predictor's logits and the resident set.
 *
 * Static rule: neuron i is active when logit_i > 0 (the plan folds its
 * threshold into the bias), p_i = sigmoid(logit_i). Split thresholds: a
 * resident neuron (its group is in the cache) is computed when
 * logit > theta_g, another when logit > theta_c. Greedy from theta_g =
 * theta_c = 0: while the CPU side is the slower one, raise theta_c (drop the
 * non-resident active neuron of lowest logit) if the error budget allows;
 * otherwise lower theta_g (add the inactive resident neuron of highest logit)
 * as long as the device side stays within the current latency; stop when
 * neither move is possible. Guarantees:
 *   err  = sum over neurons not computed of w_i <= err_static,
 *   t    = max(t_gpu N_gpu, t_cpu N_cpu + t_sync) <= t_static,
 * with w_i = 1 - p_i (the paper's error model, HYB_SELECT_ERR_PAPER) or
 * w_i = p_i (HYB_SELECT_ERR_EXPECTED: the expected number of truly active
 * neurons dropped). A NaN logit counts as -inf (never computed).
 */
enum hyb_select_err { HYB_SELECT_ERR_PAPER = 0, HYB_SELECT_ERR_EXPECTED = 1 };

struct hyb_select_cost {
	double t_gpu;   /* seconds per active neuron on the device (>= 0) */
	double t_cpu;   /* seconds per active neuron on the CPU (>= 0) */
	double t_sync;  /* seconds to merge the CPU's partial result (>= 0) */
	enum hyb_select_err err_model;
	bool counts_only; /* info without err and err_static (an exp per neuron) */
};

struct hyb_select_info {
	uint32_t n_gpu, n_cpu;             /* selected neurons resident / not */
	uint32_t n_gpu_static, n_cpu_static;
	uint32_t added, dropped;           /* resident added, non-resident dropped */
	double err, err_static;            /* sum of w_i over neurons not computed */
	double t, t_static;                /* the latency model above */
};

/*
 * Writes the selected neurons (increasing) to sel[n_ff] and their count to
 * *n_sel; info may be NULL. Uses the balancer's scratch (one call at a time)
 * and O(n_ff log n_ff) time, no allocation. 0, or -1 on bad arguments (layer
 * out of range, NULL pointers, a negative or NaN cost).
 */
int hyb_balancer_select(struct hyb_balancer *b, uint32_t l, const float *logits,
			const struct hyb_select_cost *cost, uint32_t *sel, uint32_t *n_sel,
			struct hyb_select_info *info);

#endif
