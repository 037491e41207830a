/* SPDX-License-Identifier: MIT */
/*
 * The device layer (docs/DEVICE.md): what the
 * hybrid engine asks of an accelerator - memory with a capacity, three
 * streams of asynchronous work, events between them, and the kernels of a
 * hybrid decode step. Two implementations honour it:
 *
 * docs/DEVICE.md has the rest: the details.
 */
#ifndef HYB_DEVICE_H
#define HYB_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hyb/error.h"
#include "hyb/model.h"

typedef uint64_t hyb_dptr;

enum hyb_stream {
	HYB_STREAM_COMPUTE,
	HYB_STREAM_CRITICAL,
	HYB_STREAM_RELOAD,
	HYB_N_STREAMS
};

struct hyb_device_config {
	uint64_t capacity;     /* bytes of device memory to use; 0: cuda all free, cpu 1 GiB */
	int ordinal;           /* CUDA device number */
	uint64_t chunk_bytes;  /* RELOAD copies are cut into chunks of this; 0: 1 MiB */
	/* CPU device only: the modelled machine (0: the defaults below). */
	double pcie_gbps;      /* per direction, GB/s; default 25 (PCIe 4.0 x16 measured) */
	double pcie_lat_us;    /* fixed cost per copy; default 8 */
	double hbm_gbps;       /* kernel memory bandwidth; default 2000 */
	double launch_us;      /* fixed cost per kernel; default 5 */
	double tflops;         /* kernel arithmetic, 10^12 multiply-adds x 2 a second; default
				* 200 (docs/DEVICE.md: a prompt batch's kernels are bound by it) */
	/*
	 * The host's clock virtual too: hyb_device_now() advances only by the
	 * host work the caller reports (hyb_device_host_work) and the waits the
	 * model adds, not by wall time, so every decision taken from it - the
	 * balancer's time-driven policies - is the same on every run
	 * (docs/DETERMINISM.md). host_gbps: the caller's model of its own
	 * memory bandwidth for that work; default 50.
	 */
	bool virtual_clock;
	double host_gbps;
};

struct hyb_device;
struct hyb_device_event;

/*
 * kind: "cpu" or "cuda". NULL with a one-line reason in hyb_last_error():
 * unknown kind, no CUDA device or libhyb built without CUDA, capacity not
 * available.
 */
struct hyb_device *hyb_device_open(const char *kind, const struct hyb_device_config *cfg);
/* Waits for all queued work, frees everything. NULL is a no-op. */
void hyb_device_close(struct hyb_device *d);
const char *hyb_device_kind(const struct hyb_device *d);   /* "cpu", "cuda" */
/* The message of the last failed call (kept until the next failure); "" when none. */
const char *hyb_device_error(const struct hyb_device *d);
uint64_t hyb_device_capacity(const struct hyb_device *d);
/* The configuration in use, defaults filled in (CUDA: pcie_gbps and hbm_gbps nominal). */
void hyb_device_get_config(const struct hyb_device *d, struct hyb_device_config *out);
uint64_t hyb_device_used(const struct hyb_device *d);
/* The host clock in seconds (see "Model of time" above). */
double hyb_device_now(struct hyb_device *d);
/*
 * The host has done s seconds of work by its own model: the virtual clock
 * (virtual_clock) advances by s; otherwise, and on CUDA, nothing happens.
 */
void hyb_device_host_work(struct hyb_device *d, double s);

/* ---- memory ---------------------------------------------------------------- */

/* 256-byte aligned, contents undefined. -ENOMEM when used + bytes > capacity. */
int hyb_device_alloc(struct hyb_device *d, uint64_t bytes, hyb_dptr *out);
void hyb_device_free(struct hyb_device *d, hyb_dptr p);
/*
 * Let the device's kernels address memory another party owns and mapped
 * into this process (box mode: hybd's neuron cache, hyb/gpucache.h - a CUDA
 * IPC mapping, or the CPU device's view of hybd's slots pool): [p, p +
 * bytes) is checked like an allocation but is not counted against the
 * capacity, and hyb_device_free() / close only forget it. -EINVAL when it
 * overlaps an allocation or is not 256-byte aligned.
 */
