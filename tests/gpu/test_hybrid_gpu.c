// SPDX-License-Identifier: MIT
/*
 * Hybrid decoding end to end on a GPU: the small
 * plan model of the unit tests decoded with the CUDA device - attention, head
 * and predictors on the GPU, neuron groups moving - against the same run on
 * the CPU-executed device, which gives the CPU forward pass's bits. The two
 * differ only in float summation order (and the GPU's float attention
 * accumulator against the CPU's F16 one), so greedy tokens agree but for
 * near-ties, and logits stay close.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_kernels.h"
#include "hyb/hybrid.h"
#include "hyb/model.h"
#include "hybrid/dense.h"
#include "test.h"

#define N_CTX 128
#define N_GEN 48
#define DRIFT 8

/* Room for attention, head and predictors and a third of the neuron groups. */
static struct hyb_hybrid_params params(const struct hyb_model *m, const char *dev,
				       enum hyb_policy p)
{
	const uint64_t slot = 3ull * m->group_size * m->layers[0].plan.bundles.row_bytes;
	uint64_t b = hyb_hdense_head_bytes(m) + hyb_hdense_buffer_bytes(m, true, true, true);

	for (uint32_t l = 0; l < m->hp.n_layer; l++)
		b += hyb_hdense_layer_bytes(m, l, N_CTX) + hyb_hdense_pred_bytes(m, l);
	return (struct hyb_hybrid_params){
		.device = dev, .policy = p,
		.gpu_budget = b + slot * m->n_groups * m->hp.n_layer / 3 + (1u << 20),
	};
}

/* The prompt, then N_GEN tokens: force[] when given, else greedy with a forced drift. */
static void decode(const struct hyb_model *m, const struct hyb_hybrid_params *hy,
		   int32_t *toks, bool follow, float *logits)
{
	const uint32_t V = m->hp.n_vocab;
	/* a plan decodes sparse; a mixture of experts has its expert cache instead */
	struct hyb_ctx_params p = { .n_ctx = N_CTX, .n_threads = 2,
				    .ffn = m->hp.n_expert ? HYB_FFN_AUTO : HYB_FFN_SPARSE, .hybrid = hy };
	static const int32_t prompt[6] = { 11, 200, 37, 99, 4, 310 };
	struct hyb_ctx *c = hyb_ctx_new(m, &p);
	float *lg = malloc(sizeof(float) * V);

	CHECK_MSG(c, "%s", hyb_last_error());
	CHECK(lg);
	CHECK_MSG(!hyb_ctx_eval(c, prompt, 6, lg, false), "%s", hyb_last_error());
	for (int i = 0; i < N_GEN; i++) {
		if (!follow)
			toks[i] = i % DRIFT == DRIFT - 1 ? (int32_t)(3 + (i * 7919) % (V - 3)) :
							    hyb_test_argmax(lg, V);
		memcpy(logits + (size_t)i * V, lg, sizeof(float) * V);
		CHECK_MSG(!hyb_ctx_eval(c, &toks[i], 1, lg, false), "%s", hyb_last_error());
	}
	if (!strcmp(hy->device, "cuda")) {
		struct hyb_hybrid_offload pl;
		struct hyb_hybrid_stats st;

		hyb_ctx_hybrid_offload(c, &pl);
		hyb_ctx_hybrid_stats(c, &st);
		if (hy->policy != HYB_POLICY_LAYER && !pl.experts) {
			CHECK_EQ_INT(pl.attn_layers, m->hp.n_layer);
			CHECK(pl.head);
			CHECK_EQ_INT(pl.predictors, m->hp.n_layer);
		}
		CHECK(st.active_dev > 0);
		printf("    %s: %.1f%% of active %s on the GPU, %llu loads\n",
		       hyb_policy_name(hy->policy), 100.0 * st.active_dev / st.active,
		       pl.experts ? "routed experts" : "neurons", (unsigned long long)st.loads);
	}
	free(lg);
	hyb_ctx_free(c);
}

