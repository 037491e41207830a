// SPDX-License-Identifier: MIT
/*
 * The reload service (reload.h): a dispatcher thread that owns the queue's
 * daemon role and two lanes (storage, device) that execute requests a chunk
 * at a time, always the chunk of the highest-priority request waiting.
 *
 * Chunks in flight: the storage lane runs one chunk at a time (a read is
 * done when hyb_rio_read returns). The device lane keeps up to
 * HYB_RELOAD_DEVICE_DEPTH (2) chunks in flight when the copy device has
 * marks (copydev.h mark/wait): it uploads and marks chunk k+1 before it waits
 * for chunk k's mark, so the link is never idle for the host's round trip
 * (measured on an H200 with a sync after every 1 MiB chunk: prefetch
 * uploads ran at 34.9 GB/s where the pinned link does 55, i.e. ~11 us idle
 * per ~19 us chunk; a 256 KiB upload + sync alone took 13.8 us).
 *
 * Why two and not more: the copy engine runs DMA in submission order
 * whatever the stream priority, so every chunk queued is a chunk a critical
 * request queued later waits behind; two is the least that hides the round
 * trip (the link has the next chunk while the host hears of the last one),
 * and it keeps the pre-emption bound at two chunks. Chunks
 * are retired (waited for) in the order issued; a request completes when its
 * last chunk is retired, so its CQE never precedes its bytes. An EVICT waits
 * until nothing is in flight, so it completes after the uploads ahead of it.
 *
 * One mutex guards the lanes' queues and the statistics; it is never held
 * across I/O, a copy or a queue call. Pool handles are opened once and
 * cached by id (own mutex), re-checked against the live pool table at the
 * start of every request, so a destroyed or replaced pool is noticed.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "box/lat_hist.h"
#include "reload.h"
#include "reload_io.h"
#include "hyb/stream.h"
#include "hyb/testing.h"

#define DEFAULT_CHUNK	(1u << 20)
#define MSG_LEN		256

enum { LANE_STORAGE, LANE_DEVICE, N_LANES };

struct pool_ref {
	struct pool_ref *next;
	uint32_t id;
	char name[HYB_MEMPOOL_NAME_LEN];
	uint64_t bytes;
	struct hyb_mempool *p;
	uint8_t *base;
	bool writable;
	bool stale;		/* the id now names another pool, or none */
	bool pinned;		/* this service pinned base for the copy device */
	size_t map_len;		/* the mapping's length, as pinned */
	unsigned int refs;
};

struct op {
	struct op *next;
	struct hyb_rq_req req;
	struct pool_ref *pool;
	uint64_t issued;		/* bytes handed to chunks so far */
	uint64_t done;			/* bytes of chunks retired without error */
	uint64_t t_queued, t_started;
	uint64_t lane_retired_at_queue;
	uint32_t slices, waited, preempted;
	unsigned int inflight;		/* its chunks issued and not retired */
	bool started;
	bool queued;			/* in its lane's FIFO: bytes left to issue */
	int status;			/* the first failure; 0 so far */
	char msg[MSG_LEN];		/* why */
};

/* A chunk issued and not yet retired. */
struct flight {
	struct op *op;
	uint64_t len;
	int status;			/* failed when issued (then nothing to wait for) */
	bool marked;			/* wait for token; else it was complete when issued */
	uint32_t token;
};

struct opq {
	struct op *head, *tail;
};

struct lane {
	struct hyb_reload *r;
	int kind;
	pthread_t thread;
	bool running;
	pthread_cond_t cv;
	struct opq q[HYB_RQ_PRIO_LEVELS];
	unsigned int depth;		/* chunks in flight at most */
	struct flight fl[HYB_RELOAD_DEVICE_DEPTH];	/* ring, oldest at fl_head */
	unsigned int fl_head, n_fl;
	uint64_t issued;		/* chunks picked (a later request waits behind them) */
	uint64_t retired;		/* chunks done with */
	struct op *last;		/* request of the last chunk picked, if it has more */
	struct hyb_rio *rio;		/* storage: the model file's reader (this thread's) */
	bool rio_broken;		/* cannot be had: the streaming engine instead */
};

struct cls_hist {
	struct hyb_lat_hist wait, service, total;
};

