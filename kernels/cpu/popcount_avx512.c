// SPDX-License-Identifier: MIT
/*
 * and_popcount (cpu_kernels.h) with AVX-512BW: popcount by nibble lookup
 * (vpshufb), the byte counts summed with vpsadbw; eight words per step.
 */
#include <immintrin.h>

#include "cpu_internal.h"

static void and_popcount(const uint64_t *a, const uint64_t *cols, uint32_t W,
			 const uint32_t *live, uint32_t n, uint32_t *out)
{
	const __m512i lut = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 1, 2, 1, 2, 2, 3, 1, 2,
								 2, 3, 2, 3, 3, 4));
	const __m512i m4 = _mm512_set1_epi8(0x0f);
	const uint32_t nv = (W + 7) / 8;
	const __mmask8 tail = W % 8 ? (__mmask8)((1u << (W % 8)) - 1) : (__mmask8)0xFF;

	for (uint32_t j = 0; j < n; j++) {
		const uint64_t *b = cols + (size_t)live[j] * W;
		__m512i acc = _mm512_setzero_si512(), tot = _mm512_setzero_si512();

		for (uint32_t v = 0; v < nv; v++) {
			const __mmask8 m = v + 1 < nv ? (__mmask8)0xFF : tail;
			__m512i x = _mm512_and_si512(_mm512_maskz_loadu_epi64(m, a + 8 * v),
						     _mm512_maskz_loadu_epi64(m, b + 8 * v));
			__m512i lo = _mm512_and_si512(x, m4);
			__m512i hi = _mm512_and_si512(_mm512_srli_epi16(x, 4), m4);

			acc = _mm512_add_epi8(acc, _mm512_add_epi8(_mm512_shuffle_epi8(lut, lo),
								   _mm512_shuffle_epi8(lut, hi)));
			if ((v & 15) == 15) { /* a byte holds at most 16 * 8 */
				const __m512i z = _mm512_setzero_si512();

				tot = _mm512_add_epi64(tot, _mm512_sad_epu8(acc, z));
				acc = _mm512_setzero_si512();
			}
		}
		tot = _mm512_add_epi64(tot, _mm512_sad_epu8(acc, _mm512_setzero_si512()));
		out[j] = (uint32_t)_mm512_reduce_add_epi64(tot);
	}
}

void hyb_fill_popcount_avx512(struct hyb_cpu_kernels *k)
{
	k->and_popcount = and_popcount;
}
