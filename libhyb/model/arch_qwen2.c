// SPDX-License-Identifier: MIT
/*
 * qwen2: Qwen 2 and 2.5 (llama.cpp src/models/qwen2.cpp): the llama layout
 * with biases on Q, K and V, and NeoX RoPE.
 */
#include "arch.h"

static int qwen2_layer(struct hyb_loader *ld, struct hyb_layer *L, uint32_t l)
{
	if (!L->bq || !L->bk || !L->bv)
		return hyb_ld_fail(ld, "tensor blk.%u.attn_%s.bias is missing (qwen2 has Q, K "
				   "and V biases)", l, !L->bq ? "q" : !L->bk ? "k" : "v");
	return 0;
}

const struct hyb_arch_desc hyb_arch_qwen2 = {
	.name = "qwen2",
	.id = HYB_ARCH_QWEN2,
	.rope_neox = true,
	.layer = qwen2_layer,
};