int hyb_device_adopt(struct hyb_device *d, hyb_dptr p, uint64_t bytes);
/* Pin host memory for asynchronous copies (pools: CUDA cudaHostRegister). */
int hyb_device_host_register(struct hyb_device *d, void *p, size_t len);
int hyb_device_host_unregister(struct hyb_device *d, void *p);
/* Pinned host buffers for small transfers (64-byte aligned; NULL when out of memory). */
void *hyb_device_host_alloc(struct hyb_device *d, size_t len);
void hyb_device_host_free(struct hyb_device *d, void *p);

/* ---- copies, events --------------------------------------------------------- */

int hyb_device_h2d(struct hyb_device *d, enum hyb_stream s, hyb_dptr dst, const void *src,
		   uint64_t len);
int hyb_device_d2h(struct hyb_device *d, enum hyb_stream s, void *dst, hyb_dptr src,
		   uint64_t len);

/* NULL when out of memory. An event never recorded counts as completed. */
struct hyb_device_event *hyb_device_event_new(struct hyb_device *d);
/*
 * An event that also keeps the time it completed, for hyb_device_elapsed
 * (CUDA: a timing event, a little dearer to record; CPU device: a marker in
 * its stream, completed at the modelled time the work before it ends).
 */
struct hyb_device_event *hyb_device_event_new_timed(struct hyb_device *d);
void hyb_device_event_free(struct hyb_device *d, struct hyb_device_event *ev);
/* ev completes when the work queued on s so far has completed. */
int hyb_device_record(struct hyb_device *d, enum hyb_stream s, struct hyb_device_event *ev);
/* Work queued on s after this call starts after ev completes. */
int hyb_device_wait(struct hyb_device *d, enum hyb_stream s, struct hyb_device_event *ev);
/* Has ev completed by the host clock? (never blocks) */
bool hyb_device_done(struct hyb_device *d, struct hyb_device_event *ev);
/* Block the host until ev completes. */
int hyb_device_sync(struct hyb_device *d, struct hyb_device_event *ev);
/*
 * *s = seconds from a's completion to b's, by the device's clock: how long
 * the work between two events recorded on one stream took on the device,
 * whatever the host did meanwhile. Both timed and recorded: else -EINVAL;
 * one not completed yet: -EAGAIN (not a fault; *s untouched). The CPU
 * device remembers the last 1024 completions of each stream: an event
 * older than that is -EINVAL.
 */
int hyb_device_elapsed(struct hyb_device *d, struct hyb_device_event *a,
		       struct hyb_device_event *b, double *s);

/* ---- host functions, graphs (docs/DEVICE.md, "Graphs") ------------------------ */

/*
 * fn(arg) runs once the work queued on s before it has completed; work
 * queued on s after it starts once fn has returned (CUDA: cudaLaunchHostFunc,
 * on the runtime's callback thread; CPU device: on the caller's thread, at
 * once, as its copies and kernels run). fn must not call the device but for
 * hyb_device_host_work, nor wait for the thread that queued it. Not on
 * RELOAD (-EINVAL).
 */
typedef void (*hyb_device_host_fn_t)(void *arg);
int hyb_device_host_fn(struct hyb_device *d, enum hyb_stream s, hyb_device_host_fn_t fn,
		       void *arg);

/*
 * A graph: work captured once and launched many times (KTransformers 3.3:
 * a decode step in one launch, its CPU work in host functions).
 * Between capture_begin(d, s) and capture_end the work queued on s, and on
 * a stream that waited for an event recorded in the capture (it joins), is
 * recorded, not run. Every joined stream must be joined back: s waits for
 * an event recorded on it after its last work. Waits for events recorded
 * outside the capture, work on other streams, RELOAD, and every call that
 * is not queued work (alloc, free, register, host_alloc, sync, elapsed,
 * measure_bw, another capture, a launch) are -EBUSY meanwhile; an error
 * ends the capture, as CUDA invalidates it. An event recorded in a capture
 * orders work inside it only: record it again before waiting for it
 * outside.
 * launch: the graph's work on s, after the work queued on s before it,
 * before the work queued on s after it, with the arguments it was captured
 * with: the same device and host addresses, read and written again (the
 * memory must still be there). A kernel argument that changes from step to
 * step comes from device memory. capture_end: -EINVAL when a stream was
 * not joined back, and *g NULL.
 */
