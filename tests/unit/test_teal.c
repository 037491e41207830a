// SPDX-License-Identifier: MIT
/*
 * TEAL input sparsity (hyb/sparsity.h, libhyb/sparse/teal.h,
 * docs/SPARSITY.md#teal): the input-sparse GEMV against a scalar reference
 * and across thread counts, the transposed layout against the weights it
 * comes from, calibration -> thresholds -> decode (one-token steps on the
 * transposed layout against the masked dense prompt path), and the bad
 * inputs each step refuses.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu_kernels.h"
#include "hyb/gguf.h"
#include "hyb/model.h"
#include "hyb/sparsity.h"
#include "hyb/tensor_type.h"
#include "hyb/threadpool.h"
#include "sparse/teal.h"
#include "test.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static float urand(void) /* [-1, 1) */
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static const char *bin(void)
{
	const char *b = getenv("HYB_BUILD");

	return b && *b ? b : "build";
}

/*
 * y = sum of x_i * row_i over |x_i| > thr, for each type the layout takes,
 * against float sums of the dequantized rows; and the same bits at 1, 2 and
 * 3 threads (each thread owns whole blocks of outputs).
 */
TEST(teal_gemv_matches_reference)
{
	enum { NI = 300, NO = 416 };
	const uint32_t types[] = { HYB_TYPE_F32, HYB_TYPE_F16, HYB_TYPE_Q8_0, HYB_TYPE_Q4_0 };
	const struct hyb_cpu_kernels *k = hyb_cpu_best();
	float *w = malloc(sizeof(float) * NI * NO), *deq = malloc(sizeof(float) * NI * NO);
	float x[NI], val[NI], ref[NO], y[3][NO];
	uint32_t idx[NI];

	CHECK(w && deq);
	for (size_t i = 0; i < (size_t)NI * NO; i++)
		w[i] = urand() * 0.1f;
	for (int i = 0; i < NI; i++) /* a heavy tail, as hidden states have */
		x[i] = urand() * (i % 17 ? 1.0f : 8.0f);
	for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
		const uint64_t rb = (hyb_row_bytes(types[t], NO) + 63) & ~63ull;
		char *data = aligned_alloc(64, rb * NI);
		struct hyb_teal_mat m = { .type = types[t], .n_in = NI, .n_out = NO,
					  .row_bytes = rb, .data = data };
		const float thr = 0.45f;
		uint32_t n_act[3], expect = 0;
		double top = 0, err = 0;

		CHECK(data);
		for (int i = 0; i < NI; i++) {
			CHECK(!hyb_quantize_row_ref(types[t], w + (size_t)i * NO, data + i * rb, NO));
			k->dequantize[types[t]](data + i * rb, deq + (size_t)i * NO, NO);
			expect += fabsf(x[i]) > thr;
		}
		for (int o = 0; o < NO; o++) {
			double s = 0;

			for (int i = 0; i < NI; i++)
				if (fabsf(x[i]) > thr)
					s += (double)x[i] * deq[(size_t)i * NO + o];
			ref[o] = (float)s;
			top = fmax(top, fabs(s));
		}
		for (int th = 1; th <= 3; th++) {
			struct hyb_threadpool *pool = hyb_threadpool_new(th);

			CHECK(pool);
			n_act[th - 1] = hyb_teal_gemv(pool, &m, x, thr, idx, val, y[th - 1]);
			hyb_threadpool_free(pool);
			CHECK_EQ_INT(n_act[th - 1], expect);
		}
		CHECK(expect > NI / 4 && expect < NI - NI / 4);
		CHECK_MSG(!memcmp(y[0], y[1], sizeof(y[0])) && !memcmp(y[0], y[2], sizeof(y[0])),
			  "%s: threads change the sums", hyb_type_name(types[t]));
		for (int o = 0; o < NO; o++)
			err = fmax(err, fabs(y[0][o] - ref[o]));
		/* the quantized axpy rounds each product to int8 on a shared scale */
		CHECK_MSG(err <= (types[t] == HYB_TYPE_F32 || types[t] == HYB_TYPE_F16 ? 1e-5 : 1e-2) *
				 top,
			  "%s: max error %g of %g", hyb_type_name(types[t]), err, top);
		free(data);
	}
	free(w);
	free(deq);
}

/*
 * Several rows at once (a batched pass's decode steps): each row's sums are
 * the one-row GEMV's bit for bit, for every type, 1 to HYB_TEAL_ROWS rows and
 * 1 to 3 threads; a matrix wider than a unit, so that rows meet at unit edges.
 */
