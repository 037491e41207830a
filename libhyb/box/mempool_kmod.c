// SPDX-License-Identifier: MIT
/*
 * The kmod backend of hyb/pool.h: box mode through /dev/hybpool
 * (kmod/include/uapi/linux/hybpool.h is the contract). A backend handle is
 * one open file of the device, so it owns the pools it creates; every queue
 * role opens a file of its own (the module allows one role per file), and
 * that file's release is what tells the module that a daemon is gone.
 */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <linux/hybpool.h>

#include "mempool_internal.h"

/* Requests, verdicts and completions cross the ioctl as they are. */
#define SAME_FIELD(a, b, f) (offsetof(struct a, f) == offsetof(struct b, f))
_Static_assert(sizeof(struct hyb_rq_req) == sizeof(struct hyb_req) &&
	       SAME_FIELD(hyb_rq_req, hyb_req, tag) && SAME_FIELD(hyb_rq_req, hyb_req, aux) &&
	       SAME_FIELD(hyb_rq_req, hyb_req, pool_id) && SAME_FIELD(hyb_rq_req, hyb_req, op) &&
	       SAME_FIELD(hyb_rq_req, hyb_req, prio) &&
	       SAME_FIELD(hyb_rq_req, hyb_req, client_id), "hyb_rq_req layout");
_Static_assert(sizeof(struct hyb_rq_done) == sizeof(struct hyb_done) &&
	       SAME_FIELD(hyb_rq_done, hyb_done, status), "hyb_rq_done layout");
_Static_assert(sizeof(struct hyb_rq_cqe) == sizeof(struct hyb_cqe) &&
	       SAME_FIELD(hyb_rq_cqe, hyb_cqe, status) &&
	       SAME_FIELD(hyb_rq_cqe, hyb_cqe, wait_ns) &&
	       SAME_FIELD(hyb_rq_cqe, hyb_cqe, service_ns), "hyb_rq_cqe layout");
_Static_assert(sizeof(struct hyb_lat_stat) == sizeof(struct hyb_hist_stat), "hist layout");
_Static_assert(HYB_MEMPOOL_NAME_LEN == HYB_NAME_LEN && HYB_RQ_MAX_QUEUES == HYB_MAX_QUEUES &&
	       HYB_RQ_MAX_BATCH == HYB_MAX_BATCH && HYB_RQ_CLIENT_MAX == HYB_CLIENT_MAX_INFLIGHT &&
	       HYB_MEMPOOL_MAX == HYB_MAX_POOLS && HYB_MEMPOOL_MAX_BYTES == HYB_POOL_MAX_BYTES,
	       "limits");

static int kioctl(int fd, unsigned long cmd, void *arg)
{
	int ret;

	do
		ret = ioctl(fd, cmd, arg);
	while (ret < 0 && errno == EINTR && cmd != HYB_IOC_REAP);
	return ret < 0 ? -errno : 0;
}

static int dev_open(int *fd, int *writable, char *err, size_t err_len)
{
	*writable = 1;
	*fd = open(HYB_DEVICE_PATH, O_RDWR | O_CLOEXEC);
	if (*fd < 0 && (errno == EACCES || errno == EPERM || errno == EROFS)) {
		/* Apps in group hyb get 0660; a read-only file still maps and reaps. */
		*writable = 0;
		*fd = open(HYB_DEVICE_PATH, O_RDONLY | O_CLOEXEC);
	}
	if (*fd >= 0)
		return 0;
	if (errno == ENOENT || errno == ENXIO || errno == ENODEV)
		snprintf(err, err_len, "hybpool module not loaded: %s not found", HYB_DEVICE_PATH);
	else
		snprintf(err, err_len, "cannot open %s: %s (needs group hyb)", HYB_DEVICE_PATH,
			 strerror(errno));
	return -errno;
}

static int dev_info(int fd, struct hyb_dev_info *di)
{
	memset(di, 0, sizeof(*di));
	di->size = sizeof(*di);
	return kioctl(fd, HYB_IOC_DEV_INFO, di);
}

