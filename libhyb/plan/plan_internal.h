/* SPDX-License-Identifier: MIT */
/*
 * The stages of `hybctl plan` (hyb/plan.h is the file they produce):
 *   plan_group.c    group size from a transfer model; co-activation grouping
 *                   of each layer's neurons (METIS, KAIROX 5.2)
 *   plan_place.c    which groups start on the GPU (PowerInfer 6.2-6.3 ILP)
 *   predictor.c     per-layer MLP predictors (PowerInfer 5.1), trained in C
 *   plan_import.c   PowerInfer's predictors and GPU index, when the model is theirs
 *   plan_write.c    the driver: checks, the stages in order, the streamed file
 */
#ifndef HYB_PLAN_INTERNAL_H
#define HYB_PLAN_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hyb/plan.h"
#include "hyb/profile.h"

struct hyb_pool;

/* ---- group size (plan_group.c) --------------------------------------------- */

/* A DMA of b bytes takes latency + b / bw seconds. */
struct plan_link {
	double latency_s;
	double bw;          /* bytes/s */
};

/* Share of the link's bandwidth a transfer of `bytes` reaches. */
double plan_link_efficiency(const struct plan_link *k, uint64_t bytes);

/*
 * The smallest GS whose bundle (GS neurons of neuron_bytes each) reaches
 * `target` efficiency, raised so a layer has at most max_groups groups and
 * capped at n_ff.
 */
uint32_t plan_pick_group_size(const struct plan_link *k, uint64_t neuron_bytes, uint32_t n_ff,
			      double target, uint32_t max_groups);

/* ---- grouping (plan_group.c) ----------------------------------------------- */

enum plan_grouping {
	PLAN_GROUP_METIS,      /* co-activation graph partitioned by METIS */
	PLAN_GROUP_CONTIGUOUS, /* source order cut into runs of GS */
	PLAN_GROUP_RANDOM,     /* a random permutation cut into runs of GS */
};

struct plan_group_opts {
	uint32_t group_size;
	uint32_t top_k;        /* strongest neighbours kept per neuron; 0: 32 */
	uint32_t max_samples;  /* samples the graph is built from; 0: 16384 */
	uint64_t seed;
	struct hyb_pool *pool; /* NULL: caller thread only */
};

struct plan_group_info {
	double seconds;        /* graph + METIS + repair */
	uint64_t edges;        /* undirected edges of the graph */
	uint32_t moved;        /* neurons moved to make group sizes exact */
	int variant;           /* METIS setting that won (plan_group_variant_name) */
};

const char *plan_group_variant_name(int variant);

/*
 * perm[n_ff]: source neuron of each bundle-order neuron. Groups are ordered
 * by mean activation frequency (descending; the short group, when GS does
 * not divide n_ff, is last as the format requires) and neurons within a
 * group by frequency. 0, or -1 with a one-line reason.
 */
int plan_group_layer(const struct hyb_profile *p, uint32_t layer, enum plan_grouping how,
		     const struct plan_group_opts *o, int32_t *perm, struct plan_group_info *info,
		     char *err, size_t errlen);

/* How well a grouping keeps co-activated neurons together, over the samples. */
struct plan_group_quality {
	double inside;         /* share of co-active neuron pairs that share a group */
	double active_groups;  /* mean groups with an active neuron per sample */
	double active_neurons; /* mean active neurons per sample */
};

void plan_group_quality(const struct hyb_profile *p, uint32_t layer, const int32_t *perm,
			uint32_t group_size, struct plan_group_quality *q);

/* ---- placement (plan_place.c) ---------------------------------------------- */

/*
 * One layer of the placement problem: n groups with impact value[g] (the
 * sum of the group's neuron frequencies, PowerInfer eq. 1) and size bytes[g];
 * if any group of the layer is on the GPU, at least min_groups are
 * (PowerInfer eq. 7-8, C_l in groups).
 */
struct plan_place_layer {
	uint32_t n;
	const double *value;
	const uint64_t *bytes;
	uint32_t min_groups;
};

struct plan_place_result {
	double value;      /* objective: impact on the GPU */
	uint64_t bytes;    /* bytes on the GPU */
	double bound;      /* LP-relaxation upper bound of the objective */
	bool optimal;      /* the search proved value optimal */
	uint64_t nodes;    /* branch-and-bound nodes visited */
};

/* The communication constraint's minimum (PowerInfer eq. 4-5), in neurons. */
struct plan_sync_model {
	double t_sync;     /* seconds per CPU-GPU synchronisation of a split layer */
	double bw_cpu;     /* bytes/s */
	double bw_gpu;
};

uint32_t plan_min_neurons(const struct plan_sync_model *s, uint64_t neuron_bytes, uint32_t n_ff);

/*
 * gpu[l][g] = 1 for the groups placed. Greedy on impact per byte, a layer
 * entering with its best min_groups groups at once. -1 when out of memory.
 */
int plan_place_greedy(const struct plan_place_layer *L, uint32_t n_layer, uint64_t budget,
		      int8_t *const *gpu, struct plan_place_result *r);

/*
 * Greedy, then an exact branch and bound over layers (per layer: how many
 * groups of each size, the most valuable ones; LP-relaxation bounds) that
 * stops after max_nodes nodes with the best solution found (r->optimal says
 * whether it finished). Needs at most two distinct group sizes per layer
 * (full groups and the short last one); otherwise the greedy answer is
 * returned unproven. -1 when out of memory.
 */
