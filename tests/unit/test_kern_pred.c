// SPDX-License-Identifier: MIT
/*
 * The predictor and grouping kernels of kernels/cpu (pred_*.c, popcount_*.c)
 * on every ISA level this CPU has, against the scalar level on random
 * inputs. Exact where the levels do the same operations: and_popcount is
 * integer; panel_gemm's SIMD levels are one fused multiply-add per k in k
 * order, so they equal an fmaf() loop bit for bit. The rest fuse where the
 * scalar level rounds twice, so they are held to a bound on that rounding:
 * 3 units of 2^-24 per term of the magnitude of the terms summed.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "test.h"

static uint64_t g_rng;

static uint64_t rnd64(void)
{
	g_rng = g_rng * 6364136223846793005ULL + 1442695040888963407ULL;
	return g_rng ^ (g_rng >> 29);
}

/* uniform in [-1, 1) */
static float urand(void)
{
	return (float)(rnd64() >> 40) * 0x1p-23f - 1.0f;
}

static void *xmalloc(size_t n)
{
	void *p = aligned_alloc(64, (n + 63) / 64 * 64);

	CHECK_MSG(p, "out of memory (%zu bytes)", n);
	return p;
}

/* the levels past scalar this CPU runs, in order; returns their count */
static int simd_levels(const struct hyb_cpu_kernels **out)
{
	int n = 0;

	for (int isa = HYB_ISA_SCALAR + 1; isa < HYB_ISA_COUNT; isa++)
		if (hyb_cpu_kernels((enum hyb_isa)isa))
			out[n++] = hyb_cpu_kernels((enum hyb_isa)isa);
	return n;
}

TEST(kern_pred_tables)
{
	const struct hyb_cpu_kernels *s = hyb_cpu_kernels(HYB_ISA_SCALAR);
	const struct hyb_cpu_kernels *a2 = hyb_cpu_kernels(HYB_ISA_AVX2);
	const struct hyb_cpu_kernels *a5 = hyb_cpu_kernels(HYB_ISA_AVX512);
	const struct hyb_cpu_kernels *vn = hyb_cpu_kernels(HYB_ISA_AVX512_VNNI);

	for (int isa = 0; isa < HYB_ISA_COUNT; isa++) {
		const struct hyb_cpu_kernels *k = hyb_cpu_kernels((enum hyb_isa)isa);

		if (k)
			CHECK_MSG(k->panel_gemm && k->fc2_sparse && k->adam && k->and_popcount,
				  "%s: a predictor kernel is missing", k->name);
	}
	/* AVX2 has its own matmuls and popcount but the scalar Adam */
	if (a2)
		CHECK(a2->panel_gemm != s->panel_gemm && a2->fc2_sparse != s->fc2_sparse &&
		      a2->and_popcount != s->and_popcount && a2->adam == s->adam);
	if (a5)
		CHECK(a5->panel_gemm != a2->panel_gemm && a5->fc2_sparse != a2->fc2_sparse &&
		      a5->and_popcount != a2->and_popcount && a5->adam != s->adam);
	/* VNNI adds nothing here: AVX-512's */
	if (vn)
		CHECK(vn->panel_gemm == a5->panel_gemm && vn->fc2_sparse == a5->fc2_sparse &&
		      vn->adam == a5->adam && vn->and_popcount == a5->and_popcount);
}

TEST(kern_pred_env_scalar)
{
	const struct hyb_cpu_kernels *s, *b;

	/* each test runs in a fresh process: the choice is made on first use */
	setenv("HYB_ISA", "scalar", 1);
	s = hyb_cpu_kernels(HYB_ISA_SCALAR);
	b = hyb_cpu_best();
	CHECK_EQ_INT(b->isa, HYB_ISA_SCALAR);
	CHECK(b->panel_gemm == s->panel_gemm && b->fc2_sparse == s->fc2_sparse &&
	      b->adam == s->adam && b->and_popcount == s->and_popcount);
}

/* ---- panel_gemm ---- */

struct panel_case {
	int64_t k, nc;
	unsigned nr;
	int transposed, acc;
	float *ap, *x, *y0;
	size_t xc, xk, ys;
};

