// SPDX-License-Identifier: MIT
/*
 * cudaemu's runtime and kernel scheduler (docs/CUDAEMU.md).
 *
 * Memory: device allocations are memfd mappings, so an IPC handle can name
 * one to another process (which maps /proc/PID/fd/N); pinned and
 * registered host memory is its own device pointer, as with unified
 * addressing. Every copy checks that the device side of it lies inside one
 * device allocation: a stray pointer is cudaErrorInvalidValue here, where a
 * GPU would fault.
 *
 * Kernels: a launch runs on the calling host thread, block after block in
 * a seeded shuffled order. A block's threads are fibers on their own
 * stacks; a fiber runs until it waits (__syncthreads, a warp op) or ends,
 * in a seeded order, so reads of shared memory that a barrier does not
 * order see the wrong writer. Launch limits are the real ones: 1024
 * threads a block, 48 KiB of dynamic shared memory unless the kernel's
 * attribute raised it, the device's opt-in maximum.
 *
 * Graphs: a capturing stream's work is checked as when it runs and
 * recorded; a graph launch runs the records in order, as a stream would.
 * CUDA's capture rules (joins, refused calls, invalidation, host
 * functions that may not call CUDA) return CUDA's codes.
 */
#include "cudaemu.h"

#include <errno.h>
#include <fcntl.h>
#include <immintrin.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <utility>
#include <vector>

namespace {

/* the emulated device: an H100-like part, as far as hyb's code asks */
constexpr int EMU_SMS = 132;
constexpr int EMU_SMEM_DEFAULT = 48 * 1024;
constexpr int EMU_SMEM_OPTIN = 227 * 1024;
constexpr int EMU_THREADS_PER_SM = 2048;
constexpr int EMU_SMEM_PER_SM = 228 * 1024;
constexpr size_t EMU_STACK = 256 * 1024;

thread_local cudaError_t last_error = cudaSuccess;

cudaError_t fail(cudaError_t e)
{
	if (e != cudaSuccess)
		last_error = e;
	return e;
}

/*
 * HYB_CUDAEMU_FAIL_AT=N: the N-th call that takes a resource (device or
 * pinned memory, a registration, a stream, an event, an IPC mapping, a
 * graph's instantiation) fails as it would when the GPU has none left, and
 * says so on stderr: the callers' error paths, which a GPU never takes on
 * demand.
 */
std::atomic<long> inject_calls, inject_at{-1};
std::atomic<bool> inject_hit;

bool injected(const char *call)
{
	if (inject_at.load() < 0) {
		const char *s = getenv("HYB_CUDAEMU_FAIL_AT");
		long v = s && *s ? atol(s) : 0L, unset = -1;

		inject_at.compare_exchange_strong(unset, v);
	}
	const long at = inject_at.load();
	if (!at || ++inject_calls != at)
		return false;
	inject_hit = true;
	fprintf(stderr, "cudaemu: call %ld (%s) fails as injected\n", at, call);
	return true;
}

int device_count()
{
	const char *s = getenv("HYB_CUDAEMU_DEVICES");

	return s && *s ? atoi(s) : 1;
}

size_t device_memory()
{
	const char *s = getenv("HYB_CUDAEMU_MEM_MB");

	return (s && *s ? strtoull(s, NULL, 10) : 16384) << 20;
}

/* ---- memory ----------------------------------------------------------------------------- */

enum mem_kind { MEM_DEVICE, MEM_IPC, MEM_HOST_ALLOC, MEM_REGISTERED };

struct region {
	size_t len;
	mem_kind kind;
	int fd;          /* MEM_DEVICE: the memfd an IPC handle names */
	void *map;       /* MEM_DEVICE, MEM_IPC: the mapping, guard pages included */
	size_t map_len;
	size_t file_len; /* the memfd's size; the allocation ends where it does */
};

std::mutex mem_lock;
std::map<uintptr_t, region> regions; /* by start address */
size_t device_used;

/* the region holding [p, p + n), or NULL */
const region *find(const void *p, size_t n, uintptr_t *start)
{
	const uintptr_t a = (uintptr_t)p;
	auto it = regions.upper_bound(a);

	if (it == regions.begin())
		return NULL;
	--it;
	if (a - it->first > it->second.len || n > it->second.len - (a - it->first))
		return NULL;
	if (start)
		*start = it->first;
	return &it->second;
}

/* the device reaches its own memory and, mapped, pinned host memory */
bool on_device(const void *p, size_t n)
{
	std::lock_guard<std::mutex> g(mem_lock);

	return find(p, n ? n : 1, NULL) != NULL;
}

/* ---- streams and events ----------------------------------------------------------------- */

constexpr uint32_t STREAM_MAGIC = 0x5354524d, EVENT_MAGIC = 0x45564e54;

double now_ms()
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

} // namespace

/* a capture's streams: how much of each one's captured work a point follows */
typedef std::map<const CUstream_st *, uint64_t> emu_clock;

struct CUstream_st {
	uint32_t magic;
	int priority;
	unsigned int flags;
	struct hyb_emu_capture *cap; /* the capture it is in (cap_lock), or NULL */
	emu_clock clock;             /* in it: the captured work its next work follows */
};
struct CUevent_st {
	uint32_t magic;
	unsigned int flags;
	bool recorded;
	double ms;
	uint64_t cap_id; /* the capture that last recorded it (cap_lock); 0: none */
	emu_clock clock; /* the recording stream's, then */
};

/* an operation a capture recorded, run at each launch of the graph */
struct hyb_emu_node {
	enum { COPY, SET, KERNEL, HOST_FN, RECORD } kind = COPY;
	void *dst = NULL;
	const void *src = NULL;
	size_t n = 0;
	cudaMemcpyKind copy_kind = cudaMemcpyDefault;
	int value = 0;
	const void *kernel = NULL;
	const char *name = NULL;
	dim3 grid, block;
	size_t smem = 0;
	std::function<void()> body; /* owns the launch's arguments */
	cudaHostFn_t fn = NULL;
	void *arg = NULL;
	cudaEvent_t event = NULL;
};

struct hyb_emu_capture {
	uint64_t id;
	cudaStream_t origin;
	cudaStreamCaptureMode mode;
	const void *thread;                /* the beginning thread's tl_thread */
	cudaError_t invalid;               /* what invalidated it; cudaSuccess: nothing */
	std::vector<cudaStream_t> streams; /* the origin, then those that joined */
	std::vector<hyb_emu_node> nodes;   /* in the order captured: a topological order */
};

struct CUgraph_st {
	uint32_t magic;
	std::vector<hyb_emu_node> nodes;
};
struct CUgraphExec_st {
	uint32_t magic;
	std::vector<hyb_emu_node> nodes;
};

