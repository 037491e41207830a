/* SPDX-License-Identifier: MIT */
/*
 * AVX-512 direct kernels for Q8_0 and Q4_0 (decode GEMV and small
 * batches), straight from the GGUF blocks. Part of gemm_q_avx512_body.h,
 * which includes it once per ISA level; the driver is in
 * gemm_q_avx512_direct.h.
 *
 * The integer dot products are exact, so they may be formed in any lane
 * layout; what must match llama.cpp is which integer sums are converted to
 * float and how those are scaled and added. Each family below says whose
 * arithmetic it reproduces.
 */

/* horizontal sum of the 8 floats of each 256-bit half, as hsum_float_8 (x86 quants.c) */
static inline __m512 hsum8_pairs(__m512 a)
{
	/* hi 128 + lo 128, then + the upper pair, then + the odd element */
	a = _mm512_add_ps(a, _mm512_shuffle_f32x4(a, a, _MM_SHUFFLE(2, 3, 0, 1)));
	a = _mm512_add_ps(a, _mm512_permute_ps(a, _MM_SHUFFLE(1, 0, 3, 2)));
	return _mm512_add_ps(a, _mm512_permute_ps(a, _MM_SHUFFLE(2, 3, 0, 1)));
}

/* [lo x 8 | hi x 8] as floats from two halves */
static inline __m512 pair_f16(uint16_t lo, uint16_t hi)
{
	return _mm512_cvtph_ps(_mm256_inserti128_si256(
		_mm256_castsi128_si256(_mm_set1_epi16((short)lo)), _mm_set1_epi16((short)hi), 1));
}

static inline uint16_t ld16(const void *p)
{
	uint16_t v;

	memcpy(&v, p, 2);
	return v;
}

/* the 16 int32 lanes of four vectors summed per vector: [sum a, sum b, sum c, sum d] */
static inline __m128i hsum4_epi32(__m512i a, __m512i b, __m512i c, __m512i d)
{
	const __m512i ab = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b),
					    _mm512_unpackhi_epi32(a, b));
	const __m512i cd = _mm512_add_epi32(_mm512_unpacklo_epi32(c, d),
					    _mm512_unpackhi_epi32(c, d));
	const __m512i t = _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd),
					   _mm512_unpackhi_epi64(ab, cd));
	const __m256i u = _mm256_add_epi32(_mm512_castsi512_si256(t),
					   _mm512_extracti64x4_epi64(t, 1));

	return _mm_add_epi32(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1));
}

/* ------------------------------------------------------------------------ */
/* Q8_0 and unrepacked Q4_0: ggml_vec_dot_q8_0_q8_0 / ggml_vec_dot_q4_0_q8_0 */

/*
 * One summation for every column count: llama.cpp's tinyBLAS_Q0_AVX (2+
 * columns) adds exactly what its vec_dot does (1 column). Per output 8
 * float lanes; lane l of block b is the exact sum of products 4l..4l+3,
 * added as fma(dw*dx, float(sum), acc) block after block; then
 * hsum_float_8. Here a zmm holds two rows' eight lanes, so the float chain
 * of each lane is the same one.
 */
struct q0_col {
	int8_t q[32];
	int32_t corr[8]; /* VNNI: minus the zero point times each lane's 4 quants */
	float d;
};

static void q0_prepack(int q40, const void *x, int64_t nb, struct q0_col *out)
{
	const struct hyb_block_q8_0 *b = x;
	/* weights as unsigned bytes: Q8_0 xor 0x80 (zero point 128), Q4_0 nibbles (8) */
	const __m256i z = _mm256_set1_epi8(q40 ? 8 : (char)0x80);

	for (int64_t i = 0; i < nb; i++) {
		const __m256i q = _mm256_loadu_si256((const __m256i *)b[i].qs);
		__m256i corr = _mm256_setzero_si256();

		if (HYB_VNNI || q40)
			corr = _mm256_sub_epi32(corr, _mm256_madd_epi16(_mm256_maddubs_epi16(z, q),
									_mm256_set1_epi16(1)));
		_mm256_storeu_si256((__m256i *)out[i].q, q);
		_mm256_storeu_si256((__m256i *)out[i].corr, corr);
		out[i].d = f16_scalar(b[i].d);
	}
}

/* rows 2p and 2p+1 of block b as unsigned bytes, [row | row] */
ALWAYS_INLINE __m512i q0_weights(int q40, const uint8_t *r0, const uint8_t *r1, int64_t b)
{
	if (q40) {
		const __m128i a = _mm_loadu_si128((const __m128i *)(r0 + b * 18 + 2));
		const __m128i c = _mm_loadu_si128((const __m128i *)(r1 + b * 18 + 2));
		__m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(a, a)),
					       _mm256_set_m128i(c, c), 1);

		/* 128-bit lanes 1 and 3 take the high nibbles: elements 16-31 */
		z = _mm512_mask_srli_epi16(z, 0xFF00FF00, z, 4);
		return _mm512_and_si512(z, _mm512_set1_epi8(0x0F));
	}
	return load_pair256(r0 + b * 34 + 2, r1 + b * 34 + 2);
}

