/* SPDX-License-Identifier: MIT */
/*
 * AVX-512 sparse FFN kernels, written once and compiled twice: by
 * sparse_ffn_avx512.c with HYB_SPARSE_VNNI 0 and sparse_ffn_avx512vnni.c
 * with HYB_SPARSE_VNNI 1 (only those two files include it).
 *
 * Rows come in tiles of TR (4): a dot tile loads each activation block once
 * for its rows; an axpy tile loads and stores each slice of y once for its
 * rows (y stays in registers across the tile's rows, so the axpy costs
 * 1/TR of a y load and store per weight element, and y itself, 4 * n_embd
 * bytes, stays in L1). Each tile prefetches (into L2) the rows PF_DIST
 * tiles ahead at the offset it is reading, the caller's look-ahead rows
 * included: the rows of a sparse pass are scattered, so the hardware
 * prefetcher has no stream to follow at a row's start, and a row (2-8 KiB)
 * is too short for it to ramp up within.
 *
 * Block scales (F16) are copied 16 blocks at a time with scalar loads and
 * stores and converted by one vcvtph2ps: per block and row that is no
 * vector port work, which is what these kernels are bound by.
 *
 * Quantized dots take four blocks of a row at a time and one transposing
 * add across the tile's rows (q_dot_tile), so the float conversion and
 * multiply-add are per 16 row-blocks, not per row-block. int8 products are
 * vpdpbusd (VNNI) or vpmaddubsw + vpmaddwd, with the weights on the
 * unsigned side: Q4_0 nibbles as they are, Q8_0 xor 0x80 under VNNI (zero
 * points paid back through the activation sums of struct hyb_sparse_xquad)
 * or by the sign trick without.
 *
 * Axpys dequantize 16 weights per 512-bit vector: one widening load
 * (vpmovzxbd) gives 16 bytes as 16 lanes, and for Q4_0 the low and high
 * nibbles of those lanes are elements 0-15 and 16-31 of the block; a
 * vpermps on a 16-entry table turns a nibble into its float q - 8 in one
 * instruction (no mask, no conversion, no offset). That is 6 vector uops
 * per row and block (widen, shift, 2 lookups, 2 FMAs) on the two 512-bit
 * ports; a float y += h * w cannot do with fewer, and it is the reason a
 * Q4_0 axpy row costs about twice a dense int8 GEMV row when both are
 * compute-bound (see tests/bench/bench_sparse.c).
 */
#include <immintrin.h>
#include <string.h>

#include "blocks.h"
#include "sparse_ffn_generic.h"
#include "sparse_ffn_kernels.h"

#ifndef HYB_SPARSE_VNNI
#error "define HYB_SPARSE_VNNI before including sparse_ffn_avx512_body.h"
#endif

#define ALWAYS_INLINE static inline __attribute__((always_inline))
#define TR 4 /* rows per tile */
#define Q4_BYTES sizeof(struct hyb_block_q4_0)
#define Q8_BYTES sizeof(struct hyb_block_q8_0)
#ifndef PF_DIST
#define PF_DIST 2 /* tiles ahead that the software prefetch reads */
#endif
#ifndef PF_HINT
#define PF_HINT _MM_HINT_T1 /* into L2: two tiles of F16 rows would not fit in L1 */
#endif

static inline int imin(int a, int b)
{
	return a < b ? a : b;
}

static inline float f16_at(const uint8_t *p)
{
	uint16_t h;

	memcpy(&h, p, 2);
	return _cvtsh_ss(h);
}

static inline float hsum8(__m256 v)
{
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));

	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	s = _mm_add_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

static inline __mmask16 tail_mask(int64_t n)
{
	if (n <= 0)
		return 0;
	return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1);
}

/* Tile i of n rows: its TR row pointers (a short tile repeats its last row) and the next tile's. */
static inline int tile_rows(const void *const *rows, int n, int n_all, int i, const uint8_t **w,
			    const uint8_t **nx)
{
	const int nr = imin(TR, n - i);

	for (int r = 0; r < TR; r++) {
		w[r] = rows[i + imin(r, nr - 1)];
		nx[r] = rows[imin(i + PF_DIST * TR + r, n_all - 1)];
	}
	return nr;
}

/* ---- Q8_0 / Q4_0 ---------------------------------------------------------- */

#define SB 16 /* blocks per slice: one vector of block scales per row */

static inline uint16_t ld16(const uint8_t *p)
{
	uint16_t v;

	memcpy(&v, p, 2);
	return v;
}

/*
 * The F16 scales of blocks b0 .. b0+nbs-1 of each row, zero-padded to SB,
 * copied with plain 2-byte loads and stores: no vector port work (those
 * ports are what the kernels are bound by), no gather. The copy for slice
 * s+1 is made while slice s runs, so that the vector load of the copy does
 * not wait for the stores to commit (store forwarding cannot merge them).
 */
ALWAYS_INLINE void copy_scales(const int R, const uint8_t *const *w, size_t bsz, int64_t b0,
			       int64_t nb, uint16_t (*dh)[SB])
{
	for (int r = 0; r < R; r++)
		for (int j = 0; j < SB; j++)
			dh[r][j] = b0 + j < nb ? ld16(w[r] + (b0 + j) * bsz) : 0;
}

