// SPDX-License-Identifier: MIT
/*
 * Several sequences in one context (hyb_ctx_seq_open, hyb_ctx_eval_seqs:
 * libhyb/forward/batch.c). The point is batch invariance: a sequence's
 * logits in a batch, joined and left by others at any step, equal bit for
 * bit those of a one-sequence context given the same tokens. Then the paged
 * cache's accounting (blocks back after close, reservations refused when
 * full) and bad calls.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hyb/error.h"
#include "hyb/model.h"
#include "test.h"

#define NSEQ 6
#define NGEN 12

/* Sequence i's prompt: lengths 1 .. 75 (one past n_batch 32, cut into pieces), its own ids. */
static uint32_t prompt(uint32_t i, uint32_t V, int32_t *out)
{
	static const uint32_t len[NSEQ] = { 5, 1, 75, 17, 40, 2 };

	for (uint32_t t = 0; t < len[i]; t++)
		out[t] = (int32_t)((t * 37 + i * 101 + 11) % (V - 3) + 3);
	return len[i];
}

/* Every step's logits of sequence i decoded alone: [1 + NGEN][V]. */
static float *alone(const struct hyb_model *m, uint32_t i, int threads)
{
	const uint32_t V = m->hp.n_vocab;
	struct hyb_ctx_params p = { .n_ctx = 256, .n_threads = threads, .n_batch = 32 };
	struct hyb_ctx *c = hyb_ctx_new(m, &p);
	float *lg = malloc(sizeof(float) * V * (NGEN + 1));
	int32_t toks[128];
	uint32_t n = prompt(i, V, toks);

	CHECK_MSG(c, "%s", hyb_last_error());
	CHECK(lg);
	CHECK_EQ_INT(hyb_ctx_eval(c, toks, n, lg, false), 0);
	for (uint32_t g = 0; g < NGEN; g++) {
		int32_t t = hyb_test_argmax(lg + (size_t)g * V, V);

		CHECK_EQ_INT(hyb_ctx_eval(c, &t, 1, lg + (size_t)(g + 1) * V, false), 0);
	}
	hyb_ctx_free(c);
	return lg;
}

/*
 * NSEQ sequences through one context of n_seq 4: sequence i joins at step
 * 2i (when one of 4 is free: the others wait, as a server's queue does),
 * its prompt beside the others' single tokens, and leaves after NGEN tokens. Returns how many steps' logits differed from
 * the sequence alone (every step is checked, none skipped).
 */
static uint32_t batched(const char *path, int threads, bool variant, uint32_t *steps)
{
	struct hyb_model *m = hyb_model_load(path);
	const uint32_t V = m ? m->hp.n_vocab : 0;
	struct hyb_ctx_params p = { .n_ctx = 256, .n_threads = threads, .n_batch = 32,
				    .n_seq = 4, .kv_size = 400, .batch_variant = variant };
	struct hyb_ctx *c;
	float *ref[NSEQ], *lg;
	int seq[NSEQ], gen[NSEQ];
	int32_t toks[NSEQ][128], next[NSEQ];
	uint32_t diff = 0, finished = 0;
	struct hyb_kv_stats st;

	CHECK_MSG(m, "%s", hyb_last_error());
	c = hyb_ctx_new(m, &p);
	CHECK_MSG(c, "%s", hyb_last_error());
	lg = malloc(sizeof(float) * V * NSEQ);
	CHECK(lg);
	for (uint32_t i = 0; i < NSEQ; i++) {
		ref[i] = alone(m, i, threads);
		seq[i] = -1;
		gen[i] = -1;
	}
	*steps = 0;
	for (uint32_t step = 0; finished < NSEQ; step++) {
		struct hyb_seq_tokens b[NSEQ];
		uint32_t nb = 0, who[NSEQ];

		CHECK(step < 200);
		for (uint32_t i = 0; i < NSEQ; i++) {
			if (gen[i] < 0 && step >= 2 * i) {
				uint32_t n = prompt(i, V, toks[i]);
				int s = hyb_ctx_seq_open(c, n + NGEN);

				if (s == -ENOSPC)
					continue; /* every sequence busy: wait */
				CHECK_MSG(s >= 0, "%s", hyb_last_error());
				seq[i] = s;
				gen[i] = 0;
				b[nb] = (struct hyb_seq_tokens){ s, toks[i], n };
			} else if (gen[i] >= 1 && gen[i] <= NGEN) {
				b[nb] = (struct hyb_seq_tokens){ seq[i], &next[i], 1 };
			} else {
				continue;
			}
			who[nb++] = i;
		}
		if (!nb)
			continue;
		CHECK_MSG(hyb_ctx_eval_seqs(c, b, nb, lg) == 0, "%s", hyb_last_error());
		for (uint32_t k = 0; k < nb; k++) {
			const uint32_t i = who[k];
			const float *want = ref[i] + (size_t)gen[i] * V, *got = lg + (size_t)k * V;

			diff += memcmp(want, got, sizeof(float) * V) != 0;
			(*steps)++;
			/* both follow the greedy path of the sequence alone */
			next[i] = hyb_test_argmax(want, V);
			if (++gen[i] == NGEN + 1) {
				CHECK_EQ_INT(hyb_ctx_seq_close(c, seq[i]), 0);
				seq[i] = -1;
				finished++;
			}
		}
	}
	hyb_ctx_kv_stats(c, &st);
	CHECK_EQ_INT(st.seqs, 0);
	CHECK_EQ_INT(st.used, 0);
	CHECK_EQ_INT(st.reserved, 0);
	for (uint32_t i = 0; i < NSEQ; i++)
		free(ref[i]);
	free(lg);
	hyb_ctx_free(c);
	hyb_model_free(m);
	return diff;
}

