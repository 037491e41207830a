// SPDX-License-Identifier: MIT
/*
 * Sparse FFN operator tests (libhyb/sparse/sparse_op.c, kernels/cpu/sparse_ffn_*).
 *
 * References are computed in double from the dequantized bundle rows. Two
 * tolerances, both per output element and derived, not tuned:
 *  - tight: against the reference fed the activation as the operator sees
 *    it (xn converted to the type's dot format and back), leaving only
 *    float accumulation error (1e-5 of the sums of |products|, propagated
 *    through the activation function);
 *  - type: against the reference fed xn itself, plus the conversion error
 *    of the type (F16 half an ulp of 2^-11, Q8_0 0.6 of the block step).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "hyb/threadpool.h"
#include "forward/ops.h"
#include "sparse/plan_ffn.h"
#include "sparse/sparse_op.h"
#include "sparse_ffn_kernels.h"
#include "test.h"

/* the hand-written kernels' types, then the generic ones (sparse_ffn_generic.h) */
#define GEN_ID(name, T) T,
static const uint32_t all_types[] = { HYB_TYPE_F32, HYB_TYPE_F16, HYB_TYPE_Q8_0,
				      HYB_TYPE_Q4_0, HYB_SPARSE_GEN_TYPES(GEN_ID) };
#undef GEN_ID
#define N_TYPES (sizeof(all_types) / sizeof(*all_types))
static const enum hyb_ffn_act all_acts[] = { HYB_ACT_SILU, HYB_ACT_RELU, HYB_ACT_RELU2,
					     HYB_ACT_DRELU };

static uint64_t g_rng;

static uint32_t rnd(void)
{
	g_rng = g_rng * 6364136223846793005ULL + 1442695040888963407ULL;
	return (uint32_t)(g_rng >> 33);
}

static float urand(void)
{
	return (float)(rnd() >> 8) * 0x1p-22f - 1.0f;
}

/* elements per block of the type: a row of n_embd needs n_embd a multiple of it */
static uint32_t blck(uint32_t type)
{
	return hyb_type_info(type)->blck;
}

/* the type's dots run through the dense GEMV (sparse_ffn_generic.h) */
static int generic_type(uint32_t type)
{
#define GEN_IS(name, T) || type == T
	return 0 HYB_SPARSE_GEN_TYPES(GEN_IS);
#undef GEN_IS
}

static void *xmalloc(size_t n)
{
	void *p = aligned_alloc(64, (n + 63) & ~(size_t)63);

	CHECK_MSG(p, "out of memory");
	return p;
}

/* ---- a test FFN: dense float matrices and their bundles ------------------- */

struct ffn {
	uint32_t type, E, F, GS, n_groups;
	int down_rounds; /* the kernels under test round in the down axpy (axpy_rounds) */
	float *gate, *up, *down; /* llama layout */
	int32_t *perm;
	uint8_t *data;
	const void **ptrs;
	struct hyb_ffn_bundles b;
};

static void ffn_make(struct ffn *f, uint32_t type, uint32_t E, uint32_t F, uint32_t GS,
		     uint64_t seed)
{
	char err[128];

	memset(f, 0, sizeof(*f));
	f->type = type;
	f->E = E;
	f->F = F;
	f->GS = GS;
	f->n_groups = (F + GS - 1) / GS;
	g_rng = seed;
	f->gate = xmalloc(sizeof(float) * E * F);
	f->up = xmalloc(sizeof(float) * E * F);
	f->down = xmalloc(sizeof(float) * E * F);
	f->perm = xmalloc(sizeof(int32_t) * F);
	for (size_t i = 0; i < (size_t)E * F; i++) {
		f->gate[i] = urand();
		f->up[i] = urand();
		f->down[i] = urand();
	}
	for (uint32_t i = 0; i < F; i++)
		f->perm[i] = (int32_t)i;
	for (uint32_t i = F - 1; i > 0; i--) { /* Fisher-Yates */
		uint32_t j = rnd() % (i + 1);
		int32_t t = f->perm[i];

		f->perm[i] = f->perm[j];
		f->perm[j] = t;
	}
	f->data = xmalloc(hyb_bundles_bytes(type, E, F));
	f->ptrs = calloc(f->n_groups, sizeof(*f->ptrs));
	CHECK(f->ptrs);
	CHECK_MSG(hyb_bundles_build(type, E, F, GS, f->gate, f->up, f->down, f->perm, f->data,
				    err, sizeof(err)) == 0, "%s", err);
	CHECK(hyb_bundles_view(&f->b, type, E, F, GS, f->data, f->ptrs) == 0);
	f->down_rounds = hyb_sparse_best()->axpy_rounds[type];
}

static void ffn_free(struct ffn *f)
{
	free(f->gate);
	free(f->up);
	free(f->down);
	free(f->perm);
	free(f->data);
	free(f->ptrs);
}

/* row r (0 gate, 1 up, 2 down) of bundle-order neuron i, as stored */
static const uint8_t *ffn_row_raw(const struct ffn *f, int r, uint32_t i)
{
	const uint32_t g = i / f->GS, l = i % f->GS;
	const uint32_t ng = f->F - g * f->GS < f->GS ? f->F - g * f->GS : f->GS;
	const uint8_t *base = (const uint8_t *)f->data + 3ull * g * f->GS * f->b.row_bytes;

	return base + ((uint64_t)r * ng + l) * f->b.row_bytes;
}

/* the same, dequantized */
static void ffn_row(const struct ffn *f, int r, uint32_t i, float *out)
{
	hyb_cpu_kernels(HYB_ISA_SCALAR)->dequantize[f->type](ffn_row_raw(f, r, i), out, f->E);
}

/* |scale| of 32-block b of a Q8_0 or Q4_0 row */
static double block_scale(uint32_t type, const uint8_t *row, int64_t b)
{
	uint16_t d;

	memcpy(&d, row + b * hyb_row_bytes(type, 32), 2);
	return fabs(hyb_f16_to_f32(d));
}

/* ---- reference ------------------------------------------------------------- */

static double d_act(enum hyb_ffn_act act, double g, double u)
{
	const double rg = g > 0 ? g : 0;

	switch (act) {
	case HYB_ACT_SILU:
		return g / (1 + exp(-g)) * u;
	case HYB_ACT_RELU:
		return rg * u;
	case HYB_ACT_RELU2:
		return rg * rg * u;
	default:
		return rg * (u > 0 ? u : 0);
	}
}

/* bound on |h(g', u') - h(g, u)| for |g' - g| <= eg, |u' - u| <= eu */
static double d_act_err(enum hyb_ffn_act act, double g, double u, double eg, double eu)
{
	const double ag = fabs(g) + eg, au = fabs(u) + eu;

	switch (act) {
	case HYB_ACT_SILU: /* |silu'| <= 1.1, |silu(g)| <= |g| */
		return 1.1 * eg * au + ag * eu;
	case HYB_ACT_RELU2:
		return 2 * ag * eg * au + ag * ag * eu;
	default: /* relu(g) * u and relu(g) * relu(u) */
		return eg * au + ag * eu;
	}
}

/*
 * The activation's conversion error per element for the type (0: as
 * given): Q8_0 and Q8_1 0.6 of the step of their 32-block, Q8_K of its
 * 256-block (amax / 128, rounded to nearest: half of it).
 */
static void conv_err(uint32_t type, const float *x, uint32_t E, double *xerr)
{
	const uint32_t vt = hyb_vec_dot_type(type);
	const uint32_t qb = vt == HYB_TYPE_Q8_K ? 256 : 32;

	for (uint32_t j = 0; j < E; j++) {
		if (vt == HYB_TYPE_F16) {
			xerr[j] = fabs(x[j]) * 0x1p-11;
		} else if (vt == HYB_TYPE_Q8_0 || vt == HYB_TYPE_Q8_1 || vt == HYB_TYPE_Q8_K) {
			double amax = 0;

			for (uint32_t t = j / qb * qb; t < j / qb * qb + qb; t++)
				amax = fabs(x[t]) > amax ? fabs(x[t]) : amax;
			xerr[j] = 0.6 * amax / 127;
		} else {
			xerr[j] = 0;
		}
	}
}

