// SPDX-License-Identifier: MIT
/*
 * hyb serve's request queue and its engines (continuous batching, Orca's
 * iteration-level scheduling: docs/SERVE.md). An engine is a thread with a
 * context of several sequences over one paged KV cache. Each step it admits
 * queued jobs while a sequence is free and the cache can promise a job its
 * prompt plus max_tokens, then runs one hyb_ctx_eval_seqs pass over every
 * running job (new ones' prompt pieces beside the others' next tokens),
 * samples each job's token, and lets finished or cancelled jobs leave.
 * Prompts go in chunks (Sarathi-Serve's chunked prefill, docs/SERVE.md): a
 * step takes at most one pass's piece of prompt tokens (n_batch), so that a
 * long prompt delays the running jobs' tokens by one piece's time per step,
 * not by its whole prefill. Models that cannot batch yet run --parallel
 * engines of one sequence each.
 *
 * The queue has a limit: a full queue refuses a job (503 with Retry-After in
 * serve_api.c). One mutex (the queue's) guards the queue and every job's
 * output: it is taken a few times per step, never while a pass computes.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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
	j->logprobs = -1;
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
	free(j->lps);
	free(j->plps);
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
	} else if (q->depth >= q->max_depth + (q->capacity - q->running)) {
		/* the limit counts requests that wait: one a free sequence is about to take does not */
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
	v->n_cached = j->n_cached;
	if (j->logprobs >= 0 && j->n_lps) {
		/* the tokens whose text starts in text[from..ready) */
		uint32_t a = 0, b;

		while (a < j->n_lps && j->lps[a].off < from)
			a++;
		for (b = a; b < j->n_lps && j->lps[b].off < j->ready; b++)
			;
		v->lps = b > a ? malloc(sizeof(*v->lps) * (b - a)) : NULL;
		if (v->lps) {
			memcpy(v->lps, j->lps + a, sizeof(*v->lps) * (b - a));
			v->n_lps = b - a;
		} else if (b > a) {
			rc = -ENOMEM;
		}
	}
	pthread_mutex_unlock(&q->lock);
	if (rc)
		v->len = 0;
	return rc;
}

/*
 * The log probabilities of token under the raw logits (the model's own
 * distribution, as OpenAI's logprobs), and the top most likely tokens', best
 * first (ties: the lower id), into lp.
 */
static void logprobs_of(const float *raw, uint32_t V, int32_t token, int top,
			struct serve_lp *lp)
{
	double sum = 0;
	float mx = raw[0];

	for (uint32_t i = 1; i < V; i++)
		mx = raw[i] > mx ? raw[i] : mx;
	for (uint32_t i = 0; i < V; i++)
		sum += exp((double)raw[i] - mx);
	const double lse = mx + log(sum);

	lp->tok = token;
	lp->lp = (float)(raw[token] - lse);
	lp->n_top = 0;
	for (uint32_t i = 0; top > 0 && i < V; i++) {
		int at = lp->n_top;

		/* insertion into the sorted top list; most tokens fail the first test */
		if (at == top && !(raw[i] > lp->top_lp[top - 1]))
			continue;
		while (at > 0 && raw[i] > lp->top_lp[at - 1])
			at--;
		if (at >= top)
			continue;
		const int n = lp->n_top < top ? lp->n_top : top - 1;

		memmove(&lp->top_lp[at + 1], &lp->top_lp[at], sizeof(float) * (size_t)(n - at));
		memmove(&lp->top_tok[at + 1], &lp->top_tok[at], sizeof(int32_t) * (size_t)(n - at));
		lp->top_lp[at] = raw[i];
		lp->top_tok[at] = (int32_t)i;
		if (lp->n_top < top)
			lp->n_top++;
	}
	for (int k = 0; k < lp->n_top; k++)
		lp->top_lp[k] = (float)(lp->top_lp[k] - lse);
}

