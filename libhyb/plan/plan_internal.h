/* SPDX-License-Identifier: MIT */
/*
 * The stages of `hybctl plan` (hyb/plan.h is the file they produce):
 *   plan/group.c    group size from a transfer model; co-activation grouping
 *                   of each layer's neurons (METIS, KAIROX 5.2)
 *   plan/place.c    which groups start on the GPU (PowerInfer 6.2-6.3 ILP)
 *   plan/predictor_train.c
 *                   per-layer MLP predictors (PowerInfer 5.1), trained in C;
 *                   libhyb/sparse/predictor.c runs them at decode time
 *   plan/import.c   PowerInfer's predictors and GPU index, when the model is theirs
 *   plan/write.c    the driver: checks, the stages in order, the streamed file
 */
#ifndef HYB_PLAN_INTERNAL_H
#define HYB_PLAN_INTERNAL_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hyb/plan.h"
#include "hyb/planner.h"
#include "hyb/profile.h"

/* ---- group size (plan/group.c) --------------------------------------------- */


/* Share of the link's bandwidth a transfer of `bytes` reaches. */
double hyb_plan_link_efficiency(const struct hyb_plan_link *k, uint64_t bytes);

/*
 * The smallest GS whose bundle (GS neurons of neuron_bytes each) reaches
 * `target` efficiency, raised so a layer has at most max_groups groups and
 * capped at n_ff.
 */
uint32_t hyb_plan_pick_group_size(const struct hyb_plan_link *k, uint64_t neuron_bytes, uint32_t n_ff,
			      double target, uint32_t max_groups);

/* ---- grouping (plan/group.c) ----------------------------------------------- */



struct hyb_plan_group_info {
	double seconds;        /* graph + METIS + repair */
	uint64_t edges;        /* undirected edges of the graph */
	uint32_t moved;        /* neurons moved to make group sizes exact */
	int variant;           /* METIS setting that won (hyb_plan_group_variant_name) */
};

const char *hyb_plan_group_variant_name(int variant);

/*
 * perm[n_ff]: source neuron of each bundle-order neuron. Groups are ordered
 * by mean activation frequency (descending; the short group, when GS does
 * not divide n_ff, is last as the format requires) and neurons within a
 * group by frequency. 0, or a negative errno (-EINVAL, -ENOMEM, ...) with a
 * one-line reason in err.
 */
int hyb_plan_group_layer(const struct hyb_profile *p, uint32_t layer, enum hyb_plan_grouping how,
		     const struct hyb_plan_group_opts *o, int32_t *perm, struct hyb_plan_group_info *info,
		     char *err, size_t errlen);

/* How well a grouping keeps co-activated neurons together, over the samples. */
struct hyb_plan_group_quality {
	double inside;         /* share of co-active neuron pairs that share a group */
	double active_groups;  /* mean groups with an active neuron per sample */
	double active_neurons; /* mean active neurons per sample */
};

void hyb_plan_group_quality(const struct hyb_profile *p, uint32_t layer, const int32_t *perm,
			uint32_t group_size, struct hyb_plan_group_quality *q);

/* ---- placement (plan/place.c) ---------------------------------------------- */

/*
 * One layer of the placement problem: n groups with impact value[g] (the
 * sum of the group's neuron frequencies, PowerInfer eq. 1) and size bytes[g];
 * if any group of the layer is on the GPU, at least min_groups are
 * (PowerInfer eq. 7-8, C_l in groups).
 */
struct hyb_plan_place_layer {
	uint32_t n;
	const double *value;
	const uint64_t *bytes;
	uint32_t min_groups;
};

struct hyb_plan_place_result {
	double value;      /* objective: impact on the GPU */
	uint64_t bytes;    /* bytes on the GPU */
	double bound;      /* LP-relaxation upper bound of the objective */
	bool optimal;      /* the search proved value optimal */
	uint64_t nodes;    /* branch-and-bound nodes visited */
};


