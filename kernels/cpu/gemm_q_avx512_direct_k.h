/* SPDX-License-Identifier: MIT */
/*
 * AVX-512 direct kernels for Q4_K and Q6_K (decode GEMV and small batches,
 * and the few unrepacked Q4_K prefills), straight from the GGUF blocks.
 * Part of gemm_q_avx512_body.h, after gemm_q_avx512_direct_q0.h.
 */
/* ------------------------------------------------------------------------ */
/* K-quants: the exact integer part                                        */

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

/* shift counts per 16-bit word: low half of the zmm as is, high half >> 4 */
static const uint16_t shift_0_4[32] = {
	0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4,
};

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

/*
 * Sixteen int32 lanes per (row, column, super-block) whose lanes l and
 * l + 8 add up to lane l of llama.cpp's AVX2 vec_dot sumi (scales applied,
 * for Q6_K with its -32 offset through the bsums), and for Q4_K the four
 * lanes of its mins product m[2l] S[2l] + m[2l+1] S[2l+1].
 */
struct kq_row {
	__m512i q[4];      /* the block's quants, unsigned, as the maddubs operand */
	__m512i s[4];      /* int16 scales per word */
	__m256i scn;       /* Q6_K: -32 * scale per 16, for the bsums */
	__m128i mins;      /* Q4_K: the 8 mins as int16 */
};

ALWAYS_INLINE void kq_row_q4k(const struct hyb_block_q4_k *b, struct kq_row *o)
{
	const __m512i sh = _mm512_loadu_si512(shift_0_4);
	const __m512i m4 = _mm512_set1_epi8(0x0F);
	uint64_t sc8, mn8;

	q4k_unpack(b->scales, &sc8, &mn8);
	const __m512i sc = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc8)));

	o->mins = _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)mn8));
	for (int j = 0; j < 4; j++) {
		o->q[j] = _mm512_and_si512(_mm512_srlv_epi16(_mm512_broadcast_i64x4(
			_mm256_loadu_si256((const __m256i *)(b->qs + 32 * j))), sh), m4);
		o->s[j] = _mm512_shuffle_epi8(sc, pick_pair_ctrl(2 * j));
	}
}

ALWAYS_INLINE void kq_row_q6k(const struct hyb_block_q6_k *b, struct kq_row *o)
{
	const __m512i sa = _mm512_loadu_si512(shift_4_2), sb = _mm512_loadu_si512(shift_0_2);
	const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->scales));
	const __m512i sc = _mm512_castsi256_si512(sc16);

	o->scn = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(sc16, 5));
	for (int g = 0; g < 4; g++)
		o->s[g] = _mm512_permutexvar_epi16(q6_scale_idx(g), sc);
	q6k_codes(b, 0, sa, sb, &o->q[0], &o->q[1]);
	q6k_codes(b, 1, sa, sb, &o->q[2], &o->q[3]);
}

ALWAYS_INLINE __m512i kq_dot(const int q6, const struct kq_row *w,
			     const struct hyb_block_q8_k *xb)
{
	const __m512i *xq = (const __m512i *)xb->qs;
	__m512i ia = q6 ? _mm512_zextsi256_si512(_mm256_madd_epi16(
				  _mm256_loadu_si256((const __m256i *)xb->bsums), w->scn))
			: _mm512_setzero_si512();

	for (int j = 0; j < 4; j++)
		ia = dot_ww(ia, _mm512_maddubs_epi16(w->q[j], _mm512_loadu_si512(xq + j)), w->s[j]);
	return ia;
}

/* Q4_K: [m0 S0 + m1 S1, m2 S2 + m3 S3, ...] with S the sums of 32 quants */
ALWAYS_INLINE __m128i kq_mins(const struct kq_row *w, const struct hyb_block_q8_k *xb)
{
	const __m256i bs = _mm256_loadu_si256((const __m256i *)xb->bsums);
	const __m128i s = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));

	return _mm_madd_epi16(w->mins, s);
}

