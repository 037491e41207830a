// SPDX-License-Identifier: MIT
/*
 * Activation profiles (hyb/profile.h): the collector fed by the forward
 * pass's FFN probe, the statistics hybctl profile prints, and the GGUF file
 * hybctl plan reads.
 *
 * File format (general.architecture = "hyb-profile", general.name = the
 * profiled model's name):
 *   hyb.profile.version         u32  1
 *   hyb.profile.n_layer, .n_embd, .n_ff, .n_samples, .n_seqs      u32
 *   hyb.profile.n_tokens        u64
 *   hyb.profile.seq_start       u32[n_seqs]      (absent when n_seqs == 0)
 *   hyb.profile.sparsity, .hot_share_80, .jaccard_adjacent, .cos_next,
 *   .coact_lift, .coact_lift_random              f64[n_layer]
 *   hyb.profile.reactivation    f64[n_layer * 8] (layer-major, d = 1..8)
 * Tensors, for each layer N:
 *   blk.N.count   I64 [n_ff]                     activation counts
 *   blk.N.active  I64 [active_words, n_samples]  bitsets (bit i of word i/64)
 *   blk.N.input   F16 [n_embd, n_samples]        predictor inputs
 * (active and input only when n_samples > 0). I64 holds the uint64 values
 * bit for bit.
 */
#include "hyb/profile.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "hyb/gguf.h"
#include "hyb/sparsity.h"
#include "hyb/tensor_type.h"
#include "util/error.h"

#define TYPE_I64 27u /* ggml's GGML_TYPE_I64 */
#define N_REACT 8
#define COLD_SHARE 0.7    /* KAIROX 6: the bottom 70% by frequency */
#define LIFT_NEURONS 256
#define LIFT_PARTNERS 8
#define LIFT_MIN_ACTIVE 8 /* samples a neuron needs to take part in the lift */

#define MAX_LAYERS (1u << 12)
#define MAX_EMBD (1u << 20)
#define MAX_FF (1u << 24)

static uint32_t words_of(uint32_t n_ff)
{
	return (n_ff + 63) / 64;
}

void hyb_profile_free(struct hyb_profile *p)
{
	if (!p)
		return;
	for (uint32_t l = 0; p->layers && l < p->n_layer; l++) {
		free(p->layers[l].count);
		free(p->layers[l].active);
		free(p->layers[l].input);
	}
	free(p->layers);
	free(p->seq_start);
	free(p->cats_threshold);
	free(p->cats_quantiles);
	free(p);
}

/* An empty profile with every array allocated for `samples` samples. */
static struct hyb_profile *profile_alloc(uint32_t n_layer, uint32_t n_embd, uint32_t n_ff,
					 uint32_t samples, uint32_t n_seqs)
{
	struct hyb_profile *p = calloc(1, sizeof(*p));
	uint32_t words = words_of(n_ff);

	if (!p)
		return NULL;
	p->n_layer = n_layer;
	p->n_embd = n_embd;
	p->n_ff = n_ff;
	p->active_words = words;
	p->layers = calloc(n_layer, sizeof(*p->layers));
	p->seq_start = malloc(sizeof(uint32_t) * (n_seqs ? n_seqs : 1));
	if (!p->layers || !p->seq_start)
		goto fail;
	for (uint32_t l = 0; l < n_layer; l++) {
		struct hyb_profile_layer *ly = &p->layers[l];

		ly->count = calloc(n_ff, sizeof(uint64_t));
		/* large callocs are fresh zero pages: untouched samples cost nothing */
		ly->active = calloc((size_t)(samples ? samples : 1) * words, sizeof(uint64_t));
		ly->input = malloc(sizeof(uint16_t) * (size_t)(samples ? samples : 1) * n_embd);
		if (!ly->count || !ly->active || !ly->input)
			goto fail;
		ly->cos_next = NAN;
	}
	return p;
fail:
	hyb_profile_free(p);
	return NULL;
}

/* ---- statistics -------------------------------------------------------- */

static int cmp_u64_desc(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? 1 : x > y ? -1 : 0;
}

static int cmp_u64_asc(const void *a, const void *b)
{
	return -cmp_u64_desc(a, b);
}

/* Fraction of n neurons (counts c, copied and sorted) that covers 80%. */
static double hot_share(uint64_t *sorted, size_t n)
{
	uint64_t total = 0, run = 0;
	size_t k = 0;

	for (size_t i = 0; i < n; i++)
		total += sorted[i];
	if (!total)
		return NAN;
	qsort(sorted, n, sizeof(*sorted), cmp_u64_desc);
	while (k < n && (double)run < 0.8 * (double)total)
		run += sorted[k++];
	return (double)k / (double)n;
}

static const uint64_t *sample_bits(const struct hyb_profile *p, uint32_t l, uint32_t s)
{
	return p->layers[l].active + (size_t)s * p->active_words;
}

static double jaccard_adjacent(const struct hyb_profile *p, uint32_t l, const uint32_t *seq)
{
	double sum = 0;
	uint64_t n = 0;

	for (uint32_t s = 0; s + 1 < p->n_samples; s++) {
		const uint64_t *a = sample_bits(p, l, s), *b = sample_bits(p, l, s + 1);
		uint64_t inter = 0, uni = 0;

		if (seq[s] != seq[s + 1])
			continue;
		for (uint32_t w = 0; w < p->active_words; w++) {
			inter += (uint64_t)__builtin_popcountll(a[w] & b[w]);
			uni += (uint64_t)__builtin_popcountll(a[w] | b[w]);
		}
		if (uni) {
			sum += 1.0 - (double)inter / (double)uni;
			n++;
		}
	}
	return n ? sum / (double)n : NAN;
}

