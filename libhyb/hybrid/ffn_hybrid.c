// SPDX-License-Identifier: MIT
/*
 * Hybrid FFN decode (hyb/hybrid.h): one layer at a time,
 *
 *   1. predict: layer l's active set was predicted at layer l-1 from its
 *      attention output (KAIROX 5.1 adjacent prediction; layer 0 predicts
 *      from its own); layer l+1's is predicted now, from layer l's;
 *   2. balance: the balancer decides layer l+1's cache from that set and the
 *      loads go on the RELOAD stream at once, so they overlap this layer's
 *      FFN and the next layer's attention; in the last layer the decision is
 *      for layer 0 of the next token, from this token's layer-0 set (KAIROX
 *      5.1, "Layer 0 special case");
 *      a same-layer model (HYB_PRED_SAME_LAYER: PowerInfer's predictors read
 *      layer l's own raw residual) predicts and balances layer l at layer
 *      l instead, see hyb_ffn_hybrid_layer;
 *   3. split: an active neuron whose group has landed in a cache slot goes
 *      to the device list, any other to the CPU list (a group still loading
 *      is "late": the CPU computes it from the pool, nobody waits);
 *   4. the device list goes up on CRITICAL and the kernel runs on COMPUTE
 *      while the CPU computes its list in place on pool memory (PowerInfer
 *      5.3). Where the layer's attention ran on the device (hybrid_dense.c)
 *      the residual stream is there: the CPU partial goes up and the two are
 *      added into it on the device, and nobody waits. Otherwise the device
 *      partial comes back on CRITICAL and the host adds the two.
 *
 * The layer policy (llama.cpp -ngl) has no predictor: a layer on the device
 * lists every neuron, a layer off it runs dense on the CPU (decode_hybrid.c).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cache_hybd.h"
#include "hyb/app_stats.h"
#include "hyb/manifest.h"
#include "ffn_hybrid_internal.h"
#include "sparse/sparse_layer.h"
#include "sparse/group_div.h"
#include "dense.h"
#include "sparse/sparse_op.h"

/* ---- the split FFN -------------------------------------------------------------- */

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