TEST(teal_gemv_rows_equal_one_row_each)
{
	enum { NI = 1100, NO = 8256, R = HYB_TEAL_ROWS };
	const uint32_t types[] = { HYB_TYPE_F32, HYB_TYPE_F16, HYB_TYPE_Q8_0, HYB_TYPE_Q4_0 };
	float *w = malloc(sizeof(float) * NI * NO), *x = malloc(sizeof(float) * NI * R);
	float *y1 = malloc(sizeof(float) * NO * R), *yr = malloc(sizeof(float) * NO * R);
	float *val = malloc(sizeof(float) * NI * R);
	uint32_t *idx = malloc(sizeof(uint32_t) * NI * R), act[R];

	CHECK(w && x && y1 && yr && val && idx);
	for (size_t i = 0; i < (size_t)NI * NO; i++)
		w[i] = urand() * 0.1f;
	for (int i = 0; i < NI * R; i++)
		x[i] = urand() * (i % 13 ? 1.0f : 6.0f);
	for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
		const uint64_t rb = (hyb_row_bytes(types[t], NO) + 63) & ~63ull;
		char *data = aligned_alloc(64, rb * NI);
		struct hyb_teal_mat m = { .type = types[t], .n_in = NI, .n_out = NO,
					  .row_bytes = rb, .data = data };

		CHECK(data);
		for (int i = 0; i < NI; i++)
			CHECK(!hyb_quantize_row_ref(types[t], w + (size_t)i * NO, data + i * rb, NO));
		for (int th = 1; th <= 3; th++) {
			struct hyb_threadpool *pool = hyb_threadpool_new(th);

			CHECK(pool);
			for (uint32_t r = 0; r < R; r++) {
				const uint32_t n = hyb_teal_gemv(pool, &m, x + (size_t)r * NI, 0.5f, idx,
								 val, y1 + (size_t)r * NO);

				CHECK(n > NI / 4 && n < NI - NI / 4);
				act[r] = n;
			}
			for (uint32_t n = 1; n <= R; n += n < 3 ? 1 : 6) {
				uint32_t got[R];

				memset(yr, 0xff, sizeof(float) * NO * R);
				hyb_teal_gemv_rows(pool, &m, x, NI, n, 0.5f, idx, val, got, yr, NO);
				for (uint32_t r = 0; r < n; r++)
					CHECK_EQ_INT(got[r], act[r]);
				CHECK_MSG(!memcmp(y1, yr, sizeof(float) * NO * n),
					  "%s, %d threads, %u rows: not the one-row sums",
					  hyb_type_name(types[t]), th, n);
			}
			hyb_threadpool_free(pool);
		}
		free(data);
	}
	free(w);
	free(x);
	free(y1);
	free(yr);
	free(val);
	free(idx);
}

/* A small SiLU model of `type` and its TEAL profile (sparsity 0.5); each made once per type. */
static void make_model(const char *type, char *model, char *prof, size_t cap)
{
	char log[600];

	if (access(hyb_test_hybctl(), X_OK))
		SKIP("%s not built", hyb_test_hybctl());
	snprintf(model, cap, "%s/silu.%s.gguf", hyb_test_tmpdir(), type);
	snprintf(prof, cap, "%s/silu.%s.teal.gguf", hyb_test_tmpdir(), type);
	snprintf(log, sizeof(log), "%s/make.log", hyb_test_tmpdir());
	if (!access(prof, R_OK))
		return;
	if (hyb_test_sh(log, "(%s synth -o %s --hidden 128 --ffn 512 --layers 3 --heads 4 "
			"--vocab 512 --act silu --type %s -t 1 && "
			"%s profile %s --teal --sparsity 0.5 --gen 24 -t 1 -o %s)",
			hyb_test_hybctl(), model, type, hyb_test_hybctl(), model, prof)) {
		hyb_test_show_log(log);
		CHECK_MSG(0, "synth/profile --teal of a SiLU model failed");
	}
}

/* The transposed rows hold the weights' columns: exactly for F16, within half a step for Q8_0. */
TEST(teal_layout_is_the_transpose)
{
	const char *types[] = { "F16", "Q8_0" };
	const struct hyb_cpu_kernels *k = hyb_cpu_best();

	for (int t = 0; t < 2; t++) {
		char model[512], prof[512];
		struct hyb_model *m;
		struct hyb_threadpool *pool = hyb_threadpool_new(2);
		const struct hyb_teal *tl;

		make_model(types[t], model, prof, sizeof(model));
		m = hyb_model_load(model);
		CHECK_MSG(m && pool, "%s", hyb_last_error());
		tl = hyb_teal_layout(m, pool);
		CHECK_MSG(tl, "%s", hyb_last_error());
		CHECK(hyb_teal_layout(m, pool) == tl); /* once per model */
		for (uint32_t l = 0; l < m->hp.n_layer; l++) {
			const struct hyb_layer *L = &m->layers[l];
			const struct hyb_weight *src[4][3] = {
				{ &L->wq, &L->wk, &L->wv }, { &L->wo }, { &L->gate, &L->up },
				{ &L->down },
			};

			for (int in = 0; in < HYB_TEAL_INPUTS; in++) {
				const struct hyb_teal_mat *mt = &tl->mat[l * HYB_TEAL_INPUTS + in];
				float *row = malloc(sizeof(float) * mt->n_out);
				float *col = malloc(sizeof(float) * src[in][0]->ne0);
				float *want = malloc(sizeof(float) * mt->n_out);
				double worst = 0;

				CHECK(row && col && want && mt->n_in == src[in][0]->ne0);
				for (uint32_t i = 0; i < mt->n_in; i += 7) {
					uint32_t o = 0;

					k->dequantize[mt->type]((const char *)mt->data +
								i * mt->row_bytes, row, mt->n_out);
					for (int s = 0; s < 3 && src[in][s]; s++)
						for (uint64_t r = 0; r < src[in][s]->ne1; r++, o++) {
							const struct hyb_weight *w = src[in][s];

							k->dequantize[w->type]((const char *)w->data +
									       r * w->row_bytes,
									       col, w->ne0);
							want[o] = col[i];
						}
					CHECK_EQ_INT(o, mt->n_out);
					for (uint32_t b = 0; b < mt->n_out; b += 32) {
						float amax = 0;

						for (uint32_t e = b; e < b + 32 && e < mt->n_out; e++)
							amax = fmaxf(amax, fabsf(want[e]));
						for (uint32_t e = b; e < b + 32 && e < mt->n_out; e++) {
							const double d = fabs(row[e] - want[e]);

							if (t == 0)
								CHECK_MSG(d == 0, "layer %u %s row %u "
									  "col %u", l,
									  hyb_teal_input_name(in), i, e);
							/* half a step of the new block's scale, amax / 127 */
							worst = fmax(worst, amax > 0 ? d / (amax / 127)
										     : d);
						}
					}
				}
				/* + 127 ulps of the scale's F16: 0.5 + 127 / 2048 */
				CHECK_MSG(worst <= 0.5 + 127.0 / 2048, "layer %u %s: %g steps", l,
					  hyb_teal_input_name(in), worst);
				free(row);
				free(col);
				free(want);
			}
		}
		hyb_threadpool_free(pool);
		hyb_model_free(m);
	}
}

