/* SPDX-License-Identifier: MIT */
/*
 * Activation profile of a model's FFNs: what `hybctl profile` measures and
 * saves, and what `hybctl plan` reads to group neurons, place groups and
 * train predictors (PowerInfer 4 / 6.1, KAIROX 5.2).
 *
 * A profile holds, per layer:
 *   - count[i]: tokens on which neuron i was active (act(gate)*up != 0), over
 *     every profiled token (n_tokens);
 *   - for a sample of those tokens (n_samples, in token order within each
 *     sequence; seq_start marks where sequences begin): the active set as a
 *     bitset and the predictor input for that layer.
 *
 * Predictor input of layer l (adjacent-layer prediction, KAIROX 5.1): the
 * residual stream after layer l-1's attention, RMS-normalised without a
 * weight (unit RMS), so the predictor of layer l can run while layer l-1's
 * FFN computes. Layer 0 has no earlier point and uses its own attention
 * output (PowerInfer's same-layer predictor).
 *
 * Saved as a GGUF file (general.architecture = "hyb-profile"); see profile.c
 * for the key and tensor names.
 *
 * Failures return a negative errno (or NULL) with the message in
 * hyb_last_error() (hyb/error.h).
 *
 * Statistics (hyb_profile_stats; NaN where a statistic has no data, e.g.
 * cos_next of the last layer, which has no next layer):
 *   sparsity        1 - sum(count) / (n_tokens * n_ff)              (all tokens)
 *   hot_share_80    fewest neurons, hottest first by count, whose counts sum
 *                   to >= 80% of the layer's activations, / n_ff   (PowerInfer 2)
 *   jaccard_adjacent  mean over adjacent samples of one sequence of
 *                   1 - |A_t & A_t+1| / |A_t | A_t+1| (pairs with an empty
 *                   union skipped)              (DynamicInfer: 0.70-0.75)
 *   cos_next        mean over tokens of cos(x_attn of layer l, of layer l+1),
 *                   measured while collecting (x_attn of the last layer is
 *                   not stored)                                     (KAIROX 5.1)
 *   reactivation[d-1]  cold = the 70% of neurons with the lowest count (ties:
 *                   lower index first); sum over samples t with t+d in the
 *                   same sequence of |A_t & A_t+d & cold| / |A_t & cold|
 *                   (pooled over neurons)                           (KAIROX 6, Fig. 8)
 *   coact_lift      up to 256 neurons i with >= 8 active samples (evenly
 *                   spaced by index); for each, the 8 partners j (>= 8 active
 *                   samples) with the largest excess co-activation
 *                   n_ij/S - (c_i/S)(c_j/S); mean of their lift n_ij S/(c_i c_j)
 *   coact_lift_random  the same mean over 8 pseudo-random partners of each i
 *                   (the baseline: ~1 when neurons fire independently)
 */
#ifndef HYB_PROFILE_H
#define HYB_PROFILE_H

#include <stddef.h>
#include <stdint.h>

#include "hyb/error.h"

struct hyb_profile_layer {
	uint64_t *count;   /* [n_ff] */
	uint64_t *active;  /* [n_samples][active_words]: bit i of sample s = neuron i active */
	uint16_t *input;   /* [n_samples][n_embd] F16 predictor input (see above) */
	/* statistics hybctl profile prints (computed by hyb_profile_stats) */
	double sparsity;        /* mean fraction of inactive neurons per token */
	double hot_share_80;    /* fraction of neurons that cover 80% of activations */
	double jaccard_adjacent;/* mean Jaccard distance of adjacent tokens' active sets */
	double cos_next;        /* mean cosine of this layer's x_attn with the next layer's */
	double reactivation[8]; /* P(cold neuron active at t+d | active at t), d = 1..8;
				 * cold = the 70% least active neurons */
	double coact_lift;      /* clustering: mean P(j|i)/P(j) over top co-activated pairs */
	double coact_lift_random; /* the same over random pairs (baseline) */
};

struct hyb_profile {
	char model_name[128];
	/* CATS (hyb/sparsity.h; 0 and NULL for a profile of natural sparsity):
	 * the statistics above are then of the thresholded activations */
	float target_sparsity;
	float *cats_threshold;  /* [n_layer] */
	float *cats_quantiles;  /* [n_layer][HYB_SPARSITY_N_QUANTILES] of |act(gate)|, dense model */
	uint32_t n_layer, n_embd, n_ff;
	uint32_t active_words;  /* (n_ff + 63) / 64 */
	uint64_t n_tokens;      /* tokens behind count[] */
	uint32_t n_samples;     /* tokens with stored active sets and inputs */
	uint32_t n_seqs;
	uint32_t *seq_start;    /* [n_seqs] first sample index of each sequence */
	struct hyb_profile_layer *layers;
};

