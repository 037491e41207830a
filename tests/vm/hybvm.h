/* SPDX-License-Identifier: MIT */
/*
 * Helpers shared by the programs that run inside the VM bench (hybtest,
 * hybfuzz): thin ioctl wrappers that return 0 or -errno, and the reporting
 * convention the harness parses ("HYBVM ..." lines on the serial console).
 */
#ifndef HYB_TESTS_VM_H
#define HYB_TESTS_VM_H

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include <linux/hybpool.h>

static inline int hyb_ioctl(int fd, unsigned long cmd, void *arg)
{
	return ioctl(fd, cmd, arg) < 0 ? -errno : 0;
}

static inline int hyb_open(int flags)
{
	int fd = open(HYB_DEVICE_PATH, flags | O_CLOEXEC);

	return fd < 0 ? -errno : fd;
}

static inline int hyb_dev_info(int fd, struct hyb_dev_info *di)
{
	memset(di, 0, sizeof(*di));
	di->size = sizeof(*di);
	return hyb_ioctl(fd, HYB_IOC_DEV_INFO, di);
}

static inline int hyb_pool_create(int fd, const char *name, uint64_t bytes, int node,
				  struct hyb_pool_create *pc)
{
	memset(pc, 0, sizeof(*pc));
	pc->size = sizeof(*pc);
	snprintf(pc->name, sizeof(pc->name), "%s", name);
	pc->bytes = bytes;
	pc->node = node;
	pc->page_shift = HYB_PAGE_SHIFT_2M;
	return hyb_ioctl(fd, HYB_IOC_POOL_CREATE, pc);
}

static inline int hyb_pool_destroy(int fd, uint32_t id)
{
	struct hyb_pool_ref r = { .size = sizeof(r), .pool_id = id };

	return hyb_ioctl(fd, HYB_IOC_POOL_DESTROY, &r);
}

static inline int hyb_pool_info(int fd, uint32_t id, struct hyb_pool_info *pi)
{
	memset(pi, 0, sizeof(*pi));
	pi->size = sizeof(*pi);
	pi->pool_id = id;
	return hyb_ioctl(fd, HYB_IOC_POOL_INFO, pi);
}

static inline int hyb_pool_migrate(int fd, uint32_t id, int node, uint64_t *blocked_ns)
{
	struct hyb_pool_migrate m = { .size = sizeof(m), .pool_id = id, .node = node };
	int ret = hyb_ioctl(fd, HYB_IOC_POOL_MIGRATE, &m);

	if (blocked_ns)
		*blocked_ns = ret ? 0 : m.blocked_ns;
	return ret;
}

static inline int hyb_attach(int fd, unsigned long cmd, uint32_t qid, int efd)
{
	struct hyb_attach a = { .size = sizeof(a), .queue_id = qid, .eventfd = efd };

	return hyb_ioctl(fd, cmd, &a);
}

static inline int hyb_batch(int fd, unsigned long cmd, void *ptr, uint32_t count,
			    uint32_t entry_size, uint32_t flags, uint32_t min_count,
			    uint64_t timeout_ns, uint32_t *done)
{
	struct hyb_batch b = {
		.size = sizeof(b), .flags = flags, .count = count, .entry_size = entry_size,
		.min_count = min_count, .timeout_ns = timeout_ns, .ptr = (uintptr_t)ptr,
	};
	int ret = hyb_ioctl(fd, cmd, &b);

	if (done)
		*done = ret ? 0 : b.count;
	return ret;
}

static inline int hyb_submit(int fd, struct hyb_req *r, uint32_t n)
{
	return hyb_batch(fd, HYB_IOC_SUBMIT, r, n, sizeof(*r), 0, 0, 0, NULL);
}

static inline int hyb_fetch(int fd, struct hyb_req *r, uint32_t n, uint32_t *got)
{
	return hyb_batch(fd, HYB_IOC_FETCH, r, n, sizeof(*r), 0, 0, 0, got);
}

static inline int hyb_complete(int fd, struct hyb_done *d, uint32_t n)
{
	return hyb_batch(fd, HYB_IOC_COMPLETE, d, n, sizeof(*d), 0, 0, 0, NULL);
}

static inline int hyb_reap(int fd, struct hyb_cqe *c, uint32_t n, int wait, uint32_t min,
			   uint64_t timeout_ns, uint32_t *got)
{
	return hyb_batch(fd, HYB_IOC_REAP, c, n, sizeof(*c), wait ? HYB_REAP_WAIT : 0,
			 wait ? min : 0, wait ? timeout_ns : 0, got);
}

static inline int hyb_queue_stats(int fd, uint32_t qid, struct hyb_queue_stats *s)
{
	memset(s, 0, sizeof(*s));
	s->size = sizeof(*s);
	s->queue_id = qid;
	return hyb_ioctl(fd, HYB_IOC_QUEUE_STATS, s);
}

static inline double hyb_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/*
 * Free memory, bytes: MemFree plus the pages parked on the per-CPU free lists
 * (/proc/zoneinfo "count:"), which MemFree leaves out and which can hold
 * freshly freed 2 MiB pages.
 */
static inline long long hyb_memfree(void)
{
	char line[256];
	long long kb = -1, pages = 0, v;
	FILE *f = fopen("/proc/meminfo", "r");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "MemFree: %lld kB", &kb) == 1)
			break;
	fclose(f);
	f = fopen("/proc/zoneinfo", "r");
	if (f) {
		while (fgets(line, sizeof(line), f))
			if (sscanf(line, " count: %lld", &v) == 1)
				pages += v;
		fclose(f);
	}
	return kb * 1024 + pages * 4096;
}

#endif