static void panel_make(struct panel_case *t)
{
	const size_t nx = (size_t)(t->nc + 3) * (size_t)(t->k + 3);

	t->ap = xmalloc((size_t)t->k * HYB_PANEL * sizeof(float));
	t->x = xmalloc(nx * sizeof(float));
	t->ys = t->nr + 5;
	t->y0 = xmalloc((size_t)t->nc * t->ys * sizeof(float));
	for (int64_t q = 0; q < t->k; q++)
		for (unsigned i = 0; i < HYB_PANEL; i++)
			t->ap[q * HYB_PANEL + i] = i < t->nr ? urand() : 0.0f;
	for (size_t q = 0; q < nx; q++)
		t->x[q] = urand();
	for (size_t q = 0; q < (size_t)t->nc * t->ys; q++)
		t->y0[q] = urand();
	/* column-major X (a row of A) or row-major (a column of A^T), as the trainer passes them */
	t->xc = t->transposed ? 1 : (size_t)t->k + 3;
	t->xk = t->transposed ? (size_t)t->nc + 3 : 1;
}

static void panel_free(struct panel_case *t)
{
	free(t->ap);
	free(t->x);
	free(t->y0);
}

/* panel_gemm of kt on a copy of y0 */
static float *panel_run(const struct hyb_cpu_kernels *kt, const struct panel_case *t)
{
	float *y = xmalloc((size_t)t->nc * t->ys * sizeof(float));

	memcpy(y, t->y0, (size_t)t->nc * t->ys * sizeof(float));
	kt->panel_gemm(t->k, t->ap, t->x, t->xc, t->xk, y, t->ys, t->nr, t->acc, t->nc);
	return y;
}

/* rows from nr on are never written: they belong to the next panel's outputs */
static void panel_check_rest(const char *name, const struct panel_case *t, const float *y)
{
	for (int64_t c = 0; c < t->nc; c++)
		for (size_t i = t->nr; i < t->ys; i++)
			CHECK_MSG(y[c * t->ys + i] == t->y0[c * t->ys + i],
				  "%s: panel_gemm wrote row %zu of %u", name, i, t->nr);
}

/* y(c, i) fused in k order, as the SIMD levels compute it; *mag: the sum of the terms' sizes */
static float panel_fused(const struct panel_case *t, int64_t c, unsigned i, double *mag)
{
	float s = t->acc ? t->y0[c * t->ys + i] : 0.0f;

	*mag = fabsf(s);
	for (int64_t q = 0; q < t->k; q++) {
		const float w = t->ap[q * HYB_PANEL + i], xv = t->x[c * t->xc + q * t->xk];

		s = fmaf(w, xv, s);
		*mag += fabs((double)w * xv);
	}
	return s;
}

static void panel_check(const struct hyb_cpu_kernels *kt, const struct panel_case *t,
			const float *ref)
{
	float *y = panel_run(kt, t);

	panel_check_rest(kt->name, t, y);
	for (int64_t c = 0; c < t->nc; c++)
		for (unsigned i = 0; i < t->nr; i++) {
			double mag;
			const float fused = panel_fused(t, c, i, &mag);
			const float got = y[c * t->ys + i], want = ref[c * t->ys + i];

			/* k fused roundings against 2k + 1: within 3k of the terms' size */
			CHECK_MSG(fabs((double)got - want) <= 3.0 * (double)t->k * 0x1p-24 * mag,
				  "%s: k %lld nr %u: y[%lld][%u] %.9g, scalar %.9g", kt->name,
				  (long long)t->k, t->nr, (long long)c, i, got, want);
			CHECK_MSG(got == fused, "%s: k %lld nr %u: y[%lld][%u] %.9g, fused %.9g",
				  kt->name, (long long)t->k, t->nr, (long long)c, i, got, fused);
		}
	free(y);
}

