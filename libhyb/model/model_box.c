// SPDX-License-Identifier: MIT
/*
 * Box mode's model (hyb_model_load_manifest): the weights are hybd's pools,
 * found through its manifest (hyb/manifest.h), mapped read-only; only the
 * GGUF header is copied. docs/BOX.md.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "hyb/gguf.h"
#include "hyb/manifest.h"
#include "hyb/model.h"
#include "hyb/pool.h"
#include "model_internal.h"
#include "util/error.h"

/*
 * What a box-mode model holds besides struct hyb_model (a layout other code
 * shares, so not extended here): kept in a short list keyed by the model and
 * looked up only by hyb_model_box_check(), hyb_model_manifest() and free.
 */
struct box_pool {
	struct hyb_mempool *p;		/* NULL: not a weight pool */
	const uint8_t *base;		/* read-only mapping */
	size_t len;
};

/* A split tensor's slice (a fused tensor's gate or up): its own parts. */
struct box_slice {
	struct box_slice *next;
	struct hyb_weight_split sp;
};

struct box {
	const struct hyb_model *m;
	struct box *next;
	struct hyb_manifest *mf;
	struct hyb_mempool *mf_pool;	/* our own handle: the live header state */
	const volatile struct hyb_mf_header *hdr;
	struct box_pool *pools;
	uint32_t n_pools;
	int32_t pid;			/* the hybd that published it */
	char mf_name[HYB_MEMPOOL_NAME_LEN];
	/* [n_tensors] rows split across nodes (docs/NUMA.md); n = 0: not split */
	struct hyb_weight_split *splits;
	uint64_t n_splits;
	struct box_slice *slices;
};

static pthread_mutex_t box_lock = PTHREAD_MUTEX_INITIALIZER;
static struct box *boxes;

