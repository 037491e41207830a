// SPDX-License-Identifier: MIT
/*
 * Hybrid decoding in the `hyb` command: --gpu-budget, the per-token figures
 * of a hybrid run, and `hyb bench --gpu-budget`: every balancer policy on
 * one drift workload, in the same rounds, against the CPU-only sparse decode.
 */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "hyb/device.h"
#include "hyb/gguf.h"
#include "hyb/tensor_type.h"
#include "hyb/membw.h"

void cli_check_prompt_batch(const struct hyb_ctx *c, const struct hyb_hybrid_params *hy)
{
	struct hyb_hybrid_offload pl;

	if (!hy->prompt_batch || !hyb_ctx_hybrid(c))
		return;
	hyb_ctx_hybrid_offload(c, &pl);
	if (pl.experts)
		cli_die("--prompt-batch: a mixture of experts' prompts run on the CPU (docs/MOE.md)");
	if (pl.prompt_batch != hy->prompt_batch && pl.plain)
		cli_die("--prompt-batch %u: the parts placed leave no room for a batch of %u "
			"tokens (docs/HYBRID.md \"Plain models\"): ask for fewer", hy->prompt_batch,
			hy->prompt_batch);
	if (pl.prompt_batch != hy->prompt_batch)
		cli_die("--prompt-batch %u: a batch of %u tokens does not fit in the neuron cache "
			"(%.1f MB, docs/HYBRID.md \"Prompts\"): ask for fewer", hy->prompt_batch,
			hy->prompt_batch, pl.cache_bytes / 1e6);
}

uint64_t cli_gpu_budget(const char *s, const struct hyb_model *m)
{
	char *end;
	double v = strtod(s, &end);
	double mult = 1;

	if (end == s || !(v > 0))
		cli_die("bad --gpu-budget '%s' (bytes with K/M/G, or N%% of the model)", s);
	switch (toupper((unsigned char)*end)) {
	case 0: break;
	case 'K': mult = 1024; end++; break;
	case 'M': mult = 1024.0 * 1024; end++; break;
	case 'G': mult = 1024.0 * 1024 * 1024; end++; break;
	case '%':
		if (v > 100)
			cli_die("--gpu-budget %s is over 100%% of the model", s);
		mult = m->weight_bytes / 100.0;
		end++;
		break;
	}
	if (*end && !(toupper((unsigned char)end[0]) == 'I' && toupper((unsigned char)end[1]) == 'B' &&
		      !end[2]) && !(toupper((unsigned char)end[0]) == 'B' && !end[1]))
		cli_die("bad --gpu-budget '%s' (bytes with K/M/G, or N%% of the model)", s);
	return (uint64_t)(v * mult);
}

enum hyb_thresholds cli_thresholds(const char *s)
{
	if (!strcmp(s, "off"))
		return HYB_THR_OFF;
	if (!strcmp(s, "expected"))
		return HYB_THR_EXPECTED;
	if (!strcmp(s, "paper"))
		return HYB_THR_PAPER;
	cli_die("unknown --thresholds '%s' (off, expected, paper)", s);
}

