// SPDX-License-Identifier: MIT
/*
 * The expert cache (moe_hybrid.h; docs/MOE.md, "The expert cache").
 *
 * An expert is a cache unit the way a neuron group is one of a plan
 * (KTransformers keeps its hot experts on the GPU; KAIROX and DynamicInfer
 * move units as they drift): the balancer runs unchanged with a layer's
 * experts as its groups (group size 1; frequencies from a routing profile,
 * "active" = chosen by the router, exact rather than predicted). A slot
 * holds an expert's gate, up and down matrices as they lie in the model
 * file, so a load is three copies from the pool and the device computes the
 * expert with its matvec kernel (x rounded to the dot type as the CPU
 * rounds it), its SwiGLU and matvec again: on the CPU device the very bits
 * of moe.c's CPU path. Per layer and token:
 *
 *   begin  xn up on CRITICAL (unless the layer's attention left it on the
 *          device: moe_decode.c); on COMPUTE, per resident expert that has
 *          landed (its load's event done), gate, up, activation, down into row i
 *          of y; the rows down on CRITICAL;
 *          the CPU computes the other experts meanwhile (moe.c);
 *   end    wait for the rows, hand them to moe.c's weighted sum (which is
 *          then the CPU path's, rank order and all), and ask the policy for
 *          loads and evictions: the next layer's for this token from its
 *          router on this layer's input (prefetch, KAIROX 5.1), this layer's
 *          for the next token where no prediction decided them. Loads go on
 *          RELOAD (critical copies pass queued reload chunks) and are used
 *          once landed; until then the CPU computes the expert ("late").
 *
 * A slot is rewritten only after the host has seen every kernel that read
 * it complete (end waits for the layer's rows before any load is issued),
 * and read only once the host has seen its load complete: the ordering the
 * CPU device's strict mode checks.
 *
 * The prompt runs on the CPU (moe.c's batched queue): each expert's matrix
 * is read once per batch there, and the device path is a decode path.
 */
#include "moe_hybrid.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyb/balancer.h"
#include "hyb/clock.h"
#include "hyb/device.h"
#include "hyb/tensor_type.h"
#include "dense.h"
#include "moe_graph.h"

#define SLOT_ALIGN 256 /* offsets of the three matrices in a slot (kernels need 2-4 bytes) */

struct slot {
	int32_t layer, expert;           /* -1: free */
	struct hyb_device_event *ev;     /* its load, when one was issued */
};

struct hyb_moe_hybrid {
	const struct hyb_model *m;
	struct hyb_device *dev;
	struct hyb_hdense *hd;           /* attention blocks and head on the device, or NULL */
	struct hyb_balancer *bal;
	enum hyb_policy policy;
	uint32_t lead, n_moe, X, K, E, F;
	uint64_t off_up, off_down, slot_bytes;
	uint32_t n_slots, n_free;
	hyb_dptr cache, d_x, d_g, d_u, d_y;
	float *h_x, *h_y;                /* host staging (device host memory) */
	int32_t *table;                  /* [n_moe * X]: slot or -1 */
	struct slot *slots;
	uint32_t *free;
	float *freq_data;                /* [n_moe * X] */
	const float **freq;
	uint32_t *sorted, *load, *evict, *dev_e;
	struct hyb_dev_matvec *mv; /* the grouped launches' items: 2 per expert */
	uint32_t rows;                   /* pairs (token, expert) a call may hold: K, or a
					  * pass's n_rows * K with several sequences */
	uint32_t *dev_r0;                /* [X] device expert i's first row in d_x / d_y */
	struct hyb_device_event *ev_in, *ev_k, *ev_out;
	uint32_t n_dev;                  /* experts queued on the device this layer */
	bool xn_dev;                     /* the device's xn is this layer's (moe_decode.c) */
	bool prefetch;                   /* decide layer l + 1's loads at layer l, from a prediction */
	bool *predicted;                 /* [n_moe] this token's decision for the layer is taken */
	double t_begin;                  /* device clock at begin */
	double t_token_last, token_s;    /* the last step's start and length: the loads' window */
	double group_load_s;             /* one expert's three copies over the link */
	struct hyb_balancer_feedback *fb;/* [n_moe] */
	/*
	 * Shared experts on the device (KTransformers section 3.3: shared
	 * experts on the GPU, routed ones on the CPU): [n_moe][4] gate, up,
	 * down and the gate's logit row (0: none), decode steps only.
	 */
	hyb_dptr *sh_w;
	uint32_t S;                      /* their n_ff */
	hyb_dptr d_sg, d_su, d_so;       /* [S], [S], [n_embd + 1]: output, then the logit */
	float *h_so;
	bool sh_now;                     /* this layer's is queued (begin) */
	uint64_t sh_bytes;
	/*
	 * Routers on the device (KTransformers section 3.3's GPU gating), for
	 * the layers whose attention is there: [n_moe] weights (0: none), the
	 * logits of the layer rt_layer on their way down (rt_pending), and with
	 * prefetch those of the next layer's router on the same input (rt_next:
	 * its prediction, KAIROX 5.1), behind them.
	 */
	hyb_dptr *rt_w, d_logits;       /* [2][n_expert] */
	float *h_logits;                /* [2][n_expert] */
	struct hyb_device_event *ev_rt;
	bool rt_pending, rt_next;
	uint32_t rt_layer;
	uint64_t rt_bytes;
	struct hyb_hybrid_layer_stats *lst; /* [n_moe] */
	struct hyb_hybrid_stats st;
	/*
	 * Graph steps (moe_graph.c): begin and end run on the step's executor
	 * thread, inside the graph's host functions' handshakes, and make no
	 * device call. They read the slots' load state from landed (brought up
	 * to date before each step), write the device experts' lists for the
	 * captured table kernels, and leave the loads they decide in pend, for
	 * the step's end to issue.
	 */
	struct hyb_moe_graph *graph;
	bool stepping;                   /* inside a graph step (prompt passes are not) */
	bool want_graph;
	char graph_note[160];            /* why steps are not graphs (hyb_hybrid_offload) */
	bool *landed;                    /* [n_slots] */
	uint32_t *pend, n_pend;          /* [n_slots] slots whose loads wait for the step's end */
	hyb_dptr d_list;                 /* uint32 [2][1 + 3K]: gate and up's list, down's */
	uint32_t *h_list;
	double t_graph;                  /* host clock at begin (graph steps) */
};

static int dev_fail(struct hyb_moe_hybrid *h, char *err, size_t errlen, const char *what)
{
	snprintf(err, errlen, "expert cache: %s: %s", what, hyb_device_error(h->dev));
	return -1;
}

static const struct hyb_layer *layer(const struct hyb_moe_hybrid *h, uint32_t lm)
{
	return &h->m->layers[h->lead + lm];
}

/* Slot s's expert's three matrices into it, on RELOAD, then its event. */
static int issue_load(struct hyb_moe_hybrid *h, uint32_t s)
{
	struct slot *sl = &h->slots[s];
	const uint32_t lm = (uint32_t)sl->layer, e = (uint32_t)sl->expert;
	const struct hyb_layer *L = layer(h, lm);
	const struct hyb_weight *w[3] = { &L->gate_exps, &L->up_exps, &L->down_exps };
	const uint64_t off[3] = { 0, h->off_up, h->off_down };

	for (int i = 0; i < 3; i++) {
		/* one copy, or one per node where the rows are split (docs/NUMA.md) */
		for (uint64_t r = 0, n; r < w[i]->ne1; r += n) {
			const char *src = hyb_weight_rows(w[i], e, r, &n);
			const uint64_t bytes = n * w[i]->row_bytes;

			if (hyb_device_h2d(h->dev, HYB_STREAM_RELOAD, h->cache + s * h->slot_bytes +
					   off[i] + r * w[i]->row_bytes, src, bytes))
				return -1;
			h->st.load_bytes += bytes;
		}
	}
	return hyb_device_record(h->dev, HYB_STREAM_RELOAD, sl->ev);
}

