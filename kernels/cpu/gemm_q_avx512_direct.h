/* SPDX-License-Identifier: MIT */
/*
 * AVX-512 direct quantized kernels: DR rows x up to DC columns straight
 * from the GGUF blocks (decode GEMV and small batches). Part of
 * gemm_q_avx512_body.h, which includes it once per ISA level.
 */
/* ------------------------------------------------------------------------ */
/* Q8_0 direct                                                              */

/*
 * Column data per pair of blocks: the 64 quants, the accumulator start
 * (lanes 0-7 block 0, 8-15 block 1; VNNI: -16*sum per lane, so the eight
 * lanes add up to -128*sum) and the scale per lane.
 */
struct q8d_col {
	__m512i q;
	__m512i init;
	__m512 d;
};

static void q8d_prepack(const void *x, int64_t nb, struct q8d_col *out)
{
	const struct hyb_block_q8_0 *b = x;

	for (int64_t p = 0; p < (nb + 1) / 2; p++) {
		const struct hyb_block_q8_0 *b0 = &b[2 * p];
		const int two = 2 * p + 1 < nb;
		__m256i q1 = two ? _mm256_loadu_si256((const __m256i *)b0[1].qs)
				 : _mm256_setzero_si256();
		int32_t s0 = 0, s1 = 0;
		float d1 = two ? f16_scalar(b0[1].d) : 0.0f;

#if HYB_VNNI
		s0 = -16 * q8_block_sum(b0);
		s1 = two ? -16 * q8_block_sum(b0 + 1) : 0;
#endif
		out[p].q = _mm512_inserti64x4(_mm512_castsi256_si512(
			_mm256_loadu_si256((const __m256i *)b0->qs)), q1, 1);
		out[p].init = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32(s0)),
						 _mm256_set1_epi32(s1), 1);
		out[p].d = _mm512_insertf32x8(_mm512_castps256_ps512(
			_mm256_set1_ps(f16_scalar(b0->d))), _mm256_set1_ps(d1), 1);
	}
}

/*
 * A row's block scales come from the same cache lines as its quants: one
 * 64-byte load at the step's start and vpermw spread them over their
 * blocks' lanes. (A gather of all the tile's scales costs fewer
 * instructions but stalls on this CPU: it is the first touch of new lines.)
 */
static const uint16_t q8d_didx[32] = {
	0, 0, 0, 0, 0, 0, 0, 0, 17, 17, 17, 17, 17, 17, 17, 17,
};

ALWAYS_INLINE void q8d_tile(const int NC, int64_t nb, const uint8_t *const *wr,
			    const uint8_t *const *nx,
			    const struct q8d_col *const *xc, __m512 acc[DR][DC])
{
	const __m512i didx = _mm512_loadu_si512(q8d_didx);
	const int64_t np = (nb + 1) / 2;

	for (int r = 0; r < DR; r++)
		for (int c = 0; c < NC; c++)
			acc[r][c] = _mm512_setzero_ps();
	for (int64_t p = 0; p < np; p++) {
		const int64_t off = p * 68;
		const int two = 2 * p + 1 < nb; /* an odd row ends with a single block */
		/* the scales' load must not pass the end of the row */
		const __mmask32 dm = two ? 0xFFFFFFFF : 0x1FFFF;

		prefetch_rows(nx, off, 2);
#pragma GCC unroll 4
		for (int r = 0; r < DR; r++) {
			const __m256i q0 = _mm256_loadu_si256((const __m256i *)(wr[r] + off + 2));
			const __m512i w = two ? _mm512_inserti64x4(_mm512_castsi256_si512(q0),
					_mm256_loadu_si256((const __m256i *)(wr[r] + off + 36)), 1)
					      : _mm512_zextsi256_si512(q0);
			const __m512 dw = _mm512_cvtph_ps(_mm512_castsi512_si256(
				_mm512_permutexvar_epi16(didx, _mm512_maskz_loadu_epi16(dm,
											wr[r] + off))));
#if HYB_VNNI
			const __m512i u = _mm512_xor_si512(w, _mm512_set1_epi8((char)0x80));
#else
			const __m512i u = _mm512_abs_epi8(w);
			const __mmask64 neg = _mm512_movepi8_mask(w);
#endif
#pragma GCC unroll 4
			for (int c = 0; c < NC; c++) {
				const struct q8d_col *xp = &xc[c][p];
#if HYB_VNNI
				const __m512i d = _mm512_dpbusd_epi32(xp->init, u, xp->q);
#else
				const __m512i s = _mm512_mask_sub_epi8(xp->q, neg,
								       _mm512_setzero_si512(), xp->q);
				const __m512i d = _mm512_madd_epi16(_mm512_maddubs_epi16(u, s),
								    _mm512_set1_epi16(1));
#endif
				acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d),
							    _mm512_mul_ps(dw, xp->d), acc[r][c]);
			}
		}
	}
}

