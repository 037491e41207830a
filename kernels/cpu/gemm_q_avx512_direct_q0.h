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
/* the 32-element block types: ggml_vec_dot_{q8_0,q4_0,q5_0}_q8_0,          */
/* ggml_vec_dot_{q4_1,q5_1}_q8_1, ggml_vec_dot_iq4_nl_q8_0, tinyBLAS_Q0_AVX */

/*
 * One summation for every column count, except IQ4_NL's vec_dot: llama.cpp's
 * tinyBLAS_Q0_AVX (2+ columns; Q8_0, Q4_0, Q5_0, IQ4_NL) adds exactly what
 * the x86 vec_dot does (1 column), and Q4_1/Q5_1 have only their vec_dot
 * (llamafile_sgemm declines Q8_1 activations). Per output 8 float lanes;
 * lane l of block b is the exact sum of products 4l..4l+3, added as
 * fma(dw*dx, float(sum), acc) block after block; then hsum_float_8. Here
 * a zmm holds two rows' eight lanes, so the float chain of each lane is
 * the same one.
 *
 * - Q4_1/Q5_1 add m*s per block in a scalar float chain (summs) and
 *   return hsum_float_8(acc) + summs: lanes 0 and 8 of a second zmm.
 * - ggml_vec_dot_iq4_nl_q8_0 keeps two chains, even and odd blocks, adds
 *   them lane by lane before the hsum, and an odd last block in scalar
 *   code: sumf += d * sumi (Q0_NL2).
 */
enum q0k { Q0_Q8, Q0_Q4, Q0_Q5, Q0_NL, Q0_NL2, Q0_Q41, Q0_Q51 };

ALWAYS_INLINE int q0_bsz(const int kd)
{
	return kd == Q0_Q8 ? 34 : kd == Q0_Q5 ? 22 : kd == Q0_Q41 ? 20 : kd == Q0_Q51 ? 24 : 18;
}

/* byte offsets of the quants' low nibbles (or int8) and of qh in a block */
ALWAYS_INLINE int q0_qs(const int kd)
{
	return kd == Q0_Q5 ? 6 : kd == Q0_Q41 ? 4 : kd == Q0_Q51 ? 8 : 2;
}

ALWAYS_INLINE int q0_qh(const int kd)
{
	return kd == Q0_Q5 ? 2 : 4;
}

/* signed weights (Q8_0 codes, IQ4_NL levels): vpdpbusd takes them xor 0x80 */
ALWAYS_INLINE int q0_signed(const int kd)
{
	return kd == Q0_Q8 || kd == Q0_NL || kd == Q0_NL2;
}

ALWAYS_INLINE int q0_min(const int kd)
{
	return kd == Q0_Q41 || kd == Q0_Q51;
}

/* the zero point paid back through the activation sums: dot(q - z, x) = dot(q, x) - z*sum(x) */
ALWAYS_INLINE int q0_zero(const int kd)
{
	if (q0_signed(kd))
		return HYB_VNNI ? 128 : 0; /* without VNNI: the sign trick, no zero point */
	return kd == Q0_Q4 ? 8 : kd == Q0_Q5 ? 16 : 0;
}

struct q0_col {
	int8_t q[32];
	int32_t corr[8]; /* minus the zero point times each lane's 4 quants */
	float d;
	float s; /* Q8_1: the block's s */
};

