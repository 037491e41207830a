// SPDX-License-Identifier: MIT
/*
 * qwen2moe: Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B (llama.cpp src/models/qwen2moe.cpp):
 * qwen2's attention (Q/K/V biases, NeoX RoPE); routed experts whose softmax
 * weights are used as they are (not renormalised), plus a shared expert
 * scaled per token by sigmoid(ffn_gate_inp_shexp . x) (arch_moe.c,
 * docs/MOE.md).
 */
#include "arch.h"

static int qwen2moe_layer(struct hyb_loader *ld, struct hyb_layer *L, uint32_t l)
{
	if (hyb_arch_qwen2.layer(ld, L, l))
		return -1;
	if (!L->up_shexp.data || !L->gate_inp_shexp.data)
		return hyb_ld_fail(ld, "tensor blk.%u.%s is missing (qwen2moe has a gated shared "
				   "expert)", l, !L->up_shexp.data ? "ffn_up_shexp.weight" :
				   "ffn_gate_inp_shexp.weight");
	return 0;
}

const struct hyb_arch_desc hyb_arch_qwen2moe = {
	.name = "qwen2moe",
	.id = HYB_ARCH_QWEN2MOE,
	.rope_neox = true,
	.moe = HYB_MOE_REQUIRED,
	.layer = qwen2moe_layer,
};
