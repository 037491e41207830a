/* SPDX-License-Identifier: MIT */
/*
 * GGUF reader and writer (GGUF v2 and v3, as specified in ggml's
 * docs/gguf.md). The reader validates everything before it hands out a
 * pointer: a malformed file is refused with a message naming the problem,
 * never dereferenced out of bounds. Failures return a negative errno with
 * the message in hyb_last_error() (hyb/error.h). Strings, arrays and tensor
 * data point into the caller's buffer (usually the mmap of the file):
 * nothing is copied.
 */
#ifndef HYB_GGUF_H
#define HYB_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "hyb/error.h"

#define HYB_GGUF_MAGIC 0x46554747u /* "GGUF" little-endian */
/*
 * PowerInfer writes this magic over GGUF's in its model files (its
 * convert.py: PowerInfer enables sparse inference only for it) and in its
 * GPU index files (powerinfer-py export_split.py: *.gpuidx). hyb_gguf_parse
 * accepts both and says which in hyb_gguf_file.magic; what a file is, model
 * or GPU index, is told by its content (hyb_gguf_is_gpu_index).
 *
 * PowerInfer's gguf-py numbers I8, I16, I32 16, 17, 18 (GGUF's IQ2_XXS,
 * IQ2_XS, IQ3_XXS) and export_split.py writes a layer without GPU neurons as
 * an empty gpu_bucket: the parser reads a tensor named *.gpu_idx or
 * *.gpu_bucket of type 18 as I32, and lets a 1-D one be empty.
 */
#define HYB_GGUF_MAGIC_PWRI 0x49525750u /* "PWRI" little-endian */
#define HYB_GGUF_DEFAULT_ALIGNMENT 32
#define HYB_GGUF_MAX_DIMS 4

enum hyb_gguf_vtype {
	HYB_GGUF_VT_UINT8 = 0,
	HYB_GGUF_VT_INT8 = 1,
	HYB_GGUF_VT_UINT16 = 2,
	HYB_GGUF_VT_INT16 = 3,
	HYB_GGUF_VT_UINT32 = 4,
	HYB_GGUF_VT_INT32 = 5,
	HYB_GGUF_VT_FLOAT32 = 6,
	HYB_GGUF_VT_BOOL = 7,
	HYB_GGUF_VT_STRING = 8,
	HYB_GGUF_VT_ARRAY = 9,
	HYB_GGUF_VT_UINT64 = 10,
	HYB_GGUF_VT_INT64 = 11,
	HYB_GGUF_VT_FLOAT64 = 12,
	HYB_GGUF_VT_COUNT
};

/* Not NUL-terminated: points into the file. */
struct hyb_gguf_str {
	uint64_t len;
	const char *ptr;
};

struct hyb_gguf_kv {
	struct hyb_gguf_str key;
	uint32_t type; /* enum hyb_gguf_vtype */
	union {
		uint64_t u64;  /* all unsigned integer types, widened */
		int64_t i64;   /* all signed integer types, widened */
		double f64;    /* FLOAT32 and FLOAT64, widened */
		bool b;
		struct hyb_gguf_str str;
		struct {
			uint32_t type;     /* element type; never ARRAY (nested arrays are refused) */
			uint64_t n;
			const void *data;  /* raw little-endian elements (not STRING); unaligned */
			const struct hyb_gguf_str *strs; /* STRING arrays: n entries, allocated by the reader */
		} arr;
	} v;
};

struct hyb_gguf_tensor {
	struct hyb_gguf_str name;
	uint32_t n_dims;
	uint64_t ne[HYB_GGUF_MAX_DIMS]; /* ne[0] is the contiguous (row) dimension; unused dims are 1 */
	uint32_t type;              /* enum hyb_type / ggml type id */
	uint64_t offset;            /* relative to the data section, as in the file */
	uint64_t nbytes;
	const void *data;           /* base + data_offset + offset, validated in bounds */
};

