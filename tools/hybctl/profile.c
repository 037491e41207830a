// SPDX-License-Identifier: MIT
/*
 * hybctl profile: run a model on prompts and on its own continuations,
 * watch every FFN through the probe, print the activation statistics the
 * sparse pipeline rests on and save the profile `hybctl plan` reads.
 *
 * Each prompt is one batched prefill, then --gen tokens sampled from the
 * model at temperature 0.8 with no other filter (top-k, top-p and min-p off:
 * the model's own distribution, tempered, as PowerInfer 6.1 profiles on
 * general text rather than on a task). Samples (active sets and predictor
 * inputs) are spread evenly over the prompts: each sequence gives its first
 * --samples / n_prompts tokens.
 *
 * A mixture-of-experts model is profiled for its routing instead
 * (profile_moe.c): the same prompts and sampling, through the routing probe.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyb/generate.h"
#include "hyb/gguf.h"
#include "hyb/model.h"
#include "hyb/profile.h"
#include "hyb/sampler.h"
#include "hyb/sparsity.h"
#include "hyb/tokenizer.h"
#include "hybctl.h"
#include "profile_moe.h"

static const char usage[] =
	"usage: hybctl profile MODEL [-o PROFILE.gguf] [--prompts FILE] [--gen N]\n"
	"                      [--samples N] [-t N] [--seed N] [--temp T] [--json]\n"
	"                      [--sparsity S] [--teal [--greedy] [--alloc-tokens N]]\n"
	"  -o FILE        save the profile (GGUF, read by hybctl plan)\n"
	"  --sparsity S   SiLU/GELU models: calibrate CATS thresholds for sparsity S\n"
	"                 in (0, 1) on the prompts, then profile with them\n"
	"                 (docs/SPARSITY.md)\n"
	"  --teal         SiLU/GELU models: calibrate TEAL instead, the magnitudes of\n"
	"                 every projection's input; -o saves their quantiles and the\n"
	"                 thresholds for --sparsity S (default 0.4) for hyb --teal\n"
	"  --greedy       with --teal: share each layer's sparsity among its inputs\n"
	"                 by TEAL's greedy search instead of evenly (docs/SPARSITY.md)\n"
	"  --alloc-tokens N  with --greedy: calibration tokens the search evaluates\n"
	"                 layers on (default 256)\n"
	"  --prompts FILE one prompt per line (default: 20 built-in prompts)\n"
	"  --gen N        tokens sampled after each prompt (default 64)\n"
	"  --samples N    tokens whose active sets and predictor inputs are kept\n"
	"                 (default 4096)\n"
	"  --temp T       sampling temperature (default 0.8)\n"
	"  --seed N       sampler seed of the first prompt (default 1)\n"
	"  -t N           threads (default: all CPUs)\n"
	"  --json         print the statistics as JSON on stdout\n"
	"Mixtures of experts: the routing is profiled (expert popularity, reuse,\n"
	"co-selection, drift; -o saves it for expert placement, docs/MOE.md);\n"
	"--samples and --sparsity do not apply.\n";

static const char *const builtin_prompts[] = {
	"Once upon a time there was a little girl who lived in a village near the forest.",
	"The history of the Roman Empire spans more than a thousand years, from",
	"def fibonacci(n):\n    if n < 2:\n        return n\n",
	"Q: What is the capital of France?\nA:",
	"The mitochondria is the powerhouse of the cell because",
	"Dear Sir or Madam, I am writing to apply for the position of",
	"In 1969, Neil Armstrong became the first person to walk on the moon.",
	"Here is a recipe for chocolate chip cookies. Ingredients:",
	"The stock market fell sharply on Monday as investors worried about",
	"Translate to German: The weather is nice today.",
	"A neural network is a function that maps inputs to outputs through layers of",
	"The quick brown fox jumps over the lazy dog. Then the dog",
	"SELECT name, age FROM users WHERE age > 30 ORDER BY",
	"It was the best of times, it was the worst of times, it was the age of",
	"To install the package, run the following command in your terminal:",
	"The theory of relativity tells us that time and space are",
	"My favourite memory from childhood is the summer when we went to",
	"List three reasons why sleep is important for health:\n1.",
	"The sparse model stores its hot neurons in fast memory and its cold ones",
	"Breaking news: scientists have discovered a new species of frog in",
};

struct opts {
	const char *model, *out, *prompts;
	uint32_t gen, samples;
	int threads;
	uint64_t seed;
	float temp;
	double sparsity; /* 0: none */
	bool json;
	bool teal, greedy;
	uint32_t alloc_tokens;
};

