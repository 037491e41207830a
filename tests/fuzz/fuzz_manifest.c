// SPDX-License-Identifier: MIT
/*
 * libFuzzer target for the manifest reader (libhyb/box/manifest.c), the
 * bytes an app takes from another process (hybd) before mapping pools by
 * them. The input's checksum is recomputed first, so that the fuzzer gets
 * past it to the structure. An accepted manifest must keep the reader's
 * promises (docs/BOX.md): every tensor found by its name, every resident
 * tensor, bundle and part inside its pool, a split tensor's parts covering
 * its rows in order in weight pools on their nodes. Everything handed out
 * is touched, so that AddressSanitizer sees any pointer past its object.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hyb/manifest.h"

static volatile size_t sink;

static void check_tensor(const struct hyb_manifest *m, const struct hyb_manifest_info *mi,
			 const struct hyb_manifest_tensor *t)
{
	uint64_t row = 0;

	sink += strlen(t->name);
	if (hyb_manifest_find(m, t->name) != t)
		abort();
	if (t->pool != HYB_MF_NO_POOL && t->pool != HYB_MF_SPLIT) {
		const struct hyb_mf_pool *p = hyb_manifest_pool(m, t->pool);

		if (!p || t->pool_off > p->bytes || t->bytes > p->bytes - t->pool_off || t->n_parts)
			abort();
	}
	if (t->pool != HYB_MF_SPLIT)
		return;
	if (!t->n_parts || t->n_parts > HYB_MF_MAX_PARTS || t->n_dims != 3)
		abort();
	for (uint32_t k = 0; k < t->n_parts; k++) {
		const struct hyb_mf_part *q = &t->parts[k];
		const struct hyb_mf_pool *p = hyb_manifest_pool(m, q->pool);
		const uint64_t rb = t->bytes / (t->ne[1] * t->ne[2]);

		if (!p || q->pool >= mi->n_pools || p->role != HYB_MF_ROLE_WEIGHTS ||
		    p->node != q->node || q->row0 != row || !q->rows ||
		    q->stride < q->rows * rb || q->pool_off > p->bytes ||
		    (t->ne[2] - 1) > (p->bytes - q->pool_off) / (q->stride ? q->stride : 1))
			abort();
		if ((t->ne[2] - 1) * q->stride + q->rows * rb > p->bytes - q->pool_off)
			abort();
		row += q->rows;
	}
	if (row != t->ne[1])
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct hyb_mf_header h;
	struct hyb_manifest_info mi;
	struct hyb_manifest *m;
	uint8_t *buf;

	if (size > (1u << 20))
		return 0;
	buf = malloc(size ? size : 1);
	if (!buf)
		return 0;
	memcpy(buf, data, size);
	if (size >= sizeof(h)) {
		/* resealed: the structure is what gets tested */
		memcpy(&h, buf, sizeof(h));
		if (h.header_size >= sizeof(h) && h.header_size <= size)
			h.checksum = hyb_mf_checksum(buf + h.header_size, size - h.header_size);
		memcpy(buf, &h, sizeof(h));
	}
	m = hyb_manifest_parse(buf, size);
	free(buf); /* the reader keeps its own copy */
	if (!m)
		return 0;
	hyb_manifest_info(m, &mi);
	sink += strlen(mi.model_path) + strlen(mi.placement) + strlen(mi.name) + mi.meta_len;
	if (mi.meta_len)
		sink += ((const uint8_t *)mi.meta)[mi.meta_len - 1];
	for (uint32_t i = 0; i < mi.n_pools; i++)
		sink += strlen(hyb_manifest_pool(m, i)->name);
	for (uint32_t i = 0; i < mi.n_tensors; i++)
		check_tensor(m, &mi, hyb_manifest_tensor(m, i));
	if (hyb_manifest_tensor(m, mi.n_tensors))
		abort();
	for (uint32_t i = 0; i < mi.n_bundles; i++) {
		const struct hyb_mf_bundle *b = hyb_manifest_bundle_at(m, i);
		const struct hyb_mf_pool *p = b->pool == HYB_MF_NO_POOL ? NULL :
					      hyb_manifest_pool(m, b->pool);

		if (b->pool != HYB_MF_NO_POOL &&
		    (!p || b->pool_off > p->bytes || b->bytes > p->bytes - b->pool_off))
			abort();
		if (hyb_manifest_bundle(m, b->layer, b->group) != b)
			abort();
	}
	hyb_manifest_close(m);
	return 0;
}
