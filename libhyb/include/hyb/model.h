/* SPDX-License-Identifier: MIT */
/*
 * A llama-family model read from GGUF, and the context that runs it.
 *
 * hyb_model_load() maps the file and points every weight at its bytes in
 * the mapping: weights are never copied. hyb_ctx holds what one sequence
 * needs (KV cache, scratch, thread pool); hyb_ctx_eval() runs a batch of
 * tokens (prefill: one batched GEMM per weight; decode: n == 1).
 *
 * Failures return a negative errno (or NULL) with a one-line message in
 * hyb_last_error() (hyb/error.h).
 */
#ifndef HYB_MODEL_H
#define HYB_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hyb/error.h"

struct hyb_gguf_file;
struct hyb_backend;
struct hyb_mempool;
struct hyb_tokenizer;

enum hyb_ffn_act {
	HYB_ACT_SILU,  /* SwiGLU: down(silu(gate) * up) — llama */
	HYB_ACT_RELU,  /* ReGLU: down(relu(gate) * up) — ReluLLaMA, ProSparse */
	HYB_ACT_RELU2, /* gated squared ReLU: down(relu(gate)^2 * up) */
	HYB_ACT_DRELU, /* dReLU: down(relu(gate) * relu(up)) — TurboSparse */
	HYB_ACT_GELU,  /* GeGLU: down(gelu_tanh(gate) * up) — Gemma */
	/* gpt-oss's experts: x = min(gate, 7), y = clamp(up, -7, 7),
	 * down(x * sigmoid(1.702 x) * (y + 1)) (llama.cpp ggml_swiglu_oai) */
	HYB_ACT_SWIGLU_OAI,
};

/* The architectures hyb runs (general.architecture; docs/MODELS.md). */
enum hyb_arch {
	HYB_ARCH_LLAMA,
	HYB_ARCH_QWEN2,  /* + Q/K/V biases, NeoX RoPE */
	HYB_ARCH_QWEN3,  /* + Q/K RMS norms per head, NeoX RoPE */
	HYB_ARCH_GEMMA3, /* + norms after attention and FFN, GeGLU, scaled embeddings,
			  * Q/K norms, sliding-window layers with their own RoPE */
	HYB_ARCH_PHI3,   /* fused QKV and gate/up tensors, LongRoPE factors, NeoX RoPE */
	HYB_ARCH_QWEN2MOE, /* qwen2 attention, routed experts + a gated shared expert */
	HYB_ARCH_QWEN3MOE, /* qwen3 attention, routed experts, normalised top-k weights */
	HYB_ARCH_DEEPSEEK2, /* latent attention, shared + routed experts, dense first layers */
	HYB_ARCH_GLM4MOE,   /* biased GQA, partial NeoX RoPE, V3-style routing, shared experts */
	HYB_ARCH_DOTS1,     /* qwen3 attention, V3-style routing, shared experts */
	HYB_ARCH_OLMOE,     /* Q/K norms over the whole projection, routed experts */
	HYB_ARCH_GPTOSS,    /* biased attention with sinks, alternating sliding windows,
			     * biased experts with a clamped SwiGLU, softmax over the chosen */
};

/*
 * Rotary position embedding as llama.cpp's ggml_rope_ext computes its angles
 * (ggml-cpu ops.cpp rope_yarn, ggml_rope_cache_init): theta_i = pos *
 * base^(-2i/n_rot) / freq_factors[i], interpolated by freq_scale and, for
 * YaRN, mixed back towards extrapolation between corr_dims, cos and sin
 * scaled by attn_factor. Plain RoPE is freq_scale 1, ext_factor 0,
 * attn_factor 1, no freq_factors.
 */
struct hyb_rope {
	float base;                /* rope.freq_base */
	float freq_scale;          /* 1 / rope.scaling.factor (linear, yarn) */
	float ext_factor;          /* YaRN's extrapolation mix: 1 for yarn, else 0 */
	float attn_factor;         /* magnitude of cos and sin (llama.cpp's yarn_attn_factor) */
	float corr_dims[2];        /* YaRN: the dims the ramp runs between */
	const float *freq_factors; /* rope_freqs.weight [n_rot / 2] (Llama 3.1+), or NULL */
};

