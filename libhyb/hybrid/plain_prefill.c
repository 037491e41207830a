// SPDX-License-Identifier: MIT
/*
 * A plain model's prompt with a batch on the device (plain_hybrid.h;
 * docs/HYBRID.md "Plain models"), in pieces of the batch's rows. Per layer:
 *
 *   attention  on the device when placed (dense.c's batched block: its KV
 *              rows land in the device's cache), the rows going up first
 *              if they were on the host; else on the CPU (forward.c), the
 *              rows coming down first if they were on the device;
 *   FFN        on the device when placed, over the device's ffn_norm(x)
 *              or the CPU's sent up; x += ffn there when x is there, else
 *              its output comes down; otherwise on the CPU (forward.c).
 *
 * PowerInfer 5.3 and llama.cpp run a prompt's placed layers on the GPU as
 * its decode steps do; so here, with no weight streamed (the parts not
 * placed run on the CPU, which holds them). On the CPU device, which runs
 * the CPU's kernels, the rows are the CPU pass's where its GEMM sums a
 * column as its one-token kernel does (Q8_0: tests/unit/test_plain_hybrid.c).
 */
#include <stdio.h>
#include <string.h>

#include "dense.h"
#include "forward/forward_internal.h"
#include "plain_hybrid.h"

static int fail(struct hyb_ctx *c, char *err, size_t errlen, const char *what)
{
	snprintf(err, errlen, "%s: %s", what,
		 hyb_device_error(hyb_plain_hybrid_device(c->plain_hybrid)));
	return -1;
}

/* The n rows of c->x through every layer; they end on the host. */
static int layers(struct hyb_ctx *c, uint32_t n, char *err, size_t errlen)
{
	struct hyb_plain_hybrid *h = c->plain_hybrid;
	struct hyb_hdense *hd = hyb_plain_hybrid_dense(h);
	const struct hyb_hdense_batch *b = hyb_plain_hybrid_prompt_bufs(h);
	const uint32_t E = c->m->hp.n_embd;
	bool on_dev = false; /* the rows' latest x is the device's */

	for (uint32_t l = 0; l < c->m->hp.n_layer; l++) {
		if (hd && hyb_hdense_layer_on(hd, l)) {
			if (!on_dev && hyb_plain_hybrid_rows_up(h, b->x, c->x, n))
				return fail(c, err, errlen, "prompt rows to the device");
			if (hyb_hdense_attention_batch(hd, l, c->n_past, n, b))
				return fail(c, err, errlen, "prompt attention on the device");
			on_dev = true;
		} else {
			if (on_dev && hyb_plain_hybrid_rows_down(h, c->x, b->x, n))
				return fail(c, err, errlen, "prompt rows from the device");
			on_dev = false;
			hyb_fwd_attention(c, l, n);
			hyb_fwd_ffn_norm(c, l, c->x, n);
		}
		if (hyb_plain_hybrid_ffn_on(h, l)) {
			hyb_dptr y;

			if (!on_dev && hyb_plain_hybrid_rows_up(h, b->xn, c->xn, n))
				return fail(c, err, errlen, "prompt rows to the device");
			if (hyb_plain_hybrid_ffn_batch(h, l, n, on_dev, &y))
				return fail(c, err, errlen, "prompt FFN on the device");
			if (on_dev)
				continue; /* x += ffn happened on the device */
			if (hyb_plain_hybrid_rows_down(h, c->xn, y, n))
				return fail(c, err, errlen, "prompt FFN from the device");
		} else {
			if (on_dev && (hyb_plain_hybrid_rows_down(h, c->x, b->x, n) ||
				       hyb_plain_hybrid_rows_down(h, c->xn, b->xn, n)))
				return fail(c, err, errlen, "prompt rows from the device");
			on_dev = false;
			hyb_fwd_ffn_dense(c, l, n);
		}
		hyb_fwd_post_norm(c, &c->m->layers[l].post_ffn_norm, c->xn, n);
		for (size_t i = 0; i < (size_t)n * E; i++)
			c->x[i] += c->xn[i];
	}
	if (on_dev && hyb_plain_hybrid_rows_down(h, c->x, b->x, n))
		return fail(c, err, errlen, "prompt rows from the device");
	return 0;
}

/* Logits of rows first.. of the n in c->x into lg, on the head's side. */
static int head(struct hyb_ctx *c, uint32_t first, uint32_t n, float *lg, char *err,
		size_t errlen)
{
	struct hyb_hdense *hd = hyb_plain_hybrid_dense(c->plain_hybrid);
	const uint32_t E = c->m->hp.n_embd, V = c->m->hp.n_vocab;

	if (!hd || !hyb_hdense_head_on(hd)) {
		hyb_fwd_head(c, first, n, lg);
		return 0;
	}
	for (uint32_t t = first; t < n; t++) {
		memcpy(hyb_hdense_host_x(hd), c->x + (size_t)t * E, sizeof(float) * E);
		if (hyb_hdense_x_up(hd) || hyb_hdense_head(hd, lg + (size_t)(t - first) * V))
			return fail(c, err, errlen, "head on the device");
	}
	return 0;
}

int hyb_plain_prefill(struct hyb_ctx *c, const int32_t *tokens, uint32_t n, float *logits,
		      bool all_logits, char *err, size_t errlen)
{
	struct hyb_plain_hybrid *h = c->plain_hybrid;
	struct hyb_hdense *hd = hyb_plain_hybrid_dense(h);
	const uint32_t cap = hyb_plain_hybrid_prompt_cap(h), V = c->m->hp.n_vocab;

	if (!cap)
		return -1;
	/* the rows decoded on the CPU for the blocks on the device */
	if (hd && hyb_hdense_kv_up(hd, c->kcache, c->vcache, c->n_past))
		return fail(c, err, errlen, "KV cache to the device");
	for (uint32_t off = 0; off < n;) {
		const uint32_t m = n - off < cap ? n - off : cap;
		const bool last = off + m == n;
		/* logits: every row's, or the prompt's last row's */
		const uint32_t first = all_logits ? 0 : last ? m - 1 : m;

		hyb_fwd_embed(c, tokens + off, m);
		if (layers(c, m, err, errlen) ||
		    (first < m && head(c, first, m, logits + (all_logits ? (size_t)off * V : 0),
				       err, errlen)))
			return -1;
		c->n_past += m;
		off += m;
		hyb_plain_hybrid_prompt_done(h);
	}
	return 0;
}
