// SPDX-License-Identifier: GPL-2.0
/*
 * Neuron pools: pinned, zeroed memory on one NUMA node, made of 2 MiB
 * compound pages, mapped into processes by offset.
 *
 * Why alloc_pages_node(order 9, __GFP_THISNODE) and not hugetlbfs pages:
 * the hugetlb allocator is not exported to modules and would need an admin
 * to reserve pages at boot; buddy pages allocated by the kernel are never on
 * an LRU list, so reclaim, swap, NUMA balancing and compaction cannot move
 * or drop them (they are pinned by construction), __GFP_THISNODE makes the
 * placement strict instead of a preference, and one order-9 compound page is
 * exactly one PMD, so the fault path can map a whole chunk with one TLB
 * entry. Pages are handed out by the .fault handler as ordinary refcounted
 * pages (not PFN maps): get_user_pages() then works on pool mappings
 * (O_DIRECT reads into pools, cudaHostRegister, move_pages queries), and a
 * page stays allocated as long as any mapping or pin still holds it.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/capability.h>
#include <linux/delay.h>
#include <linux/fs.h>
#include <linux/gfp.h>
#include <linux/mm.h>
#include <linux/ktime.h>
#include <linux/mman.h>
#include <linux/nodemask.h>
#include <linux/overflow.h>
#include <linux/sched.h>
#include <linux/sched/signal.h>
#include <linux/slab.h>
#include <linux/topology.h>
#include <linux/uaccess.h>

#include "hybpool.h"

DEFINE_XARRAY_ALLOC1(hyb_pools);
static u32 hyb_pool_next_id;
static unsigned int hyb_pool_slots;	/* table entries, creating ones included */

/* __GFP_ACCOUNT: a pool's pages count against its creator's memory cgroup */
#define HYB_POOL_GFP	(GFP_KERNEL_ACCOUNT | __GFP_COMP | __GFP_ZERO | __GFP_THISNODE | \
			 __GFP_NOWARN | __GFP_RETRY_MAYFAIL)

static bool hyb_name_valid(const char *name)
{
	size_t n = strnlen(name, HYB_NAME_LEN), i;

	if (n == 0 || n == HYB_NAME_LEN)
		return false;
	/* ASCII only: the kernel's isalnum() also takes Latin-1 letters (0xc0..0xff) */
	for (i = 0; i < n; i++) {
		unsigned char ch = name[i];

		if (!(ch >= 'a' && ch <= 'z') && !(ch >= 'A' && ch <= 'Z') &&
		    !(ch >= '0' && ch <= '9') && ch != '.' && ch != '_' && ch != '-')
			return false;
	}
	/* Bytes after the terminator are reserved too. */
	for (; i < HYB_NAME_LEN; i++)
		if (name[i])
			return false;
	return true;
}

/*
 * Pinned memory is accounted by page lifetime, not pool lifetime: a chunk
 * of a dead pool that something still references (a pipe holding
 * vmsplice()d pages, a get_user_pages() pin, I/O in flight) stays counted
 * against the cap until that reference is gone. The module keeps its own
 * reference on such a chunk and parks it here (through the head page's lru,
 * unused: the page is on no LRU); nobody can take a new reference (no
 * mapping or pool reaches it), so once the count is back to ours alone the
 * chunk is freed and uncharged. Reaped on every charge, DEV_INFO, and once
 * a second while any chunk waits.
 */
static LIST_HEAD(hyb_linger);
static DEFINE_SPINLOCK(hyb_linger_lock);
static void hyb_linger_work_fn(struct work_struct *work);
static DECLARE_DELAYED_WORK(hyb_linger_work, hyb_linger_work_fn);

/* Frees the chunks nothing else holds; true while others still wait. */
static bool hyb_linger_reap(void)
{
	struct page *page, *tmp;
	LIST_HEAD(freed);
	bool more;

	spin_lock(&hyb_linger_lock);
	list_for_each_entry_safe(page, tmp, &hyb_linger, lru)
		if (page_count(page) == 1)
			list_move(&page->lru, &freed);
	more = !list_empty(&hyb_linger);
	spin_unlock(&hyb_linger_lock);
	list_for_each_entry_safe(page, tmp, &freed, lru) {
		list_del(&page->lru);
		__free_pages(page, HYB_CHUNK_ORDER);
		atomic64_sub(HYB_CHUNK_SIZE, &hyb_pinned_bytes);
	}
	return more;
}