static int box_fail(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static int box_fail(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return -1;
}

/* The caller holds box_lock. */
static struct box *box_find(const struct hyb_model *m)
{
	for (struct box *bx = boxes; bx; bx = bx->next)
		if (bx->m == m)
			return bx;
	return NULL;
}

static void box_free(struct box *bx)
{
	if (!bx)
		return;
	for (uint32_t i = 0; bx->pools && i < bx->n_pools; i++)
		hyb_mempool_close(bx->pools[i].p);
	free(bx->pools);
	free(bx->splits);
	while (bx->slices) {
		struct box_slice *n = bx->slices->next;

		free(bx->slices);
		bx->slices = n;
	}
	hyb_manifest_close(bx->mf);
	hyb_mempool_close(bx->mf_pool);
	free(bx);
}

void hyb_model_box_release(struct hyb_model *m)
{
	struct box *bx = NULL;

	pthread_mutex_lock(&box_lock);
	for (struct box **pp = &boxes; *pp; pp = &(*pp)->next) {
		if ((*pp)->m == m) {
			bx = *pp;
			*pp = bx->next;
			break;
		}
	}
	pthread_mutex_unlock(&box_lock);
	box_free(bx);
}

/* Which manifest pool, on which backend, src names (see hyb/model.h). */
static int box_source(const char *src, char pool[HYB_MEMPOOL_NAME_LEN],
		      enum hyb_backend_kind *kind, char *err, size_t errlen)
{
	static const char sfx[] = ".manifest";
	size_t n = strlen(src), ns = sizeof(sfx) - 1;

	if (strchr(src, '/')) {
		struct hyb_manifest *f = hyb_manifest_open(src);
		struct hyb_manifest_info mi;

		if (!f)
			return box_fail(err, errlen, "%s", hyb_last_error());
		hyb_manifest_info(f, &mi);
		*kind = mi.backend;
		n = (size_t)snprintf(pool, HYB_MEMPOOL_NAME_LEN, "%s%s", mi.name, sfx);
		hyb_manifest_close(f);
		if (n >= HYB_MEMPOOL_NAME_LEN)
			return box_fail(err, errlen, "%s: instance name too long", src);
		return 0;
	}
	*kind = HYB_BACKEND_AUTO;
	if (!n)
		return box_fail(err, errlen, "empty manifest name");
	if (snprintf(pool, HYB_MEMPOOL_NAME_LEN, "%s%s", src,
		     n > ns && !strcmp(src + n - ns, sfx) ? "" : sfx) >= HYB_MEMPOOL_NAME_LEN)
		return box_fail(err, errlen, "'%s': not a manifest pool or instance name (too long)",
				src);
	return 0;
}

/* The manifest (from its pool), our view of its live state, every weight pool mapped. */
static int box_open(struct box *bx, struct hyb_backend *b, const char *pool, char *err,
		    size_t errlen)
{
	struct hyb_manifest_info mi;
	struct hyb_mempool_info pi;
	size_t len;
	void *addr;

	bx->mf = hyb_manifest_open_pool(b, pool);
	if (!bx->mf)
		return box_fail(err, errlen, "%s", hyb_last_error());
	hyb_manifest_info(bx->mf, &mi);
	bx->pid = mi.pid;
	snprintf(bx->mf_name, sizeof(bx->mf_name), "%s", pool);
	if (hyb_mempool_open(b, pool, &bx->mf_pool) || hyb_mempool_map(bx->mf_pool, &addr, &len))
		return box_fail(err, errlen, "manifest pool '%s': %s", pool, hyb_last_error());
	bx->hdr = addr;
	if (len < sizeof(*bx->hdr) || bx->hdr->created_ns != mi.created_ns ||
	    bx->hdr->pid != mi.pid)
		return box_fail(err, errlen, "manifest pool '%s' was replaced while being read "
				"(hybd restarted?)", pool);
	bx->n_pools = mi.n_pools;
	bx->pools = calloc(mi.n_pools ? mi.n_pools : 1, sizeof(*bx->pools));
	if (!bx->pools)
		return box_fail(err, errlen, "out of memory");
	for (uint32_t i = 0; i < mi.n_pools; i++) {
		const struct hyb_mf_pool *p = hyb_manifest_pool(bx->mf, i);
		struct box_pool *bp = &bx->pools[i];

		if (p->role != HYB_MF_ROLE_WEIGHTS)
			continue;	/* page pools: room for on-demand loads, not mapped here */
		if (hyb_mempool_open_id(b, p->id, &bp->p) || hyb_mempool_info(bp->p, &pi))
			return box_fail(err, errlen, "pool %s (id %u) of %s: %s", p->name, p->id,
					pool, hyb_last_error());
		if (strcmp(pi.name, p->name) || pi.bytes < p->used)
			return box_fail(err, errlen, "pool id %u is '%s' of %llu bytes, %s says "
					"'%s' (hybd restarted?)", p->id, pi.name,
					(unsigned long long)pi.bytes, pool, p->name);
		if (hyb_mempool_map(bp->p, &addr, &bp->len))
			return box_fail(err, errlen, "map pool %s: %s", p->name,
					hyb_last_error());
		bp->base = addr;
	}
	return 0;
}

/*
 * The model's GGUF header from the manifest, parsed in place of the file: a
 * read-only region of the file's size holding the header bytes and zeros
 * after them (never touched: every tensor is pointed into a pool next), so
 * the parser checks offsets against the real file size and a short or bad
 * header copy reads zeros, never unmapped memory.
 */
static int box_header(struct hyb_model *m, const struct hyb_manifest *mf, char *err,
		      size_t errlen)
{
	struct hyb_manifest_info mi;
	uint64_t len, page = (uint64_t)sysconf(_SC_PAGESIZE);
	void *img;

	hyb_manifest_info(mf, &mi);
	if (mi.meta_len < 16 || mi.meta_len > mi.model_size || mi.model_size > (1ULL << 46))
		return box_fail(err, errlen, "bad sizes: GGUF header %llu bytes of a %llu-byte "
				"model", (unsigned long long)mi.meta_len,
				(unsigned long long)mi.model_size);
	len = (mi.model_size + page - 1) & ~(page - 1);
	img = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
		   -1, 0);
	if (img == MAP_FAILED)
		return box_fail(err, errlen, "cannot reserve %llu bytes for the header: %s",
				(unsigned long long)len, strerror(errno));
	memcpy(img, mi.meta, mi.meta_len);
	mprotect(img, len, PROT_READ);
	m->image = img;
	m->image_len = len;
	if (hyb_gguf_parse(img, mi.model_size, &m->gguf))
		return box_fail(err, errlen, "the GGUF header it holds: %s", hyb_last_error());
	return 0;
}