static int reactivation(const struct hyb_profile *p, uint32_t l, const uint32_t *seq,
			double out[N_REACT])
{
	const struct hyb_profile_layer *ly = &p->layers[l];
	uint32_t n_cold = (uint32_t)(COLD_SHARE * p->n_ff);
	uint64_t *key = malloc(sizeof(uint64_t) * p->n_ff);
	uint64_t *cold = calloc(p->active_words, sizeof(uint64_t));
	uint64_t hits[N_REACT] = { 0 }, opp[N_REACT] = { 0 };

	if (!key || !cold) {
		free(key);
		free(cold);
		return -1;
	}
	/* coldest first, ties by index: count in the high bits (n_ff < 2^24) */
	for (uint32_t i = 0; i < p->n_ff; i++) {
		uint64_t c = ly->count[i] < (1ull << 40) ? ly->count[i] : (1ull << 40) - 1;

		key[i] = c << 24 | i;
	}
	qsort(key, p->n_ff, sizeof(*key), cmp_u64_asc);
	for (uint32_t k = 0; k < n_cold; k++) {
		uint32_t i = (uint32_t)(key[k] & 0xffffff);

		cold[i / 64] |= 1ull << (i % 64);
	}
	for (uint32_t s = 0; s < p->n_samples; s++) {
		const uint64_t *a = sample_bits(p, l, s);
		uint64_t base = 0;

		for (uint32_t w = 0; w < p->active_words; w++)
			base += (uint64_t)__builtin_popcountll(a[w] & cold[w]);
		if (!base)
			continue;
		for (uint32_t d = 1; d <= N_REACT && s + d < p->n_samples; d++) {
			const uint64_t *b = sample_bits(p, l, s + d);

			if (seq[s + d] != seq[s])
				break;
			opp[d - 1] += base;
			for (uint32_t w = 0; w < p->active_words; w++)
				hits[d - 1] +=
					(uint64_t)__builtin_popcountll(a[w] & b[w] & cold[w]);
		}
	}
	for (int d = 0; d < N_REACT; d++)
		out[d] = opp[d] ? (double)hits[d] / (double)opp[d] : NAN;
	free(key);
	free(cold);
	return 0;
}

static uint64_t mix64(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ull;
	return x ^ (x >> 33);
}

/*
 * Co-activation lift (definition in profile.h). n_ij for one neuron i comes
 * from walking the samples where i is active: nothing of size n_ff^2.
 */
static int coact_lift(const struct hyb_profile *p, uint32_t l, double *top, double *rnd)
{
	const uint32_t F = p->n_ff, S = p->n_samples;
	uint32_t *c = calloc(F, sizeof(uint32_t)), *nij = malloc(sizeof(uint32_t) * F);
	uint32_t *cand = malloc(sizeof(uint32_t) * F), n_cand = 0, n_pick;
	double sum_top = 0, sum_rnd = 0;
	uint64_t n_top = 0, n_rnd = 0;

	*top = *rnd = NAN;
	if (!c || !nij || !cand) {
		free(c);
		free(nij);
		free(cand);
		return -1;
	}
	for (uint32_t s = 0; s < S; s++) {
		const uint64_t *a = sample_bits(p, l, s);

		for (uint32_t w = 0; w < p->active_words; w++)
			for (uint64_t b = a[w]; b; b &= b - 1)
				c[w * 64 + (uint32_t)__builtin_ctzll(b)]++;
	}
	for (uint32_t i = 0; i < F; i++)
		if (c[i] >= LIFT_MIN_ACTIVE)
			cand[n_cand++] = i;
	n_pick = n_cand < LIFT_NEURONS ? n_cand : LIFT_NEURONS;
	for (uint32_t k = 0; n_cand >= 2 && k < n_pick; k++) {
		uint32_t i = cand[(uint64_t)k * n_cand / n_pick];
		uint32_t best[LIFT_PARTNERS];
		double best_ex[LIFT_PARTNERS];
		int nb = 0;

		memset(nij, 0, sizeof(uint32_t) * F);
		for (uint32_t s = 0; s < S; s++) {
			const uint64_t *a = sample_bits(p, l, s);

			if (!((a[i / 64] >> (i % 64)) & 1))
				continue;
			for (uint32_t w = 0; w < p->active_words; w++)
				for (uint64_t b = a[w]; b; b &= b - 1)
					nij[w * 64 + (uint32_t)__builtin_ctzll(b)]++;
		}
		for (uint32_t q = 0; q < n_cand; q++) {
			uint32_t j = cand[q];
			double ex = (double)nij[j] * S - (double)c[i] * c[j];
			int at;

			if (j == i || (nb == LIFT_PARTNERS && ex <= best_ex[nb - 1]))
				continue;
			at = nb < LIFT_PARTNERS ? nb++ : nb - 1;
			while (at > 0 && best_ex[at - 1] < ex) {
				best_ex[at] = best_ex[at - 1];
				best[at] = best[at - 1];
				at--;
			}
			best_ex[at] = ex;
			best[at] = j;
		}
		for (int b = 0; b < nb; b++, n_top++)
			sum_top += (double)nij[best[b]] * S / ((double)c[i] * c[best[b]]);
		for (uint32_t r = 0; r < LIFT_PARTNERS; r++) {
			uint32_t j = cand[mix64((uint64_t)i << 32 | r) % n_cand];

			if (j == i)
				continue;
			sum_rnd += (double)nij[j] * S / ((double)c[i] * c[j]);
			n_rnd++;
		}
	}
	if (n_top)
		*top = sum_top / (double)n_top;
	if (n_rnd)
		*rnd = sum_rnd / (double)n_rnd;
	free(c);
	free(nij);
	free(cand);
	return 0;
}