struct hyb_device_graph;
int hyb_device_capture_begin(struct hyb_device *d, enum hyb_stream s);
int hyb_device_capture_end(struct hyb_device *d, struct hyb_device_graph **g);
bool hyb_device_capturing(const struct hyb_device *d);
int hyb_device_graph_launch(struct hyb_device *d, struct hyb_device_graph *g);
void hyb_device_graph_free(struct hyb_device *d, struct hyb_device_graph *g);

/*
 * The link and device-memory bandwidths the engine's own copies and kernels
 * get (libhyb/device/device_bw.c): a host-to-device copy of bytes from pinned
 * memory, and hyb_device_add over bytes / 8 floats, each the best of reps
 * timed runs. Needs bytes of device memory free. The CPU device answers its
 * model's figures. 0, or a negative errno with hyb_device_error().
 */
struct hyb_device_bw {
	double pcie_gbps;   /* host -> device, GB/s */
	double hbm_gbps;    /* device memory as a streaming kernel sees it, GB/s */
};
int hyb_device_measure_bw(struct hyb_device *d, uint64_t bytes, int reps,
			  struct hyb_device_bw *out);

/* ---- kernels ---------------------------------------------------------------- */

/*
 * The sparse FFN over cached neuron groups (PowerInfer 5.3-5.4, DynamicInfer
 * gpu_bucket): one layer in the plan's bundle layout (hyb/plan.h), where the
 * bundles of some groups sit in cache slots of device memory.
 *
 *   y[0..n_embd) (= or +=) sum over listed neurons i of h_i * down_i,
 *   h_i = act(gate_i . xn, up_i . xn)
 *
 * Neuron i (bundle order) is in group g = i / group_size; its bundle is at
 * cache + table[g] * slot_bytes (gate rows, then up rows, then down rows, as
 * in hyb_bundles_build), and neuron i is row i - g * group_size of each part.
 * Every listed neuron's group must have table[g] >= 0 (the caller lists only
 * resident neurons). The ReLU-family early exit is the CPU operator's: a gate
 * <= 0 reads neither up nor down. Results equal the CPU operator over the
 * same neurons up to float summation order.
 */
struct hyb_dev_ffn {
	uint32_t type;          /* hyb_device_ffn_type_ok() */
	uint32_t n_embd, n_ff, group_size;
	enum hyb_ffn_act act;
	float thr;              /* CATS threshold (hyb/sparsity.h; SiLU only): a listed neuron with
				 * |silu(gate)| <= thr reads neither up nor down; 0: none */
	hyb_dptr table;         /* int32 [ceil(n_ff / group_size)]: slot of group g, or -1 */
	hyb_dptr cache;         /* slot s at cache + s * slot_bytes */
	uint64_t slot_bytes;    /* >= 3 * group_size * row bytes */
	hyb_dptr xn;            /* float [n_embd] */
	hyb_dptr active;        /* uint32 [n_active], strictly increasing, all resident */
	uint32_t n_active;
	hyb_dptr y;             /* float [n_embd] */
	bool accumulate;        /* y += instead of y = */
	uint32_t batch;         /* 0 or 1: one xn; n: xn and y are [n][n_embd], the same list
				 * for each (a prompt batch's dense FFN, docs/HYBRID.md) */
};
int hyb_device_sparse_ffn(struct hyb_device *d, enum hyb_stream s, const struct hyb_dev_ffn *f);
/*
 * Whether hyb_device_sparse_ffn takes bundles of `type`: the CPU sparse
 * operator's types (every one but BF16; the CUDA device not F32). The
 * hybrid engine refuses a plan whose type no device runs.
 */
