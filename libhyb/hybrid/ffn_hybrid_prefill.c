// SPDX-License-Identifier: MIT
/*
 * A prompt batch's FFN (hyb/hybrid.h): dense, split by group the way a
 * decode step splits by neuron. The groups whose bundles have landed in the
 * device cache run on the device, row after row of the batch; the CPU runs
 * the others as one batch (the plan's bundles as a GEMM) and skips these.
 */
#include <stdlib.h>
#include <string.h>

#include "dense.h"
#include "ffn_hybrid_internal.h"
#include "sparse/sparse_layer.h"

bool hyb_ffn_hybrid_prefill_on_device(const struct hyb_ffn_hybrid *h)
{
	/* a batch takes attention blocks on the CPU too (decode.c): its FFNs are the device's */
	return !h->prefill_cpu && h->hd && (hyb_hdense_layers_on(h->hd) > 0 || h->pw.cap);
}

const uint8_t *hyb_ffn_hybrid_prefill_split(struct hyb_ffn_hybrid *h, uint32_t l)
{
	h->n_pre = 0;
	memset(h->pre_skip, 0, h->NG);
	/* oracle mode keeps the CPU batch's sums (tests compare bits) */
	if (h->oracle || hyb_ffn_hybrid_cpu_dense(h, l))
		return NULL;
	memset(h->usable, -1, h->NG);
	(void)hyb_ffn_hybrid_cache_poll(h);	/* a failure shows at the next decode step */
	for (uint32_t g = 0; g < h->NG; g++) {
		if (!group_usable(h, l, g))
			continue;
		h->pre_skip[g] = 1;
		for (uint32_t i = g * h->GS; i < g * h->GS + group_neurons(h, g); i++)
			h->h_list[h->n_pre++] = i;
	}
	return h->n_pre ? h->pre_skip : NULL;
}

int hyb_ffn_hybrid_prefill_ffn(struct hyb_ffn_hybrid *h, uint32_t l, const float *xn, uint32_t n,
			       float *y, char *err, size_t errlen)
{
	const size_t E = h->E;

	for (uint32_t t = 0; t < n && h->n_pre; t++) {
		struct hyb_dev_ffn f =
			hyb_ffn_hybrid_dev_ffn(h, l, h->d_xn, h->d_list, h->n_pre, h->d_y);

		if (hyb_ffn_hybrid_dev_inputs(h, l, xn + t * E, h->n_pre, false) ||
		    hyb_device_sparse_ffn(h->dev, HYB_STREAM_COMPUTE, &f) ||
		    hyb_ffn_hybrid_dev_result(h, sizeof(float) * E) ||
		    hyb_device_sync(h->dev, h->ev_out))
			return dev_fail(h, err, errlen, "prompt FFN on the device");
		memcpy(y + t * E, h->h_y, sizeof(float) * E);
	}
	return 0;
}

/* ---- a prompt batch on the device ------------------------------------------------ */

#define PW_MIN_TOKENS 32u      /* below this a batch is not worth its buffers */
#define PW_MAX_TOKENS 512u     /* llama.cpp's default ubatch */
#define PW_STAGE_MAX (8ull << 20) /* bytes of bundles a piece holds at most */

static uint64_t al256(uint64_t b)
{
	return (b + 255) & ~255ull;
}

static void note(struct hyb_ffn_hybrid *h, const char *why)
{
	snprintf(h->place.prompt_note, sizeof(h->place.prompt_note), "%s; prompts run token after "
		 "token", why);
}

/*
 * The batch's buffers in `share` bytes, the neuron cache's (docs/HYBRID.md,
 * "Prompts"): an eighth of it, at most 8 MiB, a staging area (two of
 * them); the rest holds the batch's activations, up to 512 tokens
 * (llama.cpp's ubatch) or the size asked for. Off in oracle mode (its
 * prompts keep the CPU batch's sums), with prefill_cpu, in box mode (the
 * cache is hybd's), and when fewer than 32 tokens fit.
 */
