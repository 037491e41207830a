/* SPDX-License-Identifier: MIT */
/*
 * Neuron pools and the reload queue: one API, two backends (docs/BOX.md).
 *
 * docs/BOX.md has the rest: the details.
 */
#ifndef HYB_POOL_H
#define HYB_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "hyb/error.h"

/* -- backends ------------------------------------------------------------ */

enum hyb_backend_kind {
	HYB_BACKEND_AUTO = 0,	/* kmod when /dev/hybpool opens, else local ($HYB_BACKEND) */
	HYB_BACKEND_KMOD = 1,
	HYB_BACKEND_LOCAL = 2,
};

struct hyb_backend;

/* Capabilities (hyb_backend_info.caps). */
#define HYB_BACKEND_CROSS_PROCESS (1U << 0) /* pools and queues reach other processes */
#define HYB_BACKEND_CAN_MOVE	 (1U << 1) /* hyb_mempool_move() works */
#define HYB_BACKEND_COUNTS_FAULTS (1U << 2) /* hyb_mempool_info.faults is counted */

struct hyb_backend_info {
	enum hyb_backend_kind kind;	/* KMOD or LOCAL, never AUTO */
	uint32_t caps;			/* HYB_BACKEND_* */
	uint32_t abi_version;		/* kmod: the module's ABI; local: 1 */
	uint32_t nr_pools;		/* live pools (local: of this process) */
	uint32_t nr_zombies;		/* destroyed pools still mapped somewhere */
	uint32_t nr_queues;		/* queues with a daemon attached */
	uint64_t pinned_bytes;		/* memory held by all pools, zombies included */
	uint64_t pinned_cap;		/* a create past it fails with -ENOSPC */
	uint64_t nr_requests;		/* reload requests alive */
	uint64_t page_sizes;		/* bit n set: pages of 2^n bytes supported */
};

/*
 * Open a backend. AUTO picks kmod when /dev/hybpool can be opened and local
 * otherwise; the environment variable HYB_BACKEND=kmod|local overrides AUTO.
 * NULL on failure with a one-line reason in hyb_last_error(), e.g.
 * "hybpool module not loaded: /dev/hybpool not found".
 */
struct hyb_backend *hyb_backend_open(enum hyb_backend_kind kind);
/*
 * Pools this handle owns are destroyed (mappings stay valid until closed).
 * Pool and queue handles opened through it may only be closed afterwards.
 */
void hyb_backend_close(struct hyb_backend *b);
enum hyb_backend_kind hyb_backend_kind(const struct hyb_backend *b);
const char *hyb_backend_name(enum hyb_backend_kind kind);	/* "auto" "kmod" "local" */
int hyb_backend_info(struct hyb_backend *b, struct hyb_backend_info *out);

/* -- pools --------------------------------------------------------------- */

#define HYB_MEMPOOL_NAME_LEN	32		/* NUL included: 1..31 of [A-Za-z0-9._-] */
#define HYB_MEMPOOL_NODE_LOCAL	(-1)		/* create: the calling thread's node */
#define HYB_MEMPOOL_PAGE_2M	(2ULL << 20)	/* the page size (0 means this) */
#define HYB_MEMPOOL_PAGE_1G	(1ULL << 30)	/* reserved: -EOPNOTSUPP */
#define HYB_MEMPOOL_MAX_BYTES	(1ULL << 40)
#define HYB_MEMPOOL_MAX		256		/* live pools per backend */

/* create flags */
#define HYB_MEMPOOL_SHARED	(1U << 0) /* other processes must see the bytes and
					   * read-only views be enforced; local then
					   * never uses process-private THP memory
					   * (kmod pools always are shared) */
#define HYB_MEMPOOL_LAZY	(1U << 1) /* local: zero (and lock) each page when it is
					   * first written, not at creation, so an owner
					   * filling the pool at once (a model load)
					   * overlaps the zeroing with its reads; kmod
					   * pools are always made whole at creation */

