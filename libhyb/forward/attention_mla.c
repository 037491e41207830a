// SPDX-License-Identifier: MIT
/*
 * DeepSeek's multi-head latent attention (DeepSeek-V2 section 2.1), as
 * llama.cpp computes it with the absorbed weights (src/models/deepseek2.cpp,
 * build_attn with v_mla), so that hyb's logits are its own:
 *
 *   q = wq . xn, or wq_b . norm(wq_a . xn)        [head][nope | rope]
 *   kv = wkv_a . xn = [latent | k_rope]; RoPE on k_rope and q's rope part
 *   latent = norm(latent) * kv_a_norm
 *   q_abs[head] = wk_b[head] . q_nope[head]       (nope -> latent dims)
 *   K cache row = [latent | k_rope], one for all heads; V = its latent part
 *   o[head] = attention(q = [q_abs | q_rope], K, V), scale mla_scale
 *   out = wo . [wv_b[head] . o[head] for each head]
 *
 * Per token the cache holds kv_lora + n_rot values instead of 2 x n_head x
 * head dims: the point of MLA. The per-head products are matmuls of n
 * tokens each, as llama.cpp's batched ggml_mul_mat over the heads is.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "attention_mla.h"
#include "forward_internal.h"
#include "ops.h"

struct hyb_mla_scratch {
	float *q;   /* [nb][n_head][nope + rope] as projected */
	float *in;  /* [nb][max(nope, kv_lora)] one head's rows, gathered */
	float *out; /* [nb][max(kv_lora, mla_v)] ... and its product */
	float *vo;  /* [nb][n_head * mla_v] the heads' outputs, up-projected */
	float *qa;  /* [nb][q_lora] */
};

struct hyb_mla_scratch *hyb_mla_scratch_new(const struct hyb_model *m, uint32_t nb)
{
	const struct hyb_hparams *hp = &m->hp;
	const size_t qk = (size_t)hp->mla_nope + hp->n_rot;
	const size_t w_in = hp->mla_nope > hp->kv_lora ? hp->mla_nope : hp->kv_lora;
	const size_t w_out = hp->kv_lora > hp->mla_v ? hp->kv_lora : hp->mla_v;
	struct hyb_mla_scratch *s = calloc(1, sizeof(*s));

	if (!s)
		return NULL;
	s->q = malloc(sizeof(float) * nb * hp->n_head * qk);
	s->in = malloc(sizeof(float) * nb * w_in);
	s->out = malloc(sizeof(float) * nb * w_out);
	s->vo = malloc(sizeof(float) * nb * hp->n_head * hp->mla_v);
	s->qa = malloc(sizeof(float) * nb * (hp->q_lora ? hp->q_lora : 1));
	if (!s->q || !s->in || !s->out || !s->vo || !s->qa) {
		hyb_mla_scratch_free(s);
		return NULL;
	}
	return s;
}

void hyb_mla_scratch_free(struct hyb_mla_scratch *s)
{
	if (!s)
		return;
	free(s->q);
	free(s->in);
	free(s->out);
	free(s->vo);
	free(s->qa);
	free(s);
}

/*
 * dst[t][h * dst_w + dst_off ..] = W[h] . src[t][h * src_w + src_off .. + W.ne0]
 * for every token: one head's slice of n rows through its own matrix.
 */
static void per_head(struct hyb_ctx *c, const struct hyb_weight *w3, uint32_t h, uint32_t n,
		     const float *src, size_t src_w, size_t src_off, float *dst, size_t dst_w,
		     size_t dst_off)
{
	struct hyb_mla_scratch *s = c->mla;
	const struct hyb_weight w = hyb_weight_expert(w3, h), *wp = &w;
	const size_t in = w.ne0, out = w.ne1;

	for (uint32_t t = 0; t < n; t++)
		memcpy(s->in + t * in, src + t * src_w + src_off, sizeof(float) * in);
	hyb_fwd_matmul(c, s->in, n, 1, &wp, &s->out);
	for (uint32_t t = 0; t < n; t++)
		memcpy(dst + t * dst_w + dst_off, s->out + t * out, sizeof(float) * out);
}

