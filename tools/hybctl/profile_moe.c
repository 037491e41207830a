// SPDX-License-Identifier: MIT
/*
 * hybctl profile on a mixture-of-experts model: each prompt and the model's
 * own continuation (as for dense models, profile.c) through the routing
 * probe (hyb_ctx_set_moe_probe), and per layer the statistics that expert
 * placement and caching rest on (docs/MOE.md, "Routing profiles"):
 *
 *   skew     the hottest expert's share over the uniform one (max/mean), the
 *            share of the top 10% of experts, the Gini coefficient of the
 *            shares;
 *   reuse    P(an expert chosen at t is chosen at t+d), d = 1..8, next to
 *            K/E (uniform, independent) and sum f_e^2 / K (independent
 *            tokens with the observed popularity f_e); the distance back to
 *            an expert's previous choice in the sequence (mean, histogram);
 *   lift     P(i and j chosen together) / (f_i f_j) over pairs expected 10+
 *            times: the mean of the 10 highest, and the median;
 *   drift    Jaccard of the 2K most chosen experts of a generation's first
 *            and second half, and the hit rates of a cache of 2K experts per
 *            layer: static (the profile's 2K most popular: their share of
 *            all choices) and LRU (per sequence, from cold).
 *
 * Profile file (-o; general.architecture "hyb-moe-profile", general.name the
 * model's): hyb.moe_profile.version u32 1; .n_layer, .n_expert,
 * .n_expert_used, .n_seqs u32; .n_tokens u64 (tokens routed per layer);
 * per-layer f64[n_layer] arrays .max_mean, .top10_share, .gini, .reuse_indep,
 * .reuse_dist_mean, .lift_top, .lift_median, .drift_jaccard, .hit_static,
 * .hit_lru, and .reuse f64[n_layer * 8] (layer-major, d = 1..8), NaN where
 * there was no data; and tensors blk.L.expert_freq F32 [n_expert]: the
 * fraction of tokens that chose each expert in layer L (they sum to K).
 */
#include "profile_moe.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyb/generate.h"
#include "hyb/gguf.h"
#include "hyb/model.h"
#include "hyb/sampler.h"
#include "hyb/tensor_type.h"
#include "hybctl.h"

#define RING     8   /* reuse distances kept: 1..8 */
#define N_BUCKET 8   /* distance histogram: 1, 2, 3-4, 5-8, 9-16, 17-32, 33-64, 65+ */
#define LIFT_MIN 10.0 /* expected co-selections a pair needs for its lift to count */
#define LIFT_TOP 10

struct layer_acc {
	uint64_t *count;   /* [X] */
	uint32_t *co;      /* [X][X], i < j used */
	int32_t *ring;     /* [RING][K]: the sets of the last RING positions */
	int64_t *last;     /* [X]: position of the expert's last choice in this sequence */
	int32_t *lru;      /* [C], most recent first */
	uint32_t n_lru;
	int32_t *gen;      /* [gen][K]: this sequence's generated tokens' sets */
	uint32_t n_gen;
	uint64_t n_tok, reuse_hit[RING], reuse_n[RING];
	uint64_t dist_hist[N_BUCKET], dist_n, first;
	double dist_sum;
	uint64_t lru_hit, lru_n;
	double jac_sum;
	uint32_t jac_n;
};

struct moe_prof {
	uint32_t L, X, K, C, gen_cap, n_prompt, n_seqs;
	struct layer_acc *ly;
	int bad; /* the probe saw an impossible expert id or position */
};

/* Per-layer results. */
struct moe_stats {
	double max_mean, top10, gini, reuse[RING], chance, indep, dist_mean;
	double lift_top, lift_median, drift, hit_static, hit_lru;
	double dist_frac[N_BUCKET];
	float *freq; /* [X] */
};