static int split_ffn(struct hyb_ffn_hybrid *h, struct hyb_threadpool *pool, uint32_t l,
		     const float *xn, float *y, bool on_dev, char *err, size_t errlen)
{
	struct hyb_sparse_ffn_stats st;
	const hyb_dptr d_xn = on_dev ? hyb_hdense_xn(h->hd) : h->d_xn;
	uint32_t n_dev = 0, n_cpu = 0, late = 0, late_stale = 0, n_dgroups = 0;
	double tq, tc, ts, kern_s;

	memset(h->usable, -1, h->NG);
	if (hyb_ffn_hybrid_cache_poll(h))
		return hyb_ffn_hybrid_cache_fail(h, err, errlen, "reload");
	for (uint32_t i = 0; i < h->n_act; i++) {
		const uint32_t g = hyb_group_of(h->act[i], h->gs_recip);

		if (group_usable(h, l, g)) {
			h->h_list[n_dev++] = h->act[i];
		} else {
			const int32_t slot = h->table[(size_t)l * h->NG + g];

			h->cpu_list[n_cpu++] = h->act[i];
			late += slot >= 0;
			late_stale += slot >= 0 && h->slot_seq[slot] <= h->seq_fresh;
		}
	}

	tq = hyb_device_now(h->dev);
	if (n_dev) {
		if (hyb_ffn_hybrid_dev_inputs(h, l, xn, n_dev, on_dev) ||
		    hyb_device_record(h->dev, HYB_STREAM_COMPUTE, h->ev_k0))
			return dev_fail(h, err, errlen, "device inputs");
		if (!h->oracle) {
			struct hyb_dev_ffn f =
				hyb_ffn_hybrid_dev_ffn(h, l, d_xn, h->d_list, n_dev, h->d_y);

			if (hyb_device_sparse_ffn(h->dev, HYB_STREAM_COMPUTE, &f) ||
			    (on_dev ? hyb_device_record(h->dev, HYB_STREAM_COMPUTE, h->ev_k)
				    : hyb_ffn_hybrid_dev_result(h, sizeof(float) * h->E)))
				return dev_fail(h, err, errlen, "device FFN");
		} else {
			/* one kernel per device group, each into its own partial */
			memset(h->dgroup, 0xff, sizeof(*h->dgroup) * h->NG);
			for (uint32_t i = 0; i < n_dev;) {
				const uint32_t g = h->h_list[i] / h->GS;
				uint32_t j = i + 1;

				while (j < n_dev && h->h_list[j] / h->GS == g)
					j++;
				struct hyb_dev_ffn f = hyb_ffn_hybrid_dev_ffn(h, l, d_xn,
					h->d_list + sizeof(uint32_t) * i, j - i,
					h->d_y + sizeof(float) * h->E * n_dgroups);

				if (hyb_device_sparse_ffn(h->dev, HYB_STREAM_COMPUTE, &f))
					return dev_fail(h, err, errlen, "device FFN");
				h->dgroup[g] = n_dgroups++;
				i = j;
			}
			if (hyb_ffn_hybrid_dev_result(h, sizeof(float) * h->E * n_dgroups))
				return dev_fail(h, err, errlen, "device FFN");
		}
	}

	/* the CPU's share, in place on pool memory, while the device works */
	tc = hyb_device_now(h->dev);
	if (!h->oracle &&
	    hyb_ffn_sparse_run(h->sp, pool, l, xn, h->cpu_list, n_cpu, h->y_cpu, &st, err, errlen))
		return -1;
	ts = hyb_device_now(h->dev);
	h->fb[l].cpu_s = ts - tc;
	/* which side of the split finished last: the bottleneck test's input */
	struct hyb_device_event *ev_dev = on_dev ? h->ev_k : h->ev_out;
	const bool dev_last = n_dev && !hyb_device_done(h->dev, ev_dev);

	/* the host merge needs the partial; the device merge only waits to time a
	 * device that finished last (it has nothing else to do meanwhile) */
	if ((!on_dev || dev_last) && n_dev && hyb_device_sync(h->dev, ev_dev))
		return dev_fail(h, err, errlen, "device FFN");
	const double te = hyb_device_now(h->dev);

	if (on_dev) {
		if (hyb_ffn_hybrid_dev_merge(h, n_dev, n_cpu))
			return dev_fail(h, err, errlen, "merge on the device");
	} else if (h->oracle) {
		struct oracle_sum o = { .h = h, .l = l, .xn = xn };

		if (!n_dev)
			memset(h->dgroup, 0xff, sizeof(*h->dgroup) * h->NG);
		if (hyb_ffn_sum_by_group(h->E, h->GS, h->act, h->n_act, h->part, h->y_cpu,
					 oracle_part, &o)) {
			snprintf(err, errlen, "layer %u: oracle sum failed", l);
			return -1;
		}
		memcpy(y, h->y_cpu, sizeof(float) * h->E);
	} else {
		for (uint32_t e = 0; e < h->E; e++)
			y[e] = h->y_cpu[e] + (n_dev ? h->h_y[e] : 0.0f);
	}

	/*
	 * The device's time is known from the host only when it finished last
	 * (te); otherwise it was under the CPU's, and the feedback says so with
	 * 0 (the device was not what this layer waited for). The statistics
	 * count the time the host saw in both cases.
	 */
	h->fb[l].dev_s = dev_last ? te - tq : 0;
	h->fb[l].stall_s = te - ts;
	/*
	 * The balancer hears of the late neurons whose load had a window and
	 * missed it; the statistics count every late neuron. In same-layer mode
	 * a load decided at this layer lands during its FFN at best: those
	 * neurons are late on every link, so they say nothing of the link.
	 */
	h->fb[l].late = late_stale;
	h->st.active += h->n_act;
	h->st.active_dev += n_dev;
	h->st.late += late;
	h->st.cpu_ffn_s += ts - tc;
	h->st.dev_ffn_s += dev_last ? te - tq : 0;
	/* ev_k has completed by now (synced, or found done): the kernels' own time */
	if (n_dev && !hyb_device_elapsed(h->dev, h->ev_k0, h->ev_k, &kern_s))
		h->st.dev_kernel_s += kern_s;
	h->st.stall_s += te - ts;
	return 0;
}

/*
 * Layer j's active set, predicted from x_attn (the residual stream after the
 * previous layer's attention, or layer 0's own; same-layer: layer j's own,
 * read as it is): by the device where its predictor is there
 * (decode_hybrid.c queued it into `slot` and the list has come down), else
 * on the host.
 */