namespace {

constexpr uint32_t GRAPH_MAGIC = 0x47525048, EXEC_MAGIC = 0x47455845;

bool stream_ok(cudaStream_t s)
{
	return !s || s->magic == STREAM_MAGIC;
}
bool event_ok(cudaEvent_t e)
{
	return e && e->magic == EVENT_MAGIC;
}
bool graph_ok(cudaGraph_t g)
{
	return g && g->magic == GRAPH_MAGIC;
}
bool exec_ok(cudaGraphExec_t x)
{
	return x && x->magic == EXEC_MAGIC;
}

/* ---- stream capture ----------------------------------------------------------------------- */

/*
 * Every capture's state (streams' and events' capture fields, the captures)
 * is under cap_lock: another thread (hyb's RELOAD lane) queues work and
 * queries events while one captures. Lock order: cap_lock, then mem_lock.
 */
std::mutex cap_lock;
std::map<uint64_t, hyb_emu_capture *> captures; /* those under way, by id */
uint64_t capture_ids;
std::set<const CUevent_st *> live_events;      /* for a graph's record nodes */
thread_local char tl_thread;                   /* its address names the thread */
thread_local bool in_host_fn;                  /* a host function runs on this thread */

/* CUDA forbids a host function to call CUDA (it may deadlock): refused here */
#define HOST_FN_GUARD()                                                                    \
	do {                                                                               \
		if (in_host_fn)                                                            \
			return fail(cudaErrorNotPermitted);                                \
	} while (0)

/* the capture (if any) is invalid from now on; the call fails with e */
cudaError_t spoil(hyb_emu_capture *c, cudaError_t e)
{
	if (c && c->invalid == cudaSuccess)
		c->invalid = e;
	return fail(e);
}

/* whether c holds a blocking stream, one the legacy stream synchronizes with */
bool blocking(const hyb_emu_capture *c)
{
	for (cudaStream_t m : c->streams)
		if (!(m->flags & cudaStreamNonBlocking))
			return true;
	return false;
}

/*
 * Under cap_lock, for work queued on s: *c is the capture that records it,
 * NULL when it runs now. The legacy stream waits for every blocking
 * stream, so using it while one is captured would tie uncaptured work to
 * the capture: cudaErrorStreamCaptureImplicit, and those captures are
 * invalid (non-blocking streams, as hyb's, leave it free).
 */
cudaError_t enter(cudaStream_t s, hyb_emu_capture **c)
{
	*c = NULL;
	if (!s) {
		bool hit = false;

		for (auto &kv : captures)
			if (blocking(kv.second)) {
				spoil(kv.second, cudaErrorStreamCaptureImplicit);
				hit = true;
			}
		return hit ? fail(cudaErrorStreamCaptureImplicit) : cudaSuccess;
	}
	if (!s->cap)
		return cudaSuccess;
	if (s->cap->invalid != cudaSuccess)
		return fail(cudaErrorStreamCaptureInvalidated);
	*c = s->cap;
	return cudaSuccess;
}

/*
 * A call CUDA deems potentially unsafe during a capture (it may
 * synchronize implicitly): refused, and the capture invalidated, on the
 * thread that began a ThreadLocal or Global capture, and on any thread
 * while a Global one is under way; never for a Relaxed one.
 */
cudaError_t unsafe_call()
{
	std::lock_guard<std::mutex> g(cap_lock);
	bool hit = false;

	for (auto &kv : captures) {
		hyb_emu_capture *c = kv.second;

		if (c->mode == cudaStreamCaptureModeGlobal ||
		    (c->mode == cudaStreamCaptureModeThreadLocal && c->thread == &tl_thread)) {
			spoil(c, cudaErrorStreamCaptureUnsupported);
			hit = true;
		}
	}
	return hit ? fail(cudaErrorStreamCaptureUnsupported) : cudaSuccess;
}

/* n recorded as s's next work in c */
void record(hyb_emu_capture *c, cudaStream_t s, hyb_emu_node &&n)
{
	c->nodes.push_back(std::move(n));
	s->clock[s]++;
}

uint64_t clock_of(const emu_clock &k, const CUstream_st *s)
{
	auto it = k.find(s);

	return it == k.end() ? 0 : it->second;
}

/* an event as a capture left it (cap_lock) */
enum ev_state { EV_PLAIN, EV_CAPTURED, EV_STALE };
ev_state event_state(cudaEvent_t e)
{
	if (!e->cap_id)
		return EV_PLAIN;
	return captures.count(e->cap_id) ? EV_CAPTURED : EV_STALE;
}

/* [p, p + n) lies in pinned or registered host memory */
bool pinned(const void *p, size_t n)
{
	std::lock_guard<std::mutex> g(mem_lock);
	const region *r = find(p, n ? n : 1, NULL);

	return r && (r->kind == MEM_HOST_ALLOC || r->kind == MEM_REGISTERED);
}

/*
 * A copy's pointers: its device side inside one allocation (or pinned
 * memory). In a graph (captured, or launched) its host side must be
 * pinned too: a graph's copy cannot stage pageable memory
 * (cudaErrorStreamCaptureUnsupported).
 */
cudaError_t copy_check(void *dst, const void *src, size_t n, cudaMemcpyKind kind, bool graph)
{
	const cudaError_t pageable = cudaErrorStreamCaptureUnsupported;

	switch (kind) {
	case cudaMemcpyHostToDevice:
		if (!on_device(dst, n))
			return cudaErrorInvalidValue;
		return graph && !pinned(src, n) ? pageable : cudaSuccess;
	case cudaMemcpyDeviceToHost:
		if (!on_device(src, n))
			return cudaErrorInvalidValue;
		return graph && !pinned(dst, n) ? pageable : cudaSuccess;
	case cudaMemcpyDeviceToDevice:
		return on_device(src, n) && on_device(dst, n) ? cudaSuccess : cudaErrorInvalidValue;
	case cudaMemcpyHostToHost:
		return graph && (!pinned(src, n) || !pinned(dst, n)) ? pageable : cudaSuccess;
	case cudaMemcpyDefault:
		return graph && (!on_device(src, n) || !on_device(dst, n)) ? pageable : cudaSuccess;
	}
	return cudaErrorInvalidValue;
}

void run_host_fn(cudaHostFn_t fn, void *arg)
{
	in_host_fn = true;
	fn(arg);
	in_host_fn = false;
}

} // namespace

/* ---- the runtime ------------------------------------------------------------------------ */

