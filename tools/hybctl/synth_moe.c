// SPDX-License-Identifier: MIT
/*
 * Weights for `hybctl synth --experts E` (mixtures of experts, --routing
 * real, the default): a model whose own forward pass, run on its own sampled
 * text, routes tokens to experts the way trained MoE models do:
 *
 *   - skewed popularity per layer: the top 10% of experts take 20-40% of the
 *     choices and the hottest 3-8x its uniform share, different experts in
 *     each layer (expert popularity is what Fiddler and KTransformers profile
 *     offline to place experts, KTransformers §2; LFU beats LRU on real
 *     routing traces, arXiv 2511.05814);
 *   - temporal locality: an expert chosen for token t is chosen again for
 *     t+1 with probability 0.3-0.5, 4-8x the K/E chance at Qwen3-30B-A3B's 8
 *     of 128 and above it at Mixtral's 2 of 8 (Mixtral's routing analysis,
 *     arXiv 2401.04088 §5: consecutive tokens share experts far above chance;
 *     Liang et al., arXiv 2505.16056: segments of text are served by a few
 *     experts, a cache of ~2x the active experts covers them);
 *   - co-selection: the most co-selected pairs of a layer are chosen together
 *     3x or more what independent choices would give (lift);
 *   - drift: what is popular moves with the text, so the top-2K set of a
 *     generation's first half differs from its second half's (Jaccard ~0.3)
 *     and an LRU cache of 2K experts hits more often than a static cache of
 *     the profile's 2K most popular ones.
 *
 * How. The residual stream is synth_sparse.c's: a constant channel b, K
 * topic directions T_k and the token identities n_v in the rest of the
 * semantic coordinates; text is sampled in runs of ~15 tokens on one topic,
 * drifting to the next (its token_embd and output rows are used as they
 * are). Router row e of layer l is
 *
 *     R_e = beta_e/(sqrt(E) rho_b) b + MU/(sqrt(E) rho_t) T_home(e) + c r_e,
 *
 * r_e a random unit vector in P, so the router logit of a token v of topic
 * k is beta_e + MU [home(e) = k] + z_ev with z_ev = c <r_e, e_v> ~ N(0, 1)
 * over tokens (c scaled for that). beta_e ~ N(0, POP) is the expert's
 * popularity (the skew), home(e) a topic given to E/K experts of the layer
 * (a per-layer permutation: each topic's experts are co-selected while its
 * run lasts, and the run's end moves the popular set; with fewer than two
 * experts per topic, as Mixtral's 8, each expert answers to a window of
 * topics that overlaps its neighbours'), z_ev the token's own
 * preferences (consecutive tokens of one run share the topic but not z, so
 * reuse is high but not total). The constants were tuned on a simulation
 * of exactly this process and checked with `hybctl profile`
 * (tests/unit/test_moe_routing.c holds the bands). Measured (hybctl profile:
 * 20 prompts + 64 sampled tokens each; 4 layers, Q4_0, seed 3; mean over
 * layers, --routing random of the same shape in brackets):
 *
 *   Qwen3-30B-A3B's shape (8 of 128): top 10% take 0.29 (0.18), hottest
 *   4.9x uniform (2.4x), reuse at d=1 0.37 (0.11; chance 0.06), top-pair
 *   lift 8.3 (2.4), drift Jaccard 0.23; a cache of 16 per layer hits 0.50
 *   as LRU, 0.34 static (0.16, 0.21);
 *   DeepSeek-V2-Lite's (6 of 64, 2 shared, as qwen2moe): 0.32 (0.37),
 *   4.5x (5.4x: qwen2moe's random Q/K/V biases skew its random routing
 *   too), reuse 0.38 (0.25; chance 0.09), lift 6.4 (1.8), drift 0.34, LRU
 *   0.52 vs static 0.46 (0.39 vs 0.53).
 *
 * Prompts are natural text, whose tokens carry random topics: their routing
 * is skewed but not local (reuse = that of independent tokens); locality
 * and drift come from the generated runs.
 *
 * The experts' gate and up are plain random; their down projections, the
 * shared expert's and attention's output write only the scratch
 * coordinates, each layer adding synth_sparse's share of the residual's
 * norm: nothing a layer adds moves a router logit (RMSNorm scales all of a
 * token's logits alike), so the statistics hold at every depth, and the head
 * still reads the topic. Everything is a pure function of (seed, tensor,
 * row), so the file is the same for any thread count.
 */
