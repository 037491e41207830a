// SPDX-License-Identifier: MIT
/*
 * hyb bench -m PLAN --gpu-budget B --parallel N [--kv-seqs S]: several
 * sequences through hybrid decoding (docs/HYBRID.md "Several sequences"),
 * four ways on the same budget, alternating within each round, medians of
 * decode throughput (all sequences' tokens / the context's clock); a
 * mixture of experts' expert cache (docs/MOE.md) runs the first and last,
 * its batch attending on the CPU:
 *   one by one   N sequences decoded one after another (one sequence's
 *                hybrid decoding, what a server without batching does);
 *   batch S      S sequences batched, their KV on the device (the largest
 *                batch device-only batching holds when S KV caches fit);
 *   APEX N       N batched, S attending on the device, N - S on the CPU
 *                over the KV cache in DRAM;
 *   device N     N batched, every KV cache on the device (its budget taken
 *                from the neuron cache).
 * A plain model's whole FFNs (plain_hybrid.h) run one by one and batch N;
 * with --teal, whose thresholds the CPU's share takes: one by one, TEAL N
 * (decode rows with TEAL's one-token sums), TEAL N, var (batch_variant: the
 * dense GEMM of the masked inputs) and dense N (no thresholds), the baseline.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "hyb/hybrid.h"

enum { ONE, BATCH_S, APEX, DEV_N, N_WAYS };

static const char *const way_name[N_WAYS] = { "one by one", "batch S", "APEX N", "device N" };

struct sbench {
	const struct cli_opts *o;
	struct hyb_model *m;
	struct hyb_ctx *c[N_WAYS];
	uint32_t n, s, n_prompt, n_gen;
	int32_t *prompts;          /* [n][n_prompt] */
	float *logits;             /* [n][V] */
	double *tps[N_WAYS];       /* per round */
	struct hyb_hybrid_stats st[N_WAYS];
	bool moe;                  /* a mixture's expert cache: one by one and batch N only */
	bool teal;                 /* a plain model with --teal: + the dense batch N */
};

static const char *way(const struct sbench *b, int w)
{
	static const char *const teal_name[N_WAYS] = { "one by one", "TEAL N, var", "dense N",
						       "TEAL N" };

	return b->teal ? teal_name[w] : b->moe && w == DEV_N ? "batch N" : way_name[w];
}

/*
 * teal: --teal's thresholds on the CPU's share (a plain model's; plain_hybrid.h);
 * variant: hyb_ctx_params.batch_variant
 */
static struct hyb_ctx *new_ctx(struct sbench *b, uint32_t n_seq, uint32_t kv_seqs, bool teal,
			       bool variant)
{
	struct hyb_hybrid_params hy = b->o->hy;
	const uint32_t n_pos = b->n_prompt + b->n_gen;
	struct hyb_ctx_params p = { .n_ctx = n_pos, .n_threads = b->o->n_threads,
				    .ffn = b->moe ? HYB_FFN_AUTO : HYB_FFN_SPARSE,
				    .numa_no_pin = b->o->numa_no_pin, .hybrid = &hy,
				    .batch_variant = variant };
	struct hyb_ctx *c;

	hy.gpu_budget = cli_gpu_budget(b->o->gpu_budget, b->m);
	hy.kv_seqs = kv_seqs;
	if (n_seq > 1) {
		p.n_seq = n_seq;
		p.kv_size = n_seq * ((n_pos + 15) / 16 * 16); /* whole KV blocks each */
	}
	c = hyb_ctx_new(b->m, &p);
	if (!c)
		cli_die("%s", hyb_last_error());
	if (teal)
		cli_apply_teal(c, b->m, b->o);
	return c;
}

/* Sequence i's prompt: its own ids. */
static void make_prompts(struct sbench *b)
{
	const uint32_t V = b->m->hp.n_vocab;

	b->prompts = malloc(sizeof(int32_t) * b->n * b->n_prompt);
	b->logits = malloc(sizeof(float) * V * b->n);
	if (!b->prompts || !b->logits)
		cli_die("out of memory");
	for (uint32_t i = 0; i < b->n; i++)
		for (uint32_t t = 0; t < b->n_prompt; t++)
			b->prompts[i * b->n_prompt + t] =
				(int32_t)(3 + (t * 2654435761u + i * 40503u + 17) % (V - 3));
}

