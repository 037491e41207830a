// SPDX-License-Identifier: MIT
/*
 * AVX2 Q2_K, Q3_K, Q5_K and IQ4_XS kernels: llama.cpp's AVX2 vec_dot for
 * each (row, column), in its order (ggml-cpu/arch/x86/quants.c
 * ggml_vec_dot_{q2_K,q3_K,q5_K,iq4_xs}_q8_K, __AVX2__ branch). The AVX-512
 * levels reproduce llama.cpp's choice of kernel by column count and row
 * count (gemm_k_extra_avx512_body.h); this level is checked against the
 * scalar reference only.
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "cpu_internal.h"

static inline float hsum8(__m256 x)
{
	__m128 r = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));

	r = _mm_add_ps(r, _mm_movehl_ps(r, r));
	r = _mm_add_ss(r, _mm_movehdup_ps(r));
	return _mm_cvtss_f32(r);
}

static inline float h2f(uint16_t h)
{
	return _cvtsh_ss(h);
}

/* int16 scales 0..7 of a 128-bit half, per 16-bit word pair of a 32-byte product */
static inline __m256i scale_pair(__m256i scales, int i)
{
	/* words of the low 128 bits take scale 2i, the high 128 bits scale 2i + 1 */
	const __m256i ctl = _mm256_setr_epi8(
		(char)(4 * i), (char)(4 * i + 1), (char)(4 * i), (char)(4 * i + 1), (char)(4 * i),
		(char)(4 * i + 1), (char)(4 * i), (char)(4 * i + 1), (char)(4 * i), (char)(4 * i + 1),
		(char)(4 * i), (char)(4 * i + 1), (char)(4 * i), (char)(4 * i + 1), (char)(4 * i),
		(char)(4 * i + 1), (char)(4 * i + 2), (char)(4 * i + 3), (char)(4 * i + 2),
		(char)(4 * i + 3), (char)(4 * i + 2), (char)(4 * i + 3), (char)(4 * i + 2),
		(char)(4 * i + 3), (char)(4 * i + 2), (char)(4 * i + 3), (char)(4 * i + 2),
		(char)(4 * i + 3), (char)(4 * i + 2), (char)(4 * i + 3), (char)(4 * i + 2),
		(char)(4 * i + 3));

	return _mm256_shuffle_epi8(scales, ctl);
}

static float dot_q2_k(int64_t nb, const struct hyb_block_q2_k *x, const struct hyb_block_q8_k *y)
{
	const __m256i m3 = _mm256_set1_epi8(3);
	const __m128i m4 = _mm_set1_epi8(0xF);
	__m256 acc = _mm256_setzero_ps();

	for (int64_t i = 0; i < nb; i++) {
		const float d = y[i].d * h2f(x[i].d);
		const float dmin = -y[i].d * h2f(x[i].dmin);
		const uint8_t *q2 = x[i].qs;
		const int8_t *q8 = y[i].qs;
		const __m128i ms = _mm_loadu_si128((const __m128i *)x[i].scales);
		const __m256i mins = _mm256_cvtepi8_epi16(_mm_and_si128(_mm_srli_epi16(ms, 4), m4));
		const __m256i prod = _mm256_madd_epi16(mins,
						       _mm256_loadu_si256((const __m256i *)y[i].bsums));

		/* the mins first, into the same accumulator */
		acc = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(prod), acc);
		const __m256i all = _mm256_cvtepi8_epi16(_mm_and_si128(ms, m4));
		const __m128i lo = _mm256_castsi256_si128(all), hi = _mm256_extracti128_si256(all, 1);
		const __m256i sc[2] = { _mm256_set_m128i(lo, lo), _mm256_set_m128i(hi, hi) };
		__m256i sumi = _mm256_setzero_si256();

		for (int j = 0; j < 2; j++, q2 += 32) {
			const __m256i bits = _mm256_loadu_si256((const __m256i *)q2);
			__m256i p[4];

			for (int t = 0; t < 4; t++, q8 += 32) {
				const __m256i q = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * t), m3);

				p[t] = _mm256_madd_epi16(scale_pair(sc[j], t),
					_mm256_maddubs_epi16(q, _mm256_loadu_si256((const __m256i *)q8)));
			}
			sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(_mm256_add_epi32(p[0], p[1]),
								       _mm256_add_epi32(p[2], p[3])));
		}
		acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
	}
	return hsum8(acc);
}

