// SPDX-License-Identifier: MIT
/*
 * The front end of hyb/pool.h: picks a backend, checks every argument once for
 * both backends (so both refuse the same things with the same message), and
 * ends the daemon role of a thread that exits without closing it.
 */
#include <errno.h>
#include <numa.h>
#include <poll.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "mempool_internal.h"
#include "util/error.h"

int hyb_mp_err(int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	hyb_error_vset(err, fmt, ap);
	va_end(ap);
	return err;
}

uint64_t hyb_mp_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static int hyb_mp_node_ok(int node)
{
	if (numa_available() < 0)
		return node == 0;
	if (node < 0 || node > numa_max_node())
		return 0;
	return numa_node_size64(node, NULL) > 0;
}

int hyb_mp_local_node(void)
{
	int cpu = sched_getcpu(), node = 0, n;

	if (numa_available() >= 0 && cpu >= 0) {
		node = numa_node_of_cpu(cpu);
		if (node < 0)
			node = 0;
	}
	/* A node of CPUs without memory: the first node that has some. */
	for (n = 0; !hyb_mp_node_ok(node) && numa_available() >= 0 && n <= numa_max_node(); n++)
		node = n;
	return node;
}

uint64_t hyb_mp_default_cap(void)
{
	const char *env = getenv("HYB_LOCAL_MAX_PINNED_MB");
	long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);

	if (env && *env)
		return strtoull(env, NULL, 10) << 20;
	if (pages <= 0 || psz <= 0)
		return 1ULL << 30;
	return (uint64_t)pages * (uint64_t)psz / 2;
}

/*
 * Wrap a backend call: a failure the backend did not explain gets a generic
 * message. The comma operator records the message count before the call.
 */
static _Thread_local unsigned int err_mark;

static int explain(const char *what, int r)
{
	if (r < 0 && err_mark == hyb_error_count())
		hyb_mp_err(r, "%s: %s", what, strerror(-r));
	return r;
}

#define CALL(what, expr) explain((what), (err_mark = hyb_error_count(), (expr)))

/* -- backends ------------------------------------------------------------ */

const char *hyb_backend_name(enum hyb_backend_kind kind)
{
	switch (kind) {
	case HYB_BACKEND_AUTO:
		return "auto";
	case HYB_BACKEND_KMOD:
		return "kmod";
	case HYB_BACKEND_LOCAL:
		return "local";
	}
	return "?";
}

static struct hyb_backend *backend_try(const struct hyb_mempool_ops *ops, char *err,
				       size_t err_len)
{
	struct hyb_backend *b = calloc(1, sizeof(*b));

	if (!b) {
		snprintf(err, err_len, "out of memory");
		return NULL;
	}
	b->ops = ops;
	b->fd = -1;
	if (ops->open(b, err, err_len)) {
		free(b);
		return NULL;
	}
	return b;
}

struct hyb_backend *hyb_backend_open(enum hyb_backend_kind kind)
{
	char err[256] = "", kerr[256];
	const size_t err_len = sizeof(err);
	const char *env = getenv("HYB_BACKEND");
	struct hyb_backend *b;

	if (kind == HYB_BACKEND_AUTO && env && *env) {
		if (!strcmp(env, "kmod")) {
			kind = HYB_BACKEND_KMOD;
		} else if (!strcmp(env, "local")) {
			kind = HYB_BACKEND_LOCAL;
		} else if (strcmp(env, "auto")) {
			snprintf(err, err_len, "HYB_BACKEND='%s': use kmod, local or auto", env);
			hyb_mp_err(-EINVAL, "%s", err);
			return NULL;
		}
	}
	switch (kind) {
	case HYB_BACKEND_KMOD:
		b = backend_try(&hyb_mempool_kmod_ops, err, err_len);
		break;
	case HYB_BACKEND_LOCAL:
		b = backend_try(&hyb_mempool_local_ops, err, err_len);
		break;
	case HYB_BACKEND_AUTO:
		b = backend_try(&hyb_mempool_kmod_ops, kerr, sizeof(kerr));
		if (!b)
			b = backend_try(&hyb_mempool_local_ops, err, err_len);
		break;
	default:
		snprintf(err, err_len, "unknown backend kind %d", (int)kind);
		b = NULL;
	}
	if (!b)
		hyb_mp_err(-ENODEV, "%s", err);
	return b;
}

