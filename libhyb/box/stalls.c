// SPDX-License-Identifier: MIT
/* hybd's reload statistics for `hybctl stalls` (hyb/stalls.h). */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hyb/manifest.h"
#include "hyb/stalls.h"
#include "util/error.h"
#include "util/file.h"

void hyb_stalls_path(char *buf, size_t len, const char *state_dir, const char *name)
{
	char dir[PATH_MAX];

	if (!state_dir) {
		hyb_state_dir(dir, sizeof(dir));
		state_dir = dir;
	}
	snprintf(buf, len, "%s/%s.stats", state_dir, name);
}

void hyb_stalls_read(const char *path, struct hyb_stalls_hybd *out)
{
	int e, rc;

	memset(out, 0, sizeof(*out));
	snprintf(out->path, sizeof(out->path), "%s", path);
	if (access(path, F_OK)) {
		e = errno;
		out->state = HYB_STALLS_NONE;
		if (e == ENOENT)
			snprintf(out->why, sizeof(out->why), "no hybd running (no statistics file "
				 "%s)", path);
		else
			snprintf(out->why, sizeof(out->why), "no hybd statistics: %s: %s", path,
				 strerror(e));
		return;
	}
	rc = hyb_reload_stats_read(path, &out->st, &out->pid);
	if (rc || out->pid <= 0) {
		out->state = HYB_STALLS_BAD;
		snprintf(out->why, sizeof(out->why), "hybd statistics unreadable: %s",
			 rc ? hyb_last_error() : "no writer pid");
		return;
	}
	/* EPERM: alive, another user's */
	if (kill(out->pid, 0) && errno == ESRCH) {
		out->state = HYB_STALLS_GONE;
		snprintf(out->why, sizeof(out->why), "no hybd running (pid %d, which wrote %s, is "
			 "gone)", out->pid, path);
		return;
	}
	out->state = HYB_STALLS_RUNNING;
}

static void fmt_ns(char *buf, size_t len, uint64_t ns)
{
	if (ns >= 1000000000ull)
		snprintf(buf, len, "%.2f s", ns / 1e9);
	else if (ns >= 1000000ull)
		snprintf(buf, len, "%.2f ms", ns / 1e6);
	else
		snprintf(buf, len, "%.1f us", ns / 1e3);
}

static void fmt_bytes(char *buf, size_t len, uint64_t b)
{
	if (b >= (1ull << 30))
		snprintf(buf, len, "%.2f GiB", b / 1073741824.0);
	else if (b >= (1ull << 20))
		snprintf(buf, len, "%.2f MiB", b / 1048576.0);
	else if (b >= (1ull << 10))
		snprintf(buf, len, "%.1f KiB", b / 1024.0);
	else
		snprintf(buf, len, "%llu B", (unsigned long long)b);
}

static void fmt_pair(char *buf, size_t len, const struct hyb_lat_stat *h)
{
	char a[24], b[24];

	if (!h->count) {
		snprintf(buf, len, "-");
		return;
	}
	fmt_ns(a, sizeof(a), h->p50_ns);
	fmt_ns(b, sizeof(b), h->p99_ns);
	snprintf(buf, len, "%s / %s", a, b);
}

static uint64_t requests(const struct hyb_reload_class_stats *c)
{
	return c->done + c->failed;
}

