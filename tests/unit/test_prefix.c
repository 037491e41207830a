// SPDX-License-Identifier: MIT
/*
 * The prefix cache (hyb_ctx_seq_keep, hyb_ctx_seq_open_prefix:
 * libhyb/forward/batch.c and kv_pages.c). A sequence that starts from a
 * kept prefix gives the logits of one evaluated afresh, bit for bit, for
 * the types whose sums change with a call's column count too; kept blocks
 * take no room from sequences (given up, oldest first, when needed) and
 * none leaks; a one-sequence context's kept rows end where they are
 * overwritten.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "hyb/error.h"
#include "hyb/model.h"
#include "test.h"

#define NB 32     /* n_batch: pieces, and the prefix cache's unit with 16-position blocks */
#define NGEN 6

static void make_prompt(int32_t *t, uint32_t n, uint32_t V, uint32_t salt)
{
	for (uint32_t i = 0; i < n; i++)
		t[i] = (int32_t)((i * 37 + salt * 101 + 11) % (V - 3) + 3);
}

/* Logits of the prompt's last token and NGEN greedy steps: [1 + NGEN][V]. */
static void decode(struct hyb_ctx *c, int seq, const int32_t *t, uint32_t n, uint32_t V,
		   float *lg)
{
	struct hyb_seq_tokens b = { seq, t, n };

	CHECK_MSG(hyb_ctx_eval_seqs(c, &b, 1, lg) == 0, "%s", hyb_last_error());
	for (uint32_t g = 0; g < NGEN; g++) {
		int32_t next = hyb_test_argmax(lg + (size_t)g * V, V);

		b = (struct hyb_seq_tokens){ seq, &next, 1 };
		CHECK_MSG(hyb_ctx_eval_seqs(c, &b, 1, lg + (size_t)(g + 1) * V) == 0, "%s",
			  hyb_last_error());
	}
}

/*
 * Prompt A (100 tokens) is kept; B shares its first 80 tokens: B starts at
 * 64 (two whole pieces) and its logits must be those of B in a fresh
 * context. With several sequences, B also runs beside another sequence's
 * prompt, so that the pass holds more than B.
 */
static void reuse_case(const char *path, uint32_t n_seq)
{
	struct hyb_model *m = hyb_model_load(path);
	const uint32_t V = m ? m->hp.n_vocab : 0;
	struct hyb_ctx_params p = { .n_ctx = 256, .n_threads = 2, .n_batch = NB, .n_seq = n_seq,
				    .kv_size = n_seq > 1 ? 1024 : 0 };
	int32_t a[100], b[120], o[40];
	float *fresh, *got;
	uint32_t reused = 99;
	struct hyb_ctx *c, *f;
	int s, so = -1;

	CHECK_MSG(m, "%s", hyb_last_error());
	c = hyb_ctx_new(m, &p);
	f = hyb_ctx_new(m, &p);
	CHECK_MSG(c && f, "%s", hyb_last_error());
	fresh = malloc(sizeof(float) * V * (NGEN + 1));
	got = malloc(sizeof(float) * V * (NGEN + 1));
	CHECK(fresh && got);
	make_prompt(a, 100, V, 1);
	memcpy(b, a, sizeof(int32_t) * 80);
	make_prompt(b + 80, 40, V, 2);
	make_prompt(o, 40, V, 3);

	/* B afresh */
	s = hyb_ctx_seq_open(f, 120 + NGEN);
	CHECK(s >= 0);
	decode(f, s, b, 120, V, fresh);

	/* A, kept */
	s = hyb_ctx_seq_open_prefix(c, 100 + NGEN, a, 100, &reused);
	CHECK(s >= 0);
	CHECK_EQ_INT(reused, 0);
	decode(c, s, a, 100, V, got);
	CHECK_EQ_INT(hyb_ctx_seq_keep(c, s, a, 100), 0);
	CHECK_EQ_INT(hyb_ctx_seq_close(c, s), 0);

	/* B from A's first two pieces */
	s = hyb_ctx_seq_open_prefix(c, 120 + NGEN, b, 120, &reused);
	CHECK(s >= 0);
	CHECK_EQ_INT(reused, 64);
	CHECK_EQ_INT(hyb_ctx_seq_pos(c, s), 64);
	if (n_seq > 1) {
		/* B's first piece beside another prompt's */
		struct hyb_seq_tokens two[2];
		float *lg2 = malloc(sizeof(float) * V * 2);

		CHECK(lg2);
		so = hyb_ctx_seq_open(c, 40);
		CHECK(so >= 0);
		two[0] = (struct hyb_seq_tokens){ so, o, 40 };
		two[1] = (struct hyb_seq_tokens){ s, b + 64, NB };
		CHECK_MSG(hyb_ctx_eval_seqs(c, two, 2, lg2) == 0, "%s", hyb_last_error());
		free(lg2);
		decode(c, s, b + 64 + NB, 120 - 64 - NB, V, got);
	} else {
		decode(c, s, b + 64, 120 - 64, V, got);
	}
	CHECK_MSG(!memcmp(fresh, got, sizeof(float) * V * (NGEN + 1)),
		  "%s, %u sequences: B from the kept prefix differs from B afresh", path, n_seq);
	CHECK_EQ_INT(hyb_ctx_seq_close(c, s), 0);
	if (so >= 0)
		CHECK_EQ_INT(hyb_ctx_seq_close(c, so), 0);
	free(fresh);
	free(got);
	hyb_ctx_free(c);
	hyb_ctx_free(f);
	hyb_model_free(m);
}

