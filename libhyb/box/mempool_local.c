// SPDX-License-Identifier: MIT
/*
 * The local backend's pools (embedded mode: one process, no root, no module).
 *
 * A pool is memory of this process, chosen in this order:
 *   1. reserved huge pages (memfd MFD_HUGETLB) when the node has enough free;
 *   2. shmem (memfd) with transparent huge pages when the kernel allows THP
 *      for shmem (transparent_hugepage/shmem_enabled is not never/deny);
 *   3. anonymous private memory with MADV_HUGEPAGE (THP) - unless the caller
 *      asked for HYB_MEMPOOL_SHARED, then plain shmem (4 KiB pages).
 * memfd pools (1, 2, 4 KiB shmem) are shared: forked children see the same
 * bytes, and read-only views map a read-only file so writes fault exactly as
 * with the module. A private pool (3) gives up both for huge pages where
 * shmem THP is off (the common default); every handle then uses the owner's
 * mapping.
 *
 * Every pool is bound to its node (mbind MPOL_BIND, set before the first
 * touch), pre-faulted with MADV_POPULATE_WRITE (zeroed by the kernel) and
 * mlocked; where RLIMIT_MEMLOCK forbids the lock, a one-line warning says so
 * and the pool works unlocked. A HYB_MEMPOOL_LAZY pool skips the pre-faulting
 * and is locked page by page as it is first written (MLOCK_ONFAULT). Before binding, the node's free memory is
 * checked: a bound allocation past it would wake the OOM killer instead of
 * failing.
 *
 * libnuma (libnuma-dev, -lnuma): numa_available() decides whether NUMA
 * calls are made at all (without it there is one node, 0, and no mbind);
 * numa_max_node() and numa_node_size64() validate nodes; numa_node_of_cpu()
 * resolves HYB_MEMPOOL_NODE_LOCAL; mbind() (numaif.h) binds. Nothing else of
 * libnuma's state is used, so it is safe in static binaries (the VM bench).
 *
 * The pool table is process-wide (every backend handle of the process sees
 * it, as every file of /dev/hybpool sees the module's), under one mutex that
 * is never held while memory is allocated: submit checks pool ranges under
 * it and must not wait behind a big create.
 */
#include <errno.h>
#include <fcntl.h>
#include <numa.h>
#include <numaif.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "mempool_internal.h"

#define HUGE_2M (2ULL << 20)

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#ifndef MFD_HUGE_2MB
#define MFD_HUGE_2MB (21U << 26)
#endif

/* The memory of a pool. */
struct lmem {
	void *base;		/* the owner's mapping, read-write */
	int rw_fd;		/* memfd pools; -1 for private memory */
	int ro_fd;		/* read-only reopening of rw_fd, for other handles */
	uint32_t flags;		/* HYB_MEMPOOL_F_* */
};

struct hyb_lpool {
	struct hyb_lpool *next;		/* table */
	uint32_t id;
	char name[HYB_MEMPOOL_NAME_LEN];
	int node;
	uint64_t bytes;
	struct lmem mem;
	bool ready;			/* allocated; lookups see it */
	bool destroyed;			/* out of the table */
	bool mem_gone;			/* memory released */
	struct hyb_backend *owner;	/* NULL once destroyed */
	pid_t owner_pid;
	uint64_t create_ns;
	unsigned int refs;		/* table + open handles: the struct */
	uint32_t mappers;		/* mappings: with the table, the memory */
	uint64_t reloads;
	struct hyb_mempool *handles;	/* open handles, for move */
};

static pthread_mutex_t lp_lock = PTHREAD_MUTEX_INITIALIZER;
static struct hyb_lpool *lp_table;
static uint32_t lp_next_id;
static unsigned int lp_slots;		/* table entries, creating ones included */
static unsigned int lp_zombies;
static uint64_t lp_pinned;
static uint64_t lp_cap;

/* -- memory --------------------------------------------------------------- */

