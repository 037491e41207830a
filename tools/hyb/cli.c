// SPDX-License-Identifier: MIT
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyb/sparsity.h"
#include "hyb/tokenizer.h"

void cli_die(const char *fmt, ...)
{
	va_list ap;

	fputs("hyb: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

double cli_num(const char *opt, const char *s, double lo, double hi)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || *end || !(v >= lo && v <= hi))
		cli_die("bad value '%s' for %s (expected a number in [%g, %g])", s, opt, lo, hi);
	return v;
}

enum { O_TEMP = 256, O_TOPK, O_TOPP, O_MINP, O_PEN, O_PENN, O_SEED, O_TOKENS, O_DECODE, O_IDS,
       O_DENSE, O_SPARSE, O_MANIFEST, O_BASELINE, O_BUDGET, O_POLICY, O_POLICIES, O_DEVICE,
       O_PCIE, O_DRIFT, O_ROUTING, O_NO_PREFETCH, O_DENSE_CPU, O_PREFILL_CPU, O_PROMPT_BATCH, O_THRESHOLDS,
       O_CACHE, O_LOAD_FIRST, O_CHAT, O_CHAT_TEMPLATE, O_SYSTEM, O_CATS, O_SPARSITY, O_CHUNKS, O_DEFER, O_NO_NUMA_PIN, O_TEAL,
       O_PARALLEL, O_KV_SEQS, O_VCLOCK, O_GRAPH };

static const struct option longopts[] = {
	{ "model", required_argument, 0, 'm' },
	{ "prompt", required_argument, 0, 'p' },
	{ "n-predict", required_argument, 0, 'n' },
	{ "threads", required_argument, 0, 't' },
	{ "ctx-size", required_argument, 0, 'c' },
	{ "output", required_argument, 0, 'o' },
	{ "reps", required_argument, 0, 'r' },
	{ "temp", required_argument, 0, O_TEMP },
	{ "top-k", required_argument, 0, O_TOPK },
	{ "top-p", required_argument, 0, O_TOPP },
	{ "min-p", required_argument, 0, O_MINP },
	{ "repeat-penalty", required_argument, 0, O_PEN },
	{ "repeat-last-n", required_argument, 0, O_PENN },
	{ "seed", required_argument, 0, O_SEED },
	{ "tokens", required_argument, 0, O_TOKENS },
	{ "decode", no_argument, 0, O_DECODE },
	{ "print-ids", no_argument, 0, O_IDS },
	{ "dense", no_argument, 0, O_DENSE },
	{ "sparse", no_argument, 0, O_SPARSE },
	{ "manifest", required_argument, 0, O_MANIFEST },
	{ "baseline", required_argument, 0, O_BASELINE },
	{ "gpu-budget", required_argument, 0, O_BUDGET },
	{ "policy", required_argument, 0, O_POLICY },
	{ "policies", required_argument, 0, O_POLICIES },
	{ "device", required_argument, 0, O_DEVICE },
	{ "pcie-gbps", required_argument, 0, O_PCIE },
	{ "virtual-clock", no_argument, 0, O_VCLOCK },
	{ "drift", required_argument, 0, O_DRIFT },
	{ "routing", required_argument, 0, O_ROUTING },
	{ "no-prefetch", no_argument, 0, O_NO_PREFETCH },
	{ "graph", no_argument, 0, O_GRAPH },
	{ "dense-cpu", no_argument, 0, O_DENSE_CPU },
	{ "prefill-cpu", no_argument, 0, O_PREFILL_CPU },
	{ "prompt-batch", required_argument, 0, O_PROMPT_BATCH },
	{ "thresholds", required_argument, 0, O_THRESHOLDS },
	{ "parallel", required_argument, 0, O_PARALLEL },
	{ "kv-seqs", required_argument, 0, O_KV_SEQS },
	{ "cache", required_argument, 0, O_CACHE },
	{ "load-first", no_argument, 0, O_LOAD_FIRST },
	{ "chat", no_argument, 0, O_CHAT },
	{ "chat-template", required_argument, 0, O_CHAT_TEMPLATE },
	{ "system", required_argument, 0, O_SYSTEM },
	{ "cats", required_argument, 0, O_CATS },
	{ "teal", required_argument, 0, O_TEAL },
	{ "sparsity", required_argument, 0, O_SPARSITY },
	{ "defer", required_argument, 0, O_DEFER },
	{ "no-numa-pin", no_argument, 0, O_NO_NUMA_PIN },
	{ "chunks", required_argument, 0, O_CHUNKS },
	{ "file", required_argument, 0, 'f' },
	{ "help", no_argument, 0, 'h' },
	{ 0, 0, 0, 0 },
};


