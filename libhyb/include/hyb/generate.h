/* SPDX-License-Identifier: MIT */
/*
 * The generation loop: prompt as one batched pass, then one token at a time
 * through the sampler until n tokens or an end-of-generation token.
 */
#ifndef HYB_GENERATE_H
#define HYB_GENERATE_H

#include <stddef.h>
#include <stdint.h>

#include "hyb/clock.h"	/* hyb_now, which the stats are timed with */
#include "hyb/error.h"

struct hyb_ctx;
struct hyb_model;
struct hyb_sampler;

struct hyb_gen_stats {
	uint32_t n_prompt, n_gen;
	uint32_t n_decode;      /* single-token passes run (t_gen covers these) */
	double t_prompt, t_gen; /* seconds: prompt pass; all decode steps */
};

/* Called for each generated token; return nonzero to stop. */
typedef int (*hyb_token_cb)(void *arg, int32_t token);

/*
 * Generates up to n_gen tokens after the prompt (which is evaluated first
 * and fed to the sampler's repetition window). The end-of-generation token
 * stops the loop and is not passed to cb. Returns 0, -EINVAL for an empty
 * prompt, -ENOMEM, or hyb_ctx_eval's errno, with the message in
 * hyb_last_error().
 */
int hyb_generate(struct hyb_ctx *c, const struct hyb_model *m, struct hyb_sampler *s,
		 const int32_t *prompt, uint32_t n_prompt, uint32_t n_gen, hyb_token_cb cb,
		 void *arg, struct hyb_gen_stats *st);


#endif
