/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR MIT */
/*
 * hybpool: pinned huge-page neuron pools and the reload queue of hyb's box
 * mode. This header is the whole contract between hybpool.ko and userspace
 * (libhyb's kmod backends, hybd, hybctl); userspace includes it with
 * -Ikmod/include/uapi as <linux/hybpool.h>.
 *
 * Conventions, the same for every ioctl:
 *  - The argument is a struct that starts with { __u32 size; __u32 flags; }.
 *    Set size = sizeof(struct); it must equal the size encoded in the ioctl
 *    number. A kernel that knows a shorter version of the struct accepts a
 *    longer one only if the extra bytes are zero (else -E2BIG); this is how
 *    the ABI grows without new ioctl numbers.
 *  - Unknown flag bits, non-zero reserved fields and out-of-range values are
 *    refused with -EINVAL before anything happens.
 *  - Batch ioctls (struct hyb_batch) carry entry_size = sizeof(one entry).
 *  - A file opened on /dev/hybpool takes at most one queue role: the daemon
 *    of one queue (HYB_IOC_QUEUE_ATTACH) or a client of one queue
 *    (HYB_IOC_CLIENT_ATTACH). Pools are owned by the open file that created
 *    them: it may map them read-write, every other file only read-only. A
 *    pool dies when it is destroyed or its owner file is closed, and its
 *    memory returns once the last mapping or other reference (a pipe
 *    holding vmsplice()d pages, I/O in flight) to its pages is gone.
 *  - Who may ask for what (the device's mode and group are the outer
 *    boundary): a client file opened read-only may submit only NOPs (LOAD,
 *    UPLOAD, EVICT: -EBADF); a LOAD rewrites pool memory, so it may name
 *    only pools created by a process with the client's effective uid (or
 *    the client holds CAP_SYS_ADMIN): -EACCES otherwise. UPLOAD and EVICT
 *    only read pools and act on the daemon's GPU slots, which the module
 *    cannot judge: FETCH with struct hyb_req_from entries tells the daemon
 *    who submitted each request (uid, gid, pid as the daemon sees them) so
 *    that it can refuse by its own policy.
 *
 * mmap: offset = hyb_pool_info.mmap_offset (pool id << HYB_MMAP_SHIFT) plus
 * a multiple of the pool page size; the length is a multiple of the pool
 * page size; MAP_SHARED only. Use MAP_POPULATE for fault-free access.
 */
#ifndef _UAPI_LINUX_HYBPOOL_H
#define _UAPI_LINUX_HYBPOOL_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define HYB_DEVICE_PATH		"/dev/hybpool"
#define HYB_ABI_VERSION		2	/* 2: ioctl magic 0xD6, FETCH with senders, request rules */

#define HYB_NAME_LEN		32	/* pool name, NUL included: [A-Za-z0-9._-]+ */
#define HYB_NODE_LOCAL		(-1)	/* create: the caller's NUMA node */
#define HYB_PAGE_SHIFT_2M	21
#define HYB_PAGE_SHIFT_1G	30	/* reserved: -EOPNOTSUPP in this version */
#define HYB_MMAP_SHIFT		40	/* mmap offset of a pool = id << 40 */
#define HYB_POOL_MAX_BYTES	(1ULL << HYB_MMAP_SHIFT)
#define HYB_MAX_POOLS		256
#define HYB_MAX_QUEUES		16
#define HYB_MAX_BATCH		256	/* entries per batch ioctl */
#define HYB_CLIENT_MAX_INFLIGHT	4096	/* per client: submitted, not yet reaped */

/* HYB_IOC_DEV_INFO: module-wide state. */
struct hyb_dev_info {
	__u32 size;
	__u32 flags;		/* 0 */
	__u32 abi_version;	/* out: HYB_ABI_VERSION */
	__u32 nr_pools;		/* out: live pools */
	__u32 nr_zombies;	/* out: destroyed pools still mapped somewhere */
	__u32 nr_queues;	/* out: queues with a daemon attached */
	__u64 pinned_bytes;	/* out: memory held by all pools, zombies included */
	__u64 pinned_cap;	/* out: limit (module parameter max_pinned_mb) */
	__u64 nr_requests;	/* out: reload requests alive in the kernel */
	__u32 page_shifts;	/* out: bit n set = page shift n supported */
	__u32 reserved;		/* 0 */
};