struct hyb_hparams {
	char arch[32];
	enum hyb_arch arch_id;
	uint32_t n_vocab;
	uint32_t n_embd;
	uint32_t n_layer;
	uint32_t n_ff;
	uint32_t n_head;
	uint32_t n_head_kv;
	uint32_t head_dim;
	uint32_t n_rot;        /* rotary dimensions (<= head_dim) */
	uint32_t n_ctx_train;
	float rms_eps;
	struct hyb_rope rope;
	/*
	 * Architecture traits the forward pass follows (set by the arch_*.c
	 * files): embeddings multiplied by embd_scale (0: not); q multiplied by
	 * q_scale before attention, which then scales by 1 (0: attention
	 * scales by 1 / sqrt(head_dim)); sliding-window layers (hyb_layer.swa)
	 * see the last n_swa positions and rotate with rope_swa.
	 */
	float embd_scale;
	float q_scale;
	uint32_t n_swa, swa_pattern;
	struct hyb_rope rope_swa;
	uint32_t n_ctx_orig;   /* rope.scaling.original_context_length (YaRN) */
	/* Phi-3 LongRoPE: frequency factors for contexts up to n_ctx_orig and
	 * beyond (rope_factors_short/long.weight; llama_model::get_rope_factors
	 * picks by the context's size), or NULL */
	const float *rope_short, *rope_long;
	bool rope_neox;        /* rotate halves (NeoX) instead of adjacent pairs */
	enum hyb_ffn_act act;
	/*
	 * Mixture of experts (docs/MOE.md; n_expert 0: every FFN is dense): a
	 * router picks n_expert_used of n_expert experts of n_ff_exp neurons
	 * per token, by softmax probability; their outputs are summed weighted
	 * by those probabilities, renormalised to sum 1 when expert_norm. A
	 * shared expert of n_ff_shexp neurons (0: none) runs for every token.
	 */
	uint32_t n_expert, n_expert_used, n_ff_exp, n_ff_shexp;
	bool expert_norm;
	/* DeepSeek V3's routing (0 / false: not used): scores by sigmoid instead
	 * of softmax, chosen weights times expert_scale, experts in groups of
	 * which the n_group_used best (by their top two scores) are eligible;
	 * the first n_dense_lead layers have a dense FFN */
	bool expert_sigmoid;
	/* gpt-oss: experts chosen by their logits, weights the softmax of the chosen */
	bool expert_softmax_weight;
	float expert_scale;
	uint32_t n_expert_groups, n_group_used, n_dense_lead;
	/*
	 * DeepSeek's multi-head latent attention (attention_mla.c; kv_lora 0:
	 * none). Per head q has mla_nope + n_rot dims (q_lora > 0: through a
	 * rank-q_lora bottleneck), K and V come from one cached latent row of
	 * kv_lora dims + n_rot shared RoPE dims: head_dim = kv_lora + n_rot is
	 * the cached K row, V its first kv_lora dims; a head's output goes up to
	 * mla_v dims. The scores are scaled by mla_scale.
	 */
	uint32_t kv_lora, q_lora, mla_nope, mla_v;
	float mla_scale;
};

/* A weight matrix in place: rows of ne0 elements, ne1 rows. */
struct hyb_weight {
	uint32_t type;
	uint64_t ne0, ne1;
	uint64_t row_bytes;
	const void *data;
	/* rows of the whole tensor when this is a slice of a fused one (Phi-3's
	 * QKV and gate/up): llama.cpp's summation order follows them; 0: ne1 */
	uint64_t fused_rows;
	/* experts of a 3-D expert tensor, expert e's matrix at data + e * ne1 *
	 * row_bytes (hyb_weight_expert); 0: a plain matrix */
	uint64_t ne2;
	/* llama.cpp leaves it as stored where its 8x8 repacking would apply (a
	 * 3-D tensor in a plain matmul): the kernels then sum in that order */
	bool flat;
	/* experts whose rows are split across NUMA nodes (docs/NUMA.md); NULL:
	 * the experts lie one after another from data */
	const struct hyb_weight_split *split;
};

#define HYB_WEIGHT_MAX_PARTS 8

/*
 * An expert tensor split by rows across nodes (hybd's split_experts): part
 * i holds rows [row0[i], row0[i + 1]) of every expert, expert e's at
 * data[i] + e * stride[i], on NUMA node node[i].
 */
struct hyb_weight_split {
	uint32_t n;
	uint64_t row0[HYB_WEIGHT_MAX_PARTS + 1];
	const char *data[HYB_WEIGHT_MAX_PARTS];
	uint64_t stride[HYB_WEIGHT_MAX_PARTS];
	int32_t node[HYB_WEIGHT_MAX_PARTS];
};

/*
 * Row r of expert e of a 3-D expert tensor (or of a slice of a fused one),
 * and in *n how many rows from it lie one after another (to the end of its
 * part, or of the matrix).
 */
