/* SPDX-License-Identifier: MIT */
/*
 * cudaemu: the part of CUDA that hyb's .cu files use, on the host, so that
 * `make test` runs the CUDA kernels and the CUDA device layer where no GPU
 * exists (docs/CUDAEMU.md). The runtime calls keep their real signatures
 * and error codes; every stream is in order and done when the call
 * returns. A kernel's threads run as fibers, a block at a time:
 * __syncthreads and the warp intrinsics wait for the threads they name, in
 * a seeded order that changes from block to block, so a missing barrier or
 * a divergent warp op shows up as a wrong result or a named abort.
 *
 * The C part (types, runtime calls) serves the C test files; the C++ part
 * (built-ins, intrinsics, launches) the .cu files, compiled as C++ after
 * launch.sed rewrites their <<<...>>> launches and extern __shared__ arrays.
 */
#ifndef HYB_CUDAEMU_H
#define HYB_CUDAEMU_H

#include <stddef.h>
#include <stdint.h>

#define HYB_CUDAEMU 1

#ifdef __cplusplus
extern "C" {
#endif

/* the codes hyb's files and tests name, with the real runtime's values */
typedef enum cudaError {
	cudaSuccess = 0,
	cudaErrorInvalidValue = 1,
	cudaErrorMemoryAllocation = 2,
	cudaErrorInitializationError = 3,
	cudaErrorInvalidConfiguration = 9,
	cudaErrorInvalidDevicePointer = 17,
	cudaErrorInsufficientDriver = 35,
	cudaErrorNoDevice = 100,
	cudaErrorInvalidDevice = 101,
	cudaErrorInvalidResourceHandle = 400,
	cudaErrorIllegalState = 401,
	cudaErrorNotReady = 600,
	cudaErrorIllegalAddress = 700,
	cudaErrorLaunchOutOfResources = 701,
	cudaErrorHostMemoryAlreadyRegistered = 712,
	cudaErrorHostMemoryNotRegistered = 713,
	cudaErrorLaunchFailure = 719,
	cudaErrorNotPermitted = 800,
	cudaErrorNotSupported = 801,
	cudaErrorStreamCaptureUnsupported = 900,
	cudaErrorStreamCaptureInvalidated = 901,
	cudaErrorStreamCaptureMerge = 902,
	cudaErrorStreamCaptureUnmatched = 903,
	cudaErrorStreamCaptureUnjoined = 904,
	cudaErrorStreamCaptureIsolation = 905,
	cudaErrorStreamCaptureImplicit = 906,
	cudaErrorCapturedEvent = 907,
	cudaErrorStreamCaptureWrongThread = 908,
	cudaErrorUnknown = 999,
} cudaError_t;

typedef enum cudaMemcpyKind {
	cudaMemcpyHostToHost = 0,
	cudaMemcpyHostToDevice = 1,
	cudaMemcpyDeviceToHost = 2,
	cudaMemcpyDeviceToDevice = 3,
	cudaMemcpyDefault = 4,
} cudaMemcpyKind;

typedef enum cudaDeviceAttr {
	cudaDevAttrMultiProcessorCount = 16,
	cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
	cudaDevAttrHostRegisterReadOnlySupported = 113,
} cudaDeviceAttr;

typedef enum cudaFuncAttribute {
	cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
} cudaFuncAttribute;

typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
typedef struct CUgraph_st *cudaGraph_t;
typedef struct CUgraphExec_st *cudaGraphExec_t;

#define CUDART_CB
typedef void(CUDART_CB *cudaHostFn_t)(void *userData);

enum cudaStreamCaptureMode {
	cudaStreamCaptureModeGlobal = 0,
	cudaStreamCaptureModeThreadLocal = 1,
	cudaStreamCaptureModeRelaxed = 2,
};
enum cudaStreamCaptureStatus {
	cudaStreamCaptureStatusNone = 0,
	cudaStreamCaptureStatusActive = 1,
	cudaStreamCaptureStatusInvalidated = 2,
};

typedef struct cudaIpcMemHandle_st {
	char reserved[64];
} cudaIpcMemHandle_t;

#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaEventDefault 0x00
#define cudaEventBlockingSync 0x01
#define cudaEventDisableTiming 0x02
#define cudaHostAllocDefault 0x00
#define cudaHostAllocPortable 0x01
#define cudaHostAllocMapped 0x02
#define cudaHostRegisterDefault 0x00
#define cudaHostRegisterPortable 0x01
#define cudaHostRegisterMapped 0x02
#define cudaHostRegisterReadOnly 0x08
#define cudaIpcMemLazyEnablePeerAccess 0x01
#define cudaEventRecordDefault 0x00
#define cudaEventRecordExternal 0x01

/* the real header's default arguments, C++ only */
#ifdef __cplusplus
#define HYB_EMU_DV(v) = v
#else
#define HYB_EMU_DV(v)
#endif

const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetLastError(void);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int dev);
cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr attr, int dev);
cudaError_t cudaDeviceGetPCIBusId(char *id, int len, int dev);
cudaError_t cudaDeviceGetByPCIBusId(int *dev, const char *id);
cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b);