/* The hybrid options (hyb/hybrid.h); false: not one of them. */
static bool parse_hybrid(int c, struct cli_opts *o)
{
	switch (c) {
	case O_BUDGET: o->gpu_budget = optarg; break;
	case O_POLICY:
		if (hyb_policy_parse(optarg, &o->hy.policy))
			cli_die("unknown policy '%s' (static, layer, lru, topk, dynamic, tam, "
				"tam-adaptive)", optarg);
		break;
	case O_POLICIES: o->policies = optarg; break;
	case O_DEVICE:
		if (strcmp(optarg, "cpu") && strcmp(optarg, "cuda"))
			cli_die("unknown device '%s' (cpu, cuda)", optarg);
		o->hy.device = optarg;
		break;
	case O_PCIE: o->hy.dev.pcie_gbps = cli_num("--pcie-gbps", optarg, 0.01, 1e4); break;
	case O_VCLOCK: o->hy.dev.virtual_clock = true; break;
	case O_DRIFT: o->drift = (uint32_t)cli_num("--drift", optarg, 1, 1 << 20); break;
	case O_ROUTING: o->routing = optarg; break;
	case O_NO_PREFETCH: o->hy.no_prefetch = true; break;
	case O_GRAPH: o->hy.graph = true; break;
	case O_DENSE_CPU: o->hy.dense_on_cpu = true; break;
	case O_PREFILL_CPU: o->hy.prefill_cpu = true; break;
	case O_PROMPT_BATCH:
		o->hy.prompt_batch = (uint32_t)cli_num("--prompt-batch", optarg, 1, 1 << 16);
		break;
	case O_THRESHOLDS: o->hy.thresholds = cli_thresholds(optarg); break;
	case O_PARALLEL: o->parallel = (uint32_t)cli_num("--parallel", optarg, 1, 256); break;
	case O_KV_SEQS: o->hy.kv_seqs = (uint32_t)cli_num("--kv-seqs", optarg, 1, 256); break;
	case O_CACHE:
		if (!strcmp(optarg, "auto"))
			o->hy.cache = HYB_CACHE_AUTO;
		else if (!strcmp(optarg, "own"))
			o->hy.cache = HYB_CACHE_OWN;
		else if (!strcmp(optarg, "hybd"))
			o->hy.cache = HYB_CACHE_HYBD;
		else
			cli_die("unknown cache '%s' (auto, own, hybd)", optarg);
		break;
	default:
		return false;
	}
	return true;
}

void cli_parse(int argc, char **argv, struct cli_opts *o, const char *usage)
{
	int c;

	o->sp = hyb_sampler_defaults();
	o->sparsity = -1;
	o->hy.policy = HYB_POLICY_TAM_ADAPTIVE;
	optind = 1;
	while ((c = getopt_long(argc, argv, "m:p:n:t:c:o:r:f:h", longopts, NULL)) != -1) {
		switch (c) {
		case 'm': o->model = optarg; break;
		case 'p': o->prompt = optarg; break;
		case 'n': o->n_predict = o->n_gen_bench = (int)cli_num("-n", optarg, 0, 1 << 24); break;
		case 't': o->n_threads = (int)cli_num("-t", optarg, 1, 1024); break;
		case 'c': o->n_ctx = (uint32_t)cli_num("-c", optarg, 1, 1 << 24); break;
		case 'o': o->out = optarg; break;
		case 'r': o->reps = (int)cli_num("-r", optarg, 1, 1000); break;
		case O_TEMP: o->sp.temperature = (float)cli_num("--temp", optarg, 0, 100); break;
		case O_TOPK: o->sp.top_k = (int32_t)cli_num("--top-k", optarg, 0, 1 << 30); break;
		case O_TOPP: o->sp.top_p = (float)cli_num("--top-p", optarg, 0, 1); break;
		case O_MINP: o->sp.min_p = (float)cli_num("--min-p", optarg, 0, 1); break;
		case O_PEN: o->sp.repeat_penalty = (float)cli_num("--repeat-penalty", optarg, 0, 100); break;
		case O_PENN: o->sp.repeat_last_n = (int32_t)cli_num("--repeat-last-n", optarg, 0, 1 << 20); break;
		case O_SEED: o->sp.seed = (uint64_t)cli_num("--seed", optarg, 0, 9007199254740992.0); break;
		case O_TOKENS: o->tokens = optarg; break;
		case O_DECODE: o->decode = true; break;
		case O_IDS: o->print_ids = true; break;
		case O_LOAD_FIRST: o->stream_load = false; break;
		case O_DENSE: o->ffn = HYB_FFN_DENSE; break;
		case O_SPARSE: o->ffn = HYB_FFN_SPARSE; break;
		case O_MANIFEST: o->model = o->manifest = optarg; break;
		case O_BASELINE: o->baseline = optarg; break;
		case O_CHAT: o->chat = true; break;
		case O_CHAT_TEMPLATE: o->chat_template = optarg; break;
		case O_SYSTEM: o->system = optarg; break;
		case O_CATS: o->cats = optarg; break;
		case O_TEAL: o->teal = optarg; break;
		case O_DEFER: o->moe_defer = (uint32_t)cli_num("--defer", optarg, 0, 512); break;
		case O_NO_NUMA_PIN: o->numa_no_pin = true; break;
		case O_SPARSITY:
			o->sparsity = cli_num("--sparsity", optarg, 0, 1);
			if (o->sparsity >= 1)
				cli_die("--sparsity %s: the fraction of FFN neurons to skip, below 1",
					optarg);
			break;
		case O_CHUNKS: o->n_chunks = (int)cli_num("--chunks", optarg, 1, 1 << 30); break;
		case 'f': o->text_file = optarg; break;
		case 'h': fputs(usage, stdout); exit(0);
		default:
			if (!parse_hybrid(c, o)) {
				fputs(usage, stderr);
				exit(2);
			}
		}
	}
	if (optind < argc)
		cli_die("unexpected argument '%s'", argv[optind]);
	if ((o->parallel || o->hy.kv_seqs) && !strstr(usage, "--parallel"))
		cli_die("--parallel and --kv-seqs are hyb bench's and hyb serve's");
	if (o->hy.prefill_cpu && o->hy.prompt_batch)
		cli_die("--prompt-batch sizes prompt batches on the device; --prefill-cpu keeps "
			"prompts off it: one or the other");
	if (!o->model)
		cli_die("no model given (-m MODEL)");
	if (o->sparsity > 0 && !o->cats && !o->teal)
		cli_die("--sparsity %g needs --cats PROFILE or --teal PROFILE (thresholds for it "
			"come from a profile's quantiles)", o->sparsity);
	if (o->cats && o->teal)
		cli_die("--cats and --teal: one kind of activation sparsity at a time");
}

