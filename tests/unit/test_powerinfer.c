// SPDX-License-Identifier: MIT
/*
 * PowerInfer's own files as input. tests/oracle/
 * powerinfer_gguf.py writes a small synthetic ReLU model out the way
 * PowerInfer's converter and export_split.py lay out theirs (ffn_down_t,
 * fc1/fc2 predictors, powerinfer.sparse_threshold; a PWRI GPU index), with
 * the gguf package, independently of hyb's writer. Then:
 *   - hyb decodes the PowerInfer file as it decodes the source model;
 *   - hybctl plan keeps its down rows, predictors and threshold bit for bit
 *     (permuted into bundle order) and places groups by its GPU index;
 *   - the imported predictor, fed what PowerInfer feeds it (the layer's own
 *     residual after attention, not normalised), gives PowerInfer's scores;
 *   - sparse decoding with an exact predictor agrees with dense decoding;
 *   - bad files get a clear error.
 * Skips when the Python environment cannot be built here.
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
#include "hyb/plan.h"
#include "hyb/tokenizer.h"
#include "sparse/sparse_layer.h"
#include "test.h"

#define PI_PY ".venv/bin/python tests/oracle/powerinfer_gguf.py"

struct pi_files {
	char src[512], model[512], gpuidx[512], profile[512], plan[512];
};

/* Source model, its PowerInfer form (py_opts for powerinfer_gguf.py) and a GPU index. */
static void make_model(struct pi_files *f, const char *py_opts)
{
	const char *d = hyb_test_tmpdir();
	char log[512];
	int rc;

	hyb_test_need_venv();
	if (access(hyb_test_hybctl(), X_OK))
		SKIP("%s not built (run from the repository root after make)", hyb_test_hybctl());
	snprintf(f->src, sizeof(f->src), "%s/src.gguf", d);
	snprintf(f->model, sizeof(f->model), "%s/pi.gguf", d);
	snprintf(f->gpuidx, sizeof(f->gpuidx), "%s/pi.gpuidx", d);
	snprintf(f->profile, sizeof(f->profile), "%s/pi.profile.gguf", d);
	snprintf(f->plan, sizeof(f->plan), "%s/pi.plan.gguf", d);
	snprintf(log, sizeof(log), "%s/make.log", d);
	rc = hyb_test_sh(log, "%s synth -o '%s' --hidden 256 --ffn 512 --layers 2 --heads 4 "
			 "--vocab 512 --act relu --type F16 -t 1 && " PI_PY " '%s' '%s' "
			 "--gpu-index '%s' %s", hyb_test_hybctl(), f->src, f->src, f->model,
			 f->gpuidx, py_opts);
	if (rc)
		hyb_test_show_log(log);
	CHECK_MSG(rc == 0, "making the PowerInfer model failed (exit %d)", rc);
}

/* hybctl profile + plan of the PowerInfer model; the plan's exit status (log in *.log). */
static int make_plan(struct pi_files *f, const char *hyb_plan_opts, char *log, size_t loglen)
{
	int rc;

	snprintf(log, loglen, "%s/plan.log", hyb_test_tmpdir());
	rc = hyb_test_sh(log, "%s profile '%s' -o '%s' --gen 32 -t 1", hyb_test_hybctl(),
			 f->model, f->profile);
	if (rc) {
		hyb_test_show_log(log);
		CHECK_MSG(0, "hybctl profile of the PowerInfer model failed (exit %d)", rc);
	}
	return hyb_test_sh(log, "%s plan '%s' --profile '%s' -o '%s' -t 1 %s", hyb_test_hybctl(),
			   f->model, f->profile, f->plan, hyb_plan_opts);
}

static struct hyb_model *load(const char *path)
{
	struct hyb_model *m = hyb_model_load_mode(path, HYB_LOAD_MMAP);

	CHECK_MSG(m, "%s: %s", path, hyb_last_error());
	return m;
}

static const struct hyb_gguf_tensor *tensor(const struct hyb_gguf_file *g, uint32_t l, const char *sfx)
{
	char name[96];
	const struct hyb_gguf_tensor *t;

	snprintf(name, sizeof(name), "blk.%u.%s", l, sfx);
	t = hyb_gguf_find_tensor(g, name);
	CHECK_MSG(t, "%s is missing", name);
	return t;
}

TEST(pi_model_decodes_like_its_source)
{
	struct pi_files f;

	make_model(&f, "--predictor random --hidden 32");
	struct hyb_model *src = load(f.src), *pi = load(f.model);
	struct hyb_test_agreement r = { 0 };

	CHECK(!src->powerinfer && pi->powerinfer);
	/* no hyb.ffn_act in PowerInfer's files: ReLU, as its llama.cpp computes them */
	CHECK_EQ_INT(pi->hp.act, HYB_ACT_RELU);
	CHECK_EQ_INT(src->hp.act, HYB_ACT_RELU);
	for (uint32_t l = 0; l < pi->hp.n_layer; l++) {
		const struct hyb_layer *L = &pi->layers[l];

		CHECK(!L->down.data && L->down_t.data);
		CHECK_EQ_INT(L->down_t.ne0, pi->hp.n_embd);
		CHECK_EQ_INT(L->down_t.ne1, pi->hp.n_ff);
	}
	struct hyb_ctx *a = hyb_test_ctx(src, HYB_FFN_DENSE), *b = hyb_test_ctx(pi, HYB_FFN_DENSE);

	for (uint32_t s = 0; s < 3; s++)
		hyb_test_greedy_compare(a, b, src->hp.n_vocab, 1 + s, 12, 16, 0, &r);
	printf("    agreement %u/%u, largest logit difference %.2g of the largest logit\n",
	       r.agree, r.total, r.max_rel);
	/* the same F16 weights; down runs as axpy over float activations instead
	 * of a dot with activations rounded to F16 */
	CHECK_EQ_INT(r.agree, r.total);
	CHECK_MSG(r.max_rel < 2e-2, "logits differ by %g of the largest", r.max_rel);
	hyb_ctx_free(a);
	hyb_ctx_free(b);
	hyb_model_free(src);
	hyb_model_free(pi);
}

/*
 * Groups of plan p placed by GPU index gi: with equal-size groups a placed
 * one holds at least as many of the index's GPU neurons as any left on the
 * CPU (else swapping wins). Returns the groups placed.
 */
static uint32_t placed_by_index(const struct hyb_model *p, const struct hyb_gguf_file *gi)
{
	const uint32_t F = p->hp.n_ff, GS = p->group_size;
	uint32_t placed = 0;

	for (uint32_t l = 0; l < p->hp.n_layer; l++) {
		const struct hyb_ffn_plan *P = &p->layers[l].plan;
		const struct hyb_gguf_tensor *hot = tensor(gi, l, "gpu_idx");
		uint32_t hot_in[64] = { 0 };
		int32_t lo_placed = INT32_MAX, hi_unplaced = -1;

		CHECK(p->n_groups <= 64 && hot->type == HYB_TYPE_I32 && hot->ne[0] == F);
		for (uint32_t i = 0; i < F; i++)
			hot_in[i / GS] += ((const int32_t *)hot->data)[P->perm[i]];
		for (uint32_t g = 0; g < p->n_groups && (g + 1) * GS <= F; g++) {
			if (P->gpu[g]) {
				lo_placed = hot_in[g] < (uint32_t)lo_placed ? (int32_t)hot_in[g]
									    : lo_placed;
				placed++;
			} else if ((int32_t)hot_in[g] > hi_unplaced) {
				hi_unplaced = (int32_t)hot_in[g];
			}
		}
		CHECK_MSG(hi_unplaced < 0 || lo_placed == INT32_MAX || lo_placed >= hi_unplaced,
			  "layer %u: a group with %d GPU neurons placed, one with %d not", l,
			  lo_placed, hi_unplaced);
	}
	return placed;
}