/*
 * rows of V logits each, a against b: *agree counts the rows whose argmax
 * is the same; returns the worst row's largest difference over its largest
 * logit.
 */
static double rows_compare(const float *la, const float *lb, int rows, uint32_t V, int *agree)
{
	double worst = 0;

	*agree = 0;
	for (int i = 0; i < rows; i++) {
		const float *a = la + (size_t)i * V, *b = lb + (size_t)i * V;
		double d = 0, n = 0;

		*agree += hyb_test_argmax(a, V) == hyb_test_argmax(b, V);
		for (uint32_t v = 0; v < V; v++) {
			d = fmax(d, fabs((double)a[v] - b[v]));
			n = fmax(n, fabs((double)a[v]));
		}
		worst = fmax(worst, d / (n > 0 ? n : 1));
	}
	return worst;
}

/*
 * The GPU's logits against the CPU device's, row by row: within tol of the
 * largest, and the greedy tokens the same but for near-ties. A flip needs
 * a top-two gap under the row's difference, and the flat logits of small
 * random models give a few of those (7/8 of the rows must agree).
 */
static void check_rows(const float *lc, const float *lg, int rows, uint32_t V, double tol,
		       const char *what)
{
	int agree = 0;
	const double worst = rows_compare(lc, lg, rows, V, &agree);

	printf("    %sgreedy agreement %d/%d, worst logit difference %.2e of the largest\n", what,
	       agree, rows, worst);
	CHECK_MSG(worst < tol, "logits differ by %.2e of the largest", worst);
	CHECK_MSG(agree * 8 >= rows * 7, "greedy agreement %d/%d", agree, rows);
}

static void compare(enum hyb_policy pol)
{
	struct hyb_model *m;

	if (hyb_cuda_device_count() == 0)
		SKIP("no CUDA device");
	m = hyb_model_load(hyb_test_plan());
	CHECK_MSG(m, "%s", hyb_last_error());

	const uint32_t V = m->hp.n_vocab;
	struct hyb_hybrid_params cpu = params(m, "cpu", pol), gpu = params(m, "cuda", pol);
	float *lc = malloc(sizeof(float) * V * N_GEN), *lg = malloc(sizeof(float) * V * N_GEN);
	int32_t toks[N_GEN];

	CHECK(lc && lg);
	decode(m, &cpu, toks, false, lc);
	decode(m, &gpu, toks, true, lg);
	check_rows(lc, lg, N_GEN, V, 2e-2, "");
	free(lc);
	free(lg);
	hyb_model_free(m);
}

TEST(gpu_hybrid_tam_adaptive_matches_cpu_device)
{
	compare(HYB_POLICY_TAM_ADAPTIVE);
}

TEST(gpu_hybrid_layer_matches_cpu_device)
{
	compare(HYB_POLICY_LAYER);
}

/*
 * A 60-token prompt as batches of 24 on the GPU (docs/HYBRID.md "Prompts":
 * batched attention, the FFN's uncached groups streamed through the
 * device): every row's logits against the CPU device's run of the same
 * schedule, and the prompt-batch statistics.
 */
