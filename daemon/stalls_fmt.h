/* SPDX-License-Identifier: MIT */
/*
 * hybd's side of `hybctl stalls`: the reload service's per-class statistics
 * (critical / reload / prefetch: requests, errors, bytes, queue wait and
 * service p50/p99) as hybd publishes them in STATE_DIR/NAME.stats
 * (reload.h: hyb_reload_stats_write, rewritten every second while requests
 * come or finish, removed at shutdown), read back and formatted as text or
 * JSON. Here rather than in tools/hybctl so that tests link it (libhyb.a).
 */
#ifndef HYB_STALLS_FMT_H
#define HYB_STALLS_FMT_H

#include <limits.h>
#include <stdio.h>

#include "reload.h"

enum hyb_stalls_state {
	HYB_STALLS_RUNNING,		/* the file's writer is alive */
	HYB_STALLS_NONE,		/* no file: no hybd with this name and state dir */
	HYB_STALLS_GONE,		/* a file whose writer is dead (killed hybd) */
	HYB_STALLS_BAD,			/* unreadable or not a statistics file */
};

struct hyb_stalls_hybd {
	enum hyb_stalls_state state;
	int pid;			/* the writer (RUNNING, GONE) */
	char path[PATH_MAX];
	char why[PATH_MAX + 160];	/* not RUNNING: the one line that says so */
	struct hyb_reload_stats st;	/* RUNNING, GONE */
};

/* STATE_DIR/NAME.stats; state_dir NULL: hyb_state_dir() (what hybd uses by default). */
void hyb_stalls_path(char *buf, size_t len, const char *state_dir, const char *name);
/* Read path and decide whether its hybd runs (kill(pid, 0)). Always fills out. */
void hyb_stalls_read(const char *path, struct hyb_stalls_hybd *out);
/*
 * Text: a header line and a row per class; prev (the previous screen of the
 * same hybd, may be NULL) and dt (seconds since) add requests per second.
 * Not running: the one line in why.
 */
void hyb_stalls_print_text(FILE *f, const struct hyb_stalls_hybd *h,
			   const struct hyb_stalls_hybd *prev, double dt);
/*
 * JSON: one object, no newline: {"running": true, "pid", "stats_file",
 * "fetched", "backlog", "slices", "classes": [{"class", "requests", "done",
 * "errors", "bytes", "preemptions", "max_slices_waited", "wait", "service",
 * "total"}]} where wait/service/total are {"count", "p50_ns", "p99_ns",
 * "max_ns"}; not running: {"running": false, "stats_file", "reason"}.
 */
void hyb_stalls_print_json(FILE *f, const struct hyb_stalls_hybd *h);

#endif