static inline const char *hyb_weight_rows(const struct hyb_weight *w, uint32_t e, uint64_t r,
					  uint64_t *n)
{
	const struct hyb_weight_split *s = w->split;
	uint32_t i = 0;

	if (!s) {
		*n = w->ne1 - r;
		return (const char *)w->data +
		       ((uint64_t)e * (w->fused_rows ? w->fused_rows : w->ne1) + r) * w->row_bytes;
	}
	while (i + 1 < s->n && r >= s->row0[i + 1])
		i++;
	*n = s->row0[i + 1] - r;
	return s->data[i] + (uint64_t)e * s->stride[i] + (r - s->row0[i]) * w->row_bytes;
}

/*
 * Expert e of a 3-D expert tensor (or of a slice of a fused one), as a
 * matrix; not for a split tensor (its rows are not one block: use
 * hyb_weight_rows).
 */
static inline struct hyb_weight hyb_weight_expert(const struct hyb_weight *w, uint32_t e)
{
	struct hyb_weight x = *w;
	uint64_t n;

	x.data = hyb_weight_rows(w, e, 0, &n);
	x.ne2 = 0;
	x.split = NULL;
	return x;
}

/*
 * A layer's FFN as a plan file stores it (hyb/plan.h): neuron groups in
 * bundles, the group placement and the activation predictor. Filled only
 * when the model is a plan (hyb_model.group_size != 0).
 */
struct hyb_ffn_plan {
	struct hyb_weight bundles;  /* ne0 = n_embd, ne1 = 3 * n_ff rows */
	const int32_t *perm;        /* [n_ff] source neuron of each bundle-order neuron */
	const int8_t *gpu;          /* [n_groups] initial placement */
	const float *freq;          /* [n_groups] profiled activation frequency */
	struct hyb_weight fc1, fc2; /* predictor: F16 [n_embd -> hidden], [hidden -> n_ff] */
	const float *fc1_bias, *fc2_bias;
	uint32_t hidden;
};

struct hyb_layer {
	struct hyb_weight attn_norm, wq, wk, wv, wo;
	/* optional (NULL / data NULL when the architecture has none): Q/K/V
	 * biases; Q and K RMS norms per head [head_dim] (or over the whole
	 * projection, [n_head * head_dim] / [n_head_kv * head_dim]: OLMoE); norms of the attention
	 * and FFN outputs before they join the residual */
	const float *bq, *bk, *bv;
	struct hyb_weight q_norm, k_norm, post_attn_norm, post_ffn_norm;
	bool swa; /* a sliding-window layer (hparams n_swa, rope_swa) */
	struct hyb_weight ffn_norm, gate, up, down; /* data NULL in a plan: see plan */
	/* PowerInfer model files store down transposed (ffn_down_t: ne0 = n_embd,
	 * ne1 = n_ff, row i = what neuron i adds); then down.data is NULL. */
	struct hyb_weight down_t;
	/* ... and the layer's predictor as stored (PowerInfer 5.1, no biases):
	 * fc1 ne0 = n_embd, ne1 = H; fc2 ne0 = H, ne1 = n_ff (a row per neuron);
	 * data NULL when the file has none. */
	struct hyb_weight fc1, fc2;
	struct hyb_ffn_plan plan;
	/*
	 * A MoE layer (hparams n_expert > 0; gate, up, down have no data): the
	 * router [n_embd -> n_expert], the experts' gate and up [n_embd ->
	 * n_ff_exp] and down [n_ff_exp -> n_embd] (ne2 = n_expert); the shared
	 * expert and, when it is gated (qwen2moe), its gate [n_embd -> 1].
	 */
	struct hyb_weight gate_inp, gate_exps, up_exps, down_exps;
	struct hyb_weight gate_shexp, up_shexp, down_shexp, gate_inp_shexp;
	const float *exp_probs_b; /* [n_expert] added to the scores to choose (V3) */
	/* gpt-oss (NULL: none): the router's bias [n_expert]; the experts' biases,
	 * [n_expert][n_ff_exp] for gate and up, [n_expert][n_embd] for down */
	const float *gate_inp_b, *gate_exps_b, *up_exps_b, *down_exps_b;
	/* gpt-oss (NULL: none): the attention output's bias [n_embd]; a logit per
	 * head that every query also attends to, with no value (attention sinks) */
	const float *bo, *attn_sinks;
	/*
	 * Latent attention (hparams kv_lora > 0; wq then holds q when q_lora is
	 * 0, wk, wv are unused): q through wq_a, q_a_norm, wq_b; wkv_a [n_embd ->
	 * kv_lora + n_rot] and kv_a_norm; per head wk_b [mla_nope -> kv_lora]
	 * and wv_b [kv_lora -> mla_v] (ne2 = n_head); wo [n_head * mla_v -> n_embd].
	 */
	struct hyb_weight wq_a, q_a_norm, wq_b, wkv_a, kv_a_norm, wk_b, wv_b;
};