extern "C" {

void hyb_emu_fail_at(long n)
{
	inject_calls = 0;
	inject_hit = false;
	inject_at = n;
}

int hyb_emu_fail_hit(void)
{
	return inject_hit;
}

const char *cudaGetErrorString(cudaError_t e)
{
	switch (e) {
	case cudaSuccess: return "no error";
	case cudaErrorInvalidValue: return "invalid argument";
	case cudaErrorMemoryAllocation: return "out of memory";
	case cudaErrorInitializationError: return "initialization error";
	case cudaErrorInvalidConfiguration: return "invalid configuration argument";
	case cudaErrorInvalidDevicePointer: return "invalid device pointer";
	case cudaErrorInsufficientDriver: return "CUDA driver version is insufficient for CUDA runtime version";
	case cudaErrorNoDevice: return "no CUDA-capable device is detected";
	case cudaErrorInvalidDevice: return "invalid device ordinal";
	case cudaErrorInvalidResourceHandle: return "invalid resource handle";
	case cudaErrorIllegalState: return "the operation cannot be performed in the present state";
	case cudaErrorNotReady: return "device not ready";
	case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
	case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
	case cudaErrorHostMemoryAlreadyRegistered:
		return "part or all of the requested memory range is already mapped";
	case cudaErrorHostMemoryNotRegistered: return "pointer does not correspond to a registered memory region";
	case cudaErrorLaunchFailure: return "unspecified launch failure";
	case cudaErrorNotPermitted: return "operation not permitted";
	case cudaErrorNotSupported: return "operation not supported";
	case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
	case cudaErrorStreamCaptureInvalidated:
		return "operation failed due to a previous error during capture";
	case cudaErrorStreamCaptureMerge:
		return "operation would result in a merge of separate capture sequences";
	case cudaErrorStreamCaptureUnmatched: return "capture was not ended in the same stream as it began";
	case cudaErrorStreamCaptureUnjoined: return "capturing stream has unjoined work";
	case cudaErrorStreamCaptureIsolation:
		return "dependency created on uncaptured work in another stream";
	case cudaErrorStreamCaptureImplicit:
		return "operation would make the legacy stream depend on a capturing blocking stream";
	case cudaErrorCapturedEvent:
		return "operation not permitted on an event last recorded in a capturing stream";
	case cudaErrorStreamCaptureWrongThread:
		return "attempt to terminate a thread-local capture sequence from another thread";
	default: return "unknown error";
	}
}

cudaError_t cudaGetLastError(void)
{
	const cudaError_t e = last_error;

	last_error = cudaSuccess;
	return e;
}

cudaError_t cudaGetDeviceCount(int *n)
{
	HOST_FN_GUARD();
	if (!n)
		return fail(cudaErrorInvalidValue);
	*n = device_count();
	return *n ? cudaSuccess : fail(cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int dev)
{
	HOST_FN_GUARD();
	return dev >= 0 && dev < device_count() ? cudaSuccess : fail(cudaErrorInvalidDevice);
}

cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr attr, int dev)
{
	HOST_FN_GUARD();
	if (!v || dev < 0 || dev >= device_count())
		return fail(!v ? cudaErrorInvalidValue : cudaErrorInvalidDevice);
	switch (attr) {
	case cudaDevAttrMultiProcessorCount: *v = EMU_SMS; return cudaSuccess;
	case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = EMU_SMEM_OPTIN; return cudaSuccess;
	case cudaDevAttrHostRegisterReadOnlySupported: {
		const char *s = getenv("HYB_CUDAEMU_NO_READONLY_REGISTER");

		*v = !(s && *s && strcmp(s, "0"));
		return cudaSuccess;
	}
	}
	return fail(cudaErrorInvalidValue);
}

cudaError_t cudaDeviceGetPCIBusId(char *id, int len, int dev)
{
	HOST_FN_GUARD();
	if (!id || len < 13)
		return fail(cudaErrorInvalidValue);
	if (dev < 0 || dev >= device_count())
		return fail(cudaErrorInvalidDevice);
	snprintf(id, (size_t)len, "0000:%02x:00.0", 0x18 + dev);
	return cudaSuccess;
}

cudaError_t cudaDeviceGetByPCIBusId(int *dev, const char *id)
{
	unsigned int dom, bus, slot, fn;

	HOST_FN_GUARD();
	if (!dev || !id || sscanf(id, "%x:%x:%x.%x", &dom, &bus, &slot, &fn) != 4)
		return fail(cudaErrorInvalidValue);
	if (dom != 0 || slot != 0 || fn != 0 || bus < 0x18 || (int)(bus - 0x18) >= device_count())
		return fail(cudaErrorInvalidDevice);
	*dev = (int)(bus - 0x18);
	return cudaSuccess;
}

cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest)
{
	HOST_FN_GUARD();
	if (least)
		*least = 0;
	if (greatest)
		*greatest = -5;
	return cudaSuccess;
}

/* the device holds every capturing stream: synchronizing it is invalid during any capture */
cudaError_t cudaDeviceSynchronize(void)
{
	HOST_FN_GUARD();
	std::lock_guard<std::mutex> g(cap_lock);

	if (captures.empty())
		return cudaSuccess;
	for (auto &kv : captures)
		spoil(kv.second, cudaErrorStreamCaptureUnsupported);
	return fail(cudaErrorStreamCaptureUnsupported);
}

cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b)
{
	HOST_FN_GUARD();
	std::lock_guard<std::mutex> g(mem_lock);

	if (!free_b || !total_b)
		return fail(cudaErrorInvalidValue);
	*total_b = device_memory();
	*free_b = *total_b - std::min(device_used, *total_b);
	return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t n)
{
	static bool raised;

	HOST_FN_GUARD();
	if (unsafe_call() != cudaSuccess)
		return cudaErrorStreamCaptureUnsupported;
	if (!p)
		return fail(cudaErrorInvalidValue);
	*p = NULL;
	if (n == 0)
		return cudaSuccess;
	if (injected("cudaMalloc"))
		return fail(cudaErrorMemoryAllocation);
	std::lock_guard<std::mutex> g(mem_lock);
	if (!raised) { /* a memfd per allocation: room for many */
		struct rlimit rl;

		if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
			rl.rlim_cur = rl.rlim_max;
			setrlimit(RLIMIT_NOFILE, &rl);
		}
		raised = true;
	}
	/*
	 * The allocation ends where its last page does, a guard page after it
	 * and one before: a kernel reading or writing more than 255 bytes past
	 * its end (CUDA aligns to 256) faults, and the fault names the kernel.
	 */
	const size_t used = (n + 255) & ~(size_t)255, len = (used + 4095) & ~(size_t)4095;
	if (len > device_memory() - std::min(device_used, device_memory()))
		return fail(cudaErrorMemoryAllocation);
	const int fd = memfd_create("cudaemu", MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)len) != 0) {
		if (fd >= 0)
			close(fd);
		return fail(cudaErrorMemoryAllocation);
	}
	char *res = (char *)mmap(NULL, len + 8192, PROT_NONE,
				 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (res == MAP_FAILED ||
	    mmap(res + 4096, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) ==
		    MAP_FAILED) {
		if (res != MAP_FAILED)
			munmap(res, len + 8192);
		close(fd);
		return fail(cudaErrorMemoryAllocation);
	}
	char *m = res + 4096 + (len - used);
	regions[(uintptr_t)m] = region{used, MEM_DEVICE, fd, res, len + 8192, len};
	device_used += len;
	*p = m;
	return cudaSuccess;
}

cudaError_t cudaFree(void *p)
{
	HOST_FN_GUARD();
	if (unsafe_call() != cudaSuccess)
		return cudaErrorStreamCaptureUnsupported;
	if (!p)
		return cudaSuccess;
	std::lock_guard<std::mutex> g(mem_lock);
	auto it = regions.find((uintptr_t)p);
	if (it == regions.end() || it->second.kind != MEM_DEVICE)
		return fail(cudaErrorInvalidValue);
	munmap(it->second.map, it->second.map_len);
	close(it->second.fd);
	device_used -= it->second.file_len;
	regions.erase(it);
	return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **p, size_t n, unsigned int flags)
{
	HOST_FN_GUARD();
	if (unsafe_call() != cudaSuccess)
		return cudaErrorStreamCaptureUnsupported;
	if (!p || (flags & ~(unsigned)(cudaHostAllocPortable | cudaHostAllocMapped | 0x04)))
		return fail(cudaErrorInvalidValue);
	*p = NULL;
	if (injected("cudaHostAlloc"))
		return fail(cudaErrorMemoryAllocation);
	const size_t len = (n + 4095) & ~(size_t)4095;
	void *m = mmap(NULL, len ? len : 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
		       -1, 0);
	if (m == MAP_FAILED)
		return fail(cudaErrorMemoryAllocation);
	std::lock_guard<std::mutex> g(mem_lock);
	regions[(uintptr_t)m] = region{len ? len : 4096, MEM_HOST_ALLOC, -1, m, len ? len : 4096, 0};
	*p = m;
	return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p)
{
	HOST_FN_GUARD();
	if (unsafe_call() != cudaSuccess)
		return cudaErrorStreamCaptureUnsupported;
	if (!p)
		return cudaSuccess;
	std::lock_guard<std::mutex> g(mem_lock);
	auto it = regions.find((uintptr_t)p);
	if (it == regions.end() || it->second.kind != MEM_HOST_ALLOC)
		return fail(cudaErrorInvalidValue);
	munmap(it->second.map, it->second.map_len);
	regions.erase(it);
	return cudaSuccess;
}

