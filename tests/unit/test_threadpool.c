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