/* The bracketed word of a sysfs choice file ("always [madvise] never"). */
static void sysfs_choice(const char *path, char *out, size_t len)
{
	char buf[256], *a, *z;
	FILE *f = fopen(path, "r");

	out[0] = 0;
	if (!f)
		return;
	if (fgets(buf, sizeof(buf), f) && (a = strchr(buf, '[')) && (z = strchr(a, ']'))) {
		*z = 0;
		snprintf(out, len, "%s", a + 1);
	}
	fclose(f);
}

static long long sysfs_num(const char *path)
{
	long long v = -1;
	FILE *f = fopen(path, "r");

	if (f) {
		if (fscanf(f, "%lld", &v) != 1)
			v = -1;
		fclose(f);
	}
	return v;
}

static bool thp_anon_possible(void)
{
	char c[32];

	sysfs_choice("/sys/kernel/mm/transparent_hugepage/enabled", c, sizeof(c));
	return !strcmp(c, "always") || !strcmp(c, "madvise");
}

static bool thp_shmem_possible(void)
{
	char c[32];

	sysfs_choice("/sys/kernel/mm/transparent_hugepage/shmem_enabled", c, sizeof(c));
	return !strcmp(c, "always") || !strcmp(c, "within_size") || !strcmp(c, "advise") ||
	       !strcmp(c, "force");
}

/* Free 2 MiB huge pages on node that nobody has reserved. */
static long long hugetlb_free(int node)
{
	char p[160];
	long long free_node, resv;

	snprintf(p, sizeof(p), "/sys/devices/system/node/node%d/hugepages/hugepages-2048kB/"
		 "free_hugepages", node);
	free_node = sysfs_num(p);
	if (free_node < 0 && node == 0)
		free_node = sysfs_num("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages");
	/* Reservations are global: count them all against this node, to be safe. */
	resv = sysfs_num("/sys/kernel/mm/hugepages/hugepages-2048kB/resv_hugepages");
	return free_node - (resv > 0 ? resv : 0);
}

/* Memory the kernel can give on node without the OOM killer: free + file cache. */
static uint64_t node_avail(int node)
{
	char p[96], line[160];
	unsigned long long kb, total = 0;
	FILE *f;

	snprintf(p, sizeof(p), "/sys/devices/system/node/node%d/meminfo", node);
	f = fopen(p, "r");
	if (!f) {
		long long fr = 0;

		if (numa_available() >= 0 && numa_node_size64(node, &fr) > 0)
			return (uint64_t)fr;
		return UINT64_MAX;
	}
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "Node %*d MemFree: %llu kB", &kb) == 1 ||
		    sscanf(line, "Node %*d Active(file): %llu kB", &kb) == 1 ||
		    sscanf(line, "Node %*d Inactive(file): %llu kB", &kb) == 1)
			total += kb;
	}
	fclose(f);
	return (uint64_t)total << 10;
}

static int bind_node(void *addr, uint64_t len, int node)
{
	unsigned long mask[(1024 + 63) / 64];

	if (numa_available() < 0)
		return 0;
	if (node >= 1024)
		return -EINVAL;
	memset(mask, 0, sizeof(mask));
	mask[node / 64] = 1UL << (node % 64);
	if (mbind(addr, len, MPOL_BIND, mask, 1024 + 1, MPOL_MF_STRICT))
		return -errno;
	return 0;
}

struct populate_part {
	pthread_t thread;
	uint8_t *addr;
	uint64_t len;
	int err;
};

static void *populate_part(void *arg)
{
	struct populate_part *p = arg;

	p->err = madvise(p->addr, p->len, MADV_POPULATE_WRITE) ? errno : 0;
	return NULL;
}

/*
 * MADV_POPULATE_WRITE over parts of at least 256 MiB, one thread per CPU (up
 * to 8): the kernel zeroes every page it faults in, one page at a time per
 * thread, so a big pool is made ready at the memory's write bandwidth instead
 * of one core's clear_page rate. Returns 0 or the errno of a failed part.
 */
