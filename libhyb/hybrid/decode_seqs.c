// SPDX-License-Identifier: MIT
/*
 * A pass of several sequences through a hybrid context (hybrid/decode.h,
 * docs/HYBRID.md "Several sequences"): continuous batching's step, the
 * device running the batch's linear parts once for every row, as APEX
 * (Fan et al., "Parallel CPU-GPU Execution for LLM Inference on
 * Constrained GPUs", section 3) runs its unified batch. Per layer:
 *
 *   attention  placed on the device: attn_norm and q/k/v of all rows
 *              there; the sequences holding a device KV slot attend there,
 *              the others' q/k/v come down and attend on the CPU over the
 *              KV cache in DRAM meanwhile (APEX's CPU requests), their
 *              outputs go back up; wo and ffn_norm of all rows on the
 *              device. Not placed: the CPU's block for every row;
 *   FFN        split by the neuron cache as a prompt batch's is (PowerInfer
 *              5.3 runs batches dense): the cached groups' share over all
 *              rows on the device, the rest on the CPU at the same time,
 *              merged on the host;
 *   head       for the rows that give logits, where it was placed.
 *
 * A CPU request's attention finishes within its layer: APEX defers its
 * return to the next iteration so a slow CPU never stalls the GPU, at the
 * price of CPU requests advancing a layer per iteration; here the CPU's
 * share of the FFN already waits for the attention's rows, so the layer's
 * sync costs what the CPU attention costs beyond the device's attention.
 * Every step's cache placement is the one the balancer left: the policies
 * act on one sequence's decode steps.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decode.h"
#include "dense.h"
#include "ffn_hybrid.h"
#include "forward/forward_internal.h"

struct pass {
	struct hyb_ctx *c;
	struct hyb_ffn_hybrid *h;
	struct hyb_hdense *hd;
	struct hyb_device *dev;
	struct hyb_device_event *ev;
	struct hyb_hdense_batch b;
	hyb_dptr y;
	const struct hyb_fwd_run *runs;  /* the pass's */
	uint32_t n_runs;
	struct hyb_fwd_run *cpu;         /* of those, the ones attending on the CPU */
	uint32_t n_cpu, cpu_rows;
	float *ydev;                     /* [n][n_embd] the device's FFN share */
	uint64_t dev_rows, host_rows;
	double cpu_attn_s;
	char *err;
	size_t errlen;
};

static int dev_err(struct pass *p, const char *what)
{
	snprintf(p->err, p->errlen, "%s: %s", what, hyb_device_error(p->dev));
	return -1;
}

/* COMPUTE's work so far before CRITICAL's next copy */
static int critical_after_compute(struct pass *p)
{
	return hyb_device_record(p->dev, HYB_STREAM_COMPUTE, p->ev) ||
	       hyb_device_wait(p->dev, HYB_STREAM_CRITICAL, p->ev);
}

/* CRITICAL's copies so far: waited for by the host (sync) or by COMPUTE */
static int critical_done(struct pass *p, bool host)
{
	return hyb_device_record(p->dev, HYB_STREAM_CRITICAL, p->ev) ||
	       (host ? hyb_device_sync(p->dev, p->ev)
		     : hyb_device_wait(p->dev, HYB_STREAM_COMPUTE, p->ev));
}

/* rows [t0, t0 + n) of width floats between host and device on CRITICAL */
static int rows_copy(struct pass *p, bool up, float *host, hyb_dptr dev, uint32_t t0,
		     uint32_t n, uint32_t width)
{
	const uint64_t off = 4ull * t0 * width, bytes = 4ull * n * width;

	return up ? hyb_device_h2d(p->dev, HYB_STREAM_CRITICAL, dev + off, host + off / 4, bytes)
		  : hyb_device_d2h(p->dev, HYB_STREAM_CRITICAL, host + off / 4, dev + off, bytes);
}

/*
 * The CPU's sequences of a placed layer: their q/k/v rows come down, the
 * CPU attends over their paged KV cache, the outputs go back up - while
 * the device attends for its own.
 */
static int cpu_attention(struct pass *p, uint32_t l, uint32_t n)
{
	struct hyb_ctx *c = p->c;
	double t0;

	for (uint32_t i = 0; i < p->n_cpu; i++) {
		const struct hyb_fwd_run *r = &p->cpu[i];

		if (rows_copy(p, false, c->q, p->b.q, r->t0, r->n, c->q_dim) ||
		    rows_copy(p, false, c->kk, p->b.k, r->t0, r->n, c->kv_dim) ||
		    rows_copy(p, false, c->vv, p->b.v, r->t0, r->n, c->kv_dim))
			return -1;
	}
	if (hyb_device_record(p->dev, HYB_STREAM_CRITICAL, p->ev))
		return -1;
	/* the device's sequences: queued behind the copies' source, run while the CPU works */
	for (uint32_t i = 0; i < p->n_runs; i++) {
		const struct hyb_fwd_run *r = &p->runs[i];
		const int slot = hyb_ffn_hybrid_seq_slot(p->h, r->seq);

		if (slot >= 0 &&
		    hyb_hdense_attend_batch(p->hd, l, (uint32_t)slot, r->pos, r->t0, r->n, &p->b))
			return -1;
	}
	if (!p->n_cpu)
		return 0;
	if (hyb_device_sync(p->dev, p->ev))
		return -1;
	t0 = hyb_device_now(p->dev);
	c->runs = p->cpu;
	c->n_runs = p->n_cpu;
	hyb_fwd_attention_core(c, l, n);
	c->runs = p->runs;
	c->n_runs = p->n_runs;
	p->cpu_attn_s += hyb_device_now(p->dev) - t0;
	for (uint32_t i = 0; i < p->n_cpu; i++)
		if (rows_copy(p, true, c->att, p->b.att, p->cpu[i].t0, p->cpu[i].n, c->q_dim))
			return -1;
	return critical_done(p, false);
}

