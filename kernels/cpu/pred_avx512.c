// SPDX-License-Identifier: MIT
/* Predictor kernels (see cpu_kernels.h) with AVX-512: masked loads take the partial panels. */
#include <immintrin.h>

#include "cpu_internal.h"

/* NC columns of the panel's 32 rows in two registers each, X broadcast one element at a time */
#define MK512(NC)                                                                        \
	static void mk512_##NC(int64_t K, const float *ap, const float *x, size_t xc,    \
			       size_t xk, float *y, size_t ys, unsigned nr, int acc)     \
	{                                                                                \
		__m512 a0[NC], a1[NC];                                                   \
		const __mmask16 m0 = nr >= 16 ? 0xFFFF : (__mmask16)((1u << nr) - 1);    \
		const __mmask16 m1 = nr >= 32 ? 0xFFFF : nr <= 16 ? 0 :                  \
				     (__mmask16)((1u << (nr - 16)) - 1);                 \
		_Pragma("GCC unroll 16") for (int c = 0; c < NC; c++)                    \
		{                                                                        \
			a0[c] = acc ? _mm512_maskz_loadu_ps(m0, y + c * ys)              \
				    : _mm512_setzero_ps();                               \
			a1[c] = acc ? _mm512_maskz_loadu_ps(m1, y + c * ys + 16)         \
				    : _mm512_setzero_ps();                               \
		}                                                                        \
		for (int64_t k = 0; k < K; k++) {                                        \
			const __m512 w0 = _mm512_load_ps(ap + k * HYB_PANEL);            \
			const __m512 w1 = _mm512_load_ps(ap + k * HYB_PANEL + 16);       \
			const float *xk_ = x + k * xk;                                   \
			_Pragma("GCC unroll 16") for (int c = 0; c < NC; c++)            \
			{                                                                \
				const __m512 xb = _mm512_set1_ps(xk_[c * xc]);           \
				a0[c] = _mm512_fmadd_ps(w0, xb, a0[c]);                  \
				a1[c] = _mm512_fmadd_ps(w1, xb, a1[c]);                  \
			}                                                                \
		}                                                                        \
		_Pragma("GCC unroll 16") for (int c = 0; c < NC; c++)                    \
		{                                                                        \
			_mm512_mask_storeu_ps(y + c * ys, m0, a0[c]);                    \
			_mm512_mask_storeu_ps(y + c * ys + 16, m1, a1[c]);               \
		}                                                                        \
	}

MK512(12)
MK512(1)

/* twelve columns at a time (24 accumulators of 32 registers), then one */
static void panel_gemm(int64_t K, const float *ap, const float *x, size_t xc, size_t xk,
		       float *y, size_t ys, unsigned nr, int acc, int64_t nc)
{
	hyb_panel_columns(mk512_12, 12, mk512_1, K, ap, x, xc, xk, y, ys, nr, acc, nc);
}

/* four hidden units' rows per pass over the columns: a quarter of the loads and stores of lg */
static void fc2_sparse(float *lg, const uint16_t *w, size_t n_out, const float *h,
		       const uint32_t *nz, uint32_t n_nz, long lo, long hi)
{
	long c;

	for (uint32_t q = 0; q < n_nz; q += 4) {
		const uint16_t *wr[4];
		__m512 v[4];
		uint32_t nr = n_nz - q < 4 ? n_nz - q : 4;

		for (uint32_t r = 0; r < 4; r++) {
			uint32_t u = nz[q + (r < nr ? r : 0)];

			wr[r] = w + (size_t)u * n_out;
			v[r] = _mm512_set1_ps(r < nr ? h[u] : 0.0f);
		}
		for (c = lo; c + 16 <= hi; c += 16) {
			__m512 acc = _mm512_loadu_ps(lg + c);

			for (uint32_t r = 0; r < 4; r++)
				acc = _mm512_fmadd_ps(v[r], _mm512_cvtph_ps(_mm256_loadu_si256(
							    (const __m256i *)(wr[r] + c))), acc);
			_mm512_storeu_ps(lg + c, acc);
		}
		for (; c < hi; c++)
			for (uint32_t r = 0; r < nr; r++)
				lg[c] += v[r][0] * hyb_f16_to_f32(wr[r][c]);
	}
}

static void adam(float *w, const float *g, float *m, float *v, long lo, long hi, float lr,
		 float c1, float c2)
{
	const __m512 b1 = _mm512_set1_ps(0.9f), b1c = _mm512_set1_ps(0.1f);
	const __m512 b2 = _mm512_set1_ps(0.999f), b2c = _mm512_set1_ps(0.001f);
	const __m512 vlr = _mm512_set1_ps(lr), vc1 = _mm512_set1_ps(c1);
	const __m512 vc2 = _mm512_set1_ps(c2), eps = _mm512_set1_ps(1e-8f);

	for (long i = lo; i < hi; i += 16) {
		const __mmask16 k = hi - i >= 16 ? 0xFFFF : (__mmask16)((1u << (hi - i)) - 1);
		__m512 gi = _mm512_maskz_loadu_ps(k, g + i);
		__m512 mi = _mm512_fmadd_ps(b1, _mm512_maskz_loadu_ps(k, m + i),
					    _mm512_mul_ps(b1c, gi));
		__m512 vi = _mm512_fmadd_ps(b2, _mm512_maskz_loadu_ps(k, v + i),
					    _mm512_mul_ps(b2c, _mm512_mul_ps(gi, gi)));
		__m512 den = _mm512_add_ps(_mm512_sqrt_ps(_mm512_mul_ps(vi, vc2)), eps);
		__m512 d = _mm512_div_ps(_mm512_mul_ps(mi, vc1), den);

		_mm512_mask_storeu_ps(m + i, k, mi);
		_mm512_mask_storeu_ps(v + i, k, vi);
		_mm512_mask_storeu_ps(w + i, k,
				      _mm512_fnmadd_ps(vlr, d, _mm512_maskz_loadu_ps(k, w + i)));
	}
}

void hyb_fill_pred_avx512(struct hyb_cpu_kernels *k)
{
	k->panel_gemm = panel_gemm;
	k->fc2_sparse = fc2_sparse;
	k->adam = adam;
}