static int populate_parallel(uint8_t *addr, uint64_t len)
{
	struct populate_part parts[8];
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	uint64_t n = len / (256ull << 20), each;
	int started = 0, err = 0;

	if (n > (uint64_t)(cpus > 0 ? cpus : 1))
		n = (uint64_t)(cpus > 0 ? cpus : 1);
	if (n > 8)
		n = 8;
	if (n < 2)
		return madvise(addr, len, MADV_POPULATE_WRITE) ? errno : 0;
	each = (len / n + HUGE_2M - 1) & ~(HUGE_2M - 1);
	for (uint64_t i = 0; i < n; i++) {
		uint64_t o = i * each;

		parts[i] = (struct populate_part){ .addr = addr + o,
						   .len = o >= len ? 0 : len - o < each ? len - o : each };
		if (i && parts[i].len &&
		    !pthread_create(&parts[i].thread, NULL, populate_part, &parts[i]))
			started |= 1 << i;
		else if (i && parts[i].len)
			populate_part(&parts[i]);	/* no thread: do it here */
	}
	populate_part(&parts[0]);
	for (uint64_t i = 0; i < n; i++) {
		if (started & (1 << i))
			pthread_join(parts[i].thread, NULL);
		if (!err)
			err = parts[i].err;
	}
	return err;
}

/* Fault every page in, writing (zeroed by the kernel). */
static int populate(void *addr, uint64_t len, bool may_touch)
{
	volatile char *c = addr;
	uint64_t off;
	int err = populate_parallel(addr, len);

	if (!err)
		return 0;
	errno = err;
	if (errno != EINVAL || !may_touch)
		return -errno;
	/* Kernels before 5.14: touch every page (hugetlb never gets here). */
	for (off = 0; off < len; off += 4096)
		c[off] = 0;
	return 0;
}

/*
 * Mappings start on a 2 MiB boundary, whatever backs them: THP then maps
 * PMDs from the first byte, and a pool moved to huge pages can be mapped
 * MAP_FIXED at the addresses its views already have. fd < 0: private
 * anonymous memory. The range is reserved first, then mapped over.
 */
static void *map_aligned(int fd, uint64_t len, int prot, int flags)
{
	uint8_t *raw, *al, *m;
	uintptr_t a;

	raw = mmap(NULL, len + HUGE_2M, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
		   -1, 0);
	if (raw == MAP_FAILED)
		return NULL;
	a = ((uintptr_t)raw + HUGE_2M - 1) & ~(uintptr_t)(HUGE_2M - 1);
	al = (uint8_t *)a;
	if (fd < 0)
		m = mmap(al, len, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | flags, -1, 0);
	else
		m = mmap(al, len, prot, MAP_SHARED | MAP_FIXED | flags, fd, 0);
	if (m == MAP_FAILED) {
		int err = errno;

		munmap(raw, len + HUGE_2M);
		errno = err;
		return NULL;
	}
	if (al > raw)
		munmap(raw, (size_t)(al - raw));
	if (al + len < raw + len + HUGE_2M)
		munmap(al + len, (size_t)(raw + len + HUGE_2M - (al + len)));
	return al;
}

static void lmem_free(struct lmem *m, uint64_t len)
{
	if (m->base)
		munmap(m->base, len);
	if (m->ro_fd >= 0)
		close(m->ro_fd);
	if (m->rw_fd >= 0)
		close(m->rw_fd);
	m->base = NULL;
	m->rw_fd = m->ro_fd = -1;
}

/* A read-only file for the same memory: mappings of it can never be written. */
static int reopen_ro(int fd)
{
	char p[64];

	snprintf(p, sizeof(p), "/proc/self/fd/%d", fd);
	return open(p, O_RDONLY | O_CLOEXEC);
}