struct hyb_reload {
	struct hyb_reload_config cfg;
	char *model_path;
	bool buffered;			/* the model's filesystem refuses O_DIRECT */
	struct hyb_rq *rq;
	int efd, stop_efd;
	pthread_t dispatcher;
	pthread_mutex_t lock;
	pthread_cond_t started_cv;
	int start_state;		/* 0 starting, 1 serving, -1 failed */
	char start_err[MSG_LEN];
	bool stopping;
	struct lane lanes[N_LANES];
	struct hyb_reload_stats st;	/* counters; percentiles from hist */
	struct cls_hist hist[HYB_RELOAD_CLASSES];
	pthread_mutex_t pool_lock;
	struct pool_ref *pools;
};

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int say(char *msg, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int say(char *msg, int status, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, MSG_LEN, fmt, ap);
	va_end(ap);
	return status;
}

/* -- pools --------------------------------------------------------------- */

/*
 * A mapping the service made of its own (kmod backend: not hybd's loading
 * view) is pinned for the copy device, so that an UPLOAD from it is one DMA
 * and not the driver's staging copy. -EEXIST (the local backend hands out
 * hybd's own mapping, pinned at start-up) and failures leave it unpinned:
 * uploads work either way.
 */
static void ref_pin(struct hyb_reload *r, struct pool_ref *ref)
{
	char why[MSG_LEN];

	if (r->cfg.dev)
		ref->pinned = !hyb_copydev_pin(r->cfg.dev, ref->base, ref->map_len,
					       !ref->writable, why, sizeof(why));
}

static void ref_free(struct hyb_reload *r, struct pool_ref *ref)
{
	if (ref->pinned)
		hyb_copydev_unpin(r->cfg.dev, ref->base, ref->map_len);
	hyb_mempool_close(ref->p);
	free(ref);
}

static void pool_put_locked(struct hyb_reload *r, struct pool_ref *ref)
{
	struct pool_ref **pp;

	if (--ref->refs || !ref->stale)
		return;
	for (pp = &r->pools; *pp; pp = &(*pp)->next) {
		if (*pp == ref) {
			*pp = ref->next;
			break;
		}
	}
	ref_free(r, ref);
}

static void pool_put(struct hyb_reload *r, struct pool_ref *ref)
{
	if (!ref)
		return;
	pthread_mutex_lock(&r->pool_lock);
	pool_put_locked(r, ref);
	pthread_mutex_unlock(&r->pool_lock);
}

/*
 * Is pool id alive? The id list, not hyb_mempool_stat(): that one measures
 * huge-page coverage (the local backend reads /proc/self/smaps, ~0.3 ms),
 * too slow for every request. Ids are handed out cyclically by both backends
 * (kmod: xa_alloc_cyclic; local: a counter), so a live id in the cache is
 * the pool that was cached, not a later one with its id.
 */
static bool pool_alive(struct hyb_reload *r, uint32_t id)
{
	uint32_t ids[HYB_MEMPOOL_MAX];
	int n = hyb_mempool_list(r->cfg.backend, ids, HYB_MEMPOOL_MAX);

	for (int i = 0; i < n && i < HYB_MEMPOOL_MAX; i++)
		if (ids[i] == id)
			return true;
	return false;
}

/* The pool a request names, checked live; the range and write access too. */
static int pool_get(struct hyb_reload *r, const struct hyb_rq_req *q, bool write,
		    struct pool_ref **out, char *msg)
{
	struct hyb_mempool_info pi;
	struct pool_ref *ref, *next;
	size_t len;
	void *base;
	int ret;

