// SPDX-License-Identifier: MIT
/*
 * PowerInfer's own files as `hybctl plan` input.
 *
 * A PowerInfer model GGUF (its convert-hf-to-powerinfer-gguf.py) is a llama
 * model with two differences the loader handles (model_load.c): down is
 * stored transposed, blk.L.ffn_down_t.weight with a row per neuron, which is
 * exactly a bundle's down part, so plan/write.c copies those rows instead of
 * requantizing columns; and each layer carries the predictor of PowerInfer
 * 5.1, its ReluMLP without biases:
 *   blk.L.fc1.weight  ne0 = n_embd, ne1 = H   (torch Linear(n_embd, H).weight)
 *   blk.L.fc2.weight  ne0 = H, ne1 = n_ff     (torch Linear(H, n_ff).weight)
 * Its llama.cpp computes score = fc2 · relu(fc1 · ffn_inp), ffn_inp being
 * the residual stream after the layer's attention as it is (no norm), and
 * computes neuron i when score_i >= powerinfer.sparse_threshold (0 when the
 * key is absent).
 *
 * Imported, that predictor is ours with fc1.bias = 0, fc2 stored transposed
 * in bundle order (hyb/plan.h) and fc2.bias = minus the float just below the
 * threshold, so that our "logit > 0" is PowerInfer's "score >= threshold"
 * (with a threshold of 0 and a sparse hidden layer, scores of exactly 0 are
 * common: they count as active there, so here too). The weights become
 * F16, what a plan's predictors are; PowerInfer's F16 files lose nothing. The plan says "same-layer" for its
 * input (enum hyb_pred_input), and decoding feeds it what PowerInfer does.
 *
 * A PowerInfer GPU index (powerinfer-py export_split.py, *.gpuidx): GGUF
 * whose magic is overwritten with "PWRI", per layer blk.L.gpu_idx (I32
 * [n_ff], 1 = the neuron sits on the GPU) and blk.L.gpu_bucket (I32, the
 * indices of those neurons in ascending order; empty for a layer without
 * any), and split.vram_capacity; I32 as PowerInfer's gguf-py numbers it, 18
 * (hyb/gguf.h). Told from a model by its tensors, not its magic. The
 * plan places groups to cover as many of its GPU neurons as the budget allows
 * (plan/write.c place_all).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "hyb/gguf.h"
#include "hyb/model.h"
#include "hyb/tensor_type.h"
#include "plan_internal.h"

#define MAX_HIDDEN (1u << 20)

/* blk.l.<suffix>, checked to be a 2-D matrix [ne0, ne1] the CPU can dequantize */
static const struct hyb_gguf_tensor *matrix(const struct hyb_model *m, uint32_t l, const char *suffix,
					uint64_t ne0, uint64_t ne1, char *err, size_t errlen)
{
	const struct hyb_cpu_kernels *k = hyb_cpu_best();
	const struct hyb_type_info *ti;
	const struct hyb_gguf_tensor *t;
	char name[96];

	snprintf(name, sizeof(name), "blk.%u.%s", l, suffix);
	t = hyb_gguf_find_tensor(m->gguf, name);
	if (!t) {
		snprintf(err, errlen, "tensor %s is missing", name);
		return NULL;
	}
	ti = hyb_type_info(t->type);
	if (t->n_dims != 2 || t->ne[0] != ne0 || (ne1 && t->ne[1] != ne1) || t->ne[1] == 0 ||
	    t->ne[1] > MAX_HIDDEN) {
		snprintf(err, errlen, "tensor %s: expected shape [%llu, %s], found [%llu, %llu] "
			 "(%u-D)", name, (unsigned long long)ne0, ne1 ? "n_ff" : "H",
			 (unsigned long long)t->ne[0],
			 (unsigned long long)(t->n_dims > 1 ? t->ne[1] : 1), t->n_dims);
		return NULL;
	}
	if (!ti || !ti->computable || !k->dequantize[t->type] || ne0 % ti->blck) {
		snprintf(err, errlen, "tensor %s has type %s, which hyb cannot read as a predictor",
			 name, hyb_type_name(t->type));
		return NULL;
	}
	return t;
}