static int memfd_map(struct lmem *m, const char *name, uint64_t len, unsigned int mfd_flags)
{
	char nm[64];

	snprintf(nm, sizeof(nm), "hybpool:%s", name);
	m->rw_fd = memfd_create(nm, MFD_CLOEXEC | mfd_flags);
	if (m->rw_fd < 0)
		return -errno;
	if (ftruncate(m->rw_fd, (off_t)len))
		return -errno;
	m->base = map_aligned(m->rw_fd, len, PROT_READ | PROT_WRITE, 0);
	if (!m->base)
		return -errno;
	m->ro_fd = reopen_ro(m->rw_fd);
	if (m->ro_fd < 0)
		return -errno;
	m->flags |= HYB_MEMPOOL_F_SHARED;
	return 0;
}

/* One attempt at one kind of memory; on failure m is released. */
static int lmem_try(struct lmem *m, const char *name, uint64_t len, int node, int kind,
		    bool lazy)
{
	int ret;

	memset(m, 0, sizeof(*m));
	m->rw_fd = m->ro_fd = -1;
	switch (kind) {
	case 1:
		m->flags = HYB_MEMPOOL_F_HUGETLB | HYB_MEMPOOL_F_LOCKED;
		ret = memfd_map(m, name, len, MFD_HUGETLB | MFD_HUGE_2MB);
		break;
	case 2:
		m->flags = HYB_MEMPOOL_F_THP;
		ret = memfd_map(m, name, len, 0);
		if (!ret && madvise(m->base, len, MADV_HUGEPAGE))
			ret = -errno;
		break;
	case 3:
		m->flags = thp_anon_possible() ? HYB_MEMPOOL_F_THP : 0;
		m->base = map_aligned(-1, len, PROT_READ | PROT_WRITE, 0);
		ret = m->base ? 0 : -errno;
		if (!ret && m->flags && madvise(m->base, len, MADV_HUGEPAGE))
			ret = -errno;
		break;
	default:
		m->flags = 0;
		ret = memfd_map(m, name, len, 0);
		break;
	}
	if (!ret)
		ret = bind_node(m->base, len, node);
	if (!ret && !lazy)
		ret = populate(m->base, len, kind != 1);
	if (ret)
		lmem_free(m, len);
	return ret;
}

/* Lock the pool in memory; a refusal is a warning, not a failure. */
static void lmem_lock(struct lmem *m, const char *name, uint64_t len, bool lazy)
{
	struct rlimit rl;
	int err;

	if (m->flags & HYB_MEMPOOL_F_HUGETLB)
		return;	/* never swapped; mlock skips hugetlb */
	/* lazy: lock each page as it is first written, not all now (which faults them in) */
	if (!mlock2(m->base, len, lazy ? MLOCK_ONFAULT : 0)) {
		m->flags |= HYB_MEMPOOL_F_LOCKED;
		return;
	}
	err = errno;
	if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
		fprintf(stderr, "hyb: pool '%s': mlock of %llu MiB refused (%s, RLIMIT_MEMLOCK "
			"%llu KiB): it may be swapped; raise 'ulimit -l' or grant CAP_IPC_LOCK\n",
			name, (unsigned long long)(len >> 20), strerror(err),
			(unsigned long long)(rl.rlim_cur >> 10));
	else
		fprintf(stderr, "hyb: pool '%s': mlock of %llu MiB refused (%s): it may be "
			"swapped\n", name, (unsigned long long)(len >> 20), strerror(err));
}

static int lmem_alloc(struct lmem *m, const char *name, uint64_t len, int node, bool shared,
		      bool lazy)
{
	int ret;

	if (hugetlb_free(node) >= (long long)(len / HUGE_2M) &&
	    !lmem_try(m, name, len, node, 1, lazy))
		goto locked;
	if (len > node_avail(node))
		return hyb_mp_err(-ENOMEM, "create pool '%s': node %d has %llu MiB free, not "
				  "%llu MiB", name, node,
				  (unsigned long long)(node_avail(node) >> 20),
				  (unsigned long long)(len >> 20));
	if (thp_shmem_possible() && !lmem_try(m, name, len, node, 2, lazy))
		goto locked;
	ret = lmem_try(m, name, len, node, shared ? 4 : 3, lazy);
	if (ret)
		return hyb_mp_err(ret, "create pool '%s': %llu MiB on node %d: %s", name,
				  (unsigned long long)(len >> 20), node, strerror(-ret));
locked:
	lmem_lock(m, name, len, lazy);
	return 0;
}

