/* SPDX-License-Identifier: MIT */
/*
 * AVX-512 packed quantized GEMM (prefill): row-interleaved panels and the
 * vpdpbusd micro-kernels. Part of gemm_q_avx512_body.h, which includes it
 * once per ISA level.
 */
/* ------------------------------------------------------------------------ */
/* packed panel: repacking 16 rows into row-interleaved lanes               */

/*
 * Micro-tile shapes (measured on Cascade Lake): 48 rows x 4 columns for
 * Q4_0, i.e. 12 int32 + 12 float accumulators, 3 weight vectors and one
 * broadcast: 7 loads per 12 vpdpbusd keeps the two load ports below their
 * limit while the 3 float operations per 16 rows and block (convert, scale
 * product, FMA) take the rest of the two vector ports. The K-quants use 32
 * rows x 4 columns; Q8_0, with 8 float chains per output, 16 rows x 2.
 */
#define G8 3   /* row groups of 16, Q4_0 */
#define G0 1   /* row groups of 16, Q8_0 (8 accumulators per output) */
#define GK 2   /* row groups of 16, Q4_K / Q6_K */
#define GMAX 3
#define NCP 4  /* columns per micro-tile (xpack_q8 reduces exactly 4) */
#define PF_CHUNKS 1 /* packed chunks ahead that software prefetch reads */

/*
 * Per 16 rows of a packed super-block, scales as floats: Q4_K and Q5_K 8
 * scales, 4 min pairs (int16 x 2), d, dmin; Q6_K and Q3_K 16 scales, d;
 * IQ4_XS 8 scales, d; Q2_K 16 scales, 8 min pairs, d, dmin.
 */
#define Q4K_SCALE_BYTES ((8 + 4 + 2) * 64)
#define Q6K_SCALE_BYTES (17 * 64)
#define IQ4XS_SCALE_BYTES (9 * 64)
#define Q2K_SCALE_BYTES ((16 + 8 + 2) * 64)

/* bytes of one unit (Q8 family) or one super-block (K) in a packed chunk */
#define UW8(G) ((G) * 576)
#define SBW(G, SCB) (8 * (G) * 512 + (G) * (SCB))

/* bytes of one unit / super-block of a packed activation tile (K: quants, extra, scale) */
#define UX8 (NCP * 40)
#define UX0 (NCP * 68)
#define SXK(EXTRA) (NCP * (256 + (EXTRA) + 4))
#define SX4K SXK(16)

enum ptype { P_Q8_0, P_Q4_0, P_IQ4_NL, P_MXFP4, P_Q4_K, P_Q6_K, P_Q3_K, P_Q5_K, P_IQ4_XS, P_Q2_K };

/* K-quants: super-blocks of 256 elements, Q8_K activations */
static inline int ptype_k(const enum ptype t)
{
	return t >= P_Q4_K;
}

/* bytes of a raw GGUF block (32 elements, or 256 for the K-quants) */
static inline size_t raw_block(const enum ptype t)
{
	static const size_t b[] = { 34, 18, 18, 17, 144, 210, 110, 176, 136, 84 };

	return b[t];
}

/* scale bytes per 16 rows of a packed K super-block (see the top) */
static inline size_t scale_bytes(const enum ptype t)
{
	return t == P_Q6_K || t == P_Q3_K ? Q6K_SCALE_BYTES :
	       t == P_IQ4_XS ? IQ4XS_SCALE_BYTES : t == P_Q2_K ? Q2K_SCALE_BYTES : Q4K_SCALE_BYTES;
}

/* per-column extra of a packed activation super-block (xpack_k) */
static inline size_t x_extra(const enum ptype t)
{
	return t == P_Q6_K || t == P_Q3_K ? 64 : t == P_IQ4_XS || t == P_Q2_K ? 32 : 16;
}

/*
 * z[i] = [row i | row i+8], 32 bytes each (eight 4-byte groups). Returns
 * out[t] with lane r = group t of row r, rows in order 0..15.
 */
ALWAYS_INLINE void tr16x8(const __m512i z[8], __m512i out[8])
{
	const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
	const __m512i hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
	__m512i a[8], b[8];

	for (int i = 0; i < 4; i++) {
		a[2 * i] = _mm512_unpacklo_epi32(z[2 * i], z[2 * i + 1]);
		a[2 * i + 1] = _mm512_unpackhi_epi32(z[2 * i], z[2 * i + 1]);
	}
	for (int h = 0; h < 2; h++) {
		/* rows 4h..4h+3 (and 8+4h..): b[4h + j] holds groups j and j+4 */
		b[4 * h + 0] = _mm512_unpacklo_epi64(a[4 * h + 0], a[4 * h + 2]);
		b[4 * h + 1] = _mm512_unpackhi_epi64(a[4 * h + 0], a[4 * h + 2]);
		b[4 * h + 2] = _mm512_unpacklo_epi64(a[4 * h + 1], a[4 * h + 3]);
		b[4 * h + 3] = _mm512_unpackhi_epi64(a[4 * h + 1], a[4 * h + 3]);
	}
	for (int j = 0; j < 4; j++) {
		out[j] = _mm512_permutex2var_epi64(b[j], lo, b[4 + j]);
		out[j + 4] = _mm512_permutex2var_epi64(b[j], hi, b[4 + j]);
	}
}

ALWAYS_INLINE void store8(uint8_t *dst, const __m512i o[8])
{
	for (int t = 0; t < 8; t++)
		_mm512_store_si512(dst + 64 * t, o[t]);
}

/*
 * 16 bytes at `off` of 16 rows, transposed: out[j] lane r = dword j of row r.
 * The scales of a panel come this way, not by gathers (see the top).
 */
ALWAYS_INLINE void rows_tr16x4(const uint8_t *const *rp, int64_t off, __m512i out[4])
{
	__m512i z[4], a[4];

	/* z[q] = 128-bit lanes rows q, q+4, q+8, q+12 */
	for (int q = 0; q < 4; q++) {
		/* insert positions spelt out: they must be immediates at any -O */
		z[q] = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(rp[q] + off)));
		z[q] = _mm512_inserti32x4(z[q], _mm_loadu_si128((const __m128i *)(rp[q + 4] + off)), 1);
		z[q] = _mm512_inserti32x4(z[q], _mm_loadu_si128((const __m128i *)(rp[q + 8] + off)), 2);
		z[q] = _mm512_inserti32x4(z[q], _mm_loadu_si128((const __m128i *)(rp[q + 12] + off)),
					  3);
	}
	a[0] = _mm512_unpacklo_epi32(z[0], z[1]);
	a[1] = _mm512_unpackhi_epi32(z[0], z[1]);
	a[2] = _mm512_unpacklo_epi32(z[2], z[3]);
	a[3] = _mm512_unpackhi_epi32(z[2], z[3]);
	/* lane l now holds rows 4l..4l+3: in order */
	out[0] = _mm512_unpacklo_epi64(a[0], a[2]);
	out[1] = _mm512_unpackhi_epi64(a[0], a[2]);
	out[2] = _mm512_unpacklo_epi64(a[1], a[3]);
	out[3] = _mm512_unpackhi_epi64(a[1], a[3]);
}

/*
 * Half floats from 16 rows: `pick` selects the 16-bit word (0..7) of the 16
 * bytes at `off` in each row. Built as the first stages of rows_tr16x4:
 * cheaper than 16 scalar loads and a store-forwarding stall.
 */
ALWAYS_INLINE __m512 rows_f16(const uint8_t *const *rp, int64_t off, const int pick)
{
	__m512i t[4];

	rows_tr16x4(rp, off, t);
	__m512i v = t[pick / 2];

	if (pick & 1)
		v = _mm512_srli_epi32(v, 16);
	return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v));
}

struct panel {
	const uint8_t *rp[16 * GMAX]; /* the panel's rows */
};

/* rows past the end repeat the last row: read in bounds, results discarded */
static void panel_rows(struct panel *p, int G, const uint8_t *w, size_t ws, int64_t r0,
		       int64_t nrows)
{
	for (int r = 0; r < 16 * G; r++)
		p->rp[r] = w + (size_t)min64(r0 + r, nrows - 1) * ws;
}

/* Q8_0 codes xor 0x80: unsigned for vpdpbusd, the 128 paid back per lane (xpack_q0) */
ALWAYS_INLINE void pack_q8_0(const struct panel *p, const int G, int64_t u0, int nu,
			     uint8_t *dst)
{
	for (int u = 0; u < nu; u++) {
		const int64_t off = (u0 + u) * 34;
		uint8_t *du = dst + (size_t)u * UW8(G);

		for (int g = 0; g < G; g++) {
			const uint8_t *const *rp = p->rp + 16 * g;
			__m512i z[8], o[8];

			for (int i = 0; i < 8; i++)
				z[i] = _mm512_xor_si512(load_pair256(rp[i] + off + 2,
								     rp[i + 8] + off + 2),
							_mm512_set1_epi8((char)0x80));
			tr16x8(z, o);
			store8(du + 512 * g, o);
			_mm512_store_ps(du + 512 * G + 64 * g, rows_f16(rp, off, 0));
		}
	}
}

