// SPDX-License-Identifier: MIT
/*
 * Conformance tests of hyb/pool.h, written once and run against both
 * backends: NAME_local always, NAME_kmod when /dev/hybpool exists (skipped
 * otherwise; the VM bench, tests/vm, runs them against the real module with
 * HYB_REQUIRE_KMOD=1 so that they cannot skip there). A few tests cover what
 * only one backend has (the local backend's choice of memory, its mlock
 * fallback) and hybctl's pool commands.
 */
#include <errno.h>
#include <fcntl.h>
#include <numa.h>
#include <numaif.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <linux/capability.h>

#include "hyb/pool.h"
#include "test.h"

#define MiB (1ULL << 20)

static enum hyb_backend_kind kind_of_test;

static void need_kmod(void)
{
	const char *req = getenv("HYB_REQUIRE_KMOD");

	if (access("/dev/hybpool", F_OK) == 0)
		return;
	if (req && !strcmp(req, "1"))
		CHECK_MSG(0, "/dev/hybpool missing but HYB_REQUIRE_KMOD=1");
	SKIP("/dev/hybpool not present (hybpool.ko not loaded); tests/vm runs this against "
	     "the module");
}

/* One body, two tests: name_local and name_kmod. */
#define BOTH(name)                                                                     \
	static void name(void);                                                        \
	TEST(name##_local)                                                             \
	{                                                                              \
		kind_of_test = HYB_BACKEND_LOCAL;                                      \
		name();                                                                \
	}                                                                              \
	TEST(name##_kmod)                                                              \
	{                                                                              \
		need_kmod();                                                           \
		kind_of_test = HYB_BACKEND_KMOD;                                       \
		name();                                                                \
	}                                                                              \
	static void name(void)

#define CHECK_ERR(expr, err)                                                           \
	do {                                                                           \
		int r_ = (expr);                                                       \
		CHECK_MSG(r_ == (err), "%s = %d (%s), want %d (%s); message: %s", #expr, \
			  r_, strerror(-r_), (err), strerror(-(err)),                  \
			  hyb_last_error());                                        \
	} while (0)

#define CHECK_OK(expr) CHECK_ERR(expr, 0)

/* The call failed with err and left a message containing word. */
#define CHECK_FAILS(expr, err, word)                                                   \
	do {                                                                           \
		CHECK_ERR(expr, err);                                                  \
		CHECK_MSG(strstr(hyb_last_error(), (word)), "%s: message '%s' lacks '%s'", \
			  #expr, hyb_last_error(), (word));                         \
	} while (0)

static struct hyb_backend *bopen(void)
{
	struct hyb_backend *b = hyb_backend_open(kind_of_test);

	CHECK_MSG(b, "open %s backend: %s", hyb_backend_name(kind_of_test), hyb_last_error());
	CHECK_EQ_INT(hyb_backend_kind(b), kind_of_test);
	return b;
}

/* Is capability cap in this process's effective set? */
static int has_cap(int cap)
{
	struct __user_cap_header_struct hdr = { .version = _LINUX_CAPABILITY_VERSION_3 };
	struct __user_cap_data_struct d[2];

	if (syscall(SYS_capget, &hdr, d))
		return 0;
	return !!(d[cap / 32].effective & (1U << (cap % 32)));
}

static struct hyb_backend_info binfo(struct hyb_backend *b)
{
	struct hyb_backend_info bi;

	CHECK_OK(hyb_backend_info(b, &bi));
	return bi;
}

static struct hyb_mempool_info pinfo(struct hyb_mempool *p)
{
	struct hyb_mempool_info pi;

	CHECK_OK(hyb_mempool_info(p, &pi));
	return pi;
}

static void *pmap(struct hyb_mempool *p)
{
	void *a = NULL;
	size_t len = 0;

	CHECK_OK(hyb_mempool_map(p, &a, &len));
	CHECK(a != NULL);
	CHECK_EQ_INT(len, pinfo(p).bytes);
	return a;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Does a write to p fault? */
static sigjmp_buf fault_jb;

static void on_fault(int sig)
{
	(void)sig;
	siglongjmp(fault_jb, 1);
}

static int write_faults(volatile char *p)
{
	struct sigaction sa, old_segv, old_bus;
	volatile int faulted = 0;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_fault;
	sigaction(SIGSEGV, &sa, &old_segv);
	sigaction(SIGBUS, &sa, &old_bus);
	if (sigsetjmp(fault_jb, 1) == 0)
		*p = 0x5a;
	else
		faulted = 1;
	sigaction(SIGSEGV, &old_segv, NULL);
	sigaction(SIGBUS, &old_bus, NULL);
	return faulted;
}

/* Nodes with memory, ascending. */
static int mem_nodes(int *nodes, int max)
{
	int n = 0, i;

	if (numa_available() < 0) {
		nodes[0] = 0;
		return 1;
	}
	for (i = 0; i <= numa_max_node() && n < max; i++)
		if (numa_node_size64(i, NULL) > 0)
			nodes[n++] = i;
	return n;
}

/* The node of every 4 KiB page of [a, a + len) is node (the kernel says, move_pages query). */
static void check_node(const void *a, size_t len, int node)
{
	size_t n = len / 4096, i;
	void **pages = calloc(n, sizeof(*pages));
	int *status = calloc(n, sizeof(*status));

	CHECK(pages && status);
	for (i = 0; i < n; i++)
		pages[i] = (char *)a + i * 4096;
	CHECK_MSG(move_pages(0, n, pages, NULL, status, 0) == 0, "move_pages: %s",
		  strerror(errno));
	for (i = 0; i < n; i++)
		CHECK_MSG(status[i] == node, "page %zu of %zu is on node %d (%s), want node %d",
			  i, n, status[i], status[i] < 0 ? strerror(-status[i]) : "ok", node);
	free(pages);
	free(status);
}

static void fill(void *a, size_t len, uint32_t seed)
{
	uint32_t *w = a;

	for (size_t i = 0; i < len / 4; i++)
		w[i] = seed * 2654435761u + (uint32_t)i;
}

static int filled(const void *a, size_t len, uint32_t seed)
{
	const uint32_t *w = a;

	for (size_t i = 0; i < len / 4; i++)
		if (w[i] != seed * 2654435761u + (uint32_t)i)
			return 0;
	return 1;
}

static int all_zero(const void *a, size_t len)
{
	const uint64_t *w = a;

	for (size_t i = 0; i < len / 8; i++)
		if (w[i])
			return 0;
	return 1;
}

/* -- pools --------------------------------------------------------------- */

BOTH(mempool_create_map)
{
	struct hyb_backend *b = bopen();
	struct hyb_backend_info bi = binfo(b);
	struct hyb_mempool *p, *p2, *p3;
	struct hyb_mempool_info pi;
	uint32_t ids[HYB_MEMPOOL_MAX];
	int n, found = 0;
	void *a, *a2;

	CHECK(bi.pinned_cap > 0);
	CHECK(bi.page_sizes & HYB_MEMPOOL_PAGE_2M);
	CHECK_OK(hyb_mempool_create(b, "t-create", 3 * MiB, 0, 0, 0, &p));
	CHECK(hyb_mempool_writable(p));
	pi = pinfo(p);
	CHECK_EQ_INT(pi.id, hyb_mempool_id(p));
	CHECK(pi.id > 0);
	CHECK(!strcmp(pi.name, "t-create"));
	CHECK_EQ_INT(pi.node, 0);
	CHECK_EQ_INT(pi.bytes, 4 * MiB);	/* rounded up to pages */
	CHECK_EQ_INT(pi.page_size, 2 * MiB);
	CHECK_EQ_INT(pi.owned, 1);
	CHECK_EQ_INT(pi.owner_pid, getpid());
	CHECK_EQ_INT(pi.mappers, 0);
	CHECK(pi.create_ns > 0);
	CHECK_MSG(pi.flags & HYB_MEMPOOL_F_LOCKED, "flags 0x%x: not locked (running as root)",
		  pi.flags);

	a = pmap(p);
	CHECK_MSG(all_zero(a, 4 * MiB), "a new pool is not zeroed");
	fill(a, 4 * MiB, 1);
	CHECK(filled(a, 4 * MiB, 1));
	CHECK_OK(hyb_mempool_map(p, &a2, NULL));
	CHECK(a2 == a);
	CHECK_EQ_INT(pinfo(p).mappers, 1);

	/* The same pool again, by name and by id, through the owner: read-write. */
	CHECK_OK(hyb_mempool_open(b, "t-create", &p2));
	CHECK_EQ_INT(hyb_mempool_id(p2), pi.id);
	CHECK(hyb_mempool_writable(p2));
	a2 = pmap(p2);
	CHECK(filled(a2, 4 * MiB, 1));
	((uint32_t *)a2)[7] = 77;
	CHECK_EQ_INT(((uint32_t *)a)[7], 77);
	CHECK_OK(hyb_mempool_open_id(b, pi.id, &p3));
	CHECK(!strcmp(pinfo(p3).name, "t-create"));
	hyb_mempool_close(p3);

	n = hyb_mempool_list(b, ids, HYB_MEMPOOL_MAX);
	CHECK(n >= 1);
	for (int i = 0; i < n && i < HYB_MEMPOOL_MAX; i++)
		found |= ids[i] == pi.id;
	CHECK(found);
	CHECK_EQ_INT(hyb_mempool_list(b, NULL, 0), n);
	CHECK(binfo(b).nr_pools >= 1);

	hyb_mempool_close(p2);
	CHECK_OK(hyb_mempool_destroy(p));
	hyb_mempool_close(p);
	hyb_backend_close(b);
}

BOTH(mempool_share_fork)
{
	struct hyb_backend *b = bopen();
	struct hyb_mempool *p;
	int to_child[2], to_parent[2], st;
	char *a;
	pid_t pid;
	char c;

	CHECK_OK(hyb_mempool_create(b, "t-share", 4 * MiB, 0, 0, HYB_MEMPOOL_SHARED, &p));
	CHECK(pinfo(p).flags & HYB_MEMPOOL_F_SHARED);
	a = pmap(p);
	fill(a, 4 * MiB, 2);
	CHECK(!pipe(to_child) && !pipe(to_parent));
	fflush(NULL);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		/* Another process, its own backend handle: reads the same bytes, cannot write. */
		struct hyb_backend *cb = hyb_backend_open(kind_of_test);
		struct hyb_mempool *cp;
		struct hyb_mempool_info ci;
		char *ca;
		size_t len;

		if (!cb || hyb_mempool_open(cb, "t-share", &cp) || hyb_mempool_info(cp, &ci))
			_exit(10);
		if (ci.owned || hyb_mempool_writable(cp))
			_exit(11);
		if (hyb_mempool_map(cp, (void **)&ca, &len) || len != 4 * MiB)
			_exit(12);
		if (!filled(ca, 4 * MiB, 2))
			_exit(13);
		if (write(to_parent[1], "r", 1) != 1 || read(to_child[0], &c, 1) != 1)
			_exit(14);
		/* The parent wrote after this process mapped: the same memory. */
		if (!filled(ca + MiB, MiB, 3))
			_exit(15);
		if (!write_faults(ca + 5))
			_exit(16);
		_exit(0);
	}
	CHECK(read(to_parent[0], &c, 1) == 1);
	fill(a + MiB, MiB, 3);
	CHECK(write(to_child[1], "w", 1) == 1);
	CHECK(waitpid(pid, &st, 0) == pid);
	CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0,
		  "child: status %d (10 open, 11 owned, 12 map, 13 bytes, 14 pipe, 15 shared "
		  "write not seen, 16 read-only write did not fault)", st);
	hyb_mempool_close(p);
	hyb_backend_close(b);
}

BOTH(mempool_ro_others)
{
	struct hyb_backend *b = bopen(), *o = bopen();
	struct hyb_mempool *p, *q;
	char *a, *ro;

	CHECK_OK(hyb_mempool_create(b, "t-ro", 2 * MiB, 0, 0, HYB_MEMPOOL_SHARED, &p));
	a = pmap(p);
	strcpy(a, "hello pool");
	CHECK_OK(hyb_mempool_open(o, "t-ro", &q));
	CHECK_EQ_INT(hyb_mempool_writable(q), 0);
	CHECK_EQ_INT(pinfo(q).owned, 0);
	ro = pmap(q);
	CHECK(!strcmp(ro, "hello pool"));
	CHECK_MSG(write_faults(ro + 100), "a read-only view could be written");
	CHECK_MSG(mprotect(ro, 2 * MiB, PROT_READ | PROT_WRITE) == -1 && errno == EACCES,
		  "mprotect(PROT_WRITE) of a read-only view: %s", strerror(errno));
	CHECK(!strcmp(ro, "hello pool"));
	CHECK_EQ_INT(pinfo(p).mappers, 2);
	CHECK_FAILS(hyb_mempool_destroy(q), -EPERM, "owner");
	if (binfo(b).kind == HYB_BACKEND_KMOD && has_cap(CAP_SYS_ADMIN))
		CHECK_OK(hyb_mempool_move(q, 0));	/* an admin may move any module pool */
	else if (binfo(b).caps & HYB_BACKEND_CAN_MOVE)
		CHECK_FAILS(hyb_mempool_move(q, 0), -EPERM, "owner");
	else
		CHECK_FAILS(hyb_mempool_move(q, 0), -EOPNOTSUPP, "recreate");
	CHECK(!strcmp(ro, "hello pool"));
	hyb_mempool_close(q);
	CHECK_EQ_INT(pinfo(p).mappers, 1);
	hyb_mempool_close(p);
	hyb_backend_close(o);
	hyb_backend_close(b);
}

BOTH(mempool_node_placement)
{
	struct hyb_backend *b = bopen(), *o = bopen();
	int nodes[64], nn = mem_nodes(nodes, 64);
	struct hyb_mempool *p, *q;
	char name[32];
	int local;

	for (int i = 0; i < nn; i++) {
		snprintf(name, sizeof(name), "t-node%d", nodes[i]);
		CHECK_OK(hyb_mempool_create(b, name, 8 * MiB, nodes[i], 0, HYB_MEMPOOL_SHARED,
					    &p));
		CHECK_EQ_INT(pinfo(p).node, nodes[i]);
		check_node(pmap(p), 8 * MiB, nodes[i]);
		CHECK_OK(hyb_mempool_open(o, name, &q));
		check_node(pmap(q), 8 * MiB, nodes[i]);
		hyb_mempool_close(q);
		hyb_mempool_close(p);
	}
	CHECK_OK(hyb_mempool_create(b, "t-nodelocal", 4 * MiB, HYB_MEMPOOL_NODE_LOCAL, 0, 0, &p));
	local = pinfo(p).node;
	CHECK(local >= 0 && numa_node_size64(local, NULL) > 0);
	check_node(pmap(p), 4 * MiB, local);
	hyb_mempool_close(p);
	printf("    %d node(s) with memory, every page where asked\n", nn);
	hyb_backend_close(o);
	hyb_backend_close(b);
}

BOTH(mempool_move)
{
	struct hyb_backend *b = bopen(), *o = bopen();
	int nodes[64], nn = mem_nodes(nodes, 64), to = nodes[nn - 1];
	struct hyb_mempool *p, *q;
	char *a, *ro;

	CHECK_OK(hyb_mempool_create(b, "t-move", 6 * MiB, nodes[0], 0, HYB_MEMPOOL_SHARED, &p));
	a = pmap(p);
	fill(a, 6 * MiB, 9);
	CHECK_OK(hyb_mempool_open(o, "t-move", &q));
	ro = pmap(q);
	if (!(binfo(b).caps & HYB_BACKEND_CAN_MOVE)) {
		CHECK_FAILS(hyb_mempool_move(p, to), -EOPNOTSUPP, "recreate");
		CHECK_EQ_INT(pinfo(p).node, nodes[0]);
		goto out;
	}
	CHECK_FAILS(hyb_mempool_move(p, 4096), -EINVAL, "node");
	/* To the last node (the same one where there is only one: recreated in place). */
	CHECK_OK(hyb_mempool_move(p, to));
	CHECK_EQ_INT(pinfo(p).node, to);
	CHECK_MSG(filled(a, 6 * MiB, 9), "owner's view lost the bytes");
	CHECK_MSG(filled(ro, 6 * MiB, 9), "read-only view lost the bytes");
	check_node(a, 6 * MiB, to);
	check_node(ro, 6 * MiB, to);
	((uint32_t *)a)[3] = 33;
	CHECK_MSG(((uint32_t *)ro)[3] == 33, "views no longer share memory after the move");
	CHECK(write_faults(ro + 1));
	CHECK(pinfo(p).flags & HYB_MEMPOOL_F_SHARED);
	/* A pool of the default kind (private THP where shmem has no THP) moves too. */
	{
		struct hyb_mempool *v;
		char *va;

		CHECK_OK(hyb_mempool_create(b, "t-move2", 4 * MiB, nodes[0], 0, 0, &v));
		va = pmap(v);
		fill(va, 4 * MiB, 10);
		CHECK_OK(hyb_mempool_move(v, to));
		CHECK_OK(hyb_mempool_map(v, (void **)&a, NULL));
		CHECK(a == va);
		CHECK_MSG(filled(va, 4 * MiB, 10), "default pool lost its bytes in the move");
		check_node(va, 4 * MiB, to);
		CHECK_EQ_INT(pinfo(v).node, to);
		hyb_mempool_close(v);
	}
out:
	hyb_mempool_close(q);
	hyb_mempool_close(p);
	hyb_backend_close(o);
	hyb_backend_close(b);
}

BOTH(mempool_stats)
{
	struct hyb_backend *b = bopen(), *o = bopen();
	struct hyb_backend_info b0 = binfo(b), b1;
	struct hyb_mempool *p, *q;
	struct hyb_mempool_info pi;

	CHECK_OK(hyb_mempool_create(b, "t-stats", 10 * MiB, 0, 0, 0, &p));
	b1 = binfo(b);
	CHECK_EQ_INT(b1.nr_pools, b0.nr_pools + 1);
	CHECK_EQ_INT(b1.pinned_bytes, b0.pinned_bytes + 10 * MiB);
	CHECK_EQ_INT(pinfo(p).mappers, 0);
	pmap(p);
	CHECK_OK(hyb_mempool_open(o, "t-stats", &q));
	pmap(q);
	pi = pinfo(p);
	CHECK_EQ_INT(pi.mappers, 2);
	CHECK_EQ_INT(pi.reloads, 0);
	CHECK(pi.huge_bytes <= pi.bytes && pi.huge_bytes % (2 * MiB) == 0);
	if (b1.caps & HYB_BACKEND_COUNTS_FAULTS)
		CHECK_MSG(pi.faults > 0, "mapped with populate, yet no faults counted");
	else
		CHECK_EQ_INT(pi.faults, 0);
	hyb_mempool_close(q);
	CHECK_EQ_INT(pinfo(p).mappers, 1);
	hyb_mempool_close(p);
	hyb_backend_close(o);
	hyb_backend_close(b);
}

/* Does this process still hold a memfd or a mapping of pool name? */
static int memfd_held(const char *name)
{
	char path[64], link[256], line[512], want[64];
	int found = 0;
	FILE *f;

	snprintf(want, sizeof(want), "hybpool:%s", name);
	for (int fd = 0; fd < 1024; fd++) {
		ssize_t n;

		snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
		n = readlink(path, link, sizeof(link) - 1);
		if (n <= 0)
			continue;
		link[n] = 0;
		found |= strstr(link, want) != NULL;
	}
	f = fopen("/proc/self/maps", "r");
	while (f && fgets(line, sizeof(line), f))
		found |= strstr(line, want) != NULL;
	if (f)
		fclose(f);
	return found;
}

BOTH(mempool_destroy_release)
{
	struct hyb_backend *b = bopen(), *o;
	struct hyb_backend_info b0 = binfo(b), bi;
	struct hyb_mempool *p, *q;
	char *a;

	CHECK_OK(hyb_mempool_create(b, "t-rel", 16 * MiB, 0, 0, HYB_MEMPOOL_SHARED, &p));
	a = pmap(p);
	fill(a, 16 * MiB, 4);
	CHECK_OK(hyb_mempool_destroy(p));
	CHECK_FAILS(hyb_mempool_open(b, "t-rel", &q), -ENOENT, "no such pool");
	CHECK_FAILS(hyb_mempool_destroy(p), -ENOENT, "");
	bi = binfo(b);
	CHECK_EQ_INT(bi.nr_pools, b0.nr_pools);
	CHECK_EQ_INT(bi.nr_zombies, b0.nr_zombies + 1);
	CHECK_EQ_INT(bi.pinned_bytes, b0.pinned_bytes + 16 * MiB);	/* still mapped */
	CHECK_MSG(filled(a, 16 * MiB, 4), "a destroyed pool's mapping must stay valid");
	/* The name is free again while the zombie lives. */
	CHECK_OK(hyb_mempool_create(b, "t-rel", 2 * MiB, 0, 0, 0, &q));
	hyb_mempool_close(q);
	CHECK_EQ_INT(binfo(b).pinned_bytes, b0.pinned_bytes + 18 * MiB);
	hyb_mempool_close(p);
	bi = binfo(b);
	CHECK_EQ_INT(bi.nr_zombies, b0.nr_zombies);
	/* The 2 MiB pool is live (owned by b, not destroyed): only it remains. */
	CHECK_EQ_INT(bi.pinned_bytes, b0.pinned_bytes + 2 * MiB);

	/* Destroyed before any mapping: released at once, handle or not. */
	CHECK_OK(hyb_mempool_open(b, "t-rel", &q));
	CHECK_OK(hyb_mempool_destroy(q));
	CHECK_EQ_INT(binfo(b).pinned_bytes, b0.pinned_bytes);
	hyb_mempool_close(q);

	/* Closing the owner's backend handle destroys its pools. */
	o = bopen();
	CHECK_OK(hyb_mempool_create(o, "t-rel2", 4 * MiB, 0, 0, 0, &q));
	hyb_mempool_close(q);
	hyb_backend_close(o);
	CHECK_FAILS(hyb_mempool_open(b, "t-rel2", &q), -ENOENT, "no such pool");
	bi = binfo(b);
	CHECK_EQ_INT(bi.pinned_bytes, b0.pinned_bytes);
	CHECK_EQ_INT(bi.nr_pools, b0.nr_pools);
	if (kind_of_test == HYB_BACKEND_LOCAL)
		CHECK_MSG(!memfd_held("t-rel") && !memfd_held("t-rel2"),
			  "a released pool's memfd or mapping is still in this process");
	hyb_backend_close(b);
}

BOTH(mempool_bad_args)
{
	struct hyb_backend *b = bopen();
	struct hyb_backend_info bi = binfo(b);
	struct hyb_mempool *p, *q;
	char long_name[40];

	memset(long_name, 'x', 32);
	long_name[32] = 0;
	CHECK_FAILS(hyb_mempool_create(b, "", MiB, 0, 0, 0, &p), -EINVAL, "empty");
	CHECK(p == NULL);
	CHECK_FAILS(hyb_mempool_create(b, long_name, MiB, 0, 0, 0, &p), -EINVAL, "longer");
	CHECK_FAILS(hyb_mempool_create(b, "a b", MiB, 0, 0, 0, &p), -EINVAL, "character");
	CHECK_FAILS(hyb_mempool_create(b, "a/b", MiB, 0, 0, 0, &p), -EINVAL, "character");
	CHECK_FAILS(hyb_mempool_create(b, NULL, MiB, 0, 0, 0, &p), -EINVAL, "NULL");
	CHECK_FAILS(hyb_mempool_create(b, "t-bad", 0, 0, 0, 0, &p), -EINVAL, "size");
	CHECK_FAILS(hyb_mempool_create(b, "t-bad", HYB_MEMPOOL_MAX_BYTES + 1, 0, 0, 0, &p),
		    -EINVAL, "size");
	CHECK_FAILS(hyb_mempool_create(b, "t-bad", MiB, 4096, 0, 0, &p), -EINVAL, "node 4096");
	CHECK_FAILS(hyb_mempool_create(b, "t-bad", MiB, -2, 0, 0, &p), -EINVAL, "node -2");
	CHECK_FAILS(hyb_mempool_create(b, "t-bad", MiB, 0, 4096, 0, &p), -EINVAL, "page size");
	CHECK_FAILS(hyb_mempool_create(b, "t-bad", MiB, 0, HYB_MEMPOOL_PAGE_1G, 0, &p),
		    -EOPNOTSUPP, "1 GiB");
	CHECK_FAILS(hyb_mempool_create(b, "t-bad", MiB, 0, 0, 0x80, &p), -EINVAL, "flags");
	CHECK_FAILS(hyb_mempool_create(b, "t-bad", MiB, 0, 0, 0, NULL), -EINVAL, "NULL");
	CHECK_FAILS(hyb_mempool_create(NULL, "t-bad", MiB, 0, 0, 0, &p), -EINVAL, "NULL");
	if (bi.pinned_cap + 2 * MiB <= HYB_MEMPOOL_MAX_BYTES)
		CHECK_FAILS(hyb_mempool_create(b, "t-big", bi.pinned_cap + 2 * MiB, 0, 0, 0, &p),
			    -ENOSPC, "cap");
	CHECK_OK(hyb_mempool_create(b, "t-dup", MiB, 0, 0, 0, &p));
	CHECK_FAILS(hyb_mempool_create(b, "t-dup", MiB, 0, 0, 0, &q), -EEXIST, "taken");
	CHECK_FAILS(hyb_mempool_open(b, "t-nope", &q), -ENOENT, "no such pool");
	CHECK_FAILS(hyb_mempool_open(b, "bad name", &q), -EINVAL, "character");
	CHECK_FAILS(hyb_mempool_open_id(b, 0, &q), -EINVAL, "id 0");
	CHECK_FAILS(hyb_mempool_open_id(b, 999999, &q), -ENOENT, "no such pool");
	{
		struct hyb_mempool_info pi;

		CHECK_FAILS(hyb_mempool_stat(b, 999999, &pi), -ENOENT, "no such pool");
	}
	CHECK_FAILS(hyb_mempool_map(NULL, NULL, NULL), -EINVAL, "NULL");
	CHECK_FAILS(hyb_mempool_list(b, NULL, 4), -EINVAL, "NULL");
	hyb_mempool_close(p);
	hyb_backend_close(b);
}

TEST(mempool_backend_open_errors)
{

	setenv("HYB_BACKEND", "bogus", 1);
	CHECK(hyb_backend_open(HYB_BACKEND_AUTO) == NULL);
	CHECK_MSG(strstr(hyb_last_error(), "HYB_BACKEND='bogus'"), "message: %s", hyb_last_error());
	setenv("HYB_BACKEND", "local", 1);
	struct hyb_backend *b = hyb_backend_open(HYB_BACKEND_AUTO);

	CHECK(b && hyb_backend_kind(b) == HYB_BACKEND_LOCAL);
	hyb_backend_close(b);
	unsetenv("HYB_BACKEND");
	if (access("/dev/hybpool", F_OK) == 0)
		return;
	/* No module: kmod fails with the reason, AUTO falls back to local. */
	CHECK(hyb_backend_open(HYB_BACKEND_KMOD) == NULL);
	CHECK_MSG(strstr(hyb_last_error(), "hybpool module not loaded"), "message: %s",
		  hyb_last_error());
	b = hyb_backend_open(HYB_BACKEND_AUTO);
	CHECK(b && hyb_backend_kind(b) == HYB_BACKEND_LOCAL);
	hyb_backend_close(b);
}

/* -- local backend only --------------------------------------------------- */

static int sys_choice_is(const char *path, const char *const *words)
{
	char buf[256], *a, *z;
	FILE *f = fopen(path, "r");
	int hit = 0;

	if (!f)
		return 0;
	if (fgets(buf, sizeof(buf), f) && (a = strchr(buf, '[')) && (z = strchr(a, ']'))) {
		*z = 0;
		for (; *words; words++)
			hit |= !strcmp(a + 1, *words);
	}
	fclose(f);
	return hit;
}

static long long node0_free_hugepages(void)
{
	long long v = -1;
	FILE *f = fopen("/sys/devices/system/node/node0/hugepages/hugepages-2048kB/"
			"free_hugepages", "r");

	if (f) {
		if (fscanf(f, "%lld", &v) != 1)
			v = -1;
		fclose(f);
	}
	return v;
}

/* The memory the local backend picks is the documented order for this system. */
TEST(mempool_backing_local)
{
	static const char *const shmem_thp[] = { "always", "within_size", "advise", "force", 0 };
	static const char *const anon_thp[] = { "always", "madvise", 0 };
	/* 8 MiB each: 4 huge pages for the first pool, 8 for both (a page the test
	 * before gave back may not be free yet, so count, do not assume) */
	const long long free_huge = node0_free_hugepages();
	const int hugetlb = free_huge >= 4, hugetlb_s = free_huge >= 8;
	int shm = sys_choice_is("/sys/kernel/mm/transparent_hugepage/shmem_enabled", shmem_thp);
	int anon = sys_choice_is("/sys/kernel/mm/transparent_hugepage/enabled", anon_thp);
	struct hyb_backend *b;
	struct hyb_mempool *p, *s;
	struct hyb_mempool_info pi, si;
	uint32_t want_p, want_s;

	kind_of_test = HYB_BACKEND_LOCAL;
	b = bopen();
	CHECK_OK(hyb_mempool_create(b, "t-backing", 8 * MiB, 0, 0, 0, &p));
	CHECK_OK(hyb_mempool_create(b, "t-backing-s", 8 * MiB, 0, 0, HYB_MEMPOOL_SHARED, &s));
	pmap(p);
	pmap(s);
	pi = pinfo(p);
	si = pinfo(s);
	if (hugetlb)
		want_p = HYB_MEMPOOL_F_HUGETLB | HYB_MEMPOOL_F_SHARED;
	else if (shm)
		want_p = HYB_MEMPOOL_F_THP | HYB_MEMPOOL_F_SHARED;
	else
		want_p = anon ? HYB_MEMPOOL_F_THP : 0;
	if (hugetlb_s)
		want_s = HYB_MEMPOOL_F_HUGETLB | HYB_MEMPOOL_F_SHARED;
	else if (shm)
		want_s = HYB_MEMPOOL_F_THP | HYB_MEMPOOL_F_SHARED;
	else
		want_s = HYB_MEMPOOL_F_SHARED;
	pi.flags &= ~HYB_MEMPOOL_F_LOCKED;
	si.flags &= ~HYB_MEMPOOL_F_LOCKED;
	CHECK_MSG(pi.flags == want_p, "default pool: flags 0x%x, want 0x%x (node 0 had %lld free "
		  "huge pages)", pi.flags, want_p, free_huge);
	CHECK_MSG(si.flags == want_s, "shared pool: flags 0x%x, want 0x%x (node 0 had %lld free "
		  "huge pages)", si.flags, want_s, free_huge);
	if (hugetlb)
		CHECK_EQ_INT(pi.huge_bytes, pi.bytes);
	printf("    default pool: %s%s%s, %llu of %llu MiB in huge pages; shared pool: %llu MiB "
	       "huge\n", pi.flags & HYB_MEMPOOL_F_HUGETLB ? "hugetlb" : "",
	       pi.flags & HYB_MEMPOOL_F_THP ? "THP" : "", pi.flags & HYB_MEMPOOL_F_SHARED ?
	       " shared" : " private", (unsigned long long)(pi.huge_bytes >> 20),
	       (unsigned long long)(pi.bytes >> 20), (unsigned long long)(si.huge_bytes >> 20));
	hyb_mempool_close(s);
	hyb_mempool_close(p);
	hyb_backend_close(b);
}

/* Pages of [addr, addr + len) resident now (mincore: no fault, no zeroing). */
static uint64_t resident_pages(void *addr, uint64_t len)
{
	uint64_t n = len / 4096, r = 0;
	unsigned char *vec = malloc(n);

	CHECK(vec && !mincore(addr, len, vec));
	for (uint64_t i = 0; i < n; i++)
		r += vec[i] & 1;
	free(vec);
	return r;
}

/*
 * HYB_MEMPOOL_LAZY (a model image filled at once by its load): nothing is
 * faulted in (zeroed) at creation, a page appears when first written and
 * reads zero before; a plain pool is whole at creation. kmod ignores it.
 */
TEST(mempool_lazy_local)
{
	struct hyb_backend *b;
	struct hyb_mempool *p, *q;
	uint8_t *lz, *whole;
	size_t len;

	kind_of_test = HYB_BACKEND_LOCAL;
	b = bopen();
	CHECK_OK(hyb_mempool_create(b, "t-lazy", 64 * MiB, 0, 0, HYB_MEMPOOL_LAZY, &p));
	CHECK_OK(hyb_mempool_create(b, "t-whole", 64 * MiB, 0, 0, 0, &q));
	CHECK_OK(hyb_mempool_map(p, (void **)&lz, &len));
	CHECK_OK(hyb_mempool_map(q, (void **)&whole, &len));
	CHECK_EQ_INT(resident_pages(whole, 64 * MiB), 64 * MiB / 4096);
	CHECK_MSG(resident_pages(lz, 64 * MiB) == 0, "a lazy pool has %llu pages at creation",
		  (unsigned long long)resident_pages(lz, 64 * MiB));
	memset(lz + 8 * MiB, 0x5a, 4 * MiB);
	uint64_t r = resident_pages(lz, 64 * MiB);

	CHECK_MSG(r >= 4 * MiB / 4096 && r <= 8 * MiB / 4096, "%llu pages after writing 4 MiB",
		  (unsigned long long)r);
	for (uint64_t i = 0; i < 64 * MiB; i += 4093)
		CHECK(lz[i] == (i >= 8 * MiB && i < 12 * MiB ? 0x5a : 0));
	struct hyb_mempool *bad = NULL;

	CHECK(hyb_mempool_create(b, "t-bad", 2 * MiB, 0, 0, 1u << 7, &bad) == -EINVAL && !bad);
	hyb_mempool_close(p);
	hyb_mempool_close(q);
	hyb_backend_close(b);
}

/* Without CAP_IPC_LOCK and with a small RLIMIT_MEMLOCK: one warning line, no failure. */
TEST(mempool_mlock_fallback_local)
{
	struct __user_cap_header_struct hdr = { _LINUX_CAPABILITY_VERSION_3, 0 };
	struct __user_cap_data_struct cap[2];
	struct rlimit rl = { MiB, MiB };
	char path[300], buf[1024];
	struct hyb_backend *b;
	struct hyb_mempool *p;
	struct hyb_mempool_info pi;
	int fd, lines = 0;
	ssize_t n;

	CHECK(syscall(SYS_capget, &hdr, cap) == 0);
	cap[0].effective &= ~(1U << CAP_IPC_LOCK);
	CHECK(syscall(SYS_capset, &hdr, cap) == 0);
	CHECK(setrlimit(RLIMIT_MEMLOCK, &rl) == 0);
	snprintf(path, sizeof(path), "%s/stderr", hyb_test_tmpdir());
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	CHECK(fd >= 0);
	fflush(stderr);
	int saved = dup(2);

	dup2(fd, 2);
	kind_of_test = HYB_BACKEND_LOCAL;
	b = bopen();
	CHECK_OK(hyb_mempool_create(b, "t-nolock", 8 * MiB, 0, 0, 0, &p));
	fflush(stderr);
	dup2(saved, 2);
	pi = pinfo(p);
	n = pread(fd, buf, sizeof(buf) - 1, 0);
	buf[n > 0 ? n : 0] = 0;
	for (char *c = buf; *c; c++)
		lines += *c == '\n';
	if (pi.flags & HYB_MEMPOOL_F_HUGETLB) {
		CHECK_EQ_INT(lines, 0);	/* huge pages are never swapped: nothing to lock */
	} else {
		CHECK_MSG(!(pi.flags & HYB_MEMPOOL_F_LOCKED), "locked past RLIMIT_MEMLOCK?");
		CHECK_MSG(lines == 1 && strstr(buf, "mlock") && strstr(buf, "RLIMIT_MEMLOCK") &&
			  strstr(buf, "t-nolock"), "warning: '%s'", buf);
	}
	CHECK(all_zero(pmap(p), 8 * MiB));
	hyb_mempool_close(p);
	hyb_backend_close(b);
	close(fd);
}

/* -- reload queue ----------------------------------------------------------- */

#define QID 3

static struct hyb_rq_req req(uint16_t op, uint8_t prio, uint32_t pool, uint64_t off, uint64_t len,
			     uint64_t tag)
{
	struct hyb_rq_req r;

	memset(&r, 0, sizeof(r));
	r.op = op;
	r.prio = prio;
	r.pool_id = pool;
	r.pool_off = off;
	r.len = len;
	r.tag = tag;
	r.layer = 7;
	r.group = 9;
	return r;
}

static int readable(int fd, int ms)
{
	struct pollfd pfd = { .fd = fd, .events = POLLIN };

	return poll(&pfd, 1, ms) == 1;
}

/* Single thread as daemon and client: priorities, ids, eventfds, statuses. */
BOTH(rq_priority_order)
{
	struct hyb_backend *b = bopen();
	struct hyb_rq *d, *c;
	struct hyb_rq_req r[4], f[8];
	struct hyb_rq_done dn[4];
	struct hyb_rq_cqe e[8];
	struct hyb_rq_stats st;
	int dfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC), n;

	CHECK(dfd >= 0);
	CHECK_OK(hyb_rq_attach_daemon(b, QID, dfd, &d));
	CHECK_EQ_INT(hyb_rq_fd(d), dfd);
	CHECK_OK(hyb_rq_attach_client(b, QID, HYB_RQ_EVENTFD_NEW, &c));
	CHECK(hyb_rq_fd(c) >= 0 && hyb_rq_client_id(c) > 0);
	CHECK_EQ_INT(hyb_rq_fetch(d, f, 8), 0);
	CHECK_EQ_INT(hyb_rq_wait_work(d, 1000000), 0);	/* nothing yet: times out */
	r[0] = req(HYB_RQ_NOP, HYB_RQ_LOW, 0, 0, 0, 10);
	r[1] = req(HYB_RQ_NOP, HYB_RQ_NORMAL, 0, 0, 0, 11);
	r[2] = req(HYB_RQ_NOP, HYB_RQ_CRITICAL, 0, 0, 0, 12);
	r[3] = req(HYB_RQ_NOP, HYB_RQ_HIGH, 0, 0, 0, 13);
	CHECK_OK(hyb_rq_submit(c, r, 4));
	CHECK_MSG(readable(dfd, 1000), "the daemon's eventfd did not fire on submit");
	CHECK_EQ_INT(hyb_rq_wait_work(d, 1000000000), 1);
	CHECK_EQ_INT(readable(dfd, 0), 0);	/* wait_work consumed the count */
	CHECK_EQ_INT(hyb_rq_fetch(d, f, 8), 4);
	CHECK_EQ_INT(f[0].tag, 12);
	CHECK_EQ_INT(f[1].tag, 13);
	CHECK_EQ_INT(f[2].tag, 11);
	CHECK_EQ_INT(f[3].tag, 10);
	for (int i = 0; i < 4; i++) {
		CHECK(f[i].id != 0);
		CHECK_EQ_INT(f[i].client_id, hyb_rq_client_id(c));
		CHECK_EQ_INT(f[i].layer, 7);
		CHECK_EQ_INT(f[i].group, 9);
		for (int j = 0; j < i; j++)
			CHECK(f[i].id != f[j].id);
		dn[i].id = f[i].id;
		dn[i].status = f[i].tag == 11 ? -EIO : 0;
		dn[i].reserved = 0;
	}
	CHECK_EQ_INT(hyb_rq_reap(c, e, 8, 0, 0), 0);	/* nothing done yet */
	hyb_rq_stats(b, QID, &st);
	CHECK_EQ_INT(st.in_service, 4);
	CHECK_EQ_INT(st.queued, 0);
	/* All or nothing: one bad id, nothing completes. */
	dn[3].id ^= 1ULL << 40;
	CHECK_FAILS(hyb_rq_complete(d, dn, 4), -ENOENT, "not in service");
	dn[3].id = f[3].id;
	CHECK_EQ_INT(readable(hyb_rq_fd(c), 0), 0);
	CHECK_OK(hyb_rq_complete(d, dn, 4));
	CHECK_FAILS(hyb_rq_complete(d, dn, 1), -ENOENT, "not in service");	/* twice */
	CHECK_MSG(readable(hyb_rq_fd(c), 1000), "the client's eventfd did not fire");
	n = hyb_rq_reap(c, e, 8, 0, 0);
	CHECK_EQ_INT(n, 4);
	for (int i = 0; i < 4; i++) {
		int k = 0;

		while (k < 4 && f[k].id != e[i].id)
			k++;
		CHECK(k < 4);
		CHECK_EQ_INT(e[i].tag, f[k].tag);
		CHECK_EQ_INT(e[i].status, f[k].tag == 11 ? -EIO : 0);
		CHECK(e[i].wait_ns < 10000000000ULL && e[i].service_ns < 10000000000ULL);
	}
	CHECK_OK(hyb_rq_stats(b, QID, &st));
	CHECK_EQ_INT(st.live, 1);
	CHECK_EQ_INT(st.daemon_pid, getpid());
	CHECK_EQ_INT(st.clients, 1);
	CHECK_EQ_INT(st.submitted, 4);
	CHECK_EQ_INT(st.completed, 3);
	CHECK_EQ_INT(st.failed, 1);
	CHECK_EQ_INT(st.in_flight, 0);
	CHECK_EQ_INT(st.queue_wait.count, 4);
	CHECK_EQ_INT(st.service.count, 4);
	CHECK_EQ_INT(st.stalls, 0);
	hyb_rq_close(c);
	hyb_rq_close(d);
	close(dfd);
	CHECK_OK(hyb_rq_stats(b, QID, &st));
	CHECK_EQ_INT(st.live, 0);
	hyb_backend_close(b);
}

struct daemon_ctx {
	struct hyb_backend *b;
	atomic_int attached;	/* 1 attached, -1 failed */
	atomic_int stop;
	int exit_after;		/* > 0: fetch this many, then exit without closing */
	int served;
	_Atomic double exit_time;	/* when the dying daemon returned */
};

/* A daemon thread: serves until stop (status -EIO for tags with bit 0 set). */
static void *daemon_main(void *arg)
{
	struct daemon_ctx *x = arg;
	struct hyb_rq_req f[64];
	struct hyb_rq_done dn[64];
	struct hyb_rq *d;
	int n, got = 0;

	if (hyb_rq_attach_daemon(x->b, QID, HYB_RQ_EVENTFD_NEW, &d)) {
		atomic_store(&x->attached, -1);
		return NULL;
	}
	atomic_store(&x->attached, 1);
	while (!atomic_load(&x->stop)) {
		if (hyb_rq_wait_work(d, 20000000) < 0)
			break;
		if (x->exit_after) {
			n = hyb_rq_fetch(d, f, (unsigned int)(x->exit_after - got));
			got += n > 0 ? n : 0;
			if (got >= x->exit_after) {
				usleep(100000);	/* let the app block on its reap */
				atomic_store(&x->exit_time, now_s());
				return NULL;	/* the thread dies holding the role */
			}
			continue;
		}
		while ((n = hyb_rq_fetch(d, f, 64)) > 0) {
			for (int i = 0; i < n; i++) {
				dn[i].id = f[i].id;
				dn[i].status = (f[i].tag & 1) ? -EIO : 0;
				dn[i].reserved = 0;
			}
			if (hyb_rq_complete(d, dn, (unsigned int)n))
				break;
			x->served += n;
		}
	}
	hyb_rq_close(d);
	return NULL;
}

static void daemon_start(struct daemon_ctx *x, pthread_t *t)
{
	CHECK(pthread_create(t, NULL, daemon_main, x) == 0);
	while (!atomic_load(&x->attached))
		usleep(1000);
	CHECK_MSG(atomic_load(&x->attached) == 1, "daemon attach: %s", hyb_last_error());
}

/* The daemon learns who sent each request (hybd's `clients` policy reads it). */
BOTH(rq_fetch_from_names_the_sender)
{
	struct hyb_backend *b = bopen();
	struct hyb_rq *d, *c;
	struct hyb_rq_req r[2], f[4];
	struct hyb_rq_sender s[4];
	struct hyb_rq_done dn[2];
	struct hyb_rq_cqe e[4];
	struct hyb_mempool *p;
	int got = 0, n;

	CHECK_OK(hyb_mempool_create(b, "t-from", 2 * MiB, 0, 0, 0, &p));
	CHECK_OK(hyb_rq_attach_daemon(b, QID, HYB_RQ_EVENTFD_NEW, &d));
	CHECK_OK(hyb_rq_attach_client(b, QID, HYB_RQ_EVENTFD_NONE, &c));
	r[0] = req(HYB_RQ_NOP, HYB_RQ_NORMAL, 0, 0, 0, 20);
	r[1] = req(HYB_RQ_LOAD, HYB_RQ_HIGH, hyb_mempool_id(p), 0, 4096, 21);	/* our own pool */
	CHECK_OK(hyb_rq_submit(c, r, 2));
	memset(s, 0xff, sizeof(s));
	CHECK_EQ_INT(hyb_rq_fetch_from(d, f, s, 4), 2);
	for (int i = 0; i < 2; i++) {
		CHECK_EQ_INT(s[i].uid, (uint32_t)geteuid());
		CHECK_EQ_INT(s[i].gid, (uint32_t)getegid());
		CHECK_EQ_INT(s[i].pid, (int32_t)getpid());
		CHECK_EQ_INT(s[i].reserved, 0);
		CHECK_EQ_INT(f[i].client_id, hyb_rq_client_id(c));
		dn[i] = (struct hyb_rq_done){ .id = f[i].id };
	}
	CHECK_OK(hyb_rq_complete(d, dn, 2));
	while (got < 2) {
		n = hyb_rq_reap(c, e + got, 4 - got, 2 - got, 5000000000ULL);
		CHECK_MSG(n > 0, "reap: %d %s", n, hyb_last_error());
		got += n;
	}
	hyb_rq_close(c);
	hyb_rq_close(d);
	hyb_mempool_close(p);
	hyb_backend_close(b);
}

BOTH(rq_round_trip)
{
	struct hyb_backend *b = bopen();
	struct daemon_ctx x = { .b = b };
	struct hyb_mempool *p;
	struct hyb_rq *c;
	struct hyb_rq_req r[3];
	struct hyb_rq_cqe e[8];
	struct hyb_rq_stats st;
	pthread_t t;
	uint32_t pid;
	int got = 0, n, fails = 0, stalls_max = 0;

	CHECK_OK(hyb_mempool_create(b, "t-rq", 4 * MiB, 0, 0, 0, &p));
	pid = hyb_mempool_id(p);
	daemon_start(&x, &t);
	CHECK_OK(hyb_rq_attach_client(b, QID, HYB_RQ_EVENTFD_NONE, &c));
	CHECK_EQ_INT(hyb_rq_fd(c), -1);
	r[0] = req(HYB_RQ_NOP, HYB_RQ_NORMAL, 0, 0, 0, 2);
	r[1] = req(HYB_RQ_LOAD, HYB_RQ_HIGH, pid, 2 * MiB, 2 * MiB, 3);
	r[2] = req(HYB_RQ_UPLOAD, HYB_RQ_CRITICAL, pid, 0, 4096, 4);
	CHECK_OK(hyb_rq_submit(c, r, 3));
	while (got < 3) {
		n = hyb_rq_reap(c, e + got, 8 - got, 3 - got, 5000000000ULL);
		CHECK_MSG(n > 0, "reap: %d %s", n, hyb_last_error());
		got += n;
	}
	for (int i = 0; i < 3; i++)
		CHECK_EQ_INT(e[i].status, (e[i].tag & 1) ? -EIO : 0);
	CHECK_EQ_INT(e[0].tag + e[1].tag + e[2].tag, 9);
	CHECK_EQ_INT(pinfo(p).reloads, 2);

	/* Many round trips, one at a time: a blocked reap is a stall. */
	for (int i = 0; i < 300; i++) {
		r[0] = req(HYB_RQ_NOP, HYB_RQ_NORMAL, 0, 0, 0, (uint64_t)i << 1);
		CHECK_OK(hyb_rq_submit(c, r, 1));
		n = hyb_rq_reap(c, e, 1, 1, 5000000000ULL);
		CHECK_MSG(n == 1, "round trip %d: reap %d: %s", i, n, hyb_last_error());
		CHECK_EQ_INT(e[0].tag, (uint64_t)i << 1);
		fails += e[0].status != 0;
		stalls_max++;
	}
	CHECK_EQ_INT(fails, 0);
	CHECK_OK(hyb_rq_stats(b, QID, &st));
	CHECK_EQ_INT(st.submitted, 303);
	CHECK_EQ_INT(st.completed, 302);
	CHECK_EQ_INT(st.failed, 1);
	CHECK_EQ_INT(st.in_flight, 0);
	CHECK_EQ_INT(st.queue_wait.count, 303);
	CHECK(st.stalls >= 1 && st.stalls <= (uint64_t)stalls_max + 1);
	CHECK_EQ_INT(st.stall.count, st.stalls);
	CHECK(st.stall.min_ns <= st.stall.p50_ns && st.stall.p50_ns <= st.stall.p99_ns &&
	      st.stall.p99_ns <= st.stall.max_ns);
	CHECK(st.queue_wait.p50_ns <= st.queue_wait.p99_ns);
	CHECK(st.service.sum_ns >= st.service.count * st.service.min_ns);
	printf("    300 round trips: stall p50 %.1f us p99 %.1f us (%llu stalls)\n",
	       st.stall.p50_ns / 1e3, st.stall.p99_ns / 1e3, (unsigned long long)st.stalls);
	atomic_store(&x.stop, 1);
	pthread_join(t, NULL);
	hyb_rq_close(c);
	hyb_mempool_close(p);
	hyb_backend_close(b);
}

BOTH(rq_nonblocking)
{
	struct hyb_backend *b = bopen();
	struct hyb_rq *d, *c;
	struct hyb_rq_req r[HYB_RQ_MAX_BATCH], f[HYB_RQ_MAX_BATCH];
	struct hyb_rq_done dn[HYB_RQ_MAX_BATCH];
	struct hyb_rq_cqe e[HYB_RQ_MAX_BATCH];
	struct hyb_rq_stats st;
	double t0, worst = 0;
	int n;

	CHECK_OK(hyb_rq_attach_daemon(b, QID, HYB_RQ_EVENTFD_NEW, &d));
	CHECK_OK(hyb_rq_attach_client(b, QID, HYB_RQ_EVENTFD_NONE, &c));
	for (int i = 0; i < HYB_RQ_MAX_BATCH; i++)
		r[i] = req(HYB_RQ_NOP, HYB_RQ_NORMAL, 0, 0, 0, (uint64_t)i);
	/* The daemon serves nothing: the client fills its quota, then gets EAGAIN at once. */
	for (int i = 0; i < HYB_RQ_CLIENT_MAX / HYB_RQ_MAX_BATCH; i++) {
		t0 = now_s();
		CHECK_OK(hyb_rq_submit(c, r, HYB_RQ_MAX_BATCH));
		worst = now_s() - t0 > worst ? now_s() - t0 : worst;
	}
	t0 = now_s();
	CHECK_FAILS(hyb_rq_submit(c, r, 1), -EAGAIN, "full");
	CHECK(now_s() - t0 < 0.5);
	CHECK_MSG(worst < 0.5, "a submit took %.1f ms", worst * 1e3);
	/* A reap that must wait times out, and the wait is a stall. */
	t0 = now_s();
	CHECK_FAILS(hyb_rq_reap(c, e, 4, 1, 30000000), -ETIMEDOUT, "timed out");
	CHECK(now_s() - t0 >= 0.025);
	CHECK_OK(hyb_rq_stats(b, QID, &st));
	CHECK_EQ_INT(st.stalls, 1);
	CHECK_EQ_INT(st.stall.count, 1);
	CHECK_MSG(st.stall.min_ns >= 25000000, "stall %llu ns",
		  (unsigned long long)st.stall.min_ns);
	CHECK_EQ_INT(st.queued, HYB_RQ_CLIENT_MAX);
	/* Serve one batch; the client gets exactly those. */
	n = hyb_rq_fetch(d, f, HYB_RQ_MAX_BATCH);
	CHECK_EQ_INT(n, HYB_RQ_MAX_BATCH);
	for (int i = 0; i < n; i++) {
		dn[i].id = f[i].id;
		dn[i].status = 0;
		dn[i].reserved = 0;
	}
	CHECK_OK(hyb_rq_complete(d, dn, (unsigned int)n));
	CHECK_EQ_INT(hyb_rq_reap(c, e, HYB_RQ_MAX_BATCH, HYB_RQ_MAX_BATCH, 0), HYB_RQ_MAX_BATCH);
	CHECK_OK(hyb_rq_submit(c, r, 1));	/* room again */
	/* Fetch some, then the client leaves: queued ones are dropped, fetched ones orphaned. */
	CHECK_EQ_INT(hyb_rq_fetch(d, f, 10), 10);
	hyb_rq_close(c);
	CHECK_OK(hyb_rq_stats(b, QID, &st));
	CHECK_EQ_INT(st.clients, 0);
	CHECK_EQ_INT(st.queued, 0);
	CHECK_EQ_INT(st.in_service, 10);
	for (int i = 0; i < 10; i++) {
		dn[i].id = f[i].id;
		dn[i].status = 0;
	}
	CHECK_OK(hyb_rq_complete(d, dn, 10));	/* orphans complete quietly */
	CHECK_OK(hyb_rq_stats(b, QID, &st));
	CHECK_EQ_INT(st.in_flight, 0);
	CHECK_EQ_INT(st.submitted, st.completed + st.failed);
	CHECK_EQ_INT(binfo(b).nr_requests, 0);
	hyb_rq_close(d);
	hyb_backend_close(b);
}

/* The daemon's thread dies holding requests: every waiter wakes with -EPIPE. */
BOTH(rq_daemon_death)
{
	struct hyb_backend *b = bopen();
	struct daemon_ctx x = { .b = b, .exit_after = 3 };
	struct hyb_rq *c, *d2;
	struct hyb_rq_req r[8];
	struct hyb_rq_cqe e[8];
	struct hyb_rq_stats st;
	pthread_t t;
	int got = 0, n;
	double t0, woke;

	daemon_start(&x, &t);
	CHECK_OK(hyb_rq_attach_client(b, QID, HYB_RQ_EVENTFD_NEW, &c));
	for (int i = 0; i < 8; i++)
		r[i] = req(HYB_RQ_NOP, HYB_RQ_NORMAL, 0, 0, 0, (uint64_t)(100 + i));
	CHECK_OK(hyb_rq_submit(c, r, 8));
	t0 = now_s();
	while (got < 8) {
		n = hyb_rq_reap(c, e + got, 8 - got, 8 - got, 10000000000ULL);
		if (n <= 0)
			break;
		got += n;
	}
	woke = now_s();
	CHECK_EQ_INT(got, 8);
	for (int i = 0; i < 8; i++)
		CHECK_MSG(e[i].status == -EPIPE, "request %d: status %d", i, e[i].status);
	CHECK(atomic_load(&x.exit_time) > t0);
	woke -= atomic_load(&x.exit_time);
	CHECK_MSG(woke < 2.0, "the app woke %.2f s after the daemon thread exited", woke);
	pthread_join(t, NULL);
	CHECK_FAILS(hyb_rq_submit(c, r, 1), -EPIPE, "gone");
	CHECK_FAILS(hyb_rq_reap(c, e, 1, 1, 1000000000ULL), -EPIPE, "gone");
	CHECK_OK(hyb_rq_stats(b, QID, &st));
	CHECK_EQ_INT(st.live, 0);
	/* The queue is free for the next daemon. */
	CHECK_OK(hyb_rq_attach_daemon(b, QID, HYB_RQ_EVENTFD_NEW, &d2));
	hyb_rq_close(d2);
	hyb_rq_close(c);
	printf("    daemon thread exited with 3 in service and 5 queued: all 8 -EPIPE, the app "
	       "woke %.2f ms later\n", woke * 1e3);
	hyb_backend_close(b);
}

/* A daemon process is SIGKILLed while an app waits (backends that span processes). */
BOTH(rq_daemon_killed)
{
	struct hyb_backend *b = bopen();
	struct hyb_rq *c;
	struct hyb_rq_req r[4];
	struct hyb_rq_cqe e[4];
	int ready[2], st, got = 0, n;
	pid_t pid;
	char ch;
	double t0;

	if (!(binfo(b).caps & HYB_BACKEND_CROSS_PROCESS))
		SKIP("local queues live in one process: their daemon is a thread "
		     "(rq_daemon_death_local)");
	CHECK(!pipe(ready));
	fflush(NULL);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		struct hyb_backend *db = hyb_backend_open(kind_of_test);
		struct hyb_rq *d;
		struct hyb_rq_req f[4];
		int k = 0;

		if (!db || hyb_rq_attach_daemon(db, QID, HYB_RQ_EVENTFD_NEW, &d))
			_exit(1);
		if (write(ready[1], "a", 1) != 1)
			_exit(2);
		while (k < 2) {
			hyb_rq_wait_work(d, 100000000);
			n = hyb_rq_fetch(d, f, (unsigned int)(2 - k));
			k += n > 0 ? n : 0;
		}
		if (write(ready[1], "f", 1) != 1)
			_exit(3);
		pause();
		_exit(0);
	}
	CHECK(read(ready[0], &ch, 1) == 1 && ch == 'a');
	CHECK_OK(hyb_rq_attach_client(b, QID, HYB_RQ_EVENTFD_NEW, &c));
	for (int i = 0; i < 4; i++)
		r[i] = req(HYB_RQ_NOP, HYB_RQ_NORMAL, 0, 0, 0, (uint64_t)i);
	CHECK_OK(hyb_rq_submit(c, r, 4));
	CHECK(read(ready[0], &ch, 1) == 1 && ch == 'f');
	kill(pid, SIGKILL);
	t0 = now_s();
	while (got < 4 && (n = hyb_rq_reap(c, e + got, 4 - got, 4 - got, 5000000000ULL)) > 0)
		got += n;
	CHECK_EQ_INT(got, 4);
	for (int i = 0; i < 4; i++)
		CHECK_EQ_INT(e[i].status, -EPIPE);
	CHECK(now_s() - t0 < 5.0);
	waitpid(pid, &st, 0);
	CHECK(WIFSIGNALED(st));
	hyb_rq_close(c);
	hyb_backend_close(b);
}

