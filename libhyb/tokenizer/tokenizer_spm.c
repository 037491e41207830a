// SPDX-License-Identifier: MIT
/*
 * SentencePiece-style ("llama") encoding as llama.cpp does it: start from
 * single UTF-8 characters, repeatedly merge the adjacent pair whose
 * concatenation is the vocabulary entry with the highest score (leftmost
 * pair on ties), then emit each final piece's id, or its bytes as <0xXX>
 * tokens when the piece is not in the vocabulary. The caller has already
 * escaped spaces to U+2581 and added the leading space.
 */
#include <stdlib.h>

#include "tokenizer_internal.h"
#include "tokenizer_merge.h"

struct spm {
	const struct hyb_tokenizer *t;
	const char *text;
	struct tok_merger mg;
};

/* A pair merges when its concatenation is a vocabulary entry; higher scores first. */
static bool spm_pair(void *ctx, const struct tok_sym *l, const struct tok_sym *r, float *prio)
{
	const struct spm *s = ctx;
	int32_t id = hyb_tok_lookup(s->t, s->text + l->off, l->n + r->n);

	if (id < 0)
		return false;
	*prio = -s->t->tok[id].score;
	return true;
}

/* A final piece: its id, or its bytes (a merged piece is always in the vocabulary). */
static int emit_piece(const struct hyb_tokenizer *t, const char *p, size_t n, struct tok_ids *out)
{
	int32_t id = hyb_tok_lookup(t, p, n);

	if (id >= 0)
		return hyb_tok_ids_push(out, id);
	for (size_t i = 0; i < n; i++) {
		id = t->byte_tok[(unsigned char)p[i]];
		if (id < 0)
			id = t->special[TOK_SP_UNK];
		if (id >= 0 && hyb_tok_ids_push(out, id) < 0)
			return -1;
	}
	return 0;
}

/* Merge symbols [beg, end) (linked among themselves only) and emit the pieces. */
static int encode_segment(struct spm *s, int beg, int end, struct tok_ids *out)
{
	struct tok_sym *sym = s->mg.sym;
	int rc = 0;

	sym[beg].prev = -1;
	sym[end - 1].next = -1;
	if (hyb_tok_merge(&s->mg, beg))
		return -1;
	for (int i = beg; i != -1 && rc == 0; i = sym[i].next)
		rc = emit_piece(s->t, s->text + sym[i].off, sym[i].n, out);
	return rc;
}

int hyb_tok_spm_encode(const struct hyb_tokenizer *t, const char *text, size_t len,
		   struct tok_ids *out)
{
	struct spm s = { .t = t, .text = text };
	size_t off = 0;
	int n_sym = 0, beg = 0, rc = 0;

	if (!len)
		return 0;
	struct tok_sym *sym = malloc(len * sizeof(*sym));

	if (!sym)
		return -1;
	s.mg = (struct tok_merger){ .sym = sym, .pair = spm_pair, .ctx = &s };
	while (off < len) {
		size_t n = tok_utf8_len((unsigned char)text[off]);

		if (n > len - off)
			n = len - off;
		sym[n_sym] = (struct tok_sym){ n_sym - 1, n_sym + 1, off, n };
		off += n;
		n_sym++;
	}
	/*
	 * Cut where no token can span the boundary: merges never cross it, so
	 * the pieces come out exactly as from one pass over the whole text.
	 */
	for (int i = 1; i <= n_sym && rc == 0; i++) {
		if (i < n_sym && hyb_tok_pair_possible(t, text + sym[i - 1].off, sym[i - 1].n,
						   sym[i].n))
			continue;
		rc = encode_segment(&s, beg, i, out);
		beg = i;
	}
	free(sym);
	hyb_tok_merger_release(&s.mg);
	return rc;
}
