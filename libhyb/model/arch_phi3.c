// SPDX-License-Identifier: MIT
/*
 * phi3: Phi-3 and Phi-3.5 (llama.cpp src/models/phi3.cpp): Q, K and V in one
 * attn_qkv tensor and gate and up in one ffn_up of 2 n_ff rows (model_load.c
 * slices both), q scaled by 1/sqrt(head_dim) before attention (which then
 * scales by 1), NeoX RoPE; the 128k models' LongRoPE factors
 * (rope_factors_short/long.weight, picked by the context's size). Their
 * sliding window is ignored, as llama.cpp ignores it.
 */
#include <math.h>

#include "arch.h"
#include "hyb/gguf.h"

static int factors(struct hyb_loader *ld, const char *name, const float **out)
{
	struct hyb_weight w;
	int rc = hyb_ld_bind(ld, &w, name, ld->m->hp.n_rot / 2, 0, true);

	*out = rc ? NULL : w.data;
	return rc < 0 ? -1 : 0;
}

static int phi3_hparams(struct hyb_loader *ld, struct hyb_hparams *hp)
{
	(void)ld;
	hp->q_scale = 1.0f / sqrtf((float)hp->head_dim);
	return 0;
}

/* with the tensors (layer 0): the LongRoPE factors are the model's, not a layer's */
static int phi3_layer(struct hyb_loader *ld, struct hyb_layer *L, uint32_t l)
{
	struct hyb_hparams *hp = &ld->m->hp;

	(void)L;
	if (l)
		return 0;
	if (factors(ld, "rope_factors_short.weight", &hp->rope_short) ||
	    factors(ld, "rope_factors_long.weight", &hp->rope_long))
		return -1;
	if (!hp->rope_short != !hp->rope_long)
		return hyb_ld_fail(ld, "tensor rope_factors_%s.weight is missing: LongRoPE needs "
				   "both factor sets", hp->rope_short ? "long" : "short");
	return 0;
}

const struct hyb_arch_desc hyb_arch_phi3 = {
	.name = "phi3",
	.id = HYB_ARCH_PHI3,
	.rope_neox = true,
	.fused_gate_up = true,
	.hparams = phi3_hparams,
	.layer = phi3_layer,
};
