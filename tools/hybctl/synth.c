// SPDX-License-Identifier: MIT
/*
 * hybctl synth: a llama-architecture GGUF of any shape and type, with
 * random weights that are a pure function of (seed, tensor, row) — the same
 * file on every machine and thread count. Weights are scaled so activations
 * keep unit variance through the layers (uniform, std 1/sqrt(fan_in)).
 *
 * With a ReLU-family activation the embedding, FFN, attention output and head
 * weights follow instead the sparse design of synth_sparse.c: the model's own
 * forward pass then activates its neurons like a real sparse model does
 * (--sparsity; --random-weights keeps the plain random weights).
 *
 * Mixtures of experts follow the routing design of synth_moe.c: routers,
 * embeddings and head chosen so that the model's own text is routed like a
 * real MoE model's (skewed, local, co-selected, drifting); --routing random
 * (or --random-weights) keeps the plain random weights.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "hyb/gguf.h"
#include "hyb/tensor_type.h"
#include "hyb/threadpool.h"
#include "hybctl.h"
#include "synth_moe.h"
#include "synth_sparse.h"

static const char usage[] =
	"usage: hybctl synth -o FILE [options]\n"
	"  --hidden N      embedding size (default 256)\n"
	"  --ffn N         feed-forward size (default 768)\n"
	"  --layers N      blocks (default 2)\n"
	"  --heads N       attention heads (default 4)\n"
	"  --kv-heads N    key/value heads (default = heads)\n"
	"  --vocab N       vocabulary size (default 512; generated SentencePiece vocab)\n"
	"  --vocab-from F  copy the tokenizer of GGUF file F (sets the vocabulary size)\n"
	"                  and its tokenizer.chat_template\n"
	"  --chat-template T  tokenizer.chat_template: T as it is (a template text, or a\n"
	"                  name hyb knows: chatml, llama3, ...), or @FILE for a file's text\n"
	"  --ctx N         context length (default 4096)\n"
	"  --type T        F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 IQ4_NL Q2_K Q3_K Q4_K\n"
	"                  Q5_K Q6_K IQ4_XS (default Q8_0)\n"
	"  --output-type T type of output.weight (default: --type)\n"
	"  --act A         silu relu relu2 dlrelu (default silu)\n"
	"  --sparsity F    ReLU family: target fraction of inactive FFN neurons per\n"
	"                  token, 0.5..0.99 (default 0.90; OPT-like: 0.97)\n"
	"  --topics N      ReLU family, and experts with --routing real: topic clusters\n"
	"                  (default min(16, vocab/16))\n"
	"  --random-weights  ReLU family: plain random weights, no sparse design\n"
	"  --rope-neox     rotate halves instead of pairs\n"
	"  --tied          no output.weight: the head reuses token_embd\n"
	"  --head-dim N    attention head size (default hidden/heads; else written as\n"
	"                  attention.key_length and value_length)\n"
	"  --rope-scaling S  linear, yarn (rope.scaling.* keys) or llama3 (a Llama 3.1\n"
	"                  rope_freqs.weight tensor, as its converter writes it)\n"
	"  --rope-factor F scaling factor (default 8)\n"
	"  --rope-orig-ctx N  original context length (yarn, llama3; default 8192)\n"
	"  --arch A        llama (default), qwen2 (Q/K/V biases), qwen3 (Q/K norms),\n"
	"                  gemma3 (Q/K norms, post-norms, GeGLU, sliding-window layers),\n"
	"                  phi3 (fused QKV and gate/up; --rope-scaling longrope),\n"
	"                  qwen3moe, qwen2moe, deepseek2, glm4moe, dots1, olmoe, gpt-oss\n"
	"                  (mixtures of experts: --experts; gpt-oss: biases, attention\n"
	"                  sinks, every other layer a --swa window, MXFP4 experts as its\n"
	"                  files have them with --type MXFP4)\n"
	"  --experts E     routed experts per layer (llama: Mixtral's layout, experts of\n"
	"                  --ffn neurons; qwen2moe, qwen3moe: required)\n"
	"  --experts-used K  experts per token (default 2)\n"
	"  --expert-ffn N  qwen*moe: neurons per expert (default --ffn / K)\n"
	"  --shared-experts S  qwen2moe, deepseek2: shared experts of --expert-ffn\n"
	"                  neurons, S of them (default 1)\n"
	"  deepseek2 (latent attention; --head-dim: the q/k head, nope + rope dims):\n"
	"  --kv-lora N     latent dims of the KV cache row (default 2 x --head-dim)\n"
	"  --q-lora N      q through a rank-N bottleneck (default 0: none)\n"
	"  --mla-rope N    RoPE dims of a head (default --head-dim / 3, even)\n"
	"  --dense-lead N  dense layers before the expert layers (default 1)\n"
	"  --v3            DeepSeek-V3 routing: sigmoid scores, a selection bias,\n"
	"                  weights renormalised and scaled by 2.5\n"
	"  --expert-groups G:U  experts in G groups, the U best eligible\n"
	"  --gate-up-exps  experts' gate and up in one tensor (ffn_gate_up_exps)\n"
	"                  (default 1)\n"
	"  --routing R     experts: real (default; routers and embeddings designed so\n"
	"                  the model's own text is routed like a trained MoE model's:\n"
	"                  skewed, local, co-selected, drifting; --topics applies) or\n"
	"                  random (plain random weights, near-uniform routing)\n"
	"  --swa N         gemma3, gpt-oss: sliding window of the local layers (default 16)\n"
	"  --seed N        (default 1)\n"
	"  -t N            threads (default: all CPUs)\n";

struct spec {
	uint32_t hidden, ffn, layers, heads, kv_heads, vocab, ctx;
	uint32_t type, out_type;
	const char *act, *vocab_from, *out;
	const char *chat_template; /* --chat-template: text, or @FILE */
	bool neox, tied, random_weights;
	float sparsity;     /* < 0: not given */
	uint32_t topics;
	uint32_t head_dim;  /* 0: hidden / heads */
	const char *rope_scaling;
	const char *arch;
	const char *routing; /* experts: real, random */
	uint32_t swa;
	uint32_t experts, experts_used, expert_ffn, shared_experts;
	uint32_t kv_lora, q_lora, mla_rope, dense_lead, groups, groups_used;
	bool v3, gate_up;
	float rope_factor;
	uint32_t rope_orig_ctx;
	uint64_t seed;
	int threads;
};

