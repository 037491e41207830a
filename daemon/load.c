// SPDX-License-Identifier: MIT
/* A model into NUMA-placed pools, and its manifest (see load.h). */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "hyb/gguf.h"
#include "hyb/plan.h"
#include "hyb/tensor_type.h"
#include "load.h"
#include "log.h"
#include "manifest_write.h"
#include "hyb/stream.h"

#define PIECE (256ull << 20)	/* cancellation and progress granularity */

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

bool hyb_load_name_ok(const char *name)
{
	size_t n = strlen(name);

	if (!n || n > HYB_LOAD_NAME_MAX)
		return false;
	for (const char *p = name; *p; p++)
		if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
		      (*p >= '0' && *p <= '9') || *p == '.' || *p == '_' || *p == '-'))
			return false;
	return true;
}

void hyb_loaded_free(struct hyb_loaded *l)
{
	for (unsigned int i = 0; i < l->n_pools; i++) {
		if (!l->pools[i])
			continue;
		hyb_mempool_destroy(l->pools[i]);
		hyb_mempool_close(l->pools[i]);
	}
	free(l->pools);
	hyb_numa_placement_free(&l->placement);
	if (l->gguf)
		hyb_gguf_close(l->gguf);
	free(l->manifest);
	memset(l, 0, sizeof(*l));
}

static void pool_name(char *buf, size_t len, const char *name, const struct hyb_numa_placement *pl,
		      unsigned int i)
{
	const struct hyb_numa_place_pool *p = &pl->pools[i];
	bool several = false;

	for (unsigned int j = 0; j < pl->n_pools; j++)
		several |= j != i && pl->pools[j].node == p->node && pl->pools[j].role == p->role;
	if (p->role == HYB_NUMA_PLACE_PAGE)
		snprintf(buf, len, "%s.page.n%d", name, p->node);
	else if (several)
		snprintf(buf, len, "%s.n%d.%u", name, p->node, p->k);
	else
		snprintf(buf, len, "%s.n%d", name, p->node);
}

static int create_pools(const struct hyb_load_config *c, struct hyb_loaded *l, char *err,
			size_t errlen)
{
	const struct hyb_numa_placement *pl = &l->placement;

	l->pools = calloc(pl->n_pools + 1, sizeof(*l->pools));
	if (!l->pools)
		return hyb_errf(err, errlen, "out of memory");
	l->n_pools = pl->n_pools;
	for (unsigned int i = 0; i < pl->n_pools; i++) {
		char name[HYB_MEMPOOL_NAME_LEN + 16];
		void *addr;
		size_t len;
		int ret;

		pool_name(name, sizeof(name), c->name, pl, i);
		if (strlen(name) >= HYB_MEMPOOL_NAME_LEN)
			return hyb_errf(err, errlen, "pool name %s is longer than %d characters", name,
				    HYB_MEMPOOL_NAME_LEN - 1);
		ret = hyb_mempool_create(c->backend, name, pl->pools[i].bytes, pl->pools[i].node, 0,
					 0, &l->pools[i]);
		if (!ret)
			ret = hyb_mempool_map(l->pools[i], &addr, &len);
		if (ret == -EEXIST)
			return hyb_errf(err, errlen, "pool %s exists already: is another hybd serving "
				    "'%s'? (set another name)", name, c->name);
		if (ret)
			return hyb_errf(err, errlen, "cannot create pool %s (%.1f MiB on node %d): %s",
				    name, pl->pools[i].bytes / 1048576.0, pl->pools[i].node,
				    hyb_last_error());
	}
	return 0;
}

/* Every run into its pool, in file order, piece by piece. */
static int stream_runs(const struct hyb_load_config *c, struct hyb_loaded *l, char *err,
		       size_t errlen)
{
	const struct hyb_numa_placement *pl = &l->placement;
	struct hyb_stream_opts o = {
		.depth = c->io_depth,
		.chunk = c->io_chunk,
		.progress = HYB_STREAM_QUIET,
	};
	uint64_t total = 0, done = 0, t0 = now_ns();

	for (unsigned int i = 0; i < pl->n_runs; i++)
		total += pl->runs[i].len;
	for (unsigned int i = 0; i < pl->n_runs; i++) {
		const struct hyb_numa_place_run *r = &pl->runs[i];

		for (uint64_t x = 0; x < r->len; x += PIECE) {
			uint64_t n = r->len - x < PIECE ? r->len - x : PIECE;
			struct hyb_stream_stats st;

			if (c->cancelled && c->cancelled(c->arg))
				return hyb_errf(err, errlen, "load cancelled after %llu of %llu bytes",
					    (unsigned long long)done, (unsigned long long)total);
			if (hyb_stream_to_pool(l->pools[r->pool], r->pool_off + x, c->model_path,
					       r->file_off + x, n, &o, &st))
				return hyb_errf(err, errlen, "%s", hyb_last_error());
			done += n;
			l->runs++;
			l->direct_runs += st.direct;
			if (c->progress)
				c->progress(done, total, now_ns() - t0, c->arg);
		}
	}
	l->bytes = done;
	l->ns = now_ns() - t0;
	return 0;
}