static void q0_prepack(const int kd, const void *x, int64_t nb, struct q0_col *out)
{
	/* Q8_0 blocks, or Q8_1 (d, s, then the quants) for Q4_1/Q5_1 */
	const size_t bs = q0_min(kd) ? sizeof(struct hyb_block_q8_1) : sizeof(struct hyb_block_q8_0);
	const size_t qo = q0_min(kd) ? 4 : 2;
	const __m256i z = _mm256_set1_epi8((char)q0_zero(kd));

	for (int64_t i = 0; i < nb; i++) {
		const uint8_t *b = (const uint8_t *)x + (size_t)i * bs;
		const __m256i q = _mm256_loadu_si256((const __m256i *)(b + qo));
		__m256i corr = _mm256_setzero_si256();

		if (q0_zero(kd))
			corr = _mm256_sub_epi32(corr, _mm256_madd_epi16(_mm256_maddubs_epi16(z, q),
									_mm256_set1_epi16(1)));
		_mm256_storeu_si256((__m256i *)out[i].q, q);
		_mm256_storeu_si256((__m256i *)out[i].corr, corr);
		out[i].d = f16_scalar(ld16(b));
		out[i].s = q0_min(kd) ? f16_scalar(ld16(b + 2)) : 0.0f;
	}
}

/* IQ4_NL's levels in every 128-bit lane, xor 0x80 where vpdpbusd takes them unsigned */
static inline __m512i nl_lut(void)
{
	const __m128i v = _mm_loadu_si128((const __m128i *)hyb_kvalues_iq4nl);

	return _mm512_broadcast_i32x4(HYB_VNNI ? _mm_xor_si128(v, _mm_set1_epi8((char)0x80)) : v);
}

/*
 * rows r0 and r1 of block b, [row | row], element j of a row in byte j:
 * unsigned codes (with the zero point), or for the signed kinds IQ4_NL's
 * levels (xor 0x80 with VNNI) and Q8_0's int8 (raw)
 */
ALWAYS_INLINE __m512i q0_weights(const int kd, const uint8_t *r0, const uint8_t *r1, int64_t b)
{
	const size_t bsz = (size_t)q0_bsz(kd), qs = (size_t)q0_qs(kd);

	if (kd != Q0_Q8) {
		const __m128i a = _mm_loadu_si128((const __m128i *)(r0 + b * bsz + qs));
		const __m128i c = _mm_loadu_si128((const __m128i *)(r1 + b * bsz + qs));
		__m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(a, a)),
					       _mm256_set_m128i(c, c), 1);

		/* 128-bit lanes 1 and 3 take the high nibbles: elements 16-31 */
		z = _mm512_mask_srli_epi16(z, 0xFF00FF00, z, 4);
		z = _mm512_and_si512(z, _mm512_set1_epi8(0x0F));
		if (kd == Q0_NL || kd == Q0_NL2)
			return _mm512_shuffle_epi8(nl_lut(), z);
		if (kd == Q0_Q5 || kd == Q0_Q51) {
			/* bit j of qh is bit 4 of element j */
			const uint64_t h = (uint32_t)ld32(r0 + b * bsz + q0_qh(kd)) |
					   (uint64_t)(uint32_t)ld32(r1 + b * bsz + q0_qh(kd)) << 32;

			z = _mm512_mask_add_epi8(z, _cvtu64_mask64(h), z, _mm512_set1_epi8(16));
		}
		return z;
	}
	return load_pair256(r0 + b * 34 + 2, r1 + b * 34 + 2);
}

/* the 16 int32 lanes of one row pair and column for block b */
ALWAYS_INLINE __m512i q0_dot(const int kd, __m512i w, __mmask64 neg, const struct q0_col *xb)
{
	__m512i x = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)xb->q));
	const __m512i corr = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)xb->corr));

#if HYB_VNNI
	(void)neg;
	(void)kd;
	return _mm512_dpbusd_epi32(corr, w, x);
#else
	if (q0_signed(kd))
		x = _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x);
	return _mm512_add_epi32(corr, _mm512_madd_epi16(_mm512_maddubs_epi16(w, x),
							_mm512_set1_epi16(1)));
#endif
}

