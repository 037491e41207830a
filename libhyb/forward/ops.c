// SPDX-License-Identifier: MIT
#include "ops.h"

#include <math.h>
#include <pthread.h>

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

static float yarn_corr_dim(uint32_t n_rot, uint32_t n_ctx_orig, float rot, float base)
{
	return (float)n_rot * logf((float)n_ctx_orig / (rot * 2 * (float)M_PI)) / (2 * logf(base));
}

void hyb_rope_yarn_corr_dims(uint32_t n_rot, uint32_t n_ctx_orig, float base, float beta_fast,
			     float beta_slow, float dims[2])
{
	const float start = floorf(yarn_corr_dim(n_rot, n_ctx_orig, beta_fast, base));
	const float end = ceilf(yarn_corr_dim(n_rot, n_ctx_orig, beta_slow, base));

	dims[0] = fmaxf(0, start);
	dims[1] = fminf((float)n_rot - 1, end);
}

void hyb_rope_table(const struct hyb_rope *r, uint32_t n_rot, uint32_t pos, float *cs,
		    float *sn)
{
	/*
	 * ggml_rope_cache_init and rope_yarn: theta_i = pos * base^(-2i/n_rot)
	 * by the recurrence theta *= theta_scale, divided by the frequency
	 * factor, interpolated by freq_scale (theta_interp), for YaRN mixed
	 * with the extrapolated angle by the ramp between corr_dims, and cos
	 * and sin scaled by the magnitude (mscale).
	 */
	const float theta_scale = powf(r->base, -2.0f / (float)n_rot);
	float theta = (float)pos;

	for (uint32_t i = 0; i < n_rot / 2; i++) {
		const float ff = r->freq_factors ? r->freq_factors[i] : 1.0f;
		const float extrap = theta / ff;
		float t = r->freq_scale * extrap, mscale = r->attn_factor;

		if (r->ext_factor != 0.0f) {
			const float y = ((float)i - r->corr_dims[0]) /
					fmaxf(0.001f, r->corr_dims[1] - r->corr_dims[0]);
			const float mix = (1 - fminf(1, fmaxf(0, y))) * r->ext_factor;

			/* contracted as llama.cpp's -march=native build contracts them */
			t = fmaf(t, 1 - mix, extrap * mix);
			mscale *= fmaf(logf(1.0f / r->freq_scale), 0.1f, 1.0f);
		}
		cs[i] = cosf(t) * mscale;
		sn[i] = sinf(t) * mscale;
		theta *= theta_scale;
	}
}

void hyb_rope(float *x, uint32_t n_heads, uint32_t head_dim, uint32_t n_rot, uint32_t pos,
	      const struct hyb_rope *r, bool neox)
{
	float cs[512], sn[512];

	hyb_rope_table(r, n_rot, pos, cs, sn);
	hyb_rope_apply(x, n_heads, head_dim, n_rot, neox, cs, sn);
}

void hyb_rope_apply(float *x, uint32_t n_heads, uint32_t head_dim, uint32_t n_rot, bool neox,
		    const float *cs, const float *sn)
{
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

/*
 * ggml's GELU (tanh form), as its -march=native build contracts it: one
 * fused multiply-add inside (ggml-cpu vec.h ggml_gelu_f32).
 */
static float gelu_tanh(float x)
{
	const float a = 0.044715f, s = 0.79788456080286535587989211986876f;

	return (0.5f * x) * (1.0f + tanhf((s * x) * fmaf(a * x, x, 1.0f)));
}

/* ggml_table_gelu_f16: GELU of every F16 value, rounded to F16 (ggml_cpu_init);
 * one padding entry for the kernels' 32-bit gathers */
static uint16_t gelu_table[(1 << 16) + 1];
static pthread_once_t gelu_once = PTHREAD_ONCE_INIT;

static void gelu_init(void)
{
	for (uint32_t i = 0; i < 1u << 16; i++)
		gelu_table[i] = hyb_f32_to_f16(gelu_tanh(hyb_f16_to_f32((uint16_t)i)));
}

const uint16_t *hyb_gelu_f16_table(void)
{
	pthread_once(&gelu_once, gelu_init);
	return gelu_table;
}

/* ggml_vec_geglu_f32 with GGML_GELU_FP16: the table between -10 and 10 */
static void geglu(float *g, const float *u, uint64_t n)
{
	pthread_once(&gelu_once, gelu_init);
	hyb_cpu_best()->geglu((int64_t)n, g, g, u, gelu_table);
}

static inline float relu(float v)
{
	return v > 0 ? v : 0;
}

float hyb_act_gate(enum hyb_ffn_act act, float g)
{
	switch (act) {
	case HYB_ACT_SILU:
		return g / (1.0f + expf(-g));
	case HYB_ACT_GELU:
		return gelu_tanh(g);
	case HYB_ACT_SWIGLU_OAI:
		return fminf(g, 7.0f) / (1.0f + expf(1.702f * -fminf(g, 7.0f)));
	case HYB_ACT_RELU2:
		return relu(g) * relu(g);
	default:
		return relu(g);
	}
}

void hyb_ffn_act_cats(float *g, const float *u, uint64_t n, enum hyb_ffn_act act, float thr)
{
	enum { CHUNK = 1024 }; /* a multiple of the kernels' 16 lanes: the same rounding as one call */
	uint8_t keep[CHUNK];

	if (!(thr > 0)) {
		hyb_ffn_act(g, u, n, act);
		return;
	}
	for (uint64_t i0 = 0; i0 < n; i0 += CHUNK) {
		const uint64_t m = n - i0 < CHUNK ? n - i0 : CHUNK;

		for (uint64_t i = 0; i < m; i++)
			keep[i] = fabsf(hyb_act_gate(act, g[i0 + i])) > thr;
		hyb_ffn_act(g + i0, u + i0, m, act);
		for (uint64_t i = 0; i < m; i++)
			if (!keep[i])
				g[i0 + i] = 0.0f;
	}
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
	case HYB_ACT_GELU:
		geglu(g, u, n);
		break;
	case HYB_ACT_SWIGLU_OAI:
		/* ggml_compute_forward_swiglu_oai_f32: scalar, libm's expf */
		for (uint64_t i = 0; i < n; i++) {
			const float x = fminf(g[i], 7.0f);
			const float y = fminf(fmaxf(u[i], -7.0f), 7.0f);

			g[i] = x / (1.0f + expf(1.702f * -x)) * (y + 1.0f);
		}
		break;
	}
}