TEST(gpu_hybrid_prompt_batch_matches_cpu_device)
{
	enum { NP = 60 };
	struct hyb_model *m;

	if (hyb_cuda_device_count() == 0)
		SKIP("no CUDA device");
	m = hyb_model_load(hyb_test_plan());
	CHECK_MSG(m, "%s", hyb_last_error());

	const uint32_t V = m->hp.n_vocab;
	float *lg[2] = { malloc(sizeof(float) * V * NP), malloc(sizeof(float) * V * NP) };
	int32_t prompt[NP];
	double worst = 0;
	int agree = 0;

	CHECK(lg[0] && lg[1]);
	for (int i = 0; i < NP; i++)
		prompt[i] = (int32_t)(3 + (uint32_t)(i * 2654435761u) % (V - 3));
	for (int k = 0; k < 2; k++) {
		struct hyb_hybrid_params hy = params(m, k ? "cuda" : "cpu", HYB_POLICY_STATIC);
		struct hyb_ctx_params p = { .n_ctx = N_CTX, .n_threads = 2, .ffn = HYB_FFN_SPARSE,
					    .hybrid = &hy };
		struct hyb_hybrid_stats st;
		struct hyb_ctx *c;

		hy.prompt_batch = 24;
		c = hyb_ctx_new(m, &p);
		CHECK_MSG(c, "%s", hyb_last_error());
		CHECK_MSG(!hyb_ctx_eval(c, prompt, NP, lg[k], true), "%s", hyb_last_error());
		hyb_ctx_hybrid_stats(c, &st);
		CHECK_EQ_INT(st.prompt_batches, 3);
		hyb_ctx_free(c);
	}
	worst = rows_compare(lg[0], lg[1], NP, V, &agree);
	printf("    prompt rows: argmax agreement %d/%d, worst logit difference %.2e\n", agree,
	       NP, worst);
	CHECK_MSG(agree >= NP - 2 && worst < 2e-2, "agreement %d/%d, worst %.2e", agree, NP,
		  worst);
	free(lg[0]);
	free(lg[1]);
	hyb_model_free(m);
}

/*
 * The expert cache on the GPU (docs/MOE.md): a small routing-design MoE
 * decoded greedily with LRU moving experts, against the CPU device's run,
 * which is the CPU's bits (test_moe_hybrid.c): the same tokens but for
 * near-ties. qwen3moe keeps attention on the CPU; Mixtral's llama layout
 * puts attention and head on the GPU too.
 */
/* A small routing-design MoE of this shape and type (SKIPs without a GPU). */
static struct hyb_model *moe_synth(const char *name, const char *shape, const char *type)
{
	char path[512], cmd[1024];
	struct hyb_model *m;

	if (hyb_cuda_device_count() == 0)
		SKIP("no CUDA device");
	snprintf(path, sizeof(path), "%s/%s.gguf", hyb_test_tmpdir(), name);
	snprintf(cmd, sizeof(cmd), "build/hybctl synth -o %s %s --experts 32 --experts-used 4 "
		 "--hidden 512 --heads 8 --layers 4 --type %s -t 2 >/dev/null", path, shape, type);
	CHECK_MSG(system(cmd) == 0, "%s failed", cmd);
	m = hyb_model_load(path);
	CHECK_MSG(m, "%s", hyb_last_error());
	return m;
}

static void moe_compare(const char *name, const char *shape, const char *type)
{
	char path[64];
	struct hyb_model *m = moe_synth(name, shape, type);
	const uint32_t V = m->hp.n_vocab;
	struct hyb_hybrid_params cpu = { .device = "cpu", .policy = HYB_POLICY_LRU,
					 .gpu_budget = m->weight_bytes / 3 * 2 };
	struct hyb_hybrid_params gpu = cpu;
	float *lc = malloc(sizeof(float) * V * N_GEN), *lg = malloc(sizeof(float) * V * N_GEN);
	int32_t toks[N_GEN];

	gpu.device = "cuda";
	CHECK(lc && lg);
	decode(m, &cpu, toks, false, lc);
	decode(m, &gpu, toks, true, lg);
	snprintf(path, sizeof(path), "%s: ", type);
	check_rows(lc, lg, N_GEN, V, 2e-2, path);
	free(lc);
	free(lg);
	hyb_model_free(m);
}

TEST(gpu_moe_expert_cache_matches_cpu_device)
{
	moe_compare("moe-gpu", "--arch qwen3moe --expert-ffn 256", "Q4_0");
}

TEST(gpu_moe_expert_cache_dense_on_gpu_matches_cpu_device)
{
	moe_compare("moe-gpu-llama", "--arch llama --ffn 256", "Q4_0");
}

/* qwen2moe: its gated shared experts on the GPU beside the routed ones (docs/MOE.md) */
TEST(gpu_moe_shared_experts_on_gpu_match_cpu_device)
{
	moe_compare("moe-gpu-q2", "--arch qwen2moe --expert-ffn 256", "Q8_0");
}

