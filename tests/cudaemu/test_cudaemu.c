// SPDX-License-Identifier: MIT
/*
 * cudaemu itself (docs/CUDAEMU.md): that a kernel sees CUDA's semantics -
 * barriers, warp ops, launch limits, device memory, IPC - and that code
 * which breaks them fails here as it would on a GPU, or worse.
 */
#include <cuda_runtime.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <signal.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon/copydev_cuda.h"
#include "daemon/reload.h"
#include "selftest.h"
#include "test.h"

static void *dev_alloc(size_t n)
{
	void *p = NULL;

	CHECK_EQ_INT(cudaMalloc(&p, n), cudaSuccess);
	return p;
}

/* each seed orders the threads otherwise: the barrier's result never moves, its absence's does */
TEST(cudaemu_barrier_orders_shared_memory)
{
	enum { N = 256, B = 3 };
	int in[N * B], out[N * B];
	int *din = dev_alloc(sizeof(in)), *dout = dev_alloc(sizeof(out));
	int wrong_without = 0;

	for (int i = 0; i < N * B; i++)
		in[i] = i * 7 + 1;
	CHECK_EQ_INT(cudaMemcpy(din, in, sizeof(in), cudaMemcpyHostToDevice), cudaSuccess);
	for (int seed = 1; seed <= 4; seed++) {
		char s[16];

		snprintf(s, sizeof(s), "%d", seed);
		setenv("HYB_CUDAEMU_SEED", s, 1);
		for (int barrier = 1; barrier >= 0; barrier--) {
			int bad = 0;

			CHECK_EQ_INT(emu_reverse(din, dout, N, B, barrier), cudaSuccess);
			CHECK_EQ_INT(cudaMemcpy(out, dout, sizeof(out), cudaMemcpyDeviceToHost),
				     cudaSuccess);
			for (int b = 0; b < B; b++)
				for (int t = 0; t < N; t++)
					bad += out[b * N + t] != in[b * N + N - 1 - t];
			if (barrier)
				CHECK_MSG(bad == 0, "seed %d: %d wrong with the barrier", seed, bad);
			else
				wrong_without += bad;
		}
	}
	printf("    without the barrier: %d of %d values wrong over 4 seeds\n", wrong_without,
	       4 * N * B);
	CHECK(wrong_without > 0);
	unsetenv("HYB_CUDAEMU_SEED");
	cudaFree(din);
	cudaFree(dout);
}

TEST(cudaemu_warp_ops_move_the_lanes_values)
{
	int out[64 * 6], *d = dev_alloc(sizeof(out));

	CHECK_EQ_INT(emu_warp_ops(d), cudaSuccess);
	CHECK_EQ_INT(cudaMemcpy(out, d, sizeof(out), cudaMemcpyDeviceToHost), cudaSuccess);
	for (int t = 0; t < 64; t++) {
		const int lane = t % 32, *o = out + t * 6;
		unsigned ballot = 0;

		for (int l = 0; l < 32; l++)
			if ((l + t / 32) & 1)
				ballot |= 1u << l;
		CHECK_EQ_INT(o[0], lane ^ 5);
		CHECK_EQ_INT(o[1], lane >= 3 ? lane - 3 : lane);
		CHECK_EQ_INT(o[2], lane % 16 + 3 < 16 ? lane + 3 : lane); /* width 16 */
		CHECK_EQ_INT(o[3], (lane / 8 * 8 + 7) * 10);               /* width 8 */
		CHECK_EQ_INT((unsigned)o[4], ballot);
		CHECK_EQ_INT(o[5], 31 * 32 / 2);
	}
	cudaFree(d);
}

/* what a GPU hangs on or leaves undefined ends the process with a message naming the kernel */
static void expect_abort(int (*fn)(void *), void *arg, const char *what)
{
	const pid_t pid = fork();
	int st = 0;

	CHECK(pid >= 0);
	if (pid == 0) {
		fn(arg);
		cudaDeviceSynchronize();
		_exit(0);
	}
	CHECK(waitpid(pid, &st, 0) == pid);
	CHECK_MSG(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "%s: status %#x", what, st);
}

static int divergent(void *p)
{
	return emu_divergent_shuffle(p);
}

static int deadlock(void *p)
{
	(void)p;
	return emu_deadlock();
}

static int past_end(void *p)
{
	return emu_write_past_end(p, 1000);
}

TEST(cudaemu_divergent_warp_op_deadlock_and_stray_write_abort)
{
	int *d = dev_alloc(1000 * sizeof(int));

	expect_abort(divergent, d, "a shuffle waiting for lanes that left");
	expect_abort(deadlock, NULL, "a barrier and a warp op waiting for each other");
	expect_abort(past_end, d, "a write past the end of an allocation");
	cudaFree(d);
}

TEST(cudaemu_launch_limits_are_the_gpus)
{
	int out[32], *d = dev_alloc(sizeof(out));

	CHECK_EQ_INT(emu_launch_shape(1, 1, 1024, 1, 1), cudaSuccess);
	CHECK_EQ_INT(emu_launch_shape(1, 1, 1025, 1, 1), cudaErrorInvalidConfiguration);
	CHECK_EQ_INT(emu_launch_shape(1, 1, 32, 32, 2), cudaErrorInvalidConfiguration);
	CHECK_EQ_INT(emu_launch_shape(1, 1, 1, 1, 65), cudaErrorInvalidConfiguration);
	CHECK_EQ_INT(emu_launch_shape(1, 65536, 1, 1, 1), cudaErrorInvalidConfiguration);
	CHECK_EQ_INT(emu_launch_shape(0, 1, 32, 1, 1), cudaErrorInvalidConfiguration);
	CHECK_EQ_INT(cudaGetLastError(), cudaSuccess); /* read, then cleared */
	/* 48 KiB of dynamic shared memory unless the kernel's attribute allows more */
	CHECK_EQ_INT(emu_dyn_smem(d, 48 << 10, 0), cudaSuccess);
	CHECK_EQ_INT(emu_dyn_smem(d, 64 << 10, 0), cudaErrorInvalidValue);
	CHECK_EQ_INT(emu_dyn_smem(d, 300 << 10, 1), cudaErrorInvalidValue);
	CHECK_EQ_INT(emu_dyn_smem(d, 64 << 10, 1), cudaSuccess);
	CHECK_EQ_INT(cudaMemcpy(out, d, sizeof(out), cudaMemcpyDeviceToHost), cudaSuccess);
	for (int t = 0; t < 32; t++)
		CHECK_EQ_INT(out[t], 31 - t);
	cudaFree(d);
}

