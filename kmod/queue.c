// SPDX-License-Identifier: GPL-2.0
/*
 * The reload queue: apps (clients) post small fixed-size requests ("load this
 * neuron group", "upload it to the GPU cache") that the daemon serves.
 *
 *   client SUBMIT -> pending[prio] -> daemon eventfd
 *   daemon FETCH  -> active (hash by id)
 *   daemon COMPLETE -> client's done list -> client eventfd + waiters
 *   client REAP   -> completions out; a blocking REAP is a stall
 *
 * Submitting never sleeps on the daemon: the queue is bounded per client
 * (HYB_CLIENT_MAX_INFLIGHT) and in total (max_requests), and a full queue
 * answers -EAGAIN. Ids are never reused, so a stale or forged id from the
 * daemon can only miss (-ENOENT). When the daemon's file goes away
 * (close, crash, kill) every pending and active request fails with -EPIPE
 * and every waiter wakes; clients then see -EPIPE on submit and reopen the
 * device to attach to the next daemon.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/capability.h>
#include <linux/cred.h>
#include <linux/errno.h>
#include <linux/eventfd.h>
#include <linux/jiffies.h>
#include <linux/ktime.h>
#include <linux/nospec.h>
#include <linux/sched.h>
#include <linux/seq_file.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include "hybpool.h"

struct hyb_kreq {
	struct list_head node;		/* pending[prio], a client's done, or a local list */
	struct hlist_node hnode;	/* queue->active while fetched */
	struct hyb_client *client;	/* NULL once the client has gone */
	struct hyb_req req;
	u64 t_submit;
	u64 t_fetch;
	u64 t_done;
	s32 status;
	bool completing;		/* claimed by a COMPLETE batch being checked */
};

struct hyb_client {
	struct hyb_queue *q;		/* holds a reference */
	struct eventfd_ctx *ev;		/* may be NULL */
	wait_queue_head_t wq;
	struct list_head node;		/* queue->clients */
	struct list_head done;		/* completed, not reaped */
	u32 id;
	struct pid *pid;		/* reported with pid_vnr: the reader's namespace */
	kuid_t euid;			/* who attached: what FETCH tells the daemon */
	kgid_t egid;
	bool writable;			/* the file was opened for writing: may ask for work */
	bool admin;			/* CAP_SYS_ADMIN when it attached: may LOAD any pool */
	u32 outstanding;		/* submitted, not reaped */
	u32 nr_done;
	u64 submitted;
	u64 completed;
	u64 failed;
	u64 stalls;
	u64 stall_ns;
};

#define HYB_ACTIVE_BITS		10

/* Counters and histograms of a queue, under its lock. */
struct hyb_qstats {
	u64 nr_pending;
	u64 nr_active;
	u64 submitted;
	u64 completed;
	u64 failed;
	u64 stalls;
	struct hyb_hist wait;
	struct hyb_hist service;
	struct hyb_hist stall;
};

struct hyb_queue {
	struct kref ref;		/* the daemon's + one per client */
	spinlock_t lock;
	u32 id;
	bool dead;
	struct pid *daemon_pid;		/* reported with pid_vnr */
	struct eventfd_ctx *ev;		/* the daemon's; NULL once dead */
	struct list_head pending[HYB_PRIO_LEVELS];
	DECLARE_HASHTABLE(active, HYB_ACTIVE_BITS);
	struct list_head clients;
	u64 next_req_id;
	u32 next_client_id;
	u32 nr_clients;
	struct hyb_qstats st;
};

/* Queues with a daemon attached, by id; under hyb_lock. */
static struct hyb_queue *hyb_queues[HYB_MAX_QUEUES];
static struct kmem_cache *hyb_kreq_cache;

int hyb_queue_init(void)
{
	/* SLAB_ACCOUNT: requests count against the submitter's memory cgroup */
	hyb_kreq_cache = KMEM_CACHE(hyb_kreq, SLAB_ACCOUNT);
	return hyb_kreq_cache ? 0 : -ENOMEM;
}

void hyb_queue_exit(void)
{
	kmem_cache_destroy(hyb_kreq_cache);
}