/*
 * HYB_IOC_POOL_CREATE: needs CAP_IPC_LOCK and a file opened for writing.
 * If the result cannot be written back the pool is destroyed again (-EFAULT).
 */
struct hyb_pool_create {
	__u32 size;
	__u32 flags;		/* 0 */
	char name[HYB_NAME_LEN];	/* in: unique among live pools */
	__u64 bytes;		/* in: 1 .. HYB_POOL_MAX_BYTES; out: rounded to pages */
	__s32 node;		/* in: NUMA node or HYB_NODE_LOCAL; out: node */
	__u32 page_shift;	/* in: HYB_PAGE_SHIFT_2M (0 means that) */
	__u32 pool_id;		/* out */
	__u32 reserved;		/* 0 */
	__u64 mmap_offset;	/* out */
};

/* HYB_IOC_POOL_DESTROY: the owner file only (or CAP_SYS_ADMIN). */
struct hyb_pool_ref {
	__u32 size;
	__u32 flags;		/* 0 */
	__u32 pool_id;
	__u32 reserved;		/* 0 */
};

#define HYB_POOL_BY_NAME	(1U << 0)	/* info: look the pool up by name */

/* HYB_IOC_POOL_INFO: placement and statistics of one pool. */
struct hyb_pool_info {
	__u32 size;
	__u32 flags;		/* 0 or HYB_POOL_BY_NAME */
	__u32 pool_id;		/* in (unless BY_NAME); out */
	__s32 node;		/* out */
	char name[HYB_NAME_LEN];	/* in with BY_NAME; out */
	__u64 bytes;		/* out */
	__u64 mmap_offset;	/* out */
	__u32 page_shift;	/* out */
	__u32 mappers;		/* out: mappings (VMAs) alive now */
	__u64 faults;		/* out: page faults served */
	__u64 reloads;		/* out: reload requests naming this pool */
	__s32 owner_pid;	/* out: process that created it */
	__u32 owned;		/* out: 1 if the calling file owns it */
	__u64 create_ns;	/* out: time spent allocating and zeroing */
};

/*
 * HYB_IOC_POOL_MIGRATE: move a live pool's memory to another NUMA node, the
 * owner file only (or CAP_SYS_ADMIN). New pages are allocated on node, then
 * every mapping of the pool is unmapped, the bytes are copied and the new
 * pages swapped in; the same addresses keep working (accesses fault in the
 * new pages). Both copies count against the cap while it runs. Errors:
 * -EINVAL (flags, reserved, node), -ENOENT, -EPERM, -ENOSPC (cap), -ENOMEM
 * (node has not enough free 2 MiB pages), -EBUSY (pages pinned by I/O or a
 * device, e.g. O_DIRECT or cudaHostRegister), -EINTR (fatal signal). On any
 * error the pool is as it was. Moving to the node it is on does nothing.
 */
struct hyb_pool_migrate {
	__u32 size;
	__u32 flags;		/* 0 */
	__u32 pool_id;
	__s32 node;		/* in: a node with memory */
	__u64 blocked_ns;	/* out: time faults on the pool waited (unmap + copy) */
	__u64 reserved[2];	/* 0 */
};

/* HYB_IOC_POOL_LIST: ids of the live pools. */
struct hyb_pool_list {
	__u32 size;
	__u32 flags;		/* 0 */
	__u32 count;		/* in: room at ptr (<= HYB_MAX_POOLS); out: live pools */
	__u32 reserved;		/* 0 */
	__u64 ptr;		/* in: __u32 ids[count] */
};

