// SPDX-License-Identifier: MIT
/*
 * The hybrid engine's side of several sequences in one context
 * (decode_seqs.c runs the pass): which sequences hold a KV slot on the
 * device, the pass's row buffers there, and the cached groups' share of a
 * pass's FFN.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dense.h"
#include "ffn_hybrid_internal.h"
#include "sparse/sparse_layer.h"
#include "sparse/sparse_op.h"

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

/* Each pool thread's sparse operator context and list, made the first time. */
static int row_contexts(struct hyb_ffn_hybrid *h, int nth)
{
	if (h->row_threads >= nth)
		return 0;
	for (int i = 0; i < h->row_threads; i++) {
		hyb_sparse_ffn_ctx_free(h->row_op[i]);
		free(h->row_list[i]);
	}
	free(h->row_op);
	free(h->row_list);
	h->row_threads = 0;
	h->row_op = calloc((size_t)nth, sizeof(*h->row_op));
	h->row_list = calloc((size_t)nth, sizeof(*h->row_list));
	if (!h->row_op || !h->row_list)
		return -1;
	h->row_threads = nth;
	for (int i = 0; i < nth; i++)
		if (!(h->row_op[i] = hyb_sparse_ffn_ctx_new(h->E, h->F, 1)) ||
		    !(h->row_list[i] = malloc(sizeof(uint32_t) * h->F)))
			return -1;
	return 0;
}

void hyb_ffn_hybrid_seq_free(struct hyb_ffn_hybrid *h)
{
	for (int i = 0; i < h->row_threads; i++) {
		hyb_sparse_ffn_ctx_free(h->row_op[i]);
		free(h->row_list[i]);
	}
	free(h->row_op);
	free(h->row_list);
}

struct rows_job {
	struct hyb_ffn_hybrid *h;
	const struct hyb_ffn_bundles *b;
	uint32_t l, n, stride;
	const float *xn;
	const uint32_t *preds;
	const uint8_t *row_dense, *skip;
	float *y;
	bool exact;
	atomic_uint next;
	atomic_ullong neurons;
	atomic_int failed;
};

/*
 * Threads take rows as they come, each row whole on one thread with its
 * own operator context: the operator's sums do not depend on its thread
 * count (sparse_op.c), so a row's bits are the same on any thread.
 */
static void rows_worker(void *arg, int ith, int nth)
{
	struct rows_job *j = arg;
	struct hyb_ffn_hybrid *h = j->h;
	uint32_t *list = h->row_list[ith];

	(void)nth;
	for (;;) {
		const uint32_t t = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);

		if (t >= j->n)
			return;
		if (j->row_dense[t])
			continue;
		const uint32_t *row = j->preds + (size_t)t * j->stride;
		const uint32_t n_pred = row[0] < h->F ? row[0] : h->F;
		float *y = j->y + (size_t)t * h->E;
		struct hyb_sparse_ffn_stats st;
		uint32_t n = 0;

		/* exact CATS (ffn_hybrid_layer.c): every neuron, the threshold decides */
		for (uint32_t i = 0; i < (j->exact ? h->F : n_pred); i++) {
			const uint32_t nr = j->exact ? i : row[1 + i];

			if (nr < h->F && !(j->skip && j->skip[nr / h->GS]))
				list[n++] = nr;
		}
		atomic_fetch_add_explicit(&j->neurons, n, memory_order_relaxed);
		if (!n) {
			memset(y, 0, sizeof(float) * h->E);
			continue;
		}
		if (hyb_sparse_ffn_cats(h->row_op[ith], NULL, j->b, h->m->hp.act,
					j->xn + (size_t)t * h->E, list, n,
					h->thr ? h->thr[j->l] : 0.0f, y, &st))
			atomic_store(&j->failed, 1);
	}
}

int hyb_ffn_hybrid_seq_cpu_rows(struct hyb_ffn_hybrid *h, struct hyb_threadpool *pool,
				uint32_t l, const float *xn, uint32_t n, const uint32_t *preds,
				const uint8_t *row_dense, const uint8_t *skip, float *y, char *err,
				size_t errlen)
{
	const int nth = pool ? hyb_threadpool_size(pool) : 1;
	struct rows_job j = {
		.h = h, .b = hyb_ffn_sparse_bundles(h->sp, l), .l = l, .n = n,
		.stride = 1 + h->F, .xn = xn, .preds = preds, .row_dense = row_dense,
		.skip = skip, .y = y, .exact = h->thr && h->thr[l] > 0,
	};

	if (row_contexts(h, nth)) {
		snprintf(err, errlen, "out of memory for the pass's CPU rows");
		return -1;
	}
	atomic_init(&j.next, 0);
	atomic_init(&j.neurons, 0);
	atomic_init(&j.failed, 0);
	if (nth == 1)
		rows_worker(&j, 0, 1);
	else
		hyb_threadpool_run_dynamic(pool, rows_worker, &j);
	h->st.seq_neurons_cpu += atomic_load(&j.neurons);
	if (atomic_load(&j.failed)) {
		snprintf(err, errlen, "layer %u: the sparse FFN of the pass's rows failed", l);
		return -1;
	}
	return 0;
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