/* MXFP4's levels + 128 in every 128-bit lane (VNNI only: unsigned for vpdpbusd) */
static inline __m512i mx_lut(void)
{
	const __m128i v = _mm_loadu_si128((const __m128i *)hyb_kvalues_mxfp4);

	return _mm512_broadcast_i32x4(_mm_xor_si128(v, _mm_set1_epi8((char)0x80)));
}

/* 16 rows' MXFP4 block scales (byte 0 at off) as floats: hyb_e8m0_half */
ALWAYS_INLINE __m512 rows_e8m0(const uint8_t *const *rp, int64_t off)
{
	__m512i t[4];

	rows_tr16x4(rp, off, t);
	const __m512i e = _mm512_and_si512(t[0], _mm512_set1_epi32(0xFF));
	const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
	const __m512i denormal = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
	const __mmask16 is_normal = _mm512_cmpgt_epi32_mask(e, _mm512_set1_epi32(1));

	return _mm512_castsi512_ps(_mm512_mask_blend_epi32(is_normal, denormal, normal));
}

/*
 * nl 1: IQ4_NL, the nibbles through its levels + 128 (VNNI only: codes up
 * to 241); nl 2: MXFP4, through its levels + 128, its 17-byte blocks' byte
 * scales as floats
 */
ALWAYS_INLINE void pack_q4_0(const int nl, const struct panel *p, const int G, int64_t u0,
			     int nu, uint8_t *dst)
{
	const __m512i m4 = _mm512_set1_epi8(0x0F);
	const int bs = nl == 2 ? 17 : 18, qo = nl == 2 ? 1 : 2;

	for (int u = 0; u < nu; u++) {
		const int64_t off = (u0 + u) * bs;
		uint8_t *du = dst + (size_t)u * UW8(G);

		for (int g = 0; g < G; g++) {
			const uint8_t *const *rp = p->rp + 16 * g;
			__m512i t[4];

			/*
			 * Transpose the 16 packed bytes first (4 groups of 4 bytes),
			 * then split nibbles: group j's low nibbles are elements 4j..,
			 * its high nibbles elements 16 + 4j.., i.e. groups j and j + 4.
			 */
			rows_tr16x4(rp, off + qo, t);
			for (int j = 0; j < 4; j++) {
				__m512i lo = _mm512_and_si512(t[j], m4);
				__m512i hi = _mm512_and_si512(_mm512_srli_epi16(t[j], 4), m4);

				if (nl) {
					const __m512i lut = nl == 2 ? mx_lut() : nl_lut();

					lo = _mm512_shuffle_epi8(lut, lo);
					hi = _mm512_shuffle_epi8(lut, hi);
				}
				_mm512_store_si512(du + 512 * g + 64 * j, lo);
				_mm512_store_si512(du + 512 * g + 64 * (j + 4), hi);
			}
			_mm512_store_ps(du + 512 * G + 64 * g,
					nl == 2 ? rows_e8m0(rp, off) : rows_f16(rp, off, 0));
		}
	}
}

/*
 * Q4_K's and Q5_K's header (d, dmin, 12 bytes of 6-bit scales and mins) of
 * 16 rows at once, one 32-bit lane per row: scales as floats, min pairs
 * as int16 x 2 for vpdpwssd, d, dmin (Q4K_SCALE_BYTES).
 */
ALWAYS_INLINE void pack_k4_scales(const uint8_t *const *rp, int64_t off, uint8_t *sg)
{
	const __m512i m6 = _mm512_set1_epi32(63), m2 = _mm512_set1_epi32(3);
	const __m512i m4d = _mm512_set1_epi32(0xF);
	__m512i hdr[4], mn[8];

	rows_tr16x4(rp, off, hdr);
	const __m512i dd = hdr[0], u0v = hdr[1], u1v = hdr[2], u2v = hdr[3];

	for (int j = 0; j < 4; j++) {
		__m512i sc_lo = _mm512_and_si512(_mm512_srli_epi32(u0v, 8 * j), m6);
		__m512i m_lo = _mm512_and_si512(_mm512_srli_epi32(u1v, 8 * j), m6);
		__m512i sc_hi = _mm512_or_si512(
			_mm512_and_si512(_mm512_srli_epi32(u2v, 8 * j), m4d),
			_mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u0v, 8 * j + 6), m2), 4));
		__m512i m_hi = _mm512_or_si512(
			_mm512_and_si512(_mm512_srli_epi32(u2v, 8 * j + 4), m4d),
			_mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u1v, 8 * j + 6), m2), 4));

		_mm512_store_ps(sg + j * 64, _mm512_cvtepi32_ps(sc_lo));
		_mm512_store_ps(sg + (j + 4) * 64, _mm512_cvtepi32_ps(sc_hi));
		mn[j] = m_lo;
		mn[j + 4] = m_hi;
	}
	for (int i = 0; i < 4; i++)
		_mm512_store_si512(sg + (8 + i) * 64,
				   _mm512_or_si512(mn[2 * i], _mm512_slli_epi32(mn[2 * i + 1], 16)));
	_mm512_store_ps(sg + 12 * 64, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd)));
	_mm512_store_ps(sg + 13 * 64,
			_mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16))));
}

/* nu is a multiple of 8: whole super-blocks */
ALWAYS_INLINE void pack_q4_k(const struct panel *p, const int G, int64_t u0, int nu,
			     uint8_t *dst)
{
	const __m512i m4 = _mm512_set1_epi8(0x0F);

	for (int s = 0; s < nu / 8; s++) {
		const int64_t off = (u0 / 8 + s) * 144;
		uint8_t *ds = dst + (size_t)s * SBW(G, Q4K_SCALE_BYTES);

		for (int g = 0; g < G; g++) {
			const uint8_t *const *rp = p->rp + 16 * g;
			uint8_t *sg = ds + 8 * G * 512 + g * Q4K_SCALE_BYTES;

			for (int jj = 0; jj < 4; jj++) {
				__m512i zl[8], zh[8], o[8];

				for (int i = 0; i < 8; i++) {
					__m512i v = load_pair256(rp[i] + off + 16 + 32 * jj,
								 rp[i + 8] + off + 16 + 32 * jj);

					zl[i] = _mm512_and_si512(v, m4);
					zh[i] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
				}
				tr16x8(zl, o);
				store8(ds + (2 * jj) * G * 512 + 512 * g, o);
				tr16x8(zh, o);
				store8(ds + (2 * jj + 1) * G * 512 + 512 * g, o);
			}
			pack_k4_scales(rp, off, sg);
		}
	}
}

ALWAYS_INLINE void pack_q6_k(const struct panel *p, const int G, int64_t u0, int nu,
			     uint8_t *dst)
{
	const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);

	for (int s = 0; s < nu / 8; s++) {
		const int64_t off = (u0 / 8 + s) * 210;
		uint8_t *ds = dst + (size_t)s * SBW(G, Q6K_SCALE_BYTES);

		for (int g = 0; g < G; g++) {
			const uint8_t *const *rp = p->rp + 16 * g;
			float *sg = (float *)(ds + 8 * G * 512 + g * Q6K_SCALE_BYTES);

			for (int h = 0; h < 2; h++) {
				__m512i z[4][8], o[8];

				for (int i = 0; i < 8; i++) {
					const uint8_t *a = rp[i] + off, *b = rp[i + 8] + off;
					__m512i l0 = load_pair256(a + 64 * h, b + 64 * h);
					__m512i l1 = load_pair256(a + 64 * h + 32, b + 64 * h + 32);
					__m512i qh = load_pair256(a + 128 + 32 * h, b + 128 + 32 * h);

					/* 0xEA: (A & B) | C, low nibble | two high bits at 0x30 */
					z[0][i] = _mm512_ternarylogic_epi32(l0, m4, _mm512_and_si512(
						_mm512_slli_epi16(qh, 4), m30), 0xEA);
					z[1][i] = _mm512_ternarylogic_epi32(l1, m4, _mm512_and_si512(
						_mm512_slli_epi16(qh, 2), m30), 0xEA);
					z[2][i] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(l0, 4),
									    m4, _mm512_and_si512(qh, m30),
									    0xEA);
					z[3][i] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(l1, 4),
									    m4, _mm512_and_si512(
						_mm512_srli_epi16(qh, 2), m30), 0xEA);
				}
				for (int j = 0; j < 4; j++) {
					tr16x8(z[j], o);
					store8(ds + (4 * h + j) * G * 512 + 512 * g, o);
				}
			}
			const __m512 d = rows_f16(rp, off + 194, 7);
			__m512i scv[4];

			rows_tr16x4(rp, off + 192, scv);
			for (int q = 0; q < 4; q++) {
				const __m512i v = scv[q];

				for (int j = 0; j < 4; j++) {
					/* sign-extend byte j of each lane */
					__m512i sj = _mm512_srai_epi32(_mm512_slli_epi32(v, 24 - 8 * j),
								       24);

					_mm512_store_ps(sg + (4 * q + j) * 16, _mm512_cvtepi32_ps(sj));
				}
			}
			_mm512_store_ps(sg + 16 * 16, d);
		}
	}
}

