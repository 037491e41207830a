/* SPDX-License-Identifier: MIT */
/*
 * hybd's side of `hybctl stalls`: the reload service's per-class statistics
 * (critical / reload / prefetch: requests, errors, bytes, queue wait and
 * service p50/p99) as hybd publishes them in STATE_DIR/NAME.stats
 * (reload.h: hyb_reload_stats_write, rewritten every second while requests
 * come or finish, removed at shutdown), read back and formatted as text or
 * JSON. Here rather than in tools/hybctl so that tests link it (libhyb.a).
 */
#ifndef HYB_STALLS_H
#define HYB_STALLS_H

#include <stdio.h>

#include <stdint.h>

#include "hyb/pool.h"

/* The reload service's classes (KAIROX 5.1/8): critical, reload, prefetch. */
enum hyb_reload_class {
	HYB_RELOAD_CRITICAL = 0,
	HYB_RELOAD_RELOAD = 1,
	HYB_RELOAD_PREFETCH = 2,
	HYB_RELOAD_CLASSES
};

static inline enum hyb_reload_class hyb_reload_class_of(unsigned int prio)
{
	return prio == HYB_RQ_CRITICAL ? HYB_RELOAD_CRITICAL :
	       prio >= HYB_RQ_LOW ? HYB_RELOAD_PREFETCH : HYB_RELOAD_RELOAD;
}

const char *hyb_reload_class_name(enum hyb_reload_class c);

struct hyb_reload_class_stats {
	uint64_t done;			/* status 0 */
	uint64_t failed;
	uint64_t bytes;			/* moved by successful requests */
	uint64_t preemptions;		/* chunks of other requests run in their middle */
	uint32_t max_slices_waited;
	struct hyb_lat_stat wait;	/* queued -> started */
	struct hyb_lat_stat service;	/* started -> done */
	struct hyb_lat_stat total;	/* queued -> done */
};

struct hyb_reload_stats {
	uint64_t fetched;		/* requests taken from the queue (NOPs included) */
	uint64_t backlog;		/* fetched, not finished */
	uint64_t slices;		/* chunks executed, both lanes */
	struct hyb_reload_class_stats cls[HYB_RELOAD_CLASSES];
};

/*
 * Write statistics as text (one "class=NAME key=value ..." line per class,
 * after a header line) to path, atomically (written aside, renamed).
 */
int hyb_reload_stats_write(const struct hyb_reload_stats *s, const char *path);
/*
 * Read such a file back (hybctl: hybd's per-class view next to the queue's).
 * Percentiles and counts round-trip; sum and p90/p999 are not in the file
 * (0). pid: the writer. 0 or a negative errno (-EINVAL: not such a file).
 */
int hyb_reload_stats_read(const char *path, struct hyb_reload_stats *s, int *pid);

/* Room for a statistics file's path (PATH_MAX on Linux, without needing limits.h's POSIX part). */
#define HYB_STALLS_PATH_LEN 4096

enum hyb_stalls_state {
	HYB_STALLS_RUNNING,		/* the file's writer is alive */
	HYB_STALLS_NONE,		/* no file: no hybd with this name and state dir */
	HYB_STALLS_GONE,		/* a file whose writer is dead (killed hybd) */
	HYB_STALLS_BAD,			/* unreadable or not a statistics file */
};

struct hyb_stalls_hybd {
	enum hyb_stalls_state state;
	int pid;			/* the writer (RUNNING, GONE) */
	char path[HYB_STALLS_PATH_LEN];
	char why[HYB_STALLS_PATH_LEN + 160];	/* not RUNNING: the one line that says so */
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
