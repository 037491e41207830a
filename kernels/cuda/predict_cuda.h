/* SPDX-License-Identifier: MIT */
/*
 * The CUDA activation predictor (kernels/cuda/predict.cu), callable from C:
 * hyb/device.h's hyb_device_predict on a CUDA device. The device layer
 * (libhyb/device/device_cuda.cu) checks the arguments and owns the
 * workspace; these functions only size and launch. Streams are void * to
 * keep this header C.
 */
#ifndef HYB_PREDICT_CUDA_H
#define HYB_PREDICT_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "hyb/device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* n_in at most this: the F16 x lives in a block's shared memory (32 KiB). */
#define HYB_CUDA_PREDICT_MAX_IN 16384

/*
 * Bytes of workspace a call of this shape needs (device memory, 256-byte
 * aligned; its contents need no initialisation). With T = ceil(n_out / 64)
 * and A(b) = b rounded up to a multiple of 256:
 *
 *   256 + A(4 * hidden) + A(8 * T) + A(4 * n_out)
 *
 * (a counter, h, a 64-bit mask of positive logits per tile of 64 outputs,
 * the logits). 46848 bytes at 4096 -> 224 -> 11008. The workspace belongs
 * to one stream: calls queued on one stream may share it, calls that can
 * run concurrently may not.
 */
size_t hyb_cuda_predict_workspace(const struct hyb_dev_predict *p);

/*
 * Where in the workspace the last call left its float logits[n_out] (b2
 * included): for tests and diagnostics, valid once the call has completed.
 */

/*
 * Queue the predictor on stream (two kernels). Returns 0; -EINVAL for a
 * shape or alignment the kernels do not take (n_in not a multiple of 32 or
 * above HYB_CUDA_PREDICT_MAX_IN, a zero size, fc1_w or fc2_w not 2-byte
 * aligned, a float or uint32 array not 4-byte aligned, workspace not
 * 256-byte aligned or smaller than hyb_cuda_predict_workspace()); or a
 * (positive) cudaError_t of the launch.
 */
int hyb_cuda_predict(const struct hyb_dev_predict *p, void *workspace, size_t ws_bytes,
		     void *stream);

#ifdef __cplusplus
}
#endif

#endif