/* ------------------------------------------------------------------------ */
/* Q4_0 direct                                                              */

/*
 * Column data per quad of blocks: elements 0-15 of each block (matching
 * the low nibbles), elements 16-31 (high nibbles), the accumulator start
 * (-8*sum spread as -2*sum over the block's 4 lanes) and the lane scales.
 */
struct q4d_col {
	__m512i lo, hi;
	__m512i init;
	__m512 d;
};

static void q4d_prepack(const void *x, int64_t nb, struct q4d_col *out)
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

ALWAYS_INLINE void q4d_tile(const int NC, int64_t nb, const uint8_t *const *wr,
			    const uint8_t *const *nx,
			    const struct q4d_col *const *xc, __m512 acc[DR][DC])
{
	const __m512i didx = _mm512_loadu_si512(q4d_didx);
	const __m512i m4 = _mm512_set1_epi8(0x0F);

	for (int r = 0; r < DR; r++)
		for (int c = 0; c < NC; c++)
			acc[r][c] = _mm512_setzero_ps();
	for (int64_t q = 0; q < (nb + 3) / 4; q++) {
		const int64_t off = q * 72;
		const int n = (int)min64(4, nb - 4 * q);
		/* words of the scales' load that exist: 9 per block */
		const __mmask32 dm = n == 4 ? 0xFFFFFFFF : (__mmask32)((1u << (9 * n)) - 1);

		prefetch_rows(nx, off, 2);
#pragma GCC unroll 4
		for (int r = 0; r < DR; r++) {
			const __m512i w = q4_quad(wr[r] + off, n);
			const __m512 dw = _mm512_cvtph_ps(_mm512_castsi512_si256(
				_mm512_permutexvar_epi16(didx, _mm512_maskz_loadu_epi16(dm,
											wr[r] + off))));
			const __m512i lo = _mm512_and_si512(w, m4);
			const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), m4);

#pragma GCC unroll 4
			for (int c = 0; c < NC; c++) {
				const struct q4d_col *xp = &xc[c][q];
#if HYB_VNNI
				__m512i d = _mm512_dpbusd_epi32(xp->init, lo, xp->lo);

				d = _mm512_dpbusd_epi32(d, hi, xp->hi);
#else
				/* nibble products: |pair sum| <= 2*15*128, two of them fit int16 */
				__m512i p = _mm512_add_epi16(_mm512_maddubs_epi16(lo, xp->lo),
							     _mm512_maddubs_epi16(hi, xp->hi));
				__m512i d = _mm512_add_epi32(
					_mm512_madd_epi16(p, _mm512_set1_epi16(1)), xp->init);
#endif
				acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d),
							    _mm512_mul_ps(dw, xp->d), acc[r][c]);
			}
		}
	}
}

/* ------------------------------------------------------------------------ */
/* Q4_K direct                                                              */

/* shift counts per 16-bit word: low half of the zmm as is, high half >> 4 */
static const uint16_t shift_0_4[32] = {
	0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4,
};

