// SPDX-License-Identifier: MIT
/*
 * AVX2 sparse FFN kernels (AVX2 + FMA + F16C). Same shape as the AVX-512
 * body (sparse_ffn_avx512_body.h, which explains the tiles and the
 * prefetch) on 256-bit vectors: dots use vpmaddubsw + vpmaddwd with Q4_0
 * nibbles unsigned (zero point paid back through the activation sums) and
 * Q8_0 by the sign trick; the Q8_0 axpy widens 8 bytes to 8 lanes per
 * vector, the Q4_0 axpy works in int8 four rows at a time (q4_axpy_rows(),
 * which rounds as axpy_rounds says). Float rows whose length is not a
 * multiple of 16 finish in scalar code.
 */
#include <immintrin.h>
#include <string.h>

#include "blocks.h"
#include "sparse_ffn_generic.h"
#include "sparse_ffn_kernels.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))
#define TR 4
#define Q4_BYTES sizeof(struct hyb_block_q4_0)
#define PF_DIST 2 /* tiles ahead that the software prefetch reads */
#define PF_HINT _MM_HINT_T1

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

#define SB 16 /* blocks per slice */

static inline uint16_t ld16(const uint8_t *p)
{
	uint16_t v;

	memcpy(&v, p, 2);
	return v;
}

/*
 * The F16 scales of blocks b0 .. b0+nbs-1 of row p (the rest 0) times v,
 * into out[0..16): four to a 64-bit register, then two conversions (see
 * block_scales() in sparse_ffn_avx512_body.h).
 */
ALWAYS_INLINE void block_scales(const uint8_t *p, size_t bsz, int64_t b0, int nbs,
				__m256 v0, __m256 v1, float *out)
{
	uint64_t q[4];

	for (int i = 0; i < 4; i++) {
		uint64_t t = 0;

		for (int l = 0; l < 4; l++) {
			const int j = 4 * i + l;

			if (nbs == SB || j < nbs)
				t |= (uint64_t)ld16(p + (b0 + j) * bsz) << (16 * l);
		}
		q[i] = t;
	}
	_mm256_store_ps(out, _mm256_mul_ps(_mm256_cvtph_ps(_mm_set_epi64x((long long)q[1],
									   (long long)q[0])),
					   v0));
	_mm256_store_ps(out + 8, _mm256_mul_ps(_mm256_cvtph_ps(_mm_set_epi64x((long long)q[3],
									       (long long)q[2])),
					       v1));
}

ALWAYS_INLINE void q_dot_slice(const int q4, const int R, int64_t b0, int nbs,
			       const uint8_t *const *w, const uint8_t *const *nx,
			       const struct hyb_sparse_x *x, __m256 *acc)
{
	const size_t bsz = q4 ? sizeof(struct hyb_block_q4_0) : sizeof(struct hyb_block_q8_0);
	const struct hyb_sparse_xblk *xb = x->blk;
	const __m256i ones = _mm256_set1_epi16(1);
	float sc[TR][SB] __attribute__((aligned(32)));

	/* the product of the two block scales, per row and block */
	for (int r = 0; r < R; r++)
		block_scales(w[r], bsz, b0, nbs, _mm256_loadu_ps(x->xd + b0),
			     _mm256_loadu_ps(x->xd + b0 + 8), sc[r]);
	for (int j = 0; j < nbs; j++) {
		const int64_t b = b0 + j;
		const __m256i xq = _mm256_loadu_si256((const __m256i *)xb[b].q);
		const __m256i corr = _mm256_loadu_si256((const __m256i *)xb[b].corr);

		if (!q4 || b % 3 == 0)
			for (int r = 0; r < R; r++)
				_mm_prefetch((const char *)nx[r] + b * bsz, PF_HINT);
#pragma GCC unroll 4
		for (int r = 0; r < R; r++) {
			const uint8_t *p = w[r] + b * bsz;
			__m256i d;

			if (q4) {
				/* the 16 bytes in both halves, the high one >> 4: one
				 * shift fewer than an insert of a shifted copy (the dot
				 * went from 0.91x to 1.00x the dense GEMV on Zen 3, rows
				 * in L2) */
				const __m256i t = _mm256_and_si256(_mm256_srlv_epi32(
					_mm256_broadcastsi128_si256(_mm_loadu_si128(
						(const __m128i *)(p + 2))),
					_mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)),
					_mm256_set1_epi8(0x0F));

				d = _mm256_add_epi32(corr, _mm256_madd_epi16(
					_mm256_maddubs_epi16(t, xq), ones));
			} else {
				const __m256i t = _mm256_loadu_si256((const __m256i *)(p + 2));

				d = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(t, t),
									   _mm256_sign_epi8(xq, t)),
						      ones);
			}
			acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_set1_ps(sc[r][j]),
						 acc[r]);
		}
	}
}