void hyb_backend_close(struct hyb_backend *b)
{
	if (!b)
		return;
	b->ops->close(b);
	free(b);
}

enum hyb_backend_kind hyb_backend_kind(const struct hyb_backend *b)
{
	return b ? b->ops->kind : HYB_BACKEND_AUTO;
}

int hyb_backend_info(struct hyb_backend *b, struct hyb_backend_info *out)
{
	if (!b || !out)
		return hyb_mp_err(-EINVAL, "hyb_backend_info: NULL argument");
	memset(out, 0, sizeof(*out));
	out->kind = b->ops->kind;
	out->caps = b->ops->caps;
	return CALL("backend info", b->ops->info(b, out));
}

/* -- pools --------------------------------------------------------------- */

/* 1..31 characters of [A-Za-z0-9._-], the module's rule. */
static int name_check(const char *what, const char *name)
{
	size_t n, i;

	if (!name)
		return hyb_mp_err(-EINVAL, "%s: pool name is NULL", what);
	n = strnlen(name, HYB_MEMPOOL_NAME_LEN);
	if (n == 0)
		return hyb_mp_err(-EINVAL, "%s: pool name is empty", what);
	if (n == HYB_MEMPOOL_NAME_LEN)
		return hyb_mp_err(-EINVAL, "%s: pool name '%.*s...' is longer than %d characters",
				  what, 16, name, HYB_MEMPOOL_NAME_LEN - 1);
	for (i = 0; i < n; i++) {
		char c = name[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '.' || c == '_' || c == '-'))
			return hyb_mp_err(-EINVAL,
					  "%s: pool name '%s' has a character outside [A-Za-z0-9._-]",
					  what, name);
	}
	return 0;
}

static struct hyb_mempool *pool_new(struct hyb_backend *b)
{
	struct hyb_mempool *p = calloc(1, sizeof(*p));

	if (p) {
		p->b = b;
		p->ops = b->ops;
	}
	return p;
}

int hyb_mempool_create(struct hyb_backend *b, const char *name, uint64_t bytes, int node,
		       uint64_t page_size, unsigned int flags, struct hyb_mempool **out)
{
	struct hyb_mempool *p;
	char what[96];
	int ret;

	if (out)
		*out = NULL;
	if (!b || !out)
		return hyb_mp_err(-EINVAL, "hyb_mempool_create: NULL backend or result pointer");
	ret = name_check("hyb_mempool_create", name);
	if (ret)
		return ret;
	snprintf(what, sizeof(what), "create pool '%s'", name);
	if (!bytes || bytes > HYB_MEMPOOL_MAX_BYTES)
		return hyb_mp_err(-EINVAL, "%s: size %llu bytes is outside 1 .. 2^40", what,
				  (unsigned long long)bytes);
	if (page_size == HYB_MEMPOOL_PAGE_1G)
		return hyb_mp_err(-EOPNOTSUPP, "%s: 1 GiB pages are not supported yet (use 2 MiB)",
				  what);
	if (page_size && page_size != HYB_MEMPOOL_PAGE_2M)
		return hyb_mp_err(-EINVAL, "%s: page size %llu is not 2 MiB", what,
				  (unsigned long long)page_size);
	if (node != HYB_MEMPOOL_NODE_LOCAL && !hyb_mp_node_ok(node))
		return hyb_mp_err(-EINVAL, "%s: NUMA node %d does not exist or has no memory",
				  what, node);
	if (flags & ~(HYB_MEMPOOL_SHARED | HYB_MEMPOOL_LAZY))
		return hyb_mp_err(-EINVAL, "%s: unknown flags 0x%x", what, flags);
	p = pool_new(b);
	if (!p)
		return hyb_mp_err(-ENOMEM, "%s: out of memory", what);
	bytes = (bytes + HYB_MEMPOOL_PAGE_2M - 1) & ~(HYB_MEMPOOL_PAGE_2M - 1);
	ret = CALL(what, b->ops->pool_create(p, name, bytes, node, flags));
	if (ret) {
		free(p);
		return ret;
	}
	*out = p;
	return 0;
}

static int pool_open(struct hyb_backend *b, const char *name, uint32_t id,
		     struct hyb_mempool **out)
{
	struct hyb_mempool *p;
	char what[96];
	int ret;