/*
 * Q4_1 and Q5_1 dots add m * s per block, s = d * sum(q) of the Q8_1
 * activation stored as F16 (llama.cpp's block_q8_1): off by half an F16
 * ulp, which the dequantized activation (d * q) does not show. Bounded
 * with margin by 2^-10 |m| sum |x|, per block of the row.
 */
static double q8_1_sum_err(uint32_t type, const uint8_t *row, const float *x, uint32_t E)
{
	double e = 0;

	if (hyb_vec_dot_type(type) != HYB_TYPE_Q8_1)
		return 0;
	for (uint32_t b = 0; b < E / 32; b++) {
		uint16_t m;
		double sx = 0;

		/* d then m open both block layouts */
		memcpy(&m, row + b * hyb_row_bytes(type, 32) + 2, 2);
		for (uint32_t j = 32 * b; j < 32 * b + 32; j++)
			sx += fabs(x[j]);
		e += fabs(hyb_f16_to_f32(m)) * sx * 0x1p-10;
	}
	return e;
}

/* xn as the operator's dots see it: converted by the dense path's converter and back */
static void as_seen(uint32_t type, const float *xn, uint32_t E, float *out)
{
	const uint32_t vt = hyb_vec_dot_type(type);
	void *q = xmalloc(4 * (size_t)E + 64);

	hyb_cpu_best()->quantize_act[vt](xn, q, E);
	hyb_cpu_kernels(HYB_ISA_SCALAR)->dequantize[vt](q, out, E);
	free(q);
}

#define ACC_REL 1e-5 /* float accumulation, relative to the sum of |products| */

/*
 * y and its tolerance over the listed neurons (NULL: all) of present groups
 * (present[g] == 0: skipped), from x with per-element uncertainty xerr.
 */
static void reference(const struct ffn *f, enum hyb_ffn_act act, const float *x,
		      const double *xerr, const uint32_t *list, uint32_t n_list,
		      const int *present, double *y, double *tol)
{
	float *gw = xmalloc(4 * f->E), *uw = xmalloc(4 * f->E), *dw = xmalloc(4 * f->E);
	const uint32_t n = list ? n_list : f->F, nb = f->E / 32;
	double *hs = xmalloc(8 * (n + 1)), *dhs = xmalloc(8 * (n + 1)), *hd_max = xmalloc(8 * nb);

	for (uint32_t e = 0; e < f->E; e++)
		y[e] = tol[e] = 0;
	for (uint32_t t = 0; t < n; t++) {
		const uint32_t i = list ? list[t] : t;
		double g = 0, u = 0, eg = 0, eu = 0;

		hs[t] = dhs[t] = 0;
		if (present && !present[i / f->GS])
			continue;
		ffn_row(f, 0, i, gw);
		ffn_row(f, 1, i, uw);
		for (uint32_t j = 0; j < f->E; j++) {
			g += (double)gw[j] * x[j];
			u += (double)uw[j] * x[j];
			eg += fabs(gw[j]) * (xerr[j] + ACC_REL * fabs(x[j]));
			eu += fabs(uw[j]) * (xerr[j] + ACC_REL * fabs(x[j]));
		}
		eg += q8_1_sum_err(f->type, ffn_row_raw(f, 0, i), x, f->E);
		eu += q8_1_sum_err(f->type, ffn_row_raw(f, 1, i), x, f->E);
		hs[t] = d_act(act, g, u);
		dhs[t] = d_act_err(act, g, u, eg, eu) + ACC_REL * fabs(hs[t]);
	}
	/*
	 * A rounding down axpy (axpy_rounds) is off by half its scale per
	 * product, the scale being 1/127 of the largest |h * d| of the rows it
	 * shares a tile with: at most the largest of all listed neurons.
	 */
	for (uint32_t b = 0; b < nb; b++) {
		hd_max[b] = 0;
		for (uint32_t t = 0; f->down_rounds && t < n; t++) {
			const double hd = (fabs(hs[t]) + dhs[t]) *
					  block_scale(f->type, ffn_row_raw(f, 2, list ? list[t] : t), b);

			hd_max[b] = hd > hd_max[b] ? hd : hd_max[b];
		}
	}
	for (uint32_t t = 0; t < n; t++) {
		const uint32_t i = list ? list[t] : t;
		const double h = hs[t], dh = dhs[t];

		if (present && !present[i / f->GS])
			continue;
		ffn_row(f, 2, i, dw);
		for (uint32_t e = 0; e < f->E; e++) {
			y[e] += h * dw[e];
			tol[e] += (dh + 3 * ACC_REL * fabs(h)) * fabs(dw[e]);
			if (f->down_rounds && h != 0) {
				const double d = block_scale(f->type, ffn_row_raw(f, 2, i), e / 32);

				if (d > 0)
					tol[e] += 0.5 * hd_max[e / 32] / 127 * fabs(dw[e]) / d;
			}
		}
	}
	for (uint32_t e = 0; e < f->E; e++)
		tol[e] += 1e-30;
	free(gw);
	free(uw);
	free(dw);
	free(hs);
	free(dhs);
	free(hd_max);
}

static void check_close(const char *what, const float *y, const double *ref, const double *tol,
			uint32_t n)
{
	for (uint32_t e = 0; e < n; e++)
		CHECK_MSG(fabs(y[e] - ref[e]) <= tol[e],
			  "%s: y[%u] = %.9g, reference %.9g, tolerance %.3g", what, e, y[e],
			  ref[e], tol[e]);
}

/* both checks: tight against x as seen, type-derived against xn itself */
static void check_ref(const struct ffn *f, enum hyb_ffn_act act, const float *xn,
		      const uint32_t *list, uint32_t n_list, const int *present, const float *y,
		      const char *what)
{
	float *xs = xmalloc(4 * f->E);
	double *xerr = xmalloc(8 * f->E), *ref = xmalloc(8 * f->E), *tol = xmalloc(8 * f->E);
	char msg[96];

	as_seen(f->type, xn, f->E, xs);
	memset(xerr, 0, 8 * f->E);
	reference(f, act, xs, xerr, list, n_list, present, ref, tol);
	snprintf(msg, sizeof(msg), "%s %s act %d (tight)", what, hyb_type_name(f->type), act);
	check_close(msg, y, ref, tol, f->E);
	conv_err(f->type, xn, f->E, xerr);
	reference(f, act, xn, xerr, list, n_list, present, ref, tol);
	snprintf(msg, sizeof(msg), "%s %s act %d (vs xn)", what, hyb_type_name(f->type), act);
	check_close(msg, y, ref, tol, f->E);
	free(xs);
	free(xerr);
	free(ref);
	free(tol);
}

static void rand_x(float *x, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		x[i] = urand();
}

/* ---- kernels: every ISA level against the scalar reference ------------- */

/* n rows of k random but well-formed weights: raw codes, block scales in range */
static uint8_t *rand_rows(uint32_t type, int64_t k, int n, size_t *rb)
{
	*rb = hyb_row_bytes(type, (uint64_t)k);
	uint8_t *w = xmalloc(*rb * (size_t)n);

	/* random codes for the hand-written int8 kernels; the others (scales anywhere in
	 * their blocks) from random floats */
	if (type != HYB_TYPE_Q8_0 && type != HYB_TYPE_Q4_0) {
		float *t = xmalloc(4 * (size_t)k);

		for (int r = 0; r < n; r++) {
			rand_x(t, (uint32_t)k);
			hyb_quantize_row_ref(type, t, w + r * *rb, k);
		}
		free(t);
		return w;
	}
	const size_t bs = hyb_type_info(type)->size;

	for (size_t i = 0; i < *rb * (size_t)n; i++)
		w[i] = (uint8_t)rnd(); /* every code, Q8_0's -128 included */
	for (size_t off = 0; off < *rb * (size_t)n; off += bs) {
		uint16_t d = (uint16_t)(0x2000 | (rnd() & 0x3ff) | (rnd() & 1) << 15);

		memcpy(w + off, &d, 2);
	}
	return w;
}

/*
 * What a rounding axpy (axpy_rounds) may add to the float one's result, per
 * element: half the scale of each product's tile and block (1/127 of the
 * largest |h_r * d_rb| of rows 4i..4i+3) times |q - zero point| = |w| / d.
 */