int hyb_plan_pi_predictors(const struct hyb_model *m, uint32_t *hidden, char *err, size_t errlen)
{
	const struct hyb_hparams *hp = &m->hp;
	uint32_t with = 0;
	char name[96];

	for (uint32_t l = 0; l < hp->n_layer; l++) {
		snprintf(name, sizeof(name), "blk.%u.fc1.weight", l);
		with += hyb_gguf_find_tensor(m->gguf, name) != NULL;
	}
	if (!with)
		return 0;
	for (uint32_t l = 0; l < hp->n_layer; l++) {
		const struct hyb_gguf_tensor *fc1;

		fc1 = matrix(m, l, "fc1.weight", hp->n_embd, 0, err, errlen);

		if (!fc1)
			return -EINVAL;
		if (!matrix(m, l, "fc2.weight", fc1->ne[1], hp->n_ff, err, errlen))
			return -EINVAL;
		hidden[l] = (uint32_t)fc1->ne[1];
	}
	return 1;
}

int hyb_plan_pi_predictor(const struct hyb_model *m, uint32_t l, const int32_t *perm,
		      struct hyb_plan_predictor *out, char *err, size_t errlen)
{
	const struct hyb_cpu_kernels *k = hyb_cpu_best();
	const uint32_t E = m->hp.n_embd, F = m->hp.n_ff;
	const struct hyb_gguf_tensor *fc1, *fc2;
	uint64_t rb1, rb2;
	uint32_t H;
	float *row, bias;

	memset(out, 0, sizeof(*out));
	fc1 = matrix(m, l, "fc1.weight", E, 0, err, errlen);
	if (!fc1)
		return -EINVAL;
	H = (uint32_t)fc1->ne[1];
	fc2 = matrix(m, l, "fc2.weight", H, F, err, errlen);
	if (!fc2)
		return -EINVAL;
	/* score >= t is score > the float below t: with that folded in, a
	 * score exactly at the threshold counts as PowerInfer counts it */
	bias = -nextafterf(m->powerinfer_threshold, -INFINITY);
	rb1 = hyb_row_bytes(fc1->type, E);
	rb2 = hyb_row_bytes(fc2->type, H);
	row = malloc(sizeof(float) * (E > H ? E : H));
	out->fc1_w = malloc((size_t)H * E * 2);
	out->fc1_b = calloc(H, sizeof(float));
	out->fc2_w = malloc((size_t)H * F * 2);
	out->fc2_b = malloc((size_t)F * sizeof(float));
	if (!row || !out->fc1_w || !out->fc1_b || !out->fc2_w || !out->fc2_b) {
		free(row);
		hyb_plan_predictor_free(out);
		snprintf(err, errlen, "out of memory importing layer %u's predictor", l);
		return -ENOMEM;
	}
	out->n_in = E;
	out->hidden = H;
	out->n_out = F;
	for (uint32_t h = 0; h < H; h++) {
		k->dequantize[fc1->type]((const char *)fc1->data + h * rb1, row, E);
		for (uint32_t e = 0; e < E; e++)
			out->fc1_w[(size_t)h * E + e] = hyb_f32_to_f16(row[e]);
	}
	/* fc2's row for neuron perm[i] becomes column i of the transposed matrix */
	for (uint32_t i = 0; i < F; i++) {
		k->dequantize[fc2->type]((const char *)fc2->data + (uint64_t)perm[i] * rb2, row, H);
		for (uint32_t h = 0; h < H; h++)
			out->fc2_w[(size_t)h * F + i] = hyb_f32_to_f16(row[h]);
		out->fc2_b[i] = bias;
	}
	free(row);
	return 0;
}

