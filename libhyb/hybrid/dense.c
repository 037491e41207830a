// SPDX-License-Identifier: MIT
/*
 * The dense part of a hybrid model in device memory: see hybrid/dense.h.
 * Weights are copied from the model's mapping as they are (GGUF rows), so the
 * device kernels read the bytes the CPU would.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dense.h"
#include "hyb/tensor_type.h"
#include "sparse/teal.h"

struct dense_layer {
	bool on, pred;
	hyb_dptr attn_norm, wq, wk, wv, wo, ffn_norm, kc, vc;
	hyb_dptr q_norm, k_norm, bq, bk, bv;  /* Qwen's: 0 where the model has none */
	hyb_dptr post_attn_norm;              /* Gemma's norm after the block, or 0 */
	bool teal;                            /* wq holds TEAL's transposed q|k|v, wo its o */
	hyb_dptr fc1, fc1_b, fc2, fc2_b;  /* the predictor */
	uint32_t host_n, dev_n;  /* KV rows each side holds */
};

struct hyb_hdense {
	struct hyb_device *dev;
	const struct hyb_model *m;
	uint32_t L, E, F, V, q_dim, kv_dim, n_ctx, n_on, n_pred;
	uint32_t kv_slots;       /* sequences whose KV the device holds, n_ctx rows each */
	bool head;
	bool scores;             /* predictions are the scores, the lists a scratch (set_scores) */
	struct dense_layer *lay;
	struct hyb_rope rope;    /* the model's, LongRoPE's factors chosen for n_ctx (forward.c) */
	const struct hyb_teal *teal; /* hyb_hdense_set_teal: the layout and thresholds, or NULL */
	const float *teal_thr;
	hyb_dptr out_norm, out;
	/*
	 * x: [x | xn | count0 slot0 | count1 slot1 | list] - the slots hold the
	 * active lists, or the scores when scores is set (the list, not
	 * copied down, is then the predictor's scratch)
	 */
	hyb_dptr x, q, k, v, att, logits;
	float *h_x, *h_logits;
	struct hyb_device_event *ev_up, *ev_down, *ev_head;
	struct hyb_device_event *ev_pred;  /* the predictions' copy down (hyb_hdense_pred_down) */
	bool pred_pending;                  /* ... queued and not yet waited for */
	unsigned pred_slots;                /* slots written since the last copy down (bits) */
	uint64_t bytes;
};

static uint64_t round256(uint64_t b)
{
	return (b + 255) / 256 * 256;
}


static uint64_t weight_bytes(const struct hyb_weight *w)
{
	return w->ne1 * w->row_bytes;
}

/* a matrix the device's matvec takes, or a float vector */
static bool mat_ok(const struct hyb_weight *w)
{
	return w->data && hyb_device_matvec_type_ok(w->type) &&
	       hyb_row_bytes(w->type, w->ne0) == w->row_bytes;
}

static bool norm_ok(const struct hyb_weight *w)
{
	return w->data && w->type == HYB_TYPE_F32;
}

/* A Q or K norm: none, one per head ([head_dim]) or over the projection ([heads * head_dim]). */
static bool qk_norm_ok(const struct hyb_weight *w, uint32_t heads, uint32_t hd)
{
	return !w->data || (norm_ok(w) && (w->ne0 == hd || w->ne0 == (uint64_t)heads * hd));
}

uint64_t hyb_hdense_layer_bytes(const struct hyb_model *m, uint32_t l, uint32_t n_ctx)
{
	const struct hyb_hparams *hp = &m->hp;
	const struct hyb_layer *L = &m->layers[l];
	const uint64_t q = (uint64_t)hp->n_head * hp->head_dim;
	const uint64_t kv = (uint64_t)hp->n_head_kv * hp->head_dim;

	/*
	 * The device's block is forward.c's hyb_fwd_attention: llama's, with
	 * Qwen's Q/K norms and q/k/v biases, Gemma's sliding windows, scaled q
	 * and norm after the block, Phi-3's LongRoPE factors
	 */
	if (!norm_ok(&L->attn_norm) || !norm_ok(&L->ffn_norm) || !mat_ok(&L->wq) ||
	    !mat_ok(&L->wk) || !mat_ok(&L->wv) || !mat_ok(&L->wo) || hp->head_dim > 256 ||
	    hp->head_dim % 2 || hp->n_rot % 2 ||
	    (L->post_attn_norm.data && !norm_ok(&L->post_attn_norm)) ||
	    !qk_norm_ok(&L->q_norm, hp->n_head, hp->head_dim) ||
	    !qk_norm_ok(&L->k_norm, hp->n_head_kv, hp->head_dim))
		return 0;
	return round256(weight_bytes(&L->attn_norm)) + round256(weight_bytes(&L->ffn_norm)) +
	       round256(weight_bytes(&L->wq)) + round256(weight_bytes(&L->wk)) +
	       round256(weight_bytes(&L->wv)) + round256(weight_bytes(&L->wo)) +
	       (L->q_norm.data ? round256(weight_bytes(&L->q_norm)) : 0) +
	       (L->post_attn_norm.data ? round256(weight_bytes(&L->post_attn_norm)) : 0) +
	       (L->k_norm.data ? round256(weight_bytes(&L->k_norm)) : 0) +
	       (L->bq ? round256(4 * q) : 0) + (L->bk ? round256(4 * kv) : 0) +
	       (L->bv ? round256(4 * kv) : 0) + 2 * round256(2 * kv * n_ctx);
}

uint64_t hyb_hdense_head_bytes(const struct hyb_model *m)
{
	if (!norm_ok(&m->out_norm) || !mat_ok(&m->output))
		return 0;
	return round256(weight_bytes(&m->out_norm)) + round256(weight_bytes(&m->output));
}