struct tensor {
	char name[64];
	uint32_t type;
	uint64_t ne0, ne1; /* ne1 == 0: 1-D */
	uint64_t ne2;      /* experts of a 3-D tensor; 0: not one */
	float std;         /* 0: norm weight, 1 +- 0.05; < 0: RoPE frequency factors
			    * (-1 Llama 3.1's, -2 and -3 LongRoPE's short and long) */
	float rope_factor;
	uint32_t rope_orig_ctx;
};

static uint64_t splitmix64(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Uniform in [-1, 1). */
static float uniform(uint64_t *s)
{
	return (float)((splitmix64(s) >> 40) * (1.0 / 8388608.0) - 1.0);
}

static void fill_row(const struct tensor *t, uint64_t seed, uint64_t tidx, uint64_t row,
		     float *out)
{
	uint64_t s = seed * 0x100000001b3ull ^ (tidx << 40) ^ row;
	float a = t->std * 1.7320508f; /* uniform [-a, a] has std a/sqrt(3) */

	splitmix64(&s);
	if (t->std <= -2.0f) { /* LongRoPE-like ramps: short 1..1.5, long 1..8 */
		for (uint64_t i = 0; i < t->ne0; i++)
			out[i] = 1.0f + (t->std < -2.5f ? 7.0f : 0.5f) * (float)i / (float)t->ne0;
		return;
	}
	if (t->std < 0) {
		/*
		 * Llama 3.1's frequency factors, as its converter computes them
		 * (low/high frequency factors 1 and 4): 1 for short wavelengths,
		 * the factor for long ones, a smooth mix between.
		 */
		const double lo_wl = t->rope_orig_ctx / 1.0, hi_wl = t->rope_orig_ctx / 4.0;

		for (uint64_t i = 0; i < t->ne0; i++) {
			const double freq = pow(10000.0, -(double)(2 * i) / (double)(2 * t->ne0));
			const double wl = 2 * M_PI / freq;
			const double sm = (t->rope_orig_ctx / wl - 1.0) / (4.0 - 1.0);

			out[i] = wl < hi_wl ? 1.0f : wl > lo_wl ? t->rope_factor :
			      (float)(1.0 / ((1 - sm) / t->rope_factor + sm));
		}
		return;
	}
	for (uint64_t i = 0; i < t->ne0; i++)
		out[i] = t->std ? a * uniform(&s) : 1.0f + 0.05f * uniform(&s);
}

struct fill_job {
	const struct tensor *t;
	const struct synth_sparse *design;
	const struct synth_moe *moe;
	uint64_t seed, tidx;
	uint64_t row_bytes;
	uint8_t *data;
	float **scratch;
	int failed;
};

static void fill_worker(void *arg, int ith, int nth)
{
	struct fill_job *j = arg;
	uint64_t rows = (j->t->ne1 ? j->t->ne1 : 1) * (j->t->ne2 ? j->t->ne2 : 1);
	long lo, hi;

	hyb_split((long)rows, ith, nth, &lo, &hi);
	for (long r = lo; r < hi; r++) {
		if ((!j->design || !synth_sparse_row(j->design, j->t->name, (uint64_t)r,
						     j->scratch[ith])) &&
		    (!j->moe || !synth_moe_row(j->moe, j->t->name, (uint64_t)r, j->scratch[ith])))
			fill_row(j->t, j->seed, j->tidx, (uint64_t)r, j->scratch[ith]);
		if (hyb_quantize_row_ref(j->t->type, j->scratch[ith], j->data + r * j->row_bytes,
					 (int64_t)j->t->ne0))
			j->failed = 1;
	}
}

static int parse_type(const char *s, uint32_t *out)
{
	static const uint32_t ok[] = { HYB_TYPE_F32,  HYB_TYPE_F16,  HYB_TYPE_BF16,
				       HYB_TYPE_Q8_0, HYB_TYPE_Q4_0, HYB_TYPE_Q4_1,
				       HYB_TYPE_Q5_0, HYB_TYPE_Q5_1, HYB_TYPE_IQ4_NL,
				       HYB_TYPE_Q2_K, HYB_TYPE_Q3_K, HYB_TYPE_Q4_K,
				       HYB_TYPE_Q5_K, HYB_TYPE_Q6_K, HYB_TYPE_IQ4_XS,
				       HYB_TYPE_MXFP4 };

	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
		if (!strcasecmp(s, hyb_type_name(ok[i]))) {
			*out = ok[i];
			return 0;
		}
	return -1;
}

static void parse(int argc, char **argv, struct spec *sp)
{
	static const struct option opts[] = {
		{ "hidden", 1, 0, 'H' }, { "ffn", 1, 0, 'F' }, { "layers", 1, 0, 'L' },
		{ "heads", 1, 0, 'A' }, { "kv-heads", 1, 0, 'K' }, { "vocab", 1, 0, 'V' },
		{ "vocab-from", 1, 0, 'f' }, { "ctx", 1, 0, 'c' }, { "type", 1, 0, 'T' },
		{ "output-type", 1, 0, 'O' }, { "act", 1, 0, 'a' }, { "rope-neox", 0, 0, 'n' },
		{ "tied", 0, 0, 'y' }, { "seed", 1, 0, 's' }, { "help", 0, 0, 'h' },
		{ "sparsity", 1, 0, 'S' }, { "topics", 1, 0, 'k' },
		{ "random-weights", 0, 0, 'r' }, { "head-dim", 1, 0, 'D' },
		{ "rope-scaling", 1, 0, 'R' }, { "rope-factor", 1, 0, 'X' },
		{ "rope-orig-ctx", 1, 0, 'C' }, { "arch", 1, 0, 'G' }, { "swa", 1, 0, 'W' },
		{ "chat-template", 1, 0, 'M' }, { "experts", 1, 0, 'E' },
		{ "experts-used", 1, 0, 'U' }, { "expert-ffn", 1, 0, 'P' },
		{ "shared-experts", 1, 0, 'Z' }, { "routing", 1, 0, 'Q' },
		{ "kv-lora", 1, 0, 1001 }, { "q-lora", 1, 0, 1002 }, { "mla-rope", 1, 0, 1003 },
		{ "dense-lead", 1, 0, 1004 }, { "v3", 0, 0, 1005 }, { "expert-groups", 1, 0, 1006 },
		{ "gate-up-exps", 0, 0, 1007 },
		{ 0, 0, 0, 0 },
	};
	int c, out_type_set = 0;

	optind = 1;
	while ((c = getopt_long(argc, argv, "o:t:h", opts, NULL)) != -1) {
		switch (c) {
		case 'o': sp->out = optarg; break;
		case 't': sp->threads = (int)ctl_u32("synth", "-t", optarg, 1, 1024); break;
		case 'H': sp->hidden = ctl_u32("synth", "--hidden", optarg, 1, 1 << 16); break;
		case 'F': sp->ffn = ctl_u32("synth", "--ffn", optarg, 1, 1 << 18); break;
		case 'L': sp->layers = ctl_u32("synth", "--layers", optarg, 1, 1024); break;
		case 'A': sp->heads = ctl_u32("synth", "--heads", optarg, 1, 1024); break;
		case 'K': sp->kv_heads = ctl_u32("synth", "--kv-heads", optarg, 1, 1024); break;
		case 'V': sp->vocab = ctl_u32("synth", "--vocab", optarg, 300, 1 << 22); break;
		case 'f': sp->vocab_from = optarg; break;
		case 'c': sp->ctx = ctl_u32("synth", "--ctx", optarg, 1, 1 << 24); break;
		case 'T':
		case 'O':
			if (parse_type(optarg, c == 'T' ? &sp->type : &sp->out_type)) {
				fprintf(stderr, "hybctl synth: unsupported type '%s'\n", optarg);
				exit(2);
			}
			out_type_set |= c == 'O';
			break;
		case 'a': sp->act = optarg; break;
		case 'n': sp->neox = true; break;
		case 'y': sp->tied = true; break;
		case 's': sp->seed = strtoull(optarg, NULL, 0); break;
		case 'S': {
			char *end;

			sp->sparsity = strtof(optarg, &end);
			if (end == optarg || *end ||
			    !(sp->sparsity >= 0.5f && sp->sparsity <= 0.99f)) {
				fprintf(stderr, "hybctl synth: bad value '%s' for --sparsity "
					"(0.5..0.99)\n", optarg);
				exit(2);
			}
			break;
		}
		case 'k': sp->topics = ctl_u32("synth", "--topics", optarg, 2, 1024); break;
		case 'r': sp->random_weights = true; break;
		case 'D': sp->head_dim = ctl_u32("synth", "--head-dim", optarg, 2, 512); break;
		case 'R': sp->rope_scaling = optarg; break;
		case 'G': sp->arch = optarg; break;
		case 'W': sp->swa = ctl_u32("synth", "--swa", optarg, 1, 1 << 20); break;
		case 'X': {
			char *end;

			sp->rope_factor = strtof(optarg, &end);
			if (end == optarg || *end || !(sp->rope_factor >= 1 && sp->rope_factor <= 64)) {
				fprintf(stderr, "hybctl synth: bad value '%s' for --rope-factor "
					"(1..64)\n", optarg);
				exit(2);
			}
			break;
		}
		case 'C':
			sp->rope_orig_ctx = ctl_u32("synth", "--rope-orig-ctx", optarg, 16, 1 << 24);
			break;
		case 'M': sp->chat_template = optarg; break;
		case 'E': sp->experts = ctl_u32("synth", "--experts", optarg, 1, 512); break;
		case 'U': sp->experts_used = ctl_u32("synth", "--experts-used", optarg, 1, 512); break;
		case 'P': sp->expert_ffn = ctl_u32("synth", "--expert-ffn", optarg, 1, 1 << 18); break;
		case 'Z':
			sp->shared_experts = ctl_u32("synth", "--shared-experts", optarg, 0, 64);
			break;
		case 'Q': sp->routing = optarg; break;
		case 1001: sp->kv_lora = ctl_u32("synth", "--kv-lora", optarg, 2, 4096); break;
		case 1002: sp->q_lora = ctl_u32("synth", "--q-lora", optarg, 1, 8192); break;
		case 1003: sp->mla_rope = ctl_u32("synth", "--mla-rope", optarg, 2, 256); break;
		case 1004: sp->dense_lead = ctl_u32("synth", "--dense-lead", optarg, 0, 1024); break;
		case 1005: sp->v3 = true; break;
		case 1007: sp->gate_up = true; break;
		case 1006:
			if (sscanf(optarg, "%u:%u", &sp->groups, &sp->groups_used) != 2 ||
			    sp->groups < 2 || !sp->groups_used || sp->groups_used > sp->groups) {
				fprintf(stderr, "hybctl synth: bad value '%s' for --expert-groups "
					"(G:U, 2 <= G, 1 <= U <= G)\n", optarg);
				exit(2);
			}
			break;
		case 'h': fputs(usage, stdout); exit(0);
		default: fputs(usage, stderr); exit(2);
		}
	}
	if (!out_type_set)
		sp->out_type = sp->type;
	if (!sp->kv_heads)
		sp->kv_heads = sp->heads;
	if (!sp->experts_used)
		sp->experts_used = 2;
	/* Mixtral's and OLMoE's experts are feed_forward_length wide */
	if (!sp->expert_ffn)
		sp->expert_ffn = strcmp(sp->arch, "llama") && strcmp(sp->arch, "olmoe") ?
				 sp->ffn / sp->experts_used : sp->ffn;
	if (!strcmp(sp->arch, "olmoe"))
		sp->kv_heads = sp->heads; /* its K norm spans n_embd: K for every head */
	if (sp->shared_experts == UINT32_MAX)
		sp->shared_experts = !strcmp(sp->arch, "qwen2moe") || !strcmp(sp->arch, "deepseek2") ||
				     !strcmp(sp->arch, "glm4moe") || !strcmp(sp->arch, "dots1");
	if ((!strcmp(sp->arch, "glm4moe") || !strcmp(sp->arch, "dots1")) &&
	    sp->dense_lead == UINT32_MAX)
		sp->dense_lead = 1;
	if (!strcmp(sp->arch, "dots1"))
		sp->kv_heads = sp->heads; /* llama.cpp's dots1 has K and V for every head */
	if (!strcmp(sp->arch, "deepseek2")) {
		const uint32_t hd = sp->head_dim ? sp->head_dim : sp->hidden / sp->heads;

		if (!sp->mla_rope)
			sp->mla_rope = hd / 3 & ~1u;
		if (!sp->kv_lora)
			sp->kv_lora = 2 * hd;
		if (sp->dense_lead == UINT32_MAX)
			sp->dense_lead = 1;
		sp->kv_heads = 1; /* one latent row for every head */
	} else if (sp->dense_lead == UINT32_MAX) {
		sp->dense_lead = 0;
	}
}

static bool mla(const struct spec *sp)
{
	return !strcmp(sp->arch, "deepseek2");
}

/* GLM-4.5: V3-style routing, biased attention, partial rotary */
static bool glm(const struct spec *sp)
{
	return !strcmp(sp->arch, "glm4moe");
}

/* dots.llm1: qwen3's attention (all heads with K and V), V3-style routing */
static bool dots(const struct spec *sp)
{
	return !strcmp(sp->arch, "dots1");
}

/* OLMoE: Q/K norms over the whole projections */
static bool olmoe(const struct spec *sp)
{
	return !strcmp(sp->arch, "olmoe");
}

/* gpt-oss: biased attention with sinks, biased experts (arch_gptoss.c) */
static bool gptoss(const struct spec *sp)
{
	return !strcmp(sp->arch, "gpt-oss");
}

/* the architectures with DeepSeek-V3's expert keys (arch_moe.c) */
static bool v3_keys(const struct spec *sp)
{
	return glm(sp) || dots(sp);
}

static bool moe(const struct spec *sp)
{
	return sp->experts > 0;
}

static bool sparse_design(const struct spec *sp)
{
	return strcmp(sp->act, "silu") && !sp->random_weights;
}

static bool moe_design(const struct spec *sp)
{
	/* deepseek2's latent attention is not in the routing design: plain random */
	return moe(sp) && !sp->random_weights && (!sp->routing || !strcmp(sp->routing, "real")) &&
	       !mla(sp);
}

static int check(const struct spec *sp)
{
	uint32_t blk = hyb_type_info(sp->type)->blck;
	uint32_t oblk = hyb_type_info(sp->out_type)->blck;
	const char *acts[] = { "silu", "relu", "relu2", "dlrelu" };
	int act_ok = 0;

	for (size_t i = 0; i < 4; i++)
		act_ok |= !strcmp(sp->act, acts[i]);
	if (!sp->out)
		return fprintf(stderr, "hybctl synth: no output file (-o FILE)\n"), -1;
	if (!act_ok)
		return fprintf(stderr, "hybctl synth: unknown --act '%s'\n", sp->act), -1;
	if (sp->routing && strcmp(sp->routing, "real") && strcmp(sp->routing, "random"))
		return fprintf(stderr, "hybctl synth: unknown --routing '%s' (real, random)\n",
			       sp->routing), -1;
	if (sp->routing && !moe(sp))
		return fprintf(stderr, "hybctl synth: --routing goes with --experts\n"), -1;
	if (sp->sparsity >= 0 && (!strcmp(sp->act, "silu") || sp->random_weights))
		return fprintf(stderr, "hybctl synth: --sparsity needs --act relu, relu2 or dlrelu "
			       "(without --random-weights)\n"), -1;
	if (sp->topics && !sparse_design(sp) && !moe_design(sp))
		return fprintf(stderr, "hybctl synth: --topics needs --act relu, relu2 or dlrelu, "
			       "or --experts with --routing real (without --random-weights)\n"), -1;
	if (strcmp(sp->arch, "llama") && strcmp(sp->arch, "qwen2") && strcmp(sp->arch, "qwen3") &&
	    strcmp(sp->arch, "gemma3") && strcmp(sp->arch, "phi3") &&
	    strcmp(sp->arch, "qwen2moe") && strcmp(sp->arch, "qwen3moe") && !mla(sp) &&
	    !v3_keys(sp) && !olmoe(sp) && !gptoss(sp))
		return fprintf(stderr, "hybctl synth: unknown --arch '%s' (llama, qwen2, qwen3, "
			       "gemma3, phi3, qwen2moe, qwen3moe, deepseek2, glm4moe, dots1, olmoe, "
			       "gpt-oss)\n", sp->arch), -1;
	const bool moe_arch = !strcmp(sp->arch, "qwen2moe") || !strcmp(sp->arch, "qwen3moe") ||
			      mla(sp) || v3_keys(sp) || olmoe(sp) || gptoss(sp);

	if (moe_arch != moe(sp) && (!moe(sp) || strcmp(sp->arch, "llama")))
		return fprintf(stderr, "hybctl synth: --experts goes with --arch llama, qwen2moe, "
			       "qwen3moe or deepseek2 (the last three need it)\n"), -1;
	if (moe(sp) && (sp->experts_used > sp->experts || sparse_design(sp) ||
			sp->expert_ffn % blk || !sp->expert_ffn ||
			(sp->shared_experts && strcmp(sp->arch, "qwen2moe") && !mla(sp) &&
			 !v3_keys(sp))))
		return fprintf(stderr, "hybctl synth: experts need --experts-used <= --experts, "
			       "--act silu, --expert-ffn a multiple of %u and --shared-experts only "
			       "with qwen2moe or deepseek2\n", blk), -1;
	if (!mla(sp) && (sp->kv_lora || sp->q_lora || sp->mla_rope || sp->v3 ||
			 (sp->dense_lead && !v3_keys(sp))))
		return fprintf(stderr, "hybctl synth: --kv-lora, --q-lora, --mla-rope, --dense-lead "
			       "and --v3 are deepseek2's\n"), -1;
	if (sp->groups && (!moe(sp) || sp->experts % sp->groups ||
			   sp->groups_used * (sp->experts / sp->groups) < sp->experts_used))
		return fprintf(stderr, "hybctl synth: --expert-groups G:U needs G to divide "
			       "--experts and U groups to hold --experts-used\n"), -1;
	if (mla(sp)) {
		const uint32_t hd = sp->head_dim ? sp->head_dim : sp->hidden / sp->heads;

		if (sp->mla_rope >= hd || sp->mla_rope % 2 || (hd - sp->mla_rope) % blk ||
		    sp->kv_lora % blk || sp->q_lora % blk || (sp->heads * (hd - sp->mla_rope)) % blk ||
		    sp->dense_lead > sp->layers)
			return fprintf(stderr, "hybctl synth: deepseek2 needs --mla-rope even and under "
				       "--head-dim, the rest of the head, --kv-lora and --q-lora "
				       "multiples of %u, --dense-lead <= --layers\n", blk), -1;
	}
	if (sp->rope_scaling && !strcmp(sp->rope_scaling, "longrope") && strcmp(sp->arch, "phi3"))
		return fprintf(stderr, "hybctl synth: --rope-scaling longrope is phi3's\n"), -1;
	if (strcmp(sp->arch, "llama") && (strcmp(sp->act, "silu") || sp->neox))
		return fprintf(stderr, "hybctl synth: --arch %s has its own activation and RoPE "
			       "(no --act, --rope-neox)\n", sp->arch), -1;
	if (sp->rope_scaling && strcmp(sp->rope_scaling, "linear") &&
	    strcmp(sp->rope_scaling, "yarn") && strcmp(sp->rope_scaling, "llama3") &&
	    strcmp(sp->rope_scaling, "longrope"))
		return fprintf(stderr, "hybctl synth: unknown --rope-scaling '%s' (linear, yarn, "
			       "llama3)\n", sp->rope_scaling), -1;
	if (sp->head_dim && (sp->head_dim % 2 || sparse_design(sp)))
		return fprintf(stderr, "hybctl synth: --head-dim must be even, and needs --act "
			       "silu or --random-weights\n"), -1;
	if (sp->head_dim && !mla(sp) && ((uint64_t)sp->heads * sp->head_dim) % blk)
		return fprintf(stderr, "hybctl synth: %s needs heads x --head-dim a multiple "
			       "of %u\n", hyb_type_name(sp->type), blk), -1;
	if (!sp->head_dim && (sp->hidden % sp->heads || (sp->hidden / sp->heads) % 2))
		return fprintf(stderr, "hybctl synth: --hidden %u must split into %u heads of even "
			       "size\n", sp->hidden, sp->heads), -1;
	if (sp->heads % sp->kv_heads)
		return fprintf(stderr, "hybctl synth: --heads must be a multiple of --kv-heads\n"), -1;
	if (sp->hidden % blk || sp->ffn % blk || sp->hidden % oblk)
		return fprintf(stderr, "hybctl synth: %s needs --hidden and --ffn multiples of %u\n",
			       hyb_type_name(sp->type), blk > oblk ? blk : oblk), -1;
	return 0;
}

static uint32_t head_dim(const struct spec *sp)
{
	return sp->head_dim ? sp->head_dim : sp->hidden / sp->heads;
}

static int add_tensors(struct hyb_gguf_writer *w, const struct spec *sp, struct tensor *t, int *nt)
{
	const uint32_t hd = head_dim(sp), qd = sp->heads * hd;
	const bool phi3 = !strcmp(sp->arch, "phi3");
	int n = 0;

#define ADD(nm, ty, a, b, sd)                                                      \
	do {                                                                       \
		snprintf(t[n].name, sizeof(t[n].name), "%s", nm);                  \
		t[n].type = ty;                                                    \
		t[n].ne0 = a;                                                      \
		t[n].ne1 = b;                                                      \
		t[n].std = sd;                                                     \
		t[n].rope_factor = sp->rope_factor;                                \
		t[n].rope_orig_ctx = sp->rope_orig_ctx;                            \
		n++;                                                               \
	} while (0)
	ADD("token_embd.weight", sp->tied ? sp->out_type : sp->type, sp->hidden, sp->vocab, 1.0f);
	ADD("output_norm.weight", HYB_TYPE_F32, sp->hidden, 0, 0);
	if (sp->rope_scaling && !strcmp(sp->rope_scaling, "llama3"))
		ADD("rope_freqs.weight", HYB_TYPE_F32, hd / 2, 0, -1.0f);
	if (sp->rope_scaling && !strcmp(sp->rope_scaling, "longrope")) {
		ADD("rope_factors_short.weight", HYB_TYPE_F32, hd / 2, 0, -2.0f);
		ADD("rope_factors_long.weight", HYB_TYPE_F32, hd / 2, 0, -3.0f);
	}
	if (!sp->tied)
		ADD("output.weight", sp->out_type, sp->hidden, sp->vocab, 1.0f / sqrtf(sp->hidden));
	for (uint32_t l = 0; l < sp->layers; l++) {
		char nm[64];
		float s_h = 1.0f / sqrtf((float)sp->hidden), s_f = 1.0f / sqrtf((float)sp->ffn);

#define BLK(suffix, ty, a, b, sd)                                                  \
	do {                                                                       \
		snprintf(nm, sizeof(nm), "blk.%u.%s.weight", l, suffix);           \
		ADD(nm, ty, a, b, sd);                                             \
	} while (0)
		BLK("attn_norm", HYB_TYPE_F32, sp->hidden, 0, 0);
		if (mla(sp)) { /* latent attention: arch_deepseek2.c */
			const uint32_t P = sp->mla_rope, N = hd - P, R = sp->kv_lora;

			if (sp->q_lora) {
				BLK("attn_q_a", sp->type, sp->hidden, sp->q_lora, s_h);
				BLK("attn_q_a_norm", HYB_TYPE_F32, sp->q_lora, 0, 0);
				BLK("attn_q_b", sp->type, sp->q_lora, qd,
				    1.0f / sqrtf((float)sp->q_lora));
			} else {
				BLK("attn_q", sp->type, sp->hidden, qd, s_h);
			}
			BLK("attn_kv_a_mqa", sp->type, sp->hidden, R + P, s_h);
			BLK("attn_kv_a_norm", HYB_TYPE_F32, R, 0, 0);
			BLK("attn_k_b", sp->type, N, R, 1.0f / sqrtf((float)N));
			t[n - 1].ne2 = sp->heads;
			BLK("attn_v_b", sp->type, R, N, 1.0f / sqrtf((float)R));
			t[n - 1].ne2 = sp->heads;
			BLK("attn_output", sp->type, sp->heads * N, sp->hidden,
			    1.0f / sqrtf((float)(sp->heads * N)));
		} else if (phi3) { /* Q, K and V fused */
			BLK("attn_qkv", sp->type, sp->hidden, qd + 2 * sp->kv_heads * hd, s_h);
		} else {
			BLK("attn_q", sp->type, sp->hidden, qd, s_h);
			BLK("attn_k", sp->type, sp->hidden, sp->kv_heads * hd, s_h);
			BLK("attn_v", sp->type, sp->hidden, sp->kv_heads * hd, s_h);
		}
		if (!mla(sp))
			BLK("attn_output", sp->type, qd, sp->hidden, 1.0f / sqrtf((float)qd));
		/* GLM-4.5 stores the FFN's input norm as post_attention_norm */
		BLK(glm(sp) || gptoss(sp) ? "post_attention_norm" : "ffn_norm", HYB_TYPE_F32,
		    sp->hidden, 0, 0);
		if (gptoss(sp)) {
			/* the output's bias; a sink logit per head (near the scores' scale) */
			snprintf(nm, sizeof(nm), "blk.%u.attn_output.bias", l);
			ADD(nm, HYB_TYPE_F32, sp->hidden, 0, 0.5f);
			BLK("attn_sinks", HYB_TYPE_F32, sp->heads, 0, 1.0f);
		}
		if (!strcmp(sp->arch, "qwen2") || !strcmp(sp->arch, "qwen2moe") || glm(sp) ||
		    gptoss(sp)) {
			/* biases: 1-D, random like the weights (BLK names end in .weight) */
			snprintf(nm, sizeof(nm), "blk.%u.attn_q.bias", l);
			ADD(nm, HYB_TYPE_F32, qd, 0, 0.5f);
			snprintf(nm, sizeof(nm), "blk.%u.attn_k.bias", l);
			ADD(nm, HYB_TYPE_F32, sp->kv_heads * hd, 0, 0.5f);
			snprintf(nm, sizeof(nm), "blk.%u.attn_v.bias", l);
			ADD(nm, HYB_TYPE_F32, sp->kv_heads * hd, 0, 0.5f);
		}
		if (!strcmp(sp->arch, "qwen3") || !strcmp(sp->arch, "gemma3") ||
		    !strcmp(sp->arch, "qwen3moe") || dots(sp)) {
			BLK("attn_q_norm", HYB_TYPE_F32, hd, 0, 0);
			BLK("attn_k_norm", HYB_TYPE_F32, hd, 0, 0);
		}
		if (olmoe(sp)) {
			BLK("attn_q_norm", HYB_TYPE_F32, qd, 0, 0);
			BLK("attn_k_norm", HYB_TYPE_F32, sp->kv_heads * hd, 0, 0);
		}
		if (!strcmp(sp->arch, "gemma3")) {
			BLK("post_attention_norm", HYB_TYPE_F32, sp->hidden, 0, 0);
			BLK("post_ffw_norm", HYB_TYPE_F32, sp->hidden, 0, 0);
		}
		const bool moe_layer = moe(sp) && l >= sp->dense_lead;

		if (moe_layer) {
			const uint64_t F = sp->expert_ffn, S = (uint64_t)sp->shared_experts * F;

			/* routers stay F32, as llama.cpp's converters and quantizer keep them */
			BLK("ffn_gate_inp", HYB_TYPE_F32, sp->hidden, sp->experts, 2.0f * s_h);
			if (sp->gate_up) {
				BLK("ffn_gate_up_exps", sp->type, sp->hidden, 2 * F, s_h);
				t[n - 1].ne2 = sp->experts;
			} else {
				BLK("ffn_gate_exps", sp->type, sp->hidden, F, s_h);
				t[n - 1].ne2 = sp->experts;
				BLK("ffn_up_exps", sp->type, sp->hidden, F, s_h);
				t[n - 1].ne2 = sp->experts;
			}
			BLK("ffn_down_exps", sp->type, F, sp->hidden, 1.0f / sqrtf((float)F));
			t[n - 1].ne2 = sp->experts;
			if (gptoss(sp)) { /* biases: the router's, and per expert [rows, experts] */
				snprintf(nm, sizeof(nm), "blk.%u.ffn_gate_inp.bias", l);
				ADD(nm, HYB_TYPE_F32, sp->experts, 0, 0.5f);
				/* wide enough that the SwiGLU's clamps at +-7 bite */
				snprintf(nm, sizeof(nm), "blk.%u.ffn_gate_exps.bias", l);
				ADD(nm, HYB_TYPE_F32, F, sp->experts, 4.0f);
				snprintf(nm, sizeof(nm), "blk.%u.ffn_up_exps.bias", l);
				ADD(nm, HYB_TYPE_F32, F, sp->experts, 4.0f);
				snprintf(nm, sizeof(nm), "blk.%u.ffn_down_exps.bias", l);
				ADD(nm, HYB_TYPE_F32, sp->hidden, sp->experts, 0.5f);
			}
			if (sp->v3 || v3_keys(sp)) { /* the selection bias: scores are sigmoids in (0, 1) */
				snprintf(nm, sizeof(nm), "blk.%u.exp_probs_b.bias", l);
				ADD(nm, HYB_TYPE_F32, sp->experts, 0, 0.1f);
			}
			if (S && !mla(sp) && !v3_keys(sp))
				BLK("ffn_gate_inp_shexp", HYB_TYPE_F32, sp->hidden, 0, s_h);
			if (S) {
				BLK("ffn_gate_shexp", sp->type, sp->hidden, S, s_h);
				BLK("ffn_up_shexp", sp->type, sp->hidden, S, s_h);
				BLK("ffn_down_shexp", sp->type, S, sp->hidden,
				    1.0f / sqrtf((float)S));
			}
		} else if (phi3) { /* gate then up in one tensor */
			BLK("ffn_up", sp->type, sp->hidden, 2 * sp->ffn, s_h);
		} else {
			BLK("ffn_gate", sp->type, sp->hidden, sp->ffn, s_h);
			BLK("ffn_up", sp->type, sp->hidden, sp->ffn, s_h);
		}
		if (!moe_layer)
			BLK("ffn_down", sp->type, sp->ffn, sp->hidden, s_f);
#undef BLK
	}
#undef ADD
	for (int i = 0; i < n; i++) {
		uint64_t ne[3] = { t[i].ne0, t[i].ne1, t[i].ne2 };

		if (hyb_gguf_writer_add_tensor(w, t[i].name, t[i].type,
					       t[i].ne2 ? 3 : t[i].ne1 ? 2 : 1, ne, NULL))
			return fprintf(stderr, "hybctl synth: cannot add tensor %s\n", t[i].name), -1;
	}
	*nt = n;
	return 0;
}

static void set_metadata(struct hyb_gguf_writer *w, const struct spec *sp)
{
	char key[128];

#define KEY(kind, suffix, ...)                                                     \
	do {                                                                       \
		snprintf(key, sizeof(key), "%s.%s", sp->arch, suffix);            \
		hyb_gguf_set_##kind(w, key, __VA_ARGS__);                           \
	} while (0)
	hyb_gguf_set_str(w, "general.architecture", sp->arch);
	hyb_gguf_set_str(w, "general.name", "hyb-synth");
	KEY(u32, "context_length", sp->ctx);
	KEY(u32, "embedding_length", sp->hidden);
	KEY(u32, "block_count", sp->layers);
	KEY(u32, "feed_forward_length", sp->ffn);
	KEY(u32, "attention.head_count", sp->heads);
	KEY(u32, "attention.head_count_kv", sp->kv_heads);
	if (mla(sp)) { /* the cached row: latent + rope; the heads' own sizes in *_mla */
		KEY(u32, "rope.dimension_count", sp->mla_rope);
		KEY(u32, "attention.key_length", sp->kv_lora + sp->mla_rope);
		KEY(u32, "attention.value_length", sp->kv_lora);
		KEY(u32, "attention.key_length_mla", head_dim(sp));
		KEY(u32, "attention.value_length_mla", head_dim(sp) - sp->mla_rope);
		KEY(u32, "attention.kv_lora_rank", sp->kv_lora);
		if (sp->q_lora)
			KEY(u32, "attention.q_lora_rank", sp->q_lora);
		KEY(u32, "leading_dense_block_count", sp->dense_lead);
		KEY(u32, "expert_shared_count", sp->shared_experts);
		KEY(u32, "expert_gating_func", sp->v3 ? 2 : 1);
		KEY(f32, "expert_weights_scale", sp->v3 ? 2.5f : 1.0f);
		KEY(bool, "expert_weights_norm", sp->v3);
		if (sp->rope_scaling && !strcmp(sp->rope_scaling, "yarn"))
			KEY(f32, "rope.scaling.yarn_log_multiplier", 0.0707f);
	} else if (v3_keys(sp)) { /* V3-style routing; GLM-4.5: partial_rotary_factor 0.5 */
		KEY(u32, "rope.dimension_count", glm(sp) ? head_dim(sp) / 2 : head_dim(sp));
		KEY(u32, "leading_dense_block_count", sp->dense_lead);
		KEY(u32, "expert_shared_count", sp->shared_experts);
		KEY(u32, "expert_gating_func", 2);
		KEY(f32, "expert_weights_scale", glm(sp) ? 1.0f : 2.5f);
		KEY(bool, "expert_weights_norm", true);
	} else {
		KEY(u32, "rope.dimension_count", head_dim(sp));
	}
	if (sp->head_dim && !mla(sp)) {
		KEY(u32, "attention.key_length", sp->head_dim);
		KEY(u32, "attention.value_length", sp->head_dim);
	}
	/* llama3 scaling is the rope_freqs tensor alone: its converter writes no type */
	if (sp->rope_scaling && !strcmp(sp->rope_scaling, "longrope")) {
		/* Phi-3 128k's keys: the type, the original context, the magnitude */
		KEY(str, "rope.scaling.type", "longrope");
		KEY(u32, "rope.scaling.original_context_length", sp->rope_orig_ctx);
		KEY(f32, "rope.scaling.attn_factor", 1.1902381f);
	} else if (sp->rope_scaling && strcmp(sp->rope_scaling, "llama3")) {
		KEY(str, "rope.scaling.type", sp->rope_scaling);
		KEY(f32, "rope.scaling.factor", sp->rope_factor);
		if (!strcmp(sp->rope_scaling, "yarn"))
			KEY(u32, "rope.scaling.original_context_length", sp->rope_orig_ctx);
	}
	KEY(f32, "attention.layer_norm_rms_epsilon", 1e-5f);
	KEY(f32, "rope.freq_base", 10000.0f);
	hyb_gguf_set_u64(w, "hyb.synth.seed", sp->seed);
	if (strcmp(sp->act, "silu"))
		hyb_gguf_set_str(w, "hyb.ffn_act", sp->act);
	if (sparse_design(sp)) {
		hyb_gguf_set_str(w, "hyb.synth.design", "sparse-topics");
		hyb_gguf_set_f32(w, "hyb.synth.sparsity", sp->sparsity);
	}
	if (sp->neox)
		hyb_gguf_set_bool(w, "hyb.rope_neox", true);
	if (moe(sp)) {
		KEY(u32, "expert_count", sp->experts);
		KEY(u32, "expert_used_count", sp->experts_used);
		if (strcmp(sp->arch, "llama") && !olmoe(sp)) /* else feed_forward_length */
			KEY(u32, "expert_feed_forward_length", sp->expert_ffn);
		if (sp->shared_experts && !mla(sp) && !v3_keys(sp))
			KEY(u32, "expert_shared_feed_forward_length",
			    sp->shared_experts * sp->expert_ffn);
		if (sp->groups) {
			KEY(u32, "expert_group_count", sp->groups);
			KEY(u32, "expert_group_used_count", sp->groups_used);
		}
	}
	if (!strcmp(sp->arch, "gemma3")) {
		KEY(u32, "attention.sliding_window", sp->swa);
		KEY(f32, "rope.freq_base_swa", 1000.0f);
	}
	if (gptoss(sp))
		KEY(u32, "attention.sliding_window", sp->swa);
#undef KEY
}

/* tokenizer.chat_template from --chat-template: the text itself, or @FILE's. */
static int set_chat_template(struct hyb_gguf_writer *w, const char *arg)
{
	FILE *f;
	char *text;
	long n;

	if (arg[0] != '@') {
		hyb_gguf_set_str(w, "tokenizer.chat_template", arg);
		return 0;
	}
	f = fopen(arg + 1, "rb");
	if (!f || fseek(f, 0, SEEK_END) || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET)) {
		fprintf(stderr, "hybctl synth: --chat-template %s: %s\n", arg + 1, strerror(errno));
		if (f)
			fclose(f);
		return -1;
	}
	text = malloc((size_t)n + 1);
	if (!text || fread(text, 1, (size_t)n, f) != (size_t)n) {
		fprintf(stderr, "hybctl synth: --chat-template %s: cannot read it\n", arg + 1);
		free(text);
		fclose(f);
		return -1;
	}
	text[n] = 0;
	fclose(f);
	hyb_gguf_set_str(w, "tokenizer.chat_template", text);
	free(text);
	return 0;
}