	pthread_mutex_lock(&r->pool_lock);
	if (!pool_alive(r, q->pool_id)) {
		/* destroyed: drop its handle once nobody uses it */
		for (ref = r->pools; ref; ref = next) {
			next = ref->next;
			if (ref->id == q->pool_id && !ref->stale) {
				ref->stale = true;
				ref->refs++;
				pool_put_locked(r, ref);
			}
		}
		pthread_mutex_unlock(&r->pool_lock);
		return say(msg, -ENXIO, "no pool with id %u", q->pool_id);
	}
	for (ref = r->pools; ref; ref = ref->next)
		if (ref->id == q->pool_id && !ref->stale)
			break;
	if (!ref) {
		ref = calloc(1, sizeof(*ref));
		if (!ref) {
			pthread_mutex_unlock(&r->pool_lock);
			return say(msg, -ENOMEM, "out of memory");
		}
		ret = hyb_mempool_open_id(r->cfg.backend, q->pool_id, &ref->p);
		if (!ret)
			ret = hyb_mempool_map(ref->p, &base, &len);
		if (!ret)
			ret = hyb_mempool_info(ref->p, &pi);
		if (ret) {
			say(msg, ret == -ENOENT ? -ENXIO : ret, "pool %u: %s", q->pool_id,
			    hyb_last_error());
			if (ref->p)
				hyb_mempool_close(ref->p);
			free(ref);
			pthread_mutex_unlock(&r->pool_lock);
			return ret == -ENOENT ? -ENXIO : ret;
		}
		ref->id = q->pool_id;
		snprintf(ref->name, sizeof(ref->name), "%s", pi.name);
		ref->bytes = len < pi.bytes ? len : pi.bytes;
		ref->base = base;
		ref->map_len = len;
		ref->writable = hyb_mempool_writable(ref->p);
		ref_pin(r, ref);
		ref->next = r->pools;
		r->pools = ref;
	}
	ref->refs++;
	pthread_mutex_unlock(&r->pool_lock);
	if (q->pool_off > ref->bytes || q->len > ref->bytes - q->pool_off) {
		say(msg, -ENOSPC, "pool '%s' holds %llu bytes: range [%llu, +%llu) does not fit",
		    ref->name, (unsigned long long)ref->bytes, (unsigned long long)q->pool_off,
		    (unsigned long long)q->len);
		pool_put(r, ref);
		return -ENOSPC;
	}
	if (write && !ref->writable) {
		say(msg, -EACCES, "pool '%s' is not owned by this service: cannot load into it",
		    ref->name);
		pool_put(r, ref);
		return -EACCES;
	}
	*out = ref;
	return 0;
}

/* -- executing one chunk ------------------------------------------------- */

/*
 * The storage lane's reader of the model file, (re)opened when the path names
 * another file than the one it has open (replaced on disk).
 */
static void reader_check(struct hyb_reload *r, struct lane *ln, const struct stat *sb)
{
	uint64_t chunk = r->cfg.chunk ? r->cfg.chunk : DEFAULT_CHUNK;
	char err[MSG_LEN];
	dev_t dev;
	ino_t ino;

	if (ln->rio) {
		hyb_rio_ident(ln->rio, &dev, &ino);
		if (dev == sb->st_dev && ino == sb->st_ino)
			return;
		hyb_rio_close(ln->rio);
		ln->rio = NULL;
	}
	if (ln->rio_broken)
		return;
	ln->rio = hyb_rio_open(r->model_path, chunk, r->cfg.io_depth ? r->cfg.io_depth : 8, err,
			       sizeof(err));
	ln->rio_broken = !ln->rio;
}

/* First chunk of a request: everything that can be refused before moving bytes. */
static int op_begin(struct hyb_reload *r, struct lane *ln, struct op *op, char *msg)
{
	const struct hyb_rq_req *q = &op->req;
	struct hyb_copydev *d = r->cfg.dev;
	struct stat sb;

	switch (q->op) {
	case HYB_RQ_LOAD:
		if (!r->model_path)
			return say(msg, -ENODEV, "no model file to load from");
		if (stat(r->model_path, &sb))
			return say(msg, -errno, "model file %s: %s", r->model_path,
				   strerror(errno));
		if (q->aux > (uint64_t)sb.st_size || q->len > (uint64_t)sb.st_size - q->aux)
			return say(msg, -ERANGE, "model file %s holds %llu bytes: range [%llu, "
				   "+%llu) ends past it", r->model_path,
				   (unsigned long long)sb.st_size, (unsigned long long)q->aux,
				   (unsigned long long)q->len);
		reader_check(r, ln, &sb);
		return pool_get(r, q, true, &op->pool, msg);
	case HYB_RQ_UPLOAD:
		if (!d)
			return say(msg, -ENODEV, "no copy device");
		if (q->aux >= d->n_slots)
			return say(msg, -EINVAL, "cache slot %llu is outside 0..%u",
				   (unsigned long long)q->aux, d->n_slots - 1);
		if (q->len > d->slot_bytes)
			return say(msg, -ENOSPC, "%llu bytes do not fit a cache slot of %llu",
				   (unsigned long long)q->len, (unsigned long long)d->slot_bytes);
		return pool_get(r, q, false, &op->pool, msg);
	case HYB_RQ_EVICT:
		if (!d)
			return say(msg, -ENODEV, "no copy device");
		if (q->aux >= d->n_slots)
			return say(msg, -EINVAL, "cache slot %llu is outside 0..%u",
				   (unsigned long long)q->aux, d->n_slots - 1);
		return 0;
	}
	return say(msg, -EINVAL, "unknown op %u", q->op);
}

