// SPDX-License-Identifier: MIT
/*
 * Graphs (hyb/device.h; docs/DEVICE.md "Graphs"): the rules of a capture,
 * kept here for every implementation so that the CPU device refuses what a
 * GPU's stream capture refuses, and the recorder for an implementation
 * without graphs of its own.
 *
 * Rules, after CUDA's stream capture (thread-local mode): the origin stream
 * and the streams that waited for an event recorded in the capture are in
 * it; work on any other stream, a wait for an event recorded before it, and
 * every call that is not queued work are refused, and spoil the capture (as
 * CUDA invalidates one); at the end every joined stream's work must be
 * joined back into the origin, or the graph would have loose ends.
 *
 * The recorder keeps each call's arguments; a launch makes the same calls
 * through the front end again, so each is checked against the live
 * allocations once more, and the implementation runs and times them as any
 * other work. An event recorded in the capture becomes one of the graph's
 * own (a record per slot), so the caller's events are free again after it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device_graph.h"

struct cap_event {
	struct hyb_device_event *ev;
	uint8_t s;
	uint64_t at;       /* the work of s it follows */
	uint32_t slot;     /* recorder: the graph's event */
};

struct hyb_capture {
	int origin;
	unsigned member;                 /* a bit per stream */
	uint64_t work[HYB_N_STREAMS];    /* work queued on each in the capture */
	uint64_t joined[HYB_N_STREAMS];  /* the origin waited for work up to this */
	struct cap_event *evs;
	uint32_t n_evs, cap_evs, n_slots;
	bool native;
	int spoilt;                      /* the first error's code; 0: none */
	char why[256];
	struct hyb_device_stats st0;     /* the stats before it: a launch counts the work */
	struct hyb_cap_node *nodes;
	uint32_t n_nodes, cap_nodes;
};

struct hyb_device_graph {
	int s;
	void *native;
	struct hyb_cap_node *nodes;
	uint32_t n_nodes, n_ev;
	struct hyb_device_event **ev;
	struct hyb_device_stats delta;   /* native: the work one launch queues */
};

static const char *const stream_name[HYB_N_STREAMS] = { "COMPUTE", "CRITICAL", "RELOAD" };

static const char *const kind_name[] = {
	[CAP_H2D] = "h2d", [CAP_D2H] = "d2h", [CAP_HOST_FN] = "host fn",
	[CAP_SPARSE_FFN] = "sparse ffn", [CAP_ADD] = "add", [CAP_FFN_ACT] = "ffn_act",
	[CAP_RMSNORM] = "rmsnorm", [CAP_MATVEC] = "matvec", [CAP_MATVEC_GROUP] = "matvec group",
	[CAP_MATVEC_TABLE] = "matvec table",
	[CAP_ATTENTION] = "attention", [CAP_PREDICT] = "predict", [CAP_TEAL] = "teal matvec",
	[CAP_RECORD] = "record", [CAP_WAIT] = "wait",
};

void hyb_capture_spoil(struct hyb_device *d, int rc)
{
	struct hyb_capture *c = d->cap;

	if (c && !c->spoilt) {
		c->spoilt = rc;
		snprintf(c->why, sizeof(c->why), "%s", d->err);
	}
}

/* A capture already spoilt: every later op is refused with its first error. */
static int spoilt(struct hyb_device *d)
{
	struct hyb_capture *c = d->cap;

	return hyb_device_fail(d, c->spoilt, "capture spoilt earlier: %s", c->why);
}

static int not_member(struct hyb_device *d, int s, const char *what)
{
	if (s == HYB_STREAM_RELOAD)
		return hyb_device_fail(d, -EBUSY, "%s during a capture: the RELOAD stream is "
				       "never captured", what);
	return hyb_device_fail(d, -EBUSY, "%s during a capture: the %s stream is not in it "
			       "(a stream joins by waiting for an event recorded in it)", what,
			       stream_name[s]);
}

