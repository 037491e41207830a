// SPDX-License-Identifier: MIT
/*
 * GGUF writer. Metadata values are encoded when set (so replacing a key is
 * a free + copy), tensors are laid out when the file is begun, and the
 * data goes out either all at once or streamed tensor by tensor (for tools
 * that quantize a model larger than memory). The setters cannot fail
 * visibly; their first error is kept and reported by the write. Failures
 * return a negative errno with the message in hyb_last_error().
 */
#include "hyb/gguf.h"
#include "hyb/tensor_type.h"
#include "util/error.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the GGUF writer assumes a little-endian host"
#endif

/* llama.cpp's GGML_MAX_NAME: its loader refuses longer tensor names. */
#define MAX_NAME 64

typedef unsigned long long ull;

struct wkv {
	char *key;
	uint32_t type;
	uint8_t *val; /* the value as encoded after its type field */
	size_t len;
};

struct wtensor {
	char *name;
	uint32_t type, n_dims;
	uint64_t ne[HYB_GGUF_MAX_DIMS];
	const void *data;
	uint64_t nbytes, offset;
};

struct hyb_gguf_writer {
	struct wkv *kv;
	size_t n_kv, cap_kv;
	struct wtensor *t;
	size_t n_t, cap_t;
	uint32_t version;
	char bad[200]; /* first error of a setter */
	int bad_rc;    /* its errno, negated */

	/* an open file */
	FILE *fp;
	char *path;
	/*
	 * Where the bytes go: "PATH.tmp-PID", renamed over path once complete,
	 * so a failed or interrupted write (a full disk, a kill) leaves an
	 * existing file as it was and never a truncated one under its name.
	 * NULL when path exists and is not a regular file (/dev/null, a FIFO, a
	 * symlink): written in place.
	 */
	char *tmp;
	bool regular; /* only a regular file is removed on error (never /dev/...) */
	uint64_t pos, alignment;
	size_t cur;        /* tensor whose data comes next */
	uint64_t cur_done; /* bytes of it already written */
	char werr[512];    /* first write error */
	int werr_rc;       /* its errno, negated */
};

static const uint8_t elem_size[HYB_GGUF_VT_COUNT] = {
	[HYB_GGUF_VT_UINT8] = 1, [HYB_GGUF_VT_INT8] = 1,   [HYB_GGUF_VT_UINT16] = 2,  [HYB_GGUF_VT_INT16] = 2,
	[HYB_GGUF_VT_UINT32] = 4, [HYB_GGUF_VT_INT32] = 4, [HYB_GGUF_VT_FLOAT32] = 4, [HYB_GGUF_VT_BOOL] = 1,
	[HYB_GGUF_VT_UINT64] = 8, [HYB_GGUF_VT_INT64] = 8, [HYB_GGUF_VT_FLOAT64] = 8,
};

__attribute__((format(printf, 3, 4))) static void setter_error(struct hyb_gguf_writer *w, int rc,
							       const char *fmt, ...)
{
	va_list ap;

	if (w->bad[0])
		return;
	w->bad_rc = rc;
	va_start(ap, fmt);
	vsnprintf(w->bad, sizeof(w->bad), fmt, ap);
	va_end(ap);
}

/* The first write error: kept for finish, which reports it again. */
__attribute__((format(printf, 3, 4))) static int write_error(struct hyb_gguf_writer *w, int rc,
							     const char *fmt, ...)
{
	va_list ap;

	if (w->werr[0])
		return w->werr_rc;
	w->werr_rc = rc;
	va_start(ap, fmt);
	vsnprintf(w->werr, sizeof(w->werr), fmt, ap);
	va_end(ap);
	return hyb_error_set(rc, "%s", w->werr);
}

struct hyb_gguf_writer *hyb_gguf_writer_new(void)
{
	struct hyb_gguf_writer *w = calloc(1, sizeof(*w));

	if (w)
		w->version = 3;
	return w;
}

/* The file the bytes go to (see tmp). */
static const char *target(const struct hyb_gguf_writer *w)
{
	return w->tmp ? w->tmp : w->path;
}

