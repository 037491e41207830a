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
	"  --ctx N         context length (default 4096)\n"
	"  --type T        F32 F16 BF16 Q8_0 Q4_0 Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_XS\n"
	"                  (default Q8_0)\n"
	"  --output-type T type of output.weight (default: --type)\n"
	"  --act A         silu relu relu2 dlrelu (default silu)\n"
	"  --sparsity F    ReLU family: target fraction of inactive FFN neurons per\n"
	"                  token, 0.5..0.99 (default 0.90; OPT-like: 0.97)\n"
	"  --topics N      ReLU family: topic clusters (default min(16, vocab/16))\n"
	"  --random-weights  ReLU family: plain random weights, no sparse design\n"
	"  --rope-neox     rotate halves instead of pairs\n"
	"  --tied          no output.weight: the head reuses token_embd\n"
	"  --seed N        (default 1)\n"
	"  -t N            threads (default: all CPUs)\n";

struct spec {
	uint32_t hidden, ffn, layers, heads, kv_heads, vocab, ctx;
	uint32_t type, out_type;
	const char *act, *vocab_from, *out;
	bool neox, tied, random_weights;
	float sparsity;     /* < 0: not given */
	uint32_t topics;
	uint64_t seed;
	int threads;
};

struct tensor {
	char name[64];
	uint32_t type;
	uint64_t ne0, ne1; /* ne1 == 0: 1-D */
	float std;         /* 0: norm weight, 1 +- 0.05 */
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
	for (uint64_t i = 0; i < t->ne0; i++)
		out[i] = t->std ? a * uniform(&s) : 1.0f + 0.05f * uniform(&s);
}

struct fill_job {
	const struct tensor *t;
	const struct synth_sparse *design;
	uint64_t seed, tidx;
	uint64_t row_bytes;
	uint8_t *data;
	float **scratch;
	int failed;
};

static void fill_worker(void *arg, int ith, int nth)
{
	struct fill_job *j = arg;
	uint64_t rows = j->t->ne1 ? j->t->ne1 : 1;
	long lo, hi;

	hyb_split((long)rows, ith, nth, &lo, &hi);
	for (long r = lo; r < hi; r++) {
		if (!j->design || !synth_sparse_row(j->design, j->t->name, (uint64_t)r,
						    j->scratch[ith]))
			fill_row(j->t, j->seed, j->tidx, (uint64_t)r, j->scratch[ith]);
		if (hyb_quantize_row_ref(j->t->type, j->scratch[ith], j->data + r * j->row_bytes,
					 (int64_t)j->t->ne0))
			j->failed = 1;
	}
}

static int parse_type(const char *s, uint32_t *out)
{
	static const uint32_t ok[] = { HYB_TYPE_F32, HYB_TYPE_F16, HYB_TYPE_BF16, HYB_TYPE_Q8_0,
				       HYB_TYPE_Q4_0, HYB_TYPE_Q4_K, HYB_TYPE_Q6_K,
				       HYB_TYPE_Q2_K, HYB_TYPE_Q3_K, HYB_TYPE_Q5_K,
				       HYB_TYPE_IQ4_XS };

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
		{ "random-weights", 0, 0, 'r' },
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
		case 'h': fputs(usage, stdout); exit(0);
		default: fputs(usage, stderr); exit(2);
		}
	}
	if (!out_type_set)
		sp->out_type = sp->type;
	if (!sp->kv_heads)
		sp->kv_heads = sp->heads;
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
	if ((sp->sparsity >= 0 || sp->topics) && (!strcmp(sp->act, "silu") || sp->random_weights))
		return fprintf(stderr, "hybctl synth: --sparsity and --topics need --act relu, "
			       "relu2 or dlrelu (without --random-weights)\n"), -1;
	if (sp->hidden % sp->heads || (sp->hidden / sp->heads) % 2)
		return fprintf(stderr, "hybctl synth: --hidden %u must split into %u heads of even "
			       "size\n", sp->hidden, sp->heads), -1;
	if (sp->heads % sp->kv_heads)
		return fprintf(stderr, "hybctl synth: --heads must be a multiple of --kv-heads\n"), -1;
	if (sp->hidden % blk || sp->ffn % blk || sp->hidden % oblk)
		return fprintf(stderr, "hybctl synth: %s needs --hidden and --ffn multiples of %u\n",
			       hyb_type_name(sp->type), blk > oblk ? blk : oblk), -1;
	return 0;
}