	if (out)
		*out = NULL;
	if (!b || !out)
		return hyb_mp_err(-EINVAL, "hyb_mempool_open: NULL backend or result pointer");
	if (name) {
		ret = name_check("hyb_mempool_open", name);
		if (ret)
			return ret;
		snprintf(what, sizeof(what), "open pool '%s'", name);
	} else {
		if (!id)
			return hyb_mp_err(-EINVAL, "hyb_mempool_open_id: pool id 0 is never used");
		snprintf(what, sizeof(what), "open pool id %u", id);
	}
	p = pool_new(b);
	if (!p)
		return hyb_mp_err(-ENOMEM, "%s: out of memory", what);
	err_mark = hyb_error_count();
	ret = b->ops->pool_open(p, name, id);
	if (ret == -ENOENT) {
		ret = hyb_mp_err(ret, "%s: no such pool", what);
	} else if (ret < 0) {
		ret = explain(what, ret);
	}
	if (ret) {
		free(p);
		return ret;
	}
	*out = p;
	return 0;
}

int hyb_mempool_open(struct hyb_backend *b, const char *name, struct hyb_mempool **out)
{
	if (!name)
		return hyb_mp_err(-EINVAL, "hyb_mempool_open: pool name is NULL");
	return pool_open(b, name, 0, out);
}

int hyb_mempool_open_id(struct hyb_backend *b, uint32_t id, struct hyb_mempool **out)
{
	return pool_open(b, NULL, id, out);
}

int hyb_mempool_map(struct hyb_mempool *p, void **addr, size_t *len)
{
	static pthread_mutex_t map_lock = PTHREAD_MUTEX_INITIALIZER;
	int ret = 0;

	if (!p)
		return hyb_mp_err(-EINVAL, "hyb_mempool_map: NULL pool");
	/* Two threads mapping one handle the first time get one mapping. */
	pthread_mutex_lock(&map_lock);
	if (!p->addr)
		ret = CALL("map pool", p->b->ops->pool_map(p));
	pthread_mutex_unlock(&map_lock);
	if (ret)
		return ret;
	if (addr)
		*addr = p->addr;
	if (len)
		*len = (size_t)p->bytes;
	return 0;
}

int hyb_mempool_writable(const struct hyb_mempool *p)
{
	return p ? p->owned : 0;
}

uint32_t hyb_mempool_id(const struct hyb_mempool *p)
{
	return p ? p->id : 0;
}

int hyb_mempool_stat(struct hyb_backend *b, uint32_t id, struct hyb_mempool_info *out)
{
	int ret;

	if (!b || !out)
		return hyb_mp_err(-EINVAL, "hyb_mempool_stat: NULL argument");
	memset(out, 0, sizeof(*out));
	err_mark = hyb_error_count();
	ret = b->ops->pool_stat(b, id, out);
	if (ret == -ENOENT)
		return hyb_mp_err(ret, "pool id %u: no such pool", id);
	return explain("pool info", ret);
}

int hyb_mempool_info(struct hyb_mempool *p, struct hyb_mempool_info *out)
{
	if (!p || !out)
		return hyb_mp_err(-EINVAL, "hyb_mempool_info: NULL argument");
	return hyb_mempool_stat(p->b, p->id, out);
}

int hyb_mempool_list(struct hyb_backend *b, uint32_t *ids, unsigned int max)
{
	if (!b || (max && !ids))
		return hyb_mp_err(-EINVAL, "hyb_mempool_list: NULL argument");
	return CALL("list pools", b->ops->pool_list(b, ids, max));
}

int hyb_mempool_destroy(struct hyb_mempool *p)
{
	if (!p)
		return hyb_mp_err(-EINVAL, "hyb_mempool_destroy: NULL pool");
	if (!p->owned)
		return hyb_mp_err(-EPERM, "destroy pool id %u: only its owner may destroy it",
				  p->id);
	return CALL("destroy pool", p->b->ops->pool_destroy(p));
}

int hyb_mempool_move(struct hyb_mempool *p, int node)
{
	if (!p)
		return hyb_mp_err(-EINVAL, "hyb_mempool_move: NULL pool");
	if (!(p->b->ops->caps & HYB_BACKEND_CAN_MOVE))
		return hyb_mp_err(-EOPNOTSUPP,
				  "move pool id %u: %s pools stay where they were made (the owner "
				  "destroys and recreates them)", p->id,
				  hyb_backend_name(p->b->ops->kind));
	/* The module moves pools of other processes too, for CAP_SYS_ADMIN: it decides. */
	if (!p->owned && p->b->ops->kind != HYB_BACKEND_KMOD)
		return hyb_mp_err(-EPERM, "move pool id %u: only its owner may move it", p->id);
	if (node != HYB_MEMPOOL_NODE_LOCAL && !hyb_mp_node_ok(node))
		return hyb_mp_err(-EINVAL, "move pool id %u: NUMA node %d does not exist or has "
				  "no memory", p->id, node);
	return CALL("move pool", p->b->ops->pool_move(p, node));
}