cudaError_t cudaHostRegister(void *p, size_t n, unsigned int flags)
{
	const unsigned int known = cudaHostRegisterPortable | cudaHostRegisterMapped |
				   cudaHostRegisterReadOnly | 0x04 /* IoMemory */;
	int ro = 0;

	HOST_FN_GUARD();
	if (unsafe_call() != cudaSuccess)
		return cudaErrorStreamCaptureUnsupported;
	if (!p || !n || (flags & ~known))
		return fail(cudaErrorInvalidValue);
	if ((flags & cudaHostRegisterReadOnly) &&
	    (cudaDeviceGetAttribute(&ro, cudaDevAttrHostRegisterReadOnlySupported, 0) != cudaSuccess ||
	     !ro))
		return fail(cudaErrorNotSupported);
	if (injected("cudaHostRegister"))
		return fail(cudaErrorMemoryAllocation);
	std::lock_guard<std::mutex> g(mem_lock);
	const uintptr_t a = (uintptr_t)p;
	auto it = regions.lower_bound(a);
	if (it != regions.end() && it->first < a + n)
		return fail(cudaErrorHostMemoryAlreadyRegistered);
	if (it != regions.begin() && (--it)->first + it->second.len > a)
		return fail(cudaErrorHostMemoryAlreadyRegistered);
	regions[a] = region{n, MEM_REGISTERED, -1, NULL, 0, 0};
	return cudaSuccess;
}

cudaError_t cudaHostUnregister(void *p)
{
	HOST_FN_GUARD();
	if (unsafe_call() != cudaSuccess)
		return cudaErrorStreamCaptureUnsupported;
	std::lock_guard<std::mutex> g(mem_lock);
	auto it = regions.find((uintptr_t)p);

	if (it == regions.end() || it->second.kind != MEM_REGISTERED)
		return fail(cudaErrorHostMemoryNotRegistered);
	regions.erase(it);
	return cudaSuccess;
}

cudaError_t cudaHostGetDevicePointer(void **d, void *h, unsigned int flags)
{
	HOST_FN_GUARD();
	if (!d || flags)
		return fail(cudaErrorInvalidValue);
	std::lock_guard<std::mutex> g(mem_lock);
	const region *r = find(h, 1, NULL);
	if (!r || (r->kind != MEM_HOST_ALLOC && r->kind != MEM_REGISTERED))
		return fail(cudaErrorInvalidValue);
	*d = h;
	return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind,
			    cudaStream_t s)
{
	HOST_FN_GUARD();
	if (!stream_ok(s))
		return fail(cudaErrorInvalidResourceHandle);
	{
		std::lock_guard<std::mutex> g(cap_lock);
		hyb_emu_capture *c;
		cudaError_t e = enter(s, &c);

		if (e != cudaSuccess)
			return e;
		if (!n)
			return cudaSuccess;
		if (!dst || !src)
			return spoil(c, cudaErrorInvalidValue);
		if ((e = copy_check(dst, src, n, kind, c != NULL)) != cudaSuccess)
			return spoil(c, e);
		if (c) {
			hyb_emu_node x;

			x.kind = hyb_emu_node::COPY;
			x.dst = dst;
			x.src = src;
			x.n = n;
			x.copy_kind = kind;
			record(c, s, std::move(x));
			return cudaSuccess;
		}
	}
	memmove(dst, src, n);
	return cudaSuccess;
}

/* the synchronous calls use the legacy stream and wait for it */
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind)
{
	HOST_FN_GUARD();
	if (unsafe_call() != cudaSuccess)
		return cudaErrorStreamCaptureUnsupported;
	return cudaMemcpyAsync(dst, src, n, kind, NULL);
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s)
{
	HOST_FN_GUARD();
	if (!stream_ok(s))
		return fail(cudaErrorInvalidResourceHandle);
	{
		std::lock_guard<std::mutex> g(cap_lock);
		hyb_emu_capture *c;
		const cudaError_t e = enter(s, &c);

		if (e != cudaSuccess)
			return e;
		if (!n)
			return cudaSuccess;
		if (!on_device(p, n))
			return spoil(c, cudaErrorInvalidValue);
		if (c) {
			hyb_emu_node x;

			x.kind = hyb_emu_node::SET;
			x.dst = p;
			x.n = n;
			x.value = v;
			record(c, s, std::move(x));
			return cudaSuccess;
		}
	}
	memset(p, v, n);
	return cudaSuccess;
}

cudaError_t cudaMemset(void *p, int v, size_t n)
{
	HOST_FN_GUARD();
	if (unsafe_call() != cudaSuccess)
		return cudaErrorStreamCaptureUnsupported;
	return cudaMemsetAsync(p, v, n, NULL);
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned int flags, int priority)
{
	HOST_FN_GUARD();
	if (!s || (flags & ~(unsigned)cudaStreamNonBlocking))
		return fail(cudaErrorInvalidValue);
	if (injected("cudaStreamCreateWithPriority"))
		return fail(cudaErrorMemoryAllocation);
	*s = new CUstream_st{STREAM_MAGIC, std::max(-5, std::min(0, priority)), flags, NULL, {}};
	return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
	HOST_FN_GUARD();
	if (!s || s->magic != STREAM_MAGIC)
		return fail(cudaErrorInvalidResourceHandle);
	{
		std::lock_guard<std::mutex> g(cap_lock);

		/* a capture's stream stays until the capture ends */
		if (s->cap)
			return spoil(s->cap, cudaErrorStreamCaptureUnsupported);
	}
	s->magic = 0;
	delete s;
	return cudaSuccess;
}

/* a capturing stream has nothing to wait for: its work runs at the graph's launch */
cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
	HOST_FN_GUARD();
	if (!stream_ok(s))
		return fail(cudaErrorInvalidResourceHandle);
	std::lock_guard<std::mutex> g(cap_lock);
	hyb_emu_capture *c;

	if (!s)
		return enter(s, &c);
	return s->cap ? spoil(s->cap, cudaErrorStreamCaptureUnsupported) : cudaSuccess;
}

/*
 * A wait for an event recorded in a capture joins s to it (its later work
 * is captured too); a capturing stream may not wait for work outside its
 * capture (cudaErrorStreamCaptureIsolation) nor in another capture
 * (cudaErrorStreamCaptureMerge). An event whose capture has ended marks
 * no work any stream can wait for.
 */
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags)
{
	HOST_FN_GUARD();
	if (!stream_ok(s))
		return fail(cudaErrorInvalidResourceHandle);
	std::lock_guard<std::mutex> g(cap_lock);
	hyb_emu_capture *sc = s ? s->cap : NULL, *c;

	if (!event_ok(e))
		return spoil(sc, cudaErrorInvalidResourceHandle);
	if (flags)
		return spoil(sc, cudaErrorInvalidValue);
	if (sc && sc->invalid != cudaSuccess)
		return fail(cudaErrorStreamCaptureInvalidated);
	switch (event_state(e)) {
	case EV_PLAIN:
		if (sc)
			return spoil(sc, cudaErrorStreamCaptureIsolation);
		return enter(s, &c);
	case EV_STALE:
		return spoil(sc, cudaErrorInvalidValue);
	case EV_CAPTURED:
		break;
	}
	hyb_emu_capture *ec = captures[e->cap_id];
	if (!s) /* the legacy stream cannot join a capture */
		return spoil(ec, cudaErrorStreamCaptureImplicit);
	if (sc && sc != ec) {
		spoil(ec, cudaErrorStreamCaptureMerge);
		return spoil(sc, cudaErrorStreamCaptureMerge);
	}
	if (!sc) {
		s->cap = ec;
		s->clock.clear();
		ec->streams.push_back(s);
	}
	for (const auto &kv : e->clock)
		s->clock[kv.first] = std::max(s->clock[kv.first], kv.second);
	return ec->invalid != cudaSuccess ? fail(cudaErrorStreamCaptureInvalidated) : cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags)
{
	HOST_FN_GUARD();
	if (!e || (flags & ~(unsigned)(cudaEventBlockingSync | cudaEventDisableTiming | 0x04)))
		return fail(cudaErrorInvalidValue);
	if (injected("cudaEventCreateWithFlags"))
		return fail(cudaErrorMemoryAllocation);
	*e = new CUevent_st{EVENT_MAGIC, flags, false, 0, 0, {}};
	std::lock_guard<std::mutex> g(cap_lock);
	live_events.insert(*e);
	return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e)
{
	HOST_FN_GUARD();
	std::lock_guard<std::mutex> g(cap_lock);

	if (!event_ok(e))
		return fail(cudaErrorInvalidResourceHandle);
	live_events.erase(e);
	e->magic = 0;
	delete e;
	return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
	return cudaEventRecordWithFlags(e, s, cudaEventRecordDefault);
}

