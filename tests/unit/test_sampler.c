// SPDX-License-Identifier: MIT
/*
 * Sampler tests: greedy choice, the filters (top-k, top-p, min-p) keep
 * exactly the tokens they must, draws follow the softmax, seeds reproduce,
 * and the repetition penalty changes exactly the penalised logits.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "hyb/error.h"
#include "hyb/sampler.h"

static struct hyb_sampler_params plain(float temp)
{
	struct hyb_sampler_params p = hyb_sampler_defaults();

	p.temperature = temp;
	p.top_k = 0;
	p.top_p = 1.0f;
	p.min_p = 0.0f;
	p.seed = 1234;
	return p;
}

/* Draw n times from fresh copies of logits; counts[id]++. */
static void draw(struct hyb_sampler *s, const float *logits, int n_vocab, int n, long *counts)
{
	float *l = malloc((size_t)n_vocab * sizeof(*l));

	CHECK(l);
	for (int i = 0; i < n; i++) {
		int32_t id;

		memcpy(l, logits, (size_t)n_vocab * sizeof(*l));
		id = hyb_sampler_sample(s, l);
		CHECK_MSG(id >= 0 && id < n_vocab, "id %d out of range", id);
		counts[id]++;
	}
	free(l);
}

/* Pearson chi-square of counts against probabilities (only where p > 0). */
static double chi2(const long *counts, const double *p, int n, long total)
{
	double x = 0.0;

	for (int i = 0; i < n; i++) {
		double e = p[i] * (double)total;

		if (p[i] > 0)
			x += ((double)counts[i] - e) * ((double)counts[i] - e) / e;
		else
			CHECK_MSG(counts[i] == 0, "token %d has p = 0 but was drawn %ld times", i,
				  counts[i]);
	}
	return x;
}

static void softmax_ref(const float *logits, int n, float temp, double *p)
{
	double max = -INFINITY, sum = 0.0;

	for (int i = 0; i < n; i++)
		max = fmax(max, logits[i] / temp);
	for (int i = 0; i < n; i++)
		sum += p[i] = exp(logits[i] / temp - max);
	for (int i = 0; i < n; i++)
		p[i] /= sum;
}

TEST(samp_greedy_argmax)
{
	struct hyb_sampler_params p = hyb_sampler_defaults();
	float l[10] = { 0.1f, -3.0f, 2.5f, 1.0f, 0.0f, 7.0f, -1.0f, 3.0f, 2.0f, 7.0f };
	struct hyb_sampler *s;

	CHECK(p.temperature == 0.0f); /* defaults are greedy */
	s = hyb_sampler_new(&p, 10);
	CHECK(s);
	CHECK_EQ_INT(hyb_sampler_sample(s, l), 5); /* tie between 5 and 9: lowest id */
	l[9] = 7.5f;
	CHECK_EQ_INT(hyb_sampler_sample(s, l), 9);
	l[3] = NAN; /* NaN never wins */
	CHECK_EQ_INT(hyb_sampler_sample(s, l), 9);
	hyb_sampler_free(s);
}

TEST(samp_top_k1_is_greedy)
{
	static const float temps[] = { 0.0f, 0.01f, 0.7f, 1.0f, 5.0f, 1000.0f };
	float logits[100];
	long counts[100];

	srand(7);
	for (int i = 0; i < 100; i++)
		logits[i] = (float)rand() / RAND_MAX * 4.0f - 2.0f;
	logits[37] = 2.5f;
	for (size_t k = 0; k < sizeof(temps) / sizeof(temps[0]); k++) {
		struct hyb_sampler_params p = plain(temps[k]);
		struct hyb_sampler *s;

		p.top_k = 1;
		s = hyb_sampler_new(&p, 100);
		memset(counts, 0, sizeof(counts));
		draw(s, logits, 100, 2000, counts);
		CHECK_MSG(counts[37] == 2000, "temperature %g: argmax drawn %ld of 2000",
			  (double)temps[k], counts[37]);
		hyb_sampler_free(s);
	}
}

TEST(samp_distribution_matches_softmax)
{
	const float logits[8] = { 1.0f, 0.5f, -0.3f, 2.0f, 0.0f, -2.0f, 1.5f, 0.2f };
	static const float temps[] = { 1.0f, 0.5f, 2.0f };
	const long total = 200000;
	long counts[8];
	double p[8], x;

	for (int k = 0; k < 3; k++) {
		struct hyb_sampler_params sp = plain(temps[k]);
		struct hyb_sampler *s = hyb_sampler_new(&sp, 8);

		memset(counts, 0, sizeof(counts));
		draw(s, logits, 8, (int)total, counts);
		softmax_ref(logits, 8, temps[k], p);
		x = chi2(counts, p, 8, total);
		/* 7 degrees of freedom: P(chi2 > 24.3) = 0.001 */
		CHECK_MSG(x < 24.3, "temperature %g: chi-square %.1f", (double)temps[k], x);
		hyb_sampler_free(s);
	}
}

