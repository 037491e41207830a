// SPDX-License-Identifier: MIT
/*
 * deepseek2: DeepSeek-V2, V2-Lite, V2.5, V3 and R1 (llama.cpp
 * src/models/deepseek2.cpp), as its current converter writes them:
 *   - multi-head latent attention with the absorbed weights (attn_k_b,
 *     attn_v_b): per token one cached K row of kv_lora_rank latent dims +
 *     rope dims, shared by every head, V its latent part
 *     (forward/attention_mla.c); q straight (V2-Lite) or through a rank
 *     q_lora_rank bottleneck;
 *   - RoPE on adjacent pairs, YaRN scaling with DeepSeek's
 *     yarn_log_multiplier;
 *   - leading_dense_block_count dense layers, then routed experts (softmax
 *     or V3's sigmoid scores with a selection bias and expert groups,
 *     weights optionally renormalised and scaled) plus
 *     expert_shared_count ungated shared experts (arch_moe.c).
 * Files of the older converter (one attn_kv_b tensor) are refused: llama.cpp
 * runs those as plain multi-head attention. V3's multi-token-prediction
 * layers (nextn_predict_layers, the last ones) are left out, as llama.cpp
 * leaves them out of a normal pass.
 */
#include <math.h>
#include <stdio.h>

#include "arch.h"
#include "hyb/gguf.h"

static int deepseek2_hparams(struct hyb_loader *ld, struct hyb_hparams *hp)
{
	uint32_t k_mla = 0, v_mla = 0;
	float log_mul = 0;

	/* V2's files have no gating function: softmax (llama.cpp's default) */
	if (hyb_ld_u32(ld, "attention.kv_lora_rank", -1, &hp->kv_lora) ||
	    hyb_ld_u32(ld, "attention.q_lora_rank", 0, &hp->q_lora) ||
	    hyb_ld_u32(ld, "attention.key_length_mla", 0, &k_mla) ||
	    hyb_ld_u32(ld, "attention.value_length_mla", 0, &v_mla) ||
	    hyb_ld_f32(ld, "rope.scaling.yarn_log_multiplier", 0.0f, &log_mul) ||
	    hyb_ld_moe_v3_keys(ld, hp, 1))
		return -1;
	if (!k_mla || !v_mla)
		return hyb_ld_fail(ld, "metadata %s.attention.key_length_mla / value_length_mla "
				   "missing: a file of the older converter (attn_kv_b), which hyb "
				   "does not run; convert the model again", hp->arch);
	/* the cached row: latent + RoPE dims, one KV head; V its latent part */
	if (hp->n_head_kv != 1 || !hp->kv_lora || hp->head_dim != hp->kv_lora + hp->n_rot ||
	    k_mla <= hp->n_rot || k_mla - hp->n_rot > 1024 || !v_mla || v_mla > 1024)
		return hyb_ld_fail(ld, "metadata %s: latent attention needs head_count_kv 1 and "
				   "key_length = kv_lora_rank + rope.dimension_count (found %u, "
				   "%u + %u, key_length_mla %u, head_count_kv %u)", hp->arch,
				   hp->head_dim, hp->kv_lora, hp->n_rot, k_mla, hp->n_head_kv);
	hp->mla_nope = k_mla - hp->n_rot;
	hp->mla_v = v_mla;
	if (!isfinite(log_mul))
		return hyb_ld_fail(ld, "metadata %s.rope.scaling.yarn_log_multiplier must be finite",
				   hp->arch);
	/*
	 * llama_context's YaRN magnitude with DeepSeek's log multiplier (the
	 * converter writes it times 0.1), then deepseek2.cpp's score scale from
	 * the same terms: mscale^2 / sqrt(key_length_mla). Unscaled RoPE: 1 and
	 * 1 / sqrt(key_length_mla).
	 */
	const float fs = hp->rope.freq_scale, lm = log_mul / 0.1f;
	float attn = hp->rope.attn_factor;

	if (fs != 1.0f && lm != 0.0f) {
		attn = 1.0f / (1.0f + 0.1f * logf(1.0f / fs));
		hp->rope.attn_factor = attn;
	}
	const float org = attn * (1.0f + 0.1f * logf(1.0f / fs));
	const float ms = org * (1.0f + 0.1f * lm * logf(1.0f / fs));

	hp->mla_scale = 1.0f * ms * ms / sqrtf((float)k_mla);
	return 0;
}

static int deepseek2_layer(struct hyb_loader *ld, struct hyb_layer *L, uint32_t l)
{
	const struct hyb_hparams *hp = &ld->m->hp;
	const uint64_t E = hp->n_embd, H = hp->n_head, R = hp->kv_lora;
	const uint64_t qk = (uint64_t)hp->mla_nope + hp->n_rot;
	char name[96];

	snprintf(name, sizeof(name), "blk.%u.attn_kv_b.weight", l);
	if (hyb_gguf_find_tensor(ld->m->gguf, name))
		return hyb_ld_fail(ld, "tensor %s: a file of the older converter, which hyb does "
				   "not run; convert the model again", name);
	if (hp->q_lora) {
		if (hyb_ld_bind_layer(ld, &L->wq_a, l, "attn_q_a.weight", E, hp->q_lora, false) ||
		    hyb_ld_bind_layer(ld, &L->q_a_norm, l, "attn_q_a_norm.weight", hp->q_lora, 0,
				      false) ||
		    hyb_ld_bind_layer(ld, &L->wq_b, l, "attn_q_b.weight", hp->q_lora, H * qk, false))
			return -1;
	} else if (hyb_ld_bind_layer(ld, &L->wq, l, "attn_q.weight", E, H * qk, false)) {
		return -1;
	}
	if (hyb_ld_bind_layer(ld, &L->wkv_a, l, "attn_kv_a_mqa.weight", E, R + hp->n_rot, false) ||
	    hyb_ld_bind_layer(ld, &L->kv_a_norm, l, "attn_kv_a_norm.weight", R, 0, false) ||
	    hyb_ld_bind_experts(ld, &L->wk_b, l, "attn_k_b.weight", hp->mla_nope, R, H) ||
	    hyb_ld_bind_experts(ld, &L->wv_b, l, "attn_v_b.weight", R, hp->mla_v, H) ||
	    hyb_ld_bind_layer(ld, &L->wo, l, "attn_output.weight", H * hp->mla_v, E, false))
		return -1;
	/* per-head matmuls of 3-D tensors: llama.cpp's repacking passes them by */
	L->wk_b.flat = L->wv_b.flat = true;
	return 0;
}

const struct hyb_arch_desc hyb_arch_deepseek2 = {
	.name = "deepseek2",
	.id = HYB_ARCH_DEEPSEEK2,
	.moe = HYB_MOE_OPTIONAL,
	.mla = true,
	.hparams = deepseek2_hparams,
	.layer = deepseek2_layer,
};
