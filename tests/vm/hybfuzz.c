// SPDX-License-Identifier: MIT
/*
 * hybfuzz: randomized attack on /dev/hybpool for a fixed time, run inside
 * the VM bench. Worker processes issue ioctls with valid and broken numbers,
 * sizes, flags, values, pointers (NULL, kernel, unmapped, crossing into a
 * guard page, read-only pool mappings) and fds; map, split, protect, advise,
 * remap and unmap pools; fork children that inherit all of it; and get
 * SIGKILLed at random by a supervisor that starts new ones. The kernel must
 * survive with nothing leaked: at the end every pool, request and queue is
 * gone (checked here) and the kernel log is clean (checked by the harness).
 *
 *   hybfuzz [seconds [seed]]
 */
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include "hybvm.h"

#define MiB (1ULL << 20)
#define NWORKERS 3
#define ARENA_PAGES 3

static uint64_t rs;
static unsigned char *arena;	/* two usable pages, then a PROT_NONE guard */
static void *unmapped;
static sigjmp_buf jb;
static volatile sig_atomic_t guarded;
static uint64_t n_ops, n_ok, n_sig, n_err[160];
/* Totals across workers, killed ones included: ok per ioctl nr, then these. */
enum { C_MMAP_OK = 32, C_OPS, C_SIG, C_FORK, C_N };
static uint64_t *counts;

static void count(int i)
{
	__atomic_fetch_add(&counts[i], 1, __ATOMIC_RELAXED);
}

static uint64_t rnd(void)
{
	rs ^= rs << 13;
	rs ^= rs >> 7;
	rs ^= rs << 17;
	return rs;
}

static uint64_t pick(uint64_t n)
{
	return n ? rnd() % n : 0;
}

static int chance(int pct)
{
	return (int)pick(100) < pct;
}

static uint64_t interesting(void)
{
	static const uint64_t v[] = {
		0, 1, 2, 7, 8, 16, 63, 64, 255, 256, 257, 4095, 4096, 4097,
		(2 * MiB) - 1, 2 * MiB, (2 * MiB) + 1, 1ULL << 30, 1ULL << 40, (1ULL << 40) + 1,
		1ULL << 63, 0x7fffffff, 0xffffffff, 0x100000000ULL, UINT64_MAX, UINT64_MAX - 1,
		(uint64_t)-4095, (uint64_t)-4096,
	};

	return chance(80) ? v[pick(sizeof(v) / sizeof(v[0]))] : rnd();
}

/* -- what a worker holds ------------------------------------------------ */

struct map {
	unsigned char *p;
	size_t len;
	int prot;
};

static int dev[4], role[4], efd[2], nullfd;	/* role: 0 none, 1 daemon, 2 client */
static uint32_t pools[16];
static int npools;
static struct map maps[16];
static int nmaps;
static uint64_t ids[64];
static int nids;

static void on_fault(int sig)
{
	(void)sig;
	if (!guarded) {
		signal(sig, SIG_DFL);
		raise(sig);
	}
	n_sig++;
	count(C_SIG);
	siglongjmp(jb, 1);
}

static void *rand_ptr(size_t want)
{
	switch (pick(10)) {
	case 0:
		return NULL;
	case 1:
		return (void *)0xffff888000000000ULL;
	case 2:
		return unmapped;
	case 3:	/* runs into the guard page */
		return arena + 2 * 4096 - (want ? pick(want) + 1 : 1);
	case 4:
		if (nmaps)
			return maps[pick(nmaps)].p;
		/* fallthrough */
	default:
		return arena + (chance(70) ? 0 : pick(2 * 4096 - (want < 4096 ? want : 0)));
	}
}

static int rand_fd(void)
{
	switch (pick(8)) {
	case 0:
		return efd[pick(2)];
	case 1:
		return nullfd;
	case 2:
		return -1;
	case 3:
		return (int)interesting();
	default:
		return dev[pick(4)];
	}
}

static uint32_t rand_pool(void)
{
	return npools && chance(80) ? pools[pick(npools)] : (uint32_t)interesting();
}

static uint32_t rand_count(uint32_t small)
{
	return chance(85) ? (uint32_t)pick(small) + 1 : (uint32_t)interesting();
}

static void remember_pool(uint32_t id)
{
	if (id)
		pools[npools < 16 ? npools++ : (int)pick(16)] = id;
}

static void fill_name(char *name)
{
	if (chance(90))
		snprintf(name, HYB_NAME_LEN, "fz%u", (unsigned)pick(12));
	else
		for (int i = 0; i < HYB_NAME_LEN; i++)
			name[i] = (char)rnd();
}