struct hyb_gguf_file {
	const uint8_t *base;     /* the whole file */
	uint64_t size;
	uint32_t magic;          /* HYB_GGUF_MAGIC or HYB_GGUF_MAGIC_PWRI */
	uint32_t version;        /* 2 or 3 */
	uint64_t n_kv;
	struct hyb_gguf_kv *kv;
	uint64_t n_tensors;
	struct hyb_gguf_tensor *tensors;
	uint64_t alignment;      /* general.alignment or 32 */
	uint64_t data_offset;    /* start of the tensor data section (header end rounded up to
				  * alignment; at most size when there are no tensors) */
	/* private */
	void *map;               /* non-NULL when hyb_gguf_open mapped the file */
	uint64_t map_len;
	int map_guard;           /* its SIGBUS guard slot (libhyb/format/map_guard.h), -1: none */
	uint32_t *kv_index;      /* open-addressing hash tables: slot = index + 1, 0 empty */
	uint32_t *tensor_index;
	uint64_t kv_mask, tensor_mask;
};

/*
 * Parse a GGUF image held in memory (size bytes at buf; buf must outlive the
 * result). Returns 0, -EINVAL for a malformed image or -ENOMEM, with a
 * one-line message in hyb_last_error() ("tensor 3 'x': truncated at offset
 * N reading name ...", "bad magic 0x...", ...).
 */
int hyb_gguf_parse(const void *buf, uint64_t size, struct hyb_gguf_file **out);
/*
 * mmap a file read-only and parse it: also the errno of a failed open, stat
 * or mmap (-ENOENT...), -EISDIR; the message starts with the path.
 */
int hyb_gguf_open(const char *path, struct hyb_gguf_file **out);
void hyb_gguf_close(struct hyb_gguf_file *f);

/* Lookup; NULL when absent. Keys and names compare as exact byte strings. */
const struct hyb_gguf_kv *hyb_gguf_find(const struct hyb_gguf_file *f, const char *key);
const struct hyb_gguf_tensor *hyb_gguf_find_tensor(const struct hyb_gguf_file *f, const char *name);
/* true when f is a PowerInfer GPU index: it has tensors, all named blk.N.gpu_idx or
 * blk.N.gpu_bucket (either magic). */
bool hyb_gguf_is_gpu_index(const struct hyb_gguf_file *f);

/*
 * Typed getters: true when the key exists and converts without loss
 * (any integer type to u32/i64 if in range; FLOAT32/FLOAT64 to float; BOOL).
 * hyb_gguf_get_str copies at most cap-1 bytes and NUL-terminates; false when the
 * key is not a STRING or does not fit.
 */
bool hyb_gguf_get_u32(const struct hyb_gguf_file *f, const char *key, uint32_t *out);
bool hyb_gguf_get_i64(const struct hyb_gguf_file *f, const char *key, int64_t *out);
bool hyb_gguf_get_f32(const struct hyb_gguf_file *f, const char *key, float *out);
bool hyb_gguf_get_bool(const struct hyb_gguf_file *f, const char *key, bool *out);
bool hyb_gguf_get_str(const struct hyb_gguf_file *f, const char *key, char *buf, size_t cap);
/* ARRAY of the given element type (any type when elem_type < 0); NULL otherwise. */
const struct hyb_gguf_kv *hyb_gguf_get_arr(const struct hyb_gguf_file *f, const char *key, int elem_type);

bool hyb_gguf_str_eq(struct hyb_gguf_str s, const char *cstr);
const char *hyb_gguf_vtype_name(uint32_t t);

/* ---- writer ---------------------------------------------------------- */

struct hyb_gguf_writer;

struct hyb_gguf_writer *hyb_gguf_writer_new(void);
void hyb_gguf_writer_free(struct hyb_gguf_writer *w);

