// SPDX-License-Identifier: MIT
/*
 * GGUF reader and writer: round trips of every metadata type, the real tiny
 * model, and a malformed file for every class of error the reader knows
 * (each must be refused with a message naming the problem, never crash).
 */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "hyb/gguf.h"
#include "hyb/tensor_type.h"
#include "test.h"

/* ---- helpers ------------------------------------------------------------ */

static const char *tmp_path(const char *name)
{
	static char buf[4][512];
	static int k;

	k = (k + 1) % 4;
	snprintf(buf[k], sizeof(buf[k]), "%s/%s", hyb_test_tmpdir(), name);
	return buf[k];
}

static uint8_t *slurp(const char *path, size_t *n)
{
	FILE *fp = fopen(path, "rb");
	uint8_t *p;
	long len;

	CHECK_MSG(fp, "cannot open %s", path);
	fseek(fp, 0, SEEK_END);
	len = ftell(fp);
	fseek(fp, 0, SEEK_SET);
	p = malloc(len ? (size_t)len : 1);
	CHECK(p && fread(p, 1, (size_t)len, fp) == (size_t)len);
	fclose(fp);
	*n = (size_t)len;
	return p;
}

static void write_ok(struct hyb_gguf_writer *w, const char *path)
{
	CHECK_MSG(!hyb_gguf_writer_write_file(w, path), "write failed: %s", hyb_last_error());
}

static struct hyb_gguf_file *open_ok(const char *path)
{
	struct hyb_gguf_file *f;

	CHECK_MSG(!hyb_gguf_open(path, &f), "open failed: %s", hyb_last_error());
	return f;
}

static void fill(uint8_t *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(i * 131 + seed * 17 + (i >> 8));
}

/* A byte builder for hand-made (often malformed) files. */
struct bb {
	uint8_t p[8192];
	size_t n;
};

static void bb_raw(struct bb *b, const void *p, size_t n)
{
	CHECK(b->n + n <= sizeof(b->p));
	memcpy(b->p + b->n, p, n);
	b->n += n;
}

static void bb_u32(struct bb *b, uint32_t v)
{
	bb_raw(b, &v, 4);
}

static void bb_u64(struct bb *b, uint64_t v)
{
	bb_raw(b, &v, 8);
}

static void bb_str(struct bb *b, const char *s)
{
	bb_u64(b, strlen(s));
	bb_raw(b, s, strlen(s));
}

static void bb_hdr(struct bb *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
	b->n = 0;
	bb_u32(b, HYB_GGUF_MAGIC);
	bb_u32(b, version);
	bb_u64(b, n_tensors);
	bb_u64(b, n_kv);
}

static void bb_kv_u32(struct bb *b, const char *key, uint32_t v)
{
	bb_str(b, key);
	bb_u32(b, HYB_GGUF_VT_UINT32);
	bb_u32(b, v);
}

static void bb_tensor(struct bb *b, const char *name, uint32_t n_dims, const uint64_t *ne,
		      uint32_t type, uint64_t offset)
{
	bb_str(b, name);
	bb_u32(b, n_dims);
	for (uint32_t i = 0; i < n_dims; i++)
		bb_u64(b, ne[i]);
	bb_u32(b, type);
	bb_u64(b, offset);
}

/* Pad to `align` and append `n` data bytes. */
static void bb_data(struct bb *b, size_t align, size_t n)
{
	uint8_t z[256] = { 0 };

	while (b->n % align)
		bb_raw(b, z, 1);
	while (n) {
		size_t k = n < sizeof(z) ? n : sizeof(z);

		bb_raw(b, z, k);
		n -= k;
	}
}

/* Parse must fail with -EINVAL and a message containing `word`. */
#define REFUSED(b, word) refused(b, word, __LINE__)

static void refused(const struct bb *b, const char *word, int line)
{
	struct hyb_gguf_file *f = NULL;
	uint8_t *copy = malloc(b->n ? b->n : 1); /* exact size, for ASan/valgrind */
	int rc;

	memcpy(copy, b->p, b->n);
	rc = hyb_gguf_parse(copy, b->n, &f);
	if (!rc)
		hyb_test_fail(__FILE__, line, "malformed file accepted (expected '%s')", word);
	else if (rc != -EINVAL)
		hyb_test_fail(__FILE__, line, "refused with %d, not -EINVAL", rc);
	if (!strstr(hyb_last_error(), word))
		hyb_test_fail(__FILE__, line, "message '%s' lacks '%s'", hyb_last_error(), word);
	CHECK(f == NULL);
	free(copy);
}

static void accepted(const struct bb *b)
{
	struct hyb_gguf_file *f;

	CHECK_MSG(!hyb_gguf_parse(b->p, b->n, &f), "refused: %s", hyb_last_error());
	hyb_gguf_close(f);
}

/* ---- round trips --------------------------------------------------------- */