uint64_t hyb_hdense_pred_bytes(const struct hyb_model *m, uint32_t l)
{
	const struct hyb_ffn_plan *P = &m->layers[l].plan;

	if (!m->group_size || P->fc1.type != HYB_TYPE_F16 || P->fc2.type != HYB_TYPE_F16 ||
	    !P->fc1.data || !P->fc2.data || !P->fc1_bias || !P->fc2_bias ||
	    m->hp.n_embd % 32 || P->fc1.ne0 != m->hp.n_embd || P->fc1.ne1 != P->hidden ||
	    P->fc2.ne0 != m->hp.n_ff || P->fc2.ne1 != P->hidden)
		return 0;
	return round256(weight_bytes(&P->fc1)) + round256(weight_bytes(&P->fc2)) +
	       round256(sizeof(float) * P->hidden) + round256(sizeof(float) * m->hp.n_ff);
}

uint32_t hyb_hdense_pred_source(const struct hyb_model *m, uint32_t l)
{
	return m->pred_input == HYB_PRED_SAME_LAYER || !l ? l : l - 1;
}

/*
 * Word of prediction slot `slot` in the x buffer: x, xn, then per slot a
 * count and n_ff words (a list, or scores); slot 2 is the scratch list.
 */
static uint64_t slot_word(const struct hyb_hdense *hd, int slot)
{
	return 2ull * hd->E + (uint64_t)slot * (1ull + hd->F);
}

/* floats of the x buffer copied down: x, xn, and with predictors two counts and two slots */
static uint64_t x_words(const struct hyb_model *m, bool any_pred)
{
	return 2ull * m->hp.n_embd + (any_pred ? 2 + 2ull * m->hp.n_ff : 0);
}

/* ... and on the device: with predictors also the scratch list */
static uint64_t x_words_dev(const struct hyb_model *m, bool any_pred)
{
	return x_words(m, any_pred) + (any_pred ? m->hp.n_ff : 0);
}

uint64_t hyb_hdense_buffer_bytes(const struct hyb_model *m, bool any_layer, bool head,
				 bool any_pred)
{
	const struct hyb_hparams *hp = &m->hp;
	const uint64_t q = (uint64_t)hp->n_head * hp->head_dim;
	const uint64_t kv = (uint64_t)hp->n_head_kv * hp->head_dim;
	uint64_t b = 0;

	if (!any_layer && !head)
		return 0;
	b += round256(sizeof(float) * x_words_dev(m, any_pred));
	if (any_layer)
		b += 2 * round256(sizeof(float) * q) + 2 * round256(sizeof(float) * kv);
	if (head)
		b += round256(sizeof(float) * (uint64_t)hp->n_vocab);
	return b;
}

static int fail(struct hyb_hdense *hd, char *err, size_t errlen, const char *what)
{
	snprintf(err, errlen, "%s: %s", what, hyb_device_error(hd->dev));
	return -1;
}

/* allocate and queue the upload of one tensor */
static int put(struct hyb_hdense *hd, const struct hyb_weight *w, hyb_dptr *out)
{
	const uint64_t b = weight_bytes(w);

	if (hyb_device_alloc(hd->dev, b, out) ||
	    hyb_device_h2d(hd->dev, HYB_STREAM_CRITICAL, *out, w->data, b))
		return -1;
	hd->bytes += round256(b);
	return 0;
}

static int alloc(struct hyb_hdense *hd, uint64_t b, hyb_dptr *out)
{
	if (hyb_device_alloc(hd->dev, b, out))
		return -1;
	hd->bytes += round256(b);
	return 0;
}

/*
 * q, k and v as one matvec when they share a type and a row length: their
 * rows lie back to back on the device, and so do their outputs (hd->q, k,
 * v), so one launch does what three did. On a GPU each launch of a 4096-row
 * matvec costs several microseconds beyond its bytes (tests/gpu/results/);
 * every row's dot is the same either way.
 */
static bool qkv_fused(const struct hyb_layer *L)
{
	return L->wq.type == L->wk.type && L->wq.type == L->wv.type &&
	       L->wq.ne0 == L->wk.ne0 && L->wq.ne0 == L->wv.ne0 &&
	       L->wq.row_bytes == L->wk.row_bytes && L->wq.row_bytes == L->wv.row_bytes;
}

static int put_qkv(struct hyb_hdense *hd, const struct hyb_layer *L, struct dense_layer *d)
{
	const uint64_t bq = weight_bytes(&L->wq), bk = weight_bytes(&L->wk);
	const uint64_t bv = weight_bytes(&L->wv);

	if (!qkv_fused(L))
		return put(hd, &L->wq, &d->wq) || put(hd, &L->wk, &d->wk) ||
		       put(hd, &L->wv, &d->wv) ? -1 : 0;
	if (alloc(hd, bq + bk + bv, &d->wq))
		return -1;
	d->wk = d->wq + bq;
	d->wv = d->wk + bk;
	return hyb_device_h2d(hd->dev, HYB_STREAM_CRITICAL, d->wq, L->wq.data, bq) ||
	       hyb_device_h2d(hd->dev, HYB_STREAM_CRITICAL, d->wk, L->wk.data, bk) ||
	       hyb_device_h2d(hd->dev, HYB_STREAM_CRITICAL, d->wv, L->wv.data, bv) ? -1 : 0;
}

/* A weight's device copy given back (its bytes off the count). */
static void drop(struct hyb_hdense *hd, hyb_dptr *p, uint64_t b)
{
	if (!*p)
		return;
	hyb_device_free(hd->dev, *p);
	*p = 0;
	hd->bytes -= round256(b);
}

/* A TEAL transposed matrix to the device (queued on CRITICAL). */
static int put_teal(struct hyb_hdense *hd, const struct hyb_teal_mat *t, hyb_dptr *out)
{
	const uint64_t b = t->row_bytes * t->n_in;

	if (alloc(hd, b, out) || hyb_device_h2d(hd->dev, HYB_STREAM_CRITICAL, *out, t->data, b))
		return -1;
	return 0;
}

/*
 * Layer l's q/k/v and o on the device swapped: for TEAL's transposed ones
 * (t), or back to the model's. Where the transposed do not fit (their rows
 * are padded), the model's go back: 0. 1: swapped to t. -1: a device failure.
 */