/* codes 0..31: the low nibbles of qs (or high), bit 4 from qh (dequantize_row_q5_K) */
ALWAYS_INLINE void pack_q5_k(const struct panel *p, const int G, int64_t u0, int nu,
			     uint8_t *dst)
{
	const __m512i m4 = _mm512_set1_epi8(0x0F), one = _mm512_set1_epi8(1);

	for (int s = 0; s < nu / 8; s++) {
		const int64_t off = (u0 / 8 + s) * 176;
		uint8_t *ds = dst + (size_t)s * SBW(G, Q4K_SCALE_BYTES);

		for (int g = 0; g < G; g++) {
			const uint8_t *const *rp = p->rp + 16 * g;
			__m512i qh[8];

			for (int i = 0; i < 8; i++)
				qh[i] = load_pair256(rp[i] + off + 16, rp[i + 8] + off + 16);
			for (int jj = 0; jj < 4; jj++) {
				__m512i zl[8], zh[8], o[8];

				for (int i = 0; i < 8; i++) {
					const __m512i v = load_pair256(rp[i] + off + 48 + 32 * jj,
								       rp[i + 8] + off + 48 + 32 * jj);
					/* bits 2jj, 2jj + 1 of each qh byte (word shifts: the & keeps the byte's own) */
					const __m512i h0 = _mm512_and_si512(
						_mm512_srli_epi16(qh[i], 2 * jj), one);
					const __m512i h1 = _mm512_and_si512(
						_mm512_srli_epi16(qh[i], 2 * jj + 1), one);

					zl[i] = _mm512_or_si512(_mm512_and_si512(v, m4),
								_mm512_slli_epi16(h0, 4));
					zh[i] = _mm512_or_si512(
						_mm512_and_si512(_mm512_srli_epi16(v, 4), m4),
						_mm512_slli_epi16(h1, 4));
				}
				tr16x8(zl, o);
				store8(ds + (2 * jj) * G * 512 + 512 * g, o);
				tr16x8(zh, o);
				store8(ds + (2 * jj + 1) * G * 512 + 512 * g, o);
			}
			pack_k4_scales(rp, off, ds + 8 * G * 512 + g * Q4K_SCALE_BYTES);
		}
	}
}

/*
 * codes 0..7: two bits of qs and the hmask bit (dequantize_row_q3_K),
 * value = code - 4; the 16 signed 6-bit scales as Q6_K's floats
 */
ALWAYS_INLINE void pack_q3_k(const struct panel *p, const int G, int64_t u0, int nu,
			     uint8_t *dst)
{
	const __m512i m3 = _mm512_set1_epi8(3), one = _mm512_set1_epi8(1);
	const __m512i k1 = _mm512_set1_epi32(0x03030303), k2 = _mm512_set1_epi32(0x0f0f0f0f);

	for (int s = 0; s < nu / 8; s++) {
		const int64_t off = (u0 / 8 + s) * 110;
		uint8_t *ds = dst + (size_t)s * SBW(G, Q6K_SCALE_BYTES);

		for (int g = 0; g < G; g++) {
			const uint8_t *const *rp = p->rp + 16 * g;
			float *sg = (float *)(ds + 8 * G * 512 + g * Q6K_SCALE_BYTES);
			__m512i hm[8];

			for (int i = 0; i < 8; i++)
				hm[i] = load_pair256(rp[i] + off, rp[i + 8] + off);
			for (int h = 0; h < 2; h++) {
				__m512i q[8];

				for (int i = 0; i < 8; i++)
					q[i] = load_pair256(rp[i] + off + 32 + 32 * h,
							    rp[i + 8] + off + 32 + 32 * h);
				for (int j = 0; j < 4; j++) {
					__m512i z[8], o[8];

					for (int i = 0; i < 8; i++)
						z[i] = _mm512_or_si512(
							_mm512_and_si512(_mm512_srli_epi16(q[i], 2 * j), m3),
							_mm512_slli_epi16(_mm512_and_si512(
								_mm512_srli_epi16(hm[i], 4 * h + j), one), 2));
					tr16x8(z, o);
					store8(ds + (4 * h + j) * G * 512 + 512 * g, o);
				}
			}
			/* bytes 94..109: the scales (96..107) straddle the lanes by two bytes */
			__m512i t[4], a[3], w[4];

			rows_tr16x4(rp, off + 94, t);
			for (int i = 0; i < 3; i++)
				a[i] = _mm512_or_si512(_mm512_srli_epi32(t[i], 16),
						       _mm512_slli_epi32(t[i + 1], 16));
			w[0] = _mm512_or_si512(_mm512_and_si512(a[0], k2),
					       _mm512_slli_epi32(_mm512_and_si512(a[2], k1), 4));
			w[1] = _mm512_or_si512(_mm512_and_si512(a[1], k2), _mm512_slli_epi32(
				_mm512_and_si512(_mm512_srli_epi32(a[2], 2), k1), 4));
			w[2] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(a[0], 4), k2),
					       _mm512_slli_epi32(_mm512_and_si512(
						       _mm512_srli_epi32(a[2], 4), k1), 4));
			w[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(a[1], 4), k2),
					       _mm512_slli_epi32(_mm512_and_si512(
						       _mm512_srli_epi32(a[2], 6), k1), 4));
			for (int q = 0; q < 4; q++)
				for (int j = 0; j < 4; j++) {
					const __m512i b = _mm512_and_si512(_mm512_srli_epi32(w[q], 8 * j),
									   _mm512_set1_epi32(0xFF));

					_mm512_store_ps(sg + (4 * q + j) * 16, _mm512_cvtepi32_ps(
						_mm512_sub_epi32(b, _mm512_set1_epi32(32))));
				}
			_mm512_store_ps(sg + 16 * 16, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(
				_mm512_srli_epi32(t[3], 16))));
		}
	}
}

/*
 * codes: the non-linear level + 128 (0..241, unsigned for vpdpbusd; VNNI
 * only, vpmaddubsw's pair sums would saturate); scales ls - 32 as floats
 */
ALWAYS_INLINE void pack_iq4_xs(const struct panel *p, const int G, int64_t u0, int nu,
			       uint8_t *dst)
{
	const __m512i m4 = _mm512_set1_epi8(0x0F), kv4 = nl_lut(); /* VNNI: levels + 128 */

	for (int s = 0; s < nu / 8; s++) {
		const int64_t off = (u0 / 8 + s) * 136;
		uint8_t *ds = dst + (size_t)s * SBW(G, IQ4XS_SCALE_BYTES);

		for (int g = 0; g < G; g++) {
			const uint8_t *const *rp = p->rp + 16 * g;
			float *sg = (float *)(ds + 8 * G * 512 + g * IQ4XS_SCALE_BYTES);

			for (int pr = 0; pr < 4; pr++) {
				__m512i za[8], zb[8], o[8];

				for (int i = 0; i < 8; i++) {
					/* 128-bit lanes: unit 2pr, unit 2pr + 1 of row i, the same of row i + 8 */
					const __m512i v = load_pair256(rp[i] + off + 8 + 32 * pr,
								       rp[i + 8] + off + 8 + 32 * pr);
					/* [A, A] per row, low nibbles (elements 0..15) then high (16..31) */
					const __m512i ua = _mm512_shuffle_i64x2(v, v, _MM_SHUFFLE(2, 2, 0, 0));
					const __m512i ub = _mm512_shuffle_i64x2(v, v, _MM_SHUFFLE(3, 3, 1, 1));

					za[i] = _mm512_shuffle_epi8(kv4, _mm512_and_si512(
						_mm512_mask_blend_epi64(0xCC, ua, _mm512_srli_epi16(ua, 4)), m4));
					zb[i] = _mm512_shuffle_epi8(kv4, _mm512_and_si512(
						_mm512_mask_blend_epi64(0xCC, ub, _mm512_srli_epi16(ub, 4)), m4));
				}
				tr16x8(za, o);
				store8(ds + (2 * pr) * G * 512 + 512 * g, o);
				tr16x8(zb, o);
				store8(ds + (2 * pr + 1) * G * 512 + 512 * g, o);
			}
			/* lane: d | scales_h << 16, then scales_l */
			__m512i t[4];

			rows_tr16x4(rp, off, t);
			for (int ib = 0; ib < 8; ib++) {
				const __m512i lo = _mm512_and_si512(_mm512_srli_epi32(t[1], 4 * ib),
								    _mm512_set1_epi32(0xF));
				const __m512i hi = _mm512_and_si512(_mm512_srli_epi32(t[0], 16 + 2 * ib),
								    _mm512_set1_epi32(3));

				_mm512_store_ps(sg + 16 * ib, _mm512_cvtepi32_ps(_mm512_sub_epi32(
					_mm512_or_si512(lo, _mm512_slli_epi32(hi, 4)),
					_mm512_set1_epi32(32))));
			}
			_mm512_store_ps(sg + 16 * 8, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(t[0])));
		}
	}
}

