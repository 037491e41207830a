// SPDX-License-Identifier: MIT
#include "hyb/generate.h"
#include "hyb/hybrid.h"

#include <errno.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "hyb/model.h"
#include "hyb/sampler.h"
#include "hyb/tokenizer.h"
#include "util/error.h"

int hyb_generate(struct hyb_ctx *c, const struct hyb_model *m, struct hyb_sampler *s,
		 const int32_t *prompt, uint32_t n_prompt, uint32_t n_gen, hyb_token_cb cb,
		 void *arg, struct hyb_gen_stats *st)
{
	float *logits = malloc(sizeof(float) * m->hp.n_vocab);
	double t0;
	int rc;

	memset(st, 0, sizeof(*st));
	if (!logits)
		return hyb_error_set(-ENOMEM, "out of memory");
	if (n_prompt == 0) {
		rc = hyb_error_set(-EINVAL, "empty prompt");
		goto out;
	}
	/* the context's clock: modelled time when a CPU-executed device stands in for a GPU */
	t0 = hyb_ctx_clock(c);
	rc = hyb_ctx_eval(c, prompt, n_prompt, logits, false);
	if (rc)
		goto out;
	st->t_prompt = hyb_ctx_clock(c) - t0;
	st->n_prompt = n_prompt;
	for (uint32_t i = 0; i < n_prompt; i++)
		hyb_sampler_accept(s, prompt[i]);

	t0 = hyb_ctx_clock(c);
	for (uint32_t i = 0; i < n_gen; i++) {
		int32_t tok = hyb_sampler_sample(s, logits);

		if (tok < 0) {
			rc = tok;	/* (the sampler said why) */
			goto out;
		}
		if (m->tok && hyb_tokenizer_is_eog(m->tok, tok))
			break;
		hyb_sampler_accept(s, tok);
		st->n_gen++;
		if (cb && cb(arg, tok))
			break;
		if (i + 1 == n_gen)
			break;
		rc = hyb_ctx_eval(c, &tok, 1, logits, false);
		if (rc)
			goto out;
		st->n_decode++;
	}
	st->t_gen = hyb_ctx_clock(c) - t0;
	rc = 0;
out:
	free(logits);
	return rc;
}