ALWAYS_INLINE __m512 scales_f(const uint16_t *dh, __m512 v)
{
	return _mm512_mul_ps(_mm512_cvtph_ps(_mm256_load_si256((const __m256i *)dh)), v);
}

/*
 * Quantized dots four blocks at a time (struct hyb_sparse_xquad): a row's
 * four blocks in one (Q4_0) or two (Q8_0) 512-bit vectors, int8 dots into
 * 16 lanes (four per block), then one transposing add across the tile's
 * four rows leaves lane 4j + r = block j of row r, so that the float work
 * (a conversion and a multiply-add) is one instruction each per 16
 * row-blocks instead of per row-block. Always four rows (a short tile
 * repeats its last row; the extra sums are dropped).
 */
ALWAYS_INLINE void copy_scales_t(const int q4, const uint8_t *const *w, int64_t b0, int64_t nb,
				 uint16_t (*dh)[TR])
{
	const size_t bsz = q4 ? Q4_BYTES : Q8_BYTES;

	for (int j = 0; j < SB; j++)
		for (int r = 0; r < TR; r++)
			dh[j][r] = b0 + j < nb ? ld16(w[r] + (b0 + j) * bsz) : 0;
}

/* the int8 dot of four blocks of row p, four lanes per block in block order */
ALWAYS_INLINE __m512i quad_sums(const int q4, const uint8_t *p,
				const struct hyb_sparse_xquad *xq)
{
	const __m512i xlo = _mm512_load_si512((const void *)xq->lo);
	const __m512i xhi = _mm512_load_si512((const void *)xq->hi);

	if (q4) {
		const __m512i m4 = _mm512_set1_epi8(0x0F);
		__m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(p + 2)));

		v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p + 20)), 1);
		v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p + 38)), 2);
		v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p + 56)), 3);
		const __m512i lo = _mm512_and_si512(v, m4);
		const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
		const __m512i init = _mm512_load_si512((const void *)xq->init);
#if HYB_SPARSE_VNNI
		return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(init, lo, xlo), hi, xhi);
#else
		const __m512i p16 = _mm512_add_epi16(_mm512_maddubs_epi16(lo, xlo),
						     _mm512_maddubs_epi16(hi, xhi));

		return _mm512_add_epi32(init, _mm512_madd_epi16(p16, _mm512_set1_epi16(1)));
#endif
	}
	/* blocks 0 and 1 in a, 2 and 3 in b: eight lanes per block */
	const __m512i a = _mm512_inserti64x4(
		_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(p + 2))),
		_mm256_loadu_si256((const __m256i *)(p + 2 + Q8_BYTES)), 1);
	const __m512i b = _mm512_inserti64x4(
		_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(p + 2 + 2 * Q8_BYTES))),
		_mm256_loadu_si256((const __m256i *)(p + 2 + 3 * Q8_BYTES)), 1);
	__m512i sa, sb;
#if HYB_SPARSE_VNNI
	const __m512i flip = _mm512_set1_epi8((char)0x80);

	sa = _mm512_dpbusd_epi32(_mm512_load_si512((const void *)xq->init),
				 _mm512_xor_si512(a, flip), xlo);
	sb = _mm512_dpbusd_epi32(_mm512_load_si512((const void *)xq->init2),
				 _mm512_xor_si512(b, flip), xhi);
#else
	/* the sign trick: |w| times x with w's sign */
	const __m512i ones = _mm512_set1_epi16(1), zero = _mm512_setzero_si512();

	sa = _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_abs_epi8(a),
		_mm512_mask_sub_epi8(xlo, _mm512_movepi8_mask(a), zero, xlo)), ones);
	sb = _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_abs_epi8(b),
		_mm512_mask_sub_epi8(xhi, _mm512_movepi8_mask(b), zero, xhi)), ones);
#endif
	/* halves of each block's 256 bits added: 128-bit lane j = block j */
	return _mm512_add_epi32(_mm512_shuffle_i32x4(sa, sb, 0x88),
				_mm512_shuffle_i32x4(sa, sb, 0xDD));
}

