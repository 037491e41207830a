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

struct sym {
	int prev, next;
	size_t off, n; /* bytes of the text; n == 0 once merged into its left neighbour */
};

struct bigram {
	int left, right;
	float score;
	size_t size;
};

struct spm {
	const struct hyb_tokenizer *t;
	const char *text;
	struct sym *sym;
	struct bigram *heap;
	size_t n_heap, cap_heap;
	bool oom;
};

/* Heap order: higher score first, then the leftmost pair. */
static bool before(const struct bigram *a, const struct bigram *b)
{
	return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static void heap_push(struct spm *s, struct bigram b)
{
	size_t i;

	if (s->n_heap == s->cap_heap) {
		size_t cap = s->cap_heap ? s->cap_heap * 2 : 256;
		struct bigram *h = realloc(s->heap, cap * sizeof(*h));

		if (!h) {
			s->oom = true;
			return;
		}
		s->heap = h;
		s->cap_heap = cap;
	}
	i = s->n_heap++;
	while (i > 0) {
		size_t parent = (i - 1) / 2;

		if (!before(&b, &s->heap[parent]))
			break;
		s->heap[i] = s->heap[parent];
		i = parent;
	}
	s->heap[i] = b;
}

static struct bigram heap_pop(struct spm *s)
{
	struct bigram top = s->heap[0], last = s->heap[--s->n_heap];
	size_t i = 0, n = s->n_heap;

	for (;;) {
		size_t c = 2 * i + 1;

		if (c >= n)
			break;
		if (c + 1 < n && before(&s->heap[c + 1], &s->heap[c]))
			c++;
		if (!before(&s->heap[c], &last))
			break;
		s->heap[i] = s->heap[c];
		i = c;
	}
	if (n)
		s->heap[i] = last;
	return top;
}

static void try_bigram(struct spm *s, int left, int right)
{
	const struct hyb_tokenizer *t = s->t;
	size_t n;
	int32_t id;

	if (left < 0 || right < 0)
		return;
	n = s->sym[left].n + s->sym[right].n;
	id = tok_lookup(t, s->text + s->sym[left].off, n);
	if (id < 0)
		return;
	heap_push(s, (struct bigram){ left, right, t->tok[id].score, n });
}

/* A final piece: its id, or its bytes (a merged piece is always in the vocabulary). */
static int emit_piece(const struct hyb_tokenizer *t, const char *p, size_t n, struct tok_ids *out)
{
	int32_t id = tok_lookup(t, p, n);

	if (id >= 0)
		return tok_ids_push(out, id);
	for (size_t i = 0; i < n; i++) {
		id = t->byte_tok[(unsigned char)p[i]];
		if (id < 0)
			id = t->special[TOK_SP_UNK];
		if (id >= 0 && tok_ids_push(out, id) < 0)
			return -1;
	}
	return 0;
}

/* Merge symbols [beg, end) (linked among themselves only) and emit the pieces. */
static int encode_segment(struct spm *s, int beg, int end, struct tok_ids *out)
{
	int rc = 0;

	s->sym[beg].prev = -1;
	s->sym[end - 1].next = -1;
	s->n_heap = 0;
	for (int i = beg + 1; i < end; i++)
		try_bigram(s, i - 1, i);
	while (s->n_heap && !s->oom) {
		struct bigram b = heap_pop(s);
		struct sym *l = &s->sym[b.left], *r = &s->sym[b.right];

		/* Stale entry: one side was merged away since it was queued. */
		if (l->n == 0 || r->n == 0 || l->n + r->n != b.size)
			continue;
		l->n += r->n;
		r->n = 0;
		l->next = r->next;
		if (r->next >= 0)
			s->sym[r->next].prev = b.left;
		try_bigram(s, l->prev, b.left);
		try_bigram(s, b.left, l->next);
	}
	if (s->oom)
		return -1;
	for (int i = beg; i != -1 && rc == 0; i = s->sym[i].next)
		rc = emit_piece(s->t, s->text + s->sym[i].off, s->sym[i].n, out);
	return rc;
}

int tok_spm_encode(const struct hyb_tokenizer *t, const char *text, size_t len,
		   struct tok_ids *out)
{
	struct spm s = { t, text, NULL, NULL, 0, 0, false };
	size_t off = 0;
	int n_sym = 0, beg = 0, rc = 0;

	if (!len)
		return 0;
	s.sym = malloc(len * sizeof(*s.sym));
	if (!s.sym)
		return -1;
	while (off < len) {
		size_t n = tok_utf8_len((unsigned char)text[off]);

		if (n > len - off)
			n = len - off;
		s.sym[n_sym] = (struct sym){ n_sym - 1, n_sym + 1, off, n };
		off += n;
		n_sym++;
	}
	/*
	 * Cut where no token can span the boundary: merges never cross it, so
	 * the pieces come out exactly as from one pass over the whole text.
	 */
	for (int i = 1; i <= n_sym && rc == 0; i++) {
		if (i < n_sym && tok_pair_possible(t, text + s.sym[i - 1].off, s.sym[i - 1].n,
						   s.sym[i].n))
			continue;
		rc = encode_segment(&s, beg, i, out);
		beg = i;
	}
	free(s.sym);
	free(s.heap);
	return rc;
}
