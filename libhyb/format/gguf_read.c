// SPDX-License-Identifier: MIT
/*
 * GGUF reader. One forward pass over the header with a bounds-checked
 * cursor. Every count is checked against the bytes left before anything is
 * allocated for it, so a hostile file can make us allocate at most a small
 * multiple of its own size. Tensor data pointers are computed only once the
 * whole geometry (alignment, bounds, overlap) has been validated.
 *
 * This file depends on nothing in libhyb but tensor_type.c, map_guard.c and
 * util/error.c, so that the fuzzer can be built from them alone.
 */
#include "hyb/gguf.h"
#include "hyb/tensor_type.h"
#include "map_guard.h"
#include "util/error.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the GGUF reader assumes a little-endian host"
#endif

/* Smallest encodings, used to bound counts before allocating for them. */
#define MIN_KV_BYTES 14     /* key length, 1-byte key, value type, 1-byte value */
#define MIN_TENSOR_BYTES 32 /* name length, n_dims, ne[0], type, offset */
#define MAX_COUNT (1ull << 31) /* hash slots are uint32 */

typedef unsigned long long ull;

static const uint8_t vt_size[HYB_GGUF_VT_COUNT] = {
	[HYB_GGUF_VT_UINT8] = 1, [HYB_GGUF_VT_INT8] = 1,   [HYB_GGUF_VT_UINT16] = 2,  [HYB_GGUF_VT_INT16] = 2,
	[HYB_GGUF_VT_UINT32] = 4, [HYB_GGUF_VT_INT32] = 4, [HYB_GGUF_VT_FLOAT32] = 4, [HYB_GGUF_VT_BOOL] = 1,
	[HYB_GGUF_VT_UINT64] = 8, [HYB_GGUF_VT_INT64] = 8, [HYB_GGUF_VT_FLOAT64] = 8,
};

static const char *const vt_names[HYB_GGUF_VT_COUNT] = {
	"UINT8", "INT8",   "UINT16", "INT16", "UINT32", "INT32",   "FLOAT32",
	"BOOL",  "STRING", "ARRAY",  "UINT64", "INT64", "FLOAT64",
};

const char *hyb_gguf_vtype_name(uint32_t t)
{
	return t < HYB_GGUF_VT_COUNT ? vt_names[t] : "invalid";
}

struct cursor {
	const uint8_t *buf;
	uint64_t size, pos;
	/* what is being parsed, to prefix messages with */
	const char *scope; /* "key", "tensor" or NULL */
	uint64_t idx;
	struct hyb_gguf_str name;
	char *err;
	size_t errlen;
	int rc;		/* the first failure's errno, negated: -EINVAL but for -ENOMEM */
};

/* A name fit for a one-line message: at most 64 bytes, odd bytes as '?'. */
static const char *show(char out[72], struct hyb_gguf_str s)
{
	uint64_t n = s.len < 64 ? s.len : 64;
	size_t j = 0;

	for (uint64_t i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)s.ptr[i];

		out[j++] = ch >= 0x20 && ch < 0x7f ? (char)ch : '?';
	}
	if (s.len > n) {
		memcpy(out + j, "...", 3);
		j += 3;
	}
	out[j] = 0;
	return out;
}

__attribute__((format(printf, 3, 0))) static int vfail(struct cursor *c, int rc, const char *fmt,
							va_list ap)
{
	char name[72];
	int n = 0;

	c->rc = rc;
	if (!c->errlen)
		return -1;
	if (c->scope && c->name.ptr)
		n = snprintf(c->err, c->errlen, "%s %llu '%s': ", c->scope, (ull)c->idx,
			     show(name, c->name));
	else if (c->scope)
		n = snprintf(c->err, c->errlen, "%s %llu: ", c->scope, (ull)c->idx);
	if (n < 0 || (size_t)n >= c->errlen)
		return -1;
	vsnprintf(c->err + n, c->errlen - (size_t)n, fmt, ap);
	return -1;
}