static int k_open(struct hyb_backend *b, char *err, size_t err_len)
{
	struct hyb_dev_info di;
	int ret;

	ret = dev_open(&b->fd, &b->writable, err, err_len);
	if (ret)
		return ret;
	ret = dev_info(b->fd, &di);
	if (ret == -ENOTTY)	/* ABI 1 used another ioctl magic */
		snprintf(err, err_len, "%s is a hybpool.ko of another ABI than this library's "
			 "(%d): rebuild and reload the module of this hyb", HYB_DEVICE_PATH,
			 HYB_ABI_VERSION);
	else if (ret)
		snprintf(err, err_len, "cannot query %s: %s", HYB_DEVICE_PATH, strerror(-ret));
	else if (di.abi_version != HYB_ABI_VERSION)
		snprintf(err, err_len, "%s speaks ABI %u, this library ABI %d", HYB_DEVICE_PATH,
			 di.abi_version, HYB_ABI_VERSION);
	if (ret || di.abi_version != HYB_ABI_VERSION) {
		close(b->fd);
		return ret ? ret : -EPROTO;
	}
	return 0;
}

static void k_close(struct hyb_backend *b)
{
	/* The module destroys the pools this file owns. */
	close(b->fd);
}

static int k_info(struct hyb_backend *b, struct hyb_backend_info *out)
{
	struct hyb_dev_info di;
	int ret = dev_info(b->fd, &di);

	if (ret)
		return ret;
	out->abi_version = di.abi_version;
	out->nr_pools = di.nr_pools;
	out->nr_zombies = di.nr_zombies;
	out->nr_queues = di.nr_queues;
	out->pinned_bytes = di.pinned_bytes;
	out->pinned_cap = di.pinned_cap;
	out->nr_requests = di.nr_requests;
	out->page_sizes = di.page_shifts;
	return 0;
}

static int pool_info_raw(int fd, uint32_t id, const char *name, struct hyb_pool_info *pi)
{
	memset(pi, 0, sizeof(*pi));
	pi->size = sizeof(*pi);
	pi->pool_id = id;
	if (name) {
		pi->flags = HYB_POOL_BY_NAME;
		snprintf(pi->name, sizeof(pi->name), "%s", name);
	}
	return kioctl(fd, HYB_IOC_POOL_INFO, pi);
}

static int k_pool_create(struct hyb_mempool *p, const char *name, uint64_t bytes, int node,
			 unsigned int flags)
{
	struct hyb_backend *b = p->b;
	struct hyb_pool_create pc;
	int ret;

	(void)flags;	/* kernel pools are always shared */
	if (!b->writable)
		return hyb_mp_err(-EBADF, "create pool '%s': %s is open read-only here (pools "
				  "are made by the daemon)", name, HYB_DEVICE_PATH);
	memset(&pc, 0, sizeof(pc));
	pc.size = sizeof(pc);
	snprintf(pc.name, sizeof(pc.name), "%s", name);
	pc.bytes = bytes;
	pc.node = node;
	pc.page_shift = HYB_PAGE_SHIFT_2M;
	ret = kioctl(b->fd, HYB_IOC_POOL_CREATE, &pc);
	switch (ret) {
	case 0:
		break;
	case -EEXIST:
		return hyb_mp_err(ret, "create pool '%s': the name is taken", name);
	case -ENOSPC:
		return hyb_mp_err(ret, "create pool '%s': %llu MiB would pass the pinned-memory cap "
				  "(or %d pools are live)", name,
				  (unsigned long long)(bytes >> 20), HYB_MAX_POOLS);
	case -ENOMEM:
		return hyb_mp_err(ret, "create pool '%s': node %d has not %llu MiB free in 2 MiB "
				  "pages", name, node, (unsigned long long)(bytes >> 20));
	case -EPERM:
		return hyb_mp_err(ret, "create pool '%s': needs CAP_IPC_LOCK", name);
	default:
		return ret;
	}
	p->id = pc.pool_id;
	p->bytes = pc.bytes;
	p->mmap_offset = pc.mmap_offset;
	p->owned = 1;
	return 0;
}