/* --cats / --sparsity onto a new context (hyb/sparsity.h); exits on failure. */
static void apply_cats(struct hyb_ctx *c, const struct hyb_model *m, const struct cli_opts *o)
{
	float *thr;

	if (o->sparsity == 0) { /* explicitly dense, a plan's own thresholds too */
		if (hyb_ctx_set_ffn_thresholds(c, NULL))
			cli_die("%s", hyb_last_error());
		return;
	}
	if (!o->cats)
		return;
	thr = malloc(sizeof(float) * m->hp.n_layer);
	if (!thr)
		cli_die("out of memory");
	if (hyb_sparsity_thresholds(o->cats, o->sparsity > 0 ? o->sparsity : 0, thr,
				    m->hp.n_layer) ||
	    hyb_ctx_set_ffn_thresholds(c, thr))
		cli_die("--cats %s: %s", o->cats, hyb_last_error());
	free(thr);
}

void cli_apply_teal(struct hyb_ctx *c, const struct hyb_model *m, const struct cli_opts *o)
{
	float *thr;

	if (!o->teal || o->sparsity == 0)
		return;
	thr = malloc(sizeof(float) * m->hp.n_layer * HYB_TEAL_INPUTS);
	if (!thr)
		cli_die("out of memory");
	if (hyb_sparsity_teal_thresholds(o->teal, o->sparsity > 0 ? o->sparsity : 0, thr,
					 m->hp.n_layer) ||
	    hyb_ctx_set_teal_thresholds(c, thr))
		cli_die("--teal %s: %s", o->teal, hyb_last_error());
	free(thr);
	if (hyb_teal_layout_check(m))
		fprintf(stderr, "hyb: note: --teal: %s: the thresholds apply, the speed does not\n",
			hyb_last_error());
}

struct hyb_model *cli_load_model(const struct cli_opts *o)
{
	struct hyb_model *m;

	if (o->manifest)
		return cli_load_manifest(o->manifest);
	/* hyb run computes its prompt while the weights still stream in */
	m = o->stream_load ? hyb_model_load_streaming(o->model) :
			     hyb_model_load(o->model);
	if (!m)
		cli_die("%s", hyb_last_error());
	return m;
}