/* A malformed file (-EINVAL); the parse returns c->rc. */
__attribute__((format(printf, 2, 3))) static int fail(struct cursor *c, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vfail(c, -EINVAL, fmt, ap);
	va_end(ap);
	return -1;
}

__attribute__((format(printf, 2, 3))) static int nomem(struct cursor *c, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vfail(c, -ENOMEM, fmt, ap);
	va_end(ap);
	return -1;
}

static uint64_t left(const struct cursor *c)
{
	return c->size - c->pos;
}

static int need(struct cursor *c, uint64_t n, const char *what)
{
	if (n <= left(c))
		return 0;
	return fail(c, "truncated at offset %llu reading %s (%llu bytes, %llu left)",
		    (ull)c->pos, what, (ull)n, (ull)left(c));
}

static int get_u32(struct cursor *c, uint32_t *v, const char *what)
{
	if (need(c, 4, what))
		return -1;
	memcpy(v, c->buf + c->pos, 4);
	c->pos += 4;
	return 0;
}

static int get_u64(struct cursor *c, uint64_t *v, const char *what)
{
	if (need(c, 8, what))
		return -1;
	memcpy(v, c->buf + c->pos, 8);
	c->pos += 8;
	return 0;
}

static int get_str(struct cursor *c, struct hyb_gguf_str *s, const char *what)
{
	uint64_t len;

	if (get_u64(c, &len, what))
		return -1;
	if (len > left(c))
		return fail(c, "truncated at offset %llu: %s length %llu exceeds the %llu bytes "
			    "left", (ull)c->pos, what, (ull)len, (ull)left(c));
	s->len = len;
	s->ptr = (const char *)c->buf + c->pos;
	c->pos += len;
	return 0;
}

/* ---- name index: open addressing, slot = item index + 1 ---------------- */

#define NAME_AT(names, stride, i) \
	((const struct hyb_gguf_str *)((const char *)(names) + (i) * (stride)))

static uint64_t hash_bytes(const char *p, uint64_t n)
{
	uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */

	for (uint64_t i = 0; i < n; i++)
		h = (h ^ (uint8_t)p[i]) * 0x100000001b3ull;
	return h;
}

static uint32_t *index_new(uint64_t n, uint64_t *mask)
{
	uint64_t cap = 16;

	while (cap < 2 * n)
		cap <<= 1;
	*mask = cap - 1;
	return calloc(cap, sizeof(uint32_t));
}

static int64_t index_lookup(const uint32_t *tab, uint64_t mask, const void *names, size_t stride,
			    const char *key, uint64_t len, uint64_t *slot)
{
	uint64_t h = hash_bytes(key, len) & mask;

	for (; tab[h]; h = (h + 1) & mask) {
		const struct hyb_gguf_str *s = NAME_AT(names, stride, tab[h] - 1);

		if (s->len == len && !memcmp(s->ptr, key, len))
			return tab[h] - 1;
	}
	*slot = h;
	return -1;
}

/* Add item i; returns the index of an earlier item of the same name, or -1. */
static int64_t index_add(uint32_t *tab, uint64_t mask, const void *names, size_t stride, uint64_t i)
{
	const struct hyb_gguf_str *s = NAME_AT(names, stride, i);
	uint64_t slot;
	int64_t j = index_lookup(tab, mask, names, stride, s->ptr, s->len, &slot);

	if (j < 0)
		tab[slot] = (uint32_t)(i + 1);
	return j;
}

/* ---- metadata ---------------------------------------------------------- */

