/* SPDX-License-Identifier: MIT */
/*
 * The CUDA sparse FFN over cached neuron groups and the add kernel
 * (kernels/cuda/sparse_ffn.cu), callable from C. The device layer
 * (libhyb/device/device_cuda.cu) checks the arguments and owns the scratch;
 * these functions only size and launch. Streams are void * to keep this
 * header C.
 */
#ifndef HYB_SPARSE_FFN_CUDA_H
#define HYB_SPARSE_FFN_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * One call, all pointers in device memory (hyb/device.h struct hyb_dev_ffn
 * with the checks done). Neuron i of the active list is in group g = i /
 * group_size, whose bundle is at cache + table[g] * slot_bytes: a table
 * entry < 0, or one whose bundle would end beyond cache + cache_span, is not
 * read: the neuron counts as h = 0 and bad[0] = 1, bad[1] = i are stored
 * (bad may be NULL; it should be host memory mapped for the device, so the
 * host can look without a copy).
 */
struct hyb_cuda_ffn {
	uint32_t type;            /* HYB_TYPE_F16, Q8_0, Q4_0 */
	uint32_t n_embd, n_ff, group_size;
	int act;                  /* enum hyb_ffn_act */
	float thr;                /* CATS threshold, SiLU or GeGLU (hyb/sparsity.h); 0: none */
	const uint16_t *gelu;     /* GeGLU: ggml's F16 GELU table [65536], device memory */
	const int32_t *table;     /* [ceil(n_ff / group_size)] */
	const void *cache;        /* even address */
	uint64_t cache_span;      /* bytes from cache to the end of its allocation */
	uint64_t slot_bytes;      /* even, >= 3 * group_size * row bytes */
	const float *xn;          /* [n_embd] */
	const uint32_t *active;   /* [n_active] */
	uint32_t n_active;
	float *y;                 /* [n_embd]; may alias xn */
	bool accumulate;
	void *scratch;            /* hyb_cuda_ffn_scratch_bytes(), zeroed when allocated */
	uint32_t *bad;            /* [2] or NULL */
	int n_sm;                 /* multiprocessors of the device (grid sizes) */
};

/*
 * Bytes of scratch a call with this shape needs. Scratch belongs to one
 * stream: calls queued on one stream may share it, calls on two streams
 * may not (the kernels leave its counters zero for the next call).
 */
uint64_t hyb_cuda_ffn_scratch_bytes(uint32_t n_embd, uint32_t n_active, int n_sm);

/* Dynamic shared memory the first kernel needs for n_embd (0: unsupported type). */
uint32_t hyb_cuda_ffn_smem(uint32_t type, uint32_t n_embd);

/* Allow every instantiation smem_max bytes of dynamic shared memory; 0 or a cudaError_t. */
int hyb_cuda_ffn_setup(int smem_max);

/*
 * Queue the call on stream. Returns 0; -EINVAL for a type or shape the
 * kernels do not take (a bug of the caller: the device layer checks
 * first); or a (positive) cudaError_t of the launch.
 */
int hyb_cuda_sparse_ffn(const struct hyb_cuda_ffn *f, void *stream);

/* y[i] += x[i], i < n. 0 or a cudaError_t. */
int hyb_cuda_add(float *y, const float *x, uint32_t n, void *stream);

/*
 * g[i] = act(g[i], u[i]), i < n: hyb_ffn_act's activations (act an enum
 * hyb_ffn_act; GeGLU reads gelu, ggml's F16 GELU table in device memory).
 * 0, -EINVAL for another act, or a cudaError_t.
 */
int hyb_cuda_ffn_act(float *g, const float *u, uint32_t n, int act, const uint16_t *gelu,
		     void *stream);

#ifdef __cplusplus
}
#endif

#endif