/* A new token of a running job: the text so far, stop strings, cancellation. Stop: true. */
static bool on_token(struct serve_queue *q, struct serve_seq *a, int32_t token,
		     const struct serve_lp *lp)
{
	struct serve_job *j = a->j;
	char piece[256];
	int n = hyb_token_to_piece(q->m->tok, token, piece, sizeof(piece));
	double now = hyb_now();
	size_t hold = 0, at;
	bool stop = false;

	pthread_mutex_lock(&q->lock);
	if (!j->t_first) {
		j->t_first = now;
		serve_metrics_ttft(q->mt, now - j->t_arrival);
	}
	j->n_gen++;
	if (lp) {
		if (j->n_lps == j->cap_lps) {
			const uint32_t cap = j->cap_lps ? 2 * j->cap_lps : 64;
			struct serve_lp *p = realloc(j->lps, sizeof(*p) * cap);

			if (p) {
				j->lps = p;
				j->cap_lps = cap;
			}
		}
		if (j->n_lps < j->cap_lps) {
			j->lps[j->n_lps] = *lp;
			j->lps[j->n_lps++].off = (uint32_t)j->text.len;
		} else {
			job_fail(j, 500, "out of memory for the log probabilities");
			stop = true;
		}
	}
	if (n > 0)
		sb_add(&j->text, piece, n < (int)sizeof(piece) ? (size_t)n : sizeof(piece));
	if (j->text.oom) {
		job_fail(j, 500, "out of memory for the reply");
		stop = true;
	}
	at = serve_stop_find(j->text.s, j->text.len, j->stop_from, j->stop, j->n_stop, &hold);
	j->stop_from = j->text.len;
	if (at < j->text.len) {
		j->text.len = at;
		j->finish = FINISH_STOP;
		hold = 0;
		stop = true;
	}
	if (!stop) {
		size_t tail = cli_utf8_tail(j->text.s, j->text.len);

		j->ready = j->text.len - (hold > tail ? hold : tail);
		pthread_cond_broadcast(&j->cond);
	}
	a->stopped = stop;
	pthread_mutex_unlock(&q->lock);
	return stop;
}

/* Cancelled, timed out or aborted: the job stops before its next step. */
static bool should_stop(struct serve_queue *q, struct serve_seq *a, double now)
{
	struct serve_job *j = a->j;
	bool stop;

	pthread_mutex_lock(&q->lock);
	if (!j->cancel && (q->abort || now > j->deadline))
		cancel_locked(q, j, now > j->deadline ? CANCEL_TIMEOUT : CANCEL_SHUTDOWN);
	stop = j->cancel != CANCEL_NONE;
	pthread_mutex_unlock(&q->lock);
	a->stopped |= stop;
	return stop;
}

/* Job a leaves the engine: its answer is complete (or failed); its sequence is freed. */
static void finish(struct serve_slot *sl, int k)
{
	struct serve_queue *q = sl->q;
	struct serve_seq *a = &sl->act[k];
	struct serve_job *j = a->j;

	if (a->started)
		a->st.t_gen = hyb_now() - a->t_gen0;
	hyb_ctx_seq_close(sl->ctx, a->seq);
	hyb_sampler_free(a->s);
	pthread_mutex_lock(&q->lock);
	j->st = a->st;
	if (j->cancel && !j->error_status)
		job_fail(j, j->cancel == CANCEL_TIMEOUT ? 504 : 503, cancel_text(j->cancel));
	else if (!a->stopped && !j->error_status)
		/* it ended on its own: the token budget, or an end-of-generation token */
		j->finish = a->st.n_gen >= j->max_tokens ? FINISH_LENGTH : FINISH_STOP;
	pthread_mutex_lock(&q->mt->lock);
	q->mt->prompt_tokens += a->st.n_prompt;
	q->mt->cached_tokens += j->n_cached;
	q->mt->completion_tokens += a->st.n_gen;
	q->mt->prompt_s += a->st.t_prompt;
	q->mt->decode_s += a->st.t_gen;
	if (a->st.n_decode && a->st.t_gen > 0)
		q->mt->last_tps = a->st.n_decode / a->st.t_gen;
	pthread_mutex_unlock(&q->mt->lock);
	fprintf(stderr, "hyb serve: engine %d seq %d: %u prompt tokens in %.3f s, %u generated "
		"in %.3f s%s%s\n", (int)(sl - q->slots), a->seq, a->st.n_prompt, a->st.t_prompt,
		a->st.n_gen, a->st.t_gen,
		j->error_status ? ": " : j->finish == FINISH_STOP ? " (stop)" : " (length)",
		j->error_status ? j->error : "");
	job_done(q, j);
	q->running--;
	hyb_ctx_kv_stats(sl->ctx, &sl->kv);
	pthread_mutex_unlock(&q->lock);
	serve_job_put(j);
	sl->act[k] = sl->act[--sl->n_act];
}