static inline int hyb_profile_active(const struct hyb_profile *p, uint32_t layer,
				     uint32_t sample, uint32_t neuron)
{
	const uint64_t *a = p->layers[layer].active + (size_t)sample * p->active_words;

	return (int)((a[neuron / 64] >> (neuron % 64)) & 1);
}

void hyb_profile_free(struct hyb_profile *p);
/* 0, -EINVAL for an inconsistent profile, or the write's errno (hyb_gguf_writer_write_file). */
int hyb_profile_save(const struct hyb_profile *p, const char *path);
/*
 * Statistics come from the file; every size is validated. NULL when the file
 * cannot be read (hyb_gguf_open), is no profile or a malformed one, or when
 * out of memory; the message names the file.
 */
struct hyb_profile *hyb_profile_load(const char *path);

/*
 * Compute every layer's statistics (all but cos_next, which only the collector
 * can measure) from count, active and seq_start. 0, or -ENOMEM.
 */
int hyb_profile_stats(struct hyb_profile *p);

/* Model-wide figures (the summary line of hybctl profile). */
struct hyb_profile_summary {
	double sparsity;        /* mean over layers */
	double hot_share_80;    /* fraction of all the model's neurons covering 80% */
	double jaccard_adjacent;/* mean over layers */
	double cos_next_min;    /* lowest over layers that have a next layer */
	double reactivation_cold_max; /* highest reactivation[d-1], d >= 3, over layers */
	double coact_lift;      /* mean over layers */
	double coact_lift_random;
};
void hyb_profile_summarize(const struct hyb_profile *p, struct hyb_profile_summary *s);

/*
 * Collecting a profile from a running model: create a collector, install
 * hyb_profile_probe with it as user pointer (hyb_ctx_set_ffn_probe), call
 * begin_seq before each sequence's first batch, run the model, then finish.
 * Samples are a sequence's first tokens, at most seq_quota of them (0: no
 * per-sequence limit), until max_samples in all.
 */
struct hyb_profile_collector;

/* NULL for sizes out of range or out of memory. */
struct hyb_profile_collector *hyb_profile_collector_new(uint32_t n_layer, uint32_t n_embd,
							uint32_t n_ff, uint32_t max_samples,
							const char *model_name);
void hyb_profile_collector_begin_seq(struct hyb_profile_collector *c, uint32_t seq_quota);
/* A hyb_ffn_probe_fn; user is the collector. */
void hyb_profile_probe(void *user, uint32_t layer, uint32_t pos0, uint32_t n,
		       const float *x_attn, const float *act);
/* The profile with its statistics computed; frees the collector. NULL: out of memory. */
struct hyb_profile *hyb_profile_collector_finish(struct hyb_profile_collector *c);
void hyb_profile_collector_free(struct hyb_profile_collector *c);

/*
 * CATS calibration (hyb/sparsity.h): install hyb_calib_probe with the
 * calibrator as user pointer on a context whose probe sees act(gate)
 * (hyb_ctx_set_ffn_probe_gate), run the calibration text, then read each
 * layer's quantiles of |act(gate)| into q[n_layer * HYB_SPARSITY_N_QUANTILES]
 * (-ENODATA when a layer saw nothing).
 *
 * TEAL calibration: a calibrator of n_layer * HYB_TEAL_INPUTS slots (n_ff
 * unused but > 0) with hyb_calib_input_probe as the context's input probe
 * (hyb_ctx_set_input_probe); the quantiles come out per slot, layer-major.
 */
struct hyb_calib;
struct hyb_calib *hyb_calib_new(uint32_t n_layer, uint32_t n_ff);
void hyb_calib_probe(void *user, uint32_t layer, uint32_t pos0, uint32_t n, const float *x_attn,
		     const float *act);
void hyb_calib_input_probe(void *user, uint32_t layer, uint32_t input, uint32_t n, const float *x,
			   uint32_t ne);
int hyb_calib_quantiles(const struct hyb_calib *c, float *q);
void hyb_calib_free(struct hyb_calib *c);

/*
 * TEAL's block-wise greedy allocation (TEAL §4.2; libhyb/plan/teal_alloc.c):
 * alloc[n_layer][HYB_TEAL_LEVELS][HYB_TEAL_INPUTS] (hyb/sparsity.h), each
 * layer's input sparsities at model sparsity k * HYB_TEAL_STEP, chosen by
 * evaluating the layer alone (hyb_ctx_eval_block) on the dense states of
 * n_seqs calibration sequences (each at most the context's n_batch tokens)
 * with thresholds from quant (hyb_calib_quantiles of the input probe). c: a
 * dense CPU context of m; its cache is overwritten.
 */
struct hyb_ctx;
struct hyb_model;
int hyb_teal_allocate(struct hyb_ctx *c, const struct hyb_model *m, const int32_t *const *seqs,
		      const uint32_t *lens, uint32_t n_seqs, const float *quant, float *alloc);

#endif