TEST(gguf_roundtrip_scalars)
{
	struct hyb_gguf_writer *w = hyb_gguf_writer_new();
	const char *path = tmp_path("s.gguf");
	const struct hyb_gguf_kv *kv;
	struct hyb_gguf_file *f;
	char s[64];
	uint32_t u;
	int64_t i;
	float x;
	bool b;

	hyb_gguf_set_u8(w, "u8", 250);
	hyb_gguf_set_i8(w, "i8", -128);
	hyb_gguf_set_u16(w, "u16", 65535);
	hyb_gguf_set_i16(w, "i16", -32768);
	hyb_gguf_set_u32(w, "u32", 4294967295u);
	hyb_gguf_set_i32(w, "i32", -2147483647 - 1);
	hyb_gguf_set_u64(w, "u64", UINT64_MAX);
	hyb_gguf_set_i64(w, "i64", INT64_MIN);
	hyb_gguf_set_f32(w, "f32", 1e-5f);
	hyb_gguf_set_f64(w, "f64", 3.141592653589793);
	hyb_gguf_set_bool(w, "bool", true);
	hyb_gguf_set_bool(w, "false", false);
	hyb_gguf_set_str(w, "str", "h\xc3\xa9llo \t world");
	hyb_gguf_set_str(w, "empty", "");
	hyb_gguf_set_i32(w, "neg", -1);
	hyb_gguf_set_u64(w, "small64", 7);
	write_ok(w, path);
	hyb_gguf_writer_free(w);

	f = open_ok(path);
	CHECK_EQ_INT(f->version, 3);
	CHECK_EQ_INT(f->n_kv, 16);
	CHECK_EQ_INT(f->n_tensors, 0);
	CHECK(hyb_gguf_str_eq(f->kv[0].key, "u8") && hyb_gguf_str_eq(f->kv[15].key, "small64"));
	kv = hyb_gguf_find(f, "u8");
	CHECK(kv && kv->type == HYB_GGUF_VT_UINT8 && kv->v.u64 == 250);
	CHECK(hyb_gguf_find(f, "i8")->v.i64 == -128 && hyb_gguf_find(f, "i8")->type == HYB_GGUF_VT_INT8);
	CHECK(hyb_gguf_find(f, "u16")->v.u64 == 65535);
	CHECK(hyb_gguf_find(f, "i16")->v.i64 == -32768);
	CHECK(hyb_gguf_find(f, "u32")->v.u64 == 4294967295u);
	CHECK(hyb_gguf_find(f, "i32")->v.i64 == INT32_MIN);
	CHECK(hyb_gguf_find(f, "u64")->v.u64 == UINT64_MAX);
	CHECK(hyb_gguf_find(f, "i64")->v.i64 == INT64_MIN);
	CHECK(hyb_gguf_find(f, "f32")->v.f64 == (double)1e-5f);
	CHECK(hyb_gguf_find(f, "f64")->v.f64 == 3.141592653589793);
	CHECK(hyb_gguf_find(f, "bool")->v.b && !hyb_gguf_find(f, "false")->v.b);
	CHECK(hyb_gguf_str_eq(hyb_gguf_find(f, "str")->v.str, "h\xc3\xa9llo \t world"));
	CHECK(hyb_gguf_find(f, "empty")->v.str.len == 0);
	CHECK(!hyb_gguf_find(f, "nope") && !hyb_gguf_find(f, "u") && !hyb_gguf_find(f, "u88"));

	/* getters: widening and range checks */
	CHECK(hyb_gguf_get_u32(f, "u8", &u) && u == 250);
	CHECK(hyb_gguf_get_u32(f, "u32", &u) && u == 4294967295u);
	CHECK(hyb_gguf_get_u32(f, "small64", &u) && u == 7);
	CHECK(!hyb_gguf_get_u32(f, "u64", &u));
	CHECK(!hyb_gguf_get_u32(f, "neg", &u));
	CHECK(!hyb_gguf_get_u32(f, "f32", &u));
	CHECK(!hyb_gguf_get_u32(f, "nope", &u));
	CHECK(hyb_gguf_get_i64(f, "i8", &i) && i == -128);
	CHECK(hyb_gguf_get_i64(f, "i64", &i) && i == INT64_MIN);
	CHECK(hyb_gguf_get_i64(f, "u32", &i) && i == 4294967295ll);
	CHECK(!hyb_gguf_get_i64(f, "u64", &i));
	CHECK(!hyb_gguf_get_i64(f, "str", &i));
	CHECK(hyb_gguf_get_f32(f, "f32", &x) && x == 1e-5f);
	CHECK(hyb_gguf_get_f32(f, "f64", &x) && x == (float)3.141592653589793);
	CHECK(!hyb_gguf_get_f32(f, "u8", &x));
	CHECK(hyb_gguf_get_bool(f, "bool", &b) && b);
	CHECK(!hyb_gguf_get_bool(f, "u8", &b));
	CHECK(hyb_gguf_get_str(f, "str", s, sizeof(s)) && !strcmp(s, "h\xc3\xa9llo \t world"));
	CHECK(hyb_gguf_get_str(f, "empty", s, 1) && !s[0]);
	CHECK(!hyb_gguf_get_str(f, "str", s, 14)); /* 14 bytes + NUL do not fit */
	CHECK(hyb_gguf_get_str(f, "str", s, 15));
	CHECK(!hyb_gguf_get_str(f, "u8", s, sizeof(s)));
	CHECK(!hyb_gguf_get_arr(f, "u8", -1));
	CHECK(!strcmp(hyb_gguf_vtype_name(HYB_GGUF_VT_FLOAT64), "FLOAT64"));
	hyb_gguf_close(f);
}

TEST(gguf_roundtrip_arrays)
{
	static const uint32_t types[] = {
		HYB_GGUF_VT_UINT8,	HYB_GGUF_VT_INT8,  HYB_GGUF_VT_UINT16, HYB_GGUF_VT_INT16,
		HYB_GGUF_VT_UINT32, HYB_GGUF_VT_INT32, HYB_GGUF_VT_FLOAT32, HYB_GGUF_VT_BOOL,
		HYB_GGUF_VT_UINT64, HYB_GGUF_VT_INT64, HYB_GGUF_VT_FLOAT64,
	};
	static const uint8_t sizes[] = { 1, 1, 2, 2, 4, 4, 4, 1, 8, 8, 8 };
	const char *strs[] = { "<unk>", "", "\xe2\x96\x81the", "a\0b", "last" };
	struct hyb_gguf_writer *w = hyb_gguf_writer_new();
	const char *path = tmp_path("a.gguf");
	uint8_t data[11][40];
	const struct hyb_gguf_kv *kv;
	struct hyb_gguf_file *f;
	char key[32];

	for (int t = 0; t < 11; t++) {
		fill(data[t], sizeof(data[t]), (unsigned)t);
		if (types[t] == HYB_GGUF_VT_BOOL)
			for (int j = 0; j < 40; j++)
				data[t][j] &= 1;
		snprintf(key, sizeof(key), "arr.%s", hyb_gguf_vtype_name(types[t]));
		hyb_gguf_set_arr(w, key, types[t], data[t], 40 / sizes[t]);
		snprintf(key, sizeof(key), "empty.%s", hyb_gguf_vtype_name(types[t]));
		hyb_gguf_set_arr(w, key, types[t], NULL, 0);
	}
	hyb_gguf_set_arr_str(w, "arr.STRING", strs, 5);
	hyb_gguf_set_arr_str(w, "empty.STRING", strs, 0);
	write_ok(w, path);
	hyb_gguf_writer_free(w);

	f = open_ok(path);
	CHECK_EQ_INT(f->n_kv, 24);
	for (int t = 0; t < 11; t++) {
		snprintf(key, sizeof(key), "arr.%s", hyb_gguf_vtype_name(types[t]));
		kv = hyb_gguf_get_arr(f, key, (int)types[t]);
		CHECK_MSG(kv, "%s", key);
		CHECK_EQ_INT(kv->v.arr.n, 40 / sizes[t]);
		CHECK(!memcmp(kv->v.arr.data, data[t], 40));
		CHECK(!hyb_gguf_get_arr(f, key, (int)types[(t + 1) % 11]));
		CHECK(hyb_gguf_get_arr(f, key, -1) == kv);
		snprintf(key, sizeof(key), "empty.%s", hyb_gguf_vtype_name(types[t]));
		kv = hyb_gguf_get_arr(f, key, (int)types[t]);
		CHECK_MSG(kv && kv->v.arr.n == 0, "%s", key);
	}
	kv = hyb_gguf_get_arr(f, "arr.STRING", HYB_GGUF_VT_STRING);
	CHECK(kv && kv->v.arr.n == 5);
	CHECK(hyb_gguf_str_eq(kv->v.arr.strs[0], "<unk>"));
	CHECK(kv->v.arr.strs[1].len == 0);
	CHECK(hyb_gguf_str_eq(kv->v.arr.strs[2], "\xe2\x96\x81the"));
	CHECK(hyb_gguf_str_eq(kv->v.arr.strs[3], "a")); /* C strings end at the NUL */
	CHECK(hyb_gguf_str_eq(kv->v.arr.strs[4], "last"));
	kv = hyb_gguf_get_arr(f, "empty.STRING", HYB_GGUF_VT_STRING);
	CHECK(kv && kv->v.arr.n == 0);
	hyb_gguf_close(f);
}

