// SPDX-License-Identifier: MIT
/*
 * The hybrid FFN engine (hyb/hybrid.h; ffn_hybrid_internal.h lists its
 * files): its creation - box mode's cache, the budget split
 * (ffn_hybrid_place.c), the device, the balancer, buffers and slots, the
 * starting cache, the dense parts - and teardown, and where a layer runs.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache_hybd.h"
#include "dense.h"
#include "ffn_hybrid_internal.h"
#include "hyb/app_stats.h"
#include "hyb/manifest.h"
#include "sparse/group_div.h"
#include "sparse/sparse_layer.h"
#include "sparse_ffn_kernels.h"

/* Device memory: the cache slots (box mode: hybd's, adopted), tables, inputs, partials. */
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
	if (h->seq_rows) {
		const struct hyb_hparams *hp = &h->m->hp;
		const uint64_t r = h->seq_rows, q = (uint64_t)hp->n_head * hp->head_dim;
		const uint64_t kv = (uint64_t)hp->n_head_kv * hp->head_dim;
		struct hyb_hdense_batch *b = &h->sb;

		if (hyb_device_alloc(h->dev, 4 * r * h->E, &b->x) ||
		    hyb_device_alloc(h->dev, 4 * r * h->E, &b->xn) ||
		    hyb_device_alloc(h->dev, 4 * r * h->E, &h->sb_y) ||
		    hyb_device_alloc(h->dev, 4 * r * q, &b->q) ||
		    hyb_device_alloc(h->dev, 4 * r * q, &b->att) ||
		    hyb_device_alloc(h->dev, 4 * r * kv, &b->k) ||
		    hyb_device_alloc(h->dev, 4 * r * kv, &b->v))
			return dev_fail(h, err, errlen, "device memory for the pass's rows");
		for (int i = 0; hyb_hdense_pred_bytes(h->m, 0) && i < 2; i++) {
			if (hyb_device_alloc(h->dev, 4 * r * (1ull + h->F), &h->sb_pred[i]))
				return dev_fail(h, err, errlen, "device memory for the pass's rows");
			h->h_pred[i] = hyb_device_host_alloc(h->dev, 4 * r * (1ull + h->F));
			if (!h->h_pred[i])
				return dev_fail(h, err, errlen, "pinned memory for the pass's rows");
		}
		h->ev_seq = hyb_device_event_new(h->dev);
		if (!h->ev_seq)
			return dev_fail(h, err, errlen, "an event for the pass");
		for (int i = 0; i < HYB_SEQ_PROF_EVENTS; i++)
			if (!(h->ev_prof[i] = hyb_device_event_new_timed(h->dev)))
				return dev_fail(h, err, errlen, "an event for the pass");
		h->place.seq_bytes = hyb_ffn_hybrid_seq_buf_bytes(h);
	}
	return 0;
}

/* Host buffers: the pinned table mirror and staging, the per-token lists and scratch. */
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
	h->lg_buf[0] = malloc(sizeof(float) * F);
	h->lg_buf[1] = malloc(sizeof(float) * F);
	h->no_bits = calloc((F + 63) / 64, sizeof(uint64_t));
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
	if (!h->table || !h->h_xn || !h->h_y || !h->h_list || !h->h_ycpu || !h->all || !h->dirty ||
	    !h->slot_base || !h->n_slots || !h->n_free || !h->act || !h->act_next || !h->act0 ||
	    !h->lg_buf[0] || !h->lg_buf[1] || !h->no_bits ||
	    !h->cpu_list || !h->dgroup || !h->load || !h->evict || !h->usable || !h->pre_skip ||
	    !h->cur || !h->y_cpu || !h->part || !h->fb || !h->ev_in || !h->ev_k || !h->ev_k0 ||
	    !h->ev_out)
		return -1;
	for (size_t i = 0; i < L * NG; i++)
		h->table[i] = -1;
	for (size_t i = 0; i < F; i++)
		h->all[i] = (uint32_t)i;
	return 0;
}

/* Slots per layer (the balancer's K_l) on free stacks, their events, the in-flight ring. */
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

/* err: out of memory; returns -1. */
static int oom(char *err, size_t errlen)
{
	snprintf(err, errlen, "out of memory for hybrid decoding");
	return -1;
}

