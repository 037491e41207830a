// SPDX-License-Identifier: MIT
/*
 * The local backend's reload queue: the module's queue (kmod/queue.c) rebuilt
 * inside one process, with the same rules, limits, errors and statistics.
 *
 *   client submit -> pending[prio] -> daemon eventfd
 *   daemon fetch  -> in service (found again by id)
 *   daemon complete -> client's done list -> client eventfd + condvar
 *   client reap   -> completions out; a blocking reap is a stall
 *
 * Why a mutex and not a lock-free ring: a request moves between several
 * lists (four priorities, in service, one done list per client), batches are
 * all or nothing, a client may leave with requests anywhere, and a dying
 * daemon fails everything at once. Under one short mutex per queue all of it
 * stays simple and provably right; each critical section is a few list
 * operations (well under a microsecond), while a round trip costs two thread
 * wake-ups (eventfd and futex, microseconds each), so a lock-free MPSC ring
 * would save nothing measurable.
 *
 * Requests live in slots, allocated in chunks and recycled through a free
 * list, so a submit allocates nothing once the queue is warm. An id is
 * (sequence << 16 | slot): unique for the life of the queue, and complete
 * finds the slot in O(1) and sees a stale id miss.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "lat_hist.h"
#include "mempool_internal.h"

#define NIL		UINT32_MAX
#define CHUNK		256
#define SLOT_BITS	16
#define MAX_SLOTS	(1U << SLOT_BITS)	/* >= HYB_RQ_MAX_REQUESTS */

enum { S_FREE, S_PENDING, S_ACTIVE, S_DONE };

struct lq_slot {
	struct hyb_rq_req req;
	uint64_t t_submit;
	uint64_t t_fetch;
	uint64_t t_done;
	struct hyb_rq_local_client *client;	/* NULL once the client has left */
	int32_t status;
	uint32_t next;			/* pending, done or free list */
	uint8_t state;
	bool completing;		/* claimed by a complete batch being checked */
};

struct lq_list {
	uint32_t head;
	uint32_t tail;
};

struct hyb_rq_local_client {
	struct hyb_rq_local_client *next;
	uint32_t id;
	int efd;
	bool signal;			/* a completion arrived during this batch */
	pthread_cond_t cv;
	struct lq_list done;
	uint32_t outstanding;		/* submitted, not reaped */
	uint32_t nr_done;
};

struct hyb_lq {
	pthread_mutex_t lock;
	unsigned int refs;		/* the daemon's + one per client */
	unsigned int id;
	bool dead;
	pid_t daemon_pid;
	int efd;			/* the daemon's; -1 once dead */
	struct lq_list pending[HYB_RQ_PRIO_LEVELS];
	struct lq_slot *chunk[MAX_SLOTS / CHUNK];
	uint32_t nslots;
	uint32_t free_head;
	uint64_t seq;
	struct hyb_rq_local_client *clients;
	uint32_t next_client_id;
	uint32_t nr_clients;
	uint64_t nr_pending, nr_active, submitted, completed, failed, stalls;
	struct hyb_lat_hist wait, service, stall;
};

/* Queues with a daemon, by id; lq_tlock is taken before any queue's lock. */
static pthread_mutex_t lq_tlock = PTHREAD_MUTEX_INITIALIZER;
static struct hyb_lq *lq_table[HYB_RQ_MAX_QUEUES];
static atomic_uint_fast64_t lq_total;	/* requests alive, all queues */

static struct lq_slot *slot(struct hyb_lq *q, uint32_t i)
{
	return &q->chunk[i / CHUNK][i % CHUNK];
}

static void list_push(struct hyb_lq *q, struct lq_list *l, uint32_t i)
{
	slot(q, i)->next = NIL;
	if (l->head == NIL)
		l->head = i;
	else
		slot(q, l->tail)->next = i;
	l->tail = i;
}

static uint32_t list_pop(struct hyb_lq *q, struct lq_list *l)
{
	uint32_t i = l->head;

	if (i != NIL) {
		l->head = slot(q, i)->next;
		if (l->head == NIL)
			l->tail = NIL;
	}
	return i;
}

