// SPDX-License-Identifier: MIT
/*
 * `hybctl plan` end to end: check the model and the profile, choose the
 * group size, group each layer's neurons, place groups under the GPU budget,
 * train the predictors, and stream the plan GGUF (hyb/plan.h) layer by layer
 * from the mapped model.
 *
 * Bundles (DynamicInfer App. C.2: a neuron's gate, up and down weights in
 * one contiguous block, here one block per group): gate and up rows are the
 * source rows' bytes in the new order. Down is stored transposed, so its
 * columns are dequantized, gathered and requantized with the reference
 * quantizer in the bundle type. F32 and F16 round-trip exactly; for the
 * quantized types (every type the sparse FFN takes: hyb_sparse_type_ok())
 * the new blocks run along n_embd instead of n_ff and pick new scales,
 * which adds a small error (measured and printed per layer; on synthetic
 * weights 0.36% RMS of the weights for Q8_0 and 4.4% for Q4_0, at most half
 * a quantization step, one step at Q4_0's clipped end). The K-quants need
 * n_embd % 256 == 0 for that (their rows are whole super-blocks).
 *
 * What is reserved on the GPU before groups are placed (PowerInfer keeps the
 * dense part of the model on the GPU and gives predictors priority, 8.3.4):
 * every tensor that is not an FFN matrix — attention, norms, the output head
 * — and every predictor. token_embd is left out unless it is also the head
 * (tied): a lookup reads one row per token and stays in host memory, as in
 * llama.cpp. The KV cache stays in host memory (PowerInfer 2.4).
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cpu_kernels.h"
#include "sparse_ffn_kernels.h"
#include "hyb/gguf.h"
#include "hyb/model.h"
#include "hyb/sparsity.h"
#include "hyb/threadpool.h"
#include "plan_internal.h"
#include "util/error.h"

void hyb_plan_opts_default(struct hyb_plan_opts *o)
{
	memset(o, 0, sizeof(*o));
	/* KAIROX Table 2 (PCIe 4.0) fitted to latency + bytes / bandwidth */
	o->link = (struct hyb_plan_link){ 1.36e-6, 25.2e9 };
	o->target_efficiency = 0.8;
	o->max_groups = 1024;
	o->grouping = HYB_PLAN_GROUP_METIS;
	o->group.top_k = 32;
	o->group.max_samples = 16384;
	o->group.seed = 1;
	/* one sync of a split layer; DDR5 dual channel; a consumer GPU's VRAM */
	o->sync = (struct hyb_plan_sync_model){ 20e-6, 50e9, 1000e9 };
	o->pred.target_recall = 0.998; /* see hybctl plan --help */
	o->pred.max_epochs = 10;
	o->pred.gflop = 200;
	o->pred.batch = 128;
	o->pred.seed = 1;
	o->pred_hidden_lo = 32;
	o->pred_hidden_hi = 1024;
	o->place_nodes = 20000;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static const char *mib(uint64_t b, char *buf, size_t len)
{
	if (b >= (1ull << 30))
		snprintf(buf, len, "%.2f GiB", b / 1073741824.0);
	else if (b >= (1ull << 20))
		snprintf(buf, len, "%.1f MiB", b / 1048576.0);
	else
		snprintf(buf, len, "%.1f KiB", b / 1024.0);
	return buf;
}

struct plan {
	const struct hyb_plan_opts *o;
	const struct hyb_profile *prof;
	struct hyb_model *m;
	struct hyb_threadpool *pool;
	uint32_t n_layer, n_embd, n_ff, gs, n_groups, type;
	uint64_t row_bytes;       /* one n_embd row of the bundle type */
	int32_t **perm;           /* [layer][n_ff] */
	int8_t **gpu;             /* [layer][n_groups] */
	float **freq;             /* [layer][n_groups] */
	uint32_t *hidden;         /* [layer] */
	uint32_t *order;          /* layers in file order */
	uint64_t dense_bytes, pred_bytes;
	bool import;              /* a PowerInfer model's predictors are kept */
	uint8_t **hot;            /* [layer][n_ff] PowerInfer GPU index, or NULL */
	FILE *out;                /* report (stdout, or NULL when quiet) */
};

