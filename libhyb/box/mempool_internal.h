/* SPDX-License-Identifier: MIT */
/*
 * Inside the pool/queue API (hyb/pool.h): the front end (mempool.c) checks
 * every argument, writes the error messages and tracks daemon threads; a
 * backend (mempool_kmod.c, mempool_local.c + rq_local.c) implements these
 * operations on arguments that are already valid.
 */
#ifndef HYB_MEMPOOL_INTERNAL_H
#define HYB_MEMPOOL_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "hyb/pool.h"

struct hyb_mempool_ops {
	enum hyb_backend_kind kind;
	uint32_t caps;
	int (*open)(struct hyb_backend *b, char *err, size_t err_len);
	void (*close)(struct hyb_backend *b);
	int (*info)(struct hyb_backend *b, struct hyb_backend_info *out);

	/* Fill p (id, bytes, owned, backend data) for a new or existing pool. */
	int (*pool_create)(struct hyb_mempool *p, const char *name, uint64_t bytes, int node,
			   unsigned int flags);
	int (*pool_open)(struct hyb_mempool *p, const char *name, uint32_t id);
	int (*pool_stat)(struct hyb_backend *b, uint32_t id, struct hyb_mempool_info *out);
	int (*pool_list)(struct hyb_backend *b, uint32_t *ids, unsigned int max);
	int (*pool_map)(struct hyb_mempool *p);	/* sets p->addr */
	int (*pool_destroy)(struct hyb_mempool *p);
	int (*pool_move)(struct hyb_mempool *p, int node);
	void (*pool_close)(struct hyb_mempool *p);	/* unmap, drop */

	int (*rq_attach)(struct hyb_rq *rq);	/* rq->daemon, queue, efd set */
	int (*rq_submit)(struct hyb_rq *rq, const struct hyb_rq_req *reqs, unsigned int n);
	int (*rq_reap)(struct hyb_rq *rq, struct hyb_rq_cqe *out, unsigned int max,
		       unsigned int min, uint64_t timeout_ns);
	/* from: NULL, or the sender of each request */
	int (*rq_fetch)(struct hyb_rq *rq, struct hyb_rq_req *out, struct hyb_rq_sender *from,
			unsigned int max);
	int (*rq_complete)(struct hyb_rq *rq, const struct hyb_rq_done *done, unsigned int n);
	void (*rq_kill)(struct hyb_rq *rq);	/* the daemon's thread exited */
	void (*rq_close)(struct hyb_rq *rq);
	int (*rq_stats)(struct hyb_backend *b, unsigned int queue, struct hyb_rq_stats *out);
};

struct hyb_backend {
	const struct hyb_mempool_ops *ops;
	int fd;			/* kmod: this handle's open file of /dev/hybpool */
	int writable;		/* kmod: opened read-write */
};

struct hyb_mempool {
	struct hyb_backend *b;
	const struct hyb_mempool_ops *ops;	/* close works after the backend is gone */
	uint32_t id;
	uint64_t bytes;
	int owned;
	void *addr;		/* NULL until mapped */
	uint64_t mmap_offset;	/* kmod */
	struct hyb_lpool *lp;	/* local */
	struct hyb_mempool *lp_next;	/* local: the pool's open handles */
};

struct hyb_rq {
	struct hyb_backend *b;
	const struct hyb_mempool_ops *ops;	/* close works after the backend is gone */
	bool daemon;
	unsigned int queue;
	int efd;
	bool own_efd;
	uint32_t client_id;
	int fd;				/* kmod: the role's own open file */
	struct hyb_lq *lq;		/* local: the queue */
	struct hyb_rq_local_client *lc;	/* local: this client */
	atomic_bool dead;		/* daemon: its thread exited */
	pthread_t thread;		/* daemon: the thread that attached */
	struct hyb_rq *dnext;		/* daemon: list of thread-bound daemons */
};

extern const struct hyb_mempool_ops hyb_mempool_kmod_ops;
extern const struct hyb_mempool_ops hyb_mempool_local_ops;

/* Set the calling thread's error message; returns err (a negative errno). */
int hyb_mp_err(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
uint64_t hyb_mp_now_ns(void);
/* The calling thread's node (for HYB_MEMPOOL_NODE_LOCAL). */
int hyb_mp_local_node(void);
/* Half of physical memory: the default pinned-memory cap, like hybpool.ko's. */
uint64_t hyb_mp_default_cap(void);

/* rq_local.c: the in-process queue (the local ops call these). */
int hyb_rq_local_attach(struct hyb_rq *rq);
int hyb_rq_local_submit(struct hyb_rq *rq, const struct hyb_rq_req *reqs, unsigned int n);
int hyb_rq_local_reap(struct hyb_rq *rq, struct hyb_rq_cqe *out, unsigned int max, unsigned int min,
		uint64_t timeout_ns);
int hyb_rq_local_fetch(struct hyb_rq *rq, struct hyb_rq_req *out, struct hyb_rq_sender *from,
		       unsigned int max);
int hyb_rq_local_complete(struct hyb_rq *rq, const struct hyb_rq_done *done, unsigned int n);
void hyb_rq_local_kill(struct hyb_rq *rq);
void hyb_rq_local_close(struct hyb_rq *rq);
int hyb_rq_local_stats(unsigned int queue, struct hyb_rq_stats *out);
unsigned int hyb_rq_local_nr_queues(void);
uint64_t hyb_rq_local_nr_requests(void);
/* mempool_local.c: a pool range check for submit; counts a reload when count. */
int hyb_mempool_local_check_range(uint32_t id, uint64_t off, uint64_t len, bool count);

#endif
