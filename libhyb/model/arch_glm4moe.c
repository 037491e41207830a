// SPDX-License-Identifier: MIT
/*
 * glm4moe: GLM-4.5, GLM-4.5-Air, GLM-4.6 (llama.cpp src/models/glm4-moe.cpp):
 * GQA attention with Q/K/V biases and, in some sizes, per-head Q/K norms;
 * NeoX RoPE on the first rope.dimension_count dims of each head (partial
 * rotary); the FFN's input norm is stored as post_attention_norm;
 * leading_dense_block_count dense layers, then DeepSeek-V3-style routing
 * (sigmoid scores, a selection bias, weights renormalised and scaled) with
 * expert_shared_count ungated shared experts (arch_moe.c). The trailing
 * nextn_predict_layers multi-token-prediction layers are left out, as
 * llama.cpp leaves them out of a normal pass; multimodal RoPE sections
 * (GLM-4.5V) are refused.
 */
#include <stdio.h>

#include "arch.h"
#include "hyb/gguf.h"

static int glm4moe_hparams(struct hyb_loader *ld, struct hyb_hparams *hp)
{
	const struct hyb_gguf_kv *sec;
	char key[128];

	snprintf(key, sizeof(key), "%s.rope.dimension_sections", hp->arch);
	sec = hyb_gguf_get_arr(ld->m->gguf, key, HYB_GGUF_VT_INT32);
	if (sec && sec->v.arr.n >= 2 && ((const int32_t *)sec->v.arr.data)[0] > 0 &&
	    ((const int32_t *)sec->v.arr.data)[1] > 0)
		return hyb_ld_fail(ld, "metadata %s: multimodal RoPE (GLM-4.5V) is not supported", key);
	/* llama.cpp: no gating function given is sigmoid for GLM-4.5 */
	return hyb_ld_moe_v3_keys(ld, hp, 2);
}

static int glm4moe_layer(struct hyb_loader *ld, struct hyb_layer *L, uint32_t l)
{
	const uint32_t hd = ld->m->hp.head_dim;

	/* optional: GLM-4.5 (355B) has them, GLM-4.5-Air not */
	if (hyb_ld_bind_layer(ld, &L->q_norm, l, "attn_q_norm.weight", hd, 0, true) < 0 ||
	    hyb_ld_bind_layer(ld, &L->k_norm, l, "attn_k_norm.weight", hd, 0, true) < 0)
		return -1;
	return 0;
}

const struct hyb_arch_desc hyb_arch_glm4moe = {
	.name = "glm4moe",
	.id = HYB_ARCH_GLM4MOE,
	.rope_neox = true,
	.moe = HYB_MOE_REQUIRED,
	.ffn_norm = "post_attention_norm",
	.hparams = glm4moe_hparams,
	.layer = glm4moe_layer,
};