static void hyb_queue_free(struct kref *ref)
{
	struct hyb_queue *q = container_of(ref, struct hyb_queue, ref);

	atomic_dec(&hyb_nr_queues_alive);
	put_pid(q->daemon_pid);
	kvfree(q);
}

static void hyb_queue_put(struct hyb_queue *q)
{
	kref_put(&q->ref, hyb_queue_free);
}

static void hyb_kreq_free_list(struct list_head *list)
{
	struct hyb_kreq *kr, *tmp;
	int n = 0;

	list_for_each_entry_safe(kr, tmp, list, node) {
		list_del(&kr->node);
		kmem_cache_free(hyb_kreq_cache, kr);
		n++;
	}
	atomic_sub(n, &hyb_nr_reqs);
}

static struct hyb_kreq *hyb_active_find(struct hyb_queue *q, u64 id)
{
	struct hyb_kreq *kr;

	hash_for_each_possible(q->active, kr, hnode, id)
		if (kr->req.id == id)
			return kr;
	return NULL;
}

/*
 * A request is over: give it to its client (counted, signalled, waiters
 * woken) or, when the client has gone, to @orphans to be freed. Called with
 * q->lock held and @kr on no list.
 */
static void hyb_kreq_finish(struct hyb_queue *q, struct hyb_kreq *kr, s32 status, u64 now,
			    struct list_head *orphans)
{
	struct hyb_client *c = kr->client;

	lockdep_assert_held(&q->lock);
	kr->status = status;
	kr->t_done = now;
	if (status)
		q->st.failed++;
	else
		q->st.completed++;
	if (!c) {
		list_add_tail(&kr->node, orphans);
		return;
	}
	if (status)
		c->failed++;
	else
		c->completed++;
	list_add_tail(&kr->node, &c->done);
	c->nr_done++;
	if (c->ev)
		hyb_eventfd_signal(c->ev);
	wake_up(&c->wq);
}

/* The daemon's file is going away: fail everything, wake everyone. */
static void hyb_queue_kill(struct hyb_queue *q)
{
	struct hyb_kreq *kr, *tmp;
	struct hyb_client *c;
	struct hlist_node *htmp;
	struct eventfd_ctx *ev;
	u64 now = ktime_get_ns();
	unsigned int p, bkt;
	LIST_HEAD(orphans);

	mutex_lock(&hyb_lock);
	if (hyb_queues[q->id] == q)
		hyb_queues[q->id] = NULL;
	mutex_unlock(&hyb_lock);

	spin_lock(&q->lock);
	q->dead = true;
	for (p = 0; p < HYB_PRIO_LEVELS; p++) {
		list_for_each_entry_safe(kr, tmp, &q->pending[p], node) {
			list_del(&kr->node);
			q->st.nr_pending--;
			hyb_kreq_finish(q, kr, -EPIPE, now, &orphans);
		}
	}
	hash_for_each_safe(q->active, bkt, htmp, kr, hnode) {
		hash_del(&kr->hnode);
		q->st.nr_active--;
		hyb_kreq_finish(q, kr, -EPIPE, now, &orphans);
	}
	ev = q->ev;
	q->ev = NULL;
	list_for_each_entry(c, &q->clients, node)
		wake_up_all(&c->wq);
	spin_unlock(&q->lock);

	if (ev)
		eventfd_ctx_put(ev);
	hyb_kreq_free_list(&orphans);
	hyb_queue_put(q);
}

/* A client's file is going away: drop what it queued, orphan what is in service. */
static void hyb_client_detach(struct hyb_client *c)
{
	struct hyb_queue *q = c->q;
	struct hyb_kreq *kr, *tmp;
	unsigned int p, bkt;
	LIST_HEAD(dead);

	spin_lock(&q->lock);
	list_del(&c->node);
	q->nr_clients--;
	for (p = 0; p < HYB_PRIO_LEVELS; p++) {
		list_for_each_entry_safe(kr, tmp, &q->pending[p], node) {
			if (kr->client != c)
				continue;
			list_move_tail(&kr->node, &dead);
			q->st.nr_pending--;
			q->st.failed++;
		}
	}
	hash_for_each(q->active, bkt, kr, hnode)
		if (kr->client == c)
			kr->client = NULL;
	list_splice_init(&c->done, &dead);
	spin_unlock(&q->lock);

	hyb_kreq_free_list(&dead);
	if (c->ev)
		eventfd_ctx_put(c->ev);
	put_pid(c->pid);
	kfree(c);
	hyb_queue_put(q);
}