/* hyb_mempool_info.flags: what backs the pool */
#define HYB_MEMPOOL_F_KERNEL	(1U << 0) /* kernel pages of hybpool.ko, pinned */
#define HYB_MEMPOOL_F_HUGETLB	(1U << 1) /* reserved huge pages (memfd MFD_HUGETLB) */
#define HYB_MEMPOOL_F_THP	(1U << 2) /* transparent huge pages asked for (madvise) */
#define HYB_MEMPOOL_F_LOCKED	(1U << 3) /* never swapped (mlock, hugetlb or kernel) */
#define HYB_MEMPOOL_F_SHARED	(1U << 4) /* same bytes in other processes; ro enforced */

struct hyb_mempool;

struct hyb_mempool_info {
	uint32_t id;			/* > 0, unique among live pools */
	int32_t node;
	char name[HYB_MEMPOOL_NAME_LEN];
	uint64_t bytes;			/* rounded up to whole pages */
	uint64_t page_size;
	uint64_t huge_bytes;		/* bytes now backed by pages >= 2 MiB */
	uint32_t flags;			/* HYB_MEMPOOL_F_* */
	uint32_t mappers;		/* mappings alive now */
	uint64_t faults;		/* page faults served (kmod only, else 0) */
	uint64_t reloads;		/* reload requests naming the pool */
	int32_t owner_pid;		/* process that created it */
	uint32_t owned;			/* 1 if the asking backend handle owns it */
	uint64_t create_ns;		/* time spent allocating, placing and zeroing */
};

/*
 * Create a pool of bytes (rounded up to pages) of zeroed memory on NUMA node
 * (or HYB_MEMPOOL_NODE_LOCAL) and return a handle to it. page_size 0 or
 * HYB_MEMPOOL_PAGE_2M. Errors: -EINVAL (name, size, node, page size, flags),
 * -EEXIST (name taken), -ENOSPC (over the cap or HYB_MEMPOOL_MAX pools),
 * -EOPNOTSUPP (1 GiB pages), -ENOMEM (node out of memory), -EPERM/-EBADF
 * (kmod: needs CAP_IPC_LOCK and write access to /dev/hybpool).
 */
int hyb_mempool_create(struct hyb_backend *b, const char *name, uint64_t bytes, int node,
		       uint64_t page_size, unsigned int flags, struct hyb_mempool **out);
/* A handle to a live pool by name or id: -ENOENT if there is none. */
int hyb_mempool_open(struct hyb_backend *b, const char *name, struct hyb_mempool **out);
int hyb_mempool_open_id(struct hyb_backend *b, uint32_t id, struct hyb_mempool **out);
/*
 * Map the whole pool, pre-faulted (no page faults on access): read-write for
 * the owner, read-only otherwise. Calling it again returns the same mapping.
 */
int hyb_mempool_map(struct hyb_mempool *p, void **addr, size_t *len);
int hyb_mempool_writable(const struct hyb_mempool *p);	/* 1: the map is read-write */
uint32_t hyb_mempool_id(const struct hyb_mempool *p);
int hyb_mempool_info(struct hyb_mempool *p, struct hyb_mempool_info *out);
/* Owner only (-EPERM): the pool leaves the table; mappings stay valid. */
int hyb_mempool_destroy(struct hyb_mempool *p);
/*
 * Owner only: recreate the pool's memory on node (the same node too, e.g. to
 * pick up huge pages reserved since), copy the bytes and swap it in under
 * every mapping of this process at the same address. Writers must be quiet
 * meanwhile. kmod: the module moves the pages under every mapping of every
 * process (accesses fault in the new pages, same addresses); the owner or
 * CAP_SYS_ADMIN may, a move to the pool's own node does nothing, -EBUSY while
 * its pages are pinned (O_DIRECT, cudaHostRegister), -ENOSPC when both
 * copies together pass the cap. -EOPNOTSUPP where the backend cannot.
 */
