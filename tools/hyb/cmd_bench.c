// SPDX-License-Identifier: MIT
/*
 * hyb bench: prefill and decode speed next to the limits this machine sets,
 * each measured in the same run:
 *   decode roofline  = DRAM read bandwidth / bytes read per token
 *                      (every weight once + the KV cache so far);
 *   prefill roofline = peak multiply-add rate of the weight type's kernel
 *                      instruction mix x threads / multiply-adds per token.
 * Medians over repetitions: these machines are shared and noisy.
 *
 * A plan model (hybctl plan) decodes twice per round, densely (every FFN
 * row) and sparsely (predicted-active neurons only), on two contexts of the
 * same file: the speedup is the per-round median of their ratio.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "hyb/generate.h"
#include "hyb/gguf.h"
#include "hyb/tensor_type.h"
#include "hyb/membw.h"
#include "hyb/roofline.h"
#include "hyb/sparsity.h"
#include "hyb/threadpool.h"

static const char usage[] =
	"usage: hyb bench -m MODEL [-p PROMPT_TOKENS] [-n DECODE_TOKENS] [-r REPS] [-t THREADS]\n"
	"                 [--baseline SOURCE.gguf]\n"
	"  a plan model decodes densely and sparsely in every round; --baseline also\n"
	"  decodes the model the plan was made from (dense, its own layout) each round;\n"
	"  --teal PROFILE [--sparsity S]: TEAL decoding against dense, every round;\n"
	"    with --parallel N, N sequences batched and one by one (docs/SERVE.md)\n"
	"       hyb bench -m PLAN --gpu-budget BYTES|N% [--policies all|P,P,...] [--drift N]\n"
	"                 [--device cpu|cuda] [--pcie-gbps G] [--dense-cpu]\n"
	"                 [--prefill-cpu | --prompt-batch N]\n"
	"                 [--routing P] (a MoE model: its expert cache against CPU-only)\n"
	"                 [--thresholds off|expected|paper] (dynamic also runs with them off)\n"
	"                 [-n DECODE_TOKENS]\n"
	"                 [-r REPS]\n"
	"       hyb bench -m PLAN --gpu-budget BYTES|N% --parallel N [--kv-seqs S]\n"
	"                 [-p PROMPT_TOKENS] [-n DECODE_TOKENS] [-r REPS] [--device cpu|cuda]\n"
	"  several sequences (docs/HYBRID.md): N decoded one after another, S batched with\n"
	"  their KV on the device, N batched with S there and N - S attending on the CPU\n"
	"  (APEX), N batched all on the device; alternating, medians; a plain model:\n"
	"  one by one and N batched (with --teal: also N dense and N batch-variant)\n"
	"  hybrid: every policy on the drift workload (a forced topic change every N\n"
	"  tokens, default 32), against CPU-only sparse decoding, in the same rounds\n";

/* The weight type holding most of the matrix bytes: it sets the kernel peak. */
static uint32_t dominant_type(const struct hyb_model *m)
{
	uint64_t bytes[HYB_TYPE_COUNT] = { 0 };
	uint32_t best = 0;

	for (uint32_t l = 0; l < m->hp.n_layer; l++) {
		const struct hyb_layer *L = &m->layers[l];
		const struct hyb_weight *w[] = { &L->wq,        &L->wk,        &L->wv,
						 &L->wo,        &L->gate,      &L->up,
						 &L->down,      &L->down_t,    &L->plan.bundles,
						 &L->gate_exps, &L->up_exps,   &L->down_exps };

		for (size_t i = 0; i < sizeof(w) / sizeof(w[0]); i++)
			bytes[w[i]->type] += w[i]->row_bytes * w[i]->ne1 *
					     (w[i]->ne2 ? w[i]->ne2 : 1);
	}
	for (uint32_t t = 0; t < HYB_TYPE_COUNT; t++)
		if (bytes[t] > bytes[best])
			best = t;
	return best;
}

/* Read every page of the mapping once so that page faults stay out of timings. */
static uint64_t touch_weights(const struct hyb_model *m)
{
	const volatile uint8_t *p = m->gguf->base;
	uint64_t sum = 0;

	for (uint64_t i = 0; i < m->gguf->size; i += 4096)
		sum += p[i];
	return sum;
}