static uint32_t predict(struct hyb_ffn_hybrid *h, struct hyb_threadpool *pool, uint32_t j, int slot,
			const float *x_attn, uint32_t *out)
{
	if (hyb_hdense_pred_on(h->hd, j)) {
		const uint32_t *list;
		const uint32_t n = hyb_hdense_predicted(h->hd, slot, &list);

		memcpy(out, list, sizeof(uint32_t) * n);
		return n;
	}
	if (h->m->pred_input == HYB_PRED_SAME_LAYER)
		return hyb_ffn_sparse_predict(h->sp, pool, j, x_attn, out);
	if (!h->cur_ready) {
		hyb_unit_rms(h->cur, x_attn, h->E);
		h->cur_ready = true;
	}
	return hyb_ffn_sparse_predict(h->sp, pool, j, h->cur, out);
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
	rc = split_ffn(h, pool, l, xn, y, on_dev, err, errlen);
	h->act = t;
	h->st.layer_steps++;
	h->st.ffn_s += hyb_device_now(h->dev) - t0;
	return rc;
}

bool hyb_ffn_hybrid_merge_on_device(const struct hyb_ffn_hybrid *h, uint32_t l)
{
	return !h->oracle && hyb_hdense_layer_on(h->hd, l);
}

struct hyb_hdense *hyb_ffn_hybrid_dense(struct hyb_ffn_hybrid *h)
{
	return h->hd;
}

void hyb_ffn_hybrid_placement(const struct hyb_ffn_hybrid *h, struct hyb_hybrid_placement *out)
{
	*out = h->place;
}

bool hyb_ffn_hybrid_cpu_dense(const struct hyb_ffn_hybrid *h, uint32_t l)
{
	return h->layer_policy && h->n_slots[l] < h->NG;
}

/*
 * Adjacent prediction (KAIROX 5.1): layer l's set was predicted at layer
 * l-1 (layer 0's now, from its own output); layer l+1's is predicted now and
 * its cache decided, so the loads overlap this layer's FFN and the next
 * layer's attention; the last layer decides layer 0 of the next token from
 * this token's layer-0 set. *t1: when the predictions were done.
 */
static int step_adjacent(struct hyb_ffn_hybrid *h, struct hyb_threadpool *pool, uint32_t l,
			 const float *x_attn, double *t1, char *err, size_t errlen)
{
	uint32_t *t;

	if (l == 0) {
		h->n_act = predict(h, pool, 0, 0, x_attn, h->act);
		memcpy(h->act0, h->act, sizeof(uint32_t) * h->n_act);
		h->n_act0 = h->n_act;
	} else {
		t = h->act, h->act = h->act_next, h->act_next = t;
		h->n_act = h->n_act_next;
	}
	if (l + 1 < h->L)
		h->n_act_next = predict(h, pool, l + 1, 1, x_attn, h->act_next);
	*t1 = hyb_device_now(h->dev);
	return l + 1 < h->L ?
	       hyb_ffn_hybrid_cache_balance(h, l + 1, h->act_next, h->n_act_next, err, errlen) :
	       hyb_ffn_hybrid_cache_balance(h, 0, h->act0, h->n_act0, err, errlen);
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
	h->n_act = predict(h, pool, l, 0, x_attn, h->act);
	*t1 = hyb_device_now(h->dev);
	return hyb_ffn_hybrid_cache_balance(h, l, h->act, h->n_act, err, errlen);
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
	const double t2 = hyb_device_now(h->dev);

	if (split_ffn(h, pool, l, xn, y, on_dev, err, errlen))
		return -1;
	const double t3 = hyb_device_now(h->dev);

	h->st.layer_steps++;
	h->st.predictor_s += t1 - t0;
	h->st.balancer_s += t2 - t1;
	h->st.ffn_s += t3 - t0;
	return 0;
}

/* ---- set-up --------------------------------------------------------------------- */

/* Device bytes besides the cache: tables, inputs, partials (256-byte aligned each). */
static uint64_t fixed_bytes(uint32_t L, uint32_t NG, uint32_t E, uint32_t F, bool oracle)
{
	const uint64_t a = 256;
	uint64_t b = 0;

	b += ((uint64_t)L * NG * sizeof(int32_t) + a - 1) / a * a;
	b += ((uint64_t)E * sizeof(float) + a - 1) / a * a;
	b += ((uint64_t)F * sizeof(uint32_t) + a - 1) / a * a;
	b += ((uint64_t)(oracle ? NG : 1) * E * sizeof(float) + a - 1) / a * a;
	b += ((uint64_t)E * sizeof(float) + a - 1) / a * a;
	return b;
}

