// SPDX-License-Identifier: MIT
/*
 * The CPU-executed device (hyb/device.h "Model of time"): every operation
 * runs at once, inside the call that queues it, and is placed on a virtual
 * timeline by a small discrete-event model of a GPU with a PCIe link.
 *
 * The model
 *   Clock. Host time now() = CLOCK_MONOTONIC since open - inline + jumped
 *     (virtual_clock: the host work reported + jumped, no wall time at all):
 *     inline is the real time spent inside this device's calls (copies,
 *     kernels, record, wait, done, sync), jumped the sum of the host waits
 *     sync() added. An op queued by a call at host time H (the call's entry)
 *     arrives at H.
 *   Engines. An H2D link, a D2H link (PCIe is full duplex) and one compute
 *     engine (kernels serialize). Each runs one thing at a time.
 *   Streams. Ops of a stream run in queue order: an op becomes its stream's
 *     head when the op before it has completed (or at its arrival, if later);
 *     only heads may start. wait(s, ev) queues a marker on s that completes
 *     when ev's op has completed (zero time, no engine); record(ev, s)
 *     names the last op queued on s (marker included), so ev completes
 *     when it does; an event never recorded, or recorded on an idle stream
 *     that never had work, is complete.
 *   Durations. A copy: lat + len / pcie; a kernel: launch + bytes / hbm,
 *     bytes the memory it moves: sparse_ffn (n_gate + n_up + n_nz) rows
 *     (counts of the CPU operator, so the ReLU early exit is modelled) times
 *     row bytes + 4 n_active + 4 n_embd (xn) + 4 n_embd (y write) [+ 4 n_embd
 *     (y read) when accumulating]; add 8 n; rmsnorm 12 n (x, w, y); matvec
 *     n_out row bytes + 4 n_in (x) + 4 n_out (y write) [+ 4 n_out (y read)];
 *     attention 4 (pos + 1) kv_dim (the K and V rows it attends over, F16)
 *     + 4 kv_dim (row pos written) + 8 q_dim (q read, roped q written) +
 *     8 kv_dim (k likewise) + 4 kv_dim (v) + 4 q_dim (out).
 *   Arbitration, whenever an engine is free: the compute engine starts the
 *     head kernel that became head first (ties: queue order). A link starts,
 *     among the head copies of its direction, first any copy of a stream
 *     other than RELOAD (a "priority" copy: CRITICAL or COMPUTE), the one that
 *     became head first; only if there is none, the next chunk of the RELOAD
 *     head copy.
 *   Chunks (KAIROX 5.1: "critical transfers preempt queued reloads"). A RELOAD
 *     copy is sent in chunks of chunk_bytes: the first chunk costs lat +
 *     bytes / pcie, the others bytes / pcie (the DMA engine pipelines the
 *     chunks of one transfer; lat is paid once per copy, as for any copy).
 *     The link is free between chunks, so a priority copy that becomes head
 *     at H waits at most for the chunk in flight at H (and for priority copies
 *     ahead of it), and every reload chunk not started by then runs after it:
 *     the reload's end, and any event after it, moves back by the priority
 *     copy's duration (less any idle gap the link had anyway). Priority copies
 *     are not cut.
 *   Exactness. The model is simulated in time order, lazily: every call
 *     first runs the simulation up to its own host time H (events strictly
 *     before H), since work queued at H cannot change anything earlier. done()
 *     runs it to now(); sync(ev) runs it until ev's op completes at E (no new
 *     work can arrive while the host is blocked) and, if E > now(), adds
 *     E - now() to jumped. So pre-emption, waits and push-backs propagate
 *     through any chain of events exactly; nothing is fixed before its time.
 *
 * Data. Copies and kernels act on memory when queued, in queue order; that
 * is one valid order of the real device's as long as the host honours the
 * events (hyb/device.h). Device memory is host memory: one anonymous mapping
 * per allocation (MAP_NORESERVE: a large capacity costs nothing until
 * touched; 2 MiB aligned from 2 MiB on, for transparent huge pages).
 *
 * Strict mode (HYB_DEVICE_STRICT=1 in the environment at open; the unit
 * tests set it). Acting at queue time hides a host that does not honour the
 * events, which a GPU would not forgive: so here host memory is touched as a
 * real copy engine touches it, at the copy's modelled completion.
 *   H2D: the source's hash is taken when the copy is queued and again when it
 *     completes; a difference means the host rewrote the buffer before it
 *     could know the copy had read it (completion is processed before any
 *     call that could tell the host so returns). That is a fault (-EIO),
 *     with the buffer, the length and the stream named, also on stderr.
 *   D2H: the bytes are taken from device memory when queued (queue order, as
 *     above) and land at completion; the destination is filled with 0xff
 *     (NaN as floats) at once unless an upload queued before still reads it:
 *     a host that reads before its event says so reads NaNs (or the old
 *     bytes).
 *   hyb_device_free, hyb_device_host_free and close first wait for all
 *   queued work (CUDA's frees synchronize too), so no copy lands in freed
 *   memory.
 *   Device memory: two operations on different streams that touch the same
 *   bytes, one writing, must be ordered by an event or by the host having
 *   seen the first complete - whatever the modelled timing (device_race.h).
 *   An unordered pair is a fault naming both.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "forward/attention.h"
#include "cpu_kernels.h"
#include "device_internal.h"
#include "device_race.h"
#include "sparse/sparse_layer.h"
#include "hyb/plan.h"
#include "hyb/tensor_type.h"
#include "hyb/testing.h"
#include "forward/ops.h"
#include "sparse/sparse_op.h"
#include "sparse/teal.h"

#define HUGE_SZ (2ull << 20)

enum op_kind { OP_MARK, OP_H2D, OP_D2H, OP_KERNEL, OP_HOST };
/* host functions run one at a time, as on CUDA's callback thread */
enum { ENG_H2D, ENG_D2H, ENG_COMPUTE, ENG_HOST, N_ENG };

struct op {
	uint64_t seq;      /* in its stream, from 1 */
	uint64_t gseq;     /* in the device: queue order */
	double head_at;    /* when it became its stream's head */
	double dur;        /* whole op (kernels, priority copies) */
	uint64_t left;     /* RELOAD copies: bytes not yet sent */
	uint64_t dep_seq;  /* markers: complete when done_seq[dep_s] >= dep_seq */
	uint8_t kind, dep_s;
	bool running, started;
	/* strict mode: H2D source and its hash; D2H destination and the staged bytes */
	const void *src;
	void *dst, *stage;
	uint64_t len, hash;
};

struct queue {
	struct op *op;     /* ring */
	uint32_t cap, first, n;
};

struct engine {
	int s;             /* stream whose head runs here, -1 when free */
	double until;
};

/*
 * An event: the op (stream, seq) it completes with; seq 0: complete. A timed
 * event is a marker op of its own (cpu_record), so the time it completes is
 * in done_at even when its stream was idle.
 */
struct cpu_event {
	uint64_t seq;
	int s;
	bool timed;
};

#define DONE_RING 1024 /* completion times kept per stream (hyb_device_elapsed) */

struct cpu_dev {
	struct hyb_device base;
	double t_open;               /* CLOCK_MONOTONIC at open */
	double inline_s, jumped_s;   /* see the clock above (not reset with stats) */
	double work_s;               /* virtual clock: the host work reported */
	bool in_fn;                  /* a host function runs: its work is its duration */
	double fn_work_s;
	double t;                    /* simulated time: every event before t is done */
	double pcie_bps, lat_s, hbm_bps, launch_s, flop_s;
	bool strict;                 /* HYB_DEVICE_STRICT: see "Strict mode" above */
	struct hyb_race *race;       /* strict: device-memory races between streams */
	struct hyb_span *spans;      /* strict: the device memory of the op being queued */
	uint32_t n_spans, cap_spans;
	const char *what;            /* strict: that op's name, for a race report */
	struct queue q[HYB_N_STREAMS];
	uint64_t last_seq[HYB_N_STREAMS], done_seq[HYB_N_STREAMS], gseq;
	double done_at[HYB_N_STREAMS][DONE_RING]; /* by seq % DONE_RING: when it completed */
	struct engine eng[N_ENG];