ALWAYS_INLINE void q0_tile(const int kd, const int NC, int64_t nb, const uint8_t *const *wr,
			   const uint8_t *const *nx, const struct q0_col *const *xc, float *y,
			   size_t ys, int nr)
{
	const size_t bsz = (size_t)q0_bsz(kd);
	const int two = kd == Q0_NL2;
	/* the blocks the vector chains take: all but an odd last one for Q0_NL2 */
	const int64_t nbv = two ? nb & ~(int64_t)1 : nb;
	__m512 acc[2][DR / 2][DC], sm[DR / 2][DC];
	float out[16], ms[16];
	/*
	 * Consecutive rows (not direct_run's streams): the next tile is one
	 * run of memory, prefetched in address order at the rate this tile
	 * reads (DR blocks a step), where the L2 streamer runs on ahead of it
	 * (as q4g_quad's; measured on the decode GEMV, docs/PERFORMANCE.md).
	 */
	const ptrdiff_t rs = wr[1] - wr[0];
	const int lin = nx[1] - nx[0] == rs && nx[DR - 1] - nx[0] == (DR - 1) * rs && NC == 1;
	const uint8_t *pf = nx[0], *const pf_end = nx[0] + DR * rs;

	for (int p = 0; p < DR / 2; p++)
		for (int c = 0; c < NC; c++) {
			acc[0][p][c] = _mm512_setzero_ps();
			if (two)
				acc[two][p][c] = _mm512_setzero_ps();
			sm[p][c] = _mm512_setzero_ps();
		}
	for (int64_t b = 0; b < nbv; b++) {
		if (lin) {
			const uint8_t *to = nx[0] + (b + 1) * DR * (int64_t)bsz;

			for (; pf < to && pf < pf_end; pf += 64)
				_mm_prefetch((const char *)pf, PF_HINT);
		} else if ((b & 1) == 0) {
			prefetch_rows(nx, b * bsz, 1);
		}
#pragma GCC unroll 2
		for (int p = 0; p < DR / 2; p++) {
			const uint8_t *r0 = wr[2 * p], *r1 = wr[2 * p + 1];
			__m512i w = q0_weights(kd, r0, r1, b);
			const __m512 dw = pair_f16(ld16(r0 + b * bsz), ld16(r1 + b * bsz));
			__mmask64 neg = 0;
#if HYB_VNNI
			if (kd == Q0_Q8)
				w = _mm512_xor_si512(w, _mm512_set1_epi8((char)0x80));
#else
			if (q0_signed(kd)) {
				neg = _mm512_movepi8_mask(w);
				w = _mm512_abs_epi8(w);
			}
#endif
#pragma GCC unroll 4
			for (int c = 0; c < NC; c++) {
				const struct q0_col *xb = &xc[c][b];
				const __m512i d = q0_dot(kd, w, neg, xb);
				const int ch = two ? (int)(b & 1) : 0;

				acc[ch][p][c] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(xb->d)),
								_mm512_cvtepi32_ps(d), acc[ch][p][c]);
				/* summs += m * s: ggml's C, contracted to one fma by its build */
				if (q0_min(kd))
					sm[p][c] = _mm512_fmadd_ps(pair_f16(ld16(r0 + b * bsz + 2),
									    ld16(r1 + b * bsz + 2)),
								   _mm512_set1_ps(xb->s), sm[p][c]);
			}
		}
	}
#pragma GCC unroll 4
	for (int c = 0; c < NC; c++) {
#pragma GCC unroll 2
		for (int p = 0; p < DR / 2; p++) {
			__m512 a = acc[0][p][c];

			if (two)
				a = _mm512_add_ps(a, acc[two][p][c]);
			_mm512_storeu_ps(out, hsum8_pairs(a));
			if (q0_min(kd)) {
				_mm512_storeu_ps(ms, sm[p][c]);
				out[0] += ms[0];
				out[8] += ms[8];
			}
			if (two && nbv < nb) {
				/* the odd last block: sumf += d * sumi, d = dx * dw (not contracted there) */
				const struct q0_col *xb = &xc[c][nbv];
				const uint8_t *r0 = wr[2 * p], *r1 = wr[2 * p + 1];
				__m512i w = q0_weights(kd, r0, r1, nbv);
				__mmask64 neg = 0;
				int32_t si[16];
#if !HYB_VNNI
				neg = _mm512_movepi8_mask(w);
				w = _mm512_abs_epi8(w);
#endif
				_mm512_storeu_si512(si, q0_dot(kd, w, neg, xb));
				for (int h = 0; h < 2; h++) {
					int32_t t = 0;

					for (int l = 0; l < 8; l++)
						t += si[8 * h + l];
					out[8 * h] += xb->d * f16_scalar(ld16((h ? r1 : r0) + nbv * bsz)) *
						      (float)t;
				}
			}
			if (2 * p < nr)
				y[(size_t)c * ys + 2 * p] = out[0];
			if (2 * p + 1 < nr)
				y[(size_t)c * ys + 2 * p + 1] = out[8];
		}
	}
}

