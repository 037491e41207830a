// SPDX-License-Identifier: MIT
/*
 * hyb serve's HTTP side on libmicrohttpd (docs/SERVE.md): a thread per
 * connection, so a reply may block while its job decodes; routing, the
 * bearer-token check before anything runs, request bodies with a size and
 * time limit, and the small GET endpoints (models, health, metrics).
 */
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "hyb/clock.h"
#include "serve.h"

enum route { R_NONE, R_COMPLETIONS, R_CHAT, R_MODELS, R_HEALTH, R_METRICS };

static const struct {
	const char *path;
	enum route route;
	bool post;
} routes[] = {
	{ "/v1/completions", R_COMPLETIONS, true },
	{ "/completions", R_COMPLETIONS, true },
	{ "/v1/chat/completions", R_CHAT, true },
	{ "/chat/completions", R_CHAT, true },
	{ "/v1/models", R_MODELS, false },
	{ "/models", R_MODELS, false },
	{ "/health", R_HEALTH, false },
	{ "/v1/health", R_HEALTH, false },
	{ "/metrics", R_METRICS, false },
};

/* The metrics' name for a route (static strings: serve_metrics keeps the pointer). */
static const char *route_name(enum route r)
{
	static const char *const names[] = { "other", "/v1/completions", "/v1/chat/completions",
					     "/v1/models", "/health", "/metrics" };
	return names[r];
}

/* One request on a connection (MHD's con_cls). */
struct req {
	enum route route;
	bool post;
	bool replied;       /* an early reply (error) is queued: the rest of the body is dropped */
	struct sbuf body;
	double t_start;
};

int serve_http_reply(struct serve *sv, struct MHD_Connection *conn, const char *route,
		     struct serve_out *out)
{
	struct MHD_Response *resp;
	enum MHD_Result ok;

	resp = MHD_create_response_from_buffer(out->len, out->body, MHD_RESPMEM_MUST_FREE);
	if (!resp) {
		free(out->body);
		return MHD_NO;
	}
	MHD_add_response_header(resp, "Content-Type", out->type);
	if (out->retry_after)
		MHD_add_response_header(resp, "Retry-After", out->retry_after);
	if (out->status == 401)
		MHD_add_response_header(resp, "WWW-Authenticate", "Bearer");
	ok = MHD_queue_response(conn, (unsigned int)out->status, resp);
	MHD_destroy_response(resp);
	serve_metrics_request(&sv->mt, route, out->status);
	return ok;
}

int serve_http_error(struct serve *sv, struct MHD_Connection *conn, const char *route,
		     const struct serve_err *e)
{
	static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\"}}";
	struct serve_out out = { e->status, "application/json", serve_json_error(e), 0, NULL };

	fprintf(stderr, "hyb serve: %s %d: %s\n", route, e->status, e->message);
	if (!out.body) {
		out.status = 500;
		out.body = strdup(oom);
		if (!out.body)
			return MHD_NO;
	}
	out.len = strlen(out.body);
	/* a busy or stopping server: the client may come back (the queue drains in seconds) */
	if (e->status == 503)
		out.retry_after = "1";
	return serve_http_reply(sv, conn, route, &out);
}

static int error_reply(struct serve *sv, struct MHD_Connection *conn, struct req *r, int status,
		       const char *type, const char *fmt, const char *arg)
{
	struct serve_err e;

	serve_err_set(&e, status, type, NULL, NULL, fmt, arg);
	r->replied = true;
	return serve_http_error(sv, conn, route_name(r->route), &e);
}

static int too_big(struct serve *sv, struct MHD_Connection *conn, struct req *r)
{
	char lim[32];

	snprintf(lim, sizeof(lim), "%zu", sv->o.max_body);
	return error_reply(sv, conn, r, 413, "invalid_request_error",
			   "the body is larger than %s bytes (--max-body)", lim);
}