static int swap_teal(struct hyb_hdense *hd, uint32_t l, const struct hyb_teal *t)
{
	const struct hyb_layer *L = &hd->m->layers[l];
	struct dense_layer *d = &hd->lay[l];
	const struct hyb_teal_mat *m = &hd->teal->mat[(size_t)l * HYB_TEAL_INPUTS];

	if (d->teal) {
		drop(hd, &d->wq, m[HYB_TEAL_QKV].row_bytes * m[HYB_TEAL_QKV].n_in);
		drop(hd, &d->wo, m[HYB_TEAL_O].row_bytes * m[HYB_TEAL_O].n_in);
	} else {
		const bool fused = qkv_fused(L);

		drop(hd, &d->wq, fused ? weight_bytes(&L->wq) + weight_bytes(&L->wk) +
						 weight_bytes(&L->wv) : weight_bytes(&L->wq));
		if (!fused) {
			drop(hd, &d->wk, weight_bytes(&L->wk));
			drop(hd, &d->wv, weight_bytes(&L->wv));
		}
		drop(hd, &d->wo, weight_bytes(&L->wo));
	}
	d->wk = d->wv = 0;
	d->teal = false;
	if (t && !put_teal(hd, &t->mat[(size_t)l * HYB_TEAL_INPUTS + HYB_TEAL_QKV], &d->wq) &&
	    !put_teal(hd, &t->mat[(size_t)l * HYB_TEAL_INPUTS + HYB_TEAL_O], &d->wo)) {
		d->teal = true;
		return 1;
	}
	if (t) { /* no room: what went up back, then the model's */
		drop(hd, &d->wq, m[HYB_TEAL_QKV].row_bytes * m[HYB_TEAL_QKV].n_in);
		drop(hd, &d->wo, m[HYB_TEAL_O].row_bytes * m[HYB_TEAL_O].n_in);
	}
	return put_qkv(hd, L, d) || put(hd, &L->wo, &d->wo) ? -1 : 0;
}

int hyb_hdense_set_teal(struct hyb_hdense *hd, const struct hyb_teal *t, const float *thr)
{
	const bool on = t && thr;
	int rc = 0;

	hd->teal_thr = thr;
	if (on == (hd->teal != NULL))
		return 0;
	/* the queue drained: kernels may still read the weights */
	if (hyb_device_record(hd->dev, HYB_STREAM_COMPUTE, hd->ev_down) ||
	    hyb_device_sync(hd->dev, hd->ev_down))
		return -1;
	if (on)
		hd->teal = t;
	for (uint32_t l = 0; !rc && l < hd->L; l++)
		if (hd->lay[l].on && hd->lay[l].teal != on && swap_teal(hd, l, on ? t : NULL) < 0)
			rc = -1;
	if (!on)
		hd->teal = NULL;
	if (!rc && (hyb_device_record(hd->dev, HYB_STREAM_CRITICAL, hd->ev_up) ||
		    hyb_device_sync(hd->dev, hd->ev_up)))
		rc = -1;
	return rc;
}

bool hyb_hdense_teal_on(const struct hyb_hdense *hd, uint32_t l)
{
	return hd && l < hd->L && hd->lay[l].teal;
}

/* A float vector as a weight, for put() */
static struct hyb_weight vec(const float *p, uint32_t n)
{
	return (struct hyb_weight){ .type = HYB_TYPE_F32, .ne0 = n, .ne1 = 1,
				    .row_bytes = 4ull * n, .data = p };
}

static int upload(struct hyb_hdense *hd, char *err, size_t errlen)
{
	const uint64_t kvb = 2ull * hd->kv_dim * hd->n_ctx * hd->kv_slots;

	for (uint32_t l = 0; l < hd->L; l++) {
		const struct hyb_layer *L = &hd->m->layers[l];
		struct dense_layer *d = &hd->lay[l];

		if (!d->on)
			continue;
		const struct hyb_weight bq = vec(L->bq, hd->q_dim), bk = vec(L->bk, hd->kv_dim);
		const struct hyb_weight bv = vec(L->bv, hd->kv_dim);

		if (put(hd, &L->attn_norm, &d->attn_norm) || put(hd, &L->ffn_norm, &d->ffn_norm) ||
		    put_qkv(hd, L, d) || put(hd, &L->wo, &d->wo) ||
		    (L->q_norm.data && put(hd, &L->q_norm, &d->q_norm)) ||
		    (L->post_attn_norm.data && put(hd, &L->post_attn_norm, &d->post_attn_norm)) ||
		    (L->k_norm.data && put(hd, &L->k_norm, &d->k_norm)) ||
		    (L->bq && put(hd, &bq, &d->bq)) || (L->bk && put(hd, &bk, &d->bk)) ||
		    (L->bv && put(hd, &bv, &d->bv)) ||
		    (kvb && (alloc(hd, kvb, &d->kc) || alloc(hd, kvb, &d->vc))))
			return fail(hd, err, errlen, "attention weights to the device");
	}
	if (hd->head && (put(hd, &hd->m->out_norm, &hd->out_norm) ||
			 put(hd, &hd->m->output, &hd->out)))
		return fail(hd, err, errlen, "the head to the device");
	for (uint32_t l = 0; l < hd->L; l++) {
		const struct hyb_ffn_plan *P = &hd->m->layers[l].plan;
		struct dense_layer *d = &hd->lay[l];
		const struct hyb_weight b1 = { .type = HYB_TYPE_F32, .ne0 = P->hidden, .ne1 = 1,
					       .row_bytes = 4ull * P->hidden, .data = P->fc1_bias };
		const struct hyb_weight b2 = { .type = HYB_TYPE_F32, .ne0 = hd->F, .ne1 = 1,
					       .row_bytes = 4ull * hd->F, .data = P->fc2_bias };

		if (d->pred && (put(hd, &P->fc1, &d->fc1) || put(hd, &P->fc2, &d->fc2) ||
				put(hd, &b1, &d->fc1_b) || put(hd, &b2, &d->fc2_b)))
			return fail(hd, err, errlen, "predictors to the device");
	}
	if (hd->n_on || hd->head) {
		if (alloc(hd, sizeof(float) * x_words_dev(hd->m, hd->n_pred), &hd->x))
			return fail(hd, err, errlen, "device buffers");
	}
	/* q, k, v back to back: the rows of a fused q/k/v matvec (qkv_fused) */
	if (hd->n_on && (alloc(hd, sizeof(float) * (hd->q_dim + 2ull * hd->kv_dim), &hd->q) ||
			 alloc(hd, sizeof(float) * hd->q_dim, &hd->att)))
		return fail(hd, err, errlen, "device buffers");
	if (hd->n_on) {
		hd->k = hd->q + sizeof(float) * hd->q_dim;
		hd->v = hd->k + sizeof(float) * hd->kv_dim;
	}
	if (hd->head && alloc(hd, sizeof(float) * hd->V, &hd->logits))
		return fail(hd, err, errlen, "device buffers");
	if (hyb_device_record(hd->dev, HYB_STREAM_CRITICAL, hd->ev_up) ||
	    hyb_device_sync(hd->dev, hd->ev_up))
		return fail(hd, err, errlen, "dense weights to the device");
	return 0;
}