/*
 * A tensor hybd split by rows across nodes (docs/NUMA.md): each part's rows
 * of every expert in its pool, checked against the mapping (the manifest
 * reader checked them against the pool sizes it lists).
 */
static int bind_split(const struct box *bx, const struct hyb_gguf_tensor *t,
		      const struct hyb_manifest_tensor *mt, struct hyb_weight_split *sp,
		      char *err, size_t errlen)
{
	const uint64_t ne1 = t->ne[1], ne2 = t->ne[2];
	uint64_t row_bytes;

	if (t->n_dims != 3 || !ne1 || !ne2 || t->nbytes % (ne1 * ne2) || !mt->n_parts ||
	    mt->n_parts > HYB_WEIGHT_MAX_PARTS)
		return box_fail(err, errlen, "tensor %s: split into %u parts, but it is not a 3-D "
				"tensor of whole rows or has no parts (at most %d)", mt->name,
				mt->n_parts, HYB_WEIGHT_MAX_PARTS);
	row_bytes = t->nbytes / (ne1 * ne2);
	memset(sp, 0, sizeof(*sp));
	sp->n = mt->n_parts;
	for (uint32_t i = 0; i < mt->n_parts; i++) {
		const struct hyb_mf_part *p = &mt->parts[i];
		const struct box_pool *bp = p->pool < bx->n_pools ? &bx->pools[p->pool] : NULL;
		const uint64_t end = p->row0 + p->rows;

		if (p->row0 != sp->row0[i] || !p->rows || end > ne1 ||
		    (i + 1 == mt->n_parts && end != ne1))
			return box_fail(err, errlen, "tensor %s: part %u has rows [%llu, +%llu), not "
					"the next of [0, %llu)", mt->name, i,
					(unsigned long long)p->row0, (unsigned long long)p->rows,
					(unsigned long long)ne1);
		if (!bp || !bp->base)
			return box_fail(err, errlen, "tensor %s: part %u is in pool %u, not a weight "
					"pool", mt->name, i, p->pool);
		/* the last expert's rows end inside the mapping (no overflow: all < 2^46) */
		if (p->stride < p->rows * row_bytes || ne2 > (1ull << 20) ||
		    p->pool_off > bp->len ||
		    (ne2 - 1) * p->stride + p->rows * row_bytes > bp->len - p->pool_off)
			return box_fail(err, errlen, "tensor %s: part %u's %llu experts at %llu, "
					"stride %llu, are past the end of its pool (%zu bytes)",
					mt->name, i, (unsigned long long)ne2,
					(unsigned long long)p->pool_off,
					(unsigned long long)p->stride, bp->len);
		sp->row0[i + 1] = end;
		sp->data[i] = (const char *)bp->base + p->pool_off;
		sp->stride[i] = p->stride;
		sp->node[i] = p->node;
	}
	return 0;
}