static void abandon(struct hyb_gguf_writer *w)
{
	if (w->fp) {
		fclose(w->fp);
		if (w->regular)
			unlink(target(w));
		w->fp = NULL;
	}
	free(w->path);
	free(w->tmp);
	w->path = NULL;
	w->tmp = NULL;
}

void hyb_gguf_writer_free(struct hyb_gguf_writer *w)
{
	if (!w)
		return;
	abandon(w);
	for (size_t i = 0; i < w->n_kv; i++) {
		free(w->kv[i].key);
		free(w->kv[i].val);
	}
	for (size_t i = 0; i < w->n_t; i++)
		free(w->t[i].name);
	free(w->kv);
	free(w->t);
	free(w);
}

void hyb_gguf_writer_set_version(struct hyb_gguf_writer *w, uint32_t version)
{
	if (version != 2 && version != 3)
		setter_error(w, -EINVAL, "GGUF version %u cannot be written (only 2 and 3)",
			     version);
	else
		w->version = version;
}

/* The alignment lives in the metadata (general.alignment), as readers expect it there. */
void hyb_gguf_writer_set_alignment(struct hyb_gguf_writer *w, uint32_t alignment)
{
	if (!alignment || (alignment & (alignment - 1)))
		setter_error(w, -EINVAL, "alignment %u is not a power of two", alignment);
	else
		hyb_gguf_set_u32(w, "general.alignment", alignment);
}

/* ---- metadata ---------------------------------------------------------- */

/* Take ownership of val (len bytes) as the value of key, replacing any earlier one. */
static void set_kv(struct hyb_gguf_writer *w, const char *key, uint32_t type, uint8_t *val, size_t len)
{
	struct wkv *kv = NULL;

	if (!val || !*key) {
		if (val)
			setter_error(w, -EINVAL, "empty key");
		else
			setter_error(w, -ENOMEM, "out of memory setting '%s'", key);
		free(val);
		return;
	}
	for (size_t i = 0; i < w->n_kv && !kv; i++)
		if (!strcmp(w->kv[i].key, key))
			kv = &w->kv[i];
	if (kv) {
		free(kv->val);
	} else {
		if (w->n_kv == w->cap_kv) {
			size_t cap = w->cap_kv ? 2 * w->cap_kv : 16;
			struct wkv *p = realloc(w->kv, cap * sizeof(*p));

			if (!p) {
				setter_error(w, -ENOMEM, "out of memory setting '%s'", key);
				free(val);
				return;
			}
			w->kv = p;
			w->cap_kv = cap;
		}
		kv = &w->kv[w->n_kv];
		kv->key = strdup(key);
		if (!kv->key) {
			setter_error(w, -ENOMEM, "out of memory setting '%s'", key);
			free(val);
			return;
		}
		w->n_kv++;
	}
	kv->type = type;
	kv->val = val;
	kv->len = len;
}

static void set_scalar(struct hyb_gguf_writer *w, const char *key, uint32_t type, const void *v)
{
	uint8_t *val = malloc(elem_size[type]);

	if (val)
		memcpy(val, v, elem_size[type]);
	set_kv(w, key, type, val, elem_size[type]);
}

#define SETTER(name, ctype, vtype)                                          \
	void hyb_gguf_set_##name(struct hyb_gguf_writer *w, const char *key, ctype v) \
	{                                                                   \
		set_scalar(w, key, vtype, &v);                              \
	}

SETTER(u8, uint8_t, HYB_GGUF_VT_UINT8)
SETTER(i8, int8_t, HYB_GGUF_VT_INT8)
SETTER(u16, uint16_t, HYB_GGUF_VT_UINT16)
SETTER(i16, int16_t, HYB_GGUF_VT_INT16)
SETTER(u32, uint32_t, HYB_GGUF_VT_UINT32)
SETTER(i32, int32_t, HYB_GGUF_VT_INT32)
SETTER(u64, uint64_t, HYB_GGUF_VT_UINT64)
SETTER(i64, int64_t, HYB_GGUF_VT_INT64)
SETTER(f32, float, HYB_GGUF_VT_FLOAT32)
SETTER(f64, double, HYB_GGUF_VT_FLOAT64)

void hyb_gguf_set_bool(struct hyb_gguf_writer *w, const char *key, bool v)
{
	uint8_t b = v;

	set_scalar(w, key, HYB_GGUF_VT_BOOL, &b);
}