static void invariant(const char *name, const char *args, int threads)
{
	uint32_t steps, d = batched(hyb_test_synth(name, args), threads, false, &steps);

	CHECK_MSG(d == 0, "%s: %u of %u steps' logits differ from the sequence alone", name, d,
		  steps);
	CHECK_EQ_INT(steps, NSEQ * (NGEN + 1));
}

TEST(batch_llama_q8_0_same_bits_as_alone)
{
	invariant("llama-q8", "--layers 2 --vocab 300", 2);
}

TEST(batch_llama_q4_0_three_threads)
{
	invariant("llama-q4", "--layers 2 --type Q4_0 --kv-heads 2 --vocab 300", 3);
}

/* F16 and K-quant kernels sum in another order past a few columns: grouped as one column's */
TEST(batch_f16_and_k_quants_same_bits_as_alone)
{
	invariant("llama-f16", "--layers 2 --type F16 --vocab 300", 2);
	invariant("llama-q4k", "--layers 2 --type Q4_K --vocab 300", 2);
	invariant("llama-q6k", "--layers 2 --type Q6_K --output-type Q6_K --vocab 300", 2);
}

/* the control: without invariance F16's batched sums do differ (the test can fail) */
TEST(batch_variant_f16_differs)
{
	uint32_t steps, d = batched(hyb_test_synth("llama-f16v", "--layers 2 --type F16 --vocab 300"), 2,
				    true, &steps);

	CHECK_MSG(d > 0, "batch_variant changed nothing on F16 weights (%u steps)", steps);
}

TEST(batch_other_archs_same_bits_as_alone)
{
	invariant("qwen3moe", "--arch qwen3moe --experts 8 --experts-used 2 --layers 2 "
		  "--vocab 300", 2);
	invariant("gemma3", "--arch gemma3 --layers 3 --swa 8 --vocab 300 --type Q4_0", 2);
	invariant("deepseek2", "--arch deepseek2 --experts 8 --experts-used 2 --layers 2 "
		  "--head-dim 48 --vocab 300", 2);
	invariant("qwen2", "--arch qwen2 --layers 2 --vocab 300 --type Q5_0", 2);
	/* sinks, biases, a window; MXFP4 experts */
	invariant("gptoss", "--arch gpt-oss --experts 8 --experts-used 2 --layers 2 --swa 8 "
		  "--head-dim 64 --vocab 300 --type MXFP4", 2);
}