static void parse(int argc, char **argv, struct opts *o)
{
	static const struct option opts[] = {
		{ "prompts", 1, 0, 'p' }, { "gen", 1, 0, 'g' }, { "samples", 1, 0, 'S' },
		{ "seed", 1, 0, 's' }, { "temp", 1, 0, 'T' }, { "json", 0, 0, 'j' },
		{ "sparsity", 1, 0, 'y' }, { "teal", 0, 0, 'E' }, { "greedy", 0, 0, 'U' },
		{ "alloc-tokens", 1, 0, 'A' }, { "help", 0, 0, 'h' },
		{ 0, 0, 0, 0 },
	};
	int c;

	optind = 1;
	while ((c = getopt_long(argc, argv, "o:t:h", opts, NULL)) != -1) {
		switch (c) {
		case 'o': o->out = optarg; break;
		case 'p': o->prompts = optarg; break;
		case 'g': o->gen = ctl_u32("profile", "--gen", optarg, 0, 1 << 20); break;
		case 'S': o->samples = ctl_u32("profile", "--samples", optarg, 0, 1 << 24); break;
		case 't': o->threads = (int)ctl_u32("profile", "-t", optarg, 1, 1024); break;
		case 's': o->seed = strtoull(optarg, NULL, 0); break;
		case 'T': {
			char *end;

			o->temp = strtof(optarg, &end);
			if (end == optarg || *end || !(o->temp >= 0 && o->temp <= 10)) {
				fprintf(stderr, "hybctl profile: bad value '%s' for --temp\n",
					optarg);
				exit(2);
			}
			break;
		}
		case 'j': o->json = true; break;
		case 'E': o->teal = true; break;
		case 'U': o->greedy = true; break;
		case 'A':
			o->alloc_tokens = ctl_u32("profile", "--alloc-tokens", optarg, 1, 1 << 20);
			break;
		case 'y': {
			char *end;

			o->sparsity = strtod(optarg, &end);
			if (end == optarg || *end || !(o->sparsity > 0 && o->sparsity < 1)) {
				fprintf(stderr, "hybctl profile: --sparsity '%s' is outside (0, 1): "
					"the fraction of FFN neurons to skip\n", optarg);
				exit(2);
			}
			break;
		}
		case 'h': fputs(usage, stdout); exit(0);
		default: fputs(usage, stderr); exit(2);
		}
	}
	if (optind + 1 != argc) {
		fprintf(stderr, "hybctl profile: %s\n%s", optind < argc ? "one model only" :
			"no model given", usage);
		exit(2);
	}
	o->model = argv[optind];
}

/* Lines of a file (empty ones skipped); NULL with a message. */
static char **read_prompts(const char *path, uint32_t *n)
{
	FILE *f = fopen(path, "r");
	char **v = NULL, *line = NULL;
	size_t cap = 0, lcap = 0;
	ssize_t len;

	*n = 0;
	if (!f) {
		fprintf(stderr, "hybctl profile: cannot open %s: %s\n", path, strerror(errno));
		return NULL;
	}
	while ((len = getline(&line, &lcap, f)) >= 0) {
		while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
			line[--len] = 0;
		if (!len)
			continue;
		if (*n == cap) {
			char **nv = realloc(v, sizeof(*v) * (cap = cap ? 2 * cap : 32));

			if (!nv)
				goto oom;
			v = nv;
		}
		if (!(v[*n] = strdup(line)))
			goto oom;
		(*n)++;
	}
	free(line);
	fclose(f);
	if (!*n) {
		fprintf(stderr, "hybctl profile: %s holds no prompts\n", path);
		free(v);
		return NULL;
	}
	return v;
oom:
	fprintf(stderr, "hybctl profile: out of memory reading %s\n", path);
	for (uint32_t i = 0; i < *n; i++)
		free(v[i]);
	free(v);
	free(line);
	fclose(f);
	return NULL;
}