static int alloc_device(struct hyb_ffn_hybrid *h, char *err, size_t errlen)
{
	const uint64_t tb = (uint64_t)h->L * h->NG * sizeof(int32_t);

	if (h->hc) {
		struct hyb_hybd_cache_info ci;

		hyb_hybd_cache_info(h->hc, &ci);
		h->cache = ci.base;
		if (h->total_slots && hyb_device_adopt(h->dev, h->cache,
						       (uint64_t)h->total_slots * h->slot_bytes))
			return dev_fail(h, err, errlen, "hybd's cache");
	}
	if ((h->total_slots && !h->hc &&
	     hyb_device_alloc(h->dev, (uint64_t)h->total_slots * h->slot_bytes, &h->cache)) ||
	    hyb_device_alloc(h->dev, tb, &h->tables) ||
	    hyb_device_alloc(h->dev, sizeof(float) * h->E, &h->d_xn) ||
	    hyb_device_alloc(h->dev, sizeof(uint32_t) * h->F, &h->d_list) ||
	    hyb_device_alloc(h->dev, sizeof(float) * h->E * (h->oracle ? h->NG : 1), &h->d_y) ||
	    hyb_device_alloc(h->dev, sizeof(float) * h->E, &h->d_ycpu))
		return dev_fail(h, err, errlen, "device memory");
	return 0;
}

static int alloc_host(struct hyb_ffn_hybrid *h)
{
	const size_t E = h->E, F = h->F, NG = h->NG, L = h->L;

	h->table = hyb_device_host_alloc(h->dev, sizeof(int32_t) * L * NG);
	h->h_xn = hyb_device_host_alloc(h->dev, sizeof(float) * E);
	h->h_y = hyb_device_host_alloc(h->dev, sizeof(float) * E * (h->oracle ? NG : 1));
	h->h_list = hyb_device_host_alloc(h->dev, sizeof(uint32_t) * F);
	h->h_ycpu = hyb_device_host_alloc(h->dev, sizeof(float) * E);
	h->all = malloc(sizeof(uint32_t) * F);
	h->dirty = calloc(L, sizeof(*h->dirty));
	h->slot_base = calloc(L, sizeof(uint32_t));
	h->n_slots = calloc(L, sizeof(uint32_t));
	h->n_free = calloc(L, sizeof(uint32_t));
	h->act = malloc(sizeof(uint32_t) * F);
	h->act_next = malloc(sizeof(uint32_t) * F);
	h->act0 = malloc(sizeof(uint32_t) * F);
	h->cpu_list = malloc(sizeof(uint32_t) * F);
	h->dgroup = malloc(sizeof(uint32_t) * NG);
	h->load = malloc(sizeof(uint32_t) * NG);
	h->evict = malloc(sizeof(uint32_t) * NG);
	h->usable = malloc(NG);
	h->pre_skip = calloc(NG, 1);
	h->cur = malloc(sizeof(float) * E);
	h->y_cpu = malloc(sizeof(float) * E);
	h->part = malloc(sizeof(float) * E);
	h->fb = calloc(L, sizeof(*h->fb));
	h->ev_in = hyb_device_event_new(h->dev);
	h->ev_k = hyb_device_event_new_timed(h->dev);
	h->ev_k0 = hyb_device_event_new_timed(h->dev);
	h->ev_out = hyb_device_event_new(h->dev);
	if (!h->table || !h->h_xn || !h->h_y || !h->h_list || !h->h_ycpu || !h->all || !h->dirty || !h->slot_base ||
	    !h->n_slots || !h->n_free || !h->act || !h->act_next || !h->act0 || !h->cpu_list ||
	    !h->dgroup || !h->load || !h->evict || !h->usable || !h->pre_skip || !h->cur || !h->y_cpu ||
	    !h->part || !h->fb || !h->ev_in || !h->ev_k || !h->ev_k0 || !h->ev_out)
		return -1;
	for (size_t i = 0; i < L * NG; i++)
		h->table[i] = -1;
	for (size_t i = 0; i < F; i++)
		h->all[i] = (uint32_t)i;
	return 0;
}

