// SPDX-License-Identifier: MIT
/*
 * Online neuron balancer (hyb/balancer.h): parameters, slot budgets, the
 * start set and the step driver. The policies' priorities are in
 * balancer_policy.c, the load-aware thresholds in balancer_select.c.
 *
 * Choices where the papers are silent, and why:
 *
 * Slot budgets K_l. DynamicInfer E.3.4 takes its per-layer budgets from
 * PowerInfer's offline ILP (6.2); KAIROX 6 only says "K is determined by the
 * GPU memory budget". We re-solve PowerInfer's placement for the run's
 * slot_budget with one slot per group (bytes = 1) and value = freq * neurons
 * of the group: the expected active neurons the group serves, i.e. PowerInfer
 * eq. 1's impact summed over the group, so a short last group is not
 * overrated. With unit sizes the knapsack's LP relaxation is integral and
 * its greedy solution is exact: the global top B groups by value (ties to the
 * lower layer, then the lower group), so the offline planner's branch and
 * bound (plan/place.c) would add nothing. min_groups is 0 (at least one group
 * to enter a layer, i.e. no constraint): PowerInfer's C_l (eq. 7-8) stops a
 * layer being split when the GPU's share cannot pay for the synchronisation,
 * but the hybrid engine runs every layer split anyway (the device FFN and the
 * merge happen whenever a slot of the layer is in use), and a slot budget
 * spent on a layer's few hot groups is never worse for the hit rate. When the
 * plan's placement is given, its groups come first (value + GS + 1, above any
 * unplaced group): the plan was solved with the real byte sizes and C_l, so
 * we honour its choice as far as the run's budget allows, then fill by freq.
 * Every policy but layer uses the same K_l, so the comparison between
 * policies is only about which groups they keep, never about how the budget
 * is split (an equal split would hand cold layers slots that static cannot
 * use well and make static look worse than its placement is).
 *
 * Start set: the groups that solve chose, i.e. each layer's top groups by
 * freq (the plan's first), PowerInfer's offline placement as a warm start for
 * every policy: the dynamic ones start from the same cache static keeps, so
 * a run's first steps do not pay for filling an empty cache.
 *
 * layer (llama.cpp -ngl): whole layers from layer 0 while n_groups slots
 * still fit; the remainder of the budget (less than one layer) stays unused,
 * as in llama.cpp, where a partial layer is not offloaded.
 *
 * TAM (KAIROX 6, Eq. 5; Algorithm 1). lambda0 = 0.5 is the paper's start
 * value and its fixed-lambda ablation (9.4). alpha = 0.08: Fig. 11 shows
 * lambda rising monotonically from 0.5 to about 0.85 over steps 1-7 of an
 * IO-bound layer, and 0.5 * 1.08^7 = 0.86. lambda_max = 0.9: above the 0.85
 * the paper settles at, but below the point where 1 - lambda + eps ~ eps and
 * the one-hit filter stops meaning anything. lambda_min = 0.2: S then follows
 * the last step almost alone (topk-like), lower would only add noise.
 * eps = 0.05: a group fully active on two steps in a row from S = 0 reaches
 * (1 - lambda)(1 + lambda) = 1 - lambda^2, above the threshold iff
 * lambda (1 - lambda) > eps; that holds over all of [0.2, 0.9] (>= 0.09),
 * while one isolated activation, (1 - lambda) A <= 1 - lambda, never passes.
 * Scores start at min(1, freq / a_ref) with a fixed a_ref: freq is the
 * long-run mean share, and the mean of A_g the fixed point of Eq. 5, so the
 * warm start and the scores agree (exactly with a_ref = 1; min(1, .) of a
 * mean is an upper bound of the mean of min(1, .), close enough for a
 * start).
 *
 * Group intensity (KAIROX 6: "normalized intra-group activation intensity",
 * normalisation not given): A_g = share of the group's neurons active,
 * in [0, 1] like the frequencies it is mixed with. For TAM it is normalised
 * (hyb/balancer.h, a_ref): by default per layer by the mean profiled share
 * of the start set's groups (start_reference), which needs no constant and
 * makes a group on like the groups worth a slot a full activation at any
 * sparsity - a fixed reference tuned at one sparsity runs the adaptive loop
 * backwards at another (0.5 at 90% and 97%, where on-groups have shares of
 * 0.1-0.4: test_balancer's bal_tam_adaptive_direction_at_two_sparsities).
 * Each group's own running on-share was tried as the reference: it needs
 * no profile, but a group with one predicted neuron is then "on as usual"
 * as much as a hot one, and on the 8-layer 4096/11008 plan it cached 77%
 * of active neurons against 82% (10% fewer tokens/s).
 *
 * dynamic (DynamicInfer 4.3, E.3). dyn_lambda = 1: v = a + lambda f adds two
 * estimates of the same thing (the chance the group is needed now), a from
 * the predictor and f from history; the paper leaves lambda free and 1 lets
 * neither dominate. f (how it is updated is not given) is an exponential
 * average of A_g at rate 1/32 per step, starting at the profiled freq: the
 * paper's macro level tracks frequencies "per sentence", and 32 tokens is
 * about one. phi_high = 0.5: a group whose neurons fire on more than half of
 * the tokens comes back within about two steps, so evicting it is never worth
 * the reload. Pins (E.3: h = 1 iff f >= phi_high, g >= h) follow the
 * running f one way: the start set's groups with profiled freq >= phi_high
 * are pinned while their f stays >= phi_high, and a pin that cools below it
 * competes again (frozen pins kept a silent hot set forever). A group that
 * heats up during the run is not pinned: pinning those too, as the paper's
 * rule reads, held slots past their topic - on the 8-layer 4096/11008 plan
 * at 60% under drift every 32 tokens it kept 78% of active neurons on the
 * device against 83%, 0.86x the tokens/s (docs/BALANCER.md). They count
 * against K_l.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "balancer_internal.h"
#include "sparse/group_div.h"
#include "util/error.h"

static const char *const policy_names[HYB_N_POLICIES] = {
	[HYB_POLICY_STATIC] = "static",   [HYB_POLICY_LAYER] = "layer",
	[HYB_POLICY_LRU] = "lru",         [HYB_POLICY_TOPK] = "topk",
	[HYB_POLICY_DYNAMIC] = "dynamic", [HYB_POLICY_TAM] = "tam",
	[HYB_POLICY_TAM_ADAPTIVE] = "tam-adaptive",
};

const char *hyb_policy_name(enum hyb_policy p)
{
	return (unsigned)p < HYB_N_POLICIES ? policy_names[p] : "unknown";
}

int hyb_policy_parse(const char *name, enum hyb_policy *out)
{
	for (int p = 0; name && p < HYB_N_POLICIES; p++)
		if (!strcmp(name, policy_names[p])) {
			*out = (enum hyb_policy)p;
			return 0;
		}
	return hyb_error_set(-EINVAL, "unknown policy '%s' (static, layer, lru, topk, dynamic, "
			     "tam, tam-adaptive)", name ? name : "(null)");
}

/* ---- parameters --------------------------------------------------------------- */