static void axpy_round_tol(const struct hyb_sparse_kernels *sk, uint32_t t, int64_t k,
			   const void *const *rows, const float *h, int n, const float *wf,
			   double *tol)
{
	for (int64_t e = 0; e < k; e++)
		tol[e] = 0;
	if (!sk->axpy_rounds[t])
		return;
	for (int t0 = 0; t0 < n; t0 += HYB_SPARSE_AXPY_TILE) {
		const int t1 = t0 + HYB_SPARSE_AXPY_TILE < n ? t0 + HYB_SPARSE_AXPY_TILE : n;

		for (int64_t b = 0; b < k / 32; b++) {
			double m = 0;

			for (int r = t0; r < t1; r++) {
				const double a = fabs(h[r]) * block_scale(t, rows[r], b);

				m = a > m ? a : m;
			}
			for (int r = t0; r < t1; r++) {
				const double d = block_scale(t, rows[r], b);

				for (int64_t e = 32 * b; d > 0 && e < 32 * b + 32; e++)
					tol[e] += 0.5 * m / 127 * fabs(wf[r * k + e]) / d;
			}
		}
	}
}

/* One level's dot and axpy on n of nmax scattered rows of k against the reference. */
static void check_kernels(const struct hyb_sparse_kernels *sk, uint32_t t, int64_t k)
{
	const struct hyb_sparse_kernels *ref = hyb_sparse_kernels(HYB_ISA_SCALAR);
	const int ns[] = { 1, 2, 3, 4, 5, 7, 8, 13, HYB_SPARSE_MAX_ROWS - HYB_SPARSE_PF_ROWS };
	const int nmax = HYB_SPARSE_MAX_ROWS;
	float *xf = xmalloc(4 * k), *h = xmalloc(4 * nmax), *wf = xmalloc(4 * k * nmax);
	float *o1 = xmalloc(4 * nmax), *o2 = xmalloc(4 * nmax);
	float *y1 = xmalloc(4 * k), *y2 = xmalloc(4 * k);
	double *ytol = xmalloc(8 * k);
	void *xb = xmalloc(hyb_sparse_x_bytes(k)), *xb2 = xmalloc(hyb_sparse_x_bytes(k));
	const void *rows[HYB_SPARSE_MAX_ROWS];
	struct hyb_sparse_x x, xl;
	size_t rb;
	uint8_t *w = rand_rows(t, k, nmax, &rb);

	rand_x(xf, (uint32_t)k);
	rand_x(h, nmax);
	CHECK(hyb_sparse_prep_x(hyb_cpu_kernels(HYB_ISA_SCALAR), t, xf, k, xb, &x) == 0);
	/*
	 * The generic dots run the GEMV of the level that prepared x: prepared by
	 * this level, they test its GEMV against the scalar one.
	 */
	CHECK(hyb_sparse_prep_x(generic_type(t) ? hyb_cpu_kernels(sk->isa)
						: hyb_cpu_kernels(HYB_ISA_SCALAR),
				t, xf, k, xb2, &xl) == 0);
	for (int r = 0; r < nmax; r++) { /* scattered order */
		rows[r] = w + (size_t)((r * 37) % nmax) * rb;
		hyb_cpu_kernels(HYB_ISA_SCALAR)->dequantize[t](rows[r], wf + r * k, k);
	}
	for (size_t ni = 0; ni < sizeof(ns) / sizeof(*ns); ni++) {
		const int n = ns[ni], npf = (int)(ni % 3) * 4; /* look-ahead changes nothing */

		ref->dot[t](k, rows, n, &x, o1);
		if (npf)
			sk->dot_pf[t](k, rows, n, npf, &xl, o2);
		else
			sk->dot[t](k, rows, n, &xl, o2);
		for (int r = 0; r < n; r++) {
			double s = 0;

			for (int64_t e = 0; e < k; e++)
				s += fabs(wf[r * k + e] * xf[e]);
			CHECK_MSG(fabs(o1[r] - o2[r]) <= 1e-5 * s + 1e-30,
				  "%s dot %s k %lld n %d row %d: %g vs %g", sk->name,
				  hyb_type_name(t), (long long)k, n, r, o2[r], o1[r]);
		}
		for (int64_t e = 0; e < k; e++)
			y1[e] = y2[e] = xf[e];
		axpy_round_tol(sk, t, k, rows, h, n, wf, ytol);
		ref->axpy_pf[t](k, rows, h, n, npf, y1);
		if (npf)
			sk->axpy_pf[t](k, rows, h, n, npf, y2);
		else
			sk->axpy[t](k, rows, h, n, y2);
		for (int64_t e = 0; e < k; e++) {
			double s = fabs(xf[e]);

			for (int r = 0; r < n; r++)
				s += fabs(h[r] * wf[r * k + e]);
			CHECK_MSG(fabs(y1[e] - y2[e]) <= 1e-5 * s + ytol[e],
				  "%s axpy %s k %lld n %d elem %lld: %g vs %g", sk->name,
				  hyb_type_name(t), (long long)k, n, (long long)e, y2[e], y1[e]);
		}
		/* the generic types' axpy adds the same floats at every level
		 * (sparse_ffn_generic.h) */
		CHECK_MSG(!generic_type(t) || !memcmp(y1, y2, sizeof(float) * (size_t)k),
			  "%s axpy %s k %lld n %d: not the scalar level's floats", sk->name,
			  hyb_type_name(t), (long long)k, n);
	}
	free(w);
	free(xf);
	free(h);
	free(wf);
	free(o1);
	free(o2);
	free(y1);
	free(y2);
	free(ytol);
	free(xb);
	free(xb2);
}

TEST(sparse_kernels_every_isa_vs_scalar)
{
	int levels = 0;

	for (int isa = 1; isa < HYB_ISA_COUNT; isa++) {
		const struct hyb_sparse_kernels *sk = hyb_sparse_kernels((enum hyb_isa)isa);

		if (!sk)
			continue;
		levels++;
		for (size_t ti = 0; ti < sizeof(all_types) / sizeof(*all_types); ti++) {
			const uint32_t t = all_types[ti];
			/* whole slices of 16 blocks, quads of 4, what is left; float tails */
			const int64_t ks[] = { 256, 96, t <= HYB_TYPE_F16 ? 200 : 32,
					       t <= HYB_TYPE_F16 ? 7 : 64, 672, 1280, 4096 };

			for (size_t ki = 0; ki < sizeof(ks) / sizeof(*ks); ki++) {
				if (ks[ki] % blck(t))
					continue; /* K-quants: whole super-blocks */
				g_rng = 1000 + 17 * ti + ki;
				check_kernels(sk, t, ks[ki]);
			}
		}
	}
	if (!levels)
		SKIP("this CPU has no SIMD level");
}

/* The whole operator at one ISA level against the scalar level. */
static void check_ops_isa(struct hyb_sparse_ffn_ctx *c, const struct ffn *f,
			  enum hyb_ffn_act act, enum hyb_isa isa, const float *xn,
			  const uint32_t *list, uint32_t n)
{
	double *ref = xmalloc(8 * f->E), *tol = xmalloc(8 * f->E), *xerr = xmalloc(8 * f->E);
	float *xs = xmalloc(4 * f->E), *y0 = xmalloc(4 * f->E), *y1 = xmalloc(4 * f->E);
	struct ffn fl = *f; /* the tolerance of this level's down axpy */

	fl.down_rounds = hyb_sparse_kernels(isa)->axpy_rounds[f->type];
	CHECK(hyb_sparse_ffn_set_isa(c, HYB_ISA_SCALAR) == 0);
	CHECK(hyb_sparse_ffn(c, NULL, &f->b, act, xn, list, n, y0, NULL) == 0);
	CHECK(hyb_sparse_ffn_set_isa(c, isa) == 0);
	CHECK(hyb_sparse_ffn(c, NULL, &f->b, act, xn, list, n, y1, NULL) == 0);
	/* the two differ by twice the accumulation error at most */
	memset(xerr, 0, 8 * f->E);
	as_seen(f->type, xn, f->E, xs);
	reference(&fl, act, xs, xerr, list, n, NULL, ref, tol);
	for (uint32_t e = 0; e < f->E; e++)
		CHECK_MSG(fabs(y0[e] - y1[e]) <= 2 * tol[e], "%s %s act %d: y[%u] %g vs scalar %g",
			  hyb_isa_name(isa), hyb_type_name(f->type), act, e, y1[e], y0[e]);
	free(ref);
	free(tol);
	free(xerr);
	free(xs);
	free(y0);
	free(y1);
}