struct hyb_hdense *hyb_hdense_new(struct hyb_device *d, const struct hyb_model *m,
				  uint32_t n_ctx, const bool *layers, bool head, const bool *preds,
				  char *err, size_t errlen)
{
	return hyb_hdense_new_seqs(d, m, n_ctx, 1, layers, head, preds, err, errlen);
}

struct hyb_hdense *hyb_hdense_new_seqs(struct hyb_device *d, const struct hyb_model *m,
				       uint32_t n_ctx, uint32_t kv_slots, const bool *layers,
				       bool head, const bool *preds, char *err, size_t errlen)
{
	const struct hyb_hparams *hp = &m->hp;
	struct hyb_hdense *hd = calloc(1, sizeof(*hd));

	if (!hd)
		goto oom;
	hd->dev = d;
	hd->m = m;
	hd->L = hp->n_layer;
	hd->E = hp->n_embd;
	hd->F = hp->n_ff;
	hd->V = hp->n_vocab;
	hd->q_dim = hp->n_head * hp->head_dim;
	hd->kv_dim = hp->n_head_kv * hp->head_dim;
	hd->n_ctx = n_ctx;
	hd->kv_slots = kv_slots;
	hd->rope = hp->rope;
	if (hp->rope_short) /* LongRoPE: long factors for a context past the trained one */
		hd->rope.freq_factors = n_ctx > hp->n_ctx_orig ? hp->rope_long : hp->rope_short;
	hd->head = head && hyb_hdense_head_bytes(m);
	hd->lay = calloc(hd->L, sizeof(*hd->lay));
	hd->h_x = hyb_device_host_alloc(d, sizeof(float) * x_words(m, true));
	hd->h_logits = hd->head ? hyb_device_host_alloc(d, sizeof(float) * hd->V) : NULL;
	hd->ev_up = hyb_device_event_new(d);
	hd->ev_down = hyb_device_event_new(d);
	hd->ev_head = hyb_device_event_new(d);
	hd->ev_pred = hyb_device_event_new(d);
	if (!hd->lay || !hd->h_x || (hd->head && !hd->h_logits) || !hd->ev_up ||
	    !hd->ev_down || !hd->ev_head || !hd->ev_pred)
		goto oom;
	for (uint32_t l = 0; l < hd->L; l++) {
		hd->lay[l].on = layers && layers[l] && hyb_hdense_layer_bytes(m, l, 0);
		hd->n_on += hd->lay[l].on;
	}
	for (uint32_t l = 0; l < hd->L; l++) {
		hd->lay[l].pred = preds && preds[l] && hyb_hdense_pred_bytes(m, l) &&
				  hd->lay[hyb_hdense_pred_source(m, l)].on;
		hd->n_pred += hd->lay[l].pred;
	}
	if (upload(hd, err, errlen)) {
		hyb_hdense_free(hd);
		return NULL;
	}
	return hd;
oom:
	snprintf(err, errlen, "out of memory for the dense layers on the device");
	hyb_hdense_free(hd);
	return NULL;
}

void hyb_hdense_free(struct hyb_hdense *hd)
{
	if (!hd)
		return;
	/* device memory goes with the device; host buffers and events here */
	hyb_device_host_free(hd->dev, hd->h_x);
	hyb_device_host_free(hd->dev, hd->h_logits);
	hyb_device_event_free(hd->dev, hd->ev_up);
	hyb_device_event_free(hd->dev, hd->ev_down);
	hyb_device_event_free(hd->dev, hd->ev_head);
	hyb_device_event_free(hd->dev, hd->ev_pred);
	free(hd->lay);
	free(hd);
}

bool hyb_hdense_layer_on(const struct hyb_hdense *hd, uint32_t l)
{
	return hd && l < hd->L && hd->lay[l].on;
}

bool hyb_hdense_head_on(const struct hyb_hdense *hd)
{
	return hd && hd->head;
}

bool hyb_hdense_pred_on(const struct hyb_hdense *hd, uint32_t l)
{
	return hd && l < hd->L && hd->lay[l].pred;
}

uint32_t hyb_hdense_preds_on(const struct hyb_hdense *hd)
{
	return hd ? hd->n_pred : 0;
}

uint32_t hyb_hdense_layers_on(const struct hyb_hdense *hd)
{
	return hd ? hd->n_on : 0;
}

uint64_t hyb_hdense_bytes(const struct hyb_hdense *hd)
{
	return hd ? hd->bytes : 0;
}

hyb_dptr hyb_hdense_x(const struct hyb_hdense *hd)
{
	return hd->x;
}

hyb_dptr hyb_hdense_xn(const struct hyb_hdense *hd)
{
	return hd->x + sizeof(float) * hd->E;
}

float *hyb_hdense_host_x(const struct hyb_hdense *hd)
{
	return hd->h_x;
}

int hyb_hdense_x_up(struct hyb_hdense *hd)
{
	if (hyb_device_h2d(hd->dev, HYB_STREAM_CRITICAL, hd->x, hd->h_x, sizeof(float) * hd->E) ||
	    hyb_device_record(hd->dev, HYB_STREAM_CRITICAL, hd->ev_up) ||
	    hyb_device_wait(hd->dev, HYB_STREAM_COMPUTE, hd->ev_up))
		return -1;
	return 0;
}