/* One by one in c: decode seconds of all n sequences (the prompts not timed). */
static double run_one(struct sbench *b, struct hyb_ctx *c)
{
	double t = 0;

	for (uint32_t i = 0; i < b->n; i++) {
		hyb_ctx_reset(c);
		if (hyb_ctx_eval(c, b->prompts + i * b->n_prompt, b->n_prompt, b->logits, false))
			cli_die("%s", hyb_last_error());
		const double t0 = hyb_ctx_clock(c);

		for (uint32_t g = 0; g < b->n_gen; g++) {
			int32_t tok = cli_argmax(b->logits, b->m->hp.n_vocab);

			if (hyb_ctx_eval(c, &tok, 1, b->logits, false))
				cli_die("%s", hyb_last_error());
		}
		t += hyb_ctx_clock(c) - t0;
	}
	return t;
}

/* k sequences batched in c: decode seconds of their n_gen steps together. */
static double run_batch(struct sbench *b, struct hyb_ctx *c, uint32_t k)
{
	const uint32_t V = b->m->hp.n_vocab;
	struct hyb_seq_tokens *bt = malloc(sizeof(*bt) * k);
	int32_t *next = malloc(sizeof(int32_t) * k);
	int *seq = malloc(sizeof(int) * k);
	double t0, t;

	if (!bt || !next || !seq)
		cli_die("out of memory");
	for (uint32_t i = 0; i < k; i++) {
		seq[i] = hyb_ctx_seq_open(c, b->n_prompt + b->n_gen);
		if (seq[i] < 0)
			cli_die("%s", hyb_last_error());
		bt[i] = (struct hyb_seq_tokens){ seq[i], b->prompts + i * b->n_prompt, b->n_prompt };
	}
	if (hyb_ctx_eval_seqs(c, bt, k, b->logits))
		cli_die("%s", hyb_last_error());
	t0 = hyb_ctx_clock(c);
	for (uint32_t g = 0; g < b->n_gen; g++) {
		for (uint32_t i = 0; i < k; i++) {
			next[i] = cli_argmax(b->logits + (size_t)i * V, V);
			bt[i] = (struct hyb_seq_tokens){ seq[i], &next[i], 1 };
		}
		if (hyb_ctx_eval_seqs(c, bt, k, b->logits))
			cli_die("%s", hyb_last_error());
	}
	t = hyb_ctx_clock(c) - t0;
	for (uint32_t i = 0; i < k; i++)
		hyb_ctx_seq_close(c, seq[i]);
	free(bt);
	free(next);
	free(seq);
	return t;
}

static void add_stats(struct hyb_hybrid_stats *a, const struct hyb_hybrid_stats *s)
{
	a->seq_passes += s->seq_passes;
	a->seq_rows += s->seq_rows;
	a->attn_rows_dev += s->attn_rows_dev;
	a->attn_rows_cpu += s->attn_rows_cpu;
	a->cpu_attn_s += s->cpu_attn_s;
	a->seq_neurons_dev += s->seq_neurons_dev;
	a->seq_neurons_cpu += s->seq_neurons_cpu;
	a->seq_linear_s += s->seq_linear_s;
	a->seq_dev_attn_s += s->seq_dev_attn_s;
	a->seq_layers += s->seq_layers;
	a->seq_groups_cpu += s->seq_groups_cpu;
	a->seq_groups_all += s->seq_groups_all;
	a->tokens += s->tokens;
	a->active += s->active;
	a->active_dev += s->active_dev;
}

