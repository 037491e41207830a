// SPDX-License-Identifier: MIT
/*
 * Activation profiles: the file round trip and its validation, the
 * statistics on hand-made active sets with answers worked out by hand, the
 * collector fed by a fake probe, and end to end: a sparse `hybctl synth`
 * model profiled by `hybctl profile` lands in the bands the papers report.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu_kernels.h"
#include "hyb/gguf.h"
#include "hyb/profile.h"
#include "test.h"

static const char *build_dir(void)
{
	const char *b = getenv("HYB_BUILD");

	return b && *b ? b : "build";
}

static uint64_t rng_next(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* A profile with every array allocated (and zeroed) for the given sizes. */
static struct hyb_profile *make_profile(uint32_t n_layer, uint32_t n_embd, uint32_t n_ff,
					uint32_t n_samples, uint32_t n_seqs)
{
	struct hyb_profile *p = calloc(1, sizeof(*p));

	CHECK(p);
	snprintf(p->model_name, sizeof(p->model_name), "hand-made");
	p->n_layer = n_layer;
	p->n_embd = n_embd;
	p->n_ff = n_ff;
	p->active_words = (n_ff + 63) / 64;
	p->n_samples = n_samples;
	p->n_seqs = n_seqs;
	p->seq_start = calloc(n_seqs ? n_seqs : 1, sizeof(uint32_t));
	p->layers = calloc(n_layer, sizeof(*p->layers));
	CHECK(p->seq_start && p->layers);
	for (uint32_t l = 0; l < n_layer; l++) {
		p->layers[l].count = calloc(n_ff, sizeof(uint64_t));
		p->layers[l].active = calloc((size_t)(n_samples ? n_samples : 1) * p->active_words,
					     sizeof(uint64_t));
		p->layers[l].input = calloc((size_t)(n_samples ? n_samples : 1) * n_embd,
					    sizeof(uint16_t));
		CHECK(p->layers[l].count && p->layers[l].active && p->layers[l].input);
	}
	return p;
}

static void set_active(struct hyb_profile *p, uint32_t l, uint32_t s, uint32_t i)
{
	p->layers[l].active[(size_t)s * p->active_words + i / 64] |= 1ull << (i % 64);
}

/* Random contents that are consistent (counts >= active samples, bits < n_ff). */
static struct hyb_profile *random_profile(void)
{
	struct hyb_profile *p = make_profile(3, 24, 70, 9, 2);
	uint64_t s = 0x1234567;

	p->n_tokens = 1000;
	p->seq_start[1] = 4;
	for (uint32_t l = 0; l < p->n_layer; l++) {
		for (uint32_t i = 0; i < p->n_ff; i++)
			p->layers[l].count[i] = rng_next(&s) % 1000;
		for (uint32_t t = 0; t < p->n_samples; t++) {
			for (uint32_t i = 0; i < p->n_ff; i++)
				if (rng_next(&s) % 5 == 0)
					set_active(p, l, t, i);
			for (uint32_t e = 0; e < p->n_embd; e++) {
				float v = (float)((int)(rng_next(&s) % 200) - 100) / 50;

				p->layers[l].input[(size_t)t * p->n_embd + e] = hyb_f32_to_f16(v);
			}
		}
	}
	CHECK_EQ_INT(hyb_profile_stats(p), 0);
	for (uint32_t l = 0; l < p->n_layer; l++)
		p->layers[l].cos_next = l + 1 < p->n_layer ? 0.9 + 0.01 * l : NAN;
	return p;
}

static int same_double(double a, double b)
{
	return (isnan(a) && isnan(b)) || a == b;
}

