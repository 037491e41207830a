/* SPDX-License-Identifier: MIT */
/*
 * The sparse-activation weight design of `hybctl synth --act relu|relu2|dlrelu`
 * (see synth_sparse.c for how it works). Private to hybctl's synth.
 */
#ifndef HYBCTL_SYNTH_SPARSE_H
#define HYBCTL_SYNTH_SPARSE_H

#include <stdint.h>

struct synth_sparse;

struct synth_sparse_shape {
	uint32_t hidden, ffn, layers, heads, kv_heads, vocab;
	uint32_t topics;    /* 0: pick from the shape */
	uint32_t type;      /* weight type: sets the expected quantization noise */
	const char *act;    /* relu, relu2 or dlrelu */
	float sparsity;     /* target mean fraction of inactive neurons per token */
	uint64_t seed;
};

/* NULL (with a message on stderr) when out of memory. */
struct synth_sparse *synth_sparse_new(const struct synth_sparse_shape *s);
void synth_sparse_free(struct synth_sparse *d);
uint32_t synth_sparse_topics(const struct synth_sparse *d);

/*
 * Row `row` of the tensor named `name` (ne0 floats into out). Returns 1 when
 * the design defines that tensor, 0 when the caller's plain random filler
 * should be used (norms, Q/K/V). Thread-safe: a pure function of the design
 * and (name, row).
 */
int synth_sparse_row(const struct synth_sparse *d, const char *name, uint64_t row, float *out);

#endif