	struct hyb_sparse_ffn_ctx *ffn; /* sized to the largest shape seen */
	uint32_t ffn_e, ffn_f;
	const void **bundle;
	uint64_t n_bundle;
	float *ytmp;
	uint32_t n_ytmp;

	/* the dense kernels: the forward pass's CPU kernels and their scratch */
	const struct hyb_cpu_kernels *ck;
	void *xq, *mtmp, *atmp;      /* matvec input converted, matvec result, attention */
	size_t n_xq, n_mtmp, n_atmp; /* bytes */
	void *px, *pscr;             /* predict: the unit-RMS input, hyb_predictor_run's */
	size_t n_px, n_pscr;
	struct hyb_threadpool *pool1; /* teal: hyb_teal_gemv on the caller's thread */
	void *tidx, *tval, *tseen;   /* ... its scratch */
	size_t n_tidx, n_tval, n_tseen;
};

static struct cpu_dev *cpu(struct hyb_device *d)
{
	return (struct cpu_dev *)d;
}

static double mono(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Host time at real time `real` (never behind the simulation). */
static double host_time(const struct cpu_dev *c, double real)
{
	const double h = (c->base.cfg.virtual_clock ? c->work_s : real - c->t_open - c->inline_s) +
			 c->jumped_s;

	return h > c->t ? h : c->t;
}

static double cpu_now(struct hyb_device *d)
{
	return host_time(cpu(d), mono());
}

static void cpu_host_work(struct hyb_device *d, double s)
{
	struct cpu_dev *c = cpu(d);

	if (c->in_fn)
		c->fn_work_s += s;
	else if (c->base.cfg.virtual_clock)
		c->work_s += s;
}

/* End of an inline section begun at real time r0. */
static void leave(struct cpu_dev *c, double r0)
{
	const double dt = mono() - r0;

	c->inline_s += dt;
	c->base.st.inline_s += dt;
}

/* ---- the simulation ------------------------------------------------------------- */

static struct op *head(struct cpu_dev *c, int s)
{
	struct queue *q = &c->q[s];

	return q->n ? &q->op[q->first] : NULL;
}

static bool op_done(const struct cpu_dev *c, int s, uint64_t seq)
{
	return c->done_seq[s] >= seq;
}

static int engine_of(const struct op *o)
{
	return o->kind == OP_H2D ? ENG_H2D : o->kind == OP_D2H ? ENG_D2H :
	       o->kind == OP_HOST ? ENG_HOST : ENG_COMPUTE;
}

static bool chunked(int s, const struct op *o)
{
	return s == HYB_STREAM_RELOAD && o->kind != OP_KERNEL;
}

/* A 64-bit hash of len bytes, four lanes so it runs near memory speed. */
static uint64_t hash_bytes(const void *p, uint64_t len)
{
	const uint8_t *b = p;
	uint64_t h[4] = { 1, 2, 3, 4 }, w, i = 0;

	for (; i + 32 <= len; i += 32)
		for (int k = 0; k < 4; k++) {
			memcpy(&w, b + i + 8 * k, 8);
			h[k] = (h[k] ^ w) * 0x9e3779b97f4a7c15ull;
			h[k] ^= h[k] >> 29;
		}
	for (; i < len; i++)
		h[0] = (h[0] ^ b[i]) * 0x100000001b3ull;
	return h[0] ^ (h[1] * 3) ^ (h[2] * 5) ^ (h[3] * 7) ^ len;
}

static const char *const stream_names[HYB_N_STREAMS] = { "compute", "critical", "reload" };

/*
 * Strict mode: does a copy not completed yet touch host memory in [p, p +
 * len): an upload read it (kind OP_H2D) or a download write it (OP_D2H)?
 */
static bool host_busy(const struct cpu_dev *c, int kind, const void *p, uint64_t len)
{
	const uint8_t *a = p;

	for (int s = 0; s < HYB_N_STREAMS; s++) {
		const struct queue *q = &c->q[s];

		for (uint32_t i = 0; i < q->n; i++) {
			const struct op *o = &q->op[(q->first + i) % q->cap];
			const uint8_t *b = kind == OP_H2D ? o->src : o->stage ? o->dst : NULL;

			if (o->kind == kind && b && a < b + o->len && b < a + len)
				return true;
		}
	}
	return false;
}

/* Strict mode: what a real copy engine does to host memory when the copy completes. */
static void complete_host(struct cpu_dev *c, int s, struct op *o)
{
	if (o->kind == OP_H2D && o->src) {
		if (hash_bytes(o->src, o->len) != o->hash) {
			fprintf(stderr, "hyb: cpu device (strict): host memory %p (%llu bytes) was "
				"rewritten before its upload on the %s stream completed\n", o->src,
				(unsigned long long)o->len, stream_names[s]);
			hyb_device_fail(&c->base, -EIO, "cpu device (strict): host memory %p "
					"(%llu bytes) rewritten before its upload on the %s stream "
					"completed", o->src, (unsigned long long)o->len,
					stream_names[s]);
		}
		o->src = NULL;
	} else if (o->kind == OP_D2H && o->stage) {
		memcpy(o->dst, o->stage, o->len);
		free(o->stage);
		o->stage = NULL;
	}
}

/* The head of s completes at c->t; the next op becomes head then. */
static void complete(struct cpu_dev *c, int s)
{
	struct queue *q = &c->q[s];

	complete_host(c, s, &q->op[q->first]);
	c->done_seq[s] = q->op[q->first].seq;
	c->done_at[s][c->done_seq[s] % DONE_RING] = c->t;
	q->first = (q->first + 1) % q->cap;
	q->n--;
	if (q->n)
		q->op[q->first].head_at = c->t;
}

/* Markers whose event has completed complete now (each may free another). */
static void resolve_markers(struct cpu_dev *c)
{
	bool again = true;

	while (again) {
		again = false;
		for (int s = 0; s < HYB_N_STREAMS; s++) {
			const struct op *h = head(c, s);

			if (h && h->kind == OP_MARK && op_done(c, h->dep_s, h->dep_seq)) {
				complete(c, s);
				again = true;
			}
		}
	}
}

/* Does a (stream sa) go before b (stream sb) on engine e? */
static bool before(int e, int sa, const struct op *a, int sb, const struct op *b)
{
	if (e != ENG_COMPUTE) {
		const bool pa = sa != HYB_STREAM_RELOAD, pb = sb != HYB_STREAM_RELOAD;

		if (pa != pb)
			return pa;
	}
	if (a->head_at != b->head_at)
		return a->head_at < b->head_at;
	return a->gseq < b->gseq;
}

static void dispatch(struct cpu_dev *c)
{
	for (int e = 0; e < N_ENG; e++) {
		int best = -1;
		struct op *o;

		if (c->eng[e].s >= 0)
			continue;
		for (int s = 0; s < HYB_N_STREAMS; s++) {
			const struct op *h = head(c, s);

			if (!h || h->kind == OP_MARK || h->running || engine_of(h) != e)
				continue;
			if (best < 0 || before(e, s, h, best, head(c, best)))
				best = s;
		}
		if (best < 0)
			continue;
		o = head(c, best);
		o->running = true;
		c->eng[e].s = best;
		if (chunked(best, o)) {
			const uint64_t n = o->left < c->base.cfg.chunk_bytes ? o->left :
							   c->base.cfg.chunk_bytes;

			c->eng[e].until = c->t + (o->started ? 0 : c->lat_s) +
					  (double)n / c->pcie_bps;
			o->left -= n;
			o->started = true;
		} else {
			c->eng[e].until = c->t + o->dur;
		}
	}
}

/*
 * Run the model over every event strictly before `limit` (then t = limit), or
 * until op (ts, tseq) completes (ts < 0: none; t is then its end).
 */
static void sim_run(struct cpu_dev *c, double limit, int ts, uint64_t tseq)
{
	for (;;) {
		double next = INFINITY;

		resolve_markers(c);
		if (ts >= 0 && op_done(c, ts, tseq))
			return;
		dispatch(c);
		for (int e = 0; e < N_ENG; e++)
			if (c->eng[e].s >= 0 && c->eng[e].until < next)
				next = c->eng[e].until;
		if (next >= limit) {
			if (limit > c->t && limit < INFINITY)
				c->t = limit;
			return;
		}
		if (next > c->t)
			c->t = next;
		for (int e = 0; e < N_ENG; e++) {
			struct engine *g = &c->eng[e];
			struct op *o;

			if (g->s < 0 || g->until > next)
				continue;
			o = head(c, g->s);
			o->running = false;
			if (!chunked(g->s, o) || !o->left)
				complete(c, g->s);
			g->s = -1;
		}
	}
}

/* Start an inline call: its host time H, the model brought up to H. */
static double enter(struct cpu_dev *c, double *r0)
{
	double h;

	*r0 = mono();
	h = host_time(c, *r0);
	sim_run(c, h, -1, 0);
	return h;
}

static int push(struct cpu_dev *c, int s, const struct op *o)
{
	struct queue *q = &c->q[s];
	struct op *n;

	if (q->n == q->cap) {
		const uint32_t cap = q->cap ? 2 * q->cap : 64;
		struct op *r = malloc(sizeof(*r) * cap);

		if (!r)
			return hyb_device_fail(&c->base, -ENOMEM, "cpu device: out of host memory");
		for (uint32_t i = 0; i < q->n; i++)
			r[i] = q->op[(q->first + i) % q->cap];
		free(q->op);
		q->op = r;
		q->cap = cap;
		q->first = 0;
	}
	n = &q->op[(q->first + q->n) % q->cap];
	*n = *o;
	n->seq = ++c->last_seq[s];
	n->gseq = ++c->gseq;
	n->head_at = c->t;
	n->running = n->started = false;
	q->n++;
	if (c->race) {
		char msg[400];
		int bad = hyb_race_op(c->race, s, n->seq, c->spans, c->n_spans,
				      c->what ? c->what : "a marker", msg, sizeof(msg));

		c->n_spans = 0;
		c->what = NULL;
		if (bad) {
			fprintf(stderr, "hyb: cpu device (strict): %s\n", msg);
			return hyb_device_fail(&c->base, -EIO, "cpu device (strict): %s", msg);
		}
	}
	return 0;
}

/* Strict mode: the op about to be queued is `what` and touches no device memory yet. */
static void op_begin(struct cpu_dev *c, const char *what)
{
	c->n_spans = 0;
	c->what = what;
}

/* Strict mode: ... and [p, p + len) of device memory, written or only read. */
static void span(struct cpu_dev *c, const void *p, uint64_t len, bool write)
{
	if (!c->race || !len)
		return;
	if (c->n_spans == c->cap_spans) {
		const uint32_t cap = c->cap_spans ? 2 * c->cap_spans : 64;
		struct hyb_span *n = realloc(c->spans, cap * sizeof(*n));

		if (!n)
			return; /* a footprint cut short misses races, never makes one up */
		c->spans = n;
		c->cap_spans = cap;
	}
	c->spans[c->n_spans++] = (struct hyb_span){ (uintptr_t)p, (uintptr_t)p + len, write };
}

/* ---- copies, events --------------------------------------------------------------- */

static int copy(struct cpu_dev *c, enum hyb_stream s, int kind, void *dst, const void *src,
		uint64_t len)
{
	struct op o = { .kind = (uint8_t)kind, .left = len, .len = len };
	double r0;
	int rc;

	enter(c, &r0);
	o.dur = c->lat_s + (double)len / c->pcie_bps;
	op_begin(c, kind == OP_H2D ? "an upload" : "a download");
	span(c, kind == OP_H2D ? dst : src, len, kind == OP_H2D);
	if (c->strict && len && kind == OP_H2D) {
		/*
		 * The bytes a download will land there are not in host memory
		 * yet: unordered, that is a race on a GPU; ordered (one stream),
		 * a round trip this model cannot give the right bytes to.
		 */
		if (host_busy(c, OP_D2H, src, len)) {
			leave(c, r0);
			return hyb_device_fail(&c->base, -EIO, "cpu device (strict): an upload from "
					       "%p reads host memory a download has not landed in yet",
					       src);
		}
		o.src = src;
		o.hash = hash_bytes(src, len);
	} else if (c->strict && len && kind == OP_D2H) {
		o.stage = malloc(len);
		o.dst = dst;
		if (!o.stage) {
			leave(c, r0);
			return hyb_device_fail(&c->base, -ENOMEM, "cpu device: out of host memory");
		}
		memcpy(o.stage, src, len);
	}
	const bool poison = o.stage && !host_busy(c, OP_H2D, dst, len);

	rc = push(c, s, &o);
	if (!rc) {
		if (poison)
			memset(dst, 0xff, len); /* the bytes land at completion */
		else if (!o.stage)
			memmove(dst, src, len);
		c->base.st.copy_busy_s += o.dur;
	} else {
		free(o.stage);
	}
	leave(c, r0);
	return rc;
}

/*
 * Strict mode: the host waits for all queued work, as CUDA's frees do
 * (cudaFree, cudaFreeHost; the CUDA device's free syncs its streams too),
 * so copies land before memory goes and the host has seen everything.
 */
static void drain_host(struct cpu_dev *c)
{
	double r0, h;

	if (!c->strict)
		return;
	h = enter(c, &r0);
	for (int s = 0; s < HYB_N_STREAMS; s++) {
		sim_run(c, INFINITY, s, c->last_seq[s]);
		if (c->race)
			hyb_race_observed(c->race, s, c->last_seq[s]);
	}
	if (c->t > h)
		c->jumped_s += c->t - h;
	leave(c, r0);
}

static int cpu_h2d(struct hyb_device *d, enum hyb_stream s, hyb_dptr dst, const void *src,
		   uint64_t len)
{
	return copy(cpu(d), s, OP_H2D, (void *)(uintptr_t)dst, src, len);
}

static int cpu_d2h(struct hyb_device *d, enum hyb_stream s, void *dst, hyb_dptr src,
		   uint64_t len)
{
	return copy(cpu(d), s, OP_D2H, dst, (const void *)(uintptr_t)src, len);
}

static struct hyb_device_event *cpu_event_new(struct hyb_device *d, bool timed)
{
	struct cpu_event *e = calloc(1, sizeof(*e));

	(void)d;
	if (e)
		e->timed = timed;
	return (struct hyb_device_event *)e;
}

static void cpu_event_free(struct hyb_device *d, struct hyb_device_event *ev)
{
	(void)d;
	free(ev);
}

static int cpu_record(struct hyb_device *d, enum hyb_stream s, struct hyb_device_event *ev)
{
	struct cpu_dev *c = cpu(d);
	struct cpu_event *e = (struct cpu_event *)ev;
	double r0;
	int rc;

	e->s = s;
	if (!e->timed) {
		e->seq = c->last_seq[s];
		return 0;
	}
	/* a marker after the stream's last op: it completes when that does, or now */
	const struct op o = { .kind = OP_MARK, .dep_s = (uint8_t)s, .dep_seq = c->last_seq[s] };

	enter(c, &r0);
	op_begin(c, NULL);
	rc = push(c, s, &o);
	e->seq = rc ? 0 : c->last_seq[s];
	leave(c, r0);
	return rc;
}

static int cpu_wait(struct hyb_device *d, enum hyb_stream s, struct hyb_device_event *ev)
{
	struct cpu_dev *c = cpu(d);
	const struct cpu_event *e = (const struct cpu_event *)ev;
	struct op o = { .kind = OP_MARK, .dep_s = (uint8_t)e->s, .dep_seq = e->seq };
	double r0;
	int rc = 0;

	enter(c, &r0);
	/* already complete, or ordered by the stream itself: nothing to wait for */
	op_begin(c, NULL);
	if (!op_done(c, e->s, e->seq) && e->s != (int)s)
		rc = push(c, s, &o);
	/* ordered all the same, on a GPU too: work queued after a wait follows the event */
	if (c->race && !rc && e->s != (int)s)
		hyb_race_wait(c->race, s, e->s, e->seq);
	leave(c, r0);
	return rc;
}

/*
 * Strict mode: a host function runs after every copy it is ordered after
 * (its stream's queued work and, through the waits among it, other
 * streams'), so what a copy engine does to host memory at their completion
 * happens now: downloads land, uploads' sources are checked and let go (the
 * function may rewrite them). upto[t]: the work of stream t settled so far.
 */
static void settle(struct cpu_dev *c, int s, uint64_t seq, uint64_t *upto)
{
	const struct queue *q = &c->q[s];
	const uint64_t from = upto[s];

	if (seq <= from)
		return;
	upto[s] = seq;
	for (uint32_t i = 0; i < q->n; i++) {
		struct op *o = &q->op[(q->first + i) % q->cap];

		if (o->seq > seq)
			break;
		if (o->seq <= from)
			continue;
		if (o->kind == OP_MARK)
			settle(c, o->dep_s, o->dep_seq, upto);
		else
			complete_host(c, s, o);
	}
}

/*
 * A host function: run at once, as the copies and kernels before it were,
 * then a stretch of its stream's timeline on the host-function engine as
 * long as it took (the virtual clock: the host work it reported). Its real
 * time is inline: the host thread that queued it did not spend it.
 */
static int cpu_host_fn(struct hyb_device *d, enum hyb_stream s, hyb_device_host_fn_t fn,
		       void *arg)
{
	struct cpu_dev *c = cpu(d);
	struct op o = { .kind = OP_HOST };
	uint64_t upto[HYB_N_STREAMS];
	double r0, f0;
	int rc;

	enter(c, &r0);
	if (c->strict) {
		memcpy(upto, c->done_seq, sizeof(upto));
		settle(c, s, c->last_seq[s], upto);
		if (c->base.faulted) {
			leave(c, r0);
			return -EIO;
		}
	}
	c->in_fn = true;
	c->fn_work_s = 0;
	f0 = mono();
	fn(arg);
	o.dur = c->base.cfg.virtual_clock ? c->fn_work_s : mono() - f0;
	c->in_fn = false;
	op_begin(c, "a host function");
	rc = push(c, s, &o);
	leave(c, r0);
	return rc;
}

static bool cpu_done(struct hyb_device *d, struct hyb_device_event *ev)
{
	struct cpu_dev *c = cpu(d);
	const struct cpu_event *e = (const struct cpu_event *)ev;
	double r0;
	bool done;

	if (op_done(c, e->s, e->seq)) {
		if (c->race)
			hyb_race_observed(c->race, e->s, e->seq);
		return true;
	}
	enter(c, &r0);
	done = op_done(c, e->s, e->seq);
	if (done && c->race)
		hyb_race_observed(c->race, e->s, e->seq);
	leave(c, r0);
	return done;
}

static int cpu_elapsed(struct hyb_device *d, struct hyb_device_event *a,
		       struct hyb_device_event *b, double *s)
{
	struct cpu_dev *c = cpu(d);
	const struct cpu_event *ea = (const struct cpu_event *)a, *eb = (const struct cpu_event *)b;
	double r0;
	int rc = 0;

	if (!ea->timed || !eb->timed || !ea->seq || !eb->seq)
		return hyb_device_fail(d, -EINVAL, "elapsed: %s event", !ea->timed || !eb->timed ?
				       "an untimed" : "a never recorded");
	enter(c, &r0);
	if (!op_done(c, ea->s, ea->seq) || !op_done(c, eb->s, eb->seq))
		rc = hyb_device_fail(d, -EAGAIN, "elapsed: an event has not completed");
	else if (c->done_seq[ea->s] - ea->seq >= DONE_RING ||
		 c->done_seq[eb->s] - eb->seq >= DONE_RING)
		rc = hyb_device_fail(d, -EINVAL, "elapsed: an event older than the last %d "
				     "completions of its stream", DONE_RING);
	else
		*s = c->done_at[eb->s][eb->seq % DONE_RING] - c->done_at[ea->s][ea->seq % DONE_RING];
	leave(c, r0);
	return rc;
}

static int cpu_sync(struct hyb_device *d, struct hyb_device_event *ev)
{
	struct cpu_dev *c = cpu(d);
	const struct cpu_event *e = (const struct cpu_event *)ev;
	double r0, h;
	int rc = 0;

	if (op_done(c, e->s, e->seq)) {
		if (c->race)
			hyb_race_observed(c->race, e->s, e->seq);
		return 0;
	}
	h = enter(c, &r0);
	if (!op_done(c, e->s, e->seq)) {
		sim_run(c, INFINITY, e->s, e->seq);
		if (!op_done(c, e->s, e->seq))  /* every wait points back: cannot happen */
			rc = hyb_device_fail(d, -EIO, "cpu device: event never completes");
		else if (c->t > h)
			c->jumped_s += c->t - h;
	}
	if (!rc && c->base.faulted) /* strict mode: a copy that completed meanwhile found a race */
		rc = -EIO;
	if (!rc && c->race)
		hyb_race_observed(c->race, e->s, e->seq);
	leave(c, r0);
	return rc;
}

/* ---- kernels ------------------------------------------------------------------------ */

/* bytes moved in device memory, flops its arithmetic (a prompt batch's kernels are bound by it) */
static int kernel_done(struct cpu_dev *c, enum hyb_stream s, uint64_t bytes, double flops)
{
	struct op o = { .kind = OP_KERNEL };
	const double mem = (double)bytes / c->hbm_bps, ops = flops / c->flop_s;
	int rc;

	o.dur = c->launch_s + (mem > ops ? mem : ops);
	rc = push(c, s, &o);
	if (!rc) {
		c->base.st.kernel_busy_s += o.dur;
		c->base.st.kernel_bytes += bytes;
	}
	return rc;
}

/* Scratch for a layer of this shape: the operator's context, bundles, y. */
static int ffn_scratch(struct cpu_dev *c, const struct hyb_dev_ffn *f, uint64_t n_groups)
{
	if (!c->ffn || f->n_embd > c->ffn_e || f->n_ff > c->ffn_f) {
		const uint32_t e = f->n_embd > c->ffn_e ? f->n_embd : c->ffn_e;
		const uint32_t n = f->n_ff > c->ffn_f ? f->n_ff : c->ffn_f;
		struct hyb_sparse_ffn_ctx *x = hyb_sparse_ffn_ctx_new(e, n, 1);

		if (!x)
			return -ENOMEM;
		hyb_sparse_ffn_ctx_free(c->ffn);
		c->ffn = x;
		c->ffn_e = e;
		c->ffn_f = n;
	}
	if (n_groups > c->n_bundle) {
		const void **b = realloc(c->bundle, sizeof(*b) * n_groups);

		if (!b)
			return -ENOMEM;
		c->bundle = b;
		c->n_bundle = n_groups;
	}
	if (f->n_embd > c->n_ytmp) {
		float *y = realloc(c->ytmp, sizeof(float) * f->n_embd);

		if (!y)
			return -ENOMEM;
		c->ytmp = y;
		c->n_ytmp = f->n_embd;
	}
	return 0;
}

/* One xn of the batch (t) into its y; *rows: the rows it read (gate, up, down). */
static int run_ffn(struct cpu_dev *c, const struct hyb_dev_ffn *f, uint32_t t, uint64_t *rows)
{
	static const uint32_t none[1];
	struct hyb_device *d = &c->base;
	const uint64_t rb = hyb_row_bytes(f->type, f->n_embd);
	const uint64_t n_groups = ((uint64_t)f->n_ff + f->group_size - 1) / f->group_size;
	const uint32_t *act = f->n_active ? (const uint32_t *)(uintptr_t)f->active : none;
	const int32_t *table = (const int32_t *)(uintptr_t)f->table;
	float *y = (float *)(uintptr_t)f->y + (uint64_t)t * f->n_embd;
	const float *xn = (const float *)(uintptr_t)f->xn + (uint64_t)t * f->n_embd;
	struct hyb_sparse_ffn_stats st;
	struct hyb_ffn_bundles b;
	uint64_t slots = 0;

	if (ffn_scratch(c, f, n_groups))
		return hyb_device_fail(d, -ENOMEM, "sparse ffn: out of host memory for %ux%u",
				       f->n_embd, f->n_ff);
	/* the table is only read (and checked) for the groups listed */
	for (uint64_t g = 0; g < n_groups; g++)
		c->bundle[g] = NULL;
	if (f->n_active)
		slots = hyb_device_span(d, f->cache) / f->slot_bytes;
	for (uint32_t i = 0; i < f->n_active; i++) {
		const uint32_t n = act[i], g = n / f->group_size;

		if (n >= f->n_ff)
			return hyb_device_fail(d, -EINVAL,
					       "sparse ffn: active[%u] = %u >= n_ff %u", i,
					       n, f->n_ff);
		if (i && n <= act[i - 1])
			return hyb_device_fail(d, -EINVAL,
					       "sparse ffn: active list not increasing at %u",
					       i);
		if (c->bundle[g])
			continue;
		if (table[g] < 0 || (uint64_t)table[g] >= slots)
			return hyb_device_fail(d, -EINVAL,
					       "neuron %u: group %u not resident (slot %d, cache "
					       "holds %llu)", n, g, table[g],
					       (unsigned long long)slots);
		c->bundle[g] = (const char *)(uintptr_t)f->cache +
			       (uint64_t)table[g] * f->slot_bytes;
	}
	b = (struct hyb_ffn_bundles){ .type = f->type, .n_embd = f->n_embd, .n_ff = f->n_ff,
				      .group_size = f->group_size, .row_bytes = rb,
				      .bundle = c->bundle };
	if (hyb_sparse_ffn_cats(c->ffn, NULL, &b, f->act, xn, act,
				f->n_active, f->thr, f->accumulate ? c->ytmp : y, &st))
		return hyb_device_fail(d, -EINVAL, "%s", hyb_sparse_ffn_error(c->ffn));
	if (f->accumulate)
		for (uint32_t e = 0; e < f->n_embd; e++)
			y[e] += c->ytmp[e];
	*rows = st.n_gate + st.n_up + st.n_nz;
	return 0;
}

static int cpu_sparse_ffn(struct hyb_device *d, enum hyb_stream s, const struct hyb_dev_ffn *f)
{
	struct cpu_dev *c = cpu(d);
	const uint32_t nb = f->batch ? f->batch : 1;
	const uint64_t rb = hyb_row_bytes(f->type, f->n_embd);
	uint64_t rows = 0, most = 0, bytes;
	double r0;
	int rc = 0;

	enter(c, &r0);
	for (uint32_t t = 0; t < nb && !rc; t++) {
		uint64_t n = 0;

		rc = run_ffn(c, f, t, &n);
		rows += n;
		most = n > most ? n : most;
	}
	/*
	 * A batch reads a row once for all its tokens: at least the rows of its
	 * busiest token, at most every listed neuron's three
	 */
	bytes = (nb > 1 ? (3ull * f->n_active > rows ? rows : 3ull * f->n_active) : most) * rb +
		4ull * f->n_active + 4ull * f->n_embd * nb * (f->accumulate ? 3 : 2);
	if (nb > 1 && bytes < most * rb)
		bytes = most * rb;
	if (!rc && c->race) {
		const uint64_t n_groups = ((uint64_t)f->n_ff + f->group_size - 1) / f->group_size;
		const uint64_t bundle = 3ull * f->group_size * hyb_row_bytes(f->type, f->n_embd);

		op_begin(c, "a sparse ffn kernel");
		span(c, (const void *)(uintptr_t)f->xn, 4ull * f->n_embd * nb, false);
		span(c, (const void *)(uintptr_t)f->active, 4ull * f->n_active, false);
		span(c, (const void *)(uintptr_t)f->table, 4 * n_groups, false);
		span(c, (const void *)(uintptr_t)f->y, 4ull * f->n_embd * nb, true);
		for (uint64_t g = 0; g < n_groups; g++)
			if (c->bundle[g])
				span(c, c->bundle[g], bundle, false);
	}
	if (!rc)
		rc = kernel_done(c, s, bytes, 2.0 * (double)rows * f->n_embd);
	leave(c, r0);
	return rc;
}

static int cpu_add(struct hyb_device *d, enum hyb_stream s, hyb_dptr y, hyb_dptr x, uint32_t n)
{
	struct cpu_dev *c = cpu(d);
	float *yp = (float *)(uintptr_t)y;
	const float *xp = (const float *)(uintptr_t)x;
	double r0;
	int rc;

	enter(c, &r0);
	for (uint32_t i = 0; i < n; i++)
		yp[i] += xp[i];
	op_begin(c, "an add kernel");
	span(c, xp, 4ull * n, false);
	span(c, yp, 4ull * n, true);
	rc = kernel_done(c, s, 12ull * n, 0); /* reads y and x, writes y */
	leave(c, r0);
	return rc;
}

/* the CPU forward pass's activation (hyb_ffn_act), as its FFNs and experts run it */
static int cpu_ffn_act(struct hyb_device *d, enum hyb_stream s, hyb_dptr g, hyb_dptr u,
		       uint32_t n, enum hyb_ffn_act act)
{
	struct cpu_dev *c = cpu(d);
	float *gp = (float *)(uintptr_t)g;
	const float *up = (const float *)(uintptr_t)u;
	double r0;
	int rc;

	enter(c, &r0);
	hyb_ffn_act(gp, up, n, act);
	op_begin(c, "an ffn_act kernel");
	span(c, up, 4ull * n, false);
	span(c, gp, 4ull * n, true);
	rc = kernel_done(c, s, 12ull * n, 0); /* reads g and u, writes g */
	leave(c, r0);
	return rc;
}

/*
 * The dense kernels run the CPU forward pass's code (libhyb/forward/forward.c) on
 * one thread, so their results are its bits: hyb/device.h promises that.
 */

/* *p holds at least n bytes (64-byte aligned; contents not kept), or NULL. */
static void *scratch(void **p, size_t *cap, size_t n)
{
	if (n > *cap) {
		void *q = aligned_alloc(64, (n + 63) & ~(size_t)63);

		if (!q)
			return NULL;
		free(*p);
		*p = q;
		*cap = n;
	}
	return *p;
}

static int cpu_rmsnorm(struct hyb_device *d, enum hyb_stream s, hyb_dptr y, hyb_dptr x,
		       hyb_dptr w, uint32_t n, uint32_t rows, float eps)
{
	struct cpu_dev *c = cpu(d);
	double r0;
	int rc;

	enter(c, &r0);
	/* in place is fine: it reads all of a row of x before it writes the row's y[0] */
	for (uint64_t r = 0; r < rows; r++)
		hyb_rmsnorm((float *)(uintptr_t)y + r * n, (const float *)(uintptr_t)x + r * n,
			    (const float *)(uintptr_t)w, n, eps);
	op_begin(c, "an rmsnorm kernel");
	span(c, (const void *)(uintptr_t)x, 4ull * n * rows, false);
	span(c, (const void *)(uintptr_t)w, 4ull * n, false);
	span(c, (const void *)(uintptr_t)y, 4ull * n * rows, true);
	rc = kernel_done(c, s, 4ull * n * (2ull * rows + 1), 0);
	leave(c, r0);
	return rc;
}

/*
 * forward.c's matmul for one column: x converted to the dot type (Q8_0 for
 * Q4_0/Q8_0, Q8_K for Q4_K/Q6_K, F16 for F16), then the kernel picked by the
 * weight's row count over all rows in one call. The
 * forward pass cuts the rows into chunks of 16k between its threads; the
 * kernels' sums do not depend on the chunk a row is in (test_device.c
 * checks it), so one call gives the same bits.
 */
static int run_matvec(struct cpu_dev *c, const struct hyb_dev_matvec *m, uint64_t *bytes)
{
	const uint32_t vt = hyb_vec_dot_type(m->type);
	const uint64_t nb = m->batch ? m->batch : 1;
	const uint64_t rb = hyb_row_bytes(m->type, m->n_in), xb = hyb_row_bytes(vt, m->n_in);
	float *y = (float *)(uintptr_t)m->y, *out = y;
	const float *x = (const float *)(uintptr_t)m->x;
	char *xq = scratch(&c->xq, &c->n_xq, xb * nb);

	if (m->accumulate)
		out = scratch(&c->mtmp, &c->n_mtmp, 4ull * m->n_out * nb);
	if (!xq || !out)
		return hyb_device_fail(&c->base, -ENOMEM, "matvec: out of host memory for %ux%u",
				       m->n_out, m->n_in);
	/* a batch is the forward pass's matmul of a prompt: every column in one call */
	for (uint64_t j = 0; j < nb; j++)
		c->ck->quantize_act[vt](x + j * m->n_in, xq + j * xb, m->n_in);
	hyb_gemm_pick(c->ck, m->type, m->n_out)(m->n_in, (const void *)(uintptr_t)m->w, rb,
						m->n_out, xq, xb, (int64_t)nb, out, m->n_out);
	/* the residual add after the matmul, the product rounded to float first */
	if (m->accumulate)
		for (uint64_t r = 0; r < m->n_out * nb; r++)
			y[r] += out[r];
	*bytes = rb * m->n_out + nb * (4ull * m->n_in + 4ull * m->n_out * (m->accumulate ? 2 : 1));
	return 0;
}

static int cpu_matvec(struct hyb_device *d, enum hyb_stream s, const struct hyb_dev_matvec *m)
{
	struct cpu_dev *c = cpu(d);
	const uint64_t nb = m->batch ? m->batch : 1;
	uint64_t bytes = 0;
	double r0;
	int rc;

	enter(c, &r0);
	rc = run_matvec(c, m, &bytes);
	op_begin(c, "a matvec kernel");
	span(c, (const void *)(uintptr_t)m->w, hyb_row_bytes(m->type, m->n_in) * m->n_out, false);
	span(c, (const void *)(uintptr_t)m->x, 4ull * m->n_in * nb, false);
	span(c, (const void *)(uintptr_t)m->y, 4ull * m->n_out * nb, true);
	if (!rc)
		rc = kernel_done(c, s, bytes, 2.0 * (double)nb * m->n_in * m->n_out);
	leave(c, r0);
	return rc;
}

/* the items one after the other with the CPU's kernels, timed as one launch */
static int cpu_matvec_group(struct hyb_device *d, enum hyb_stream s,
			    const struct hyb_dev_matvec *m, uint32_t n)
{
	struct cpu_dev *c = cpu(d);
	const uint64_t nb = m->batch ? m->batch : 1;
	uint64_t bytes = 0;
	double r0;
	int rc = 0;

	enter(c, &r0);
	for (uint32_t i = 0; i < n && !rc; i++) {
		uint64_t b = 0;

		rc = run_matvec(c, &m[i], &b);
		bytes += b;
	}
	op_begin(c, "a matvec group kernel");
	for (uint32_t i = 0; i < n; i++) {
		span(c, (const void *)(uintptr_t)m[i].w,
		     hyb_row_bytes(m[i].type, m[i].n_in) * m[i].n_out, false);
		span(c, (const void *)(uintptr_t)m[i].x, 4ull * m[i].n_in * nb, false);
		span(c, (const void *)(uintptr_t)m[i].y, 4ull * m[i].n_out * nb, true);
	}
	if (!rc)
		rc = kernel_done(c, s, bytes, 2.0 * (double)n * nb * m->n_in * m->n_out);
	leave(c, r0);
	return rc;
}

/*
 * The list is read as the kernel runs (here: now); every index is checked
 * before anything is written, as the CUDA kernel does, so a bad list
 * faults the device and changes nothing.
 */
static int cpu_matvec_table(struct hyb_device *d, enum hyb_stream s,
			    const struct hyb_dev_matvec_table *t)
{
	struct cpu_dev *c = cpu(d);
	const uint32_t *it = (const uint32_t *)(uintptr_t)t->items;
	const uint32_t n = it[0];
	const uint64_t rb = hyb_row_bytes(t->type, t->n_in);
	uint64_t bytes = 0;
	double r0;
	int rc = 0;

	enter(c, &r0);
	if (n > t->max)
		rc = hyb_device_fail(d, -EIO, "cpu device: matvec table: %u items, at most %u", n,
				     t->max);
	for (uint32_t i = 0; i < n && !rc; i++) {
		const uint32_t *e = it + 1 + 3 * i;

		if (e[0] >= t->n_w || e[1] >= t->n_x || e[2] >= t->n_y)
			rc = hyb_device_fail(d, -EIO, "cpu device: matvec table: item %u (slot %u, "
					     "x row %u, y row %u) outside %u slots, %u and %u rows",
					     i, e[0], e[1], e[2], t->n_w, t->n_x, t->n_y);
		for (uint32_t j = 0; j < i && !rc; j++)
			if (it[3 + 3 * j] == e[2])
				rc = hyb_device_fail(d, -EIO, "cpu device: matvec table: items %u and "
						     "%u write y row %u", j, i, e[2]);
	}
	for (uint32_t i = 0; i < n && !rc; i++) {
		const uint32_t *e = it + 1 + 3 * i;
		const struct hyb_dev_matvec m = {
			.type = t->type, .n_in = t->n_in, .n_out = t->n_out,
			.w = t->w + e[0] * t->w_stride, .x = t->x + 4ull * t->n_in * e[1],
			.y = t->y + 4ull * t->n_out * e[2], .accumulate = t->accumulate,
		};
		uint64_t b = 0;

		rc = run_matvec(c, &m, &b);
		bytes += b;
	}
	if (rc) {
		leave(c, r0);
		return rc;
	}
	/* what the listed items touch, not the arrays': other slots may be loading meanwhile */
	op_begin(c, "a matvec table kernel");
	span(c, (const void *)(uintptr_t)t->items, 4 + 12ull * n, false);
	for (uint32_t i = 0; i < n; i++) {
		const uint32_t *e = it + 1 + 3 * i;

		span(c, (const void *)(uintptr_t)(t->w + e[0] * t->w_stride), rb * t->n_out, false);
		span(c, (const void *)(uintptr_t)(t->x + 4ull * t->n_in * e[1]), 4ull * t->n_in,
		     false);
		span(c, (const void *)(uintptr_t)(t->y + 4ull * t->n_out * e[2]), 4ull * t->n_out,
		     true);
	}
	rc = kernel_done(c, s, bytes, 2.0 * (double)n * t->n_in * t->n_out);
	leave(c, r0);
	return rc;
}

/*
 * forward.c's steps for one token: RoPE on q and k, k and v stored as F16
 * into row pos, then the attention loop over rows 0..pos. One split
 * (n_split 1): the forward pass splits 512+ positions between its threads,
 * the device does not (hyb/device.h).
 */
static int run_attention(struct cpu_dev *c, const struct hyb_dev_attn *a, uint32_t t,
			 uint64_t *bytes)
{
	const uint64_t q_dim = (uint64_t)a->n_head * a->head_dim;
	const uint64_t kv_dim = (uint64_t)a->n_head_kv * a->head_dim;
	const uint32_t pos = a->pos + t;
	float *q = (float *)(uintptr_t)a->q + t * q_dim, *k = (float *)(uintptr_t)a->k + t * kv_dim;
	const float *v = (const float *)(uintptr_t)a->v + t * kv_dim;
	uint16_t *kc = (uint16_t *)(uintptr_t)a->kcache, *vc = (uint16_t *)(uintptr_t)a->vcache;
	void *tmp = scratch(&c->atmp, &c->n_atmp, hyb_attend_tmp_bytes(a->head_dim, 0));
	struct hyb_attn at = {
		.k = c->ck, .q = q, .out = (float *)(uintptr_t)a->out + t * q_dim, .kc = kc, .vc = vc,
		.q_stride = q_dim, .kv_stride = kv_dim, .hd = a->head_dim,
		.n_head = a->n_head, .n_head_kv = a->n_head_kv, .n_tokens = 1, .n_past = pos,
		.n_ctx = a->n_ctx, .n_split = 1, .n_swa = a->n_swa,
		.scale = a->q_scale ? 1.0f : 1.0f / sqrtf((float)a->head_dim),
	};
	/* rows attended: a sliding window's last n_swa */
	const uint64_t rows = a->n_swa && pos + 1 > a->n_swa ? a->n_swa : pos + 1ull;

	if (!tmp)
		return hyb_device_fail(&c->base, -ENOMEM, "attention: out of host memory");
	hyb_rope(q, a->n_head, a->head_dim, a->n_rot, pos, a->rope, a->rope_neox);
	hyb_rope(k, a->n_head_kv, a->head_dim, a->n_rot, pos, a->rope, a->rope_neox);
	for (uint64_t e = 0; a->q_scale && e < q_dim; e++)
		q[e] *= a->q_scale;
	c->ck->quantize_act[HYB_TYPE_F16](k, kc + pos * kv_dim, (int64_t)kv_dim);
	c->ck->quantize_act[HYB_TYPE_F16](v, vc + pos * kv_dim, (int64_t)kv_dim);
	hyb_attend_run(&at, 0, hyb_attend_jobs(&at), tmp);
	*bytes = 4ull * rows * kv_dim + 16 * kv_dim + 12 * q_dim;
	return 0;
}

static int cpu_attention(struct hyb_device *d, enum hyb_stream s, const struct hyb_dev_attn *a)
{
	struct cpu_dev *c = cpu(d);
	const uint32_t nb = a->batch ? a->batch : 1;
	const uint64_t q_dim = (uint64_t)a->n_head * a->head_dim;
	const hyb_dptr pos_at = a->pos_at;
	struct hyb_dev_attn at;
	uint64_t bytes = 0, b = 0;
	double flops = 0, r0;
	int rc = 0;

	enter(c, &r0);
	if (pos_at) {
		/* the position as the kernel finds it in device memory when it runs */
		at = *a;
		memcpy(&at.pos, (const void *)(uintptr_t)pos_at, 4);
		if (at.pos >= at.n_ctx) {
			leave(c, r0);
			return hyb_device_fail(d, -EIO, "cpu device: attention: position %u read from "
					       "device memory, outside a cache of %u rows", at.pos,
					       at.n_ctx);
		}
		a = &at;
	}
	for (uint32_t t = 0; t < nb && !rc; t++) {
		rc = run_attention(c, a, t, &b);
		/* a batch reads the K and V rows once (its last token's rows), the rest per token */
		if (t + 1 == nb)
			bytes += b;
		flops += 4.0 * (a->pos + t + 1) * q_dim;
	}
	if (nb > 1) {
		const uint64_t kv_dim = (uint64_t)a->n_head_kv * a->head_dim;

		bytes += (nb - 1ull) * (16 * kv_dim + 12 * q_dim);
	}
	if (c->race) {
		const uint64_t row = 2ull * a->n_head_kv * a->head_dim; /* F16 */

		op_begin(c, "an attention kernel");
		span(c, (const void *)(uintptr_t)a->q, 4 * q_dim * nb, true); /* roped in place */
		span(c, (const void *)(uintptr_t)a->k, 2 * row * nb, true);
		span(c, (const void *)(uintptr_t)a->v, 2 * row * nb, false);
		span(c, (const void *)(uintptr_t)a->kcache, row * a->pos, false);
		span(c, (const void *)(uintptr_t)(a->kcache + row * a->pos), row * nb, true);
		span(c, (const void *)(uintptr_t)a->vcache, row * a->pos, false);
		span(c, (const void *)(uintptr_t)(a->vcache + row * a->pos), row * nb, true);
		span(c, (const void *)(uintptr_t)a->out, 4 * q_dim * nb, true);
		span(c, (const void *)(uintptr_t)pos_at, pos_at ? 4 : 0, false);
	}
	if (!rc)
		rc = kernel_done(c, s, bytes, flops);
	leave(c, r0);
	return rc;
}

/* ---- memory ----------------------------------------------------------------------- */

static uint64_t map_bytes(uint64_t bytes)
{
	const uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE);

	return (bytes + pg - 1) / pg * pg;
}