/*
 * In a capture a record is no node: the event marks the capture's work so
 * far, for other streams to fork from and join back with, and no graph
 * launch records it (cudaEventRecordExternal makes a node that does).
 */
cudaError_t cudaEventRecordWithFlags(cudaEvent_t e, cudaStream_t s, unsigned int flags)
{
	HOST_FN_GUARD();
	if (!stream_ok(s))
		return fail(cudaErrorInvalidResourceHandle);
	std::lock_guard<std::mutex> g(cap_lock);
	hyb_emu_capture *c;
	const cudaError_t r = enter(s, &c);

	if (r != cudaSuccess)
		return r;
	if (!event_ok(e))
		return spoil(c, cudaErrorInvalidResourceHandle);
	if (flags & ~(unsigned)cudaEventRecordExternal)
		return spoil(c, cudaErrorInvalidValue);
	if (flags & cudaEventRecordExternal) {
		if (!c) /* a node in a capture, and nothing outside one */
			return fail(cudaErrorInvalidValue);
		hyb_emu_node x;

		x.kind = hyb_emu_node::RECORD;
		x.event = e;
		record(c, s, std::move(x));
		return cudaSuccess;
	}
	if (c) {
		e->cap_id = c->id;
		e->clock = s->clock;
		return cudaSuccess;
	}
	e->cap_id = 0;
	e->clock.clear();
	e->recorded = true;
	e->ms = now_ms();
	return cudaSuccess;
}

/*
 * An event recorded in a capture under way stands for no work that runs:
 * querying it is cudaErrorCapturedEvent (and invalidates the capture); once
 * the capture ended, cudaErrorInvalidValue until it is recorded again.
 */
static cudaError_t event_usable(cudaEvent_t e)
{
	switch (event_state(e)) {
	case EV_CAPTURED:
		return spoil(captures[e->cap_id], cudaErrorCapturedEvent);
	case EV_STALE:
		return fail(cudaErrorInvalidValue);
	case EV_PLAIN:
		break;
	}
	return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e)
{
	HOST_FN_GUARD();
	std::lock_guard<std::mutex> g(cap_lock);

	return event_ok(e) ? event_usable(e) : fail(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
	HOST_FN_GUARD();
	std::lock_guard<std::mutex> g(cap_lock);

	return event_ok(e) ? event_usable(e) : fail(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
	HOST_FN_GUARD();
	if (!ms)
		return fail(cudaErrorInvalidValue);
	std::lock_guard<std::mutex> g(cap_lock);
	if (!event_ok(a) || !event_ok(b) || ((a->flags | b->flags) & cudaEventDisableTiming))
		return fail(cudaErrorInvalidResourceHandle);
	cudaError_t e = event_usable(a);
	if (e != cudaSuccess || (e = event_usable(b)) != cudaSuccess)
		return e;
	if (!a->recorded || !b->recorded)
		return fail(cudaErrorInvalidResourceHandle);
	*ms = (float)(b->ms - a->ms);
	return cudaSuccess;
}

/* ---- IPC: the handle names the allocation's memfd in its process ---------------------- */

struct ipc_handle {
	char magic[8];
	int32_t pid, fd;
	uint64_t len, file_len; /* the allocation ends where the memfd does */
};
static_assert(sizeof(ipc_handle) <= sizeof(cudaIpcMemHandle_t), "handle fits");

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *h, void *p)
{
	uintptr_t start;

	HOST_FN_GUARD();
	if (!h)
		return fail(cudaErrorInvalidValue);
	std::lock_guard<std::mutex> g(mem_lock);
	const region *r = find(p, 1, &start);
	if (!r || r->kind != MEM_DEVICE || start != (uintptr_t)p)
		return fail(cudaErrorInvalidValue);
	ipc_handle ih = {{'c', 'u', 'd', 'a', 'e', 'm', 'u', 0}, (int32_t)getpid(), r->fd, r->len,
			 r->file_len};
	memset(h, 0, sizeof *h);
	memcpy(h, &ih, sizeof ih);
	return cudaSuccess;
}

cudaError_t cudaIpcOpenMemHandle(void **p, cudaIpcMemHandle_t h, unsigned int flags)
{
	ipc_handle ih;
	char path[64];

	HOST_FN_GUARD();
	if (!p || (flags & ~(unsigned)cudaIpcMemLazyEnablePeerAccess))
		return fail(cudaErrorInvalidValue);
	if (injected("cudaIpcOpenMemHandle"))
		return fail(cudaErrorMemoryAllocation);
	memcpy(&ih, &h, sizeof ih);
	if (memcmp(ih.magic, "cudaemu", 8) != 0 || !ih.len || ih.len > ih.file_len)
		return fail(cudaErrorInvalidValue);
	if (ih.pid == getpid()) /* as the real runtime: not in the process that made it */
		return fail(cudaErrorInvalidValue);
	snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)ih.pid, (int)ih.fd);
	const int fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return fail(cudaErrorInvalidValue);
	struct stat st;
	void *m = MAP_FAILED;
	if (fstat(fd, &st) == 0 && (uint64_t)st.st_size == ih.file_len)
		m = mmap(NULL, ih.file_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (m == MAP_FAILED)
		return fail(cudaErrorInvalidValue);
	char *a = (char *)m + (ih.file_len - ih.len);
	std::lock_guard<std::mutex> g(mem_lock);
	regions[(uintptr_t)a] = region{ih.len, MEM_IPC, -1, m, ih.file_len, ih.file_len};
	*p = a;
	return cudaSuccess;
}

cudaError_t cudaIpcCloseMemHandle(void *p)
{
	HOST_FN_GUARD();
	std::lock_guard<std::mutex> g(mem_lock);
	auto it = regions.find((uintptr_t)p);

	if (it == regions.end() || it->second.kind != MEM_IPC)
		return fail(cudaErrorInvalidValue);
	munmap(it->second.map, it->second.map_len);
	regions.erase(it);
	return cudaSuccess;
}

} // extern "C"

/* ---- kernels' attributes ---------------------------------------------------------------- */

namespace {
std::mutex attr_lock;
std::map<const void *, int> max_dyn_smem;

int dyn_smem_limit(const void *kernel)
{
	std::lock_guard<std::mutex> g(attr_lock);
	auto it = max_dyn_smem.find(kernel);

	return it == max_dyn_smem.end() ? EMU_SMEM_DEFAULT : it->second;
}
} // namespace

cudaError_t hyb_emu_func_set_attribute(const void *func, cudaFuncAttribute attr, int value)
{
	HOST_FN_GUARD();
	if (!func || attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
	    value > EMU_SMEM_OPTIN)
		return fail(cudaErrorInvalidValue);
	std::lock_guard<std::mutex> g(attr_lock);
	max_dyn_smem[func] = value;
	return cudaSuccess;
}

/* threads and shared memory only: the emulation knows no register counts */
cudaError_t hyb_emu_occupancy(int *blocks, const void *func, int threads, size_t smem)
{
	HOST_FN_GUARD();
	if (!blocks || !func || threads < 1 || threads > 1024)
		return fail(cudaErrorInvalidValue);
	const int by_threads = EMU_THREADS_PER_SM / ((threads + 31) / 32 * 32);
	const int by_smem = (int)(EMU_SMEM_PER_SM / (smem + 1024));
	*blocks = std::min(std::min(by_threads, by_smem), 32);
	return cudaSuccess;
}