/* ------------------------------------------------------------------------ */
/* repacked Q4_0 (1-3 columns) and IQ4_NL (any): ggml_gemv_q4_0_8x8_q8_0, */
/* ggml_{gemv,gemm}_iq4_nl_8x8_q8_0 (gemv/gemm_q4_b32_8x8_q8_0_lut_avx)     */

/*
 * Per output one float chain: acc = fma(float(dot of block b), dw*dx, acc)
 * block after block, as llama.cpp's 8x8 repacked GEMV and GEMM both do.
 * The integer dots of a quad of blocks come as 4 lanes per block per row;
 * a transposing add gives lane 4j + r = block j of row r, and the chain
 * then runs on 4 rows at once, one block (128-bit lane) after the other.
 * IQ4_NL's repacked kernels are Q4_0's with another table of levels
 * (arch/x86/repack.cpp), so the same tile serves it (nl): the nibbles go
 * through the table, xor 0x80 with VNNI (zero point 128); without VNNI
 * the products of levels up to 127 need the sign trick and one vpmaddwd
 * per half (an int16 sum of both halves could overflow).
 */
struct q4r_col {
	__m512i lo, hi;  /* elements 0-15 / 16-31 of 4 blocks, one 128-bit lane each */
	__m512i init;    /* -8 * sum spread over the block's 4 lanes (exact in total) */
	__m512 d;        /* dx per block, 4 lanes each */
};

static void q4r_prepack(int nl, const void *x, int64_t nb, struct q4r_col *out)
{
	/* the zero point over a block's 4 lanes: 8 / 4, or 128 / 4 (none without VNNI) */
	const int32_t zl = nl ? (HYB_VNNI ? 32 : 0) : 2;

	const struct hyb_block_q8_0 *b = x;

	for (int64_t q = 0; q < (nb + 3) / 4; q++) {
		int32_t init[16];
		float d[16];
		int8_t lo[64], hi[64];

		for (int i = 0; i < 4; i++) {
			const int64_t bi = 4 * q + i;
			const int have = bi < nb;
			const int32_t s = have ? -zl * q8_block_sum(&b[bi]) : 0;
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

ALWAYS_INLINE void q4r_tile(const int nl, const int NC, int64_t nb, const uint8_t *const *wr,
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
			__m512i lo = _mm512_and_si512(w, m4);
			__m512i hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), m4);
#if !HYB_VNNI
			__mmask64 nlo = 0, nhi = 0;
#endif

			if (nl) {
				lo = _mm512_shuffle_epi8(nl_lut(), lo);
				hi = _mm512_shuffle_epi8(nl_lut(), hi);
#if !HYB_VNNI
				nlo = _mm512_movepi8_mask(lo);
				nhi = _mm512_movepi8_mask(hi);
				lo = _mm512_abs_epi8(lo);
				hi = _mm512_abs_epi8(hi);
#endif
			}

			d[r] = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi16(
				didx, _mm512_maskz_loadu_epi16(dm, wr[r] + off))));
#pragma GCC unroll 4
			for (int c = 0; c < NC; c++) {
				const struct q4r_col *xp = &xc[c][q];
#if HYB_VNNI
				sr[r][c] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(xp->init, lo, xp->lo),
							       hi, xp->hi);