/* codes 0..3 as Q3_K's without the high bit; scales and mins are nibbles of one byte */
ALWAYS_INLINE void pack_q2_k(const struct panel *p, const int G, int64_t u0, int nu,
			     uint8_t *dst)
{
	const __m512i m3 = _mm512_set1_epi8(3), m4 = _mm512_set1_epi32(0xF);

	for (int s = 0; s < nu / 8; s++) {
		const int64_t off = (u0 / 8 + s) * 84;
		uint8_t *ds = dst + (size_t)s * SBW(G, Q2K_SCALE_BYTES);

		for (int g = 0; g < G; g++) {
			const uint8_t *const *rp = p->rp + 16 * g;
			uint8_t *sg = ds + 8 * G * 512 + g * Q2K_SCALE_BYTES;

			for (int h = 0; h < 2; h++) {
				__m512i q[8];

				for (int i = 0; i < 8; i++)
					q[i] = load_pair256(rp[i] + off + 16 + 32 * h,
							    rp[i + 8] + off + 16 + 32 * h);
				for (int j = 0; j < 4; j++) {
					__m512i z[8], o[8];

					for (int i = 0; i < 8; i++)
						z[i] = _mm512_and_si512(_mm512_srli_epi16(q[i], 2 * j), m3);
					tr16x8(z, o);
					store8(ds + (4 * h + j) * G * 512 + 512 * g, o);
				}
			}
			/* lane: bytes 4q..4q+3 of the 16 scale bytes (scale low nibble, min high) */
			__m512i t[4], mn[16], hdr[4];

			rows_tr16x4(rp, off, t);
			for (int q = 0; q < 4; q++)
				for (int b = 0; b < 4; b++) {
					const __m512i v = _mm512_srli_epi32(t[q], 8 * b);

					_mm512_store_ps(sg + (4 * q + b) * 64,
							_mm512_cvtepi32_ps(_mm512_and_si512(v, m4)));
					mn[4 * q + b] = _mm512_and_si512(_mm512_srli_epi32(v, 4), m4);
				}
			for (int i = 0; i < 8; i++)
				_mm512_store_si512(sg + (16 + i) * 64, _mm512_or_si512(
					mn[2 * i], _mm512_slli_epi32(mn[2 * i + 1], 16)));
			/* d, dmin: bytes 80..83, the last lane of bytes 68..83 */
			rows_tr16x4(rp, off + 68, hdr);
			_mm512_store_ps(sg + 24 * 64, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(hdr[3])));
			_mm512_store_ps(sg + 25 * 64, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(
				_mm512_srli_epi32(hdr[3], 16))));
		}
	}
}

/* ------------------------------------------------------------------------ */
/* packed activations: per micro-tile of NCP columns, one pointer per unit  */

/*
 * Q8_0 columns (NULL: a zero column) into [unit][quants NCP x 32 | start
 * NCP x int32 | scale NCP x float]; start = -z * sum, z the weights' zero
 * point (128 for IQ4_NL levels + 128, 8 for Q4_0).
 */
static void xpack_q8(const uint8_t *const *cols, int64_t nu, int32_t z, uint8_t *out)
{
	/* missing columns of a last tile read a zero block, with stride 0 */
	static const struct hyb_block_q8_0 zero;
	const struct hyb_block_q8_0 *b[NCP];
	int64_t step[NCP];
	const __m256i flip = _mm256_set1_epi8((char)0x80);
	const int zshift = z == 128 ? 7 : 3;

	for (int c = 0; c < NCP; c++) {
		b[c] = cols[c] ? (const struct hyb_block_q8_0 *)cols[c] : &zero;
		step[c] = cols[c] ? 1 : 0;
	}
	/*
	 * All NCP columns of a unit at once: the four byte sums come out of one
	 * reduction and the four scales out of one conversion. This runs once
	 * per call over ncols x k, so it must stay cheap next to a short
	 * row range.
	 */
	for (int64_t u = 0; u < nu; u++, out += UX8) {
		__m256i sad[NCP];
		uint64_t dh = 0;

		for (int c = 0; c < NCP; c++) {
			const struct hyb_block_q8_0 *bc = b[c] + u * step[c];
			const __m256i q = _mm256_loadu_si256((const __m256i *)bc->qs);

			_mm256_storeu_si256((__m256i *)(out + 32 * c), q);
			/* sums of x + 128 per 8 bytes */
			sad[c] = _mm256_sad_epu8(_mm256_xor_si256(q, flip), _mm256_setzero_si256());
			dh |= (uint64_t)bc->d << (16 * c);
		}
		/* 4 columns x 4 partial sums -> 4 sums (qwords 0-3 of each) */
		const __m256i s01 = _mm256_add_epi64(_mm256_unpacklo_epi64(sad[0], sad[1]),
						     _mm256_unpackhi_epi64(sad[0], sad[1]));
		const __m256i s23 = _mm256_add_epi64(_mm256_unpacklo_epi64(sad[2], sad[3]),
						     _mm256_unpackhi_epi64(sad[2], sad[3]));
		/* s01 = [c0 lo, c1 lo, c0 hi, c1 hi] per 128-bit lane pairs */
		const __m256i t = _mm256_add_epi64(_mm256_permute2x128_si256(s01, s23, 0x20),
						   _mm256_permute2x128_si256(s01, s23, 0x31));
		/* qwords c0, c1, c2, c3 -> int32, minus the 32 * 128 offset */
		const __m128i sum = _mm_sub_epi32(_mm256_cvtepi64_epi32(t), _mm_set1_epi32(32 * 128));

		_mm_storeu_si128((__m128i *)(out + NCP * 32),
				 _mm_sub_epi32(_mm_setzero_si128(), _mm_slli_epi32(sum, zshift)));
		_mm_storeu_ps((float *)(out + NCP * 36),
			      _mm_cvtph_ps(_mm_cvtsi64_si128((long long)dh)));
	}
}

/*
 * Q8_0 columns for mk_q0 into [unit][quants NCP x 32 | per column 8 lane
 * starts: -128 * the sum of the lane's 4 quants (the xor-flipped weights'
 * zero point) | scale NCP x float].
 */
static void xpack_q0(const uint8_t *const *cols, int64_t nu, uint8_t *out)
{
	static const struct hyb_block_q8_0 zero;
	const __m256i z = _mm256_set1_epi8((char)0x80);

	for (int64_t u = 0; u < nu; u++, out += UX0) {
		for (int c = 0; c < NCP; c++) {
			const struct hyb_block_q8_0 *b = cols[c] ?
				(const struct hyb_block_q8_0 *)cols[c] + u : &zero;
			const __m256i q = _mm256_loadu_si256((const __m256i *)b->qs);
			/* 128 * (pair sums), then pairs of pairs: 128 * each lane's 4 quants */
			const __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(z, q),
							    _mm256_set1_epi16(1));

			_mm256_storeu_si256((__m256i *)(out + 32 * c), q);
			_mm256_storeu_si256((__m256i *)(out + NCP * 32 + 32 * c),
					    _mm256_sub_epi32(_mm256_setzero_si256(), s));
			((float *)(out + NCP * 64))[c] = f16_scalar(b->d);
		}
	}
}

/*
 * Q8_K columns into [super-block][quants NCP x 256 | extra | scale NCP x
 * float]. Extra per column, by weight type: Q4_K, Q5_K 4 int32 = sums of
 * sub-blocks (2i, 2i+1) as int16 pairs (for vpdpwssd with the mins); Q6_K,
 * Q3_K 16 int32 = -z * bsum (the codes' zero point z: 32, 4); IQ4_XS 8
 * int32 = -128 * the sums of sub-blocks of 32; Q2_K 8 int32 = bsum pairs as
 * int16 x 2 (for its mins).
 */