static void hyb_linger_work_fn(struct work_struct *work)
{
	if (hyb_linger_reap())
		schedule_delayed_work(&hyb_linger_work, HZ);
}

/* Pinned bytes now, after freeing what no one holds any more. */
u64 hyb_pinned_now(void)
{
	hyb_linger_reap();
	return atomic64_read(&hyb_pinned_bytes);
}

/*
 * Unload: the module's references go (a chunk still held elsewhere is freed
 * by its last holder's put_page) and so does its charge.
 */
void hyb_linger_exit(void)
{
	struct page *page, *tmp;

	cancel_delayed_work_sync(&hyb_linger_work);
	list_for_each_entry_safe(page, tmp, &hyb_linger, lru) {
		list_del(&page->lru);
		__free_pages(page, HYB_CHUNK_ORDER);
		atomic64_sub(HYB_CHUNK_SIZE, &hyb_pinned_bytes);
	}
}

/*
 * Gives back every chunk slot of an array and the array: each slot carries
 * one chunk's charge, released now when the slot is empty (a failed
 * allocation) or the pool held the only reference, later otherwise.
 */
static void hyb_chunks_free(struct page **chunks, unsigned long nr)
{
	unsigned long i, parked = 0;

	for (i = 0; i < nr; i++) {
		struct page *page = chunks[i];

		if (page && page_count(page) != 1) {
			spin_lock(&hyb_linger_lock);
			list_add_tail(&page->lru, &hyb_linger);
			spin_unlock(&hyb_linger_lock);
			parked++;
			continue;
		}
		if (page)
			__free_pages(page, HYB_CHUNK_ORDER);
		atomic64_sub(HYB_CHUNK_SIZE, &hyb_pinned_bytes);
		cond_resched();
	}
	kvfree(chunks);
	if (parked)
		schedule_delayed_work(&hyb_linger_work, HZ);
}

/* Fills chunks[0..nr) on node; 0, -ENOMEM, or -EINTR when the caller is being killed. */
static int hyb_chunks_alloc(struct page **chunks, unsigned long nr, int node, gfp_t gfp)
{
	unsigned long i;

	for (i = 0; i < nr; i++) {
		chunks[i] = alloc_pages_node(node, gfp, HYB_CHUNK_ORDER);
		if (!chunks[i])
			return -ENOMEM;
		if (fatal_signal_pending(current))
			return -EINTR;
		cond_resched();
	}
	return 0;
}

/*
 * Charges bytes against the cap: both sets of pages of a migrating pool are
 * pinned at once, and the cap is a promise about pinned memory.
 */
static int hyb_charge(u64 bytes)
{
	u64 cap;
	int ret = 0;

	hyb_linger_reap();
	mutex_lock(&hyb_lock);
	cap = hyb_cap_bytes();
	if (bytes > cap || (u64)atomic64_read(&hyb_pinned_bytes) > cap - bytes)
		ret = -ENOSPC;
	else
		atomic64_add(bytes, &hyb_pinned_bytes);
	mutex_unlock(&hyb_lock);
	return ret;
}

static void hyb_pool_free(struct kref *ref)
{
	struct hyb_pool *pool = container_of(ref, struct hyb_pool, ref);

	hyb_chunks_free(pool->chunks, pool->nr_chunks);	/* uncharges, now or when unheld */
	mutex_destroy(&pool->migrate_lock);
	if (pool->destroyed)
		atomic_dec(&hyb_nr_zombies);
	put_pid(pool->owner_pid);
	kfree_rcu(pool, rcu);
}

static void hyb_pool_put(struct hyb_pool *pool)
{
	kref_put(&pool->ref, hyb_pool_free);
}

/* A reference to a live, fully created pool, or NULL. */
static struct hyb_pool *hyb_pool_get(unsigned long id)
{
	struct hyb_pool *pool;

	rcu_read_lock();
	pool = xa_load(&hyb_pools, id);
	if (pool && (!smp_load_acquire(&pool->ready) || !kref_get_unless_zero(&pool->ref)))
		pool = NULL;
	rcu_read_unlock();
	return pool;
}