void hyb_file_detach(struct hyb_file *hf)
{
	if (hf->role == HYB_ROLE_DAEMON)
		hyb_queue_kill(hf->queue);
	else if (hf->role == HYB_ROLE_CLIENT)
		hyb_client_detach(hf->client);
}

u32 hyb_queue_count(void)
{
	u32 i, n = 0;

	mutex_lock(&hyb_lock);
	for (i = 0; i < HYB_MAX_QUEUES; i++)
		n += !!hyb_queues[i];
	mutex_unlock(&hyb_lock);
	return n;
}

static int hyb_attach_check(const struct hyb_attach *a)
{
	if (a->flags || a->reserved || a->client_id)
		return -EINVAL;
	if (a->queue_id >= HYB_MAX_QUEUES)
		return -EINVAL;
	return 0;
}

int hyb_queue_ioctl_attach(struct hyb_file *hf, struct hyb_attach *a)
{
	struct eventfd_ctx *ev;
	struct hyb_queue *q;
	unsigned int p;
	int ret;

	ret = hyb_attach_check(a);
	if (ret)
		return ret;
	if (!capable(CAP_IPC_LOCK))
		return -EPERM;
	ev = eventfd_ctx_fdget(a->eventfd);
	if (IS_ERR(ev))
		return PTR_ERR(ev);
	q = kvzalloc(sizeof(*q), GFP_KERNEL);
	if (!q) {
		eventfd_ctx_put(ev);
		return -ENOMEM;
	}
	kref_init(&q->ref);
	spin_lock_init(&q->lock);
	q->id = array_index_nospec(a->queue_id, HYB_MAX_QUEUES);
	q->ev = ev;
	q->daemon_pid = get_pid(task_tgid(current));
	for (p = 0; p < HYB_PRIO_LEVELS; p++)
		INIT_LIST_HEAD(&q->pending[p]);
	hash_init(q->active);
	INIT_LIST_HEAD(&q->clients);

	mutex_lock(&hf->role_lock);
	if (hf->role != HYB_ROLE_NONE) {
		ret = -EBUSY;
	} else {
		mutex_lock(&hyb_lock);
		if (hyb_queues[q->id]) {
			ret = -EBUSY;
		} else {
			hyb_queues[q->id] = q;
			atomic_inc(&hyb_nr_queues_alive);
		}
		mutex_unlock(&hyb_lock);
	}
	if (!ret) {
		hf->queue = q;
		smp_store_release(&hf->role, HYB_ROLE_DAEMON);
	}
	mutex_unlock(&hf->role_lock);
	if (ret) {
		eventfd_ctx_put(ev);
		put_pid(q->daemon_pid);
		kvfree(q);
	}
	return ret;
}

int hyb_client_ioctl_attach(struct hyb_file *hf, struct file *file, struct hyb_attach *a)
{
	struct eventfd_ctx *ev = NULL;
	struct hyb_client *c;
	struct hyb_queue *q;
	int ret;

	ret = hyb_attach_check(a);
	if (ret)
		return ret;
	if (a->eventfd != -1) {
		ev = eventfd_ctx_fdget(a->eventfd);
		if (IS_ERR(ev))
			return PTR_ERR(ev);
	}
	c = kzalloc(sizeof(*c), GFP_KERNEL_ACCOUNT);
	if (!c) {
		ret = -ENOMEM;
		goto out_ev;
	}
	c->ev = ev;
	c->pid = get_pid(task_tgid(current));
	c->euid = current_euid();
	c->egid = current_egid();
	c->writable = file->f_mode & FMODE_WRITE;
	/* noaudit: most clients are not admins, and that is no denial worth logging */
	c->admin = ns_capable_noaudit(&init_user_ns, CAP_SYS_ADMIN);
	init_waitqueue_head(&c->wq);
	INIT_LIST_HEAD(&c->done);

	mutex_lock(&hf->role_lock);
	if (hf->role != HYB_ROLE_NONE) {
		ret = -EBUSY;
		goto out_unlock;
	}
	mutex_lock(&hyb_lock);
	q = hyb_queues[array_index_nospec(a->queue_id, HYB_MAX_QUEUES)];
	if (!q) {
		mutex_unlock(&hyb_lock);
		ret = -ENOTCONN;
		goto out_unlock;
	}
	kref_get(&q->ref);
	c->q = q;
	spin_lock(&q->lock);
	c->id = ++q->next_client_id;
	list_add_tail(&c->node, &q->clients);
	q->nr_clients++;
	spin_unlock(&q->lock);
	mutex_unlock(&hyb_lock);

	hf->client = c;
	smp_store_release(&hf->role, HYB_ROLE_CLIENT);
	mutex_unlock(&hf->role_lock);
	a->client_id = c->id;
	return 0;

out_unlock:
	mutex_unlock(&hf->role_lock);
	put_pid(c->pid);
	kfree(c);
out_ev:
	if (ev)
		eventfd_ctx_put(ev);
	return ret;
}

