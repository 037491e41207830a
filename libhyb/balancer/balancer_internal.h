/* SPDX-License-Identifier: MIT */
/*
 * The balancer's state, shared by its files:
 *   balancer.c          parameters, slot budgets, start set, the step driver,
 *                       the bottleneck test and the window cap
 *   balancer_policy.c   the moving policies' priorities (lru, topk, dynamic,
 *                       tam, tam-adaptive) and the common decision rule
 *   balancer_select.c   load-aware thresholds (DynamicInfer 4.4)
 */
#ifndef HYB_BALANCER_INTERNAL_H
#define HYB_BALANCER_INTERNAL_H

#include "cpu_kernels.h"
#include "hyb/balancer.h"

/* Defaults of the tunables (balancer.c explains each). */
#define BAL_LAMBDA0 0.5
#define BAL_ALPHA 0.08
#define BAL_EPS 0.05
#define BAL_LAMBDA_MIN 0.2
#define BAL_LAMBDA_MAX 0.9
#define BAL_DYN_LAMBDA 1.0
#define BAL_PHI_HIGH 0.5
#define BAL_DYN_RATE (1.0 / 32)
/* bottleneck test */
#define BAL_LATE_SHARE 0.05
#define BAL_STALL_NOISE 0.05

/* One group's place in a decision: sorted by k1, k2 (descending), resident
 * first, freq (descending), index. */
struct bal_item {
	double k1, k2;
	float freq;
	uint32_t g;
	uint8_t res;
};

struct hyb_balancer {
	enum hyb_policy policy;
	uint32_t L, F, GS, G;
	double lambda0, alpha, eps, lambda_min, lambda_max, a_ref;
	double dyn_lambda, phi_high, group_load_s;

	/* per layer */
	uint32_t *k;            /* [L] K_l */
	uint32_t *n_res;        /* [L] */
	uint32_t *n_init;       /* [L] */
	double *lambda;         /* [L] */
	double *a_ref_l;        /* [L] tam: the reference share of A_g (balancer.c) */
	enum hyb_bottleneck *verdict; /* [L] */
	uint64_t *steps;        /* [L] decisions taken */

	/* per layer per group, [L * G] */
	uint8_t *res;           /* resident */
	uint8_t *pinnable;      /* dynamic: a start-set group with freq >= phi_high */
	uint32_t *init;         /* start set, n_init[l] entries at l * G */
	float *freq;            /* profiled frequency (copied) */
	float *score;           /* tam: S; dynamic: running frequency f */
	uint64_t *last;         /* lru: last step the group was active (0: never) */

	/* scratch for one call */
	uint32_t *count;        /* [G] active neurons per group */
	uint64_t gs_recip;      /* hyb_group_recip(GS) (group_div.h) */
	float *act;             /* [G] A_g */
	float *act_n;           /* [G] tam: A_g normalised (balancer.c, tam_intensity) */
	struct bal_item *items; /* [G] */
	/*
	 * select: candidates and their bins (add, abin, drop, dbin: [4][F]), the
	 * cache a bit per neuron, bin counts, the bins' weight bounds
	 */
	uint32_t *sel_idx;
	uint64_t *sel_res;
	uint32_t sel_cnt[2 * HYB_SEL_BINS];
	double sel_add_w[2][HYB_SEL_BINS], sel_drop_w[2][HYB_SEL_BINS];
	double sel_add_iw[2][HYB_SEL_BINS], sel_drop_iw[2][HYB_SEL_BINS]; /* 1 / w, 0 for 0 */
};

static inline uint32_t bal_group_neurons(const struct hyb_balancer *b, uint32_t g)
{
	const uint32_t g0 = g * b->GS;

	return b->F - g0 < b->GS ? b->F - g0 : b->GS;
}

/* balancer_select.c: the bins' weight bounds, once. */
void hyb_bal_select_tables(struct hyb_balancer *b);

/* balancer_policy.c: one moving policy's decision for layer l, from b->act. */
void hyb_bal_decide(struct hyb_balancer *b, uint32_t l, uint32_t cap, uint32_t *load,
		uint32_t *n_load, uint32_t *evict, uint32_t *n_evict);

#endif
