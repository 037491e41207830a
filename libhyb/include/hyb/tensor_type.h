/* SPDX-License-Identifier: MIT */
/*
 * Tensor element types, numbered as in ggml/GGUF so that files from
 * llama.cpp's tools load unchanged. The table in tensor_type.c knows the
 * block layout of every type ggml has defined; `computable` says whether
 * hyb's kernels can run it.
 */
#ifndef HYB_TENSOR_TYPE_H
#define HYB_TENSOR_TYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum hyb_type {
	HYB_TYPE_F32 = 0,
	HYB_TYPE_F16 = 1,
	HYB_TYPE_Q4_0 = 2,
	HYB_TYPE_Q4_1 = 3,
	HYB_TYPE_Q5_0 = 6,
	HYB_TYPE_Q5_1 = 7,
	HYB_TYPE_Q8_0 = 8,
	HYB_TYPE_Q8_1 = 9,  /* activations only (vec_dot type of Q4_1 and Q5_1) */
	HYB_TYPE_Q2_K = 10,
	HYB_TYPE_Q3_K = 11,
	HYB_TYPE_Q4_K = 12,
	HYB_TYPE_Q5_K = 13,
	HYB_TYPE_Q6_K = 14,
	HYB_TYPE_Q8_K = 15, /* activations only (llama.cpp's vec_dot type of the K-quants) */
	HYB_TYPE_IQ4_NL = 20,
	HYB_TYPE_IQ4_XS = 23,
	HYB_TYPE_I8 = 24,   /* plan metadata (placement flags) */
	HYB_TYPE_I32 = 26,  /* plan metadata (neuron permutations) */
	HYB_TYPE_BF16 = 30,
	HYB_TYPE_MXFP4 = 39, /* OCP MX FP4: gpt-oss's experts */
	HYB_TYPE_COUNT = 40, /* ggml's GGML_TYPE_COUNT at the time of writing */
};

struct hyb_type_info {
	const char *name;  /* NULL: id not a ggml type (removed or never used) */
	uint32_t blck;     /* elements per block */
	uint32_t size;     /* bytes per block */
	bool computable;   /* hyb has dequantize/dot kernels for it */
};

/* NULL when `type` is not a ggml type id. */
const struct hyb_type_info *hyb_type_info(uint32_t type);
/* "Q4_0", or "type#N" in a static buffer for unknown ids. */
const char *hyb_type_name(uint32_t type);
/*
 * Bytes of a row of n elements; 0 when the type is unknown or n is not a
 * multiple of the block size. Overflow-checked (returns 0).
 */
uint64_t hyb_row_bytes(uint32_t type, uint64_t n);

/*
 * Reference quantizers for weights (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1,
 * Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS),
 * bit-identical to llama.cpp's quantize_row_*_ref; the kernels are kernels/cpu/quant_ref.c.
 * Returns -1 for a type it cannot produce.
 */
int hyb_quantize_row_ref(uint32_t type, const float *x, void *out, int64_t n);

#ifdef __cplusplus
}
#endif

#endif
