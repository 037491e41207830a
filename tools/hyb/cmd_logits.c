// SPDX-License-Identifier: MIT
/*
 * hyb logits: every position's logits for a list of token ids, written as
 * float32 [n_tokens][n_vocab]. The test oracle compares them with an
 * independent reference; --decode runs the tokens one at a time through the
 * KV cache instead of one batched pass, so both paths are checked.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "hyb/tokenizer.h"

static const char usage[] =
	"usage: hyb logits -m MODEL (--tokens ID,ID,... | -p TEXT) -o FILE [--decode] [-t N]\n";

static int32_t *parse_ids(const char *s, int *n)
{
	char *copy = strdup(s), *save = NULL;
	int cap = 1;
	int32_t *ids;

	for (const char *p = s; *p; p++)
		cap += *p == ',';
	ids = malloc(sizeof(*ids) * cap);
	if (!ids || !copy)
		cli_die("out of memory");
	*n = 0;
	for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
		ids[(*n)++] = (int32_t)cli_num("--tokens", tok, 0, 2147483647.0);
	free(copy);
	if (!*n)
		cli_die("--tokens: no token ids");
	return ids;
}

int cmd_logits(int argc, char **argv)
{
	struct cli_opts o = { 0 };
	struct hyb_model *m;
	struct hyb_ctx *c;
	int32_t *ids;
	float *logits;
	int n;
	FILE *f;

	cli_parse(argc, argv, &o, usage);
	if (!o.out)
		cli_die("no output file (-o FILE)");
	m = cli_load_model(&o);
	if (o.tokens)
		ids = parse_ids(o.tokens, &n);
	else if (o.prompt)
		ids = cli_tokenize(m, o.prompt, &n);
	else
		cli_die("give --tokens or -p");
	if (!o.n_ctx)
		o.n_ctx = (uint32_t)n;
	c = cli_new_ctx(m, &o);
	logits = malloc(sizeof(float) * m->hp.n_vocab * (size_t)n);
	if (!logits)
		cli_die("out of memory for %d x %u logits", n, m->hp.n_vocab);
	if (o.decode) {
		for (int i = 0; i < n; i++)
			if (hyb_ctx_eval(c, &ids[i], 1, logits + (size_t)i * m->hp.n_vocab, false))
				cli_die("%s", hyb_last_error());
	} else if (hyb_ctx_eval(c, ids, (uint32_t)n, logits, true)) {
		cli_die("%s", hyb_last_error());
	}
	f = fopen(o.out, "wb");
	if (!f)
		cli_die("cannot create %s: %s", o.out, strerror(errno));
	if (fwrite(logits, sizeof(float) * m->hp.n_vocab, n, f) != (size_t)n || fclose(f))
		cli_die("cannot write %s: %s", o.out, strerror(errno));
	free(logits);
	free(ids);
	hyb_ctx_free(c);
	hyb_model_free(m);
	return 0;
}

int cmd_tokenize(int argc, char **argv)
{
	struct cli_opts o = { 0 };
	struct hyb_model *m;
	int32_t *ids;
	int n;

	cli_parse(argc, argv, &o, "usage: hyb tokenize -m MODEL -p TEXT\n");
	if (!o.prompt)
		cli_die("no text given (-p TEXT)");
	m = cli_load_model(&o);
	ids = cli_tokenize(m, o.prompt, &n);
	for (int i = 0; i < n; i++)
		printf("%s%d", i ? " " : "", ids[i]);
	printf("\n");
	free(ids);
	hyb_model_free(m);
	return 0;
}