int hyb_hdense_x_down(struct hyb_hdense *hd, bool with_xn, struct hyb_device_event **ev)
{
	const uint64_t b = sizeof(float) * hd->E * (with_xn ? 2 : 1);

	if (hyb_device_record(hd->dev, HYB_STREAM_COMPUTE, hd->ev_down) ||
	    hyb_device_wait(hd->dev, HYB_STREAM_CRITICAL, hd->ev_down) ||
	    hyb_device_d2h(hd->dev, HYB_STREAM_CRITICAL, hd->h_x, hd->x, b) ||
	    hyb_device_record(hd->dev, HYB_STREAM_CRITICAL, hd->ev_down))
		return -1;
	*ev = hd->ev_down;
	return 0;
}

int hyb_hdense_pred_down(struct hyb_hdense *hd)
{
	const uint64_t b = sizeof(float) * (1ull + hd->F);

	if (!hd->pred_slots)
		return 0;
	if (hyb_device_record(hd->dev, HYB_STREAM_COMPUTE, hd->ev_pred) ||
	    hyb_device_wait(hd->dev, HYB_STREAM_CRITICAL, hd->ev_pred))
		return -1;
	/* only the slots just written: the other may still be read on the host */
	for (int slot = 0; slot < 2; slot++) {
		const uint64_t off = sizeof(float) * slot_word(hd, slot);

		if ((hd->pred_slots >> slot & 1) &&
		    hyb_device_d2h(hd->dev, HYB_STREAM_CRITICAL, (char *)hd->h_x + off,
				   hd->x + off, b))
			return -1;
	}
	hd->pred_slots = 0;
	if (hyb_device_record(hd->dev, HYB_STREAM_CRITICAL, hd->ev_pred))
		return -1;
	hd->pred_pending = true;
	return 0;
}

int hyb_hdense_pred_wait(struct hyb_hdense *hd)
{
	if (!hd->pred_pending)
		return 0;
	hd->pred_pending = false;
	return hyb_device_sync(hd->dev, hd->ev_pred);
}

static struct hyb_dev_matvec mv(const struct hyb_weight *w, hyb_dptr wd, hyb_dptr x,
				hyb_dptr y, bool acc)
{
	return (struct hyb_dev_matvec){ .type = w->type, .n_in = (uint32_t)w->ne0,
					.n_out = (uint32_t)w->ne1, .w = wd, .x = x, .y = y,
					.accumulate = acc };
}

/*
 * After the q/k/v products of n tokens: Qwen's biases, then its Q and K
 * norms (per head, or over the projection), forward.c's order; before RoPE.
 */
static int qkv_extras(struct hyb_hdense *hd, const struct hyb_layer *L,
		      const struct dense_layer *d, hyb_dptr q, hyb_dptr k, hyb_dptr v, uint32_t n)
{
	const struct hyb_hparams *hp = &hd->m->hp;
	const enum hyb_stream s = HYB_STREAM_COMPUTE;
	const uint32_t qn = (uint32_t)L->q_norm.ne0, kn = (uint32_t)L->k_norm.ne0;

	for (uint32_t t = 0; t < n; t++)
		if ((d->bq && hyb_device_add(hd->dev, s, q + 4ull * t * hd->q_dim, d->bq,
					     hd->q_dim)) ||
		    (d->bk && hyb_device_add(hd->dev, s, k + 4ull * t * hd->kv_dim, d->bk,
					     hd->kv_dim)) ||
		    (d->bv && hyb_device_add(hd->dev, s, v + 4ull * t * hd->kv_dim, d->bv,
					     hd->kv_dim)))
			return -1;
	if (d->q_norm && hyb_device_rmsnorm_rows(hd->dev, s, q, q, d->q_norm, qn,
						 (uint32_t)(n * (uint64_t)hd->q_dim / qn),
						 hp->rms_eps))
		return -1;
	if (d->k_norm && hyb_device_rmsnorm_rows(hd->dev, s, k, k, d->k_norm, kn,
						 (uint32_t)(n * (uint64_t)hd->kv_dim / kn),
						 hp->rms_eps))
		return -1;
	return 0;
}

/* Layer l's attention options (hyb_dev_attn), forward.c's attend and attention_core. */
static struct hyb_dev_attn attn_of(const struct hyb_hdense *hd, uint32_t l, uint32_t pos)
{
	const struct hyb_hparams *hp = &hd->m->hp;
	const bool swa = hd->m->layers[l].swa;

	return (struct hyb_dev_attn){
		.n_head = hp->n_head, .n_head_kv = hp->n_head_kv, .head_dim = hp->head_dim,
		.n_rot = hp->n_rot, .rope = swa ? &hp->rope_swa : &hd->rope,
		.rope_neox = hp->rope_neox, .pos = pos, .n_ctx = hd->n_ctx,
		.q_scale = hp->q_scale, .n_swa = swa ? hp->n_swa : 0,
	};
}

/* b's rows t0.. of a float buffer of `width` floats a row */
static hyb_dptr rows_at(hyb_dptr base, uint32_t t0, uint32_t width)
{
	return base + 4ull * t0 * width;
}

/*
 * Outputs [c0, c0 + n) of TEAL's projection of input `in` of layer l (its
 * transposed weights at w) over nb rows of x into y: the same rows read from
 * column c0 on (c0 on a block), each output's sum the whole projection's.
 */
static int teal_cols(struct hyb_hdense *hd, uint32_t l, uint32_t in, hyb_dptr w, uint32_t c0,
		     uint32_t n, hyb_dptr x, hyb_dptr y, uint32_t nb)
{
	const struct hyb_teal_mat *t = &hd->teal->mat[(size_t)l * HYB_TEAL_INPUTS + in];
	const struct hyb_dev_teal a = {
		.type = t->type, .n_in = t->n_in, .n_out = n, .row_bytes = t->row_bytes,
		.w = w + hyb_row_bytes(t->type, c0), .x = x,
		.thr = hd->teal_thr[(size_t)l * HYB_TEAL_INPUTS + in], .y = y, .batch = nb,
	};

	return hyb_device_teal_matvec(hd->dev, HYB_STREAM_COMPUTE, &a);
}

