/* SPDX-License-Identifier: MIT */
/*
 * What a box-mode hybrid app publishes about itself, for `hybctl stalls`
 * (what an embedded run prints per token, live, in box mode): its
 * hybrid decoding statistics (hyb/hybrid.h), cumulative, and lambda of a
 * few layers, rewritten about twice a second while it decodes on hybd's
 * cache (libhyb/hybrid/ffn_hybrid_stats.c) and removed when it lets the cache go.
 *
 * The file is STATE_DIR/NAME.app.PID (NAME: the hybd instance): text, one
 * "key value" pair a line after a "hyb-app-stats 1" line, written aside
 * and renamed, so a reader sees a whole file or none.
 */
#ifndef HYB_APP_STATS_H
#define HYB_APP_STATS_H

#include <stddef.h>
#include <stdint.h>

#include "hyb/hybrid.h"

#define HYB_APP_STATS_LAMBDAS 5

struct hyb_app_stats {
	int32_t pid;
	uint32_t n_layer;
	char policy[24];
	double time;                 /* CLOCK_REALTIME seconds when written */
	struct hyb_hybrid_stats st;
	uint32_t n_lambda;           /* layers sampled (0: the policy has no lambda) */
	uint32_t lambda_layer[HYB_APP_STATS_LAMBDAS];
	double lambda[HYB_APP_STATS_LAMBDAS];
};

/* STATE_DIR/NAME.app.PID (hyb_state_dir()). */
void hyb_app_stats_path(const char *name, int pid, char *buf, size_t len);
/* 0 or a negative errno (hyb_last_error() says why). */
int hyb_app_stats_write(const char *path, const struct hyb_app_stats *s);
/* -ENOENT: no file; -EINVAL: not one of these files (hyb_last_error() says why). */
int hyb_app_stats_read(const char *path, struct hyb_app_stats *s);

#endif
