// SPDX-License-Identifier: MIT
/*
 * Hybrid FFN decode (hyb/hybrid.h): one layer at a time,
 *
 *   1. predict: layer l's active set was predicted at layer l-1 from its
 *      attention output (KAIROX 5.1 adjacent prediction; layer 0 predicts
 *      from its own); layer l+1's is predicted now, from layer l's;
 *   2. balance: the balancer decides layer l+1's cache from that set and the
 *      loads go on the RELOAD stream at once, so they overlap the rest of
 *      this layer's FFN and the next layer's attention; in the last layer
 *      the decision is for layer 0 of the next token, from this token's
 *      layer-0 set (KAIROX 5.1, "Layer 0 special case"). The decision (with
 *      the load-aware thresholds, DynamicInfer 4.4) runs beside the CPU's
 *      share of this layer (decide_next; DynamicInfer's sub-thread);
 *      a same-layer model (HYB_PRED_SAME_LAYER: PowerInfer's predictors read
 *      layer l's own raw residual) predicts and balances layer l at layer
 *      l instead, see hyb_ffn_hybrid_layer;
 *   3. split: an active neuron whose group has landed in a cache slot goes
 *      to the device list, any other to the CPU list (a group still loading
 *      is "late": the CPU computes it from the pool, nobody waits);
 *   4. the device list goes up on CRITICAL and the kernel runs on COMPUTE
 *      while the CPU computes its list in place on pool memory (PowerInfer
 *      5.3). Where the layer's attention ran on the device (hybrid/dense.c)
 *      the residual stream is there: the CPU partial goes up and the two are
 *      added into it on the device, and nobody waits. Otherwise the device
 *      partial comes back on CRITICAL and the host adds the two.
 *
 * The layer policy (llama.cpp -ngl) has no predictor: a layer on the device
 * lists every neuron, a layer off it runs dense on the CPU (hybrid/decode.c).
 */
#include <string.h>

#include "cpu_kernels.h"
#include "dense.h"
#include "ffn_hybrid_internal.h"
#include "sparse/group_div.h"
#include "sparse/sparse_layer.h"

/* Oracle mode: every group's partial apart, summed in group order. */
struct oracle_sum {
	struct hyb_ffn_hybrid *h;
	uint32_t l;
	const float *xn;
};

static int oracle_part(void *user, uint32_t g, const uint32_t *active, uint32_t n, float *part)
{
	struct oracle_sum *o = user;
	struct hyb_ffn_hybrid *h = o->h;
	struct hyb_sparse_ffn_stats st;
	char err[8];

	if (h->dgroup[g] != UINT32_MAX) {
		memcpy(part, h->h_y + (size_t)h->dgroup[g] * h->E, sizeof(float) * h->E);
		return 0;
	}
	return hyb_ffn_sparse_run(h->sp, NULL, o->l, o->xn, active, n, part, &st, err,
				  sizeof(err));
}

/* One layer's split: the lists' sizes, the late neurons, the host clock at each phase. */
struct split {
	uint32_t n_dev, n_cpu;
	uint32_t late;          /* resident but still loading: on the CPU */
	uint32_t late_stale;    /* of those, loads decided before this layer (seq_fresh) */
	double tq, tc, ts, te;  /* device queued, CPU starts, CPU done, device waited for */
	bool dev_last;          /* the device finished after the CPU */
};

/*
 * Step 3: an active neuron whose group has landed in a slot goes to the
 * device list (h_list), any other to the CPU list.
 */
static int split_active(struct hyb_ffn_hybrid *h, uint32_t l, struct split *s, char *err,
			size_t errlen)
{
	uint32_t n_dev = 0, n_cpu = 0, late = 0, late_stale = 0;

	memset(h->usable, -1, h->NG);
	if (hyb_ffn_hybrid_cache_poll(h))
		return hyb_ffn_hybrid_cache_fail(h, err, errlen, "reload");
	for (uint32_t i = 0; i < h->n_act; i++) {
		const uint32_t g = hyb_group_of(h->act[i], h->gs_recip);

		if (group_usable(h, l, g)) {
			h->h_list[n_dev++] = h->act[i];
		} else if (h->thr_on && !(h->lg[h->act[i]] > 0)) {
			/* added for a cached group whose load has not landed: not worth the CPU */
			continue;
		} else {
			const int32_t slot = h->table[(size_t)l * h->NG + g];

			h->cpu_list[n_cpu++] = h->act[i];
			late += slot >= 0;
			late_stale += slot >= 0 && h->slot_seq[slot] <= h->seq_fresh;
		}
	}
	s->n_dev = n_dev;
	s->n_cpu = n_cpu;
	s->late = late;
	s->late_stale = late_stale;
	return 0;
}