/* -- table --------------------------------------------------------------- */

static struct hyb_lpool *lp_find(const char *name, uint32_t id)
{
	struct hyb_lpool *lp;

	for (lp = lp_table; lp; lp = lp->next) {
		if (!lp->ready)
			continue;
		if (name ? !strcmp(lp->name, name) : lp->id == id)
			return lp;
	}
	return NULL;
}

static bool lp_id_used(uint32_t id)
{
	struct hyb_lpool *lp;

	for (lp = lp_table; lp && lp->id != id; lp = lp->next)
		;
	return lp != NULL;
}

static void lp_unlink(struct hyb_lpool *lp)
{
	struct hyb_lpool **pp;

	for (pp = &lp_table; *pp; pp = &(*pp)->next) {
		if (*pp == lp) {
			*pp = lp->next;
			lp_slots--;
			return;
		}
	}
}

/* Under lp_lock: release the memory once destroyed and unmapped, the struct once unused. */
static void lp_settle(struct hyb_lpool *lp)
{
	if (lp->destroyed && !lp->mappers && !lp->mem_gone) {
		lmem_free(&lp->mem, lp->bytes);
		lp->mem_gone = true;
		lp_pinned -= lp->bytes;
		lp_zombies--;
	}
	if (!lp->refs)
		free(lp);
}

/* Under lp_lock: out of the table (destroy, or the owner handle closed). */
static void lp_destroy_locked(struct hyb_lpool *lp)
{
	lp_unlink(lp);
	lp->destroyed = true;
	lp->owner = NULL;
	lp_zombies++;
	lp->refs--;
	lp_settle(lp);
}

int hyb_mempool_local_check_range(uint32_t id, uint64_t off, uint64_t len, bool count)
{
	struct hyb_lpool *lp;
	int ret = -ENOENT;

	pthread_mutex_lock(&lp_lock);
	lp = lp_find(NULL, id);
	if (lp) {
		ret = -EINVAL;
		if (len && off + len >= off && off + len <= lp->bytes) {
			ret = 0;
			if (count)
				lp->reloads++;
		}
	}
	pthread_mutex_unlock(&lp_lock);
	return ret;
}

/* -- backend ops --------------------------------------------------------- */

static int l_open(struct hyb_backend *b, char *err, size_t err_len)
{
	(void)b;
	(void)err;
	(void)err_len;
	pthread_mutex_lock(&lp_lock);
	if (!lp_cap)
		lp_cap = hyb_mp_default_cap();
	pthread_mutex_unlock(&lp_lock);
	return 0;
}

static void l_close(struct hyb_backend *b)
{
	struct hyb_lpool *lp, *next;

	pthread_mutex_lock(&lp_lock);
	for (lp = lp_table; lp; lp = next) {
		next = lp->next;
		if (lp->ready && lp->owner == b)
			lp_destroy_locked(lp);
	}
	pthread_mutex_unlock(&lp_lock);
}

static int l_info(struct hyb_backend *b, struct hyb_backend_info *out)
{
	struct hyb_lpool *lp;

	(void)b;
	out->abi_version = 1;
	out->page_sizes = HUGE_2M;
	pthread_mutex_lock(&lp_lock);
	for (lp = lp_table; lp; lp = lp->next)
		out->nr_pools += lp->ready;
	out->nr_zombies = lp_zombies;
	out->pinned_bytes = lp_pinned;
	out->pinned_cap = lp_cap;
	pthread_mutex_unlock(&lp_lock);
	out->nr_queues = hyb_rq_local_nr_queues();
	out->nr_requests = hyb_rq_local_nr_requests();
	return 0;
}