static uint64_t plan(struct hyb_ffn_hybrid *h, uint64_t share)
{
	const struct hyb_hparams *hp = &h->m->hp;
	const uint64_t q_dim = (uint64_t)hp->n_head * hp->head_dim;
	const uint64_t kv_dim = (uint64_t)hp->n_head_kv * hp->head_dim;
	const uint64_t per_tok = 4 * (3ull * h->E + 2 * q_dim + 2 * kv_dim);
	const uint64_t lists = 2 * al256(4ull * h->NG) + 2 * al256(4ull * h->NG * h->GS);
	uint64_t stage = share / 8 < PW_STAGE_MAX ? share / 8 : PW_STAGE_MAX, cap;
	struct prefill_ws *w = &h->pw;
	const uint32_t want = w->want;

	w->cap = 0;
	if (h->oracle || h->prefill_cpu || h->hc || !h->slot_bytes) {
		note(h, h->oracle ? "oracle mode keeps the CPU batch's sums" :
			h->prefill_cpu ? "--prefill-cpu" :
			h->hc ? "the neuron cache is hybd's (box mode)" : "no neuron cache");
		return 0;
	}
	w->piece = (uint32_t)(stage / h->slot_bytes < h->NG ? stage / h->slot_bytes : h->NG);
	if (!w->piece)
		w->piece = 1;
	stage = 2 * al256((uint64_t)w->piece * h->slot_bytes);
	/* seven arrays, each 256-byte aligned, and the region's own alignment */
	cap = stage + lists + 256 < share ? (share - stage - lists - 256) / (per_tok + 7 * 256) : 0;
	if (want)
		w->cap = cap >= want ? want : 0;
	else if (cap >= PW_MIN_TOKENS)
		w->cap = (uint32_t)(cap < PW_MAX_TOKENS ? cap : PW_MAX_TOKENS);
	if (!w->cap) {
		char why[96];

		snprintf(why, sizeof(why), "the neuron cache has room for the buffers of %llu "
			 "tokens, a batch needs %u", (unsigned long long)cap,
			 want ? want : PW_MIN_TOKENS);
		note(h, why);
		return 0;
	}
	w->bytes = stage + lists + 3 * al256(4ull * w->cap * h->E) +
		   2 * al256(4ull * w->cap * q_dim) + 2 * al256(4ull * w->cap * kv_dim) + 256;
	return w->bytes;
}

/* The next 256-byte aligned piece of n bytes at *at. */
static hyb_dptr carve(hyb_dptr *at, uint64_t n)
{
	const hyb_dptr p = al256(*at);

	*at = p + n;
	return p;
}

int hyb_ffn_hybrid_prefill_alloc(struct hyb_ffn_hybrid *h)
{
	const struct hyb_hparams *hp = &h->m->hp;
	const uint64_t q_dim = (uint64_t)hp->n_head * hp->head_dim;
	const uint64_t kv_dim = (uint64_t)hp->n_head_kv * hp->head_dim;
	const uint64_t cache = (uint64_t)h->total_slots * h->slot_bytes;
	struct prefill_ws *w = &h->pw;
	struct hyb_device *d = h->dev;
	uint64_t slots;
	hyb_dptr at;

	if (!h->total_slots) {
		note(h, "no neuron cache slots");
		return 0;
	}
	if (!plan(h, cache))
		return 0;
	slots = (w->bytes + h->slot_bytes - 1) / h->slot_bytes;
	w->first = (uint32_t)(h->total_slots - slots);
	at = h->cache + (uint64_t)w->first * h->slot_bytes;
	w->x = carve(&at, 4ull * w->cap * h->E);
	w->xn = carve(&at, 4ull * w->cap * h->E);
	w->y = carve(&at, 4ull * w->cap * h->E);
	w->q = carve(&at, 4ull * w->cap * q_dim);
	w->att = carve(&at, 4ull * w->cap * q_dim);
	w->k = carve(&at, 4ull * w->cap * kv_dim);
	w->v = carve(&at, 4ull * w->cap * kv_dim);
	for (int i = 0; i < 2; i++) {
		w->stage[i] = carve(&at, (uint64_t)w->piece * h->slot_bytes);
		w->list[i] = carve(&at, 4ull * h->NG * h->GS);
		w->table[i] = carve(&at, 4ull * h->NG);
		w->h_list[i] = hyb_device_host_alloc(d, 4ull * w->piece * h->GS);
		w->h_table[i] = hyb_device_host_alloc(d, 4ull * h->NG);
		w->ev_copy[i] = hyb_device_event_new(d);
		w->ev_kern[i] = hyb_device_event_new(d);
		if (!w->h_list[i] || !w->h_table[i] || !w->ev_copy[i] || !w->ev_kern[i])
			return -1;
		for (uint32_t g = 0; g < h->NG; g++)
			w->h_table[i][g] = -1;
	}
	w->groups = malloc(sizeof(uint32_t) * h->NG);
	w->evicted = malloc(2 * sizeof(uint32_t) * h->total_slots);
	w->ev_x = hyb_device_event_new(d);
	w->ev_pre = hyb_device_event_new(d);
	h->place.prompt_batch = w->cap;
	h->place.prompt_bytes = w->bytes;
	return w->groups && w->evicted && w->ev_x && w->ev_pre ? 0 : -1;
}