uint32_t hyb_plan_min_neurons(const struct hyb_plan_sync_model *s, uint64_t neuron_bytes, uint32_t n_ff);

/*
 * gpu[l][g] = 1 for the groups placed. Greedy on impact per byte, a layer
 * entering with its best min_groups groups at once. -1 when out of memory.
 */
int hyb_plan_place_greedy(const struct hyb_plan_place_layer *L, uint32_t n_layer, uint64_t budget,
		      int8_t *const *gpu, struct hyb_plan_place_result *r);

/*
 * Greedy, then an exact branch and bound over layers (per layer: how many
 * groups of each size, the most valuable ones; LP-relaxation bounds) that
 * stops after max_nodes nodes with the best solution found (r->optimal says
 * whether it finished). Needs at most two distinct group sizes per layer
 * (full groups and the short last one); otherwise the greedy answer is
 * returned unproven. -1 when out of memory.
 */
int hyb_plan_place_solve(const struct hyb_plan_place_layer *L, uint32_t n_layer, uint64_t budget,
		     uint64_t max_nodes, int8_t *const *gpu, struct hyb_plan_place_result *r);

/* ---- predictors (plan/predictor_train.c) ----------------------------------- */


/*
 * H from the layer's profile: one hidden unit per 16 bits of activation
 * entropy per token (sum over neurons of the binary entropy of their
 * frequency), rounded up to a multiple of 32, within [lo, hi].
 */
uint32_t hyb_plan_pred_hidden(const struct hyb_profile *p, uint32_t layer, uint32_t lo, uint32_t hi);

/* A trained predictor, owned (malloc'd arrays). */
struct hyb_plan_predictor {
	uint32_t n_in, hidden, n_out;
	uint16_t *fc1_w;   /* F16 [hidden][n_in] */
	float *fc1_b;
	uint16_t *fc2_w;   /* F16 [hidden][n_out]: a row per hidden unit, outputs in order */
	float *fc2_b;      /* threshold folded in */
};

struct hyb_plan_pred_stats {
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
 * predicts source neuron perm[i]; NULL: source order). 0, or a negative
 * errno with a reason in err.
 */
int hyb_plan_pred_train(const struct hyb_profile *p, uint32_t layer, uint32_t hidden,
		    const int32_t *perm, const struct hyb_plan_pred_opts *o,
		    struct hyb_plan_predictor *out, struct hyb_plan_pred_stats *st, char *err,
		    size_t errlen);
void hyb_plan_predictor_free(struct hyb_plan_predictor *pr);

/* ---- the whole plan (plan/write.c) ------------------------------------------ */



/* ---- PowerInfer files (plan/import.c) ----------------------------------------- */

struct hyb_model;

/*
 * Whether a PowerInfer model carries its predictors: 1 when every layer has
 * a readable fc1/fc2 pair (hidden sizes in hidden[n_layer]), 0 when no layer
 * has one, -EINVAL with the reason in err otherwise.
 */
int hyb_plan_pi_predictors(const struct hyb_model *m, uint32_t *hidden, char *err, size_t errlen);

/*
 * Layer l's PowerInfer predictor as a plan predictor, outputs in bundle order
 * (perm). 0, or a negative errno with the reason in err.
 */
int hyb_plan_pi_predictor(const struct hyb_model *m, uint32_t l, const int32_t *perm,
		      struct hyb_plan_predictor *out, char *err, size_t errlen);

/*
 * Read a PowerInfer GPU index: hot[l][i] = 1 when it puts neuron i of layer l
 * on the GPU; *vram_capacity its split.vram_capacity (0 when absent). 0, or
 * a negative errno (hyb_gguf_open's, -EINVAL for a malformed index) with the
 * reason in err.
 */
int hyb_plan_pi_gpu_index(const char *path, uint32_t n_layer, uint32_t n_ff, uint8_t **hot,
		      uint64_t *vram_capacity, char *err, size_t errlen);


#endif