static long vm_kib(const char *field)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long v = -1;
	size_t n = strlen(field);

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, field, n) && line[n] == ':')
			v = atol(line + n + 1);
	fclose(f);
	return v;
}

/*
 * The largest FFN matrix of layer 0 (gate, a plan's bundle tensor or the
 * first expert's gate): the GEMM ceiling (hyb_roofline_gemm_macs) is
 * measured on it. Prefill is held against that ceiling as well as against
 * the instruction peak: the gap between the two is the kernel's, the gap to
 * prefill is the rest of the forward pass.
 */
static struct hyb_weight ffn_matrix(const struct hyb_model *m)
{
	if (m->hp.n_expert) {
		const struct hyb_weight *g = &m->layers[m->hp.n_dense_lead].gate_exps;
		struct hyb_weight x = hyb_weight_expert(g, 0);
		uint64_t n;

		hyb_weight_rows(g, 0, 0, &n);
		x.ne1 = n; /* split across nodes (docs/NUMA.md): its first part's rows */
		return x;
	}
	return m->group_size ? m->layers[0].plan.bundles : m->layers[0].gate;
}

/* The columns an FFN matrix sees in a prompt of n tokens: an expert, its share of them. */
static int ffn_columns(const struct hyb_model *m, int n)
{
	const struct hyb_hparams *hp = &m->hp;
	int64_t c = hp->n_expert ? (int64_t)n * hp->n_expert_used / hp->n_expert : n;

	return c < 1 ? 1 : (int)c;
}

static void reset_peak_rss(void)
{
	FILE *f = fopen("/proc/self/clear_refs", "w");

	if (f) {
		fputs("5", f);
		fclose(f);
	}
}

/* One `hyb bench` run: its contexts, tokens and per-round figures. */
struct bench {
	struct cli_opts o;
	struct hyb_model *m, *mb;	/* mb: --baseline's source model */
	struct hyb_ctx *c, *cs, *cb;	/* dense; sparse (a plan); the baseline */
	struct hyb_ctx *ct;		/* --teal: TEAL decoding */
	struct hyb_teal_stats tst;	/* its decode steps, all rounds */
	struct hyb_teal_stats *tls;	/* ... per layer and input [n_layer][HYB_TEAL_INPUTS] */
	double *t_teal, *r_teal;
	uint64_t teal_agree;
	int n_prompt, nth;
	uint32_t wtype;
	uint64_t wbytes, macs;
	double peak, bytes_tok;		/* instruction peak; mean bytes per decode step */
	int32_t *toks;			/* the prompt, then the dense greedy continuation */
	float *logits;
	/* per round */
	double *t_pre, *t_dec, *bw, *gp, *r_pre, *r_dec, *t_sp, *r_sp, *t_base, *r_base;
	struct hyb_sparse_stats sst;	/* summed over the rounds */
	struct hyb_moe_stats moe;	/* decode steps of every round */
	uint64_t *moe_counts;		/* [n_layer][n_expert] choices in them */
	uint64_t agree, compared;
};

/* The model, and for a plan its sparse twin and the --baseline source model. */
static void bench_open(struct bench *b)
{
	struct cli_opts *o = &b->o;

	b->m = cli_load_model(o);
	o->n_ctx = (uint32_t)(b->n_prompt + o->n_gen_bench);
	if (o->teal) { /* dense, and TEAL on the same weights */
		struct cli_opts od = *o;

		od.teal = NULL;
		od.sparsity = -1;
		b->c = cli_new_ctx(b->m, &od);
		b->ct = cli_new_ctx(b->m, o);
		return;
	}
	if (!b->m->group_size && !(b->m->powerinfer && b->m->layers[0].fc1.data)) {
		b->c = cli_new_ctx(b->m, o);
		return;
	}
	o->ffn = HYB_FFN_DENSE;
	b->c = cli_new_ctx(b->m, o);
	o->ffn = HYB_FFN_SPARSE;
	b->cs = cli_new_ctx(b->m, o);
	if (o->baseline) {
		struct cli_opts ob = *o;

		ob.model = o->baseline;
		ob.manifest = NULL;
		ob.ffn = HYB_FFN_AUTO;
		b->mb = cli_load_model(&ob);
		if (b->mb->hp.n_vocab != b->m->hp.n_vocab || b->mb->hp.n_embd != b->m->hp.n_embd)
			cli_die("--baseline %s is not the model %s was made from", o->baseline,
				o->model);
		b->cb = cli_new_ctx(b->mb, &ob);
	}
}