static int cpu_alloc(struct hyb_device *d, uint64_t bytes, hyb_dptr *out)
{
	const int prot = PROT_READ | PROT_WRITE;
	const int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
	const uint64_t len = map_bytes(bytes);
	char *p;

	if (len < HUGE_SZ) {
		p = mmap(NULL, len, prot, flags, -1, 0);
	} else {
		/* over-map, then trim to a 2 MiB-aligned range of len bytes */
		char *m = mmap(NULL, len + HUGE_SZ, prot, flags, -1, 0);

		p = m;
		if (m != MAP_FAILED) {
			const uint64_t skip = (HUGE_SZ - (uintptr_t)m % HUGE_SZ) % HUGE_SZ;

			p = m + skip;
			if (skip)
				munmap(m, skip);
			munmap(p + len, HUGE_SZ - skip);
			madvise(p, len, MADV_HUGEPAGE);
		}
	}
	if (p == MAP_FAILED)
		return hyb_device_fail(d, -ENOMEM, "cpu device: cannot map %llu bytes: %s",
				       (unsigned long long)bytes, strerror(errno));
	*out = (hyb_dptr)(uintptr_t)p;
	return 0;
}

static void cpu_free(struct hyb_device *d, hyb_dptr p)
{
	drain_host(cpu(d));
	munmap((void *)(uintptr_t)p, map_bytes(hyb_device_span(d, p)));
}