int cmd_synth(int argc, char **argv)
{
	struct spec sp = { .hidden = 256, .ffn = 768, .layers = 2, .heads = 4, .vocab = 512,
			   .ctx = 4096, .type = HYB_TYPE_Q8_0, .act = "silu", .seed = 1,
			   .sparsity = -1, .rope_factor = 8, .rope_orig_ctx = 8192,
			   .arch = "llama", .swa = 16, .shared_experts = UINT32_MAX,
			   .dense_lead = UINT32_MAX };
	struct synth_sparse *design = NULL;
	struct synth_moe *moe_d = NULL;
	struct hyb_gguf_writer *w;
	struct hyb_threadpool *pool;
	struct tensor *t;
	int nt, rc = 1;

	parse(argc, argv, &sp);
	if (check(&sp))
		return 2;
	if (sparse_design(&sp) && sp.sparsity < 0)
		sp.sparsity = 0.90f;
	w = hyb_gguf_writer_new();
	t = calloc(4 + 20ull * sp.layers, sizeof(*t)); /* + rope_freqs, biases, norms, experts */
	pool = hyb_threadpool_new(sp.threads);
	if (!w || !t || !pool) {
		fprintf(stderr, "hybctl synth: out of memory\n");
		return 1;
	}
	set_metadata(w, &sp);
	if (sp.vocab_from ? synth_vocab_from(w, sp.vocab_from, &sp.vocab) : synth_vocab(w, sp.vocab))
		goto out;
	if (sp.chat_template && set_chat_template(w, sp.chat_template))
		goto out;
	if (add_tensors(w, &sp, t, &nt))
		goto out;
	if (sparse_design(&sp)) {
		struct synth_sparse_shape sh = {
			.hidden = sp.hidden, .ffn = sp.ffn, .layers = sp.layers, .heads = sp.heads,
			.kv_heads = sp.kv_heads, .vocab = sp.vocab, .topics = sp.topics,
			.type = sp.type, .act = sp.act, .sparsity = sp.sparsity, .seed = sp.seed,
		};

		design = synth_sparse_new(&sh);
		if (!design)
			goto out;
		hyb_gguf_set_u32(w, "hyb.synth.topics", synth_sparse_topics(design));
	}
	if (moe_design(&sp)) {
		struct synth_moe_shape sh = {
			.hidden = sp.hidden, .layers = sp.layers, .heads = sp.heads,
			.head_dim = head_dim(&sp), .kv_heads = sp.kv_heads, .vocab = sp.vocab,
			.experts = sp.experts, .experts_used = sp.experts_used,
			.expert_ffn = sp.expert_ffn, .shared_ffn = sp.shared_experts * sp.expert_ffn,
			.topics = sp.topics, .type = sp.type, .seed = sp.seed,
		};

		moe_d = synth_moe_new(&sh);
		if (!moe_d)
			goto out;
		hyb_gguf_set_str(w, "hyb.synth.design", "moe-routing");
		hyb_gguf_set_u32(w, "hyb.synth.topics", synth_moe_topics(moe_d));
	}
	if (hyb_gguf_writer_begin(w, sp.out)) {
		fprintf(stderr, "hybctl synth: %s\n", hyb_last_error());
		goto out;
	}
	{
		int nth = hyb_threadpool_size(pool);
		float **scratch = calloc(nth, sizeof(*scratch));
		uint64_t widest = 1;
		int failed = !scratch;

		for (int i = 0; i < nt; i++) /* expert and head widths may exceed --ffn */
			widest = t[i].ne0 > widest ? t[i].ne0 : widest;
		for (int i = 0; !failed && i < nth; i++)
			failed = !(scratch[i] = malloc(sizeof(float) * widest));
		for (int i = 0; !failed && i < nt; i++) {
			uint64_t rows = (t[i].ne1 ? t[i].ne1 : 1) * (t[i].ne2 ? t[i].ne2 : 1);
			struct fill_job j = { .t = &t[i], .design = design, .moe = moe_d,
					      .seed = sp.seed,
					      .tidx = (uint64_t)i,
					      .row_bytes = hyb_row_bytes(t[i].type, t[i].ne0),
					      .scratch = scratch };

			j.data = malloc(j.row_bytes * rows);
			if (!j.data) {
				fprintf(stderr, "hybctl synth: out of memory for %s\n", t[i].name);
				failed = 1;
				break;
			}
			hyb_threadpool_run(pool, fill_worker, &j);
			if (j.failed)
				fprintf(stderr, "hybctl synth: cannot quantize %s to %s\n", t[i].name,
					hyb_type_name(t[i].type));
			if (!j.failed && hyb_gguf_writer_put_data(w, j.data, j.row_bytes * rows)) {
				fprintf(stderr, "hybctl synth: %s\n", hyb_last_error());
				j.failed = 1;
			}
			failed = j.failed;
			free(j.data);
		}
		for (int i = 0; scratch && i < nth; i++)
			free(scratch[i]);
		free(scratch);
		if (!failed && hyb_gguf_writer_finish(w)) {
			fprintf(stderr, "hybctl synth: %s\n", hyb_last_error());
			failed = 1;
		}
		if (failed) {
			unlink(sp.out);
			goto out;
		}
	}
	rc = 0;
out:
	synth_sparse_free(design);
	synth_moe_free(moe_d);
	hyb_threadpool_free(pool);
	hyb_gguf_writer_free(w);
	free(t);
	return rc;
}