TEST(prefix_reuse_same_bits_q8_0)
{
	const char *path = hyb_test_synth("pfx-q8", "--layers 2 --type Q8_0 --vocab 300");

	reuse_case(path, 4);
	reuse_case(path, 1);
}

/* K-quants and floats sum by a call's column count: only whole pieces can be reused */
TEST(prefix_reuse_same_bits_k_quant_and_f16)
{
	reuse_case(hyb_test_synth("pfx-q4k", "--layers 2 --type Q4_K --vocab 300"), 4);
	reuse_case(hyb_test_synth("pfx-f16", "--layers 2 --type F16 --vocab 300"), 4);
	reuse_case(hyb_test_synth("pfx-f16", "--layers 2 --type F16 --vocab 300"), 1);
}

TEST(prefix_reuse_moe)
{
	reuse_case(hyb_test_synth("pfx-moe", "--arch qwen3moe --experts 8 --experts-used 2 "
				  "--expert-ffn 256 --layers 2 --vocab 300 --type Q4_K"), 4);
}

/*
 * 12 blocks of 16 positions, sequences of up to 4: kept blocks are counted
 * apart, sequences take them back when they need them (the oldest prefix
 * first), and nothing leaks.
 */
TEST(prefix_blocks_given_up_when_needed)
{
	struct hyb_model *m = hyb_model_load(hyb_test_synth("pfx-small", "--layers 1 --vocab 300"));
	const uint32_t V = m ? m->hp.n_vocab : 0;
	struct hyb_ctx_params p = { .n_ctx = 128, .n_threads = 1, .n_batch = NB, .n_seq = 4,
				    .kv_size = 12 * 16 };
	int32_t a[64], b[64];
	float *lg;
	uint32_t reused;
	struct hyb_kv_stats st;
	struct hyb_ctx *c;
	int s, t;

	CHECK_MSG(m, "%s", hyb_last_error());
	c = hyb_ctx_new(m, &p);
	CHECK_MSG(c, "%s", hyb_last_error());
	lg = malloc(sizeof(float) * V * (NGEN + 1));
	CHECK(lg);
	make_prompt(a, 64, V, 4);
	make_prompt(b, 64, V, 5);
	/* A (64) and B (64) kept: 8 blocks */
	for (int k = 0; k < 2; k++) {
		const int32_t *x = k ? b : a;

		s = hyb_ctx_seq_open_prefix(c, 64 + NGEN, x, 64, &reused);
		CHECK(s >= 0);
		decode(c, s, x, 64, V, lg);
		CHECK_EQ_INT(hyb_ctx_seq_keep(c, s, x, 64), 0);
		CHECK_EQ_INT(hyb_ctx_seq_close(c, s), 0);
	}
	hyb_ctx_kv_stats(c, &st);
	CHECK_EQ_INT(st.kept, 8);
	CHECK_EQ_INT(st.used, 0);
	CHECK_EQ_INT(st.reserved, 0);
	/* sequences of the whole cache still open; blocks are taken from A (the older) first */
	s = hyb_ctx_seq_open(c, 128);
	CHECK_MSG(s >= 0, "%s", hyb_last_error());
	t = hyb_ctx_seq_open(c, 64);
	CHECK_MSG(t >= 0, "%s", hyb_last_error());
	hyb_ctx_kv_stats(c, &st);
	CHECK_EQ_INT(st.reserved, 12);
	{
		int32_t fill[128];
		struct hyb_seq_tokens two[2];
		float *lg2 = malloc(sizeof(float) * V * 2);

		CHECK(lg2);
		make_prompt(fill, 128, V, 6);
		two[0] = (struct hyb_seq_tokens){ s, fill, 128 };
		two[1] = (struct hyb_seq_tokens){ t, fill, 32 };
		CHECK_MSG(hyb_ctx_eval_seqs(c, two, 2, lg2) == 0, "%s", hyb_last_error());
		free(lg2);
	}
	hyb_ctx_kv_stats(c, &st);
	CHECK_EQ_INT(st.used, 10);
	CHECK_EQ_INT(st.kept, 0); /* A's blocks went first, then B's */
	/* more than the cache can promise is still refused */
	CHECK_EQ_INT(hyb_ctx_seq_open(c, 48), -ENOSPC);
	CHECK_EQ_INT(hyb_ctx_seq_close(c, s), 0);
	CHECK_EQ_INT(hyb_ctx_seq_close(c, t), 0);
	/* both are gone: nothing left to reuse */
	s = hyb_ctx_seq_open_prefix(c, 64 + NGEN, a, 64, &reused);
	CHECK(s >= 0);
	CHECK_EQ_INT(reused, 0);
	CHECK_EQ_INT(hyb_ctx_seq_close(c, s), 0);
	hyb_ctx_kv_stats(c, &st);
	CHECK_EQ_INT(st.used, 0);
	CHECK_EQ_INT(st.reserved, 0);
	CHECK(st.kept <= 12);
	free(lg);
	hyb_ctx_free(c);
	hyb_model_free(m);
}

