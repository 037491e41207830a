// SPDX-License-Identifier: MIT
/*
 * The device's half of a split FFN (PowerInfer 5.3): the device list, the
 * neuron table and xn go up on CRITICAL, the sparse FFN kernel runs on
 * COMPUTE over the groups in the cache, and its partial result comes back
 * on CRITICAL or is merged into the residual stream on the device.
 */
#include <string.h>

#include "dense.h"
#include "ffn_hybrid_internal.h"
#include "sparse/sparse_layer.h"

/* The device list and table go up; xn too unless it is on the device already (on_dev). */
int hyb_ffn_hybrid_dev_inputs(struct hyb_ffn_hybrid *h, uint32_t l, const float *xn,
			      uint32_t n_dev, bool on_dev)
{
	const uint64_t tb = sizeof(int32_t) * h->NG;

	if (!on_dev) {
		memcpy(h->h_xn, xn, sizeof(float) * h->E);
		if (hyb_device_h2d(h->dev, HYB_STREAM_CRITICAL, h->d_xn, h->h_xn,
				   sizeof(float) * h->E))
			return -1;
		h->st.critical_bytes += sizeof(float) * h->E;
	}
	if (hyb_device_h2d(h->dev, HYB_STREAM_CRITICAL, h->d_list, h->h_list,
			   sizeof(uint32_t) * n_dev))
		return -1;
	h->st.critical_bytes += sizeof(uint32_t) * n_dev;
	if (h->dirty[l]) {
		if (hyb_device_h2d(h->dev, HYB_STREAM_CRITICAL, h->tables + (uint64_t)l * tb,
				   h->table + (size_t)l * h->NG, tb))
			return -1;
		h->st.critical_bytes += tb;
		h->dirty[l] = false;
	}
	if (hyb_device_record(h->dev, HYB_STREAM_CRITICAL, h->ev_in) ||
	    hyb_device_wait(h->dev, HYB_STREAM_COMPUTE, h->ev_in))
		return -1;
	return 0;
}

struct hyb_dev_ffn hyb_ffn_hybrid_dev_ffn(const struct hyb_ffn_hybrid *h, uint32_t l, hyb_dptr xn,
					  hyb_dptr list, uint32_t n, hyb_dptr y)
{
	return (struct hyb_dev_ffn){
		.type = hyb_ffn_sparse_bundles(h->sp, l)->type,
		.n_embd = h->E, .n_ff = h->F, .group_size = h->GS, .act = h->m->hp.act,
		.thr = h->thr ? h->thr[l] : 0.0f,
		.table = h->tables + (uint64_t)l * h->NG * sizeof(int32_t),
		.cache = h->cache, .slot_bytes = h->slot_bytes,
		.xn = xn, .active = list, .n_active = n, .y = y,
	};
}

int hyb_ffn_hybrid_dev_result(struct hyb_ffn_hybrid *h, uint64_t bytes)
{
	if (hyb_device_record(h->dev, HYB_STREAM_COMPUTE, h->ev_k) ||
	    hyb_device_wait(h->dev, HYB_STREAM_CRITICAL, h->ev_k) ||
	    hyb_device_d2h(h->dev, HYB_STREAM_CRITICAL, h->h_y, h->d_y, bytes) ||
	    hyb_device_record(h->dev, HYB_STREAM_CRITICAL, h->ev_out))
		return -1;
	h->st.critical_bytes += bytes;
	return 0;
}

/*
 * The merge on the device (on_dev): y = y_dev + y_cpu, then x += y, in the
 * order the host merge adds them, so both give the same bits. Nothing
 * waits: the next layer's work follows on COMPUTE.
 */
int hyb_ffn_hybrid_dev_merge(struct hyb_ffn_hybrid *h, uint32_t n_dev, uint32_t n_cpu)
{
	const hyb_dptr x = hyb_hdense_x(h->hd);
	const uint64_t b = sizeof(float) * h->E;

	if (n_cpu) {
		memcpy(h->h_ycpu, h->y_cpu, b);
		if (hyb_device_h2d(h->dev, HYB_STREAM_CRITICAL, h->d_ycpu, h->h_ycpu, b) ||
		    hyb_device_record(h->dev, HYB_STREAM_CRITICAL, h->ev_in) ||
		    hyb_device_wait(h->dev, HYB_STREAM_COMPUTE, h->ev_in))
			return -1;
		h->st.critical_bytes += b;
	}
	if (n_dev && n_cpu)
		return hyb_device_add(h->dev, HYB_STREAM_COMPUTE, h->d_y, h->d_ycpu, h->E) ||
		       hyb_device_add(h->dev, HYB_STREAM_COMPUTE, x, h->d_y, h->E);
	if (n_dev || n_cpu)
		return hyb_device_add(h->dev, HYB_STREAM_COMPUTE, x, n_dev ? h->d_y : h->d_ycpu,
				      h->E);
	return 0;
}

/* Oracle mode: one kernel per device group, each into its own partial (dgroup[g]: which). */
static int run_by_group(struct hyb_ffn_hybrid *h, uint32_t l, hyb_dptr d_xn, uint32_t n_dev,
			char *err, size_t errlen)
{
	uint32_t n_dgroups = 0;

	memset(h->dgroup, 0xff, sizeof(*h->dgroup) * h->NG);
	for (uint32_t i = 0; i < n_dev;) {
		const uint32_t g = h->h_list[i] / h->GS;
		uint32_t j = i + 1;

		while (j < n_dev && h->h_list[j] / h->GS == g)
			j++;
		struct hyb_dev_ffn f = hyb_ffn_hybrid_dev_ffn(h, l, d_xn,
			h->d_list + sizeof(uint32_t) * i, j - i,
			h->d_y + sizeof(float) * h->E * n_dgroups);

		if (hyb_device_sparse_ffn(h->dev, HYB_STREAM_COMPUTE, &f))
			return dev_fail(h, err, errlen, "device FFN");
		h->dgroup[g] = n_dgroups++;
		i = j;
	}
	if (hyb_ffn_hybrid_dev_result(h, sizeof(float) * h->E * n_dgroups))
		return dev_fail(h, err, errlen, "device FFN");
	return 0;
}

int hyb_ffn_hybrid_dev_run(struct hyb_ffn_hybrid *h, uint32_t l, const float *xn, uint32_t n_dev,
			   bool on_dev, char *err, size_t errlen)
{
	const hyb_dptr d_xn = on_dev ? hyb_hdense_xn(h->hd) : h->d_xn;

	if (hyb_ffn_hybrid_dev_inputs(h, l, xn, n_dev, on_dev) ||
	    hyb_device_record(h->dev, HYB_STREAM_COMPUTE, h->ev_k0))
		return dev_fail(h, err, errlen, "device inputs");
	if (h->oracle)
		return run_by_group(h, l, d_xn, n_dev, err, errlen);
	struct hyb_dev_ffn f = hyb_ffn_hybrid_dev_ffn(h, l, d_xn, h->d_list, n_dev, h->d_y);

	if (hyb_device_sparse_ffn(h->dev, HYB_STREAM_COMPUTE, &f) ||
	    (on_dev ? hyb_device_record(h->dev, HYB_STREAM_COMPUTE, h->ev_k)
		    : hyb_ffn_hybrid_dev_result(h, sizeof(float) * h->E)))
		return dev_fail(h, err, errlen, "device FFN");
	return 0;
}