static int push_node(struct hyb_device *d, const struct hyb_cap_node *n)
{
	struct hyb_capture *c = d->cap;
	struct hyb_cap_node *t;

	if (c->n_nodes == c->cap_nodes) {
		const uint32_t cap = c->cap_nodes ? 2 * c->cap_nodes : 64;

		if (!(t = realloc(c->nodes, cap * sizeof(*t))))
			return hyb_device_fail(d, -ENOMEM, "capture: out of host memory");
		c->nodes = t;
		c->cap_nodes = cap;
	}
	t = &c->nodes[c->n_nodes];
	*t = *n;
	if (n->kind == CAP_MATVEC_GROUP) {
		struct hyb_dev_matvec *items = malloc(n->u.group.n * sizeof(*items));

		if (!items)
			return hyb_device_fail(d, -ENOMEM, "capture: out of host memory");
		memcpy(items, n->u.group.items, n->u.group.n * sizeof(*items));
		t->u.group.items = items;
	}
	c->n_nodes++;
	return 1;
}

int hyb_capture_take(struct hyb_device *d, int s, const struct hyb_cap_node *n)
{
	struct hyb_capture *c = d->cap;

	if (!c)
		return 0;
	if (c->spoilt)
		return spoilt(d);
	if (!(c->member >> s & 1))
		return not_member(d, s, kind_name[n->kind]);
	c->work[s]++;
	if (c->native)
		return 0;
	struct hyb_cap_node t = *n;

	t.s = (uint8_t)s;
	return push_node(d, &t);
}

int hyb_capture_busy(struct hyb_device *d, const char *what)
{
	if (!d->cap)
		return 0;
	return hyb_device_fail(d, -EBUSY, "%s during a capture (only queued work is captured)",
			       what);
}

static struct cap_event *find_event(struct hyb_capture *c, const struct hyb_device_event *ev)
{
	for (uint32_t i = 0; i < c->n_evs; i++)
		if (c->evs[i].ev == ev)
			return &c->evs[i];
	return NULL;
}

int hyb_capture_record(struct hyb_device *d, int s, struct hyb_device_event *ev)
{
	struct hyb_capture *c = d->cap;
	struct cap_event *e;

	if (!c)
		return 0;
	if (c->spoilt)
		return spoilt(d);
	if (!(c->member >> s & 1))
		return not_member(d, s, "record");
	if (!(e = find_event(c, ev))) {
		if (c->n_evs == c->cap_evs) {
			const uint32_t cap = c->cap_evs ? 2 * c->cap_evs : 16;
			struct cap_event *t = realloc(c->evs, cap * sizeof(*t));

			if (!t)
				return hyb_device_fail(d, -ENOMEM, "capture: out of host memory");
			c->evs = t;
			c->cap_evs = cap;
		}
		e = &c->evs[c->n_evs++];
		e->ev = ev;
	}
	e->s = (uint8_t)s;
	e->at = c->work[s];
	e->slot = c->n_slots++;
	return c->native ? 0 : push_node(d, &(struct hyb_cap_node){ .kind = CAP_RECORD,
								    .s = (uint8_t)s,
								    .u.slot = e->slot });
}

int hyb_capture_wait(struct hyb_device *d, int s, struct hyb_device_event *ev)
{
	struct hyb_capture *c = d->cap;
	const struct cap_event *e;

	if (!c)
		return 0;
	if (c->spoilt)
		return spoilt(d);
	if (s == HYB_STREAM_RELOAD)
		return not_member(d, s, "wait");
	if (!(e = find_event(c, ev)))
		return hyb_device_fail(d, -EBUSY, "wait during a capture: the event was not "
				       "recorded in it (a graph cannot wait for work outside it)");
	c->member |= 1u << s;
	if (s == c->origin && e->at > c->joined[e->s])
		c->joined[e->s] = e->at;
	return c->native ? 0 : push_node(d, &(struct hyb_cap_node){ .kind = CAP_WAIT,
								    .s = (uint8_t)s,
								    .u.slot = e->slot });
}

static void free_nodes(struct hyb_cap_node *nodes, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		if (nodes[i].kind == CAP_MATVEC_GROUP)
			free((void *)nodes[i].u.group.items);
	free(nodes);
}

static void capture_free(struct hyb_capture *c)
{
	free_nodes(c->nodes, c->n_nodes);
	free(c->evs);
	free(c);
}

