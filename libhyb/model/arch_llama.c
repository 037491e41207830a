// SPDX-License-Identifier: MIT
/*
 * llama: Llama 1/2/3.x, Mistral, SmolLM2 and the ReLU-family sparse models
 * (llama.cpp src/models/llama.cpp). Everything it has is the common layout
 * model_load.c reads; RoPE rotates adjacent pairs.
 */
#include "arch.h"

const struct hyb_arch_desc hyb_arch_llama = {
	.name = "llama",
	.id = HYB_ARCH_LLAMA,
};