static void probe(void *user, uint32_t layer, uint32_t pos0, uint32_t n, const int32_t *sel,
		  const float *w)
{
	struct moe_prof *p = user;
	struct layer_acc *a;
	const uint32_t K = p->K, X = p->X;

	(void)w;
	if (layer >= p->L) {
		p->bad = 1;
		return;
	}
	a = &p->ly[layer];
	for (uint32_t i = 0; i < n; i++) {
		const int32_t *S = sel + (size_t)i * K;
		const int64_t t = (int64_t)pos0 + i;
		int32_t *slot = a->ring + (size_t)(t % RING) * K;

		for (uint32_t k = 0; k < K; k++)
			if (S[k] < 0 || (uint32_t)S[k] >= X) {
				p->bad = 1;
				return;
			}
		a->n_tok++;
		for (uint32_t k = 0; k < K; k++) {
			const uint32_t e = (uint32_t)S[k];

			a->count[e]++;
			for (uint32_t k2 = 0; k2 < K; k2++)
				if ((uint32_t)S[k2] > e)
					a->co[(size_t)e * X + (uint32_t)S[k2]]++;
		}
		for (int64_t d = 1; d <= RING && d <= t; d++) {
			const int32_t *P = a->ring + (size_t)((t - d) % RING) * K;
			uint32_t hit = 0;

			for (uint32_t k = 0; k < K; k++)
				for (uint32_t k2 = 0; k2 < K; k2++)
					hit += S[k] == P[k2];
			a->reuse_hit[d - 1] += hit;
			a->reuse_n[d - 1] += K;
		}
		for (uint32_t k = 0; k < K; k++) {
			const uint32_t e = (uint32_t)S[k];
			uint32_t j, hit = 0;

			if (a->last[e] >= 0 && a->last[e] < t) {
				const int64_t d = t - a->last[e];
				int b = 0;

				while (b < N_BUCKET - 1 && d > (1 << b))
					b++;
				a->dist_hist[b]++;
				a->dist_sum += (double)d;
				a->dist_n++;
			} else if (a->last[e] < 0) {
				a->first++;
			}
			a->last[e] = t;
			for (j = 0; j < a->n_lru; j++)
				if (a->lru[j] == (int32_t)e) {
					hit = 1;
					break;
				}
			if (!hit && a->n_lru < p->C)
				j = a->n_lru++;
			else if (!hit)
				j = p->C - 1;
			memmove(a->lru + 1, a->lru, sizeof(int32_t) * j);
			a->lru[0] = (int32_t)e;
			a->lru_hit += hit;
			a->lru_n++;
		}
		memcpy(slot, S, sizeof(int32_t) * K);
		if (t >= p->n_prompt && a->n_gen < p->gen_cap)
			memcpy(a->gen + (size_t)a->n_gen++ * K, S, sizeof(int32_t) * K);
	}
}

static void begin_seq(struct moe_prof *p, uint32_t n_prompt)
{
	p->n_prompt = n_prompt;
	for (uint32_t l = 0; l < p->L; l++) {
		struct layer_acc *a = &p->ly[l];

		for (uint32_t e = 0; e < p->X; e++)
			a->last[e] = -1;
		a->n_lru = 0;
		a->n_gen = 0;
	}
}

/* The C most chosen experts of n sets (ties: lower index), as a mask. */
static void top_set(const struct moe_prof *p, const int32_t *sets, uint32_t n, uint32_t *cnt,
		    uint8_t *mask)
{
	memset(cnt, 0, sizeof(uint32_t) * p->X);
	memset(mask, 0, p->X);
	for (uint32_t i = 0; i < n * p->K; i++)
		cnt[sets[i]]++;
	for (uint32_t c = 0; c < p->C; c++) {
		uint32_t best = UINT32_MAX;

		for (uint32_t e = 0; e < p->X; e++)
			if (!mask[e] && (best == UINT32_MAX || cnt[e] > cnt[best]))
				best = e;
		mask[best] = 1;
	}
}

/* Drift of the sequence just generated: its two halves' top-C sets. */
static int end_seq(struct moe_prof *p)
{
	uint32_t *cnt = malloc(sizeof(uint32_t) * p->X);
	uint8_t *m0 = malloc(p->X), *m1 = malloc(p->X);

	if (!cnt || !m0 || !m1) {
		free(cnt);
		free(m0);
		free(m1);
		return -1;
	}
	p->n_seqs++;
	for (uint32_t l = 0; l < p->L; l++) {
		struct layer_acc *a = &p->ly[l];
		const uint32_t h = a->n_gen / 2;
		uint32_t in = 0, un = 0;

		if (h < 2)
			continue;
		top_set(p, a->gen, h, cnt, m0);
		top_set(p, a->gen + (size_t)h * p->K, a->n_gen - h, cnt, m1);
		for (uint32_t e = 0; e < p->X; e++) {
			in += m0[e] && m1[e];
			un += m0[e] || m1[e];
		}
		a->jac_sum += (double)in / un;
		a->jac_n++;
	}
	free(cnt);
	free(m0);
	free(m1);
	return 0;
}

static int cmp_double_desc(const void *a, const void *b)
{
	const double x = *(const double *)a, y = *(const double *)b;

	return x < y ? 1 : x > y ? -1 : 0;
}