TEST(pi_plan_keeps_powerinfer_weights_and_split)
{
	const float t = 0.05f;
	struct pi_files f;
	char log[512], opts[640];
	int rc;

	snprintf(opts, sizeof(opts), "--predictor random --hidden 48 --threshold %g", t);
	make_model(&f, opts);
	/* a budget for about half of the groups: dense part + predictors + groups */
	snprintf(opts, sizeof(opts), "--gpu-budget 2.3M --group-size 32 --gpu-index '%s'",
		 f.gpuidx);
	rc = make_plan(&f, opts, log, sizeof(log));
	if (rc)
		hyb_test_show_log(log);
	CHECK_MSG(rc == 0, "hybctl plan failed (exit %d)", rc);

	struct hyb_model *pi = load(f.model), *p = load(f.plan);
	const float bias = -nextafterf(t, -INFINITY);
	struct hyb_gguf_file *gi;
	uint32_t placed = 0;

	CHECK_EQ_INT(p->pred_input, HYB_PRED_SAME_LAYER);
	CHECK_EQ_INT(p->hp.act, HYB_ACT_RELU);
	CHECK(!p->powerinfer);
	CHECK_MSG(!hyb_gguf_open(f.gpuidx, &gi), "%s", hyb_last_error());
	CHECK_EQ_INT(gi->magic, HYB_GGUF_MAGIC_PWRI);
	for (uint32_t l = 0; l < p->hp.n_layer; l++) {
		const struct hyb_layer *L = &p->layers[l], *S = &pi->layers[l];
		const struct hyb_ffn_plan *P = &L->plan;
		const struct hyb_gguf_tensor *fc1 = tensor(pi->gguf, l, "fc1.weight");
		const struct hyb_gguf_tensor *fc2 = tensor(pi->gguf, l, "fc2.weight");
		const uint32_t F = p->hp.n_ff, H = (uint32_t)fc1->ne[1], GS = p->group_size;
		const uint64_t rb = P->bundles.row_bytes;
		const uint16_t *w2 = fc2->data;

		CHECK_EQ_INT(P->hidden, H);
		CHECK_EQ_INT(P->fc1.type, HYB_TYPE_F16);
		/* fc1 as PowerInfer stored it, biases that fold in the threshold */
		CHECK(!memcmp(P->fc1.data, fc1->data, (size_t)H * p->hp.n_embd * 2));
		for (uint32_t h = 0; h < H; h++)
			CHECK(P->fc1_bias[h] == 0);
		for (uint32_t i = 0; i < F; i++) {
			const uint32_t g = i / GS, ng = F - g * GS < GS ? F - g * GS : GS;
			const uint32_t k = i - g * GS, s = (uint32_t)P->perm[i];
			const char *base = (const char *)P->bundles.data + 3ull * g * GS * rb;

			CHECK(P->fc2_bias[i] == bias);
			/* bundle rows: the source neuron's gate, up and down_t rows, as they are */
			CHECK(!memcmp(base + (uint64_t)k * rb,
				      (const char *)S->gate.data + s * S->gate.row_bytes, rb));
			CHECK(!memcmp(base + (uint64_t)(ng + k) * rb,
				      (const char *)S->up.data + s * S->up.row_bytes, rb));
			CHECK(!memcmp(base + (uint64_t)(2 * ng + k) * rb,
				      (const char *)S->down_t.data + s * S->down_t.row_bytes, rb));
			/* fc2 transposed: unit h's weight to bundle neuron i */
			for (uint32_t h = 0; h < H; h++)
				CHECK(((const uint16_t *)P->fc2.data)[(size_t)h * F + i] ==
				      w2[(size_t)s * H + h]);
		}
	}
	placed = placed_by_index(p, gi);
	printf("    %u of %u groups placed, by the GPU index\n", placed,
	       p->hp.n_layer * p->n_groups);
	CHECK_MSG(placed > 0 && placed < p->hp.n_layer * p->n_groups - 2,
		  "%u groups placed: the budget should fit some, not all", placed);
	hyb_gguf_close(gi);
	hyb_model_free(pi);
	hyb_model_free(p);
}

struct capture {
	uint32_t n_embd, n, cap;
	float *x;      /* [cap][n_layer][n_embd] */
	uint32_t n_layer;
};

static void probe(void *user, uint32_t layer, uint32_t pos0, uint32_t n, const float *x_attn,
		  const float *act)
{
	struct capture *c = user;
	(void)act;

	for (uint32_t t = 0; t < n; t++) {
		const uint32_t pos = pos0 + t;

		if (pos < c->cap)
			memcpy(c->x + ((size_t)pos * c->n_layer + layer) * c->n_embd,
			       x_attn + (size_t)t * c->n_embd, sizeof(float) * c->n_embd);
		if (pos + 1 > c->n)
			c->n = pos + 1;
	}
}

/* PowerInfer's score of every neuron for x, in double from the file's F16 weights. */
static void pi_scores(const struct hyb_gguf_tensor *fc1, const struct hyb_gguf_tensor *fc2,
		      const float *x, uint32_t E, uint32_t F, double *score)
{
	const uint32_t H = (uint32_t)fc1->ne[1];
	const uint16_t *w1 = fc1->data, *w2 = fc2->data;
	double *h = malloc(sizeof(double) * H);

	CHECK(h);
	for (uint32_t j = 0; j < H; j++) {
		double s = 0;

		for (uint32_t e = 0; e < E; e++)
			s += (double)hyb_f16_to_f32(w1[(size_t)j * E + e]) * x[e];
		h[j] = s > 0 ? s : 0;
	}
	for (uint32_t i = 0; i < F; i++) {
		double s = 0;

		for (uint32_t j = 0; j < H; j++)
			s += (double)hyb_f16_to_f32(w2[(size_t)i * H + j]) * h[j];
		score[i] = s;
	}
	free(h);
}