static void say(struct plan *P, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(struct plan *P, const char *fmt, ...)
{
	va_list ap;

	if (!P->out)
		return;
	va_start(ap, fmt);
	vfprintf(P->out, fmt, ap);
	va_end(ap);
	fflush(P->out);
}

/* "blk.N.ffn_gate.weight" etc.: the FFN matrix tensors a plan replaces; layer in *l */
static bool ffn_matrix(const struct hyb_gguf_str name, uint32_t *l)
{
	char buf[96], rest[64];
	unsigned layer;
	int n = 0;

	if (name.len >= sizeof(buf))
		return false;
	memcpy(buf, name.ptr, name.len);
	buf[name.len] = 0;
	if (sscanf(buf, "blk.%u.%63[a-z0-9_.]%n", &layer, rest, &n) != 2 || (size_t)n != name.len)
		return false;
	*l = layer;
	/* a PowerInfer model's transposed down and predictor are replaced too */
	return !strcmp(rest, "ffn_gate.weight") || !strcmp(rest, "ffn_up.weight") ||
	       !strcmp(rest, "ffn_down.weight") || !strcmp(rest, "ffn_down_t.weight") ||
	       !strcmp(rest, "fc1.weight") || !strcmp(rest, "fc2.weight");
}

/* ---- checks ------------------------------------------------------------------ */

static int check_model(struct plan *P, const char *path)
{
	const struct hyb_gguf_file *f = P->m->gguf;
	const struct hyb_layer *L0 = &P->m->layers[0];

	P->n_layer = P->m->hp.n_layer;
	P->n_embd = P->m->hp.n_embd;
	P->n_ff = P->m->hp.n_ff;
	if (hyb_gguf_find(f, HYB_PLAN_KEY_VERSION))
		return hyb_error_set(-EINVAL, "%s is already a plan file (plan the source model)",
				     path);
	/*
	 * The sparse and hybrid engines compute a gate/up/down FFN added to the
	 * residual: llama's, Qwen 2's and 3's (their attention's biases and Q/K
	 * norms are forward.c's and the device's) and Phi-3's (the loader slices
	 * its fused gate/up; its scaled q keeps attention on the CPU in hybrid
	 * decoding) and Gemma 3's (its norm after the FFN is forward.c's, for
	 * every FFN path; GeGLU runs on the CPU only: its hybrid context is
	 * refused). Not experts.
	 */
	if (P->m->hp.arch_id != HYB_ARCH_LLAMA && P->m->hp.arch_id != HYB_ARCH_QWEN2 &&
	    P->m->hp.arch_id != HYB_ARCH_QWEN3 && P->m->hp.arch_id != HYB_ARCH_PHI3 &&
	    P->m->hp.arch_id != HYB_ARCH_GEMMA3)
		return hyb_error_set(-EINVAL, "%s: architecture '%s' cannot be planned yet "
				     "(sparse and hybrid decoding run llama, qwen2, qwen3, phi3 "
				     "and gemma3 models)", path, P->m->hp.arch);
	P->type = L0->gate.type;
	for (uint32_t l = 0; l < P->n_layer; l++) {
		const struct hyb_layer *L = &P->m->layers[l];

		if (L->gate.type != P->type || L->up.type != P->type)
			return hyb_error_set(-EINVAL, "%s: layer %u FFN has gate %s / up %s; a "
					     "plan needs one type for every gate and up", path, l,
					     hyb_type_name(L->gate.type),
					     hyb_type_name(L->up.type));
	}
	/* bundles keep the source type: it must be one the sparse FFN runs */
	if (!hyb_sparse_type_ok(P->type)) {
		return hyb_error_set(-EINVAL, "%s: FFN type %s is not supported for plans "
				     "(supported: %s, the bundle types the sparse FFN runs)", path,
				     hyb_type_name(P->type), hyb_sparse_type_list());
	}
	P->row_bytes = hyb_row_bytes(P->type, P->n_embd);
	if (!P->row_bytes)
		return hyb_error_set(-EINVAL, "%s: n_embd %u is not a multiple of the %s block "
				     "(%u elements): bundle rows are n_embd long", path, P->n_embd,
				     hyb_type_name(P->type), hyb_type_info(P->type)->blck);
	return 0;
}

static int check_profile(struct plan *P)
{
	const struct hyb_profile *p = P->prof;

	if (p->n_layer != P->n_layer || p->n_embd != P->n_embd || p->n_ff != P->n_ff)
		return hyb_error_set(-EINVAL, "profile does not match the model: profile has %u "
				     "layers, n_embd %u, n_ff %u; model has %u, %u, %u",
				     p->n_layer, p->n_embd, p->n_ff, P->n_layer, P->n_embd,
				     P->n_ff);
	if (p->active_words != (p->n_ff + 63) / 64 || !p->layers)
		return hyb_error_set(-EINVAL, "profile is malformed (active_words %u for n_ff %u)",
				     p->active_words, p->n_ff);
	/* CATS (hyb/sparsity.h): a SiLU or GELU FFN is sparse only under thresholds */
	const bool gated = P->m->hp.act == HYB_ACT_SILU || P->m->hp.act == HYB_ACT_GELU;

	if (gated && !p->cats_threshold)
		return hyb_error_set(-EINVAL, "the profile has no CATS thresholds and this %s "
				     "model's activations are never 0: profile it with hybctl "
				     "profile --sparsity S (docs/SPARSITY.md)",
				     P->m->hp.act == HYB_ACT_SILU ? "SiLU" : "GELU");
	if (!gated && p->cats_threshold)
		return hyb_error_set(-EINVAL, "the profile has CATS thresholds, made for a SiLU "
				     "or GELU model; this model's FFN is ReLU-family and sparse as "
				     "it is: profile it without --sparsity");
	if (!p->n_tokens || p->n_samples < 20)
		return hyb_error_set(-EINVAL, "profile has %llu tokens and %u samples; a plan "
				     "needs at least 20 samples", (unsigned long long)p->n_tokens,
				     p->n_samples);
	return 0;
}

/* ---- the stages ---------------------------------------------------------------------- */

static int choose_group_size(struct plan *P)
{
	const struct hyb_plan_opts *o = P->o;
	const uint64_t nb = 3 * P->row_bytes;
	char b1[32];

	if (o->group_size) {
		if (o->group_size > P->n_ff)
			return hyb_error_set(-EINVAL, "--group-size %u is larger than n_ff %u",
					     o->group_size, P->n_ff);
		P->gs = o->group_size;
		say(P, "group size %u (given): a bundle is %s, %.1f%% of the link\n", P->gs,
		    mib(P->gs * nb, b1, sizeof(b1)),
		    100 * hyb_plan_link_efficiency(&o->link, P->gs * nb));
	} else {
		uint32_t by_link = hyb_plan_pick_group_size(&o->link, nb, P->n_ff, o->target_efficiency,
							0);

		P->gs = hyb_plan_pick_group_size(&o->link, nb, P->n_ff, o->target_efficiency,
					     o->max_groups);
		say(P, "group size %u: a bundle (%u neurons x 3 rows of %s) is %s; the link "
		    "(%.2f us + %.1f GB/s) moves it at %.1f%% of its bandwidth", P->gs, P->gs,
		    hyb_type_name(P->type), mib(P->gs * nb, b1, sizeof(b1)),
		    o->link.latency_s * 1e6, o->link.bw / 1e9,
		    100 * hyb_plan_link_efficiency(&o->link, P->gs * nb));
		if (P->gs > by_link)
			say(P, "; %u would reach the %.0f%% target but makes more than %u groups "
			    "per layer\n", by_link, 100 * o->target_efficiency, o->max_groups);
		else if (P->gs > 1)
			say(P, " (target %.0f%%; %u neurons reach %.1f%%)\n",
			    100 * o->target_efficiency, P->gs - 1,
			    100 * hyb_plan_link_efficiency(&o->link, (P->gs - 1) * nb));
		else
			say(P, " (target %.0f%%)\n", 100 * o->target_efficiency);
	}
	P->n_groups = (P->n_ff + P->gs - 1) / P->gs;
	return 0;
}

static int group_all(struct plan *P)
{
	struct hyb_plan_group_opts go = P->o->group;
	static const char *const names[] = { "metis", "contiguous", "random" };

	go.group_size = P->gs;
	go.pool = P->pool;
	say(P, "grouping (%s, %u groups/layer): share of co-active pairs inside a group, "
	    "mean active groups per token\n", names[P->o->grouping], P->n_groups);
	say(P, "  layer   %-22s %-22s %-22s time\n", names[P->o->grouping], "contiguous",
	    "random");
	for (uint32_t l = 0; l < P->n_layer; l++) {
		struct hyb_plan_group_quality q[3];
		struct hyb_plan_group_info info;
		int32_t *tmp = malloc((size_t)P->n_ff * sizeof(*tmp));
		char why[512];
		int rc;

		if (!tmp)
			return hyb_error_set(-ENOMEM, "out of memory");
		rc = hyb_plan_group_layer(P->prof, l, P->o->grouping, &go, P->perm[l], &info, why,
					  sizeof(why));
		if (rc) {
			free(tmp);
			return hyb_error_set(rc, "%s", why);
		}
		hyb_plan_group_quality(P->prof, l, P->perm[l], P->gs, &q[0]);
		for (int b = 1; b < 3; b++) {
			char e2[64];

			if (hyb_plan_group_layer(P->prof, l, (enum hyb_plan_grouping)b, &go, tmp, NULL, e2,
					     sizeof(e2)))
				memset(&q[b], 0, sizeof(q[b]));
			else
				hyb_plan_group_quality(P->prof, l, tmp, P->gs, &q[b]);
		}
		free(tmp);
		say(P, "  %5u   %.3f %7.1f %-8s %.3f %7.1f %-8s %.3f %7.1f %-8s %.2fs", l,
		    q[0].inside, q[0].active_groups, "", q[1].inside, q[1].active_groups, "",
		    q[2].inside, q[2].active_groups, "", info.seconds);
		if (info.variant >= 0)
			say(P, " (%s, %llu edges, %u moved)", hyb_plan_group_variant_name(info.variant),
			    (unsigned long long)info.edges, info.moved);
		say(P, "\n");
	}
	return 0;
}

static uint64_t group_rows(const struct plan *P, uint32_t g)
{
	uint32_t end = (g + 1) * P->gs < P->n_ff ? (g + 1) * P->gs : P->n_ff;

	return end - g * P->gs;
}

static int place_all(struct plan *P)
{
	const struct hyb_plan_opts *o = P->o;
	const struct hyb_profile *prof = P->prof;
	struct hyb_plan_place_layer *L = calloc(P->n_layer, sizeof(*L));
	double **val = calloc(P->n_layer, sizeof(*val)), total = 0;
	uint64_t *bytes = malloc((size_t)P->n_groups * sizeof(*bytes)), budget, all = 0;
	uint32_t c_l = hyb_plan_min_neurons(&o->sync, 3 * P->row_bytes, P->n_ff);
	uint32_t m_g = (c_l + P->gs - 1) / P->gs;
	struct hyb_plan_place_result r;
	char b1[32], b2[32], b3[32], b4[32], b5[32];
	int rc = -ENOMEM;

	if (!L || !val || !bytes) {
		hyb_error_set(rc, "out of memory");
		goto out;
	}
	if (m_g > P->n_groups)
		m_g = P->n_groups;
	for (uint32_t g = 0; g < P->n_groups; g++)
		bytes[g] = group_rows(P, g) * 3 * P->row_bytes;
	for (uint32_t l = 0; l < P->n_layer; l++) {
		val[l] = calloc(P->n_groups, sizeof(double));
		if (!val[l]) {
			hyb_error_set(rc, "out of memory");
			goto out;
		}
		for (uint32_t i = 0; i < P->n_ff; i++) {
			double f = (double)prof->layers[l].count[P->perm[l][i]] / prof->n_tokens;

			val[l][i / P->gs] += f;
		}
		for (uint32_t g = 0; g < P->n_groups; g++) {
			P->freq[l][g] = (float)(val[l][g] / group_rows(P, g));
			all += bytes[g];
		}
		/* with PowerInfer's GPU index a group is worth the GPU neurons it
		 * holds; our frequencies only break ties (each is < 1e-3) */
		if (P->hot) {
			for (uint32_t g = 0; g < P->n_groups; g++)
				val[l][g] *= 1e-3 / P->gs;
			for (uint32_t i = 0; i < P->n_ff; i++)
				val[l][i / P->gs] += P->hot[l][P->perm[l][i]];
		}
		for (uint32_t g = 0; g < P->n_groups; g++)
			total += val[l][g];
		L[l] = (struct hyb_plan_place_layer){ P->n_groups, val[l], bytes, m_g };
	}
	budget = o->gpu_budget - P->dense_bytes - P->pred_bytes;
	if (hyb_plan_place_solve(L, P->n_layer, budget, o->place_nodes, P->gpu, &r)) {
		hyb_error_set(rc, "out of memory in the placement solver");
		goto out;
	}
	say(P, "placement: budget %s = dense %s + predictors %s + groups %s of %s\n",
	    mib(o->gpu_budget, b1, sizeof(b1)), mib(P->dense_bytes, b2, sizeof(b2)),
	    mib(P->pred_bytes, b3, sizeof(b3)), mib(r.bytes, b4, sizeof(b4)),
	    mib(all, b5, sizeof(b5)));
	say(P, "  C_l = %u neurons = %u groups (T_sync %.0f us, CPU %.0f GB/s, GPU %.0f GB/s, "
	    "%llu-byte neurons)\n", c_l, m_g, o->sync.t_sync * 1e6, o->sync.bw_cpu / 1e9,
	    o->sync.bw_gpu / 1e9, (unsigned long long)(3 * P->row_bytes));
	say(P, "  impact on GPU %.1f%% of all %s (%s; LP bound without the per-layer "
	    "minimum %.1f%%)\n", total > 0 ? 100 * r.value / total : 0,
	    P->hot ? "PowerInfer's GPU neurons" : "activations",
	    r.optimal ? "proven optimal" : "greedy + bounded search, not proven optimal",
	    total > 0 ? 100 * r.bound / total : 0);
	say(P, "  groups on GPU per layer:");
	for (uint32_t l = 0; l < P->n_layer; l++) {
		uint32_t k = 0;

		for (uint32_t g = 0; g < P->n_groups; g++)
			k += P->gpu[l][g] != 0;
		say(P, " %u", k);
	}
	say(P, "\n");
	rc = 0;
out:
	for (uint32_t l = 0; val && l < P->n_layer; l++)
		free(val[l]);
	free(val);
	free(L);
	free(bytes);
	return rc;
}

static void reserve(struct plan *P)
{
	const struct hyb_gguf_file *f = P->m->gguf;
	bool tied = !hyb_gguf_find_tensor(f, "output.weight");

	for (uint64_t t = 0; t < f->n_tensors; t++) {
		uint32_t l;

		if (ffn_matrix(f->tensors[t].name, &l))
			continue;
		if (!tied && hyb_gguf_str_eq(f->tensors[t].name, "token_embd.weight"))
			continue;
		P->dense_bytes += f->tensors[t].nbytes;
	}
	for (uint32_t l = 0; l < P->n_layer; l++) {
		if (!P->import) /* imported predictors keep their own size */
			P->hidden[l] = P->o->pred.hidden ? P->o->pred.hidden
					  : hyb_plan_pred_hidden(P->prof, l, P->o->pred_hidden_lo,
							     P->o->pred_hidden_hi);
		P->pred_bytes += (uint64_t)P->hidden[l] * (P->n_embd * 2 + 4) +
				 (uint64_t)P->n_ff * (P->hidden[l] * 2 + 4);
	}
}

/* ---- the file --------------------------------------------------------------------------- */

static int add_layer_tensors(struct plan *P, struct hyb_gguf_writer *w, uint32_t l)
{
	char name[96];
	uint64_t ne[2];
	int rc = 0;

	/* the first failure's errno; its message names the tensor */
#define ADD(suffix, type, nd, a, b, data)                                              \
	do {                                                                           \
		snprintf(name, sizeof(name), "blk.%u." suffix, l);                     \
		ne[0] = (a);                                                           \
		ne[1] = (b);                                                           \
		if (!rc)                                                               \
			rc = hyb_gguf_writer_add_tensor(w, name, type, nd, ne, data);  \
	} while (0)
	ADD(HYB_PLAN_T_BUNDLES, P->type, 2, P->n_embd, 3ull * P->n_ff, NULL);
	ADD(HYB_PLAN_T_PERM, HYB_TYPE_I32, 1, P->n_ff, 1, P->perm[l]);
	ADD(HYB_PLAN_T_GPU, HYB_TYPE_I8, 1, P->n_groups, 1, P->gpu[l]);
	ADD(HYB_PLAN_T_FREQ, HYB_TYPE_F32, 1, P->n_groups, 1, P->freq[l]);
	ADD(HYB_PLAN_T_FC1_W, HYB_TYPE_F16, 2, P->n_embd, P->hidden[l], NULL);
	ADD(HYB_PLAN_T_FC1_B, HYB_TYPE_F32, 1, P->hidden[l], 1, NULL);
	ADD(HYB_PLAN_T_FC2_W, HYB_TYPE_F16, 2, P->n_ff, P->hidden[l], NULL);
	ADD(HYB_PLAN_T_FC2_B, HYB_TYPE_F32, 1, P->n_ff, 1, NULL);
#undef ADD
	return rc;
}

/* Metadata and tensor table: the source's, FFN matrices replaced by plan tensors. */
static int declare(struct plan *P, struct hyb_gguf_writer *w, const char *model_path)
{
	const struct hyb_gguf_file *f = P->m->gguf;
	const char *base = strrchr(model_path, '/');
	uint8_t *done = calloc(P->n_layer, 1);
	uint32_t n_order = 0;
	int rc;

	if (!done)
		return hyb_error_set(-ENOMEM, "out of memory");
	hyb_gguf_writer_set_version(w, f->version == 2 ? 2 : 3);
	for (uint64_t i = 0; i < f->n_kv; i++)
		hyb_gguf_writer_copy_kv(w, &f->kv[i]);
	hyb_gguf_set_u32(w, HYB_PLAN_KEY_VERSION, HYB_PLAN_VERSION);
	hyb_gguf_set_u32(w, HYB_PLAN_KEY_GROUP_SIZE, P->gs);
	hyb_gguf_set_u64(w, HYB_PLAN_KEY_GPU_BUDGET, P->o->gpu_budget);
	hyb_gguf_set_str(w, HYB_PLAN_KEY_SOURCE, base ? base + 1 : model_path);
	if (P->import)
		hyb_gguf_set_str(w, HYB_PLAN_KEY_PRED_INPUT, "same-layer");
	if (P->prof->cats_threshold) {
		hyb_gguf_set_str(w, HYB_SPARSITY_KEY_MODE, HYB_SPARSITY_MODE_CATS);
		hyb_gguf_set_f32(w, HYB_SPARSITY_KEY_TARGET, P->prof->target_sparsity);
		hyb_gguf_set_arr(w, HYB_SPARSITY_KEY_THRESHOLD, HYB_GGUF_VT_FLOAT32,
				 P->prof->cats_threshold, P->n_layer);
	}
	/* the loader gives a PowerInfer model ReLU; the plan has to say so */
	if (P->m->powerinfer && !hyb_gguf_find(f, "hyb.ffn_act"))
		hyb_gguf_set_str(w, "hyb.ffn_act", "relu");
	for (uint64_t i = 0; i < f->n_tensors; i++) {
		const struct hyb_gguf_tensor *t = &f->tensors[i];
		char name[96];
		uint32_t l;

		if (ffn_matrix(t->name, &l)) {
			if (l >= P->n_layer || done[l])
				continue;
			done[l] = 1;
			P->order[n_order++] = l;
			rc = add_layer_tensors(P, w, l);
			if (rc) {
				free(done);
				return hyb_error_set(rc, "cannot declare layer %u's plan "
						     "tensors: %s", l, hyb_last_error());
			}
			continue;
		}
		snprintf(name, sizeof(name), "%.*s", (int)t->name.len, t->name.ptr);
		rc = hyb_gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data);
		if (rc) {
			free(done);
			return hyb_error_set(rc, "cannot copy tensor %s: %s", name,
					     hyb_last_error());
		}
	}
	free(done);
	if (n_order != P->n_layer)
		return hyb_error_set(-EINVAL, "model has FFN tensors for %u of %u layers", n_order,
				     P->n_layer);
	return 0;
}