static float dot_q3_k(int64_t nb, const struct hyb_block_q3_k *x, const struct hyb_block_q8_k *y)
{
	const __m256i m3 = _mm256_set1_epi8(3), mone = _mm256_set1_epi8(1);
	const uint32_t kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f;
	__m256 acc = _mm256_setzero_ps();
	uint32_t aux[3];

	for (int64_t i = 0; i < nb; i++) {
		const float d = y[i].d * h2f(x[i].d);
		const uint8_t *q3 = x[i].qs;
		const int8_t *q8 = y[i].qs;

		memcpy(aux, x[i].scales, 12);
		__m128i s128 = _mm_set_epi32(
			(int)(((aux[1] >> 4) & kmask2) | (((aux[2] >> 6) & kmask1) << 4)),
			(int)(((aux[0] >> 4) & kmask2) | (((aux[2] >> 4) & kmask1) << 4)),
			(int)((aux[1] & kmask2) | (((aux[2] >> 2) & kmask1) << 4)),
			(int)((aux[0] & kmask2) | (((aux[2] >> 0) & kmask1) << 4)));

		s128 = _mm_sub_epi8(s128, _mm_set1_epi8(32));
		const __m256i all = _mm256_cvtepi8_epi16(s128);
		const __m128i lo = _mm256_castsi256_si128(all), hi = _mm256_extracti128_si256(all, 1);
		const __m256i sc[2] = { _mm256_set_m128i(lo, lo), _mm256_set_m128i(hi, hi) };
		const __m256i hbits = _mm256_loadu_si256((const __m256i *)x[i].hmask);
		__m256i sumi = _mm256_setzero_si256();
		int bit = 0;

		for (int j = 0; j < 2; j++, q3 += 32) {
			const __m256i bits = _mm256_loadu_si256((const __m256i *)q3);
			__m256i p[4];

			for (int t = 0; t < 4; t++, q8 += 32, bit++) {
				const __m256i ql = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * t), m3);
				/* 4 where the high bit is clear: subtracted, as llama.cpp does */
				const __m256i qh = _mm256_slli_epi16(_mm256_srli_epi16(_mm256_andnot_si256(
					hbits, _mm256_slli_epi16(mone, bit)), bit), 2);
				const __m256i q8v = _mm256_loadu_si256((const __m256i *)q8);
				const __m256i p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(ql, q8v),
								     _mm256_maddubs_epi16(qh, q8v));

				p[t] = _mm256_madd_epi16(scale_pair(sc[j], t), p16);
			}
			sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(_mm256_add_epi32(p[0], p[1]),
								       _mm256_add_epi32(p[2], p[3])));
		}
		acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
	}
	return hsum8(acc);
}

static float dot_q5_k(int64_t nb, const struct hyb_block_q5_k *x, const struct hyb_block_q8_k *y)
{
	const __m256i m4 = _mm256_set1_epi8(0xF);
	__m256 acc = _mm256_setzero_ps();
	float summs = 0.f;

	for (int64_t i = 0; i < nb; i++) {
		const uint8_t *q5 = x[i].qs;
		const int8_t *q8 = y[i].qs;
		const float d = y[i].d * h2f(x[i].d);
		const float dmin = -y[i].d * h2f(x[i].dmin);
		uint8_t sc8[8], mn8[8];
		int summ = 0;

		hyb_q4k_scales(x[i].scales, sc8, mn8);
		for (int j = 0; j < 8; j++)
			summ += mn8[j] * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
		summs = fmaf(dmin, (float)summ, summs); /* contracted in llama.cpp's build */
		const __m128i s16 = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sc8));
		const __m256i scales = _mm256_set_m128i(s16, s16);
		const __m256i hbits = _mm256_loadu_si256((const __m256i *)x[i].qh);
		__m256i sumi = _mm256_setzero_si256();

		for (int j = 0; j < 4; j++, q5 += 32, q8 += 64) {
			const __m256i bits = _mm256_loadu_si256((const __m256i *)q5);
			const __m256i one = _mm256_set1_epi8(1);
			const __m256i h0 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(
				hbits, 2 * j), one), 4);
			const __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(
				hbits, 2 * j + 1), one), 4);
			const __m256i q0 = _mm256_add_epi8(_mm256_and_si256(bits, m4), h0);
			const __m256i q1 = _mm256_add_epi8(_mm256_and_si256(_mm256_srli_epi16(bits, 4),
									    m4), h1);
			const __m256i s0 = _mm256_shuffle_epi8(scales, _mm256_set1_epi16(
				(short)((4 * j) | (4 * j + 1) << 8)));
			const __m256i s1 = _mm256_shuffle_epi8(scales, _mm256_set1_epi16(
				(short)((4 * j + 2) | (4 * j + 3) << 8)));
			const __m256i p0 = _mm256_madd_epi16(s0, _mm256_maddubs_epi16(q0,
				_mm256_loadu_si256((const __m256i *)q8)));
			const __m256i p1 = _mm256_madd_epi16(s1, _mm256_maddubs_epi16(q1,
				_mm256_loadu_si256((const __m256i *)(q8 + 32))));

			sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
		}
		acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
	}
	return hsum8(acc) + summs;
}