static double *per_round(const struct bench *b)
{
	double *v = calloc(b->o.reps, sizeof(double));

	if (!v)
		cli_die("out of memory");
	return v;
}

static void eval(struct hyb_ctx *c, const int32_t *toks, uint32_t n, float *logits)
{
	if (hyb_ctx_eval(c, toks, n, logits, false))
		cli_die("%s", hyb_last_error());
}

/* The sparse context on the dense run's tokens: its time, and how often its greedy pick agrees. */
static void round_sparse(struct bench *b, int r)
{
	const int n_prompt = b->n_prompt, n_gen = b->o.n_gen_bench;
	struct hyb_sparse_stats one;
	double t0;

	hyb_ctx_reset(b->cs);
	eval(b->cs, b->toks, (uint32_t)n_prompt, b->logits);
	hyb_ctx_sparse_stats_reset(b->cs);
	t0 = hyb_now();
	for (int i = 0; i < n_gen; i++) {
		b->agree += cli_argmax(b->logits, b->m->hp.n_vocab) == b->toks[n_prompt + i];
		b->compared++;
		eval(b->cs, &b->toks[n_prompt + i], 1, b->logits);
	}
	b->t_sp[r] = hyb_now() - t0;
	b->r_sp[r] = b->t_dec[r] / b->t_sp[r];
	hyb_ctx_sparse_stats(b->cs, &one);
	b->sst.layer_steps += one.layer_steps;
	b->sst.neurons += one.neurons;
	b->sst.predicted += one.predicted;
	b->sst.nonzero += one.nonzero;
	b->sst.predictor_s += one.predictor_s;
	b->sst.ffn_s += one.ffn_s;
}

/* TEAL decoding of the dense run's tokens: its time, its reads, its greedy agreement. */
static void round_teal(struct bench *b, int r)
{
	const int n_prompt = b->n_prompt, n_gen = b->o.n_gen_bench;
	struct hyb_teal_stats one;
	double t0;

	hyb_ctx_reset(b->ct);
	eval(b->ct, b->toks, (uint32_t)n_prompt, b->logits);
	hyb_ctx_teal_stats_reset(b->ct);
	t0 = hyb_now();
	for (int i = 0; i < n_gen; i++) {
		b->teal_agree += cli_argmax(b->logits, b->m->hp.n_vocab) == b->toks[n_prompt + i];
		eval(b->ct, &b->toks[n_prompt + i], 1, b->logits);
	}
	b->t_teal[r] = hyb_now() - t0;
	b->r_teal[r] = b->t_dec[r] / b->t_teal[r];
	hyb_ctx_teal_stats(b->ct, &one);
	if (!b->tls && !(b->tls = calloc((size_t)b->m->hp.n_layer * HYB_TEAL_INPUTS,
					 sizeof(*b->tls))))
		cli_die("out of memory");
	for (uint32_t i = 0; i < b->m->hp.n_layer * HYB_TEAL_INPUTS; i++) {
		struct hyb_teal_stats ls;

		if (hyb_ctx_teal_layer_stats(b->ct, i / HYB_TEAL_INPUTS, i % HYB_TEAL_INPUTS, &ls))
			cli_die("%s", hyb_last_error());
		b->tls[i].inputs += ls.inputs;
		b->tls[i].active += ls.active;
	}
	b->tst.inputs += one.inputs;
	b->tst.active += one.active;
	b->tst.bytes += one.bytes;
	b->tst.dense_bytes += one.dense_bytes;
}

