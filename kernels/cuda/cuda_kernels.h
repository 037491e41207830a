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

/* Number of usable CUDA devices (0 when there is no GPU or driver). */
int hyb_cuda_device_count(void);

#ifdef __cplusplus
}
#endif

#endif