BOTH(rq_bad_args)
{
	struct hyb_backend *b = bopen();
	struct hyb_mempool *p;
	struct hyb_rq *d, *c, *x;
	struct hyb_rq_req r[HYB_RQ_MAX_BATCH + 1], f[4];
	struct hyb_rq_done dn;
	struct hyb_rq_cqe e[4];
	struct hyb_rq_stats st;
	uint32_t pid;

	CHECK_OK(hyb_mempool_create(b, "t-rqbad", 2 * MiB, 0, 0, 0, &p));
	pid = hyb_mempool_id(p);
	CHECK_FAILS(hyb_rq_attach_daemon(b, HYB_RQ_MAX_QUEUES, HYB_RQ_EVENTFD_NEW, &d), -EINVAL,
		    "queue 16");
	CHECK_FAILS(hyb_rq_attach_daemon(b, QID, HYB_RQ_EVENTFD_NONE, &d), -EINVAL, "eventfd");
	CHECK_FAILS(hyb_rq_attach_daemon(b, QID, -7, &d), -EINVAL, "eventfd");
	CHECK_FAILS(hyb_rq_attach_client(b, QID, HYB_RQ_EVENTFD_NONE, &c), -ENOTCONN,
		    "no daemon");
	CHECK_OK(hyb_rq_attach_daemon(b, QID, HYB_RQ_EVENTFD_NEW, &d));
	CHECK_FAILS(hyb_rq_attach_daemon(b, QID, HYB_RQ_EVENTFD_NEW, &x), -EBUSY, "already");
	CHECK_OK(hyb_rq_attach_client(b, QID, HYB_RQ_EVENTFD_NONE, &c));
	for (int i = 0; i <= HYB_RQ_MAX_BATCH; i++)
		r[i] = req(HYB_RQ_NOP, HYB_RQ_NORMAL, 0, 0, 0, 0);
	CHECK_FAILS(hyb_rq_submit(c, r, 0), -EINVAL, "batch");
	CHECK_FAILS(hyb_rq_submit(c, r, HYB_RQ_MAX_BATCH + 1), -EINVAL, "batch");
	CHECK_FAILS(hyb_rq_submit(c, NULL, 1), -EINVAL, "NULL");
	r[0] = req(9, HYB_RQ_NORMAL, 0, 0, 0, 0);
	CHECK_FAILS(hyb_rq_submit(c, r, 1), -EINVAL, "unknown op");
	r[0] = req(HYB_RQ_NOP, 4, 0, 0, 0, 0);
	CHECK_FAILS(hyb_rq_submit(c, r, 1), -EINVAL, "priority");
	r[0] = req(HYB_RQ_NOP, HYB_RQ_NORMAL, pid, 0, 0, 0);
	CHECK_FAILS(hyb_rq_submit(c, r, 1), -EINVAL, "NOP");
	r[0] = req(HYB_RQ_NOP, HYB_RQ_NORMAL, 0, 0, 0, 0);
	r[0].id = 5;
	CHECK_FAILS(hyb_rq_submit(c, r, 1), -EINVAL, "must be 0");
	r[0] = req(HYB_RQ_LOAD, HYB_RQ_NORMAL, 999999, 0, 4096, 0);
	CHECK_FAILS(hyb_rq_submit(c, r, 1), -ENOENT, "does not exist");
	r[0] = req(HYB_RQ_LOAD, HYB_RQ_NORMAL, pid, 2 * MiB - 4096, 8192, 0);
	CHECK_FAILS(hyb_rq_submit(c, r, 1), -EINVAL, "outside");
	r[0] = req(HYB_RQ_LOAD, HYB_RQ_NORMAL, pid, 0, 0, 0);
	CHECK_FAILS(hyb_rq_submit(c, r, 1), -EINVAL, "empty");
	r[0] = req(HYB_RQ_LOAD, HYB_RQ_NORMAL, pid, UINT64_MAX - 10, 100, 0);
	CHECK_FAILS(hyb_rq_submit(c, r, 1), -EINVAL, "overflow");
	/* One bad request spoils the batch: nothing was queued. */
	r[0] = req(HYB_RQ_NOP, HYB_RQ_NORMAL, 0, 0, 0, 0);
	r[1] = req(HYB_RQ_LOAD, HYB_RQ_NORMAL, pid, 4 * MiB, 1, 0);
	CHECK_ERR(hyb_rq_submit(c, r, 2), -EINVAL);
	CHECK_OK(hyb_rq_stats(b, QID, &st));
	CHECK_EQ_INT(st.submitted, 0);
	CHECK_FAILS(hyb_rq_fetch(c, f, 4), -EPERM, "only the daemon");
	CHECK_FAILS(hyb_rq_complete(c, &dn, 1), -EPERM, "only the daemon");
	CHECK_FAILS(hyb_rq_submit(d, r, 1), -EPERM, "only the client");
	CHECK_FAILS(hyb_rq_reap(d, e, 4, 0, 0), -EPERM, "only the client");
	CHECK_FAILS(hyb_rq_fetch(d, f, 0), -EINVAL, "batch");
	dn.id = 12345;
	dn.status = 0;
	dn.reserved = 0;
	CHECK_FAILS(hyb_rq_complete(d, &dn, 1), -ENOENT, "not in service");
	dn.status = 1;
	CHECK_FAILS(hyb_rq_complete(d, &dn, 1), -EINVAL, "status");
	dn.status = -5000;
	CHECK_FAILS(hyb_rq_complete(d, &dn, 1), -EINVAL, "status");
	dn.status = 0;
	dn.reserved = 1;
	CHECK_FAILS(hyb_rq_complete(d, &dn, 1), -EINVAL, "reserved");
	CHECK_FAILS(hyb_rq_reap(c, e, 0, 0, 0), -EINVAL, "batch");
	CHECK_FAILS(hyb_rq_reap(c, e, 2, 3, 0), -EINVAL, "min 3");
	CHECK_FAILS(hyb_rq_stats(b, HYB_RQ_MAX_QUEUES, &st), -EINVAL, "queue 16");
	CHECK_FAILS(hyb_rq_submit(NULL, r, 1), -EINVAL, "NULL");
	hyb_rq_close(c);
	hyb_rq_close(d);
	hyb_mempool_close(p);
	hyb_backend_close(b);
}