static int layer_stats(const struct moe_prof *p, const struct layer_acc *a, struct moe_stats *s)
{
	const uint32_t X = p->X, K = p->K;
	const double n = (double)a->n_tok;
	double *sh = malloc(sizeof(double) * X), *lifts = NULL, gi = 0, ind = 0;
	size_t n_lift = 0;

	s->freq = malloc(sizeof(float) * X);
	if (!sh || !s->freq)
		goto oom;
	for (uint32_t e = 0; e < X; e++) {
		s->freq[e] = n ? (float)(a->count[e] / n) : 0.0f;
		sh[e] = n ? a->count[e] / (n * K) : 0;
		ind += (double)s->freq[e] * s->freq[e];
	}
	qsort(sh, X, sizeof(double), cmp_double_desc);
	s->max_mean = n ? sh[0] * X : NAN;
	s->top10 = 0;
	for (uint32_t e = 0; e < (X + 9) / 10; e++)
		s->top10 += sh[e];
	s->hit_static = 0;
	for (uint32_t e = 0; e < p->C; e++)
		s->hit_static += sh[e];
	for (uint32_t e = 0; e < X; e++) /* descending order: rank X - e ascending */
		gi += (double)(X - e) * sh[e];
	s->gini = n ? 2 * gi / X - (X + 1.0) / X : NAN;
	if (!n)
		s->top10 = s->hit_static = NAN;
	s->chance = (double)K / X;
	s->indep = n ? ind / K : NAN;
	for (int d = 0; d < RING; d++)
		s->reuse[d] = a->reuse_n[d] ? (double)a->reuse_hit[d] / a->reuse_n[d] : NAN;
	s->dist_mean = a->dist_n ? a->dist_sum / a->dist_n : NAN;
	for (int b = 0; b < N_BUCKET; b++)
		s->dist_frac[b] = a->dist_n ? (double)a->dist_hist[b] / a->dist_n : NAN;
	lifts = malloc(sizeof(double) * ((size_t)X * (X - 1) / 2 + 1));
	if (!lifts)
		goto oom;
	for (uint32_t i = 0; i < X; i++)
		for (uint32_t j = i + 1; j < X; j++) {
			const double ex = n ? (a->count[i] / n) * (a->count[j] / n) * n : 0;

			if (ex >= LIFT_MIN)
				lifts[n_lift++] = a->co[(size_t)i * X + j] / ex;
		}
	qsort(lifts, n_lift, sizeof(double), cmp_double_desc);
	s->lift_top = s->lift_median = NAN;
	if (n_lift) {
		double t = 0;
		size_t top = n_lift < LIFT_TOP ? n_lift : LIFT_TOP;

		for (size_t i = 0; i < top; i++)
			t += lifts[i];
		s->lift_top = t / top;
		s->lift_median = lifts[n_lift / 2];
	}
	s->drift = a->jac_n ? a->jac_sum / a->jac_n : NAN;
	s->hit_lru = a->lru_n ? (double)a->lru_hit / a->lru_n : NAN;
	free(sh);
	free(lifts);
	return 0;
oom:
	free(sh);
	free(lifts);
	return -1;
}

static const char *fmt(char *buf, double v, int digits)
{
	if (isnan(v))
		return "-";
	snprintf(buf, 24, "%.*f", digits, v);
	return buf;
}

static double mean_of(const struct moe_stats *s, uint32_t L, size_t off)
{
	double t = 0;
	uint32_t n = 0;

	for (uint32_t l = 0; l < L; l++) {
		double v = *(const double *)((const char *)&s[l] + off);

		if (!isnan(v)) {
			t += v;
			n++;
		}
	}
	return n ? t / n : NAN;
}

#define MEAN(f) mean_of(st, p->L, offsetof(struct moe_stats, f))

