// SPDX-License-Identifier: MIT
/*
 * The online neuron balancer (hyb/balancer.h): every policy on seeded
 * drifting activation streams (invariants, static never reloads, layer keeps
 * whole layers), TAM's one-hit-wonder filter, tam-adaptive's lambda under
 * IO/CPU-bound feedback, the window cap, LRU/top-K/dynamic semantics, the
 * KAIROX Fig. 10 ordering (TAM hit rate above static, reloads below lru and
 * topk), and the load-aware thresholds of hyb_balancer_select.
 *
 * Build with -DBAL_REPORT to print the drift workload's per-policy numbers.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyb/balancer.h"
#include "sparse/group_div.h"
#include "test.h"

/* ---- helpers ---------------------------------------------------------------------- */

static uint64_t rng_next(uint64_t *s)
{
	uint64_t x = *s;

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*s = x;
	return x * 0x2545F4914F6CDD1Dull;
}

static double rng_unit(uint64_t *s)
{
	return (double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0);
}

/*
 * Drifting topics: per layer, n_hot hot groups (always on at p_hot per
 * neuron), n_topics clusters of topic_groups groups of which the current
 * topic's are on at p_topic (the topic switches every `period` steps to
 * another one at random), background neurons at p_bg, and n_spikes one-step
 * bursts at p_spike on random groups outside the hot set and the topic (the
 * one-hit wonders).
 */
#define DR_MAX_L 4

struct drift {
	uint32_t L, F, GS, G;
	uint32_t n_hot, n_topics, topic_groups, period, n_spikes;
	double p_hot[DR_MAX_L], p_topic[DR_MAX_L], p_bg, p_spike;
	uint64_t rng;
	uint32_t topic, step;
};

static void drift_init(struct drift *d, uint64_t seed)
{
	memset(d, 0, sizeof(*d));
	d->L = 2;
	d->F = 1024;
	d->GS = 16;
	d->G = 64;
	d->n_hot = 8;
	d->n_topics = 4;
	d->topic_groups = 8;
	d->period = 50;
	d->n_spikes = 3;
	d->p_hot[0] = 0.5;
	d->p_hot[1] = 0.6;
	d->p_topic[0] = 0.85;
	d->p_topic[1] = 0.85;
	d->p_bg = 0.01;
	d->p_spike = 0.8;
	d->rng = seed;
}

static bool dr_is_topic(const struct drift *d, uint32_t g, uint32_t t)
{
	return g >= d->n_hot + t * d->topic_groups && g < d->n_hot + (t + 1) * d->topic_groups;
}

/* Layer l's active neurons at the current step (increasing). */
static uint32_t drift_gen(struct drift *d, uint32_t l, uint32_t *active)
{
	uint8_t spike[1024] = { 0 };
	uint32_t n = 0;

	for (uint32_t s = 0; s < d->n_spikes; s++) {
		uint32_t g;

		do
			g = (uint32_t)(rng_next(&d->rng) % d->G);
		while (g < d->n_hot || dr_is_topic(d, g, d->topic));
		spike[g] = 1;
	}
	for (uint32_t i = 0; i < d->F; i++) {
		const uint32_t g = i / d->GS;
		double p = d->p_bg;

		if (g < d->n_hot)
			p = d->p_hot[l];
		else if (dr_is_topic(d, g, d->topic))
			p = d->p_topic[l];
		else if (spike[g])
			p = d->p_spike;
		if (rng_unit(&d->rng) < p)
			active[n++] = i;
	}
	return n;
}

static void drift_advance(struct drift *d)
{
	if (++d->step % d->period == 0)
		d->topic = (d->topic + 1 + (uint32_t)(rng_next(&d->rng) % (d->n_topics - 1))) %
			   d->n_topics;
}

/* Profiled frequencies: the same generator, another seed, 2000 steps. */
static void drift_profile(const struct drift *proto, float freq[][64])
{
	struct drift d = *proto;
	uint32_t act[1024];
	double cnt[DR_MAX_L][64] = { { 0 } };
	const uint32_t steps = 2000;

	d.rng = 0x9e3779b97f4a7c15ull;
	d.step = 0;
	d.topic = 0;
	for (uint32_t t = 0; t < steps; t++) {
		for (uint32_t l = 0; l < d.L; l++) {
			const uint32_t n = drift_gen(&d, l, act);

			for (uint32_t i = 0; i < n; i++)
				cnt[l][act[i] / d.GS] += 1;
		}
		drift_advance(&d);
	}
	for (uint32_t l = 0; l < d.L; l++)
		for (uint32_t g = 0; g < d.G; g++)
			freq[l][g] = (float)(cnt[l][g] / ((double)steps * d.GS));
}

struct run_stats {
	uint64_t active, hits, loads, evicts, steps;
	double lambda_min, lambda_max;
};

enum fb_mode { FB_NONE, FB_WINDOW, FB_SIM, FB_CPU, FB_IO };

/*
 * Runs `steps` steps of the stream through b, checking after every step the
 * invariants of hyb/balancer.h against a mirror of the resident sets. Hits:
 * active neurons whose group is resident after the decision that prepared
 * their step. FB_WINDOW: feedback with a 4-load window (group_load_s 1e-4);
 * FB_SIM: a toy engine whose link is twice slower than the balancer thinks
 * (backlog grows past 2 loads a step) and whose CPU takes 4x the device's
 * time per neuron. FB_CPU, FB_IO: the window, and a CPU-bound (IO-bound)
 * verdict at every step.
 */
static void run_stream(struct hyb_balancer *b, struct drift *d, uint32_t steps, enum fb_mode fm,
		       uint64_t budget, struct run_stats *st)
{
	const uint32_t G = hyb_balancer_n_groups(b);
	uint8_t mirror[DR_MAX_L][1024];
	uint32_t act[1024], load[1024], evict[1024], nl, ne, k[DR_MAX_L];
	double backlog[DR_MAX_L] = { 0 }, cpu[DR_MAX_L] = { 0 }, dev[DR_MAX_L] = { 0 };
	uint64_t ksum = 0;

	memset(st, 0, sizeof(*st));
	st->lambda_min = 1;
	CHECK_EQ_INT(G, d->G);
	for (uint32_t l = 0; l < d->L; l++) {
		uint32_t init[1024], n = hyb_balancer_initial(b, l, init);

		k[l] = hyb_balancer_slots(b, l);
		ksum += k[l];
		CHECK(n <= k[l]);
		memset(mirror[l], 0, sizeof(mirror[l]));
		for (uint32_t i = 0; i < n; i++) {
			CHECK(init[i] < G && !mirror[l][init[i]]);
			mirror[l][init[i]] = 1;
		}
		for (uint32_t g = 0; g < G; g++)
			CHECK_EQ_INT(hyb_balancer_resident(b, l, g), mirror[l][g]);
	}
	CHECK(ksum <= budget);
	for (uint32_t t = 0; t < steps; t++) {
		for (uint32_t l = 0; l < d->L; l++) {
			const uint32_t n = drift_gen(d, l, act);
			struct hyb_balancer_feedback fb = { 0 };
			uint32_t nres = 0, hit = 0;

			if (fm != FB_NONE)
				fb.window_s = 4e-4;
			if (fm == FB_CPU)
				fb.cpu_s = 2, fb.dev_s = 1;
			if (fm == FB_IO)
				fb.backlog_s = 1;
			if (fm == FB_SIM) {
				fb.backlog_s = backlog[l];
				fb.cpu_s = cpu[l];
				fb.dev_s = dev[l];
				fb.n_active = n;
			}
			CHECK_EQ_INT(hyb_balancer_step(b, l, act, n, &fb, load, &nl, evict, &ne),
				     0);
			CHECK(nl <= k[l] && ne <= k[l]);
			for (uint32_t i = 0; i < ne; i++) {
				CHECK(evict[i] < G);
				CHECK_MSG(mirror[l][evict[i]], "evicts group %u not resident",
					  evict[i]);
				mirror[l][evict[i]] = 0;
			}
			for (uint32_t i = 0; i < nl; i++) {
				CHECK(load[i] < G);
				CHECK_MSG(!mirror[l][load[i]], "loads group %u resident or evicted "
					  "in the same step", load[i]);
				for (uint32_t j = 0; j < ne; j++)
					CHECK(load[i] != evict[j]);
				mirror[l][load[i]] = 1;
			}
			for (uint32_t g = 0; g < G; g++) {
				CHECK_EQ_INT(hyb_balancer_resident(b, l, g), mirror[l][g]);
				nres += mirror[l][g];
			}
			CHECK(nres <= k[l]);
			for (uint32_t i = 0; i < n; i++)
				hit += mirror[l][act[i] / d->GS];
			st->active += n;
			st->hits += hit;
			st->loads += nl;
			st->evicts += ne;
			if (fm == FB_SIM) {
				/* link at half the assumed speed, 4 assumed loads per window */
				backlog[l] = fmax(0, backlog[l] + nl * 2e-4 - 4e-4);
				cpu[l] = (n - hit) * 4e-6;
				dev[l] = hit * 1e-6;
			}
			{
				const double lam = hyb_balancer_lambda(b, l);

				st->lambda_min = fmin(st->lambda_min, lam);
				st->lambda_max = fmax(st->lambda_max, lam);
			}
		}
		drift_advance(d);
		st->steps++;
	}
}