/* TEAL against dense decoding of the same weights, and against the bytes it reads. */
static void print_teal(const struct bench *b)
{
	const int reps = b->o.reps, n_gen = b->o.n_gen_bench, steps = reps * n_gen;
	const struct hyb_teal_stats *st = &b->tst;
	const double bw_med = cli_median(b->bw, reps);
	double t[64];
	/* a step reads what dense reads, less the rows of inputs under their thresholds */
	const double saved = (double)(st->dense_bytes - st->bytes) / steps;
	const double tb = b->bytes_tok - saved;
	double tps;

	for (int r = 0; r < reps && r < 64; r++)
		t[r] = b->t_teal[r];
	tps = n_gen / cli_median(t, reps < 64 ? reps : 64);
	for (int r = 0; r < reps && r < 64; r++)
		t[r] = b->r_teal[r];
	printf("teal        %8.2f tokens/s  (%d tokens)  %.2fx dense (per-round median); "
	       "%.1f%% of projection inputs skipped, %.1f%% of their bytes; greedy token = "
	       "dense on %.1f%%\n", tps, n_gen, cli_median(t, reps < 64 ? reps : 64),
	       100.0 * (1.0 - (double)st->active / (double)st->inputs),
	       100.0 * (double)(st->dense_bytes - st->bytes) / (double)st->dense_bytes,
	       100.0 * b->teal_agree / steps);
	/* the sparsity each layer's inputs reached, as the calibration set it */
	printf("teal        skipped per layer (%s/%s/%s/%s, %%):", hyb_teal_input_name(0),
	       hyb_teal_input_name(1), hyb_teal_input_name(2), hyb_teal_input_name(3));
	for (uint32_t l = 0; b->tls && l < b->m->hp.n_layer; l++) {
		printf("%s %u", l % 8 ? "," : "\nteal         ", l);
		for (uint32_t i = 0; i < HYB_TEAL_INPUTS; i++) {
			const struct hyb_teal_stats *ls = &b->tls[l * HYB_TEAL_INPUTS + i];

			printf("%s%.0f", i ? "/" : " ", ls->inputs ? 100.0 * (double)(ls->inputs -
							ls->active) / (double)ls->inputs : 0.0);
		}
	}
	printf("\n");
	printf("teal        %.1f MB/token read -> roofline %.2f tokens/s, %.0f%% of it; bound "
	       "from bytes: %.2fx dense (the projections are %.0f%% of a dense token's "
	       "bytes)\n", tb / 1e6, bw_med / tb, 100 * tps * tb / bw_med, b->bytes_tok / tb,
	       100.0 * st->dense_bytes / steps / b->bytes_tok);
}

/* The source model, dense in its own layout, on the same tokens. */
static void round_baseline(struct bench *b, int r)
{
	double t0;

	hyb_ctx_reset(b->cb);
	eval(b->cb, b->toks, (uint32_t)b->n_prompt, b->logits);
	t0 = hyb_now();
	for (int i = 0; i < b->o.n_gen_bench; i++)
		eval(b->cb, &b->toks[b->n_prompt + i], 1, b->logits);
	b->t_base[r] = hyb_now() - t0;
	b->r_base[r] = b->t_base[r] / b->t_sp[r];
}

/* A round's decode-step MoE statistics, added to the others'. */
static void add_moe(struct bench *b)
{
	const struct hyb_hparams *hp = &b->m->hp;
	struct hyb_moe_stats st;

	hyb_ctx_moe_stats(b->c, &st);
	b->moe.layer_steps += st.layer_steps;
	b->moe.expert_runs += st.expert_runs;
	b->moe.expert_bytes += st.expert_bytes;
	b->moe.router_s += st.router_s;
	b->moe.experts_s += st.experts_s;
	b->moe.shared_s += st.shared_s;
	if (!b->moe_counts && !(b->moe_counts = calloc((size_t)hp->n_layer * hp->n_expert,
						       sizeof(uint64_t))))
		cli_die("out of memory");
	for (uint32_t l = 0; l < hp->n_layer; l++) {
		const uint64_t *c = hyb_ctx_moe_counts(b->c, l);

		for (uint32_t e = 0; e < hp->n_expert; e++)
			b->moe_counts[(size_t)l * hp->n_expert + e] += c[e];
	}
}

/*
 * Where a MoE decode step's time goes, and the routed experts held to the
 * bytes they read: at a token per step every chosen expert is one GEMV pass
 * over its three matrices, so their roofline is DRAM bandwidth.
 */