/*
 * What a plan's activation predictors read (hyb/plan.h, key
 * hyb.plan.predictor_input).
 */
enum hyb_pred_input {
	/* "adjacent": the residual after layer l-1's attention, unit RMS (KAIROX
	 * 5.1; layer 0 reads its own). What `hybctl plan` trains. */
	HYB_PRED_ADJACENT,
	/* "same-layer": the residual after layer l's own attention as it is, no
	 * normalisation: PowerInfer's llama predictors (its llama.cpp feeds them
	 * ffn_inp), imported from a PowerInfer GGUF. */
	HYB_PRED_SAME_LAYER,
};

struct hyb_model {
	struct hyb_hparams hp;
	struct hyb_gguf_file *gguf;
	struct hyb_tokenizer *tok;
	struct hyb_weight tok_embd, out_norm, output;
	struct hyb_layer *layers;
	uint64_t weight_bytes;   /* all tensors in the file */
	uint32_t group_size;     /* neurons per FFN group of a plan file; 0: not a plan */
	uint32_t n_groups;       /* groups per layer (plan) */
	enum hyb_pred_input pred_input; /* plan: what the predictors read */
	/* A PowerInfer model file (ffn_down_t, fc1/fc2 predictors): its
	 * powerinfer.sparse_threshold (0 when absent): neuron i runs when its
	 * predictor score is >= it. */
	bool powerinfer;
	float powerinfer_threshold;
	/* CATS thresholds the file carries (hyb/sparsity.h; NULL: none): every
	 * context starts with them. ffn_sparsity: the target they were set for. */
	float *ffn_thr;
	float ffn_sparsity;
	/* TEAL's transposed weights (libhyb/sparse/teal.h), made when a context
	 * first decodes with TEAL thresholds; NULL until then. */
	struct hyb_teal *teal;
	/* Huge-page copy of the file the weights point into (NULL: the file's mmap). */
	void *image;
	uint64_t image_len;
	/* The local-backend pool holding image (NULL: plain anonymous memory). */
	struct hyb_backend *image_backend;
	struct hyb_mempool *image_pool;
	/* The image still filling behind the first prompt (hyb_model_load_streaming;
	 * NULL: every byte was in before the load returned). */
	struct hyb_model_stream *stream;
};

/*
 * Where weights live. HYB_LOAD_HUGEPAGE (the default) reads the file once into
 * 2 MiB-page memory: decode streams every weight per token, and 4 KiB page-cache
 * pages cost a quarter of the DRAM bandwidth in TLB misses here. HYB_LOAD_MMAP
 * computes on the file mapping (no load time, shares the page cache).
 */
enum hyb_load_mode { HYB_LOAD_HUGEPAGE, HYB_LOAD_MMAP };

/*
 * NULL with the reason in hyb_last_error(), which names the file: it cannot
 * be read, is no GGUF, or holds a model hyb cannot run (the architecture,
 * tensor or key that is wrong). The load mode comes from
 * HYB_LOAD=hugepage|mmap.
 */
struct hyb_model *hyb_model_load(const char *path);
struct hyb_model *hyb_model_load_mode(const char *path, enum hyb_load_mode mode);
void hyb_model_free(struct hyb_model *m);

/*
 * hyb_model_load with the weights still arriving when it returns (for the
 * time to first token): the image fills on a thread of its own once the
 * header is in, and a context's prompt pass waits for each layer's bytes just
 * before it reads them, so the first layers compute while the last are read.
 * Only a plain model in huge-page memory, read from the drive, streams: a
 * file wholly in the page cache, a plan or PowerInfer file and HYB_LOAD=mmap
 * load as hyb_model_load does.
 * Whatever else reads weights must call hyb_model_wait first (hybrid contexts
 * do). A failed load fails every wait with its error (the read's errno,
 * "loading the model failed: ..."); the model can still be freed, and freeing
 * a model still loading cancels the load.
 */
struct hyb_model *hyb_model_load_streaming(const char *path);
/*
 * 0 once the load has finished, all of it in memory (at once unless it
 * streams); the failed read's errno (-EIO...) when it failed.
 */
