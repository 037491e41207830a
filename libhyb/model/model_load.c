// SPDX-License-Identifier: MIT
/*
 * Reads a llama-family model from GGUF metadata and points each weight at
 * its bytes in the loaded image (a local pool the io_uring streaming engine
 * filled, libhyb/model/stream.c) or, with HYB_LOAD=mmap, in the file mapping.
 * Shapes and types are checked here, once, so the forward pass can trust them.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "hyb/stream.h"
#include "cpu_kernels.h"
#include "sparse_ffn_kernels.h"
#include "hyb/gguf.h"
#include "hyb/manifest.h"
#include "hyb/model.h"
#include "hyb/plan.h"
#include "hyb/sparsity.h"
#include "hyb/tokenizer.h"
#include "model_internal.h"
#include "arch.h"
#include "model_stream.h"
#include "forward/ops.h"
#include "sparse/teal.h"
#include "util/error.h"

/* A model the loader cannot take (-EINVAL); the reason goes to ld->err. */
int hyb_ld_fail(struct hyb_loader *ld, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(ld->err, ld->errlen, fmt, ap);
	va_end(ap);
	ld->rc = -EINVAL;
	return -1;
}

static int nomem(struct hyb_loader *ld)
{
	hyb_ld_fail(ld, "out of memory");
	ld->rc = -ENOMEM;
	return -1;
}

/* "{arch}.suffix" as an unsigned; missing keys take def (< 0: required). */
int hyb_ld_u32(struct hyb_loader *ld, const char *suffix, long def, uint32_t *out)
{
	char key[128];

	snprintf(key, sizeof(key), "%s.%s", ld->m->hp.arch, suffix);
	if (hyb_gguf_get_u32(ld->m->gguf, key, out))
		return 0;
	if (hyb_gguf_find(ld->m->gguf, key))
		return hyb_ld_fail(ld, "metadata %s is not a valid unsigned integer", key);
	if (def < 0)
		return hyb_ld_fail(ld, "metadata %s is missing", key);
	*out = (uint32_t)def;
	return 0;
}

int hyb_ld_f32(struct hyb_loader *ld, const char *suffix, float def, float *out)
{
	char key[128];

	snprintf(key, sizeof(key), "%s.%s", ld->m->hp.arch, suffix);
	if (hyb_gguf_get_f32(ld->m->gguf, key, out))
		return 0;
	if (hyb_gguf_find(ld->m->gguf, key))
		return hyb_ld_fail(ld, "metadata %s is not a number", key);
	*out = def;
	return 0;
}

/*
 * RoPE scaling as llama.cpp's llama_model::load_hparams and llama_context
 * read it (docs/MODELS.md): rope.scaling.type none, linear (the default),
 * yarn, or llama3 (Llama 3.1+, whose converter writes the frequency factors
 * as rope_freqs.weight and no type); rope.scaling.factor (or the older
 * rope.scale_linear); YaRN's original_context_length and attn_factor. The
 * rope_freqs tensor is bound by bind_rope_freqs() with the other tensors.
 */
static int read_rope(struct hyb_loader *ld)
{
	struct hyb_hparams *hp = &ld->m->hp;
	struct hyb_rope *r = &hp->rope;
	char key[128], type[32] = "linear";
	float factor = 0, attn = 1.0f;
	uint32_t n_ctx_orig;

	snprintf(key, sizeof(key), "%s.rope.scaling.type", hp->arch);
	if (hyb_gguf_find(ld->m->gguf, key) && !hyb_gguf_get_str(ld->m->gguf, key, type, sizeof(type)))
		return hyb_ld_fail(ld, "metadata %s is not a short string", key);
	if (strcmp(type, "none") && strcmp(type, "linear") && strcmp(type, "yarn") &&
	    strcmp(type, "llama3") && (strcmp(type, "longrope") || hp->arch_id != HYB_ARCH_PHI3))
		return hyb_ld_fail(ld, "metadata %s: RoPE scaling '%s' is not supported "
			    "(supported: none, linear, yarn, llama3; longrope for phi3)", key, type);
	if (hyb_ld_f32(ld, "rope.scaling.factor", 0, &factor) ||
	    (!factor && hyb_ld_f32(ld, "rope.scale_linear", 0, &factor)) ||
	    hyb_ld_f32(ld, "rope.scaling.attn_factor", 1.0f, &attn) ||
	    hyb_ld_u32(ld, "rope.scaling.original_context_length", hp->n_ctx_train, &n_ctx_orig))
		return -1;
	if (!isfinite(factor) || factor < 0 || !isfinite(attn) || !(attn > 0) || !n_ctx_orig)
		return hyb_ld_fail(ld, "metadata %s.rope.scaling.*: factor %g, attn_factor %g and "
			    "original_context_length %u must be positive", hp->arch,
			    (double)factor, (double)attn, n_ctx_orig);
	r->freq_scale = factor == 0 || !strcmp(type, "none") ? 1.0f : 1.0f / factor;
	r->ext_factor = 0;
	r->attn_factor = 1.0f;
	if (!strcmp(type, "yarn")) {
		/*
		 * llama_context's constructor: ext_factor 1; the magnitude
		 * get_mscale(1 / freq_scale) cancelled by rope_yarn's own factor,
		 * in the same float steps (llama.cpp builds that file without FMA).
		 */
		const float f = 1.0f / r->freq_scale;
		float m = f <= 1.0f ? 1.0f : 0.1f * 1.0f * logf(f) + 1.0f;

		r->ext_factor = 1.0f;
		m *= 1.0f / (1.0f + 0.1f * logf(f));
		r->attn_factor = m;
		/* beta_fast 32 and beta_slow 1: llama_hparams' defaults */
		hyb_rope_yarn_corr_dims(hp->n_rot, n_ctx_orig, r->base, 32.0f, 1.0f,
					r->corr_dims);
	}
	r->attn_factor *= attn;
	ld->rope_llama3 = !strcmp(type, "llama3");
	hp->n_ctx_orig = n_ctx_orig;
	return 0;
}