static int do_load(struct hyb_reload *r, struct lane *ln, struct op *op, uint64_t off,
		   uint64_t len, char *msg)
{
	const struct hyb_rq_req *q = &op->req;
	unsigned int depth = r->cfg.io_depth ? r->cfg.io_depth : 8;
	uint64_t piece = (len / depth + 4095) & ~4095ull;
	struct hyb_stream_opts o = {
		.depth = depth,
		.progress = HYB_STREAM_QUIET,
		.buffered = r->buffered,
	};
	struct stat sb;

	if (ln->rio) {
		int ret = hyb_rio_read(ln->rio, q->aux + off, len,
				       op->pool->base + q->pool_off + off, msg, MSG_LEN);

		if (ret == -EIO && stat(r->model_path, &sb))
			return say(msg, -errno, "model file %s: %s", r->model_path,
				   strerror(errno));
		return ret;
	}
	/* pieces of 64 KiB .. 1 MiB: a chunk becomes several reads in flight */
	o.chunk = (uint32_t)(piece < 65536 ? 65536 : piece > DEFAULT_CHUNK ? DEFAULT_CHUNK : piece);
	if (!hyb_stream_to_pool(op->pool->p, q->pool_off + off, r->model_path,
				q->aux + off, len, &o, NULL))
		return 0;
	/* the engine says why in words; the status says what */
	if (stat(r->model_path, &sb))
		return say(msg, -errno, "%s", hyb_last_error());
	return say(msg, -EIO, "%s", hyb_last_error());
}

/*
 * Start one chunk's copy. With marks (a lane deeper than one chunk) it is
 * only queued, f->token to wait for; otherwise, or when the mark cannot be
 * had, the stream is synced and the chunk has landed on return.
 */
static int do_upload(struct hyb_reload *r, struct lane *ln, struct op *op, struct flight *f,
		     uint64_t off, uint64_t len, char *msg)
{
	struct hyb_copydev *d = r->cfg.dev;
	const struct hyb_rq_req *q = &op->req;
	int ret;

	ret = d->ops->upload(d, (uint32_t)q->aux, off, op->pool->base + q->pool_off + off,
			     len, q->prio);
	if (!ret && ln->depth > 1 && !d->ops->mark(d, q->prio, &f->token)) {
		f->marked = true;
		return 0;
	}
	if (!ret)
		ret = d->ops->sync(d, q->prio);
	if (ret)
		return say(msg, ret, "%s device: copy to slot %llu failed: %s", d->name,
			   (unsigned long long)q->aux, strerror(-ret));
	return 0;
}

static int run_chunk(struct hyb_reload *r, struct lane *ln, struct op *op, struct flight *f,
		     uint64_t off, uint64_t len, char *msg)
{
	int ret;

	switch (op->req.op) {
	case HYB_RQ_LOAD:
		return do_load(r, ln, op, off, len, msg);
	case HYB_RQ_UPLOAD:
		return do_upload(r, ln, op, f, off, len, msg);
	case HYB_RQ_EVICT:
		ret = r->cfg.dev->ops->evict(r->cfg.dev, (uint32_t)op->req.aux);
		return ret ? say(msg, ret, "evict slot %llu: %s", (unsigned long long)op->req.aux,
				 strerror(-ret)) : 0;
	}
	return say(msg, -EINVAL, "unknown op %u", op->req.op);
}

/* -- completing ---------------------------------------------------------- */

/* Statistics under the lock. */
static void account(struct hyb_reload *r, struct op *op, int status, uint64_t t_done)
{
	enum hyb_reload_class c = hyb_reload_class_of(op->req.prio);
	struct hyb_reload_class_stats *cs = &r->st.cls[c];
	uint64_t started = op->started ? op->t_started : t_done;

	r->st.backlog--;
	if (status) {
		cs->failed++;
	} else {
		cs->done++;
		cs->bytes += op->req.op == HYB_RQ_EVICT ? 0 : op->req.len;
	}
	cs->preemptions += op->preempted;
	if (op->waited > cs->max_slices_waited)
		cs->max_slices_waited = op->waited;
	hyb_lat_add(&r->hist[c].wait, started - op->t_queued);
	hyb_lat_add(&r->hist[c].service, t_done - started);
	hyb_lat_add(&r->hist[c].total, t_done - op->t_queued);
}

