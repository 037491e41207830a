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
 *              its output comes down behind x, one wait for both; otherwise
 *              on the CPU (forward.c: TEAL's thresholds apply there);
 *   residual   on the host: the norm after the FFN (Gemma) and x += ffn.
 *
 * On the CPU device, which runs the CPU's kernels, the step gives the
 * CPU-only decode's bits (no thresholds). Prompts run on the CPU; the KV
 * rows each side lacks are copied as dense.c's watermarks say.
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

/*
 * Layer l on the device's side where placed: c->x in; c->x and c->xn out,
 * c->xn being ffn_norm(x) for the CPU's FFN or the device's FFN output.
 * *ffn_done: the FFN ran there.
 */
static int layer_dev(struct hyb_ctx *c, struct hyb_hdense *hd, uint32_t l, bool *ffn_done,
		     char *err, size_t errlen)
{
	struct hyb_plain_hybrid *h = c->plain_hybrid;
	const uint32_t E = c->m->hp.n_embd;
	const bool ffn = hyb_plain_hybrid_ffn_on(h, l);
	float *hx = hyb_hdense_host_x(hd);
	struct hyb_device_event *ev;

	memcpy(hx, c->x, sizeof(float) * E);
	if (hyb_hdense_x_up(hd) || hyb_hdense_attention(hd, l, c->n_past) ||
	    (ffn && hyb_plain_hybrid_ffn_queue(h, l, NULL)) ||
	    hyb_hdense_x_down(hd, !ffn, &ev))
		return dev_err(c, err, errlen, "layer on the device");
	if (ffn ? hyb_plain_hybrid_ffn_out(h, c->xn) : hyb_device_sync(
			  hyb_plain_hybrid_device(h), ev))
		return dev_err(c, err, errlen, "layer on the device");
	memcpy(c->x, hx, sizeof(float) * E);
	if (!ffn)
		memcpy(c->xn, hx + E, sizeof(float) * E);
	*ffn_done = ffn;
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

	hyb_fwd_embed(c, &token, 1);
	/* the prompt's rows (processed on the CPU) for the layers on the device */
	if (hd && hyb_hdense_kv_up(hd, c->kcache, c->vcache, c->n_past))
		return dev_err(c, err, errlen, "KV cache to the device");
	for (uint32_t l = 0; l < hp->n_layer; l++) {
		bool done = false;

		t0 = hyb_device_now(d);
		if (hd && hyb_hdense_layer_on(hd, l)) {
			if (layer_dev(c, hd, l, &done, err, errlen))
				return -1;
		} else {
			hyb_fwd_attention(c, l, 1);
			hyb_fwd_ffn_norm(c, l, c->x, 1);
		}
		t1 = hyb_device_now(d);
		attn_s += t1 - t0;
		if (!done && hyb_plain_hybrid_ffn_on(h, l)) {
			if (hyb_plain_hybrid_ffn_queue(h, l, c->xn) ||
			    hyb_plain_hybrid_ffn_out(h, c->xn))
				return dev_err(c, err, errlen, "FFN on the device");
		} else if (!done) {
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
		memcpy(hyb_hdense_host_x(hd), c->x, sizeof(float) * E);
		if (hyb_hdense_x_up(hd) || hyb_hdense_head(hd, logits))
			return dev_err(c, err, errlen, "head on the device");
	} else {
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