/*
 * TEAL's projection of input `in` of layer l over x into y (hyb_device_teal_matvec
 * on the transposed weights at w), forward.c's project() of a decode step.
 */
static int teal_mv(struct hyb_hdense *hd, uint32_t l, uint32_t in, hyb_dptr w, hyb_dptr x,
		   hyb_dptr y)
{
	const struct hyb_teal_mat *t = &hd->teal->mat[(size_t)l * HYB_TEAL_INPUTS + in];

	return teal_cols(hd, l, in, w, 0, t->n_out, x, y, 1);
}

/*
 * x += wo · att for n rows: accumulated in the matvec, or with a norm after
 * the block (Gemma) into xn, normed there, then added (forward.c's order).
 */
static int attn_out(struct hyb_hdense *hd, uint32_t l, hyb_dptr att, hyb_dptr x, hyb_dptr xn,
		    uint32_t n)
{
	const struct hyb_layer *L = &hd->m->layers[l];
	const struct dense_layer *d = &hd->lay[l];
	const enum hyb_stream s = HYB_STREAM_COMPUTE;
	/* TEAL's o (each row its own inputs) has no accumulating form: into xn too */
	const bool via_xn = d->post_attn_norm || d->teal;
	struct hyb_dev_matvec o = mv(&L->wo, d->wo, att, via_xn ? xn : x, !via_xn);

	o.batch = n > 1 ? n : 0;
	if (d->teal && teal_cols(hd, l, HYB_TEAL_O, d->wo, 0, hd->E, att, xn, n))
		return -1;
	if (!d->teal && hyb_device_matvec(hd->dev, s, &o))
		return -1;
	if ((d->post_attn_norm && hyb_device_rmsnorm_rows(hd->dev, s, xn, xn, d->post_attn_norm,
							  hd->E, n, hd->m->hp.rms_eps)) ||
	    (via_xn && hyb_device_add(hd->dev, s, x, xn, n * hd->E)))
		return -1;
	return 0;
}

/* A decode step's block under TEAL: q|k|v in one projection, o as attn_out does. */
static int attention_teal(struct hyb_hdense *hd, uint32_t l, const struct hyb_dev_attn *a)
{
	const struct hyb_hparams *hp = &hd->m->hp;
	const struct dense_layer *d = &hd->lay[l];
	struct hyb_device *dev = hd->dev;
	const enum hyb_stream s = HYB_STREAM_COMPUTE;
	const hyb_dptr xn = hyb_hdense_xn(hd);

	if (hyb_device_rmsnorm(dev, s, xn, hd->x, d->attn_norm, hd->E, hp->rms_eps) ||
	    teal_mv(hd, l, HYB_TEAL_QKV, d->wq, xn, hd->q) ||
	    qkv_extras(hd, &hd->m->layers[l], d, hd->q, hd->k, hd->v, 1) ||
	    hyb_device_attention(dev, s, a) || attn_out(hd, l, hd->att, hd->x, xn, 1) ||
	    hyb_device_rmsnorm(dev, s, xn, hd->x, d->ffn_norm, hd->E, hp->rms_eps))
		return -1;
	return 0;
}

/* pos_at: a graph's step, the position read from device memory (pos is the watermark's) */
static int attention_one(struct hyb_hdense *hd, uint32_t l, uint32_t pos, hyb_dptr pos_at)
{
	const struct hyb_hparams *hp = &hd->m->hp;
	const struct hyb_layer *L = &hd->m->layers[l];
	const struct dense_layer *d = &hd->lay[l];
	struct hyb_device *dev = hd->dev;
	const enum hyb_stream s = HYB_STREAM_COMPUTE;
	const hyb_dptr xn = hyb_hdense_xn(hd);
	struct hyb_dev_matvec q = mv(&L->wq, d->wq, xn, hd->q, false);
	const struct hyb_dev_matvec k = mv(&L->wk, d->wk, xn, hd->k, false);
	const struct hyb_dev_matvec v = mv(&L->wv, d->wv, xn, hd->v, false);
	const bool fused = qkv_fused(L);
	struct hyb_dev_attn a = attn_of(hd, l, pos);

	if (!d->on || d->dev_n < pos || !hd->kv_slots)
		return -EINVAL;
	a.q = hd->q;
	a.k = hd->k;
	a.v = hd->v;
	a.kcache = d->kc;
	a.vcache = d->vc;
	a.out = hd->att;
	a.pos_at = pos_at;
	if (d->teal) {
		if (attention_teal(hd, l, &a))
			return -1;
		hyb_hdense_kv_dev_wrote(hd, l, pos + 1);
		return 0;
	}
	if (fused)
		q.n_out += k.n_out + v.n_out;
	if (hyb_device_rmsnorm(dev, s, xn, hd->x, d->attn_norm, hd->E, hp->rms_eps) ||
	    hyb_device_matvec(dev, s, &q) || (!fused && hyb_hdense_matvec2(dev, s, &k, &v)) ||
	    qkv_extras(hd, L, d, hd->q, hd->k, hd->v, 1) || hyb_device_attention(dev, s, &a) ||
	    attn_out(hd, l, hd->att, hd->x, xn, 1) ||
	    hyb_device_rmsnorm(dev, s, xn, hd->x, d->ffn_norm, hd->E, hp->rms_eps))
		return -1;
	if (!pos_at)
		hyb_hdense_kv_dev_wrote(hd, l, pos + 1);
	return 0;
}

int hyb_hdense_attention(struct hyb_hdense *hd, uint32_t l, uint32_t pos)
{
	return attention_one(hd, l, pos, 0);
}

int hyb_hdense_attention_at(struct hyb_hdense *hd, uint32_t l, hyb_dptr pos_at)
{
	/* TEAL's projections are the step's own choice: not in a graph */
	if (hd->lay[l].teal || !pos_at)
		return -EINVAL;
	return attention_one(hd, l, hd->lay[l].dev_n, pos_at);
}