/* one block of R rows, the plain way (blocks after the last whole quad) */
ALWAYS_INLINE void q_dot_block(const int q4, const int R, int64_t b, const uint8_t *const *w,
			       const struct hyb_sparse_xblk *xb, __m256 *acc)
{
	const size_t bsz = q4 ? Q4_BYTES : Q8_BYTES;
	const __m256i xq = _mm256_loadu_si256((const __m256i *)xb->q);
	const __m256i corr = _mm256_loadu_si256((const __m256i *)xb->corr);

	for (int r = 0; r < R; r++) {
		const uint8_t *p = w[r] + b * bsz;
		__m256i d;

		if (q4) {
			/* [bytes | bytes] -> [low | high nibbles]: elements 0-31 */
			__m256i t = _mm256_broadcastsi128_si256(
				_mm_loadu_si128((const __m128i *)(p + 2)));

			t = _mm256_mask_srli_epi16(t, 0xFF00, t, 4);
			t = _mm256_and_si256(t, _mm256_set1_epi8(0x0F));
#if HYB_SPARSE_VNNI
			d = _mm256_dpbusd_epi32(corr, t, xq);
#else
			d = _mm256_add_epi32(corr, _mm256_madd_epi16(_mm256_maddubs_epi16(t, xq),
								     _mm256_set1_epi16(1)));
#endif
		} else {
			const __m256i t = _mm256_loadu_si256((const __m256i *)(p + 2));
#if HYB_SPARSE_VNNI
			const __m256i u = _mm256_xor_si256(t, _mm256_set1_epi8((char)0x80));

			d = _mm256_dpbusd_epi32(corr, u, xq);
#else
			(void)corr;
			d = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(t, t),
								   _mm256_sign_epi8(xq, t)),
					      _mm256_set1_epi16(1));
#endif
		}
		acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_set1_ps(f16_at(p) * xb->d),
					 acc[r]);
	}
}

ALWAYS_INLINE void q_dot_tile(const int q4, const int R, int64_t nb, const uint8_t *const *w,
			      const uint8_t *const *nx, const struct hyb_sparse_x *x, float *out)
{
	const size_t bsz = q4 ? Q4_BYTES : Q8_BYTES;
	const int64_t nbq = nb & ~(int64_t)3; /* blocks in whole quads */
	uint16_t dh[2][SB][TR] __attribute__((aligned(64)));
	__m512 acc = _mm512_setzero_ps();
	__m256 tacc[TR];

	if (nbq)
		copy_scales_t(q4, w, 0, nbq, dh[0]);
	for (int64_t b0 = 0, s = 0; b0 < nbq; b0 += SB, s ^= 1) {
		const int nqs = (int)((nbq - b0 < SB ? nbq - b0 : SB) / 4);

		if (b0 + SB < nbq)
			copy_scales_t(q4, w, b0 + SB, nbq, dh[s ^ 1]);
		for (int qq = 0; qq < nqs; qq++) {
			const int64_t q = b0 / 4 + qq, off = q * 4 * (int64_t)bsz;
			const struct hyb_sparse_xquad *xq = &x->quad[q];
			__m512i sr[TR];

			/* one prefetch per row per 64 bytes of the quad */
			for (int r = 0; r < TR; r++)
				for (int l = 0; l < (q4 ? 2 : 3); l++)
					_mm_prefetch((const char *)nx[r] + off + 64 * l, PF_HINT);
			if (!q4)
				for (int r = 0; r < TR; r++)
					_mm_prefetch((const char *)nx[r] + off + 128, PF_HINT);
#pragma GCC unroll 4
			for (int r = 0; r < TR; r++)
				sr[r] = quad_sums(q4, w[r] + off, xq);
			/* lane 4j + r: the sum of the four lanes of block j of row r */
			const __m512i ab = _mm512_add_epi32(_mm512_unpacklo_epi32(sr[0], sr[1]),
							    _mm512_unpackhi_epi32(sr[0], sr[1]));
			const __m512i cd = _mm512_add_epi32(_mm512_unpacklo_epi32(sr[2], sr[3]),
							    _mm512_unpackhi_epi32(sr[2], sr[3]));
			const __m512 f = _mm512_cvtepi32_ps(_mm512_add_epi32(
				_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd)));
			const __m512 sc = _mm512_mul_ps(
				_mm512_cvtph_ps(_mm256_load_si256((const __m256i *)dh[s][4 * qq])),
				_mm512_load_ps(xq->d));

			acc = _mm512_fmadd_ps(f, sc, acc);
		}
	}
	for (int r = 0; r < R; r++)
		tacc[r] = _mm256_setzero_ps();
	for (int64_t b = nbq; b < nb; b++)
		q_dot_block(q4, R, b, w, &x->blk[b], tacc);
	/* lanes r, 4 + r, 8 + r, 12 + r are row r's */
	const __m256 h8 = _mm256_add_ps(_mm512_castps512_ps256(acc),
					_mm512_extractf32x8_ps(acc, 1));
	float rs[4];

	_mm_storeu_ps(rs, _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps(h8, 1)));
	for (int r = 0; r < R; r++)
		out[r] = rs[r] + hsum8(tacc[r]);
}

