// SPDX-License-Identifier: MIT
/*
 * The "cuda" device (hyb/device.h): libhyb/device/device.c checks
 * the arguments and keeps the allocation table, these ops do the work.
 *
 * Memory: one cudaMalloc at open, of the whole capacity (0: 90% of the free
 * memory), cut by a first-fit allocator into 256-byte aligned pieces.
 * cudaMalloc/cudaFree in the middle of decoding would synchronize the whole
 * device; the arena also makes the capacity exact (the CUDA allocator rounds
 * up by its own page size). free waits for the three streams first, as
 * cudaFree would: queued work may still read the memory.
 *
 * Streams: three non-blocking streams created with the device's priorities,
 * CRITICAL the highest, COMPUTE the middle, RELOAD the lowest (KAIROX
 * 5.1/8). The priorities order kernels, not copies: the copy engine takes
 * copies in submission order. So the RELOAD stream's work goes through a
 * host queue (reload_lane.h) that submits its copies in chunk_bytes pieces,
 * at most two outstanding, and its records and waits in order behind them:
 * a CRITICAL copy then waits for at most two chunks. The lane's thread
 * waits for the oldest chunk and submits the next (the link stays busy while
 * the host computes), and every entry pumps it too; an event whose record
 * the queue still holds reads as not done, and sync, wait on another
 * stream, free and close wait until it is out. The lane thread makes CUDA
 * calls on the RELOAD stream only, under the lane's lock.
 *
 * Kernels: kernels/cuda/sparse_ffn.cu. Each stream has its own scratch for
 * them (h and down-row addresses of the active neurons, the partial tiles),
 * outside the capacity, 4 MiB at open and grown (after waiting for the
 * stream) when a call needs more. A neuron of an active list whose group is
 * not resident is not read; the kernel reports it in a word of mapped host
 * memory, and the next done/sync turns it into a device fault naming it.
 *
 * Dense kernels (rmsnorm, matvec, attention): kernels/cuda/dense.cu; the
 * predictor: kernels/cuda/predict.cu, sharing the attention workspace. The
 * attention's split positions need a small workspace per stream, also
 * outside the capacity: allocated on the first attention call of a stream
 * and grown (after waiting for the stream) when a shape needs more; its
 * size does not depend on the context length (hyb_cuda_attn_work_bytes: at
 * most 32 * multiprocessors * (head_dim + 2) floats plus one row per head,
 * 4.4 MB on an H100 at head_dim 256, 1.1 MB for 32 heads of 128 over 8 kv
 * heads). RoPE's cos/sin table is computed on the host once per position
 * (every layer of a token shares it) and passed with the launch.
 *
 * Graphs: CUDA's stream capture (thread-local mode, so the lane's thread
 * goes on with RELOAD meanwhile) and cudaGraphInstantiate; host functions
 * are cudaLaunchHostFunc. A scratch or workspace that would have to grow
 * inside a capture cannot (that waits for the stream and allocates): the
 * op is refused, and the same work run once before capturing sizes it.
 *
 * Host memory: host_register pins with cudaHostRegister(Portable),
 * host_alloc is cudaHostAlloc(Portable); both are remembered, and close
 * unpins and frees what the caller left.
 *
 * Every CUDA error of queued work makes the device faulted (-EIO, the
 * message names the call and CUDA's reason): a failed kernel leaves the
 * CUDA context unusable anyway. Pinning and host allocations fail without
 * faulting (-EINVAL / NULL). now() is CLOCK_MONOTONIC.
 */
#include <cuda_runtime.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device_internal.h" /* the Makefile gives nvcc no -Ilibhyb */
#include "hyb/tensor_type.h"
#include "dense_cuda.h"
#include "predict_cuda.h"
#include "sparse_ffn_cuda.h"
#include "teal_cuda.h"
#include "reload_lane.h"

#define ALIGN 256ull
#define SCRATCH0 (4ull << 20)

struct hyb_device_event {
	cudaEvent_t ev;
	bool timed;     /* created without cudaEventDisableTiming */
	bool recorded;  /* cudaEventElapsedTime refuses an event never recorded */
};

/* A piece of the arena; the array is sorted by offset and covers the arena. */
struct piece {
	uint64_t off, len;
	bool used;
};

struct hostbuf {
	void *p;
	size_t len;
};

struct cudev {
	struct hyb_device d; /* first: the common head */
	int dev, n_sm, smem_max;
	cudaStream_t st[HYB_N_STREAMS];
	char *arena;
	uint64_t arena_bytes;
	struct piece *pc;
	size_t n_pc, cap_pc;
	void *scr[HYB_N_STREAMS];
	uint64_t scr_bytes[HYB_N_STREAMS];
	void *wk[HYB_N_STREAMS];          /* attention workspace (dense.cu), outside capacity */
	uint64_t wk_bytes[HYB_N_STREAMS];
	struct hyb_cuda_rope rope;        /* the last position's cos/sin table (host) */
	/* what it was computed for: every layer of a token shares it */
	bool rope_valid;
	uint32_t rope_n_rot, rope_pos;
	struct hyb_rope rope_key;
	/* a graph's attention (pos_at): every position's cos/sin, per rope, outside capacity */
	struct rtab {
		struct hyb_rope key;
		uint32_t n_rot, n_ctx;
		float *dev;
	} rtab[4];
	unsigned rtab_next;       /* the slot replaced next when all are taken */
	uint16_t *gelu;           /* ggml's F16 GELU table for GeGLU FFNs (copied at open) */
	volatile uint32_t *bad;   /* mapped pinned host memory: [0] set, [1] the neuron */
	uint32_t *bad_dev;        /* the same, as the device sees it; NULL: not reported */
	struct hostbuf *reg, *hb; /* pinned regions, host_alloc buffers */
	size_t n_reg, cap_reg, n_hb, cap_hb;
	struct hyb_lane lane;     /* the RELOAD stream's queue */
	cudaEvent_t mark[2];      /* its chunks' markers */
	bool lane_on;
};

static struct cudev *cu(struct hyb_device *d)
{
	return (struct cudev *)d;
}

static const char *stream_name(enum hyb_stream s)
{
	static const char *const n[HYB_N_STREAMS] = { "compute", "critical", "reload" };

	return (unsigned)s < HYB_N_STREAMS ? n[s] : "?";
}

/* A CUDA error of queued work: the device is faulted from now on. */
static int fault(struct cudev *c, cudaError_t e, const char *what)
{
	return hyb_device_fail(&c->d, -EIO, "cuda: %s: %s", what, cudaGetErrorString(e));
}

/* A CUDA error that leaves the device usable (a bad pointer to pin, out of memory). */
static int soft(struct cudev *c, cudaError_t e, int rc, const char *what)
{
	cudaGetLastError(); /* clear it, so that it is not reported by a later call */
	return hyb_device_fail(&c->d, rc, "cuda: %s: %s", what, cudaGetErrorString(e));
}

/* ---- the RELOAD lane's backend (reload_lane.h) ---- */

static int lane_copy(void *ctx, void *dst, const void *src, uint64_t n, int dir, int k)
{
	struct cudev *c = (struct cudev *)ctx;
	cudaError_t e = cudaMemcpyAsync(dst, src, n, (cudaMemcpyKind)dir,
					c->st[HYB_STREAM_RELOAD]);

	if (e == cudaSuccess)
		e = cudaEventRecord(c->mark[k], c->st[HYB_STREAM_RELOAD]);
	return e == cudaSuccess ? 0 : fault(c, e, "cudaMemcpyAsync(reload chunk)");
}

static bool lane_done(void *ctx, int k)
{
	cudaError_t e = cudaEventQuery(((struct cudev *)ctx)->mark[k]);

	if (e == cudaErrorNotReady)
		(void)cudaGetLastError(); /* not an error (cu_done says why) */
	/* an error: done, and the marker's wait reports it */
	return e != cudaErrorNotReady;
}