/*
 * Load-aware thresholds (hyb/hybrid.h): asked for where they cannot apply is
 * an error; AUTO turns them on for the dynamic policy, as DynamicInfer runs
 * them. Oracle mode keeps the CPU's bits, so never there.
 */
static int init_thresholds(struct hyb_ffn_hybrid *h, const struct hyb_hybrid_params *p,
			   char *err, size_t errlen)
{
	enum hyb_thresholds t = p->thresholds;

	if (t > HYB_THR_PAPER) {
		snprintf(err, errlen, "hybrid decoding: unknown threshold mode %d", (int)t);
		return -1;
	}
	if (t == HYB_THR_EXPECTED || t == HYB_THR_PAPER) {
		if (h->layer_policy) {
			snprintf(err, errlen, "load-aware thresholds need a predictor; the layer "
				 "policy has none");
			return -1;
		}
		if (!hyb_ffn_sparse_has_scores(h->sp)) {
			snprintf(err, errlen, "load-aware thresholds need the predictors' scores; "
				 "a PowerInfer file's predictors give a list only");
			return -1;
		}
	}
	if (t == HYB_THR_AUTO)
		t = p->policy == HYB_POLICY_DYNAMIC && hyb_ffn_sparse_has_scores(h->sp) ?
			    HYB_THR_EXPECTED : HYB_THR_OFF;
	h->thr_on = t != HYB_THR_OFF && !h->oracle;
	h->thr_err = t == HYB_THR_PAPER ? HYB_SELECT_ERR_PAPER : HYB_SELECT_ERR_EXPECTED;
	return 0;
}

/* The plan's shape, the CPU operator (predictors, bundles) and a cache slot's size. */
static int init_shape(struct hyb_ffn_hybrid *h, const struct hyb_model *m,
		      const struct hyb_hybrid_params *p, bool oracle, int n_threads, char *err,
		      size_t errlen)
{
	const struct hyb_hparams *hp = &m->hp;

	h->m = m;
	h->oracle = oracle;
	/*
	 * A norm after the FFN (Gemma 3) needs the layer's whole FFN output on
	 * the host before the residual: prompts batch on the CPU, and decode
	 * merges the two halves there (decode.c).
	 */
	h->post_norm = false;
	for (uint32_t l = 0; l < hp->n_layer; l++)
		h->post_norm |= m->layers[l].post_ffn_norm.data != NULL;
	h->prefill_cpu = p->prefill_cpu || h->post_norm;
	h->pw.want = p->prompt_batch;
	h->E = hp->n_embd;
	h->F = hp->n_ff;
	h->GS = m->group_size;
	h->gs_recip = hyb_group_recip(h->GS);  /* exact: the balancer checks hyb_group_recip_ok */
	h->NG = m->n_groups;
	h->L = hp->n_layer;
	h->sp = hyb_ffn_sparse_new(m, n_threads, err, errlen);
	if (!h->sp)
		return -1;
	hyb_ffn_sparse_set_oracle(h->sp, oracle);
	for (uint32_t l = 0; l < h->L; l++) {
		const uint32_t t = hyb_ffn_sparse_bundles(h->sp, l)->type;

		if (!hyb_device_ffn_type_ok(t)) {
			snprintf(err, errlen, "hybrid decoding: the device's sparse FFN does not run "
				 "%s bundles (%s); decode this plan on the CPU "
				 "(sparse, without a GPU budget)", hyb_type_name(t),
				 hyb_sparse_type_list());
			return -1;
		}
	}
	h->slot_bytes = 3ull * h->GS * hyb_ffn_sparse_bundles(h->sp, 0)->row_bytes;
	h->slot_bytes = (h->slot_bytes + 255) / 256 * 256;
	h->layer_policy = p->policy == HYB_POLICY_LAYER;
	return init_thresholds(h, p, err, errlen);
}

/* The device, with the model's memory pinned for its uploads. */
static int open_device(struct hyb_ffn_hybrid *h, const struct hyb_hybrid_params *p, char *err,
		       size_t errlen)
{
	const struct hyb_model *m = h->m;
	struct hyb_device_config dc = p->dev;

	if (!dc.capacity)
		dc.capacity = p->gpu_budget;
	h->dev = hyb_device_open(p->device ? p->device : "cpu", &dc);
	if (!h->dev) {
		snprintf(err, errlen, "%s", hyb_last_error());
		return -1;
	}
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
			return dev_fail(h, err, errlen, "pinning the model's memory");
		} else {
			fprintf(stderr, "hyb: warning: the model's memory is not pinned (%s); "
				"uploads go through the runtime's staging copy\n",
				hyb_device_error(h->dev));
		}
	}
	return 0;
}