/*
 * Decode through the transposed layout against the same tokens all in one
 * prompt pass (masked dense kernels): the same function, so mostly the same
 * greedy picks; the share of inputs skipped near the target; with
 * thresholds 0 the layout computes the dense model (close logits).
 */
TEST(teal_decode_matches_masked_prompt)
{
	enum { N = 40, P = 8 };
	char model[512], prof[512];
	struct hyb_model *m;
	struct hyb_ctx *cd, *cb, *c0;
	struct hyb_ctx_params p = { .n_ctx = 64, .n_threads = 2 };
	float *thr, *zero, *ld, *lb, *l0;
	int32_t toks[N];
	struct hyb_teal_stats st;
	double worst = 0, worst0 = 0;
	uint32_t V, agree = 0;

	make_model("F16", model, prof, sizeof(model));
	m = hyb_model_load(model);
	CHECK_MSG(m, "%s", hyb_last_error());
	V = m->hp.n_vocab;
	thr = malloc(sizeof(float) * m->hp.n_layer * HYB_TEAL_INPUTS);
	zero = calloc(m->hp.n_layer * HYB_TEAL_INPUTS, sizeof(float));
	ld = malloc(sizeof(float) * V * N);
	lb = malloc(sizeof(float) * V * N);
	l0 = malloc(sizeof(float) * V * N);
	CHECK(thr && zero && ld && lb && l0);
	CHECK_MSG(!hyb_sparsity_teal_thresholds(prof, 0, thr, m->hp.n_layer), "%s",
		  hyb_last_error());
	cd = hyb_ctx_new(m, &p);
	cb = hyb_ctx_new(m, &p);
	c0 = hyb_ctx_new(m, &p);
	CHECK(cd && cb && c0);
	CHECK(!hyb_ctx_set_teal_thresholds(cd, thr) && !hyb_ctx_set_teal_thresholds(cb, thr));
	CHECK(hyb_ctx_teal_thresholds(cd) && !hyb_ctx_teal_thresholds(c0));
	/* a prompt, then each next token by the decode context's greedy pick */
	for (int i = 0; i < P; i++)
		toks[i] = 3 + (i * 40503) % (int)(V - 3);
	CHECK(!hyb_ctx_eval(cd, toks, P, ld + (size_t)(P - 1) * V, false));
	for (int i = P; i < N; i++) {
		toks[i] = hyb_test_argmax(ld + (size_t)(i - 1) * V, V);
		if (i + 1 < N)
			CHECK(!hyb_ctx_eval(cd, &toks[i], 1, ld + (size_t)i * V, false));
	}
	hyb_ctx_teal_stats(cd, &st);
	CHECK(st.inputs > 0 && st.bytes < st.dense_bytes);
	fprintf(stderr, "TEAL decode: %.3f of projection inputs skipped (target 0.5), %.3f of "
		"their bytes\n", 1.0 - (double)st.active / st.inputs,
		1.0 - (double)st.bytes / st.dense_bytes);
	CHECK_MSG(fabs(1.0 - (double)st.active / st.inputs - 0.5) < 0.15, "skipped %g",
		  1.0 - (double)st.active / st.inputs);
	{
		struct hyb_teal_stats sum = { 0 }, one;

		/* per layer and input, adding up to the whole */
		for (uint32_t l = 0; l < m->hp.n_layer; l++)
			for (uint32_t i = 0; i < HYB_TEAL_INPUTS; i++) {
				CHECK(!hyb_ctx_teal_layer_stats(cd, l, i, &one));
				CHECK(one.inputs > 0 && one.active <= one.inputs);
				sum.inputs += one.inputs;
				sum.active += one.active;
				sum.bytes += one.bytes;
			}
		CHECK(sum.inputs == st.inputs && sum.active == st.active && sum.bytes == st.bytes);
		CHECK(hyb_ctx_teal_layer_stats(cd, m->hp.n_layer, 0, &one) == -EINVAL);
		CHECK(hyb_ctx_teal_layer_stats(cd, 0, HYB_TEAL_INPUTS, &one) == -EINVAL);
	}
	hyb_ctx_teal_stats_reset(cd);
	hyb_ctx_teal_stats(cd, &st);
	CHECK(!st.inputs && !st.bytes);
	/* the whole sequence in one pass: masked inputs through the dense kernels */
	CHECK(!hyb_ctx_eval(cb, toks, N - 1, lb, true));
	for (int i = P - 1; i < N - 1; i++) {
		double top = 0, d = 0;

		for (uint32_t v = 0; v < V; v++) {
			top = fmax(top, fabs(lb[(size_t)i * V + v]));
			d = fmax(d, fabs(ld[(size_t)i * V + v] - lb[(size_t)i * V + v]));
		}
		worst = fmax(worst, d / top);
		agree += hyb_test_argmax(ld + (size_t)i * V, V) == hyb_test_argmax(lb + (size_t)i * V, V);
	}
	fprintf(stderr, "decode vs prompt pass: %u/%d greedy, max rel %.2g\n", agree, N - P,
		worst);
	/*
	 * Thresholding is discontinuous: the two ways of summing differ by
	 * ~1e-4 (below), which flips the inputs that sit at a threshold, and a
	 * random model carries each flip on. The greedy picks mostly agree; the
	 * operator itself is checked exactly above, the layout below.
	 */
	CHECK(agree >= (uint32_t)(N - P) * 3 / 4);
	/* thresholds 0: the transposed layout computes the dense model */
	CHECK(!hyb_ctx_set_teal_thresholds(cd, zero));
	hyb_ctx_reset(cd);
	CHECK(!hyb_ctx_eval(c0, toks, N - 1, l0, true));
	CHECK(!hyb_ctx_eval(cd, toks, P, ld, false));
	for (int i = P; i < N - 1; i++) {
		double top = 0, d = 0;

		CHECK(!hyb_ctx_eval(cd, &toks[i], 1, ld, false));
		for (uint32_t v = 0; v < V; v++) {
			top = fmax(top, fabs(l0[(size_t)i * V + v]));
			d = fmax(d, fabs(ld[v] - l0[(size_t)i * V + v]));
		}
		worst0 = fmax(worst0, d / top);
	}
	fprintf(stderr, "thresholds 0 vs dense: max rel %.2g\n", worst0);
	CHECK(worst0 < 5e-3);
	/* off again */
	CHECK(!hyb_ctx_set_teal_thresholds(cd, NULL) && !hyb_ctx_teal_thresholds(cd));
	hyb_ctx_free(cd);
	hyb_ctx_free(cb);
	hyb_ctx_free(c0);
	hyb_model_free(m);
	free(thr);
	free(zero);
	free(ld);
	free(lb);
	free(l0);
}