static const struct hyb_arch_desc *const archs[] = {
	&hyb_arch_llama, &hyb_arch_qwen2,    &hyb_arch_qwen3,    &hyb_arch_gemma3,
	&hyb_arch_phi3,  &hyb_arch_qwen2moe, &hyb_arch_qwen3moe, &hyb_arch_deepseek2,
	&hyb_arch_glm4moe, &hyb_arch_dots1,  &hyb_arch_olmoe,    &hyb_arch_gptoss,
};

static const char *arch_names(void)
{
	static char buf[256];

	if (!buf[0])
		for (size_t i = 0; i < sizeof(archs) / sizeof(archs[0]); i++)
			snprintf(buf + strlen(buf), sizeof(buf) - strlen(buf), "%s%s",
				 i ? ", " : "", archs[i]->name);
	return buf;
}

static const struct hyb_arch_desc *arch_of(const struct hyb_hparams *hp)
{
	for (size_t i = 0; i < sizeof(archs) / sizeof(archs[0]); i++)
		if (archs[i]->id == hp->arch_id)
			return archs[i];
	return &hyb_arch_llama;
}

static int read_hparams(struct hyb_loader *ld)
{
	struct hyb_hparams *hp = &ld->m->hp;
	const struct hyb_arch_desc *arch = NULL;
	uint32_t v_dim;
	char act[32] = "silu";

	/* PowerInfer writes PWRI into models and GPU indexes alike (hyb/gguf.h) */
	if (hyb_gguf_is_gpu_index(ld->m->gguf))
		return hyb_ld_fail(ld, "this is a PowerInfer GPU index (only gpu_idx/gpu_bucket "
				   "tensors), not a model: give it to hybctl plan --gpu-index");
	if (!hyb_gguf_get_str(ld->m->gguf, "general.architecture", hp->arch, sizeof(hp->arch)))
		return hyb_ld_fail(ld, "metadata general.architecture is missing");
	for (size_t i = 0; i < sizeof(archs) / sizeof(archs[0]) && !arch; i++)
		if (!strcmp(hp->arch, archs[i]->name))
			arch = archs[i];
	if (!arch)
		return hyb_ld_fail(ld, "architecture '%s' is not supported (supported: %s)",
				   hp->arch, arch_names());
	hp->arch_id = arch->id;

	if (hyb_ld_u32(ld, "embedding_length", -1, &hp->n_embd) ||
	    hyb_ld_u32(ld, "block_count", -1, &hp->n_layer) ||
	    hyb_ld_u32(ld, "feed_forward_length", -1, &hp->n_ff) ||
	    hyb_ld_u32(ld, "attention.head_count", -1, &hp->n_head) ||
	    hyb_ld_u32(ld, "attention.head_count_kv", hp->n_head, &hp->n_head_kv) ||
	    hyb_ld_u32(ld, "context_length", 2048, &hp->n_ctx_train) ||
	    hyb_ld_f32(ld, "attention.layer_norm_rms_epsilon", 1e-5f, &hp->rms_eps) ||
	    hyb_ld_f32(ld, "rope.freq_base", 10000.0f, &hp->rope.base))
		return -1;
	if (!hp->n_embd || !hp->n_layer || !hp->n_ff || !hp->n_head || !hp->n_head_kv)
		return hyb_ld_fail(ld, "model dimensions must be nonzero");
	if (hp->n_head % hp->n_head_kv)
		return hyb_ld_fail(ld, "head_count %u is not a multiple of head_count_kv %u",
			    hp->n_head, hp->n_head_kv);
	if (hp->n_layer > 4096 || hp->n_head > 4096)
		return hyb_ld_fail(ld, "implausible shape: %u layers, %u heads", hp->n_layer, hp->n_head);
	if (hyb_ld_u32(ld, "attention.key_length", hp->n_embd % hp->n_head ? 0 :
		       hp->n_embd / hp->n_head, &hp->head_dim) ||
	    hyb_ld_u32(ld, "attention.value_length", hp->head_dim, &v_dim) ||
	    hyb_ld_u32(ld, "rope.dimension_count", hp->head_dim, &hp->n_rot))
		return -1;
	if (!hp->head_dim)
		return hyb_ld_fail(ld, "embedding_length %u is not a multiple of head_count %u "
				   "and %s.attention.key_length is missing", hp->n_embd, hp->n_head,
				   hp->arch);
	if (v_dim != hp->head_dim && !arch->mla)
		return hyb_ld_fail(ld, "%s.attention.value_length %u differs from key_length %u",
				   hp->arch, v_dim, hp->head_dim);
	if (!hp->head_dim || hp->head_dim > 1024 || hp->n_rot > hp->head_dim || hp->n_rot % 2)
		return hyb_ld_fail(ld, "bad head_dim %u / rope.dimension_count %u", hp->head_dim, hp->n_rot);
	if (!(hp->rms_eps > 0) || !(hp->rope.base > 0) || !isfinite(hp->rope.base))
		return hyb_ld_fail(ld, "rms epsilon and rope.freq_base must be positive");

	hp->rope_neox = arch->rope_neox;
	if (read_rope(ld) || hyb_ld_moe_hparams(ld, arch, hp))
		return -1;

	/*
	 * A PowerInfer model file (its convert-hf-to-powerinfer-gguf.py): down is
	 * stored transposed as ffn_down_t, next to fc1/fc2 predictors and an
	 * optional powerinfer.sparse_threshold. Its llama.cpp computes these FFNs
	 * with ReLU (llm_build_ffn_sparse only knows LLM_FFN_RELU), so that is the
	 * activation unless the file says otherwise.
	 */
	if (hyb_gguf_find_tensor(ld->m->gguf, "blk.0.ffn_down_t.weight")) {
		ld->m->powerinfer = true;
		strcpy(act, "relu");
		if (hyb_gguf_find(ld->m->gguf, "powerinfer.sparse_threshold") &&
		    !hyb_gguf_get_f32(ld->m->gguf, "powerinfer.sparse_threshold",
				  &ld->m->powerinfer_threshold))
			return hyb_ld_fail(ld, "metadata powerinfer.sparse_threshold is not a number");
		if (!isfinite(ld->m->powerinfer_threshold))
			return hyb_ld_fail(ld, "metadata powerinfer.sparse_threshold is not finite");
	}
	/* hyb.* keys are written by `hybctl synth` for the sparse (ReLU-family) models. */
	hyb_gguf_get_bool(ld->m->gguf, "hyb.rope_neox", &hp->rope_neox);
	if (hyb_gguf_find(ld->m->gguf, "hyb.ffn_act") &&
	    !hyb_gguf_get_str(ld->m->gguf, "hyb.ffn_act", act, sizeof(act)))
		return hyb_ld_fail(ld, "metadata hyb.ffn_act is not a short string");
	if (!strcmp(act, "silu"))
		hp->act = HYB_ACT_SILU;
	else if (!strcmp(act, "relu"))
		hp->act = HYB_ACT_RELU;
	else if (!strcmp(act, "relu2"))
		hp->act = HYB_ACT_RELU2;
	else if (!strcmp(act, "dlrelu") || !strcmp(act, "drelu"))
		hp->act = HYB_ACT_DRELU;
	else
		return hyb_ld_fail(ld, "FFN activation '%s' is not supported (silu, relu, relu2, dlrelu)",
			    act);
	/* last: the architecture's traits override the llama defaults above */
	if (arch->hparams && arch->hparams(ld, hp))
		return -1;
	return 0;
}