/* The balancer over the budget's slots, from the plan's profiled frequencies and placement. */
static int new_balancer(struct hyb_ffn_hybrid *h, const struct hyb_hybrid_params *p,
			uint64_t slots, char *err, size_t errlen)
{
	const float **freq = calloc(h->L, sizeof(*freq));
	const int8_t **place = calloc(h->L, sizeof(*place));
	struct hyb_balancer_params bp;

	if (!freq || !place) {
		free(freq);
		free(place);
		return oom(err, errlen);
	}
	for (uint32_t l = 0; l < h->L; l++) {
		freq[l] = h->m->layers[l].plan.freq;
		place[l] = h->m->layers[l].plan.gpu;
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
	 * TAM's group activity A_g: bp.a_ref stays as given, by default 0 - per
	 * layer, the start set's mean profiled share (balancer.c), which needs no
	 * constant tuned to one sparsity (the 0.5 used before ran the adaptive
	 * loop backwards at 90% and 97% sparsity)
	 */
	h->bal = hyb_balancer_new(&bp);
	if (!h->bal)
		snprintf(err, errlen, "%s", hyb_last_error());
	free(freq);
	free(place);
	return h->bal ? 0 : -1;
}

/* Host buffers, slots and device memory, then the starting cache. */
static int alloc_all(struct hyb_ffn_hybrid *h, char *err, size_t errlen)
{
	if (alloc_host(h) || alloc_slots(h))
		return oom(err, errlen);
	if (alloc_device(h, err, errlen))
		return -1;
	if (hyb_ffn_hybrid_prefill_alloc(h))
		return oom(err, errlen);
	if (hyb_ffn_hybrid_cache_warm(h, err, errlen))
		return -1;
	return 0;
}

/* The dense parts the budget placed go up; the placement's byte counts. */
static int new_dense(struct hyb_ffn_hybrid *h, uint32_t n_ctx, const struct hyb_ffn_budget *b,
		     char *err, size_t errlen)
{
	if ((h->place.attn_layers || b->head) &&
	    !(h->hd = hyb_hdense_new_seqs(h->dev, h->m, n_ctx, h->kv_slots, b->on, b->head,
					  b->pred, err, errlen)))
		return -1;
	h->place.kv_seqs = h->place.attn_layers && h->n_seq > 1 ? h->kv_slots : 0;
	hyb_hdense_set_scores(h->hd, h->thr_on);
	h->place.dense_bytes = hyb_hdense_bytes(h->hd);
	h->place.cache_bytes = (uint64_t)h->total_slots * h->slot_bytes;
	for (uint32_t l = 0; l < h->L; l++)
		h->place.dense_layers_cpu += hyb_ffn_hybrid_cpu_dense(h, l);
	return 0;
}

/*
 * Several sequences (decode_seqs.c): the pass's rows and the device's KV
 * slots, every slot free. Prompt batches borrow no cache slots then: a
 * sequence's prompt is a run of the pass like any other.
 */
static int init_seqs(struct hyb_ffn_hybrid *h, const struct hyb_hybrid_params *p,
		     uint32_t n_ctx, uint32_t n_seq, uint32_t n_rows, char *err, size_t errlen)
{
	h->n_seq = n_seq > 1 ? n_seq : 1;
	h->kv_slots = 1;
	if (h->n_seq == 1)
		return 0;
	h->kv_slots = p->kv_seqs && p->kv_seqs < n_seq ? p->kv_seqs : n_seq;
	h->seq_rows = n_rows;
	h->pw.want = 0;
	h->prefill_cpu = true;
	if ((uint64_t)n_ctx * h->kv_slots > UINT32_MAX) {
		snprintf(err, errlen, "%u device KV slots of %u positions: too many", h->kv_slots,
			 n_ctx);
		return -1;
	}
	h->seq_slot = malloc(sizeof(int32_t) * h->n_seq);
	h->slot_seq_of = malloc(sizeof(int32_t) * h->kv_slots);
	if (!h->seq_slot || !h->slot_seq_of)
		return oom(err, errlen);
	memset(h->seq_slot, 0xff, sizeof(int32_t) * h->n_seq);
	memset(h->slot_seq_of, 0xff, sizeof(int32_t) * h->kv_slots);
	return 0;
}

struct hyb_ffn_hybrid *hyb_ffn_hybrid_new(const struct hyb_model *m,
					  const struct hyb_hybrid_params *p, bool oracle,
					  int n_threads, uint32_t n_ctx, uint32_t n_seq,
					  uint32_t n_rows, char *err, size_t errlen)
{
	struct hyb_ffn_hybrid *h;
	struct hyb_ffn_budget b = { 0 };
	int rc;

	if (!m->group_size) {
		snprintf(err, errlen, "hybrid decoding needs a plan (hybctl plan); this model has "
			 "none");
		return NULL;
	}
	h = calloc(1, sizeof(*h));
	if (!h) {
		oom(err, errlen);
		return NULL;
	}
	rc = init_shape(h, m, p, oracle, n_threads, err, errlen) ||
	     init_seqs(h, p, n_ctx, n_seq, n_rows, err, errlen) ||
	     use_hybd_cache(h, p, err, errlen) ||
	     hyb_ffn_hybrid_place(h, p, n_ctx, &b, err, errlen) ||
	     open_device(h, p, err, errlen) ||
	     new_balancer(h, p, b.slots, err, errlen) ||
	     alloc_all(h, err, errlen) ||
	     new_dense(h, n_ctx, &b, err, errlen);
	free(b.on);
	free(b.pred);
	if (rc) {
		hyb_ffn_hybrid_free(h);
		return NULL;
	}
	/* the balancer's load cap (a window's worth of loads) needs the measured load time */
	if (h->group_load_s > 0)
		hyb_balancer_set_group_load(h->bal, h->group_load_s);
	/* the thresholds' merge cost: the CPU partial over the link (DynamicInfer's t_sync) */
	{
		struct hyb_device_config dc;

		hyb_device_get_config(h->dev, &dc);
		h->t_sync = dc.pcie_lat_us * 1e-6 +
			    (dc.pcie_gbps > 0 ? 4.0 * h->E / (dc.pcie_gbps * 1e9) : 0);
		h->host_bps = dc.host_gbps * 1e9;
	}
	memset(&h->st, 0, sizeof(h->st));
	hyb_device_stats_reset(h->dev);
	return h;
}

void hyb_ffn_hybrid_set_thresholds(struct hyb_ffn_hybrid *h, const float *thr)
{
	h->thr = thr;
	hyb_ffn_sparse_set_thresholds(h->sp, thr);
}

void hyb_ffn_hybrid_free(struct hyb_ffn_hybrid *h)
{
	if (!h)
		return;
	if (h->dev) {
		if (h->slot_ev)
			for (uint32_t s = 0; s < h->total_slots; s++)
				hyb_device_event_free(h->dev, h->slot_ev[s]);
		hyb_ffn_hybrid_prefill_free(h);
		hyb_device_event_free(h->dev, h->ev_in);
		hyb_device_event_free(h->dev, h->ev_seq);
		for (int i = 0; i < HYB_SEQ_PROF_EVENTS; i++)
			hyb_device_event_free(h->dev, h->ev_prof[i]);
		hyb_device_host_free(h->dev, h->h_pred[0]);
		hyb_device_host_free(h->dev, h->h_pred[1]);
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
	free(h->seq_slot);
	free(h->slot_seq_of);
	hyb_ffn_hybrid_seq_free(h);
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
	free(h->lg_buf[0]);
	free(h->lg_buf[1]);
	free(h->no_bits);
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

bool hyb_ffn_hybrid_merge_on_device(const struct hyb_ffn_hybrid *h, uint32_t l)
{
	return !h->oracle && !h->post_norm && hyb_hdense_layer_on(h->hd, l);
}

bool hyb_ffn_hybrid_cpu_dense(const struct hyb_ffn_hybrid *h, uint32_t l)
{
	return h->layer_policy && h->n_slots[l] < h->NG;
}

struct hyb_hdense *hyb_ffn_hybrid_dense(struct hyb_ffn_hybrid *h)
{
	return h->hd;
}
