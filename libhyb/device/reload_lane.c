// SPDX-License-Identifier: MIT
/* The RELOAD stream's progressive issue: see reload_lane.h. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "reload_lane.h"

enum { LANE_COPY, LANE_RECORD, LANE_WAIT };

#define LANE_OUT 2 /* chunks outstanding at most: one on the link, one queued behind it */

void hyb_lane_init(struct hyb_lane *l, const struct hyb_lane_ops *ops, uint64_t chunk)
{
	memset(l, 0, sizeof(*l));
	l->ops = *ops;
	l->chunk = chunk ? chunk : 1ull << 20;
	pthread_mutex_init(&l->mu, NULL);
	pthread_cond_init(&l->work, NULL);
	pthread_cond_init(&l->moved, NULL);
}

static struct hyb_lane_op *at(const struct hyb_lane *l, size_t i)
{
	return &l->q[(l->head + i) % l->cap];
}

static int fail(struct hyb_lane *l, int rc)
{
	l->failed = rc < 0 ? rc : -EIO;
	pthread_cond_broadcast(&l->moved);
	return l->failed;
}

static bool holds(const struct hyb_lane *l, const void *ev)
{
	for (size_t i = 0; i < l->n; i++)
		if (at(l, i)->kind == LANE_RECORD && at(l, i)->ev == ev)
			return true;
	return false;
}

/* Take note of landed chunks (poll), oldest first. */
static void retire(struct hyb_lane *l)
{
	while (l->out && l->ops.marker_done(l->ops.ctx, l->oldest)) {
		l->out--;
		l->oldest ^= 1;
	}
}

/* Submit records, waits and chunks in order while fewer than two chunks are out. */
static int submit(struct hyb_lane *l)
{
	int rc;

	retire(l);
	while (l->n) {
		struct hyb_lane_op *op = at(l, 0);

		if (op->kind == LANE_COPY) {
			const uint64_t len = op->n - op->off < l->chunk ? op->n - op->off : l->chunk;
			/* marker of the new chunk: the one after the oldest outstanding */
			const int k = (l->oldest + l->out) & 1;

			if (l->out == LANE_OUT)
				break;
			rc = l->ops.copy(l->ops.ctx, (char *)op->dst + op->off,
					 (const char *)op->src + op->off, len, op->dir, k);
			if (rc)
				return fail(l, rc);
			l->out++;
			l->chunks++;
			op->off += len;
			if (op->off < op->n)
				continue;
		} else {
			rc = op->kind == LANE_RECORD ? l->ops.record(l->ops.ctx, op->ev) :
						       l->ops.wait(l->ops.ctx, op->ev);
			if (rc)
				return fail(l, rc);
		}
		l->head = (l->head + 1) % l->cap;
		l->n--;
	}
	pthread_cond_broadcast(&l->moved);
	if (l->out) /* the thread waits for them (it sleeps while none is out) */
		pthread_cond_signal(&l->work);
	return 0;
}

static int pump_locked(struct hyb_lane *l, bool block, const void *held)
{
	int rc;

	for (;;) {
		if (l->failed)
			return l->failed;
		if ((rc = submit(l)))
			return rc;
		if (!block || !l->n || (held && !holds(l, held)))
			return 0;
		if (l->running) {
			/* the thread waits for chunks and submits: wait for it to move */
			pthread_cond_wait(&l->moved, &l->mu);
		} else if ((rc = l->ops.marker_wait(l->ops.ctx, l->oldest))) {
			return fail(l, rc);
		}
	}
}