TEST(kern_pred_panel_gemm_vs_ref)
{
	static const int64_t ks[] = { 1, 7, 64, 256 };
	static const unsigned nrs[] = { 1, 5, 16, 17, 31, 32 };
	static const int64_t ncs[] = { 1, 2, 3, 4, 11, 12, 13, 25, 40 };
	const struct hyb_cpu_kernels *s = hyb_cpu_kernels(HYB_ISA_SCALAR);
	const struct hyb_cpu_kernels *lv[HYB_ISA_COUNT];
	const int n_lv = simd_levels(lv);

	g_rng = 1;
	for (size_t a = 0; a < sizeof(ks) / sizeof(ks[0]); a++)
		for (size_t b = 0; b < sizeof(nrs) / sizeof(nrs[0]); b++)
			for (size_t c = 0; c < sizeof(ncs) / sizeof(ncs[0]); c++) {
				struct panel_case t = { .k = ks[a], .nr = nrs[b], .nc = ncs[c],
							.transposed = (int)(c & 1),
							.acc = (int)((a + b) & 1) };
				float *ref;

				panel_make(&t);
				ref = panel_run(s, &t);
				panel_check_rest(s->name, &t, ref);
				for (int l = 0; l < n_lv; l++)
					panel_check(lv[l], &t, ref);
				free(ref);
				panel_free(&t);
			}
}

/* ---- fc2_sparse ---- */

struct fc2_case {
	size_t n_out;
	const uint16_t *w;
	const float *b, *h;
	const uint32_t *nz;
	uint32_t n;
	long lo, hi;
};

/* kt's logits from the biases against the scalar level's: n + 1 terms, each rounded <= 3 times */
static void fc2_check(const struct hyb_cpu_kernels *kt, const struct fc2_case *f, float *got,
		      const float *ref)
{
	memcpy(got, f->b, f->n_out * sizeof(float));
	kt->fc2_sparse(got, f->w, f->n_out, f->h, f->nz, f->n, f->lo, f->hi);
	for (long c = 0; c < f->lo; c++) /* other threads' columns */
		CHECK_MSG(got[c] == f->b[c], "%s: fc2_sparse wrote lg[%ld] outside [%ld, %ld)",
			  kt->name, c, f->lo, f->hi);
	for (long c = f->lo; c < f->hi; c++) {
		double mag = fabsf(f->b[c]);

		for (uint32_t q = 0; q < f->n; q++)
			mag += fabs((double)f->h[f->nz[q]] *
				    hyb_f16_to_f32(f->w[f->nz[q] * f->n_out + c]));
		CHECK_MSG(fabs((double)got[c] - ref[c]) <= 3.0 * (f->n + 1) * 0x1p-24 * mag,
			  "%s: fc2_sparse n_out %zu, %u units: lg[%ld] %.9g, scalar %.9g", kt->name,
			  f->n_out, f->n, c, got[c], ref[c]);
	}
}

TEST(kern_pred_fc2_sparse_vs_ref)
{
	static const size_t outs[] = { 1, 7, 16, 33, 100, 1000 };
	const struct hyb_cpu_kernels *s = hyb_cpu_kernels(HYB_ISA_SCALAR);
	const struct hyb_cpu_kernels *lv[HYB_ISA_COUNT];
	const int n_lv = simd_levels(lv);
	const uint32_t H = 40;

	g_rng = 2;
	for (size_t t = 0; t < sizeof(outs) / sizeof(outs[0]); t++) {
		const size_t n_out = outs[t];
		uint16_t *w = xmalloc(H * n_out * sizeof(*w));
		float *b = xmalloc(n_out * sizeof(float)), *h = xmalloc(H * sizeof(float));
		float *ref = xmalloc(n_out * sizeof(float)), *got = xmalloc(n_out * sizeof(float));
		uint32_t nz[40], n_nz = 0;

		for (size_t q = 0; q < H * n_out; q++)
			w[q] = hyb_f32_to_f16(urand());
		for (size_t q = 0; q < n_out; q++)
			b[q] = urand();
		for (uint32_t u = 0; u < H; u++) {
			h[u] = urand();
			if (h[u] > -0.3f) /* about 2/3 of the units */
				nz[n_nz++] = u;
		}
		/* no unit, 1..5 (the AVX-512 kernel takes 4 per pass), all */
		for (uint32_t step = 0; step <= 6; step++) {
			/* a column range of whole slices, as the thread split makes, and a tail */
			const struct fc2_case f = {
				.n_out = n_out, .w = w, .b = b, .h = h, .nz = nz,
				.n = step < 6 ? step : n_nz,
				.lo = n_out > 16 ? 16 : 0, .hi = (long)n_out,
			};

			memcpy(ref, b, n_out * sizeof(float));
			s->fc2_sparse(ref, w, n_out, h, nz, f.n, f.lo, f.hi);
			for (int l = 0; l < n_lv; l++)
				fc2_check(lv[l], &f, got, ref);
		}
		free(w);
		free(b);
		free(h);
		free(ref);
		free(got);
	}
}

