// SPDX-License-Identifier: MIT
/*
 * `hyb serve` end to end on loopback: the real OpenAI client
 * (tests/serve/openai_check.py) and curl against it, greedy text equal to
 * `hyb run`'s alone and under concurrent requests, bad input, clients that
 * go away or send slowly, a full queue, the API key, timeouts and SIGTERM.
 * Each server binds port 0 and prints the port it got, so parallel runs do
 * not collide; it dies with the test (PR_SET_PDEATHSIG).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "as_seen.h"
#include "test.h"

#define HYB "build/hyb"

static double mono(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static char *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	char *buf;
	long n;

	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	rewind(f);
	buf = malloc((size_t)n + 1);
	CHECK(buf);
	n = (long)fread(buf, 1, (size_t)n, f);
	buf[n] = 0;
	fclose(f);
	if (len)
		*len = (size_t)n;
	return buf;
}

/* A synthetic model with a chat template: 256/512, 4 layers, ~1000 tokens/s on one thread. */
static const char *syn_model(void)
{
	static char path[512];
	char log[600];

	snprintf(path, sizeof(path), "%s/syn.gguf", hyb_test_tmpdir());
	if (!access(path, R_OK))
		return path;
	snprintf(log, sizeof(log), "%s/synth.log", hyb_test_tmpdir());
	if (hyb_test_sh(log, "%s synth -o %s --hidden 256 --ffn 512 --layers 4 --heads 4 "
			"--vocab 512 --chat-template chatml -t 1", hyb_test_hybctl(), path)) {
		hyb_test_show_log(log);
		CHECK_MSG(0, "hybctl synth failed");
	}
	return path;
}

struct srv {
	pid_t pid;
	int port;
	char log[600];
};