static int cpu_host_register(struct hyb_device *d, void *p, size_t len)
{
	(void)d;
	(void)p;
	(void)len;
	return 0; /* host memory is the device's: nothing to pin */
}

static int cpu_host_unregister(struct hyb_device *d, void *p)
{
	(void)d;
	(void)p;
	return 0;
}

static void *cpu_host_alloc(struct hyb_device *d, size_t len)
{
	(void)d;
	if (len > SIZE_MAX - 63)
		return NULL;
	return aligned_alloc(64, (len + 63) & ~(size_t)63);
}

static void cpu_host_free(struct hyb_device *d, void *p)
{
	drain_host(cpu(d));
	free(p);
}

static void cpu_close(struct hyb_device *d)
{
	struct cpu_dev *c = cpu(d);

	drain_host(c);
	hyb_race_free(c->race);
	free(c->spans);
	for (int s = 0; s < HYB_N_STREAMS; s++)
		free(c->q[s].op);
	hyb_sparse_ffn_ctx_free(c->ffn);
	free(c->bundle);
	free(c->ytmp);
	free(c->xq);
	free(c->px);
	free(c->pscr);
	free(c->mtmp);
	free(c->atmp);
	free(c->tidx);
	free(c->tval);
	free(c->tseen);
	if (c->pool1)
		hyb_threadpool_free(c->pool1);
	free(c);
}