bool serve_http_peer_gone(struct MHD_Connection *conn)
{
	const union MHD_ConnectionInfo *ci =
		MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
	char c;
	ssize_t n;

	if (!ci)
		return true;
	/* end of stream or a reset: the client closed its side */
	n = recv(ci->connect_fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
	return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* Authorization: Bearer KEY, compared in constant time. */
static bool authorized(struct serve *sv, struct MHD_Connection *conn)
{
	const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
						    MHD_HTTP_HEADER_AUTHORIZATION);
	size_t kl = strlen(sv->api_key), hl;
	unsigned char diff = 0;

	if (!h || strncasecmp(h, "Bearer ", 7))
		return false;
	h += 7;
	hl = strlen(h);
	for (size_t i = 0; i < kl; i++)
		diff |= (unsigned char)sv->api_key[i] ^ (unsigned char)(i < hl ? h[i] : 0);
	return !diff && hl == kl;
}

static int get_reply(struct serve *sv, struct MHD_Connection *conn, struct req *r)
{
	struct serve_out out = { 200, "application/json", NULL, 0, NULL };
	struct sbuf b = { 0 };

	switch (r->route) {
	case R_MODELS:
		out.body = serve_json_models(sv->model_id, sv->created, serve_queue_n_ctx(&sv->q));
		break;
	case R_HEALTH:
		if (atomic_load(&sv->stopping)) {
			out.status = 503;
			out.body = strdup("{\"status\":\"shutting down\"}");
		} else {
			out.body = strdup("{\"status\":\"ok\"}");
		}
		break;
	default:
		serve_metrics_render(&sv->mt, &sv->q, &b);
		if (b.oom) {
			sb_free(&b);
			break;
		}
		out.type = "text/plain; version=0.0.4";
		out.body = b.s ? b.s : strdup("");
		break;
	}
	if (!out.body)
		return error_reply(sv, conn, r, 500, "server_error", "%s", "out of memory");
	out.len = strlen(out.body);
	return serve_http_reply(sv, conn, route_name(r->route), &out);
}

/* The first call for a request: its headers are in, no body yet. */
static int begin(struct serve *sv, struct MHD_Connection *conn, const char *url,
		 const char *method, struct req *r)
{
	const char *cl;

	for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++)
		if (!strcmp(url, routes[i].path)) {
			r->route = routes[i].route;
			r->post = routes[i].post;
		}
	if (r->route == R_NONE)
		return error_reply(sv, conn, r, 404, "invalid_request_error",
				   "no endpoint '%s' (POST /v1/completions, /v1/chat/completions; "
				   "GET /v1/models, /health, /metrics)", url);
	/* the key before anything else: without it nothing runs and no body is read */
	if (sv->api_key && r->route != R_HEALTH && !authorized(sv, conn))
		return error_reply(sv, conn, r, 401, "authentication_error", "%s",
				   "a valid API key is needed (Authorization: Bearer KEY)");
	if (strcmp(method, r->post ? "POST" : "GET") &&
	    !(!r->post && !strcmp(method, "HEAD")))
		return error_reply(sv, conn, r, 405, "invalid_request_error",
				   "%s: wrong method for this endpoint", method);
	if (!r->post)
		return get_reply(sv, conn, r);
	cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
	if (cl && strtoull(cl, NULL, 10) > sv->o.max_body)
		return too_big(sv, conn, r);
	return MHD_YES;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *conn, const char *url,
			      const char *method, const char *version, const char *upload,
			      size_t *upload_size, void **con_cls)
{
	struct serve *sv = cls;
	struct req *r = *con_cls;

	(void)version;
	if (!r) {
		r = calloc(1, sizeof(*r));
		if (!r)
			return MHD_NO;
		*con_cls = r;
		atomic_fetch_add(&sv->active, 1);
		r->t_start = hyb_now();
		return (enum MHD_Result)begin(sv, conn, url, method, r);
	}
	if (r->replied) {
		*upload_size = 0;
		return MHD_YES;
	}
	if (*upload_size) {
		/* a body that trickles in (a slow-loris client) has a deadline of its own */
		if (hyb_now() - r->t_start > sv->o.idle_timeout_s)
			return (enum MHD_Result)error_reply(sv, conn, r, 408, "invalid_request_error",
							    "%s", "the body took too long to arrive");
		if (r->body.len + *upload_size > sv->o.max_body) {
			sb_free(&r->body);
			return (enum MHD_Result)too_big(sv, conn, r);
		}
		sb_add(&r->body, upload, *upload_size);
		*upload_size = 0;
		if (r->body.oom)
			return (enum MHD_Result)error_reply(sv, conn, r, 500, "server_error", "%s",
							    "out of memory for the body");
		return MHD_YES;
	}
	r->replied = true;
	return (enum MHD_Result)serve_api_generate(sv, conn, r->route == R_CHAT,
						   r->body.s ? r->body.s : "", r->body.len,
						   r->t_start);
}