static int cmp_double(const void *a, const void *b)
{
	const double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

double cli_median(double *v, int n)
{
	qsort(v, n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int32_t cli_argmax(const float *v, uint32_t n)
{
	uint32_t b = 0;

	for (uint32_t i = 1; i < n; i++)
		if (v[i] > v[b])
			b = i;
	return (int32_t)b;
}

struct hyb_ctx *cli_new_ctx(const struct hyb_model *m, const struct cli_opts *o)
{
	struct hyb_ctx_params p = { .n_ctx = o->n_ctx, .n_threads = o->n_threads, .ffn = o->ffn,
				    .moe_defer = o->moe_defer, .numa_no_pin = o->numa_no_pin };
	struct hyb_hybrid_params hy = o->hy;
	struct hyb_ctx *c;

	if (o->gpu_budget) {
		hy.gpu_budget = cli_gpu_budget(o->gpu_budget, m);
		p.hybrid = &hy;
		if (o->routing)
			hy.bal.freq = cli_routing_freq(m, o->routing);
	} else if (o->routing) {
		cli_die("--routing places experts for --gpu-budget; without it experts run on "
			"the CPU");
	} else if (o->hy.thresholds) {
		cli_die("--thresholds split the work of hybrid decoding: it needs --gpu-budget");
	}
	c = hyb_ctx_new(m, &p);

	if (!c)
		cli_die("%s", hyb_last_error());
	cli_check_prompt_batch(c, &hy);
	apply_cats(c, m, o);
	cli_apply_teal(c, m, o);
	return c;
}

struct hyb_ctx *cli_new_ctx_seqs(const struct hyb_model *m, const struct cli_opts *o,
				 uint32_t n_seq, bool batch_variant)
{
	const uint32_t n_pos = o->n_ctx;
	struct hyb_ctx_params p = { .n_ctx = n_pos, .n_threads = o->n_threads, .ffn = o->ffn,
				    .numa_no_pin = o->numa_no_pin, .n_seq = n_seq,
				    .kv_size = n_seq * ((n_pos + 15) / 16 * 16), /* whole blocks */
				    .batch_variant = batch_variant };
	struct hyb_ctx *c = hyb_ctx_new(m, &p);

	if (!c)
		cli_die("%s", hyb_last_error());
	apply_cats(c, m, o);
	cli_apply_teal(c, m, o);
	return c;
}

void cli_print_sparse(const struct hyb_ctx *c, double t_decode)
{
	struct hyb_sparse_stats st;

	if (!hyb_ctx_sparse(c))
		return;
	hyb_ctx_sparse_stats(c, &st);
	if (!st.layer_steps)
		return;
	fprintf(stderr, "sparse: %.1f%% of FFN neurons predicted active, %.1f%% fired; "
		"predictors %.1f%% and sparse FFNs %.1f%% of decode time\n",
		100.0 * st.predicted / st.neurons, 100.0 * st.nonzero / st.neurons,
		t_decode > 0 ? 100 * st.predictor_s / t_decode : 0.0,
		t_decode > 0 ? 100 * st.ffn_s / t_decode : 0.0);
}

void cli_print_teal(const struct hyb_ctx *c, const struct hyb_model *m)
{
	struct hyb_teal_stats st, in[HYB_TEAL_INPUTS] = { { 0 } };

	hyb_ctx_teal_stats(c, &st);
	if (!st.inputs)
		return;
	for (uint32_t l = 0; l < m->hp.n_layer; l++)
		for (uint32_t i = 0; i < HYB_TEAL_INPUTS; i++) {
			struct hyb_teal_stats one;

			if (hyb_ctx_teal_layer_stats(c, l, i, &one))
				return;
			in[i].inputs += one.inputs;
			in[i].active += one.active;
		}
	fprintf(stderr, "teal: decode skipped %.1f%% of projection inputs (", 100.0 *
		(double)(st.inputs - st.active) / (double)st.inputs);
	for (uint32_t i = 0; i < HYB_TEAL_INPUTS; i++)
		fprintf(stderr, "%s%s %.1f%%", i ? ", " : "", hyb_teal_input_name(i),
			in[i].inputs ? 100.0 * (double)(in[i].inputs - in[i].active) /
					       (double)in[i].inputs
				     : 0.0);
	fprintf(stderr, "), %.1f%% of their bytes\n",
		100.0 * (double)(st.dense_bytes - st.bytes) / (double)st.dense_bytes);
}

int32_t *cli_tokenize(const struct hyb_model *m, const char *text, int *n)
{
	size_t len = strlen(text);
	int cap = (int)len + 16, got;
	int32_t *ids;

	if (!m->tok)
		cli_die("the model has no usable tokenizer (tokenizer.ggml.* metadata)");
	ids = malloc(sizeof(*ids) * cap);
	if (!ids)
		cli_die("out of memory");
	got = hyb_tokenize(m->tok, text, len, true, ids, cap);
	if (got < 0)
		cli_die("cannot tokenize the prompt: %s", hyb_last_error());
	if (got > cap)
		cli_die("prompt tokenizes to more tokens than expected");
	*n = got;
	return ids;
}