static int read_scalar(struct cursor *c, uint32_t type, struct hyb_gguf_kv *kv)
{
	const uint8_t *p = c->buf + c->pos;
	union {
		uint16_t u16;
		int16_t i16;
		uint32_t u32;
		int32_t i32;
		float f32;
		uint64_t u64;
		int64_t i64;
		double f64;
	} x;

	if (need(c, vt_size[type], vt_names[type]))
		return -1;
	memcpy(&x, p, vt_size[type]);
	c->pos += vt_size[type];
	switch (type) {
	case HYB_GGUF_VT_UINT8: kv->v.u64 = p[0]; break;
	case HYB_GGUF_VT_INT8: kv->v.i64 = (int8_t)p[0]; break;
	case HYB_GGUF_VT_UINT16: kv->v.u64 = x.u16; break;
	case HYB_GGUF_VT_INT16: kv->v.i64 = x.i16; break;
	case HYB_GGUF_VT_UINT32: kv->v.u64 = x.u32; break;
	case HYB_GGUF_VT_INT32: kv->v.i64 = x.i32; break;
	case HYB_GGUF_VT_FLOAT32: kv->v.f64 = x.f32; break;
	case HYB_GGUF_VT_UINT64: kv->v.u64 = x.u64; break;
	case HYB_GGUF_VT_INT64: kv->v.i64 = x.i64; break;
	case HYB_GGUF_VT_FLOAT64: kv->v.f64 = x.f64; break;
	case HYB_GGUF_VT_BOOL:
		if (p[0] > 1)
			return fail(c, "bad bool value %u", p[0]);
		kv->v.b = p[0];
		break;
	}
	return 0;
}

static int read_string_array(struct cursor *c, struct hyb_gguf_kv *kv, uint64_t n)
{
	struct hyb_gguf_str *strs;

	/* each entry takes at least its 8-byte length */
	if (n > left(c) / 8)
		return fail(c, "truncated at offset %llu: array of %llu strings exceeds the %llu "
			    "bytes left", (ull)c->pos, (ull)n, (ull)left(c));
	strs = malloc(n ? n * sizeof(*strs) : 1);
	if (!strs)
		return nomem(c, "out of memory for %llu strings", (ull)n);
	kv->v.arr.strs = strs;
	for (uint64_t i = 0; i < n; i++) {
		uint64_t len;

		if (left(c) < 8)
			return fail(c, "truncated at offset %llu reading the length of string %llu",
				    (ull)c->pos, (ull)i);
		memcpy(&len, c->buf + c->pos, 8);
		c->pos += 8;
		if (len > left(c))
			return fail(c, "truncated at offset %llu: string %llu length %llu exceeds "
				    "the %llu bytes left", (ull)c->pos, (ull)i, (ull)len,
				    (ull)left(c));
		strs[i].len = len;
		strs[i].ptr = (const char *)c->buf + c->pos;
		c->pos += len;
	}
	return 0;
}

static int read_array(struct cursor *c, struct hyb_gguf_kv *kv)
{
	uint32_t et;
	uint64_t n, sz;

	if (get_u32(c, &et, "array element type") || get_u64(c, &n, "array length"))
		return -1;
	if (et == HYB_GGUF_VT_ARRAY)
		return fail(c, "nested arrays are not supported");
	if (et >= HYB_GGUF_VT_COUNT)
		return fail(c, "unknown array element type %u", et);
	kv->v.arr.type = et;
	kv->v.arr.n = n;
	if (et == HYB_GGUF_VT_STRING)
		return read_string_array(c, kv, n);
	sz = vt_size[et];
	if (n > left(c) / sz)
		return fail(c, "truncated at offset %llu: array of %llu %s exceeds the %llu bytes "
			    "left", (ull)c->pos, (ull)n, vt_names[et], (ull)left(c));
	kv->v.arr.data = c->buf + c->pos;
	if (et == HYB_GGUF_VT_BOOL) {
		for (uint64_t i = 0; i < n; i++)
			if (c->buf[c->pos + i] > 1)
				return fail(c, "bad bool value %u at element %llu",
					    c->buf[c->pos + i], (ull)i);
	}
	c->pos += n * sz;
	return 0;
}