static void place_line(const struct sbench *b, int w)
{
	struct hyb_hybrid_offload pl;

	hyb_ctx_hybrid_offload(b->c[w], &pl);
	if (pl.plain) {
		printf("  %-10s  %u/%u attention blocks and %u FFNs on the device (%.1f MB)\n",
		       way(b, w), pl.attn_layers, b->m->hp.n_layer, pl.ffn_layers,
		       (pl.dense_bytes + pl.ffn_bytes) / 1e6);
		return;
	}
	printf("  %-10s  %u/%u attention blocks on the device, KV of %u sequence%s there, "
	       "neuron cache %.1f MB, pass rows %.1f MB\n", way_name[w], pl.attn_layers,
	       b->m->hp.n_layer, w == ONE ? 1 : pl.kv_seqs, w == ONE || pl.kv_seqs != 1 ? "s" : "",
	       pl.cache_bytes / 1e6, pl.seq_bytes / 1e6);
}

/*
 * APEX's analytical model (section 3.2) from what the APEX N passes measured
 * (the device's clock for its parts, the host's for the CPU's attention):
 * per placed layer T_glinear (q/k/v, wo, the cached FFN groups) and T_gatt
 * (attention of the device's sequences); N_G and N_C, attention rows a
 * second on each side. Inequality (6): Asymmetric Pipelining (NEO's two
 * sub-batches) beats overlapping the CPU's attention with one unified batch
 * only when N_G / N_C < 2 T_glinear / T_gatt + 3 + T_gatt / T_glinear.
 */
static void apex_profile(const struct sbench *b)
{
	const struct hyb_hybrid_stats *st = &b->st[APEX];
	double tl, ta, ng, nc, rhs;

	if (!st->seq_layers || st->seq_dev_attn_s <= 0 || st->cpu_attn_s <= 0 ||
	    st->seq_linear_s <= 0) {
		printf("APEX model: no layer attended on both sides\n");
		return;
	}
	tl = st->seq_linear_s / st->seq_layers;
	ta = st->seq_dev_attn_s / st->seq_layers;
	ng = st->attn_rows_dev / st->seq_dev_attn_s;
	nc = st->attn_rows_cpu / st->cpu_attn_s;
	rhs = 2 * tl / ta + 3 + ta / tl;
	printf("APEX model (APEX N, per placed layer and pass): T_glinear %.1f us, T_gatt %.1f us, "
	       "N_G %.0f rows/ms, N_C %.0f rows/ms; N_G/N_C %.1f %s %.1f: asymmetric pipelining "
	       "%s (inequality 6)\n", 1e6 * tl, 1e6 * ta, ng / 1e3, nc / 1e3, ng / nc,
	       ng / nc < rhs ? "<" : ">=", rhs, ng / nc < rhs ? "would pay" : "would not pay");
}

/*
 * hyb bench -m MODEL --teal PROFILE --parallel N: TEAL's decode steps of N
 * sequences (docs/SERVE.md#teal), five ways alternating within each round:
 * one after another, dense and TEAL (what engines of their own do, one
 * sequence's steps each); N batched dense; N batched with TEAL, its steps
 * TEAL's GEMV as alone (batch-invariant); and with batch_variant, the dense
 * GEMM of the masked inputs.
 */
enum { T_ONE_DENSE, T_ONE, T_DENSE, T_ROWS, T_VARIANT, T_WAYS };

static const char *const teal_way[T_WAYS] = {
	"dense, one by one", "TEAL, one by one", "dense, batch N", "TEAL, batch N",
	"TEAL, batch N, variant",
};