static struct hyb_balancer *drift_balancer(const struct drift *d, float freq[][64],
					   enum hyb_policy p, uint64_t budget, double load_s,
					   struct hyb_balancer_params *extra)
{
	const float *fp[DR_MAX_L];
	struct hyb_balancer_params bp = { 0 };
	struct hyb_balancer *b;

	if (extra)
		bp = *extra;
	for (uint32_t l = 0; l < d->L; l++)
		fp[l] = freq[l];
	bp.policy = p;
	bp.n_layer = d->L;
	bp.n_ff = d->F;
	bp.group_size = d->GS;
	bp.slot_budget = budget;
	bp.freq = fp;
	bp.group_load_s = load_s;
	b = hyb_balancer_new(&bp);
	CHECK_MSG(b, "hyb_balancer_new(%s): %s", hyb_policy_name(p), hyb_last_error());
	return b;
}

/* ---- names and bad input ------------------------------------------------------------ */

TEST(bal_policy_names)
{
	for (int p = 0; p < HYB_N_POLICIES; p++) {
		enum hyb_policy q;

		CHECK_EQ_INT(hyb_policy_parse(hyb_policy_name((enum hyb_policy)p), &q), 0);
		CHECK_EQ_INT(q, p);
	}
	{
		enum hyb_policy q = HYB_POLICY_LRU;

		CHECK_EQ_INT(hyb_policy_parse("tam_adaptive", &q), -EINVAL);
		CHECK_MSG(strstr(hyb_last_error(), "'tam_adaptive'") &&
			  strstr(hyb_last_error(), "tam-adaptive"), "%s", hyb_last_error());
		CHECK_EQ_INT(hyb_policy_parse("", &q), -EINVAL);
		CHECK_EQ_INT(hyb_policy_parse(NULL, &q), -EINVAL);
		CHECK_EQ_INT(q, HYB_POLICY_LRU);
	}
	CHECK(!strcmp(hyb_policy_name(HYB_POLICY_TAM_ADAPTIVE), "tam-adaptive"));
}

static void expect_reject(const struct hyb_balancer_params *bp, const char *what)
{
	struct hyb_balancer *b = hyb_balancer_new(bp);

	CHECK_MSG(!b, "accepted %s", what);
	CHECK_MSG(hyb_last_error()[0] && strstr(hyb_last_error(), "balancer") &&
		  !strchr(hyb_last_error(), '\n'), "%s: bad message '%s'", what, hyb_last_error());
}

TEST(bal_new_rejects_bad_params)
{
	float f0[8] = { 0.5f, 0.4f, 0.3f, 0.2f, 0.1f, 0, 0, 0 }, f1[8] = { 0 };
	const float *fp[2] = { f0, f1 }, *fnull[2] = { f0, NULL };
	const int8_t pl0[8] = { 1 }, *pl[2] = { pl0, NULL };
	struct hyb_balancer_params ok = {
		.policy = HYB_POLICY_TAM, .n_layer = 2, .n_ff = 64, .group_size = 8,
		.slot_budget = 4, .freq = fp,
	}, bp;
	struct hyb_balancer *b = hyb_balancer_new(&ok);

	CHECK_MSG(b, "%s", hyb_last_error());
	hyb_balancer_free(b);
	expect_reject(NULL, "NULL params");
	bp = ok, bp.n_layer = 0, expect_reject(&bp, "n_layer 0");
	bp = ok, bp.n_ff = 0, expect_reject(&bp, "n_ff 0");
	bp = ok, bp.group_size = 0, expect_reject(&bp, "group_size 0");
	bp = ok, bp.freq = NULL, expect_reject(&bp, "NULL freq");
	bp = ok, bp.freq = fnull, expect_reject(&bp, "NULL freq[1]");
	bp = ok, bp.placement = pl, expect_reject(&bp, "NULL placement[1]");
	bp = ok, bp.policy = HYB_N_POLICIES, expect_reject(&bp, "bad policy");
	bp = ok, bp.lambda0 = 1, expect_reject(&bp, "lambda0 1");
	bp = ok, bp.lambda0 = -0.5, expect_reject(&bp, "lambda0 < 0");
	bp = ok, bp.lambda_min = 0.6, bp.lambda_max = 0.4, expect_reject(&bp, "min > max");
	bp = ok, bp.lambda_max = 1.2, expect_reject(&bp, "lambda_max > 1");
	bp = ok, bp.alpha = 1.5, expect_reject(&bp, "alpha 1.5");
	bp = ok, bp.eps = -0.1, expect_reject(&bp, "eps < 0");
	bp = ok, bp.dyn_lambda = NAN, expect_reject(&bp, "dyn_lambda NaN");
	bp = ok, bp.phi_high = -1, expect_reject(&bp, "phi_high < 0");
	bp = ok, bp.group_load_s = -1, expect_reject(&bp, "group_load_s < 0");
	bp = ok, bp.a_ref = 1.5, expect_reject(&bp, "a_ref > 1");
	bp = ok, bp.policy = HYB_POLICY_TAM_ADAPTIVE, bp.lambda0 = 0.95,
	expect_reject(&bp, "lambda0 above lambda_max");
	f1[3] = NAN;
	bp = ok, expect_reject(&bp, "NaN frequency");
	f1[3] = 1.5f;
	bp = ok, expect_reject(&bp, "frequency 1.5");
}

TEST(bal_step_rejects_bad_input)
{
	float f[8] = { 0.5f, 0.4f, 0.3f, 0.2f, 0.1f, 0, 0, 0 };
	const float *fp[1] = { f };
	struct hyb_balancer_params bp = {
		.n_layer = 1, .n_ff = 60, .group_size = 8, .slot_budget = 3, .freq = fp,
	};
	uint32_t load[8], evict[8], nl = 7, ne = 7;
	const uint32_t unsorted[3] = { 5, 3, 40 }, dup[3] = { 3, 3, 40 }, big[2] = { 3, 60 };
	const uint32_t good[4] = { 40, 41, 42, 59 };

	for (int p = 0; p < HYB_N_POLICIES; p++) {
		struct hyb_balancer *b;
		bool before[8];

		bp.policy = (enum hyb_policy)p;
		b = hyb_balancer_new(&bp);
		CHECK_MSG(b, "%s", hyb_last_error());
		CHECK_EQ_INT(hyb_balancer_n_groups(b), 8);
		for (uint32_t g = 0; g < 8; g++)
			before[g] = hyb_balancer_resident(b, 0, g);
		CHECK_EQ_INT(hyb_balancer_step(b, 0, unsorted, 3, NULL, load, &nl, evict, &ne),
			     -EINVAL);
		CHECK_MSG(strstr(hyb_last_error(), "not increasing"), "%s", hyb_last_error());
		CHECK(nl == 0 && ne == 0);
		CHECK_EQ_INT(hyb_balancer_step(b, 0, dup, 3, NULL, load, &nl, evict, &ne), -EINVAL);
		CHECK_MSG(strstr(hyb_last_error(), "not increasing"), "%s", hyb_last_error());
		CHECK_EQ_INT(hyb_balancer_step(b, 0, big, 2, NULL, load, &nl, evict, &ne), -EINVAL);
		CHECK_EQ_INT(hyb_balancer_step(b, 1, good, 4, NULL, load, &nl, evict, &ne), -EINVAL);
		CHECK_EQ_INT(hyb_balancer_step(b, 0, NULL, 4, NULL, load, &nl, evict, &ne), -EINVAL);
		CHECK_EQ_INT(hyb_balancer_step(b, 0, good, 4, NULL, NULL, &nl, evict, &ne), -EINVAL);
		for (uint32_t g = 0; g < 8; g++)
			CHECK_EQ_INT(hyb_balancer_resident(b, 0, g), before[g]);
		/* the short last group (neurons 56..59) is a valid target */
		CHECK_EQ_INT(hyb_balancer_step(b, 0, good, 4, NULL, load, &nl, evict, &ne), 0);
		CHECK_EQ_INT(hyb_balancer_step(b, 0, NULL, 0, NULL, load, &nl, evict, &ne), 0);
		CHECK(!hyb_balancer_resident(b, 1, 0) && !hyb_balancer_resident(b, 0, 8));
		CHECK_EQ_INT(hyb_balancer_slots(b, 1), 0);
		hyb_balancer_free(b);
	}
}