static double or_default(double v, double d)
{
	return v == 0 ? d : v;
}

static int check_params(struct hyb_balancer *b, const struct hyb_balancer_params *p, char *err,
			size_t errlen)
{
	if ((unsigned)p->policy >= HYB_N_POLICIES) {
		snprintf(err, errlen, "balancer: unknown policy %d", (int)p->policy);
		return -1;
	}
	if (!p->n_layer || !p->n_ff || !p->group_size) {
		snprintf(err, errlen, "balancer: n_layer (%u), n_ff (%u) and group_size (%u) "
			 "must be > 0", p->n_layer, p->n_ff, p->group_size);
		return -1;
	}
	if (!p->freq) {
		snprintf(err, errlen, "balancer: no group frequencies (freq is NULL)");
		return -1;
	}
	/* the group of a neuron by reciprocal multiply (group_div.h) is exact below this */
	if (!hyb_group_recip_ok(p->n_ff, p->group_size)) {
		snprintf(err, errlen, "balancer: n_ff %u x group_size %u is out of range", p->n_ff,
			 p->group_size);
		return -1;
	}
	b->policy = p->policy;
	b->L = p->n_layer;
	b->F = p->n_ff;
	b->GS = p->group_size;
	b->gs_recip = hyb_group_recip(p->group_size);
	b->G = (uint32_t)(((uint64_t)p->n_ff + p->group_size - 1) / p->group_size);
	for (uint32_t l = 0; l < b->L; l++) {
		if (!p->freq[l] || (p->placement && !p->placement[l])) {
			snprintf(err, errlen, "balancer: layer %u has no %s", l,
				 p->freq[l] ? "placement" : "frequencies");
			return -1;
		}
		for (uint32_t g = 0; g < b->G; g++) {
			const float f = p->freq[l][g];

			if (!(f >= 0 && f <= 1)) {
				snprintf(err, errlen, "balancer: layer %u group %u: frequency %g "
					 "outside [0, 1]", l, g, (double)f);
				return -1;
			}
		}
	}
	b->lambda0 = or_default(p->lambda0, BAL_LAMBDA0);
	b->alpha = or_default(p->alpha, BAL_ALPHA);
	b->eps = or_default(p->eps, BAL_EPS);
	b->lambda_min = or_default(p->lambda_min, BAL_LAMBDA_MIN);
	b->lambda_max = or_default(p->lambda_max, BAL_LAMBDA_MAX);
	b->a_ref = p->a_ref; /* 0: each group's own running reference */
	b->dyn_lambda = or_default(p->dyn_lambda, BAL_DYN_LAMBDA);
	b->phi_high = or_default(p->phi_high, BAL_PHI_HIGH);
	b->group_load_s = p->group_load_s;
	if (!(b->lambda0 > 0 && b->lambda0 < 1) || !(b->lambda_min > 0) ||
	    !(b->lambda_max < 1) || !(b->lambda_min <= b->lambda_max)) {
		snprintf(err, errlen, "balancer: lambda0 %g, lambda_min %g, lambda_max %g: need "
			 "0 < lambda < 1 and lambda_min <= lambda_max", b->lambda0,
			 b->lambda_min, b->lambda_max);
		return -1;
	}
	if (p->policy == HYB_POLICY_TAM_ADAPTIVE &&
	    (b->lambda0 < b->lambda_min || b->lambda0 > b->lambda_max)) {
		snprintf(err, errlen, "balancer: lambda0 %g outside [lambda_min %g, lambda_max "
			 "%g]", b->lambda0, b->lambda_min, b->lambda_max);
		return -1;
	}
	if (!(b->alpha > 0 && b->alpha < 1) || !(b->eps > 0 && b->eps < 1)) {
		snprintf(err, errlen, "balancer: alpha %g and eps %g must lie in (0, 1)",
			 b->alpha, b->eps);
		return -1;
	}
	if (!(b->a_ref >= 0 && b->a_ref <= 1)) {
		snprintf(err, errlen, "balancer: a_ref %g must lie in [0, 1] (0: each group's own "
			 "running reference)", b->a_ref);
		return -1;
	}
	if (!(b->dyn_lambda > 0 && isfinite(b->dyn_lambda)) ||
	    !(b->phi_high > 0 && isfinite(b->phi_high))) {
		snprintf(err, errlen, "balancer: dyn_lambda %g and phi_high %g must be finite "
			 "and > 0", b->dyn_lambda, b->phi_high);
		return -1;
	}
	if (!(b->group_load_s >= 0 && isfinite(b->group_load_s))) {
		snprintf(err, errlen, "balancer: group_load_s %g must be finite and >= 0",
			 b->group_load_s);
		return -1;
	}
	return 0;
}