cudaError_t cudaMalloc(void **p, size_t n);
cudaError_t cudaFree(void *p);
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned int flags);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaHostRegister(void *p, size_t n, unsigned int flags);
cudaError_t cudaHostUnregister(void *p);
cudaError_t cudaHostGetDevicePointer(void **d, void *h, unsigned int flags);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind,
			    cudaStream_t s);
cudaError_t cudaMemset(void *p, int v, size_t n);
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s);

cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned int flags, int priority);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b);
cudaError_t cudaEventRecordWithFlags(cudaEvent_t e, cudaStream_t s HYB_EMU_DV(0),
				     unsigned int flags HYB_EMU_DV(0));

/*
 * Stream capture, graphs and host functions (docs/CUDAEMU.md, "Graphs"):
 * captured work is checked as when it runs and recorded; a graph launch runs
 * the recorded work in order on the calling thread, as a stream would.
 */
cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph);
cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *status);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph,
				 unsigned long long flags HYB_EMU_DV(0));
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *userData);

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *h, void *p);
cudaError_t cudaIpcOpenMemHandle(void **p, cudaIpcMemHandle_t h, unsigned int flags);
cudaError_t cudaIpcCloseMemHandle(void *p);

/* the n-th call that takes a resource fails from now on (0: none), as HYB_CUDAEMU_FAIL_AT=n */
void hyb_emu_fail_at(long n);
/* whether that call came */
int hyb_emu_fail_hit(void);
cudaError_t hyb_emu_func_set_attribute(const void *func, cudaFuncAttribute attr, int value);
cudaError_t hyb_emu_occupancy(int *blocks, const void *func, int threads, size_t smem);

#ifndef __cplusplus
/* C has no overloads: cudaEventCreate(e) is the flags-0 call */
#define cudaEventCreate(e) cudaEventCreateWithFlags((e), cudaEventDefault)
#endif

#ifdef __cplusplus
}
#endif

/* ---- vector types ------------------------------------------------------------------- */

typedef struct __attribute__((aligned(8))) float2 { float x, y; } float2;
typedef struct __attribute__((aligned(16))) float4 { float x, y, z, w; } float4;
typedef struct __attribute__((aligned(8))) int2 { int x, y; } int2;
typedef struct __attribute__((aligned(16))) int4 { int x, y, z, w; } int4;
typedef struct __attribute__((aligned(8))) uint2 { unsigned int x, y; } uint2;
typedef struct __attribute__((aligned(16))) uint4 { unsigned int x, y, z, w; } uint4;
typedef struct uint3 { unsigned int x, y, z; } uint3;

#ifdef __cplusplus

#include <math.h>
#include <string.h>

#include <functional>
#include <tuple>
#include <utility>

static inline float2 make_float2(float x, float y) { return {x, y}; }
static inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
static inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
static inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w)
{
	return {x, y, z, w};
}

