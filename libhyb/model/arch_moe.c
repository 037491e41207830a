// SPDX-License-Identifier: MIT
/*
 * What the mixture-of-experts architectures share (docs/MOE.md): the
 * expert keys and, per layer, the router, the 3-D expert tensors and the
 * shared expert, with llama.cpp's names and shapes (llama-arch.cpp).
 * Counts are checked against each other and the tensors here, so that the
 * forward pass can index experts without checks.
 */
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
				   "in %s (supported: llama, qwen2moe, qwen3moe, deepseek2, glm4moe)", hp->arch,
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
		L->gate_exps = L->up_exps = gu;
		L->gate_exps.ne1 = L->up_exps.ne1 = F;
		L->gate_exps.fused_rows = L->up_exps.fused_rows = 2 * F;
		L->up_exps.data = (const char *)gu.data + F * gu.row_bytes;
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