#else
				if (nl) {
					const __m512i z = _mm512_setzero_si512();
					const __m512i xl = _mm512_mask_sub_epi8(xp->lo, nlo, z, xp->lo);
					const __m512i xh = _mm512_mask_sub_epi8(xp->hi, nhi, z, xp->hi);

					sr[r][c] = _mm512_add_epi32(
						_mm512_madd_epi16(_mm512_maddubs_epi16(lo, xl), _mm512_set1_epi16(1)),
						_mm512_madd_epi16(_mm512_maddubs_epi16(hi, xh), _mm512_set1_epi16(1)));
				} else {
					const __m512i p16 = _mm512_add_epi16(_mm512_maddubs_epi16(lo, xp->lo),
									     _mm512_maddubs_epi16(hi, xp->hi));

					sr[r][c] = _mm512_add_epi32(_mm512_madd_epi16(p16, _mm512_set1_epi16(1)),
								    xp->init);
				}
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

/* ------------------------------------------------------------------------ */
/* repacked Q4_0, one column, 16 rows per tile                              */

/*
 * The same summation as q4r_tile (per output acc = fma(float(dot of block
 * b), dw*dx, acc), block after block), with fewer instructions per byte:
 * decode streams every weight once, and at 4 rows x 4 blocks per step the
 * float side and the per-row scale shuffles made q4r_tile no faster than
 * DRAM (measured with the weights in L2: 4.3 bytes/cycle, Q8_0's kernel
 * 8.8), so it ran at 70% of the bandwidth; this one does about 8.5.
 *
 * - Two plain loads per row and quad of blocks, at -2 and +8 from the
 *   quad: in the first, block 0's and 2's quants sit on 4-byte boundaries
 *   and all four scales are present; in the second, block 1's and 3's. One
 *   vpermt2d lines the four blocks up in 128-bit lanes (no inserts).
 * - The integer dot of 8 products per 32-bit lane fits int16 (q <= 15,
 *   |x| <= 128: 15360), so pairs of rows are reduced with vpackssdw + vpmaddwd:
 *   two steps give lane 4j + i = block j of row i of a group of 4, exact.
 *   One 4x4 transpose of 128-bit lanes then gives, per block, the 16
 *   rows' sums in row order, and one zmm FMA per block serves 16 chains.
 * - Scales: each row's first load holds its 4 block scales, one per
 *   128-bit lane; a masked vpshufb drops them into word r % 8 of that
 *   lane of one of two vectors (rows 0-7, 8-15).
 * - Repacked IQ4_NL (nl, VNNI only) takes the same tile: the nibbles go
 *   through the table of levels + 128, and since 8 products of levels up
 *   to 127 overflow int16, its rows are reduced in int32 (vpunpck + add,
 *   two more instructions per row); the zero point is 128.
 */
struct q4g_col {
	__m512i lo, hi;  /* elements 0-15 / 16-31 of 4 blocks, one 128-bit lane each */
	__m512i init;    /* lane 4j + i: -8 (IQ4_NL: -128) * sum of block j (the zero point) */
};

/* per column: (nb + 3) / 4 quads, then 4 floats dx per quad */
static size_t q4g_bytes(int64_t nb)
{
	const size_t nq = (size_t)(nb + 3) / 4;

	return nq * sizeof(struct q4g_col) + nq * 4 * sizeof(float);
}

