/* SPDX-License-Identifier: MIT */
/*
 * The manifest of a loaded model: where every tensor, and
 * for plan files every FFN bundle, lies in the neuron pools, so an app can
 * map the pools and find its weights without reading the GGUF file.
 *
 * docs/BOX.md has the rest: the details.
 */
#ifndef HYB_MANIFEST_H
#define HYB_MANIFEST_H

#include <stddef.h>
#include <stdint.h>

#include "hyb/pool.h"

#define HYB_MF_MAGIC		0x46494e414d425948ULL	/* "HYBMANIF" */
#define HYB_MF_VERSION		2	/* 2: the parts table (1 is read too) */
#define HYB_MF_NO_POOL		UINT32_MAX	/* not resident: loaded on demand */
#define HYB_MF_SPLIT		(UINT32_MAX - 1)	/* rows split across pools: its parts */
#define HYB_MF_MAX_PARTS	8	/* parts of one tensor */
#define HYB_MF_MAX_BYTES	(1ULL << 32)	/* a reader refuses bigger manifests */

enum hyb_mf_state {
	HYB_MF_WRITING = 0,	/* being written: not to be used */
	HYB_MF_READY = 1,	/* complete; the pools hold every resident byte */
	HYB_MF_RETIRED = 2,	/* hybd is shutting down: the pools are about to go */
};

/* hyb_mf_header.flags */
#define HYB_MF_F_PLAN	(1U << 0)	/* a plan file: bundles present (hyb/plan.h) */
#define HYB_MF_F_PAGED	(1U << 1)	/* some tensors are not resident (DRAM budget) */

/* hyb_mf_pool.role */
enum hyb_mf_role {
	HYB_MF_ROLE_WEIGHTS = 1,	/* resident tensors */
	HYB_MF_ROLE_PAGE = 2,		/* room for on-demand loads (HYB_RQ_LOAD) */
};

struct hyb_mf_header {
	uint64_t magic;
	uint32_t version;
	uint32_t header_size;
	uint32_t state;			/* enum hyb_mf_state; stored last (release) */
	uint32_t flags;			/* HYB_MF_F_* */
	uint64_t total_size;
	uint64_t checksum;		/* FNV-1a 64 of [header_size, total_size) */
	uint64_t created_ns;		/* CLOCK_REALTIME when published */
	int32_t pid;			/* the hybd (or embedded process) that wrote it */
	uint32_t backend;		/* enum hyb_backend_kind of the pools */
	uint32_t n_pools, pool_entry_size;
	uint32_t n_tensors, tensor_entry_size;
	uint32_t n_bundles, bundle_entry_size;
	uint32_t n_layers;		/* blocks of the model (blk.N.*) */
	uint32_t group_size;		/* plan: neurons per bundle; 0 otherwise */
	uint64_t pools_off, tensors_off, bundles_off;
	uint64_t strings_off, strings_len;
	uint64_t meta_off, meta_len;
	uint64_t model_size;		/* bytes of the model file */
	uint64_t model_mtime_ns;	/* its modification time */
	uint32_t model_path;		/* string: the model file */
	uint32_t placement;		/* string: the policy, e.g. "layer nodes=0,1" */
	uint32_t name;			/* string: the instance name (pool prefix) */
	uint32_t alignment;		/* GGUF alignment of the tensor data */
	uint32_t n_parts, part_entry_size;	/* version 2 (0 in version 1) */
	uint64_t parts_off;
	uint64_t reserved[4];		/* 0 */
};

struct hyb_mf_pool {
	uint32_t id;			/* backend pool id when published */
	int32_t node;
	uint32_t role;			/* enum hyb_mf_role */
	uint32_t reserved;
	uint64_t bytes;			/* pool size */
	uint64_t used;			/* bytes holding tensors (page pools: 0) */
	char name[32];			/* NUL-terminated pool name */
};

struct hyb_mf_tensor {
	uint32_t name;			/* string */
	uint32_t type;			/* enum hyb_type (ggml type id) */
	uint32_t n_dims;
	int32_t layer;			/* N of "blk.N.", else -1 */
	uint64_t ne[4];			/* unused dims are 1 */
	uint32_t pool;			/* index into the pool table, or HYB_MF_NO_POOL */
	int32_t node;			/* node it is (or would be) placed on */
	uint64_t pool_off;		/* offset in that pool (aligned like the file) */
	uint64_t bytes;
	uint64_t file_off;		/* absolute offset in the model file */
};

/*
 * One node's share of a tensor whose rows are split across nodes (an
 * expert tensor, docs/NUMA.md): rows [row0, row0 + rows) of each of its
 * ne[2] matrices (experts), expert e's at pool_off + e * stride. The
 * tensor's entry says pool HYB_MF_SPLIT; its parts cover rows [0, ne[1])
 * in order, one pool each.
 */