TEST(pi_imported_predictor_reads_the_layers_own_residual)
{
	const float t = 0.05f;
	struct pi_files f;
	char log[512], opts[64];

	snprintf(opts, sizeof(opts), "--predictor random --hidden 48 --threshold %g", t);
	make_model(&f, opts);
	CHECK_EQ_INT(make_plan(&f, "--gpu-budget 16M", log, sizeof(log)), 0);

	struct hyb_model *pi = load(f.model), *p = load(f.plan);
	const uint32_t E = pi->hp.n_embd, F = pi->hp.n_ff, NL = pi->hp.n_layer;
	struct capture cap = { .n_embd = E, .cap = 12, .n_layer = NL };
	struct hyb_ctx *c = hyb_test_ctx(pi, HYB_FFN_DENSE);
	double *score = malloc(sizeof(double) * F), worst = 0, worst_rms = 0, scale = 0;
	float *logit = malloc(sizeof(float) * F), *xr = malloc(sizeof(float) * E);
	uint32_t *active = malloc(sizeof(uint32_t) * F), decided = 0, agree = 0;
	int32_t toks[12];
	void *scratch;

	cap.x = malloc(sizeof(float) * cap.cap * NL * E);
	CHECK(score && logit && xr && active && cap.x);
	for (int i = 0; i < 12; i++)
		toks[i] = 5 + 37 * i;
	hyb_ctx_set_ffn_probe(c, probe, &cap);
	float *lg = malloc(sizeof(float) * pi->hp.n_vocab);

	CHECK(lg);
	CHECK_MSG(!hyb_ctx_eval(c, toks, 12, lg, false), "%s", hyb_last_error());
	free(lg);
	CHECK_EQ_INT(cap.n, 12);
	for (uint32_t l = 0; l < NL; l++) {
		const struct hyb_ffn_plan *P = &p->layers[l].plan;
		const struct hyb_predictor pr = {
			.n_in = E, .hidden = P->hidden, .n_out = F, .fc1_w = P->fc1.data,
			.fc1_b = P->fc1_bias, .fc2_w = P->fc2.data, .fc2_b = P->fc2_bias,
		};

		CHECK(!posix_memalign(&scratch, 64, hyb_predictor_scratch_bytes(&pr) + 64));
		for (uint32_t tok = 0; tok < cap.n; tok++) {
			const float *x = cap.x + ((size_t)tok * NL + l) * E;
			double rms = 0;

			pi_scores(tensor(pi->gguf, l, "fc1.weight"),
				  tensor(pi->gguf, l, "fc2.weight"), x, E, F, score);
			hyb_predictor_run(&pr, x, NULL, scratch, logit, active);
			for (uint32_t i = 0; i < F; i++)
				scale = fmax(scale, fabs(score[i] - t));
			for (uint32_t i = 0; i < F; i++) {
				/* bundle neuron i is source neuron perm[i] */
				const double want = score[P->perm[i]] - t;

				worst = fmax(worst, fabs(logit[i] - want));
				/* decisions away from the threshold must be PowerInfer's */
				if (fabs(want) > 0.02 * scale) {
					decided++;
					agree += (logit[i] > 0) == (want >= 0);
				}
			}
			/* the same predictor on the unit-RMS input (the adjacent
			 * convention) must be far off, or this test proves nothing */
			for (uint32_t e = 0; e < E; e++)
				rms += (double)x[e] * x[e];
			rms = sqrt(rms / E);
			for (uint32_t e = 0; e < E; e++)
				xr[e] = (float)(x[e] / rms);
			hyb_predictor_run(&pr, xr, NULL, scratch, logit, active);
			for (uint32_t i = 0; i < F; i++)
				worst_rms = fmax(worst_rms,
						 fabs(logit[i] - (score[P->perm[i]] - t)));
		}
		free(scratch);
	}
	printf("    largest logit error %.3g (scale %.3g; on unit-RMS input %.3g); %u/%u "
	       "decisions agree\n", worst, scale, worst_rms, agree, decided);
	/* F16 input and F32 accumulation against double */
	CHECK_MSG(worst < 0.01 * scale, "logit off by %g (scale %g)", worst, scale);
	CHECK_MSG(worst_rms > 10 * worst, "normalising the input changes little (%g vs %g)",
		  worst_rms, worst);
	CHECK(decided > 1000);
	CHECK_EQ_INT(agree, decided);
	free(cap.x);
	free(score);
	free(logit);
	free(xr);
	free(active);
	hyb_ctx_free(c);
	hyb_model_free(pi);
	hyb_model_free(p);
}

TEST(pi_sparse_decode_with_exact_predictors_matches_dense)
{
	struct pi_files f;
	char log[512];

	/* fc1 = gate * ffn_norm, fc2 = I: score > 0 exactly when a neuron fires */
	make_model(&f, "--predictor exact --threshold 1e-6");
	CHECK_EQ_INT(make_plan(&f, "--gpu-budget 16M", log, sizeof(log)), 0);

	struct hyb_model *m = load(f.plan);
	struct hyb_ctx *d = hyb_test_ctx(m, HYB_FFN_DENSE), *s = hyb_test_ctx(m, HYB_FFN_SPARSE);
	struct hyb_sparse_stats st, st2;
	struct hyb_test_agreement r = { 0 };

	for (uint32_t q = 0; q < 3; q++)
		hyb_test_greedy_compare(d, s, m->hp.n_vocab, 10 + q, 12, 20, 0, &r);
	hyb_ctx_sparse_stats(s, &st);
	printf("    agreement %u/%u, predicted %.1f%%, fired %.1f%%, logits within %.2g\n",
	       r.agree, r.total, 100.0 * st.predicted / st.neurons,
	       100.0 * st.nonzero / st.neurons, r.max_rel);
	CHECK_MSG(r.agree * 100 >= r.total * 95, "greedy agreement %u/%u", r.agree, r.total);
	CHECK_MSG(st.predicted < st.neurons / 2, "predicted %llu of %llu",
		  (unsigned long long)st.predicted, (unsigned long long)st.neurons);
	/* exact: nearly everything predicted fires (F16 rounding aside) */
	CHECK_MSG(st.nonzero * 100 >= st.predicted * 95, "%llu of %llu predicted fire",
		  (unsigned long long)st.nonzero, (unsigned long long)st.predicted);
	/* the per-layer figures add up to the whole, and each layer ran */
	{
		struct hyb_sparse_stats ls, sum = { 0 };

		for (uint32_t l = 0; l <= m->hp.n_layer; l++) {
			hyb_ctx_sparse_layer_stats(s, l, &ls);
			CHECK(l < m->hp.n_layer ? ls.layer_steps > 0 : ls.layer_steps == 0);
			CHECK(ls.nonzero <= ls.predicted && ls.predicted <= ls.neurons);
			sum.layer_steps += ls.layer_steps;
			sum.neurons += ls.neurons;
			sum.predicted += ls.predicted;
			sum.nonzero += ls.nonzero;
		}
		CHECK(sum.layer_steps == st.layer_steps && sum.neurons == st.neurons &&
		      sum.predicted == st.predicted && sum.nonzero == st.nonzero);
	}
	hyb_ctx_free(s);

	/* fed the other convention's input, the same predictors predict other sets */
	m->pred_input = HYB_PRED_ADJACENT;
	s = hyb_test_ctx(m, HYB_FFN_SPARSE);
	r = (struct hyb_test_agreement){ 0 };
	for (uint32_t q = 0; q < 3; q++)
		hyb_test_greedy_compare(d, s, m->hp.n_vocab, 10 + q, 12, 20, 0, &r);
	hyb_ctx_sparse_stats(s, &st2);
	printf("    adjacent input instead: predicted %.1f%%, fired %.2f%% of them (%.2f%% "
	       "same-layer)\n", 100.0 * st2.predicted / st2.neurons,
	       100.0 * st2.nonzero / st2.predicted, 100.0 * st.nonzero / st.predicted);
	/* (the synthetic model's adjacent layers are alike by design: close, not equal) */
	CHECK((double)st2.nonzero / st2.predicted < (double)st.nonzero / st.predicted - 0.02);
	hyb_ctx_free(d);
	hyb_ctx_free(s);
	hyb_model_free(m);
}