/* down^T in bundle order, requantized: row i = the n_embd weights of neuron perm[i] */
struct down_job {
	const struct hyb_cpu_kernels *k;
	const struct hyb_weight *down;  /* [n_embd rows][n_ff] */
	const struct hyb_weight *down_t; /* or a PowerInfer model's [n_ff rows][n_embd] */
	const int32_t *perm;
	uint32_t n_embd, n_ff, type;
	uint64_t row_bytes;
	float *dt;                      /* [n_ff][n_embd] dequantized, transposed */
	uint8_t *q;                     /* [n_ff][row_bytes] */
	double err2[64], ref2[64], maxerr[64];
	int failed;
	int phase;
};

static void down_worker(void *arg, int ith, int nth)
{
	struct down_job *j = arg;
	long lo, hi;

	if (j->phase == 0 && j->down_t) {
		hyb_split(j->n_ff, ith, nth, &lo, &hi);
		for (long n = lo; n < hi; n++)
			j->k->dequantize[j->down_t->type](
				(const char *)j->down_t->data + n * j->down_t->row_bytes,
				j->dt + (size_t)n * j->n_embd, j->n_embd);
		return;
	}
	if (j->phase == 0) {
		/* blocks of 16 rows of down, dequantized and scattered into dt */
		float *buf = malloc((size_t)16 * j->n_ff * sizeof(float));

		if (!buf) {
			j->failed = 1;
			return;
		}
		hyb_split((j->n_embd + 15) / 16, ith, nth, &lo, &hi);
		for (long b = lo; b < hi; b++) {
			uint32_t e0 = (uint32_t)b * 16;
			uint32_t ne = j->n_embd - e0 < 16 ? j->n_embd - e0 : 16;

			for (uint32_t e = 0; e < ne; e++)
				j->k->dequantize[j->down->type](
					(const char *)j->down->data + (e0 + e) * j->down->row_bytes,
					buf + (size_t)e * j->n_ff, j->n_ff);
			for (uint32_t n = 0; n < j->n_ff; n++) {
				float *d = j->dt + (size_t)n * j->n_embd + e0;

				for (uint32_t e = 0; e < ne; e++)
					d[e] = buf[(size_t)e * j->n_ff + n];
			}
		}
		free(buf);
		return;
	}
	{
		float *back = malloc((size_t)j->n_embd * sizeof(float));
		double e2 = 0, r2 = 0, mx = 0;

		if (!back) {
			j->failed = 1;
			return;
		}
		hyb_split(j->n_ff, ith, nth, &lo, &hi);
		for (long i = lo; i < hi; i++) {
			const float *src = j->dt + (size_t)j->perm[i] * j->n_embd;
			uint8_t *dst = j->q + (size_t)i * j->row_bytes;

			if (hyb_quantize_row_ref(j->type, src, dst, j->n_embd)) {
				j->failed = 1;
				break;
			}
			j->k->dequantize[j->type](dst, back, j->n_embd);
			for (uint32_t e = 0; e < j->n_embd; e++) {
				double d = (double)back[e] - src[e];

				e2 += d * d;
				r2 += (double)src[e] * src[e];
				if (fabs(d) > mx)
					mx = fabs(d);
			}
		}
		free(back);
		if (ith < 64) {
			j->err2[ith] = e2;
			j->ref2[ith] = r2;
			j->maxerr[ith] = mx;
		}
	}
}

