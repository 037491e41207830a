// SPDX-License-Identifier: MIT
/*
 * hyb serve's generation endpoints, POST /v1/completions and
 * /v1/chat/completions: the request checked and tokenized (a chat through
 * the model's template), a job queued, then either one JSON reply when it is
 * done or Server-Sent Events as its text arrives, ending in "data: [DONE]".
 * A client that goes away cancels its job (docs/SERVE.md).
 */
#include <errno.h>
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hyb/chat.h"
#include "hyb/clock.h"
#include "hyb/model.h"
#include "hyb/tokenizer.h"
#include "serve.h"

/* how often a waiting connection looks whether its client is still there */
#define CHECK_S 0.1

static const char *route_of(bool chat)
{
	return chat ? "/v1/chat/completions" : "/v1/completions";
}

/* The prompt's tokens; 0, or -1 with e filled. */
static int prompt_tokens(struct serve *sv, struct serve_request *r, int32_t **ids, uint32_t *n,
			 struct serve_err *e)
{
	const struct hyb_tokenizer *tok = sv->m->tok;
	unsigned int flags = HYB_TOKENIZE_ADD_SPECIAL;
	char *text = NULL;
	const char *src;
	int got;

	if (!r->chat && !r->prompt) {
		/* token ids as given */
		for (uint32_t i = 0; i < r->n_prompt_ids; i++)
			if (r->prompt_ids[i] >= (int32_t)sv->m->hp.n_vocab)
				return serve_err_set(e, 400, "invalid_request_error", NULL, "prompt",
						     "token id %d is past the vocabulary (%u)",
						     r->prompt_ids[i], sv->m->hp.n_vocab);
		*ids = r->prompt_ids;
		*n = r->n_prompt_ids;
		r->prompt_ids = NULL;
		return 0;
	}
	if (r->chat) {
		int len = hyb_chat_format(sv->tmpl, r->msgs, r->n_msgs, true, NULL, 0);

		if (len < 0)
			return serve_err_set(e, 400, "invalid_request_error", NULL, "messages",
					     "%s", hyb_last_error());
		text = malloc((size_t)len + 1);
		if (!text)
			return serve_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
		hyb_chat_format(sv->tmpl, r->msgs, r->n_msgs, true, text, len + 1);
		/* the template's markers are control tokens (hyb/chat.h), as in hyb run --chat */
		flags |= HYB_TOKENIZE_PARSE_SPECIAL;
		src = text;
	} else {
		src = r->prompt;
	}
	got = hyb_tokenize_flags(tok, src, strlen(src), flags, NULL, 0);
	if (got < 0) {
		free(text);
		return serve_err_set(e, 400, "invalid_request_error", NULL,
				     r->chat ? "messages" : "prompt", "cannot tokenize the prompt: %s",
				     hyb_last_error());
	}
	*ids = malloc(sizeof(**ids) * (got ? (size_t)got : 1));
	if (!*ids) {
		free(text);
		return serve_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
	}
	hyb_tokenize_flags(tok, src, strlen(src), flags, *ids, got);
	*n = (uint32_t)got;
	free(text);
	return 0;
}

/* ---- echo ---- */

/* echo: the prompt's text and log probabilities before the reply's */
struct echo {
	char *text;
	size_t len;
	struct serve_lp *lps;
	uint32_t n_lps;
};

static void echo_free(struct echo *ec)
{
	free(ec->text);
	free(ec->lps);
	memset(ec, 0, sizeof(*ec));
}

/* j done: its prompt's pieces, then v's text; prompt and reply logprobs with offsets. */
static int echo_prompt(struct serve *sv, const struct serve_job *j,
		       const struct serve_job_view *v, struct echo *ec)
{
	size_t cap = (size_t)j->n_prompt * 8 + v->len + 64;
	char piece[256];

	if (!j->echo)
		return 0;
	ec->text = malloc(cap);
	if (j->plps)
		ec->lps = malloc(sizeof(*ec->lps) * ((size_t)j->n_prompt + v->n_lps));
	if (!ec->text || (j->plps && !ec->lps))
		return -1;
	for (uint32_t i = 0; i < j->n_prompt; i++) {
		const int n = hyb_token_to_piece(sv->m->tok, j->prompt[i], piece, sizeof(piece));
		const size_t k = n < 0 ? 0 : n < (int)sizeof(piece) ? (size_t)n : sizeof(piece);

		if (ec->lps) {
			ec->lps[i] = j->plps[i];
			ec->lps[i].tok = j->prompt[i];
			ec->lps[i].off = (uint32_t)ec->len;
		}
		if (ec->len + k + v->len + 1 > cap) {
			char *t = realloc(ec->text, cap = 2 * (ec->len + k + v->len + 1));

			if (!t)
				return -1;
			ec->text = t;
		}
		memcpy(ec->text + ec->len, piece, k);
		ec->len += k;
	}
	for (uint32_t i = 0; ec->lps && i < v->n_lps; i++) {
		ec->lps[j->n_prompt + i] = v->lps[i];
		ec->lps[j->n_prompt + i].off += (uint32_t)ec->len;
	}
	ec->n_lps = ec->lps ? j->n_prompt + v->n_lps : 0;
	if (v->len)
		memcpy(ec->text + ec->len, v->text, v->len);
	ec->len += v->len;
	return 0;
}