/* ---- budgets and start sets ---------------------------------------------------------- */

/* expected active neurons of group g (n_ff 157, GS 10: the last group has 7) */
static double val(const float *f, uint32_t g)
{
	return (double)f[g] * (g == 15 ? 7 : 10);
}

TEST(bal_slots_follow_freq)
{
	/* layer 1's groups are hotter: it gets more of the budget */
	float f0[16], f1[16];
	const float *fp[2] = { f0, f1 };
	struct hyb_balancer_params bp = {
		.n_layer = 2, .n_ff = 16 * 10 - 3, .group_size = 10, .slot_budget = 12, .freq = fp,
	};

	for (uint32_t g = 0; g < 16; g++) {
		f0[g] = 0.05f + 0.03f * (float)((g * 7) % 16);     /* <= 0.5 */
		f1[g] = 0.1f + 0.05f * (float)((g * 5) % 16);      /* up to 0.85 */
	}
	for (int p = 0; p < HYB_N_POLICIES; p++) {
		struct hyb_balancer *b;
		uint32_t init[16], n;
		double lo = 1e9;

		if (p == HYB_POLICY_LAYER)
			continue;
		bp.policy = (enum hyb_policy)p;
		b = hyb_balancer_new(&bp);
		CHECK_MSG(b, "%s", hyb_last_error());
		CHECK(hyb_balancer_slots(b, 0) + hyb_balancer_slots(b, 1) == 12);
		CHECK(hyb_balancer_slots(b, 1) > hyb_balancer_slots(b, 0));
		CHECK(hyb_balancer_slots(b, 0) > 0);
		/* the start sets are the global top 12 by expected active neurons */
		for (uint32_t l = 0; l < 2; l++) {
			n = hyb_balancer_initial(b, l, init);
			CHECK_EQ_INT(n, hyb_balancer_slots(b, l));
			for (uint32_t i = 0; i < n; i++)
				lo = fmin(lo, val(fp[l], init[i]));
		}
		for (uint32_t l = 0; l < 2; l++)
			for (uint32_t g = 0; g < 16; g++)
				if (!hyb_balancer_resident(b, l, g))
					CHECK(val(fp[l], g) <= lo);
		hyb_balancer_free(b);
	}
	/* a budget above the model: everything cached, nothing to spare */
	bp.policy = HYB_POLICY_TAM;
	bp.slot_budget = 1000;
	{
		struct hyb_balancer *b = hyb_balancer_new(&bp);

		CHECK_MSG(b, "%s", hyb_last_error());
		CHECK_EQ_INT(hyb_balancer_slots(b, 0), 16);
		CHECK_EQ_INT(hyb_balancer_slots(b, 1), 16);
		hyb_balancer_free(b);
	}
	/* budget 0: no slots, steps still valid and load nothing */
	bp.slot_budget = 0;
	{
		struct hyb_balancer *b = hyb_balancer_new(&bp);
		uint32_t a[3] = { 1, 2, 3 }, ld[16], ev[16], nl, ne;

		CHECK_MSG(b, "%s", hyb_last_error());
		CHECK_EQ_INT(hyb_balancer_slots(b, 0) + hyb_balancer_slots(b, 1), 0);
		CHECK_EQ_INT(hyb_balancer_step(b, 0, a, 3, NULL, ld, &nl, ev, &ne), 0);
		CHECK_EQ_INT(hyb_balancer_step(b, 0, a, 3, NULL, ld, &nl, ev, &ne), 0);
		CHECK(nl == 0 && ne == 0);
		hyb_balancer_free(b);
	}
}

TEST(bal_short_group_value)
{
	/* the short last group (2 neurons) has the highest mean freq but serves
	 * fewer neurons than a full group of slightly lower freq */
	float f[3] = { 0.5f, 0.1f, 0.6f };
	const float *fp[1] = { f };
	struct hyb_balancer_params bp = {
		.policy = HYB_POLICY_STATIC, .n_layer = 1, .n_ff = 18, .group_size = 8,
		.slot_budget = 1, .freq = fp,
	};
	struct hyb_balancer *b = hyb_balancer_new(&bp);

	CHECK_MSG(b, "%s", hyb_last_error());
	CHECK(hyb_balancer_resident(b, 0, 0) && !hyb_balancer_resident(b, 0, 2));
	hyb_balancer_free(b);
}

TEST(bal_placement_first)
{
	float f[8] = { 0.9f, 0.8f, 0.7f, 0.6f, 0.5f, 0.4f, 0.3f, 0.2f };
	const int8_t pl[8] = { 0, 0, 0, 0, 0, 1, 1, 0 };
	const float *fp[1] = { f };
	const int8_t *pp[1] = { pl };
	struct hyb_balancer_params bp = {
		.policy = HYB_POLICY_STATIC, .n_layer = 1, .n_ff = 64, .group_size = 8,
		.slot_budget = 3, .freq = fp, .placement = pp,
	};
	struct hyb_balancer *b = hyb_balancer_new(&bp);
	uint32_t init[8], n;

	CHECK_MSG(b, "%s", hyb_last_error());
	n = hyb_balancer_initial(b, 0, init);
	CHECK_EQ_INT(n, 3);
	/* the plan's two groups, then the hottest other one */
	CHECK(hyb_balancer_resident(b, 0, 5) && hyb_balancer_resident(b, 0, 6));
	CHECK(hyb_balancer_resident(b, 0, 0));
	hyb_balancer_free(b);
	/* budget below the plan's count: the plan's hottest */
	bp.slot_budget = 1;
	b = hyb_balancer_new(&bp);
	CHECK_MSG(b, "%s", hyb_last_error());
	CHECK(hyb_balancer_resident(b, 0, 5) && !hyb_balancer_resident(b, 0, 0));
	hyb_balancer_free(b);
}

TEST(bal_layer_policy_whole_layers)
{
	struct drift d;
	float freq[DR_MAX_L][64];
	struct hyb_balancer *b;
	struct run_stats st;

	drift_init(&d, 11);
	d.L = 3;
	d.p_hot[2] = 0.5;
	d.p_topic[2] = 0.85;
	drift_profile(&d, freq);
	/* 64 groups a layer: 150 slots hold two layers, 22 stay unused */
	b = drift_balancer(&d, freq, HYB_POLICY_LAYER, 150, 1e-4, NULL);
	CHECK_EQ_INT(hyb_balancer_slots(b, 0), 64);
	CHECK_EQ_INT(hyb_balancer_slots(b, 1), 64);
	CHECK_EQ_INT(hyb_balancer_slots(b, 2), 0);
	run_stream(b, &d, 120, FB_WINDOW, 150, &st);
	CHECK_EQ_INT(st.loads + st.evicts, 0);
	for (uint32_t g = 0; g < 64; g++)
		CHECK(hyb_balancer_resident(b, 0, g) && hyb_balancer_resident(b, 1, g) &&
		      !hyb_balancer_resident(b, 2, g));
	hyb_balancer_free(b);
	/* less than one layer: nothing */
	drift_init(&d, 11);
	b = drift_balancer(&d, freq, HYB_POLICY_LAYER, 63, 1e-4, NULL);
	CHECK_EQ_INT(hyb_balancer_slots(b, 0) + hyb_balancer_slots(b, 1), 0);
	hyb_balancer_free(b);
}