ALWAYS_INLINE void q_dot_tile(const int q4, const int R, int64_t nb, const uint8_t *const *w,
			      const uint8_t *const *nx, const struct hyb_sparse_x *x, float *out)
{
	__m256 acc[TR];
	int64_t b0 = 0;

	for (int r = 0; r < R; r++)
		acc[r] = _mm256_setzero_ps();
	for (; b0 + SB <= nb; b0 += SB)
		q_dot_slice(q4, R, b0, SB, w, nx, x, acc);
	if (b0 < nb)
		q_dot_slice(q4, R, b0, (int)(nb - b0), w, nx, x, acc);
	for (int r = 0; r < R; r++)
		out[r] = hsum8(acc[r]);
}

/* 8 signed bytes at p widened to 8 int32 lanes (one vpmovsxbd from memory) */
static inline __m256i widen8(const uint8_t *p)
{
	return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
}

/* the Q8_0 axpy in float (Q4_0's is q4_axpy_rows() below) */
ALWAYS_INLINE void q8_axpy_slice(const int R, int64_t b0, int nbs, const uint8_t *const *w,
				 const uint8_t *const *nx, const float *h, float *y)
{
	const size_t bsz = sizeof(struct hyb_block_q8_0);
	float sc[TR][SB] __attribute__((aligned(32)));

	/* h * d per row and block */
	for (int r = 0; r < R; r++)
		block_scales(w[r], bsz, b0, nbs, _mm256_set1_ps(h[r]), _mm256_set1_ps(h[r]), sc[r]);
	for (int j = 0; j < nbs; j++) {
		const int64_t b = b0 + j;
		float *yb = y + 32 * b;
		__m256 y0 = _mm256_loadu_ps(yb), y1 = _mm256_loadu_ps(yb + 8);
		__m256 y2 = _mm256_loadu_ps(yb + 16), y3 = _mm256_loadu_ps(yb + 24);

		for (int r = 0; r < R; r++)
			_mm_prefetch((const char *)nx[r] + b * bsz, PF_HINT);
#pragma GCC unroll 4
		for (int r = 0; r < R; r++) {
			const uint8_t *p = w[r] + b * bsz;
			const __m256 sv = _mm256_set1_ps(sc[r][j]);

			y0 = _mm256_fmadd_ps(sv, _mm256_cvtepi32_ps(widen8(p + 2)), y0);
			y1 = _mm256_fmadd_ps(sv, _mm256_cvtepi32_ps(widen8(p + 10)), y1);
			y2 = _mm256_fmadd_ps(sv, _mm256_cvtepi32_ps(widen8(p + 18)), y2);
			y3 = _mm256_fmadd_ps(sv, _mm256_cvtepi32_ps(widen8(p + 26)), y3);
		}
		_mm256_storeu_ps(yb, y0);
		_mm256_storeu_ps(yb + 8, y1);
		_mm256_storeu_ps(yb + 16, y2);
		_mm256_storeu_ps(yb + 24, y3);
	}
}

