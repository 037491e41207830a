/* SPDX-License-Identifier: MIT */
/*
 * A persistent pool of worker threads for the forward pass. hyb_threadpool_run()
 * runs fn(arg, ith, nth) on every thread (the caller is thread 0) and
 * returns when all are done. Workers spin briefly between jobs and then
 * sleep on a futex, so a decode step (dozens of jobs per token) pays no
 * thread start-up or wake-up latency while the pool stays cheap when idle.
 * The caller, waiting for the workers, spins briefly and then sleeps too.
 *
 * hyb_threadpool_run_dynamic() is for jobs whose threads share the work
 * out as they go (an atomic counter over chunks, say), so that any subset
 * of the threads finishes it: the caller runs fn, then waits only for the
 * workers that had started by then. A worker that another process keeps
 * off the CPU, or that was asleep, costs the job nothing: it skips the job.
 * fn must not depend on nth threads taking part; ith is still unique (and
 * < nth) among those that do.
 */
#ifndef HYB_THREADPOOL_H
#define HYB_THREADPOOL_H

#include <stdbool.h>

typedef void (*hyb_job_fn)(void *arg, int ith, int nth);

struct hyb_threadpool;

/* n_threads <= 0: one per online CPU. NULL on failure (errno set). */
struct hyb_threadpool *hyb_threadpool_new(int n_threads);
void hyb_threadpool_free(struct hyb_threadpool *p);
int hyb_threadpool_size(const struct hyb_threadpool *p);
/*
 * The NUMA node thread ith started its last job on (the pool notes it as
 * each job starts), -1 before its first or on a machine with one node.
 */
int hyb_threadpool_node(const struct hyb_threadpool *p, int ith);
/*
 * Pin the threads to nodes in blocks: thread ith (the caller is 0) to the
 * CPUs of nodes[ith * n / nth]. 0, or a negative errno with the reason.
 */
int hyb_threadpool_pin_nodes(struct hyb_threadpool *p, const int *nodes, int n);
void hyb_threadpool_run(struct hyb_threadpool *p, hyb_job_fn fn, void *arg);
void hyb_threadpool_run_dynamic(struct hyb_threadpool *p, hyb_job_fn fn, void *arg);

/*
 * A side task for the caller (DynamicInfer 4.2.2's scheduling sub-thread,
 * without a thread of its own): the next hyb_threadpool_run_dynamic hands
 * its job to the workers, runs fn(arg) on the caller, then lets the caller
 * join the job's remaining work; the task is then cleared. It runs once.
 * hyb_threadpool_side_flush runs a task still set (no dynamic job came)
 * now, on the caller, and says whether there was one; fn NULL clears a task
 * set. fn must not use the pool.
 */
void hyb_threadpool_side(struct hyb_threadpool *p, void (*fn)(void *), void *arg);
bool hyb_threadpool_side_flush(struct hyb_threadpool *p);

/* Split [0, n) into nth near-equal contiguous parts; part ith is [*lo, *hi). */
static inline void hyb_split(long n, int ith, int nth, long *lo, long *hi)
{
	*lo = n * ith / nth;
	*hi = n * (ith + 1) / nth;
}

#endif