/* A Q4_0 file whose n_ff is no multiple of 32: ggml's axpy cannot quantize its h (nor can hyb's). */
TEST(pi_refuses_sparse_q4_0_with_odd_n_ff)
{
	const char *d = hyb_test_tmpdir();
	char src[512], pi[512], log[512];
	struct hyb_model *m;
	struct hyb_ctx_params p = { .n_ctx = 64, .n_threads = 1, .ffn = HYB_FFN_SPARSE };
	int rc;

	hyb_test_need_venv();
	if (access(hyb_test_hybctl(), X_OK))
		SKIP("%s not built (run from the repository root after make)", hyb_test_hybctl());
	snprintf(src, sizeof(src), "%s/odd.gguf", d);
	snprintf(pi, sizeof(pi), "%s/odd.pi.gguf", d);
	snprintf(log, sizeof(log), "%s/odd.log", d);
	rc = hyb_test_sh(log, "%s synth -o '%s' --hidden 128 --ffn 200 --layers 1 --heads 4 "
			 "--vocab 512 --act relu --type F16 -t 1 && " PI_PY " '%s' '%s' --predictor "
			 "random --hidden 16 --type Q4_0", hyb_test_hybctl(), src, src, pi);
	if (rc)
		hyb_test_show_log(log);
	CHECK_MSG(rc == 0, "making the model failed (exit %d)", rc);
	m = load(pi);
	CHECK(!hyb_ctx_new(m, &p));
	CHECK_MSG(strstr(hyb_last_error(), "n_ff 200") && strstr(hyb_last_error(), "--dense"), "%s",
		  hyb_last_error());
	p.ffn = HYB_FFN_DENSE; /* the dense path has no such limit */
	{
		struct hyb_ctx *c = hyb_ctx_new(m, &p);

		CHECK_MSG(c, "%s", hyb_last_error());
		hyb_ctx_free(c);
	}
	hyb_model_free(m);
}

TEST(pi_rejects_bad_files)
{
	struct pi_files f;
	char log[512], buf[512] = "";
	struct hyb_model *m;
	FILE *lf;

	make_model(&f, "--predictor random --hidden 32 --break fc2-shape");
	/* the GPU index is not a model */
	m = hyb_model_load_mode(f.gpuidx, HYB_LOAD_MMAP);
	CHECK(!m);
	CHECK_MSG(strstr(hyb_last_error(), "PowerInfer GPU index"), "%s", hyb_last_error());
	/* a predictor of the wrong shape: loading names it */
	m = hyb_model_load_mode(f.model, HYB_LOAD_MMAP);
	CHECK(!m);
	CHECK_MSG(strstr(hyb_last_error(), "blk.1.fc2.weight") &&
		  strstr(hyb_last_error(), "expected shape"), "%s", hyb_last_error());
	/* so does hybctl profile, the plan's first step */
	snprintf(log, sizeof(log), "%s/profile.log", hyb_test_tmpdir());
	CHECK(hyb_test_sh(log, "%s profile '%s' -o '%s' --gen 4 -t 1", hyb_test_hybctl(), f.model,
			  f.profile) != 0);
	lf = fopen(log, "r");
	CHECK(lf);
	while (fgets(buf, sizeof(buf), lf) && !strstr(buf, "expected shape"))
		;
	fclose(lf);
	CHECK_MSG(strstr(buf, "blk.1.fc2.weight") && strstr(buf, "expected shape"), "%s", buf);
	/* the bad GPU indexes below need a profile: of the model with good predictors */
	CHECK_EQ_INT(hyb_test_sh(log, PI_PY " '%s' '%s' --predictor random --hidden 32", f.src,
				 f.model), 0);
	CHECK(make_plan(&f, "--gpu-budget 16M", log, sizeof(log)) == 0);
	/* bad GPU indexes */
	static const struct {
		const char *brk, *want;
	} bad[] = {
		{ "gpu-idx-value", "gpu_idx[0] is 2" },
		{ "gpu-bucket", "gpu_bucket does not list" },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		CHECK_EQ_INT(hyb_test_sh(log, PI_PY " '%s' '%s' --gpu-index '%s' --break %s", f.src,
					 f.model, f.gpuidx, bad[i].brk), 0);
		CHECK(hyb_test_sh(log, "%s plan '%s' --profile '%s' -o '%s' -t 1 --gpu-budget 16M "
				  "--gpu-index '%s'", hyb_test_hybctl(), f.model, f.profile,
				  f.plan, f.gpuidx) != 0);
		lf = fopen(log, "r");
		CHECK(lf);
		buf[0] = 0;
		while (fgets(buf, sizeof(buf), lf) && !strstr(buf, bad[i].want))
			;
		fclose(lf);
		CHECK_MSG(strstr(buf, bad[i].want), "no '%s' in the plan's output", bad[i].want);
	}
	/* a model file where the GPU index goes */
	CHECK(hyb_test_sh(log, "%s plan '%s' --profile '%s' -o '%s' -t 1 --gpu-budget 16M "
			  "--gpu-index '%s'", hyb_test_hybctl(), f.model, f.profile, f.plan,
			  f.src) != 0);
	lf = fopen(log, "r");
	CHECK(lf);
	while (fgets(buf, sizeof(buf), lf) && !strstr(buf, "not a PowerInfer GPU index"))
		;
	fclose(lf);
	CHECK_MSG(strstr(buf, "not a PowerInfer GPU index"), "%s", buf);
}

TEST(pi_q4_0_plan_copies_quantized_down_rows)
{
	struct pi_files f;
	char log[512];
	int rc;

	/* PowerInfer quantizes down_t along n_embd: its rows are bundle rows as they are */
	make_model(&f, "--predictor exact --threshold 1e-6 --type Q4_0");
	rc = make_plan(&f, "--gpu-budget 16M", log, sizeof(log));
	if (rc)
		hyb_test_show_log(log);
	CHECK_EQ_INT(rc, 0);

	struct hyb_model *pi = load(f.model), *m = load(f.plan);
	struct hyb_ctx *d = hyb_test_ctx(m, HYB_FFN_DENSE), *s = hyb_test_ctx(m, HYB_FFN_SPARSE);
	struct hyb_sparse_stats st;
	struct hyb_test_agreement r = { 0 };

	for (uint32_t l = 0; l < m->hp.n_layer; l++) {
		const struct hyb_ffn_plan *P = &m->layers[l].plan;
		const struct hyb_weight *dt = &pi->layers[l].down_t;
		const uint32_t F = m->hp.n_ff, GS = m->group_size;
		const uint64_t rb = P->bundles.row_bytes;

		CHECK_EQ_INT(P->bundles.type, HYB_TYPE_Q4_0);
		CHECK_EQ_INT(dt->type, HYB_TYPE_Q4_0);
		for (uint32_t i = 0; i < F; i++) {
			const uint32_t g = i / GS, ng = F - g * GS < GS ? F - g * GS : GS;
			const char *row = (const char *)P->bundles.data +
					  (3ull * g * GS + 2 * ng + (i - g * GS)) * rb;

			CHECK(!memcmp(row, (const char *)dt->data + (uint64_t)P->perm[i] * rb, rb));
		}
	}
	for (uint32_t q = 0; q < 2; q++)
		hyb_test_greedy_compare(d, s, m->hp.n_vocab, 20 + q, 12, 20, 0, &r);
	hyb_ctx_sparse_stats(s, &st);
	printf("    agreement %u/%u, predicted %.1f%%, fired %.1f%%\n", r.agree, r.total,
	       100.0 * st.predicted / st.neurons, 100.0 * st.nonzero / st.neurons);
	/* fc1 comes from the F16 gate, the model's gate is Q4_0: close, not exact */
	CHECK_MSG(r.agree * 100 >= r.total * 90, "greedy agreement %u/%u", r.agree, r.total);
	CHECK(st.predicted < st.neurons / 2);
	hyb_ctx_free(d);
	hyb_ctx_free(s);
	hyb_model_free(pi);
	hyb_model_free(m);
}