int hyb_model_wait(const struct hyb_model *m);
/* True while a streaming load is still reading. */
bool hyb_model_loading(const struct hyb_model *m);
/* The finished load's engine statistics (hyb/stream.h; zeros while it runs, or when nothing streamed). */
struct hyb_stream_stats;
void hyb_model_load_stats(const struct hyb_model *m, struct hyb_stream_stats *out);
/* Bytes of weights one decode step reads (every matrix once + one embedding row). */
uint64_t hyb_model_decode_bytes(const struct hyb_model *m);
/* Multiply-adds per token in the weight matrices (attention scores excluded). */
uint64_t hyb_model_macs_per_token(const struct hyb_model *m);

/*
 * How a plan model's FFNs decode (prefill is always dense: PowerInfer 5.3,
 * long inputs activate nearly every neuron). AUTO: sparse for plan models
 * and for PowerInfer model files with predictors; those run their
 * predictors on every token, the prompt's too, as PowerInfer does.
 */
enum hyb_ffn_mode { HYB_FFN_AUTO, HYB_FFN_DENSE, HYB_FFN_SPARSE };

struct hyb_hybrid_params;

struct hyb_ctx_params {
	uint32_t n_ctx;     /* 0: min(n_ctx_train, 4096) */
	int n_threads;      /* <= 0: all online CPUs */
	uint32_t n_batch;   /* prompt tokens per pass; 0: 512 */
	/*
	 * Expert deferral (KTransformers section 5; docs/MOE.md): in decode
	 * steps the moe_defer lowest-ranked of each layer's chosen experts join
	 * the residual one MoE layer later (the last layer defers nothing), so
	 * that a hybrid engine can compute them while the next layer runs. 0:
	 * none; at most n_expert_used - 1.
	 */
	uint32_t moe_defer;
	enum hyb_ffn_mode ffn;
	/* Hybrid GPU-CPU decoding of a plan (hyb/hybrid.h); NULL: CPU only. */
	const struct hyb_hybrid_params *hybrid;
	/*
	 * Sequences decoded together (hyb_ctx_eval_seqs below), each of up to
	 * n_ctx positions, over one paged KV cache of kv_size positions (0:
	 * n_seq * n_ctx; only what sequences use is touched). 0 or 1: one
	 * sequence, hyb_ctx_eval's.
	 */
	uint32_t n_seq;
	uint32_t kv_size;
	/*
	 * Batched passes sum each token's products as a pass of that token
	 * alone does, so a sequence's logits do not depend on what else is in
	 * its batch (free for the 32-element block types; F16 and K-quant
	 * weights cost more: docs/SERVE.md). true: let them depend on it.
	 */
	bool batch_variant;
	/*
	 * Expert tensors split by rows across NUMA nodes (hybd's split_experts,
	 * docs/NUMA.md): the threads are pinned to those nodes in blocks, each
	 * computing its node's rows first. true: leave the threads where the
	 * scheduler puts them.
	 */
	bool numa_no_pin;
	uint32_t testing;   /* test-only switches (hyb/testing.h); 0 */
};

struct hyb_ctx;

/* NULL with the reason in hyb_last_error() (bad parameters, out of memory, the device). */
struct hyb_ctx *hyb_ctx_new(const struct hyb_model *m, const struct hyb_ctx_params *p);
void hyb_ctx_free(struct hyb_ctx *c);
uint32_t hyb_ctx_n_past(const struct hyb_ctx *c);
uint32_t hyb_ctx_n_ctx(const struct hyb_ctx *c);
/* Prompt tokens a pass takes of one sequence (hyb_ctx_params.n_batch, or its default). */
uint32_t hyb_ctx_n_batch(const struct hyb_ctx *c);
int hyb_ctx_n_threads(const struct hyb_ctx *c);
uint64_t hyb_ctx_kv_bytes(const struct hyb_ctx *c);
/* Forget the sequence (the KV cache is reused). */
void hyb_ctx_reset(struct hyb_ctx *c);

/*
 * Append n tokens at the current position. logits: n_vocab floats for the
 * last token, or n * n_vocab (one row per token) when all_logits. Batches
 * longer than n_batch are split. Returns 0, -EINVAL for no tokens or a bad
 * token id, -ENOSPC when the context is full, the streaming load's errno when
 * it failed (hyb_model_wait), or the errno of a device or hybd failure (a
 * device fault: -EIO; hybd gone: hyb_model_box_check's).
 */
int hyb_ctx_eval(struct hyb_ctx *c, const int32_t *tokens, uint32_t n, float *logits,
		 bool all_logits);

