// SPDX-License-Identifier: MIT
/*
 * A context: the KV cache, scratch, threads and the FFN engine (dense,
 * sparse or hybrid) that the forward pass (forward.c) runs a model with, and
 * its accessors (hyb/model.h, hyb/hybrid.h).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "forward_internal.h"
#include "attention.h"
#include "hyb/tensor_type.h"
#include "hyb/testing.h"
#include "hybrid/decode.h"
#include "attention_mla.h"
#include "kv_pages.h"
#include "moe.h"
#include "hybrid/ffn_hybrid.h"
#include "hybrid/moe_hybrid.h"
#include "hybrid/plain_hybrid.h"
#include "sparse/plan_ffn.h"
#include "sparse/sparse_layer.h"
#include "sparse/teal.h"
#include "util/error.h"

static void *alloc_zeroed(size_t bytes)
{
	/* Anonymous mappings: page-aligned, zeroed, and only touched pages
	 * become resident (a large n_ctx costs nothing until it is used; a
	 * paged cache touches the blocks its sequences take). */
	void *p = mmap(NULL, bytes ? bytes : 1, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

	return p == MAP_FAILED ? NULL : p;
}

static void free_mapping(void *p, size_t bytes)
{
	if (p)
		munmap(p, bytes ? bytes : 1);
}

static size_t scratch_bytes(const struct hyb_ctx *c)
{
	const struct hyb_hparams *hp = &c->m->hp;
	size_t nb = c->n_rows, wide = hp->n_ff > hp->n_vocab ? hp->n_ff : hp->n_vocab;

	if (wide < hp->n_embd)
		wide = hp->n_embd;
	return sizeof(float) * nb * (2 * (size_t)hp->n_embd + 2 * (size_t)c->q_dim +
				     2 * (size_t)c->kv_dim + 2 * (size_t)hp->n_ff) +
	       /* xq: the widest row in any activation format (<= 4 bytes/elem) */
	       nb * (4 * wide + 512);
}

/*
 * A plan's dense FFN (plan_ffn.c) sums every column as a one-column call:
 * its GEMMs over a group's rows take any column count unchanged.
 */
static bool plan_invariant(const struct hyb_cpu_kernels *k, const struct hyb_model *m)
{
	const uint32_t last = m->hp.n_ff - (m->n_groups - 1) * m->group_size;

	for (uint32_t l = 0; l < m->hp.n_layer; l++)
		if (hyb_gemm_invariant_cols(k, m->layers[l].plan.bundles.type, m->group_size,
					    false) ||
		    hyb_gemm_invariant_cols(k, m->layers[l].plan.bundles.type, last, false))
			return false;
	return true;
}

/*
 * Where hybd split the expert tensors by rows across nodes (docs/NUMA.md):
 * the threads go to those nodes in blocks, so that each node's rows are
 * read by its own threads first (moe.c's queues). 0, or -1 with the reason.
 */
static int pin_to_split_nodes(struct hyb_ctx *c)
{
	const struct hyb_hparams *hp = &c->m->hp;
	int nodes[HYB_WEIGHT_MAX_PARTS], n = 0;

	for (uint32_t l = hp->n_dense_lead; l < hp->n_layer && hp->n_expert; l++) {
		const struct hyb_weight_split *sp = c->m->layers[l].gate_exps.split;

		for (uint32_t i = 0; sp && i < sp->n; i++) {
			int k = 0;

			while (k < n && nodes[k] != sp->node[i])
				k++;
			if (k == n && n < HYB_WEIGHT_MAX_PARTS && sp->node[i] >= 0)
				nodes[n++] = sp->node[i];
		}
	}
	if (n < 2)
		return 0; /* one node: nothing to gain */
	const unsigned int since = hyb_error_count();
	char why[256];

	if (hyb_threadpool_pin_nodes(c->pool, nodes, n) >= 0)
		return 0;
	snprintf(why, sizeof(why), "%s", hyb_last_error());
	return hyb_error_set(hyb_error_cause(since, -EINVAL), "the experts are split across %d "
			     "NUMA nodes: %s (numa_no_pin, hyb --no-numa-pin, runs the threads "
			     "unpinned)", n, why);
}