static const char *supported_types(void)
{
	return "F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 IQ4_NL Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_XS";
}

/*
 * Point w at tensor `name` and check its shape [ne0, ne1] (ne1 == 0: 1-D;
 * ne2 != 0: 3-D [ne0, ne1, ne2], experts). Matrices must have a type the
 * kernels compute; 1-D norm weights must be F32 (every llama.cpp converter
 * writes them so).
 */
static int bind_nd(struct hyb_loader *ld, struct hyb_weight *w, const char *name, uint64_t ne0,
		   uint64_t ne1, uint64_t ne2, bool optional)
{
	const struct hyb_gguf_tensor *t = hyb_gguf_find_tensor(ld->m->gguf, name);
	const struct hyb_type_info *ti;
	typedef unsigned long long ull;

	if (!t) {
		if (optional)
			return 1;
		return hyb_ld_fail(ld, "tensor %s is missing", name);
	}
	ti = hyb_type_info(t->type);
	if (ne1 == 0) {
		if (t->n_dims != 1 || t->ne[0] != ne0)
			return hyb_ld_fail(ld, "tensor %s: expected shape [%llu], found %u-D [%llu, ...]",
				    name, (ull)ne0, t->n_dims, (ull)t->ne[0]);
		if (t->type != HYB_TYPE_F32)
			return hyb_ld_fail(ld, "tensor %s has type %s; norm weights must be F32", name,
				    hyb_type_name(t->type));
	} else {
		if (ne2 && (t->n_dims != 3 || t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != ne2))
			return hyb_ld_fail(ld, "tensor %s: expected shape [%llu, %llu, %llu] (experts "
				    "last), found %u-D [%llu, %llu, %llu]", name, (ull)ne0, (ull)ne1,
				    (ull)ne2, t->n_dims, (ull)t->ne[0], (ull)t->ne[1],
				    (ull)t->ne[2]);
		if (!ne2 && (t->n_dims != 2 || t->ne[0] != ne0 || t->ne[1] != ne1))
			return hyb_ld_fail(ld, "tensor %s: expected shape [%llu, %llu], found [%llu, %llu]"
				    " (%u-D)", name, (ull)ne0, (ull)ne1, (ull)t->ne[0],
				    (ull)(t->n_dims > 1 ? t->ne[1] : 1), t->n_dims);
		if (!ti || !ti->computable || t->type == HYB_TYPE_Q8_K)
			return hyb_ld_fail(ld, "tensor %s has type %s, which hyb does not support "
				    "(supported: %s)", name, hyb_type_name(t->type),
				    supported_types());
		if (ne0 % hyb_type_info(hyb_vec_dot_type(t->type))->blck)
			return hyb_ld_fail(ld, "tensor %s: row length %llu is not a multiple of the %s "
				    "block", name, (ull)ne0,
				    hyb_type_name(hyb_vec_dot_type(t->type)));
	}
	*w = (struct hyb_weight){ 0 };
	w->type = t->type;
	w->ne0 = ne0;
	w->ne1 = ne1 ? ne1 : 1;
	w->ne2 = ne2;
	w->row_bytes = hyb_row_bytes(t->type, ne0);
	w->data = t->data;
	w->split = hyb_model_box_split(ld->m, t);
	return 0;
}

int hyb_ld_slice(struct hyb_loader *ld, struct hyb_weight *w, const struct hyb_weight *all,
		 uint64_t r0, uint64_t n)
{
	uint64_t run;

	*w = *all;
	w->ne1 = n;
	w->fused_rows = all->fused_rows ? all->fused_rows : all->ne1;
	w->data = hyb_weight_rows(all, 0, r0, &run);
	if (all->split) {
		w->split = hyb_model_box_split_rows(ld->m, all->split, r0, n, all->row_bytes);
		if (!w->split)
			return hyb_ld_fail(ld, "out of memory");
	}
	return 0;
}

int hyb_ld_bind(struct hyb_loader *ld, struct hyb_weight *w, const char *name, uint64_t ne0,
		uint64_t ne1, bool optional)
{
	return bind_nd(ld, w, name, ne0, ne1, 0, optional);
}

int hyb_ld_bind_experts(struct hyb_loader *ld, struct hyb_weight *w, uint32_t l, const char *what,
			uint64_t ne0, uint64_t ne1, uint64_t ne2)
{
	char name[96];

	snprintf(name, sizeof(name), "blk.%u.%s", l, what);
	return bind_nd(ld, w, name, ne0, ne1, ne2, false);
}

int hyb_ld_bind_layer(struct hyb_loader *ld, struct hyb_weight *w, uint32_t l, const char *what,
		      uint64_t ne0, uint64_t ne1, bool optional)
{
	char name[96];

	snprintf(name, sizeof(name), "blk.%u.%s", l, what);
	return hyb_ld_bind(ld, w, name, ne0, ne1, optional);
}

int hyb_ld_bind_fused(struct hyb_loader *ld, uint32_t l, const char *what, uint64_t ne0, int n,
		      const uint64_t *rows, struct hyb_weight *const *out, bool optional)
{
	struct hyb_weight all;
	uint64_t total = 0, off = 0;
	int rc;

	for (int i = 0; i < n; i++)
		total += rows[i];
	rc = hyb_ld_bind_layer(ld, &all, l, what, ne0, total, optional);
	if (rc)
		return rc;
	for (int i = 0; i < n; i++) {
		if (hyb_ld_slice(ld, out[i], &all, off, rows[i]))
			return -1;
		off += rows[i];
	}
	return 0;
}