static uint8_t *put_str(uint8_t *p, const char *s, uint64_t len)
{
	memcpy(p, &len, 8);
	memcpy(p + 8, s, len);
	return p + 8 + len;
}

void hyb_gguf_set_str(struct hyb_gguf_writer *w, const char *key, const char *v)
{
	size_t len = strlen(v);
	uint8_t *val = malloc(8 + len);

	if (val)
		put_str(val, v, len);
	set_kv(w, key, HYB_GGUF_VT_STRING, val, 8 + len);
}

void hyb_gguf_set_arr(struct hyb_gguf_writer *w, const char *key, uint32_t elem_type, const void *data,
		  uint64_t n)
{
	uint8_t *val;
	uint64_t bytes;

	if (elem_type >= HYB_GGUF_VT_COUNT || !elem_size[elem_type]) {
		setter_error(w, -EINVAL, "'%s': hyb_gguf_set_arr takes scalar elements, not %s",
			     key, hyb_gguf_vtype_name(elem_type));
		return;
	}
	if (n > (SIZE_MAX - 12) / elem_size[elem_type]) {
		setter_error(w, -EINVAL, "'%s': array of %llu elements is too large", key, (ull)n);
		return;
	}
	bytes = n * elem_size[elem_type];
	val = malloc(12 + bytes);
	if (val) {
		memcpy(val, &elem_type, 4);
		memcpy(val + 4, &n, 8);
		if (bytes)
			memcpy(val + 12, data, bytes);
	}
	set_kv(w, key, HYB_GGUF_VT_ARRAY, val, 12 + bytes);
}

void hyb_gguf_set_arr_str(struct hyb_gguf_writer *w, const char *key, const char *const *strs, uint64_t n)
{
	uint32_t et = HYB_GGUF_VT_STRING;
	size_t len = 12;
	uint8_t *val, *p;

	for (uint64_t i = 0; i < n; i++)
		len += 8 + strlen(strs[i]);
	val = malloc(len);
	if (val) {
		memcpy(val, &et, 4);
		memcpy(val + 4, &n, 8);
		p = val + 12;
		for (uint64_t i = 0; i < n; i++)
			p = put_str(p, strs[i], strlen(strs[i]));
	}
	set_kv(w, key, HYB_GGUF_VT_ARRAY, val, len);
}

/* ---- tensors ----------------------------------------------------------- */

int hyb_gguf_writer_add_tensor(struct hyb_gguf_writer *w, const char *name, uint32_t type,
			   uint32_t n_dims, const uint64_t *ne, const void *data)
{
	struct wtensor *t;
	uint64_t rows = 1, rb;

	if (w->fp)
		return hyb_error_set(-EINVAL, "tensor '%s' declared while %s is being written",
				     name, w->path);
	if (n_dims < 1 || n_dims > HYB_GGUF_MAX_DIMS)
		return hyb_error_set(-EINVAL, "tensor '%s': n_dims %u is not in 1..%d", name,
				     n_dims, HYB_GGUF_MAX_DIMS);
	if (strlen(name) >= MAX_NAME)
		return hyb_error_set(-ENAMETOOLONG, "tensor '%s': a name of %zu bytes (llama.cpp "
				     "takes at most %d)", name, strlen(name), MAX_NAME - 1);
	for (size_t i = 0; i < w->n_t; i++)
		if (!strcmp(w->t[i].name, name))
			return hyb_error_set(-EEXIST, "tensor '%s' declared twice", name);
	for (uint32_t d = 1; d < n_dims; d++) {
		if (!ne[d] || ne[d] > INT64_MAX / rows)
			return hyb_error_set(-EINVAL, "tensor '%s': dimension %u is %llu", name, d,
					     (ull)ne[d]);
		rows *= ne[d];
	}
	rb = hyb_row_bytes(type, ne[0]);
	if (!ne[0] || ne[0] > INT64_MAX / rows || !rb || rows > UINT64_MAX / 2 / rb)
		return hyb_error_set(-EINVAL, "tensor '%s': type %u cannot hold rows of %llu "
				     "elements (%llu rows)", name, type, (ull)ne[0], (ull)rows);
	if (w->n_t == w->cap_t) {
		size_t cap = w->cap_t ? 2 * w->cap_t : 64;
		struct wtensor *p = realloc(w->t, cap * sizeof(*p));

		if (!p)
			return hyb_error_set(-ENOMEM, "tensor '%s': out of memory", name);
		w->t = p;
		w->cap_t = cap;
	}
	t = &w->t[w->n_t];
	*t = (struct wtensor){ .name = strdup(name), .type = type, .n_dims = n_dims,
			       .data = data, .nbytes = rb * rows };
	if (!t->name)
		return hyb_error_set(-ENOMEM, "tensor '%s': out of memory", name);
	for (uint32_t d = 0; d < HYB_GGUF_MAX_DIMS; d++)
		t->ne[d] = d < n_dims ? ne[d] : 1;
	w->n_t++;
	return 0;
}

