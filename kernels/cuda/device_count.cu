// SPDX-License-Identifier: MIT
/* How many CUDA devices this process can use: the GPU tests' skip test. */
#include <cuda_runtime.h>

#include "cuda_kernels.h"

extern "C" int hyb_cuda_device_count(void)
{
	int n = 0;

	if (cudaGetDeviceCount(&n) != cudaSuccess) {
		cudaGetLastError();
		return 0;
	}
	return n;
}