/* ---- half conversions, as the GPU rounds ------------------------------------------------ */

__attribute__((target("f16c"))) float hyb_emu_h2f(unsigned short h)
{
	return _cvtsh_ss(h);
}

__attribute__((target("f16c"))) unsigned short hyb_emu_f2h(float f)
{
	return (unsigned short)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
}

/* ---- fibers ----------------------------------------------------------------------------- */

/*
 * hyb_emu_swap(save, next): saves the callee-saved registers, the SSE and
 * x87 control words and the stack pointer into *save, and resumes next.
 * A new fiber's stack is made to look as if it had called hyb_emu_swap
 * from hyb_emu_trampoline, which calls the function in r13.
 */
extern "C" void hyb_emu_swap(void **save, void *next);
extern "C" void hyb_emu_trampoline(void);
__asm__(".text\n"
	".globl hyb_emu_swap\n"
	".type hyb_emu_swap, @function\n"
	"hyb_emu_swap:\n"
	"	pushq %rbp\n"
	"	pushq %rbx\n"
	"	pushq %r12\n"
	"	pushq %r13\n"
	"	pushq %r14\n"
	"	pushq %r15\n"
	"	subq $8, %rsp\n"
	"	stmxcsr (%rsp)\n"
	"	fnstcw 4(%rsp)\n"
	"	movq %rsp, (%rdi)\n"
	"	movq %rsi, %rsp\n"
	"	ldmxcsr (%rsp)\n"
	"	fldcw 4(%rsp)\n"
	"	addq $8, %rsp\n"
	"	popq %r15\n"
	"	popq %r14\n"
	"	popq %r13\n"
	"	popq %r12\n"
	"	popq %rbx\n"
	"	popq %rbp\n"
	"	ret\n"
	".size hyb_emu_swap, .-hyb_emu_swap\n"
	".globl hyb_emu_trampoline\n"
	".type hyb_emu_trampoline, @function\n"
	"hyb_emu_trampoline:\n"
	"	callq *%r13\n"
	"	ud2\n"
	".size hyb_emu_trampoline, .-hyb_emu_trampoline\n");

thread_local struct hyb_emu_thread *hyb_emu_cur_thread;
thread_local struct hyb_emu_block *hyb_emu_cur_block;

