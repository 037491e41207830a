// SPDX-License-Identifier: MIT
/*
 * Unicode helpers and the BPE pre-tokenizers. The regular expressions that
 * Hugging Face tokenizers apply before BPE are implemented as hand-written
 * scanners over code points, reproducing the splits llama.cpp's unicode.cpp
 * produces (its own quirks included, so token ids match). Code point classes
 * (\p{L}, \p{N}, ...) come from utf8proc; \s is llama.cpp's fixed list.
 */
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "tokenizer_internal.h"

size_t hyb_tok_utf8_decode(const char *str, size_t len, uint32_t *out)
{
	const unsigned char *s = (const unsigned char *)str;
	size_t i = 0, n = 0;

	while (i < len) {
		unsigned char c = s[i];
		size_t need;
		uint32_t cpt;

		if (c < 0x80) {
			out[n++] = c;
			i++;
			continue;
		}
		/* Lead byte decides the length; no overlong or surrogate checks (as llama.cpp). */
		if ((c & 0xe0) == 0xc0) {
			need = 2;
			cpt = c & 0x1f;
		} else if ((c & 0xf0) == 0xe0) {
			need = 3;
			cpt = c & 0x0f;
		} else if ((c & 0xf8) == 0xf0) {
			need = 4;
			cpt = c & 0x07;
		} else {
			need = 0; /* continuation byte or 0xf8..0xff */
			cpt = 0;
		}
		if (need && i + need <= len) {
			size_t k;

			for (k = 1; k < need; k++) {
				if ((s[i + k] & 0xc0) != 0x80)
					break;
				cpt = (cpt << 6) | (s[i + k] & 0x3f);
			}
			if (k == need) {
				out[n++] = cpt > 0x10ffff ? 0xfffd : cpt;
				i += need;
				continue;
			}
		}
		out[n++] = 0xfffd;
		i++;
	}
	return n;
}

int hyb_tok_utf8_encode(uint32_t cpt, char *buf)
{
	unsigned char *b = (unsigned char *)buf;

	if (cpt > 0x10ffff)
		cpt = 0xfffd;
	if (cpt < 0x80) {
		b[0] = (unsigned char)cpt;
		return 1;
	}
	if (cpt < 0x800) {
		b[0] = 0xc0 | (cpt >> 6);
		b[1] = 0x80 | (cpt & 0x3f);
		return 2;
	}
	if (cpt < 0x10000) {
		b[0] = 0xe0 | (cpt >> 12);
		b[1] = 0x80 | ((cpt >> 6) & 0x3f);
		b[2] = 0x80 | (cpt & 0x3f);
		return 3;
	}
	b[0] = 0xf0 | (cpt >> 18);
	b[1] = 0x80 | ((cpt >> 12) & 0x3f);
	b[2] = 0x80 | ((cpt >> 6) & 0x3f);
	b[3] = 0x80 | (cpt & 0x3f);
	return 4;
}

/* The code points llama.cpp treats as \s. */
static bool is_space(uint32_t c)
{
	if (c < 0x80)
		return c == ' ' || (c >= 0x09 && c <= 0x0d);
	switch (c) {
	case 0x85: case 0xa0: case 0x1680: case 0x2028: case 0x2029:
	case 0x202f: case 0x205f: case 0x3000:
		return true;
	default:
		return c >= 0x2000 && c <= 0x200a;
	}
}

