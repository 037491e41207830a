// SPDX-License-Identifier: MIT
/*
 * hyb perplexity: the perplexity of a model on a text file, computed as
 * llama.cpp's llama-perplexity computes it, so the two numbers compare: the
 * text tokenized whole (BOS as the model wants), cut into chunks of -c
 * tokens, each chunk evaluated from an empty cache with its first token
 * replaced by BOS, and the second half of each chunk scored (every position
 * from n_ctx/2 predicts the next token). PPL = exp(mean negative log
 * likelihood); the +/- is its standard error, as llama.cpp prints it.
 * With --cats the FFNs run with CATS thresholds (hyb/sparsity.h), which is
 * how a sparsity's cost in quality is measured (docs/SPARSITY.md).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "hyb/clock.h"
#include "hyb/tokenizer.h"

static const char usage[] =
	"usage: hyb perplexity -m MODEL -f TEXT [-c 512] [--chunks N] [-t N]\n"
	"                      [--cats PROFILE] [--sparsity S]\n"
	"  -f TEXT         the text to score (UTF-8)\n"
	"  -c N            tokens per chunk (default 512); the text needs 2 chunks\n"
	"  --chunks N      score only the first N chunks\n"
	"  --cats PROFILE  CATS thresholds from a profile of hybctl profile --sparsity\n"
	"  --sparsity S    with --cats: thresholds for sparsity S in (0, 1) from the\n"
	"                  profile's quantiles; 0: no thresholds (a plan's own too)\n";

static char *read_text(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	char *buf = NULL;
	size_t cap = 0;

	if (!f)
		cli_die("cannot open %s: %s", path, strerror(errno));
	*len = 0;
	for (;;) {
		if (cap - *len < 65536) {
			char *nb = realloc(buf, cap = cap ? 2 * cap : 1 << 20);

			if (!nb)
				cli_die("out of memory reading %s", path);
			buf = nb;
		}
		size_t got = fread(buf + *len, 1, cap - *len - 1, f);

		*len += got;
		if (!got)
			break;
	}
	if (ferror(f))
		cli_die("cannot read %s: %s", path, strerror(errno));
	fclose(f);
	buf[*len] = 0;
	return buf;
}

/* log p(tok) under logits (llama.cpp's log_softmax: float max, double sum). */
static double log_prob(const float *logits, uint32_t n_vocab, int32_t tok)
{
	float mx = logits[0];
	double sum = 0;

	for (uint32_t i = 1; i < n_vocab; i++)
		mx = logits[i] > mx ? logits[i] : mx;
	for (uint32_t i = 0; i < n_vocab; i++)
		sum += expf(logits[i] - mx);
	return logits[tok] - mx - log(sum);
}

int cmd_perplexity(int argc, char **argv)
{
	struct cli_opts o = { 0 };
	struct hyb_model *m;
	struct hyb_ctx *c;
	int32_t *ids, *chunk;
	float *logits;
	char *text;
	size_t len;
	int n, n_chunk;
	double nll = 0, nll2 = 0, t0;
	uint64_t count = 0;

	cli_parse(argc, argv, &o, usage);
	if (!o.text_file)
		cli_die("no text given (-f FILE)");
	if (!o.n_ctx)
		o.n_ctx = 512;
	if (o.n_ctx < 4)
		cli_die("-c %u: a chunk needs at least 4 tokens", o.n_ctx);
	text = read_text(o.text_file, &len);
	m = cli_load_model(&o);
	if (!m->tok)
		cli_die("the model has no usable tokenizer (tokenizer.ggml.* metadata)");
	n = hyb_tokenize(m->tok, text, len, true, NULL, 0);
	if (n < 0)
		cli_die("cannot tokenize %s: %s", o.text_file, hyb_last_error());
	ids = malloc(sizeof(*ids) * (n ? n : 1));
	if (!ids || hyb_tokenize(m->tok, text, len, true, ids, n) != n)
		cli_die("cannot tokenize %s", o.text_file);
	free(text);
	if ((uint64_t)n < 2ull * o.n_ctx)
		cli_die("%s tokenizes to %d tokens: -c %u needs at least %u", o.text_file, n,
			o.n_ctx, 2 * o.n_ctx);
	n_chunk = n / (int)o.n_ctx;
	if (o.n_chunks && o.n_chunks < n_chunk)
		n_chunk = o.n_chunks;
	c = cli_new_ctx(m, &o);
	logits = malloc(sizeof(float) * m->hp.n_vocab * o.n_ctx);
	chunk = malloc(sizeof(*chunk) * o.n_ctx);
	if (!logits || !chunk)
		cli_die("out of memory for %u x %u logits", o.n_ctx, m->hp.n_vocab);
	fprintf(stderr, "perplexity: %d tokens, %d chunks of %u, scoring positions %u..%u of "
		"each%s\n", n, n_chunk, o.n_ctx, o.n_ctx / 2, o.n_ctx - 2,
		hyb_ctx_ffn_thresholds(c) ? ", CATS thresholds on" : "");
	t0 = hyb_now();
	for (int i = 0; i < n_chunk; i++) {
		const uint32_t first = o.n_ctx / 2;

		memcpy(chunk, ids + (size_t)i * o.n_ctx, sizeof(*chunk) * o.n_ctx);
		if (hyb_tokenizer_add_bos(m->tok) && hyb_tokenizer_bos(m->tok) >= 0)
			chunk[0] = hyb_tokenizer_bos(m->tok);
		hyb_ctx_reset(c);
		if (hyb_ctx_eval(c, chunk, o.n_ctx, logits, true))
			cli_die("chunk %d: %s", i + 1, hyb_last_error());
		for (uint32_t j = first; j + 1 < o.n_ctx; j++) {
			const double lp = log_prob(logits + (size_t)j * m->hp.n_vocab, m->hp.n_vocab,
						   ids[(size_t)i * o.n_ctx + j + 1]);

			nll -= lp;
			nll2 += lp * lp;
			count++;
		}
		printf("[%d]%.4f,", i + 1, exp(nll / (double)count));
		fflush(stdout);
	}
	printf("\n");
	nll /= (double)count;
	nll2 = nll2 / (double)count - nll * nll;
	nll2 = nll2 > 0 ? sqrt(nll2 / (double)(count - 1)) : 0;
	printf("Final estimate: PPL = %.4f +/- %.5f\n", exp(nll), nll2 * exp(nll));
	fprintf(stderr, "perplexity: %llu tokens scored in %.2f s (%.1f tokens/s evaluated)\n",
		(unsigned long long)count, hyb_now() - t0,
		(double)n_chunk * o.n_ctx / (hyb_now() - t0));
	free(logits);
	free(chunk);
	free(ids);
	hyb_ctx_free(c);
	hyb_model_free(m);
	return 0;
}
