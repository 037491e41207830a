// SPDX-License-Identifier: MIT
/* hybd's neuron cache and reload queue, for the hybrid engine in box mode (cache_hybd.h). */
#include "cache_hybd.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "hyb/gpucache.h"
#include "hyb/manifest.h"
#include "hyb/pool.h"

/* Where group g of layer l is in hybd's pools: what an UPLOAD names. */
struct loc {
	uint64_t pool_off, bytes;
	uint32_t pool_id;
};

struct hyb_hybd_cache {
	struct hyb_gpucache_desc desc;
	struct hyb_hybd_cache_info info;
	int lock_fd;                    /* the descriptor file, flock'ed */
	struct hyb_mempool *slots;      /* host kind: hybd's slots pool, read-only */
	void *cuda_base;                /* cuda kind: the IPC mapping */
	struct hyb_rq *rq;
	struct loc *loc;                /* [L][NG] */
	uint32_t L, NG;
	char err[320];
};

static struct hyb_hybd_cache *fail(struct hyb_hybd_cache *c, int *code, int e, char *err,
				   size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 6, 7)));
static struct hyb_hybd_cache *fail(struct hyb_hybd_cache *c, int *code, int e, char *err,
				   size_t errlen, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	*code = e;
	hyb_hybd_cache_close(c);
	return NULL;
}

/* The manifest's bundle of every group, checked to be the bytes the engine computes from. */
static int locate(struct hyb_hybd_cache *c, const struct hyb_model *m,
		  const struct hyb_manifest *mf, const struct hyb_ffn_bundles *const *bundles,
		  char *err, size_t errlen)
{
	for (uint32_t l = 0; l < c->L; l++) {
		const struct hyb_ffn_bundles *b = bundles[l];

		for (uint32_t g = 0; g < c->NG; g++) {
			const struct hyb_mf_bundle *e = hyb_manifest_bundle(mf, l, g);
			const struct hyb_mf_pool *p = e ? hyb_manifest_pool(mf, e->pool) : NULL;
			const uint32_t n = b->n_ff - g * b->group_size < b->group_size ?
					   b->n_ff - g * b->group_size : b->group_size;

			if (!e || !p) {
				snprintf(err, errlen, "the manifest has no pool range for group %u "
					 "of layer %u", g, l);
				return -1;
			}
			if (e->bytes != 3ull * n * b->row_bytes ||
			    hyb_model_box_addr(m, e->pool, e->pool_off, e->bytes) != b->bundle[g]) {
				snprintf(err, errlen, "group %u of layer %u: the manifest's bundle "
					 "(%llu bytes at %s+%llu) is not the one the model computes "
					 "from", g, l, (unsigned long long)e->bytes, p->name,
					 (unsigned long long)e->pool_off);
				return -1;
			}
			c->loc[(size_t)l * c->NG + g] = (struct loc){
				.pool_off = e->pool_off, .bytes = e->bytes, .pool_id = p->id,
			};
		}
	}
	return 0;
}

/* Slot 0's address for the app's device: the host pool's mapping, or the CUDA IPC mapping. */
static int map_slots(struct hyb_hybd_cache *c, const struct hyb_model *m, int ordinal,
		     char *err, size_t errlen)
{
	const uint64_t need = (uint64_t)c->desc.n_slots * c->desc.slot_bytes;
	void *base = NULL;
	size_t len;
	int ret;

	if (c->desc.kind == HYB_GPUCACHE_CUDA) {
		ret = hyb_cuda_cache_open(&c->desc, ordinal, &c->cuda_base);
		if (ret)
			snprintf(err, errlen, "%s", hyb_last_error());
		c->info.base = (hyb_dptr)(uintptr_t)c->cuda_base;
		return ret;
	}
	ret = hyb_mempool_open(m->image_backend, c->desc.pool, &c->slots);
	if (!ret)
		ret = hyb_mempool_map(c->slots, &base, &len);
	if (ret) {
		snprintf(err, errlen, "hybd's cache pool %s: %s", c->desc.pool, hyb_last_error());
		return ret;
	}
	if (len < need) {
		snprintf(err, errlen, "hybd's cache pool %s is %zu bytes, its descriptor says %u "
			 "slots of %llu", c->desc.pool, len, c->desc.n_slots,
			 (unsigned long long)c->desc.slot_bytes);
		return -EINVAL;
	}
	c->info.base = (hyb_dptr)(uintptr_t)base;
	return 0;
}

