// SPDX-License-Identifier: MIT
/*
 * CATS and TEAL thresholds from a profile's quantile table (hyb/sparsity.h):
 * what `hyb perplexity --cats/--teal` and `hyb run --cats/--teal` read to
 * sweep sparsities without a plan per sparsity.
 */
#include "hyb/sparsity.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "hyb/gguf.h"
#include "util/error.h"

float hyb_sparsity_quantile_at(const float *q, double s)
{
	const double pos = s * (HYB_SPARSITY_N_QUANTILES - 1);
	int i = (int)floor(pos);

	if (i < 0)
		return q[0];
	if (i >= HYB_SPARSITY_N_QUANTILES - 1)
		return q[HYB_SPARSITY_N_QUANTILES - 1];
	return (float)(q[i] + (pos - i) * (q[i + 1] - q[i]));
}

const char *hyb_teal_input_name(uint32_t input)
{
	static const char *const names[HYB_TEAL_INPUTS] = { "qkv", "o", "gate_up", "down" };

	return input < HYB_TEAL_INPUTS ? names[input] : "?";
}

/*
 * A TEAL profile's allocation table (HYB_SPARSITY_KEY_TEAL_ALLOC), checked,
 * copied out of the file (whose arrays need not be aligned for floats) into
 * *alloc, the caller's to free; NULL when it has none (uniform).
 */
static int teal_alloc(const struct hyb_gguf_file *f, const char *path, double s, uint32_t n_layer,
		      float **alloc)
{
	const uint64_t n = (uint64_t)n_layer * HYB_TEAL_LEVELS * HYB_TEAL_INPUTS;
	const struct hyb_gguf_kv *kv = hyb_gguf_get_arr(f, HYB_SPARSITY_KEY_TEAL_ALLOC,
							HYB_GGUF_VT_FLOAT32);
	const double top = (HYB_TEAL_LEVELS - 1) * HYB_TEAL_STEP;

	*alloc = NULL;
	if (!hyb_gguf_find(f, HYB_SPARSITY_KEY_TEAL_ALLOC))
		return 0;
	if (!kv || kv->v.arr.n != n)
		return hyb_error_set(-EINVAL, "%s: %s must be %llu f32 values", path,
				     HYB_SPARSITY_KEY_TEAL_ALLOC, (unsigned long long)n);
	for (uint64_t i = 0; i < n; i++) {
		float a;

		memcpy(&a, (const char *)kv->v.arr.data + i * sizeof(float), sizeof(a));
		if (!(a >= 0 && a < 1))
			return hyb_error_set(-EINVAL, "%s: allocation %g of layer %llu is outside "
					     "[0, 1)", path, (double)a,
					     (unsigned long long)(i / (HYB_TEAL_LEVELS *
								       HYB_TEAL_INPUTS)));
	}
	if (s > top + 1e-9)
		return hyb_error_set(-EINVAL, "%s allocates sparsity up to %.2f, not %g", path, top,
				     s);
	*alloc = malloc(sizeof(float) * n);
	if (!*alloc)
		return hyb_error_set(-ENOMEM, "out of memory");
	memcpy(*alloc, kv->v.arr.data, sizeof(float) * n);
	return 0;
}

double hyb_teal_alloc_at(const float *alloc, uint32_t layer, uint32_t input, double s)
{
	const float *a = alloc + (size_t)layer * HYB_TEAL_LEVELS * HYB_TEAL_INPUTS + input;
	const double pos = s / HYB_TEAL_STEP;
	int k = (int)floor(pos);

	if (k < 0)
		return 0;
	if (k >= HYB_TEAL_LEVELS - 1)
		return a[(HYB_TEAL_LEVELS - 1) * HYB_TEAL_INPUTS];
	return a[k * HYB_TEAL_INPUTS] +
	       (pos - k) * (a[(k + 1) * HYB_TEAL_INPUTS] - a[k * HYB_TEAL_INPUTS]);
}

/*
 * thr[n_layer * per_layer] of a profile made in `mode`: its own (s == 0) or
 * from its quantiles at s. A file of the other mode is refused by name.
 */