void cli_print_hybrid(struct hyb_ctx *c, double t_decode)
{
	struct hyb_hybrid_stats st;
	struct hyb_hybrid_offload pl;
	uint64_t res, slots;

	if (!hyb_ctx_hybrid(c))
		return;
	hyb_ctx_hybrid_stats(c, &st);
	hyb_ctx_hybrid_cache(c, &res, &slots);
	hyb_ctx_hybrid_offload(c, &pl);
	if (!st.tokens)
		return;
	const double n = (double)st.tokens;

	if (pl.experts) {
		fprintf(stderr, "hybrid: expert cache: %s\n", pl.cache_note);
		fprintf(stderr, "hybrid: %.1f%% of routed experts on the device, %.1f%% late "
			"(loading, computed on the CPU); %.2f expert loads and %.2f MB moved per "
			"token; cache %llu/%llu experts\n",
			st.active ? 100.0 * st.active_dev / st.active : 0.0,
			st.active ? 100.0 * st.late / st.active : 0.0, st.loads / n,
			(st.load_bytes + st.critical_bytes) / n / 1e6, (unsigned long long)res,
			(unsigned long long)slots);
		fprintf(stderr, "hybrid: per token: CPU experts %.3f ms, device expert kernels "
			"%.3f ms, stalls %.3f ms, balancer %.3f ms\n", 1e3 * st.cpu_ffn_s / n,
			1e3 * st.dev_kernel_s / n, 1e3 * st.stall_s / n, 1e3 * st.balancer_s / n);
		fprintf(stderr, "hybrid: decode steps: %s\n", pl.graph_note);
		return;
	}
	if (pl.plain) {
		fprintf(stderr, "hybrid: %s: %.1f MB\n", pl.cache_note,
			(pl.dense_bytes + pl.ffn_bytes) / 1e6);
		fprintf(stderr, "hybrid: per token: attention %.3f ms, FFNs %.3f ms (the CPU's "
			"%.3f ms, device FFN kernels %.3f ms), head %.3f ms; %.3f MB over the link\n",
			1e3 * st.attn_s / n, 1e3 * st.ffn_s / n, 1e3 * st.cpu_ffn_s / n,
			1e3 * st.dev_kernel_s / n, 1e3 * st.head_s / n, st.critical_bytes / n / 1e6);
		if (pl.prompt_batch)
			fprintf(stderr, "hybrid: prompts: batches of up to %u tokens through the "
				"parts on the device (%.1f MB of buffers), %llu batches\n",
				pl.prompt_batch, pl.prompt_bytes / 1e6,
				(unsigned long long)st.prompt_batches);
		else if (pl.prompt_note[0])
			fprintf(stderr, "hybrid: prompts: %s\n", pl.prompt_note);
		return;
	}
	fprintf(stderr, "hybrid: on the device: attention of %u layers, %s, %u predictors, %.1f MB "
		"dense + %.1f MB neuron cache%s\n", pl.attn_layers,
		pl.head ? "the head" : "not the head", pl.predictors, pl.dense_bytes / 1e6,
		pl.cache_bytes / 1e6,
		pl.dense_layers_cpu ? " (other layers dense on the CPU)" : "");
	fprintf(stderr, "hybrid: neuron cache: %s\n", pl.cache_note);
	if (pl.prompt_batch)
		fprintf(stderr, "hybrid: prompts: batches of up to %u tokens on the device (%.1f MB "
			"of buffers); %llu batches streamed %.1f MB of FFN bundles\n",
			pl.prompt_batch, pl.prompt_bytes / 1e6,
			(unsigned long long)st.prompt_batches, st.prompt_stream_bytes / 1e6);
	else if (pl.prompt_note[0])
		fprintf(stderr, "hybrid: prompts: %s\n", pl.prompt_note);
	fprintf(stderr, "hybrid: %.1f%% of active neurons on the device; %.1f group loads and "
		"%.2f MB moved per token; cache %llu/%llu groups\n",
		st.active ? 100.0 * st.active_dev / st.active : 0.0, st.loads / n,
		(st.load_bytes + st.critical_bytes) / n / 1e6, (unsigned long long)res,
		(unsigned long long)slots);
	fprintf(stderr, "hybrid: per token: CPU FFN %.3f ms, device FFN kernels %.3f ms (host-seen "
		"when last %.3f ms), stalls %.3f ms, predictors %.3f ms, balancer %.3f ms (%.3f ms of "
		"the two beside the CPU FFN); FFN %.0f%% of decode time\n",
		1e3 * st.cpu_ffn_s / n, 1e3 * st.dev_kernel_s / n, 1e3 * st.dev_ffn_s / n,
		1e3 * st.stall_s / n,
		1e3 * st.predictor_s / n, 1e3 * st.balancer_s / n, 1e3 * st.side_s / n,
		t_decode > 0 ? 100 * st.ffn_s / t_decode : 0.0);
	fprintf(stderr, "hybrid: per token: attention %.3f ms, head %.3f ms\n",
		1e3 * st.attn_s / n, 1e3 * st.head_s / n);
	if (st.thr_added || st.thr_dropped)
		fprintf(stderr, "hybrid: load-aware thresholds: per token %.1f cached neurons under "
			"the predictor's threshold added, %.1f CPU neurons over it dropped\n",
			st.thr_added / n, st.thr_dropped / n);
	if (st.layer_steps)
		fprintf(stderr, "hybrid: %.1f%% of active neurons late (loading, computed on the "
			"CPU); bottleneck test: %.1f%% of decisions I/O-bound, %.1f%% CPU-bound\n",
			st.active ? 100.0 * st.late / st.active : 0.0,
			100.0 * st.bound_io / st.layer_steps, 100.0 * st.bound_cpu / st.layer_steps);
	/* tam policies: lambda of every layer at the end (NAN past the last layer) */
	if (!isnan(hyb_ctx_hybrid_lambda(c, 0))) {
		fprintf(stderr, "hybrid: lambda per layer:");
		for (uint32_t l = 0; !isnan(hyb_ctx_hybrid_lambda(c, l)); l++)
			fprintf(stderr, " %.2f", hyb_ctx_hybrid_lambda(c, l));
		fprintf(stderr, "\n");
	}
}

/*
 * The expert frequencies of a routing profile (hybctl profile -o, on this
 * model: general.architecture "hyb-moe-profile", blk.L.expert_freq F32
 * [n_expert] per layer), read once per path. Dies naming what does not fit.
 */
const float *const *cli_routing_freq(const struct hyb_model *m, const char *path)
{
	static const float **freq;
	static float *data;
	const struct hyb_hparams *hp = &m->hp;
	struct hyb_gguf_file *f;
	char arch[64] = "";
	uint32_t L = 0, X = 0;

	if (freq)
		return freq;
	if (!hp->n_expert)
		cli_die("--routing %s: the model has no experts", path);
	if (hyb_gguf_open(path, &f))
		cli_die("--routing: %s", hyb_last_error());
	if (!hyb_gguf_get_str(f, "general.architecture", arch, sizeof(arch)) ||
	    strcmp(arch, "hyb-moe-profile"))
		cli_die("--routing %s: not a routing profile (general.architecture '%s'; "
			"hybctl profile -o writes one)", path, arch);
	if (!hyb_gguf_get_u32(f, "hyb.moe_profile.n_layer", &L) ||
	    !hyb_gguf_get_u32(f, "hyb.moe_profile.n_expert", &X) || L != hp->n_layer ||
	    X != hp->n_expert)
		cli_die("--routing %s: a profile of %u layers x %u experts; the model has %u x %u",
			path, L, X, hp->n_layer, hp->n_expert);
	freq = malloc(sizeof(*freq) * L);
	data = calloc((size_t)L * X, sizeof(float));
	if (!freq || !data)
		cli_die("out of memory");
	for (uint32_t l = 0; l < L; l++) {
		char nm[64];
		const struct hyb_gguf_tensor *t;

		freq[l] = data + (size_t)l * X;
		snprintf(nm, sizeof(nm), "blk.%u.expert_freq", l);
		t = hyb_gguf_find_tensor(f, nm);
		if (!t) {
			if (l < hp->n_dense_lead)
				continue; /* a dense layer: no experts to count */
			cli_die("--routing %s: no tensor %s", path, nm);
		}
		if (t->type != HYB_TYPE_F32 || t->n_dims != 1 || t->ne[0] != X)
			cli_die("--routing %s: %s is not F32 [%u]", path, nm, X);
		memcpy(data + (size_t)l * X, t->data, sizeof(float) * X);
		for (uint32_t e = 0; e < X; e++)
			if (!(data[(size_t)l * X + e] >= 0 && data[(size_t)l * X + e] <= 1))
				cli_die("--routing %s: %s[%u] = %g is not a frequency", path, nm, e,
					(double)data[(size_t)l * X + e]);
	}
	hyb_gguf_close(f);
	return freq;
}