struct hyb_ctx *hyb_ctx_new(const struct hyb_model *m, const struct hyb_ctx_params *p)
{
	const struct hyb_hparams *hp = &m->hp;
	struct hyb_ctx *c = calloc(1, sizeof(*c));
	const bool oracle = p && (p->testing & HYB_TESTING_FFN_ORACLE);
	unsigned int since = hyb_error_count();
	char err[1024] = "";
	int nth;

	if (!c) {
		hyb_error_set(-ENOMEM, "out of memory");
		return NULL;
	}
	if (p && (p->testing & ~(HYB_TESTING_FFN_ORACLE | HYB_TESTING_CHECK_ROUTERS))) {
		hyb_error_set(-EINVAL, "unknown testing switches 0x%x", p->testing);
		free(c);
		return NULL;
	}
	c->m = m;
	c->k = hyb_cpu_best();
	c->check_routers = p && (p->testing & HYB_TESTING_CHECK_ROUTERS);
	c->n_ctx = p && p->n_ctx ? p->n_ctx : (hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096);
	/*
	 * A hybrid pass of several sequences keeps its rows in device memory
	 * (docs/HYBRID.md "Several sequences"): prompts go in smaller pieces there
	 */
	c->n_batch = p && p->n_batch ? p->n_batch : p && p->hybrid && p->n_seq > 1 ? 64 : 512;
	c->q_dim = hp->n_head * hp->head_dim;
	c->kv_dim = hp->n_head_kv * hp->head_dim;
	c->n_seq = p && p->n_seq > 1 ? p->n_seq : 1;
	c->invariant = !(p && p->batch_variant);
	if (c->n_ctx == 0 || c->n_ctx > (1u << 24)) {
		hyb_error_set(-EINVAL, "bad context size %u", c->n_ctx);
		goto fail;
	}
	if (c->n_batch > (1u << 16) || c->n_seq > 4096) {
		hyb_error_set(-EINVAL, "bad batch (%u tokens) or sequence count (%u)", c->n_batch,
			      c->n_seq);
		goto fail;
	}
	/* a whole prompt piece beside one token of every other sequence */
	c->n_rows = c->n_batch + c->n_seq - 1;
	c->kv_rows = c->n_ctx;
	if (c->n_seq > 1) {
		const uint64_t kv = p->kv_size ? p->kv_size : (uint64_t)c->n_seq * c->n_ctx;
		const uint64_t blocks = (kv + HYB_KV_BLOCK - 1) / HYB_KV_BLOCK;

		/* a plan's hybrid passes: docs/HYBRID.md "Several sequences" */
		const bool plan_hybrid = p->hybrid && m->group_size && !m->powerinfer &&
					 !hp->n_expert;
		/* ... and a mixture's expert cache: moe_hybrid.h */
		const bool moe_hybrid = p->hybrid && hp->n_expert && !m->group_size;
		/* ... and a plain model's FFNs on the device: plain_hybrid.h */
		const bool plain_hybrid = p->hybrid && !hp->n_expert && !m->group_size &&
					  !m->powerinfer;

		if (p->hybrid && !plan_hybrid && !moe_hybrid && !plain_hybrid) {
			hyb_error_set(-EINVAL, "several sequences (n_seq %u) in a hybrid context: "
				      "a plan's (hybctl plan) or a mixture of experts' expert cache, "
				      "not %s yet", c->n_seq,
				      m->powerinfer ? "a PowerInfer file's" : "this model's");
			goto fail;
		}
		/* a plan's on the CPU: decode rows sparse, prompt rows dense (forward.c) */
		const bool plan_cpu = !p->hybrid && m->group_size && !m->powerinfer;

		if (!p->hybrid && !plan_cpu && (m->powerinfer || p->moe_defer ||
						p->ffn == HYB_FFN_SPARSE)) {
			hyb_error_set(-EINVAL, "several sequences (n_seq %u) run dense on the CPU: "
				      "not with %s yet", c->n_seq,
				      p->moe_defer ? "expert deferral" :
				      m->powerinfer ? "a PowerInfer file's sparse FFNs" :
				      "sparse FFNs");
			goto fail;
		}
		if ((plan_hybrid || plan_cpu) && c->invariant && !plan_invariant(c->k, m)) {
			hyb_error_set(-EINVAL, "several sequences (n_seq %u) of a plan with %s "
				      "bundles: their CPU GEMM is not batch-invariant yet (set "
				      "batch_variant)", c->n_seq,
				      hyb_type_name(m->layers[0].plan.bundles.type));
			goto fail;
		}
		if (blocks * HYB_KV_BLOCK > (1u << 26) || kv < c->n_ctx) {
			hyb_error_set(-EINVAL, "bad KV cache size %llu positions for %u-position "
				      "sequences (at most %u)", (unsigned long long)kv, c->n_ctx,
				      1u << 26);
			goto fail;
		}
		c->kv_rows = (uint32_t)(blocks * HYB_KV_BLOCK);
		c->kv = hyb_kv_pages_new(c->n_seq, (uint32_t)blocks, c->n_ctx);
		c->attn_runs = calloc(c->n_seq, sizeof(*c->attn_runs));
		c->run_cols = calloc(c->n_seq, sizeof(uint32_t));
		if (plan_cpu) {
			c->row_one = calloc(c->n_rows, 1);
			c->need = malloc((size_t)c->n_rows * m->n_groups);
			c->ffn_xs = malloc(sizeof(float) * c->n_rows * hp->n_embd);
			c->ffn_prev = malloc(sizeof(float) * c->n_rows * hp->n_embd);
		}
		if (!c->kv || !c->attn_runs || !c->run_cols ||
		    (plan_cpu && (!c->row_one || !c->need || !c->ffn_xs || !c->ffn_prev))) {
			hyb_error_set(-ENOMEM, "out of memory");
			goto fail;
		}
	}
	c->ones = malloc(sizeof(uint32_t) * c->n_rows);
	c->rows = malloc(sizeof(uint32_t) * c->n_rows);
	c->seg = malloc(sizeof(uint32_t) * 6 * c->n_rows);
	if (!c->ones || !c->rows || !c->seg) {
		hyb_error_set(-ENOMEM, "out of memory");
		goto fail;
	}
	for (uint32_t i = 0; i < c->n_rows; i++) {
		c->ones[i] = 1;
		c->rows[i] = i;
	}
	c->pool = hyb_threadpool_new(p ? p->n_threads : 0);
	if (!c->pool) {
		hyb_error_set(-errno, "cannot start threads: %s", strerror(errno));
		goto fail;
	}
	nth = hyb_threadpool_size(c->pool);
	if (!(p && p->numa_no_pin) && pin_to_split_nodes(c))
		goto fail;

