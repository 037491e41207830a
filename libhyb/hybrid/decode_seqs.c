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
 *   FFN        split by the neuron cache: every cached group over all rows
 *              on the device (one batched kernel), the rest on the CPU at
 *              the same time - a decoded token's predicted neurons through
 *              the sparse operator as one sequence's step computes them
 *              (the predictors run for every row on the device), a prompt
 *              piece's rows dense (PowerInfer 5.3) - merged on the host;
 *   head       for the rows that give logits, where it was placed.
 *
 * A CPU request's attention finishes within its layer: APEX defers its
 * return to the next iteration so a slow CPU never stalls the GPU, at the
 * price of CPU requests advancing a layer per iteration; here the CPU's
 * share of the FFN already waits for the attention's rows, so the layer's
 * sync costs what the CPU attention costs beyond the device's attention.
 * Every step's cache placement is the one the balancer left: the policies
 * act on one sequence's decode steps. A row's sums depend on its own
 * tokens, predictions and the cache alone, never on the other rows (batch
 * invariance); a batch's rows share one read of each weight on the device,
 * not on the CPU, whose sparse rows would each need other neurons: a CPU
 * with cores to spare could run them as one GEMM over the union instead.
 */
#include <stdint.h>
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
	struct hyb_device_event *const *prof;  /* timed: the layer's profile */
	struct hyb_hdense_batch b;
	hyb_dptr y;
	const struct hyb_fwd_run *runs;  /* the pass's */
	uint32_t n_runs;
	struct hyb_fwd_run *cpu;         /* of those, the ones attending on the CPU */
	uint32_t n_cpu, cpu_rows;
	float *ydev;                     /* [n][n_embd] the device's FFN share */
	float *ycpu;                     /* [n][n_embd] the CPU's, of decoded tokens' rows */
	int pred_layer[2];               /* the layer whose predictions each slot holds, or -1 */
	uint8_t *row_dense;              /* [n] rows of prompt pieces: every group */
	uint8_t *need;                   /* [n][n_groups] the rows of prompt pieces: all */
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

/* Timed event i of the layer's profile recorded on COMPUTE. */
static int mark(struct pass *p, int i)
{
	return hyb_device_record(p->dev, HYB_STREAM_COMPUTE, p->prof[i]);
}