static uint32_t slot_alloc(struct hyb_lq *q)
{
	uint32_t i = q->free_head;

	if (i != NIL) {
		q->free_head = slot(q, i)->next;
		return i;
	}
	if (q->nslots == MAX_SLOTS)
		return NIL;
	if (q->nslots % CHUNK == 0) {
		q->chunk[q->nslots / CHUNK] = calloc(CHUNK, sizeof(struct lq_slot));
		if (!q->chunk[q->nslots / CHUNK])
			return NIL;
	}
	return q->nslots++;
}

static void slot_free(struct hyb_lq *q, uint32_t i)
{
	struct lq_slot *s = slot(q, i);

	s->state = S_FREE;
	s->client = NULL;
	s->next = q->free_head;
	q->free_head = i;
	atomic_fetch_sub(&lq_total, 1);
}

static void efd_signal(int efd)
{
	uint64_t one = 1;

	if (efd >= 0 && write(efd, &one, sizeof(one)) < 0) {
		/* EAGAIN: the count is at its maximum, so the reader wakes anyway. */
	}
}

static void queue_put(struct hyb_lq *q)
{
	bool last;
	unsigned int i;

	pthread_mutex_lock(&q->lock);
	last = --q->refs == 0;
	pthread_mutex_unlock(&q->lock);
	if (!last)
		return;
	for (i = 0; i < MAX_SLOTS / CHUNK; i++)
		free(q->chunk[i]);
	pthread_mutex_destroy(&q->lock);
	free(q);
}

/* A request is over: to its client's done list (signalled), or freed if it has no client. */
static void finish(struct hyb_lq *q, uint32_t i, int32_t status, uint64_t now)
{
	struct lq_slot *s = slot(q, i);
	struct hyb_rq_local_client *c = s->client;

	s->status = status;
	s->t_done = now;
	if (status)
		q->failed++;
	else
		q->completed++;
	if (!c) {
		slot_free(q, i);
		return;
	}
	s->state = S_DONE;
	list_push(q, &c->done, i);
	c->nr_done++;
	c->signal = true;
}

/* Wake every client that got completions (once per batch, not per request). */
static void signal_clients(struct hyb_lq *q)
{
	struct hyb_rq_local_client *c;

	for (c = q->clients; c; c = c->next) {
		if (!c->signal)
			continue;
		c->signal = false;
		efd_signal(c->efd);
		pthread_cond_broadcast(&c->cv);
	}
}

/*
 * The daemon is gone: fail everything, wake everyone, leave the table. The
 * daemon's reference stays until its handle is closed, so a thread still
 * using the handle never sees the queue freed.
 */
static void queue_kill(struct hyb_lq *q)
{
	uint64_t now = hyb_mp_now_ns();
	struct hyb_rq_local_client *c;
	unsigned int p;
	uint32_t i;

	pthread_mutex_lock(&lq_tlock);
	if (lq_table[q->id] == q)
		lq_table[q->id] = NULL;
	pthread_mutex_unlock(&lq_tlock);

	pthread_mutex_lock(&q->lock);
	if (q->dead) {
		pthread_mutex_unlock(&q->lock);
		return;
	}
	q->dead = true;
	for (p = 0; p < HYB_RQ_PRIO_LEVELS; p++) {
		while ((i = list_pop(q, &q->pending[p])) != NIL) {
			q->nr_pending--;
			finish(q, i, -EPIPE, now);
		}
	}
	for (i = 0; i < q->nslots; i++) {
		if (slot(q, i)->state == S_ACTIVE) {
			q->nr_active--;
			finish(q, i, -EPIPE, now);
		}
	}
	q->efd = -1;
	for (c = q->clients; c; c = c->next)
		c->signal = true;
	signal_clients(q);
	pthread_mutex_unlock(&q->lock);
}

static int daemon_attach(struct hyb_rq *rq)
{
	struct hyb_lq *q;
	unsigned int p;
	int ret = 0;

	q = calloc(1, sizeof(*q));
	if (!q)
		return -ENOMEM;
	pthread_mutex_init(&q->lock, NULL);
	q->refs = 1;
	q->id = rq->queue;
	q->efd = rq->efd;
	q->daemon_pid = getpid();
	q->free_head = NIL;
	for (p = 0; p < HYB_RQ_PRIO_LEVELS; p++)
		q->pending[p].head = q->pending[p].tail = NIL;
	pthread_mutex_lock(&lq_tlock);
	if (lq_table[q->id])
		ret = -EBUSY;
	else
		lq_table[q->id] = q;
	pthread_mutex_unlock(&lq_tlock);
	if (ret) {
		pthread_mutex_destroy(&q->lock);
		free(q);
		return ret;
	}
	rq->lq = q;
	return 0;
}

