/* SPDX-License-Identifier: MIT */
/*
 * CPU compute kernels: conversion, (de)quantization and the matrix kernels
 * that the forward pass spends its time in. Block layouts are llama.cpp's
 * (ggml-common.h) so GGUF tensors are used in place.
 *
 * Every ISA level has a full table; entries an ISA does not specialise fall
 * back to the level below, down to the scalar reference. hyb_cpu_best()
 * picks the best level the running CPU supports (cpuid + xgetbv), or the
 * one named by the HYB_ISA environment variable (scalar|avx2|avx512|avx512vnni|amx).
 */
#ifndef HYB_CPU_KERNELS_H
#define HYB_CPU_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hyb/tensor_type.h"

enum hyb_isa {
	HYB_ISA_SCALAR,
	HYB_ISA_AVX2,        /* AVX2 + FMA + F16C + POPCNT */
	HYB_ISA_AVX512,      /* F + BW + VL + DQ */
	HYB_ISA_AVX512_VNNI, /* + VNNI */
	HYB_ISA_AMX,         /* + AMX-TILE, AMX-INT8, the OS's tile state granted */
	HYB_ISA_COUNT
};

/*
 * Y = W · X over a block of rows and columns.
 *   W: nrows rows of k elements of the weight type, row r at w + r*w_stride bytes.
 *   X: ncols activation vectors of k elements, already converted to
 *      hyb_vec_dot_type(weight type), column c at x + c*x_stride bytes.
 *   Y: float, y[c*y_stride + r] (y_stride in floats).
 * k is a multiple of the weight type's block size. ncols == 1 is the decode
 * GEMV; ncols > 1 is prefill and must reuse each loaded weight block across
 * columns (register tiling), not loop the GEMV. On the AVX-512 levels every
 * output is summed in the order llama.cpp's x86 build sums it for the same
 * ncols and weight row count (see gemm[] below), bit for bit: the caller
 * must pass all columns of a batch in one call, as llama.cpp sees them.
 */
typedef void (*hyb_gemm_fn)(int64_t k, const void *w, size_t w_stride, int64_t nrows,
			    const void *x, size_t x_stride, int64_t ncols,
			    float *y, size_t y_stride);
/* Convert n floats to the activation format (F32 copy, F16, BF16, Q8_0, Q8_1, Q8_K). */
typedef void (*hyb_quantize_fn)(const float *x, void *out, int64_t n);
typedef void (*hyb_dequantize_fn)(const void *in, float *out, int64_t n);

struct hyb_cpu_kernels {
	enum hyb_isa isa;
	const char *name;
	/*
	 * By weight type. llama.cpp picks a matmul's summation order from the
	 * whole weight's row count (ne1), which a call on a chunk of rows cannot
	 * see: gemm[] is for weights with ne1 % 8 == 0 (every matrix of real
	 * models; its Q4_0/Q4_K are repacked), gemm_m4[] for ne1 % 8 == 4,
	 * gemm_m1[] for ne1 % 4 != 0. Use hyb_gemm_pick().
	 */
	hyb_gemm_fn gemm[HYB_TYPE_COUNT];
	hyb_gemm_fn gemm_m4[HYB_TYPE_COUNT];
	hyb_gemm_fn gemm_m1[HYB_TYPE_COUNT];
	hyb_quantize_fn quantize_act[HYB_TYPE_COUNT]; /* by activation (vec_dot) type */
	hyb_dequantize_fn dequantize[HYB_TYPE_COUNT]; /* by weight type */