static uint32_t hyb_tok_cpt_flags(uint32_t cpt)
{
	uint32_t f;

	if (cpt > 0x10ffff)
		return TOK_CPT_UNDEFINED;
	switch (utf8proc_category((utf8proc_int32_t)cpt)) {
	case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
	case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO:
		f = TOK_CPT_LETTER;
		break;
	case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME:
		f = TOK_CPT_MARK;
		break;
	case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO:
		f = TOK_CPT_NUMBER;
		break;
	case UTF8PROC_CATEGORY_PC: case UTF8PROC_CATEGORY_PD: case UTF8PROC_CATEGORY_PS:
	case UTF8PROC_CATEGORY_PE: case UTF8PROC_CATEGORY_PI: case UTF8PROC_CATEGORY_PF:
	case UTF8PROC_CATEGORY_PO:
		f = TOK_CPT_PUNCT;
		break;
	case UTF8PROC_CATEGORY_SM: case UTF8PROC_CATEGORY_SC: case UTF8PROC_CATEGORY_SK:
	case UTF8PROC_CATEGORY_SO:
		f = TOK_CPT_SYMBOL;
		break;
	case UTF8PROC_CATEGORY_ZS: case UTF8PROC_CATEGORY_ZL: case UTF8PROC_CATEGORY_ZP:
		f = TOK_CPT_SEPARATOR;
		break;
	case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS:
	case UTF8PROC_CATEGORY_CO:
		f = TOK_CPT_CONTROL;
		break;
	default:
		f = TOK_CPT_UNDEFINED;
		break;
	}
	if (is_space(cpt))
		f |= TOK_CPT_SPACE;
	return f;
}

/* ---- splitting passes: a list of chunk lengths in, a finer list out ---- */

struct lens {
	size_t *v;
	size_t n, cap;
	bool oom;
};

static void lens_push(struct lens *l, size_t len)
{
	if (!len || l->oom)
		return;
	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 64;
		size_t *v = realloc(l->v, cap * sizeof(*v));

		if (!v) {
			l->oom = true;
			return;
		}
		l->v = v;
		l->cap = cap;
	}
	l->v[l->n++] = len;
}

/* The code points of one chunk, with out-of-chunk positions reading as "nothing". */
struct chunk {
	const uint32_t *cpts;
	size_t beg, end;
	size_t prev;        /* end of the last word emitted */
	struct lens *out;
};

#define NO_CPT 0xffffffffu

static uint32_t ch_cpt(const struct chunk *c, size_t pos)
{
	return pos >= c->beg && pos < c->end ? c->cpts[pos] : NO_CPT;
}

/* Flags of the code point at pos; 0 (no class at all) outside the chunk. */
static uint32_t ch_flags(const struct chunk *c, size_t pos)
{
	return pos >= c->beg && pos < c->end ? hyb_tok_cpt_flags(c->cpts[pos]) : 0;
}

/* End the current word at `end`; returns end so scanners can continue from it. */
static size_t ch_emit(struct chunk *c, size_t end)
{
	lens_push(c->out, end - c->prev);
	c->prev = end;
	return end;
}

/* 's 't 're 've 'm 'll 'd at pos (optionally case-insensitive): the match length or 0. */
static size_t contraction(const struct chunk *c, size_t pos, bool fold)
{
	uint32_t a, b;

	if (ch_cpt(c, pos) != '\'' || pos + 1 >= c->end)
		return 0;
	a = ch_cpt(c, pos + 1);
	if (fold)
		a = (uint32_t)utf8proc_tolower((utf8proc_int32_t)a);
	if (a == 's' || a == 't' || a == 'm' || a == 'd')
		return 2;
	if (pos + 2 >= c->end)
		return 0;
	b = ch_cpt(c, pos + 2);
	if (fold)
		b = (uint32_t)utf8proc_tolower((utf8proc_int32_t)b);
	if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
		return 3;
	return 0;
}

#define NOT_WLN (TOK_CPT_SPACE | TOK_CPT_LETTER | TOK_CPT_NUMBER)

/* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S) */
static void scan_gpt2(struct chunk *c)
{
	size_t pos = c->beg;

	while (pos < c->end) {
		uint32_t cpt = ch_cpt(c, pos);
		size_t k = contraction(c, pos, false);
		uint32_t f2;
		size_t p, nws;

		if (k) {
			pos = ch_emit(c, pos + k);
			continue;
		}
		/* An optional leading space joins a run of letters, digits or other symbols. */
		f2 = cpt == ' ' ? ch_flags(c, pos + 1) : ch_flags(c, pos);
		p = pos + (cpt == ' ');
		if (f2 & TOK_CPT_LETTER) {
			while (ch_flags(c, p) & TOK_CPT_LETTER)
				p++;
			pos = ch_emit(c, p);
			continue;
		}
		if (f2 & TOK_CPT_NUMBER) {
			while (ch_flags(c, p) & TOK_CPT_NUMBER)
				p++;
			pos = ch_emit(c, p);
			continue;
		}
		if (!(f2 & NOT_WLN) && f2) {
			for (uint32_t f = f2; !(f & NOT_WLN) && f; f = ch_flags(c, ++p))
				;
			pos = ch_emit(c, p);
			continue;
		}
		nws = 0;
		while (ch_flags(c, pos + nws) & TOK_CPT_SPACE)
			nws++;
		if (nws > 1 && pos + nws < c->end) {
			/* \s+(?!\S): leave the last space to prefix the next word */
			pos = ch_emit(c, pos + nws - 1);
			continue;
		}
		pos = ch_emit(c, pos + (nws ? nws : 1));
	}
}