ALWAYS_INLINE void q_axpy_slice(const int q4, const int R, int64_t b0, int nbs,
				const uint8_t *const *w, const uint8_t *const *nx, const float *h,
				uint16_t (*dh)[SB], float *y)
{
	const size_t bsz = q4 ? sizeof(struct hyb_block_q4_0) : sizeof(struct hyb_block_q8_0);
	/* Q4_0 codes to weights / d: a 16-entry table, indexed by vpermps with the nibble */
	const __m512 lut = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
	float sc[TR][SB] __attribute__((aligned(64)));

	/* h * d per row and block */
	for (int r = 0; r < R; r++)
		_mm512_store_ps(sc[r], scales_f(dh[r], _mm512_set1_ps(h[r])));
	for (int j = 0; j < nbs; j++) {
		const int64_t b = b0 + j;
		__m512 y0 = _mm512_loadu_ps(y + 32 * b), y1 = _mm512_loadu_ps(y + 32 * b + 16);

		if (!q4 || b % 3 == 0)
			for (int r = 0; r < R; r++)
				_mm_prefetch((const char *)nx[r] + b * bsz, PF_HINT);
#pragma GCC unroll 4
		for (int r = 0; r < R; r++) {
			const uint8_t *p = w[r] + b * bsz;
			const __m512 sv = _mm512_set1_ps(sc[r][j]);

			if (q4) {
				/* lane i holds byte i: low nibble element i, high i + 16 */
				const __m512i v = _mm512_cvtepu8_epi32(
					_mm_loadu_si128((const __m128i *)(p + 2)));

				y0 = _mm512_fmadd_ps(sv, _mm512_permutexvar_ps(v, lut), y0);
				const __m512i vh = _mm512_srli_epi32(v, 4);

				y1 = _mm512_fmadd_ps(sv, _mm512_permutexvar_ps(vh, lut), y1);
			} else {
				const __m512i v0 = _mm512_cvtepi8_epi32(
					_mm_loadu_si128((const __m128i *)(p + 2)));
				const __m512i v1 = _mm512_cvtepi8_epi32(
					_mm_loadu_si128((const __m128i *)(p + 18)));

				y0 = _mm512_fmadd_ps(sv, _mm512_cvtepi32_ps(v0), y0);
				y1 = _mm512_fmadd_ps(sv, _mm512_cvtepi32_ps(v1), y1);
			}
		}
		_mm512_storeu_ps(y + 32 * b, y0);
		_mm512_storeu_ps(y + 32 * b + 16, y1);
	}
}

ALWAYS_INLINE void q_axpy_tile(const int q4, const int R, int64_t nb, const uint8_t *const *w,
			       const uint8_t *const *nx, const float *h, float *y)
{
	const size_t bsz = q4 ? sizeof(struct hyb_block_q4_0) : sizeof(struct hyb_block_q8_0);
	uint16_t dh[2][TR][SB] __attribute__((aligned(32)));

	copy_scales(R, w, bsz, 0, nb, dh[0]);
	for (int64_t b0 = 0, s = 0; b0 < nb; b0 += SB, s ^= 1) {
		if (b0 + SB < nb)
			copy_scales(R, w, bsz, b0 + SB, nb, dh[s ^ 1]);
		q_axpy_slice(q4, R, b0, (int)(nb - b0 < SB ? nb - b0 : SB), w, nx, h, dh[s], y);
	}
}

/* ---- F16 / F32 ------------------------------------------------------------ */

/* 16 weights at element i as floats; a masked load only where the row ends (it costs a uop) */
ALWAYS_INLINE __m512 load_f(const int f16, const int full, const void *p, int64_t i,
			    __mmask16 m)
{
	const uint16_t *h = (const uint16_t *)p + i;

	if (f16)
		return _mm512_cvtph_ps(full ? _mm256_loadu_si256((const __m256i *)h)
					    : _mm256_maskz_loadu_epi16(m, h));
	return full ? _mm512_loadu_ps((const float *)p + i)
		    : _mm512_maskz_loadu_ps(m, (const float *)p + i);
}

/* 32 elements from i (fewer at the end of the row: full == 0) */
ALWAYS_INLINE void f_dot_step(const int f16, const int full, const int R, int64_t k, int64_t i,
			      const uint8_t *const *w, const uint8_t *const *nx, const void *x,
			      __m512 (*acc)[2])
{
	const int esz = f16 ? 2 : 4;
	const __mmask16 m0 = full ? 0xFFFF : tail_mask(k - i);
	const __mmask16 m1 = full ? 0xFFFF : tail_mask(k - i - 16);
	const __m512 x0 = load_f(f16, full, x, i, m0), x1 = load_f(f16, full, x, i + 16, m1);

	for (int r = 0; r < R; r++) {
		_mm_prefetch((const char *)nx[r] + i * esz, PF_HINT);
		if (!f16)
			_mm_prefetch((const char *)nx[r] + i * esz + 64, PF_HINT);
	}
#pragma GCC unroll 4
	for (int r = 0; r < R; r++) {
		acc[r][0] = _mm512_fmadd_ps(load_f(f16, full, w[r], i, m0), x0, acc[r][0]);
		acc[r][1] = _mm512_fmadd_ps(load_f(f16, full, w[r], i + 16, m1), x1, acc[r][1]);
	}
}

ALWAYS_INLINE void f_dot_tile(const int f16, const int R, int64_t k, const uint8_t *const *w,
			      const uint8_t *const *nx, const void *x, float *out)
{
	__m512 acc[TR][2];
	int64_t i = 0;

	/* two accumulators per row: a one-row tile is not bound by the FMA latency */
	for (int r = 0; r < R; r++)
		acc[r][0] = acc[r][1] = _mm512_setzero_ps();
	for (; i + 32 <= k; i += 32)
		f_dot_step(f16, 1, R, k, i, w, nx, x, acc);
	if (i < k)
		f_dot_step(f16, 0, R, k, i, w, nx, x, acc);
	for (int r = 0; r < R; r++)
		out[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]));
}