namespace {

enum fiber_state { F_RUN, F_BAR, F_WARP, F_DONE };

struct fiber {
	hyb_emu_thread t;
	void *sp;
	fiber_state state;
};

struct warp {
	unsigned int gen, arrived, mask, exited;
	int kind;
	uint64_t vals[2][32];
};

struct block_run {
	hyb_emu_block b;
	const char *kernel;
	const std::function<void()> *body;
	std::vector<fiber> f;
	std::vector<warp> w;
	std::vector<uint32_t> order;
	int live, at_bar;
	void *sched_sp;
	fiber *cur;
};

thread_local block_run *run_now;
thread_local std::vector<char *> stacks;

[[noreturn]] void die(const char *what)
{
	const block_run *r = run_now;

	if (r && r->cur)
		fprintf(stderr,
			"cudaemu: kernel %s, block (%u,%u,%u), thread (%u,%u,%u): %s\n",
			r->kernel, r->b.bid.x, r->b.bid.y, r->b.bid.z, r->cur->t.tid.x,
			r->cur->t.tid.y, r->cur->t.tid.z, what);
	else
		fprintf(stderr, "cudaemu: kernel %s: %s\n", r ? r->kernel : "?", what);
	abort();
}

char *stack_for(size_t i)
{
	while (stacks.size() <= i) {
		char *m = (char *)mmap(NULL, EMU_STACK + 4096, PROT_READ | PROT_WRITE,
				       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (m == MAP_FAILED)
			die("no memory for a thread's stack");
		mprotect(m, 4096, PROT_NONE); /* a guard below: an overflow faults */
		stacks.push_back(m);
	}
	return stacks[i];
}

void yield_to_scheduler()
{
	block_run *r = run_now;

	hyb_emu_swap(&r->cur->sp, r->sched_sp);
}

void release(block_run *r, fiber_state from, int warp_index)
{
	for (fiber &x : r->f)
		if (x.state == from && (warp_index < 0 || (int)x.t.warp == warp_index))
			x.state = F_RUN;
}

extern "C" void hyb_emu_fiber_main(void)
{
	block_run *r = run_now;
	fiber *me = r->cur;

	(*r->body)();
	me->state = F_DONE;
	r->live--;
	warp &w = r->w[me->t.warp];
	w.exited |= 1u << me->t.lane;
	if (w.arrived && (w.mask >> me->t.lane & 1))
		die("exits while its warp waits for it in a warp op");
	if (r->at_bar && r->at_bar == r->live) {
		r->at_bar = 0;
		release(r, F_BAR, -1);
	}
	hyb_emu_swap(&me->sp, r->sched_sp);
	__builtin_unreachable();
}

void start_fiber(block_run *r, fiber *x, size_t i)
{
	char *top = stack_for(i) + 4096 + EMU_STACK;
	uint64_t *sp0 = (uint64_t *)((uintptr_t)top & ~(uintptr_t)15) - 2;
	uint32_t csr[2];

	(void)r;
	__asm__("stmxcsr %0" : "=m"(csr[0]));
	csr[1] = 0x037f;
	sp0[-1] = (uint64_t)(uintptr_t)hyb_emu_trampoline; /* ret */
	sp0[-2] = 0; /* rbp */
	sp0[-3] = 0; /* rbx */
	sp0[-4] = 0; /* r12 */
	sp0[-5] = (uint64_t)(uintptr_t)hyb_emu_fiber_main; /* r13 */
	sp0[-6] = 0; /* r14 */
	sp0[-7] = 0; /* r15 */
	memcpy(&sp0[-8], csr, 8);
	x->sp = &sp0[-8];
	x->state = F_RUN;
}

uint64_t seed_base()
{
	const char *s = getenv("HYB_CUDAEMU_SEED");

	return s && *s ? strtoull(s, NULL, 0) : 1;
}

void run_block(block_run *r, uint32_t n)
{
	std::mt19937_64 rng(seed_base() * 0x9e3779b97f4a7c15ull ^
			    ((uint64_t)r->b.bid.x << 40 ^ (uint64_t)r->b.bid.y << 20 ^ r->b.bid.z));

	for (uint32_t i = 0; i < n; i++) {
		fiber &x = r->f[i];

		x.t.tid = uint3{i % r->b.bdim.x, i / r->b.bdim.x % r->b.bdim.y,
				i / (r->b.bdim.x * r->b.bdim.y)};
		x.t.lane = i % 32;
		x.t.warp = i / 32;
		start_fiber(r, &x, i);
	}
	for (warp &w : r->w)
		w = warp{};
	for (uint32_t i = 0; i < n; i++)
		r->order[i] = i;
	std::shuffle(r->order.begin(), r->order.end(), rng);
	r->live = (int)n;
	r->at_bar = 0;
	while (r->live > 0) {
		bool ran = false;

		for (uint32_t k = 0; k < n; k++) {
			fiber *x = &r->f[r->order[k]];

			while (x->state == F_RUN) {
				r->cur = x;
				hyb_emu_cur_thread = &x->t;
				hyb_emu_swap(&r->sched_sp, x->sp);
				ran = true;
			}
		}
		if (!ran && r->live > 0) {
			int bar = 0, wop = 0;

			for (const fiber &x : r->f)
				bar += x.state == F_BAR, wop += x.state == F_WARP;
			char msg[160];
			snprintf(msg, sizeof msg,
				 "deadlock: %d threads wait at __syncthreads, %d in warp ops, %d exited",
				 bar, wop, (int)n - r->live);
			r->cur = NULL;
			die(msg);
		}
	}
	r->cur = NULL;
}

/*
 * A fault inside a kernel (a guard page of device memory, a thread's stack
 * overflowing) names the kernel, block and thread, on a stack of its own;
 * outside one, the fault is the process's as before.
 */
void on_fault(int sig, siginfo_t *si, void *ctx)
{
	const block_run *r = run_now;
	char msg[256];

	(void)ctx;
	if (!r) {
		signal(sig, SIG_DFL);
		return;
	}
	const int n = snprintf(msg, sizeof msg,
			       "cudaemu: kernel %s, block (%u,%u,%u), thread (%u,%u,%u): memory "
			       "fault at %p (outside device memory and its stack)\n",
			       r->kernel, r->b.bid.x, r->b.bid.y, r->b.bid.z,
			       r->cur ? r->cur->t.tid.x : 0, r->cur ? r->cur->t.tid.y : 0,
			       r->cur ? r->cur->t.tid.z : 0, si->si_addr);
	if (write(2, msg, n > 0 && n < (int)sizeof msg ? (size_t)n : sizeof msg - 1) < 0)
		msg[0] = 0;
	signal(SIGABRT, SIG_DFL);
	abort();
}

void catch_faults()
{
	static std::once_flag once;
	thread_local bool alt;

	std::call_once(once, [] {
		struct sigaction old, sa;

		memset(&sa, 0, sizeof sa);
		sa.sa_sigaction = on_fault;
		sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
		sigemptyset(&sa.sa_mask);
		if (sigaction(SIGSEGV, NULL, &old) == 0 && old.sa_handler == SIG_DFL)
			sigaction(SIGSEGV, &sa, NULL);
		if (sigaction(SIGBUS, NULL, &old) == 0 && old.sa_handler == SIG_DFL)
			sigaction(SIGBUS, &sa, NULL);
	});
	if (!alt) {
		stack_t ss;

		ss.ss_sp = malloc(1 << 16);
		ss.ss_size = 1 << 16;
		ss.ss_flags = 0;
		if (ss.ss_sp)
			sigaltstack(&ss, NULL);
		alt = true;
	}
}

} // namespace

void hyb_emu_syncthreads(void)
{
	block_run *r = run_now;

	if (!r || !r->cur)
		die("__syncthreads outside a kernel");
	if (++r->at_bar == r->live) {
		r->at_bar = 0;
		release(r, F_BAR, -1);
		return;
	}
	r->cur->state = F_BAR;
	yield_to_scheduler();
}

void hyb_emu_warp_op(unsigned int mask, int kind, uint64_t v, uint64_t vals[32])
{
	block_run *r = run_now;

	if (!r || !r->cur)
		die("a warp op outside a kernel");
	fiber *me = r->cur;
	warp &w = r->w[me->t.warp];
	const uint32_t n = (uint32_t)r->f.size(), first = me->t.warp * 32;
	const unsigned int have = n - first >= 32 ? 0xffffffffu : (1u << (n - first)) - 1;

	if (!(mask >> me->t.lane & 1))
		die("calls a warp op with a mask that leaves out its own lane");
	if (mask & ~have)
		die("a warp op's mask names lanes the block does not have");
	if (mask & w.exited)
		die("a warp op waits for a lane that has exited");
	if (w.arrived && (w.mask != mask || w.kind != kind))
		die("divergent warp ops: the lanes of one warp wait in different ones");
	w.mask = mask;
	w.kind = kind;
	const unsigned int g = w.gen;
	w.vals[g & 1][me->t.lane] = v;
	w.arrived |= 1u << me->t.lane;
	if (w.arrived == mask) {
		w.arrived = 0;
		w.gen++;
		release(r, F_WARP, (int)me->t.warp);
	} else {
		me->state = F_WARP;
		yield_to_scheduler();
	}
	memcpy(vals, w.vals[g & 1], sizeof w.vals[0]);
}

namespace {

/* a launch that passed its checks, now or at a graph's launch */
void run_kernel(const void *kernel, const char *name, dim3 grid, dim3 block, size_t smem,
		const std::function<void()> &body)
{
	const uint64_t threads = (uint64_t)block.x * block.y * block.z;
	const uint64_t blocks = (uint64_t)grid.x * grid.y * grid.z;

	if (run_now) {
		fprintf(stderr, "cudaemu: kernel %s launched from inside a kernel\n", name);
		abort();
	}
	catch_faults();
	block_run r;
	r.kernel = name;
	r.body = &body;
	r.f.resize(threads);
	r.w.resize((threads + 31) / 32);
	r.order.resize(threads);
	std::vector<unsigned char> dyn(smem + 16);
	r.b.bdim = uint3{block.x, block.y, block.z};
	r.b.gdim = uint3{grid.x, grid.y, grid.z};
	r.b.dyn_smem = dyn.data();
	r.cur = NULL;

	std::vector<uint64_t> border(blocks);
	for (uint64_t i = 0; i < blocks; i++)
		border[i] = i;
	std::mt19937_64 rng(seed_base() ^ (uint64_t)(uintptr_t)kernel);
	std::shuffle(border.begin(), border.end(), rng);

	run_now = &r;
	hyb_emu_cur_block = &r.b;
	for (uint64_t i : border) {
		r.b.bid = uint3{(unsigned)(i % grid.x), (unsigned)(i / grid.x % grid.y),
				(unsigned)(i / ((uint64_t)grid.x * grid.y))};
		memset(dyn.data(), 0xff, dyn.size()); /* shared memory starts as garbage: NaNs */
		run_block(&r, (uint32_t)threads);
	}
	run_now = NULL;
	hyb_emu_cur_block = NULL;
	hyb_emu_cur_thread = NULL;
}

} // namespace

void hyb_emu_run(const void *kernel, const char *name, dim3 grid, dim3 block, size_t smem,
		 cudaStream_t s, const std::function<void()> &body)
{
	const uint64_t threads = (uint64_t)block.x * block.y * block.z;
	const uint64_t blocks = (uint64_t)grid.x * grid.y * grid.z;

	if (in_host_fn) {
		fail(cudaErrorNotPermitted);
		return;
	}
	if (!stream_ok(s)) {
		fail(cudaErrorInvalidResourceHandle);
		return;
	}
	{
		std::lock_guard<std::mutex> g(cap_lock);
		hyb_emu_capture *c;

		if (enter(s, &c) != cudaSuccess)
			return;
		if (threads == 0 || threads > 1024 || block.x > 1024 || block.y > 1024 ||
		    block.z > 64 || blocks == 0 || grid.x > 0x7fffffffu || grid.y > 65535 ||
		    grid.z > 65535) {
			spoil(c, cudaErrorInvalidConfiguration);
			return;
		}
		if (smem > (size_t)dyn_smem_limit(kernel)) {
			spoil(c, cudaErrorInvalidValue);
			return;
		}
		if (c) { /* the same launch, body and arguments, at each graph launch */
			hyb_emu_node x;

			x.kind = hyb_emu_node::KERNEL;
			x.kernel = kernel;
			x.name = name;
			x.grid = grid;
			x.block = block;
			x.smem = smem;
			x.body = body;
			record(c, s, std::move(x));
			return;
		}
	}
	run_kernel(kernel, name, grid, block, smem, body);
}

/* ---- stream capture, graphs, host functions ------------------------------------------- */

namespace {

/*
 * One node of a launched graph. Its pointers are checked again: a copy
 * into memory freed since the capture, or from host memory unpinned since,
 * is where a GPU would fault (cudaErrorIllegalAddress, and a line).
 */
cudaError_t replay(const hyb_emu_node &n, size_t i)
{
	switch (n.kind) {
	case hyb_emu_node::COPY:
		if (copy_check(n.dst, n.src, n.n, n.copy_kind, true) != cudaSuccess) {
			fprintf(stderr, "cudaemu: graph node %zu: a copy of %zu bytes from %p to %p "
				"outside device and pinned memory\n", i, n.n, n.src, n.dst);
			return fail(cudaErrorIllegalAddress);
		}
		memmove(n.dst, n.src, n.n);
		return cudaSuccess;
	case hyb_emu_node::SET:
		if (!on_device(n.dst, n.n)) {
			fprintf(stderr, "cudaemu: graph node %zu: a memset of %zu bytes at %p outside "
				"device memory\n", i, n.n, n.dst);
			return fail(cudaErrorIllegalAddress);
		}
		memset(n.dst, n.value, n.n);
		return cudaSuccess;
	case hyb_emu_node::KERNEL:
		run_kernel(n.kernel, n.name, n.grid, n.block, n.smem, n.body);
		return cudaSuccess;
	case hyb_emu_node::HOST_FN:
		run_host_fn(n.fn, n.arg);
		return cudaSuccess;
	case hyb_emu_node::RECORD: {
		std::lock_guard<std::mutex> g(cap_lock);
		cudaEvent_t e = n.event;

		if (!live_events.count(e) || !event_ok(e))
			return fail(cudaErrorInvalidResourceHandle);
		e->cap_id = 0;
		e->clock.clear();
		e->recorded = true;
		e->ms = now_ms();
		return cudaSuccess;
	}
	}
	return fail(cudaErrorUnknown);
}

} // namespace

extern "C" {

cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode)
{
	HOST_FN_GUARD();
	if (!s) /* the legacy stream cannot be captured */
		return fail(cudaErrorStreamCaptureUnsupported);
	if (!stream_ok(s))
		return fail(cudaErrorInvalidResourceHandle);
	if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
	    mode != cudaStreamCaptureModeRelaxed)
		return fail(cudaErrorInvalidValue);
	std::lock_guard<std::mutex> g(cap_lock);
	if (s->cap)
		return spoil(s->cap, cudaErrorIllegalState);
	hyb_emu_capture *c = new hyb_emu_capture{++capture_ids, s, mode, &tl_thread, cudaSuccess,
						 {s}, {}};
	captures[c->id] = c;
	s->cap = c;
	s->clock.clear();
	return cudaSuccess;
}

