// SPDX-License-Identifier: MIT
/*
 * The CUDA copy device (daemon/copydev_cuda.h): the GPU
 * neuron cache is one device allocation cut into slots; pool memory is
 * pinned with cudaHostRegister so each upload is a single DMA; each request
 * priority has its own non-blocking stream created with the device's stream
 * priorities, critical highest. upload() only enqueues (cudaMemcpyAsync);
 * sync(prio) waits for that priority's stream; mark(prio) records one of a
 * ring of events on it and wait(token) synchronises that event alone. The
 * reload service uploads and marks chunk k+1 before it waits for chunk k's
 * event, so the link does not idle for a host round trip per chunk, and it
 * never has more than two chunks queued: that, not the stream priorities,
 * bounds how long a critical copy waits behind a prefetch (KAIROX 5.1/8:
 * pre-emption at chunk boundaries). Measured on an H200, the copy engine ran
 * DMA in submission order whatever the streams' priorities: a critical
 * upload queued behind 512 MiB of prefetch landed after all of it.
 *
 * Unpinning a region (unregister, close) first drains every stream: a copy
 * still reading pinned pages must not outlive their registration.
 *
 * Calls other than open/close may come from another thread than open's (the
 * reload service's device lane): each one makes the device current first.
 */
#include <cuda_runtime.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "box/cuda_errno.h"
#include "copydev_cuda.h"
#include "hyb/pool.h"

static_assert(sizeof(cudaIpcMemHandle_t) == sizeof(((hyb_gpucache_desc *)0)->ipc_handle),
	      "the descriptor must hold a CUDA IPC handle");

#define N_PRIO HYB_RQ_PRIO_LEVELS

struct region {
	void *addr;
	size_t len;
};

struct cudadev {
	struct hyb_copydev d;		/* first: the copydev.h handle */
	int dev;
	uint8_t *cache;			/* device memory, n_slots * slot_bytes */
	uint64_t *valid;		/* bytes written per slot since its last evict */
	cudaStream_t stream[N_PRIO];
	cudaEvent_t mark[HYB_COPYDEV_MARKS];	/* token t uses mark[t % HYB_COPYDEV_MARKS] */
	uint32_t mark_token[HYB_COPYDEV_MARKS];
	bool mark_busy[HYB_COPYDEV_MARKS];
	uint32_t next_token;
	struct region *regs;
	unsigned int n_regs, cap_regs;
	bool ro_ok;			/* cudaHostRegisterReadOnly is supported */
};

static int cu_upload(struct hyb_copydev *d, uint32_t slot, uint64_t slot_off, const void *src,
		     uint64_t len, unsigned int prio)
{
	struct cudadev *c = (struct cudadev *)d;
	cudaError_t e;

	if (slot >= d->n_slots || slot_off > d->slot_bytes || len > d->slot_bytes - slot_off)
		return -EINVAL;
	if (prio >= N_PRIO)
		prio = N_PRIO - 1;
	if ((e = cudaSetDevice(c->dev)) != cudaSuccess ||
	    (e = cudaMemcpyAsync(c->cache + (uint64_t)slot * d->slot_bytes + slot_off, src, len,
				 cudaMemcpyHostToDevice, c->stream[prio])) != cudaSuccess)
		return hyb_cuda_fail(e, NULL, 0, "upload");
	if (slot_off + len > c->valid[slot])
		c->valid[slot] = slot_off + len;
	d->bytes_copied += len;
	return 0;
}

static int cu_sync(struct hyb_copydev *d, unsigned int prio)
{
	struct cudadev *c = (struct cudadev *)d;
	cudaError_t e;

	if (prio >= N_PRIO)
		prio = N_PRIO - 1;
	if ((e = cudaSetDevice(c->dev)) != cudaSuccess ||
	    (e = cudaStreamSynchronize(c->stream[prio])) != cudaSuccess)
		return hyb_cuda_fail(e, NULL, 0, "sync");
	return 0;
}