ALWAYS_INLINE void q8_axpy_tile(const int R, int64_t nb, const uint8_t *const *w,
				const uint8_t *const *nx, const float *h, float *y)
{
	int64_t b0 = 0;

	for (; b0 + SB <= nb; b0 += SB)
		q8_axpy_slice(R, b0, SB, w, nx, h, y);
	if (b0 < nb)
		q8_axpy_slice(R, b0, (int)(nb - b0), w, nx, h, y);
}

/* ---- Q4_0 axpy in int8 ------------------------------------------------------ */

/*
 * The Q4_0 axpy, y += sum_r h_r * d_rb * (q_r - 8) over the blocks b, in
 * integer arithmetic four rows at a time: a float axpy pays a conversion
 * and a multiply-add per weight (measured on Zen 3 with rows in L2: 9.5
 * GB/s against the dot's 13.6, tests/bench/bench_sparse.c). Per tile of four
 * rows and per block, the four products a_rb = h_r * d_rb are rounded to
 * int8 on one scale S_b = max_r |a_rb| / 127; the nibbles of the four rows
 * are interleaved byte by byte, so that one vpmaddubsw + vpmaddwd gives
 * sum_r a_r * q_r for eight outputs, and the float work (a conversion and
 * a multiply-add into y) is per 8 outputs of the tile, not per row. The
 * zero point (-8 * S_b * sum_r a_rb) goes into off[b] and is added once per
 * call.
 *
 * Rounding: each a_rb is off by at most S_b / 2, i.e. 1/254 of the largest
 * |h_r * d_rb| of its tile, which is finer than the dense down GEMV's Q8_0
 * conversion of h (1/254 of the largest |h| of 32 neurons, hyb_vec_dot_type());
 * hyb_sparse_kernels.axpy_rounds says which levels do this.
 *
 * Two blocks go in one 256-bit vector (block b in the low lane, b + 1 in
 * the high one), which leaves y's outputs in a different order: within a
 * pair of blocks, vector v holds elements 4v..4v+3 of block b and of block
 * b + 1. y is put in that order in a local buffer for the call (AX_CHUNK
 * blocks at a time) and back, with off added, at the end.
 */
#define AX_CHUNK 128 /* blocks of y a local buffer holds (16 KiB) */

/* a_rb for blocks b0 .. b0+nbs-1 of the tile: as 4 bytes per block, S_b, and off += -8 S_b sum a */
ALWAYS_INLINE void q4_tile_acts(const int R, const uint8_t *const *w, const float *h, int64_t b0,
				int nbs, int32_t *a4, float *S, float *off)
{
	float sc[TR][SB] __attribute__((aligned(32)));
	/* bytes r0 r1 r2 r3 of each block: [4 x block 0..3 of row 0 | row 1 ...] -> by block */
	const __m256i tr = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,
					    0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
	const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));

	for (int r = 0; r < TR; r++) {
		if (r < R)
			block_scales(w[r], Q4_BYTES, b0, nbs, _mm256_set1_ps(h[r]),
				     _mm256_set1_ps(h[r]), sc[r]);
		else
			memset(sc[r], 0, sizeof(sc[r]));
	}
	for (int i = 0; i < SB; i += 8) {
		__m256 v[TR], m = _mm256_setzero_ps();
		__m256i q[TR];

		for (int r = 0; r < TR; r++) {
			v[r] = _mm256_load_ps(sc[r] + i);
			m = _mm256_max_ps(m, _mm256_and_ps(v[r], absm));
		}
		const __m256 s = _mm256_mul_ps(m, _mm256_set1_ps(1.0f / 127));
		/* 127 / m, 0 where m is 0 (the whole tile's block adds nothing) */
		const __m256 inv = _mm256_and_ps(_mm256_div_ps(_mm256_set1_ps(127), m),
						 _mm256_cmp_ps(m, _mm256_setzero_ps(), _CMP_GT_OQ));

		for (int r = 0; r < TR; r++)
			q[r] = _mm256_cvtps_epi32(_mm256_mul_ps(v[r], inv));
		const __m256i sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]),
						     _mm256_add_epi32(q[2], q[3]));
		const __m256i b8 = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]),
						      _mm256_packs_epi32(q[2], q[3]));

		_mm256_storeu_si256((__m256i *)(a4 + i), _mm256_shuffle_epi8(b8, tr));
		_mm256_store_ps(S + i, s);
		_mm256_storeu_ps(off + b0 + i, _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(sum), s),
							     _mm256_set1_ps(-8.0f),
							     _mm256_loadu_ps(off + b0 + i)));
	}
}

