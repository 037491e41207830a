// SPDX-License-Identifier: GPL-2.0
/*
 * /sys/kernel/debug/hybpool/{pools,queues}: the same statistics the ioctls
 * give, readable with cat, plus the raw histogram buckets.
 */
#include <linux/debugfs.h>
#include <linux/seq_file.h>

#include "hybpool.h"

static struct dentry *hyb_debugfs_dir;

static int pools_show(struct seq_file *m, void *unused)
{
	struct hyb_pool *pool;
	unsigned long idx;

	seq_printf(m, "pinned_bytes %lld cap_bytes %llu zombies %d\n",
		   (long long)atomic64_read(&hyb_pinned_bytes),
		   hyb_cap_bytes(), atomic_read(&hyb_nr_zombies));
	rcu_read_lock();
	xa_for_each(&hyb_pools, idx, pool) {
		if (!smp_load_acquire(&pool->ready))
			continue;
		seq_printf(m, "pool %u name %s node %d bytes %llu mappers %d faults %lld reloads %lld owner %d create_ns %llu\n",
			   pool->id, pool->name, READ_ONCE(pool->node), pool->bytes,
			   atomic_read(&pool->mappers), (long long)atomic64_read(&pool->faults),
			   (long long)atomic64_read(&pool->reloads), pid_vnr(pool->owner_pid),
			   pool->create_ns);
	}
	rcu_read_unlock();
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(pools);

static int queues_show(struct seq_file *m, void *unused)
{
	seq_printf(m, "requests %d max_requests %u\n", atomic_read(&hyb_nr_reqs),
		   READ_ONCE(hybpool_max_requests));
	hyb_queue_debugfs_show(m);
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(queues);

void hyb_debugfs_init(void)
{
	/* Optional: without debugfs the ioctls still give everything. */
	hyb_debugfs_dir = debugfs_create_dir("hybpool", NULL);
	debugfs_create_file("pools", 0440, hyb_debugfs_dir, NULL, &pools_fops);
	debugfs_create_file("queues", 0440, hyb_debugfs_dir, NULL, &queues_fops);
}

void hyb_debugfs_exit(void)
{
	debugfs_remove_recursive(hyb_debugfs_dir);
}