/* ---- every policy on drifting streams -------------------------------------------------- */

TEST(bal_invariants_all_policies)
{
	static const uint64_t budgets[] = { 0, 5, 32, 100, 128, 200 };
	float freq[DR_MAX_L][64]; /* the profile does not depend on the stream's seed */

	for (int p = 0; p < HYB_N_POLICIES; p++)
		for (size_t q = 0; q < sizeof(budgets) / sizeof(budgets[0]); q++)
			for (int fm = FB_NONE; fm <= FB_SIM; fm++) {
				struct drift d;
				struct run_stats st;
				struct hyb_balancer *b;

				drift_init(&d, 1000 + 7 * q + (uint64_t)fm);
				if (p == 0 && q == 0 && fm == FB_NONE)
					drift_profile(&d, freq);
				b = drift_balancer(&d, freq, (enum hyb_policy)p, budgets[q],
						   fm == FB_NONE ? 0 : 1e-4, NULL);
				run_stream(b, &d, 520, (enum fb_mode)fm, budgets[q], &st);
				if (p == HYB_POLICY_STATIC || p == HYB_POLICY_LAYER)
					CHECK_EQ_INT(st.loads + st.evicts, 0);
				if (fm != FB_NONE)
					CHECK(st.loads <= 4 * d.L * st.steps);
				hyb_balancer_free(b);
			}
}

/* The KAIROX Fig. 10 claim on the seeded drift workload. */
TEST(bal_drift_tam_beats_static_and_reloads_less)
{
	struct run_stats st[HYB_N_POLICIES];
	const uint64_t budget = 32; /* 16 a layer: the hot set plus one topic */

	for (int p = 0; p < HYB_N_POLICIES; p++) {
		struct drift d;
		float freq[DR_MAX_L][64];
		struct hyb_balancer *b;

		drift_init(&d, 42);
		drift_profile(&d, freq);
		b = drift_balancer(&d, freq, (enum hyb_policy)p, budget, 1e-4, NULL);
		run_stream(b, &d, 600, p == HYB_POLICY_TAM_ADAPTIVE ? FB_SIM : FB_WINDOW, budget,
			   &st[p]);
		hyb_balancer_free(b);
#ifdef BAL_REPORT
		printf("%-13s hit %.3f  loads/step %.3f (per layer %.3f)  lambda [%.3f, %.3f]\n",
		       hyb_policy_name((enum hyb_policy)p),
		       (double)st[p].hits / (double)st[p].active,
		       (double)st[p].loads / st[p].steps,
		       (double)st[p].loads / st[p].steps / d.L, st[p].lambda_min,
		       st[p].lambda_max);
#endif
	}
	{
		const double hs = (double)st[HYB_POLICY_STATIC].hits / st[HYB_POLICY_STATIC].active;
		const double ht = (double)st[HYB_POLICY_TAM].hits / st[HYB_POLICY_TAM].active;
		const uint64_t lt = st[HYB_POLICY_TAM].loads;

		CHECK_MSG(ht > hs + 0.10, "TAM hit rate %.3f vs static %.3f", ht, hs);
		CHECK_MSG(2 * lt < st[HYB_POLICY_LRU].loads && 2 * lt < st[HYB_POLICY_TOPK].loads,
			  "TAM loads %llu, lru %llu, topk %llu", (unsigned long long)lt,
			  (unsigned long long)st[HYB_POLICY_LRU].loads,
			  (unsigned long long)st[HYB_POLICY_TOPK].loads);
		CHECK(lt > 0);
	}
}

/* ---- TAM ----------------------------------------------------------------------------- */

static struct hyb_balancer *small_balancer(enum hyb_policy p, const float *f, uint64_t budget,
					   double lambda0)
{
	static const float *fp[1];
	struct hyb_balancer_params bp = {
		.policy = p, .n_layer = 1, .n_ff = 64, .group_size = 8, .slot_budget = budget,
		.lambda0 = lambda0,
	};

	fp[0] = f;
	bp.freq = fp;
	return hyb_balancer_new(&bp);
}

/* all neurons of groups in the mask active */
static uint32_t groups_active(uint32_t mask, uint32_t *act)
{
	uint32_t n = 0;

	for (uint32_t g = 0; g < 8; g++)
		if (mask >> g & 1)
			for (uint32_t i = 0; i < 8; i++)
				act[n++] = g * 8 + i;
	return n;
}

TEST(bal_tam_filters_one_hit_wonders)
{
	const float f[8] = { 0.3f, 0.3f, 0.3f, 0.3f, 0, 0, 0, 0 };
	uint32_t act[64], load[8], evict[8], nl, ne, n;
	char err[256];
	struct hyb_balancer *b = small_balancer(HYB_POLICY_TAM, f, 4, 0.5);

	CHECK_MSG(b, "%s", err);
	CHECK_NEAR(hyb_balancer_lambda(b, 0), 0.5, 0);
	/* group 5 fully active once, no history: S = 0.5 < 0.5 + eps */
	n = groups_active(1u << 5, act);
	CHECK_EQ_INT(hyb_balancer_step(b, 0, act, n, NULL, load, &nl, evict, &ne), 0);
	CHECK_EQ_INT(nl, 0);
	CHECK_EQ_INT(hyb_balancer_step(b, 0, NULL, 0, NULL, load, &nl, evict, &ne), 0);
	CHECK_EQ_INT(nl, 0);
	/* the warm-start groups fell under the threshold but are kept (no load needs them) */
	for (uint32_t g = 0; g < 4; g++)
		CHECK(hyb_balancer_resident(b, 0, g));
	/* group 6 active on two consecutive steps: 0.5, then 0.75 > 0.55 */
	n = groups_active(1u << 6, act);
	CHECK_EQ_INT(hyb_balancer_step(b, 0, act, n, NULL, load, &nl, evict, &ne), 0);
	CHECK_EQ_INT(nl, 0);
	CHECK_EQ_INT(hyb_balancer_step(b, 0, act, n, NULL, load, &nl, evict, &ne), 0);
	CHECK_EQ_INT(nl, 1);
	CHECK_EQ_INT(load[0], 6);
	CHECK_EQ_INT(ne, 1);
	CHECK(evict[0] < 4);
	CHECK(hyb_balancer_resident(b, 0, 6) && !hyb_balancer_resident(b, 0, 5));
	hyb_balancer_free(b);

	/* a group with history (freq 0.3) passes on one hit: 0.15 + 0.5 > 0.55 */
	{
		const float f2[8] = { 0.4f, 0.4f, 0.4f, 0.4f, 0.3f, 0, 0, 0 };

		b = small_balancer(HYB_POLICY_TAM, f2, 4, 0.5);
		CHECK_MSG(b, "%s", err);
		n = groups_active(1u << 4, act);
		CHECK_EQ_INT(hyb_balancer_step(b, 0, act, n, NULL, load, &nl, evict, &ne), 0);
		CHECK_EQ_INT(nl, 1);
		CHECK_EQ_INT(load[0], 4);
		hyb_balancer_free(b);
	}
	/* lru and topk load the one-hit wonder at once */
	for (int p = HYB_POLICY_LRU; p <= HYB_POLICY_TOPK; p++) {
		b = small_balancer((enum hyb_policy)p, f, 4, 0);
		CHECK_MSG(b, "%s", err);
		n = groups_active(1u << 5, act);
		CHECK_EQ_INT(hyb_balancer_step(b, 0, act, n, NULL, load, &nl, evict, &ne), 0);
		CHECK_EQ_INT(nl, 1);
		CHECK_EQ_INT(load[0], 5);
		hyb_balancer_free(b);
	}
}

TEST(bal_tam_topk_by_score)
{
	/* 3 slots, 5 groups become candidates: the 3 highest S stay */
	const float f[8] = { 0 };
	uint32_t act[64], load[8], evict[8], nl, ne, n;
	char err[256];
	struct hyb_balancer *b = small_balancer(HYB_POLICY_TAM, f, 3, 0.5);

	CHECK_MSG(b, "%s", err);
	/* groups 3..7 fully active for 3 steps, then 5..7 once more (their S highest) */
	n = groups_active(0xf8, act);
	for (int t = 0; t < 3; t++)
		CHECK_EQ_INT(hyb_balancer_step(b, 0, act, n, NULL, load, &nl, evict, &ne), 0);
	n = groups_active(0xe0, act);
	CHECK_EQ_INT(hyb_balancer_step(b, 0, act, n, NULL, load, &nl, evict, &ne), 0);
	for (uint32_t g = 0; g < 8; g++)
		CHECK_EQ_INT(hyb_balancer_resident(b, 0, g), g >= 5);
	hyb_balancer_free(b);
}