ALWAYS_INLINE void q0_tile(const int q40, const int NC, int64_t nb, const uint8_t *const *wr,
			   const uint8_t *const *nx, const struct q0_col *const *xc, float *y,
			   size_t ys, int nr)
{
	const size_t bsz = q40 ? 18 : 34;
	__m512 acc[DR / 2][DC];
	float out[16];

	for (int p = 0; p < DR / 2; p++)
		for (int c = 0; c < NC; c++)
			acc[p][c] = _mm512_setzero_ps();
	for (int64_t b = 0; b < nb; b++) {
		if ((b & 1) == 0)
			prefetch_rows(nx, b * bsz, 1);
#pragma GCC unroll 2
		for (int p = 0; p < DR / 2; p++) {
			const uint8_t *r0 = wr[2 * p], *r1 = wr[2 * p + 1];
			__m512i w = q0_weights(q40, r0, r1, b);
			const __m512 dw = pair_f16(ld16(r0 + b * bsz), ld16(r1 + b * bsz));
#if HYB_VNNI
			if (!q40)
				w = _mm512_xor_si512(w, _mm512_set1_epi8((char)0x80));
#else
			const __mmask64 neg = q40 ? 0 : _mm512_movepi8_mask(w);

			if (!q40)
				w = _mm512_abs_epi8(w);
#endif
#pragma GCC unroll 4
			for (int c = 0; c < NC; c++) {
				const struct q0_col *xb = &xc[c][b];
				__m512i x = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)xb->q));
				const __m512i corr = _mm512_broadcast_i64x4(
					_mm256_loadu_si256((const __m256i *)xb->corr));
				__m512i d;
#if HYB_VNNI
				d = _mm512_dpbusd_epi32(corr, w, x);
#else
				if (!q40)
					x = _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x);
				d = _mm512_add_epi32(corr, _mm512_madd_epi16(_mm512_maddubs_epi16(w, x),
									     _mm512_set1_epi16(1)));
#endif
				acc[p][c] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(xb->d)),
							    _mm512_cvtepi32_ps(d), acc[p][c]);
			}
		}
	}
#pragma GCC unroll 4
	for (int c = 0; c < NC; c++) {
#pragma GCC unroll 2
		for (int p = 0; p < DR / 2; p++) {
			_mm512_storeu_ps(out, hsum8_pairs(acc[p][c]));
			if (2 * p < nr)
				y[(size_t)c * ys + 2 * p] = out[0];
			if (2 * p + 1 < nr)
				y[(size_t)c * ys + 2 * p + 1] = out[8];
		}
	}
}

/* ------------------------------------------------------------------------ */
/* repacked Q4_0, one to three columns: ggml_gemv_q4_0_8x8_q8_0            */

/*
 * Per output one float chain: acc = fma(float(dot of block b), dw*dx, acc)
 * block after block, as llama.cpp's 8x8 repacked GEMV and GEMM both do.
 * The integer dots of a quad of blocks come as 4 lanes per block per row;
 * a transposing add gives lane 4j + r = block j of row r, and the chain
 * then runs on 4 rows at once, one block (128-bit lane) after the other.
 */
struct q4r_col {
	__m512i lo, hi;  /* elements 0-15 / 16-31 of 4 blocks, one 128-bit lane each */
	__m512i init;    /* -8 * sum spread over the block's 4 lanes (exact in total) */
	__m512 d;        /* dx per block, 4 lanes each */
};

static void q4r_prepack(const void *x, int64_t nb, struct q4r_col *out)
{
	const struct hyb_block_q8_0 *b = x;

	for (int64_t q = 0; q < (nb + 3) / 4; q++) {
		int32_t init[16];
		float d[16];
		int8_t lo[64], hi[64];

		for (int i = 0; i < 4; i++) {
			const int64_t bi = 4 * q + i;
			const int have = bi < nb;
			const int32_t s = have ? -2 * q8_block_sum(&b[bi]) : 0;
			const float dx = have ? f16_scalar(b[bi].d) : 0.0f;

			for (int l = 0; l < 4; l++) {
				init[4 * i + l] = s;
				d[4 * i + l] = dx;
			}
			if (have) {
				memcpy(lo + 16 * i, b[bi].qs, 16);
				memcpy(hi + 16 * i, b[bi].qs + 16, 16);
			} else {
				memset(lo + 16 * i, 0, 16);
				memset(hi + 16 * i, 0, 16);
			}
		}
		out[q].lo = _mm512_loadu_si512(lo);
		out[q].hi = _mm512_loadu_si512(hi);
		out[q].init = _mm512_loadu_si512(init);
		out[q].d = _mm512_loadu_ps(d);
	}
}