/*
 * TEAL's GEMV (libhyb/sparse/teal.c) on the caller's thread: its sums do
 * not depend on the thread count, so they are the CPU's bits; a batch's
 * rows HYB_TEAL_ROWS at a time (hyb_teal_gemv_rows: each row's bits its
 * own GEMV's). Bytes: the rows of the inputs above the threshold, once per
 * group of rows for the union of theirs, x and y.
 */
static int cpu_teal(struct hyb_device *d, enum hyb_stream s, const struct hyb_dev_teal *t)
{
	struct cpu_dev *c = cpu(d);
	const uint32_t nb = t->batch ? t->batch : 1, ni = t->n_in, no = t->n_out;
	const uint64_t rb = hyb_row_bytes(t->type, no);
	const struct hyb_teal_mat w = {
		.type = t->type, .n_in = ni, .n_out = no, .row_bytes = t->row_bytes ? t->row_bytes : rb,
		.data = (const void *)(uintptr_t)t->w,
	};
	const float *x = (const float *)(uintptr_t)t->x;
	float *y = (float *)(uintptr_t)t->y;
	uint32_t *idx = scratch(&c->tidx, &c->n_tidx, 4ull * ni * HYB_TEAL_ROWS);
	float *val = scratch(&c->tval, &c->n_tval, 4ull * ni * HYB_TEAL_ROWS);
	uint8_t *seen = scratch(&c->tseen, &c->n_tseen, ni);
	uint64_t rows = 0;
	double flops = 0, r0;
	int rc;

	if (!idx || !val || !seen || (!c->pool1 && !(c->pool1 = hyb_threadpool_new(1))))
		return hyb_device_fail(d, -ENOMEM, "teal: out of host memory");
	enter(c, &r0);
	for (uint32_t b0 = 0; b0 < nb; b0 += HYB_TEAL_ROWS) {
		const uint32_t k = nb - b0 < HYB_TEAL_ROWS ? nb - b0 : HYB_TEAL_ROWS;
		uint32_t n_act[HYB_TEAL_ROWS];

		if (k == 1)
			n_act[0] = hyb_teal_gemv(c->pool1, &w, x + (size_t)b0 * ni, t->thr, idx, val,
						 y + (size_t)b0 * no);
		else
			hyb_teal_gemv_rows(c->pool1, &w, x + (size_t)b0 * ni, ni, k, t->thr, idx,
					   val, n_act, y + (size_t)b0 * no, no);
		memset(seen, 0, ni);
		for (uint32_t r = 0; r < k; r++) {
			for (uint32_t a = 0; a < n_act[r]; a++) {
				const uint32_t i = idx[(size_t)r * ni + a];

				rows += !seen[i];
				seen[i] = 1;
			}
			flops += 2.0 * n_act[r] * no;
		}
	}
	op_begin(c, "a teal kernel");
	span(c, (const void *)(uintptr_t)t->w, w.row_bytes * (ni - 1ull) + rb, false);
	span(c, (const void *)(uintptr_t)t->x, 4ull * ni * nb, false);
	span(c, (const void *)(uintptr_t)t->y, 4ull * no * nb, true);
	rc = kernel_done(c, s, rows * rb + 4ull * (ni + no) * nb, flops);
	leave(c, r0);
	return rc;
}