/* One sequence: what a later evaluation overwrites is no longer reused. */
TEST(prefix_one_sequence_overwritten_rows)
{
	struct hyb_model *m = hyb_model_load(hyb_test_synth("pfx-one", "--layers 1 --vocab 300"));
	const uint32_t V = m ? m->hp.n_vocab : 0;
	struct hyb_ctx_params p = { .n_ctx = 256, .n_threads = 1, .n_batch = NB };
	int32_t a[80], b[80];
	float *lg;
	uint32_t reused;
	struct hyb_ctx *c;
	int s;

	CHECK_MSG(m, "%s", hyb_last_error());
	c = hyb_ctx_new(m, &p);
	CHECK_MSG(c, "%s", hyb_last_error());
	lg = malloc(sizeof(float) * V * (NGEN + 1));
	CHECK(lg);
	make_prompt(a, 80, V, 7);
	memcpy(b, a, sizeof(int32_t) * 40);
	make_prompt(b + 40, 40, V, 8);
	s = hyb_ctx_seq_open_prefix(c, 80 + NGEN, a, 80, &reused);
	CHECK_EQ_INT(s, 0);
	decode(c, s, a, 80, V, lg);
	CHECK_EQ_INT(hyb_ctx_seq_keep(c, s, a, 80), 0);
	CHECK_EQ_INT(hyb_ctx_seq_close(c, s), 0);
	/* B shares 40: one piece reused; it then writes from 32 on */
	s = hyb_ctx_seq_open_prefix(c, 80 + NGEN, b, 80, &reused);
	CHECK_EQ_INT(reused, 32);
	decode(c, s, b + 32, 48, V, lg);
	CHECK_EQ_INT(hyb_ctx_seq_close(c, s), 0);
	/* A's second piece was overwritten by B's */
	s = hyb_ctx_seq_open_prefix(c, 80 + NGEN, a, 80, &reused);
	CHECK_EQ_INT(reused, 32);
	CHECK_EQ_INT(hyb_ctx_seq_close(c, s), 0);
	/* a plain open starts from 0 and overwrites the first piece as well */
	s = hyb_ctx_seq_open(c, 80);
	decode(c, s, b, 40, V, lg);
	CHECK_EQ_INT(hyb_ctx_seq_close(c, s), 0);
	s = hyb_ctx_seq_open_prefix(c, 80 + NGEN, a, 80, &reused);
	CHECK_EQ_INT(reused, 0);
	CHECK_EQ_INT(hyb_ctx_seq_close(c, s), 0);
	free(lg);
	hyb_ctx_free(c);
	hyb_model_free(m);
}

TEST(prefix_bad_calls)
{
	struct hyb_model *m = hyb_model_load(hyb_test_synth("pfx-bad", "--layers 1 --vocab 300"));
	struct hyb_ctx_params p = { .n_ctx = 64, .n_threads = 1, .n_seq = 2, .kv_size = 128 };
	int32_t t[4] = { 3, 4, 5, 6 };
	uint32_t reused;
	struct hyb_ctx *c;

	CHECK_MSG(m, "%s", hyb_last_error());
	c = hyb_ctx_new(m, &p);
	CHECK_MSG(c, "%s", hyb_last_error());
	CHECK_EQ_INT(hyb_ctx_seq_open_prefix(c, 8, t, 4, NULL), -EINVAL);
	CHECK_EQ_INT(hyb_ctx_seq_open_prefix(c, 8, NULL, 4, &reused), -EINVAL);
	CHECK_EQ_INT(hyb_ctx_seq_open_prefix(c, 0, t, 4, &reused), -EINVAL);
	CHECK_EQ_INT(hyb_ctx_seq_open_prefix(c, 65, t, 4, &reused), -EINVAL);
	CHECK_EQ_INT(hyb_ctx_seq_keep(c, 1, t, 4), -EINVAL);
	CHECK_EQ_INT(hyb_ctx_seq_keep(c, -1, t, 4), -EINVAL);
	CHECK_EQ_INT(hyb_ctx_seq_keep(c, 0, NULL, 4), -EINVAL);
	hyb_ctx_free(c);
	hyb_model_free(m);
}