/* Outside the lock: the verdict to the queue, the event to on_done. */
static void finish(struct hyb_reload *r, struct op *op, int status, const char *msg)
{
	struct hyb_rq_done d = { .id = op->req.id, .status = status };
	uint64_t t = now_ns();
	struct hyb_reload_event ev = {
		.req = &op->req,
		.status = status,
		.msg = status ? msg : "",
		.queued_ns = op->t_queued,
		.started_ns = op->started ? op->t_started : t,
		.done_ns = t,
		.slices = op->slices,
		.slices_waited = op->waited,
		.preempted = op->preempted,
	};

	pool_put(r, op->pool);
	op->pool = NULL;
	pthread_mutex_lock(&r->lock);
	account(r, op, status, t);
	pthread_mutex_unlock(&r->lock);
	/* before the completion: a waiter woken by it sees the event already handled */
	if (r->cfg.on_done)
		r->cfg.on_done(&ev, r->cfg.arg);
	hyb_rq_complete(r->rq, &d, 1);
	free(op);
}

/* -- lanes --------------------------------------------------------------- */

static struct op *pick(struct lane *ln)
{
	for (int p = 0; p < HYB_RQ_PRIO_LEVELS; p++)
		if (ln->q[p].head)
			return ln->q[p].head;
	return NULL;
}

/* Out of its FIFO: nothing more of it is issued (it is the head but for a failure). */
static void dequeue(struct lane *ln, struct op *op)
{
	struct opq *q = &ln->q[op->req.prio];
	struct op **pp, *prev = NULL;

	for (pp = &q->head; *pp; prev = *pp, pp = &(*pp)->next) {
		if (*pp == op) {
			*pp = op->next;
			if (q->tail == op)
				q->tail = prev;
			break;
		}
	}
	op->next = NULL;
	op->queued = false;
	if (ln->last == op)
		ln->last = NULL;
}

/* Under the lock: op fails (the first reason is kept); no more of it is issued. */
static void op_fail(struct lane *ln, struct op *op, int status, const char *msg)
{
	if (!op->status) {
		op->status = status;
		snprintf(op->msg, sizeof(op->msg), "%s", msg);
	}
	if (op->queued)
		dequeue(ln, op);
}

/*
 * Under the lock, which it drops while the chunk starts: the next chunk of
 * op into the ring. op_begin's checks come with a request's first chunk. A
 * chunk that fails here stays in the ring, failed, so that requests still
 * complete in the order their chunks were issued.
 */
static void issue(struct hyb_reload *r, struct lane *ln, struct op *op, uint64_t chunk)
{
	struct flight *f = &ln->fl[(ln->fl_head + ln->n_fl) % HYB_RELOAD_DEVICE_DEPTH];
	uint64_t off = op->issued, len = op->req.len - op->issued;
	char msg[MSG_LEN] = "";
	bool first = !op->started;
	int status = 0;

	if (first) {
		op->started = true;
		op->t_started = now_ns();
		/* the chunks in flight when it came, and those picked since */
		op->waited = (uint32_t)(ln->issued - op->lane_retired_at_queue);
	}
	if (ln->last && ln->last != op)
		ln->last->preempted++;	/* pre-empted between two of its chunks */
	if (len > chunk)
		len = chunk;
	*f = (struct flight){ .op = op, .len = len };
	op->issued += len;
	op->inflight++;
	ln->n_fl++;
	ln->issued++;
	if (op->issued >= op->req.len || op->req.op == HYB_RQ_EVICT) {
		dequeue(ln, op);
		ln->last = NULL;
	} else {
		ln->last = op;
	}
	pthread_mutex_unlock(&r->lock);

	if (first)
		status = op_begin(r, ln, op, msg);
	if (!status)
		status = run_chunk(r, ln, op, f, off, len, msg);

	pthread_mutex_lock(&r->lock);
	if (status) {
		f->status = status;
		op_fail(ln, op, status, msg);
	}
}

/*
 * Under the lock, which it drops while it waits: the oldest chunk in flight
 * has landed (or failed); its request completes when that was its last one.
 */