/*
 * Several sequences at once (continuous batching; hyb_ctx_params.n_seq).
 *
 * hyb_ctx_seq_open: a sequence that may hold n_pos positions (prompt plus
 * tokens to generate, at most n_ctx); its id, or -ENOSPC when every
 * sequence is open or the KV cache cannot promise n_pos more positions
 * (retry after a close), -EINVAL for n_pos 0 or past n_ctx. A one-sequence
 * context has sequence 0 (opening it starts it afresh).
 * hyb_ctx_seq_close: its KV blocks go back; 0 or -EINVAL.
 */
int hyb_ctx_seq_open(struct hyb_ctx *c, uint32_t n_pos);
int hyb_ctx_seq_close(struct hyb_ctx *c, int seq);

/*
 * Prefix cache (docs/SERVE.md "Prefix cache"). hyb_ctx_seq_keep, once the
 * prompt is in (the sequence may go on): tokens[0 .. n) are its prompt, evaluated by
 * hyb_ctx_eval_seqs in n_batch pieces from its first token (or from where
 * hyb_ctx_seq_open_prefix started it); the KV cache of its whole pieces
 * is kept for later sequences (0, -EINVAL, -ENOMEM). hyb_ctx_seq_open_prefix
 * opens as hyb_ctx_seq_open does a sequence whose prompt is
 * tokens[0 .. n_tokens), starting it at *reused positions: the longest
 * kept run of whole pieces it begins with, one token or more short of the
 * prompt. Its logits are those of a sequence opened afresh, bit for bit.
 * Kept positions take no room from sequences: they are given up, least
 * recently used first, when blocks are needed. Contexts with a device
 * (hybrid decoding) keep nothing and reuse nothing.
 */
int hyb_ctx_seq_open_prefix(struct hyb_ctx *c, uint32_t n_pos, const int32_t *tokens,
			    uint32_t n_tokens, uint32_t *reused);
int hyb_ctx_seq_keep(struct hyb_ctx *c, int seq, const int32_t *tokens, uint32_t n);
/* Positions a sequence holds (0 for one that is not open). */
uint32_t hyb_ctx_seq_pos(const struct hyb_ctx *c, int seq);

struct hyb_seq_tokens {
	int seq;
	const int32_t *tokens;
	uint32_t n;
};

/*
 * Append each b[i].n tokens to its sequence (distinct sequences) in as few
 * passes as the batch allows: every token through each weight once per
 * pass, each sequence attending to its own cache. logits: n_b rows of
 * n_vocab, row i for the last token of b[i]. A sequence's tokens go in
 * n_batch pieces from its first, as hyb_ctx_eval cuts them, so with
 * batch invariance its logits equal a one-sequence context's bit for bit.
 * 0, or -EINVAL (bad sequence, token or count), -ENOSPC (past what the
 * sequence was opened for), or a failure's errno; after a failure the
 * sequences in b are in an undefined state: close them.
 */
int hyb_ctx_eval_seqs(struct hyb_ctx *c, const struct hyb_seq_tokens *b, uint32_t n_b,
		      float *logits);
/*
 * The same, and all[i] (when all and all[i] are not NULL): b[i].n rows of
 * n_vocab, every token's logits (a prompt's log probabilities). Those rows
 * go through the last layer too, so with F16, BF16 or K-quant weights the
 * last bits of that entry's logits may differ from a call without them;
 * the 32-element block types give the same bits.
 */
int hyb_ctx_eval_seqs_all(struct hyb_ctx *c, const struct hyb_seq_tokens *b, uint32_t n_b,
			  float *logits, float *const *all);

struct hyb_kv_stats {
	uint32_t block_pos;  /* positions per block */
	uint32_t blocks;     /* in the cache */
	uint32_t used;       /* holding positions of open sequences */
	uint32_t reserved;   /* promised to open sequences */
	uint32_t seqs, max_seqs;
	uint32_t kept;       /* held only by the prefix cache (given up when needed) */
};
/* The paged cache's state (one sequence: its context as one reservation). */
void hyb_ctx_kv_stats(const struct hyb_ctx *c, struct hyb_kv_stats *out);

/*
 * Watch every layer's FFN (hybctl profile, predictor training data). Called
 * on the calling thread after the activation and before the down projection,
 * once per layer per batch of n tokens at positions pos0.. :
 *   x_attn [n][n_embd]: the residual stream after the layer's attention
 *                       (the FFN's input before ffn_norm);
 *   act    [n][n_ff]:   act(gate) * up, the input of down (0: neuron inactive).
 * While a probe is set every token of a batch goes through every layer's FFN
 * (the last layer's included). fn == NULL removes it.
 */
