/* SPDX-License-Identifier: MIT */
/*
 * AVX-512 quantized matrix kernels (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL,
 * Q4_K, Q6_K; the packed prefill of Q2_K, Q3_K, Q5_K, IQ4_XS), written once and
 * compiled three times: by gemm_q_avx512.c with HYB_VNNI 0, by
 * gemm_q_avx512vnni.c with HYB_VNNI 1 and by gemm_q_amx.c with HYB_VNNI 1 and
 * HYB_AMX 1 (the packed kernels' integer dot products on AMX tiles, the same
 * sums). Only those three files include it; the kernels themselves are in
 * gemm_q_avx512_direct_q0.h, gemm_q_avx512_direct_k.h (driver:
 * gemm_q_avx512_direct.h) and gemm_q_avx512_packed.h.
 *
 * Every output is summed as llama.cpp's x86 AVX-512 build sums it (which
 * of its kernels runs depends on the type, the weight's row count and the
 * column count: see the entry points at the end), so that hyb's logits are
 * its logits bit for bit. The integer dot products are exact in any
 * grouping; what has to match is which integer sums are converted to float
 * and how those are scaled and added.
 *
 * Two kernel shapes:
 *
 * - direct (decode GEMV and small batches): DR rows x up to 4 columns read
 *   straight from the GGUF blocks; one zmm holds 64..128 weights of a row
 *   (or 32 of two rows) and is reused by every column of the tile.
 *   Memory-bound at ncols 1, so each tile prefetches the next tile's rows
 *   (rows of a few KiB are too short for the hardware prefetcher to ramp up
 *   on).
 *
 * - packed (prefill): 16-48 rows are repacked into a row-interleaved panel
 *   of unsigned bytes, 16 rows per zmm, 4 consecutive k per 32-bit lane.
 *   One vpdpbusd then multiplies 16 rows by a broadcast 4-byte group of one
 *   activation column: no horizontal sums, and each weight register serves
 *   several columns. Where llama.cpp converts a whole block's (or
 *   super-block's) integer sum (repacked Q4_0/Q4_K, the tiled K-quant
 *   matmul) this costs a few float operations per 8 vpdpbusd; Q8_0's
 *   summation converts every 4-product group, 3 float operations per
 *   vpdpbusd, hence its lower speed.
 *
 * No gathers: on this CPU class a gather whose lines are not in L1 takes
 * ~30 cycles (measured), more than transposing a whole unit.
 *
 * int8 products (why unsigned weights): vpdpbusd multiplies unsigned bytes
 * by signed bytes. Putting the weights on the unsigned side lets Q4_0/Q4_K
 * use their raw nibbles and Q6_K its raw 6-bit codes; the zero point
 * (8, 32, or 128 for Q8_0 flipped by xor 0x80) is paid back through the
 * activation block sums: dot(q - z, x) = dot(q, x) - z * sum(x), and
 * -z*sum(x) only depends on the column, so it is the accumulator's initial
 * value (a broadcast load, no extra instruction). The usual sign trick
 * (|w| times x*sign(w)) would cost a sign flip per product in the packed
 * layout, where x is broadcast and the sign varies by lane.
 *
 * Without VNNI a u8*s8 dot is vpmaddubsw + vpmaddwd + vpaddd; pair sums of
 * vpmaddubsw saturate at 32767, fine for weights <= 127 (nibbles, 6-bit)
 * but not for Q8_0's 0..255, so Q8_0 there uses the sign trick in the
 * direct kernel for every ncols (the integers, hence the results, are the
 * same).
 */
#include <immintrin.h>
#include <string.h>

#include "cpu_internal.h"

#ifndef HYB_VNNI
#error "define HYB_VNNI before including gemm_q_avx512_body.h"
#endif
#ifndef HYB_AMX
#define HYB_AMX 0
#endif

