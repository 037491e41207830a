// SPDX-License-Identifier: MIT
/*
 * CATS thresholds from a profile's quantile table (hyb/sparsity.h): what
 * `hyb perplexity --cats` and `hyb run --cats` read to sweep sparsities
 * without a plan per sparsity.
 */
#include "hyb/sparsity.h"

#include <errno.h>
#include <math.h>
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

int hyb_sparsity_thresholds(const char *path, double s, float *thr, uint32_t n_layer)
{
	const uint32_t NQ = HYB_SPARSITY_N_QUANTILES;
	struct hyb_gguf_file *f;
	const struct hyb_gguf_kv *kv;
	float q[HYB_SPARSITY_N_QUANTILES];
	int rc = 0;

	if (!(s >= 0 && s < 1))
		return hyb_error_set(-EINVAL, "sparsity %g is outside (0, 1)", s);
	rc = hyb_gguf_open(path, &f);
	if (rc)
		return rc; /* the message names path */
	if (s == 0) { /* the file's own thresholds */
		kv = hyb_gguf_get_arr(f, HYB_SPARSITY_KEY_THRESHOLD, HYB_GGUF_VT_FLOAT32);
		if (!kv)
			rc = hyb_error_set(-EINVAL, "%s holds no CATS thresholds (%s): make it with "
					   "hybctl profile --sparsity S", path,
					   HYB_SPARSITY_KEY_THRESHOLD);
		else if (kv->v.arr.n != n_layer)
			rc = hyb_error_set(-EINVAL, "%s: thresholds of %llu layers, the model has "
					   "%u: made for another model", path,
					   (unsigned long long)kv->v.arr.n, n_layer);
		else
			memcpy(thr, kv->v.arr.data, sizeof(float) * n_layer);
		for (uint32_t l = 0; l < n_layer && !rc; l++)
			if (!(thr[l] >= 0) || !isfinite(thr[l]))
				rc = hyb_error_set(-EINVAL, "%s: threshold of layer %u is %g", path,
						   l, (double)thr[l]);
		hyb_gguf_close(f);
		return rc;
	}
	kv = hyb_gguf_get_arr(f, HYB_SPARSITY_KEY_QUANTILES, HYB_GGUF_VT_FLOAT32);
	if (!kv) {
		rc = hyb_error_set(-EINVAL, "%s holds no activation quantiles (%s): make it with "
				   "hybctl profile --sparsity S", path, HYB_SPARSITY_KEY_QUANTILES);
	} else if (kv->v.arr.n != (uint64_t)n_layer * NQ) {
		rc = hyb_error_set(-EINVAL, "%s: quantiles of %llu layers, the model has %u: a "
				   "profile of another model", path,
				   (unsigned long long)(kv->v.arr.n / NQ), n_layer);
	} else {
		for (uint32_t l = 0; l < n_layer && !rc; l++) {
			memcpy(q, (const float *)kv->v.arr.data + (size_t)l * NQ, sizeof(q));
			thr[l] = hyb_sparsity_quantile_at(q, s);
			if (!(thr[l] >= 0) || !isfinite(thr[l]))
				rc = hyb_error_set(-EINVAL, "%s: layer %u's quantiles are not "
						   "finite magnitudes", path, l);
		}
	}
	hyb_gguf_close(f);
	return rc;
}
