// SPDX-License-Identifier: MIT
/*
 * hyb serve's request queue and decoding slots. Each slot is a thread with a
 * context (its own KV cache) that takes the oldest queued job and runs
 * hyb_generate on it; between tokens it checks the job's cancellation and
 * deadline. The queue has a limit: a full queue refuses a job (503 with
 * Retry-After in serve_api.c). Slots decode independently; continuous
 * batching over one shared GEMM is not here yet (docs/SERVE.md).
 *
 * One mutex (the queue's) guards the queue and every job's output: tokens
 * come at tens per second per slot, so it is never contended.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hyb/clock.h"
#include "hyb/model.h"
#include "hyb/tokenizer.h"
#include "serve.h"

struct serve_job *serve_job_new(int32_t *prompt, uint32_t n_prompt, uint32_t max_tokens,
				const struct hyb_sampler_params *sp, char **stop, size_t n_stop,
				double t_arrival, double timeout)
{
	struct serve_job *j = calloc(1, sizeof(*j));

	if (!j)
		return NULL;
	j->prompt = prompt;
	j->n_prompt = n_prompt;
	j->max_tokens = max_tokens;
	j->sp = *sp;
	j->stop = stop;
	j->n_stop = n_stop;
	j->t_arrival = t_arrival;
	j->deadline = t_arrival + timeout;
	pthread_cond_init(&j->cond, NULL);
	atomic_init(&j->refs, 1);
	return j;
}

void serve_job_put(struct serve_job *j)
{
	if (!j || atomic_fetch_sub(&j->refs, 1) != 1)
		return;
	pthread_cond_destroy(&j->cond);
	free(j->prompt);
	for (size_t i = 0; i < j->n_stop; i++)
		free(j->stop[i]);
	free(j->stop);
	sb_free(&j->text);
	free(j);
}

/* Under q->lock: the job is over; wake whoever waits on it. */
static void job_done(struct serve_queue *q, struct serve_job *j)
{
	(void)q;
	j->state = JOB_DONE;
	j->ready = j->text.len;
	pthread_cond_broadcast(&j->cond);
}

static void job_fail(struct serve_job *j, int status, const char *msg)
{
	j->error_status = status;
	snprintf(j->error, sizeof(j->error), "%s", msg);
}

/* Under q->lock: take j out of the queue if it is there. */
static bool unqueue(struct serve_queue *q, struct serve_job *j)
{
	for (struct serve_job **p = &q->head; *p; p = &(*p)->next) {
		if (*p != j)
			continue;
		*p = j->next;
		if (q->tail == j) {
			q->tail = NULL;
			for (struct serve_job *k = q->head; k; k = k->next)
				q->tail = k;
		}
		j->next = NULL;
		q->depth--;
		return true;
	}
	return false;
}

static const char *cancel_text(enum serve_cancel why)
{
	return why == CANCEL_TIMEOUT ? "the request timed out" :
	       why == CANCEL_SHUTDOWN ? "the server is shutting down" : "the client went away";
}

/* Under q->lock. */
static void cancel_locked(struct serve_queue *q, struct serve_job *j, enum serve_cancel why)
{
	if (j->state == JOB_DONE || j->cancel)
		return;
	j->cancel = why;
	pthread_mutex_lock(&q->mt->lock);
	q->mt->cancelled[why]++;
	pthread_mutex_unlock(&q->mt->lock);
	if (j->state == JOB_QUEUED && unqueue(q, j)) {
		job_fail(j, why == CANCEL_TIMEOUT ? 504 : 503, cancel_text(why));
		job_done(q, j);
		serve_job_put(j); /* the queue's reference */
	}
	/* a running job sees j->cancel at its next token */
}

void serve_job_cancel(struct serve_queue *q, struct serve_job *j, enum serve_cancel why)
{
	pthread_mutex_lock(&q->lock);
	cancel_locked(q, j, why);
	pthread_mutex_unlock(&q->lock);
}

int serve_queue_submit(struct serve_queue *q, struct serve_job *j)
{
	int rc = 0;

	pthread_mutex_lock(&q->lock);
	if (q->stopping) {
		rc = -ESHUTDOWN;
	} else if (q->depth >= q->max_depth + (q->n_slots - q->running)) {
		/* the limit counts requests that wait: one an idle slot is about to take does not */
		rc = -EBUSY;
	} else {
		atomic_fetch_add(&j->refs, 1);
		j->state = JOB_QUEUED;
		if (q->tail)
			q->tail->next = j;
		else
			q->head = j;
		q->tail = j;
		q->depth++;
		pthread_cond_signal(&q->cond);
	}
	pthread_mutex_unlock(&q->lock);
	return rc;
}