static int parse_kvs(struct cursor *c, struct hyb_gguf_file *f)
{
	for (uint64_t i = 0; i < f->n_kv; i++) {
		struct hyb_gguf_kv *kv = &f->kv[i];
		uint32_t type;
		int64_t j;

		c->scope = "key";
		c->idx = i;
		c->name = (struct hyb_gguf_str){ 0 };
		if (get_str(c, &kv->key, "key"))
			return -1;
		if (!kv->key.len)
			return fail(c, "empty key");
		c->name = kv->key;
		j = index_add(f->kv_index, f->kv_mask, &f->kv[0].key, sizeof(*kv), i);
		if (j >= 0)
			return fail(c, "duplicate key (also key %lld)", (long long)j);
		if (get_u32(c, &type, "value type"))
			return -1;
		if (type >= HYB_GGUF_VT_COUNT)
			return fail(c, "unknown value type %u", type);
		kv->type = type;
		if (type == HYB_GGUF_VT_ARRAY) {
			if (read_array(c, kv))
				return -1;
		} else if (type == HYB_GGUF_VT_STRING) {
			if (get_str(c, &kv->v.str, "string"))
				return -1;
		} else if (read_scalar(c, type, kv)) {
			return -1;
		}
	}
	c->scope = NULL;
	return 0;
}

static int parse_alignment(struct cursor *c, struct hyb_gguf_file *f)
{
	const struct hyb_gguf_kv *kv = hyb_gguf_find(f, "general.alignment");

	f->alignment = HYB_GGUF_DEFAULT_ALIGNMENT;
	if (!kv)
		return 0;
	c->scope = "key";
	c->idx = (uint64_t)(kv - f->kv);
	c->name = kv->key;
	if (kv->type != HYB_GGUF_VT_UINT32)
		return fail(c, "alignment must be UINT32, not %s", vt_names[kv->type]);
	if (!kv->v.u64 || (kv->v.u64 & (kv->v.u64 - 1)))
		return fail(c, "alignment %llu is not a power of two", (ull)kv->v.u64);
	f->alignment = kv->v.u64;
	c->scope = NULL;
	return 0;
}

/* ---- tensors ----------------------------------------------------------- */

/* blk.N.<suffix>, N decimal */
static bool is_layer_tensor(const char *p, uint64_t len, const char *suffix)
{
	const uint64_t sl = strlen(suffix);
	uint64_t d = 4;

	if (len <= 4 + sl || memcmp(p, "blk.", 4) || memcmp(p + len - sl, suffix, sl))
		return false;
	while (d < len - sl && p[d] >= '0' && p[d] <= '9')
		d++;
	return d > 4 && d == len - sl;
}

/* a tensor of PowerInfer's GPU index (hyb/gguf.h) */
static bool is_gpu_index_tensor(const struct hyb_gguf_str *n)
{
	return is_layer_tensor(n->ptr, n->len, ".gpu_idx") ||
	       is_layer_tensor(n->ptr, n->len, ".gpu_bucket");
}

bool hyb_gguf_is_gpu_index(const struct hyb_gguf_file *f)
{
	if (!f || !f->n_tensors)
		return false;
	for (uint64_t i = 0; i < f->n_tensors; i++)
		if (!is_gpu_index_tensor(&f->tensors[i].name))
			return false;
	return true;
}

#define PI_TYPE_I32 18 /* PowerInfer's gguf-py (hyb/gguf.h) */

