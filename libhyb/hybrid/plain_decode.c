// SPDX-License-Identifier: MIT
/*
 * A decode step of a plain model split between a device and the CPU
 * (plain_hybrid.h; docs/HYBRID.md "Plain models"). Per layer:
 *
 *   attention  on the device when placed (dense.c): x goes up, the block
 *              runs on COMPUTE, x (and ffn_norm(x) when the CPU needs it)
 *              come down on CRITICAL; otherwise on the CPU (forward.c);
 *   FFN        on the device when placed: over the device's ffn_norm(x)
 *              when the attention ran there, else over the CPU's, sent up;
 *              otherwise on the CPU (forward.c: TEAL's thresholds apply);
 *   residual   on the device while layers run there whole (x += ffn there,
 *              Gemma's norm after the FFN too; the next block reads it: no
 *              copy, no wait between them, as the plan's engine keeps it,
 *              docs/HYBRID.md); else on the host, x and the device FFN's
 *              output coming down in one wait.
 *
 * On the CPU device, which runs the CPU's kernels, the step gives the
 * CPU-only decode's bits (no thresholds). Prompts: plain_prefill.c, or the
 * CPU's pass; the KV rows each side lacks are copied as dense.c's
 * watermarks say.
 */
#include <stdio.h>
#include <string.h>

#include "dense.h"
#include "forward/forward_internal.h"
#include "plain_hybrid.h"

static int dev_err(struct hyb_ctx *c, char *err, size_t errlen, const char *what)
{
	snprintf(err, errlen, "%s: %s", what,
		 hyb_device_error(hyb_plain_hybrid_device(c->plain_hybrid)));
	return -1;
}

/* The residual stream's device copy down to c->x (it was the latest). */
static int x_to_host(struct hyb_ctx *c, struct hyb_hdense *hd)
{
	struct hyb_device_event *ev;

	if (hyb_hdense_x_down(hd, false, &ev) ||
	    hyb_device_sync(hyb_plain_hybrid_device(c->plain_hybrid), ev))
		return -1;
	memcpy(c->x, hyb_hdense_host_x(hd), sizeof(float) * c->m->hp.n_embd);
	return 0;
}

/*
 * Layer l's attention block on the device, and its FFN when placed there:
 * x comes from the host unless *on_dev (the device's copy is the latest).
 * With the FFN there too, x += ffn on the device and x stays there
 * (*on_dev); otherwise x and ffn_norm(x) come down in one wait.
 */
static int layer_dev(struct hyb_ctx *c, struct hyb_hdense *hd, uint32_t l, bool *on_dev,
		     char *err, size_t errlen)
{
	struct hyb_plain_hybrid *h = c->plain_hybrid;
	const uint32_t E = c->m->hp.n_embd;
	const bool ffn = hyb_plain_hybrid_ffn_on(h, l);
	float *hx = hyb_hdense_host_x(hd);
	struct hyb_device_event *ev;

	if (!*on_dev) {
		memcpy(hx, c->x, sizeof(float) * E);
		if (hyb_hdense_x_up(hd))
			return dev_err(c, err, errlen, "layer on the device");
	}
	if (hyb_hdense_attention(hd, l, c->n_past) ||
	    (ffn && hyb_plain_hybrid_ffn_queue(h, l, NULL)))
		return dev_err(c, err, errlen, "layer on the device");
	*on_dev = ffn;
	if (ffn)
		return hyb_plain_hybrid_ffn_add(h, hyb_hdense_x(hd)) ?
			       dev_err(c, err, errlen, "layer on the device") : 0;
	if (hyb_hdense_x_down(hd, true, &ev) || hyb_device_sync(hyb_plain_hybrid_device(h), ev))
		return dev_err(c, err, errlen, "layer on the device");
	memcpy(c->x, hx, sizeof(float) * E);
	memcpy(c->xn, hx + E, sizeof(float) * E);
	return 0;
}

