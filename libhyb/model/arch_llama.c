// SPDX-License-Identifier: MIT
/*
 * llama: Llama 1/2/3.x, Mistral, SmolLM2 and the ReLU-family sparse models
 * (llama.cpp src/models/llama.cpp). Everything it has is the common layout
 * model_load.c reads; RoPE rotates adjacent pairs. With expert_count set it
 * is Mixtral's layout: routed experts (arch_moe.c) whose chosen weights are
 * renormalised to sum 1.
 */
#include "arch.h"

const struct hyb_arch_desc hyb_arch_llama = {
	.name = "llama",
	.id = HYB_ARCH_LLAMA,
	.moe = HYB_MOE_OPTIONAL,
	.expert_norm = true,
};