#include "synth_moe.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "synth_sparse.h"

#define MU      3.0 /* topic affinity, in units of the token term's std */
#define POP     0.8 /* std of the experts' popularity offsets, same units */
#define ACT_RMS 0.6 /* RMS of a SwiGLU expert activation on unit-RMS input */
#define ATT_RMS 0.6 /* RMS of the attention output before W_o (synth_sparse.c) */

enum { TAG_ROUTER = 101, TAG_POP, TAG_HOME, TAG_EXP_DOWN, TAG_SH_DOWN, TAG_WO };

struct synth_moe {
	struct synth_sparse *geo;
	struct synth_sparse_geometry g;
	uint32_t E, L, X, K, F, S, QD;
	uint32_t n_scr;
	uint64_t seed;
	float *beta;     /* [L][X] popularity offsets */
	uint16_t *home;  /* [L][X] first home topic */
	uint32_t span;   /* home topics of an expert (consecutive) */
	double c_r;      /* router coefficient of r_e */
	double sd_down, sd_sh, so;
};

uint32_t synth_moe_topics(const struct synth_moe *m)
{
	return m->g.topics;
}

static void axpy(const struct synth_moe *m, float *y, double a, uint32_t dir)
{
	const float *v = synth_sparse_direction(m->geo, dir);

	for (uint32_t j = 0; j < m->E; j++)
		y[j] += (float)(a * v[j]);
}

static void router_row(const struct synth_moe *m, uint32_t l, uint64_t e, float *out)
{
	const double sE = sqrt((double)m->E);
	const size_t at = (size_t)l * m->X + e;

	synth_sparse_perp(m->geo, TAG_ROUTER, l, e, out);
	for (uint32_t j = 0; j < m->E; j++)
		out[j] = (float)(out[j] * m->c_r);
	axpy(m, out, m->beta[at] / (sE * m->g.rho_b), 0);
	for (uint32_t k = 0; k < m->span; k++)
		axpy(m, out, MU / (sE * m->g.rho_t), 1 + (m->home[at] + k) % m->g.topics);
}

/* A row of a matrix into the residual: random on scratch coordinates, 0 elsewhere. */
static void scratch_row(const struct synth_moe *m, uint64_t tag, uint32_t l, uint64_t row,
			uint32_t j, uint32_t n, double sd, float *out)
{
	uint64_t s = synth_sparse_stream(m->seed, tag, l, row);
	const int scr = synth_sparse_scratch_coord(j);

	for (uint32_t i = 0; i < n; i++)
		out[i] = scr ? (float)(sd * synth_sparse_gauss(&s)) : 0.0f;
}

int synth_moe_row(const struct synth_moe *m, const char *name, uint64_t row, float *out)
{
	unsigned l;
	int n = 0;
	char what[32];

	if (!strcmp(name, "token_embd.weight") || !strcmp(name, "output.weight"))
		return synth_sparse_row(m->geo, name, row, out);
	if (sscanf(name, "blk.%u.%31[a-z_].weight%n", &l, what, &n) != 2 || name[n] || l >= m->L)
		return 0;
	if (!strcmp(what, "ffn_gate_inp"))
		router_row(m, l, row, out);
	else if (!strcmp(what, "ffn_down_exps")) /* rows: expert-major, n_embd each */
		scratch_row(m, TAG_EXP_DOWN, l, row, (uint32_t)(row % m->E), m->F, m->sd_down, out);
	else if (!strcmp(what, "ffn_down_shexp") && m->S)
		scratch_row(m, TAG_SH_DOWN, l, row, (uint32_t)row, m->S, m->sd_sh, out);
	else if (!strcmp(what, "attn_output"))
		scratch_row(m, TAG_WO, l, row, (uint32_t)row, m->QD, m->so, out);
	else
		return 0;
	return 1;
}