/* Takes the pool out of the table; the caller drops the table's reference. */
static void hyb_pool_unlink(struct hyb_pool *pool)
{
	lockdep_assert_held(&hyb_lock);
	xa_erase(&hyb_pools, pool->id);
	hyb_pool_slots--;
	list_del_init(&pool->owner_node);
	WRITE_ONCE(pool->owner, NULL);
	pool->destroyed = true;
	atomic_inc(&hyb_nr_zombies);
}

static bool hyb_pool_name_taken(const char *name)
{
	struct hyb_pool *pool;
	unsigned long idx;

	lockdep_assert_held(&hyb_lock);
	xa_for_each(&hyb_pools, idx, pool)
		if (!strncmp(pool->name, name, HYB_NAME_LEN))
			return true;
	return false;
}

int hyb_pool_ioctl_create(struct hyb_file *hf, struct file *file, struct hyb_pool_create *a)
{
	u32 shift = a->page_shift ? a->page_shift : HYB_PAGE_SHIFT_2M;
	struct hyb_pool *pool;
	u64 bytes, cap, t0;
	int node = a->node, ret;

	if (a->flags || a->reserved)
		return -EINVAL;
	if (!(file->f_mode & FMODE_WRITE))
		return -EBADF;
	if (!capable(CAP_IPC_LOCK))
		return -EPERM;
	if (!hyb_name_valid(a->name))
		return -EINVAL;
	if (shift == HYB_PAGE_SHIFT_1G)
		return -EOPNOTSUPP;
	if (shift != HYB_PAGE_SHIFT_2M)
		return -EINVAL;
	if (!a->bytes || a->bytes > HYB_POOL_MAX_BYTES)
		return -EINVAL;
	if (node == HYB_NODE_LOCAL)
		node = numa_mem_id();
	if (node < 0 || node >= nr_node_ids || !node_state(node, N_MEMORY))
		return -EINVAL;
	bytes = round_up(a->bytes, HYB_CHUNK_SIZE);

	pool = kzalloc(sizeof(*pool), GFP_KERNEL_ACCOUNT);
	if (!pool)
		return -ENOMEM;
	pool->nr_chunks = bytes >> HYB_CHUNK_SHIFT;
	pool->chunks = kvcalloc(pool->nr_chunks, sizeof(*pool->chunks), GFP_KERNEL);
	if (!pool->chunks) {
		kfree(pool);
		return -ENOMEM;
	}
	kref_init(&pool->ref);
	init_rwsem(&pool->chunks_sem);
	mutex_init(&pool->migrate_lock);
	INIT_LIST_HEAD(&pool->owner_node);
	memcpy(pool->name, a->name, HYB_NAME_LEN);
	pool->node = node;
	pool->bytes = bytes;
	pool->owner = hf;
	pool->owner_pid = get_pid(task_tgid(current));
	pool->owner_uid = current_euid();

	/*
	 * Reserve the name, an id and the pinned bytes, then allocate without
	 * the lock (a big pool takes seconds); until ready is set, lookups do
	 * not see the pool.
	 */
	hyb_linger_reap();
	mutex_lock(&hyb_lock);
	cap = hyb_cap_bytes();
	if (hyb_pool_name_taken(a->name)) {
		ret = -EEXIST;
	} else if (hyb_pool_slots >= HYB_MAX_POOLS ||
		   bytes > cap || (u64)atomic64_read(&hyb_pinned_bytes) > cap - bytes) {
		ret = -ENOSPC;
	} else {
		ret = xa_alloc_cyclic(&hyb_pools, &pool->id, pool,
				      XA_LIMIT(1, HYB_MAX_POOL_ID), &hyb_pool_next_id, GFP_KERNEL);
		if (ret >= 0) {
			ret = 0;
			hyb_pool_slots++;
			atomic64_add(bytes, &hyb_pinned_bytes);
		}
	}
	mutex_unlock(&hyb_lock);
	if (ret) {
		kvfree(pool->chunks);
		mutex_destroy(&pool->migrate_lock);
		put_pid(pool->owner_pid);
		kfree(pool);
		return ret;
	}

	t0 = ktime_get_ns();
	ret = hyb_chunks_alloc(pool->chunks, pool->nr_chunks, node, HYB_POOL_GFP);
	pool->create_ns = ktime_get_ns() - t0;

	mutex_lock(&hyb_lock);
	if (ret) {
		xa_erase(&hyb_pools, pool->id);
		hyb_pool_slots--;
	} else {
		list_add_tail(&pool->owner_node, &hf->pools);
		smp_store_release(&pool->ready, true);
	}
	mutex_unlock(&hyb_lock);
	if (ret) {
		hyb_pool_put(pool);
		return ret;
	}

	a->bytes = bytes;
	a->node = node;
	a->page_shift = HYB_PAGE_SHIFT_2M;
	a->pool_id = pool->id;
	a->mmap_offset = (u64)pool->id << HYB_MMAP_SHIFT;
	return 0;
}

