// SPDX-License-Identifier: MIT
/*
 * llama.cpp's vector primitives in the kernel tables (dot_f16, mad_f16,
 * scale_f16, gemm_acc, soft_max, swiglu): every ISA level against the
 * scalar references bit for bit, and against llama.cpp's own functions.
 *
 * Golden hashes: libggml-cpu's ggml_vec_dot_f16, ggml_vec_swiglu_f32 and
 * ggml_vec_soft_max_f32 (llama.cpp CPU build, GGML_NATIVE, AVX-512 VNNI)
 * run on val() below for the lengths in `lens`, their outputs hashed in
 * order with FNV-1a 64 (soft_max: each y, then the returned double).
 * The scalar references reproduce that AVX-512 order, so they match on
 * any CPU; lengths are multiples of 16 where a leftover would call libm.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu_kernels.h"
#include "test.h"

#define G_DOT_F16 0x5f02ad1105365ae8ull
#define G_SWIGLU 0x860a58da38c524d2ull
#define G_SOFT_MAX 0x15ca04c8844596afull

static const int lens[] = { 16, 64, 80, 128, 200, 1000 };

static float val(uint32_t i, uint32_t seed)
{
	uint32_t h = (i + seed * 7919u) * 2654435761u;

	h ^= h >> 15;
	h *= 2246822519u;
	h ^= h >> 13;
	return ((float)(h >> 8) * 0x1p-24f - 0.5f) * 8.0f;
}

struct fnv {
	uint64_t h;
};

static void mix(struct fnv *f, const void *p, size_t n)
{
	const uint8_t *b = p;

	for (size_t i = 0; i < n; i++) {
		f->h ^= b[i];
		f->h *= 0x100000001b3ull;
	}
}

static uint64_t hash_dot(const struct hyb_cpu_kernels *k)
{
	struct fnv f = { 0xcbf29ce484222325ull };
	uint16_t a[1000], b[1000];

	for (size_t t = 0; t < sizeof(lens) / sizeof(lens[0]); t++) {
		for (int i = 0; i < lens[t]; i++) {
			a[i] = hyb_f32_to_f16(val((uint32_t)i, 1));
			b[i] = hyb_f32_to_f16(val((uint32_t)i, 2));
		}
		const float s = k->dot_f16(lens[t], a, b);

		mix(&f, &s, 4);
	}
	return f.h;
}

static uint64_t hash_swiglu(const struct hyb_cpu_kernels *k)
{
	struct fnv f = { 0xcbf29ce484222325ull };
	float x[1000], g[1000], y[1000];

	for (size_t t = 0; t < sizeof(lens) / sizeof(lens[0]); t++) {
		const int n = lens[t] / 16 * 16;

		for (int i = 0; i < n; i++) {
			x[i] = val((uint32_t)i, 3) * 4;
			g[i] = val((uint32_t)i, 4);
		}
		k->swiglu(n, y, x, g);
		mix(&f, y, sizeof(float) * (size_t)n);
	}
	return f.h;
}

static uint64_t hash_soft_max(const struct hyb_cpu_kernels *k)
{
	struct fnv f = { 0xcbf29ce484222325ull };
	float x[1000], y[1000];

	for (size_t t = 0; t < sizeof(lens) / sizeof(lens[0]); t++) {
		const int n = lens[t] / 16 * 16;
		float mx = -1e30f;

		for (int i = 0; i < n; i++) {
			x[i] = val((uint32_t)i, 5) * 30;
			mx = x[i] > mx ? x[i] : mx;
		}
		const double sum = k->soft_max(n, y, x, mx);

		mix(&f, y, sizeof(float) * (size_t)n);
		mix(&f, &sum, 8);
	}
	return f.h;
}

TEST(vec_matches_llama)
{
	for (int isa = 0; isa < HYB_ISA_COUNT; isa++) {
		const struct hyb_cpu_kernels *k = hyb_cpu_kernels((enum hyb_isa)isa);

		if (!k)
			continue;
		CHECK_MSG(hash_dot(k) == G_DOT_F16, "%s: dot_f16 differs from llama.cpp's", k->name);
		CHECK_MSG(hash_swiglu(k) == G_SWIGLU, "%s: swiglu differs", k->name);
		CHECK_MSG(hash_soft_max(k) == G_SOFT_MAX, "%s: soft_max differs", k->name);
	}
}

/* the rest, SIMD against scalar, odd lengths and saturating inputs included */
TEST(vec_simd_matches_ref)
{
	const struct hyb_cpu_kernels *s = hyb_cpu_kernels(HYB_ISA_SCALAR);
	static const int ns[] = { 1, 5, 15, 16, 17, 63, 64, 65, 80, 127, 128, 200 };
	uint16_t a[256], b[256], ya[256], yb[256];
	float x[256], g[256], fa[256], fb[256];
	float ca[8 * 72], cb[8 * 72], am[8 * 64], bm[64 * 72];
	int levels = 0;

	for (int isa = 1; isa < HYB_ISA_COUNT; isa++) {
		const struct hyb_cpu_kernels *k = hyb_cpu_kernels((enum hyb_isa)isa);

		if (!k)
			continue;
		levels++;
		for (size_t t = 0; t < sizeof(ns) / sizeof(ns[0]); t++) {
			const int n = ns[t];
			const float v = val((uint32_t)n, 9);

			for (int i = 0; i < n; i++) {
				a[i] = hyb_f32_to_f16(val((uint32_t)i, 6));
				b[i] = hyb_f32_to_f16(val((uint32_t)i, 7));
				/* exp arguments up to +-240: both saturations */
				x[i] = val((uint32_t)i, 8) * (i % 7 ? 4.0f : 60.0f);
				g[i] = val((uint32_t)i, 10);
			}
			const float d0 = s->dot_f16(n, a, b), d1 = k->dot_f16(n, a, b);

			CHECK_MSG(!memcmp(&d0, &d1, 4), "%s dot_f16 n %d: %.9g vs %.9g", k->name, n,
				  d1, d0);
			memcpy(ya, b, sizeof(uint16_t) * n);
			memcpy(yb, b, sizeof(uint16_t) * n);
			s->mad_f16(n, ya, a, v);
			k->mad_f16(n, yb, a, v);
			CHECK_MSG(!memcmp(ya, yb, sizeof(uint16_t) * n), "%s mad_f16 n %d", k->name, n);
			s->scale_f16(n, ya, v);
			k->scale_f16(n, yb, v);
			CHECK_MSG(!memcmp(ya, yb, sizeof(uint16_t) * n), "%s scale_f16 n %d", k->name, n);
			s->swiglu(n, fa, x, g);
			k->swiglu(n, fb, x, g);
			CHECK_MSG(!memcmp(fa, fb, sizeof(float) * n), "%s swiglu n %d", k->name, n);
			const double sa = s->soft_max(n, fa, x, 30.0f);
			const double sb = k->soft_max(n, fb, x, 30.0f);

			CHECK_MSG(sa == sb && !memcmp(fa, fb, sizeof(float) * n),
				  "%s soft_max n %d: sum %.17g vs %.17g", k->name, n, sb, sa);
		}
		/* simd_gemm shapes: partial rows and columns, accumulating into c */
		static const int cols[] = { 1, 16, 17, 40, 64, 72 };

		for (int m = 1; m <= 8; m += 3) {
			for (size_t ci = 0; ci < sizeof(cols) / sizeof(cols[0]); ci++) {
				const int nn = cols[ci], kk = 64;

				for (int i = 0; i < m * kk; i++)
					am[i] = val((uint32_t)i, 11);
				for (int i = 0; i < kk * nn; i++)
					bm[i] = val((uint32_t)i, 12);
				for (int i = 0; i < m * nn; i++)
					ca[i] = cb[i] = val((uint32_t)i, 13);
				s->gemm_acc(ca, am, bm, m, kk, nn);
				k->gemm_acc(cb, am, bm, m, kk, nn);
				CHECK_MSG(!memcmp(ca, cb, sizeof(float) * m * nn), "%s gemm_acc %dx%d",
					  k->name, m, nn);
			}
		}
	}
	if (!levels)
		SKIP("this CPU has no SIMD level to compare");
}