/*
 * Expert e of layer lm into slot s: issued now, or in a graph step once the
 * step has run (its executor makes no device call), not landed till then.
 */
static int load_expert(struct hyb_moe_hybrid *h, uint32_t lm, uint32_t e, uint32_t s)
{
	struct slot *sl = &h->slots[s];

	sl->layer = (int32_t)lm;
	sl->expert = (int32_t)e;
	h->table[(size_t)lm * h->X + e] = (int32_t)s;
	h->st.loads++;
	h->lst[lm].loads++;
	if (h->stepping) {
		h->landed[s] = false;
		h->pend[h->n_pend++] = s;
		return 0;
	}
	return issue_load(h, s);
}

static void evict_expert(struct hyb_moe_hybrid *h, uint32_t lm, uint32_t e)
{
	int32_t *t = &h->table[(size_t)lm * h->X + e];

	if (*t < 0)
		return;
	h->slots[*t].layer = h->slots[*t].expert = -1;
	h->free[h->n_free++] = (uint32_t)*t;
	*t = -1;
	h->st.evicts++;
}

/* ---- creation -------------------------------------------------------------------- */

static int check_model(const struct hyb_model *m, char *err, size_t errlen)
{
	const struct hyb_hparams *hp = &m->hp;

	if (!hp->n_expert || hp->n_dense_lead >= hp->n_layer) {
		snprintf(err, errlen, "expert cache: the model has no expert layers");
		return -1;
	}
	for (uint32_t l = hp->n_dense_lead; l < hp->n_layer; l++) {
		const struct hyb_layer *L = &m->layers[l];
		const struct hyb_weight *w[3] = { &L->gate_exps, &L->up_exps, &L->down_exps };

		for (int i = 0; i < 3; i++)
			if (!hyb_device_matvec_type_ok(w[i]->type)) {
				snprintf(err, errlen, "expert cache: layer %u's experts are %s, which "
					 "the device's matvec does not take (it takes every type "
					 "but BF16): decode this model on the CPU", l,
					 hyb_type_name(w[i]->type));
				return -1;
			}
		if (L->gate_exps.ne1 != m->layers[hp->n_dense_lead].gate_exps.ne1 ||
		    L->gate_exps.type != m->layers[hp->n_dense_lead].gate_exps.type ||
		    L->up_exps.type != m->layers[hp->n_dense_lead].up_exps.type ||
		    L->down_exps.type != m->layers[hp->n_dense_lead].down_exps.type) {
			snprintf(err, errlen, "expert cache: layer %u's experts differ in shape or "
				 "type from layer %u's (one slot size serves every layer)", l,
				 hp->n_dense_lead);
			return -1;
		}
	}
	return 0;
}

static uint64_t up_align(uint64_t v)
{
	return (v + SLOT_ALIGN - 1) / SLOT_ALIGN * SLOT_ALIGN;
}

/* Frequencies by MoE layer: the caller's (by model layer), or K / X each. */
static int set_freq(struct hyb_moe_hybrid *h, const float *const *freq, char *err, size_t errlen)
{
	h->freq_data = malloc(sizeof(float) * h->n_moe * h->X);
	h->freq = malloc(sizeof(float *) * h->n_moe);
	if (!h->freq_data || !h->freq) {
		snprintf(err, errlen, "expert cache: out of memory");
		return -1;
	}
	for (uint32_t lm = 0; lm < h->n_moe; lm++) {
		float *f = h->freq_data + (size_t)lm * h->X;

		for (uint32_t e = 0; e < h->X; e++) {
			const float v = freq ? freq[h->lead + lm][e] : (float)h->K / (float)h->X;

			if (!(v >= 0 && v <= 1)) {
				snprintf(err, errlen, "expert cache: layer %u expert %u: frequency %g "
					 "outside [0, 1]", h->lead + lm, e, (double)v);
				return -1;
			}
			f[e] = v;
		}
		h->freq[lm] = f;
	}
	return 0;
}

static int alloc_device(struct hyb_moe_hybrid *h, uint64_t budget, char *err, size_t errlen)
{
	/* a token's input and each pair's activations and output (rows: 1 and K with one
	 * sequence, a pass's pairs with several) */
	const uint64_t in = h->rows > h->K ? h->rows : 1, mid = h->rows;
	/* graph steps: the two lists, then the step's position */
	const uint64_t list = h->want_graph && h->rows == h->K ? 8ull * (1 + 3 * h->K) + 4 : 0;
	const uint64_t bufs = up_align(4ull * in * h->E) + 2 * up_align(4ull * mid * h->F) +
			      up_align(4ull * h->rows * h->E) + up_align(list);

	if (budget <= bufs || (budget - bufs) / h->slot_bytes == 0) {
		snprintf(err, errlen, "expert cache: a budget of %.1f MB holds no expert (one is "
			 "%.1f MB, buffers %.2f MB)", budget / 1e6, h->slot_bytes / 1e6,
			 bufs / 1e6);
		return -1;
	}
	h->n_slots = (uint32_t)((budget - bufs) / h->slot_bytes);
	if (h->n_slots > h->n_moe * h->X)
		h->n_slots = h->n_moe * h->X;
	if (hyb_device_alloc(h->dev, (uint64_t)h->n_slots * h->slot_bytes, &h->cache) ||
	    hyb_device_alloc(h->dev, 4ull * in * h->E, &h->d_x) ||
	    hyb_device_alloc(h->dev, 4ull * mid * h->F, &h->d_g) ||
	    hyb_device_alloc(h->dev, 4ull * mid * h->F, &h->d_u) ||
	    hyb_device_alloc(h->dev, 4ull * h->rows * h->E, &h->d_y))
		return dev_fail(h, err, errlen, "device memory");
	h->h_x = hyb_device_host_alloc(h->dev, 4ull * in * h->E);
	h->h_y = hyb_device_host_alloc(h->dev, 4ull * h->rows * h->E);
	h->slots = calloc(h->n_slots, sizeof(*h->slots));
	h->free = malloc(sizeof(uint32_t) * h->n_slots);
	if (!h->h_x || !h->h_y || !h->slots || !h->free) {
		snprintf(err, errlen, "expert cache: out of (host) memory");
		return -1;
	}
	for (uint32_t s = 0; s < h->n_slots; s++) {
		h->slots[s].layer = h->slots[s].expert = -1;
		if (!(h->slots[s].ev = hyb_device_event_new(h->dev)))
			return dev_fail(h, err, errlen, "events");
		h->free[s] = h->n_slots - 1 - s;
	}
	h->n_free = h->n_slots;
	if (list) { /* graph steps (moe_graph.c) */
		h->landed = calloc(h->n_slots, sizeof(bool));
		h->pend = malloc(sizeof(uint32_t) * h->n_slots);
		h->h_list = hyb_device_host_alloc(h->dev, list);
		if (!h->landed || !h->pend || !h->h_list ||
		    hyb_device_alloc(h->dev, list, &h->d_list)) {
			snprintf(err, errlen, "expert cache: graph step buffers: %s",
				 hyb_device_error(h->dev));
			return -1;
		}
	}
	if (!(h->ev_k = hyb_device_event_new_timed(h->dev)) ||
	    !(h->ev_out = hyb_device_event_new(h->dev)))
		return dev_fail(h, err, errlen, "events");
	return 0;
}

/*
 * The dense parts (PowerInfer 5.3, KTransformers: attention and the head on
 * the GPU): every layer's attention block and the head when together they
 * take at most half the budget, else the head alone if it does, else
 * nothing; the rest is for experts. The device's attention block is
 * llama's with Qwen's Q/K norms and biases (dense.c); a model with other
 * steps (MLA, sliding windows) keeps attention on the CPU. Returns the
 * bytes placed; -1 with err.
 */