/* Device seconds between profile events a and b (both done): 0, or nonzero. */
static int elapsed(struct pass *p, int a, int b, double *s)
{
	return hyb_device_elapsed(p->dev, p->prof[a], p->prof[b], s);
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
	if (mark(p, 2))
		return -1;
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

/*
 * The predictors that read layer l's attention output (hyb_hdense_pred_source:
 * layer l + 1's, or layer l's own for layer 0 and same-layer models), over
 * every row, queued on COMPUTE; pred_layer[j & 1] = j for their copy down.
 */
static int predict(struct pass *p, uint32_t l, uint32_t n)
{
	const struct hyb_model *m = p->c->m;
	const bool same = m->pred_input == HYB_PRED_SAME_LAYER;
	const uint32_t want[2] = { (same || l == 0) ? l : UINT32_MAX,
				   !same && l + 1 < m->hp.n_layer ? l + 1 : UINT32_MAX };

	for (int i = 0; i < 2; i++) {
		const uint32_t j = want[i];
		hyb_dptr dev;
		uint32_t *host;

		if (j == UINT32_MAX || !hyb_hdense_pred_on(p->hd, j) ||
		    !hyb_ffn_hybrid_seq_preds(p->h, (int)(j & 1), &dev, &host))
			continue;
		if (hyb_hdense_predict_rows(p->hd, j, p->b.x, n, dev))
			return -1;
		p->pred_layer[j & 1] = (int)j;
	}
	return 0;
}

/* The predictions just queued, down on CRITICAL (the caller waits). */
static int preds_down(struct pass *p, uint32_t n)
{
	const uint32_t F = p->c->m->hp.n_ff;

	for (int i = 0; i < 2; i++) {
		hyb_dptr dev;
		uint32_t *host;

		if (p->pred_layer[i] < 0 || !hyb_ffn_hybrid_seq_preds(p->h, i, &dev, &host))
			continue;
		if (hyb_device_d2h(p->dev, HYB_STREAM_CRITICAL, host, dev, 4ull * n * (1ull + F)))
			return -1;
	}
	return 0;
}

/* Layer l's predictions on the host, row after row (1 + n_ff words each); NULL: none. */
static const uint32_t *layer_preds(struct pass *p, uint32_t l)
{
	hyb_dptr dev;
	uint32_t *host;

	if (p->pred_layer[l & 1] != (int)l ||
	    !hyb_ffn_hybrid_seq_preds(p->h, (int)(l & 1), &dev, &host))
		return NULL;
	return host;
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
	    mark(p, 0) || hyb_hdense_qkv_batch(p->hd, l, n, &p->b) || mark(p, 1))
		return dev_err(p, "the pass's attention on the device");
	if ((p->n_cpu && critical_after_compute(p)) || cpu_attention(p, l, n) || mark(p, 3))
		return dev_err(p, "the pass's attention");
	if (hyb_hdense_out_batch(p->hd, l, n, &p->b) || mark(p, 4) || predict(p, l, n) ||
	    critical_after_compute(p) || rows_copy(p, false, c->x, p->b.x, 0, n, E) ||
	    rows_copy(p, false, c->xn, p->b.xn, 0, n, E) || preds_down(p, n) ||
	    critical_done(p, true))
		return dev_err(p, "the pass's attention on the device");
	p->dev_rows += n - p->cpu_rows;
	p->host_rows += p->cpu_rows;
	/* APEX's T_glinear and T_gatt of this layer (section 3.2), by the device's clock */
	{
		double qkv, att, out;

		if (!elapsed(p, 0, 1, &qkv) && !elapsed(p, 1, 2, &att) && !elapsed(p, 3, 4, &out))
			hyb_ffn_hybrid_seq_profile(p->h, qkv + out, att, 1);
	}
	return 0;
}

/*
 * The CPU's share of layer l's FFN. With predictions for the layer, each
 * decoded token's as one sequence's step computes it (the sparse operator
 * over its predicted neurons, hyb_ffn_hybrid_seq_cpu_rows) into p->ycpu,
 * and the rows of prompt pieces dense (PowerInfer 5.3) in c->xn, the
 * others' zero there; without, every row dense in c->xn. Returns whether
 * the rows went sparse.
 */
static int cpu_share(struct pass *p, uint32_t l, uint32_t n, const uint8_t *skip, bool *sparse)
{
	struct hyb_ctx *c = p->c;
	const uint32_t NG = c->m->n_groups;
	const uint32_t *preds = layer_preds(p, l);
	uint32_t n_dense = 0;
	uint64_t all = 0, cpu = 0;

	*sparse = preds != NULL;
	if (!preds) {
		hyb_fwd_ffn_dense_rows(c, l, n, skip, NULL);
		for (uint32_t g = 0; g < NG; g++)
			all += skip && skip[g] ? 0 : n;
		hyb_ffn_hybrid_seq_groups(p->h, all, all);
		return 0;
	}
	for (uint32_t t = 0; t < n; t++) {
		n_dense += p->row_dense[t];
		memset(p->need + (size_t)t * NG, p->row_dense[t], NG);
	}
	if (n_dense < n &&
	    hyb_ffn_hybrid_seq_cpu_rows(p->h, c->pool, l, c->xn, n, preds, p->row_dense, skip,
					p->ycpu, p->err, p->errlen))
		return -1;
	if (n_dense) {
		hyb_fwd_ffn_dense_rows(c, l, n, skip, p->need);
		for (uint32_t g = 0; g < NG; g++)
			cpu += skip && skip[g] ? 0 : n_dense;
		hyb_ffn_hybrid_seq_groups(p->h, cpu, cpu);
	}
	return 0;
}

