// SPDX-License-Identifier: MIT
/*
 * One device graph a decode step (moe_graph.h; docs/MOE.md "One graph a
 * step"; KTransformers 3.3).
 *
 * The device's part of a token, queued in this order (COMPUTE runs the
 * kernels, CRITICAL the copies and the host functions):
 *
 *   the position up (pinned, read by every attention: pos_at)
 *   per layer l:
 *     x up; attention block, ffn_norm, the router (COMPUTE)
 *     x, xn and the router's logits down; host function "hand over" (CRITICAL)
 *     MoE layer: the lists up, gate, up, activation, down through them,
 *       the shared expert (COMPUTE); the outputs down; "hand over" again
 *   x up; the head; its logits down
 *
 * "Hand over" posts the executor's semaphore and waits for its answer.
 * The executor thread runs the host side of each layer as the queued
 * decode step did (moe_decode.c): at the first hand-over it takes x, xn and
 * the logits, routes, writes the device's lists (moe_hybrid.c's begin) and
 * answers, so the device's experts start while it computes the CPU's; at
 * the second it takes the device's outputs (end), merges in moe.c's rank
 * order, writes the next x and answers; then it computes the layer's
 * deferred experts while the device runs the next attention. So the CPU's
 * share and the device's overlap as before, the two host waits a layer
 * become host functions inside the graph, and the logits are the queued
 * step's, bit for bit, on the CPU device.
 *
 * The executor makes no device call (the device is the launching thread's):
 * the expert cache reads the slots' load state from what the step's start
 * saw and issues the loads its policy decides after the step. The first
 * step is queued as it goes (workspaces, the RoPE table: nothing may
 * allocate inside a capture), the second is captured, the rest are
 * launches. A failure ends graph steps for the context: the executor
 * stops, and the step reports it.
 */
#include "moe_graph.h"

#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dense.h"
#include "forward/forward_internal.h"
#include "forward/moe.h"
#include "moe_hybrid.h"
#include "util/error.h"

struct hyb_moe_graph {
	struct hyb_ctx *c;
	struct hyb_moe_hybrid *h;
	struct hyb_hdense *hd;
	struct hyb_device *d;
	struct hyb_device_graph *graph;
	struct hyb_device_event *ev_fork, *ev_end;
	hyb_dptr d_pos;
	uint32_t *h_pos;
	uint32_t steps;
	/* host functions -> executor (to), executor -> host functions (from) */
	sem_t to, from;
	pthread_t th;
	bool running, quit;
	atomic_bool failed;
	char err[320];
};

/* ---- the executor ---------------------------------------------------------------------- */

static void fail(struct hyb_moe_graph *g, const char *msg)
{
	snprintf(g->err, sizeof(g->err), "%s", msg);
	atomic_store(&g->failed, true);
	sem_post(&g->from); /* the host function waiting, if one is */
}

/* Layer l's host side: x and xn from the device, the FFN, the residual, x for the next. */
static int layer(struct hyb_moe_graph *g, uint32_t l)
{
	struct hyb_ctx *c = g->c;
	const struct hyb_hparams *hp = &c->m->hp;
	const uint32_t E = hp->n_embd;
	float *hx = hyb_hdense_host_x(g->hd);
	char err[256];

	memcpy(c->x, hx, sizeof(float) * E);
	memcpy(c->xn, hx + E, sizeof(float) * E);
	hyb_moe_hybrid_xn_on_device(g->h, true);
	const int rc = hyb_moe_decode_ffn(c, l, err, sizeof(err));

	hyb_moe_hybrid_xn_on_device(g->h, false);
	if (rc) {
		char msg[300];

		snprintf(msg, sizeof(msg), "layer %u: %s", l, err);
		fail(g, msg);
		return -1;
	}
	memcpy(hx, c->x, sizeof(float) * E);
	return 0;
}