static void print_moe(const struct bench *b)
{
	const struct hyb_hparams *hp = &b->m->hp;
	const struct hyb_moe_stats *st = &b->moe;
	double t_dec = 0, bw = cli_median(b->bw, b->o.reps);

	for (int r = 0; r < b->o.reps; r++)
		t_dec += b->t_dec[r];
	printf("experts     %u of %u per token, %u of %u layers; decode: %.2f experts run per "
	       "layer step\n", hp->n_expert_used, hp->n_expert, hp->n_layer - hp->n_dense_lead,
	       hp->n_layer,
	       (double)st->expert_runs / (double)st->layer_steps);
	printf("experts     decode time: routed experts %.0f%%, routers %.1f%%, shared experts "
	       "%.1f%%, the rest %.0f%%\n", 100 * st->experts_s / t_dec,
	       100 * st->router_s / t_dec, 100 * st->shared_s / t_dec,
	       100 * (t_dec - st->experts_s - st->router_s - st->shared_s) / t_dec);
	printf("experts     routed experts read at %.2f GB/s: %.0f%% of DRAM bandwidth (their "
	       "bytes-bound roofline)\n", st->expert_bytes / st->experts_s / 1e9,
	       100 * st->expert_bytes / st->experts_s / bw);
	printf("experts     load per layer (most chosen expert's share of choices / uniform "
	       "share):");
	for (uint32_t l = hp->n_dense_lead; l < hp->n_layer; l++) {
		const uint64_t *c = b->moe_counts + (size_t)l * hp->n_expert;
		uint64_t top = 0, sum = 0;

		for (uint32_t e = 0; e < hp->n_expert; e++) {
			top = c[e] > top ? c[e] : top;
			sum += c[e];
		}
		printf(" %.1fx", sum ? (double)top * hp->n_expert / (double)sum : 0.0);
	}
	printf("\n");
}

/*
 * One round: the baselines right next to the figures they divide. On a
 * shared machine the bandwidth a thread gets moves by 2x from one second to
 * the next, so a ratio of two medians taken minutes apart says little: the
 * ratios printed are medians of per-round ratios.
 */
static void bench_round(struct bench *b, int r)
{
	const int n_prompt = b->n_prompt;
	double t0;

	b->bw[r] = hyb_measure_read_bw(b->nth, (size_t)512 << 20, 3);
	/* the bandwidth buffer is gone: restart the peak-RSS count (VmHWM)
	 * so the memory line is about the model, not the measurement */
	reset_peak_rss();
	const struct hyb_weight fw = ffn_matrix(b->m);

	b->gp[r] = hyb_roofline_gemm_macs(&fw, b->nth, ffn_columns(b->m, n_prompt), 3);
	if (b->gp[r] < 0)
		cli_die("out of memory");
	hyb_ctx_reset(b->c);
	t0 = hyb_now();
	eval(b->c, b->toks, (uint32_t)n_prompt, b->logits);
	b->t_pre[r] = hyb_now() - t0;
	/* decode the model's own greedy continuation (natural activations) */
	hyb_ctx_moe_stats_reset(b->c);
	t0 = hyb_now();
	for (int i = 0; i < b->o.n_gen_bench; i++) {
		b->toks[n_prompt + i] = cli_argmax(b->logits, b->m->hp.n_vocab);
		eval(b->c, &b->toks[n_prompt + i], 1, b->logits);
	}
	b->t_dec[r] = hyb_now() - t0;
	if (b->m->hp.n_expert)
		add_moe(b);
	if (b->cs)
		round_sparse(b, r);
	if (b->cb)
		round_baseline(b, r);
	if (b->ct)
		round_teal(b, r);
	b->r_pre[r] = n_prompt * (double)b->macs / b->t_pre[r] / b->gp[r];
	b->r_dec[r] = b->o.n_gen_bench * b->bytes_tok / b->t_dec[r] / b->bw[r];
}

/*
 * --defer N: the same prompt decoded greedily with and without expert
 * deferral, alternating, on contexts of their own: tokens/s of each and how
 * many greedy tokens agree. On the CPU alone nothing runs beside the deferred
 * experts, so the time is the same work moved; the gain is a device's.
 */
