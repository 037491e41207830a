/* SPDX-License-Identifier: MIT */
/*
 * Glue between the files of kernels/cpu: the scalar reference functions that
 * every table starts from, the per-ISA table fillers, and the scratch memory
 * the packing GEMMs work in. Not part of the public contract.
 */
#ifndef HYB_CPU_INTERNAL_H
#define HYB_CPU_INTERNAL_H

#include "blocks.h"
#include "cpu_kernels.h"

#define HYB_GEMM_ARGS int64_t k, const void *w, size_t w_stride, int64_t nrows, \
	const void *x, size_t x_stride, int64_t ncols, float *y, size_t y_stride

/*
 * Empty products, for the SIMD entry points: nothing to do for no rows or
 * columns, zeros for k == 0 (the packed paths would otherwise write
 * nothing). Returns 1 when the call is done.
 */
static inline int hyb_gemm_trivial(int64_t k, int64_t nrows, int64_t ncols, float *y,
				   size_t y_stride)
{
	if (nrows > 0 && ncols > 0 && k > 0)
		return 0;
	for (int64_t c = 0; c < ncols && k <= 0; c++)
		for (int64_t r = 0; r < nrows; r++)
			y[c * y_stride + r] = 0.0f;
	return 1;
}

/* a kernel whose arithmetic does not depend on the weight's row count serves all three tables */
static inline void hyb_set_gemm(struct hyb_cpu_kernels *k, uint32_t type, hyb_gemm_fn f)
{
	k->gemm[type] = f;
	k->gemm_m4[type] = f;
	k->gemm_m1[type] = f;
}

/* gemm_scalar.c: per block integer dot then scale, as llama.cpp's generic code */
void hyb_gemm_f32_scalar(HYB_GEMM_ARGS);
void hyb_gemm_f16_scalar(HYB_GEMM_ARGS);
void hyb_gemm_bf16_scalar(HYB_GEMM_ARGS);
void hyb_gemm_q4_0_scalar(HYB_GEMM_ARGS);
void hyb_gemm_q8_0_scalar(HYB_GEMM_ARGS);
void hyb_gemm_q4_1_scalar(HYB_GEMM_ARGS);
void hyb_gemm_q5_0_scalar(HYB_GEMM_ARGS);
void hyb_gemm_q5_1_scalar(HYB_GEMM_ARGS);
void hyb_gemm_iq4_nl_scalar(HYB_GEMM_ARGS);
/*
 * gemm_mxfp4.c: MXFP4 as llama.cpp's x86 build sums it: rows % 8 == 0 its
 * repacked GEMV/GEMM (one float chain of whole-block dots per output),
 * otherwise its vec_dot; its SIMD levels (gemm_mxfp4_simd.h)
 */
void hyb_gemm_mxfp4_chain_scalar(HYB_GEMM_ARGS);
void hyb_gemm_mxfp4_vecdot_scalar(HYB_GEMM_ARGS);
void hyb_fill_mxfp4_avx2(struct hyb_cpu_kernels *k);
void hyb_fill_mxfp4_avx512vnni(struct hyb_cpu_kernels *k);
void hyb_gemm_q4_k_scalar(HYB_GEMM_ARGS);
void hyb_gemm_q6_k_scalar(HYB_GEMM_ARGS);
/* kquant_extra.c: Q2_K, Q3_K, Q5_K, IQ4_XS (gemm and dequantize, scalar level) */
void hyb_gemm_q2_k_scalar(HYB_GEMM_ARGS);
void hyb_gemm_q3_k_scalar(HYB_GEMM_ARGS);
void hyb_gemm_q5_k_scalar(HYB_GEMM_ARGS);
void hyb_gemm_iq4_xs_scalar(HYB_GEMM_ARGS);
void hyb_fill_k_extra_scalar(struct hyb_cpu_kernels *k);
/* gemm_k_extra_*.c: their SIMD levels */
void hyb_fill_k_extra_avx2(struct hyb_cpu_kernels *k);
void hyb_fill_k_extra_avx512(struct hyb_cpu_kernels *k);
void hyb_fill_k_extra_avx512vnni(struct hyb_cpu_kernels *k);
void hyb_fill_k_extra_amx(struct hyb_cpu_kernels *k);
/* the packed prefill of Q2_K/Q3_K/Q5_K/IQ4_XS (gemm_q_avx512_body.h): 0 done, -1 not */
int hyb_gemm_kx_packed_avx512(uint32_t type, int repacked, HYB_GEMM_ARGS);
int hyb_gemm_kx_packed_avx512vnni(uint32_t type, int repacked, HYB_GEMM_ARGS);
int hyb_gemm_kx_packed_amx(uint32_t type, int repacked, HYB_GEMM_ARGS);
/* MXFP4's packed prefill (VNNI levels, 4+ columns, rows % 8 == 0): 0 done, -1 not */
int hyb_gemm_mxfp4_packed_avx512(HYB_GEMM_ARGS);
int hyb_gemm_mxfp4_packed_avx512vnni(HYB_GEMM_ARGS);
int hyb_gemm_mxfp4_packed_amx(HYB_GEMM_ARGS);
/* quant_ref_k_extra.c: their reference quantizers; -1 for another type */
int hyb_quantize_k_extra_ref(uint32_t type, const float *x, void *out, int64_t n);
/* quant_ref.c: llama.cpp's make_qkx2_quants, for quant_ref_k_extra.c */
float hyb_make_qkx2_quants(int n, int nmax, const float *x, const float *weights, uint8_t *L,
			   float *the_min, uint8_t *Laux, float rmin, float rdelta, int nstep,
			   int use_mad);