static void q4g_prepack(int nl, const void *x, int64_t nb, struct q4g_col *out, float *dx)
{
	const int32_t zp = nl ? 128 : 8;
	const struct hyb_block_q8_0 *b = x;

	for (int64_t q = 0; q < (nb + 3) / 4; q++) {
		uint8_t *lo = (uint8_t *)&out[q].lo, *hi = (uint8_t *)&out[q].hi;
		int32_t init[16];

		for (int j = 0; j < 4; j++) {
			const int64_t bi = 4 * q + j;
			const int have = bi < nb;
			const int32_t s = have ? -zp * q8_block_sum(&b[bi]) : 0;

			for (int i = 0; i < 4; i++)
				init[4 * j + i] = s;
			dx[4 * q + j] = have ? f16_scalar(b[bi].d) : 0.0f;
			if (have) {
				memcpy(lo + 16 * j, b[bi].qs, 16);
				memcpy(hi + 16 * j, b[bi].qs + 16, 16);
			} else {
				memset(lo + 16 * j, 0, 16);
				memset(hi + 16 * j, 0, 16);
			}
		}
		out[q].init = _mm512_loadu_si512(init);
	}
}

/* dwords of the two loads holding blocks 0..3 (second load: +16) */
static const int32_t q4g_widx[16] = { 1, 2, 3, 4, 19, 20, 21, 22, 10, 11, 12, 13, 28, 29, 30, 31 };
/* [z0 lane j | z1 lane j] for blocks 0, 1 (add 4 for blocks 2, 3) */
static const int64_t q4g_zidx[8] = { 0, 1, 8, 9, 2, 3, 10, 11 };

/*
 * A zeroed register for a dot product's accumulator. EVEX zero idioms are
 * cheaper than the copies of one shared zero register that the compiler
 * otherwise makes (measured); the asm keeps it from sharing.
 */
static inline __m512i q4g_zero(void)
{
	__m512i z;

	__asm__ volatile("vpxord %0, %0, %0" : "=v"(z));
	return z;
}

/* 32 lanes of 8 products each: 4 lo-nibble and 4 hi-nibble products */
ALWAYS_INLINE __m512i q4g_dot(__m512i lo, __m512i hi, const struct q4g_col *xp)
{
#if HYB_VNNI
	return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(q4g_zero(), lo, xp->lo), hi, xp->hi);
#else
	/* pair sums of vpmaddubsw stay below 2 * 15 * 127: no saturation */
	return _mm512_madd_epi16(_mm512_add_epi16(_mm512_maddubs_epi16(lo, xp->lo),
						  _mm512_maddubs_epi16(hi, xp->hi)),
				 _mm512_set1_epi16(1));
#endif
}

/* state of one 16-row tile between quads */
struct q4g_state {
	__m512 acc;
	const uint8_t *pf, *pf_end; /* the next tile, prefetched 18 lines per quad */
};

/* the line of a row's quad two quads ahead that the row has not touched yet */
#define Q4G_L1_AHEAD (2 * 72 + 71)

/*
 * One quad of blocks of 16 rows. The loads read 64 bytes at p - 2 and
 * p + 8; masked: only the words ml and ml2 of them, for the first quad
 * (whose load at -2 starts before the row) and a short last quad of n
 * blocks (the row ends inside the loads).
 */