/* ---- hyb bench --gpu-budget ----------------------------------------------------- */

/*
 * The drift workload: the prompt, then greedy decoding where every drift-th
 * token is forced to a seeded random id. On a `hybctl synth` model a token
 * carries its topic and the head keeps the text on the current topic, so
 * each forced token moves the text to another topic (with probability
 * 1 - 1/topics) mid-generation: the active neurons shift and the cache must
 * follow. The reference run (CPU-only sparse) fixes the sequence; every
 * policy is then fed the same tokens, and its own greedy choice is compared.
 */
struct workload {
	int32_t *toks;    /* prompt then the decoded sequence */
	uint32_t n_prompt, n_gen;
};

static double run_seq(struct hyb_ctx *c, const struct hyb_model *m, struct workload *w,
		      bool reference, uint32_t drift, float *logits, uint64_t *agree,
		      double *prompt_s)
{
	const uint32_t V = m->hp.n_vocab;
	uint64_t rng = 0x9e3779b97f4a7c15ull;
	double t0;

	hyb_ctx_reset(c);
	t0 = hyb_ctx_clock(c);
	if (hyb_ctx_eval(c, w->toks, w->n_prompt, logits, false))
		cli_die("%s", hyb_last_error());
	*prompt_s = hyb_ctx_clock(c) - t0;
	hyb_ctx_hybrid_stats_reset(c);
	t0 = hyb_ctx_clock(c);
	for (uint32_t i = 0; i < w->n_gen; i++) {
		const uint32_t pos = w->n_prompt + i;
		int pick = cli_argmax(logits, V);

		if (reference) {
			rng = rng * 6364136223846793005ull + 1442695040888963407ull;
			w->toks[pos] = drift && (i + 1) % drift == 0 ?
					       (int32_t)(3 + (rng >> 33) % (V - 3)) : pick;
		} else if (!(drift && (i + 1) % drift == 0)) {
			*agree += pick == w->toks[pos];
		}
		if (hyb_ctx_eval(c, &w->toks[pos], 1, logits, false))
			cli_die("%s", hyb_last_error());
	}
	return hyb_ctx_clock(c) - t0;
}

static int parse_policies(const char *s, enum hyb_policy *out)
{
	static const enum hyb_policy all[] = {
		HYB_POLICY_LAYER, HYB_POLICY_STATIC, HYB_POLICY_LRU, HYB_POLICY_TOPK,
		HYB_POLICY_DYNAMIC, HYB_POLICY_TAM, HYB_POLICY_TAM_ADAPTIVE,
	};
	char buf[256], *save, *tok;
	int n = 0;

	if (!s || !strcmp(s, "all")) {
		memcpy(out, all, sizeof(all));
		return (int)(sizeof(all) / sizeof(all[0]));
	}
	snprintf(buf, sizeof(buf), "%s", s);
	for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (n == HYB_N_POLICIES)
			cli_die("--policies: too many entries");
		if (hyb_policy_parse(tok, &out[n]))
			cli_die("--policies: unknown policy '%s'", tok);
		n++;
	}
	return n;
}

static double wbytes(const struct hyb_weight *w)
{
	return (double)w->ne1 * w->row_bytes;
}

/*
 * Bytes a decode step reads, by side, for the roofline: dense parts where the
 * placement put them (attention weights; the KV cache at the workload's mean
 * position; predictors, every fc2 row counted), the layer policy's whole FFNs
 * of its CPU layers; active neurons by where they ran.
 */
