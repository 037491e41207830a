// SPDX-License-Identifier: MIT
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>
#include <unistd.h>

#include "hyb/error.h"
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

struct side_task {
	pthread_t caller;
	int runs;
	bool on_caller;
	struct dyn_job *job;   /* the job it runs beside: how far the workers got */
	long seen_next;
};

static void side_fn(void *arg)
{
	struct side_task *s = arg;

	s->runs++;
	s->on_caller = pthread_equal(pthread_self(), s->caller);
	if (s->job) {
		usleep(3000); /* the workers share out the job meanwhile */
		s->seen_next = atomic_load(&s->job->next);
	}
}

/*
 * The caller's side task: once, on the caller, inside the next dynamic job
 * while the workers take its work; not in a job every thread runs; a flush
 * runs one no job took, and says so.
 */
TEST(pool_side_task_runs_once_beside_a_dynamic_job)
{
	for (int nth = 1; nth <= 4; nth++) {
		struct hyb_threadpool *p = hyb_threadpool_new(nth);
		struct side_task s = { .caller = pthread_self() };
		struct dyn_job d;
		struct count_job c;

		CHECK(p);
		memset(&d, 0, sizeof(d));
		memset(&c, 0, sizeof(c));
		s.job = &d;
		hyb_threadpool_side(p, side_fn, &s);
		hyb_threadpool_run(p, count_worker, &c);     /* not this one */
		CHECK_EQ_INT(s.runs, 0);
		hyb_threadpool_run_dynamic(p, dyn_worker, &d);
		CHECK_EQ_INT(s.runs, 1);
		CHECK(s.on_caller);
		for (int i = 0; i < 1000; i++)
			CHECK_EQ_INT(atomic_load(&d.covered[i]), 1);
		/* with workers, they had the job during the side task */
		CHECK(nth == 1 ? s.seen_next == 0 : s.seen_next > 0);
		CHECK(!hyb_threadpool_side_flush(p));        /* nothing left */
		memset(&d, 0, sizeof(d));
		hyb_threadpool_run_dynamic(p, dyn_worker, &d); /* runs no task */
		CHECK_EQ_INT(s.runs, 1);
		s.job = NULL;
		hyb_threadpool_side(p, side_fn, &s);
		CHECK(hyb_threadpool_side_flush(p));
		CHECK_EQ_INT(s.runs, 2);
		CHECK(!hyb_threadpool_side_flush(p));
		hyb_threadpool_free(p);
	}
}

static void note_cpu(void *arg, int ith, int nth)
{
	int *cpu = arg;

	(void)nth;
	cpu[ith] = sched_getcpu();
}

/* Pinning to a node's CPUs, the node each thread notes, refusals (docs/NUMA.md). */
TEST(pool_pins_threads_to_nodes_and_learns_them)
{
	struct hyb_threadpool *p = hyb_threadpool_new(2);
	const int node0[1] = { 0 }, bad[1] = { 999 };
	bool two = !access("/sys/devices/system/node/node1", F_OK);
	const int both[2] = { 0, 1 };
	int cpu[2] = { -1, -1 };
	cpu_set_t keep;

	CHECK(p);
	CHECK(!sched_getaffinity(0, sizeof(keep), &keep));
	CHECK_EQ_INT(hyb_threadpool_node(p, 0), -1);
	CHECK_EQ_INT(hyb_threadpool_node(p, 7), -1);
	CHECK_EQ_INT(hyb_threadpool_pin_nodes(p, bad, 1), -ENODEV);
	CHECK_MSG(strstr(hyb_last_error(), "node 999"), "%s", hyb_last_error());
	CHECK_EQ_INT(hyb_threadpool_pin_nodes(p, two ? both : node0, two ? 2 : 1), 0);
	hyb_threadpool_run(p, note_cpu, cpu);
	for (int i = 0; i < 2; i++) {
		char path[96];

		CHECK(cpu[i] >= 0);
		/* the CPU it ran on belongs to the node it was pinned to */
		snprintf(path, sizeof(path), "/sys/devices/system/node/node%d/cpu%d",
			 two ? i : 0, cpu[i]);
		CHECK_MSG(!access(path, F_OK), "thread %d ran on cpu %d, not on its node", i,
			  cpu[i]);
		/* one node: nothing to learn (-1); two: the node it ran on */
		CHECK_EQ_INT(hyb_threadpool_node(p, i), two ? i : -1);
	}
	CHECK(!sched_setaffinity(0, sizeof(keep), &keep));
	hyb_threadpool_free(p);
}
