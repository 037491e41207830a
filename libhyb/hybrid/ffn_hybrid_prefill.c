// SPDX-License-Identifier: MIT
/*
 * A prompt batch's FFN (hyb/hybrid.h): dense, split by group the way a
 * decode step splits by neuron. The groups whose bundles have landed in the
 * device cache run on the device, row after row of the batch; the CPU runs
 * the others as one batch (the plan's bundles as a GEMM) and skips these.
 */
#include <string.h>

#include "dense.h"
#include "ffn_hybrid_internal.h"

bool hyb_ffn_hybrid_prefill_on_device(const struct hyb_ffn_hybrid *h)
{
	return !h->prefill_cpu && h->hd && hyb_hdense_layers_on(h->hd) > 0;
}

const uint8_t *hyb_ffn_hybrid_prefill_split(struct hyb_ffn_hybrid *h, uint32_t l)
{
	h->n_pre = 0;
	memset(h->pre_skip, 0, h->NG);
	/* oracle mode keeps the CPU batch's sums (tests compare bits) */
	if (h->oracle || hyb_ffn_hybrid_cpu_dense(h, l))
		return NULL;
	memset(h->usable, -1, h->NG);
	(void)hyb_ffn_hybrid_cache_poll(h);	/* a failure shows at the next decode step */
	for (uint32_t g = 0; g < h->NG; g++) {
		if (!group_usable(h, l, g))
			continue;
		h->pre_skip[g] = 1;
		for (uint32_t i = g * h->GS; i < g * h->GS + group_neurons(h, g); i++)
			h->h_list[h->n_pre++] = i;
	}
	return h->n_pre ? h->pre_skip : NULL;
}

int hyb_ffn_hybrid_prefill_ffn(struct hyb_ffn_hybrid *h, uint32_t l, const float *xn, uint32_t n,
			       float *y, char *err, size_t errlen)
{
	const size_t E = h->E;

	for (uint32_t t = 0; t < n && h->n_pre; t++) {
		struct hyb_dev_ffn f =
			hyb_ffn_hybrid_dev_ffn(h, l, h->d_xn, h->d_list, h->n_pre, h->d_y);

		if (hyb_ffn_hybrid_dev_inputs(h, l, xn + t * E, h->n_pre, false) ||
		    hyb_device_sparse_ffn(h->dev, HYB_STREAM_COMPUTE, &f) ||
		    hyb_ffn_hybrid_dev_result(h, sizeof(float) * E) ||
		    hyb_device_sync(h->dev, h->ev_out))
			return dev_fail(h, err, errlen, "prompt FFN on the device");
		memcpy(y + t * E, h->h_y, sizeof(float) * E);
	}
	return 0;
}
