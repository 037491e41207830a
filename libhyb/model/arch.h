/* SPDX-License-Identifier: MIT */
/*
 * The architectures the loader knows (docs/MODELS.md): each arch_*.c file
 * describes one, its own keys and tensors on top of the llama layout that
 * model_load.c reads for all of them, and the traits the shared forward
 * pass follows (hyb/model.h struct hyb_hparams, struct hyb_layer).
 */
#ifndef HYB_ARCH_H
#define HYB_ARCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hyb/model.h"

/* model_load.c's state while it reads one model */
struct hyb_loader {
	struct hyb_model *m;
	char *err;
	size_t errlen;
	int rc;		/* the failure's errno, negated */
	bool rope_llama3; /* rope.scaling.type says llama3: rope_freqs.weight is required */
};

struct hyb_arch_desc {
	const char *name;     /* general.architecture */
	enum hyb_arch id;
	bool rope_neox;       /* rotates halves (llama.cpp LLAMA_ROPE_TYPE_NEOX) */
	bool fused_gate_up;   /* ffn_up holds gate then up (n_ff rows each), no ffn_gate */
	/* mixture of experts: HYB_MOE_NONE, _OPTIONAL (llama: Mixtral's layout
	 * when expert_count is set), _REQUIRED */
	enum { HYB_MOE_NONE, HYB_MOE_OPTIONAL, HYB_MOE_REQUIRED } moe;
	bool expert_norm;     /* renormalise the chosen experts' weights (hyb_hparams) */
	const char *ffn_norm; /* the FFN input norm's tensor name (NULL: "ffn_norm") */
	bool mla;             /* its own attention tensors (latent attention): the layer
			       * hook binds them, not the common Q/K/V/O */
	/* after the common keys and RoPE: the architecture's own; 0 or -1 (failed) */
	int (*hparams)(struct hyb_loader *ld, struct hyb_hparams *hp);
	/* after layer l's common tensors: its own; 0 or -1 */
	int (*layer)(struct hyb_loader *ld, struct hyb_layer *L, uint32_t l);
};

extern const struct hyb_arch_desc hyb_arch_llama, hyb_arch_qwen2, hyb_arch_qwen3,
	hyb_arch_gemma3, hyb_arch_phi3, hyb_arch_qwen2moe, hyb_arch_qwen3moe, hyb_arch_deepseek2,
	hyb_arch_glm4moe, hyb_arch_dots1, hyb_arch_olmoe, hyb_arch_gptoss;

/* The loader's services for the arch files (model_load.c). */
int hyb_ld_fail(struct hyb_loader *ld, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* "{arch}.suffix": missing keys take def (u32: def < 0 means required) */
int hyb_ld_u32(struct hyb_loader *ld, const char *suffix, long def, uint32_t *out);
int hyb_ld_f32(struct hyb_loader *ld, const char *suffix, float def, float *out);
/* Tensor `name` of shape [ne0, ne1] (ne1 0: 1-D F32); 1 when optional and absent. */
int hyb_ld_bind(struct hyb_loader *ld, struct hyb_weight *w, const char *name, uint64_t ne0,
		uint64_t ne1, bool optional);
/* blk.{l}.{what} as hyb_ld_bind does, and a 1-D F32 of n as a float pointer (bias) */
int hyb_ld_bind_layer(struct hyb_loader *ld, struct hyb_weight *w, uint32_t l, const char *what,
		      uint64_t ne0, uint64_t ne1, bool optional);
int hyb_ld_bias(struct hyb_loader *ld, const float **out, uint32_t l, const char *what,
		uint64_t n, bool optional);
/*
 * blk.{l}.{what}, a 3-D expert tensor [ne0, ne1, ne2] (ne2 experts), bound
 * as w with w->ne2 = ne2; the shape error names what it expected.
 */
int hyb_ld_bind_experts(struct hyb_loader *ld, struct hyb_weight *w, uint32_t l, const char *what,
			uint64_t ne0, uint64_t ne1, uint64_t ne2);
/* MoE keys (arch_moe.c): expert counts and sizes, checked; after the common keys. */
int hyb_ld_moe_hparams(struct hyb_loader *ld, const struct hyb_arch_desc *arch,
		       struct hyb_hparams *hp);
/*
 * The keys DeepSeek-V3-style MoE architectures share (deepseek2, glm4moe,
 * dots1): leading_dense_block_count, expert_shared_count (shared experts of
 * n_ff_exp each), expert_gating_func (def_gating when absent),
 * expert_weights_scale and _norm; trailing nextn_predict_layers left out.
 */
int hyb_ld_moe_v3_keys(struct hyb_loader *ld, struct hyb_hparams *hp, uint32_t def_gating);
/* Layer l's router, experts and shared expert, instead of a dense FFN. */
int hyb_ld_moe_layer(struct hyb_loader *ld, struct hyb_layer *L, uint32_t l);

/*
 * blk.{l}.{what}, a fused tensor of rows[0] + ... + rows[n-1] rows of ne0,
 * as n consecutive slices (out[i]: rows[i] rows, fused_rows the total);
 * 1 when optional and absent.
 */
/*
 * w = rows [r0, r0 + n) of each matrix of all (a fused tensor's slice:
 * llama.cpp sums by the whole tensor's rows, kept in fused_rows), parts and
 * all where the rows are split across nodes. 0, or -1 (out of memory).
 */
int hyb_ld_slice(struct hyb_loader *ld, struct hyb_weight *w, const struct hyb_weight *all,
		 uint64_t r0, uint64_t n);
int hyb_ld_bind_fused(struct hyb_loader *ld, uint32_t l, const char *what, uint64_t ne0, int n,
		      const uint64_t *rows, struct hyb_weight *const *out, bool optional);

#endif
