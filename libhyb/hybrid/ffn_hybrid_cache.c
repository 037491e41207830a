// SPDX-License-Identifier: MIT
/*
 * What is where in the device's neuron cache, and how it moves: the
 * balancer's decisions carried out as loads and evictions, and the loads
 * followed until they land.
 *
 * The device table (int32 per group: its slot or -1, PowerInfer 5.2's neuron
 * table) is mirrored on the host and uploaded with a layer's inputs when it
 * changed. Slots are per layer (the balancer's K_l), free lists per layer.
 * Every device kernel of a layer has completed before the next layer's
 * decisions - the host has waited for the partial result, or for the next
 * layer's attention output, which follows it on COMPUTE - so a slot freed by
 * an eviction can be reloaded at once.
 *
 * Box mode (cache_hybd.h): the slots are hybd's cache and a load is an
 * UPLOAD request on hybd's reload queue instead of a copy on RELOAD; it has
 * landed when its completion is reaped. hybd serves one priority in order,
 * so a reload of a slot lands after any earlier load of it still queued.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "cache_hybd.h"
#include "ffn_hybrid_internal.h"
#include "sparse/sparse_layer.h"

/* The oldest load in flight has landed: off the ring. */
static void fly_pop(struct hyb_ffn_hybrid *h)
{
	const struct inflight *f = &h->fly[h->fly_head];

	h->seq_done = f->seq;
	h->in_flight[f->layer]--;
	h->fly_head = (h->fly_head + 1) % h->fly_cap;
	h->fly_n--;
}

/*
 * Box mode: take the completions hybd has posted (wait: at least one).
 * Sequence numbers in the ring are consecutive, so a tag (a load's seq)
 * finds its entry by its distance from the oldest.
 */
static int reap_hybd(struct hyb_ffn_hybrid *h, bool wait)
{
	uint64_t tags[64];
	int n;

	do {
		n = hyb_hybd_cache_reap(h->hc, tags, 64, wait);
		if (n < 0)
			return n;
		for (int i = 0; i < n; i++) {
			const uint64_t d = tags[i] - h->fly[h->fly_head].seq;

			if (h->fly_n && tags[i] >= h->fly[h->fly_head].seq && d < h->fly_n)
				h->fly[(h->fly_head + d) % h->fly_cap].done = true;
		}
		wait = false;
	} while (n == 64);
	while (h->fly_n && h->fly[h->fly_head].done)
		fly_pop(h);
	return 0;
}

/* Take note of the loads that have landed since the last poll. */
int hyb_ffn_hybrid_cache_poll(struct hyb_ffn_hybrid *h)
{
	if (h->hc)
		return reap_hybd(h, false);
	while (h->fly_n && hyb_device_done(h->dev, h->slot_ev[h->fly[h->fly_head].slot]))
		fly_pop(h);
	return 0;
}

/* Wait until the oldest load in flight has landed. */
static int wait_oldest(struct hyb_ffn_hybrid *h)
{
	const uint64_t seq = h->fly[h->fly_head].seq;

	if (!h->hc) {
		if (hyb_device_sync(h->dev, h->slot_ev[h->fly[h->fly_head].slot]))
			return -EIO;
		fly_pop(h);
		return 0;
	}
	while (h->fly_n && h->fly[h->fly_head].seq == seq) {
		int rc = reap_hybd(h, true);

		if (rc)
			return rc;
	}
	return 0;
}

/* Wait until every load in flight has landed. */
int hyb_ffn_hybrid_cache_wait_all(struct hyb_ffn_hybrid *h)
{
	while (h->fly_n) {
		int rc = wait_oldest(h);

		if (rc)
			return rc;
	}
	return 0;
}

int hyb_ffn_hybrid_cache_fail(struct hyb_ffn_hybrid *h, char *err, size_t errlen, const char *what)
{
	if (h->hc) {
		snprintf(err, errlen, "%s: %s", what, hyb_hybd_cache_error(h->hc));
		return -1;
	}
	return dev_fail(h, err, errlen, what);
}

