// SPDX-License-Identifier: GPL-2.0
/*
 * hybpool: the /dev/hybpool misc device of hyb's box mode.
 *
 * Pinned huge-page neuron pools on chosen NUMA nodes that any number of
 * inference processes map (read-only) next to the daemon that fills them
 * (read-write), and an eventfd-driven reload queue between those processes
 * and the daemon, with statistics on how long apps stall waiting for it.
 *
 * This file: module parameters, the device, and the ioctl front end that
 * turns every call into a validated kernel copy of its argument before any
 * handler sees it.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/capability.h>
#include <linux/compat.h>
#include <linux/fs.h>
#include <linux/fs_context.h>
#include <linux/mount.h>
#include <linux/pseudo_fs.h>
#include <linux/miscdevice.h>
#include <linux/module.h>
#include <linux/nospec.h>
#include <linux/pagemap.h>
#include <linux/sched.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include "hybpool.h"

/* What the module needs of the kernel's configuration: a clear refusal, not a broken build. */
#if !IS_ENABLED(CONFIG_64BIT)
#error "hybpool needs a 64-bit kernel (CONFIG_64BIT): pool offsets and sizes are 64-bit"
#endif
#if !IS_ENABLED(CONFIG_TRANSPARENT_HUGEPAGE)
#error "hybpool needs CONFIG_TRANSPARENT_HUGEPAGE: its pools are mapped in 2 MiB pages"
#endif
#if !IS_ENABLED(CONFIG_EVENTFD)
#error "hybpool needs CONFIG_EVENTFD: the reload queue signals through eventfds"
#endif

unsigned long hybpool_max_pinned_mb;
module_param_named(max_pinned_mb, hybpool_max_pinned_mb, ulong, 0644);
MODULE_PARM_DESC(max_pinned_mb,
		 "cap on memory pinned by all pools, MiB (0 at load: half of RAM)");

/* 1..HYB_MAX_REQUESTS_CAP: 0 would refuse every request, more could exhaust memory */
#define HYB_MAX_REQUESTS_CAP	(1u << 22)
unsigned int hybpool_max_requests = 65536;

static int hyb_set_max_requests(const char *val, const struct kernel_param *kp)
{
	unsigned int v;
	int ret = kstrtouint(val, 0, &v);

	if (ret)
		return ret;
	if (v < 1 || v > HYB_MAX_REQUESTS_CAP)
		return -EINVAL;
	WRITE_ONCE(*(unsigned int *)kp->arg, v);
	return 0;
}

static const struct kernel_param_ops hyb_max_requests_ops = {
	.set = hyb_set_max_requests,
	.get = param_get_uint,
};
module_param_cb(max_requests, &hyb_max_requests_ops, &hybpool_max_requests, 0644);
MODULE_PARM_DESC(max_requests, "cap on reload requests alive in the kernel, all queues "
		 "(1..4194304)");

DEFINE_MUTEX(hyb_lock);
atomic64_t hyb_pinned_bytes = ATOMIC64_INIT(0);
atomic_t hyb_nr_zombies = ATOMIC_INIT(0);
atomic_t hyb_nr_reqs = ATOMIC_INIT(0);
atomic_t hyb_nr_queues_alive = ATOMIC_INIT(0);

/*
 * Pool mappings hang off one address_space of an inode private to the module
 * instead of the device node's own: every /dev/hybpool node (devtmpfs, a
 * container's mknod) is a different inode, and a migration must find every
 * mapping of a pool with one unmap_mapping_range() call.
 */
#define HYB_FS_MAGIC	0x68796270	/* "hybp" */
static struct vfsmount *hyb_mnt;
static struct inode *hyb_inode;
struct address_space *hyb_mapping;

static int hyb_fs_init_fs_context(struct fs_context *fc)
{
	return init_pseudo(fc, HYB_FS_MAGIC) ? 0 : -ENOMEM;
}

/* No .owner: the module's own kern_mount must not pin it against rmmod. */
static struct file_system_type hyb_fs_type = {
	.name = "hybpool",
	.init_fs_context = hyb_fs_init_fs_context,
	.kill_sb = kill_anon_super,
};

