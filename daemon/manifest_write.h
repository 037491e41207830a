/* SPDX-License-Identifier: MIT */
/*
 * Writing and publishing a model manifest (format: hyb/manifest.h). The
 * builder collects pools, tensors and bundles in any order and serialises
 * them sorted, with the string table, the GGUF header copy and the checksum.
 * Publishing puts the bytes where apps look (a pool, a file) so that they are
 * complete or absent; retiring takes them back before the pools go.
 */
#ifndef HYB_MANIFEST_WRITE_H
#define HYB_MANIFEST_WRITE_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#include "hyb/manifest.h"

struct hyb_mf_builder;

struct hyb_mf_model {
	const char *path;
	uint64_t size;
	uint64_t mtime_ns;
	uint32_t alignment;
	uint32_t n_layers;
	uint32_t group_size;		/* plan files; 0 otherwise */
	const void *meta;		/* GGUF header bytes [0, data_offset) */
	uint64_t meta_len;
	const char *name;		/* instance name */
	const char *placement;		/* policy description */
	enum hyb_backend_kind backend;
};

struct hyb_mf_builder *hyb_mf_builder_new(const struct hyb_mf_model *model);
void hyb_mf_builder_free(struct hyb_mf_builder *b);
/* Returns the pool's index, or -1 (out of memory). */
int hyb_mf_add_pool(struct hyb_mf_builder *b, const struct hyb_mf_pool *p);
/* t->name is ignored: name is copied into the string table. 0 or -1. */
int hyb_mf_add_tensor(struct hyb_mf_builder *b, const char *name, const struct hyb_mf_tensor *t);
int hyb_mf_add_bundle(struct hyb_mf_builder *b, const struct hyb_mf_bundle *bu);
/*
 * A part of tensor `name` (added with pool HYB_MF_SPLIT, before or after):
 * p->tensor is ignored. 0 or -1 (out of memory); hyb_mf_build checks that a
 * split tensor's parts cover its rows in order and that no other tensor has
 * parts.
 */
int hyb_mf_add_part(struct hyb_mf_builder *b, const char *name, const struct hyb_mf_part *p);
/*
 * Serialise (state READY, checksum set) into a malloc'ed buffer. 0, or -1
 * with a message (duplicate tensor names, out of memory).
 */
int hyb_mf_build(struct hyb_mf_builder *b, uint8_t **out, size_t *len, char *err,
		 size_t errlen);

struct hyb_mf_published {
	struct hyb_mempool *pool;	/* the manifest pool, or NULL */
	char path[PATH_MAX + 64];	/* the manifest file, or "" */
};

/*
 * Publish buf: into a new pool pool_name of backend be (written with state
 * WRITING, the READY state stored last), and into the file path (written to
 * path.tmp.PID, synced, renamed over path). Either may be NULL. On failure
 * nothing stays published. 0, or -1 with a message.
 */
int hyb_mf_publish(struct hyb_backend *be, const char *pool_name, const char *path,
		   const uint8_t *buf, size_t len, struct hyb_mf_published *out, char *err,
		   size_t errlen);
/* Mark the pool RETIRED and destroy it, remove the file. Safe to call twice. */
void hyb_mf_retire(struct hyb_mf_published *pub);

#endif