/*
 * Several sequences in one context (batch.c, docs/SERVE.md#teal): their
 * decode steps, batched beside each other and beside a prompt piece, give
 * each sequence the logits of its steps alone in a context of its own, bit
 * for bit, through TEAL's GEMV (the counts show it ran); with
 * batch_variant the batch's steps go through the dense GEMM instead.
 */
TEST(teal_batched_steps_are_each_alone)
{
	enum { S = 3, STEPS = 10, MAXT = 32 };
	char model[512], prof[512];
	struct hyb_model *m;
	struct hyb_ctx *cb, *cv, *c1;
	struct hyb_ctx_params pb = { .n_ctx = 64, .n_threads = 2, .n_seq = S, .kv_size = 3 * 64 };
	struct hyb_ctx_params p1 = { .n_ctx = 64, .n_threads = 2 };
	struct hyb_teal_stats st;
	int32_t toks[S][MAXT];
	uint32_t len[S] = { 5, 1, 7 }, V, piece[S][STEPS + 1][2], n_piece[S] = { 0 };
	float *thr, *lb, *lv, *l1, *want[S][STEPS + 1];
	int seq[S];
	uint32_t agree = 0, steps = 0;

	make_model("Q8_0", model, prof, sizeof(model));
	m = hyb_model_load(model);
	CHECK_MSG(m, "%s", hyb_last_error());
	V = m->hp.n_vocab;
	thr = malloc(sizeof(float) * m->hp.n_layer * HYB_TEAL_INPUTS);
	lb = malloc(sizeof(float) * V * S);
	lv = malloc(sizeof(float) * V * S);
	l1 = malloc(sizeof(float) * V);
	CHECK(thr && lb && lv && l1);
	CHECK(!hyb_sparsity_teal_thresholds(prof, 0, thr, m->hp.n_layer));
	cb = hyb_ctx_new(m, &pb);
	pb.batch_variant = true;
	cv = hyb_ctx_new(m, &pb);
	c1 = hyb_ctx_new(m, &p1);
	CHECK(cb && cv && c1);
	CHECK(!hyb_ctx_set_teal_thresholds(cb, thr) && !hyb_ctx_set_teal_thresholds(cv, thr) &&
	      !hyb_ctx_set_teal_thresholds(c1, thr));
	for (int s = 0; s < S; s++) {
		seq[s] = hyb_ctx_seq_open(cb, MAXT);
		CHECK(seq[s] >= 0 && hyb_ctx_seq_open(cv, MAXT) == seq[s]);
		for (uint32_t t = 0; t < len[s]; t++)
			toks[s][t] = 3 + (int32_t)((s * 977 + t * 40503) % (V - 3));
	}
	/* step 0: the prompts together; then one token each, except sequence 1 at
	 * step 4, which takes a piece of three beside the others' single tokens */
	for (uint32_t k = 0; k <= STEPS; k++) {
		struct hyb_seq_tokens b[S];
		uint32_t at[S];

		for (int s = 0; s < S; s++) {
			at[s] = k ? len[s] : 0;
			if (k) {
				const uint32_t n = s == 1 && k == 4 ? 3 : 1;

				toks[s][len[s]] = hyb_test_argmax(want[s][k - 1], V);
				for (uint32_t t = 1; t < n; t++)
					toks[s][len[s] + t] = 3 + (int32_t)((t * 131) % (V - 3));
				len[s] += n;
			}
			b[s] = (struct hyb_seq_tokens){ .seq = seq[s], .tokens = toks[s] + at[s],
							.n = len[s] - at[s] };
			piece[s][n_piece[s]][0] = at[s];
			piece[s][n_piece[s]++][1] = len[s] - at[s];
		}
		CHECK(!hyb_ctx_eval_seqs(cb, b, S, lb));
		CHECK(!hyb_ctx_eval_seqs(cv, b, S, lv));
		for (int s = 0; s < S; s++) {
			want[s][k] = malloc(sizeof(float) * V);
			CHECK(want[s][k]);
			memcpy(want[s][k], lb + (size_t)s * V, sizeof(float) * V);
			agree += hyb_test_argmax(lb + (size_t)s * V, V) ==
				 hyb_test_argmax(lv + (size_t)s * V, V);
		}
	}
	hyb_ctx_teal_stats(cb, &st);
	CHECK_MSG(st.inputs > 0 && st.bytes < st.dense_bytes, "the batch's steps skipped nothing");
	/* each sequence alone, piece after piece: the same bits */
	for (int s = 0; s < S; s++) {
		hyb_ctx_reset(c1);
		for (uint32_t k = 0; k < n_piece[s]; k++) {
			CHECK(!hyb_ctx_eval(c1, toks[s] + piece[s][k][0], piece[s][k][1], l1, false));
			CHECK_MSG(!memcmp(l1, want[s][k], sizeof(float) * V),
				  "sequence %d, step %u: batched logits differ from alone", s, k);
			steps++;
		}
	}
	CHECK_EQ_INT(steps, S * (STEPS + 1));
	/* batch_variant: the dense GEMM's sums, near TEAL's (thresholds flip some picks) */
	fprintf(stderr, "batch_variant: %u/%d greedy picks as the invariant batch's\n", agree,
		S * (STEPS + 1));
	CHECK(agree >= S * (STEPS + 1) / 2);
	for (int s = 0; s < S; s++)
		for (uint32_t k = 0; k <= STEPS; k++)
			free(want[s][k]);
	hyb_ctx_free(cb);
	hyb_ctx_free(cv);
	hyb_ctx_free(c1);
	hyb_model_free(m);
	free(thr);
	free(lb);
	free(lv);
	free(l1);
}