static void print_defer(struct bench *b)
{
	const struct hyb_hparams *hp = &b->m->hp;
	struct cli_opts o = b->o;
	const int n = b->o.n_gen_bench, np = b->n_prompt;
	int32_t *tk[2];
	double t[2][16] = { { 0 } };
	int same = 0, reps = b->o.reps < 16 ? b->o.reps : 16;

	tk[0] = malloc(sizeof(int32_t) * n);
	tk[1] = malloc(sizeof(int32_t) * n);
	if (!tk[0] || !tk[1])
		cli_die("out of memory");
	for (int r = 0; r < reps; r++)
		for (int k = 0; k < 2; k++) {
			struct hyb_ctx *c;
			double t0;

			o.moe_defer = k ? b->o.moe_defer : 0;
			c = cli_new_ctx(b->m, &o);
			eval(c, b->toks, (uint32_t)np, b->logits);
			t0 = hyb_now();
			for (int i = 0; i < n; i++) {
				tk[k][i] = cli_argmax(b->logits, hp->n_vocab);
				eval(c, &tk[k][i], 1, b->logits);
			}
			t[k][r] = hyb_now() - t0;
			hyb_ctx_free(c);
		}
	for (int i = 0; i < n; i++)
		same += tk[0][i] == tk[1][i];
	printf("deferral    %u of %u experts a layer later: decode %.2f tokens/s, without %.2f "
	       "(%.2fx; the CPU alone overlaps nothing); greedy tokens as without: %d/%d\n",
	       b->o.moe_defer, hp->n_expert_used, n / cli_median(t[1], reps),
	       n / cli_median(t[0], reps), cli_median(t[0], reps) / cli_median(t[1], reps), same, n);
	free(tk[0]);
	free(tk[1]);
}

static void print_dense(struct bench *b)
{
	const int reps = b->o.reps, n_prompt = b->n_prompt;
	double pre_tps = n_prompt / cli_median(b->t_pre, reps);
	double dec_tps = b->o.n_gen_bench / cli_median(b->t_dec, reps);
	double bw_med = cli_median(b->bw, reps), gp_med = cli_median(b->gp, reps);
	double pre_roof = b->peak / (double)b->macs;
	const struct hyb_weight fw = ffn_matrix(b->m), *w = &fw;

	printf("DRAM read   %.2f GB/s (%d threads, 512 MiB streaming read; median of %d rounds)\n",
	       bw_med / 1e9, b->nth, reps);
	printf("MAC peak    %.1f GMAC/s (%s kernel instruction mix x %d threads)\n",
	       b->peak / 1e9, hyb_type_name(b->wtype), b->nth);
	printf("GEMM peak   %.1f GMAC/s (%s GEMM %llux%llu x %d columns, %d threads)\n",
	       gp_med / 1e9, hyb_type_name(w->type), (unsigned long long)w->ne1,
	       (unsigned long long)w->ne0, ffn_columns(b->m, n_prompt), b->nth);
	printf("prefill     %8.2f tokens/s  (%d tokens)  %.1f GMAC/s  -> %.0f%% of GEMM peak "
	       "(per-round median), %.0f%% of instruction peak\n", pre_tps, n_prompt,
	       pre_tps * b->macs / 1e9, 100 * cli_median(b->r_pre, reps), 100 * pre_tps / pre_roof);
	printf("decode      %8.2f tokens/s  (%d tokens)  %.2f GB/s  roofline %.2f tokens/s  "
	       "-> %.0f%% of DRAM bandwidth (per-round median)\n", dec_tps, b->o.n_gen_bench,
	       dec_tps * b->bytes_tok / 1e9, bw_med / b->bytes_tok, 100 * cli_median(b->r_dec, reps));
}