/* Every tensor of the header at its bytes in a pool, the manifest entry checked against it. */
static int box_bind(struct hyb_model *m, struct box *bx, char *err, size_t errlen)
{
	struct hyb_gguf_file *f = m->gguf;
	struct hyb_manifest_info mi;

	hyb_manifest_info(bx->mf, &mi);
	if (f->n_tensors != mi.n_tensors)
		return box_fail(err, errlen, "it lists %u tensors, its GGUF header %llu",
				mi.n_tensors, (unsigned long long)f->n_tensors);
	bx->splits = calloc(f->n_tensors ? f->n_tensors : 1, sizeof(*bx->splits));
	if (!bx->splits)
		return box_fail(err, errlen, "out of memory");
	bx->n_splits = f->n_tensors;
	for (uint64_t i = 0; i < f->n_tensors; i++) {
		struct hyb_gguf_tensor *t = &f->tensors[i];
		const struct hyb_manifest_tensor *mt;
		const struct box_pool *bp;
		char name[256];

		if (t->name.len >= sizeof(name))
			return box_fail(err, errlen, "tensor %llu: name too long",
					(unsigned long long)i);
		memcpy(name, t->name.ptr, t->name.len);
		name[t->name.len] = 0;
		mt = hyb_manifest_find(bx->mf, name);
		if (!mt)
			return box_fail(err, errlen, "tensor %s is not in the manifest", name);
		if (mt->type != t->type || mt->n_dims != t->n_dims ||
		    memcmp(mt->ne, t->ne, sizeof(mt->ne)) || mt->bytes != t->nbytes ||
		    mt->file_off != f->data_offset + t->offset)
			return box_fail(err, errlen, "tensor %s: the manifest entry (type, shape, "
					"bytes, file offset) differs from the GGUF header", name);
		if (mt->pool == HYB_MF_NO_POOL)
			return box_fail(err, errlen, "tensor %s is not resident (hybd dram_budget "
					"left it on storage): box-mode apps need every tensor in "
					"a pool", name);
		if (mt->pool == HYB_MF_SPLIT) {
			if (bind_split(bx, t, mt, &bx->splits[i], err, errlen))
				return -1;
			t->data = bx->splits[i].data[0];
			continue;
		}
		bp = mt->pool < bx->n_pools ? &bx->pools[mt->pool] : NULL;
		if (!bp || !bp->base)
			return box_fail(err, errlen, "tensor %s: pool %u is not a weight pool",
					name, mt->pool);
		if (mt->pool_off > bp->len || mt->bytes > bp->len - mt->pool_off)
			return box_fail(err, errlen, "tensor %s: [%llu, +%llu) is past the end of "
					"its pool (%zu bytes)", name,
					(unsigned long long)mt->pool_off,
					(unsigned long long)mt->bytes, bp->len);
		t->data = bp->base + mt->pool_off;
	}
	return 0;
}

/* The model, or NULL with the reason in err (the failure's errno in *rc). */
static struct hyb_model *load_manifest(const char *src, int *rc, char *err, size_t errlen)
{
	enum hyb_backend_kind kind = HYB_BACKEND_AUTO;
	char pool[HYB_MEMPOOL_NAME_LEN], why[512];
	struct hyb_model *m = NULL;
	struct box *bx = NULL;
	int ret;

	*rc = -EINVAL;
	if (!src)
		return box_fail(err, errlen, "no manifest given"), NULL;
	if (box_source(src, pool, &kind, err, errlen))
		return NULL;
	m = calloc(1, sizeof(*m));
	bx = calloc(1, sizeof(*bx));
	if (!m || !bx) {
		free(m);
		free(bx);
		*rc = -ENOMEM;
		return box_fail(err, errlen, "out of memory"), NULL;
	}
	bx->m = m;
	m->image_backend = hyb_backend_open(kind);
	if (!m->image_backend) {
		box_fail(err, errlen, "%s: %s", src, hyb_last_error());
		goto out_free;
	}
	/* (box_open's messages name the pool already) */
	if (box_open(bx, m->image_backend, pool, err, errlen))
		goto out_free;
	if (box_header(m, bx->mf, why, sizeof(why)) || box_bind(m, bx, why, sizeof(why))) {
		box_fail(err, errlen, "%s: %s", pool, why);
		goto out_free;
	}
	/* listed first: binding the weights looks up the split tensors' parts */
	pthread_mutex_lock(&box_lock);
	bx->next = boxes;
	boxes = bx;
	pthread_mutex_unlock(&box_lock);
	ret = hyb_model_finish(m, pool, err, errlen);
	if (ret) {
		*rc = ret;
		hyb_model_box_release(m);
		hyb_model_free(m);
		return NULL;
	}
	return m;

out_free:
	box_free(bx);		/* pool handles before the backend (closed by hyb_model_free) */
	hyb_model_free(m);
	return NULL;
}

struct hyb_model *hyb_model_load_manifest(const char *src)
{
	unsigned int since = hyb_error_count();
	char msg[1024] = "";
	struct hyb_model *m;
	int rc;

	m = load_manifest(src, &rc, msg, sizeof(msg));
	if (!m)
		/* a pool, manifest or device call underneath says which errno */
		hyb_error_set(rc == -EINVAL ? hyb_error_cause(since, rc) : rc, "%s", msg);
	return m;
}