/* ---- slots and the start set ---------------------------------------------------- */

static void start_layers(struct hyb_balancer *b, uint64_t budget)
{
	for (uint32_t l = 0; l < b->L; l++) {
		const bool in = budget >= b->G;

		b->k[l] = in ? b->G : 0;
		if (in)
			budget -= b->G;
		b->n_init[l] = b->k[l];
		for (uint32_t g = 0; g < b->k[l]; g++)
			b->init[(size_t)l * b->G + g] = g;
	}
}

struct ranked {
	double v;
	uint32_t l, g;
};

/* value descending; ties to the lower layer, then the lower group */
static int cmp_ranked(const void *pa, const void *pb)
{
	const struct ranked *a = pa, *b = pb;

	if (a->v != b->v)
		return a->v > b->v ? -1 : 1;
	if (a->l != b->l)
		return a->l < b->l ? -1 : 1;
	return a->g < b->g ? -1 : a->g > b->g;
}

/* PowerInfer 6.2 placement re-solved for the slot budget (see the top): the top B groups. */
static int start_placed(struct hyb_balancer *b, const struct hyb_balancer_params *p)
{
	const size_t n = (size_t)b->L * b->G;
	struct ranked *r = malloc((n ? n : 1) * sizeof(*r));
	uint8_t *on = calloc(n ? n : 1, 1);
	size_t k = 0;

	if (!r || !on) {
		free(r);
		free(on);
		return -1;
	}
	for (uint32_t l = 0; l < b->L; l++)
		for (uint32_t g = 0; g < b->G; g++) {
			double v = (double)p->freq[l][g] * bal_group_neurons(b, g);

			if (p->placement && p->placement[l][g])
				v += b->GS + 1.0;
			r[k++] = (struct ranked){ v, l, g };
		}
	qsort(r, n, sizeof(*r), cmp_ranked);
	for (size_t q = 0; q < n && q < p->slot_budget; q++)
		on[(size_t)r[q].l * b->G + r[q].g] = 1;
	for (uint32_t l = 0; l < b->L; l++) {
		b->k[l] = 0;
		for (uint32_t g = 0; g < b->G; g++)
			if (on[(size_t)l * b->G + g])
				b->init[(size_t)l * b->G + b->k[l]++] = g;
		b->n_init[l] = b->k[l];
	}
	free(r);
	free(on);
	return 0;
}

