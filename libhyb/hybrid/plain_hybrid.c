// SPDX-License-Identifier: MIT
/*
 * A plain model's parts on the device (plain_hybrid.h): the placement, the
 * whole FFNs' weights and buffers, and queuing an FFN there. dense.c owns
 * the attention blocks and the head; plain_decode.c runs the step.
 */
#include "plain_hybrid.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dense.h"
#include "sparse/teal.h"
#include "hyb/device.h"
#include "hyb/tensor_type.h"
#include "util/error.h"

#define ALIGN 256 /* offsets in device memory (the kernels need 2-4 bytes) */

struct hyb_plain_hybrid {
	const struct hyb_model *m;
	struct hyb_device *dev;
	struct hyb_hdense *hd;          /* attention blocks and head, or NULL */
	enum hyb_policy policy;
	uint32_t E, F;
	uint32_t rows;                  /* a pass's rows the buffers hold: 1, or several
					 * sequences' (their FFNs only on the device) */
	hyb_dptr *ffn;                  /* [n_layer][3]: gate, up, down; 0: on the CPU */
	hyb_dptr *post;                 /* [n_layer]: Gemma's norm after the FFN there, or 0 */
	uint32_t cur;                   /* the layer whose FFN was queued last */
	uint32_t n_ffn;
	uint64_t ffn_bytes, buf_bytes;
	hyb_dptr d_x, d_g, d_u, d_y;    /* [E], [F], [F], [E] */
	hyb_dptr d_gu;                  /* [2F]: TEAL's gate|up of one row, the activation */
	/* TEAL on the device's FFNs (hyb_plain_hybrid_set_teal): their weights in the
	 * transposed layout (ffn[l][0]: gate|up, [2]: down), the thresholds; or NULL */
	const struct hyb_teal *teal;
	float *teal_thr;                /* [n_layer][HYB_TEAL_INPUTS] */
	bool *teal_on;                  /* [n_layer]: that FFN's weights are the transposed */
	uint32_t n_teal;                /* ... how many */
	float *h_x, *h_y;               /* host staging [E] each (device host memory) */
	struct hyb_device_event *ev_in, *ev_out;
	/* each layer's FFN kernels between two timed events, summed at the step's end */
	struct hyb_device_event **ev_t; /* [n_layer][2] */
	bool *timed;                    /* [n_layer]: this step's FFN ran on the device */
	/* a prompt batch's rows (plain_prefill.c): pw.x, xn [cap][E], q, att [cap][q],
	 * k, v [cap][kv]; g, u [cap][F], y [cap][E]; h_rows [cap][E] pinned */
	struct hyb_hdense_batch pw;
	hyb_dptr pw_g, pw_u, pw_y;
	float *h_rows;
	uint32_t prompt_cap;
	uint64_t prompt_bytes;
	char prompt_note[160];          /* no batch: why (hyb_hybrid_offload.prompt_note) */
	struct hyb_hybrid_params prm;   /* what alloc_prompt was given */
	struct hyb_hybrid_stats st;
};

static uint64_t up_align(uint64_t v)
{
	return (v + ALIGN - 1) / ALIGN * ALIGN;
}

static int dev_fail(struct hyb_plain_hybrid *h, char *err, size_t errlen, const char *what)
{
	snprintf(err, errlen, "hybrid: %s: %s", what, hyb_device_error(h->dev));
	return -1;
}

/*
 * Device bytes of layer l's FFN (gate, up, down, Gemma's norm after it); 0
 * when the device cannot run it: a weight type its matvec does not take, a
 * layer's experts, a norm not in F32.
 */
static uint64_t ffn_bytes(const struct hyb_model *m, uint32_t l)
{
	const struct hyb_layer *L = &m->layers[l];
	const struct hyb_weight *w[3] = { &L->gate, &L->up, &L->down };
	uint64_t b = 0;

	for (int i = 0; i < 3; i++) {
		if (!w[i]->data || w[i]->ne2 || !hyb_device_matvec_type_ok(w[i]->type))
			return 0;
		b += up_align(w[i]->ne1 * w[i]->row_bytes);
	}
	if (L->post_ffn_norm.data && L->post_ffn_norm.type != HYB_TYPE_F32)
		return 0;
	return b + (L->post_ffn_norm.data ? up_align(4ull * m->hp.n_embd) : 0);
}

/*
 * The FFN buffers' bytes for a pass of `rows`: x in, gate and up activations,
 * y out; TEAL's gate|up of one row.
 */
static uint64_t ffn_buf_bytes(const struct hyb_model *m, uint32_t rows)
{
	return 2 * up_align(4ull * rows * m->hp.n_embd) + 2 * up_align(4ull * rows * m->hp.n_ff) +
	       up_align(8ull * m->hp.n_ff);
}

/* Layer l's FFN weights to the device (queued on RELOAD). */
static int put_ffn(struct hyb_plain_hybrid *h, uint32_t l)
{
	const struct hyb_layer *L = &h->m->layers[l];
	const struct hyb_weight *w[3] = { &L->gate, &L->up, &L->down };

	for (int i = 0; i < 3; i++) {
		const uint64_t b = w[i]->ne1 * w[i]->row_bytes;
		hyb_dptr *d = &h->ffn[(size_t)l * 3 + i];

		if (hyb_device_alloc(h->dev, b, d) ||
		    hyb_device_h2d(h->dev, HYB_STREAM_RELOAD, *d, w[i]->data, b))
			return -1;
	}
	if (L->post_ffn_norm.data &&
	    (hyb_device_alloc(h->dev, 4ull * h->E, &h->post[l]) ||
	     hyb_device_h2d(h->dev, HYB_STREAM_RELOAD, h->post[l], L->post_ffn_norm.data,
			    4ull * h->E)))
		return -1;
	h->n_ffn++;
	h->ffn_bytes += ffn_bytes(h->m, l);
	return 0;
}

