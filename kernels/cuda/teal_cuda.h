/* SPDX-License-Identifier: MIT */
/*
 * TEAL's input-sparse projection on CUDA (kernels/cuda/teal.cu), callable
 * from C: hyb/device.h struct hyb_dev_teal with the checks done. The
 * device layer (libhyb/device/device_cuda.cu) owns the workspace; these
 * functions only size and launch.
 */
#ifndef HYB_TEAL_CUDA_H
#define HYB_TEAL_CUDA_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HYB_CUDA_TEAL_ROWS 16 /* rows of x a call takes at most */

struct hyb_cuda_teal {
	uint32_t type;     /* HYB_TYPE_F32, F16, Q8_0, Q4_0 */
	uint32_t n_in, n_out;
	uint32_t rows;     /* 1..HYB_CUDA_TEAL_ROWS: x [rows][n_in], y [rows][n_out] */
	uint64_t row_bytes;
	const void *w;     /* n_in rows of row_bytes (a multiple of 4), 2-byte aligned (4 for F32) */
	const float *x;
	float thr;
	float *y;
	void *work;        /* hyb_cuda_teal_work_bytes() */
	int n_sm;
};

/* Workspace bytes for this shape: the list of inputs, the rows' values, the split sums. */
uint64_t hyb_cuda_teal_work_bytes(uint32_t n_in, uint32_t n_out, uint32_t rows, int n_sm);

/* Queue the call on stream. 0, -EINVAL for a type it does not take, or a cudaError_t. */
int hyb_cuda_teal(const struct hyb_cuda_teal *t, void *stream);

#ifdef __cplusplus
}
#endif

#endif
