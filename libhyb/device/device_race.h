/* SPDX-License-Identifier: MIT */
/*
 * The CPU device's race detector for device memory (strict mode,
 * device_cpu.c): two operations on different streams that touch the same
 * bytes, one of them writing, must be ordered - by an event one stream
 * waits for, or by the host having seen the first complete (done() or
 * sync()) before it queued the second. The CPU device runs everything in
 * queue order, so an unordered pair gives the right answer here and a wrong
 * one on a GPU whenever its copy engine and its kernels overlap differently;
 * this finds such pairs whatever the timing.
 *
 * Happens-before is tracked with vector clocks over the streams: each
 * operation carries, per stream, the last operation of that stream it is
 * ordered after. An operation's footprint (its device byte ranges, read or
 * written) is kept until every stream and the host are ordered after it.
 */
#ifndef HYB_DEVICE_RACE_H
#define HYB_DEVICE_RACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define HYB_RACE_STREAMS 3

struct hyb_span {
	uintptr_t a, b;  /* [a, b) */
	bool write;
};

struct hyb_race;

struct hyb_race *hyb_race_new(void);
void hyb_race_free(struct hyb_race *r);
/*
 * Operation seq (from 1, consecutive) of stream s, touching n spans, is
 * queued. 0, or -1 when it races with an earlier operation: then msg says
 * with which (what names this one).
 */
int hyb_race_op(struct hyb_race *r, int s, uint64_t seq, const struct hyb_span *sp, uint32_t n,
		const char *what, char *msg, size_t len);
/* Stream s waits for operation seq of stream t (seq 0: nothing). */
void hyb_race_wait(struct hyb_race *r, int s, int t, uint64_t seq);
/* The host saw operation seq of stream t complete. */
void hyb_race_observed(struct hyb_race *r, int t, uint64_t seq);

#endif