static int thresholds(const char *path, const char *mode, double s, float *thr,
		      uint32_t n_layer, uint32_t per_layer)
{
	const uint32_t NQ = HYB_SPARSITY_N_QUANTILES;
	const uint64_t n = (uint64_t)n_layer * per_layer;
	const char *how = per_layer == 1 ? "hybctl profile --sparsity S"
					 : "hybctl profile --teal --sparsity S";
	struct hyb_gguf_file *f;
	const struct hyb_gguf_kv *kv;
	char fmode[32] = "";
	float q[HYB_SPARSITY_N_QUANTILES];
	int rc = 0;

	if (!(s >= 0 && s < 1))
		return hyb_error_set(-EINVAL, "sparsity %g is outside (0, 1)", s);
	rc = hyb_gguf_open(path, &f);
	if (rc)
		return rc; /* the message names path */
	if (hyb_gguf_find(f, HYB_SPARSITY_KEY_MODE) &&
	    (!hyb_gguf_get_str(f, HYB_SPARSITY_KEY_MODE, fmode, sizeof(fmode)) ||
	     strcmp(fmode, mode))) {
		rc = hyb_error_set(-EINVAL, "%s is a %s profile, not %s: make one with %s", path,
				   fmode[0] ? fmode : "(unreadable mode)", mode, how);
		goto out;
	}
	if (s == 0) { /* the file's own thresholds */
		kv = hyb_gguf_get_arr(f, HYB_SPARSITY_KEY_THRESHOLD, HYB_GGUF_VT_FLOAT32);
		if (!kv) {
			rc = hyb_error_set(-EINVAL, "%s holds no %s thresholds (%s): make it with "
					   "%s", path, mode, HYB_SPARSITY_KEY_THRESHOLD, how);
			goto out;
		}
		if (kv->v.arr.n != n) {
			rc = hyb_error_set(-EINVAL, "%s: thresholds of %llu layers, the model has "
					   "%u: made for another model", path,
					   (unsigned long long)(kv->v.arr.n / per_layer), n_layer);
			goto out;
		}
		memcpy(thr, kv->v.arr.data, sizeof(float) * n);
		for (uint64_t i = 0; i < n && !rc; i++)
			if (!(thr[i] >= 0) || !isfinite(thr[i]))
				rc = hyb_error_set(-EINVAL, "%s: threshold of layer %llu is %g",
						   path, (unsigned long long)(i / per_layer),
						   (double)thr[i]);
		goto out;
	}
	kv = hyb_gguf_get_arr(f, HYB_SPARSITY_KEY_QUANTILES, HYB_GGUF_VT_FLOAT32);
	if (!kv) {
		rc = hyb_error_set(-EINVAL, "%s holds no activation quantiles (%s): make it with "
				   "%s", path, HYB_SPARSITY_KEY_QUANTILES, how);
	} else if (kv->v.arr.n != n * NQ) {
		rc = hyb_error_set(-EINVAL, "%s: quantiles of %llu layers, the model has %u: a "
				   "profile of another model", path,
				   (unsigned long long)(kv->v.arr.n / NQ / per_layer), n_layer);
	} else {
		float *alloc = NULL;

		if (per_layer == HYB_TEAL_INPUTS) {
			rc = teal_alloc(f, path, s, n_layer, &alloc);
			if (rc)
				goto out;
		}
		for (uint64_t i = 0; i < n && !rc; i++) {
			memcpy(q, (const char *)kv->v.arr.data + i * sizeof(q), sizeof(q));
			thr[i] = hyb_sparsity_quantile_at(
				q, alloc ? hyb_teal_alloc_at(alloc, (uint32_t)(i / per_layer),
							     (uint32_t)(i % per_layer), s)
					 : s);
			if (!(thr[i] >= 0) || !isfinite(thr[i]))
				rc = hyb_error_set(-EINVAL, "%s: layer %llu's quantiles are not "
						   "finite magnitudes", path,
						   (unsigned long long)(i / per_layer));
		}
		free(alloc);
	}
out:
	hyb_gguf_close(f);
	return rc;
}

int hyb_sparsity_thresholds(const char *path, double s, float *thr, uint32_t n_layer)
{
	return thresholds(path, HYB_SPARSITY_MODE_CATS, s, thr, n_layer, 1);
}

int hyb_sparsity_teal_thresholds(const char *path, double s, float *thr, uint32_t n_layer)
{
	return thresholds(path, HYB_SPARSITY_MODE_TEAL, s, thr, n_layer, HYB_TEAL_INPUTS);
}