static inline __m256i fold8(__m512i v)
{
	return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

/* ------------------------------------------------------------------------ */
/* K-quants: the float parts                                                */

/*
 * KV_DOT: ggml_vec_dot_q{4,6}_K_q8_K (x86 AVX2 code, fewer than 8
 * columns): acc (8 lanes) = fma(yd*dw, float(sumi), acc) per super-block,
 * Q4_K mins in 4 lanes fma(-yd*dmin, float(prod), accm); hsum_float_8(acc)
 * + ((m0 + m2) + (m1 + m3)).
 * KV_GEMV: ggml_gemv_q4_K_8x8_q8_K (repacked): acc = fma(float(isum),
 * dw*yd, acc), accm = fma(float(imin), dmin*yd, accm), acc - accm.
 * KV_TILED: the tiled K-quant matmul (8+ columns, not repacked): per
 * super-block r = float(s1)*dw (Q4_K: - dmin*float(s2), fused), acc =
 * fma(r, yd, acc).
 */
enum kv_mode { KV_DOT, KV_GEMV, KV_TILED };

ALWAYS_INLINE void kq_tile(const int q6, const enum kv_mode mode, const int NC, int64_t nsb,
			   const uint8_t *const *wr, const uint8_t *const *nx,
			   const uint8_t *const *xc, float *y, size_t ys, int nr)
{
	const size_t bsz = q6 ? 210 : 144;
	__m512 acc[DR / 2][DC];  /* KV_DOT: two rows' 8 lanes */
	__m512 accm[DC];         /* KV_DOT Q4_K: four rows' 4 lanes */
	__m128 acc4[DC], accm4[DC]; /* KV_GEMV, KV_TILED: four rows */
	float out[16];

	for (int c = 0; c < NC; c++) {
		for (int p = 0; p < DR / 2; p++)
			acc[p][c] = _mm512_setzero_ps();
		accm[c] = _mm512_setzero_ps();
		acc4[c] = accm4[c] = _mm_setzero_ps();
	}
	for (int64_t s = 0; s < nsb; s++) {
		__m512i ia[DR][DC];
		__m128i mi[DR][DC];
		float dw[DR], dm[DR];

		prefetch_rows(nx, s * (int64_t)bsz, q6 ? 4 : 3);
		/* one row at a time: its unpacked quants are used by every column, then dropped */
#pragma GCC unroll 4
		for (int r = 0; r < DR; r++) {
			const uint8_t *blk = wr[r] + s * (int64_t)bsz;
			struct kq_row w;

			if (q6) {
				kq_row_q6k((const struct hyb_block_q6_k *)blk, &w);
				dw[r] = f16_scalar(ld16(blk + 208));
				dm[r] = 0.0f;
			} else {
				kq_row_q4k((const struct hyb_block_q4_k *)blk, &w);
				dw[r] = f16_scalar(ld16(blk));
				dm[r] = f16_scalar(ld16(blk + 2));
			}
#pragma GCC unroll 4
			for (int c = 0; c < NC; c++) {
				const struct hyb_block_q8_k *xb = (const struct hyb_block_q8_k *)xc[c] + s;

				ia[r][c] = kq_dot(q6, &w, xb);
				if (!q6)
					mi[r][c] = kq_mins(&w, xb);
			}
		}
#pragma GCC unroll 4
		for (int c = 0; c < NC; c++) {
			const float yd = ((const struct hyb_block_q8_k *)xc[c] + s)->d;

			if (mode == KV_DOT) {
#pragma GCC unroll 2
				for (int p = 0; p < DR / 2; p++) {
					const __m512i f = _mm512_inserti64x4(_mm512_castsi256_si512(
						fold8(ia[2 * p][c])), fold8(ia[2 * p + 1][c]), 1);
					/* d = y.d * x.d per row */
					const __m512 d = _mm512_insertf32x8(_mm512_castps256_ps512(
						_mm256_set1_ps(yd * dw[2 * p])),
						_mm256_set1_ps(yd * dw[2 * p + 1]), 1);

					acc[p][c] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(f), acc[p][c]);
				}
				if (!q6) {
					const __m512i m = _mm512_inserti64x4(_mm512_castsi256_si512(
						_mm256_set_m128i(mi[1][c], mi[0][c])),
						_mm256_set_m128i(mi[3][c], mi[2][c]), 1);
					const __m512 dmin = _mm512_setr4_ps(-yd * dm[0], -yd * dm[1],
									    -yd * dm[2], -yd * dm[3]);

					/* lanes 4r..4r+3 belong to row r: spread each row's factor */
					accm[c] = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_setr_epi32(
						0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3), dmin),
						_mm512_cvtepi32_ps(m), accm[c]);
				}
				continue;
			}
			const __m128 s1 = _mm_cvtepi32_ps(hsum4_epi32(ia[0][c], ia[1][c], ia[2][c],
								      ia[3][c]));
			const __m128 dw4 = _mm_setr_ps(dw[0], dw[1], dw[2], dw[3]);
			const __m128 dm4 = _mm_setr_ps(dm[0], dm[1], dm[2], dm[3]);
			__m128 s2 = _mm_setzero_ps();

			if (!q6)
				s2 = _mm_cvtepi32_ps(_mm_hadd_epi32(_mm_hadd_epi32(mi[0][c], mi[1][c]),
								    _mm_hadd_epi32(mi[2][c], mi[3][c])));
			if (mode == KV_GEMV) {
				const __m128 ydv = _mm_set1_ps(yd);

				acc4[c] = _mm_fmadd_ps(s1, _mm_mul_ps(dw4, ydv), acc4[c]);
				accm4[c] = _mm_fmadd_ps(s2, _mm_mul_ps(dm4, ydv), accm4[c]);
			} else {
				__m128 r = _mm_mul_ps(s1, dw4);

				if (!q6)
					r = _mm_fnmadd_ps(dm4, s2, r);
				acc4[c] = _mm_fmadd_ps(r, _mm_set1_ps(yd), acc4[c]);
			}
		}
	}
#pragma GCC unroll 4
	for (int c = 0; c < NC; c++) {
		float *yc = y + (size_t)c * ys;

		if (mode == KV_DOT) {
			float m[16];

			if (!q6) {
				/* (m0 + m2) + (m1 + m3) per row, as the tail of vec_dot_q4_K */
				__m512 t = accm[c];

				t = _mm512_add_ps(t, _mm512_permute_ps(t, _MM_SHUFFLE(1, 0, 3, 2)));
				t = _mm512_add_ps(t, _mm512_permute_ps(t, _MM_SHUFFLE(2, 3, 0, 1)));
				_mm512_storeu_ps(m, t);
			}
#pragma GCC unroll 2
			for (int p = 0; p < DR / 2; p++) {
				_mm512_storeu_ps(out, hsum8_pairs(acc[p][c]));
				for (int h = 0; h < 2 && 2 * p + h < nr; h++)
					yc[2 * p + h] = q6 ? out[8 * h] : out[8 * h] + m[4 * (2 * p + h)];
			}
		} else {
			_mm_storeu_ps(out, mode == KV_GEMV ? _mm_sub_ps(acc4[c], accm4[c]) : acc4[c]);
			for (int r = 0; r < nr; r++)
				yc[r] = out[r];
		}
	}
}