TEST(prof_save_load_round_trip)
{
	struct hyb_profile *p = random_profile(), *q;
	char path[512];

	snprintf(path, sizeof(path), "%s/p.gguf", hyb_test_tmpdir());
	CHECK_MSG(hyb_profile_save(p, path) == 0, "save: %s", hyb_last_error());
	q = hyb_profile_load(path);
	CHECK_MSG(q, "load: %s", hyb_last_error());
	CHECK(!strcmp(q->model_name, "hand-made"));
	CHECK_EQ_INT(q->n_layer, 3);
	CHECK_EQ_INT(q->n_embd, 24);
	CHECK_EQ_INT(q->n_ff, 70);
	CHECK_EQ_INT(q->active_words, 2);
	CHECK_EQ_INT(q->n_tokens, 1000);
	CHECK_EQ_INT(q->n_samples, 9);
	CHECK_EQ_INT(q->n_seqs, 2);
	CHECK_EQ_INT(q->seq_start[0], 0);
	CHECK_EQ_INT(q->seq_start[1], 4);
	for (uint32_t l = 0; l < 3; l++) {
		const struct hyb_profile_layer *a = &p->layers[l], *b = &q->layers[l];

		CHECK(!memcmp(a->count, b->count, sizeof(uint64_t) * 70));
		CHECK(!memcmp(a->active, b->active, sizeof(uint64_t) * 2 * 9));
		CHECK(!memcmp(a->input, b->input, sizeof(uint16_t) * 24 * 9));
		CHECK(same_double(a->sparsity, b->sparsity));
		CHECK(same_double(a->hot_share_80, b->hot_share_80));
		CHECK(same_double(a->jaccard_adjacent, b->jaccard_adjacent));
		CHECK(same_double(a->cos_next, b->cos_next));
		CHECK(same_double(a->coact_lift, b->coact_lift));
		CHECK(same_double(a->coact_lift_random, b->coact_lift_random));
		for (int d = 0; d < 8; d++)
			CHECK(same_double(a->reactivation[d], b->reactivation[d]));
		CHECK(hyb_profile_active(q, l, 3, 69) == hyb_profile_active(p, l, 3, 69));
	}
	CHECK(isnan(q->layers[2].cos_next));
	hyb_profile_free(p);
	hyb_profile_free(q);
}

TEST(prof_save_load_no_samples)
{
	struct hyb_profile *p = make_profile(1, 8, 64, 0, 0), *q;
	char path[512];

	p->n_tokens = 5;
	p->layers[0].count[63] = 5;
	CHECK_EQ_INT(hyb_profile_stats(p), 0);
	snprintf(path, sizeof(path), "%s/p0.gguf", hyb_test_tmpdir());
	CHECK_MSG(hyb_profile_save(p, path) == 0, "save: %s", hyb_last_error());
	q = hyb_profile_load(path);
	CHECK_MSG(q, "load: %s", hyb_last_error());
	CHECK_EQ_INT(q->n_samples, 0);
	CHECK_EQ_INT(q->layers[0].count[63], 5);
	CHECK_NEAR(q->layers[0].sparsity, 1.0 - 5.0 / (5 * 64), 1e-12);
	hyb_profile_free(p);
	hyb_profile_free(q);
}

/* Save p (already broken by the caller) and expect load to fail naming `what`. */
static void expect_rejected(struct hyb_profile *p, const char *name, const char *what)
{
	char path[512];
	struct hyb_profile *q;

	snprintf(path, sizeof(path), "%s/%s.gguf", hyb_test_tmpdir(), name);
	CHECK_MSG(hyb_profile_save(p, path) == 0, "save %s: %s", name, hyb_last_error());
	q = hyb_profile_load(path);
	CHECK_MSG(!q, "%s: a malformed profile was accepted", name);
	CHECK_MSG(strstr(hyb_last_error(), what), "%s: error '%s' does not mention '%s'", name,
		  hyb_last_error(), what);
	hyb_profile_free(p);
}

TEST(prof_load_rejects_bad_contents)
{
	struct hyb_profile *p;

	p = random_profile();
	p->layers[1].count[5] = 1001; /* more activations than tokens */
	expect_rejected(p, "count", "blk.1.count[5]");

	p = random_profile();
	p->seq_start[1] = 0; /* sequences must start in order */
	expect_rejected(p, "seq", "seq_start[1]");

	p = random_profile();
	p->layers[2].active[2 * 7 + 1] |= 1ull << 10; /* neuron 74 of 70 */
	expect_rejected(p, "pad", "beyond neuron 69");
}

