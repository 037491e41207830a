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

typedef void (*hyb_job_fn)(void *arg, int ith, int nth);

struct hyb_threadpool;

/* n_threads <= 0: one per online CPU. NULL on failure (errno set). */
struct hyb_threadpool *hyb_threadpool_new(int n_threads);
void hyb_threadpool_free(struct hyb_threadpool *p);
int hyb_threadpool_size(const struct hyb_threadpool *p);
void hyb_threadpool_run(struct hyb_threadpool *p, hyb_job_fn fn, void *arg);
void hyb_threadpool_run_dynamic(struct hyb_threadpool *p, hyb_job_fn fn, void *arg);

/* Split [0, n) into nth near-equal contiguous parts; part ith is [*lo, *hi). */
static inline void hyb_split(long n, int ith, int nth, long *lo, long *hi)
{
	*lo = n * ith / nth;
	*hi = n * (ith + 1) / nth;
}

#endif