static void retire(struct hyb_reload *r, struct lane *ln)
{
	struct flight *f = &ln->fl[ln->fl_head];
	struct hyb_copydev *d = r->cfg.dev;
	struct op *op = f->op;
	uint64_t len = f->len;
	char msg[MSG_LEN] = "";
	int status = f->status;

	if (f->marked) {
		int ret;

		pthread_mutex_unlock(&r->lock);
		ret = d->ops->wait(d, f->token);
		if (ret)
			status = say(msg, ret, "%s device: copy to slot %llu failed: %s", d->name,
				     (unsigned long long)op->req.aux, strerror(-ret));
		pthread_mutex_lock(&r->lock);
		if (ret)
			op_fail(ln, op, status, msg);
	}
	ln->fl_head = (ln->fl_head + 1) % HYB_RELOAD_DEVICE_DEPTH;
	ln->n_fl--;
	ln->retired++;
	r->st.slices++;
	op->slices++;
	if (!status)
		op->done += len;
	if (--op->inflight || op->queued)
		return;
	pthread_mutex_unlock(&r->lock);
	finish(r, op, op->status, op->msg);
	pthread_mutex_lock(&r->lock);
}

static void *lane_main(void *arg)
{
	struct lane *ln = arg;
	struct hyb_reload *r = ln->r;
	uint64_t chunk = r->cfg.chunk ? r->cfg.chunk : DEFAULT_CHUNK;
	struct op *op;

	ln->rio_broken = getenv(HYB_TESTING_ENV_RELOAD_STREAM) != NULL;
	pthread_mutex_lock(&r->lock);
	for (;;) {
		op = r->stopping ? NULL : pick(ln);
		/* a chunk more while there is room; an EVICT only with nothing in flight */
		if (op && ln->n_fl < ln->depth && (op->req.op != HYB_RQ_EVICT || !ln->n_fl)) {
			issue(r, ln, op, chunk);
			continue;
		}
		if (ln->n_fl) {
			retire(r, ln);	/* stopping too: what is in flight lands first */
			continue;
		}
		if (r->stopping)
			break;
		pthread_cond_wait(&ln->cv, &r->lock);
	}
	/* stopping: the chunks in flight are done; fail the rest */
	while ((op = pick(ln))) {
		dequeue(ln, op);
		pthread_mutex_unlock(&r->lock);
		finish(r, op, -ESHUTDOWN, op->started ? "the service stopped part way (the range "
		       "is incomplete)" : "the service is shutting down");
		pthread_mutex_lock(&r->lock);
	}
	pthread_mutex_unlock(&r->lock);
	hyb_rio_close(ln->rio);
	ln->rio = NULL;
	return NULL;
}

/* -- dispatcher ---------------------------------------------------------- */

static void file_op(struct hyb_reload *r, const struct hyb_rq_req *q, uint64_t now)
{
	struct lane *ln = &r->lanes[q->op == HYB_RQ_LOAD ? LANE_STORAGE : LANE_DEVICE];
	struct opq *oq;
	struct op *op = calloc(1, sizeof(*op));

	if (!op) {
		struct hyb_rq_done d = { .id = q->id, .status = -ENOMEM };

		hyb_rq_complete(r->rq, &d, 1);
		return;
	}
	op->req = *q;
	if (op->req.prio >= HYB_RQ_PRIO_LEVELS)	/* the queue refuses these; be safe */
		op->req.prio = HYB_RQ_LOW;
	op->t_queued = now;
	pthread_mutex_lock(&r->lock);
	op->lane_retired_at_queue = ln->retired;
	op->queued = true;
	oq = &ln->q[op->req.prio];
	if (oq->tail)
		oq->tail->next = op;
	else
		oq->head = op;
	oq->tail = op;
	r->st.backlog++;
	pthread_cond_signal(&ln->cv);
	pthread_mutex_unlock(&r->lock);
}

bool hyb_reload_client_ok(const struct hyb_reload_clients *c, const struct hyb_rq_sender *s)
{
	if (!c->n)
		return true;
	for (unsigned int i = 0; i < c->n; i++)
		if (c->ids[i].id == (c->ids[i].gid ? s->gid : s->uid))
			return true;
	return false;
}

/* A request from a sender the policy does not admit: -EACCES, said why. */
static void refuse(struct hyb_reload *r, const struct hyb_rq_req *q,
		   const struct hyb_rq_sender *s, uint64_t now)
{
	struct op *op = calloc(1, sizeof(*op));
	char msg[MSG_LEN];

	if (!op) {
		struct hyb_rq_done d = { .id = q->id, .status = -EACCES };

		hyb_rq_complete(r->rq, &d, 1);
		return;
	}
	op->req = *q;
	op->t_queued = now;
	pthread_mutex_lock(&r->lock);
	r->st.backlog++;	/* finish() counts it out */
	pthread_mutex_unlock(&r->lock);
	snprintf(msg, sizeof(msg), "client %u (uid %u gid %u pid %d) is not in clients",
		 q->client_id, s->uid, s->gid, s->pid);
	finish(r, op, -EACCES, msg);
}

