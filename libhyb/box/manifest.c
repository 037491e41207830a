// SPDX-License-Identifier: MIT
/*
 * Reading a model manifest (hyb/manifest.h). The bytes come from a file or a
 * pool another process writes, so nothing in them is trusted: they are copied
 * first (a writer cannot change them under the checks), then every size,
 * offset and string is checked before a pointer into them is handed out.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hyb/manifest.h"
#include "util/error.h"

struct hyb_manifest {
	uint8_t *buf;			/* private copy */
	uint64_t len;
	const struct hyb_mf_header *h;
	struct hyb_manifest_tensor *tensors;
	struct hyb_mf_pool *pools;	/* copied out at the known entry size */
	struct hyb_mf_bundle *bundles;
	struct hyb_mf_part *parts;	/* by (tensor, row0), checked */
	uint64_t resident, paged;
	/* pool-opened: the live mapping, to tell when hybd retires it */
	struct hyb_backend *b;
	struct hyb_mempool *pool;
	const volatile uint32_t *live_state;
};

static void *fail(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void *fail(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (err && errlen) {
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return NULL;
}

uint64_t hyb_mf_checksum(const void *buf, size_t len)
{
	const uint8_t *p = buf;
	uint64_t h = 0xcbf29ce484222325ULL;

	for (size_t i = 0; i < len; i++) {
		h ^= p[i];
		h *= 0x100000001b3ULL;
	}
	return h;
}

void hyb_state_dir(char *buf, size_t len)
{
	const char *e = getenv("HYB_STATE_DIR"), *x = getenv("XDG_RUNTIME_DIR");

	if (e && *e)
		snprintf(buf, len, "%s", e);
	else if (geteuid() == 0)
		snprintf(buf, len, "/run/hybd");
	else if (x && *x)
		snprintf(buf, len, "%s/hybd", x);
	else
		snprintf(buf, len, "/tmp/hybd-%u", (unsigned int)geteuid());
}

/* A string of the table: in bounds and NUL-terminated, else NULL. */
static const char *str_at(const struct hyb_manifest *m, uint64_t off)
{
	const struct hyb_mf_header *h = m->h;
	const char *s = (const char *)m->buf + h->strings_off;

	if (off >= h->strings_len || !memchr(s + off, 0, h->strings_len - off))
		return NULL;
	return s + off;
}

/* [off, off + n * size) inside the manifest and past the header. */
static bool section_ok(const struct hyb_manifest *m, uint64_t off, uint64_t n, uint64_t size)
{
	if (n && size > (HYB_MF_MAX_BYTES / n))
		return false;
	return off >= m->h->header_size && off <= m->len && n * size <= m->len - off;
}

static int cmp_name(const void *a, const void *b)
{
	return strcmp(((const struct hyb_manifest_tensor *)a)->name,
		      ((const struct hyb_manifest_tensor *)b)->name);
}

static int cmp_bundle(const struct hyb_mf_bundle *a, uint32_t layer, uint32_t group)
{
	if (a->layer != layer)
		return a->layer < layer ? -1 : 1;
	return a->group < group ? -1 : a->group > group;
}

static void *check_header(struct hyb_manifest *m, char *err, size_t errlen)
{
	const struct hyb_mf_header *h = m->h;

	if (m->len < sizeof(uint64_t) + 2 * sizeof(uint32_t) || h->magic != HYB_MF_MAGIC)
		return fail(err, errlen, "not a hyb manifest (bad magic)");
	if (h->version != HYB_MF_VERSION && h->version != 1)
		return fail(err, errlen, "manifest version %u is not supported (this build reads "
			    "1 and %u)", h->version, HYB_MF_VERSION);
	if (m->len < sizeof(*h) || h->header_size < sizeof(*h) || h->header_size > m->len)
		return fail(err, errlen, "manifest truncated: %llu bytes",
			    (unsigned long long)m->len);
	if (h->state != HYB_MF_READY)
		return fail(err, errlen, "manifest is %s, not ready",
			    h->state == HYB_MF_WRITING ? "still being written" :
			    h->state == HYB_MF_RETIRED ? "retired (hybd is shutting down)" :
			    "in an unknown state");
	if (h->total_size != m->len)
		return fail(err, errlen, "manifest size %llu does not match its header (%llu)",
			    (unsigned long long)m->len, (unsigned long long)h->total_size);
	if (hyb_mf_checksum(m->buf + h->header_size, m->len - h->header_size) != h->checksum)
		return fail(err, errlen, "manifest checksum mismatch (corrupt or being rewritten)");
	if (h->pool_entry_size < sizeof(struct hyb_mf_pool) ||
	    h->tensor_entry_size < sizeof(struct hyb_mf_tensor) ||
	    h->bundle_entry_size < sizeof(struct hyb_mf_bundle) ||
	    (h->n_parts && h->part_entry_size < sizeof(struct hyb_mf_part)))
		return fail(err, errlen, "manifest entries are smaller than version %u's",
			    HYB_MF_VERSION);
	if (h->version < 2 && h->n_parts)
		return fail(err, errlen, "manifest version %u has %u parts (version 2 added them)",
			    h->version, h->n_parts);
	if (!section_ok(m, h->pools_off, h->n_pools, h->pool_entry_size) ||
	    !section_ok(m, h->tensors_off, h->n_tensors, h->tensor_entry_size) ||
	    !section_ok(m, h->bundles_off, h->n_bundles, h->bundle_entry_size) ||
	    (h->n_parts && !section_ok(m, h->parts_off, h->n_parts, h->part_entry_size)) ||
	    !section_ok(m, h->strings_off, 1, h->strings_len) ||
	    !section_ok(m, h->meta_off, 1, h->meta_len))
		return fail(err, errlen, "manifest section out of bounds");
	if (!h->strings_len || m->buf[h->strings_off + h->strings_len - 1] != 0)
		return fail(err, errlen, "manifest string table is not NUL-terminated");
	if (!str_at(m, h->model_path) || !str_at(m, h->placement) || !str_at(m, h->name))
		return fail(err, errlen, "manifest header string out of bounds");
	return m;
}

/*
 * The parts of the split tensors (docs/NUMA.md): each names a split tensor,
 * a tensor's parts come together and cover its rows [0, ne[1]) in order,
 * and each part's experts lie inside a weight pool on the part's node.
 */
static void *decode_parts(struct hyb_manifest *m, char *err, size_t errlen)
{
	const struct hyb_mf_header *h = m->h;
	struct hyb_manifest_tensor *prev = NULL;
	uint64_t row = 0;

	m->parts = calloc(h->n_parts + 1, sizeof(*m->parts));
	if (!m->parts)
		return fail(err, errlen, "out of memory");
	for (uint32_t i = 0; i < h->n_parts; i++) {
		struct hyb_mf_part *p = &m->parts[i];
		struct hyb_manifest_tensor key, *t;
		const struct hyb_mf_pool *pool;
		uint64_t rb, span;

		memcpy(p, m->buf + h->parts_off + (uint64_t)i * h->part_entry_size, sizeof(*p));
		key.name = str_at(m, p->tensor);
		t = key.name ? bsearch(&key, m->tensors, h->n_tensors, sizeof(key), cmp_name) :
		    NULL;
		if (!t || t->pool != HYB_MF_SPLIT)
			return fail(err, errlen, "manifest part %u: %s %s", i,
				    key.name ? key.name : "(name out of bounds)",
				    t ? "is not a split tensor" : "names no tensor");
		if (t != prev) {
			if (prev && (row != prev->ne[1] || t < prev))
				return fail(err, errlen, "manifest tensor %s: its parts do not cover "
					    "its rows in order", row != prev->ne[1] ? prev->name :
					    t->name);
			if (t->parts)
				return fail(err, errlen, "manifest tensor %s: its parts are not "
					    "together", t->name);
			t->parts = p;
			prev = t;
			row = 0;
		}
		/* ne[1] * ne[2] <= bytes first: the product cannot wrap (to 0) */
		if (t->n_dims != 3 || !t->ne[1] || !t->ne[2] || t->ne[1] > t->bytes ||
		    t->ne[2] > t->bytes / t->ne[1] || t->bytes % (t->ne[1] * t->ne[2]))
			return fail(err, errlen, "manifest tensor %s: split, but not a 3-D tensor of "
				    "whole rows", t->name);
		rb = t->bytes / (t->ne[1] * t->ne[2]);
		if (p->row0 != row || !p->rows || p->rows > t->ne[1] - row ||
		    ++t->n_parts > HYB_MF_MAX_PARTS)
			return fail(err, errlen, "manifest tensor %s: part %u has rows [%llu, +%llu) "
				    "after row %llu (at most %d parts)", t->name, t->n_parts,
				    (unsigned long long)p->row0, (unsigned long long)p->rows,
				    (unsigned long long)row, HYB_MF_MAX_PARTS);
		row += p->rows;
		pool = p->pool < h->n_pools ? &m->pools[p->pool] : NULL;
		if (!pool || pool->role != HYB_MF_ROLE_WEIGHTS || pool->node != p->node)
			return fail(err, errlen, "manifest tensor %s: a part in pool %u, not a "
				    "weight pool on its node %d", t->name, p->pool, p->node);
		/* rows * rb <= bytes < 2^64; the span is checked before it is formed */
		if (p->stride < p->rows * rb || p->stride > pool->bytes ||
		    (t->ne[2] - 1) > (pool->bytes - p->rows * rb) / (p->stride ? p->stride : 1))
			return fail(err, errlen, "manifest tensor %s: a part's stride %llu does not "
				    "fit %llu experts in pool %s", t->name,
				    (unsigned long long)p->stride, (unsigned long long)t->ne[2],
				    pool->name);
		span = (t->ne[2] - 1) * p->stride + p->rows * rb;
		if (p->pool_off > pool->bytes || span > pool->bytes - p->pool_off)
			return fail(err, errlen, "manifest tensor %s: a part lies outside pool %s",
				    t->name, pool->name);
	}
	if (prev && row != prev->ne[1])
		return fail(err, errlen, "manifest tensor %s: its parts do not cover its rows",
			    prev->name);
	for (uint32_t i = 0; i < h->n_tensors; i++)
		if (m->tensors[i].pool == HYB_MF_SPLIT && !m->tensors[i].n_parts)
			return fail(err, errlen, "manifest tensor %s is split but has no parts",
				    m->tensors[i].name);
	return m;
}

static void *decode(struct hyb_manifest *m, char *err, size_t errlen)
{
	const struct hyb_mf_header *h = m->h;

	m->pools = calloc(h->n_pools + 1, sizeof(*m->pools));
	m->tensors = calloc(h->n_tensors + 1, sizeof(*m->tensors));
	m->bundles = calloc(h->n_bundles + 1, sizeof(*m->bundles));
	if (!m->pools || !m->tensors || !m->bundles)
		return fail(err, errlen, "out of memory");
	for (uint32_t i = 0; i < h->n_pools; i++) {
		struct hyb_mf_pool *p = &m->pools[i];

		memcpy(p, m->buf + h->pools_off + (uint64_t)i * h->pool_entry_size, sizeof(*p));
		if (!memchr(p->name, 0, sizeof(p->name)) || p->used > p->bytes)
			return fail(err, errlen, "manifest pool %u is malformed", i);
	}
	for (uint32_t i = 0; i < h->n_tensors; i++) {
		struct hyb_mf_tensor t;
		struct hyb_manifest_tensor *o = &m->tensors[i];

		memcpy(&t, m->buf + h->tensors_off + (uint64_t)i * h->tensor_entry_size,
		       sizeof(t));
		o->name = str_at(m, t.name);
		if (!o->name)
			return fail(err, errlen, "manifest tensor %u: name out of bounds", i);
		if (t.n_dims < 1 || t.n_dims > 4)
			return fail(err, errlen, "manifest tensor %s: %u dimensions", o->name,
				    t.n_dims);
		if (t.pool != HYB_MF_NO_POOL && t.pool != HYB_MF_SPLIT &&
		    (t.pool >= h->n_pools || t.pool_off > m->pools[t.pool].bytes ||
		     t.bytes > m->pools[t.pool].bytes - t.pool_off))
			return fail(err, errlen, "manifest tensor %s lies outside its pool",
				    o->name);
		if (i && strcmp(m->tensors[i - 1].name, o->name) >= 0)
			return fail(err, errlen, "manifest tensors are not sorted by name (at %s)",
				    o->name);
		o->type = t.type;
		o->n_dims = t.n_dims;
		memcpy(o->ne, t.ne, sizeof(o->ne));
		o->layer = t.layer;
		o->node = t.node;
		o->pool = t.pool;
		o->pool_id = t.pool == HYB_MF_NO_POOL || t.pool == HYB_MF_SPLIT ? 0 :
			     m->pools[t.pool].id;
		o->pool_off = t.pool_off;
		o->bytes = t.bytes;
		o->file_off = t.file_off;
		if (t.pool == HYB_MF_NO_POOL)
			m->paged += t.bytes;
		else
			m->resident += t.bytes;
	}
	if (!decode_parts(m, err, errlen))
		return NULL;
	for (uint32_t i = 0; i < h->n_bundles; i++) {
		struct hyb_mf_bundle *b = &m->bundles[i];

		memcpy(b, m->buf + h->bundles_off + (uint64_t)i * h->bundle_entry_size,
		       sizeof(*b));
		if (b->pool != HYB_MF_NO_POOL &&
		    (b->pool >= h->n_pools || b->pool_off > m->pools[b->pool].bytes ||
		     b->bytes > m->pools[b->pool].bytes - b->pool_off))
			return fail(err, errlen, "manifest bundle %u.%u lies outside its pool",
				    b->layer, b->group);
		if (i && cmp_bundle(&m->bundles[i - 1], b->layer, b->group) >= 0)
			return fail(err, errlen, "manifest bundles are not sorted (at %u.%u)",
				    b->layer, b->group);
	}
	return m;
}

/* Takes ownership of buf (malloc'ed, len bytes). */
static struct hyb_manifest *adopt(uint8_t *buf, uint64_t len, char *err, size_t errlen)
{
	struct hyb_manifest *m = calloc(1, sizeof(*m));

	if (!m) {
		free(buf);
		return fail(err, errlen, "out of memory");
	}
	m->buf = buf;
	m->len = len;
	m->h = (const struct hyb_mf_header *)buf;
	if (!check_header(m, err, errlen) || !decode(m, err, errlen)) {
		hyb_manifest_close(m);
		return NULL;
	}
	return m;
}

static struct hyb_manifest *manifest_parse(const void *buf, size_t len, char *err,
					   size_t errlen)
{
	uint8_t *copy;

	if (!buf || len < sizeof(uint64_t))
		return fail(err, errlen, "manifest truncated: %zu bytes", len);
	if (len > HYB_MF_MAX_BYTES)
		return fail(err, errlen, "manifest of %zu bytes is implausibly large", len);
	/* 8-byte aligned, so the header and entries may be read in place */
	copy = aligned_alloc(8, (len + 7) & ~(size_t)7);
	if (!copy)
		return fail(err, errlen, "out of memory");
	memcpy(copy, buf, len);
	return adopt(copy, len, err, errlen);
}

static struct hyb_manifest *manifest_open(const char *path, char *err, size_t errlen)
{
	struct hyb_manifest *m;
	struct stat sb;
	uint8_t *buf;
	size_t got = 0;
	int fd;

	if (!path)
		return fail(err, errlen, "manifest: NULL path");
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return fail(err, errlen, "%s: cannot open: %s%s", path, strerror(errno),
			    errno == ENOENT ? " (is hybd running and done loading?)" : "");
	if (fstat(fd, &sb) || !S_ISREG(sb.st_mode) || sb.st_size < 8 ||
	    (uint64_t)sb.st_size > HYB_MF_MAX_BYTES) {
		close(fd);
		return fail(err, errlen, "%s: not a manifest file (size %lld)", path,
			    (long long)sb.st_size);
	}
	buf = aligned_alloc(8, ((size_t)sb.st_size + 7) & ~(size_t)7);
	if (!buf) {
		close(fd);
		return fail(err, errlen, "out of memory");
	}
	while (got < (size_t)sb.st_size) {
		ssize_t r = read(fd, buf + got, (size_t)sb.st_size - got);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			close(fd);
			free(buf);
			return fail(err, errlen, "%s: read failed: %s", path,
				    r ? strerror(errno) : "file shrank");
		}
		got += (size_t)r;
	}
	close(fd);
	m = adopt(buf, got, err, errlen);
	if (!m && err && errlen) {
		char msg[256];

		snprintf(msg, sizeof(msg), "%s", err);
		snprintf(err, errlen, "%s: %s", path, msg);
	}
	return m;
}

static struct hyb_manifest *manifest_open_pool(struct hyb_backend *b, const char *pool_name,
					       char *err, size_t errlen)
{
	const struct hyb_mf_header *h;
	struct hyb_mempool *p;
	struct hyb_manifest *m;
	size_t len;
	void *addr;

	if (!b || !pool_name)
		return fail(err, errlen, "manifest: NULL backend or pool name");
	if (hyb_mempool_open(b, pool_name, &p))
		return fail(err, errlen, "manifest pool '%s': %s", pool_name,
			    hyb_last_error());
	if (hyb_mempool_map(p, &addr, &len)) {
		fail(err, errlen, "manifest pool '%s': %s", pool_name, hyb_last_error());
		hyb_mempool_close(p);
		return NULL;
	}
	h = addr;
	/* the writer stores state last, with release order: acquire before the copy */
	if (len < sizeof(*h) || __atomic_load_n(&h->state, __ATOMIC_ACQUIRE) != HYB_MF_READY ||
	    h->total_size > len) {
		fail(err, errlen, "manifest pool '%s' is not ready (%s)", pool_name,
		     len < sizeof(*h) ? "too small" : h->state == HYB_MF_RETIRED ?
		     "retired: hybd is shutting down" : "hybd is still loading");
		hyb_mempool_close(p);
		return NULL;
	}
	m = manifest_parse(addr, h->total_size, err, errlen);
	if (!m) {
		hyb_mempool_close(p);
		return NULL;
	}
	m->b = b;
	m->pool = p;
	m->live_state = &((const volatile struct hyb_mf_header *)addr)->state;
	return m;
}

/* The public calls: the reason of a failure goes to hyb_last_error(). */
static struct hyb_manifest *said(struct hyb_manifest *m, const char *msg)
{
	if (!m)
		hyb_error_set(-EINVAL, "%s", msg);
	return m;
}

struct hyb_manifest *hyb_manifest_parse(const void *buf, size_t len)
{
	char msg[1024] = "";

	return said(manifest_parse(buf, len, msg, sizeof(msg)), msg);
}

struct hyb_manifest *hyb_manifest_open(const char *path)
{
	char msg[1024] = "";

	return said(manifest_open(path, msg, sizeof(msg)), msg);
}

struct hyb_manifest *hyb_manifest_open_pool(struct hyb_backend *b, const char *pool_name)
{
	char msg[1024] = "";

	return said(manifest_open_pool(b, pool_name, msg, sizeof(msg)), msg);
}

void hyb_manifest_close(struct hyb_manifest *m)
{
	if (!m)
		return;
	if (m->pool)
		hyb_mempool_close(m->pool);
	free(m->pools);
	free(m->tensors);
	free(m->bundles);
	free(m->parts);
	free(m->buf);
	free(m);
}

static int pid_alive(int32_t pid)
{
	return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM);
}