static int alloc_slots(struct hyb_ffn_hybrid *h)
{
	uint32_t base = 0;

	for (uint32_t l = 0; l < h->L; l++) {
		h->slot_base[l] = base;
		h->n_slots[l] = hyb_balancer_slots(h->bal, l);
		base += h->n_slots[l];
	}
	h->total_slots = base;
	h->free_slot = malloc(sizeof(uint32_t) * (base ? base : 1));
	h->slot_ev = calloc(base ? base : 1, sizeof(*h->slot_ev));
	h->slot_seq = calloc(base ? base : 1, sizeof(*h->slot_seq));
	h->fly_cap = base + 256;
	h->fly = calloc(h->fly_cap, sizeof(*h->fly));
	h->in_flight = calloc(h->L, sizeof(*h->in_flight));
	if (!h->free_slot || !h->slot_ev || !h->slot_seq || !h->fly || !h->in_flight)
		return -1;
	for (uint32_t l = 0; l < h->L; l++) {
		/* pop order: the layer's lowest slot first */
		for (uint32_t i = 0; i < h->n_slots[l]; i++)
			h->free_slot[h->slot_base[l] + i] = h->slot_base[l] + h->n_slots[l] - 1 - i;
		h->n_free[l] = h->n_slots[l];
	}
	for (uint32_t s = 0; s < base; s++)
		if (!(h->slot_ev[s] = hyb_device_event_new(h->dev)))
			return -1;
	return 0;
}

/*
 * Split the budget (hyb/hybrid.h "Where the dense parts run"): on[l] and
 * *head say which dense parts go to the device; returns the cache slots
 * left for neuron groups. `avail` is the budget less the FFN buffers.
 */
static uint64_t place_dense(struct hyb_ffn_hybrid *h, const struct hyb_hybrid_params *p,
			    uint32_t n_ctx, uint64_t avail, bool *on, bool *head, bool *pred)
{
	const struct hyb_model *m = h->m;
	/* box mode: groups live in hybd's cache, not in this app's budget */
	const uint64_t layer_ffn = h->hc ? 0 : (uint64_t)h->NG * h->slot_bytes;
	const uint64_t hb = hyb_hdense_head_bytes(m);
	uint32_t n_on = 0, full = 0, max_full = h->L;

	*head = false;
	if (h->hc) {
		struct hyb_hybd_cache_info ci;

		hyb_hybd_cache_info(h->hc, &ci);
		max_full = ci.n_slots / h->NG < h->L ? ci.n_slots / h->NG : h->L;
	}
	if (h->layer_policy) {
		/* llama.cpp -ngl: whole layers in order, then the output layer */
		for (uint32_t l = 0; l < max_full; l++) {
			const uint64_t ab = p->dense_on_cpu ? 0 : hyb_hdense_layer_bytes(m, l, n_ctx);
			const uint64_t need = ab + layer_ffn +
				hyb_hdense_buffer_bytes(m, ab || n_on, false, false);

			if ((!ab && !p->dense_on_cpu) || need > avail)
				break;
			on[l] = ab > 0;
			n_on += on[l];
			avail -= ab + layer_ffn;
			full++;
		}
		if (!p->dense_on_cpu && full == h->L && hb &&
		    hb + hyb_hdense_buffer_bytes(m, n_on, true, false) <= avail) {
			*head = true;
			avail -= hb;
		}
		return (uint64_t)full * h->NG;
	}
	if (!p->dense_on_cpu) {
		uint32_t n_pred = 0;

		/* attention blocks first, in layer order, then the head */
		for (uint32_t l = 0; l < h->L; l++) {
			const uint64_t ab = hyb_hdense_layer_bytes(m, l, n_ctx);

			/* a layer of types the device cannot run stays on the CPU */
			if (!ab || ab + hyb_hdense_buffer_bytes(m, true, false, false) > avail)
				continue;
			on[l] = true;
			n_on++;
			avail -= ab;
		}
		if (hb && hb + hyb_hdense_buffer_bytes(m, n_on, true, false) <= avail) {
			*head = true;
			avail -= hb;
		}
		/*
		 * Then the predictors whose input (the attention output they
		 * read, hyb_hdense_pred_source) is on the device: fc1 is read
		 * whole every token and fc2 by the hidden units that fire, and
		 * on the CPU the F16 GEMVs cost more than their bytes (8-layer
		 * 7B shape on 2 cores: 33 ms per token against 23 ms for the
		 * CPU's neurons), so they come before any neuron group.
		 */
		const uint64_t buf = hyb_hdense_buffer_bytes(m, n_on, *head, false);
		const uint64_t lists = hyb_hdense_buffer_bytes(m, n_on, *head, true) - buf;

		for (uint32_t l = 0; l < h->L; l++) {
			const uint64_t pb = hyb_hdense_pred_bytes(m, l);
			const uint64_t need = pb + (n_pred ? 0 : lists);

			if (!pb || !on[hyb_hdense_pred_source(m, l)] || need + buf > avail)
				continue;
			pred[l] = true;
			n_pred++;
			avail -= need;
		}
		avail -= buf < avail ? buf : avail;
	}
	return avail / h->slot_bytes;
}