/* unpack the 8 scales and 8 mins of a Q4_K block into two 64-bit byte vectors */
static inline void q4k_unpack(const uint8_t *s, uint64_t *sc, uint64_t *mn)
{
	uint32_t u0, u1, u2;

	memcpy(&u0, s, 4);
	memcpy(&u1, s + 4, 4);
	memcpy(&u2, s + 8, 4);
	*sc = (uint64_t)(u0 & 0x3f3f3f3f) |
	      (uint64_t)((u2 & 0x0f0f0f0f) | (((u0 >> 6) & 0x03030303) << 4)) << 32;
	*mn = (uint64_t)(u1 & 0x3f3f3f3f) |
	      (uint64_t)(((u2 >> 4) & 0x0f0f0f0f) | (((u1 >> 6) & 0x03030303) << 4)) << 32;
}

/*
 * pshufb controls picking int16 scale j (of 8 in a 128-bit lane) for the low
 * 256 bits and j+1 for the high 256 bits, for j = 0, 2, 4, 6.
 */
static inline __m512i pick_pair_ctrl(int j)
{
	const __m256i a = _mm256_set1_epi16((short)(2 * j | (2 * j + 1) << 8));
	const __m256i b = _mm256_set1_epi16((short)((2 * j + 2) | (2 * j + 3) << 8));

	return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
}

ALWAYS_INLINE void q4kd_tile(const int NC, int64_t nsb, const uint8_t *const *wr,
			    const uint8_t *const *nx,
			     const uint8_t *const *xc, __m512 acc[DR][DC])
{
	const __m512i sh = _mm512_loadu_si512(shift_0_4);
	const __m512i m4 = _mm512_set1_epi8(0x0F);
	const __m512i pc0 = pick_pair_ctrl(0), pc1 = pick_pair_ctrl(2);
	const __m512i pc2 = pick_pair_ctrl(4), pc3 = pick_pair_ctrl(6);
	/* bsums (16 x int16) times mins (8 x int16, each used twice) */
	const __m128i dup = _mm_setr_epi8(0, 1, 0, 1, 2, 3, 2, 3, 4, 5, 4, 5, 6, 7, 6, 7);
	__m256 macc[DR][DC];

	for (int r = 0; r < DR; r++)
		for (int c = 0; c < NC; c++) {
			acc[r][c] = _mm512_setzero_ps();
			macc[r][c] = _mm256_setzero_ps();
		}
	for (int64_t s = 0; s < nsb; s++) {
		prefetch_rows(nx, s * 144, 3);
#pragma GCC unroll 4
		for (int r = 0; r < DR; r++) {
			const struct hyb_block_q4_k *b = (const struct hyb_block_q4_k *)wr[r] + s;
			uint64_t sc8, mn8;

			q4k_unpack(b->scales, &sc8, &mn8);
			const __m512i sc = _mm512_broadcast_i32x4(
				_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc8)));
			const __m128i mn = _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)mn8));
			const __m256i mn2 = _mm256_inserti128_si256(
				_mm256_castsi128_si256(_mm_shuffle_epi8(mn, dup)),
				_mm_shuffle_epi8(mn, _mm_add_epi8(dup, _mm_set1_epi8(8))), 1);
			const __m512i s0 = _mm512_shuffle_epi8(sc, pc0);
			const __m512i s1 = _mm512_shuffle_epi8(sc, pc1);
			const __m512i s2 = _mm512_shuffle_epi8(sc, pc2);
			const __m512i s3 = _mm512_shuffle_epi8(sc, pc3);
			const __m512 d = _mm512_set1_ps(f16_scalar(b->d));
			const __m256 dmin = _mm256_set1_ps(-f16_scalar(b->dmin));
			__m512i q[4];

			for (int j = 0; j < 4; j++)
				q[j] = _mm512_and_si512(_mm512_srlv_epi16(
					_mm512_broadcast_i64x4(_mm256_loadu_si256(
						(const __m256i *)(b->qs + 32 * j))), sh), m4);