/*
 * HYB_IOC_QUEUE_ATTACH (daemon; CAP_IPC_LOCK; signalled on eventfd when
 * requests arrive) and HYB_IOC_CLIENT_ATTACH (app; signalled on its eventfd,
 * or -1 for none, when completions arrive). The daemon detaches by closing
 * the file; requests it has not completed then fail with -EPIPE.
 */
struct hyb_attach {
	__u32 size;
	__u32 flags;		/* 0 */
	__u32 queue_id;		/* 0 .. HYB_MAX_QUEUES - 1 */
	__s32 eventfd;
	__u32 client_id;	/* out (client attach) */
	__u32 reserved;		/* 0 */
};

enum hyb_op {
	HYB_OP_NOP = 0,		/* no pool; round trip only */
	HYB_OP_LOAD = 1,	/* fill pool [off, off + len) from storage at aux */
	HYB_OP_UPLOAD = 2,	/* copy pool [off, off + len) to GPU cache slot aux */
	HYB_OP_EVICT = 3,	/* drop GPU cache slot aux (pool range optional) */
	HYB_OP_MAX
};

enum hyb_prio {
	HYB_PRIO_CRITICAL = 0,	/* fetched first */
	HYB_PRIO_HIGH = 1,
	HYB_PRIO_NORMAL = 2,
	HYB_PRIO_LOW = 3,
	HYB_PRIO_LEVELS
};

/* One reload request: submitted by apps, fetched by the daemon. 64 bytes. */
struct hyb_req {
	__u64 id;		/* submit: 0; fetch: kernel id to complete with */
	__u64 tag;		/* opaque, echoed in the completion */
	__u64 pool_off;		/* byte offset in the pool */
	__u64 len;		/* bytes; off + len within the pool */
	__u64 aux;		/* op-specific (source offset, GPU slot) */
	__u32 pool_id;		/* 0 for HYB_OP_NOP */
	__u32 layer;
	__u32 group;
	__u16 op;		/* enum hyb_op */
	__u8 prio;		/* enum hyb_prio */
	__u8 flags;		/* 0 */
	__u32 client_id;	/* submit: 0; fetch: submitting client */
	__u32 reserved;		/* 0 */
};

/*
 * A request as FETCH hands it out with entry_size = sizeof(struct
 * hyb_req_from): the request and who submitted it, fixed when the client
 * attached (CLIENT_ATTACH): its effective uid and gid as the daemon's user
 * namespace maps them (the overflow id, 65534, when it does not), and its
 * process id in the daemon's PID namespace (0 when not visible there).
 */
struct hyb_req_from {
	struct hyb_req req;
	__u32 uid;
	__u32 gid;
	__s32 pid;
	__u32 reserved;		/* written as 0 */
};

/* The daemon's verdict on one fetched request. */
struct hyb_done {
	__u64 id;
	__s32 status;		/* 0 or a negative errno (-4095 .. -1) */
	__u32 reserved;		/* 0 */
};

/* One completion as the app reaps it. */
struct hyb_cqe {
	__u64 id;
	__u64 tag;
	__s32 status;		/* daemon's status; -EPIPE if the daemon went away */
	__u32 reserved;		/* written as 0 */
	__u64 wait_ns;		/* submit -> fetched by the daemon */
	__u64 service_ns;	/* fetched -> completed */
};

#define HYB_REAP_WAIT		(1U << 0)	/* block until min_count are ready */

/*
 * SUBMIT (client; hyb_req[], all or nothing, never blocks: -EAGAIN when the
 * client or the module is at its request limit, -EPIPE when the daemon is
 * gone, -EBADF/-EACCES by the rules above), FETCH (daemon; hyb_req[] or
 * hyb_req_from[] by entry_size, highest priority first, count 0 when
 * empty), COMPLETE (daemon; hyb_done[], all or nothing: -ENOENT if an id is
 * not in service), REAP (client; hyb_cqe[]; with HYB_REAP_WAIT blocks until
 * min_count completions are ready or nothing more can come, and the time
 * blocked is counted as a stall). count is in: entries at ptr, out: done.
 */