int hyb_profile_stats(struct hyb_profile *p)
{
	uint32_t *seq = malloc(sizeof(uint32_t) * (p->n_samples ? p->n_samples : 1));
	uint64_t *sorted = malloc(sizeof(uint64_t) * p->n_ff);
	int rc = -ENOMEM;

	if (!seq || !sorted)
		goto out;
	/* sequence id of every sample (samples before the first start: none) */
	for (uint32_t s = 0, q = 0; s < p->n_samples; s++) {
		while (q < p->n_seqs && p->seq_start[q] <= s)
			q++;
		seq[s] = q;
	}
	for (uint32_t l = 0; l < p->n_layer; l++) {
		struct hyb_profile_layer *ly = &p->layers[l];
		uint64_t total = 0;

		for (uint32_t i = 0; i < p->n_ff; i++)
			total += ly->count[i];
		ly->sparsity = p->n_tokens ? 1.0 - (double)total / ((double)p->n_tokens * p->n_ff)
					   : NAN;
		memcpy(sorted, ly->count, sizeof(uint64_t) * p->n_ff);
		ly->hot_share_80 = hot_share(sorted, p->n_ff);
		ly->jaccard_adjacent = jaccard_adjacent(p, l, seq);
		if (reactivation(p, l, seq, ly->reactivation) ||
		    coact_lift(p, l, &ly->coact_lift, &ly->coact_lift_random))
			goto out;
	}
	rc = 0;
out:
	free(seq);
	free(sorted);
	if (rc)
		hyb_error_set(rc, "out of memory for the statistics of a profile of %u samples, "
			      "n_ff %u", p->n_samples, p->n_ff);
	return rc;
}

void hyb_profile_summarize(const struct hyb_profile *p, struct hyb_profile_summary *s)
{
	double n_sp = 0, n_j = 0, n_l = 0;
	size_t all = (size_t)p->n_layer * p->n_ff;
	uint64_t *counts = malloc(sizeof(uint64_t) * (all ? all : 1));

	memset(s, 0, sizeof(*s));
	s->cos_next_min = s->reactivation_cold_max = NAN;
	for (uint32_t l = 0; l < p->n_layer; l++) {
		const struct hyb_profile_layer *ly = &p->layers[l];

		if (!isnan(ly->sparsity)) {
			s->sparsity += ly->sparsity;
			n_sp++;
		}
		if (!isnan(ly->jaccard_adjacent)) {
			s->jaccard_adjacent += ly->jaccard_adjacent;
			n_j++;
		}
		if (!isnan(ly->coact_lift) && !isnan(ly->coact_lift_random)) {
			s->coact_lift += ly->coact_lift;
			s->coact_lift_random += ly->coact_lift_random;
			n_l++;
		}
		if (!isnan(ly->cos_next) && !(ly->cos_next >= s->cos_next_min))
			s->cos_next_min = ly->cos_next;
		for (int d = 3; d <= N_REACT; d++)
			if (!isnan(ly->reactivation[d - 1]) &&
			    !(ly->reactivation[d - 1] <= s->reactivation_cold_max))
				s->reactivation_cold_max = ly->reactivation[d - 1];
		if (counts)
			memcpy(counts + (size_t)l * p->n_ff, ly->count, sizeof(uint64_t) * p->n_ff);
	}
	s->sparsity = n_sp ? s->sparsity / n_sp : NAN;
	s->jaccard_adjacent = n_j ? s->jaccard_adjacent / n_j : NAN;
	s->coact_lift = n_l ? s->coact_lift / n_l : NAN;
	s->coact_lift_random = n_l ? s->coact_lift_random / n_l : NAN;
	s->hot_share_80 = counts && all ? hot_share(counts, all) : NAN;
	free(counts);
}

/* ---- collector ----------------------------------------------------------- */

struct hyb_profile_collector {
	struct hyb_profile *p;
	uint32_t max_samples, seq_cap;
	uint32_t seq_quota, seq_taken;
	bool new_seq;
	uint32_t batch_first, batch_sampled, batch_n;
	float *prev;          /* x_attn of the layer before, for the batch in flight */
	size_t prev_cap;      /* floats */
	int64_t prev_layer;
	double *cos_sum;
	uint64_t *cos_n;
	bool failed;
};

