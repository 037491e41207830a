// SPDX-License-Identifier: MIT
/*
 * Byte-level BPE ("gpt2") encoding as llama.cpp does it: split the text into
 * words with the pre-tokenizer, map every byte of a word to its printable
 * GPT-2 stand-in character, then repeatedly merge the adjacent pair with the
 * lowest merge rank (leftmost on ties) and emit the ids of the final pieces.
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"

struct sym {
	int prev, next;
	size_t off, n;
};

struct bigram {
	int left, right;
	int32_t rank;
	size_t size;
};

struct bpe {
	const struct hyb_tokenizer *t;
	const char *word;
	struct sym *sym;
	size_t cap_sym;
	struct bigram *heap;
	size_t n_heap, cap_heap;
	bool oom;
};

/*
 * GPT-2's byte-to-character table: printable Latin-1 bytes stand for
 * themselves, the other 68 take code points 256, 257, ... in byte order.
 */
struct byte_enc {
	char s[2];
	unsigned char n;
};

static void byte_table(struct byte_enc tab[256])
{
	uint32_t next = 256;

	for (int b = 0; b < 256; b++) {
		bool self = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
		uint32_t cpt = self ? (uint32_t)b : next++;
		char buf[4];

		tab[b].n = (unsigned char)tok_utf8_encode(cpt, buf);
		memcpy(tab[b].s, buf, tab[b].n);
	}
}

static bool before(const struct bigram *a, const struct bigram *b)
{
	return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static void heap_push(struct bpe *s, struct bigram b)
{
	size_t i;

	if (s->n_heap == s->cap_heap) {
		size_t cap = s->cap_heap ? s->cap_heap * 2 : 64;
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

static struct bigram heap_pop(struct bpe *s)
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

static void try_bigram(struct bpe *s, int left, int right)
{
	const struct sym *l, *r;
	int32_t rank;

	if (left < 0 || right < 0)
		return;
	l = &s->sym[left];
	r = &s->sym[right];
	rank = tok_merge_rank(s->t, s->word + l->off, l->n, s->word + r->off, r->n);
	if (rank < 0)
		return;
	heap_push(s, (struct bigram){ left, right, rank, l->n + r->n });
}

/* Merge one byte-encoded word and append its ids. */
static int encode_word(struct bpe *s, const char *w, size_t len, struct tok_ids *out)
{
	const struct hyb_tokenizer *t = s->t;
	size_t off = 0;
	int n_sym = 0;

	if (t->ignore_merges) {
		int32_t id = tok_lookup(t, w, len);

		if (id >= 0)
			return tok_ids_push(out, id);
	}
	if (len > s->cap_sym) {
		struct sym *p = realloc(s->sym, len * sizeof(*p));

		if (!p)
			return -1;
		s->sym = p;
		s->cap_sym = len;
	}
	s->word = w;
	s->n_heap = 0;
	while (off < len) {
		size_t n = tok_utf8_len((unsigned char)w[off]);

		if (n > len - off)
			n = len - off;
		s->sym[n_sym] = (struct sym){ n_sym - 1, off + n == len ? -1 : n_sym + 1, off, n };
		off += n;
		n_sym++;
	}
	for (int i = 1; i < n_sym; i++)
		try_bigram(s, i - 1, i);
	while (s->n_heap && !s->oom) {
		struct bigram b = heap_pop(s);
		struct sym *l = &s->sym[b.left], *r = &s->sym[b.right];

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
	for (int i = 0; i != -1 && n_sym; i = s->sym[i].next) {
		const char *p = w + s->sym[i].off;
		int32_t id = tok_lookup(t, p, s->sym[i].n);

		if (id >= 0) {
			if (tok_ids_push(out, id) < 0)
				return -1;
			continue;
		}
		/* llama.cpp looks the piece's raw bytes up one by one and drops misses. */
		for (size_t k = 0; k < s->sym[i].n; k++) {
			id = tok_lookup(t, p + k, 1);
			if (id >= 0 && tok_ids_push(out, id) < 0)
				return -1;
		}
	}
	return 0;
}

int tok_bpe_encode(const struct hyb_tokenizer *t, const char *text, size_t len,
		   struct tok_ids *out)
{
	struct bpe s = { t, NULL, NULL, 0, NULL, 0, 0, false };
	struct byte_enc enc[256];
	uint32_t *cpts;
	size_t n_cpts, *lens = NULL, n_words = 0, start = 0, cap_w = 0;
	char *w = NULL;
	int rc = 0;

	if (!len)
		return 0;
	byte_table(enc);
	cpts = malloc(len * sizeof(*cpts));
	if (!cpts)
		return -1;
	n_cpts = tok_utf8_decode(text, len, cpts);
	if (tok_pretok_split(t->pre, cpts, n_cpts, &lens, &n_words) < 0) {
		free(cpts);
		return -1;
	}
	for (size_t i = 0; i < n_words && rc == 0; i++) {
		size_t need = lens[i] * 8, n = 0; /* 4 UTF-8 bytes, each 2 bytes encoded */

		if (need > cap_w) {
			char *p = realloc(w, need);

			if (!p) {
				rc = -1;
				break;
			}
			w = p;
			cap_w = need;
		}
		/* Invalid input was decoded to U+FFFD, so the word is re-encoded, as llama.cpp. */
		for (size_t k = start; k < start + lens[i]; k++) {
			char u[4];
			int m = tok_utf8_encode(cpts[k], u);

			for (int j = 0; j < m; j++) {
				const struct byte_enc *e = &enc[(unsigned char)u[j]];

				memcpy(w + n, e->s, e->n);
				n += e->n;
			}
		}
		start += lens[i];
		rc = encode_word(&s, w, n, out);
	}
	free(w);
	free(lens);
	free(cpts);
	free(s.sym);
	free(s.heap);
	return rc;
}