/* experts, attention and head of types the kernels run through kernels/cuda/gen_dot.h */
TEST(gpu_moe_expert_cache_other_types_match_cpu_device)
{
	moe_compare("moe-gpu-q5k", "--arch llama --ffn 256", "Q5_K");
	moe_compare("moe-gpu-q51", "--arch llama --ffn 256", "Q5_1");
	moe_compare("moe-gpu-iq4xs", "--arch llama --ffn 256", "IQ4_XS");
}

/* A decode of N_GEN rows: its own greedy tokens, or (follow) toks[]'s. */
typedef void (*decode_fn)(const struct hyb_model *m, const struct hyb_hybrid_params *hy,
			  int32_t *toks, bool follow, float *logits);

/*
 * fn on the CPU device with cpu's parameters, then on the GPU following its
 * tokens: greedy tokens agree but for near-ties. The logits within 5e-2:
 * the CPU's attention sums V in F16 (as llama.cpp's), the GPU's in float,
 * and SiLU's exp differs by an ulp at times; an activation quantized to
 * Q8_0 for the next matvec, or a K row rounded to F16, turns such an ulp
 * into a step of the quantizer now and then (cudaemu: 1.1e-2 to 3.6e-2 of
 * the largest logit with Q4_0, Q8_0 and Q5_K weights, 7e-4 with F16; the
 * FFN alone on the device with the prompt on the CPU, 1 layer, Q8_0: the
 * CPU's bits).
 */
static void gpu_vs_cpu(const struct hyb_model *m, struct hyb_hybrid_params cpu, decode_fn fn)
{
	const uint32_t V = m->hp.n_vocab;
	struct hyb_hybrid_params gpu = cpu;
	float *lc = malloc(sizeof(float) * V * N_GEN), *lg = malloc(sizeof(float) * V * N_GEN);
	int32_t toks[N_GEN];

	gpu.device = "cuda";
	CHECK(lc && lg);
	fn(m, &cpu, toks, false, lc);
	fn(m, &gpu, toks, true, lg);
	check_rows(lc, lg, N_GEN, V, 5e-2, "");
	free(lc);
	free(lg);
}

/*
 * A plain model (docs/HYBRID.md "Plain models"): attention blocks, head and
 * whole FFNs on the GPU, the rest on the CPU, against the same placement on
 * the CPU device, the GPU decoding the CPU device's tokens: greedy tokens
 * agree but for near-ties.
 */
static void plain_decode(const struct hyb_model *m, const struct hyb_hybrid_params *hy,
			 int32_t *toks, bool follow, float *logits)
{
	const uint32_t V = m->hp.n_vocab;
	struct hyb_ctx_params p = { .n_ctx = N_CTX, .n_threads = 2, .hybrid = hy };
	static const int32_t prompt[6] = { 11, 200, 37, 99, 4, 310 };
	struct hyb_ctx *c = hyb_ctx_new(m, &p);
	struct hyb_hybrid_offload pl;

	CHECK_MSG(c, "%s", hyb_last_error());
	hyb_ctx_hybrid_offload(c, &pl);
	CHECK(pl.plain && pl.ffn_layers > 0);
	CHECK_MSG(!hyb_ctx_eval(c, prompt, 6, logits, false), "%s", hyb_last_error());
	for (int i = 0; i + 1 < N_GEN; i++) {
		if (!follow)
			toks[i] = hyb_test_argmax(logits + (size_t)i * V, V);
		CHECK_MSG(!hyb_ctx_eval(c, &toks[i], 1, logits + (size_t)(i + 1) * V, false), "%s",
			  hyb_last_error());
	}
	printf("    %s on %s: %u attention blocks, %u FFNs%s\n", hyb_policy_name(hy->policy),
	       hy->device, pl.attn_layers, pl.ffn_layers, pl.head ? ", head" : "");
	hyb_ctx_free(c);
}

