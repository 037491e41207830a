/* SPDX-License-Identifier: MIT */
/*
 * The reload service: the daemon side of a reload queue
 * (hyb/pool.h, hyb_rq_*), run as threads - inside hybd in box mode (kmod
 * backend), inside the app in embedded mode (local backend).
 *
 * Ops (struct hyb_rq_req):
 *   HYB_RQ_LOAD    storage -> pool: the model file's [aux, aux + len) into pool
 *                  [pool_off, pool_off + len), through the io_uring streaming
 *                  engine (stream.h). On-demand paging: what a DRAM budget
 *                  left on storage (manifest: tensors and bundles with no pool)
 *                  is brought into a page pool this way.
 *   HYB_RQ_UPLOAD  pool [pool_off, pool_off + len) -> cache slot aux of the
 *                  copy device (copydev.h: CUDA, or the CPU device).
 *   HYB_RQ_EVICT   drop cache slot aux (the pool range is not used).
 *   HYB_RQ_NOP     completes at once (a round trip).
 *
 * Priorities (KAIROX 5.1 and 8, "priority-aware stream management": a
 * critical I/O stream, a reload stream, and an executor that pre-empts queued
 * reloads when critical work arrives). Three service classes:
 *   critical  HYB_RQ_CRITICAL           data the next compute step waits for
 *   reload    HYB_RQ_HIGH, HYB_RQ_NORMAL balancer decisions (HIGH first)
 *   prefetch  HYB_RQ_LOW                speculative; runs when nothing else does
 * Mechanism: the dispatcher thread (the queue's daemon) fetches every request
 * as soon as it is submitted and files it in one FIFO per priority of its
 * lane (storage: LOAD; device: UPLOAD, EVICT - separate, like KAIROX's
 * separate streams, so a copy never waits behind a disk read). A lane
 * executes requests a chunk at a time and picks every chunk afresh from the
 * highest non-empty priority, so queued lower-priority work is reordered
 * behind new critical work and a large reload is pre-empted between two
 * chunks. The storage lane has one chunk in flight; the device lane keeps
 * HYB_RELOAD_DEVICE_DEPTH (2) in flight (copy devices with marks: CUDA and
 * CPU; one otherwise): it queues chunk k+1 on the copy engine before it waits
 * for chunk k, so the link does not idle for a host round trip per chunk.
 * Bound: a critical request waits for at most the chunks in flight in its
 * lane when it arrives - 1 (storage) or HYB_RELOAD_DEVICE_DEPTH (device) -
 * plus the chunks of critical requests ahead of it; reported per request as
 * slices_waited (chunks picked before its first one and not landed when it
 * came). A request completes (its CQE is posted) only after its last chunk
 * has landed. Lower classes can starve while higher ones keep a lane busy;
 * that is the point of the classes.
 *
 * Errors are per request (status in its completion; one-line reason to
 * on_done): -ENXIO no such pool, -ENOSPC range past the end of the pool or
 * of a cache slot, -EACCES pool not writable by the service (not its owner),
 * -ERANGE storage range past the end of the model file, -ENOENT (or the
 * open errno) model file gone, -EIO read failed, -EINVAL slot out of range,
 * -ENODEV no copy device, -ESHUTDOWN the service is stopping. Requests in a
 * batch are independent; no order holds between requests of different
 * lanes or priorities (an app that uploads what it loads waits for the LOAD).
 *
 * Shutdown (hyb_reload_stop): stop taking work, let the chunks in flight in
 * each lane finish (no I/O is abandoned into memory), fail everything else -
 * queued, partly done, and whatever is still in the queue - with -ESHUTDOWN,
 * then leave the queue (late submitters get -EPIPE).
 */
#ifndef HYB_RELOAD_H
#define HYB_RELOAD_H

#include <stdbool.h>
#include <stdint.h>

#include "copydev.h"
#include "hyb/pool.h"
#include "hyb/stalls.h"

/*
 * Chunks the device lane keeps in flight (two: the least that hides the host
 * round trip between chunks; each more is one more chunk a critical request
 * may wait behind, since the copy engine runs DMA in submission order).
 */
#define HYB_RELOAD_DEVICE_DEPTH	2

/* What on_done hears about every finished request (NOPs excepted). */
struct hyb_reload_event {
	const struct hyb_rq_req *req;
	int status;			/* 0 or a negative errno */
	const char *msg;		/* why it failed; "" on success */
	uint64_t queued_ns;		/* fetched from the queue (CLOCK_MONOTONIC) */
	uint64_t started_ns;		/* its first chunk began (= done_ns if never) */
	uint64_t done_ns;
	uint32_t slices;		/* chunks executed */
	/*
	 * chunks of others ahead of its first: in flight when it was queued,
	 * or picked since (critical: <= its lane's depth + criticals ahead)
	 */
	uint32_t slices_waited;
	uint32_t preempted;		/* times a chunk of another request ran in its middle */
};

/*
 * Who may ask for LOAD, UPLOAD and EVICT (hybd.conf `clients`): the
 * sender's effective uid or gid must be one of these (the queue says who
 * sent each request: hyb_rq_fetch_from). n == 0: anyone the device admits.
 * Others' requests fail with -EACCES; NOPs are always answered.
 */
#define HYB_RELOAD_MAX_CLIENTS	16
struct hyb_reload_clients {
	unsigned int n;
	struct {
		bool gid;		/* else a uid */
		uint32_t id;
	} ids[HYB_RELOAD_MAX_CLIENTS];
};

/* Does the policy admit this sender? */
bool hyb_reload_client_ok(const struct hyb_reload_clients *c, const struct hyb_rq_sender *s);

struct hyb_reload_config {
	struct hyb_backend *backend;	/* pools are opened through it (LOAD: its own pools) */
	unsigned int queue;		/* the reload queue to serve */
	const char *model_path;		/* LOAD source; NULL: LOAD fails with -ENODEV */
	uint64_t chunk;			/* pre-emption unit (multiple of 4096); 0: 1 MiB */
	unsigned int io_depth;		/* reads in flight within a chunk; 0: 8 */
	struct hyb_copydev *dev;	/* UPLOAD/EVICT target; NULL: they fail with -ENODEV */
	struct hyb_reload_clients clients;	/* who may ask (n == 0: anyone) */
	void (*on_done)(const struct hyb_reload_event *ev, void *arg);	/* any thread */
	void *arg;
};

struct hyb_reload;

/*
 * Attach as the daemon of cfg->queue and start serving. NULL with a message
 * (-EBUSY: the queue has a daemon already; no memory; no threads).
 */
struct hyb_reload *hyb_reload_start(const struct hyb_reload_config *cfg, char *err,
				    size_t errlen);
/* Shut down as described above and free; final statistics into out (may be NULL). */
void hyb_reload_stop(struct hyb_reload *r, struct hyb_reload_stats *out);
void hyb_reload_stats(struct hyb_reload *r, struct hyb_reload_stats *out);

#endif