/* ---- output ------------------------------------------------------------ */

static int wr(struct hyb_gguf_writer *w, const void *p, uint64_t n)
{
	if (w->werr[0])
		return w->werr_rc;
	if (n && fwrite(p, 1, n, w->fp) != n) {
		int e = errno ? errno : EIO;

		return write_error(w, -e, "%s: write failed: %s", w->path, strerror(e));
	}
	w->pos += n;
	return 0;
}

static int wr_u32(struct hyb_gguf_writer *w, uint32_t v)
{
	return wr(w, &v, 4);
}

static int wr_u64(struct hyb_gguf_writer *w, uint64_t v)
{
	return wr(w, &v, 8);
}

static int pad(struct hyb_gguf_writer *w)
{
	static const uint8_t zeros[256];
	uint64_t n = (w->alignment - w->pos % w->alignment) % w->alignment;

	while (n) {
		uint64_t k = n < sizeof(zeros) ? n : sizeof(zeros);

		int rc = wr(w, zeros, k);

		if (rc)
			return rc;
		n -= k;
	}
	return 0;
}

/* Write the data of the tensors that were given it, up to the next one to be streamed. */
static int write_given(struct hyb_gguf_writer *w)
{
	while (w->cur < w->n_t && w->t[w->cur].data) {
		int rc = wr(w, w->t[w->cur].data, w->t[w->cur].nbytes);

		if (rc || (rc = pad(w)))
			return rc;
		w->cur++;
	}
	return 0;
}

/* Alignment from general.alignment, then every tensor's offset. */
static int layout(struct hyb_gguf_writer *w, const char *path)
{
	uint64_t off = 0;

	w->alignment = HYB_GGUF_DEFAULT_ALIGNMENT;
	for (size_t i = 0; i < w->n_kv; i++) {
		if (strcmp(w->kv[i].key, "general.alignment"))
			continue;
		if (w->kv[i].type == HYB_GGUF_VT_UINT32) {
			uint32_t a;

			memcpy(&a, w->kv[i].val, 4);
			if (a && !(a & (a - 1))) {
				w->alignment = a;
				break;
			}
		}
		return hyb_error_set(-EINVAL, "%s: general.alignment must be a UINT32 power of two",
				     path);
	}
	for (size_t i = 0; i < w->n_t; i++) {
		uint64_t padded = (w->t[i].nbytes + w->alignment - 1) & ~(w->alignment - 1);

		if (off > UINT64_MAX / 2 - padded)
			return hyb_error_set(-EFBIG, "%s: tensor data too large", path);
		w->t[i].offset = off;
		off += padded;
	}
	return 0;
}

static int write_header(struct hyb_gguf_writer *w)
{
	wr_u32(w, HYB_GGUF_MAGIC);
	wr_u32(w, w->version);
	wr_u64(w, w->n_t);
	wr_u64(w, w->n_kv);
	for (size_t i = 0; i < w->n_kv; i++) {
		uint64_t klen = strlen(w->kv[i].key);

		wr_u64(w, klen);
		wr(w, w->kv[i].key, klen);
		wr_u32(w, w->kv[i].type);
		wr(w, w->kv[i].val, w->kv[i].len);
	}
	for (size_t i = 0; i < w->n_t; i++) {
		const struct wtensor *t = &w->t[i];
		uint64_t nlen = strlen(t->name);

		wr_u64(w, nlen);
		wr(w, t->name, nlen);
		wr_u32(w, t->n_dims);
		wr(w, t->ne, 8ull * t->n_dims);
		wr_u32(w, t->type);
		wr_u64(w, t->offset);
	}
	return pad(w);
}