static int client_attach(struct hyb_rq *rq)
{
	struct hyb_rq_local_client *c;
	pthread_condattr_t ca;
	struct hyb_lq *q;

	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&c->cv, &ca);
	pthread_condattr_destroy(&ca);
	c->efd = rq->efd;
	c->done.head = c->done.tail = NIL;

	pthread_mutex_lock(&lq_tlock);
	q = lq_table[rq->queue];
	if (q) {
		pthread_mutex_lock(&q->lock);
		q->refs++;
		c->id = ++q->next_client_id;
		c->next = q->clients;
		q->clients = c;
		q->nr_clients++;
		pthread_mutex_unlock(&q->lock);
	}
	pthread_mutex_unlock(&lq_tlock);
	if (!q) {
		pthread_cond_destroy(&c->cv);
		free(c);
		return -ENOTCONN;
	}
	rq->lq = q;
	rq->lc = c;
	rq->client_id = c->id;
	return 0;
}

int hyb_rq_local_attach(struct hyb_rq *rq)
{
	return rq->daemon ? daemon_attach(rq) : client_attach(rq);
}

/* A NOP names no pool range; an EVICT may name none (its slot is in aux), as the module's. */
static bool has_range(const struct hyb_rq_req *r)
{
	return r->op != HYB_RQ_NOP &&
	       !(r->op == HYB_RQ_EVICT && !r->pool_id && !r->pool_off && !r->len);
}

int hyb_rq_local_submit(struct hyb_rq *rq, const struct hyb_rq_req *reqs, unsigned int n)
{
	struct hyb_lq *q = rq->lq;
	struct hyb_rq_local_client *c = rq->lc;
	uint32_t idx[HYB_RQ_MAX_BATCH];
	unsigned int i, k;
	uint64_t now;
	int ret = 0;

	for (i = 0; i < n; i++) {
		if (!has_range(&reqs[i]))
			continue;
		ret = hyb_mempool_local_check_range(reqs[i].pool_id, reqs[i].pool_off, reqs[i].len, false);
		if (ret)
			return ret;
	}
	if (atomic_fetch_add(&lq_total, n) + n > HYB_RQ_MAX_REQUESTS) {
		atomic_fetch_sub(&lq_total, n);
		return -EAGAIN;
	}
	now = hyb_mp_now_ns();
	pthread_mutex_lock(&q->lock);
	if (q->dead) {
		ret = -EPIPE;
	} else if (c->outstanding + n > HYB_RQ_CLIENT_MAX) {
		ret = -EAGAIN;
	} else {
		for (i = 0; i < n; i++) {
			idx[i] = slot_alloc(q);
			if (idx[i] == NIL) {
				for (k = 0; k < i; k++) {
					slot(q, idx[k])->next = q->free_head;
					q->free_head = idx[k];
				}
				ret = -ENOMEM;
				break;
			}
		}
	}
	if (ret) {
		pthread_mutex_unlock(&q->lock);
		atomic_fetch_sub(&lq_total, n);
		return ret;
	}
	for (i = 0; i < n; i++) {
		struct lq_slot *s = slot(q, idx[i]);

		s->req = reqs[i];
		s->req.id = (++q->seq << SLOT_BITS) | idx[i];
		s->req.client_id = c->id;
		s->t_submit = now;
		s->t_fetch = 0;
		s->client = c;
		s->state = S_PENDING;
		s->completing = false;
		list_push(q, &q->pending[reqs[i].prio], idx[i]);
	}
	c->outstanding += n;
	q->submitted += n;
	q->nr_pending += n;
	/* Under the lock: a daemon that is closing cannot have closed its eventfd yet. */
	efd_signal(q->efd);
	pthread_mutex_unlock(&q->lock);
	for (i = 0; i < n; i++)
		if (has_range(&reqs[i]))
			hyb_mempool_local_check_range(reqs[i].pool_id, reqs[i].pool_off, reqs[i].len, true);
	return 0;
}