/*
 * The device's partial, waited for where the host merge needs it; the
 * device merge only waits to time a device that finished last (it has
 * nothing else to do meanwhile). Which side finished last is the
 * bottleneck test's input.
 */
static int wait_device(struct hyb_ffn_hybrid *h, bool on_dev, struct split *s, char *err,
		       size_t errlen)
{
	struct hyb_device_event *ev_dev = on_dev ? h->ev_k : h->ev_out;

	s->dev_last = s->n_dev && !hyb_device_done(h->dev, ev_dev);
	if ((!on_dev || s->dev_last) && s->n_dev && hyb_device_sync(h->dev, ev_dev))
		return dev_fail(h, err, errlen, "device FFN");
	s->te = hyb_device_now(h->dev);
	return 0;
}

/* The two partials merged: on the device (on_dev), else into y on the host. */
static int merge(struct hyb_ffn_hybrid *h, uint32_t l, const float *xn, float *y, bool on_dev,
		 const struct split *s, char *err, size_t errlen)
{
	if (on_dev) {
		if (hyb_ffn_hybrid_dev_merge(h, s->n_dev, s->n_cpu))
			return dev_fail(h, err, errlen, "merge on the device");
	} else if (h->oracle) {
		struct oracle_sum o = { .h = h, .l = l, .xn = xn };

		if (!s->n_dev)
			memset(h->dgroup, 0xff, sizeof(*h->dgroup) * h->NG);
		if (hyb_ffn_sum_by_group(h->E, h->GS, h->act, h->n_act, h->part, h->y_cpu,
					 oracle_part, &o)) {
			snprintf(err, errlen, "layer %u: oracle sum failed", l);
			return -1;
		}
		memcpy(y, h->y_cpu, sizeof(float) * h->E);
	} else {
		for (uint32_t e = 0; e < h->E; e++)
			y[e] = h->y_cpu[e] + (s->n_dev ? h->h_y[e] : 0.0f);
	}
	return 0;
}

static double ema(double old, double x)
{
	return old > 0 ? old + (x - old) / 8 : x;
}

/* The balancer's feedback on layer l's split and the statistics. */
static void account(struct hyb_ffn_hybrid *h, uint32_t l, const struct split *s)
{
	double kern_s = 0;

	/*
	 * The device's time is known from the host only when it finished last
	 * (te); otherwise it was under the CPU's, and the feedback says so with
	 * 0 (the device was not what this layer waited for). The statistics
	 * count the time the host saw in both cases.
	 */
	h->fb[l].dev_s = s->dev_last ? s->te - s->tq : 0;
	h->fb[l].stall_s = s->te - s->ts;
	/*
	 * The balancer hears of the late neurons whose load had a window and
	 * missed it; the statistics count every late neuron. In same-layer mode
	 * a load decided at this layer lands during its FFN at best: those
	 * neurons are late on every link, so they say nothing of the link.
	 */
	h->fb[l].late = s->late_stale;
	h->st.active += h->n_act;
	h->st.active_dev += s->n_dev;
	h->st.late += s->late;
	h->st.cpu_ffn_s += s->ts - s->tc;
	h->st.dev_ffn_s += s->dev_last ? s->te - s->tq : 0;
	/* ev_k has completed by now (synced, or found done): the kernels' own time */
	if (s->n_dev && !hyb_device_elapsed(h->dev, h->ev_k0, h->ev_k, &kern_s))
		h->st.dev_kernel_s += kern_s;
	else
		kern_s = 0;
	h->st.stall_s += s->te - s->ts;
	/*
	 * Each side's time per neuron for the thresholds, from lists long enough
	 * that a call's fixed cost does not dominate; a running mean over the
	 * last few layers (1/8), so the estimate follows the host's load.
	 */
	if (h->thr_on && s->n_cpu >= 16)
		h->t_cpu_n = ema(h->t_cpu_n, (s->ts - s->tc) / s->n_cpu);
	if (h->thr_on && s->n_dev >= 16 && kern_s > 0)
		h->t_gpu_n = ema(h->t_gpu_n, kern_s / s->n_dev);
}

static void decide_next(void *arg);

/*
 * Steps 3 and 4: the split, the device's half queued, the CPU's half
 * meanwhile, the merge; with `side`, the next layer's decision (decide_next)
 * beside the CPU's half.
 */