/* NaN (no data) is "-" in the table and null in JSON. */
static void print_num(FILE *f, double v, const char *fmt)
{
	if (isnan(v))
		fputs(fmt[0] == '%' ? "null" : "       -", f);
	else
		fprintf(f, fmt, v);
}

static const char *fmt(char *buf, double v, int digits)
{
	if (isnan(v))
		return "-";
	snprintf(buf, 24, "%.*f", digits, v);
	return buf;
}

static void print_table(FILE *f, const struct hyb_profile *p, const struct hyb_profile_summary *s)
{
	char b[7][24];

	fprintf(f, "layer  sparsity  hot80  jaccard  cos_next  react_d1  d2    d3    d4    d8"
		"    lift  (random)\n");
	for (uint32_t l = 0; l < p->n_layer; l++) {
		const struct hyb_profile_layer *ly = &p->layers[l];
		const int ds[5] = { 1, 2, 3, 4, 8 };

		fprintf(f, "%5u  ", l);
		print_num(f, ly->sparsity, "  %.4f");
		print_num(f, ly->hot_share_80, "  %.3f");
		print_num(f, ly->jaccard_adjacent, "   %.3f");
		print_num(f, ly->cos_next, "    %.4f");
		for (int k = 0; k < 5; k++)
			print_num(f, ly->reactivation[ds[k] - 1], k ? " %.3f" : "     %.3f");
		print_num(f, ly->coact_lift, "  %6.2f");
		print_num(f, ly->coact_lift_random, "  (%.2f)");
		fputc('\n', f);
	}
	fprintf(f, "model: sparsity %s, hot share %s (80%% of activations, all layers), "
		"jaccard %s, cos_next min %s, cold reactivation d>=3 max %s, "
		"co-activation lift %s (random %s)\n", fmt(b[0], s->sparsity, 4),
		fmt(b[1], s->hot_share_80, 3), fmt(b[2], s->jaccard_adjacent, 3),
		fmt(b[3], s->cos_next_min, 4), fmt(b[4], s->reactivation_cold_max, 3),
		fmt(b[5], s->coact_lift, 2), fmt(b[6], s->coact_lift_random, 2));
	if (p->cats_threshold) {
		fprintf(f, "CATS thresholds for sparsity %.2f (|act(gate)| at or below skips the "
			"neuron):", (double)p->target_sparsity);
		for (uint32_t l = 0; l < p->n_layer; l++)
			fprintf(f, " %.4g", (double)p->cats_threshold[l]);
		fputc('\n', f);
	}
}

static void json_arr(const struct hyb_profile *p, const char *key, size_t off)
{
	printf("  \"%s\": [", key);
	for (uint32_t l = 0; l < p->n_layer; l++) {
		double v = *(const double *)((const char *)&p->layers[l] + off);

		printf(l ? ", " : "");
		print_num(stdout, v, "%.6g");
	}
	printf("],\n");
}

