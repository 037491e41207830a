/* SPDX-License-Identifier: MIT */
/*
 * Structured log lines for hybd: one event per line,
 * key=value pairs (or one JSON object per line), a UTC timestamp first.
 *
 *   ts=2025-01-02T03:04:05.123456Z level=info event=load_done model=/m.gguf bytes=1234
 *   {"ts":"2025-01-02T03:04:05.123456Z","level":"info","event":"load_done",...}
 *
 * Values that need it are quoted ("a b", with \" \\ \n escapes), so a line
 * always splits into pairs on unquoted spaces. Every line is written with
 * one write(2) (O_APPEND): lines of several threads never interleave.
 *
 * The logger is per process. Until hlog_open() it is off, so library code
 * (the engine runs inside apps too, embedded mode) may log freely.
 *
 *   struct hlog l;
 *   hlog_begin(&l, HLOG_INFO, "load_done");
 *   hlog_str(&l, "model", path);
 *   hlog_u64(&l, "bytes", n);
 *   hlog_end(&l);
 */
#ifndef HYB_LOG_H
#define HYB_LOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum hlog_level { HLOG_DEBUG = 0, HLOG_INFO = 1, HLOG_WARN = 2, HLOG_ERROR = 3, HLOG_OFF = 4 };
enum hlog_format { HLOG_KV = 0, HLOG_JSON = 1 };

#define HLOG_LINE_MAX 4096

struct hlog {
	char buf[HLOG_LINE_MAX];
	size_t len;
	size_t mark;		/* where the field being written started */
	bool on;		/* level passes: fields are formatted */
	bool json;
	bool truncated;
};

/*
 * Send lines of at least `level` to path (appended, created 0640), or to
 * stderr when path is NULL or "-". 0, or -1 with a message.
 */
int hlog_open(const char *path, enum hlog_format fmt, enum hlog_level level, char *err,
	      size_t errlen);
/* Reopen the same file (after log rotation, SIGHUP). */
int hlog_reopen(void);
void hlog_close(void);
bool hlog_enabled(enum hlog_level level);

int hlog_parse_level(const char *s, enum hlog_level *out);
int hlog_parse_format(const char *s, enum hlog_format *out);

void hlog_begin(struct hlog *l, enum hlog_level level, const char *event);
void hlog_str(struct hlog *l, const char *key, const char *val);
void hlog_u64(struct hlog *l, const char *key, uint64_t v);
void hlog_i64(struct hlog *l, const char *key, int64_t v);
void hlog_f64(struct hlog *l, const char *key, double v);
void hlog_end(struct hlog *l);

/*
 * The error convention of hybd's parts: a one-line reason into err, -1 back.
 *   return hyb_errf(err, errlen, "%s:%u: unknown key '%s'", file, line, key);
 */
int hyb_errf(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* One-liner: an event with a msg field. */
void hlog_msg(enum hlog_level level, const char *event, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

#endif