TEST(sparse_ops_every_isa_vs_scalar)
{
	const uint32_t E = 256, F = 200;
	struct hyb_sparse_ffn_ctx *c = hyb_sparse_ffn_ctx_new(E, F, 1);
	float xn[256];
	uint32_t list[100];
	int levels = 0;

	CHECK(c);
	for (uint32_t i = 0; i < 100; i++)
		list[i] = 2 * i + (i % 3 == 0);
	for (int isa = 1; isa < HYB_ISA_COUNT; isa++) {
		const enum hyb_isa lv = (enum hyb_isa)isa;

		if (!hyb_sparse_kernels(lv))
			continue;
		levels++;
		for (size_t ti = 0; ti < N_TYPES; ti++) {
			struct ffn f;

			ffn_make(&f, all_types[ti], E, F, 64, 7 + ti);
			rand_x(xn, E);
			for (size_t ai = 0; ai < 4; ai++) {
				check_ops_isa(c, &f, all_acts[ai], lv, xn, NULL, 0);
				check_ops_isa(c, &f, all_acts[ai], lv, xn, list, 100);
			}
			ffn_free(&f);
		}
	}
	hyb_sparse_ffn_ctx_free(c);
	if (!levels)
		SKIP("this CPU has no SIMD level");
}

/* ---- the operator against the reference ------------------------------------ */

TEST(sparse_oracle_matches_reference)
{
	const uint32_t E = 256, F = 200; /* groups of 64: the last holds 8 */
	struct hyb_sparse_ffn_ctx *c = hyb_sparse_ffn_ctx_new(E, F, 2);
	struct hyb_threadpool *pool = hyb_threadpool_new(2);
	float xn[256], y[256];

	CHECK(c && pool);
	for (size_t ti = 0; ti < N_TYPES; ti++) {
		struct ffn f;

		ffn_make(&f, all_types[ti], E, F, 64, 100 + ti);
		rand_x(xn, E);
		for (size_t ai = 0; ai < 4; ai++) {
			struct hyb_sparse_ffn_stats st;

			const enum hyb_ffn_act act = all_acts[ai];

			CHECK(hyb_sparse_ffn(c, pool, &f.b, act, xn, NULL, 0, y, &st) == 0);
			check_ref(&f, act, xn, NULL, 0, NULL, y, "oracle");
			CHECK_EQ_INT(st.n_gate, F);
			if (act == HYB_ACT_SILU)
				CHECK_EQ_INT(st.n_up, F);
			else /* random signs: about half the gates are > 0 */
				CHECK_MSG(st.n_up > F / 4 && st.n_up < 3 * F / 4, "n_up %llu",
					  (unsigned long long)st.n_up);
			CHECK(st.n_nz <= st.n_up);
			if (act == HYB_ACT_DRELU)
				CHECK(st.n_nz < st.n_up);
		}
		ffn_free(&f);
	}
	hyb_threadpool_free(pool);
	hyb_sparse_ffn_ctx_free(c);
}

/* F16 transposes losslessly: the dense kernels on the same weights give the same FFN. */
TEST(sparse_f16_matches_dense_path)
{
	const uint32_t E = 256, F = 200;
	const struct hyb_cpu_kernels *k = hyb_cpu_best();
	struct hyb_sparse_ffn_ctx *c = hyb_sparse_ffn_ctx_new(E, F, 1);
	struct ffn f;
	uint16_t *gate16 = xmalloc(2 * E * F), *up16 = xmalloc(2 * E * F);
	uint16_t *down16 = xmalloc(2 * E * F), xq[256], hq[200];
	float xn[256], g[200], u[200], y[256], yd[256];

	CHECK(c);
	ffn_make(&f, HYB_TYPE_F16, E, F, 64, 55);
	rand_x(xn, E);
	for (uint32_t i = 0; i < F; i++) {
		hyb_quantize_row_ref(HYB_TYPE_F16, f.gate + i * E, gate16 + i * E, E);
		hyb_quantize_row_ref(HYB_TYPE_F16, f.up + i * E, up16 + i * E, E);
	}
	for (uint32_t e = 0; e < E; e++)
		hyb_quantize_row_ref(HYB_TYPE_F16, f.down + e * F, down16 + e * F, F);
	k->quantize_act[HYB_TYPE_F16](xn, xq, E);
	for (size_t ai = 0; ai < 4; ai++) {
		hyb_gemm_pick(k, HYB_TYPE_F16, F)(E, gate16, 2 * E, F, xq, 0, 1, g, F);
		hyb_gemm_pick(k, HYB_TYPE_F16, F)(E, up16, 2 * E, F, xq, 0, 1, u, F);
		double gabs[200], uabs[200];

		for (uint32_t i = 0; i < F; i++) {
			gabs[i] = uabs[i] = 0;
			for (uint32_t j = 0; j < E; j++) {
				gabs[i] += fabs(hyb_f16_to_f32(gate16[i * E + j]) * xn[j]);
				uabs[i] += fabs(hyb_f16_to_f32(up16[i * E + j]) * xn[j]);
			}
		}
		float g0[200], u0[200];

		memcpy(g0, g, sizeof(g));
		memcpy(u0, u, sizeof(u));
		hyb_ffn_act(g, u, F, all_acts[ai]);
		k->quantize_act[HYB_TYPE_F16](g, hq, F);
		hyb_gemm_pick(k, HYB_TYPE_F16, E)(F, down16, 2 * F, E, hq, 0, 1, yd, E);
		CHECK(hyb_sparse_ffn(c, NULL, &f.b, all_acts[ai], xn, NULL, 0, y, NULL) == 0);
		for (uint32_t e = 0; e < E; e++) {
			double tol = 1e-30;

			/* both sum the same products in float; dense also rounds h to F16 */
			for (uint32_t i = 0; i < F; i++) {
				const double eg = 2 * ACC_REL * gabs[i], eu = 2 * ACC_REL * uabs[i];
				const double h = d_act(all_acts[ai], g0[i], u0[i]);

				tol += (d_act_err(all_acts[ai], g0[i], u0[i], eg, eu) +
					fabs(h) * (0x1p-11 + 6 * ACC_REL)) *
				       fabs(hyb_f16_to_f32(down16[e * F + i]));
			}
			CHECK_MSG(fabs(y[e] - yd[e]) <= tol, "act %d y[%u]: sparse %.9g dense %.9g "
				  "tol %.3g", all_acts[ai], e, y[e], yd[e], tol);
		}
	}
	ffn_free(&f);
	free(gate16);
	free(up16);
	free(down16);
	hyb_sparse_ffn_ctx_free(c);
}

/*
 * Every type against the dense computation on the same bundle: gate and up
 * by the dense GEMV over all rows (one group: they are a matrix), h, and
 * down summed in double over the listed neurons (all, or a subset: the
 * dense FFN restricted to them), within twice the tight tolerance.
 */
