/* SPDX-License-Identifier: MIT */
/*
 * The copy device of the reload service: GPU neuron-cache slots that pool
 * ranges are copied into (HYB_RQ_UPLOAD) and dropped from (HYB_RQ_EVICT).
 * DESIGN.md "Device backends": a CUDA implementation (issue 4, item 4:
 * pinned pools, one copy stream per priority, slots in device memory) and a
 * CPU one that honours the same interface - capacity, slots and a
 * configurable copy bandwidth - so the scheduling paths run without a GPU.
 *
 * Contract: upload() starts copying len bytes from src (pool memory) into
 * [slot_off, slot_off + len) of slot; it may return before the bytes landed
 * (CUDA: cudaMemcpyAsync on the stream of prio); sync(prio) waits until every
 * upload started at prio has landed, and only then may the request complete.
 * The reload service calls upload+sync once per chunk, so a critical copy
 * waits for at most one chunk of a lower-priority one (KAIROX 5.1/8).
 * Calls come from one thread (the service's device lane).
 */
#ifndef HYB_COPYDEV_H
#define HYB_COPYDEV_H

#include <stddef.h>
#include <stdint.h>

struct hyb_copydev;

struct hyb_copydev_ops {
	int (*upload)(struct hyb_copydev *d, uint32_t slot, uint64_t slot_off, const void *src,
		      uint64_t len, unsigned int prio);
	int (*sync)(struct hyb_copydev *d, unsigned int prio);
	int (*evict)(struct hyb_copydev *d, uint32_t slot);
	void (*close)(struct hyb_copydev *d);
};

struct hyb_copydev {
	const struct hyb_copydev_ops *ops;
	const char *name;		/* "cpu", "cuda" */
	uint32_t n_slots;
	uint64_t slot_bytes;
	uint64_t bytes_copied;		/* statistics */
	uint64_t evictions;
};

/*
 * The CPU device: n_slots host buffers of slot_bytes ("GPU memory"), copies
 * paced to bytes_per_s (0: memcpy speed) as a PCIe link would. NULL with a
 * message when the memory cannot be had.
 */
struct hyb_copydev *hyb_copydev_cpu_open(uint32_t n_slots, uint64_t slot_bytes,
					 uint64_t bytes_per_s, char *err, size_t errlen);
/* CPU device: the slot's bytes and how many are valid (0 after an evict). */
const void *hyb_copydev_cpu_slot(struct hyb_copydev *d, uint32_t slot, uint64_t *valid);

static inline void hyb_copydev_close(struct hyb_copydev *d)
{
	if (d)
		d->ops->close(d);
}

#endif
