// SPDX-License-Identifier: MIT
#include "hyb/threadpool.h"

#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "util/error.h"

/* Spin this many times before sleeping: about 50-100 us, longer than the gap
 * between two matmuls of a decode step, far shorter than a human notices. */
#define SPIN_LIMIT 20000
/* The caller's wait for the workers: a thread that is running finishes its
 * share within microseconds; one that another process has displaced may not
 * run for a whole time slice. Spin about 10-20 us, then yield the CPU
 * between looks (sleeping on a futex measured no better, see
 * docs/PERFORMANCE.md). */
#define WAIT_SPIN_LIMIT 4000

/* join word: generation << 32 | CLOSED | workers that joined */
#define JOIN_CLOSED (1ull << 31)
#define JOIN_COUNT 0x7fffffffull

struct hyb_threadpool {
	int n;
	pthread_t *threads;
	hyb_job_fn fn;
	void *arg;
	_Atomic unsigned generation; /* bumped to start a job; futex word */
	_Atomic uint64_t join;       /* the job's generation, closed bit, joined workers */
	atomic_uint done;            /* workers that finished the job */
	atomic_int sleepers;         /* workers in futex_wait: only then is a wake needed */
	atomic_bool stop;
	void (*side)(void *);        /* the caller's side task (hyb_threadpool_side) */
	void *side_arg;
	_Atomic int *node;           /* [n] the node each thread last started a job on */
	int16_t *cpu_node;           /* [n_cpus] from sysfs; NULL: one node */
	int n_cpus;
};

struct worker_arg {
	struct hyb_threadpool *p;
	int ith;
};