TEST(sparse_matches_dense_gemv_every_type)
{
	const uint32_t E = 256, F = 200;
	const struct hyb_cpu_kernels *k = hyb_cpu_best();
	struct hyb_sparse_ffn_ctx *c = hyb_sparse_ffn_ctx_new(E, F, 2);
	struct hyb_threadpool *pool = hyb_threadpool_new(2);
	float xn[256], xs[256], y[256], g[200], u[200], dw[256];
	double yd[256], ref[256], tol[256], xerr[256] = { 0 };
	uint32_t list[200], n = 0;
	void *xq = xmalloc(4 * E);

	CHECK(c && pool);
	g_rng = 31;
	for (uint32_t i = 0; i < F; i++)
		if (rnd() % 4 == 0)
			list[n++] = i;
	for (size_t ti = 0; ti < N_TYPES; ti++) {
		const uint32_t t = all_types[ti];
		struct ffn f;

		ffn_make(&f, t, E, F, F, 1100 + ti);
		rand_x(xn, E);
		as_seen(t, xn, E, xs);
		k->quantize_act[hyb_vec_dot_type(t)](xn, xq, E);
		hyb_gemm_pick(k, t, F)(E, f.data, f.b.row_bytes, F, xq, 0, 1, g, F);
		hyb_gemm_pick(k, t, F)(E, f.data + (size_t)F * f.b.row_bytes, f.b.row_bytes, F, xq,
				       0, 1, u, F);
		for (size_t ai = 0; ai < 4; ai++) {
			for (int part = 0; part < 2; part++) {
				const uint32_t *l = part ? list : NULL, nl = part ? n : F;

				for (uint32_t e = 0; e < E; e++)
					yd[e] = 0;
				for (uint32_t q = 0; q < nl; q++) {
					const uint32_t i = l ? l[q] : q;
					const double h = d_act(all_acts[ai], g[i], u[i]);

					ffn_row(&f, 2, i, dw);
					for (uint32_t e = 0; e < E; e++)
						yd[e] += h * dw[e];
				}
				CHECK(hyb_sparse_ffn(c, pool, &f.b, all_acts[ai], xn, l, nl, y, NULL) ==
				      0);
				reference(&f, all_acts[ai], xs, xerr, l, nl, NULL, ref, tol);
				for (uint32_t e = 0; e < E; e++)
					CHECK_MSG(fabs(y[e] - yd[e]) <= 2 * tol[e],
						  "%s act %d %s: y[%u] sparse %.9g dense %.9g tol %.3g",
						  hyb_type_name(t), all_acts[ai], l ? "subset" : "all",
						  e, y[e], yd[e], 2 * tol[e]);
			}
		}
		ffn_free(&f);
	}
	free(xq);
	hyb_threadpool_free(pool);
	hyb_sparse_ffn_ctx_free(c);
}

/*
 * PowerInfer's transposed down (ffn_down_t, a row per neuron) through
 * hyb_ffn_down_t, for every type: out[t] = sum over neurons of act[t][i] *
 * row i, against the sum in double of the dequantized rows. Some
 * activations are 0, as after a ReLU; 2 tokens, 2 threads.
 */
TEST(sparse_down_t_every_type)
{
	const uint32_t E = 512, F = 200, NT = 2;
	struct hyb_model m;
	struct hyb_threadpool *pool = hyb_threadpool_new(2);
	struct hyb_ffn_plan_scratch *sc;
	float *act = xmalloc(4 * NT * F), *out = xmalloc(4 * NT * E), *wr = xmalloc(4 * E);
	float *src = xmalloc(4 * E);
	double *ref = xmalloc(8 * NT * E), *mag = xmalloc(8 * NT * E);

	memset(&m, 0, sizeof(m));
	m.hp.n_embd = E;
	sc = hyb_ffn_plan_scratch_new(&m, NT, 2);
	CHECK(pool && sc);
	for (size_t ti = 0; ti < N_TYPES; ti++) {
		const uint32_t t = all_types[ti];
		const uint64_t rb = hyb_row_bytes(t, E);
		uint8_t *w = xmalloc(rb * F);
		struct hyb_weight dt = { .type = t, .ne0 = E, .ne1 = F, .row_bytes = rb, .data = w };

		if (hyb_sparse_best()->axpy_rounds[t]) { /* AVX2's Q4_0: its bound is axpy_round_tol() */
			free(w);
			continue;
		}
		g_rng = 1300 + ti;
		for (uint32_t i = 0; i < F; i++) {
			rand_x(src, E);
			CHECK(hyb_quantize_row_ref(t, src, w + i * rb, E) == 0);
		}
		for (uint32_t q = 0; q < NT * F; q++)
			act[q] = rnd() % 3 ? urand() : 0.0f;
		memset(ref, 0, 8 * NT * E);
		memset(mag, 0, 8 * NT * E);
		for (uint32_t i = 0; i < F; i++) {
			hyb_cpu_kernels(HYB_ISA_SCALAR)->dequantize[t](w + i * rb, wr, E);
			for (uint32_t tok = 0; tok < NT; tok++)
				for (uint32_t e = 0; e < E; e++) {
					ref[tok * E + e] += (double)act[tok * F + i] * wr[e];
					mag[tok * E + e] += fabs((double)act[tok * F + i] * wr[e]);
				}
		}
		hyb_ffn_down_t(pool, sc, &dt, act, NT, out);
		for (uint32_t q = 0; q < NT * E; q++)
			CHECK_MSG(fabs(out[q] - ref[q]) <= 3 * ACC_REL * mag[q] + 1e-30,
				  "%s down_t out[%u] %.9g vs %.9g", hyb_type_name(t), q, out[q],
				  ref[q]);
		free(w);
	}
	hyb_ffn_plan_scratch_free(sc);
	hyb_threadpool_free(pool);
	free(act);
	free(out);
	free(wr);
	free(src);
	free(ref);
	free(mag);
}

/* K-quant rows of several super-blocks, groups and lists as the other tests. */
TEST(sparse_kquant_wide_rows)
{
	const uint32_t E = 768, F = 96;
	struct hyb_sparse_ffn_ctx *c = hyb_sparse_ffn_ctx_new(E, F, 2);
	struct hyb_threadpool *pool = hyb_threadpool_new(2);
	float *xn = xmalloc(4 * E), *y = xmalloc(4 * E);
	uint32_t list[96], n = 0;

	CHECK(c && pool);
	for (uint32_t i = 1; i < F; i += 3)
		list[n++] = i;
	for (size_t ti = 0; ti < N_TYPES; ti++) {
		struct ffn f;

		if (blck(all_types[ti]) != 256)
			continue;
		ffn_make(&f, all_types[ti], E, F, 40, 1200 + ti); /* 40 + 40 + 16 */
		rand_x(xn, E);
		CHECK(hyb_sparse_ffn(c, pool, &f.b, HYB_ACT_SILU, xn, NULL, 0, y, NULL) == 0);
		check_ref(&f, HYB_ACT_SILU, xn, NULL, 0, NULL, y, "wide oracle");
		CHECK(hyb_sparse_ffn(c, pool, &f.b, HYB_ACT_RELU, xn, list, n, y, NULL) == 0);
		check_ref(&f, HYB_ACT_RELU, xn, list, n, NULL, y, "wide list");
		ffn_free(&f);
	}
	free(xn);
	free(y);
	hyb_threadpool_free(pool);
	hyb_sparse_ffn_ctx_free(c);
}

/* A partial list is the reference restricted to it, and differs from the full FFN. */
TEST(sparse_partial_list_matches_reference)
{
	const uint32_t E = 256, F = 200;
	struct hyb_sparse_ffn_ctx *c = hyb_sparse_ffn_ctx_new(E, F, 2);
	struct hyb_threadpool *pool = hyb_threadpool_new(2);
	float xn[256], y[256], yall[256];
	uint32_t list[200], n = 0;

	CHECK(c && pool);
	g_rng = 9;
	for (uint32_t i = 0; i < F; i++)
		if (rnd() % 10 < 3 || i == F - 1)
			list[n++] = i;
	for (size_t ti = 0; ti < N_TYPES; ti++) {
		struct ffn f;

		ffn_make(&f, all_types[ti], E, F, 64, 200 + ti);
		rand_x(xn, E);
		for (size_t ai = 0; ai < 4; ai++) {
			const enum hyb_ffn_act act = all_acts[ai];
			struct hyb_sparse_ffn_stats st;
			double diff = 0;

			CHECK(hyb_sparse_ffn(c, pool, &f.b, act, xn, list, n, y, &st) == 0);
			CHECK_EQ_INT(st.n_gate, n);
			check_ref(&f, act, xn, list, n, NULL, y, "partial");
			CHECK(hyb_sparse_ffn(c, pool, &f.b, act, xn, NULL, 0, yall, NULL) == 0);
			for (uint32_t e = 0; e < E; e++)
				diff += fabs(y[e] - yall[e]);
			CHECK_MSG(diff > 1e-3, "partial list gave the full FFN");
		}
		ffn_free(&f);
	}
	hyb_threadpool_free(pool);
	hyb_sparse_ffn_ctx_free(c);
}