int hyb_ld_bias(struct hyb_loader *ld, const float **out, uint32_t l, const char *what,
		uint64_t n, bool optional)
{
	struct hyb_weight w;
	int rc = hyb_ld_bind_layer(ld, &w, l, what, n, 0, optional);

	*out = rc ? NULL : w.data;
	return rc < 0 ? -1 : 0;
}

/* A 1-D tensor of n elements of `type` (plan metadata and biases). */
static const void *bind_vec(struct hyb_loader *ld, const char *name, uint32_t type, uint64_t n)
{
	const struct hyb_gguf_tensor *t = hyb_gguf_find_tensor(ld->m->gguf, name);

	if (!t) {
		hyb_ld_fail(ld, "plan tensor %s is missing", name);
		return NULL;
	}
	if (t->n_dims != 1 || t->ne[0] != n || t->type != type) {
		hyb_ld_fail(ld, "plan tensor %s: expected %s [%llu], found %s %u-D [%llu, ...]", name,
		     hyb_type_name(type), (unsigned long long)n, hyb_type_name(t->type),
		     t->n_dims, (unsigned long long)t->ne[0]);
		return NULL;
	}
	return t->data;
}


/* A PowerInfer layer's fc1/fc2 (hyb/model.h), when the file has them: both or neither. */
static int bind_pi_predictor(struct hyb_loader *ld, uint32_t l)
{
	const struct hyb_hparams *hp = &ld->m->hp;
	struct hyb_layer *L = &ld->m->layers[l];
	const struct hyb_gguf_tensor *t;
	char name[96];
	uint64_t H;

	snprintf(name, sizeof(name), "blk.%u.fc1.weight", l);
	t = hyb_gguf_find_tensor(ld->m->gguf, name);
	if (!t) {
		snprintf(name, sizeof(name), "blk.%u.fc2.weight", l);
		if (hyb_gguf_find_tensor(ld->m->gguf, name))
			return hyb_ld_fail(ld, "blk.%u has fc2 but no fc1", l);
		return 0;
	}
	H = t->n_dims == 2 ? t->ne[1] : 0;
	if (!H || H > (1u << 20))
		return hyb_ld_fail(ld, "tensor %s: expected shape [%u, H], found %u-D", name,
				   hp->n_embd, t->n_dims);
	return hyb_ld_bind_layer(ld, &L->fc1, l, "fc1.weight", hp->n_embd, H, false) ||
	       hyb_ld_bind_layer(ld, &L->fc2, l, "fc2.weight", H, hp->n_ff, false) ? -1 : 0;
}

/*
 * A plan layer (hyb/plan.h): bundles, permutation, placement and predictor.
 * The permutation is checked to be one, since bundle order is what the
 * sparse path and the balancer index by.
 */
static int bind_plan_layer(struct hyb_loader *ld, uint32_t l)
{
	const struct hyb_hparams *hp = &ld->m->hp;
	struct hyb_ffn_plan *P = &ld->m->layers[l].plan;
	const uint32_t ng = ld->m->n_groups;
	const struct hyb_gguf_tensor *fc1;
	char name[96];
	uint8_t *seen;

#define N(nm) (snprintf(name, sizeof(name), "blk.%u." nm, l), name)
	if (hyb_ld_bind(ld, &P->bundles, N("ffn_bundles"), hp->n_embd, 3ull * hp->n_ff, false))
		return -1;
	if (!hyb_sparse_type_ok(P->bundles.type))
		return hyb_ld_fail(ld, "%s has type %s; sparse FFNs are %s", name,
			    hyb_type_name(P->bundles.type), hyb_sparse_type_list());
	if (!(P->perm = bind_vec(ld, N("ffn_perm"), HYB_TYPE_I32, hp->n_ff)) ||
	    !(P->gpu = bind_vec(ld, N("ffn_gpu"), HYB_TYPE_I8, ng)) ||
	    !(P->freq = bind_vec(ld, N("ffn_freq"), HYB_TYPE_F32, ng)))
		return -1;
	seen = calloc(hp->n_ff, 1);
	if (!seen)
		return nomem(ld);
	for (uint32_t i = 0; i < hp->n_ff; i++) {
		int32_t v = P->perm[i];

		if (v < 0 || (uint32_t)v >= hp->n_ff || seen[v]) {
			free(seen);
			return hyb_ld_fail(ld, "blk.%u.ffn_perm is not a permutation of 0..%u", l,
				    hp->n_ff - 1);
		}
		seen[v] = 1;
	}
	free(seen);

	fc1 = hyb_gguf_find_tensor(ld->m->gguf, N("fc1.weight"));
	if (!fc1 || fc1->n_dims != 2 || fc1->ne[1] == 0 || fc1->ne[1] > (1u << 20))
		return hyb_ld_fail(ld, "plan tensor %s is missing or has a bad shape", name);
	P->hidden = (uint32_t)fc1->ne[1];
	if (hyb_ld_bind(ld, &P->fc1, name, hp->n_embd, P->hidden, false) ||
	    hyb_ld_bind(ld, &P->fc2, N("fc2.weight"), hp->n_ff, P->hidden, false))
		return -1;
	if (P->fc1.type != HYB_TYPE_F16 || P->fc2.type != HYB_TYPE_F16)
		return hyb_ld_fail(ld, "blk.%u predictor weights must be F16", l);
	if (!(P->fc1_bias = bind_vec(ld, N("fc1.bias"), HYB_TYPE_F32, P->hidden)) ||
	    !(P->fc2_bias = bind_vec(ld, N("fc2.bias"), HYB_TYPE_F32, hp->n_ff)))
		return -1;
#undef N
	return 0;
}

