// SPDX-License-Identifier: MIT
/*
 * The hybrid decode step (hybrid/decode.h). Per layer:
 *
 *   attention  on the device when placed there (hybrid/dense.c): the block
 *              runs on COMPUTE, then x and ffn_norm(x) come down on CRITICAL
 *              for the CPU's neurons, with the active sets of the
 *              predictors that read this output when they are on the
 *              device too (layer l+1's, or layer l's own for a same-layer
 *              model) - the only wait of the layer; otherwise on the
 *              CPU (forward.c's code);
 *   FFN        the split of ffn_hybrid_layer.c, merged on the device
 *              when the attention was there (PowerInfer 5.3: the next
 *              layer's attention reads x where it was merged), else on the
 *              host; a layer-policy layer not on the device runs dense on
 *              the CPU;
 *   head       on the device when placed, else on the CPU.
 *
 * The residual stream lives where the last step left it (`where`); a step
 * on the other side first moves it (n_embd floats on CRITICAL).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decode.h"
#include "ffn_hybrid.h"
#include "forward/forward_internal.h"
#include "dense.h"

enum x_where { X_HOST, X_DEV, X_BOTH };

struct step {
	struct hyb_ctx *c;
	struct hyb_ffn_hybrid *h;
	struct hyb_hdense *hd;
	struct hyb_device *dev;
	enum x_where where;
	char *err;
	size_t errlen;
};

static int dev_err(struct step *s, const char *what)
{
	snprintf(s->err, s->errlen, "%s: %s", what, hyb_device_error(s->dev));
	return -1;
}

/* x on the host, current */
static int x_to_host(struct step *s)
{
	struct hyb_device_event *ev;

	if (s->where != X_DEV)
		return 0;
	if (hyb_hdense_x_down(s->hd, false, &ev) || hyb_device_sync(s->dev, ev))
		return dev_err(s, "residual stream from the device");
	memcpy(s->c->x, hyb_hdense_host_x(s->hd), sizeof(float) * s->c->m->hp.n_embd);
	s->where = X_BOTH;
	return 0;
}

static int x_to_dev(struct step *s)
{
	if (s->where != X_HOST)
		return 0;
	memcpy(hyb_hdense_host_x(s->hd), s->c->x, sizeof(float) * s->c->m->hp.n_embd);
	if (hyb_hdense_x_up(s->hd))
		return dev_err(s, "residual stream to the device");
	s->where = X_BOTH;
	return 0;
}

static int attention(struct step *s, uint32_t l)
{
	struct hyb_ctx *c = s->c;

	if (hyb_hdense_layer_on(s->hd, l)) {
		if (x_to_dev(s))
			return -1;
		struct hyb_device_event *ev;
		const uint32_t E = c->m->hp.n_embd;
		const float *hx = hyb_hdense_host_x(s->hd);

		/*
		 * x and xn come down first: the CPU's half of the FFN waits for
		 * them and nothing else. Then the predictors that read this output
		 * (ffn_hybrid_layer.c picks them up): adjacent, layer l+1's (and
		 * layer 0's own into slot 0), slots alternating so layer l's stays
		 * on the host until its split; same-layer, layer l's own into slot
		 * 0; and their copy, waited for only where a list is needed
		 * (KAIROX 5.1: predictors off the critical path).
		 */
		if (hyb_hdense_attention(s->hd, l, c->n_past) ||
		    hyb_hdense_x_down(s->hd, true, &ev))
			return dev_err(s, "attention on the device");
		const bool same = c->m->pred_input == HYB_PRED_SAME_LAYER;

		if (((same || l == 0) && hyb_hdense_pred_on(s->hd, l) &&
		     hyb_hdense_predict(s->hd, l, 0)) ||
		    (!same && l + 1 < c->m->hp.n_layer && hyb_hdense_pred_on(s->hd, l + 1) &&
		     hyb_hdense_predict(s->hd, l + 1, hyb_hdense_pred_slot(l + 1))) ||
		    hyb_hdense_pred_down(s->hd))
			return dev_err(s, "predictor on the device");
		if (hyb_device_sync(s->dev, ev))
			return dev_err(s, "residual stream from the device");
		memcpy(c->x, hx, sizeof(float) * E);
		memcpy(c->xn, hx + E, sizeof(float) * E);
		s->where = X_BOTH;
		return 0;
	}
	if (x_to_host(s))
		return -1;
	hyb_fwd_attention(c, l, 1);
	hyb_fwd_ffn_norm(c, l, c->x, 1);
	s->where = X_HOST;
	return 0;
}