static void plain_compare(const char *name, const char *args, enum hyb_policy pol)
{
	char path[512], cmd[1024];
	struct hyb_model *m;

	if (hyb_cuda_device_count() == 0)
		SKIP("no CUDA device");
	snprintf(path, sizeof(path), "%s/%s.gguf", hyb_test_tmpdir(), name);
	snprintf(cmd, sizeof(cmd), "build/hybctl synth -o %s --hidden 512 --ffn 1536 --heads 8 "
		 "--layers 4 %s -t 2 >/dev/null", path, args);
	CHECK_MSG(system(cmd) == 0, "%s failed", cmd);
	m = hyb_model_load(path);
	CHECK_MSG(m, "%s", hyb_last_error());

	gpu_vs_cpu(m, (struct hyb_hybrid_params){ .device = "cpu", .policy = pol,
						  .gpu_budget = m->weight_bytes / 10 * 7 },
		   plain_decode);
	hyb_model_free(m);
}

TEST(gpu_plain_hybrid_matches_cpu_device)
{
	plain_compare("plain-gpu-q4", "--type Q4_0", HYB_POLICY_STATIC);
	plain_compare("plain-gpu-q5k", "--type Q5_K", HYB_POLICY_LAYER);
	/* GeGLU FFNs (hyb_device_ffn_act's F16 GELU table), Gemma's attention on the CPU */
	plain_compare("plain-gpu-gemma3", "--arch gemma3 --type Q8_0", HYB_POLICY_STATIC);
}

/*
 * Several sequences through one hybrid context on the GPU (docs/HYBRID.md
 * "Several sequences", docs/MOE.md): four sequences decoded together, two
 * attending on the GPU and two on the CPU (a plan), or through the expert
 * cache (a mixture), against the same passes on the CPU device: greedy
 * tokens agree but for near-ties.
 */
static void seqs_decode(const struct hyb_model *m, const struct hyb_hybrid_params *hy,
			int32_t *toks, bool follow, float *logits)
{
	const uint32_t V = m->hp.n_vocab, NS = 4;
	struct hyb_ctx_params p = { .n_ctx = N_CTX, .n_threads = 2, .n_batch = 16, .n_seq = NS,
				    .kv_size = N_CTX * NS, .hybrid = hy,
				    .ffn = m->hp.n_expert ? HYB_FFN_AUTO : HYB_FFN_SPARSE };
	struct hyb_ctx *c = hyb_ctx_new(m, &p);
	float *lg = malloc(sizeof(float) * V * NS);
	struct hyb_seq_tokens b[4];
	int32_t prompt[4][6], next[4];

	CHECK_MSG(c, "%s", hyb_last_error());
	CHECK(lg);
	for (uint32_t i = 0; i < NS; i++) {
		for (int t = 0; t < 6; t++)
			prompt[i][t] = (int32_t)(3 + (t * 37 + i * 101) % (V - 3));
		b[i] = (struct hyb_seq_tokens){ hyb_ctx_seq_open(c, 6 + N_GEN / 4), prompt[i], 6 };
		CHECK(b[i].seq >= 0);
	}
	CHECK_MSG(!hyb_ctx_eval_seqs(c, b, NS, lg), "%s", hyb_last_error());
	for (int g = 0; g < N_GEN / 4; g++) {
		for (uint32_t i = 0; i < NS; i++) {
			const int r = g * 4 + (int)i;

			memcpy(logits + (size_t)r * V, lg + (size_t)i * V, sizeof(float) * V);
			if (!follow)
				toks[r] = hyb_test_argmax(lg + (size_t)i * V, V);
			next[i] = toks[r];
			b[i].tokens = &next[i];
			b[i].n = 1;
		}
		CHECK_MSG(!hyb_ctx_eval_seqs(c, b, NS, lg), "%s", hyb_last_error());
	}
	free(lg);
	hyb_ctx_free(c);
}

static void seqs_compare(struct hyb_model *m, struct hyb_hybrid_params cpu)
{
	gpu_vs_cpu(m, cpu, seqs_decode);
}