/* hyb.plan.* keys: a plan file has them all, a plain model none. */
static int read_plan_keys(struct hyb_loader *ld)
{
	struct hyb_model *m = ld->m;
	uint32_t version, gs;

	if (!hyb_gguf_find(m->gguf, HYB_PLAN_KEY_VERSION))
		return 0;
	if (!hyb_gguf_get_u32(m->gguf, HYB_PLAN_KEY_VERSION, &version))
		return hyb_ld_fail(ld, "metadata %s must be a u32", HYB_PLAN_KEY_VERSION);
	if (version != HYB_PLAN_VERSION)
		return hyb_ld_fail(ld, "plan version %u is not supported (this build reads %u)", version,
			    HYB_PLAN_VERSION);
	if (!hyb_gguf_get_u32(m->gguf, HYB_PLAN_KEY_GROUP_SIZE, &gs) || gs == 0 || gs > m->hp.n_ff)
		return hyb_ld_fail(ld, "metadata %s is missing or out of range", HYB_PLAN_KEY_GROUP_SIZE);
	m->group_size = gs;
	m->n_groups = (m->hp.n_ff + gs - 1) / gs;
	m->pred_input = HYB_PRED_ADJACENT;
	if (hyb_gguf_find(m->gguf, HYB_PLAN_KEY_PRED_INPUT)) {
		char in[32];

		if (!hyb_gguf_get_str(m->gguf, HYB_PLAN_KEY_PRED_INPUT, in, sizeof(in)))
			return hyb_ld_fail(ld, "metadata %s is not a short string",
				    HYB_PLAN_KEY_PRED_INPUT);
		if (!strcmp(in, "same-layer"))
			m->pred_input = HYB_PRED_SAME_LAYER;
		else if (strcmp(in, "adjacent"))
			return hyb_ld_fail(ld, "metadata %s '%s' is not supported (adjacent, same-layer)",
				    HYB_PLAN_KEY_PRED_INPUT, in);
	}
	return 0;
}

/* CATS thresholds a file carries (hyb/sparsity.h): every context starts with them. */
static int read_sparsity_keys(struct hyb_loader *ld)
{
	struct hyb_model *m = ld->m;
	const struct hyb_gguf_kv *kv;
	char mode[16];

	if (!hyb_gguf_find(m->gguf, HYB_SPARSITY_KEY_MODE))
		return 0;
	if (!hyb_gguf_get_str(m->gguf, HYB_SPARSITY_KEY_MODE, mode, sizeof(mode)) ||
	    strcmp(mode, HYB_SPARSITY_MODE_CATS))
		return hyb_ld_fail(ld, "metadata %s is not '%s'", HYB_SPARSITY_KEY_MODE,
				   HYB_SPARSITY_MODE_CATS);
	if (m->hp.act != HYB_ACT_SILU && m->hp.act != HYB_ACT_GELU)
		return hyb_ld_fail(ld, "CATS thresholds on a ReLU-family FFN");
	kv = hyb_gguf_get_arr(m->gguf, HYB_SPARSITY_KEY_THRESHOLD, HYB_GGUF_VT_FLOAT32);
	if (!kv || kv->v.arr.n != m->hp.n_layer)
		return hyb_ld_fail(ld, "metadata %s must be %u f32 values", HYB_SPARSITY_KEY_THRESHOLD,
				   m->hp.n_layer);
	if (!hyb_gguf_get_f32(m->gguf, HYB_SPARSITY_KEY_TARGET, &m->ffn_sparsity) ||
	    !(m->ffn_sparsity > 0 && m->ffn_sparsity < 1))
		return hyb_ld_fail(ld, "metadata %s must be an f32 in (0, 1)", HYB_SPARSITY_KEY_TARGET);
	free(m->ffn_thr); /* a load binds twice when it copies the file (load_image) */
	m->ffn_thr = malloc(sizeof(float) * m->hp.n_layer);
	if (!m->ffn_thr)
		return nomem(ld);
	memcpy(m->ffn_thr, kv->v.arr.data, sizeof(float) * m->hp.n_layer);
	for (uint32_t l = 0; l < m->hp.n_layer; l++)
		if (!(m->ffn_thr[l] >= 0) || !isfinite(m->ffn_thr[l]))
			return hyb_ld_fail(ld, "%s of layer %u is %g", HYB_SPARSITY_KEY_THRESHOLD, l,
					   (double)m->ffn_thr[l]);
	return 0;
}