static int ffn(struct step *s, uint32_t l)
{
	struct hyb_ctx *c = s->c;
	const uint32_t E = c->m->hp.n_embd;
	bool on_dev;

	if (hyb_ffn_hybrid_cpu_dense(s->h, l)) {
		if (x_to_host(s))
			return -1;
		hyb_fwd_ffn_dense(c, l, 1);
		on_dev = false;
	} else {
		on_dev = hyb_ffn_hybrid_merge_on_device(s->h, l);
		if (hyb_ffn_hybrid_layer(s->h, c->pool, l, c->x, c->xn, c->xn, on_dev, s->err,
					 s->errlen))
			return -1;
	}
	if (on_dev) {
		s->where = X_DEV;
	} else {
		/* Gemma 3's norm after the FFN (never merged on the device) */
		hyb_fwd_post_norm(c, &c->m->layers[l].post_ffn_norm, c->xn, 1);
		for (uint32_t i = 0; i < E; i++)
			c->x[i] += c->xn[i];
		s->where = X_HOST;
	}
	return 0;
}

static int head(struct step *s, float *logits)
{
	if (hyb_hdense_head_on(s->hd)) {
		if (x_to_dev(s) || hyb_hdense_head(s->hd, logits))
			return dev_err(s, "head on the device");
		return 0;
	}
	if (x_to_host(s))
		return -1;
	hyb_fwd_head(s->c, 0, 1, logits);
	return 0;
}

int hyb_decode_hybrid(struct hyb_ctx *c, int32_t token, float *logits, char *err,
		      size_t errlen)
{
	struct step s = {
		.c = c, .h = c->hybrid, .hd = hyb_ffn_hybrid_dense(c->hybrid),
		.dev = hyb_ffn_hybrid_device(c->hybrid), .where = X_HOST,
		.err = err, .errlen = errlen,
	};
	double t0, t1, attn_s = 0;

	hyb_ffn_hybrid_begin_token(s.h);
	hyb_fwd_embed(c, &token, 1);
	/* the prompt's rows (processed on the CPU) for the layers on the device */
	if (s.hd && hyb_hdense_kv_up(s.hd, c->kcache, c->vcache, c->n_past))
		return dev_err(&s, "KV cache to the device");
	for (uint32_t l = 0; l < c->m->hp.n_layer; l++) {
		t0 = hyb_device_now(s.dev);
		if (attention(&s, l))
			return -1;
		attn_s += hyb_device_now(s.dev) - t0;
		if (ffn(&s, l))
			return -1;
	}
	t0 = hyb_device_now(s.dev);
	if (head(&s, logits))
		return -1;
	t1 = hyb_device_now(s.dev);
	hyb_ffn_hybrid_stats_add(s.h, attn_s, t1 - t0);
	c->n_past++;
	return 0;
}

/* The batch's x rows (n of them) between c->x and the device: up, or down and waited for. */
static int batch_x(struct step *s, const struct hyb_hdense_batch *b, uint32_t n, bool up,
		   bool with_xn)
{
	struct hyb_ctx *c = s->c;
	const uint64_t bytes = sizeof(float) * n * c->m->hp.n_embd;
	struct hyb_device_event *ev = hyb_ffn_hybrid_batch_event(s->h);

	if (up) {
		if (hyb_device_h2d(s->dev, HYB_STREAM_CRITICAL, b->x, c->x, bytes) ||
		    (with_xn && hyb_device_h2d(s->dev, HYB_STREAM_CRITICAL, b->xn, c->xn, bytes)) ||
		    hyb_device_record(s->dev, HYB_STREAM_CRITICAL, ev) ||
		    hyb_device_wait(s->dev, HYB_STREAM_COMPUTE, ev))
			return dev_err(s, "prompt batch to the device");
		s->where = X_DEV;
		return 0;
	}
	if (hyb_device_record(s->dev, HYB_STREAM_COMPUTE, ev) ||
	    hyb_device_wait(s->dev, HYB_STREAM_CRITICAL, ev) ||
	    hyb_device_d2h(s->dev, HYB_STREAM_CRITICAL, c->x, b->x, bytes) ||
	    hyb_device_record(s->dev, HYB_STREAM_CRITICAL, ev) || hyb_device_sync(s->dev, ev))
		return dev_err(s, "prompt batch from the device");
	s->where = X_HOST;
	return 0;
}

/*
 * n <= the batch's capacity tokens of a prompt, from c->x to c->x, every
 * layer on the device: a placed attention block batched there, another on
 * the CPU (the rows go down and up again around it), and the FFN dense on
 * the device (hyb_ffn_hybrid_prefill_batch_ffn: cached groups in place, the
 * others streamed).
 */