static int hyb_fs_init(void)
{
	hyb_mnt = kern_mount(&hyb_fs_type);
	if (IS_ERR(hyb_mnt))
		return PTR_ERR(hyb_mnt);
	hyb_inode = alloc_anon_inode(hyb_mnt->mnt_sb);
	if (IS_ERR(hyb_inode)) {
		kern_unmount(hyb_mnt);
		return PTR_ERR(hyb_inode);
	}
	hyb_mapping = hyb_inode->i_mapping;
	/*
	 * Nothing is ever allocated through this address space (faults hand
	 * out the pools' own pages), so its gfp mask only tells the core what
	 * the mappings are: vma_migratable() calls a file mapping whose
	 * memory comes from below policy_zone unmigratable, and automatic NUMA
	 * balancing (task_numa_work) and mbind(MPOL_MF_MOVE) then skip pool
	 * mappings instead of making their PTEs PROT_NONE for hinting faults
	 * that end in a migration that cannot happen (pool pages are on no
	 * LRU). VM_IO/VM_PFNMAP would do it too, but also stop get_user_pages().
	 */
	mapping_set_gfp_mask(hyb_mapping, IS_ENABLED(CONFIG_ZONE_DMA) ? GFP_DMA : GFP_DMA32);
	return 0;
}

static void hyb_fs_exit(void)
{
	iput(hyb_inode);
	kern_unmount(hyb_mnt);
}

/* The cap in bytes; a huge hybpool_max_pinned_mb saturates instead of wrapping. */
u64 hyb_cap_bytes(void)
{
	unsigned long mb = READ_ONCE(hybpool_max_pinned_mb);

	return mb > (U64_MAX >> 20) ? U64_MAX : (u64)mb << 20;
}

/*
 * 32-bit processes are refused, clearly and at once: mmap2() carries a
 * 32-bit page offset, which reaches only pools 1..15 of the id << 40
 * offsets, and pools of many GiB do not fit a 32-bit address space anyway.
 */
static int hyb_compat_refused(void)
{
	if (!in_compat_syscall())
		return 0;
	pr_notice_ratelimited("%s[%d]: 32-bit processes cannot use /dev/hybpool\n",
			      current->comm, task_pid_nr(current));
	return -EOPNOTSUPP;
}

static int hyb_open(struct inode *inode, struct file *file)
{
	struct hyb_file *hf;
	int ret = hyb_compat_refused();

	if (ret)
		return ret;

	hf = kzalloc(sizeof(*hf), GFP_KERNEL);
	if (!hf)
		return -ENOMEM;
	mutex_init(&hf->role_lock);
	INIT_LIST_HEAD(&hf->pools);
	file->private_data = hf;
	file->f_mapping = hyb_mapping;
	return nonseekable_open(inode, file);
}

static int hyb_release(struct inode *inode, struct file *file)
{
	struct hyb_file *hf = file->private_data;

	/* A daemon that closes or dies fails what it still holds first. */
	hyb_file_detach(hf);
	hyb_pool_release_owned(hf);
	mutex_destroy(&hf->role_lock);
	kfree(hf);
	return 0;
}

static int hyb_ioc_dev_info(struct hyb_file *hf, struct file *file, void *arg,
			void __user *uarg)
{
	struct hyb_dev_info *a = arg;

	if (a->flags || a->reserved)
		return -EINVAL;
	a->abi_version = HYB_ABI_VERSION;
	a->nr_pools = hyb_pool_count();
	a->nr_zombies = atomic_read(&hyb_nr_zombies);
	a->nr_queues = hyb_queue_count();
	a->pinned_bytes = hyb_pinned_now();
	a->pinned_cap = hyb_cap_bytes();
	a->nr_requests = atomic_read(&hyb_nr_reqs);
	a->page_shifts = 1U << HYB_PAGE_SHIFT_2M;
	return 0;
}

static int hyb_ioc_pool_create(struct hyb_file *hf, struct file *file, void *arg,
			void __user *uarg)
{
	struct hyb_pool_create *a = arg;
	int ret = hyb_pool_ioctl_create(hf, file, a);

	if (ret)
		return ret;
	/* A pool its creator cannot learn of goes again (the caller unmapped the struct). */
	if (copy_to_user(uarg, a, sizeof(*a))) {
		hyb_pool_destroy_own(hf, a->pool_id);
		return -EFAULT;
	}
	return 0;
}

static int hyb_ioc_pool_destroy(struct hyb_file *hf, struct file *file, void *arg,
			void __user *uarg)
{
	return hyb_pool_ioctl_destroy(hf, arg);
}

static int hyb_ioc_pool_info(struct hyb_file *hf, struct file *file, void *arg,
			void __user *uarg)
{
	return hyb_pool_ioctl_info(hf, arg);
}

static int hyb_ioc_pool_list(struct hyb_file *hf, struct file *file, void *arg,
			void __user *uarg)
{
	return hyb_pool_ioctl_list(arg);
}

static int hyb_ioc_pool_migrate(struct hyb_file *hf, struct file *file, void *arg,
			void __user *uarg)
{
	return hyb_pool_ioctl_migrate(hf, arg);
}