static void print_json(const struct hyb_profile *p, const struct hyb_profile_summary *s,
		       double seconds)
{
	printf("{\n  \"model\": ");
	ctl_json_str(stdout, p->model_name);
	printf(",\n  \"n_layer\": %u, \"n_embd\": %u, \"n_ff\": %u,\n", p->n_layer, p->n_embd,
	       p->n_ff);
	printf("  \"n_tokens\": %llu, \"n_samples\": %u, \"n_seqs\": %u, \"seconds\": %.3f,\n",
	       (unsigned long long)p->n_tokens, p->n_samples, p->n_seqs, seconds);
#define ARR(f) json_arr(p, #f, offsetof(struct hyb_profile_layer, f))
	ARR(sparsity);
	ARR(hot_share_80);
	ARR(jaccard_adjacent);
	ARR(cos_next);
	ARR(coact_lift);
	ARR(coact_lift_random);
#undef ARR
	printf("  \"reactivation\": [");
	for (uint32_t l = 0; l < p->n_layer; l++) {
		printf(l ? ", [" : "[");
		for (int d = 0; d < 8; d++) {
			printf(d ? ", " : "");
			print_num(stdout, p->layers[l].reactivation[d], "%.6g");
		}
		printf("]");
	}
	printf("],\n");
	if (p->cats_threshold) {
		printf("  \"target_sparsity\": %.6g, \"threshold\": [", (double)p->target_sparsity);
		for (uint32_t l = 0; l < p->n_layer; l++)
			printf(l ? ", %.6g" : "%.6g", (double)p->cats_threshold[l]);
		printf("],\n");
	}
	printf("  \"summary\": {\"sparsity\": ");
	print_num(stdout, s->sparsity, "%.6g");
	printf(", \"hot_share_80\": ");
	print_num(stdout, s->hot_share_80, "%.6g");
	printf(", \"jaccard_adjacent\": ");
	print_num(stdout, s->jaccard_adjacent, "%.6g");
	printf(", \"cos_next_min\": ");
	print_num(stdout, s->cos_next_min, "%.6g");
	printf(", \"reactivation_cold_max\": ");
	print_num(stdout, s->reactivation_cold_max, "%.6g");
	printf(", \"coact_lift\": ");
	print_num(stdout, s->coact_lift, "%.6g");
	printf(", \"coact_lift_random\": ");
	print_num(stdout, s->coact_lift_random, "%.6g");
	printf("}\n}\n");
}

/* One profiling run: the prompts as token ids, the model, its context, the collector. */
struct run {
	struct opts o;
	char **prompts;
	uint32_t n_prompts;
	int32_t **ids;
	int *n_ids, longest;
	struct hyb_model *m;
	struct hyb_ctx *ctx;
	struct hyb_profile_collector *col;
	float *thr, *quant; /* CATS: thresholds [n_layer], quantiles [n_layer][101] */
	bool moe;           /* a mixture of experts: profile_moe.c profiles it */
	/* TEAL: each prompt with its sampled continuation, for the allocation */
	int32_t **seq;
	uint32_t *seq_len, cur;
};

/* hyb_generate's callback: the token joins the current sequence. */
static int keep_token(void *arg, int32_t tok)
{
	struct run *r = arg;

	r->seq[r->cur][r->seq_len[r->cur]++] = tok;
	return 0;
}

/* Every prompt as token ids; the longest sets the context. 0 or -1 (said on stderr). */
static int tokenize_prompts(struct run *r)
{
	r->ids = calloc(r->n_prompts, sizeof(*r->ids));
	r->n_ids = calloc(r->n_prompts, sizeof(*r->n_ids));
	if (!r->ids || !r->n_ids) {
		fprintf(stderr, "hybctl profile: out of memory\n");
		return -1;
	}
	for (uint32_t i = 0; i < r->n_prompts; i++) {
		size_t len = strlen(r->prompts[i]);
		int n = hyb_tokenize(r->m->tok, r->prompts[i], len, true, NULL, 0);

		if (n <= 0 || !(r->ids[i] = malloc(sizeof(int32_t) * n)) ||
		    hyb_tokenize(r->m->tok, r->prompts[i], len, true, r->ids[i], n) != n) {
			fprintf(stderr, "hybctl profile: cannot tokenize prompt %u\n", i + 1);
			return -1;
		}
		r->n_ids[i] = n;
		r->longest = n > r->longest ? n : r->longest;
	}
	return 0;
}

