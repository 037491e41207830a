/* SPDX-License-Identifier: MIT */
/*
 * What a device implementation provides (hyb/device.h is the contract;
 * libhyb/device/device.c checks arguments, keeps the capacity accounting and the
 * error message, and calls these). Included from C and from CUDA C++.
 *
 * What device.c guarantees before calling an op (implementations need not
 * check again): d is not NULL and not faulted (except free, host_unregister,
 * host_free, event_free, close, now, which always run); s < HYB_N_STREAMS;
 * copy lengths > 0 and host pointers not NULL; every device range
 * [p, p + len) of a copy, add, ffn_act, sparse_ffn, rmsnorm, matvec or attention
 * argument lies inside one live allocation, float/int32 arguments 4-byte
 * aligned, F16 caches 2-byte aligned; events not NULL; hyb_dev_ffn fields
 * valid (type F32/F16/Q8_0/Q4_0, sizes > 0, n_embd a multiple of the block,
 * act known, slot_bytes >= 3 * group_size * row bytes, table/cache checked
 * only when n_active > 0); rmsnorm: n > 0, eps >= 0 and finite, y equal to
 * or disjoint from x and disjoint from w; matvec: type F32/F16/Q8_0/Q4_0,
 * sizes > 0, n_in a multiple of the block, w aligned to its element (4 F32,
 * else 2), y disjoint from x and w; attention: sizes > 0, n_head_kv divides
 * n_head, head_dim even and <= 256, n_rot even and <= head_dim, pos <
 * n_ctx, rope given, its base finite > 0, its scales finite, q, k, v, kcache, vcache
 * and out pairwise disjoint; predict: sizes > 0, n_in a multiple of 32,
 * weights 2-byte aligned, active and count disjoint from each other and from
 * every input; alloc: 0 < bytes <= capacity - used.
 * device.c keeps: used (sum of the bytes asked by live allocations), the
 * table of live allocations (ops->free is called while it still lists p, so
 * hyb_device_span(d, p) gives the size; close is called after every live
 * allocation was given back through ops->free), stats h2d_bytes, d2h_bytes,
 * copies, kernels (counted after an op succeeded). The implementation keeps
 * kernel_bytes, copy_busy_s, kernel_busy_s, inline_s.
 */
#ifndef HYB_DEVICE_INTERNAL_H
#define HYB_DEVICE_INTERNAL_H

#include "hyb/device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* forward/ops.c: ggml's F16 GELU table [65536], for the device's GeGLU */
const uint16_t *hyb_gelu_f16_table(void);