static int lane_mwait(void *ctx, int k)
{
	struct cudev *c = (struct cudev *)ctx;
	cudaError_t e = cudaEventSynchronize(c->mark[k]);

	return e == cudaSuccess ? 0 : fault(c, e, "cudaEventSynchronize(reload chunk)");
}

static int lane_record(void *ctx, void *ev)
{
	struct cudev *c = (struct cudev *)ctx;
	struct hyb_device_event *x = (struct hyb_device_event *)ev;
	cudaError_t e = cudaEventRecord(x->ev, c->st[HYB_STREAM_RELOAD]);

	x->recorded = true;
	return e == cudaSuccess ? 0 : fault(c, e, "cudaEventRecord");
}

static int lane_wait(void *ctx, void *ev)
{
	struct cudev *c = (struct cudev *)ctx;
	cudaError_t e = cudaStreamWaitEvent(c->st[HYB_STREAM_RELOAD],
					    ((struct hyb_device_event *)ev)->ev, 0);

	return e == cudaSuccess ? 0 : fault(c, e, "cudaStreamWaitEvent");
}

static void lane_thread_init(void *ctx)
{
	cudaSetDevice(((struct cudev *)ctx)->dev);
}

/* Move the lane along; block: until held is out of it (NULL: until it is empty). */
static int pump(struct cudev *c, bool block, const void *held)
{
	return c->lane_on ? hyb_lane_pump(&c->lane, block, held) : 0;
}

/* Calls may come from another host thread than open's: make our device current. */
static int use(struct cudev *c)
{
	cudaError_t e = cudaSetDevice(c->dev);

	if (e != cudaSuccess)
		return fault(c, e, "cudaSetDevice");
	/* capturing: the lane's own thread moves it (its event queries stay off this thread) */
	return c->d.cap ? 0 : pump(c, false, NULL);
}

/*
 * A call refused because a capture is under way (a pageable copy, say)
 * spoils the capture, not the context: an error, not a fault.
 */
static int queue_fail(struct cudev *c, cudaError_t e, const char *what)
{
	if (c->d.cap && (e == cudaErrorStreamCaptureUnsupported ||
			 e == cudaErrorStreamCaptureInvalidated || e == cudaErrorStreamCaptureIsolation ||
			 e == cudaErrorStreamCaptureImplicit))
		return soft(c, e, -EBUSY, what);
	return fault(c, e, what);
}

/* Work for stream s: on RELOAD, after everything the lane holds. */
static int use_stream(struct cudev *c, enum hyb_stream s)
{
	int rc = use(c);

	return !rc && s == HYB_STREAM_RELOAD ? pump(c, true, NULL) : rc;
}

static int sync_all(struct cudev *c)
{
	int rc = pump(c, true, NULL);

	if (rc)
		return rc;
	for (int s = 0; s < HYB_N_STREAMS; s++) {
		cudaError_t e = cudaStreamSynchronize(c->st[s]);

		if (e != cudaSuccess)
			return fault(c, e, "cudaStreamSynchronize");
	}
	return 0;
}

/* Turn a neuron reported by the kernels into a fault. */
static int check_bad(struct cudev *c)
{
	if (!c->bad || !c->bad[0])
		return 0;
	if (c->bad[0] == 2)
		return hyb_device_fail(&c->d, -EIO, "cuda: attention: position %u read from device "
				       "memory is outside its cache", c->bad[1]);
	if (c->bad[0] == 3)
		return hyb_device_fail(&c->d, -EIO, "cuda: matvec table: item %u is outside the "
				       "arrays, writes an earlier item's y row, or is past max "
				       "(a count above it names the count)", c->bad[1]);
	return hyb_device_fail(&c->d, -EIO,
			       "cuda: sparse ffn: active neuron %u is not in a resident group "
			       "(table entry < 0 or beyond the cache allocation)",
			       c->bad[1]);
}

/* ---- the arena ------------------------------------------------------------------- */

static bool grow(void **arr, size_t *cap, size_t n, size_t elem)
{
	size_t nc;
	void *p;

	if (n < *cap)
		return true;
	nc = *cap ? 2 * *cap : 16;
	p = realloc(*arr, nc * elem);
	if (!p)
		return false;
	*arr = p;
	*cap = nc;
	return true;
}

static int cu_alloc(struct hyb_device *d, uint64_t bytes, hyb_dptr *out)
{
	struct cudev *c = cu(d);
	uint64_t need, largest = 0;

	if (!bytes || bytes > c->arena_bytes)
		return hyb_device_fail(d, -ENOMEM, "cuda alloc: %llu bytes exceed the %llu-byte arena",
				       (unsigned long long)bytes,
				       (unsigned long long)c->arena_bytes);
	need = (bytes + ALIGN - 1) & ~(ALIGN - 1);
	for (size_t i = 0; i < c->n_pc; i++) {
		struct piece *p = &c->pc[i];

		if (p->used)
			continue;
		if (p->len < need) {
			largest = p->len > largest ? p->len : largest;
			continue;
		}
		if (p->len > need) {
			if (!grow((void **)&c->pc, &c->cap_pc, c->n_pc, sizeof(*c->pc)))
				return hyb_device_fail(d, -ENOMEM, "cuda alloc: out of host memory");
			p = &c->pc[i]; /* the array may have moved */
			memmove(p + 2, p + 1, (c->n_pc - i - 1) * sizeof(*p));
			p[1].off = p->off + need;
			p[1].len = p->len - need;
			p[1].used = false;
			p->len = need;
			c->n_pc++;
		}
		p->used = true;
		*out = (hyb_dptr)(uintptr_t)(c->arena + p->off);
		return 0;
	}
	return hyb_device_fail(d, -ENOMEM,
			       "cuda alloc: no free range of %llu bytes in the arena (largest %llu: "
			       "fragmented)", (unsigned long long)need,
			       (unsigned long long)largest);
}

static void cu_free(struct hyb_device *d, hyb_dptr p)
{
	struct cudev *c = cu(d);
	const uint64_t off = (uint64_t)((char *)(uintptr_t)p - c->arena);
	size_t lo = 0, hi = c->n_pc, i;

	while (lo < hi) {
		const size_t mid = lo + (hi - lo) / 2;

		if (c->pc[mid].off < off)
			lo = mid + 1;
		else
			hi = mid;
	}
	i = lo;
	if (p < (hyb_dptr)(uintptr_t)c->arena || i == c->n_pc || c->pc[i].off != off ||
	    !c->pc[i].used) {
		hyb_device_fail(d, -EINVAL, "cuda free: %#llx is not an arena allocation",
				(unsigned long long)p);
		return;
	}
	/* queued work may still read it; a faulted device runs nothing more */
	if (!d->faulted && !use(c))
		sync_all(c);
	c->pc[i].used = false;
	if (i + 1 < c->n_pc && !c->pc[i + 1].used) {
		c->pc[i].len += c->pc[i + 1].len;
		memmove(&c->pc[i + 1], &c->pc[i + 2], (c->n_pc - i - 2) * sizeof(*c->pc));
		c->n_pc--;
	}
	if (i > 0 && !c->pc[i - 1].used) {
		c->pc[i - 1].len += c->pc[i].len;
		memmove(&c->pc[i], &c->pc[i + 1], (c->n_pc - i - 1) * sizeof(*c->pc));
		c->n_pc--;
	}
}

/* ---- host memory ------------------------------------------------------------------ */

static int cu_host_register(struct hyb_device *d, void *p, size_t len)
{
	struct cudev *c = cu(d);
	cudaError_t e;
	char what[96];
	int rc = use(c);

	if (rc)
		return rc;
	if (!grow((void **)&c->reg, &c->cap_reg, c->n_reg, sizeof(*c->reg)))
		return hyb_device_fail(d, -ENOMEM, "cuda host register: out of host memory");
	e = cudaHostRegister(p, len, cudaHostRegisterPortable);
	if (e != cudaSuccess) {
		snprintf(what, sizeof(what), "cudaHostRegister(%p, %zu bytes)", p, len);
		return soft(c, e, e == cudaErrorHostMemoryAlreadyRegistered ? -EEXIST : -EINVAL,
			    what);
	}
	c->reg[c->n_reg].p = p;
	c->reg[c->n_reg].len = len;
	c->n_reg++;
	return 0;
}