/* The model, its prompts, a context that holds the longest, the collector on its FFN probe. */
static int open_run(struct run *r)
{
	struct hyb_ctx_params cp = { .n_threads = r->o.threads };
	const struct hyb_model *m;
	char name[128] = "";

	r->m = hyb_model_load(r->o.model);
	if (!r->m) {
		fprintf(stderr, "hybctl profile: %s\n", hyb_last_error());
		return -1;
	}
	m = r->m;
	if (!m->tok) {
		fprintf(stderr, "hybctl profile: %s has no tokenizer\n", r->o.model);
		return -1;
	}
	if (r->o.teal && (m->hp.n_expert || (m->hp.act != HYB_ACT_SILU &&
					       m->hp.act != HYB_ACT_GELU))) {
		fprintf(stderr, "hybctl profile: --teal: %s\n",
			m->hp.n_expert ? "TEAL covers dense FFNs; this model's are mixtures of "
			"experts" : "this model's FFN is ReLU-family and sparse as it is: profile "
			"its natural sparsity without --teal");
		return -1;
	}
	if (m->hp.n_expert) {
		if (r->o.sparsity) {
			fprintf(stderr, "hybctl profile: %s is a mixture of experts: --sparsity "
				"(CATS thresholds) does not apply to it yet (docs/MOE.md)\n",
				r->o.model);
			return -1;
		}
		r->moe = true;
		return tokenize_prompts(r);
	}
	if (r->o.sparsity && m->hp.act != HYB_ACT_SILU && m->hp.act != HYB_ACT_GELU) {
		fprintf(stderr, "hybctl profile: note: %s's FFN is ReLU-family and sparse as it is: "
			"--sparsity is ignored, its natural sparsity is profiled\n", r->o.model);
		r->o.sparsity = 0;
	} else if (!r->o.sparsity && !r->o.teal &&
		   (m->hp.act == HYB_ACT_SILU || m->hp.act == HYB_ACT_GELU)) {
		fprintf(stderr, "hybctl profile: note: %s uses %s, whose activations are never "
			"exactly 0 (sparsity ~0): --sparsity S calibrates thresholds that make "
			"them sparse (docs/SPARSITY.md)\n", r->o.model,
			m->hp.act == HYB_ACT_SILU ? "SiLU" : "GELU");
	}
	if (tokenize_prompts(r))
		return -1;
	if ((uint64_t)r->longest + r->o.gen > m->hp.n_ctx_train) {
		fprintf(stderr, "hybctl profile: a prompt of %d tokens + %u generated exceed the "
			"model's context of %u\n", r->longest, r->o.gen, m->hp.n_ctx_train);
		return -1;
	}
	cp.n_ctx = (uint32_t)r->longest + r->o.gen + 1;
	if (cp.n_ctx > m->hp.n_ctx_train)
		cp.n_ctx = m->hp.n_ctx_train;
	r->ctx = hyb_ctx_new(m, &cp);
	if (!r->ctx) {
		fprintf(stderr, "hybctl profile: %s\n", hyb_last_error());
		return -1;
	}
	if (!hyb_gguf_get_str(m->gguf, "general.name", name, sizeof(name)))
		snprintf(name, sizeof(name), "%s", r->o.model);
	r->col = hyb_profile_collector_new(m->hp.n_layer, m->hp.n_embd, m->hp.n_ff, r->o.samples,
					   name);
	if (!r->col) {
		fprintf(stderr, "hybctl profile: %s\n", hyb_last_error());
		return -1;
	}
	hyb_ctx_set_ffn_probe(r->ctx, hyb_profile_probe, r->col);
	return 0;
}

/* Each prompt and the model's own sampled continuation through the probed context
 * (with calib, the calibration pass: no collector). */