void hyb_mempool_close(struct hyb_mempool *p)
{
	if (!p)
		return;
	p->ops->pool_close(p);
	free(p);
}

/* -- reload queue: daemon threads --------------------------------------- */

/*
 * The daemon role belongs to the thread that attached: when it exits without
 * closing (returns, pthread_exit, cancellation), a key destructor ends the
 * role as a daemon process's death would, so apps never wait on a daemon
 * that is gone.
 */
static pthread_mutex_t daemon_lock = PTHREAD_MUTEX_INITIALIZER;
static struct hyb_rq *daemons;
static pthread_key_t daemon_key;
static pthread_once_t daemon_once = PTHREAD_ONCE_INIT;

static void daemon_thread_exit(void *unused)
{
	pthread_t self = pthread_self();
	struct hyb_rq **pp, *rq;

	(void)unused;
	pthread_mutex_lock(&daemon_lock);
	for (pp = &daemons; (rq = *pp);) {
		if (!pthread_equal(rq->thread, self)) {
			pp = &rq->dnext;
			continue;
		}
		*pp = rq->dnext;
		atomic_store(&rq->dead, true);
		rq->ops->rq_kill(rq);
	}
	pthread_mutex_unlock(&daemon_lock);
}

static void daemon_key_init(void)
{
	if (pthread_key_create(&daemon_key, daemon_thread_exit))
		abort();
}

static void daemon_track(struct hyb_rq *rq)
{
	pthread_once(&daemon_once, daemon_key_init);
	rq->thread = pthread_self();
	pthread_mutex_lock(&daemon_lock);
	rq->dnext = daemons;
	daemons = rq;
	pthread_mutex_unlock(&daemon_lock);
	pthread_setspecific(daemon_key, (void *)1);
}

static void daemon_untrack(struct hyb_rq *rq)
{
	struct hyb_rq **pp;

	pthread_mutex_lock(&daemon_lock);
	for (pp = &daemons; *pp; pp = &(*pp)->dnext) {
		if (*pp == rq) {
			*pp = rq->dnext;
			break;
		}
	}
	pthread_mutex_unlock(&daemon_lock);
}

/* -- reload queue -------------------------------------------------------- */

static int rq_attach(struct hyb_backend *b, bool daemon, unsigned int queue, int efd,
		     struct hyb_rq **out)
{
	const char *role = daemon ? "attach daemon" : "attach client";
	struct hyb_rq *rq;
	char what[64];
	int ret;

	if (out)
		*out = NULL;
	if (!b || !out)
		return hyb_mp_err(-EINVAL, "%s: NULL backend or result pointer", role);
	if (queue >= HYB_RQ_MAX_QUEUES)
		return hyb_mp_err(-EINVAL, "%s: queue %u is outside 0..%d", role, queue,
				  HYB_RQ_MAX_QUEUES - 1);
	if (efd < HYB_RQ_EVENTFD_NONE || (daemon && efd == HYB_RQ_EVENTFD_NONE))
		return hyb_mp_err(-EINVAL, "%s: bad eventfd %d", role, efd);
	snprintf(what, sizeof(what), "%s to queue %u", role, queue);
	rq = calloc(1, sizeof(*rq));
	if (!rq)
		return hyb_mp_err(-ENOMEM, "%s: out of memory", what);
	rq->b = b;
	rq->ops = b->ops;
	rq->daemon = daemon;
	rq->queue = queue;
	rq->fd = -1;
	rq->efd = -1;
	if (efd == HYB_RQ_EVENTFD_NEW) {
		rq->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
		if (rq->efd < 0) {
			ret = hyb_mp_err(-errno, "%s: eventfd: %s", what, strerror(errno));
			free(rq);
			return ret;
		}
		rq->own_efd = true;
	} else if (efd >= 0) {
		rq->efd = efd;
	}
	err_mark = hyb_error_count();
	ret = b->ops->rq_attach(rq);
	if (ret == -EBUSY && daemon)
		ret = hyb_mp_err(ret, "%s: the queue already has a daemon", what);
	else if (ret == -ENOTCONN)
		ret = hyb_mp_err(ret, "%s: the queue has no daemon", what);
	else if (ret < 0)
		ret = explain(what, ret);
	if (ret) {
		if (rq->own_efd)
			close(rq->efd);
		free(rq);
		return ret;
	}
	if (daemon)
		daemon_track(rq);
	*out = rq;
	return 0;
}

