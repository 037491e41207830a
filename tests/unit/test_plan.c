// SPDX-License-Identifier: MIT
/*
 * hybctl plan: neuron grouping (METIS), placement (greedy + exact vs brute
 * force), predictors (a planted rule), the plan file (bundles reconstruct
 * the source FFN, the plan model computes what the source model computes)
 * and bad inputs.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cpu_kernels.h"
#include "hyb/device.h"
#include "hyb/gguf.h"
#include "hyb/hybrid.h"
#include "hyb/model.h"
#include "hyb/plan.h"
#include "hyb/profile.h"
#include "hyb/threadpool.h"
#include "plan/plan_internal.h"
#include "test.h"

/* ---- synthetic profiles (built in memory; freed here, not by profile.c) ---- */

static uint64_t rng_next(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static double rng_unif(uint64_t *s)
{
	return (double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0);
}

static double rng_normal(uint64_t *s)
{
	double u = rng_unif(s) + 1e-300, v = rng_unif(s);

	return sqrt(-2.0 * log(u)) * cos(2.0 * M_PI * v);
}

static struct hyb_profile *prof_new(uint32_t n_layer, uint32_t n_embd, uint32_t n_ff,
				    uint32_t n_samples)
{
	struct hyb_profile *p = calloc(1, sizeof(*p));

	CHECK(p);
	snprintf(p->model_name, sizeof(p->model_name), "synthetic");
	p->n_layer = n_layer;
	p->n_embd = n_embd;
	p->n_ff = n_ff;
	p->active_words = (n_ff + 63) / 64;
	p->n_tokens = n_samples;
	p->n_samples = n_samples;
	p->n_seqs = 1;
	p->seq_start = calloc(1, sizeof(uint32_t));
	p->layers = calloc(n_layer, sizeof(*p->layers));
	CHECK(p->seq_start && p->layers);
	for (uint32_t l = 0; l < n_layer; l++) {
		p->layers[l].count = calloc(n_ff, sizeof(uint64_t));
		p->layers[l].active = calloc((size_t)n_samples * p->active_words, sizeof(uint64_t));
		p->layers[l].input = calloc((size_t)n_samples * n_embd, sizeof(uint16_t));
		CHECK(p->layers[l].count && p->layers[l].active && p->layers[l].input);
	}
	return p;
}

static void prof_set(struct hyb_profile *p, uint32_t l, uint32_t s, uint32_t i)
{
	uint64_t *a = p->layers[l].active + (size_t)s * p->active_words;

	if (!((a[i / 64] >> (i % 64)) & 1)) {
		a[i / 64] |= 1ull << (i % 64);
		p->layers[l].count[i]++;
	}
}

static void prof_drop(struct hyb_profile *p)
{
	for (uint32_t l = 0; l < p->n_layer; l++) {
		free(p->layers[l].count);
		free(p->layers[l].active);
		free(p->layers[l].input);
	}
	free(p->layers);
	free(p->seq_start);
	free(p);
}

/*
 * Planted co-activation clusters: n_ff / cs clusters of cs neurons scattered
 * over the layer by a random permutation; each sample turns on `per` clusters
 * (popularity skewed) with each member on with probability 0.9, plus 1% noise.
 */
static void plant_clusters(struct hyb_profile *p, uint32_t l, uint32_t cs, uint32_t per,
			   uint64_t seed)
{
	const uint32_t n = p->n_ff, nc = n / cs;
	uint32_t *where = malloc(n * sizeof(*where));

	CHECK(where);
	for (uint32_t i = 0; i < n; i++)
		where[i] = i;
	for (uint32_t i = n; i > 1; i--) {
		uint32_t j = (uint32_t)(rng_next(&seed) % i), t = where[i - 1];

		where[i - 1] = where[j];
		where[j] = t;
	}
	for (uint32_t s = 0; s < p->n_samples; s++) {
		for (uint32_t q = 0; q < per; q++) {
			/* skewed popularity: cluster index ~ nc * u^2 */
			double u = rng_unif(&seed);
			uint32_t c = (uint32_t)(nc * u * u);

			for (uint32_t m = 0; m < cs; m++)
				if (rng_unif(&seed) < 0.9)
					prof_set(p, l, s, where[c * cs + m]);
		}
		for (uint32_t i = 0; i < n; i++)
			if (rng_unif(&seed) < 0.01)
				prof_set(p, l, s, i);
	}
	free(where);
}

static void check_perm(const int32_t *perm, uint32_t n)
{
	uint8_t *seen = calloc(n, 1);

	CHECK(seen);
	for (uint32_t i = 0; i < n; i++) {
		CHECK_MSG(perm[i] >= 0 && (uint32_t)perm[i] < n && !seen[perm[i]],
			  "perm[%u] = %d is not part of a permutation", i, perm[i]);
		seen[perm[i]] = 1;
	}
	free(seen);
}

/* ---- group size ----------------------------------------------------------- */

TEST(plan_group_size_rule)
{
	/* the link model fitted to KAIROX Table 2 (PCIe 4.0, 10 KB neurons) */
	struct hyb_plan_link k = { 1.36e-6, 25.2e9 };
	uint32_t gs;

	CHECK_NEAR(hyb_plan_link_efficiency(&k, 10240) * 25.2, 5.8, 0.15);
	CHECK_NEAR(hyb_plan_link_efficiency(&k, 32 * 10240) * 25.2, 22.8, 0.3);
	/* 80%: b >= 4 * latency * bw = 137 KB; 7B Q4_0 neurons are 3 x 2304 bytes */
	gs = hyb_plan_pick_group_size(&k, 6912, 11008, 0.8, 1024);
	CHECK_EQ_INT(gs, 20);
	CHECK(hyb_plan_link_efficiency(&k, gs * 6912ull) >= 0.8);
	CHECK(hyb_plan_link_efficiency(&k, (gs - 1) * 6912ull) < 0.8);
	/* F16 neurons are big enough alone-ish, but 1024 groups at most: 11 */
	CHECK_EQ_INT(hyb_plan_pick_group_size(&k, 3 * 8192, 11008, 0.8, 1024), 11);
	/* never more than the layer */
	CHECK_EQ_INT(hyb_plan_pick_group_size(&k, 100, 64, 0.99, 1024), 64);
}

/* ---- grouping ----------------------------------------------------------------- */

TEST(plan_group_metis_beats_baselines)
{
	const uint32_t n = 1000, cs = 16, gs = 16; /* 63 groups, the last one short (8) */
	struct hyb_profile *p = prof_new(1, 64, n, 2000);
	struct hyb_plan_group_opts o = { .group_size = gs, .seed = 1 };
	struct hyb_plan_group_quality q[3];
	struct hyb_plan_group_info info;
	int32_t *perm = malloc(n * sizeof(*perm));
	char err[256];

	CHECK(perm);
	plant_clusters(p, 0, cs, 4, 7);
	for (int how = 0; how < 3; how++) {
		CHECK_MSG(!hyb_plan_group_layer(p, 0, (enum hyb_plan_grouping)how, &o, perm, &info, err,
					    sizeof(err)), "%s", err);
		check_perm(perm, n);
		hyb_plan_group_quality(p, 0, perm, gs, &q[how]);
		printf("    %-10s inside %.3f  active groups %.1f / 63  (active neurons %.1f)\n",
		       how == 0 ? "metis" : how == 1 ? "contiguous" : "random", q[how].inside,
		       q[how].active_groups, q[how].active_neurons);
		if (how == 0) {
			/* groups by frequency: each group's mean count is non-increasing */
			double prev = INFINITY;

			for (uint32_t g = 0; g + 1 < (n + gs - 1) / gs; g++) {
				double f = 0;

				for (uint32_t i = g * gs; i < (g + 1) * gs; i++)
					f += (double)p->layers[0].count[perm[i]];
				CHECK(f / gs <= prev + 1e-9);
				prev = f / gs;
				for (uint32_t i = g * gs + 1; i < (g + 1) * gs; i++)
					CHECK(p->layers[0].count[perm[i]] <=
					      p->layers[0].count[perm[i - 1]]);
			}
			printf("    metis: %u edges, %u moved, %.3f s\n", (unsigned)info.edges,
			       info.moved, info.seconds);
		}
	}
	/* clusters recovered: most co-activation inside groups, few groups per token */
	/* a perfect recovery keeps ~0.19 of the pairs inside (4 clusters + noise per sample) */
	CHECK(q[0].inside > 0.15);
	CHECK(q[0].inside > 5 * q[1].inside && q[0].inside > 5 * q[2].inside);
	CHECK(q[0].active_groups < 0.6 * q[1].active_groups);
	CHECK(q[0].active_groups < 0.6 * q[2].active_groups);
	free(perm);
	prof_drop(p);
}

/* Exact sizes even when METIS's balance is loose: many tiny parts, odd remainder. */
TEST(plan_group_exact_sizes)
{
	const uint32_t n = 517;
	struct hyb_profile *p = prof_new(1, 16, n, 300);
	int32_t *perm = malloc(n * sizeof(*perm));
	char err[256];

	CHECK(perm);
	plant_clusters(p, 0, 5, 6, 3);
	for (uint32_t gs = 2; gs <= 40; gs += 7) {
		struct hyb_plan_group_opts o = { .group_size = gs, .seed = gs };
		struct hyb_plan_group_info info;

		CHECK_MSG(!hyb_plan_group_layer(p, 0, HYB_PLAN_GROUP_METIS, &o, perm, &info, err,
					    sizeof(err)), "%s", err);
		check_perm(perm, n);
	}
	free(perm);
	prof_drop(p);
}

/* ---- placement -------------------------------------------------------------------- */

struct place_case {
	uint32_t n_layer;
	uint32_t n[4];
	double value[4][8];
	uint64_t bytes[4][8];
	uint32_t min_groups[4];
	uint64_t budget;
};

/* Random small instance with the plan's structure: equal groups, maybe one short. */
static void random_case(struct place_case *c, uint64_t *seed)
{
	memset(c, 0, sizeof(*c));
	c->n_layer = 1 + (uint32_t)(rng_next(seed) % 4);
	uint64_t total = 0;

	for (uint32_t l = 0; l < c->n_layer; l++) {
		uint64_t full = 50 + rng_next(seed) % 200;
		bool has_short = rng_next(seed) % 2;

		c->n[l] = 1 + (uint32_t)(rng_next(seed) % 5);
		for (uint32_t g = 0; g < c->n[l]; g++) {
			/* power-law-ish impacts */
			double u = rng_unif(seed);

			c->value[l][g] = u * u * u * 10.0;
			c->bytes[l][g] = full;
		}
		if (has_short)
			c->bytes[l][rng_next(seed) % c->n[l]] = 1 + rng_next(seed) % full;
		c->min_groups[l] = 1 + (uint32_t)(rng_next(seed) % c->n[l]);
		for (uint32_t g = 0; g < c->n[l]; g++)
			total += c->bytes[l][g];
	}
	c->budget = (uint64_t)(rng_unif(seed) * (double)total);
}

/* Every subset of groups: the ILP's optimum. */
static double brute_force(const struct place_case *c)
{
	uint32_t items = 0, lay[20], grp[20];
	double best = 0;

	for (uint32_t l = 0; l < c->n_layer; l++)
		for (uint32_t g = 0; g < c->n[l]; g++) {
			lay[items] = l;
			grp[items++] = g;
		}
	for (uint32_t mask = 0; mask < (1u << items); mask++) {
		uint32_t cnt[4] = { 0 };
		uint64_t b = 0;
		double v = 0;
		bool ok = true;

		for (uint32_t q = 0; q < items; q++)
			if (mask >> q & 1) {
				cnt[lay[q]]++;
				b += c->bytes[lay[q]][grp[q]];
				v += c->value[lay[q]][grp[q]];
			}
		for (uint32_t l = 0; l < c->n_layer; l++)
			if (cnt[l] && cnt[l] < c->min_groups[l])
				ok = false;
		if (ok && b <= c->budget && v > best)
			best = v;
	}
	return best;
}

static void check_solution(const struct place_case *c, int8_t *const *gpu,
			   const struct hyb_plan_place_result *r)
{
	uint64_t b = 0;
	double v = 0;

	for (uint32_t l = 0; l < c->n_layer; l++) {
		uint32_t k = 0;

		for (uint32_t g = 0; g < c->n[l]; g++)
			if (gpu[l][g]) {
				k++;
				b += c->bytes[l][g];
				v += c->value[l][g];
			}
		CHECK_MSG(k == 0 || k >= c->min_groups[l], "layer %u has %u groups < min %u", l,
			  k, c->min_groups[l]);
	}
	CHECK_MSG(b <= c->budget, "placement uses %llu bytes > budget %llu",
		  (unsigned long long)b, (unsigned long long)c->budget);
	CHECK_NEAR(v, r->value, 1e-9);
	CHECK_EQ_INT(b, r->bytes);
	CHECK(r->value <= r->bound + 1e-9);
}

TEST(plan_place_exact_on_small_cases)
{
	uint64_t seed = 12345;
	int greedy_opt = 0, n_cases = 3000;
	double worst_gap = 0, sum_gap = 0;

	for (int t = 0; t < n_cases; t++) {
		struct place_case c;
		struct hyb_plan_place_layer L[4];
		int8_t gbuf[4][8], *gpu[4];
		struct hyb_plan_place_result rg, rs;
		double opt;

		random_case(&c, &seed);
		for (uint32_t l = 0; l < c.n_layer; l++) {
			L[l] = (struct hyb_plan_place_layer){ c.n[l], c.value[l], c.bytes[l],
							  c.min_groups[l] };
			gpu[l] = gbuf[l];
		}
		opt = brute_force(&c);
		CHECK(!hyb_plan_place_greedy(L, c.n_layer, c.budget, gpu, &rg));
		check_solution(&c, gpu, &rg);
		CHECK(rg.value <= opt + 1e-9);
		if (rg.value >= opt - 1e-9)
			greedy_opt++;
		else if (opt > 0 && (opt - rg.value) / opt > worst_gap)
			worst_gap = (opt - rg.value) / opt;
		if (opt > 0)
			sum_gap += (opt - rg.value) / opt;
		CHECK(!hyb_plan_place_solve(L, c.n_layer, c.budget, 1000000, gpu, &rs));
		check_solution(&c, gpu, &rs);
		CHECK(rs.optimal);
		CHECK_MSG(fabs(rs.value - opt) <= 1e-9, "case %d: solver %.9f, brute force %.9f",
			  t, rs.value, opt);
	}
	printf("    greedy alone optimal on %d / %d cases, mean gap %.2f%%, worst %.1f%%; "
	       "greedy + branch and bound: all\n", greedy_opt, n_cases, 100 * sum_gap / n_cases,
	       100 * worst_gap);
}

/* A realistic size: 32 layers x 1000 groups; the solver's answer against the LP bound. */
TEST(plan_place_large_gap)
{
	enum { NL = 32, NG = 1001 };
	static double value[NL][NG];
	static uint64_t bytes[NL][NG];
	static int8_t gbuf[NL][NG];
	struct hyb_plan_place_layer L[NL];
	int8_t *gpu[NL];
	struct hyb_plan_place_result r;
	uint64_t seed = 99, total = 0;

	for (uint32_t l = 0; l < NL; l++) {
		for (uint32_t g = 0; g < NG; g++) {
			double u = rng_unif(&seed);

			value[l][g] = 11 * u * u * u * (1 + l % 3);
			bytes[l][g] = g == NG - 1 ? 3 * 6912 : 11 * 6912;
			total += bytes[l][g];
		}
		L[l] = (struct hyb_plan_place_layer){ NG, value[l], bytes[l], 14 };
		gpu[l] = gbuf[l];
	}
	CHECK(!hyb_plan_place_solve(L, NL, total / 3, 20000, gpu, &r));
	printf("    32 x 1001 groups: value %.3f, LP bound %.3f (gap %.2e), %s after %llu nodes\n",
	       r.value, r.bound, (r.bound - r.value) / r.bound, r.optimal ? "optimal" : "unproven",
	       (unsigned long long)r.nodes);
	CHECK(r.bytes <= total / 3);
	CHECK((r.bound - r.value) / r.bound < 1e-3);
}

TEST(plan_min_neurons_rule)
{
	/* 15 us sync, 50 GB/s CPU, 1 TB/s GPU, 6912-byte neurons: 15e-6 / 131.3e-9 */
	struct hyb_plan_sync_model s = { 15e-6, 50e9, 1000e9 };

	CHECK_EQ_INT(hyb_plan_min_neurons(&s, 6912, 11008), 115);
	s.t_sync = 0;
	CHECK_EQ_INT(hyb_plan_min_neurons(&s, 6912, 11008), 1);
	s.t_sync = 1;
	CHECK_EQ_INT(hyb_plan_min_neurons(&s, 6912, 11008), 11008);
}

/* ---- predictors --------------------------------------------------------------------- */

/*
 * A planted rule: x ~ N(0, I); neuron r is active when c_r · (U^T x) > 1.1 |c_r|
 * for a rank-8 projection U (about 14% of neurons per token), the shape of a
 * ReLU gate over a low-dimensional signal.
 */
static struct hyb_profile *planted_predictor_profile(uint32_t n_embd, uint32_t n_ff, uint32_t S)
{
	enum { R = 8 };
	struct hyb_profile *p = prof_new(1, n_embd, n_ff, S);
	float *U = malloc((size_t)n_embd * R * sizeof(float));
	float *C = malloc((size_t)n_ff * R * sizeof(float));
	float *x = malloc(n_embd * sizeof(float));
	uint64_t seed = 2024;

	CHECK(U && C && x);
	for (uint32_t q = 0; q < n_embd * R; q++)
		U[q] = (float)(rng_normal(&seed) / sqrt(n_embd));
	for (uint32_t q = 0; q < n_ff * R; q++)
		C[q] = (float)rng_normal(&seed);
	for (uint32_t s = 0; s < S; s++) {
		float z[R] = { 0 };

		for (uint32_t e = 0; e < n_embd; e++) {
			x[e] = (float)rng_normal(&seed);
			p->layers[0].input[(size_t)s * n_embd + e] = hyb_f32_to_f16(x[e]);
		}
		for (uint32_t e = 0; e < n_embd; e++)
			for (int q = 0; q < R; q++)
				z[q] += U[e * R + q] * hyb_f16_to_f32(hyb_f32_to_f16(x[e]));
		for (uint32_t r = 0; r < n_ff; r++) {
			float d = 0, nn = 0;

			for (int q = 0; q < R; q++) {
				d += C[r * R + q] * z[q];
				nn += C[r * R + q] * C[r * R + q];
			}
			if (d > 1.1f * sqrtf(nn))
				prof_set(p, 0, s, r);
		}
	}
	free(U);
	free(C);
	free(x);
	return p;
}

TEST(plan_predictor_learns_planted_rule)
{
	const uint32_t n_embd = 64, n_ff = 512, S = 4000;
	struct hyb_profile *p = planted_predictor_profile(n_embd, n_ff, S);
	struct hyb_threadpool *pool = hyb_threadpool_new(2);
	struct hyb_plan_pred_opts o = { .target_recall = 0.95, .seed = 1, .pool = pool, .gflop = 20 };
	struct hyb_plan_predictor pr;
	struct hyb_plan_pred_stats st;
	int32_t *perm = malloc(n_ff * sizeof(*perm));
	char err[256];

	CHECK(pool && perm);
	/* a reversed output order: the predictor must follow perm */
	for (uint32_t i = 0; i < n_ff; i++)
		perm[i] = (int32_t)(n_ff - 1 - i);
	CHECK_MSG(!hyb_plan_pred_train(p, 0, 64, perm, &o, &pr, &st, err, sizeof(err)), "%s", err);
	printf("    H %u, %.1f epochs, %.2f s: recall %.3f precision %.3f predicted %.3f "
	       "(true %.3f), loss %.4f, threshold %.3f\n", st.hidden, st.epochs, st.seconds,
	       st.recall, st.precision, st.pred_frac, st.true_frac, st.loss, st.threshold);
	CHECK(st.recall >= 0.90);
	CHECK(st.precision >= 0.60);
	CHECK(st.pred_frac < 2.0 * st.true_frac);

	/* hyb_predictor_run on held-out samples: same decisions as the reference, bundle order */
	{
		struct hyb_predictor hp = { pr.n_in, pr.hidden, pr.n_out, pr.fc1_w, pr.fc1_b,
					    pr.fc2_w, pr.fc2_b };
		void *scratch = malloc(hyb_predictor_scratch_bytes(&hp));
		uint32_t *act = malloc(n_ff * sizeof(*act));
		float *lg = malloc(n_ff * sizeof(float)), x[64], h[64];
		uint64_t tp = 0, pos = 0, disagree = 0;

		CHECK(scratch && act && lg);
		for (uint32_t s = S - 400; s < S; s++) {
			uint32_t na, q = 0;

			for (uint32_t e = 0; e < n_embd; e++)
				x[e] = hyb_f16_to_f32(p->layers[0].input[(size_t)s * n_embd + e]);
			na = hyb_predictor_run(&hp, x, s % 2 ? pool : NULL, scratch, lg, act);
			/* reference in double */
			for (uint32_t j = 0; j < pr.hidden; j++) {
				double a = pr.fc1_b[j];

				for (uint32_t e = 0; e < n_embd; e++)
					a += (double)hyb_f16_to_f32(pr.fc1_w[j * n_embd + e]) *
					     hyb_f16_to_f32(hyb_f32_to_f16(x[e]));
				h[j] = a > 0 ? (float)a : 0;
			}
			for (uint32_t i = 0; i < n_ff; i++) {
				double z = pr.fc2_b[i];

				for (uint32_t j = 0; j < pr.hidden; j++)
					z += (double)hyb_f16_to_f32(pr.fc2_w[j * pr.n_out + i]) *
					     h[j];
				CHECK_NEAR(lg[i], z, 1e-3 * (1 + fabs(z)));
				if ((z > 0) != (lg[i] > 0))
					disagree++;
				if (q < na && act[q] == i) {
					CHECK(lg[i] > 0);
					q++;
					tp += hyb_profile_active(p, 0, s, (uint32_t)perm[i]);
				} else {
					CHECK(!(lg[i] > 0));
				}
				pos += hyb_profile_active(p, 0, s, (uint32_t)perm[i]);
			}
			CHECK_EQ_INT(q, na);
		}
		CHECK(disagree < 20);
		CHECK((double)tp / pos >= 0.90);
		free(scratch);
		free(act);
		free(lg);
	}
	hyb_plan_predictor_free(&pr);
	hyb_threadpool_free(pool);
	free(perm);
	prof_drop(p);
}

TEST(plan_predictor_hidden_rule)
{
	struct hyb_profile *p = prof_new(1, 256, 4096, 10);

	p->n_tokens = 1000;
	/* all neurons at frequency 0.5: 4096 bits / 16 = 256 */
	for (uint32_t i = 0; i < 4096; i++)
		p->layers[0].count[i] = 500;
	CHECK_EQ_INT(hyb_plan_pred_hidden(p, 0, 32, 1024), 256);
	CHECK_EQ_INT(hyb_plan_pred_hidden(p, 0, 32, 128), 128);
	/* sparser: 0.02 -> 0.1414 bits each -> 579 bits -> 37 -> 64 */
	for (uint32_t i = 0; i < 4096; i++)
		p->layers[0].count[i] = 20;
	CHECK_EQ_INT(hyb_plan_pred_hidden(p, 0, 32, 1024), 64);
	/* never active or always active: no entropy, the lower bound */
	for (uint32_t i = 0; i < 4096; i++)
		p->layers[0].count[i] = i % 2 ? 0 : 1000;
	CHECK_EQ_INT(hyb_plan_pred_hidden(p, 0, 32, 1024), 32);
	prof_drop(p);
}

/* ---- the plan file ------------------------------------------------------------------ */

/* build/hybctl, or $HYB_TEST_HYBCTL */
static const char *hybctl_bin(void)
{
	const char *b = getenv("HYB_TEST_HYBCTL");

	return b ? b : "build/hybctl";
}

static const char *synth_model(const char *name, const char *args)
{
	static char path[4][512];
	static int k;
	char cmd[1024];
	char *p = path[k++ % 4];

	if (access(hybctl_bin(), X_OK))
		SKIP("%s not built (run from the repository root after make)", hybctl_bin());
	snprintf(p, 512, "%s/%s.gguf", hyb_test_tmpdir(), name);
	snprintf(cmd, sizeof(cmd), "%s synth -o %s %s -t 2 >/dev/null", hybctl_bin(), p, args);
	CHECK_MSG(system(cmd) == 0, "%s failed", cmd);
	return p;
}

/* A profile for a model: planted clusters and random unit-RMS inputs. */
static struct hyb_profile *model_profile(uint32_t n_layer, uint32_t n_embd, uint32_t n_ff,
					 uint32_t S)
{
	struct hyb_profile *p = prof_new(n_layer, n_embd, n_ff, S);
	uint64_t seed = 5;

	for (uint32_t l = 0; l < n_layer; l++) {
		plant_clusters(p, l, 16, 3, 100 + l);
		for (size_t q = 0; q < (size_t)S * n_embd; q++)
			p->layers[l].input[q] = hyb_f32_to_f16((float)rng_normal(&seed));
	}
	p->n_tokens = S;
	return p;
}

static void quiet_opts(struct hyb_plan_opts *o, uint64_t budget)
{
	hyb_plan_opts_default(o);
	o->gpu_budget = budget;
	o->quiet = true;
	o->n_threads = 2;
	o->pred.gflop = 0.2;
	o->pred.max_epochs = 2;
	/* C_l of a few groups at these tiny neuron sizes (20 us would ask for whole layers) */
	o->sync.t_sync = 2e-6;
}

static bool kv_same(const struct hyb_gguf_kv *a, const struct hyb_gguf_kv *b)
{
	if (a->type != b->type)
		return false;
	switch (a->type) {
	case HYB_GGUF_VT_STRING:
		return a->v.str.len == b->v.str.len &&
		       !memcmp(a->v.str.ptr, b->v.str.ptr, a->v.str.len);
	case HYB_GGUF_VT_ARRAY:
		if (a->v.arr.type != b->v.arr.type || a->v.arr.n != b->v.arr.n)
			return false;
		if (a->v.arr.type == HYB_GGUF_VT_STRING) {
			for (uint64_t i = 0; i < a->v.arr.n; i++)
				if (a->v.arr.strs[i].len != b->v.arr.strs[i].len ||
				    memcmp(a->v.arr.strs[i].ptr, b->v.arr.strs[i].ptr,
					   a->v.arr.strs[i].len))
					return false;
			return true;
		}
		return true; /* element bytes compared by the caller's spot checks */
	case HYB_GGUF_VT_FLOAT32:
	case HYB_GGUF_VT_FLOAT64:
		return a->v.f64 == b->v.f64;
	case HYB_GGUF_VT_BOOL:
		return a->v.b == b->v.b;
	default:
		return a->v.u64 == b->v.u64;
	}
}

static const struct hyb_gguf_tensor *tensor_of(const struct hyb_gguf_file *f, uint32_t l, const char *sfx)
{
	char name[96];

	snprintf(name, sizeof(name), "blk.%u.%s", l, sfx);
	return hyb_gguf_find_tensor(f, name);
}

/*
 * Bundle row `row` against source down column src_i (downf: [E][F] floats):
 * exact when tol is 0, else within tol times the 32-block's largest weight
 * (the requantization's scale bounds its error).
 */
static void check_down_column(const float *row, const float *downf, uint32_t E, uint32_t F,
			      uint32_t src_i, double tol, double *max_rel)
{
	for (uint32_t e = 0; e < E; e++) {
		float want = downf[(size_t)e * F + src_i], amax = 0, d = fabsf(row[e] - want);

		if (tol == 0) {
			CHECK_MSG(row[e] == want, "down (%u, %u) %g != %g", e, src_i, row[e], want);
			continue;
		}
		for (uint32_t x = e / 32 * 32; x < e / 32 * 32 + 32; x++)
			amax = fmaxf(amax, fabsf(downf[(size_t)x * F + src_i]));
		CHECK_MSG(d <= tol * amax + 1e-7f, "down (%u, %u): %g vs %g", e, src_i, row[e],
			  want);
		if (amax > 0 && d / amax > *max_rel)
			*max_rel = d / amax;
	}
}

/*
 * The plan decodes sparsely on the CPU: with every neuron predicted (fc2
 * biases forced up) the sparse operator gives the dense FFN over the same
 * bundles, token for token, up to summation order. A hybrid context takes
 * the plan where the device kernels run its type (on the CPU device: the
 * CPU's bits) and refuses it by name where they do not.
 */
static void sparse_and_hybrid(const char *plan, const char *type)
{
	struct hyb_model *m = hyb_model_load_mode(plan, HYB_LOAD_MMAP);
	float *bias;

	CHECK_MSG(m, "%s", hyb_last_error());
	bias = malloc(sizeof(float) * m->hp.n_ff);
	CHECK(bias);
	for (uint32_t i = 0; i < m->hp.n_ff; i++)
		bias[i] = 1e30f;
	for (uint32_t l = 0; l < m->hp.n_layer; l++)
		m->layers[l].plan.fc2_bias = bias;
	{
		struct hyb_ctx *d = hyb_test_ctx(m, HYB_FFN_DENSE), *s = hyb_test_ctx(m, HYB_FFN_SPARSE);
		struct hyb_test_agreement r = { 0 };

		CHECK(hyb_ctx_sparse(s) && !hyb_ctx_sparse(d));
		hyb_test_greedy_compare(d, s, m->hp.n_vocab, 1, 8, 12, 1, &r);
		printf("    %s: sparse decode, all neurons, vs dense over the bundles: %u/%u, "
		       "largest logit difference %.2g\n", type, r.agree, r.total, r.max_diff);
		CHECK_EQ_INT(r.agree, r.total);
		CHECK_MSG(r.max_diff < 1e-3, "largest logit difference %g", r.max_diff);
		hyb_ctx_free(d);
		hyb_ctx_free(s);
	}
	{
		struct hyb_hybrid_params hy = { .device = "cpu", .policy = HYB_POLICY_TAM,
						.gpu_budget = 1ull << 30 };
		struct hyb_ctx_params p = { .n_ctx = 64, .n_threads = 1, .hybrid = &hy };
		struct hyb_ctx *c = hyb_ctx_new(m, &p);
		const uint32_t t = m->layers[0].plan.bundles.type;

		if (hyb_device_ffn_type_ok(t)) {
			struct hyb_ctx *s = hyb_test_ctx(m, HYB_FFN_SPARSE);
			struct hyb_test_agreement r = { 0 };

			CHECK_MSG(c, "%s", hyb_last_error());
			/* one-token steps: the CPU device runs the CPU kernels on the same
			 * rows, so every type gives the CPU's bits */
			hyb_test_greedy_compare(s, c, m->hp.n_vocab, 2, 1, 12, 1, &r);
			printf("    %s: hybrid on the CPU device vs CPU sparse: %u/%u, largest logit "
			       "difference %.2g\n", type, r.agree, r.total, r.max_diff);
			CHECK_EQ_INT(r.agree, r.total);
			CHECK_MSG(r.max_diff == 0, "largest logit difference %g", r.max_diff);
			hyb_ctx_free(s);
		} else {
			CHECK(!c);
			printf("    %s: hybrid refused: %s\n", type, hyb_last_error());
			CHECK_MSG(strstr(hyb_last_error(), "does not run") &&
				  strstr(hyb_last_error(), hyb_type_name(t)), "%s", hyb_last_error());
		}
		hyb_ctx_free(c);
	}
	hyb_model_free(m);
	free(bias);
}

static void roundtrip_share(const char *type, double down_tol, double logit_tol,
			    double share);

static void roundtrip(const char *type, double down_tol, double logit_tol)
{
	roundtrip_share(type, down_tol, logit_tol, 0.5);
}

/*
 * Make a plan of a synthetic model of `type` and check the file against the
 * source: keys, copied tensors, permutation, bundles (gate/up rows exact,
 * down columns within the requantization tolerance), placement, predictor
 * shapes; then load it and compare logits with the source model.
 */
static void roundtrip_share(const char *type, double down_tol, double logit_tol, double share)
{
	char args[256], out[512];
	const char *model;
	struct hyb_profile *prof;
	struct hyb_plan_opts o;
	struct hyb_gguf_file *src, *pl;
	const struct hyb_cpu_kernels *k = hyb_cpu_best();
	const uint32_t E = 256, F = 1024, NL = 2, GS = 48, NG = (F + GS - 1) / GS;
	uint64_t dense = 0, preds = 0, groups_on_gpu = 0, budget;
	uint32_t gs;

	snprintf(args, sizeof(args), "--hidden %u --ffn %u --layers %u --heads 4 --vocab 512 "
		 "--act relu --type %s --seed 3", E, F, NL, type);
	model = synth_model(type, args);
	prof = model_profile(NL, E, F, 300);
	snprintf(out, sizeof(out), "%s/plan-%s.gguf", hyb_test_tmpdir(), type);
	{
		struct stat st;

		/* a share of the model's size (half): the dense part, predictors and some groups */
		CHECK(!stat(model, &st));
		budget = (uint64_t)((double)st.st_size * share);
	}
	quiet_opts(&o, budget);
	o.group_size = GS; /* 21 groups of 48 and a short one of 16 */
	CHECK_MSG(!hyb_plan_make(model, prof, &o, out), "plan_make: %s", hyb_last_error());
	CHECK(!hyb_gguf_open(model, &src));
	CHECK_MSG(!hyb_gguf_open(out, &pl), "%s", hyb_last_error());

	/* keys: the source's, unchanged, and the plan's */
	for (uint64_t i = 0; i < src->n_kv; i++) {
		char key[256];
		const struct hyb_gguf_kv *b;

		snprintf(key, sizeof(key), "%.*s", (int)src->kv[i].key.len, src->kv[i].key.ptr);
		b = hyb_gguf_find(pl, key);
		CHECK_MSG(b && kv_same(&src->kv[i], b), "key %s not copied unchanged", key);
	}
	CHECK(hyb_gguf_get_u32(pl, HYB_PLAN_KEY_VERSION, &gs) && gs == HYB_PLAN_VERSION);
	CHECK(hyb_gguf_get_u32(pl, HYB_PLAN_KEY_GROUP_SIZE, &gs) && gs == GS);
	{
		int64_t b;
		char s[256];

		CHECK(hyb_gguf_get_i64(pl, HYB_PLAN_KEY_GPU_BUDGET, &b) && (uint64_t)b == budget);
		CHECK(hyb_gguf_get_str(pl, HYB_PLAN_KEY_SOURCE, s, sizeof(s)));
		CHECK(!strcmp(s, strrchr(model, '/') + 1));
	}
	/* every non-FFN tensor byte for byte; FFN matrices gone */
	for (uint64_t i = 0; i < src->n_tensors; i++) {
		const struct hyb_gguf_tensor *a = &src->tensors[i], *b;
		char name[96];

		snprintf(name, sizeof(name), "%.*s", (int)a->name.len, a->name.ptr);
		b = hyb_gguf_find_tensor(pl, name);
		if (strstr(name, "ffn_gate.") || strstr(name, "ffn_up.") ||
		    strstr(name, "ffn_down.")) {
			CHECK_MSG(!b, "%s should be replaced by bundles", name);
			continue;
		}
		CHECK_MSG(b && b->type == a->type && b->n_dims == a->n_dims &&
			  !memcmp(b->ne, a->ne, sizeof(a->ne)) && b->nbytes == a->nbytes &&
			  !memcmp(b->data, a->data, a->nbytes), "%s not copied unchanged", name);
		if (strcmp(name, "token_embd.weight") || !hyb_gguf_find_tensor(src, "output.weight"))
			dense += a->nbytes;
	}

	for (uint32_t l = 0; l < NL; l++) {
		char name[96];
		const struct hyb_gguf_tensor *gate, *up, *down;
		const struct hyb_gguf_tensor *bun = tensor_of(pl, l, HYB_PLAN_T_BUNDLES);
		const struct hyb_gguf_tensor *perm_t = tensor_of(pl, l, HYB_PLAN_T_PERM);
		const struct hyb_gguf_tensor *gpu_t = tensor_of(pl, l, HYB_PLAN_T_GPU);
		const struct hyb_gguf_tensor *freq_t = tensor_of(pl, l, HYB_PLAN_T_FREQ);
		const struct hyb_gguf_tensor *fc1 = tensor_of(pl, l, HYB_PLAN_T_FC1_W);
		const struct hyb_gguf_tensor *fc1b = tensor_of(pl, l, HYB_PLAN_T_FC1_B);
		const struct hyb_gguf_tensor *fc2 = tensor_of(pl, l, HYB_PLAN_T_FC2_W);
		const struct hyb_gguf_tensor *fc2b = tensor_of(pl, l, HYB_PLAN_T_FC2_B);
		float *downf = malloc((size_t)E * F * sizeof(float));
		float *row = malloc(E * sizeof(float));
		const int32_t *perm;
		uint64_t rb;
		double max_rel = 0;

		CHECK(downf && row);
		snprintf(name, sizeof(name), "blk.%u.ffn_gate.weight", l);
		gate = hyb_gguf_find_tensor(src, name);
		snprintf(name, sizeof(name), "blk.%u.ffn_up.weight", l);
		up = hyb_gguf_find_tensor(src, name);
		snprintf(name, sizeof(name), "blk.%u.ffn_down.weight", l);
		down = hyb_gguf_find_tensor(src, name);
		CHECK(gate && up && down);
		CHECK(bun && bun->type == gate->type && bun->ne[0] == E && bun->ne[1] == 3 * F);
		CHECK(perm_t && perm_t->type == HYB_TYPE_I32 && perm_t->ne[0] == F);
		CHECK(gpu_t && gpu_t->type == HYB_TYPE_I8 && gpu_t->ne[0] == NG);
		CHECK(freq_t && freq_t->type == HYB_TYPE_F32 && freq_t->ne[0] == NG);
		CHECK(fc1 && fc1->type == HYB_TYPE_F16 && fc1->ne[0] == E);
		CHECK(fc1b && fc1b->type == HYB_TYPE_F32 && fc1b->ne[0] == fc1->ne[1]);
		CHECK(fc2 && fc2->type == HYB_TYPE_F16 && fc2->ne[1] == fc1->ne[1]);
		CHECK(fc2->ne[0] == F);
		CHECK(fc2b && fc2b->type == HYB_TYPE_F32 && fc2b->ne[0] == F);
		preds += fc1->nbytes + fc1b->nbytes + fc2->nbytes + fc2b->nbytes;
		perm = perm_t->data;
		check_perm(perm, F);
		rb = hyb_row_bytes(gate->type, E);
		for (uint32_t e = 0; e < E; e++)
			k->dequantize[down->type]((const char *)down->data +
						  e * hyb_row_bytes(down->type, F),
						  downf + (size_t)e * F, F);
		for (uint32_t g = 0; g < NG; g++) {
			uint32_t i0 = g * GS, ng = F - i0 < GS ? F - i0 : GS;
			const char *base = (const char *)bun->data + 3ull * i0 * rb;
			double f = 0;

			if (((const int8_t *)gpu_t->data)[g]) {
				CHECK_EQ_INT(((const int8_t *)gpu_t->data)[g], 1);
				groups_on_gpu += 3ull * ng * rb;
			}
			for (uint32_t q = 0; q < ng; q++) {
				uint32_t src_i = (uint32_t)perm[i0 + q];
				const char *gsrc = (const char *)gate->data + src_i * rb;

				f += (double)prof->layers[l].count[src_i] / prof->n_tokens;
				CHECK_MSG(!memcmp(base + q * rb, gsrc, rb),
					  "layer %u group %u: gate row %u", l, g, q);
				CHECK_MSG(!memcmp(base + (ng + q) * rb,
						  (const char *)up->data + src_i * rb, rb),
					  "layer %u group %u: up row %u", l, g, q);
				k->dequantize[bun->type](base + (2 * ng + q) * rb, row, E);
				check_down_column(row, downf, E, F, src_i, down_tol, &max_rel);
			}
			CHECK_NEAR(((const float *)freq_t->data)[g], f / ng, 1e-6);
		}
		{
			/* the per-layer minimum: 0 groups or at least C_l */
			uint32_t c_l = hyb_plan_min_neurons(&o.sync, 3 * rb, F);
			uint32_t m = (c_l + GS - 1) / GS;
			uint32_t on = 0;

			for (uint32_t g = 0; g < NG; g++)
				on += ((const int8_t *)gpu_t->data)[g] != 0;
			printf("    %s layer %u: %u of %u groups on the GPU (C_l %u groups)\n",
			       type, l, on, NG, m);
			CHECK(on == 0 || on >= (m < NG ? m : NG));
		}
		if (down_tol > 0)
			printf("    %s layer %u: down requantization error up to %.4f of the "
			       "block's max\n", type, l, max_rel);
		free(downf);
		free(row);
	}
	/* placement within the budget: dense + predictors + GPU groups */
	printf("    %s: dense %llu + predictors %llu + groups %llu bytes of budget %llu\n", type,
	       (unsigned long long)dense, (unsigned long long)preds,
	       (unsigned long long)groups_on_gpu, (unsigned long long)budget);
	CHECK(dense + preds + groups_on_gpu <= budget);
	CHECK(groups_on_gpu > 0);

	/* the plan is a model that computes what the source computes */
	{
		struct hyb_model *ms = hyb_model_load_mode(model, HYB_LOAD_MMAP);
		struct hyb_model *mp = hyb_model_load_mode(out, HYB_LOAD_MMAP);
		struct hyb_ctx_params cp = { .n_ctx = 64, .n_threads = 1 };
		struct hyb_ctx *cs, *cpn;
		int32_t toks[5] = { 1, 17, 300, 42, 7 };
		float *la = malloc(512 * 5 * sizeof(float)), *lb = malloc(512 * 5 * sizeof(float));
		double num = 0, den = 0;

		CHECK_MSG(ms && mp, "load: %s", hyb_last_error());
		CHECK_EQ_INT(mp->group_size, GS);
		cs = hyb_ctx_new(ms, &cp);
		cpn = hyb_ctx_new(mp, &cp);
		CHECK(cs && cpn && la && lb);
		CHECK(!hyb_ctx_eval(cs, toks, 5, la, true));
		CHECK(!hyb_ctx_eval(cpn, toks, 5, lb, true));
		for (int q = 0; q < 512 * 5; q++) {
			num += (la[q] - lb[q]) * (double)(la[q] - lb[q]);
			den += (double)la[q] * la[q];
		}
		printf("    %s: plan logits vs source: relative rms difference %.2g\n", type,
		       sqrt(num / den));
		CHECK(sqrt(num / den) <= logit_tol);
		hyb_ctx_free(cs);
		hyb_ctx_free(cpn);
		hyb_model_free(ms);
		hyb_model_free(mp);
		free(la);
		free(lb);
	}
	sparse_and_hybrid(out, type);
	hyb_gguf_close(src);
	hyb_gguf_close(pl);
	prof_drop(prof);
}

TEST(plan_file_roundtrip_f32)
{
	roundtrip("F32", 0, 1e-5);
}

TEST(plan_file_roundtrip_f16)
{
	roundtrip("F16", 0, 1e-2);
}

TEST(plan_file_roundtrip_q8_0)
{
	/* half a Q8_0 step is amax / 254 */
	roundtrip("Q8_0", 1.0 / 200, 5e-2);
}

TEST(plan_file_roundtrip_q4_0)
{
	/* Q4_0 maps [-amax, amax] to -8..7 steps of amax / 8: the clipped end is a step off */
	roundtrip("Q4_0", 1.0 / 7.9, 0.3);
}

/*
 * The types with generic sparse kernels. Down tolerances, as a share of the
 * source column's 32-block maximum: half a step of the new blocks, a step at
 * a clipped end, plus for the K-quants the rounding of the sub-block
 * scales (6 bits; Q2_K's 4) on the super-block's.
 */
TEST(plan_file_roundtrip_q4_1)
{
	roundtrip("Q4_1", 1.0 / 7, 0.3); /* (max - min) / 15: at most 2 amax / 15 */
}

TEST(plan_file_roundtrip_q5_0)
{
	roundtrip("Q5_0", 1.0 / 15, 0.15);
}

TEST(plan_file_roundtrip_q5_1)
{
	roundtrip("Q5_1", 1.0 / 15, 0.15);
}

TEST(plan_file_roundtrip_iq4_nl)
{
	roundtrip("IQ4_NL", 1.0 / 4, 0.3); /* the widest gap of its levels, 24 / 127 of amax */
}

TEST(plan_file_roundtrip_q4_k)
{
	roundtrip("Q4_K", 1.0 / 5, 0.3);
}

TEST(plan_file_roundtrip_q5_k)
{
	roundtrip("Q5_K", 1.0 / 10, 0.15);
}

TEST(plan_file_roundtrip_q6_k)
{
	roundtrip("Q6_K", 1.0 / 20, 0.1);
}

TEST(plan_file_roundtrip_q3_k)
{
	/* 3 and 2 bits: half the file leaves the fixed-size F16 predictors no room for groups */
	roundtrip_share("Q3_K", 1.0 / 2.5, 0.5, 0.75);
}

TEST(plan_file_roundtrip_q2_k)
{
	roundtrip_share("Q2_K", 1.0 / 1.2, 1.0, 0.75);
}

TEST(plan_file_roundtrip_iq4_xs)
{
	roundtrip("IQ4_XS", 1.0 / 3.5, 0.3);
}

/* ---- bad input ------------------------------------------------------------------------- */

/* Nothing but `keep` (and hybctl's synth outputs) may be left in the test directory. */
static void check_no_leftovers(const char *out)
{
	char cmd[1024], buf[256] = "";
	FILE *f;

	CHECK(access(out, F_OK) != 0);
	snprintf(cmd, sizeof(cmd), "ls -a '%s' | grep -c 'tmp-' || true", hyb_test_tmpdir());
	f = popen(cmd, "r");
	CHECK(f && fgets(buf, sizeof(buf), f));
	pclose(f);
	CHECK_MSG(atoi(buf) == 0, "temporary files left behind in %s", hyb_test_tmpdir());
}

static void expect_fail(const char *model, const struct hyb_profile *prof, uint64_t budget,
			const char *out, const char *needle)
{
	struct hyb_plan_opts o;
	int rc;

	quiet_opts(&o, budget);
	rc = hyb_plan_make(model, prof, &o, out);
	CHECK_MSG(rc < 0 && rc != -1, "accepted or not an errno (%d: %s)", rc, needle);
	printf("    %s\n", hyb_last_error());
	CHECK_MSG(strstr(hyb_last_error(), needle), "error '%s' does not say '%s'",
		  hyb_last_error(), needle);
	CHECK(!strchr(hyb_last_error(), '\n'));
	check_no_leftovers(out);
}

TEST(plan_rejects_bad_input)
{
	const char *f32 = synth_model("m32", "--hidden 256 --ffn 1024 --layers 2 --act relu "
				      "--type F32 --vocab 512");
	const char *bf16 = synth_model("mbf16", "--hidden 256 --ffn 1024 --layers 2 --act relu "
				       "--type BF16 --vocab 512");
	struct hyb_profile *good = model_profile(2, 256, 1024, 100);
	struct hyb_profile *wrong = model_profile(2, 256, 512, 100);
	struct hyb_profile *few = model_profile(2, 256, 1024, 10);
	char out[512], noffn[512], plan[512];
	struct hyb_plan_opts o;

	snprintf(out, sizeof(out), "%s/out.gguf", hyb_test_tmpdir());
	expect_fail(f32, wrong, 1ull << 30, out, "profile does not match the model");
	expect_fail(f32, few, 1ull << 30, out, "at least 20 samples");
	expect_fail(f32, good, 100000, out, "too small for the dense part");
	expect_fail(bf16, good, 1ull << 30, out, "FFN type BF16 is not supported");
	{
		char bad[600];

		snprintf(bad, sizeof(bad), "%s/no/such/dir/out.gguf", hyb_test_tmpdir());
		expect_fail(f32, good, 1ull << 30, bad, "cannot write");
	}
	{
		struct stat a, b;

		CHECK(!stat(f32, &a));
		quiet_opts(&o, 1ull << 30);
		CHECK(hyb_plan_make(f32, good, &o, f32) == -EINVAL);
		CHECK_MSG(strstr(hyb_last_error(), "is the model itself"), "%s", hyb_last_error());
		CHECK(!stat(f32, &b) && a.st_size == b.st_size && a.st_mtime == b.st_mtime);
	}

	/* a model without FFN tensors */
	{
		struct hyb_gguf_file *src;
		struct hyb_gguf_writer *w = hyb_gguf_writer_new();

		CHECK(!hyb_gguf_open(f32, &src) && w);
		for (uint64_t i = 0; i < src->n_kv; i++) {
			char key[256];

			snprintf(key, sizeof(key), "%.*s", (int)src->kv[i].key.len,
				 src->kv[i].key.ptr);
			if (src->kv[i].type == HYB_GGUF_VT_UINT32)
				hyb_gguf_set_u32(w, key, (uint32_t)src->kv[i].v.u64);
			else if (src->kv[i].type == HYB_GGUF_VT_STRING) {
				char v[256];

				snprintf(v, sizeof(v), "%.*s", (int)src->kv[i].v.str.len,
					 src->kv[i].v.str.ptr);
				hyb_gguf_set_str(w, key, v);
			} else if (src->kv[i].type == HYB_GGUF_VT_FLOAT32)
				hyb_gguf_set_f32(w, key, (float)src->kv[i].v.f64);
		}
		for (uint64_t i = 0; i < src->n_tensors; i++) {
			const struct hyb_gguf_tensor *t = &src->tensors[i];
			char name[96];

			snprintf(name, sizeof(name), "%.*s", (int)t->name.len, t->name.ptr);
			if (strstr(name, ".ffn_gate.") || strstr(name, ".ffn_up.") ||
			    strstr(name, ".ffn_down."))
				continue;
			CHECK(!hyb_gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data));
		}
		snprintf(noffn, sizeof(noffn), "%s/noffn.gguf", hyb_test_tmpdir());
		CHECK_MSG(!hyb_gguf_writer_write_file(w, noffn), "%s", hyb_last_error());
		hyb_gguf_writer_free(w);
		hyb_gguf_close(src);
		expect_fail(noffn, good, 1ull << 30, out, "ffn_gate.weight is missing");
	}

	/* a plan is not a source model */
	snprintf(plan, sizeof(plan), "%s/plan.gguf", hyb_test_tmpdir());
	quiet_opts(&o, 1ull << 30);
	CHECK_MSG(!hyb_plan_make(f32, good, &o, plan), "%s", hyb_last_error());
	expect_fail(plan, good, 1ull << 30, out, "already a plan file");

	prof_drop(good);
	prof_drop(wrong);
	prof_drop(few);
}