static int parse_tensor_info(struct cursor *c, struct hyb_gguf_file *f, uint64_t i)
{
	struct hyb_gguf_tensor *t = &f->tensors[i];
	const struct hyb_type_info *ti;
	uint64_t nel = 1, rb;
	int64_t j;

	c->scope = "tensor";
	c->idx = i;
	c->name = (struct hyb_gguf_str){ 0 };
	if (get_str(c, &t->name, "name"))
		return -1;
	c->name = t->name;
	j = index_add(f->tensor_index, f->tensor_mask, &f->tensors[0].name, sizeof(*t), i);
	if (j >= 0)
		return fail(c, "duplicate tensor name (also tensor %lld)", (long long)j);
	if (get_u32(c, &t->n_dims, "n_dims"))
		return -1;
	if (t->n_dims < 1 || t->n_dims > HYB_GGUF_MAX_DIMS)
		return fail(c, "n_dims %u is not in 1..%d", t->n_dims, HYB_GGUF_MAX_DIMS);
	for (uint32_t d = 0; d < HYB_GGUF_MAX_DIMS; d++) {
		t->ne[d] = 1;
		if (d >= t->n_dims)
			continue;
		if (get_u64(c, &t->ne[d], "dimension"))
			return -1;
		if (!t->ne[d] && !(t->n_dims == 1 && is_gpu_index_tensor(&t->name)))
			return fail(c, "dimension %u is 0", d);
		if (t->ne[d] > INT64_MAX)
			return fail(c, "dimension %u is negative (%lld)", d, (long long)t->ne[d]);
		if (t->ne[d] && nel > INT64_MAX / t->ne[d])
			return fail(c, "element count overflows int64 at dimension %u", d);
		nel *= t->ne[d];
	}
	if (get_u32(c, &t->type, "type"))
		return -1;
	if (t->type == PI_TYPE_I32 && is_gpu_index_tensor(&t->name))
		t->type = HYB_TYPE_I32;
	ti = hyb_type_info(t->type);
	if (!ti)
		return fail(c, "unknown tensor type %u", t->type);
	if (t->ne[0] % ti->blck)
		return fail(c, "row of %llu elements is not a multiple of the %s block size %u",
			    (ull)t->ne[0], ti->name, ti->blck);
	if (!nel) { /* an empty gpu_bucket */
		t->nbytes = 0;
		return get_u64(c, &t->offset, "data offset");
	}
	rb = hyb_row_bytes(t->type, t->ne[0]);
	if (!rb || nel / t->ne[0] > UINT64_MAX / rb)
		return fail(c, "byte size overflows");
	t->nbytes = rb * (nel / t->ne[0]);
	return get_u64(c, &t->offset, "data offset");
}

struct span {
	uint64_t off, end, idx;
};

static int span_cmp(const void *a, const void *b)
{
	const struct span *x = a, *y = b;

	if (x->off != y->off)
		return x->off < y->off ? -1 : 1;
	return x->idx < y->idx ? -1 : x->idx > y->idx; /* a stable order, for the message */
}

/* Overlap check on tensors sorted by offset: neighbours suffice. */
static int check_overlap(struct cursor *c, struct hyb_gguf_file *f)
{
	struct span *s;
	bool sorted = true;
	char a[72], b[72];
	uint64_t n = f->n_tensors;

	for (uint64_t i = 1; i < n && sorted; i++)
		sorted = f->tensors[i].offset >= f->tensors[i - 1].offset;
	s = malloc(n * sizeof(*s));
	if (!s)
		return nomem(c, "out of memory");
	for (uint64_t i = 0; i < n; i++)
		s[i] = (struct span){ f->tensors[i].offset,
				      f->tensors[i].offset + f->tensors[i].nbytes, i };
	if (!sorted)
		qsort(s, n, sizeof(*s), span_cmp);
	for (uint64_t i = 1; i < n; i++) {
		if (s[i].off < s[i - 1].end) {
			fail(c, "tensors '%s' and '%s' overlap",
			     show(a, f->tensors[s[i - 1].idx].name),
			     show(b, f->tensors[s[i].idx].name));
			free(s);
			return -1;
		}
	}
	free(s);
	return 0;
}