/*
 * What goes where, within the budget. static: every attention block that
 * fits (dense.c's bytes: weights, norms, KV cache of n_ctx rows), in layer
 * order, then the head, then whole FFNs in layer order; layer: whole
 * layers in order (attention and FFN), then the head. *att and *head: the
 * attention blocks and head for dense.c; ffn[] set here.
 */
static void place(struct hyb_plain_hybrid *h, uint64_t budget, uint32_t n_ctx, bool ffn_only,
		  bool *att, bool *head, bool *ffn)
{
	const struct hyb_model *m = h->m;
	const uint32_t L = m->hp.n_layer;
	const uint64_t hb = hyb_hdense_head_bytes(m), fbuf = ffn_buf_bytes(m, h->rows);
	uint64_t used = 0;
	bool any_att = false, any_ffn = false;

	/* buffers as they become needed: dense.c's for the first block or the head */
#define FITS(extra, a, hd, f)                                                               \
	(used + (extra) + hyb_hdense_buffer_bytes(m, (a), (hd), false) + ((f) ? fbuf : 0) <= \
	 budget)
	*head = false;
	if (h->rows > 1 || ffn_only) {
		/* several sequences attend on the CPU (their KV cache is the host's paged
		 * one), or dense_on_cpu: the budget is the FFNs', in layer order */
		for (uint32_t l = 0; l < L; l++) {
			const uint64_t fb = ffn_bytes(m, l);

			if (!fb || used + fb + fbuf > budget)
				break;
			ffn[l] = true;
			used += fb;
		}
		(void)any_att;
		(void)any_ffn;
		return;
	}
	if (h->policy == HYB_POLICY_LAYER) {
		for (uint32_t l = 0; l < L; l++) {
			const uint64_t ab = hyb_hdense_layer_bytes(m, l, n_ctx);
			const uint64_t fb = ffn_bytes(m, l);

			if (!ab || !fb || !FITS(ab + fb, true, false, true))
				break;
			att[l] = ffn[l] = any_att = any_ffn = true;
			used += ab + fb;
		}
		if (hb && FITS(hb, any_att, true, any_ffn)) {
			*head = true;
			used += hb;
		}
		return;
	}
	for (uint32_t l = 0; l < L; l++) {
		const uint64_t ab = hyb_hdense_layer_bytes(m, l, n_ctx);

		if (!ab || !FITS(ab, true, false, false))
			continue;
		att[l] = any_att = true;
		used += ab;
	}
	if (hb && FITS(hb, any_att, true, false)) {
		*head = true;
		used += hb;
	}
	for (uint32_t l = 0; l < L; l++) {
		const uint64_t fb = ffn_bytes(m, l);

		if (!fb || !FITS(fb, any_att, *head, true))
			continue;
		ffn[l] = any_ffn = true;
		used += fb;
	}
#undef FITS
}

/* A prompt batch's device bytes a row (the arrays of struct hyb_plain_hybrid's pw). */
static uint64_t prompt_row_bytes(const struct hyb_model *m)
{
	const struct hyb_hparams *hp = &m->hp;
	const uint64_t q = (uint64_t)hp->n_head * hp->head_dim;
	const uint64_t kv = (uint64_t)hp->n_head_kv * hp->head_dim;

	return 4 * (3ull * hp->n_embd + 2 * q + 2 * kv + 2ull * hp->n_ff);
}

#define PROMPT_MAX 512 /* as a plan's batch (ffn_hybrid_prefill.c) */
#define PROMPT_MIN 16  /* fewer rows: the prompt runs on the CPU */

/* The prompt batch's buffers given back (TEAL's transposed FFNs take their room). */
static void free_prompt(struct hyb_plain_hybrid *h)
{
	hyb_dptr *arr[9] = { &h->pw.x, &h->pw.xn, &h->pw.q, &h->pw.k, &h->pw.v, &h->pw.att,
			     &h->pw_g, &h->pw_u, &h->pw_y };

	for (int i = 0; i < 9; i++)
		if (*arr[i]) {
			hyb_device_free(h->dev, *arr[i]);
			*arr[i] = 0;
		}
	hyb_device_host_free(h->dev, h->h_rows);
	h->h_rows = NULL;
	h->prompt_cap = 0;
	h->prompt_bytes = 0;
}

/*
 * Bytes the placement leaves for a prompt batch of PROMPT_MIN rows (or the
 * rows asked for): where they are at most a sixteenth of the budget, the
 * prompt's placed parts run on the device at the cost of a little of a
 * part; else whatever the parts leave is the batch's.
 */
static uint64_t prompt_reserve(const struct hyb_plain_hybrid *h,
			       const struct hyb_hybrid_params *p)
{
	const uint32_t rows = p->prompt_batch ? p->prompt_batch : PROMPT_MIN;
	const uint64_t r = rows * prompt_row_bytes(h->m) + 9 * ALIGN;

	if (h->rows > 1 || p->prefill_cpu)
		return 0;
	return r <= p->gpu_budget / 16 ? r : 0;
}

static void note(struct hyb_plain_hybrid *h, const char *why)
{
	snprintf(h->prompt_note, sizeof(h->prompt_note), "%s; prompts on the CPU", why);
}