	/*
	 * llama.cpp's vector primitives, in the summation order of its AVX-512
	 * build (ggml-cpu vec.h, vec.cpp, simd-gemm.h): attention and the FFN
	 * activation use them so that their results are llama.cpp's bit for bit.
	 * The scalar level emulates that order lane by lane; AVX2 keeps it with
	 * pairs of 8-lane registers (vec_avx2.c).
	 */
	/* ggml_vec_dot_f16: sum of x[i]*y[i] over two F16 vectors */
	float (*dot_f16)(int64_t n, const uint16_t *x, const uint16_t *y);
	/* ggml_vec_mad_f16: y[i] = f16(x[i]*v + y[i]), one rounding to float (fused) */
	void (*mad_f16)(int64_t n, uint16_t *y, const uint16_t *x, float v);
	/* ggml_vec_scale_f16: y[i] = f16(y[i]*v) */
	void (*scale_f16)(int64_t n, uint16_t *y, float v);
	/* simd_gemm: c[m][n] += a[m][k] * b[k][n], one fused multiply-add per k, in k order */
	void (*gemm_acc)(float *c, const float *a, const float *b, int m, int k, int n);
	/* ggml_vec_soft_max_f32: y[i] = exp(x[i] - max) (ggml_v_expf); returns the sum */
	double (*soft_max)(int64_t n, float *y, const float *x, float max);
	/* ggml_vec_swiglu_f32: y[i] = silu(x[i]) * g[i] (ggml_v_silu) */
	void (*swiglu)(int64_t n, float *y, const float *x, const float *g);
	/*
	 * ggml_vec_geglu_f32 (GGML_GELU_FP16): y[i] = 0 for x[i] <= -10,
	 * x[i] * g[i] for x[i] >= 10, else f32(table[f16(x[i])]) * g[i];
	 * table: GELU of every F16 value, with one padding entry after the 65536
	 */
	void (*geglu)(int64_t n, float *y, const float *x, const float *g, const uint16_t *table);

	/*
	 * Activation predictors (PowerInfer 5.1: run by libhyb/sparse/predictor.c,
	 * trained by the planner) and co-activation grouping (KAIROX 5.2). No
	 * llama.cpp order to keep here: each level sums in its own way (with or
	 * without FMA), the same way on every run (pred_*.c, popcount_*.c).
	 */
	/*
	 * One panel of HYB_PANEL weight rows packed k-major, ap[k * HYB_PANEL + i]
	 * (64-byte aligned; rows from nr on zero), times ncols columns of X whose
	 * element (c, k) is x[c * xc + k * xk]: for i < nr,
	 * y[c * ys + i] = sum over k of ap[k * HYB_PANEL + i] * X(c, k), in k order,
	 * added to y's old value when acc.
	 */
	void (*panel_gemm)(int64_t k, const float *ap, const float *x, size_t xc, size_t xk,
			   float *y, size_t ys, unsigned nr, int acc, int64_t ncols);
	/*
	 * A predictor's second layer over output columns [lo, hi): adds to lg[c]
	 * h[nz[q]] * w[nz[q] * n_out + c] for q < n_nz in order, w F16 rows.
	 */
	void (*fc2_sparse)(float *lg, const uint16_t *w, size_t n_out, const float *h,
			   const uint32_t *nz, uint32_t n_nz, long lo, long hi);
	/* One Adam step (betas 0.9, 0.999, eps 1e-8) on [lo, hi); c1, c2: bias corrections */
	void (*adam)(float *w, const float *g, float *m, float *v, long lo, long hi, float lr,
		     float c1, float c2);
	/* out[j] = popcount(a & b_j) over W words, b_j = cols + live[j] * W, for j < n */
	void (*and_popcount)(const uint64_t *a, const uint64_t *cols, uint32_t W,
			     const uint32_t *live, uint32_t n, uint32_t *out);

	/*
	 * Load-aware thresholds (libhyb/balancer/balancer_select.c), the two
	 * passes over a layer's n predictor scores x; res: bit i of
	 * res[i / 64] says neuron i is cached. sel_scan writes, by increasing
	 * index, the add candidates (cached, !(x > 0), x > -inf) to add[] and
	 * their hyb_sel_add_bin to abin[], the drop candidates (not cached,
	 * x > 0) to drop[] and hyb_sel_drop_bin to dbin[]; their counts to
	 * *na, *nd, and the cached x > 0 to *ng. sel_emit writes to sel[],
	 * increasing, every x > 0 not dropped and every add candidate added;
	 * returns their count. Added: add bin > ba, or == ba and among the
	 * first ka of that bin by index; dropped: drop bin < bd, or == bd and
	 * among the first kd.
	 */
	void (*sel_scan)(const float *x, const uint64_t *res, uint32_t n, uint32_t *add,
			 uint32_t *abin, uint32_t *na, uint32_t *drop, uint32_t *dbin, uint32_t *nd,
			 uint32_t *ng);
	uint32_t (*sel_emit)(const float *x, const uint64_t *res, uint32_t n, int32_t ba,
			     uint32_t ka, int32_t bd, uint32_t kd, uint32_t *sel);
};