#pragma GCC unroll 4
			for (int c = 0; c < NC; c++) {
				const struct hyb_block_q8_k *xb =
					(const struct hyb_block_q8_k *)xc[c] + s;
				const __m512i *xq = (const __m512i *)xb->qs;
				__m512i ia = _mm512_setzero_si512();

				ia = dot_ww(ia, _mm512_maddubs_epi16(q[0], _mm512_loadu_si512(xq)), s0);
				ia = dot_ww(ia, _mm512_maddubs_epi16(q[1],
								     _mm512_loadu_si512(xq + 1)), s1);
				ia = dot_ww(ia, _mm512_maddubs_epi16(q[2],
								     _mm512_loadu_si512(xq + 2)), s2);
				ia = dot_ww(ia, _mm512_maddubs_epi16(q[3],
								     _mm512_loadu_si512(xq + 3)), s3);
				const __m512 dx = _mm512_set1_ps(xb->d);

				acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia),
							    _mm512_mul_ps(d, dx), acc[r][c]);
				__m256i im = _mm256_madd_epi16(
					_mm256_loadu_si256((const __m256i *)xb->bsums), mn2);

				macc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(im),
							     _mm256_mul_ps(dmin,
									   _mm512_castps512_ps256(dx)),
							     macc[r][c]);
			}
		}
	}
	for (int r = 0; r < DR; r++)
		for (int c = 0; c < NC; c++)
			acc[r][c] = _mm512_add_ps(acc[r][c], _mm512_zextps256_ps512(macc[r][c]));
}

/* ------------------------------------------------------------------------ */
/* Q6_K direct                                                              */

/* per-word shifts: elements 0-31 from qh bits 0-1 (<<4), 32-63 from bits 2-3 (<<2) */
static const uint16_t shift_4_2[32] = {
	4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4,
	2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
};
/* elements 64-95 from qh bits 4-5 (as is), 96-127 from bits 6-7 (>>2) */
static const uint16_t shift_0_2[32] = {
	0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
};
/* vpermw indices: word i of 64 elements uses sub-block scale 4g + i/8 */
static inline __m512i q6_scale_idx(int g)
{
	uint16_t idx[32];

	for (int i = 0; i < 32; i++)
		idx[i] = (uint16_t)(4 * g + i / 8);
	return _mm512_loadu_si512(idx);
}

/*
 * The 6-bit codes of half h (elements 128h..128h+127) of a Q6_K block:
 * a = elements 0-63, b = 64-127 of the half, values 0..63.
 */
ALWAYS_INLINE void q6k_codes(const struct hyb_block_q6_k *b, int h, __m512i sa, __m512i sb,
			     __m512i *a, __m512i *c)
{
	const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
	const __m512i ql = _mm512_loadu_si512(b->ql + 64 * h);
	const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(
		(const __m256i *)(b->qh + 32 * h)));
	const __m512i ha = _mm512_and_si512(_mm512_sllv_epi16(qh, sa), m30);
	const __m512i hb = _mm512_and_si512(_mm512_srlv_epi16(qh, sb), m30);

	/* 0xEA: (A & B) | C with A = ql, B = 0x0F, C = high bits */
	*a = _mm512_ternarylogic_epi32(ql, m4, ha, 0xEA);
	*c = _mm512_ternarylogic_epi32(_mm512_srli_epi16(ql, 4), m4, hb, 0xEA);
}