/* ---- a streamed reply ---- */

enum { ST_ROLE, ST_BODY, ST_END };

struct stream {
	struct serve *sv;
	struct serve_job *j;
	struct MHD_Connection *conn;
	struct serve_reply rep;
	char id[64];
	bool include_usage;
	bool echo_pending;  /* echo: the prompt's chunk is still to come */
	size_t echo_len;    /* its bytes: the reply's text offsets start there */
	int phase;
	size_t sent;       /* bytes of the job's text sent */
	struct sbuf out;   /* events not yet handed to MHD */
	size_t out_off;
};

static void event(struct stream *s, char *json)
{
	if (!json) {
		s->out.oom = true;
		return;
	}
	sb_add(&s->out, "data: ", 6);
	sb_add(&s->out, json, strlen(json));
	sb_add(&s->out, "\n\n", 2);
	free(json);
}

/* The next events of the stream into s->out; false: the client went away. */
static bool next_events(struct stream *s)
{
	struct serve_job_view v;
	char *clean;

	if (s->phase == ST_ROLE) {
		event(s, serve_json_chunk(&s->rep, "", 0, true, FINISH_NONE, NULL));
		s->phase = ST_BODY;
		return true;
	}
	for (;;) {
		if (serve_job_view(&s->sv->q, s->j, s->sent, &v)) {
			s->out.oom = true;
			return true;
		}
		/* echo: once the prompt has gone in (text came, or the job ended), its chunk */
		if (s->echo_pending && (v.len || (v.done && !v.error_status))) {
			const struct serve_job_view none = { 0 };
			struct echo ec = { 0 };
			size_t len;

			s->echo_pending = false;
			clean = echo_prompt(s->sv, s->j, &none, &ec) ? NULL :
				cli_utf8_clean(ec.text ? ec.text : "", ec.len, &len);
			if (!clean) {
				echo_free(&ec);
				free(v.lps);
				free(v.text);
				s->out.oom = true;
				return true;
			}
			{
				const struct serve_lps lps = { ec.lps, ec.n_lps, 0, s->sv->m->tok,
							       SIZE_MAX };

				event(s, serve_json_chunk(&s->rep, clean, len, false, FINISH_NONE,
							  s->j->logprobs >= 0 ? &lps : NULL));
			}
			s->echo_len = ec.len;
			free(clean);
			echo_free(&ec);
		}
		for (uint32_t i = 0; i < v.n_lps; i++)
			v.lps[i].off += (uint32_t)s->echo_len;
		if (v.len) {
			size_t len;

			/* logprobs: the tokens whose text this chunk carries */
			const struct serve_lps lps = { v.lps, v.n_lps, 0, s->sv->m->tok, SIZE_MAX };

			clean = cli_utf8_clean(v.text, v.len, &len);
			s->sent += v.len;
			free(v.text);
			if (!clean) {
				free(v.lps);
				s->out.oom = true;
				return true;
			}
			event(s, serve_json_chunk(&s->rep, clean, len, false, FINISH_NONE,
						  s->j->logprobs >= 0 ? &lps : NULL));
			free(clean);
		}
		free(v.lps);
		if (v.done) {
			if (v.error_status) {
				struct serve_err e;

				serve_err_set(&e, v.error_status, v.error_status == 504 ?
					      "timeout_error" : "server_error", NULL, NULL, "%s",
					      v.error);
				event(s, serve_json_error(&e));
			} else {
				event(s, serve_json_chunk(&s->rep, "", 0, false, v.finish, NULL));
				s->rep.n_cached = v.n_cached;
				if (s->include_usage)
					event(s, serve_json_usage_chunk(&s->rep, v.n_gen));
				sb_add(&s->out, "data: [DONE]\n\n", 14);
			}
			s->phase = ST_END;
			return true;
		}
		if (v.len)
			return true;
		/* nothing new: wait for it, and look whether anyone still listens */
		if (!serve_job_wait(&s->sv->q, s->j, s->sent, CHECK_S) &&
		    serve_http_peer_gone(s->conn)) {
			serve_job_cancel(&s->sv->q, s->j, CANCEL_DISCONNECT);
			return false;
		}
	}
}

