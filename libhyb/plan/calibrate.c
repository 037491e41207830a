// SPDX-License-Identifier: MIT
/*
 * CATS calibration (hyb/sparsity.h, CATS §3.2): the distribution of
 * |act(gate)| per layer over every calibration token, as quantiles. The
 * distribution is kept as a histogram of log2 magnitudes, 128 bins an
 * octave (a bin spans 0.54%), so a 4096/11008 model over thousands of tokens
 * costs a few hundred KiB instead of every value; quantiles interpolate
 * inside a bin, and the ends are the exact minimum and maximum.
 */
#include "hyb/profile.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "hyb/sparsity.h"
#include "util/error.h"

#define OCT_LO (-40)          /* 2^-40: below it a magnitude counts as 0 */
#define OCT_HI 24             /* 2^24: above it, the top bin */
#define PER_OCT 128
#define N_BINS ((OCT_HI - OCT_LO) * PER_OCT + 1) /* bin 0: below 2^OCT_LO */

struct hyb_calib {
	uint32_t n_layer, n_ff;
	uint64_t *hist;   /* [n_layer][N_BINS] */
	uint64_t *n;      /* [n_layer] values seen */
	float *lo, *hi;   /* [n_layer] exact extremes */
};

struct hyb_calib *hyb_calib_new(uint32_t n_layer, uint32_t n_ff)
{
	struct hyb_calib *c = calloc(1, sizeof(*c));

	if (!c || !n_layer || !n_ff)
		goto fail;
	c->n_layer = n_layer;
	c->n_ff = n_ff;
	c->hist = calloc((size_t)n_layer * N_BINS, sizeof(uint64_t));
	c->n = calloc(n_layer, sizeof(uint64_t));
	c->lo = malloc(sizeof(float) * n_layer);
	c->hi = calloc(n_layer, sizeof(float));
	if (!c->hist || !c->n || !c->lo || !c->hi)
		goto fail;
	for (uint32_t l = 0; l < n_layer; l++)
		c->lo[l] = INFINITY;
	return c;
fail:
	hyb_calib_free(c);
	hyb_error_set(n_layer && n_ff ? -ENOMEM : -EINVAL, "cannot calibrate %u layers of %u "
		      "neurons", n_layer, n_ff);
	return NULL;
}

void hyb_calib_free(struct hyb_calib *c)
{
	if (!c)
		return;
	free(c->hist);
	free(c->n);
	free(c->lo);
	free(c->hi);
	free(c);
}

static uint32_t bin_of(float a)
{
	int e;
	const float m = frexpf(a, &e); /* a = m * 2^e, m in [0.5, 1) */

	if (!(a >= ldexpf(1.0f, OCT_LO)))
		return 0;
	if (e - 1 >= OCT_HI)
		return N_BINS - 1;
	/* log2(a) = e - 1 + log2(2m): the fraction of the octave, linear in log */
	const int sub = (int)(log2f(2.0f * m) * PER_OCT);

	return 1 + (uint32_t)((e - 1 - OCT_LO) * PER_OCT + (sub < PER_OCT ? sub : PER_OCT - 1));
}

/* the lower edge of bin b (b >= 1) */
static double bin_lo(uint32_t b)
{
	return exp2((double)(b - 1) / PER_OCT + OCT_LO);
}

/* Values v[0..n) into slot s's histogram. */
static void add(struct hyb_calib *c, uint32_t s, const float *v, size_t n)
{
	uint64_t *h = c->hist + (size_t)s * N_BINS;

	for (size_t i = 0; i < n; i++) {
		const float a = fabsf(v[i]);

		if (!(a <= INFINITY))
			continue; /* NaN: no magnitude to rank */
		h[bin_of(a)]++;
		c->lo[s] = a < c->lo[s] ? a : c->lo[s];
		c->hi[s] = a > c->hi[s] ? a : c->hi[s];
	}
	c->n[s] += n;
}

void hyb_calib_probe(void *user, uint32_t layer, uint32_t pos0, uint32_t n, const float *x_attn,
		     const float *act)
{
	struct hyb_calib *c = user;

	(void)pos0;
	(void)x_attn;
	if (layer < c->n_layer)
		add(c, layer, act, (size_t)n * c->n_ff);
}

/* TEAL: slot layer * HYB_TEAL_INPUTS + input of a calibrator of n_layer * HYB_TEAL_INPUTS slots. */
void hyb_calib_input_probe(void *user, uint32_t layer, uint32_t input, uint32_t n, const float *x,
			   uint32_t ne)
{
	struct hyb_calib *c = user;
	const uint64_t s = (uint64_t)layer * HYB_TEAL_INPUTS + input;

	if (input < HYB_TEAL_INPUTS && s < c->n_layer)
		add(c, (uint32_t)s, x, (size_t)n * ne);
}

/* The value below which a fraction p of layer l's magnitudes lie. */
static float quantile(const struct hyb_calib *c, uint32_t l, double p)
{
	const uint64_t *h = c->hist + (size_t)l * N_BINS;
	const double rank = p * (double)c->n[l];
	double run = 0;

	if (p <= 0)
		return c->lo[l];
	if (p >= 1)
		return c->hi[l];
	for (uint32_t b = 0; b < N_BINS; b++) {
		if (run + (double)h[b] < rank || !h[b]) {
			run += (double)h[b];
			continue;
		}
		const double f = (rank - run) / (double)h[b];
		double lo = b ? bin_lo(b) : 0, hi = b + 1 < N_BINS ? bin_lo(b + 1) : c->hi[l];
		double v;

		lo = lo > c->lo[l] ? lo : c->lo[l];
		hi = hi < c->hi[l] ? hi : c->hi[l];
		v = b && lo > 0 ? lo * pow(hi / lo, f) : lo + f * (hi - lo);
		return (float)v;
	}
	return c->hi[l];
}

int hyb_calib_quantiles(const struct hyb_calib *c, float *q)
{
	const uint32_t NQ = HYB_SPARSITY_N_QUANTILES;

	for (uint32_t l = 0; l < c->n_layer; l++) {
		if (!c->n[l])
			return hyb_error_set(-ENODATA, "layer %u saw no tokens to calibrate on", l);
		for (uint32_t k = 0; k < NQ; k++)
			q[(size_t)l * NQ + k] = quantile(c, l, (double)k / (NQ - 1));
	}
	return 0;
}
