// SPDX-License-Identifier: MIT
/*
 * libFuzzer target for what hyb does with text a user sends (hyb serve's
 * prompts and chat messages, hyb run's -p): the tokenizers of real
 * vocabularies and the chat templates.
 *
 * The first input byte chooses what runs; the rest is the text.
 *   - Tokenizing: the count-only call, a short buffer and the full call
 *     agree, every id is in the vocabulary and a short buffer is not
 *     written past. For valid UTF-8 without special tokens, the pieces give
 *     back the text: exactly for byte-level BPE, after the one leading space
 *     for SentencePiece, less the ASCII bytes the vocabulary has no token
 *     for (docs/CHAT.md "Tests").
 *     hyb_detokenize must take the ids and say how long its text is.
 *   - Chat: the text split into messages at 0x01 (a message's first byte
 *     picks its role), formatted by a template the second byte picks, as
 *     hyb serve does; valid UTF-8 is accepted and the formatted prompt is
 *     tokenized with its special tokens parsed, invalid UTF-8 is -EILSEQ.
 *     The text is also given to template detection, as a model file's
 *     tokenizer.chat_template would be.
 *
 * Vocabularies: HYB_FUZZ_VOCABS (':'-separated GGUF files), else those of
 * these found: llama.cpp's test vocabularies (.cache/vocab, fetched by
 * tests/data/fetch-vocab.sh: SentencePiece, GPT-2, Llama 3), the shared
 * LLaMA-2 model, SmolLM2 and Gemma 3 (models/, tests/data/fetch-models.sh).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyb/chat.h"
#include "hyb/gguf.h"
#include "hyb/tokenizer.h"
#include "tokenizer/tokenizer_internal.h"

#define MAX_TOKS 8

static struct hyb_tokenizer *toks[MAX_TOKS];
/* ASCII bytes a vocabulary has no token for (BPE drops them, as llama.cpp does) */
static uint8_t dropped[MAX_TOKS][128];
static int n_toks;
static volatile size_t sink;

static const char *const default_vocabs[] = {
	".cache/vocab/ggml-vocab-llama-spm.gguf",
	".cache/vocab/ggml-vocab-gpt-2.gguf",
	".cache/vocab/ggml-vocab-llama-bpe.gguf",
	"../shared/models/llama-2-tiny-random.gguf",
	"models/SmolLM2-135M-Instruct.Q4_1.gguf",
	"models/gemma-3-270m-q4_k_m.gguf",
};

static void add_vocab(const char *path, int quiet)
{
	struct hyb_gguf_file *f;
	struct hyb_tokenizer *t;

	if (n_toks == MAX_TOKS)
		return;
	if (hyb_gguf_open(path, &f)) {
		if (!quiet)
			fprintf(stderr, "fuzz_text: %s: %s\n", path, hyb_last_error());
		return;
	}
	t = hyb_tokenizer_load(f);
	hyb_gguf_close(f); /* the tokenizer keeps copies of what it needs */
	if (!t) {
		fprintf(stderr, "fuzz_text: %s: %s\n", path, hyb_last_error());
		return;
	}
	for (int b = 0; b < 128; b++) {
		char c = (char)b;

		dropped[n_toks][b] = hyb_tokenize(t, &c, 1, false, NULL, 0) == 0;
	}
	toks[n_toks++] = t;
	fprintf(stderr, "fuzz_text: %s (%s, %d tokens)\n", path,
		hyb_tokenizer_kind(t) == HYB_TOK_SPM ? "SPM" : "BPE", hyb_tokenizer_n_vocab(t));
}

int LLVMFuzzerInitialize(int *argc, char ***argv);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	const char *env = getenv("HYB_FUZZ_VOCABS");

	(void)argc;
	(void)argv;
	if (env && *env) {
		char *list = strdup(env), *save = NULL;

		for (char *p = strtok_r(list, ":", &save); p; p = strtok_r(NULL, ":", &save))
			add_vocab(p, 0);
		free(list);
	} else {
		for (size_t i = 0; i < sizeof(default_vocabs) / sizeof(default_vocabs[0]); i++)
			add_vocab(default_vocabs[i], 1);
	}
	if (!n_toks) {
		fprintf(stderr, "fuzz_text: no vocabulary found (tests/data/fetch-vocab.sh .cache/vocab)\n");
		exit(2);
	}
	return 0;
}

/* Strict UTF-8: no overlong forms, no surrogates, nothing past U+10FFFF. */
static int valid_utf8(const uint8_t *s, size_t n)
{
	size_t i = 0;

	while (i < n) {
		uint8_t c = s[i];
		size_t k;
		uint32_t cp;

		if (c < 0x80) {
			i++;
			continue;
		}
		if (c >= 0xc2 && c <= 0xdf)
			k = 1, cp = c & 0x1f;
		else if (c >= 0xe0 && c <= 0xef)
			k = 2, cp = c & 0x0f;
		else if (c >= 0xf0 && c <= 0xf4)
			k = 3, cp = c & 0x07;
		else
			return 0;
		if (n - i <= k)
			return 0;
		for (size_t j = 1; j <= k; j++) {
			if ((s[i + j] & 0xc0) != 0x80)
				return 0;
			cp = cp << 6 | (s[i + j] & 0x3f);
		}
		if ((k == 2 && cp < 0x800) || (k == 3 && cp < 0x10000) || cp > 0x10ffff ||
		    (cp >= 0xd800 && cp <= 0xdfff))
			return 0;
		i += k + 1;
	}
	return 1;
}

