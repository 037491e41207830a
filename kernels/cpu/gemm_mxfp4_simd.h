/* SPDX-License-Identifier: MIT */
/*
 * MXFP4 times Q8_0 in vector registers: the sums of gemm_mxfp4.c, whose
 * comment says whose they are. Included by gemm_mxfp4_avx2.c (MXFP4_VNNI
 * 0) and gemm_mxfp4_avx512vnni.c (1); SFX names the level's functions.
 * Every integer dot is exact: the levels are E2M1 values doubled (|level|
 * <= 12), so without VNNI vpmaddubsw of |level| with the activation's
 * sign-adjusted codes cannot saturate; with VNNI vpdpbusd takes level + 128
 * (unsigned) and 128 times the activation's sum is taken off again.
 */
#include <immintrin.h>
#include <string.h>

#include "cpu_internal.h"

/* the levels (VNNI: + 128, as unsigned bytes) in both 128-bit lanes */
static inline __m256i lut(void)
{
	const __m256i t =
		_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)hyb_kvalues_mxfp4));

	return MXFP4_VNNI ? _mm256_xor_si256(t, _mm256_set1_epi8((char)0x80)) : t;
}

/* the block's 32 levels in element order: low nibbles, then high */
static inline __m256i levels(const struct hyb_block_mxfp4 *b, __m256i t)
{
	const __m128i q = _mm_loadu_si128((const __m128i *)b->qs);
	const __m128i m = _mm_set1_epi8(0x0F);
	const __m256i n = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m),
					   _mm_and_si128(q, m));

	return _mm256_shuffle_epi8(t, n);
}

/*
 * 8 int32 lanes: lane l the exact sum of products 4l..4l+3 (VNNI: plus 128
 * times the sum of x's 4l..4l+3, which xoff() gives)
 */
static inline __m256i dot_lanes(__m256i w, __m256i x)
{
#if MXFP4_VNNI
	return _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, x);
#else
	const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));

	return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
#endif
}

/* what dot_lanes adds to each lane beyond the dot: 128 x (sum of its 4 x) */
static inline __m256i xoff(__m256i x)
{
#if MXFP4_VNNI
	return _mm256_slli_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(),
						     _mm256_set1_epi8(1), x), 7);
#else
	(void)x;
	return _mm256_setzero_si256();
#endif
}

/* the exact lanes of a block */
static inline __m256i block_lanes(const struct hyb_block_mxfp4 *w, const struct hyb_block_q8_0 *x,
				  __m256i t)
{
	const __m256i xq = _mm256_loadu_si256((const __m256i *)x->qs);

	return _mm256_sub_epi32(dot_lanes(levels(w, t), xq), xoff(xq));
}

static inline float f16(uint16_t h)
{
	return _cvtsh_ss(h);
}

/* hyb_e8m0_half of block b of 8 rows, in registers (no store-to-load stall) */
static inline __m256 e8m0_half8(const struct hyb_block_mxfp4 *const *wr, int64_t b)
{
	const __m256i e = _mm256_setr_epi32(wr[0][b].e, wr[1][b].e, wr[2][b].e, wr[3][b].e,
					    wr[4][b].e, wr[5][b].e, wr[6][b].e, wr[7][b].e);
	const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
	const __m256i denormal = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
	const __m256i is_normal = _mm256_cmpgt_epi32(e, _mm256_set1_epi32(1));

	return _mm256_castsi256_ps(_mm256_blendv_epi8(denormal, normal, is_normal));
}

/* k up to 32768 (rows of gpt-oss-120b's experts are 2880): a column's block offsets on the stack */
#define HYB_MXFP4_MAX_BLOCKS 1024