TEST(bal_tam_adaptive_lambda)
{
	const float f[8] = { 0.3f, 0.3f, 0.3f, 0.3f, 0, 0, 0, 0 };
	uint32_t act[64], load[8], evict[8], nl, ne, n;
	const struct hyb_balancer_feedback io = { .backlog_s = 2e-3, .window_s = 1e-3 };
	const struct hyb_balancer_feedback late = { .late = 6, .n_active = 100, .window_s = 1 };
	const struct hyb_balancer_feedback cpu = { .cpu_s = 3e-3, .dev_s = 1e-3 };
	const struct hyb_balancer_feedback stall = { .cpu_s = 3e-3, .dev_s = 1e-3,
						     .stall_s = 1e-3 };
	const struct hyb_balancer_feedback fine = { .late = 5, .n_active = 100, .window_s = 1,
						    .backlog_s = 0.5, .cpu_s = 1, .dev_s = 2 };
	char err[256];
	struct hyb_balancer *b = small_balancer(HYB_POLICY_TAM_ADAPTIVE, f, 4, 0);
	double prev = 0.5;

	CHECK_MSG(b, "%s", err);
	CHECK_NEAR(hyb_balancer_lambda(b, 0), 0.5, 0);
	CHECK_EQ_INT(hyb_balancer_bottleneck(b, 0), HYB_BOUND_NONE);
	n = groups_active(0x30, act);
	/* IO-bound: lambda *= 1.08 up to 0.9 (0.5 * 1.08^7 = 0.857, KAIROX Fig. 11) */
	for (int t = 0; t < 20; t++) {
		const double lam = hyb_balancer_lambda(b, 0);

		CHECK_EQ_INT(hyb_balancer_step(b, 0, act, n, &io, load, &nl, evict, &ne), 0);
		CHECK_EQ_INT(hyb_balancer_bottleneck(b, 0), HYB_BOUND_IO);
		CHECK_NEAR(hyb_balancer_lambda(b, 0), fmin(lam * 1.08, 0.9), 1e-12);
		CHECK(hyb_balancer_lambda(b, 0) >= prev && hyb_balancer_lambda(b, 0) <= 0.9);
		prev = hyb_balancer_lambda(b, 0);
		if (t == 6)
			CHECK_NEAR(prev, 0.5 * pow(1.08, 7), 1e-9);
	}
	CHECK_NEAR(prev, 0.9, 0);
	/* late loads are IO-bound too */
	CHECK_EQ_INT(hyb_balancer_step(b, 0, act, n, &late, load, &nl, evict, &ne), 0);
	CHECK_EQ_INT(hyb_balancer_bottleneck(b, 0), HYB_BOUND_IO);
	CHECK_NEAR(hyb_balancer_lambda(b, 0), 0.9, 0);
	/* CPU-bound: lambda *= 0.92 down to 0.2 */
	for (int t = 0; t < 40; t++) {
		const double lam = hyb_balancer_lambda(b, 0);

		CHECK_EQ_INT(hyb_balancer_step(b, 0, act, n, &cpu, load, &nl, evict, &ne), 0);
		CHECK_EQ_INT(hyb_balancer_bottleneck(b, 0), HYB_BOUND_CPU);
		CHECK_NEAR(hyb_balancer_lambda(b, 0), fmax(lam * 0.92, 0.2), 1e-12);
		CHECK(hyb_balancer_lambda(b, 0) <= prev && hyb_balancer_lambda(b, 0) >= 0.2);
		prev = hyb_balancer_lambda(b, 0);
	}
	CHECK_NEAR(prev, 0.2, 0);
	/* neither: a device stall, a quiet step, no feedback */
	CHECK_EQ_INT(hyb_balancer_step(b, 0, act, n, &stall, load, &nl, evict, &ne), 0);
	CHECK_EQ_INT(hyb_balancer_bottleneck(b, 0), HYB_BOUND_NONE);
	CHECK_EQ_INT(hyb_balancer_step(b, 0, act, n, &fine, load, &nl, evict, &ne), 0);
	CHECK_EQ_INT(hyb_balancer_bottleneck(b, 0), HYB_BOUND_NONE);
	CHECK_EQ_INT(hyb_balancer_step(b, 0, act, n, NULL, load, &nl, evict, &ne), 0);
	CHECK_EQ_INT(hyb_balancer_bottleneck(b, 0), HYB_BOUND_NONE);
	CHECK_NEAR(hyb_balancer_lambda(b, 0), 0.2, 0);
	hyb_balancer_free(b);

	/* fixed tam records the verdict but keeps its lambda */
	b = small_balancer(HYB_POLICY_TAM, f, 4, 0.7);
	CHECK_MSG(b, "%s", err);
	CHECK_EQ_INT(hyb_balancer_step(b, 0, act, n, &io, load, &nl, evict, &ne), 0);
	CHECK_EQ_INT(hyb_balancer_bottleneck(b, 0), HYB_BOUND_IO);
	CHECK_NEAR(hyb_balancer_lambda(b, 0), 0.7, 0);
	hyb_balancer_free(b);
}

/*
 * The control loop's direction (KAIROX 7: CPU-bound -> lower lambda -> more
 * reloads; IO-bound -> higher lambda -> fewer). With a_ref = 0.5 the drift's
 * on-groups (shares 0.5-0.85) count as fully active, as binary A would.
 */
TEST(bal_tam_adaptive_direction)
{
	const enum fb_mode modes[3] = { FB_CPU, FB_WINDOW, FB_IO };
	struct hyb_balancer_params extra = { .a_ref = 0.5 };
	struct run_stats st[3];

	for (int m = 0; m < 3; m++) {
		struct drift d;
		float freq[DR_MAX_L][64];
		struct hyb_balancer *b;

		drift_init(&d, 42);
		drift_profile(&d, freq);
		b = drift_balancer(&d, freq, HYB_POLICY_TAM_ADAPTIVE, 32, 1e-4, &extra);
		run_stream(b, &d, 600, modes[m], 32, &st[m]);
		hyb_balancer_free(b);
#ifdef BAL_REPORT
		printf("tam-adaptive a_ref 0.5 %s: hit %.3f loads/step %.3f lambda [%.3f, %.3f]\n",
		       m == 0 ? "CPU-bound" : m == 1 ? "no verdict" : "IO-bound",
		       (double)st[m].hits / st[m].active, (double)st[m].loads / st[m].steps,
		       st[m].lambda_min, st[m].lambda_max);
#endif
	}
	CHECK_NEAR(st[0].lambda_min, 0.2, 1e-12);
	CHECK_NEAR(st[2].lambda_max, 0.9, 1e-12);
	CHECK_MSG(st[0].loads > st[1].loads && st[1].loads > st[2].loads,
		  "loads CPU-bound %llu, none %llu, IO-bound %llu",
		  (unsigned long long)st[0].loads, (unsigned long long)st[1].loads,
		  (unsigned long long)st[2].loads);
	/* more I/O, more hits: CPU-bound against IO-bound */
	CHECK(st[0].hits * st[2].active > st[2].hits * st[0].active);
}

/*
 * The same direction at two sparsity levels (90% and 97% of neurons
 * silent: the drift's probabilities scaled down, its background thinned),
 * with TAM's default intensity - over each layer's reference from the
 * profile, no constant (hyb/balancer.h a_ref). A fixed a_ref = 0.5, tuned at the
 * drift's original level (bal_tam_adaptive_direction, about 78%), runs
 * the loop backwards at both: on-groups fire a fifth or a tenth of their
 * neurons, so min(1, share / 0.5) stays well under 1 and the CPU-bound move
 * (lower lambda, higher bar 1 - lambda + eps) moves less onto the device.
 */