/*
 * Layer l's TAM reference, from the profile (hyb/balancer.h, a_ref 0): the
 * mean profiled share of the groups the start set caches - the intensity of
 * a group worth a slot at this budget and sparsity. Groups steadily on are
 * the start set's, so their mean share is about their share when on. No
 * start set (no slots): the mean share of the groups ever on; none: 1.
 */
static double start_reference(const struct hyb_balancer *b, uint32_t l)
{
	const size_t o = (size_t)l * b->G;
	double sum = 0;
	uint32_t n = 0;

	for (uint32_t q = 0; q < b->n_init[l]; q++)
		sum += b->freq[o + b->init[o + q]], n++;
	if (!n || !(sum > 0)) {
		sum = 0, n = 0;
		for (uint32_t g = 0; g < b->G; g++)
			if (b->freq[o + g] > 0)
				sum += b->freq[o + g], n++;
	}
	return n && sum > 0 ? (sum / n < 1 ? sum / n : 1) : 1;
}

static void init_state(struct hyb_balancer *b)
{
	for (uint32_t l = 0; l < b->L; l++) {
		const size_t o = (size_t)l * b->G;

		b->lambda[l] = b->policy == HYB_POLICY_DYNAMIC ? b->dyn_lambda : b->lambda0;
		b->verdict[l] = HYB_BOUND_NONE;
		for (uint32_t q = 0; q < b->n_init[l]; q++) {
			const uint32_t g = b->init[o + q];

			b->res[o + g] = 1;
			if (b->policy == HYB_POLICY_DYNAMIC && b->freq[o + g] >= b->phi_high)
				b->pinnable[o + g] = 1;
		}
		b->n_res[l] = b->n_init[l];
		b->a_ref_l[l] = b->a_ref > 0 ? b->a_ref : start_reference(b, l);
		for (uint32_t g = 0; g < b->G; g++)
			b->score[o + g] = b->policy == HYB_POLICY_DYNAMIC ? b->freq[o + g] :
					  fminf(1, (float)(b->freq[o + g] / b->a_ref_l[l]));
	}
}