TEST(gguf_replace_keeps_order)
{
	struct hyb_gguf_writer *w = hyb_gguf_writer_new();
	const char *path = tmp_path("r.gguf");
	struct hyb_gguf_file *f;

	hyb_gguf_set_u32(w, "a", 1);
	hyb_gguf_set_str(w, "b", "x");
	hyb_gguf_set_str(w, "a", "now a string");
	hyb_gguf_set_u8(w, "c", 3);
	hyb_gguf_set_u8(w, "b", 9);
	write_ok(w, path);
	hyb_gguf_writer_free(w);
	f = open_ok(path);
	CHECK_EQ_INT(f->n_kv, 3);
	CHECK(hyb_gguf_str_eq(f->kv[0].key, "a") && hyb_gguf_str_eq(f->kv[0].v.str, "now a string"));
	CHECK(hyb_gguf_str_eq(f->kv[1].key, "b") && f->kv[1].type == HYB_GGUF_VT_UINT8);
	CHECK(f->kv[1].v.u64 == 9);
	CHECK(hyb_gguf_str_eq(f->kv[2].key, "c"));
	hyb_gguf_close(f);
}

/* Tensors of several types and ranks; v2/v3; default and custom alignment. */
static void tensors_roundtrip(uint32_t version, uint32_t align)
{
	static const struct {
		const char *name;
		uint32_t type, n_dims;
		uint64_t ne[4];
	} ts[] = {
		{ "f32", HYB_TYPE_F32, 2, { 7, 3 } },
		{ "f16", HYB_TYPE_F16, 1, { 5 } },
		{ "q4_0", HYB_TYPE_Q4_0, 2, { 64, 3 } },
		{ "q8_0", HYB_TYPE_Q8_0, 3, { 32, 2, 2 } },
		{ "q4_k", HYB_TYPE_Q4_K, 2, { 256, 2 } },
		{ "q6_k", HYB_TYPE_Q6_K, 4, { 256, 1, 1, 2 } },
		{ "bf16", HYB_TYPE_BF16, 4, { 3, 1, 2, 1 } },
	};
	struct hyb_gguf_writer *w = hyb_gguf_writer_new();
	const char *path = tmp_path("t.gguf");
	static uint8_t data[7][2048];
	struct hyb_gguf_file *f;

	if (version)
		hyb_gguf_writer_set_version(w, version);
	if (align)
		hyb_gguf_writer_set_alignment(w, align);
	hyb_gguf_set_str(w, "general.architecture", "test");
	for (int i = 0; i < 7; i++) {
		fill(data[i], sizeof(data[i]), (unsigned)i + 100);
		CHECK(!hyb_gguf_writer_add_tensor(w, ts[i].name, ts[i].type, ts[i].n_dims, ts[i].ne,
					      data[i]));
	}
	write_ok(w, path);
	hyb_gguf_writer_free(w);

	f = open_ok(path);
	CHECK_EQ_INT(f->version, version ? version : 3);
	CHECK_EQ_INT(f->alignment, align ? align : 32);
	CHECK_EQ_INT(f->n_tensors, 7);
	CHECK_EQ_INT(f->data_offset % f->alignment, 0);
	for (int i = 0; i < 7; i++) {
		const struct hyb_gguf_tensor *t = hyb_gguf_find_tensor(f, ts[i].name);
		uint64_t rows = 1;

		CHECK_MSG(t == &f->tensors[i], "%s", ts[i].name);
		CHECK_EQ_INT(t->type, ts[i].type);
		CHECK_EQ_INT(t->n_dims, ts[i].n_dims);
		for (int d = 0; d < 4; d++) {
			CHECK_EQ_INT(t->ne[d], d < (int)ts[i].n_dims ? ts[i].ne[d] : 1);
			rows *= d ? t->ne[d] : 1;
		}
		CHECK_EQ_INT(t->nbytes, hyb_row_bytes(t->type, t->ne[0]) * rows);
		CHECK(t->nbytes <= sizeof(data[i]));
		CHECK_EQ_INT(t->offset % f->alignment, 0);
		CHECK((const uint8_t *)t->data == f->base + f->data_offset + t->offset);
		CHECK(!memcmp(t->data, data[i], t->nbytes));
	}
	CHECK(!hyb_gguf_find_tensor(f, "f3") && !hyb_gguf_find_tensor(f, "q4_00"));
	hyb_gguf_close(f);
}

TEST(gguf_roundtrip_tensors_v3)
{
	tensors_roundtrip(0, 0);
}

TEST(gguf_roundtrip_tensors_v2_align64)
{
	tensors_roundtrip(2, 64);
}

TEST(gguf_roundtrip_tensors_align1_and_4096)
{
	tensors_roundtrip(3, 1);
	tensors_roundtrip(3, 4096);
}

/* ---- the streaming writer ------------------------------------------------ */