/*
 * On the origin stream (another: cudaErrorStreamCaptureUnmatched), from the
 * thread that began it unless Relaxed (cudaErrorStreamCaptureWrongThread):
 * both leave the capture going, invalid. Otherwise the capture ends, for
 * every stream in it, and *graph is its graph, or NULL when it was
 * invalidated or a joined stream's last work was not joined back into the
 * origin (cudaErrorStreamCaptureUnjoined).
 */
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph)
{
	HOST_FN_GUARD();
	if (!stream_ok(s))
		return fail(cudaErrorInvalidResourceHandle);
	std::lock_guard<std::mutex> g(cap_lock);
	hyb_emu_capture *c = s ? s->cap : NULL;

	if (!graph)
		return spoil(c, cudaErrorInvalidValue);
	if (!c)
		return fail(cudaErrorIllegalState);
	if (s != c->origin)
		return spoil(c, cudaErrorStreamCaptureUnmatched);
	if (c->mode != cudaStreamCaptureModeRelaxed && c->thread != &tl_thread)
		return spoil(c, cudaErrorStreamCaptureWrongThread);
	cudaError_t e = c->invalid != cudaSuccess ? cudaErrorStreamCaptureInvalidated : cudaSuccess;
	for (cudaStream_t m : c->streams)
		if (e == cudaSuccess && clock_of(s->clock, m) < clock_of(m->clock, m))
			e = cudaErrorStreamCaptureUnjoined;
	for (cudaStream_t m : c->streams) {
		m->cap = NULL;
		m->clock.clear();
	}
	captures.erase(c->id);
	*graph = NULL;
	if (e == cudaSuccess)
		*graph = new CUgraph_st{GRAPH_MAGIC, std::move(c->nodes)};
	delete c;
	return e == cudaSuccess ? e : fail(e);
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *status)
{
	HOST_FN_GUARD();
	if (!status)
		return fail(cudaErrorInvalidValue);
	if (!stream_ok(s))
		return fail(cudaErrorInvalidResourceHandle);
	std::lock_guard<std::mutex> g(cap_lock);
	if (!s) { /* the legacy stream spans every blocking stream */
		for (auto &kv : captures)
			if (blocking(kv.second))
				return fail(cudaErrorStreamCaptureImplicit);
		*status = cudaStreamCaptureStatusNone;
		return cudaSuccess;
	}
	*status = !s->cap ? cudaStreamCaptureStatusNone
	    : s->cap->invalid != cudaSuccess ? cudaStreamCaptureStatusInvalidated
					     : cudaStreamCaptureStatusActive;
	return cudaSuccess;
}

/* the executable has its own copy of the nodes: the graph may go */
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph,
				 unsigned long long flags)
{
	HOST_FN_GUARD();
	if (!exec || flags)
		return fail(cudaErrorInvalidValue);
	if (!graph_ok(graph))
		return fail(cudaErrorInvalidResourceHandle);
	*exec = NULL;
	if (injected("cudaGraphInstantiate"))
		return fail(cudaErrorMemoryAllocation);
	*exec = new CUgraphExec_st{EXEC_MAGIC, graph->nodes};
	return cudaSuccess;
}

/*
 * The nodes in the order captured, on the calling thread, done at return
 * as all stream work here. Into a capturing stream it would be a child
 * graph node, which cudaemu does not have: cudaErrorStreamCaptureUnsupported.
 */
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s)
{
	HOST_FN_GUARD();
	if (!stream_ok(s))
		return fail(cudaErrorInvalidResourceHandle);
	{
		std::lock_guard<std::mutex> g(cap_lock);
		hyb_emu_capture *c;
		const cudaError_t e = enter(s, &c);

		if (e != cudaSuccess)
			return e;
		if (!exec_ok(exec))
			return spoil(c, cudaErrorInvalidResourceHandle);
		if (c)
			return spoil(c, cudaErrorStreamCaptureUnsupported);
	}
	for (size_t i = 0; i < exec->nodes.size(); i++) {
		const cudaError_t e = replay(exec->nodes[i], i);

		if (e != cudaSuccess)
			return e;
	}
	return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec)
{
	HOST_FN_GUARD();
	if (!exec_ok(exec))
		return fail(cudaErrorInvalidResourceHandle);
	exec->magic = 0;
	delete exec;
	return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
	HOST_FN_GUARD();
	if (!graph_ok(graph))
		return fail(cudaErrorInvalidResourceHandle);
	graph->magic = 0;
	delete graph;
	return cudaSuccess;
}

/* runs fn(userData) now (the stream's work is done), or at each launch of the capture's graph */
cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *userData)
{
	HOST_FN_GUARD();
	if (!stream_ok(s))
		return fail(cudaErrorInvalidResourceHandle);
	{
		std::lock_guard<std::mutex> g(cap_lock);
		hyb_emu_capture *c;
		const cudaError_t e = enter(s, &c);

		if (e != cudaSuccess)
			return e;
		if (!fn)
			return spoil(c, cudaErrorInvalidValue);
		if (c) {
			hyb_emu_node x;

			x.kind = hyb_emu_node::HOST_FN;
			x.fn = fn;
			x.arg = userData;
			record(c, s, std::move(x));
			return cudaSuccess;
		}
	}
	run_host_fn(fn, userData);
	return cudaSuccess;
}

} // extern "C"