static int batch_layers(struct step *s, uint32_t n)
{
	struct hyb_ctx *c = s->c;
	struct hyb_hdense_batch b;

	hyb_ffn_hybrid_prefill_bufs(s->h, &b);
	s->where = X_HOST;
	for (uint32_t l = 0; l < c->m->hp.n_layer; l++) {
		if (hyb_hdense_layer_on(s->hd, l)) {
			if (s->where == X_HOST && batch_x(s, &b, n, true, false))
				return -1;
			if (hyb_hdense_attention_batch(s->hd, l, c->n_past, n, &b))
				return dev_err(s, "prompt attention on the device");
		} else {
			if (s->where == X_DEV && batch_x(s, &b, n, false, false))
				return -1;
			hyb_fwd_attention(c, l, n);
			hyb_fwd_ffn_norm(c, l, c->x, n);
			if (batch_x(s, &b, n, true, true))
				return -1;
		}
		if (hyb_ffn_hybrid_prefill_batch_ffn(s->h, l, n, s->err, s->errlen))
			return -1;
	}
	return batch_x(s, &b, n, false, false);
}

/*
 * A prompt of at least PREFILL_BATCH_MIN tokens with a batch on the device
 * (docs/HYBRID.md, "Prompts"): PowerInfer and KAIROX prefill on the GPU;
 * the weights not there stream through it, as llama.cpp does for batches
 * of 32 tokens and more. Chunks of the batch's capacity, in order.
 */
#define PREFILL_BATCH_MIN 32u

static int prefill_batched(struct step *s, const int32_t *tokens, uint32_t n, float *logits,
			   bool all_logits)
{
	struct hyb_ctx *c = s->c;
	const uint32_t cap = hyb_ffn_hybrid_prefill_batch_cap(s->h), V = c->m->hp.n_vocab;
	const uint32_t E = c->m->hp.n_embd;
	float *hx = hyb_hdense_host_x(s->hd);

	uint32_t off = 0;
	int rc;

	if (hyb_hdense_kv_up(s->hd, c->kcache, c->vcache, c->n_past))
		return dev_err(s, "KV cache to the device");
	/* the batch's buffers are the neuron cache's last slots for the prompt */
	if (hyb_ffn_hybrid_prefill_borrow(s->h, s->err, s->errlen))
		return -1;
	while (off < n) {
		const uint32_t m = n - off < cap ? n - off : cap;
		const bool last = off + m == n;
		/* logits: every row's, or the prompt's last row's */
		const uint32_t first = all_logits ? 0 : last ? m - 1 : m;
		float *lg = logits + (all_logits ? (size_t)off * V : 0);

		hyb_fwd_embed(c, tokens + off, m);
		if (batch_layers(s, m))
			break;
		if (first < m && !hyb_hdense_head_on(s->hd)) {
			hyb_fwd_head(c, first, m, lg);
		} else {
			for (uint32_t t = first; t < m; t++) {
				memcpy(hx, c->x + (size_t)t * E, sizeof(float) * E);
				if (hyb_hdense_x_up(s->hd) ||
				    hyb_hdense_head(s->hd, lg + (size_t)(t - first) * V)) {
					dev_err(s, "head on the device");
					goto out;
				}
			}
		}
		c->n_past += m;
		off += m;
	}
out:
	/* the slots back to the cache, their groups reloading (a failure says so first) */
	rc = hyb_ffn_hybrid_prefill_return(s->h, off < n ? NULL : s->err, s->errlen);
	return off < n || rc ? -1 : 0;
}

/*
 * A short prompt, or no room for a batch: token after token on the device.
 */