/* Sparse decoding against dense, and against the bytes it must read. */
static void print_sparse(struct bench *b)
{
	const struct hyb_model *m = b->m;
	const struct hyb_hparams *hp = &m->hp;
	const struct hyb_sparse_stats *sst = &b->sst;
	const int reps = b->o.reps, n_gen = b->o.n_gen_bench;
	/* a plan's bundle rows, or a PowerInfer file's own rows and predictors */
	const double fb = (double)(m->group_size ? m->layers[0].plan.bundles.row_bytes
						 : m->layers[0].down_t.row_bytes);
	const double bytes_tok = b->bytes_tok, bw_med = cli_median(b->bw, reps);
	double pred_bytes = 0, t_sp_sum = 0;

	/* CATS computes every gate instead of predicting (docs/SPARSITY.md): no predictor bytes */
	for (uint32_t l = 0; l < hp->n_layer && !hyb_ctx_ffn_thresholds(b->cs); l++) {
		const struct hyb_layer *L = &m->layers[l];
		const struct hyb_weight *f1 = m->group_size ? &L->plan.fc1 : &L->fc1;
		const struct hyb_weight *f2 = m->group_size ? &L->plan.fc2 : &L->fc2;

		pred_bytes += f1->row_bytes * f1->ne1 + f2->row_bytes * f2->ne1;
	}
	for (int r = 0; r < reps; r++)
		t_sp_sum += b->t_sp[r];
	/* bytes a sparse step reads: everything but the FFN rows, the
	 * predictors, a gate row per predicted neuron and up + down rows per
	 * neuron that fired (a ReLU gate <= 0 skips both) */
	double per_step = (double)sst->neurons / hp->n_layer / (reps * n_gen);
	double sp_bytes = bytes_tok - 3.0 * fb * hp->n_ff * hp->n_layer + pred_bytes +
			  fb * ((double)sst->predicted + 2.0 * sst->nonzero) / sst->neurons *
			  per_step * hp->n_layer;
	double sp_tps = n_gen / cli_median(b->t_sp, reps);

	printf("sparse      %8.2f tokens/s  (%d tokens)  %.2fx dense (per-round median); "
	       "%.1f%% of FFN neurons predicted, %.1f%% fired; predictors %.1f%% of "
	       "decode time; greedy token = dense on %.1f%%\n", sp_tps, n_gen,
	       cli_median(b->r_sp, reps), 100.0 * sst->predicted / sst->neurons,
	       100.0 * sst->nonzero / sst->neurons, 100 * sst->predictor_s / t_sp_sum,
	       100.0 * b->agree / b->compared);
	/* Amdahl in bytes: what sparsity can buy at most when the rest of
	 * the model (attention, head) is read densely */
	double ffn_bytes = 3.0 * fb * hp->n_ff * hp->n_layer;

	printf("sparse      %.1f MB/token read (predictors %.1f MB) -> roofline %.2f tokens/s, "
	       "%.0f%% of it\n", sp_bytes / 1e6, pred_bytes / 1e6, bw_med / sp_bytes,
	       100 * sp_tps * sp_bytes / bw_med);
	/* the last round's, per layer: the predictors' precision (fired of predicted) */
	printf("sparse      per layer, %% predicted / %% fired:");
	for (uint32_t l = 0; l < hp->n_layer; l++) {
		struct hyb_sparse_stats ls;

		hyb_ctx_sparse_layer_stats(b->cs, l, &ls);
		if (ls.neurons)
			printf(" %u:%.1f/%.1f", l, 100.0 * ls.predicted / ls.neurons,
			       100.0 * ls.nonzero / ls.neurons);
	}
	printf("\n");
	if (b->cb)
		printf("baseline    %8.2f tokens/s  dense decode of %s: sparse is %.2fx it "
		       "(per-round median)\n", n_gen / cli_median(b->t_base, reps), b->o.baseline,
		       cli_median(b->r_base, reps));
	printf("sparse      bound from bytes: %.2fx dense at this sparsity, %.2fx with no FFN "
	       "at all (the FFN is %.0f%% of a dense token's bytes)\n", bytes_tok / sp_bytes,
	       bytes_tok / (bytes_tok - ffn_bytes), 100 * ffn_bytes / bytes_tok);
}

static void print_memory(const struct bench *b)
{
	long hwm = vm_kib("VmHWM");
	double kv = (double)hyb_ctx_kv_bytes(b->c);
	double budget = (double)b->m->gguf->size + kv;

	printf("bytes/token %.1f MB (weights %.1f MB + KV), %.2f GMAC/token\n",
	       b->bytes_tok / 1e6, b->wbytes / 1e6, b->macs / 1e9);
	printf("memory      peak RSS %.1f MB; file %.1f MB + KV cache %.1f MB = %.1f MB "
	       "(RSS is %.1f%% of it)\n", hwm / 1024.0 * 1.024, b->m->gguf->size / 1e6,
	       kv / 1e6, budget / 1e6, 100.0 * hwm * 1024 / budget);
}