struct dim3 {
	unsigned int x, y, z;
	constexpr dim3(unsigned int a = 1, unsigned int b = 1, unsigned int c = 1) : x(a), y(b), z(c)
	{
	}
};

static inline cudaError_t cudaEventCreate(cudaEvent_t *e, unsigned int flags = 0)
{
	return cudaEventCreateWithFlags(e, flags);
}
template <class T> static inline cudaError_t cudaMalloc(T **p, size_t n)
{
	return cudaMalloc((void **)p, n);
}
template <class T> static inline cudaError_t cudaHostAlloc(T **p, size_t n, unsigned int flags)
{
	return cudaHostAlloc((void **)p, n, flags);
}
template <class T>
static inline cudaError_t cudaHostGetDevicePointer(T **d, void *h, unsigned int flags)
{
	return cudaHostGetDevicePointer((void **)d, h, flags);
}
template <class T> static inline cudaError_t cudaIpcOpenMemHandle(T **p, cudaIpcMemHandle_t h,
								  unsigned int flags)
{
	return cudaIpcOpenMemHandle((void **)p, h, flags);
}
template <class T>
static inline cudaError_t cudaFuncSetAttribute(T *func, cudaFuncAttribute attr, int value)
{
	return hyb_emu_func_set_attribute((const void *)func, attr, value);
}
template <class T>
static inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, T func,
									 int threads, size_t smem)
{
	return hyb_emu_occupancy(n, (const void *)func, threads, smem);
}

/* ---- qualifiers ------------------------------------------------------------------------ */

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
/* block-shared: one copy per host thread, and a host thread runs one block at a time */
#define __shared__ static thread_local
#define __constant__ static

/* ---- the running thread and block ------------------------------------------------------ */

struct hyb_emu_thread {
	uint3 tid;
	unsigned int lane, warp;
};
struct hyb_emu_block {
	uint3 bid;
	uint3 bdim;
	uint3 gdim;
	unsigned char *dyn_smem;
};
extern thread_local struct hyb_emu_thread *hyb_emu_cur_thread;
extern thread_local struct hyb_emu_block *hyb_emu_cur_block;

#define threadIdx (hyb_emu_cur_thread->tid)
#define blockIdx (hyb_emu_cur_block->bid)
#define blockDim (hyb_emu_cur_block->bdim)
#define gridDim (hyb_emu_cur_block->gdim)
#define warpSize 32

static inline void *hyb_emu_dyn_smem(void)
{
	return hyb_emu_cur_block->dyn_smem;
}

/* ---- barriers and warp ops (cudaemu.cc) ------------------------------------------------- */

void hyb_emu_syncthreads(void);
/* Every lane of mask posts v and waits for the others; vals gets all 32 posts. */
void hyb_emu_warp_op(unsigned int mask, int kind, uint64_t v, uint64_t vals[32]);

enum { HYB_EMU_SHFL = 1, HYB_EMU_BALLOT, HYB_EMU_SYNCWARP };

static inline void __syncthreads(void)
{
	hyb_emu_syncthreads();
}
static inline void __syncwarp(unsigned int mask = 0xffffffffu)
{
	uint64_t vals[32];

	hyb_emu_warp_op(mask, HYB_EMU_SYNCWARP, 0, vals);
}
static inline void __threadfence(void)
{
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
}
static inline void __threadfence_system(void)
{
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
}