static int prefill_tokens(struct step *sp, const int32_t *tokens, uint32_t n, float *logits,
			  bool all_logits)
{
	struct step s = *sp;
	struct hyb_ctx *c = s.c;
	char *err = s.err;
	size_t errlen = s.errlen;
	const struct hyb_hparams *hp = &c->m->hp;
	const uint32_t E = hp->n_embd, first = all_logits ? 0 : n - 1;
	float *hx = hyb_hdense_host_x(s.hd);
	float *ydev = malloc(sizeof(float) * n * E); /* the FFN's device rows */
	struct hyb_device_event *ev;
	int rc = -1;

	if (!ydev) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	hyb_fwd_embed(c, tokens, n);
	/* rows the CPU wrote earlier, for the placed layers */
	if (hyb_hdense_kv_up(s.hd, c->kcache, c->vcache, c->n_past)) {
		dev_err(&s, "KV cache to the device");
		goto out;
	}
	for (uint32_t l = 0; l < hp->n_layer; l++) {
		if (!hyb_hdense_layer_on(s.hd, l)) {
			hyb_fwd_attention(c, l, n);
		} else {
			for (uint32_t t = 0; t < n; t++) {
				float *x = c->x + (size_t)t * E;

				memcpy(hx, x, sizeof(float) * E);
				if (hyb_hdense_x_up(s.hd) ||
				    hyb_hdense_attention(s.hd, l, c->n_past + t) ||
				    hyb_hdense_x_down(s.hd, false, &ev) ||
				    hyb_device_sync(s.dev, ev)) {
					dev_err(&s, "prompt attention on the device");
					goto out;
				}
				memcpy(x, hx, sizeof(float) * E);
			}
		}
		/* as forward.c's batch: the last layer's FFN only for the rows that give logits */
		const uint32_t f0 = l + 1 == hp->n_layer && !all_logits && !c->probe ? n - 1 : 0;
		const uint32_t nf = n - f0;
		float *xf = c->x + (size_t)f0 * E;

		hyb_fwd_ffn_norm(c, l, xf, nf);
		/* the groups in the device cache there, the rest here (c->xn in place) */
		const uint8_t *skip = hyb_ffn_hybrid_prefill_split(s.h, l);

		if (skip && hyb_ffn_hybrid_prefill_ffn(s.h, l, c->xn, nf, ydev, err, errlen))
			goto out;
		hyb_fwd_ffn_dense_skip(c, l, nf, skip);
		if (skip)
			for (size_t i = 0; i < (size_t)nf * E; i++)
				c->xn[i] += ydev[i];
		hyb_fwd_post_norm(c, &c->m->layers[l].post_ffn_norm, c->xn, nf);
		for (size_t i = 0; i < (size_t)nf * E; i++)
			xf[i] += c->xn[i];
	}
	if (!hyb_hdense_head_on(s.hd)) {
		hyb_fwd_head(c, first, n, logits);
	} else {
		for (uint32_t t = first; t < n; t++) {
			memcpy(hx, c->x + (size_t)t * E, sizeof(float) * E);
			if (hyb_hdense_x_up(s.hd) ||
			    hyb_hdense_head(s.hd, logits + (size_t)(t - first) * hp->n_vocab)) {
				dev_err(&s, "head on the device");
				goto out;
			}
		}
	}
	c->n_past += n;
	rc = 0;
out:
	free(ydev);
	return rc;
}

/*
 * A prompt batch (prefill's dense parts on the device, as PowerInfer and
 * KAIROX do). Per layer: a placed attention block runs on the
 * device token after token (its KV rows land in the device cache, where
 * decoding reads them; each token's x goes up and comes back, waited for),
 * an unplaced one batched on the CPU; then the FFN of the whole batch dense
 * (long inputs activate nearly every neuron, PowerInfer 5.3), split as a
 * decode step splits it: the groups in the device cache on the device, row
 * after row, the others as one batch on the CPU. ffn_norm is taken on the
 * host from the x that came back. In oracle mode the FFN stays whole on the
 * CPU and the arithmetic is the CPU batch's (the device's ops give
 * forward.c's bits on the CPU device).
 */
int hyb_prefill_hybrid(struct hyb_ctx *c, const int32_t *tokens, uint32_t n, float *logits,
		       bool all_logits, char *err, size_t errlen)
{
	struct step s = {
		.c = c, .h = c->hybrid, .hd = hyb_ffn_hybrid_dense(c->hybrid),
		.dev = hyb_ffn_hybrid_device(c->hybrid), .where = X_HOST,
		.err = err, .errlen = errlen,
	};

	if (n >= PREFILL_BATCH_MIN && hyb_ffn_hybrid_prefill_batch_cap(s.h))
		return prefill_batched(&s, tokens, n, logits, all_logits);

	return prefill_tokens(&s, tokens, n, logits, all_logits);
}

int hyb_decode_hybrid_kv_to_host(struct hyb_ctx *c, char *err, size_t errlen)
{
	struct hyb_hdense *hd = hyb_ffn_hybrid_dense(c->hybrid);

	if (hd && hyb_hdense_kv_down(hd, c->kcache, c->vcache, c->n_past)) {
		snprintf(err, errlen, "KV cache from the device: %s",
			 hyb_device_error(hyb_ffn_hybrid_device(c->hybrid)));
		return -1;
	}
	return 0;
}

void hyb_decode_hybrid_kv_host_wrote(struct hyb_ctx *c)
{
	hyb_hdense_kv_host_wrote(hyb_ffn_hybrid_dense(c->hybrid), c->n_past);
}

void hyb_decode_hybrid_reset(struct hyb_ctx *c)
{
	hyb_hdense_kv_reset(hyb_ffn_hybrid_dense(c->hybrid));
}