static int cu_host_unregister(struct hyb_device *d, void *p)
{
	struct cudev *c = cu(d);

	for (size_t i = 0; i < c->n_reg; i++) {
		if (c->reg[i].p != p)
			continue;
		c->reg[i] = c->reg[--c->n_reg];
		/*
		 * Copies queued from it may not have run yet, and the runtime does
		 * not say that unregistering waits for them: drain first, as free does.
		 */
		if (!d->faulted && !use(c))
			sync_all(c);
		cudaSetDevice(c->dev);
		cudaError_t e = cudaHostUnregister(p);

		return e == cudaSuccess ? 0 : soft(c, e, -EINVAL, "cudaHostUnregister");
	}
	return hyb_device_fail(d, -EINVAL, "cuda host unregister: %p was not registered", p);
}

static void *cu_host_alloc(struct hyb_device *d, size_t len)
{
	struct cudev *c = cu(d);
	void *p = NULL;
	cudaError_t e;
	char what[64];

	if (use(c))
		return NULL;
	if (!grow((void **)&c->hb, &c->cap_hb, c->n_hb, sizeof(*c->hb))) {
		hyb_device_fail(d, -ENOMEM, "cuda host alloc: out of host memory");
		return NULL;
	}
	e = cudaHostAlloc(&p, len, cudaHostAllocPortable);
	if (e != cudaSuccess) {
		snprintf(what, sizeof(what), "cudaHostAlloc(%zu bytes)", len);
		soft(c, e, -ENOMEM, what);
		return NULL;
	}
	/* page aligned in practice; the contract promises 64 */
	if ((uintptr_t)p % 64) {
		cudaFreeHost(p);
		hyb_device_fail(d, -ENOMEM, "cuda host alloc: %p is not 64-byte aligned", p);
		return NULL;
	}
	c->hb[c->n_hb].p = p;
	c->hb[c->n_hb].len = len;
	c->n_hb++;
	return p;
}

static void cu_host_free(struct hyb_device *d, void *p)
{
	struct cudev *c = cu(d);

	for (size_t i = 0; i < c->n_hb; i++) {
		if (c->hb[i].p != p)
			continue;
		c->hb[i] = c->hb[--c->n_hb];
		cudaSetDevice(c->dev);
		cudaError_t e = cudaFreeHost(p);

		if (e != cudaSuccess)
			soft(c, e, -EINVAL, "cudaFreeHost");
		return;
	}
	hyb_device_fail(d, -EINVAL, "cuda host free: %p is not from host_alloc", p);
}

/* ---- copies ------------------------------------------------------------------------ */

static int copy(struct cudev *c, enum hyb_stream s, void *dst, const void *src, uint64_t len,
		cudaMemcpyKind kind)
{
	char what[96];
	int rc = use(c);
	cudaError_t e;

	if (rc)
		return rc;
	/* RELOAD in chunks through the lane: a CRITICAL copy waits for at most two */
	if (s == HYB_STREAM_RELOAD)
		return hyb_lane_copy(&c->lane, dst, src, len, (int)kind);
	e = cudaMemcpyAsync(dst, src, len, kind, c->st[s]);
	if (e != cudaSuccess) {
		snprintf(what, sizeof(what), "cudaMemcpyAsync(%s, %llu bytes, %s stream)",
			 kind == cudaMemcpyHostToDevice ? "h2d" : "d2h", (unsigned long long)len,
			 stream_name(s));
		return queue_fail(c, e, what);
	}
	return 0;
}

static int cu_h2d(struct hyb_device *d, enum hyb_stream s, hyb_dptr dst, const void *src,
		  uint64_t len)
{
	return copy(cu(d), s, (void *)(uintptr_t)dst, src, len, cudaMemcpyHostToDevice);
}

static int cu_d2h(struct hyb_device *d, enum hyb_stream s, void *dst, hyb_dptr src,
		  uint64_t len)
{
	return copy(cu(d), s, dst, (const void *)(uintptr_t)src, len, cudaMemcpyDeviceToHost);
}

/* ---- events -------------------------------------------------------------------------- */

static struct hyb_device_event *cu_event_new(struct hyb_device *d, bool timed)
{
	struct cudev *c = cu(d);
	struct hyb_device_event *ev;
	cudaError_t e;

	if (use(c))
		return NULL;
	ev = (struct hyb_device_event *)calloc(1, sizeof(*ev));
	if (!ev) {
		hyb_device_fail(d, -ENOMEM, "cuda event: out of host memory");
		return NULL;
	}
	ev->timed = timed;
	e = cudaEventCreateWithFlags(&ev->ev, timed ? cudaEventDefault : cudaEventDisableTiming);
	if (e != cudaSuccess) {
		free(ev);
		soft(c, e, -ENOMEM, "cudaEventCreateWithFlags");
		return NULL;
	}
	return ev;
}

static void cu_event_free(struct hyb_device *d, struct hyb_device_event *ev)
{
	/* safe while the event is pending: CUDA releases it when it completes */
	cudaSetDevice(cu(d)->dev);
	/* a record the lane holds would name a destroyed event */
	if (hyb_lane_holds(&cu(d)->lane, ev))
		pump(cu(d), true, ev);
	cudaEventDestroy(ev->ev);
	free(ev);
}

static int cu_record(struct hyb_device *d, enum hyb_stream s, struct hyb_device_event *ev)
{
	struct cudev *c = cu(d);
	cudaError_t e;
	int rc = use(c);

	if (rc)
		return rc;
	if (s == HYB_STREAM_RELOAD && !hyb_lane_idle(&c->lane))
		return hyb_lane_record(&c->lane, ev);
	e = cudaEventRecord(ev->ev, c->st[s]);
	if (e != cudaSuccess)
		return fault(c, e, "cudaEventRecord");
	ev->recorded = true;
	return 0;
}

static int cu_wait(struct hyb_device *d, enum hyb_stream s, struct hyb_device_event *ev)
{
	struct cudev *c = cu(d);
	cudaError_t e;
	int rc = use(c);

	if (rc)
		return rc;
	if (s == HYB_STREAM_RELOAD && !hyb_lane_idle(&c->lane))
		return hyb_lane_wait(&c->lane, ev);
	/* a record the lane holds must be out first: CUDA would wait for the last one */
	if (hyb_lane_holds(&c->lane, ev) && (rc = pump(c, true, ev)))
		return rc;
	/* an event never recorded: CUDA waits for nothing, as the contract says */
	e = cudaStreamWaitEvent(c->st[s], ev->ev, 0);
	return e == cudaSuccess ? 0 : fault(c, e, "cudaStreamWaitEvent");
}

/* On an error say done: the caller's next call fails with the fault. */
static bool cu_done(struct hyb_device *d, struct hyb_device_event *ev)
{
	struct cudev *c = cu(d);
	cudaError_t e;

	if (use(c))
		return true;
	if (hyb_lane_holds(&c->lane, ev))
		return false;
	e = cudaEventQuery(ev->ev);
	if (e == cudaErrorNotReady) {
		/*
		 * Not an error, but some runtimes record it as the thread's last
		 * error, and every launcher reports cudaGetLastError(): clear it,
		 * or the next launch after a poll would read as failed.
		 */
		(void)cudaGetLastError();
		return false;
	}
	if (e != cudaSuccess)
		fault(c, e, "cudaEventQuery");
	else
		check_bad(c);
	return true;
}

static int cu_sync(struct hyb_device *d, struct hyb_device_event *ev)
{
	struct cudev *c = cu(d);
	cudaError_t e;
	int rc = use(c);

	if (rc || (rc = pump(c, true, ev)))
		return rc;
	e = cudaEventSynchronize(ev->ev);
	if (e != cudaSuccess)
		return fault(c, e, "cudaEventSynchronize");
	return check_bad(c);
}