TEST(samp_top_p_and_min_p_exclude)
{
	/* probabilities 0.5, 0.3, 0.15, 0.05 */
	const float logits[4] = { logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f) };
	const long total = 50000;
	long counts[4];
	double p[4];
	struct hyb_sampler_params sp;
	struct hyb_sampler *s;
	double x;

	/* top_p 0.75: 0.5 < 0.75 <= 0.8, so tokens 0 and 1 remain, renormalised */
	sp = plain(1.0f);
	sp.top_p = 0.75f;
	s = hyb_sampler_new(&sp, 4);
	memset(counts, 0, sizeof(counts));
	draw(s, logits, 4, (int)total, counts);
	p[0] = 0.5 / 0.8;
	p[1] = 0.3 / 0.8;
	p[2] = p[3] = 0.0;
	x = chi2(counts, p, 4, total);
	CHECK_MSG(x < 10.8, "top_p: chi-square %.1f", x); /* 1 dof, p = 0.001 */
	hyb_sampler_free(s);

	/* top_p 0.5 keeps only the first */
	sp.top_p = 0.5f;
	s = hyb_sampler_new(&sp, 4);
	memset(counts, 0, sizeof(counts));
	draw(s, logits, 4, 1000, counts);
	CHECK_EQ_INT(counts[0], 1000);
	hyb_sampler_free(s);

	/* min_p 0.2: p >= 0.1 stays (0, 1, 2), 0.05 goes */
	sp = plain(1.0f);
	sp.min_p = 0.2f;
	s = hyb_sampler_new(&sp, 4);
	memset(counts, 0, sizeof(counts));
	draw(s, logits, 4, (int)total, counts);
	p[0] = 0.5 / 0.95;
	p[1] = 0.3 / 0.95;
	p[2] = 0.15 / 0.95;
	p[3] = 0.0;
	x = chi2(counts, p, 4, total);
	CHECK_MSG(x < 13.8, "min_p: chi-square %.1f", x); /* 2 dof, p = 0.001 */
	hyb_sampler_free(s);
}

/* Large vocabulary: every draw lies in the set a reference computation keeps. */
static int cmp_desc(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;

	return x < y ? 1 : x > y ? -1 : 0;
}

TEST(samp_filters_large_vocab)
{
	enum { N = 32000 };
	static float logits[N], sorted[N];
	long *counts = calloc(N, sizeof(*counts));
	struct hyb_sampler_params sp;
	struct hyb_sampler *s;
	float kth, floor;
	double sum, cum, max;
	int n_keep;

	CHECK(counts);
	srand(11);
	for (int i = 0; i < N; i++)
		logits[i] = (float)rand() / RAND_MAX * 8.0f;
	memcpy(sorted, logits, sizeof(sorted));
	qsort(sorted, N, sizeof(float), cmp_desc);

	/* top_k 40 at a high temperature: only the 40 largest logits appear */
	sp = plain(3.0f);
	sp.top_k = 40;
	s = hyb_sampler_new(&sp, N);
	draw(s, logits, N, 5000, counts);
	kth = sorted[39];
	for (int i = 0; i < N; i++)
		CHECK_MSG(!counts[i] || logits[i] >= kth, "top_k: token %d drawn", i);
	hyb_sampler_free(s);

	/* top_p alone over a nearly flat distribution: the nucleus is far above 256 */
	for (int pass = 0; pass < 2; pass++) {
		float top = pass ? 0.9f : 0.3f;

		memset(counts, 0, N * sizeof(*counts));
		sp = plain(1.0f);
		sp.top_p = top;
		s = hyb_sampler_new(&sp, N);
		draw(s, logits, N, 400, counts);
		max = sorted[0];
		sum = 0.0;
		for (int i = 0; i < N; i++)
			sum += exp(sorted[i] - max);
		cum = 0.0;
		for (n_keep = 0; n_keep < N; n_keep++) {
			cum += exp(sorted[n_keep] - max) / sum;
			if (cum >= top) {
				n_keep++;
				break;
			}
		}
		CHECK(n_keep > 256);
		floor = sorted[n_keep - 1];
		for (int i = 0; i < N; i++)
			CHECK_MSG(!counts[i] || logits[i] >= floor, "top_p %g: token %d drawn",
				  (double)top, i);
		hyb_sampler_free(s);
	}
	free(counts);
}

TEST(samp_seed_reproduces)
{
	float logits[50];
	int32_t a[500], b[500], c[500];
	struct hyb_sampler_params p = plain(1.0f);
	struct hyb_sampler *s1, *s2, *s3;
	float l[50];
	int same = 0;

	for (int i = 0; i < 50; i++)
		logits[i] = (float)(i % 7) * 0.3f;
	p.seed = 42;
	s1 = hyb_sampler_new(&p, 50);
	s2 = hyb_sampler_new(&p, 50);
	p.seed = 43;
	s3 = hyb_sampler_new(&p, 50);
	for (int i = 0; i < 500; i++) {
		memcpy(l, logits, sizeof(l));
		a[i] = hyb_sampler_sample(s1, l);
		memcpy(l, logits, sizeof(l));
		b[i] = hyb_sampler_sample(s2, l);
		memcpy(l, logits, sizeof(l));
		c[i] = hyb_sampler_sample(s3, l);
		same += a[i] == c[i];
	}
	CHECK(!memcmp(a, b, sizeof(a)));
	CHECK_MSG(same < 100, "seeds 42 and 43 agree on %d of 500 draws", same);
	hyb_sampler_free(s1);
	hyb_sampler_free(s2);
	hyb_sampler_free(s3);
}