	/* latent attention reads V from the K rows (attention_mla.c): no V cache */
	c->kv_bytes = (hp->kv_lora ? 1 : 2) * sizeof(uint16_t) * (size_t)hp->n_layer * c->kv_rows *
		      c->kv_dim;
	c->kcache = alloc_zeroed(hp->kv_lora ? c->kv_bytes : c->kv_bytes / 2);
	c->vcache = hp->kv_lora ? c->kcache : alloc_zeroed(c->kv_bytes / 2);
	/* per thread scratch of attend(), a cache line apart from the next thread's */
	c->attn_tmp_stride =
		(hyb_attend_tmp_bytes(hp->head_dim, m->powerinfer ? c->n_ctx : 0) + 63) & ~63ul;
	c->attn_tmp = alloc_zeroed(c->attn_tmp_stride * nth);
	c->x = alloc_zeroed(scratch_bytes(c));
	if (!c->kcache || !c->vcache || !c->attn_tmp || !c->x) {
		hyb_error_set(-ENOMEM, "out of memory for a %u-token context (%.1f MiB KV cache)",
			      c->n_ctx, c->kv_bytes / 1048576.0);
		goto fail;
	}
	c->xn = c->x + (size_t)c->n_rows * hp->n_embd;
	c->q = c->xn + (size_t)c->n_rows * hp->n_embd;
	c->att = c->q + (size_t)c->n_rows * c->q_dim;
	c->kk = c->att + (size_t)c->n_rows * c->q_dim;
	c->vv = c->kk + (size_t)c->n_rows * c->kv_dim;
	c->g = c->vv + (size_t)c->n_rows * c->kv_dim;
	c->u = c->g + (size_t)c->n_rows * hp->n_ff;
	c->xq = c->u + (size_t)c->n_rows * hp->n_ff;
	if ((m->group_size || m->powerinfer) &&
	    !(c->plan = hyb_ffn_plan_scratch_new(m, c->n_rows, nth))) {
		hyb_error_set(-ENOMEM, "out of memory for the FFN scratch of a plan");
		goto fail;
	}
	if (p && p->moe_defer && (!hp->n_expert || p->moe_defer >= hp->n_expert_used)) {
		hyb_error_set(-EINVAL, "expert deferral of %u experts needs a mixture of experts "
			      "choosing more than that (%u of %u)", p->moe_defer, hp->n_expert_used,
			      hp->n_expert);
		goto fail;
	}
	c->moe_defer = p ? p->moe_defer : 0;
	if (hp->kv_lora && !(c->mla = hyb_mla_scratch_new(m, c->n_rows))) {
		hyb_error_set(-ENOMEM, "out of memory for the latent attention scratch");
		goto fail;
	}
	if (hp->kv_lora && p && p->hybrid) {
		hyb_error_set(-EINVAL, "hybrid decoding of latent attention (deepseek2) is not "
			      "supported yet");
		goto fail;
	}
	if (hp->arch_id == HYB_ARCH_GPTOSS && p && p->hybrid) {
		hyb_error_set(-EINVAL, "hybrid decoding of gpt-oss is not supported yet: the "
			      "device has no attention sinks, expert biases or its clamped SwiGLU "
			      "(it runs on the CPU alone, without --gpu-budget)");
		goto fail;
	}
	if (hp->n_expert && hp->n_dense_lead < hp->n_layer) {
		/* experts are computed on the CPU as they are (docs/MOE.md), hot ones of
		 * a hybrid context's decode steps on its device (the expert cache) */
		if (p && p->ffn == HYB_FFN_SPARSE) {
			hyb_error_set(-EINVAL, "sparse decoding of a mixture-of-experts model is not "
				      "supported: its experts run whole (docs/MOE.md)");
			goto fail;
		}
		c->moe = hyb_moe_scratch_new(m, c->n_rows);
		if (!c->moe) {
			hyb_error_set(-ENOMEM, "out of memory for the expert scratch of a %u-token "
				      "batch", c->n_rows);
			goto fail;
		}
		if (p && p->hybrid) {
			if (hyb_model_wait(m))
				goto fail;
			if (!(c->moe_hybrid = hyb_moe_hybrid_new(m, p->hybrid, c->n_ctx,
								  c->kv ? c->n_rows : 1, err,
								  sizeof(err))))
				goto fail_engine;
		}
	}
	/* A streaming model (only plain ones stream) is waited for piece by piece
	 * by the CPU's prompt pass; the hybrid engine reads it all up front. */
	if (p && p->hybrid && !c->moe_hybrid && hyb_model_wait(m))
		goto fail;
	if (p && p->hybrid && !c->moe_hybrid && !m->group_size && !m->powerinfer) {
		/* a plain model: its parts placed whole (plain_hybrid.h) */
		if (!(c->plain_hybrid = hyb_plain_hybrid_new(m, p->hybrid, c->n_ctx,
							     c->kv ? c->n_rows : 1, err,
							     sizeof(err))))
			goto fail_engine;
	} else if (p && p->hybrid && !c->moe_hybrid) {
		if (p->ffn == HYB_FFN_DENSE) {
			hyb_error_set(-EINVAL, "hybrid decoding is sparse; it cannot run dense");
			goto fail;
		}
		if (!(c->hybrid = hyb_ffn_hybrid_new(m, p->hybrid, oracle, nth, c->n_ctx,
						     c->n_seq, c->n_rows, err, sizeof(err))))
			goto fail_engine;
	} else if ((m->group_size || (m->powerinfer && (m->layers[0].fc1.data ||
							 (p && p->ffn == HYB_FFN_SPARSE)))) &&
		   (!p || p->ffn != HYB_FFN_DENSE) &&
		   !(c->sparse = hyb_ffn_sparse_new(m, nth, err, sizeof(err)))) {
		goto fail_engine;
	}
	if (c->sparse)
		hyb_ffn_sparse_set_oracle(c->sparse, oracle);
	if (m->ffn_thr && hyb_ctx_set_ffn_thresholds(c, m->ffn_thr))
		goto fail;
	if (!m->group_size && !m->powerinfer && p && p->ffn == HYB_FFN_SPARSE) {
		hyb_error_set(-EINVAL, "sparse decoding needs a plan (hybctl plan); this model "
			      "has none");
		goto fail;
	}
	return c;

fail_engine:
	/* the device, pool or cache call underneath that failed says which errno */
	hyb_error_set(hyb_error_cause(since, -EINVAL), "%s", err);
fail:
	hyb_ctx_free(c);
	return NULL;
}