int hyb_rq_attach_daemon(struct hyb_backend *b, unsigned int queue, int eventfd,
			 struct hyb_rq **out)
{
	return rq_attach(b, true, queue, eventfd, out);
}

int hyb_rq_attach_client(struct hyb_backend *b, unsigned int queue, int eventfd,
			 struct hyb_rq **out)
{
	return rq_attach(b, false, queue, eventfd, out);
}

int hyb_rq_fd(const struct hyb_rq *rq)
{
	return rq ? rq->efd : -1;
}

uint32_t hyb_rq_client_id(const struct hyb_rq *rq)
{
	return rq ? rq->client_id : 0;
}

static int batch_check(const char *what, const void *ptr, unsigned int n)
{
	if (!ptr)
		return hyb_mp_err(-EINVAL, "%s: NULL array", what);
	if (!n || n > HYB_RQ_MAX_BATCH)
		return hyb_mp_err(-EINVAL, "%s: batch of %u entries is outside 1..%d", what, n,
				  HYB_RQ_MAX_BATCH);
	return 0;
}

static int role_check(const char *what, const struct hyb_rq *rq, bool daemon)
{
	if (!rq)
		return hyb_mp_err(-EINVAL, "%s: NULL queue handle", what);
	if (rq->daemon != daemon)
		return hyb_mp_err(-EPERM, "%s: only the %s may do this", what,
				  daemon ? "daemon" : "client");
	if (daemon && atomic_load(&rq->dead))
		return hyb_mp_err(-EPIPE, "%s: the daemon role ended (its thread exited)", what);
	return 0;
}

static int req_check(const struct hyb_rq_req *r, unsigned int i)
{
	const char *what = "submit";

	if (r->id || r->client_id || r->reserved || r->flags)
		return hyb_mp_err(-EINVAL, "%s: request %u: id, client_id, flags and reserved "
				  "must be 0", what, i);
	if (r->op >= HYB_RQ_OP_MAX)
		return hyb_mp_err(-EINVAL, "%s: request %u: unknown op %u", what, i, r->op);
	if (r->prio >= HYB_RQ_PRIO_LEVELS)
		return hyb_mp_err(-EINVAL, "%s: request %u: priority %u is outside 0..%d", what,
				  i, r->prio, HYB_RQ_PRIO_LEVELS - 1);
	if (r->op == HYB_RQ_NOP) {
		if (r->pool_id || r->pool_off || r->len)
			return hyb_mp_err(-EINVAL, "%s: request %u: a NOP names no pool range",
					  what, i);
		return 0;
	}
	if (r->op == HYB_RQ_EVICT && !r->pool_id && !r->pool_off && !r->len)
		return 0;	/* the slot alone (aux): an evict's pool range is optional */
	if (!r->len || r->pool_off + r->len < r->pool_off)
		return hyb_mp_err(-EINVAL, "%s: request %u: empty or overflowing pool range",
				  what, i);
	return 0;
}

int hyb_rq_submit(struct hyb_rq *rq, const struct hyb_rq_req *reqs, unsigned int n)
{
	unsigned int i;
	int ret;

	ret = role_check("submit", rq, false);
	if (!ret)
		ret = batch_check("submit", reqs, n);
	for (i = 0; !ret && i < n; i++)
		ret = req_check(&reqs[i], i);
	if (ret)
		return ret;
	err_mark = hyb_error_count();
	ret = rq->b->ops->rq_submit(rq, reqs, n);
	switch (ret) {
	case 0:
		return 0;
	case -EAGAIN:
		return hyb_mp_err(ret, "submit: queue full (%d per client, %d in all)",
				  HYB_RQ_CLIENT_MAX, HYB_RQ_MAX_REQUESTS);
	case -EPIPE:
		return hyb_mp_err(ret, "submit: the daemon of queue %u is gone", rq->queue);
	case -ENOENT:
		return hyb_mp_err(ret, "submit: a request names a pool that does not exist");
	case -EINVAL:
		return hyb_mp_err(ret, "submit: a request's range lies outside its pool");
	}
	return explain("submit", ret);
}

