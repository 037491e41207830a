// SPDX-License-Identifier: MIT
/* Building and publishing a model manifest (see manifest_write.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "manifest_write.h"

struct ntensor {
	struct hyb_mf_tensor t;
	char *name;
};

struct npart {
	struct hyb_mf_part p;
	char *name;
	uint32_t ti;	/* its tensor's index once sorted */
};

struct hyb_mf_builder {
	struct hyb_mf_model model;
	char *path, *name, *placement;
	struct hyb_mf_pool *pools;
	uint32_t n_pools;
	struct ntensor *tensors;
	uint32_t n_tensors;
	struct hyb_mf_bundle *bundles;
	uint32_t n_bundles;
	struct npart *parts;
	uint32_t n_parts;
	bool oom;
};

static char *dup_or_empty(const char *s)
{
	return strdup(s ? s : "");
}

struct hyb_mf_builder *hyb_mf_builder_new(const struct hyb_mf_model *model)
{
	struct hyb_mf_builder *b = calloc(1, sizeof(*b));

	if (!b)
		return NULL;
	b->model = *model;
	b->path = dup_or_empty(model->path);
	b->name = dup_or_empty(model->name);
	b->placement = dup_or_empty(model->placement);
	if (!b->path || !b->name || !b->placement) {
		hyb_mf_builder_free(b);
		return NULL;
	}
	return b;
}

void hyb_mf_builder_free(struct hyb_mf_builder *b)
{
	if (!b)
		return;
	for (uint32_t i = 0; i < b->n_tensors; i++)
		free(b->tensors[i].name);
	free(b->tensors);
	for (uint32_t i = 0; i < b->n_parts; i++)
		free(b->parts[i].name);
	free(b->parts);
	free(b->pools);
	free(b->bundles);
	free(b->path);
	free(b->name);
	free(b->placement);
	free(b);
}

/* Grow an array by one element when its count is a power of two (or 0). */
static void *grow(void *arr, uint32_t n, size_t size)
{
	void *p;

	if (n && (n & (n - 1)))
		return arr;
	p = realloc(arr, (n ? 2 * (size_t)n : 16) * size);
	return p;
}

int hyb_mf_add_pool(struct hyb_mf_builder *b, const struct hyb_mf_pool *p)
{
	struct hyb_mf_pool *np = grow(b->pools, b->n_pools, sizeof(*np));

	if (!np) {
		b->oom = true;
		return -1;
	}
	b->pools = np;
	np[b->n_pools] = *p;
	return (int)b->n_pools++;
}

int hyb_mf_add_tensor(struct hyb_mf_builder *b, const char *name, const struct hyb_mf_tensor *t)
{
	struct ntensor *nt = grow(b->tensors, b->n_tensors, sizeof(*nt));

	if (!nt) {
		b->oom = true;
		return -1;
	}
	b->tensors = nt;
	nt[b->n_tensors].t = *t;
	nt[b->n_tensors].name = strdup(name);
	if (!nt[b->n_tensors].name) {
		b->oom = true;
		return -1;
	}
	b->n_tensors++;
	return 0;
}

int hyb_mf_add_bundle(struct hyb_mf_builder *b, const struct hyb_mf_bundle *bu)
{
	struct hyb_mf_bundle *nb = grow(b->bundles, b->n_bundles, sizeof(*nb));

	if (!nb) {
		b->oom = true;
		return -1;
	}
	b->bundles = nb;
	nb[b->n_bundles++] = *bu;
	return 0;
}

int hyb_mf_add_part(struct hyb_mf_builder *b, const char *name, const struct hyb_mf_part *p)
{
	struct npart *np = grow(b->parts, b->n_parts, sizeof(*np));

	if (!np) {
		b->oom = true;
		return -1;
	}
	b->parts = np;
	np[b->n_parts].p = *p;
	np[b->n_parts].name = strdup(name);
	if (!np[b->n_parts].name) {
		b->oom = true;
		return -1;
	}
	b->n_parts++;
	return 0;
}

static int cmp_part(const void *a, const void *b)
{
	const struct npart *x = a, *y = b;

	if (x->ti != y->ti)
		return x->ti < y->ti ? -1 : 1;
	return x->p.row0 < y->p.row0 ? -1 : x->p.row0 > y->p.row0;
}