ALWAYS_INLINE void f_axpy_step(const int f16, const int full, const int R, int64_t k,
			       int64_t i, const uint8_t *const *w, const uint8_t *const *nx,
			       const __m512 *hv, float *y)
{
	const int esz = f16 ? 2 : 4;
	const __mmask16 m0 = full ? 0xFFFF : tail_mask(k - i);
	const __mmask16 m1 = full ? 0xFFFF : tail_mask(k - i - 16);
	__m512 y0 = full ? _mm512_loadu_ps(y + i) : _mm512_maskz_loadu_ps(m0, y + i);
	__m512 y1 = full ? _mm512_loadu_ps(y + i + 16) : _mm512_maskz_loadu_ps(m1, y + i + 16);

	for (int r = 0; r < R; r++) {
		_mm_prefetch((const char *)nx[r] + i * esz, PF_HINT);
		if (!f16)
			_mm_prefetch((const char *)nx[r] + i * esz + 64, PF_HINT);
	}
#pragma GCC unroll 4
	for (int r = 0; r < R; r++) {
		y0 = _mm512_fmadd_ps(hv[r], load_f(f16, full, w[r], i, m0), y0);
		y1 = _mm512_fmadd_ps(hv[r], load_f(f16, full, w[r], i + 16, m1), y1);
	}
	if (full) {
		_mm512_storeu_ps(y + i, y0);
		_mm512_storeu_ps(y + i + 16, y1);
	} else {
		_mm512_mask_storeu_ps(y + i, m0, y0);
		_mm512_mask_storeu_ps(y + i + 16, m1, y1);
	}
}

ALWAYS_INLINE void f_axpy_tile(const int f16, const int R, int64_t k, const uint8_t *const *w,
			       const uint8_t *const *nx, const float *h, float *y)
{
	__m512 hv[TR];
	int64_t i = 0;

	for (int r = 0; r < R; r++)
		hv[r] = _mm512_set1_ps(h[r]);
	for (; i + 32 <= k; i += 32)
		f_axpy_step(f16, 1, R, k, i, w, nx, hv, y);
	if (i < k)
		f_axpy_step(f16, 0, R, k, i, w, nx, hv, y);
}

/* ---- drivers: tiles of TR rows, the last one shorter --------------------- */

enum kind { K_F32, K_F16, K_Q8_0, K_Q4_0 };

ALWAYS_INLINE void dot_tile(const enum kind t, const int R, int64_t k, const uint8_t *const *w,
			    const uint8_t *const *nx, const struct hyb_sparse_x *x, float *out)
{
	if (t == K_F32 || t == K_F16)
		f_dot_tile(t == K_F16, R, k, w, nx, x->q, out);
	else
		q_dot_tile(t == K_Q4_0, R, k / 32, w, nx, x, out);
}

ALWAYS_INLINE void axpy_tile(const enum kind t, const int R, int64_t k, const uint8_t *const *w,
			     const uint8_t *const *nx, const float *h, float *y)
{
	if (t == K_F32 || t == K_F16)
		f_axpy_tile(t == K_F16, R, k, w, nx, h, y);
	else
		q_axpy_tile(t == K_Q4_0, R, k / 32, w, nx, h, y);
}

ALWAYS_INLINE void dot_any(const enum kind t, int64_t k, const void *const *rows, int n,
			   int n_pf, const struct hyb_sparse_x *x, float *out)
{
	for (int i = 0; i < n; i += TR) {
		const uint8_t *w[TR], *nx[TR];

		switch (tile_rows(rows, n, n + n_pf, i, w, nx)) {
		case 1: dot_tile(t, 1, k, w, nx, x, out + i); break;
		case 2: dot_tile(t, 2, k, w, nx, x, out + i); break;
		case 3: dot_tile(t, 3, k, w, nx, x, out + i); break;
		default: dot_tile(t, 4, k, w, nx, x, out + i); break;
		}
	}
}

ALWAYS_INLINE void axpy_any(const enum kind t, int64_t k, const void *const *rows,
			    const float *h, int n, int n_pf, float *y)
{
	for (int i = 0; i < n; i += TR) {
		const uint8_t *w[TR], *nx[TR];

		switch (tile_rows(rows, n, n + n_pf, i, w, nx)) {
		case 1: axpy_tile(t, 1, k, w, nx, h + i, y); break;
		case 2: axpy_tile(t, 2, k, w, nx, h + i, y); break;
		case 3: axpy_tile(t, 3, k, w, nx, h + i, y); break;
		default: axpy_tile(t, 4, k, w, nx, h + i, y); break;
		}
	}
}