static void srv_start(struct srv *s, const char *model, const char *extra)
{
	static int n;
	char cmd[2048];
	double t0 = mono();

	if (access(HYB, X_OK))
		SKIP(HYB " is not built (make all builds it)");
	snprintf(s->log, sizeof(s->log), "%s/serve-%d.log", hyb_test_tmpdir(), n++);
	snprintf(cmd, sizeof(cmd), "exec " HYB " serve -m '%s' --port 0 -t 1 %s", model,
		 extra ? extra : "");
	fflush(NULL);
	s->pid = fork();
	CHECK(s->pid >= 0);
	if (!s->pid) {
		int fd = open(s->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		dup2(fd, 1);
		dup2(fd, 2);
		execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
		_exit(127);
	}
	for (;;) {
		char *text = slurp(s->log, NULL), *p;
		int st;

		p = text ? strstr(text, "listening on http://127.0.0.1:") : NULL;
		if (p) {
			s->port = atoi(p + strlen("listening on http://127.0.0.1:"));
			free(text);
			CHECK(s->port > 0);
			return;
		}
		free(text);
		if (waitpid(s->pid, &st, WNOHANG) == s->pid) {
			hyb_test_show_log(s->log);
			CHECK_MSG(0, "hyb serve exited before listening");
		}
		CHECK_MSG(mono() - t0 < 60, "hyb serve did not start in 60 s");
		usleep(20000);
	}
}

/* SIGTERM, then its exit status (-1: killed or still running after max_s). */
static int srv_stop(struct srv *s, double max_s)
{
	double t0 = mono();
	int st;

	kill(s->pid, SIGTERM);
	while (waitpid(s->pid, &st, WNOHANG) != s->pid) {
		if (mono() - t0 > max_s) {
			kill(s->pid, SIGKILL);
			waitpid(s->pid, &st, 0);
			hyb_test_show_log(s->log);
			return -1;
		}
		usleep(20000);
	}
	if (!WIFEXITED(st) || WEXITSTATUS(st))
		hyb_test_show_log(s->log);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int conn_open(int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	struct timeval tv = { 60, 0 };
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	CHECK(fd >= 0);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	if (connect(fd, (struct sockaddr *)&a, sizeof(a))) {
		close(fd);
		return -1;
	}
	return fd;
}

static void send_all(int fd, const char *s, size_t n)
{
	while (n) {
		ssize_t k = send(fd, s, n, MSG_NOSIGNAL);

		CHECK_MSG(k > 0, "send: %s", strerror(errno));
		s += k;
		n -= (size_t)k;
	}
}

/* Send one request (Connection: close); the socket, for reading its answer. */
static int request(int port, const char *method, const char *path, const char *headers,
		   const char *body)
{
	char head[1024];
	int fd = conn_open(port);

	CHECK_MSG(fd >= 0, "connect to port %d: %s", port, strerror(errno));
	snprintf(head, sizeof(head), "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
		 "Content-Type: application/json\r\nContent-Length: %zu\r\n%s\r\n", method, path,
		 body ? strlen(body) : 0, headers ? headers : "");
	send_all(fd, head, strlen(head));
	if (body)
		send_all(fd, body, strlen(body));
	return fd;
}

/* Everything until the server closes (or until it stops sending for 60 s). */
static char *read_all(int fd)
{
	size_t len = 0, cap = 4096;
	char *buf = malloc(cap);
	ssize_t k;

	CHECK(buf);
	while ((k = recv(fd, buf + len, cap - len - 1, 0)) > 0) {
		len += (size_t)k;
		if (cap - len < 1024) {
			cap *= 2;
			buf = realloc(buf, cap);
			CHECK(buf);
		}
	}
	buf[len] = 0;
	close(fd);
	return buf;
}

static int status_of(const char *resp)
{
	int st = 0;

	return sscanf(resp, "HTTP/1.%*d %d", &st) == 1 ? st : 0;
}

static const char *body_of(const char *resp)
{
	const char *p = strstr(resp, "\r\n\r\n");

	return p ? p + 4 : "";
}

/* One request, its status; *out (may be NULL) the whole answer, malloc'd. */
static int http(int port, const char *method, const char *path, const char *headers,
		const char *body, char **out)
{
	char *resp = read_all(request(port, method, path, headers, body));
	int st = status_of(resp);

	if (out)
		*out = resp;
	else
		free(resp);
	return st;
}

/* The Authorization header line metric() sends ("" without a key). */
static char metric_auth[128] = "";

/* A sample of GET /metrics: name with its labels, as the line starts. */
static double metric(int port, const char *name)
{
	char *resp, key[256], *p;
	double v = -1;

	CHECK_EQ_INT(http(port, "GET", "/metrics", metric_auth, NULL, &resp), 200);
	snprintf(key, sizeof(key), "\n%s ", name);
	p = strstr(resp, key);
	CHECK_MSG(p, "no %s in /metrics", name);
	v = strtod(p + strlen(key), NULL);
	free(resp);
	return v;
}

/* Wait up to max_s for a metric to reach a value. */
static bool metric_becomes(int port, const char *name, double want, double max_s)
{
	double t0 = mono();

	while (mono() - t0 < max_s) {
		if (metric(port, name) == want)
			return true;
		usleep(20000);
	}
	return false;
}

/* Choice 0's text of a completion answer (chat: message.content), malloc'd; *len: its length. */
static char *completion_text(const char *resp, size_t *len)
{
	json_error_t je;
	json_t *j = json_loads(body_of(resp), JSON_ALLOW_NUL, &je), *c;
	char *s = NULL;

	CHECK_MSG(j, "not JSON (%s): %.300s", je.text, body_of(resp));
	c = json_array_get(json_object_get(j, "choices"), 0);
	if (json_object_get(c, "message"))
		c = json_object_get(json_object_get(c, "message"), "content");
	else
		c = json_object_get(c, "text");
	CHECK_MSG(json_is_string(c), "no text in %.300s", body_of(resp));
	*len = json_string_length(c);
	s = malloc(*len + 1);
	CHECK(s);
	memcpy(s, json_string_value(c), *len + 1);
	json_decref(j);
	return s;
}

/* A JSON error object with a message: {"error": {"message": ...}}. */
static void check_error_body(const char *resp, const char *needle)
{
	json_error_t je;
	json_t *j = json_loads(body_of(resp), 0, &je);
	json_t *m = json_object_get(json_object_get(j, "error"), "message");

	CHECK_MSG(json_is_string(m), "not a JSON error: %.300s", body_of(resp));
	CHECK_MSG(!needle || strstr(json_string_value(m), needle) ||
		  strstr(body_of(resp), needle), "'%s' not in %.300s", needle, body_of(resp));
	json_decref(j);
}

/* Text as a client sees it (as_seen.h), malloc'd. */
static char *as_seen(const char *s, size_t n)
{
	char *out = malloc(n + 1);

	CHECK(out);
	hyb_as_seen(s, n, out);
	return out;
}

/* n completions of body sent at once (n <= 8): each 200 and the text want. */
static void at_once(int port, const char *body, int n, const char *want)
{
	int fds[8];
	size_t len;

	CHECK(n <= 8);
	for (int i = 0; i < n; i++)
		fds[i] = request(port, "POST", "/v1/completions", NULL, body);
	for (int i = 0; i < n; i++) {
		char *resp = read_all(fds[i]), *text, *seen;

		CHECK_MSG(status_of(resp) == 200, "%s", resp);
		text = completion_text(resp, &len);
		seen = as_seen(text, len);
		CHECK_MSG(!strcmp(seen, want), "request %d of %d at once: \"%s\" vs \"%s\"", i, n,
			  seen, want);
		free(seen);
		free(text);
		free(resp);
	}
}

static char *run_text_args(const char *model, const char *prompt, int n, bool chat,
			   const char *extra)
{
	char out[600], err[600], *text;
	size_t len, skip = chat ? 0 : strlen(prompt);

	snprintf(out, sizeof(out), "%s/run-%d.out", hyb_test_tmpdir(), chat);
	snprintf(err, sizeof(err), "%s/run.err", hyb_test_tmpdir());
	CHECK_EQ_INT(hyb_test_sh(err, "{ " HYB " run -m '%s' %s %s -p '%s' -n %d -t 1 >%s; }",
				 model, chat ? "--chat" : "", extra, prompt, n, out), 0);
	text = slurp(out, &len);
	CHECK(text && len > skip && text[len - 1] == '\n');
	char *seen = as_seen(text + skip, len - skip - 1);

	free(text);
	return seen;
}

static char *run_text(const char *model, const char *prompt, int n, bool chat)
{
	return run_text_args(model, prompt, n, chat, "");
}

static void openai_client(const char *model, const char *prompt, int n, const char *extra,
			  const char *key)
{
	char log[600], run_out[600], chat_out[600], err[600], args[1024];
	struct srv s;
	int rc;

	hyb_test_need_venv();
	snprintf(run_out, sizeof(run_out), "%s/run.out", hyb_test_tmpdir());
	snprintf(chat_out, sizeof(chat_out), "%s/chat.out", hyb_test_tmpdir());
	snprintf(err, sizeof(err), "%s/run.err", hyb_test_tmpdir());
	CHECK_EQ_INT(hyb_test_sh(err, "{ " HYB " run -m '%s' -p '%s' -n %d -t 1 >%s; }", model,
				 prompt, n, run_out), 0);
	CHECK_EQ_INT(hyb_test_sh(err, "{ " HYB " run -m '%s' --chat -p '%s' -n %d -t 1 >%s; }",
				 model, prompt, n, chat_out), 0);
	srv_start(&s, model, extra);
	snprintf(log, sizeof(log), "%s/openai.log", hyb_test_tmpdir());
	snprintf(args, sizeof(args), "%s%s", key ? "--key " : "", key ? key : "");
	if (key)
		strcat(args, " --wrong-key not-the-key");
	rc = hyb_test_sh(log, ".venv/bin/python tests/serve/openai_check.py --base "
			 "http://127.0.0.1:%d/v1 --prompt '%s' -n %d --run-out %s --chat-out %s "
			 "--load 64 16 %s", s.port, prompt, n, run_out, chat_out, args);
	hyb_test_show_log(log);
	if (rc)
		hyb_test_show_log(s.log);
	CHECK_EQ_INT(rc, 0);
	if (key)
		snprintf(metric_auth, sizeof(metric_auth), "Authorization: Bearer %s\r\n", key);
	/* the load is over: nothing in flight or queued, nothing refused or cancelled */
	CHECK_EQ_INT(metric(s.port, "hyb_requests_in_flight"), 0);
	CHECK_EQ_INT(metric(s.port, "hyb_queue_depth"), 0);
	CHECK_EQ_INT(metric(s.port, "hyb_requests_rejected_total"), 0);
	CHECK_EQ_INT(metric(s.port, "hyb_requests_cancelled_total{reason=\"disconnect\"}"), 0);
	CHECK(metric(s.port, "hyb_time_to_first_token_seconds_count") >= 72);
	/* no KV block leaked: every request's came back */
	CHECK_EQ_INT(metric(s.port, "hyb_kv_blocks_used"), 0);
	CHECK_EQ_INT(metric(s.port, "hyb_kv_blocks_reserved"), 0);
	/* and they were batched: far fewer passes than tokens */
	CHECK_MSG(metric(s.port, "hyb_steps_total") * 2 < metric(s.port, "hyb_completion_tokens_total"),
		  "%lld passes for %lld tokens", (long long)metric(s.port, "hyb_steps_total"),
		  (long long)metric(s.port, "hyb_completion_tokens_total"));
	CHECK_EQ_INT(srv_stop(&s, 30), 0);
}

TEST(serve_openai_client_synthetic)
{
	openai_client(syn_model(), "hello there", 24, "--parallel 16", NULL);
}

TEST(serve_openai_client_smollm2)
{
	const char *m = hyb_test_real_model("smollm2");
	char keyfile[600], extra[700];
	FILE *f;

	/* the real model behind an API key: the client sends it, a wrong one is refused */
	snprintf(keyfile, sizeof(keyfile), "%s/key", hyb_test_tmpdir());
	f = fopen(keyfile, "w");
	CHECK(f);
	fputs("sk-test-0123456789\n", f);
	fclose(f);
	snprintf(extra, sizeof(extra), "--parallel 16 --api-key-file %s", keyfile);
	openai_client(m, "The capital of France is", 16, extra, "sk-test-0123456789");
}

/* curl: greedy text equal to hyb run's, one request alone and 16 at once, batched. */
static void curl_greedy(const char *model, const char *prompt, int n)
{
	char *want = run_text(model, prompt, n, false), *want_chat = run_text(model, prompt, n, true);
	char log[600], path[700], body[512];
	struct srv s;

	srv_start(&s, model, "--parallel 16");
	snprintf(log, sizeof(log), "%s/curl.log", hyb_test_tmpdir());
	snprintf(body, sizeof(body), "{\"prompt\": \"%s\", \"max_tokens\": %d, \"temperature\": 0}",
		 prompt, n);
	CHECK_EQ_INT(hyb_test_sh(log, "curl -sS -f -o %s/alone.json http://127.0.0.1:%d/v1/"
				 "completions -H 'Content-Type: application/json' -d '%s'",
				 hyb_test_tmpdir(), s.port, body), 0);
	/* 16 at once, completions and chats */
	CHECK_EQ_INT(hyb_test_sh(log, "for i in 0 1 2 3 4 5 6 7; do "
				 "curl -sS -f -o %s/c$i.json http://127.0.0.1:%d/v1/completions "
				 "-d '%s' & "
				 "curl -sS -f -o %s/h$i.json http://127.0.0.1:%d/v1/chat/completions "
				 "-d '{\"messages\": [{\"role\": \"user\", \"content\": \"%s\"}], "
				 "\"max_tokens\": %d, \"temperature\": 0}' & "
				 "done; wait",
				 hyb_test_tmpdir(), s.port, body, hyb_test_tmpdir(), s.port, prompt, n),
		     0);
	for (int i = -1; i < 16; i++) {
		char *resp, *text, *seen;
		size_t len;

		if (i < 0)
			snprintf(path, sizeof(path), "%s/alone.json", hyb_test_tmpdir());
		else
			snprintf(path, sizeof(path), "%s/%c%d.json", hyb_test_tmpdir(),
				 i & 1 ? 'h' : 'c', i / 2);
		resp = slurp(path, NULL);
		CHECK_MSG(resp, "%s missing", path);
		/* completion_text reads a body: give it one after a blank line */
		char *wrapped = malloc(strlen(resp) + 8);

		CHECK(wrapped);
		sprintf(wrapped, "\r\n\r\n%s", resp);
		text = completion_text(wrapped, &len);
		seen = as_seen(text, len);
		const char *ref = i >= 0 && i & 1 ? want_chat : want;

		CHECK_MSG(!strcmp(seen, ref), "%s: \"%s\" vs hyb run's \"%s\"", path, seen, ref);
		free(seen);
		free(text);
		free(wrapped);
		free(resp);
	}
	CHECK_EQ_INT(metric(s.port, "hyb_requests_in_flight"), 0);
	CHECK_EQ_INT(metric(s.port, "hyb_requests_total{route=\"/v1/completions\",status=\"200\"}"),
		     9);
	CHECK_EQ_INT(metric(s.port,
			    "hyb_requests_total{route=\"/v1/chat/completions\",status=\"200\"}"), 8);
	CHECK_EQ_INT(metric(s.port, "hyb_kv_blocks_used"), 0);
	CHECK_EQ_INT(srv_stop(&s, 30), 0);
	free(want);
	free(want_chat);
}

TEST(serve_curl_greedy_synthetic)
{
	curl_greedy(syn_model(), "hello there", 32);
}

TEST(serve_curl_greedy_smollm2)
{
	curl_greedy(hyb_test_real_model("smollm2"), "The capital of France is", 16);
}

TEST(serve_bad_input)
{
	static const struct {
		const char *path, *body;
		int status;
		const char *needle;
	} cases[] = {
		{ "/v1/completions", "{\"prompt\": \"hi\", ", 400, "not valid JSON" },
		{ "/v1/completions", "[1, 2]", 400, "must be a JSON object" },
		{ "/v1/completions", "", 400, "no body" },
		{ "/v1/completions", "{\"prompt\": 5}", 400, "'prompt'" },
		{ "/v1/completions", "{\"prompt\": \"hi\", \"temperature\": \"hot\"}", 400,
		  "'temperature' must be a number" },
		{ "/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 1.5}", 400,
		  "'max_tokens' must be an integer" },
		{ "/v1/completions", "{\"prompt\": \"hi\", \"stream\": \"yes\"}", 400, "'stream'" },
		{ "/v1/completions", "{\"prompt\": \"hi\", \"stop\": [1]}", 400, "'stop'" },
		{ "/v1/completions", "{\"prompt\": [99999]}", 400, "past the vocabulary" },
		{ "/v1/completions", "{\"prompt\": \"hi\", \"top_p\": 7}", 400, "'top_p' must be in" },
		{ "/v1/chat/completions", "{\"messages\": \"hi\"}", 400, "'messages'" },
		{ "/v1/chat/completions", "{\"messages\": [{\"role\": \"user\"}]}", 400, "content" },
		{ "/v1/completions", "{\"prompt\": \"hi\", \"model\": \"gpt-9\"}", 404, "gpt-9" },
		{ "/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 5000}", 400,
		  "context_length_exceeded" },
		{ "/v1/chat/completions",
		  "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 4096}",
		  400, "exceed the context" },
		{ "/v1/nothing", "{}", 404, "no endpoint" },
	};
	char log[600], big[600], *resp;
	struct srv s;

	srv_start(&s, syn_model(), "-c 4096");
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		int st = http(s.port, "POST", cases[i].path, NULL, cases[i].body, &resp);

		CHECK_MSG(st == cases[i].status, "%s %s: %d, not %d", cases[i].path, cases[i].body,
			  st, cases[i].status);
		check_error_body(resp, cases[i].needle);
		free(resp);
	}
	CHECK_EQ_INT(http(s.port, "GET", "/v1/completions", NULL, NULL, &resp), 405);
	check_error_body(resp, "wrong method");
	free(resp);
	/* curl: a 10 MB body is refused before it is read */
	snprintf(big, sizeof(big), "%s/big.json", hyb_test_tmpdir());
	snprintf(log, sizeof(log), "%s/curl.out", hyb_test_tmpdir());
	CHECK_EQ_INT(hyb_test_sh(log, "head -c 10485760 /dev/zero | tr '\\0' 'a' > %s && "
				 "curl -sS -w '\\n%%{http_code}' http://127.0.0.1:%d/v1/completions "
				 "-H 'Content-Type: application/json' --data-binary @%s", big, s.port,
				 big), 0);
	resp = slurp(log, NULL);
	CHECK_MSG(strstr(resp, "\n413") && strstr(resp, "larger than"), "%s", resp);
	free(resp);
	/* the server still serves, and ran nothing for the refused requests */
	CHECK_EQ_INT(metric(s.port, "hyb_prompt_tokens_total"), 0);
	CHECK_EQ_INT(http(s.port, "POST", "/v1/completions", NULL,
			  "{\"prompt\": \"hi\", \"max_tokens\": 4}", &resp), 200);
	free(resp);
	CHECK_EQ_INT(http(s.port, "GET", "/health", NULL, NULL, &resp), 200);
	CHECK(strstr(body_of(resp), "\"ok\""));
	free(resp);
	CHECK_EQ_INT(srv_stop(&s, 30), 0);
}

static const char long_stream[] =
	"{\"prompt\": \"hello there\", \"max_tokens\": 4000, \"temperature\": 0, \"stream\": true}";
static const char long_plain[] =
	"{\"prompt\": \"hello there\", \"max_tokens\": 4000, \"temperature\": 0}";

/* Read from fd until needle has arrived; what came, malloc'd. */
static char *read_until(int fd, const char *needle)
{
	size_t len = 0, cap = 65536;
	char *buf = malloc(cap);
	ssize_t k;

	CHECK(buf);
	buf[0] = 0;
	while (!strstr(buf, needle)) {
		CHECK_MSG(len + 1 < cap, "no '%s' in the first %zu bytes", needle, cap);
		k = recv(fd, buf + len, cap - len - 1, 0);
		CHECK_MSG(k > 0, "the stream ended before '%s': %s", needle, buf);
		len += (size_t)k;
		buf[len] = 0;
	}
	return buf;
}

/*
 * Chunked prefill: while a long prompt goes in (pieces of --batch 32), a
 * running stream keeps getting tokens, one a step: its longest silence is
 * about a piece's time, not the whole prompt's (which it was when a prompt
 * went in whole). The long request's text is still hyb run's.
 */
TEST(serve_prefill_in_pieces_keeps_streams_going)
{
	const char *model = hyb_test_real_model("smollm2");
	char prompt[4096] = "", body[4400], *a_buf, *b_buf, *want, *text, *seen, *l;
	size_t a_len = 0, b_len = 0, cap = 1 << 20, len;
	double gap = 0, last, t_prompt = 0;
	int fa, fb, n_prompt = 0;
	struct srv s;

	for (int i = 0; i < 60; i++)
		strcat(prompt, i % 2 ? "the sky is blue because " : "light scatters and ");
	want = run_text(model, prompt, 4, false);
	srv_start(&s, model, "--parallel 2 --batch 32");
	fa = request(s.port, "POST", "/v1/completions", NULL, long_stream);
	a_buf = read_until(fa, "data: {");
	a_len = strlen(a_buf);
	a_buf = realloc(a_buf, cap);
	b_buf = malloc(cap);
	CHECK(a_buf && b_buf);
	snprintf(body, sizeof(body), "{\"prompt\": \"%s\", \"max_tokens\": 4, \"temperature\": 0}",
		 prompt);
	fb = request(s.port, "POST", "/v1/completions", NULL, body);
	last = mono();
	/* the gaps between A's reads until B's answer is complete (its connection closes) */
	for (;;) {
		struct pollfd p[2] = { { .fd = fa, .events = POLLIN }, { .fd = fb, .events = POLLIN } };
		ssize_t k;

		CHECK_MSG(poll(p, 2, 60000) > 0, "no progress for 60 s");
		if (p[0].revents) {
			const double now = mono();

			k = recv(fa, a_buf + a_len, cap - a_len - 1, 0);
			CHECK_MSG(k > 0 && a_len + (size_t)k + 1 < cap, "stream A ended");
			a_buf[a_len + (size_t)k] = 0;
			/* a token's event (not a keep-alive comment) */
			if (strstr(a_buf + (a_len > 8 ? a_len - 8 : 0), "data: {")) {
				gap = now - last > gap ? now - last : gap;
				last = now;
			}
			a_len += (size_t)k;
		}
		if (p[1].revents) {
			k = recv(fb, b_buf + b_len, cap - b_len - 1, 0);
			CHECK(k >= 0 && b_len + (size_t)k + 1 < cap);
			if (!k)
				break;
			b_len += (size_t)k;
		}
	}
	close(fb);
	close(fa);
	b_buf[b_len] = 0;
	CHECK_EQ_INT(status_of(b_buf), 200);
	text = completion_text(b_buf, &len);
	seen = as_seen(text, len);
	CHECK_MSG(!strcmp(seen, want), "the long prompt's text \"%s\", hyb run's \"%s\"", seen, want);
	CHECK_EQ_INT(srv_stop(&s, 30), 0);
	/* B's prompt: "engine 0 seq S: N prompt tokens in T s" */
	l = slurp(s.log, NULL);
	CHECK(l);
	for (const char *p = strstr(l, " seq "); p; p = strstr(p + 1, " seq ")) {
		unsigned n;
		double t;

		if (sscanf(strstr(p, ": "), ": %u prompt tokens in %lf s", &n, &t) == 2 && n > 100) {
			n_prompt = (int)n;
			t_prompt = t;
		}
	}
	free(l);
	CHECK_MSG(n_prompt > 8 * 32, "the long prompt's line not in the log");
	printf("    %d-token prompt in %d pieces, %.3f s; the stream's longest silence "
	       "meanwhile %.3f s\n", n_prompt, (n_prompt + 31) / 32, t_prompt, gap);
	CHECK_MSG(gap < t_prompt / 3, "stream A waited %.3f s of the prompt's %.3f s", gap,
		  t_prompt);
	free(a_buf);
	free(b_buf);
	free(text);
	free(seen);
	free(want);
}

/* The "logprobs" object of a reply, as compact JSON (malloc'd); checks its shape. */
static char *logprobs_of(const char *resp, int k, bool chat)
{
	json_error_t je;
	json_t *j = json_loads(body_of(resp), 0, &je), *c, *lp;
	char *out;

	CHECK_MSG(j, "not JSON (%s): %.300s", je.text, body_of(resp));
	c = json_array_get(json_object_get(j, "choices"), 0);
	lp = json_object_get(c, "logprobs");
	CHECK_MSG(json_is_object(lp), "no logprobs in %.300s", body_of(resp));
	if (chat) {
		json_t *content = json_object_get(lp, "content");

		CHECK(json_array_size(content) > 0);
		for (size_t i = 0; i < json_array_size(content); i++) {
			json_t *t = json_array_get(content, i), *top = json_object_get(t, "top_logprobs");
			const double v = json_number_value(json_object_get(t, "logprob"));

			CHECK(v <= 0 && json_is_array(json_object_get(t, "bytes")));
			CHECK_EQ_INT(json_array_size(top), k);
			for (size_t q = 0; q < json_array_size(top); q++) {
				const double w = json_number_value(
					json_object_get(json_array_get(top, q), "logprob"));

				/* best first; at temperature 0 the chosen token is the best */
				CHECK(q || w == v);
				CHECK(!q || w <= json_number_value(json_object_get(
						     json_array_get(top, q - 1), "logprob")));
			}
		}
	} else {
		json_t *toks = json_object_get(lp, "tokens"), *lps = json_object_get(lp, "token_logprobs");
		json_t *tops = json_object_get(lp, "top_logprobs");
		const char *text = json_string_value(json_object_get(c, "text"));
		size_t at = 0;

		CHECK(json_array_size(toks) > 0 && json_array_size(lps) == json_array_size(toks) &&
		      json_array_size(tops) == json_array_size(toks));
		for (size_t i = 0; i < json_array_size(toks); i++) {
			const char *t = json_string_value(json_array_get(toks, i));
			const double v = json_number_value(json_array_get(lps, i));
			double best = -1e30;
			const char *key;
			json_t *val;

			/* the tokens spell the text */
			CHECK_MSG(!strncmp(text + at, t, strlen(t)), "token %zu '%s' not at %zu of '%s'",
				  i, t, at, text);
			at += strlen(t);
			CHECK(v <= 0 && json_object_size(json_array_get(tops, i)) <= (size_t)k);
			json_object_foreach(json_array_get(tops, i), key, val)
				best = json_number_value(val) > best ? json_number_value(val) : best;
			CHECK_MSG(best == v, "token %zu: logprob %g, the best alternative %g", i, v, best);
		}
		CHECK_EQ_INT(at, strlen(text));
	}
	out = json_dumps(lp, JSON_COMPACT);
	CHECK(out);
	json_decref(j);
	return out;
}

/* A streamed completion's token_logprobs, chunk after chunk, equal those of want (JSON). */
static void same_streamed_logprobs(int port, const char *body, const char *want_json)
{
	char *r = read_all(request(port, "POST", "/v1/completions", NULL, body)), *got, *want;
	json_t *lps = json_array(), *w;
	json_error_t je;

	CHECK_EQ_INT(status_of(r), 200);
	for (char *p = strstr(r, "data: {"); p; p = strstr(p + 1, "data: {")) {
		char *end = strstr(p, "\n\n");
		json_t *ev, *x;
		size_t i;

		CHECK(end);
		ev = json_loadb(p + 6, (size_t)(end - p - 6), JSON_ALLOW_NUL, &je);
		CHECK_MSG(ev, "event not JSON: %.200s", p);
		json_array_foreach(json_object_get(json_object_get(json_array_get(
			json_object_get(ev, "choices"), 0), "logprobs"), "token_logprobs"), i, x)
			json_array_append(lps, x);
		json_decref(ev);
	}
	w = json_loads(want_json, JSON_ALLOW_NUL, &je);
	CHECK(w);
	got = json_dumps(lps, JSON_COMPACT);
	want = json_dumps(json_object_get(w, "token_logprobs"), JSON_COMPACT);
	CHECK_MSG(got && want && !strcmp(got, want), "streamed logprobs %s, not streamed %s", got,
		  want);
	free(got);
	free(want);
	json_decref(w);
	json_decref(lps);
	free(r);
}

/* A reply's logprobs against the numpy reference (tests/serve/logprobs_check.py ARGS). */
static void oracle_logprobs(const char *model, const char *ids, const char *resp,
			    const char *args)
{
	char reply[600], log[600];
	FILE *f;

	snprintf(reply, sizeof(reply), "%s/lp.json", hyb_test_tmpdir());
	snprintf(log, sizeof(log), "%s/lp-check.log", hyb_test_tmpdir());
	f = fopen(reply, "w");
	CHECK(f);
	fputs(body_of(resp), f);
	fclose(f);
	CHECK_EQ_INT(hyb_test_sh(log, ".venv/bin/python tests/serve/logprobs_check.py %s "
				 "--tokens %s --reply %s %s", model, ids, reply, args), 0);
	hyb_test_show_log(log);
}

/*
 * logprobs: the first token's and an echoed prompt's against the numpy
 * reference on the prompt's ids (the model's own distribution), the shape
 * of both APIs', the same alone, among 4 at once (batch invariance) and
 * streamed, and the bad requests.
 */
TEST(serve_logprobs_match_the_oracle)
{
	static const char ids[] = "1,17,300,42,5,511,256,99,3,128";
	char path[600], log[600], body[512], *resp, *alone, *chat, *echoed = NULL;
	struct srv s;

	hyb_test_need_venv();
	snprintf(path, sizeof(path), "%s/lp.gguf", hyb_test_tmpdir());
	snprintf(log, sizeof(log), "%s/lp.log", hyb_test_tmpdir());
	CHECK_EQ_INT(hyb_test_sh(log, "%s synth -o %s --hidden 256 --ffn 512 --layers 4 "
				 "--heads 4 --vocab 512 --type F32 --chat-template chatml",
				 hyb_test_hybctl(), path), 0);
	srv_start(&s, path, "--parallel 4");
	snprintf(body, sizeof(body), "{\"prompt\": [%s], \"max_tokens\": 8, \"temperature\": 0, "
		 "\"logprobs\": 5}", ids);
	CHECK_EQ_INT(http(s.port, "POST", "/v1/completions", NULL, body, &resp), 200);
	alone = logprobs_of(resp, 5, false);
	oracle_logprobs(path, ids, resp, "-k 5");
	free(resp);
	/* echo: every prompt token's logprob against the reference (the first: null) */
	snprintf(body, sizeof(body), "{\"prompt\": [%s], \"max_tokens\": 0, \"echo\": true, "
		 "\"logprobs\": 1}", ids);
	CHECK_EQ_INT(http(s.port, "POST", "/v1/completions", NULL, body, &resp), 200);
	oracle_logprobs(path, ids, resp, "-k 1 --echo");
	{
		json_error_t je;
		json_t *j = json_loads(body_of(resp), JSON_ALLOW_NUL, &je);

		CHECK(j);
		echoed = json_dumps(json_object_get(json_array_get(json_object_get(j, "choices"), 0),
						    "logprobs"), JSON_COMPACT);
		CHECK(echoed);
		json_decref(j);
	}
	free(resp);
	snprintf(body, sizeof(body), "{\"prompt\": [%s], \"max_tokens\": 8, \"temperature\": 0, "
		 "\"logprobs\": 5}", ids);
	/* four at once: each the same as alone */
	{
		int fd[4];

		for (int i = 0; i < 4; i++)
			fd[i] = request(s.port, "POST", "/v1/completions", NULL, body);
		for (int i = 0; i < 4; i++) {
			char *r = read_all(fd[i]), *lp;

			CHECK_EQ_INT(status_of(r), 200);
			lp = logprobs_of(r, 5, false);
			CHECK_MSG(!strcmp(lp, alone), "batched logprobs differ from alone");
			free(lp);
			free(r);
		}
	}
	CHECK_EQ_INT(http(s.port, "POST", "/v1/chat/completions", NULL,
			  "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
			  "\"max_tokens\": 4, \"temperature\": 0, \"logprobs\": true, "
			  "\"top_logprobs\": 3}", &resp), 200);
	chat = logprobs_of(resp, 3, true);
	free(resp);
	/* streamed: each chunk carries its tokens' logprobs, together the reply's */
	{
		char sbody[512];

		snprintf(sbody, sizeof(sbody), "{\"prompt\": [%s], \"max_tokens\": 8, "
			 "\"temperature\": 0, \"logprobs\": 5, \"stream\": true}", ids);
		same_streamed_logprobs(s.port, sbody, alone);
		snprintf(sbody, sizeof(sbody), "{\"prompt\": [%s], \"max_tokens\": 0, "
			 "\"echo\": true, \"logprobs\": 1, \"stream\": true}", ids);
		same_streamed_logprobs(s.port, sbody, echoed);
	}
	/* refused: out of range, top_logprobs without logprobs or on completions, echo in a
	 * chat */
	{
		static const struct {
			bool chat;
			const char *body, *needle;
		} bad[] = {
			{ true, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
				"\"echo\": true}", "for completions" },
			{ false, "{\"prompt\": \"hi\", \"logprobs\": 21}", "[0, 20]" },
			{ false, "{\"prompt\": \"hi\", \"logprobs\": \"yes\"}", "integer" },
			{ true, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
				"\"top_logprobs\": 2}", "needs 'logprobs': true" },
			{ false, "{\"prompt\": \"hi\", \"top_logprobs\": 2}", "for chat" },
		};

		for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
			CHECK_EQ_INT(http(s.port, "POST", bad[i].chat ? "/v1/chat/completions" :
					  "/v1/completions", NULL, bad[i].body, &resp), 400);
			check_error_body(resp, bad[i].needle);
			free(resp);
		}
	}
	/* without logprobs: null, as before */
	CHECK_EQ_INT(http(s.port, "POST", "/v1/completions", NULL,
			  "{\"prompt\": \"hi\", \"max_tokens\": 2}", &resp), 200);
	CHECK(strstr(body_of(resp), "\"logprobs\":null"));
	free(resp);
	CHECK_EQ_INT(srv_stop(&s, 30), 0);
	free(alone);
	free(chat);
	free(echoed);
}

