// SPDX-License-Identifier: MIT
/*
 * Several sequences in one context (hyb/model.h: hyb_ctx_seq_open,
 * hyb_ctx_eval_seqs): continuous batching's engine, as Orca
 * (Yu et al., OSDI 2022) schedules at the iteration level and vLLM pages
 * the cache. Each call packs the sequences' tokens into passes of at most
 * n_rows tokens; every pass goes through each weight once as one GEMM,
 * while each sequence attends to its own blocks (forward.c runs).
 *
 * A sequence's tokens are cut into n_batch pieces from its first token, as
 * hyb_ctx_eval cuts a prompt, and a piece is never split between passes:
 * attention and the last layer then see each sequence exactly as a pass of
 * it alone would, which batch invariance needs (docs/SERVE.md).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "forward_internal.h"
#include "hybrid/ffn_hybrid.h"
#include "kv_pages.h"
#include "util/error.h"

int hyb_ctx_seq_open(struct hyb_ctx *c, uint32_t n_pos)
{
	int seq;

	if (n_pos == 0 || n_pos > c->n_ctx)
		return hyb_error_set(-EINVAL, "a sequence of %u positions: must be 1..%u", n_pos,
				     c->n_ctx);
	if (!c->kv) {
		if (c->seq0_open)
			return hyb_error_set(-ENOSPC, "the context's one sequence is open");
		hyb_ctx_reset(c);
		c->seq0_open = true;
		return 0;
	}
	seq = hyb_kv_pages_open(c->kv, n_pos);
	if (seq < 0)
		return hyb_error_set(seq, "no room for a sequence of %u positions: every "
				     "sequence is open or the KV cache is promised", n_pos);
	if (c->hybrid)
		hyb_ffn_hybrid_seq_open(c->hybrid, seq);
	return seq;
}

/*
 * Reused positions must be what the new sequence would compute: whole
 * n_batch pieces from its first token (docs/SERVE.md "Prefix cache"), and
 * with several sequences whole KV blocks too.
 */
static uint32_t prefix_align(const struct hyb_ctx *c)
{
	uint32_t a = c->n_batch, b = c->kv ? HYB_KV_BLOCK : 1;

	while (a % b) /* lcm(n_batch, HYB_KV_BLOCK): HYB_KV_BLOCK is a power of two */
		a *= 2;
	return a;
}

static bool prefix_ok(const struct hyb_ctx *c)
{
	return !c->hybrid && !c->moe_hybrid && !c->plain_hybrid;
}

int hyb_ctx_seq_open_prefix(struct hyb_ctx *c, uint32_t n_pos, const int32_t *tokens,
			    uint32_t n_tokens, uint32_t *reused)
{
	uint32_t r = 0;
	int seq;

	if (!reused || (n_tokens && !tokens))
		return hyb_error_set(-EINVAL, "hyb_ctx_seq_open_prefix: no tokens or no *reused");
	*reused = 0;
	if (!prefix_ok(c) || n_tokens < 2)
		return hyb_ctx_seq_open(c, n_pos);
	if (n_pos == 0 || n_pos > c->n_ctx)
		return hyb_error_set(-EINVAL, "a sequence of %u positions: must be 1..%u", n_pos,
				     c->n_ctx);
	if (!c->kv) {
		const uint32_t kept = c->n_kept, a = prefix_align(c);
		uint32_t n = 0, m = kept < n_tokens - 1 ? kept : n_tokens - 1;

		seq = hyb_ctx_seq_open(c, n_pos);
		if (seq < 0)
			return seq;
		while (n < m && c->kept[n] == tokens[n])
			n++;
		r = n / a * a;
		r = r < n_pos ? r : 0;
		c->n_past = r;
		c->n_kept = kept; /* rows past r stay valid until written */
		*reused = r;
		return seq;
	}
	seq = hyb_kv_pages_open_prefix(c->kv, n_pos, tokens, n_tokens, prefix_align(c), &r);
	if (seq < 0)
		return hyb_error_set(seq, "no room for a sequence of %u positions: every "
				     "sequence is open or the KV cache is promised", n_pos);
	*reused = r;
	return seq;
}