static int find_tensor(const struct hyb_mf_builder *b, const char *name)
{
	uint32_t lo = 0, hi = b->n_tensors;

	while (lo < hi) {
		const uint32_t mid = lo + (hi - lo) / 2;
		const int c = strcmp(b->tensors[mid].name, name);

		if (!c)
			return (int)mid;
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return -1;
}

/*
 * Parts by (tensor, row0): each to a tensor whose pool is HYB_MF_SPLIT,
 * covering its rows [0, ne[1]) in order, and every split tensor has them.
 */
static int check_parts(struct hyb_mf_builder *b, char *err, size_t errlen)
{
	uint32_t i = 0;

	for (uint32_t k = 0; k < b->n_parts; k++) {
		const int t = find_tensor(b, b->parts[k].name);

		if (t < 0 || b->tensors[t].t.pool != HYB_MF_SPLIT) {
			snprintf(err, errlen, "manifest: a part of tensor %s, which is %s",
				 b->parts[k].name, t < 0 ? "not in it" : "not split");
			return -1;
		}
		if (b->parts[k].p.pool >= b->n_pools ||
		    b->pools[b->parts[k].p.pool].role != HYB_MF_ROLE_WEIGHTS) {
			snprintf(err, errlen, "manifest: a part of tensor %s in pool %u, not a weight "
				 "pool", b->parts[k].name, b->parts[k].p.pool);
			return -1;
		}
		b->parts[k].ti = (uint32_t)t;
	}
	if (b->n_parts)
		qsort(b->parts, b->n_parts, sizeof(*b->parts), cmp_part);
	for (uint32_t t = 0; t < b->n_tensors; t++) {
		const struct hyb_mf_tensor *mt = &b->tensors[t].t;
		uint64_t row = 0;
		uint32_t n = 0;

		if (mt->pool != HYB_MF_SPLIT)
			continue;
		for (; i < b->n_parts && b->parts[i].ti == t; i++, n++) {
			if (b->parts[i].p.row0 != row || !b->parts[i].p.rows)
				break;
			row += b->parts[i].p.rows;
		}
		if (row != mt->ne[1] || !n || n > HYB_MF_MAX_PARTS ||
		    (i < b->n_parts && b->parts[i].ti == t)) {
			snprintf(err, errlen, "manifest: the parts of tensor %s do not cover its "
				 "%llu rows in order (%u parts, at most %d)", b->tensors[t].name,
				 (unsigned long long)mt->ne[1], n, HYB_MF_MAX_PARTS);
			return -1;
		}
	}
	return 0;
}

static int cmp_tensor(const void *a, const void *b)
{
	return strcmp(((const struct ntensor *)a)->name, ((const struct ntensor *)b)->name);
}

static int cmp_bundle(const void *a, const void *b)
{
	const struct hyb_mf_bundle *x = a, *y = b;

	if (x->layer != y->layer)
		return x->layer < y->layer ? -1 : 1;
	return x->group < y->group ? -1 : x->group > y->group;
}

static uint64_t align8(uint64_t x)
{
	return (x + 7) & ~7ull;
}

/* Tensors by name, bundles by (layer, group), each once. */
static int sort_unique(struct hyb_mf_builder *b, char *err, size_t errlen)
{
	if (b->n_tensors)
		qsort(b->tensors, b->n_tensors, sizeof(*b->tensors), cmp_tensor);
	if (b->n_bundles)
		qsort(b->bundles, b->n_bundles, sizeof(*b->bundles), cmp_bundle);
	for (uint32_t i = 1; i < b->n_tensors; i++) {
		if (!strcmp(b->tensors[i - 1].name, b->tensors[i].name)) {
			snprintf(err, errlen, "manifest: tensor %s appears twice",
				 b->tensors[i].name);
			return -1;
		}
	}
	for (uint32_t i = 1; i < b->n_bundles; i++) {
		if (!cmp_bundle(&b->bundles[i - 1], &b->bundles[i])) {
			snprintf(err, errlen, "manifest: bundle %u.%u appears twice",
				 b->bundles[i].layer, b->bundles[i].group);
			return -1;
		}
	}
	return 0;
}

/* The header: counts, entry sizes and the sections' offsets; returns the total size. */
static uint64_t layout(const struct hyb_mf_builder *b, uint64_t strings,
		       struct hyb_mf_header *h)
{
	struct timespec ts;
	uint64_t off;

	h->magic = HYB_MF_MAGIC;
	h->version = HYB_MF_VERSION;
	h->header_size = sizeof(*h);
	h->state = HYB_MF_READY;
	h->flags = (b->model.group_size ? HYB_MF_F_PLAN : 0);
	clock_gettime(CLOCK_REALTIME, &ts);
	h->created_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
	h->pid = (int32_t)getpid();
	h->backend = b->model.backend;
	h->n_pools = b->n_pools;
	h->pool_entry_size = sizeof(struct hyb_mf_pool);
	h->n_tensors = b->n_tensors;
	h->tensor_entry_size = sizeof(struct hyb_mf_tensor);
	h->n_bundles = b->n_bundles;
	h->bundle_entry_size = sizeof(struct hyb_mf_bundle);
	h->n_parts = b->n_parts;
	h->part_entry_size = sizeof(struct hyb_mf_part);
	h->n_layers = b->model.n_layers;
	h->group_size = b->model.group_size;
	h->model_size = b->model.size;
	h->model_mtime_ns = b->model.mtime_ns;
	h->alignment = b->model.alignment;
	off = sizeof(*h);
	h->pools_off = off;
	off += (uint64_t)b->n_pools * sizeof(struct hyb_mf_pool);
	h->tensors_off = off;
	off += (uint64_t)b->n_tensors * sizeof(struct hyb_mf_tensor);
	h->bundles_off = off;
	off += (uint64_t)b->n_bundles * sizeof(struct hyb_mf_bundle);
	h->parts_off = off;
	off += (uint64_t)b->n_parts * sizeof(struct hyb_mf_part);
	h->strings_off = off;
	h->strings_len = strings;
	off = align8(off + strings);
	h->meta_off = off;
	h->meta_len = b->model.meta_len;
	off = align8(off + b->model.meta_len);
	h->total_size = off;
	return off;
}

int hyb_mf_build(struct hyb_mf_builder *b, uint8_t **out, size_t *len, char *err,
		 size_t errlen)
{
	struct hyb_mf_header h = { 0 };
	uint64_t strings = 0, off, s;
	uint8_t *buf;

	if (b->oom) {
		snprintf(err, errlen, "manifest: out of memory");
		return -1;
	}
	if (sort_unique(b, err, errlen) || check_parts(b, err, errlen))
		return -1;
	strings = strlen(b->path) + strlen(b->name) + strlen(b->placement) + 3;
	for (uint32_t i = 0; i < b->n_tensors; i++)
		strings += strlen(b->tensors[i].name) + 1;

	off = layout(b, strings, &h);
	if (off > HYB_MF_MAX_BYTES || strings > UINT32_MAX) {
		snprintf(err, errlen, "manifest: %llu bytes is too large", (unsigned long long)off);
		return -1;
	}
	buf = calloc(1, off);
	if (!buf) {
		snprintf(err, errlen, "manifest: out of memory");
		return -1;
	}
	/* strings: header ones first */
	s = 0;
#define PUT_STR(field, str)                                               \
	do {                                                              \
		size_t n_ = strlen(str) + 1;                              \
		memcpy(buf + h.strings_off + s, str, n_);                 \
		field = (uint32_t)s;                                      \
		s += n_;                                                  \
	} while (0)
	PUT_STR(h.model_path, b->path);
	PUT_STR(h.name, b->name);
	PUT_STR(h.placement, b->placement);
	for (uint32_t i = 0, k = 0; i < b->n_tensors; i++) {
		struct hyb_mf_tensor t = b->tensors[i].t;

		PUT_STR(t.name, b->tensors[i].name);
		memcpy(buf + h.tensors_off + (uint64_t)i * sizeof(t), &t, sizeof(t));
		/* its parts name it by the same string */
		for (; k < b->n_parts && b->parts[k].ti == i; k++) {
			struct hyb_mf_part p = b->parts[k].p;

			p.tensor = t.name;
			p.reserved = 0;
			memcpy(buf + h.parts_off + (uint64_t)k * sizeof(p), &p, sizeof(p));
		}
	}
#undef PUT_STR
	if (b->n_pools)
		memcpy(buf + h.pools_off, b->pools, b->n_pools * sizeof(struct hyb_mf_pool));
	if (b->n_bundles)
		memcpy(buf + h.bundles_off, b->bundles,
		       b->n_bundles * sizeof(struct hyb_mf_bundle));
	if (b->model.meta_len)
		memcpy(buf + h.meta_off, b->model.meta, b->model.meta_len);
	h.checksum = hyb_mf_checksum(buf + sizeof(h), off - sizeof(h));
	memcpy(buf, &h, sizeof(h));
	*out = buf;
	*len = off;
	return 0;
}

/* -- publishing ---------------------------------------------------------- */

static int write_file(const char *path, const uint8_t *buf, size_t len, char *err, size_t errlen)
{
	char tmp[PATH_MAX + 32];
	size_t done = 0;
	int fd;

	snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid());
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		snprintf(err, errlen, "manifest file %s: %s", tmp, strerror(errno));
		return -1;
	}
	while (done < len) {
		ssize_t w = write(fd, buf + done, len - done);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			snprintf(err, errlen, "manifest file %s: %s", tmp,
				 w ? strerror(errno) : "short write");
			close(fd);
			unlink(tmp);
			return -1;
		}
		done += (size_t)w;
	}
	/* on disk before it has its name: a crash leaves the old file or none */
	if (fsync(fd) || close(fd) || rename(tmp, path)) {
		snprintf(err, errlen, "manifest file %s: %s", path, strerror(errno));
		unlink(tmp);
		return -1;
	}
	return 0;
}