TEST(bal_tam_adaptive_direction_at_two_sparsities)
{
	static const double scale[2] = { 0.435, 0.135 }, bg[2] = { 0.01, 0.002 };
	static const double target[2] = { 0.90, 0.97 };

	for (int lv = 0; lv < 2; lv++) {
		for (int fixed = 0; fixed < 2; fixed++) {
			struct hyb_balancer_params extra = { .a_ref = fixed ? 0.5 : 0 };
			struct run_stats st[2];

			for (int m = 0; m < 2; m++) {
				struct drift d;
				float freq[DR_MAX_L][64];
				struct hyb_balancer *b;

				drift_init(&d, 42);
				for (uint32_t l = 0; l < d.L; l++) {
					d.p_hot[l] *= scale[lv];
					d.p_topic[l] *= scale[lv];
				}
				d.p_spike *= scale[lv];
				d.p_bg = bg[lv];
				drift_profile(&d, freq);
				b = drift_balancer(&d, freq, HYB_POLICY_TAM_ADAPTIVE, 32, 1e-4, &extra);
				run_stream(b, &d, 600, m ? FB_IO : FB_CPU, 32, &st[m]);
				hyb_balancer_free(b);
			}
			const double sp = 1 - (double)st[0].active / (600.0 * 2 * 1024);
			const double h0 = (double)st[0].hits / st[0].active;
			const double h1 = (double)st[1].hits / st[1].active;

			printf("    sparsity %.3f, a_ref %s: CPU-bound %.2f loads a step, hit %.3f; "
			       "IO-bound %.2f, hit %.3f\n", sp, fixed ? "0.5" : "from the profile",
			       (double)st[0].loads / st[0].steps, h0,
			       (double)st[1].loads / st[1].steps, h1);
			CHECK_MSG(fabs(sp - target[lv]) < 0.01, "sparsity %.3f, not %.2f", sp,
				  target[lv]);
			/*
			 * the direction that matters: CPU-bound moves more of the
			 * active neurons onto the device (hits) than IO-bound
			 */
			if (!fixed) {
				CHECK_NEAR(st[0].lambda_min, 0.2, 1e-12);
				CHECK_NEAR(st[1].lambda_max, 0.9, 1e-12);
				CHECK_MSG(h0 > h1 && st[0].loads > st[1].loads,
					  "sparsity %.2f: CPU-bound hit %.3f loads %llu, IO-bound hit "
					  "%.3f loads %llu", target[lv], h0,
					  (unsigned long long)st[0].loads, h1,
					  (unsigned long long)st[1].loads);
			} else {
				CHECK_MSG(h0 <= h1, "a_ref 0.5 at %.2f: hit CPU-bound %.3f, IO-bound "
					  "%.3f", target[lv], h0, h1);
			}
		}
	}
}

TEST(bal_tam_adaptive_per_layer_in_drift)
{
	/* in the toy engine each layer's lambda moves on its own, within bounds */
	struct drift d;
	float freq[DR_MAX_L][64];
	struct run_stats st;
	struct hyb_balancer *b;

	drift_init(&d, 5);
	drift_profile(&d, freq);
	b = drift_balancer(&d, freq, HYB_POLICY_TAM_ADAPTIVE, 32, 1e-4, NULL);
	run_stream(b, &d, 300, FB_SIM, 32, &st);
	CHECK(st.lambda_min >= 0.2 - 1e-12 && st.lambda_max <= 0.9 + 1e-12);
	CHECK(st.lambda_max > st.lambda_min);
	hyb_balancer_free(b);
}

/* ---- window cap, lru, topk, dynamic -------------------------------------------------------- */

TEST(bal_window_caps_loads)
{
	const float f[8] = { 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0, 0 };
	const enum hyb_policy pols[] = { HYB_POLICY_LRU, HYB_POLICY_TOPK, HYB_POLICY_DYNAMIC };
	uint32_t act[64], load[8], evict[8], nl, ne, n = 0;

	/* groups 2..7 active with decreasing intensity: 8, 7, ..., 3 neurons */
	for (uint32_t g = 2; g < 8; g++)
		for (uint32_t i = 0; i < 10 - g; i++)
			act[n++] = g * 8 + i;
	for (size_t q = 0; q < sizeof(pols) / sizeof(pols[0]); q++) {
		static const float *fp[1];
		struct hyb_balancer_params bp = {
			.policy = pols[q], .n_layer = 1, .n_ff = 64, .group_size = 8,
			.slot_budget = 6, .group_load_s = 1e-3, .phi_high = 2,
		};
		struct hyb_balancer_feedback fb = { .window_s = 2.5e-3 };
		struct hyb_balancer *b;

		fp[0] = f;
		bp.freq = fp;
		b = hyb_balancer_new(&bp);
		CHECK_MSG(b, "%s", hyb_last_error());
		/* resident 0..5; wanted 6 and 7; 2 fit the window */
		CHECK_EQ_INT(hyb_balancer_step(b, 0, act, n, &fb, load, &nl, evict, &ne), 0);
		CHECK_EQ_INT(nl, 2);
		CHECK_EQ_INT(ne, 2);
		hyb_balancer_free(b);
		/* a window under one load still allows one, the most active */
		b = hyb_balancer_new(&bp);
		fb.window_s = 1e-4;
		CHECK_EQ_INT(hyb_balancer_step(b, 0, act, n, &fb, load, &nl, evict, &ne), 0);
		CHECK_EQ_INT(nl, 1);
		CHECK_EQ_INT(load[0], 6);
		hyb_balancer_free(b);
		/* no transfer model: no cap; one set later: capped */
		bp.group_load_s = 0;
		b = hyb_balancer_new(&bp);
		fb.window_s = 1e-3;
		CHECK_EQ_INT(hyb_balancer_step(b, 0, act, n, &fb, load, &nl, evict, &ne), 0);
		CHECK_EQ_INT(nl, 2);
		hyb_balancer_free(b);
		b = hyb_balancer_new(&bp);
		CHECK_EQ_INT(hyb_balancer_set_group_load(b, -1), -EINVAL);
		CHECK_EQ_INT(hyb_balancer_set_group_load(b, NAN), -EINVAL);
		CHECK_EQ_INT(hyb_balancer_set_group_load(b, 1e-3), 0);
		CHECK_EQ_INT(hyb_balancer_step(b, 0, act, n, &fb, load, &nl, evict, &ne), 0);
		CHECK_EQ_INT(nl, 1);
		hyb_balancer_free(b);
	}
}

TEST(bal_lru_evicts_least_recent)
{
	const float f[8] = { 0.5f, 0.4f, 0.3f, 0.2f, 0, 0, 0, 0 };
	uint32_t act[64], load[8], evict[8], nl, ne, n;
	char err[256];
	struct hyb_balancer *b = small_balancer(HYB_POLICY_LRU, f, 4, 0);

	CHECK_MSG(b, "%s", err);
	/* touch 0, then 2, then 1 (3 never): 3 goes first, then 0 */
	act[0] = 0;
	CHECK_EQ_INT(hyb_balancer_step(b, 0, act, 1, NULL, load, &nl, evict, &ne), 0);
	act[0] = 16;
	CHECK_EQ_INT(hyb_balancer_step(b, 0, act, 1, NULL, load, &nl, evict, &ne), 0);
	act[0] = 8;
	CHECK_EQ_INT(hyb_balancer_step(b, 0, act, 1, NULL, load, &nl, evict, &ne), 0);
	CHECK_EQ_INT(nl + ne, 0);
	/* one neuron of group 5 (a one-hit wonder) is loaded at once */
	act[0] = 40;
	CHECK_EQ_INT(hyb_balancer_step(b, 0, act, 1, NULL, load, &nl, evict, &ne), 0);
	CHECK(nl == 1 && load[0] == 5 && ne == 1 && evict[0] == 3);
	act[0] = 48;
	CHECK_EQ_INT(hyb_balancer_step(b, 0, act, 1, NULL, load, &nl, evict, &ne), 0);
	CHECK(nl == 1 && load[0] == 6 && ne == 1 && evict[0] == 0);
	/* every active group not resident, up to K_l */
	n = groups_active(0xf0, act);
	CHECK_EQ_INT(hyb_balancer_step(b, 0, act, n, NULL, load, &nl, evict, &ne), 0);
	CHECK_EQ_INT(nl, 2);
	for (uint32_t g = 0; g < 8; g++)
		CHECK_EQ_INT(hyb_balancer_resident(b, 0, g), g >= 4);
	hyb_balancer_free(b);
}

