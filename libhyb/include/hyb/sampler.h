/* SPDX-License-Identifier: MIT */
/*
 * Sampling from logits: repetition penalty, then top-k, top-p, min-p and
 * temperature, then a draw from the seeded generator; temperature 0 is
 * greedy (argmax, lowest id on ties). The order and the penalty formula are
 * llama.cpp's (penalties -> top_k -> top_p -> min_p -> temp -> dist).
 */
#ifndef HYB_SAMPLER_H
#define HYB_SAMPLER_H

#include <stdint.h>

struct hyb_sampler_params {
	float temperature;    /* 0: greedy */
	int32_t top_k;        /* <= 0: off */
	float top_p;          /* >= 1: off */
	float min_p;          /* <= 0: off */
	float repeat_penalty; /* 1: off */
	int32_t repeat_last_n;/* window of recent tokens the penalty looks at (0: off, < 0: all) */
	uint64_t seed;        /* xoshiro256** seed: equal seeds give equal draws */
};

struct hyb_sampler;

/* Defaults: greedy, top_k 40, top_p 0.95, min_p 0.05, penalty 1.0 over 64, seed 0. */
struct hyb_sampler_params hyb_sampler_defaults(void);
/* NULL (with a message on stderr) for n_vocab <= 0, NaN parameters or a penalty <= 0. */
struct hyb_sampler *hyb_sampler_new(const struct hyb_sampler_params *p, int32_t n_vocab);
void hyb_sampler_free(struct hyb_sampler *s);
/* Record a token (prompt or generated) for the repetition penalty. */
void hyb_sampler_accept(struct hyb_sampler *s, int32_t token);
/*
 * Pick the next token; logits may be modified (the penalty is applied in
 * place). NaN logits never win. -1 for NULL arguments.
 */
int32_t hyb_sampler_sample(struct hyb_sampler *s, float *logits);

#endif