static int k_pool_open(struct hyb_mempool *p, const char *name, uint32_t id)
{
	struct hyb_pool_info pi;
	int ret = pool_info_raw(p->b->fd, id, name, &pi);

	if (ret)
		return ret;
	p->id = pi.pool_id;
	p->bytes = pi.bytes;
	p->mmap_offset = pi.mmap_offset;
	p->owned = !!pi.owned;
	return 0;
}

static int k_pool_stat(struct hyb_backend *b, uint32_t id, struct hyb_mempool_info *out)
{
	struct hyb_pool_info pi;
	int ret = pool_info_raw(b->fd, id, NULL, &pi);

	if (ret)
		return ret;
	out->id = pi.pool_id;
	out->node = pi.node;
	memcpy(out->name, pi.name, sizeof(out->name));
	out->name[sizeof(out->name) - 1] = 0;
	out->bytes = pi.bytes;
	out->page_size = 1ULL << pi.page_shift;
	out->huge_bytes = pi.bytes;	/* one PMD per chunk when mapped aligned */
	out->flags = HYB_MEMPOOL_F_KERNEL | HYB_MEMPOOL_F_LOCKED | HYB_MEMPOOL_F_SHARED;
	out->mappers = pi.mappers;
	out->faults = pi.faults;
	out->reloads = pi.reloads;
	out->owner_pid = pi.owner_pid;
	out->owned = pi.owned;
	out->create_ns = pi.create_ns;
	return 0;
}

static int k_pool_list(struct hyb_backend *b, uint32_t *ids, unsigned int max)
{
	struct hyb_pool_list pl;
	uint32_t all[HYB_MAX_POOLS];
	int ret;

	memset(&pl, 0, sizeof(pl));
	pl.size = sizeof(pl);
	pl.count = HYB_MAX_POOLS;
	pl.ptr = (uintptr_t)all;
	ret = kioctl(b->fd, HYB_IOC_POOL_LIST, &pl);
	if (ret)
		return ret;
	if (max)
		memcpy(ids, all, (pl.count < max ? pl.count : max) * sizeof(*ids));
	return (int)pl.count;
}

static int k_pool_map(struct hyb_mempool *p)
{
	int prot = PROT_READ | (p->owned ? PROT_WRITE : 0);
	void *a = mmap(NULL, p->bytes, prot, MAP_SHARED | MAP_POPULATE, p->b->fd,
		       (off_t)p->mmap_offset);

	if (a == MAP_FAILED)
		return hyb_mp_err(-errno, "map pool id %u: %s", p->id, strerror(errno));
	p->addr = a;
	return 0;
}

static int k_pool_destroy(struct hyb_mempool *p)
{
	struct hyb_pool_ref r = { .size = sizeof(r), .pool_id = p->id };

	return kioctl(p->b->fd, HYB_IOC_POOL_DESTROY, &r);
}

/*
 * The module moves the pages under every mapping of the pool, in every
 * process: they are unmapped while it copies and fault in the new pages on
 * the next access, at the same addresses. The owner file or CAP_SYS_ADMIN
 * (hybctl numa --move) may do it; the module checks.
 */
static int k_pool_move(struct hyb_mempool *p, int node)
{
	struct hyb_pool_migrate m;
	struct hyb_pool_info pi;
	int ret;

	if (node == HYB_NODE_LOCAL)
		node = hyb_mp_local_node();
	memset(&m, 0, sizeof(m));
	m.size = sizeof(m);
	m.pool_id = p->id;
	m.node = node;
	ret = kioctl(p->b->fd, HYB_IOC_POOL_MIGRATE, &m);
	switch (ret) {
	case 0:
		break;
	case -EPERM:
		return hyb_mp_err(ret, "move pool id %u: only its owner (or CAP_SYS_ADMIN) may "
				  "move it", p->id);
	case -ENOSPC:
		return hyb_mp_err(ret, "move pool id %u: the old and new copies together (%llu "
				  "MiB) would pass the pinned-memory cap", p->id,
				  (unsigned long long)(2 * p->bytes >> 20));
	case -ENOMEM:
		return hyb_mp_err(ret, "move pool id %u: node %d has not %llu MiB free in 2 MiB "
				  "pages", p->id, node, (unsigned long long)(p->bytes >> 20));
	case -EBUSY:
		return hyb_mp_err(ret, "move pool id %u: its pages are pinned for I/O or by a "
				  "device (O_DIRECT, cudaHostRegister); release them and retry",
				  p->id);
	case -ENOTTY:
		return hyb_mp_err(-EOPNOTSUPP, "move pool id %u: this hybpool module cannot "
				  "move pools (too old)", p->id);
	default:
		return ret;
	}
	/* The pool may have had a mapping here: it refaults on the next access. */
	if (pool_info_raw(p->b->fd, p->id, NULL, &pi) == 0 && pi.node != node)
		return hyb_mp_err(-EIO, "move pool id %u: the module reports node %d after the "
				  "move to node %d", p->id, pi.node, node);
	return 0;
}