int hyb_pool_ioctl_destroy(struct hyb_file *hf, struct hyb_pool_ref *a)
{
	struct hyb_pool *pool;
	int ret = 0;

	if (a->flags || a->reserved)
		return -EINVAL;
	mutex_lock(&hyb_lock);
	pool = xa_load(&hyb_pools, a->pool_id);
	if (!pool || !pool->ready)
		ret = -ENOENT;
	else if (pool->owner != hf && !capable(CAP_SYS_ADMIN))
		ret = -EPERM;
	else
		hyb_pool_unlink(pool);
	mutex_unlock(&hyb_lock);
	if (!ret)
		hyb_pool_put(pool);
	return ret;
}

/* CREATE could not tell the caller: its new pool goes again (it owns it). */
void hyb_pool_destroy_own(struct hyb_file *hf, u32 id)
{
	struct hyb_pool *pool;

	mutex_lock(&hyb_lock);
	pool = xa_load(&hyb_pools, id);
	if (pool && pool->ready && pool->owner == hf)
		hyb_pool_unlink(pool);
	else
		pool = NULL;
	mutex_unlock(&hyb_lock);
	if (pool)
		hyb_pool_put(pool);
}

/* The owner file is closing: its pools die (memory stays while mapped). */
void hyb_pool_release_owned(struct hyb_file *hf)
{
	struct hyb_pool *pool, *tmp;
	LIST_HEAD(dead);

	mutex_lock(&hyb_lock);
	list_for_each_entry_safe(pool, tmp, &hf->pools, owner_node) {
		hyb_pool_unlink(pool);
		list_add_tail(&pool->owner_node, &dead);
	}
	mutex_unlock(&hyb_lock);
	list_for_each_entry_safe(pool, tmp, &dead, owner_node) {
		list_del_init(&pool->owner_node);
		hyb_pool_put(pool);
	}
}

static void hyb_pool_fill_info(struct hyb_pool *pool, struct hyb_file *hf,
			       struct hyb_pool_info *a)
{
	a->pool_id = pool->id;
	a->node = READ_ONCE(pool->node);
	memcpy(a->name, pool->name, HYB_NAME_LEN);
	a->bytes = pool->bytes;
	a->mmap_offset = (u64)pool->id << HYB_MMAP_SHIFT;
	a->page_shift = HYB_PAGE_SHIFT_2M;
	a->mappers = atomic_read(&pool->mappers);
	a->faults = atomic64_read(&pool->faults);
	a->reloads = atomic64_read(&pool->reloads);
	a->owner_pid = pid_vnr(pool->owner_pid);	/* 0: not in the caller's namespace */
	a->owned = READ_ONCE(pool->owner) == hf;
	a->create_ns = pool->create_ns;
}

int hyb_pool_ioctl_info(struct hyb_file *hf, struct hyb_pool_info *a)
{
	struct hyb_pool *pool = NULL, *p;
	unsigned long idx;

	if (a->flags & ~HYB_POOL_BY_NAME)
		return -EINVAL;
	if (a->flags & HYB_POOL_BY_NAME) {
		if (!hyb_name_valid(a->name))
			return -EINVAL;
		rcu_read_lock();
		xa_for_each(&hyb_pools, idx, p) {
			if (!strncmp(p->name, a->name, HYB_NAME_LEN) &&
			    smp_load_acquire(&p->ready) && kref_get_unless_zero(&p->ref)) {
				pool = p;
				break;
			}
		}
		rcu_read_unlock();
	} else {
		pool = hyb_pool_get(a->pool_id);
	}
	if (!pool)
		return -ENOENT;
	hyb_pool_fill_info(pool, hf, a);
	hyb_pool_put(pool);
	return 0;
}