static int place_tensors(struct cursor *c, struct hyb_gguf_file *f)
{
	uint64_t align = f->alignment, avail;

	c->scope = NULL;
	if (c->pos > UINT64_MAX - align)
		return fail(c, "header too large");
	f->data_offset = (c->pos + align - 1) & ~(align - 1);
	if (!f->n_tensors) {
		/* Nothing to place: a metadata-only file may end right after its header. */
		if (f->data_offset > c->size)
			f->data_offset = c->size;
		return 0;
	}
	if (f->data_offset > c->size)
		return fail(c, "truncated: the data section would start at offset %llu, past the "
			    "end of the file (%llu bytes)", (ull)f->data_offset, (ull)c->size);
	avail = c->size - f->data_offset;
	for (uint64_t i = 0; i < f->n_tensors; i++) {
		struct hyb_gguf_tensor *t = &f->tensors[i];

		c->scope = "tensor";
		c->idx = i;
		c->name = t->name;
		if (t->offset & (align - 1))
			return fail(c, "data offset %llu is not aligned to %llu", (ull)t->offset,
				    (ull)align);
		if (t->offset > avail || t->nbytes > avail - t->offset)
			return fail(c, "data (%llu bytes at %llu) lies outside the file "
				    "(truncated? the data section has %llu bytes)",
				    (ull)t->nbytes, (ull)t->offset, (ull)avail);
	}
	c->scope = NULL;
	if (check_overlap(c, f))
		return -1;
	for (uint64_t i = 0; i < f->n_tensors; i++)
		f->tensors[i].data = f->base + f->data_offset + f->tensors[i].offset;
	return 0;
}

/* ---- header ------------------------------------------------------------ */

static int parse_header(struct cursor *c, struct hyb_gguf_file *f)
{
	uint32_t magic, v;

	if (get_u32(c, &magic, "magic"))
		return -1;
	if (magic != HYB_GGUF_MAGIC && magic != HYB_GGUF_MAGIC_PWRI)
		return fail(c, "bad magic 0x%08x (not a GGUF file)", magic);
	f->magic = magic;
	if (get_u32(c, &v, "version"))
		return -1;
	if (v && !(v & 0xffff))
		return fail(c, "big-endian GGUF file (version reads as 0x%08x) is not supported",
			    v);
	if (v == 1)
		return fail(c, "GGUF version 1 is not supported (it used 32-bit counts; convert "
			    "the file to version 3)");
	if (v != 2 && v != 3)
		return fail(c, "GGUF version %u is not supported (only 2 and 3)", v);
	f->version = v;
	if (get_u64(c, &f->n_tensors, "tensor count") || get_u64(c, &f->n_kv, "key-value count"))
		return -1;
	if (f->n_kv > left(c) / MIN_KV_BYTES || f->n_kv > MAX_COUNT)
		return fail(c, "key-value count %llu exceeds what the %llu bytes left can hold "
			    "(truncated or corrupt)", (ull)f->n_kv, (ull)left(c));
	if (f->n_tensors > left(c) / MIN_TENSOR_BYTES || f->n_tensors > MAX_COUNT)
		return fail(c, "tensor count %llu exceeds what the %llu bytes left can hold "
			    "(truncated or corrupt)", (ull)f->n_tensors, (ull)left(c));
	f->kv = calloc(f->n_kv ? f->n_kv : 1, sizeof(*f->kv));
	f->tensors = calloc(f->n_tensors ? f->n_tensors : 1, sizeof(*f->tensors));
	f->kv_index = index_new(f->n_kv, &f->kv_mask);
	f->tensor_index = index_new(f->n_tensors, &f->tensor_mask);
	if (!f->kv || !f->tensors || !f->kv_index || !f->tensor_index)
		return nomem(c, "out of memory");
	return 0;
}

