/* SPDX-License-Identifier: MIT */
/* hybctl profile on a mixture-of-experts model: the routing statistics (profile_moe.c). */
#ifndef HYBCTL_PROFILE_MOE_H
#define HYBCTL_PROFILE_MOE_H

#include <stdbool.h>
#include <stdint.h>

struct hyb_model;

struct profile_moe_opts {
	const char *model, *out; /* out: the GGUF routing profile, or NULL */
	uint32_t gen;            /* tokens sampled after each prompt */
	int threads;
	uint64_t seed;           /* sampler seed of the first prompt */
	float temp;
	bool json;
};

/* The prompts (token ids) and their continuations through m's routers; 0 or 1 (said on stderr). */
int profile_moe(const struct hyb_model *m, const struct profile_moe_opts *o, int32_t *const *ids,
		const int *n_ids, uint32_t n_prompts);

#endif
