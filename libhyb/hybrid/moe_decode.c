// SPDX-License-Identifier: MIT
/*
 * A decode step of a MoE model whose expert cache also holds the dense
 * parts (moe_hybrid.h; docs/MOE.md, "The expert cache"). Per layer:
 *
 *   attention  on the device when placed (dense.c): x goes up, the block
 *              and the layer's router (when placed) run on COMPUTE, x,
 *              ffn_norm(x) and the router's logits come down on CRITICAL -
 *              the CPU's routing and experts need them, and the device's
 *              experts read xn where it is; otherwise on the CPU
 *              (forward.c's code);
 *   FFN        on the host: moe.c, whose expert cache sends the resident
 *              experts to the device; the residual add here;
 *   head       on the device when placed, else on the CPU.
 *
 * The residual stream is the host's between layers: the merge is moe.c's
 * weighted sum, so on the CPU device, which runs the CPU's code, the step
 * gives the CPU-only decode's bits. Prompts run on the CPU; the KV rows each
 * side lacks are copied as dense.c's watermarks say.
 */
#include <stdio.h>
#include <string.h>

#include "dense.h"
#include "forward/forward_internal.h"
#include "forward/moe.h"
#include "moe_graph.h"
#include "moe_hybrid.h"
#include "util/error.h"

static int dev_err(struct hyb_device *d, char *err, size_t errlen, const char *what)
{
	snprintf(err, errlen, "%s: %s", what, hyb_device_error(d));
	return -1;
}

/* Layer l's attention block on the device: c->x in, c->x and c->xn out. */
static int attention_dev(struct hyb_ctx *c, struct hyb_hdense *hd, struct hyb_device *d,
			 uint32_t l, char *err, size_t errlen)
{
	const uint32_t E = c->m->hp.n_embd;
	float *hx = hyb_hdense_host_x(hd);
	struct hyb_device_event *ev;

	memcpy(hx, c->x, sizeof(float) * E);
	/* the router right after the block's ffn_norm: its logits follow x down */
	if (hyb_hdense_x_up(hd) || hyb_hdense_attention(hd, l, c->n_past) ||
	    hyb_moe_hybrid_router_queue(c->moe_hybrid, l) < 0 ||
	    hyb_hdense_x_down(hd, true, &ev) || hyb_moe_hybrid_router_down(c->moe_hybrid))
		return dev_err(d, err, errlen, "attention on the device");
	/* the layer before's deferred experts, while the device runs this attention */
	hyb_fwd_moe_deferred(c);
	if (hyb_device_sync(d, ev))
		return dev_err(d, err, errlen, "attention on the device");
	memcpy(c->x, hx, sizeof(float) * E);
	memcpy(c->xn, hx + E, sizeof(float) * E);
	return 0;
}

int hyb_moe_decode_ffn(struct hyb_ctx *c, uint32_t l, char *err, size_t errlen)
{
	const struct hyb_hparams *hp = &c->m->hp;
	const uint32_t E = hp->n_embd;

	if (l >= hp->n_dense_lead) {
		if (hyb_fwd_ffn_moe(c, l, 1)) {
			snprintf(err, errlen, "%s", hyb_last_error());
			return -1;
		}
	} else {
		hyb_fwd_ffn_dense(c, l, 1);
	}
	hyb_fwd_post_norm(c, &c->m->layers[l].post_ffn_norm, c->xn, 1);
	for (uint32_t i = 0; i < E; i++)
		c->x[i] += c->xn[i];
	return 0;
}

int hyb_moe_decode_hybrid(struct hyb_ctx *c, int32_t token, float *logits, char *err,
			  size_t errlen)
{
	struct hyb_hdense *hd = hyb_moe_hybrid_dense(c->moe_hybrid);
	struct hyb_device *d = hyb_moe_hybrid_device(c->moe_hybrid);
	const struct hyb_hparams *hp = &c->m->hp;
	double t0, attn_s = 0, head_s;

	if (hyb_moe_hybrid_graph_wanted(c->moe_hybrid)) {
		struct hyb_moe_graph *g = hyb_moe_hybrid_graph(c->moe_hybrid);
		char why[160];

		if (!g && !(g = hyb_moe_graph_new(c, why, sizeof(why))))
			hyb_moe_hybrid_graph_off(c->moe_hybrid, why);
		if (g) {
			if (!hyb_moe_graph_step(g, token, logits, err, errlen))
				return 0;
			/* the context goes on without graphs; this step fails */
			hyb_moe_hybrid_graph_off(c->moe_hybrid, err);
			return -1;
		}
	}
	hyb_fwd_embed(c, &token, 1);
	/* the prompt's rows (processed on the CPU) for the layers on the device */
	if (hyb_hdense_kv_up(hd, c->kcache, c->vcache, c->n_past))
		return dev_err(d, err, errlen, "KV cache to the device");
	for (uint32_t l = 0; l < hp->n_layer; l++) {
		t0 = hyb_device_now(d);
		if (hyb_hdense_layer_on(hd, l)) {
			if (attention_dev(c, hd, d, l, err, errlen))
				return -1;
		} else {
			hyb_fwd_attention(c, l, 1);
			hyb_fwd_ffn_norm(c, l, c->x, 1);
		}
		attn_s += hyb_device_now(d) - t0;
		hyb_moe_hybrid_xn_on_device(c->moe_hybrid, hyb_hdense_layer_on(hd, l));
		const int rc = hyb_moe_decode_ffn(c, l, err, errlen);

		hyb_moe_hybrid_xn_on_device(c->moe_hybrid, false);
		if (rc)
			return -1;
	}
	t0 = hyb_device_now(d);
	if (hyb_hdense_head_on(hd)) {
		memcpy(hyb_hdense_host_x(hd), c->x, sizeof(float) * hp->n_embd);
		if (hyb_hdense_x_up(hd) || hyb_hdense_head(hd, logits))
			return dev_err(d, err, errlen, "head on the device");
	} else {
		hyb_fwd_head(c, 0, 1, logits);
	}
	head_s = hyb_device_now(d) - t0;
	hyb_moe_hybrid_add_dense_time(c->moe_hybrid, attn_s, head_s);
	c->n_past++;
	return 0;
}

int hyb_moe_decode_kv_to_host(struct hyb_ctx *c, char *err, size_t errlen)
{
	struct hyb_hdense *hd = hyb_moe_hybrid_dense(c->moe_hybrid);

	if (hd && hyb_hdense_kv_down(hd, c->kcache, c->vcache, c->n_past))
		return dev_err(hyb_moe_hybrid_device(c->moe_hybrid), err, errlen,
			       "KV cache from the device");
	return 0;
}

void hyb_moe_decode_kv_host_wrote(struct hyb_ctx *c)
{
	struct hyb_hdense *hd = hyb_moe_hybrid_dense(c->moe_hybrid);

	if (hd)
		hyb_hdense_kv_host_wrote(hd, c->n_past);
}

void hyb_moe_decode_reset(struct hyb_ctx *c)
{
	struct hyb_hdense *hd = hyb_moe_hybrid_dense(c->moe_hybrid);

	if (hd)
		hyb_hdense_kv_reset(hd);
}
