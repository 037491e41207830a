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
 */
#ifndef HYB_PROFILE_H
#define HYB_PROFILE_H

#include <stddef.h>
#include <stdint.h>

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
};

struct hyb_profile {
	char model_name[128];
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
/* 0, or -1 with a one-line reason in err. */
int hyb_profile_save(const struct hyb_profile *p, const char *path, char *err, size_t errlen);
struct hyb_profile *hyb_profile_load(const char *path, char *err, size_t errlen);

#endif
