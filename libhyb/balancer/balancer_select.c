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
 * the latency and keeps err <= err_static.
 *
 * Cost: it runs for every layer of every decode step, so it must take a few
 * microseconds, not the ~50-350 us that exact logit order costs (a heap pop
 * and an exp per move, thousands of moves at the 7B shape). The logits are
 * binned (HYB_SEL_BINS bins a side, 1/32 of a logit wide, the outer ones open) and
 * the greedy moves bin by bin, many neurons a step; within a bin, lower
 * indices first. Error is booked conservatively: an added neuron frees the
 * least weight of its bin, a dropped one costs the most, so the constraint
 * holds for the true weights as well (the bounds are tabled once, at
 * hyb_balancer_new). One pass collects the candidates, one counts them into
 * bins, one writes the list; exp only when info is asked for.
 */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "balancer_internal.h"
#include "cpu_kernels.h"
#include "util/error.h"

static bool cost_ok(double t)
{
	return t >= 0 && isfinite(t);
}

/* Weight of skipping a neuron with logit x: 1 - p (paper) or p (expected). */
static double weight(double x, enum hyb_select_err m)
{
	return m == HYB_SELECT_ERR_EXPECTED ? 1 / (1 + exp(-x)) : 1 / (1 + exp(x));
}

/* ceil(q) for 0 <= q < 2^52, without libm's call (no SSE4.1 here); below 0: 0 */
static inline double ceil_pos(double q)
{
	double c;

	if (!(q > 0))
		return 0;
	if (q >= 4503599627370496.0)
		return q;
	c = (double)(uint64_t)q;
	return c < q ? c + 1 : c;
}

/* Bits [i0, i1) of the bitmap w set. */
static void set_bits(uint64_t *w, uint32_t i0, uint32_t i1)
{
	while (i0 < i1) {
		const uint32_t o = i0 % 64, n = i1 - i0 < 64 - o ? i1 - i0 : 64 - o;

		w[i0 / 64] |= (n == 64 ? ~0ull : ((1ull << n) - 1)) << o;
		i0 += n;
	}
}

#define SEL_EDGE 1e-3

void hyb_bal_select_tables(struct hyb_balancer *b)
{
	const double w = HYB_SEL_RANGE / HYB_SEL_BINS;

	for (int m = 0; m < 2; m++) {
		for (uint32_t k = 0; k < HYB_SEL_BINS; k++) {
			/* add bin k: [-R + k w, -R + (k + 1) w), bin 0 open below, the last up to 0 */
			const double alo = k ? -HYB_SEL_RANGE + k * w : -INFINITY;
			const double ahi = k + 1 < HYB_SEL_BINS ? -HYB_SEL_RANGE + (k + 1) * w : 0;
			/* drop bin k: [k w, (k + 1) w), the last open above */
			const double dlo = k * w, dhi = k + 1 < HYB_SEL_BINS ? (k + 1) * w : INFINITY;

			/*
			 * p rises with x: expected weights rise, the paper's fall. The
			 * edges move out by SEL_EDGE so a float rounded across one
			 * still gets a bound.
			 */
			b->sel_add_w[m][k] = m == HYB_SELECT_ERR_EXPECTED ?
						     weight(alo - SEL_EDGE, (enum hyb_select_err)m) :
						     weight(ahi + SEL_EDGE, (enum hyb_select_err)m);
			b->sel_drop_w[m][k] = m == HYB_SELECT_ERR_EXPECTED ?
						      weight(dhi + SEL_EDGE, (enum hyb_select_err)m) :
						      weight(dlo - SEL_EDGE, (enum hyb_select_err)m);
			b->sel_add_iw[m][k] = b->sel_add_w[m][k] > 0 ? 1 / b->sel_add_w[m][k] : 0;
			b->sel_drop_iw[m][k] = b->sel_drop_w[m][k] > 0 ? 1 / b->sel_drop_w[m][k] : 0;
		}
	}
}