ALWAYS_INLINE void q4g_quad(const int nl, const int masked, const uint8_t *w, size_t ws, size_t off,
			    const struct q4g_col *xp, const float *dq, __mmask32 ml,
			    __mmask32 ml2, int n, struct q4g_state *st)
{
	const __m512i widx = _mm512_loadu_si512(q4g_widx);
	const __m512i zidx = _mm512_loadu_si512(q4g_zidx);
	const __m512i m4 = _mm512_set1_epi8(0x0F);
	const __m512i ones = _mm512_set1_epi16(1);
	/* lane j: the bytes of block j's scale in the first load (2 + 2j, 3 + 2j), every word */
	const __m512i sctl = _mm512_set_epi64(0x0908090809080908ll, 0x0908090809080908ll,
					      0x0706070607060706ll, 0x0706070607060706ll,
					      0x0504050405040504ll, 0x0504050405040504ll,
					      0x0302030203020302ll, 0x0302030203020302ll);
	const ptrdiff_t left = st->pf_end - st->pf;
	__m512i s[16], z[2] = { _mm512_setzero_si512(), _mm512_setzero_si512() }, v[4], u[4];
	__m512 d[4];

	/*
	 * Prefetch, measured on the 2-thread decode GEMV (from 70% of the
	 * DRAM read rate to 95%): the next tile into L2 in address order, 18
	 * lines per quad (its share), where the L2 streamer runs on ahead of
	 * it; spread over the rows, so that one is at hand whenever a fill
	 * buffer frees up (18 in a burst at the top: 80%). And this tile into
	 * L1 two quads ahead.
	 */
#pragma GCC unroll 16
	for (int r = 0; r < 16; r++) {
		const uint8_t *p = w + (size_t)r * ws + off;
		const __m512i l = masked ? _mm512_maskz_loadu_epi16(ml, p - 2)
					 : _mm512_loadu_si512(p - 2);
		const __m512i l2 = masked ? _mm512_maskz_loadu_epi16(ml2, p + 8)
					  : _mm512_loadu_si512(p + 8);
		const __m512i q = _mm512_permutex2var_epi32(l, widx, l2);
		__m512i lo = _mm512_and_si512(q, m4);
		__m512i hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);

		if (nl) {
			lo = _mm512_shuffle_epi8(nl_lut(), lo);
			hi = _mm512_shuffle_epi8(nl_lut(), hi);
		}
		if (64 * r < left)
			_mm_prefetch((const char *)st->pf + 64 * r, PF_HINT);
		if (r < 2 && 64 * (16 + r) < left)
			_mm_prefetch((const char *)st->pf + 64 * (16 + r), PF_HINT);
		_mm_prefetch((const char *)p + Q4G_L1_AHEAD, _MM_HINT_T0);

		s[r] = q4g_dot(lo, hi, xp);
		/* word r % 8 of each lane of z[r / 8]; the first row writes all */
		if (r % 8 == 0)
			z[r / 8] = _mm512_shuffle_epi8(l, sctl);
		else
			z[r / 8] = _mm512_mask_shuffle_epi8(z[r / 8], 0x0003000300030003ull << (2 * (r % 8)),
							    l, sctl);
	}
	st->pf += left < 18 * 64 ? left : 18 * 64;
	/* block sums, exact in int16 until the last step: v[g] lane 4j + i = block j, row 4g + i */
#pragma GCC unroll 4
	for (int g = 0; g < 4 && nl; g++) {
		const __m512i *sg = &s[4 * g];
		const __m512i ab = _mm512_add_epi32(_mm512_unpacklo_epi32(sg[0], sg[1]),
						    _mm512_unpackhi_epi32(sg[0], sg[1]));
		const __m512i cd = _mm512_add_epi32(_mm512_unpacklo_epi32(sg[2], sg[3]),
						    _mm512_unpackhi_epi32(sg[2], sg[3]));

		v[g] = _mm512_add_epi32(_mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd),
							 _mm512_unpackhi_epi64(ab, cd)),
					xp->init);
	}
#pragma GCC unroll 4
	for (int g = 0; g < 4 && !nl; g++) {
		const __m512i ab = _mm512_madd_epi16(_mm512_packs_epi32(s[4 * g], s[4 * g + 1]), ones);
		const __m512i cd = _mm512_madd_epi16(_mm512_packs_epi32(s[4 * g + 2], s[4 * g + 3]),
						      ones);

		v[g] = dot_ww(xp->init, _mm512_packs_epi32(ab, cd), ones);
	}
	/* u[j] lane r = block j of row r */
	{
		const __m512i a = _mm512_shuffle_i32x4(v[0], v[1], 0x44);
		const __m512i b = _mm512_shuffle_i32x4(v[0], v[1], 0xEE);
		const __m512i c = _mm512_shuffle_i32x4(v[2], v[3], 0x44);
		const __m512i e = _mm512_shuffle_i32x4(v[2], v[3], 0xEE);

		u[0] = _mm512_shuffle_i32x4(a, c, 0x88);
		u[1] = _mm512_shuffle_i32x4(a, c, 0xDD);
		u[2] = _mm512_shuffle_i32x4(b, e, 0x88);
		u[3] = _mm512_shuffle_i32x4(b, e, 0xDD);
	}
	{
		const __m512i f01 = _mm512_permutex2var_epi64(z[0], zidx, z[1]);
		const __m512i f23 = _mm512_permutex2var_epi64(
			z[0], _mm512_add_epi64(zidx, _mm512_set1_epi64(4)), z[1]);

		d[0] = _mm512_cvtph_ps(_mm512_castsi512_si256(f01));
		d[1] = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(f01, 1));
		d[2] = _mm512_cvtph_ps(_mm512_castsi512_si256(f23));
		d[3] = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(f23, 1));
	}