static int teal_seqs(struct sbench *b, int reps)
{
	struct cli_opts od = *b->o, ov = *b->o;
	struct hyb_ctx *c[T_WAYS];
	struct hyb_teal_stats st;
	double *tps[T_WAYS];

	od.teal = NULL;
	od.sparsity = -1;
	od.n_ctx = ov.n_ctx = b->n_prompt + b->n_gen;
	c[T_ONE_DENSE] = cli_new_ctx(b->m, &od);
	c[T_ONE] = cli_new_ctx(b->m, &ov);
	c[T_DENSE] = cli_new_ctx_seqs(b->m, &od, b->n, false);
	c[T_ROWS] = cli_new_ctx_seqs(b->m, &ov, b->n, false);
	c[T_VARIANT] = cli_new_ctx_seqs(b->m, &ov, b->n, true);
	for (int w = 0; w < T_WAYS; w++)
		if (!(tps[w] = calloc(reps, sizeof(double))))
			cli_die("out of memory");
	printf("TEAL batches: %s, %u sequences, prompts of %u tokens, %u decoded each, %d "
	       "rounds\n", b->o->model, b->n, b->n_prompt, b->n_gen, reps);
	for (int r = 0; r < reps; r++)
		for (int k = 0; k < T_WAYS; k++) { /* alternating: shared machines drift */
			const int w = r % 2 ? T_WAYS - 1 - k : k;

			if (w == T_ROWS)
				hyb_ctx_teal_stats_reset(c[w]);
			tps[w][r] = b->n * b->n_gen / (w <= T_ONE ? run_one(b, c[w])
								   : run_batch(b, c[w], b->n));
		}
	hyb_ctx_teal_stats(c[T_ROWS], &st);
	for (int w = 0; w < T_WAYS; w++) {
		const double v = cli_median(tps[w], reps);

		printf("%-24s %8.2f tokens/s  %.2fx TEAL one by one, %.2fx dense batch\n",
		       teal_way[w], v, v / cli_median(tps[T_ONE], reps),
		       v / cli_median(tps[T_DENSE], reps));
	}
	if (st.inputs)
		printf("TEAL, batch N: decode steps skipped %.1f%% of projection inputs, %.1f%% "
		       "of their bytes each\n", 100.0 * (1.0 - (double)st.active / st.inputs),
		       100.0 * (1.0 - (double)st.bytes / st.dense_bytes));
	for (int w = 0; w < T_WAYS; w++) {
		hyb_ctx_free(c[w]);
		free(tps[w]);
	}
	return 0;
}