/* ---- adam ---- */

struct adam_state {
	float *w, *g, *m, *v;
};

static void adam_alloc(struct adam_state *a, long n)
{
	a->w = xmalloc((size_t)n * sizeof(float));
	a->g = xmalloc((size_t)n * sizeof(float));
	a->m = xmalloc((size_t)n * sizeof(float));
	a->v = xmalloc((size_t)n * sizeof(float));
}

static void adam_copy(struct adam_state *d, const struct adam_state *s, long n)
{
	memcpy(d->w, s->w, (size_t)n * sizeof(float));
	memcpy(d->g, s->g, (size_t)n * sizeof(float));
	memcpy(d->m, s->m, (size_t)n * sizeof(float));
	memcpy(d->v, s->v, (size_t)n * sizeof(float));
}

static void adam_free(struct adam_state *a)
{
	free(a->w);
	free(a->g);
	free(a->m);
	free(a->v);
}

/*
 * One step of kt from s0 against the scalar step: m and v within two
 * roundings of their terms, w within the step those errors and a few more
 * roundings make (the denominator's v is kept well above 0).
 */
static void adam_check(const struct hyb_cpu_kernels *kt, const struct adam_state *s0,
		       const struct adam_state *ref, long lo, long hi, float lr, float c1,
		       float c2)
{
	struct adam_state a;

	adam_alloc(&a, hi);
	adam_copy(&a, s0, hi);
	kt->adam(a.w, a.g, a.m, a.v, lo, hi, lr, c1, c2);
	for (long i = lo; i < hi; i++) {
		const double g = s0->g[i];
		const double mb = 0x1p-23 * (0.9 * fabs(s0->m[i]) + 0.1 * fabs(g));
		const double vb = 0x1p-23 * (0.999 * s0->v[i] + 0.001 * g * g);
		const double den = sqrt((double)ref->v[i] * c2);
		const double d = fabs((double)ref->m[i]) * c1 / den;
		const double wb = lr * (mb * c1 / den + d * (vb / ref->v[i] + 0x1p-20)) +
				  0x1p-23 * fabs(ref->w[i]);

		CHECK_MSG(fabs((double)a.m[i] - ref->m[i]) <= mb,
			  "%s: adam m[%ld] %.9g, scalar %.9g", kt->name, i, a.m[i], ref->m[i]);
		CHECK_MSG(fabs((double)a.v[i] - ref->v[i]) <= vb,
			  "%s: adam v[%ld] %.9g, scalar %.9g", kt->name, i, a.v[i], ref->v[i]);
		CHECK_MSG(fabs((double)a.w[i] - ref->w[i]) <= wb,
			  "%s: adam w[%ld] %.9g, scalar %.9g", kt->name, i, a.w[i], ref->w[i]);
	}
	adam_free(&a);
}

TEST(kern_pred_adam_vs_ref)
{
	const long n = 203;
	const struct hyb_cpu_kernels *s = hyb_cpu_kernels(HYB_ISA_SCALAR);
	const struct hyb_cpu_kernels *lv[HYB_ISA_COUNT];
	const int n_lv = simd_levels(lv);
	struct adam_state s0, ref;

	g_rng = 3;
	adam_alloc(&s0, n);
	adam_alloc(&ref, n);
	for (int it = 1; it <= 4; it++) {
		const float lr = 1e-2f / (float)it;
		const float c1 = (float)(1.0 / (1.0 - pow(0.9, it)));
		const float c2 = (float)(1.0 / (1.0 - pow(0.999, it)));
		/* [lo, hi): a split over threads, masked tails of both ends */
		const long lo = it == 1 ? 0 : 3 * it, hi = n - (it & 1);

		for (long i = 0; i < n; i++) {
			s0.w[i] = urand();
			s0.g[i] = urand() * (it == 4 ? 1e-3f : 1.0f);
			s0.m[i] = urand() * 0.1f;
			s0.v[i] = 0.01f + 0.01f * fabsf(urand());
		}
		adam_copy(&ref, &s0, n);
		s->adam(ref.w, ref.g, ref.m, ref.v, lo, hi, lr, c1, c2);
		for (long i = 0; i < n; i++)
			if (i < lo || i >= hi)
				CHECK(ref.w[i] == s0.w[i] && ref.m[i] == s0.m[i]);
		for (int l = 0; l < n_lv; l++)
			adam_check(lv[l], &s0, &ref, lo, hi, lr, c1, c2);
	}
	adam_free(&s0);
	adam_free(&ref);
}