/* Parse into *out; a negative errno with the reason in err. */
static int gguf_parse(const void *buf, uint64_t size, struct hyb_gguf_file **out, char *err,
		      size_t errlen)
{
	struct cursor c = { .buf = buf, .size = size, .err = err, .errlen = errlen };
	struct hyb_gguf_file *f;

	*out = NULL;
	err[0] = 0;
	f = calloc(1, sizeof(*f));
	if (!f) {
		nomem(&c, "out of memory");
		return c.rc;
	}
	f->base = buf;
	f->size = size;
	f->map_guard = -1;
	if (parse_header(&c, f) || parse_kvs(&c, f) || parse_alignment(&c, f)) {
		hyb_gguf_close(f);
		return c.rc;
	}
	for (uint64_t i = 0; i < f->n_tensors; i++) {
		if (parse_tensor_info(&c, f, i)) {
			hyb_gguf_close(f);
			return c.rc;
		}
	}
	if (place_tensors(&c, f)) {
		hyb_gguf_close(f);
		return c.rc;
	}
	*out = f;
	return 0;
}

int hyb_gguf_parse(const void *buf, uint64_t size, struct hyb_gguf_file **out)
{
	char msg[1024];
	int rc = gguf_parse(buf, size, out, msg, sizeof(msg));

	return rc ? hyb_error_set(rc, "%s", msg) : 0;
}

int hyb_gguf_open(const char *path, struct hyb_gguf_file **out)
{
	char sub[1024];
	struct stat st;
	void *map;
	int fd, guard, rc;

	*out = NULL;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		rc = -errno;
		return hyb_error_set(rc, "cannot open %s: %s", path, strerror(-rc));
	}
	if (fstat(fd, &st)) {
		int e = errno;

		close(fd);
		return hyb_error_set(-e, "cannot stat %s: %s", path, strerror(e));
	}
	if (!S_ISREG(st.st_mode)) {
		close(fd);
		if (S_ISDIR(st.st_mode))
			return hyb_error_set(-EISDIR, "%s: is a directory", path);
		return hyb_error_set(-EINVAL, "%s: not a regular file", path);
	}
	if (st.st_size == 0) {
		close(fd);
		return hyb_error_set(-EINVAL, "%s: empty file", path);
	}
	/* Lazy private mapping: pages come in as the tensors are touched. */
	map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	rc = -errno;
	close(fd);
	if (map == MAP_FAILED)
		return hyb_error_set(rc, "cannot map %s: %s", path, strerror(-rc));
	/* a page that cannot be read in is reported, not dumped (map_guard.h) */
	guard = hyb_map_guard_add(map, (uint64_t)st.st_size, path);
	rc = gguf_parse(map, (uint64_t)st.st_size, out, sub, sizeof(sub));
	if (rc) {
		hyb_map_guard_remove(guard);
		munmap(map, (size_t)st.st_size);
		return hyb_error_set(rc, "%s: %s", path, sub);
	}
	(*out)->map = map;
	(*out)->map_len = (uint64_t)st.st_size;
	(*out)->map_guard = guard;
	hyb_map_guard_set_gguf(guard, *out);
	return 0;
}

void hyb_gguf_close(struct hyb_gguf_file *f)
{
	if (!f)
		return;
	if (f->kv) {
		for (uint64_t i = 0; i < f->n_kv; i++)
			if (f->kv[i].type == HYB_GGUF_VT_ARRAY)
				free((void *)f->kv[i].v.arr.strs);
	}
	free(f->kv);
	free(f->tensors);
	free(f->kv_index);
	free(f->tensor_index);
	if (f->map) {
		hyb_map_guard_remove(f->map_guard);
		munmap(f->map, (size_t)f->map_len);
	}
	free(f);
}

/* ---- lookup and getters ------------------------------------------------ */

const struct hyb_gguf_kv *hyb_gguf_find(const struct hyb_gguf_file *f, const char *key)
{
	uint64_t slot;
	int64_t i;

	if (!f->n_kv)
		return NULL;
	i = index_lookup(f->kv_index, f->kv_mask, &f->kv[0].key, sizeof(f->kv[0]), key,
			 strlen(key), &slot);
	return i < 0 ? NULL : &f->kv[i];
}