#define DR 4 /* rows of a direct tile */
#define DC 4 /* columns of a direct tile */
#define PF_TILES 1          /* direct tiles ahead that software prefetch reads */
#define PF_HINT _MM_HINT_T1 /* into L2: the next tile does not fit in L1 beside this one */
/* 32-element units of k per packed chunk: the chunk's codes stay in L1 */
#define KCU8 8  /* Q4_0: 48 rows x 256 k = 13.5 KiB */
#define KCU0 32 /* Q8_0: 16 rows x 1024 k = 18 KiB (its chains are stored between chunks) */
#define KCUK 16 /* K-quants: 32 rows x 512 k (two super-blocks) = 19 KiB */

#define ALWAYS_INLINE static inline __attribute__((always_inline))

static inline int32_t ld32(const void *p)
{
	int32_t v;

	memcpy(&v, p, 4);
	return v;
}

#include "avx512_dots.h"

static inline int64_t min64(int64_t a, int64_t b)
{
	return a < b ? a : b;
}

/* ------------------------------------------------------------------------ */
/* activation side: per-column data shared by every row                     */

/* sum of the 32 int8 of a Q8_0 block */
static inline int32_t q8_block_sum(const struct hyb_block_q8_0 *b)
{
	__m256i v = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)b->qs),
				     _mm256_set1_epi8((char)0x80));
	__m256i s = _mm256_sad_epu8(v, _mm256_setzero_si256());
	__m128i t = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));

	t = _mm_add_epi64(t, _mm_unpackhi_epi64(t, t));
	return (int32_t)_mm_cvtsi128_si32(t) - 32 * 128;
}

ALWAYS_INLINE __m512i load_pair256(const uint8_t *a, const uint8_t *b)
{
	return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)),
				  _mm256_loadu_si256((const __m256i *)b), 1);
}

static inline float f16_scalar(uint16_t h)
{
	return _cvtsh_ss(h);
}

/*
 * Prefetch [off, off + 64 * lines) of the next tile's DR rows. Row streams
 * of a few KiB are too short for the hardware prefetcher to ramp up on
 * (k = 4096 Q4_0 rows are 36 lines), so each tile pulls the next one in
 * while it computes.
 */
ALWAYS_INLINE void prefetch_rows(const uint8_t *const *nx, int64_t off, const int lines)
{
	for (int r = 0; r < DR; r++)
		for (int l = 0; l < lines; l++)
			_mm_prefetch((const char *)nx[r] + off + 64 * l, PF_HINT);
}

#include "gemm_q_avx512_direct_q0.h"
#include "gemm_q_avx512_direct_k.h"
#include "gemm_q_avx512_direct.h"
#include "gemm_q_avx512_packed.h"

/* ------------------------------------------------------------------------ */
/* entry points                                                             */

#if HYB_AMX
#define SFX(name) name##_amx
#elif HYB_VNNI
#define SFX(name) name##_avx512vnni
#else
#define SFX(name) name##_avx512
#endif

/*
 * Which of llama.cpp's summations each weight gets (see cpu_kernels.h for
 * the three tables): Q4_0 and Q4_K weights whose row count is a multiple of
 * 8 are repacked by llama.cpp (repack.cpp), the others go through
 * tinyBLAS_Q0 / vec_dot / the tiled K-quant matmul (8+ columns).
 */
static void dgemm(enum dtype t, HYB_GEMM_ARGS, void (*fallback)(HYB_GEMM_ARGS))
{
	if (direct_gemm(t, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride))
		fallback(k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride);
}

/* Q8_0 (any rows), unrepacked Q4_0: one summation for every column count */
static void SFX(gemm_q8_0)(HYB_GEMM_ARGS)
{
	if (hyb_gemm_trivial(k, nrows, ncols, y, y_stride))
		return;
	/* from 4 columns the row-lane layout needs fewer float operations per quant */
	if (HYB_VNNI && ncols >= 4 &&
	    !packed_gemm(P_Q8_0, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride))
		return;
	dgemm(D_Q8_0, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride,
	      hyb_gemm_q8_0_scalar);
}

