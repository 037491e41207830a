/* SPDX-License-Identifier: MIT */
/*
 * The GPU neuron cache hybd shares with apps in box mode (docs/BOX.md):
 * reload requests go through the reload queue to the copy engine, hybd's.
 *
 * hybd owns one cache of n_slots slots of slot_bytes and the copy engine
 * that fills it (daemon/reload.c: HYB_RQ_UPLOAD pool range -> slot). It
 * publishes where the cache is in STATE_DIR/NAME.gpucache, a struct
 * hyb_gpucache_desc, before the manifest, and removes the file at shutdown.
 * An app computes on the slots in place:
 *
 *   cuda  the cache is device memory of hybd's process, exported as a CUDA
 *         IPC handle; hyb_cuda_cache_open() maps it into the app (same GPU,
 *         found by PCI bus id);
 *   host  hybd's CPU copy device (no GPU, or device = cpu): the slots are a
 *         shared pool, `pool`, that the app maps read-only, so the CPU
 *         device layer of the app reads what hybd's copies wrote.
 *
 * One app at a time decides what the slots hold (its neuron table is the
 * only record of it): an app holds an exclusive flock on the descriptor
 * file while it uses the cache; a second one is refused, not corrupted.
 */
#ifndef HYB_GPUCACHE_H
#define HYB_GPUCACHE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HYB_GPUCACHE_MAGIC	0x3143504755425948ULL	/* "HYBUGPC1" */
#define HYB_GPUCACHE_VERSION	2

enum hyb_gpucache_kind {
	HYB_GPUCACHE_CUDA = 0,		/* device memory, ipc_handle + pci_bus_id */
	HYB_GPUCACHE_HOST = 1,		/* host memory: the shared pool `pool` */
};

/* Plain bytes, native byte order (hybd and its apps run on one box). */
struct hyb_gpucache_desc {
	uint64_t magic;
	uint32_t version;
	int32_t pid;			/* the exporting process */
	uint32_t n_slots;
	uint32_t kind;			/* enum hyb_gpucache_kind */
	uint64_t slot_bytes;
	uint32_t queue;			/* the reload queue that fills it */
	uint32_t reserved0;
	char pci_bus_id[32];		/* cuda: "0000:3b:00.0" (ordinals differ per process) */
	uint8_t ipc_handle[64];		/* cuda: cudaIpcMemHandle_t of the cache */
	char pool[32];			/* host: the pool holding the slots, NUL-terminated */
	uint64_t reserved[4];
};

/*
 * The descriptor as a file: written aside, fsync'ed and renamed (mode
 * 0644), so a reader sees the old file or the whole new one. read checks
 * size, magic, version, kind and that the cache is not empty. 0 or a
 * negative errno (hyb_last_error() says why).
 */
int hyb_gpucache_desc_write(const char *path, const struct hyb_gpucache_desc *desc);
int hyb_gpucache_desc_read(const char *path, struct hyb_gpucache_desc *desc);
/* STATE_DIR/NAME.gpucache of instance `name` (hyb_state_dir()). */
void hyb_gpucache_path(const char *name, char *buf, size_t len);

/*
 * cuda kind: map an exported cache into this process (on the same GPU,
 * found by PCI bus id, made the calling thread's current device). *base is
 * slot 0; slot i is at base + i * slot_bytes. Close with
 * hyb_cuda_cache_close(base). ordinal >= 0: the device this process
 * computes on, which must be hybd's GPU (-EXDEV otherwise: kernels there
 * would reach the cache over peer access, if at all); -1: any. -ENODEV in a
 * build without CUDA.
 */
int hyb_cuda_cache_open(const struct hyb_gpucache_desc *desc, int ordinal, void **base);
int hyb_cuda_cache_close(void *base);

#ifdef __cplusplus
}
#endif

#endif