static int64_t place_dense(struct hyb_moe_hybrid *h, const struct hyb_hybrid_params *p,
			   uint32_t n_ctx, char *err, size_t errlen)
{
	const struct hyb_model *m = h->m;
	const uint32_t L = m->hp.n_layer;
	bool *on = calloc(L, sizeof(bool));
	uint64_t layers = 0, head = hyb_hdense_head_bytes(m);
	/* the layers the device's block runs (hyb_hdense_layer_bytes), all or none */
	bool all = !p->dense_on_cpu;
	bool use_head;
	int64_t rc = 0;

	if (!on) {
		snprintf(err, errlen, "expert cache: out of memory");
		return -1;
	}
	for (uint32_t l = 0; l < L && all; l++) {
		const uint64_t b = hyb_hdense_layer_bytes(m, l, n_ctx);

		all = b > 0;
		layers += b;
		on[l] = true;
	}
	if (!all || layers + head + hyb_hdense_buffer_bytes(m, true, head > 0, false) >
			    p->gpu_budget / 2) {
		memset(on, 0, sizeof(bool) * L);
		layers = 0;
		all = false;
	}
	use_head = !p->dense_on_cpu && head &&
		   layers + head + hyb_hdense_buffer_bytes(m, all, true, false) <= p->gpu_budget / 2;
	if (all || use_head) {
		h->hd = hyb_hdense_new(h->dev, m, n_ctx, on, use_head, NULL, err, errlen);
		if (!h->hd)
			rc = -1;
		else
			rc = (int64_t)hyb_hdense_bytes(h->hd);
	}
	free(on);
	return rc;
}

/*
 * Shared experts on the device (KTransformers section 3.3) when the dense
 * parts went there and all of them take at most a quarter of what is left
 * for experts: every token runs them, so each byte there is read every
 * step. Uploaded now, waited for. Returns the bytes placed; -1 with err.
 */
static int64_t place_shared(struct hyb_moe_hybrid *h, uint64_t left, char *err, size_t errlen)
{
	const struct hyb_model *m = h->m;
	uint64_t bytes = 0;

	for (uint32_t lm = 0; lm < h->n_moe; lm++) {
		const struct hyb_layer *L = layer(h, lm);
		const struct hyb_weight *w[4] = { &L->gate_shexp, &L->up_shexp, &L->down_shexp,
						  &L->gate_inp_shexp };

		if (!L->up_shexp.data || !L->gate_shexp.data)
			continue;
		if (h->S && L->up_shexp.ne1 != h->S)
			return 0; /* one buffer size serves every layer */
		h->S = (uint32_t)L->up_shexp.ne1;
		for (int i = 0; i < 4; i++) {
			if (!w[i]->data)
				continue;
			if (!hyb_device_matvec_type_ok(w[i]->type))
				return 0;
			bytes += up_align(w[i]->ne1 * w[i]->row_bytes);
		}
	}
	bytes += 2 * up_align(4ull * h->S) + up_align(4ull * (h->E + 1));
	if (!h->S || !h->hd || bytes > left / 4)
		return 0;
	h->sh_w = calloc((size_t)h->n_moe * 4, sizeof(*h->sh_w));
	h->h_so = hyb_device_host_alloc(h->dev, 4ull * (h->E + 1));
	if (!h->sh_w || !h->h_so ||
	    hyb_device_alloc(h->dev, 4ull * h->S, &h->d_sg) ||
	    hyb_device_alloc(h->dev, 4ull * h->S, &h->d_su) ||
	    hyb_device_alloc(h->dev, 4ull * (h->E + 1), &h->d_so)) {
		snprintf(err, errlen, "expert cache: shared experts: %s", hyb_device_error(h->dev));
		return -1;
	}
	for (uint32_t lm = 0; lm < h->n_moe; lm++) {
		const struct hyb_layer *L = layer(h, lm);
		const struct hyb_weight *w[4] = { &L->gate_shexp, &L->up_shexp, &L->down_shexp,
						  &L->gate_inp_shexp };

		for (int i = 0; i < 4 && L->up_shexp.data && L->gate_shexp.data; i++) {
			const uint64_t b = w[i]->ne1 * w[i]->row_bytes;
			hyb_dptr *d = &h->sh_w[(size_t)lm * 4 + i];

			if (!w[i]->data)
				continue;
			if (hyb_device_alloc(h->dev, b, d) ||
			    hyb_device_h2d(h->dev, HYB_STREAM_RELOAD, *d, w[i]->data, b))
				return dev_fail(h, err, errlen, "shared experts");
		}
	}
	if (hyb_device_record(h->dev, HYB_STREAM_RELOAD, h->ev_in) ||
	    hyb_device_sync(h->dev, h->ev_in))
		return dev_fail(h, err, errlen, "shared experts");
	(void)m;
	h->sh_bytes = bytes;
	return (int64_t)bytes;
}

/*
 * The routers of the MoE layers whose attention block is on the device,
 * there too when together they take at most an eighth of what is left for
 * routed experts: the CPU then reads none of their rows, and the logits
 * come down beside x. Returns the bytes placed; -1 with err.
 */
static int64_t place_routers(struct hyb_moe_hybrid *h, uint64_t left, char *err, size_t errlen)
{
	uint64_t bytes = up_align(8ull * h->X);

	if (!h->hd)
		return 0;
	for (uint32_t lm = 0; lm < h->n_moe; lm++) {
		const struct hyb_weight *w = &layer(h, lm)->gate_inp;

		if (!hyb_hdense_layer_on(h->hd, h->lead + lm))
			continue;
		if (!hyb_device_matvec_type_ok(w->type))
			return 0;
		bytes += up_align(w->ne1 * w->row_bytes);
	}
	if (bytes <= up_align(8ull * h->X) || bytes > left / 8)
		return 0;
	h->rt_w = calloc(h->n_moe, sizeof(*h->rt_w));
	h->h_logits = hyb_device_host_alloc(h->dev, 8ull * h->X);
	h->ev_rt = hyb_device_event_new(h->dev);
	if (!h->rt_w || !h->h_logits || !h->ev_rt ||
	    hyb_device_alloc(h->dev, 8ull * h->X, &h->d_logits)) {
		snprintf(err, errlen, "expert cache: routers: %s", hyb_device_error(h->dev));
		return -1;
	}
	for (uint32_t lm = 0; lm < h->n_moe; lm++) {
		const struct hyb_weight *w = &layer(h, lm)->gate_inp;
		const uint64_t b = w->ne1 * w->row_bytes;

		if (!hyb_hdense_layer_on(h->hd, h->lead + lm))
			continue;
		if (hyb_device_alloc(h->dev, b, &h->rt_w[lm]) ||
		    hyb_device_h2d(h->dev, HYB_STREAM_RELOAD, h->rt_w[lm], w->data, b))
			return dev_fail(h, err, errlen, "routers");
	}
	if (hyb_device_record(h->dev, HYB_STREAM_RELOAD, h->ev_rt) ||
	    hyb_device_sync(h->dev, h->ev_rt))
		return dev_fail(h, err, errlen, "routers");
	h->rt_bytes = bytes;
	return (int64_t)bytes;
}

/* The policy's initial experts, loaded and waited for. */
static int warm_start(struct hyb_moe_hybrid *h, char *err, size_t errlen)
{
	for (uint32_t lm = 0; lm < h->n_moe; lm++) {
		const uint32_t n = hyb_balancer_initial(h->bal, lm, h->load);

		for (uint32_t i = 0; i < n; i++) {
			if (!h->n_free)
				break;
			if (load_expert(h, lm, h->load[i], h->free[--h->n_free]))
				return dev_fail(h, err, errlen, "loading the initial experts");
		}
	}
	for (uint32_t s = 0; s < h->n_slots; s++)
		if (h->slots[s].layer >= 0 && hyb_device_sync(h->dev, h->slots[s].ev))
			return dev_fail(h, err, errlen, "loading the initial experts");
	memset(&h->st, 0, sizeof(h->st));
	memset(h->lst, 0, sizeof(*h->lst) * h->n_moe);
	return 0;
}