static void k_pool_close(struct hyb_mempool *p)
{
	if (p->addr)
		munmap(p->addr, p->bytes);
}

/* -- queue -------------------------------------------------------------- */

static int k_rq_attach(struct hyb_rq *rq)
{
	struct hyb_attach a = { .size = sizeof(a), .queue_id = rq->queue, .eventfd = rq->efd };
	char err[128];
	int writable, ret;

	ret = dev_open(&rq->fd, &writable, err, sizeof(err));
	if (ret)
		return hyb_mp_err(ret, "%s", err);
	if (rq->daemon && !writable) {
		close(rq->fd);
		return hyb_mp_err(-EBADF, "attach daemon: %s is open read-only here",
				  HYB_DEVICE_PATH);
	}
	ret = kioctl(rq->fd, rq->daemon ? HYB_IOC_QUEUE_ATTACH : HYB_IOC_CLIENT_ATTACH, &a);
	if (ret) {
		close(rq->fd);
		rq->fd = -1;
		if (ret == -EPERM)
			return hyb_mp_err(ret, "attach daemon to queue %u: needs CAP_IPC_LOCK",
					  rq->queue);
		return ret;
	}
	rq->client_id = a.client_id;
	return 0;
}

static int k_batch(int fd, unsigned long cmd, const void *ptr, unsigned int n, size_t esz,
		   unsigned int min, uint64_t timeout_ns, unsigned int *done)
{
	struct hyb_batch bt = {
		.size = sizeof(bt), .count = n, .entry_size = (uint32_t)esz, .ptr = (uintptr_t)ptr,
	};
	int ret;

	if (min) {
		bt.flags = HYB_REAP_WAIT;
		bt.min_count = min;
		bt.timeout_ns = timeout_ns;
	}
	ret = kioctl(fd, cmd, &bt);
	if (done)
		*done = ret ? 0 : bt.count;
	return ret;
}

static int k_rq_submit(struct hyb_rq *rq, const struct hyb_rq_req *reqs, unsigned int n)
{
	int ret = k_batch(rq->fd, HYB_IOC_SUBMIT, reqs, n, sizeof(*reqs), 0, 0, NULL);

	/* the module's request rules (kmod/README.md, who may ask for what) */
	if (ret == -EBADF)
		return hyb_mp_err(ret, "submit: %s is open read-only here: only NOPs may be "
				  "submitted", HYB_DEVICE_PATH);
	if (ret == -EACCES)
		return hyb_mp_err(ret, "submit: a LOAD may name only pools created by this user "
				  "(effective uid)");
	return ret;
}

static int k_rq_reap(struct hyb_rq *rq, struct hyb_rq_cqe *out, unsigned int max,
		     unsigned int min, uint64_t timeout_ns)
{
	unsigned int got;
	int ret;

	/* A signal interrupts a wait: what was blocked counts, try again. */
	do
		ret = k_batch(rq->fd, HYB_IOC_REAP, out, max, sizeof(*out), min, timeout_ns,
			      &got);
	while (ret == -EINTR);
	return ret ? ret : (int)got;
}

_Static_assert(sizeof(struct hyb_rq_sender) == sizeof(struct hyb_req_from) -
	       offsetof(struct hyb_req_from, uid) &&
	       offsetof(struct hyb_rq_sender, pid) == offsetof(struct hyb_req_from, pid) -
	       offsetof(struct hyb_req_from, uid), "hyb_rq_sender layout");