int hyb_pool_ioctl_list(struct hyb_pool_list *a)
{
	struct hyb_pool *pool;
	unsigned long idx;
	u32 *ids, n = 0;
	int ret = 0;

	if (a->flags || a->reserved || a->count > HYB_MAX_POOLS)
		return -EINVAL;
	if (a->count && !a->ptr)
		return -EFAULT;
	ids = kcalloc(HYB_MAX_POOLS, sizeof(*ids), GFP_KERNEL);
	if (!ids)
		return -ENOMEM;
	rcu_read_lock();
	xa_for_each(&hyb_pools, idx, pool) {
		if (smp_load_acquire(&pool->ready) && n < HYB_MAX_POOLS)
			ids[n++] = pool->id;
	}
	rcu_read_unlock();
	if (copy_to_user(u64_to_user_ptr(a->ptr), ids, min(n, a->count) * sizeof(*ids)))
		ret = -EFAULT;
	a->count = n;
	kfree(ids);
	return ret;
}

/* -- migration ---------------------------------------------------------- */

/*
 * How often a migration unmaps and looks again before it calls the pool
 * busy. A fault that looked its page up just before the migration took
 * chunks_sem still holds a reference and maps the page an instant later;
 * the next unmap takes that mapping down again. References that stay are
 * pins (O_DIRECT, get_user_pages, a device): those writes would be lost.
 */
#define HYB_MIGRATE_TRIES	5

/* Does any chunk have a reference besides the pool's own? */
static bool hyb_chunks_busy(struct hyb_pool *pool)
{
	unsigned long i;

	for (i = 0; i < pool->nr_chunks; i++)
		if (page_count(pool->chunks[i]) != 1)
			return true;
	return false;
}

/*
 * With chunks_sem held for write (no fault can look a page up): take down
 * every mapping of the pool, in every process, and make sure nothing else
 * still holds its pages.
 */
static int hyb_pool_unmap_all(struct hyb_pool *pool)
{
	loff_t start = (loff_t)pool->id << HYB_MMAP_SHIFT;
	int i;

	for (i = 0; i < HYB_MIGRATE_TRIES; i++) {
		if (i)
			usleep_range(1000, 2000);
		unmap_mapping_range(hyb_mapping, start, pool->bytes, 1);
		if (!hyb_chunks_busy(pool))
			return 0;
	}
	return -EBUSY;
}

/* Copies the pool into new chunks; -EINTR leaves it to the caller to drop them. */
static int hyb_chunks_copy(struct page **to, struct page **from, unsigned long nr)
{
	unsigned long i;

	for (i = 0; i < nr; i++) {
		/* 64-bit only (hybpool.h): every page has a kernel address. */
		memcpy(page_address(to[i]), page_address(from[i]), HYB_CHUNK_SIZE);
		if (fatal_signal_pending(current))
			return -EINTR;
		cond_resched();
	}
	return 0;
}

/*
 * Moves a live pool to another node. The new pages are allocated first,
 * outside chunks_sem, so faults on the pool only wait for the unmap and the
 * copy. Until the swap the old pages stay the pool's, so every error leaves
 * the pool as it was (its mappings just refault onto the same pages).
 */
int hyb_pool_ioctl_migrate(struct hyb_file *hf, struct hyb_pool_migrate *a)
{
	struct page **fresh, **old;
	struct hyb_pool *pool;
	int node = a->node, ret;
	u64 t0;

	if (a->flags || a->reserved[0] || a->reserved[1])
		return -EINVAL;
	if (node < 0 || node >= nr_node_ids || !node_state(node, N_MEMORY))
		return -EINVAL;
	pool = hyb_pool_get(a->pool_id);
	if (!pool)
		return -ENOENT;
	if (READ_ONCE(pool->owner) != hf && !capable(CAP_SYS_ADMIN)) {
		ret = -EPERM;
		goto out_put;
	}
	a->blocked_ns = 0;
	ret = mutex_lock_killable(&pool->migrate_lock);
	if (ret)
		goto out_put;
	if (READ_ONCE(pool->node) == node)
		goto out_unlock;	/* nothing to do */
	ret = hyb_charge(pool->bytes);
	if (ret)
		goto out_unlock;
	fresh = kvcalloc(pool->nr_chunks, sizeof(*fresh), GFP_KERNEL);
	if (!fresh) {
		atomic64_sub(pool->bytes, &hyb_pinned_bytes);
		ret = -ENOMEM;
		goto out_unlock;
	}
	/* No __GFP_ZERO: every byte is copied over. */
	ret = hyb_chunks_alloc(fresh, pool->nr_chunks, node, HYB_POOL_GFP & ~__GFP_ZERO);
	if (ret)
		goto out_free;

	down_write(&pool->chunks_sem);
	t0 = ktime_get_ns();
	ret = hyb_pool_unmap_all(pool);
	if (!ret)
		ret = hyb_chunks_copy(fresh, pool->chunks, pool->nr_chunks);
	if (!ret) {
		old = pool->chunks;
		pool->chunks = fresh;
		WRITE_ONCE(pool->node, node);
		fresh = old;	/* the old pages are what gets freed now */
	}
	a->blocked_ns = ktime_get_ns() - t0;
	up_write(&pool->chunks_sem);
out_free:
	/*
	 * The old pages (or, on failure, the new ones) go, and with them the
	 * second charge: the old ones had no other reference when they were
	 * looked at under chunks_sem and none can have been taken since.
	 */
	hyb_chunks_free(fresh, pool->nr_chunks);
out_unlock:
	mutex_unlock(&pool->migrate_lock);
out_put:
	hyb_pool_put(pool);
	return ret;
}