/*
 * hybctl profile --teal prints the profile's statistics of every input
 * group, the thresholds in force: each group's inputs active near the
 * target's complement (0.5), the figures in their ranges, the uniform and
 * independent baselines beside them.
 */
TEST(teal_profile_statistics)
{
	char model[512], prof[512], log[600];
	const char *names[HYB_TEAL_INPUTS] = { "qkv", "o", "gate_up", "down" };
	double act[HYB_TEAL_INPUTS] = { 0 }, hot[HYB_TEAL_INPUTS] = { 0 };
	double jac[HYB_TEAL_INPUTS] = { 0 }, ind[HYB_TEAL_INPUTS] = { 0 };
	char line[1024];
	FILE *f;
	int seen = 0;

	make_model("F16", model, prof, sizeof(model));
	snprintf(log, sizeof(log), "%s/stats.log", hyb_test_tmpdir());
	CHECK_EQ_INT(hyb_test_sh(log, "%s profile %s --teal --sparsity 0.5 --gen 24 -t 1",
				 hyb_test_hybctl(), model), 0);
	f = fopen(log, "r");
	CHECK(f);
	while (f && fgets(line, sizeof(line), f)) {
		for (int i = 0; i < HYB_TEAL_INPUTS; i++) {
			char name[16];
			unsigned dim;

			if (sscanf(line, "%15s %u inputs: active %lf, hot share %lf (80%% of activity, "
				   "all layers; uniform 0.800), jaccard %lf (independent %lf)", name,
				   &dim, &act[i], &hot[i], &jac[i], &ind[i]) == 6 &&
			    !strcmp(name, names[i]))
				seen |= 1 << i;
		}
	}
	if (f)
		fclose(f);
	CHECK_MSG(seen == (1 << HYB_TEAL_INPUTS) - 1, "statistics lines missing (%x)", seen);
	for (int i = 0; i < HYB_TEAL_INPUTS; i++) {
		CHECK_MSG(fabs(act[i] - 0.5) < 0.15, "%s: active %g at sparsity 0.5", names[i],
			  act[i]);
		CHECK(hot[i] > 0 && hot[i] <= 1 && jac[i] >= 0 && jac[i] <= 1);
		CHECK(fabs(ind[i] - (1 - act[i] / (2 - act[i]))) < 2e-3);
	}
}

