// SPDX-License-Identifier: MIT
/*
 * llama.cpp's speed on a model, measured the way `hyb bench` measures hyb's
 * (tests/bench/real.sh alternates the two): one round is a prompt of
 * N_PROMPT tokens in one llama_decode (prefill), then N_GEN single-token
 * llama_decode calls feeding back the greedy token (decode), on a cleared
 * cache. Prints one line per round:
 *
 *   prefill TOK/S decode TOK/S
 *
 *   llama_speed MODEL THREADS N_PROMPT N_GEN ROUNDS
 *
 * Built by tests/oracle/llama-ref.sh against llama-cpp-python 0.3.36's
 * llama.cpp; a benchmark baseline, never part of hyb.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "llama.h"
#include "llama_oracle.h"

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
	if (argc != 6) {
		fprintf(stderr, "usage: llama_speed MODEL THREADS N_PROMPT N_GEN ROUNDS\n");
		return 2;
	}
	const int threads = atoi(argv[2]), n_prompt = atoi(argv[3]), n_gen = atoi(argv[4]);
	const int rounds = atoi(argv[5]);

	llama_log_set(quiet, NULL);
	llama_backend_init();
	struct llama_model_params mp = llama_model_default_params();

	mp.progress_callback = no_progress; /* no dots on stderr */
	struct llama_model *model = llama_model_load_from_file(argv[1], mp);
	if (!model) {
		fprintf(stderr, "llama_speed: cannot load %s\n", argv[1]);
		return 1;
	}
	const struct llama_vocab *vocab = llama_model_get_vocab(model);
	const int n_vocab = llama_vocab_n_tokens(vocab);
	struct llama_context_params cp = llama_context_default_params();
	cp.n_ctx = (uint32_t)(n_prompt + n_gen + 16);
	cp.n_batch = cp.n_ubatch = (uint32_t)n_prompt;
	cp.n_threads = cp.n_threads_batch = threads;
	struct llama_context *ctx = llama_init_from_model(model, cp);
	if (!ctx || n_prompt < 1 || n_gen < 1) {
		fprintf(stderr, "llama_speed: cannot create a context\n");
		return 1;
	}
	struct llama_batch b = llama_batch_init(n_prompt, 0, 1);

	for (int r = 0; r < rounds; r++) {
		llama_memory_clear(llama_get_memory(ctx), true);
		for (int i = 0; i < n_prompt; i++) {
			/* the same pseudo-random ids every round, BOS first */
			b.token[i] = i ? (llama_token)((i * 7919 + 13) % (n_vocab - 300) + 256)
				       : llama_vocab_bos(vocab);
			b.pos[i] = i;
			b.n_seq_id[i] = 1;
			b.seq_id[i][0] = 0;
			b.logits[i] = i == n_prompt - 1;
		}
		b.n_tokens = n_prompt;
		double t0 = now();
		if (llama_decode(ctx, b))
			return fprintf(stderr, "llama_speed: prompt decode failed\n"), 1;
		double t1 = now();
		llama_token next = argmax(llama_get_logits_ith(ctx, -1), n_vocab);
		for (int g = 0; g < n_gen; g++) {
			if (llama_decode(ctx, llama_batch_get_one(&next, 1)))
				return fprintf(stderr, "llama_speed: decode failed\n"), 1;
			next = argmax(llama_get_logits_ith(ctx, -1), n_vocab);
		}
		double t2 = now();
		printf("prefill %.2f decode %.2f\n", n_prompt / (t1 - t0), n_gen / (t2 - t1));
		fflush(stdout);
	}
	llama_batch_free(b);
	llama_free(ctx);
	llama_model_free(model);
	llama_backend_free();
	return 0;
}
