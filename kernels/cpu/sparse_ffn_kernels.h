/* SPDX-License-Identifier: MIT */
/*
 * Neuron-aware sparse FFN kernels (PowerInfer §5.4, digest_003 §2.5): they
 * work on individual weight rows picked by a list of pointers, never on a
 * matrix, so a predicted-active neuron costs its three rows and nothing
 * else (no dense<->sparse conversion, no temporary dense matrix).
 *
 *   dot:  out[i] = row_i · x         (the gate and up rows of a neuron)
 *   axpy: y += sum_i h[i] * row_i    (the down row of a neuron, stored
 *                                     transposed in the plan's bundles)
 *
 * Single-threaded; libhyb/sparse/sparse_op.c splits a layer's neurons across
 * threads and owns the bundle layout. Like the dense kernels
 * (cpu_kernels.h) every ISA level has a full table whose entries fall back
 * to the level below, down to the scalar reference. F32, F16, Q8_0 and
 * Q4_0 have hand-written kernels per level; the types of
 * HYB_SPARSE_GEN_TYPES go through sparse_ffn_generic.h (the dot is the
 * dense GEMV on each row, the axpy dequantizes and adds). Block layouts
 * are blocks.h's.
 *
 * Arithmetic: x is xn converted once per call exactly as the dense matmul
 * converts it (hyb_vec_dot_type(): F16 for F16, Q8_0 for Q4_0/Q8_0, Q8_1
 * or Q8_K for the others), and a quantized dot is an exact integer dot per
 * block scaled by the block scales, as in the dense kernels; the summation
 * order across blocks differs between levels (tests compare them with
 * tolerances, not bits).
 * The axpy dequantizes block by block and adds h * w into y in float,
 * except where a level says axpy_rounds (below): then it rounds h times
 * the block scale to int8, as the dense down GEMV rounds h to Q8_0.
 */
#ifndef HYB_SPARSE_FFN_KERNELS_H
#define HYB_SPARSE_FFN_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cpu_kernels.h"

/*
 * The weight types whose kernels are sparse_ffn_generic.h's, as X(name,
 * type id): the 32-element blocks, then the K-quants (256-element blocks:
 * a row of n_embd needs n_embd % 256 == 0, which hyb_row_bytes() checks).
 */
#define HYB_SPARSE_GEN_TYPES(X)                                                             \
	X(q4_1, HYB_TYPE_Q4_1)                                                              \
	X(q5_0, HYB_TYPE_Q5_0)                                                              \
	X(q5_1, HYB_TYPE_Q5_1)                                                              \
	X(iq4_nl, HYB_TYPE_IQ4_NL)                                                          \
	X(q2_k, HYB_TYPE_Q2_K)                                                              \
	X(q3_k, HYB_TYPE_Q3_K)                                                              \
	X(q4_k, HYB_TYPE_Q4_K)                                                              \
	X(q5_k, HYB_TYPE_Q5_K)                                                              \
	X(q6_k, HYB_TYPE_Q6_K)                                                              \
	X(iq4_xs, HYB_TYPE_IQ4_XS)

/* Most rows one dot/axpy call computes (callers batch neurons in chunks of this). */
#define HYB_SPARSE_MAX_ROWS 64
/* Most look-ahead rows (n_pf below) a call prefetches: two tiles of four. */
#define HYB_SPARSE_PF_ROWS 8

/*
 * One 32-block of a Q8_0 activation, unpacked for the int8 dot kernels:
 * the quants; minus the weight type's zero point z times their sums by
 * groups of 4 (lane l of a 32-bit dot holds products 4l..4l+3), which pays
 * the zero point back (dot(q - z, x) = dot(q, x) - z * sum(x); z is Q4_0's
 * 8, or 128 for Q8_0 weights made unsigned for vpdpbusd) as the initial
 * value of the integer accumulator; and the scale as a float.
 */
struct hyb_sparse_xblk {
	int8_t q[32];
	int32_t corr[8];
	float d;
};

/*
 * Four consecutive blocks of a Q8_0 activation, for kernels that take four
 * weight blocks of a row per 512-bit vector pair. For Q4_0 weights (one
 * block per 128-bit lane) lane j of lo holds elements 0-15 of block j (the
 * low nibbles'), of hi elements 16-31; 32-bit lane 4j + l of init is the
 * zero-point payback (as struct hyb_sparse_xblk's corr) of the activations
 * that lane multiplies in lo and hi together. For Q8_0 weights (one block
 * per 256-bit half) lo holds blocks 0 and 1, hi blocks 2 and 3, init and
 * init2 their corr. d[4j + r] is block j's scale (repeated for four rows).
 */
struct hyb_sparse_xquad {
	int8_t lo[64], hi[64];
	int32_t init[16], init2[16];
	float d[16];
};