/* Both events completed: their distance on the GPU's clock (about 0.5 us resolution). */
static int cu_elapsed(struct hyb_device *d, struct hyb_device_event *a,
		      struct hyb_device_event *b, double *s)
{
	struct cudev *c = cu(d);
	cudaError_t e;
	float ms = 0;
	int rc = use(c);

	if (rc)
		return rc;
	if (hyb_lane_holds(&c->lane, a) || hyb_lane_holds(&c->lane, b))
		return hyb_device_fail(d, -EAGAIN, "elapsed: an event not recorded yet");
	if (!a->timed || !b->timed || !a->recorded || !b->recorded)
		return hyb_device_fail(d, -EINVAL, "elapsed: %s event",
				       !a->timed || !b->timed ? "an untimed" : "a never recorded");
	e = cudaEventElapsedTime(&ms, a->ev, b->ev);
	if (e == cudaErrorNotReady)
		return soft(c, e, -EAGAIN, "cudaEventElapsedTime");
	if (e != cudaSuccess)
		return fault(c, e, "cudaEventElapsedTime");
	*s = 1e-3 * (double)ms;
	return 0;
}

/* ---- kernels -------------------------------------------------------------------------- */

/* A capture cannot wait for its stream nor allocate (see the top). */
static int grow_in_capture(struct cudev *c, const char *what, uint64_t need)
{
	return hyb_device_fail(&c->d, -EBUSY, "cuda: the %s would grow to %llu bytes during a "
			       "capture (run the same work once before capturing it)", what,
			       (unsigned long long)need);
}

/* The scratch of stream s, at least need bytes, zeroed when (re)allocated. */
static int scratch(struct cudev *c, enum hyb_stream s, uint64_t need)
{
	uint64_t nb = 2 * c->scr_bytes[s];
	cudaError_t e;
	char what[96];

	if (need <= c->scr_bytes[s])
		return 0;
	if (c->d.cap)
		return grow_in_capture(c, "sparse ffn scratch", need);
	nb = nb > need ? nb : need;
	nb = (nb + ALIGN - 1) & ~(ALIGN - 1);
	/* queued kernels of this stream may still use the old one */
	if ((e = cudaStreamSynchronize(c->st[s])) != cudaSuccess)
		return fault(c, e, "cudaStreamSynchronize");
	if (c->scr[s] && (e = cudaFree(c->scr[s])) != cudaSuccess)
		return fault(c, e, "cudaFree(scratch)");
	c->scr[s] = NULL;
	c->scr_bytes[s] = 0;
	e = cudaMalloc(&c->scr[s], nb);
	if (e != cudaSuccess) {
		c->scr[s] = NULL;
		snprintf(what, sizeof(what), "cudaMalloc(%llu bytes of sparse ffn scratch)",
			 (unsigned long long)nb);
		return soft(c, e, -ENOMEM, what);
	}
	c->scr_bytes[s] = nb;
	if ((e = cudaMemsetAsync(c->scr[s], 0, nb, c->st[s])) != cudaSuccess)
		return fault(c, e, "cudaMemsetAsync(scratch)");
	return 0;
}

static int cu_sparse_ffn_one(struct hyb_device *d, enum hyb_stream s, const struct hyb_dev_ffn *f)
{
	struct cudev *c = cu(d);
	const uint64_t rb = hyb_row_bytes(f->type, f->n_embd);
	const uint32_t smem = hyb_cuda_ffn_smem(f->type, f->n_embd);
	struct hyb_cuda_ffn a;
	int rc;

	if (!smem) /* the kernels' types: hyb_device_ffn_type_ok() but F32 */
		return hyb_device_fail(d, -EINVAL,
				       "cuda sparse ffn: weight type %s not supported (every type "
				       "the CPU operator takes but F32)", hyb_type_name(f->type));
	if ((int64_t)smem > c->smem_max)
		return hyb_device_fail(d, -EINVAL,
				       "cuda sparse ffn: n_embd %u needs %u bytes of shared memory, "
				       "the GPU has %d", f->n_embd, smem, c->smem_max);
	if (f->n_active && ((f->cache & 1) || (f->slot_bytes & 1)))
		return hyb_device_fail(d, -EINVAL,
				       "cuda sparse ffn: cache %#llx and slot_bytes %llu must be even",
				       (unsigned long long)f->cache,
				       (unsigned long long)f->slot_bytes);
	if ((rc = use_stream(c, s)) || (rc = scratch(c, s, hyb_cuda_ffn_scratch_bytes(f->n_embd, f->n_active,
									  c->n_sm))))
		return rc;
	memset(&a, 0, sizeof(a));
	a.type = f->type;
	a.n_embd = f->n_embd;
	a.n_ff = f->n_ff;
	a.group_size = f->group_size;
	a.act = (int)f->act;
	a.thr = f->thr;
	a.gelu = c->gelu;
	a.table = (const int32_t *)(uintptr_t)f->table;
	a.cache = (const void *)(uintptr_t)f->cache;
	a.cache_span = f->n_active ? hyb_device_span(d, f->cache) : 0;
	a.slot_bytes = f->slot_bytes;
	a.xn = (const float *)(uintptr_t)f->xn;
	a.active = (const uint32_t *)(uintptr_t)f->active;
	a.n_active = f->n_active;
	a.y = (float *)(uintptr_t)f->y;
	a.accumulate = f->accumulate;
	a.scratch = c->scr[s];
	a.bad = c->bad_dev;
	a.n_sm = c->n_sm;
	rc = hyb_cuda_sparse_ffn(&a, c->st[s]);
	if (rc < 0)
		return hyb_device_fail(d, rc, "cuda sparse ffn: shape not supported (n_embd %u, "
				       "%u active)", f->n_embd, f->n_active);
	if (rc > 0)
		return fault(c, (cudaError_t)rc, "sparse ffn kernel launch");
	/*
	 * What the kernels read, as far as the host knows: every listed gate row
	 * and, as if no early exit happened, every up and down row (exact for
	 * SiLU, an upper bound for the ReLU family), the list, xn and y.
	 */
	d->st.kernel_bytes += f->n_active * (3 * rb + 4) + (f->accumulate ? 8ull : 4ull) *
			      f->n_embd;
	return 0;
}

/*
 * A batch (a prompt's tokens, hyb/device.h) is one launch sequence a token
 * today, in token order on the stream: the one-token kernels as they are.
 * Batched kernels that read each weight once for the whole batch are the
 * next step on a GPU (docs/DEVICE.md).
 */
static int cu_sparse_ffn(struct hyb_device *d, enum hyb_stream s, const struct hyb_dev_ffn *f)
{
	struct hyb_dev_ffn one = *f;
	int rc = 0;

	one.batch = 0;
	for (uint32_t t = 0; t < (f->batch ? f->batch : 1) && !rc; t++) {
		one.xn = f->xn + 4ull * f->n_embd * t;
		one.y = f->y + 4ull * f->n_embd * t;
		rc = cu_sparse_ffn_one(d, s, &one);
	}
	return rc;
}

static int cu_add(struct hyb_device *d, enum hyb_stream s, hyb_dptr y, hyb_dptr x, uint32_t n)
{
	struct cudev *c = cu(d);
	int rc = use_stream(c, s);

	if (rc)
		return rc;
	rc = hyb_cuda_add((float *)(uintptr_t)y, (const float *)(uintptr_t)x, n, c->st[s]);
	if (rc)
		return fault(c, (cudaError_t)rc, "add kernel launch");
	d->st.kernel_bytes += 8ull * n;
	return 0;
}

static int cu_ffn_act(struct hyb_device *d, enum hyb_stream s, hyb_dptr g, hyb_dptr u,
		      uint32_t n, enum hyb_ffn_act act)
{
	struct cudev *c = cu(d);
	int rc = use_stream(c, s);

	if (rc)
		return rc;
	rc = hyb_cuda_ffn_act((float *)(uintptr_t)g, (const float *)(uintptr_t)u, n, (int)act,
			      c->gelu, c->st[s]);
	if (rc < 0)
		return hyb_device_fail(d, rc, "ffn_act: activation %d", (int)act);
	if (rc)
		return fault(c, (cudaError_t)rc, "ffn_act kernel launch");
	d->st.kernel_bytes += 12ull * n;
	return 0;
}