u32 hyb_pool_count(void)
{
	struct hyb_pool *pool;
	unsigned long idx;
	u32 n = 0;

	rcu_read_lock();
	xa_for_each(&hyb_pools, idx, pool)
		n += smp_load_acquire(&pool->ready);
	rcu_read_unlock();
	return n;
}

/*
 * Is [off, off + len) a non-empty range of live pool id? 0, -ENOENT (no such
 * pool) or -EINVAL. With count, the pool's reload counter goes up (the
 * request naming it was accepted).
 */
int hyb_pool_check_range(u32 id, u64 off, u64 len, bool count)
{
	struct hyb_pool *pool;
	int ret = -ENOENT;
	u64 end;

	rcu_read_lock();
	pool = xa_load(&hyb_pools, id);
	if (pool && smp_load_acquire(&pool->ready)) {
		ret = -EINVAL;
		if (len && !check_add_overflow(off, len, &end) && end <= pool->bytes) {
			ret = 0;
			if (count)
				atomic64_inc(&pool->reloads);
		}
	}
	rcu_read_unlock();
	return ret;
}

/* May a client with effective uid @uid ask for a LOAD (a write) into pool @id? */
bool hyb_pool_writable_by(u32 id, kuid_t uid)
{
	struct hyb_pool *pool;
	bool ok = false;

	rcu_read_lock();
	pool = xa_load(&hyb_pools, id);
	if (pool && smp_load_acquire(&pool->ready))
		ok = uid_eq(pool->owner_uid, uid);
	rcu_read_unlock();
	return ok;
}

/* -- mapping ------------------------------------------------------------ */

static void hyb_vm_open(struct vm_area_struct *vma)
{
	struct hyb_pool *pool = vma->vm_private_data;

	kref_get(&pool->ref);
	atomic_inc(&pool->mappers);
}

static void hyb_vm_close(struct vm_area_struct *vma)
{
	struct hyb_pool *pool = vma->vm_private_data;

	atomic_dec(&pool->mappers);
	hyb_pool_put(pool);
}

/*
 * A migration holds chunks_sem for its whole unmap and copy (a second per
 * GiB). A fault must not wait for it in D state with the mmap lock held:
 * like filemap_fault() waiting for I/O, it drops the fault lock, waits
 * killably and asks the core to retry (VM_FAULT_RETRY); a killed task
 * leaves at once. Where a retry is not allowed (the retry itself, or
 * FAULT_FLAG_RETRY_NOWAIT callers) it waits killably with the lock held;
 * a fatal signal then fails the access (SIGBUS: the task is dying anyway;
 * get_user_pages() returns -EFAULT). 0: chunks_sem is held for read.
 */
static vm_fault_t hyb_fault_wait(struct vm_fault *vmf, struct hyb_pool *pool)
{
	if (fault_flag_allow_retry_first(vmf->flags)) {
		if (vmf->flags & FAULT_FLAG_RETRY_NOWAIT)
			return VM_FAULT_RETRY;
		/* The VMA, and with it the pool, may go once the lock is dropped. */
		kref_get(&pool->ref);
		hyb_release_fault_lock(vmf);
		if (!down_read_killable(&pool->chunks_sem))
			up_read(&pool->chunks_sem);
		hyb_pool_put(pool);
		return VM_FAULT_RETRY;
	}
	return down_read_killable(&pool->chunks_sem) ? VM_FAULT_SIGBUS : 0;
}