/* quant_ref.c: ggml-quants.c best_index_int8, the level of val (n ascending) nearest x */
int hyb_best_index_int8(int n, const int8_t *val, float x);
/*
 * quant_ref.c: a Q4_K/Q5_K super-block's scales and mins (6-bit packed into
 * s, d, dmin) and its elements' levels 0..nmax into L; rmin and nstep are
 * make_qkx2_quants' search (Q4_K: 15, -1, 20; Q5_K: 31, -0.5, 15).
 */
void hyb_quantize_q45k_levels(const float *x, int nmax, float rmin, int nstep, uint8_t s[12],
			      uint16_t *d, uint16_t *dmin, uint8_t L[HYB_QK_K]);

/* quant_act.c: activation converters */
void hyb_quantize_f32_scalar(const float *x, void *out, int64_t n);
void hyb_quantize_f16_scalar(const float *x, void *out, int64_t n);
void hyb_quantize_bf16_scalar(const float *x, void *out, int64_t n);
void hyb_quantize_q8_0_scalar(const float *x, void *out, int64_t n);
void hyb_quantize_q8_1_scalar(const float *x, void *out, int64_t n);
void hyb_quantize_q8_k_scalar(const float *x, void *out, int64_t n);

/* dequant.c */
void hyb_dequantize_f32(const void *in, float *out, int64_t n);
void hyb_dequantize_f16(const void *in, float *out, int64_t n);
void hyb_dequantize_bf16(const void *in, float *out, int64_t n);
void hyb_dequantize_q4_0(const void *in, float *out, int64_t n);
void hyb_dequantize_q8_0(const void *in, float *out, int64_t n);
void hyb_dequantize_q4_1(const void *in, float *out, int64_t n);
void hyb_dequantize_q5_0(const void *in, float *out, int64_t n);
void hyb_dequantize_q5_1(const void *in, float *out, int64_t n);
void hyb_dequantize_iq4_nl(const void *in, float *out, int64_t n);
void hyb_dequantize_mxfp4(const void *in, float *out, int64_t n);
void hyb_dequantize_q8_1(const void *in, float *out, int64_t n);
void hyb_dequantize_q4_k(const void *in, float *out, int64_t n);
void hyb_dequantize_q6_k(const void *in, float *out, int64_t n);
void hyb_dequantize_q8_k(const void *in, float *out, int64_t n);

/* vec_ref.c: llama.cpp's AVX-512 vector primitives, lane by lane */
void hyb_fill_vec_ref(struct hyb_cpu_kernels *k);
/*
 * The leftovers of llama.cpp's soft_max and swiglu past the last whole
 * 16-lane step, which its builds compute with libm's expf: elements [i, n)
 * (soft_max: added to sum in order, which it returns).
 */
double hyb_soft_max_tail(int64_t i, int64_t n, float *y, const float *x, float max,
			 double sum);