static struct hyb_client *hyb_file_client(struct hyb_file *hf)
{
	return smp_load_acquire(&hf->role) == HYB_ROLE_CLIENT ? hf->client : NULL;
}

static struct hyb_queue *hyb_file_daemon_queue(struct hyb_file *hf)
{
	return smp_load_acquire(&hf->role) == HYB_ROLE_DAEMON ? hf->queue : NULL;
}

/* Fields every batch call shares; wait is allowed for REAP only. */
static int hyb_batch_check(const struct hyb_batch *b, u32 entry_size, bool may_wait)
{
	if (b->reserved || b->entry_size != entry_size)
		return -EINVAL;
	if (!b->count || b->count > HYB_MAX_BATCH || !b->ptr)
		return -EINVAL;
	if (may_wait && (b->flags & HYB_REAP_WAIT)) {
		if (b->flags & ~HYB_REAP_WAIT)
			return -EINVAL;
		if (!b->min_count || b->min_count > b->count)
			return -EINVAL;
		return 0;
	}
	if (b->flags || b->min_count || b->timeout_ns)
		return -EINVAL;
	return 0;
}

/* A NOP names no pool range; an EVICT may name none (its slot is in aux, uapi). */
static bool hyb_req_has_range(const struct hyb_req *r)
{
	return r->op != HYB_OP_NOP &&
	       !(r->op == HYB_OP_EVICT && !r->pool_id && !r->pool_off && !r->len);
}

/*
 * Well-formed, and may this client ask for it (uapi: who may ask for what)?
 * Only NOPs from a file opened read-only; a LOAD writes the pool, so only
 * into pools of the client's own euid (or with CAP_SYS_ADMIN). What UPLOAD
 * and EVICT touch (the daemon's GPU slots) is the daemon's to judge, from
 * the sender FETCH gives it.
 */
static int hyb_req_check(const struct hyb_client *c, const struct hyb_req *r)
{
	int ret;

	if (r->id || r->client_id || r->reserved || r->flags)
		return -EINVAL;
	if (r->op >= HYB_OP_MAX || r->prio >= HYB_PRIO_LEVELS)
		return -EINVAL;
	if (r->op == HYB_OP_NOP)
		return (r->pool_id || r->pool_off || r->len) ? -EINVAL : 0;
	if (!c->writable)
		return -EBADF;
	if (!hyb_req_has_range(r))
		return 0;
	ret = hyb_pool_check_range(r->pool_id, r->pool_off, r->len, false);
	if (ret)
		return ret;
	if (r->op == HYB_OP_LOAD && !c->admin && !hyb_pool_writable_by(r->pool_id, c->euid))
		return -EACCES;
	return 0;
}