static void xpack_k(const enum ptype t, const uint8_t *const *cols, int64_t nsb, uint8_t *out)
{
	const size_t extra = x_extra(t), sbx = SXK(extra);

	for (int64_t s = 0; s < nsb; s++, out += sbx) {
		float *d = (float *)(out + NCP * (256 + extra));

		for (int c = 0; c < NCP; c++) {
			const struct hyb_block_q8_k *b = cols[c] ?
				(const struct hyb_block_q8_k *)cols[c] + s : NULL;
			int32_t *ex = (int32_t *)(out + NCP * 256 + extra * c);
			const int16_t *bs = b ? b->bsums : NULL;

			if (!b) {
				memset(out + 256 * c, 0, 256);
				memset(ex, 0, extra);
				d[c] = 0;
				continue;
			}
			memcpy(out + 256 * c, b->qs, 256);
			d[c] = b->d;
			if (t == P_Q6_K || t == P_Q3_K) {
				for (int j = 0; j < 16; j++)
					ex[j] = (t == P_Q6_K ? -32 : -4) * bs[j];
			} else if (t == P_IQ4_XS) {
				for (int j = 0; j < 8; j++)
					ex[j] = -128 * (bs[2 * j] + bs[2 * j + 1]);
			} else if (t == P_Q2_K) {
				for (int j = 0; j < 8; j++)
					ex[j] = (int32_t)((uint32_t)(uint16_t)bs[2 * j] |
							  (uint32_t)(uint16_t)bs[2 * j + 1] << 16);
			} else {
				for (int i = 0; i < 4; i++) {
					const uint16_t lo = (uint16_t)(bs[4 * i] + bs[4 * i + 1]);
					const uint16_t hi = (uint16_t)(bs[4 * i + 2] + bs[4 * i + 3]);

					ex[i] = (int32_t)((uint32_t)lo | (uint32_t)hi << 16);
				}
			}
		}
	}
}

/* ------------------------------------------------------------------------ */
/* packed micro-kernels                                                     */

/*
 * Software prefetch of the next chunk's raw rows into L2, one row per unit
 * of micro-kernel work, each column tile taking a share of the rows.
 * Packing then reads from L2 instead of stalling on dozens of row streams
 * (more than the hardware prefetcher tracks), and the transfers overlap the
 * arithmetic instead of queueing up in a burst.
 */
struct next_chunk {
	const uint8_t *w;
	size_t ws;
	int64_t r0, nrows; /* first row of the next chunk's panel; rows of the matrix */
	size_t off, len;   /* its bytes in each row (len 0: nothing to fetch) */
};

struct pf_rows {
	const struct next_chunk *n;
	int ra, rb; /* this tile's share of the panel's rows */
};

static inline void prefetch_row(const struct next_chunk *nc, int r)
{
	const uint8_t *p = nc->w + (size_t)min64(nc->r0 + r, nc->nrows - 1) * nc->ws + nc->off;
	const uintptr_t hi = (uintptr_t)p + nc->len;

	for (uintptr_t l = (uintptr_t)p & ~(uintptr_t)63; l < hi; l += 64)
		_mm_prefetch((const char *)l, _MM_HINT_T1);
}

ALWAYS_INLINE void pf_step(struct pf_rows pf, int i)
{
	if (pf.ra + i < pf.rb)
		prefetch_row(pf.n, pf.ra + i);
}

#if HYB_AMX
/*
 * AMX tiles (Intel SDM vol. 1, "Intel Advanced Matrix Extensions";
 * docs/AMXEMU.md): one tdpbsud gives the whole block's integer dot products
 * of nc columns by 16 rows, what 8 vpdpbusd per column give below. The
 * micro-kernels keep their float code: the integers are exact in any
 * grouping, so the sums are the VNNI level's bit for bit. The packed panel
 * is already in the layout the B operand wants (4 consecutive k of 16 rows
 * in each 64-byte row), and a column's packed activations are its bytes in
 * k order, the A operand's rows.
 *
 * The tiles take 16 columns at a time, their full height: before the
 * micro-kernels pass over a chunk, amx_chunk forms the integer sums of its
 * every block, row group and column of the next 16 (the column tiles
 * NCP at a time read them from `dots`), with the activations loaded
 * straight from the caller's Q8_0 / Q8_K columns (their stride is one).
 *
 * Tiles: 0 the activations (nc <= 16 rows of kb bytes, signed); 1-3 the
 * weights of row group g (kb / 4 rows of 64 bytes, unsigned); 4-6 the
 * dword sums of group g (nc rows of 16).
 */
struct amx_config {
	uint8_t palette, start_row, reserved[14];
	uint16_t colsb[16];
	uint8_t rows[16];
};

static void amx_configure(int kb, int nc)
{
	struct amx_config c __attribute__((aligned(64)));

	memset(&c, 0, sizeof(c));
	c.palette = 1;
	c.rows[0] = (uint8_t)nc;
	c.colsb[0] = (uint16_t)kb;
	for (int g = 0; g < GMAX; g++) {
		c.rows[1 + g] = (uint8_t)(kb / 4);
		c.colsb[1 + g] = 64;
		c.rows[4 + g] = (uint8_t)nc;
		c.colsb[4 + g] = 64;
	}
	_tile_loadconfig(&c);
}

/*
 * out[256 * g + 16 * c + r] = the dot product of row 16g + r of the panel
 * (wu + 512 g, kb bytes of k) and column c (xa + c * xs), for c < nc.
 */
ALWAYS_INLINE void amx_dots(const int G, const uint8_t *xa, size_t xs, const uint8_t *wu,
			    int32_t *out)
{
	/* GCC's tileloadd asm names no memory operand: the packing's stores go first */
	__asm__ volatile("" ::: "memory");
	_tile_loadd(0, xa, (long)xs);
	_tile_loadd(1, wu, 64);
	_tile_zero(4);
	_tile_dpbsud(4, 0, 1);
	if (G > 1) {
		_tile_loadd(2, wu + 512, 64);
		_tile_zero(5);
		_tile_dpbsud(5, 0, 2);
	}
	if (G > 2) {
		_tile_loadd(3, wu + 1024, 64);
		_tile_zero(6);
		_tile_dpbsud(6, 0, 3);
	}
	_tile_stored(4, out, 64);
	if (G > 1)
		_tile_stored(5, out + 256, 64);
	if (G > 2)
		_tile_stored(6, out + 512, 64);
}

/* bytes of k per integer sum: a sub-block of 16 for Q6_K, Q3_K, Q2_K */
static inline int amx_kb(const enum ptype t)
{
	return t == P_Q6_K || t == P_Q3_K || t == P_Q2_K ? 16 : 32;
}

/*
 * The integer sums of a packed chunk (cu units from unit u0; ws its packed
 * weights) with the columns at x, x_stride apart, as many as the tiles are
 * configured for: dots[(q * G + g) * 256 + 16 * c + r], q the chunk's
 * blocks, or its super-blocks' sub-blocks in order.
 */
static void amx_chunk(const enum ptype t, const int G, const uint8_t *x, size_t x_stride,
		      const uint8_t *ws, int64_t u0, int cu, int32_t *dots)
{
	if (!ptype_k(t)) {
		const size_t qs = offsetof(struct hyb_block_q8_0, qs);

		for (int u = 0; u < cu; u++)
			amx_dots(G, x + (size_t)(u0 + u) * sizeof(struct hyb_block_q8_0) + qs,
				 x_stride, ws + (size_t)u * UW8(G), dots + (size_t)u * G * 256);
		return;
	}
	const int sbe = amx_kb(t), nsub = 256 / sbe;
	const size_t qs = offsetof(struct hyb_block_q8_k, qs);

	for (int s = 0; s < cu / 8; s++) {
		const uint8_t *xb = x + (size_t)(u0 / 8 + s) * sizeof(struct hyb_block_q8_k) + qs;
		const uint8_t *wsb = ws + (size_t)s * SBW(G, scale_bytes(t));

		for (int j = 0; j < nsub; j++)
			amx_dots(G, xb + sbe * j, x_stride,
				 wsb + (size_t)(j * sbe / 32) * G * 512 + (j * sbe % 32) * 16,
				 dots + (size_t)(s * nsub + j) * G * 256);
	}
}
#endif

/* the accumulators carry over k chunks: a chunk starts from what the last one stored */
ALWAYS_INLINE __m512 acc_start(const float *y, __mmask16 m, int first)
{
	return first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m, y);
}

/*
 * Q8_0 (tinyBLAS_Q0_AVX / ggml_vec_dot_q8_0_q8_0): per output 8 float
 * chains, chain t over the blocks adding fma(dw*dx, float(sum of the
 * block's products 4t..4t+3), acc_t), then hsum_float_8's tree. Rows in
 * lanes: one vpdpbusd gives chain t's sums of 16 rows, kept apart in
 * acc[t]. 16 rows x 2 columns; the chains carry over k chunks in `st`.
 */
