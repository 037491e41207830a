/* SPDX-License-Identifier: MIT */
/*
 * The two integer dot steps the AVX-512 kernel bodies share, with and
 * without VNNI (the includer defines HYB_VNNI): gemm_q_avx512_body.h and
 * gemm_k_extra_avx512_body.h.
 */
#ifndef HYB_AVX512_DOTS_H
#define HYB_AVX512_DOTS_H

#include <immintrin.h>

#ifndef HYB_VNNI
#error "define HYB_VNNI before including avx512_dots.h"
#endif

/*
 * acc += dot4(u, s) per 32-bit lane; u unsigned, s signed. Without VNNI the
 * pair sums are int16: u <= 127 (or pairs that stay in range) only.
 */
static inline __attribute__((always_inline)) __m512i dot_us(__m512i acc, __m512i u, __m512i s)
{
#if HYB_VNNI
	return _mm512_dpbusd_epi32(acc, u, s);
#else
	return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s),
							_mm512_set1_epi16(1)));
#endif
}

/* acc += a.lo*b.lo + a.hi*b.hi over int16 pairs */
static inline __attribute__((always_inline)) __m512i dot_ww(__m512i acc, __m512i a, __m512i b)
{
#if HYB_VNNI
	return _mm512_dpwssd_epi32(acc, a, b);
#else
	return _mm512_add_epi32(acc, _mm512_madd_epi16(a, b));
#endif
}

#endif