/* MHD's content reader: runs on the connection's own thread, so it may block. */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	struct stream *s = cls;
	size_t n;

	(void)pos;
	while (s->out_off == s->out.len) {
		s->out.len = s->out_off = 0;
		if (s->phase == ST_END)
			return MHD_CONTENT_READER_END_OF_STREAM;
		if (!next_events(s) || s->out.oom)
			return MHD_CONTENT_READER_END_WITH_ERROR;
	}
	n = s->out.len - s->out_off < max ? s->out.len - s->out_off : max;
	memcpy(buf, s->out.s + s->out_off, n);
	s->out_off += n;
	return (ssize_t)n;
}

/* The reply is gone (sent, or the connection failed): a job still running has no reader. */
static void stream_free(void *cls)
{
	struct stream *s = cls;

	serve_job_cancel(&s->sv->q, s->j, CANCEL_DISCONNECT);
	serve_job_put(s->j);
	sb_free(&s->out);
	free(s);
}

static int start_stream(struct serve *sv, struct MHD_Connection *conn, struct serve_job *j,
			const struct serve_reply *rep, bool include_usage)
{
	struct stream *s = calloc(1, sizeof(*s));
	struct MHD_Response *resp;
	enum MHD_Result ok;

	if (!s) {
		serve_job_cancel(&sv->q, j, CANCEL_DISCONNECT);
		serve_job_put(j);
		return MHD_NO;
	}
	s->sv = sv;
	s->j = j;
	s->conn = conn;
	s->rep = *rep;
	snprintf(s->id, sizeof(s->id), "%s", rep->id);
	s->rep.id = s->id;
	s->include_usage = include_usage;
	s->echo_pending = j->echo;
	s->phase = rep->chat ? ST_ROLE : ST_BODY;
	resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, s,
						 stream_free);
	if (!resp) {
		stream_free(s);
		return MHD_NO;
	}
	MHD_add_response_header(resp, "Content-Type", "text/event-stream");
	MHD_add_response_header(resp, "Cache-Control", "no-cache");
	ok = MHD_queue_response(conn, 200, resp);
	MHD_destroy_response(resp);
	serve_metrics_request(&sv->mt, route_of(rep->chat), 200);
	return ok;
}

/* ---- a whole reply ---- */

static int finish_plain(struct serve *sv, struct MHD_Connection *conn, struct serve_job *j,
			const struct serve_reply *rep)
{
	struct serve_job_view v;
	struct serve_out out = { 200, "application/json", NULL, 0, NULL };
	struct serve_err e;
	const int j_logprobs = j->logprobs;
	struct echo ec = { 0 };
	char *clean;
	size_t len;

	while (!serve_job_wait(&sv->q, j, SIZE_MAX, CHECK_S)) {
		if (serve_http_peer_gone(conn)) {
			serve_job_cancel(&sv->q, j, CANCEL_DISCONNECT);
			serve_job_put(j);
			return MHD_NO; /* nobody to answer: the connection is closed */
		}
	}
	if (serve_job_view(&sv->q, j, 0, &v) || echo_prompt(sv, j, &v, &ec)) {
		free(v.lps);
		free(v.text);
		echo_free(&ec);
		serve_job_put(j);
		serve_err_set(&e, 500, "server_error", NULL, NULL, "out of memory");
		return serve_http_error(sv, conn, route_of(rep->chat), &e);
	}
	serve_job_put(j);
	if (v.error_status) {
		echo_free(&ec);
		free(v.lps);
		free(v.text);
		serve_err_set(&e, v.error_status, v.error_status == 504 ? "timeout_error" :
			      "server_error", NULL, NULL, "%s", v.error);
		return serve_http_error(sv, conn, route_of(rep->chat), &e);
	}
	clean = ec.text ? cli_utf8_clean(ec.text, ec.len, &len) :
			  cli_utf8_clean(v.text ? v.text : "", v.len, &len);
	{
		/* the tokens whose text starts before the reply's end (a stop string cuts it) */
		const struct serve_lps lps = { ec.text ? ec.lps : v.lps, ec.text ? ec.n_lps : v.n_lps,
					       0, sv->m->tok, ec.text ? ec.len : v.len };

		struct serve_reply done = *rep;

		done.n_cached = v.n_cached;
		out.body = clean ? serve_json_completion(&done, clean, len, v.finish, v.n_gen,
							 j_logprobs >= 0 ? &lps : NULL) : NULL;
	}
	echo_free(&ec);
	free(v.lps);
	free(v.text);
	free(clean);
	if (!out.body) {
		serve_err_set(&e, 500, "server_error", NULL, NULL, "out of memory");
		return serve_http_error(sv, conn, route_of(rep->chat), &e);
	}
	out.len = strlen(out.body);
	return serve_http_reply(sv, conn, route_of(rep->chat), &out);
}