void hyb_capture_drop(struct hyb_device *d)
{
	struct hyb_capture *c = d->cap;

	if (!c)
		return;
	if (c->native)
		d->ops->capture_end(d, (enum hyb_stream)c->origin, false, NULL);
	d->st = c->st0;
	d->cap = NULL;
	capture_free(c);
}

bool hyb_device_capturing(const struct hyb_device *d)
{
	return d && d->cap;
}

int hyb_device_capture_begin(struct hyb_device *d, enum hyb_stream s)
{
	struct hyb_capture *c;
	int rc;

	if (!d)
		return -EINVAL;
	if (d->faulted)
		return -EIO;
	if (d->cap)
		return hyb_device_fail(d, -EBUSY, "capture begin: a capture is under way");
	if ((int)s < 0 || s >= HYB_STREAM_RELOAD)
		return hyb_device_fail(d, -EINVAL, "capture begin: stream %d (COMPUTE or "
				       "CRITICAL)", (int)s);
	if (!(c = calloc(1, sizeof(*c))))
		return hyb_device_fail(d, -ENOMEM, "capture: out of host memory");
	c->origin = s;
	c->member = 1u << s;
	c->native = d->ops->capture_begin != NULL;
	c->st0 = d->st;
	if (c->native && (rc = d->ops->capture_begin(d, s))) {
		capture_free(c);
		return rc;
	}
	d->cap = c;
	return 0;
}

static void stats_sub(struct hyb_device_stats *a, const struct hyb_device_stats *b)
{
	for (int s = 0; s < HYB_N_STREAMS; s++) {
		a->h2d_bytes[s] -= b->h2d_bytes[s];
		a->d2h_bytes[s] -= b->d2h_bytes[s];
		a->copies[s] -= b->copies[s];
	}
	a->kernels -= b->kernels;
	a->kernel_bytes -= b->kernel_bytes;
}

static void stats_add(struct hyb_device_stats *a, const struct hyb_device_stats *b)
{
	for (int s = 0; s < HYB_N_STREAMS; s++) {
		a->h2d_bytes[s] += b->h2d_bytes[s];
		a->d2h_bytes[s] += b->d2h_bytes[s];
		a->copies[s] += b->copies[s];
	}
	a->kernels += b->kernels;
	a->kernel_bytes += b->kernel_bytes;
}

int hyb_device_capture_end(struct hyb_device *d, struct hyb_device_graph **out)
{
	struct hyb_device_graph *g = NULL;
	struct hyb_capture *c;
	void *native = NULL;
	int rc = 0;

	if (out)
		*out = NULL;
	if (!d || !out)
		return -EINVAL;
	if (!(c = d->cap))
		return hyb_device_fail(d, -EINVAL, "capture end: no capture under way");
	for (int t = 0; t < HYB_N_STREAMS && !c->spoilt; t++)
		if (t != c->origin && c->work[t] > c->joined[t])
			hyb_device_fail(d, -EINVAL, "capture: the %s stream's last work is not "
					"joined back (the %s stream must wait for an event recorded "
					"after it)", stream_name[t], stream_name[c->origin]);
	if (!c->spoilt && !(g = calloc(1, sizeof(*g))))
		hyb_device_fail(d, -ENOMEM, "capture: out of host memory");
	if (!c->spoilt && !c->native && c->n_slots &&
	    !(g->ev = calloc(c->n_slots, sizeof(*g->ev))))
		hyb_device_fail(d, -ENOMEM, "capture: out of host memory");
	for (uint32_t i = 0; !c->spoilt && !c->native && i < c->n_slots; i++, g->n_ev++)
		if (!(g->ev[i] = d->ops->event_new(d, false)))
			hyb_device_fail(d, -ENOMEM, "capture: out of host memory for events");
	if (c->native) {
		/* the implementation's end, even when spoilt: it must leave capture mode */
		const bool ok = !c->spoilt;

		rc = d->ops->capture_end(d, (enum hyb_stream)c->origin, ok, &native);
		if (rc && ok)
			hyb_capture_spoil(d, rc);
	}
	/* the capture's work counts when it is launched, not now */
	g ? (g->delta = d->st, stats_sub(&g->delta, &c->st0)) : (void)0;
	d->st = c->st0;
	d->cap = NULL;
	if (c->spoilt) {
		rc = c->spoilt;
		hyb_device_fail(d, rc, "%s", c->why);
		if (g) {
			for (uint32_t i = 0; i < g->n_ev; i++)
				d->ops->event_free(d, g->ev[i]);
			free(g->ev);
			free(g);
		}
		capture_free(c);
		return rc;
	}
	g->s = c->origin;
	g->native = native;
	g->nodes = c->nodes;
	g->n_nodes = c->n_nodes;
	c->nodes = NULL;
	c->n_nodes = 0;
	capture_free(c);
	*out = g;
	return 0;
}