/* Mostly valid requests; one batch in ten has one broken entry. */
static void fill_reqs(struct hyb_req *r, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++) {
		memset(&r[i], 0, sizeof(r[i]));
		r[i].op = chance(50) ? HYB_OP_NOP : (uint16_t)pick(HYB_OP_MAX);
		r[i].prio = (uint8_t)pick(HYB_PRIO_LEVELS);
		if (r[i].op != HYB_OP_NOP) {
			r[i].pool_id = rand_pool();
			r[i].pool_off = pick(8) * 4096;
			r[i].len = pick(8192) + 1;
		}
		r[i].tag = rnd();
		r[i].layer = (uint32_t)rnd();
		r[i].group = (uint32_t)rnd();
		r[i].aux = rnd();
	}
	if (n && chance(10)) {
		struct hyb_req *b = &r[pick(n)];

		switch (pick(7)) {
		case 0: b->op = (uint16_t)rnd(); break;
		case 1: b->prio = (uint8_t)rnd(); break;
		case 2: b->reserved = (uint32_t)rnd() | 1; break;
		case 3: b->id = rnd() | 1; break;
		case 4: b->pool_off = interesting(); break;
		case 5: b->len = interesting(); break;
		default: b->pool_id = (uint32_t)interesting(); break;
		}
	}
}

/* A device fd, preferring one that holds the role the call needs. */
static int pick_dev(int want_role)
{
	int i, start = (int)pick(4);

	if (want_role && chance(80))
		for (i = 0; i < 4; i++)
			if (role[(start + i) % 4] == want_role)
				return dev[(start + i) % 4];
	return dev[start];
}

/* Build a plausible (or not) argument for cmd in the arena. */
static void build_arg(unsigned long cmd, void *arg, size_t size)
{
	union {
		struct hyb_dev_info di;
		struct hyb_pool_create pc;
		struct hyb_pool_ref pr;
		struct hyb_pool_info pi;
		struct hyb_pool_list pl;
		struct hyb_pool_migrate pm;
		struct hyb_attach at;
		struct hyb_batch b;
		struct hyb_queue_stats qs;
		unsigned char raw[1024];
	} u;
	unsigned char *reqs = arena + 1024;

	memset(&u, 0, sizeof(u));
	if (chance(10))
		for (size_t i = 0; i < sizeof(u); i++)
			u.raw[i] = (unsigned char)rnd();
	switch (cmd) {
	case HYB_IOC_POOL_CREATE:
		fill_name(u.pc.name);
		u.pc.bytes = chance(85) ? (pick(32) + 1) * MiB : interesting();
		u.pc.node = chance(85) ? (int)pick(3) - 1 : (int)interesting();
		u.pc.page_shift = chance(85) ? (chance(50) ? 0 : 21) : (uint32_t)interesting();
		break;
	case HYB_IOC_POOL_DESTROY:
		u.pr.pool_id = rand_pool();
		break;
	case HYB_IOC_POOL_INFO:
		u.pi.pool_id = rand_pool();
		u.pi.flags = chance(80) ? (chance(30) ? HYB_POOL_BY_NAME : 0) : (uint32_t)rnd();
		fill_name(u.pi.name);
		break;
	case HYB_IOC_POOL_LIST:
		u.pl.count = chance(80) ? (uint32_t)pick(20) : (uint32_t)interesting();
		u.pl.ptr = (uintptr_t)(chance(70) ? (void *)reqs : rand_ptr(u.pl.count * 4));
		break;
	case HYB_IOC_POOL_MIGRATE:
		/* Moves race with faults, mmap, munmap, destroy and SIGKILL in the others. */
		u.pm.pool_id = rand_pool();
		u.pm.node = chance(85) ? (int)pick(3) - 1 : (int)interesting();
		if (chance(5))
			u.pm.reserved[pick(2)] = rnd() | 1;
		break;
	case HYB_IOC_QUEUE_ATTACH:
	case HYB_IOC_CLIENT_ATTACH:
		u.at.queue_id = chance(85) ? (uint32_t)pick(3) : (uint32_t)interesting();
		u.at.eventfd = rand_fd();
		break;
	case HYB_IOC_SUBMIT:
	case HYB_IOC_FETCH:
	case HYB_IOC_COMPLETE:
	case HYB_IOC_REAP:
		u.b.count = rand_count(cmd == HYB_IOC_SUBMIT ? 4 : cmd == HYB_IOC_COMPLETE ? 3 : 64);
		u.b.entry_size = cmd == HYB_IOC_COMPLETE ? sizeof(struct hyb_done) :
				 cmd == HYB_IOC_REAP ? sizeof(struct hyb_cqe) : sizeof(struct hyb_req);
		if (cmd == HYB_IOC_FETCH && chance(40))	/* with the senders */
			u.b.entry_size = sizeof(struct hyb_req_from);
		if (chance(5))
			u.b.entry_size = (uint32_t)interesting();
		u.b.ptr = (uintptr_t)(chance(80) ? (void *)reqs : rand_ptr(u.b.count * 64ULL));
		if (cmd == HYB_IOC_SUBMIT && u.b.ptr == (uintptr_t)reqs)
			fill_reqs((struct hyb_req *)reqs, u.b.count < 100 ? u.b.count : 100);
		if (cmd == HYB_IOC_COMPLETE && u.b.ptr == (uintptr_t)reqs) {
			struct hyb_done *d = (struct hyb_done *)reqs;

			for (uint32_t i = 0; i < u.b.count && i < 200; i++) {
				/* Mostly the latest fetched ids, in order. */
				d[i].id = nids && chance(90) ? ids[(nids - 1 - i % nids)] :
					  interesting();
				d[i].status = chance(90) ? -(int)pick(6) : (int)interesting();
				d[i].reserved = chance(2);
			}
			if (chance(70) && nids > 0)
				nids -= u.b.count < (uint32_t)nids ? (int)u.b.count : nids;
		}
		if (cmd == HYB_IOC_REAP && chance(50)) {
			u.b.flags = HYB_REAP_WAIT;
			u.b.min_count = (uint32_t)pick(u.b.count < 64 ? u.b.count + 1 : 65);
			/* Very rarely no timeout: the worker may sleep until it is killed. */
			u.b.timeout_ns = pick(3000) ? pick(3000000) + 1 : 0;
		}
		if (chance(5))
			u.b.flags = (uint32_t)rnd();
		break;
	case HYB_IOC_QUEUE_STATS:
		u.qs.queue_id = chance(85) ? (uint32_t)pick(4) : (uint32_t)interesting();
		break;
	default:
		break;
	}
	if (chance(5))
		u.raw[8 + pick(size > 8 ? size - 8 : 1)] ^= (unsigned char)(1 + pick(255));
	u.di.size = chance(92) ? (uint32_t)size : (uint32_t)interesting();
	if (chance(4))
		u.di.flags = (uint32_t)rnd();
	memcpy(arg, &u, size < sizeof(u) ? size : sizeof(u));
}