void hyb_stalls_print_text(FILE *f, const struct hyb_stalls_hybd *h,
			   const struct hyb_stalls_hybd *prev, double dt)
{
	bool rates;

	if (h->state != HYB_STALLS_RUNNING) {
		fprintf(f, "%s\n", h->why);
		return;
	}
	rates = prev && prev->state == HYB_STALLS_RUNNING && prev->pid == h->pid && dt > 0;
	fprintf(f, "hybd pid %d reload service: %llu requests fetched, %llu in progress, %llu "
		"chunks (%s)\n", h->pid, (unsigned long long)h->st.fetched,
		(unsigned long long)h->st.backlog, (unsigned long long)h->st.slices, h->path);
	fprintf(f, "%-9s %9s %7s %11s %7s  %-21s %-21s %7s\n", "CLASS", "REQUESTS", "ERRORS",
		"BYTES", rates ? "REQ/S" : "", "WAIT p50 / p99", "SERVICE p50 / p99", "PREEMPT");
	for (int c = 0; c < HYB_RELOAD_CLASSES; c++) {
		const struct hyb_reload_class_stats *s = &h->st.cls[c];
		char by[24], w[64], sv[64], rate[16] = "";

		if (rates && requests(s) >= requests(&prev->st.cls[c]))
			snprintf(rate, sizeof(rate), "%.0f",
				 (requests(s) - requests(&prev->st.cls[c])) / dt);
		fmt_bytes(by, sizeof(by), s->bytes);
		fmt_pair(w, sizeof(w), &s->wait);
		fmt_pair(sv, sizeof(sv), &s->service);
		fprintf(f, "%-9s %9llu %7llu %11s %7s  %-21s %-21s %7llu\n",
			hyb_reload_class_name((enum hyb_reload_class)c),
			(unsigned long long)requests(s), (unsigned long long)s->failed, by, rate, w,
			sv, (unsigned long long)s->preemptions);
	}
}

static void json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;

		if (c == '"' || c == '\\')
			fprintf(f, "\\%c", c);
		else if (c < 0x20)
			fprintf(f, "\\u%04x", c);
		else
			fputc(c, f);
	}
	fputc('"', f);
}

static void json_lat(FILE *f, const char *name, const struct hyb_lat_stat *h)
{
	fprintf(f, "\"%s\": {\"count\": %llu, \"p50_ns\": %llu, \"p99_ns\": %llu, "
		"\"max_ns\": %llu}", name, (unsigned long long)h->count,
		(unsigned long long)h->p50_ns, (unsigned long long)h->p99_ns,
		(unsigned long long)h->max_ns);
}

void hyb_stalls_print_json(FILE *f, const struct hyb_stalls_hybd *h)
{
	if (h->state != HYB_STALLS_RUNNING) {
		fprintf(f, "{\"running\": false, \"stats_file\": ");
		json_str(f, h->path);
		fprintf(f, ", \"reason\": ");
		json_str(f, h->why);
		fputc('}', f);
		return;
	}
	fprintf(f, "{\"running\": true, \"pid\": %d, \"stats_file\": ", h->pid);
	json_str(f, h->path);
	fprintf(f, ", \"fetched\": %llu, \"backlog\": %llu, \"slices\": %llu, \"classes\": [",
		(unsigned long long)h->st.fetched, (unsigned long long)h->st.backlog,
		(unsigned long long)h->st.slices);
	for (int c = 0; c < HYB_RELOAD_CLASSES; c++) {
		const struct hyb_reload_class_stats *s = &h->st.cls[c];

		fprintf(f, "%s{\"class\": \"%s\", \"requests\": %llu, \"done\": %llu, "
			"\"errors\": %llu, \"bytes\": %llu, \"preemptions\": %llu, "
			"\"max_slices_waited\": %u, ", c ? ", " : "",
			hyb_reload_class_name((enum hyb_reload_class)c),
			(unsigned long long)requests(s), (unsigned long long)s->done,
			(unsigned long long)s->failed, (unsigned long long)s->bytes,
			(unsigned long long)s->preemptions, s->max_slices_waited);
		json_lat(f, "wait", &s->wait);
		fprintf(f, ", ");
		json_lat(f, "service", &s->service);
		fprintf(f, ", ");
		json_lat(f, "total", &s->total);
		fputc('}', f);
	}
	fprintf(f, "]}");
}

const char *hyb_reload_class_name(enum hyb_reload_class c)
{
	static const char *const names[] = { "critical", "reload", "prefetch" };

	return c < HYB_RELOAD_CLASSES ? names[c] : "?";
}

/* "key=N" in line, as an unsigned; 0 when absent. */
static uint64_t kv_u64(const char *line, const char *key)
{
	size_t n = strlen(key);

	for (const char *p = line; (p = strstr(p, key)); p += n) {
		if ((p == line || p[-1] == ' ') && p[n] == '=')
			return strtoull(p + n + 1, NULL, 10);
	}
	return 0;
}

