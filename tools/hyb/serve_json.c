// SPDX-License-Identifier: MIT
/*
 * hyb serve's JSON (jansson, docs/SERVE.md says why): the OpenAI request
 * bodies of /v1/completions and /v1/chat/completions checked field by field
 * into a serve_request, and the response objects, whole and streamed.
 * Fields are those of OpenAI's API reference; llama.cpp's extensions top_k,
 * min_p, repeat_penalty and n_predict are taken too.
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyb/chat.h"
#include "hyb/tokenizer.h"
#include "serve.h"

/* OpenAI's limit on stop strings */
#define MAX_STOP 4

void serve_json_init(void)
{
	/* jansson seeds its hash function on first use; do it before any thread can race there */
	json_object_seed(0);
}

int serve_err_set(struct serve_err *e, int status, const char *type, const char *code,
		  const char *param, const char *fmt, ...)
{
	va_list ap;

	e->status = status;
	e->type = type;
	e->code = code;
	e->param = param;
	va_start(ap, fmt);
	vsnprintf(e->message, sizeof(e->message), fmt, ap);
	va_end(ap);
	return -1;
}

static int bad(struct serve_err *e, const char *param, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static int bad(struct serve_err *e, const char *param, const char *fmt, ...)
{
	va_list ap;

	e->status = 400;
	e->type = "invalid_request_error";
	e->code = NULL;
	e->param = param;
	va_start(ap, fmt);
	vsnprintf(e->message, sizeof(e->message), fmt, ap);
	va_end(ap);
	return -1;
}

char *serve_json_error(const struct serve_err *e)
{
	size_t len;
	char *msg = cli_utf8_clean(e->message, strlen(e->message), &len);
	json_t *j = msg ? json_pack("{s:{s:s, s:s, s:s?, s:s?}}", "error", "message", msg, "type",
				    e->type ? e->type : "server_error", "param", e->param, "code",
				    e->code) : NULL;
	char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;

	json_decref(j);
	free(msg);
	return s;
}

/* A field that is absent or null counts as not given. */
static json_t *field(json_t *root, const char *key)
{
	json_t *v = json_object_get(root, key);

	return v && !json_is_null(v) ? v : NULL;
}

/* A number field in [lo, hi] into *out; 0 when absent, -1 with e filled when wrong. */
static int num_field(json_t *root, const char *key, double lo, double hi, float *out,
		     struct serve_err *e)
{
	json_t *v = field(root, key);
	double x;

	if (!v)
		return 0;
	if (!json_is_number(v))
		return bad(e, key, "'%s' must be a number", key);
	x = json_number_value(v);
	if (!(x >= lo && x <= hi))
		return bad(e, key, "'%s' must be in [%g, %g], not %g", key, lo, hi, x);
	*out = (float)x;
	return 0;
}

static int int_field(json_t *root, const char *key, long long lo, long long hi, long long *out,
		     struct serve_err *e)
{
	json_t *v = field(root, key);

	if (!v)
		return 0;
	if (!json_is_integer(v))
		return bad(e, key, "'%s' must be an integer", key);
	if (json_integer_value(v) < lo || json_integer_value(v) > hi)
		return bad(e, key, "'%s' must be in [%lld, %lld], not %lld", key, lo, hi,
			   (long long)json_integer_value(v));
	*out = json_integer_value(v);
	return 0;
}

static int stop_field(json_t *root, struct serve_request *r, struct serve_err *e)
{
	json_t *v = field(root, "stop"), *s;
	size_t i, n;

	if (!v)
		return 0;
	if (json_is_string(v))
		n = 1;
	else if (json_is_array(v))
		n = json_array_size(v);
	else
		return bad(e, "stop", "'stop' must be a string or an array of strings");
	if (n > MAX_STOP)
		return bad(e, "stop", "'stop' has %zu strings; at most %d", n, MAX_STOP);
	r->stop = calloc(n + 1, sizeof(*r->stop));
	if (!r->stop)
		return serve_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
	for (i = 0; i < n; i++) {
		s = json_is_string(v) ? v : json_array_get(v, i);
		if (!json_is_string(s))
			return bad(e, "stop", "'stop' must be a string or an array of strings");
		if (!json_string_length(s))
			continue; /* an empty stop string would stop at once: ignored */
		r->stop[r->n_stop] = strdup(json_string_value(s));
		if (!r->stop[r->n_stop++])
			return serve_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
	}
	return 0;
}

/*
 * Completions: "logprobs": N, the N most likely alternatives per token (and
 * the chosen token's own); chat: "logprobs": true, "top_logprobs": N.
 * Only in replies that are not streamed.
 */
static int logprobs_field(json_t *root, bool chat, struct serve_request *r, struct serve_err *e)
{
	json_t *lp = field(root, "logprobs"), *top = field(root, "top_logprobs");
	long long n = 0;

	r->logprobs = -1;
	if (chat) {
		if (lp && !json_is_boolean(lp))
			return bad(e, "logprobs", "'logprobs' must be true or false");
		if (int_field(root, "top_logprobs", 0, SERVE_MAX_TOP, &n, e))
			return -1;
		if (top && !json_is_true(lp))
			return bad(e, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
		if (json_is_true(lp))
			r->logprobs = (int)n;
	} else {
		if (top)
			return bad(e, "top_logprobs", "'top_logprobs' is for chat completions; "
				   "here 'logprobs' takes the count");
		if (lp && json_is_false(lp))
			lp = NULL;
		if (lp && int_field(root, "logprobs", 0, SERVE_MAX_TOP, &n, e))
			return -1;
		if (lp)
			r->logprobs = (int)n;
	}
	lp = field(root, "echo");
	if (lp && !json_is_boolean(lp))
		return bad(e, "echo", "'echo' must be true or false");
	r->echo = json_is_true(lp);
	if (r->echo && chat)
		return bad(e, "echo", "'echo' is for completions");
	return 0;
}

/* Fields OpenAI defines that hyb does not do: refused unless at their neutral value. */
static int unsupported(json_t *root, struct serve_err *e)
{
	json_t *v;

	if ((v = field(root, "n")) && !(json_is_integer(v) && json_integer_value(v) == 1))
		return bad(e, "n", "'n' must be 1: one choice per request");
	if ((v = field(root, "suffix")) && !(json_is_string(v) && !json_string_length(v)))
		return bad(e, "suffix", "'suffix' is not supported");
	if ((v = field(root, "best_of")) && !(json_is_integer(v) && json_integer_value(v) == 1))
		return bad(e, "best_of", "'best_of' must be 1");
	if ((v = field(root, "tools")) && !(json_is_array(v) && !json_array_size(v)))
		return bad(e, "tools", "'tools' are not supported");
	if ((v = field(root, "logit_bias")) && !(json_is_object(v) && !json_object_size(v)))
		return bad(e, "logit_bias", "'logit_bias' is not supported");
	for (int i = 0; i < 2; i++) {
		const char *k = i ? "presence_penalty" : "frequency_penalty";

		if ((v = field(root, k)) && !(json_is_number(v) && json_number_value(v) == 0))
			return bad(e, k, "'%s' is not supported (repeat_penalty is)", k);
	}
	return 0;
}

static int prompt_field(json_t *root, struct serve_request *r, struct serve_err *e)
{
	json_t *v = field(root, "prompt"), *x;
	size_t n;

	if (!v)
		return bad(e, "prompt", "'prompt' is required");
	if (json_is_string(v)) {
		r->prompt = json_string_value(v);
		return 0;
	}
	if (!json_is_array(v) || !(n = json_array_size(v)))
		return bad(e, "prompt", "'prompt' must be a string, or an array of token ids");
	x = json_array_get(v, 0);
	if (json_is_string(x)) {
		if (n != 1)
			return bad(e, "prompt", "one prompt per request ('prompt' has %zu)", n);
		r->prompt = json_string_value(x);
		return 0;
	}
	if (n > (1u << 24))
		return bad(e, "prompt", "'prompt' has too many tokens");
	r->prompt_ids = malloc(n * sizeof(*r->prompt_ids));
	if (!r->prompt_ids)
		return serve_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
	for (size_t i = 0; i < n; i++) {
		x = json_array_get(v, i);
		if (!json_is_integer(x) || json_integer_value(x) < 0 ||
		    json_integer_value(x) > INT32_MAX)
			return bad(e, "prompt", "'prompt' must be a string, or an array of token ids "
				   "(element %zu is not)", i);
		r->prompt_ids[i] = (int32_t)json_integer_value(x);
	}
	r->n_prompt_ids = (uint32_t)n;
	return 0;
}

/* A message's content: a string, or an array of {"type": "text", "text": ...} parts. */
static int content_of(json_t *c, size_t i, struct serve_request *r, const char **out,
		      struct serve_err *e)
{
	struct sbuf b = { 0 };

	if (json_is_string(c)) {
		*out = json_string_value(c);
		return 0;
	}
	if (!json_is_array(c))
		return bad(e, "messages", "messages[%zu].content must be a string or an array of "
			   "text parts", i);
	for (size_t k = 0; k < json_array_size(c); k++) {
		json_t *p = json_array_get(c, k), *t = json_object_get(p, "type"),
		       *x = json_object_get(p, "text");

		if (!json_is_string(t) || strcmp(json_string_value(t), "text") || !json_is_string(x)) {
			sb_free(&b);
			return bad(e, "messages", "messages[%zu].content[%zu] is not a text part "
				   "(only text is supported)", i, k);
		}
		sb_add(&b, json_string_value(x), json_string_length(x));
	}
	sb_add(&b, "", 0);
	if (b.oom || !b.s) {
		sb_free(&b);
		return serve_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
	}
	r->content_bufs[i] = b.s;
	*out = b.s;
	return 0;
}

static int messages_field(json_t *root, struct serve_request *r, struct serve_err *e)
{
	json_t *v = field(root, "messages");
	size_t n;

	if (!v)
		return bad(e, "messages", "'messages' is required");
	if (!json_is_array(v) || !(n = json_array_size(v)))
		return bad(e, "messages", "'messages' must be a non-empty array");
	r->msgs = calloc(n, sizeof(*r->msgs));
	r->content_bufs = calloc(n, sizeof(*r->content_bufs));
	if (!r->msgs || !r->content_bufs)
		return serve_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
	r->n_msgs = n;
	for (size_t i = 0; i < n; i++) {
		json_t *m = json_array_get(v, i), *role = json_object_get(m, "role");
		json_t *c = field(m, "content");

		if (!json_is_object(m))
			return bad(e, "messages", "messages[%zu] must be an object", i);
		if (!json_is_string(role))
			return bad(e, "messages", "messages[%zu].role must be a string", i);
		/* OpenAI's newer name for the system role */
		r->msgs[i].role = strcmp(json_string_value(role), "developer") ?
					  json_string_value(role) : "system";
		if (!c)
			return bad(e, "messages", "messages[%zu] has no content", i);
		if (content_of(c, i, r, &r->msgs[i].content, e))
			return -1;
	}
	return 0;
}

static int sampling_fields(json_t *root, struct serve_request *r, struct serve_err *e)
{
	long long k = -1, seed = -1, n = -1;
	json_t *v;

	if (num_field(root, "temperature", 0, 2, &r->sp.temperature, e) ||
	    num_field(root, "top_p", 0, 1, &r->sp.top_p, e) ||
	    num_field(root, "min_p", 0, 1, &r->sp.min_p, e) ||
	    num_field(root, "repeat_penalty", 0.01, 100, &r->sp.repeat_penalty, e) ||
	    int_field(root, "top_k", 0, 1 << 30, &k, e) ||
	    int_field(root, "seed", INT64_MIN, INT64_MAX, &seed, e))
		return -1;
	if (k >= 0)
		r->sp.top_k = (int32_t)k;
	if (field(root, "seed")) {
		r->sp.seed = (uint64_t)seed;
		r->seed_set = true;
	}
	/* the token limit: max_tokens, chat's newer max_completion_tokens, llama.cpp's n_predict */
	for (int i = 0; i < 3; i++) {
		const char *key = i == 0 ? "max_tokens" : i == 1 ? "max_completion_tokens" : "n_predict";

		if (int_field(root, key, i == 2 ? -1 : 0, 1 << 24, &n, e))
			return -1;
		if (field(root, key) && n >= 0) {
			r->max_tokens = (long)n;
			break;
		}
	}
	if ((v = field(root, "stream")) && !json_is_boolean(v))
		return bad(e, "stream", "'stream' must be true or false");
	r->stream = v && json_is_true(v);
	if ((v = field(root, "stream_options"))) {
		json_t *u = field(v, "include_usage");

		if (!json_is_object(v) || (u && !json_is_boolean(u)))
			return bad(e, "stream_options", "'stream_options' must be an object "
				   "{\"include_usage\": bool}");
		r->include_usage = u && json_is_true(u);
	}
	return 0;
}

int serve_json_parse(const char *body, size_t len, bool chat, const char *model_id,
		     struct serve_request *r, struct serve_err *e)
{
	json_error_t je;
	json_t *root, *v;

	memset(r, 0, sizeof(*r));
	r->chat = chat;
	r->max_tokens = -1;
	r->logprobs = -1;
	/* OpenAI's defaults for its fields (temperature 1, top_p 1), hyb's for the others */
	r->sp = hyb_sampler_defaults();
	r->sp.temperature = 1.0f;
	r->sp.top_p = 1.0f;
	if (!len)
		return bad(e, NULL, "the request has no body (a JSON object is expected)");
	root = json_loadb(body, len, 0, &je);
	if (!root)
		return bad(e, NULL, "the body is not valid JSON: %s (line %d, column %d)", je.text,
			   je.line, je.column);
	r->root = root;
	if (!json_is_object(root))
		return bad(e, NULL, "the body must be a JSON object");
	if ((v = field(root, "model"))) {
		if (!json_is_string(v))
			return bad(e, "model", "'model' must be a string");
		if (strcmp(json_string_value(v), model_id))
			return serve_err_set(e, 404, "invalid_request_error", "model_not_found",
					     "model", "the model '%s' does not exist; this server "
					     "has '%s'", json_string_value(v), model_id);
	}
	if (unsupported(root, e) || sampling_fields(root, r, e) || stop_field(root, r, e) ||
	    logprobs_field(root, chat, r, e))
		return -1;
	return chat ? messages_field(root, r, e) : prompt_field(root, r, e);
}

void serve_request_free(struct serve_request *r)
{
	for (size_t i = 0; r->content_bufs && i < r->n_msgs; i++)
		free(r->content_bufs[i]);
	free(r->content_bufs);
	free(r->msgs);
	for (size_t i = 0; i < r->n_stop; i++)
		free(r->stop[i]);
	free(r->stop);
	free(r->prompt_ids);
	json_decref(r->root);
	memset(r, 0, sizeof(*r));
}

static const char *finish_name(enum serve_finish f)
{
	return f == FINISH_STOP ? "stop" : f == FINISH_LENGTH ? "length" : NULL;
}

/* OpenAI's usage, prompt_tokens_details.cached_tokens from the prefix cache */
static json_t *usage(const struct serve_reply *r, uint32_t n_gen)
{
	return json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", (int)r->n_prompt,
			 "completion_tokens", (int)n_gen, "total_tokens",
			 (int)(r->n_prompt + n_gen), "prompt_tokens_details", "cached_tokens",
			 (int)r->n_cached);
}

static char *dump(json_t *j)
{
	char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;

	json_decref(j);
	return s;
}

/* a token's text as JSON (invalid UTF-8 as U+FFFD); its raw bytes into *bytes */
static json_t *piece_json(const struct hyb_tokenizer *tok, int32_t id, json_t **bytes)
{
	char buf[256], *clean;
	size_t len;
	int n = hyb_token_to_piece(tok, id, buf, sizeof(buf));
	json_t *s;

	n = n < 0 ? 0 : n < (int)sizeof(buf) ? n : (int)sizeof(buf);
	if (bytes) {
		*bytes = json_array();
		for (int i = 0; i < n; i++)
			json_array_append_new(*bytes, json_integer((unsigned char)buf[i]));
	}
	clean = cli_utf8_clean(buf, (size_t)n, &len);
	s = clean ? json_stringn(clean, len) : NULL;
	free(clean);
	return s;
}

/* OpenAI's logprobs object: completions' four arrays, or chat's content list */
static json_t *logprobs_json(bool chat, const struct serve_lps *l)
{
	json_t *tokens = json_array(), *lps = json_array(), *tops = json_array();
	json_t *offs = json_array(), *content = json_array();

	for (uint32_t i = 0; i < l->n && l->lp[i].off < l->text_len; i++) {
		const struct serve_lp *p = &l->lp[i];
		json_t *bytes = NULL, *t = piece_json(l->tok, p->tok, chat ? &bytes : NULL);
		json_t *top = chat ? json_array() : json_object();

		if (p->n_top < 0) { /* an echoed prompt's first token: nothing before it */
			json_decref(top);
			json_array_append_new(tokens, t);
			json_array_append_new(lps, json_null());
			json_array_append_new(tops, json_null());
			json_array_append_new(offs, json_integer(p->off));
			continue;
		}
		for (int k = 0; k < p->n_top; k++) {
			json_t *kb = NULL, *kt = piece_json(l->tok, p->top_tok[k], chat ? &kb : NULL);

			if (chat)
				json_array_append_new(top, json_pack("{s:o, s:f, s:o}", "token", kt,
								     "logprob", (double)p->top_lp[k],
								     "bytes", kb));
			else if (kt && !json_object_get(top, json_string_value(kt)))
				/* pieces that print alike share a key: the likelier keeps it */
				json_object_set_new(top, json_string_value(kt),
						    json_real(p->top_lp[k]));
			if (!chat)
				json_decref(kt);
		}
		if (chat) {
			json_array_append_new(content, json_pack("{s:o, s:f, s:o, s:o}", "token", t,
								 "logprob", (double)p->lp, "bytes",
								 bytes, "top_logprobs", top));
		} else {
			json_array_append_new(tokens, t);
			json_array_append_new(lps, json_real(p->lp));
			json_array_append_new(tops, top);
			json_array_append_new(offs, json_integer(p->off));
		}
	}
	if (chat) {
		json_decref(tokens);
		json_decref(lps);
		json_decref(tops);
		json_decref(offs);
		return json_pack("{s:o}", "content", content);
	}
	json_decref(content);
	return json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs", lps,
			 "top_logprobs", tops, "text_offset", offs);
}