/* Everything submitted so far: NOPs answered, the rest to the lanes (or failed). */
static int fetch_all(struct hyb_reload *r, int fail_status)
{
	struct hyb_rq_req reqs[HYB_RQ_MAX_BATCH];
	struct hyb_rq_sender from[HYB_RQ_MAX_BATCH];
	struct hyb_rq_done nops[HYB_RQ_MAX_BATCH];
	int n;

	while ((n = hyb_rq_fetch_from(r->rq, reqs, from, HYB_RQ_MAX_BATCH)) > 0) {
		uint64_t now = now_ns();
		unsigned int nn = 0;

		pthread_mutex_lock(&r->lock);
		r->st.fetched += (uint64_t)n;
		pthread_mutex_unlock(&r->lock);
		for (int i = 0; i < n; i++) {
			if (reqs[i].op == HYB_RQ_NOP || fail_status) {
				nops[nn].id = reqs[i].id;
				nops[nn].status = reqs[i].op == HYB_RQ_NOP ? 0 : fail_status;
				nops[nn++].reserved = 0;
				continue;
			}
			if (hyb_reload_client_ok(&r->cfg.clients, &from[i]))
				file_op(r, &reqs[i], now);
			else
				refuse(r, &reqs[i], &from[i], now);
		}
		if (nn)
			hyb_rq_complete(r->rq, nops, nn);
	}
	return n;
}

static int start_lanes(struct hyb_reload *r)
{
	for (int i = 0; i < N_LANES; i++) {
		struct lane *ln = &r->lanes[i];

		if (pthread_create(&ln->thread, NULL, lane_main, ln))
			return -1;
		ln->running = true;
	}
	return 0;
}

static void stop_lanes(struct hyb_reload *r)
{
	pthread_mutex_lock(&r->lock);
	r->stopping = true;
	for (int i = 0; i < N_LANES; i++)
		pthread_cond_broadcast(&r->lanes[i].cv);
	pthread_mutex_unlock(&r->lock);
	for (int i = 0; i < N_LANES; i++)
		if (r->lanes[i].running)
			pthread_join(r->lanes[i].thread, NULL);
}

static void started(struct hyb_reload *r, int state, const char *why)
{
	pthread_mutex_lock(&r->lock);
	r->start_state = state;
	if (why)
		snprintf(r->start_err, sizeof(r->start_err), "%s", why);
	pthread_cond_broadcast(&r->started_cv);
	pthread_mutex_unlock(&r->lock);
}

static void *dispatcher_main(void *arg)
{
	struct hyb_reload *r = arg;
	struct pollfd pfd[2];
	uint64_t v;
	char why[MSG_LEN];

	/* the daemon role belongs to this thread: it ends when the thread does */
	if (hyb_rq_attach_daemon(r->cfg.backend, r->cfg.queue, r->efd, &r->rq)) {
		snprintf(why, sizeof(why), "reload queue %u: %s", r->cfg.queue,
			 hyb_last_error());
		started(r, -1, why);
		return NULL;
	}
	if (start_lanes(r)) {
		stop_lanes(r);
		hyb_rq_close(r->rq);
		started(r, -1, "cannot start the reload service's threads");
		return NULL;
	}
	started(r, 1, NULL);
	pfd[0] = (struct pollfd){ .fd = r->efd, .events = POLLIN };
	pfd[1] = (struct pollfd){ .fd = r->stop_efd, .events = POLLIN };
	for (;;) {
		if (poll(pfd, 2, -1) < 0 && errno != EINTR)
			break;
		if (pfd[1].revents)
			break;
		if (pfd[0].revents && read(r->efd, &v, sizeof(v)) < 0 && errno != EAGAIN)
			break;
		/* reset first, then fetch until empty: a later submit signals again */
		if (fetch_all(r, 0) < 0)
			break;	/* the queue is gone */
	}
	stop_lanes(r);
	fetch_all(r, -ESHUTDOWN);	/* what was submitted before we leave */
	hyb_rq_close(r->rq);		/* anything later: -EPIPE */
	r->rq = NULL;
	return NULL;
}