int hyb_hdense_qkv_batch(struct hyb_hdense *hd, uint32_t l, uint32_t n,
			 const struct hyb_hdense_batch *b)
{
	const struct hyb_hparams *hp = &hd->m->hp;
	const struct hyb_layer *L = &hd->m->layers[l];
	const struct dense_layer *d = &hd->lay[l];
	struct hyb_device *dev = hd->dev;
	const enum hyb_stream s = HYB_STREAM_COMPUTE;
	struct hyb_dev_matvec q = mv(&L->wq, d->wq, b->xn, b->q, false);
	struct hyb_dev_matvec k = mv(&L->wk, d->wk, b->xn, b->k, false);
	struct hyb_dev_matvec v = mv(&L->wv, d->wv, b->xn, b->v, false);

	if (!d->on || !n)
		return -EINVAL;
	/* three products even where q, k and v sit back to back: the batch keeps them apart */
	q.batch = k.batch = v.batch = n;
	if (hyb_device_rmsnorm_rows(dev, s, b->xn, b->x, d->attn_norm, hd->E, n, hp->rms_eps))
		return -1;
	if (d->teal) {
		/* each row its own inputs: q, k and v, the columns of q|k|v, into their rows */
		if (teal_cols(hd, l, HYB_TEAL_QKV, d->wq, 0, hd->q_dim, b->xn, b->q, n) ||
		    teal_cols(hd, l, HYB_TEAL_QKV, d->wq, hd->q_dim, hd->kv_dim, b->xn, b->k, n) ||
		    teal_cols(hd, l, HYB_TEAL_QKV, d->wq, hd->q_dim + hd->kv_dim, hd->kv_dim,
			      b->xn, b->v, n))
			return -1;
	} else if (hyb_device_matvec(dev, s, &q) || hyb_hdense_matvec2(dev, s, &k, &v)) {
		return -1;
	}
	return qkv_extras(hd, L, d, b->q, b->k, b->v, n) ? -1 : 0;
}

int hyb_hdense_attend_batch(struct hyb_hdense *hd, uint32_t l, uint32_t slot, uint32_t pos,
			    uint32_t t0, uint32_t n, const struct hyb_hdense_batch *b)
{
	const struct dense_layer *d = &hd->lay[l];
	const uint64_t slot_off = 2ull * hd->kv_dim * hd->n_ctx * slot;
	struct hyb_dev_attn a = attn_of(hd, l, pos);

	a.q = rows_at(b->q, t0, hd->q_dim);
	a.k = rows_at(b->k, t0, hd->kv_dim);
	a.v = rows_at(b->v, t0, hd->kv_dim);
	a.kcache = d->kc + slot_off;
	a.vcache = d->vc + slot_off;
	a.out = rows_at(b->att, t0, hd->q_dim);
	a.batch = n;
	if (!d->on || slot >= hd->kv_slots || !n || (uint64_t)pos + n > hd->n_ctx)
		return -EINVAL;
	return hyb_device_attention(hd->dev, HYB_STREAM_COMPUTE, &a) ? -1 : 0;
}

int hyb_hdense_out_batch(struct hyb_hdense *hd, uint32_t l, uint32_t n,
			 const struct hyb_hdense_batch *b)
{
	const struct dense_layer *d = &hd->lay[l];

	if (!d->on || !n)
		return -EINVAL;
	if (attn_out(hd, l, b->att, b->x, b->xn, n) ||
	    hyb_device_rmsnorm_rows(hd->dev, HYB_STREAM_COMPUTE, b->xn, b->x, d->ffn_norm, hd->E,
				    n, hd->m->hp.rms_eps))
		return -1;
	return 0;
}

int hyb_hdense_attention_batch(struct hyb_hdense *hd, uint32_t l, uint32_t pos, uint32_t n,
			       const struct hyb_hdense_batch *b)
{
	int rc;

	if (!hd->lay[l].on || hd->lay[l].dev_n < pos || !n)
		return -EINVAL;
	rc = hyb_hdense_qkv_batch(hd, l, n, b);
	if (!rc)
		rc = hyb_hdense_attend_batch(hd, l, 0, pos, 0, n, b);
	if (!rc)
		rc = hyb_hdense_out_batch(hd, l, n, b);
	if (rc)
		return rc;
	hyb_hdense_kv_dev_wrote(hd, l, pos + n);
	return 0;
}

int hyb_hdense_head_queue(struct hyb_hdense *hd, struct hyb_device_event **ev)
{
	const struct hyb_model *m = hd->m;
	const hyb_dptr xn = hyb_hdense_xn(hd);
	const struct hyb_dev_matvec o = mv(&m->output, hd->out, xn, hd->logits, false);

	if (!hd->head)
		return -EINVAL;
	*ev = hd->ev_head;
	if (hyb_device_rmsnorm(hd->dev, HYB_STREAM_COMPUTE, xn, hd->x, hd->out_norm, hd->E,
			       m->hp.rms_eps) ||
	    hyb_device_matvec(hd->dev, HYB_STREAM_COMPUTE, &o) ||
	    hyb_device_record(hd->dev, HYB_STREAM_COMPUTE, hd->ev_head) ||
	    hyb_device_wait(hd->dev, HYB_STREAM_CRITICAL, hd->ev_head) ||
	    hyb_device_d2h(hd->dev, HYB_STREAM_CRITICAL, hd->h_logits, hd->logits,
			   sizeof(float) * hd->V) ||
	    hyb_device_record(hd->dev, HYB_STREAM_CRITICAL, hd->ev_head))
		return -1;
	return 0;
}

const float *hyb_hdense_head_logits(const struct hyb_hdense *hd)
{
	return hd->h_logits;
}

int hyb_hdense_head(struct hyb_hdense *hd, float *logits)
{
	struct hyb_device_event *ev;

	if (hyb_hdense_head_queue(hd, &ev))
		return -1;
	if (hyb_device_sync(hd->dev, ev))
		return -1;
	memcpy(logits, hd->h_logits, sizeof(float) * hd->V);
	return 0;
}

