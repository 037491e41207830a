// SPDX-License-Identifier: MIT
#include "ops.h"

#include <math.h>

void hyb_rmsnorm(float *y, const float *x, const float *w, uint32_t n, float eps)
{
	double sum = 0; /* ggml accumulates the squares in double */

	for (uint32_t i = 0; i < n; i++)
		sum += (double)(x[i] * x[i]);
	float scale = 1.0f / sqrtf((float)(sum / n) + eps);

	for (uint32_t i = 0; i < n; i++)
		y[i] = (x[i] * scale) * w[i];
}

void hyb_rope(float *x, uint32_t n_heads, uint32_t head_dim, uint32_t n_rot, float pos,
	      float base, bool neox)
{
	/* Angles by the recurrence theta_i = pos * base^(-2i/n_rot), as ggml's rope cache. */
	const float theta_scale = powf(base, -2.0f / (float)n_rot);
	float cs[512], sn[512];
	float theta = pos;

	for (uint32_t i = 0; i < n_rot / 2; i++) {
		cs[i] = cosf(theta);
		sn[i] = sinf(theta);
		theta *= theta_scale;
	}
	for (uint32_t h = 0; h < n_heads; h++) {
		float *v = x + (uint64_t)h * head_dim;

		for (uint32_t i = 0; i < n_rot / 2; i++) {
			uint32_t a = neox ? i : 2 * i;
			uint32_t b = neox ? i + n_rot / 2 : 2 * i + 1;
			float x0 = v[a], x1 = v[b];

			v[a] = x0 * cs[i] - x1 * sn[i];
			v[b] = x0 * sn[i] + x1 * cs[i];
		}
	}
}

void hyb_softmax(float *x, uint32_t n, float scale)
{
	float max = -INFINITY;
	double sum = 0;

	for (uint32_t i = 0; i < n; i++) {
		x[i] *= scale;
		if (x[i] > max)
			max = x[i];
	}
	for (uint32_t i = 0; i < n; i++) {
		x[i] = expf(x[i] - max);
		sum += x[i];
	}
	float inv = (float)(1.0 / sum);

	for (uint32_t i = 0; i < n; i++)
		x[i] *= inv;
}

static inline float relu(float v)
{
	return v > 0 ? v : 0;
}

void hyb_ffn_act(float *g, const float *u, uint64_t n, enum hyb_ffn_act act)
{
	switch (act) {
	case HYB_ACT_SILU:
		for (uint64_t i = 0; i < n; i++)
			g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
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