static const unsigned long cmds[] = {
	HYB_IOC_DEV_INFO, HYB_IOC_POOL_CREATE, HYB_IOC_POOL_DESTROY, HYB_IOC_POOL_INFO,
	HYB_IOC_POOL_LIST, HYB_IOC_QUEUE_ATTACH, HYB_IOC_CLIENT_ATTACH, HYB_IOC_SUBMIT,
	HYB_IOC_FETCH, HYB_IOC_COMPLETE, HYB_IOC_REAP, HYB_IOC_QUEUE_STATS,
	HYB_IOC_POOL_MIGRATE,
};

static void do_ioctl(void)
{
	unsigned long cmd = cmds[pick(sizeof(cmds) / sizeof(cmds[0]))];
	size_t size = _IOC_SIZE(cmd);
	void *arg;
	int fd, ret, want = 0;

	switch (pick(20)) {
	case 0:	/* our magic, anything else */
		size = pick(600);
		cmd = _IOC(pick(4), HYB_IOC_MAGIC, pick(32), size);
		break;
	case 1:	/* a known number with another size */
		size = chance(50) ? size + pick(64) : pick(size + 1);
		cmd = _IOC(_IOC_DIR(cmd), HYB_IOC_MAGIC, _IOC_NR(cmd), size);
		break;
	case 2: {	/* a foreign type; never the VFS's own (freeze, clone, ...) */
		unsigned int type;

		do
			type = (unsigned int)pick(256);
		while (type == 'X' || type == 'f' || type == 0x94 || type == 0 || type == 'T' ||
		       type == 0x12 || type == HYB_IOC_MAGIC);
		size = pick(64);
		cmd = _IOC(pick(4), type, pick(256), size);
		break;
	}
	default:
		break;
	}
	if (cmd == HYB_IOC_SUBMIT || cmd == HYB_IOC_REAP)
		want = 2;
	else if (cmd == HYB_IOC_FETCH || cmd == HYB_IOC_COMPLETE)
		want = 1;
	fd = chance(95) ? pick_dev(want) : rand_fd();
	arg = chance(90) ? (void *)arena : rand_ptr(size);
	if (arg == (void *)arena)
		build_arg(cmd, arena, size);
	ret = hyb_ioctl(fd, cmd, arg);
	n_ops++;
	count(C_OPS);
	if (!ret) {
		n_ok++;
		if (_IOC_TYPE(cmd) == HYB_IOC_MAGIC && _IOC_NR(cmd) < 32)
			count(_IOC_NR(cmd));
		if (cmd == HYB_IOC_POOL_CREATE && arg == (void *)arena)
			remember_pool(((struct hyb_pool_create *)arena)->pool_id);
		for (int i = 0; i < 4; i++)
			if (dev[i] == fd && (cmd == HYB_IOC_QUEUE_ATTACH || cmd == HYB_IOC_CLIENT_ATTACH))
				role[i] = cmd == HYB_IOC_QUEUE_ATTACH ? 1 : 2;
		if (cmd == HYB_IOC_FETCH && arg == (void *)arena) {
			struct hyb_batch *b = (struct hyb_batch *)arena;
			const unsigned char *r = (const unsigned char *)(uintptr_t)b->ptr;

			if (b->ptr == (uintptr_t)(arena + 1024))
				for (uint32_t i = 0; i < b->count && i < 64; i++) {
					const struct hyb_req *q =
						(const void *)(r + (size_t)i * b->entry_size);

					if (nids == 64) {
						memmove(ids, ids + 1, 63 * sizeof(ids[0]));
						nids--;
					}
					ids[nids++] = q->id;
				}
		}
		if (cmd == HYB_IOC_POOL_LIST && arg == (void *)arena) {
			struct hyb_pool_list *pl = (struct hyb_pool_list *)arena;

			if (pl->ptr == (uintptr_t)(arena + 1024))
				for (uint32_t i = 0; i < pl->count && i < 16; i++)
					remember_pool(((uint32_t *)(arena + 1024))[i]);
		}
	} else if (-ret < 160) {
		n_err[-ret]++;
	}
}