static void fail(struct serve_slot *sl, int k, const char *msg)
{
	pthread_mutex_lock(&sl->q->lock);
	job_fail(sl->act[k].j, 500, msg);
	pthread_mutex_unlock(&sl->q->lock);
	finish(sl, k);
}

/* The device's statistics for /metrics (under the queue's lock). */
static void snapshot_hybrid(struct serve_slot *sl)
{
	if (!sl->hybrid)
		return;
	hyb_ctx_hybrid_stats(sl->ctx, &sl->hy);
	hyb_ctx_hybrid_cache(sl->ctx, &sl->hy_resident, &sl->hy_slots);
}

/* One pass over every running job, then each job's next token (hyb_generate's loop). */
static void step(struct serve_slot *sl)
{
	struct serve_queue *q = sl->q;
	const uint32_t V = q->m->hp.n_vocab, piece = hyb_ctx_n_batch(sl->ctx);
	/*
	 * Prompt tokens this step: one piece. A job's prompt goes in the pieces
	 * hyb_ctx_eval_seqs would cut it into (n_batch from its first token),
	 * whole pieces or its last one, so its tokens and bits are those of
	 * one call (batch invariance); the first job waiting always fits.
	 */
	uint32_t budget = piece;
	double now = hyb_now();
	int nb = 0, rc;

	for (int k = 0; k < sl->n_act;) {
		struct serve_seq *a = &sl->act[k];

		if (should_stop(q, a, now)) {
			finish(sl, k);
			continue;
		}
		if (!a->s && !(a->s = hyb_sampler_new(&a->j->sp, (int32_t)V))) {
			fail(sl, k, "cannot make the sampler");
			continue;
		}
		sl->b_of[k] = -1;
		if (a->started) {
			sl->b[nb] = (struct hyb_seq_tokens){ a->seq, &a->next, 1 };
		} else {
			const uint32_t left = a->j->n_prompt - a->fed;
			const uint32_t n = left < piece ? left : piece;

			if (n > budget) { /* the next step's */
				k++;
				continue;
			}
			budget -= n;
			if (!a->t_prompt0)
				a->t_prompt0 = now;
			sl->b[nb] = (struct hyb_seq_tokens){ a->seq, a->j->prompt + a->fed, n };
			/* an echoed prompt's log probabilities: every row's logits */
			if (a->j->plps && !(sl->all[nb] = malloc(sizeof(float) * V * n))) {
				fail(sl, k, "out of memory for the prompt's log probabilities");
				continue;
			}
		}
		sl->b_of[k++] = nb++;
	}
	if (!nb)
		return;
	rc = hyb_ctx_eval_seqs_all(sl->ctx, sl->b, (uint32_t)nb, sl->logits, sl->all);
	now = hyb_now();
	pthread_mutex_lock(&q->lock);
	sl->last_batch = nb;
	sl->steps++;
	hyb_ctx_kv_stats(sl->ctx, &sl->kv);
	snapshot_hybrid(sl);
	pthread_mutex_unlock(&q->lock);
	/* finish() moves the last job into a freed place: go from the end */
	for (int k = sl->n_act - 1; k >= 0; k--) {
		struct serve_seq *a = &sl->act[k];
		const int i = sl->b_of[k];
		float *lg = sl->logits + (size_t)(i > 0 ? i : 0) * V;
		struct serve_lp lp;
		int32_t tok;

		if (i < 0)
			continue; /* nothing of it in this step */

		if (rc) {
			char msg[256];

			snprintf(msg, sizeof(msg), "generation failed: %s", hyb_last_error());
			fail(sl, k, msg);
			continue;
		}
		if (!a->started) {
			/* row r of the piece predicts prompt token fed + r + 1 */
			for (uint32_t r = 0; sl->all[i] && r < sl->b[i].n; r++)
				if (a->fed + r + 1 < a->j->n_prompt)
					logprobs_of(sl->all[i] + (size_t)r * V, V,
						    a->j->prompt[a->fed + r + 1], a->j->logprobs,
						    &a->j->plps[a->fed + r + 1]);
			a->fed += sl->b[i].n;
			if (a->fed < a->j->n_prompt)
				continue; /* more pieces to go: these logits are not the prompt's */
			a->started = true;
			/*
			 * its prompt's whole pieces for the requests that start the
			 * same way, from now on: those running beside it too
			 */
			if (q->prefix_cache &&
			    hyb_ctx_seq_keep(sl->ctx, a->seq, a->j->prompt, a->j->n_prompt))
				fprintf(stderr, "hyb serve: prefix cache: %s\n", hyb_last_error());
			a->st.n_prompt = a->j->n_prompt;
			a->st.t_prompt = now - a->t_prompt0;
			a->t_gen0 = now;
			for (uint32_t i = 0; i < a->j->n_prompt; i++)
				hyb_sampler_accept(a->s, a->j->prompt[i]);
		} else {
			a->st.n_decode++;
		}
		if (a->st.n_gen >= a->j->max_tokens) {
			finish(sl, k);
			continue;
		}
		if (a->j->logprobs >= 0) /* the sampler may change lg */
			memcpy(sl->raw, lg, sizeof(float) * V);
		tok = hyb_sampler_sample(a->s, lg);
		if (tok < 0) {
			fail(sl, k, "sampling failed");
			continue;
		}
		if (hyb_tokenizer_is_eog(q->m->tok, tok)) {
			finish(sl, k);
			continue;
		}
		hyb_sampler_accept(a->s, tok);
		a->st.n_gen++;
		if (a->j->logprobs >= 0)
			logprobs_of(sl->raw, V, tok, a->j->logprobs, &lp);
		if (on_token(q, a, tok, a->j->logprobs >= 0 ? &lp : NULL) ||
		    a->st.n_gen >= a->j->max_tokens) {
			finish(sl, k);
			continue;
		}
		a->next = tok;
	}
	for (int i = 0; i < nb; i++) {
		free(sl->all[i]);
		sl->all[i] = NULL;
	}
}

