/* SPDX-License-Identifier: MIT */
/*
 * The driver of the AVX-512 direct quantized kernels (gemm_q_avx512_direct_q0.h,
 * gemm_q_avx512_direct_k.h): DR rows x up to DC columns per tile, rows in
 * super-tiles that stay in L2 while every column group passes. Part of
 * gemm_q_avx512_body.h, which includes it once per ISA level.
 */
/* ------------------------------------------------------------------------ */
/* direct driver                                                            */

enum dtype { D_Q8_0, D_Q4_0, D_Q4R, D_Q4K_DOT, D_Q4K_GEMV, D_Q4K_TILED, D_Q6K_DOT,
	     D_Q6K_TILED, D_Q5_0, D_Q4_1, D_Q5_1, D_NL, D_NL_DOT, D_NLR, D_COUNT };

/* the q0_tile kind of a dtype, -1 for the others */
static inline int dtype_q0(enum dtype t)
{
	switch (t) {
	case D_Q8_0: return Q0_Q8;
	case D_Q4_0: return Q0_Q4;
	case D_Q5_0: return Q0_Q5;
	case D_Q4_1: return Q0_Q41;
	case D_Q5_1: return Q0_Q51;
	case D_NL: return Q0_NL;
	case D_NL_DOT: return Q0_NL2;
	default: return -1;
	}
}

ALWAYS_INLINE void direct_tile(const enum dtype t, const int NC, int64_t k,
			       const uint8_t *const *wr, const uint8_t *const *nx,
			       const void *const *xc, float *y, size_t ys, int nr)
{
	switch (t) {
#define Q0(T, KD) case T: \
		q0_tile(KD, NC, k / 32, wr, nx, (const struct q0_col *const *)xc, y, ys, nr); break;
	Q0(D_Q8_0, Q0_Q8) Q0(D_Q4_0, Q0_Q4) Q0(D_Q5_0, Q0_Q5) Q0(D_Q4_1, Q0_Q41)
	Q0(D_Q5_1, Q0_Q51) Q0(D_NL, Q0_NL) Q0(D_NL_DOT, Q0_NL2)
#undef Q0
	case D_Q4R:
		q4r_tile(0, NC, k / 32, wr, nx, (const struct q4r_col *const *)xc, y, ys, nr);
		break;
	case D_NLR:
		q4r_tile(1, NC, k / 32, wr, nx, (const struct q4r_col *const *)xc, y, ys, nr);
		break;
	case D_Q4K_DOT:
		kq_tile(0, KV_DOT, NC, k / 256, wr, nx, (const uint8_t *const *)xc, y, ys, nr);
		break;
	case D_Q4K_GEMV:
		kq_tile(0, KV_GEMV, NC, k / 256, wr, nx, (const uint8_t *const *)xc, y, ys, nr);
		break;
	case D_Q4K_TILED:
		kq_tile(0, KV_TILED, NC, k / 256, wr, nx, (const uint8_t *const *)xc, y, ys, nr);
		break;
	case D_Q6K_DOT:
		kq_tile(1, KV_DOT, NC, k / 256, wr, nx, (const uint8_t *const *)xc, y, ys, nr);
		break;
	case D_Q6K_TILED:
		kq_tile(1, KV_TILED, NC, k / 256, wr, nx, (const uint8_t *const *)xc, y, ys, nr);
		break;
	default:
		break;
	}
}

/*
 * Rows of a few hundred bytes to a few KiB: a tile of DR consecutive rows
 * reads DR interleaved streams inside the same pages, which the hardware
 * prefetcher does not follow (k = 576 Q8_0 rows of 612 bytes streamed at a
 * third of DRAM speed, F16 likewise: docs/PERFORMANCE.md). Such calls take
 * a tile's rows from DR separate quarters of the rows instead, i, i + q,
 * i + 2q, i + 3q: DR sequential streams. Each output is summed as before.
 */
#define STREAM_ROW_BYTES 4096 /* rows of a page or more keep consecutive tiles */
#define STREAM_MIN_ROWS 4     /* rows per stream worth the split */

ALWAYS_INLINE int64_t direct_streams(const enum dtype t, size_t ws, int64_t nrows)
{
	/* the repacked types' rows are already interleaved groups, read in order */
	if (t == D_Q4R || t == D_NLR || ws >= STREAM_ROW_BYTES || nrows < DR * STREAM_MIN_ROWS)
		return 0;
	return nrows / DR;
}

