// SPDX-License-Identifier: MIT
/*
 * Weights for `hybctl synth --act relu|relu2|dlrelu`: a llama model whose own
 * forward pass, run on its own sampled text, activates its FFN neurons the
 * way real ReLU-family models do:
 *
 *   - ~90% of a layer's neurons inactive per token, like ProSparse/Bamboo
 *     (--sparsity, up to OPT's ~97%; PowerInfer Table 3);
 *   - a power law: ~25% of the neurons give 80% of the activations
 *     (PowerInfer Fig. 4: 26% for OPT-30B);
 *   - adjacent tokens' active sets at Jaccard distance ~0.7 (DynamicInfer:
 *     0.70-0.75);
 *   - adjacent layers' residual streams at cosine >= 0.9 (KAIROX 5.1: ~0.98,
 *     DynamicInfer: > 0.88);
 *   - the coldest 70% of neurons fire again 3+ tokens later with
 *     probability < 0.2 (KAIROX 6);
 *   - neurons in clusters that fire together (KAIROX 5.2 groups them).
 *
 * How. The residual stream's coordinates are split in two: "semantic" ones
 * (3 of every 4) that carry the token, and "scratch" ones (every 4th) that
 * collect what attention and the FFNs add. In the semantic part live K+1
 * orthonormal directions: a constant channel b and K topic directions T_k
 * (random, Gram-Schmidt), and everything orthogonal to them, P.
 *
 *   token v:  e_v = sqrt(E) (rho_t T_k(v) + rho_b b + rho_n n_v), n_v a random
 *             unit vector in P (the token's identity), k(v) = hash(v) mod K.
 *
 *   neuron i of a layer: a hotness rank u_i, an overall firing rate
 *             p_i = min(0.6, A (u_i + 0.15)^-2.5) (Zipf-like; A sets the mean
 *             to 1 - sparsity), and a span of m_i consecutive topics it
 *             answers to: cold neurons (K p_i <= 0.1) answer to one topic and
 *             fire on a fraction q_i = K p_i of its tokens; hotter ones widen
 *             their span while their in-span rate q_i climbs to 0.5; the
 *             hottest answer to every topic (general neurons). Its gate row
 *
 *                 G_i = mu/(sqrt(E) rho_t) sum_{k in span} T_k
 *                     + c_r r_i - tau_i/(sqrt(E) rho_b) b,
 *
 *             r_i random in P, gives gate = mu [topic in span] + z - tau_i
 *             with z = c_r <r_i, xn> ~ N(0, 1) over tokens: a per-neuron
 *             threshold tau_i = mu - sigma Phi^-1(q_i) on the constant
 *             channel turns the Gaussian token term into firing rate q_i
 *             within the span (mu = 5: outside it, practically never).
 *
 *   up:       relu/relu2: u ~ 1 +- 0.2 (constant channel, so act = relu(g) u
 *             is nonzero exactly when the gate is); dlrelu: U_i = G_i +
 *             1.5 b-units, so relu(u) > 0 wherever relu(g) > 0.
 *   down:     random columns in the scratch coordinates only, and
 *   attn_output: mostly into scratch too, plus a rank-16 part into P
 *             (sum_r p_r q_r^T, p_r in P): gate noise of variance
 *             0.2 / n_layer per layer that depends on the attended context,
 *             so a layer's active set is not a pure function of the token
 *             and adjacent-layer prediction is good but not perfect. Being
 *             in P it never moves b or the topics: a full-rank random part
 *             there shifted every threshold of a layer together (measured:
 *             sparsity drifting with depth, reactivation up to 0.23).
 *             Scratch updates never move a gate's sign (every gate reads
 *             only semantic coordinates, and RMSNorm scales all of a token's
 *             gate terms alike), so the statistics hold at every depth; each
 *             layer adds 0.4/sqrt(2 n_layer) of the residual's norm, so
 *             adjacent layers stay at cosine ~0.95-0.97 and the whole stack
 *             adds ~0.4.
 *   output:   token v of topic k scores high when the current topic is k
 *             and e^2.75 lower when it is k-1 (so text stays on its topic and
 *             moves on to the next with probability ~6% a token at
 *             temperature 0.8), plus a unigram
 *             offset in +-0.75 nats and a little of the scratch part (the FFNs
 *             and attention do move the logits). <unk>, <s>, </s> (ids 0-2)
 *             score -20 nats: generation runs to its length.
 *
 * Sampled at temperature 0.8, the model writes runs of ~15 tokens on one
 * topic, drifting to the next: adjacent tokens share a topic (Jaccard
 * distance comes from the token terms), a cold neuron fires again only if its
 * topic's run goes on and a token of the run passes its threshold (q_i <=
 * 0.1-0.3), and a topic's neurons fire together (lift ~ K / span). Hot
 * neurons fire on most topics and carry 80% of the activations. The
 * parameters were tuned on a simulation of exactly this process and checked
 * with `hybctl profile` (tests/unit/test_profile.c holds the bands).
 *
 * Everything is a pure function of (seed, tensor, row): per-layer neuron
 * tables and the basis are derived from the seed alone, so the file is the
 * same for any thread count. Transcendental functions are computed here from
 * correctly rounded operations only (+ - * / sqrt, frexp, ldexp), so the
 * same seed gives the same bytes on every machine (libm's exp/log may differ
 * in the last bit between CPUs and libm versions).
 */