/* The lane's thread: wait for the oldest chunk, submit what can follow it. */
static void *lane_thread(void *arg)
{
	struct hyb_lane *l = arg;

	if (l->ops.thread_init)
		l->ops.thread_init(l->ops.ctx);
	pthread_mutex_lock(&l->mu);
	while (!l->stop) {
		if (l->failed || !l->out) {
			if (!l->failed && l->n && !submit(l) && l->out)
				continue;
			pthread_cond_wait(&l->work, &l->mu);
			continue;
		}
		const int k = l->oldest;
		int rc;

		l->busy = true;
		pthread_mutex_unlock(&l->mu);
		rc = l->ops.marker_wait(l->ops.ctx, k);
		pthread_mutex_lock(&l->mu);
		l->busy = false;
		if (rc)
			fail(l, rc);
		else
			submit(l);
	}
	pthread_mutex_unlock(&l->mu);
	return NULL;
}

int hyb_lane_start(struct hyb_lane *l)
{
	int rc;

	pthread_mutex_lock(&l->mu);
	l->running = true;
	pthread_mutex_unlock(&l->mu);
	rc = pthread_create(&l->th, NULL, lane_thread, l);
	if (rc) {
		l->running = false;
		return -rc;
	}
	return 0;
}

void hyb_lane_free(struct hyb_lane *l)
{
	pthread_mutex_lock(&l->mu);
	(void)pump_locked(l, true, NULL);
	l->stop = true;
	pthread_cond_broadcast(&l->work);
	pthread_mutex_unlock(&l->mu);
	if (l->running)
		pthread_join(l->th, NULL);
	pthread_mutex_destroy(&l->mu);
	pthread_cond_destroy(&l->work);
	pthread_cond_destroy(&l->moved);
	free(l->q);
	memset(l, 0, sizeof(*l));
}

bool hyb_lane_idle(const struct hyb_lane *l)
{
	struct hyb_lane *m = (struct hyb_lane *)l;
	bool idle;

	pthread_mutex_lock(&m->mu);
	idle = !l->n;
	pthread_mutex_unlock(&m->mu);
	return idle;
}

bool hyb_lane_holds(const struct hyb_lane *l, const void *ev)
{
	struct hyb_lane *m = (struct hyb_lane *)l;
	bool h;

	pthread_mutex_lock(&m->mu);
	h = holds(l, ev);
	pthread_mutex_unlock(&m->mu);
	return h;
}

static int push(struct hyb_lane *l, const struct hyb_lane_op *op)
{
	int rc = 0;

	pthread_mutex_lock(&l->mu);
	if (l->failed) {
		rc = l->failed;
	} else if (l->n == l->cap) {
		const size_t cap = l->cap ? 2 * l->cap : 64;
		struct hyb_lane_op *q = malloc(sizeof(*q) * cap);

		if (!q) {
			rc = -ENOMEM;
		} else {
			for (size_t i = 0; i < l->n; i++)
				q[i] = *at(l, i);
			free(l->q);
			l->q = q;
			l->cap = cap;
			l->head = 0;
		}
	}
	if (!rc) {
		*at(l, l->n++) = *op;
		rc = submit(l);
		pthread_cond_signal(&l->work);
	}
	pthread_mutex_unlock(&l->mu);
	return rc;
}

int hyb_lane_copy(struct hyb_lane *l, void *dst, const void *src, uint64_t n, int dir)
{
	const struct hyb_lane_op op = { .kind = LANE_COPY, .dir = dir, .dst = dst, .src = src,
					.n = n };

	return n ? push(l, &op) : 0;
}

int hyb_lane_record(struct hyb_lane *l, void *ev)
{
	const struct hyb_lane_op op = { .kind = LANE_RECORD, .ev = ev };

	return push(l, &op);
}

int hyb_lane_wait(struct hyb_lane *l, void *ev)
{
	const struct hyb_lane_op op = { .kind = LANE_WAIT, .ev = ev };

	return push(l, &op);
}

int hyb_lane_pump(struct hyb_lane *l, bool block, const void *held)
{
	int rc;

	pthread_mutex_lock(&l->mu);
	rc = pump_locked(l, block, held);
	pthread_mutex_unlock(&l->mu);
	return rc;
}
