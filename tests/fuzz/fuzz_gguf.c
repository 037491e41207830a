// SPDX-License-Identifier: MIT
/*
 * libFuzzer target for the GGUF reader: parse the input and, when it is
 * accepted, touch the first and last byte of everything the parser handed
 * out (strings, arrays, tensor data), so that AddressSanitizer catches any
 * pointer the validation let through out of bounds. The input buffer is
 * exactly the size given, so one byte too far is a heap overflow.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hyb/gguf.h"
#include "util/error.h"

static const uint8_t elem_size[HYB_GGUF_VT_COUNT] = {
	[HYB_GGUF_VT_UINT8] = 1, [HYB_GGUF_VT_INT8] = 1,   [HYB_GGUF_VT_UINT16] = 2,  [HYB_GGUF_VT_INT16] = 2,
	[HYB_GGUF_VT_UINT32] = 4, [HYB_GGUF_VT_INT32] = 4, [HYB_GGUF_VT_FLOAT32] = 4, [HYB_GGUF_VT_BOOL] = 1,
	[HYB_GGUF_VT_UINT64] = 8, [HYB_GGUF_VT_INT64] = 8, [HYB_GGUF_VT_FLOAT64] = 8,
};

static volatile unsigned sink;

static unsigned touch(const void *p, uint64_t n)
{
	const volatile uint8_t *b = p;

	return n ? b[0] + b[n - 1] : 0;
}

static unsigned touch_str(struct hyb_gguf_str s)
{
	return touch(s.ptr, s.len);
}

/* Looking a name up must find the entry it came from (names with a NUL cannot be asked for). */
static void check_lookup(const struct hyb_gguf_file *f, struct hyb_gguf_str s, const struct hyb_gguf_kv *kv,
			 const struct hyb_gguf_tensor *t)
{
	char name[128];

	if (s.len >= sizeof(name) || memchr(s.ptr, 0, s.len))
		return;
	memcpy(name, s.ptr, s.len);
	name[s.len] = 0;
	if (!hyb_gguf_str_eq(s, name) || (kv && hyb_gguf_find(f, name) != kv) ||
	    (t && hyb_gguf_find_tensor(f, name) != t))
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct hyb_gguf_file *f;
	unsigned int said = hyb_error_count();
	unsigned sum = 0;
	int rc = hyb_gguf_parse(data, size, &f);

	if (rc) {
		/* every refusal says why, with the errno of a malformed file or of no memory */
		if (hyb_error_count() == said || !hyb_last_error()[0] || f ||
		    (rc != -EINVAL && rc != -ENOMEM))
			abort();
		return 0;
	}
	for (uint64_t i = 0; i < f->n_kv; i++) {
		const struct hyb_gguf_kv *kv = &f->kv[i];

		sum += touch_str(kv->key);
		check_lookup(f, kv->key, kv, NULL);
		if (kv->type == HYB_GGUF_VT_STRING) {
			sum += touch_str(kv->v.str);
		} else if (kv->type == HYB_GGUF_VT_ARRAY && kv->v.arr.type == HYB_GGUF_VT_STRING) {
			for (uint64_t j = 0; j < kv->v.arr.n; j++)
				sum += touch_str(kv->v.arr.strs[j]);
		} else if (kv->type == HYB_GGUF_VT_ARRAY) {
			if (kv->v.arr.type >= HYB_GGUF_VT_COUNT || !elem_size[kv->v.arr.type])
				abort();
			sum += touch(kv->v.arr.data, kv->v.arr.n * elem_size[kv->v.arr.type]);
		}
	}
	for (uint64_t i = 0; i < f->n_tensors; i++) {
		const struct hyb_gguf_tensor *t = &f->tensors[i];

		sum += touch_str(t->name);
		check_lookup(f, t->name, NULL, t);
		sum += touch(t->data, t->nbytes);
		if ((uint64_t)((const uint8_t *)t->data - f->base) % f->alignment)
			abort();
	}
	sink = sum;
	hyb_gguf_close(f);
	return 0;
}