ALWAYS_INLINE void mk_q0(const int NC, const uint8_t *wp, const uint8_t *xp, int nu,
			 struct pf_rows pf, const int c0, float *const *y, float *const *st,
			 __mmask16 m, int first, int last)
{
	__m512 acc[2][8];

	for (int c = 0; c < NC; c++)
		for (int t = 0; t < 8; t++)
			acc[c][t] = first ? _mm512_setzero_ps() : _mm512_load_ps(st[c] + 16 * t);
	for (int u = 0; u < nu; u++) {
		const uint8_t *wu = wp + (size_t)u * UW8(G0), *xu = xp + (size_t)u * UX0;
		const __m512 sw = _mm512_load_ps(wu + 512 * G0);
		__m512 d[2];

		if (c0 == 0)
			pf_step(pf, u);
		for (int c = 0; c < NC; c++)
			d[c] = _mm512_mul_ps(sw, _mm512_set1_ps(((const float *)(xu + NCP * 64))[c0 + c]));
#pragma GCC unroll 8
		for (int t = 0; t < 8; t++) {
			const __m512i wv = _mm512_load_si512(wu + 64 * t);

#pragma GCC unroll 2
			for (int c = 0; c < NC; c++) {
				__m512i ia = _mm512_set1_epi32(ld32(xu + NCP * 32 + 32 * (c0 + c) + 4 * t));

				ia = dot_us(ia, wv, _mm512_set1_epi32(
					ld32(xu + 32 * (c0 + c) + 4 * t)));
				acc[c][t] = _mm512_fmadd_ps(d[c], _mm512_cvtepi32_ps(ia), acc[c][t]);
			}
		}
	}
	for (int c = 0; c < NC; c++) {
		if (last) {
			/* hsum_float_8: (t_i = a_i+4 + a_i), then (t0 + t2) + (t1 + t3) */
			const __m512 t0 = _mm512_add_ps(acc[c][4], acc[c][0]);
			const __m512 t1 = _mm512_add_ps(acc[c][5], acc[c][1]);
			const __m512 t2 = _mm512_add_ps(acc[c][6], acc[c][2]);
			const __m512 t3 = _mm512_add_ps(acc[c][7], acc[c][3]);

			_mm512_mask_storeu_ps(y[c0 + c], m, _mm512_add_ps(_mm512_add_ps(t0, t2),
									 _mm512_add_ps(t1, t3)));
		} else {
			for (int t = 0; t < 8; t++)
				_mm512_store_ps(st[c] + 16 * t, acc[c][t]);
		}
	}
}

/*
 * Q4_0 (repacked arithmetic of ggml_gemm_q4_0_8x8_q8_0): per block
 * acc = fma(float(dot), dw*dx, acc), one block after the other.
 */
ALWAYS_INLINE void mk_q8(const int G, const int NC, const uint8_t *wp, const uint8_t *xp, int nu,
			 struct pf_rows pf, float *const *y, const __mmask16 *m, int first,
			 const int32_t *dots)
{
	__m512 acc[GMAX][NCP];

	(void)dots; /* AMX: the integer sums, amx_chunk's */
	for (int g = 0; g < G; g++)
		for (int c = 0; c < NC; c++)
			acc[g][c] = acc_start(y[c] + 16 * g, m[g], first);
	for (int u = 0; u < nu; u++) {
		const uint8_t *wu = wp + (size_t)u * UW8(G), *xu = xp + (size_t)u * UX8;
		__m512i ia[GMAX][NCP];

		pf_step(pf, u);

#pragma GCC unroll 4
		for (int c = 0; c < NC; c++) {
			const __m512i init = _mm512_set1_epi32(ld32(xu + NCP * 32 + 4 * c));

			for (int g = 0; g < G; g++)
#if HYB_AMX
				ia[g][c] = _mm512_add_epi32(init, _mm512_load_si512(
					dots + ((size_t)u * G + g) * 256 + 16 * c));
#else
				ia[g][c] = init;
#endif
		}
#if !HYB_AMX
#pragma GCC unroll 8
		for (int t = 0; t < 8; t++) {
			__m512i wv[GMAX];

			for (int g = 0; g < G; g++)
				wv[g] = _mm512_load_si512(wu + 512 * g + 64 * t);
#pragma GCC unroll 4
			for (int c = 0; c < NC; c++) {
				const __m512i xb = _mm512_set1_epi32(ld32(xu + 32 * c + 4 * t));

				for (int g = 0; g < G; g++)
					ia[g][c] = dot_us(ia[g][c], wv[g], xb);
			}
		}
#endif
#pragma GCC unroll 3
		for (int g = 0; g < G; g++) {
			const __m512 sw = _mm512_load_ps(wu + 512 * G + 64 * g);

#pragma GCC unroll 4
			for (int c = 0; c < NC; c++) {
				const __m512 dx = _mm512_set1_ps(((const float *)(xu + NCP * 36))[c]);

				acc[g][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[g][c]),
							    _mm512_mul_ps(sw, dx), acc[g][c]);
			}
		}
	}
	for (int c = 0; c < NC; c++)
		for (int g = 0; g < G; g++)
			_mm512_mask_storeu_ps(y[c] + 16 * g, m[g], acc[g][c]);
}

/*
 * Repacked Q4_K and Q2_K (the arithmetic of ggml_gemm_q4_K_8x8_q8_K and
 * ggml_gemm_q2_K_8x8_q8_K): per group of sub-blocks (Q4_K a pair of 32,
 * Q2_K a half super-block of 8 x 16) the exact sum of sc_j * dot_j
 * (float-exact: below 2^24), acc = fma(it, dw*yd, acc); the mins likewise
 * per group into their own chain (kept in `mins` between k chunks); y =
 * acc - mins at the end.
 */
ALWAYS_INLINE void mk_rep(const enum ptype t, const int G, const int NC, const uint8_t *wp,
			  const uint8_t *xp, int nsb, struct pf_rows pf, float *const *y,
			  float *const *mins, const __mmask16 *m, int first, int last,
			  const int32_t *dots)
{
	const int q2 = t == P_Q2_K;
	const int sbe = q2 ? 16 : 32, nsg = q2 ? 8 : 2; /* sub-block elements, per group */

	(void)dots; /* AMX: the integer sums, amx_chunk's */
	const int mpg = q2 ? 4 : 1;                     /* min pair vectors per group */
	const size_t scb = scale_bytes(t), exb = x_extra(t), sx = SXK(exb);
	const size_t mn_at = (q2 ? 16 : 8) * 64, d_at = (q2 ? 24 : 12) * 64;
	__m512 acc[GMAX][NCP];

	for (int g = 0; g < G; g++)
		for (int c = 0; c < NC; c++)
			acc[g][c] = acc_start(y[c] + 16 * g, m[g], first);
	for (int s = 0; s < nsb; s++) {
		const uint8_t *ws = wp + (size_t)s * SBW(G, scb);
		const uint8_t *xs = xp + (size_t)s * sx;
		const uint8_t *sc = ws + 8 * G * 512;

		for (int grp = 0; grp < 256 / (sbe * nsg); grp++) {
			__m512 f[GMAX][NCP];

			for (int jj = 0; jj < nsg; jj++) {
				const int j = grp * nsg + jj;
				/* a sub-block of 16 is half a unit: its dwords 0-3 or 4-7 */
				const uint8_t *wu = ws + (size_t)(j * sbe / 32) * G * 512 +
						    (j * sbe % 32) * 16;
				__m512i ia[GMAX][NCP];

				if (j * sbe % 32 == 0)
					pf_step(pf, s * 8 + j * sbe / 32);
#if HYB_AMX
				const int32_t *dq = dots + ((size_t)s * (256 / sbe) + j) * G * 256;

				(void)wu;
				for (int g = 0; g < G; g++)
					for (int c = 0; c < NC; c++)
						ia[g][c] = _mm512_load_si512(dq + 256 * g + 16 * c);
#else
				for (int g = 0; g < G; g++)
					for (int c = 0; c < NC; c++)
						ia[g][c] = _mm512_setzero_si512();
#pragma GCC unroll 8
				for (int q = 0; q < sbe / 4; q++) {
					__m512i wv[GMAX];

					for (int g = 0; g < G; g++)
						wv[g] = _mm512_load_si512(wu + 512 * g + 64 * q);
#pragma GCC unroll 4
					for (int c = 0; c < NC; c++) {
						const __m512i xb = _mm512_set1_epi32(
							ld32(xs + 256 * c + sbe * j + 4 * q));

						for (int g = 0; g < G; g++)
							ia[g][c] = dot_us(ia[g][c], wv[g], xb);
					}
				}
#endif
				for (int g = 0; g < G; g++) {
					const __m512 sj = _mm512_load_ps(sc + g * scb + 64 * j);

					for (int c = 0; c < NC; c++)
						f[g][c] = jj ? _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[g][c]), sj,
									       f[g][c])
							     : _mm512_mul_ps(_mm512_cvtepi32_ps(ia[g][c]), sj);
				}
			}
			for (int g = 0; g < G; g++) {
				const __m512 dw = _mm512_load_ps(sc + g * scb + d_at);

				for (int c = 0; c < NC; c++) {
					const __m512 yd = _mm512_set1_ps(
						((const float *)(xs + NCP * (256 + exb)))[c]);

					acc[g][c] = _mm512_fmadd_ps(f[g][c], _mm512_mul_ps(dw, yd),
								    acc[g][c]);
				}
			}
		}
	}
	/* the mins' chain: their own pass, it needs none of the registers above */
	for (int g = 0; g < G; g++) {
		__m512 am[NCP];

		for (int c = 0; c < NC; c++)
			am[c] = first ? _mm512_setzero_ps() : _mm512_load_ps(mins[c] + 16 * g);
		for (int s = 0; s < nsb; s++) {
			const uint8_t *sg = wp + (size_t)s * SBW(G, scb) + 8 * G * 512 + g * scb;
			const uint8_t *xs = xp + (size_t)s * sx;
			const __m512 dm = _mm512_load_ps(sg + d_at + 64);

			for (int grp = 0; grp < 256 / (sbe * nsg); grp++) {
				for (int c = 0; c < NC; c++) {
					const __m512 yd = _mm512_set1_ps(
						((const float *)(xs + NCP * (256 + exb)))[c]);
					__m512i im = _mm512_setzero_si512();

					for (int i = grp * mpg; i < (grp + 1) * mpg; i++)
						im = dot_ww(im, _mm512_load_si512(sg + mn_at + 64 * i),
							    _mm512_set1_epi32(ld32(xs + NCP * 256 +
										   exb * c + 4 * i)));
					am[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(im),
								_mm512_mul_ps(dm, yd), am[c]);
				}
			}
		}
		for (int c = 0; c < NC; c++) {
			if (last)
				acc[g][c] = _mm512_sub_ps(acc[g][c], am[c]);
			else
				_mm512_store_ps(mins[c] + 16 * g, am[c]);
		}
	}
	for (int c = 0; c < NC; c++)
		for (int g = 0; g < G; g++)
			_mm512_mask_storeu_ps(y[c] + 16 * g, m[g], acc[g][c]);
}