static void step_bytes(const struct hyb_model *m, const struct hyb_hybrid_offload *pl,
		       const struct hyb_hybrid_stats *s, bool layer, double mean_pos,
		       double *cpu_b, double *gpu_b)
{
	if (pl->experts) {
		/*
		 * the expert cache: attention and the head where the placement put
		 * them (every layer's attention or none), routers and shared
		 * experts on the device where it placed them (the placement's
		 * bytes, docs/MOE.md), else on the CPU, routed experts by where they
		 * ran (wbytes of a 3-D expert tensor: one expert's matrix)
		 */
		const struct hyb_hparams *hp = &m->hp;
		const double n = s->tokens ? (double)s->tokens : 1;
		double expert = 0, attn = 0, rest = m->tok_embd.row_bytes, router = 0, shared = 0;

		for (uint32_t l = 0; l < hp->n_layer; l++) {
			const struct hyb_layer *L = &m->layers[l];

			attn += wbytes(&L->wq) + wbytes(&L->wk) + wbytes(&L->wv) + wbytes(&L->wo) +
				4.0 * hp->n_head_kv * hp->head_dim * mean_pos;
			router += wbytes(&L->gate_inp);
			shared += wbytes(&L->gate_shexp) + wbytes(&L->up_shexp) +
				  wbytes(&L->down_shexp) + wbytes(&L->gate_inp_shexp);
			rest += wbytes(&L->gate) + wbytes(&L->up) + wbytes(&L->down);
			if (L->gate_exps.data && !expert)
				expert = wbytes(&L->gate_exps) + wbytes(&L->up_exps) +
					 wbytes(&L->down_exps);
		}
		const double r_cpu = pl->router_bytes ? 0 : router, s_cpu = pl->shared_bytes ? 0 : shared;

		*cpu_b = rest + r_cpu + s_cpu + (pl->attn_layers ? 0 : attn) +
			 (pl->head ? 0 : wbytes(&m->output)) + expert * (s->active - s->active_dev) / n;
		*gpu_b = router - r_cpu + shared - s_cpu + (pl->attn_layers ? attn : 0) +
			 (pl->head ? wbytes(&m->output) : 0) + expert * s->active_dev / n;
		(void)layer;
		return;
	}
	if (pl->plain) {
		/* a plain model's parts: the attention blocks and head where dense.c put
		 * them, whole FFNs (in order) on the device up to ffn_layers; with TEAL
		 * the CPU's share reads fewer (the bound is then dense's) */
		const struct hyb_hparams *hp = &m->hp;
		double attn = 0, ffn_dev = 0, ffn_cpu = 0;
		uint32_t placed = 0;

		for (uint32_t l = 0; l < hp->n_layer; l++) {
			const struct hyb_layer *L = &m->layers[l];
			const double f = wbytes(&L->gate) + wbytes(&L->up) + wbytes(&L->down);

			attn += wbytes(&L->wq) + wbytes(&L->wk) + wbytes(&L->wv) + wbytes(&L->wo) +
				4.0 * hp->n_head_kv * hp->head_dim * mean_pos;
			/* both placements put FFNs in layer order */
			if (placed < pl->ffn_layers && f) {
				ffn_dev += f;
				placed++;
			} else {
				ffn_cpu += f;
			}
		}
		attn /= hp->n_layer;
		*cpu_b = m->tok_embd.row_bytes + attn * (hp->n_layer - pl->attn_layers) + ffn_cpu +
			 (pl->head ? 0 : wbytes(&m->output));
		*gpu_b = attn * pl->attn_layers + ffn_dev + (pl->head ? wbytes(&m->output) : 0);
		(void)s;
		(void)layer;
		return;
	}
	const struct hyb_hparams *hp = &m->hp;
	const struct hyb_layer *L0 = &m->layers[0];
	const double n = s->tokens ? (double)s->tokens : 1;
	const double neuron = 3.0 * L0->plan.bundles.row_bytes;
	const double attn = wbytes(&L0->wq) + wbytes(&L0->wk) + wbytes(&L0->wv) +
			    wbytes(&L0->wo) + 4.0 * hp->n_head_kv * hp->head_dim * mean_pos;
	const double head = wbytes(&m->output);
	const double ffn = neuron * hp->n_ff;

	*cpu_b = m->tok_embd.row_bytes + attn * (hp->n_layer - pl->attn_layers) +
		 (pl->head ? 0 : head) + neuron * (s->active - s->active_dev) / n;
	*gpu_b = attn * pl->attn_layers + (pl->head ? head : 0) + neuron * s->active_dev / n;
	if (layer) {
		*cpu_b += ffn * pl->dense_layers_cpu;
	} else {
		const double pred = wbytes(&L0->plan.fc1) + wbytes(&L0->plan.fc2);

		*cpu_b += pred * (hp->n_layer - pl->predictors);
		*gpu_b += pred * pl->predictors;
	}
}

/*
 * The link and device-memory bandwidths of this round (each bandwidth of
 * the roofline measured in the same run), on a device of the
 * kind and configuration the contexts use, opened after they let go of it.
 * On the CPU device they come back as its model's figures.
 */
static void device_bw(const struct cli_opts *o, double *pcie, double *hbm)
{
	const uint64_t bytes = 256ull << 20;
	struct hyb_device_config cfg = o->hy.dev;
	struct hyb_device_bw bw;
	struct hyb_device *d;

	cfg.capacity = bytes + (16ull << 20);
	d = hyb_device_open(o->hy.device ? o->hy.device : "cpu", &cfg);
	if (!d)
		cli_die("measuring the device's bandwidths: %s", hyb_last_error());
	if (hyb_device_measure_bw(d, bytes, 3, &bw))
		cli_die("measuring the device's bandwidths: %s", hyb_device_error(d));
	hyb_device_close(d);
	*pcie = bw.pcie_gbps * 1e9;
	*hbm = bw.hbm_gbps * 1e9;
}