/* A profile-shaped file written by hand, with one thing changed. */
static const char *write_raw(const char *name, const char *arch, uint32_t version, bool with_input,
			     uint64_t input_ne0)
{
	static char path[512];
	struct hyb_gguf_writer *w = hyb_gguf_writer_new();
	static uint64_t count[64], active[4];
	static uint16_t input[4 * 32];
	static double stats[8];
	static const uint32_t seq0 = 0;
	uint64_t ne_c[1] = { 64 }, ne_a[2] = { 1, 4 }, ne_i[2] = { input_ne0, 4 };
	static const char *const keys[] = {
		"hyb.profile.sparsity", "hyb.profile.hot_share_80", "hyb.profile.jaccard_adjacent",
		"hyb.profile.cos_next", "hyb.profile.coact_lift", "hyb.profile.coact_lift_random",
	};

	snprintf(path, sizeof(path), "%s/%s.gguf", hyb_test_tmpdir(), name);
	hyb_gguf_set_str(w, "general.architecture", arch);
	hyb_gguf_set_u32(w, "hyb.profile.version", version);
	hyb_gguf_set_u32(w, "hyb.profile.n_layer", 1);
	hyb_gguf_set_u32(w, "hyb.profile.n_embd", 16);
	hyb_gguf_set_u32(w, "hyb.profile.n_ff", 64);
	hyb_gguf_set_u64(w, "hyb.profile.n_tokens", 4);
	hyb_gguf_set_u32(w, "hyb.profile.n_samples", 4);
	hyb_gguf_set_u32(w, "hyb.profile.n_seqs", 1);
	hyb_gguf_set_arr(w, "hyb.profile.seq_start", HYB_GGUF_VT_UINT32, &seq0, 1);
	for (int k = 0; k < 6; k++)
		hyb_gguf_set_arr(w, keys[k], HYB_GGUF_VT_FLOAT64, stats, 1);
	hyb_gguf_set_arr(w, "hyb.profile.reactivation", HYB_GGUF_VT_FLOAT64, stats, 8);
	CHECK(hyb_gguf_writer_add_tensor(w, "blk.0.count", 27, 1, ne_c, count) == 0);
	CHECK(hyb_gguf_writer_add_tensor(w, "blk.0.active", 27, 2, ne_a, active) == 0);
	if (with_input)
		CHECK(hyb_gguf_writer_add_tensor(w, "blk.0.input", HYB_TYPE_F16, 2, ne_i, input) == 0);
	CHECK_MSG(hyb_gguf_writer_write_file(w, path) == 0, "%s", hyb_last_error());
	hyb_gguf_writer_free(w);
	return path;
}

static void expect_load_error(const char *path, const char *what)
{
	struct hyb_profile *q = hyb_profile_load(path);

	CHECK_MSG(!q, "%s accepted", path);
	CHECK_MSG(strstr(hyb_last_error(), what), "%s: error '%s' does not mention '%s'", path,
		  hyb_last_error(), what);
}

TEST(prof_load_rejects_bad_files)
{
	struct hyb_profile *q = hyb_profile_load(write_raw("ok", "hyb-profile", 1, true, 16));
	char path[512];
	FILE *f;
	long size;

	CHECK_MSG(q, "the well-formed hand-written file: %s", hyb_last_error());
	hyb_profile_free(q);
	expect_load_error(write_raw("arch", "llama", 1, true, 16), "not a hyb profile");
	expect_load_error(write_raw("ver", "hyb-profile", 2, true, 16), "version");
	expect_load_error(write_raw("noinput", "hyb-profile", 1, false, 16), "blk.0.input");
	expect_load_error(write_raw("shape", "hyb-profile", 1, true, 32), "blk.0.input");
	expect_load_error("/nonexistent/profile.gguf", "profile.gguf");

	/* truncated: the GGUF reader refuses it before any size is trusted */
	snprintf(path, sizeof(path), "%s", write_raw("trunc", "hyb-profile", 1, true, 16));
	f = fopen(path, "r+");
	CHECK(f && !fseek(f, 0, SEEK_END));
	size = ftell(f);
	fclose(f);
	CHECK(truncate(path, size / 2) == 0);
	q = hyb_profile_load(path);
	CHECK_MSG(!q, "a truncated profile was accepted");
}

/*
 * One layer of 10 neurons, two sequences:
 *   A: s0 {0,1,2,3}  s1 {2,3,4,5}  s2 {0,1,2,3}      B: s3 {6}  s4 {}
 * counts {100,50,20,10,10,5,3,1,1,0} over 100 tokens.
 */
