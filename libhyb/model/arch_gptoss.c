// SPDX-License-Identifier: MIT
/*
 * gpt-oss: OpenAI's gpt-oss-20b and -120b (llama.cpp src/models/openai-moe.cpp,
 * architecture "gpt-oss"):
 *   - attention with biases on Q, K, V and the output, and a sink logit per
 *     head in every softmax (attention.c); NeoX RoPE, YaRN-scaled;
 *   - sliding-window layers alternating with global ones (every other layer
 *     from the first sees the last attention.sliding_window positions), both
 *     with the same RoPE;
 *   - the FFN's input norm stored as post_attention_norm;
 *   - routed experts only: the router has a bias, the chosen experts are
 *     the best logits and their weights the softmax of those; the experts'
 *     gate, up and down have biases, and a clamped SwiGLU (HYB_ACT_SWIGLU_OAI).
 * Its files keep the experts in MXFP4 (kernels/cpu/gemm_mxfp4.c).
 */
#include "arch.h"
#include "hyb/tensor_type.h"

static int gptoss_hparams(struct hyb_loader *ld, struct hyb_hparams *hp)
{
	if (hyb_ld_u32(ld, "attention.sliding_window", -1, &hp->n_swa))
		return -1;
	if (!hp->n_swa)
		return hyb_ld_fail(ld, "metadata %s.attention.sliding_window must be positive",
				   hp->arch);
	/* llama_hparams::set_swa_pattern(2): layers 0, 2, 4, ... slide */
	hp->swa_pattern = 2;
	hp->rope_swa = hp->rope;
	hp->act = HYB_ACT_SWIGLU_OAI;
	hp->expert_softmax_weight = true;
	return 0;
}

/* blk.{l}.{what}: an F32 [ne0, ne1] (a bias per expert) as floats */
static int bias2d(struct hyb_loader *ld, const float **out, uint32_t l, const char *what,
		  uint64_t ne0, uint64_t ne1)
{
	struct hyb_weight w;

	if (hyb_ld_bind_layer(ld, &w, l, what, ne0, ne1, false))
		return -1;
	if (w.type != HYB_TYPE_F32)
		return hyb_ld_fail(ld, "tensor blk.%u.%s has type %s (a bias: F32)", l, what,
				   hyb_type_name(w.type));
	*out = w.data;
	return 0;
}

static int gptoss_layer(struct hyb_loader *ld, struct hyb_layer *L, uint32_t l)
{
	const struct hyb_hparams *hp = &ld->m->hp;
	const uint64_t X = hp->n_expert, F = hp->n_ff_exp, E = hp->n_embd;

	if (!L->bq || !L->bk || !L->bv)
		return hyb_ld_fail(ld, "tensor blk.%u.attn_%s.bias is missing (gpt-oss has Q, K "
				   "and V biases)", l, !L->bq ? "q" : !L->bk ? "k" : "v");
	if (hyb_ld_bias(ld, &L->bo, l, "attn_output.bias", E, false) ||
	    hyb_ld_bias(ld, &L->attn_sinks, l, "attn_sinks.weight", hp->n_head, false) ||
	    hyb_ld_bias(ld, &L->gate_inp_b, l, "ffn_gate_inp.bias", X, false) ||
	    bias2d(ld, &L->gate_exps_b, l, "ffn_gate_exps.bias", F, X) ||
	    bias2d(ld, &L->up_exps_b, l, "ffn_up_exps.bias", F, X) ||
	    bias2d(ld, &L->down_exps_b, l, "ffn_down_exps.bias", E, X))
		return -1;
	L->swa = l % hp->swa_pattern < hp->swa_pattern - 1;
	return 0;
}

const struct hyb_arch_desc hyb_arch_gptoss = {
	.name = "gpt-oss",
	.id = HYB_ARCH_GPTOSS,
	.rope_neox = true,
	.moe = HYB_MOE_REQUIRED,
	.ffn_norm = "post_attention_norm",
	.hparams = gptoss_hparams,
	.layer = gptoss_layer,
};