template <class T> static inline T hyb_emu_shfl(unsigned int mask, T v, int src)
{
	static_assert(sizeof(T) <= 8, "shuffles move 4 or 8 bytes");
	uint64_t u = 0, vals[32];
	T r;

	memcpy(&u, &v, sizeof(T));
	hyb_emu_warp_op(mask, HYB_EMU_SHFL, u, vals);
	memcpy(&r, &vals[src], sizeof(T));
	return r;
}
/* width splits the warp in segments; a source outside the segment reads the caller's own */
template <class T> static inline T __shfl_sync(unsigned int mask, T v, int src, int width = 32)
{
	const int lane = (int)hyb_emu_cur_thread->lane, base = lane & ~(width - 1);

	return hyb_emu_shfl(mask, v, base + (src & (width - 1)));
}
template <class T>
static inline T __shfl_xor_sync(unsigned int mask, T v, int lane_mask, int width = 32)
{
	const int lane = (int)hyb_emu_cur_thread->lane, base = lane & ~(width - 1);
	const int src = lane ^ lane_mask;

	return hyb_emu_shfl(mask, v, src >= base + width ? lane : src);
}
template <class T> static inline T __shfl_up_sync(unsigned int mask, T v, unsigned d, int width = 32)
{
	const int lane = (int)hyb_emu_cur_thread->lane, base = lane & ~(width - 1);
	const int src = lane - (int)d;

	return hyb_emu_shfl(mask, v, src < base ? lane : src);
}
template <class T>
static inline T __shfl_down_sync(unsigned int mask, T v, unsigned d, int width = 32)
{
	const int lane = (int)hyb_emu_cur_thread->lane, base = lane & ~(width - 1);
	const int src = lane + (int)d;

	return hyb_emu_shfl(mask, v, src >= base + width ? lane : src);
}
static inline unsigned int __ballot_sync(unsigned int mask, int pred)
{
	uint64_t vals[32];
	unsigned int r = 0;

	hyb_emu_warp_op(mask, HYB_EMU_BALLOT, pred != 0, vals);
	for (int i = 0; i < 32; i++)
		if ((mask >> i & 1) && vals[i])
			r |= 1u << i;
	return r;
}

/* ---- atomics: a host thread runs one block at a time, blocks one after another -------- */

template <class T> static inline T atomicAdd(T *p, T v)
{
	return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
static inline float atomicAdd(float *p, float v)
{
	const float old = *p;

	*p = old + v;
	return old;
}
template <class T> static inline T atomicMax(T *p, T v)
{
	const T old = *p;

	*p = old > v ? old : v;
	return old;
}

/* CUDA's min and max for integers: an unsigned operand makes both unsigned */
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned int min(unsigned int a, unsigned int b) { return a < b ? a : b; }
static inline unsigned int max(unsigned int a, unsigned int b) { return a > b ? a : b; }
static inline unsigned int min(int a, unsigned int b) { return min((unsigned int)a, b); }
static inline unsigned int min(unsigned int a, int b) { return min(a, (unsigned int)b); }
static inline unsigned int max(int a, unsigned int b) { return max((unsigned int)a, b); }
static inline unsigned int max(unsigned int a, int b) { return max(a, (unsigned int)b); }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
static inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }

/* ---- loads, bits and integer SIMD ------------------------------------------------------ */

template <class T> static inline T __ldg(const T *p)
{
	return *p;
}
template <class T> static inline T __ldcg(const T *p)
{
	return *p;
}
static inline int __popc(unsigned int v)
{
	return __builtin_popcount(v);
}
static inline int __popcll(unsigned long long v)
{
	return __builtin_popcountll(v);
}
static inline int __ffs(int v)
{
	return __builtin_ffs(v);
}
static inline int __clz(int v)
{
	return v ? __builtin_clz((unsigned int)v) : 32;
}
/* four signed (or unsigned) byte products added to c */
static inline int __dp4a(int a, int b, int c)
{
	for (int i = 0; i < 4; i++)
		c += (int)(int8_t)(a >> 8 * i) * (int)(int8_t)(b >> 8 * i);
	return c;
}
static inline unsigned int __dp4a(unsigned int a, unsigned int b, unsigned int c)
{
	for (int i = 0; i < 4; i++)
		c += (a >> 8 * i & 0xff) * (b >> 8 * i & 0xff);
	return c;
}
/* per-byte a - b, modulo 256 */
static inline unsigned int __vsub4(unsigned int a, unsigned int b)
{
	unsigned int r = 0;

	for (int i = 0; i < 4; i++)
		r |= (((a >> 8 * i) - (b >> 8 * i)) & 0xffu) << 8 * i;
	return r;
}
static inline int __vsub4(int a, int b)
{
	return (int)__vsub4((unsigned int)a, (unsigned int)b);
}

