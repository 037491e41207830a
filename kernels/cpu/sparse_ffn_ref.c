// SPDX-License-Identifier: MIT
/*
 * Sparse FFN kernels: the scalar reference that the SIMD levels are tested
 * against, the activation preparation every level shares, and the per-ISA
 * tables (same levels and fallback rule as dispatch.c's).
 *
 * The reference sums like gemm_scalar.c: float rows in double, quantized
 * rows as an exact integer dot per block times the two block scales. The
 * types of HYB_SPARSE_GEN_TYPES have one code for every level
 * (sparse_ffn_generic.h): here it is their reference too.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "blocks.h"
#include "sparse_ffn_generic.h"
#include "sparse_ffn_kernels.h"

#define UNUSED __attribute__((unused))

/* ---- scalar dots (the reference prefetches nothing: n_pf unused) ------------ */

static void dotp_f32(int64_t k, const void *const *rows, int n, int n_pf UNUSED,
		    const struct hyb_sparse_x *x, float *out)
{
	const float *b = x->q;

	for (int r = 0; r < n; r++) {
		const float *a = rows[r];
		double s = 0;

		for (int64_t i = 0; i < k; i++)
			s += (double)a[i] * b[i];
		out[r] = (float)s;
	}
}

static void dotp_f16(int64_t k, const void *const *rows, int n, int n_pf UNUSED,
		    const struct hyb_sparse_x *x, float *out)
{
	const uint16_t *b = x->q;

	for (int r = 0; r < n; r++) {
		const uint16_t *a = rows[r];
		double s = 0;

		for (int64_t i = 0; i < k; i++)
			s += (double)hyb_f16_to_f32(a[i]) * hyb_f16_to_f32(b[i]);
		out[r] = (float)s;
	}
}

static void dotp_q8_0(int64_t k, const void *const *rows, int n, int n_pf UNUSED,
		     const struct hyb_sparse_x *x, float *out)
{
	for (int r = 0; r < n; r++) {
		const struct hyb_block_q8_0 *a = rows[r];
		float s = 0;

		for (int64_t i = 0; i < k / HYB_QK8_0; i++) {
			const struct hyb_sparse_xblk *b = &x->blk[i];
			int sumi = 0;

			for (int j = 0; j < HYB_QK8_0; j++)
				sumi += a[i].qs[j] * b->q[j];
			s += sumi * (hyb_f16_to_f32(a[i].d) * b->d);
		}
		out[r] = s;
	}
}

static void dotp_q4_0(int64_t k, const void *const *rows, int n, int n_pf UNUSED,
		     const struct hyb_sparse_x *x, float *out)
{
	for (int r = 0; r < n; r++) {
		const struct hyb_block_q4_0 *a = rows[r];
		float s = 0;

		for (int64_t i = 0; i < k / HYB_QK4_0; i++) {
			const struct hyb_sparse_xblk *b = &x->blk[i];
			int sumi = 0;

			for (int j = 0; j < HYB_QK4_0 / 2; j++) {
				sumi += ((a[i].qs[j] & 0xF) - 8) * b->q[j];
				sumi += ((a[i].qs[j] >> 4) - 8) * b->q[j + HYB_QK4_0 / 2];
			}
			s += sumi * (hyb_f16_to_f32(a[i].d) * b->d);
		}
		out[r] = s;
	}
}

/* ---- scalar axpys -------------------------------------------------------- */

static void axpyp_f32(int64_t k, const void *const *rows, const float *h, int n,
		      int n_pf UNUSED, float *y)
{
	for (int r = 0; r < n; r++) {
		const float *a = rows[r];

		for (int64_t i = 0; i < k; i++)
			y[i] += h[r] * a[i];
	}
}

static void axpyp_f16(int64_t k, const void *const *rows, const float *h, int n,
		      int n_pf UNUSED, float *y)
{
	for (int r = 0; r < n; r++) {
		const uint16_t *a = rows[r];

		for (int64_t i = 0; i < k; i++)
			y[i] += h[r] * hyb_f16_to_f32(a[i]);
	}
}

/* s = h * d once per block; q (and q - 8) times s needs no further rounding of w */
static void axpyp_q8_0(int64_t k, const void *const *rows, const float *h, int n,
		       int n_pf UNUSED, float *y)
{
	for (int r = 0; r < n; r++) {
		const struct hyb_block_q8_0 *a = rows[r];

		for (int64_t i = 0; i < k / HYB_QK8_0; i++) {
			const float s = h[r] * hyb_f16_to_f32(a[i].d);
			float *yb = y + i * HYB_QK8_0;

			for (int j = 0; j < HYB_QK8_0; j++)
				yb[j] += s * a[i].qs[j];
		}
	}
}