TEST(serve_client_disconnects)
{
	struct srv s;
	char *resp;
	int fd;

	srv_start(&s, syn_model(), "--parallel 1");
	/* mid-stream: two content events, then the client is gone */
	fd = request(s.port, "POST", "/v1/completions", NULL, long_stream);
	free(read_until(fd, "data: {"));
	close(fd);
	CHECK_MSG(metric_becomes(s.port, "hyb_requests_in_flight", 0, 10),
		  "the request still decodes after its client left");
	CHECK_EQ_INT(metric(s.port, "hyb_requests_cancelled_total{reason=\"disconnect\"}"), 1);
	CHECK(metric(s.port, "hyb_completion_tokens_total") < 4000);
	/* a plain request whose client leaves while it decodes */
	fd = request(s.port, "POST", "/v1/completions", NULL, long_plain);
	CHECK(metric_becomes(s.port, "hyb_requests_in_flight", 1, 10));
	close(fd);
	CHECK_MSG(metric_becomes(s.port, "hyb_requests_in_flight", 0, 10),
		  "the request still decodes after its client left");
	CHECK_EQ_INT(metric(s.port, "hyb_requests_cancelled_total{reason=\"disconnect\"}"), 2);
	CHECK(metric(s.port, "hyb_completion_tokens_total") < 8000);
	/* everyone else is still served */
	CHECK_EQ_INT(http(s.port, "POST", "/v1/completions", NULL,
			  "{\"prompt\": \"hi\", \"max_tokens\": 4}", &resp), 200);
	free(resp);
	CHECK_EQ_INT(srv_stop(&s, 30), 0);
}