/* Metadata, written in insertion order; setting a key twice replaces it. */
void hyb_gguf_set_u8(struct hyb_gguf_writer *w, const char *key, uint8_t v);
void hyb_gguf_set_i8(struct hyb_gguf_writer *w, const char *key, int8_t v);
void hyb_gguf_set_u16(struct hyb_gguf_writer *w, const char *key, uint16_t v);
void hyb_gguf_set_i16(struct hyb_gguf_writer *w, const char *key, int16_t v);
void hyb_gguf_set_u32(struct hyb_gguf_writer *w, const char *key, uint32_t v);
void hyb_gguf_set_i32(struct hyb_gguf_writer *w, const char *key, int32_t v);
void hyb_gguf_set_u64(struct hyb_gguf_writer *w, const char *key, uint64_t v);
void hyb_gguf_set_i64(struct hyb_gguf_writer *w, const char *key, int64_t v);
void hyb_gguf_set_f32(struct hyb_gguf_writer *w, const char *key, float v);
void hyb_gguf_set_f64(struct hyb_gguf_writer *w, const char *key, double v);
void hyb_gguf_set_bool(struct hyb_gguf_writer *w, const char *key, bool v);
void hyb_gguf_set_str(struct hyb_gguf_writer *w, const char *key, const char *v);
/* elem_type is a scalar hyb_gguf_vtype; data holds n raw elements (copied). */
void hyb_gguf_set_arr(struct hyb_gguf_writer *w, const char *key, uint32_t elem_type, const void *data, uint64_t n);
void hyb_gguf_set_arr_str(struct hyb_gguf_writer *w, const char *key, const char *const *strs, uint64_t n);

/*
 * Declare a tensor. data (nbytes = hyb_row_bytes(type, ne[0]) * rows) is
 * borrowed until the file is written; pass NULL to stream the data later
 * with hyb_gguf_writer_put_data in declaration order. Returns -EINVAL on a
 * bad type/shape, -EEXIST on a duplicate name, -ENAMETOOLONG on a name of
 * 64 bytes or more (llama.cpp's GGML_MAX_NAME: its loader refuses longer
 * ones), -ENOMEM.
 */
/* Copy one key/value of an opened file (type, value and arrays as they are). */
void hyb_gguf_writer_copy_kv(struct hyb_gguf_writer *w, const struct hyb_gguf_kv *kv);
int hyb_gguf_writer_add_tensor(struct hyb_gguf_writer *w, const char *name, uint32_t type,
			   uint32_t n_dims, const uint64_t *ne, const void *data);

/* Write header + metadata + tensor infos, and every tensor whose data was given. */
int hyb_gguf_writer_write_file(struct hyb_gguf_writer *w, const char *path);
/*
 * Streaming: open the file and write the header; then put each tensor's data
 * in declaration order (padding handled; a tensor may come in several
 * chunks; tensors declared with data are written without being put); then
 * finish. put_data returns the write's errno, or -EINVAL on more bytes than
 * the current tensor has left; finish then reports the error again. On any
 * error the partial file is removed (also when the writer is freed before
 * finish). Setter errors (out of memory, bad array type...) are reported by
 * begin.
 * The bytes go to PATH.tmp-PID, renamed over PATH by a successful finish:
 * PATH never holds a partial file, and an existing one stays as it was
 * until the new one is complete (PATH that exists and is not a regular
 * file, such as /dev/null, is written in place).
 */
int hyb_gguf_writer_begin(struct hyb_gguf_writer *w, const char *path);
int hyb_gguf_writer_put_data(struct hyb_gguf_writer *w, const void *data, uint64_t nbytes);
int hyb_gguf_writer_finish(struct hyb_gguf_writer *w);

/*
 * Set the file's version (2 or 3; default 3) and alignment (power of two;
 * default 32; stored as the metadata key general.alignment, which is where
 * the alignment is read from when the file is written).
 */
void hyb_gguf_writer_set_version(struct hyb_gguf_writer *w, uint32_t version);
void hyb_gguf_writer_set_alignment(struct hyb_gguf_writer *w, uint32_t alignment);

#endif