static int cu_rmsnorm(struct hyb_device *d, enum hyb_stream s, hyb_dptr y, hyb_dptr x,
		      hyb_dptr w, uint32_t n, uint32_t rows, float eps)
{
	struct cudev *c = cu(d);
	int rc = use_stream(c, s);

	if (rc)
		return rc;
	rc = hyb_cuda_rmsnorm((float *)(uintptr_t)y, (const float *)(uintptr_t)x,
			      (const float *)(uintptr_t)w, n, rows, eps, c->st[s]);
	if (rc < 0)
		return hyb_device_fail(d, rc, "cuda rmsnorm: %u rows of %u not supported", rows, n);
	if (rc > 0)
		return fault(c, (cudaError_t)rc, "rmsnorm kernel launch");
	/* x, w, y: the CPU device's model (device_cpu.c) */
	d->st.kernel_bytes += 4ull * n * (2ull * rows + 1);
	return 0;
}

static int cu_matvec_one(struct hyb_device *d, enum hyb_stream s, const struct hyb_dev_matvec *m)
{
	struct cudev *c = cu(d);
	const uint64_t rb = hyb_row_bytes(m->type, m->n_in);
	const uint32_t smem = hyb_cuda_matvec_smem(m->type, m->n_in);
	struct hyb_cuda_matvec a;
	int rc;

	if (!smem)
		return hyb_device_fail(d, -EINVAL,
				       "cuda matvec: weight type %s not supported (every type "
				       "but BF16)", hyb_type_name(m->type));
	if ((int64_t)smem > c->smem_max)
		return hyb_device_fail(d, -EINVAL,
				       "cuda matvec: n_in %u of %s needs %u bytes of shared "
				       "memory, the GPU has %d", m->n_in, hyb_type_name(m->type),
				       smem, c->smem_max);
	if ((rc = use_stream(c, s)))
		return rc;
	a.type = m->type;
	a.n_in = m->n_in;
	a.n_out = m->n_out;
	a.w = (const void *)(uintptr_t)m->w;
	a.x = (const float *)(uintptr_t)m->x;
	a.y = (float *)(uintptr_t)m->y;
	a.accumulate = m->accumulate;
	a.n_sm = c->n_sm;
	rc = hyb_cuda_matvec(&a, c->st[s]);
	if (rc < 0)
		return hyb_device_fail(d, rc, "cuda matvec: shape not supported (%s, %u x %u)",
				       hyb_type_name(m->type), m->n_out, m->n_in);
	if (rc > 0)
		return fault(c, (cudaError_t)rc, "matvec kernel launch");
	/* the rows, x, y written [and read]: the CPU device's model */
	d->st.kernel_bytes += m->n_out * rb + 4ull * m->n_in + 4ull * m->n_out *
			      (m->accumulate ? 2 : 1);
	return 0;
}

static int cu_matvec(struct hyb_device *d, enum hyb_stream s, const struct hyb_dev_matvec *m)
{
	struct hyb_dev_matvec one = *m;
	int rc = 0;

	one.batch = 0;
	for (uint32_t t = 0; t < (m->batch ? m->batch : 1) && !rc; t++) {
		one.x = m->x + 4ull * m->n_in * t;
		one.y = m->y + 4ull * m->n_out * t;
		rc = cu_matvec_one(d, s, &one);
	}
	return rc;
}

/* The items (each column of a batch an item of its own) in launches of 32. */
static int cu_matvec_group(struct hyb_device *d, enum hyb_stream s,
			   const struct hyb_dev_matvec *m, uint32_t n)
{
	struct cudev *c = cu(d);
	const uint64_t nb = m->batch ? m->batch : 1, rb = hyb_row_bytes(m->type, m->n_in);
	const uint32_t smem = hyb_cuda_matvec_smem(m->type, m->n_in);
	struct hyb_cuda_matvec *a;
	int rc;

	if (!smem || (int64_t)smem > c->smem_max)
		return cu_matvec(d, s, m); /* its message */
	if ((rc = use_stream(c, s)))
		return rc;
	a = (struct hyb_cuda_matvec *)malloc(sizeof(*a) * n * nb);
	if (!a)
		return hyb_device_fail(d, -ENOMEM, "cuda matvec group: out of host memory");
	for (uint32_t i = 0; i < n; i++)
		for (uint64_t t = 0; t < nb; t++) {
			struct hyb_cuda_matvec *e = &a[i * nb + t];

			e->type = m->type;
			e->n_in = m->n_in;
			e->n_out = m->n_out;
			e->w = (const void *)(uintptr_t)m[i].w;
			e->x = (const float *)(uintptr_t)(m[i].x + 4ull * m->n_in * t);
			e->y = (float *)(uintptr_t)(m[i].y + 4ull * m->n_out * t);
			e->accumulate = m->accumulate;
			e->n_sm = c->n_sm;
		}
	rc = hyb_cuda_matvec_group(a, (uint32_t)(n * nb), c->st[s]);
	free(a);
	if (rc < 0)
		return hyb_device_fail(d, rc, "cuda matvec group: shape not supported (%s, %u x %u)",
				       hyb_type_name(m->type), m->n_out, m->n_in);
	if (rc > 0)
		return fault(c, (cudaError_t)rc, "matvec group kernel launch");
	d->st.kernel_bytes += n * (m->n_out * rb + nb * (4ull * m->n_in + 4ull * m->n_out *
							  (m->accumulate ? 2 : 1)));
	return 0;
}

static int cu_matvec_table(struct hyb_device *d, enum hyb_stream s,
			   const struct hyb_dev_matvec_table *t)
{
	struct cudev *c = cu(d);
	const uint64_t rb = hyb_row_bytes(t->type, t->n_in);
	const uint32_t smem = hyb_cuda_matvec_smem(t->type, t->n_in);
	struct hyb_cuda_matvec_table k;
	int rc;

	if (!smem || (int64_t)smem > c->smem_max)
		return hyb_device_fail(d, -EINVAL, "cuda matvec table: %s rows of %u need %u bytes "
				       "of shared memory, the GPU has %d", hyb_type_name(t->type),
				       t->n_in, smem, c->smem_max);
	if ((rc = use_stream(c, s)))
		return rc;
	memset(&k, 0, sizeof(k));
	k.m.type = t->type;
	k.m.n_in = t->n_in;
	k.m.n_out = t->n_out;
	k.m.w = (const void *)(uintptr_t)t->w;
	k.m.x = (const float *)(uintptr_t)t->x;
	k.m.y = (float *)(uintptr_t)t->y;
	k.m.accumulate = t->accumulate;
	k.m.n_sm = c->n_sm;
	k.w_stride = t->w_stride;
	k.n_w = t->n_w;
	k.n_x = t->n_x;
	k.n_y = t->n_y;
	k.max = t->max;
	k.items = (const uint32_t *)(uintptr_t)t->items;
	k.bad = c->bad_dev;
	rc = hyb_cuda_matvec_table(&k, c->st[s]);
	if (rc < 0)
		return hyb_device_fail(d, rc, "cuda matvec table: shape not supported (%s, %u x %u)",
				       hyb_type_name(t->type), t->n_out, t->n_in);
	if (rc > 0)
		return fault(c, (cudaError_t)rc, "matvec table kernel launch");
	/* the list's length is the kernel's to read: counted at max */
	d->st.kernel_bytes += t->max * (t->n_out * rb + 4ull * t->n_in +
					4ull * t->n_out * (t->accumulate ? 2 : 1));
	return 0;
}

