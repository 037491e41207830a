// SPDX-License-Identifier: MIT
/*
 * olmoe: AllenAI's OLMoE (llama.cpp src/models/olmoe.cpp): the llama layout
 * with RMS norms over the whole Q and K projections (not per head) before
 * NeoX RoPE, and routed experts of feed_forward_length neurons whose softmax
 * weights are used as they are (arch_moe.c).
 */
#include "arch.h"

static int olmoe_layer(struct hyb_loader *ld, struct hyb_layer *L, uint32_t l)
{
	const struct hyb_hparams *hp = &ld->m->hp;

	if (hyb_ld_bind_layer(ld, &L->q_norm, l, "attn_q_norm.weight",
			      (uint64_t)hp->n_head * hp->head_dim, 0, false) ||
	    hyb_ld_bind_layer(ld, &L->k_norm, l, "attn_k_norm.weight",
			      (uint64_t)hp->n_head_kv * hp->head_dim, 0, false))
		return -1;
	return 0;
}

const struct hyb_arch_desc hyb_arch_olmoe = {
	.name = "olmoe",
	.id = HYB_ARCH_OLMOE,
	.rope_neox = true,
	.moe = HYB_MOE_REQUIRED,
	.layer = olmoe_layer,
};