const struct hyb_gguf_tensor *hyb_gguf_find_tensor(const struct hyb_gguf_file *f, const char *name)
{
	uint64_t slot;
	int64_t i;

	if (!f->n_tensors)
		return NULL;
	i = index_lookup(f->tensor_index, f->tensor_mask, &f->tensors[0].name,
			 sizeof(f->tensors[0]), name, strlen(name), &slot);
	return i < 0 ? NULL : &f->tensors[i];
}

static bool is_unsigned(uint32_t t)
{
	return t == HYB_GGUF_VT_UINT8 || t == HYB_GGUF_VT_UINT16 || t == HYB_GGUF_VT_UINT32 ||
	       t == HYB_GGUF_VT_UINT64;
}

static bool is_signed(uint32_t t)
{
	return t == HYB_GGUF_VT_INT8 || t == HYB_GGUF_VT_INT16 || t == HYB_GGUF_VT_INT32 || t == HYB_GGUF_VT_INT64;
}

bool hyb_gguf_get_u32(const struct hyb_gguf_file *f, const char *key, uint32_t *out)
{
	const struct hyb_gguf_kv *kv = hyb_gguf_find(f, key);

	if (kv && is_unsigned(kv->type) && kv->v.u64 <= UINT32_MAX) {
		*out = (uint32_t)kv->v.u64;
		return true;
	}
	if (kv && is_signed(kv->type) && kv->v.i64 >= 0 && kv->v.i64 <= (int64_t)UINT32_MAX) {
		*out = (uint32_t)kv->v.i64;
		return true;
	}
	return false;
}

bool hyb_gguf_get_i64(const struct hyb_gguf_file *f, const char *key, int64_t *out)
{
	const struct hyb_gguf_kv *kv = hyb_gguf_find(f, key);

	if (kv && is_unsigned(kv->type) && kv->v.u64 <= INT64_MAX) {
		*out = (int64_t)kv->v.u64;
		return true;
	}
	if (kv && is_signed(kv->type)) {
		*out = kv->v.i64;
		return true;
	}
	return false;
}

bool hyb_gguf_get_f32(const struct hyb_gguf_file *f, const char *key, float *out)
{
	const struct hyb_gguf_kv *kv = hyb_gguf_find(f, key);

	if (!kv || (kv->type != HYB_GGUF_VT_FLOAT32 && kv->type != HYB_GGUF_VT_FLOAT64))
		return false;
	*out = (float)kv->v.f64;
	return true;
}

bool hyb_gguf_get_bool(const struct hyb_gguf_file *f, const char *key, bool *out)
{
	const struct hyb_gguf_kv *kv = hyb_gguf_find(f, key);

	if (!kv || kv->type != HYB_GGUF_VT_BOOL)
		return false;
	*out = kv->v.b;
	return true;
}

bool hyb_gguf_get_str(const struct hyb_gguf_file *f, const char *key, char *buf, size_t cap)
{
	const struct hyb_gguf_kv *kv = hyb_gguf_find(f, key);

	if (!kv || kv->type != HYB_GGUF_VT_STRING || kv->v.str.len >= cap)
		return false;
	memcpy(buf, kv->v.str.ptr, (size_t)kv->v.str.len);
	buf[kv->v.str.len] = 0;
	return true;
}

const struct hyb_gguf_kv *hyb_gguf_get_arr(const struct hyb_gguf_file *f, const char *key, int elem_type)
{
	const struct hyb_gguf_kv *kv = hyb_gguf_find(f, key);

	if (!kv || kv->type != HYB_GGUF_VT_ARRAY)
		return NULL;
	if (elem_type >= 0 && kv->v.arr.type != (uint32_t)elem_type)
		return NULL;
	return kv;
}

bool hyb_gguf_str_eq(struct hyb_gguf_str s, const char *cstr)
{
	size_t n = strlen(cstr);

	return s.len == n && !memcmp(s.ptr, cstr, n);
}