int hyb_hdense_kv_up(struct hyb_hdense *hd, const uint16_t *kc, const uint16_t *vc,
		     uint32_t n)
{
	const uint64_t row = 2ull * hd->kv_dim;
	bool queued = false;

	for (uint32_t l = 0; l < hd->L; l++) {
		struct dense_layer *d = &hd->lay[l];
		const size_t base = (size_t)l * hd->n_ctx * hd->kv_dim;

		if (!d->on || d->dev_n >= n)
			continue;
		if (d->host_n < n)
			return -EINVAL;  /* neither side holds the rows: a bookkeeping bug */
		const uint64_t off = d->dev_n * row, b = (n - d->dev_n) * row;

		if (hyb_device_h2d(hd->dev, HYB_STREAM_CRITICAL, d->kc + off,
				   kc + base + (size_t)d->dev_n * hd->kv_dim, b) ||
		    hyb_device_h2d(hd->dev, HYB_STREAM_CRITICAL, d->vc + off,
				   vc + base + (size_t)d->dev_n * hd->kv_dim, b))
			return -1;
		d->dev_n = n;
		queued = true;
	}
	if (queued && (hyb_device_record(hd->dev, HYB_STREAM_CRITICAL, hd->ev_up) ||
		       hyb_device_wait(hd->dev, HYB_STREAM_COMPUTE, hd->ev_up)))
		return -1;
	return 0;
}

int hyb_hdense_kv_down(struct hyb_hdense *hd, uint16_t *kc, uint16_t *vc, uint32_t n)
{
	const uint64_t row = 2ull * hd->kv_dim;
	bool queued = false;

	for (uint32_t l = 0; l < hd->L; l++) {
		struct dense_layer *d = &hd->lay[l];
		const size_t base = (size_t)l * hd->n_ctx * hd->kv_dim;

		if (!d->on || d->host_n >= n)
			continue;
		if (d->dev_n < n)
			return -EINVAL;
		const uint64_t off = d->host_n * row, b = (n - d->host_n) * row;

		if (!queued && (hyb_device_record(hd->dev, HYB_STREAM_COMPUTE, hd->ev_down) ||
				hyb_device_wait(hd->dev, HYB_STREAM_CRITICAL, hd->ev_down)))
			return -1;
		if (hyb_device_d2h(hd->dev, HYB_STREAM_CRITICAL,
				   kc + base + (size_t)d->host_n * hd->kv_dim, d->kc + off, b) ||
		    hyb_device_d2h(hd->dev, HYB_STREAM_CRITICAL,
				   vc + base + (size_t)d->host_n * hd->kv_dim, d->vc + off, b))
			return -1;
		d->host_n = n;
		queued = true;
	}
	if (queued && (hyb_device_record(hd->dev, HYB_STREAM_CRITICAL, hd->ev_down) ||
		       hyb_device_sync(hd->dev, hd->ev_down)))
		return -1;
	return 0;
}

void hyb_hdense_kv_host_wrote(struct hyb_hdense *hd, uint32_t to)
{
	for (uint32_t l = 0; hd && l < hd->L; l++)
		if (hd->lay[l].host_n < to)
			hd->lay[l].host_n = to;
}

void hyb_hdense_kv_dev_wrote(struct hyb_hdense *hd, uint32_t l, uint32_t to)
{
	if (hd->lay[l].dev_n < to)
		hd->lay[l].dev_n = to;
}

void hyb_hdense_kv_reset(struct hyb_hdense *hd)
{
	for (uint32_t l = 0; hd && l < hd->L; l++)
		hd->lay[l].host_n = hd->lay[l].dev_n = 0;
}

int hyb_hdense_predict(struct hyb_hdense *hd, uint32_t l, int slot)
{
	const struct dense_layer *d = &hd->lay[l];
	const hyb_dptr cnt = hd->x + 4 * slot_word(hd, slot);
	const hyb_dptr out = cnt + 4, scratch = hd->x + 4 * slot_word(hd, 2);
	const struct hyb_dev_predict p = {
		.n_in = hd->E, .hidden = hd->m->layers[l].plan.hidden, .n_out = hd->F,
		.fc1_w = d->fc1, .fc1_b = d->fc1_b, .fc2_w = d->fc2, .fc2_b = d->fc2_b,
		.x = hd->x, .count = cnt,
		.active = hd->scores ? scratch : out, .logits = hd->scores ? out : 0,
		.raw_x = hd->m->pred_input == HYB_PRED_SAME_LAYER,
	};

	if (!d->pred || slot < 0 || slot > 1)
		return -EINVAL;
	if (hyb_device_predict(hd->dev, HYB_STREAM_COMPUTE, &p))
		return -1;
	hd->pred_slots |= 1u << slot;
	return 0;
}

int hyb_hdense_predict_rows(struct hyb_hdense *hd, uint32_t l, hyb_dptr x, uint32_t n,
			    hyb_dptr out)
{
	const struct dense_layer *d = &hd->lay[l];

	if (!d->pred)
		return -EINVAL;
	for (uint32_t t = 0; t < n; t++) {
		const hyb_dptr cnt = out + 4ull * t * (1ull + hd->F);
		const struct hyb_dev_predict p = {
			.n_in = hd->E, .hidden = hd->m->layers[l].plan.hidden, .n_out = hd->F,
			.fc1_w = d->fc1, .fc1_b = d->fc1_b, .fc2_w = d->fc2, .fc2_b = d->fc2_b,
			.x = x + 4ull * t * hd->E, .count = cnt, .active = cnt + 4,
			.raw_x = hd->m->pred_input == HYB_PRED_SAME_LAYER,
		};

		if (hyb_device_predict(hd->dev, HYB_STREAM_COMPUTE, &p))
			return -1;
	}
	return 0;
}

void hyb_hdense_set_scores(struct hyb_hdense *hd, bool on)
{
	if (hd)
		hd->scores = on;
}

const float *hyb_hdense_predicted_scores(const struct hyb_hdense *hd, int slot)
{
	return hd->h_x + slot_word(hd, slot) + 1;
}

uint32_t hyb_hdense_predicted(const struct hyb_hdense *hd, int slot, const uint32_t **list)
{
	const uint32_t *cnt = (const uint32_t *)(hd->h_x + slot_word(hd, slot));
	const uint32_t n = *cnt;

	*list = cnt + 1;
	return n <= hd->F ? n : hd->F;
}