TEST(gguf_stream_writer)
{
	static uint8_t a[4096], b[300 * 4], c[34 * 8];
	const uint64_t ne_a[2] = { 32, 32 }, ne_b[1] = { 300 }, ne_c[2] = { 64, 4 };
	const char *p1 = tmp_path("whole.gguf"), *p2 = tmp_path("stream.gguf");
	struct hyb_gguf_writer *w;
	uint8_t *x, *y;
	size_t nx, ny;

	fill(a, sizeof(a), 1);
	fill(b, sizeof(b), 2);
	fill(c, sizeof(c), 3);
	for (int pass = 0; pass < 2; pass++) {
		bool stream = pass == 1;

		w = hyb_gguf_writer_new();
		hyb_gguf_set_str(w, "general.name", "stream");
		hyb_gguf_writer_set_alignment(w, 64);
		CHECK(!hyb_gguf_writer_add_tensor(w, "a", HYB_TYPE_F32, 2, ne_a, stream ? NULL : a));
		CHECK(!hyb_gguf_writer_add_tensor(w, "b", HYB_TYPE_F32, 1, ne_b, b)); /* given */
		CHECK(!hyb_gguf_writer_add_tensor(w, "c", HYB_TYPE_Q8_0, 2, ne_c, stream ? NULL : c));
		if (!stream) {
			write_ok(w, p1);
		} else {
			CHECK_MSG(!hyb_gguf_writer_begin(w, p2), "%s", hyb_last_error());
			/* a in uneven chunks, b written by itself, c in one go */
			CHECK(!hyb_gguf_writer_put_data(w, a, 1000));
			CHECK(!hyb_gguf_writer_put_data(w, a + 1000, 0));
			CHECK(!hyb_gguf_writer_put_data(w, a + 1000, 3096));
			CHECK(!hyb_gguf_writer_put_data(w, c, sizeof(c)));
			CHECK_MSG(!hyb_gguf_writer_finish(w), "%s", hyb_last_error());
		}
		hyb_gguf_writer_free(w);
	}
	x = slurp(p1, &nx);
	y = slurp(p2, &ny);
	CHECK_EQ_INT(nx, ny);
	CHECK(!memcmp(x, y, nx));
	free(x);
	free(y);
	struct hyb_gguf_file *f = open_ok(p2);
	CHECK(!memcmp(hyb_gguf_find_tensor(f, "a")->data, a, sizeof(a)));
	CHECK(!memcmp(hyb_gguf_find_tensor(f, "b")->data, b, sizeof(b)));
	CHECK(!memcmp(hyb_gguf_find_tensor(f, "c")->data, c, sizeof(c)));
	hyb_gguf_close(f);
}

TEST(gguf_writer_errors)
{
	static uint8_t a[256];
	const uint64_t ne[2] = { 8, 8 }, ne33[1] = { 33 }, ne0[2] = { 8, 0 };
	const char *path = tmp_path("e.gguf");
	struct hyb_gguf_writer *w = hyb_gguf_writer_new();

	/* bad declarations */
	CHECK(!hyb_gguf_writer_add_tensor(w, "t", HYB_TYPE_F32, 2, ne, a));
	CHECK(hyb_gguf_writer_add_tensor(w, "t", HYB_TYPE_F32, 2, ne, a) == -EEXIST); /* twice */
	CHECK_MSG(strstr(hyb_last_error(), "'t' declared twice"), "%s", hyb_last_error());
	CHECK(hyb_gguf_writer_add_tensor(w, "u", 3333, 2, ne, a) == -EINVAL);           /* type */
	CHECK(hyb_gguf_writer_add_tensor(w, "u", 31, 2, ne, a) == -EINVAL);     /* removed type */
	CHECK(hyb_gguf_writer_add_tensor(w, "u", HYB_TYPE_Q4_0, 1, ne33, a) == -EINVAL); /* block */
	CHECK_MSG(strstr(hyb_last_error(), "'u'"), "%s", hyb_last_error());
	CHECK(hyb_gguf_writer_add_tensor(w, "u", HYB_TYPE_F32, 0, ne, a) == -EINVAL);
	CHECK(hyb_gguf_writer_add_tensor(w, "u", HYB_TYPE_F32, 5, ne, a) == -EINVAL);
	CHECK(hyb_gguf_writer_add_tensor(w, "u", HYB_TYPE_F32, 2, ne0, a) == -EINVAL);
	CHECK(hyb_gguf_writer_add_tensor(w, "a-name-of-64-bytes-is-too-long-for-llama.cpp-"
				     "...................", HYB_TYPE_F32, 2, ne, a) ==
	      -ENAMETOOLONG);
	CHECK(!hyb_gguf_writer_add_tensor(w, "s", HYB_TYPE_F32, 2, ne, NULL));

	/* a tensor without data cannot be written whole */
	CHECK(hyb_gguf_writer_write_file(w, path) == -EINVAL);
	CHECK_MSG(strstr(hyb_last_error(), "'s'") && strstr(hyb_last_error(), "no data"), "%s",
		  hyb_last_error());
	CHECK(access(path, F_OK) < 0);

	/* streaming: too much data, then missing data: the partial file goes */
	CHECK(!hyb_gguf_writer_begin(w, path));
	CHECK(access(path, F_OK) < 0); /* written under a temporary name */
	CHECK(hyb_gguf_writer_put_data(w, a, 257) == -EINVAL);
	CHECK_MSG(strstr(hyb_last_error(), "257 bytes"), "%s", hyb_last_error());
	CHECK(hyb_gguf_writer_finish(w) == -EINVAL);
	CHECK_MSG(strstr(hyb_last_error(), "257 bytes") && strstr(hyb_last_error(), "'s'"), "%s",
		  hyb_last_error());
	CHECK(access(path, F_OK) < 0);
	CHECK(!hyb_gguf_writer_begin(w, path));
	CHECK(hyb_gguf_writer_finish(w) == -EINVAL);
	CHECK_MSG(strstr(hyb_last_error(), "missing"), "%s", hyb_last_error());
	CHECK(access(path, F_OK) < 0);
	CHECK(!hyb_gguf_writer_begin(w, path));
	CHECK(!hyb_gguf_writer_put_data(w, a, 256));
	CHECK(hyb_gguf_writer_put_data(w, a, 1) == -EINVAL); /* past the last tensor */
	CHECK(hyb_gguf_writer_finish(w) < 0);
	CHECK(access(path, F_OK) < 0);
	/* abandoning a stream removes its file too */
	CHECK(!hyb_gguf_writer_begin(w, path));
	hyb_gguf_writer_free(w);
	CHECK(access(path, F_OK) < 0);

	/* cannot create */
	w = hyb_gguf_writer_new();
	CHECK(hyb_gguf_writer_write_file(w, "/nonexistent-dir/x.gguf") == -ENOENT);
	CHECK_MSG(strstr(hyb_last_error(), "/nonexistent-dir/x.gguf") &&
		  strstr(hyb_last_error(), "No such file"), "%s", hyb_last_error());
	hyb_gguf_writer_free(w);

	/* setter errors surface at write time */
	w = hyb_gguf_writer_new();
	hyb_gguf_writer_set_alignment(w, 48);
	CHECK(hyb_gguf_writer_write_file(w, path) == -EINVAL);
	CHECK_MSG(strstr(hyb_last_error(), "power of two"), "%s", hyb_last_error());
	hyb_gguf_writer_free(w);
	w = hyb_gguf_writer_new();
	hyb_gguf_set_arr(w, "nested", HYB_GGUF_VT_ARRAY, a, 1);
	CHECK(hyb_gguf_writer_write_file(w, path) == -EINVAL);
	CHECK_MSG(strstr(hyb_last_error(), "nested"), "%s", hyb_last_error());
	hyb_gguf_writer_free(w);
	w = hyb_gguf_writer_new();
	hyb_gguf_set_str(w, "general.alignment", "32");
	CHECK(hyb_gguf_writer_write_file(w, path) == -EINVAL);
	CHECK_MSG(strstr(hyb_last_error(), "alignment"), "%s", hyb_last_error());
	hyb_gguf_writer_free(w);
	w = hyb_gguf_writer_new();
	hyb_gguf_writer_set_version(w, 1);
	CHECK(hyb_gguf_writer_write_file(w, path) == -EINVAL);
	CHECK_MSG(strstr(hyb_last_error(), "version"), "%s", hyb_last_error());
	hyb_gguf_writer_free(w);
	CHECK(access(path, F_OK) < 0);
}