/* Under q->lock: take queued jobs while a sequence is free and the cache can promise them. */
static void admit(struct serve_slot *sl)
{
	struct serve_queue *q = sl->q;

	while (sl->n_act < sl->n_seq && q->head && !q->abort) {
		struct serve_job *j = q->head;
		uint32_t reused = 0;
		/* an echoed prompt's log probabilities need every row: evaluated in full */
		int s = q->prefix_cache && !j->plps ?
			hyb_ctx_seq_open_prefix(sl->ctx, j->n_prompt + j->max_tokens, j->prompt,
						j->n_prompt, &reused) :
			hyb_ctx_seq_open(sl->ctx, j->n_prompt + j->max_tokens);

		if (s < 0)
			break; /* the cache is promised: a finishing job frees it */
		unqueue(q, j);
		j->state = JOB_RUNNING;
		j->n_cached = reused;
		q->running++;
		sl->act[sl->n_act++] = (struct serve_seq){ .j = j, .seq = s, .fed = reused,
							   .t_admit = hyb_now() };
	}
}

static void *worker(void *arg)
{
	struct serve_slot *sl = arg;
	struct serve_queue *q = sl->q;

	for (;;) {
		pthread_mutex_lock(&q->lock);
		admit(sl);
		if (!sl->n_act) {
			sl->last_batch = 0;
			if (q->stopping && !q->head) {
				pthread_mutex_unlock(&q->lock);
				return NULL;
			}
			pthread_cond_wait(&q->cond, &q->lock);
			pthread_mutex_unlock(&q->lock);
			continue;
		}
		pthread_mutex_unlock(&q->lock);
		step(sl);
	}
}

static int engine_new(struct serve_queue *q, struct serve_slot *sl, int n_seq,
		      const struct hyb_ctx_params *p)
{
	sl->q = q;
	sl->n_seq = n_seq;
	sl->ctx = hyb_ctx_new(q->m, p);
	if (!sl->ctx || (q->teal_thr && hyb_ctx_set_teal_thresholds(sl->ctx, q->teal_thr)))
		return -1;
	sl->act = calloc((size_t)n_seq, sizeof(*sl->act));
	sl->b = calloc((size_t)n_seq, sizeof(*sl->b));
	sl->b_of = calloc((size_t)n_seq, sizeof(*sl->b_of));
	sl->logits = malloc(sizeof(float) * q->m->hp.n_vocab * (size_t)n_seq);
	sl->raw = malloc(sizeof(float) * q->m->hp.n_vocab);
	sl->all = calloc((size_t)n_seq, sizeof(*sl->all));
	if (!sl->act || !sl->b || !sl->b_of || !sl->logits || !sl->raw || !sl->all)
		return -ENOMEM;
	hyb_ctx_kv_stats(sl->ctx, &sl->kv);
	sl->hybrid = hyb_ctx_hybrid(sl->ctx);
	snapshot_hybrid(sl);
	return 0;
}