struct policy_run {
	enum hyb_policy p;
	enum hyb_thresholds thr;      /* AUTO: the command line's */
	char name[24];
	double *tps, *pps;            /* decode and prompt tokens/s, per round */
	struct hyb_hybrid_offload pl;
	struct hyb_hybrid_stats st;   /* summed over rounds */
	uint64_t agree, compared;
	double lambda[3];
	uint64_t slots;               /* cache slots (groups or experts) */
	struct hyb_hybrid_layer_stats *lst; /* expert cache: [n_layer], summed over rounds */
	double teal_saved;            /* --teal: bytes the CPU's TEAL GEMVs did not read */
};

/* One `hyb bench --gpu-budget` run: the workload, the policies, per-round figures. */
struct hbench {
	struct cli_opts *o;
	struct hyb_model *m;
	struct workload w;
	uint32_t n_prompt, n_gen, drift;
	int nth, np;
	struct policy_run *pr;
	bool moe;                                       /* the expert cache (docs/MOE.md) */
	double *t_ref, *p_ref, *dram, *pcie, *hbm;	/* per round */
	float *logits;
};

static double *per_round(const struct hbench *h)
{
	double *v = calloc(h->o->reps, sizeof(double));

	if (!v)
		cli_die("out of memory");
	return v;
}

/*
 * A plain model's placement that holds nothing at the budget is left out,
 * said (layer places whole layers in order: none where the first layer does
 * not fit; plain_hybrid.h); exits if none is left.
 */
static void plain_drop_empty(struct hbench *h, const struct cli_opts *o, enum hyb_policy *pol)
{
	for (int i = 0; i < h->np; i++) {
		struct hyb_hybrid_params hy = o->hy;
		struct hyb_ctx_params p = { .n_ctx = o->n_ctx, .n_threads = 1, .hybrid = &hy };
		struct hyb_ctx *c;

		hy.policy = pol[i];
		hy.gpu_budget = cli_gpu_budget(o->gpu_budget, h->m);
		c = hyb_ctx_new(h->m, &p);
		if (c) {
			hyb_ctx_free(c);
			continue;
		}
		fprintf(stderr, "hyb: note: %s left out: %s\n", hyb_policy_name(pol[i]),
			hyb_last_error());
		memmove(pol + i, pol + i + 1, sizeof(*pol) * (size_t)(h->np - i - 1));
		h->np--;
		i--;
	}
	if (!h->np)
		cli_die("--gpu-budget %s: no placement holds a part of the model", o->gpu_budget);
}

/* The model, the prompt, the policies to run; the header lines. */
static void hbench_open(struct hbench *h, struct cli_opts *o)
{
	enum hyb_policy pol[HYB_N_POLICIES + 1];
	uint64_t budget;

	h->o = o;
	h->np = parse_policies(o->policies, pol);
	h->m = cli_load_model(o);
	if (!h->m->group_size && !h->m->hp.n_expert && !h->m->powerinfer) {
		/* a plain model's parts are placed whole: two placements (plain_hybrid.h) */
		if (o->policies && strcmp(o->policies, "all"))
			for (int i = 0; i < h->np; i++)
				if (pol[i] != HYB_POLICY_STATIC && pol[i] != HYB_POLICY_LAYER)
					cli_die("--policies: a plain model's parts are placed whole, "
						"static or layer; %s moves a plan's neuron groups or "
						"a mixture's experts", hyb_policy_name(pol[i]));
		if (!o->policies || !strcmp(o->policies, "all")) {
			pol[0] = HYB_POLICY_LAYER;
			pol[1] = HYB_POLICY_STATIC;
			h->np = 2;
		}
	}
	h->n_prompt = o->prompt ? (uint32_t)cli_num("-p", o->prompt, 1, 65536) : 16;
	h->n_gen = (uint32_t)o->n_gen_bench;
	h->drift = o->drift ? o->drift : 32;
	h->w = (struct workload){ .n_prompt = h->n_prompt, .n_gen = h->n_gen };
	h->nth = o->n_threads > 0 ? o->n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
	h->moe = h->m->hp.n_expert > 0;

	h->pr = calloc(h->np + 1, sizeof(*h->pr));
	h->logits = malloc(sizeof(float) * h->m->hp.n_vocab);
	h->w.toks = malloc(sizeof(int32_t) * (h->n_prompt + h->n_gen));
	if (!h->pr || !h->logits || !h->w.toks)
		cli_die("out of memory");
	h->t_ref = per_round(h), h->p_ref = per_round(h), h->dram = per_round(h);
	h->pcie = per_round(h), h->hbm = per_round(h);
	srand(1);
	for (uint32_t i = 0; i < h->n_prompt; i++)
		h->w.toks[i] = 3 + rand() % (int)(h->m->hp.n_vocab - 3);
	o->n_ctx = h->n_prompt + h->n_gen;
	budget = cli_gpu_budget(o->gpu_budget, h->m);
	if (!h->m->group_size && !h->m->hp.n_expert && !h->m->powerinfer)
		plain_drop_empty(h, o, pol);

	if (h->moe)
		printf("model       %s: %u layers, embd %u, %u experts (%u used) of ffn %llu, %.2f "
		       "GB%s\n", o->model, h->m->hp.n_layer, h->m->hp.n_embd, h->m->hp.n_expert,
		       h->m->hp.n_expert_used,
		       (unsigned long long)h->m->layers[h->m->hp.n_layer - 1].gate_exps.ne1,
		       h->m->weight_bytes / 1e9, o->routing ? "; routing profile given" : "");
	else if (!h->m->group_size)
		printf("model       %s: %u layers, embd %u, ffn %u, a plain model (parts placed "
		       "whole), %.2f GB\n", o->model, h->m->hp.n_layer, h->m->hp.n_embd,
		       h->m->hp.n_ff, h->m->weight_bytes / 1e9);
	else
		printf("model       %s: %u layers, embd %u, ffn %u (%u groups of %u), %.2f GB\n",
		       o->model, h->m->hp.n_layer, h->m->hp.n_embd, h->m->hp.n_ff,
		       h->m->n_groups, h->m->group_size, h->m->weight_bytes / 1e9);
	printf("workload    %u prompt tokens, %u decoded, a forced topic change every %u; %d "
	       "threads\n", h->n_prompt, h->n_gen, h->drift, h->nth);
	printf("device      %s, budget %.1f MB (%.0f%% of the model)\n",
	       o->hy.device ? o->hy.device : "cpu", budget / 1e6,
	       100.0 * budget / h->m->weight_bytes);
	for (int i = 0; i < h->np; i++) {
		h->pr[i].p = pol[i];
		snprintf(h->pr[i].name, sizeof(h->pr[i].name), "%s", hyb_policy_name(pol[i]));
		h->pr[i].tps = per_round(h);
		h->pr[i].pps = per_round(h);
		/* dynamic also without its load-aware thresholds (DynamicInfer 4.4), next to it */
		if (pol[i] == HYB_POLICY_DYNAMIC && !h->moe && o->hy.thresholds == HYB_THR_AUTO) {
			struct policy_run *q = &h->pr[++i];

			memmove(pol + i + 1, pol + i, sizeof(*pol) * (size_t)(h->np - i));
			h->np++;
			*q = (struct policy_run){ .p = HYB_POLICY_DYNAMIC, .thr = HYB_THR_OFF,
						  .tps = per_round(h), .pps = per_round(h) };
			snprintf(q->name, sizeof(q->name), "dynamic-fixed");
		}
	}
}