TEST(samp_repeat_penalty)
{
	struct hyb_sampler_params p = hyb_sampler_defaults();
	const float base[6] = { 1.0f, 2.0f, -1.0f, -2.0f, 0.5f, 0.0f };
	float l[6];
	struct hyb_sampler *s;

	p.repeat_penalty = 2.0f;
	p.repeat_last_n = 3;
	s = hyb_sampler_new(&p, 6);
	hyb_sampler_accept(s, 1);
	hyb_sampler_accept(s, 3);
	hyb_sampler_accept(s, 1);
	hyb_sampler_accept(s, 5);
	hyb_sampler_accept(s, -4);   /* out of range: ignored */
	hyb_sampler_accept(s, 6);
	memcpy(l, base, sizeof(l));
	CHECK_EQ_INT(hyb_sampler_sample(s, l), 0); /* 2.0 / 2 = 1.0 ties with id 0 */
	/* window {3, 1, 5}: positive divided, negative multiplied, others untouched */
	CHECK(l[0] == 1.0f && l[1] == 1.0f && l[2] == -1.0f && l[3] == -4.0f && l[4] == 0.5f &&
	      l[5] == 0.0f);
	/* two more tokens push 3 and 1 out of the window */
	hyb_sampler_accept(s, 4);
	hyb_sampler_accept(s, 4);
	memcpy(l, base, sizeof(l));
	CHECK_EQ_INT(hyb_sampler_sample(s, l), 1);
	CHECK(l[0] == 1.0f && l[1] == 2.0f && l[2] == -1.0f && l[3] == -2.0f && l[4] == 0.25f &&
	      l[5] == 0.0f);
	hyb_sampler_free(s);

	/* repeat_last_n 0 or penalty 1: nothing changes */
	p.repeat_last_n = 0;
	s = hyb_sampler_new(&p, 6);
	hyb_sampler_accept(s, 1);
	memcpy(l, base, sizeof(l));
	hyb_sampler_sample(s, l);
	CHECK(!memcmp(l, base, sizeof(l)));
	hyb_sampler_free(s);
	p.repeat_last_n = 64;
	p.repeat_penalty = 1.0f;
	s = hyb_sampler_new(&p, 6);
	hyb_sampler_accept(s, 1);
	memcpy(l, base, sizeof(l));
	hyb_sampler_sample(s, l);
	CHECK(!memcmp(l, base, sizeof(l)));
	hyb_sampler_free(s);

	/* repeat_last_n < 0: the whole history counts */
	p.repeat_last_n = -1;
	p.repeat_penalty = 4.0f;
	s = hyb_sampler_new(&p, 6);
	hyb_sampler_accept(s, 1);
	for (int i = 0; i < 1000; i++)
		hyb_sampler_accept(s, 0);
	memcpy(l, base, sizeof(l));
	hyb_sampler_sample(s, l);
	CHECK(l[1] == 0.5f && l[0] == 0.25f);
	hyb_sampler_free(s);
}

TEST(samp_bad_input)
{
	struct hyb_sampler_params p = hyb_sampler_defaults();
	float l[4] = { -INFINITY, -INFINITY, -INFINITY, -INFINITY };
	struct hyb_sampler *s;
	int32_t id;

	CHECK(!hyb_sampler_new(NULL, 10));
	CHECK(!hyb_sampler_new(&p, 0));
	CHECK_MSG(strstr(hyb_last_error(), "vocabulary size"), "%s", hyb_last_error());
	p.temperature = NAN;
	CHECK(!hyb_sampler_new(&p, 10));
	CHECK_MSG(strstr(hyb_last_error(), "temperature nan"), "%s", hyb_last_error());
	p = hyb_sampler_defaults();
	p.repeat_penalty = 0.0f;
	CHECK(!hyb_sampler_new(&p, 10));
	p = plain(1.0f);
	s = hyb_sampler_new(&p, 4);
	CHECK(s);
	CHECK_EQ_INT(hyb_sampler_sample(s, NULL), -EINVAL);
	CHECK_EQ_INT(hyb_sampler_sample(NULL, l), -EINVAL);
	/* degenerate logits still give a token in range */
	id = hyb_sampler_sample(s, l);
	CHECK(id >= 0 && id < 4);
	l[0] = NAN;
	l[1] = NAN;
	l[2] = INFINITY;
	l[3] = 1.0f;
	CHECK_EQ_INT(hyb_sampler_sample(s, l), 2);
	hyb_sampler_free(s);
	hyb_sampler_free(NULL);
	hyb_sampler_accept(NULL, 3);
}