static void make_tables(struct synth_moe *m)
{
	for (uint32_t l = 0; l < m->L; l++) {
		float *beta = m->beta + (size_t)l * m->X;
		uint16_t *home = m->home + (size_t)l * m->X;
		uint64_t s = synth_sparse_stream(m->seed, TAG_HOME, l, 0);

		for (uint32_t e = 0; e < m->X; e++) {
			uint64_t sp = synth_sparse_stream(m->seed, TAG_POP, l, e);

			beta[e] = (float)(POP * synth_sparse_gauss(&sp));
			home[e] = (uint16_t)(m->span == 1 ? e % m->g.topics :
					     (uint64_t)e * m->g.topics / m->X);
		}
		for (uint32_t e = m->X; e > 1; e--) { /* Fisher-Yates: which experts share a topic */
			uint32_t k = (uint32_t)(synth_sparse_next(&s) % e);
			uint16_t t = home[e - 1];

			home[e - 1] = home[k];
			home[k] = t;
		}
	}
}

struct synth_moe *synth_moe_new(const struct synth_moe_shape *sh)
{
	/* the sparse design supplies the geometry, embeddings and head; its FFN
	 * neurons are not used (one neuron keeps its set-up trivial) */
	struct synth_sparse_shape ss = {
		.hidden = sh->hidden, .ffn = 1, .layers = sh->layers, .heads = sh->heads,
		.kv_heads = sh->kv_heads, .vocab = sh->vocab, .topics = sh->topics,
		.type = sh->type, .act = "relu", .sparsity = 0.9f, .seed = sh->seed,
	};
	struct synth_moe *m = calloc(1, sizeof(*m));
	double sE, add;

	if (!m || !(m->geo = synth_sparse_new(&ss)))
		goto oom;
	synth_sparse_geometry(m->geo, &m->g);
	m->E = sh->hidden;
	m->L = sh->layers;
	m->X = sh->experts;
	m->K = sh->experts_used;
	m->F = sh->expert_ffn;
	m->S = sh->shared_ffn;
	m->QD = sh->heads * sh->head_dim;
	m->seed = sh->seed;
	for (uint32_t j = 0; j < m->E; j++)
		m->n_scr += synth_sparse_scratch_coord(j);
	/* two experts or more per topic, so that pairs co-select: with fewer
	 * than 2 per topic (Mixtral's 8) each answers to overlapping windows */
	m->span = 2 * m->g.topics > m->X ? (2 * m->g.topics + m->X - 1) / m->X : 1;
	m->beta = malloc(sizeof(float) * m->L * m->X);
	m->home = malloc(sizeof(uint16_t) * m->L * m->X);
	if (!m->beta || !m->home)
		goto oom;
	make_tables(m);
	sE = sqrt((double)m->E);
	/* z = c <r_e, sqrt(E) rho_n n_v>, <r_e, n_v> ~ N(0, 1/perp_dim): unit std */
	m->c_r = sqrt((double)m->g.perp_dim) / (sE * m->g.rho_n);
	/* each FFN (routed experts, plus a shared one: half each) and each
	 * attention adds layer_add of the residual's norm, all on scratch
	 * coordinates; K routed outputs weighted ~1/K each add as ~1/sqrt(K) */
	add = m->g.layer_add * sE / sqrt((double)m->n_scr) / (m->S ? sqrt(2.0) : 1.0);
	m->sd_down = add * sqrt((double)m->K) / (ACT_RMS * sqrt((double)m->F));
	m->sd_sh = m->S ? 2.0 * add / (ACT_RMS * sqrt((double)m->S)) : 0; /* sigmoid gate ~0.5 */
	m->so = m->g.layer_add * sE / (sqrt((double)m->n_scr * m->QD) * ATT_RMS);
	return m;
oom:
	fprintf(stderr, "hybctl synth: out of memory for the routing design\n");
	synth_moe_free(m);
	return NULL;
}

void synth_moe_free(struct synth_moe *m)
{
	if (!m)
		return;
	synth_sparse_free(m->geo);
	free(m->beta);
	free(m->home);
	free(m);
}