static int bind_layers(struct hyb_loader *ld)
{
	const struct hyb_hparams *hp = &ld->m->hp;
	uint64_t q_dim = (uint64_t)hp->n_head * hp->head_dim;
	uint64_t kv_dim = (uint64_t)hp->n_head_kv * hp->head_dim;
	char name[96];

	if (read_plan_keys(ld) || read_sparsity_keys(ld))
		return -1;
	ld->m->layers = calloc(hp->n_layer, sizeof(*ld->m->layers));
	if (!ld->m->layers)
		return nomem(ld);
	for (uint32_t l = 0; l < hp->n_layer; l++) {
		struct hyb_layer *L = &ld->m->layers[l];
#define B(field, nm, a, b)                                                   \
	do {                                                                 \
		snprintf(name, sizeof(name), "blk.%u." nm ".weight", l);     \
		if (hyb_ld_bind(ld, &L->field, name, a, b, false))                  \
			return -1;                                           \
	} while (0)
		/* the layer's FFN: experts, or dense (DeepSeek's first layers) */
		const bool moe = hp->n_expert && l >= hp->n_dense_lead;

		B(attn_norm, "attn_norm", hp->n_embd, 0);
		/* Q, K and V in one tensor (llama.cpp's build_qkv takes either);
		 * latent attention binds its own (arch_deepseek2.c) */
		const uint64_t qkv_rows[3] = { q_dim, kv_dim, kv_dim };
		struct hyb_weight *const qkv[3] = { &L->wq, &L->wk, &L->wv };
		int rc = arch_of(hp)->mla ? 0 : hyb_ld_bind_fused(ld, l, "attn_qkv.weight", hp->n_embd,
								  3, qkv_rows, qkv, true);

		if (rc < 0)
			return -1;
		if (rc) {
			B(wq, "attn_q", hp->n_embd, q_dim);
			B(wk, "attn_k", hp->n_embd, kv_dim);
			B(wv, "attn_v", hp->n_embd, kv_dim);
		}
		if (!arch_of(hp)->mla)
			B(wo, "attn_output", q_dim, hp->n_embd);
		snprintf(name, sizeof(name), "blk.%u.%s.weight", l,
			 arch_of(hp)->ffn_norm ? arch_of(hp)->ffn_norm : "ffn_norm");
		if (hyb_ld_bind(ld, &L->ffn_norm, name, hp->n_embd, 0, false))
			return -1;
		if (moe) {
			if (ld->m->group_size || ld->m->powerinfer)
				return hyb_ld_fail(ld, "a mixture-of-experts model cannot be a %s file",
						   ld->m->group_size ? "plan" : "PowerInfer");
			if (hyb_ld_moe_layer(ld, L, l))
				return -1;
		}
		/* llama.cpp's build_qkv adds Q/K/V biases wherever a file has them */
		if ((!arch_of(hp)->mla &&
		     (hyb_ld_bias(ld, &L->bq, l, "attn_q.bias", q_dim, true) ||
		      hyb_ld_bias(ld, &L->bk, l, "attn_k.bias", kv_dim, true) ||
		      hyb_ld_bias(ld, &L->bv, l, "attn_v.bias", kv_dim, true))) ||
		    (arch_of(hp)->layer && arch_of(hp)->layer(ld, L, l)))
			return -1;
		if (moe)
			continue;
		snprintf(name, sizeof(name), "blk.%u.ffn_gate_exps.weight", l);
		if (hyb_gguf_find_tensor(ld->m->gguf, name))
			return hyb_ld_fail(ld, "tensor %s holds experts, but metadata %s.expert_count "
					   "is missing or 0", name, hp->arch);
		if (ld->m->group_size) {
			if (bind_plan_layer(ld, l))
				return -1;
			continue;
		}
		if (arch_of(hp)->fused_gate_up) {
			const uint64_t gu_rows[2] = { hp->n_ff, hp->n_ff };
			struct hyb_weight *const gu[2] = { &L->gate, &L->up };

			if (hyb_ld_bind_fused(ld, l, "ffn_up.weight", hp->n_embd, 2, gu_rows, gu, false))
				return -1;
		} else {
			B(gate, "ffn_gate", hp->n_embd, hp->n_ff);
			B(up, "ffn_up", hp->n_embd, hp->n_ff);
		}
		if (ld->m->powerinfer)
			B(down_t, "ffn_down_t", hp->n_embd, hp->n_ff);
		else
			B(down, "ffn_down", hp->n_ff, hp->n_embd);
#undef B
		if (ld->m->powerinfer && bind_pi_predictor(ld, l))
			return -1;
		/* its rows go through the sparse axpy (hyb_ffn_down_t) */
		if (ld->m->powerinfer && !hyb_sparse_type_ok(L->down_t.type))
			return hyb_ld_fail(ld, "blk.%u.ffn_down_t has type %s; transposed down is "
				    "%s", l, hyb_type_name(L->down_t.type),
				    hyb_sparse_type_list());
	}
	return 0;
}

/*
 * Llama 3.1+'s RoPE frequency factors: one F32 divisor per rotary pair,
 * which llama.cpp applies to every layer whatever rope.scaling.type says.
 */
static int bind_rope_freqs(struct hyb_loader *ld)
{
	struct hyb_hparams *hp = &ld->m->hp;
	const char *name = "rope_freqs.weight";
	const struct hyb_gguf_tensor *t = hyb_gguf_find_tensor(ld->m->gguf, name);
	const float *f;

	if (!t) {
		if (ld->rope_llama3)
			return hyb_ld_fail(ld, "tensor %s is missing: %s.rope.scaling.type llama3 needs "
				    "its frequency factors", name, hp->arch);
		return 0;
	}
	if (t->type != HYB_TYPE_F32 || t->n_dims != 1 || t->ne[0] < hp->n_rot / 2)
		return hyb_ld_fail(ld, "tensor %s: expected F32 [%u], found %s %u-D [%llu, ...]", name,
			    hp->n_rot / 2, hyb_type_name(t->type), t->n_dims,
			    (unsigned long long)t->ne[0]);
	f = t->data;
	for (uint32_t i = 0; i < hp->n_rot / 2; i++)
		if (!(f[i] > 0) || !isfinite(f[i]))
			return hyb_ld_fail(ld, "tensor %s: factor %u is %g, not a positive number", name,
				    i, (double)f[i]);
	hp->rope.freq_factors = f;
	return 0;
}

static int bind_model(struct hyb_loader *ld)
{
	struct hyb_model *m = ld->m;
	const struct hyb_gguf_tensor *emb = hyb_gguf_find_tensor(m->gguf, "token_embd.weight");
	int rc;

	if (!emb)
		return hyb_ld_fail(ld, "tensor token_embd.weight is missing");
	if (emb->n_dims != 2 || emb->ne[0] != m->hp.n_embd || emb->ne[1] == 0 ||
	    emb->ne[1] > INT32_MAX)
		return hyb_ld_fail(ld, "tensor token_embd.weight has a bad shape");
	m->hp.n_vocab = (uint32_t)emb->ne[1];
	if (hyb_ld_bind(ld, &m->tok_embd, "token_embd.weight", m->hp.n_embd, m->hp.n_vocab, false) ||
	    hyb_ld_bind(ld, &m->out_norm, "output_norm.weight", m->hp.n_embd, 0, false))
		return -1;
	rc = hyb_ld_bind(ld, &m->output, "output.weight", m->hp.n_embd, m->hp.n_vocab, true);
	if (rc < 0)
		return -1;
	if (rc == 1) /* tied embeddings: the head reuses token_embd */
		m->output = m->tok_embd;
	return bind_rope_freqs(ld) || bind_layers(ld) ? -1 : 0;
}

#define HUGE_PAGE (2ul << 20)

/* Give back the image memory, whichever way it was had. */
static void free_image(struct hyb_model *m)
{
	if (m->image_pool) {
		hyb_mempool_destroy(m->image_pool);
		hyb_mempool_close(m->image_pool);
		m->image_pool = NULL;
	} else if (m->image) {
		munmap(m->image, m->image_len);
	}
	if (m->image_backend)
		hyb_backend_close(m->image_backend);
	m->image_backend = NULL;
	m->image = NULL;
}

/*
 * The weights live in a pool of the local backend: embedded mode loads
 * through the same io_uring streaming engine as hybd.
 * A private (THP) pool of len bytes; NULL with the reason in why when none can be had.
 */