static int cu_mark(struct hyb_copydev *d, unsigned int prio, uint32_t *token)
{
	struct cudadev *c = (struct cudadev *)d;
	unsigned int i = c->next_token % HYB_COPYDEV_MARKS;
	cudaError_t e;

	if (prio >= N_PRIO)
		prio = N_PRIO - 1;
	if (c->mark_busy[i])
		return -EBUSY;
	if ((e = cudaSetDevice(c->dev)) != cudaSuccess ||
	    (e = cudaEventRecord(c->mark[i], c->stream[prio])) != cudaSuccess)
		return hyb_cuda_fail(e, NULL, 0, "mark");
	c->mark_busy[i] = true;
	c->mark_token[i] = c->next_token;
	*token = c->next_token++;
	return 0;
}

static int cu_wait(struct hyb_copydev *d, uint32_t token)
{
	struct cudadev *c = (struct cudadev *)d;
	unsigned int i = token % HYB_COPYDEV_MARKS;
	cudaError_t e;

	if (!c->mark_busy[i] || c->mark_token[i] != token)
		return -EINVAL;
	c->mark_busy[i] = false;	/* waited, whatever the outcome */
	if ((e = cudaSetDevice(c->dev)) != cudaSuccess ||
	    (e = cudaEventSynchronize(c->mark[i])) != cudaSuccess)
		return hyb_cuda_fail(e, NULL, 0, "wait");
	return 0;
}

/* Every copy issued so far has landed or failed: nothing reads host memory any more. */
static void drain(struct cudadev *c)
{
	for (int p = 0; p < N_PRIO; p++)
		if (c->stream[p] && cudaStreamSynchronize(c->stream[p]) != cudaSuccess)
			cudaGetLastError();	/* that copy's own sync or wait reports it */
}

static int cu_evict(struct hyb_copydev *d, uint32_t slot)
{
	struct cudadev *c = (struct cudadev *)d;

	if (slot >= d->n_slots)
		return -EINVAL;
	/* the bytes stay until overwritten: a slot is a cache line, not an allocation */
	c->valid[slot] = 0;
	d->evictions++;
	return 0;
}

static void cu_close(struct hyb_copydev *d)
{
	struct cudadev *c = (struct cudadev *)d;

	if (!c)
		return;
	cudaSetDevice(c->dev);
	drain(c);
	for (int p = 0; p < N_PRIO; p++)
		if (c->stream[p])
			cudaStreamDestroy(c->stream[p]);
	for (int i = 0; i < HYB_COPYDEV_MARKS; i++)
		if (c->mark[i])
			cudaEventDestroy(c->mark[i]);
	for (unsigned int i = 0; i < c->n_regs; i++)
		cudaHostUnregister(c->regs[i].addr);
	if (c->cache)
		cudaFree(c->cache);
	cudaGetLastError();
	free(c->regs);
	free(c->valid);
	free(c);
}

static int cu_pin(struct hyb_copydev *d, void *addr, size_t len, bool read_only, char *err,
		  size_t errlen);
static int cu_unpin(struct hyb_copydev *d, void *addr);

static const struct hyb_copydev_ops cuda_ops = {
	cu_upload,
	cu_sync,
	cu_evict,
	cu_close,
	cu_pin,
	cu_unpin,
	cu_mark,
	cu_wait,
};

static struct cudadev *cuda_of(struct hyb_copydev *d)
{
	return d && d->ops == &cuda_ops ? (struct cudadev *)d : NULL;
}