struct hyb_hybd_cache *hyb_hybd_cache_open(const struct hyb_model *m, const char *dev_kind,
					   int ordinal, const struct hyb_ffn_bundles *const *bundles,
					   int *code, char *err, size_t errlen)
{
	const struct hyb_manifest *mf = hyb_model_manifest(m);
	struct hyb_manifest_info mi;
	struct hyb_hybd_cache *c;
	const bool cuda = dev_kind && !strcmp(dev_kind, "cuda");
	char why[512];
	int ret;

	if (!mf)
		return fail(NULL, code, -EINVAL, err, errlen, "the model is not served by hybd "
			    "(box mode: hyb run --manifest)");
	hyb_manifest_info(mf, &mi);
	c = calloc(1, sizeof(*c));
	if (!c)
		return fail(NULL, code, -ENOMEM, err, errlen, "out of memory");
	c->lock_fd = -1;
	c->L = m->hp.n_layer;
	c->NG = m->n_groups;
	hyb_gpucache_path(mi.name, c->info.path, sizeof(c->info.path));
	c->lock_fd = open(c->info.path, O_RDONLY | O_CLOEXEC);
	if (c->lock_fd < 0)
		return fail(c, code, -errno, err, errlen, "hybd '%s' publishes no GPU cache (%s: "
			    "%s)", mi.name, c->info.path, strerror(errno));
	/* one app decides what the slots hold: the lock is held until close */
	if (flock(c->lock_fd, LOCK_EX | LOCK_NB))
		return fail(c, code, errno == EWOULDBLOCK ? -EBUSY : -errno, err, errlen,
			    "hybd '%s''s GPU cache is in use by another app (%s is locked)",
			    mi.name, c->info.path);
	ret = hyb_gpucache_desc_read(c->info.path, &c->desc);
	if (ret)
		return fail(c, code, ret, err, errlen, "%s", hyb_last_error());
	if (c->desc.pid != mi.pid)
		return fail(c, code, -EINVAL, err, errlen, "%s is of hybd pid %d, the manifest "
			    "of pid %d (hybd restarted?)", c->info.path, c->desc.pid, mi.pid);
	if ((c->desc.kind == HYB_GPUCACHE_CUDA) != cuda)
		return fail(c, code, -EXDEV, err, errlen, "hybd's cache is %s memory, this app's "
			    "device is %s", c->desc.kind == HYB_GPUCACHE_CUDA ? "GPU" : "host",
			    dev_kind ? dev_kind : "cpu");
	c->loc = calloc((size_t)c->L * c->NG, sizeof(*c->loc));
	if (!c->loc)
		return fail(c, code, -ENOMEM, err, errlen, "out of memory");
	if (locate(c, m, mf, bundles, why, sizeof(why)))
		return fail(c, code, -EINVAL, err, errlen, "%s", why);
	ret = map_slots(c, m, ordinal, why, sizeof(why));
	if (ret)
		return fail(c, code, ret, err, errlen, "%s", why);
	ret = hyb_rq_attach_client(m->image_backend, c->desc.queue, HYB_RQ_EVENTFD_NONE, &c->rq);
	if (ret)
		return fail(c, code, ret, err, errlen, "reload queue %u of hybd '%s': %s",
			    c->desc.queue, mi.name, hyb_last_error());
	c->info.n_slots = c->desc.n_slots;
	c->info.slot_bytes = c->desc.slot_bytes;
	c->info.queue = c->desc.queue;
	c->info.pid = c->desc.pid;
	c->info.kind = c->desc.kind == HYB_GPUCACHE_CUDA ? "cuda" : "host";
	*code = 0;
	return c;
}

void hyb_hybd_cache_info(const struct hyb_hybd_cache *c, struct hyb_hybd_cache_info *out)
{
	*out = c->info;
}

void hyb_hybd_cache_close(struct hyb_hybd_cache *c)
{
	if (!c)
		return;
	if (c->rq)
		hyb_rq_close(c->rq);
	if (c->cuda_base)
		hyb_cuda_cache_close(c->cuda_base);
	hyb_mempool_close(c->slots);
	if (c->lock_fd >= 0)
		close(c->lock_fd);
	free(c->loc);
	free(c);
}

const char *hyb_hybd_cache_error(const struct hyb_hybd_cache *c)
{
	return c->err;
}

int hyb_hybd_cache_upload(struct hyb_hybd_cache *c, uint32_t slot, uint32_t l, uint32_t g,
			  uint64_t tag)
{
	const struct loc *o = &c->loc[(size_t)l * c->NG + g];
	const struct hyb_rq_req r = {
		.tag = tag, .pool_off = o->pool_off, .len = o->bytes, .aux = slot,
		.pool_id = o->pool_id, .layer = l, .group = g, .op = HYB_RQ_UPLOAD,
		.prio = HYB_RQ_HIGH,
	};
	int ret;

	if (slot >= c->info.n_slots || o->bytes > c->info.slot_bytes) {
		snprintf(c->err, sizeof(c->err), "group %u of layer %u (%llu bytes) into slot %u: "
			 "hybd's cache has %u slots of %llu bytes", g, l,
			 (unsigned long long)o->bytes, slot, c->info.n_slots,
			 (unsigned long long)c->info.slot_bytes);
		return -EINVAL;
	}
	ret = hyb_rq_submit(c->rq, &r, 1);
	if (ret < 0 && ret != -EAGAIN)
		snprintf(c->err, sizeof(c->err), "reload queue %u: %s", c->info.queue,
			 ret == -EPIPE ? "hybd went away" : hyb_last_error());
	return ret < 0 ? ret : 0;
}

int hyb_hybd_cache_reap(struct hyb_hybd_cache *c, uint64_t *tags, unsigned int max, bool wait)
{
	struct hyb_rq_cqe cqe[64];
	int n;

	if (max > 64)
		max = 64;
	n = hyb_rq_reap(c->rq, cqe, max, wait ? 1 : 0, 0);
	if (n < 0) {
		snprintf(c->err, sizeof(c->err), "reload queue %u: %s", c->info.queue,
			 n == -EPIPE ? "hybd went away" : hyb_last_error());
		return n;
	}
	for (int i = 0; i < n; i++) {
		if (cqe[i].status) {
			snprintf(c->err, sizeof(c->err), "hybd failed a load (tag %llu): %s",
				 (unsigned long long)cqe[i].tag, strerror(-cqe[i].status));
			return cqe[i].status == -EPIPE ? -EPIPE : -EIO;
		}
		tags[i] = cqe[i].tag;
	}
	return n;
}
