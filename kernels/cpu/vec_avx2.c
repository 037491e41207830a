// SPDX-License-Identifier: MIT
/*
 * llama.cpp's vector primitives (see cpu_kernels.h) with AVX2: the numbers
 * of its AVX-512 build, bit for bit, as vec_ref.c states them lane by lane.
 * Each 16-lane register of that build is a pair of 8-lane registers here
 * (lo = lanes 0..7, hi = 8..15); every lane does the same fused
 * multiply-adds in the same order, and the reductions follow
 * _mm512_reduce_add_ps's tree, so an AVX2 machine computes attention and
 * the SwiGLU as llama.cpp's AVX-512 build does, at SIMD speed rather than
 * the scalar references' (which took about a third of sparse decode time
 * on a Zen 3 with AVX2 only).
 */
#include <immintrin.h>
#include <math.h>

#include "cpu_internal.h"

struct v16 {
	__m256 lo, hi;
};

static inline __m256 load8_f16(const uint16_t *p)
{
	return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

static inline void store8_f16(uint16_t *p, __m256 v)
{
	_mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}

/* _mm512_reduce_add_ps as GCC expands it: halves, quarters, then pairs */
static inline float reduce16(struct v16 v)
{
	const __m256 t8 = _mm256_add_ps(v.hi, v.lo);
	const __m128 t4 = _mm_add_ps(_mm256_extractf128_ps(t8, 1), _mm256_castps256_ps128(t8));
	const __m128 t2 = _mm_add_ps(_mm_movehl_ps(t4, t4), t4); /* [t4_0+t4_2, t4_1+t4_3] */

	return _mm_cvtss_f32(_mm_add_ss(t2, _mm_movehdup_ps(t2)));
}

/* 2^k for integer lanes k in [-126, 127] */
static inline __m256 pow2i(__m256i k)
{
	return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k, _mm256_set1_epi32(127)),
						     23));
}

/*
 * The arithmetic of ggml_v_expf (AVX-512), restated; see hyb_ref_expf.
 * vscalefps(j, n) = j * 2^n rounded once; without it, j * 2^(n/2) is exact
 * (j is in [0.7, 1.5], so the product stays normal for |n| <= 192) and the
 * second factor 2^(n - n/2) rounds once, to the same float, subnormals
 * included.
 */
static inline __m256 v_expf(__m256 x)
{
	const __m256 r = _mm256_set1_ps(0x1.8p23f);
	const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), r);
	const __m256 n = _mm256_sub_ps(z, r);
	const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f),
					  _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
	const __m256 u = _mm256_mul_ps(b, b);
	const __m256 p_hi = _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b,
							   _mm256_set1_ps(0x1.573e2ep-5f)),
					    u, _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b,
							       _mm256_set1_ps(0x1.fffdb6p-2f)));
	const __m256 j = _mm256_fmadd_ps(p_hi, u, _mm256_fmadd_ps(_mm256_set1_ps(0x1.ffffecp-1f), b,
								  _mm256_set1_ps(1.0f)));
	/* clamped so the exponent arithmetic stays in range (NaN lanes: j is NaN) */
	const __m256 nc = _mm256_min_ps(_mm256_max_ps(n, _mm256_set1_ps(-192.0f)),
					_mm256_set1_ps(192.0f));
	const __m256i ni = _mm256_cvtps_epi32(nc);
	const __m256i n1 = _mm256_srai_epi32(ni, 1);
	const __m256 res = _mm256_mul_ps(_mm256_mul_ps(j, pow2i(n1)),
					 pow2i(_mm256_sub_epi32(ni, n1)));
	const __m256 absn = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), n);
	const __m256 big = _mm256_cmp_ps(absn, _mm256_set1_ps(192.0f), _CMP_GT_OQ);

	if (!_mm256_movemask_ps(big))
		return res;
	/* |n| > 192: 0 for large negative x, inf for large positive */
	const __m256 sat = _mm256_and_ps(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_GT_OQ),
					 _mm256_set1_ps(INFINITY));

	return _mm256_blendv_ps(res, sat, big);
}

static float dot_f16(int64_t n, const uint16_t *x, const uint16_t *y)
{
	/* ggml_vec_dot_f16: GGML_F16_STEP 64 = four 16-lane accumulators */
	struct v16 a[4];
	const int64_t np = n & ~(int64_t)63;
	double s;

	for (int j = 0; j < 4; j++)
		a[j].lo = a[j].hi = _mm256_setzero_ps();
	for (int64_t i = 0; i < np; i += 64) {
		for (int j = 0; j < 4; j++) {
			const int64_t o = i + 16 * j;

			a[j].lo = _mm256_fmadd_ps(load8_f16(x + o), load8_f16(y + o), a[j].lo);
			a[j].hi = _mm256_fmadd_ps(load8_f16(x + o + 8), load8_f16(y + o + 8), a[j].hi);
		}
	}
	/* GGML_F32x16_REDUCE: 0+2, 1+3, then 0+1 */
	const struct v16 t = {
		_mm256_add_ps(_mm256_add_ps(a[0].lo, a[2].lo), _mm256_add_ps(a[1].lo, a[3].lo)),
		_mm256_add_ps(_mm256_add_ps(a[0].hi, a[2].hi), _mm256_add_ps(a[1].hi, a[3].hi)),
	};

	s = reduce16(t);
	for (int64_t i = np; i < n; i++)
		s += (double)(_cvtsh_ss(x[i]) * _cvtsh_ss(y[i]));
	return (float)s;
}

