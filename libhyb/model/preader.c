// SPDX-License-Identifier: MIT
/* pread() threads in io_uring's place (model/preader.h). */
#include "preader.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/error.h"

#define MAX_THREADS 16

struct req {
	uint64_t tag, off;
	void *buf;
	size_t len;
};

struct hyb_preader {
	int fd;
	pthread_mutex_t mu;
	pthread_cond_t work, done;
	struct req *sq;			/* ring of depth requests */
	struct hyb_preader_cqe *cq;	/* ring of depth completions */
	unsigned int depth, sq_head, sq_n, cq_head, cq_n, in_flight;
	unsigned int n_threads;
	bool stop;
	pthread_t th[MAX_THREADS];
};

static void *worker(void *arg)
{
	struct hyb_preader *p = arg;

	pthread_mutex_lock(&p->mu);
	for (;;) {
		struct req r;
		ssize_t n;

		while (!p->sq_n && !p->stop)
			pthread_cond_wait(&p->work, &p->mu);
		if (!p->sq_n)
			break;	/* stopping, nothing queued */
		r = p->sq[p->sq_head];
		p->sq_head = (p->sq_head + 1) % p->depth;
		p->sq_n--;
		pthread_mutex_unlock(&p->mu);
		n = pread(p->fd, r.buf, r.len, (off_t)r.off);
		pthread_mutex_lock(&p->mu);
		p->cq[(p->cq_head + p->cq_n) % p->depth] =
			(struct hyb_preader_cqe){ r.tag, n < 0 ? -errno : (int)n };
		p->cq_n++;
		pthread_cond_signal(&p->done);
	}
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

struct hyb_preader *hyb_preader_new(int fd, unsigned int threads, unsigned int depth)
{
	struct hyb_preader *p = calloc(1, sizeof(*p));

	if (!p || !depth || !(p->sq = calloc(depth, sizeof(*p->sq))) ||
	    !(p->cq = calloc(depth, sizeof(*p->cq)))) {
		if (p) {
			free(p->sq);
			free(p);
		}
		hyb_error_set(-ENOMEM, "pread threads: out of memory");
		return NULL;
	}
	p->fd = fd;
	p->depth = depth;
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->work, NULL);
	pthread_cond_init(&p->done, NULL);
	threads = threads < 1 ? 1 : threads > MAX_THREADS ? MAX_THREADS : threads;
	for (unsigned int i = 0; i < threads; i++) {
		int rc = pthread_create(&p->th[i], NULL, worker, p);

		if (rc) {
			hyb_preader_free(p);
			hyb_error_set(-rc, "pread threads: %s", strerror(rc));
			return NULL;
		}
		p->n_threads++;
	}
	return p;
}

void hyb_preader_free(struct hyb_preader *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->mu);
	p->stop = true;	/* the queued reads still run: their buffers are the caller's */
	pthread_cond_broadcast(&p->work);
	pthread_mutex_unlock(&p->mu);
	for (unsigned int i = 0; i < p->n_threads; i++)
		pthread_join(p->th[i], NULL);
	pthread_mutex_destroy(&p->mu);
	pthread_cond_destroy(&p->work);
	pthread_cond_destroy(&p->done);
	free(p->sq);
	free(p->cq);
	free(p);
}

int hyb_preader_submit(struct hyb_preader *p, uint64_t tag, void *buf, size_t len, uint64_t off)
{
	pthread_mutex_lock(&p->mu);
	if (p->in_flight == p->depth) {
		pthread_mutex_unlock(&p->mu);
		return -EAGAIN;
	}
	p->sq[(p->sq_head + p->sq_n) % p->depth] = (struct req){ tag, off, buf, len };
	p->sq_n++;
	p->in_flight++;
	pthread_cond_signal(&p->work);
	pthread_mutex_unlock(&p->mu);
	return 0;
}

unsigned int hyb_preader_reap(struct hyb_preader *p, struct hyb_preader_cqe *out,
			      unsigned int max)
{
	unsigned int n = 0;

	pthread_mutex_lock(&p->mu);
	while (!p->cq_n && p->in_flight)
		pthread_cond_wait(&p->done, &p->mu);
	while (p->cq_n && n < max) {
		out[n++] = p->cq[p->cq_head];
		p->cq_head = (p->cq_head + 1) % p->depth;
		p->cq_n--;
		p->in_flight--;
	}
	pthread_mutex_unlock(&p->mu);
	return n;
}
