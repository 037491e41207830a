// SPDX-License-Identifier: MIT
/*
 * Token sampling with llama.cpp's default chain: repetition penalty, top-k,
 * top-p, min-p, temperature, then a draw from the softmax. Temperature <= 0
 * is greedy. Ties are broken by the lower token id so results do not depend
 * on sort stability. The random numbers come from xoshiro256** seeded
 * through splitmix64: the same seed gives the same draws on every platform.
 */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyb/sampler.h"
#include "util/error.h"

struct cand {
	int32_t id;
	float logit;
	float p;
};

struct hyb_sampler {
	struct hyb_sampler_params p;
	int32_t n_vocab;
	uint64_t rng[4];
	int32_t *count;  /* occurrences of each token in the penalty window */
	int32_t *ring;   /* the window, oldest overwritten (NULL when unbounded) */
	int32_t ring_cap, ring_n, ring_pos;
	struct cand *cand;
};

struct hyb_sampler_params hyb_sampler_defaults(void)
{
	return (struct hyb_sampler_params){
		.temperature = 0.0f,
		.top_k = 40,
		.top_p = 0.95f,
		.min_p = 0.05f,
		.repeat_penalty = 1.0f,
		.repeat_last_n = 64,
		.seed = 0,
	};
}

static uint64_t splitmix64(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

/* xoshiro256** */
static uint64_t next_u64(uint64_t s[4])
{
	uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;

	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rotl(s[3], 45);
	return r;
}

/* Uniform in [0, 1) with 53 random bits. */
static double next_double(uint64_t s[4])
{
	return (double)(next_u64(s) >> 11) * 0x1.0p-53;
}

struct hyb_sampler *hyb_sampler_new(const struct hyb_sampler_params *p, int32_t n_vocab)
{
	struct hyb_sampler *s;
	uint64_t x;

	if (!p || n_vocab <= 0) {
		hyb_error_set(-EINVAL, "sampler: %s", p ? "vocabulary size must be positive"
							 : "no parameters");
		return NULL;
	}
	if (isnan(p->temperature) || isnan(p->top_p) || isnan(p->min_p) ||
	    !(p->repeat_penalty > 0.0f) || isinf(p->repeat_penalty)) {
		hyb_error_set(-EINVAL, "sampler: bad parameters (temperature %g, top_p %g, "
			      "min_p %g, repeat_penalty %g)", (double)p->temperature,
			      (double)p->top_p, (double)p->min_p, (double)p->repeat_penalty);
		return NULL;
	}
	s = calloc(1, sizeof(*s));
	if (!s) {
		hyb_error_set(-ENOMEM, "sampler: out of memory");
		return NULL;
	}
	s->p = *p;
	s->n_vocab = n_vocab;
	s->count = calloc((size_t)n_vocab, sizeof(*s->count));
	s->cand = malloc((size_t)n_vocab * sizeof(*s->cand));
	if (p->repeat_last_n > 0) {
		s->ring_cap = p->repeat_last_n;
		s->ring = malloc((size_t)s->ring_cap * sizeof(*s->ring));
	}
	if (!s->count || !s->cand || (s->ring_cap && !s->ring)) {
		hyb_error_set(-ENOMEM, "sampler: out of memory for %d candidates", n_vocab);
		hyb_sampler_free(s);
		return NULL;
	}
	x = p->seed;
	for (int i = 0; i < 4; i++)
		s->rng[i] = splitmix64(&x);
	return s;
}

void hyb_sampler_free(struct hyb_sampler *s)
{
	if (!s)
		return;
	free(s->count);
	free(s->ring);
	free(s->cand);
	free(s);
}

/* repeat_last_n: 0 keeps no history, < 0 keeps all of it. */
void hyb_sampler_accept(struct hyb_sampler *s, int32_t token)
{
	if (!s || token < 0 || token >= s->n_vocab || s->p.repeat_last_n == 0)
		return;
	s->count[token]++;
	if (!s->ring)
		return;
	if (s->ring_n == s->ring_cap)
		s->count[s->ring[s->ring_pos]]--;
	else
		s->ring_n++;
	s->ring[s->ring_pos] = token;
	s->ring_pos = (s->ring_pos + 1) % s->ring_cap;
}

static void penalise(float *logit, float pen)
{
	if (*logit <= 0.0f)
		*logit *= pen;
	else
		*logit /= pen;
}

/*
 * llama.cpp's penalty: a token seen in the window has a positive logit
 * divided by the penalty, a non-positive one multiplied (once, however
 * often it was seen). A bounded window is walked directly, its counts
 * negated while a token is done so repeats are skipped.
 */
static void apply_penalty(struct hyb_sampler *s, float *logits)
{
	float pen = s->p.repeat_penalty;

	if (s->p.repeat_last_n == 0 || pen == 1.0f)
		return;
	if (!s->ring) {
		for (int32_t i = 0; i < s->n_vocab; i++)
			if (s->count[i])
				penalise(&logits[i], pen);
		return;
	}
	for (int32_t i = 0; i < s->ring_n; i++) {
		int32_t id = s->ring[i];

		if (s->count[id] > 0) {
			penalise(&logits[id], pen);
			s->count[id] = -s->count[id];
		}
	}
	for (int32_t i = 0; i < s->ring_n; i++) {
		int32_t id = s->ring[i];

		if (s->count[id] < 0)
			s->count[id] = -s->count[id];
	}
}

/* Candidate order: higher logit first, then lower id. */
static int better(const struct cand *a, const struct cand *b)
{
	return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static int cmp_cand(const void *a, const void *b)
{
	return better(a, b) ? -1 : better(b, a) ? 1 : 0;
}

static void swap(struct cand *a, struct cand *b)
{
	struct cand t = *a;

	*a = *b;
	*b = t;
}

/*
 * Partition c[lo..hi) around a median-of-three pivot: better candidates
 * first, then the pivot, whose final index is returned.
 */
static size_t partition(struct cand *c, size_t lo, size_t hi)
{
	size_t mid = lo + (hi - lo) / 2, store = lo;
	struct cand pivot;

	if (better(&c[hi - 1], &c[lo]))
		swap(&c[hi - 1], &c[lo]);
	if (better(&c[mid], &c[lo]))
		swap(&c[mid], &c[lo]);
	if (better(&c[hi - 1], &c[mid]))
		swap(&c[hi - 1], &c[mid]);
	swap(&c[mid], &c[hi - 1]);
	pivot = c[hi - 1];
	for (size_t i = lo; i < hi - 1; i++)
		if (better(&c[i], &pivot))
			swap(&c[i], &c[store++]);
	swap(&c[store], &c[hi - 1]);
	return store;
}

/* Restore the heap order below node i (the worst candidate at the root). */
static void sift_down(struct cand *h, size_t n, size_t i)
{
	for (;;) {
		size_t w = i, l = 2 * i + 1, r = l + 1;

		if (l < n && better(&h[w], &h[l]))
			w = l;
		if (r < n && better(&h[w], &h[r]))
			w = r;
		if (w == i)
			return;
		swap(&h[i], &h[w]);
		i = w;
	}
}

/*
 * The k best logits, sorted, in c[0..k): one pass with a heap of the k best
 * so far, so the common top-k case never builds the full candidate list.
 */
static void top_k(struct cand *c, const float *logits, int32_t n, size_t k)
{
	size_t m = 0;

	for (int32_t i = 0; i < n; i++) {
		struct cand x = { i, isnan(logits[i]) ? -INFINITY : logits[i], 0.0f };

		if (m < k) {
			/* sift up */
			size_t j = m++;

			c[j] = x;
			while (j > 0 && better(&c[(j - 1) / 2], &c[j])) {
				swap(&c[(j - 1) / 2], &c[j]);
				j = (j - 1) / 2;
			}
		} else if (better(&x, &c[0])) {
			c[0] = x;
			sift_down(c, k, 0);
		}
	}
	qsort(c, k, sizeof(*c), cmp_cand);
}

/*
 * Unnormalised probabilities exp(logit - max) of c[0..n); returns their sum.
 * Infinite maxima are handled so no NaN appears: all -inf is uniform, +inf
 * entries share everything.
 */
static double weights(struct cand *c, size_t n)
{
	float max = -INFINITY;
	double sum = 0.0;

	for (size_t i = 0; i < n; i++)
		if (c[i].logit > max)
			max = c[i].logit;
	for (size_t i = 0; i < n; i++) {
		if (max == -INFINITY)
			c[i].p = 1.0f;
		else if (max == INFINITY)
			c[i].p = c[i].logit == INFINITY ? 1.0f : 0.0f;
		else
			c[i].p = expf(c[i].logit - max);
		sum += c[i].p;
	}
	return sum;
}

static void softmax(struct cand *c, size_t n)
{
	float sum = (float)weights(c, n);

	for (size_t i = 0; i < n; i++)
		c[i].p /= sum;
}

/*
 * top-p: the candidates that come first in probability order until their
 * mass reaches p (at least one). On sorted candidates that is a prefix scan;
 * otherwise a quickselect weighted by probability finds the same set in
 * linear time and moves it to the front, unsorted.
 */
static size_t top_p(struct cand *c, size_t n, bool sorted, float p)
{
	size_t lo = 0, hi = n;
	double acc = 0.0;

	softmax(c, n);
	if (p <= 0.0f || n <= 1)
		return 1;
	if (sorted) {
		float cum = 0.0f;

		for (size_t i = 0; i < n; i++) {
			cum += c[i].p;
			if (cum >= p)
				return i + 1;
		}
		return n;
	}
	/* invariant: c[0..lo) is in the set, has mass acc < p, and beats all of c[lo..hi) */
	while (hi - lo > 1) {
		size_t at = partition(c, lo, hi);
		double mass = 0.0;

		for (size_t i = lo; i < at; i++)
			mass += c[i].p;
		if (acc + mass >= p) {
			hi = at;
		} else if (acc + mass + c[at].p >= p) {
			return at + 1;
		} else {
			acc += mass + c[at].p;
			lo = at + 1;
		}
	}
	return hi > lo ? lo + 1 : (lo ? lo : 1);
}

/* Keep tokens with p >= min_p * p_max, i.e. logit >= max + log(min_p). */
static size_t min_p(struct cand *c, size_t n, float p)
{
	float max = -INFINITY, floor;
	size_t m = 0;

	for (size_t i = 0; i < n; i++)
		if (c[i].logit > max)
			max = c[i].logit;
	floor = max + logf(p);
	for (size_t i = 0; i < n; i++)
		if (c[i].logit >= floor)
			c[m++] = c[i];
	return m;
}

/* Lowest id among the largest logits; NaN never wins (id 0 if all are NaN). */
static int32_t argmax(const float *logits, int32_t n)
{
	int32_t best = 0;

	while (best < n - 1 && isnan(logits[best]))
		best++;
	for (int32_t i = best + 1; i < n; i++)
		if (logits[i] > logits[best])
			best = i;
	return isnan(logits[best]) ? 0 : best;
}

int32_t hyb_sampler_sample(struct hyb_sampler *s, float *logits)
{
	struct cand *c;
	size_t n;
	bool sorted = false;
	double sum, target, run = 0.0;

	if (!s || !logits)
		return hyb_error_set(-EINVAL, "sample: no sampler or logits");
	apply_penalty(s, logits);
	if (!(s->p.temperature > 0.0f))
		return argmax(logits, s->n_vocab);

	c = s->cand;
	n = (size_t)s->n_vocab;
	if (s->p.top_k > 0 && (size_t)s->p.top_k < n) {
		n = (size_t)s->p.top_k;
		top_k(c, logits, s->n_vocab, n);
		sorted = true;
	} else {
		for (size_t i = 0; i < n; i++) /* NaN never wins */
			c[i] = (struct cand){ (int32_t)i, isnan(logits[i]) ? -INFINITY : logits[i],
					      0.0f };
	}
	if (s->p.top_p < 1.0f) {
		n = top_p(c, n, sorted, s->p.top_p);
		sorted = true;
	}
	if (s->p.min_p > 0.0f)
		n = min_p(c, n, s->p.min_p);
	for (size_t i = 0; i < n; i++)
		c[i].logit /= s->p.temperature;

	sum = weights(c, n);
	target = sum * next_double(s->rng);
	for (size_t i = 0; i < n; i++) {
		run += c[i].p;
		if (c[i].p > 0.0f && run > target)
			return c[i].id;
	}
	/* rounding left the target just past the end: the last possible token */
	for (size_t i = n; i-- > 0;)
		if (c[i].p > 0.0f)
			return c[i].id;
	return c[0].id;
}