static int k_rq_fetch(struct hyb_rq *rq, struct hyb_rq_req *out, struct hyb_rq_sender *from,
		      unsigned int max)
{
	struct hyb_req_from *buf;
	unsigned int got, i;
	int ret;

	if (!from) {
		ret = k_batch(rq->fd, HYB_IOC_FETCH, out, max, sizeof(*out), 0, 0, &got);
		return ret ? ret : (int)got;
	}
	buf = malloc((size_t)max * sizeof(*buf));
	if (!buf)
		return hyb_mp_err(-ENOMEM, "fetch: out of memory");
	ret = k_batch(rq->fd, HYB_IOC_FETCH, buf, max, sizeof(*buf), 0, 0, &got);
	for (i = 0; !ret && i < got; i++) {
		memcpy(&out[i], &buf[i].req, sizeof(out[i]));
		memcpy(&from[i], &buf[i].uid, sizeof(from[i]));
	}
	free(buf);
	return ret ? ret : (int)got;
}

static int k_rq_complete(struct hyb_rq *rq, const struct hyb_rq_done *done, unsigned int n)
{
	return k_batch(rq->fd, HYB_IOC_COMPLETE, done, n, sizeof(*done), 0, 0, NULL);
}

/*
 * The daemon's thread exited: release its file so the module fails what it
 * holds and wakes the apps. dup2() swaps /dev/null in under the same number
 * atomically, so a call racing with this one can never reach a file that
 * reuses the number; calls after it see -EPIPE from the front end.
 */
static void k_rq_kill(struct hyb_rq *rq)
{
	int null = open("/dev/null", O_RDONLY | O_CLOEXEC);

	if (null >= 0) {
		dup2(null, rq->fd);
		close(null);
	}
}

static void k_rq_close(struct hyb_rq *rq)
{
	if (rq->fd >= 0)
		close(rq->fd);
}

static int k_rq_stats(struct hyb_backend *b, unsigned int queue, struct hyb_rq_stats *out)
{
	struct hyb_queue_stats s;
	int ret;

	memset(&s, 0, sizeof(s));
	s.size = sizeof(s);
	s.queue_id = queue;
	ret = kioctl(b->fd, HYB_IOC_QUEUE_STATS, &s);
	if (ret)
		return ret;
	out->live = s.state == HYB_QUEUE_LIVE;
	out->daemon_pid = s.daemon_pid;
	out->clients = s.clients;
	out->submitted = s.submitted;
	out->completed = s.completed;
	out->failed = s.failed;
	out->queued = s.queued;
	out->in_service = s.in_service;
	out->in_flight = s.in_flight;
	out->stalls = s.stalls;
	memcpy(&out->queue_wait, &s.queue_wait, sizeof(out->queue_wait));
	memcpy(&out->service, &s.service, sizeof(out->service));
	memcpy(&out->stall, &s.stall, sizeof(out->stall));
	return 0;
}

const struct hyb_mempool_ops hyb_mempool_kmod_ops = {
	.kind = HYB_BACKEND_KMOD,
	.caps = HYB_BACKEND_CROSS_PROCESS | HYB_BACKEND_CAN_MOVE | HYB_BACKEND_COUNTS_FAULTS,
	.open = k_open,
	.close = k_close,
	.info = k_info,
	.pool_create = k_pool_create,
	.pool_open = k_pool_open,
	.pool_stat = k_pool_stat,
	.pool_list = k_pool_list,
	.pool_map = k_pool_map,
	.pool_destroy = k_pool_destroy,
	.pool_move = k_pool_move,
	.pool_close = k_pool_close,
	.rq_attach = k_rq_attach,
	.rq_submit = k_rq_submit,
	.rq_reap = k_rq_reap,
	.rq_fetch = k_rq_fetch,
	.rq_complete = k_rq_complete,
	.rq_kill = k_rq_kill,
	.rq_close = k_rq_close,
	.rq_stats = k_rq_stats,
};
