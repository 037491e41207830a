/* SPDX-License-Identifier: MIT */
/*
 * CUDA kernels, callable from C. Weights use the same block layouts as the
 * CPU kernels and the GGUF file, so a bundle copied from a pool to the GPU is
 * computed on as is. Streams are passed as void * to keep this header C.
 */
#ifndef HYB_CUDA_KERNELS_H
#define HYB_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * y[r] = W[r] · x for nrows rows of k elements (F16, Q8_0, Q4_0), all in
 * device memory; x and y are float. Returns 0, or -1 for an unsupported
 * type or bad shape, or the CUDA error code of the launch.
 */
int hyb_cuda_gemv(uint32_t type, const void *w, size_t row_bytes, int64_t k, int64_t nrows,
		  const float *x, float *y, void *stream);

/* Number of usable CUDA devices (0 when there is no GPU or driver). */
int hyb_cuda_device_count(void);

#ifdef __cplusplus
}
#endif

#endif