/*
 * The prompt batch from what the placement left of the budget (a plan's
 * takes neuron cache slots, ffn_hybrid_prefill.c): up to PROMPT_MAX rows,
 * or exactly `want` when asked; none with fewer than PROMPT_MIN, for
 * several sequences (their passes have ffn_rows) or with prefill_cpu.
 */
static int alloc_prompt(struct hyb_plain_hybrid *h, const struct hyb_hybrid_params *p)
{
	const struct hyb_hparams *hp = &h->m->hp;
	const uint64_t q = (uint64_t)hp->n_head * hp->head_dim;
	const uint64_t kv = (uint64_t)hp->n_head_kv * hp->head_dim;
	/* nine allocations, each rounded up to the device's pages (the CPU device's 4 KiB) */
	const uint64_t used = hyb_device_used(h->dev), slack = 9 * 4096;
	const uint64_t left = p->gpu_budget > used + slack ? p->gpu_budget - used - slack : 0;
	uint64_t cap = left / prompt_row_bytes(h->m);
	hyb_dptr *arr[9] = { &h->pw.x, &h->pw.xn, &h->pw.q, &h->pw.k, &h->pw.v, &h->pw.att,
			     &h->pw_g, &h->pw_u, &h->pw_y };
	uint64_t width[9] = { h->E, h->E, q, kv, kv, q, h->F, h->F, h->E };

	if (p != &h->prm)
		h->prm = *p;
	h->prompt_note[0] = 0;
	if (h->rows > 1 || p->prefill_cpu || (!h->hd && !h->n_ffn)) {
		note(h, h->rows > 1 ? "several sequences: their passes take the rows" :
			p->prefill_cpu ? "--prefill-cpu" : "no part of the model is on the device");
		return 0;
	}
	cap = cap < PROMPT_MAX ? cap : PROMPT_MAX;
	if (p->prompt_batch)
		cap = cap >= p->prompt_batch ? p->prompt_batch : 0;
	else if (cap < PROMPT_MIN)
		cap = 0;
	if (!cap) {
		snprintf(h->prompt_note, sizeof(h->prompt_note), "the budget leaves no room for "
			 "the buffers of %u tokens; prompts on the CPU",
			 p->prompt_batch ? p->prompt_batch : PROMPT_MIN);
		return 0;
	}
	for (int i = 0; i < 9; i++)
		if (hyb_device_alloc(h->dev, 4 * width[i] * cap, arr[i]))
			goto none;
	h->h_rows = hyb_device_host_alloc(h->dev, 4ull * h->E * cap);
	if (!h->h_rows)
		goto none;
	h->prompt_cap = (uint32_t)cap;
	h->prompt_bytes = cap * prompt_row_bytes(h->m);
	return 0;
none:
	/* no room after all (the device's own rounding, or it refused): prompts on the CPU */
	snprintf(h->prompt_note, sizeof(h->prompt_note), "the device refused the buffers of "
		 "%llu tokens (%s); prompts on the CPU", (unsigned long long)cap,
		 hyb_device_error(h->dev));
	free_prompt(h);
	return 0;
}

static int alloc_buffers(struct hyb_plain_hybrid *h)
{
	const uint64_t r = h->rows;

	if (hyb_device_alloc(h->dev, 4ull * r * h->E, &h->d_x) ||
	    hyb_device_alloc(h->dev, 8ull * h->F, &h->d_gu) ||
	    hyb_device_alloc(h->dev, 4ull * r * h->F, &h->d_g) ||
	    hyb_device_alloc(h->dev, 4ull * r * h->F, &h->d_u) ||
	    hyb_device_alloc(h->dev, 4ull * r * h->E, &h->d_y))
		return -1;
	h->h_x = hyb_device_host_alloc(h->dev, 4ull * r * h->E);
	h->h_y = hyb_device_host_alloc(h->dev, 4ull * r * h->E);
	if (!h->h_x || !h->h_y)
		return -1;
	h->buf_bytes = ffn_buf_bytes(h->m, h->rows);
	return 0;
}