int hyb_balancer_select(struct hyb_balancer *b, uint32_t l, const float *logits,
			const struct hyb_select_cost *cost, uint32_t *sel, uint32_t *n_sel,
			struct hyb_select_info *info)
{
	const struct hyb_cpu_kernels *k = hyb_cpu_best();
	const uint8_t *res;
	uint32_t *add, *abin, *drop, *dbin;
	uint32_t na = 0, nd = 0, ng = 0, nc, added = 0, dropped = 0, n = 0;
	uint32_t *ca = b->sel_cnt, *cd = b->sel_cnt + HYB_SEL_BINS;
	int32_t ba = HYB_SEL_BINS - 1, bd = 0;     /* the bins moves come from */
	uint32_t ka = 0, kd = 0;            /* neurons taken from them */
	double err0 = 0, slack = 0, tg, tc;
	const double *wa, *wd, *iwa, *iwd;
	double inv_cpu, inv_gpu;
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
	wa = b->sel_add_w[m];
	wd = b->sel_drop_w[m];
	iwa = b->sel_add_iw[m];
	iwd = b->sel_drop_iw[m];
	/* multiplications in the greedy's chain, not divisions */
	inv_cpu = cost->t_cpu > 0 ? 1 / cost->t_cpu : 0;
	inv_gpu = cost->t_gpu > 0 ? 1 / cost->t_gpu : 0;
	res = &b->res[(size_t)l * b->G];
	/* the cache as a bit per neuron, for the kernels' passes (cpu_kernels.h) */
	memset(b->sel_res, 0, sizeof(uint64_t) * ((b->F + 63) / 64));
	for (uint32_t g = 0; g < b->G; g++)
		if (res[g])
			set_bits(b->sel_res, g * b->GS, g * b->GS + bal_group_neurons(b, g));
	add = b->sel_idx;
	abin = add + b->F;
	drop = abin + b->F;
	dbin = drop + b->F;
	k->sel_scan(logits, b->sel_res, b->F, add, abin, &na, drop, dbin, &nd, &ng);
	nc = nd;
	memset(b->sel_cnt, 0, sizeof(uint32_t) * 2 * HYB_SEL_BINS);
	for (uint32_t q = 0; q < na; q++)
		ca[abin[q]]++;
	for (uint32_t q = 0; q < nd; q++)
		cd[dbin[q]]++;

	tg = cost->t_gpu * ng;
	tc = cost->t_cpu * nc + cost->t_sync;
	if (info) {
		/* only reported: the greedy needs differences alone */
		for (uint32_t i = 0; !cost->counts_only && i < b->F; i++)
			if (!(logits[i] > 0))
				err0 += weight(isnan(logits[i]) ? -INFINITY : logits[i], m);
		info->n_gpu_static = ng;
		info->n_cpu_static = nc;
		info->err_static = err0;
		info->t_static = fmax(tg, tc);
	}
	for (;;) {
		while (ba >= 0 && ka == ca[ba])
			ba--, ka = 0;
		while (bd < HYB_SEL_BINS && kd == cd[bd])
			bd++, kd = 0;
		tg = cost->t_gpu * ng;
		tc = cost->t_cpu * nc + cost->t_sync;
		const double t = tg > tc ? tg : tc;
		/* drops the CPU side can still use: those until it is no longer the slower */
		const double cpu_room = cost->t_cpu > 0 ? ceil_pos((tc - tg) * inv_cpu) : 1e18;

		if (tc > tg && bd < HYB_SEL_BINS && wd[bd] <= slack) {
			/* drops of this bin the budget pays for, while the CPU stays the slower */
			double k = cd[bd] - kd;

			if (wd[bd] > 0 && slack * iwd[bd] < k)
				k = (double)(uint32_t)(slack * iwd[bd]);
			k = cpu_room < k ? cpu_room : k;
			k = k >= 1 ? k : 1;
			slack -= k * wd[bd];
			if (slack < 0) /* rounding of k * w: never spend what is not there */
				slack = 0;
			nc -= (uint32_t)k, kd += (uint32_t)k, dropped += (uint32_t)k;
			continue;
		}
		if (ba >= 0 && cost->t_gpu * (ng + 1) <= t) {
			/*
			 * adds of this bin that fit under the latency; while drops wait, no
			 * more than the current drop bin's (those the CPU side still
			 * needs) call for
			 */
			double k = ca[ba] - ka;

			if (cost->t_gpu > 0 && t * inv_gpu - ng < k)
				k = (double)(uint32_t)(t * inv_gpu - ng);
			if (tc > tg && bd < HYB_SEL_BINS && wa[ba] > 0) {
				const double want = cpu_room < cd[bd] - kd ? cpu_room : cd[bd] - kd;
				const double need = ceil_pos((want * wd[bd] - slack) * iwa[ba]);

				k = need < k ? need : k;
			}
			k = k >= 1 ? k : 1;
			slack += k * wa[ba];
			ng += (uint32_t)k, ka += (uint32_t)k, added += (uint32_t)k;
			continue;
		}
		break;
	}
	/* the list: every neuron over the threshold but the dropped, and the added */
	n = k->sel_emit(logits, b->sel_res, b->F, ba, ka, bd, kd, sel);
	if (info && !cost->counts_only) { /* the true weights of what moved (the kernel's rule) */
		uint32_t seen = 0;

		for (uint32_t q = 0; q < na; q++)
			if ((int32_t)abin[q] > ba || ((int32_t)abin[q] == ba && seen++ < ka))
				err0 -= weight(logits[add[q]], m);
		seen = 0;
		for (uint32_t q = 0; q < nd; q++)
			if ((int32_t)dbin[q] < bd || ((int32_t)dbin[q] == bd && seen++ < kd))
				err0 += weight(logits[drop[q]], m);
	}
	*n_sel = n;
	if (info) {
		info->n_gpu = ng;
		info->n_cpu = nc;
		info->added = added;
		info->dropped = dropped;
		info->err = err0;
		info->t = fmax(cost->t_gpu * ng, cost->t_cpu * nc + cost->t_sync);
	}
	return 0;
}