static void *pool_image(struct hyb_model *m, uint64_t len, bool lazy, char *why, size_t whylen)
{
	static atomic_uint seq;
	char name[HYB_MEMPOOL_NAME_LEN];
	void *image = NULL;
	size_t plen;
	int ret;

	snprintf(name, sizeof(name), "model-%d-%u", (int)getpid(), atomic_fetch_add(&seq, 1));
	m->image_backend = hyb_backend_open(HYB_BACKEND_LOCAL);
	if (!m->image_backend) {
		snprintf(why, whylen, "%s", hyb_last_error());
		return NULL;
	}
	ret = hyb_mempool_create(m->image_backend, name, len, HYB_MEMPOOL_NODE_LOCAL, 0,
				 lazy ? HYB_MEMPOOL_LAZY : 0, &m->image_pool);
	if (!ret)
		ret = hyb_mempool_map(m->image_pool, &image, &plen);
	if (ret) {
		snprintf(why, whylen, "%s", hyb_last_error());
		free_image(m);
		return NULL;
	}
	return image;
}

/* Anonymous memory on a huge-page boundary with THP asked for (when no pool can be had). */
static void *anon_image(uint64_t len)
{
	uint8_t *buf = mmap(NULL, len + HUGE_PAGE, PROT_READ | PROT_WRITE,
			    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	uint8_t *aligned;

	if (buf == MAP_FAILED)
		return NULL;
	aligned = (uint8_t *)(((uintptr_t)buf + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1));
	if (aligned > buf)
		munmap(buf, aligned - buf);
	munmap(aligned + len, buf + HUGE_PAGE - aligned);
	madvise(aligned, len, MADV_HUGEPAGE);
	return aligned;
}

/*
 * Stream the whole file into 2 MiB-page memory (a local pool) with io_uring
 * and parse it there. The model is only returned (made "ready") when every
 * byte arrived; on failure the memory is given back. In the background
 * (model_stream.c) only the header must have arrived: the rest keeps
 * streaming, and readers wait for the bytes they need.
 */
static int load_image(struct hyb_model *m, const char *path, bool background, char *err,
		      size_t errlen)
{
	uint64_t size = m->gguf->size, len = (size + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
	/* a bar for big models on a terminal; `hyb run` prints the load time itself */
	struct hyb_stream_opts o = {
		.progress = isatty(2) && size >= (256u << 20) ? HYB_STREAM_BAR : HYB_STREAM_QUIET,
		.label = path, .pread = hyb_model_load_pread(),
	};
	char why[256];
	/* in the background the zeroing of the pages overlaps the reads too */
	void *buf = pool_image(m, len, background, why, sizeof(why));
	int rc;

	if (!buf) {
		fprintf(stderr, "hyb: %s: no memory pool (%s): loading into process memory\n",
			path, why);
		buf = anon_image(len);
	}
	if (!buf) {
		rc = -errno;
		snprintf(err, errlen, "%s: cannot allocate %.1f MiB for the weights: %s", path,
			 len / 1048576.0, strerror(-rc));
		return rc;
	}
	m->image = buf;
	m->image_len = len;
	if (background) {
		/* the header is what hyb_gguf_parse reads: wait for it alone */
		uint64_t header = m->gguf->data_offset;

		rc = hyb_model_stream_start(m, path, buf, size, err, errlen);
		if (rc || (rc = hyb_model_wait_bytes(m, header, err, errlen)))
			return rc;
	} else {
		rc = hyb_stream_read(path, 0, size, buf, &o, NULL);
		if (rc) {
			snprintf(err, errlen, "%s", hyb_last_error());
			free_image(m);
			return rc;
		}
	}
	hyb_gguf_close(m->gguf);
	m->gguf = NULL;
	rc = hyb_gguf_parse(buf, size, &m->gguf);
	if (rc) /* the file changed between the two reads */
		snprintf(err, errlen, "%s", hyb_last_error());
	return rc;
}

/* HYB_LOAD=hugepage|mmap|pread (unset: hugepage; pread: hugepage, read by pread threads). */
static int load_mode_env(enum hyb_load_mode *mode)
{
	const char *v = getenv("HYB_LOAD");

	if (v && strcmp(v, "mmap") && strcmp(v, "hugepage") && strcmp(v, "pread"))
		return hyb_error_set(-EINVAL, "HYB_LOAD=%s: expected hugepage, mmap or pread", v);
	*mode = v && !strcmp(v, "mmap") ? HYB_LOAD_MMAP : HYB_LOAD_HUGEPAGE;
	return 0;
}

bool hyb_model_load_pread(void)
{
	const char *v = getenv("HYB_LOAD");

	return v && !strcmp(v, "pread");
}

struct hyb_model *hyb_model_load(const char *path)
{
	enum hyb_load_mode mode;

	if (load_mode_env(&mode))
		return NULL;
	return hyb_model_load_mode(path, mode);
}

/*
 * What every way of loading shares once m->gguf describes the model and each
 * tensor's data points at its bytes: hyperparameters, binding and shape
 * checks, the tokenizer. label prefixes errors (the file or manifest).
 */
static int finish_model(struct hyb_loader *ld, const char *label)
{
	struct hyb_model *m = ld->m;

	if (read_hparams(ld) || bind_model(ld)) {
		/* prefix the file name so the user knows which model is wrong */
		char msg[512];

		snprintf(msg, sizeof(msg), "%s: %s", label, ld->err);
		snprintf(ld->err, ld->errlen, "%s", msg);
		return -1;
	}
	for (uint64_t i = 0; i < m->gguf->n_tensors; i++)
		m->weight_bytes += m->gguf->tensors[i].nbytes;
	m->tok = hyb_tokenizer_load(m->gguf);
	/* No tokenizer is fine for token-id use (hyb logits); callers check m->tok. */
	return 0;
}

int hyb_model_finish(struct hyb_model *m, const char *label, char *err, size_t errlen)
{
	struct hyb_loader ld = { .m = m, .err = err, .errlen = errlen };

	return finish_model(&ld, label) ? ld.rc : 0;
}

/* The model, or NULL with the reason in hyb_last_error(). */
static struct hyb_model *load(const char *path, enum hyb_load_mode mode, bool background)
{
	struct hyb_model *m = calloc(1, sizeof(*m));
	char err[1024] = "";
	struct hyb_loader ld = { .m = m, .err = err, .errlen = sizeof(err) };
	int rc;

	if (!m) {
		hyb_error_set(-ENOMEM, "%s: out of memory", path);
		return NULL;
	}
	if (hyb_gguf_open(path, &m->gguf)) {
		hyb_model_free(m);
		return NULL; /* its message names the file */
	}
	/* Check the metadata on the mapping first: a bad file fails before any copy. */
	if (!read_hparams(&ld) && mode == HYB_LOAD_HUGEPAGE) {
		/*
		 * Binding a plan or PowerInfer file reads tensors: those load whole.
		 * So does a file wholly in the page cache (asked before the header
		 * was read through the mapping): see hyb_model_load_streaming.
		 */
		bool plain = !m->powerinfer && !hyb_gguf_find(m->gguf, HYB_PLAN_KEY_VERSION);

		free(m->layers);
		m->layers = NULL;
		rc = load_image(m, path, background && plain, err, sizeof(err));
		if (rc)
			goto out_free;
	}
	if (finish_model(&ld, path)) {
		rc = ld.rc;
		goto out_free;
	}
	if (m->stream) {
		rc = hyb_model_stream_index(m, err, sizeof(err));
		if (rc)
			goto out_free;
	}

	/* Weights are read in place; ask for read-ahead of the whole mapping. */
	if (!m->image && m->gguf->map)
		madvise(m->gguf->map, m->gguf->map_len, MADV_WILLNEED);
	return m;

out_free:
	hyb_model_free(m);
	hyb_error_set(rc, "%s", err);
	return NULL;
}

struct hyb_model *hyb_model_load_mode(const char *path, enum hyb_load_mode mode)
{
	return load(path, mode, false);
}

/*
 * Streaming pays off when the reads wait on the drive. A file wholly in the
 * page cache loads whole first: copying it runs at memory speed on the cores
 * the prompt needs, so overlapping hides little and the two contend (on 2
 * vCPUs it made the first token later; tests/bench/bench_ttft.sh).
 */
struct hyb_model *hyb_model_load_streaming(const char *path)
{
	enum hyb_load_mode mode;

	if (load_mode_env(&mode))
		return NULL;
	return load(path, mode, !hyb_stream_cached(path));
}

void hyb_model_free(struct hyb_model *m)
{
	if (!m)
		return;
	hyb_model_stream_stop(m);	/* before the image it fills goes */
	if (m->tok)
		hyb_tokenizer_free(m->tok);
	free(m->layers);
	free(m->ffn_thr);
	hyb_teal_free(m->teal);
	if (m->gguf)
		hyb_gguf_close(m->gguf);
	hyb_model_box_release(m);	/* pool handles go before the backend free_image closes */
	free_image(m);
	free(m);
}

static uint64_t weight_bytes(const struct hyb_weight *w)
{
	return w->row_bytes * w->ne1 * (w->ne2 ? w->ne2 : 1);
}

/* The bytes of n_expert_used of a layer's experts: what a token reads of them. */
static uint64_t routed_bytes(const struct hyb_hparams *hp, const struct hyb_layer *L)
{
	if (!hp->n_expert)
		return 0;
	return (weight_bytes(&L->gate_exps) + weight_bytes(&L->up_exps) +
		weight_bytes(&L->down_exps)) / hp->n_expert * hp->n_expert_used;
}

uint64_t hyb_model_decode_bytes(const struct hyb_model *m)
{
	uint64_t b = weight_bytes(&m->output) + m->tok_embd.row_bytes;

	for (uint32_t l = 0; l < m->hp.n_layer; l++) {
		const struct hyb_layer *L = &m->layers[l];

		b += weight_bytes(&L->wq) + weight_bytes(&L->wk) + weight_bytes(&L->wv) +
		     weight_bytes(&L->wo) + weight_bytes(&L->gate) + weight_bytes(&L->up) +
		     weight_bytes(&L->down) + weight_bytes(&L->down_t) +
		     2 * m->hp.n_embd * sizeof(float);
		b += weight_bytes(&L->wq_a) + weight_bytes(&L->wq_b) + weight_bytes(&L->wkv_a) +
		     weight_bytes(&L->wk_b) + weight_bytes(&L->wv_b);
		b += weight_bytes(&L->gate_inp) + routed_bytes(&m->hp, L) +
		     weight_bytes(&L->gate_shexp) + weight_bytes(&L->up_shexp) +
		     weight_bytes(&L->down_shexp) + weight_bytes(&L->gate_inp_shexp);
		if (m->group_size) /* every neuron once: the dense pass over bundles */
			b += weight_bytes(&L->plan.bundles);
	}
	return b;
}

uint64_t hyb_model_macs_per_token(const struct hyb_model *m)
{
	const struct hyb_hparams *hp = &m->hp;
	uint64_t q_dim = (uint64_t)hp->n_head * hp->head_dim;
	uint64_t kv_dim = (uint64_t)hp->n_head_kv * hp->head_dim;
	/* a MoE layer: the router, n_expert_used experts and the shared one */
	uint64_t ffn = hp->n_expert ? (uint64_t)hp->n_expert + 3ull * hp->n_expert_used * hp->n_ff_exp +
					      3ull * hp->n_ff_shexp
				    : 3ull * hp->n_ff;
	uint64_t per_layer = hp->n_embd * (2 * q_dim + 2 * kv_dim + ffn);

	if (hp->kv_lora) { /* latent attention: its own matrices, each weight once */
		const struct hyb_layer *L = &m->layers[hp->n_layer - 1];
		const struct hyb_weight *w[] = { &L->wq, &L->wq_a, &L->wq_b, &L->wkv_a,
						 &L->wk_b, &L->wv_b, &L->wo };

		per_layer = hp->n_embd * ffn;
		for (size_t i = 0; i < sizeof(w) / sizeof(w[0]); i++)
			per_layer += w[i]->data ? w[i]->ne0 * w[i]->ne1 * (w[i]->ne2 ? w[i]->ne2 : 1)
						: 0;
	}

	return per_layer * hp->n_layer + (uint64_t)hp->n_embd * hp->n_vocab;
}

/* -- box mode: a model hybd loaded, found through its manifest ------------ */