static void futex_wait(_Atomic unsigned *addr, unsigned val)
{
	syscall(SYS_futex, addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake(_Atomic unsigned *addr, int n)
{
	syscall(SYS_futex, addr, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#endif
}

/*
 * Join the job of generation gen, unless the caller closed it (a dynamic
 * job done without this worker) or has already moved on to a later one.
 */
static bool join_job(struct hyb_threadpool *p, unsigned gen)
{
	uint64_t j = atomic_load_explicit(&p->join, memory_order_acquire);

	for (;;) {
		if ((unsigned)(j >> 32) != gen || (j & JOIN_CLOSED))
			return false;
		if (atomic_compare_exchange_weak_explicit(&p->join, &j, j + 1, memory_order_acq_rel,
							  memory_order_acquire))
			return true;
	}
}

/*
 * The node of the CPU the calling thread runs on, noted for thread ith as
 * it starts a job: what NUMA-aware jobs (moe.c's expert queues) read to
 * take work on local memory first. sched_getcpu reads the kernel's rseq
 * area: no system call per job.
 */
static void note_node(struct hyb_threadpool *p, int ith)
{
	const int cpu = p->cpu_node ? sched_getcpu() : -1;

	if (p->cpu_node)
		atomic_store_explicit(&p->node[ith], cpu >= 0 && cpu < p->n_cpus ?
				      p->cpu_node[cpu] : -1, memory_order_relaxed);
}

/* CPUs of a sysfs list such as "0-3,8,10-11" into set (or, set NULL, counted); -1: unreadable */
static int read_cpulist(const char *path, cpu_set_t *set, int *max_cpu)
{
	char buf[4096], *s = buf, *end;
	FILE *f = fopen(path, "re");
	size_t n;

	if (!f)
		return -1;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	while (*s && *s != '\n') {
		long a = strtol(s, &end, 10), b = a;

		if (end == s || a < 0 || a >= CPU_SETSIZE)
			return -1;
		s = end;
		if (*s == '-') {
			b = strtol(s + 1, &end, 10);
			if (end == s + 1 || b < a || b >= CPU_SETSIZE)
				return -1;
			s = end;
		}
		for (long c = a; c <= b; c++) {
			if (set)
				CPU_SET((int)c, set);
			if (max_cpu && c > *max_cpu)
				*max_cpu = (int)c;
		}
		if (*s == ',')
			s++;
	}
	return 0;
}

/* cpu -> node from /sys/devices/system/node; left NULL with one node (or no sysfs) */
static void learn_nodes(struct hyb_threadpool *p)
{
	char path[96];
	int max_cpu = -1, n_nodes = 0;

	for (int nd = 0; nd < 1024; nd++) {
		snprintf(path, sizeof(path), "/sys/devices/system/node/node%d/cpulist", nd);
		if (read_cpulist(path, NULL, &max_cpu) == 0)
			n_nodes++;
	}
	if (n_nodes < 2 || max_cpu < 0)
		return;
	p->cpu_node = malloc(sizeof(*p->cpu_node) * (size_t)(max_cpu + 1));
	if (!p->cpu_node)
		return;
	p->n_cpus = max_cpu + 1;
	for (int c = 0; c <= max_cpu; c++)
		p->cpu_node[c] = -1;
	for (int nd = 0; nd < 1024; nd++) {
		cpu_set_t set;

		CPU_ZERO(&set);
		snprintf(path, sizeof(path), "/sys/devices/system/node/node%d/cpulist", nd);
		if (read_cpulist(path, &set, NULL))
			continue;
		for (int c = 0; c <= max_cpu; c++)
			if (CPU_ISSET(c, &set))
				p->cpu_node[c] = (int16_t)nd;
	}
}

static void *worker_main(void *opaque)
{
	struct worker_arg wa = *(struct worker_arg *)opaque;
	struct hyb_threadpool *p = wa.p;
	unsigned seen = 0;

	free(opaque);
	for (;;) {
		unsigned gen;
		int spins = 0;

		while ((gen = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen) {
			if (++spins < SPIN_LIMIT)
				cpu_relax();
			else {
				atomic_fetch_add(&p->sleepers, 1);
				futex_wait(&p->generation, seen);
				atomic_fetch_sub(&p->sleepers, 1);
			}
		}
		seen = gen;
		if (atomic_load_explicit(&p->stop, memory_order_acquire))
			return NULL;
		if (!join_job(p, gen))
			continue;
		note_node(p, wa.ith);
		p->fn(p->arg, wa.ith, p->n);
		atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
	}
}

struct hyb_threadpool *hyb_threadpool_new(int n_threads)
{
	struct hyb_threadpool *p;

	if (n_threads <= 0) {
		long ncpu = sysconf(_SC_NPROCESSORS_ONLN);

		n_threads = ncpu > 0 ? (int)ncpu : 1;
	}
	p = calloc(1, sizeof(*p));
	if (!p) {
		hyb_error_set(-ENOMEM, "thread pool: out of memory");
		return NULL;
	}
	p->n = n_threads;
	p->threads = calloc(n_threads, sizeof(*p->threads));
	p->node = calloc(n_threads, sizeof(*p->node));
	if (!p->threads || !p->node) {
		free(p->threads);
		free(p->node);
		free(p);
		hyb_error_set(-ENOMEM, "thread pool: out of memory for %d threads", n_threads);
		return NULL;
	}
	for (int i = 0; i < n_threads; i++)
		atomic_init(&p->node[i], -1);
	learn_nodes(p);
	for (int i = 1; i < n_threads; i++) {
		struct worker_arg *wa = malloc(sizeof(*wa));
		int rc;

		if (!wa) {
			p->n = i;
			hyb_threadpool_free(p);
			hyb_error_set(-ENOMEM, "thread pool: out of memory");
			return NULL;
		}
		wa->p = p;
		wa->ith = i;
		rc = pthread_create(&p->threads[i], NULL, worker_main, wa);
		if (rc) {
			free(wa);
			p->n = i;
			hyb_threadpool_free(p);
			hyb_error_set(-rc, "thread pool: cannot start thread %d of %d: %s", i,
				      n_threads, strerror(rc));
			return NULL;
		}
	}
	return p;
}

/* Wait until `target` workers have finished the job. */
static void wait_done(struct hyb_threadpool *p, unsigned target)
{
	int spins = 0;

	while (atomic_load_explicit(&p->done, memory_order_acquire) < target) {
		if (++spins < WAIT_SPIN_LIMIT)
			cpu_relax();
		else
			sched_yield();
	}
}

/* Run and clear the side task, if one is set. */
static void run_side(struct hyb_threadpool *p)
{
	void (*f)(void *) = p->side;

	if (f) {
		p->side = NULL;
		f(p->side_arg);
	}
}

static void run(struct hyb_threadpool *p, hyb_job_fn fn, void *arg, bool dynamic)
{
	unsigned gen;

	note_node(p, 0);
	if (p->n == 1) {
		if (dynamic)
			run_side(p);
		fn(arg, 0, 1);
		return;
	}
	/* every worker that joined the last job has finished it: nothing reads these */
	p->fn = fn;
	p->arg = arg;
	atomic_store_explicit(&p->done, 0, memory_order_relaxed);
	gen = atomic_load_explicit(&p->generation, memory_order_relaxed) + 1;
	atomic_store_explicit(&p->join, (uint64_t)gen << 32, memory_order_relaxed);
	atomic_store_explicit(&p->generation, gen, memory_order_seq_cst);
	/* A worker that registers as a sleeper after this load finds the
	 * generation changed inside futex_wait and returns at once. */
	if (atomic_load(&p->sleepers))
		futex_wake(&p->generation, 0x7fffffff);
	/* the workers have the job: the caller's side task first, then its share */
	if (dynamic)
		run_side(p);
	fn(arg, 0, p->n);
	if (dynamic) {
		/* the work is shared out as it goes: a worker that has not joined
		 * yet (asleep, or displaced by another process) has nothing left to
		 * do, and may not start now */
		uint64_t j = atomic_fetch_or_explicit(&p->join, JOIN_CLOSED, memory_order_acq_rel);

		wait_done(p, (unsigned)(j & JOIN_COUNT));
	} else {
		wait_done(p, (unsigned)p->n - 1);
	}
}

void hyb_threadpool_run(struct hyb_threadpool *p, hyb_job_fn fn, void *arg)
{
	run(p, fn, arg, false);
}

void hyb_threadpool_run_dynamic(struct hyb_threadpool *p, hyb_job_fn fn, void *arg)
{
	run(p, fn, arg, true);
}

void hyb_threadpool_side(struct hyb_threadpool *p, void (*fn)(void *), void *arg)
{
	p->side = fn;
	p->side_arg = arg;
}

bool hyb_threadpool_side_flush(struct hyb_threadpool *p)
{
	const bool pending = p->side != NULL;

	run_side(p);
	return pending;
}

int hyb_threadpool_size(const struct hyb_threadpool *p)
{
	return p->n;
}

int hyb_threadpool_node(const struct hyb_threadpool *p, int ith)
{
	return ith >= 0 && ith < p->n ? atomic_load_explicit(&p->node[ith], memory_order_relaxed) :
	       -1;
}

int hyb_threadpool_pin_nodes(struct hyb_threadpool *p, const int *nodes, int n)
{
	if (n <= 0)
		return hyb_error_set(-EINVAL, "thread pool: no nodes to pin to");
	for (int i = 0; i < p->n; i++) {
		const int nd = nodes[(long)i * n / p->n];
		char path[96];
		cpu_set_t set;
		int rc;

		CPU_ZERO(&set);
		snprintf(path, sizeof(path), "/sys/devices/system/node/node%d/cpulist", nd);
		if (nd < 0 || read_cpulist(path, &set, NULL) || !CPU_COUNT(&set))
			return hyb_error_set(-ENODEV, "thread pool: NUMA node %d has no CPUs to pin "
					     "thread %d to (%s)", nd, i, path);
		rc = i ? pthread_setaffinity_np(p->threads[i], sizeof(set), &set) :
		     sched_setaffinity(0, sizeof(set), &set) ? errno : 0;
		if (rc)
			return hyb_error_set(-rc, "thread pool: cannot pin thread %d to node %d: %s",
					     i, nd, strerror(rc));
	}
	return 0;
}

void hyb_threadpool_free(struct hyb_threadpool *p)
{
	if (!p)
		return;
	atomic_store_explicit(&p->stop, true, memory_order_release);
	atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
	futex_wake(&p->generation, 0x7fffffff);
	for (int i = 1; i < p->n; i++)
		pthread_join(p->threads[i], NULL);
	free(p->threads);
	free((void *)p->node);
	free(p->cpu_node);
	free(p);
}
