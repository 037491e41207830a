// SPDX-License-Identifier: MIT
/*
 * qwen3moe: Qwen3-30B-A3B, Qwen3-235B-A22B (llama.cpp src/models/qwen3moe.cpp):
 * qwen3's attention (RMS norms on each head of Q and K, NeoX RoPE) and a
 * routed mixture of experts whose chosen weights are renormalised to sum 1
 * (arch_moe.c, docs/MOE.md).
 */
#include "arch.h"

static int qwen3moe_layer(struct hyb_loader *ld, struct hyb_layer *L, uint32_t l)
{
	return hyb_arch_qwen3.layer(ld, L, l);
}

const struct hyb_arch_desc hyb_arch_qwen3moe = {
	.name = "qwen3moe",
	.id = HYB_ARCH_QWEN3MOE,
	.rope_neox = true,
	.moe = HYB_MOE_REQUIRED,
	.expert_norm = true,
	.layer = qwen3moe_layer,
};
