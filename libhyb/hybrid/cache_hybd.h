/* SPDX-License-Identifier: MIT */
/*
 * Box mode's neuron cache (hyb/gpucache.h; reload requests go through the
 * reload queue to the copy engine, hybd's in box mode): the
 * hybrid engine (ffn_hybrid.c) of an app whose model hybd serves computes on
 * hybd's cache slots, and loads a neuron group into a slot by sending hybd
 * an UPLOAD request (pool range of the group's bundle -> slot) instead of
 * copying it itself. hybd's copy engine then does the copy, by priority and
 * in chunks, and `hybctl stalls` shows the traffic live.
 *
 * What the app's device reads: CUDA, the cache mapped through CUDA IPC;
 * the CPU device, hybd's shared slots pool mapped read-only. Either way the
 * app never writes the cache. A load has landed when its completion is
 * reaped (hybd completes an UPLOAD after the copy is synchronised), so a
 * slot is computed on only after that; until then its neurons are "late"
 * and the CPU computes them, as with the engine's own loads.
 */
#ifndef HYB_CACHE_HYBD_H
#define HYB_CACHE_HYBD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hyb/device.h"
#include "hyb/model.h"
#include "sparse/sparse_op.h"

struct hyb_hybd_cache;

struct hyb_hybd_cache_info {
	uint32_t n_slots;
	uint64_t slot_bytes;
	hyb_dptr base;			/* slot i at base + i * slot_bytes, for the app's device */
	uint32_t queue;
	int32_t pid;			/* hybd's */
	const char *kind;		/* "cuda", "host" */
	char path[4200];		/* the descriptor file */
};

/*
 * Use the cache hybd publishes for m (a box-mode model of a plan), for an
 * app on device kind `dev_kind` ("cpu" takes a host cache, "cuda" a CUDA
 * one, which must be on the app's CUDA device `ordinal`). bundles[l]: the engine's bundles of layer l; every group's manifest
 * entry must name exactly those bytes. Holds the descriptor's lock until
 * closed: one app per cache. NULL with a one-line reason in err and *code:
 * -ENOENT no descriptor (hybd has no shared cache), -EBUSY another process
 * uses it, -EXDEV the cache is of another kind than the app's device,
 * -EINVAL a mismatch (another hybd, another model), other errnos as they came.
 */
struct hyb_hybd_cache *hyb_hybd_cache_open(const struct hyb_model *m, const char *dev_kind,
					   int ordinal, const struct hyb_ffn_bundles *const *bundles,
					   int *code, char *err, size_t errlen);
void hyb_hybd_cache_info(const struct hyb_hybd_cache *c, struct hyb_hybd_cache_info *out);
/* Closes the queue role and unmaps the cache; the slots keep their bytes in hybd. */
void hyb_hybd_cache_close(struct hyb_hybd_cache *c);

/*
 * Queue the load of group g of layer l into slot (prio HIGH: CRITICAL is
 * left to what an app waits for right now). tag comes back from reap.
 * -EAGAIN: too many requests in flight, reap some first; -EPIPE: hybd went
 * away; other negative errnos with the reason in hyb_hybd_cache_error().
 */
int hyb_hybd_cache_upload(struct hyb_hybd_cache *c, uint32_t slot, uint32_t l, uint32_t g,
			  uint64_t tag);
/*
 * Tags of up to max completed loads into tags; wait: block until at least
 * one completes. Returns how many, or a negative errno (-EPIPE hybd went
 * away, -EIO a load failed in hybd) with the reason in
 * hyb_hybd_cache_error(). Never times out while hybd is alive.
 */
int hyb_hybd_cache_reap(struct hyb_hybd_cache *c, uint64_t *tags, unsigned int max, bool wait);
const char *hyb_hybd_cache_error(const struct hyb_hybd_cache *c);

#endif