TEST(gpu_hybrid_seqs_match_cpu_device)
{
	struct hyb_model *m;
	struct hyb_hybrid_params hy;

	if (hyb_cuda_device_count() == 0)
		SKIP("no CUDA device");
	m = hyb_model_load(hyb_test_plan());
	CHECK_MSG(m, "%s", hyb_last_error());
	hy = params(m, "cpu", HYB_POLICY_STATIC);
	hy.gpu_budget += 8ull * hyb_hdense_layer_bytes(m, 0, N_CTX) * m->hp.n_layer;
	hy.kv_seqs = 2;
	seqs_compare(m, hy);
	hyb_model_free(m);
}

TEST(gpu_moe_expert_cache_seqs_match_cpu_device)
{
	char path[512], cmd[1024];
	struct hyb_model *m;

	if (hyb_cuda_device_count() == 0)
		SKIP("no CUDA device");
	snprintf(path, sizeof(path), "%s/moe-seqs.gguf", hyb_test_tmpdir());
	snprintf(cmd, sizeof(cmd), "build/hybctl synth -o %s --arch llama --ffn 256 --experts 8 "
		 "--experts-used 2 --hidden 512 --heads 8 --layers 4 --type Q4_0 -t 2 >/dev/null",
		 path);
	CHECK_MSG(system(cmd) == 0, "%s failed", cmd);
	m = hyb_model_load(path);
	CHECK_MSG(m, "%s", hyb_last_error());
	seqs_compare(m, (struct hyb_hybrid_params){ .device = "cpu", .policy = HYB_POLICY_LRU,
						    .gpu_budget = m->weight_bytes / 3 * 2 });
	hyb_model_free(m);
}


/*
 * One device graph a step (docs/MOE.md "One graph a step") on the GPU:
 * with the static policy the same experts run on each side whether the
 * step is a graph or queued as it goes, and the kernels are the same, so
 * the logits are the queued steps' bit for bit; with LRU moving experts
 * (its loads issued after each step) they match the CPU device's as the
 * queued steps do. Llama's layout, and qwen2moe's gated shared expert.
 */
static void graph_compare(const char *name, const char *shape, const char *type, bool lru)
{
	char path[64];
	struct hyb_model *m = moe_synth(name, shape, type);
	const uint32_t V = m->hp.n_vocab;
	struct hyb_hybrid_params q = { .device = "cuda", .policy = HYB_POLICY_STATIC,
				       .gpu_budget = m->weight_bytes / 3 * 2 };
	struct hyb_hybrid_params g = q, cpu = q;
	float *la = malloc(sizeof(float) * V * N_GEN), *lb = malloc(sizeof(float) * V * N_GEN);
	int32_t toks[N_GEN];

	CHECK(la && lb);
	g.graph = true;
	decode(m, &q, toks, false, la);
	decode(m, &g, toks, true, lb);
	CHECK_MSG(!memcmp(la, lb, sizeof(float) * V * N_GEN), "%s static: the graph steps' "
		  "logits differ from the queued steps'", type);
	cpu.device = "cpu";
	/* (cudaemu runs a decode in about 10 s: the moving policy on one layout) */
	if (!lru) {
		free(la);
		free(lb);
		hyb_model_free(m);
		return;
	}
	cpu.policy = g.policy = HYB_POLICY_LRU;
	decode(m, &cpu, toks, false, la);
	decode(m, &g, toks, true, lb);
	snprintf(path, sizeof(path), "%s graph steps, lru: ", type);
	check_rows(la, lb, N_GEN, V, 2e-2, path);
	free(la);
	free(lb);
	hyb_model_free(m);
}

TEST(gpu_moe_graph_steps_match_the_queued_steps)
{
	graph_compare("moe-graph-llama", "--arch llama --ffn 256", "Q4_0", true);
	graph_compare("moe-graph-q2", "--arch qwen2moe --expert-ffn 256", "Q8_0", false);
}