bool hyb_device_ffn_type_ok(uint32_t type);

/* y[i] += x[i] for i < n (float): the merge of a CPU partial result (PowerInfer 5.3). */
int hyb_device_add(struct hyb_device *d, enum hyb_stream s, hyb_dptr y, hyb_dptr x, uint32_t n);

/*
 * g[i] = act(g[i], u[i]) for i < n (float; g and u disjoint): a dense FFN's
 * or an expert's activation between its gate/up and down matvecs, with
 * hyb_ffn_act's arithmetic (SwiGLU, GeGLU by ggml's F16 GELU table, the
 * ReLU family; docs/MOE.md, docs/HYBRID.md "Plain models"). -EINVAL for
 * another act.
 */
int hyb_device_ffn_act(struct hyb_device *d, enum hyb_stream s, hyb_dptr g, hyb_dptr u,
		       uint32_t n, enum hyb_ffn_act act);

/*
 * Dense kernels: the attention block and the head on the device (PowerInfer
 * 5.3 keeps dense layers on the GPU). Their arithmetic is
 * the CPU forward pass's (libhyb/forward/forward.c): the CPU device runs the very
 * same code and gives the same bits (attention over 512+ positions excepted:
 * there the CPU pass splits positions between its threads as llama.cpp does,
 * the device does not); CUDA agrees up to float summation order and the F16
 * rounding of its own accumulators.
 */

/* y[0..n) = x / rms(x) * w, all float (hyb_rmsnorm). y may equal x. */
int hyb_device_rmsnorm(struct hyb_device *d, enum hyb_stream s, hyb_dptr y, hyb_dptr x,
		       hyb_dptr w, uint32_t n, float eps);
/* The same for rows vectors of n: x and y are [rows][n], w is [n]. */
int hyb_device_rmsnorm_rows(struct hyb_device *d, enum hyb_stream s, hyb_dptr y, hyb_dptr x,
			    hyb_dptr w, uint32_t n, uint32_t rows, float eps);

/*
 * y (= or +=) W x: W is n_out rows of n_in elements of `type`, GGUF row layout,
 * rows contiguous (a weight copied from the model file as is). x is first
 * rounded to the type's dot format, as the CPU does (Q8_0 for the 32-blocks,
 * Q8_K for the K-quants and IQ4_XS, F16 for F16, none for F32). With accumulate, y[r] += (W x)[r], the dot
 * product rounded to float first (the CPU's "matmul, then add the residual").
 */
struct hyb_dev_matvec {
	uint32_t type;          /* hyb_device_matvec_type_ok(): every type but BF16 */
	uint32_t n_in, n_out;   /* n_in a multiple of the type's block (256 for K) */
	hyb_dptr w;             /* n_out * hyb_row_bytes(type, n_in) bytes */
	hyb_dptr x;             /* float [n_in] */
	hyb_dptr y;             /* float [n_out]; must not overlap x */
	bool accumulate;
	uint32_t batch;         /* 0 or 1: one column; n: x is [n][n_in], y [n][n_out] */
};
int hyb_device_matvec(struct hyb_device *d, enum hyb_stream s, const struct hyb_dev_matvec *m);
/*
 * n matvecs in one kernel launch: items of one type, n_in, n_out,
 * accumulate and batch, each with its own w, x and y, whose results are the
 * n hyb_device_matvec calls' bit for bit. No item's y may overlap another
 * item's w, x or y (the launch runs them at once). A layer's device experts
 * take a launch per matrix this way, not one per expert and matrix
 * (docs/MOE.md). At most HYB_DEVICE_GROUP_MAX items.
 */
#define HYB_DEVICE_GROUP_MAX 1024
int hyb_device_matvec_group(struct hyb_device *d, enum hyb_stream s,
			    const struct hyb_dev_matvec *m, uint32_t n);
/* Whether hyb_device_matvec takes weights of `type`. */
bool hyb_device_matvec_type_ok(uint32_t type);