/* Layer l's attention block of the n rows of c->x; c->x and c->xn = ffn_norm(x) after. */
static int attention(struct pass *p, uint32_t l, uint32_t n)
{
	struct hyb_ctx *c = p->c;
	const uint32_t E = c->m->hp.n_embd;

	if (!hyb_hdense_layer_on(p->hd, l)) {
		hyb_fwd_attention(c, l, n);
		hyb_fwd_ffn_norm(c, l, c->x, n);
		return 0;
	}
	if (rows_copy(p, true, c->x, p->b.x, 0, n, E) || critical_done(p, false) ||
	    hyb_hdense_qkv_batch(p->hd, l, n, &p->b))
		return dev_err(p, "the pass's attention on the device");
	if ((p->n_cpu && critical_after_compute(p)) || cpu_attention(p, l, n))
		return dev_err(p, "the pass's attention");
	if (hyb_hdense_out_batch(p->hd, l, n, &p->b) || critical_after_compute(p) ||
	    rows_copy(p, false, c->x, p->b.x, 0, n, E) ||
	    rows_copy(p, false, c->xn, p->b.xn, 0, n, E) || critical_done(p, true))
		return dev_err(p, "the pass's attention on the device");
	p->dev_rows += n - p->cpu_rows;
	p->host_rows += p->cpu_rows;
	return 0;
}

/*
 * Layer l's FFN of the n rows: the cached groups' share on the device (its
 * xn there already, or sent up), the rest on the CPU meanwhile (c->xn in
 * place), x += both, in the order a prompt batch adds them (decode.c).
 */
static int ffn(struct pass *p, uint32_t l, uint32_t n, bool xn_on_dev)
{
	struct hyb_ctx *c = p->c;
	const uint32_t E = c->m->hp.n_embd;
	const uint8_t *skip = hyb_ffn_hybrid_prefill_split(p->h, l);

	if (skip) {
		if (!xn_on_dev && (rows_copy(p, true, c->xn, p->b.xn, 0, n, E) ||
				   critical_done(p, false)))
			return dev_err(p, "the pass's FFN input to the device");
		if (hyb_ffn_hybrid_seq_ffn(p->h, l, n, p->err, p->errlen))
			return -1;
		if (critical_after_compute(p) || rows_copy(p, false, p->ydev, p->y, 0, n, E) ||
		    hyb_device_record(p->dev, HYB_STREAM_CRITICAL, p->ev))
			return dev_err(p, "the pass's FFN on the device");
	}
	hyb_fwd_ffn_dense_skip(c, l, n, skip);
	if (skip && hyb_device_sync(p->dev, p->ev))
		return dev_err(p, "the pass's FFN on the device");
	for (size_t i = 0; i < (size_t)n * E; i++)
		c->x[i] += skip ? c->xn[i] + p->ydev[i] : c->xn[i];
	return 0;
}

static int head(struct pass *p, const uint32_t *out, uint32_t n_out, float *logits)
{
	struct hyb_ctx *c = p->c;
	const uint32_t E = c->m->hp.n_embd, V = c->m->hp.n_vocab;
	float *hx = hyb_hdense_host_x(p->hd);

	hyb_fwd_gather(c, out, n_out);
	if (!hyb_hdense_head_on(p->hd)) {
		hyb_fwd_head(c, 0, n_out, logits);
		return 0;
	}
	for (uint32_t i = 0; i < n_out; i++) {
		memcpy(hx, c->x + (size_t)i * E, sizeof(float) * E);
		if (hyb_hdense_x_up(p->hd) || hyb_hdense_head(p->hd, logits + (size_t)i * V))
			return dev_err(p, "head on the device");
	}
	return 0;
}

int hyb_decode_hybrid_runs(struct hyb_ctx *c, const int32_t *tokens, uint32_t n,
			   const uint32_t *out, uint32_t n_out, float *logits, char *err,
			   size_t errlen)
{
	struct hyb_ffn_hybrid *h = c->hybrid;
	struct pass p = {
		.c = c, .h = h, .hd = hyb_ffn_hybrid_dense(h), .dev = hyb_ffn_hybrid_device(h),
		.runs = c->runs, .n_runs = c->n_runs,
		.err = err, .errlen = errlen,
	};
	int rc = -1;

	hyb_ffn_hybrid_seq_bufs(h, &p.b, &p.y, &p.ev);
	p.cpu = malloc(sizeof(*p.cpu) * (p.n_runs ? p.n_runs : 1));
	p.ydev = malloc(sizeof(float) * n * c->m->hp.n_embd);
	if (!p.cpu || !p.ydev) {
		snprintf(err, errlen, "out of memory");
		goto out;
	}
	for (uint32_t i = 0; i < p.n_runs; i++)
		if (hyb_ffn_hybrid_seq_slot(h, p.runs[i].seq) < 0) {
			p.cpu[p.n_cpu++] = p.runs[i];
			p.cpu_rows += p.runs[i].n;
		}
	hyb_fwd_embed(c, tokens, n);
	for (uint32_t l = 0; l < c->m->hp.n_layer; l++) {
		if (attention(&p, l, n) || ffn(&p, l, n, hyb_hdense_layer_on(p.hd, l)))
			goto out;
	}
	if (n_out && head(&p, out, n_out, logits))
		goto out;
	hyb_ffn_hybrid_seq_stats(h, n, p.dev_rows, p.host_rows, p.cpu_attn_s);
	rc = 0;
out:
	free(p.cpu);
	free(p.ydev);
	return rc;
}