struct hyb_device_ops {
	const char *kind;
	void (*close)(struct hyb_device *d);
	double (*now)(struct hyb_device *d);
	int (*alloc)(struct hyb_device *d, uint64_t bytes, hyb_dptr *out);
	void (*free)(struct hyb_device *d, hyb_dptr p);
	int (*host_register)(struct hyb_device *d, void *p, size_t len);
	int (*host_unregister)(struct hyb_device *d, void *p);
	void *(*host_alloc)(struct hyb_device *d, size_t len);
	void (*host_free)(struct hyb_device *d, void *p);
	int (*h2d)(struct hyb_device *d, enum hyb_stream s, hyb_dptr dst, const void *src,
		   uint64_t len);
	int (*d2h)(struct hyb_device *d, enum hyb_stream s, void *dst, hyb_dptr src,
		   uint64_t len);
	struct hyb_device_event *(*event_new)(struct hyb_device *d, bool timed);
	void (*event_free)(struct hyb_device *d, struct hyb_device_event *ev);
	int (*record)(struct hyb_device *d, enum hyb_stream s, struct hyb_device_event *ev);
	int (*wait)(struct hyb_device *d, enum hyb_stream s, struct hyb_device_event *ev);
	bool (*done)(struct hyb_device *d, struct hyb_device_event *ev);
	int (*sync)(struct hyb_device *d, struct hyb_device_event *ev);
	int (*elapsed)(struct hyb_device *d, struct hyb_device_event *a,
		       struct hyb_device_event *b, double *s);
	int (*sparse_ffn)(struct hyb_device *d, enum hyb_stream s, const struct hyb_dev_ffn *f);
	int (*add)(struct hyb_device *d, enum hyb_stream s, hyb_dptr y, hyb_dptr x, uint32_t n);
	int (*ffn_act)(struct hyb_device *d, enum hyb_stream s, hyb_dptr g, hyb_dptr u, uint32_t n,
		       enum hyb_ffn_act act);
	int (*rmsnorm)(struct hyb_device *d, enum hyb_stream s, hyb_dptr y, hyb_dptr x,
		       hyb_dptr w, uint32_t n, uint32_t rows, float eps);
	int (*matvec)(struct hyb_device *d, enum hyb_stream s, const struct hyb_dev_matvec *m);
	/* NULL: hyb_device_matvec_group calls matvec per item (n launches) */
	int (*matvec_group)(struct hyb_device *d, enum hyb_stream s,
			    const struct hyb_dev_matvec *m, uint32_t n);
	int (*matvec_table)(struct hyb_device *d, enum hyb_stream s,
			    const struct hyb_dev_matvec_table *t);
	int (*attention)(struct hyb_device *d, enum hyb_stream s, const struct hyb_dev_attn *a);
	int (*predict)(struct hyb_device *d, enum hyb_stream s, const struct hyb_dev_predict *p);
	int (*teal)(struct hyb_device *d, enum hyb_stream s, const struct hyb_dev_teal *t);
	/* NULL: nothing to do (CUDA: a GPU's host time is real) */
	void (*host_work)(struct hyb_device *d, double s);
	int (*host_fn)(struct hyb_device *d, enum hyb_stream s, hyb_device_host_fn_t fn,
		       void *arg);
	/*
	 * Graphs the implementation's own (CUDA's stream capture); NULL:
	 * device_graph.c records the calls and replays them through the front
	 * end. device.c has checked the capture's rules (membership, joins, the
	 * calls refused) before each op. end with ok false: abandon the capture
	 * (*graph untouched).
	 */
	int (*capture_begin)(struct hyb_device *d, enum hyb_stream s);
	int (*capture_end)(struct hyb_device *d, enum hyb_stream s, bool ok, void **graph);
	int (*graph_launch)(struct hyb_device *d, enum hyb_stream s, void *graph);
	void (*graph_free)(struct hyb_device *d, void *graph);
};

/* The common head of every implementation's device struct. */
struct hyb_device {
	const struct hyb_device_ops *ops;
	struct hyb_device_config cfg;  /* defaults filled in */
	uint64_t capacity, used;
	bool faulted;                  /* a device fault: every later call fails */
	struct hyb_device_stats st;
	char err[256];
	struct hyb_device_allocs *allocs; /* device.c's table of live allocations */
	struct hyb_capture *cap;       /* a capture under way (device_graph.c), else NULL */
};

/* Set d->err (printf-style) and return rc. rc == -EIO also marks d faulted. */
int hyb_device_fail(struct hyb_device *d, int rc, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Bytes from p to the end of the live allocation holding p; 0 when in none. */
uint64_t hyb_device_span(const struct hyb_device *d, hyb_dptr p);

/*
 * The implementations. Each returns a device with ops, cfg, capacity set, or
 * NULL with a reason in err. hyb_device_cuda_open is weak in device.c: a
 * libhyb built without nvcc answers "built without CUDA".
 */
struct hyb_device *hyb_device_cpu_open(const struct hyb_device_config *cfg, char *err,
				       size_t errlen);
struct hyb_device *hyb_device_cuda_open(const struct hyb_device_config *cfg, char *err,
					size_t errlen);

/* libhyb/forward/ops.c: RoPE's cos and sin for one position, which the CUDA device uploads */
void hyb_rope_table(const struct hyb_rope *r, uint32_t n_rot, uint32_t pos, float *cs,
		    float *sn);

#ifdef __cplusplus
}
#endif

#endif