/*
 * Matvecs listed in device memory, read when the kernel runs: a graph's
 * step, where the router's choice is known only then (docs/DEVICE.md
 * "Graphs"). items: a uint32 count, then count triples (slot, x row, y
 * row); item i is hyb_device_matvec of type, n_in, n_out and accumulate
 * over w + slot * w_stride, x + row * 4 n_in and y + row * 4 n_out, with
 * its bits. Indices, not addresses: whatever the list holds, the kernel
 * touches nothing outside the arrays given here. A count above max, a slot
 * >= n_w, a row >= n_x or n_y, or two items writing one y row fault the
 * device (-EIO at the next call that waits); a bad item writes nothing
 * (the CPU device checks the whole list first and writes nothing at all).
 */
struct hyb_dev_matvec_table {
	uint32_t type;            /* hyb_device_matvec_type_ok() */
	uint32_t n_in, n_out;
	bool accumulate;
	hyb_dptr w;               /* n_w slots w_stride apart (a multiple of 16) */
	uint64_t w_stride;
	uint32_t n_w;
	hyb_dptr x;               /* float [n_x][n_in] */
	uint32_t n_x;
	hyb_dptr y;               /* float [n_y][n_out], disjoint from x, w, items */
	uint32_t n_y;
	hyb_dptr items;           /* uint32 [1 + 3 max], 4-byte aligned */
	uint32_t max;             /* 1 .. HYB_DEVICE_GROUP_MAX */
};
int hyb_device_matvec_table(struct hyb_device *d, enum hyb_stream s,
			    const struct hyb_dev_matvec_table *t);

/*
 * TEAL's input-sparse projection (docs/SPARSITY.md#teal; libhyb/sparse/teal.h):
 *   y[0..n_out) = sum over inputs i with |x[i]| > thr of x[i] * row_i,
 * the inputs in increasing order, W stored transposed as TEAL's layout
 * keeps it: n_in rows of n_out elements of `type`, a row per input. Only
 * the rows of the inputs above thr are read. The CPU device gives
 * hyb_teal_gemv's bits (its int8-rounded products where the CPU's level has
 * them); CUDA multiplies in float, so it agrees up to that rounding.
 */
struct hyb_dev_teal {
	uint32_t type;          /* hyb_device_teal_type_ok(): F32, F16, Q8_0, Q4_0 */
	uint32_t n_in, n_out;   /* n_out a multiple of the type's block */
	uint64_t row_bytes;     /* the rows' stride: 0 (hyb_row_bytes(type, n_out)) or more,
				 * a multiple of 4 (TEAL's layout pads rows to 64 bytes) */
	hyb_dptr w;             /* n_in rows at the stride (the last one's n_out elements) */
	hyb_dptr x;             /* float [n_in] */
	float thr;              /* finite, >= 0 */
	hyb_dptr y;             /* float [n_out]; must not overlap x */
	uint32_t batch;         /* 0 or 1: one row; n: x [n][n_in] and y [n][n_out], each
				 * row with its own inputs, its bits one row's (the CPU
				 * device reads the rows their union needs once) */
};
int hyb_device_teal_matvec(struct hyb_device *d, enum hyb_stream s, const struct hyb_dev_teal *t);
bool hyb_device_teal_type_ok(uint32_t type);

/*
 * One decode token's self-attention over a KV cache in device memory:
 *   1. RoPE on q and k at position pos (hyb_rope's arithmetic); with
 *      q_scale, q *= q_scale after it (Gemma's query_pre_attn_scalar);
 *   2. k and v rounded to F16 into row pos of kcache and vcache;
 *   3. each query head h attends over rows 0..pos of kv head
 *      h / (n_head / n_head_kv) (with n_swa, a sliding window: the last
 *      n_swa of them), scores scaled by 1/sqrt(head_dim) (by 1 with
 *      q_scale), softmax, the weighted sum of V into out (heads
 *      concatenated).
 * q and k are modified (roped) in place. Rows after pos are not read.
 * forward.c's attention with the same options (docs/MODELS.md).
 */