/* The attention workspace of stream s, at least need bytes. */
static int workspace(struct cudev *c, enum hyb_stream s, uint64_t need)
{
	cudaError_t e;
	char what[96];

	if (need <= c->wk_bytes[s])
		return 0;
	if (c->d.cap)
		return grow_in_capture(c, "attention workspace", need);
	need = (need + ALIGN - 1) & ~(ALIGN - 1);
	/* queued kernels of this stream may still use the old one */
	if ((e = cudaStreamSynchronize(c->st[s])) != cudaSuccess)
		return fault(c, e, "cudaStreamSynchronize");
	if (c->wk[s] && (e = cudaFree(c->wk[s])) != cudaSuccess)
		return fault(c, e, "cudaFree(attention workspace)");
	c->wk[s] = NULL;
	c->wk_bytes[s] = 0;
	e = cudaMalloc(&c->wk[s], need);
	if (e != cudaSuccess) {
		c->wk[s] = NULL;
		snprintf(what, sizeof(what), "cudaMalloc(%llu bytes of attention workspace)",
			 (unsigned long long)need);
		return soft(c, e, -ENOMEM, what);
	}
	c->wk_bytes[s] = need;
	return 0;
}

/*
 * The table of RoPE's cos and sin at every position of a cache of n_ctx
 * rows (dense_cuda.h), computed with hyb_rope_table as the by-value call's
 * rows are, so a graph's attention gives that call's bits. Made on the first
 * call that needs it: not inside a capture.
 */
static int rope_tab(struct cudev *c, const struct hyb_dev_attn *a, const float **out)
{
	const unsigned n_slots = sizeof(c->rtab) / sizeof(c->rtab[0]);
	const uint64_t n = (uint64_t)a->n_ctx * a->n_rot;
	struct cudev::rtab *t;
	float *h;
	cudaError_t e;
	int rc;

	for (unsigned i = 0; i < n_slots; i++) {
		t = &c->rtab[i];
		if (t->dev && t->n_rot == a->n_rot && t->n_ctx >= a->n_ctx &&
		    !memcmp(&t->key, a->rope, sizeof(t->key))) {
			*out = t->dev;
			return 0;
		}
	}
	if (c->d.cap)
		return grow_in_capture(c, "RoPE table", 4 * n);
	t = &c->rtab[c->rtab_next++ % n_slots];
	if (t->dev) { /* queued kernels may still read it */
		if ((rc = sync_all(c)))
			return rc;
		cudaFree(t->dev);
		t->dev = NULL;
	}
	if (!(h = (float *)malloc(4 * n)))
		return hyb_device_fail(&c->d, -ENOMEM, "cuda attention: out of host memory");
	for (uint32_t p = 0; p < a->n_ctx; p++)
		hyb_rope_table(a->rope, a->n_rot, p, h + (uint64_t)p * a->n_rot,
			       h + (uint64_t)p * a->n_rot + a->n_rot / 2);
	e = cudaMalloc((void **)&t->dev, 4 * n);
	if (e == cudaSuccess)
		e = cudaMemcpy(t->dev, h, 4 * n, cudaMemcpyHostToDevice);
	free(h);
	if (e != cudaSuccess) {
		if (t->dev)
			cudaFree(t->dev);
		t->dev = NULL;
		return soft(c, e, -ENOMEM, "cudaMalloc(RoPE table)");
	}
	t->key = *a->rope;
	t->n_rot = a->n_rot;
	t->n_ctx = a->n_ctx;
	*out = t->dev;
	return 0;
}

static int cu_attention_one(struct hyb_device *d, enum hyb_stream s, const struct hyb_dev_attn *a)
{
	struct cudev *c = cu(d);
	const uint64_t hd = a->head_dim, kv = (uint64_t)a->n_head_kv * hd;
	struct hyb_cuda_attn k;
	int rc;

	if (a->head_dim > 2 * HYB_CUDA_ROPE_MAX)
		return hyb_device_fail(d, -EINVAL, "cuda attention: head_dim %u above %d",
				       a->head_dim, 2 * HYB_CUDA_ROPE_MAX);
	if ((rc = use_stream(c, s)) ||
	    (rc = workspace(c, s, hyb_cuda_attn_work_bytes(a->n_head, a->n_head_kv, a->head_dim,
							    c->n_sm))))
		return rc;
	if (a->n_rot / 2 > HYB_CUDA_ROPE_MAX)
		return hyb_device_fail(d, -EINVAL, "cuda attention: n_rot %u not supported",
				       a->n_rot);
	memset(&k, 0, sizeof(k));
	if (a->pos_at) {
		k.pos_at = (const uint32_t *)(uintptr_t)a->pos_at;
		k.n_ctx = a->n_ctx;
		k.n_swa = a->n_swa;
		k.bad = c->bad_dev;
		if ((rc = rope_tab(c, a, &k.rope_tab)))
			return rc;
	} else if (!c->rope_valid || c->rope_n_rot != a->n_rot || c->rope_pos != a->pos ||
		   memcmp(&c->rope_key, a->rope, sizeof(c->rope_key))) {
		hyb_rope_table(a->rope, a->n_rot, a->pos, c->rope.cs, c->rope.sn);
		c->rope_key = *a->rope;
		c->rope_n_rot = a->n_rot;
		c->rope_pos = a->pos;
		c->rope_valid = true;
	}
	k.n_head = a->n_head;
	k.n_head_kv = a->n_head_kv;
	k.head_dim = a->head_dim;
	k.n_rot = a->n_rot;
	k.neox = a->rope_neox;
	k.pos = a->pos;
	k.rope = &c->rope;
	k.q = (float *)(uintptr_t)a->q;
	k.k = (float *)(uintptr_t)a->k;
	k.v = (const float *)(uintptr_t)a->v;
	k.kcache = (uint16_t *)(uintptr_t)a->kcache;
	k.vcache = (uint16_t *)(uintptr_t)a->vcache;
	k.out = (float *)(uintptr_t)a->out;
	k.q_scale = a->q_scale;
	k.first = a->n_swa && a->pos + 1 > a->n_swa ? a->pos + 1 - a->n_swa : 0;
	k.work = c->wk[s];
	k.n_sm = c->n_sm;
	rc = hyb_cuda_attention(&k, c->st[s]);
	if (rc < 0)
		return hyb_device_fail(d, rc, "cuda attention: shape not supported (%u heads, "
				       "%u kv heads, head_dim %u, n_rot %u)", a->n_head,
				       a->n_head_kv, a->head_dim, a->n_rot);
	if (rc > 0)
		return fault(c, (cudaError_t)rc, "attention kernel launch");
	/*
	 * As the CPU device models it (device_cpu.c): K and V rows 0..pos (here
	 * read once per slice of at most 8 query heads of a kv head), row pos
	 * written, q and k read and written, v read, out written; the split
	 * positions' partials are small and left out. A graph's step: the
	 * rows its window could cover (the position is the kernels' to read).
	 */
	const uint64_t rows = !a->pos_at ? a->pos + 1 - k.first :
			      a->n_swa && a->n_swa < a->n_ctx ? a->n_swa : a->n_ctx;

	d->st.kernel_bytes += 4ull * rows * kv *
				      ((a->n_head / a->n_head_kv + 7) / 8) +
			      16 * kv + 12ull * a->n_head * hd;
	return 0;
}

static int cu_attention(struct hyb_device *d, enum hyb_stream s, const struct hyb_dev_attn *a)
{
	const uint64_t q_dim = (uint64_t)a->n_head * a->head_dim;
	const uint64_t kv_dim = (uint64_t)a->n_head_kv * a->head_dim;
	struct hyb_dev_attn one = *a;
	int rc = 0;

	one.batch = 0;
	for (uint32_t t = 0; t < (a->batch ? a->batch : 1) && !rc; t++) {
		one.pos = a->pos + t;
		one.q = a->q + 4 * q_dim * t;
		one.k = a->k + 4 * kv_dim * t;
		one.v = a->v + 4 * kv_dim * t;
		one.out = a->out + 4 * q_dim * t;
		rc = cu_attention_one(d, s, &one);
	}
	return rc;
}

/*
 * The predictor (kernels/cuda/predict.cu). Its workspace is the stream's
 * attention workspace: work on one stream runs in order, so the two never
 * use it at once.
 */
/*
 * TEAL's projection (kernels/cuda/teal.cu) in the stream's workspace, a
 * batch HYB_CUDA_TEAL_ROWS rows a call (each call reads the union of its
 * rows' inputs once). Its bytes: the inputs above the threshold are counted
 * on the device, so the whole matrix a call is taken, an upper bound (the
 * CPU device counts the rows read).
 */
