/* SPDX-License-Identifier: GPL-2.0 */
/*
 * hybpool internals shared by the module's files. The uapi (what userspace
 * sees) is include/uapi/linux/hybpool.h.
 *
 * Locking, outermost first:
 *   pool->migrate_lock    one migration of a pool at a time
 *   pool->chunks_sem      write: a migration swaps pool->chunks; read: a
 *                         fault looks a page up (and takes its reference)
 *   hyb_lock (mutex)      pool table changes, queue table, file->pools lists
 *   queue->lock (spinlock) everything of one queue: its requests, clients,
 *                         counters and histograms
 * Pool lookups on hot paths (mmap, submit) use RCU and kref_get_unless_zero.
 * No user memory is touched with either lock held: mmap_lock may be taken
 * by a fault, and the VMA close path (mmap_lock held) drops pool references.
 */
#ifndef HYBPOOL_H
#define HYBPOOL_H

#include <linux/atomic.h>
#include <linux/eventfd.h>
#include <linux/hashtable.h>
#include <linux/kref.h>
#include <linux/list.h>
#include <linux/mm.h>
#include <linux/mutex.h>
#include <linux/rcupdate.h>
#include <linux/rwsem.h>
#include <linux/spinlock.h>
#include <linux/types.h>
#include <linux/uidgid.h>
#include <linux/version.h>
#include <linux/wait.h>
#include <linux/xarray.h>

#include <linux/hybpool.h>

#if BITS_PER_LONG != 64
#error "hybpool needs a 64-bit kernel (mmap offsets carry the pool id above bit 40)"
#endif

/* Pools are built from 2 MiB compound pages: one PMD each on x86-64. */
#define HYB_CHUNK_SHIFT		HYB_PAGE_SHIFT_2M
#define HYB_CHUNK_SIZE		(1UL << HYB_CHUNK_SHIFT)
#define HYB_CHUNK_ORDER		(HYB_CHUNK_SHIFT - PAGE_SHIFT)
#define HYB_CHUNK_PAGES		(1UL << HYB_CHUNK_ORDER)
#define HYB_MAX_POOL_ID		((1U << 20) - 1)

struct hyb_queue;
struct hyb_client;

/* One open file of /dev/hybpool. */
struct hyb_file {
	struct mutex role_lock;		/* serialises the one-time attach */
	int role;			/* HYB_ROLE_*, published with release */
	struct hyb_queue *queue;	/* daemon: the queue it serves */
	struct hyb_client *client;	/* client: its state */
	struct list_head pools;		/* pools it owns, under hyb_lock */
};

enum {
	HYB_ROLE_NONE,
	HYB_ROLE_DAEMON,
	HYB_ROLE_CLIENT,
};

struct hyb_pool {
	struct kref ref;	/* table (until destroyed) + one per VMA */
	struct rcu_head rcu;
	u32 id;
	int node;		/* changes under chunks_sem (write); READ_ONCE */
	char name[HYB_NAME_LEN];
	u64 bytes;
	unsigned long nr_chunks;
	struct page **chunks;	/* compound pages of HYB_CHUNK_ORDER; chunks_sem */
	struct rw_semaphore chunks_sem;
	struct mutex migrate_lock;
	bool ready;		/* allocated and visible; published with release */
	bool destroyed;		/* out of the table; under hyb_lock */
	struct hyb_file *owner;	/* NULL once destroyed; written under hyb_lock */
	struct list_head owner_node;
	struct pid *owner_pid;	/* reported as the reader's namespace numbers it (pid_vnr) */
	kuid_t owner_uid;	/* creator's euid: who may ask for a LOAD into it */
	u64 create_ns;
	atomic_t mappers;
	atomic64_t faults;
	atomic64_t reloads;
};

/* Log-linear latency histogram: 8 buckets per power of two, in ns. */
#define HYB_HIST_SUB_BITS	3
#define HYB_HIST_MAX_SHIFT	40
#define HYB_HIST_BUCKETS	((HYB_HIST_MAX_SHIFT - HYB_HIST_SUB_BITS + 1) << HYB_HIST_SUB_BITS)

struct hyb_hist {
	u64 count;
	u64 sum;
	u64 min;
	u64 max;
	u64 bucket[HYB_HIST_BUCKETS];
};