/*
 * Blocks b and b + 1 of the tile (one == 1: b only, the high lane zero),
 * into yp (y's 64 outputs of the pair in pair order). a4 and S of the pair.
 */
ALWAYS_INLINE void q4_axpy_pair(const int one, const uint8_t *const *w, const uint8_t *const *nx,
				int64_t b, const int32_t *a4, const float *S, float *yp)
{
	const __m256i m4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
	const __m256i lanes = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
	__m256i lo[TR], hi[TR], V[8];

	for (int r = 0; r < TR; r++) {
		const uint8_t *p = w[r] + b * Q4_BYTES + 2;
		const __m128i b0 = _mm_loadu_si128((const __m128i *)p);
		const __m256i L = one ? _mm256_zextsi128_si256(b0)
				      : _mm256_inserti128_si256(_mm256_castsi128_si256(b0),
							_mm_loadu_si128((const __m128i *)(p + Q4_BYTES)), 1);

		_mm_prefetch((const char *)nx[r] + b * Q4_BYTES, PF_HINT);
		lo[r] = _mm256_and_si256(L, m4);
		hi[r] = _mm256_and_si256(_mm256_srli_epi16(L, 4), m4);
	}
	/* bytes of rows 0-3 interleaved: lane j of V[v] = elements 4v..4v+3 of block b + j */
	for (int s = 0; s < 2; s++) {
		const __m256i *X = s ? hi : lo;
		const __m256i l01 = _mm256_unpacklo_epi8(X[0], X[1]), h01 = _mm256_unpackhi_epi8(X[0], X[1]);
		const __m256i l23 = _mm256_unpacklo_epi8(X[2], X[3]), h23 = _mm256_unpackhi_epi8(X[2], X[3]);

		V[4 * s + 0] = _mm256_unpacklo_epi16(l01, l23);
		V[4 * s + 1] = _mm256_unpackhi_epi16(l01, l23);
		V[4 * s + 2] = _mm256_unpacklo_epi16(h01, h23);
		V[4 * s + 3] = _mm256_unpackhi_epi16(h01, h23);
	}
	const __m256i av = _mm256_permutevar8x32_epi32(
		_mm256_castsi128_si256(_mm_loadl_epi64((const __m128i *)a4)), lanes);
	const __m256 sv = _mm256_permutevar8x32_ps(
		_mm256_castps128_ps256(_mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)S))), lanes);

#pragma GCC unroll 8
	for (int v = 0; v < 8; v++) {
		const __m256i d = _mm256_madd_epi16(_mm256_maddubs_epi16(V[v], av), ones);

		_mm256_store_ps(yp + 8 * v, _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), sv,
							    _mm256_load_ps(yp + 8 * v)));
	}
}