/* The command line: option errors are one line and exit status 2. */
TEST(plan_cli_options)
{
	char cmd[1024], line[512];
	const char *model;
	FILE *f;
	int st;

	model = synth_model("cli", "--hidden 64 --ffn 128 --layers 1 --act relu --type F32 "
			    "--vocab 300");
	struct {
		const char *args, *needle;
	} cases[] = {
		{ "--profile p.gguf -o x.gguf --gpu-budget 12X", "--gpu-budget '12X'" },
		{ "--profile p.gguf -o x.gguf --gpu-budget -5G", "--gpu-budget '-5G'" },
		{ "--profile p.gguf -o x.gguf", "--gpu-budget is required" },
		{ "-o x.gguf --gpu-budget 1G", "--profile is required" },
		{ "--profile p.gguf --gpu-budget 1.5G", "-o is required" },
		{ "--profile p.gguf -o x.gguf --gpu-budget 1G --grouping kmeans", "--grouping" },
		{ "--profile p.gguf -o x.gguf --gpu-budget 1G --recall 2", "--recall" },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		snprintf(cmd, sizeof(cmd), "%s plan %s %s 2>&1 >/dev/null", hybctl_bin(), model,
			 cases[i].args);
		f = popen(cmd, "r");
		CHECK(f);
		CHECK_MSG(fgets(line, sizeof(line), f), "%s: no message", cmd);
		st = pclose(f);
		CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 2, "%s: status %d", cmd, st);
		CHECK_MSG(strstr(line, cases[i].needle), "%s: '%s'", cmd, line);
	}
	/* well-formed sizes get past option parsing: to the profile */
	for (const char *const *b = (const char *const[]){ "6G", "1.5GiB", "512M", "123456",
							   "64k", NULL }; *b; b++) {
		snprintf(cmd, sizeof(cmd), "%s plan %s --profile %s/none.gguf -o %s/x.gguf "
			 "--gpu-budget %s 2>&1", hybctl_bin(), model, hyb_test_tmpdir(),
			 hyb_test_tmpdir(), *b);
		f = popen(cmd, "r");
		CHECK(f && fgets(line, sizeof(line), f));
		st = pclose(f);
		CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 1 && !strstr(line, "budget"),
			  "%s: %s", cmd, line);
	}
}