struct hyb_moe_hybrid *hyb_moe_hybrid_new(const struct hyb_model *m,
					  const struct hyb_hybrid_params *p, uint32_t n_ctx,
					  uint32_t n_rows, char *err, size_t errlen)
{
	const struct hyb_hparams *hp = &m->hp;
	struct hyb_moe_hybrid *h;
	struct hyb_device_config cfg;
	struct hyb_balancer_params bp;
	int64_t dense, shared, routers;

	if (check_model(m, err, errlen))
		return NULL;
	if (p->thresholds != HYB_THR_AUTO && p->thresholds != HYB_THR_OFF) {
		snprintf(err, errlen, "expert cache: load-aware thresholds act on a neuron "
			 "predictor's scores; a mixture of experts' router is exact");
		return NULL;
	}
	h = calloc(1, sizeof(*h));
	if (!h) {
		snprintf(err, errlen, "expert cache: out of memory");
		return NULL;
	}
	h->m = m;
	h->policy = p->policy;
	h->want_graph = p->graph;
	h->lead = hp->n_dense_lead;
	h->n_moe = hp->n_layer - hp->n_dense_lead;
	h->X = hp->n_expert;
	h->K = hp->n_expert_used;
	h->E = hp->n_embd;
	{
		const struct hyb_layer *L = layer(h, 0);

		h->F = (uint32_t)L->gate_exps.ne1;
		h->off_up = up_align(L->gate_exps.ne1 * L->gate_exps.row_bytes);
		h->off_down = h->off_up + up_align(L->up_exps.ne1 * L->up_exps.row_bytes);
		h->slot_bytes = h->off_down + up_align(L->down_exps.ne1 * L->down_exps.row_bytes);
	}
	cfg = p->dev;
	if (!cfg.capacity)
		cfg.capacity = p->gpu_budget;
	h->dev = hyb_device_open(p->device ? p->device : "cpu", &cfg);
	if (!h->dev) {
		snprintf(err, errlen, "expert cache: %s", hyb_last_error());
		goto fail;
	}
	h->sorted = malloc(sizeof(uint32_t) * h->X);
	h->load = malloc(sizeof(uint32_t) * h->X);
	h->evict = malloc(sizeof(uint32_t) * h->X);
	h->rows = n_rows > 1 ? n_rows * h->K : h->K;
	h->dev_e = malloc(sizeof(uint32_t) * h->X);
	h->mv = malloc(2 * sizeof(*h->mv) * h->X);
	h->dev_r0 = malloc(sizeof(uint32_t) * (h->X + 1));
	h->table = malloc(sizeof(int32_t) * h->n_moe * h->X);
	h->fb = calloc(h->n_moe, sizeof(*h->fb));
	h->lst = calloc(h->n_moe, sizeof(*h->lst));
	h->predicted = calloc(h->n_moe, sizeof(bool));
	h->prefetch = !p->no_prefetch && p->policy != HYB_POLICY_STATIC &&
		      p->policy != HYB_POLICY_LAYER && h->n_moe > 1;
	if (!h->sorted || !h->load || !h->evict || !h->dev_e || !h->mv || !h->dev_r0 || !h->table ||
	    !h->fb || !h->predicted || !h->lst) {
		snprintf(err, errlen, "expert cache: out of memory");
		goto fail;
	}
	for (size_t i = 0; i < (size_t)h->n_moe * h->X; i++)
		h->table[i] = -1;
	if (set_freq(h, p->bal.freq, err, errlen))
		goto fail;
	/* a pass of several sequences attends on the CPU: the budget is the experts' */
	dense = n_rows > 1 ? 0 : place_dense(h, p, n_ctx, err, errlen);
	if (dense < 0)
		goto fail;
	if (!(h->ev_in = hyb_device_event_new_timed(h->dev))) {
		dev_fail(h, err, errlen, "events");
		goto fail;
	}
	shared = n_rows > 1 ? 0 : place_shared(h, p->gpu_budget - (uint64_t)dense, err, errlen);
	routers = shared < 0 || n_rows > 1 ? 0 :
		  place_routers(h, p->gpu_budget - (uint64_t)dense - (uint64_t)shared, err, errlen);
	if (shared < 0 || routers < 0 ||
	    alloc_device(h, p->gpu_budget - (uint64_t)dense - (uint64_t)shared - (uint64_t)routers,
			 err, errlen))
		goto fail;
	bp = p->bal;
	bp.policy = p->policy;
	bp.n_layer = h->n_moe;
	bp.n_ff = h->X;
	bp.group_size = 1;
	bp.slot_budget = h->n_slots;
	bp.freq = h->freq;
	bp.placement = NULL;
	/* one expert over the modelled or measured link: its three copies */
	hyb_device_get_config(h->dev, &cfg);
	h->group_load_s = cfg.pcie_gbps > 0 ?
		(double)h->slot_bytes / (cfg.pcie_gbps * 1e9) + 3 * cfg.pcie_lat_us * 1e-6 : 0;
	bp.group_load_s = h->group_load_s;
	if (!(h->bal = hyb_balancer_new(&bp))) {
		snprintf(err, errlen, "expert cache: %s", hyb_last_error());
		goto fail;
	}
	if (warm_start(h, err, errlen))
		goto fail;
	if (h->want_graph) {
		const char *why = hyb_moe_hybrid_graph_refusal(h);

		if (why)
			hyb_moe_hybrid_graph_off(h, why);
	}
	return h;
fail:
	hyb_moe_hybrid_free(h);
	return NULL;
}

void hyb_moe_hybrid_free(struct hyb_moe_hybrid *h)
{
	if (!h)
		return;
	hyb_moe_graph_free(h->graph); /* its executor first: it uses the rest */
	hyb_hdense_free(h->hd);
	if (h->dev) {
		for (uint32_t s = 0; h->slots && s < h->n_slots; s++)
			if (h->slots[s].ev)
				hyb_device_event_free(h->dev, h->slots[s].ev);
		if (h->ev_in)
			hyb_device_event_free(h->dev, h->ev_in);
		if (h->ev_k)
			hyb_device_event_free(h->dev, h->ev_k);
		if (h->ev_out)
			hyb_device_event_free(h->dev, h->ev_out);
		hyb_device_host_free(h->dev, h->h_x);
		hyb_device_host_free(h->dev, h->h_y);
		hyb_device_host_free(h->dev, h->h_so);
		hyb_device_host_free(h->dev, h->h_logits);
		hyb_device_host_free(h->dev, h->h_list);
		if (h->ev_rt)
			hyb_device_event_free(h->dev, h->ev_rt);
		hyb_device_close(h->dev); /* waits for queued work, frees its memory */
	}
	hyb_balancer_free(h->bal);
	free(h->slots);
	free(h->free);
	free(h->freq_data);
	free(h->freq);
	free(h->sorted);
	free(h->load);
	free(h->evict);
	free(h->dev_e);
	free(h->mv);
	free(h->dev_r0);
	free(h->table);
	free(h->fb);
	free(h->predicted);
	free(h->landed);
	free(h->pend);
	free(h->sh_w);
	free(h->rt_w);
	free(h->lst);
	free(h);
}

/* ---- a decode step ----------------------------------------------------------------- */

/* Whether expert e of layer lm can be computed on the device now: resident and landed. */
static bool ready(struct hyb_moe_hybrid *h, uint32_t lm, uint32_t e, bool *late)
{
	const int32_t s = h->table[(size_t)lm * h->X + e];

	*late = false;
	if (s < 0)
		return false;
	if (h->stepping ? h->landed[s] : hyb_device_done(h->dev, h->slots[s].ev))
		return true;
	*late = true;
	return false;
}

/* The device address of the slot holding layer lm's expert e (resident). */
static hyb_dptr slot_at(const struct hyb_moe_hybrid *h, uint32_t lm, uint32_t e)
{
	return h->cache + (uint64_t)h->table[(size_t)lm * h->X + e] * h->slot_bytes;
}