/* y[32 b0 ..) (nb blocks) into pair order in yp (a missing last block of a pair as 0), or back adding off */
static void q4_pair_order(float *y, float *yp, int nb, const float *off, int back)
{
	for (int b = 0; b < nb; b += 2) {
		float *pp = yp + 32 * b;
		float *n0 = y + 32 * b, *n1 = n0 + 32;

		if (!back) {
			for (int i = 0; i < 4; i++) {
				const __m256 a = _mm256_loadu_ps(n0 + 8 * i);
				const __m256 c = b + 1 < nb ? _mm256_loadu_ps(n1 + 8 * i) : _mm256_setzero_ps();

				_mm256_store_ps(pp + 16 * i, _mm256_permute2f128_ps(a, c, 0x20));
				_mm256_store_ps(pp + 16 * i + 8, _mm256_permute2f128_ps(a, c, 0x31));
			}
			continue;
		}
		const __m256 o0 = _mm256_set1_ps(off[b]), o1 = _mm256_set1_ps(b + 1 < nb ? off[b + 1] : 0);

		for (int i = 0; i < 4; i++) {
			const __m256 p = _mm256_load_ps(pp + 16 * i), q = _mm256_load_ps(pp + 16 * i + 8);

			_mm256_storeu_ps(n0 + 8 * i, _mm256_add_ps(_mm256_permute2f128_ps(p, q, 0x20), o0));
			if (b + 1 < nb)
				_mm256_storeu_ps(n1 + 8 * i,
						 _mm256_add_ps(_mm256_permute2f128_ps(p, q, 0x31), o1));
		}
	}
}

ALWAYS_INLINE void q4_axpy_tile(const int R, int64_t c0, int nbc, const uint8_t *const *w,
				const uint8_t *const *nx, const float *h, float *yp, float *off)
{
	int32_t a4[SB] __attribute__((aligned(32)));
	float S[SB] __attribute__((aligned(32)));

	int j0 = 0;

	/* whole slices with a constant count, so that the scale copy has no branches */
	for (; j0 + SB <= nbc; j0 += SB) {
		q4_tile_acts(R, w, h, c0 + j0, SB, a4, S, off - c0);
		for (int j = 0; j < SB; j += 2)
			q4_axpy_pair(0, w, nx, c0 + j0 + j, a4 + j, S + j, yp + 32 * (j0 + j));
	}
	if (j0 < nbc) {
		const int nbs = nbc - j0;

		q4_tile_acts(R, w, h, c0 + j0, nbs, a4, S, off - c0);
		for (int j = 0; j + 1 < nbs; j += 2)
			q4_axpy_pair(0, w, nx, c0 + j0 + j, a4 + j, S + j, yp + 32 * (j0 + j));
		if (nbs & 1)
			q4_axpy_pair(1, w, nx, c0 + j0 + nbs - 1, a4 + nbs - 1, S + nbs - 1,
				     yp + 32 * (j0 + nbs - 1));
	}
}

static void q4_axpy_rows(int64_t k, const void *const *rows, const float *h, int n, int n_pf,
			 float *y)
{
	const int64_t nb = k / 32;
	float yp[AX_CHUNK * 32] __attribute__((aligned(32)));
	float off[AX_CHUNK] __attribute__((aligned(32)));

	for (int64_t c0 = 0; c0 < nb; c0 += AX_CHUNK) {
		const int nbc = (int)(nb - c0 < AX_CHUNK ? nb - c0 : AX_CHUNK);

		q4_pair_order(y + 32 * c0, yp, nbc, NULL, 0);
		memset(off, 0, sizeof(off));
		for (int i = 0; i < n; i += TR) {
			const uint8_t *w[TR], *nx[TR];

			switch (tile_rows(rows, n, n + n_pf, i, w, nx)) {
			case 1: q4_axpy_tile(1, c0, nbc, w, nx, h + i, yp, off); break;
			case 2: q4_axpy_tile(2, c0, nbc, w, nx, h + i, yp, off); break;
			case 3: q4_axpy_tile(3, c0, nbc, w, nx, h + i, yp, off); break;
			default: q4_axpy_tile(4, c0, nbc, w, nx, h + i, yp, off); break;
			}
		}
		q4_pair_order(y + 32 * c0, yp, nbc, off, 1);
	}
}