/* Degenerate layers: nothing active, everything active, one group, one neuron per group. */
TEST(plan_group_degenerate)
{
	const uint32_t n = 200;
	struct hyb_profile *p = prof_new(2, 16, n, 50);
	int32_t *perm = malloc(n * sizeof(*perm));
	uint32_t sizes[] = { 1, 7, 64, 199, 200 };
	char err[256];

	CHECK(perm);
	for (uint32_t s = 0; s < 50; s++)
		for (uint32_t i = 0; i < n; i++)
			prof_set(p, 1, s, i);
	for (uint32_t l = 0; l < 2; l++)
		for (size_t q = 0; q < sizeof(sizes) / sizeof(sizes[0]); q++) {
			struct hyb_plan_group_opts o = { .group_size = sizes[q], .seed = 1 };

			int rc = hyb_plan_group_layer(p, l, HYB_PLAN_GROUP_METIS, &o, perm, NULL, err,
						  sizeof(err));

			CHECK_MSG(!rc, "layer %u gs %u: %s", l, sizes[q], err);
			check_perm(perm, n);
		}
	free(perm);
	prof_drop(p);
}

/* The whole command: a saved profile, `hybctl plan`, its report, a plan that loads. */
TEST(plan_cli_end_to_end)
{
	const char *model = synth_model("e2e", "--hidden 256 --ffn 768 --layers 2 --act relu "
					"--type Q8_0 --vocab 512");
	struct hyb_profile *prof = model_profile(2, 256, 768, 200);
	char ppath[512], out[512], cmd[2048], line[512];
	bool saw_gs = false, saw_place = false, saw_pred = false;
	struct hyb_model *m;
	FILE *f;
	int st;

	snprintf(ppath, sizeof(ppath), "%s/prof.gguf", hyb_test_tmpdir());
	snprintf(out, sizeof(out), "%s/plan.gguf", hyb_test_tmpdir());
	if (hyb_profile_save(prof, ppath))
		SKIP("hyb_profile_save: %s", hyb_last_error());
	snprintf(cmd, sizeof(cmd), "%s plan %s --profile %s --gpu-budget 1.5M -o %s -t 2 "
		 "--train-gflop 0.2 --t-sync 2 2>&1", hybctl_bin(), model, ppath, out);
	f = popen(cmd, "r");
	CHECK(f);
	while (fgets(line, sizeof(line), f)) {
		saw_gs |= !strncmp(line, "group size", 10);
		saw_place |= !strncmp(line, "placement:", 10);
		saw_pred |= !strncmp(line, "predictors", 10);
	}
	st = pclose(f);
	CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: status %d", cmd, st);
	CHECK(saw_gs && saw_place && saw_pred);
	m = hyb_model_load_mode(out, HYB_LOAD_MMAP);
	CHECK_MSG(m, "%s", hyb_last_error());
	CHECK(m->group_size > 0 && m->layers[1].plan.hidden > 0);
	hyb_model_free(m);
	/* a profile of another shape: one line, status 1, nothing written */
	unlink(out);
	prof_drop(prof);
	prof = model_profile(2, 256, 512, 200);
	CHECK(!hyb_profile_save(prof, ppath));
	f = popen(cmd, "r");
	CHECK(f && fgets(line, sizeof(line), f));
	CHECK_MSG(strstr(line, "profile does not match"), "%s", line);
	CHECK(!fgets(line, sizeof(line), f));
	st = pclose(f);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1);
	check_no_leftovers(out);
	prof_drop(prof);
}

/* The grouping does not depend on the thread count. */
TEST(plan_group_deterministic)
{
	const uint32_t n = 700;
	struct hyb_profile *p = prof_new(1, 16, n, 400);
	struct hyb_threadpool *pool = hyb_threadpool_new(3);
	int32_t *a = malloc(n * sizeof(*a)), *b = malloc(n * sizeof(*b));
	struct hyb_plan_group_opts o = { .group_size = 24, .seed = 9 };
	char err[256];

	CHECK(pool && a && b);
	plant_clusters(p, 0, 12, 5, 11);
	CHECK_MSG(!hyb_plan_group_layer(p, 0, HYB_PLAN_GROUP_METIS, &o, a, NULL, err, sizeof(err)), "%s",
		  err);
	o.pool = pool;
	CHECK_MSG(!hyb_plan_group_layer(p, 0, HYB_PLAN_GROUP_METIS, &o, b, NULL, err, sizeof(err)), "%s",
		  err);
	CHECK(!memcmp(a, b, n * sizeof(*a)));
	hyb_threadpool_free(pool);
	free(a);
	free(b);
	prof_drop(p);
}