bool serve_job_wait(struct serve_queue *q, struct serve_job *j, size_t sent, double check_s)
{
	struct timespec ts;
	bool news;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_nsec += (long)(check_s * 1e9);
	ts.tv_sec += ts.tv_nsec / 1000000000;
	ts.tv_nsec %= 1000000000;
	pthread_mutex_lock(&q->lock);
	while (!(news = j->state == JOB_DONE || j->ready > sent))
		if (pthread_cond_timedwait(&j->cond, &q->lock, &ts))
			break;
	/* a running job's own deadline is checked per token; one still queued is checked here */
	if (!news && hyb_now() > j->deadline)
		cancel_locked(q, j, CANCEL_TIMEOUT);
	pthread_mutex_unlock(&q->lock);
	return news;
}

int serve_job_view(struct serve_queue *q, struct serve_job *j, size_t from,
		   struct serve_job_view *v)
{
	int rc = 0;

	memset(v, 0, sizeof(*v));
	pthread_mutex_lock(&q->lock);
	if (j->ready > from) {
		v->len = j->ready - from;
		v->text = malloc(v->len);
		if (v->text)
			memcpy(v->text, j->text.s + from, v->len);
		else
			rc = -ENOMEM;
	}
	v->done = j->state == JOB_DONE;
	v->finish = j->finish;
	v->cancel = j->cancel;
	v->error_status = j->error_status;
	memcpy(v->error, j->error, sizeof(v->error));
	v->n_gen = j->n_gen;
	pthread_mutex_unlock(&q->lock);
	if (rc)
		v->len = 0;
	return rc;
}

struct run {
	struct serve_queue *q;
	struct serve_job *j;
	bool stopped;  /* we stopped it: a stop string or a cancellation */
};

/* hyb_generate's token callback: the text so far, stop strings, cancellation. */
static int on_token(void *arg, int32_t token)
{
	struct run *r = arg;
	struct serve_queue *q = r->q;
	struct serve_job *j = r->j;
	char piece[256];
	int n = hyb_token_to_piece(q->m->tok, token, piece, sizeof(piece));
	double now = hyb_now();
	size_t hold = 0, at;
	int stop = 0;

	pthread_mutex_lock(&q->lock);
	if (!j->t_first) {
		j->t_first = now;
		serve_metrics_ttft(q->mt, now - j->t_arrival);
	}
	j->n_gen++;
	if (n > 0)
		sb_add(&j->text, piece, n < (int)sizeof(piece) ? (size_t)n : sizeof(piece));
	if (j->text.oom) {
		job_fail(j, 500, "out of memory for the reply");
		stop = 1;
	}
	at = serve_stop_find(j->text.s, j->text.len, j->stop_from, j->stop, j->n_stop, &hold);
	j->stop_from = j->text.len;
	if (at < j->text.len) {
		j->text.len = at;
		j->finish = FINISH_STOP;
		hold = 0;
		stop = 1;
	}
	if (!stop && (j->cancel || q->abort || now > j->deadline)) {
		if (!j->cancel)
			cancel_locked(q, j, now > j->deadline ? CANCEL_TIMEOUT : CANCEL_SHUTDOWN);
		stop = 1;
	}
	if (!stop) {
		size_t tail = cli_utf8_tail(j->text.s, j->text.len);

		j->ready = j->text.len - (hold > tail ? hold : tail);
		pthread_cond_broadcast(&j->cond);
	}
	r->stopped = stop;
	pthread_mutex_unlock(&q->lock);
	return stop;
}