/*
 * The predictor: hyb_unit_rms (x as it is with raw_x) then
 * hyb_predictor_run on the caller's thread (its sums do not depend on how
 * the host splits rows and columns between threads: fc1 rows are
 * independent, fc2 columns are cut at whole vectors).
 * Bytes: fc1, fc2 and the biases - every fc2 row, an upper bound (a GPU
 * kernel skips the rows of silent hidden units; 2.5 us of HBM time at the
 * 7B shape separates the two).
 */
static int cpu_predict(struct hyb_device *d, enum hyb_stream s, const struct hyb_dev_predict *p)
{
	struct cpu_dev *c = cpu(d);
	const struct hyb_predictor pr = {
		.n_in = p->n_in, .hidden = p->hidden, .n_out = p->n_out,
		.fc1_w = (const uint16_t *)(uintptr_t)p->fc1_w,
		.fc1_b = (const float *)(uintptr_t)p->fc1_b,
		.fc2_w = (const uint16_t *)(uintptr_t)p->fc2_w,
		.fc2_b = (const float *)(uintptr_t)p->fc2_b,
	};
	float *x = scratch(&c->px, &c->n_px, sizeof(float) * p->n_in);
	const float *in = (const float *)(uintptr_t)p->x;
	void *w = scratch(&c->pscr, &c->n_pscr, hyb_predictor_scratch_bytes(&pr) + 64);
	uint32_t *active = (uint32_t *)(uintptr_t)p->active;
	float *lg = (float *)(uintptr_t)p->logits;
	uint64_t bytes;
	double r0;
	int rc;

	if (!x || !w)
		return hyb_device_fail(d, -ENOMEM, "predict: out of host memory");
	enter(c, &r0);
	if (!p->raw_x) {
		hyb_unit_rms(x, in, p->n_in);
		in = x;
	}
	*(uint32_t *)(uintptr_t)p->count = hyb_predictor_run(&pr, in, NULL, w, lg, active);
	op_begin(c, "a predictor kernel");
	span(c, pr.fc1_w, 2ull * p->hidden * p->n_in, false);
	span(c, pr.fc1_b, 4ull * p->hidden, false);
	span(c, pr.fc2_w, 2ull * p->hidden * p->n_out, false);
	span(c, pr.fc2_b, 4ull * p->n_out, false);
	span(c, (const void *)(uintptr_t)p->x, 4ull * p->n_in, false);
	span(c, active, 4ull * p->n_out, true);
	span(c, (const void *)(uintptr_t)p->count, 4, true);
	if (lg)
		span(c, lg, 4ull * p->n_out, true);
	bytes = 2ull * p->hidden * p->n_in + 4ull * p->hidden + 2ull * p->hidden * p->n_out +
		4ull * p->n_out + 4ull * p->n_in + 4ull * (*(uint32_t *)(uintptr_t)p->count + 1) +
		(lg ? 4ull * p->n_out : 0);
	rc = kernel_done(c, s, bytes, 0);
	leave(c, r0);
	return rc;
}