int serve_api_generate(struct serve *sv, struct MHD_Connection *conn, bool chat, const char *body,
		       size_t len, double t_arrival)
{
	struct serve_request r;
	struct serve_reply rep = { .chat = chat, .model = sv->model_id };
	struct serve_err e;
	struct serve_job *j;
	uint32_t n_prompt = 0, n_ctx = serve_queue_n_ctx(&sv->q);
	int32_t *ids = NULL;
	char id[64];
	long max;
	int rc;

	if (serve_json_parse(body, len, chat, sv->model_id, &r, &e) ||
	    prompt_tokens(sv, &r, &ids, &n_prompt, &e))
		goto fail;
	if (!n_prompt) {
		serve_err_set(&e, 400, "invalid_request_error", NULL, chat ? "messages" : "prompt",
			      "the prompt is empty");
		goto fail;
	}
	/* OpenAI's defaults: 16 tokens for a completion, the rest of the context for a chat */
	max = r.max_tokens >= 0 ? r.max_tokens : chat ? (long)n_ctx - (long)n_prompt : 16;
	if ((long)n_prompt + (max > 0 ? max : 0) > (long)n_ctx || n_prompt >= n_ctx) {
		serve_err_set(&e, 400, "invalid_request_error", "context_length_exceeded",
			      r.max_tokens >= 0 ? "max_tokens" : chat ? "messages" : "prompt",
			      "the prompt (%u tokens) and max_tokens (%ld) exceed the context of "
			      "%u tokens", n_prompt, max, n_ctx);
		goto fail;
	}
	if (!r.stream && r.include_usage) {
		serve_err_set(&e, 400, "invalid_request_error", NULL, "stream_options",
			      "'stream_options' is only for stream: true");
		goto fail;
	}
	/* no seed given: a fresh one per request, as OpenAI's sampling does */
	if (!r.seed_set)
		r.sp.seed = (uint64_t)(hyb_now() * 1e9) ^
			    ((uint64_t)atomic_fetch_add(&sv->next_id, 1) << 40);
	j = serve_job_new(ids, n_prompt, (uint32_t)max, &r.sp, r.stop, r.n_stop, t_arrival,
			  sv->o.timeout_s);
	if (!j) {
		serve_err_set(&e, 500, "server_error", NULL, NULL, "out of memory");
		goto fail;
	}
	ids = NULL;
	j->logprobs = r.logprobs;
	j->echo = r.echo;
	if (r.echo && r.logprobs >= 0) {
		j->plps = calloc(n_prompt, sizeof(*j->plps));
		if (!j->plps) {
			serve_job_put(j);
			serve_err_set(&e, 500, "server_error", NULL, NULL, "out of memory");
			goto fail;
		}
		j->plps[0] = (struct serve_lp){ .tok = j->prompt[0], .n_top = -1 };
	}
	r.stop = NULL;	/* the job has them */
	r.n_stop = 0;
	rc = serve_queue_submit(&sv->q, j);
	if (rc) {
		serve_job_put(j);
		if (rc == -EBUSY) {
			pthread_mutex_lock(&sv->mt.lock);
			sv->mt.rejected++;
			pthread_mutex_unlock(&sv->mt.lock);
		}
		serve_err_set(&e, 503, "server_error", rc == -EBUSY ? "queue_full" : "shutting_down",
			      NULL, rc == -EBUSY ? "the server is busy: %d requests are waiting; "
			      "retry later" : "the server is shutting down", sv->q.max_depth);
		goto fail;
	}
	snprintf(id, sizeof(id), "%s-%llx%lx", chat ? "chatcmpl" : "cmpl",
		 (unsigned long long)sv->created, (unsigned long)atomic_fetch_add(&sv->next_id, 1));
	rep.id = id;
	rep.created = (long long)time(NULL);
	rep.n_prompt = n_prompt;
	rc = r.stream ? start_stream(sv, conn, j, &rep, r.include_usage) :
			finish_plain(sv, conn, j, &rep);
	serve_request_free(&r);
	return rc;
fail:
	free(ids);
	serve_request_free(&r);
	return serve_http_error(sv, conn, route_of(chat), &e);
}