static int generate_all(struct run *r, bool calib)
{
	for (uint32_t i = 0; i < r->n_prompts; i++) {
		struct hyb_sampler_params sp = hyb_sampler_defaults();
		struct hyb_sampler *s;
		struct hyb_gen_stats st;
		int rc;

		sp.temperature = r->o.temp;
		sp.top_k = 0;
		sp.top_p = 1.0f;
		sp.min_p = 0.0f;
		sp.repeat_penalty = 1.0f;
		sp.seed = r->o.seed + i;
		s = hyb_sampler_new(&sp, (int32_t)r->m->hp.n_vocab);
		if (!s) {
			fprintf(stderr, "hybctl profile: %s\n", hyb_last_error());
			return -1;
		}
		hyb_ctx_reset(r->ctx);
		if (!calib)
			hyb_profile_collector_begin_seq(r->col, (r->o.samples + r->n_prompts - 1) /
							r->n_prompts);
		if (r->seq) { /* the prompt, then what is generated after it */
			r->cur = i;
			memcpy(r->seq[i], r->ids[i], sizeof(int32_t) * (size_t)r->n_ids[i]);
			r->seq_len[i] = (uint32_t)r->n_ids[i];
		}
		rc = hyb_generate(r->ctx, r->m, s, r->ids[i], (uint32_t)r->n_ids[i], r->o.gen,
				  r->seq ? keep_token : NULL, r, &st);
		hyb_sampler_free(s);
		if (rc) {
			fprintf(stderr, "hybctl profile: prompt %u: %s\n", i + 1, hyb_last_error());
			return -1;
		}
	}
	hyb_ctx_set_ffn_probe(r->ctx, NULL, NULL);
	return 0;
}

/*
 * CATS calibration (CATS §3.2): the prompts through the dense model with the
 * probe on act(gate), each layer's threshold the quantile of |act(gate)| at
 * the target sparsity; the context then runs with them, so the profile that
 * follows sees the activations sparse decoding will compute.
 */
static int calibrate(struct run *r)
{
	const struct hyb_hparams *hp = &r->m->hp;
	struct hyb_calib *cal = hyb_calib_new(hp->n_layer, hp->n_ff);
	int rc = -1;

	r->thr = malloc(sizeof(float) * hp->n_layer);
	r->quant = malloc(sizeof(float) * hp->n_layer * HYB_SPARSITY_N_QUANTILES);
	if (!cal || !r->thr || !r->quant) {
		fprintf(stderr, "hybctl profile: out of memory\n");
		goto out;
	}
	hyb_ctx_set_ffn_probe(r->ctx, hyb_calib_probe, cal);
	hyb_ctx_set_ffn_probe_gate(r->ctx, true);
	if (generate_all(r, true))
		goto out;
	hyb_ctx_set_ffn_probe_gate(r->ctx, false);
	if (hyb_calib_quantiles(cal, r->quant)) {
		fprintf(stderr, "hybctl profile: %s\n", hyb_last_error());
		goto out;
	}
	for (uint32_t l = 0; l < hp->n_layer; l++)
		r->thr[l] = hyb_sparsity_quantile_at(r->quant + (size_t)l * HYB_SPARSITY_N_QUANTILES,
						     r->o.sparsity);
	if (hyb_ctx_set_ffn_thresholds(r->ctx, r->thr)) {
		fprintf(stderr, "hybctl profile: %s\n", hyb_last_error());
		goto out;
	}
	hyb_ctx_set_ffn_probe(r->ctx, hyb_profile_probe, r->col);
	rc = 0;
out:
	hyb_calib_free(cal);
	return rc;
}

/*
 * TEAL calibration (TEAL §4.1): the prompts and continuations through the
 * dense model with the probe on every projection's input; an input's
 * threshold is the quantile of its magnitudes at its sparsity: the model's
 * (uniform), or with --greedy from TEAL's greedy allocation (§4.2,
 * teal_alloc.c) on the first --alloc-tokens of those sequences.
 * Saves quantiles, allocation and the thresholds at --sparsity; prints them.
 */
