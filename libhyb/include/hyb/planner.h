/* SPDX-License-Identifier: MIT */
/*
 * The offline planner (libhybplan; `hybctl plan`): from a model and its
 * profile (hyb/profile.h) to a plan file (hyb/plan.h) - neuron groups,
 * their placement under a GPU budget, per-layer predictors.
 * docs/PLAN.md walks through the stages.
 */
#ifndef HYB_PLANNER_H
#define HYB_PLANNER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hyb/error.h"

struct hyb_threadpool;
struct hyb_profile;

/* A DMA of b bytes takes latency + b / bw seconds. */
struct hyb_plan_link {
	double latency_s;
	double bw;          /* bytes/s */
};

enum hyb_plan_grouping {
	HYB_PLAN_GROUP_METIS,      /* co-activation graph partitioned by METIS */
	HYB_PLAN_GROUP_CONTIGUOUS, /* source order cut into runs of GS */
	HYB_PLAN_GROUP_RANDOM,     /* a random permutation cut into runs of GS */
};

struct hyb_plan_group_opts {
	uint32_t group_size;
	uint32_t top_k;        /* strongest neighbours kept per neuron; 0: 32 */
	uint32_t max_samples;  /* samples the graph is built from; 0: 16384 */
	uint64_t seed;
	struct hyb_threadpool *pool; /* NULL: caller thread only */
};

/* The communication constraint's minimum (PowerInfer eq. 4-5), in neurons. */
struct hyb_plan_sync_model {
	double t_sync;     /* seconds per CPU-GPU synchronisation of a split layer */
	double bw_cpu;     /* bytes/s */
	double bw_gpu;
};

struct hyb_plan_pred_opts {
	uint32_t hidden;       /* H; 0: hyb_plan_pred_hidden() */
	double target_recall;  /* the threshold is chosen for it on validation samples;
	                        * 0: 0.95, hyb_plan_opts_default: 0.998 */
	uint32_t max_epochs;   /* 0: 10 */
	double gflop;          /* training compute cap per layer, GFLOP; 0: 200 */
	uint32_t batch;        /* minibatch; 0: 128 */
	float lr;              /* Adam step; 0: 1e-2, decayed linearly to 10% */
	float pos_weight;      /* BCE weight of positives; 0: auto */
	uint64_t seed;
	struct hyb_threadpool *pool;
};

struct hyb_plan_opts {
	uint64_t gpu_budget;           /* bytes */
	uint32_t group_size;           /* 0: from the link model */
	struct hyb_plan_link link;         /* PCIe model for GS */
	double target_efficiency;      /* 0.8 */
	uint32_t max_groups;           /* 1024 */
	enum hyb_plan_grouping grouping;
	struct hyb_plan_group_opts group;  /* group_size and pool filled in by hyb_plan_make */
	struct hyb_plan_sync_model sync;   /* C_l */
	struct hyb_plan_pred_opts pred;
	uint32_t pred_hidden_lo, pred_hidden_hi;  /* bounds of the H rule (32, 1024) */
	uint64_t place_nodes;          /* branch-and-bound node limit */
	int n_threads;                 /* <= 0: all CPUs */
	bool quiet;                    /* no per-layer report on stdout */
	/* A PowerInfer model: train predictors instead of importing its own. */
	bool train_predictors;
	/* A PowerInfer GPU index (*.gpuidx): place groups to cover its GPU neurons. */
	const char *gpu_index;
};

void hyb_plan_opts_default(struct hyb_plan_opts *o);

/*
 * Read model `model_path` (mapped, layer by layer), group, place, train and
 * write the plan to out_path (through a temporary file renamed at the end:
 * nothing is left behind on failure). Prints its choices and per-layer
 * numbers on stdout unless quiet. 0, or a negative errno with a one-line
 * reason in hyb_last_error() (hyb/error.h): -EINVAL for a model, profile or
 * option the plan cannot be made from (a budget too small, a profile of
 * another model...), -ENOMEM, or the errno of a failed read or write.
 */
int hyb_plan_make(const char *model_path, const struct hyb_profile *prof,
		  const struct hyb_plan_opts *o, const char *out_path);

#endif