int hyb_queue_ioctl_submit(struct hyb_file *hf, struct hyb_batch *b)
{
	struct hyb_client *c = hyb_file_client(hf);
	struct hyb_kreq **krs = NULL;
	struct hyb_req *reqs;
	struct hyb_queue *q;
	u32 i, n = b->count;
	int ret;
	u64 now;

	ret = hyb_batch_check(b, sizeof(struct hyb_req), false);
	if (ret)
		return ret;
	if (!c)
		return -ENOTCONN;
	q = c->q;
	reqs = kvmalloc_array(n, sizeof(*reqs), GFP_KERNEL);
	if (!reqs)
		return -ENOMEM;
	if (copy_from_user(reqs, u64_to_user_ptr(b->ptr), (size_t)n * sizeof(*reqs))) {
		ret = -EFAULT;
		goto out;
	}
	for (i = 0; i < n; i++) {
		ret = hyb_req_check(c, &reqs[i]);
		if (ret)
			goto out;
	}
	if (atomic_add_return(n, &hyb_nr_reqs) > READ_ONCE(hybpool_max_requests)) {
		atomic_sub(n, &hyb_nr_reqs);
		ret = -EAGAIN;
		goto out;
	}
	krs = kvcalloc(n, sizeof(*krs), GFP_KERNEL);
	if (!krs) {
		atomic_sub(n, &hyb_nr_reqs);
		ret = -ENOMEM;
		goto out;
	}
	for (i = 0; i < n; i++) {
		krs[i] = kmem_cache_zalloc(hyb_kreq_cache, GFP_KERNEL);
		if (!krs[i]) {
			ret = -ENOMEM;
			goto out_free;
		}
		krs[i]->req = reqs[i];
		krs[i]->client = c;
	}

	now = ktime_get_ns();
	spin_lock(&q->lock);
	if (q->dead) {
		ret = -EPIPE;
	} else if (c->outstanding + n > HYB_CLIENT_MAX_INFLIGHT) {
		ret = -EAGAIN;
	} else {
		for (i = 0; i < n; i++) {
			struct hyb_kreq *kr = krs[i];

			kr->req.id = ++q->next_req_id;
			kr->req.client_id = c->id;
			kr->t_submit = now;
			list_add_tail(&kr->node,
				      &q->pending[array_index_nospec(kr->req.prio,
								     HYB_PRIO_LEVELS)]);
		}
		c->outstanding += n;
		c->submitted += n;
		q->st.submitted += n;
		q->st.nr_pending += n;
		hyb_eventfd_signal(q->ev);
	}
	spin_unlock(&q->lock);
	if (!ret) {
		for (i = 0; i < n; i++)
			if (hyb_req_has_range(&reqs[i]))
				hyb_pool_check_range(reqs[i].pool_id, reqs[i].pool_off,
						     reqs[i].len, true);
		goto out;
	}
out_free:
	for (i = 0; i < n; i++)
		if (krs[i])
			kmem_cache_free(hyb_kreq_cache, krs[i]);
	atomic_sub(n, &hyb_nr_reqs);
out:
	kvfree(krs);
	kvfree(reqs);
	return ret;
}

/* FETCH delivered nothing: put the batch back at the head, in order. */
static void hyb_fetch_undo(struct hyb_queue *q, const struct hyb_req_from *buf, u32 n)
{
	struct hyb_kreq *kr;

	spin_lock(&q->lock);
	while (n--) {
		kr = hyb_active_find(q, buf[n].req.id);
		if (!kr || kr->completing)
			continue;
		hash_del(&kr->hnode);
		q->st.nr_active--;
		list_add(&kr->node, &q->pending[kr->req.prio]);
		q->st.nr_pending++;
	}
	spin_unlock(&q->lock);
}

/*
 * Who sent a request, as the fetching daemon sees it: ids through its user
 * namespace, the pid in its PID namespace. Under q->lock (the client is
 * alive while its request is pending).
 */
static void hyb_req_sender(const struct hyb_client *c, struct hyb_req_from *f)
{
	struct user_namespace *ns = current_user_ns();

	f->uid = from_kuid_munged(ns, c->euid);
	f->gid = from_kgid_munged(ns, c->egid);
	f->pid = pid_vnr(c->pid);
	f->reserved = 0;
}

/*
 * Entries are struct hyb_req or, with the sender, struct hyb_req_from
 * (entry_size says which). The batch only leaves the queue once the
 * entries and the count are both written to the caller: a copy that fails
 * (the caller unmapped its buffer meanwhile) puts it back.
 */
