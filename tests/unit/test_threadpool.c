// SPDX-License-Identifier: MIT
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "hyb/threadpool.h"
#include "test.h"

struct count_job {
	atomic_int calls;
	atomic_int seen[8];
	long covered[1000];
};

static void count_worker(void *arg, int ith, int nth)
{
	struct count_job *j = arg;
	long lo, hi;

	atomic_fetch_add(&j->calls, 1);
	atomic_fetch_add(&j->seen[ith], 1);
	hyb_split(1000, ith, nth, &lo, &hi);
	for (long i = lo; i < hi; i++)
		j->covered[i]++;
}

/* Every thread runs every job exactly once, and hyb_split covers the range exactly. */
TEST(pool_runs_each_job_on_every_thread)
{
	for (int nth = 1; nth <= 8; nth++) {
		struct hyb_threadpool *p = hyb_threadpool_new(nth);

		CHECK(p);
		CHECK_EQ_INT(hyb_threadpool_size(p), nth);
		for (int rep = 0; rep < 200; rep++) {
			struct count_job j;

			memset(&j, 0, sizeof(j));
			hyb_threadpool_run(p, count_worker, &j);
			CHECK_EQ_INT(atomic_load(&j.calls), nth);
			for (int t = 0; t < nth; t++)
				CHECK_EQ_INT(atomic_load(&j.seen[t]), 1);
			for (int i = 0; i < 1000; i++)
				CHECK_EQ_INT(j.covered[i], 1);
			if (rep == 100)
				usleep(20000); /* let workers fall asleep on the futex */
		}
		hyb_threadpool_free(p);
	}
}

struct dyn_job {
	atomic_long next;
	atomic_int seen[8];
	atomic_int covered[1000];
	int slow; /* the caller dawdles so that the workers take part */
};

static void dyn_worker(void *arg, int ith, int nth)
{
	struct dyn_job *j = arg;

	CHECK(ith >= 0 && ith < nth);
	CHECK_EQ_INT(atomic_fetch_add(&j->seen[ith], 1), 0);
	if (ith == 0 && j->slow)
		usleep(2000);
	for (long i; (i = atomic_fetch_add(&j->next, 1)) < 1000;)
		atomic_fetch_add(&j->covered[i], 1);
}

/*
 * Dynamic jobs: every item done exactly once, each thread at most once per
 * job, whichever workers join, mixed with jobs every thread must run (a
 * worker that skipped a dynamic job must still run the next static one).
 */
TEST(pool_dynamic_jobs_share_out_the_work)
{
	for (int nth = 1; nth <= 8; nth++) {
		struct hyb_threadpool *p = hyb_threadpool_new(nth);

		int joined = 0;

		CHECK(p);
		for (int rep = 0; rep < 300; rep++) {
			struct dyn_job d;
			struct count_job s;

			memset(&d, 0, sizeof(d));
			d.slow = rep % 50 == 0;
			hyb_threadpool_run_dynamic(p, dyn_worker, &d);
			for (int i = 0; i < 1000; i++)
				CHECK_EQ_INT(atomic_load(&d.covered[i]), 1);
			for (int t = 1; d.slow && t < nth; t++)
				joined += atomic_load(&d.seen[t]);
			if (rep % 3 == 0) {
				memset(&s, 0, sizeof(s));
				hyb_threadpool_run(p, count_worker, &s);
				CHECK_EQ_INT(atomic_load(&s.calls), nth);
				for (int i = 0; i < 1000; i++)
					CHECK_EQ_INT(s.covered[i], 1);
			}
			if (rep == 150)
				usleep(20000); /* let workers fall asleep on the futex */
		}
		/* the caller's 2 ms naps leave the workers time to join */
		CHECK(nth == 1 || joined > 0);
		hyb_threadpool_free(p);
	}
}