#include "synth_sparse.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyb/tensor_type.h"

enum { ACT_RELU, ACT_RELU2, ACT_DRELU };
#define CTX_RANK 16 /* rank of W_o's semantic part */
enum { TAG_BASIS = 1, TAG_TOPIC, TAG_TOKEN, TAG_NEURON, TAG_GATE, TAG_UP, TAG_DOWN, TAG_WO,
       TAG_HEAD, TAG_UNIGRAM };

/* Design constants (see the comment above). */
#define MU        5.0   /* topic match, in units of the token term's std */
#define RHO_T     0.5   /* shares of a token's embedding: topic, constant, identity */
#define RHO_B     0.5
#define P_MAX     0.6   /* hottest neuron's rate */
#define ZIPF_U0   0.15
#define ZIPF_A    2.5
#define Q_COLD    0.1   /* in-topic rate up to which a neuron keeps a single topic */
#define Q_HOT     0.5   /* in-span rate of the hottest neurons */
#define T_DESIGN  0.8   /* sampling temperature the head is scaled for */
#define P_SWITCH  0.06  /* per-token chance of moving to the next topic */
#define STACK_ADD 0.4   /* norm all layers add to the residual, relative */
#define CTX_VAR   0.2   /* gate noise variance all attention layers add */
#define ATT_RMS   0.6   /* expected RMS of the attention output before W_o */

struct neuron {
	float tau;       /* threshold on the constant channel, in token-term units */
	uint16_t start;  /* first topic of the span */
	uint16_t span;   /* topics it answers to (K: all) */
};

struct synth_sparse {
	uint32_t E, N, L, V, K, act;
	uint32_t n_sem, n_scr, d_perp;
	uint64_t seed;
	double sparsity;
	float *basis;          /* [K + 1][E]: b, T_0 .. T_K-1 (zero on scratch coordinates) */
	struct neuron *neu;    /* [L][N] */
	float *ctx_p, *ctx_q;  /* [L][CTX_RANK][E]: W_o's semantic part, sum_r p_r q_r^T */
	double rho_n, c_r;     /* identity share; gate coefficient of r_i */
	double eps;            /* per attention/FFN output, norm relative to the residual */
	double sig_ctx;        /* per-layer gate noise from attention */
	double sd_scr;         /* std of a down weight in a scratch row */
	double so_scr, so_sem; /* std of a W_o weight in a scratch / semantic row */
	double head_topic, head_next, head_b, head_scr;
};