static void axpyp_q4_0(int64_t k, const void *const *rows, const float *h, int n,
		       int n_pf UNUSED, float *y)
{
	for (int r = 0; r < n; r++) {
		const struct hyb_block_q4_0 *a = rows[r];

		for (int64_t i = 0; i < k / HYB_QK4_0; i++) {
			const float s = h[r] * hyb_f16_to_f32(a[i].d);
			float *yb = y + i * HYB_QK4_0;

			for (int j = 0; j < HYB_QK4_0 / 2; j++) {
				yb[j] += s * ((a[i].qs[j] & 0xF) - 8);
				yb[j + HYB_QK4_0 / 2] += s * ((a[i].qs[j] >> 4) - 8);
			}
		}
	}
}

#define WRAP(name)                                                                          \
	static void dot_##name(int64_t k, const void *const *rows, int n,                  \
			       const struct hyb_sparse_x *x, float *out)                    \
	{                                                                                   \
		dotp_##name(k, rows, n, 0, x, out);                                         \
	}                                                                                   \
	static void axpy_##name(int64_t k, const void *const *rows, const float *h, int n, \
				float *y)                                                   \
	{                                                                                   \
		axpyp_##name(k, rows, h, n, 0, y);                                          \
	}
WRAP(f32)
WRAP(f16)
WRAP(q8_0)
WRAP(q4_0)
#undef WRAP

/* ---- activation preparation --------------------------------------------- */

bool hyb_sparse_type_ok(uint32_t type)
{
	const struct hyb_sparse_kernels *t = hyb_sparse_kernels(HYB_ISA_SCALAR);

	return type < HYB_TYPE_COUNT && t->dot_pf[type] && t->axpy_pf[type];
}

static char type_list[256];

const char *hyb_sparse_type_list(void)
{
	(void)hyb_sparse_kernels(HYB_ISA_SCALAR); /* init() fills type_list */
	return type_list;
}

/*
 * The zero point that struct hyb_sparse_xblk's corr pays back, for the
 * types whose own kernels read the unpacked Q8_0 activation (Q4_0's 8,
 * Q8_0's 128 made unsigned); 0: the type reads x->q only, nothing to unpack.
 */
static const int32_t xblk_zero[HYB_TYPE_COUNT] = {
	[HYB_TYPE_Q4_0] = 8,
	[HYB_TYPE_Q8_0] = 128,
};

/* the converted row (<= 4 bytes an element), then the unpacked Q8_0 blocks */
static size_t xq_bytes(int64_t k)
{
	return ((size_t)k * 4 + 63) & ~(size_t)63;
}

/* the unpacked blocks, then their scales contiguous with 16 zeros after */
static size_t blk_bytes(int64_t k)
{
	return ((size_t)(k / 32 + 1) * sizeof(struct hyb_sparse_xblk) + 63) & ~(size_t)63;
}

/* the block scales, then (Q4_0) the quads */
static size_t xd_bytes(int64_t k)
{
	return ((size_t)(k / 32 + 16) * sizeof(float) + 63) & ~(size_t)63;
}

size_t hyb_sparse_x_bytes(int64_t k)
{
	if (k <= 0)
		return 64;
	return xq_bytes(k) + blk_bytes(k) + xd_bytes(k) +
	       (size_t)(k / 128 + 1) * sizeof(struct hyb_sparse_xquad);
}

static void make_quads(int q4, const struct hyb_sparse_xblk *blk, int64_t nq,
		       struct hyb_sparse_xquad *out)
{
	for (int64_t q = 0; q < nq; q++) {
		const struct hyb_sparse_xblk *b = &blk[4 * q];

		for (int j = 0; j < 4; j++) {
			for (int l = 0; l < 4; l++)
				out[q].d[4 * j + l] = b[j].d;
			if (q4) {
				memcpy(out[q].lo + 16 * j, b[j].q, 16);
				memcpy(out[q].hi + 16 * j, b[j].q + 16, 16);
				/* lane l takes elements 4l..4l+3 of lo and 16+4l.. of hi */
				for (int l = 0; l < 4; l++)
					out[q].init[4 * j + l] = b[j].corr[l] + b[j].corr[l + 4];
				continue;
			}
			memcpy((j < 2 ? out[q].lo : out[q].hi) + 32 * (j & 1), b[j].q, 32);
			memcpy((j < 2 ? out[q].init : out[q].init2) + 8 * (j & 1), b[j].corr,
			       sizeof(b[j].corr));
		}
	}
}