struct hyb_plain_hybrid *hyb_plain_hybrid_new(const struct hyb_model *m,
					      const struct hyb_hybrid_params *p, uint32_t n_ctx,
					      uint32_t n_rows, char *err, size_t errlen)
{
	const uint32_t L = m->hp.n_layer;
	struct hyb_plain_hybrid *h;
	struct hyb_device_config cfg;
	bool *att = calloc(L, sizeof(bool)), *ffn = calloc(L, sizeof(bool)), head = false;

	if (m->group_size || m->powerinfer || m->hp.n_expert) {
		snprintf(err, errlen, "hybrid: not a plain model (a plan, PowerInfer file or "
			 "mixture of experts has an engine of its own)");
		free(att);
		free(ffn);
		return NULL;
	}
	h = calloc(1, sizeof(*h));
	if (!h || !att || !ffn) {
		snprintf(err, errlen, "hybrid: out of memory");
		goto fail;
	}
	h->m = m;
	h->rows = n_rows > 1 ? n_rows : 1;
	h->policy = p->policy == HYB_POLICY_LAYER && h->rows == 1 ? HYB_POLICY_LAYER
								  : HYB_POLICY_STATIC;
	h->E = m->hp.n_embd;
	h->F = m->hp.n_ff;
	h->ffn = calloc((size_t)L * 3, sizeof(*h->ffn));
	h->post = calloc(L, sizeof(*h->post));
	if (!h->ffn || !h->post) {
		snprintf(err, errlen, "hybrid: out of memory");
		goto fail;
	}
	cfg = p->dev;
	if (!cfg.capacity)
		cfg.capacity = p->gpu_budget;
	h->dev = hyb_device_open(p->device ? p->device : "cpu", &cfg);
	if (!h->dev) {
		snprintf(err, errlen, "hybrid: %s", hyb_last_error());
		goto fail;
	}
	if (p->dense_on_cpu)
		h->policy = HYB_POLICY_STATIC;
	place(h, p->gpu_budget - prompt_reserve(h, p), n_ctx, p->dense_on_cpu, att, &head, ffn);
	for (uint32_t l = 0; l < L; l++)
		if (att[l] || head) {
			h->hd = hyb_hdense_new(h->dev, m, n_ctx, att, head, NULL, err, errlen);
			if (!h->hd)
				goto fail;
			break;
		}
	for (uint32_t l = 0; l < L; l++)
		if (ffn[l] && put_ffn(h, l)) {
			dev_fail(h, err, errlen, "FFN weights");
			goto fail;
		}
	h->ev_t = calloc((size_t)L * 2, sizeof(*h->ev_t));
	h->timed = calloc(L, sizeof(bool));
	if (!h->ev_t || !h->timed) {
		snprintf(err, errlen, "hybrid: out of memory");
		goto fail;
	}
	for (uint32_t i = 0; i < 2 * L; i++)
		if (ffn[i / 2] && !(h->ev_t[i] = hyb_device_event_new_timed(h->dev))) {
			dev_fail(h, err, errlen, "events");
			goto fail;
		}
	if (!(h->ev_in = hyb_device_event_new(h->dev)) ||
	    !(h->ev_out = hyb_device_event_new(h->dev))) {
		dev_fail(h, err, errlen, "events");
		goto fail;
	}
	if (h->n_ffn && (alloc_buffers(h) || hyb_device_record(h->dev, HYB_STREAM_RELOAD, h->ev_in) ||
			 hyb_device_sync(h->dev, h->ev_in))) {
		dev_fail(h, err, errlen, "FFN buffers");
		goto fail;
	}
	if (alloc_prompt(h, p)) {
		dev_fail(h, err, errlen, "prompt batch buffers");
		goto fail;
	}
	if (!h->hd && !h->n_ffn) {
		const uint32_t ta = m->layers[0].wq.type, tf = m->layers[0].up.type;

		/* sizes of 0: nothing the device computes (hyb_device_matvec_type_ok) */
		if (!hyb_device_matvec_type_ok(ta) && !hyb_device_matvec_type_ok(tf))
			snprintf(err, errlen, "hybrid: the device has no kernels for this model's "
				 "weights (%s and %s): it runs on the CPU alone (without "
				 "--gpu-budget)", hyb_type_name(ta), hyb_type_name(tf));
		else
			snprintf(err, errlen, "hybrid: a budget of %.1f MB holds no part of the "
				 "model (its smallest attention block is %.1f MB, an FFN %.1f MB)",
				 p->gpu_budget / 1e6, hyb_hdense_layer_bytes(m, 0, n_ctx) / 1e6,
				 ffn_bytes(m, 0) / 1e6);
		goto fail;
	}
	free(att);
	free(ffn);
	return h;
fail:
	free(att);
	free(ffn);
	hyb_plain_hybrid_free(h);
	return NULL;
}

void hyb_plain_hybrid_free(struct hyb_plain_hybrid *h)
{
	if (!h)
		return;
	hyb_hdense_free(h->hd);
	if (h->dev) {
		for (size_t i = 0; h->ffn && i < (size_t)h->m->hp.n_layer * 3; i++)
			if (h->ffn[i])
				hyb_device_free(h->dev, h->ffn[i]);
		hyb_device_free(h->dev, h->d_x);
		hyb_device_free(h->dev, h->d_gu);
		hyb_device_free(h->dev, h->d_g);
		hyb_device_free(h->dev, h->d_u);
		hyb_device_free(h->dev, h->d_y);
		hyb_device_host_free(h->dev, h->h_x);
		hyb_device_host_free(h->dev, h->h_y);
		hyb_device_host_free(h->dev, h->h_rows);
		hyb_device_event_free(h->dev, h->ev_in);
		hyb_device_event_free(h->dev, h->ev_out);
		for (size_t i = 0; h->ev_t && i < 2ull * h->m->hp.n_layer; i++)
			hyb_device_event_free(h->dev, h->ev_t[i]);
		hyb_device_close(h->dev);
	}
	free(h->ffn);
	free(h->post);
	free(h->teal_thr);
	free(h->teal_on);
	free(h->ev_t);
	free(h->timed);
	free(h);
}

struct hyb_device *hyb_plain_hybrid_device(const struct hyb_plain_hybrid *h)
{
	return h->dev;
}

struct hyb_hdense *hyb_plain_hybrid_dense(const struct hyb_plain_hybrid *h)
{
	return h->hd;
}

/*
 * Layer l's FFN of one row x into y with TEAL's thresholds (the transposed
 * weights: gate|up from x into d_gu, the activation, down from it), queued
 * on COMPUTE: forward.c's TEAL FFN of a decode step.
 */