/* ---- deterministic numerics ------------------------------------------- */

static uint64_t splitmix(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint64_t stream(uint64_t seed, uint64_t tag, uint64_t a, uint64_t b)
{
	uint64_t s = seed ^ 0x5eed5a75e5ull;

	s = splitmix(&s) ^ tag;
	s = splitmix(&s) ^ a;
	s = splitmix(&s) ^ b;
	splitmix(&s);
	return s;
}

/* Uniform in [0, 1). */
static double unif(uint64_t *s)
{
	return (double)(splitmix(s) >> 11) * (1.0 / 9007199254740992.0);
}

/* Approximately standard normal: a sum of four uniforms (variance 1). */
static double gauss(uint64_t *s)
{
	double t = 0;

	for (int i = 0; i < 4; i++)
		t += 2.0 * unif(s) - 1.0;
	return t * 0.8660254037844386; /* sqrt(3/4) */
}

#define LN2 0.6931471805599453

static double det_log(double x)
{
	int e;
	double m = frexp(x, &e), t = (m - 1) / (m + 1), t2 = t * t, sum = 0, pw = t;

	for (int k = 0; k < 40; k++) {
		sum += pw / (2 * k + 1);
		pw *= t2;
	}
	return 2 * sum + e * LN2;
}

static double det_exp(double x)
{
	double k = floor(x / LN2 + 0.5), r = x - k * LN2, sum = 1, term = 1;

	for (int n = 1; n < 30; n++) {
		term *= r / n;
		sum += term;
	}
	return ldexp(sum, (int)k);
}

/* Standard normal CDF (Marsaglia's series; |x| < 9 is all we use). */
static double phi_cdf(double x)
{
	double sum = x, term = x, x2 = x * x;

	if (x < -9)
		return 0;
	if (x > 9)
		return 1;
	for (int n = 1; n < 1000 && fabs(term) > 1e-17 * fabs(sum); n++) {
		term *= x2 / (2 * n + 1);
		sum += term;
	}
	return 0.5 + sum * det_exp(-0.5 * x2) * 0.3989422804014327;
}

static double phi_inv(double q)
{
	double lo = -9, hi = 9;

	for (int i = 0; i < 64; i++) {
		double mid = 0.5 * (lo + hi);

		if (phi_cdf(mid) < q)
			lo = mid;
		else
			hi = mid;
	}
	return 0.5 * (lo + hi);
}

/* ---- geometry ------------------------------------------------------------ */

static bool scratch_coord(uint32_t j)
{
	return j % 4 == 3;
}

/* A random unit vector in P (semantic coordinates, orthogonal to the basis). */
static void rand_perp(const struct synth_sparse *d, uint64_t s, float *out)
{
	double n2 = 0;

	for (uint32_t j = 0; j < d->E; j++)
		out[j] = scratch_coord(j) ? 0.0f : (float)gauss(&s);
	for (uint32_t k = 0; k <= d->K; k++) {
		const float *bk = d->basis + (size_t)k * d->E;
		double dot = 0;

		for (uint32_t j = 0; j < d->E; j++)
			dot += (double)out[j] * bk[j];
		for (uint32_t j = 0; j < d->E; j++)
			out[j] -= (float)(dot * bk[j]);
	}
	for (uint32_t j = 0; j < d->E; j++)
		n2 += (double)out[j] * out[j];
	n2 = n2 > 0 ? 1 / sqrt(n2) : 0;
	for (uint32_t j = 0; j < d->E; j++)
		out[j] = (float)(out[j] * n2);
}

static void axpy(const struct synth_sparse *d, float *y, double a, uint32_t basis_idx)
{
	const float *b = d->basis + (size_t)basis_idx * d->E;

	for (uint32_t j = 0; j < d->E; j++)
		y[j] += (float)(a * b[j]);
}

static int make_basis(struct synth_sparse *d)
{
	const uint32_t E = d->E;
	double *v = malloc(sizeof(double) * E * (d->K + 1));

	if (!v)
		return -1;
	for (uint32_t k = 0; k <= d->K; k++) {
		uint64_t s = stream(d->seed, TAG_BASIS, k, 0);
		double *vk = v + (size_t)k * E, n2 = 0;

		for (uint32_t j = 0; j < E; j++)
			vk[j] = scratch_coord(j) ? 0 : gauss(&s);
		for (uint32_t p = 0; p < k; p++) { /* modified Gram-Schmidt */
			const double *vp = v + (size_t)p * E;
			double dot = 0;

			for (uint32_t j = 0; j < E; j++)
				dot += vk[j] * vp[j];
			for (uint32_t j = 0; j < E; j++)
				vk[j] -= dot * vp[j];
		}
		for (uint32_t j = 0; j < E; j++)
			n2 += vk[j] * vk[j];
		for (uint32_t j = 0; j < E; j++) {
			vk[j] /= sqrt(n2);
			d->basis[(size_t)k * E + j] = (float)vk[j];
		}
	}
	free(v);
	return 0;
}

static uint32_t topic_of(const struct synth_sparse *d, uint64_t token)
{
	uint64_t s = stream(d->seed, TAG_TOPIC, token, 0);

	return (uint32_t)(splitmix(&s) % d->K);
}

/* ---- neurons ------------------------------------------------------------- */

static double zipf_rate(double u, double a)
{
	double p = a * det_exp(-ZIPF_A * det_log(u + ZIPF_U0));

	return p < P_MAX ? p : P_MAX;
}

/* The scale A that gives a mean rate of 1 - sparsity over ranks u in [0, 1). */
static double zipf_scale(double mean)
{
	double lo = 1e-9, hi = 10;

	for (int it = 0; it < 100; it++) {
		double a = sqrt(lo * hi), m = 0;

		for (int i = 0; i < 4096; i++)
			m += zipf_rate((i + 0.5) / 4096, a);
		if (m / 4096 < mean)
			lo = a;
		else
			hi = a;
	}
	return sqrt(lo * hi);
}

/* Gate-noise variance the weight type's rounding adds (measured, roughly). */
static double quant_var(uint32_t type)
{
	switch (type) {
	case HYB_TYPE_Q4_0:
	case HYB_TYPE_Q4_K:
		return 0.04;
	case HYB_TYPE_Q8_0:
	case HYB_TYPE_Q6_K:
		return 0.005;
	default:
		return 0.002;
	}
}

static void make_neurons(struct synth_sparse *d, uint32_t type)
{
	const double K = d->K, a = zipf_scale(1.0 - d->sparsity);
	const double lo = det_log(Q_COLD / K), hi = det_log(Q_HOT);

	for (uint32_t l = 0; l < d->L; l++) {
		/* the token term plus what rounding, norm weights and the attention
		 * layers up to this one add (each layer's attention: sig_ctx^2) */
		double sigma = sqrt(1.0 + quant_var(type) + 0.005 +
				    (l + 1) * d->sig_ctx * d->sig_ctx);

		for (uint32_t i = 0; i < d->N; i++) {
			struct neuron *n = &d->neu[(size_t)l * d->N + i];
			uint64_t s = stream(d->seed, TAG_NEURON, l, i);
			double p = zipf_rate(unif(&s), a), q, m;

			if (K * p <= Q_COLD) {
				m = 1;
				q = K * p;
			} else {
				/* in-span rate rises from Q_COLD to Q_HOT (log-linear in p) */
				double f = (det_log(p) - lo) / (hi - lo);
				double qt = det_exp(det_log(Q_COLD) + f * (det_log(Q_HOT) -
									    det_log(Q_COLD)));

				m = floor(K * p / qt + 0.5);
				m = m < 1 ? 1 : m > K ? K : m;
				q = K * p / m;
			}
			q = q > 0.95 ? 0.95 : q < 1e-5 ? 1e-5 : q;
			n->span = (uint16_t)m;
			n->start = (uint16_t)(splitmix(&s) % d->K);
			n->tau = (float)((m == K ? 0 : MU) - sigma * phi_inv(q));
		}
	}
}

/* ---- rows ---------------------------------------------------------------- */

static void gate_row(const struct synth_sparse *d, uint32_t l, uint64_t i, float *out)
{
	const struct neuron *n = &d->neu[(size_t)l * d->N + i];
	const double sE = sqrt((double)d->E);

	rand_perp(d, stream(d->seed, TAG_GATE, l, i), out);
	for (uint32_t j = 0; j < d->E; j++)
		out[j] = (float)(out[j] * d->c_r);
	axpy(d, out, -n->tau / (sE * RHO_B), 0);
	if (n->span < d->K)
		for (uint32_t k = 0; k < n->span; k++)
			axpy(d, out, MU / (sE * RHO_T), 1 + (n->start + k) % d->K);
}

static void up_row(const struct synth_sparse *d, uint32_t l, uint64_t i, float *out)
{
	const double sE = sqrt((double)d->E);

	if (d->act == ACT_DRELU) {
		/* u = gate + 1.5: relu(u) is positive wherever relu(gate) is */
		gate_row(d, l, i, out);
		axpy(d, out, 1.5 / (sE * RHO_B), 0);
		return;
	}
	rand_perp(d, stream(d->seed, TAG_UP, l, i), out);
	for (uint32_t j = 0; j < d->E; j++)
		out[j] = (float)(out[j] * 0.2 * d->c_r);
	axpy(d, out, 1.0 / (sE * RHO_B), 0);
}

static void down_row(const struct synth_sparse *d, uint32_t l, uint64_t j, float *out)
{
	uint64_t s = stream(d->seed, TAG_DOWN, l, j);

	for (uint32_t i = 0; i < d->N; i++)
		out[i] = scratch_coord((uint32_t)j) ? (float)(d->sd_scr * gauss(&s)) : 0.0f;
}

static void wo_row(const struct synth_sparse *d, uint32_t l, uint64_t j, float *out)
{
	uint64_t s = stream(d->seed, TAG_WO, l, j);
	const size_t base = (size_t)l * CTX_RANK * d->E;

	if (scratch_coord((uint32_t)j)) {
		for (uint32_t k = 0; k < d->E; k++)
			out[k] = (float)(d->so_scr * gauss(&s));
		return;
	}
	/* sum_r p_r[j] q_r: the output stays in P, clear of b and the topics */
	for (uint32_t k = 0; k < d->E; k++)
		out[k] = 0;
	for (uint32_t r = 0; r < CTX_RANK; r++) {
		const float *q = d->ctx_q + base + (size_t)r * d->E;
		double a = d->so_sem * d->ctx_p[base + (size_t)r * d->E + j];

		for (uint32_t k = 0; k < d->E; k++)
			out[k] += (float)(a * q[k]);
	}
}

static void make_ctx(struct synth_sparse *d)
{
	for (uint32_t l = 0; l < d->L; l++) {
		for (uint32_t r = 0; r < CTX_RANK; r++) {
			size_t at = ((size_t)l * CTX_RANK + r) * d->E;
			uint64_t s = stream(d->seed, TAG_WO, l, 1ull << 40 | r);

			rand_perp(d, s, d->ctx_p + at);
			for (uint32_t k = 0; k < d->E; k++)
				d->ctx_q[at + k] = (float)(gauss(&s) / sqrt((double)d->E));
		}
	}
}

static void embd_row(const struct synth_sparse *d, uint64_t v, float *out)
{
	const double sE = sqrt((double)d->E);

	rand_perp(d, stream(d->seed, TAG_TOKEN, v, 0), out);
	for (uint32_t j = 0; j < d->E; j++)
		out[j] = (float)(out[j] * sE * d->rho_n);
	axpy(d, out, sE * RHO_B, 0);
	axpy(d, out, sE * RHO_T, 1 + topic_of(d, v));
}

static void head_row(const struct synth_sparse *d, uint64_t v, float *out)
{
	uint64_t s = stream(d->seed, TAG_HEAD, v, 0);
	uint64_t su = stream(d->seed, TAG_UNIGRAM, v, 0);
	uint32_t k = topic_of(d, v);

	for (uint32_t j = 0; j < d->E; j++)
		out[j] = scratch_coord(j) ? (float)(d->head_scr * gauss(&s)) : 0.0f;
	if (v < 3) { /* <unk> <s> </s>: never sampled */
		axpy(d, out, -20.0 * d->head_b, 0);
		return;
	}
	axpy(d, out, (1.5 * unif(&su) - 0.75) * d->head_b, 0);
	axpy(d, out, d->head_topic, 1 + k);
	axpy(d, out, d->head_next, 1 + (k + d->K - 1) % d->K);
}

int synth_sparse_row(const struct synth_sparse *d, const char *name, uint64_t row, float *out)
{
	unsigned l;
	int n = 0;
	char what[32];

	if (!strcmp(name, "token_embd.weight")) {
		embd_row(d, row, out);
		return 1;
	}
	if (!strcmp(name, "output.weight")) {
		head_row(d, row, out);
		return 1;
	}
	if (sscanf(name, "blk.%u.%31[a-z_].weight%n", &l, what, &n) != 2 || name[n] || l >= d->L)
		return 0;
	if (!strcmp(what, "ffn_gate"))
		gate_row(d, l, row, out);
	else if (!strcmp(what, "ffn_up"))
		up_row(d, l, row, out);
	else if (!strcmp(what, "ffn_down"))
		down_row(d, l, row, out);
	else if (!strcmp(what, "attn_output"))
		wo_row(d, l, row, out);
	else
		return 0;
	return 1;
}

/* ---- for other designs ---------------------------------------------------- */

void synth_sparse_geometry(const struct synth_sparse *d, struct synth_sparse_geometry *g)
{
	g->topics = d->K;
	g->perp_dim = d->d_perp;
	g->rho_t = RHO_T;
	g->rho_b = RHO_B;
	g->rho_n = d->rho_n;
	g->layer_add = d->eps;
}

const float *synth_sparse_direction(const struct synth_sparse *d, uint32_t i)
{
	return d->basis + (size_t)i * d->E;
}

int synth_sparse_scratch_coord(uint32_t j)
{
	return scratch_coord(j);
}

void synth_sparse_perp(const struct synth_sparse *d, uint64_t tag, uint64_t a, uint64_t b,
		       float *out)
{
	rand_perp(d, stream(d->seed, tag, a, b), out);
}

uint64_t synth_sparse_stream(uint64_t seed, uint64_t tag, uint64_t a, uint64_t b)
{
	return stream(seed, tag, a, b);
}

uint64_t synth_sparse_next(uint64_t *s)
{
	return splitmix(s);
}

double synth_sparse_gauss(uint64_t *s)
{
	return gauss(s);
}

/* ---- set-up -------------------------------------------------------------- */

uint32_t synth_sparse_topics(const struct synth_sparse *d)
{
	return d->K;
}

static void set_scales(struct synth_sparse *d)
{
	const double E = d->E, sE = sqrt(E), T = T_DESIGN;
	/* mean squared activation of an active neuron (gate excess ~0.7) */
	const double a2 = d->act == ACT_RELU ? 0.5 : d->act == ACT_RELU2 ? 1.0 : 2.0;
	const double n_act = (1.0 - d->sparsity) * d->N;
	/* after the whole stack the semantic part is this share of the RMS */
	const double sem = 1.0 / sqrt(1.0 + STACK_ADD * STACK_ADD);
	const double logit_stay = det_log((double)d->K) + 4.5;
	const double gap = det_log((1.0 - P_SWITCH) / P_SWITCH);

	d->rho_n = sqrt(1.0 - RHO_T * RHO_T - RHO_B * RHO_B);
	d->c_r = sqrt((double)d->d_perp / E) / d->rho_n;
	d->eps = STACK_ADD / sqrt(2.0 * d->L);
	d->sig_ctx = sqrt(CTX_VAR / d->L);
	/* |down column| = eps sqrt(E) / sqrt(n_act a2), spread over the scratch rows */
	d->sd_scr = d->eps * sE / sqrt(n_act * a2) / sqrt((double)d->n_scr);
	/* W_o: eps of the residual into scratch; sig_ctx of gate noise from the rest */
	d->so_scr = d->eps / (sqrt((double)d->n_scr) * ATT_RMS);
	/* gate noise c_r sum_r <r_i, p_r> (q_r . att): each term has variance
	 * c_r^2 / d_perp * ATT_RMS^2 (q_r unit, att of RMS ATT_RMS) */
	d->so_sem = d->sig_ctx * sqrt((double)d->d_perp) / (d->c_r * sqrt((double)CTX_RANK) *
							      ATT_RMS);
	d->head_topic = logit_stay * T / (sE * RHO_T * sem);
	d->head_next = (logit_stay - gap) * T / (sE * RHO_T * sem);
	d->head_b = T / (sE * RHO_B * sem);
	/* logit noise of ~0.3 nats from the scratch part (norm STACK_ADD) */
	d->head_scr = 0.3 * T / (STACK_ADD * sE * sem);
}

struct synth_sparse *synth_sparse_new(const struct synth_sparse_shape *sh)
{
	struct synth_sparse *d = calloc(1, sizeof(*d));
	uint32_t k;

	if (!d)
		goto oom;
	d->E = sh->hidden;
	d->N = sh->ffn;
	d->L = sh->layers;
	d->V = sh->vocab;
	d->seed = sh->seed;
	d->sparsity = sh->sparsity;
	d->act = !strcmp(sh->act, "relu2") ? ACT_RELU2 : !strcmp(sh->act, "dlrelu") ? ACT_DRELU
										  : ACT_RELU;
	for (uint32_t j = 0; j < d->E; j++)
		d->n_scr += scratch_coord(j);
	d->n_sem = d->E - d->n_scr;
	/* topics: at most 16, >= 16 tokens each, and a basis small next to P */
	k = sh->topics ? sh->topics : 16;
	if (!sh->topics && k > d->V / 16)
		k = d->V / 16;
	if (k + 1 > d->n_sem / 4)
		k = d->n_sem / 4 > 3 ? d->n_sem / 4 - 1 : 2;
	d->K = k < 2 ? 2 : k;
	d->d_perp = d->n_sem > d->K + 1 ? d->n_sem - d->K - 1 : 1;
	d->basis = calloc((size_t)(d->K + 1) * d->E, sizeof(float));
	d->neu = calloc((size_t)d->L * d->N, sizeof(*d->neu));
	d->ctx_p = malloc(sizeof(float) * d->L * CTX_RANK * d->E);
	d->ctx_q = malloc(sizeof(float) * d->L * CTX_RANK * d->E);
	if (!d->basis || !d->neu || !d->ctx_p || !d->ctx_q || make_basis(d))
		goto oom;
	set_scales(d);
	make_ctx(d);
	make_neurons(d, sh->type);
	return d;
oom:
	fprintf(stderr, "hybctl synth: out of memory for the sparse design\n");
	synth_sparse_free(d);
	return NULL;
}

void synth_sparse_free(struct synth_sparse *d)
{
	if (!d)
		return;
	free(d->basis);
	free(d->neu);
	free(d->ctx_p);
	free(d->ctx_q);
	free(d);
}