int hyb_queue_ioctl_fetch(struct hyb_file *hf, struct hyb_batch *b, u32 __user *ucount)
{
	struct hyb_queue *q = hyb_file_daemon_queue(hf);
	bool from = b->entry_size == sizeof(struct hyb_req_from);
	struct hyb_req_from *buf;
	struct hyb_kreq *kr;
	u32 n = 0, p, i;
	int ret;
	u64 now;

	ret = hyb_batch_check(b, from ? sizeof(struct hyb_req_from) : sizeof(struct hyb_req),
			      false);
	if (ret)
		return ret;
	if (!q)
		return -EPERM;
	buf = kvmalloc_array(b->count, sizeof(*buf), GFP_KERNEL);
	if (!buf)
		return -ENOMEM;
	now = ktime_get_ns();
	spin_lock(&q->lock);
	for (p = 0; p < HYB_PRIO_LEVELS && n < b->count; p++) {
		while (n < b->count) {
			kr = list_first_entry_or_null(&q->pending[p], struct hyb_kreq, node);
			if (!kr)
				break;
			list_del_init(&kr->node);
			kr->t_fetch = now;
			hash_add(q->active, &kr->hnode, kr->req.id);
			buf[n].req = kr->req;
			hyb_req_sender(kr->client, &buf[n]);
			n++;
		}
	}
	q->st.nr_pending -= n;
	q->st.nr_active += n;
	spin_unlock(&q->lock);
	if (n && !from) {
		/* the plain format: the requests alone */
		struct hyb_req *plain = kvmalloc_array(n, sizeof(*plain), GFP_KERNEL);

		for (i = 0; plain && i < n; i++)
			plain[i] = buf[i].req;
		if (!plain)
			ret = -ENOMEM;
		else if (copy_to_user(u64_to_user_ptr(b->ptr), plain, (size_t)n * sizeof(*plain)))
			ret = -EFAULT;
		kvfree(plain);
	} else if (n && copy_to_user(u64_to_user_ptr(b->ptr), buf, (size_t)n * sizeof(*buf))) {
		ret = -EFAULT;
	}
	if (!ret && put_user(n, ucount))
		ret = -EFAULT;
	if (ret && n)
		hyb_fetch_undo(q, buf, n);
	b->count = ret ? 0 : n;
	kvfree(buf);
	return ret;
}

int hyb_queue_ioctl_complete(struct hyb_file *hf, struct hyb_batch *b)
{
	struct hyb_queue *q = hyb_file_daemon_queue(hf);
	struct hyb_kreq **krs = NULL, *kr;
	struct hyb_done *done;
	u32 i, n = b->count;
	LIST_HEAD(orphans);
	int ret;
	u64 now;

	ret = hyb_batch_check(b, sizeof(struct hyb_done), false);
	if (ret)
		return ret;
	if (!q)
		return -EPERM;
	done = kvmalloc_array(n, sizeof(*done), GFP_KERNEL);
	krs = kvmalloc_array(n, sizeof(*krs), GFP_KERNEL);
	if (!done || !krs) {
		ret = -ENOMEM;
		goto out;
	}
	if (copy_from_user(done, u64_to_user_ptr(b->ptr), (size_t)n * sizeof(*done))) {
		ret = -EFAULT;
		goto out;
	}
	for (i = 0; i < n; i++) {
		if (done[i].reserved || done[i].status > 0 || done[i].status < -MAX_ERRNO) {
			ret = -EINVAL;
			goto out;
		}
	}

	spin_lock(&q->lock);
	/* All or nothing: claim every id first (duplicates fail too). */
	for (i = 0; i < n; i++) {
		kr = hyb_active_find(q, done[i].id);
		if (!kr || kr->completing) {
			while (i--)
				krs[i]->completing = false;
			spin_unlock(&q->lock);
			ret = -ENOENT;
			goto out;
		}
		kr->completing = true;
		krs[i] = kr;
	}
	now = ktime_get_ns();
	for (i = 0; i < n; i++) {
		kr = krs[i];
		hash_del(&kr->hnode);
		kr->completing = false;
		q->st.nr_active--;
		hyb_hist_add(&q->st.wait, kr->t_fetch - kr->t_submit);
		hyb_hist_add(&q->st.service, now - kr->t_fetch);
		hyb_kreq_finish(q, kr, done[i].status, now, &orphans);
	}
	spin_unlock(&q->lock);
	hyb_kreq_free_list(&orphans);
out:
	kvfree(krs);
	kvfree(done);
	return ret;
}