/* Blocks are promised at open and come back at close; a full cache says -ENOSPC, not a crash. */
TEST(batch_kv_blocks_promised_and_returned)
{
	struct hyb_model *m = hyb_model_load(hyb_test_synth("small", "--layers 1 --vocab 300"));
	struct hyb_ctx_params p = { .n_ctx = 64, .n_threads = 1, .n_seq = 3, .kv_size = 64 };
	struct hyb_ctx *c;
	struct hyb_kv_stats st;
	int32_t t[40];
	float *lg;
	int a, b;

	CHECK(m);
	c = hyb_ctx_new(m, &p);
	CHECK_MSG(c, "%s", hyb_last_error());
	lg = malloc(sizeof(float) * m->hp.n_vocab * 3);
	for (int i = 0; i < 40; i++)
		t[i] = 3 + i;
	CHECK_EQ_INT(hyb_ctx_seq_open(c, 0), -EINVAL);
	CHECK_EQ_INT(hyb_ctx_seq_open(c, 65), -EINVAL);
	a = hyb_ctx_seq_open(c, 40); /* 3 of 4 blocks */
	CHECK(a >= 0);
	CHECK_EQ_INT(hyb_ctx_seq_open(c, 40), -ENOSPC);
	b = hyb_ctx_seq_open(c, 16);
	CHECK(b >= 0 && b != a);
	CHECK_EQ_INT(hyb_ctx_seq_open(c, 1), -ENOSPC); /* every block promised */
	hyb_ctx_kv_stats(c, &st);
	CHECK_EQ_INT(st.block_pos, 16);
	CHECK_EQ_INT(st.blocks, 4);
	CHECK_EQ_INT(st.reserved, 4);
	CHECK_EQ_INT(st.used, 0); /* taken as positions are written */
	{
		struct hyb_seq_tokens bt[2] = { { a, t, 20 }, { b, t, 3 } };

		CHECK_EQ_INT(hyb_ctx_eval_seqs(c, bt, 2, lg), 0);
	}
	hyb_ctx_kv_stats(c, &st);
	CHECK_EQ_INT(st.used, 3);
	CHECK_EQ_INT(hyb_ctx_seq_pos(c, a), 20);
	CHECK_EQ_INT(hyb_ctx_seq_pos(c, b), 3);
	/* bad calls change nothing */
	{
		struct hyb_seq_tokens twice[2] = { { a, t, 1 }, { a, t, 1 } };
		struct hyb_seq_tokens past = { b, t, 14 }, closed = { 2, t, 1 }, none = { a, t, 0 };
		int32_t bad = (int32_t)m->hp.n_vocab;
		struct hyb_seq_tokens badtok = { a, &bad, 1 };

		CHECK_EQ_INT(hyb_ctx_eval_seqs(c, twice, 2, lg), -EINVAL);
		CHECK_EQ_INT(hyb_ctx_eval_seqs(c, &past, 1, lg), -ENOSPC);
		CHECK_EQ_INT(hyb_ctx_eval_seqs(c, &closed, 1, lg), -EINVAL);
		CHECK_EQ_INT(hyb_ctx_eval_seqs(c, &none, 1, lg), -EINVAL);
		CHECK_EQ_INT(hyb_ctx_eval_seqs(c, &badtok, 1, lg), -EINVAL);
		CHECK_EQ_INT(hyb_ctx_eval_seqs(c, NULL, 0, lg), -EINVAL);
	}
	CHECK_EQ_INT(hyb_ctx_seq_pos(c, a), 20);
	CHECK_EQ_INT(hyb_ctx_seq_close(c, a), 0);
	CHECK_EQ_INT(hyb_ctx_seq_close(c, a), -EINVAL);
	CHECK_EQ_INT(hyb_ctx_seq_close(c, 99), -EINVAL);
	hyb_ctx_kv_stats(c, &st);
	CHECK_EQ_INT(st.used, 1);
	CHECK_EQ_INT(st.reserved, 1);
	CHECK(hyb_ctx_seq_open(c, 48) >= 0); /* the freed blocks serve again */
	free(lg);
	hyb_ctx_free(c);
	hyb_model_free(m);
}