static int teal_profile(struct run *r)
{
	const uint32_t L = r->m->hp.n_layer, NI = HYB_TEAL_INPUTS, NQ = HYB_SPARSITY_N_QUANTILES;
	const double s = r->o.sparsity ? r->o.sparsity : 0.4;
	struct hyb_calib *cal = hyb_calib_new(L * NI, 1);
	float *q = malloc(sizeof(float) * L * NI * NQ), *thr = malloc(sizeof(float) * L * NI);
	float *alloc = !r->o.greedy ? NULL
				    : malloc(sizeof(float) * L * HYB_TEAL_LEVELS * NI);
	struct hyb_gguf_writer *w = NULL;
	uint32_t n_seq = 0, left = r->o.alloc_tokens, *lens = NULL;
	const int32_t **seqs = NULL;
	int rc = -1;

	r->seq = calloc(r->n_prompts, sizeof(*r->seq));
	r->seq_len = calloc(r->n_prompts, sizeof(*r->seq_len));
	lens = calloc(r->n_prompts, sizeof(*lens));
	seqs = calloc(r->n_prompts, sizeof(*seqs));
	if (!cal || !q || !thr || (r->o.greedy && !alloc) || !r->seq || !r->seq_len || !lens ||
	    !seqs)
		goto nomem;
	for (uint32_t i = 0; i < r->n_prompts; i++)
		if (!(r->seq[i] = malloc(sizeof(int32_t) * ((size_t)r->n_ids[i] + r->o.gen))))
			goto nomem;
	hyb_ctx_set_input_probe(r->ctx, hyb_calib_input_probe, cal);
	if (generate_all(r, true))
		goto out;
	hyb_ctx_set_input_probe(r->ctx, NULL, NULL);
	if (hyb_calib_quantiles(cal, q)) {
		fprintf(stderr, "hybctl profile: %s\n", hyb_last_error());
		goto out;
	}
	if (alloc) {
		const double t0 = hyb_now();
		uint32_t used = 0;

		/* whole sequences (each within a pass) until --alloc-tokens */
		for (uint32_t i = 0; i < r->n_prompts && left; i++) {
			uint32_t n = r->seq_len[i] < 512 ? r->seq_len[i] : 512;

			n = n < left ? n : left;
			seqs[n_seq] = r->seq[i];
			lens[n_seq++] = n;
			left -= n;
			used += n;
		}
		if (hyb_teal_allocate(r->ctx, r->m, seqs, lens, n_seq, q, alloc)) {
			fprintf(stderr, "hybctl profile: %s\n", hyb_last_error());
			goto out;
		}
		fprintf(stderr, "hybctl profile: TEAL's greedy allocation on %u tokens in %.1f s\n",
			used, hyb_now() - t0);
	}
	for (uint32_t i = 0; i < L * NI; i++)
		thr[i] = hyb_sparsity_quantile_at(q + (size_t)i * NQ,
						  alloc ? hyb_teal_alloc_at(alloc, i / NI, i % NI, s)
							: s);
	printf("TEAL at sparsity %.2f (%s): |input| at or below the threshold counts as 0\n", s,
	       alloc ? "greedy allocation, TEAL 4.2" : "uniform");
	printf("layer %16s %16s %16s %16s   (sparsity threshold)\n", hyb_teal_input_name(0),
	       hyb_teal_input_name(1), hyb_teal_input_name(2), hyb_teal_input_name(3));
	for (uint32_t l = 0; l < L; l++) {
		printf("%5u", l);
		for (uint32_t i = 0; i < NI; i++)
			printf("  %5.3f %9.4g", alloc ? hyb_teal_alloc_at(alloc, l, i, s) : s,
			       (double)thr[l * NI + i]);
		printf("\n");
	}
	if (profile_teal_stats(r->ctx, r->m, thr, r->seq, r->seq_len, r->n_prompts, r->o.samples))
		goto out;
	rc = 0;
	if (!r->o.out)
		goto out;
	w = hyb_gguf_writer_new();
	if (!w)
		goto nomem;
	hyb_gguf_set_u32(w, "hyb.profile.version", 1);
	hyb_gguf_set_u32(w, "hyb.profile.n_layer", L);
	hyb_gguf_set_str(w, HYB_SPARSITY_KEY_MODE, HYB_SPARSITY_MODE_TEAL);
	hyb_gguf_set_f32(w, HYB_SPARSITY_KEY_TARGET, (float)s);
	hyb_gguf_set_arr(w, HYB_SPARSITY_KEY_THRESHOLD, HYB_GGUF_VT_FLOAT32, thr, (uint64_t)L * NI);
	hyb_gguf_set_arr(w, HYB_SPARSITY_KEY_QUANTILES, HYB_GGUF_VT_FLOAT32, q,
			 (uint64_t)L * NI * NQ);
	if (alloc)
		hyb_gguf_set_arr(w, HYB_SPARSITY_KEY_TEAL_ALLOC, HYB_GGUF_VT_FLOAT32, alloc,
				 (uint64_t)L * HYB_TEAL_LEVELS * NI);
	rc = hyb_gguf_writer_write_file(w, r->o.out);
	if (rc)
		fprintf(stderr, "hybctl profile: %s\n", hyb_last_error());
	goto out;
nomem:
	fprintf(stderr, "hybctl profile: out of memory\n");
	rc = -1;
out:
	hyb_gguf_writer_free(w);
	hyb_calib_free(cal);
	free(q);
	free(thr);
	free(alloc);
	free(lens);
	free(seqs);
	return rc ? -1 : 0;
}