static void SFX(gemm_q4_0_m1)(HYB_GEMM_ARGS)
{
	if (hyb_gemm_trivial(k, nrows, ncols, y, y_stride))
		return;
	dgemm(D_Q4_0, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride,
	      hyb_gemm_q4_0_scalar);
}

/*
 * repacked Q4_0: GEMM and GEMV add alike; the packed kernel from 4
 * columns, the 16-row GEMV for one
 */
static void SFX(gemm_q4_0)(HYB_GEMM_ARGS)
{
	if (hyb_gemm_trivial(k, nrows, ncols, y, y_stride))
		return;
	if (ncols == 1 && !q4g_gemv(0, k, w, w_stride, nrows, x, y))
		return;
	if (ncols >= 4 &&
	    !packed_gemm(P_Q4_0, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride))
		return;
	dgemm(D_Q4R, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride,
	      hyb_gemm_q4_0_scalar);
}

/*
 * repacked Q4_K: llama.cpp runs its GEMM on the first ncols - ncols % 4
 * columns (one float add per 64 quants) and its GEMV on the rest (one per
 * super-block).
 */
static void SFX(gemm_q4_k)(HYB_GEMM_ARGS)
{
	const int64_t n4 = ncols - ncols % 4;

	if (hyb_gemm_trivial(k, nrows, ncols, y, y_stride))
		return;
	if (n4 && packed_gemm(P_Q4_K, k, w, w_stride, nrows, x, x_stride, n4, y, y_stride)) {
		hyb_gemm_q4_k_scalar(k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride);
		return;
	}
	if (n4 < ncols)
		dgemm(D_Q4K_GEMV, k, w, w_stride, nrows, (const uint8_t *)x + (size_t)n4 * x_stride,
		      x_stride, ncols - n4, y + (size_t)n4 * y_stride, y_stride,
		      hyb_gemm_q4_k_scalar);
}

static void SFX(gemm_q4_k_m1)(HYB_GEMM_ARGS)
{
	if (hyb_gemm_trivial(k, nrows, ncols, y, y_stride))
		return;
	dgemm(ncols < 8 ? D_Q4K_DOT : D_Q4K_TILED, k, w, w_stride, nrows, x, x_stride, ncols, y,
	      y_stride, hyb_gemm_q4_k_scalar);
}

/* Q6_K (never repacked on x86): vec_dot below 8 columns, the tiled matmul from 8 */
static void SFX(gemm_q6_k)(HYB_GEMM_ARGS)
{
	if (hyb_gemm_trivial(k, nrows, ncols, y, y_stride))
		return;
	if (ncols >= 8 &&
	    !packed_gemm(P_Q6_K, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride))
		return;
	dgemm(ncols < 8 ? D_Q6K_DOT : D_Q6K_TILED, k, w, w_stride, nrows, x, x_stride, ncols, y,
	      y_stride, hyb_gemm_q6_k_scalar);
}

/*
 * MXFP4's prefill (gemm_mxfp4_simd.h asks from 4 columns): IQ4_NL's packed
 * kernel on its levels, the same float chain per output (VNNI only: the
 * levels + 128 are unsigned). -1, nothing written, where it does not apply.
 */
int SFX(hyb_gemm_mxfp4_packed)(HYB_GEMM_ARGS)
{
	if (!HYB_VNNI || ncols < 4)
		return -1;
	return packed_gemm(P_MXFP4, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride);
}

/*
 * The packed prefill of the types gemm_k_extra_avx512_body.h serves, which
 * asks here first: Q3_K, Q5_K, IQ4_XS from 8 columns (the tiled K-quant
 * matmul, as Q6_K's); repacked Q2_K on a multiple of 4 columns (its
 * q2_K_8x8 GEMM, as Q4_K's). IQ4_XS needs VNNI (its codes are 0..241).
 * Returns -1, nothing written, where it does not apply or scratch memory is
 * short.
 */