static int teal_ffn(struct hyb_plain_hybrid *h, uint32_t l, hyb_dptr x, hyb_dptr y)
{
	const struct hyb_teal_mat *gu = &h->teal->mat[(size_t)l * HYB_TEAL_INPUTS + HYB_TEAL_GU];
	const struct hyb_teal_mat *dn =
		&h->teal->mat[(size_t)l * HYB_TEAL_INPUTS + HYB_TEAL_DOWN];
	const float *thr = h->teal_thr + (size_t)l * HYB_TEAL_INPUTS;
	const struct hyb_dev_teal a = {
		.type = gu->type, .n_in = gu->n_in, .n_out = gu->n_out, .row_bytes = gu->row_bytes,
		.w = h->ffn[(size_t)l * 3], .x = x, .thr = thr[HYB_TEAL_GU], .y = h->d_gu,
	};
	const struct hyb_dev_teal b = {
		.type = dn->type, .n_in = dn->n_in, .n_out = dn->n_out, .row_bytes = dn->row_bytes,
		.w = h->ffn[(size_t)l * 3 + 2], .x = h->d_gu, .thr = thr[HYB_TEAL_DOWN], .y = y,
	};

	return hyb_device_teal_matvec(h->dev, HYB_STREAM_COMPUTE, &a) ||
	       hyb_device_ffn_act(h->dev, HYB_STREAM_COMPUTE, h->d_gu, h->d_gu + 4ull * h->F,
				  h->F, h->m->hp.act) ||
	       hyb_device_teal_matvec(h->dev, HYB_STREAM_COMPUTE, &b) ? -1 : 0;
}

/*
 * TEAL's FFN of n rows of x into y (g, u: [n][F] scratch), each row with its
 * own inputs: gate and up as the columns of gate|up, the activation, down;
 * each row's bits its own step's (hyb_dev_teal.batch).
 */
static int teal_rows(struct hyb_plain_hybrid *h, uint32_t l, uint32_t n, hyb_dptr x,
		     hyb_dptr g, hyb_dptr u, hyb_dptr y)
{
	const struct hyb_teal_mat *gu = &h->teal->mat[(size_t)l * HYB_TEAL_INPUTS + HYB_TEAL_GU];
	const struct hyb_teal_mat *dn =
		&h->teal->mat[(size_t)l * HYB_TEAL_INPUTS + HYB_TEAL_DOWN];
	const float *thr = h->teal_thr + (size_t)l * HYB_TEAL_INPUTS;
	struct hyb_dev_teal a = {
		.type = gu->type, .n_in = gu->n_in, .n_out = h->F, .row_bytes = gu->row_bytes,
		.w = h->ffn[(size_t)l * 3], .x = x, .thr = thr[HYB_TEAL_GU], .y = g, .batch = n,
	};
	const struct hyb_dev_teal b = {
		.type = dn->type, .n_in = dn->n_in, .n_out = dn->n_out, .row_bytes = dn->row_bytes,
		.w = h->ffn[(size_t)l * 3 + 2], .x = g, .thr = thr[HYB_TEAL_DOWN], .y = y,
		.batch = n,
	};

	if (hyb_device_teal_matvec(h->dev, HYB_STREAM_COMPUTE, &a))
		return -1;
	a.w += hyb_row_bytes(gu->type, h->F);
	a.y = u;
	return hyb_device_teal_matvec(h->dev, HYB_STREAM_COMPUTE, &a) ||
	       hyb_device_ffn_act(h->dev, HYB_STREAM_COMPUTE, g, u, n * h->F, h->m->hp.act) ||
	       hyb_device_teal_matvec(h->dev, HYB_STREAM_COMPUTE, &b) ? -1 : 0;
}

/*
 * Layer l's FFN weights on the device replaced: by the transposed (t) or
 * the model's. Where the transposed do not fit (their rows are padded to
 * 64 bytes), the model's go back: false. -1: not even those (a device
 * failure: the layer's weights are lost).
 */
static int swap_ffn(struct hyb_plain_hybrid *h, uint32_t l, const struct hyb_teal *t)
{
	const struct hyb_layer *L = &h->m->layers[l];
	hyb_dptr *d = &h->ffn[(size_t)l * 3];
	const struct hyb_teal_mat *m = t ? &t->mat[(size_t)l * HYB_TEAL_INPUTS] : NULL;
	const void *src[3] = { L->gate.data, L->up.data, L->down.data };
	uint64_t b[3] = { L->gate.ne1 * L->gate.row_bytes, L->up.ne1 * L->up.row_bytes,
			  L->down.ne1 * L->down.row_bytes };
	int i;

	if (m) {
		src[0] = m[HYB_TEAL_GU].data;
		b[0] = m[HYB_TEAL_GU].row_bytes * m[HYB_TEAL_GU].n_in;
		src[1] = NULL;
		b[1] = 0;
		src[2] = m[HYB_TEAL_DOWN].data;
		b[2] = m[HYB_TEAL_DOWN].row_bytes * m[HYB_TEAL_DOWN].n_in;
	}
	for (i = 0; i < 3; i++)
		if (d[i]) {
			hyb_device_free(h->dev, d[i]);
			d[i] = 0;
		}
	for (i = 0; i < 3; i++)
		if (b[i] && hyb_device_alloc(h->dev, b[i], &d[i]))
			break;
	if (i < 3 && m) /* no room for the transposed: the model's again */
		return swap_ffn(h, l, NULL) ? -1 : 0;
	if (i < 3)
		return -1;
	for (i = 0; i < 3; i++)
		if (b[i] && hyb_device_h2d(h->dev, HYB_STREAM_RELOAD, d[i], src[i], b[i]))
			return -1;
	return m ? 1 : 0;
}