int hyb_mempool_move(struct hyb_mempool *p, int node);
/* Unmaps (if mapped) and frees the handle; the pool itself stays. */
void hyb_mempool_close(struct hyb_mempool *p);

/* Ids of the live pools into ids[0..max); returns how many there are (may be > max). */
int hyb_mempool_list(struct hyb_backend *b, uint32_t *ids, unsigned int max);
/* Info of a pool by id without opening it. */
int hyb_mempool_stat(struct hyb_backend *b, uint32_t id, struct hyb_mempool_info *out);

/* -- reload queue -------------------------------------------------------- */

#define HYB_RQ_MAX_QUEUES	16
#define HYB_RQ_MAX_BATCH	256	/* entries per submit/fetch/complete/reap call */
#define HYB_RQ_CLIENT_MAX	4096	/* per client: submitted, not yet reaped */
#define HYB_RQ_MAX_REQUESTS	65536	/* alive in the backend, all queues */

#define HYB_RQ_EVENTFD_NEW	(-1)	/* attach: the library makes (and closes) one */
#define HYB_RQ_EVENTFD_NONE	(-2)	/* client attach: no completion eventfd */

enum hyb_rq_op {
	HYB_RQ_NOP = 0,		/* no pool; a round trip only */
	HYB_RQ_LOAD = 1,	/* fill pool [off, off + len) from storage at aux */
	HYB_RQ_UPLOAD = 2,	/* copy pool [off, off + len) to GPU cache slot aux */
	HYB_RQ_EVICT = 3,	/* drop GPU cache slot aux (pool range optional: all zero) */
	HYB_RQ_OP_MAX
};

enum hyb_rq_prio {
	HYB_RQ_CRITICAL = 0,	/* fetched first */
	HYB_RQ_HIGH = 1,
	HYB_RQ_NORMAL = 2,
	HYB_RQ_LOW = 3,
	HYB_RQ_PRIO_LEVELS
};

/* One request, 64 bytes (the layout of hybpool.ko's struct hyb_req). */
struct hyb_rq_req {
	uint64_t id;		/* submit: 0; fetch: the id to complete with */
	uint64_t tag;		/* the app's own, echoed in the completion */
	uint64_t pool_off;	/* byte offset in the pool */
	uint64_t len;		/* bytes; off + len within the pool (0 for NOP) */
	uint64_t aux;		/* op-specific: storage offset, GPU slot */
	uint32_t pool_id;	/* 0 for NOP */
	uint32_t layer;
	uint32_t group;
	uint16_t op;		/* enum hyb_rq_op */
	uint8_t prio;		/* enum hyb_rq_prio */
	uint8_t flags;		/* 0 */
	uint32_t client_id;	/* submit: 0; fetch: the submitting client */
	uint32_t reserved;	/* 0 */
};

/* The daemon's verdict on one fetched request. */
struct hyb_rq_done {
	uint64_t id;
	int32_t status;		/* 0 or a negative errno (-4095 .. -1) */
	uint32_t reserved;	/* 0 */
};

/* One completion as the app reaps it. */
struct hyb_rq_cqe {
	uint64_t id;
	uint64_t tag;
	int32_t status;		/* the daemon's; -EPIPE when the daemon went away */
	uint32_t reserved;
	uint64_t wait_ns;	/* submitted -> fetched by the daemon */
	uint64_t service_ns;	/* fetched -> completed */
};

/* Latency summary; percentiles are histogram bucket midpoints (within ~6%). */
struct hyb_lat_stat {
	uint64_t count;
	uint64_t sum_ns;
	uint64_t min_ns;
	uint64_t max_ns;
	uint64_t p50_ns;
	uint64_t p90_ns;
	uint64_t p99_ns;
	uint64_t p999_ns;
};