#define ENTRY(name, T)                                                                      \
	static void dotp_##name(int64_t k, const void *const *rows, int n, int n_pf,       \
				const struct hyb_sparse_x *x, float *out)                   \
	{                                                                                   \
		dot_any(T, k, rows, n, n_pf, x, out);                                       \
	}                                                                                   \
	static void axpyp_##name(int64_t k, const void *const *rows, const float *h, int n,\
				 int n_pf, float *y)                                        \
	{                                                                                   \
		axpy_any(T, k, rows, h, n, n_pf, y);                                        \
	}                                                                                   \
	static void dot_##name(int64_t k, const void *const *rows, int n,                  \
			       const struct hyb_sparse_x *x, float *out)                    \
	{                                                                                   \
		dot_any(T, k, rows, n, 0, x, out);                                          \
	}                                                                                   \
	static void axpy_##name(int64_t k, const void *const *rows, const float *h, int n, \
				float *y)                                                   \
	{                                                                                   \
		axpy_any(T, k, rows, h, n, 0, y);                                           \
	}
ENTRY(f32, K_F32)
ENTRY(f16, K_F16)
ENTRY(q8_0, K_Q8_0)
ENTRY(q4_0, K_Q4_0)
#undef ENTRY

#if HYB_SPARSE_VNNI
/*
 * Integer axpys (VNNI): per tile of four rows and block, the products
 * a_rb = h_r * d_rb are rounded to int8 on one scale S_b = max_r |a_rb| / 127
 * (as the AVX2 Q4_0 axpy, hyb_sparse_kernels.axpy_rounds), the four rows'
 * weights are interleaved byte by byte so that one vpdpbusd adds
 * sum_r a_r * q_r for 16 outputs, and the float work (a conversion and a
 * multiply-add into y) is per 16 outputs of the tile instead of per row:
 * in cache 1.6x the float axpy's rate for Q8_0 (tests/bench/bench_teal.c).
 * They round, so they are offered beside the float axpys (axpy_i8_pf), not
 * instead of them. The weights are the
 * unsigned side: Q4_0 nibbles as they are, Q8_0 xor 0x80; their zero point
 * (8 or 128) is paid back as -z * S_b * sum_r a_rb into off[b], added once
 * per call.
 *
 * Two blocks go in one 512-bit vector; 128-bit lane j holds elements 0-15
 * (j even) or 16-31 (j odd) of block b + j / 2, and vector v of a pair
 * elements 4v..4v+3 of each lane: y is kept in that order in a local
 * buffer (IX_CHUNK blocks at a time) and put back at the end of the call.
 */
#define IX_CHUNK 512 /* blocks of y the local buffer holds (64 KiB, in L2): rows are read in runs this long */

/* a_rb of blocks b0 .. b0+nbs-1 as four bytes per block (rows 0-3), S_b, off += -z S_b sum_r a_rb */
ALWAYS_INLINE void ix_tile_acts(const int R, const float *h, uint16_t (*dh)[SB], float z,
				int32_t *a4, float *S, float *off)
{
	const __m512 absm = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
	const __m512i lo8 = _mm512_set1_epi32(0xFF);
	__m512 v[TR], m = _mm512_setzero_ps();
	__m512i q[TR];

	for (int r = 0; r < TR; r++) {
		v[r] = r < R ? scales_f(dh[r], _mm512_set1_ps(h[r])) : _mm512_setzero_ps();
		m = _mm512_max_ps(m, _mm512_and_ps(v[r], absm));
	}
	/* 127 / m, 0 where m is 0 (the tile's block adds nothing) */
	const __mmask16 nz = _mm512_cmp_ps_mask(m, _mm512_setzero_ps(), _CMP_GT_OQ);
	const __m512 inv = _mm512_maskz_div_ps(nz, _mm512_set1_ps(127), m);
	const __m512 sc = _mm512_mul_ps(m, _mm512_set1_ps(1.0f / 127));

	for (int r = 0; r < TR; r++)
		q[r] = _mm512_cvtps_epi32(_mm512_mul_ps(v[r], inv));
	const __m512i sum = _mm512_add_epi32(_mm512_add_epi32(q[0], q[1]),
					     _mm512_add_epi32(q[2], q[3]));
	const __m512i b4 = _mm512_or_si512(
		_mm512_or_si512(_mm512_and_si512(q[0], lo8),
				_mm512_slli_epi32(_mm512_and_si512(q[1], lo8), 8)),
		_mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(q[2], lo8), 16),
				_mm512_slli_epi32(q[3], 24)));

	_mm512_store_si512((void *)a4, b4);
	_mm512_store_ps(S, sc);
	_mm512_storeu_ps(off, _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(sum), sc),
					      _mm512_set1_ps(-z), _mm512_loadu_ps(off)));
}