/* the type number stored in the file for tensor name (its tensor info entry) */
static uint32_t raw_type(const char *path, const char *name)
{
	FILE *fp = fopen(path, "rb");
	static char buf[1 << 16];
	size_t n, nl = strlen(name);
	uint32_t nd, type = UINT32_MAX;

	CHECK(fp);
	n = fread(buf, 1, sizeof(buf), fp);
	fclose(fp);
	for (size_t i = 8; i + nl + 8 <= n; i++) {
		uint64_t len;

		memcpy(&len, buf + i - 8, 8);
		if (len != nl || memcmp(buf + i, name, nl))
			continue;
		memcpy(&nd, buf + i + nl, 4);
		CHECK(nd >= 1 && nd <= 4 && i + nl + 4 + 8 * nd + 4 <= n);
		memcpy(&type, buf + i + nl + 4 + 8 * nd, 4);
		break;
	}
	CHECK_MSG(type != UINT32_MAX, "%s: no tensor %s in the header", path, name);
	return type;
}

/*
 * The files as PowerInfer's tools write them: a model with PWRI magic
 * (convert.py), a GPU index with I32 numbered 18 and an empty gpu_bucket
 * for a layer without GPU neurons (export_split.py with PowerInfer's
 * gguf-py). hyb reads both and tells them apart by content; a GGUF-magic
 * model loads too. The index the oracle writes carries 18, the number
 * PowerInfer's ggml knows (the gguf package's 26 makes its reader divide by
 * a zero block size).
 */
TEST(pi_files_as_powerinfer_writes_them)
{
	struct pi_files f;
	char gg[600], log[512];
	struct hyb_gguf_file *gi, *mf;
	struct hyb_model *m;
	int rc;

	make_model(&f, "--predictor random --hidden 32 --gpu-none 1");
	CHECK_MSG(!hyb_gguf_open(f.model, &mf), "%s", hyb_last_error());
	CHECK_EQ_INT(mf->magic, HYB_GGUF_MAGIC_PWRI);
	CHECK(!hyb_gguf_is_gpu_index(mf));
	hyb_gguf_close(mf);
	m = load(f.model);
	CHECK(m->powerinfer);
	hyb_model_free(m);
	snprintf(gg, sizeof(gg), "%s/pi-gguf.gguf", hyb_test_tmpdir());
	snprintf(log, sizeof(log), "%s/gguf-magic.log", hyb_test_tmpdir());
	CHECK_EQ_INT(hyb_test_sh(log, PI_PY " '%s' '%s' --predictor random --hidden 32 "
				 "--magic gguf", f.src, gg), 0);
	m = load(gg);
	CHECK(m->powerinfer && m->gguf->magic == HYB_GGUF_MAGIC);
	hyb_model_free(m);

	CHECK_EQ_INT(raw_type(f.gpuidx, "blk.0.gpu_idx"), 18);
	CHECK_EQ_INT(raw_type(f.gpuidx, "blk.1.gpu_bucket"), 18);
	CHECK_MSG(!hyb_gguf_open(f.gpuidx, &gi), "%s", hyb_last_error());
	CHECK(hyb_gguf_is_gpu_index(gi));
	CHECK_EQ_INT(tensor(gi, 0, "gpu_idx")->type, HYB_TYPE_I32);
	CHECK_EQ_INT(tensor(gi, 0, "gpu_bucket")->type, HYB_TYPE_I32);
	CHECK(tensor(gi, 0, "gpu_bucket")->ne[0] > 0);
	CHECK_EQ_INT(tensor(gi, 1, "gpu_bucket")->ne[0], 0);
	CHECK_EQ_INT(tensor(gi, 1, "gpu_bucket")->nbytes, 0);
	hyb_gguf_close(gi);

	rc = make_plan(&f, "--gpu-budget 16M --group-size 32 --gpu-index", log, sizeof(log));
	CHECK(rc != 0); /* (no path: a usage error) */
	snprintf(gg, sizeof(gg), "--gpu-budget 16M --group-size 32 --gpu-index '%s'", f.gpuidx);
	rc = make_plan(&f, gg, log, sizeof(log));
	if (rc)
		hyb_test_show_log(log);
	CHECK_MSG(rc == 0, "hybctl plan with PowerInfer's GPU index failed (exit %d)", rc);
	m = load(f.plan);
	CHECK(m->group_size > 0);
	hyb_model_free(m);
}

/*
 * `hyb run` on a PowerInfer file decodes as PowerInfer does: its own
 * predictors pick every token's neurons, the prompt's included, on its own
 * matrices (no plan). With exact predictors it agrees with dense decoding.
 */
TEST(pi_file_decodes_sparse_every_token)
{
	struct pi_files f;

	make_model(&f, "--predictor exact --threshold 1e-6");
	struct hyb_model *m = load(f.model);
	struct hyb_ctx *d = hyb_test_ctx(m, HYB_FFN_DENSE), *s = hyb_test_ctx(m, HYB_FFN_AUTO);
	const uint32_t L = m->hp.n_layer, n_prompt = 12, n_gen = 20;
	struct hyb_sparse_stats st;
	struct hyb_test_agreement r = { 0 };

	CHECK(m->powerinfer && !m->group_size && m->layers[0].fc1.data);
	CHECK(!hyb_ctx_sparse(d) && hyb_ctx_sparse(s));
	for (uint32_t q = 0; q < 3; q++) {
		hyb_ctx_sparse_stats_reset(s);
		hyb_test_greedy_compare(d, s, m->hp.n_vocab, 30 + q, n_prompt, n_gen, 0, &r);
		hyb_ctx_sparse_stats(s, &st);
		/* the prompt's tokens too (the last layer sees only the last one's) */
		CHECK_EQ_INT(st.layer_steps, (L - 1) * n_prompt + 1 + (uint64_t)n_gen * L);
	}
	printf("    agreement %u/%u, predicted %.1f%%, fired %.1f%%, logits within %.2g\n",
	       r.agree, r.total, 100.0 * st.predicted / st.neurons,
	       100.0 * st.nonzero / st.neurons, r.max_rel);
	CHECK_MSG(r.agree * 100 >= r.total * 95, "greedy agreement %u/%u", r.agree, r.total);
	CHECK_MSG(st.predicted < st.neurons / 2, "predicted %llu of %llu",
		  (unsigned long long)st.predicted, (unsigned long long)st.neurons);
	hyb_ctx_free(d);
	hyb_ctx_free(s);
	hyb_model_free(m);
}