TEST(bal_topk_follows_step)
{
	const float f[8] = { 0.5f, 0.4f, 0.3f, 0.2f, 0, 0, 0, 0 };
	uint32_t act[64], load[8], evict[8], nl, ne, n = 0;
	char err[256];
	struct hyb_balancer *b = small_balancer(HYB_POLICY_TOPK, f, 3, 0);

	CHECK_MSG(b, "%s", err);
	/* intensities: g1 2/8, g4 5/8, g6 3/8, g7 2/8 -> top 3 = {4, 6, 1 (resident tie with 7)} */
	act[n++] = 8, act[n++] = 9;
	for (uint32_t i = 0; i < 5; i++)
		act[n++] = 32 + i;
	for (uint32_t i = 0; i < 3; i++)
		act[n++] = 48 + i;
	act[n++] = 56, act[n++] = 57;
	CHECK_EQ_INT(hyb_balancer_step(b, 0, act, n, NULL, load, &nl, evict, &ne), 0);
	for (uint32_t g = 0; g < 8; g++)
		CHECK_EQ_INT(hyb_balancer_resident(b, 0, g), g == 1 || g == 4 || g == 6);
	CHECK(nl == 2 && load[0] == 4 && load[1] == 6);
	/* a quiet step changes nothing: inactive groups are never loaded */
	CHECK_EQ_INT(hyb_balancer_step(b, 0, NULL, 0, NULL, load, &nl, evict, &ne), 0);
	CHECK_EQ_INT(nl + ne, 0);
	hyb_balancer_free(b);
}

/* reference order of topk: A desc, resident first, freq desc, index */
struct ref_item {
	double a;
	float f;
	uint32_t g;
	int res;
};

static int ref_cmp(const void *pa, const void *pb)
{
	const struct ref_item *x = pa, *y = pb;

	if (x->a != y->a)
		return x->a > y->a ? -1 : 1;
	if (x->res != y->res)
		return x->res ? -1 : 1;
	if (x->f != y->f)
		return x->f > y->f ? -1 : 1;
	return x->g < y->g ? -1 : 1;
}

/* The selection code at full scale: topk against a sort of every group. */
TEST(bal_topk_matches_reference_1024_groups)
{
	enum { F = 16384, GS = 16, G = F / GS, K = 200 };
	static float f[G];
	static uint32_t act[F], load[G], evict[G], cnt[G];
	static struct ref_item ref[G];
	static uint8_t res[G];
	const float *fp[1] = { f };
	uint64_t rng = 3;
	struct hyb_balancer_params bp = {
		.policy = HYB_POLICY_TOPK, .n_layer = 1, .n_ff = F, .group_size = GS,
		.slot_budget = K, .freq = fp, .group_load_s = 1,
	};
	struct hyb_balancer *b;

	for (uint32_t g = 0; g < G; g++)
		f[g] = (float)(rng_next(&rng) % 50) / 100; /* many ties */
	b = hyb_balancer_new(&bp);
	CHECK_MSG(b, "%s", hyb_last_error());
	CHECK_EQ_INT(hyb_balancer_slots(b, 0), K);
	for (int t = 0; t < 60; t++) {
		/* per-group shares from a few levels: many ties in A too */
		const uint32_t cap = t % 3 == 0 ? 7 : 1000;
		struct hyb_balancer_feedback fb = { .window_s = cap };
		uint32_t n = 0, nl, ne, nr = 0, want = 0;

		for (uint32_t g = 0; g < G; g++) {
			const double q = (double)(rng_next(&rng) % 5) / 8 * (rng_next(&rng) % 4 == 0);

			res[g] = hyb_balancer_resident(b, 0, g);
			cnt[g] = 0;
			for (uint32_t i = 0; i < GS; i++)
				if (rng_unit(&rng) < q) {
					act[n++] = g * GS + i;
					cnt[g]++;
				}
		}
		CHECK_EQ_INT(hyb_balancer_step(b, 0, act, n, &fb, load, &nl, evict, &ne), 0);
		for (uint32_t g = 0; g < G; g++)
			if (cnt[g] || res[g])
				ref[nr++] = (struct ref_item){ (float)cnt[g] / GS, f[g], g, res[g] };
		qsort(ref, nr, sizeof(*ref), ref_cmp);
		/* loads: the target's non-resident groups in rank order, cut at the window */
		for (uint32_t q = 0; q < nr && q < K; q++)
			if (!ref[q].res) {
				if (want < cap) {
					CHECK_MSG(want < nl && load[want] == ref[q].g,
						  "step %d load %u: %u, want %u", t, want,
						  want < nl ? load[want] : 9999, ref[q].g);
				}
				want++;
			}
		CHECK_EQ_INT(nl, want < cap ? want : cap);
		CHECK(nl > 0);
		CHECK_EQ_INT(ne, nl); /* the cache is full from the start */
		/* victims: the lowest-ranked residents, worst first */
		for (uint32_t q = nr, v = 0; q-- > 0 && v < ne;)
			if (ref[q].res)
				CHECK_EQ_INT(evict[v++], ref[q].g);
	}
	hyb_balancer_free(b);
}

/*
 * dynamic's pins follow the running frequency f one way (balancer.c): the
 * profiled-hot start groups are pinned while their f stays >= phi_high, and
 * released as it cools (frozen pins kept a silent group forever); a group
 * that heats up during the run is not pinned.
 */
TEST(bal_dynamic_pins_follow_the_running_frequency)
{
	static const float f[8] = { 0.5f, 0.5f, 0.5f, 0.5f, 0, 0, 0, 0 };
	const float *fp[1] = { f };
	uint32_t act[64], load[8], evict[8], nl, ne, n;

	for (int pins = 1; pins >= 0; pins--) {
		struct hyb_balancer_params bp = {
			.policy = HYB_POLICY_DYNAMIC, .n_layer = 1, .n_ff = 64, .group_size = 8,
			.slot_budget = 4, .freq = fp, .phi_high = pins ? 0.3 : 2,
		};
		struct hyb_balancer *b = hyb_balancer_new(&bp);
		int t;

		CHECK_MSG(b, "%s", hyb_last_error());
		/* groups 0-2 and 5 on for 60 steps: the silent pin 3 cools and 5 takes its slot */
		n = groups_active(1u << 0 | 1u << 1 | 1u << 2 | 1u << 5, act);
		for (t = 0; t < 60; t++)
			CHECK_EQ_INT(hyb_balancer_step(b, 0, act, n, NULL, load, &nl, evict, &ne), 0);
		CHECK(hyb_balancer_resident(b, 0, 5) && !hyb_balancer_resident(b, 0, 3));
		/* then only 6 and 7: the hot pins 0-2 hold their slots, 5 (no pin) gives way */
		n = groups_active(1u << 6 | 1u << 7, act);
		for (t = 0; t < 10; t++)
			CHECK_EQ_INT(hyb_balancer_step(b, 0, act, n, NULL, load, &nl, evict, &ne), 0);
		if (pins)
			CHECK_MSG(hyb_balancer_resident(b, 0, 0) && hyb_balancer_resident(b, 0, 1) &&
				  hyb_balancer_resident(b, 0, 2) && !hyb_balancer_resident(b, 0, 5),
				  "pins lost, or a heated group pinned");
		else
			CHECK(hyb_balancer_resident(b, 0, 6) && hyb_balancer_resident(b, 0, 7));
		/* ... until their f cools below phi_high: 0.9 (31/32)^t < 0.3 after ~35 */
		for (t = 0; t < 60; t++)
			CHECK_EQ_INT(hyb_balancer_step(b, 0, act, n, NULL, load, &nl, evict, &ne), 0);
		CHECK_MSG(hyb_balancer_resident(b, 0, 6) && hyb_balancer_resident(b, 0, 7),
			  "pins %d: the cooled pins still hold the slots", pins);
		hyb_balancer_free(b);
	}
}

/* ---- load-aware thresholds ------------------------------------------------------------------ */

static double w_of(float x, enum hyb_select_err m)
{
	if (isnan(x))
		x = -INFINITY;
	return m == HYB_SELECT_ERR_EXPECTED ? 1 / (1 + exp(-(double)x)) : 1 / (1 + exp((double)x));
}