/* Blocks b, b + 1 (one: b only) of the tile's four rows into yp (the pair's 64 outputs, pair order). */
ALWAYS_INLINE void ix_axpy_pair(const int q4, const int one, const uint8_t *const *w,
				const uint8_t *const *nx, int64_t b, const int32_t *a4,
				const float *S, float *yp)
{
	const size_t bsz = q4 ? Q4_BYTES : Q8_BYTES;
	const __m512i lanes = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
	const __m512i m4 = _mm512_set1_epi8(0x0F), flip = _mm512_set1_epi8((char)0x80);
	/* Q4_0: lanes 1 and 3 take the high nibbles (elements 16-31) */
	const __m512i shift = _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4);
	__m512i L[TR], V[4];

	for (int r = 0; r < TR; r++) {
		const uint8_t *p = w[r] + b * bsz + 2;

		if (q4) {
			const __m128i x0 = _mm_loadu_si128((const __m128i *)p);
			const __m128i x1 = one ? _mm_setzero_si128()
					       : _mm_loadu_si128((const __m128i *)(p + bsz));
			const __m512i d = _mm512_inserti64x4(
				_mm512_castsi256_si512(_mm256_broadcastsi128_si256(x0)),
				_mm256_broadcastsi128_si256(x1), 1);

			L[r] = _mm512_and_si512(_mm512_srlv_epi64(d, shift), m4);
		} else {
			const __m256i y0 = _mm256_loadu_si256((const __m256i *)p);
			const __m256i y1 = one ? _mm256_set1_epi8((char)0x80)
					       : _mm256_loadu_si256((const __m256i *)(p + bsz));

			L[r] = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(y0), y1, 1),
						flip);
		}
		_mm_prefetch((const char *)nx[r] + b * bsz, PF_HINT);
		if (!q4)
			_mm_prefetch((const char *)nx[r] + b * bsz + 63, PF_HINT);
	}
	const __m512i l01 = _mm512_unpacklo_epi8(L[0], L[1]), h01 = _mm512_unpackhi_epi8(L[0], L[1]);
	const __m512i l23 = _mm512_unpacklo_epi8(L[2], L[3]), h23 = _mm512_unpackhi_epi8(L[2], L[3]);

	V[0] = _mm512_unpacklo_epi16(l01, l23);
	V[1] = _mm512_unpackhi_epi16(l01, l23);
	V[2] = _mm512_unpacklo_epi16(h01, h23);
	V[3] = _mm512_unpackhi_epi16(h01, h23);
	const __m512i av = _mm512_permutexvar_epi32(
		lanes, _mm512_castsi128_si512(_mm_loadl_epi64((const __m128i *)a4)));
	const __m512 sv = _mm512_permutexvar_ps(
		lanes, _mm512_castps128_ps512(_mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)S))));

#pragma GCC unroll 4
	for (int v = 0; v < 4; v++) {
		const __m512i d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), V[v], av);

		_mm512_store_ps(yp + 16 * v, _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), sv,
							     _mm512_load_ps(yp + 16 * v)));
	}
}

/*
 * A pair's 64 outputs as 16 chunks of four, chunk 4j + v of the pair (j =
 * 128-bit lane of the loads, v = vector) to chunk 4v + j: a 4 x 4 transpose
 * of 128-bit chunks, its own inverse.
 */
ALWAYS_INLINE void ix_transpose(__m512 *Y)
{
	const __m512 t0 = _mm512_shuffle_f32x4(Y[0], Y[1], 0x44);
	const __m512 t1 = _mm512_shuffle_f32x4(Y[0], Y[1], 0xEE);
	const __m512 t2 = _mm512_shuffle_f32x4(Y[2], Y[3], 0x44);
	const __m512 t3 = _mm512_shuffle_f32x4(Y[2], Y[3], 0xEE);

	Y[0] = _mm512_shuffle_f32x4(t0, t2, 0x88);
	Y[1] = _mm512_shuffle_f32x4(t0, t2, 0xDD);
	Y[2] = _mm512_shuffle_f32x4(t1, t3, 0x88);
	Y[3] = _mm512_shuffle_f32x4(t1, t3, 0xDD);
}

/* y[32 c0 ..) (nbc blocks) into pair order in yp, or back (adding off[b] to block b). */
static void ix_order(float *y, float *yp, int nbc, const float *off, int back)
{
	for (int c = 0; c < nbc; c += 2) {
		const int two = c + 1 < nbc;
		float *pp = yp + 32 * c;
		__m512 Y[4];

		if (!back) {
			Y[0] = _mm512_loadu_ps(y + 32 * c);
			Y[1] = _mm512_loadu_ps(y + 32 * c + 16);
			Y[2] = two ? _mm512_loadu_ps(y + 32 * c + 32) : _mm512_setzero_ps();
			Y[3] = two ? _mm512_loadu_ps(y + 32 * c + 48) : _mm512_setzero_ps();
			ix_transpose(Y);
			for (int v = 0; v < 4; v++)
				_mm512_store_ps(pp + 16 * v, Y[v]);
			continue;
		}
		for (int v = 0; v < 4; v++)
			Y[v] = _mm512_load_ps(pp + 16 * v);
		ix_transpose(Y);
		_mm512_storeu_ps(y + 32 * c, _mm512_add_ps(Y[0], _mm512_set1_ps(off[c])));
		_mm512_storeu_ps(y + 32 * c + 16, _mm512_add_ps(Y[1], _mm512_set1_ps(off[c])));
		if (two) {
			_mm512_storeu_ps(y + 32 * c + 32, _mm512_add_ps(Y[2], _mm512_set1_ps(off[c + 1])));
			_mm512_storeu_ps(y + 32 * c + 48, _mm512_add_ps(Y[3], _mm512_set1_ps(off[c + 1])));
		}
	}
}

