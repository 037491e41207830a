// SPDX-License-Identifier: MIT
/*
 * llama.cpp's vector primitives with AVX-512 (see cpu_kernels.h): the same
 * lanes, fused multiply-adds and reduction trees as its AVX-512 build, so
 * the results equal both llama.cpp's and the scalar references in
 * vec_ref.c bit for bit.
 */
#include <immintrin.h>
#include <math.h>

#include "cpu_internal.h"

static inline __mmask16 tail_mask(int64_t n)
{
	return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1);
}

static inline __m512 load_f16(const uint16_t *p)
{
	return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

/* The arithmetic of ggml_v_expf (AVX-512), restated; see hyb_ref_expf. */
static inline __m512 v_expf(__m512 x)
{
	const __m512 r = _mm512_set1_ps(0x1.8p23f);
	const __m512 z = _mm512_fmadd_ps(x, _mm512_set1_ps(0x1.715476p+0f), r);
	const __m512 n = _mm512_sub_ps(z, r);
	const __m512 b = _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.7f7d1cp-20f),
					  _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.62e4p-1f), x));
	const __m512 u = _mm512_mul_ps(b, b);
	const __m512 p_hi = _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_set1_ps(0x1.0e4020p-7f), b,
							   _mm512_set1_ps(0x1.573e2ep-5f)),
					    u, _mm512_fmadd_ps(_mm512_set1_ps(0x1.555e66p-3f), b,
							       _mm512_set1_ps(0x1.fffdb6p-2f)));
	const __m512 j = _mm512_fmadd_ps(p_hi, u, _mm512_fmadd_ps(_mm512_set1_ps(0x1.ffffecp-1f), b,
								  _mm512_set1_ps(1.0f)));
	const __m512 res = _mm512_scalef_ps(j, n);
	const __mmask16 big = _mm512_cmp_ps_mask(_mm512_abs_ps(n), _mm512_set1_ps(192),
						 _CMP_GT_OQ);

	if (!big)
		return res;
	/* |n| > 192: 0 for large negative x, inf for large positive */
	const __m512 sat = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(n, _mm512_setzero_ps(),
								   _CMP_LE_OQ),
						_mm512_set1_ps(INFINITY), _mm512_setzero_ps());

	return _mm512_mask_blend_ps(big, res, sat);
}

static float dot_f16(int64_t n, const uint16_t *x, const uint16_t *y)
{
	/* ggml_vec_dot_f16: GGML_F16_STEP 64 = four 16-lane accumulators */
	__m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
	const int64_t np = n & ~(int64_t)63;
	double s;

	for (int64_t i = 0; i < np; i += 64) {
		a0 = _mm512_fmadd_ps(load_f16(x + i), load_f16(y + i), a0);
		a1 = _mm512_fmadd_ps(load_f16(x + i + 16), load_f16(y + i + 16), a1);
		a2 = _mm512_fmadd_ps(load_f16(x + i + 32), load_f16(y + i + 32), a2);
		a3 = _mm512_fmadd_ps(load_f16(x + i + 48), load_f16(y + i + 48), a3);
	}
	/* GGML_F32x16_REDUCE: 0+2, 1+3, then 0+1 */
	s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a2), _mm512_add_ps(a1, a3)));
	for (int64_t i = np; i < n; i++)
		s += (double)(_cvtsh_ss(x[i]) * _cvtsh_ss(y[i]));
	return (float)s;
}

static void mad_f16(int64_t n, uint16_t *y, const uint16_t *x, float v)
{
	const __m512 vv = _mm512_set1_ps(v);

	for (int64_t i = 0; i < n; i += 16) {
		const __mmask16 m = tail_mask(n - i);
		const __m512 xv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, x + i));
		const __m512 yv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, y + i));

		_mm256_mask_storeu_epi16(y + i, m, _mm512_cvtps_ph(_mm512_fmadd_ps(xv, vv, yv),
								 _MM_FROUND_TO_NEAREST_INT));
	}
}

static void scale_f16(int64_t n, uint16_t *y, float v)
{
	const __m512 vv = _mm512_set1_ps(v);

	for (int64_t i = 0; i < n; i += 16) {
		const __mmask16 m = tail_mask(n - i);
		const __m512 yv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, y + i));

		_mm256_mask_storeu_epi16(y + i, m, _mm512_cvtps_ph(_mm512_mul_ps(yv, vv),
								 _MM_FROUND_TO_NEAREST_INT));
	}
}

/*
 * simd_gemm: every c[i][j] is its own chain of fused multiply-adds in k
 * order, so any vectorisation over j gives the same numbers. 4 rows x 32
 * columns of accumulators, a broadcast of a[i][kk] per row and k.
 */