void hyb_hist_add(struct hyb_hist *h, u64 ns);
void hyb_hist_summary(const struct hyb_hist *h, struct hyb_hist_stat *out);
u64 hyb_hist_bucket_low(unsigned int idx);

/* main.c */
extern struct mutex hyb_lock;
extern unsigned long hybpool_max_pinned_mb;
extern unsigned int hybpool_max_requests;
extern atomic64_t hyb_pinned_bytes;
extern atomic_t hyb_nr_zombies;
extern atomic_t hyb_nr_reqs;
extern atomic_t hyb_nr_queues_alive;	/* queue objects, dead ones included */
u64 hyb_cap_bytes(void);
/* The one address_space every open file maps through (so one call unmaps a pool everywhere). */
extern struct address_space *hyb_mapping;

/* pool.c */
extern struct xarray hyb_pools;
int hyb_pool_ioctl_create(struct hyb_file *hf, struct file *file, struct hyb_pool_create *a);
u64 hyb_pinned_now(void);
int hyb_pool_ioctl_destroy(struct hyb_file *hf, struct hyb_pool_ref *a);
int hyb_pool_ioctl_info(struct hyb_file *hf, struct hyb_pool_info *a);
int hyb_pool_ioctl_list(struct hyb_pool_list *a);
int hyb_pool_ioctl_migrate(struct hyb_file *hf, struct hyb_pool_migrate *a);
void hyb_pool_release_owned(struct hyb_file *hf);
int hyb_pool_check_range(u32 id, u64 off, u64 len, bool count);
bool hyb_pool_writable_by(u32 id, kuid_t uid);
void hyb_pool_destroy_own(struct hyb_file *hf, u32 id);
void hyb_linger_exit(void);
u32 hyb_pool_count(void);
int hyb_mmap(struct file *file, struct vm_area_struct *vma);
unsigned long hyb_get_unmapped_area(struct file *file, unsigned long addr, unsigned long len,
				    unsigned long pgoff, unsigned long flags);

/* queue.c */
int hyb_queue_init(void);
void hyb_queue_exit(void);
int hyb_queue_ioctl_attach(struct hyb_file *hf, struct hyb_attach *a);
int hyb_client_ioctl_attach(struct hyb_file *hf, struct file *file, struct hyb_attach *a);
int hyb_queue_ioctl_submit(struct hyb_file *hf, struct hyb_batch *b);
int hyb_queue_ioctl_fetch(struct hyb_file *hf, struct hyb_batch *b, u32 __user *ucount);
int hyb_queue_ioctl_complete(struct hyb_file *hf, struct hyb_batch *b);
int hyb_queue_ioctl_reap(struct hyb_file *hf, struct hyb_batch *b, u32 __user *ucount);
int hyb_queue_ioctl_stats(struct hyb_queue_stats *s);
u32 hyb_queue_count(void);
void hyb_file_detach(struct hyb_file *hf);

/* debugfs.c */
void hyb_debugfs_init(void);
void hyb_debugfs_exit(void);
struct seq_file;
void hyb_queue_debugfs_show(struct seq_file *m);

/* Kernel API differences across the versions hybpool is built for. */
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 3, 0)
#define hyb_vm_flags_set(vma, f)	vm_flags_set(vma, f)
#define hyb_vm_flags_clear(vma, f)	vm_flags_clear(vma, f)
#else
#define hyb_vm_flags_set(vma, f)	((vma)->vm_flags |= (f))
#define hyb_vm_flags_clear(vma, f)	((vma)->vm_flags &= ~(f))
#endif

#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 8, 0)
#define hyb_eventfd_signal(ctx)		eventfd_signal(ctx)
#else
#define hyb_eventfd_signal(ctx)		eventfd_signal(ctx, 1)
#endif

/* The lock a fault came in with: mmap_lock, or (6.7+, read faults) the VMA's own. */
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 7, 0)
#define hyb_release_fault_lock(vmf)	release_fault_lock(vmf)
#else
#define hyb_release_fault_lock(vmf)	mmap_read_unlock((vmf)->vma->vm_mm)
#endif

#endif /* HYBPOOL_H */