static int write_layer(struct plan *P, struct hyb_gguf_writer *w, uint32_t l)
{
	const struct hyb_layer *L = &P->m->layers[l];
	struct down_job dj = { .k = hyb_cpu_best(), .down = &L->down, .perm = P->perm[l],
			       .n_embd = P->n_embd, .n_ff = P->n_ff, .type = P->type,
			       .row_bytes = P->row_bytes };
	/* a PowerInfer model's rows are already bundle rows: copied when the type matches */
	const bool copy_down = L->down_t.data && L->down_t.type == P->type;
	struct hyb_plan_pred_opts po = P->o->pred;
	struct hyb_plan_predictor pr = { 0 };
	struct hyb_plan_pred_stats st;
	double e2 = 0, r2 = 0, mx = 0;
	char why[512];
	int rc, bad = 0;

	/* the predictor first: outputs in bundle order */
	po.pool = P->pool;
	if (P->import) {
		rc = hyb_plan_pi_predictor(P->m, l, P->perm[l], &pr, why, sizeof(why));
		if (rc)
			return hyb_error_set(rc, "%s", why);
		/* the profile's samples hold the adjacent input, not the raw
		 * same-layer one these read: nothing to measure them on here */
		say(P, "  %5u  H %4u  PowerInfer's own (score >= %g), not re-measured", l,
		    pr.hidden, P->m->powerinfer_threshold);
	} else {
		rc = hyb_plan_pred_train(P->prof, l, P->hidden[l], P->perm[l], &po, &pr, &st, why,
					 sizeof(why));
		if (rc)
			return hyb_error_set(rc, "%s", why);
		say(P, "  %5u  H %4u  %5.1f epochs  recall %.3f  precision %.3f  predicted %.3f "
		    "(true %.3f)  %.1fs", l, st.hidden, st.epochs, st.recall, st.precision,
		    st.pred_frac, st.true_frac, st.seconds);
	}
	if (copy_down) {
		say(P, "  down rows copied from ffn_down_t\n");
		goto bundles;
	}

	dj.down_t = L->down_t.data ? &L->down_t : NULL;
	dj.dt = malloc((size_t)P->n_ff * P->n_embd * sizeof(float));
	dj.q = malloc((size_t)P->n_ff * P->row_bytes);
	if (!dj.dt || !dj.q) {
		rc = hyb_error_set(-ENOMEM, "out of memory transposing layer %u's down matrix", l);
		goto out;
	}
	for (dj.phase = 0; dj.phase < 2; dj.phase++)
		hyb_threadpool_run(P->pool, down_worker, &dj);
	if (dj.failed) {
		rc = hyb_error_set(-ENOMEM, "out of memory requantizing layer %u's down matrix", l);
		goto out;
	}
	for (int q = 0; q < 64; q++) {
		e2 += dj.err2[q];
		r2 += dj.ref2[q];
		mx = dj.maxerr[q] > mx ? dj.maxerr[q] : mx;
	}
	say(P, "  down requant %.2g%% rms (max %.2g)\n", r2 > 0 ? 100 * sqrt(e2 / r2) : 0, mx);

bundles:
	/* ffn_bundles, group by group */
	for (uint32_t g = 0; g < P->n_groups; g++) {
		uint32_t i0 = g * P->gs, n = (uint32_t)group_rows(P, g);

		for (uint32_t i = i0; i < i0 + n; i++)
			bad |= hyb_gguf_writer_put_data(w, (const char *)L->gate.data +
						    (size_t)P->perm[l][i] * L->gate.row_bytes,
						    P->row_bytes);
		for (uint32_t i = i0; i < i0 + n; i++)
			bad |= hyb_gguf_writer_put_data(w, (const char *)L->up.data +
						    (size_t)P->perm[l][i] * L->up.row_bytes,
						    P->row_bytes);
		if (!copy_down) {
			bad |= hyb_gguf_writer_put_data(w, dj.q + (size_t)i0 * P->row_bytes,
						    n * P->row_bytes);
			continue;
		}
		for (uint32_t i = i0; i < i0 + n; i++)
			bad |= hyb_gguf_writer_put_data(w, (const char *)L->down_t.data +
						    (size_t)P->perm[l][i] * L->down_t.row_bytes,
						    P->row_bytes);
	}
	/* ffn_perm, ffn_gpu, ffn_freq were given with data: the writer has put them */
	bad |= hyb_gguf_writer_put_data(w, pr.fc1_w, (uint64_t)pr.hidden * pr.n_in * 2);
	bad |= hyb_gguf_writer_put_data(w, pr.fc1_b, (uint64_t)pr.hidden * 4);
	bad |= hyb_gguf_writer_put_data(w, pr.fc2_w, (uint64_t)pr.n_out * pr.hidden * 2);
	bad |= hyb_gguf_writer_put_data(w, pr.fc2_b, (uint64_t)pr.n_out * 4);
	if (bad) {
		/* the writer kept the reason; finish reports it and removes the file */
		rc = hyb_gguf_writer_finish(w);
		goto out;
	}
	rc = 0;
out:
	free(dj.dt);
	free(dj.q);
	hyb_plan_predictor_free(&pr);
	return rc;
}

