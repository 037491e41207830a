/* SPDX-License-Identifier: MIT */
/*
 * hybd's configuration: defaults, a key = value file (-c FILE) and flags,
 * applied in that order (flags win). The keys are documented in
 * daemon/README.md and by `hybd --help`; every error names the file and line
 * (or the flag) and the key.
 */
#ifndef HYBD_CONFIG_H
#define HYBD_CONFIG_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "hyb/pool.h"
#include "log.h"
#include "numa_place.h"
#include "reload.h"

/*
 * The copy device: cpu (host-memory slots), none, cuda (a GPU: fail when
 * there is none or this build has no CUDA), auto (cuda when it opens, else
 * cpu, saying why).
 */
enum hybd_device { HYBD_DEV_CPU = 0, HYBD_DEV_NONE = 1, HYBD_DEV_CUDA = 2, HYBD_DEV_AUTO = 3 };
enum hybd_progress { HYBD_PROGRESS_AUTO, HYBD_PROGRESS_BAR, HYBD_PROGRESS_LINES,
		     HYBD_PROGRESS_QUIET };

struct hybd_config {
	char model[PATH_MAX];
	enum hyb_backend_kind backend;
	char name[32];
	bool nodes_all;			/* nodes = all: every node with memory */
	struct hyb_numa_place_config place;
	unsigned int queue;
	unsigned int io_depth;		/* queue_depth */
	uint32_t io_chunk;
	uint64_t chunk;			/* reload pre-emption unit */
	enum hybd_device device;
	int cuda_device;		/* CUDA device ordinal (device = cuda|auto) */
	uint32_t gpu_slots;
	uint64_t gpu_cache;		/* bytes of cache; 0: gpu_slots decides, else it sets them */
	uint64_t slot_bytes;
	uint64_t copy_bandwidth;	/* bytes/s, 0 unpaced */
	enum hlog_format log_format;
	enum hlog_level log_level;
	char log_file[PATH_MAX];	/* "" default: stderr, or the state dir when daemonised */
	char state_dir[PATH_MAX];
	char pid_file[PATH_MAX];	/* "" default: <state_dir>/<name>.pid */
	enum hybd_progress progress;
	unsigned int stats_interval;	/* seconds, 0: no periodic statistics */
	struct hyb_reload_clients clients;	/* who may ask for work; n == 0: anyone */
	bool foreground;		/* flag only (-f) */
};

void hybd_config_defaults(struct hybd_config *c);
/* One key = value. 0, or -1 with a message naming the key ("" file/line prefix). */
int hybd_config_set(struct hybd_config *c, const char *key, const char *val, char *err,
		    size_t errlen);
/* A config file: 0, or -1 with "FILE:LINE: ..." (missing file, bad line, unknown key). */
int hybd_config_load(struct hybd_config *c, const char *path, char *err, size_t errlen);
/* After all sources: required keys, cross-checks. 0, or -1 with a message. */
int hybd_config_check(const struct hybd_config *c, char *err, size_t errlen);
/* Effective configuration as a config file (hybd --check). */
void hybd_config_print(const struct hybd_config *c, FILE *f);
/* The keys and what they mean, for --help. */
extern const char hybd_config_help[];

#endif