struct hyb_rq_stats {
	uint32_t queue_id;
	uint32_t live;		/* 1: a daemon is attached */
	int32_t daemon_pid;
	uint32_t clients;
	uint64_t submitted;
	uint64_t completed;	/* status 0 */
	uint64_t failed;	/* non-zero status, daemon death included */
	uint64_t queued;	/* waiting for the daemon */
	uint64_t in_service;	/* fetched, not completed */
	uint64_t in_flight;	/* queued + in_service */
	uint64_t stalls;	/* reaps that had to block */
	struct hyb_lat_stat queue_wait;	/* submit -> fetch */
	struct hyb_lat_stat service;	/* fetch -> complete */
	struct hyb_lat_stat stall;	/* time apps spent blocked in reap */
};

struct hyb_rq;

/*
 * Become the daemon of queue 0..15 (-EBUSY if it has one). eventfd is
 * signalled on every submit (HYB_RQ_EVENTFD_NEW: the library's own, see
 * hyb_rq_fd). The role ends with hyb_rq_close(), with the process, or when
 * the thread that attached exits: then every request not completed fails
 * with -EPIPE and every waiting app wakes.
 */
int hyb_rq_attach_daemon(struct hyb_backend *b, unsigned int queue, int eventfd,
			 struct hyb_rq **out);
/*
 * Become a client of a queue that has a daemon (-ENOTCONN otherwise).
 * eventfd is signalled on every completion (or NEW / NONE).
 */
int hyb_rq_attach_client(struct hyb_backend *b, unsigned int queue, int eventfd,
			 struct hyb_rq **out);
int hyb_rq_fd(const struct hyb_rq *rq);			/* the eventfd, or -1 */
uint32_t hyb_rq_client_id(const struct hyb_rq *rq);	/* 0 for the daemon */
/* Client: queue n requests, all or nothing; never blocks (-EAGAIN when full, -EPIPE). */
int hyb_rq_submit(struct hyb_rq *rq, const struct hyb_rq_req *reqs, unsigned int n);
/*
 * Client: take up to max completions. min 0 never blocks; min >= 1 blocks
 * until min are ready, nothing more can come, or timeout_ns (0 = no limit)
 * passes, and the time blocked counts as a stall. Returns the number taken;
 * -ETIMEDOUT or -EPIPE (daemon gone) when none.
 */
int hyb_rq_reap(struct hyb_rq *rq, struct hyb_rq_cqe *out, unsigned int max, unsigned int min,
		uint64_t timeout_ns);
/* Daemon: wait for the eventfd (1 signalled, 0 timed out; timeout_ns 0 = none). */
int hyb_rq_wait_work(struct hyb_rq *rq, uint64_t timeout_ns);
/* Daemon: up to max requests, highest priority first; 0 when none (never blocks). */
int hyb_rq_fetch(struct hyb_rq *rq, struct hyb_rq_req *out, unsigned int max);
/*
 * Who submitted a request, as the daemon's namespaces see it (kmod: the
 * module's struct hyb_req_from; local: this process): effective uid and gid
 * when the client attached (65534 when unmapped), pid (0 when not visible).
 */
struct hyb_rq_sender {
	uint32_t uid;
	uint32_t gid;
	int32_t pid;
	uint32_t reserved;
};
/* hyb_rq_fetch, and from[i] = the sender of out[i] (for a policy on who may ask). */
int hyb_rq_fetch_from(struct hyb_rq *rq, struct hyb_rq_req *out, struct hyb_rq_sender *from,
		      unsigned int max);
/* Daemon: verdicts, all or nothing (-ENOENT if an id is not in service). */
int hyb_rq_complete(struct hyb_rq *rq, const struct hyb_rq_done *done, unsigned int n);
/* Counters and histograms of a queue (live 0 and zeros when it has no daemon). */
int hyb_rq_stats(struct hyb_backend *b, unsigned int queue, struct hyb_rq_stats *out);
void hyb_rq_close(struct hyb_rq *rq);

#endif