static bool hyb_reap_ready(struct hyb_client *c, u32 want)
{
	struct hyb_queue *q = c->q;
	bool ready;

	spin_lock(&q->lock);
	ready = c->nr_done >= want || c->nr_done >= c->outstanding || q->dead;
	spin_unlock(&q->lock);
	return ready;
}

/* Block until @want completions are ready; the time blocked is a stall. */
static int hyb_reap_wait(struct hyb_client *c, u32 want, u64 timeout_ns)
{
	struct hyb_queue *q = c->q;
	u64 t0, t1;
	long left;

	if (hyb_reap_ready(c, want))
		return 0;
	t0 = ktime_get_ns();
	if (timeout_ns) {
		u64 j = nsecs_to_jiffies64(timeout_ns);

		j = clamp_t(u64, j, 1, MAX_SCHEDULE_TIMEOUT - 1);
		left = wait_event_interruptible_timeout(c->wq, hyb_reap_ready(c, want), (long)j);
	} else {
		left = wait_event_interruptible(c->wq, hyb_reap_ready(c, want));
		if (!left)
			left = 1;
	}
	t1 = ktime_get_ns();
	spin_lock(&q->lock);
	hyb_hist_add(&q->st.stall, t1 - t0);
	q->st.stalls++;
	c->stalls++;
	c->stall_ns += t1 - t0;
	spin_unlock(&q->lock);
	if (left < 0)
		return -EINTR;
	return left ? 0 : -ETIMEDOUT;
}

int hyb_queue_ioctl_reap(struct hyb_file *hf, struct hyb_batch *b, u32 __user *ucount)
{
	struct hyb_client *c = hyb_file_client(hf);
	struct hyb_kreq **krs = NULL, *kr;
	struct hyb_cqe *cqe = NULL;
	int ret, wait_ret = 0;
	struct hyb_queue *q;
	LIST_HEAD(reaped);
	u32 i, n = 0;
	bool dead;

	ret = hyb_batch_check(b, sizeof(struct hyb_cqe), true);
	if (ret)
		return ret;
	if (!c)
		return -ENOTCONN;
	q = c->q;
	cqe = kvcalloc(b->count, sizeof(*cqe), GFP_KERNEL);
	krs = kvmalloc_array(b->count, sizeof(*krs), GFP_KERNEL);
	if (!cqe || !krs) {
		ret = -ENOMEM;
		goto out;
	}
	if (b->flags & HYB_REAP_WAIT) {
		wait_ret = hyb_reap_wait(c, b->min_count, b->timeout_ns);
		if (wait_ret == -EINTR) {
			ret = wait_ret;
			goto out;
		}
	}

	spin_lock(&q->lock);
	while (n < b->count && !list_empty(&c->done)) {
		kr = list_first_entry(&c->done, struct hyb_kreq, node);
		list_del_init(&kr->node);
		krs[n++] = kr;
	}
	c->nr_done -= n;
	c->outstanding -= n;
	dead = q->dead;
	spin_unlock(&q->lock);

	for (i = 0; i < n; i++) {
		kr = krs[i];
		cqe[i].id = kr->req.id;
		cqe[i].tag = kr->req.tag;
		cqe[i].status = kr->status;
		if (kr->t_fetch) {
			cqe[i].wait_ns = kr->t_fetch - kr->t_submit;
			cqe[i].service_ns = kr->t_done - kr->t_fetch;
		} else {
			cqe[i].wait_ns = kr->t_done - kr->t_submit;
		}
	}
	if ((n && copy_to_user(u64_to_user_ptr(b->ptr), cqe, (size_t)n * sizeof(*cqe))) ||
	    put_user(n, ucount)) {
		/*
		 * Nothing was delivered (the entries or the count could not
		 * be written): keep them for the next REAP.
		 */
		spin_lock(&q->lock);
		for (i = n; i-- > 0;)
			list_add(&krs[i]->node, &c->done);
		c->nr_done += n;
		c->outstanding += n;
		spin_unlock(&q->lock);
		ret = -EFAULT;
		n = 0;
		goto out;
	}
	for (i = 0; i < n; i++)
		list_add_tail(&krs[i]->node, &reaped);
	hyb_kreq_free_list(&reaped);
	if (!n && dead)
		ret = -EPIPE;
	else if (!n && wait_ret)
		ret = wait_ret;
out:
	b->count = n;
	kvfree(krs);
	kvfree(cqe);
	return ret;
}

