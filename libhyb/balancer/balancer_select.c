// SPDX-License-Identifier: MIT
/*
 * Load-aware neuron activation (DynamicInfer 4.4, App. E.4): split the one
 * activation threshold into theta_g for neurons whose group is cached on the
 * device and theta_c for the others, to minimise the layer's FFN latency
 *     max(t_gpu N_gpu(theta_g), t_cpu N_cpu(theta_c) + t_sync)      (E.4.2)
 * under the accuracy constraint Err(theta_g, theta_c) <= Err(theta).
 *
 * The static theta is the plan's: logit > 0 (hyb/plan.h folds the chosen
 * threshold into fc2's bias), so p_i = sigmoid(logit_i) is read as the
 * activation probability relative to that threshold, not a calibrated one.
 *
 * Error model. The paper's Err = sum over skipped neurons of (1 - p_i)
 * (E.4.1), taken as written (HYB_SELECT_ERR_PAPER). As the digest notes,
 * weighting a skipped neuron by 1 - p_i makes dropping a likely-active
 * neuron cheap, the opposite of intuition; HYB_SELECT_ERR_EXPECTED weights it
 * by p_i, the expected number of truly active neurons skipped. Under the
 * paper's weights one added device neuron (p <= 1/2, weight >= 1/2) pays for
 * at least one dropped CPU neuron (p > 1/2, weight < 1/2); under p-weights it
 * takes at least one, usually several.
 *
 * Greedy (E.4.2: "starting from a static threshold theta, we iteratively
 * decrease theta_g ... and increase theta_c ..., maintaining the error
 * constraint"). Lowering theta_g adds the inactive resident neurons in
 * decreasing logit order and frees error budget; raising theta_c drops the
 * active non-resident neurons in increasing logit order and spends it. Each
 * move: while the CPU side is the slower one, drop the next CPU neuron if
 * the budget allows; otherwise add the next device neuron if the device side
 * stays within the current latency (so the objective never rises; when the
 * CPU side is no longer the slower one this keeps adding device neurons that
 * fit under the latency, which only lowers the error: the paper's "GPU
 * load-aware, favouring higher GPU utilisation"). Every move lowers or keeps
 * the latency and keeps err <= err_static; at most n_ff moves.
 *
 * Cost: one pass over the logits, two O(n) heap builds, O(log n) per move;
 * the error sums (one exp per inactive neuron) only when info is asked for.
 */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "balancer_internal.h"
#include "util/error.h"

enum { MARK_NONE, MARK_ADDED, MARK_DROPPED };

/*
 * Binary heaps over pairs, built in O(n) and popped lazily: the greedy
 * usually stops after a few moves, so sorting all n_ff candidates would be
 * wasted (O(n_ff + moves log n_ff) instead of O(n_ff log n_ff)).
 * desc: the highest logit on top (adds); otherwise the lowest (drops).
 * Ties by neuron index, so the result does not depend on the layout.
 */
static inline bool on_top(const struct bal_pair *a, const struct bal_pair *b, bool desc)
{
	if (a->x != b->x)
		return desc ? a->x > b->x : a->x < b->x;
	return a->i < b->i;
}

static void sift_down(struct bal_pair *h, uint32_t n, uint32_t i, bool desc)
{
	const struct bal_pair x = h[i];

	for (;;) {
		uint32_t c = 2 * i + 1;

		if (c >= n)
			break;
		if (c + 1 < n && on_top(&h[c + 1], &h[c], desc))
			c++;
		if (!on_top(&h[c], &x, desc))
			break;
		h[i] = h[c];
		i = c;
	}
	h[i] = x;
}

static void heapify(struct bal_pair *h, uint32_t n, bool desc)
{
	for (uint32_t i = n / 2; i-- > 0;)
		sift_down(h, n, i, desc);
}

static struct bal_pair heap_pop(struct bal_pair *h, uint32_t *n, bool desc)
{
	const struct bal_pair top = h[0];

