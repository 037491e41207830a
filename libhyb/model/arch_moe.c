// SPDX-License-Identifier: MIT
/*
 * What the mixture-of-experts architectures share (docs/MOE.md): the
 * expert keys and, per layer, the router, the 3-D expert tensors and the
 * shared expert, with llama.cpp's names and shapes (llama-arch.cpp).
 * Counts are checked against each other and the tensors here, so that the
 * forward pass can index experts without checks.
 */
#include <math.h>
#include <stdio.h>

#include "arch.h"
#include "hyb/gguf.h"

/* llama.cpp's LLAMA_MAX_EXPERTS */
#define MAX_EXPERTS 512

int hyb_ld_moe_hparams(struct hyb_loader *ld, const struct hyb_arch_desc *arch,
		       struct hyb_hparams *hp)
{
	char key[128];

	/* llama.cpp reads expert_used_count per layer or once; hyb only once */
	snprintf(key, sizeof(key), "%s.expert_used_count", hp->arch);
	if (hyb_gguf_get_arr(ld->m->gguf, key, HYB_GGUF_VT_UINT32) ||
	    hyb_gguf_get_arr(ld->m->gguf, key, HYB_GGUF_VT_INT32))
		return hyb_ld_fail(ld, "metadata %s: a count per layer is not supported (one "
				   "number)", key);
	if (hyb_ld_u32(ld, "expert_count", 0, &hp->n_expert) ||
	    hyb_ld_u32(ld, "expert_used_count", 0, &hp->n_expert_used) ||
	    hyb_ld_u32(ld, "expert_feed_forward_length", hp->n_ff, &hp->n_ff_exp) ||
	    hyb_ld_u32(ld, "expert_shared_feed_forward_length", 0, &hp->n_ff_shexp) ||
	    hyb_ld_u32(ld, "expert_group_count", 0, &hp->n_expert_groups) ||
	    hyb_ld_u32(ld, "expert_group_used_count", 0, &hp->n_group_used))
		return -1;
	if (!hp->n_expert) {
		if (arch->moe == HYB_MOE_REQUIRED)
			return hyb_ld_fail(ld, "metadata %s.expert_count is missing or 0 (%s is a "
					   "mixture of experts)", hp->arch, hp->arch);
		hp->n_expert_used = hp->n_ff_exp = hp->n_ff_shexp = 0;
		return 0;
	}
	if (arch->moe == HYB_MOE_NONE)
		return hyb_ld_fail(ld, "metadata %s.expert_count is %u: experts are not supported "
				   "in %s (supported: llama, qwen2moe, qwen3moe, deepseek2, glm4moe, dots1, olmoe)", hp->arch,
				   hp->n_expert, hp->arch);
	if (hp->n_expert > MAX_EXPERTS)
		return hyb_ld_fail(ld, "metadata %s.expert_count %u is over %u", hp->arch,
				   hp->n_expert, MAX_EXPERTS);
	if (!hp->n_expert_used || hp->n_expert_used > hp->n_expert)
		return hyb_ld_fail(ld, "metadata %s.expert_used_count %u must be in 1..%u "
				   "(expert_count)", hp->arch, hp->n_expert_used, hp->n_expert);
	if (!hp->n_ff_exp || hp->n_ff_exp > (1u << 20) || hp->n_ff_shexp > (1u << 20))
		return hyb_ld_fail(ld, "metadata %s.expert_feed_forward_length %u / "
				   "expert_shared_feed_forward_length %u out of range", hp->arch,
				   hp->n_ff_exp, hp->n_ff_shexp);
	/* llama.cpp's groups: E / G experts each, the best n_group_used eligible */
	if (hp->n_expert_groups > 1 &&
	    (hp->n_expert % hp->n_expert_groups || hp->n_expert / hp->n_expert_groups < 2 ||
	     !hp->n_group_used || hp->n_group_used > hp->n_expert_groups ||
	     hp->n_group_used * (hp->n_expert / hp->n_expert_groups) < hp->n_expert_used))
		return hyb_ld_fail(ld, "metadata %s.expert_group_count %u / expert_group_used_count "
				   "%u do not divide %u experts so that %u can be chosen", hp->arch,
				   hp->n_expert_groups, hp->n_group_used, hp->n_expert,
				   hp->n_expert_used);
	hp->expert_norm = arch->expert_norm;
	return 0;
}