char *serve_json_completion(const struct serve_reply *r, const char *text, size_t len,
			    enum serve_finish finish, uint32_t n_gen, const struct serve_lps *lps)
{
	json_t *choice, *lp = lps ? logprobs_json(r->chat, lps) : json_null();

	if (r->chat)
		choice = json_pack("{s:i, s:{s:s, s:s%}, s:o, s:s?}", "index", 0, "message", "role",
				   "assistant", "content", text, len, "logprobs", lp,
				   "finish_reason", finish_name(finish));
	else
		choice = json_pack("{s:i, s:s%, s:o, s:s?}", "index", 0, "text", text, len,
				   "logprobs", lp, "finish_reason", finish_name(finish));
	return dump(json_pack("{s:s, s:s, s:I, s:s, s:[o], s:o}", "id", r->id, "object",
			      r->chat ? "chat.completion" : "text_completion", "created",
			      (json_int_t)r->created, "model", r->model, "choices", choice, "usage",
			      usage(r, n_gen)));
}

char *serve_json_chunk(const struct serve_reply *r, const char *text, size_t len, bool role,
		       enum serve_finish finish, const struct serve_lps *lps)
{
	json_t *choice, *lp = lps ? logprobs_json(r->chat, lps) : json_null();

	if (r->chat) {
		json_t *delta = finish ? json_object() :
			role ? json_pack("{s:s, s:s}", "role", "assistant", "content", "") :
			       json_pack("{s:s%}", "content", text, len);

		choice = json_pack("{s:i, s:o, s:o, s:s?}", "index", 0, "delta", delta, "logprobs",
				   lp, "finish_reason", finish_name(finish));
	} else {
		choice = json_pack("{s:i, s:s%, s:o, s:s?}", "index", 0, "text", text, len,
				   "logprobs", lp, "finish_reason", finish_name(finish));
	}
	return dump(json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", r->id, "object",
			      r->chat ? "chat.completion.chunk" : "text_completion", "created",
			      (json_int_t)r->created, "model", r->model, "choices", choice));
}

char *serve_json_usage_chunk(const struct serve_reply *r, uint32_t n_gen)
{
	return dump(json_pack("{s:s, s:s, s:I, s:s, s:[], s:o}", "id", r->id, "object",
			      r->chat ? "chat.completion.chunk" : "text_completion", "created",
			      (json_int_t)r->created, "model", r->model, "choices", "usage",
			      usage(r, n_gen)));
}

char *serve_json_models(const char *model_id, long long created, uint32_t n_ctx)
{
	return dump(json_pack("{s:s, s:[{s:s, s:s, s:I, s:s, s:i}]}", "object", "list", "data",
			      "id", model_id, "object", "model", "created", (json_int_t)created,
			      "owned_by", "hyb", "context_length", (int)n_ctx));
}