/* A write error (here EFBIG from a file size limit) is reported and the file removed. */
TEST(gguf_writer_write_error)
{
	static uint8_t big[1 << 20];
	const uint64_t ne[2] = { 1024, 256 };
	const char *path = tmp_path("big.gguf");
	struct rlimit rl = { 64 << 10, 64 << 10 };
	struct hyb_gguf_writer *w = hyb_gguf_writer_new();

	signal(SIGXFSZ, SIG_IGN);
	CHECK(!setrlimit(RLIMIT_FSIZE, &rl));
	CHECK(!hyb_gguf_writer_add_tensor(w, "big", HYB_TYPE_F32, 2, ne, big));
	CHECK(hyb_gguf_writer_write_file(w, path) == -EFBIG);
	CHECK_MSG(strstr(hyb_last_error(), path) && strstr(hyb_last_error(), strerror(EFBIG)),
		  "%s", hyb_last_error());
	CHECK(access(path, F_OK) < 0);
	hyb_gguf_writer_free(w);
}

/* Files in dir whose name starts with prefix (the writer's leftovers). */
static int count_prefixed(const char *dir, const char *prefix)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;

	CHECK(d);
	while ((e = readdir(d)))
		n += !strncmp(e->d_name, prefix, strlen(prefix));
	closedir(d);
	return n;
}

/*
 * An existing file is replaced only by a complete new one: a write that
 * fails (missing data, a full disk - EFBIG here) leaves it byte for byte,
 * and nothing else behind; one that succeeds replaces it; a path that is
 * not a regular file (/dev/null) is written in place.
 */
TEST(gguf_writer_replaces_atomically)
{
	static uint8_t a[256], big[1 << 20];
	const uint64_t ne[2] = { 8, 8 }, neb[2] = { 1024, 256 };
	const char *path = tmp_path("keep.gguf");
	struct rlimit rl, rl0;
	struct hyb_gguf_writer *w = hyb_gguf_writer_new();
	uint8_t *old, *now;
	size_t n_old, n_now;

	memset(a, 7, sizeof(a));
	CHECK(!hyb_gguf_writer_add_tensor(w, "t", HYB_TYPE_F32, 2, ne, a));
	CHECK_MSG(!hyb_gguf_writer_write_file(w, path), "%s", hyb_last_error());
	hyb_gguf_writer_free(w);
	old = slurp(path, &n_old);

	/* streamed, stopped short: the old file stays */
	w = hyb_gguf_writer_new();
	CHECK(!hyb_gguf_writer_add_tensor(w, "t", HYB_TYPE_F32, 2, ne, NULL));
	hyb_gguf_set_u32(w, "x", 1);
	CHECK(!hyb_gguf_writer_begin(w, path));
	CHECK(!hyb_gguf_writer_put_data(w, a, 100));
	CHECK(hyb_gguf_writer_finish(w) < 0);
	now = slurp(path, &n_now);
	CHECK(n_now == n_old && !memcmp(now, old, n_old));
	free(now);
	hyb_gguf_writer_free(w);

	/* the disk fills up: the old file stays */
	w = hyb_gguf_writer_new();
	CHECK(!hyb_gguf_writer_add_tensor(w, "big", HYB_TYPE_F32, 2, neb, big));
	signal(SIGXFSZ, SIG_IGN);
	CHECK(!getrlimit(RLIMIT_FSIZE, &rl0));
	rl = rl0;
	rl.rlim_cur = 64 << 10; /* the soft limit only: it can be raised again */
	CHECK(!setrlimit(RLIMIT_FSIZE, &rl));
	CHECK(hyb_gguf_writer_write_file(w, path) == -EFBIG);
	CHECK_MSG(strstr(hyb_last_error(), path) && strstr(hyb_last_error(), strerror(EFBIG)),
		  "%s", hyb_last_error());
	CHECK(!setrlimit(RLIMIT_FSIZE, &rl0));
	now = slurp(path, &n_now);
	CHECK(n_now == n_old && !memcmp(now, old, n_old));
	free(now);

	/* room again: replaced */
	CHECK_MSG(!hyb_gguf_writer_write_file(w, path), "%s", hyb_last_error());
	now = slurp(path, &n_now);
	CHECK(n_now > sizeof(big) && !memcmp(now + n_now - sizeof(big), big, sizeof(big)));
	free(now);
	hyb_gguf_writer_free(w);
	CHECK_EQ_INT(count_prefixed(hyb_test_tmpdir(), "keep.gguf.tmp-"), 0);

	/* not a regular file: in place */
	w = hyb_gguf_writer_new();
	CHECK(!hyb_gguf_writer_add_tensor(w, "t", HYB_TYPE_F32, 2, ne, a));
	CHECK_MSG(!hyb_gguf_writer_write_file(w, "/dev/null"), "%s", hyb_last_error());
	hyb_gguf_writer_free(w);
	free(old);
}

/* ---- the real tiny model ------------------------------------------------- */

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