/* One policy on the round's workload: its speeds, and its statistics summed in. */
static void run_policy(struct hbench *h, struct policy_run *pr, int r)
{
	struct cli_opts oc = *h->o;
	struct hyb_hybrid_stats st;
	struct hyb_ctx *c;
	double t, ps;

	oc.hy.policy = pr->p;
	if (pr->thr != HYB_THR_AUTO)
		oc.hy.thresholds = pr->thr;
	c = cli_new_ctx(h->m, &oc);
	t = run_seq(c, h->m, &h->w, false, h->drift, h->logits, &pr->agree, &ps);
	pr->compared += h->n_gen - h->n_gen / h->drift;
	pr->tps[r] = h->n_gen / t;
	pr->pps[r] = h->n_prompt / ps;
	hyb_ctx_hybrid_stats(c, &st);
#define ADD(f) pr->st.f += st.f
	ADD(tokens); ADD(active); ADD(active_dev); ADD(late); ADD(loads);
	ADD(bound_io); ADD(bound_cpu); ADD(dev_kernel_s);
	ADD(load_bytes); ADD(critical_bytes); ADD(cpu_ffn_s); ADD(dev_ffn_s);
	ADD(stall_s); ADD(predictor_s); ADD(balancer_s); ADD(attn_s); ADD(head_s);
	ADD(thr_added); ADD(thr_dropped); ADD(side_s);
#undef ADD
	hyb_ctx_hybrid_offload(c, &pr->pl);
	{
		struct hyb_teal_stats ts;

		hyb_ctx_teal_stats(c, &ts);
		pr->teal_saved += (double)(ts.dense_bytes - ts.bytes);
	}
	{
		uint64_t res;

		hyb_ctx_hybrid_cache(c, &res, &pr->slots);
	}
	for (uint32_t l = 0; h->moe && l < h->m->hp.n_layer; l++) {
		struct hyb_hybrid_layer_stats ls;

		if (!pr->lst && !(pr->lst = calloc(h->m->hp.n_layer, sizeof(*pr->lst))))
			cli_die("out of memory");
		if (hyb_ctx_hybrid_layer_stats(c, l, &ls))
			cli_die("%s", hyb_last_error());
		pr->lst[l].active += ls.active;
		pr->lst[l].active_dev += ls.active_dev;
		pr->lst[l].loads += ls.loads;
		pr->lst[l].cpu_s += ls.cpu_s;
		pr->lst[l].stall_s += ls.stall_s;
	}
	pr->lambda[0] = hyb_ctx_hybrid_lambda(c, 0);
	pr->lambda[1] = hyb_ctx_hybrid_lambda(c, h->m->hp.n_layer / 2);
	pr->lambda[2] = hyb_ctx_hybrid_lambda(c, h->m->hp.n_layer - 1);
	hyb_ctx_free(c);
}

/* One round: the CPU-only baseline (which also fixes the tokens), every policy, the bandwidths. */
static void hbench_round(struct hbench *h, int r)
{
	struct cli_opts oc = *h->o;
	struct hyb_ctx *c;
	double ps;

	oc.gpu_budget = NULL;
	oc.routing = NULL;
	oc.hy.thresholds = HYB_THR_AUTO;
	oc.ffn = h->moe || !h->m->group_size ? HYB_FFN_AUTO : HYB_FFN_SPARSE;
	c = cli_new_ctx(h->m, &oc);
	h->t_ref[r] = h->n_gen / run_seq(c, h->m, &h->w, true, h->drift, h->logits, NULL, &ps);
	h->p_ref[r] = h->n_prompt / ps;
	hyb_ctx_free(c);
	h->dram[r] = hyb_measure_read_bw(h->nth, 256u << 20, 3);
	for (int i = 0; i < h->np; i++)
		run_policy(h, &h->pr[i], r);
	device_bw(h->o, &h->pcie[r], &h->hbm[r]);
}