static int cu_teal(struct hyb_device *d, enum hyb_stream s, const struct hyb_dev_teal *t)
{
	struct cudev *c = cu(d);
	const uint32_t nb = t->batch ? t->batch : 1;
	const uint32_t most = nb < HYB_CUDA_TEAL_ROWS ? nb : HYB_CUDA_TEAL_ROWS;
	struct hyb_cuda_teal k;
	int rc;

	if ((rc = use_stream(c, s)) ||
	    (rc = workspace(c, s, hyb_cuda_teal_work_bytes(t->n_in, t->n_out, most, c->n_sm))))
		return rc;
	memset(&k, 0, sizeof(k));
	k.type = t->type;
	k.n_in = t->n_in;
	k.n_out = t->n_out;
	k.row_bytes = t->row_bytes ? t->row_bytes : hyb_row_bytes(t->type, t->n_out);
	k.w = (const void *)(uintptr_t)t->w;
	k.thr = t->thr;
	k.work = c->wk[s];
	k.n_sm = c->n_sm;
	for (uint32_t r0 = 0; r0 < nb; r0 += HYB_CUDA_TEAL_ROWS) {
		k.rows = nb - r0 < HYB_CUDA_TEAL_ROWS ? nb - r0 : HYB_CUDA_TEAL_ROWS;
		k.x = (const float *)(uintptr_t)t->x + (uint64_t)r0 * t->n_in;
		k.y = (float *)(uintptr_t)t->y + (uint64_t)r0 * t->n_out;
		rc = hyb_cuda_teal(&k, c->st[s]);
		if (rc < 0)
			return hyb_device_fail(d, rc, "cuda teal: type %s not supported",
					       hyb_type_name(t->type));
		if (rc > 0)
			return fault(c, (cudaError_t)rc, "teal kernel launch");
		d->st.kernel_bytes += hyb_row_bytes(t->type, t->n_out) * t->n_in +
				      4ull * (t->n_in + t->n_out) * k.rows;
	}
	return 0;
}

static int cu_predict(struct hyb_device *d, enum hyb_stream s, const struct hyb_dev_predict *p)
{
	struct cudev *c = cu(d);
	int rc;

	if (p->n_in > HYB_CUDA_PREDICT_MAX_IN)
		return hyb_device_fail(d, -EINVAL, "cuda predict: n_in %u above %d", p->n_in,
				       HYB_CUDA_PREDICT_MAX_IN);
	if ((rc = use_stream(c, s)) || (rc = workspace(c, s, hyb_cuda_predict_workspace(p))))
		return rc;
	rc = hyb_cuda_predict(p, c->wk[s], c->wk_bytes[s], c->st[s]);
	if (rc < 0)
		return hyb_device_fail(d, rc, "cuda predict: shape not supported (%u -> %u -> %u)",
				       p->n_in, p->hidden, p->n_out);
	if (rc > 0)
		return fault(c, (cudaError_t)rc, "predict kernel launch");
	/* as the CPU device models it (device_cpu.c): every fc2 row, an upper bound */
	d->st.kernel_bytes += 2ull * p->hidden * p->n_in + 4ull * p->hidden +
			      2ull * p->hidden * p->n_out + 4ull * p->n_out + 4ull * p->n_in;
	return 0;
}

/* ---- open, close ---------------------------------------------------------------------- */

