// SPDX-License-Identifier: MIT
/*
 * dots1: rednote's dots.llm1 (llama.cpp src/models/dots1.cpp): qwen3's
 * attention (per-head Q/K norms, NeoX RoPE), leading_dense_block_count
 * dense layers, then routed experts scored as expert_gating_func says
 * (which its files must say: llama.cpp has no default for dots1) with an
 * optional selection bias, plus expert_shared_count ungated shared experts
 * (arch_moe.c).
 */
#include "arch.h"

static int dots1_hparams(struct hyb_loader *ld, struct hyb_hparams *hp)
{
	return hyb_ld_moe_v3_keys(ld, hp, 0);
}

static int dots1_layer(struct hyb_loader *ld, struct hyb_layer *L, uint32_t l)
{
	return hyb_arch_qwen3.layer(ld, L, l);
}

const struct hyb_arch_desc hyb_arch_dots1 = {
	.name = "dots1",
	.id = HYB_ARCH_DOTS1,
	.rope_neox = true,
	.moe = HYB_MOE_REQUIRED,
	.hparams = dots1_hparams,
	.layer = dots1_layer,
};
