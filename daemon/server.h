/* SPDX-License-Identifier: MIT */
/*
 * hybd's life, apart from process matters (flags,
 * daemonising, signal set-up: hybd.c), so that tests run the whole daemon as
 * threads of one process on the local backend.
 *
 *   hybd_start  backend, state dir, model into NUMA-placed pools (load.h),
 *               copy device (cuda: pools pinned, the cache's CUDA IPC handle
 *               written to <state_dir>/<name>.gpucache; cpu; none), reload
 *               service (reload.h) and its statistics file
 *               <state_dir>/<name>.stats, and only then the manifest (pool +
 *               file): published means completely loaded.
 *   hybd_serve  wait on a signalfd: SIGTERM/SIGINT end it, SIGHUP reopens the
 *               log file; every second the statistics file when requests came
 *               or finished since, every stats_interval a statistics line per
 *               reload class.
 *   hybd_stop   retire the manifest first (apps stop finding the model), stop
 *               the reload service (chunks in flight drained, waiters failed
 *               with -ESHUTDOWN, later submits -EPIPE), remove the statistics
 *               and GPU cache files, close the device, then destroy the pools.
 *
 * Every step logs one structured line (log.h): start, backend, placement,
 * pool, load_progress, load_done, device, reload_ready, ready, stats,
 * reload_error, shutdown, manifest_retired, reload_stopped, stopped, error.
 */
#ifndef HYBD_SERVER_H
#define HYBD_SERVER_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>

#include "config.h"

struct hybd;

/*
 * Bring the daemon up. cancelled (may be NULL) is polled during the load: a
 * shutdown signal then aborts it. 0, or -1 with a one-line message, having
 * undone everything (no pools, no manifest).
 */
int hybd_start(const struct hybd_config *cfg, bool (*cancelled)(void *arg), void *arg,
	       struct hybd **out, char *err, size_t errlen);
/* Serve until SIGTERM or SIGINT arrives on sigfd; returns that signal. */
int hybd_serve(struct hybd *d, int sigfd);
/* Shut down (see above) and free; why goes to the log. */
void hybd_stop(struct hybd *d, const char *why);
/* Log statistics and rewrite the statistics file now. */
void hybd_stats_tick(struct hybd *d);
/* Where the manifest file is (valid while d is). */
const char *hybd_manifest_path(const struct hybd *d);
struct hyb_backend *hybd_backend(const struct hybd *d);
/* mkdir -p (mode 0755): 0, or -1 with errno. */
int hybd_mkdirs(const char *dir);

#endif