static char *tensor_name(const struct hyb_gguf_tensor *t)
{
	return strndup(t->name.ptr, t->name.len);
}

/* Bundles of a plan file's layer: groups of blk.L.ffn_bundles (hyb/plan.h). */
static int add_bundles(struct hyb_mf_builder *mb, const struct hyb_loaded *l,
		       const struct hyb_gguf_tensor *t, const struct hyb_numa_place_tensor *pt,
		       uint32_t layer)
{
	uint64_t rows = t->ne[1], row_bytes, n_ff, gs = l->group_size;

	if (t->n_dims != 2 || rows % 3 || !rows)
		return -1;
	row_bytes = t->nbytes / rows;
	n_ff = rows / 3;
	for (uint64_t g = 0; g * gs < n_ff; g++) {
		uint64_t ng = n_ff - g * gs < gs ? n_ff - g * gs : gs;
		uint64_t off = 3 * g * gs * row_bytes;
		struct hyb_mf_bundle b = {
			.layer = layer,
			.group = (uint32_t)g,
			.n_neurons = (uint32_t)ng,
			.pool = pt->pool == HYB_NUMA_PLACE_NO_POOL ? HYB_MF_NO_POOL : pt->pool,
			.pool_off = pt->pool == HYB_NUMA_PLACE_NO_POOL ? 0 : pt->pool_off + off,
			.bytes = 3 * ng * row_bytes,
			.file_off = pt->file_off + off,
		};

		if (hyb_mf_add_bundle(mb, &b))
			return -1;
	}
	return 0;
}

static int build_manifest(const struct hyb_load_config *c, struct hyb_loaded *l,
			  const struct hyb_numa_place_tensor *pt, char *err, size_t errlen)
{
	const struct hyb_gguf_file *f = l->gguf;
	struct hyb_mf_model mm = {
		.path = c->model_path,
		.size = f->size,
		.alignment = (uint32_t)f->alignment,
		.n_layers = l->n_layers,
		.group_size = l->group_size,
		.meta = f->base,
		.meta_len = f->data_offset,
		.name = c->name,
		.placement = l->placement.desc,
		.backend = hyb_backend_kind(c->backend),
	};
	struct hyb_mf_builder *mb;
	char abs[PATH_MAX];
	struct stat sb;
	int ret = 0;

	/* apps may run elsewhere: the manifest names the file absolutely */
	if (realpath(c->model_path, abs))
		mm.path = abs;
	if (!stat(c->model_path, &sb))
		mm.mtime_ns = (uint64_t)sb.st_mtim.tv_sec * 1000000000ull +
			      (uint64_t)sb.st_mtim.tv_nsec;
	mb = hyb_mf_builder_new(&mm);
	if (!mb)
		return hyb_errf(err, errlen, "out of memory");
	for (unsigned int i = 0; i < l->n_pools && !ret; i++) {
		struct hyb_mf_pool p = {
			.id = hyb_mempool_id(l->pools[i]),
			.node = l->placement.pools[i].node,
			.role = l->placement.pools[i].role,
			.used = l->placement.pools[i].used,
		};
		struct hyb_mempool_info pi;

		if (!hyb_mempool_info(l->pools[i], &pi)) {
			p.bytes = pi.bytes;
			p.node = pi.node;
			snprintf(p.name, sizeof(p.name), "%s", pi.name);
		}
		ret = hyb_mf_add_pool(mb, &p) < 0;
	}
	for (uint64_t i = 0; i < f->n_tensors && !ret; i++) {
		const struct hyb_gguf_tensor *t = &f->tensors[i];
		struct hyb_mf_tensor mt = {
			.type = t->type,
			.n_dims = t->n_dims,
			.layer = pt[i].layer,
			.pool = pt[i].pool == HYB_NUMA_PLACE_NO_POOL ? HYB_MF_NO_POOL : pt[i].pool,
			.node = pt[i].node,
			.pool_off = pt[i].pool == HYB_NUMA_PLACE_NO_POOL ? 0 : pt[i].pool_off,
			.bytes = t->nbytes,
			.file_off = pt[i].file_off,
		};

		for (int d = 0; d < 4; d++)
			mt.ne[d] = t->ne[d];
		if (pt[i].n_parts) {
			mt.pool = HYB_MF_SPLIT;
			mt.node = -1;
			mt.pool_off = 0;
		}
		ret = hyb_mf_add_tensor(mb, pt[i].name, &mt);
		for (unsigned int k = 0; k < pt[i].n_parts && !ret; k++) {
			const struct hyb_numa_place_part *q = &pt[i].parts[k];
			const struct hyb_mf_part mp = {
				.pool = q->pool, .node = q->node, .row0 = q->row0, .rows = q->rows,
				.pool_off = q->pool_off, .stride = q->stride,
			};

			ret = hyb_mf_add_part(mb, pt[i].name, &mp);
		}
		if (!ret && l->group_size && pt[i].layer >= 0) {
			char want[48];

			snprintf(want, sizeof(want), "blk.%d.ffn_bundles", pt[i].layer);
			if (!strcmp(pt[i].name, want) &&
			    add_bundles(mb, l, t, &pt[i], (uint32_t)pt[i].layer)) {
				hyb_mf_builder_free(mb);
				return hyb_errf(err, errlen, "%s: tensor %s is not a bundle matrix "
					    "[n_embd, 3 * n_ff]", c->model_path, want);
			}
		}
	}
	if (ret) {
		hyb_mf_builder_free(mb);
		return hyb_errf(err, errlen, "out of memory");
	}
	ret = hyb_mf_build(mb, &l->manifest, &l->manifest_len, err, errlen);
	hyb_mf_builder_free(mb);
	return ret;
}