static int replay(struct hyb_device *d, const struct hyb_device_graph *g,
		  const struct hyb_cap_node *n)
{
	const enum hyb_stream s = (enum hyb_stream)n->s;

	switch ((enum hyb_cap_kind)n->kind) {
	case CAP_H2D:
		return hyb_device_h2d(d, s, n->u.copy.dev, n->u.copy.host, n->u.copy.len);
	case CAP_D2H:
		return hyb_device_d2h(d, s, n->u.copy.host, n->u.copy.dev, n->u.copy.len);
	case CAP_HOST_FN:
		return hyb_device_host_fn(d, s, n->u.fn.fn, n->u.fn.arg);
	case CAP_SPARSE_FFN:
		return hyb_device_sparse_ffn(d, s, &n->u.ffn);
	case CAP_ADD:
		return hyb_device_add(d, s, n->u.add.y, n->u.add.x, n->u.add.n);
	case CAP_FFN_ACT:
		return hyb_device_ffn_act(d, s, n->u.act.g, n->u.act.u, n->u.act.n, n->u.act.act);
	case CAP_RMSNORM:
		return hyb_device_rmsnorm_rows(d, s, n->u.norm.y, n->u.norm.x, n->u.norm.w,
					       n->u.norm.n, n->u.norm.rows, n->u.norm.eps);
	case CAP_MATVEC:
		return hyb_device_matvec(d, s, &n->u.mv);
	case CAP_MATVEC_GROUP:
		return hyb_device_matvec_group(d, s, n->u.group.items, n->u.group.n);
	case CAP_MATVEC_TABLE:
		return hyb_device_matvec_table(d, s, &n->u.table);
	case CAP_ATTENTION:
		return hyb_device_attention(d, s, &n->u.attn);
	case CAP_PREDICT:
		return hyb_device_predict(d, s, &n->u.pred);
	case CAP_TEAL:
		return hyb_device_teal_matvec(d, s, &n->u.teal);
	case CAP_RECORD:
		return hyb_device_record(d, s, g->ev[n->u.slot]);
	case CAP_WAIT:
		return hyb_device_wait(d, s, g->ev[n->u.slot]);
	}
	return hyb_device_fail(d, -EINVAL, "graph: node kind %d", n->kind);
}

int hyb_device_graph_launch(struct hyb_device *d, struct hyb_device_graph *g)
{
	int rc;

	if (!d)
		return -EINVAL;
	if (d->faulted)
		return -EIO;
	if (!g)
		return hyb_device_fail(d, -EINVAL, "graph launch: NULL graph");
	if ((rc = hyb_capture_busy(d, "graph launch")))
		return rc;
	if (g->native) {
		rc = d->ops->graph_launch(d, (enum hyb_stream)g->s, g->native);
		if (!rc)
			stats_add(&d->st, &g->delta);
		return rc;
	}
	for (uint32_t i = 0; i < g->n_nodes; i++)
		if ((rc = replay(d, g, &g->nodes[i])))
			return rc;
	return 0;
}

void hyb_device_graph_free(struct hyb_device *d, struct hyb_device_graph *g)
{
	if (!d || !g)
		return;
	if (g->native)
		d->ops->graph_free(d, g->native);
	for (uint32_t i = 0; i < g->n_ev; i++)
		d->ops->event_free(d, g->ev[i]);
	free(g->ev);
	free_nodes(g->nodes, g->n_nodes);
	free(g);
}