/* PowerInfer's GPU index: what place_all covers. */
static int load_gpu_index(struct plan *P)
{
	uint64_t cap, n_hot = 0;
	char b1[32], why[512];
	int rc;

	P->hot = calloc(P->n_layer, sizeof(*P->hot));
	if (!P->hot)
		goto oom;
	for (uint32_t l = 0; l < P->n_layer; l++)
		if (!(P->hot[l] = calloc(P->n_ff, 1)))
			goto oom;
	rc = hyb_plan_pi_gpu_index(P->o->gpu_index, P->n_layer, P->n_ff, P->hot, &cap, why,
				   sizeof(why));
	if (rc)
		return hyb_error_set(rc, "%s", why);
	for (uint32_t l = 0; l < P->n_layer; l++)
		for (uint32_t i = 0; i < P->n_ff; i++)
			n_hot += P->hot[l][i];
	say(P, "PowerInfer GPU index %s: %llu of %llu neurons on the GPU (%.1f%%), made for %s\n",
	    P->o->gpu_index, (unsigned long long)n_hot, (unsigned long long)P->n_layer * P->n_ff,
	    100.0 * n_hot / ((double)P->n_layer * P->n_ff),
	    cap ? mib(cap, b1, sizeof(b1)) : "an unknown VRAM capacity");
	return 0;
oom:
	return hyb_error_set(-ENOMEM, "out of memory");
}