struct hyb_dev_attn {
	uint32_t n_head, n_head_kv, head_dim, n_rot;  /* n_head a multiple of n_head_kv */
	const struct hyb_rope *rope;  /* host memory (hyb/model.h), read during the call */
	bool rope_neox;
	uint32_t pos, n_ctx;          /* the caches hold n_ctx rows; pos < n_ctx */
	hyb_dptr q;                   /* float [n_head * head_dim] */
	hyb_dptr k, v;                /* float [n_head_kv * head_dim] each */
	hyb_dptr kcache, vcache;      /* F16 [n_ctx][n_head_kv * head_dim] each */
	hyb_dptr out;                 /* float [n_head * head_dim], not overlapping q, k, v */
	float q_scale;                /* 0: none; else finite and > 0 */
	uint32_t n_swa;               /* 0: every row to pos */
	/*
	 * 0, or the device address of a uint32 holding the position, read when
	 * the kernel runs, so a graph's step attends at the step's position
	 * (docs/DEVICE.md "Graphs"); pos is then ignored, and batch must be 0
	 * or 1. A position >= n_ctx found there faults the device.
	 */
	hyb_dptr pos_at;
	/*
	 * 0 or 1: one token; n: a prompt batch, q, k, v and out [n][...], token
	 * t at position pos + t (pos + n <= n_ctx), attending over rows
	 * 0..pos + t (causal): each token's steps as above, in token order.
	 */
	uint32_t batch;
};
int hyb_device_attention(struct hyb_device *d, enum hyb_stream s, const struct hyb_dev_attn *a);

/*
 * A layer's activation predictor (PowerInfer 4.3; KAIROX 5.1 runs it on the
 * GPU beside the attention output it reads): x is scaled to unit RMS
 * (hyb_unit_rms; with raw_x it is taken as it is) and rounded to F16, then
 * hyb_predictor_run's arithmetic: h = relu(fc1 x + b1), logits = b2 + sum
 * over h_u > 0 of h_u fc2[u]; the indices with logit > 0 go to active in
 * increasing order and their number to *count. The CPU device gives
 * hyb_predictor_run's bits on the same (unit-RMS or raw) input.
 */
struct hyb_dev_predict {
	uint32_t n_in, hidden, n_out;  /* n_in a multiple of 32 */
	hyb_dptr fc1_w;                /* F16 [hidden][n_in] */
	hyb_dptr fc1_b;                /* float [hidden] */
	hyb_dptr fc2_w;                /* F16 [hidden][n_out] (a row per hidden unit) */
	hyb_dptr fc2_b;                /* float [n_out], the threshold folded in */
	hyb_dptr x;                    /* float [n_in], read only */
	hyb_dptr active;               /* uint32 [n_out] */
	hyb_dptr count;                /* uint32 [1] */
	hyb_dptr logits;               /* float [n_out], or 0: the scores as well (the
					* load-aware thresholds read them, docs/BALANCER.md) */
	/* x as it is, no unit RMS: PowerInfer's predictors (HYB_PRED_SAME_LAYER,
	 * hyb/model.h). false (the default): unit RMS first (HYB_PRED_ADJACENT). */
	bool raw_x;
};
int hyb_device_predict(struct hyb_device *d, enum hyb_stream s, const struct hyb_dev_predict *p);

/* ---- statistics --------------------------------------------------------------- */

struct hyb_device_stats {
	uint64_t h2d_bytes[HYB_N_STREAMS], d2h_bytes[HYB_N_STREAMS];
	uint64_t copies[HYB_N_STREAMS];
	uint64_t kernels;
	uint64_t kernel_bytes;   /* bytes the kernels move in device memory (modelled on cpu) */
	double copy_busy_s;      /* link time spent copying (cpu: modelled; cuda: 0) */
	double kernel_busy_s;    /* compute engine busy (cpu: modelled; cuda: 0) */
	double inline_s;         /* cpu: real time spent executing device work inline */
};
void hyb_device_stats(const struct hyb_device *d, struct hyb_device_stats *out);
void hyb_device_stats_reset(struct hyb_device *d);

#endif