static int hyb_ioc_queue_attach(struct hyb_file *hf, struct file *file, void *arg,
			void __user *uarg)
{
	if (!(file->f_mode & FMODE_WRITE))
		return -EBADF;
	return hyb_queue_ioctl_attach(hf, arg);
}

static int hyb_ioc_client_attach(struct hyb_file *hf, struct file *file, void *arg,
			void __user *uarg)
{
	return hyb_client_ioctl_attach(hf, file, arg);
}

static int hyb_ioc_submit(struct hyb_file *hf, struct file *file, void *arg,
			void __user *uarg)
{
	return hyb_queue_ioctl_submit(hf, arg);
}

static int hyb_ioc_fetch(struct hyb_file *hf, struct file *file, void *arg,
			void __user *uarg)
{
	return hyb_queue_ioctl_fetch(hf, arg, &((struct hyb_batch __user *)uarg)->count);
}

static int hyb_ioc_complete(struct hyb_file *hf, struct file *file, void *arg,
			void __user *uarg)
{
	return hyb_queue_ioctl_complete(hf, arg);
}

static int hyb_ioc_reap(struct hyb_file *hf, struct file *file, void *arg,
			void __user *uarg)
{
	return hyb_queue_ioctl_reap(hf, arg, &((struct hyb_batch __user *)uarg)->count);
}

static int hyb_ioc_queue_stats(struct hyb_file *hf, struct file *file, void *arg,
			void __user *uarg)
{
	return hyb_queue_ioctl_stats(arg);
}

struct hyb_ioctl_desc {
	unsigned int cmd;
	unsigned int ksize;
	int (*fn)(struct hyb_file *hf, struct file *file, void *arg, void __user *uarg);
	bool self_copy;		/* the handler writes its results back itself */
};

#define HYB_IOCTL(c, type, f) [_IOC_NR(c)] = { .cmd = (c), .ksize = sizeof(type), .fn = (f) }
#define HYB_IOCTL_SELF(c, type, f) \
	[_IOC_NR(c)] = { .cmd = (c), .ksize = sizeof(type), .fn = (f), .self_copy = true }

static const struct hyb_ioctl_desc hyb_ioctls[] = {
	HYB_IOCTL(HYB_IOC_DEV_INFO, struct hyb_dev_info, hyb_ioc_dev_info),
	HYB_IOCTL_SELF(HYB_IOC_POOL_CREATE, struct hyb_pool_create, hyb_ioc_pool_create),
	HYB_IOCTL(HYB_IOC_POOL_DESTROY, struct hyb_pool_ref, hyb_ioc_pool_destroy),
	HYB_IOCTL(HYB_IOC_POOL_INFO, struct hyb_pool_info, hyb_ioc_pool_info),
	HYB_IOCTL(HYB_IOC_POOL_LIST, struct hyb_pool_list, hyb_ioc_pool_list),
	HYB_IOCTL(HYB_IOC_POOL_MIGRATE, struct hyb_pool_migrate, hyb_ioc_pool_migrate),
	HYB_IOCTL(HYB_IOC_QUEUE_ATTACH, struct hyb_attach, hyb_ioc_queue_attach),
	HYB_IOCTL(HYB_IOC_CLIENT_ATTACH, struct hyb_attach, hyb_ioc_client_attach),
	HYB_IOCTL(HYB_IOC_SUBMIT, struct hyb_batch, hyb_ioc_submit),
	HYB_IOCTL_SELF(HYB_IOC_FETCH, struct hyb_batch, hyb_ioc_fetch),
	HYB_IOCTL(HYB_IOC_COMPLETE, struct hyb_batch, hyb_ioc_complete),
	HYB_IOCTL_SELF(HYB_IOC_REAP, struct hyb_batch, hyb_ioc_reap),
	HYB_IOCTL(HYB_IOC_QUEUE_STATS, struct hyb_queue_stats, hyb_ioc_queue_stats),
};

/* Every argument of every call, as the kernel copy the handlers work on. */
union hyb_args {
	struct hyb_dev_info dev_info;
	struct hyb_pool_create pool_create;
	struct hyb_pool_ref pool_ref;
	struct hyb_pool_info pool_info;
	struct hyb_pool_list pool_list;
	struct hyb_pool_migrate pool_migrate;
	struct hyb_attach attach;
	struct hyb_batch batch;
	struct hyb_queue_stats queue_stats;
};

/*
 * The size in the ioctl number must cover this module's struct, and the
 * struct's own size field must say the same: a newer userspace may pass a
 * longer struct whose extra bytes are zero (copy_struct_from_user checks).
 * Results are copied back only when the call succeeds, into a struct that
 * was seen writable before the call.
 */