/* ---- and_popcount ---- */

/* set bits of a & b over W words, one bit at a time */
static uint32_t bits_and(const uint64_t *a, const uint64_t *b, uint32_t W)
{
	uint32_t n = 0;

	for (uint32_t w = 0; w < W; w++)
		for (uint64_t x = a[w] & b[w]; x; x &= x - 1)
			n++;
	return n;
}

TEST(kern_popcount_vs_ref)
{
	static const uint32_t Ws[] = { 1, 7, 8, 9, 64, 127, 128, 129, 256, 300 };
	const uint32_t n_cols = 24;
	const struct hyb_cpu_kernels *s = hyb_cpu_kernels(HYB_ISA_SCALAR);
	const struct hyb_cpu_kernels *lv[HYB_ISA_COUNT];
	const int n_lv = simd_levels(lv);
	uint32_t live[24], ref[24], got[24];

	g_rng = 4;
	for (size_t t = 0; t < sizeof(Ws) / sizeof(Ws[0]); t++) {
		const uint32_t W = Ws[t];
		uint64_t *a = xmalloc(W * sizeof(*a)), *cols = xmalloc(W * n_cols * sizeof(*a));
		uint32_t n = 0;

		/* densities from empty to full: full words test the byte counters' range */
		for (uint32_t w = 0; w < W; w++)
			a[w] = t & 1 ? ~0ull : rnd64();
		for (uint32_t c = 0; c < n_cols; c++)
			for (uint32_t w = 0; w < W; w++)
				cols[(size_t)c * W + w] = c % 4 == 0 ? ~0ull : c % 4 == 1 ? 0 :
							  c % 4 == 2 ? rnd64() & rnd64() : rnd64();
		for (uint32_t c = n_cols; c-- > 0;)
			if (c % 3)
				live[n++] = c;
		s->and_popcount(a, cols, W, live, n, ref);
		for (uint32_t j = 0; j < n; j++)
			CHECK_MSG(ref[j] == bits_and(a, cols + (size_t)live[j] * W, W),
				  "scalar: and_popcount W %u col %u: %u", W, live[j], ref[j]);
		for (int l = 0; l < n_lv; l++) {
			memset(got, 0xA5, sizeof(got));
			lv[l]->and_popcount(a, cols, W, live, n, got);
			CHECK_MSG(!memcmp(got, ref, n * sizeof(*ref)),
				  "%s: and_popcount W %u differs", lv[l]->name, W);
			CHECK(got[n] == 0xA5A5A5A5u);
		}
		free(a);
		free(cols);
	}
}

/*
 * The load-aware thresholds' passes (select_*.c): every level writes the
 * scalar level's lists, bins and counts exactly, on scores with every kind
 * of value (over and under 0, both infinities, NaN, beyond the outer bins,
 * bin edges), odd lengths, and boundary bins taken in part.
 */