/*
 * PowerInfer's predictor arithmetic: ggml's mul_mat converts its input to
 * the weight's dot type, so with F16 predictors x and relu(fc1 · x) are
 * rounded to F16 before each product, and neuron i runs when its score is
 * >= powerinfer.sparse_threshold. hyb_pi_predictor_run against that in
 * double precision: every decision equal but where the score is within
 * float rounding of the threshold, among them some that an fp32 hidden
 * layer would flip (PowerInfer's tokens depend on them).
 */
TEST(pi_predictor_rounds_as_ggml)
{
	const float thr = 0.05f;
	struct pi_files f;
	char opts[128];

	snprintf(opts, sizeof(opts), "--predictor random --hidden 64 --threshold %g", thr);
	make_model(&f, opts);
	struct hyb_model *m = load(f.model);
	const uint32_t E = m->hp.n_embd, F = m->hp.n_ff;
	uint32_t *act = malloc(4 * F), n_near = 0, n_flip = 0, n_dec = 0;
	float *x = malloc(4 * E);
	double *h = NULL, *score = malloc(8 * F), *score32 = malloc(8 * F);
	uint8_t *on = malloc(F);

	CHECK(act && x && score && score32 && on);
	CHECK_NEAR(m->powerinfer_threshold, thr, 0);
	for (uint32_t l = 0; l < m->hp.n_layer; l++) {
		const struct hyb_weight *w1 = &m->layers[l].fc1, *w2 = &m->layers[l].fc2;
		const uint32_t H = (uint32_t)w1->ne1;
		const uint16_t *a = w1->data, *b = w2->data;
		void *scratch = malloc(hyb_pi_predictor_scratch_bytes(w1, w2));

		CHECK(w1->type == HYB_TYPE_F16 && w2->type == HYB_TYPE_F16 && scratch);
		h = realloc(h, 8 * H);
		CHECK(h);
		for (uint32_t rep = 0; rep < 48; rep++) {
			uint32_t n;

			for (uint32_t e = 0; e < E; e++)
				x[e] = (float)sin(0.37 * (e + 1) * (rep + 1) + l) * 2.0f;
			n = hyb_pi_predictor_run(w1, w2, thr, x, NULL, scratch, act);
			for (uint32_t j = 0; j < H; j++) {
				double s = 0;

				for (uint32_t e = 0; e < E; e++)
					s += (double)hyb_f16_to_f32(a[(size_t)j * E + e]) *
					     hyb_f16_to_f32(hyb_f32_to_f16(x[e]));
				h[j] = s > 0 ? s : 0;
			}
			for (uint32_t i = 0; i < F; i++) {
				double s = 0, s32 = 0;

				for (uint32_t j = 0; j < H; j++) {
					const double w = hyb_f16_to_f32(b[(size_t)i * H + j]);

					s += w * hyb_f16_to_f32(hyb_f32_to_f16((float)h[j]));
					s32 += w * (float)h[j];
				}
				score[i] = s;
				score32[i] = s32;
				on[i] = 0;
			}
			for (uint32_t k = 0; k < n; k++)
				on[act[k]] = 1;
			for (uint32_t i = 0; i < F; i++) {
				/* float sums differ from double by ~1e-6 here */
				const bool ref = score[i] >= thr, near = fabs(score[i] - thr) < 1e-5;

				n_dec++;
				n_near += near;
				CHECK_MSG(near || on[i] == ref, "layer %u neuron %u: score %.9g, "
					  "threshold %g, hyb says %s", l, i, score[i], thr,
					  on[i] ? "active" : "inactive");
				n_flip += !near && (score32[i] >= thr) != ref;
			}
		}
		free(scratch);
	}
	printf("    %u decisions, %u within 1e-5 of the threshold; an fp32 hidden layer "
	       "would flip %u others\n", n_dec, n_near, n_flip);
	/* so this test tells the rounding from its absence */
	CHECK(n_flip > 0);
	free(act);
	free(x);
	free(h);
	free(score);
	free(score32);
	free(on);
	hyb_model_free(m);
}

/*
 * PowerInfer's tokens. Goldens from PowerInfer's own CPU build
 * (tests/oracle/powerinfer-ref.sh --record: commit d3ebd7c, GGML_NATIVE on an
 * AVX-512 VNNI Xeon, one thread) on the models below, which it loads for
 * sparse inference: its greedy ids after each prompt. hyb decodes the same
 * files (sparse, its predictors on every token) to the same ids: with exact
 * predictors on every prompt; with random ones wherever no score lands
 * within summation-order rounding of the threshold.
 */
struct pi_golden {
	int exact; /* predictors: exact, or random (hidden 64, threshold 0) */
	int n_prompt;
	int32_t prompt[16];
	int32_t ids[32];
};

static const struct pi_golden pi_goldens[] = {
	{ 1, 13,
	  { 1, 353, 414, 392, 396, 429, 418, 491, 389, 427, 404, 412, 396 },
	  { 114, 114, 114, 114, 114, 114, 114, 114, 114, 114, 114, 114, 114, 114, 114, 114,
	    114, 114, 114, 114, 114, 114, 114, 114, 114, 114, 114, 114, 114, 114, 114, 114 } },
	{ 1, 15,
	  { 1, 363, 497, 421, 428, 404, 392, 408, 391, 422, 416, 432, 414, 468, 434 },
	  { 428, 428, 428, 428, 428, 428, 428, 428, 428, 428, 428, 428, 428, 428, 428, 428,
	    428, 428, 428, 428, 428, 428, 428, 428, 428, 428, 428, 428, 428, 428, 428, 428 } },
	{ 1, 16,
	  { 1, 341, 414, 389, 403, 416, 410, 396, 460, 449, 401, 422, 416, 428, 414, 394 },
	  { 106, 106, 106, 106, 106, 106, 106, 106, 106, 106, 106, 106, 106, 106, 106, 106,
	    106, 106, 106, 106, 106, 106, 106, 106, 106, 106, 106, 106, 106, 106, 106, 106 } },
	{ 1, 12,
	  { 1, 496, 410, 410, 416, 433, 507, 410, 394, 282, 499, 462 },
	  { 487, 284, 358, 284, 358, 284, 293, 293, 293, 293, 293, 284, 293, 293, 293, 293,
	    293, 293, 293, 293, 293, 293, 293, 293, 293, 293, 293, 293, 293, 284, 293, 284 } },
	{ 1, 12,
	  { 1, 355, 504, 463, 462, 449, 393, 388, 418, 473, 388, 410 },
	  { 53, 117, 53, 117, 53, 286, 286, 286, 117, 53, 117, 53, 117, 53, 117, 53,
	    117, 53, 117, 53, 117, 53, 117, 53, 117, 53, 117, 53, 117, 53, 117, 53 } },
	{ 0, 13,
	  { 1, 353, 414, 392, 396, 429, 418, 491, 389, 427, 404, 412, 396 },
	  { 501, 152, 38, 152, 501, 320, 485, 114, 152, 38, 152, 38, 152, 38, 152, 38,
	    152, 38, 152, 38, 152, 38, 152, 38, 152, 38, 152, 152, 152, 152, 152, 38 } },
	{ 0, 15,
	  { 1, 363, 497, 421, 428, 404, 392, 408, 391, 422, 416, 432, 414, 468, 434 },
	  { 317, 373, 373, 373, 373, 373, 373, 428, 428, 428, 428, 428, 428, 428, 428, 428,
	    428, 428, 428, 428, 428, 428, 428, 428, 428, 428, 428, 428, 428, 428, 428, 428 } },
	{ 0, 16,
	  { 1, 341, 414, 389, 403, 416, 410, 396, 460, 449, 401, 422, 416, 428, 414, 394 },
	  { 394, 394, 394, 394, 444, 106, 106, 106, 106, 106, 106, 106, 106, 106, 106, 106,
	    106, 106, 106, 106, 106, 106, 106, 106, 106, 106, 106, 106, 106, 106, 106, 106 } },
	{ 0, 12,
	  { 1, 496, 410, 410, 416, 433, 507, 410, 394, 282, 499, 462 },
	  { 293, 293, 293, 293, 293, 293, 293, 293, 293, 293, 293, 293, 293, 293, 293, 293,
	    293, 293, 293, 293, 293, 293, 293, 293, 293, 293, 293, 293, 293, 293, 293, 293 } },
	{ 0, 12,
	  { 1, 355, 504, 463, 462, 449, 393, 388, 418, 473, 388, 410 },
	  { 286, 286, 117, 53, 286, 286, 286, 286, 117, 53, 286, 286, 286, 117, 53, 286,
	    117, 53, 286, 117, 53, 286, 117, 53, 286, 117, 53, 286, 117, 53, 286, 117 } },
};