static void handle_link(struct hyb_mempool *p, struct hyb_lpool *lp)
{
	p->lp = lp;
	p->id = lp->id;
	p->bytes = lp->bytes;
	p->owned = lp->owner == p->b;
	p->lp_next = lp->handles;
	lp->handles = p;
	lp->refs++;
}

static int l_pool_create(struct hyb_mempool *p, const char *name, uint64_t bytes, int node,
			 unsigned int flags)
{
	struct hyb_lpool *lp, *o;
	uint64_t t0;
	int ret = 0;

	if (node == HYB_MEMPOOL_NODE_LOCAL)
		node = hyb_mp_local_node();
	lp = calloc(1, sizeof(*lp));
	if (!lp)
		return -ENOMEM;
	snprintf(lp->name, sizeof(lp->name), "%s", name);
	lp->node = node;
	lp->bytes = bytes;
	lp->owner = p->b;
	lp->owner_pid = getpid();
	lp->refs = 1;

	/* Reserve the name, an id and the bytes; allocate without the lock. */
	pthread_mutex_lock(&lp_lock);
	for (o = lp_table; o && strcmp(o->name, name); o = o->next)
		;
	if (o) {
		ret = hyb_mp_err(-EEXIST, "create pool '%s': the name is taken", name);
	} else if (lp_slots >= HYB_MEMPOOL_MAX || bytes > lp_cap || lp_pinned > lp_cap - bytes) {
		ret = hyb_mp_err(-ENOSPC, "create pool '%s': %llu MiB would pass the pinned-memory "
				 "cap of %llu MiB (or %d pools are live)", name,
				 (unsigned long long)(bytes >> 20),
				 (unsigned long long)(lp_cap >> 20), HYB_MEMPOOL_MAX);
	} else {
		do
			lp->id = lp_next_id = lp_next_id % ((1U << 20) - 1) + 1;
		while (lp_id_used(lp->id));
		lp->next = lp_table;
		lp_table = lp;
		lp_slots++;
		lp_pinned += bytes;
	}
	pthread_mutex_unlock(&lp_lock);
	if (ret) {
		free(lp);
		return ret;
	}

	t0 = hyb_mp_now_ns();
	ret = lmem_alloc(&lp->mem, name, bytes, node, flags & HYB_MEMPOOL_SHARED,
			 flags & HYB_MEMPOOL_LAZY);
	lp->create_ns = hyb_mp_now_ns() - t0;

	pthread_mutex_lock(&lp_lock);
	if (ret) {
		lp_unlink(lp);
		lp_pinned -= bytes;
		free(lp);
	} else {
		lp->ready = true;
		handle_link(p, lp);
	}
	pthread_mutex_unlock(&lp_lock);
	return ret;
}

static int l_pool_open(struct hyb_mempool *p, const char *name, uint32_t id)
{
	struct hyb_lpool *lp;

	pthread_mutex_lock(&lp_lock);
	lp = lp_find(name, id);
	if (lp)
		handle_link(p, lp);
	pthread_mutex_unlock(&lp_lock);
	return lp ? 0 : -ENOENT;
}

/* Bytes of [base, base + len) that smaps shows in PMD-mapped huge pages. */
static uint64_t smaps_huge(const void *base, uint64_t len)
{
	char line[256];
	unsigned long long start, end, kb, sum = 0;
	bool in = false;
	FILE *f = fopen("/proc/self/smaps", "r");

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "%llx-%llx ", &start, &end) == 2 && strchr(line, ' ')) {
			in = start >= (uintptr_t)base && end <= (uintptr_t)base + len;
			continue;
		}
		if (in && (sscanf(line, "AnonHugePages: %llu kB", &kb) == 1 ||
			   sscanf(line, "ShmemPmdMapped: %llu kB", &kb) == 1 ||
			   sscanf(line, "FilePmdMapped: %llu kB", &kb) == 1))
			sum += kb;
	}
	fclose(f);
	return sum << 10;
}