TEST(sparse_null_bundles_skip_their_group)
{
	const uint32_t E = 128, F = 200, GS = 64;
	struct hyb_sparse_ffn_ctx *c = hyb_sparse_ffn_ctx_new(E, F, 2);
	struct hyb_threadpool *pool = hyb_threadpool_new(2);
	const int present[4] = { 1, 0, 1, 0 };
	float xn[128], y[128];
	uint32_t list[60], n = 0;

	CHECK(c && pool);
	for (uint32_t i = 0; i < F; i += 7)
		list[n++] = i;
	for (size_t ti = 0; ti < N_TYPES; ti++) {
		struct ffn f;
		struct hyb_sparse_ffn_stats st;

		if (E % blck(all_types[ti]))
			continue; /* the K-quants: rows of 256 and more (sparse_kquant_*) */
		ffn_make(&f, all_types[ti], E, F, GS, 300 + ti);
		f.ptrs[1] = NULL;
		f.ptrs[3] = NULL;
		rand_x(xn, E);
		CHECK(hyb_sparse_ffn(c, pool, &f.b, HYB_ACT_SILU, xn, NULL, 0, y, &st) == 0);
		CHECK_EQ_INT(st.n_gate, 128);
		check_ref(&f, HYB_ACT_SILU, xn, NULL, 0, present, y, "absent groups, oracle");
		CHECK(hyb_sparse_ffn(c, pool, &f.b, HYB_ACT_RELU, xn, list, n, y, &st) == 0);
		check_ref(&f, HYB_ACT_RELU, xn, list, n, present, y, "absent groups, list");
		/* nothing here at all: zeros */
		for (uint32_t g = 0; g < 4; g++)
			f.ptrs[g] = NULL;
		y[5] = 1.0f;
		CHECK(hyb_sparse_ffn(c, pool, &f.b, HYB_ACT_SILU, xn, NULL, 0, y, &st) == 0);
		for (uint32_t e = 0; e < E; e++)
			CHECK(y[e] == 0.0f);
		CHECK_EQ_INT(st.n_gate, 0);
		ffn_free(&f);
	}
	hyb_threadpool_free(pool);
	hyb_sparse_ffn_ctx_free(c);
}

TEST(sparse_short_last_group)
{
	const uint32_t E = 64;
	struct hyb_sparse_ffn_ctx *c = hyb_sparse_ffn_ctx_new(E, 70, 1);
	float xn[64], y[64];
	const uint32_t tail[] = { 64, 66, 67, 69 };

	CHECK(c);
	for (size_t ti = 0; ti < N_TYPES; ti++) {
		struct ffn f;

		if (E % blck(all_types[ti]))
			continue; /* the K-quants: rows of 256 and more (sparse_kquant_*) */
		/* 70 = 64 + 6 */
		ffn_make(&f, all_types[ti], E, 70, 64, 400 + ti);
		rand_x(xn, E);
		CHECK(hyb_sparse_ffn(c, NULL, &f.b, HYB_ACT_SILU, xn, tail, 4, y, NULL) == 0);
		check_ref(&f, HYB_ACT_SILU, xn, tail, 4, NULL, y, "last group");
		CHECK(hyb_sparse_ffn(c, NULL, &f.b, HYB_ACT_DRELU, xn, NULL, 0, y, NULL) == 0);
		check_ref(&f, HYB_ACT_DRELU, xn, NULL, 0, NULL, y, "last group oracle");
		ffn_free(&f);
		/* one group larger than the layer */
		ffn_make(&f, all_types[ti], E, 70, 128, 500 + ti);
		CHECK(hyb_sparse_ffn(c, NULL, &f.b, HYB_ACT_RELU2, xn, tail, 4, y, NULL) == 0);
		check_ref(&f, HYB_ACT_RELU2, xn, tail, 4, NULL, y, "one short group");
		ffn_free(&f);
	}
	hyb_sparse_ffn_ctx_free(c);
}

TEST(sparse_empty_list_gives_zero)
{
	const uint32_t E = 64, F = 40;
	struct hyb_sparse_ffn_ctx *c = hyb_sparse_ffn_ctx_new(E, F, 2);
	struct hyb_threadpool *pool = hyb_threadpool_new(2);
	struct hyb_sparse_ffn_stats st;
	struct ffn f;
	float xn[64], y[64];
	uint32_t dummy = 3;

	CHECK(c && pool);
	ffn_make(&f, HYB_TYPE_Q8_0, E, F, 16, 600);
	rand_x(xn, E);
	for (uint32_t e = 0; e < E; e++)
		y[e] = NAN;
	CHECK(hyb_sparse_ffn(c, pool, &f.b, HYB_ACT_SILU, xn, &dummy, 0, y, &st) == 0);
	for (uint32_t e = 0; e < E; e++)
		CHECK(y[e] == 0.0f);
	CHECK_EQ_INT(st.n_gate, 0);
	CHECK_EQ_INT(st.n_nz, 0);
	ffn_free(&f);
	hyb_threadpool_free(pool);
	hyb_sparse_ffn_ctx_free(c);
}

/* Thread counts 1..4 (and no pool) agree with each other and the reference. */
TEST(sparse_thread_counts_agree)
{
	const uint32_t E = 256, F = 200;
	struct hyb_sparse_ffn_ctx *c = hyb_sparse_ffn_ctx_new(E, F, 4);
	float xn[256], y[5][256];
	uint32_t list[200], n = 0;

	CHECK(c);
	g_rng = 77;
	for (uint32_t i = 0; i < F; i++)
		if (rnd() % 2)
			list[n++] = i;
	for (size_t ti = 0; ti < N_TYPES; ti++) {
		struct ffn f;

		ffn_make(&f, all_types[ti], E, F, 32, 700 + ti);
		rand_x(xn, E);
		for (int part = 0; part < 2; part++) {
			const uint32_t *l = part ? list : NULL;
			double *ref = xmalloc(8 * E), *tol = xmalloc(8 * E);
			double xerr[256] = { 0 };
			float xs[256];

			CHECK(hyb_sparse_ffn(c, NULL, &f.b, HYB_ACT_RELU, xn, l, n, y[0], NULL) ==
			      0);
			for (int nt = 1; nt <= 4; nt++) {
				struct hyb_threadpool *pool = hyb_threadpool_new(nt);
				struct hyb_sparse_ffn_stats st;

				CHECK(pool);
				CHECK(hyb_sparse_ffn(c, pool, &f.b, HYB_ACT_RELU, xn, l, n, y[nt],
						     &st) == 0);
				CHECK_EQ_INT(st.n_gate, l ? n : F);
				hyb_threadpool_free(pool);
			}
			as_seen(f.type, xn, E, xs);
			reference(&f, HYB_ACT_RELU, xs, xerr, l, n, NULL, ref, tol);
			for (int nt = 1; nt <= 4; nt++)
				for (uint32_t e = 0; e < E; e++)
					CHECK_MSG(fabs(y[nt][e] - y[0][e]) <= 2 * tol[e],
						  "%s %d threads y[%u] %g vs %g",
						  hyb_type_name(f.type), nt, e, y[nt][e], y[0][e]);
			check_ref(&f, HYB_ACT_RELU, xn, l, n, NULL, y[4], "4 threads");
			free(ref);
			free(tol);
		}
		ffn_free(&f);
	}
	hyb_sparse_ffn_ctx_free(c);
}

/*
 * A PowerInfer file's FFN with its ggml's arithmetic (hyb_sparse_ffn_pi): h of
 * every neuron, 0 where unlisted, converted to the down rows' dot type (F16;
 * Q8_0 in blocks of 32 neurons for Q4_0 and Q8_0) before the axpy. Against a
 * double reference that rounds h so, it must be much closer than the
 * unrounded operator (a flip of one Q8_0 step, from kernel-order last bits,
 * moves one coefficient: tolerated); the same bits with 1 to 3 threads.
 */