void hyb_ctx_free(struct hyb_ctx *c)
{
	if (!c)
		return;
	if (c->pool) {
		free_mapping(c->attn_tmp, c->attn_tmp_stride * hyb_threadpool_size(c->pool));
		hyb_threadpool_free(c->pool);
	}
	if (c->m && c->m->hp.kv_lora) {
		free_mapping(c->kcache, c->kv_bytes);
	} else {
		free_mapping(c->kcache, c->kv_bytes / 2);
		free_mapping(c->vcache, c->kv_bytes / 2);
	}
	free_mapping(c->x, scratch_bytes(c));
	hyb_ffn_plan_scratch_free(c->plan);
	hyb_ffn_sparse_free(c->sparse);
	hyb_ffn_hybrid_free(c->hybrid);
	hyb_moe_hybrid_free(c->moe_hybrid);
	hyb_plain_hybrid_free(c->plain_hybrid);
	hyb_moe_scratch_free(c->moe);
	hyb_mla_scratch_free(c->mla);
	hyb_kv_pages_free(c->kv);
	free(c->kept);
	free(c->attn_runs);
	free(c->run_cols);
	free(c->ones);
	free(c->rows);
	free(c->seg);
	free(c->row_one);
	free(c->need);
	free(c->ffn_xs);
	free(c->ffn_prev);
	free(c->ffn_thr);
	free(c->teal_thr);
	free(c->teal_idx);
	free(c->teal_val);
	free(c->teal_y);
	free(c->teal_layer_st);
	free(c);
}

