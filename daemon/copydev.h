/* SPDX-License-Identifier: MIT */
/*
 * The copy device of the reload service: GPU neuron-cache slots that pool
 * ranges are copied into (HYB_RQ_UPLOAD) and dropped from (HYB_RQ_EVICT).
 * Two implementations (docs/BOX.md): a CUDA one (pinned pools, one copy
 * stream per priority, slots in device memory) and a
 * CPU one that honours the same interface - capacity, slots and a
 * configurable copy bandwidth - so the scheduling paths run without a GPU.
 *
 * Contract: upload() starts copying len bytes from src (pool memory) into
 * [slot_off, slot_off + len) of slot; it may return before the bytes landed
 * (CUDA: cudaMemcpyAsync on the stream of prio); sync(prio) waits until every
 * upload started at prio has landed, and only then may the request complete.
 * mark(prio) and wait(token) do the same for one point of a stream: what was
 * uploaded at prio before the mark, and nothing started after it. The reload
 * service uses them to keep two chunks in flight (upload + mark chunk k+1,
 * then wait for chunk k's mark), so the link does not idle for the host's
 * round trip between chunks; a critical copy then waits for at most the two
 * chunks in flight ahead of it (reload.h, HYB_RELOAD_DEVICE_DEPTH). The bound
 * has to come from what is queued, not from stream priorities: a GPU's copy
 * engine runs DMA in submission order whatever the stream's priority.
 * Calls come from one thread (the service's device lane), pin and unpin
 * excepted.
 */
#ifndef HYB_COPYDEV_H
#define HYB_COPYDEV_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hyb/pool.h"

/* Marks (mark/wait) a device keeps outstanding at once, at least. */
#define HYB_COPYDEV_MARKS	8

struct hyb_copydev;

struct hyb_copydev_ops {
	int (*upload)(struct hyb_copydev *d, uint32_t slot, uint64_t slot_off, const void *src,
		      uint64_t len, unsigned int prio);
	int (*sync)(struct hyb_copydev *d, unsigned int prio);
	int (*evict)(struct hyb_copydev *d, uint32_t slot);
	void (*close)(struct hyb_copydev *d);
	/*
	 * Optional (NULL: nothing to pin): make [addr, addr + len), a pool
	 * mapping uploads read from, DMA-able (CUDA: cudaHostRegister; without
	 * it an upload goes through the driver's staging copy). 0: pinned, the
	 * caller unpins; -EEXIST: already pinned by another owner of that
	 * mapping (not the caller's to unpin); other < 0: not pinned, uploads
	 * still work. Called from any thread, one call at a time.
	 */
	int (*pin)(struct hyb_copydev *d, void *addr, size_t len, bool read_only, char *err,
		   size_t errlen);
	int (*unpin)(struct hyb_copydev *d, void *addr);
	/*
	 * Optional, both or neither (NULL: callers sync after every upload).
	 * mark: *token marks the point of prio's stream after every upload
	 * started at prio so far. wait: returns once the uploads before that
	 * mark have landed; 0, or the error of one of them (CUDA reports an
	 * asynchronous copy's failure here). Each token is waited exactly once
	 * (that frees it; a wait of an unknown or freed token is -EINVAL); up to
	 * HYB_COPYDEV_MARKS tokens may be outstanding, mark is -EBUSY beyond.
	 * CUDA: an event recorded on the stream, cudaEventSynchronize.
	 */
	int (*mark)(struct hyb_copydev *d, unsigned int prio, uint32_t *token);
	int (*wait)(struct hyb_copydev *d, uint32_t token);
};

struct hyb_copydev {
	const struct hyb_copydev_ops *ops;
	const char *name;		/* "cpu", "cuda" */
	uint32_t n_slots;
	uint64_t slot_bytes;
	uint64_t bytes_copied;		/* statistics */
	uint64_t evictions;
	uint64_t pinned_bytes;		/* pinned through hyb_copydev_pin, not unpinned */
	uint32_t pinned;		/* regions of those */
};

/*
 * The CPU device: n_slots host buffers of slot_bytes ("GPU memory"), copies
 * paced to bytes_per_s (0: memcpy speed) as a PCIe link would. NULL with a
 * message when the memory cannot be had.
 */
struct hyb_copydev *hyb_copydev_cpu_open(uint32_t n_slots, uint64_t slot_bytes,
					 uint64_t bytes_per_s, char *err, size_t errlen);
/*
 * The same in memory the caller provides and keeps (n_slots * slot_bytes
 * writable bytes; closing the device leaves it): hybd passes a shared pool
 * so that apps in box mode compute on the slots (hyb/gpucache.h).
 */
struct hyb_copydev *hyb_copydev_cpu_open_at(void *mem, uint32_t n_slots, uint64_t slot_bytes,
					    uint64_t bytes_per_s, char *err, size_t errlen);
/* CPU device: the slot's bytes and how many are valid (0 after an evict). */
const void *hyb_copydev_cpu_slot(struct hyb_copydev *d, uint32_t slot, uint64_t *valid);

/*
 * CPU device: what it saw (tests). An upload is queued on the link behind
 * everything issued before it that has not landed (submission order, whatever
 * the priority: as a GPU's copy engine does). The link figures need a paced
 * device (bytes_per_s > 0); unpaced copies land at once.
 */
struct hyb_copydev_cpu_stats {
	uint32_t max_queued;		/* most uploads on the link at once, not landed */
	uint32_t max_marks;		/* most marks outstanding at once */
	/* per priority: most bytes still to cross the link ahead of an upload */
	uint64_t max_ahead[HYB_RQ_PRIO_LEVELS];
	uint64_t marks, waits;		/* marks made, marks waited for */
};
/* 0, or -EINVAL when d is not a CPU device. */
int hyb_copydev_cpu_stats(struct hyb_copydev *d, struct hyb_copydev_cpu_stats *out);

/* ops->pin with the statistics kept; -EOPNOTSUPP when the device pins nothing. */
static inline int hyb_copydev_pin(struct hyb_copydev *d, void *addr, size_t len, bool read_only,
				  char *err, size_t errlen)
{
	int ret;

	if (!d->ops->pin)
		return -EOPNOTSUPP;
	ret = d->ops->pin(d, addr, len, read_only, err, errlen);
	if (!ret) {
		d->pinned_bytes += len;
		d->pinned++;
	}
	return ret;
}

/* Undo a hyb_copydev_pin that returned 0 (len as given to it). */
static inline void hyb_copydev_unpin(struct hyb_copydev *d, void *addr, size_t len)
{
	if (d->ops->unpin && !d->ops->unpin(d, addr)) {
		d->pinned_bytes -= len;
		d->pinned--;
	}
}

static inline void hyb_copydev_close(struct hyb_copydev *d)
{
	if (d)
		d->ops->close(d);
}

#endif