/*
 * The tiled K-quant matmul (Q6_K, Q3_K, Q5_K, IQ4_XS): per super-block the
 * exact integer s1 = sum over sub-blocks of sc_j * dot_j (dot_j net of the
 * codes' zero point, which the accumulator starts from), v = float(s1)*dw,
 * less dmin * float(mins' integer) fused for Q5_K, then acc = fma(v, yd,
 * acc). sc*dot is formed in float (cvt, mul, fma: no 512-bit integer
 * multiply, which only one port of this CPU class has), exact below 2^24:
 * two sub-blocks at a time where their sum stays below (16 elements, or
 * Q5_K's 32 with 5-bit codes), one at a time for IQ4_XS (32 elements of up
 * to 128 x 128). acc lives in y between super-blocks: the registers hold s1
 * and the pair.
 */
ALWAYS_INLINE void mk_tiled(const enum ptype t, const int G, const int NC, const uint8_t *wp,
			    const uint8_t *xp, int nsb, struct pf_rows pf, float *const *y,
			    const __mmask16 *m, int first, const int32_t *dots)
{
	const int sbe = t == P_Q6_K || t == P_Q3_K ? 16 : 32; /* elements per sub-block */

	(void)dots; /* AMX: the integer sums, amx_chunk's */
	const int pair = t != P_IQ4_XS, zp = t != P_Q5_K, mins = t == P_Q5_K;
	const size_t scb = scale_bytes(t), exb = x_extra(t), sx = SXK(exb);
	/* offsets in a super-block's scales: d (and dmin, the min pairs for Q5_K) */
	const size_t d_at = t == P_Q5_K ? 12 * 64 : (size_t)(256 / sbe) * 64;

	for (int s = 0; s < nsb; s++) {
		const uint8_t *ws = wp + (size_t)s * SBW(G, scb);
		const uint8_t *xs = xp + (size_t)s * sx;
		const uint8_t *sc = ws + 8 * G * 512;
		__m512i s1[GMAX][NCP];
		__m512 f[GMAX][NCP];

		for (int g = 0; g < G; g++)
			for (int c = 0; c < NC; c++) {
				s1[g][c] = _mm512_setzero_si512();
				f[g][c] = _mm512_setzero_ps();
			}
		for (int j = 0; j < 256 / sbe; j++) {
			/* a sub-block of 16 is half a unit: its dwords 0-3 or 4-7 */
			const uint8_t *wu = ws + (size_t)(j * sbe / 32) * G * 512 + (j * sbe % 32) * 16;
			__m512i ia[GMAX][NCP];

			if (j * sbe % 32 == 0)
				pf_step(pf, s * 8 + j * sbe / 32);
#if HYB_AMX
			const int32_t *dq = dots + ((size_t)s * (256 / sbe) + j) * G * 256;

			(void)wu;
#endif

#pragma GCC unroll 4
			for (int c = 0; c < NC; c++) {
				const __m512i init = zp ? _mm512_set1_epi32(ld32(xs + NCP * 256 +
										 exb * c + 4 * j))
							: _mm512_setzero_si512();

				for (int g = 0; g < G; g++)
#if HYB_AMX
					ia[g][c] = _mm512_add_epi32(init, _mm512_load_si512(
						dq + 256 * g + 16 * c));
#else
					ia[g][c] = init;
#endif
			}
#if !HYB_AMX
#pragma GCC unroll 8
			for (int q = 0; q < sbe / 4; q++) {
				__m512i wv[GMAX];

				for (int g = 0; g < G; g++)
					wv[g] = _mm512_load_si512(wu + 512 * g + 64 * q);
#pragma GCC unroll 4
				for (int c = 0; c < NC; c++) {
					const __m512i xb = _mm512_set1_epi32(
						ld32(xs + 256 * c + sbe * j + 4 * q));

					for (int g = 0; g < G; g++)
						ia[g][c] = dot_us(ia[g][c], wv[g], xb);
				}
			}
#endif
			for (int g = 0; g < G; g++) {
				const __m512 sj = _mm512_load_ps(sc + g * scb + 64 * j);

				for (int c = 0; c < NC; c++) {
					const __m512 fi = _mm512_cvtepi32_ps(ia[g][c]);

					if (!pair) {
						s1[g][c] = _mm512_add_epi32(s1[g][c], _mm512_cvtps_epi32(
							_mm512_mul_ps(fi, sj)));
					} else if (!(j & 1)) {
						f[g][c] = _mm512_mul_ps(fi, sj);
					} else {
						f[g][c] = _mm512_fmadd_ps(fi, sj, f[g][c]);
						s1[g][c] = _mm512_add_epi32(s1[g][c],
									    _mm512_cvtps_epi32(f[g][c]));
					}
				}
			}
		}
		for (int g = 0; g < G; g++) {
			const uint8_t *sg = sc + g * scb;
			const __m512 dw = _mm512_load_ps(sg + d_at);

			for (int c = 0; c < NC; c++) {
				const __m512 yd = _mm512_set1_ps(((const float *)(xs + NCP * (256 + exb)))[c]);
				const __m512 a = acc_start(y[c] + 16 * g, m[g], first && s == 0);
				__m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(s1[g][c]), dw);

				if (mins) {
					__m512i im = _mm512_setzero_si512();

					for (int i = 0; i < 4; i++)
						im = dot_ww(im, _mm512_load_si512(sg + (8 + i) * 64),
							    _mm512_set1_epi32(ld32(xs + NCP * 256 +
										   exb * c + 4 * i)));
					v = _mm512_fnmadd_ps(_mm512_load_ps(sg + 13 * 64),
							     _mm512_cvtepi32_ps(im), v);
				}
				_mm512_mask_storeu_ps(y[c] + 16 * g, m[g], _mm512_fmadd_ps(v, yd, a));
			}
		}
	}
}