struct hyb_profile_collector *hyb_profile_collector_new(uint32_t n_layer, uint32_t n_embd,
							uint32_t n_ff, uint32_t max_samples,
							const char *model_name)
{
	struct hyb_profile_collector *c;

	if (!n_layer || n_layer > MAX_LAYERS || !n_embd || n_embd > MAX_EMBD || !n_ff ||
	    n_ff > MAX_FF) {
		hyb_error_set(-EINVAL, "cannot profile a model of %u layers, n_embd %u, n_ff %u",
			      n_layer, n_embd, n_ff);
		return NULL;
	}
	c = calloc(1, sizeof(*c));
	if (!c)
		goto oom;
	c->max_samples = max_samples;
	c->seq_cap = 64;
	c->prev_layer = -1;
	c->p = profile_alloc(n_layer, n_embd, n_ff, max_samples, c->seq_cap);
	c->cos_sum = calloc(n_layer, sizeof(double));
	c->cos_n = calloc(n_layer, sizeof(uint64_t));
	if (!c->p || !c->cos_sum || !c->cos_n)
		goto oom;
	snprintf(c->p->model_name, sizeof(c->p->model_name), "%s", model_name ? model_name : "");
	return c;
oom:
	hyb_profile_collector_free(c);
	hyb_error_set(-ENOMEM, "out of memory for a profile of %u samples (%.1f MiB of inputs)",
		      max_samples, 2.0 * max_samples * n_embd * n_layer / 1048576.0);
	return NULL;
}

void hyb_profile_collector_free(struct hyb_profile_collector *c)
{
	if (!c)
		return;
	hyb_profile_free(c->p);
	free(c->prev);
	free(c->cos_sum);
	free(c->cos_n);
	free(c);
}

void hyb_profile_collector_begin_seq(struct hyb_profile_collector *c, uint32_t seq_quota)
{
	c->seq_quota = seq_quota;
	c->seq_taken = 0;
	c->new_seq = true;
	c->prev_layer = -1;
}

/* Layer 0 opens a batch: count its tokens and pick which become samples. */
static void open_batch(struct hyb_profile_collector *c, uint32_t n)
{
	struct hyb_profile *p = c->p;
	uint32_t k = c->max_samples - p->n_samples;

	if (c->seq_quota && c->seq_quota - c->seq_taken < k)
		k = c->seq_quota - c->seq_taken;
	if (k > n)
		k = n;
	if (k && c->new_seq) {
		if (p->n_seqs == c->seq_cap) {
			uint32_t *ns = realloc(p->seq_start, sizeof(uint32_t) * c->seq_cap * 2);

			if (!ns) {
				c->failed = true;
				k = 0;
				goto out;
			}
			p->seq_start = ns;
			c->seq_cap *= 2;
		}
		p->seq_start[p->n_seqs++] = p->n_samples;
		c->new_seq = false;
	}
out:
	p->n_tokens += n;
	c->batch_first = p->n_samples;
	c->batch_sampled = k;
	c->batch_n = n;
	p->n_samples += k;
	c->seq_taken += k;
	if (c->prev_cap < (size_t)n * p->n_embd) {
		float *np = realloc(c->prev, sizeof(float) * n * p->n_embd);

		if (!np) {
			c->failed = true;
			return;
		}
		c->prev = np;
		c->prev_cap = (size_t)n * p->n_embd;
	}
}

static void store_input(const struct hyb_profile *p, uint32_t layer, uint32_t sample,
			const float *x)
{
	uint16_t *dst = p->layers[layer].input + (size_t)sample * p->n_embd;
	double ss = 0;
	float scale;

	for (uint32_t i = 0; i < p->n_embd; i++)
		ss += (double)x[i] * x[i];
	scale = ss > 0 ? (float)(1.0 / sqrt(ss / p->n_embd)) : 0.0f;
	for (uint32_t i = 0; i < p->n_embd; i++)
		dst[i] = hyb_f32_to_f16(x[i] * scale);
}

void hyb_profile_probe(void *user, uint32_t layer, uint32_t pos0, uint32_t n,
		       const float *x_attn, const float *act)
{
	struct hyb_profile_collector *c = user;
	struct hyb_profile *p = c->p;
	const uint32_t E = p->n_embd, F = p->n_ff;

	(void)pos0;
	if (c->failed || layer >= p->n_layer)
		return;
	if (layer == 0)
		open_batch(c, n);
	if (c->failed || n != c->batch_n)
		return;
	for (uint32_t t = 0; t < n; t++) {
		const float *a = act + (size_t)t * F;
		uint64_t *bits = t >= c->batch_sampled ? NULL :
			p->layers[layer].active +
			(size_t)(c->batch_first + t) * p->active_words;
		uint64_t *cnt = p->layers[layer].count;

		for (uint32_t i = 0; i < F; i++) {
			if (a[i] == 0.0f)
				continue;
			cnt[i]++;
			if (bits)
				bits[i / 64] |= 1ull << (i % 64);
		}
		if (bits) {
			const float *x = x_attn + (size_t)t * E;

			if (layer + 1 < p->n_layer)
				store_input(p, layer + 1, c->batch_first + t, x);
			if (layer == 0)
				store_input(p, 0, c->batch_first + t, x);
		}
	}
	if (layer > 0 && c->prev_layer == (int64_t)layer - 1) {
		for (uint32_t t = 0; t < n; t++) {
			const float *a = c->prev + (size_t)t * E, *b = x_attn + (size_t)t * E;
			double ab = 0, aa = 0, bb = 0;

			for (uint32_t i = 0; i < E; i++) {
				ab += (double)a[i] * b[i];
				aa += (double)a[i] * a[i];
				bb += (double)b[i] * b[i];
			}
			if (aa > 0 && bb > 0) {
				c->cos_sum[layer - 1] += ab / sqrt(aa * bb);
				c->cos_n[layer - 1]++;
			}
		}
	}
	memcpy(c->prev, x_attn, sizeof(float) * n * E);
	c->prev_layer = layer;
}