/* A one-sequence context has sequence 0, and the same calls work on it. */
TEST(batch_one_sequence_context)
{
	struct hyb_model *m = hyb_model_load(hyb_test_synth("one", "--layers 1 --vocab 300"));
	struct hyb_ctx_params p = { .n_ctx = 64, .n_threads = 1 };
	struct hyb_ctx *c;
	int32_t t[4] = { 5, 6, 7, 8 };
	float *a, *b;

	CHECK(m);
	c = hyb_ctx_new(m, &p);
	CHECK(c);
	a = malloc(sizeof(float) * m->hp.n_vocab);
	b = malloc(sizeof(float) * m->hp.n_vocab);
	CHECK_EQ_INT(hyb_ctx_seq_open(c, 10), 0);
	CHECK_EQ_INT(hyb_ctx_seq_open(c, 10), -ENOSPC);
	{
		struct hyb_seq_tokens bt = { 0, t, 4 };

		CHECK_EQ_INT(hyb_ctx_eval_seqs(c, &bt, 1, a), 0);
	}
	CHECK_EQ_INT(hyb_ctx_seq_pos(c, 0), 4);
	CHECK_EQ_INT(hyb_ctx_seq_close(c, 0), 0);
	CHECK_EQ_INT(hyb_ctx_seq_open(c, 10), 0); /* afresh */
	CHECK_EQ_INT(hyb_ctx_seq_pos(c, 0), 0);
	CHECK_EQ_INT(hyb_ctx_eval(c, t, 4, b, false), 0);
	CHECK(!memcmp(a, b, sizeof(float) * m->hp.n_vocab));
	free(a);
	free(b);
	hyb_ctx_free(c);
	hyb_model_free(m);
}

/*
 * Every token's logits of one entry (hyb_ctx_eval_seqs_all, a prompt's log
 * probabilities): the rows of hyb_ctx_eval's all_logits for the sequence
 * alone, across prompt pieces (n_batch 32, 75 tokens) and beside another
 * sequence's token; the other entry's logits unchanged.
 */
TEST(batch_every_token_logits)
{
	struct hyb_model *m = hyb_model_load(hyb_test_synth("q8", "--type Q8_0"));
	const uint32_t V = m ? m->hp.n_vocab : 0;
	struct hyb_ctx_params p = { .n_ctx = 256, .n_threads = 2, .n_batch = 32, .n_seq = 2 };
	struct hyb_ctx_params p1 = { .n_ctx = 256, .n_threads = 2, .n_batch = 32 };
	struct hyb_ctx *c, *one;
	int32_t toks[80], other[3] = { 7, 8, 9 };
	uint32_t n = prompt(2, V, toks);
	float *all, *want, *lg, *lg1;

	CHECK(m);
	c = hyb_ctx_new(m, &p);
	one = hyb_ctx_new(m, &p1);
	CHECK(c && one);
	all = malloc(sizeof(float) * V * n);
	want = malloc(sizeof(float) * V * n);
	lg = malloc(sizeof(float) * V * 2);
	lg1 = malloc(sizeof(float) * V);
	CHECK(all && want && lg && lg1);
	CHECK_EQ_INT(hyb_ctx_eval(one, toks, n, want, true), 0);
	{
		const int a = hyb_ctx_seq_open(c, n), b = hyb_ctx_seq_open(c, 8);
		struct hyb_seq_tokens bt[2] = { { b, other, 3 }, { a, toks, n } };
		float *const rows[2] = { NULL, all };

		CHECK(a >= 0 && b >= 0);
		CHECK_EQ_INT(hyb_ctx_eval_seqs_all(c, bt, 2, lg, rows), 0);
	}
	CHECK_MSG(!memcmp(all, want, sizeof(float) * V * n), "every token's logits differ "
		  "from the sequence alone");
	CHECK(!memcmp(lg + V, want + (size_t)(n - 1) * V, sizeof(float) * V));
	hyb_ctx_free(one);
	one = hyb_ctx_new(m, &p1);
	CHECK_EQ_INT(hyb_ctx_eval(one, other, 3, lg1, false), 0);
	CHECK(!memcmp(lg, lg1, sizeof(float) * V));
	free(all);
	free(want);
	free(lg);
	free(lg1);
	hyb_ctx_free(c);
	hyb_ctx_free(one);
	hyb_model_free(m);
}

/*
 * A plan (sparse FFNs) on the CPU: decode rows through the sparse operator,
 * prompt pieces dense, each row as its sequence alone: the same bits, on
 * one and on two threads.
 */
TEST(batch_plan_models_same_bits_as_alone)
{
	for (int threads = 1; threads <= 2; threads++) {
		uint32_t steps, d = batched(hyb_test_plan(), threads, false, &steps);

		CHECK_MSG(d == 0, "plan, %d threads: %u of %u steps' logits differ from the "
			  "sequence alone", threads, d, steps);
		CHECK_EQ_INT(steps, NSEQ * (NGEN + 1));
	}
}