static void bench_free(struct bench *b)
{
	double *v[] = { b->t_pre, b->t_dec, b->bw, b->gp, b->r_pre, b->r_dec, b->t_sp, b->r_sp,
			b->t_base, b->r_base, b->t_teal, b->r_teal };

	for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++)
		free(v[i]);
	free(b->toks);
	free(b->logits);
	free(b->moe_counts);
	free(b->tls);
	hyb_ctx_free(b->c);
	hyb_ctx_free(b->cs);
	hyb_ctx_free(b->cb);
	hyb_ctx_free(b->ct);
	hyb_model_free(b->mb);
	hyb_model_free(b->m);
}

int cmd_bench(int argc, char **argv)
{
	struct bench b = { .o = { .n_gen_bench = 32, .reps = 3 }, .n_prompt = 64 };
	const struct hyb_hparams *hp;
	uint64_t kv_tok;

	cli_parse(argc, argv, &b.o, usage);
	if ((b.o.gpu_budget || (b.o.teal && !b.o.hy.kv_seqs)) && b.o.parallel > 1)
		return cmd_bench_seqs(&b.o);
	if (b.o.parallel > 1 || b.o.hy.kv_seqs)
		cli_die("--parallel and --kv-seqs measure batches of hybrid decoding (with "
			"--gpu-budget) or of TEAL (--parallel with --teal): 2 or more");
	if (b.o.gpu_budget)
		return cmd_bench_hybrid(&b.o);
	if (b.o.prompt)
		b.n_prompt = (int)cli_num("-p", b.o.prompt, 1, 65536);
	if (b.o.n_gen_bench < 1)
		cli_die("-n must be at least 1");
	bench_open(&b);
	hp = &b.m->hp;
	b.nth = b.o.n_threads > 0 ? b.o.n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
	if (touch_weights(b.m) == 0xdeadbeef)
		fputc(' ', stderr);
	b.wtype = dominant_type(b.m);
	b.wbytes = hyb_model_decode_bytes(b.m);
	b.macs = hyb_model_macs_per_token(b.m);
	kv_tok = 2ull * 2 * hp->n_layer * hp->n_head_kv * hp->head_dim;
	b.toks = malloc(sizeof(int32_t) * (b.n_prompt + b.o.n_gen_bench));
	b.logits = malloc(sizeof(float) * hp->n_vocab);
	if (!b.toks || !b.logits)
		cli_die("out of memory");
	srand(1);
	for (int i = 0; i < b.n_prompt + b.o.n_gen_bench; i++)
		b.toks[i] = rand() % (int)hp->n_vocab;

	printf("model       %s: %u layers, embd %u, ffn %u, vocab %u, mostly %s, %.2f GB\n",
	       b.o.model, hp->n_layer, hp->n_embd, hp->n_ff, hp->n_vocab,
	       hyb_type_name(b.wtype), b.m->gguf->size / 1e9);
	printf("kernels     %s, %d threads\n", hyb_roofline_isa(), b.nth);
	b.peak = hyb_roofline_peak_macs(b.wtype) * b.nth;
	/* Mean bytes per decode step: weights + the KV cache at its mean length. */
	b.bytes_tok = (double)b.wbytes + kv_tok * (b.n_prompt + b.o.n_gen_bench / 2.0);
	b.t_pre = per_round(&b), b.t_dec = per_round(&b), b.bw = per_round(&b);
	b.gp = per_round(&b), b.r_pre = per_round(&b), b.r_dec = per_round(&b);
	b.t_sp = per_round(&b), b.r_sp = per_round(&b), b.t_base = per_round(&b);
	b.r_base = per_round(&b);
	b.t_teal = per_round(&b), b.r_teal = per_round(&b);

	for (int r = 0; r < b.o.reps; r++)
		bench_round(&b, r);
	print_dense(&b);
	if (b.m->hp.n_expert)
		print_moe(&b);
	if (b.m->hp.n_expert && b.o.moe_defer)
		print_defer(&b);
	if (b.cs && b.sst.neurons)
		print_sparse(&b);
	if (b.ct && b.tst.inputs)
		print_teal(&b);
	print_memory(&b);
	bench_free(&b);
	return 0;
}