int SFX(hyb_gemm_kx_packed)(uint32_t type, int repacked, HYB_GEMM_ARGS)
{
	enum ptype t;

	if (repacked && type == HYB_TYPE_Q2_K && ncols >= 4 && ncols % 4 == 0)
		t = P_Q2_K;
	else if (repacked || ncols < 8)
		return -1;
	else if (type == HYB_TYPE_Q3_K)
		t = P_Q3_K;
	else if (type == HYB_TYPE_Q5_K)
		t = P_Q5_K;
	else if (type == HYB_TYPE_IQ4_XS && HYB_VNNI)
		t = P_IQ4_XS;
	else
		return -1;
	return packed_gemm(t, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride);
}

/* Q5_0, Q4_1, Q5_1 (never repacked on x86): one summation for every column count */
static void SFX(gemm_q5_0)(HYB_GEMM_ARGS)
{
	if (hyb_gemm_trivial(k, nrows, ncols, y, y_stride))
		return;
	dgemm(D_Q5_0, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride,
	      hyb_gemm_q5_0_scalar);
}

static void SFX(gemm_q4_1)(HYB_GEMM_ARGS)
{
	if (hyb_gemm_trivial(k, nrows, ncols, y, y_stride))
		return;
	dgemm(D_Q4_1, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride,
	      hyb_gemm_q4_1_scalar);
}

static void SFX(gemm_q5_1)(HYB_GEMM_ARGS)
{
	if (hyb_gemm_trivial(k, nrows, ncols, y, y_stride))
		return;
	dgemm(D_Q5_1, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride,
	      hyb_gemm_q5_1_scalar);
}

/* unrepacked IQ4_NL: its vec_dot (two chains) for one column, tinyBLAS_Q0 from 2 */
static void SFX(gemm_iq4_nl_m1)(HYB_GEMM_ARGS)
{
	if (hyb_gemm_trivial(k, nrows, ncols, y, y_stride))
		return;
	dgemm(ncols == 1 ? D_NL_DOT : D_NL, k, w, w_stride, nrows, x, x_stride, ncols, y,
	      y_stride, hyb_gemm_iq4_nl_scalar);
}

/*
 * repacked IQ4_NL (iq4_nl_8x8): GEMM and GEMV add alike (as repacked
 * Q4_0's); with VNNI (levels + 128 are unsigned bytes) the 16-row GEMV
 * for one column and the packed kernel from 4, the direct tile otherwise
 */
static void SFX(gemm_iq4_nl)(HYB_GEMM_ARGS)
{
	if (hyb_gemm_trivial(k, nrows, ncols, y, y_stride))
		return;
	if (ncols == 1 && !q4g_gemv(1, k, w, w_stride, nrows, x, y))
		return;
	if (HYB_VNNI && ncols >= 4 &&
	    !packed_gemm(P_IQ4_NL, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride))
		return;
	dgemm(D_NLR, k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride,
	      hyb_gemm_iq4_nl_scalar);
}

static void SFX(fill_q)(struct hyb_cpu_kernels *kt)
{
	hyb_set_gemm(kt, HYB_TYPE_Q5_0, SFX(gemm_q5_0));
	hyb_set_gemm(kt, HYB_TYPE_Q4_1, SFX(gemm_q4_1));
	hyb_set_gemm(kt, HYB_TYPE_Q5_1, SFX(gemm_q5_1));
	hyb_set_gemm(kt, HYB_TYPE_IQ4_NL, SFX(gemm_iq4_nl_m1));
	kt->gemm[HYB_TYPE_IQ4_NL] = SFX(gemm_iq4_nl);
	hyb_set_gemm(kt, HYB_TYPE_Q8_0, SFX(gemm_q8_0));
	hyb_set_gemm(kt, HYB_TYPE_Q6_K, SFX(gemm_q6_k));
	hyb_set_gemm(kt, HYB_TYPE_Q4_0, SFX(gemm_q4_0_m1));
	hyb_set_gemm(kt, HYB_TYPE_Q4_K, SFX(gemm_q4_k_m1));
	kt->gemm[HYB_TYPE_Q4_0] = SFX(gemm_q4_0);
	kt->gemm[HYB_TYPE_Q4_K] = SFX(gemm_q4_k);
}