TEST(prof_stats_known_answers)
{
	static const uint64_t counts[10] = { 100, 50, 20, 10, 10, 5, 3, 1, 1, 0 };
	static const int sets[5][5] = {
		{ 0, 1, 2, 3, -1 }, { 2, 3, 4, 5, -1 }, { 0, 1, 2, 3, -1 }, { 6, -1 }, { -1 },
	};
	struct hyb_profile *p = make_profile(1, 4, 10, 5, 2);
	struct hyb_profile_summary sum;
	const struct hyb_profile_layer *ly = &p->layers[0];

	p->n_tokens = 100;
	p->seq_start[1] = 3;
	memcpy(p->layers[0].count, counts, sizeof(counts));
	for (int s = 0; s < 5; s++)
		for (int k = 0; sets[s][k] >= 0; k++)
			set_active(p, 0, s, sets[s][k]);
	CHECK_EQ_INT(hyb_profile_stats(p), 0);
	/* 1 - 200 / (100 * 10) */
	CHECK_NEAR(ly->sparsity, 0.8, 1e-12);
	/* 100 + 50 = 75% < 80%; + 20 = 85%: three neurons of ten */
	CHECK_NEAR(ly->hot_share_80, 0.3, 1e-12);
	/* (s0,s1) 1 - 2/6, (s1,s2) 1 - 2/6, (s3,s4) 1 - 0/1; (s2,s3) crosses sequences */
	CHECK_NEAR(ly->jaccard_adjacent, (2.0 / 3 + 2.0 / 3 + 1.0) / 3, 1e-12);
	/*
	 * cold = the 7 lowest counts: 9, 7, 8, 6, 5, then the tie at 10 by index: 3, 4.
	 * d = 1: s0->s1 {3} of {3}; s1->s2 {3} of {3,4,5}; s3->s4 0 of {6}: 2 / 5.
	 * d = 2: s0->s2 {3} of {3}: 1 / 1. d = 3: no pair inside a sequence.
	 */
	CHECK_NEAR(ly->reactivation[0], 0.4, 1e-12);
	CHECK_NEAR(ly->reactivation[1], 1.0, 1e-12);
	CHECK(isnan(ly->reactivation[2]));
	/* no neuron is active in 8 samples: no lift */
	CHECK(isnan(ly->coact_lift));
	hyb_profile_summarize(p, &sum);
	CHECK_NEAR(sum.sparsity, 0.8, 1e-12);
	CHECK_NEAR(sum.hot_share_80, 0.3, 1e-12);
	CHECK(isnan(sum.reactivation_cold_max)); /* nothing measured at d >= 3 */
	hyb_profile_free(p);
}

/*
 * 64 samples, 33 neurons: four clusters of 8 that fire together on every
 * fourth sample, and neuron 32 that fires on all. A cluster neuron's partners
 * with the most excess co-activation are its 7 mates (lift 64 * 16 / 16^2 =
 * 4) and then neuron 32 (excess 0, lift 1); neuron 32's are all at lift 1:
 * mean over the 33 * 8 pairs = (32 * (7 * 4 + 1) + 8) / 264.
 */
TEST(prof_stats_coactivation_lift)
{
	struct hyb_profile *p = make_profile(1, 4, 33, 64, 1);
	struct hyb_profile_summary sum;

	p->n_tokens = 64;
	for (uint32_t s = 0; s < 64; s++) {
		for (uint32_t i = 0; i < 32; i++)
			if (i / 8 == s % 4)
				set_active(p, 0, s, i);
		set_active(p, 0, s, 32);
	}
	for (uint32_t i = 0; i < 33; i++)
		p->layers[0].count[i] = i == 32 ? 64 : 16;
	CHECK_EQ_INT(hyb_profile_stats(p), 0);
	CHECK_NEAR(p->layers[0].coact_lift, (32.0 * 29 + 8) / 264, 1e-9);
	CHECK(p->layers[0].coact_lift_random < p->layers[0].coact_lift);
	CHECK_NEAR(p->layers[0].sparsity, 1.0 - (32.0 * 16 + 64) / (64 * 33), 1e-12);
	/* adjacent samples share only neuron 32: 1 - 1/17 */
	CHECK_NEAR(p->layers[0].jaccard_adjacent, 1.0 - 1.0 / 17, 1e-12);
	hyb_profile_summarize(p, &sum);
	CHECK_NEAR(sum.coact_lift, p->layers[0].coact_lift, 1e-12);
	hyb_profile_free(p);
}