void hyb_manifest_info(const struct hyb_manifest *m, struct hyb_manifest_info *out)
{
	const struct hyb_mf_header *h = m->h;

	memset(out, 0, sizeof(*out));
	out->version = h->version;
	out->state = h->state;
	out->flags = h->flags;
	out->n_pools = h->n_pools;
	out->n_tensors = h->n_tensors;
	out->n_bundles = h->n_bundles;
	out->n_parts = h->n_parts;
	out->n_layers = h->n_layers;
	out->group_size = h->group_size;
	out->alignment = h->alignment;
	out->backend = (enum hyb_backend_kind)h->backend;
	out->pid = h->pid;
	out->pid_alive = pid_alive(h->pid);
	out->created_ns = h->created_ns;
	out->total_size = h->total_size;
	out->model_size = h->model_size;
	out->model_mtime_ns = h->model_mtime_ns;
	out->resident_bytes = m->resident;
	out->paged_bytes = m->paged;
	out->model_path = str_at(m, h->model_path);
	out->placement = str_at(m, h->placement);
	out->name = str_at(m, h->name);
	out->meta = m->buf + h->meta_off;
	out->meta_len = h->meta_len;
}

const struct hyb_manifest_tensor *hyb_manifest_find(const struct hyb_manifest *m,
						    const char *name)
{
	struct hyb_manifest_tensor key = { .name = name };

	if (!m || !name)
		return NULL;
	return bsearch(&key, m->tensors, m->h->n_tensors, sizeof(key), cmp_name);
}