/*
 * Layer l's FFN of the n rows: the cached groups' share on the device (its
 * xn there already, or sent up), the CPU's meanwhile (cpu_share), x += both.
 */
static int ffn(struct pass *p, uint32_t l, uint32_t n, bool xn_on_dev)
{
	struct hyb_ctx *c = p->c;
	const uint32_t E = c->m->hp.n_embd;
	const uint8_t *skip = hyb_ffn_hybrid_prefill_split(p->h, l);
	bool sparse;

	if (skip) {
		/* waited for: the CPU's share overwrites c->xn next */
		if (!xn_on_dev && (rows_copy(p, true, c->xn, p->b.xn, 0, n, E) ||
				   critical_done(p, true)))
			return dev_err(p, "the pass's FFN input to the device");
		if (hyb_ffn_hybrid_seq_ffn(p->h, l, n, p->err, p->errlen))
			return -1;
		if (critical_after_compute(p) || rows_copy(p, false, p->ydev, p->y, 0, n, E) ||
		    hyb_device_record(p->dev, HYB_STREAM_CRITICAL, p->ev))
			return dev_err(p, "the pass's FFN on the device");
	}
	if (cpu_share(p, l, n, skip, &sparse))
		return -1;
	if (skip && hyb_device_sync(p->dev, p->ev))
		return dev_err(p, "the pass's FFN on the device");
	if (skip) {
		double f;

		if (!elapsed(p, 5, 6, &f))
			hyb_ffn_hybrid_seq_profile(p->h, f, 0, 0);
	}
	const struct hyb_weight *post = &c->m->layers[l].post_ffn_norm;

	for (uint32_t t = 0; t < n; t++) {
		float *x = c->x + (size_t)t * E, *xn = c->xn + (size_t)t * E;
		const float *y = sparse && !p->row_dense[t] ? p->ycpu + (size_t)t * E : xn;
		const float *yd = p->ydev + (size_t)t * E;
		bool both = skip != NULL;

		if (post->data) {
			/* Gemma 3's norm after the FFN: of the whole output, then added */
			for (uint32_t i = 0; i < E; i++)
				xn[i] = both ? y[i] + yd[i] : y[i];
			hyb_fwd_post_norm(c, post, xn, 1);
			y = xn;
			both = false;
		}
		for (uint32_t i = 0; i < E; i++)
			x[i] += both ? y[i] + yd[i] : y[i];
	}
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
	p.prof = hyb_ffn_hybrid_seq_prof(h);
	p.pred_layer[0] = p.pred_layer[1] = -1;
	p.cpu = malloc(sizeof(*p.cpu) * (p.n_runs ? p.n_runs : 1));
	p.ydev = malloc(sizeof(float) * n * c->m->hp.n_embd);
	p.ycpu = malloc(sizeof(float) * n * c->m->hp.n_embd);
	p.row_dense = malloc(n);
	p.need = malloc((size_t)n * c->m->n_groups);
	if (!p.cpu || !p.ydev || !p.ycpu || !p.row_dense || !p.need) {
		snprintf(err, errlen, "out of memory");
		goto out;
	}
	for (uint32_t i = 0; i < p.n_runs; i++) {
		/* a prompt runs dense (PowerInfer 5.3): its tokens together use every neuron */
		memset(p.row_dense + p.runs[i].t0, p.runs[i].n > 1, p.runs[i].n);
		if (hyb_ffn_hybrid_seq_slot(h, p.runs[i].seq) < 0) {
			p.cpu[p.n_cpu++] = p.runs[i];
			p.cpu_rows += p.runs[i].n;
		}
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
	free(p.ycpu);
	free(p.row_dense);
	free(p.need);
	return rc;
}
