/* SPDX-License-Identifier: MIT */
/*
 * The streaming engine: load a byte range of a file into
 * memory - a pool, or any buffer - with io_uring. hybd uses it in box mode and
 * libhyb's model loader in embedded mode, so both share one code path.
 *
 * How: the file is opened O_DIRECT and registered as a fixed file; up to
 * `depth` reads of `chunk` bytes are kept in flight, each landing straight in
 * the destination, which is registered as fixed buffers when the kernel lets
 * us pin it (anonymous/THP memory yes, file-backed kmod pool mappings no: then
 * plain O_DIRECT reads). O_DIRECT needs 4096-aligned offsets, lengths and
 * addresses: the unaligned head and tail blocks of a range, and every chunk
 * when the destination's alignment does not match the file offset's, are read
 * into an aligned bounce buffer and copied. Where O_DIRECT is refused the file
 * is read buffered, with a one-line note; so is a range already wholly in
 * the page cache (a warm load: memory-speed copies beat going to the disk).
 * Where the kernel refuses io_uring (a container's seccomp profile, gVisor),
 * the same reads go to a few pread threads, with a one-line note
 * (stats.uring says which ran).
 *
 * Errors: a negative errno (-EIO and the read's own errors, -ERANGE for a
 * range past the end of the file or the pool, -ECANCELED, ...) and a
 * one-line message in hyb_last_error() naming the file and the offset; after
 * a device error also
 * the first 4096-byte block that fails when read alone (see
 * hyb_stream_find_bad_block). Every read is drained before returning, and on
 * failure the destination's content is undefined: callers publish ("mark
 * ready") only after a 0 return.
 */
#ifndef HYB_STREAM_H
#define HYB_STREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct hyb_mempool;

enum hyb_stream_progress {
	HYB_STREAM_AUTO = 0,	/* a bar when stderr is a terminal, plain lines otherwise */
	HYB_STREAM_QUIET = 1,	/* nothing (tests, embedded loads off a terminal) */
	HYB_STREAM_LINES = 2,	/* a line at every quarter (logs) */
	HYB_STREAM_BAR = 3,	/* a redrawn bar on stderr */
};

struct hyb_stream_opts {
	unsigned int depth;	/* reads in flight; 0: 32 (max 256) */
	uint32_t chunk;		/* bytes per read, a multiple of 4096; 0: 1 MiB (max 64 MiB) */
	int progress;		/* enum hyb_stream_progress */
	int buffered;		/* 1: no O_DIRECT (page-cache reads, still io_uring);
				 * 0: O_DIRECT unless the range is all cached */
	int pread;		/* 1: pread threads even where io_uring works (HYB_LOAD=pread) */
	const char *label;	/* shown by the progress output; NULL: the file name */
	int lazy_dst;		/* 1: the destination is not faulted in yet (a lazy
				 * pool): no fixed buffers, whose registration would
				 * fault it all in before the first read; each read
				 * faults in (zeroes) its own pages as it is issued */
	/*
	 * Called on the loading thread whenever the landed prefix grows: every
	 * byte of the range's first `bytes` is in the destination (reads land
	 * out of order; this is the part a reader may use). Nonzero return:
	 * stop issuing, drain, fail with "cancelled". NULL: not called.
	 */
	int (*landed)(void *arg, uint64_t bytes);
	void *landed_arg;
};

struct hyb_stream_stats {
	uint64_t bytes;		/* bytes delivered to the destination */
	uint64_t ns;		/* wall time of the load */
	uint64_t reads;		/* reads submitted, resubmissions included */
	uint64_t resubmits;	/* short reads, EINTR and EAGAIN retried */
	uint64_t bounced;	/* bytes that went through the bounce buffer */
	unsigned int max_in_flight;
	unsigned int direct;	/* 1: O_DIRECT */
	unsigned int fixed_bufs; /* 1: the destination was registered as fixed buffers */
	unsigned int uring;	/* 1: io_uring; 0: pread threads (io_uring refused here) */
};

/* Read file [file_off, file_off + len) into dst[0, len). opts/stats may be NULL. */
int hyb_stream_read(const char *path, uint64_t file_off, uint64_t len, void *dst,
		    const struct hyb_stream_opts *opts, struct hyb_stream_stats *stats);

/*
 * The same into pool [pool_off, pool_off + len) (mapped read-write: the owner).
 * A range past the pool's end fails before any I/O ("pool 'x' holds N bytes").
 */
int hyb_stream_to_pool(struct hyb_mempool *p, uint64_t pool_off, const char *path,
		       uint64_t file_off, uint64_t len, const struct hyb_stream_opts *opts,
		       struct hyb_stream_stats *stats);

/*
 * After a read of [off, off + len) of fd failed with a device error: read the
 * range again alone (in 4096-aligned pieces, fd O_DIRECT or not), halving it,
 * down to the first 4096-byte block that fails by itself. The block layer
 * fails reads merged into one request together, so the read that failed may
 * not hold the bad sector; this names where the file or the drive is damaged.
 * 0 with the block's file offset in *bad, *bad_len 4096 (more when halving
 * stopped after 2 s of a drive slow to fail reads) and the errno in *e; -1
 * when every block reads (an intermittent fault, or the bad sector was in
 * another read).
 */
int hyb_stream_find_bad_block(int fd, uint64_t off, uint64_t len, uint64_t *bad,
			      uint64_t *bad_len, int *e);
/* "the first bad block is bytes [B, E) of the file" (or "is within ..."): snprintf's return. */
int hyb_stream_bad_block_words(char *buf, size_t len, uint64_t bad, uint64_t bad_len);

/* True when the whole file is in the page cache (mincore: nothing is read). */
bool hyb_stream_cached(const char *path);

/* Words on a device errno (EIO; ENODATA: a medium error...) for reports; NULL for others. */
const char *hyb_stream_device_error(int e);

#endif