int hyb_gguf_writer_begin(struct hyb_gguf_writer *w, const char *path)
{
	struct stat st;
	int fd, rc;

	if (w->fp)
		return hyb_error_set(-EBUSY, "%s: a file is already being written (%s)", path,
				     w->path);
	if (w->bad[0])
		return hyb_error_set(w->bad_rc, "%s: %s", path, w->bad);
	rc = layout(w, path);
	if (rc)
		return rc;
	w->path = strdup(path);
	if (!w->path)
		return hyb_error_set(-ENOMEM, "%s: out of memory", path);
	if (lstat(path, &st) ? errno == ENOENT : S_ISREG(st.st_mode)) {
		const size_t n = strlen(path) + 32;

		w->tmp = malloc(n);
		if (!w->tmp) {
			abandon(w);
			return hyb_error_set(-ENOMEM, "%s: out of memory", path);
		}
		snprintf(w->tmp, n, "%s.tmp-%d", path, (int)getpid());
	}
	fd = open(target(w), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		rc = hyb_error_set(-errno, "cannot create %s: %s", target(w), strerror(errno));
		abandon(w);
		return rc;
	}
	w->regular = !fstat(fd, &st) && S_ISREG(st.st_mode);
	w->fp = fdopen(fd, "wb");
	if (!w->fp) {
		rc = hyb_error_set(-errno, "cannot create %s: %s", target(w), strerror(errno));
		close(fd);
		if (w->regular)
			unlink(target(w));
		abandon(w);
		return rc;
	}
	setvbuf(w->fp, NULL, _IOFBF, 1 << 20);
	w->pos = 0;
	w->cur = 0;
	w->cur_done = 0;
	w->werr[0] = 0;
	w->werr_rc = 0;
	rc = write_header(w);
	if (rc || (rc = write_given(w))) {
		abandon(w);	/* wr set the message */
		return rc;
	}
	return 0;
}

int hyb_gguf_writer_put_data(struct hyb_gguf_writer *w, const void *data, uint64_t nbytes)
{
	struct wtensor *t;
	int rc;

	if (!w->fp)
		return hyb_error_set(-EINVAL, "gguf_writer_put_data: no file is being written");
	if (w->werr[0])
		return hyb_error_set(w->werr_rc, "%s", w->werr);
	if (w->cur >= w->n_t)
		return write_error(w, -EINVAL, "%s: data put after the last tensor", w->path);
	t = &w->t[w->cur];
	if (nbytes > t->nbytes - w->cur_done)
		return write_error(w, -EINVAL,
				   "%s: %llu bytes put for tensor '%s', which has %llu bytes left",
				   w->path, (ull)nbytes, t->name, (ull)(t->nbytes - w->cur_done));
	rc = wr(w, data, nbytes);
	if (rc)
		return rc;
	w->cur_done += nbytes;
	if (w->cur_done < t->nbytes)
		return 0;
	w->cur++;
	w->cur_done = 0;
	rc = pad(w);
	return rc ? rc : write_given(w);
}

int hyb_gguf_writer_finish(struct hyb_gguf_writer *w)
{
	FILE *fp = w->fp;
	int rc;

	if (!fp)
		return hyb_error_set(-EINVAL, "gguf_writer_finish: no file is being written");
	if (!w->werr[0] && w->cur < w->n_t)
		write_error(w, -EINVAL, "%s: the data of tensor '%s' is missing", w->path,
			    w->t[w->cur].name);
	if (w->werr[0]) {
		rc = hyb_error_set(w->werr_rc, "%s", w->werr);
		abandon(w);
		return rc;
	}
	/*
	 * Buffered bytes meet ENOSPC/EFBIG only now. A file that will replace
	 * PATH is on disk before the rename, so a crash leaves the old file or
	 * the whole new one.
	 */
	w->fp = NULL;
	if (fflush(fp) || ferror(fp) || (w->tmp && fsync(fileno(fp)))) {
		int e = errno ? errno : EIO;

		rc = hyb_error_set(-e, "%s: write failed: %s", w->path, strerror(e));
		w->fp = fp;
		abandon(w);
		return rc;
	}
	if (fclose(fp)) {
		rc = hyb_error_set(-errno, "%s: write failed: %s", w->path, strerror(errno));
		if (w->regular)
			unlink(target(w));
		abandon(w);
		return rc;
	}
	if (w->tmp && rename(w->tmp, w->path)) {
		rc = hyb_error_set(-errno, "cannot rename %s to %s: %s", w->tmp, w->path,
				   strerror(errno));
		unlink(w->tmp);
		abandon(w);
		return rc;
	}
	abandon(w); /* only frees the names now */
	return 0;
}