static void gemm_acc(float *c, const float *a, const float *b, int m, int k, int n)
{
	for (int i0 = 0; i0 < m; i0 += 4) {
		const int mr = m - i0 < 4 ? m - i0 : 4;

		for (int j0 = 0; j0 < n; j0 += 32) {
			const __mmask16 m0 = tail_mask(n - j0), m1 = tail_mask(n - j0 - 16 > 0 ?
									n - j0 - 16 : 0);
			__m512 acc[4][2];

			for (int i = 0; i < mr; i++) {
				acc[i][0] = _mm512_maskz_loadu_ps(m0, c + (size_t)(i0 + i) * n + j0);
				acc[i][1] = _mm512_maskz_loadu_ps(m1, c + (size_t)(i0 + i) * n + j0 + 16);
			}
			for (int kk = 0; kk < k; kk++) {
				const __m512 b0 = _mm512_maskz_loadu_ps(m0, b + (size_t)kk * n + j0);
				const __m512 b1 = _mm512_maskz_loadu_ps(m1, b + (size_t)kk * n + j0 + 16);

				for (int i = 0; i < mr; i++) {
					const __m512 av = _mm512_set1_ps(a[(size_t)(i0 + i) * k + kk]);

					acc[i][0] = _mm512_fmadd_ps(b0, av, acc[i][0]);
					acc[i][1] = _mm512_fmadd_ps(b1, av, acc[i][1]);
				}
			}
			for (int i = 0; i < mr; i++) {
				_mm512_mask_storeu_ps(c + (size_t)(i0 + i) * n + j0, m0, acc[i][0]);
				_mm512_mask_storeu_ps(c + (size_t)(i0 + i) * n + j0 + 16, m1, acc[i][1]);
			}
		}
	}
}

static double soft_max(int64_t n, float *y, const float *x, float max)
{
	const __m512 mv = _mm512_set1_ps(max);
	double sum = 0;
	int64_t i = 0;

	for (; i + 16 <= n; i += 16) {
		const __m512 v = v_expf(_mm512_sub_ps(_mm512_loadu_ps(x + i), mv));

		_mm512_storeu_ps(y + i, v);
		sum += (double)_mm512_reduce_add_ps(v);
	}
	return hyb_soft_max_tail(i, n, y, x, max, sum);
}

static void swiglu(int64_t n, float *y, const float *x, const float *g)
{
	int64_t i = 0;

	for (; i + 16 <= n; i += 16) {
		const __m512 xv = _mm512_loadu_ps(x + i);
		const __m512 e = v_expf(_mm512_sub_ps(_mm512_setzero_ps(), xv));
		const __m512 silu = _mm512_div_ps(xv, _mm512_add_ps(_mm512_set1_ps(1.0f), e));

		_mm512_storeu_ps(y + i, _mm512_mul_ps(silu, _mm512_loadu_ps(g + i)));
	}
	hyb_swiglu_tail(i, n, y, x, g);
}

/*
 * The lookup 16 lanes at a time: F16 indices by vcvtps2ph (round to nearest
 * even, as hyb_f32_to_f16 and ggml's F16C build), a 32-bit gather of the
 * table's bytes at 2 * index (the padding entry covers index 65535's upper
 * half), its low halves widened back.
 */
static void geglu(int64_t n, float *y, const float *x, const float *g, const uint16_t *table)
{
	int64_t i = 0;

	for (; i + 16 <= n; i += 16) {
		const __m512 xv = _mm512_loadu_ps(x + i), gv = _mm512_loadu_ps(g + i);
		const __m256i h = _mm512_cvtps_ph(xv, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
		const __m512i t = _mm512_i32gather_epi32(_mm512_cvtepu16_epi32(h), (const void *)table,
							 2);
		__m512 r = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_cvtepi32_epi16(t)), gv);

		r = _mm512_mask_mul_ps(r, _mm512_cmp_ps_mask(xv, _mm512_set1_ps(10.0f), _CMP_GE_OQ),
				       xv, gv);
		r = _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(xv, _mm512_set1_ps(-10.0f), _CMP_LE_OQ),
				       _mm512_setzero_ps());
		_mm512_storeu_ps(y + i, r);
	}
	hyb_geglu_tail(i, n, y, x, g, table);
}

/* exact widening of F16 (the KV cache's rows in attention) */
static void dequantize_f16(const void *in, float *out, int64_t n)
{
	const uint16_t *h = in;

	for (int64_t i = 0; i < n; i += 16) {
		const __mmask16 m = tail_mask(n - i);

		_mm512_mask_storeu_ps(out + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, h + i)));
	}
}

void hyb_fill_vec_avx512(struct hyb_cpu_kernels *k)
{
	k->dequantize[HYB_TYPE_F16] = dequantize_f16;
	k->dot_f16 = dot_f16;
	k->mad_f16 = mad_f16;
	k->scale_f16 = scale_f16;
	k->gemm_acc = gemm_acc;
	k->soft_max = soft_max;
	k->swiglu = swiglu;
	k->geglu = geglu;
}