/* the reference exp is ggml_v_expf: within ~2 ulp of exp, 0 and inf beyond */
TEST(vec_ref_expf_accuracy)
{
	const struct hyb_cpu_kernels *s = hyb_cpu_kernels(HYB_ISA_SCALAR);
	float xs[16], ys[16];

	/* 16 lanes at a time: the vector path, not libm's leftovers */
	for (float v = -87.0f; v <= 88.0f; v += 0.0137f) {
		for (int i = 0; i < 16; i++)
			xs[i] = v + 0.0005f * (float)i;
		s->soft_max(16, ys, xs, 0.0f);
		for (int i = 0; i < 16; i++) {
			const double e = exp((double)xs[i]);

			if (e > 3.4e38)
				CHECK_MSG(isinf(ys[i]), "exp(%g) should overflow, got %g", xs[i], ys[i]);
			else
				CHECK_MSG(fabs(ys[i] - e) <= 3e-7 * e, "v_expf(%g) = %.9g, exp %.9g",
					  xs[i], ys[i], e);
		}
	}
	for (int i = 0; i < 16; i++)
		xs[i] = i < 8 ? -200.0f : -INFINITY;
	s->soft_max(16, ys, xs, 0.0f);
	for (int i = 0; i < 16; i++)
		CHECK(ys[i] == 0.0f);
}