/* ---- float intrinsics: round to nearest, never fused with a neighbour ------------------ */

#define HYB_EMU_NOFUSE(r) __asm__("" : "+x"(r))
static inline float __fmul_rn(float a, float b)
{
	float r = a * b;

	HYB_EMU_NOFUSE(r);
	return r;
}
static inline float __fadd_rn(float a, float b)
{
	float r = a + b;

	HYB_EMU_NOFUSE(r);
	return r;
}
static inline float __fsub_rn(float a, float b)
{
	float r = a - b;

	HYB_EMU_NOFUSE(r);
	return r;
}
static inline float __fdiv_rn(float a, float b)
{
	float r = a / b;

	HYB_EMU_NOFUSE(r);
	return r;
}
static inline float __fmaf_rn(float a, float b, float c)
{
	return fmaf(a, b, c);
}
static inline int __float2int_rn(float f)
{
	return (int)lrintf(f);
}
static inline float __int_as_float(int v)
{
	float f;

	memcpy(&f, &v, 4);
	return f;
}
static inline int __float_as_int(float f)
{
	int v;

	memcpy(&v, &f, 4);
	return v;
}
static inline float __uint_as_float(unsigned int v)
{
	float f;

	memcpy(&f, &v, 4);
	return f;
}
static inline unsigned int __float_as_uint(float f)
{
	unsigned int v;

	memcpy(&v, &f, 4);
	return v;
}
static inline float rsqrtf(float x)
{
	return 1.0f / sqrtf(x);
}
static inline float __saturatef(float x)
{
	return x < 0 ? 0 : x > 1 ? 1 : x;
}

/* ---- half: IEEE binary16, converted as the GPU does (round to nearest even) ------------ */

struct __half {
	unsigned short x;
};
float hyb_emu_h2f(unsigned short h);
unsigned short hyb_emu_f2h(float f);
static inline float __half2float(__half h)
{
	return hyb_emu_h2f(h.x);
}
static inline __half __float2half_rn(float f)
{
	return __half{hyb_emu_f2h(f)};
}
static inline __half __float2half(float f)
{
	return __float2half_rn(f);
}
static inline __half __ushort_as_half(unsigned short u)
{
	return __half{u};
}
static inline unsigned short __half_as_ushort(__half h)
{
	return h.x;
}
typedef __half half;

/* ---- launches: launch.sed turns k<<<g, b, smem, s>>>(args) into hyb_emu_launch(k, "k", g, b, smem, s)(args) */

void hyb_emu_run(const void *kernel, const char *name, dim3 grid, dim3 block, size_t smem,
		 cudaStream_t s, const std::function<void()> &body);

template <class... P> struct hyb_emu_launcher {
	void (*kernel)(P...);
	const char *name;
	dim3 grid, block;
	size_t smem;
	cudaStream_t stream;

	/* the arguments are converted to the kernel's parameter types once, as the
	 * real launch copies them; every thread gets its own copy of that */
	template <class... A> void operator()(A &&...a) const
	{
		std::tuple<std::decay_t<P>...> args(std::forward<A>(a)...);
		void (*k)(P...) = kernel;

		/* the body owns its arguments: a stream capture keeps it for each graph launch */
		hyb_emu_run((const void *)kernel, name, grid, block, smem, stream,
			    [args = std::move(args), k] { std::apply(k, args); });
	}
};
template <class... P>
static inline hyb_emu_launcher<P...> hyb_emu_launch(void (*kernel)(P...), const char *name,
						     dim3 grid, dim3 block, size_t smem = 0,
						     cudaStream_t s = 0)
{
	return hyb_emu_launcher<P...>{kernel, name, grid, block, smem, s};
}

#endif /* __cplusplus */

#endif
