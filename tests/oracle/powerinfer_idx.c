// SPDX-License-Identifier: MIT
/*
 * Reads a GPU index with PowerInfer's own GGUF reader (its ggml.c, as its
 * llama.cpp loads MODEL.generated.gpuidx; a CPU build never loads one, so
 * this calls the reader directly): every tensor with its type, length and
 * the sum of its I32 values. tests/oracle/powerinfer-ref.sh --check-index.
 * An index of I32 numbered 26 (the gguf package's) makes this reader divide
 * by the zero block size of a type it does not know (SIGFPE).
 */
#include <stdio.h>

#include "ggml.h"

int main(int argc, char **argv)
{
	struct ggml_context *ctx = NULL;
	struct gguf_init_params p = { .no_alloc = false, .ctx = &ctx };
	struct gguf_context *g;

	if (argc != 2) {
		fprintf(stderr, "usage: powerinfer_idx FILE.gpuidx\n");
		return 2;
	}
	g = gguf_init_from_file(argv[1], p);
	if (!g) {
		fprintf(stderr, "powerinfer_idx: PowerInfer cannot read %s\n", argv[1]);
		return 1;
	}
	for (int i = 0; i < gguf_get_n_tensors(g); i++) {
		const struct ggml_tensor *t = ggml_get_tensor(ctx, gguf_get_tensor_name(g, i));
		long long s = 0;

		for (long long j = 0; j < t->ne[0]; j++)
			s += ((const int *)t->data)[j];
		printf("%s type %d length %lld sum %lld\n", t->name, (int)t->type,
		       (long long)t->ne[0], s);
	}
	gguf_free(g);
	ggml_free(ctx);
	return 0;
}