static void free_names(struct hyb_numa_place_tensor *pt, uint64_t n)
{
	for (uint64_t i = 0; i < n; i++)
		free((char *)pt[i].name);
	free(pt);
}

int hyb_load_model(const struct hyb_load_config *c, struct hyb_loaded *out, char *err,
		   size_t errlen)
{
	struct hyb_numa_place_tensor *pt = NULL;
	struct hyb_gguf_file *f;
	char arch[64] = "llama", key[96];
	uint64_t n;

	memset(out, 0, sizeof(*out));
	if (!c->backend || !c->model_path || !c->place || !c->name)
		return hyb_errf(err, errlen, "load: missing backend, model, placement or name");
	if (!hyb_load_name_ok(c->name))
		return hyb_errf(err, errlen, "name '%s' must be 1..%d of [A-Za-z0-9._-]", c->name,
			    HYB_LOAD_NAME_MAX);
	if (hyb_gguf_open(c->model_path, &out->gguf))
		return hyb_errf(err, errlen, "%s", hyb_last_error());
	f = out->gguf;
	n = f->n_tensors;
	if (!n || n > (1u << 24)) {
		hyb_errf(err, errlen, "%s: %llu tensors: nothing to load", c->model_path,
		     (unsigned long long)n);
		goto out_fail;
	}
	hyb_gguf_get_str(f, "general.architecture", arch, sizeof(arch));
	snprintf(key, sizeof(key), "%s.block_count", arch);
	hyb_gguf_get_u32(f, key, &out->n_layers);
	if (hyb_gguf_find(f, HYB_PLAN_KEY_VERSION) &&
	    !hyb_gguf_get_u32(f, HYB_PLAN_KEY_GROUP_SIZE, &out->group_size)) {
		hyb_errf(err, errlen, "%s: plan file without a valid %s", c->model_path,
		     HYB_PLAN_KEY_GROUP_SIZE);
		goto out_fail;
	}
	pt = calloc(n, sizeof(*pt));
	if (!pt) {
		hyb_errf(err, errlen, "out of memory");
		goto out_fail;
	}
	for (uint64_t i = 0; i < n; i++) {
		const struct hyb_gguf_tensor *t = &f->tensors[i];

		pt[i].name = tensor_name(t);
		if (!pt[i].name) {
			hyb_errf(err, errlen, "out of memory");
			goto out_fail;
		}
		pt[i].layer = hyb_numa_place_layer_of(pt[i].name);
		if (pt[i].layer >= 0 && (uint32_t)pt[i].layer >= out->n_layers)
			out->n_layers = (uint32_t)pt[i].layer + 1;
		pt[i].file_off = f->data_offset + t->offset;
		pt[i].bytes = t->nbytes;
		if (t->n_dims == 3) {
			pt[i].ne1 = t->ne[1];
			pt[i].ne2 = t->ne[2];
		}
	}
	if (hyb_numa_place(c->place, pt, (unsigned int)n, out->n_layers, &out->placement, err, errlen) ||
	    create_pools(c, out, err, errlen) || stream_runs(c, out, err, errlen) ||
	    build_manifest(c, out, pt, err, errlen))
		goto out_fail;
	free_names(pt, n);
	return 0;

out_fail:
	if (pt)
		free_names(pt, n);
	hyb_loaded_free(out);
	return -1;
}