/* -- API ----------------------------------------------------------------- */

static void free_service(struct hyb_reload *r)
{
	struct pool_ref *ref, *next;

	for (ref = r->pools; ref; ref = next) {
		next = ref->next;
		ref_free(r, ref);
	}
	for (int i = 0; i < N_LANES; i++)
		pthread_cond_destroy(&r->lanes[i].cv);
	if (r->efd >= 0)
		close(r->efd);
	if (r->stop_efd >= 0)
		close(r->stop_efd);
	pthread_cond_destroy(&r->started_cv);
	pthread_mutex_destroy(&r->lock);
	pthread_mutex_destroy(&r->pool_lock);
	free(r->model_path);
	free(r);
}

/* O_DIRECT refused by the model's filesystem: buffered slices, without a note per slice. */
static bool refuses_direct(const char *path)
{
	int fd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);

	if (fd >= 0) {
		close(fd);
		return false;
	}
	return errno == EINVAL;
}

struct hyb_reload *hyb_reload_start(const struct hyb_reload_config *cfg, char *err,
				    size_t errlen)
{
	struct hyb_reload *r;

	if (!cfg || !cfg->backend) {
		snprintf(err, errlen, "reload service: no backend");
		return NULL;
	}
	if (cfg->chunk % 4096 || cfg->chunk > (1ull << 30)) {
		snprintf(err, errlen, "reload chunk %llu is not a multiple of 4096 up to 1 GiB",
			 (unsigned long long)cfg->chunk);
		return NULL;
	}
	r = calloc(1, sizeof(*r));
	if (!r) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	r->cfg = *cfg;
	r->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	r->stop_efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	pthread_mutex_init(&r->lock, NULL);
	pthread_mutex_init(&r->pool_lock, NULL);
	pthread_cond_init(&r->started_cv, NULL);
	for (int i = 0; i < N_LANES; i++) {
		r->lanes[i].r = r;
		r->lanes[i].kind = i;
		r->lanes[i].depth = 1;
		/* the device lane keeps two chunks in flight where the device has marks */
		if (i == LANE_DEVICE && cfg->dev && cfg->dev->ops->mark && cfg->dev->ops->wait)
			r->lanes[i].depth = HYB_RELOAD_DEVICE_DEPTH;
		pthread_cond_init(&r->lanes[i].cv, NULL);
	}
	if (cfg->model_path) {
		r->model_path = strdup(cfg->model_path);
		r->cfg.model_path = r->model_path;
		r->buffered = r->model_path && refuses_direct(r->model_path);
	}
	if (r->efd < 0 || r->stop_efd < 0 || (cfg->model_path && !r->model_path)) {
		snprintf(err, errlen, "reload service: %s", strerror(errno));
		free_service(r);
		return NULL;
	}
	if (pthread_create(&r->dispatcher, NULL, dispatcher_main, r)) {
		snprintf(err, errlen, "reload service: cannot start a thread");
		free_service(r);
		return NULL;
	}
	pthread_mutex_lock(&r->lock);
	while (!r->start_state)
		pthread_cond_wait(&r->started_cv, &r->lock);
	pthread_mutex_unlock(&r->lock);
	if (r->start_state < 0) {
		snprintf(err, errlen, "%s", r->start_err);
		pthread_join(r->dispatcher, NULL);
		free_service(r);
		return NULL;
	}
	return r;
}

void hyb_reload_stats(struct hyb_reload *r, struct hyb_reload_stats *out)
{
	pthread_mutex_lock(&r->lock);
	*out = r->st;
	for (int c = 0; c < HYB_RELOAD_CLASSES; c++) {
		hyb_lat_summary(&r->hist[c].wait, &out->cls[c].wait);
		hyb_lat_summary(&r->hist[c].service, &out->cls[c].service);
		hyb_lat_summary(&r->hist[c].total, &out->cls[c].total);
	}
	pthread_mutex_unlock(&r->lock);
}

void hyb_reload_stop(struct hyb_reload *r, struct hyb_reload_stats *out)
{
	uint64_t one = 1;

	if (!r)
		return;
	if (write(r->stop_efd, &one, sizeof(one)) < 0) {
		/* cannot fail: the counter is far from its maximum */
	}
	pthread_join(r->dispatcher, NULL);
	if (out)
		hyb_reload_stats(r, out);
	free_service(r);
}