/*
 * The load-aware thresholds' bins: HYB_SEL_BINS a side, 1/32 of a logit
 * wide, the outer ones open (beyond -HYB_SEL_RANGE, +HYB_SEL_RANGE). Add
 * bins cover x <= 0 (0 the lowest), drop bins x > 0 (0 the lowest). The
 * float operations are the vector kernels', so every level bins alike.
 */
#define HYB_SEL_BINS 512
#define HYB_SEL_RANGE 16.0f

static inline uint32_t hyb_sel_add_bin(float x)
{
	const float t = (x + HYB_SEL_RANGE) * (HYB_SEL_BINS / HYB_SEL_RANGE);

	return t < 1 ? 0 : t >= HYB_SEL_BINS - 1 ? HYB_SEL_BINS - 1 : (uint32_t)t;
}

static inline uint32_t hyb_sel_drop_bin(float x)
{
	const float t = x * (HYB_SEL_BINS / HYB_SEL_RANGE);

	return t >= HYB_SEL_BINS - 1 ? HYB_SEL_BINS - 1 : (uint32_t)t;
}

/* rows of a panel_gemm panel */
#define HYB_PANEL 32

/* The matmul kernel for a weight of type `type` with ne1 rows (see gemm[] above). */
static inline hyb_gemm_fn hyb_gemm_pick(const struct hyb_cpu_kernels *k, uint32_t type,
					uint64_t ne1)
{
	if (ne1 % 8 == 0)
		return k->gemm[type];
	return ne1 % 4 == 0 ? k->gemm_m4[type] : k->gemm_m1[type];
}

/* ... for a weight llama.cpp does not repack whatever its rows (hyb_weight.flat). */
static inline hyb_gemm_fn hyb_gemm_pick_flat(const struct hyb_cpu_kernels *k, uint32_t type,
					     uint64_t ne1)
{
	return ne1 % 4 == 0 ? k->gemm_m4[type] : k->gemm_m1[type];
}

/*
 * Batch invariance: how many columns one call of the kernel that
 * hyb_gemm_pick (flat: hyb_gemm_pick_flat) gives for this type and row
 * count may take while summing every output exactly as a one-column call
 * does; 0: any number. Where llama.cpp's order changes with the column
 * count (tinyBLAS for floats, repacked or tiled K-quant GEMMs), so do the
 * kernels that match it (tests/unit/test_kernels.c checks every level).
 */
uint32_t hyb_gemm_invariant_cols(const struct hyb_cpu_kernels *k, uint32_t type, uint64_t ne1,
				 bool flat);

/* NULL when this CPU cannot run that level. */
const struct hyb_cpu_kernels *hyb_cpu_kernels(enum hyb_isa isa);
const struct hyb_cpu_kernels *hyb_cpu_best(void);
const char *hyb_isa_name(enum hyb_isa isa);

/* The activation type the weight type's dot product consumes, as in llama.cpp. */
uint32_t hyb_vec_dot_type(uint32_t weight_type);

/* hyb_quantize_row_ref: hyb/tensor_type.h */

/* IEEE half and bfloat16, round-to-nearest-even, as ggml converts them. */
float hyb_f16_to_f32(uint16_t h);
uint16_t hyb_f32_to_f16(float f);
float hyb_bf16_to_f32(uint16_t h);
uint16_t hyb_f32_to_bf16(float f);

/*
 * Peak arithmetic rate of this ISA level for the weight type's inner loop
 * (FMA for float types, int8 dot instructions for quantized types),
 * measured with a register-only loop on one core, in multiply-adds per second.
 */
double hyb_cpu_peak_macs(const struct hyb_cpu_kernels *k, uint32_t weight_type);

#endif
