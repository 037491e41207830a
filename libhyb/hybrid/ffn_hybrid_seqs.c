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
	    hyb_device_sparse_ffn(h->dev, HYB_STREAM_COMPUTE, &f) ||
	    hyb_device_record(h->dev, HYB_STREAM_COMPUTE, h->ev_k))
		return dev_fail(h, err, errlen, "the pass's FFN on the device");
	return 0;
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
