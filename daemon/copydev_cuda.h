/* SPDX-License-Identifier: MIT */
/*
 * The CUDA copy device (docs/BOX.md): the
 * GPU neuron cache of the reload service, behind copydev.h.
 *
 *   - the cache is one device allocation of n_slots * slot_bytes made by
 *     whoever opens the device (hybd in box mode, the app in embedded mode);
 *   - pools are registered as pinned host memory (cudaHostRegister), so an
 *     upload is one DMA from the pool with no staging copy;
 *   - one copy stream per request priority (hyb/pool.h HYB_RQ_*), created
 *     with the device's stream priorities (critical highest), so a critical
 *     chunk is not queued behind prefetch copies in the same stream; the
 *     reload service's chunking bounds what it waits for (KAIROX 5.1/8);
 *   - box mode: the cache is exported as a CUDA IPC handle in a plain
 *     descriptor (struct hyb_gpucache_desc) hybd publishes; an app opens it
 *     with hyb_cuda_cache_open() and computes on the slots. Embedded mode:
 *     hyb_copydev_cuda_slot() is a plain device pointer.
 *
 * Built from daemon/copydev_cuda.cu when nvcc exists. Without CUDA,
 * daemon/copydev_nocuda.c provides the same functions (weak) failing with
 * "built without CUDA", so callers need no #ifdef and fall back to the CPU
 * device; hyb_copydev_cuda_built() says which one a program got. Every
 * function returns 0 or a negative errno (-ENODEV: no GPU or no CUDA in this
 * build, -EINVAL, -ENOMEM: device memory, -EIO: any other CUDA error) and
 * writes a one-line reason to err.
 */
#ifndef HYB_COPYDEV_CUDA_H
#define HYB_COPYDEV_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "copydev.h"
#include "hyb/gpucache.h"

#ifdef __cplusplus
extern "C" {
#endif

struct hyb_copydev_cuda_config {
	int device;			/* CUDA device ordinal */
	uint32_t n_slots;
	uint64_t slot_bytes;
};

/*
 * True when daemon/copydev_cuda.cu is linked into this program, false
 * when the calls below are daemon/copydev_nocuda.c's stubs. Says nothing about a GPU.
 */
bool hyb_copydev_cuda_built(void);

/* NULL with the reason in err (no GPU, no memory, no CUDA in this build). */
struct hyb_copydev *hyb_copydev_cuda_open(const struct hyb_copydev_cuda_config *cfg, char *err,
					  size_t errlen);
/*
 * Pin [addr, addr + len) (a pool mapping) for DMA. read_only: the mapping is
 * read-only (an app's view of hybd's pools). Unregistered source memory still
 * works, through CUDA's staging buffers. Regions are unpinned at close.
 * Unregister (and close) first wait for every copy queued on the device's
 * streams, so no DMA reads pages that are no longer pinned.
 */
int hyb_copydev_cuda_register(struct hyb_copydev *d, void *addr, size_t len, bool read_only,
			      char *err, size_t errlen);
int hyb_copydev_cuda_unregister(struct hyb_copydev *d, void *addr);
/* Device pointer of a slot (embedded mode); NULL for a bad slot or another device. */
void *hyb_copydev_cuda_slot(struct hyb_copydev *d, uint32_t slot);
/* Bytes written into a slot since its last eviction (host bookkeeping). */
uint64_t hyb_copydev_cuda_valid(struct hyb_copydev *d, uint32_t slot);

/*
 * Box mode: the cache shared with apps through CUDA IPC. Fills a
 * hyb/gpucache.h descriptor of kind HYB_GPUCACHE_CUDA (magic, version, pid,
 * slots, PCI bus id, IPC handle; the caller sets the queue); apps map it
 * with hyb_cuda_cache_open() (hyb/gpucache.h).
 */
int hyb_copydev_cuda_export(struct hyb_copydev *d, struct hyb_gpucache_desc *out, char *err,
			    size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
