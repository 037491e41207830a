// SPDX-License-Identifier: MIT
#include "ops.h"

#include <math.h>

#include "cpu_kernels.h"

void hyb_rmsnorm(float *y, const float *x, const float *w, uint32_t n, float eps)
{
	double sum = 0; /* ggml accumulates the squares in double */

	for (uint32_t i = 0; i < n; i++)
		sum += (double)(x[i] * x[i]);
	float scale = 1.0f / sqrtf((float)(sum / n) + eps);

	for (uint32_t i = 0; i < n; i++)
		y[i] = (x[i] * scale) * w[i];
}

void hyb_rope(float *x, uint32_t n_heads, uint32_t head_dim, uint32_t n_rot, uint32_t pos,
	      float freq_scale, float base, bool neox)
{
	/*
	 * ggml_rope_cache_init: theta_i = pos * base^(-2i/n_rot) by the
	 * recurrence theta *= theta_scale, then scaled by freq_scale (its
	 * theta_interp) before cos and sin.
	 */
	const float theta_scale = powf(base, -2.0f / (float)n_rot);
	float cs[512], sn[512];
	float theta = (float)pos;

	for (uint32_t i = 0; i < n_rot / 2; i++) {
		const float t = freq_scale * theta;

		cs[i] = cosf(t);
		sn[i] = sinf(t);
		theta *= theta_scale;
	}
	for (uint32_t h = 0; h < n_heads; h++) {
		float *v = x + (uint64_t)h * head_dim;

		for (uint32_t i = 0; i < n_rot / 2; i++) {
			uint32_t a = neox ? i : 2 * i;
			uint32_t b = neox ? i + n_rot / 2 : 2 * i + 1;
			float x0 = v[a], x1 = v[b];

			/* rotate_pairs as its compiler contracts it: one product rounded */
			v[a] = fmaf(x0, cs[i], -(x1 * sn[i]));
			v[b] = fmaf(x0, sn[i], x1 * cs[i]);
		}
	}
}

static inline float relu(float v)
{
	return v > 0 ? v : 0;
}

void hyb_ffn_act(float *g, const float *u, uint64_t n, enum hyb_ffn_act act)
{
	switch (act) {
	case HYB_ACT_SILU:
		/* ggml_vec_swiglu_f32: SiLU with ggml_v_expf, 16 lanes at a time */
		hyb_cpu_best()->swiglu((int64_t)n, g, g, u);
		break;
	case HYB_ACT_RELU:
		for (uint64_t i = 0; i < n; i++)
			g[i] = relu(g[i]) * u[i];
		break;
	case HYB_ACT_RELU2:
		for (uint64_t i = 0; i < n; i++)
			g[i] = relu(g[i]) * relu(g[i]) * u[i];
		break;
	case HYB_ACT_DRELU:
		for (uint64_t i = 0; i < n; i++)
			g[i] = relu(g[i]) * relu(u[i]);
		break;
	}
}