/* A policy's row: speed, the split, traffic, times, and its share of the hybrid roofline. */
static double print_policy(const struct hbench *h, const struct policy_run *pr, double ref,
			   double bw_dram, double bw_pcie, double bw_hbm)
{
	const struct hyb_hybrid_stats *s = &pr->st;
	const double n = s->tokens ? (double)s->tokens : 1;
	const double tps = cli_median(pr->tps, h->o->reps);
	const double io_b = (double)(s->load_bytes + s->critical_bytes) / n;
	const double mean_pos = h->n_prompt + h->n_gen / 2.0;
	double cpu_b, gpu_b, roof;
	char dense[16];

	step_bytes(h->m, &pr->pl, s, pr->p == HYB_POLICY_LAYER, mean_pos, &cpu_b, &gpu_b);
	if (s->tokens) /* TEAL's inputs below their thresholds: rows not read */
		cpu_b -= pr->teal_saved / (double)s->tokens;
	roof = cpu_b / bw_dram;
	snprintf(dense, sizeof(dense), "%u%s%s%s%s", pr->pl.attn_layers, pr->pl.head ? "+h" : "",
		 pr->pl.predictors ? "+p" : "", pr->pl.router_bytes ? "+r" : "",
		 pr->pl.shared_bytes ? "+s" : "");
	if (pr->pl.plain) /* and its whole FFNs */
		snprintf(dense + strlen(dense), sizeof(dense) - strlen(dense), "+%uf",
			 pr->pl.ffn_layers);
	if (bw_hbm > 0 && gpu_b / bw_hbm > roof)
		roof = gpu_b / bw_hbm;
	if (bw_pcie > 0 && io_b / bw_pcie > roof)
		roof = io_b / bw_pcie;
	printf("%-13s %8.2f %6.2fx %8.2f %6s %6.1f%% %6.1f %7.2f %7.3f %7.3f %7.3f %7.3f "
	       "%5.0f%% %6.1f%%", pr->name, tps, tps / ref,
	       cli_median(pr->pps, h->o->reps), dense,
	       s->active ? 100.0 * s->active_dev / s->active : 0.0, s->loads / n,
	       io_b / 1e6, 1e3 * s->attn_s / n, 1e3 * s->cpu_ffn_s / n,
	       1e3 * s->dev_kernel_s / n, 1e3 * s->stall_s / n, 100.0 * tps * roof,
	       pr->compared ? 100.0 * pr->agree / pr->compared : 0.0);
	if (!isnan(pr->lambda[0]))
		printf(" %.2f/%.2f/%.2f", pr->lambda[0], pr->lambda[1], pr->lambda[2]);
	printf("\n");
	return tps;
}

/*
 * What any policy could gain over static placement with this cache: a
 * perfect one holds every active neuron (or routed expert) it has room for
 * (slots x group size a token, at most the active ones), each one so moved
 * saves the CPU time static paid per CPU neuron, and the device's work
 * stays hidden (an upper bound: where the device is the slower side it is
 * not).
 */
static void print_bound(const struct hbench *h, const struct policy_run *st, double tps)
{
	const struct hyb_hybrid_stats *s = &st->st;
	const double n = s->tokens ? (double)s->tokens : 1;
	const double act = s->active / n, dev = s->active_dev / n, cpu = act - dev;
	const double cap = (double)st->slots * (h->moe ? 1 : h->m->group_size);
	const double t_n = cpu > 0 ? s->cpu_ffn_s / n / cpu : 0;
	const double more = (cap < act ? cap : act) - dev, t = 1 / tps;
	const double saved = more > 0 ? more * t_n : 0;

	printf("bound: any policy over this cache is at most %.2fx static: it holds %.0f %s "
	       "a token (%.1f%% of the %.0f active); static ran %.0f on the device; the rest "
	       "cost the CPU %.3f ms of a %.3f ms token\n", saved < t ? t / (t - saved) : 0.0,
	       cap, h->moe ? "experts" : "neurons",
	       act > 0 ? 100 * (cap < act ? cap : act) / act : 0.0, act, dev,
	       1e3 * (cpu > 0 ? cpu * t_n : 0), 1e3 * t);
}

/* The expert cache per layer, for one policy (docs/MOE.md): where the routed experts ran. */
static void print_layers(const struct hbench *h, const struct policy_run *pr)
{
	const double n = pr->st.tokens ? (double)pr->st.tokens : 1;

	printf("per layer (%s): layer, routed experts a token, share on the device, experts "
	       "loaded a token, CPU experts ms a token, waiting for the device ms a token\n",
	       pr->name);
	for (uint32_t l = 0; pr->lst && l < h->m->hp.n_layer; l++) {
		const struct hyb_hybrid_layer_stats *s = &pr->lst[l];

		if (!s->active)
			continue;
		printf("  %3u %6.2f %6.1f%% %6.2f %8.3f %8.3f\n", l, s->active / n,
		       100.0 * s->active_dev / s->active, s->loads / n, 1e3 * s->cpu_s / n,
		       1e3 * s->stall_s / n);
	}
}