int hyb_rq_local_fetch(struct hyb_rq *rq, struct hyb_rq_req *out, struct hyb_rq_sender *from,
		       unsigned int max)
{
	struct hyb_lq *q = rq->lq;
	uint64_t now = hyb_mp_now_ns();
	unsigned int n = 0, p;
	uint32_t i;

	pthread_mutex_lock(&q->lock);
	for (p = 0; p < HYB_RQ_PRIO_LEVELS && n < max; p++) {
		while (n < max && (i = list_pop(q, &q->pending[p])) != NIL) {
			struct lq_slot *s = slot(q, i);

			s->state = S_ACTIVE;
			s->t_fetch = now;
			out[n++] = s->req;
		}
	}
	q->nr_pending -= n;
	q->nr_active += n;
	pthread_mutex_unlock(&q->lock);
	/* every client of an in-process queue is this process */
	for (i = 0; from && i < n; i++)
		from[i] = (struct hyb_rq_sender){ .uid = (uint32_t)geteuid(),
						  .gid = (uint32_t)getegid(),
						  .pid = (int32_t)getpid() };
	return (int)n;
}

static uint32_t active_find(struct hyb_lq *q, uint64_t id)
{
	uint32_t i = (uint32_t)(id & (MAX_SLOTS - 1));

	if (i >= q->nslots)
		return NIL;
	if (slot(q, i)->state != S_ACTIVE || slot(q, i)->req.id != id)
		return NIL;
	return i;
}

int hyb_rq_local_complete(struct hyb_rq *rq, const struct hyb_rq_done *done, unsigned int n)
{
	struct hyb_lq *q = rq->lq;
	uint32_t idx[HYB_RQ_MAX_BATCH];
	unsigned int k, j;
	uint64_t now;

	pthread_mutex_lock(&q->lock);
	/* All or nothing: claim every id first (a duplicate fails too). */
	for (k = 0; k < n; k++) {
		idx[k] = active_find(q, done[k].id);
		if (idx[k] == NIL || slot(q, idx[k])->completing) {
			for (j = 0; j < k; j++)
				slot(q, idx[j])->completing = false;
			pthread_mutex_unlock(&q->lock);
			return -ENOENT;
		}
		slot(q, idx[k])->completing = true;
	}
	now = hyb_mp_now_ns();
	for (k = 0; k < n; k++) {
		struct lq_slot *s = slot(q, idx[k]);

		s->completing = false;
		q->nr_active--;
		hyb_lat_add(&q->wait, s->t_fetch - s->t_submit);
		hyb_lat_add(&q->service, now - s->t_fetch);
		finish(q, idx[k], done[k].status, now);
	}
	signal_clients(q);
	pthread_mutex_unlock(&q->lock);
	return 0;
}

static bool reap_ready(struct hyb_lq *q, struct hyb_rq_local_client *c, unsigned int want)
{
	return c->nr_done >= want || c->nr_done >= c->outstanding || q->dead;
}