void hyb_ffn_hybrid_prefill_free(struct hyb_ffn_hybrid *h)
{
	struct prefill_ws *w = &h->pw;

	/* device memory goes with the device */
	for (int i = 0; i < 2; i++) {
		hyb_device_host_free(h->dev, w->h_list[i]);
		hyb_device_host_free(h->dev, w->h_table[i]);
		hyb_device_event_free(h->dev, w->ev_copy[i]);
		hyb_device_event_free(h->dev, w->ev_kern[i]);
	}
	hyb_device_event_free(h->dev, w->ev_x);
	hyb_device_event_free(h->dev, w->ev_pre);
	free(w->groups);
	free(w->evicted);
	memset(w, 0, sizeof(*w));
}

uint32_t hyb_ffn_hybrid_prefill_batch_cap(const struct hyb_ffn_hybrid *h)
{
	return h->pw.cap;
}

int hyb_ffn_hybrid_prefill_borrow(struct hyb_ffn_hybrid *h, char *err, size_t errlen)
{
	for (int i = 0; i < 2; i++)
		h->pw.used[i] = false;
	if (hyb_ffn_hybrid_cache_borrow(h, h->pw.first))
		return hyb_ffn_hybrid_cache_fail(h, err, errlen, "prompt batch buffers");
	return 0;
}

int hyb_ffn_hybrid_prefill_return(struct hyb_ffn_hybrid *h, char *err, size_t errlen)
{
	char scratch[8];

	if (hyb_ffn_hybrid_cache_return(h, h->pw.first))
		return hyb_ffn_hybrid_cache_fail(h, err ? err : scratch, err ? errlen : sizeof(scratch),
						 "reload after the prompt");
	return 0;
}

struct hyb_device_event *hyb_ffn_hybrid_batch_event(struct hyb_ffn_hybrid *h)
{
	return h->pw.ev_x;
}

void hyb_ffn_hybrid_prefill_bufs(const struct hyb_ffn_hybrid *h, struct hyb_hdense_batch *b)
{
	*b = (struct hyb_hdense_batch){ .x = h->pw.x, .xn = h->pw.xn, .q = h->pw.q,
					.k = h->pw.k, .v = h->pw.v, .att = h->pw.att };
}

/*
 * One piece (w->groups[0..k)) through staging area i: its bundles, list and
 * table up on RELOAD once the piece before in this area is done with it,
 * then the kernel over the batch on COMPUTE. The host waits for that
 * earlier piece before it rewrites the area's list and table (pinned
 * memory a copy may still read).
 */