const struct hyb_weight_split *hyb_model_box_split(const struct hyb_model *m,
						  const struct hyb_gguf_tensor *t)
{
	const struct hyb_weight_split *sp = NULL;
	struct box *bx;

	pthread_mutex_lock(&box_lock);
	bx = box_find(m);
	if (bx && bx->splits && t >= m->gguf->tensors &&
	    (uint64_t)(t - m->gguf->tensors) < bx->n_splits &&
	    bx->splits[t - m->gguf->tensors].n)
		sp = &bx->splits[t - m->gguf->tensors];
	pthread_mutex_unlock(&box_lock);
	return sp;
}

const struct hyb_weight_split *hyb_model_box_split_rows(const struct hyb_model *m,
						       const struct hyb_weight_split *sp,
						       uint64_t r0, uint64_t n,
						       uint64_t row_bytes)
{
	struct box_slice *sl = calloc(1, sizeof(*sl));
	struct box *bx;

	if (!sl)
		return NULL;
	for (uint32_t i = 0; i < sp->n; i++) {
		const uint64_t a = sp->row0[i] > r0 ? sp->row0[i] : r0;
		const uint64_t b = sp->row0[i + 1] < r0 + n ? sp->row0[i + 1] : r0 + n;

		if (a >= b)
			continue;
		sl->sp.row0[sl->sp.n] = a - r0;
		sl->sp.data[sl->sp.n] = sp->data[i] + (a - sp->row0[i]) * row_bytes;
		sl->sp.stride[sl->sp.n] = sp->stride[i];
		sl->sp.node[sl->sp.n] = sp->node[i];
		sl->sp.n++;
	}
	sl->sp.row0[sl->sp.n] = n;
	pthread_mutex_lock(&box_lock);
	bx = box_find(m);
	if (bx) {
		sl->next = bx->slices;
		bx->slices = sl;
	}
	pthread_mutex_unlock(&box_lock);
	if (!bx) {
		free(sl);
		return NULL;
	}
	return &sl->sp;
}

const struct hyb_manifest *hyb_model_manifest(const struct hyb_model *m)
{
	struct box *bx;

	pthread_mutex_lock(&box_lock);
	bx = box_find(m);
	pthread_mutex_unlock(&box_lock);
	return bx ? bx->mf : NULL;
}

const void *hyb_model_box_addr(const struct hyb_model *m, uint32_t pool, uint64_t off,
			       uint64_t len)
{
	const void *p = NULL;
	struct box *bx;

	pthread_mutex_lock(&box_lock);
	bx = box_find(m);
	if (bx && pool < bx->n_pools && bx->pools[pool].base && off <= bx->pools[pool].len &&
	    len <= bx->pools[pool].len - off)
		p = bx->pools[pool].base + off;
	pthread_mutex_unlock(&box_lock);
	return p;
}

int hyb_model_box_check(const struct hyb_model *m)
{
	struct hyb_mempool_info pi;
	struct box *bx;
	uint32_t state;
	bool gone;
	int ret = 0;

	pthread_mutex_lock(&box_lock);
	bx = box_find(m);
	if (!bx) {
		pthread_mutex_unlock(&box_lock);
		return hyb_error_set(-EINVAL, "not a box-mode model (loaded from a file)");
	}
	/* hybd stores RETIRED before it destroys the pool; a death leaves READY */
	state = __atomic_load_n(&bx->hdr->state, __ATOMIC_ACQUIRE);
	gone = hyb_mempool_info(bx->mf_pool, &pi) || (pi.owner_pid && pi.owner_pid != bx->pid);
	if (state != HYB_MF_READY)
		ret = -ESHUTDOWN;
	else if (gone)
		ret = -EPIPE;
	if (ret == -ESHUTDOWN)
		hyb_error_set(ret, "hybd (pid %d) shut down: manifest %s retired; nothing more "
			      "can be loaded or uploaded for this model", bx->pid, bx->mf_name);
	else if (ret)
		hyb_error_set(ret, "hybd (pid %d) is gone: manifest pool %s was destroyed "
			      "without being retired (the daemon died); weights mapped here stay "
			      "readable, nothing more can be loaded", bx->pid, bx->mf_name);
	pthread_mutex_unlock(&box_lock);
	return ret;
}