#pragma GCC unroll 4
	for (int j = 0; j < 4; j++)
		if (!masked || j < n)
			st->acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(u[j]),
						  _mm512_mul_ps(d[j], _mm512_set1_ps(dq[j])), st->acc);
}

/* rows [0, 16) of w: y[r] = row r . x; nx..nx_end is prefetched meanwhile */
ALWAYS_INLINE void q4g_tile(const int nl, int64_t nb, const uint8_t *w, size_t ws, const uint8_t *nx,
		     const uint8_t *nx_end, const struct q4g_col *xc, const float *dx, float *y)
{
	const int64_t nq = nb / 4, tail = nb % 4;
	struct q4g_state st = { _mm512_setzero_ps(), nx, nx_end };

	/* the first load of quad 0 starts 2 bytes before the row: word 0 masked off */
	if (nq)
		q4g_quad(nl, 1, w, ws, 0, &xc[0], &dx[0], 0xFFFFFFFE, 0xFFFFFFFF, 4, &st);
	for (int64_t q = 1; q < nq; q++)
		q4g_quad(nl, 0, w, ws, (size_t)q * 72, &xc[q], &dx[4 * q], 0, 0, 4, &st);
	if (tail) {
		/* the row's words left from -2 (9 per block, + 1) and from +8 (9 per block, - 4) */
		const __mmask32 ml = (__mmask32)(((1u << (9 * tail + 1)) - 1) & ~1u);
		const __mmask32 ml2 = (__mmask32)((1u << (9 * tail - 4)) - 1);

		q4g_quad(nl, 1, w, ws, (size_t)nq * 72, &xc[nq], &dx[4 * nq], ml, ml2, (int)tail, &st);
	}
	_mm512_storeu_ps(y, st.acc);
}

/*
 * y[r] for nrows >= 16 rows, one column. The last tile overlaps the one
 * before when nrows is not a multiple of 16 (its rows come out the same).
 * Returns -1 (nothing written) with fewer rows or no scratch memory.
 */
static int q4g_gemv(int nl, int64_t k, const uint8_t *w, size_t ws, int64_t nrows, const void *x,
		    float *y)
{
	const int64_t nb = k / 32, nq = (nb + 3) / 4;
	struct q4g_col *xc;
	float *dx;

	if (nrows < 16 || (nl && !HYB_VNNI))
		return -1;
	xc = hyb_cpu_scratch(HYB_SCRATCH_X, q4g_bytes(nb));
	if (!xc)
		return -1;
	dx = (float *)(xc + nq);
	q4g_prepack(nl, x, nb, xc, dx);
	for (int64_t r0 = 0;; r0 += 16) {
		const int64_t t = min64(r0, nrows - 16), n0 = min64(t + 16, nrows - 16);
		const uint8_t *nx = w + (size_t)n0 * ws;

		if (nl)
			q4g_tile(1, nb, w + (size_t)t * ws, ws, nx, n0 > t ? nx + 16 * ws : nx, xc,
				 dx, y + t);
		else
			q4g_tile(0, nb, w + (size_t)t * ws, ws, nx, n0 > t ? nx + 16 * ws : nx, xc,
				 dx, y + t);
		if (t + 16 >= nrows)
			break;
	}
	return 0;
}