static long hyb_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	struct hyb_file *hf = file->private_data;
	void __user *uarg = (void __user *)arg;
	const struct hyb_ioctl_desc *d;
	union hyb_args k;
	unsigned int nr = _IOC_NR(cmd);
	u32 usize, field;
	int ret;

	if (_IOC_TYPE(cmd) != HYB_IOC_MAGIC || nr >= ARRAY_SIZE(hyb_ioctls))
		return -ENOTTY;
	nr = array_index_nospec(nr, ARRAY_SIZE(hyb_ioctls));
	d = &hyb_ioctls[nr];
	if (!d->fn || _IOC_DIR(cmd) != _IOC_DIR(d->cmd))
		return -ENOTTY;
	usize = _IOC_SIZE(cmd);
	if (usize < d->ksize)
		return -EINVAL;
	if (get_user(field, (u32 __user *)uarg))
		return -EFAULT;
	if (field != usize)
		return -EINVAL;
	ret = copy_struct_from_user(&k, d->ksize, uarg, usize);
	if (ret)
		return ret;
	/*
	 * Results copied back after the call changed state (a pool made,
	 * requests fetched or reaped) would be lost if the copy failed: the
	 * struct must take the write first (the same bytes). Only a caller that
	 * unmaps or write-protects it during the call is caught by the
	 * handlers that change state (self_copy): they write their results
	 * back before the change is final and undo it if they cannot.
	 */
	if ((_IOC_DIR(d->cmd) & _IOC_READ) && copy_to_user(uarg, &k, d->ksize))
		return -EFAULT;
	ret = d->fn(hf, file, &k, uarg);
	if (ret || d->self_copy)
		return ret;
	if ((_IOC_DIR(d->cmd) & _IOC_READ) && copy_to_user(uarg, &k, d->ksize))
		return -EFAULT;
	return 0;
}

/* A file a 64-bit process passed to a 32-bit one: refused the same way. */
static long hyb_compat_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	return hyb_compat_refused();
}

static int hyb_mmap_checked(struct file *file, struct vm_area_struct *vma)
{
	return hyb_compat_refused() ?: hyb_mmap(file, vma);
}

static const struct file_operations hyb_fops = {
	.owner = THIS_MODULE,
	.open = hyb_open,
	.release = hyb_release,
	.unlocked_ioctl = hyb_ioctl,
	.compat_ioctl = hyb_compat_ioctl,
	.mmap = hyb_mmap_checked,
	.get_unmapped_area = hyb_get_unmapped_area,
	/* no .llseek: lseek fails with -ESPIPE (no_llseek's job before 6.12 removed it) */
};

/*
 * 0660: the group is set by userspace (udev rule kmod/60-hybpool.rules, or
 * the VM bench's init); devtmpfs creates the node root:root.
 */
static struct miscdevice hyb_misc = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "hybpool",
	.fops = &hyb_fops,
	.mode = 0660,
};

static int __init hyb_init(void)
{
	int ret;

	if (!hybpool_max_pinned_mb)
		hybpool_max_pinned_mb = (totalram_pages() >> (20 - PAGE_SHIFT)) / 2;
	ret = hyb_fs_init();
	if (ret)
		return ret;
	ret = hyb_queue_init();
	if (ret) {
		hyb_fs_exit();
		return ret;
	}
	ret = misc_register(&hyb_misc);
	if (ret) {
		hyb_queue_exit();
		hyb_fs_exit();
		return ret;
	}
	hyb_debugfs_init();
	pr_info("ready: /dev/hybpool, cap %lu MiB, abi %d\n", hybpool_max_pinned_mb, HYB_ABI_VERSION);
	return 0;
}

static void __exit hyb_exit(void)
{
	hyb_debugfs_exit();
	misc_deregister(&hyb_misc);
	hyb_linger_exit();
	/*
	 * Open files and mappings hold the module, so everything must be gone
	 * by now; say so loudly if not (the VM bench greps for "leak").
	 */
	if (atomic64_read(&hyb_pinned_bytes) || atomic_read(&hyb_nr_reqs) ||
	    atomic_read(&hyb_nr_queues_alive) || hyb_pool_count())
		pr_err("leak at unload: %lld bytes pinned, %d requests, %d queues, %u pools\n",
		       (long long)atomic64_read(&hyb_pinned_bytes), atomic_read(&hyb_nr_reqs),
		       atomic_read(&hyb_nr_queues_alive), hyb_pool_count());
	hyb_queue_exit();
	hyb_fs_exit();
	rcu_barrier();	/* pool structs are freed with kfree_rcu */
}

module_init(hyb_init);
module_exit(hyb_exit);

MODULE_LICENSE("GPL");
MODULE_AUTHOR("hyb");
MODULE_DESCRIPTION("hyb neuron pools (pinned NUMA huge pages) and reload queue");