int plan_place_solve(const struct plan_place_layer *L, uint32_t n_layer, uint64_t budget,
		     uint64_t max_nodes, int8_t *const *gpu, struct plan_place_result *r);

/* ---- predictors (predictor.c) ---------------------------------------------- */

struct plan_pred_opts {
	uint32_t hidden;       /* H; 0: plan_pred_hidden() */
	double target_recall;  /* threshold chosen for it on validation samples (0.995) */
	uint32_t max_epochs;   /* 0: 10 */
	double gflop;          /* training compute cap per layer, GFLOP; 0: 200 */
	uint32_t batch;        /* minibatch; 0: 128 */
	float lr;              /* Adam step; 0: 1e-2, decayed linearly to 10% */
	float pos_weight;      /* BCE weight of positives; 0: auto */
	uint64_t seed;
	struct hyb_pool *pool;
};

/*
 * H from the layer's profile: one hidden unit per 16 bits of activation
 * entropy per token (sum over neurons of the binary entropy of their
 * frequency), rounded up to a multiple of 32, within [lo, hi].
 */
uint32_t plan_pred_hidden(const struct hyb_profile *p, uint32_t layer, uint32_t lo, uint32_t hi);

/* A trained predictor, owned (malloc'd arrays). */
struct plan_predictor {
	uint32_t n_in, hidden, n_out;
	uint16_t *fc1_w;   /* F16 [hidden][n_in] */
	float *fc1_b;
	uint16_t *fc2_w;   /* F16 [hidden][n_out]: a row per hidden unit, outputs in order */
	float *fc2_b;      /* threshold folded in */
};

struct plan_pred_stats {
	uint32_t hidden, n_train, n_val, n_test;
	double epochs;
	double threshold;  /* logit threshold chosen (subtracted from fc2.bias) */
	double recall, precision, pred_frac, true_frac; /* test samples, final weights */
	double loss;       /* mean training loss over the last (up to 8) steps */
	double seconds;
};

/*
 * Train layer `layer`'s predictor on the profile's samples: the first 80%
 * (in sample order) train, the next 10% pick the threshold for the target
 * recall, the last 10% measure. Outputs in the order of perm (output i
 * predicts source neuron perm[i]; NULL: source order). 0, or -1 with a reason.
 */
int plan_pred_train(const struct hyb_profile *p, uint32_t layer, uint32_t hidden,
		    const int32_t *perm, const struct plan_pred_opts *o,
		    struct plan_predictor *out, struct plan_pred_stats *st, char *err,
		    size_t errlen);
void plan_predictor_free(struct plan_predictor *pr);

/* ---- the whole plan (plan_write.c) ------------------------------------------ */

struct plan_opts {
	uint64_t gpu_budget;           /* bytes */
	uint32_t group_size;           /* 0: from the link model */
	struct plan_link link;         /* PCIe model for GS */
	double target_efficiency;      /* 0.8 */
	uint32_t max_groups;           /* 1024 */
	enum plan_grouping grouping;
	struct plan_group_opts group;  /* group_size and pool filled in by plan_make */
	struct plan_sync_model sync;   /* C_l */
	struct plan_pred_opts pred;
	uint32_t pred_hidden_lo, pred_hidden_hi;  /* bounds of the H rule (32, 1024) */
	uint64_t place_nodes;          /* branch-and-bound node limit */
	int n_threads;                 /* <= 0: all CPUs */
	bool quiet;                    /* no per-layer report on stdout */
	/* A PowerInfer model: train predictors instead of importing its own. */
	bool train_predictors;
	/* A PowerInfer GPU index (*.gpuidx): place groups to cover its GPU neurons. */
	const char *gpu_index;
};

void plan_opts_default(struct plan_opts *o);

/* ---- PowerInfer files (plan_import.c) ----------------------------------------- */

struct hyb_model;

/*
 * Whether a PowerInfer model carries its predictors: 1 when every layer has
 * a readable fc1/fc2 pair (hidden sizes in hidden[n_layer]), 0 when no layer
 * has one, -1 with the reason otherwise.
 */
int plan_pi_predictors(const struct hyb_model *m, uint32_t *hidden, char *err, size_t errlen);

/* Layer l's PowerInfer predictor as a plan predictor, outputs in bundle order (perm). */
int plan_pi_predictor(const struct hyb_model *m, uint32_t l, const int32_t *perm,
		      struct plan_predictor *out, char *err, size_t errlen);

/*
 * Read a PowerInfer GPU index: hot[l][i] = 1 when it puts neuron i of layer l
 * on the GPU; *vram_capacity its split.vram_capacity (0 when absent).
 */
int plan_pi_gpu_index(const char *path, uint32_t n_layer, uint32_t n_ff, uint8_t **hot,
		      uint64_t *vram_capacity, char *err, size_t errlen);

/*
 * Read model `model_path` (mapped, layer by layer), group, place, train and
 * write the plan to out_path (through a temporary file renamed at the end:
 * nothing is left behind on failure). Prints its choices and per-layer
 * numbers on stdout unless quiet. 0, or -1 with a one-line reason in err.
 */
int plan_make(const char *model_path, const struct hyb_profile *prof, const struct plan_opts *o,
	      const char *out_path, char *err, size_t errlen);

#endif