int hyb_rq_reap(struct hyb_rq *rq, struct hyb_rq_cqe *out, unsigned int max, unsigned int min,
		uint64_t timeout_ns)
{
	int ret;

	ret = role_check("reap", rq, false);
	if (!ret)
		ret = batch_check("reap", out, max);
	if (ret)
		return ret;
	if (min > max)
		return hyb_mp_err(-EINVAL, "reap: min %u is more than max %u", min, max);
	err_mark = hyb_error_count();
	ret = rq->b->ops->rq_reap(rq, out, max, min, min ? timeout_ns : 0);
	if (ret == -EPIPE)
		return hyb_mp_err(ret, "reap: the daemon of queue %u is gone", rq->queue);
	if (ret == -ETIMEDOUT)
		return hyb_mp_err(ret, "reap: timed out");
	return explain("reap", ret);
}

int hyb_rq_wait_work(struct hyb_rq *rq, uint64_t timeout_ns)
{
	struct pollfd pfd;
	uint64_t v;
	int ret, ms;

	ret = role_check("wait for work", rq, true);
	if (ret)
		return ret;
	ms = !timeout_ns ? -1 : timeout_ns >= 2000000000000ULL ? 2000000000 :
			   (int)((timeout_ns + 999999) / 1000000);
	pfd.fd = rq->efd;
	pfd.events = POLLIN;
	do
		ret = poll(&pfd, 1, ms);
	while (ret < 0 && errno == EINTR && ms < 0);
	if (ret < 0 && errno == EINTR)
		return 0;	/* a signal: like a timeout, the caller loops */
	if (ret < 0)
		return hyb_mp_err(-errno, "wait for work: poll: %s", strerror(errno));
	if (!ret)
		return 0;
	/* Reset the count (non-blocking when ours; a caller's may block, so check). */
	if (read(rq->efd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		return hyb_mp_err(-errno, "wait for work: eventfd read: %s", strerror(errno));
	return 1;
}

int hyb_rq_fetch_from(struct hyb_rq *rq, struct hyb_rq_req *out, struct hyb_rq_sender *from,
		      unsigned int max)
{
	int ret;

	ret = role_check("fetch", rq, true);
	if (!ret)
		ret = batch_check("fetch", out, max);
	if (ret)
		return ret;
	return CALL("fetch", rq->b->ops->rq_fetch(rq, out, from, max));
}

int hyb_rq_fetch(struct hyb_rq *rq, struct hyb_rq_req *out, unsigned int max)
{
	return hyb_rq_fetch_from(rq, out, NULL, max);
}

int hyb_rq_complete(struct hyb_rq *rq, const struct hyb_rq_done *done, unsigned int n)
{
	unsigned int i;
	int ret;

	ret = role_check("complete", rq, true);
	if (!ret)
		ret = batch_check("complete", done, n);
	if (ret)
		return ret;
	for (i = 0; i < n; i++) {
		if (done[i].reserved || done[i].status > 0 || done[i].status < -4095)
			return hyb_mp_err(-EINVAL, "complete: verdict %u: status %d is not 0 or a "
					  "negative errno (or reserved is not 0)", i,
					  done[i].status);
	}
	err_mark = hyb_error_count();
	ret = rq->b->ops->rq_complete(rq, done, n);
	if (ret == -ENOENT)
		return hyb_mp_err(ret, "complete: an id is not in service (nothing completed)");
	return explain("complete", ret);
}

int hyb_rq_stats(struct hyb_backend *b, unsigned int queue, struct hyb_rq_stats *out)
{
	if (!b || !out)
		return hyb_mp_err(-EINVAL, "hyb_rq_stats: NULL argument");
	if (queue >= HYB_RQ_MAX_QUEUES)
		return hyb_mp_err(-EINVAL, "queue stats: queue %u is outside 0..%d", queue,
				  HYB_RQ_MAX_QUEUES - 1);
	memset(out, 0, sizeof(*out));
	out->queue_id = queue;
	return CALL("queue stats", b->ops->rq_stats(b, queue, out));
}

void hyb_rq_close(struct hyb_rq *rq)
{
	if (!rq)
		return;
	if (rq->daemon)
		daemon_untrack(rq);
	rq->ops->rq_close(rq);
	if (rq->own_efd)
		close(rq->efd);
	free(rq);
}