int hyb_ctx_seq_keep(struct hyb_ctx *c, int seq, const int32_t *tokens, uint32_t n)
{
	const uint32_t a = prefix_align(c);

	if (n && !tokens)
		return hyb_error_set(-EINVAL, "hyb_ctx_seq_keep: no tokens");
	if (c->kv ? !hyb_kv_pages_is_open(c->kv, seq) : seq != 0 || !c->seq0_open)
		return hyb_error_set(-EINVAL, "sequence %d is not open", seq);
	if (!prefix_ok(c))
		return 0;
	n = n / a * a;
	if (c->kv) {
		const int rc = hyb_kv_pages_keep(c->kv, seq, tokens, n);

		return rc ? hyb_error_set(rc, "out of memory for the prefix cache") : 0;
	}
	n = n < c->n_past ? n : c->n_past;
	if (!n)
		return 0;
	int32_t *k = realloc(c->kept, sizeof(*k) * n);

	if (!k)
		return hyb_error_set(-ENOMEM, "out of memory for the prefix cache");
	memcpy(k, tokens, sizeof(*k) * n);
	c->kept = k;
	c->n_kept = n;
	return 0;
}

int hyb_ctx_seq_close(struct hyb_ctx *c, int seq)
{
	if (!c->kv) {
		if (seq != 0 || !c->seq0_open)
			return hyb_error_set(-EINVAL, "sequence %d is not open", seq);
		c->seq0_open = false;
		return 0;
	}
	if (hyb_kv_pages_close(c->kv, seq))
		return hyb_error_set(-EINVAL, "sequence %d is not open", seq);
	if (c->hybrid)
		hyb_ffn_hybrid_seq_close(c->hybrid, seq);
	return 0;
}

uint32_t hyb_ctx_seq_pos(const struct hyb_ctx *c, int seq)
{
	if (!c->kv)
		return seq == 0 && c->seq0_open ? c->n_past : 0;
	return hyb_kv_pages_pos(c->kv, seq);
}

void hyb_ctx_kv_stats(const struct hyb_ctx *c, struct hyb_kv_stats *out)
{
	struct hyb_kv_pages_stats st;

	memset(out, 0, sizeof(*out));
	out->block_pos = HYB_KV_BLOCK;
	if (!c->kv) {
		/* one sequence: its whole context is one block, always reserved */
		out->block_pos = c->n_ctx;
		out->blocks = out->reserved = 1;
		out->used = c->n_past > 0;
		out->seqs = c->seq0_open;
		out->max_seqs = 1;
		return;
	}
	hyb_kv_pages_stats(c->kv, &st);
	out->blocks = st.blocks;
	out->used = st.used;
	out->kept = st.kept;
	out->reserved = st.reserved;
	out->seqs = st.seqs;
	out->max_seqs = st.max_seqs;
}

static int check(const struct hyb_ctx *c, const struct hyb_seq_tokens *b, uint32_t n_b)
{
	const uint32_t V = c->m->hp.n_vocab;

	if (!b || n_b == 0)
		return hyb_error_set(-EINVAL, "no sequences to evaluate");
	if (c->probe || c->moe_probe || c->in_probe)
		return hyb_error_set(-EINVAL, "probes watch one sequence: use hyb_ctx_eval");
	if (n_b > (c->kv ? c->n_seq : 1))
		return hyb_error_set(-EINVAL, "%u sequences in one call: the context has %u",
				     n_b, c->kv ? c->n_seq : 1);
	for (uint32_t i = 0; i < n_b; i++) {
		const int s = b[i].seq;

		if (c->kv ? !hyb_kv_pages_is_open(c->kv, s) : s != 0 || !c->seq0_open)
			return hyb_error_set(-EINVAL, "sequence %d is not open", s);
		if (b[i].n == 0 || !b[i].tokens)
			return hyb_error_set(-EINVAL, "no tokens for sequence %d", s);
		for (uint32_t k = 0; k < i; k++)
			if (b[k].seq == s)
				return hyb_error_set(-EINVAL, "sequence %d given twice", s);
		if (c->kv && (uint64_t)hyb_kv_pages_pos(c->kv, s) + b[i].n >
				     hyb_kv_pages_cap(c->kv, s))
			return hyb_error_set(-ENOSPC, "sequence %d full: %u + %u tokens exceed "
					     "the %u it was opened for", s,
					     hyb_kv_pages_pos(c->kv, s), b[i].n,
					     hyb_kv_pages_cap(c->kv, s));
		for (uint32_t t = 0; t < b[i].n; t++)
			if (b[i].tokens[t] < 0 || (uint32_t)b[i].tokens[t] >= V)
				return hyb_error_set(-EINVAL, "token id %d out of range [0, %u)",
						     b[i].tokens[t], V);
	}
	return 0;
}

int hyb_ctx_eval_seqs(struct hyb_ctx *c, const struct hyb_seq_tokens *b, uint32_t n_b,
		      float *logits)
{
	return hyb_ctx_eval_seqs_all(c, b, n_b, logits, NULL);
}