static void do_mmap(void)
{
	static const int prots[] = { PROT_READ, PROT_READ | PROT_WRITE, PROT_WRITE, PROT_NONE,
				     PROT_READ | PROT_WRITE | PROT_EXEC };
	static const int flags[] = { MAP_SHARED, MAP_SHARED, MAP_SHARED | MAP_POPULATE, MAP_PRIVATE,
				     MAP_SHARED | MAP_NORESERVE };
	uint64_t off = npools && chance(85) ?
		((uint64_t)rand_pool() << HYB_MMAP_SHIFT) + pick(3) * 2 * MiB : interesting();
	size_t len = chance(85) ? (pick(3) + 1) * 2 * MiB : (size_t)(pick(4096) * 4096 + 1);
	int prot = prots[pick(5)];
	unsigned char *p;

	p = mmap(NULL, len, prot, flags[pick(5)], dev[pick(4)], (off_t)off);
	n_ops++;
	if (p == MAP_FAILED)
		return;
	n_ok++;
	count(C_MMAP_OK);
	if (nmaps == 16) {
		munmap(maps[0].p, maps[0].len);
		maps[0] = maps[--nmaps];
	}
	maps[nmaps++] = (struct map){ p, len, prot };
	guarded = 1;
	if (!sigsetjmp(jb, 1)) {
		volatile unsigned char sink = 0;

		for (int i = 0; i < 8; i++) {
			size_t at = pick(len);

			if (prot & PROT_READ)
				sink += p[at];
			if ((prot & PROT_WRITE) && chance(50))
				p[at] = (unsigned char)rnd();
		}
		(void)sink;
	}
	guarded = 0;
}

