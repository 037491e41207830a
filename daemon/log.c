// SPDX-License-Identifier: MIT
/* Structured log lines (see log.h). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int log_fd = -1;
static bool own_fd;
static enum hlog_format log_fmt;
static enum hlog_level log_level = HLOG_OFF;
static char log_path[4096];

static const char *const level_names[] = { "debug", "info", "warn", "error", "off" };

int hlog_parse_level(const char *s, enum hlog_level *out)
{
	for (int i = 0; i <= HLOG_OFF; i++) {
		if (!strcmp(s, level_names[i])) {
			*out = (enum hlog_level)i;
			return 0;
		}
	}
	return -1;
}

int hlog_parse_format(const char *s, enum hlog_format *out)
{
	if (!strcmp(s, "kv") || !strcmp(s, "logfmt"))
		*out = HLOG_KV;
	else if (!strcmp(s, "json"))
		*out = HLOG_JSON;
	else
		return -1;
	return 0;
}

static int open_path(const char *path)
{
	return open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
}

int hlog_open(const char *path, enum hlog_format fmt, enum hlog_level level, char *err,
	      size_t errlen)
{
	int fd = STDERR_FILENO;
	bool own = false;

	if (path && *path && strcmp(path, "-")) {
		fd = open_path(path);
		if (fd < 0) {
			snprintf(err, errlen, "log file %s: %s", path, strerror(errno));
			return -1;
		}
		own = true;
	}
	pthread_mutex_lock(&lock);
	if (own_fd && log_fd >= 0)
		close(log_fd);
	log_fd = fd;
	own_fd = own;
	log_fmt = fmt;
	log_level = level;
	snprintf(log_path, sizeof(log_path), "%s", own ? path : "");
	pthread_mutex_unlock(&lock);
	return 0;
}

int hlog_reopen(void)
{
	int fd, ret = 0;

	pthread_mutex_lock(&lock);
	if (own_fd && log_path[0]) {
		fd = open_path(log_path);
		if (fd >= 0) {
			close(log_fd);
			log_fd = fd;
		} else {
			ret = -1;	/* keep writing to the old file */
		}
	}
	pthread_mutex_unlock(&lock);
	return ret;
}

void hlog_close(void)
{
	pthread_mutex_lock(&lock);
	if (own_fd && log_fd >= 0)
		close(log_fd);
	log_fd = -1;
	own_fd = false;
	log_level = HLOG_OFF;
	pthread_mutex_unlock(&lock);
}

bool hlog_enabled(enum hlog_level level)
{
	return level >= __atomic_load_n(&log_level, __ATOMIC_RELAXED) && level < HLOG_OFF;
}

/* Room kept for " trunc=1", the closing brace and the newline. */
#define RESERVE 24

static void put(struct hlog *l, const char *s, size_t n)
{
	if (l->truncated)
		return;
	if (l->len + n + RESERVE > sizeof(l->buf)) {
		l->truncated = true;	/* the field being written is dropped whole */
		return;
	}
	memcpy(l->buf + l->len, s, n);
	l->len += n;
}

static void putf(struct hlog *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void putf(struct hlog *l, const char *fmt, ...)
{
	char tmp[64];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
	va_end(ap);
	put(l, tmp, n < 0 ? 0 : (size_t)n < sizeof(tmp) ? (size_t)n : sizeof(tmp) - 1);
}

/* A value, quoted and escaped when it must be (kv) or always (JSON). */
static void put_val(struct hlog *l, const char *v)
{
	bool quote = l->json || !*v;

	for (const char *p = v; *p && !quote; p++)
		quote = *p == ' ' || *p == '"' || *p == '=' || *p == '\\' ||
			(unsigned char)*p < 0x20;
	if (!quote) {
		put(l, v, strlen(v));
		return;
	}
	put(l, "\"", 1);
	for (const unsigned char *p = (const unsigned char *)v; *p; p++) {
		if (*p == '"' || *p == '\\') {
			char e[2] = { '\\', (char)*p };

			put(l, e, 2);
		} else if (*p == '\n') {
			put(l, "\\n", 2);
		} else if (*p == '\t') {
			put(l, "\\t", 2);
		} else if (*p < 0x20) {
			putf(l, "\\u%04x", *p);
		} else {
			put(l, (const char *)p, 1);
		}
	}
	put(l, "\"", 1);
}

static void put_key(struct hlog *l, const char *key)
{
	if (!l->truncated)
		l->mark = l->len;
	if (l->json) {
		put(l, ",\"", 2);
		put(l, key, strlen(key));
		put(l, "\":", 2);
	} else {
		put(l, " ", 1);
		put(l, key, strlen(key));
		put(l, "=", 1);
	}
}

void hlog_begin(struct hlog *l, enum hlog_level level, const char *event)
{
	struct timespec ts;
	struct tm tm;
	char t[96];

	l->len = 0;
	l->truncated = false;
	l->on = hlog_enabled(level);
	if (!l->on)
		return;
	l->json = __atomic_load_n(&log_fmt, __ATOMIC_RELAXED) == HLOG_JSON;
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	snprintf(t, sizeof(t), "%04d-%02d-%02dT%02d:%02d:%02d.%06ldZ", tm.tm_year + 1900,
		 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
		 (long)(ts.tv_nsec / 1000) % 1000000);
	if (l->json) {
		put(l, "{\"ts\":\"", 7);
		put(l, t, strlen(t));
		put(l, "\",\"level\":\"", 11);
		put(l, level_names[level], strlen(level_names[level]));
		put(l, "\"", 1);
	} else {
		put(l, "ts=", 3);
		put(l, t, strlen(t));
		put(l, " level=", 7);
		put(l, level_names[level], strlen(level_names[level]));
	}
	hlog_str(l, "event", event);
}

void hlog_str(struct hlog *l, const char *key, const char *val)
{
	if (!l->on)
		return;
	put_key(l, key);
	put_val(l, val ? val : "");
}

void hlog_u64(struct hlog *l, const char *key, uint64_t v)
{
	if (!l->on)
		return;
	put_key(l, key);
	putf(l, "%" PRIu64, v);
}

void hlog_i64(struct hlog *l, const char *key, int64_t v)
{
	if (!l->on)
		return;
	put_key(l, key);
	putf(l, "%" PRId64, v);
}

void hlog_f64(struct hlog *l, const char *key, double v)
{
	if (!l->on)
		return;
	put_key(l, key);
	if (v != v || v > 1e300 || v < -1e300)
		put(l, "null", 4);	/* JSON has no NaN or infinity */
	else
		putf(l, "%.4g", v);
}

void hlog_end(struct hlog *l)
{
	ssize_t w;

	if (!l->on)
		return;
	if (l->truncated) {
		/* drop the field that did not fit, say so; still one valid line */
		l->len = l->mark;
		l->truncated = false;
		put_key(l, "trunc");
		put(l, "1", 1);
	}
	if (l->json)
		l->buf[l->len++] = '}';
	l->buf[l->len++] = '\n';
	pthread_mutex_lock(&lock);
	if (log_fd >= 0) {
		w = write(log_fd, l->buf, l->len);
		(void)w;	/* nowhere to report a failing log */
	}
	pthread_mutex_unlock(&lock);
}

void hlog_msg(enum hlog_level level, const char *event, const char *fmt, ...)
{
	struct hlog l;
	char msg[1024];
	va_list ap;

	if (!hlog_enabled(level))
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	hlog_begin(&l, level, event);
	hlog_str(&l, "msg", msg);
	hlog_end(&l);
}

int hyb_errf(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return -1;
}