static double cu_now(struct hyb_device *d)
{
	struct timespec ts;

	(void)d;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Everything open made, in reverse; the caller's allocations are gone (device.c). */
static void cu_close(struct hyb_device *d)
{
	struct cudev *c = cu(d);

	if (!c)
		return;
	cudaSetDevice(c->dev);
	pump(c, true, NULL);
	hyb_lane_free(&c->lane);
	for (int k = 0; k < 2; k++)
		if (c->mark[k])
			cudaEventDestroy(c->mark[k]);
	for (int s = 0; s < HYB_N_STREAMS; s++) {
		if (c->st[s]) {
			cudaStreamSynchronize(c->st[s]);
			cudaStreamDestroy(c->st[s]);
		}
		if (c->scr[s])
			cudaFree(c->scr[s]);
		if (c->wk[s])
			cudaFree(c->wk[s]);
	}
	for (unsigned i = 0; i < sizeof(c->rtab) / sizeof(c->rtab[0]); i++)
		if (c->rtab[i].dev)
			cudaFree(c->rtab[i].dev);
	for (size_t i = 0; i < c->n_reg; i++)
		cudaHostUnregister(c->reg[i].p);
	for (size_t i = 0; i < c->n_hb; i++)
		cudaFreeHost(c->hb[i].p);
	if (c->bad)
		cudaFreeHost((void *)c->bad);
	if (c->arena)
		cudaFree(c->arena);
	if (c->gelu)
		cudaFree(c->gelu);
	cudaGetLastError();
	free(c->reg);
	free(c->hb);
	free(c->pc);
	free(c);
}

/* ---- host functions, graphs ---------------------------------------------------------- */

static int cu_host_fn(struct hyb_device *d, enum hyb_stream s, hyb_device_host_fn_t fn, void *arg)
{
	struct cudev *c = cu(d);
	int rc = use(c);
	cudaError_t e;

	if (rc)
		return rc;
	e = cudaLaunchHostFunc(c->st[s], (cudaHostFn_t)fn, arg);
	return e == cudaSuccess ? 0 : queue_fail(c, e, "cudaLaunchHostFunc");
}

static int cu_capture_begin(struct hyb_device *d, enum hyb_stream s)
{
	struct cudev *c = cu(d);
	int rc = use(c);
	cudaError_t e;

	if (rc)
		return rc;
	e = cudaStreamBeginCapture(c->st[s], cudaStreamCaptureModeThreadLocal);
	return e == cudaSuccess ? 0 : soft(c, e, -EINVAL, "cudaStreamBeginCapture");
}

static int cu_capture_end(struct hyb_device *d, enum hyb_stream s, bool ok, void **graph)
{
	struct cudev *c = cu(d);
	cudaGraph_t g = NULL;
	cudaGraphExec_t x = NULL;
	cudaError_t e = cudaStreamEndCapture(c->st[s], &g);

	if (!ok) {
		if (g)
			cudaGraphDestroy(g);
		cudaGetLastError(); /* the capture's own error: the front end has the reason */
		return 0;
	}
	if (e != cudaSuccess)
		return soft(c, e, -EINVAL, "cudaStreamEndCapture");
	e = cudaGraphInstantiate(&x, g, 0);
	cudaGraphDestroy(g);
	if (e != cudaSuccess)
		return soft(c, e, -ENOMEM, "cudaGraphInstantiate");
	*graph = x;
	return 0;
}

static int cu_graph_launch(struct hyb_device *d, enum hyb_stream s, void *graph)
{
	struct cudev *c = cu(d);
	int rc = use(c);
	cudaError_t e;

	if (rc)
		return rc;
	e = cudaGraphLaunch((cudaGraphExec_t)graph, c->st[s]);
	return e == cudaSuccess ? 0 : fault(c, e, "cudaGraphLaunch");
}

static void cu_graph_free(struct hyb_device *d, void *graph)
{
	(void)d;
	cudaGraphExecDestroy((cudaGraphExec_t)graph);
}

static const struct hyb_device_ops cuda_ops = {
	"cuda",
	cu_close,
	cu_now,
	cu_alloc,
	cu_free,
	cu_host_register,
	cu_host_unregister,
	cu_host_alloc,
	cu_host_free,
	cu_h2d,
	cu_d2h,
	cu_event_new,
	cu_event_free,
	cu_record,
	cu_wait,
	cu_done,
	cu_sync,
	cu_elapsed,
	cu_sparse_ffn,
	cu_add,
	cu_ffn_act,
	cu_rmsnorm,
	cu_matvec,
	cu_matvec_group,
	cu_matvec_table,
	cu_attention,
	cu_predict,
	cu_teal,
	NULL, /* host_work: a GPU's host time is real */
	cu_host_fn,
	cu_capture_begin,
	cu_capture_end,
	cu_graph_launch,
	cu_graph_free,
};

/* err gets "what: CUDA's reason"; c (may be NULL) is closed. */
static struct hyb_device *open_fail(struct cudev *c, cudaError_t e, const char *what, char *err,
				    size_t errlen)
{
	snprintf(err, errlen, "cuda device: %s: %s", what, cudaGetErrorString(e));
	cudaGetLastError();
	if (c)
		cu_close(&c->d);
	return NULL;
}

/*
 * One function of ~120 lines: device choice, streams, events, the arena, the
 * per-stream scratch, each failure closing what came before through
 * open_fail. It has not run on a GPU yet; it is split once it can be
 * exercised there (docs/DEVICE.md).
 */
extern "C" struct hyb_device *hyb_device_cuda_open(const struct hyb_device_config *cfg,
						   char *err, size_t errlen)
{
	struct hyb_device_config conf;
	struct cudev *c;
	size_t fr = 0, total = 0;
	int n = 0, least = 0, greatest = 0;
	uint64_t cap;
	char what[160];
	cudaError_t e;

	memset(&conf, 0, sizeof(conf));
	if (cfg)
		conf = *cfg;
	if (!conf.chunk_bytes)
		conf.chunk_bytes = 1ull << 20;
	e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess || n == 0) {
		snprintf(err, errlen, "no CUDA device (%s)",
			 e != cudaSuccess ? cudaGetErrorString(e) : "none found");
		cudaGetLastError();
		return NULL;
	}
	if (conf.ordinal < 0 || conf.ordinal >= n) {
		snprintf(err, errlen, "CUDA device %d does not exist (%d found)", conf.ordinal, n);
		return NULL;
	}
	c = (struct cudev *)calloc(1, sizeof(*c));
	if (!c) {
		snprintf(err, errlen, "cuda device: out of host memory");
		return NULL;
	}
	c->d.ops = &cuda_ops;
	c->d.cfg = conf;
	c->dev = conf.ordinal;
	if ((e = cudaSetDevice(c->dev)) != cudaSuccess)
		return open_fail(c, e, "cudaSetDevice", err, errlen);
	if ((e = cudaDeviceGetAttribute(&c->n_sm, cudaDevAttrMultiProcessorCount, c->dev)) !=
		    cudaSuccess ||
	    (e = cudaDeviceGetAttribute(&c->smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin,
					c->dev)) != cudaSuccess)
		return open_fail(c, e, "cudaDeviceGetAttribute", err, errlen);
	if ((e = cudaDeviceGetStreamPriorityRange(&least, &greatest)) != cudaSuccess)
		return open_fail(c, e, "cudaDeviceGetStreamPriorityRange", err, errlen);
	/* numerically lower is more urgent: CRITICAL greatest, RELOAD least */
	const int prio[HYB_N_STREAMS] = { (least + greatest) / 2, greatest, least };

	for (int s = 0; s < HYB_N_STREAMS; s++) {
		e = cudaStreamCreateWithPriority(&c->st[s], cudaStreamNonBlocking, prio[s]);
		if (e != cudaSuccess) {
			c->st[s] = NULL;
			return open_fail(c, e, "cudaStreamCreateWithPriority", err, errlen);
		}
	}
	for (int k = 0; k < 2; k++) {
		e = cudaEventCreateWithFlags(&c->mark[k], cudaEventDisableTiming);
		if (e != cudaSuccess) {
			c->mark[k] = NULL;
			return open_fail(c, e, "cudaEventCreateWithFlags", err, errlen);
		}
	}
	{
		const struct hyb_lane_ops lo = { c, lane_copy, lane_done, lane_mwait, lane_record,
						 lane_wait, lane_thread_init };

		hyb_lane_init(&c->lane, &lo, conf.chunk_bytes);
		c->lane_on = true;
		/* without its thread the lane still moves, at every call: slower, not wrong */
		(void)hyb_lane_start(&c->lane);
	}
	if ((e = cudaMemGetInfo(&fr, &total)) != cudaSuccess)
		return open_fail(c, e, "cudaMemGetInfo", err, errlen);
	cap = conf.capacity ? conf.capacity : (uint64_t)fr / 10 * 9;
	cap &= ~(ALIGN - 1);
	if (!cap || cap + HYB_N_STREAMS * SCRATCH0 > fr) {
		snprintf(err, errlen,
			 "cuda device %d: capacity of %llu bytes not available (%llu of %llu free, "
			 "%llu more needed for kernel scratch)", c->dev, (unsigned long long)cap,
			 (unsigned long long)fr, (unsigned long long)total,
			 (unsigned long long)(HYB_N_STREAMS * SCRATCH0));
		cu_close(&c->d);
		return NULL;
	}
	e = cudaMalloc((void **)&c->arena, cap);
	if (e != cudaSuccess) {
		c->arena = NULL;
		snprintf(what, sizeof(what), "cudaMalloc(%llu bytes of capacity)",
			 (unsigned long long)cap);
		return open_fail(c, e, what, err, errlen);
	}
	c->arena_bytes = cap;
	c->d.capacity = cap;
	c->d.cfg.capacity = cap;
	c->pc = (struct piece *)malloc(16 * sizeof(*c->pc));
	if (!c->pc) {
		snprintf(err, errlen, "cuda device: out of host memory");
		cu_close(&c->d);
		return NULL;
	}
	c->cap_pc = 16;
	c->n_pc = 1;
	c->pc[0].off = 0;
	c->pc[0].len = cap;
	c->pc[0].used = false;
	for (int s = 0; s < HYB_N_STREAMS; s++) {
		if ((e = cudaMalloc(&c->scr[s], SCRATCH0)) != cudaSuccess) {
			c->scr[s] = NULL;
			return open_fail(c, e, "cudaMalloc(sparse ffn scratch)", err, errlen);
		}
		c->scr_bytes[s] = SCRATCH0;
		if ((e = cudaMemsetAsync(c->scr[s], 0, SCRATCH0, c->st[s])) != cudaSuccess)
			return open_fail(c, e, "cudaMemsetAsync(scratch)", err, errlen);
	}
	/* GeGLU's table, once: 128 KiB, no allocation while decoding */
	if ((e = cudaMalloc((void **)&c->gelu, 2u << 16)) != cudaSuccess) {
		c->gelu = NULL;
		return open_fail(c, e, "cudaMalloc(GELU table)", err, errlen);
	}
	if ((e = cudaMemcpy(c->gelu, hyb_gelu_f16_table(), 2u << 16, cudaMemcpyHostToDevice)) !=
	    cudaSuccess)
		return open_fail(c, e, "cudaMemcpy(GELU table)", err, errlen);
	/* the non-resident-neuron report: mapped, so the host reads it without a copy */
	void *bad = NULL;

	if ((e = cudaHostAlloc(&bad, 64, cudaHostAllocMapped | cudaHostAllocPortable)) !=
	    cudaSuccess)
		return open_fail(c, e, "cudaHostAlloc(mapped)", err, errlen);
	memset(bad, 0, 64);
	c->bad = (volatile uint32_t *)bad;
	if (cudaHostGetDevicePointer((void **)&c->bad_dev, bad, 0) != cudaSuccess) {
		c->bad_dev = NULL; /* no mapping: bad lists are skipped, not reported */
		cudaGetLastError();
	}
	if (hyb_cuda_ffn_setup(c->smem_max) != 0 || hyb_cuda_dense_setup(c->smem_max) != 0) {
		/* the default every kernel has: n_embd up to 24576 (F16) or 43690 (Q8_0) */
		cudaGetLastError();
		c->smem_max = 48 * 1024;
	}
	for (int s = 0; s < HYB_N_STREAMS; s++) {
		if ((e = cudaStreamSynchronize(c->st[s])) != cudaSuccess)
			return open_fail(c, e, "cudaStreamSynchronize", err, errlen);
	}
	return &c->d;
}