/* -- hybctl -------------------------------------------------------------------- */

static int run_capture(const char *cmd, char *out, size_t len)
{
	FILE *f = popen(cmd, "r");
	size_t n;
	int st;

	CHECK_MSG(f, "popen %s", cmd);
	n = fread(out, 1, len - 1, f);
	out[n] = 0;
	st = pclose(f);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

TEST(mempool_hybctl_pools_no_module)
{
	char out[4096];
	int rc;

	if (access("build/hybctl", X_OK))
		SKIP("build/hybctl not built (run from the repository root after make)");
	if (access("/dev/hybpool", F_OK) == 0)
		SKIP("/dev/hybpool exists: the no-module message cannot be checked");
	rc = run_capture("build/hybctl pools 2>&1", out, sizeof(out));
	CHECK_EQ_INT(rc, 1);
	CHECK_MSG(strstr(out, "hybpool module not loaded") &&
		  strstr(out, "embedded mode has no shared pools to show"), "output: %s", out);
	CHECK_MSG(!strchr(out, '\n') || strchr(out, '\n') == out + strlen(out) - 1,
		  "want one line, got: %s", out);
	rc = run_capture("build/hybctl stalls 2>&1", out, sizeof(out));
	CHECK_EQ_INT(rc, 1);
	CHECK(strstr(out, "hybpool module not loaded"));
	rc = run_capture("build/hybctl pools --backend local --json", out, sizeof(out));
	CHECK_EQ_INT(rc, 0);
	CHECK(strstr(out, "\"backend\": \"local\""));
	rc = run_capture("build/hybctl pools --frobnicate 2>&1", out, sizeof(out));
	CHECK_EQ_INT(rc, 2);
}

TEST(mempool_hybctl_numa_json)
{
	char out[256];
	int rc;

	if (access("build/hybctl", X_OK))
		SKIP("build/hybctl not built (run from the repository root after make)");
	rc = run_capture("build/hybctl numa --json | python3 -c 'import json,sys; "
			 "d = json.load(sys.stdin); "
			 "assert d[\"nodes\"] and \"cpus\" in d[\"nodes\"][0]; "
			 "assert \"recommended\" in d; print(\"ok\")' 2>&1", out, sizeof(out));
	CHECK_MSG(rc == 0 && !strcmp(out, "ok\n"), "rc %d: %s", rc, out);
	rc = run_capture("build/hybctl stalls --backend local --json | python3 -c 'import json,"
			 "sys; d = json.load(sys.stdin); assert len(d[\"queues\"]) == 16; "
			 "print(\"ok\")' 2>&1", out, sizeof(out));
	CHECK_MSG(rc == 0 && !strcmp(out, "ok\n"), "rc %d: %s", rc, out);
	rc = run_capture("build/hybctl pools --backend local --json | python3 -c 'import json,"
			 "sys; json.load(sys.stdin); print(\"ok\")' 2>&1", out, sizeof(out));
	CHECK_MSG(rc == 0 && !strcmp(out, "ok\n"), "rc %d: %s", rc, out);
	/* A probe pool per node: its pages are counted on the node it was made on. */
	rc = run_capture("build/hybctl numa --backend local --probe 8 --json | python3 -c "
			 "'import json,sys; d = json.load(sys.stdin); p = d[\"pools\"]; "
			 "assert len(p) == len([n for n in d[\"nodes\"] if n[\"mem_bytes\"] > 0]); "
			 "assert all(x[\"bytes_on_node\"][str(x[\"node\"])] == 8 << 20 for x in p); "
			 "print(\"ok\")' 2>&1", out, sizeof(out));
	CHECK_MSG(rc == 0 && !strcmp(out, "ok\n"), "probe: rc %d: %s", rc, out);
	rc = run_capture("build/hybctl numa --node 0 2>&1", out, sizeof(out));
	CHECK_MSG(rc == 2, "numa --node without --move: rc %d: %s", rc, out);
}