static void mk_any(const enum ptype t, int nc, const uint8_t *wp, const uint8_t *xp, int nu,
		   struct pf_rows pf, float *const *y, float *const *mins, const __mmask16 *m,
		   int first, int last, const int32_t *dots)
{
	if (t == P_Q8_0) {
		/* two columns at a time: 16 accumulators each (VNNI only: 0..255 weights) */
		for (int c0 = 0; c0 < nc; c0 += 2) {
			float *st[2] = { mins[c0], c0 + 1 < nc ? mins[c0 + 1] : NULL };

			if (nc - c0 >= 2)
				mk_q0(2, wp, xp, nu, pf, c0, y, st, m[0], first, last);
			else
				mk_q0(1, wp, xp, nu, pf, c0, y, st, m[0], first, last);
		}
	} else if (t == P_Q4_0 || t == P_IQ4_NL || t == P_MXFP4) {
		switch (nc) {
#define CASE(N) case N: mk_q8(G8, N, wp, xp, nu, pf, y, m, first, dots); break;
		CASE(1) CASE(2) CASE(3) CASE(4)
#undef CASE
		}
	} else if (t == P_Q4_K || t == P_Q2_K) {
#define CASE(T, N) case N: mk_rep(T, GK, N, wp, xp, nu / 8, pf, y, mins, m, first, last, dots); break;
#define TYPE(T) case T: switch (nc) { CASE(T, 1) CASE(T, 2) CASE(T, 3) CASE(T, 4) } break;
		switch (t) {
		TYPE(P_Q4_K) TYPE(P_Q2_K)
		default: break;
		}
#undef TYPE
#undef CASE
	} else {
#define CASE(T, N) case N: mk_tiled(T, GK, N, wp, xp, nu / 8, pf, y, m, first, dots); break;
#define TYPE(T) case T: switch (nc) { CASE(T, 1) CASE(T, 2) CASE(T, 3) CASE(T, 4) } break;
		switch (t) {
		TYPE(P_Q6_K) TYPE(P_Q3_K) TYPE(P_Q5_K) TYPE(P_IQ4_XS)
		default: break;
		}
#undef TYPE
#undef CASE
	}
}

static void pack_any(const enum ptype t, const struct panel *p, int64_t u0, int nu, uint8_t *dst)
{
	switch (t) {
	case P_Q8_0:
		pack_q8_0(p, G0, u0, nu, dst);
		break;
	case P_Q4_0:
		pack_q4_0(0, p, G8, u0, nu, dst);
		break;
	case P_IQ4_NL:
		pack_q4_0(1, p, G8, u0, nu, dst);
		break;
	case P_MXFP4:
		pack_q4_0(2, p, G8, u0, nu, dst);
		break;
	case P_Q4_K:
		pack_q4_k(p, GK, u0, nu, dst);
		break;
	case P_Q6_K:
		pack_q6_k(p, GK, u0, nu, dst);
		break;
	case P_Q3_K:
		pack_q3_k(p, GK, u0, nu, dst);
		break;
	case P_Q5_K:
		pack_q5_k(p, GK, u0, nu, dst);
		break;
	case P_IQ4_XS:
		pack_iq4_xs(p, GK, u0, nu, dst);
		break;
	case P_Q2_K:
		pack_q2_k(p, GK, u0, nu, dst);
		break;
	}
}

/* ------------------------------------------------------------------------ */
/* packed driver                                                            */

/*
 * Rows in panels of 16*G, k in chunks of KCU units: the chunk's packed
 * codes (16*G x 512 bytes) stay in L1 while every column tile passes over
 * them. Returns -1 (nothing written) when scratch memory is not available.
 */
static int packed_gemm(const enum ptype t, HYB_GEMM_ARGS)
{
	const int kq = ptype_k(t);
	const int G = kq ? GK : t == P_Q8_0 ? G0 : G8, rows = 16 * G;
	const int KCU = kq ? KCUK : t == P_Q8_0 ? KCU0 : KCU8;
	const int64_t nu = k / 32, ntile = (ncols + NCP - 1) / NCP;
	/* bytes per unit of k: packed activations of a tile; raw weight row per 8 units */
	const size_t xunit = kq ? SXK(x_extra(t)) / 8 : t == P_Q8_0 ? UX0 : UX8;
	const size_t w8 = kq ? raw_block(t) : 8 * raw_block(t);
	/* per column of the chunk state kept between k chunks (Q4_K/Q2_K mins, Q8_0 chains) */
	const size_t st_col = t == P_Q4_K || t == P_Q2_K ? (size_t)rows :
			      t == P_Q8_0 ? (size_t)8 * rows : 0;
	const size_t chunk = kq ? KCU / 8 * SBW(G, scale_bytes(t)) : (size_t)KCU * UW8(G);
	const size_t tile_bytes = (size_t)nu * xunit;
	/* rows of the next chunk each column tile prefetches */
	const int64_t pf_per = (rows + ntile - 1) / ntile;
	uint8_t *xs, *ws;
	float *mins = NULL; /* state between k chunks: Q4_K mins, Q8_0 chains */
	struct panel p;
#if HYB_AMX
	int32_t *dots = NULL; /* the integer sums of a chunk's next 16 columns */
	/* Q8_0 keeps vpdpbusd: its order converts every 4-product sum (mk_q0) */
	const int amx = t != P_Q8_0;
	int amx_nc = 0; /* the column count the tiles are configured for */
#endif

	xs = hyb_cpu_scratch(HYB_SCRATCH_X, tile_bytes * (size_t)ntile);
	ws = hyb_cpu_scratch(HYB_SCRATCH_W, chunk);
	if (st_col)
		mins = hyb_cpu_scratch(HYB_SCRATCH_P, sizeof(float) * (size_t)ntile * NCP * st_col);
#if HYB_AMX
	/* per block or sub-block of the chunk and row group: 16 columns x 16 rows */
	if (amx)
		dots = hyb_cpu_scratch(HYB_SCRATCH_D, (size_t)KCU * (kq ? 256 / amx_kb(t) / 8 : 1) *
					      G * 1024);
	if (amx && !dots)
		return -1;
#endif
	if (!xs || !ws || (st_col && !mins))
		return -1;
	for (int64_t tt = 0; tt < ntile; tt++) {
		const uint8_t *cols[NCP];

		for (int c = 0; c < NCP; c++)
			cols[c] = tt * NCP + c < ncols ?
				  (const uint8_t *)x + (size_t)(tt * NCP + c) * x_stride : NULL;
		if (kq)
			xpack_k(t, cols, k / 256, xs + tt * tile_bytes);
		else if (t == P_Q8_0)
			xpack_q0(cols, nu, xs + tt * tile_bytes);
		else
			xpack_q8(cols, nu, t == P_IQ4_NL || t == P_MXFP4 ? 128 : 8,
				 xs + tt * tile_bytes);
	}
	for (int64_t r0 = 0; r0 < nrows; r0 += rows) {
		__mmask16 m[GMAX];

		for (int g = 0; g < G; g++) {
			const int64_t left = nrows - r0 - 16 * g;

			m[g] = left >= 16 ? 0xFFFF : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
		}
		panel_rows(&p, G, w, w_stride, r0, nrows);
		for (int64_t u0 = 0; u0 < nu; u0 += KCU) {
			const int cu = (int)min64(KCU, nu - u0);
			struct next_chunk nxt = { w, w_stride, r0, nrows, 0, 0 };
			/* PF_CHUNKS chunks ahead, in this panel or the next one */
			int64_t pu = u0 + PF_CHUNKS * KCU, pr = r0;

			if (pu >= nu) {
				pu -= (nu + KCU - 1) / KCU * KCU;
				pr += rows;
			}
			if (pr < nrows && pu < nu) {
				nxt.r0 = pr;
				nxt.off = (size_t)pu * w8 / 8;
				nxt.len = (size_t)min64(KCU, nu - pu) * w8 / 8;
			}
			pack_any(t, &p, u0, cu, ws);
			for (int64_t tt = 0; tt < ntile; tt++) {
				const int nc = (int)min64(NCP, ncols - tt * NCP);
				const struct pf_rows pf = {
					&nxt, (int)min64(rows, tt * pf_per),
					nxt.len ? (int)min64(rows, (tt + 1) * pf_per) : 0,
				};
				float *yc[NCP], *mc[NCP];

				for (int c = 0; c < nc; c++) {
					yc[c] = y + (size_t)(tt * NCP + c) * y_stride + r0;
					mc[c] = mins ? mins + ((size_t)tt * NCP + c) * st_col : NULL;
				}
				const int32_t *dt = NULL;
#if HYB_AMX
				if (amx && tt % 4 == 0) {
					const int ncg = (int)min64(4 * NCP, ncols - tt * NCP);

					if (ncg != amx_nc) {
						amx_configure(amx_kb(t), ncg);
						amx_nc = ncg;
					}
					amx_chunk(t, G, (const uint8_t *)x + (size_t)(tt * NCP) * x_stride,
						  x_stride, ws, u0, cu, dots);
				}
				if (amx)
					dt = dots + 16 * NCP * (tt % 4);
#endif
				mk_any(t, nc, ws, xs + tt * tile_bytes + (size_t)u0 * xunit, cu, pf, yc,
				       mc, m, u0 == 0, u0 + KCU >= nu, dt);
				/* rows of the share the tile's units did not cover */
				for (int r = pf.ra + cu; r < pf.rb; r++)
					prefetch_row(&nxt, r);
			}
		}
	}
#if HYB_AMX
	/* back to the init state: a context switch then saves no tile data */
	if (amx_nc)
		_tile_release();
#endif
	return 0;
}

