// SPDX-License-Identifier: MIT
/*
 * gemma3: Gemma 3 text models (llama.cpp src/models/gemma3.cpp):
 *   - embeddings multiplied by sqrt(n_embd);
 *   - RMS norms on each head of Q and K, q scaled by 1/sqrt(head_dim)
 *     before attention (1/sqrt(n_embd/n_head) for the 27B), which then
 *     scales by 1;
 *   - norms after attention and after the FFN, before each joins the
 *     residual; GeGLU (GELU, tanh form) FFN;
 *   - with attention.sliding_window: of every sliding_window_pattern (6)
 *     layers all but the last see only the last n_swa positions and rotate
 *     with rope.freq_base_swa (10000) unscaled; the others are global.
 * The converter already adds Gemma's +1 to its norm weights.
 */
#include <math.h>
#include <string.h>

#include "arch.h"
#include "forward/ops.h"
#include "hyb/gguf.h"

static int gemma3_hparams(struct hyb_loader *ld, struct hyb_hparams *hp)
{
	uint32_t pattern = 6;
	float base_swa;
	char key[128];

	hp->act = HYB_ACT_GELU;
	hp->embd_scale = sqrtf((float)hp->n_embd);
	hp->q_scale = hp->n_layer == 62 ? 1.0f / sqrtf((float)(hp->n_embd / hp->n_head))
					: 1.0f / sqrtf((float)hp->head_dim);
	if (hyb_ld_u32(ld, "attention.sliding_window", 0, &hp->n_swa) ||
	    hyb_ld_f32(ld, "rope.freq_base_swa", 10000.0f, &base_swa))
		return -1;
	snprintf(key, sizeof(key), "%s.final_logit_softcapping", hp->arch);
	if (hyb_gguf_find(ld->m->gguf, key))
		return hyb_ld_fail(ld, "metadata %s: final logit soft-capping is not supported",
				   key);
	snprintf(key, sizeof(key), "%s.attention.sliding_window_pattern", hp->arch);
	if (hyb_gguf_find(ld->m->gguf, key) && !hyb_gguf_get_u32(ld->m->gguf, key, &pattern))
		return hyb_ld_fail(ld, "metadata %s: only a number is supported (not a per-layer "
				   "array)", key);
	if (!(base_swa > 0) || !isfinite(base_swa))
		return hyb_ld_fail(ld, "metadata %s.rope.freq_base_swa must be positive", hp->arch);
	/* the same YaRN terms, the local base, no interpolation (llama_model::get_rope_freq_*) */
	hp->rope_swa = hp->rope;
	hp->rope_swa.base = base_swa;
	hp->rope_swa.freq_scale = 1.0f;
	if (hp->rope_swa.ext_factor != 0)
		hyb_rope_yarn_corr_dims(hp->n_rot, hp->n_ctx_orig, base_swa, 32.0f, 1.0f,
					hp->rope_swa.corr_dims);
	/* llama_hparams::set_swa_pattern, dense_first false; 0: every layer */
	hp->swa_pattern = pattern;
	return 0;
}

static int gemma3_layer(struct hyb_loader *ld, struct hyb_layer *L, uint32_t l)
{
	const struct hyb_hparams *hp = &ld->m->hp;

	if (hyb_ld_bind_layer(ld, &L->q_norm, l, "attn_q_norm.weight", hp->head_dim, 0, false) ||
	    hyb_ld_bind_layer(ld, &L->k_norm, l, "attn_k_norm.weight", hp->head_dim, 0, false) ||
	    hyb_ld_bind_layer(ld, &L->post_attn_norm, l, "post_attention_norm.weight",
			      hp->n_embd, 0, false) ||
	    hyb_ld_bind_layer(ld, &L->post_ffn_norm, l, "post_ffw_norm.weight", hp->n_embd, 0,
			      false))
		return -1;
	L->swa = hp->n_swa > 0 &&
		 (hp->swa_pattern == 0 || l % hp->swa_pattern < hp->swa_pattern - 1);
	return 0;
}

const struct hyb_arch_desc hyb_arch_gemma3 = {
	.name = "gemma3",
	.id = HYB_ARCH_GEMMA3,
	.rope_neox = true,
	.hparams = gemma3_hparams,
	.layer = gemma3_layer,
};