int hyb_plain_hybrid_set_teal(struct hyb_plain_hybrid *h, const struct hyb_teal *t,
			      const float *thr)
{
	const uint32_t L = h->m->hp.n_layer;
	const bool on = t && thr;
	int rc = 0;

	if (on && !h->teal_thr &&
	    !(h->teal_thr = malloc(sizeof(float) * L * HYB_TEAL_INPUTS)))
		return hyb_error_set(-ENOMEM, "out of memory");
	if (!h->teal_on && !(h->teal_on = calloc(L, sizeof(bool))))
		return hyb_error_set(-ENOMEM, "out of memory");
	if (on)
		memcpy(h->teal_thr, thr, sizeof(float) * L * HYB_TEAL_INPUTS);
	/* the layout changes between on and off; the queue drained first */
	if (on == (h->teal != NULL))
		return h->hd ? hyb_hdense_set_teal(h->hd, on ? t : NULL, on ? h->teal_thr : NULL)
			     : 0;
	if (hyb_device_record(h->dev, HYB_STREAM_COMPUTE, h->ev_out) ||
	    hyb_device_sync(h->dev, h->ev_out))
		rc = -1;
	/* the padded rows first, the prompt batch in what they leave; the attention
	 * blocks (dense.c's), then the FFNs */
	free_prompt(h);
	if (!rc && h->hd && hyb_hdense_set_teal(h->hd, on ? t : NULL, on ? h->teal_thr : NULL))
		rc = -1;
	h->teal = on ? t : NULL;
	for (uint32_t l = 0; !rc && l < L; l++) {
		int r;

		if (!hyb_plain_hybrid_ffn_on(h, l) || h->teal_on[l] == on)
			continue;
		r = swap_ffn(h, l, on ? t : NULL);
		if (r < 0)
			rc = -1;
		h->teal_on[l] = r > 0;
		h->n_teal += r > 0 ? 1 : on ? 0 : -1u;
	}
	if (!rc && (hyb_device_record(h->dev, HYB_STREAM_RELOAD, h->ev_in) ||
		    hyb_device_sync(h->dev, h->ev_in)))
		rc = -1;
	/* the prompt batch again, in what the parts left */
	if (!rc && alloc_prompt(h, &h->prm))
		rc = -1;
	if (rc)
		return hyb_error_set(-EIO, "TEAL on the device's parts: %s (their weights are "
				     "lost: a new context is needed)", hyb_device_error(h->dev));
	return 0;
}

bool hyb_plain_hybrid_ffn_on(const struct hyb_plain_hybrid *h, uint32_t l)
{
	return h->ffn[(size_t)l * 3] != 0;
}

int hyb_plain_hybrid_ffn_queue(struct hyb_plain_hybrid *h, uint32_t l, const float *xn)
{
	const struct hyb_layer *L = &h->m->layers[l];
	const hyb_dptr *w = &h->ffn[(size_t)l * 3];
	hyb_dptr x = h->d_x;

	if (xn) { /* the CPU's attention: its ffn_norm(x) goes up */
		memcpy(h->h_x, xn, sizeof(float) * h->E);
		if (hyb_device_h2d(h->dev, HYB_STREAM_CRITICAL, h->d_x, h->h_x, 4ull * h->E) ||
		    hyb_device_record(h->dev, HYB_STREAM_CRITICAL, h->ev_in) ||
		    hyb_device_wait(h->dev, HYB_STREAM_COMPUTE, h->ev_in))
			return -1;
		h->st.critical_bytes += 4ull * h->E;
	} else {
		x = hyb_hdense_xn(h->hd);
	}
	const struct hyb_dev_matvec gate = {
		.type = L->gate.type, .n_in = h->E, .n_out = h->F, .w = w[0], .x = x, .y = h->d_g,
	};
	const struct hyb_dev_matvec up = {
		.type = L->up.type, .n_in = h->E, .n_out = h->F, .w = w[1], .x = x, .y = h->d_u,
	};
	const struct hyb_dev_matvec down = {
		.type = L->down.type, .n_in = h->F, .n_out = h->E, .w = w[2], .x = h->d_g,
		.y = h->d_y,
	};

	if (hyb_device_record(h->dev, HYB_STREAM_COMPUTE, h->ev_t[2 * l]) ||
	    (h->teal_on && h->teal_on[l] ? teal_ffn(h, l, x, h->d_y) :
		       hyb_hdense_matvec2(h->dev, HYB_STREAM_COMPUTE, &gate, &up) ||
			       hyb_device_ffn_act(h->dev, HYB_STREAM_COMPUTE, h->d_g, h->d_u, h->F,
						  h->m->hp.act) ||
			       hyb_device_matvec(h->dev, HYB_STREAM_COMPUTE, &down)) ||
	    hyb_device_record(h->dev, HYB_STREAM_COMPUTE, h->ev_t[2 * l + 1]))
		return -1;
	h->timed[l] = true;
	h->cur = l;
	return 0;
}

int hyb_plain_hybrid_ffn_out(struct hyb_plain_hybrid *h, float *y)
{
	/* after the FFN's kernels: their end on COMPUTE, the copy on CRITICAL */
	if (hyb_device_record(h->dev, HYB_STREAM_COMPUTE, h->ev_out) ||
	    hyb_device_wait(h->dev, HYB_STREAM_CRITICAL, h->ev_out) ||
	    hyb_device_d2h(h->dev, HYB_STREAM_CRITICAL, h->h_y, h->d_y, 4ull * h->E) ||
	    hyb_device_record(h->dev, HYB_STREAM_CRITICAL, h->ev_in) ||
	    hyb_device_sync(h->dev, h->ev_in))
		return -1;
	memcpy(y, h->h_y, sizeof(float) * h->E);
	h->st.critical_bytes += 4ull * h->E;
	return 0;
}