/* Rows of device expert i (dev_e[i]): its token count. */
static uint32_t dev_rows(const struct hyb_moe_hybrid *h, uint32_t i)
{
	return h->dev_r0[i + 1] - h->dev_r0[i];
}

/*
 * The matvecs of the device experts with expert i's token count, unless an
 * earlier one has it (0): down's into mv[0..c), else gate's into mv[0..c)
 * and up's after them, mv[c..2c). Returns c.
 */
static uint32_t gather(struct hyb_moe_hybrid *h, uint32_t lm, hyb_dptr x, uint32_t nf, uint32_t i,
		       bool down)
{
	const struct hyb_layer *L = layer(h, lm);
	const uint32_t n = h->n_dev, k = dev_rows(h, i);
	uint32_t c = 0;

	for (uint32_t j = 0; j < i; j++)
		if (dev_rows(h, j) == k)
			return 0;
	for (uint32_t j = i; j < n; j++) {
		const uint32_t r0 = h->dev_r0[j];
		const hyb_dptr base = slot_at(h, lm, h->dev_e[j]);
		const hyb_dptr xj = nf == 1 ? x : h->d_x + 4ull * r0 * h->E;

		if (dev_rows(h, j) != k)
			continue;
		if (down) {
			h->mv[c++] = (struct hyb_dev_matvec){
				.type = L->down_exps.type, .n_in = h->F, .n_out = h->E,
				.w = base + h->off_down, .x = h->d_g + 4ull * r0 * h->F,
				.y = h->d_y + 4ull * r0 * h->E, .batch = k,
			};
			continue;
		}
		h->mv[c] = (struct hyb_dev_matvec){
			.type = L->gate_exps.type, .n_in = h->E, .n_out = h->F, .w = base, .x = xj,
			.y = h->d_g + 4ull * r0 * h->F, .batch = k,
		};
		h->mv[n + c++] = (struct hyb_dev_matvec){
			.type = L->up_exps.type, .n_in = h->E, .n_out = h->F, .w = base + h->off_up,
			.x = xj, .y = h->d_u + 4ull * r0 * h->F, .batch = k,
		};
	}
	if (!down)
		memmove(h->mv + c, h->mv + n, sizeof(*h->mv) * c);
	return c;
}

/*
 * The device's experts of layer lm (dev_e; expert i over dev_rows(i) rows
 * of input from row dev_r0[i] of d_x, or over x with one token) in one
 * launch per matrix and token count, not four launches per expert
 * (KTransformers §4; docs/MOE.md: at a few us a launch, the launches were
 * most of the device's time): every gate and up matvec, one activation over
 * every row, every down matvec. Expert i's activations and outputs are rows
 * dev_r0[i].. of d_g/d_u and d_y. A group's items share one batch, so
 * experts of different token counts (several sequences) take a group per
 * count. Each kernel's bits are the one-expert matvec's (hyb/device.h).
 */
static int queue_experts(struct hyb_moe_hybrid *h, uint32_t lm, hyb_dptr x, uint32_t nf)
{
	const struct hyb_layer *L = layer(h, lm);
	const bool one = L->gate_exps.type == L->up_exps.type;

	for (uint32_t i = 0; i < h->n_dev; i++) {
		const uint32_t c = gather(h, lm, x, nf, i, false);

		if (c && (one ? hyb_device_matvec_group(h->dev, HYB_STREAM_COMPUTE, h->mv, 2 * c) :
			  hyb_device_matvec_group(h->dev, HYB_STREAM_COMPUTE, h->mv, c) ||
			  hyb_device_matvec_group(h->dev, HYB_STREAM_COMPUTE, h->mv + c, c)))
			return -1;
	}
	if (hyb_device_ffn_act(h->dev, HYB_STREAM_COMPUTE, h->d_g, h->d_u,
			       h->dev_r0[h->n_dev] * h->F, h->m->hp.act))
		return -1;
	for (uint32_t i = 0; i < h->n_dev; i++) {
		const uint32_t c = gather(h, lm, x, nf, i, true);

		if (c && hyb_device_matvec_group(h->dev, HYB_STREAM_COMPUTE, h->mv, c))
			return -1;
	}
	return 0;
}

/* Layer lm's shared expert on one token's x: gate, up, SwiGLU, down into d_so, its gate's logit after. */
static int queue_shared(struct hyb_moe_hybrid *h, uint32_t lm, hyb_dptr x)
{
	const struct hyb_layer *L = layer(h, lm);
	const hyb_dptr *w = &h->sh_w[(size_t)lm * 4];
	const struct hyb_dev_matvec gate = {
		.type = L->gate_shexp.type, .n_in = h->E, .n_out = h->S, .w = w[0], .x = x,
		.y = h->d_sg,
	};
	const struct hyb_dev_matvec up = {
		.type = L->up_shexp.type, .n_in = h->E, .n_out = h->S, .w = w[1], .x = x,
		.y = h->d_su,
	};
	const struct hyb_dev_matvec down = {
		.type = L->down_shexp.type, .n_in = h->S, .n_out = h->E, .w = w[2], .x = h->d_sg,
		.y = h->d_so,
	};
	const struct hyb_dev_matvec logit = {
		.type = L->gate_inp_shexp.type, .n_in = h->E, .n_out = 1, .w = w[3], .x = x,
		.y = h->d_so + 4ull * h->E,
	};

	if (hyb_hdense_matvec2(h->dev, HYB_STREAM_COMPUTE, &gate, &up) ||
	    hyb_device_ffn_act(h->dev, HYB_STREAM_COMPUTE, h->d_sg, h->d_su, h->S, h->m->hp.act) ||
	    hyb_device_matvec(h->dev, HYB_STREAM_COMPUTE, &down))
		return -1;
	return w[3] ? hyb_device_matvec(h->dev, HYB_STREAM_COMPUTE, &logit) : 0;
}