static struct hyb_balancer *balancer_new(const struct hyb_balancer_params *p, char *err,
					 size_t errlen)
{
	struct hyb_balancer *b;
	size_t n;

	if (!p) {
		snprintf(err, errlen, "balancer: no parameters");
		return NULL;
	}
	b = calloc(1, sizeof(*b));
	if (!b)
		goto oom;
	if (check_params(b, p, err, errlen)) {
		free(b);
		return NULL;
	}
	n = (size_t)b->L * b->G;
	b->k = calloc(b->L, sizeof(*b->k));
	b->n_res = calloc(b->L, sizeof(*b->n_res));
	b->n_init = calloc(b->L, sizeof(*b->n_init));
	b->lambda = calloc(b->L, sizeof(*b->lambda));
	b->verdict = calloc(b->L, sizeof(*b->verdict));
	b->steps = calloc(b->L, sizeof(*b->steps));
	b->res = calloc(n, 1);
	b->pinnable = calloc(n, 1);
	b->init = calloc(n, sizeof(*b->init));
	b->freq = malloc(n * sizeof(*b->freq));
	b->score = malloc(n * sizeof(*b->score));
	b->a_ref_l = calloc(b->L, sizeof(*b->a_ref_l));
	b->last = calloc(n, sizeof(*b->last));
	b->count = calloc(b->G, sizeof(*b->count));
	b->act = calloc(b->G, sizeof(*b->act));
	b->act_n = calloc(b->G, sizeof(*b->act_n));
	b->items = calloc(b->G, sizeof(*b->items));
	b->sel_idx = calloc(4 * (size_t)b->F, sizeof(*b->sel_idx));
	b->sel_res = calloc((b->F + 63) / 64, sizeof(*b->sel_res));
	if (!b->k || !b->n_res || !b->n_init || !b->lambda || !b->verdict || !b->steps ||
	    !b->res || !b->pinnable || !b->init || !b->freq || !b->score || !b->a_ref_l ||
	    !b->last ||
	    !b->count || !b->act || !b->act_n || !b->items || !b->sel_idx || !b->sel_res)
		goto oom;
	for (uint32_t l = 0; l < b->L; l++)
		memcpy(&b->freq[(size_t)l * b->G], p->freq[l], b->G * sizeof(float));
	if (b->policy == HYB_POLICY_LAYER)
		start_layers(b, p->slot_budget);
	else if (start_placed(b, p))
		goto oom;
	init_state(b);
	hyb_bal_select_tables(b);
	return b;
oom:
	snprintf(err, errlen, "balancer: out of memory");
	hyb_balancer_free(b);
	return NULL;
}

/* The reason of a failure goes to hyb_last_error() (hyb/error.h). */
struct hyb_balancer *hyb_balancer_new(const struct hyb_balancer_params *p)
{
	char msg[512] = "";
	struct hyb_balancer *r = balancer_new(p, msg, sizeof(msg));

	if (!r)
		hyb_error_set(-EINVAL, "%s", msg);
	return r;
}

void hyb_balancer_free(struct hyb_balancer *b)
{
	if (!b)
		return;
	free(b->k);
	free(b->n_res);
	free(b->n_init);
	free(b->lambda);
	free(b->verdict);
	free(b->steps);
	free(b->res);
	free(b->pinnable);
	free(b->init);
	free(b->freq);
	free(b->score);
	free(b->a_ref_l);
	free(b->last);
	free(b->count);
	free(b->act);
	free(b->act_n);
	free(b->items);
	free(b->sel_idx);
	free(b->sel_res);
	free(b);
}