TEST(gguf_tiny_model)
{
	const char *path = hyb_test_shared("models/llama-2-tiny-random.gguf");
	const struct hyb_gguf_tensor *t;
	const struct hyb_gguf_kv *kv;
	struct hyb_gguf_file *f, *g;
	double best = 1e9;
	char s[64];
	uint32_t u;
	float eps;

	if (access(path, R_OK))
		SKIP("%s not found", path);
	f = open_ok(path);
	CHECK_EQ_INT(f->version, 3);
	CHECK_EQ_INT(f->n_kv, 18);
	CHECK_EQ_INT(f->n_tensors, 12);
	CHECK_EQ_INT(f->alignment, 32);
	CHECK_EQ_INT(f->data_offset, 724416);
	CHECK(hyb_gguf_get_str(f, "general.architecture", s, sizeof(s)) && !strcmp(s, "llama"));
	CHECK(hyb_gguf_get_str(f, "general.name", s, sizeof(s)) && !strcmp(s, "LLaMA v2"));
	CHECK(hyb_gguf_get_str(f, "tokenizer.ggml.model", s, sizeof(s)) && !strcmp(s, "llama"));
	CHECK(hyb_gguf_get_u32(f, "llama.context_length", &u) && u == 4096);
	CHECK(hyb_gguf_get_u32(f, "llama.embedding_length", &u) && u == 8);
	CHECK(hyb_gguf_get_u32(f, "llama.feed_forward_length", &u) && u == 32);
	CHECK(hyb_gguf_get_u32(f, "llama.attention.head_count", &u) && u == 2);
	CHECK(hyb_gguf_get_u32(f, "tokenizer.ggml.bos_token_id", &u) && u == 1);
	CHECK(hyb_gguf_get_f32(f, "llama.attention.layer_norm_rms_epsilon", &eps));
	CHECK_NEAR(eps, 1e-5, 1e-9);
	kv = hyb_gguf_get_arr(f, "tokenizer.ggml.tokens", HYB_GGUF_VT_STRING);
	CHECK(kv && kv->v.arr.n == 32000);
	CHECK(hyb_gguf_str_eq(kv->v.arr.strs[0], "<unk>"));
	CHECK(hyb_gguf_str_eq(kv->v.arr.strs[1], "<s>"));
	CHECK(hyb_gguf_str_eq(kv->v.arr.strs[1000], "ied"));
	CHECK(hyb_gguf_str_eq(kv->v.arr.strs[31999], "\xe7\xbb\x99"));
	kv = hyb_gguf_get_arr(f, "tokenizer.ggml.scores", HYB_GGUF_VT_FLOAT32);
	CHECK(kv && kv->v.arr.n == 32000);
	float score;
	memcpy(&score, (const float *)kv->v.arr.data + 1000, 4);
	CHECK(score == -741.0f);
	CHECK(hyb_gguf_get_arr(f, "tokenizer.ggml.token_type", HYB_GGUF_VT_INT32)->v.arr.n == 32000);

	t = hyb_gguf_find_tensor(f, "token_embd.weight");
	CHECK(t && t->type == HYB_TYPE_F16 && t->n_dims == 2);
	CHECK(t->ne[0] == 8 && t->ne[1] == 32000 && t->ne[2] == 1 && t->ne[3] == 1);
	CHECK_EQ_INT(t->nbytes, 512000);
	CHECK_EQ_INT(f->data_offset + t->offset, 724416);
	t = hyb_gguf_find_tensor(f, "blk.0.ffn_down.weight");
	CHECK(t && t->ne[0] == 32 && t->ne[1] == 8 && t->nbytes == 512);
	CHECK_EQ_INT(f->data_offset + t->offset, 1237952);
	t = hyb_gguf_find_tensor(f, "output_norm.weight");
	CHECK(t && t->type == HYB_TYPE_F32 && t->n_dims == 1 && t->ne[0] == 8);
	t = hyb_gguf_find_tensor(f, "output.weight");
	CHECK(t && (const uint8_t *)t->data + t->nbytes == f->base + f->size); /* ends the file */

	/* parsing the 32000-entry vocabulary must be cheap: best of 20 */
	for (int i = 0; i < 20; i++) {
		double t0 = now_s();

		CHECK(!hyb_gguf_parse(f->base, f->size, &g));
		hyb_gguf_close(g);
		if (now_s() - t0 < best)
			best = now_s() - t0;
	}
	fprintf(stderr, "    tiny model parse: %.3f ms\n", best * 1e3);
	CHECK_MSG(best < 10e-3, "parse took %.3f ms", best * 1e3);
	hyb_gguf_close(f);
}

/* Truncating the real model's header anywhere must fail cleanly. */
TEST(gguf_tiny_model_truncated)
{
	const char *path = hyb_test_shared("models/llama-2-tiny-random.gguf");
	struct hyb_gguf_file *f, *g;

	if (access(path, R_OK))
		SKIP("%s not found", path);
	f = open_ok(path);
	for (uint64_t n = 0; n < f->size; n += n < 4096 ? 1 : 4093) {
		CHECK_MSG(hyb_gguf_parse(f->base, n, &g) == -EINVAL, "accepted at %llu",
			  (unsigned long long)n);
		CHECK_MSG(strstr(hyb_last_error(), "truncated"), "at %llu: %s",
			  (unsigned long long)n, hyb_last_error());
	}
	hyb_gguf_close(f);
}

/* ---- malformed files ------------------------------------------------------ */

/* A small file with all kinds of content, truncated at every byte. */
TEST(gguf_truncated_everywhere)
{
	static uint8_t d1[256], d2[34 * 2];
	const char *toks[] = { "a", "bb", "", "dddd" };
	const uint64_t ne1[2] = { 8, 8 }, ne2[2] = { 32, 2 };
	const char *path = tmp_path("small.gguf");
	struct hyb_gguf_writer *w = hyb_gguf_writer_new();
	struct hyb_gguf_file *f;
	uint64_t need;
	uint8_t *img;
	size_t n;
	int32_t ia[3] = { 1, 2, 3 };

	hyb_gguf_set_str(w, "general.architecture", "llama");
	hyb_gguf_set_u32(w, "u32", 5);
	hyb_gguf_set_f32(w, "f32", 0.5f);
	hyb_gguf_set_bool(w, "b", true);
	hyb_gguf_set_arr(w, "ia", HYB_GGUF_VT_INT32, ia, 3);
	hyb_gguf_set_arr_str(w, "toks", toks, 4);
	CHECK(!hyb_gguf_writer_add_tensor(w, "t1", HYB_TYPE_F32, 2, ne1, d1));
	CHECK(!hyb_gguf_writer_add_tensor(w, "t2", HYB_TYPE_Q8_0, 2, ne2, d2));
	write_ok(w, path);
	hyb_gguf_writer_free(w);
	img = slurp(path, &n);
	CHECK(!hyb_gguf_parse(img, n, &f));
	need = f->data_offset + f->tensors[1].offset + f->tensors[1].nbytes;
	hyb_gguf_close(f);
	CHECK(need < n); /* the writer pads the end, and the padding is optional */
	for (size_t len = 0; len <= n; len++) {
		uint8_t *copy = malloc(len ? len : 1);
		int rc;

		memcpy(copy, img, len);
		rc = hyb_gguf_parse(copy, len, &f);
		if (len >= need) {
			CHECK_MSG(rc == 0, "refused at %zu: %s", len, hyb_last_error());
			hyb_gguf_close(f);
		} else {
			CHECK_MSG(rc == -EINVAL && f == NULL, "accepted at %zu (%d)", len, rc);
			CHECK_MSG(strstr(hyb_last_error(), "truncated"), "at %zu: %s", len,
				  hyb_last_error());
		}
		free(copy);
	}
	free(img);
}