int hyb_gguf_writer_write_file(struct hyb_gguf_writer *w, const char *path)
{
	int rc;

	for (size_t i = 0; i < w->n_t; i++) {
		if (!w->t[i].data)
			return hyb_error_set(-EINVAL, "%s: tensor '%s' has no data (give it to "
					     "gguf_writer_add_tensor or stream it)", path,
					     w->t[i].name);
	}
	rc = hyb_gguf_writer_begin(w, path);
	return rc ? rc : hyb_gguf_writer_finish(w);
}

void hyb_gguf_writer_copy_kv(struct hyb_gguf_writer *w, const struct hyb_gguf_kv *kv)
{
	char key[256];

	snprintf(key, sizeof(key), "%.*s", (int)kv->key.len, kv->key.ptr);
	switch (kv->type) {
	case HYB_GGUF_VT_UINT8:
		hyb_gguf_set_u8(w, key, (uint8_t)kv->v.u64);
		break;
	case HYB_GGUF_VT_INT8:
		hyb_gguf_set_i8(w, key, (int8_t)kv->v.i64);
		break;
	case HYB_GGUF_VT_UINT16:
		hyb_gguf_set_u16(w, key, (uint16_t)kv->v.u64);
		break;
	case HYB_GGUF_VT_INT16:
		hyb_gguf_set_i16(w, key, (int16_t)kv->v.i64);
		break;
	case HYB_GGUF_VT_UINT32:
		hyb_gguf_set_u32(w, key, (uint32_t)kv->v.u64);
		break;
	case HYB_GGUF_VT_INT32:
		hyb_gguf_set_i32(w, key, (int32_t)kv->v.i64);
		break;
	case HYB_GGUF_VT_UINT64:
		hyb_gguf_set_u64(w, key, kv->v.u64);
		break;
	case HYB_GGUF_VT_INT64:
		hyb_gguf_set_i64(w, key, kv->v.i64);
		break;
	case HYB_GGUF_VT_FLOAT32:
		hyb_gguf_set_f32(w, key, (float)kv->v.f64);
		break;
	case HYB_GGUF_VT_FLOAT64:
		hyb_gguf_set_f64(w, key, kv->v.f64);
		break;
	case HYB_GGUF_VT_BOOL:
		hyb_gguf_set_bool(w, key, kv->v.b);
		break;
	case HYB_GGUF_VT_STRING: {
		char *s = strndup(kv->v.str.ptr, kv->v.str.len);

		if (s)
			hyb_gguf_set_str(w, key, s);
		free(s);
		break;
	}
	case HYB_GGUF_VT_ARRAY:
		if (kv->v.arr.type == HYB_GGUF_VT_STRING) {
			char **s = calloc(kv->v.arr.n ? kv->v.arr.n : 1, sizeof(*s));

			for (uint64_t i = 0; s && i < kv->v.arr.n; i++)
				s[i] = strndup(kv->v.arr.strs[i].ptr, kv->v.arr.strs[i].len);
			if (s)
				hyb_gguf_set_arr_str(w, key, (const char *const *)s, kv->v.arr.n);
			for (uint64_t i = 0; s && i < kv->v.arr.n; i++)
				free(s[i]);
			free(s);
		} else {
			hyb_gguf_set_arr(w, key, kv->v.arr.type, kv->v.arr.data, kv->v.arr.n);
		}
		break;
	}
}