TEST(sparse_pi_rounds_h_as_ggml)
{
	const uint32_t E = 256, F = 256, types[] = { HYB_TYPE_F16, HYB_TYPE_Q4_0, HYB_TYPE_Q8_0 };
	const struct hyb_cpu_kernels *ks = hyb_cpu_kernels(HYB_ISA_SCALAR);
	struct hyb_sparse_ffn_ctx *c = hyb_sparse_ffn_ctx_new(E, F, 3);
	float xn[256], xs[256], h[256], wr[256], y[4][256], yplain[256];
	uint32_t list[256], n = 0;

	CHECK(c);
	g_rng = 4242;
	for (uint32_t i = 0; i < F; i++)
		if (rnd() % 2)
			list[n++] = i;
	for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
		const uint32_t t = types[ti], vt = hyb_vec_dot_type(t);
		const uint64_t rb = hyb_row_bytes(t, E);
		uint8_t *w[3], *hq = xmalloc(4 * F + 64);
		struct hyb_ffn_bundles b = { .type = t, .n_embd = E, .n_ff = F, .group_size = 64,
					     .row_bytes = rb };
		struct hyb_sparse_ffn_stats st;
		double ref[256] = { 0 }, e_pi = 0, e_plain = 0;
		uint32_t nz = 0;

		for (int r = 0; r < 3; r++) {
			w[r] = xmalloc(rb * F);
			for (uint32_t i = 0; i < F; i++) {
				rand_x(xn, E);
				CHECK(hyb_quantize_row_ref(t, xn, w[r] + i * rb, E) == 0);
			}
			b.rows[r] = w[r];
		}
		rand_x(xn, E);
		as_seen(t, xn, E, xs);
		memset(h, 0, sizeof(h));
		for (uint32_t q = 0; q < n; q++) {
			double g = 0, u = 0;

			ks->dequantize[t](w[0] + list[q] * rb, wr, E);
			for (uint32_t e = 0; e < E; e++)
				g += (double)wr[e] * xs[e];
			ks->dequantize[t](w[1] + list[q] * rb, wr, E);
			for (uint32_t e = 0; e < E; e++)
				u += (double)wr[e] * xs[e];
			h[list[q]] = g > 0 ? (float)(g * u) : 0.0f;
		}
		ks->quantize_act[vt](h, hq, F);
		ks->dequantize[vt](hq, h, F);
		for (uint32_t i = 0; i < F; i++) {
			if (h[i] == 0.0f)
				continue;
			nz++;
			ks->dequantize[t](w[2] + i * rb, wr, E);
			for (uint32_t e = 0; e < E; e++)
				ref[e] += (double)h[i] * wr[e];
		}
		CHECK(hyb_sparse_ffn_pi(c, NULL, &b, HYB_ACT_RELU, xn, list, n, y[0], &st) == 0);
		CHECK_EQ_INT(st.n_gate, n);
		CHECK_MSG(st.n_nz + 2 >= nz && st.n_nz <= nz + 2, "%s: %llu down rows, %u in the reference",
			  hyb_type_name(t), (unsigned long long)st.n_nz, nz);
		for (int nt = 1; nt <= 3; nt++) {
			struct hyb_threadpool *pool = hyb_threadpool_new(nt);

			CHECK(pool);
			CHECK(hyb_sparse_ffn_pi(c, pool, &b, HYB_ACT_RELU, xn, list, n, y[nt], NULL) == 0);
			CHECK_MSG(!memcmp(y[nt], y[0], sizeof(float) * E), "%s: %d threads differ",
				  hyb_type_name(t), nt);
			hyb_threadpool_free(pool);
		}
		CHECK(hyb_sparse_ffn(c, NULL, &b, HYB_ACT_RELU, xn, list, n, yplain, NULL) == 0);
		for (uint32_t e = 0; e < E; e++) {
			e_pi += (y[0][e] - ref[e]) * (y[0][e] - ref[e]);
			e_plain += (yplain[e] - ref[e]) * (yplain[e] - ref[e]);
		}
		printf("    %s: distance to ggml's rounding %.3g, unrounded %.3g\n", hyb_type_name(t),
		       sqrt(e_pi), sqrt(e_plain));
		CHECK_MSG(sqrt(e_pi) < 0.3 * sqrt(e_plain), "%s: rounded %g, unrounded %g",
			  hyb_type_name(t), sqrt(e_pi), sqrt(e_plain));
		/* bad input: bundles, and n_ff not a multiple of the Q8_0 block */
		if (t != HYB_TYPE_F16) {
			b.n_ff = F - 16;
			CHECK(hyb_sparse_ffn_pi(c, NULL, &b, HYB_ACT_RELU, xn, list, 0, y[1], NULL) == -1);
			CHECK(strstr(hyb_sparse_ffn_error(c), "multiple of the Q8_0 block"));
			b.n_ff = F;
		}
		for (int r = 0; r < 3; r++)
			free(w[r]);
		free(hq);
	}
	{
		struct ffn f;

		ffn_make(&f, HYB_TYPE_Q4_0, E, F, 64, 99);
		CHECK(hyb_sparse_ffn_pi(c, NULL, &f.b, HYB_ACT_RELU, xn, list, n, y[0], NULL) == -1);
		CHECK(strstr(hyb_sparse_ffn_error(c), "a file's own rows"));
		ffn_free(&f);
	}
	hyb_sparse_ffn_ctx_free(c);
}

/* The bundle layout is plan.h's: gate, up, down-transposed rows per group, permuted. */
TEST(sparse_bundles_layout)
{
	const uint32_t E = 32, F = 10, GS = 4;
	struct ffn f;

	ffn_make(&f, HYB_TYPE_F32, E, F, GS, 800);
	for (uint32_t i = 0; i < F; i++) {
		const uint32_t g = i / GS, l = i % GS, ng = F - g * GS < GS ? F - g * GS : GS;
		const float *base = (const float *)f.data + (size_t)3 * g * GS * E;
		const uint32_t src = (uint32_t)f.perm[i];

		CHECK(f.ptrs[g] == (const void *)base);
		for (uint32_t e = 0; e < E; e++) {
			CHECK(base[l * E + e] == f.gate[src * E + e]);
			CHECK(base[(ng + l) * E + e] == f.up[src * E + e]);
			CHECK(base[(2 * ng + l) * E + e] == f.down[e * F + src]);
		}
	}
	ffn_free(&f);
}