/* the quants of n (1..4) blocks from p, block j in 128-bit lane j */
ALWAYS_INLINE __m512i q4_quad(const uint8_t *p, int n)
{
	__m512i w = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(p + 2)));

	if (n == 4) {
		w = _mm512_inserti32x4(w, _mm_loadu_si128((const __m128i *)(p + 20)), 1);
		w = _mm512_inserti32x4(w, _mm_loadu_si128((const __m128i *)(p + 38)), 2);
		return _mm512_inserti32x4(w, _mm_loadu_si128((const __m128i *)(p + 56)), 3);
	}
	w = _mm512_zextsi128_si512(_mm512_castsi512_si128(w));
	if (n > 1)
		w = _mm512_inserti32x4(w, _mm_loadu_si128((const __m128i *)(p + 20)), 1);
	if (n > 2)
		w = _mm512_inserti32x4(w, _mm_loadu_si128((const __m128i *)(p + 38)), 2);
	return w;
}

/* the 4 block scales (bytes 0, 18, 36, 54 of a quad) spread over 4 lanes each */
static const uint16_t q4d_didx[32] = {
	0, 0, 0, 0, 9, 9, 9, 9, 18, 18, 18, 18, 27, 27, 27, 27,
};

ALWAYS_INLINE void q4r_tile(const int NC, int64_t nb, const uint8_t *const *wr,
			    const uint8_t *const *nx, const struct q4r_col *const *xc, float *y,
			    size_t ys, int nr)
{
	const __m512i didx = _mm512_loadu_si512(q4d_didx);
	const __m512i m4 = _mm512_set1_epi8(0x0F);
	__m128 acc[DC];
	float out[4];

	for (int c = 0; c < NC; c++)
		acc[c] = _mm_setzero_ps();
	for (int64_t q = 0; q < (nb + 3) / 4; q++) {
		const int64_t off = q * 72;
		const int n = (int)min64(4, nb - 4 * q);
		/* words of the scales' load that exist: 9 per block */
		const __mmask32 dm = n == 4 ? 0xFFFFFFFF : (__mmask32)((1u << (9 * n)) - 1);
		__m512i sr[DR][DC];
		__m512 dw, d[DR];

		prefetch_rows(nx, off, 2);
		/* one row at a time: its quants serve every column, then are dropped */
#pragma GCC unroll 4
		for (int r = 0; r < DR; r++) {
			const __m512i w = q4_quad(wr[r] + off, n);
			const __m512i lo = _mm512_and_si512(w, m4);
			const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), m4);

			d[r] = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi16(
				didx, _mm512_maskz_loadu_epi16(dm, wr[r] + off))));
#pragma GCC unroll 4
			for (int c = 0; c < NC; c++) {
				const struct q4r_col *xp = &xc[c][q];
#if HYB_VNNI
				sr[r][c] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(xp->init, lo, xp->lo),
							       hi, xp->hi);
#else
				const __m512i p16 = _mm512_add_epi16(_mm512_maddubs_epi16(lo, xp->lo),
								     _mm512_maddubs_epi16(hi, xp->hi));

				sr[r][c] = _mm512_add_epi32(_mm512_madd_epi16(p16, _mm512_set1_epi16(1)),
							    xp->init);
#endif
			}
		}
		/* lane 4j + r: the scale of row r, block j */
		dw = _mm512_mask_blend_ps(0x2222, d[0], d[1]);
		dw = _mm512_mask_blend_ps(0x4444, dw, d[2]);
		dw = _mm512_mask_blend_ps(0x8888, dw, d[3]);
#pragma GCC unroll 4
		for (int c = 0; c < NC; c++) {
			const struct q4r_col *xp = &xc[c][q];

			/* block sums: lane 4j + r = block j of row r */
			const __m512i ab = _mm512_add_epi32(_mm512_unpacklo_epi32(sr[0][c], sr[1][c]),
							    _mm512_unpackhi_epi32(sr[0][c], sr[1][c]));
			const __m512i cd = _mm512_add_epi32(_mm512_unpacklo_epi32(sr[2][c], sr[3][c]),
							    _mm512_unpackhi_epi32(sr[2][c], sr[3][c]));
			const __m512 f = _mm512_cvtepi32_ps(_mm512_add_epi32(
				_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd)));
			const __m512 sc = _mm512_mul_ps(dw, xp->d);

			acc[c] = _mm_fmadd_ps(_mm512_castps512_ps128(f), _mm512_castps512_ps128(sc),
					      acc[c]);
			if (n > 1)
				acc[c] = _mm_fmadd_ps(_mm512_extractf32x4_ps(f, 1),
						      _mm512_extractf32x4_ps(sc, 1), acc[c]);
			if (n > 2)
				acc[c] = _mm_fmadd_ps(_mm512_extractf32x4_ps(f, 2),
						      _mm512_extractf32x4_ps(sc, 2), acc[c]);
			if (n > 3)
				acc[c] = _mm_fmadd_ps(_mm512_extractf32x4_ps(f, 3),
						      _mm512_extractf32x4_ps(sc, 3), acc[c]);
		}
	}
#pragma GCC unroll 4
	for (int c = 0; c < NC; c++) {
		_mm_storeu_ps(out, acc[c]);
		for (int r = 0; r < nr; r++)
			y[(size_t)c * ys + r] = out[r];
	}
}