/* blk.l.<suffix> as I32 [n] (n == 0: any length, returned in *n_out) */
static const int32_t *i32_vec(const struct hyb_gguf_file *f, uint32_t l, const char *suffix,
			      uint64_t n, uint64_t *n_out, const char *path, char *err,
			      size_t errlen)
{
	const struct hyb_gguf_tensor *t;
	char name[96];

	snprintf(name, sizeof(name), "blk.%u.%s", l, suffix);
	t = hyb_gguf_find_tensor(f, name);
	if (!t)
		return NULL;
	if (t->type != HYB_TYPE_I32 || t->n_dims != 1 || (n && t->ne[0] != n)) {
		snprintf(err, errlen, "%s: %s is %s %u-D [%llu]; expected I32 [%llu]", path, name,
			 hyb_type_name(t->type), t->n_dims, (unsigned long long)t->ne[0],
			 (unsigned long long)n);
		return NULL;
	}
	if (n_out)
		*n_out = t->ne[0];
	return t->data;
}

int hyb_plan_pi_gpu_index(const char *path, uint32_t n_layer, uint32_t n_ff, uint8_t **hot,
		      uint64_t *vram_capacity, char *err, size_t errlen)
{
	struct hyb_gguf_file *f;
	uint32_t layers = 0;
	int rc;

	rc = hyb_gguf_open(path, &f);
	if (rc) {
		snprintf(err, errlen, "%s", hyb_last_error());
		return rc;
	}
	rc = -EINVAL; /* a malformed index, until it is all read */
	if (!hyb_gguf_is_gpu_index(f)) {
		snprintf(err, errlen, "%s is not a PowerInfer GPU index (it has tensors other "
			 "than blk.N.gpu_idx and blk.N.gpu_bucket)", path);
		goto out;
	}
	if (hyb_gguf_find(f, "generic.gpu_index.block_count") &&
	    (!hyb_gguf_get_u32(f, "generic.gpu_index.block_count", &layers) || layers != n_layer)) {
		snprintf(err, errlen, "%s is for a model of %u layers; this one has %u", path,
			 layers, n_layer);
		goto out;
	}
	*vram_capacity = 0;
	if (hyb_gguf_find(f, "split.vram_capacity")) {
		int64_t v;

		if (!hyb_gguf_get_i64(f, "split.vram_capacity", &v) || v < 0) {
			snprintf(err, errlen, "%s: split.vram_capacity is not a byte count", path);
			goto out;
		}
		*vram_capacity = (uint64_t)v;
	}
	for (uint32_t l = 0; l < n_layer; l++) {
		const int32_t *idx, *bucket;
		uint64_t n_bucket = 0, n_hot = 0;

		err[0] = 0;
		idx = i32_vec(f, l, "gpu_idx", n_ff, NULL, path, err, errlen);
		if (!idx) {
			if (!err[0])
				snprintf(err, errlen, "%s has no blk.%u.gpu_idx", path, l);
			goto out;
		}
		for (uint32_t i = 0; i < n_ff; i++) {
			if (idx[i] != 0 && idx[i] != 1) {
				snprintf(err, errlen, "%s: blk.%u.gpu_idx[%u] is %d, not 0 or 1",
					 path, l, i, idx[i]);
				goto out;
			}
			hot[l][i] = (uint8_t)idx[i];
			n_hot += idx[i];
		}
		/* the bucket, when there, must list exactly those neurons in order */
		bucket = i32_vec(f, l, "gpu_bucket", 0, &n_bucket, path, err, errlen);
		if (!bucket && err[0])
			goto out;
		if (bucket) {
			bool ok = n_bucket == n_hot;

			for (uint64_t b = 0; ok && b < n_bucket; b++)
				ok = bucket[b] >= 0 && (uint32_t)bucket[b] < n_ff &&
				     hot[l][bucket[b]] && (b == 0 || bucket[b] > bucket[b - 1]);
			if (!ok) {
				snprintf(err, errlen, "%s: blk.%u.gpu_bucket does not list the "
					 "neurons gpu_idx marks, in ascending order", path, l);
				goto out;
			}
		}
	}
	rc = 0;
out:
	hyb_gguf_close(f);
	return rc;
}
