/* SPDX-License-Identifier: MIT */
/*
 * Loading a model into NUMA-placed pools: read the GGUF
 * metadata, place the tensors (placement.h), create one pool per node (or
 * pools_per_node), stream every resident byte in with the io_uring engine
 * (stream.h), and build the manifest (hyb/manifest.h). Success only when
 * every byte arrived; on any failure or cancellation the pools are destroyed,
 * so a half-loaded model is never published.
 *
 * Pool names: "<name>.n<node>" (with pools_per_node > 1: "<name>.n<node>.<k>")
 * for weights, "<name>.page.n<node>" for on-demand room; the manifest pool of
 * the server is "<name>.manifest". name: 1..22 of [A-Za-z0-9._-].
 */
#ifndef HYB_LOAD_H
#define HYB_LOAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hyb/pool.h"
#include "numa_place.h"

#define HYB_LOAD_NAME_MAX 22

struct hyb_gguf_file;

struct hyb_load_config {
	struct hyb_backend *backend;
	const char *model_path;
	const char *name;
	const struct hyb_numa_place_config *place;
	unsigned int io_depth;		/* reads in flight; 0: 32 */
	uint32_t io_chunk;		/* bytes per read; 0: 1 MiB */
	/* between pieces of <= 256 MiB: true stops the load ("cancelled") */
	bool (*cancelled)(void *arg);
	/* after each piece: bytes done of total, time so far */
	void (*progress)(uint64_t done, uint64_t total, uint64_t ns, void *arg);
	void *arg;
};

struct hyb_loaded {
	struct hyb_gguf_file *gguf;		/* the metadata (a mapping of the file) */
	struct hyb_mempool **pools;	/* placement.pools order */
	unsigned int n_pools;
	struct hyb_numa_placement placement;
	uint8_t *manifest;		/* the serialised manifest (READY) */
	size_t manifest_len;
	uint64_t bytes;			/* streamed */
	uint64_t ns;			/* streaming time */
	unsigned int runs, direct_runs;	/* streaming calls, those with O_DIRECT */
	uint32_t n_layers, group_size;
};

/* 0, or -1 with a one-line message (the loaded state is then empty). */
int hyb_load_model(const struct hyb_load_config *c, struct hyb_loaded *out, char *err,
		   size_t errlen);
/* Destroy the pools, free everything. */
void hyb_loaded_free(struct hyb_loaded *l);
/* Is name a valid instance name (pool prefix)? */
bool hyb_load_name_ok(const char *name);

#endif