static void close_run(struct run *r)
{
	for (uint32_t i = 0; r->seq && i < r->n_prompts; i++)
		free(r->seq[i]);
	free(r->seq);
	free(r->seq_len);
	hyb_profile_collector_free(r->col);
	free(r->thr);
	free(r->quant);
	hyb_ctx_free(r->ctx);
	hyb_model_free(r->m);
	for (uint32_t i = 0; r->ids && i < r->n_prompts; i++)
		free(r->ids[i]);
	free(r->ids);
	free(r->n_ids);
	if (r->prompts != (char **)builtin_prompts) {
		for (uint32_t i = 0; i < r->n_prompts; i++)
			free(r->prompts[i]);
		free(r->prompts);
	}
}

int cmd_profile(int argc, char **argv)
{
	struct run r = { .o = { .gen = 64, .samples = 4096, .seed = 1, .temp = 0.8f,
				.alloc_tokens = 256 },
			 .prompts = (char **)builtin_prompts,
			 .n_prompts = sizeof(builtin_prompts) / sizeof(builtin_prompts[0]) };
	struct hyb_profile *prof = NULL;
	struct hyb_profile_summary sum;
	int rc = 1;
	double t0;

	parse(argc, argv, &r.o);
	if (r.o.prompts && !(r.prompts = read_prompts(r.o.prompts, &r.n_prompts))) {
		r.prompts = (char **)builtin_prompts;
		return 1;
	}
	if (open_run(&r))
		goto out;
	if (r.moe) {
		struct profile_moe_opts mo = { .model = r.o.model, .out = r.o.out, .gen = r.o.gen,
					       .threads = r.o.threads, .seed = r.o.seed,
					       .temp = r.o.temp, .json = r.o.json };

		rc = profile_moe(r.m, &mo, r.ids, r.n_ids, r.n_prompts);
		goto out;
	}
	if (r.o.teal) {
		rc = teal_profile(&r) ? 1 : 0;
		goto out;
	}
	t0 = hyb_now();
	if (r.o.sparsity && calibrate(&r))
		goto out;
	if (generate_all(&r, false))
		goto out;
	prof = hyb_profile_collector_finish(r.col);
	r.col = NULL;
	if (!prof) {
		fprintf(stderr, "hybctl profile: out of memory\n");
		goto out;
	}
	if (r.thr) {
		prof->target_sparsity = (float)r.o.sparsity;
		prof->cats_threshold = r.thr;
		prof->cats_quantiles = r.quant;
		r.thr = r.quant = NULL;
	}
	hyb_profile_summarize(prof, &sum);
	t0 = hyb_now() - t0;
	fprintf(stderr, "hybctl profile: %s: %u prompts, %llu tokens (%u sampled) in %.2f s "
		"(%.1f tokens/s)\n", r.o.model, r.n_prompts, (unsigned long long)prof->n_tokens,
		prof->n_samples, t0, prof->n_tokens / t0);
	if (r.o.json)
		print_json(prof, &sum, t0);
	else
		print_table(stdout, prof, &sum);
	if (r.o.out && hyb_profile_save(prof, r.o.out)) {
		fprintf(stderr, "hybctl profile: %s\n", hyb_last_error());
		goto out;
	}
	rc = 0;
out:
	hyb_profile_free(prof);
	close_run(&r);
	return rc;
}