TEST(sparse_bad_arguments_fail_cleanly)
{
	const uint32_t E = 64, F = 40;
	struct hyb_sparse_ffn_ctx *c = hyb_sparse_ffn_ctx_new(E, F, 2);
	struct ffn f;
	struct hyb_ffn_bundles b;
	float xn[64], y[64];
	const uint32_t oob[] = { 1, 40 }, unsorted[] = { 5, 3 }, dup[] = { 4, 4 };
	char err[128];
	int32_t perm[40];

	CHECK(c);
	CHECK(hyb_sparse_ffn_ctx_new(0, 10, 1) == NULL);
	ffn_make(&f, HYB_TYPE_Q8_0, E, F, 16, 900);
	rand_x(xn, E);
	for (uint32_t e = 0; e < E; e++)
		y[e] = 42.0f;
#define BAD(expr)                                                                           \
	do {                                                                                \
		CHECK_EQ_INT((expr), -1);                                                   \
		CHECK(hyb_sparse_ffn_error(c)[0] != 0);                                     \
		for (uint32_t e_ = 0; e_ < E; e_++)                                         \
			CHECK(y[e_] == 42.0f);                                              \
	} while (0)
	BAD(hyb_sparse_ffn(c, NULL, &f.b, HYB_ACT_SILU, xn, oob, 2, y, NULL));
	BAD(hyb_sparse_ffn(c, NULL, &f.b, HYB_ACT_SILU, xn, unsorted, 2, y, NULL));
	BAD(hyb_sparse_ffn(c, NULL, &f.b, HYB_ACT_SILU, xn, dup, 2, y, NULL));
	BAD(hyb_sparse_ffn(c, NULL, &f.b, (enum hyb_ffn_act)9, xn, NULL, 0, y, NULL));
	BAD(hyb_sparse_ffn(c, NULL, NULL, HYB_ACT_SILU, xn, NULL, 0, y, NULL));
	BAD(hyb_sparse_ffn(c, NULL, &f.b, HYB_ACT_SILU, NULL, NULL, 0, y, NULL));
	b = f.b;
	b.type = HYB_TYPE_Q4_K; /* rows of 64: not a whole super-block */
	BAD(hyb_sparse_ffn(c, NULL, &b, HYB_ACT_SILU, xn, NULL, 0, y, NULL));
	CHECK_MSG(strstr(hyb_sparse_ffn_error(c), "block size (256)"), "%s",
		  hyb_sparse_ffn_error(c));
	b.type = HYB_TYPE_BF16; /* no sparse kernels: refused by name, with the list */
	BAD(hyb_sparse_ffn(c, NULL, &b, HYB_ACT_SILU, xn, NULL, 0, y, NULL));
	CHECK_MSG(strstr(hyb_sparse_ffn_error(c), "weight type BF16 not supported") &&
		  strstr(hyb_sparse_ffn_error(c), "Q4_1") && strstr(hyb_sparse_ffn_error(c), "Q6_K"),
		  "%s", hyb_sparse_ffn_error(c));
	CHECK(!hyb_sparse_type_ok(HYB_TYPE_BF16) && !hyb_sparse_type_ok(HYB_TYPE_Q8_K) &&
	      !hyb_sparse_type_ok(HYB_TYPE_COUNT));
	for (size_t ti = 0; ti < N_TYPES; ti++)
		CHECK(hyb_sparse_type_ok(all_types[ti]));
	b.type = 1000;
	BAD(hyb_sparse_ffn(c, NULL, &b, HYB_ACT_SILU, xn, NULL, 0, y, NULL));
	b = f.b;
	b.n_embd = 48; /* not a multiple of 32 */
	BAD(hyb_sparse_ffn(c, NULL, &b, HYB_ACT_SILU, xn, NULL, 0, y, NULL));
	b = f.b;
	b.row_bytes += 2;
	BAD(hyb_sparse_ffn(c, NULL, &b, HYB_ACT_SILU, xn, NULL, 0, y, NULL));
	b = f.b;
	b.n_ff = F + 1; /* beyond the context */
	BAD(hyb_sparse_ffn(c, NULL, &b, HYB_ACT_SILU, xn, NULL, 0, y, NULL));
	b = f.b;
	b.group_size = 0;
	BAD(hyb_sparse_ffn(c, NULL, &b, HYB_ACT_SILU, xn, NULL, 0, y, NULL));
	b = f.b;
	b.bundle = NULL;
	BAD(hyb_sparse_ffn(c, NULL, &b, HYB_ACT_SILU, xn, NULL, 0, y, NULL));
	CHECK_EQ_INT(hyb_sparse_ffn(NULL, NULL, &f.b, HYB_ACT_SILU, xn, NULL, 0, y, NULL), -1);
#undef BAD
	/* a good call clears the error */
	CHECK(hyb_sparse_ffn(c, NULL, &f.b, HYB_ACT_SILU, xn, NULL, 0, y, NULL) == 0);
	CHECK(hyb_sparse_ffn_error(c)[0] == 0);

	/* the builder */
	for (uint32_t i = 0; i < F; i++)
		perm[i] = (int32_t)i;
	perm[3] = 5; /* 5 twice */
	CHECK(hyb_bundles_build(HYB_TYPE_Q8_0, E, F, 16, f.gate, f.up, f.down, perm, f.data, err,
				sizeof(err)) == -1);
	CHECK(strstr(err, "perm") != NULL);
	perm[3] = 40;
	CHECK(hyb_bundles_build(HYB_TYPE_Q8_0, E, F, 16, f.gate, f.up, f.down, perm, f.data, err,
				sizeof(err)) == -1);
	perm[3] = -1;
	CHECK(hyb_bundles_build(HYB_TYPE_Q8_0, E, F, 16, f.gate, f.up, f.down, perm, f.data, err,
				sizeof(err)) == -1);
	CHECK(hyb_bundles_build(HYB_TYPE_Q8_0, 48, F, 16, f.gate, f.up, f.down, NULL, f.data, err,
				sizeof(err)) == -1);
	CHECK(hyb_bundles_build(HYB_TYPE_Q8_0, E, F, 0, f.gate, f.up, f.down, NULL, f.data, err,
				sizeof(err)) == -1);
	CHECK(hyb_bundles_build(HYB_TYPE_Q8_K, 256, 1, 1, f.gate, f.up, f.down, NULL, f.data, err,
				sizeof(err)) == -1);
	CHECK(hyb_bundles_build(HYB_TYPE_Q8_0, E, F, 16, NULL, f.up, f.down, NULL, f.data, NULL,
				0) == -1);
	CHECK(hyb_bundles_bytes(HYB_TYPE_Q4_0, 48, 10) == 0);
	CHECK(hyb_bundles_view(&b, HYB_TYPE_Q4_0, 48, 10, 4, f.data, f.ptrs) == -1);
	CHECK(hyb_bundles_view(&b, HYB_TYPE_Q4_0, 64, 10, 0, f.data, f.ptrs) == -1);
	CHECK(hyb_sparse_ffn_set_isa(c, HYB_ISA_COUNT) == -1);
	ffn_free(&f);
	hyb_sparse_ffn_ctx_free(c);
}

/*
 * The threaded operators give the same bits on every call with the same
 * thread count, whichever thread gets to which neurons first: every float
 * sum is in a fixed order (the sparse operator's units each add into their
 * own partial, summed in unit order; down_t splits its rows statically).
 * Many back-to-back calls on 3 threads keep every worker awake and racing.
 */
TEST(sparse_same_bits_every_call)
{
	const uint32_t E = 256, F = 4096, GS = 32, CALLS = 60;
	struct hyb_threadpool *pool = hyb_threadpool_new(3);
	struct hyb_sparse_ffn_ctx *c = hyb_sparse_ffn_ctx_new(E, F, 3);
	struct hyb_ffn_plan_scratch *sc;
	struct hyb_model m;
	struct ffn f;
	float *xn = xmalloc(4 * E), *y0 = xmalloc(4 * E), *y = xmalloc(4 * E);
	float *act = xmalloc(4 * F);
	uint32_t *list = xmalloc(4 * F), n = 0;

	CHECK(pool && c);
	memset(&m, 0, sizeof(m));
	m.hp.n_embd = E;
	sc = hyb_ffn_plan_scratch_new(&m, 1, 3);
	CHECK(sc);
	ffn_make(&f, HYB_TYPE_Q8_0, E, F, GS, 4242);
	rand_x(xn, E);
	for (uint32_t i = 0; i < F; i++) {
		if (rnd() % 3 == 0)
			list[n++] = i;
		act[i] = rnd() % 4 ? 0.0f : urand();
	}
	/* the operator over a list, over every neuron, and a PowerInfer down_t */
	for (int kind = 0; kind < 3; kind++) {
		const struct hyb_weight dt = { .type = f.type, .ne0 = E, .ne1 = F,
					       .row_bytes = f.b.row_bytes, .data = f.data };

		for (uint32_t k = 0; k < CALLS; k++) {
			float *out = k ? y : y0;

			if (kind == 2)
				hyb_ffn_down_t(pool, sc, &dt, act, 1, out);
			else
				CHECK(hyb_sparse_ffn(c, pool, &f.b, HYB_ACT_RELU, xn,
						     kind ? NULL : list, n, out, NULL) == 0);
			CHECK_MSG(!k || !memcmp(y, y0, 4 * E), "%s: call %u differs from call 0",
				  kind == 2 ? "down_t" : kind ? "every neuron" : "list", k);
		}
		/* the operator's units do not depend on the thread count: one thread agrees */
		if (kind < 2) {
			CHECK(hyb_sparse_ffn(c, NULL, &f.b, HYB_ACT_RELU, xn, kind ? NULL : list, n,
					     y, NULL) == 0);
			CHECK_MSG(!memcmp(y, y0, 4 * E), "%s: 1 thread differs from 3",
				  kind ? "every neuron" : "list");
		}
	}
	ffn_free(&f);
	hyb_ffn_plan_scratch_free(sc);
	hyb_sparse_ffn_ctx_free(c);
	hyb_threadpool_free(pool);
	free(xn);
	free(y0);
	free(y);
	free(act);
	free(list);
}