static float dot_iq4_xs(int64_t nb, const struct hyb_block_iq4_xs *x,
			const struct hyb_block_q8_k *y)
{
	const __m128i values = _mm_loadu_si128((const __m128i *)hyb_kvalues_iq4nl);
	const __m128i m4 = _mm_set1_epi8(0x0f);
	__m256 acc = _mm256_setzero_ps();

	for (int64_t i = 0; i < nb; i++) {
		const uint8_t *qs = x[i].qs;
		const int8_t *q8 = y[i].qs;
		__m256i sumi = _mm256_setzero_si256();

		for (int ib = 0; ib < 8; ib++, qs += 16, q8 += 32) {
			const __m128i bits = _mm_loadu_si128((const __m128i *)qs);
			const __m256i q4 = _mm256_set_m128i(
				_mm_shuffle_epi8(values, _mm_and_si128(_mm_srli_epi16(bits, 4), m4)),
				_mm_shuffle_epi8(values, _mm_and_si128(bits, m4)));
			const __m256i q8v = _mm256_loadu_si256((const __m256i *)q8);
			/* signed x signed as |w| * (x with w's sign) */
			const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(q4, q4),
								 _mm256_sign_epi8(q8v, q4));
			const int ls = (((x[i].scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) |
					((x[i].scales_h >> (2 * ib)) & 3) << 4) - 32;

			sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p16, _mm256_set1_epi16((short)ls)));
		}
		acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].d) * y[i].d), _mm256_cvtepi32_ps(sumi),
				      acc);
	}
	return hsum8(acc);
}

#define GEMM(name, blk, dot)                                                                  \
	static void name(HYB_GEMM_ARGS)                                                       \
	{                                                                                     \
		for (int64_t c = 0; c < ncols; c++)                                           \
			for (int64_t r = 0; r < nrows; r++)                                   \
				y[c * y_stride + r] = dot(k / HYB_QK_K,                        \
					(const blk *)((const char *)w + r * w_stride),          \
					(const struct hyb_block_q8_k *)((const char *)x +       \
									c * x_stride));         \
	}
GEMM(gemm_q2_k, struct hyb_block_q2_k, dot_q2_k)
GEMM(gemm_q3_k, struct hyb_block_q3_k, dot_q3_k)
GEMM(gemm_q5_k, struct hyb_block_q5_k, dot_q5_k)
GEMM(gemm_iq4_xs, struct hyb_block_iq4_xs, dot_iq4_xs)
#undef GEMM

void hyb_fill_k_extra_avx2(struct hyb_cpu_kernels *k)
{
	hyb_set_gemm(k, HYB_TYPE_Q2_K, gemm_q2_k);
	hyb_set_gemm(k, HYB_TYPE_Q3_K, gemm_q3_k);
	hyb_set_gemm(k, HYB_TYPE_Q5_K, gemm_q5_k);
	hyb_set_gemm(k, HYB_TYPE_IQ4_XS, gemm_iq4_xs);
}
