// SPDX-License-Identifier: MIT
/*
 * Sparse decoding end to end: hybctl synth -> profile ->
 * plan -> hyb_ctx with HYB_FFN_SPARSE, on a small ReLU model.
 *   - With a predictor forced to mark every neuron, sparse decoding must
 *     give dense decoding's logits (the operator path, minus prediction).
 *   - With the trained predictors it must r.agree with dense decoding on
 *     nearly every greedy token while computing a fraction of the FFN.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hyb/gguf.h"
#include "hyb/model.h"
#include "test.h"

TEST(sparse_decode_all_predicted_equals_dense)
{
	const char *plan = hyb_test_plan();
	struct hyb_model *m = hyb_model_load_mode(plan, HYB_LOAD_MMAP);

	CHECK_MSG(m, "%s", hyb_last_error());
	CHECK(m->group_size > 0);
	/* A private writable copy of the mapping would be needed to patch the
	 * biases in place; instead point each layer's fc2 bias at a buffer
	 * that makes every logit positive: every neuron is then "predicted". */
	float *bias = malloc(sizeof(float) * m->hp.n_ff);

	CHECK(bias);
	for (uint32_t i = 0; i < m->hp.n_ff; i++)
		bias[i] = 1e30f;
	for (uint32_t l = 0; l < m->hp.n_layer; l++)
		m->layers[l].plan.fc2_bias = bias;

	struct hyb_ctx *d = hyb_test_ctx(m, HYB_FFN_DENSE), *s = hyb_test_ctx(m, HYB_FFN_SPARSE);
	struct hyb_test_agreement r = { 0 };
	struct hyb_sparse_stats st;

	CHECK(hyb_ctx_sparse(s) && !hyb_ctx_sparse(d));
	hyb_test_greedy_compare(d, s, m->hp.n_vocab, 1, 16, 24, 1, &r);
	hyb_ctx_sparse_stats(s, &st);
	CHECK_EQ_INT(st.predicted, st.neurons);
	CHECK(st.nonzero < st.neurons / 2); /* ReLU: most neurons still skip up and down */
	CHECK_EQ_INT(r.agree, r.total);
	/* the same weights, summed in another order */
	CHECK_MSG(r.max_diff < 1e-3, "largest logit difference %g", r.max_diff);
	hyb_ctx_free(d);
	hyb_ctx_free(s);
	hyb_model_free(m);
	free(bias);
}

TEST(sparse_decode_trained_predictors_agree_with_dense)
{
	const char *plan = hyb_test_plan();
	struct hyb_model *m = hyb_model_load(plan);

	CHECK_MSG(m, "%s", hyb_last_error());
	struct hyb_ctx *d = hyb_test_ctx(m, HYB_FFN_DENSE), *s = hyb_test_ctx(m, HYB_FFN_SPARSE);
	struct hyb_test_agreement r = { 0 };
	struct hyb_sparse_stats st;

	for (uint32_t p = 0; p < 6; p++)
		hyb_test_greedy_compare(d, s, m->hp.n_vocab, 100 + p, 16, 24, 1, &r);
	hyb_ctx_sparse_stats(s, &st);
	printf("    agreement %u/%u, predicted %.1f%%, fired %.1f%%\n", r.agree, r.total,
	       100.0 * st.predicted / st.neurons, 100.0 * st.nonzero / st.neurons);
	CHECK_EQ_INT(st.layer_steps, 6ull * 24 * m->hp.n_layer);
	/* the predictors mark a minority of neurons, and a superset of most
	 * that fire (~10% at the default sparsity) */
	CHECK_MSG(st.predicted < st.neurons / 2, "predicted %llu of %llu",
		  (unsigned long long)st.predicted, (unsigned long long)st.neurons);
	CHECK(st.nonzero > st.neurons / 20);
	CHECK_MSG(r.agree * 100 >= r.total * 90, "greedy agreement %u/%u", r.agree, r.total);
	hyb_ctx_free(d);
	hyb_ctx_free(s);
	hyb_model_free(m);
}

TEST(sparse_decode_needs_a_plan)
{
	char path[512], cmd[1024];
	struct hyb_model *m;
	struct hyb_ctx_params p = { .n_ctx = 64, .n_threads = 1, .ffn = HYB_FFN_SPARSE };

	if (access(hyb_test_hybctl(), X_OK))
		SKIP("%s not built", hyb_test_hybctl());
	snprintf(path, sizeof(path), "%s/dense.gguf", hyb_test_tmpdir());
	snprintf(cmd, sizeof(cmd), "%s synth -o %s --act relu -t 1 >/dev/null", hyb_test_hybctl(), path);
	CHECK(system(cmd) == 0);
	m = hyb_model_load(path);
	CHECK_MSG(m, "%s", hyb_last_error());
	CHECK(hyb_ctx_new(m, &p) == NULL);
	CHECK_MSG(strstr(hyb_last_error(), "plan"), "message: %s", hyb_last_error());
	p.ffn = HYB_FFN_AUTO;
	struct hyb_ctx *c = hyb_ctx_new(m, &p);

	CHECK_MSG(c && !hyb_ctx_sparse(c), "%s", hyb_last_error());
	hyb_ctx_free(c);
	hyb_model_free(m);
}