TEST(bal_select_constraint_and_objective)
{
	enum { F = 512, GS = 16, G = F / GS };
	float f[G], logits[F];
	uint32_t sel[F], n_sel, cases_improved = 0;
	uint64_t rng = 99;

	for (uint32_t g = 0; g < G; g++)
		f[g] = (float)(g % 7) / 8;
	for (int c = 0; c < 400; c++) {
		static const float *fp[1];
		struct hyb_balancer_params bp = {
			.policy = HYB_POLICY_STATIC, .n_layer = 1, .n_ff = F, .group_size = GS,
			.slot_budget = rng_next(&rng) % (G + 1),
		};
		struct hyb_select_cost cost = {
			.t_gpu = 1e-6 * (0.1 + rng_unit(&rng)),
			.t_cpu = 1e-6 * (0.5 + 5 * rng_unit(&rng)),
			.t_sync = c % 3 ? 2e-5 * rng_unit(&rng) : 0,
			.err_model = c & 1 ? HYB_SELECT_ERR_EXPECTED : HYB_SELECT_ERR_PAPER,
		};
		struct hyb_select_info info;
		struct hyb_balancer *b;
		double err_s = 0, err_f = 0;
		uint32_t ng = 0, nc = 0, ng0 = 0, nc0 = 0, j = 0;

		fp[0] = f;
		bp.freq = fp;
		b = hyb_balancer_new(&bp);
		CHECK_MSG(b, "%s", hyb_last_error());
		for (uint32_t i = 0; i < F; i++)
			logits[i] = (float)(6 * rng_unit(&rng) - 4);
		if (c % 5 == 0)
			logits[rng_next(&rng) % F] = NAN;
		CHECK_EQ_INT(hyb_balancer_select(b, 0, logits, &cost, sel, &n_sel, &info), 0);
		for (uint32_t i = 0; i < F; i++) {
			const bool r = hyb_balancer_resident(b, 0, i / GS);
			const bool st = logits[i] > 0;
			bool in = false;

			while (j < n_sel && sel[j] < i)
				j++;
			in = j < n_sel && sel[j] == i;
			/* moves: only resident neurons added, only non-resident ones dropped */
			if (in && !st)
				CHECK(r && !isnan(logits[i]));
			if (!in && st)
				CHECK(!r);
			if (!st)
				err_s += w_of(logits[i], cost.err_model);
			if (!in)
				err_f += w_of(logits[i], cost.err_model);
			ng0 += st && r;
			nc0 += st && !r;
			ng += in && r;
			nc += in && !r;
		}
		for (uint32_t q = 1; q < n_sel; q++)
			CHECK(sel[q] > sel[q - 1]);
		CHECK_EQ_INT(ng + nc, n_sel);
		CHECK_EQ_INT(info.n_gpu, ng);
		CHECK_EQ_INT(info.n_cpu, nc);
		CHECK_EQ_INT(info.n_gpu_static, ng0);
		CHECK_EQ_INT(info.n_cpu_static, nc0);
		CHECK_EQ_INT(info.added, ng - ng0);
		CHECK_EQ_INT(info.dropped, nc0 - nc);
		CHECK_NEAR(info.err_static, err_s, 1e-9 * (1 + err_s));
		CHECK_NEAR(info.err, err_f, 1e-9 * (1 + err_f));
		/* the accuracy constraint (E.4.2) and the objective */
		CHECK_MSG(err_f <= err_s + 1e-9 * (1 + err_s), "err %g > static %g", err_f, err_s);
		{
			const double t0 = fmax(cost.t_gpu * ng0, cost.t_cpu * nc0 + cost.t_sync);
			const double t1 = fmax(cost.t_gpu * ng, cost.t_cpu * nc + cost.t_sync);

			CHECK_NEAR(info.t_static, t0, 1e-15);
			CHECK_NEAR(info.t, t1, 1e-15);
			CHECK_MSG(t1 <= t0 * (1 + 1e-12), "latency %g > static %g", t1, t0);
			cases_improved += t1 < t0 * (1 - 1e-9);
		}
		hyb_balancer_free(b);
	}
	CHECK_MSG(cases_improved > 100, "only %u of 400 cases improved", cases_improved);
}

TEST(bal_select_cpu_bound_example)
{
	/* DynamicInfer E.2's shape: the CPU is the bottleneck, the device has room */
	const float f[8] = { 0.5f, 0.5f, 0, 0, 0, 0, 0, 0 };
	float logits[64];
	uint32_t sel[64], n_sel;
	struct hyb_select_cost cost = { .t_gpu = 1, .t_cpu = 4, .t_sync = 0 };
	struct hyb_select_info info;
	char err[256];
	struct hyb_balancer *b = small_balancer(HYB_POLICY_STATIC, f, 2, 0);

	CHECK_MSG(b, "%s", err);
	for (uint32_t i = 0; i < 64; i++)
		logits[i] = -3; /* p ~ 0.05 */
	logits[3] = 2;          /* resident, active */
	for (uint32_t i = 20; i < 24; i++)
		logits[i] = 0.5f; /* CPU, p ~ 0.62: cheap to drop under the paper's weights */
	CHECK_EQ_INT(hyb_balancer_select(b, 0, logits, &cost, sel, &n_sel, &info), 0);
	CHECK_EQ_INT(info.n_cpu_static, 4);
	CHECK_NEAR(info.t_static, 16, 0);
	CHECK(info.t < 16 && info.dropped > 0 && info.added > 0);
	CHECK(info.err <= info.err_static);
	/* p-weights: dropping a p = 0.62 neuron takes two p = 0.05 additions, or more */
	cost.err_model = HYB_SELECT_ERR_EXPECTED;
	CHECK_EQ_INT(hyb_balancer_select(b, 0, logits, &cost, sel, &n_sel, &info), 0);
	CHECK(info.err <= info.err_static && info.t <= info.t_static);
	CHECK(info.added >= 12 * info.dropped);
	/* bad arguments */
	cost.t_cpu = -1;
	CHECK_EQ_INT(hyb_balancer_select(b, 0, logits, &cost, sel, &n_sel, &info), -EINVAL);
	cost.t_cpu = NAN;
	CHECK_EQ_INT(hyb_balancer_select(b, 0, logits, &cost, sel, &n_sel, &info), -EINVAL);
	cost.t_cpu = 1;
	CHECK_EQ_INT(hyb_balancer_select(b, 1, logits, &cost, sel, &n_sel, &info), -EINVAL);
	CHECK_EQ_INT(hyb_balancer_select(b, 0, NULL, &cost, sel, &n_sel, &info), -EINVAL);
	CHECK_EQ_INT(hyb_balancer_select(b, 0, logits, NULL, sel, &n_sel, &info), -EINVAL);
	cost.err_model = (enum hyb_select_err)7;
	CHECK_EQ_INT(hyb_balancer_select(b, 0, logits, &cost, sel, &n_sel, &info), -EINVAL);
	hyb_balancer_free(b);
}

/* The neuron -> group reciprocal (group_div.h) equals the division wherever it is allowed. */
TEST(bal_group_of_equals_division)
{
	static const uint32_t gs[] = { 1, 2, 3, 7, 16, 20, 64, 100, 511, 1000, 4096, 65535 };

	for (unsigned k = 0; k < sizeof(gs) / sizeof(gs[0]); k++) {
		const uint64_t r = hyb_group_recip(gs[k]);
		/* all neurons of a 70B-shape FFN, then the top of the allowed range */
		const uint64_t top = ((1ull << 40) - 1) / gs[k];
		const uint32_t hi = top > (1u << 24) ? 1u << 24 : (uint32_t)top;

		CHECK(hyb_group_recip_ok(hi, gs[k]) && !hyb_group_recip_ok(hi + gs[k], gs[k]));
		for (uint32_t n = 0; n < 28672; n++)
			CHECK_MSG(hyb_group_of(n, r) == n / gs[k], "n %u gs %u", n, gs[k]);
		for (uint32_t n = hi > 100000 ? hi - 100000 : 0; n < hi; n++)
			CHECK_MSG(hyb_group_of(n, r) == n / gs[k], "n %u gs %u", n, gs[k]);
	}
	CHECK(!hyb_group_recip_ok((1u << 24) + 1, 1) && hyb_group_recip_ok(11008, 64) &&
	      !hyb_group_recip_ok(100, 0));
}