TEST(kern_select_vs_ref)
{
	const struct hyb_cpu_kernels *s = hyb_cpu_kernels(HYB_ISA_SCALAR), *lv[HYB_ISA_COUNT];
	const int nl = simd_levels(lv);
	static const uint32_t lens[] = { 1, 15, 16, 17, 64, 100, 1000, 11008 };

	g_rng = 31;
	CHECK(s->sel_scan && s->sel_emit);
	for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
		const uint32_t n = lens[li], W = (n + 63) / 64;
		float *x = xmalloc(4ull * n);
		uint64_t *res = xmalloc(8ull * W);
		uint32_t *r[8], *g[8], c_r[4], c_g[4];

		for (int q = 0; q < 8; q++) {
			r[q] = xmalloc(4ull * (n + 16));
			g[q] = xmalloc(4ull * (n + 16));
		}
		for (uint32_t i = 0; i < n; i++) {
			const uint64_t u = rnd64() % 100;

			x[i] = u < 3 ? NAN : u < 5 ? -INFINITY : u < 7 ? INFINITY :
			       u < 10 ? (float)((int)(rnd64() % 64) - 32) / 32 : /* bin edges */
			       u < 15 ? urand() * 40 : urand() * 5;
		}
		for (uint32_t w = 0; w < W; w++)
			res[w] = rnd64() & rnd64();
		if (n % 64)
			res[W - 1] &= (1ull << (n % 64)) - 1;
		s->sel_scan(x, res, n, r[0], r[1], &c_r[0], r[2], r[3], &c_r[1], &c_r[2]);
		CHECK(c_r[0] > 0 || n < 64);
		for (int v = 0; v < nl; v++) {
			lv[v]->sel_scan(x, res, n, g[0], g[1], &c_g[0], g[2], g[3], &c_g[1], &c_g[2]);
			CHECK_MSG(c_g[0] == c_r[0] && c_g[1] == c_r[1] && c_g[2] == c_r[2],
				  "%s n %u: counts %u %u %u, scalar %u %u %u", lv[v]->name, n, c_g[0],
				  c_g[1], c_g[2], c_r[0], c_r[1], c_r[2]);
			CHECK(!memcmp(g[0], r[0], 4ull * c_r[0]) && !memcmp(g[1], r[1], 4ull * c_r[0]));
			CHECK(!memcmp(g[2], r[2], 4ull * c_r[1]) && !memcmp(g[3], r[3], 4ull * c_r[1]));
		}
		/* the bins the scan wrote are the shared rule's */
		for (uint32_t q = 0; q < c_r[0]; q++)
			CHECK(r[1][q] == hyb_sel_add_bin(x[r[0][q]]) && r[1][q] < HYB_SEL_BINS);
		for (uint32_t q = 0; q < c_r[1]; q++)
			CHECK(r[3][q] == hyb_sel_drop_bin(x[r[2][q]]) && r[3][q] < HYB_SEL_BINS);
		/* emits: nothing moved, all moved, boundary bins of the lists taken in part */
		for (int t = 0; t < 6; t++) {
			const int32_t ba = t == 0 ? HYB_SEL_BINS - 1 : t == 1 ? -1 :
					   c_r[0] ? (int32_t)r[1][rnd64() % c_r[0]] : 0;
			const int32_t bd = t == 0 ? 0 : t == 1 ? HYB_SEL_BINS :
					   c_r[1] ? (int32_t)r[3][rnd64() % c_r[1]] : 0;
			const uint32_t ka = t == 0 ? 0 : (uint32_t)(rnd64() % 4);
			const uint32_t kd = t == 0 ? 0 : (uint32_t)(rnd64() % 4);
			const uint32_t m = s->sel_emit(x, res, n, ba, ka, bd, kd, r[4]);

			if (t == 0) { /* the one threshold: exactly the scores over 0 */
				uint32_t want = 0;

				for (uint32_t i = 0; i < n; i++)
					want += x[i] > 0;
				CHECK_EQ_INT(m, want);
			}
			for (uint32_t q = 1; q < m; q++)
				CHECK(r[4][q] > r[4][q - 1]);
			for (int v = 0; v < nl; v++) {
				const uint32_t mg = lv[v]->sel_emit(x, res, n, ba, ka, bd, kd, g[4]);

				CHECK_MSG(mg == m && !memcmp(g[4], r[4], 4ull * m),
					  "%s n %u case %d: %u listed, scalar %u", lv[v]->name, n, t,
					  mg, m);
			}
		}
		for (int q = 0; q < 8; q++) {
			free(r[q]);
			free(g[q]);
		}
		free(x);
		free(res);
	}
}