struct hyb_batch {
	__u32 size;
	__u32 flags;		/* REAP: HYB_REAP_WAIT; others 0 */
	__u32 count;
	__u32 entry_size;	/* sizeof(struct hyb_req / hyb_done / hyb_cqe) */
	__u32 min_count;	/* REAP with WAIT: 1 .. count; else 0 */
	__u32 reserved;		/* 0 */
	__u64 timeout_ns;	/* REAP with WAIT: 0 = none (-ETIMEDOUT); else 0 */
	__u64 ptr;
};

/* Latency summary of one histogram; percentiles are bucket midpoints (~6%). */
struct hyb_hist_stat {
	__u64 count;
	__u64 sum_ns;
	__u64 min_ns;
	__u64 max_ns;
	__u64 p50_ns;
	__u64 p90_ns;
	__u64 p99_ns;
	__u64 p999_ns;
};

#define HYB_QUEUE_ABSENT	0	/* no daemon attached */
#define HYB_QUEUE_LIVE		1

/* HYB_IOC_QUEUE_STATS: counters and histograms of one queue. */
struct hyb_queue_stats {
	__u32 size;
	__u32 flags;		/* 0 */
	__u32 queue_id;		/* in */
	__u32 state;		/* out: HYB_QUEUE_* */
	__s32 daemon_pid;	/* out */
	__u32 clients;		/* out */
	__u64 submitted;	/* out */
	__u64 completed;	/* out: completed with status 0 */
	__u64 failed;		/* out: non-zero status, daemon death included */
	__u64 queued;		/* out: waiting for the daemon */
	__u64 in_service;	/* out: fetched, not completed */
	__u64 in_flight;	/* out: queued + in_service */
	__u64 stalls;		/* out: REAP waits that had to block */
	struct hyb_hist_stat queue_wait;	/* submit -> fetch */
	struct hyb_hist_stat service;		/* fetch -> complete */
	struct hyb_hist_stat stall;		/* time apps spent blocked */
};

/*
 * 0xD6: free in Documentation/userspace-api/ioctl/ioctl-number.rst (checked
 * against Linux 6.18's list); ABI 1 used 0xB8, which is /dev/mshv's.
 */
#define HYB_IOC_MAGIC		0xD6

#define HYB_IOC_DEV_INFO	_IOWR(HYB_IOC_MAGIC, 0x00, struct hyb_dev_info)
#define HYB_IOC_POOL_CREATE	_IOWR(HYB_IOC_MAGIC, 0x01, struct hyb_pool_create)
#define HYB_IOC_POOL_DESTROY	_IOW(HYB_IOC_MAGIC, 0x02, struct hyb_pool_ref)
#define HYB_IOC_POOL_INFO	_IOWR(HYB_IOC_MAGIC, 0x03, struct hyb_pool_info)
#define HYB_IOC_POOL_LIST	_IOWR(HYB_IOC_MAGIC, 0x04, struct hyb_pool_list)
#define HYB_IOC_POOL_MIGRATE	_IOWR(HYB_IOC_MAGIC, 0x05, struct hyb_pool_migrate)
#define HYB_IOC_QUEUE_ATTACH	_IOWR(HYB_IOC_MAGIC, 0x10, struct hyb_attach)
#define HYB_IOC_CLIENT_ATTACH	_IOWR(HYB_IOC_MAGIC, 0x11, struct hyb_attach)
#define HYB_IOC_SUBMIT		_IOWR(HYB_IOC_MAGIC, 0x12, struct hyb_batch)
#define HYB_IOC_FETCH		_IOWR(HYB_IOC_MAGIC, 0x13, struct hyb_batch)
#define HYB_IOC_COMPLETE	_IOWR(HYB_IOC_MAGIC, 0x14, struct hyb_batch)
#define HYB_IOC_REAP		_IOWR(HYB_IOC_MAGIC, 0x15, struct hyb_batch)
#define HYB_IOC_QUEUE_STATS	_IOWR(HYB_IOC_MAGIC, 0x16, struct hyb_queue_stats)

#endif /* _UAPI_LINUX_HYBPOOL_H */