static int has_special(const struct hyb_tokenizer *t, const int32_t *ids, int n)
{
	for (int i = 0; i < n; i++)
		if (!(t->tok[ids[i]].attr & (TOK_ATTR_NORMAL | TOK_ATTR_BYTE)))
			return 1;
	return 0;
}

/*
 * The pieces of ids concatenated must be the text, after SPM's leading space
 * and without the bytes the vocabulary has no token for.
 */
static void check_pieces(int k, const int32_t *ids, int n, const char *raw, size_t raw_len)
{
	const struct hyb_tokenizer *t = toks[k];
	size_t cap = 2 * raw_len + 16, got = 0, lead, len = 0;
	char *out = malloc(cap), *text = malloc(raw_len + 1), piece[256];

	if (!out || !text)
		abort();
	for (size_t i = 0; i < raw_len; i++)
		if ((unsigned char)raw[i] >= 128 || !dropped[k][(unsigned char)raw[i]])
			text[len++] = raw[i];
	for (int i = 0; i < n; i++) {
		int m = hyb_token_to_piece(t, ids[i], piece, sizeof(piece));

		if (m < 0 || m > (int)sizeof(piece) || got + (size_t)m > cap)
			abort();
		memcpy(out + got, piece, m);
		got += m;
	}
	lead = t->kind == HYB_TOK_SPM && t->add_space_prefix && len ? 1 : 0;
	if (got != len + lead || (lead && out[0] != ' ') || memcmp(out + lead, text, len)) {
		fprintf(stderr, "fuzz_text: %zu bytes of text give back %zu bytes\n", len, got);
		abort();
	}
	free(text);
	free(out);
}

static void fuzz_tokenize(int tk, unsigned flags, const char *text, size_t len)
{
	const struct hyb_tokenizer *t = toks[tk];
	int n = hyb_tokenize_flags(t, text, len, flags, NULL, 0), m, k;
	int32_t *ids, small[4] = { -7, -7, -7, -7 };
	char *back;

	if (n < 0)
		abort(); /* text is never a reason to refuse */
	m = hyb_tokenize_flags(t, text, len, flags, small, 3);
	if (m != n || small[3] != -7)
		abort();
	ids = malloc(((size_t)n + 1) * sizeof(*ids));
	if (!ids)
		abort();
	ids[n] = -7;
	if (hyb_tokenize_flags(t, text, len, flags, ids, n) != n || ids[n] != -7)
		abort();
	for (int i = 0; i < n; i++)
		if (ids[i] < 0 || ids[i] >= hyb_tokenizer_n_vocab(t) || (i < 3 && ids[i] != small[i]))
			abort();
	if (!(flags & (HYB_TOKENIZE_ADD_SPECIAL | HYB_TOKENIZE_PARSE_SPECIAL)) &&
	    valid_utf8((const uint8_t *)text, len) && !has_special(t, ids, n) &&
	    !(t->kind == HYB_TOK_SPM && memmem(text, len, "\xe2\x96\x81", 3)))
		check_pieces(tk, ids, n, text, len);
	/* the whole decode: its length, then the same length into a buffer of it */
	m = hyb_detokenize(t, ids, n, NULL, 0);
	if (m < 0)
		abort();
	back = malloc((size_t)m + 1);
	if (!back)
		abort();
	k = hyb_detokenize(t, ids, n, back, m + 1);
	if (k != m || back[m] != '\0')
		abort();
	sink += m;
	free(back);
	free(ids);
}

static const char *const roles[] = { "system", "user", "assistant", "tool" };

static void fuzz_chat(int tk, int tmpl, const char *text, size_t len)
{
	struct hyb_chat_msg msgs[16];
	char *copy = malloc(len + 1), *buf;
	size_t n = 0;
	int need, got, valid = 1;

	if (!copy)
		abort();
	memcpy(copy, text, len);
	copy[len] = '\0';
	for (char *p = copy, *end; p && n < 16; p = end) {
		end = strchr(p, '\x01');
		if (end)
			*end++ = '\0';
		msgs[n].role = roles[(unsigned char)*p % 4];
		msgs[n].content = *p ? p + 1 : p;
		valid &= valid_utf8((const uint8_t *)msgs[n].content, strlen(msgs[n].content));
		n++;
	}
	need = hyb_chat_format(tmpl, msgs, n, true, NULL, 0);
	if (!valid) {
		if (need != -EILSEQ)
			abort();
	} else if (need < 0) {
		fprintf(stderr, "fuzz_text: template %s refused valid text: %s\n",
			hyb_chat_template_name(tmpl), hyb_last_error());
		abort();
	}
	if (need >= 0) {
		buf = malloc((size_t)need + 1);
		if (!buf)
			abort();
		got = hyb_chat_format(tmpl, msgs, n, true, buf, need + 1);
		if (got != need || buf[need] != '\0' || strlen(buf) != (size_t)need)
			abort();
		fuzz_tokenize(tk, HYB_TOKENIZE_ADD_SPECIAL | HYB_TOKENIZE_PARSE_SPECIAL, buf, need);
		free(buf);
	}
	sink += (size_t)hyb_chat_template_detect(copy);
	free(copy);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	unsigned sel;
	int tk;

	if (size < 2)
		return 0;
	sel = data[0];
	tk = (sel & 7) % n_toks;
	if (sel & 0x80)
		fuzz_chat(tk, data[1] % HYB_CHAT_N_TEMPLATES, (const char *)data + 2, size - 2);
	else
		fuzz_tokenize(tk, (sel >> 3) & 3, (const char *)data + 1, size - 1);
	return 0;
}