static void do_vma_op(void)
{
	struct map *m;
	size_t at;

	if (!nmaps)
		return;
	m = &maps[pick(nmaps)];
	at = (pick(m->len / 4096)) * 4096;
	n_ops++;
	switch (pick(7)) {
	case 0:	/* unmap a page in the middle: splits the VMA, maybe a PMD */
		munmap(m->p + at, 4096);
		guarded = 1;
		if (!sigsetjmp(jb, 1)) {
			volatile unsigned char x = m->p[at ? at - 1 : at + 4096 < m->len ? at + 4096 : 0];

			(void)x;
		}
		guarded = 0;
		break;
	case 1:
		mprotect(m->p, m->len, (int)pick(8));
		break;
	case 2: {
		static const int adv[] = { MADV_DONTNEED, MADV_WILLNEED, 20, 21, MADV_HUGEPAGE,
					   MADV_NOHUGEPAGE, MADV_DONTFORK, MADV_DOFORK, 25, 22, 23,
					   MADV_REMOVE, MADV_FREE, 18, 19, MADV_SEQUENTIAL };

		madvise(m->p + at, pick(m->len - at) + 1, adv[pick(sizeof(adv) / sizeof(adv[0]))]);
		break;
	}
	case 3: {
		void *q = mremap(m->p, m->len, chance(50) ? m->len * 2 : m->len, MREMAP_MAYMOVE);

		if (q != MAP_FAILED)
			m->p = q;
		break;
	}
	case 4: {
		void *page = m->p + at;
		int status = 0, node = (int)pick(2);

		syscall(SYS_move_pages, 0, 1UL, &page, chance(50) ? &node : NULL, &status,
			chance(50) ? 2 : 0);
		break;
	}
	default:
		munmap(m->p, m->len);
		*m = maps[--nmaps];
		break;
	}
}

static void do_fd_op(void)
{
	int i = (int)pick(4);

	n_ops++;
	switch (pick(4)) {
	case 0:
		close(dev[i]);
		dev[i] = hyb_open(chance(70) ? O_RDWR : O_RDONLY);
		role[i] = 0;
		break;
	case 1: {
		char buf[4096];
		int fd = open(chance(50) ? "/sys/kernel/debug/hybpool/pools" :
				      "/sys/kernel/debug/hybpool/queues", O_RDONLY);

		if (fd >= 0) {
			while (read(fd, buf, sizeof(buf)) > 0)
				;
			close(fd);
		}
		break;
	}
	case 2: {
		struct pollfd pfd = { .fd = efd[pick(2)], .events = POLLIN };
		uint64_t v;

		if (poll(&pfd, 1, 0) == 1 && read(pfd.fd, &v, 8) < 0)
			n_err[0]++;
		break;
	}
	default: {
		int nfd = dup(dev[i]);

		if (nfd >= 0) {
			close(dev[i]);
			dev[i] = nfd;
		}
		break;
	}
	}
}

/* A daemon and a client on one queue, so that requests really flow. */
static void do_pair(void)
{
	uint32_t qid = (uint32_t)pick(3);

	n_ops++;
	close(dev[0]);
	close(dev[1]);
	dev[0] = hyb_open(O_RDWR);
	dev[1] = hyb_open(O_RDWR);
	role[0] = role[1] = 0;
	if (!hyb_attach(dev[0], HYB_IOC_QUEUE_ATTACH, qid, efd[pick(2)]))
		role[0] = 1;
	if (!hyb_attach(dev[1], HYB_IOC_CLIENT_ATTACH, qid, chance(70) ? efd[pick(2)] : -1))
		role[1] = 2;
}

static void step(int depth);

static void do_fork(int depth)
{
	pid_t pid;

	if (depth > 1)
		return;
	pid = fork();
	if (pid == 0) {
		count(C_FORK);
		rs ^= (uint64_t)getpid() * 0x9e3779b97f4a7c15ULL;
		for (int i = 0; i < 40; i++)
			step(depth + 1);
		if (chance(30))
			abort();
		_exit(0);
	}
	if (pid > 0 && chance(50))
		kill(pid, SIGKILL);
	if (pid > 0)
		waitpid(pid, NULL, 0);
}

static void step(int depth)
{
	switch (pick(20)) {
	case 0: case 1: case 2:
		do_mmap();
		break;
	case 3: case 4:
		do_vma_op();
		break;
	case 5:
		if (chance(25))
			do_pair();
		else
			do_fd_op();
		break;
	case 6:
		if (chance(20))
			do_fork(depth);
		break;
	default:
		do_ioctl();
		break;
	}
}

