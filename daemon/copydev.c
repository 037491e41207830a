// SPDX-License-Identifier: MIT
/*
 * The CPU copy device (copydev.h): "GPU cache slots" in host memory, with
 * copies paced to a configured bandwidth. The pacing sleeps until the time a
 * link of that bandwidth would have needed, measured from the copy's start,
 * so a slower link shows up as latency exactly where a real one would, and
 * pre-emption at chunk boundaries behaves as with a GPU.
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
};

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cpu_upload(struct hyb_copydev *d, uint32_t slot, uint64_t slot_off, const void *src,
		      uint64_t len, unsigned int prio)
{
	struct cpudev *c = (struct cpudev *)d;
	uint64_t t0 = now_ns(), end;

	(void)prio;
	if (slot >= d->n_slots || slot_off > d->slot_bytes || len > d->slot_bytes - slot_off)
		return -EINVAL;
	memcpy(c->mem + (uint64_t)slot * d->slot_bytes + slot_off, src, len);
	if (slot_off + len > c->valid[slot])
		c->valid[slot] = slot_off + len;
	d->bytes_copied += len;
	if (c->bps) {
		struct timespec ts;

		end = t0 + (uint64_t)((double)len * 1e9 / (double)c->bps);
		ts.tv_sec = (time_t)(end / 1000000000ull);
		ts.tv_nsec = (long)(end % 1000000000ull);
		while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
			;
	}
	return 0;
}

static int cpu_sync(struct hyb_copydev *d, unsigned int prio)
{
	(void)d;
	(void)prio;
	return 0;	/* copies are synchronous here */
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
