/* SPDX-License-Identifier: MIT */
/*
 * A guard for file mappings read in place (hyb_gguf_open's, which HYB_LOAD=mmap
 * computes on): a page the kernel cannot read in - the drive fails the read,
 * or the file was truncated or replaced while mapped - is reported by SIGBUS
 * at whatever instruction touched it, deep inside a kernel or a worker
 * thread. Nothing there can unwind, so the guard's handler says which file,
 * byte and tensor could not be read, on stderr, and ends the process with
 * exit status 1 (HYB_MAP_GUARD_EXIT), as every other read error does, instead
 * of a core dump with no word on the cause.
 *
 * The handler is installed by the first hyb_map_guard_add(). An application
 * that already had a SIGBUS handler keeps it: faults outside guarded ranges
 * (and every fault, when the application installs its own handler later)
 * go to it. The handler is async-signal-safe: it reads the slot table and
 * the guarded file's tensor list, formats with its own code and write()s.
 */
#ifndef HYB_MAP_GUARD_H
#define HYB_MAP_GUARD_H

#include <stdint.h>

#include "hyb/gguf.h"

#define HYB_MAP_GUARD_SLOTS 64
#define HYB_MAP_GUARD_EXIT 1

/*
 * Guard [base, base + len), the mapping of path (copied, truncated to 255
 * bytes). Returns the slot, or -1 when all HYB_MAP_GUARD_SLOTS are in use or
 * the handler cannot be installed (the mapping then works unguarded).
 */
int hyb_map_guard_add(const void *base, uint64_t len, const char *path);
/* Name tensors in the slot's reports: g's tensors lie in its range. NULL: none. */
void hyb_map_guard_set_gguf(int slot, const struct hyb_gguf_file *g);
/* Before the range is unmapped. slot -1 is ignored. */
void hyb_map_guard_remove(int slot);

#endif
