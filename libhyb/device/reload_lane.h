/* SPDX-License-Identifier: MIT */
/*
 * The RELOAD stream's progressive issue (KAIROX 5.1's I/O executor;
 * docs/DEVICE.md). A GPU's copy engine takes copies in submission order
 * whatever their stream's priority, so a critical copy waits for every
 * reload chunk queued before it. The lane keeps the RELOAD stream's work
 * (copies cut into chunks, event records, waits) in a host queue in order
 * and submits it as the stream drains: at most two chunks outstanding, so a
 * critical copy waits for at most two. A thread of its own (KAIROX's I/O
 * executor; hyb_lane_start) waits for the oldest chunk and submits the next,
 * so the link stays busy while the caller computes; without it (the tests'
 * first mode) only the caller's hyb_lane_pump moves the queue.
 *
 * The backend (the CUDA device) supplies the stream operations; a record
 * the lane still holds is "pending" for the backend (its event is not yet
 * recorded, so it must not read as complete). Plain C and no CUDA here, so
 * the logic is tested on any machine (tests/unit/test_reload_lane.c).
 */
#ifndef HYB_RELOAD_LANE_H
#define HYB_RELOAD_LANE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct hyb_lane_ops {
	void *ctx;
	/* queue n bytes from src to dst (dir: the backend's direction code), then marker k (0/1) */
	int (*copy)(void *ctx, void *dst, const void *src, uint64_t n, int dir, int k);
	bool (*marker_done)(void *ctx, int k);  /* poll: marker k's chunk has landed */
	int (*marker_wait)(void *ctx, int k);   /* block until it has */
	int (*record)(void *ctx, void *ev);     /* record ev on the stream now (no longer pending) */
	int (*wait)(void *ctx, void *ev);       /* the stream waits for ev */
	void (*thread_init)(void *ctx);         /* in the lane's thread first (or NULL) */
};

struct hyb_lane_op {
	int kind;              /* LANE_COPY, LANE_RECORD, LANE_WAIT (reload_lane.c) */
	int dir;
	void *dst, *ev;
	const void *src;
	uint64_t n, off;       /* a copy: its bytes, and how many were submitted */
};

struct hyb_lane {
	struct hyb_lane_ops ops;
	uint64_t chunk;            /* bytes a chunk */
	struct hyb_lane_op *q;     /* ring */
	size_t head, n, cap;
	int out;                   /* chunks outstanding (0..2) */
	int oldest;                /* marker of the oldest outstanding chunk */
	uint64_t chunks;           /* submitted, ever (statistics, tests) */
	int failed;                /* a backend error: every later call returns it */
	/* the thread: mu guards everything above; moved: something was retired or submitted */
	pthread_mutex_t mu;
	pthread_cond_t work, moved;
	pthread_t th;
	bool running, stop, busy;  /* busy: the thread is in marker_wait, mu released */
};

void hyb_lane_init(struct hyb_lane *l, const struct hyb_lane_ops *ops, uint64_t chunk);
/* Start the lane's thread (0, or a negative errno: the lane then runs without it). */
int hyb_lane_start(struct hyb_lane *l);
/* Stops the thread (after the queue has drained), frees the queue. */
void hyb_lane_free(struct hyb_lane *l);
/* Nothing held: new work may go straight to the stream. */
bool hyb_lane_idle(const struct hyb_lane *l);
/* Queue work in order (0, or a negative errno); each pumps without blocking. */
int hyb_lane_copy(struct hyb_lane *l, void *dst, const void *src, uint64_t n, int dir);
int hyb_lane_record(struct hyb_lane *l, void *ev);
int hyb_lane_wait(struct hyb_lane *l, void *ev);
/*
 * Submit what the stream can take: retire landed chunks, then submit
 * records, waits and chunks in order while fewer than two chunks are
 * outstanding. block: wait for the oldest chunk when that is all that
 * holds the queue up, until held is submitted (held NULL: until empty).
 */
int hyb_lane_pump(struct hyb_lane *l, bool block, const void *held);
/* Is a record of ev still in the queue? */
bool hyb_lane_holds(const struct hyb_lane *l, const void *ev);

#ifdef __cplusplus
}
#endif

#endif