/* ---- F16 / F32 ------------------------------------------------------------ */

ALWAYS_INLINE __m256 load_f(const int f16, const void *p, int64_t i)
{
	if (f16)
		return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
	return _mm256_loadu_ps((const float *)p + i);
}

static inline float scalar_f(const int f16, const void *p, int64_t i)
{
	if (f16)
		return _cvtsh_ss(((const uint16_t *)p)[i]);
	return ((const float *)p)[i];
}

ALWAYS_INLINE void f_dot_tile(const int f16, const int R, int64_t k, const uint8_t *const *w,
			      const uint8_t *const *nx, const void *x, float *out)
{
	const int esz = f16 ? 2 : 4;
	const int64_t k16 = k & ~(int64_t)15;
	__m256 acc[TR][2];
	int64_t i;

	for (int r = 0; r < R; r++)
		acc[r][0] = acc[r][1] = _mm256_setzero_ps();
	for (i = 0; i < k16; i += 16) {
		const __m256 x0 = load_f(f16, x, i), x1 = load_f(f16, x, i + 8);

		if (f16 ? i % 32 == 0 : 1)
			for (int r = 0; r < R; r++)
				_mm_prefetch((const char *)nx[r] + i * esz, PF_HINT);
#pragma GCC unroll 4
		for (int r = 0; r < R; r++) {
			acc[r][0] = _mm256_fmadd_ps(load_f(f16, w[r], i), x0, acc[r][0]);
			acc[r][1] = _mm256_fmadd_ps(load_f(f16, w[r], i + 8), x1, acc[r][1]);
		}
	}
	for (int r = 0; r < R; r++) {
		float s = hsum8(_mm256_add_ps(acc[r][0], acc[r][1]));

		for (i = k16; i < k; i++)
			s += scalar_f(f16, w[r], i) * scalar_f(f16, x, i);
		out[r] = s;
	}
}

ALWAYS_INLINE void f_axpy_tile(const int f16, const int R, int64_t k, const uint8_t *const *w,
			       const uint8_t *const *nx, const float *h, float *y)
{
	const int esz = f16 ? 2 : 4;
	const int64_t k16 = k & ~(int64_t)15;
	__m256 hv[TR];
	int64_t i;

	for (int r = 0; r < R; r++)
		hv[r] = _mm256_set1_ps(h[r]);
	for (i = 0; i < k16; i += 16) {
		__m256 y0 = _mm256_loadu_ps(y + i), y1 = _mm256_loadu_ps(y + i + 8);

		if (f16 ? i % 32 == 0 : 1)
			for (int r = 0; r < R; r++)
				_mm_prefetch((const char *)nx[r] + i * esz, PF_HINT);
#pragma GCC unroll 4
		for (int r = 0; r < R; r++) {
			y0 = _mm256_fmadd_ps(hv[r], load_f(f16, w[r], i), y0);
			y1 = _mm256_fmadd_ps(hv[r], load_f(f16, w[r], i + 8), y1);
		}
		_mm256_storeu_ps(y + i, y0);
		_mm256_storeu_ps(y + i + 8, y1);
	}
	for (; i < k; i++)
		for (int r = 0; r < R; r++)
			y[i] += h[r] * scalar_f(f16, w[r], i);
}

/* ---- drivers --------------------------------------------------------------- */

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
		q8_axpy_tile(R, k / 32, w, nx, h, y); /* K_Q4_0 never gets here (axpy_any) */
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
	if (t == K_Q4_0) {
		q4_axpy_rows(k, rows, h, n, n_pf, y);
		return;
	}
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

void hyb_sparse_fill_avx2(struct hyb_sparse_kernels *k)
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
	k->axpy_rounds[HYB_TYPE_Q4_0] = true; /* q4_axpy_rows() */
	sgen_fill(k); /* the other types, their float loops compiled for AVX2 */
}