void hyb_swiglu_tail(int64_t i, int64_t n, float *y, const float *x, const float *g);
void hyb_geglu_tail(int64_t i, int64_t n, float *y, const float *x, const float *g,
		    const uint16_t *table);

/*
 * Per-ISA table fillers: each overrides the entries its level specialises
 * in a table that already holds the level below.
 */
void hyb_cpu_fill_avx2(struct hyb_cpu_kernels *k);
void hyb_cpu_fill_avx512(struct hyb_cpu_kernels *k);
void hyb_cpu_fill_avx512vnni(struct hyb_cpu_kernels *k);
void hyb_cpu_fill_amx(struct hyb_cpu_kernels *k);
/*
 * 1 when the CPU has AMX-TILE and AMX-INT8, the OS saves the tile state
 * (XCR0 bits 17, 18) and grants it to this process (amx_enable.c)
 */
int hyb_cpu_amx_usable(void);
/* pieces of a level's table that live in other files of that level */
void hyb_fill_f_avx512(struct hyb_cpu_kernels *k);
void hyb_fill_f_avx2(struct hyb_cpu_kernels *k);
void hyb_fill_q_avx2(struct hyb_cpu_kernels *k);
void hyb_fill_q0_extra_avx2(struct hyb_cpu_kernels *k); /* gemm_q0_extra_avx2.c */
void hyb_fill_vec_avx2(struct hyb_cpu_kernels *k);
void hyb_fill_vec_avx512(struct hyb_cpu_kernels *k);
/* pred_*.c and popcount_*.c: predictor and grouping kernels, every level */
void hyb_fill_pred_ref(struct hyb_cpu_kernels *k);
void hyb_fill_pred_avx2(struct hyb_cpu_kernels *k);
void hyb_fill_pred_avx512(struct hyb_cpu_kernels *k);
void hyb_fill_popcount_ref(struct hyb_cpu_kernels *k);
void hyb_fill_popcount_avx2(struct hyb_cpu_kernels *k);
void hyb_fill_popcount_avx512(struct hyb_cpu_kernels *k);
/* select_*.c: the load-aware thresholds' passes (scalar; AVX-512) */
void hyb_fill_select_ref(struct hyb_cpu_kernels *k);
void hyb_fill_select_avx512(struct hyb_cpu_kernels *k);

/*
 * pred_avx*.c: panel_gemm from a register-tiled microkernel of nc_big
 * columns and a one-column one for the rest (same arguments as panel_gemm
 * less the column count).
 */
typedef void (*hyb_panel_mk_fn)(int64_t k, const float *ap, const float *x, size_t xc, size_t xk,
				float *y, size_t ys, unsigned nr, int acc);

static inline void hyb_panel_columns(hyb_panel_mk_fn big, int64_t nc_big, hyb_panel_mk_fn one,
				     int64_t k, const float *ap, const float *x, size_t xc,
				     size_t xk, float *y, size_t ys, unsigned nr, int acc,
				     int64_t nc)
{
	int64_t c = 0;

	for (; c + nc_big <= nc; c += nc_big)
		big(k, ap, x + c * xc, xc, xk, y + c * ys, ys, nr, acc);
	for (; c < nc; c++)
		one(k, ap, x + c * xc, xc, xk, y + c * ys, ys, nr, acc);
}

/* peak_*.c: seconds-bounded register-only loops; multiply-adds per second */
enum hyb_peak_kind { HYB_PEAK_FMA, HYB_PEAK_INT8 };
double hyb_peak_avx2(enum hyb_peak_kind kind);
double hyb_peak_avx512(enum hyb_peak_kind kind);
double hyb_peak_avx512vnni(enum hyb_peak_kind kind);
double hyb_peak_scalar(enum hyb_peak_kind kind);

/*
 * scratch.c: a 64-byte aligned per-thread buffer for packing; `slot` picks
 * one of a few independent buffers. Contents are not preserved across calls
 * with a larger size. NULL when out of memory.
 */
enum { HYB_SCRATCH_X, HYB_SCRATCH_W, HYB_SCRATCH_P, HYB_SCRATCH_D, HYB_SCRATCH_N };
void *hyb_cpu_scratch(int slot, size_t bytes);

/* dispatch.c: the CPU has GFNI beside AVX-512 (kernels use it in asm, behind this check) */
int hyb_cpu_gfni(void);

#endif