/*
 * Box mode: compute on hybd's cache and load through its queue (cache_hybd.h)
 * when the model is hybd's and the caller did not ask for an own cache. A
 * cache this app cannot use (none published, another app holds it, another
 * kind of memory than the device's, slots too small for a group) refuses
 * the context under HYB_CACHE_HYBD and leaves the app its own cache under
 * AUTO; place.cache_note says which and why.
 */
static int use_hybd_cache(struct hyb_ffn_hybrid *h, const struct hyb_hybrid_params *p,
			  char *err, size_t errlen)
{
	const uint64_t need = 3ull * h->GS * hyb_ffn_sparse_bundles(h->sp, 0)->row_bytes;
	const struct hyb_ffn_bundles **b;
	struct hyb_hybd_cache_info ci;
	char why[512];
	int code;

	snprintf(h->place.cache_note, sizeof(h->place.cache_note), "own");
	if (p->cache == HYB_CACHE_OWN || !hyb_model_manifest(h->m)) {
		if (p->cache == HYB_CACHE_HYBD) {
			snprintf(err, errlen, "hybd's cache: the model is not served by hybd (box "
				 "mode: hyb run --manifest)");
			return -1;
		}
		return 0;
	}
	b = malloc(sizeof(*b) * h->L);
	if (!b) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	for (uint32_t l = 0; l < h->L; l++)
		b[l] = hyb_ffn_sparse_bundles(h->sp, l);
	h->hc = hyb_hybd_cache_open(h->m, p->device ? p->device : "cpu", p->dev.ordinal, b, &code,
				    why, sizeof(why));
	free(b);
	if (h->hc) {
		hyb_hybd_cache_info(h->hc, &ci);
		if (ci.slot_bytes < need) {
			snprintf(why, sizeof(why), "its %llu-byte slots cannot hold a group of "
				 "%llu bytes (run hybd with slot_bytes = auto)",
				 (unsigned long long)ci.slot_bytes, (unsigned long long)need);
			hyb_hybd_cache_close(h->hc);
			h->hc = NULL;
		}
	}
	if (!h->hc) {
		if (p->cache == HYB_CACHE_HYBD) {
			snprintf(err, errlen, "hybd's cache: %s", why);
			return -1;
		}
		snprintf(h->place.cache_note, sizeof(h->place.cache_note),
			 "own (not hybd's: %.200s)", why);
		return 0;
	}
	h->slot_bytes = ci.slot_bytes;
	h->place.cache_hybd = true;
	{
		struct hyb_manifest_info mi;

		hyb_manifest_info(hyb_model_manifest(h->m), &mi);
		hyb_app_stats_path(mi.name, (int)getpid(), h->stats_path, sizeof(h->stats_path));
	}
	snprintf(h->place.cache_note, sizeof(h->place.cache_note),
		 "hybd's (pid %d, %s memory, %u slots of %llu bytes, loads on reload queue %u)",
		 ci.pid, ci.kind, ci.n_slots, (unsigned long long)ci.slot_bytes, ci.queue);
	return 0;
}