/* Put group g of layer l in a free slot of the layer: one bundle, one copy. */
static int load_group(struct hyb_ffn_hybrid *h, uint32_t l, uint32_t g)
{
	const struct hyb_ffn_bundles *b = hyb_ffn_sparse_bundles(h->sp, l);
	const uint64_t bytes = 3ull * group_neurons(h, g) * b->row_bytes;
	uint32_t slot;

	if (!h->n_free[l])
		return -ENOSPC;
	slot = h->free_slot[h->slot_base[l] + --h->n_free[l]];
	int rc;

	h->table[(size_t)l * h->NG + g] = (int32_t)slot;
	h->dirty[l] = true;
	/* a full ring (a link far behind): wait for its oldest load */
	if (h->fly_n == h->fly_cap && (rc = wait_oldest(h)))
		return rc;
	if (h->hc) {
		/* hybd's queue is full: wait for its oldest of ours to come back */
		while ((rc = hyb_hybd_cache_upload(h->hc, slot, l, g, h->seq_issued + 1)) ==
		       -EAGAIN && h->fly_n)
			if ((rc = wait_oldest(h)))
				return rc;
		if (rc)
			return rc;
	} else if (hyb_device_h2d(h->dev, HYB_STREAM_RELOAD,
				  h->cache + (uint64_t)slot * h->slot_bytes, b->bundle[g], bytes) ||
		   hyb_device_record(h->dev, HYB_STREAM_RELOAD, h->slot_ev[slot])) {
		return -EIO;
	}
	h->slot_seq[slot] = ++h->seq_issued;
	h->fly[(h->fly_head + h->fly_n++) % h->fly_cap] =
		(struct inflight){ .slot = slot, .layer = l, .seq = h->seq_issued };
	h->in_flight[l]++;
	h->st.loads++;
	h->st.load_bytes += bytes;
	return 0;
}

static void evict_group(struct hyb_ffn_hybrid *h, uint32_t l, uint32_t g)
{
	int32_t *t = &h->table[(size_t)l * h->NG + g];

	if (*t < 0)
		return;
	h->free_slot[h->slot_base[l] + h->n_free[l]++] = (uint32_t)*t;
	*t = -1;
	h->dirty[l] = true;
	h->st.evicts++;
}

/* The balancer's decision for layer l from its predicted set, carried out. */
int hyb_ffn_hybrid_cache_balance(struct hyb_ffn_hybrid *h, uint32_t l, const uint32_t *act,
				 uint32_t n, char *err, size_t errlen)
{
	struct hyb_balancer_feedback *fb = &h->fb[l];
	uint32_t nl = 0, ne = 0;

	/* loads of this layer still in flight: the reload backlog it sees */
	if (hyb_ffn_hybrid_cache_poll(h))
		return hyb_ffn_hybrid_cache_fail(h, err, errlen, "reload");
	fb->backlog_s = h->in_flight[l] * h->group_load_s;
	fb->window_s = h->window_s;
	fb->n_active = n;
	if (hyb_balancer_step(h->bal, l, act, n, fb, h->load, &nl, h->evict, &ne)) {
		snprintf(err, errlen, "layer %u: balancer rejected the active set", l);
		return -1;
	}
	h->st.bound_io += hyb_balancer_bottleneck(h->bal, l) == HYB_BOUND_IO;
	h->st.bound_cpu += hyb_balancer_bottleneck(h->bal, l) == HYB_BOUND_CPU;
	for (uint32_t i = 0; i < ne; i++)
		evict_group(h, l, h->evict[i]);
	for (uint32_t i = 0; i < nl; i++) {
		int rc = load_group(h, l, h->load[i]);

		if (rc == -ENOSPC) {
			snprintf(err, errlen, "layer %u: balancer loads beyond the layer's %u slots",
				 l, h->n_slots[l]);
			return -1;
		}
		if (rc)
			return hyb_ffn_hybrid_cache_fail(h, err, errlen, "reload");
	}
	return 0;
}