const struct hyb_manifest_tensor *hyb_manifest_tensor(const struct hyb_manifest *m, uint32_t i)
{
	return m && i < m->h->n_tensors ? &m->tensors[i] : NULL;
}

const struct hyb_mf_pool *hyb_manifest_pool(const struct hyb_manifest *m, uint32_t i)
{
	return m && i < m->h->n_pools ? &m->pools[i] : NULL;
}

const struct hyb_mf_bundle *hyb_manifest_bundle(const struct hyb_manifest *m, uint32_t layer,
						uint32_t group)
{
	uint32_t lo = 0, hi;

	if (!m)
		return NULL;
	hi = m->h->n_bundles;
	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;
		int c = cmp_bundle(&m->bundles[mid], layer, group);

		if (!c)
			return &m->bundles[mid];
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

const struct hyb_mf_bundle *hyb_manifest_bundle_at(const struct hyb_manifest *m, uint32_t i)
{
	return m && i < m->h->n_bundles ? &m->bundles[i] : NULL;
}

int hyb_manifest_live(const struct hyb_manifest *m)
{
	struct hyb_mempool_info pi;

	if (!m)
		return 0;
	if (!m->live_state)
		return pid_alive(m->h->pid);
	if (hyb_mempool_info(m->pool, &pi))
		return 0;
	return __atomic_load_n(m->live_state, __ATOMIC_ACQUIRE) == HYB_MF_READY;
}