/* Sparse decoding since the context was made or the stats were reset. */
struct hyb_sparse_stats {
	uint64_t layer_steps;  /* FFN evaluations that ran sparse (tokens x layers) */
	uint64_t neurons;      /* n_ff x layer_steps */
	uint64_t predicted;    /* neurons the predictors marked active */
	uint64_t nonzero;      /* of those, neurons whose activation was not 0 */
	double predictor_s;    /* seconds in predictors */
	double ffn_s;          /* seconds in sparse FFN operators */
};

/* true when this context decodes plan FFNs sparsely. */
bool hyb_ctx_sparse(const struct hyb_ctx *c);
void hyb_ctx_sparse_stats(const struct hyb_ctx *c, struct hyb_sparse_stats *out);
/* The same for layer l alone: predicted against fired per layer (zeros past the last). */
void hyb_ctx_sparse_layer_stats(const struct hyb_ctx *c, uint32_t l, struct hyb_sparse_stats *out);
void hyb_ctx_sparse_stats_reset(struct hyb_ctx *c);

typedef void (*hyb_ffn_probe_fn)(void *user, uint32_t layer, uint32_t pos0, uint32_t n,
				 const float *x_attn, const float *act);
void hyb_ctx_set_ffn_probe(struct hyb_ctx *c, hyb_ffn_probe_fn fn, void *user);
/* Mixture-of-experts work since the context was made or the stats were reset. */
struct hyb_moe_stats {
	uint64_t layer_steps;  /* MoE layer evaluations of one token (tokens x layers) */
	uint64_t expert_runs;  /* experts computed: per layer batch, each chosen one once */
	uint64_t expert_bytes; /* expert weight bytes those runs read */
	double router_s;       /* seconds in routers (logits, softmax, top-k) */
	double experts_s;      /* ... in the routed experts */
	double shared_s;       /* ... in shared experts */
};

void hyb_ctx_moe_stats(const struct hyb_ctx *c, struct hyb_moe_stats *out);
void hyb_ctx_moe_stats_reset(struct hyb_ctx *c);
/*
 * How many times each expert of layer l was chosen since the last reset
 * (n_expert counts), or NULL for a model without experts.
 */
const uint64_t *hyb_ctx_moe_counts(const struct hyb_ctx *c, uint32_t layer);

/*
 * Watch every mixture-of-experts layer's routing (hybctl profile): called on
 * the calling thread once per layer per batch of n tokens at positions
 * pos0.., with sel [n][n_expert_used] the experts chosen for each token,
 * best first, and w [n][n_expert_used] their weights. While it is set every
 * token of a batch goes through every layer's FFN. fn == NULL removes it.
 */
typedef void (*hyb_moe_probe_fn)(void *user, uint32_t layer, uint32_t pos0, uint32_t n,
				 const int32_t *sel, const float *w);
void hyb_ctx_set_moe_probe(struct hyb_ctx *c, hyb_moe_probe_fn fn, void *user);
/*
 * The probe receives act(gate) alone, before the product with up and before
 * any threshold (what CATS calibrates on, hyb/sparsity.h), instead of the
 * activation.
 */
void hyb_ctx_set_ffn_probe_gate(struct hyb_ctx *c, bool on);

/*
 * CATS thresholds (hyb/sparsity.h): thr[n_layer] (copied; NULL: none, dense).
 * Every FFN of this context, prompt and decode, then treats a neuron with
 * |act(gate)| <= thr[l] as inactive; sparse decoding reads neither its up
 * row nor its down column. A context starts with the model's own
 * (hyb_model.ffn_thr). -EINVAL: a ReLU-family model (sparse already) or a
 * threshold that is negative or not finite; -ENOMEM.
 */
int hyb_ctx_set_ffn_thresholds(struct hyb_ctx *c, const float *thr);
/* The thresholds in use (n_layer values), or NULL. */
const float *hyb_ctx_ffn_thresholds(const struct hyb_ctx *c);

/*
 * TEAL thresholds (hyb/sparsity.h): thr[n_layer * HYB_TEAL_INPUTS], layer
 * l's input i at thr[l * HYB_TEAL_INPUTS + i] (copied; NULL: none). Every
 * projection input x then counts as 0 where |x| <= its threshold, in the
 * prompt and in decoding. Where the weights can have it
 * (hyb_teal_layout_check), a one-token step computes the projections on
 * their transposed layout (made by the first call, once per model: the
 * weights' size again in memory), reading only the rows of inputs above
 * the threshold. -EINVAL: a mixture-of-experts, latent-attention, plan,
 * PowerInfer or ReLU-family model, a negative or non-finite threshold;
 * -ENOMEM. Not with CATS thresholds or a hybrid context.
 */