/*
 * Hand the core the page; it maps it with a PTE, or (order-9 compound page,
 * PMD-aligned VMA) the whole chunk with one PMD. The reference taken here is
 * the mapping's and is dropped when it is unmapped. chunks_sem keeps a
 * migration from swapping the chunks between the lookup and the reference
 * (it then sees the reference and unmaps again, see hyb_pool_unmap_all).
 */
static vm_fault_t hyb_vm_fault(struct vm_fault *vmf)
{
	struct hyb_pool *pool = vmf->vma->vm_private_data;
	unsigned long base = (unsigned long)pool->id << (HYB_MMAP_SHIFT - PAGE_SHIFT);
	unsigned long idx;
	struct page *page;

	if (vmf->pgoff < base)
		return VM_FAULT_SIGBUS;
	idx = vmf->pgoff - base;
	if (idx >= pool->bytes >> PAGE_SHIFT)
		return VM_FAULT_SIGBUS;
	if (!down_read_trylock(&pool->chunks_sem)) {
		vm_fault_t ret = hyb_fault_wait(vmf, pool);

		if (ret)
			return ret;
	}
	page = pool->chunks[idx >> HYB_CHUNK_ORDER] + (idx & (HYB_CHUNK_PAGES - 1));
	get_page(page);
	up_read(&pool->chunks_sem);
	vmf->page = page;
	atomic64_inc(&pool->faults);
	return 0;
}

static const struct vm_operations_struct hyb_vm_ops = {
	.open = hyb_vm_open,
	.close = hyb_vm_close,
	.fault = hyb_vm_fault,
};

/*
 * offset = pool id << HYB_MMAP_SHIFT + a chunk-aligned start, length a
 * multiple of the chunk, MAP_SHARED. The owner file may map read-write;
 * anyone else gets a mapping that can never become writable.
 */
int hyb_mmap(struct file *file, struct vm_area_struct *vma)
{
	struct hyb_file *hf = file->private_data;
	u64 off = (u64)vma->vm_pgoff << PAGE_SHIFT;
	u64 start = off & (HYB_POOL_MAX_BYTES - 1);
	u64 len = vma->vm_end - vma->vm_start;
	u64 id = off >> HYB_MMAP_SHIFT;
	struct hyb_pool *pool;

	if (!(vma->vm_flags & VM_MAYSHARE))
		return -EINVAL;
	if (!IS_ALIGNED(start, HYB_CHUNK_SIZE) || !IS_ALIGNED(len, HYB_CHUNK_SIZE))
		return -EINVAL;
	if (id > HYB_MAX_POOL_ID)
		return -ENXIO;
	pool = hyb_pool_get(id);
	if (!pool)
		return -ENXIO;
	if (start >= pool->bytes || len > pool->bytes - start) {
		hyb_pool_put(pool);
		return -EINVAL;
	}
	if (READ_ONCE(pool->owner) != hf) {
		if (vma->vm_flags & VM_WRITE) {
			hyb_pool_put(pool);
			return -EACCES;
		}
		hyb_vm_flags_clear(vma, VM_MAYWRITE);
	}
	/*
	 * DONTEXPAND makes the VMA "special": no mremap growth, no mlock of
	 * pages that are not on an LRU, no khugepaged or MADV_COLLAPSE.
	 * (NUMA balancing is kept away through the address space's gfp
	 * mask, see hyb_fs_init(): VM_IO or VM_PFNMAP would also stop
	 * get_user_pages(), VM_MIXEDMAP makes zap_huge_pmd() leave PMD-mapped
	 * pages referenced.)
	 */
	hyb_vm_flags_set(vma, VM_DONTEXPAND | VM_DONTDUMP);
	vma->vm_ops = &hyb_vm_ops;
	vma->vm_private_data = pool;
	atomic_inc(&pool->mappers);
	return 0;
}

/* PMD-aligned addresses, so that chunks can be mapped by one PMD each. */
unsigned long hyb_get_unmapped_area(struct file *file, unsigned long addr, unsigned long len,
				    unsigned long pgoff, unsigned long flags)
{
	return thp_get_unmapped_area(file, addr, len, pgoff, flags);
}