struct hyb_mf_part {
	uint32_t tensor;		/* string: the tensor's name */
	uint32_t pool;			/* index into the pool table (a weight pool) */
	int32_t node;
	uint32_t reserved;		/* 0 */
	uint64_t row0, rows;
	uint64_t pool_off;
	uint64_t stride;		/* >= rows * row bytes */
};

struct hyb_mf_bundle {
	uint32_t layer;
	uint32_t group;
	uint32_t n_neurons;		/* GS, fewer in a layer's last group */
	uint32_t pool;			/* index, or HYB_MF_NO_POOL */
	uint64_t pool_off;
	uint64_t bytes;			/* 3 * n_neurons rows: gate | up | down^T */
	uint64_t file_off;
};

/* -- reading ------------------------------------------------------------- */

struct hyb_manifest;

/* A tensor as the reader hands it out (name points into the manifest). */
struct hyb_manifest_tensor {
	const char *name;
	uint32_t type;
	uint32_t n_dims;
	uint64_t ne[4];
	int32_t layer;
	int32_t node;
	uint32_t pool;			/* index, HYB_MF_NO_POOL (load on demand) or HYB_MF_SPLIT */
	uint32_t pool_id;		/* backend id of that pool, 0 when not resident or split */
	uint64_t pool_off;
	uint64_t bytes;
	uint64_t file_off;
	/* HYB_MF_SPLIT: its parts by row0, covering [0, ne[1]) (checked); else 0, NULL */
	uint32_t n_parts;
	const struct hyb_mf_part *parts;
};

struct hyb_manifest_info {
	uint32_t version;
	uint32_t state;			/* as read */
	uint32_t flags;
	uint32_t n_pools, n_tensors, n_bundles, n_layers, group_size, alignment;
	uint32_t n_parts;		/* parts of split tensors, all together */
	enum hyb_backend_kind backend;
	int32_t pid;
	int pid_alive;			/* 1: that process exists now (0: a stale manifest) */
	uint64_t created_ns;
	uint64_t total_size;
	uint64_t model_size, model_mtime_ns;
	uint64_t resident_bytes;	/* bytes of resident tensors */
	uint64_t paged_bytes;		/* bytes of tensors loaded on demand */
	const char *model_path;
	const char *placement;
	const char *name;
	const void *meta;		/* GGUF header bytes of the model */
	uint64_t meta_len;
};

/*
 * Open a manifest file, or the manifest pool `pool_name` of backend b (read
 * only; the pool must be READY). The bytes are copied and checked (magic,
 * version, sizes, every offset and string in bounds, checksum) before
 * anything is handed out. NULL with a one-line reason in hyb_last_error().
 */
struct hyb_manifest *hyb_manifest_open(const char *path);
struct hyb_manifest *hyb_manifest_open_pool(struct hyb_backend *b, const char *pool_name);
/* The same from bytes in memory (copied). */
struct hyb_manifest *hyb_manifest_parse(const void *buf, size_t len);
void hyb_manifest_close(struct hyb_manifest *m);

void hyb_manifest_info(const struct hyb_manifest *m, struct hyb_manifest_info *out);
/* NULL when the model has no tensor of that name. */
const struct hyb_manifest_tensor *hyb_manifest_find(const struct hyb_manifest *m,
						    const char *name);
/* Tensor i (0 .. n_tensors-1, sorted by name), NULL past the end. */
const struct hyb_manifest_tensor *hyb_manifest_tensor(const struct hyb_manifest *m, uint32_t i);
const struct hyb_mf_pool *hyb_manifest_pool(const struct hyb_manifest *m, uint32_t i);
/* Bundle (layer, group) of a plan model, NULL when there is none. */
const struct hyb_mf_bundle *hyb_manifest_bundle(const struct hyb_manifest *m, uint32_t layer,
						uint32_t group);
/* Bundle i in (layer, group) order. */
const struct hyb_mf_bundle *hyb_manifest_bundle_at(const struct hyb_manifest *m, uint32_t i);
/*
 * For a manifest opened from a pool: 1 while that pool still says READY,
 * 0 once hybd retired it (shutting down) or the pool is gone. Files: 1 while
 * the writing process lives.
 */
int hyb_manifest_live(const struct hyb_manifest *m);

/* FNV-1a 64 (the manifest checksum). */
uint64_t hyb_mf_checksum(const void *buf, size_t len);
/*
 * Where hybd keeps its manifest file, pid file and statistics by default:
 * $HYB_STATE_DIR, else /run/hybd for root, else $XDG_RUNTIME_DIR/hybd, else
 * /tmp/hybd-UID.
 */
void hyb_state_dir(char *buf, size_t len);

#endif