static void print_table(const struct moe_prof *p, const struct moe_stats *st)
{
	char b[16][24];

	printf("layer  max/mean  top10%%  gini   reuse_d1 d2    d4    d8    (indep  chance)"
	       "  dist  lift_top  median  drift  hit_static  hit_lru\n");
	for (uint32_t l = 0; l < p->L; l++) {
		const struct moe_stats *s = &st[l];

		printf("%5u  %8s  %6s  %5s  %8s %5s %5s %5s  (%5s  %6s)  %4s  %8s  %6s  %5s  %10s"
		       "  %7s\n", l, fmt(b[0], s->max_mean, 2), fmt(b[1], s->top10, 3),
		       fmt(b[2], s->gini, 3), fmt(b[3], s->reuse[0], 3), fmt(b[4], s->reuse[1], 3),
		       fmt(b[5], s->reuse[3], 3), fmt(b[6], s->reuse[7], 3),
		       fmt(b[7], s->indep, 3), fmt(b[8], s->chance, 3), fmt(b[9], s->dist_mean, 1),
		       fmt(b[10], s->lift_top, 2), fmt(b[11], s->lift_median, 2),
		       fmt(b[12], s->drift, 3), fmt(b[13], s->hit_static, 3),
		       fmt(b[14], s->hit_lru, 3));
	}
	printf("model: %u of %u experts per token; mean over layers: hottest %sx the uniform "
	       "share, top 10%% take %s, gini %s; reuse at d=1 %s (chance %s, independent "
	       "tokens %s); top-pair lift %s (median %s); drift jaccard %s; cache of %u: "
	       "static %s, LRU %s\n", p->K, p->X, fmt(b[0], MEAN(max_mean), 2),
	       fmt(b[1], MEAN(top10), 3), fmt(b[2], MEAN(gini), 3), fmt(b[3], MEAN(reuse[0]), 3),
	       fmt(b[4], MEAN(chance), 3), fmt(b[5], MEAN(indep), 3), fmt(b[6], MEAN(lift_top), 2),
	       fmt(b[7], MEAN(lift_median), 2), fmt(b[8], MEAN(drift), 3), p->C,
	       fmt(b[9], MEAN(hit_static), 3), fmt(b[10], MEAN(hit_lru), 3));
}

static void json_num(double v)
{
	if (isnan(v))
		printf("null");
	else
		printf("%.6g", v);
}

static void json_arr(const struct moe_prof *p, const struct moe_stats *st, const char *key,
		     size_t off, int n)
{
	printf("  \"%s\": [", key);
	for (uint32_t l = 0; l < p->L; l++) {
		const double *v = (const double *)((const char *)&st[l] + off);

		printf(l ? ", " : "");
		if (n > 1)
			printf("[");
		for (int i = 0; i < n; i++) {
			printf(i ? ", " : "");
			json_num(v[i]);
		}
		if (n > 1)
			printf("]");
	}
	printf("],\n");
}

static void print_json(const struct moe_prof *p, const struct moe_stats *st, const char *name,
		       uint64_t n_tok, double seconds)
{
	printf("{\n  \"model\": ");
	ctl_json_str(stdout, name);
	printf(",\n  \"n_layer\": %u, \"n_expert\": %u, \"n_expert_used\": %u, \"cache\": %u,\n",
	       p->L, p->X, p->K, p->C);
	printf("  \"n_tokens\": %llu, \"n_seqs\": %u, \"seconds\": %.3f,\n",
	       (unsigned long long)n_tok, p->n_seqs, seconds);
#define ARR(f, n) json_arr(p, st, #f, offsetof(struct moe_stats, f), n)
	ARR(max_mean, 1);
	ARR(top10, 1);
	ARR(gini, 1);
	ARR(reuse, RING);
	ARR(chance, 1);
	ARR(indep, 1);
	ARR(dist_mean, 1);
	ARR(dist_frac, N_BUCKET);
	ARR(lift_top, 1);
	ARR(lift_median, 1);
	ARR(drift, 1);
	ARR(hit_static, 1);
	ARR(hit_lru, 1);
#undef ARR
	printf("  \"expert_freq\": [");
	for (uint32_t l = 0; l < p->L; l++) {
		printf(l ? ", [" : "[");
		for (uint32_t e = 0; e < p->X; e++)
			printf(e ? ", %.6g" : "%.6g", (double)st[l].freq[e]);
		printf("]");
	}
	printf("],\n  \"summary\": {\"max_mean\": ");
	json_num(MEAN(max_mean));
	printf(", \"top10\": ");
	json_num(MEAN(top10));
	printf(", \"reuse_d1\": ");
	json_num(MEAN(reuse[0]));
	printf(", \"indep\": ");
	json_num(MEAN(indep));
	printf(", \"lift_top\": ");
	json_num(MEAN(lift_top));
	printf(", \"drift\": ");
	json_num(MEAN(drift));
	printf(", \"hit_static\": ");
	json_num(MEAN(hit_static));
	printf(", \"hit_lru\": ");
	json_num(MEAN(hit_lru));
	printf("}\n}\n");
}

