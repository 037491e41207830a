// SPDX-License-Identifier: MIT
/*
 * Scalar references of llama.cpp's vector primitives (see cpu_kernels.h):
 * they compute, lane by lane, what its AVX-512 build computes, so that the
 * SIMD versions can be checked against them bit for bit and a CPU without
 * AVX-512 still gets llama.cpp's numbers (slowly).
 *
 * fmaf() is a correctly rounded fused multiply-add, the same operation as
 * the vfmadd instructions ggml's intrinsics and its compiler emit.
 */
#include <math.h>

#include "cpu_internal.h"

/* _mm512_reduce_add_ps as GCC expands it: halves, quarters, then pairs */
static float hyb_ref_reduce16(const float s[16])
{
	float t8[8], t4[4];

	for (int i = 0; i < 8; i++)
		t8[i] = s[i + 8] + s[i];
	for (int i = 0; i < 4; i++)
		t4[i] = t8[i + 4] + t8[i];
	return (t4[2] + t4[0]) + (t4[3] + t4[1]);
}

/*
 * ggml_v_expf (AVX-512): exp(x) = 2^n * p(b) with n = round(x / ln 2) from
 * the 1.5 * 2^23 trick, b = x - n ln 2 in two steps, p a degree-5
 * polynomial; |n| > 192 saturates to 0 or inf.
 */
static float hyb_ref_expf(float x)
{
	const float r = 0x1.8p23f;
	const float z = fmaf(x, 0x1.715476p+0f, r);
	const float n = z - r;
	const float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x));
	const float u = b * b;
	const float j = fmaf(fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u,
				  fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
			     u, fmaf(0x1.ffffecp-1f, b, 1.0f));

	if (n != n)
		return n;
	if (fabsf(n) > 192)
		return n <= 0 ? 0.0f : INFINITY;
	return ldexpf(j, (int)n); /* vscalefps: exact but for under/overflow, RNE there */
}

/* ggml_v_silu: x / (1 + exp(0 - x)) */
static float silu_v(float x)
{
	return x / (1.0f + hyb_ref_expf(0.0f - x));
}

static float dot_f16(int64_t n, const uint16_t *x, const uint16_t *y)
{
	/* four 16-lane accumulators over steps of 64 (GGML_F16_STEP) */
	float acc[4][16] = { { 0 } };
	const int64_t np = n & ~(int64_t)63;
	double s;

	for (int64_t i = 0; i < np; i += 64)
		for (int j = 0; j < 4; j++)
			for (int l = 0; l < 16; l++)
				acc[j][l] = fmaf(hyb_f16_to_f32(x[i + 16 * j + l]),
						 hyb_f16_to_f32(y[i + 16 * j + l]), acc[j][l]);
	for (int l = 0; l < 16; l++) {
		acc[0][l] = acc[0][l] + acc[2][l];
		acc[1][l] = acc[1][l] + acc[3][l];
	}
	for (int l = 0; l < 16; l++)
		acc[0][l] = acc[0][l] + acc[1][l];
	s = hyb_ref_reduce16(acc[0]);
	/* leftovers in double, the product rounded to float first */
	for (int64_t i = np; i < n; i++)
		s += (double)(hyb_f16_to_f32(x[i]) * hyb_f16_to_f32(y[i]));
	return (float)s;
}

static void mad_f16(int64_t n, uint16_t *y, const uint16_t *x, float v)
{
	for (int64_t i = 0; i < n; i++)
		y[i] = hyb_f32_to_f16(fmaf(hyb_f16_to_f32(x[i]), v, hyb_f16_to_f32(y[i])));
}

static void scale_f16(int64_t n, uint16_t *y, float v)
{
	for (int64_t i = 0; i < n; i++)
		y[i] = hyb_f32_to_f16(hyb_f16_to_f32(y[i]) * v);
}

static void gemm_acc(float *c, const float *a, const float *b, int m, int k, int n)
{
	for (int i = 0; i < m; i++) {
		for (int j = 0; j < n; j++) {
			float s = c[(size_t)i * n + j];

			for (int kk = 0; kk < k; kk++)
				s = fmaf(b[(size_t)kk * n + j], a[(size_t)i * k + kk], s);
			c[(size_t)i * n + j] = s;
		}
	}
}

static double soft_max(int64_t n, float *y, const float *x, float max)
{
	double sum = 0;
	int64_t i = 0;

	for (; i + 16 <= n; i += 16) {
		for (int l = 0; l < 16; l++)
			y[i + l] = hyb_ref_expf(x[i + l] - max);
		sum += (double)hyb_ref_reduce16(y + i);
	}
	return hyb_soft_max_tail(i, n, y, x, max, sum);
}

static void swiglu(int64_t n, float *y, const float *x, const float *g)
{
	int64_t i = 0;

	for (; i + 16 <= n; i += 16)
		for (int l = 0; l < 16; l++)
			y[i + l] = silu_v(x[i + l]) * g[i + l];
	hyb_swiglu_tail(i, n, y, x, g);
}

static void geglu(int64_t n, float *y, const float *x, const float *g, const uint16_t *table)
{
	hyb_geglu_tail(0, n, y, x, g, table);
}

double hyb_soft_max_tail(int64_t i, int64_t n, float *y, const float *x, float max,
			 double sum)
{
	for (; i < n; i++) {
		y[i] = expf(x[i] - max);
		sum += (double)y[i];
	}
	return sum;
}

void hyb_swiglu_tail(int64_t i, int64_t n, float *y, const float *x, const float *g)
{
	for (; i < n; i++)
		y[i] = x[i] / (1.0f + expf(-x[i])) * g[i];
}

void hyb_geglu_tail(int64_t i, int64_t n, float *y, const float *x, const float *g,
		    const uint16_t *table)
{
	for (; i < n; i++) {
		if (x[i] <= -10.0f)
			y[i] = 0.0f;
		else if (x[i] >= 10.0f)
			y[i] = x[i] * g[i];
		else
			y[i] = hyb_f16_to_f32(table[hyb_f32_to_f16(x[i])]) * g[i];
	}
}

void hyb_fill_vec_ref(struct hyb_cpu_kernels *k)
{
	k->dot_f16 = dot_f16;
	k->mad_f16 = mad_f16;
	k->scale_f16 = scale_f16;
	k->gemm_acc = gemm_acc;
	k->soft_max = soft_max;
	k->swiglu = swiglu;
	k->geglu = geglu;
}