int hyb_queue_ioctl_stats(struct hyb_queue_stats *s)
{
	u32 qid = s->queue_id;
	struct hyb_queue *q;

	if (s->flags || qid >= HYB_MAX_QUEUES)
		return -EINVAL;
	memset(s, 0, sizeof(*s));
	s->size = sizeof(*s);
	s->queue_id = qid;
	mutex_lock(&hyb_lock);
	q = hyb_queues[array_index_nospec(qid, HYB_MAX_QUEUES)];
	if (q)
		kref_get(&q->ref);
	mutex_unlock(&hyb_lock);
	if (!q)
		return 0;

	spin_lock(&q->lock);
	s->state = q->dead ? HYB_QUEUE_ABSENT : HYB_QUEUE_LIVE;
	s->daemon_pid = pid_vnr(q->daemon_pid);
	s->clients = q->nr_clients;
	s->submitted = q->st.submitted;
	s->completed = q->st.completed;
	s->failed = q->st.failed;
	s->queued = q->st.nr_pending;
	s->in_service = q->st.nr_active;
	s->in_flight = q->st.nr_pending + q->st.nr_active;
	s->stalls = q->st.stalls;
	hyb_hist_summary(&q->st.wait, &s->queue_wait);
	hyb_hist_summary(&q->st.service, &s->service);
	hyb_hist_summary(&q->st.stall, &s->stall);
	spin_unlock(&q->lock);
	hyb_queue_put(q);
	return 0;
}

/* debugfs "queues": the counters, every client, and the non-empty buckets. */
static void hyb_hist_show(struct seq_file *m, const char *name, const struct hyb_hist *h)
{
	struct hyb_hist_stat st;
	unsigned int i;

	hyb_hist_summary(h, &st);
	seq_printf(m, "  %s: count %llu mean %llu min %llu p50 %llu p90 %llu p99 %llu p999 %llu max %llu ns\n",
		   name, st.count, st.count ? st.sum_ns / st.count : 0, st.min_ns, st.p50_ns,
		   st.p90_ns, st.p99_ns, st.p999_ns, st.max_ns);
	for (i = 0; i < HYB_HIST_BUCKETS; i++)
		if (h->bucket[i])
			seq_printf(m, "    >=%llu %llu\n", hyb_hist_bucket_low(i), h->bucket[i]);
}

void hyb_queue_debugfs_show(struct seq_file *m)
{
	struct hyb_qstats *snap;
	struct hyb_queue *q;
	struct hyb_client *c;
	u32 qid;

	snap = kvmalloc(sizeof(*snap), GFP_KERNEL);
	if (!snap)
		return;
	mutex_lock(&hyb_lock);
	for (qid = 0; qid < HYB_MAX_QUEUES; qid++) {
		q = hyb_queues[qid];
		if (!q)
			continue;
		seq_printf(m, "queue %u daemon %d\n", qid, pid_vnr(q->daemon_pid));
		spin_lock(&q->lock);
		*snap = q->st;
		/* Clients are few; printing into the seq buffer does not sleep. */
		list_for_each_entry(c, &q->clients, node)
			seq_printf(m, "  client %u pid %d submitted %llu completed %llu failed %llu outstanding %u stalls %llu stall_ns %llu\n",
				   c->id, pid_vnr(c->pid), c->submitted, c->completed, c->failed,
				   c->outstanding, c->stalls, c->stall_ns);
		spin_unlock(&q->lock);
		seq_printf(m, "  submitted %llu completed %llu failed %llu queued %llu in_service %llu stalls %llu\n",
			   snap->submitted, snap->completed, snap->failed, snap->nr_pending,
			   snap->nr_active, snap->stalls);
		hyb_hist_show(m, "queue_wait", &snap->wait);
		hyb_hist_show(m, "service", &snap->service);
		hyb_hist_show(m, "stall", &snap->stall);
	}
	mutex_unlock(&hyb_lock);
	kvfree(snap);
}