struct hyb_profile *hyb_profile_collector_finish(struct hyb_profile_collector *c)
{
	struct hyb_profile *p = c->p;
	uint32_t S = p->n_samples;

	if (c->failed) {
		hyb_profile_collector_free(c);
		hyb_error_set(-ENOMEM, "out of memory while collecting the profile");
		return NULL;
	}
	/* give back what the unused samples reserved */
	for (uint32_t l = 0; l < p->n_layer && S < c->max_samples; l++) {
		struct hyb_profile_layer *ly = &p->layers[l];
		void *a = realloc(ly->active, sizeof(uint64_t) * (S ? S : 1) * p->active_words);
		void *in = realloc(ly->input, sizeof(uint16_t) * (size_t)(S ? S : 1) * p->n_embd);

		if (a)
			ly->active = a;
		if (in)
			ly->input = in;
	}
	for (uint32_t l = 0; l < p->n_layer; l++)
		p->layers[l].cos_next = c->cos_n[l] ? c->cos_sum[l] / (double)c->cos_n[l] : NAN;
	c->p = NULL;
	hyb_profile_collector_free(c);
	if (hyb_profile_stats(p)) {
		hyb_profile_free(p);
		return NULL;
	}
	return p;
}

/* ---- file ---------------------------------------------------------------- */

enum stat_id { ST_SPARSITY, ST_HOT, ST_JACCARD, ST_COS, ST_LIFT, ST_LIFT_RND, ST_COUNT };

static const char *const stat_key[ST_COUNT] = {
	"hyb.profile.sparsity", "hyb.profile.hot_share_80", "hyb.profile.jaccard_adjacent",
	"hyb.profile.cos_next", "hyb.profile.coact_lift", "hyb.profile.coact_lift_random",
};

static double *stat_field(struct hyb_profile_layer *ly, int id)
{
	switch (id) {
	case ST_SPARSITY: return &ly->sparsity;
	case ST_HOT: return &ly->hot_share_80;
	case ST_JACCARD: return &ly->jaccard_adjacent;
	case ST_COS: return &ly->cos_next;
	case ST_LIFT: return &ly->coact_lift;
	default: return &ly->coact_lift_random;
	}
}

int hyb_profile_save(const struct hyb_profile *p, const char *path)
{
	struct hyb_gguf_writer *w = hyb_gguf_writer_new();
	double *vals = malloc(sizeof(double) * p->n_layer * N_REACT);
	int rc;

	if (!w || !vals) {
		rc = hyb_error_set(-ENOMEM, "%s: out of memory", path);
		goto out;
	}
	if (p->n_seqs > p->n_samples || (p->n_samples && !p->n_seqs) ||
	    p->active_words != words_of(p->n_ff)) {
		rc = hyb_error_set(-EINVAL, "%s: inconsistent profile (%u samples, %u sequences)",
				   path, p->n_samples, p->n_seqs);
		goto out;
	}
	hyb_gguf_set_str(w, "general.architecture", "hyb-profile");
	hyb_gguf_set_str(w, "general.name", p->model_name);
	hyb_gguf_set_u32(w, "hyb.profile.version", 1);
	hyb_gguf_set_u32(w, "hyb.profile.n_layer", p->n_layer);
	hyb_gguf_set_u32(w, "hyb.profile.n_embd", p->n_embd);
	hyb_gguf_set_u32(w, "hyb.profile.n_ff", p->n_ff);
	hyb_gguf_set_u64(w, "hyb.profile.n_tokens", p->n_tokens);
	hyb_gguf_set_u32(w, "hyb.profile.n_samples", p->n_samples);
	hyb_gguf_set_u32(w, "hyb.profile.n_seqs", p->n_seqs);
	if (p->n_seqs)
		hyb_gguf_set_arr(w, "hyb.profile.seq_start", HYB_GGUF_VT_UINT32, p->seq_start, p->n_seqs);
	for (int id = 0; id < ST_COUNT; id++) {
		for (uint32_t l = 0; l < p->n_layer; l++)
			vals[l] = *stat_field(&p->layers[l], id);
		hyb_gguf_set_arr(w, stat_key[id], HYB_GGUF_VT_FLOAT64, vals, p->n_layer);
	}
	for (uint32_t l = 0; l < p->n_layer; l++)
		memcpy(vals + (size_t)l * N_REACT, p->layers[l].reactivation,
		       sizeof(double) * N_REACT);
	hyb_gguf_set_arr(w, "hyb.profile.reactivation", HYB_GGUF_VT_FLOAT64, vals,
		     (uint64_t)p->n_layer * N_REACT);
	if (p->cats_threshold) {
		hyb_gguf_set_str(w, HYB_SPARSITY_KEY_MODE, HYB_SPARSITY_MODE_CATS);
		hyb_gguf_set_f32(w, HYB_SPARSITY_KEY_TARGET, p->target_sparsity);
		hyb_gguf_set_arr(w, HYB_SPARSITY_KEY_THRESHOLD, HYB_GGUF_VT_FLOAT32,
				 p->cats_threshold, p->n_layer);
		hyb_gguf_set_arr(w, HYB_SPARSITY_KEY_QUANTILES, HYB_GGUF_VT_FLOAT32,
				 p->cats_quantiles, (uint64_t)p->n_layer * HYB_SPARSITY_N_QUANTILES);
	}
	for (uint32_t l = 0; l < p->n_layer; l++) {
		const struct hyb_profile_layer *ly = &p->layers[l];
		uint64_t ne_c[1] = { p->n_ff };
		uint64_t ne_a[2] = { p->active_words, p->n_samples };
		uint64_t ne_i[2] = { p->n_embd, p->n_samples };
		char name[64];

		snprintf(name, sizeof(name), "blk.%u.count", l);
		rc = hyb_gguf_writer_add_tensor(w, name, TYPE_I64, 1, ne_c, ly->count);
		if (rc)
			goto out; /* the message names the tensor */
		if (!p->n_samples)
			continue;
		snprintf(name, sizeof(name), "blk.%u.active", l);
		rc = hyb_gguf_writer_add_tensor(w, name, TYPE_I64, 2, ne_a, ly->active);
		if (rc)
			goto out;
		snprintf(name, sizeof(name), "blk.%u.input", l);
		rc = hyb_gguf_writer_add_tensor(w, name, HYB_TYPE_F16, 2, ne_i, ly->input);
		if (rc)
			goto out;
	}
	rc = hyb_gguf_writer_write_file(w, path);
out:
	hyb_gguf_writer_free(w);
	free(vals);
	return rc;
}

