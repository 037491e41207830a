// SPDX-License-Identifier: MIT
/*
 * AVX2 activation converters and the AVX2 table. Results are bit-identical
 * to the scalar ones (quant_act.c) for every input but NaN: F16C's
 * vcvtps2ph keeps a NaN's payload where the scalar code returns 0x7e00.
 * Q8_0 and Q8_1 are computed as llama.cpp's x86 quantize_row_q8_0/q8_1
 * do. Q8_K stays scalar: it is llama.cpp's reference and costs nothing
 * next to a GEMV.
 */
#include <immintrin.h>

#include "cpu_internal.h"

static void quantize_f16(const float *x, void *out, int64_t n)
{
	uint16_t *o = out;
	int64_t i = 0;

	for (; i + 8 <= n; i += 8)
		_mm_storeu_si128((__m128i *)(o + i),
				 _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
	for (; i < n; i++)
		o[i] = hyb_f32_to_f16(x[i]);
}

static void quantize_bf16(const float *x, void *out, int64_t n)
{
	const __m256i abs = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
	uint16_t *o = out;
	int64_t i = 0;

	for (; i + 16 <= n; i += 16) {
		__m256i h[2];

		for (int j = 0; j < 2; j++) {
			const __m256i u = _mm256_castps_si256(_mm256_loadu_ps(x + i + 8 * j));
			const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16),
							     _mm256_set1_epi32(1));
			const __m256i rne = _mm256_srli_epi32(_mm256_add_epi32(u,
				_mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
			const __m256i qnan = _mm256_or_si256(_mm256_srli_epi32(u, 16),
							     _mm256_set1_epi32(64));
			const __m256i isnan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs), inf);

			h[j] = _mm256_blendv_epi8(rne, qnan, isnan);
		}
		/* packus works per 128-bit lane: put the halves back in order */
		_mm256_storeu_si256((__m256i *)(o + i), _mm256_permute4x64_epi64(
			_mm256_packus_epi32(h[0], h[1]), 0xD8));
	}
	for (; i < n; i++)
		o[i] = hyb_f32_to_bf16(x[i]);
}

/*
 * One 32-element block as llama.cpp's x86 quantize_row_q8_0/q8_1 do it
 * (127/amax, round-half-even): the quants to qs, the float scale d
 * returned, the quants' sum to *sum.
 */
static inline float q8_block(const float *x, int8_t *qs, int32_t *sum)
{
	const __m256 sign = _mm256_set1_ps(-0.0f);
	__m256 v[4], m;

	for (int j = 0; j < 4; j++)
		v[j] = _mm256_loadu_ps(x + 8 * j);
	m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
			  _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
	__m128 m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));

	m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
	m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
	const float amax = _mm_cvtss_f32(m4);
	const __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.f / amax : 0.0f);
	__m256i q[4];

	for (int j = 0; j < 4; j++)
		q[j] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[j], id),
							  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
	/* the sum before packing: the quants are within -127..127, no saturation */
	const __m256i s8 = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
	__m128i s = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));

	s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
	*sum = _mm_cvtsi128_si32(s) + _mm_extract_epi32(s, 1);
	/* 32 -> 16 -> 8 bits per 128-bit lane, then undo the lane interleave */
	__m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]),
				       _mm256_packs_epi32(q[2], q[3]));

	p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
	_mm256_storeu_si256((__m256i *)qs, p);
	return amax / 127.f;
}

static void quantize_q8_0(const float *x, void *out, int64_t n)
{
	struct hyb_block_q8_0 *y = out;
	int32_t sum;

	for (int64_t b = 0; b < n / 32; b++, x += 32)
		y[b].d = hyb_f32_to_f16(q8_block(x, y[b].qs, &sum));
}

/* Q8_1: also s = f16(d * float(sum of the quants)), d the unrounded scale */
static void quantize_q8_1(const float *x, void *out, int64_t n)
{
	struct hyb_block_q8_1 *y = out;

	for (int64_t b = 0; b < n / 32; b++, x += 32) {
		int32_t sum;
		const float d = q8_block(x, y[b].qs, &sum);

		y[b].d = hyb_f32_to_f16(d);
		y[b].s = hyb_f32_to_f16(d * (float)sum);
	}
}

void hyb_cpu_fill_avx2(struct hyb_cpu_kernels *k)
{
	k->quantize_act[HYB_TYPE_F16] = quantize_f16;
	k->quantize_act[HYB_TYPE_BF16] = quantize_bf16;
	k->quantize_act[HYB_TYPE_Q8_0] = quantize_q8_0;
	k->quantize_act[HYB_TYPE_Q8_1] = quantize_q8_1;
	hyb_fill_q_avx2(k);
	hyb_fill_q0_extra_avx2(k);
	hyb_fill_f_avx2(k);
	hyb_fill_vec_avx2(k);
	hyb_fill_pred_avx2(k);
	hyb_fill_popcount_avx2(k);
}