/* rows % 8 == 0: one float chain per output, 8 rows at a time */
static void SFX(gemm_chain)(HYB_GEMM_ARGS)
{
	const int64_t nb = k / HYB_QK8_0;
	const __m256i t = lut();

	if (hyb_gemm_trivial(k, nrows, ncols, y, y_stride))
		return;
#if MXFP4_VNNI
	/* prompts: the packed kernel, whose float chains are these */
	if (!hyb_gemm_mxfp4_packed_avx512vnni(k, w, w_stride, nrows, x, x_stride, ncols, y,
					      y_stride))
		return;
#endif
	for (int64_t c = 0; c < ncols; c++) {
		const struct hyb_block_q8_0 *xb =
			(const struct hyb_block_q8_0 *)((const char *)x + c * x_stride);
		int64_t r0 = 0;
		/* what dot_lanes adds to a whole block beyond the dot (VNNI: 128 sum x) */
		int32_t xs[HYB_MXFP4_MAX_BLOCKS];

		if (nb > HYB_MXFP4_MAX_BLOCKS) {
			hyb_gemm_mxfp4_chain_scalar(k, w, w_stride, nrows, xb, x_stride, 1,
						    y + c * y_stride, y_stride);
			continue;
		}
		for (int64_t b = 0; b < nb; b++) {
			int32_t sum = 0;

			for (int i = 0; i < 32 && MXFP4_VNNI; i++)
				sum += xb[b].qs[i];
			xs[b] = 128 * sum;
		}

		for (; r0 + 8 <= nrows; r0 += 8) {
			const struct hyb_block_mxfp4 *wr[8];
			__m256 acc = _mm256_setzero_ps();

			/*
			 * The next 8 rows into cache in address order, at the rate these
			 * are read: 8 short rows read side by side are 8 streams in the
			 * same pages, which the prefetchers do not follow
			 * (docs/PERFORMANCE.md section 1)
			 */
			const char *pf = (const char *)w + (r0 + 8) * w_stride;
			const char *pf_end = r0 + 16 <= nrows ? pf + 8 * w_stride : pf;
			const size_t pf_step = (8 * w_stride + (size_t)nb - 1) / (size_t)nb;

			for (int r = 0; r < 8; r++)
				wr[r] = (const struct hyb_block_mxfp4 *)((const char *)w +
									 (r0 + r) * w_stride);
			for (int64_t b = 0; b < nb; b++) {
				int32_t xw[8];

				for (const char *e = pf + pf_step; pf < e && pf < pf_end; pf += 64)
					_mm_prefetch(pf, _MM_HINT_T0);
				memcpy(xw, xb[b].qs, sizeof(xw));
				/*
				 * llama.cpp's repacked layout made on the fly: the 4-byte
				 * word g of the 8 rows' codes side by side (a 4x4 transpose
				 * in each 128-bit lane: rows 0-3 low, 4-7 high), so that one
				 * dot per group of 4 elements gives row r's sums in lane r
				 */
				__m256i q[4], u[4], s = _mm256_setzero_si256();

				for (int r = 0; r < 4; r++)
					q[r] = _mm256_loadu2_m128i((const __m128i *)wr[r + 4][b].qs,
								   (const __m128i *)wr[r][b].qs);
				u[0] = _mm256_unpacklo_epi32(q[0], q[1]);
				u[1] = _mm256_unpackhi_epi32(q[0], q[1]);
				u[2] = _mm256_unpacklo_epi32(q[2], q[3]);
				u[3] = _mm256_unpackhi_epi32(q[2], q[3]);
				q[0] = _mm256_unpacklo_epi64(u[0], u[2]);
				q[1] = _mm256_unpackhi_epi64(u[0], u[2]);
				q[2] = _mm256_unpacklo_epi64(u[1], u[3]);
				q[3] = _mm256_unpackhi_epi64(u[1], u[3]);
				for (int g = 0; g < 4; g++) {
					/* word g: elements 4g.. (low nibbles), 16 + 4g.. (high) */
					const __m256i m = _mm256_set1_epi8(0x0F);
					const __m256i lo = _mm256_shuffle_epi8(t, _mm256_and_si256(q[g], m));
					const __m256i hi = _mm256_shuffle_epi8(
						t, _mm256_and_si256(_mm256_srli_epi16(q[g], 4), m));

					s = _mm256_add_epi32(s, dot_lanes(lo, _mm256_set1_epi32(xw[g])));
					s = _mm256_add_epi32(s, dot_lanes(hi, _mm256_set1_epi32(xw[g + 4])));
				}
				s = _mm256_sub_epi32(s, _mm256_set1_epi32(xs[b]));
				const __m256 d = _mm256_mul_ps(e8m0_half8(wr, b), _mm256_set1_ps(f16(xb[b].d)));

				acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), d, acc);
			}
			_mm256_storeu_ps(y + c * y_stride + r0, acc);
		}
		if (r0 < nrows)
			hyb_gemm_mxfp4_chain_scalar(k, (const char *)w + r0 * w_stride, w_stride,
						    nrows - r0, xb, x_stride, 1, y + c * y_stride + r0,
						    y_stride);
	}
}

/* ggml_vec_dot_mxfp4_q8_0's AVX2 branch, one output at a time */
static void SFX(gemm_vecdot)(HYB_GEMM_ARGS)
{
	const int64_t nb = k / HYB_QK8_0;
	const __m256i t = lut();

	if (hyb_gemm_trivial(k, nrows, ncols, y, y_stride))
		return;
	for (int64_t c = 0; c < ncols; c++) {
		const struct hyb_block_q8_0 *xb =
			(const struct hyb_block_q8_0 *)((const char *)x + c * x_stride);

		for (int64_t r = 0; r < nrows; r++) {
			const struct hyb_block_mxfp4 *wb =
				(const struct hyb_block_mxfp4 *)((const char *)w + r * w_stride);
			__m256 a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps();
			int64_t b = 0;
			float sumf;

			for (; b + 1 < nb; b += 2) {
				const __m256i p1 = block_lanes(&wb[b], &xb[b], t);
				const __m256i p2 = block_lanes(&wb[b + 1], &xb[b + 1], t);
				const float d1 = f16(xb[b].d) * hyb_e8m0_half(wb[b].e);
				const float d2 = f16(xb[b + 1].d) * hyb_e8m0_half(wb[b + 1].e);

				a1 = _mm256_fmadd_ps(_mm256_set1_ps(d1), _mm256_cvtepi32_ps(p1), a1);
				a2 = _mm256_fmadd_ps(_mm256_set1_ps(d2), _mm256_cvtepi32_ps(p2), a2);
			}
			/* hsum_float_8 */
			const __m256 v = _mm256_add_ps(a1, a2);
			__m128 h = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));

			h = _mm_add_ps(h, _mm_movehl_ps(h, h));
			h = _mm_add_ss(h, _mm_movehdup_ps(h));
			sumf = _mm_cvtss_f32(h);
			if (b < nb) {
				/* the odd last block, in scalar code: sumf += d * sumi, not fused */
				int32_t lanes[8], sumi = 0;
				const float d = f16(xb[b].d) * hyb_e8m0_half(wb[b].e);

				_mm256_storeu_si256((__m256i *)lanes, block_lanes(&wb[b], &xb[b], t));
				for (int l = 0; l < 8; l++)
					sumi += lanes[l];
				sumf += d * (float)sumi; /* -std=c11: not contracted */
			}
			y[c * y_stride + r] = sumf;
		}
	}
}

void SFX(hyb_fill_mxfp4)(struct hyb_cpu_kernels *k)
{
	hyb_set_gemm(k, HYB_TYPE_MXFP4, SFX(gemm_vecdot));
	k->gemm[HYB_TYPE_MXFP4] = SFX(gemm_chain); /* rows % 8 == 0: repacked */
}