static int split_ffn(struct hyb_ffn_hybrid *h, struct hyb_threadpool *pool, uint32_t l,
		     const float *xn, float *y, bool on_dev, bool side, char *err, size_t errlen)
{
	struct hyb_sparse_ffn_stats st;
	struct split s = { 0 };
	bool exposed = false;

	if (split_active(h, l, &s, err, errlen))
		return -1;
	s.tq = hyb_device_now(h->dev);
	if (s.n_dev && hyb_ffn_hybrid_dev_run(h, l, xn, s.n_dev, on_dev, err, errlen))
		return -1;

	/* the CPU's share, in place on pool memory, while the device works */
	h->side_l = l;
	h->side_s = 0;
	if (side && pool)
		hyb_threadpool_side(pool, decide_next, h);
	s.tc = hyb_device_now(h->dev);
	if (!h->oracle && hyb_ffn_sparse_run(h->sp, pool, l, xn, h->cpu_list, s.n_cpu, h->y_cpu,
					     &st, err, errlen)) {
		if (side && pool) /* failed: the decision is not taken */
			hyb_threadpool_side(pool, NULL, NULL);
		return -1;
	}
	/* no job ran it (nothing for the CPU, one thread, oracle mode): now, exposed */
	if (side && pool && hyb_threadpool_side_flush(pool))
		exposed = true;
	/* a virtual clock (hyb/device.h) advances by the rows the CPU's share read */
	if (!h->oracle && h->host_bps > 0)
		hyb_device_host_work(h->dev, (double)(st.n_gate + st.n_up + st.n_nz) *
						     hyb_ffn_sparse_bundles(h->sp, l)->row_bytes /
						     h->host_bps);
	s.ts = hyb_device_now(h->dev);
	if (side && !pool) {
		decide_next(h);
		exposed = true;
	}
	if (side && h->side_rc) {
		snprintf(err, errlen, "%s", h->side_err);
		return -1;
	}
	/* the CPU's share: the window less the decision the caller ran in it */
	if (side && !exposed) {
		s.tc += h->side_s < s.ts - s.tc ? h->side_s : s.ts - s.tc;
		h->st.side_s += h->side_s;
	}
	h->fb[l].cpu_s = s.ts - s.tc;
	if (wait_device(h, on_dev, &s, err, errlen) || merge(h, l, xn, y, on_dev, &s, err, errlen))
		return -1;
	account(h, l, &s);
	return 0;
}

/*
 * Layer j's active set into out (*n), predicted from x_attn (the residual
 * stream after the previous layer's attention, or layer 0's own;
 * same-layer: layer j's own, read as it is): by the device where its
 * predictor is there (hybrid/decode.c queued it into `slot` and its copy
 * down; waited for here), else on the host. Returns 0, or -1 on a device
 * error.
 */
static int predict(struct hyb_ffn_hybrid *h, struct hyb_threadpool *pool, uint32_t j, int slot,
		   const float *x_attn, uint32_t *out, const float **lg, uint32_t *n)
{
	float *buf = h->thr_on ? h->lg_buf[j & 1] : NULL;

	if (hyb_hdense_pred_on(h->hd, j)) {
		const uint32_t *list;

		if (hyb_hdense_pred_wait(h->hd))
			return -1;
		if (!h->thr_on) {
			*n = hyb_hdense_predicted(h->hd, slot, &list);
			memcpy(out, list, sizeof(uint32_t) * *n);
			return 0;
		}
		/*
		 * scores mode: read where they came down (the slot stays until
		 * this layer's split, dense.c); the list is the scores > 0
		 * (predictor.c's rule), by a vector pass
		 */
		*lg = hyb_hdense_predicted_scores(h->hd, slot);
		*n = hyb_cpu_best()->sel_emit(*lg, h->no_bits, h->F, -1, 0, 0, 0, out);
		return 0;
	}
	if (buf)
		*lg = buf;
	if (h->m->pred_input == HYB_PRED_SAME_LAYER) {
		*n = hyb_ffn_sparse_predict(h->sp, pool, j, x_attn, NULL, out);
		return 0;
	}
	if (!h->cur_ready) {
		hyb_unit_rms(h->cur, x_attn, h->E);
		h->cur_ready = true;
	}
	*n = hyb_ffn_sparse_predict(h->sp, pool, j, h->cur, buf, out);
	return 0;
}

/*
 * Load-aware thresholds (DynamicInfer 4.4, balancer_select.c): layer j's
 * list from its scores, the cache as the balancer has just decided it and
 * each side's measured cost per neuron. Until both costs are measured (the
 * first layers of the first token) the one threshold stands.
 *
 * The search is not free (about 15 us at 11008 neurons), and where the
 * cache has no room to take work (a small budget) it finds nothing to move.
 * So it pays its way: a running mean of what it saved (CPU neurons dropped
 * times their measured cost) against one of what it cost; while it saves
 * less than it costs it runs one call in 16, to notice when that changes.
 * DynamicInfer runs it on a scheduling thread of its own; on a box with no
 * core to spare it is this thread's time (docs/BALANCER.md).
 */