bool hyb_ctx_sparse(const struct hyb_ctx *c)
{
	return c->sparse != NULL;
}

void hyb_ctx_sparse_stats(const struct hyb_ctx *c, struct hyb_sparse_stats *out)
{
	if (c->sparse)
		hyb_ffn_sparse_stats(c->sparse, out);
	else
		memset(out, 0, sizeof(*out));
}

void hyb_ctx_sparse_layer_stats(const struct hyb_ctx *c, uint32_t l, struct hyb_sparse_stats *out)
{
	if (c->sparse)
		hyb_ffn_sparse_layer_stats(c->sparse, l, out);
	else
		memset(out, 0, sizeof(*out));
}

void hyb_ctx_sparse_stats_reset(struct hyb_ctx *c)
{
	if (c->sparse)
		hyb_ffn_sparse_stats_reset(c->sparse);
}

bool hyb_ctx_hybrid(const struct hyb_ctx *c)
{
	return c->hybrid != NULL || c->moe_hybrid != NULL || c->plain_hybrid != NULL;
}

/* the device of either engine, or NULL */
static struct hyb_device *ctx_device(const struct hyb_ctx *c)
{
	return c->hybrid ? hyb_ffn_hybrid_device(c->hybrid) :
	       c->moe_hybrid ? hyb_moe_hybrid_device(c->moe_hybrid) :
	       c->plain_hybrid ? hyb_plain_hybrid_device(c->plain_hybrid) : NULL;
}