/* ---- accessors -------------------------------------------------------------------- */

enum hyb_policy hyb_balancer_policy(const struct hyb_balancer *b)
{
	return b->policy;
}

uint32_t hyb_balancer_n_groups(const struct hyb_balancer *b)
{
	return b->G;
}

int hyb_balancer_set_group_load(struct hyb_balancer *b, double group_load_s)
{
	if (!b || !(group_load_s >= 0 && isfinite(group_load_s)))
		return hyb_error_set(-EINVAL, "balancer: group load time %g s is not a time",
				     group_load_s);
	b->group_load_s = group_load_s;
	return 0;
}

uint32_t hyb_balancer_slots(const struct hyb_balancer *b, uint32_t l)
{
	return l < b->L ? b->k[l] : 0;
}

uint32_t hyb_balancer_initial(const struct hyb_balancer *b, uint32_t l, uint32_t *groups)
{
	if (l >= b->L)
		return 0;
	memcpy(groups, &b->init[(size_t)l * b->G], b->n_init[l] * sizeof(*groups));
	return b->n_init[l];
}

bool hyb_balancer_resident(const struct hyb_balancer *b, uint32_t l, uint32_t g)
{
	return l < b->L && g < b->G && b->res[(size_t)l * b->G + g];
}

double hyb_balancer_lambda(const struct hyb_balancer *b, uint32_t l)
{
	if (l >= b->L)
		return 0;
	switch (b->policy) {
	case HYB_POLICY_TAM:
	case HYB_POLICY_TAM_ADAPTIVE:
	case HYB_POLICY_DYNAMIC:
		return b->lambda[l];
	default:
		return 0;
	}
}

enum hyb_bottleneck hyb_balancer_bottleneck(const struct hyb_balancer *b, uint32_t l)
{
	return l < b->L ? b->verdict[l] : HYB_BOUND_NONE;
}

/* ---- the step ---------------------------------------------------------------------- */

/*
 * The bottleneck test (hyb/balancer.h). KAIROX 7 watches "pipeline stalls"
 * and asks whether they come from I/O or from the CPU. Our I/O signs: the
 * reloads still queued when a decision is made outlast the window the new
 * loads have (they will be late too), or more than 5% of the step's active
 * neurons were computed on the CPU because their group was still loading
 * (the reload was paid and the CPU work not saved). The CPU sign: the CPU
 * side of the split FFN took longer than the device side and the host did
 * not wait for the device (a stall under 5% of the CPU time is poll latency
 * and timer noise, not a device wait).
 */
static enum hyb_bottleneck bottleneck(const struct hyb_balancer_feedback *fb)
{
	if (!fb)
		return HYB_BOUND_NONE;
	if (fb->backlog_s > fb->window_s ||
	    (fb->n_active && (double)fb->late > BAL_LATE_SHARE * fb->n_active))
		return HYB_BOUND_IO;
	if (fb->cpu_s > fb->dev_s && !(fb->stall_s >= BAL_STALL_NOISE * fb->cpu_s))
		return HYB_BOUND_CPU;
	return HYB_BOUND_NONE;
}

/*
 * DynamicInfer 4.3's communication constraint, t_0 + loads * t_trans <
 * window, with t_0 folded into the window: loads that cannot land before
 * their layer runs are late (the CPU computes their neurons anyway) and
 * delay the loads of the next layers. One load is always allowed, so a
 * window shorter than one load cannot freeze the cache. The backlog is not
 * subtracted: it is what the bottleneck test reads, and tam-adaptive answers
 * it by raising lambda; subtracting it as well would count it twice.
 */