/*
 * (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}|
 *  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * (llama3 with max_digits 3, qwen2 with 1)
 */
static void scan_llama3(struct chunk *c, size_t max_digits)
{
	size_t pos = c->beg;

	while (pos < c->end) {
		uint32_t cpt = ch_cpt(c, pos);
		uint32_t f = ch_flags(c, pos), f2;
		size_t k = contraction(c, pos, true);
		size_t p, nws, last_nl;

		if (k) {
			pos = ch_emit(c, pos + k);
			continue;
		}
		if (!(cpt == '\r' || cpt == '\n' || (f & TOK_CPT_NUMBER)) &&
		    ((f & TOK_CPT_LETTER) || (ch_flags(c, pos + 1) & TOK_CPT_LETTER))) {
			p = pos + 1;
			while (ch_flags(c, p) & TOK_CPT_LETTER)
				p++;
			pos = ch_emit(c, p);
			continue;
		}
		if (f & TOK_CPT_NUMBER) {
			size_t ini = pos;

			p = pos;
			while (ch_flags(c, p) & TOK_CPT_NUMBER) {
				if (++p - ini >= max_digits)
					ini = ch_emit(c, p);
			}
			pos = ch_emit(c, p);
			continue;
		}
		/* Note: llama.cpp tests the flags of the current code point here, not f2. */
		f2 = cpt == ' ' ? ch_flags(c, pos + 1) : f;
		if (!(f2 & NOT_WLN) && f) {
			p = pos + (cpt == ' ');
			for (uint32_t g = f2; !(g & NOT_WLN) && g; g = ch_flags(c, ++p))
				;
			while (ch_cpt(c, p) == '\r' || ch_cpt(c, p) == '\n')
				p++;
			pos = ch_emit(c, p);
			continue;
		}
		nws = 0;
		last_nl = 0;
		while (ch_flags(c, pos + nws) & TOK_CPT_SPACE) {
			uint32_t w = ch_cpt(c, pos + nws);

			if (w == '\r' || w == '\n')
				last_nl = pos + nws + 1;
			nws++;
		}
		if (last_nl) {
			pos = ch_emit(c, last_nl);
			continue;
		}
		if (nws > 1 && pos + nws < c->end) {
			pos = ch_emit(c, pos + nws - 1);
			continue;
		}
		pos = ch_emit(c, pos + (nws ? nws : 1));
	}
}

/*
 * The classes llama.cpp matches with std::regex over its "collapsed" text:
 * ASCII code points as themselves, others by their single category (never
 * when they are whitespace).
 */
static bool in_number_class(uint32_t cpt)
{
	if (cpt < 0x80)
		return cpt >= '0' && cpt <= '9';
	return hyb_tok_cpt_flags(cpt) == TOK_CPT_NUMBER;
}

/* [\p{P}\$\+<=>\^~\|] */
static bool in_punct_class(uint32_t cpt)
{
	/* ASCII: llama.cpp's \p{P} subset (no backquote) plus $+<=>^~| */
	if (cpt < 0x80)
		return cpt && strchr("!\"#%&'()*,-./:;?@[\\]_{}$+<=>^~|", (int)cpt);
	return hyb_tok_cpt_flags(cpt) == TOK_CPT_PUNCT;
}

/*
 * Isolate runs (max_run code points at most) of a class: what a regex
 * "[class]+" (or "[class]") does to a chunk, gaps kept as words.
 */