int hyb_moe_hybrid_begin(struct hyb_moe_hybrid *h, uint32_t l, const float *xn, uint32_t nf,
			 const uint32_t *start, const uint32_t *tok, uint32_t *active, uint32_t n,
			 char *err, size_t errlen)
{
	/* after attention on the device in a decode step, xn is there already (dense.c's
	 * ffn_norm); in a prompt pass on the CPU it is not */
	const bool xn_on_dev = h->xn_dev && nf == 1;
	const uint32_t lm = l - h->lead;
	uint32_t n_cpu = 0, rows = 0, pairs = 0;

	if (n > h->X || (uint64_t)nf * h->K > h->rows) {
		snprintf(err, errlen, "expert cache: %u experts of %u tokens in layer %u (%u pairs "
			 "at most)", n, nf, l, h->rows);
		return -1;
	}
	if (l == h->lead && !h->stepping) { /* a graph step: hyb_moe_hybrid_step_begin */
		const double now = hyb_device_now(h->dev);

		if (h->t_token_last > 0)
			h->token_s = now - h->t_token_last;
		h->t_token_last = now;
		h->st.tokens += nf;
	}
	if (h->stepping)
		h->t_graph = hyb_now();
	else
		h->t_begin = hyb_device_now(h->dev);
	h->n_dev = 0;
	h->fb[lm].late = 0;
	for (uint32_t i = 0; i < n; i++) {
		const uint32_t e = active[i], k = start[e + 1] - start[e];
		bool late;

		pairs += k;
		if (ready(h, lm, e, &late)) {
			h->dev_r0[h->n_dev] = rows;
			h->dev_e[h->n_dev++] = e;
			rows += k;
			h->st.active_dev += k;
		} else {
			active[n_cpu++] = e;
		}
		h->fb[lm].late += late;
	}
	h->dev_r0[h->n_dev] = rows;
	memcpy(active + n_cpu, h->dev_e, sizeof(uint32_t) * h->n_dev);
	h->st.layer_steps++;
	h->st.active += pairs;
	h->lst[lm].active += pairs;
	h->lst[lm].active_dev += rows;
	h->st.late += h->fb[lm].late;
	h->sh_now = nf == 1 && h->sh_w && h->sh_w[(size_t)lm * 4 + 1];
	if (h->stepping) {
		/* the lists the captured kernels read: gate and up from xn, down from their rows */
		uint32_t *gu = h->h_list, *dn = h->h_list + 1 + 3 * h->K;

		gu[0] = dn[0] = h->n_dev;
		for (uint32_t i = 0; i < h->n_dev; i++) {
			const uint32_t s = (uint32_t)h->table[(size_t)lm * h->X + h->dev_e[i]];

			memcpy(gu + 1 + 3 * i, (const uint32_t[]){ s, 0, i }, 12);
			memcpy(dn + 1 + 3 * i, (const uint32_t[]){ s, i, i }, 12);
		}
		hyb_moe_graph_list_ready(h->graph);
		return (int)n_cpu;
	}
	if (!h->n_dev && !h->sh_now)
		return (int)n_cpu;
	if (xn_on_dev) {
		if (hyb_device_record(h->dev, HYB_STREAM_COMPUTE, h->ev_in))
			return dev_fail(h, err, errlen, "expert input");
	} else {
		/* each device expert's tokens' inputs, gathered in its rows (one token: once) */
		const uint32_t in = nf == 1 ? 1 : rows;

		if (nf == 1) {
			memcpy(h->h_x, xn, 4ull * h->E);
		} else {
			for (uint32_t i = 0; i < h->n_dev; i++)
				for (uint32_t j = start[h->dev_e[i]]; j < start[h->dev_e[i] + 1]; j++)
					memcpy(h->h_x + (size_t)(h->dev_r0[i] + j -
								 start[h->dev_e[i]]) * h->E,
					       xn + (size_t)tok[j] * h->E, 4ull * h->E);
		}
		if (hyb_device_h2d(h->dev, HYB_STREAM_CRITICAL, h->d_x, h->h_x, 4ull * in * h->E) ||
		    hyb_device_record(h->dev, HYB_STREAM_CRITICAL, h->ev_in) ||
		    hyb_device_wait(h->dev, HYB_STREAM_COMPUTE, h->ev_in))
			return dev_fail(h, err, errlen, "expert input");
		h->st.critical_bytes += 4ull * in * h->E;
	}
	if (h->n_dev && queue_experts(h, lm, xn_on_dev ? hyb_hdense_xn(h->hd) : h->d_x, nf))
		return dev_fail(h, err, errlen, "expert kernels");
	if (h->sh_now && queue_shared(h, lm, xn_on_dev ? hyb_hdense_xn(h->hd) : h->d_x))
		return dev_fail(h, err, errlen, "shared expert kernels");
	if (hyb_device_record(h->dev, HYB_STREAM_COMPUTE, h->ev_k) ||
	    hyb_device_wait(h->dev, HYB_STREAM_CRITICAL, h->ev_k) ||
	    (rows && hyb_device_d2h(h->dev, HYB_STREAM_CRITICAL, h->h_y, h->d_y,
				    4ull * rows * h->E)) ||
	    (h->sh_now && hyb_device_d2h(h->dev, HYB_STREAM_CRITICAL, h->h_so, h->d_so,
					 4ull * (h->E + 1))) ||
	    hyb_device_record(h->dev, HYB_STREAM_CRITICAL, h->ev_out))
		return dev_fail(h, err, errlen, "expert outputs");
	h->st.critical_bytes += 4ull * h->E * rows + (h->sh_now ? 4ull * (h->E + 1) : 0);
	return (int)n_cpu;
}

/* Pending reloads, in expert loads of the model of the link (the policies' backlog). */
static uint32_t loads_in_flight(struct hyb_moe_hybrid *h)
{
	uint32_t n = 0;

	for (uint32_t s = 0; s < h->n_slots; s++)
		if (h->slots[s].layer >= 0 &&
		    !(h->stepping ? h->landed[s] : hyb_device_done(h->dev, h->slots[s].ev)))
			n++;
	return n;
}