static int l_pool_stat(struct hyb_backend *b, uint32_t id, struct hyb_mempool_info *out)
{
	struct hyb_lpool *lp;
	void *base = NULL;

	pthread_mutex_lock(&lp_lock);
	lp = lp_find(NULL, id);
	if (lp) {
		out->id = lp->id;
		out->node = lp->node;
		memcpy(out->name, lp->name, sizeof(out->name));
		out->bytes = lp->bytes;
		out->page_size = HUGE_2M;
		out->flags = lp->mem.flags;
		out->mappers = lp->mappers;
		out->reloads = lp->reloads;
		out->owner_pid = lp->owner_pid;
		out->owned = lp->owner == b;
		out->create_ns = lp->create_ns;
		base = lp->mem.base;
		if (lp->mem.flags & HYB_MEMPOOL_F_HUGETLB)
			out->huge_bytes = lp->bytes;
	}
	pthread_mutex_unlock(&lp_lock);
	if (!lp)
		return -ENOENT;
	if (!out->huge_bytes)
		out->huge_bytes = smaps_huge(base, out->bytes);
	return 0;
}

static int l_pool_list(struct hyb_backend *b, uint32_t *ids, unsigned int max)
{
	struct hyb_lpool *lp;
	uint32_t tmp;
	unsigned int n = 0, i, j;

	(void)b;
	pthread_mutex_lock(&lp_lock);
	for (lp = lp_table; lp; lp = lp->next) {
		if (!lp->ready)
			continue;
		if (n < max)
			ids[n] = lp->id;
		n++;
	}
	pthread_mutex_unlock(&lp_lock);
	/* Ascending, like the module's table. */
	for (i = 1; i < (n < max ? n : max); i++)
		for (j = i; j > 0 && ids[j - 1] > ids[j]; j--) {
			tmp = ids[j];
			ids[j] = ids[j - 1];
			ids[j - 1] = tmp;
		}
	return (int)n;
}

static int l_pool_map(struct hyb_mempool *p)
{
	struct hyb_lpool *lp = p->lp;
	void *a;
	int ret = 0;

	pthread_mutex_lock(&lp_lock);
	if (lp->destroyed) {
		ret = -ENXIO;	/* as mmap of a destroyed pool fails with the module */
	} else if (p->owned || lp->mem.ro_fd < 0) {
		p->addr = lp->mem.base;
		lp->mappers++;
	} else {
		a = map_aligned(lp->mem.ro_fd, lp->bytes, PROT_READ, MAP_POPULATE);
		if (!a) {
			ret = -errno;
		} else {
			p->addr = a;
			lp->mappers++;
		}
	}
	pthread_mutex_unlock(&lp_lock);
	return ret;
}

static int l_pool_destroy(struct hyb_mempool *p)
{
	struct hyb_lpool *lp = p->lp;
	int ret = 0;

	pthread_mutex_lock(&lp_lock);
	if (lp->destroyed)
		ret = -ENOENT;
	else if (lp->owner != p->b)
		ret = -EPERM;
	else
		lp_destroy_locked(lp);
	pthread_mutex_unlock(&lp_lock);
	return ret;
}

static void l_pool_close(struct hyb_mempool *p)
{
	struct hyb_lpool *lp = p->lp;
	struct hyb_mempool **pp;

	pthread_mutex_lock(&lp_lock);
	if (p->addr) {
		if (p->addr != lp->mem.base)
			munmap(p->addr, lp->bytes);
		lp->mappers--;
	}
	for (pp = &lp->handles; *pp; pp = &(*pp)->lp_next) {
		if (*pp == p) {
			*pp = p->lp_next;
			break;
		}
	}
	lp->refs--;
	lp_settle(lp);
	pthread_mutex_unlock(&lp_lock);
}

/*
 * Recreate the memory on node, copy it, and put it under the same addresses:
 * MAP_FIXED of the new file (or mremap of new private memory) replaces a
 * mapping atomically, so readers never see a hole. A shared pool stays
 * shared, so read-only views stay read-only.
 */