ALWAYS_INLINE void q6kd_tile(const int NC, int64_t nsb, const uint8_t *const *wr,
			    const uint8_t *const *nx,
			     const uint8_t *const *xc, __m512 acc[DR][DC])
{
	const __m512i sa = _mm512_loadu_si512(shift_4_2), sb = _mm512_loadu_si512(shift_0_2);
	const __m512i i0 = q6_scale_idx(0), i1 = q6_scale_idx(1);
	const __m512i i2 = q6_scale_idx(2), i3 = q6_scale_idx(3);

	for (int r = 0; r < DR; r++)
		for (int c = 0; c < NC; c++)
			acc[r][c] = _mm512_setzero_ps();
	for (int64_t s = 0; s < nsb; s++) {
		prefetch_rows(nx, s * 210, 4);
#pragma GCC unroll 4
		for (int r = 0; r < DR; r++) {
			const struct hyb_block_q6_k *b = (const struct hyb_block_q6_k *)wr[r] + s;
			/* scales as int16: words 0-15 used by vpermw, zmm upper half unused */
			const __m256i sc16 = _mm256_cvtepi8_epi16(
				_mm_loadu_si128((const __m128i *)b->scales));
			const __m512i sc = _mm512_castsi256_si512(sc16);
			/* -32 * scale: the codes' offset, paid back through the bsums */
			const __m256i scn = _mm256_sub_epi16(_mm256_setzero_si256(),
							     _mm256_slli_epi16(sc16, 5));
			const __m512i s0 = _mm512_permutexvar_epi16(i0, sc);
			const __m512i s1 = _mm512_permutexvar_epi16(i1, sc);
			const __m512i s2 = _mm512_permutexvar_epi16(i2, sc);
			const __m512i s3 = _mm512_permutexvar_epi16(i3, sc);
			const __m512 d = _mm512_set1_ps(f16_scalar(b->d));
			__m512i qa0, qb0, qa1, qb1;

			q6k_codes(b, 0, sa, sb, &qa0, &qb0);
			q6k_codes(b, 1, sa, sb, &qa1, &qb1);
#pragma GCC unroll 4
			for (int c = 0; c < NC; c++) {
				const struct hyb_block_q8_k *xb =
					(const struct hyb_block_q8_k *)xc[c] + s;
				const __m512i *xq = (const __m512i *)xb->qs;
				__m512i ia = _mm512_zextsi256_si512(_mm256_madd_epi16(
					_mm256_loadu_si256((const __m256i *)xb->bsums), scn));

				ia = dot_ww(ia, _mm512_maddubs_epi16(qa0, _mm512_loadu_si512(xq)), s0);
				ia = dot_ww(ia, _mm512_maddubs_epi16(qb0,
								     _mm512_loadu_si512(xq + 1)), s1);
				ia = dot_ww(ia, _mm512_maddubs_epi16(qa1,
								     _mm512_loadu_si512(xq + 2)), s2);
				ia = dot_ww(ia, _mm512_maddubs_epi16(qb1,
								     _mm512_loadu_si512(xq + 3)), s3);
				acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia),
							    _mm512_mul_ps(d, _mm512_set1_ps(xb->d)),
							    acc[r][c]);
			}
		}
	}
}

/* ------------------------------------------------------------------------ */
/* direct driver                                                            */

enum dtype { D_Q8_0, D_Q4_0, D_Q4_K, D_Q6_K };

ALWAYS_INLINE void direct_tile(const enum dtype t, const int NC, int64_t k,
			       const uint8_t *const *wr, const uint8_t *const *nx,
			       const void *const *xc,
			       __m512 acc[DR][DC])
{
	switch (t) {
	case D_Q8_0:
		q8d_tile(NC, k / 32, wr, nx, (const struct q8d_col *const *)xc, acc);
		break;
	case D_Q4_0:
		q4d_tile(NC, k / 32, wr, nx, (const struct q4d_col *const *)xc, acc);
		break;
	case D_Q4_K:
		q4kd_tile(NC, k / 256, wr, nx, (const uint8_t *const *)xc, acc);
		break;
	case D_Q6_K:
		q6kd_tile(NC, k / 256, wr, nx, (const uint8_t *const *)xc, acc);
		break;
	}
}

/* sum the lanes of DR accumulators into 4 floats, one per row */
static inline __m128 hsum4(__m512 a0, __m512 a1, __m512 a2, __m512 a3)
{
	/* fold 512 -> 256 -> 128 for each, then transpose-add the four */
	__m256 b0 = _mm256_add_ps(_mm512_castps512_ps256(a0), _mm512_extractf32x8_ps(a0, 1));
	__m256 b1 = _mm256_add_ps(_mm512_castps512_ps256(a1), _mm512_extractf32x8_ps(a1, 1));
	__m256 b2 = _mm256_add_ps(_mm512_castps512_ps256(a2), _mm512_extractf32x8_ps(a2, 1));
	__m256 b3 = _mm256_add_ps(_mm512_castps512_ps256(a3), _mm512_extractf32x8_ps(a3, 1));
	__m256 c01 = _mm256_hadd_ps(b0, b1), c23 = _mm256_hadd_ps(b2, b3);
	__m256 e = _mm256_hadd_ps(c01, c23);

	return _mm_add_ps(_mm256_castps256_ps128(e), _mm256_extractf128_ps(e, 1));
}