int hyb_plain_hybrid_ffn_add(struct hyb_plain_hybrid *h, hyb_dptr x)
{
	const hyb_dptr post = h->post[h->cur];

	if (post && hyb_device_rmsnorm(h->dev, HYB_STREAM_COMPUTE, h->d_y, h->d_y, post, h->E,
				       h->m->hp.rms_eps))
		return -1;
	return hyb_device_add(h->dev, HYB_STREAM_COMPUTE, x, h->d_y, h->E);
}

int hyb_plain_hybrid_ffn_rows(struct hyb_plain_hybrid *h, uint32_t l, const float *xn,
			      uint32_t n, float *y)
{
	const struct hyb_layer *L = &h->m->layers[l];
	const hyb_dptr *w = &h->ffn[(size_t)l * 3];
	const uint64_t in = 4ull * n * h->E;
	const struct hyb_dev_matvec gate = {
		.type = L->gate.type, .n_in = h->E, .n_out = h->F, .w = w[0], .x = h->d_x,
		.y = h->d_g, .batch = n,
	};
	const struct hyb_dev_matvec up = {
		.type = L->up.type, .n_in = h->E, .n_out = h->F, .w = w[1], .x = h->d_x,
		.y = h->d_u, .batch = n,
	};
	const struct hyb_dev_matvec down = {
		.type = L->down.type, .n_in = h->F, .n_out = h->E, .w = w[2], .x = h->d_g,
		.y = h->d_y, .batch = n,
	};
	double s;

	if (n > h->rows)
		return hyb_error_set(-EINVAL, "a pass of %u rows: the FFN buffers hold %u", n,
				     h->rows);
	/* rows in, the one-token kernels row after row (hyb/device.h), rows out */
	memcpy(h->h_x, xn, in);
	if (hyb_device_h2d(h->dev, HYB_STREAM_CRITICAL, h->d_x, h->h_x, in) ||
	    hyb_device_record(h->dev, HYB_STREAM_CRITICAL, h->ev_in) ||
	    hyb_device_wait(h->dev, HYB_STREAM_COMPUTE, h->ev_in) ||
	    hyb_device_record(h->dev, HYB_STREAM_COMPUTE, h->ev_t[2 * l]) ||
	    (h->teal_on && h->teal_on[l] ? teal_rows(h, l, n, h->d_x, h->d_g, h->d_u, h->d_y) :
		       hyb_hdense_matvec2(h->dev, HYB_STREAM_COMPUTE, &gate, &up) ||
			       hyb_device_ffn_act(h->dev, HYB_STREAM_COMPUTE, h->d_g, h->d_u,
						  n * h->F, h->m->hp.act) ||
			       hyb_device_matvec(h->dev, HYB_STREAM_COMPUTE, &down)) ||
	    hyb_device_record(h->dev, HYB_STREAM_COMPUTE, h->ev_t[2 * l + 1]) ||
	    hyb_device_wait(h->dev, HYB_STREAM_CRITICAL, h->ev_t[2 * l + 1]) ||
	    hyb_device_d2h(h->dev, HYB_STREAM_CRITICAL, h->h_y, h->d_y, in) ||
	    hyb_device_record(h->dev, HYB_STREAM_CRITICAL, h->ev_out) ||
	    hyb_device_sync(h->dev, h->ev_out))
		return hyb_error_set(-EIO, "FFN of layer %u on the device: %s", l,
				     hyb_device_error(h->dev));
	memcpy(y, h->h_y, in);
	if (!hyb_device_elapsed(h->dev, h->ev_t[2 * l], h->ev_t[2 * l + 1], &s))
		h->st.dev_kernel_s += s;
	h->st.critical_bytes += 2 * in;
	return 0;
}

uint32_t hyb_plain_hybrid_prompt_cap(const struct hyb_plain_hybrid *h)
{
	return h->prompt_cap;
}

const struct hyb_hdense_batch *hyb_plain_hybrid_prompt_bufs(const struct hyb_plain_hybrid *h)
{
	return &h->pw;
}

int hyb_plain_hybrid_rows_up(struct hyb_plain_hybrid *h, hyb_dptr dst, const float *src,
			     uint32_t n)
{
	const uint64_t b = 4ull * n * h->E;

	if (n > h->prompt_cap)
		return -EINVAL;
	/* the staging rows: the last copy from them is done (rows_down syncs, this waits) */
	if (hyb_device_sync(h->dev, h->ev_in))
		return -1;
	memcpy(h->h_rows, src, b);
	if (hyb_device_h2d(h->dev, HYB_STREAM_CRITICAL, dst, h->h_rows, b) ||
	    hyb_device_record(h->dev, HYB_STREAM_CRITICAL, h->ev_in) ||
	    hyb_device_wait(h->dev, HYB_STREAM_COMPUTE, h->ev_in))
		return -1;
	return 0;
}

int hyb_plain_hybrid_rows_down(struct hyb_plain_hybrid *h, float *dst, hyb_dptr src, uint32_t n)
{
	const uint64_t b = 4ull * n * h->E;

	if (n > h->prompt_cap)
		return -EINVAL;
	if (hyb_device_sync(h->dev, h->ev_in) ||
	    hyb_device_record(h->dev, HYB_STREAM_COMPUTE, h->ev_out) ||
	    hyb_device_wait(h->dev, HYB_STREAM_CRITICAL, h->ev_out) ||
	    hyb_device_d2h(h->dev, HYB_STREAM_CRITICAL, h->h_rows, src, b) ||
	    hyb_device_record(h->dev, HYB_STREAM_CRITICAL, h->ev_in) ||
	    hyb_device_sync(h->dev, h->ev_in))
		return -1;
	memcpy(dst, h->h_rows, b);
	return 0;
}