TEST(gguf_bad_header)
{
	struct bb b;
	uint64_t ne[1] = { 8 };

	b.n = 0;
	REFUSED(&b, "truncated");
	bb_hdr(&b, 3, 0, 0);
	b.p[0] = 'X';
	REFUSED(&b, "magic");
	bb_hdr(&b, 1, 0, 0);
	REFUSED(&b, "version 1");
	bb_hdr(&b, 0x03000000, 0, 0);
	REFUSED(&b, "big-endian");
	bb_hdr(&b, 4, 0, 0);
	REFUSED(&b, "version 4");
	bb_hdr(&b, 0, 0, 0);
	REFUSED(&b, "version 0");
	bb_hdr(&b, 3, 0, 0);
	accepted(&b);
	bb_hdr(&b, 2, 0, 0);
	accepted(&b);

	/* absurd counts: refused before anything is allocated for them */
	bb_hdr(&b, 3, 0, UINT64_MAX);
	REFUSED(&b, "key-value count");
	bb_hdr(&b, 3, 0, 1ull << 40);
	REFUSED(&b, "exceeds");
	bb_hdr(&b, 3, UINT64_MAX, 0);
	REFUSED(&b, "tensor count");
	bb_hdr(&b, 3, 1ull << 59, 0);
	REFUSED(&b, "exceeds");
	bb_hdr(&b, 3, 2, 0); /* two tensors announced, one there */
	bb_tensor(&b, "t", 1, ne, HYB_TYPE_F32, 0);
	REFUSED(&b, "tensor count 2 exceeds");
}

TEST(gguf_bad_metadata)
{
	struct bb b;

	/* string and array lengths larger than the file */
	bb_hdr(&b, 3, 0, 1);
	bb_u64(&b, UINT64_MAX);
	bb_raw(&b, "keykeykeykeykey", 15);
	REFUSED(&b, "length 18446744073709551615 exceeds");
	bb_hdr(&b, 3, 0, 1);
	bb_str(&b, "k");
	bb_u32(&b, HYB_GGUF_VT_STRING);
	bb_u64(&b, 1ull << 62);
	bb_raw(&b, "value", 5);
	REFUSED(&b, "exceeds");
	bb_hdr(&b, 3, 0, 1);
	bb_str(&b, "k");
	bb_u32(&b, HYB_GGUF_VT_ARRAY);
	bb_u32(&b, HYB_GGUF_VT_UINT32);
	bb_u64(&b, UINT64_MAX / 2); /* times 4 wraps around */
	bb_u64(&b, 0);
	REFUSED(&b, "array of 9223372036854775807 UINT32 exceeds");
	bb_hdr(&b, 3, 0, 1);
	bb_str(&b, "k");
	bb_u32(&b, HYB_GGUF_VT_ARRAY);
	bb_u32(&b, HYB_GGUF_VT_STRING);
	bb_u64(&b, 1ull << 61);
	bb_u64(&b, 0);
	REFUSED(&b, "strings exceeds");
	bb_hdr(&b, 3, 0, 1);
	bb_str(&b, "k");
	bb_u32(&b, HYB_GGUF_VT_ARRAY);
	bb_u32(&b, HYB_GGUF_VT_STRING);
	bb_u64(&b, 2);
	bb_str(&b, "one");
	bb_u64(&b, 1000);
	bb_raw(&b, "two", 3);
	REFUSED(&b, "string 1 length 1000 exceeds");

	/* types */
	bb_hdr(&b, 3, 0, 1);
	bb_str(&b, "k");
	bb_u32(&b, HYB_GGUF_VT_ARRAY);
	bb_u32(&b, HYB_GGUF_VT_ARRAY);
	bb_u64(&b, 1);
	bb_u32(&b, HYB_GGUF_VT_UINT8);
	bb_u64(&b, 1);
	bb_raw(&b, "\x01", 1);
	REFUSED(&b, "nested");
	bb_hdr(&b, 3, 0, 1);
	bb_str(&b, "k");
	bb_u32(&b, 13);
	bb_u64(&b, 0);
	REFUSED(&b, "unknown value type 13");
	bb_hdr(&b, 3, 0, 1);
	bb_str(&b, "k");
	bb_u32(&b, HYB_GGUF_VT_ARRAY);
	bb_u32(&b, 99);
	bb_u64(&b, 0);
	REFUSED(&b, "unknown array element type 99");
	bb_hdr(&b, 3, 0, 1);
	bb_str(&b, "k");
	bb_u32(&b, HYB_GGUF_VT_BOOL);
	bb_raw(&b, "\x02", 1);
	REFUSED(&b, "bool");
	bb_hdr(&b, 3, 0, 1);
	bb_str(&b, "k");
	bb_u32(&b, HYB_GGUF_VT_ARRAY);
	bb_u32(&b, HYB_GGUF_VT_BOOL);
	bb_u64(&b, 3);
	bb_raw(&b, "\x01\x00\x07", 3);
	REFUSED(&b, "bool");

	/* keys */
	bb_hdr(&b, 3, 0, 2);
	bb_kv_u32(&b, "a.b", 1);
	bb_kv_u32(&b, "a.b", 2);
	REFUSED(&b, "duplicate key");
	bb_hdr(&b, 3, 0, 2);
	bb_kv_u32(&b, "a.b", 1);
	bb_kv_u32(&b, "a.c", 2);
	accepted(&b);
	bb_hdr(&b, 3, 0, 1);
	bb_kv_u32(&b, "", 1);
	REFUSED(&b, "empty key");

	/* general.alignment */
	bb_hdr(&b, 3, 0, 1);
	bb_kv_u32(&b, "general.alignment", 0);
	REFUSED(&b, "power of two");
	bb_hdr(&b, 3, 0, 1);
	bb_kv_u32(&b, "general.alignment", 48);
	REFUSED(&b, "power of two");
	bb_hdr(&b, 3, 0, 1);
	bb_str(&b, "general.alignment");
	bb_u32(&b, HYB_GGUF_VT_UINT64);
	bb_u64(&b, 32);
	REFUSED(&b, "must be UINT32");
	bb_hdr(&b, 3, 0, 1);
	bb_kv_u32(&b, "general.alignment", 8);
	accepted(&b);
}

/* One tensor t of `ne` F32 at offset 0, in a file of alignment 32. */
static void one_tensor(struct bb *b, uint32_t n_dims, const uint64_t *ne, uint32_t type)
{
	bb_hdr(b, 3, 1, 0);
	bb_tensor(b, "t", n_dims, ne, type, 0);
	bb_data(b, 32, 64);
}