static void run_job(struct serve_slot *sl, struct serve_job *j)
{
	struct serve_queue *q = sl->q;
	struct run r = { q, j, false };
	struct hyb_gen_stats st;
	struct hyb_sampler *s;
	int rc;

	hyb_ctx_reset(sl->ctx);
	s = hyb_sampler_new(&j->sp, (int32_t)q->m->hp.n_vocab);
	if (!s) {
		pthread_mutex_lock(&q->lock);
		job_fail(j, 500, "cannot make the sampler");
		goto done;
	}
	rc = hyb_generate(sl->ctx, q->m, s, j->prompt, j->n_prompt, j->max_tokens, on_token, &r,
			  &st);
	hyb_sampler_free(s);
	pthread_mutex_lock(&q->lock);
	j->st = st;
	if (rc) {
		char msg[256];

		snprintf(msg, sizeof(msg), "generation failed: %s", hyb_last_error());
		job_fail(j, 500, msg);
	} else if (j->cancel && !j->error_status) {
		job_fail(j, j->cancel == CANCEL_TIMEOUT ? 504 : 503, cancel_text(j->cancel));
	} else if (!r.stopped) {
		/* the loop ended on its own: the token budget, or an end-of-generation token */
		j->finish = st.n_gen >= j->max_tokens ? FINISH_LENGTH : FINISH_STOP;
	}
	pthread_mutex_lock(&q->mt->lock);
	q->mt->prompt_tokens += st.n_prompt;
	q->mt->completion_tokens += st.n_gen;
	q->mt->prompt_s += st.t_prompt;
	q->mt->decode_s += st.t_gen;
	if (st.n_decode && st.t_gen > 0)
		q->mt->last_tps = st.n_decode / st.t_gen;
	pthread_mutex_unlock(&q->mt->lock);
	fprintf(stderr, "hyb serve: slot %d: %u prompt tokens in %.3f s, %u generated in %.3f s%s%s\n",
		(int)(sl - q->slots), st.n_prompt, st.t_prompt, st.n_gen, st.t_gen,
		j->error_status ? ": " : j->finish == FINISH_STOP ? " (stop)" : " (length)",
		j->error_status ? j->error : "");
done:
	job_done(q, j);
	q->running--;
	pthread_mutex_unlock(&q->lock);
	serve_job_put(j);
}

static void *worker(void *arg)
{
	struct serve_slot *sl = arg;
	struct serve_queue *q = sl->q;

	for (;;) {
		struct serve_job *j;

		pthread_mutex_lock(&q->lock);
		while (!q->head && !q->stopping)
			pthread_cond_wait(&q->cond, &q->lock);
		if (!q->head) {
			pthread_mutex_unlock(&q->lock);
			return NULL;
		}
		j = q->head;
		unqueue(q, j);
		j->state = JOB_RUNNING;
		q->running++;
		pthread_mutex_unlock(&q->lock);
		run_job(sl, j);
	}
}

int serve_queue_start(struct serve_queue *q, const struct hyb_model *m, struct serve_metrics *mt,
		      int n_slots, int max_depth, uint32_t n_ctx, int n_threads)
{
	struct hyb_ctx_params p = { .n_ctx = n_ctx, .n_threads = n_threads };

	memset(q, 0, sizeof(*q));
	pthread_mutex_init(&q->lock, NULL);
	pthread_cond_init(&q->cond, NULL);
	q->m = m;
	q->mt = mt;
	q->max_depth = max_depth;
	q->slots = calloc((size_t)n_slots, sizeof(*q->slots));
	if (!q->slots)
		return -ENOMEM;
	q->n_slots = n_slots;
	for (int i = 0; i < n_slots; i++) {
		struct serve_slot *sl = &q->slots[i];

		sl->q = q;
		sl->ctx = hyb_ctx_new(m, &p);
		if (!sl->ctx) {
			fprintf(stderr, "hyb serve: slot %d: %s\n", i, hyb_last_error());
			return -ENOMEM;
		}
		if (pthread_create(&sl->thread, NULL, worker, sl)) {
			fprintf(stderr, "hyb serve: cannot start slot %d's thread\n", i);
			return -EAGAIN;
		}
		sl->started = true;
	}
	q->n_ctx = hyb_ctx_n_ctx(q->slots[0].ctx);
	return 0;
}

uint32_t serve_queue_n_ctx(const struct serve_queue *q)
{
	return q->n_ctx;
}

void serve_queue_drain(struct serve_queue *q)
{
	pthread_mutex_lock(&q->lock);
	q->stopping = true;
	/* nothing queued will start: those requests are answered 503 now */
	while (q->head)
		cancel_locked(q, q->head, CANCEL_SHUTDOWN);
	pthread_mutex_unlock(&q->lock);
}

int serve_queue_running(struct serve_queue *q)
{
	int n;

	pthread_mutex_lock(&q->lock);
	n = q->running;
	pthread_mutex_unlock(&q->lock);
	return n;
}

void serve_queue_stop(struct serve_queue *q)
{
	pthread_mutex_lock(&q->lock);
	q->stopping = true;
	while (q->head)
		cancel_locked(q, q->head, CANCEL_SHUTDOWN);
	/* running jobs stop at their next token */
	q->abort = true;
	pthread_cond_broadcast(&q->cond);
	pthread_mutex_unlock(&q->lock);
	for (int i = 0; i < q->n_slots; i++) {
		if (q->slots[i].started)
			pthread_join(q->slots[i].thread, NULL);
		hyb_ctx_free(q->slots[i].ctx);
	}
	free(q->slots);
	q->slots = NULL;
	q->n_slots = 0;
}