struct hyb_ffn_hybrid *hyb_ffn_hybrid_new(const struct hyb_model *m,
					  const struct hyb_hybrid_params *p, bool oracle,
					  int n_threads, uint32_t n_ctx, char *err, size_t errlen)
{
	const struct hyb_hparams *hp = &m->hp;
	struct hyb_ffn_hybrid *h;
	struct hyb_device_config dc;
	struct hyb_balancer_params bp;
	const float **freq = NULL;
	const int8_t **place = NULL;
	uint64_t fixed, slots = 0;
	bool *on = NULL, *pred = NULL, head = false;

	if (!m->group_size) {
		snprintf(err, errlen, "hybrid decoding needs a plan (hybctl plan); this model has "
			 "none");
		return NULL;
	}
	h = calloc(1, sizeof(*h));
	if (!h)
		goto oom;
	h->m = m;
	h->oracle = oracle;
	h->prefill_cpu = p->prefill_cpu;
	h->E = hp->n_embd;
	h->F = hp->n_ff;
	h->GS = m->group_size;
	h->gs_recip = hyb_group_recip(h->GS);  /* exact: the balancer checks hyb_group_recip_ok */
	h->NG = m->n_groups;
	h->L = hp->n_layer;
	h->sp = hyb_ffn_sparse_new(m, n_threads, err, errlen);
	if (!h->sp)
		goto fail;
	hyb_ffn_sparse_set_oracle(h->sp, oracle);
	h->slot_bytes = 3ull * h->GS * hyb_ffn_sparse_bundles(h->sp, 0)->row_bytes;
	h->slot_bytes = (h->slot_bytes + 255) / 256 * 256;

	h->layer_policy = p->policy == HYB_POLICY_LAYER;
	if (use_hybd_cache(h, p, err, errlen))
		goto fail;
	fixed = fixed_bytes(h->L, h->NG, h->E, h->F, h->oracle);
	on = calloc(h->L, sizeof(*on));
	pred = calloc(h->L, sizeof(*pred));
	if (!on || !pred)
		goto oom;
	if (p->gpu_budget > fixed)
		slots = place_dense(h, p, n_ctx, p->gpu_budget - fixed, on, &head, pred);
	if (h->hc && p->gpu_budget <= fixed) {
		snprintf(err, errlen, "GPU budget %llu bytes does not hold this app's device buffers "
			 "(%llu bytes; the groups go to hybd's cache)",
			 (unsigned long long)p->gpu_budget, (unsigned long long)fixed);
		goto fail;
	}
	if (h->hc && !h->layer_policy) {
		struct hyb_hybd_cache_info ci;

		/*
		 * Box mode: the budget is this app's device memory (dense parts,
		 * buffers); the groups get every slot of hybd's cache, whose size
		 * is hybd's gpu_cache. The layer policy counted its whole layers.
		 */
		hyb_hybd_cache_info(h->hc, &ci);
		slots = ci.n_slots < (uint64_t)h->L * h->NG ? ci.n_slots : (uint64_t)h->L * h->NG;
	}
	for (uint32_t l = 0; l < h->L; l++) {
		h->place.attn_layers += on[l];
		h->place.predictors += pred[l];
	}
	h->place.head = head;
	if (!slots && !h->place.attn_layers && !head) {
		snprintf(err, errlen, "GPU budget %llu bytes holds nothing: no neuron group (%llu "
			 "bytes each, plus %llu of buffers)%s", (unsigned long long)p->gpu_budget,
			 (unsigned long long)h->slot_bytes, (unsigned long long)fixed,
			 p->policy == HYB_POLICY_LAYER ? ", no whole layer" : "");
		goto fail;
	}
	dc = p->dev;
	if (!dc.capacity)
		dc.capacity = p->gpu_budget;
	h->dev = hyb_device_open(p->device ? p->device : "cpu", &dc, err, errlen);
	if (!h->dev)
		goto fail;
	/*
	 * Pin the memory the uploads read, for DMA straight from it. A box-mode
	 * model's image holds only the GGUF header (its weights are hybd's pool
	 * mappings, read-only), so it has nothing to pin. A pin that fails (a
	 * locked-memory limit, say) costs speed, not correctness: the runtime
	 * stages copies from unpinned memory, so say so and go on.
	 */
	if (m->image && !hyb_model_manifest(m)) {
		int rc = hyb_device_host_register(h->dev, m->image, m->image_len);

		if (rc == 0) {
			h->image_pinned = true;
		} else if (rc == -EIO) { /* the device faulted: nothing more runs on it */
			dev_fail(h, err, errlen, "pinning the model's memory");
			goto fail;
		} else {
			fprintf(stderr, "hyb: warning: the model's memory is not pinned (%s); "
				"uploads go through the runtime's staging copy\n",
				hyb_device_error(h->dev));
		}
	}

	freq = calloc(h->L, sizeof(*freq));
	place = calloc(h->L, sizeof(*place));
	if (!freq || !place)
		goto oom;
	for (uint32_t l = 0; l < h->L; l++) {
		freq[l] = m->layers[l].plan.freq;
		place[l] = m->layers[l].plan.gpu;
	}
	bp = p->bal;
	bp.policy = p->policy;
	bp.n_layer = h->L;
	bp.n_ff = h->F;
	bp.group_size = h->GS;
	bp.slot_budget = slots;
	bp.freq = freq;
	bp.placement = place;
	/*
	 * TAM's group activity A_g: a group of co-activated neurons that is "on"
	 * has about half its neurons firing (METIS groups on the synthetic and
	 * ProSparse-like models), so A_g = share / 0.5: a group steadily on
	 * scores ~1 and the adaptive lambda then acts in KAIROX 7's direction
	 * (lower lambda, more loads). With A_g = share, lowering lambda raised
	 * the bar (1 - lambda) + eps above a steady group's score and loaded
	 * less (measured in test_balancer's drift workload).
	 */
	if (bp.a_ref == 0)
		bp.a_ref = 0.5;
	h->bal = hyb_balancer_new(&bp, err, errlen);
	free(freq);
	free(place);
	freq = NULL;
	place = NULL;
	if (!h->bal)
		goto fail;
	if (alloc_host(h) || alloc_slots(h))
		goto oom;
	if (alloc_device(h, err, errlen) || hyb_ffn_hybrid_cache_warm(h, err, errlen))
		goto fail;
	if ((h->place.attn_layers || head) &&
	    !(h->hd = hyb_hdense_new(h->dev, m, n_ctx, on, head, pred, err, errlen)))
		goto fail;
	h->place.dense_bytes = hyb_hdense_bytes(h->hd);
	h->place.cache_bytes = (uint64_t)h->total_slots * h->slot_bytes;
	for (uint32_t l = 0; l < h->L; l++)
		h->place.dense_layers_cpu += hyb_ffn_hybrid_cpu_dense(h, l);
	free(on);
	free(pred);
	on = pred = NULL;
	/* the balancer's load cap (a window's worth of loads) needs the measured load time */
	if (h->group_load_s > 0)
		hyb_balancer_set_group_load(h->bal, h->group_load_s);
	memset(&h->st, 0, sizeof(h->st));
	hyb_device_stats_reset(h->dev);
	return h;
oom:
	snprintf(err, errlen, "out of memory for hybrid decoding");
fail:
	free(on);
	free(pred);
	free(freq);
	free(place);
	hyb_ffn_hybrid_free(h);
	return NULL;
}