TEST(pi_tokens_are_powerinfers)
{
	const struct hyb_cpu_kernels *k = hyb_cpu_best();
	const size_t n_cases = sizeof(pi_goldens) / sizeof(pi_goldens[0]);
	char src[512], path[2][512], log[512];
	uint32_t full[2] = { 0 }, same[2] = { 0 }, cases[2] = { 0 };
	float *lg;
	int rc;

	if (k->isa < HYB_ISA_AVX512)
		SKIP("goldens are PowerInfer's on AVX-512; this run uses %s", k->name);
	hyb_test_need_venv();
	if (access(hyb_test_hybctl(), X_OK))
		SKIP("%s not built (run from the repository root after make)", hyb_test_hybctl());
	snprintf(src, sizeof(src), "%s/src.gguf", hyb_test_tmpdir());
	snprintf(path[0], sizeof(path[0]), "%s/random.gguf", hyb_test_tmpdir());
	snprintf(path[1], sizeof(path[1]), "%s/exact.gguf", hyb_test_tmpdir());
	snprintf(log, sizeof(log), "%s/make.log", hyb_test_tmpdir());
	rc = hyb_test_sh(log, "%s synth -o '%s' --hidden 256 --ffn 1024 --layers 2 --heads 4 "
			 "--vocab 512 --act relu --type F16 -t 1 && " PI_PY " '%s' '%s' --predictor "
			 "exact --threshold 1e-6 && " PI_PY " '%s' '%s' --predictor random "
			 "--hidden 64", hyb_test_hybctl(), src, src, path[1], src, path[0]);
	if (rc)
		hyb_test_show_log(log);
	CHECK_MSG(rc == 0, "making the PowerInfer models failed (exit %d)", rc);
	for (int e = 0; e < 2; e++) {
		struct hyb_model *m = load(path[e]);
		struct hyb_ctx *c = hyb_test_ctx(m, HYB_FFN_AUTO);

		CHECK(hyb_ctx_sparse(c) && m->gguf->magic == HYB_GGUF_MAGIC_PWRI);
		lg = malloc(sizeof(float) * m->hp.n_vocab);
		CHECK(lg);
		for (size_t i = 0; i < n_cases; i++) {
			const struct pi_golden *g = &pi_goldens[i];
			uint32_t eq = 0;

			if (g->exact != e)
				continue;
			hyb_ctx_reset(c);
			CHECK_MSG(!hyb_ctx_eval(c, g->prompt, (uint32_t)g->n_prompt, lg, false), "%s",
				  hyb_last_error());
			for (int t = 0; t < 32; t++) {
				int32_t id = hyb_test_argmax(lg, m->hp.n_vocab);

				eq += id == g->ids[t];
				CHECK_MSG(!hyb_ctx_eval(c, &id, 1, lg, false), "%s", hyb_last_error());
			}
			cases[e]++;
			same[e] += eq;
			full[e] += eq == 32;
		}
		free(lg);
		hyb_ctx_free(c);
		hyb_model_free(m);
	}
	printf("    exact predictors: %u/%u prompts token for token (%u/%u tokens); random: "
	       "%u/%u (%u/%u tokens)\n", full[1], cases[1], same[1], 32 * cases[1], full[0],
	       cases[0], same[0], 32 * cases[0]);
	CHECK_EQ_INT(full[1], cases[1]);
	/* random predictors: a score within rounding of the threshold may go either way */
	CHECK_MSG(full[0] + 1 >= cases[0], "random predictors: %u of %u prompts equal", full[0],
		  cases[0]);
}

/*
 * Files made by PowerInfer's own tools (tests/data/powerinfer/, made by
 * tests/oracle/powerinfer-convert.sh: a Hugging Face checkpoint through its
 * convert.py, its quantize, its ILP solver), with its CPU build's tokens in
 * goldens.txt: its tokenization of each prompt and its 32 greedy ids after
 * it. hyb must tokenize as it does and decode the same ids: token for token
 * with the exact predictors (F16 and Q4_0); with random ones wherever no
 * score lands within rounding of the threshold (the count is printed).
 */
#define PI_DATA "tests/data/powerinfer/"

struct pi_line {
	char model[64], prompt[128];
	int32_t prompt_ids[64], ids[32];
	int n_prompt, n_ids;
};

static int parse_ids(char *s, int32_t *ids, int cap)
{
	int n = 0;

	for (char *t = strtok(s, " "); t; t = strtok(NULL, " ")) {
		if (n == cap)
			return -1;
		ids[n++] = atoi(t);
	}
	return n;
}

/* "model | prompt | prompt ids | greedy ids"; 0 on a well-formed line. */
static int parse_golden(char *line, struct pi_line *g)
{
	char *f[4], *save = NULL;
	int n = 0;

	for (char *t = strtok_r(line, "|\n", &save); t && n < 4; t = strtok_r(NULL, "|\n", &save))
		f[n++] = t;
	if (n != 4)
		return -1;
	for (int i = 0; i < 4; i++) {
		while (*f[i] == ' ')
			f[i]++;
		for (char *e = f[i] + strlen(f[i]); e > f[i] && e[-1] == ' ';)
			*--e = 0;
	}
	snprintf(g->model, sizeof(g->model), "%s", f[0]);
	snprintf(g->prompt, sizeof(g->prompt), "%s", f[1]);
	g->n_prompt = parse_ids(f[2], g->prompt_ids, 64);
	g->n_ids = parse_ids(f[3], g->ids, 32);
	return g->n_prompt > 0 && g->n_ids == 32 ? 0 : -1;
}