int cmd_bench_seqs(struct cli_opts *o)
{
	struct sbench b = { .o = o };
	const int reps = o->reps > 0 ? o->reps : 3;
	b.m = cli_load_model(o);
	if (!o->gpu_budget) {
		b.n = o->parallel;
		b.n_prompt = o->prompt ? (uint32_t)cli_num("-p", o->prompt, 1, 65536) : 32;
		b.n_gen = o->n_gen_bench > 0 ? (uint32_t)o->n_gen_bench : 32;
		make_prompts(&b);
		teal_seqs(&b, reps);
		free(b.prompts);
		free(b.logits);
		hyb_model_free(b.m);
		return 0;
	}
	/* a mixture's expert cache, or a plain model's whole FFNs (plain_hybrid.h): both
	 * batch attending on the CPU, one by one against batch N */
	b.moe = b.m->hp.n_expert > 0 || (!b.m->group_size && !b.m->powerinfer);
	if (!b.m->group_size && !b.moe)
		cli_die("--parallel with --gpu-budget batches a plan's hybrid decoding (hybctl "
			"plan), a mixture of experts' expert cache or a plain model's FFNs; %s is a "
			"PowerInfer file", o->model);
	b.n = o->parallel;
	b.s = o->hy.kv_seqs ? o->hy.kv_seqs : (b.n / 4 ? b.n / 4 : 1);
	if (b.moe && o->hy.kv_seqs)
		cli_die("--kv-seqs: a mixture's or a plain model's batches attend on the CPU "
			"(docs/MOE.md, docs/HYBRID.md \"Plain models\")");
	if (b.s >= b.n && !b.moe)
		cli_die("--kv-seqs %u: fewer than the %u sequences (--parallel) so that some "
			"attend on the CPU", b.s, b.n);
	b.n_prompt = o->prompt ? (uint32_t)cli_num("-p", o->prompt, 1, 65536) : 32;
	b.n_gen = o->n_gen_bench > 0 ? (uint32_t)o->n_gen_bench : 32;
	make_prompts(&b);
	/* a plain model with --teal: APEX's place holds the dense batch N, the baseline,
	 * and batch S's TEAL N with batch_variant */
	b.teal = b.moe && o->teal;
	b.c[ONE] = new_ctx(&b, 1, 0, true, false);
	b.c[BATCH_S] = b.teal ? new_ctx(&b, b.n, 0, true, true) :
		       b.s > 1 && !b.moe ? new_ctx(&b, b.s, b.s, true, false) : NULL;
	b.c[APEX] = b.teal ? new_ctx(&b, b.n, 0, false, false) :
		    b.moe ? NULL : new_ctx(&b, b.n, b.s, true, false);
	b.c[DEV_N] = new_ctx(&b, b.n, b.moe ? 0 : b.n, true, false);
	for (int w = 0; w < N_WAYS; w++) {
		b.tps[w] = calloc(reps, sizeof(double));
		if (!b.tps[w])
			cli_die("out of memory");
	}
	printf("hybrid batches: %s, %u sequences, %u on the device in APEX N, prompts of %u "
	       "tokens, %u decoded each, %d rounds\n", o->model, b.n, b.s, b.n_prompt, b.n_gen,
	       reps);
	for (int w = 0; w < N_WAYS; w++)
		if (b.c[w])
			place_line(&b, w);
	for (int r = 0; r < reps; r++) {
		/* alternate the order each round: shared machines drift */
		for (int k = 0; k < N_WAYS; k++) {
			const int w = r % 2 ? N_WAYS - 1 - k : k;
			struct hyb_hybrid_stats st;
			uint32_t seqs = w == BATCH_S && !b.teal ? b.s : b.n;
			double t;

			if (b.moe && !b.c[w])
				continue;
			if (w == BATCH_S && !b.c[w])
				seqs = 1;
			if (!b.c[w]) {
				/* batch of one: the one-sequence context, one sequence */
				const uint32_t n = b.n;

				b.n = 1;
				t = run_one(&b, b.c[ONE]);
				b.n = n;
			} else {
				hyb_ctx_hybrid_stats_reset(b.c[w]);
				t = w == ONE ? run_one(&b, b.c[w]) : run_batch(&b, b.c[w], seqs);
				hyb_ctx_hybrid_stats(b.c[w], &st);
				add_stats(&b.st[w], &st);
			}
			b.tps[w][r] = seqs * b.n_gen / t;
		}
	}
	for (int w = 0; w < N_WAYS; w++) {
		const double tps = cli_median(b.tps[w], reps), one = cli_median(b.tps[ONE], reps);
		const struct hyb_hybrid_stats *st = &b.st[w];

		if (b.moe && !b.c[w])
			continue;
		printf("%-12s %8.2f tokens/s  %.2fx one by one", way(&b, w), tps, tps / one);
		if (b.moe && st->active)
			printf("; routed experts on the device %.1f%%",
			       100.0 * st->active_dev / st->active);
		if (w != ONE && st->seq_rows) {
			const double rows = (double)st->attn_rows_dev + st->attn_rows_cpu;

			const double all = (double)st->seq_rows * b.m->hp.n_ff * b.m->hp.n_layer;

			printf("; attention rows on the CPU %.0f%% (%.2f ms a pass); FFN neurons "
			       "on the device %.1f%%, on the CPU %.1f%% (sparse)",
			       rows > 0 ? 100.0 * st->attn_rows_cpu / rows : 0.0,
			       1e3 * st->cpu_attn_s / st->seq_passes,
			       100.0 * st->seq_neurons_dev / all, 100.0 * st->seq_neurons_cpu / all);
		}
		printf("\n");
	}
	if (b.teal) {
		printf("TEAL N / dense N: %.2fx; TEAL N, variant / dense N: %.2fx\n",
		       cli_median(b.tps[DEV_N], reps) / cli_median(b.tps[APEX], reps),
		       cli_median(b.tps[BATCH_S], reps) / cli_median(b.tps[APEX], reps));
		fflush(stdout);
		cli_print_teal(b.c[DEV_N], b.m);
	}
	if (!b.moe) {
		apex_profile(&b);
		printf("APEX N / batch S: %.2fx; APEX N / device N: %.2fx\n",
		       cli_median(b.tps[APEX], reps) / cli_median(b.tps[BATCH_S], reps),
		       cli_median(b.tps[APEX], reps) / cli_median(b.tps[DEV_N], reps));
	}
	for (int w = 0; w < N_WAYS; w++) {
		hyb_ctx_free(b.c[w]);
		free(b.tps[w]);
	}
	free(b.prompts);
	free(b.logits);
	hyb_model_free(b.m);
	return 0;
}
