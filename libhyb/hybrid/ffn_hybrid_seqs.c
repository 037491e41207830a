// SPDX-License-Identifier: MIT
/*
 * The hybrid engine's side of several sequences in one context
 * (decode_seqs.c runs the pass): which sequences hold a KV slot on the
 * device, the pass's row buffers there, and the cached groups' share of a
 * pass's FFN.
 */
#include <string.h>

#include "dense.h"
#include "ffn_hybrid_internal.h"
#include "sparse/sparse_layer.h"

void hyb_ffn_hybrid_seq_open(struct hyb_ffn_hybrid *h, int seq)
{
	if (h->n_seq < 2 || seq < 0 || (uint32_t)seq >= h->n_seq)
		return;
	h->seq_slot[seq] = -1;
	/* GPU-first (APEX 3.4): the device's KV while it has room, in the order sequences open */
	for (uint32_t s = 0; s < h->kv_slots && hyb_hdense_layers_on(h->hd); s++)
		if (h->slot_seq_of[s] < 0) {
			h->slot_seq_of[s] = seq;
			h->seq_slot[seq] = (int32_t)s;
			return;
		}
}

void hyb_ffn_hybrid_seq_close(struct hyb_ffn_hybrid *h, int seq)
{
	if (h->n_seq < 2 || seq < 0 || (uint32_t)seq >= h->n_seq)
		return;
	if (h->seq_slot[seq] >= 0)
		h->slot_seq_of[h->seq_slot[seq]] = -1;
	h->seq_slot[seq] = -1;
}

int hyb_ffn_hybrid_seq_slot(const struct hyb_ffn_hybrid *h, int seq)
{
	if (h->n_seq < 2 || seq < 0 || (uint32_t)seq >= h->n_seq)
		return -1;
	return h->seq_slot[seq];
}

void hyb_ffn_hybrid_seq_bufs(const struct hyb_ffn_hybrid *h, struct hyb_hdense_batch *b,
			     hyb_dptr *y, struct hyb_device_event **ev)
{
	*b = h->sb;
	*y = h->sb_y;
	*ev = h->ev_seq;
}

struct hyb_device_event *const *hyb_ffn_hybrid_seq_prof(const struct hyb_ffn_hybrid *h)
{
	return h->ev_prof;
}

void hyb_ffn_hybrid_seq_profile(struct hyb_ffn_hybrid *h, double linear_s, double attn_s,
				uint32_t layers)
{
	h->st.seq_linear_s += linear_s;
	h->st.seq_dev_attn_s += attn_s;
	h->st.seq_layers += layers;
}

bool hyb_ffn_hybrid_seq_preds(const struct hyb_ffn_hybrid *h, int i, hyb_dptr *dev,
			      uint32_t **host)
{
	/* oracle mode keeps every row dense: the CPU pass's bits */
	if (h->oracle || !h->h_pred[i & 1])
		return false;
	*dev = h->sb_pred[i & 1];
	*host = h->h_pred[i & 1];
	return true;
}

int hyb_ffn_hybrid_seq_ffn(struct hyb_ffn_hybrid *h, uint32_t l, uint32_t n, char *err,
			   size_t errlen)
{
	struct hyb_dev_ffn f = hyb_ffn_hybrid_dev_ffn(h, l, h->sb.xn, h->d_list, h->n_pre, h->sb_y);

	if (!h->n_pre)
		return 0;
	h->st.seq_neurons_dev += (uint64_t)h->n_pre * n;
	f.batch = n;
	/* decode_seqs.c waited for the last layer's result: its list is read */
	if (hyb_ffn_hybrid_dev_inputs(h, l, NULL, h->n_pre, true) ||
	    hyb_device_record(h->dev, HYB_STREAM_COMPUTE, h->ev_prof[5]) ||
	    hyb_device_sparse_ffn(h->dev, HYB_STREAM_COMPUTE, &f) ||
	    hyb_device_record(h->dev, HYB_STREAM_COMPUTE, h->ev_prof[6]) ||
	    hyb_device_record(h->dev, HYB_STREAM_COMPUTE, h->ev_k))
		return dev_fail(h, err, errlen, "the pass's FFN on the device");
	return 0;
}

int hyb_ffn_hybrid_seq_cpu_row(struct hyb_ffn_hybrid *h, struct hyb_threadpool *pool, uint32_t l,
				const float *xn, const uint32_t *pred, uint32_t n_pred,
				const uint8_t *skip, float *y, char *err, size_t errlen)
{
	/* exact CATS (ffn_hybrid_layer.c): every neuron, the threshold decides */
	const bool exact = h->thr && h->thr[l] > 0;
	struct hyb_sparse_ffn_stats st;
	uint32_t n = 0;

	for (uint32_t i = 0; i < (exact ? h->F : n_pred); i++) {
		const uint32_t nr = exact ? i : pred[i];

		if (nr < h->F && !(skip && skip[nr / h->GS]))
			h->cpu_list[n++] = nr;
	}
	h->st.seq_neurons_cpu += n;
	if (!n) {
		memset(y, 0, sizeof(float) * h->E);
		return 0;
	}
	return hyb_ffn_sparse_run(h->sp, pool, l, xn, h->cpu_list, n, y, &st, err, errlen);
}

void hyb_ffn_hybrid_seq_groups(struct hyb_ffn_hybrid *h, uint64_t cpu, uint64_t all)
{
	h->st.seq_groups_cpu += cpu;
	h->st.seq_groups_all += all;
}

void hyb_ffn_hybrid_seq_stats(struct hyb_ffn_hybrid *h, uint32_t rows, uint64_t dev_rows,
			      uint64_t cpu_rows, double cpu_attn_s)
{
	h->st.seq_passes++;
	h->st.seq_rows += rows;
	h->st.attn_rows_dev += dev_rows;
	h->st.attn_rows_cpu += cpu_rows;
	h->st.cpu_attn_s += cpu_attn_s;
}