/*
 * Before the long stages: the output is not the model, and its directory
 * takes a file (tmp, the writer's temporary name, created and removed).
 */
static int check_output(const char *model_path, const char *out, const char *tmp)
{
	struct stat a, b;
	int fd;

	if (!stat(model_path, &a) && !stat(out, &b) && a.st_dev == b.st_dev &&
	    a.st_ino == b.st_ino) {
		return hyb_error_set(-EINVAL, "output %s is the model itself", out);
	}
	fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (fd < 0)
		return hyb_error_set(-errno, "cannot write %s: %s", out, strerror(errno));
	close(fd);
	unlink(tmp);
	return 0;
}

/* The per-layer arrays of the run. */
static int plan_alloc(struct plan *P)
{
	P->pool = hyb_threadpool_new(P->o->n_threads);
	P->perm = calloc(P->n_layer, sizeof(*P->perm));
	P->gpu = calloc(P->n_layer, sizeof(*P->gpu));
	P->freq = calloc(P->n_layer, sizeof(*P->freq));
	P->hidden = calloc(P->n_layer, sizeof(*P->hidden));
	P->order = calloc(P->n_layer, sizeof(*P->order));
	if (!P->pool || !P->perm || !P->gpu || !P->freq || !P->hidden || !P->order)
		return hyb_error_set(-ENOMEM, "out of memory");
	return 0;
}