static int save(const struct moe_prof *p, const struct moe_stats *st, const char *name,
		uint64_t n_tok, const char *path)
{
	struct hyb_gguf_writer *w = hyb_gguf_writer_new();
	double *v = malloc(sizeof(double) * p->L * RING);
	int rc = -1;

	if (!w || !v) {
		fprintf(stderr, "hybctl profile: out of memory\n");
		goto out;
	}
	hyb_gguf_set_str(w, "general.architecture", "hyb-moe-profile");
	hyb_gguf_set_str(w, "general.name", name);
	hyb_gguf_set_u32(w, "hyb.moe_profile.version", 1);
	hyb_gguf_set_u32(w, "hyb.moe_profile.n_layer", p->L);
	hyb_gguf_set_u32(w, "hyb.moe_profile.n_expert", p->X);
	hyb_gguf_set_u32(w, "hyb.moe_profile.n_expert_used", p->K);
	hyb_gguf_set_u32(w, "hyb.moe_profile.n_seqs", p->n_seqs);
	hyb_gguf_set_u64(w, "hyb.moe_profile.n_tokens", n_tok);
#define ARR(key, f)                                                                    \
	do {                                                                           \
		for (uint32_t l = 0; l < p->L; l++)                                    \
			v[l] = st[l].f;                                                \
		hyb_gguf_set_arr(w, "hyb.moe_profile." key, HYB_GGUF_VT_FLOAT64, v, p->L); \
	} while (0)
	ARR("max_mean", max_mean);
	ARR("top10_share", top10);
	ARR("gini", gini);
	ARR("reuse_indep", indep);
	ARR("reuse_dist_mean", dist_mean);
	ARR("lift_top", lift_top);
	ARR("lift_median", lift_median);
	ARR("drift_jaccard", drift);
	ARR("hit_static", hit_static);
	ARR("hit_lru", hit_lru);
#undef ARR
	for (uint32_t l = 0; l < p->L; l++)
		memcpy(v + (size_t)l * RING, st[l].reuse, sizeof(double) * RING);
	hyb_gguf_set_arr(w, "hyb.moe_profile.reuse", HYB_GGUF_VT_FLOAT64, v, (uint64_t)p->L * RING);
	for (uint32_t l = 0; l < p->L; l++) {
		char nm[64];
		const uint64_t ne[1] = { p->X };

		snprintf(nm, sizeof(nm), "blk.%u.expert_freq", l);
		if (hyb_gguf_writer_add_tensor(w, nm, HYB_TYPE_F32, 1, ne, st[l].freq)) {
			fprintf(stderr, "hybctl profile: %s\n", hyb_last_error());
			goto out;
		}
	}
	if (hyb_gguf_writer_write_file(w, path)) {
		fprintf(stderr, "hybctl profile: %s\n", hyb_last_error());
		goto out;
	}
	rc = 0;
out:
	free(v);
	hyb_gguf_writer_free(w);
	return rc;
}

static void prof_free(struct moe_prof *p)
{
	for (uint32_t l = 0; p->ly && l < p->L; l++) {
		struct layer_acc *a = &p->ly[l];

		free(a->count);
		free(a->co);
		free(a->ring);
		free(a->last);
		free(a->lru);
		free(a->gen);
	}
	free(p->ly);
}

static int prof_init(struct moe_prof *p, const struct hyb_hparams *hp, uint32_t gen)
{
	p->L = hp->n_layer;
	p->X = hp->n_expert;
	p->K = hp->n_expert_used;
	p->C = 2 * p->K < p->X ? 2 * p->K : p->X; /* a cache of ~2x the active experts */
	p->gen_cap = gen;
	p->ly = calloc(p->L, sizeof(*p->ly));
	if (!p->ly)
		return -1;
	for (uint32_t l = 0; l < p->L; l++) {
		struct layer_acc *a = &p->ly[l];

		a->count = calloc(p->X, sizeof(*a->count));
		a->co = calloc((size_t)p->X * p->X, sizeof(*a->co));
		a->ring = calloc((size_t)RING * p->K, sizeof(*a->ring));
		a->last = calloc(p->X, sizeof(*a->last));
		a->lru = calloc(p->C, sizeof(*a->lru));
		a->gen = calloc((size_t)(gen ? gen : 1) * p->K, sizeof(*a->gen));
		if (!a->count || !a->co || !a->ring || !a->last || !a->lru || !a->gen)
			return -1;
	}
	return 0;
}