static void mad_f16(int64_t n, uint16_t *y, const uint16_t *x, float v)
{
	const __m256 vv = _mm256_set1_ps(v);
	int64_t i = 0;

	for (; i + 8 <= n; i += 8)
		store8_f16(y + i, _mm256_fmadd_ps(load8_f16(x + i), vv, load8_f16(y + i)));
	for (; i < n; i++)
		y[i] = _cvtss_sh(fmaf(_cvtsh_ss(x[i]), v, _cvtsh_ss(y[i])),
				 _MM_FROUND_TO_NEAREST_INT);
}

static void scale_f16(int64_t n, uint16_t *y, float v)
{
	const __m256 vv = _mm256_set1_ps(v);
	int64_t i = 0;

	for (; i + 8 <= n; i += 8)
		store8_f16(y + i, _mm256_mul_ps(load8_f16(y + i), vv));
	for (; i < n; i++)
		y[i] = _cvtss_sh(_cvtsh_ss(y[i]) * v, _MM_FROUND_TO_NEAREST_INT);
}

/* lanes [0, n) of 8 set, for the masked loads and stores of a column tail */
static inline __m256i lane_mask(int n)
{
	const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);

	return _mm256_cmpgt_epi32(_mm256_set1_epi32(n < 8 ? n : 8), idx);
}

/*
 * simd_gemm: every c[i][j] is its own chain of fused multiply-adds in k
 * order, so any vectorisation over j gives the same numbers. 4 rows x 16
 * columns of accumulators (8 registers), a broadcast of a[i][kk] per row.
 */
static void gemm_acc(float *c, const float *a, const float *b, int m, int k, int n)
{
	for (int i0 = 0; i0 < m; i0 += 4) {
		const int mr = m - i0 < 4 ? m - i0 : 4;

		for (int j0 = 0; j0 < n; j0 += 16) {
			const __m256i m0 = lane_mask(n - j0);
			const __m256i m1 = lane_mask(n - j0 - 8 > 0 ? n - j0 - 8 : 0);
			__m256 acc[4][2];

			for (int i = 0; i < mr; i++) {
				float *ci = c + (size_t)(i0 + i) * n + j0;

				acc[i][0] = _mm256_maskload_ps(ci, m0);
				acc[i][1] = _mm256_maskload_ps(ci + 8, m1);
			}
			for (int kk = 0; kk < k; kk++) {
				const float *bk = b + (size_t)kk * n + j0;
				const __m256 b0 = _mm256_maskload_ps(bk, m0);
				const __m256 b1 = _mm256_maskload_ps(bk + 8, m1);

				for (int i = 0; i < mr; i++) {
					const __m256 av = _mm256_broadcast_ss(a + (size_t)(i0 + i) * k + kk);

					acc[i][0] = _mm256_fmadd_ps(b0, av, acc[i][0]);
					acc[i][1] = _mm256_fmadd_ps(b1, av, acc[i][1]);
				}
			}
			for (int i = 0; i < mr; i++) {
				float *ci = c + (size_t)(i0 + i) * n + j0;

				_mm256_maskstore_ps(ci, m0, acc[i][0]);
				_mm256_maskstore_ps(ci + 8, m1, acc[i][1]);
			}
		}
	}
}

static double soft_max(int64_t n, float *y, const float *x, float max)
{
	const __m256 mv = _mm256_set1_ps(max);
	double sum = 0;
	int64_t i = 0;

	for (; i + 16 <= n; i += 16) {
		const struct v16 v = {
			v_expf(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv)),
			v_expf(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8), mv)),
		};

		_mm256_storeu_ps(y + i, v.lo);
		_mm256_storeu_ps(y + i + 8, v.hi);
		sum += (double)reduce16(v);
	}
	return hyb_soft_max_tail(i, n, y, x, max, sum);
}

static void swiglu(int64_t n, float *y, const float *x, const float *g)
{
	int64_t i = 0;

	/* whole 16-lane steps as the AVX-512 build; its leftovers call libm */
	for (; i + 16 <= n; i += 16) {
		for (int h = 0; h < 16; h += 8) {
			const __m256 xv = _mm256_loadu_ps(x + i + h);
			const __m256 e = v_expf(_mm256_sub_ps(_mm256_setzero_ps(), xv));
			const __m256 silu = _mm256_div_ps(xv, _mm256_add_ps(_mm256_set1_ps(1.0f), e));

			_mm256_storeu_ps(y + i + h, _mm256_mul_ps(silu, _mm256_loadu_ps(g + i + h)));
		}
	}
	hyb_swiglu_tail(i, n, y, x, g);
}

/* exact widening of F16 (the KV cache's rows in attention) */
static void dequantize_f16(const void *in, float *out, int64_t n)
{
	const uint16_t *h = in;
	int64_t i = 0;

	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(out + i, load8_f16(h + i));
	for (; i < n; i++)
		out[i] = _cvtsh_ss(h[i]);
}

void hyb_fill_vec_avx2(struct hyb_cpu_kernels *k)
{
	k->dequantize[HYB_TYPE_F16] = dequantize_f16;
	k->dot_f16 = dot_f16;
	k->mad_f16 = mad_f16;
	k->scale_f16 = scale_f16;
	k->gemm_acc = gemm_acc;
	k->soft_max = soft_max;
	k->swiglu = swiglu;
}