ALWAYS_INLINE void ix_axpy_tile(const int q4, const int R, int64_t c0, int nbc,
				const uint8_t *const *w, const uint8_t *const *nx, const float *h,
				float *yp, float *off)
{
	const size_t bsz = q4 ? Q4_BYTES : Q8_BYTES;
	const float z = q4 ? 8.0f : 128.0f;
	uint16_t dh[TR][SB] __attribute__((aligned(32)));
	int32_t a4[SB] __attribute__((aligned(64)));
	float S[SB] __attribute__((aligned(64)));

	for (int j0 = 0; j0 < nbc; j0 += SB) {
		const int nbs = nbc - j0 < SB ? nbc - j0 : SB;

		copy_scales(TR, w, bsz, c0 + j0, c0 + j0 + nbs, dh);
		ix_tile_acts(R, h, dh, z, a4, S, off + j0);
		for (int j = 0; j < nbs; j += 2)
			ix_axpy_pair(q4, j + 1 == nbs, w, nx, c0 + j0 + j, a4 + j, S + j,
				     yp + 32 * (j0 + j));
	}
}

ALWAYS_INLINE void ix_axpy_rows(const int q4, int64_t k, const void *const *rows, const float *h,
				int n, int n_pf, float *y)
{
	const int64_t nb = k / 32;
	float yp[(IX_CHUNK + 1) * 32] __attribute__((aligned(64)));
	float off[IX_CHUNK + SB];

	for (int64_t c0 = 0; c0 < nb; c0 += IX_CHUNK) {
		const int nbc = (int)(nb - c0 < IX_CHUNK ? nb - c0 : IX_CHUNK);

		ix_order(y + 32 * c0, yp, nbc, NULL, 0);
		memset(off, 0, sizeof(off));
		for (int i = 0; i < n; i += TR) {
			const uint8_t *w[TR], *nx[TR];

			switch (tile_rows(rows, n, n + n_pf, i, w, nx)) {
			case 1: ix_axpy_tile(q4, 1, c0, nbc, w, nx, h + i, yp, off); break;
			case 2: ix_axpy_tile(q4, 2, c0, nbc, w, nx, h + i, yp, off); break;
			case 3: ix_axpy_tile(q4, 3, c0, nbc, w, nx, h + i, yp, off); break;
			default: ix_axpy_tile(q4, 4, c0, nbc, w, nx, h + i, yp, off); break;
			}
		}
		ix_order(y + 32 * c0, yp, nbc, off, 1);
	}
}

static void ix_axpyp_q8_0(int64_t k, const void *const *rows, const float *h, int n, int n_pf,
			  float *y)
{
	ix_axpy_rows(0, k, rows, h, n, n_pf, y);
}

static void ix_axpyp_q4_0(int64_t k, const void *const *rows, const float *h, int n, int n_pf,
			  float *y)
{
	ix_axpy_rows(1, k, rows, h, n, n_pf, y);
}

#endif

static void fill_sparse_avx512(struct hyb_sparse_kernels *k)
{
	k->dot[HYB_TYPE_F32] = dot_f32;
	k->dot[HYB_TYPE_F16] = dot_f16;
	k->dot[HYB_TYPE_Q8_0] = dot_q8_0;
	k->dot[HYB_TYPE_Q4_0] = dot_q4_0;
	k->axpy[HYB_TYPE_F32] = axpy_f32;
	k->axpy[HYB_TYPE_F16] = axpy_f16;
	k->axpy[HYB_TYPE_Q8_0] = axpy_q8_0;
	k->axpy[HYB_TYPE_Q4_0] = axpy_q4_0;
	k->dot_pf[HYB_TYPE_F32] = dotp_f32;
	k->dot_pf[HYB_TYPE_F16] = dotp_f16;
	k->dot_pf[HYB_TYPE_Q8_0] = dotp_q8_0;
	k->dot_pf[HYB_TYPE_Q4_0] = dotp_q4_0;
	k->axpy_pf[HYB_TYPE_F32] = axpyp_f32;
	k->axpy_pf[HYB_TYPE_F16] = axpyp_f16;
	k->axpy_pf[HYB_TYPE_Q8_0] = axpyp_q8_0;
	k->axpy_pf[HYB_TYPE_Q4_0] = axpyp_q4_0;
	/* the table below (AVX2) rounds in its Q4_0 axpy; these float axpys do not */
	memset(k->axpy_rounds, 0, sizeof(k->axpy_rounds));
#if HYB_SPARSE_VNNI
	k->axpy_i8_pf[HYB_TYPE_Q8_0] = ix_axpyp_q8_0;
	k->axpy_i8_pf[HYB_TYPE_Q4_0] = ix_axpyp_q4_0;
#endif
	sgen_fill(k); /* the other types, their float loops compiled for AVX-512 */
}