int hyb_ctx_eval_seqs_all(struct hyb_ctx *c, const struct hyb_seq_tokens *b, uint32_t n_b,
			  float *logits, float *const *all)
{
	const uint32_t V = c->m->hp.n_vocab;
	const unsigned int since = hyb_error_count();
	struct hyb_fwd_run *runs = NULL;
	uint32_t *done = NULL, *out = NULL, *row_of = NULL, *idx = NULL, *at = NULL;
	int32_t *tok = NULL;
	float *lg = NULL;
	char err[1024] = "";
	int rc = check(c, b, n_b);

	if (rc)
		return rc;
	if (!c->kv) {
		if (!all || !all[0])
			return hyb_ctx_eval(c, b[0].tokens, b[0].n, logits, false);
		rc = hyb_ctx_eval(c, b[0].tokens, b[0].n, all[0], true);
		if (!rc)
			memcpy(logits, all[0] + (size_t)(b[0].n - 1) * V, sizeof(float) * V);
		return rc;
	}
	runs = malloc(sizeof(*runs) * n_b);
	done = calloc(n_b, sizeof(*done));
	/* output rows: each entry's last token, or every token of an entry with all */
	out = malloc(sizeof(*out) * c->n_rows);
	row_of = malloc(sizeof(*row_of) * c->n_rows);
	at = malloc(sizeof(*at) * c->n_rows);
	idx = malloc(sizeof(*idx) * n_b);
	tok = malloc(sizeof(*tok) * c->n_rows);
	lg = malloc(sizeof(*lg) * V * c->n_rows);
	if (!runs || !done || !out || !row_of || !at || !idx || !tok || !lg) {
		rc = hyb_error_set(-ENOMEM, "out of memory");
		goto out;
	}
	for (;;) {
		uint32_t n = 0, nr = 0, n_out = 0;

		/* one piece (n_batch tokens at most) of each unfinished sequence that fits */
		for (uint32_t i = 0; i < n_b; i++) {
			const uint32_t left = b[i].n - done[i];
			const uint32_t piece = left < c->n_batch ? left : c->n_batch;

			if (!left || n + piece > c->n_rows)
				continue;
			runs[nr] = (struct hyb_fwd_run){
				.t0 = n, .n = piece, .pos = hyb_kv_pages_pos(c->kv, b[i].seq),
				.blocks = hyb_kv_pages_extend(c->kv, b[i].seq, piece),
				.seq = b[i].seq,
			};
			memcpy(tok + n, b[i].tokens + done[i], sizeof(*tok) * piece);
			c->run_cols[nr] = piece;
			idx[nr] = i;
			for (uint32_t t = all && all[i] ? 0 : piece - 1; t < piece; t++)
				if ((all && all[i]) || done[i] + piece == b[i].n) {
					out[n_out] = n + t;
					at[n_out] = done[i] + t;
					row_of[n_out++] = i;
				}
			n += piece;
			nr++;
		}
		if (!nr)
			break;
		c->runs = runs;
		c->n_runs = nr;
		c->cols = c->run_cols;
		c->n_cols = nr;
		rc = hyb_fwd_eval_runs(c, tok, n, out, n_out, lg, err, sizeof(err));
		if (rc) {
			/* -1: a step that kept no errno; what failed underneath has one */
			if (rc == -1)
				rc = hyb_error_cause(since, -EIO);
			rc = hyb_error_set(rc, "%s", err[0] ? err : "evaluation failed");
			goto out;
		}
		for (uint32_t r = 0; r < nr; r++) {
			hyb_kv_pages_advance(c->kv, b[idx[r]].seq, runs[r].n);
			done[idx[r]] += runs[r].n;
		}
		for (uint32_t k = 0; k < n_out; k++) {
			const struct hyb_seq_tokens *e = &b[row_of[k]];

			if (all && all[row_of[k]])
				memcpy(all[row_of[k]] + (size_t)at[k] * V, lg + (size_t)k * V,
				       sizeof(float) * V);
			if (at[k] == e->n - 1)
				memcpy(logits + (size_t)row_of[k] * V, lg + (size_t)k * V,
				       sizeof(float) * V);
		}
	}
out:
	c->runs = NULL;
	c->n_runs = 0;
	c->cols = NULL;
	free(runs);
	free(done);
	free(out);
	free(row_of);
	free(at);
	free(idx);
	free(tok);
	free(lg);
	return rc;
}