static void thresholds(struct hyb_ffn_hybrid *h, uint32_t j, const float *lg, uint32_t *list,
		       uint32_t *n)
{
	const struct hyb_select_cost cost = { .t_gpu = h->t_gpu_n, .t_cpu = h->t_cpu_n,
					      .t_sync = h->t_sync, .err_model = h->thr_err,
					      .counts_only = true };
	struct hyb_select_info info;
	const uint32_t n_pred = *n;
	double t0;

	if (!h->thr_on || !(h->t_cpu_n > 0) || !(h->t_gpu_n > 0))
		return;
	if (h->thr_gain < h->thr_cost && h->thr_calls++ % 16)
		return;
	t0 = hyb_device_now(h->dev);
	if (hyb_balancer_select(h->bal, j, lg, &cost, list, n, &info)) {
		*n = n_pred;
		return;
	}
	h->thr_cost = ema(h->thr_cost, hyb_device_now(h->dev) - t0);
	h->thr_gain = ema(h->thr_gain, info.dropped * h->t_cpu_n);
	h->st.thr_added += info.added;
	h->st.thr_dropped += info.dropped;
}

/* A layer-policy layer on the device: every neuron, nothing predicted or moved. */
static int whole_layer(struct hyb_ffn_hybrid *h, struct hyb_threadpool *pool, uint32_t l,
		       const float *xn, float *y, bool on_dev, char *err, size_t errlen)
{
	const double t0 = hyb_device_now(h->dev);
	uint32_t *t = h->act;
	int rc;

	h->act = h->all;
	h->n_act = h->F;
	rc = split_ffn(h, pool, l, xn, y, on_dev, false, err, errlen);
	h->act = t;
	h->st.layer_steps++;
	h->st.ffn_s += hyb_device_now(h->dev) - t0;
	return rc;
}

/*
 * Adjacent prediction (KAIROX 5.1): layer l's set was predicted at layer
 * l-1 (layer 0's now, from its own output, and its list chosen: the one
 * decision on the critical path); layer l+1's is predicted from the same
 * output. A predictor on the host runs here (it needs the thread pool);
 * one on the device has its copy waited for in decide_next. *t1: when the
 * predictions were done.
 */
static int step_adjacent(struct hyb_ffn_hybrid *h, struct hyb_threadpool *pool, uint32_t l,
			 const float *x_attn, double *t1, char *err, size_t errlen)
{
	const double t0 = hyb_device_now(h->dev);
	uint32_t *t;
	const float *tl;

	if (l == 0) {
		if (predict(h, pool, 0, 0, x_attn, h->act, &h->lg, &h->n_act))
			return dev_fail(h, err, errlen, "predictor on the device");
		memcpy(h->act0, h->act, sizeof(uint32_t) * h->n_act);
		h->n_act0 = h->n_act;
	} else {
		t = h->act, h->act = h->act_next, h->act_next = t;
		tl = h->lg, h->lg = h->lg_next, h->lg_next = tl;
		h->n_act = h->n_act_next;
	}
	h->next_ready = l + 1 < h->L && !hyb_hdense_pred_on(h->hd, l + 1);
	if (h->next_ready)
		(void)predict(h, pool, l + 1, hyb_hdense_pred_slot(l + 1), x_attn, h->act_next,
			      &h->lg_next, &h->n_act_next);
	*t1 = hyb_device_now(h->dev);
	/* the balancer sees the predicted sets; the thresholds then pick what runs */
	if (l == 0)
		thresholds(h, 0, h->lg, h->act, &h->n_act);
	h->st.predictor_s += *t1 - t0;
	h->st.balancer_s += hyb_device_now(h->dev) - *t1;
	return 0;
}

/*
 * The decision for the next layer (adjacent mode): layer l+1's set (from
 * the device, if its predictor is there), its cache - the loads go on the
 * RELOAD stream at once, so they overlap the rest of this layer's FFN and
 * the next layer's attention - and its list (thresholds); the last layer
 * decides layer 0 of the next token from this token's layer-0 set (KAIROX
 * 5.1, "Layer 0 special case"). It runs as the CPU's share of layer l's FFN
 * starts, on the calling thread while the pool's workers take the first
 * units (DynamicInfer 4.2.2 runs it in a sub-thread), or at once where there
 * is no pool job to run beside.
 */
