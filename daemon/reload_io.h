/* SPDX-License-Identifier: MIT */
/*
 * The storage lane's reader: chunk-sized reads of the model file into pool
 * memory through one io_uring that lives as long as the lane.
 *
 * Why not a call of the streaming engine (stream.h) per chunk: the engine
 * sets up a ring, opens and registers the file, checks the page cache and
 * registers the destination on every call - measured here at ~300 us, more
 * than the 256 KiB read it serves (~230 us on this disk). That is the right
 * trade for multi-gigabyte loads and the wrong one for reloads, whose
 * latency is the product. The reader keeps the same technique (O_DIRECT,
 * a fixed file, reads in flight in parallel, whole blocks straight into the
 * destination when it is aligned like the file, head and tail blocks through
 * a bounce buffer) with everything set up once. The service falls back to
 * the streaming engine when the reader cannot be set up.
 */
#ifndef HYB_RELOAD_IO_H
#define HYB_RELOAD_IO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct hyb_rio;

/*
 * A reader of path for reads of up to max_len bytes, depth reads in flight.
 * NULL with a message when io_uring or the file cannot be had.
 */
struct hyb_rio *hyb_rio_open(const char *path, uint64_t max_len, unsigned int depth, char *err,
			     size_t errlen);
/*
 * Read file [off, off + len) into dst (len <= max_len). 0, or a negative
 * errno with a message (-EIO: the read failed; -ERANGE: the file ended).
 */
int hyb_rio_read(struct hyb_rio *r, uint64_t off, uint64_t len, uint8_t *dst, char *msg,
		 size_t msglen);
/* The file the reader has open: device and inode (to notice a replaced file). */
void hyb_rio_ident(const struct hyb_rio *r, dev_t *dev, ino_t *ino);
void hyb_rio_close(struct hyb_rio *r);

#endif