/* What each step refuses, with a message naming the reason. */
TEST(teal_bad_input)
{
	char model[512], prof[512], log[600], glog[600], relu[600], cats[600];
	struct hyb_model *m;
	struct hyb_ctx *c;
	float thr[3 * HYB_TEAL_INPUTS] = { 0 }, t4[4 * HYB_TEAL_INPUTS];

	make_model("F16", model, prof, sizeof(model));
	snprintf(log, sizeof(log), "%s/bad.log", hyb_test_tmpdir());
	snprintf(glog, sizeof(glog), "%s/grep.log", hyb_test_tmpdir());
	m = hyb_model_load(model);
	CHECK(m);
	c = hyb_test_ctx(m, HYB_FFN_AUTO);
	thr[5] = -0.1f;
	CHECK(hyb_ctx_set_teal_thresholds(c, thr) == -EINVAL);
	CHECK(strstr(hyb_last_error(), "layer 1's o input"));
	thr[5] = NAN;
	CHECK(hyb_ctx_set_teal_thresholds(c, thr) == -EINVAL);
	CHECK(!hyb_ctx_teal_thresholds(c));
	/* not with CATS at once, either way round */
	thr[5] = 0.1f;
	CHECK(!hyb_ctx_set_teal_thresholds(c, thr));
	CHECK(hyb_ctx_set_ffn_thresholds(c, thr) == -EINVAL);
	CHECK(strstr(hyb_last_error(), "TEAL"));
	hyb_ctx_free(c);
	/* another model's profile, a sparsity outside (0, 1), a file of no profile */
	CHECK(hyb_sparsity_teal_thresholds(prof, 0.5, t4, 4) == -EINVAL);
	CHECK(strstr(hyb_last_error(), "another model"));
	CHECK(hyb_sparsity_teal_thresholds(prof, 1.0, thr, 3) == -EINVAL);
	CHECK(hyb_sparsity_teal_thresholds(model, 0.5, thr, 3) == -EINVAL);
	CHECK(strstr(hyb_last_error(), "--teal"));
	/* a TEAL profile where CATS is asked for, and a CATS one where TEAL is */
	CHECK(hyb_sparsity_thresholds(prof, 0.5, thr, 3) == -EINVAL);
	CHECK(strstr(hyb_last_error(), "teal profile, not cats"));
	snprintf(cats, sizeof(cats), "%s/cats.gguf", hyb_test_tmpdir());
	CHECK(!hyb_test_sh(log, "%s profile %s --sparsity 0.5 --gen 8 --samples 100 -t 1 -o %s",
			   hyb_test_hybctl(), model, cats));
	CHECK(hyb_sparsity_teal_thresholds(cats, 0.5, thr, 3) == -EINVAL);
	CHECK(strstr(hyb_last_error(), "cats profile, not teal"));
	hyb_model_free(m);

	/* a ReLU model: said, by the profile and by the context */
	snprintf(relu, sizeof(relu), "%s/relu.gguf", hyb_test_tmpdir());
	CHECK(!hyb_test_sh(log, "%s synth -o %s --hidden 128 --ffn 512 --layers 3 --heads 4 "
			   "--vocab 512 --act relu --type F16 -t 1", hyb_test_hybctl(), relu));
	CHECK(hyb_test_sh(log, "%s profile %s --teal -t 1", hyb_test_hybctl(), relu) == 1);
	CHECK(!hyb_test_sh(glog, "grep -q 'ReLU-family' %s", log));
	m = hyb_model_load(relu);
	CHECK(m);
	c = hyb_test_ctx(m, HYB_FFN_AUTO);
	CHECK(hyb_ctx_set_teal_thresholds(c, thr) == -EINVAL);
	CHECK(strstr(hyb_last_error(), "ReLU-family"));
	hyb_ctx_free(c);
	hyb_model_free(m);
	/* a weight type without the transposed layout: the thresholds still apply, dense */
	{
		char q5[600];
		float l1[512], l2[512];
		int32_t tk[4] = { 5, 9, 33, 7 };
		struct hyb_ctx *c2;
		struct hyb_teal_stats st;

		snprintf(q5, sizeof(q5), "%s/q5.gguf", hyb_test_tmpdir());
		CHECK(!hyb_test_sh(log, "%s synth -o %s --hidden 128 --ffn 512 --layers 3 "
				   "--heads 4 --vocab 512 --act silu --type Q5_0 -t 1",
				   hyb_test_hybctl(), q5));
		m = hyb_model_load(q5);
		CHECK(m && m->hp.n_vocab == 512);
		CHECK(hyb_teal_layout_check(m) == -EINVAL);
		CHECK(strstr(hyb_last_error(), "Q5_0"));
		c = hyb_test_ctx(m, HYB_FFN_AUTO);
		c2 = hyb_test_ctx(m, HYB_FFN_AUTO);
		for (int i = 0; i < 3 * HYB_TEAL_INPUTS; i++)
			thr[i] = 0.05f;
		CHECK_MSG(!hyb_ctx_set_teal_thresholds(c, thr), "%s", hyb_last_error());
		CHECK(!hyb_ctx_eval(c, tk, 3, l1, false) && !hyb_ctx_eval(c, tk + 3, 1, l1, false));
		CHECK(!hyb_ctx_eval(c2, tk, 3, l2, false) && !hyb_ctx_eval(c2, tk + 3, 1, l2, false));
		CHECK(memcmp(l1, l2, sizeof(l1))); /* masked: not the dense logits */
		hyb_ctx_teal_stats(c, &st);
		CHECK(st.inputs == 0); /* and no transposed layout */
		hyb_ctx_free(c);
		hyb_ctx_free(c2);
		hyb_model_free(m);
	}
	/* a plan needs no TEAL profile */
	CHECK(hyb_test_sh(log, "%s plan %s --profile %s --gpu-budget 64M -o %s/x.gguf",
			  hyb_test_hybctl(), model, prof, hyb_test_tmpdir()) != 0);
	CHECK(!hyb_test_sh(glog, "grep -q 'a TEAL profile' %s", log));
	/* hyb: --cats and --teal together; --teal with a CATS profile */
	CHECK(hyb_test_sh(log, "%s/hyb run -m %s -p hi -n 2 --teal %s --cats %s", bin(), model,
			  prof, cats) == 1);
	CHECK(!hyb_test_sh(glog, "grep -q 'one kind of activation sparsity' %s", log));
	CHECK(hyb_test_sh(log, "%s/hyb run -m %s -p hi -n 2 --teal %s --sparsity 0.3", bin(),
			  model, cats) == 1);
	CHECK(!hyb_test_sh(glog, "grep -q 'not teal' %s", log));
	CHECK(!hyb_test_sh(log, "%s/hyb run -m %s -p hi -n 4 --teal %s --sparsity 0.3", bin(),
			   model, prof));
	/* hyb bench --teal --parallel: the five ways; --kv-seqs means nothing there */
	CHECK_EQ_INT(hyb_test_sh(log, "%s/hyb bench -m %s --teal %s --sparsity 0.3 --parallel 3 "
				 "-p 4 -n 3 -r 1 -t 1", bin(), model, prof), 0);
	CHECK(!hyb_test_sh(glog, "grep -q '^TEAL, batch N, variant .* tokens/s' %s && "
			   "grep -q '^dense, one by one .* tokens/s' %s && "
			   "grep -q 'skipped .* of projection inputs' %s", log, log, log));
	CHECK(hyb_test_sh(log, "%s/hyb bench -m %s --teal %s --parallel 3 --kv-seqs 1", bin(),
			  model, prof) != 0);
	CHECK(!hyb_test_sh(glog, "grep -q 'batches of hybrid decoding' %s", log));
}

