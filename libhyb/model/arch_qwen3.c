// SPDX-License-Identifier: MIT
/*
 * qwen3: Qwen 3 dense models (llama.cpp src/models/qwen3.cpp): the llama
 * layout with RMS norms on each head of Q and K before RoPE, NeoX RoPE.
 */
#include "arch.h"

static int qwen3_layer(struct hyb_loader *ld, struct hyb_layer *L, uint32_t l)
{
	const uint32_t hd = ld->m->hp.head_dim;

	if (hyb_ld_bind_layer(ld, &L->q_norm, l, "attn_q_norm.weight", hd, 0, false) ||
	    hyb_ld_bind_layer(ld, &L->k_norm, l, "attn_k_norm.weight", hd, 0, false))
		return -1;
	return 0;
}

const struct hyb_arch_desc hyb_arch_qwen3 = {
	.name = "qwen3",
	.id = HYB_ARCH_QWEN3,
	.rope_neox = true,
	.layer = qwen3_layer,
};