static void *executor(void *arg)
{
	struct hyb_moe_graph *g = arg;
	const uint32_t L = g->c->m->hp.n_layer;

	for (;;) {
		sem_wait(&g->to); /* layer 0's input has landed (or: quit) */
		if (g->quit)
			return NULL;
		for (uint32_t l = 0; l < L; l++) {
			if (l && (sem_wait(&g->to), g->quit))
				return NULL;
			if (layer(g, l))
				return NULL; /* failed: the step's end stops graph steps */
			/* the last layer defers nothing, and after its answer the context is the caller's */
			const bool last = l + 1 == L;

			sem_post(&g->from);
			/* the layer's deferred experts, while the device runs the next attention */
			if (!last)
				hyb_fwd_moe_deferred(g->c);
		}
	}
}

void hyb_moe_graph_list_ready(struct hyb_moe_graph *g)
{
	sem_post(&g->from);
}

int hyb_moe_graph_outputs(struct hyb_moe_graph *g)
{
	sem_wait(&g->to);
	return g->quit ? -1 : 0;
}

/* The graph's host function: the layer's data has landed; back when the executor says. */
static void hand_over(void *arg)
{
	struct hyb_moe_graph *g = arg;

	if (atomic_load(&g->failed))
		return;
	sem_post(&g->to);
	sem_wait(&g->from);
}

/* ---- the device's part ------------------------------------------------------------------ */

static int queue_step(struct hyb_moe_graph *g)
{
	const struct hyb_hparams *hp = &g->c->m->hp;
	struct hyb_device *d = g->d;
	struct hyb_device_event *ev;

	/* CRITICAL joins COMPUTE's capture here, and COMPUTE waits for its last copy at the end */
	if (hyb_device_record(d, HYB_STREAM_COMPUTE, g->ev_fork) ||
	    hyb_device_wait(d, HYB_STREAM_CRITICAL, g->ev_fork) ||
	    hyb_device_h2d(d, HYB_STREAM_COMPUTE, g->d_pos, g->h_pos, 4))
		return -1;
	for (uint32_t l = 0; l < hp->n_layer; l++) {
		const bool moe = l >= hp->n_dense_lead;

		if (hyb_hdense_x_up(g->hd) || hyb_hdense_attention_at(g->hd, l, g->d_pos) ||
		    (moe && hyb_moe_hybrid_router_queue(g->h, l) < 0) ||
		    hyb_hdense_x_down(g->hd, true, &ev) ||
		    (moe && hyb_moe_hybrid_router_down(g->h)) ||
		    hyb_device_host_fn(d, HYB_STREAM_CRITICAL, hand_over, g))
			return -1;
		if (moe && (hyb_moe_hybrid_queue_layer(g->h, l) ||
			    hyb_device_host_fn(d, HYB_STREAM_CRITICAL, hand_over, g)))
			return -1;
	}
	/* an event recorded in a capture orders work inside it only: ev_end is recorded after */
	return hyb_hdense_x_up(g->hd) || hyb_hdense_head_queue(g->hd, &ev) ||
	       hyb_device_wait(d, HYB_STREAM_COMPUTE, ev) ? -1 : 0;
}

/* ---- life -------------------------------------------------------------------------------- */

static void stop(struct hyb_moe_graph *g)
{
	if (!g->running)
		return;
	g->quit = true;
	sem_post(&g->to);
	sem_post(&g->to);
	pthread_join(g->th, NULL);
	g->running = false;
	sem_destroy(&g->to);
	sem_destroy(&g->from);
}

struct hyb_moe_graph *hyb_moe_graph_new(struct hyb_ctx *c, char *err, size_t errlen)
{
	struct hyb_moe_graph *g;
	const char *why = hyb_moe_hybrid_graph_refusal(c->moe_hybrid);

