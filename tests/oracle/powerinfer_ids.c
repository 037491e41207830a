// SPDX-License-Identifier: MIT
/*
 * Greedy ids from PowerInfer's own CPU build (its llama.h C API), for the
 * goldens of tests/unit/test_powerinfer.c (tests/oracle/powerinfer-ref.sh):
 *
 *   powerinfer_ids MODEL N_PREDICT THREADS ID,ID,...
 *   powerinfer_ids MODEL N_PREDICT THREADS text:PROMPT
 *
 * One llama_decode of the prompt ids, then one per token; each next id is
 * the first maximum of the last row's logits. Prints the ids on one line;
 * with text:, PowerInfer's own tokenization of PROMPT (BOS first, no special
 * tokens parsed) first, then " | ", then the ids.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

int main(int argc, char **argv)
{
	struct llama_model_params mp;
	struct llama_context_params cp;
	struct llama_model *m;
	struct llama_context *c;
	llama_token toks[512];
	int n = 0, n_pred, nv, pos;
	char *s, *save = NULL;

	if (argc != 5) {
		fprintf(stderr, "usage: powerinfer_ids MODEL N_PREDICT THREADS ID,ID,...\n");
		return 2;
	}
	llama_backend_init(false);
	mp = llama_model_default_params();
	cp = llama_context_default_params();
	cp.n_ctx = 512;
	cp.n_threads = cp.n_threads_batch = (uint32_t)atoi(argv[3]);
	cp.seed = 1;
	m = llama_load_model_from_file_with_context(argv[1], mp, &cp);
	if (!m)
		return 1;
	c = llama_new_context_with_model(m, cp);
	if (!c)
		return 1;
	s = strdup(argv[4]);
	if (!strncmp(s, "text:", 5)) {
		n = llama_tokenize(m, s + 5, (int)strlen(s + 5), toks, 512, true, false);
		if (n < 0)
			return 1;
		for (int i = 0; i < n; i++)
			printf("%s%d", i ? " " : "", toks[i]);
		printf(" | ");
	} else {
		for (char *t = strtok_r(s, ",", &save); t && n < 512;
		     t = strtok_r(NULL, ",", &save))
			toks[n++] = atoi(t);
	}
	n_pred = atoi(argv[2]);
	nv = llama_n_vocab(m);
	if (!n || llama_decode(c, llama_batch_get_one(toks, n, 0, 0)))
		return 1;
	pos = n;
	for (int i = 0; i < n_pred; i++) {
		/* only the last row's logits are kept (no logits array in the batch) */
		const float *lg = llama_get_logits(c);
		llama_token best = 0;

		for (int v = 1; v < nv; v++)
			if (lg[v] > lg[best])
				best = v;
		printf("%s%d", i ? " " : "", best);
		if (llama_decode(c, llama_batch_get_one(&best, 1, pos++, 0)))
			return 1;
	}
	printf("\n");
	llama_free(c);
	llama_free_model(m);
	free(s);
	return 0;
}