/* xn prepared for the dot kernels of one weight type (hyb_sparse_prep_x()). */
struct hyb_sparse_x {
	uint32_t type;                      /* weight type */
	const void *q;                      /* xn in hyb_vec_dot_type(type) */
	const struct hyb_sparse_xblk *blk;  /* Q8_0 activations only, else NULL */
	const float *xd;                    /* Q8_0: blk[i].d again, contiguous (+16 zeros) */
	const struct hyb_sparse_xquad *quad; /* Q8_0: blocks 4i..4i+3, k / 128 of them */
	/*
	 * The dense GEMV of the level whose converter prepared x (its
	 * gemm_m1[type]): the generic dots run each row through it.
	 */
	hyb_gemm_fn gemv;
};

/* rows[0..n) (n <= HYB_SPARSE_MAX_ROWS), k elements each (k a multiple of the block size). */
typedef void (*hyb_sparse_dot_fn)(int64_t k, const void *const *rows, int n,
				  const struct hyb_sparse_x *x, float *out);
typedef void (*hyb_sparse_axpy_fn)(int64_t k, const void *const *rows, const float *h, int n,
				   float *y);
/*
 * The same, where rows[n..n+n_pf) (n_pf <= HYB_SPARSE_PF_ROWS) are the rows
 * the caller reads next: they are only prefetched, while the last tiles of
 * this call run, so that no call starts on rows still in DRAM (scattered
 * rows give the hardware prefetcher nothing to follow).
 */
typedef void (*hyb_sparse_dot_pf_fn)(int64_t k, const void *const *rows, int n, int n_pf,
				     const struct hyb_sparse_x *x, float *out);
typedef void (*hyb_sparse_axpy_pf_fn)(int64_t k, const void *const *rows, const float *h,
				      int n, int n_pf, float *y);

/*
 * Rows an axpy that rounds (hyb_sparse_kernels.axpy_rounds) puts on one
 * scale: rows 4i .. 4i+3 of each call.
 */
#define HYB_SPARSE_AXPY_TILE 4

struct hyb_sparse_kernels {
	enum hyb_isa isa;
	const char *name;
	/*
	 * By weight type: the axpy rounds the products a_rb = h_r * d_rb (d_rb
	 * the scale of block b of row r) to int8, on one scale per tile of
	 * HYB_SPARSE_AXPY_TILE rows and block, S_b = max |a_rb| / 127, and adds
	 * S_b * sum_r round(a_rb / S_b) * (q_r - zero point) in integers: each
	 * a_rb is off by S_b / 2 at most, as the dense down GEMV's Q8_0 h is
	 * off by half its block's step. false: float h * w, nothing rounded.
	 */
	bool axpy_rounds[HYB_TYPE_COUNT];
	/* by weight type; NULL: not supported */
	hyb_sparse_dot_fn dot[HYB_TYPE_COUNT];
	hyb_sparse_axpy_fn axpy[HYB_TYPE_COUNT];
	hyb_sparse_dot_pf_fn dot_pf[HYB_TYPE_COUNT];
	hyb_sparse_axpy_pf_fn axpy_pf[HYB_TYPE_COUNT];
	/*
	 * By weight type, NULL where the level has none: axpys that round
	 * every level's way of axpy_rounds (int8 products, a scale per tile of
	 * HYB_SPARSE_AXPY_TILE rows and block), faster where the float axpy is
	 * compute-bound; for callers held to that rounding (TEAL's GEMV,
	 * libhyb/sparse/teal.c).
	 */
	hyb_sparse_axpy_pf_fn axpy_i8_pf[HYB_TYPE_COUNT];
};

/* NULL when this CPU cannot run that level. */
const struct hyb_sparse_kernels *hyb_sparse_kernels(enum hyb_isa isa);
/* The level of hyb_cpu_best() (which honours HYB_ISA). */
const struct hyb_sparse_kernels *hyb_sparse_best(void);

/* The weight types the sparse kernels take: those the scalar table has a dot and an axpy for. */
bool hyb_sparse_type_ok(uint32_t type);
/* Their names, space separated ("F32 F16 Q8_0 ..."), for error messages. */
const char *hyb_sparse_type_list(void);

/* Bytes of scratch hyb_sparse_prep_x() needs for k elements (any supported type). */
size_t hyb_sparse_x_bytes(int64_t k);

/*
 * Convert xn (k floats) for the dot kernels of weight type `type` with the
 * activation converter of `ck` (the dense path's: hyb_cpu_best()), into buf
 * (hyb_sparse_x_bytes(k) bytes, 64-byte aligned). Returns -1 for an
 * unsupported type, a k that is not a multiple of the block size (256 for
 * the K-quants) or a level without that type's activation converter or GEMV.
 */
int hyb_sparse_prep_x(const struct hyb_cpu_kernels *ck, uint32_t type, const float *xn,
		      int64_t k, void *buf, struct hyb_sparse_x *out);

/* Internal: per-ISA table fillers (sparse_ffn_{avx2,avx512,avx512vnni}.c). */
void hyb_sparse_fill_avx2(struct hyb_sparse_kernels *k);
void hyb_sparse_fill_avx512(struct hyb_sparse_kernels *k);
void hyb_sparse_fill_avx512vnni(struct hyb_sparse_kernels *k);

#endif
