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

/*
 * The residual-stream geometry, for designs built on it (synth_moe.c):
 * direction 0 is the constant channel b, 1..K the topics (unit vectors of
 * n_embd floats, zero on the scratch coordinates); a token's embedding is
 * sqrt(n_embd) (rho_t T_k + rho_b b + rho_n n_v) with n_v a unit vector in
 * P, the semantic subspace orthogonal to them, of perp_dim dimensions.
 */
struct synth_sparse_geometry {
	uint32_t topics, perp_dim;
	double rho_t, rho_b, rho_n;
	double layer_add; /* norm each attention or FFN output adds, relative to the residual */
};
void synth_sparse_geometry(const struct synth_sparse *d, struct synth_sparse_geometry *g);
const float *synth_sparse_direction(const struct synth_sparse *d, uint32_t i);
int synth_sparse_scratch_coord(uint32_t j);
/* A random unit vector in P, a pure function of (seed, tag, a, b); tag >= 100. */
void synth_sparse_perp(const struct synth_sparse *d, uint64_t tag, uint64_t a, uint64_t b,
		       float *out);

/* The design's deterministic random numbers (the same on every machine). */
uint64_t synth_sparse_stream(uint64_t seed, uint64_t tag, uint64_t a, uint64_t b);
uint64_t synth_sparse_next(uint64_t *s);
double synth_sparse_gauss(uint64_t *s);

#endif