/*
 * Single blocks for calibration: a layer evaluated alone on the dense
 * inputs gives the next layer's dense input, bit for bit; thresholds change
 * it; bad calls are refused.
 */
TEST(teal_block_eval_chains)
{
	enum { N = 12 };
	char model[512], prof[512];
	struct hyb_model *m;
	struct hyb_ctx *c;
	int32_t tk[N];
	float *x, *out, thr[HYB_TEAL_INPUTS] = { 0.05f, 0.05f, 0.05f, 0.05f };

	make_model("F16", model, prof, sizeof(model));
	m = hyb_model_load(model);
	CHECK(m);
	c = hyb_test_ctx(m, HYB_FFN_AUTO);
	const size_t rows = (size_t)N * m->hp.n_embd;

	x = malloc(sizeof(float) * (m->hp.n_layer + 1) * rows);
	out = malloc(sizeof(float) * rows);
	CHECK(x && out);
	for (int i = 0; i < N; i++)
		tk[i] = 3 + 37 * i;
	CHECK_MSG(!hyb_ctx_block_inputs(c, tk, N, x), "%s", hyb_last_error());
	for (uint32_t l = 0; l < m->hp.n_layer; l++) {
		CHECK(!hyb_ctx_eval_block(c, l, x + l * rows, N, NULL, out));
		CHECK_MSG(!memcmp(out, x + (l + 1) * rows, sizeof(float) * rows), "layer %u", l);
		CHECK(!hyb_ctx_eval_block(c, l, x + l * rows, N, thr, out));
		CHECK(memcmp(out, x + (l + 1) * rows, sizeof(float) * rows));
	}
	CHECK(hyb_ctx_eval_block(c, m->hp.n_layer, x, N, NULL, out) == -EINVAL);
	CHECK(hyb_ctx_eval_block(c, 0, x, 0, NULL, out) == -EINVAL);
	tk[3] = -1;
	CHECK(hyb_ctx_block_inputs(c, tk, N, x) == -EINVAL);
	free(x);
	free(out);
	hyb_ctx_free(c);
	hyb_model_free(m);
}

/*
 * TEAL's greedy allocation: every layer's weighted sparsity is the level's,
 * each input within [0, 0.95]; thresholds follow the allocation; a sparsity
 * past the last level is refused.
 */