TEST(serve_slow_loris)
{
	struct srv s;
	char *resp, buf[256];
	int hdr, body;
	double t0;

	srv_start(&s, syn_model(), "--idle-timeout 2");
	/* headers that never end, and a body that trickles in */
	hdr = conn_open(s.port);
	CHECK(hdr >= 0);
	send_all(hdr, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n", 40);
	body = conn_open(s.port);
	CHECK(body >= 0);
	send_all(body, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{", 67);
	t0 = mono();
	/* meanwhile others are served */
	CHECK_EQ_INT(http(s.port, "POST", "/v1/completions", NULL,
			  "{\"prompt\": \"hi\", \"max_tokens\": 4}", &resp), 200);
	free(resp);
	CHECK_EQ_INT(http(s.port, "GET", "/health", NULL, NULL, NULL), 200);
	/* the trickle: a byte every 0.3 s gets a 408 (or the door) after about 2 s */
	for (int i = 0; i < 40; i++) {
		ssize_t k;

		usleep(300000);
		if (send(body, " ", 1, MSG_NOSIGNAL) != 1)
			break;
		k = recv(body, buf, sizeof(buf) - 1, MSG_DONTWAIT);
		if (k == 0 || (k < 0 && errno != EAGAIN))
			break;
		if (k > 0) {
			buf[k] = 0;
			CHECK_MSG(status_of(buf) == 408, "%s", buf);
			break;
		}
	}
	CHECK_MSG(mono() - t0 < 8, "the trickling body was allowed %.1f s", mono() - t0);
	/* the unfinished headers: the connection is closed after 2 s of silence */
	CHECK_MSG(recv(hdr, buf, sizeof(buf), 0) <= 0, "an answer to half a request");
	CHECK_MSG(mono() - t0 < 10, "the silent client was kept %.1f s", mono() - t0);
	close(hdr);
	close(body);
	CHECK_EQ_INT(http(s.port, "GET", "/health", NULL, NULL, NULL), 200);
	CHECK_EQ_INT(srv_stop(&s, 30), 0);

	/* many of them from one address: past --max-conns-per-ip they are turned away */
	srv_start(&s, syn_model(), "--max-conns-per-ip 2");
	hdr = conn_open(s.port);
	body = conn_open(s.port);
	CHECK(hdr >= 0 && body >= 0);
	send_all(hdr, "GET /health HTTP/1.1\r\n", 24);
	send_all(body, "GET /health HTTP/1.1\r\n", 24);
	usleep(200000);
	CHECK_EQ_INT(http(s.port, "GET", "/health", NULL, NULL, &resp), 0);
	free(resp);
	close(hdr);
	close(body);
	usleep(200000);
	CHECK_EQ_INT(http(s.port, "GET", "/health", NULL, NULL, NULL), 200);
	CHECK_EQ_INT(srv_stop(&s, 30), 0);
}

TEST(serve_queue_full_503)
{
	struct srv s;
	char *resp;
	int a, b;

	srv_start(&s, syn_model(), "--parallel 1 --queue 1");
	a = request(s.port, "POST", "/v1/completions", NULL, long_plain);
	CHECK(metric_becomes(s.port, "hyb_requests_in_flight", 1, 10));
	b = request(s.port, "POST", "/v1/completions", NULL, long_plain);
	CHECK(metric_becomes(s.port, "hyb_queue_depth", 1, 10));
	/* one running, one waiting, no room: 503 with Retry-After, and nothing runs */
	CHECK_EQ_INT(http(s.port, "POST", "/v1/chat/completions", NULL,
			  "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", &resp), 503);
	CHECK_MSG(strstr(resp, "Retry-After: 1\r\n"), "%s", resp);
	check_error_body(resp, "busy");
	free(resp);
	CHECK_EQ_INT(metric(s.port, "hyb_requests_rejected_total"), 1);
	/* both clients leave: the queued one is dropped, the running one stops */
	close(b);
	close(a);
	CHECK(metric_becomes(s.port, "hyb_requests_in_flight", 0, 10));
	CHECK(metric_becomes(s.port, "hyb_queue_depth", 0, 10));
	CHECK_EQ_INT(metric(s.port, "hyb_requests_cancelled_total{reason=\"disconnect\"}"), 2);
	CHECK_EQ_INT(http(s.port, "POST", "/v1/completions", NULL,
			  "{\"prompt\": \"hi\", \"max_tokens\": 4}", NULL), 200);
	CHECK_EQ_INT(srv_stop(&s, 30), 0);

	/* no waiting room: requests take idle slots, the one past them is refused */
	srv_start(&s, syn_model(), "--parallel 2 --queue 0");
	a = request(s.port, "POST", "/v1/completions", NULL, long_plain);
	b = request(s.port, "POST", "/v1/completions", NULL, long_plain);
	CHECK(metric_becomes(s.port, "hyb_requests_in_flight", 2, 10));
	CHECK_EQ_INT(http(s.port, "POST", "/v1/completions", NULL, long_plain, NULL), 503);
	close(a);
	close(b);
	CHECK(metric_becomes(s.port, "hyb_requests_in_flight", 0, 10));
	CHECK_EQ_INT(srv_stop(&s, 30), 0);
}

TEST(serve_api_key)
{
	char keyfile[600], extra[700], want[64], *resp;
	int n_gen = 0;
	const char *good = "{\"prompt\": \"hi\", \"max_tokens\": 3}";
	struct srv s;
	FILE *f;

	snprintf(keyfile, sizeof(keyfile), "%s/key", hyb_test_tmpdir());
	f = fopen(keyfile, "w");
	CHECK(f);
	fputs("s3cret\n", f);
	fclose(f);
	snprintf(extra, sizeof(extra), "--api-key-file %s", keyfile);
	srv_start(&s, syn_model(), extra);
	CHECK_EQ_INT(http(s.port, "POST", "/v1/completions", NULL, good, &resp), 401);
	CHECK(strstr(resp, "WWW-Authenticate: Bearer"));
	check_error_body(resp, "API key");
	free(resp);
	CHECK_EQ_INT(http(s.port, "POST", "/v1/completions", "Authorization: Bearer s3cre\r\n", good,
			  NULL), 401);
	CHECK_EQ_INT(http(s.port, "POST", "/v1/completions", "Authorization: Bearer s3cret!\r\n",
			  good, NULL), 401);
	CHECK_EQ_INT(http(s.port, "GET", "/v1/models", NULL, NULL, NULL), 401);
	CHECK_EQ_INT(http(s.port, "GET", "/metrics", NULL, NULL, NULL), 401);
	/* health checks need no key */
	CHECK_EQ_INT(http(s.port, "GET", "/health", NULL, NULL, NULL), 200);
	/* with the key: nothing had run before this one (it samples: it may stop before 3) */
	CHECK_EQ_INT(http(s.port, "POST", "/v1/completions", "Authorization: Bearer s3cret\r\n",
			  good, &resp), 200);
	{
		const char *u = strstr(resp, "\"completion_tokens\":");

		CHECK_MSG(u && sscanf(u + strlen("\"completion_tokens\":"), " %d", &n_gen) == 1 &&
			  n_gen >= 1 && n_gen <= 3, "%s", resp);
	}
	free(resp);
	snprintf(want, sizeof(want), "\nhyb_completion_tokens_total %d\n", n_gen);
	CHECK_EQ_INT(http(s.port, "GET", "/metrics", "Authorization: Bearer s3cret\r\n", NULL,
			  &resp), 200);
	CHECK_MSG(strstr(resp, want) &&
		  strstr(resp, "\nhyb_requests_total{route=\"/v1/completions\",status=\"401\"} 3\n"),
		  "%s", resp);
	free(resp);
	CHECK_EQ_INT(srv_stop(&s, 30), 0);
}

TEST(serve_request_timeout)
{
	struct srv s;
	char *resp;

	srv_start(&s, syn_model(), "--timeout 0.3");
	CHECK_EQ_INT(http(s.port, "POST", "/v1/completions", NULL, long_plain, &resp), 504);
	check_error_body(resp, "timed out");
	free(resp);
	CHECK_EQ_INT(metric(s.port, "hyb_requests_cancelled_total{reason=\"timeout\"}"), 1);
	CHECK_EQ_INT(metric(s.port, "hyb_requests_in_flight"), 0);
	CHECK_EQ_INT(srv_stop(&s, 30), 0);
}

TEST(serve_sigterm_finishes_or_cancels)
{
	struct srv s;
	char *got;
	int fd;
	double t0;

	/* with time to finish, the running stream ends normally; new clients are refused */
	srv_start(&s, syn_model(), "--grace 60");
	fd = request(s.port, "POST", "/v1/completions", NULL,
		     "{\"prompt\": \"hello there\", \"max_tokens\": 1500, \"temperature\": 0, "
		     "\"stream\": true}");
	free(read_until(fd, "data: {"));
	kill(s.pid, SIGTERM);
	usleep(300000);
	CHECK_MSG(conn_open(s.port) < 0, "a new connection after SIGTERM");
	got = read_all(fd);
	CHECK_MSG(strstr(got, "\"finish_reason\":\"length\"") && strstr(got, "data: [DONE]"),
		  "%s", got + (strlen(got) > 500 ? strlen(got) - 500 : 0));
	free(got);
	CHECK_EQ_INT(srv_stop(&s, 30), 0);

	/* with none, it is cancelled at once with an error event, and the server exits 0 */
	srv_start(&s, syn_model(), "--grace 0");
	fd = request(s.port, "POST", "/v1/completions", NULL, long_stream);
	free(read_until(fd, "data: {"));
	t0 = mono();
	kill(s.pid, SIGTERM);
	got = read_all(fd);
	CHECK_MSG(strstr(got, "shutting down") && !strstr(got, "[DONE]"), "%s",
		  got + (strlen(got) > 500 ? strlen(got) - 500 : 0));
	free(got);
	CHECK_EQ_INT(srv_stop(&s, 10), 0);
	CHECK_MSG(mono() - t0 < 5, "SIGTERM took %.1f s", mono() - t0);

	/* a second signal ends the grace period */
	srv_start(&s, syn_model(), "--grace 60");
	fd = request(s.port, "POST", "/v1/completions", NULL, long_stream);
	free(read_until(fd, "data: {"));
	t0 = mono();
	kill(s.pid, SIGTERM);
	usleep(200000);
	kill(s.pid, SIGINT);
	got = read_all(fd);
	CHECK_MSG(strstr(got, "shutting down") && !strstr(got, "[DONE]"), "%s",
		  got + (strlen(got) > 500 ? strlen(got) - 500 : 0));
	free(got);
	CHECK_EQ_INT(srv_stop(&s, 10), 0);
	CHECK_MSG(mono() - t0 < 5, "SIGTERM + SIGINT took %.1f s", mono() - t0);
}

/*
 * Box mode's refusals on the host (the VM bench serves from a real hybd:
 * tests/vm/hybbox.c serve): no hybd under that name, and two models.
 */
TEST(serve_manifest_errors)
{
	char log[600], glog[600];

	if (access(HYB, X_OK))
		SKIP(HYB " is not built (make all builds it)");
	snprintf(log, sizeof(log), "%s/m.log", hyb_test_tmpdir());
	snprintf(glog, sizeof(glog), "%s/g.log", hyb_test_tmpdir());
	CHECK_EQ_INT(hyb_test_sh(log, HYB " serve --manifest %s/none.manifest --port 0",
				 hyb_test_tmpdir()), 1);
	CHECK(!hyb_test_sh(glog, "grep -q 'none.manifest' %s", log));
	CHECK_EQ_INT(hyb_test_sh(log, HYB " serve -m %s --manifest x --port 0", syn_model()), 1);
	CHECK(!hyb_test_sh(glog, "grep -q 'one model' %s", log));
}

/* One completion of body: 200, and its text as a client sees it (malloc'd). */
static char *completion_seen(int port, const char *body)
{
	char *resp, *text, *seen;
	size_t len;

	CHECK_EQ_INT(http(port, "POST", "/v1/completions", NULL, body, &resp), 200);
	text = completion_text(resp, &len);
	seen = as_seen(text, len);
	free(text);
	free(resp);
	return seen;
}

/* The synthetic model's TEAL profile (hybctl profile --teal) into prof. */
static void syn_teal_profile(const char *model, char *prof, size_t n)
{
	char log[600];

	snprintf(prof, n, "%s/syn.teal.gguf", hyb_test_tmpdir());
	snprintf(log, sizeof(log), "%s/teal.log", hyb_test_tmpdir());
	CHECK_EQ_INT(hyb_test_sh(log, "%s profile %s --teal --gen 16 -t 1 -o %s",
				 hyb_test_hybctl(), model, prof), 0);
}

/*
 * TEAL (docs/SPARSITY.md#teal): the requests batch on one engine, whose
 * decode steps are TEAL's GEMV as `hyb run --teal` runs it, so the same
 * greedy text, alone and with several requests at once.
 */
TEST(serve_teal_greedy)
{
	const char *model = syn_model();
	char prof[600], extra[800], body[256], *want, *text, *seen;
	struct srv s;

	syn_teal_profile(model, prof, sizeof(prof));
	snprintf(extra, sizeof(extra), "--teal %s --sparsity 0.4", prof);
	want = run_text_args(model, "sparse hello", 24, false, extra);
	snprintf(extra, sizeof(extra), "--teal %s --sparsity 0.4 --parallel 2", prof);
	srv_start(&s, model, extra);
	snprintf(body, sizeof(body), "{\"prompt\": \"sparse hello\", \"max_tokens\": 24, "
		 "\"temperature\": 0}");
	seen = completion_seen(s.port, body);
	CHECK_MSG(!strcmp(seen, want), "TEAL serve \"%s\" vs hyb run's \"%s\"", seen, want);
	free(seen);
	at_once(s.port, body, 4, want);
	CHECK_EQ_INT(srv_stop(&s, 30), 0);
	text = slurp(s.log, NULL);
	CHECK(text && strstr(text, "TEAL: one engine batching 2 sequences, their decode steps "
			     "through TEAL's GEMV"));
	free(text);
	free(want);
}

/*
 * --gpu-budget --parallel 2 on a plain model (docs/HYBRID.md "Plain
 * models"): one batched engine, its FFNs on the CPU device, so the CPU's
 * text, alone and with two requests at once.
 */
TEST(serve_hybrid_plain_batches)
{
	const char *model = syn_model();
	char body[256], *want, *text;
	struct srv s;

	want = run_text_args(model, "hello batch", 20, false, "");
	srv_start(&s, model, "--gpu-budget 60% --parallel 2 -c 128");
	snprintf(body, sizeof(body), "{\"prompt\": \"hello batch\", \"max_tokens\": 20, "
		 "\"temperature\": 0}");
	at_once(s.port, body, 2, want);
	CHECK_EQ_INT(srv_stop(&s, 30), 0);
	text = slurp(s.log, NULL);
	CHECK(text && strstr(text, "a plain model: 0 attention blocks") &&
	      strstr(text, "(batched)"));
	free(text);
	free(want);
}

/*
 * --teal with --gpu-budget on a plain model (docs/HYBRID.md "Plain
 * models"): one engine, TEAL on the CPU's share, the text of hyb run with
 * the same options; with --parallel 2 the batches take the thresholds too
 * (another text than without them), a request's text the same alone and
 * beside another.
 */
TEST(serve_teal_hybrid_plain)
{
	const char *model = syn_model();
	char prof[600], extra[800], body[256], *want, *text, *seen;
	struct srv s;

	syn_teal_profile(model, prof, sizeof(prof));
	/* one context size: the placement (KV cache bytes) and so the function follow it */
	snprintf(extra, sizeof(extra), "--teal %s --sparsity 0.4 --gpu-budget 60%% -c 128", prof);
	want = run_text_args(model, "sparse hello", 24, false, extra);
	/* the thresholds are in force: without them the text is another */
	seen = run_text_args(model, "sparse hello", 24, false, "--gpu-budget 60% -c 128");
	CHECK_MSG(strcmp(seen, want), "TEAL changed nothing: \"%s\"", seen);
	free(seen);
	srv_start(&s, model, extra);
	snprintf(body, sizeof(body), "{\"prompt\": \"sparse hello\", \"max_tokens\": 24, "
		 "\"temperature\": 0}");
	seen = completion_seen(s.port, body);
	CHECK_MSG(!strcmp(seen, want), "hybrid TEAL serve \"%s\" vs hyb run's \"%s\"", seen, want);
	free(seen);
	CHECK_EQ_INT(srv_stop(&s, 30), 0);
	text = slurp(s.log, NULL);
	CHECK(text && strstr(text, "a plain model"));
	free(text);
	free(want);
	/* batched: the passes attend on the CPU and the device's FFNs, all thresholded */
	want = run_text_args(model, "sparse hello", 24, false, "");
	strcat(extra, " --parallel 2");
	srv_start(&s, model, extra);
	seen = completion_seen(s.port, body);
	CHECK_MSG(strcmp(seen, want), "batched TEAL changed nothing: \"%s\"", seen);
	at_once(s.port, body, 2, seen);
	free(seen);
	CHECK_EQ_INT(srv_stop(&s, 30), 0);
	text = slurp(s.log, NULL);
	CHECK(text && strstr(text, "(batched)") && strstr(text, "TEAL: one engine batching 2"));
	free(text);
	free(want);
}

/*
 * --gpu-budget: the expert cache of a mixture of experts behind the API (the
 * CPU device, so the CPU's bits: hyb run's text without a device), twice in
 * a row on the one engine; then four at once on three sequences, batched
 * through the cache (moe_hybrid.h), the same text.
 */
TEST(serve_expert_cache_greedy)
{
	char path[600], log[600], body[256], *want, *resp, *text, *seen;
	struct srv s;
	size_t len;

	snprintf(path, sizeof(path), "%s/moe-serve.gguf", hyb_test_tmpdir());
	snprintf(log, sizeof(log), "%s/moe-serve.log", hyb_test_tmpdir());
	CHECK_EQ_INT(hyb_test_sh(log, "%s synth -o %s --arch llama --experts 16 --experts-used 4 "
				 "--ffn 64 --hidden 128 --heads 4 --layers 3 --vocab 512 --type Q8_0 "
				 "-t 1", hyb_test_hybctl(), path), 0);
	want = run_text(path, "experts hello", 16, false);
	srv_start(&s, path, "--gpu-budget 66% --policy lru");
	snprintf(body, sizeof(body), "{\"prompt\": \"experts hello\", \"max_tokens\": 16, "
		 "\"temperature\": 0}");
	for (int i = 0; i < 2; i++) {
		CHECK_EQ_INT(http(s.port, "POST", "/v1/completions", NULL, body, &resp), 200);
		text = completion_text(resp, &len);
		seen = as_seen(text, len);
		CHECK_MSG(!strcmp(seen, want), "request %d: \"%s\" vs hyb run's \"%s\"", i, seen,
			  want);
		free(seen);
		free(text);
		free(resp);
	}
	resp = slurp(s.log, NULL);
	CHECK_MSG(resp && strstr(resp, "hybrid decoding on the cpu device") &&
		  strstr(resp, "expert slots"), "%s", resp ? resp : "(no log)");
	free(resp);
	/* routed experts found in the cache, and those that were not */
	CHECK(metric(s.port, "hyb_gpu_neurons_total{where=\"device\"}") > 0);
	CHECK(metric(s.port, "hyb_gpu_neurons_total{where=\"cpu\"}") > 0);
	CHECK(metric(s.port, "hyb_gpu_cache_loads_total") > 0);
	CHECK_EQ_INT(srv_stop(&s, 30), 0);
	/* several requests at once: batched passes through the cache, the same text */
	srv_start(&s, path, "--gpu-budget 66% --policy lru --parallel 3");
	at_once(s.port, body, 4, want);
	CHECK(metric(s.port, "hyb_steps_total") < 4 * 16); /* batched: fewer passes than tokens */
	CHECK(metric(s.port, "hyb_gpu_neurons_total{where=\"device\"}") > 0);
	CHECK_EQ_INT(srv_stop(&s, 30), 0);
	free(want);
	/* no device KV slots to size: its batches attend on the CPU */
	CHECK(hyb_test_sh(log, HYB " serve -m %s --gpu-budget 66%% --parallel 2 --kv-seqs 1",
			  path) != 0);
	resp = slurp(log, NULL);
	CHECK_MSG(resp && strstr(resp, "a mixture's batches attend on the CPU"), "%s",
		  resp ? resp : "(no log)");
	free(resp);
}

/*
 * --gpu-budget with --parallel: a plan's requests batched through the
 * device, two of four attending there and the rest on the CPU (APEX). Six
 * concurrent requests get the text one request alone got (batch invariance:
 * on the device or the CPU, in whatever batch).
 */
TEST(serve_hybrid_plan_batched)
{
	const char *plan = hyb_test_plan();
	char body[256], *want, *resp, *text;
	struct srv s;
	size_t len;

	srv_start(&s, plan, "--gpu-budget 60% -c 256 --parallel 4 --kv-seqs 2 --policy static");
	snprintf(body, sizeof(body), "{\"prompt\": \"hybrid hello\", \"max_tokens\": 16, "
		 "\"temperature\": 0}");
	CHECK_EQ_INT(http(s.port, "POST", "/v1/completions", NULL, body, &resp), 200);
	text = completion_text(resp, &len);
	want = as_seen(text, len);
	CHECK(len > 0);
	free(text);
	free(resp);
	at_once(s.port, body, 6, want);
	CHECK_EQ_INT(metric(s.port, "hyb_kv_blocks_used"), 0);
	CHECK(metric(s.port, "hyb_steps_total") * 2 < 7 * 16);
	/* the device's side: the cache's hits and the attention rows of each side */
	CHECK(metric(s.port, "hyb_gpu_neurons_total{where=\"device\"}") > 0);
	CHECK(metric(s.port, "hyb_gpu_cache_hit_ratio") > 0);
	CHECK(metric(s.port, "hyb_gpu_cache_hit_ratio") <= 1);
	CHECK(metric(s.port, "hyb_gpu_cache_resident") > 0);
	CHECK(metric(s.port, "hyb_gpu_cache_resident") <= metric(s.port, "hyb_gpu_cache_slots"));
	CHECK(metric(s.port, "hyb_attention_rows_total{where=\"device\"}") > 0);
	CHECK(metric(s.port, "hyb_attention_rows_total{where=\"cpu\"}") > 0);
	resp = slurp(s.log, NULL);
	CHECK_MSG(resp && strstr(resp, "2 of 4 requests attend on the device"), "%s",
		  resp ? resp : "(no log)");
	free(resp);
	CHECK_EQ_INT(srv_stop(&s, 30), 0);
	free(want);
}

/* {"prompt": [ids], "max_tokens": n, ...extra} */
static void ids_body(char *body, size_t cap, const int *ids, int n, int max_tokens,
		     const char *extra)
{
	size_t at = (size_t)snprintf(body, cap, "{\"prompt\": [");

	for (int i = 0; i < n; i++)
		at += (size_t)snprintf(body + at, cap - at, "%s%d", i ? "," : "", ids[i]);
	snprintf(body + at, cap - at, "], \"max_tokens\": %d, \"temperature\": 0%s}", max_tokens,
		 extra);
}

/* A completion of token ids: its text as seen and usage's cached_tokens. */
static char *ids_completion(int port, const int *ids, int n, int *cached)
{
	char body[2048], *resp, *text, *seen;
	size_t len;
	json_error_t je;
	json_t *j;

	ids_body(body, sizeof(body), ids, n, 12, "");
	CHECK_EQ_INT(http(port, "POST", "/v1/completions", NULL, body, &resp), 200);
	j = json_loads(body_of(resp), JSON_ALLOW_NUL, &je);
	CHECK_MSG(j, "not JSON: %.300s", body_of(resp));
	*cached = (int)json_integer_value(json_object_get(json_object_get(
		json_object_get(j, "usage"), "prompt_tokens_details"), "cached_tokens"));
	CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(j, "usage"),
							"prompt_tokens")), n);
	json_decref(j);
	text = completion_text(resp, &len);
	seen = as_seen(text, len);
	free(text);
	free(resp);
	return seen;
}

