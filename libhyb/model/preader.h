/* SPDX-License-Identifier: MIT */
/*
 * io_uring's stand-in where the kernel refuses it (Docker's default seccomp
 * profile, gVisor): a few threads that pread() one file, fed a queue of reads
 * and returning completions, so the streaming engine keeps its pieces, slots
 * and error handling and only the transport changes.
 */
#ifndef HYB_MODEL_PREADER_H
#define HYB_MODEL_PREADER_H

#include <stddef.h>
#include <stdint.h>

struct hyb_preader;

struct hyb_preader_cqe {
	uint64_t tag;
	int res;		/* bytes read, or -errno */
};

/* NULL with hyb_last_error() set when threads or memory are refused. */
struct hyb_preader *hyb_preader_new(int fd, unsigned int threads, unsigned int depth);
/* Waits for the reads in flight, then ends the threads. */
void hyb_preader_free(struct hyb_preader *p);
/* Queue pread(fd, buf, len, off); at most `depth` in flight. 0 or -EAGAIN (full). */
int hyb_preader_submit(struct hyb_preader *p, uint64_t tag, void *buf, size_t len, uint64_t off);
/* Completions, at least one (blocks while none is ready and one is in flight); 0: none in flight. */
unsigned int hyb_preader_reap(struct hyb_preader *p, struct hyb_preader_cqe *out,
			      unsigned int max);

#endif