int hyb_ld_moe_v3_keys(struct hyb_loader *ld, struct hyb_hparams *hp, uint32_t def_gating)
{
	uint32_t shared = 0, gating = 0, nextn = 0;
	bool norm = false;
	char key[128];

	if (hyb_ld_u32(ld, "leading_dense_block_count", 0, &hp->n_dense_lead) ||
	    hyb_ld_u32(ld, "expert_shared_count", 0, &shared) ||
	    hyb_ld_u32(ld, "expert_gating_func", 0, &gating) ||
	    hyb_ld_f32(ld, "expert_weights_scale", 0.0f, &hp->expert_scale) ||
	    hyb_ld_u32(ld, "nextn_predict_layers", 0, &nextn))
		return -1;
	snprintf(key, sizeof(key), "%s.expert_weights_norm", hp->arch);
	if (hyb_gguf_find(ld->m->gguf, key) && !hyb_gguf_get_bool(ld->m->gguf, key, &norm))
		return hyb_ld_fail(ld, "metadata %s is not a boolean", key);
	/* llama.cpp's gating functions: 1 softmax, 2 sigmoid; none (0 or no key):
	 * the architecture's own (def_gating; 0: it has none to offer) */
	gating = gating ? gating : def_gating;
	if (gating < 1 || gating > 2)
		return hyb_ld_fail(ld, "metadata %s.expert_gating_func %u is not supported "
				   "(1 softmax, 2 sigmoid)", hp->arch, gating);
	if (!isfinite(hp->expert_scale) || hp->expert_scale < 0)
		return hyb_ld_fail(ld, "metadata %s.expert_weights_scale must be finite and >= 0",
				   hp->arch);
	/* multi-token-prediction layers come last and are not part of the model's
	 * own pass (llama.cpp's n_layer() leaves them out too) */
	if (nextn >= hp->n_layer)
		return hyb_ld_fail(ld, "metadata %s.nextn_predict_layers %u leaves none of the %u "
				   "layers", hp->arch, nextn, hp->n_layer);
	hp->n_layer -= nextn;
	if (hp->n_dense_lead > hp->n_layer)
		return hyb_ld_fail(ld, "metadata %s.leading_dense_block_count %u is over the %u "
				   "layers", hp->arch, hp->n_dense_lead, hp->n_layer);
	hp->expert_sigmoid = gating == 2;
	hp->expert_norm = norm;
	if (hp->n_expert)
		hp->n_ff_shexp = shared * hp->n_ff_exp;
	return 0;
}

int hyb_ld_moe_layer(struct hyb_loader *ld, struct hyb_layer *L, uint32_t l)
{
	const struct hyb_hparams *hp = &ld->m->hp;
	const uint64_t E = hp->n_embd, F = hp->n_ff_exp, X = hp->n_expert;
	int rc;

	char name[96];

	if (hyb_ld_bind_layer(ld, &L->gate_inp, l, "ffn_gate_inp.weight", E, X, false))
		return -1;
	/* gate and up in one tensor, gate's rows first in each expert (llama.cpp's
	 * create_tensor_gate_up_exps takes either form) */
	snprintf(name, sizeof(name), "blk.%u.ffn_gate_up_exps.weight", l);
	if (hyb_gguf_find_tensor(ld->m->gguf, name)) {
		struct hyb_weight gu;

		if (hyb_ld_bind_experts(ld, &gu, l, "ffn_gate_up_exps.weight", E, 2 * F, X))
			return -1;
		if (hyb_ld_slice(ld, &L->gate_exps, &gu, 0, F) ||
		    hyb_ld_slice(ld, &L->up_exps, &gu, F, F))
			return -1;
	} else if (hyb_ld_bind_experts(ld, &L->gate_exps, l, "ffn_gate_exps.weight", E, F, X) ||
		   hyb_ld_bind_experts(ld, &L->up_exps, l, "ffn_up_exps.weight", E, F, X)) {
		return -1;
	}
	if (hyb_ld_bind_experts(ld, &L->down_exps, l, "ffn_down_exps.weight", F, E, X))
		return -1;
	if (hyb_ld_bias(ld, &L->exp_probs_b, l, "exp_probs_b.bias", X, true))
		return -1;
	/* a shared expert wherever the file has one: its size is a key of its own */
	rc = hyb_ld_bind_layer(ld, &L->up_shexp, l, "ffn_up_shexp.weight", E,
			       hp->n_ff_shexp ? hp->n_ff_shexp : hp->n_ff, !hp->n_ff_shexp);
	if (rc < 0)
		return -1;
	if (rc == 0) {
		const uint64_t S = L->up_shexp.ne1;

		if (hyb_ld_bind_layer(ld, &L->gate_shexp, l, "ffn_gate_shexp.weight", E, S, false) ||
		    hyb_ld_bind_layer(ld, &L->down_shexp, l, "ffn_down_shexp.weight", S, E, false) ||
		    hyb_ld_bind_layer(ld, &L->gate_inp_shexp, l, "ffn_gate_inp_shexp.weight", E, 0,
				      true) < 0)
			return -1;
	}
	return 0;
}
