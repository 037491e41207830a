/* SPDX-License-Identifier: MIT */
/*
 * TEAL's input-sparse projections on the CPU (hyb/sparsity.h,
 * docs/SPARSITY.md#teal). A projection y = W x whose input x is mostly
 * below its threshold reads only the columns of W that the inputs above it
 * multiply. Stored as ggml stores W (a row per output, blocks along the
 * input), a column is scattered over every row; so each weight is also
 * kept transposed, a row per input, blocks along the outputs: then an
 * input above the threshold reads one contiguous row and the projection is
 * y = sum over those inputs of x_i * row_i, the sparse operator's axpy.
 * The projections that share an input share a transposed matrix, their
 * rows side by side (Q|K|V, gate|up), so one list of inputs serves them.
 */
#ifndef HYB_TEAL_H
#define HYB_TEAL_H

#include <stdint.h>

#include "hyb/model.h"
#include "hyb/sparsity.h"
#include "hyb/threadpool.h"

/* One transposed matrix: n_in rows of n_out elements of `type`. */
struct hyb_teal_mat {
	uint32_t type;
	uint32_t n_in, n_out;
	uint64_t row_bytes;
	const void *data;
};

struct hyb_teal {
	struct hyb_teal_mat *mat; /* [n_layer][HYB_TEAL_INPUTS] */
	void *mem;
	uint64_t bytes;
};

/*
 * The model's transposed layout, made once on first use (the context's
 * threads transpose) and freed with the model; NULL with the reason when the
 * model cannot have one (an architecture or weight type it does not cover).
 */
const struct hyb_teal *hyb_teal_layout(const struct hyb_model *m, struct hyb_threadpool *pool);
void hyb_teal_free(struct hyb_teal *t);

/* Whether TEAL thresholds apply to the model; -EINVAL with the reason when not. */
int hyb_teal_check(const struct hyb_model *m);

/* The largest n_in and n_out of the model's projections (scratch sizes). */
uint32_t hyb_teal_max_in(const struct hyb_model *m);
uint32_t hyb_teal_max_out(const struct hyb_model *m);

/*
 * y[n_out] = sum over inputs i with |x[i]| > thr of x[i] * row_i, on the
 * pool; idx and val: scratch of n_in entries. Threads take slices of the
 * outputs and add the rows in input order: the same sums on every run and
 * at every thread count. Returns the inputs used.
 */
uint32_t hyb_teal_gemv(struct hyb_threadpool *pool, const struct hyb_teal_mat *w, const float *x,
		       float thr, uint32_t *idx, float *val, float *y);

/*
 * Several one-token rows (the decode steps of a batched pass): row r's
 * y[r * ldy ..] is hyb_teal_gemv's of x[r * ldx ..], bit for bit, and the
 * rows share the reads of the weights they have in common. n <=
 * HYB_TEAL_ROWS; idx and val: scratch of n * n_in entries; n_act[r]: the
 * inputs row r used.
 */
#define HYB_TEAL_ROWS 16
void hyb_teal_gemv_rows(struct hyb_threadpool *pool, const struct hyb_teal_mat *w,
			const float *x, size_t ldx, uint32_t n, float thr, uint32_t *idx,
			float *val, uint32_t *n_act, float *y, size_t ldy);

/* x[i] = 0 where |x[i]| <= thr, for n values: the same function, dense. */
void hyb_teal_mask(float *x, uint64_t n, float thr);

#endif
