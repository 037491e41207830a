// SPDX-License-Identifier: MIT
/*
 * llama.cpp's answers for a model and a prompt, the way hyb's exactness
 * tests record them (tests/unit/test_exact.c, test_real.c): the prompt's
 * token ids (llama_tokenize, add_special, parse_special as asked), one
 * llama_decode of the whole prompt with logits for every row hashed with
 * FNV-1a over their float32 bytes, then greedy ids (first maximum) with one
 * llama_decode per token, stopping at end-of-generation tokens.
 *
 *   llama_ref MODEL THREADS N_CTX N_GEN PARSE_SPECIAL PROMPT
 *
 * PROMPT "ids:1,5,9" gives token ids instead of text; N_GEN < 0 generates
 * -N_GEN tokens without stopping at end-of-generation tokens.
 *
 * Built against the llama.cpp that llama-cpp-python 0.3.36 vendors by
 * tests/oracle/llama-ref.sh; a test oracle, never part of hyb.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"
#include "llama_oracle.h"

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
	const unsigned char *b = p;

	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 0x100000001b3ull;
	return h;
}

int main(int argc, char **argv)
{
	if (argc != 7) {
		fprintf(stderr, "usage: llama_ref MODEL THREADS N_CTX N_GEN PARSE_SPECIAL PROMPT\n");
		return 2;
	}
	const int threads = atoi(argv[2]), n_ctx = atoi(argv[3]);
	const int n_gen = abs(atoi(argv[4])), stop_eog = atoi(argv[4]) > 0;
	const bool parse_special = atoi(argv[5]) != 0;
	const char *prompt = argv[6];

	llama_log_set(quiet, NULL);
	llama_backend_init();
	struct llama_model_params mp = llama_model_default_params();
	mp.progress_callback = no_progress; /* no dots on stderr */
	struct llama_model *model = llama_model_load_from_file(argv[1], mp);
	if (!model) {
		fprintf(stderr, "llama_ref: cannot load %s\n", argv[1]);
		return 1;
	}
	const struct llama_vocab *vocab = llama_model_get_vocab(model);
	const int n_vocab = llama_vocab_n_tokens(vocab);
	struct llama_context_params cp = llama_context_default_params();
	cp.n_ctx = n_ctx;
	cp.n_batch = n_ctx;
	cp.n_ubatch = n_ctx;
	cp.n_threads = threads;
	cp.n_threads_batch = threads;
	struct llama_context *ctx = llama_init_from_model(model, cp);
	if (!ctx) {
		fprintf(stderr, "llama_ref: cannot create a context\n");
		return 1;
	}
	int cap = (int)strlen(prompt) + 16;
	llama_token *ids = malloc(sizeof(*ids) * (size_t)cap);
	int n = 0;
	if (!strncmp(prompt, "ids:", 4)) {
		for (const char *p = prompt + 4; *p && n < cap; p += strspn(p, ","))
			ids[n++] = (llama_token)strtol(p, (char **)&p, 10);
	} else {
		n = llama_tokenize(vocab, prompt, (int)strlen(prompt), ids, cap, true, parse_special);
	}
	if (n <= 0) {
		fprintf(stderr, "llama_ref: tokenize failed (%d)\n", n);
		return 1;
	}
	printf("prompt %d:", n);
	for (int i = 0; i < n; i++)
		printf(" %d", ids[i]);
	printf("\n");

	struct llama_batch b = llama_batch_init(n, 0, 1);
	for (int i = 0; i < n; i++) {
		b.token[i] = ids[i];
		b.pos[i] = i;
		b.n_seq_id[i] = 1;
		b.seq_id[i][0] = 0;
		b.logits[i] = 1;
	}
	b.n_tokens = n;
	if (llama_decode(ctx, b)) {
		fprintf(stderr, "llama_ref: prompt decode failed\n");
		return 1;
	}
	uint64_t h = 0xcbf29ce484222325ull;
	for (int i = 0; i < n; i++)
		h = fnv1a(h, llama_get_logits_ith(ctx, i), sizeof(float) * (size_t)n_vocab);
	printf("hash %016llx\n", (unsigned long long)h);
	printf("row0 %.9g %.9g\n", llama_get_logits_ith(ctx, 0)[0], llama_get_logits_ith(ctx, 0)[1]);

	llama_token next = argmax(llama_get_logits_ith(ctx, n - 1), n_vocab);
	printf("ids");
	for (int g = 0; g < n_gen && !(stop_eog && llama_vocab_is_eog(vocab, next)); g++) {
		printf(" %d", next);
		struct llama_batch one = llama_batch_get_one(&next, 1);
		if (llama_decode(ctx, one)) {
			fprintf(stderr, "llama_ref: decode failed\n");
			return 1;
		}
		next = argmax(llama_get_logits_ith(ctx, -1), n_vocab);
	}
	printf("\n");
	llama_batch_free(b);
	free(ids);
	llama_free(ctx);
	llama_model_free(model);
	llama_backend_free();
	return 0;
}
