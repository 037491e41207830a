// SPDX-License-Identifier: MIT
/*
 * Where the device budget goes (hyb/hybrid.h, "Where the dense parts
 * run"): attention blocks, the head and the predictors whose input is on
 * the device before any neuron group, or whole layers under the layer
 * policy; box mode's groups get hybd's cache instead of budget.
 */
#include <stdio.h>
#include <stdlib.h>

#include "cache_hybd.h"
#include "dense.h"
#include "ffn_hybrid_internal.h"

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

/*
 * Several sequences: a pass's rows on the device (x, xn, y, q, att, k, v,
 * and two layers' predictions where the plan has predictors; decode_seqs.c),
 * 0 with one sequence.
 */
uint64_t hyb_ffn_hybrid_seq_buf_bytes(const struct hyb_ffn_hybrid *h)
{
	const struct hyb_hparams *hp = &h->m->hp;
	const uint64_t q = (uint64_t)hp->n_head * hp->head_dim;
	const uint64_t kv = (uint64_t)hp->n_head_kv * hp->head_dim;
	const uint64_t r = h->seq_rows, a = 256;

	if (!r)
		return 0;
	return 3 * ((4 * r * h->E + a - 1) / a * a) + 2 * ((4 * r * q + a - 1) / a * a) +
	       2 * ((4 * r * kv + a - 1) / a * a) +
	       (hyb_hdense_pred_bytes(h->m, 0) ? 2 * ((4 * r * (1ull + h->F) + a - 1) / a * a) : 0);
}

/*
 * The layer policy (llama.cpp -ngl): whole layers in order - attention
 * block and every group - then the output layer; returns the slots of the
 * whole layers.
 */
static uint64_t place_layers(struct hyb_ffn_hybrid *h, const struct hyb_hybrid_params *p,
			     uint32_t n_ctx, uint64_t avail, bool *on, bool *head)
{
	const struct hyb_model *m = h->m;
	/* box mode: groups live in hybd's cache, not in this app's budget */
	const uint64_t layer_ffn = h->hc ? 0 : (uint64_t)h->NG * h->slot_bytes;
	const uint64_t hb = hyb_hdense_head_bytes(m);
	uint32_t n_on = 0, full = 0, max_full = h->L;

	if (h->hc) {
		struct hyb_hybd_cache_info ci;

		hyb_hybd_cache_info(h->hc, &ci);
		max_full = ci.n_slots / h->NG < h->L ? ci.n_slots / h->NG : h->L;
	}
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

/*
 * The dense parts (PowerInfer 5.3): attention blocks first, in layer order,
 * then the head, then the predictors whose input is on the device; returns
 * the slots of what is left.
 */
static uint64_t place_parts(struct hyb_ffn_hybrid *h, const struct hyb_hybrid_params *p,
			    uint32_t n_ctx, uint64_t avail, bool *on, bool *head, bool *pred)
{
	const struct hyb_model *m = h->m;
	const uint64_t hb = hyb_hdense_head_bytes(m);
	uint32_t n_on = 0, n_pred = 0;

	if (p->dense_on_cpu)
		return avail / h->slot_bytes;
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
	 * Then the predictors whose input (the attention output they read,
	 * hyb_hdense_pred_source) is on the device: fc1 is read whole every
	 * token and fc2 by the hidden units that fire, and on the CPU the F16
	 * GEMVs cost more than their bytes (8-layer 7B shape on 2 cores: 33 ms
	 * per token against 23 ms for the CPU's neurons), so they come before
	 * any neuron group.
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
	return avail / h->slot_bytes;
}

/*
 * Split the budget (hyb/hybrid.h "Where the dense parts run"): on[l] and
 * *head say which dense parts go to the device; returns the cache slots
 * left for neuron groups. `avail` is the budget less the FFN buffers.
 */
static uint64_t place_dense(struct hyb_ffn_hybrid *h, const struct hyb_hybrid_params *p,
			    uint32_t n_ctx, uint64_t avail, bool *on, bool *head, bool *pred)
{
	*head = false;
	if (h->layer_policy)
		return place_layers(h, p, n_ctx, avail, on, head);
	return place_parts(h, p, n_ctx, avail, on, head, pred);
}

/*
 * The budget split (place_dense) and its checks: the budget must hold this
 * app's buffers in box mode, and something in any mode.
 */
int hyb_ffn_hybrid_place(struct hyb_ffn_hybrid *h, const struct hyb_hybrid_params *p,
			 uint32_t n_ctx, struct hyb_ffn_budget *b, char *err, size_t errlen)
{
	const uint64_t fixed = fixed_bytes(h->L, h->NG, h->E, h->F, h->oracle) +
			       hyb_ffn_hybrid_seq_buf_bytes(h);

	b->on = calloc(h->L, sizeof(*b->on));
	b->pred = calloc(h->L, sizeof(*b->pred));
	if (!b->on || !b->pred) {
		snprintf(err, errlen, "out of memory for hybrid decoding");
		return -1;
	}
	/* the attention blocks' KV: a sequence's rows for each slot */
	if (p->gpu_budget > fixed)
		b->slots = place_dense(h, p, n_ctx * h->kv_slots, p->gpu_budget - fixed, b->on,
				       &b->head, b->pred);
	if (h->hc && p->gpu_budget <= fixed) {
		snprintf(err, errlen, "GPU budget %llu bytes does not hold this app's device buffers "
			 "(%llu bytes; the groups go to hybd's cache)",
			 (unsigned long long)p->gpu_budget, (unsigned long long)fixed);
		return -1;
	}
	if (h->hc && !h->layer_policy) {
		const uint64_t all_groups = (uint64_t)h->L * h->NG;
		struct hyb_hybd_cache_info ci;

		/*
		 * Box mode: the budget is this app's device memory (dense parts,
		 * buffers); the groups get every slot of hybd's cache, whose size
		 * is hybd's gpu_cache. The layer policy counted its whole layers.
		 */
		hyb_hybd_cache_info(h->hc, &ci);
		b->slots = ci.n_slots < all_groups ? ci.n_slots : all_groups;
	}
	for (uint32_t l = 0; l < h->L; l++) {
		h->place.attn_layers += b->on[l];
		h->place.predictors += b->pred[l];
	}
	h->place.head = b->head;
	if (!b->slots && !h->place.attn_layers && !b->head) {
		snprintf(err, errlen, "GPU budget %llu bytes holds nothing: no neuron group (%llu "
			 "bytes each, plus %llu of buffers)%s", (unsigned long long)p->gpu_budget,
			 (unsigned long long)h->slot_bytes, (unsigned long long)fixed,
			 p->policy == HYB_POLICY_LAYER ? ", no whole layer" : "");
		return -1;
	}
	return 0;
}

void hyb_ffn_hybrid_placement(const struct hyb_ffn_hybrid *h, struct hyb_hybrid_offload *out)
{
	*out = h->place;
}