static void decide_next(void *arg)
{
	struct hyb_ffn_hybrid *h = arg;
	const uint32_t l = h->side_l;
	const double t0 = hyb_device_now(h->dev);
	double t1 = t0;

	h->side_rc = 0;
	if (l + 1 < h->L) {
		if (!h->next_ready &&
		    predict(h, NULL, l + 1, hyb_hdense_pred_slot(l + 1), NULL, h->act_next,
			    &h->lg_next, &h->n_act_next)) {
			h->side_rc = dev_fail(h, h->side_err, sizeof(h->side_err),
					      "predictor on the device");
			return;
		}
		t1 = hyb_device_now(h->dev);
		h->side_rc = hyb_ffn_hybrid_cache_balance(h, l + 1, h->act_next, h->n_act_next,
							  h->side_err, sizeof(h->side_err));
		if (!h->side_rc)
			thresholds(h, l + 1, h->lg_next, h->act_next, &h->n_act_next);
	} else {
		h->side_rc = hyb_ffn_hybrid_cache_balance(h, 0, h->act0, h->n_act0, h->side_err,
							  sizeof(h->side_err));
	}
	h->side_s = hyb_device_now(h->dev) - t0;
	h->st.predictor_s += t1 - t0;
	h->st.balancer_s += h->side_s - (t1 - t0);
}

/*
 * Same-layer prediction (HYB_PRED_SAME_LAYER), PowerInfer's own model (5.1:
 * a predictor per layer, run as the layer starts; its placement is mostly
 * static, 6.2): layer l's set comes from layer l's attention output, so
 * there is no look-ahead and the balancer decides layer l's cache here, at
 * layer l, just before its split. A load it starts now cannot hide behind
 * the previous layer's work: at best it lands during this layer's FFN (its
 * neurons are "late" this token and the CPU computes them) and it pays off
 * from the next token on. window_s stays one layer's period: this
 * decision's share of the link over a token.
 */
static int step_same_layer(struct hyb_ffn_hybrid *h, struct hyb_threadpool *pool, uint32_t l,
			   const float *x_attn, double *t1, char *err, size_t errlen)
{
	const double t0 = hyb_device_now(h->dev);
	int rc;

	if (predict(h, pool, l, 0, x_attn, h->act, &h->lg, &h->n_act))
		return dev_fail(h, err, errlen, "predictor on the device");
	*t1 = hyb_device_now(h->dev);
	rc = hyb_ffn_hybrid_cache_balance(h, l, h->act, h->n_act, err, errlen);
	h->st.predictor_s += *t1 - t0;
	h->st.balancer_s += hyb_device_now(h->dev) - *t1;
	return rc;
}

int hyb_ffn_hybrid_layer(struct hyb_ffn_hybrid *h, struct hyb_threadpool *pool, uint32_t l,
			 const float *x_attn, const float *xn, float *y, bool on_dev,
			 char *err, size_t errlen)
{
	const double t0 = hyb_device_now(h->dev);
	double t1;

	if (h->layer_policy)
		return whole_layer(h, pool, l, xn, y, on_dev, err, errlen);

	/* the window a load decided at this layer has: one layer's period */
	if (h->t_layer_in > 0 && t0 > h->t_layer_in)
		h->window_s = t0 - h->t_layer_in;
	h->t_layer_in = t0;

	h->cur_ready = false;
	h->seq_fresh = h->m->pred_input == HYB_PRED_SAME_LAYER ? h->seq_issued : UINT64_MAX;
	if (h->m->pred_input == HYB_PRED_SAME_LAYER ?
	    step_same_layer(h, pool, l, x_attn, &t1, err, errlen) :
	    step_adjacent(h, pool, l, x_attn, &t1, err, errlen))
		return -1;
	/*
	 * CATS (docs/SPARSITY.md) computes every gate and thresholds it: each
	 * side takes all of its neurons and applies the threshold, so the
	 * prediction only steers the cache (its lists miss neurons above the
	 * threshold that exact CATS computes). Not with load-aware thresholds,
	 * whose selection is the predictor's scores.
	 */
	const bool exact = h->thr && h->thr[l] > 0 && !h->thr_on;
	uint32_t *pred = h->act, n_pred = h->n_act;

	if (exact) {
		h->act = h->all;
		h->n_act = h->F;
	}
	int rc = split_ffn(h, pool, l, xn, y, on_dev, h->m->pred_input != HYB_PRED_SAME_LAYER,
			   err, errlen);

	h->act = pred;
	h->n_act = n_pred;
	if (rc)
		return -1;
	const double t3 = hyb_device_now(h->dev);

	h->st.layer_steps++;
	h->st.ffn_s += t3 - t0;
	return 0;
}