int hyb_sparse_prep_x(const struct hyb_cpu_kernels *ck, uint32_t type, const float *xn,
		      int64_t k, void *buf, struct hyb_sparse_x *out)
{
	const uint32_t vt = hyb_vec_dot_type(type);
	struct hyb_sparse_xblk *blk = (struct hyb_sparse_xblk *)((char *)buf + xq_bytes(k));

	if (!hyb_sparse_type_ok(type) || k <= 0 || !hyb_row_bytes(type, (uint64_t)k) ||
	    !ck || !ck->quantize_act[vt] || !ck->gemm_m1[type])
		return -1;
	ck->quantize_act[vt](xn, buf, k);
	out->type = type;
	out->q = buf;
	out->blk = NULL;
	out->xd = NULL;
	out->quad = NULL;
	out->gemv = ck->gemm_m1[type];
	if (!xblk_zero[type])
		return 0;
	const struct hyb_block_q8_0 *b = buf;
	const int32_t z = xblk_zero[type];

	for (int64_t i = 0; i < k / HYB_QK8_0; i++) {
		memcpy(blk[i].q, b[i].qs, 32);
		for (int l = 0; l < 8; l++)
			blk[i].corr[l] = -z * (b[i].qs[4 * l] + b[i].qs[4 * l + 1] +
					       b[i].qs[4 * l + 2] + b[i].qs[4 * l + 3]);
		blk[i].d = hyb_f16_to_f32(b[i].d);
	}
	float *xd = (float *)((char *)blk + blk_bytes(k));

	for (int64_t i = 0; i < k / HYB_QK8_0 + 16; i++)
		xd[i] = i < k / HYB_QK8_0 ? blk[i].d : 0.0f;
	out->blk = blk;
	out->xd = xd;
	struct hyb_sparse_xquad *quad = (void *)((char *)xd + xd_bytes(k));

	make_quads(type == HYB_TYPE_Q4_0, blk, k / 128, quad);
	out->quad = quad;
	return 0;
}

/* ---- tables -------------------------------------------------------------- */

static struct hyb_sparse_kernels tables[HYB_ISA_COUNT];
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void init(void)
{
	struct hyb_sparse_kernels *t = &tables[HYB_ISA_SCALAR];

	t->dot[HYB_TYPE_F32] = dot_f32;
	t->dot[HYB_TYPE_F16] = dot_f16;
	t->dot[HYB_TYPE_Q8_0] = dot_q8_0;
	t->dot[HYB_TYPE_Q4_0] = dot_q4_0;
	t->axpy[HYB_TYPE_F32] = axpy_f32;
	t->axpy[HYB_TYPE_F16] = axpy_f16;
	t->axpy[HYB_TYPE_Q8_0] = axpy_q8_0;
	t->axpy[HYB_TYPE_Q4_0] = axpy_q4_0;
	t->dot_pf[HYB_TYPE_F32] = dotp_f32;
	t->dot_pf[HYB_TYPE_F16] = dotp_f16;
	t->dot_pf[HYB_TYPE_Q8_0] = dotp_q8_0;
	t->dot_pf[HYB_TYPE_Q4_0] = dotp_q4_0;
	t->axpy_pf[HYB_TYPE_F32] = axpyp_f32;
	t->axpy_pf[HYB_TYPE_F16] = axpyp_f16;
	t->axpy_pf[HYB_TYPE_Q8_0] = axpyp_q8_0;
	t->axpy_pf[HYB_TYPE_Q4_0] = axpyp_q4_0;
	sgen_fill(t);
	for (uint32_t ty = 0, len = 0; ty < HYB_TYPE_COUNT; ty++)
		if (t->dot_pf[ty] && t->axpy_pf[ty] && len < sizeof(type_list))
			len += (uint32_t)snprintf(type_list + len, sizeof(type_list) - len, "%s%s",
						  len ? " " : "", hyb_type_name(ty));
	/* each level starts as a copy of the one below: unspecialised entries fall back */
	for (int i = 0; i < HYB_ISA_COUNT; i++) {
		if (i > 0)
			tables[i] = tables[i - 1];
		tables[i].isa = (enum hyb_isa)i;
		tables[i].name = hyb_isa_name((enum hyb_isa)i);
		if (i == 0 || !hyb_cpu_kernels((enum hyb_isa)i))
			continue;
		if (i == HYB_ISA_AVX2)
			hyb_sparse_fill_avx2(&tables[i]);
		else if (i == HYB_ISA_AVX512)
			hyb_sparse_fill_avx512(&tables[i]);
		else if (i == HYB_ISA_AVX512_VNNI)
			hyb_sparse_fill_avx512vnni(&tables[i]);
	}
}

const struct hyb_sparse_kernels *hyb_sparse_kernels(enum hyb_isa isa)
{
	if ((unsigned)isa >= HYB_ISA_COUNT || !hyb_cpu_kernels(isa))
		return NULL;
	pthread_once(&once, init);
	return &tables[isa];
}

const struct hyb_sparse_kernels *hyb_sparse_best(void)
{
	return hyb_sparse_kernels(hyb_cpu_best()->isa);
}
