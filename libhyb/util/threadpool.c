// SPDX-License-Identifier: MIT
#include "hyb/threadpool.h"

#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdint.h>
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
	if (!p->threads) {
		free(p);
		hyb_error_set(-ENOMEM, "thread pool: out of memory for %d threads", n_threads);
		return NULL;
	}
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
	free(p);
}