/* The collector fed through its probe by hand: counts, bits, inputs, quotas, cosines. */
TEST(prof_collector_probe)
{
	struct hyb_profile_collector *c = hyb_profile_collector_new(2, 4, 70, 5, "fake");
	struct hyb_profile *p;
	float x0[3 * 4], x1[3 * 4], act[3 * 70];

	CHECK_MSG(c, "%s", hyb_last_error());
	for (int t = 0; t < 3; t++) {
		for (int e = 0; e < 4; e++) {
			x0[t * 4 + e] = (float)(t + 1) * (e == 0 ? 2.0f : 0.0f);
			/* layer 1: same direction for token 0, orthogonal for 1 and 2 */
			x1[t * 4 + e] = t == 0 ? x0[t * 4 + e] * 3 : (e == 1 ? 1.0f : 0.0f);
		}
		for (int i = 0; i < 70; i++)
			act[t * 70 + i] = (i == 69 || i == t) ? 0.5f : 0.0f;
	}
	/* sequence 1: a prompt batch of 3 tokens and a decode step; quota 3 samples */
	hyb_profile_collector_begin_seq(c, 3);
	hyb_profile_probe(c, 0, 0, 3, x0, act);
	hyb_profile_probe(c, 1, 0, 3, x1, act);
	hyb_profile_probe(c, 0, 3, 1, x0, act);
	hyb_profile_probe(c, 1, 3, 1, x1, act);
	/* sequence 2: only 2 of the 5 samples are left */
	hyb_profile_collector_begin_seq(c, 0);
	hyb_profile_probe(c, 0, 0, 3, x0, act);
	hyb_profile_probe(c, 1, 0, 3, x1, act);
	p = hyb_profile_collector_finish(c);
	CHECK(p);
	CHECK_EQ_INT(p->n_tokens, 7);
	CHECK_EQ_INT(p->n_samples, 5);
	CHECK_EQ_INT(p->n_seqs, 2);
	CHECK_EQ_INT(p->seq_start[1], 3);
	CHECK_EQ_INT(p->layers[0].count[69], 7);
	CHECK_EQ_INT(p->layers[1].count[0], 3); /* token 0 of each batch */
	CHECK_EQ_INT(p->layers[0].count[2], 2);
	CHECK(hyb_profile_active(p, 0, 0, 0) && hyb_profile_active(p, 0, 0, 69));
	CHECK(!hyb_profile_active(p, 0, 0, 1) && hyb_profile_active(p, 0, 1, 1));
	CHECK(hyb_profile_active(p, 1, 4, 1) && !hyb_profile_active(p, 1, 4, 2));
	/* inputs: unit RMS; layer 0 and 1 both hold layer 0's x_attn (sqrt(4) on e0) */
	CHECK_NEAR(hyb_f16_to_f32(p->layers[0].input[1 * 4 + 0]), 2.0, 1e-3);
	CHECK_NEAR(hyb_f16_to_f32(p->layers[1].input[1 * 4 + 0]), 2.0, 1e-3);
	CHECK_NEAR(hyb_f16_to_f32(p->layers[1].input[1 * 4 + 1]), 0.0, 1e-6);
	/* cos(x0, x1): 1 for token 0 of each batch, 0 otherwise: (1 + 0 + 0 + 1 + 1 + 0 + 0) / 7 */
	CHECK_NEAR(p->layers[0].cos_next, 3.0 / 7, 1e-9);
	CHECK(isnan(p->layers[1].cos_next));
	hyb_profile_free(p);

	CHECK(!hyb_profile_collector_new(0, 4, 70, 5, "x"));
	CHECK(strstr(hyb_last_error(), "0 layers"));
}

/* ---- end to end ---------------------------------------------------------- */

static int run(const char *fmt, const char *a, const char *b)
{
	char cmd[2048];

	snprintf(cmd, sizeof(cmd), fmt, build_dir(), a, b);
	return system(cmd);
}

static struct hyb_profile *synth_and_profile(const char *name, const char *args)
{
	char model[512], prof[512];
	struct hyb_profile *p;

	snprintf(model, sizeof(model), "%s/%s.gguf", hyb_test_tmpdir(), name);
	snprintf(prof, sizeof(prof), "%s/%s.prof.gguf", hyb_test_tmpdir(), name);
	CHECK_MSG(run("%s/hybctl synth -o %s --hidden 256 --ffn 1024 --layers 4 --heads 4 "
		      "--vocab 512 -t 2 %s >/dev/null", model, args) == 0, "synth %s failed", args);
	/* one thread: the machine may be shared, and the statistics do not depend on it */
	CHECK_MSG(run("%s/hybctl profile %s -t 1 -o %s >/dev/null 2>&1", model, prof) == 0,
		  "profile of %s failed", name);
	p = hyb_profile_load(prof);
	CHECK_MSG(p, "%s", hyb_last_error());
	return p;
}

