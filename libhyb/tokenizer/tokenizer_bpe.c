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
#include "tokenizer_merge.h"

struct bpe {
	const struct hyb_tokenizer *t;
	const char *word;
	size_t cap_sym;
	struct tok_merger mg;
};

/* A pair merges when the merge list has it; lower ranks first. */
static bool bpe_pair(void *ctx, const struct tok_sym *l, const struct tok_sym *r, float *prio)
{
	const struct bpe *s = ctx;
	int32_t rank = hyb_tok_merge_rank(s->t, s->word + l->off, l->n, s->word + r->off, r->n);

	if (rank < 0)
		return false;
	*prio = (float)rank; /* exact: ranks stay far below 2^24 */
	return true;
}

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

		tab[b].n = (unsigned char)hyb_tok_utf8_encode(cpt, buf);
		memcpy(tab[b].s, buf, tab[b].n);
	}
}

/* Merge one byte-encoded word and append its ids. */
static int encode_word(struct bpe *s, const char *w, size_t len, struct tok_ids *out)
{
	const struct hyb_tokenizer *t = s->t;
	size_t off = 0;
	int n_sym = 0;

	if (t->ignore_merges) {
		int32_t id = hyb_tok_lookup(t, w, len);

		if (id >= 0)
			return hyb_tok_ids_push(out, id);
	}
	if (len > s->cap_sym) {
		struct tok_sym *p = realloc(s->mg.sym, len * sizeof(*p));

		if (!p)
			return -1;
		s->mg.sym = p;
		s->cap_sym = len;
	}
	struct tok_sym *sym = s->mg.sym;

	s->word = w;
	while (off < len) {
		size_t n = tok_utf8_len((unsigned char)w[off]);

		if (n > len - off)
			n = len - off;
		sym[n_sym] = (struct tok_sym){ n_sym - 1, off + n == len ? -1 : n_sym + 1, off, n };
		off += n;
		n_sym++;
	}
	if (n_sym && hyb_tok_merge(&s->mg, 0))
		return -1;
	for (int i = 0; i != -1 && n_sym; i = sym[i].next) {
		const char *p = w + sym[i].off;
		int32_t id = hyb_tok_lookup(t, p, sym[i].n);

		if (id >= 0) {
			if (hyb_tok_ids_push(out, id) < 0)
				return -1;
			continue;
		}
		/* llama.cpp looks the piece's raw bytes up one by one and drops misses. */
		for (size_t k = 0; k < sym[i].n; k++) {
			id = hyb_tok_lookup(t, p + k, 1);
			if (id >= 0 && hyb_tok_ids_push(out, id) < 0)
				return -1;
		}
	}
	return 0;
}

int hyb_tok_bpe_encode(const struct hyb_tokenizer *t, const char *text, size_t len,
		   struct tok_ids *out)
{
	struct bpe s = { .t = t };

	s.mg = (struct tok_merger){ .pair = bpe_pair, .ctx = &s };
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
	n_cpts = hyb_tok_utf8_decode(text, len, cpts);
	if (hyb_tok_pretok_split(t->pre, cpts, n_cpts, &lens, &n_words) < 0) {
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
			int m = hyb_tok_utf8_encode(cpts[k], u);

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
	free(s.mg.sym);
	hyb_tok_merger_release(&s.mg);
	return rc;
}