static int l_pool_move(struct hyb_mempool *p, int node)
{
	struct hyb_lpool *lp = p->lp;
	struct hyb_mempool *h;
	struct lmem nm;
	uint64_t len = lp->bytes;
	void *a;
	int ret;

	if (node == HYB_MEMPOOL_NODE_LOCAL)
		node = hyb_mp_local_node();
	pthread_mutex_lock(&lp_lock);
	if (lp->destroyed) {
		pthread_mutex_unlock(&lp_lock);
		return -ENOENT;
	}
	ret = lmem_alloc(&nm, lp->name, len, node, lp->mem.flags & HYB_MEMPOOL_F_SHARED, false);
	if (ret) {
		pthread_mutex_unlock(&lp_lock);
		return ret;
	}
	memcpy(nm.base, lp->mem.base, len);
	for (h = lp->handles; h && nm.ro_fd >= 0; h = h->lp_next) {
		if (!h->addr || h->addr == lp->mem.base)
			continue;
		a = mmap(h->addr, len, PROT_READ, MAP_SHARED | MAP_FIXED | MAP_POPULATE,
			 nm.ro_fd, 0);
		if (a == MAP_FAILED)
			goto fail;
	}
	if (nm.rw_fd >= 0) {
		a = mmap(lp->mem.base, len, PROT_READ | PROT_WRITE,
			 MAP_SHARED | MAP_FIXED | MAP_POPULATE, nm.rw_fd, 0);
		if (a == MAP_FAILED)
			goto fail;
		munmap(nm.base, len);
		if (nm.flags & HYB_MEMPOOL_F_THP)
			madvise(lp->mem.base, len, MADV_HUGEPAGE);
		if ((nm.flags & HYB_MEMPOOL_F_LOCKED) && !(nm.flags & HYB_MEMPOOL_F_HUGETLB))
			mlock(lp->mem.base, len);
	} else {
		/* The old mapping goes with the move; the new keeps policy and lock. */
		a = mremap(nm.base, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, lp->mem.base);
		if (a == MAP_FAILED)
			goto fail;
	}
	nm.base = lp->mem.base;
	lp->mem.base = NULL;	/* replaced above: only the files are left to close */
	lmem_free(&lp->mem, len);
	lp->mem = nm;
	lp->node = node;
	pthread_mutex_unlock(&lp_lock);
	return 0;

fail:
	/* Views already switched keep working: they map the new file, same bytes. */
	ret = hyb_mp_err(-errno, "move pool '%s' to node %d: remapping failed: %s", lp->name,
			 node, strerror(errno));
	lmem_free(&nm, len);
	pthread_mutex_unlock(&lp_lock);
	return ret;
}

static int l_rq_stats(struct hyb_backend *b, unsigned int queue, struct hyb_rq_stats *out)
{
	(void)b;
	return hyb_rq_local_stats(queue, out);
}

const struct hyb_mempool_ops hyb_mempool_local_ops = {
	.kind = HYB_BACKEND_LOCAL,
	.caps = HYB_BACKEND_CAN_MOVE,
	.open = l_open,
	.close = l_close,
	.info = l_info,
	.pool_create = l_pool_create,
	.pool_open = l_pool_open,
	.pool_stat = l_pool_stat,
	.pool_list = l_pool_list,
	.pool_map = l_pool_map,
	.pool_destroy = l_pool_destroy,
	.pool_move = l_pool_move,
	.pool_close = l_pool_close,
	.rq_attach = hyb_rq_local_attach,
	.rq_submit = hyb_rq_local_submit,
	.rq_reap = hyb_rq_local_reap,
	.rq_fetch = hyb_rq_local_fetch,
	.rq_complete = hyb_rq_local_complete,
	.rq_kill = hyb_rq_local_kill,
	.rq_close = hyb_rq_local_close,
	.rq_stats = l_rq_stats,
};
