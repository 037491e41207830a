/* SPDX-License-Identifier: MIT */
/*
 * CUDA runtime errors as -errno, with CUDA's message, for the copy engine
 * (daemon/copydev_cuda.cu) and the app's side of the GPU cache
 * (box/gpucache_cuda.cu): both report failures the way the rest of hyb does.
 */
#ifndef HYB_BOX_CUDA_ERRNO_H
#define HYB_BOX_CUDA_ERRNO_H

#include <cuda_runtime.h>
#include <errno.h>
#include <stdio.h>

/* The errno closest to e; -EIO for anything without a better one, never 0 for a failure. */
static inline int hyb_cuda_errno(cudaError_t e)
{
	switch (e) {
	case cudaSuccess:
		return 0;
	case cudaErrorInvalidValue:
	case cudaErrorInvalidDevicePointer:
	case cudaErrorInvalidResourceHandle:
		return -EINVAL;
	case cudaErrorMemoryAllocation:
		return -ENOMEM;
	case cudaErrorNoDevice:
	case cudaErrorInvalidDevice:
	case cudaErrorInsufficientDriver:
		return -ENODEV;
	default:
		return -EIO;
	}
}

/* err gets "what: CUDA's message"; clears a non-sticky error; returns the errno (never 0). */
static inline int hyb_cuda_fail(cudaError_t e, char *err, size_t errlen, const char *what)
{
	if (err && errlen)
		snprintf(err, errlen, "%s: %s", what, cudaGetErrorString(e));
	cudaGetLastError();
	return e == cudaSuccess ? -EIO : hyb_cuda_errno(e);
}

#endif