static void scan_isolate(struct chunk *c, bool (*in)(uint32_t), size_t max_run)
{
	size_t pos = c->beg;

	while (pos < c->end) {
		size_t p = pos;

		if (!in(c->cpts[pos])) {
			pos++;
			continue;
		}
		ch_emit(c, pos);
		while (p < c->end && p - pos < max_run && in(c->cpts[p]))
			p++;
		pos = ch_emit(c, p);
	}
	ch_emit(c, c->end);
}

static bool is_ascii_digit(uint32_t cpt)
{
	return cpt >= '0' && cpt <= '9';
}

/* [0-9][0-9][0-9]: non-overlapping groups of three ASCII digits, left to right. */
static void scan_three_digits(struct chunk *c)
{
	size_t pos = c->beg;

	while (pos < c->end) {
		if (pos + 3 <= c->end && is_ascii_digit(c->cpts[pos]) &&
		    is_ascii_digit(c->cpts[pos + 1]) && is_ascii_digit(c->cpts[pos + 2])) {
			ch_emit(c, pos);
			pos = ch_emit(c, pos + 3);
			continue;
		}
		pos++;
	}
	ch_emit(c, c->end);
}

enum pass { PASS_GPT2, PASS_LLAMA3, PASS_QWEN2, PASS_PUNCT_RUNS, PASS_NUM_RUNS, PASS_NUM_ONE,
	    PASS_THREE_DIGITS };

static int run_pass(enum pass pass, const uint32_t *cpts, struct lens *in, struct lens *out)
{
	size_t start = 0;

	out->n = 0;
	for (size_t i = 0; i < in->n; i++) {
		struct chunk c = { cpts, start, start + in->v[i], start, out };

		switch (pass) {
		case PASS_GPT2: scan_gpt2(&c); break;
		case PASS_LLAMA3: scan_llama3(&c, 3); break;
		case PASS_QWEN2: scan_llama3(&c, 1); break;
		case PASS_PUNCT_RUNS: scan_isolate(&c, in_punct_class, (size_t)-1); break;
		case PASS_NUM_RUNS: scan_isolate(&c, in_number_class, (size_t)-1); break;
		case PASS_NUM_ONE: scan_isolate(&c, in_number_class, 1); break;
		case PASS_THREE_DIGITS: scan_three_digits(&c); break;
		}
		start += in->v[i];
	}
	return out->oom ? -1 : 0;
}

int hyb_tok_pretok_split(enum tok_pre pre, const uint32_t *cpts, size_t n, size_t **lens,
		     size_t *n_words)
{
	static const enum pass p_default[] = { PASS_PUNCT_RUNS, PASS_GPT2, PASS_NUM_RUNS,
					       PASS_THREE_DIGITS };
	static const enum pass p_gpt2[] = { PASS_GPT2 };
	static const enum pass p_llama3[] = { PASS_LLAMA3 };
	static const enum pass p_qwen2[] = { PASS_QWEN2 };
	static const enum pass p_starcoder[] = { PASS_NUM_ONE, PASS_GPT2 };
	const enum pass *passes;
	size_t n_passes;
	struct lens a = { 0 }, b = { 0 };

	switch (pre) {
	case TOK_PRE_GPT2: passes = p_gpt2; n_passes = 1; break;
	case TOK_PRE_LLAMA3: passes = p_llama3; n_passes = 1; break;
	case TOK_PRE_QWEN2: passes = p_qwen2; n_passes = 1; break;
	case TOK_PRE_STARCODER: passes = p_starcoder; n_passes = 2; break;
	default: passes = p_default; n_passes = 4; break;
	}
	*lens = NULL;
	*n_words = 0;
	lens_push(&a, n);
	for (size_t i = 0; i < n_passes && !a.oom; i++) {
		struct lens tmp;

		if (run_pass(passes[i], cpts, &a, &b) < 0)
			break;
		tmp = a;
		a = b;
		b = tmp;
	}
	free(b.v);
	if (a.oom || b.oom) {
		free(a.v);
		return -1;
	}
	*lens = a.v;
	*n_words = a.n;
	return 0;
}
