// SPDX-License-Identifier: MIT
/*
 * The app's side of hybd's CUDA neuron cache (hyb/gpucache.h): map the
 * allocation hybd exported (daemon/copydev_cuda.cu) into this process with
 * CUDA IPC. Built when nvcc exists; box/gpucache.c has the weak "built
 * without CUDA" versions this file replaces.
 */
#include <cuda_runtime.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "box/cuda_errno.h"
#include "util/error.h"
#include "hyb/gpucache.h"

static_assert(sizeof(cudaIpcMemHandle_t) == sizeof(((hyb_gpucache_desc *)0)->ipc_handle),
	      "the descriptor must hold a CUDA IPC handle");

extern "C" int hyb_cuda_cache_open(const struct hyb_gpucache_desc *desc, int ordinal, void **base)
{
	cudaIpcMemHandle_t h;
	cudaError_t e;
	char bus[sizeof(desc->pci_bus_id) + 1];
	int dev;

	if (base)
		*base = NULL;
	if (!desc || !base || desc->magic != HYB_GPUCACHE_MAGIC ||
	    desc->version != HYB_GPUCACHE_VERSION || desc->kind != HYB_GPUCACHE_CUDA || !desc->n_slots || !desc->slot_bytes)
		return hyb_error_set(-EINVAL, "GPU cache descriptor: bad magic, version or size");
	memcpy(bus, desc->pci_bus_id, sizeof(desc->pci_bus_id));
	bus[sizeof(desc->pci_bus_id)] = 0;
	memcpy(&h, desc->ipc_handle, sizeof(h));
	if ((e = cudaDeviceGetByPCIBusId(&dev, bus)) != cudaSuccess) {
		char what[96];

		snprintf(what, sizeof(what), "GPU %s of hybd (pid %d) is not visible here", bus,
			 desc->pid);
		return hyb_error_set(hyb_cuda_fail(e, NULL, 0, what), "%s: %s", what,
				     cudaGetErrorString(e));
	}
	if (ordinal >= 0 && dev != ordinal)
		return hyb_error_set(-EXDEV, "hybd's GPU %s is device %d in this process, which "
				     "computes on device %d: use the same GPU", bus, dev, ordinal);
	if ((e = cudaSetDevice(dev)) != cudaSuccess ||
	    (e = cudaIpcOpenMemHandle(base, h, cudaIpcMemLazyEnablePeerAccess)) != cudaSuccess) {
		*base = NULL;
		return hyb_error_set(hyb_cuda_fail(e, NULL, 0, NULL),
				     "open hybd's GPU cache (CUDA IPC): %s", cudaGetErrorString(e));
	}
	return 0;
}

extern "C" int hyb_cuda_cache_close(void *base)
{
	cudaError_t e = cudaIpcCloseMemHandle(base);

	return e == cudaSuccess ? 0 : hyb_cuda_fail(e, NULL, 0, "close");
}