void hyb_ffn_hybrid_free(struct hyb_ffn_hybrid *h)
{
	if (!h)
		return;
	if (h->dev) {
		if (h->slot_ev)
			for (uint32_t s = 0; s < h->total_slots; s++)
				hyb_device_event_free(h->dev, h->slot_ev[s]);
		hyb_device_event_free(h->dev, h->ev_in);
		hyb_device_event_free(h->dev, h->ev_k);
		hyb_device_event_free(h->dev, h->ev_k0);
		hyb_device_event_free(h->dev, h->ev_out);
		hyb_device_host_free(h->dev, h->table);
		hyb_device_host_free(h->dev, h->h_xn);
		hyb_device_host_free(h->dev, h->h_y);
		hyb_device_host_free(h->dev, h->h_list);
		hyb_device_host_free(h->dev, h->h_ycpu);
		hyb_hdense_free(h->hd);
		if (h->image_pinned)
			hyb_device_host_unregister(h->dev, h->m->image);
		/* box mode: nothing of ours still in hybd's queue for the next app's slots */
		if (h->hc && h->fly)
			(void)hyb_ffn_hybrid_cache_wait_all(h);
		hyb_device_close(h->dev); /* device memory goes with it */
	}
	hyb_hybd_cache_close(h->hc);
	if (h->stats_written)
		unlink(h->stats_path);
	hyb_balancer_free(h->bal);
	hyb_ffn_sparse_free(h->sp);
	free(h->slot_ev);
	free(h->slot_seq);
	free(h->fly);
	free(h->in_flight);
	free(h->free_slot);
	free(h->dirty);
	free(h->slot_base);
	free(h->n_slots);
	free(h->n_free);
	free(h->act);
	free(h->act_next);
	free(h->act0);
	free(h->all);
	free(h->cpu_list);
	free(h->dgroup);
	free(h->load);
	free(h->evict);
	free(h->usable);
	free(h->pre_skip);
	free(h->cur);
	free(h->y_cpu);
	free(h->part);
	free(h->fb);
	free(h);
}

struct hyb_device *hyb_ffn_hybrid_device(struct hyb_ffn_hybrid *h)
{
	return h->dev;
}