void hyb_ctx_hybrid_stats(const struct hyb_ctx *c, struct hyb_hybrid_stats *out)
{
	if (c->hybrid)
		hyb_ffn_hybrid_stats(c->hybrid, out);
	else if (c->moe_hybrid)
		hyb_moe_hybrid_stats(c->moe_hybrid, out);
	else if (c->plain_hybrid)
		hyb_plain_hybrid_stats(c->plain_hybrid, out);
	else
		memset(out, 0, sizeof(*out));
}

int hyb_ctx_hybrid_layer_stats(const struct hyb_ctx *c, uint32_t l,
			       struct hyb_hybrid_layer_stats *out)
{
	if (!c->moe_hybrid) {
		memset(out, 0, sizeof(*out));
		return hyb_error_set(-EINVAL, "per-layer statistics are the expert cache's "
				     "(a mixture of experts with a GPU budget)");
	}
	if (hyb_moe_hybrid_layer_stats(c->moe_hybrid, l, out))
		return hyb_error_set(-EINVAL, "layer %u of %u", l, c->m->hp.n_layer);
	return 0;
}

void hyb_ctx_hybrid_stats_reset(struct hyb_ctx *c)
{
	if (c->hybrid)
		hyb_ffn_hybrid_stats_reset(c->hybrid);
	if (c->moe_hybrid)
		hyb_moe_hybrid_stats_reset(c->moe_hybrid);
	if (c->plain_hybrid)
		hyb_plain_hybrid_stats_reset(c->plain_hybrid);
	if (ctx_device(c))
		hyb_device_stats_reset(ctx_device(c));
}

double hyb_ctx_hybrid_lambda(const struct hyb_ctx *c, uint32_t l)
{
	return c->hybrid ? hyb_ffn_hybrid_lambda(c->hybrid, l) :
	       c->moe_hybrid ? hyb_moe_hybrid_lambda(c->moe_hybrid, l) : NAN;
}

void hyb_ctx_hybrid_cache(const struct hyb_ctx *c, uint64_t *resident, uint64_t *slots)
{
	*resident = *slots = 0;
	if (c->hybrid)
		hyb_ffn_hybrid_cache(c->hybrid, resident, slots);
	else if (c->moe_hybrid)
		hyb_moe_hybrid_cache(c->moe_hybrid, resident, slots);
}

int hyb_ctx_hybrid_table(const struct hyb_ctx *c, int32_t *out)
{
	return c->hybrid ? hyb_ffn_hybrid_table(c->hybrid, out) :
	       c->moe_hybrid ? hyb_moe_hybrid_table(c->moe_hybrid, out) : -1;
}

void hyb_ctx_hybrid_offload(const struct hyb_ctx *c, struct hyb_hybrid_offload *out)
{
	memset(out, 0, sizeof(*out));
	if (c->hybrid)
		hyb_ffn_hybrid_placement(c->hybrid, out);
	else if (c->moe_hybrid)
		hyb_moe_hybrid_offload(c->moe_hybrid, out);
	else if (c->plain_hybrid)
		hyb_plain_hybrid_offload(c->plain_hybrid, out);
}

void hyb_ctx_hybrid_device_config(const struct hyb_ctx *c, struct hyb_device_config *out)
{
	memset(out, 0, sizeof(*out));
	if (ctx_device(c))
		hyb_device_get_config(ctx_device(c), out);
}

void hyb_ctx_hybrid_device_stats(const struct hyb_ctx *c, struct hyb_device_stats *out)
{
	memset(out, 0, sizeof(*out));
	if (ctx_device(c))
		hyb_device_stats(ctx_device(c), out);
}