TEST(teal_greedy_allocation)
{
	char model[512], prof[512], greedy[600], log[600];
	struct hyb_model *m;
	struct hyb_gguf_file *f;
	const struct hyb_gguf_kv *a, *q;
	float thr[3 * HYB_TEAL_INPUTS];

	make_model("F16", model, prof, sizeof(model));
	snprintf(greedy, sizeof(greedy), "%s/greedy.gguf", hyb_test_tmpdir());
	snprintf(log, sizeof(log), "%s/greedy.log", hyb_test_tmpdir());
	if (hyb_test_sh(log, "%s profile %s --teal --greedy --alloc-tokens 48 --sparsity 0.5 "
			"--gen 24 -t 1 -o %s", hyb_test_hybctl(), model, greedy)) {
		hyb_test_show_log(log);
		CHECK_MSG(0, "hybctl profile --teal --greedy failed");
	}
	m = hyb_model_load(model);
	CHECK(m);
	CHECK(!hyb_gguf_open(greedy, &f));
	a = hyb_gguf_get_arr(f, HYB_SPARSITY_KEY_TEAL_ALLOC, HYB_GGUF_VT_FLOAT32);
	q = hyb_gguf_get_arr(f, HYB_SPARSITY_KEY_QUANTILES, HYB_GGUF_VT_FLOAT32);
	CHECK(a && q && a->v.arr.n == 3ull * HYB_TEAL_LEVELS * HYB_TEAL_INPUTS);
	for (uint32_t l = 0; l < 3; l++) {
		const struct hyb_layer *L = &m->layers[l];
		const double p[4] = {
			(double)L->wq.ne0 * (L->wq.ne1 + L->wk.ne1 + L->wv.ne1),
			(double)L->wo.ne0 * L->wo.ne1,
			(double)L->gate.ne0 * (L->gate.ne1 + L->up.ne1),
			(double)L->down.ne0 * L->down.ne1,
		};
		const double tot = p[0] + p[1] + p[2] + p[3];
		bool uneven = false;

		for (int k = 0; k < HYB_TEAL_LEVELS; k++) {
			float v[HYB_TEAL_INPUTS]; /* the file's arrays need not be aligned */
			double w = 0;

			memcpy(v, (const char *)a->v.arr.data + sizeof(v) *
				  ((size_t)l * HYB_TEAL_LEVELS + k), sizeof(v));

			for (int i = 0; i < HYB_TEAL_INPUTS; i++) {
				CHECK(v[i] >= 0 && v[i] <= 0.95f + 1e-6f);
				w += p[i] * v[i] / tot;
				uneven |= fabsf(v[i] - v[0]) > 1e-3f;
			}
			CHECK_MSG(fabs(w - k * HYB_TEAL_STEP) < 1e-4, "layer %u level %d: %g", l, k, w);
		}
		CHECK(uneven); /* a search, not the uniform split */
	}
	/* thresholds: each input's quantile at its allocated sparsity */
	CHECK(!hyb_sparsity_teal_thresholds(greedy, 0.3, thr, 3));
	for (uint32_t i = 0; i < 3 * HYB_TEAL_INPUTS; i++) {
		float qq[HYB_SPARSITY_N_QUANTILES], al[3 * HYB_TEAL_LEVELS * HYB_TEAL_INPUTS];
		double s;

		memcpy(qq, (const char *)q->v.arr.data + sizeof(qq) * i, sizeof(qq));
		memcpy(al, a->v.arr.data, sizeof(al));
		s = hyb_teal_alloc_at(al, i / HYB_TEAL_INPUTS, i % HYB_TEAL_INPUTS, 0.3);

		CHECK_NEAR(thr[i], hyb_sparsity_quantile_at(qq, s), 1e-6 * (thr[i] + 1e-6));
	}
	CHECK(hyb_sparsity_teal_thresholds(greedy, 0.85, thr, 3) == -EINVAL);
	CHECK(strstr(hyb_last_error(), "up to 0.80"));
	hyb_gguf_close(f);
	hyb_model_free(m);
}

/* TEAL decoding (Q8_0, the integer axpy) gives the same bytes every run and at 2 and 3 threads. */
TEST(teal_deterministic)
{
	enum { P = 10, G = 12 };
	char model[512], prof[512];
	struct hyb_model *m;
	float *thr, *first = NULL;
	size_t len;

	make_model("Q8_0", model, prof, sizeof(model));
	m = hyb_model_load_streaming(model);
	CHECK_MSG(m, "%s", hyb_last_error());
	thr = malloc(sizeof(float) * m->hp.n_layer * HYB_TEAL_INPUTS);
	CHECK(thr && !hyb_sparsity_teal_thresholds(prof, 0.4, thr, m->hp.n_layer));
	len = sizeof(float) * m->hp.n_vocab * G;
	for (int run = 0; run < 4; run++) {
		struct hyb_ctx_params p = { .n_ctx = 64, .n_threads = 2 + run % 2 };
		struct hyb_ctx *c = hyb_ctx_new(m, &p);
		float *lg = malloc(len);
		int32_t tk[P];

		CHECK(c && lg);
		CHECK_MSG(!hyb_ctx_set_teal_thresholds(c, thr), "%s", hyb_last_error());
		for (int i = 0; i < P; i++)
			tk[i] = 5 + 31 * i;
		CHECK(!hyb_ctx_eval(c, tk, P, lg, false));
		for (int i = 1; i < G; i++) {
			int32_t t = hyb_test_argmax(lg + (size_t)(i - 1) * m->hp.n_vocab,
						    m->hp.n_vocab);

			CHECK(!hyb_ctx_eval(c, &t, 1, lg + (size_t)i * m->hp.n_vocab, false));
		}
		if (!first)
			first = lg;
		else
			CHECK_MSG(!memcmp(first, lg, len), "run %d (%d threads) differs", run,
				  p.n_threads);
		if (lg != first)
			free(lg);
		hyb_ctx_free(c);
	}
	free(first);
	free(thr);
	hyb_model_free(m);
}