static void worker(uint64_t seed, double deadline)
{
	struct sigaction sa = { .sa_handler = on_fault };

	rs = seed | 1;
	sigaction(SIGSEGV, &sa, NULL);
	sigaction(SIGBUS, &sa, NULL);
	arena = mmap(NULL, ARENA_PAGES * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
		     -1, 0);
	unmapped = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (arena == MAP_FAILED || unmapped == MAP_FAILED)
		_exit(3);
	munmap(unmapped, 4096);
	mprotect(arena + 2 * 4096, 4096, PROT_NONE);
	for (int i = 0; i < 4; i++)
		dev[i] = hyb_open(i == 3 ? O_RDONLY : O_RDWR);
	efd[0] = eventfd(0, EFD_NONBLOCK);
	efd[1] = eventfd(0, 0);
	nullfd = open("/dev/null", O_RDONLY);
	while (hyb_now() < deadline)
		step(0);
	printf("  worker %d: %llu ops, %llu ok, %llu signals caught\n", (int)getpid(),
	       (unsigned long long)n_ops, (unsigned long long)n_ok, (unsigned long long)n_sig);
	fflush(stdout);
	_exit(0);
}

/*
 * A worker runs in a process group of its own, so killing it takes the child
 * it may have forked too: orphaned, that child could still hold a queue with
 * requests when the final check looks (a false "left behind").
 */
static pid_t spawn_worker(uint64_t s, double t_end)
{
	pid_t pid = fork();

	if (pid == 0) {
		setpgid(0, 0);
		worker(s, t_end);
	}
	if (pid > 0)
		setpgid(pid, pid);	/* (both sides: whichever runs first) */
	return pid;
}

static void stop_worker(pid_t pid)
{
	kill(-pid, SIGKILL);
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
}

int main(int argc, char **argv)
{
	double secs = argc > 1 ? atof(argv[1]) : 20, t_end;
	uint64_t seed = argc > 2 ? strtoull(argv[2], NULL, 0) : (uint64_t)time(NULL);
	pid_t pids[NWORKERS];
	int kills = 0, fd;
	struct hyb_dev_info di;

	setvbuf(stdout, NULL, _IOLBF, 0);
	printf("  fuzzing /dev/hybpool for %.0f s, seed %llu, %d workers\n", secs,
	       (unsigned long long)seed, NWORKERS);
	rs = seed | 1;
	counts = mmap(NULL, C_N * sizeof(*counts), PROT_READ | PROT_WRITE,
		      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (counts == MAP_FAILED)
		return 1;
	/* orphans of killed workers become our children: the last wait() reaps them */
	prctl(PR_SET_CHILD_SUBREAPER, 1);
	t_end = hyb_now() + secs;
	for (int i = 0; i < NWORKERS; i++)
		pids[i] = spawn_worker(rnd(), t_end);
	while (hyb_now() < t_end - 1) {
		int i = (int)pick(NWORKERS);
		uint64_t s = rnd();

		usleep(500000 + pick(1500000));
		if (hyb_now() >= t_end - 1)
			break;
		stop_worker(pids[i]);
		kills++;
		pids[i] = spawn_worker(s, t_end);
	}
	usleep(2500000);	/* workers stop at t_end; one may sleep in an untimed wait */
	for (int i = 0; i < NWORKERS; i++)
		stop_worker(pids[i]);
	while (wait(NULL) > 0)
		;
	printf("  supervisor: %d workers killed and replaced\n", kills);
	printf("  %llu calls, %llu signals caught, %llu forks; succeeded: mmap %llu, create %llu, destroy %llu, info %llu, list %llu, migrate %llu, attach %llu/%llu, submit %llu, fetch %llu, complete %llu, reap %llu, stats %llu\n",
	       (unsigned long long)counts[C_OPS], (unsigned long long)counts[C_SIG],
	       (unsigned long long)counts[C_FORK], (unsigned long long)counts[C_MMAP_OK],
	       (unsigned long long)counts[1], (unsigned long long)counts[2],
	       (unsigned long long)counts[3], (unsigned long long)counts[4],
	       (unsigned long long)counts[5], (unsigned long long)counts[0x10],
	       (unsigned long long)counts[0x11],
	       (unsigned long long)counts[0x12], (unsigned long long)counts[0x13],
	       (unsigned long long)counts[0x14], (unsigned long long)counts[0x15],
	       (unsigned long long)counts[0x16]);

	fd = hyb_open(O_RDONLY);
	if (fd < 0 || hyb_dev_info(fd, &di)) {
		printf("  cannot read device state after fuzzing\n");
		return 1;
	}
	close(fd);
	if (di.nr_pools || di.nr_zombies || di.pinned_bytes || di.nr_requests || di.nr_queues) {
		printf("  left behind: %u pools, %u zombies, %llu bytes, %llu requests, %u queues\n",
		       di.nr_pools, di.nr_zombies, (unsigned long long)di.pinned_bytes,
		       (unsigned long long)di.nr_requests, di.nr_queues);
		return 1;
	}
	printf("  nothing left behind\n");
	return 0;
}