static int add_tensors(struct hyb_gguf_writer *w, const struct spec *sp, struct tensor *t, int *nt)
{
	uint32_t hd = sp->hidden / sp->heads;
	int n = 0;

#define ADD(nm, ty, a, b, sd)                                                      \
	do {                                                                       \
		snprintf(t[n].name, sizeof(t[n].name), "%s", nm);                  \
		t[n].type = ty;                                                    \
		t[n].ne0 = a;                                                      \
		t[n].ne1 = b;                                                      \
		t[n].std = sd;                                                     \
		n++;                                                               \
	} while (0)
	ADD("token_embd.weight", sp->tied ? sp->out_type : sp->type, sp->hidden, sp->vocab, 1.0f);
	ADD("output_norm.weight", HYB_TYPE_F32, sp->hidden, 0, 0);
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
		BLK("attn_q", sp->type, sp->hidden, sp->hidden, s_h);
		BLK("attn_k", sp->type, sp->hidden, sp->kv_heads * hd, s_h);
		BLK("attn_v", sp->type, sp->hidden, sp->kv_heads * hd, s_h);
		BLK("attn_output", sp->type, sp->hidden, sp->hidden, s_h);
		BLK("ffn_norm", HYB_TYPE_F32, sp->hidden, 0, 0);
		BLK("ffn_gate", sp->type, sp->hidden, sp->ffn, s_h);
		BLK("ffn_up", sp->type, sp->hidden, sp->ffn, s_h);
		BLK("ffn_down", sp->type, sp->ffn, sp->hidden, s_f);
#undef BLK
	}
#undef ADD
	for (int i = 0; i < n; i++) {
		uint64_t ne[2] = { t[i].ne0, t[i].ne1 };

		if (hyb_gguf_writer_add_tensor(w, t[i].name, t[i].type, t[i].ne1 ? 2 : 1, ne, NULL))
			return fprintf(stderr, "hybctl synth: cannot add tensor %s\n", t[i].name), -1;
	}
	*nt = n;
	return 0;
}

static bool sparse_design(const struct spec *sp)
{
	return strcmp(sp->act, "silu") && !sp->random_weights;
}

static void set_metadata(struct hyb_gguf_writer *w, const struct spec *sp)
{
	hyb_gguf_set_str(w, "general.architecture", "llama");
	hyb_gguf_set_str(w, "general.name", "hyb-synth");
	hyb_gguf_set_u32(w, "llama.context_length", sp->ctx);
	hyb_gguf_set_u32(w, "llama.embedding_length", sp->hidden);
	hyb_gguf_set_u32(w, "llama.block_count", sp->layers);
	hyb_gguf_set_u32(w, "llama.feed_forward_length", sp->ffn);
	hyb_gguf_set_u32(w, "llama.attention.head_count", sp->heads);
	hyb_gguf_set_u32(w, "llama.attention.head_count_kv", sp->kv_heads);
	hyb_gguf_set_u32(w, "llama.rope.dimension_count", sp->hidden / sp->heads);
	hyb_gguf_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
	hyb_gguf_set_f32(w, "llama.rope.freq_base", 10000.0f);
	hyb_gguf_set_u64(w, "hyb.synth.seed", sp->seed);
	if (strcmp(sp->act, "silu"))
		hyb_gguf_set_str(w, "hyb.ffn_act", sp->act);
	if (sparse_design(sp)) {
		hyb_gguf_set_str(w, "hyb.synth.design", "sparse-topics");
		hyb_gguf_set_f32(w, "hyb.synth.sparsity", sp->sparsity);
	}
	if (sp->neox)
		hyb_gguf_set_bool(w, "hyb.rope_neox", true);
}

int cmd_synth(int argc, char **argv)
{
	struct spec sp = { .hidden = 256, .ffn = 768, .layers = 2, .heads = 4, .vocab = 512,
			   .ctx = 4096, .type = HYB_TYPE_Q8_0, .act = "silu", .seed = 1,
			   .sparsity = -1 };
	struct synth_sparse *design = NULL;
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
	t = calloc(3 + 9ull * sp.layers, sizeof(*t));
	pool = hyb_threadpool_new(sp.threads);
	if (!w || !t || !pool) {
		fprintf(stderr, "hybctl synth: out of memory\n");
		return 1;
	}
	set_metadata(w, &sp);
	if (sp.vocab_from ? synth_vocab_from(w, sp.vocab_from, &sp.vocab) : synth_vocab(w, sp.vocab))
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
	if (hyb_gguf_writer_begin(w, sp.out)) {
		fprintf(stderr, "hybctl synth: %s\n", hyb_last_error());
		goto out;
	}
	{
		int nth = hyb_threadpool_size(pool);
		float **scratch = calloc(nth, sizeof(*scratch));
		uint64_t widest = sp.hidden > sp.ffn ? sp.hidden : sp.ffn;
		int failed = !scratch;

		for (int i = 0; !failed && i < nth; i++)
			failed = !(scratch[i] = malloc(sizeof(float) * widest));
		for (int i = 0; !failed && i < nt; i++) {
			uint64_t rows = t[i].ne1 ? t[i].ne1 : 1;
			struct fill_job j = { .t = &t[i], .design = design, .seed = sp.seed,
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
	hyb_threadpool_free(pool);
	hyb_gguf_writer_free(w);
	free(t);
	return rc;
}
