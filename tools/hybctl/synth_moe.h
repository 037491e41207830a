/* SPDX-License-Identifier: MIT */
/*
 * The routing design of `hybctl synth --experts E` (see synth_moe.c for how
 * it works). Private to hybctl's synth.
 */
#ifndef HYBCTL_SYNTH_MOE_H
#define HYBCTL_SYNTH_MOE_H

#include <stdint.h>

struct synth_moe;

struct synth_moe_shape {
	uint32_t hidden, layers, heads, head_dim, kv_heads, vocab;
	uint32_t experts, experts_used, expert_ffn, shared_ffn; /* shared_ffn 0: none */
	uint32_t topics;    /* 0: pick from the shape */
	uint32_t type;      /* weight type */
	uint64_t seed;
};

/* NULL (with a message on stderr) when out of memory. */
struct synth_moe *synth_moe_new(const struct synth_moe_shape *s);
void synth_moe_free(struct synth_moe *m);
uint32_t synth_moe_topics(const struct synth_moe *m);

/*
 * Row `row` of the tensor named `name` into out (the tensor's ne0 floats).
 * Returns 1 when the design defines that tensor, 0 when the caller's plain
 * random filler should be used. Thread-safe: a pure function of the design
 * and (name, row).
 */
int synth_moe_row(const struct synth_moe *m, const char *name, uint64_t row, float *out);

#endif