int hyb_plain_hybrid_ffn_batch(struct hyb_plain_hybrid *h, uint32_t l, uint32_t n, bool add,
			       hyb_dptr *y)
{
	const struct hyb_layer *L = &h->m->layers[l];
	const hyb_dptr *w = &h->ffn[(size_t)l * 3];
	const struct hyb_dev_matvec gate = {
		.type = L->gate.type, .n_in = h->E, .n_out = h->F, .w = w[0], .x = h->pw.xn,
		.y = h->pw_g, .batch = n,
	};
	const struct hyb_dev_matvec up = {
		.type = L->up.type, .n_in = h->E, .n_out = h->F, .w = w[1], .x = h->pw.xn,
		.y = h->pw_u, .batch = n,
	};
	const struct hyb_dev_matvec down = {
		.type = L->down.type, .n_in = h->F, .n_out = h->E, .w = w[2], .x = h->pw_g,
		.y = h->pw_y, .batch = n,
	};
	const enum hyb_stream s = HYB_STREAM_COMPUTE;

	if (!w[0] || !n || n > h->prompt_cap)
		return -EINVAL;
	*y = h->pw_y;
	/* under TEAL, each row's own thresholds over the transposed weights */
	if (h->teal_on && h->teal_on[l] &&
	    teal_rows(h, l, n, h->pw.xn, h->pw_g, h->pw_u, h->pw_y))
		return -1;
	if ((!h->teal_on || !h->teal_on[l]) &&
	    (hyb_hdense_matvec2(h->dev, s, &gate, &up) ||
	     hyb_device_ffn_act(h->dev, s, h->pw_g, h->pw_u, n * h->F, h->m->hp.act) ||
	     hyb_device_matvec(h->dev, s, &down)))
		return -1;
	if (!add)
		return 0;
	if (h->post[l] && hyb_device_rmsnorm_rows(h->dev, s, h->pw_y, h->pw_y, h->post[l], h->E,
						  n, h->m->hp.rms_eps))
		return -1;
	return hyb_device_add(h->dev, s, h->pw.x, h->pw_y, n * h->E);
}

void hyb_plain_hybrid_prompt_done(struct hyb_plain_hybrid *h)
{
	h->st.prompt_batches++;
}

void hyb_plain_hybrid_add_time(struct hyb_plain_hybrid *h, double attn_s, double ffn_s,
			       double cpu_ffn_s, double head_s)
{
	/* the step has waited for all its work: each device FFN's kernels, by the device's clock */
	for (uint32_t l = 0; l < h->m->hp.n_layer; l++) {
		double s;

		if (h->timed[l] && !hyb_device_elapsed(h->dev, h->ev_t[2 * l], h->ev_t[2 * l + 1],
						       &s))
			h->st.dev_kernel_s += s;
		h->timed[l] = false;
	}
	h->st.tokens++;
	h->st.layer_steps += h->m->hp.n_layer;
	h->st.attn_s += attn_s;
	h->st.ffn_s += ffn_s;
	h->st.cpu_ffn_s += cpu_ffn_s;
	h->st.head_s += head_s;
}

void hyb_plain_hybrid_stats(const struct hyb_plain_hybrid *h, struct hyb_hybrid_stats *out)
{
	*out = h->st;
}

void hyb_plain_hybrid_stats_reset(struct hyb_plain_hybrid *h)
{
	memset(&h->st, 0, sizeof(h->st));
}

void hyb_plain_hybrid_offload(const struct hyb_plain_hybrid *h, struct hyb_hybrid_offload *out)
{
	memset(out, 0, sizeof(*out));
	out->plain = true;
	out->attn_layers = h->hd ? hyb_hdense_layers_on(h->hd) : 0;
	out->head = h->hd && hyb_hdense_head_on(h->hd);
	out->dense_bytes = h->hd ? hyb_hdense_bytes(h->hd) : 0;
	out->ffn_layers = h->n_ffn;
	out->ffn_bytes = h->ffn_bytes + (h->n_ffn ? h->buf_bytes : 0);
	out->prompt_batch = h->prompt_cap;
	out->prompt_bytes = h->prompt_bytes;
	if (!h->prompt_cap)
		memcpy(out->prompt_note, h->prompt_note, sizeof(out->prompt_note));
	if (h->policy == HYB_POLICY_LAYER)
		out->dense_layers_cpu = h->m->hp.n_layer - h->n_ffn;
	uint32_t teal_blocks = 0;

	for (uint32_t l = 0; h->hd && l < h->m->hp.n_layer; l++)
		teal_blocks += hyb_hdense_teal_on(h->hd, l);
	snprintf(out->cache_note, sizeof(out->cache_note),
		 "a plain model: %u attention blocks, %u FFNs%s on the device (%s placement, "
		 "docs/HYBRID.md \"Plain models\")", out->attn_layers, h->n_ffn,
		 out->head ? " and the head" : "",
		 h->policy == HYB_POLICY_LAYER ? "layer" : "static");
	/* under TEAL: the parts whose transposed rows fit (the others run dense) */
	if (h->teal)
		snprintf(out->cache_note + strlen(out->cache_note),
			 sizeof(out->cache_note) - strlen(out->cache_note),
			 "; TEAL on %u of %u blocks and %u of %u FFNs", teal_blocks,
			 out->attn_layers, h->n_teal, h->n_ffn);
}