TEST(cudaemu_copies_stay_inside_device_memory)
{
	size_t free0, free1, total;
	char host[8192] = { 1 }, *d;
	void *pinned = NULL;

	CHECK_EQ_INT(cudaMemGetInfo(&free0, &total), cudaSuccess);
	d = dev_alloc(4096);
	CHECK_EQ_INT(cudaMemGetInfo(&free1, &total), cudaSuccess);
	CHECK(free1 + 4096 == free0);
	CHECK_EQ_INT(cudaMemcpy(d, host, 4096, cudaMemcpyHostToDevice), cudaSuccess);
	CHECK_EQ_INT(cudaMemcpy(d + 1, host, 4096, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
	CHECK_EQ_INT(cudaMemcpy(host, host + 4096, 16, cudaMemcpyHostToDevice),
		     cudaErrorInvalidValue);
	CHECK_EQ_INT(cudaMemcpy(host, d, 4097, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
	CHECK_EQ_INT(cudaMemset(host, 0, 16), cudaErrorInvalidValue);
	CHECK_EQ_INT(cudaFree(host), cudaErrorInvalidValue);
	/* registered host memory is the device's to reach, once */
	CHECK_EQ_INT(cudaHostRegister(host, 4096, cudaHostRegisterPortable), cudaSuccess);
	CHECK_EQ_INT(cudaHostRegister(host + 100, 16, 0), cudaErrorHostMemoryAlreadyRegistered);
	CHECK_EQ_INT(cudaMemcpy(d, host, 4096, cudaMemcpyDeviceToDevice), cudaSuccess);
	CHECK_EQ_INT(cudaHostUnregister(host), cudaSuccess);
	CHECK_EQ_INT(cudaHostUnregister(host), cudaErrorHostMemoryNotRegistered);
	CHECK_EQ_INT(cudaHostAlloc(&pinned, 100, cudaHostAllocMapped), cudaSuccess);
	CHECK_EQ_INT(cudaMemset(pinned, 3, 100), cudaSuccess);
	CHECK_EQ_INT(cudaFreeHost(pinned), cudaSuccess);
	CHECK_EQ_INT(cudaFree(d), cudaSuccess);
	CHECK_EQ_INT(cudaMemGetInfo(&free1, &total), cudaSuccess);
	CHECK(free1 == free0);
	cudaGetLastError();
}

/* another process maps the allocation by its handle and writes what this one reads */
TEST(cudaemu_ipc_handle_maps_in_another_process)
{
	cudaIpcMemHandle_t h;
	unsigned char back[4096];
	unsigned char *d = dev_alloc(1 << 20);
	void *self = NULL;
	int st = 0;

	CHECK_EQ_INT(cudaMemset(d, 0, 1 << 20), cudaSuccess);
	CHECK_EQ_INT(cudaIpcGetMemHandle(&h, d), cudaSuccess);
	CHECK_EQ_INT(cudaIpcGetMemHandle(&h, d + 64), cudaErrorInvalidValue);
	CHECK_EQ_INT(cudaIpcGetMemHandle(&h, d), cudaSuccess);
	CHECK_EQ_INT(cudaIpcOpenMemHandle(&self, h, cudaIpcMemLazyEnablePeerAccess),
		     cudaErrorInvalidValue); /* not in the process that made it */
	const pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		void *p = NULL;

		if (cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess) != cudaSuccess ||
		    cudaMemset((char *)p + 4096, 0x5a, 4096) != cudaSuccess ||
		    cudaIpcCloseMemHandle(p) != cudaSuccess)
			_exit(1);
		_exit(0);
	}
	CHECK(waitpid(pid, &st, 0) == pid);
	CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child: status %#x", st);
	CHECK_EQ_INT(cudaMemcpy(back, d + 4096, 4096, cudaMemcpyDeviceToHost), cudaSuccess);
	for (int i = 0; i < 4096; i++)
		CHECK_EQ_INT(back[i], 0x5a);
	cudaFree(d);
}

/*
 * Stream capture and graphs (docs/CUDAEMU.md "Graphs"): captured work is
 * checked and recorded, not run; a graph launch runs it in order. The
 * rules a GPU enforces - what may not be called during a capture, joins,
 * pinned memory, host functions that call CUDA - fail here with its codes.
 */
static cudaStream_t new_stream(unsigned flags)
{
	cudaStream_t s = NULL;

	CHECK_EQ_INT(cudaStreamCreateWithPriority(&s, flags, 0), cudaSuccess);
	return s;
}

static void *pinned_alloc(size_t n)
{
	void *p = NULL;

	CHECK_EQ_INT(cudaHostAlloc(&p, n, cudaHostAllocPortable), cudaSuccess);
	return p;
}

static enum cudaStreamCaptureStatus capture_status(cudaStream_t s)
{
	enum cudaStreamCaptureStatus st = (enum cudaStreamCaptureStatus)-1;

	CHECK_EQ_INT(cudaStreamIsCapturing(s, &st), cudaSuccess);
	return st;
}

/* a host function's view of a graph's output */
struct seen {
	int calls, n;
	const int *out;
	long long sum;
};

static void CUDART_CB see_output(void *p)
{
	struct seen *f = p;

	f->calls++;
	f->sum = 0;
	for (int i = 0; i < f->n; i++)
		f->sum += f->out[i];
}

TEST(cudaemu_graph_replays_captured_work)
{
	enum { N = 1000 };
	int *in = pinned_alloc(N * sizeof(int)), *out = pinned_alloc(N * sizeof(int));
	int *dx = dev_alloc(N * sizeof(int)), *dy = dev_alloc(N * sizeof(int)), back = 0;
	cudaStream_t s = new_stream(cudaStreamNonBlocking);
	cudaGraph_t g = NULL;
	cudaGraphExec_t x = NULL;
	struct seen f = { .n = N, .out = out };

	for (int i = 0; i < N; i++)
		in[i] = i, out[i] = -1;
	CHECK_EQ_INT(cudaMemset(dy, 0x7f, N * sizeof(int)), cudaSuccess);
	CHECK_EQ_INT(capture_status(s), cudaStreamCaptureStatusNone);
	CHECK_EQ_INT(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
	CHECK_EQ_INT(capture_status(s), cudaStreamCaptureStatusActive);
	CHECK_EQ_INT(cudaMemcpyAsync(dx, in, N * sizeof(int), cudaMemcpyHostToDevice, s),
		     cudaSuccess);
	CHECK_EQ_INT(emu_axpb(dx, dy, N, 3, 7, s), cudaSuccess);
	CHECK_EQ_INT(cudaMemcpyAsync(out, dy, N * sizeof(int), cudaMemcpyDeviceToHost, s),
		     cudaSuccess);
	CHECK_EQ_INT(cudaLaunchHostFunc(s, see_output, &f), cudaSuccess);
	/* recorded, not run */
	CHECK_EQ_INT(f.calls, 0);
	CHECK_EQ_INT(out[0], -1);
	CHECK_EQ_INT(out[N - 1], -1);
	CHECK_EQ_INT(cudaStreamEndCapture(s, &g), cudaSuccess);
	CHECK(g != NULL);
	CHECK_EQ_INT(capture_status(s), cudaStreamCaptureStatusNone);
	CHECK_EQ_INT(cudaMemcpy(&back, dy + N - 1, sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
	CHECK_EQ_INT(back, 0x7f7f7f7f);
	CHECK_EQ_INT(cudaGraphInstantiate(&x, g, 0), cudaSuccess);
	CHECK_EQ_INT(cudaGraphDestroy(g), cudaSuccess); /* the executable is its own */
	for (int r = 1; r <= 3; r++) {
		long long want = 0;

		for (int i = 0; i < N; i++)
			in[i] = i * r - 500;
		CHECK_EQ_INT(cudaGraphLaunch(x, s), cudaSuccess);
		for (int i = 0; i < N; i++) {
			CHECK_MSG(out[i] == 3 * (i * r - 500) + 7, "launch %d: out[%d] = %d", r, i,
				  out[i]);
			want += out[i];
		}
		CHECK_EQ_INT(f.calls, r);
		CHECK_EQ_INT(f.sum, want); /* it ran after the copy back */
	}
	CHECK_EQ_INT(cudaGraphExecDestroy(x), cudaSuccess);
	CHECK_EQ_INT(cudaStreamDestroy(s), cudaSuccess);
	cudaFreeHost(in);
	cudaFreeHost(out);
	cudaFree(dx);
	cudaFree(dy);
}

TEST(cudaemu_capture_forks_and_joins_streams)
{
	enum { N = 300 };
	int *in = pinned_alloc(N * sizeof(int)), *out = pinned_alloc(2 * N * sizeof(int));
	int *dx = dev_alloc(N * sizeof(int)), *dy = dev_alloc(N * sizeof(int));
	int *dz = dev_alloc(N * sizeof(int));
	cudaStream_t s1 = new_stream(cudaStreamNonBlocking), s2 = new_stream(cudaStreamNonBlocking);
	cudaEvent_t e1, e2;
	cudaGraph_t g = NULL;
	cudaGraphExec_t x = NULL;

	CHECK_EQ_INT(cudaEventCreateWithFlags(&e1, cudaEventDisableTiming), cudaSuccess);
	CHECK_EQ_INT(cudaEventCreateWithFlags(&e2, cudaEventDisableTiming), cudaSuccess);
	/* s1 copies in, s2 forks from it and joins back, s1 copies both results out */
	CHECK_EQ_INT(cudaStreamBeginCapture(s1, cudaStreamCaptureModeThreadLocal), cudaSuccess);
	CHECK_EQ_INT(cudaMemcpyAsync(dx, in, N * sizeof(int), cudaMemcpyHostToDevice, s1),
		     cudaSuccess);
	CHECK_EQ_INT(cudaEventRecord(e1, s1), cudaSuccess);
	CHECK_EQ_INT(capture_status(s2), cudaStreamCaptureStatusNone);
	CHECK_EQ_INT(cudaStreamWaitEvent(s2, e1, 0), cudaSuccess);
	CHECK_EQ_INT(capture_status(s2), cudaStreamCaptureStatusActive);
	CHECK_EQ_INT(emu_axpb(dx, dy, N, 2, 1, s2), cudaSuccess);
	CHECK_EQ_INT(emu_axpb(dx, dz, N, -1, 0, s1), cudaSuccess);
	CHECK_EQ_INT(cudaEventRecord(e2, s2), cudaSuccess);
	CHECK_EQ_INT(cudaStreamWaitEvent(s1, e2, 0), cudaSuccess);
	CHECK_EQ_INT(cudaMemcpyAsync(out, dy, N * sizeof(int), cudaMemcpyDeviceToHost, s1),
		     cudaSuccess);
	CHECK_EQ_INT(cudaMemcpyAsync(out + N, dz, N * sizeof(int), cudaMemcpyDeviceToHost, s1),
		     cudaSuccess);
	CHECK_EQ_INT(cudaStreamEndCapture(s1, &g), cudaSuccess);
	CHECK(g != NULL);
	CHECK_EQ_INT(capture_status(s1), cudaStreamCaptureStatusNone);
	CHECK_EQ_INT(capture_status(s2), cudaStreamCaptureStatusNone);
	/* an event last recorded in a capture marks no work that ran, until recorded again */
	CHECK_EQ_INT(cudaEventQuery(e1), cudaErrorInvalidValue);
	CHECK_EQ_INT(cudaStreamWaitEvent(s2, e1, 0), cudaErrorInvalidValue);
	CHECK_EQ_INT(cudaEventRecord(e1, s2), cudaSuccess);
	CHECK_EQ_INT(cudaEventQuery(e1), cudaSuccess);
	CHECK_EQ_INT(cudaGetLastError(), cudaErrorInvalidValue);
	CHECK_EQ_INT(cudaGraphInstantiate(&x, g, 0), cudaSuccess);
	for (int r = 1; r <= 2; r++) {
		for (int i = 0; i < N; i++)
			in[i] = i + 1000 * r;
		CHECK_EQ_INT(cudaGraphLaunch(x, s1), cudaSuccess);
		for (int i = 0; i < N; i++) {
			CHECK_EQ_INT(out[i], 2 * (i + 1000 * r) + 1);
			CHECK_EQ_INT(out[N + i], -(i + 1000 * r));
		}
	}
	CHECK_EQ_INT(cudaGraphExecDestroy(x), cudaSuccess);
	CHECK_EQ_INT(cudaGraphDestroy(g), cudaSuccess);

	/* a fork whose last work never joins back: no graph, and neither stream captures */
	g = (cudaGraph_t)&g;
	CHECK_EQ_INT(cudaStreamBeginCapture(s1, cudaStreamCaptureModeThreadLocal), cudaSuccess);
	CHECK_EQ_INT(cudaEventRecord(e1, s1), cudaSuccess);
	CHECK_EQ_INT(cudaStreamWaitEvent(s2, e1, 0), cudaSuccess);
	CHECK_EQ_INT(emu_axpb(dx, dy, N, 1, 0, s2), cudaSuccess);
	CHECK_EQ_INT(cudaEventRecord(e2, s2), cudaSuccess);
	CHECK_EQ_INT(cudaStreamWaitEvent(s1, e2, 0), cudaSuccess);
	CHECK_EQ_INT(emu_axpb(dx, dz, N, 1, 0, s2), cudaSuccess); /* after the join */
	CHECK_EQ_INT(cudaStreamEndCapture(s1, &g), cudaErrorStreamCaptureUnjoined);
	CHECK(g == NULL);
	CHECK_EQ_INT(capture_status(s1), cudaStreamCaptureStatusNone);
	CHECK_EQ_INT(capture_status(s2), cudaStreamCaptureStatusNone);

	/* a stream that joined and queued nothing leaves nothing to join */
	CHECK_EQ_INT(cudaStreamBeginCapture(s1, cudaStreamCaptureModeThreadLocal), cudaSuccess);
	CHECK_EQ_INT(cudaEventRecord(e1, s1), cudaSuccess);
	CHECK_EQ_INT(cudaStreamWaitEvent(s2, e1, 0), cudaSuccess);
	CHECK_EQ_INT(cudaMemsetAsync(dx, 0, N * sizeof(int), s1), cudaSuccess);
	CHECK_EQ_INT(cudaStreamEndCapture(s1, &g), cudaSuccess);
	CHECK_EQ_INT(cudaGraphDestroy(g), cudaSuccess);

	/* the end belongs to the origin stream; a joined one's leaves the capture invalid */
	CHECK_EQ_INT(cudaStreamBeginCapture(s1, cudaStreamCaptureModeThreadLocal), cudaSuccess);
	CHECK_EQ_INT(cudaStreamBeginCapture(s1, cudaStreamCaptureModeThreadLocal),
		     cudaErrorIllegalState);
	CHECK_EQ_INT(cudaStreamEndCapture(s1, &g), cudaErrorStreamCaptureInvalidated);
	CHECK(g == NULL);
	CHECK_EQ_INT(cudaStreamBeginCapture(s1, cudaStreamCaptureModeThreadLocal), cudaSuccess);
	CHECK_EQ_INT(cudaEventRecord(e1, s1), cudaSuccess);
	CHECK_EQ_INT(cudaStreamWaitEvent(s2, e1, 0), cudaSuccess);
	CHECK_EQ_INT(cudaStreamEndCapture(s2, &g), cudaErrorStreamCaptureUnmatched);
	CHECK_EQ_INT(capture_status(s1), cudaStreamCaptureStatusInvalidated);
	CHECK_EQ_INT(capture_status(s2), cudaStreamCaptureStatusInvalidated);
	g = (cudaGraph_t)&g;
	CHECK_EQ_INT(cudaStreamEndCapture(s1, &g), cudaErrorStreamCaptureInvalidated);
	CHECK(g == NULL);
	CHECK_EQ_INT(cudaStreamEndCapture(s1, &g), cudaErrorIllegalState);
	CHECK_EQ_INT(cudaStreamBeginCapture(NULL, cudaStreamCaptureModeThreadLocal),
		     cudaErrorStreamCaptureUnsupported);

	/* two captures may not merge: a stream of one waiting for an event of the other */
	CHECK_EQ_INT(cudaStreamBeginCapture(s1, cudaStreamCaptureModeThreadLocal), cudaSuccess);
	CHECK_EQ_INT(cudaStreamBeginCapture(s2, cudaStreamCaptureModeThreadLocal), cudaSuccess);
	CHECK_EQ_INT(cudaEventRecord(e1, s1), cudaSuccess);
	CHECK_EQ_INT(cudaStreamWaitEvent(s2, e1, 0), cudaErrorStreamCaptureMerge);
	CHECK_EQ_INT(cudaStreamEndCapture(s2, &g), cudaErrorStreamCaptureInvalidated);
	CHECK_EQ_INT(cudaStreamEndCapture(s1, &g), cudaErrorStreamCaptureInvalidated);
	cudaGetLastError();

	cudaEventDestroy(e1);
	cudaEventDestroy(e2);
	cudaStreamDestroy(s1);
	cudaStreamDestroy(s2);
	cudaFreeHost(in);
	cudaFreeHost(out);
	cudaFree(dx);
	cudaFree(dy);
	cudaFree(dz);
}

/* what the refused calls below act on */
struct cap_ctx {
	cudaStream_t s;
	int *d, *d2;
	int *pinned;
	char *pageable, *registered;
	cudaEvent_t plain, captured;
};

static cudaError_t r_malloc(struct cap_ctx *c)
{
	void *p = NULL;

	(void)c;
	return cudaMalloc(&p, 64);
}
static cudaError_t r_free(struct cap_ctx *c) { return cudaFree(c->d2); }
static cudaError_t r_host_alloc(struct cap_ctx *c)
{
	void *p = NULL;

	(void)c;
	return cudaHostAlloc(&p, 64, 0);
}
static cudaError_t r_free_host(struct cap_ctx *c) { return cudaFreeHost(c->pinned); }
static cudaError_t r_register(struct cap_ctx *c)
{
	return cudaHostRegister(c->pageable, 4096, cudaHostRegisterPortable);
}
static cudaError_t r_unregister(struct cap_ctx *c) { return cudaHostUnregister(c->registered); }
static cudaError_t r_memcpy(struct cap_ctx *c)
{
	return cudaMemcpy(c->d, c->pinned, 64, cudaMemcpyHostToDevice);
}
static cudaError_t r_memset(struct cap_ctx *c) { return cudaMemset(c->d, 0, 64); }
static cudaError_t r_device_sync(struct cap_ctx *c)
{
	(void)c;
	return cudaDeviceSynchronize();
}
static cudaError_t r_stream_sync(struct cap_ctx *c) { return cudaStreamSynchronize(c->s); }
static cudaError_t r_pageable_h2d(struct cap_ctx *c)
{
	return cudaMemcpyAsync(c->d, c->pageable, 64, cudaMemcpyHostToDevice, c->s);
}
static cudaError_t r_pageable_d2h(struct cap_ctx *c)
{
	return cudaMemcpyAsync(c->pageable, c->d, 64, cudaMemcpyDeviceToHost, c->s);
}
static cudaError_t r_wait_uncaptured(struct cap_ctx *c)
{
	return cudaStreamWaitEvent(c->s, c->plain, 0);
}
static cudaError_t r_query_captured(struct cap_ctx *c) { return cudaEventQuery(c->captured); }
static cudaError_t r_sync_captured(struct cap_ctx *c) { return cudaEventSynchronize(c->captured); }
static cudaError_t r_bad_launch(struct cap_ctx *c)
{
	return (cudaError_t)emu_axpb(c->d, c->d, 0, 1, 0, c->s); /* an empty grid */
}
static cudaError_t r_copy_past_end(struct cap_ctx *c)
{
	return cudaMemcpyAsync(c->d + 1, c->pinned, 4096, cudaMemcpyHostToDevice, c->s);
}
static cudaError_t r_begin_again(struct cap_ctx *c)
{
	return cudaStreamBeginCapture(c->s, cudaStreamCaptureModeThreadLocal);
}
static cudaError_t r_destroy(struct cap_ctx *c) { return cudaStreamDestroy(c->s); }
/* with a blocking stream captured: the legacy stream would depend on it */
static cudaError_t r_legacy_memset(struct cap_ctx *c)
{
	return cudaMemsetAsync(c->d, 0, 64, NULL);
}
static cudaError_t r_legacy_launch(struct cap_ctx *c)
{
	(void)c;
	return (cudaError_t)emu_launch_shape(1, 1, 32, 1, 1);
}

TEST(cudaemu_capture_refuses_and_invalidates)
{
	static const struct {
		const char *what;
		cudaError_t (*call)(struct cap_ctx *);
		cudaError_t want;
		bool blocking;
	} refused[] = {
		{ "cudaMalloc", r_malloc, cudaErrorStreamCaptureUnsupported, false },
		{ "cudaFree", r_free, cudaErrorStreamCaptureUnsupported, false },
		{ "cudaHostAlloc", r_host_alloc, cudaErrorStreamCaptureUnsupported, false },
		{ "cudaFreeHost", r_free_host, cudaErrorStreamCaptureUnsupported, false },
		{ "cudaHostRegister", r_register, cudaErrorStreamCaptureUnsupported, false },
		{ "cudaHostUnregister", r_unregister, cudaErrorStreamCaptureUnsupported, false },
		{ "cudaMemcpy", r_memcpy, cudaErrorStreamCaptureUnsupported, false },
		{ "cudaMemset", r_memset, cudaErrorStreamCaptureUnsupported, false },
		{ "cudaDeviceSynchronize", r_device_sync, cudaErrorStreamCaptureUnsupported, false },
		{ "cudaStreamSynchronize", r_stream_sync, cudaErrorStreamCaptureUnsupported, false },
		{ "pageable H2D copy", r_pageable_h2d, cudaErrorStreamCaptureUnsupported, false },
		{ "pageable D2H copy", r_pageable_d2h, cudaErrorStreamCaptureUnsupported, false },
		{ "wait for an uncaptured event", r_wait_uncaptured, cudaErrorStreamCaptureIsolation,
		  false },
		{ "cudaEventQuery(captured)", r_query_captured, cudaErrorCapturedEvent, false },
		{ "cudaEventSynchronize(captured)", r_sync_captured, cudaErrorCapturedEvent, false },
		{ "an empty grid", r_bad_launch, cudaErrorInvalidConfiguration, false },
		{ "a copy past the end", r_copy_past_end, cudaErrorInvalidValue, false },
		{ "cudaStreamBeginCapture again", r_begin_again, cudaErrorIllegalState, false },
		{ "cudaStreamDestroy", r_destroy, cudaErrorStreamCaptureUnsupported, false },
		{ "legacy stream memset", r_legacy_memset, cudaErrorStreamCaptureImplicit, true },
		{ "legacy stream launch", r_legacy_launch, cudaErrorStreamCaptureImplicit, true },
	};
	struct cap_ctx c = { .d = dev_alloc(4096), .d2 = dev_alloc(4096),
			     .pinned = pinned_alloc(4096), .pageable = aligned_alloc(4096, 8192),
			     .registered = aligned_alloc(4096, 4096) };
	cudaStream_t nb = new_stream(cudaStreamNonBlocking), bl = new_stream(cudaStreamDefault);
	cudaGraph_t g;
	int back = 0;

	CHECK(c.pageable && c.registered);
	CHECK_EQ_INT(cudaHostRegister(c.registered, 4096, 0), cudaSuccess);
	CHECK_EQ_INT(cudaEventCreate(&c.plain), cudaSuccess);
	CHECK_EQ_INT(cudaEventCreate(&c.captured), cudaSuccess);
	CHECK_EQ_INT(cudaEventRecord(c.plain, nb), cudaSuccess);
	for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
		c.s = refused[i].blocking ? bl : nb;
		CHECK_EQ_INT(cudaStreamBeginCapture(c.s, cudaStreamCaptureModeThreadLocal),
			     cudaSuccess);
		CHECK_EQ_INT(cudaMemsetAsync(c.d, 0, 64, c.s), cudaSuccess);
		CHECK_EQ_INT(cudaEventRecord(c.captured, c.s), cudaSuccess);
		const cudaError_t rc = refused[i].call(&c);
		CHECK_MSG(rc == refused[i].want, "%s: %d (%s), not %d", refused[i].what, rc,
			  cudaGetErrorString(rc), refused[i].want);
		CHECK_MSG(capture_status(c.s) == cudaStreamCaptureStatusInvalidated,
			  "%s left the capture valid", refused[i].what);
		CHECK_EQ_INT(cudaMemsetAsync(c.d, 0, 64, c.s), cudaErrorStreamCaptureInvalidated);
		CHECK_EQ_INT(cudaGetLastError(), cudaErrorStreamCaptureInvalidated);
		g = (cudaGraph_t)&g;
		CHECK_EQ_INT(cudaStreamEndCapture(c.s, &g), cudaErrorStreamCaptureInvalidated);
		CHECK_MSG(g == NULL, "%s", refused[i].what);
		CHECK_EQ_INT(capture_status(c.s), cudaStreamCaptureStatusNone);
	}
	/* the refused calls did nothing */
	CHECK_EQ_INT(cudaMemset(c.d2, 1, 4096), cudaSuccess);
	CHECK_EQ_INT(cudaMemset(c.pinned, 2, 4096), cudaSuccess);
	CHECK_EQ_INT(cudaHostUnregister(c.registered), cudaSuccess);
	CHECK_EQ_INT(cudaHostRegister(c.pageable, 4096, 0), cudaSuccess);
	CHECK_EQ_INT(cudaHostUnregister(c.pageable), cudaSuccess);

	/* allowed meanwhile: another stream's sync, an uncaptured event, the legacy stream
	 * beside non-blocking streams (its work runs now), and the unsafe calls when Relaxed */
	CHECK_EQ_INT(cudaStreamBeginCapture(nb, cudaStreamCaptureModeThreadLocal), cudaSuccess);
	CHECK_EQ_INT(cudaStreamSynchronize(bl), cudaSuccess);
	CHECK_EQ_INT(cudaEventQuery(c.plain), cudaSuccess);
	CHECK_EQ_INT(cudaEventSynchronize(c.plain), cudaSuccess);
	CHECK_EQ_INT(cudaMemsetAsync(c.d, 5, 4, NULL), cudaSuccess);
	CHECK_EQ_INT(cudaMemsetAsync(c.d, 0, 64, nb), cudaSuccess);
	CHECK_EQ_INT(capture_status(nb), cudaStreamCaptureStatusActive);
	CHECK_EQ_INT(cudaStreamEndCapture(nb, &g), cudaSuccess);
	CHECK_EQ_INT(cudaMemcpy(&back, c.d, 4, cudaMemcpyDeviceToHost), cudaSuccess);
	CHECK_EQ_INT(back, 0x05050505); /* ran at once; the captured memset did not */
	CHECK_EQ_INT(cudaGraphDestroy(g), cudaSuccess);
	CHECK_EQ_INT(cudaStreamBeginCapture(nb, cudaStreamCaptureModeRelaxed), cudaSuccess);
	void *p = NULL;
	CHECK_EQ_INT(cudaMalloc(&p, 64), cudaSuccess);
	CHECK_EQ_INT(cudaFree(p), cudaSuccess);
	CHECK_EQ_INT(cudaMemset(c.d, 0, 64), cudaSuccess);
	CHECK_EQ_INT(capture_status(nb), cudaStreamCaptureStatusActive);
	CHECK_EQ_INT(cudaStreamEndCapture(nb, &g), cudaSuccess);
	CHECK_EQ_INT(cudaGraphDestroy(g), cudaSuccess);
	/* ... but not the device's sync, which holds the capture */
	CHECK_EQ_INT(cudaStreamBeginCapture(nb, cudaStreamCaptureModeRelaxed), cudaSuccess);
	CHECK_EQ_INT(cudaDeviceSynchronize(), cudaErrorStreamCaptureUnsupported);
	CHECK_EQ_INT(cudaStreamEndCapture(nb, &g), cudaErrorStreamCaptureInvalidated);
	cudaGetLastError();

	cudaEventDestroy(c.plain);
	cudaEventDestroy(c.captured);
	cudaStreamDestroy(nb);
	cudaStreamDestroy(bl);
	cudaFree(c.d);
	cudaFree(c.d2);
	cudaFreeHost(c.pinned);
	free(c.pageable);
	free(c.registered);
}

/* a host function that tries CUDA: every call refused, none done */
struct inside {
	cudaStream_t s;
	cudaEvent_t ev;
	int *d, *pinned;
	int calls;
	cudaError_t rc[7];
};

static void CUDART_CB calls_cuda(void *p)
{
	struct inside *in = p;
	void *m = NULL;

	in->calls++;
	in->rc[0] = cudaMemcpyAsync(in->d, in->pinned, 64, cudaMemcpyHostToDevice, in->s);
	in->rc[1] = cudaMemcpy(in->d, in->pinned, 64, cudaMemcpyHostToDevice);
	in->rc[2] = cudaMalloc(&m, 64);
	in->rc[3] = cudaStreamSynchronize(in->s);
	in->rc[4] = cudaEventRecord(in->ev, in->s);
	in->rc[5] = cudaLaunchHostFunc(in->s, calls_cuda, p);
	cudaGetLastError(); /* the launch's own error, not the calls' before it */
	in->rc[6] = (cudaError_t)emu_axpb(in->d, in->d, 16, 1, 1, in->s);
}

TEST(cudaemu_host_fn_may_not_call_cuda)
{
	struct inside in = { .s = new_stream(cudaStreamNonBlocking), .d = dev_alloc(64),
			     .pinned = pinned_alloc(64) };
	cudaGraph_t g = NULL;
	cudaGraphExec_t x = NULL;
	int back = 0;

	CHECK_EQ_INT(cudaEventCreate(&in.ev), cudaSuccess);
	CHECK_EQ_INT(cudaMemset(in.d, 0, 64), cudaSuccess);
	memset(in.pinned, 0x11, 64);
	for (int round = 1; round <= 2; round++) {
		if (round == 1) { /* on a stream: it runs now */
			CHECK_EQ_INT(cudaLaunchHostFunc(in.s, calls_cuda, &in), cudaSuccess);
		} else { /* in a graph: at its launch */
			CHECK_EQ_INT(cudaStreamBeginCapture(in.s, cudaStreamCaptureModeThreadLocal),
				     cudaSuccess);
			CHECK_EQ_INT(cudaLaunchHostFunc(in.s, calls_cuda, &in), cudaSuccess);
			CHECK_EQ_INT(cudaStreamEndCapture(in.s, &g), cudaSuccess);
			CHECK_EQ_INT(cudaGraphInstantiate(&x, g, 0), cudaSuccess);
			CHECK_EQ_INT(in.calls, 1);
			memset(in.rc, 0, sizeof(in.rc));
			CHECK_EQ_INT(cudaGraphLaunch(x, in.s), cudaSuccess);
		}
		CHECK_EQ_INT(in.calls, round);
		for (int i = 0; i < 7; i++)
			CHECK_MSG(in.rc[i] == cudaErrorNotPermitted, "round %d: call %d: %d", round,
				  i, in.rc[i]);
		CHECK_EQ_INT(cudaMemcpy(&back, in.d, 4, cudaMemcpyDeviceToHost), cudaSuccess);
		CHECK_EQ_INT(back, 0); /* neither copy nor kernel ran */
	}
	/* outside it, CUDA is the caller's again */
	CHECK_EQ_INT(cudaEventRecord(in.ev, in.s), cudaSuccess);
	CHECK_EQ_INT(cudaMemcpyAsync(in.d, in.pinned, 64, cudaMemcpyHostToDevice, in.s),
		     cudaSuccess);
	CHECK_EQ_INT(cudaLaunchHostFunc(in.s, NULL, NULL), cudaErrorInvalidValue);
	cudaGetLastError();
	cudaGraphExecDestroy(x);
	cudaGraphDestroy(g);
	cudaEventDestroy(in.ev);
	cudaStreamDestroy(in.s);
	cudaFree(in.d);
	cudaFreeHost(in.pinned);
}

/* another thread's CUDA calls during this thread's capture (as hyb's RELOAD lane's) */
struct other {
	cudaStream_t s, capturing;
	cudaEvent_t ev;
	int *d, *pinned;
	cudaError_t malloc_rc, free_rc, copy_rc, query_rc, end_rc;
};

static void *other_thread(void *p)
{
	struct other *o = p;
	void *m = NULL;
	cudaGraph_t g = NULL;

	o->malloc_rc = cudaMalloc(&m, 4096);
	o->free_rc = m ? cudaFree(m) : cudaErrorUnknown;
	o->copy_rc = cudaMemcpyAsync(o->d, o->pinned, 64, cudaMemcpyHostToDevice, o->s);
	o->query_rc = cudaEventQuery(o->ev);
	if (o->capturing) {
		o->end_rc = cudaStreamEndCapture(o->capturing, &g);
		if (g)
			cudaGraphDestroy(g);
	}
	return NULL;
}

static void run_other(struct other *o)
{
	pthread_t t;

	CHECK(pthread_create(&t, NULL, other_thread, o) == 0);
	CHECK(pthread_join(t, NULL) == 0);
}

TEST(cudaemu_capture_modes_and_other_threads)
{
	struct other o = { .s = new_stream(cudaStreamNonBlocking), .d = dev_alloc(64),
			   .pinned = pinned_alloc(64) };
	cudaStream_t s = new_stream(cudaStreamNonBlocking);
	cudaGraph_t g = NULL;
	void *p = NULL;
	int back = 0;

	CHECK_EQ_INT(cudaEventCreate(&o.ev), cudaSuccess);
	CHECK_EQ_INT(cudaEventRecord(o.ev, o.s), cudaSuccess);
	memset(o.pinned, 0x22, 64);
	/* ThreadLocal: the other thread allocates, copies and queries as ever */
	CHECK_EQ_INT(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
	CHECK_EQ_INT(cudaMemsetAsync(o.d, 0, 64, s), cudaSuccess);
	run_other(&o);
	CHECK_EQ_INT(o.malloc_rc, cudaSuccess);
	CHECK_EQ_INT(o.free_rc, cudaSuccess);
	CHECK_EQ_INT(o.copy_rc, cudaSuccess);
	CHECK_EQ_INT(o.query_rc, cudaSuccess);
	CHECK_EQ_INT(capture_status(s), cudaStreamCaptureStatusActive);
	CHECK_EQ_INT(cudaMalloc(&p, 64), cudaErrorStreamCaptureUnsupported); /* but not here */
	CHECK_EQ_INT(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
	CHECK_EQ_INT(cudaMemcpy(&back, o.d, 4, cudaMemcpyDeviceToHost), cudaSuccess);
	CHECK_EQ_INT(back, 0x22222222); /* its copy ran; the captured memset did not */
	CHECK_EQ_INT(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
	run_other(&o);
	CHECK_EQ_INT(o.malloc_rc, cudaSuccess);
	CHECK_EQ_INT(cudaStreamEndCapture(s, &g), cudaSuccess);
	CHECK(g != NULL);
	cudaGraphDestroy(g);

	/* Global: no thread may make an unsafe call */
	CHECK_EQ_INT(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
	run_other(&o);
	CHECK_EQ_INT(o.malloc_rc, cudaErrorStreamCaptureUnsupported);
	CHECK_EQ_INT(o.copy_rc, cudaSuccess);
	CHECK_EQ_INT(capture_status(s), cudaStreamCaptureStatusInvalidated);
	CHECK_EQ_INT(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);

	/* a capture not Relaxed ends on the thread that began it */
	o.capturing = s;
	CHECK_EQ_INT(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
	run_other(&o);
	CHECK_EQ_INT(o.end_rc, cudaErrorStreamCaptureWrongThread);
	CHECK_EQ_INT(capture_status(s), cudaStreamCaptureStatusInvalidated);
	CHECK_EQ_INT(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
	CHECK_EQ_INT(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), cudaSuccess);
	CHECK_EQ_INT(cudaMemsetAsync(o.d, 0, 64, s), cudaSuccess);
	run_other(&o);
	CHECK_EQ_INT(o.end_rc, cudaSuccess);
	CHECK_EQ_INT(capture_status(s), cudaStreamCaptureStatusNone);
	cudaGetLastError();

	cudaEventDestroy(o.ev);
	cudaStreamDestroy(o.s);
	cudaStreamDestroy(s);
	cudaFree(o.d);
	cudaFreeHost(o.pinned);
}

/* a plain record in a capture is a fork/join mark, no node; an external one is a node */
TEST(cudaemu_capture_events_mark_work_not_time)
{
	cudaStream_t s = new_stream(cudaStreamNonBlocking);
	cudaEvent_t mark, t0, t1;
	cudaGraph_t g = NULL;
	cudaGraphExec_t x = NULL;
	float ms = -1;
	int *d = dev_alloc(64);

	CHECK_EQ_INT(cudaEventCreate(&mark), cudaSuccess);
	CHECK_EQ_INT(cudaEventCreate(&t0), cudaSuccess);
	CHECK_EQ_INT(cudaEventCreate(&t1), cudaSuccess);
	CHECK_EQ_INT(cudaEventRecordWithFlags(t0, s, cudaEventRecordExternal), cudaErrorInvalidValue);
	CHECK_EQ_INT(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
	CHECK_EQ_INT(cudaEventRecordWithFlags(t0, s, cudaEventRecordExternal), cudaSuccess);
	CHECK_EQ_INT(cudaEventRecord(mark, s), cudaSuccess);
	CHECK_EQ_INT(cudaMemsetAsync(d, 1, 64, s), cudaSuccess);
	CHECK_EQ_INT(cudaEventRecordWithFlags(t1, s, cudaEventRecordExternal), cudaSuccess);
	CHECK_EQ_INT(cudaEventElapsedTime(&ms, t0, t1), cudaErrorInvalidResourceHandle);
	CHECK_EQ_INT(cudaStreamEndCapture(s, &g), cudaSuccess);
	CHECK_EQ_INT(cudaGraphInstantiate(&x, g, 0), cudaSuccess);
	CHECK_EQ_INT(cudaGraphLaunch(x, s), cudaSuccess);
	CHECK_EQ_INT(cudaEventElapsedTime(&ms, t0, t1), cudaSuccess);
	CHECK(ms >= 0);
	CHECK_EQ_INT(cudaEventQuery(t1), cudaSuccess);
	CHECK_EQ_INT(cudaEventQuery(mark), cudaErrorInvalidValue); /* no launch records it */
	CHECK_EQ_INT(cudaEventElapsedTime(&ms, t0, mark), cudaErrorInvalidValue);
	/* the graph's memory freed since: its launch is where a GPU would fault */
	CHECK_EQ_INT(cudaFree(d), cudaSuccess);
	CHECK_EQ_INT(cudaGraphLaunch(x, s), cudaErrorIllegalAddress);
	cudaGetLastError();
	cudaGraphExecDestroy(x);
	cudaGraphDestroy(g);
	cudaEventDestroy(mark);
	cudaEventDestroy(t0);
	cudaEventDestroy(t1);
	cudaStreamDestroy(s);
}

TEST(cudaemu_graph_bad_handles)
{
	static char junk[256]; /* no magic: a handle to nothing */
	cudaStream_t s = new_stream(cudaStreamNonBlocking), js = (cudaStream_t)junk;
	cudaGraph_t g = NULL, jg = (cudaGraph_t)junk;
	cudaGraphExec_t x = NULL, jx = (cudaGraphExec_t)junk;
	enum cudaStreamCaptureStatus st;
	int *d = dev_alloc(64);

	CHECK_EQ_INT(cudaGraphInstantiate(&x, NULL, 0), cudaErrorInvalidResourceHandle);
	CHECK_EQ_INT(cudaGraphInstantiate(&x, jg, 0), cudaErrorInvalidResourceHandle);
	CHECK_EQ_INT(cudaGraphLaunch(NULL, s), cudaErrorInvalidResourceHandle);
	CHECK_EQ_INT(cudaGraphLaunch(jx, s), cudaErrorInvalidResourceHandle);
	CHECK_EQ_INT(cudaGraphExecDestroy(NULL), cudaErrorInvalidResourceHandle);
	CHECK_EQ_INT(cudaGraphExecDestroy(jx), cudaErrorInvalidResourceHandle);
	CHECK_EQ_INT(cudaGraphDestroy(NULL), cudaErrorInvalidResourceHandle);
	CHECK_EQ_INT(cudaGraphDestroy(jg), cudaErrorInvalidResourceHandle);
	CHECK_EQ_INT(cudaStreamBeginCapture(js, cudaStreamCaptureModeThreadLocal),
		     cudaErrorInvalidResourceHandle);
	CHECK_EQ_INT(cudaStreamEndCapture(js, &g), cudaErrorInvalidResourceHandle);
	CHECK_EQ_INT(cudaStreamIsCapturing(js, &st), cudaErrorInvalidResourceHandle);
	CHECK_EQ_INT(cudaLaunchHostFunc(js, see_output, NULL), cudaErrorInvalidResourceHandle);
	CHECK_EQ_INT(cudaStreamBeginCapture(s, (enum cudaStreamCaptureMode)7), cudaErrorInvalidValue);
	CHECK_EQ_INT(cudaStreamIsCapturing(s, NULL), cudaErrorInvalidValue);
	CHECK_EQ_INT(cudaStreamEndCapture(s, &g), cudaErrorIllegalState);

	CHECK_EQ_INT(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
	CHECK_EQ_INT(cudaMemsetAsync(d, 3, 64, s), cudaSuccess);
	CHECK_EQ_INT(cudaStreamEndCapture(s, &g), cudaSuccess);
	CHECK_EQ_INT(cudaGraphInstantiate(&x, g, 1), cudaErrorInvalidValue);
	CHECK_EQ_INT(cudaGraphInstantiate(NULL, g, 0), cudaErrorInvalidValue);
	/* an injectable resource call, as the others */
	hyb_emu_fail_at(1);
	CHECK_EQ_INT(cudaGraphInstantiate(&x, g, 0), cudaErrorMemoryAllocation);
	CHECK(hyb_emu_fail_hit());
	CHECK(x == NULL);
	hyb_emu_fail_at(0);
	CHECK_EQ_INT(cudaGraphInstantiate(&x, g, 0), cudaSuccess);
	CHECK_EQ_INT(cudaGraphDestroy(g), cudaSuccess);
	/* no child graphs here: a launch into a capture is refused (and invalidates it) */
	CHECK_EQ_INT(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
	CHECK_EQ_INT(cudaGraphLaunch(x, s), cudaErrorStreamCaptureUnsupported);
	CHECK_EQ_INT(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
	CHECK(g == NULL);
	CHECK_EQ_INT(cudaGraphExecDestroy(x), cudaSuccess);
	cudaGetLastError();
	cudaStreamDestroy(s);
	cudaFree(d);
}

/*
 * hyb itself with --device cuda (build/cudaemu/hyb, the program linked with
 * cudaemu) against --device cpu, the same placement on the CPU-executed
 * device: a plain model and a plan decode through the CUDA device layer
 * from the command line, place parts on the device and pick the same first
 * token (greedy tokens further on may part at the near-ties of small
 * random models, as tests/gpu's comparisons allow); the real Gemma 3 270M
 * (K-quants, windows, GeGLU) gives the same text.
 */
static char *slurp(const char *path)
{
	FILE *f = fopen(path, "rb");
	char *b = calloc(1, 1 << 16);

	CHECK(f && b);
	CHECK(fread(b, 1, (1 << 16) - 1, f) < (1 << 16) - 1);
	fclose(f);
	return b;
}

static void hyb_run_both(const char *model, const char *budget, const char *prompt, int n,
			 bool whole)
{
	char out[2][512], log[512];
	char *text[2];

	for (int i = 0; i < 2; i++) {
		const char *dev = i ? "cuda" : "cpu";

		snprintf(out[i], sizeof(out[i]), "%s/out-%s", hyb_test_tmpdir(), dev);
		snprintf(log, sizeof(log), "%s/log-%s", hyb_test_tmpdir(), dev);
		const int rc = hyb_test_sh(log, "(build/cudaemu/hyb run -m %s -p '%s' -n %d "
					   "--gpu-budget %s --device %s > %s)", model, prompt,
					   n, budget, dev, out[i]);
		if (rc)
			hyb_test_show_log(log);
		CHECK_MSG(rc == 0, "hyb run --device %s: exit %d", dev, rc);
		text[i] = slurp(log);
		CHECK_MSG(strstr(text[i], "on the device"), "%s", text[i]);
		free(text[i]);
		text[i] = slurp(out[i]);
		CHECK_MSG(strncmp(text[i], prompt, strlen(prompt)) == 0 &&
				  strlen(text[i]) > strlen(prompt) + 1,
			  "%s", text[i]);
	}
	printf("    cpu:  %.60s\n    cuda: %.60s\n", text[0], text[1]);
	if (whole)
		CHECK_MSG(!strcmp(text[0], text[1]), "cpu: %s\ncuda: %s", text[0], text[1]);
	else /* the first generated token's first byte */
		CHECK_MSG(text[0][strlen(prompt)] == text[1][strlen(prompt)], "cpu: %s\ncuda: %s",
			  text[0], text[1]);
	free(text[0]);
	free(text[1]);
}

TEST(cudaemu_hyb_run_device_cuda)
{
	hyb_run_both(hyb_test_synth("plain", "--hidden 512 --ffn 1536 --heads 8 --layers 4 "
				    "--type Q8_0 --seed 3"), "70%", "Once upon a time", 8, false);
	hyb_run_both(hyb_test_plan(), "40%", "Once upon a time", 8, false);
}

TEST(cudaemu_hyb_run_gemma3_270m_device_cuda)
{
	hyb_run_both(hyb_test_real_model("gemma3"), "100%", "The capital of France is", 4, true);
}

/*
 * Every resource the CUDA path takes, refused in turn (HYB_CUDAEMU_FAIL_AT=N
 * for N = 1, 2, ... until a run takes no refusal): hyb run --device cuda
 * either goes on without it (prompts stay on the CPU without their
 * buffers) or stops with one "hyb: ... out of memory" line (or "out of (host)
 * memory") and exit 1;
 * never a signal. The error paths of the device layer and the hybrid
 * engine, which a GPU takes only when it runs out.
 */
static void refuse_each(const char *model, const char *budget, const char *extra)
{
	char log[512];
	int n, stops = 0, goes_on = 0;

	for (n = 1; n < 400; n++) {
		char *text;

		snprintf(log, sizeof(log), "%s/refuse-%d", hyb_test_tmpdir(), n);
		const int rc = hyb_test_sh(log, "HYB_CUDAEMU_FAIL_AT=%d build/cudaemu/hyb run -m %s "
					   "-p 'Once upon a time' -n 2 --gpu-budget %s --device "
					   "cuda %s", n, model, budget, extra);
		text = slurp(log);
		const bool hit = strstr(text, "fails as injected") != NULL;
		if (rc < 0 || (rc != 0 && rc != 1))
			hyb_test_show_log(log);
		CHECK_MSG(rc == 0 || rc == 1, "refusal %d: exit %d", n, rc);
		if (rc == 1)
			CHECK_MSG(strstr(text, "hyb: ") && strstr(text, "out of "),
				  "refusal %d: %s", n, text);
		free(text);
		if (!hit) {
			CHECK_EQ_INT(rc, 0);
			break;
		}
		stops += rc == 1;
		goes_on += rc == 0;
	}
	CHECK(n < 400);
	printf("    %s: %d calls refused in turn: %d stop with an error, %d go on\n", model, n - 1,
	       stops, goes_on);
}

TEST(cudaemu_hyb_run_survives_each_refusal)
{
	refuse_each(hyb_test_synth("plain", "--hidden 256 --ffn 768 --heads 4 --layers 2 "
				   "--type Q8_0 --seed 3"), "70%", "");
	refuse_each(hyb_test_synth("moe", "--arch qwen3moe --experts 8 --experts-used 2 "
				   "--expert-ffn 128 --hidden 256 --heads 4 --layers 2 "
				   "--type Q4_0 --seed 3"), "60%", "");
	refuse_each(hyb_test_plan(), "40%", "");
}

/* hyb run --device cuda on m under env: exit 1 and a line holding want */
static void run_refused(const char *env, const char *m, const char *want)
{
	char log[512], *text;

	snprintf(log, sizeof(log), "%s/refused", hyb_test_tmpdir());
	CHECK_EQ_INT(hyb_test_sh(log, "%s build/cudaemu/hyb run -m %s -p Once -n 2 "
				 "--gpu-budget 70%% --device cuda", env, m), 1);
	text = slurp(log);
	CHECK_MSG(strstr(text, want), "%s: %s", env, text);
	free(text);
}

/* no GPU, or too little memory for the budget: one line that says which, exit 1 */
TEST(cudaemu_hyb_run_without_a_device_or_its_memory)
{
	const char *m = hyb_test_synth("plain", "--hidden 256 --ffn 768 --heads 4 --layers 2 "
				       "--type Q8_0 --seed 3");

	run_refused("HYB_CUDAEMU_DEVICES=0", m, "hyb: hybrid: no CUDA device");
	run_refused("HYB_CUDAEMU_MEM_MB=1", m, "not available");
}

/*
 * hybd's CUDA copy engine with each resource refused in turn: open, pin a
 * region, upload at two priorities, sync, unpin, close. Every refusal is
 * an error return with a message (or is absorbed), never a crash; the run
 * without one copies the bytes.
 */
static int copy_engine_once(long n)
{
	const struct hyb_copydev_cuda_config cfg = { .device = 0, .n_slots = 4,
						     .slot_bytes = 1 << 20 };
	char err[256] = "";
	struct hyb_copydev *d;
	uint8_t *host = aligned_alloc(4096, 2 << 20), back[4096];
	int bad = 0;

	hyb_emu_fail_at(n);
	if (!host)
		return 99;
	for (int i = 0; i < 2 << 20; i++)
		host[i] = (uint8_t)(i * 131 + 7);
	d = hyb_copydev_cuda_open(&cfg, err, sizeof(err));
	if (!d)
		return strlen(err) ? 20 : 98;
	if (hyb_copydev_cuda_register(d, host, 2 << 20, true, err, sizeof(err)) ||
	    d->ops->upload(d, 1, 0, host + 4096, 1 << 20, HYB_RQ_LOW) ||
	    d->ops->upload(d, 2, 4096, host, 4096, HYB_RQ_CRITICAL) ||
	    d->ops->sync(d, HYB_RQ_CRITICAL) || d->ops->sync(d, HYB_RQ_LOW)) {
		hyb_copydev_close(d);
		return 21;
	}
	if (cudaMemcpy(back, (uint8_t *)hyb_copydev_cuda_slot(d, 2) + 4096, 4096,
		       cudaMemcpyDeviceToHost) != cudaSuccess || memcmp(back, host, 4096))
		bad = 1;
	if (hyb_copydev_cuda_unregister(d, host))
		bad = 1;
	hyb_copydev_close(d);
	free(host);
	return bad ? 97 : 10;
}

TEST(cudaemu_copy_engine_survives_each_refusal)
{
	int n, errors = 0;

	for (n = 1; n < 200; n++) {
		const pid_t pid = fork();
		int st = 0;

		CHECK(pid >= 0);
		if (pid == 0) {
			const int rc = copy_engine_once(n);

			_exit(rc + (hyb_emu_fail_hit() ? 1 : 0) * 100);
		}
		CHECK(waitpid(pid, &st, 0) == pid);
		CHECK_MSG(WIFEXITED(st), "refusal %d: killed by signal %d", n, WTERMSIG(st));
		const int rc = WEXITSTATUS(st) % 100, hit = WEXITSTATUS(st) >= 100;
		CHECK_MSG(rc == 10 || rc == 20 || rc == 21, "refusal %d: outcome %d", n, rc);
		CHECK_MSG(hit || rc == 10, "refusal %d: failed with nothing refused (%d)", n, rc);
		if (!hit)
			break;
		errors += rc != 10;
	}
	CHECK(n < 200);
	printf("    %d calls refused in turn: %d ended in an error, %d absorbed\n", n - 1, errors,
	       n - 1 - errors);
}

/*
 * The GPU session's benchmark (tests/gpu/device_run.sh's hybrid_all) on
 * cudaemu, small: hyb bench --device cuda over a plan with every policy, and
 * with the whole model on the device, runs to its table; so does TEAL's
 * bench on a plain model with every part on the device. Its figures are
 * cudaemu's and mean nothing; the run is what the GPU's minutes must not
 * spend on.
 */
TEST(cudaemu_hyb_bench_device_cuda)
{
	static const char *const pols[] = { "layer", "static", "lru", "topk", "dynamic", "tam",
					    "tam-adaptive" };
	char log[512], *text;

	snprintf(log, sizeof(log), "%s/bench", hyb_test_tmpdir());
	const int rc = hyb_test_sh(log, "(build/cudaemu/hyb bench -m %s --device cuda --drift 8 "
				   "-n 12 -r 1 --gpu-budget 60%% --policies all && "
				   "build/cudaemu/hyb bench -m %s --device cuda -n 8 -r 1 "
				   "--gpu-budget 8G --policies static)", hyb_test_plan(),
				   hyb_test_plan());
	if (rc)
		hyb_test_show_log(log);
	CHECK_EQ_INT(rc, 0);
	text = slurp(log);
	for (size_t i = 0; i < sizeof(pols) / sizeof(pols[0]); i++)
		CHECK_MSG(strstr(text, pols[i]), "no %s in:\n%s", pols[i], text);
	free(text);

	/* TEAL on a plain model with every part on the device (the next GPU run's TEAL figure) */
	const char *plain = hyb_test_synth("teal", "--hidden 256 --ffn 768 --heads 4 --layers 2 "
					   "--act silu --type Q8_0 --seed 5");
	snprintf(log, sizeof(log), "%s/teal", hyb_test_tmpdir());
	CHECK_EQ_INT(hyb_test_sh(log, "%s profile %s --teal --sparsity 0.4 --gen 16 -t 1 "
				 "-o %s.teal.gguf", hyb_test_hybctl(), plain, plain), 0);
	const int rc2 = hyb_test_sh(log, "build/cudaemu/hyb bench -m %s --teal %s.teal.gguf "
				    "--sparsity 0.3 --gpu-budget 100%% --device cuda -n 8 -r 1",
				    plain, plain);
	if (rc2)
		hyb_test_show_log(log);
	CHECK_EQ_INT(rc2, 0);
	text = slurp(log);
	CHECK_MSG(strstr(text, "CPU-only TEAL decode") && strstr(text, "static"), "%s", text);
	free(text);
}

/* the "text" of a completion's JSON, malloc'd */
static char *completion_text(const char *path)
{
	char *json = slurp(path), *t = strstr(json, "\"text\":\""), *e;

	CHECK_MSG(t, "no text in %s: %s", path, json);
	t += 8;
	e = strchr(t, '"');
	CHECK(e);
	*e = 0;
	t = strdup(t);
	free(json);
	return t;
}

/*
 * hyb serve --device cuda: two requests at once, batched through the CUDA
 * device layer, each answered with the text the CPU device's server gives;
 * SIGTERM ends it with status 0.
 */
TEST(cudaemu_hyb_serve_device_cuda)
{
	const char *m = hyb_test_synth("plain", "--hidden 512 --ffn 1536 --heads 8 --layers 4 "
				       "--type Q8_0 --seed 3");
	char log[512], path[600];
	char *t[2][2];

	if (system("command -v curl >/dev/null 2>&1"))
		SKIP("no curl");
	for (int i = 0; i < 2; i++) {
		const char *dev = i ? "cuda" : "cpu";

		snprintf(log, sizeof(log), "%s/serve-%s.out", hyb_test_tmpdir(), dev);
		const int rc = hyb_test_sh(log, "bash tests/cudaemu/serve.sh %s %s %s", m, dev,
					   hyb_test_tmpdir());
		if (rc)
			hyb_test_show_log(log);
		CHECK_MSG(rc == 0, "serve --device %s: %d", dev, rc);
		for (int k = 0; k < 2; k++) {
			snprintf(path, sizeof(path), "%s/%s-%d.json", hyb_test_tmpdir(), dev, k + 1);
			t[i][k] = completion_text(path);
		}
	}
	CHECK_MSG(*t[1][0] && !strcmp(t[1][0], t[1][1]), "cuda: '%s' and '%s'", t[1][0], t[1][1]);
	CHECK_MSG(!strcmp(t[0][0], t[1][0]), "cpu '%s', cuda '%s'", t[0][0], t[1][0]);
	for (int i = 0; i < 2; i++)
		for (int k = 0; k < 2; k++)
			free(t[i][k]);
}