int hyb_mf_publish(struct hyb_backend *be, const char *pool_name, const char *path,
		   const uint8_t *buf, size_t len, struct hyb_mf_published *out, char *err,
		   size_t errlen)
{
	struct hyb_mf_header *h, hw;
	size_t plen;
	void *addr;

	memset(out, 0, sizeof(*out));
	if (pool_name) {
		if (hyb_mempool_create(be, pool_name, len, HYB_MEMPOOL_NODE_LOCAL, 0,
				       HYB_MEMPOOL_SHARED, &out->pool) ||
		    hyb_mempool_map(out->pool, &addr, &plen)) {
			snprintf(err, errlen, "manifest pool %s: %s", pool_name,
				 hyb_last_error());
			if (out->pool) {
				hyb_mempool_destroy(out->pool);
				hyb_mempool_close(out->pool);
				out->pool = NULL;
			}
			return -1;
		}
		/*
		 * The new pool is zeroed: state WRITING. The body, then the header
		 * still saying WRITING, then READY with release order - a reader
		 * that sees READY (acquire) sees every byte before it.
		 */
		h = addr;
		memcpy((uint8_t *)addr + sizeof(hw), buf + sizeof(hw), len - sizeof(hw));
		memcpy(&hw, buf, sizeof(hw));
		hw.state = HYB_MF_WRITING;
		memcpy(addr, &hw, sizeof(hw));
		__atomic_store_n(&h->state, HYB_MF_READY, __ATOMIC_RELEASE);
	}
	if (path) {
		if (write_file(path, buf, len, err, errlen)) {
			hyb_mf_retire(out);
			return -1;
		}
		snprintf(out->path, sizeof(out->path), "%s", path);
	}
	return 0;
}

void hyb_mf_retire(struct hyb_mf_published *pub)
{
	if (pub->path[0]) {
		unlink(pub->path);
		pub->path[0] = 0;
	}
	if (pub->pool) {
		void *addr;
		size_t len;

		if (!hyb_mempool_map(pub->pool, &addr, &len) && len >= sizeof(struct hyb_mf_header))
			__atomic_store_n(&((struct hyb_mf_header *)addr)->state, HYB_MF_RETIRED,
					 __ATOMIC_RELEASE);
		hyb_mempool_destroy(pub->pool);
		hyb_mempool_close(pub->pool);
		pub->pool = NULL;
	}
}