/* The starting cache, loaded before the first token; also measures one group's load time. */
int hyb_ffn_hybrid_cache_warm(struct hyb_ffn_hybrid *h, char *err, size_t errlen)
{
	struct hyb_device_event *ev = hyb_device_event_new(h->dev);
	uint64_t n = 0;
	double t0;
	int rc = 0;

	if (!ev)
		return dev_fail(h, err, errlen, "device event");
	t0 = hyb_device_now(h->dev);
	for (uint32_t l = 0; l < h->L && !rc; l++) {
		const uint32_t k = hyb_balancer_initial(h->bal, l, h->load);

		for (uint32_t i = 0; i < k && !rc; i++, n++)
			rc = load_group(h, l, h->load[i]);
	}
	if (!rc && h->hc)
		rc = hyb_ffn_hybrid_cache_wait_all(h);
	else if (!rc && (hyb_device_record(h->dev, HYB_STREAM_RELOAD, ev) ||
			 hyb_device_sync(h->dev, ev)))
		rc = -EIO;
	hyb_device_event_free(h->dev, ev);
	if (rc)
		return hyb_ffn_hybrid_cache_fail(h, err, errlen, "initial load");
	h->group_load_s = n ? (hyb_device_now(h->dev) - t0) / n : 0;
	return hyb_ffn_hybrid_cache_poll(h);  /* all landed */
}

void hyb_ffn_hybrid_cache(const struct hyb_ffn_hybrid *h, uint64_t *resident, uint64_t *slots)
{
	uint64_t r = 0;

	for (uint32_t l = 0; l < h->L; l++)
		r += h->n_slots[l] - h->n_free[l];
	*resident = r;
	*slots = h->total_slots;
}

int hyb_ffn_hybrid_table(const struct hyb_ffn_hybrid *h, int32_t *out)
{
	memcpy(out, h->table, sizeof(int32_t) * h->L * h->NG);
	return 0;
}

/*
 * A prompt batch's buffers live in slots [first, total) (ffn_hybrid_prefill.c):
 * every load in flight lands first (the host has then seen the copies into
 * those slots complete, so the batch's kernels may write there), the groups
 * there are evicted - the prompt streams them like any uncached group - and
 * the slots leave the free lists until the prompt is done.
 */
int hyb_ffn_hybrid_cache_borrow(struct hyb_ffn_hybrid *h, uint32_t first)
{
	struct prefill_ws *w = &h->pw;
	int rc = hyb_ffn_hybrid_cache_wait_all(h);

	if (rc)
		return rc;
	w->n_evicted = 0;
	for (uint32_t l = 0; l < h->L; l++) {
		const uint32_t base = h->slot_base[l], end = base + h->n_slots[l];
		uint32_t k = 0;

		if (end <= first)
			continue;
		for (uint32_t g = 0; g < h->NG; g++) {
			int32_t *t = &h->table[(size_t)l * h->NG + g];

			if (*t >= 0 && (uint32_t)*t >= first) {
				w->evicted[2 * w->n_evicted] = l;
				w->evicted[2 * w->n_evicted++ + 1] = g;
				*t = -1;
				h->dirty[l] = true;
			}
		}
		for (uint32_t i = 0; i < h->n_free[l]; i++)
			if (h->free_slot[base + i] < first)
				h->free_slot[base + k++] = h->free_slot[base + i];
		h->n_free[l] = k;
	}
	return 0;
}

/* The prompt is done with slots [first, total): free again, their groups reloaded. */
int hyb_ffn_hybrid_cache_return(struct hyb_ffn_hybrid *h, uint32_t first)
{
	struct prefill_ws *w = &h->pw;

	for (uint32_t l = 0; l < h->L; l++) {
		const uint32_t base = h->slot_base[l], end = base + h->n_slots[l];

		for (uint32_t s = end; s-- > (base > first ? base : first);)
			h->free_slot[base + h->n_free[l]++] = s;
	}
	for (uint32_t i = 0; i < w->n_evicted; i++) {
		int rc = load_group(h, w->evicted[2 * i], w->evicted[2 * i + 1]);

		if (rc)
			return rc;
	}
	w->n_evicted = 0;
	return 0;
}