/* Per layer: the permutation, the groups on the GPU, their frequencies (once GS is known). */
static int plan_alloc_layers(struct plan *P)
{
	for (uint32_t l = 0; l < P->n_layer; l++) {
		P->perm[l] = malloc((size_t)P->n_ff * sizeof(int32_t));
		P->gpu[l] = calloc(P->n_groups, 1);
		P->freq[l] = calloc(P->n_groups, sizeof(float));
		if (!P->perm[l] || !P->gpu[l] || !P->freq[l])
			return hyb_error_set(-ENOMEM, "out of memory");
	}
	return 0;
}

static void plan_free(struct plan *P)
{
	for (uint32_t l = 0; l < P->n_layer; l++) {
		if (P->perm)
			free(P->perm[l]);
		if (P->gpu)
			free(P->gpu[l]);
		if (P->freq)
			free(P->freq[l]);
	}
	for (uint32_t l = 0; P->hot && l < P->n_layer; l++)
		free(P->hot[l]);
	free(P->hot);
	free(P->perm);
	free(P->gpu);
	free(P->freq);
	free(P->hidden);
	free(P->order);
	if (P->pool)
		hyb_threadpool_free(P->pool);
	hyb_model_free(P->m);
}

/* What comes from a PowerInfer model: its predictors (unless retrained), its GPU index. */
static int plan_powerinfer(struct plan *P)
{
	if (P->m->powerinfer && !P->o->train_predictors) {
		char why[512];
		int has = hyb_plan_pi_predictors(P->m, P->hidden, why, sizeof(why));

		if (has < 0)
			return hyb_error_set(has, "%s", why);
		P->import = has == 1;
		say(P, "PowerInfer model (ffn_down_t): down rows kept as they are; %s\n",
		    P->import ? "its predictors are kept (input: the layer's own residual)"
			      : "no fc1/fc2 predictors in it, so they are trained");
	}
	return P->o->gpu_index ? load_gpu_index(P) : 0;
}