int hyb_plain_decode(struct hyb_ctx *c, int32_t token, float *logits, char *err, size_t errlen)
{
	struct hyb_plain_hybrid *h = c->plain_hybrid;
	struct hyb_hdense *hd = hyb_plain_hybrid_dense(h);
	struct hyb_device *d = hyb_plain_hybrid_device(h);
	const struct hyb_hparams *hp = &c->m->hp;
	const uint32_t E = hp->n_embd;
	double t0, t1, attn_s = 0, ffn_s = 0, cpu_s = 0, head_s;
	bool on_dev = false; /* the residual stream's latest copy is the device's */

	hyb_fwd_embed(c, &token, 1);
	/* the prompt's rows (processed on the CPU) for the layers on the device */
	if (hd && hyb_hdense_kv_up(hd, c->kcache, c->vcache, c->n_past))
		return dev_err(c, err, errlen, "KV cache to the device");
	for (uint32_t l = 0; l < hp->n_layer; l++) {
		t0 = hyb_device_now(d);
		if (hd && hyb_hdense_layer_on(hd, l)) {
			if (layer_dev(c, hd, l, &on_dev, err, errlen))
				return -1;
		} else {
			if (on_dev && x_to_host(c, hd))
				return dev_err(c, err, errlen, "x from the device");
			on_dev = false;
			hyb_fwd_attention(c, l, 1);
			hyb_fwd_ffn_norm(c, l, c->x, 1);
		}
		t1 = hyb_device_now(d);
		attn_s += t1 - t0;
		if (on_dev)
			continue; /* x += ffn happened on the device */
		if (hyb_plain_hybrid_ffn_on(h, l)) {
			if (hyb_plain_hybrid_ffn_queue(h, l, c->xn) ||
			    hyb_plain_hybrid_ffn_out(h, c->xn))
				return dev_err(c, err, errlen, "FFN on the device");
		} else {
			hyb_fwd_ffn_dense(c, l, 1);
			cpu_s += hyb_device_now(d) - t1;
		}
		hyb_fwd_post_norm(c, &c->m->layers[l].post_ffn_norm, c->xn, 1);
		for (uint32_t i = 0; i < E; i++)
			c->x[i] += c->xn[i];
		ffn_s += hyb_device_now(d) - t1;
	}
	t0 = hyb_device_now(d);
	if (hd && hyb_hdense_head_on(hd)) {
		if (!on_dev) {
			memcpy(hyb_hdense_host_x(hd), c->x, sizeof(float) * E);
			if (hyb_hdense_x_up(hd))
				return dev_err(c, err, errlen, "head on the device");
		}
		if (hyb_hdense_head(hd, logits))
			return dev_err(c, err, errlen, "head on the device");
	} else {
		if (on_dev && x_to_host(c, hd))
			return dev_err(c, err, errlen, "x from the device");
		hyb_fwd_head(c, 0, 1, logits);
	}
	head_s = hyb_device_now(d) - t0;
	hyb_plain_hybrid_add_time(h, attn_s, ffn_s, cpu_s, head_s);
	c->n_past++;
	return 0;
}

int hyb_plain_decode_kv_to_host(struct hyb_ctx *c, char *err, size_t errlen)
{
	struct hyb_hdense *hd = hyb_plain_hybrid_dense(c->plain_hybrid);

	if (hd && hyb_hdense_kv_down(hd, c->kcache, c->vcache, c->n_past))
		return dev_err(c, err, errlen, "KV cache from the device");
	return 0;
}

void hyb_plain_decode_kv_host_wrote(struct hyb_ctx *c)
{
	struct hyb_hdense *hd = hyb_plain_hybrid_dense(c->plain_hybrid);

	if (hd)
		hyb_hdense_kv_host_wrote(hd, c->n_past);
}

void hyb_plain_decode_reset(struct hyb_ctx *c)
{
	struct hyb_hdense *hd = hyb_plain_hybrid_dense(c->plain_hybrid);

	if (hd)
		hyb_hdense_kv_reset(hd);
}