/*
 * The prefix cache (docs/SERVE.md "Prefix cache"): B shares A's first 50
 * tokens and reuses its three whole 16-token pieces; its text is the one a
 * server without the cache gives, in the batching engine and in a
 * one-sequence one. Usage and /metrics say what was reused. A prompt is
 * kept as soon as it is in: B reuses it while A still decodes beside it.
 */
TEST(serve_prefix_cache)
{
	const char *model = syn_model();
	static const char *const how[] = { "--parallel 2", "--parallel 1" };
	int a[70], b[70], cached;

	for (int i = 0; i < 70; i++) {
		a[i] = (i * 37 + 11) % 500 + 3;
		b[i] = i < 50 ? a[i] : (i * 53 + 7) % 500 + 3;
	}
	for (int k = 0; k < 2; k++) {
		char opts[128], *want, *got;
		struct srv s;

		snprintf(opts, sizeof(opts), "%s --batch 16 -c 256 --no-prefix-cache", how[k]);
		srv_start(&s, model, opts);
		free(ids_completion(s.port, a, 70, &cached));
		want = ids_completion(s.port, b, 70, &cached);
		CHECK_EQ_INT(cached, 0);
		CHECK_EQ_INT(srv_stop(&s, 30), 0);

		snprintf(opts, sizeof(opts), "%s --batch 16 -c 256", how[k]);
		srv_start(&s, model, opts);
		free(ids_completion(s.port, a, 70, &cached));
		CHECK_EQ_INT(cached, 0);
		got = ids_completion(s.port, b, 70, &cached);
		CHECK_EQ_INT(cached, 48);
		CHECK_MSG(!strcmp(want, got), "%s: with the prefix cache '%s', without '%s'",
			  how[k], got, want);
		CHECK(metric(s.port, "hyb_prompt_tokens_cached_total") == 48);
		if (k == 0) { /* the paged cache: kept apart from used blocks, none leaked */
			char body[2048], *first;
			int fd, reused, a2[70];

			CHECK(metric(s.port, "hyb_kv_blocks_kept") > 0);
			CHECK_EQ_INT(metric(s.port, "hyb_kv_blocks_used"), 0);
			/* A2 (another start) streams on; its first token means its prompt is in */
			for (int i = 0; i < 70; i++)
				a2[i] = (i * 41 + 5) % 500 + 3;
			ids_body(body, sizeof(body), a2, 70, 180, ", \"stream\": true");
			fd = request(s.port, "POST", "/v1/completions", NULL, body);
			first = read_until(fd, "data: ");
			free(first);
			memcpy(a2 + 50, b + 50, sizeof(int) * 20);
			free(ids_completion(s.port, a2, 70, &reused));
			CHECK_MSG(reused == 48, "a prompt sharing 50 tokens with one still decoding "
				  "reused %d", reused);
			close(fd);
		}
		CHECK_EQ_INT(srv_stop(&s, 30), 0);
		free(want);
		free(got);
	}
}