static uint32_t window_cap(const struct hyb_balancer *b, const struct hyb_balancer_feedback *fb)
{
	double c;

	if (!(b->group_load_s > 0) || !fb || !(fb->window_s > 0) || !isfinite(fb->window_s))
		return UINT32_MAX;
	/* a relative 1e-9 so loads that fit exactly are not lost to rounding */
	c = floor(fb->window_s / b->group_load_s * (1 + 1e-9));
	if (c < 1)
		return 1;
	return c >= UINT32_MAX ? UINT32_MAX : (uint32_t)c;
}

/* TAM's A_g (hyb/balancer.h, a_ref): the share over layer l's reference, at most 1. */
static void tam_intensity(struct hyb_balancer *b, uint32_t l)
{
	const double inv = 1 / b->a_ref_l[l];

	for (uint32_t g = 0; g < b->G; g++) {
		const double r = b->act[g] * inv;

		b->act_n[g] = (float)(r < 1 ? r : 1);
	}
}

/* KAIROX Algorithm 1 phase 1 (lines 1-6). */
static void adapt_lambda(struct hyb_balancer *b, uint32_t l, enum hyb_bottleneck v)
{
	double x = b->lambda[l];

	if (v == HYB_BOUND_IO)
		x = fmin(x * (1 + b->alpha), b->lambda_max);
	else if (v == HYB_BOUND_CPU)
		x = fmax(x * (1 - b->alpha), b->lambda_min);
	b->lambda[l] = x;
}

int hyb_balancer_step(struct hyb_balancer *b, uint32_t l, const uint32_t *active,
		      uint32_t n_active, const struct hyb_balancer_feedback *fb, uint32_t *load,
		      uint32_t *n_load, uint32_t *evict, uint32_t *n_evict)
{
	if (n_load)
		*n_load = 0;
	if (n_evict)
		*n_evict = 0;
	if (!b || l >= b->L || (!active && n_active) || !load || !n_load || !evict || !n_evict ||
	    n_active > b->F)
		return hyb_error_set(-EINVAL, "balancer step: bad layer %u, %u active or no output "
				     "lists", l, n_active);
	/*
	 * A_g (checked before any state changes). The list is sorted, so a
	 * group's count is the distance between the last listed positions of
	 * it and of the group before: one plain store per neuron, no
	 * read-modify-write chain on a counter and no data-dependent branch
	 * (a histogram cost two thirds of the step: ~4000 neurons a layer at
	 * the 7B shape against ~550 groups). The group is a multiply
	 * (group_div.h).
	 */
	uint32_t *const count = b->count;
	const uint64_t recip = b->gs_recip;

	if (n_active && active[n_active - 1] >= b->F)
		return hyb_error_set(-EINVAL, "balancer step: neuron %u is outside 0..%u",
				     active[n_active - 1], b->F - 1);
	memset(count, 0, b->G * sizeof(*count));
	for (uint32_t i = 0; i < n_active; i++) {
		if (i && active[i] <= active[i - 1])
			return hyb_error_set(-EINVAL, "balancer step: the active list is not "
					     "increasing at position %u", i);
		count[hyb_group_of(active[i], recip)] = i + 1;
	}
	for (uint32_t g = 0, prev = 0; g < b->G; g++) {
		if (count[g]) {
			const uint32_t e = count[g];

			count[g] = e - prev;
			prev = e;
		}
	}
	for (uint32_t g = 0; g < b->G; g++)
		b->act[g] = (float)b->count[g] / (float)bal_group_neurons(b, g);
	if (b->policy == HYB_POLICY_TAM || b->policy == HYB_POLICY_TAM_ADAPTIVE)
		tam_intensity(b, l);

	b->verdict[l] = bottleneck(fb);
	b->steps[l]++;
	if (b->policy == HYB_POLICY_STATIC || b->policy == HYB_POLICY_LAYER)
		return 0;
	if (b->policy == HYB_POLICY_TAM_ADAPTIVE)
		adapt_lambda(b, l, b->verdict[l]);
	hyb_bal_decide(b, l, window_cap(b, fb), load, n_load, evict, n_evict);
	return 0;
}