static void read_lat(const char *line, const char *name, struct hyb_lat_stat *s)
{
	char k[32];

#define F(field, suffix)                                                    \
	do {                                                                \
		snprintf(k, sizeof(k), "%s_%s", name, suffix);              \
		s->field = kv_u64(line, k);                                 \
	} while (0)
	F(count, "count");
	F(p50_ns, "p50_ns");
	F(p99_ns, "p99_ns");
	F(max_ns, "max_ns");
#undef F
}

int hyb_reload_stats_read(const char *path, struct hyb_reload_stats *s, int *pid)
{
	char line[2048];
	FILE *f = fopen(path, "r");
	int classes = 0;

	memset(s, 0, sizeof(*s));
	if (!f) {
		int e = errno;

		return hyb_error_set(-e, "%s: %s", path, strerror(e));
	}
	if (!fgets(line, sizeof(line), f) || strncmp(line, "hyb_reload_stats=1 ", 19)) {
		fclose(f);
		return hyb_error_set(-EINVAL, "%s: not a reload statistics file (version 1)", path);
	}
	if (pid)
		*pid = (int)kv_u64(line, "pid");
	s->fetched = kv_u64(line, "fetched");
	s->backlog = kv_u64(line, "backlog");
	s->slices = kv_u64(line, "slices");
	while (fgets(line, sizeof(line), f)) {
		struct hyb_reload_class_stats *cs = NULL;

		for (int c = 0; c < HYB_RELOAD_CLASSES; c++) {
			char want[32];

			snprintf(want, sizeof(want), "class=%s ", hyb_reload_class_name(c));
			if (!strncmp(line, want, strlen(want)))
				cs = &s->cls[c];
		}
		if (!cs)
			continue;	/* a later version's line */
		classes++;
		cs->done = kv_u64(line, "done");
		cs->failed = kv_u64(line, "failed");
		cs->bytes = kv_u64(line, "bytes");
		cs->preemptions = kv_u64(line, "preemptions");
		cs->max_slices_waited = (uint32_t)kv_u64(line, "max_slices_waited");
		read_lat(line, "wait", &cs->wait);
		read_lat(line, "service", &cs->service);
		read_lat(line, "total", &cs->total);
	}
	fclose(f);
	if (classes != HYB_RELOAD_CLASSES)
		return hyb_error_set(-EINVAL, "%s: %d of %d classes", path, classes,
				     HYB_RELOAD_CLASSES);
	return 0;
}

static void write_lat(FILE *f, const char *name, const struct hyb_lat_stat *s)
{
	fprintf(f, " %s_count=%llu %s_p50_ns=%llu %s_p99_ns=%llu %s_max_ns=%llu", name,
		(unsigned long long)s->count, name, (unsigned long long)s->p50_ns, name,
		(unsigned long long)s->p99_ns, name, (unsigned long long)s->max_ns);
}

int hyb_reload_stats_write(const struct hyb_reload_stats *s, const char *path)
{
	char tmp[4200];
	FILE *f;

	snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid());
	f = fopen(tmp, "w");
	if (!f) {
		int e = errno;

		return hyb_error_set(-e, "%s: %s", tmp, strerror(e));
	}
	fprintf(f, "hyb_reload_stats=1 pid=%d fetched=%llu backlog=%llu slices=%llu\n",
		(int)getpid(), (unsigned long long)s->fetched, (unsigned long long)s->backlog,
		(unsigned long long)s->slices);
	for (int c = 0; c < HYB_RELOAD_CLASSES; c++) {
		const struct hyb_reload_class_stats *cs = &s->cls[c];

		fprintf(f, "class=%s done=%llu failed=%llu bytes=%llu preemptions=%llu "
			"max_slices_waited=%u", hyb_reload_class_name(c),
			(unsigned long long)cs->done, (unsigned long long)cs->failed,
			(unsigned long long)cs->bytes, (unsigned long long)cs->preemptions,
			cs->max_slices_waited);
		write_lat(f, "wait", &cs->wait);
		write_lat(f, "service", &cs->service);
		write_lat(f, "total", &cs->total);
		fputc('\n', f);
	}
	return hyb_file_commit(tmp, path, fclose(f) ? errno : 0);
}