/*
 * The exponential of every SIMD level against the reference over the
 * whole range, through soft_max (exp(x)) and swiglu (exp(-x)): subnormal
 * results (x below -87), both saturations (|n| > 192), infinities, NaN.
 */
TEST(vec_simd_expf_sweep)
{
	const struct hyb_cpu_kernels *s = hyb_cpu_kernels(HYB_ISA_SCALAR);
	enum { N = 2048 };
	static float x[N], g[N], ya[N], yb[N];
	int levels = 0;

	for (int i = 0; i < N; i++) {
		x[i] = -150.0f + 300.0f * (float)i / (float)N + 0.001f * (float)(i % 13);
		g[i] = 1.0f;
	}
	x[5] = -INFINITY;
	x[6] = INFINITY;
	x[7] = NAN;
	x[8] = -140.0f;  /* 2^-202: beyond the saturation */
	x[9] = -103.5f;  /* the smallest subnormals */
	for (int isa = 1; isa < HYB_ISA_COUNT; isa++) {
		const struct hyb_cpu_kernels *k = hyb_cpu_kernels((enum hyb_isa)isa);

		if (!k)
			continue;
		levels++;
		const double sa = s->soft_max(N, ya, x, 0.0f), sb = k->soft_max(N, yb, x, 0.0f);

		CHECK_MSG(!memcmp(ya, yb, sizeof(ya)), "%s soft_max sweep", k->name);
		CHECK_MSG(!memcmp(&sa, &sb, sizeof(sa)), "%s soft_max sweep sum", k->name);
		s->swiglu(N, ya, x, g);
		k->swiglu(N, yb, x, g);
		CHECK_MSG(!memcmp(ya, yb, sizeof(ya)), "%s swiglu sweep", k->name);
	}
	if (!levels)
		SKIP("this CPU has no SIMD level to compare");
}

/* geglu's table lookup: every level as the scalar one, bounds (+-10) and odd lengths included */
TEST(vec_geglu_simd_matches_ref)
{
	const struct hyb_cpu_kernels *s = hyb_cpu_kernels(HYB_ISA_SCALAR);
	static uint16_t table[(1 << 16) + 1];
	static const int ns[] = { 1, 15, 16, 17, 64, 100, 1000 };
	float x[1000], g[1000], fa[1000], fb[1000];

	for (uint32_t i = 0; i < (1u << 16) + 1; i++)
		table[i] = hyb_f32_to_f16(val(i, 11) * 8.0f);
	for (int i = 0; i < 1000; i++) {
		/* -12..12, the bounds themselves, and values that round to F16 ties */
		x[i] = i % 50 == 0 ? (i % 100 ? 10.0f : -10.0f) : val((uint32_t)i, 12) * 3.0f;
		if (i % 7 == 3)
			x[i] = 1.0f + (float)(2 * (i % 64) + 1) * 0x1p-11f;
		g[i] = val((uint32_t)i, 13);
	}
	for (int isa = 1; isa < HYB_ISA_COUNT; isa++) {
		const struct hyb_cpu_kernels *k = hyb_cpu_kernels((enum hyb_isa)isa);

		for (size_t t = 0; k && t < sizeof(ns) / sizeof(ns[0]); t++) {
			s->geglu(ns[t], fa, x, g, table);
			k->geglu(ns[t], fb, x, g, table);
			CHECK_MSG(!memcmp(fa, fb, sizeof(float) * ns[t]), "%s geglu n %d", k->name,
				  ns[t]);
		}
	}
}