/* The budget check needs only sizes: fail before the long stages. */
static int check_budget(const struct plan *P)
{
	char b1[32], b2[32], b3[32], b4[32];

	if (P->o->gpu_budget >= P->dense_bytes + P->pred_bytes)
		return 0;
	return hyb_error_set(-EINVAL, "GPU budget %s is too small for the dense part (%s: "
			     "attention, norms, output head) and the predictors (%s): need at "
			     "least %s", mib(P->o->gpu_budget, b1, sizeof(b1)),
			     mib(P->dense_bytes, b2, sizeof(b2)),
			     mib(P->pred_bytes, b3, sizeof(b3)),
			     mib(P->dense_bytes + P->pred_bytes, b4, sizeof(b4)));
}

/* The file: declared whole, then streamed layer by layer into PATH.tmp-PID, renamed when complete. */
static int write_plan(struct plan *P, const char *model_path, const char *out_path)
{
	struct hyb_gguf_writer *w = hyb_gguf_writer_new();
	int rc;

	if (!w)
		return hyb_error_set(-ENOMEM, "out of memory");
	rc = declare(P, w, model_path);
	if (rc || (rc = hyb_gguf_writer_begin(w, out_path)))
		goto out;
	if (P->import)
		say(P, "predictors and bundles:\n");
	else
		say(P, "predictors (target recall %.3g, test samples) and bundles:\n",
		    P->o->pred.target_recall);
	for (uint32_t q = 0; q < P->n_layer && !rc; q++)
		rc = write_layer(P, w, P->order[q]);
	if (!rc)
		rc = hyb_gguf_writer_finish(w);
out:
	hyb_gguf_writer_free(w); /* removes the temporary file when not finished */
	return rc;
}

int hyb_plan_make(const char *model_path, const struct hyb_profile *prof,
		  const struct hyb_plan_opts *o, const char *out_path)
{
	struct plan P = { .o = o, .prof = prof, .out = o->quiet ? NULL : stdout };
	char tmp[4096], b1[32];
	double t0 = now_s();
	struct stat st;
	int rc;

	if (snprintf(tmp, sizeof(tmp), "%s.tmp-%d", out_path, (int)getpid()) >= (int)sizeof(tmp))
		return hyb_error_set(-ENAMETOOLONG, "output path is too long");
	P.m = hyb_model_load_mode(model_path, HYB_LOAD_MMAP);
	if (!P.m) /* the load said why, and with which errno */
		return hyb_error_rc() < 0 ? hyb_error_rc() : -EINVAL;
	if ((rc = check_model(&P, model_path)) || (rc = check_profile(&P)) ||
	    (rc = check_output(model_path, out_path, tmp)) || (rc = plan_alloc(&P)))
		goto out;
	say(&P, "hybctl plan: %s: %u layers, n_embd %u, n_ff %u, FFN %s; profile: %llu tokens, "
	    "%u samples\n", model_path, P.n_layer, P.n_embd, P.n_ff, hyb_type_name(P.type),
	    (unsigned long long)prof->n_tokens, prof->n_samples);
	if ((rc = choose_group_size(&P)) || (rc = plan_alloc_layers(&P)) ||
	    (rc = plan_powerinfer(&P)))
		goto out;
	reserve(&P);
	if ((rc = check_budget(&P)) || (rc = group_all(&P)) || (rc = place_all(&P)) ||
	    (rc = write_plan(&P, model_path, out_path)))
		goto out;
	say(&P, "wrote %s (%s) in %.1f s\n", out_path,
	    mib(stat(out_path, &st) ? 0 : (uint64_t)st.st_size, b1, sizeof(b1)), now_s() - t0);
out:
	plan_free(&P);
	return rc;
}