int serve_queue_start(struct serve_queue *q, const struct hyb_model *m, struct serve_metrics *mt,
		      const struct serve_engine_opts *o)
{
	struct hyb_ctx_params p = { .n_ctx = o->n_ctx, .n_threads = o->n_threads,
				    .n_seq = (uint32_t)o->parallel, .kv_size = o->kv_size,
				    .batch_variant = o->batch_variant, .hybrid = o->hybrid,
				    .numa_no_pin = o->numa_no_pin,
				    .n_batch = o->n_batch };
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);

	memset(q, 0, sizeof(*q));
	pthread_mutex_init(&q->lock, NULL);
	pthread_cond_init(&q->cond, NULL);
	q->m = m;
	q->mt = mt;
	q->max_depth = o->max_depth;
	q->capacity = o->parallel;
	q->slots = calloc((size_t)o->parallel, sizeof(*q->slots));
	if (!q->slots)
		return -ENOMEM;
	q->teal_thr = o->teal_thr;
	q->prefix_cache = !o->no_prefix_cache;
	if (o->parallel > 1 && !o->no_batch) {
		/* one engine batching every job, if the model can */
		q->n_slots = 1;
		if (engine_new(q, &q->slots[0], o->parallel, &p) == 0) {
			q->batched = true;
			if (o->teal_thr) /* docs/SERVE.md#teal */
				fprintf(stderr, "hyb serve: TEAL: one engine batching %d sequences, "
					"their decode steps %s\n", o->parallel,
					p.batch_variant ? "through the dense GEMM of the masked inputs"
							: "through TEAL's GEMV, as alone");
		} else if (o->hybrid) {
			/* one device: engines of their own would each take the whole budget */
			fprintf(stderr, "hyb serve: %s\n", hyb_last_error());
			return -EINVAL;
		} else {
			fprintf(stderr, "hyb serve: no batching (%s): %d engines of one "
				"sequence\n", hyb_last_error(), o->parallel);
			hyb_ctx_free(q->slots[0].ctx);
			free(q->slots[0].act);
			free(q->slots[0].b);
			free(q->slots[0].logits);
			memset(&q->slots[0], 0, sizeof(q->slots[0]));
		}
	}
	if (!q->batched) {
		/* one sequence per engine; the CPUs shared among them unless told */
		p.n_seq = 0;
		p.kv_size = 0;
		if (!o->n_threads)
			p.n_threads = ncpu > o->parallel ? (int)(ncpu / o->parallel) : 1;
		q->n_slots = o->parallel;
		for (int i = 0; i < o->parallel; i++) {
			if (engine_new(q, &q->slots[i], 1, &p)) {
				fprintf(stderr, "hyb serve: engine %d: %s\n", i, hyb_last_error());
				return -ENOMEM;
			}
		}
	}
	for (int i = 0; i < q->n_slots; i++) {
		if (pthread_create(&q->slots[i].thread, NULL, worker, &q->slots[i])) {
			fprintf(stderr, "hyb serve: cannot start engine %d's thread\n", i);
			return -EAGAIN;
		}
		q->slots[i].started = true;
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
	pthread_cond_broadcast(&q->cond);
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
	/* running jobs stop at their next step */
	q->abort = true;
	pthread_cond_broadcast(&q->cond);
	pthread_mutex_unlock(&q->lock);
	for (int i = 0; i < q->n_slots; i++) {
		struct serve_slot *sl = &q->slots[i];

		if (sl->started)
			pthread_join(sl->thread, NULL);
		hyb_ctx_free(sl->ctx);
		free(sl->act);
		free(sl->b);
		free(sl->b_of);
		free(sl->logits);
		free(sl->raw);
		free(sl->all);
	}
	free(q->slots);
	q->slots = NULL;
	q->n_slots = 0;
}