static void check_bands(const struct hyb_profile *p, double sp_lo, double sp_hi)
{
	struct hyb_profile_summary s;

	hyb_profile_summarize(p, &s);
	for (uint32_t l = 0; l < p->n_layer; l++) {
		const struct hyb_profile_layer *ly = &p->layers[l];

		CHECK_MSG(ly->sparsity >= sp_lo && ly->sparsity <= sp_hi,
			  "layer %u sparsity %.4f outside [%.2f, %.2f]", l, ly->sparsity, sp_lo,
			  sp_hi);
		CHECK_MSG(ly->hot_share_80 >= 0.10 && ly->hot_share_80 <= 0.35,
			  "layer %u hot share %.3f", l, ly->hot_share_80);
		CHECK_MSG(l + 1 == p->n_layer || ly->cos_next >= 0.9, "layer %u cos_next %.4f", l,
			  ly->cos_next);
		for (int d = 3; d <= 8; d++)
			CHECK_MSG(ly->reactivation[d - 1] < 0.2, "layer %u reactivation d=%d %.3f",
				  l, d, ly->reactivation[d - 1]);
		CHECK_MSG(ly->coact_lift > 2 && ly->coact_lift_random < 1.5,
			  "layer %u lift %.2f (random %.2f)", l, ly->coact_lift,
			  ly->coact_lift_random);
	}
	CHECK_MSG(s.hot_share_80 >= 0.15 && s.hot_share_80 <= 0.35, "hot share %.3f",
		  s.hot_share_80);
	CHECK_MSG(s.reactivation_cold_max < 0.2, "reactivation %.3f", s.reactivation_cold_max);
}

TEST(prof_e2e_sparse_synth_in_bands)
{
	struct hyb_profile *p, *q;
	struct hyb_profile_summary s, t;

	if (access("build/hybctl", X_OK) && !getenv("HYB_BUILD"))
		SKIP("build/hybctl not built (run from the repository root after make)");
	p = synth_and_profile("relu90", "--act relu --type Q8_0 --seed 3");
	check_bands(p, 0.85, 0.95);
	hyb_profile_summarize(p, &s);
	CHECK_MSG(s.sparsity >= 0.87 && s.sparsity <= 0.93, "sparsity %.4f", s.sparsity);
	CHECK_MSG(s.jaccard_adjacent >= 0.6 && s.jaccard_adjacent <= 0.8, "jaccard %.3f",
		  s.jaccard_adjacent);
	CHECK_EQ_INT(p->n_layer, 4);
	CHECK_EQ_INT(p->n_ff, 1024);
	CHECK(p->n_samples == p->n_tokens && p->n_seqs == 20);

	q = synth_and_profile("relu97", "--act dlrelu --type Q4_0 --sparsity 0.97 --seed 4");
	check_bands(q, 0.95, 0.99);
	hyb_profile_summarize(q, &t);
	CHECK_MSG(t.sparsity > s.sparsity + 0.05, "--sparsity 0.97 gave %.4f", t.sparsity);
	hyb_profile_free(p);
	hyb_profile_free(q);
}

TEST(prof_synth_sparse_is_thread_independent)
{
	char a[512], b[512];

	if (access("build/hybctl", X_OK) && !getenv("HYB_BUILD"))
		SKIP("build/hybctl not built (run from the repository root after make)");
	snprintf(a, sizeof(a), "%s/t1.gguf", hyb_test_tmpdir());
	snprintf(b, sizeof(b), "%s/t2.gguf", hyb_test_tmpdir());
	CHECK(run("%s/hybctl synth -o %s --act relu2 --type F16 --hidden 128 --ffn 512 --layers 3 "
		  "--heads 2 --kv-heads 1 -t 1 %s", a, "") == 0);
	CHECK(run("%s/hybctl synth -o %s --act relu2 --type F16 --hidden 128 --ffn 512 --layers 3 "
		  "--heads 2 --kv-heads 1 -t 2 %s", b, "") == 0);
	CHECK(run("cmp -s %.0s%s %s", a, b) == 0);
	/* the design is only for ReLU-family activations */
	CHECK(run("%s/hybctl synth -o %s --sparsity 0.9 %s 2>/dev/null", a, "") != 0);
	CHECK(run("%s/hybctl synth -o %s --act relu --sparsity 1.5 %s 2>/dev/null", a, "") != 0);
}