int profile_moe(const struct hyb_model *m, const struct profile_moe_opts *o, int32_t *const *ids,
		const int *n_ids, uint32_t n_prompts)
{
	struct hyb_ctx_params cp = { .n_threads = o->threads };
	struct moe_prof p = { 0 };
	struct moe_stats *st = NULL;
	struct hyb_ctx *ctx = NULL;
	char name[128] = "";
	int longest = 0, rc = 1;
	uint64_t n_tok;
	double t0;

	for (uint32_t i = 0; i < n_prompts; i++)
		longest = n_ids[i] > longest ? n_ids[i] : longest;
	if ((uint64_t)longest + o->gen > m->hp.n_ctx_train) {
		fprintf(stderr, "hybctl profile: a prompt of %d tokens + %u generated exceed the "
			"model's context of %u\n", longest, o->gen, m->hp.n_ctx_train);
		return 1;
	}
	cp.n_ctx = (uint32_t)longest + o->gen + 1;
	if (cp.n_ctx > m->hp.n_ctx_train)
		cp.n_ctx = m->hp.n_ctx_train;
	if (prof_init(&p, &m->hp, o->gen)) {
		fprintf(stderr, "hybctl profile: out of memory\n");
		goto out;
	}
	ctx = hyb_ctx_new(m, &cp);
	if (!ctx) {
		fprintf(stderr, "hybctl profile: %s\n", hyb_last_error());
		goto out;
	}
	if (!hyb_gguf_get_str(m->gguf, "general.name", name, sizeof(name)))
		snprintf(name, sizeof(name), "%s", o->model);
	hyb_ctx_set_moe_probe(ctx, probe, &p);
	t0 = hyb_now();
	for (uint32_t i = 0; i < n_prompts; i++) {
		struct hyb_sampler_params sp = hyb_sampler_defaults();
		struct hyb_sampler *s;
		struct hyb_gen_stats gs;
		int err;

		/* the model's own distribution, tempered, as the dense profile samples it */
		sp.temperature = o->temp;
		sp.top_k = 0;
		sp.top_p = 1.0f;
		sp.min_p = 0.0f;
		sp.repeat_penalty = 1.0f;
		sp.seed = o->seed + i;
		s = hyb_sampler_new(&sp, (int32_t)m->hp.n_vocab);
		if (!s) {
			fprintf(stderr, "hybctl profile: %s\n", hyb_last_error());
			goto out;
		}
		hyb_ctx_reset(ctx);
		begin_seq(&p, (uint32_t)n_ids[i]);
		err = hyb_generate(ctx, m, s, ids[i], (uint32_t)n_ids[i], o->gen, NULL, NULL, &gs);
		hyb_sampler_free(s);
		if (err) {
			fprintf(stderr, "hybctl profile: prompt %u: %s\n", i + 1, hyb_last_error());
			goto out;
		}
		if (p.bad) {
			fprintf(stderr, "hybctl profile: the routing probe reported an expert or "
				"layer out of range\n");
			goto out;
		}
		if (end_seq(&p)) {
			fprintf(stderr, "hybctl profile: out of memory\n");
			goto out;
		}
	}
	hyb_ctx_set_moe_probe(ctx, NULL, NULL);
	t0 = hyb_now() - t0;
	st = calloc(p.L, sizeof(*st));
	if (!st) {
		fprintf(stderr, "hybctl profile: out of memory\n");
		goto out;
	}
	for (uint32_t l = 0; l < p.L; l++)
		if (layer_stats(&p, &p.ly[l], &st[l])) {
			fprintf(stderr, "hybctl profile: out of memory\n");
			goto out;
		}
	/* the first MoE layer's count (DeepSeek's and GLM's first layers are dense) */
	n_tok = 0;
	for (uint32_t l = 0; l < p.L && !n_tok; l++)
		n_tok = p.ly[l].n_tok;
	fprintf(stderr, "hybctl profile: %s: %u prompts, %llu tokens routed in %.2f s "
		"(%.1f tokens/s), mixture of %u experts (%u per token)\n", o->model, n_prompts,
		(unsigned long long)n_tok, t0, n_tok / t0, p.X, p.K);
	if (o->json)
		print_json(&p, st, name, n_tok, t0);
	else
		print_table(&p, st);
	if (o->out && save(&p, st, name, n_tok, o->out))
		goto out;
	rc = 0;
out:
	for (uint32_t l = 0; st && l < p.L; l++)
		free(st[l].freq);
	free(st);
	hyb_ctx_free(ctx);
	prof_free(&p);
	return rc;
}