void hyb_fwd_attention_mla(struct hyb_ctx *c, uint32_t l, uint32_t n)
{
	const struct hyb_hparams *hp = &c->m->hp;
	const struct hyb_layer *L = &c->m->layers[l];
	struct hyb_mla_scratch *s = c->mla;
	const uint32_t E = hp->n_embd, H = hp->n_head, R = hp->kv_lora, P = hp->n_rot;
	const uint32_t N = hp->mla_nope, QK = N + P, D = R + P, V = hp->mla_v;
	float *kv = c->kk; /* [n][D]: the rows the cache takes */

	for (uint32_t t = 0; t < n; t++)
		hyb_rmsnorm(c->xn + (size_t)t * E, c->x + (size_t)t * E, L->attn_norm.data, E,
			    hp->rms_eps);
	if (hp->q_lora) {
		const struct hyb_weight *wa = &L->wq_a, *wb = &L->wq_b;

		hyb_fwd_matmul(c, c->xn, n, 1, &wa, &s->qa);
		for (uint32_t t = 0; t < n; t++)
			hyb_rmsnorm(s->qa + (size_t)t * hp->q_lora, s->qa + (size_t)t * hp->q_lora,
				    L->q_a_norm.data, hp->q_lora, hp->rms_eps);
		hyb_fwd_matmul(c, s->qa, n, 1, &wb, &s->q);
	} else {
		const struct hyb_weight *wq = &L->wq;

		hyb_fwd_matmul(c, c->xn, n, 1, &wq, &s->q);
	}
	{
		const struct hyb_weight *wkv = &L->wkv_a;

		hyb_fwd_matmul(c, c->xn, n, 1, &wkv, &kv);
	}
	struct hyb_fwd_run one;
	uint32_t nr;
	const struct hyb_fwd_run *r = hyb_fwd_runs(c, n, &one, &nr);

	for (uint32_t i = 0; i < nr; i++)
		for (uint32_t t = r[i].t0; t < r[i].t0 + r[i].n; t++) {
			float cs[512], sn[512];
			float *row = kv + (size_t)t * D, *q = s->q + (size_t)t * H * QK;

			hyb_rope_table(&hp->rope, P, r[i].pos + t - r[i].t0, cs, sn);
			hyb_rope_apply(row + R, 1, P, P, false, cs, sn);
			hyb_rmsnorm(row, row, L->kv_a_norm.data, R, hp->rms_eps);
			for (uint32_t h = 0; h < H; h++)
				hyb_rope_apply(q + (size_t)h * QK + N, 1, P, P, false, cs, sn);
		}
	/* Q rows of the cache's shape: [latent from wk_b | rope] per head */
	for (uint32_t h = 0; h < H; h++) {
		per_head(c, &L->wk_b, h, n, s->q, (size_t)H * QK, (size_t)h * QK, c->q,
			 (size_t)H * D, (size_t)h * D);
		for (uint32_t t = 0; t < n; t++)
			memcpy(c->q + (size_t)t * H * D + (size_t)h * D + R,
			       s->q + (size_t)t * H * QK + (size_t)h * QK + N, sizeof(float) * P);
	}
	{
		uint16_t *kc = c->kcache + (size_t)l * c->kv_rows * c->kv_dim;
		const struct hyb_attn a = {
			.k = c->k, .q = c->q, .out = c->att, .kc = kc, .vc = kc,
			.q_stride = (size_t)H * D, .kv_stride = D,
			.out_stride = (size_t)H * R, .v_stride = D,
			.hd = D, .hd_v = R, .n_head = H, .n_head_kv = 1, .n_ctx = c->n_ctx,
			.n_split = hyb_threadpool_size(c->pool), .scale = hp->mla_scale,
		};

		for (uint32_t i = 0; i < nr; i++)
			for (uint32_t t = 0; t < r[i].n; t++)
				c->k->quantize_act[HYB_TYPE_F16](
					kv + (size_t)(r[i].t0 + t) * D,
					kc + hyb_kv_row(r[i].blocks, r[i].pos + t) * D, D);
		hyb_fwd_attend_runs(c, &a, n);
	}
	for (uint32_t h = 0; h < H; h++)
		per_head(c, &L->wv_b, h, n, c->att, (size_t)H * R, (size_t)h * R, s->vo,
			 (size_t)H * V, (size_t)h * V);
	{
		const struct hyb_weight *wo = &L->wo;

		hyb_fwd_matmul(c, s->vo, n, 1, &wo, &c->xn);
	}
	for (size_t i = 0; i < (size_t)n * E; i++)
		c->x[i] += c->xn[i];
}
