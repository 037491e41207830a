/* SPDX-License-Identifier: MIT */
/*
 * hyb serve: an OpenAI-compatible HTTP server (docs/SERVE.md). The pieces,
 * one file each:
 *   cmd_serve.c     options, model, start-up, SIGTERM and shutdown
 *   serve_http.c    libmicrohttpd: connections, routing, bodies, auth, replies
 *   serve_api.c     the endpoints: completions and chat (plain and streamed), models, health
 *   serve_json.c    request parsing and response objects (jansson)
 *   serve_queue.c   the request queue and the decoding slots, each with its own context
 *   serve_text.c    stop strings and UTF-8 boundaries of streamed text
 *   serve_metrics.c counters and the Prometheus text of GET /metrics
 */
#ifndef HYB_SERVE_H
#define HYB_SERVE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cli.h"
#include "hyb/generate.h"
#include "hyb/sampler.h"

#include "hyb/hybrid.h"
#include "hyb/model.h"

struct hyb_sampler;
struct MHD_Connection;

/* ---- serve_text.c ---- */

/* A growable byte string; out of memory is reported by sb_oom, never fatal. */
struct sbuf {
	char *s;
	size_t len, cap;
	bool oom;
};
void sb_add(struct sbuf *b, const void *p, size_t n);
void sb_printf(struct sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sb_free(struct sbuf *b);

/*
 * The first occurrence of any stop string in text[0..n) that ends at or
 * after `from` (earlier ones were looked for before); n when none. *hold:
 * the length of the longest tail of text that is the start of a stop
 * string, which must not be sent yet.
 */
size_t serve_stop_find(const char *text, size_t n, size_t from, char *const *stop,
		       size_t n_stop, size_t *hold);

/* ---- serve_metrics.c ---- */

#define SERVE_TTFT_BUCKETS 11
struct serve_metrics {
	pthread_mutex_t lock;
	struct {
		const char *route;
		int status;
		uint64_t n;
	} requests[64];
	int n_requests;
	uint64_t prompt_tokens, completion_tokens;
	uint64_t cached_tokens;     /* of prompt_tokens, from the prefix cache */
	double prompt_s, decode_s, last_tps;
	uint64_t rejected;           /* 503: the queue was full */
	uint64_t cancelled[4];       /* by enum serve_cancel */
	uint64_t ttft[SERVE_TTFT_BUCKETS + 1]; /* the last is +Inf */
	double ttft_sum;
	uint64_t ttft_n;
};
void serve_metrics_init(struct serve_metrics *mt);
void serve_metrics_request(struct serve_metrics *mt, const char *route, int status);
void serve_metrics_ttft(struct serve_metrics *mt, double seconds);
struct serve_queue;
/* The Prometheus text exposition of mt and the queue's gauges, into b. */
void serve_metrics_render(struct serve_metrics *mt, struct serve_queue *q, struct sbuf *b);

/* ---- serve_queue.c ---- */

enum serve_cancel { CANCEL_NONE, CANCEL_DISCONNECT, CANCEL_TIMEOUT, CANCEL_SHUTDOWN };
enum serve_finish { FINISH_NONE, FINISH_STOP, FINISH_LENGTH };
enum serve_job_state { JOB_QUEUED, JOB_RUNNING, JOB_DONE };

/*
 * One generation request. The connection that made it and the queue (while
 * it is queued or running) each hold a reference. Fields below "output" are
 * guarded by the queue's lock.
 */
/*
 * Log probabilities of a generated token under the model's distribution
 * (the raw logits' softmax, before temperature and penalties): its own and
 * the n_top most likely tokens', best first; off: where its text starts.
 * n_top -1: none (an echoed prompt's first token).
 */
#define SERVE_MAX_TOP 20
struct serve_lp {
	int32_t tok;
	uint32_t off;
	float lp;
	int n_top;
	int32_t top_tok[SERVE_MAX_TOP];
	float top_lp[SERVE_MAX_TOP];
};

struct serve_job {
	/* input, fixed once submitted */
	int32_t *prompt;
	uint32_t n_prompt, max_tokens;
	struct hyb_sampler_params sp;
	char **stop;
	size_t n_stop;
	double t_arrival, deadline; /* hyb_now() seconds */
	int logprobs;           /* -1: none; else alternatives per token (0..SERVE_MAX_TOP) */
	bool echo;              /* the reply starts with the prompt (and its logprobs) */
	struct serve_lp *plps;  /* echo and logprobs: one per prompt token, by the engine */
	/* output */
	enum serve_job_state state;
	struct sbuf text;       /* generated text, cut at a stop string */
	size_t ready;           /* bytes of text that are final (may be sent) */
	size_t stop_from;       /* stop strings were looked for up to here */
	uint32_t n_gen;
	uint32_t n_cached;      /* prompt tokens the prefix cache gave (not evaluated) */
	struct serve_lp *lps;   /* logprobs >= 0: one per generated token */
	uint32_t n_lps, cap_lps;
	enum serve_finish finish;
	enum serve_cancel cancel;
	int error_status;       /* nonzero: the job failed; error holds why */
	char error[256];
	double t_first;         /* hyb_now() of the first token, 0 before */
	struct hyb_gen_stats st;
	pthread_cond_t cond;    /* signalled when output changes */
	atomic_int refs;
	struct serve_job *next;
};

/* A running job in an engine: its sequence, sampler and where it stands. */
struct serve_seq {
	struct serve_job *j;
	int seq;                  /* the context's sequence */
	struct hyb_sampler *s;
	bool started;             /* its prompt has been evaluated */
	uint32_t fed;             /* prompt tokens evaluated so far (chunked prefill) */
	double t_prompt0;         /* when its first prompt piece went in */
	bool stopped;             /* a stop string or a cancellation ended it */
	int32_t next;             /* the token to evaluate next */
	double t_admit, t_gen0;
	struct hyb_gen_stats st;
};

/*
 * An engine: a thread and a context that decodes up to n_seq jobs together
 * (continuous batching: one hyb_ctx_eval_seqs pass per step, jobs joining
 * and leaving between steps). Models that cannot batch yet get --parallel
 * engines of one sequence each.
 */
struct serve_slot {
	struct serve_queue *q;
	struct hyb_ctx *ctx;
	pthread_t thread;
	bool started;
	int n_seq;
	struct serve_seq *act;    /* [n_seq], n_act running */
	int n_act;
	float *logits;            /* [n_seq][n_vocab] */
	float *raw;               /* [n_vocab]: a row's logits before sampling (logprobs) */
	float **all;              /* [n_seq]: an echoed prompt piece's every row, or NULL */
	struct hyb_seq_tokens *b; /* [n_seq] */
	int *b_of;                /* [n_seq]: act[k]'s entry in b this step, -1: none */
	/* under the queue's lock, for /metrics */
	struct hyb_kv_stats kv;
	bool hybrid;                  /* the context decodes on a device */
	struct hyb_hybrid_stats hy;   /* ... its statistics after the last step */
	uint64_t hy_resident, hy_slots;
	int last_batch;
	uint64_t steps;
};

struct serve_queue {
	pthread_mutex_t lock;
	pthread_cond_t cond;          /* engines wait here for jobs */
	struct serve_job *head, *tail;
	int depth, max_depth, running;
	bool stopping, abort;         /* no new jobs; cancel running ones */
	const struct hyb_model *m;
	struct serve_metrics *mt;
	struct serve_slot *slots;     /* engines */
	int n_slots;
	int capacity;                 /* jobs that may run at once, all engines together */
	bool batched;                 /* one engine of capacity sequences */
	uint32_t n_ctx;               /* positions of each sequence */
	const float *teal_thr;        /* serve_engine_opts.teal_thr */
	bool prefix_cache;            /* !serve_engine_opts.no_prefix_cache */
};

struct serve_engine_opts {
	int parallel;                 /* jobs at once */
	int max_depth;                /* queued jobs beyond those */
	uint32_t n_ctx;
	int n_threads;                /* 0: the CPUs (shared among engines when not batched) */
	uint32_t kv_size;             /* batched: positions of the shared cache (0: parallel x n_ctx) */
	bool batch_variant;           /* hyb_ctx_params.batch_variant */
	bool numa_no_pin;             /* hyb_ctx_params.numa_no_pin */
	uint32_t n_batch;             /* hyb_ctx_params.n_batch: a step's prompt tokens (0: default) */
	bool no_batch;                /* one engine per job even when the model batches */
	bool no_prefix_cache;         /* every prompt evaluated from its first token */
	/* TEAL thresholds (hyb/sparsity.h) for every engine, or NULL; with them
	 * each job gets an engine of its own (docs/SERVE.md) */
	const float *teal_thr;
	/* hybrid decoding for the engine (one: --parallel 1), or NULL */
	const struct hyb_hybrid_params *hybrid;
};

/* The engines, and their threads. 0, or a negative errno (the reason on stderr). */
int serve_queue_start(struct serve_queue *q, const struct hyb_model *m, struct serve_metrics *mt,
		      const struct serve_engine_opts *o);
/* No new jobs; queued ones are answered 503 (shutting down). Running ones go on. */
void serve_queue_drain(struct serve_queue *q);
int serve_queue_running(struct serve_queue *q);
/* Cancel whatever still runs or waits, and join the workers. */
void serve_queue_stop(struct serve_queue *q);
uint32_t serve_queue_n_ctx(const struct serve_queue *q);

/* A new job (one reference, the caller's); NULL when out of memory. Takes prompt and stop. */
struct serve_job *serve_job_new(int32_t *prompt, uint32_t n_prompt, uint32_t max_tokens,
				const struct hyb_sampler_params *sp, char **stop, size_t n_stop,
				double t_arrival, double timeout);
void serve_job_put(struct serve_job *j);
/* 0, -EBUSY when the queue is full, -ESHUTDOWN when the server is stopping. */
int serve_queue_submit(struct serve_queue *q, struct serve_job *j);
/* Stop a job: a queued one leaves the queue, a running one stops at its next token. */
void serve_job_cancel(struct serve_queue *q, struct serve_job *j, enum serve_cancel why);
/*
 * Wait (under no lock) until the job has more than `sent` ready bytes or is
 * done, or until the next check is due (at most check_s seconds); cancels it
 * when its deadline has passed. Returns true when there is news.
 */
bool serve_job_wait(struct serve_queue *q, struct serve_job *j, size_t sent, double check_s);
/* Copy of the job's state under the lock: ready text from `from`, finish, error. */
struct serve_job_view {
	char *text;             /* text[from..ready), malloc'd (NULL when empty) */
	size_t len;
	bool done;
	enum serve_finish finish;
	enum serve_cancel cancel;
	int error_status;
	char error[256];
	uint32_t n_gen;
	uint32_t n_cached;
	struct serve_lp *lps;   /* logprobs asked: the tokens in text[from..ready) (malloc'd) */
	uint32_t n_lps;
};
/* 0, or -ENOMEM. */
int serve_job_view(struct serve_queue *q, struct serve_job *j, size_t from,
		   struct serve_job_view *v);

/* ---- serve_json.c ---- */

/* Once, before the server's threads start. */
void serve_json_init(void);

struct serve_err {
	int status;             /* HTTP status */
	const char *type;       /* invalid_request_error, ... */
	const char *code;       /* NULL or a code (model_not_found, ...) */
	const char *param;      /* NULL or the field at fault */
	char message[512];
};
/* Fill e and return -1. */
int serve_err_set(struct serve_err *e, int status, const char *type, const char *code,
		  const char *param, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* {"error": {...}} as text, malloc'd; NULL when out of memory. */
char *serve_json_error(const struct serve_err *e);

struct serve_request {
	bool chat, stream, include_usage;
	void *root;               /* the parsed body (json_t *) the strings below point into */
	const char *prompt;       /* completions: the prompt text, or NULL when given as tokens */
	int32_t *prompt_ids;      /* completions: the prompt as token ids */
	uint32_t n_prompt_ids;
	struct hyb_chat_msg *msgs; /* chat: the conversation */
	size_t n_msgs;
	char **content_bufs;      /* chat: contents joined from parts (freed with the request) */
	long max_tokens;          /* -1: not given */
	struct hyb_sampler_params sp;
	bool seed_set;
	char **stop;              /* NULL-terminated copies */
	size_t n_stop;
	int logprobs;             /* -1: not asked; else the alternatives per token */
	bool echo;                /* completions: the reply starts with the prompt */
};
/* Parse a request body; 0, or -1 with e filled. model_id: the name the server answers to. */
int serve_json_parse(const char *body, size_t len, bool chat, const char *model_id,
		     struct serve_request *r, struct serve_err *e);
void serve_request_free(struct serve_request *r);

struct serve_reply {
	bool chat;
	const char *id;           /* "cmpl-..." / "chatcmpl-..." */
	const char *model;
	long long created;
	uint32_t n_prompt;
	uint32_t n_cached;        /* of n_prompt, from the prefix cache (usage) */
};
/* Logprobs of a reply: lps[0..n) whose text starts before text_len, pieces from tok. */
struct serve_lps {
	const struct serve_lp *lp;
	uint32_t n;
	int top;
	const struct hyb_tokenizer *tok;
	size_t text_len;
};
/*
 * A whole completion object (the reply not streamed); text is valid UTF-8;
 * lps NULL: "logprobs": null. NULL: out of memory.
 */
char *serve_json_completion(const struct serve_reply *r, const char *text, size_t len,
			    enum serve_finish finish, uint32_t n_gen, const struct serve_lps *lps);
/*
 * One streamed chunk: text (may be empty), or, with finish set, the last
 * chunk; role: the chat's first chunk (the assistant role). usage: a chunk
 * with no choices and the usage (stream_options.include_usage).
 */
char *serve_json_chunk(const struct serve_reply *r, const char *text, size_t len, bool role,
		       enum serve_finish finish, const struct serve_lps *lps);
char *serve_json_usage_chunk(const struct serve_reply *r, uint32_t n_gen);
char *serve_json_models(const char *model_id, long long created, uint32_t n_ctx);

/* ---- serve_http.c / serve_api.c ---- */

struct serve_opts {
	const char *model;
	const char *manifest;   /* box mode: hybd's model (docs/BOX.md) instead of a file */
	const char *teal;       /* TEAL profile (hyb/sparsity.h), or NULL */
	double sparsity;        /* its sparsity; < 0: the profile's own */
	const char *host;
	int port;
	uint32_t n_ctx;
	int n_threads;
	int parallel;
	int queue;
	const char *api_key_file;
	const char *alias;
	const char *chat_template;
	double timeout_s;       /* per request, from arrival to the last token */
	int idle_timeout_s;     /* a connection that sends nothing for this long is closed */
	size_t max_body;
	double grace_s;         /* SIGTERM: how long running requests may finish */
	int max_conns;
	int max_conns_per_ip;   /* 0: no limit per client address */
	uint32_t kv_size;       /* positions of the shared KV cache (0: parallel x n_ctx) */
	bool batch_variant;
	bool numa_no_pin;       /* --no-numa-pin */
	uint32_t n_batch;       /* --batch: a step's prompt tokens (0: the context's default) */
	bool no_batch;
	bool no_prefix_cache;   /* --no-prefix-cache */
	/* hybrid decoding (hyb/hybrid.h: a plan's neuron cache, a MoE's expert cache) */
	const char *gpu_budget; /* NULL: none */
	const char *routing;    /* a MoE routing profile, or NULL */
	struct hyb_hybrid_params hy;
};

struct serve {
	struct serve_opts o;
	const struct hyb_model *m;
	const char *model_id;
	char *api_key;           /* NULL: no auth */
	float *teal_thr;         /* --teal's thresholds, or NULL */
	int tmpl;                /* chat template */
	long long created;
	struct serve_queue q;
	struct serve_metrics mt;
	struct MHD_Daemon *d;
	atomic_int active;       /* requests being handled (bodies read or replies sent) */
	atomic_bool stopping;
	atomic_ulong next_id;
};

/* Start listening (port 0: any free one); the port, or -errno with a message on stderr. */
int serve_http_start(struct serve *sv);
void serve_http_quiesce(struct serve *sv);
void serve_http_stop(struct serve *sv);

/* A reply the handler built: status, content type, body (malloc'd, taken). */
struct serve_out {
	int status;
	const char *type;
	char *body;
	size_t len;
	const char *retry_after; /* a Retry-After header, or NULL */
};
/* The generation endpoints. Returns the MHD result of queueing a reply or stream. */
int serve_api_generate(struct serve *sv, struct MHD_Connection *conn, bool chat, const char *body,
		       size_t len, double t_arrival);
/* Queue a plain reply; counts it in the metrics under route. */
int serve_http_reply(struct serve *sv, struct MHD_Connection *conn, const char *route,
		     struct serve_out *out);
int serve_http_error(struct serve *sv, struct MHD_Connection *conn, const char *route,
		     const struct serve_err *e);
/* Has the client of conn closed its end? */
bool serve_http_peer_gone(struct MHD_Connection *conn);

#endif