static void hbench_report(struct hbench *h)
{
	const struct cli_opts *o = h->o;
	const double ref = cli_median(h->t_ref, o->reps);
	const double bw_dram = cli_median(h->dram, o->reps);
	const double bw_pcie = cli_median(h->pcie, o->reps), bw_hbm = cli_median(h->hbm, o->reps);
	double base_layer = 0, base_static = 0;

	printf("bandwidth   DRAM %.1f GB/s, PCIe %.1f GB/s, device memory %.0f GB/s (measured "
	       "in each round, medians; %s)\n", bw_dram / 1e9, bw_pcie / 1e9, bw_hbm / 1e9,
	       o->hy.device && !strcmp(o->hy.device, "cuda")
		       ? "link: a pinned host-to-device copy, memory: the device's add kernel"
		       : "the CPU device's link and memory are its model's");
	printf("baseline    %8.2f tokens/s  CPU-only %s decode; prompt %.2f tokens/s "
	       "(%u tokens)\n", ref, h->moe ? "expert" : o->teal ? "TEAL" :
	       !h->m->group_size ? "dense" : "sparse",
	       cli_median(h->p_ref, o->reps),
	       h->n_prompt);
	printf("%-13s %8s %7s %8s %6s %7s %6s %8s %7s %7s %7s %7s %6s %7s %s\n", "policy",
	       "tok/s", "vs cpu", "prompt", "dense", "gpu%", "loads", "MB/tok", "attn ms",
	       "cpu ms", "dev ms", "stall", "roof%", "agree", "lambda");
	for (int i = 0; i < h->np; i++) {
		double tps = print_policy(h, &h->pr[i], ref, bw_dram, bw_pcie, bw_hbm);

		if (h->pr[i].p == HYB_POLICY_LAYER)
			base_layer = tps;
		if (h->pr[i].p == HYB_POLICY_STATIC)
			base_static = tps;
	}
	for (int i = 0; i < h->np; i++) {
		const double tps = cli_median(h->pr[i].tps, o->reps);

		if (h->pr[i].p != HYB_POLICY_TAM_ADAPTIVE)
			continue;
		if (h->moe) {
			if (base_static > 0)
				printf("tam-adaptive vs static placement: %.2fx\n", tps / base_static);
			continue;
		}
		if (base_layer > 0)
			printf("tam-adaptive vs layer-wise offload: %.2fx (target >= 3)\n",
			       tps / base_layer);
		if (base_static > 0)
			printf("tam-adaptive vs static placement:   %.2fx (target >= 1.5)\n",
			       tps / base_static);
	}
	for (int i = 0; i < h->np; i++)
		if (h->pr[i].p == HYB_POLICY_STATIC && base_static > 0 && !h->pr[i].pl.plain)
			print_bound(h, &h->pr[i], base_static);
	if (h->moe && h->np)
		print_layers(h, &h->pr[h->np - 1]);
	for (int i = 0; i + 1 < h->np; i++) {
		const struct policy_run *a = &h->pr[i], *b = &h->pr[i + 1];
		const double n = a->st.tokens ? (double)a->st.tokens : 1;

		if (a->p != HYB_POLICY_DYNAMIC || b->thr != HYB_THR_OFF)
			continue;
		const double nb = b->st.tokens ? (double)b->st.tokens : 1;

		printf("dynamic's load-aware thresholds: %.2fx dynamic-fixed; per token %.0f cached "
		       "neurons added, %.0f CPU neurons dropped; predictors and decisions %.3f ms a "
		       "token, %.3f of it beside the CPU FFN (without: %.3f, %.3f)\n",
		       cli_median(a->tps, o->reps) / cli_median(b->tps, o->reps), a->st.thr_added / n,
		       a->st.thr_dropped / n, 1e3 * (a->st.predictor_s + a->st.balancer_s) / n,
		       1e3 * a->st.side_s / n, 1e3 * (b->st.predictor_s + b->st.balancer_s) / nb,
		       1e3 * b->st.side_s / nb);
	}
	printf("cpu ms / dev ms: per token, the CPU's share of the split FFNs (host clock) and "
	       "the device's FFN kernels (device clock, timed events)\n");
	printf("prompt: tokens/s of the prompt batch (-p; unless --prefill-cpu on the device: "
	       "from 32 tokens in batches, the FFN groups not cached streamed through it; "
	       "else token after token)\n");
	printf("dense: attention blocks on the device (+h: and the head, +p: and predictors, "
	       "+r: and routers, +s: and shared experts, +Nf: and N whole FFNs); "
	       "layer runs its other layers dense on the CPU\n");
	printf("roof%%: tokens/s against max(CPU bytes / DRAM, device bytes / device memory, "
	       "link bytes / PCIe) per token, each side's bytes where the placement put them\n");
}

static void hbench_free(struct hbench *h)
{
	for (int i = 0; i < h->np; i++) {
		free(h->pr[i].tps);
		free(h->pr[i].pps);
		free(h->pr[i].lst);
	}
	free(h->pr);
	free(h->t_ref);
	free(h->p_ref);
	free(h->dram);
	free(h->pcie);
	free(h->hbm);
	free(h->logits);
	free(h->w.toks);
	hyb_model_free(h->m);
}

int cmd_bench_hybrid(struct cli_opts *o)
{
	struct hbench h = { 0 };

	hbench_open(&h, o);
	for (int r = 0; r < o->reps; r++)
		hbench_round(&h, r);
	hbench_report(&h);
	hbench_free(&h);
	return 0;
}