extern "C" struct hyb_copydev *hyb_copydev_cuda_open(const struct hyb_copydev_cuda_config *cfg,
						     char *err, size_t errlen)
{
	struct cudadev *c;
	int n = 0, least = 0, greatest = 0;
	char what[160];
	cudaError_t e;

	if (!cfg || !cfg->n_slots || !cfg->slot_bytes || cfg->slot_bytes > (1ull << 34) ||
	    cfg->n_slots > (1u << 20)) {
		snprintf(err, errlen, "cuda device: %u slots of %llu bytes is out of range",
			 cfg ? cfg->n_slots : 0, cfg ? (unsigned long long)cfg->slot_bytes : 0ull);
		return NULL;
	}
	e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess || n == 0) {
		snprintf(err, errlen, "no CUDA device (%s)",
			 e != cudaSuccess ? cudaGetErrorString(e) : "none found");
		cudaGetLastError();
		return NULL;
	}
	if (cfg->device < 0 || cfg->device >= n) {
		snprintf(err, errlen, "CUDA device %d does not exist (%d found)", cfg->device, n);
		return NULL;
	}
	c = (struct cudadev *)calloc(1, sizeof(*c));
	if (!c || !(c->valid = (uint64_t *)calloc(cfg->n_slots, sizeof(uint64_t)))) {
		free(c);
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	c->d.ops = &cuda_ops;
	c->d.name = "cuda";
	c->d.n_slots = cfg->n_slots;
	c->d.slot_bytes = cfg->slot_bytes;
	c->dev = cfg->device;
	if ((e = cudaSetDevice(c->dev)) != cudaSuccess ||
	    (e = cudaDeviceGetStreamPriorityRange(&least, &greatest)) != cudaSuccess) {
		hyb_cuda_fail(e, err, errlen, "cuda device");
		cu_close(&c->d);
		return NULL;
	}
	/* without this attribute the read-only flag fails the whole registration */
	{
		int ro = 0;

		if (cudaDeviceGetAttribute(&ro, cudaDevAttrHostRegisterReadOnlySupported,
					   c->dev) != cudaSuccess)
			cudaGetLastError(), ro = 0;
		c->ro_ok = ro != 0;
	}
	/* critical (0) gets the greatest priority (numerically lowest), prefetch the least */
	for (int p = 0; p < N_PRIO; p++) {
		int v = greatest + (least - greatest) * p / (N_PRIO - 1);

		e = cudaStreamCreateWithPriority(&c->stream[p], cudaStreamNonBlocking, v);
		if (e != cudaSuccess) {
			c->stream[p] = NULL;
			hyb_cuda_fail(e, err, errlen, "cuda device: copy stream");
			cu_close(&c->d);
			return NULL;
		}
	}
	/* no timing: the lightest event, a marker only */
	for (int i = 0; i < HYB_COPYDEV_MARKS; i++) {
		e = cudaEventCreateWithFlags(&c->mark[i], cudaEventDisableTiming);
		if (e != cudaSuccess) {
			c->mark[i] = NULL;
			hyb_cuda_fail(e, err, errlen, "cuda device: copy event");
			cu_close(&c->d);
			return NULL;
		}
	}
	e = cudaMalloc((void **)&c->cache, (size_t)cfg->n_slots * cfg->slot_bytes);
	if (e != cudaSuccess) {
		c->cache = NULL;
		snprintf(what, sizeof(what), "cuda device %d: %u cache slots of %llu bytes",
			 c->dev, cfg->n_slots, (unsigned long long)cfg->slot_bytes);
		hyb_cuda_fail(e, err, errlen, what);
		cu_close(&c->d);
		return NULL;
	}
	return &c->d;
}