	h[0] = h[--*n];
	if (*n)
		sift_down(h, *n, 0, desc);
	return top;
}

/* Weight of skipping a neuron with logit x: 1 - p (paper) or p (expected). */
static double weight(double x, enum hyb_select_err m)
{
	return m == HYB_SELECT_ERR_EXPECTED ? 1 / (1 + exp(-x)) : 1 / (1 + exp(x));
}

static bool cost_ok(double t)
{
	return t >= 0 && isfinite(t);
}

int hyb_balancer_select(struct hyb_balancer *b, uint32_t l, const float *logits,
			const struct hyb_select_cost *cost, uint32_t *sel, uint32_t *n_sel,
			struct hyb_select_info *info)
{
	const uint8_t *res;
	struct bal_pair *add, *drop;
	uint32_t na = 0, nd = 0, ng = 0, nc = 0, added = 0, dropped = 0, n = 0;
	double err0 = 0, slack = 0, tg, tc;
	enum hyb_select_err m;

	if (n_sel)
		*n_sel = 0;
	if (!b || l >= b->L || !logits || !cost || !sel || !n_sel || !cost_ok(cost->t_gpu) ||
	    !cost_ok(cost->t_cpu) || !cost_ok(cost->t_sync) ||
	    (cost->err_model != HYB_SELECT_ERR_PAPER &&
	     cost->err_model != HYB_SELECT_ERR_EXPECTED))
		return hyb_error_set(-EINVAL, "balancer select: bad layer %u, missing lists or "
				     "costs", l);
	m = cost->err_model;
	res = &b->res[(size_t)l * b->G];
	/* adds grow from the front of pairs[], drops from the back: na + nd <= n_ff */
	add = b->pairs;
	memset(b->mark, MARK_NONE, b->F);
	for (uint32_t i = 0; i < b->F; i++) {
		const float x = isnan(logits[i]) ? -INFINITY : logits[i];
		const bool r = res[i / b->GS];

		if (x > 0) {
			if (r) {
				ng++;
			} else {
				nc++;
				b->pairs[b->F - 1 - nd++] = (struct bal_pair){ x, i };
			}
		} else {
			if (info) /* only reported: the greedy needs differences alone */
				err0 += weight(x, m);
			if (r && x > -INFINITY) /* a NaN is never computed */
				add[na++] = (struct bal_pair){ x, i };
		}
	}
	drop = &b->pairs[b->F - nd];
	heapify(add, na, true);
	heapify(drop, nd, false);

	tg = cost->t_gpu * ng;
	tc = cost->t_cpu * nc + cost->t_sync;
	if (info) {
		info->n_gpu_static = ng;
		info->n_cpu_static = nc;
		info->err_static = err0;
		info->t_static = fmax(tg, tc);
	}
	for (;;) {
		const double t = fmax(tg, tc);

		if (tc > tg && nd) {
			const double c = weight(drop[0].x, m);

			if (c <= slack) {
				slack -= c;
				b->mark[heap_pop(drop, &nd, false).i] = MARK_DROPPED;
				dropped++;
				nc--;
				tc = cost->t_cpu * nc + cost->t_sync;
				continue;
			}
		}
		if (na && cost->t_gpu * (ng + 1) <= t) {
			const struct bal_pair a = heap_pop(add, &na, true);

			slack += weight(a.x, m);
			b->mark[a.i] = MARK_ADDED;
			added++;
			ng++;
			tg = cost->t_gpu * ng;
			continue;
		}
		break;
	}
	for (uint32_t i = 0; i < b->F; i++)
		if ((logits[i] > 0 && b->mark[i] != MARK_DROPPED) || b->mark[i] == MARK_ADDED)
			sel[n++] = i;
	*n_sel = n;
	if (info) {
		info->n_gpu = ng;
		info->n_cpu = nc;
		info->added = added;
		info->dropped = dropped;
		info->err = err0 - slack;
		info->t = fmax(tg, tc);
	}
	return 0;
}