TEST(gguf_bad_tensors)
{
	const uint64_t ok[2] = { 8, 2 }, zero[2] = { 8, 0 }, neg[2] = { 8, (uint64_t)-3 };
	const uint64_t prod[4] = { 1ull << 20, 1ull << 20, 1ull << 20, 1ull << 20 };
	const uint64_t bytes[2] = { 1ull << 31, 1ull << 31 }; /* 2^62 F64 = 2^65 bytes */
	const uint64_t q[1] = { 48 };
	struct bb b;

	one_tensor(&b, 2, ok, HYB_TYPE_F32);
	accepted(&b);
	one_tensor(&b, 0, ok, HYB_TYPE_F32);
	REFUSED(&b, "n_dims 0");
	bb_hdr(&b, 3, 1, 0);
	bb_str(&b, "t");
	bb_u32(&b, 5);
	for (int i = 0; i < 5; i++)
		bb_u64(&b, 1);
	bb_u32(&b, 0);
	bb_u64(&b, 0);
	bb_data(&b, 32, 64);
	REFUSED(&b, "n_dims 5");
	one_tensor(&b, 2, zero, HYB_TYPE_F32);
	REFUSED(&b, "dimension 1 is 0");
	one_tensor(&b, 2, neg, HYB_TYPE_F32);
	REFUSED(&b, "negative");
	one_tensor(&b, 4, prod, HYB_TYPE_F32);
	REFUSED(&b, "element count overflows");
	one_tensor(&b, 2, bytes, 28 /* F64 */);
	REFUSED(&b, "byte size overflows");
	one_tensor(&b, 2, ok, 4); /* Q4_2, removed from ggml */
	REFUSED(&b, "unknown tensor type 4");
	one_tensor(&b, 2, ok, 4000);
	REFUSED(&b, "unknown tensor type 4000");
	one_tensor(&b, 1, q, HYB_TYPE_Q4_0);
	REFUSED(&b, "block size 32");
	bb_hdr(&b, 3, 1, 0); /* the name's error message says which tensor */
	bb_tensor(&b, "blk.\n7", 2, zero, HYB_TYPE_F32, 0);
	bb_data(&b, 32, 64);
	REFUSED(&b, "tensor 0 'blk.?7': dimension 1 is 0");
}

TEST(gguf_bad_layout)
{
	const uint64_t ne[1] = { 8 }; /* 32 bytes of F32 */
	struct bb b;

	/* offsets: unaligned, past the end, overlapping */
	bb_hdr(&b, 3, 1, 0);
	bb_tensor(&b, "t", 1, ne, HYB_TYPE_F32, 16);
	bb_data(&b, 32, 64);
	REFUSED(&b, "not aligned to 32");
	bb_hdr(&b, 3, 1, 1);
	bb_kv_u32(&b, "general.alignment", 16);
	bb_tensor(&b, "t", 1, ne, HYB_TYPE_F32, 16);
	bb_data(&b, 16, 48);
	accepted(&b);
	bb_hdr(&b, 3, 1, 0);
	bb_tensor(&b, "t", 1, ne, HYB_TYPE_F32, 32);
	bb_data(&b, 32, 63);
	REFUSED(&b, "outside the file");
	bb_hdr(&b, 3, 1, 0);
	bb_tensor(&b, "t", 1, ne, HYB_TYPE_F32, UINT64_MAX - 31); /* wraps around */
	bb_data(&b, 32, 64);
	REFUSED(&b, "outside the file");
	bb_hdr(&b, 3, 3, 0);
	bb_tensor(&b, "a", 1, ne, HYB_TYPE_F32, 64);
	bb_tensor(&b, "b", 1, ne, HYB_TYPE_F32, 0);
	bb_tensor(&b, "c", 1, ne, HYB_TYPE_F32, 32);
	bb_data(&b, 32, 96);
	accepted(&b); /* out of order but disjoint is fine */
	bb_hdr(&b, 3, 3, 0);
	bb_tensor(&b, "a", 1, ne, HYB_TYPE_F32, 64);
	bb_tensor(&b, "b", 1, ne, HYB_TYPE_F32, 0);
	bb_tensor(&b, "c", 1, ne, HYB_TYPE_F32, 64);
	bb_data(&b, 32, 96);
	REFUSED(&b, "'a' and 'c' overlap");
	{
		const uint64_t ne2[1] = { 16 }; /* 64 bytes: runs into the next */

		bb_hdr(&b, 3, 2, 0);
		bb_tensor(&b, "big", 1, ne2, HYB_TYPE_F32, 0);
		bb_tensor(&b, "next", 1, ne, HYB_TYPE_F32, 32);
		bb_data(&b, 32, 96);
		REFUSED(&b, "overlap");
	}
	bb_hdr(&b, 3, 2, 0);
	bb_tensor(&b, "t", 1, ne, HYB_TYPE_F32, 0);
	bb_tensor(&b, "t", 1, ne, HYB_TYPE_F32, 32);
	bb_data(&b, 32, 64);
	REFUSED(&b, "duplicate tensor name");

	/* the data section starts at the header end rounded up: no padding, no data */
	bb_hdr(&b, 3, 1, 0);
	bb_tensor(&b, "t", 1, ne, HYB_TYPE_F32, 0);
	REFUSED(&b, "past the end");
	/* and a longer file than needed is fine */
	bb_hdr(&b, 3, 1, 0);
	bb_tensor(&b, "t", 1, ne, HYB_TYPE_F32, 0);
	bb_data(&b, 32, 1000);
	accepted(&b);
}

TEST(gguf_open_errors)
{
	const char *empty = tmp_path("empty.gguf"), *junk = tmp_path("junk.gguf");
	struct hyb_gguf_file *f;
	FILE *fp;

	CHECK(hyb_gguf_open(tmp_path("missing.gguf"), &f) == -ENOENT && !f);
	CHECK_MSG(strstr(hyb_last_error(), "cannot open") &&
		  strstr(hyb_last_error(), "missing.gguf: No such file"), "%s", hyb_last_error());
	fp = fopen(empty, "wb");
	fclose(fp);
	CHECK(hyb_gguf_open(empty, &f) == -EINVAL);
	CHECK_MSG(strstr(hyb_last_error(), "empty.gguf: empty file"), "%s", hyb_last_error());
	CHECK(hyb_gguf_open(hyb_test_tmpdir(), &f) == -EISDIR);
	CHECK_MSG(strstr(hyb_last_error(), "directory"), "%s", hyb_last_error());
	fp = fopen(junk, "wb");
	fputs("GGML this is not a gguf file", fp);
	fclose(fp);
	CHECK(hyb_gguf_open(junk, &f) == -EINVAL);
	CHECK_MSG(strstr(hyb_last_error(), "junk.gguf: bad magic"), "%s", hyb_last_error());
}