ALWAYS_INLINE void direct_run(const enum dtype t, const int NC, int64_t k, const uint8_t *w,
			      size_t ws, int64_t nrows, const void *const *xc, float *y,
			      size_t ys)
{
	const int64_t q = direct_streams(t, ws, nrows);

	for (int64_t i = 0; i < q; i++) {
		const uint8_t *wr[DR], *nx[DR];
		float out[DR * DC];

		for (int r = 0; r < DR; r++) {
			wr[r] = w + (size_t)(r * q + i) * ws;
			nx[r] = wr[r] + (i + PF_TILES < q ? PF_TILES * ws : 0);
		}
		direct_tile(t, NC, k, wr, nx, xc, out, DR, DR);
		for (int c = 0; c < NC; c++)
			for (int r = 0; r < DR; r++)
				y[(size_t)c * ys + (size_t)(r * q + i)] = out[c * DR + r];
	}
	for (int64_t r0 = q * DR; r0 < nrows; r0 += DR) {
		const uint8_t *wr[DR], *nx[DR];

		/* a short last tile repeats its last row rather than reading past it */
		for (int r = 0; r < DR; r++) {
			wr[r] = w + (size_t)min64(r0 + r, nrows - 1) * ws;
			nx[r] = w + (size_t)min64(r0 + PF_TILES * DR + r, nrows - 1) * ws;
		}
		direct_tile(t, NC, k, wr, nx, xc, y + r0, ys, (int)min64(DR, nrows - r0));
	}
}

static void direct_any(const enum dtype t, int64_t k, const uint8_t *w, size_t ws,
		       int64_t nrows, const void *const *xc, int nc, float *y, size_t ys)
{
	switch (t * DC + nc - 1) {
#define CASE(T, N) case T * DC + N - 1: direct_run(T, N, k, w, ws, nrows, xc, y, ys); break;
#define CASES(T) CASE(T, 1) CASE(T, 2) CASE(T, 3) CASE(T, 4)
	CASES(D_Q8_0) CASES(D_Q4_0) CASES(D_Q4R) CASES(D_Q4K_DOT) CASES(D_Q4K_GEMV)
	CASES(D_Q4K_TILED) CASES(D_Q6K_DOT) CASES(D_Q6K_TILED) CASES(D_Q5_0) CASES(D_Q4_1)
	CASES(D_Q5_1) CASES(D_NL) CASES(D_NL_DOT) CASES(D_NLR)
#undef CASES
#undef CASE
	}
}

/* rows per super-tile: the weight rows all column groups pass over stay in L2 */
#define SUPER_BYTES (256 * 1024)

/*
 * Direct path for any ncols. The 32-element block types need per-column repacked
 * activations (in scratch, all columns at once); the K-quants read Q8_K in
 * place. Rows go in super-tiles of about SUPER_BYTES of weights, each
 * passed by every group of DC columns while it sits in L2, so that a
 * prefill batch streams the weights from memory once. Returns -1 (nothing
 * written) without scratch memory.
 */
static int direct_gemm(const enum dtype t, HYB_GEMM_ARGS)
{
	const int64_t nb = k / 32;
	size_t per_col = 0;
	uint8_t *xs = NULL;
	int64_t rs = w_stride ? (int64_t)(SUPER_BYTES / w_stride) / DR * DR : nrows;

	if (rs < DR)
		rs = DR;
	if (dtype_q0(t) >= 0)
		per_col = (size_t)nb * sizeof(struct q0_col);
	else if (t == D_Q4R || t == D_NLR)
		per_col = (size_t)(nb + 3) / 4 * sizeof(struct q4r_col);
	if (per_col) {
		xs = hyb_cpu_scratch(HYB_SCRATCH_X, per_col * (size_t)ncols);
		if (!xs)
			return -1;
		for (int64_t c = 0; c < ncols; c++) {
			const uint8_t *xcol = (const uint8_t *)x + (size_t)c * x_stride;

			if (t == D_Q4R || t == D_NLR)
				q4r_prepack(t == D_NLR, xcol, nb, (struct q4r_col *)(xs + c * per_col));
			else
				q0_prepack(dtype_q0(t), xcol, nb, (struct q0_col *)(xs + c * per_col));
		}
	}
	for (int64_t r0 = 0; r0 < nrows; r0 += rs) {
		const int64_t nr = min64(rs, nrows - r0);

		for (int64_t c0 = 0; c0 < ncols; c0 += DC) {
			const int nc = (int)min64(DC, ncols - c0);
			const void *xc[DC];

			for (int c = 0; c < nc; c++)
				xc[c] = per_col ? (const void *)(xs + (c0 + c) * per_col)
						: (const void *)((const uint8_t *)x +
								 (size_t)(c0 + c) * x_stride);
			direct_any(t, k, (const uint8_t *)w + (size_t)r0 * w_stride, w_stride, nr, xc,
				   nc, y + (size_t)c0 * y_stride + r0, y_stride);
		}
	}
	return 0;
}