static const struct hyb_device_ops cpu_ops = {
	.kind = "cpu",
	.close = cpu_close,
	.now = cpu_now,
	.host_work = cpu_host_work,
	.alloc = cpu_alloc,
	.free = cpu_free,
	.host_register = cpu_host_register,
	.host_unregister = cpu_host_unregister,
	.host_alloc = cpu_host_alloc,
	.host_free = cpu_host_free,
	.h2d = cpu_h2d,
	.d2h = cpu_d2h,
	.event_new = cpu_event_new,
	.event_free = cpu_event_free,
	.record = cpu_record,
	.wait = cpu_wait,
	.done = cpu_done,
	.sync = cpu_sync,
	.elapsed = cpu_elapsed,
	.sparse_ffn = cpu_sparse_ffn,
	.add = cpu_add,
	.ffn_act = cpu_ffn_act,
	.rmsnorm = cpu_rmsnorm,
	.matvec = cpu_matvec,
	.matvec_group = cpu_matvec_group,
	.matvec_table = cpu_matvec_table,
	.attention = cpu_attention,
	.predict = cpu_predict,
	.teal = cpu_teal,
	.host_fn = cpu_host_fn,
};

struct hyb_device *hyb_device_cpu_open(const struct hyb_device_config *cfg, char *err,
				       size_t errlen)
{
	struct cpu_dev *c;

	if (!cfg->capacity || !cfg->chunk_bytes || !(cfg->pcie_gbps > 0) ||
	    !(cfg->hbm_gbps > 0)) {
		snprintf(err, errlen, "cpu device: zero capacity, chunk or bandwidth");
		return NULL;
	}
	c = calloc(1, sizeof(*c));
	if (!c) {
		snprintf(err, errlen, "cpu device: out of host memory");
		return NULL;
	}
	c->base.ops = &cpu_ops;
	c->base.cfg = *cfg;
	c->base.capacity = cfg->capacity;
	c->t_open = mono();
	c->pcie_bps = cfg->pcie_gbps * 1e9;
	c->lat_s = cfg->pcie_lat_us * 1e-6;
	c->hbm_bps = cfg->hbm_gbps * 1e9;
	c->launch_s = cfg->launch_us * 1e-6;
	c->flop_s = (cfg->tflops > 0 ? cfg->tflops : 200) * 1e12;
	c->strict = getenv(HYB_TESTING_ENV_DEVICE_STRICT) &&
		    !strcmp(getenv(HYB_TESTING_ENV_DEVICE_STRICT), "1");
	if (c->strict && !(c->race = hyb_race_new())) {
		free(c);
		snprintf(err, errlen, "cpu device: out of host memory");
		return NULL;
	}
	c->ck = hyb_cpu_best();
	for (int e = 0; e < N_ENG; e++)
		c->eng[e].s = -1;
	return &c->base;
}
