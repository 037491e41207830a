/* SPDX-License-Identifier: MIT */
/*
 * Neuron -> group without a division: hot loops map every listed neuron
 * (~4000 a layer at the 7B shape) to its group, and a 32-bit division per
 * neuron was the largest cost of a balancer step. n / gs == (n * r) >> 40
 * with r = 2^40 / gs rounded up, exactly for n * gs < 2^40 (the error
 * r * gs - 2^40 is at most gs, so n * (r * gs - 2^40) < 2^40 keeps the
 * floor) and n < 2^24 (n * r stays below 2^64); tests/unit/test_balancer.c
 * checks it over whole ranges.
 */
#ifndef HYB_GROUP_DIV_H
#define HYB_GROUP_DIV_H

#include <stdbool.h>
#include <stdint.h>

static inline uint64_t hyb_group_recip(uint32_t gs)
{
	return (1ull << 40) / gs + 1;
}

/* Where hyb_group_of is exact for every neuron below n_ff. */
static inline bool hyb_group_recip_ok(uint32_t n_ff, uint32_t gs)
{
	return gs && n_ff <= (1u << 24) && (uint64_t)n_ff * gs < (1ull << 40);
}

static inline uint32_t hyb_group_of(uint32_t n, uint64_t recip)
{
	return (uint32_t)((n * recip) >> 40);
}

#endif