static int cmp_u32(const void *a, const void *b)
{
	const uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

/* v[0..n) ascending without repeats (the balancer wants a strictly increasing list) */
static size_t dedup(uint32_t *v, size_t n)
{
	size_t m = 0;

	for (size_t i = 0; i < n; i++)
		if (!m || v[i] != v[m - 1])
			v[m++] = v[i];
	return m;
}

/* One decision for layer lm (hyb_balancer_step) from the experts in act[0..n), carried out. */
static int decide(struct hyb_moe_hybrid *h, uint32_t lm, const uint32_t *act, uint32_t n,
		  const struct hyb_balancer_feedback *fb, char *err, size_t errlen)
{
	uint32_t n_load = 0, n_evict = 0;

	memcpy(h->sorted, act, sizeof(uint32_t) * n);
	qsort(h->sorted, n, sizeof(uint32_t), cmp_u32);
	n = (uint32_t)dedup(h->sorted, n);
	if (hyb_balancer_step(h->bal, lm, h->sorted, n, fb, h->load, &n_load, h->evict,
			      &n_evict)) {
		snprintf(err, errlen, "expert cache: %s", hyb_last_error());
		return -1;
	}
	switch (hyb_balancer_bottleneck(h->bal, lm)) {
	case HYB_BOUND_IO: h->st.bound_io++; break;
	case HYB_BOUND_CPU: h->st.bound_cpu++; break;
	default: break;
	}
	for (uint32_t i = 0; i < n_evict; i++)
		evict_expert(h, lm, h->evict[i]);
	for (uint32_t i = 0; i < n_load && h->n_free; i++)
		if (h->table[(size_t)lm * h->X + h->load[i]] < 0 &&
		    load_expert(h, lm, h->load[i], h->free[--h->n_free]))
			return dev_fail(h, err, errlen, "loading experts");
	return 0;
}

int hyb_moe_hybrid_end(struct hyb_moe_hybrid *h, uint32_t l, const uint32_t *active,
		       uint32_t n_cpu, uint32_t n, const uint32_t *start, float *out, double cpu_s,
		       const uint32_t *next, uint32_t n_next, char *err, size_t errlen)
{
	const uint32_t lm = l - h->lead;
	struct hyb_balancer_feedback *fb = &h->fb[lm];
	/* a graph step's executor: the host clock (the device's is the launching thread's) */
	double t0 = h->stepping ? hyb_now() : hyb_device_now(h->dev), t1;

	if (h->stepping) {
		if (hyb_moe_graph_outputs(h->graph)) {
			snprintf(err, errlen, "expert cache: the step's graph failed");
			return -1;
		}
		t1 = hyb_now();
		h->st.stall_s += t1 - t0;
		h->lst[lm].stall_s += t1 - t0;
		fb->stall_s = t1 - t0;
		fb->dev_s = t1 - h->t_graph;
		for (uint32_t i = 0; i < n - n_cpu; i++)
			memcpy(out + (size_t)start[active[n_cpu + i]] * h->E,
			       h->h_y + (size_t)h->dev_r0[i] * h->E,
			       4ull * h->E * (h->dev_r0[i + 1] - h->dev_r0[i]));
	} else if (h->n_dev || h->sh_now) {
		double k_s;

		if (hyb_device_sync(h->dev, h->ev_out))
			return dev_fail(h, err, errlen, "waiting for the experts");
		t1 = hyb_device_now(h->dev);
		h->st.stall_s += t1 - t0;
		h->lst[lm].stall_s += t1 - t0;
		fb->stall_s = t1 - t0;
		fb->dev_s = t1 - h->t_begin;
		if (t1 - t0 > 0)
			h->st.dev_ffn_s += t1 - t0;
		if (!hyb_device_elapsed(h->dev, h->ev_in, h->ev_k, &k_s))
			h->st.dev_kernel_s += k_s;
		/* device expert i's rows are its pairs', in order (begin) */
		for (uint32_t i = 0; i < n - n_cpu; i++)
			memcpy(out + (size_t)start[active[n_cpu + i]] * h->E,
			       h->h_y + (size_t)h->dev_r0[i] * h->E,
			       4ull * h->E * (h->dev_r0[i + 1] - h->dev_r0[i]));
	} else {
		fb->stall_s = fb->dev_s = 0;
	}
	h->st.cpu_ffn_s += cpu_s;
	h->lst[lm].cpu_s += cpu_s;
	fb->cpu_s = cpu_s;
	fb->n_active = n;
	fb->backlog_s = loads_in_flight(h) * h->group_load_s;
	t0 = h->stepping ? hyb_now() : hyb_device_now(h->dev);
	/*
	 * This layer for the next token, unless the layer before decided it for
	 * this one from its prediction; the next layer for this token from
	 * this one's (its loads then have the time until that layer runs).
	 */
	if (!h->predicted[lm]) {
		fb->window_s = h->token_s;
		if (decide(h, lm, active, n, fb, err, errlen))
			return -1;
	}
	h->predicted[lm] = false;
	if (h->prefetch && n_next && lm + 1 < h->n_moe) {
		struct hyb_balancer_feedback *nf = &h->fb[lm + 1];

		nf->window_s = h->token_s / h->m->hp.n_layer;
		nf->backlog_s = fb->backlog_s;
		if (decide(h, lm + 1, next, n_next, nf, err, errlen))
			return -1;
		h->predicted[lm + 1] = true;
	}
	h->st.balancer_s += (h->stepping ? hyb_now() : hyb_device_now(h->dev)) - t0;
	return 0;
}

int hyb_moe_hybrid_router_queue(struct hyb_moe_hybrid *h, uint32_t l)
{
	const struct hyb_weight *w;

	h->rt_pending = h->rt_next = false;
	if (!h->rt_w || l < h->lead || !h->rt_w[l - h->lead])
		return 0;
	for (uint32_t k = 0; k < 2; k++) {
		const uint32_t lm = l - h->lead + k;

		/* k = 1: the next layer's router on this input, for the prefetch */
		if (k && (!h->prefetch || lm >= h->n_moe || !h->rt_w[lm]))
			break;
		w = &layer(h, lm)->gate_inp;
		const struct hyb_dev_matvec mv = {
			.type = w->type, .n_in = h->E, .n_out = h->X, .w = h->rt_w[lm],
			.x = hyb_hdense_xn(h->hd), .y = h->d_logits + 4ull * k * h->X,
		};

		if (hyb_device_matvec(h->dev, HYB_STREAM_COMPUTE, &mv))
			return -1;
		h->rt_next = k == 1;
	}
	h->rt_pending = true;
	h->rt_layer = l;
	return 1;
}

int hyb_moe_hybrid_router_down(struct hyb_moe_hybrid *h)
{
	if (!h->rt_pending)
		return 0;
	if (hyb_device_record(h->dev, HYB_STREAM_COMPUTE, h->ev_rt) ||
	    hyb_device_wait(h->dev, HYB_STREAM_CRITICAL, h->ev_rt) ||
	    hyb_device_d2h(h->dev, HYB_STREAM_CRITICAL, h->h_logits, h->d_logits,
			   4ull * h->X * (h->rt_next ? 2 : 1)) ||
	    hyb_device_record(h->dev, HYB_STREAM_CRITICAL, h->ev_rt))
		return -1;
	h->st.critical_bytes += 4ull * h->X * (h->rt_next ? 2 : 1);
	return 0;
}

int hyb_moe_hybrid_router_logits(struct hyb_moe_hybrid *h, uint32_t l, float *logits)
{
	if (h->stepping) { /* landed before the step's host function handed the layer over */
		memcpy(logits, h->h_logits, 4ull * h->X);
		return 1;
	}
	if (!h->rt_pending || h->rt_layer != l)
		return 0;
	h->rt_pending = false;
	if (hyb_device_sync(h->dev, h->ev_rt))
		return -1;
	memcpy(logits, h->h_logits, 4ull * h->X);
	return 1;
}

bool hyb_moe_hybrid_router_next_logits(struct hyb_moe_hybrid *h, uint32_t l, float *logits)
{
	if (h->stepping) { /* the row came down with the layer's (router_down at the capture) */
		const uint32_t lm = l - h->lead;

		if (!h->prefetch || lm + 1 >= h->n_moe || !h->rt_w[lm + 1])
			return false;
		memcpy(logits, h->h_logits + h->X, 4ull * h->X);
		return true;
	}
	/* (router_logits waited for both rows) */
	if (!h->rt_next || h->rt_pending || h->rt_layer != l)
		return false;
	h->rt_next = false;
	memcpy(logits, h->h_logits + h->X, 4ull * h->X);
	return true;
}

bool hyb_moe_hybrid_shared_out(struct hyb_moe_hybrid *h, float *so, float *logit)
{
	if (!h->sh_now)
		return false;
	h->sh_now = false;
	memcpy(so, h->h_so, 4ull * h->E);
	if (logit)
		*logit = h->h_so[h->E];
	return true;
}

/* ---- graph steps (moe_graph.c) ------------------------------------------------------- */

const char *hyb_moe_hybrid_graph_refusal(const struct hyb_moe_hybrid *h)
{
	if (!h->want_graph)
		return "not asked for";
	if (!h->hd || !hyb_hdense_head_on(h->hd))
		return "the head is not on the device";
	for (uint32_t l = 0; l < h->m->hp.n_layer; l++)
		if (!hyb_hdense_layer_on(h->hd, l) || hyb_hdense_teal_on(h->hd, l))
			return "not every attention block is on the device (or TEAL's)";
	if (!h->rt_w)
		return "the routers are not on the device";
	for (uint32_t lm = 0; lm < h->n_moe; lm++)
		if (!h->rt_w[lm])
			return "a router is not on the device";
	if (h->rows != h->K)
		return "several sequences";
	if (!h->d_list)
		return "no room for the step's lists";
	return NULL;
}

hyb_dptr hyb_moe_hybrid_pos_at(const struct hyb_moe_hybrid *h)
{
	return h->d_list + 8ull * (1 + 3 * h->K);
}

uint32_t *hyb_moe_hybrid_host_pos(const struct hyb_moe_hybrid *h)
{
	return h->h_list + 2 * (1 + 3 * h->K);
}

struct hyb_moe_graph *hyb_moe_hybrid_graph(const struct hyb_moe_hybrid *h)
{
	return h->graph;
}

bool hyb_moe_hybrid_graph_wanted(const struct hyb_moe_hybrid *h)
{
	return h->want_graph;
}

void hyb_moe_hybrid_graph_off(struct hyb_moe_hybrid *h, const char *why)
{
	struct hyb_moe_graph *g = h->graph;

	h->want_graph = false;
	snprintf(h->graph_note, sizeof(h->graph_note), "queued as they go, not one graph a step: %s",
		 why);
	hyb_moe_graph_free(g); /* clears h->graph */
}

void hyb_moe_hybrid_set_graph(struct hyb_moe_hybrid *h, struct hyb_moe_graph *g)
{
	/* loads a failed step decided and did not issue: issued now, or the slot reads as loaded */
	for (uint32_t i = 0; !g && i < h->n_pend; i++)
		if (h->slots[h->pend[i]].layer >= 0)
			issue_load(h, h->pend[i]);
	h->n_pend = 0;
	h->stepping = false;
	h->graph = g;
	if (g) /* what has landed so far: hyb_moe_hybrid_step_begin keeps it current */
		for (uint32_t s = 0; s < h->n_slots; s++)
			h->landed[s] = false;
}

void hyb_moe_hybrid_step_begin(struct hyb_moe_hybrid *h)
{
	const double now = hyb_device_now(h->dev);

	if (h->t_token_last > 0)
		h->token_s = now - h->t_token_last;
	h->t_token_last = now;
	h->st.tokens++;
	h->stepping = true;
	for (uint32_t s = 0; s < h->n_slots; s++)
		if (h->slots[s].layer >= 0 && !h->landed[s])
			h->landed[s] = hyb_device_done(h->dev, h->slots[s].ev);
}

int hyb_moe_hybrid_step_end(struct hyb_moe_hybrid *h, char *err, size_t errlen)
{
	const double t0 = hyb_device_now(h->dev);

	h->stepping = false;
	/* the capture's queueing left the last layer's router looking pending */
	h->rt_pending = h->rt_next = false;
	for (uint32_t i = 0; i < h->n_pend; i++)
		if (h->slots[h->pend[i]].layer >= 0 && issue_load(h, h->pend[i])) {
			h->n_pend = 0;
			return dev_fail(h, err, errlen, "loading experts");
		}
	h->n_pend = 0;
	h->st.balancer_s += hyb_device_now(h->dev) - t0;
	return 0;
}

int hyb_moe_hybrid_queue_layer(struct hyb_moe_hybrid *h, uint32_t l)
{
	const uint32_t lm = l - h->lead, K = h->K;
	const struct hyb_layer *L = layer(h, lm);
	const hyb_dptr xn = hyb_hdense_xn(h->hd);
	const struct hyb_dev_matvec_table gate = {
		.type = L->gate_exps.type, .n_in = h->E, .n_out = h->F, .w = h->cache,
		.w_stride = h->slot_bytes, .n_w = h->n_slots, .x = xn, .n_x = 1, .y = h->d_g,
		.n_y = K, .items = h->d_list, .max = K,
	};
	struct hyb_dev_matvec_table up = gate, down = gate;
	const bool sh = h->sh_w && h->sh_w[(size_t)lm * 4 + 1];

	up.type = L->up_exps.type;
	up.w = h->cache + h->off_up;
	up.y = h->d_u;
	down = (struct hyb_dev_matvec_table){
		.type = L->down_exps.type, .n_in = h->F, .n_out = h->E, .w = h->cache + h->off_down,
		.w_stride = h->slot_bytes, .n_w = h->n_slots, .x = h->d_g, .n_x = K, .y = h->d_y,
		.n_y = K, .items = h->d_list + 4ull * (1 + 3 * K), .max = K,
	};
	/* the lists the layer's host function wrote; every row, used or not, is activated */
	if (hyb_device_h2d(h->dev, HYB_STREAM_CRITICAL, h->d_list, h->h_list,
			   8ull * (1 + 3 * K)) ||
	    hyb_device_record(h->dev, HYB_STREAM_CRITICAL, h->ev_in) ||
	    hyb_device_wait(h->dev, HYB_STREAM_COMPUTE, h->ev_in) ||
	    hyb_device_matvec_table(h->dev, HYB_STREAM_COMPUTE, &gate) ||
	    hyb_device_matvec_table(h->dev, HYB_STREAM_COMPUTE, &up) ||
	    hyb_device_ffn_act(h->dev, HYB_STREAM_COMPUTE, h->d_g, h->d_u, K * h->F,
			       h->m->hp.act) ||
	    hyb_device_matvec_table(h->dev, HYB_STREAM_COMPUTE, &down) ||
	    (sh && queue_shared(h, lm, xn)) ||
	    hyb_device_record(h->dev, HYB_STREAM_COMPUTE, h->ev_k) ||
	    hyb_device_wait(h->dev, HYB_STREAM_CRITICAL, h->ev_k) ||
	    hyb_device_d2h(h->dev, HYB_STREAM_CRITICAL, h->h_y, h->d_y, 4ull * K * h->E) ||
	    (sh && hyb_device_d2h(h->dev, HYB_STREAM_CRITICAL, h->h_so, h->d_so,
				  4ull * (h->E + 1))))
		return -1;
	return 0;
}

/* ---- what it did ---------------------------------------------------------------------- */

struct hyb_device *hyb_moe_hybrid_device(const struct hyb_moe_hybrid *h)
{
	return h->dev;
}

struct hyb_hdense *hyb_moe_hybrid_dense(const struct hyb_moe_hybrid *h)
{
	return h->hd;
}

void hyb_moe_hybrid_xn_on_device(struct hyb_moe_hybrid *h, bool on)
{
	h->xn_dev = on;
}

void hyb_moe_hybrid_add_dense_time(struct hyb_moe_hybrid *h, double attn_s, double head_s)
{
	h->st.attn_s += attn_s;
	h->st.head_s += head_s;
}

void hyb_moe_hybrid_stats(const struct hyb_moe_hybrid *h, struct hyb_hybrid_stats *out)
{
	*out = h->st;
}

void hyb_moe_hybrid_stats_reset(struct hyb_moe_hybrid *h)
{
	memset(&h->st, 0, sizeof(h->st));
	memset(h->lst, 0, sizeof(*h->lst) * h->n_moe);
}

int hyb_moe_hybrid_layer_stats(const struct hyb_moe_hybrid *h, uint32_t l,
			       struct hyb_hybrid_layer_stats *out)
{
	memset(out, 0, sizeof(*out));
	if (l >= h->m->hp.n_layer)
		return -EINVAL;
	if (l >= h->lead)
		*out = h->lst[l - h->lead];
	return 0;
}

void hyb_moe_hybrid_cache(const struct hyb_moe_hybrid *h, uint64_t *resident, uint64_t *slots)
{
	*slots = h->n_slots;
	*resident = h->n_slots - h->n_free;
}

void hyb_moe_hybrid_offload(const struct hyb_moe_hybrid *h, struct hyb_hybrid_offload *out)
{
	memset(out, 0, sizeof(*out));
	out->cache_bytes = (uint64_t)h->n_slots * h->slot_bytes;
	out->experts = true;
	out->shared_bytes = h->sh_bytes;
	out->router_bytes = h->rt_bytes;
	snprintf(out->graph_note, sizeof(out->graph_note), "%s",
		 h->graph || h->want_graph ? "one device graph a step" :
		 h->graph_note[0] ? h->graph_note : "queued as they go (--graph: one graph a step)");
	if (h->hd) {
		out->attn_layers = hyb_hdense_layers_on(h->hd);
		out->head = hyb_hdense_head_on(h->hd);
		out->dense_bytes = hyb_hdense_bytes(h->hd);
	}
	snprintf(out->cache_note, sizeof(out->cache_note),
		 "%u expert slots of %.2f MB (%.1f%% of the %u x %u routed experts); on the "
		 "device too: attention of %u layers, %s, %s; routers on the %s",
		 h->n_slots, h->slot_bytes / 1e6, 100.0 * h->n_slots / ((double)h->n_moe * h->X),
		 h->n_moe, h->X, out->attn_layers, out->head ? "the head" : "not the head",
		 h->sh_w ? "the shared experts" : h->S ? "not the shared experts" :
		 "no shared experts", h->rt_w ? "device" : "CPU");
}

int hyb_moe_hybrid_table(const struct hyb_moe_hybrid *h, int32_t *out)
{
	for (uint32_t l = 0; l < h->m->hp.n_layer; l++)
		for (uint32_t e = 0; e < h->X; e++)
			out[(size_t)l * h->X + e] = l < h->lead ? -1 :
				h->table[(size_t)(l - h->lead) * h->X + e];
	return 0;
}

bool hyb_moe_hybrid_prefetching(const struct hyb_moe_hybrid *h)
{
	return h->prefetch;
}

double hyb_moe_hybrid_lambda(const struct hyb_moe_hybrid *h, uint32_t l)
{
	if (l < h->lead || l >= h->m->hp.n_layer ||
	    (h->policy != HYB_POLICY_TAM && h->policy != HYB_POLICY_TAM_ADAPTIVE &&
			    h->policy != HYB_POLICY_DYNAMIC))
		return NAN;
	return hyb_balancer_lambda(h->bal, l - h->lead);
}