/* "path: what" for hyb_last_error(); returns rc. */
static int load_fail(int rc, const char *path, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static int load_fail(int rc, const char *path, const char *fmt, ...)
{
	char what[768];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	return hyb_error_set(rc, "%s: %s", path, what);
}

/* A malformed profile. */
#define LOAD_FAIL(...) return load_fail(-EINVAL, path, __VA_ARGS__)

/* The CATS keys (hyb/sparsity.h): all four, sizes and values checked. */
static int load_cats(const struct hyb_gguf_file *f, const char *path, struct hyb_profile *p)
{
	const uint32_t NQ = HYB_SPARSITY_N_QUANTILES;
	const struct hyb_gguf_kv *t, *q;
	char mode[16];

	if (!hyb_gguf_get_str(f, HYB_SPARSITY_KEY_MODE, mode, sizeof(mode)) ||
	    strcmp(mode, HYB_SPARSITY_MODE_CATS))
		LOAD_FAIL("%s is not '%s'", HYB_SPARSITY_KEY_MODE, HYB_SPARSITY_MODE_CATS);
	if (!hyb_gguf_get_f32(f, HYB_SPARSITY_KEY_TARGET, &p->target_sparsity) ||
	    !(p->target_sparsity > 0 && p->target_sparsity < 1))
		LOAD_FAIL("%s must be an f32 in (0, 1)", HYB_SPARSITY_KEY_TARGET);
	t = hyb_gguf_get_arr(f, HYB_SPARSITY_KEY_THRESHOLD, HYB_GGUF_VT_FLOAT32);
	q = hyb_gguf_get_arr(f, HYB_SPARSITY_KEY_QUANTILES, HYB_GGUF_VT_FLOAT32);
	if (!t || t->v.arr.n != p->n_layer || !q || q->v.arr.n != (uint64_t)p->n_layer * NQ)
		LOAD_FAIL("%s and %s must be %u and %u f32 values", HYB_SPARSITY_KEY_THRESHOLD,
			  HYB_SPARSITY_KEY_QUANTILES, p->n_layer, p->n_layer * NQ);
	p->cats_threshold = malloc(sizeof(float) * p->n_layer);
	p->cats_quantiles = malloc(sizeof(float) * p->n_layer * NQ);
	if (!p->cats_threshold || !p->cats_quantiles)
		return load_fail(-ENOMEM, path, "out of memory");
	memcpy(p->cats_threshold, t->v.arr.data, sizeof(float) * p->n_layer);
	memcpy(p->cats_quantiles, q->v.arr.data, sizeof(float) * p->n_layer * NQ);
	for (uint32_t l = 0; l < p->n_layer; l++) {
		if (!(p->cats_threshold[l] >= 0) || !isfinite(p->cats_threshold[l]))
			LOAD_FAIL("%s[%u] = %g", HYB_SPARSITY_KEY_THRESHOLD, l,
				  (double)p->cats_threshold[l]);
		for (uint32_t k = 0; k < NQ; k++) {
			const float v = p->cats_quantiles[(size_t)l * NQ + k];

			if (!(v >= 0) || !isfinite(v) ||
			    (k && v < p->cats_quantiles[(size_t)l * NQ + k - 1]))
				LOAD_FAIL("%s: layer %u's quantiles are not rising magnitudes",
					  HYB_SPARSITY_KEY_QUANTILES, l);
		}
	}
	return 0;
}

static bool get_u32(const struct hyb_gguf_file *f, const char *key, uint32_t *v)
{
	const struct hyb_gguf_kv *kv = hyb_gguf_find(f, key);

	return kv && kv->type == HYB_GGUF_VT_UINT32 && hyb_gguf_get_u32(f, key, v);
}

/* The tensor `name` with exactly this type and shape, or NULL. */
static const struct hyb_gguf_tensor *tensor(const struct hyb_gguf_file *f, const char *name,
					uint32_t type, uint32_t n_dims, uint64_t ne0, uint64_t ne1)
{
	const struct hyb_gguf_tensor *t = hyb_gguf_find_tensor(f, name);

	if (!t || t->type != type || t->n_dims != n_dims || t->ne[0] != ne0 ||
	    (n_dims > 1 && t->ne[1] != ne1))
		return NULL;
	return t;
}

/* What a profile's header says, checked against the limits. */
struct load_hdr {
	uint32_t n_layer, n_embd, n_ff, n_samples, n_seqs;
	int64_t n_tokens;
};

static int load_header(const struct hyb_gguf_file *f, const char *path, struct load_hdr *h)
{
	const struct hyb_gguf_kv *kv;
	uint32_t ver;
	char arch[32];

	if (!hyb_gguf_get_str(f, "general.architecture", arch, sizeof(arch)))
		LOAD_FAIL("not a hyb profile (no general.architecture)");
	if (strcmp(arch, "hyb-profile"))
		LOAD_FAIL("not a hyb profile (general.architecture is '%s')", arch);
	if (!get_u32(f, "hyb.profile.version", &ver) || ver != 1)
		LOAD_FAIL("unsupported profile version (want hyb.profile.version = 1)");
	if (!get_u32(f, "hyb.profile.n_layer", &h->n_layer) || !h->n_layer ||
	    h->n_layer > MAX_LAYERS)
		LOAD_FAIL("missing or bad hyb.profile.n_layer");
	if (!get_u32(f, "hyb.profile.n_embd", &h->n_embd) || !h->n_embd || h->n_embd > MAX_EMBD)
		LOAD_FAIL("missing or bad hyb.profile.n_embd");
	if (!get_u32(f, "hyb.profile.n_ff", &h->n_ff) || !h->n_ff || h->n_ff > MAX_FF)
		LOAD_FAIL("missing or bad hyb.profile.n_ff");
	if (!get_u32(f, "hyb.profile.n_samples", &h->n_samples))
		LOAD_FAIL("missing hyb.profile.n_samples");
	if (!get_u32(f, "hyb.profile.n_seqs", &h->n_seqs) || h->n_seqs > h->n_samples ||
	    (h->n_samples && !h->n_seqs))
		LOAD_FAIL("missing or bad hyb.profile.n_seqs (%u samples)", h->n_samples);
	kv = hyb_gguf_find(f, "hyb.profile.n_tokens");
	if (!kv || kv->type != HYB_GGUF_VT_UINT64 ||
	    !hyb_gguf_get_i64(f, "hyb.profile.n_tokens", &h->n_tokens) ||
	    (uint64_t)h->n_tokens < h->n_samples)
		LOAD_FAIL("missing or bad hyb.profile.n_tokens");
	return 0;
}

/*
 * Every tensor present and of the right shape before anything is allocated:
 * the sizes the header claims are then backed by the file's own bytes.
 */
static int load_check_tensors(const struct hyb_gguf_file *f, const char *path,
			      const struct load_hdr *h)
{
	const char *const what[3] = { "count", "active", "input" };

	for (uint32_t l = 0; l < h->n_layer; l++) {
		for (int k = 0; k < (h->n_samples ? 3 : 1); k++) {
			char name[64];
			bool ok;

			snprintf(name, sizeof(name), "blk.%u.%s", l, what[k]);
			if (k == 0)
				ok = tensor(f, name, TYPE_I64, 1, h->n_ff, 1);
			else if (k == 1)
				ok = tensor(f, name, TYPE_I64, 2, words_of(h->n_ff), h->n_samples);
			else
				ok = tensor(f, name, HYB_TYPE_F16, 2, h->n_embd, h->n_samples);
			if (!ok && k == 0)
				LOAD_FAIL("tensor %s missing or not I64 [%u]", name, h->n_ff);
			if (!ok)
				LOAD_FAIL("tensor %s missing or not %s [%u, %u]", name,
					  k == 1 ? "I64" : "F16",
					  k == 1 ? words_of(h->n_ff) : h->n_embd, h->n_samples);
		}
	}
	return 0;
}

/* The sequence starts, the per-layer statistics and the reactivation curves. */
static int load_metadata(const struct hyb_gguf_file *f, const char *path, struct hyb_profile *p)
{
	const uint32_t n_layer = p->n_layer, n_seqs = p->n_seqs, n_samples = p->n_samples;
	const struct hyb_gguf_kv *kv;

	if (n_seqs) {
		kv = hyb_gguf_get_arr(f, "hyb.profile.seq_start", HYB_GGUF_VT_UINT32);
		if (!kv || kv->v.arr.n != n_seqs)
			LOAD_FAIL("hyb.profile.seq_start must be %u u32 values", n_seqs);
		memcpy(p->seq_start, kv->v.arr.data, sizeof(uint32_t) * n_seqs);
		for (uint32_t q = 0; q < n_seqs; q++) {
			uint32_t at = p->seq_start[q];

			if (at >= n_samples || (q ? at <= p->seq_start[q - 1] : at != 0))
				LOAD_FAIL("hyb.profile.seq_start[%u] = %u: starts must rise from "
					  "0 and stay below %u samples", q, at, n_samples);
		}
	}
	for (int id = 0; id < ST_COUNT; id++) {
		kv = hyb_gguf_get_arr(f, stat_key[id], HYB_GGUF_VT_FLOAT64);
		if (!kv || kv->v.arr.n != n_layer)
			LOAD_FAIL("%s must be %u f64 values", stat_key[id], n_layer);
		for (uint32_t l = 0; l < n_layer; l++)
			memcpy(stat_field(&p->layers[l], id), (const double *)kv->v.arr.data + l,
			       sizeof(double));
	}
	if (hyb_gguf_find(f, HYB_SPARSITY_KEY_MODE) && load_cats(f, path, p))
		return -1;
	kv = hyb_gguf_get_arr(f, "hyb.profile.reactivation", HYB_GGUF_VT_FLOAT64);
	if (!kv || kv->v.arr.n != (uint64_t)n_layer * N_REACT)
		LOAD_FAIL("hyb.profile.reactivation must be %u f64 values", n_layer * N_REACT);
	for (uint32_t l = 0; l < n_layer; l++)
		memcpy(p->layers[l].reactivation,
		       (const double *)kv->v.arr.data + (size_t)l * N_REACT,
		       sizeof(double) * N_REACT);
	return 0;
}

/* Layer l's counts, and with samples its activation bits and inputs. */
static int load_layer(const struct hyb_gguf_file *f, const char *path, struct hyb_profile *p,
		      uint32_t l)
{
	struct hyb_profile_layer *ly = &p->layers[l];
	const uint32_t n_ff = p->n_ff, n_samples = p->n_samples;
	const uint64_t pad = n_ff % 64 ? ~0ull << (n_ff % 64) : 0;
	const struct hyb_gguf_tensor *t;
	char name[64];

	snprintf(name, sizeof(name), "blk.%u.count", l);
	t = tensor(f, name, TYPE_I64, 1, n_ff, 1);
	if (!t)
		LOAD_FAIL("tensor %s missing or not I64 [%u]", name, n_ff);
	memcpy(ly->count, t->data, sizeof(uint64_t) * n_ff);
	for (uint32_t i = 0; i < n_ff; i++)
		if (ly->count[i] > p->n_tokens)
			LOAD_FAIL("%s[%u] = %llu exceeds the %llu profiled tokens", name, i,
				  (unsigned long long)ly->count[i],
				  (unsigned long long)p->n_tokens);
	free(ly->active);
	free(ly->input);
	ly->active = NULL;
	ly->input = NULL;
	if (!n_samples)
		return 0;
	snprintf(name, sizeof(name), "blk.%u.active", l);
	t = tensor(f, name, TYPE_I64, 2, p->active_words, n_samples);
	if (!t)
		LOAD_FAIL("tensor %s missing or not I64 [%u, %u]", name, p->active_words,
			  n_samples);
	ly->active = malloc(t->nbytes);
	if (!ly->active)
		return load_fail(-ENOMEM, path, "out of memory");
	memcpy(ly->active, t->data, t->nbytes);
	for (uint32_t s = 0; pad && s < n_samples; s++)
		if (ly->active[(size_t)s * p->active_words + p->active_words - 1] & pad)
			LOAD_FAIL("%s: sample %u has bits set beyond neuron %u", name, s,
				  n_ff - 1);
	snprintf(name, sizeof(name), "blk.%u.input", l);
	t = tensor(f, name, HYB_TYPE_F16, 2, p->n_embd, n_samples);
	if (!t)
		LOAD_FAIL("tensor %s missing or not F16 [%u, %u]", name, p->n_embd, n_samples);
	ly->input = malloc(t->nbytes);
	if (!ly->input)
		return load_fail(-ENOMEM, path, "out of memory");
	memcpy(ly->input, t->data, t->nbytes);
	return 0;
}

struct hyb_profile *hyb_profile_load(const char *path)
{
	struct hyb_gguf_file *f = NULL;
	struct hyb_profile *p = NULL;
	struct load_hdr h;
	char mode[16];

	if (hyb_gguf_open(path, &f))
		return NULL; /* its message names the file */
	if (hyb_gguf_get_str(f, HYB_SPARSITY_KEY_MODE, mode, sizeof(mode)) &&
	    !strcmp(mode, HYB_SPARSITY_MODE_TEAL)) {
		load_fail(-EINVAL, path, "a TEAL profile: TEAL runs on the model as it is, with "
			  "no plan (hyb --teal PROFILE)");
		goto fail;
	}
	if (load_header(f, path, &h) || load_check_tensors(f, path, &h))
		goto fail;
	p = profile_alloc(h.n_layer, h.n_embd, h.n_ff, 0, h.n_seqs);
	if (!p) {
		load_fail(-ENOMEM, path, "out of memory");
		goto fail;
	}
	p->n_tokens = (uint64_t)h.n_tokens;
	p->n_samples = h.n_samples;
	p->n_seqs = h.n_seqs;
	if (!hyb_gguf_get_str(f, "general.name", p->model_name, sizeof(p->model_name)))
		p->model_name[0] = 0;
	if (load_metadata(f, path, p))
		goto fail;
	for (uint32_t l = 0; l < h.n_layer; l++)
		if (load_layer(f, path, p, l))
			goto fail;
	hyb_gguf_close(f);
	return p;
fail:
	hyb_profile_free(p);
	hyb_gguf_close(f);
	return NULL;
}