static void completed(void *cls, struct MHD_Connection *conn, void **con_cls,
		      enum MHD_RequestTerminationCode why)
{
	struct serve *sv = cls;
	struct req *r = *con_cls;

	(void)conn;
	(void)why;
	if (!r)
		return;
	sb_free(&r->body);
	free(r);
	*con_cls = NULL;
	atomic_fetch_sub(&sv->active, 1);
}

static void logger(void *cls, const char *fmt, va_list ap)
{
	(void)cls;
	fputs("hyb serve: http: ", stderr);
	vfprintf(stderr, fmt, ap);
}

/* A listening socket on host:port; its fd, or -1 with a message. */
static int listen_on(const char *host, int port, int *bound)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
				  .ai_flags = AI_PASSIVE };
	struct addrinfo *res, *a;
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	char portstr[16];
	int fd = -1, one = 1, rc;

	snprintf(portstr, sizeof(portstr), "%d", port);
	rc = getaddrinfo(host, portstr, &hints, &res);
	if (rc) {
		fprintf(stderr, "hyb serve: %s: %s\n", host, gai_strerror(rc));
		return -1;
	}
	for (a = res; a; a = a->ai_next) {
		fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
		if (fd < 0)
			continue;
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (!bind(fd, a->ai_addr, a->ai_addrlen) && !listen(fd, 128))
			break;
		close(fd);
		fd = -1;
	}
	if (fd < 0)
		fprintf(stderr, "hyb serve: cannot listen on %s:%d: %s\n", host, port,
			strerror(errno));
	freeaddrinfo(res);
	if (fd >= 0 && !getsockname(fd, (struct sockaddr *)&ss, &sl))
		*bound = ntohs(ss.ss_family == AF_INET6 ?
				       ((struct sockaddr_in6 *)&ss)->sin6_port :
				       ((struct sockaddr_in *)&ss)->sin_port);
	return fd;
}

int serve_http_start(struct serve *sv)
{
	int port = 0, fd = listen_on(sv->o.host, sv->o.port, &port);

	if (fd < 0)
		return -EADDRNOTAVAIL;
	sv->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION |
				 MHD_USE_POLL | MHD_USE_ITC | MHD_USE_ERROR_LOG,
				 0, NULL, NULL, handle, sv,
				 MHD_OPTION_EXTERNAL_LOGGER, logger, NULL,
				 MHD_OPTION_LISTEN_SOCKET, fd,
				 MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)sv->o.idle_timeout_s,
				 MHD_OPTION_CONNECTION_LIMIT, (unsigned int)sv->o.max_conns,
				 MHD_OPTION_PER_IP_CONNECTION_LIMIT,
				 (unsigned int)sv->o.max_conns_per_ip,
				 MHD_OPTION_NOTIFY_COMPLETED, completed, sv,
				 MHD_OPTION_END);
	if (!sv->d) {
		close(fd);
		fprintf(stderr, "hyb serve: libmicrohttpd did not start\n");
		return -EIO;
	}
	return port;
}

void serve_http_quiesce(struct serve *sv)
{
	MHD_socket fd = MHD_quiesce_daemon(sv->d);

	if (fd != MHD_INVALID_SOCKET)
		close(fd);
}

void serve_http_stop(struct serve *sv)
{
	MHD_stop_daemon(sv->d);
	sv->d = NULL;
}