static int stream_piece(struct hyb_ffn_hybrid *h, uint32_t l, int i, uint32_t k, uint32_t n,
			bool acc)
{
	const struct hyb_ffn_bundles *b = hyb_ffn_sparse_bundles(h->sp, l);
	/* the bundles back to back in the staging area, as they lie in the plan */
	const uint64_t stride = 3ull * h->GS * b->row_bytes;
	struct prefill_ws *w = &h->pw;
	struct hyb_device *d = h->dev;
	uint32_t n_list = 0;
	const uint8_t *run = NULL; /* host bytes not yet copied: a run of adjacent bundles */
	uint64_t run_at = 0, run_len = 0;

	if (w->used[i] && hyb_device_sync(d, w->ev_kern[i]))
		return -1;
	for (uint32_t g = 0; g < h->NG; g++)
		w->h_table[i][g] = -1;
	if (w->used[i] && hyb_device_wait(d, HYB_STREAM_RELOAD, w->ev_kern[i]))
		return -1;
	for (uint32_t j = 0; j < k; j++) {
		const uint32_t g = w->groups[j], gn = group_neurons(h, g);
		const uint64_t bytes = 3ull * gn * b->row_bytes;

		w->h_table[i][g] = (int32_t)j;
		for (uint32_t r = 0; r < gn; r++)
			w->h_list[i][n_list++] = g * h->GS + r;
		/* one copy a run: a copy costs the link's latency once */
		if (run && (const uint8_t *)b->bundle[g] == run + run_len &&
		    run_at + run_len == (uint64_t)j * stride) {
			run_len += bytes;
		} else {
			if (run && hyb_device_h2d(d, HYB_STREAM_RELOAD, w->stage[i] + run_at, run,
						  run_len))
				return -1;
			run = b->bundle[g];
			run_at = (uint64_t)j * stride;
			run_len = bytes;
		}
		h->st.prompt_stream_bytes += bytes;
	}
	if (run && hyb_device_h2d(d, HYB_STREAM_RELOAD, w->stage[i] + run_at, run, run_len))
		return -1;
	if (hyb_device_h2d(d, HYB_STREAM_RELOAD, w->list[i], w->h_list[i], 4ull * n_list) ||
	    hyb_device_h2d(d, HYB_STREAM_RELOAD, w->table[i], w->h_table[i], 4ull * h->NG) ||
	    hyb_device_record(d, HYB_STREAM_RELOAD, w->ev_copy[i]) ||
	    hyb_device_wait(d, HYB_STREAM_COMPUTE, w->ev_copy[i]))
		return -1;

	struct hyb_dev_ffn f = hyb_ffn_hybrid_dev_ffn(h, l, w->xn, w->list[i], n_list, w->y);

	f.table = w->table[i];
	f.cache = w->stage[i];
	f.slot_bytes = stride;
	f.accumulate = acc;
	f.batch = n;
	if (hyb_device_sparse_ffn(d, HYB_STREAM_COMPUTE, &f) ||
	    hyb_device_record(d, HYB_STREAM_COMPUTE, w->ev_kern[i]))
		return -1;
	w->used[i] = true;
	return 0;
}

int hyb_ffn_hybrid_prefill_batch_ffn(struct hyb_ffn_hybrid *h, uint32_t l, uint32_t n,
				     char *err, size_t errlen)
{
	struct prefill_ws *w = &h->pw;
	const bool cached = !hyb_ffn_hybrid_cpu_dense(h, l);
	uint32_t n_pre = 0, k = 0, pieces = 0;
	bool acc = false;

	if (!l)
		h->st.prompt_batches++;
	/* h_list is pinned memory the last layer's list copy read: done by now? */
	if (hyb_device_sync(h->dev, h->ev_in))
		return dev_fail(h, err, errlen, "prompt FFN on the device");
	memset(h->usable, -1, h->NG);
	(void)hyb_ffn_hybrid_cache_poll(h); /* a failure shows at the next decode step */
	for (uint32_t g = 0; g < h->NG; g++) {
		if (cached && group_usable(h, l, g)) {
			for (uint32_t i = g * h->GS; i < g * h->GS + group_neurons(h, g); i++)
				h->h_list[n_pre++] = i;
			continue;
		}
		w->groups[k++] = g;
		if (k == w->piece) {
			if (stream_piece(h, l, pieces++ & 1, k, n, acc))
				return dev_fail(h, err, errlen, "prompt FFN streamed to the device");
			acc = true;
			k = 0;
		}
	}
	if (k && stream_piece(h, l, pieces++ & 1, k, n, acc))
		return dev_fail(h, err, errlen, "prompt FFN streamed to the device");
	acc = acc || k;
	if (n_pre) {
		struct hyb_dev_ffn f = hyb_ffn_hybrid_dev_ffn(h, l, w->xn, h->d_list, n_pre, w->y);

		f.accumulate = acc;
		f.batch = n;
		/* the list and table go up on CRITICAL: after the last layer's kernel read them */
		if (hyb_device_wait(h->dev, HYB_STREAM_CRITICAL, w->ev_pre) ||
		    hyb_ffn_hybrid_dev_inputs(h, l, NULL, n_pre, true) ||
		    hyb_device_sparse_ffn(h->dev, HYB_STREAM_COMPUTE, &f) ||
		    hyb_device_record(h->dev, HYB_STREAM_COMPUTE, w->ev_pre))
			return dev_fail(h, err, errlen, "prompt FFN on the device");
		acc = true;
	}
	if (acc && hyb_device_add(h->dev, HYB_STREAM_COMPUTE, w->x, w->y, n * (uint32_t)h->E))
		return dev_fail(h, err, errlen, "prompt FFN on the device");
	return 0;
}