double hyb_ctx_clock(struct hyb_ctx *c)
{
	struct timespec ts;

	if (ctx_device(c))
		return hyb_device_now(ctx_device(c));
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

void hyb_ctx_set_ffn_probe(struct hyb_ctx *c, hyb_ffn_probe_fn fn, void *user)
{
	c->probe = fn;
	c->probe_user = user;
}

void hyb_ctx_moe_stats(const struct hyb_ctx *c, struct hyb_moe_stats *out)
{
	hyb_moe_stats_get(c->moe, out);
}

void hyb_ctx_moe_stats_reset(struct hyb_ctx *c)
{
	hyb_moe_stats_reset(c->moe);
}

const uint64_t *hyb_ctx_moe_counts(const struct hyb_ctx *c, uint32_t layer)
{
	return hyb_moe_counts(c->moe, layer);
}

void hyb_ctx_set_moe_probe(struct hyb_ctx *c, hyb_moe_probe_fn fn, void *user)
{
	c->moe_probe = fn;
	c->moe_probe_user = user;
}

void hyb_ctx_set_ffn_probe_gate(struct hyb_ctx *c, bool on)
{
	c->probe_gate = on;
}

int hyb_ctx_set_ffn_thresholds(struct hyb_ctx *c, const float *thr)
{
	const struct hyb_hparams *hp = &c->m->hp;
	float *t;

	if (!thr) {
		if (c->sparse)
			hyb_ffn_sparse_set_thresholds(c->sparse, NULL);
		if (c->hybrid)
			hyb_ffn_hybrid_set_thresholds(c->hybrid, NULL);
		free(c->ffn_thr);
		c->ffn_thr = NULL;
		return 0;
	}
	if (c->teal_thr)
		return hyb_error_set(-EINVAL, "CATS thresholds do not combine with TEAL's");
	if (hp->n_expert)
		return hyb_error_set(-EINVAL, "CATS thresholds are for dense FFNs; this model's "
				     "are mixtures of experts");
	if (hp->act != HYB_ACT_SILU && hp->act != HYB_ACT_GELU)
		return hyb_error_set(-EINVAL, "this model's FFN is ReLU-family and sparse as it "
				     "is: thresholds are for SiLU and GELU FFNs");
	for (uint32_t l = 0; l < hp->n_layer; l++)
		if (!(thr[l] >= 0) || !isfinite(thr[l]))
			return hyb_error_set(-EINVAL, "threshold of layer %u is %g: must be finite "
					     "and >= 0", l, (double)thr[l]);
	t = malloc(sizeof(float) * hp->n_layer);
	if (!t)
		return hyb_error_set(-ENOMEM, "out of memory");
	memcpy(t, thr, sizeof(float) * hp->n_layer);
	if (c->sparse)
		hyb_ffn_sparse_set_thresholds(c->sparse, t);
	if (c->hybrid)
		hyb_ffn_hybrid_set_thresholds(c->hybrid, t);
	free(c->ffn_thr);
	c->ffn_thr = t;
	return 0;
}

const float *hyb_ctx_ffn_thresholds(const struct hyb_ctx *c)
{
	return c->ffn_thr;
}

int hyb_ctx_set_teal_thresholds(struct hyb_ctx *c, const float *thr)
{
	const size_t n = (size_t)c->m->hp.n_layer * HYB_TEAL_INPUTS;
	int rc;

	if (!thr) {
		free(c->teal_thr);
		c->teal_thr = NULL;
		/* a plain model's device FFNs: the model's weights again */
		return c->plain_hybrid ? hyb_plain_hybrid_set_teal(c->plain_hybrid, NULL, NULL) : 0;
	}
	rc = hyb_teal_check(c->m);
	if (rc)
		return rc;
	if (c->ffn_thr || c->hybrid)
		return hyb_error_set(-EINVAL, "TEAL thresholds do not combine with %s",
				     c->hybrid ? "a plan's or a mixture's hybrid decoding (a plain "
						 "model's takes them on the CPU's share)" :
						 "CATS thresholds");
	for (size_t i = 0; i < n; i++)
		if (!(thr[i] >= 0) || !isfinite(thr[i]))
			return hyb_error_set(-EINVAL, "TEAL threshold of layer %zu's %s input is "
					     "%g: must be finite and >= 0", i / HYB_TEAL_INPUTS,
					     hyb_teal_input_name((uint32_t)(i % HYB_TEAL_INPUTS)),
					     (double)thr[i]);
	/* the transposed layout where the weights can have it (made once per
	 * model, here rather than in the first decode step that needs it) */
	if (!c->teal && !hyb_teal_layout_check(c->m)) {
		/* a pass of several sequences computes its decode steps HYB_TEAL_ROWS at a time */
		const size_t rows = c->kv ? HYB_TEAL_ROWS : 1;
		const size_t ni = rows * hyb_teal_max_in(c->m), no = rows * hyb_teal_max_out(c->m);

		free(c->teal_idx);
		free(c->teal_val);
		free(c->teal_y);
		c->teal_idx = malloc(sizeof(uint32_t) * ni);
		c->teal_val = malloc(sizeof(float) * ni);
		c->teal_y = malloc(sizeof(float) * no);
		if (!c->teal_idx || !c->teal_val || !c->teal_y)
			return hyb_error_set(-ENOMEM, "out of memory");
		c->teal = hyb_teal_layout(c->m, c->pool);
		if (!c->teal)
			return hyb_error_rc();
	}
	if (!c->teal_layer_st && !(c->teal_layer_st = calloc(n, sizeof(*c->teal_layer_st))))
		return hyb_error_set(-ENOMEM, "out of memory");
	if (!c->teal_thr && !(c->teal_thr = malloc(sizeof(float) * n)))
		return hyb_error_set(-ENOMEM, "out of memory");
	memcpy(c->teal_thr, thr, sizeof(float) * n);
	/* a plain model's device FFNs take them too, where the layout exists */
	return c->plain_hybrid ? hyb_plain_hybrid_set_teal(c->plain_hybrid, c->teal, c->teal_thr) : 0;
}

const float *hyb_ctx_teal_thresholds(const struct hyb_ctx *c)
{
	return c->teal_thr;
}

void hyb_ctx_teal_stats(const struct hyb_ctx *c, struct hyb_teal_stats *out)
{
	*out = c->teal_st;
}

int hyb_ctx_teal_layer_stats(const struct hyb_ctx *c, uint32_t layer, uint32_t input,
			     struct hyb_teal_stats *out)
{
	if (layer >= c->m->hp.n_layer || input >= HYB_TEAL_INPUTS)
		return hyb_error_set(-EINVAL, "layer %u input %u: the model has %u layers of %d "
				     "inputs", layer, input, c->m->hp.n_layer, HYB_TEAL_INPUTS);
	if (!c->teal_layer_st)
		memset(out, 0, sizeof(*out));
	else
		*out = c->teal_layer_st[(size_t)layer * HYB_TEAL_INPUTS + input];
	return 0;
}

void hyb_ctx_teal_stats_reset(struct hyb_ctx *c)
{
	memset(&c->teal_st, 0, sizeof(c->teal_st));
	if (c->teal_layer_st)
		memset(c->teal_layer_st, 0,
		       sizeof(*c->teal_layer_st) * c->m->hp.n_layer * HYB_TEAL_INPUTS);
}

void hyb_ctx_set_input_probe(struct hyb_ctx *c, hyb_input_probe_fn fn, void *user)
{
	c->in_probe = fn;
	c->in_probe_user = user;
}

uint32_t hyb_ctx_n_past(const struct hyb_ctx *c)
{
	return c->n_past;
}

uint32_t hyb_ctx_n_ctx(const struct hyb_ctx *c)
{
	return c->n_ctx;
}

uint32_t hyb_ctx_n_batch(const struct hyb_ctx *c)
{
	return c->n_batch;
}

int hyb_ctx_n_threads(const struct hyb_ctx *c)
{
	return hyb_threadpool_size(c->pool);
}

uint64_t hyb_ctx_kv_bytes(const struct hyb_ctx *c)
{
	return c->kv_bytes;
}

void hyb_ctx_reset(struct hyb_ctx *c)
{
	c->n_past = 0;
	if (c->hybrid)
		hyb_decode_hybrid_reset(c);
	if (c->moe_hybrid)
		hyb_moe_decode_reset(c);
	if (c->plain_hybrid)
		hyb_plain_decode_reset(c);
}