int hyb_ctx_set_teal_thresholds(struct hyb_ctx *c, const float *thr);
/* The thresholds in use (n_layer * HYB_TEAL_INPUTS values), or NULL. */
const float *hyb_ctx_teal_thresholds(const struct hyb_ctx *c);
/* What one-token steps on the transposed layout read, since the last reset. */
struct hyb_teal_stats {
	uint64_t inputs;      /* projection inputs seen */
	uint64_t active;      /* ... above their thresholds: rows read */
	uint64_t bytes;       /* bytes of those rows */
	uint64_t dense_bytes; /* what the same projections read dense */
};
void hyb_ctx_teal_stats(const struct hyb_ctx *c, struct hyb_teal_stats *out);
/* The same for one input (enum hyb_teal_input) of one layer; -EINVAL out of range. */
int hyb_ctx_teal_layer_stats(const struct hyb_ctx *c, uint32_t layer, uint32_t input,
			     struct hyb_teal_stats *out);
void hyb_ctx_teal_stats_reset(struct hyb_ctx *c);

/*
 * Calibration of TEAL (hybctl profile --teal): fn sees the input of every
 * projection group (enum hyb_teal_input) of every layer before any
 * threshold, n rows of ne values; NULL removes it. While set, every row of
 * a batch goes through every layer, as with the FFN probe.
 */
typedef void (*hyb_input_probe_fn)(void *user, uint32_t layer, uint32_t input, uint32_t n,
				   const float *x, uint32_t ne);
void hyb_ctx_set_input_probe(struct hyb_ctx *c, hyb_input_probe_fn fn, void *user);

/*
 * Single blocks, for calibration (TEAL's allocation, hybctl profile --teal)
 * on a dense model's CPU context. hyb_ctx_block_inputs: n tokens (one
 * sequence from position 0, n <= n_batch) through the dense model, x =
 * every layer's input and the last layer's output, [n_layer + 1][n][n_embd].
 * hyb_ctx_eval_block: layer l alone on n rows x of its input, out = its
 * output [n][n_embd]; teal_thr: its HYB_TEAL_INPUTS input thresholds (NULL:
 * dense). Both overwrite the KV cache: the context starts over afterwards.
 * -EINVAL: n out of range, a bad token, a model or context of another kind.
 */
int hyb_ctx_block_inputs(struct hyb_ctx *c, const int32_t *tokens, uint32_t n, float *x);
int hyb_ctx_eval_block(struct hyb_ctx *c, uint32_t l, const float *x, uint32_t n,
		       const float *teal_thr, float *out);

/*
 * Box mode (docs/BOX.md): a model hybd has
 * loaded into pools, found through its manifest (hyb/manifest.h) instead of
 * the file. src is a manifest file path (contains '/'; it names the instance
 * and backend, the manifest POOL is then what is used), a manifest pool name
 * ("hyb.manifest") or an instance name ("hyb"); pools are opened on
 * HYB_BACKEND_AUTO ($HYB_BACKEND) for names, on the manifest's backend for
 * files. The GGUF header copy in the manifest gives metadata and tokenizer;
 * every tensor points into the read-only mapping of its pool (checked against
 * the header: type, shape, bytes, file offset); then the same binding and
 * validation as hyb_model_load. Every tensor must be resident (a manifest
 * with dram_budget-paged tensors is refused). m->image_backend is the backend
 * the pools were opened through (for reload-queue clients); m->gguf->base
 * holds only the header, zeros after it. NULL with a one-line reason in
 * hyb_last_error().
 */
struct hyb_manifest;
struct hyb_model *hyb_model_load_manifest(const char *src);
/* The manifest of a box-mode model (NULL for a model loaded from a file). */
const struct hyb_manifest *hyb_model_manifest(const struct hyb_model *m);
/*
 * Where [off, off + len) of the manifest's pool `pool` (an index into its
 * pool table) is mapped in this process; NULL for a model not from a
 * manifest, a pool not mapped (page pools) or a range past its end.
 */
const void *hyb_model_box_addr(const struct hyb_model *m, uint32_t pool, uint64_t off,
			       uint64_t len);
/*
 * Is hybd still serving a box-mode model? 0: yes. -ESHUTDOWN: hybd retired
 * the manifest (clean shutdown). -EPIPE: hybd died (its pools were destroyed
 * without a retirement, e.g. SIGKILL). The weights mapped here stay readable
 * either way (the kernel keeps destroyed pools while mapped), but nothing can
 * be loaded, uploaded or reloaded any more: apps should stop with the
 * message in hyb_last_error(). -EINVAL: not a box-mode model. One cheap
 * ioctl: call it per token.
 */
int hyb_model_box_check(const struct hyb_model *m);

#endif