TEST(pi_converted_files_give_powerinfers_tokens)
{
	const struct hyb_cpu_kernels *k = hyb_cpu_best();
	FILE *fp = fopen(PI_DATA "goldens.txt", "r");
	struct hyb_model *m = NULL;
	struct hyb_ctx *c = NULL;
	char line[2048], loaded[64] = "";
	uint32_t lines = 0, tok_same = 0, full[2] = { 0 }, cases[2] = { 0 };
	uint32_t same[2] = { 0 };
	float *lg = NULL;

	CHECK_MSG(fp, "%s: %s", PI_DATA "goldens.txt", strerror(errno));
	if (k->isa < HYB_ISA_AVX512) {
		fclose(fp);
		SKIP("goldens are PowerInfer's on AVX-512; this run uses %s", k->name);
	}
	while (fgets(line, sizeof(line), fp)) {
		struct pi_line g;
		int32_t ids[64];
		uint32_t eq = 0;
		int n, random;

		if (line[0] == '#')
			continue;
		CHECK_MSG(!parse_golden(line, &g), "goldens.txt line %u malformed", lines + 1);
		if (strcmp(g.model, loaded)) {
			char path[256];

			free(lg);
			hyb_ctx_free(c);
			hyb_model_free(m);
			snprintf(path, sizeof(path), PI_DATA "%s", g.model);
			m = load(path);
			/* as PowerInfer's convert.py leaves them: PWRI, predictors, down_t */
			CHECK(m->powerinfer && m->gguf->magic == HYB_GGUF_MAGIC_PWRI);
			CHECK_EQ_INT(m->hp.act, HYB_ACT_RELU);
			c = hyb_test_ctx(m, HYB_FFN_AUTO);
			CHECK(hyb_ctx_sparse(c));
			lg = malloc(sizeof(float) * m->hp.n_vocab);
			CHECK(lg);
			snprintf(loaded, sizeof(loaded), "%s", g.model);
		}
		random = !strncmp(g.model, "random", 6);
		lines++;
		n = hyb_tokenize(m->tok, g.prompt, strlen(g.prompt), true, ids, 64);
		CHECK_MSG(n > 0, "%s", hyb_last_error());
		tok_same += n == g.n_prompt && !memcmp(ids, g.prompt_ids, sizeof(int32_t) * (size_t)n);
		hyb_ctx_reset(c);
		CHECK_MSG(!hyb_ctx_eval(c, g.prompt_ids, (uint32_t)g.n_prompt, lg, false), "%s",
			  hyb_last_error());
		for (int t = 0; t < 32; t++) {
			int32_t id = hyb_test_argmax(lg, m->hp.n_vocab);

			if (id != g.ids[t] && eq == (uint32_t)t)
				printf("    %s '%s': token %d is %d, PowerInfer's %d (logits %.6g, "
				       "%.6g)\n", g.model, g.prompt, t, id, g.ids[t], lg[id],
				       lg[g.ids[t]]);
			eq += id == g.ids[t];
			CHECK_MSG(!hyb_ctx_eval(c, &id, 1, lg, false), "%s", hyb_last_error());
		}
		cases[random]++;
		same[random] += eq;
		full[random] += eq == 32;
	}
	fclose(fp);
	free(lg);
	hyb_ctx_free(c);
	hyb_model_free(m);
	printf("    %u/%u prompts tokenized as PowerInfer does; exact predictors (F16, Q4_0): "
	       "%u/%u prompts token for token (%u/%u tokens); random: %u/%u (%u/%u tokens)\n",
	       tok_same, lines, full[0], cases[0], same[0], 32 * cases[0], full[1], cases[1],
	       same[1], 32 * cases[1]);
	CHECK_MSG(lines >= 18, "goldens.txt has %u cases", lines);
	CHECK_EQ_INT(tok_same, lines);
	CHECK_EQ_INT(full[0], cases[0]);
	/* random predictors: a score within rounding of the threshold may go either way */
	CHECK_MSG(full[1] + 1 >= cases[1], "random predictors: %u of %u prompts equal", full[1],
		  cases[1]);
}

/*
 * The GPU index PowerInfer's ILP solver made for the converted model
 * (python -m powerinfer: activation counts in, export_split's file out)
 * reads as PowerInfer wrote it and places hyb's groups.
 */
TEST(pi_solver_index_places_groups)
{
	const char *model = PI_DATA "exact.powerinfer.gguf", *idx = PI_DATA "exact.gpuidx";
	struct pi_files f;
	struct hyb_gguf_file *gi;
	char log[512], opts[640];
	uint32_t hot = 0;
	int rc;

	if (access(hyb_test_hybctl(), X_OK))
		SKIP("%s not built (run from the repository root after make)", hyb_test_hybctl());
	CHECK_MSG(!hyb_gguf_open(idx, &gi), "%s", hyb_last_error());
	CHECK_EQ_INT(gi->magic, HYB_GGUF_MAGIC_PWRI);
	CHECK(hyb_gguf_is_gpu_index(gi));
	for (uint32_t l = 0; l < 2; l++) {
		const struct hyb_gguf_tensor *t = tensor(gi, l, "gpu_idx");
		const struct hyb_gguf_tensor *b = tensor(gi, l, "gpu_bucket");
		uint32_t n = 0;

		for (uint32_t i = 0; i < t->ne[0]; i++)
			n += ((const int32_t *)t->data)[i];
		/* the bucket lists the same neurons, ascending */
		CHECK_EQ_INT(b->ne[0], n);
		for (uint32_t k = 1; k < n; k++)
			CHECK(((const int32_t *)b->data)[k - 1] < ((const int32_t *)b->data)[k]);
		hot += n;
	}
	/* the solver's capacity: 256 neurons in units of its batch (32) */
	CHECK_MSG(hot > 0 && hot <= 256 && hot % 32 == 0, "%u neurons on the GPU", hot);
	snprintf(f.model, sizeof(f.model), "%s", model);
	snprintf(f.profile, sizeof(f.profile), "%s/pi.profile.gguf", hyb_test_tmpdir());
	snprintf(f.plan, sizeof(f.plan), "%s/pi.plan.gguf", hyb_test_tmpdir());
	snprintf(opts, sizeof(opts), "--gpu-budget 2.0M --group-size 32 --gpu-index '%s'", idx);
	rc = make_plan(&f, opts, log, sizeof(log));
	if (rc)
		hyb_test_show_log(log);
	CHECK_MSG(rc == 0, "hybctl plan failed (exit %d)", rc);

	struct hyb_model *p = load(f.plan);
	const uint32_t placed = placed_by_index(p, gi), all = p->hp.n_layer * p->n_groups;

	printf("    %u neurons on PowerInfer's GPU; %u of %u groups placed by its index\n", hot,
	       placed, all);
	CHECK_MSG(placed > 0 && placed < all, "%u of %u groups placed", placed, all);
	hyb_model_free(p);
	hyb_gguf_close(gi);
}