ALWAYS_INLINE void direct_run(const enum dtype t, const int NC, int64_t k, const uint8_t *w,
			      size_t ws, int64_t nrows, const void *const *xc, float *y,
			      size_t ys)
{
	for (int64_t r0 = 0; r0 < nrows; r0 += DR) {
		const uint8_t *wr[DR], *nx[DR];
		__m512 acc[DR][DC];
		float out[DR];

		/* a short last tile repeats its last row rather than reading past it */
		for (int r = 0; r < DR; r++) {
			wr[r] = w + (size_t)min64(r0 + r, nrows - 1) * ws;
			nx[r] = w + (size_t)min64(r0 + PF_TILES * DR + r, nrows - 1) * ws;
		}
		direct_tile(t, NC, k, wr, nx, xc, acc);
		for (int c = 0; c < NC; c++) {
			_mm_storeu_ps(out, hsum4(acc[0][c], acc[1][c], acc[2][c], acc[3][c]));
			for (int r = 0; r < DR && r0 + r < nrows; r++)
				y[(size_t)c * ys + r0 + r] = out[r];
		}
	}
}

static void direct_any(const enum dtype t, int64_t k, const uint8_t *w, size_t ws,
		       int64_t nrows, const void *const *xc, int nc, float *y, size_t ys)
{
	switch (t * DC + nc - 1) {
#define CASE(T, N) case T * DC + N - 1: direct_run(T, N, k, w, ws, nrows, xc, y, ys); break;
	CASE(D_Q8_0, 1) CASE(D_Q8_0, 2) CASE(D_Q8_0, 3) CASE(D_Q8_0, 4)
	CASE(D_Q4_0, 1) CASE(D_Q4_0, 2) CASE(D_Q4_0, 3) CASE(D_Q4_0, 4)
	CASE(D_Q4_K, 1) CASE(D_Q4_K, 2) CASE(D_Q4_K, 3) CASE(D_Q4_K, 4)
	CASE(D_Q6_K, 1) CASE(D_Q6_K, 2) CASE(D_Q6_K, 3) CASE(D_Q6_K, 4)
#undef CASE
	}
}

/*
 * Direct path for any ncols, DC columns at a time. Q8_0/Q4_0 need per-column
 * repacked activations (in scratch); the K-quants read Q8_K in place.
 */
static void direct_gemm(const enum dtype t, HYB_GEMM_ARGS)
{
	const int64_t nb = k / 32;
	size_t per_col = 0;
	uint8_t *xs = NULL;


	if (t == D_Q8_0)
		per_col = (size_t)(nb + 1) / 2 * sizeof(struct q8d_col);
	else if (t == D_Q4_0)
		per_col = (size_t)(nb + 3) / 4 * sizeof(struct q4d_col);
	if (per_col) {
		xs = hyb_cpu_scratch(HYB_SCRATCH_X, per_col * DC);
		if (!xs) {
			(t == D_Q8_0 ? hyb_gemm_q8_0_scalar : hyb_gemm_q4_0_scalar)(
				k, w, w_stride, nrows, x, x_stride, ncols, y, y_stride);
			return;
		}
	}
	for (int64_t c0 = 0; c0 < ncols; c0 += DC) {
		const int nc = (int)min64(DC, ncols - c0);
		const void *xc[DC];

		for (int c = 0; c < nc; c++) {
			const uint8_t *xcol = (const uint8_t *)x + (size_t)(c0 + c) * x_stride;

			if (t == D_Q8_0) {
				q8d_prepack(xcol, nb, (struct q8d_col *)(xs + c * per_col));
				xc[c] = xs + c * per_col;
			} else if (t == D_Q4_0) {
				q4d_prepack(xcol, nb, (struct q4d_col *)(xs + c * per_col));
				xc[c] = xs + c * per_col;
			} else {
				xc[c] = xcol;
			}
		}
		direct_any(t, k, w, w_stride, nrows, xc, nc, y + (size_t)c0 * y_stride,
			   y_stride);
	}
}