int hyb_rq_local_reap(struct hyb_rq *rq, struct hyb_rq_cqe *out, unsigned int max, unsigned int min,
		uint64_t timeout_ns)
{
	struct hyb_lq *q = rq->lq;
	struct hyb_rq_local_client *c = rq->lc;
	struct timespec dl;
	uint64_t t0, t1, end;
	unsigned int n = 0;
	int wait_ret = 0;
	uint32_t i;

	pthread_mutex_lock(&q->lock);
	if (min && !reap_ready(q, c, min)) {
		/* Blocked: a stall, timed from here to the wake-up. */
		t0 = hyb_mp_now_ns();
		end = timeout_ns ? t0 + timeout_ns : 0;
		dl.tv_sec = (time_t)(end / 1000000000ULL);
		dl.tv_nsec = (long)(end % 1000000000ULL);
		while (!reap_ready(q, c, min)) {
			if (!timeout_ns) {
				pthread_cond_wait(&c->cv, &q->lock);
			} else if (pthread_cond_timedwait(&c->cv, &q->lock, &dl) == ETIMEDOUT) {
				wait_ret = reap_ready(q, c, min) ? 0 : -ETIMEDOUT;
				break;
			}
		}
		t1 = hyb_mp_now_ns();
		hyb_lat_add(&q->stall, t1 - t0);
		q->stalls++;
	}
	while (n < max && (i = list_pop(q, &c->done)) != NIL) {
		struct lq_slot *s = slot(q, i);
		struct hyb_rq_cqe *e = &out[n++];

		memset(e, 0, sizeof(*e));
		e->id = s->req.id;
		e->tag = s->req.tag;
		e->status = s->status;
		if (s->t_fetch) {
			e->wait_ns = s->t_fetch - s->t_submit;
			e->service_ns = s->t_done - s->t_fetch;
		} else {
			e->wait_ns = s->t_done - s->t_submit;
		}
		slot_free(q, i);
	}
	c->nr_done -= n;
	c->outstanding -= n;
	if (!n && q->dead)
		wait_ret = -EPIPE;
	pthread_mutex_unlock(&q->lock);
	return n ? (int)n : wait_ret;
}

/* A client leaves: its queued requests are dropped, those in service orphaned. */
static void client_detach(struct hyb_lq *q, struct hyb_rq_local_client *c)
{
	struct hyb_rq_local_client **pp;
	struct lq_list keep;
	unsigned int p;
	uint32_t i;

	pthread_mutex_lock(&q->lock);
	for (pp = &q->clients; *pp; pp = &(*pp)->next) {
		if (*pp == c) {
			*pp = c->next;
			break;
		}
	}
	q->nr_clients--;
	for (p = 0; p < HYB_RQ_PRIO_LEVELS; p++) {
		keep.head = keep.tail = NIL;
		while ((i = list_pop(q, &q->pending[p])) != NIL) {
			if (slot(q, i)->client != c) {
				list_push(q, &keep, i);
				continue;
			}
			q->nr_pending--;
			q->failed++;
			slot_free(q, i);
		}
		q->pending[p] = keep;
	}
	for (i = 0; i < q->nslots; i++)
		if (slot(q, i)->state == S_ACTIVE && slot(q, i)->client == c)
			slot(q, i)->client = NULL;
	while ((i = list_pop(q, &c->done)) != NIL)
		slot_free(q, i);
	pthread_mutex_unlock(&q->lock);
	pthread_cond_destroy(&c->cv);
	free(c);
	queue_put(q);
}

void hyb_rq_local_kill(struct hyb_rq *rq)
{
	queue_kill(rq->lq);
}

void hyb_rq_local_close(struct hyb_rq *rq)
{
	if (rq->daemon) {
		queue_kill(rq->lq);
		queue_put(rq->lq);
	} else {
		client_detach(rq->lq, rq->lc);
	}
}

int hyb_rq_local_stats(unsigned int queue, struct hyb_rq_stats *out)
{
	struct hyb_lq *q;

	pthread_mutex_lock(&lq_tlock);
	q = lq_table[queue];
	if (q) {
		pthread_mutex_lock(&q->lock);
		out->live = !q->dead;
		out->daemon_pid = q->daemon_pid;
		out->clients = q->nr_clients;
		out->submitted = q->submitted;
		out->completed = q->completed;
		out->failed = q->failed;
		out->queued = q->nr_pending;
		out->in_service = q->nr_active;
		out->in_flight = q->nr_pending + q->nr_active;
		out->stalls = q->stalls;
		hyb_lat_summary(&q->wait, &out->queue_wait);
		hyb_lat_summary(&q->service, &out->service);
		hyb_lat_summary(&q->stall, &out->stall);
		pthread_mutex_unlock(&q->lock);
	}
	pthread_mutex_unlock(&lq_tlock);
	return 0;
}

unsigned int hyb_rq_local_nr_queues(void)
{
	unsigned int i, n = 0;

	pthread_mutex_lock(&lq_tlock);
	for (i = 0; i < HYB_RQ_MAX_QUEUES; i++)
		n += lq_table[i] != NULL;
	pthread_mutex_unlock(&lq_tlock);
	return n;
}

uint64_t hyb_rq_local_nr_requests(void)
{
	return atomic_load(&lq_total);
}