	if (why) {
		snprintf(err, errlen, "%s", why);
		return NULL;
	}
	if (!(g = calloc(1, sizeof(*g)))) {
		snprintf(err, errlen, "graph steps: out of memory");
		return NULL;
	}
	g->c = c;
	g->h = c->moe_hybrid;
	g->hd = hyb_moe_hybrid_dense(g->h);
	g->d = hyb_moe_hybrid_device(g->h);
	g->d_pos = hyb_moe_hybrid_pos_at(g->h);
	g->h_pos = hyb_moe_hybrid_host_pos(g->h);
	g->ev_fork = hyb_device_event_new(g->d);
	g->ev_end = hyb_device_event_new(g->d);
	if (!g->ev_fork || !g->ev_end || sem_init(&g->to, 0, 0) || sem_init(&g->from, 0, 0)) {
		snprintf(err, errlen, "graph steps: out of memory");
		hyb_moe_graph_free(g);
		return NULL;
	}
	if (pthread_create(&g->th, NULL, executor, g)) {
		snprintf(err, errlen, "graph steps: no executor thread");
		sem_destroy(&g->to);
		sem_destroy(&g->from);
		hyb_moe_graph_free(g);
		return NULL;
	}
	g->running = true;
	hyb_moe_hybrid_set_graph(g->h, g);
	return g;
}

void hyb_moe_graph_free(struct hyb_moe_graph *g)
{
	if (!g)
		return;
	stop(g);
	hyb_moe_hybrid_set_graph(g->h, NULL);
	hyb_device_graph_free(g->d, g->graph);
	if (g->ev_fork)
		hyb_device_event_free(g->d, g->ev_fork);
	if (g->ev_end)
		hyb_device_event_free(g->d, g->ev_end);
	free(g);
}

int hyb_moe_graph_step(struct hyb_moe_graph *g, int32_t token, float *logits, char *err,
		       size_t errlen)
{
	struct hyb_ctx *c = g->c;
	const struct hyb_hparams *hp = &c->m->hp;
	int rc = 0;

	if (!g->running) {
		snprintf(err, errlen, "graph steps: stopped by an earlier failure");
		return -1;
	}
	hyb_fwd_embed(c, &token, 1);
	memcpy(hyb_hdense_host_x(g->hd), c->x, sizeof(float) * hp->n_embd);
	*g->h_pos = c->n_past;
	/* the prompt's rows (run on the CPU) first, outside the graph */
	if (hyb_hdense_kv_up(g->hd, c->kcache, c->vcache, c->n_past)) {
		snprintf(err, errlen, "KV cache to the device: %s", hyb_device_error(g->d));
		return -1;
	}
	hyb_moe_hybrid_step_begin(g->h);
	if (!g->graph && g->steps) {
		rc = hyb_device_capture_begin(g->d, HYB_STREAM_COMPUTE);
		if (!rc) {
			rc = queue_step(g);
			/* ended whatever happened: the stream must leave capture mode */
			if (hyb_device_capture_end(g->d, &g->graph))
				rc = -1;
		}
		if (rc)
			goto device;
	}
	if ((g->graph ? hyb_device_graph_launch(g->d, g->graph) : queue_step(g)) ||
	    hyb_device_record(g->d, HYB_STREAM_COMPUTE, g->ev_end) ||
	    hyb_device_sync(g->d, g->ev_end))
		goto device;
	if (atomic_load(&g->failed)) {
		snprintf(err, errlen, "%s", g->err);
		stop(g);
		return -1;
	}
	memcpy(logits, hyb_hdense_head_logits(g->hd), sizeof(float) * hp->n_vocab);
	for (uint32_t l = 0; l < hp->n_layer; l++)
		hyb_hdense_kv_dev_wrote(g->hd, l, c->n_past + 1);
	if (hyb_moe_hybrid_step_end(g->h, err, errlen)) {
		stop(g);
		return -1;
	}
	c->n_past++;
	g->steps++;
	return 0;
device:
	snprintf(err, errlen, "graph step: %s", hyb_device_error(g->d));
	/* host functions still to run find the step failed and return at once */
	atomic_store(&g->failed, true);
	sem_post(&g->from);
	/* and run before g goes: the queued work drains (a faulted device runs nothing more) */
	for (int s = 0; s < 2; s++)
		if (!hyb_device_record(g->d, s ? HYB_STREAM_CRITICAL : HYB_STREAM_COMPUTE, g->ev_end))
			hyb_device_sync(g->d, g->ev_end);
	stop(g);
	return -1;
}
