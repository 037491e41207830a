// SPDX-License-Identifier: MIT
/*
 * The CPU copy device (copydev.h): "GPU cache slots" in host memory, with
 * copies paced to a configured bandwidth. It models a copy engine: upload()
 * writes the bytes at once but queues the copy on a link of that bandwidth,
 * behind every copy issued before it that has not landed (submission order,
 * whatever the priority, as a GPU's DMA engine does); sync() and wait() sleep
 * until the copies they cover land in that model. So a slower link shows up
 * as latency exactly where a real one would, two chunks in flight keep it
 * busy as on a GPU, and pre-emption at chunk boundaries behaves as there.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "copydev.h"

struct cpudev {
	struct hyb_copydev d;
	uint8_t *mem;
	bool own_mem;			/* mem is our mapping (else the caller's: a shared pool) */
	uint64_t *valid;		/* bytes written per slot since its last evict */
	uint64_t bps;
	struct region { uint8_t *addr; size_t len; } *regs;	/* pinned, as CUDA's table */
	uint32_t n_regs, cap_regs;
	/* the link model (CLOCK_MONOTONIC ns) */
	uint64_t link_free;		/* everything issued so far has landed */
	uint64_t land[HYB_RQ_PRIO_LEVELS];	/* the last upload at that priority lands */
	uint64_t queued[64];		/* landing times of uploads on the link (capped) */
	uint32_t n_queued;
	struct mark { uint64_t land; uint32_t token; bool busy; } marks[HYB_COPYDEV_MARKS];
	uint32_t next_token, n_marks;
	struct hyb_copydev_cpu_stats st;
};

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_until(uint64_t t)
{
	struct timespec ts = {
		.tv_sec = (time_t)(t / 1000000000ull),
		.tv_nsec = (long)(t % 1000000000ull),
	};

	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

static int cpu_upload(struct hyb_copydev *d, uint32_t slot, uint64_t slot_off, const void *src,
		      uint64_t len, unsigned int prio)
{
	struct cpudev *c = (struct cpudev *)d;
	uint64_t now, start, n = 0;

	if (slot >= d->n_slots || slot_off > d->slot_bytes || len > d->slot_bytes - slot_off)
		return -EINVAL;
	if (prio >= HYB_RQ_PRIO_LEVELS)
		prio = HYB_RQ_PRIO_LEVELS - 1;
	now = now_ns();		/* the copy starts now: memcpy's time counts */
	memcpy(c->mem + (uint64_t)slot * d->slot_bytes + slot_off, src, len);
	if (slot_off + len > c->valid[slot])
		c->valid[slot] = slot_off + len;
	d->bytes_copied += len;
	if (!c->bps)
		return 0;	/* unpaced: landed at once */
	start = c->link_free > now ? c->link_free : now;
	/* what is still to cross the link ahead of this copy */
	n = (uint64_t)((double)(start - now) * (double)c->bps / 1e9);
	if (n > c->st.max_ahead[prio])
		c->st.max_ahead[prio] = n;
	c->link_free = start + (uint64_t)((double)len * 1e9 / (double)c->bps);
	c->land[prio] = c->link_free;
	/* the copies on the link now, this one included */
	n = 0;
	for (uint32_t i = 0; i < c->n_queued; i++)
		if (c->queued[i] > now)
			c->queued[n++] = c->queued[i];
	c->n_queued = (uint32_t)n;
	if (c->n_queued < sizeof(c->queued) / sizeof(c->queued[0]))
		c->queued[c->n_queued++] = c->link_free;
	if (c->n_queued > c->st.max_queued)
		c->st.max_queued = c->n_queued;
	return 0;
}

static int cpu_sync(struct hyb_copydev *d, unsigned int prio)
{
	struct cpudev *c = (struct cpudev *)d;

	if (prio >= HYB_RQ_PRIO_LEVELS)
		prio = HYB_RQ_PRIO_LEVELS - 1;
	if (c->bps)
		sleep_until(c->land[prio]);
	return 0;
}

static int cpu_mark(struct hyb_copydev *d, unsigned int prio, uint32_t *token)
{
	struct cpudev *c = (struct cpudev *)d;
	struct mark *m = &c->marks[c->next_token % HYB_COPYDEV_MARKS];

	if (prio >= HYB_RQ_PRIO_LEVELS)
		prio = HYB_RQ_PRIO_LEVELS - 1;
	if (m->busy)
		return -EBUSY;
	*m = (struct mark){ .land = c->land[prio], .token = c->next_token, .busy = true };
	*token = c->next_token++;
	c->st.marks++;
	if (++c->n_marks > c->st.max_marks)
		c->st.max_marks = c->n_marks;
	return 0;
}

static int cpu_wait(struct hyb_copydev *d, uint32_t token)
{
	struct cpudev *c = (struct cpudev *)d;
	struct mark *m = &c->marks[token % HYB_COPYDEV_MARKS];

	if (!m->busy || m->token != token)
		return -EINVAL;
	m->busy = false;
	c->n_marks--;
	c->st.waits++;
	if (c->bps)
		sleep_until(m->land);
	return 0;
}

static int cpu_evict(struct hyb_copydev *d, uint32_t slot)
{
	struct cpudev *c = (struct cpudev *)d;

	if (slot >= d->n_slots)
		return -EINVAL;
	c->valid[slot] = 0;
	d->evictions++;
	return 0;
}

/*
 * Host memory needs no pinning here; the table is kept anyway, with CUDA's
 * rules (an overlapping region is -EEXIST), so that who pins what, and
 * whether it is given back, is testable without a GPU.
 */
static int cpu_pin(struct hyb_copydev *d, void *addr, size_t len, bool read_only, char *err,
		   size_t errlen)
{
	struct cpudev *c = (struct cpudev *)d;
	uint8_t *a = addr;

	(void)read_only;
	if (!a || !len) {
		snprintf(err, errlen, "cpu device: pin of an empty region");
		return -EINVAL;
	}
	for (uint32_t i = 0; i < c->n_regs; i++) {
		if (a < c->regs[i].addr + c->regs[i].len && c->regs[i].addr < a + len) {
			snprintf(err, errlen, "cpu device: %p is already pinned", addr);
			return -EEXIST;
		}
	}
	if (c->n_regs == c->cap_regs) {
		uint32_t cap = c->cap_regs ? 2 * c->cap_regs : 8;
		struct region *r = realloc(c->regs, cap * sizeof(*r));

		if (!r) {
			snprintf(err, errlen, "out of memory");
			return -ENOMEM;
		}
		c->regs = r;
		c->cap_regs = cap;
	}
	c->regs[c->n_regs++] = (struct region){ a, len };
	return 0;
}

static int cpu_unpin(struct hyb_copydev *d, void *addr)
{
	struct cpudev *c = (struct cpudev *)d;

	for (uint32_t i = 0; i < c->n_regs; i++) {
		if (c->regs[i].addr == addr) {
			c->regs[i] = c->regs[--c->n_regs];
			return 0;
		}
	}
	return -ENOENT;
}

static void cpu_close(struct hyb_copydev *d)
{
	struct cpudev *c = (struct cpudev *)d;

	if (c->mem && c->own_mem)
		munmap(c->mem, (size_t)d->n_slots * d->slot_bytes);
	free(c->valid);
	free(c->regs);
	free(c);
}

static const struct hyb_copydev_ops cpu_ops = {
	.upload = cpu_upload,
	.sync = cpu_sync,
	.evict = cpu_evict,
	.close = cpu_close,
	.pin = cpu_pin,
	.unpin = cpu_unpin,
	.mark = cpu_mark,
	.wait = cpu_wait,
};

static struct cpudev *cpu_new(uint32_t n_slots, uint64_t slot_bytes, uint64_t bytes_per_s,
			      char *err, size_t errlen)
{
	struct cpudev *c;

	if (!n_slots || !slot_bytes || slot_bytes > (1ull << 34) || n_slots > (1u << 20)) {
		snprintf(err, errlen, "cpu device: %u slots of %llu bytes is out of range", n_slots,
			 (unsigned long long)slot_bytes);
		return NULL;
	}
	c = calloc(1, sizeof(*c));
	if (c)
		c->valid = calloc(n_slots, sizeof(*c->valid));
	if (!c || !c->valid) {
		free(c);
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	c->d.ops = &cpu_ops;
	c->d.name = "cpu";
	c->d.n_slots = n_slots;
	c->d.slot_bytes = slot_bytes;
	c->bps = bytes_per_s;
	return c;
}

struct hyb_copydev *hyb_copydev_cpu_open(uint32_t n_slots, uint64_t slot_bytes,
					 uint64_t bytes_per_s, char *err, size_t errlen)
{
	struct cpudev *c = cpu_new(n_slots, slot_bytes, bytes_per_s, err, errlen);
	const uint64_t total = (uint64_t)n_slots * slot_bytes;

	if (!c)
		return NULL;
	/* reserved, not touched: pages appear as slots are filled */
	c->mem = mmap(NULL, total, PROT_READ | PROT_WRITE,
		      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (c->mem == MAP_FAILED) {
		snprintf(err, errlen, "cpu device: cannot reserve %u slots of %llu bytes: %s",
			 n_slots, (unsigned long long)slot_bytes, strerror(errno));
		c->mem = NULL;
		cpu_close(&c->d);
		return NULL;
	}
	c->own_mem = true;
	return &c->d;
}

struct hyb_copydev *hyb_copydev_cpu_open_at(void *mem, uint32_t n_slots, uint64_t slot_bytes,
					    uint64_t bytes_per_s, char *err, size_t errlen)
{
	struct cpudev *c;

	if (!mem) {
		snprintf(err, errlen, "cpu device: no memory given for the slots");
		return NULL;
	}
	c = cpu_new(n_slots, slot_bytes, bytes_per_s, err, errlen);
	if (!c)
		return NULL;
	c->mem = mem;
	return &c->d;
}

const void *hyb_copydev_cpu_slot(struct hyb_copydev *d, uint32_t slot, uint64_t *valid)
{
	struct cpudev *c = (struct cpudev *)d;

	if (!d || d->ops != &cpu_ops || slot >= d->n_slots)
		return NULL;
	if (valid)
		*valid = c->valid[slot];
	return c->mem + (uint64_t)slot * d->slot_bytes;
}

int hyb_copydev_cpu_stats(struct hyb_copydev *d, struct hyb_copydev_cpu_stats *out)
{
	if (!d || d->ops != &cpu_ops)
		return -EINVAL;
	*out = ((struct cpudev *)d)->st;
	return 0;
}
