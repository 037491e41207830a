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
#include "hyb/threadpool.h"

static const char usage[] =
	"usage: hyb bench -m MODEL [-p PROMPT_TOKENS] [-n DECODE_TOKENS] [-r REPS] [-t THREADS]\n"
	"                 [--baseline SOURCE.gguf]\n"
	"  a plan model decodes densely and sparsely in every round; --baseline also\n"
	"  decodes the model the plan was made from (dense, its own layout) each round\n"
	"       hyb bench -m PLAN --gpu-budget BYTES|N% [--policies all|P,P,...] [--drift N]\n"
	"                 [--device cpu|cuda] [--pcie-gbps G] [--dense-cpu] [--prefill-cpu]\n"
	"                 [-n DECODE_TOKENS]\n"
	"                 [-r REPS]\n"
	"  hybrid: every policy on the drift workload (a forced topic change every N\n"
	"  tokens, default 32), against CPU-only sparse decoding, in the same rounds\n";

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	qsort(v, n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int32_t argmax(const float *v, uint32_t n)
{
	uint32_t best = 0;

	for (uint32_t i = 1; i < n; i++)
		if (v[i] > v[best])
			best = i;
	return (int32_t)best;
}

/* The weight type holding most of the matrix bytes: it sets the kernel peak. */
static uint32_t dominant_type(const struct hyb_model *m)
{
	uint64_t bytes[HYB_TYPE_COUNT] = { 0 };
	uint32_t best = 0;

	for (uint32_t l = 0; l < m->hp.n_layer; l++) {
		const struct hyb_layer *L = &m->layers[l];
		const struct hyb_weight *w[] = { &L->wq, &L->wk, &L->wv, &L->wo,
						 &L->gate, &L->up, &L->down, &L->down_t,
						 &L->plan.bundles };

		for (size_t i = 0; i < sizeof(w) / sizeof(w[0]); i++)
			bytes[w[i]->type] += w[i]->row_bytes * w[i]->ne1;
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
 * The GEMM ceiling for this weight type (hyb_roofline_gemm_macs) is measured
 * on the model's own largest matrix. Prefill is held against it as well as
 * against the instruction peak: the gap between the two is the kernel's, the
 * gap to prefill is the rest of the forward pass.
 */
/* The largest FFN matrix of layer 0: gate, or a plan's bundle tensor. */
static const struct hyb_weight *ffn_matrix(const struct hyb_model *m)
{
	return m->group_size ? &m->layers[0].plan.bundles : &m->layers[0].gate;
}

static void reset_peak_rss(void)
{
	FILE *f = fopen("/proc/self/clear_refs", "w");

	if (f) {
		fputs("5", f);
		fclose(f);
	}
}

int cmd_bench(int argc, char **argv)
{
	struct cli_opts o = { .n_gen_bench = 32, .reps = 3 };
	struct hyb_model *m;
	struct hyb_ctx *c, *cs = NULL, *cb = NULL;
	struct hyb_model *mb = NULL;
	struct hyb_sparse_stats sst = { 0 };
	char err[512];
	int n_prompt = 64, nth;

	cli_parse(argc, argv, &o, usage);
	if (o.gpu_budget)
		return cmd_bench_hybrid(&o);
	if (o.prompt)
		n_prompt = (int)cli_num("-p", o.prompt, 1, 65536);
	if (o.n_gen_bench < 1)
		cli_die("-n must be at least 1");
	m = cli_load_model(&o);
	o.n_ctx = (uint32_t)(n_prompt + o.n_gen_bench);
	if (m->group_size) {
		o.ffn = HYB_FFN_DENSE;
		c = cli_new_ctx(m, &o);
		o.ffn = HYB_FFN_SPARSE;
		cs = cli_new_ctx(m, &o);
		if (o.baseline) {
			struct cli_opts ob = o;

			ob.model = o.baseline;
			ob.manifest = NULL;
			ob.ffn = HYB_FFN_AUTO;
			mb = cli_load_model(&ob);
			if (mb->hp.n_vocab != m->hp.n_vocab || mb->hp.n_embd != m->hp.n_embd)
				cli_die("--baseline %s is not the model %s was made from", o.baseline,
					o.model);
			cb = cli_new_ctx(mb, &ob);
		}
	} else {
		c = cli_new_ctx(m, &o);
	}
	nth = o.n_threads > 0 ? o.n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
	if (touch_weights(m) == 0xdeadbeef)
		fputc(' ', stderr);

	uint32_t wtype = dominant_type(m);
	uint64_t wbytes = hyb_model_decode_bytes(m);
	uint64_t macs = hyb_model_macs_per_token(m);
	uint64_t kv_tok = 2ull * 2 * m->hp.n_layer * m->hp.n_head_kv * m->hp.head_dim;
	int32_t *toks = malloc(sizeof(int32_t) * (n_prompt + o.n_gen_bench));
	float *logits = malloc(sizeof(float) * m->hp.n_vocab);
	double *t_pre = calloc(o.reps, sizeof(double)), *t_dec = calloc(o.reps, sizeof(double));

	if (!toks || !logits || !t_pre || !t_dec)
		cli_die("out of memory");
	srand(1);
	for (int i = 0; i < n_prompt + o.n_gen_bench; i++)
		toks[i] = rand() % (int)m->hp.n_vocab;

	printf("model       %s: %u layers, embd %u, ffn %u, vocab %u, mostly %s, %.2f GB\n",
	       o.model, m->hp.n_layer, m->hp.n_embd, m->hp.n_ff, m->hp.n_vocab,
	       hyb_type_name(wtype), m->gguf->size / 1e9);
	printf("kernels     %s, %d threads\n", hyb_roofline_isa(), nth);

	double peak = hyb_roofline_peak_macs(wtype) * nth;
	/* Mean bytes per decode step: weights + the KV cache at its mean length. */
	double bytes_tok = (double)wbytes + kv_tok * (n_prompt + o.n_gen_bench / 2.0);
	double *bw = calloc(o.reps, sizeof(double)), *gp = calloc(o.reps, sizeof(double));
	double *r_pre = calloc(o.reps, sizeof(double)), *r_dec = calloc(o.reps, sizeof(double));
	double *t_sp = calloc(o.reps, sizeof(double)), *r_sp = calloc(o.reps, sizeof(double));
	double *t_base = calloc(o.reps, sizeof(double)), *r_base = calloc(o.reps, sizeof(double));
	uint64_t agree = 0, compared = 0;

	if (!bw || !gp || !r_pre || !r_dec || !t_sp || !r_sp || !t_base || !r_base)
		cli_die("out of memory");
	/*
	 * Each round measures the baselines right next to the figures they
	 * divide: on a shared machine the bandwidth a thread gets moves by 2x
	 * from one second to the next, so a ratio of two medians taken minutes
	 * apart says little. The ratios printed are medians of per-round ratios.
	 */
	for (int r = 0; r < o.reps; r++) {
		double t0;

		bw[r] = hyb_measure_read_bw(nth, (size_t)512 << 20, 3);
		/* the bandwidth buffer is gone: restart the peak-RSS count (VmHWM)
		 * so the memory line is about the model, not the measurement */
		reset_peak_rss();
		gp[r] = hyb_roofline_gemm_macs(ffn_matrix(m), nth, n_prompt, 3);
		if (gp[r] < 0)
			cli_die("out of memory");
		hyb_ctx_reset(c);
		t0 = hyb_now();
		if (hyb_ctx_eval(c, toks, (uint32_t)n_prompt, logits, false, err, sizeof(err)))
			cli_die("%s", err);
		t_pre[r] = hyb_now() - t0;
		/* decode the model's own greedy continuation (natural activations) */
		t0 = hyb_now();
		for (int i = 0; i < o.n_gen_bench; i++) {
			toks[n_prompt + i] = argmax(logits, m->hp.n_vocab);
			if (hyb_ctx_eval(c, &toks[n_prompt + i], 1, logits, false, err, sizeof(err)))
				cli_die("%s", err);
		}
		t_dec[r] = hyb_now() - t0;
		if (cs) {
			/* the same tokens, sparse: speed, and how often its greedy pick
			 * is the dense one */
			hyb_ctx_reset(cs);
			if (hyb_ctx_eval(cs, toks, (uint32_t)n_prompt, logits, false, err,
					 sizeof(err)))
				cli_die("%s", err);
			hyb_ctx_sparse_stats_reset(cs);
			t0 = hyb_now();
			for (int i = 0; i < o.n_gen_bench; i++) {
				agree += argmax(logits, m->hp.n_vocab) == toks[n_prompt + i];
				compared++;
				if (hyb_ctx_eval(cs, &toks[n_prompt + i], 1, logits, false, err,
						 sizeof(err)))
					cli_die("%s", err);
			}
			t_sp[r] = hyb_now() - t0;
			r_sp[r] = t_dec[r] / t_sp[r];
			struct hyb_sparse_stats one;

			hyb_ctx_sparse_stats(cs, &one);
			sst.layer_steps += one.layer_steps;
			sst.neurons += one.neurons;
			sst.predicted += one.predicted;
			sst.nonzero += one.nonzero;
			sst.predictor_s += one.predictor_s;
			sst.ffn_s += one.ffn_s;
		}
		if (cb) {
			/* the source model, dense in its own layout, on the same tokens */
			hyb_ctx_reset(cb);
			if (hyb_ctx_eval(cb, toks, (uint32_t)n_prompt, logits, false, err,
					 sizeof(err)))
				cli_die("%s", err);
			t0 = hyb_now();
			for (int i = 0; i < o.n_gen_bench; i++)
				if (hyb_ctx_eval(cb, &toks[n_prompt + i], 1, logits, false, err,
						 sizeof(err)))
					cli_die("%s", err);
			t_base[r] = hyb_now() - t0;
			r_base[r] = t_base[r] / t_sp[r];
		}
		r_pre[r] = n_prompt * (double)macs / t_pre[r] / gp[r];
		r_dec[r] = o.n_gen_bench * bytes_tok / t_dec[r] / bw[r];
	}

	double pre_tps = n_prompt / median(t_pre, o.reps);
	double dec_tps = o.n_gen_bench / median(t_dec, o.reps);
	double bw_med = median(bw, o.reps), gp_med = median(gp, o.reps);
	double pre_roof = peak / (double)macs;

	printf("DRAM read   %.2f GB/s (%d threads, 512 MiB streaming read; median of %d rounds)\n",
	       bw_med / 1e9, nth, o.reps);
	printf("MAC peak    %.1f GMAC/s (%s kernel instruction mix x %d threads)\n", peak / 1e9,
	       hyb_type_name(wtype), nth);
	printf("GEMM peak   %.1f GMAC/s (%s GEMM %llux%llu x %d columns, %d threads)\n",
	       gp_med / 1e9, hyb_type_name(ffn_matrix(m)->type),
	       (unsigned long long)ffn_matrix(m)->ne1, (unsigned long long)ffn_matrix(m)->ne0,
	       n_prompt, nth);
	printf("prefill     %8.2f tokens/s  (%d tokens)  %.1f GMAC/s  -> %.0f%% of GEMM peak "
	       "(per-round median), %.0f%% of instruction peak\n", pre_tps, n_prompt,
	       pre_tps * macs / 1e9, 100 * median(r_pre, o.reps), 100 * pre_tps / pre_roof);
	printf("decode      %8.2f tokens/s  (%d tokens)  %.2f GB/s  roofline %.2f tokens/s  "
	       "-> %.0f%% of DRAM bandwidth (per-round median)\n", dec_tps, o.n_gen_bench,
	       dec_tps * bytes_tok / 1e9, bw_med / bytes_tok, 100 * median(r_dec, o.reps));
	if (cs && sst.neurons) {
		const struct hyb_hparams *hp = &m->hp;
		const double fb = (double)m->layers[0].plan.bundles.row_bytes;
		double pred_bytes = 0, t_sp_sum = 0;

		for (uint32_t l = 0; l < hp->n_layer; l++) {
			const struct hyb_ffn_plan *P = &m->layers[l].plan;

			pred_bytes += P->fc1.row_bytes * P->fc1.ne1 + P->fc2.row_bytes * P->fc2.ne1;
		}
		for (int r = 0; r < o.reps; r++)
			t_sp_sum += t_sp[r];
		/* bytes a sparse step reads: everything but the FFN rows, the
		 * predictors, a gate row per predicted neuron and up + down rows per
		 * neuron that fired (a ReLU gate <= 0 skips both) */
		double per_step = (double)sst.neurons / hp->n_layer / (o.reps * o.n_gen_bench);
		double sp_bytes = bytes_tok - 3.0 * fb * hp->n_ff * hp->n_layer + pred_bytes +
				  fb * ((double)sst.predicted + 2.0 * sst.nonzero) / sst.neurons *
				  per_step * hp->n_layer;
		double sp_tps = o.n_gen_bench / median(t_sp, o.reps);

		printf("sparse      %8.2f tokens/s  (%d tokens)  %.2fx dense (per-round median); "
		       "%.1f%% of FFN neurons predicted, %.1f%% fired; predictors %.1f%% of "
		       "decode time; greedy token = dense on %.1f%%\n", sp_tps, o.n_gen_bench,
		       median(r_sp, o.reps), 100.0 * sst.predicted / sst.neurons,
		       100.0 * sst.nonzero / sst.neurons, 100 * sst.predictor_s / t_sp_sum,
		       100.0 * agree / compared);
		/* Amdahl in bytes: what sparsity can buy at most when the rest of
		 * the model (attention, head) is read densely */
		double ffn_bytes = 3.0 * fb * hp->n_ff * hp->n_layer;

		printf("sparse      %.1f MB/token read (predictors %.1f MB) -> roofline %.2f tokens/s, "
		       "%.0f%% of it\n", sp_bytes / 1e6, pred_bytes / 1e6, bw_med / sp_bytes,
		       100 * sp_tps * sp_bytes / bw_med);
		if (cb)
			printf("baseline    %8.2f tokens/s  dense decode of %s: sparse is %.2fx it "
			       "(per-round median)\n", o.n_gen_bench / median(t_base, o.reps),
			       o.baseline, median(r_base, o.reps));
		printf("sparse      bound from bytes: %.2fx dense at this sparsity, %.2fx with no FFN "
		       "at all (the FFN is %.0f%% of a dense token's bytes)\n", bytes_tok / sp_bytes,
		       bytes_tok / (bytes_tok - ffn_bytes), 100 * ffn_bytes / bytes_tok);
	}
	free(bw);
	free(gp);
	free(r_pre);
	free(r_dec);
	free(t_sp);
	free(r_sp);
	free(t_base);
	free(r_base);
	printf("bytes/token %.1f MB (weights %.1f MB + KV), %.2f GMAC/token\n", bytes_tok / 1e6,
	       wbytes / 1e6, macs / 1e9);

	long hwm = vm_kib("VmHWM");
	double budget = (double)m->gguf->size + hyb_ctx_kv_bytes(c);

	printf("memory      peak RSS %.1f MB; file %.1f MB + KV cache %.1f MB = %.1f MB "
	       "(RSS is %.1f%% of it)\n", hwm / 1024.0 * 1.024, m->gguf->size / 1e6,
	       hyb_ctx_kv_bytes(c) / 1e6, budget / 1e6, 100.0 * hwm * 1024 / budget);

	free(toks);
	free(logits);
	free(t_pre);
	free(t_dec);
	hyb_ctx_free(c);
	hyb_ctx_free(cs);
	hyb_ctx_free(cb);
	hyb_model_free(mb);
	hyb_model_free(m);
	return 0;
}