extern "C" int hyb_copydev_cuda_register(struct hyb_copydev *d, void *addr, size_t len,
					 bool read_only, char *err, size_t errlen)
{
	struct cudadev *c = cuda_of(d);
	unsigned int flags = cudaHostRegisterPortable;
	cudaError_t e;

	if (!c || !addr || !len) {
		snprintf(err, errlen, "cuda register: not a CUDA device or an empty region");
		return -EINVAL;
	}
	if (c->n_regs == c->cap_regs) {
		unsigned int cap = c->cap_regs ? 2 * c->cap_regs : 8;
		struct region *r = (struct region *)realloc(c->regs, cap * sizeof(*r));

		if (!r) {
			snprintf(err, errlen, "out of memory");
			return -ENOMEM;
		}
		c->regs = r;
		c->cap_regs = cap;
	}
	if (read_only && c->ro_ok)
		flags |= cudaHostRegisterReadOnly;
	if ((e = cudaSetDevice(c->dev)) != cudaSuccess ||
	    (e = cudaHostRegister(addr, len, flags)) != cudaSuccess) {
		char what[96];

		if (e == cudaErrorHostMemoryAlreadyRegistered) {
			cudaGetLastError();
			snprintf(err, errlen, "cuda register %p: already registered", addr);
			return -EEXIST;
		}
		snprintf(what, sizeof(what), "cudaHostRegister(%p, %zu bytes)", addr, len);
		return hyb_cuda_fail(e, err, errlen, what);
	}
	c->regs[c->n_regs].addr = addr;
	c->regs[c->n_regs].len = len;
	c->n_regs++;
	return 0;
}

extern "C" int hyb_copydev_cuda_unregister(struct hyb_copydev *d, void *addr)
{
	struct cudadev *c = cuda_of(d);

	if (!c)
		return -EINVAL;
	for (unsigned int i = 0; i < c->n_regs; i++) {
		if (c->regs[i].addr == addr) {
			cudaError_t e;

			cudaSetDevice(c->dev);
			drain(c);	/* no copy from these pages may be left queued */
			e = cudaHostUnregister(addr);
			c->regs[i] = c->regs[--c->n_regs];
			return e == cudaSuccess ? 0 : hyb_cuda_fail(e, NULL, 0, "unregister");
		}
	}
	return -ENOENT;
}

static int cu_pin(struct hyb_copydev *d, void *addr, size_t len, bool read_only, char *err,
		  size_t errlen)
{
	return hyb_copydev_cuda_register(d, addr, len, read_only, err, errlen);
}

static int cu_unpin(struct hyb_copydev *d, void *addr)
{
	return hyb_copydev_cuda_unregister(d, addr);
}

extern "C" void *hyb_copydev_cuda_slot(struct hyb_copydev *d, uint32_t slot)
{
	struct cudadev *c = cuda_of(d);

	return c && slot < d->n_slots ? c->cache + (uint64_t)slot * d->slot_bytes : NULL;
}

extern "C" uint64_t hyb_copydev_cuda_valid(struct hyb_copydev *d, uint32_t slot)
{
	struct cudadev *c = cuda_of(d);

	return c && slot < d->n_slots ? c->valid[slot] : 0;
}

extern "C" int hyb_copydev_cuda_export(struct hyb_copydev *d, struct hyb_gpucache_desc *out,
				       char *err, size_t errlen)
{
	struct cudadev *c = cuda_of(d);
	cudaIpcMemHandle_t h;
	cudaError_t e;

	if (!c || !out) {
		snprintf(err, errlen, "cuda export: not a CUDA device");
		return -EINVAL;
	}
	memset(out, 0, sizeof(*out));
	if ((e = cudaSetDevice(c->dev)) != cudaSuccess ||
	    (e = cudaIpcGetMemHandle(&h, c->cache)) != cudaSuccess ||
	    (e = cudaDeviceGetPCIBusId(out->pci_bus_id, sizeof(out->pci_bus_id), c->dev)) !=
		    cudaSuccess)
		return hyb_cuda_fail(e, err, errlen, "cuda export");
	out->magic = HYB_GPUCACHE_MAGIC;
	out->version = HYB_GPUCACHE_VERSION;
	out->pid = (int32_t)getpid();
	out->n_slots = d->n_slots;
	out->kind = HYB_GPUCACHE_CUDA;
	out->slot_bytes = d->slot_bytes;
	memcpy(out->ipc_handle, &h, sizeof(h));
	return 0;
}
