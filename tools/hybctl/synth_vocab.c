// SPDX-License-Identifier: MIT
/*
 * Vocabularies for synthetic models. A generated one keeps `hybctl synth`
 * self-contained (any vocabulary size, no files needed); --vocab-from takes a
 * real one (e.g. LLaMA-2's 32,000 pieces) from another GGUF.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyb/gguf.h"
#include "hybctl.h"

/* token_type values of llama.cpp's vocabulary */
enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_BYTE = 6 };

static const char *const words[] = {
	"the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with",
	"be", "by", "on", "not", "he", "this", "are", "or", "his", "from", "at", "which",
	"but", "have", "an", "had", "they", "you", "were", "their", "one", "all", "we",
	"can", "her", "has", "there", "been", "if", "more", "when", "will", "would", "who",
	"so", "no", "time", "upon", "once", "story", "little", "day", "model", "token",
	"neuron", "memory", "sparse", "fast", "world", "hello", "said", "went", "very",
	"out", "about", "into", "than", "them", "some", "what", "then", "could", "him",
};

struct vocab {
	char **tok;
	float *score;
	int32_t *type;
	uint32_t n, cap;
};

static int has(const struct vocab *v, const char *s)
{
	for (uint32_t i = 0; i < v->n; i++)
		if (!strcmp(v->tok[i], s))
			return 1;
	return 0;
}

static void add(struct vocab *v, const char *s, int32_t type)
{
	if (v->n == v->cap || has(v, s))
		return;
	v->tok[v->n] = strdup(s);
	v->type[v->n] = type;
	/* SentencePiece scores: earlier (more frequent) pieces merge first. */
	v->score[v->n] = type == TT_NORMAL ? -(float)v->n : 0.0f;
	v->n++;
}

/* Every prefix of "▁word" so the bigram merger can reach the whole word. */
static void add_word(struct vocab *v, const char *w, int space)
{
	char buf[64];
	size_t n = strlen(w), base = 0;

	if (space) {
		memcpy(buf, "\xe2\x96\x81", 3);
		base = 3;
	}
	for (size_t i = 1; i <= n && base + i < sizeof(buf); i++) {
		memcpy(buf + base, w, i);
		buf[base + i] = 0;
		if (base + i > 1)
			add(v, buf, TT_NORMAL);
	}
}

int synth_vocab(struct hyb_gguf_writer *w, uint32_t n_vocab)
{
	struct vocab v = { .cap = n_vocab };
	char buf[16];
	int rc = -1;

	if (n_vocab < 300)
		return -1;
	v.tok = calloc(n_vocab, sizeof(*v.tok));
	v.score = calloc(n_vocab, sizeof(*v.score));
	v.type = calloc(n_vocab, sizeof(*v.type));
	if (!v.tok || !v.score || !v.type)
		goto out;
	add(&v, "<unk>", TT_UNKNOWN);
	add(&v, "<s>", TT_CONTROL);
	add(&v, "</s>", TT_CONTROL);
	for (int b = 0; b < 256; b++) {
		snprintf(buf, sizeof(buf), "<0x%02X>", b);
		add(&v, buf, TT_BYTE);
	}
	add(&v, "\xe2\x96\x81", TT_NORMAL);
	for (int ch = 33; ch < 127; ch++) {
		buf[0] = (char)ch;
		buf[1] = 0;
		add(&v, buf, TT_NORMAL);
		snprintf(buf, sizeof(buf), "\xe2\x96\x81%c", ch);
		add(&v, buf, TT_NORMAL);
	}
	for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++) {
		add_word(&v, words[i], 1);
		add_word(&v, words[i], 0);
	}
	/* Fill the rest with letter pairs and triples, then numbered filler pieces. */
	for (int a = 'a'; a <= 'z' && v.n < n_vocab; a++)
		for (int b = 'a'; b <= 'z' && v.n < n_vocab; b++) {
			snprintf(buf, sizeof(buf), "%c%c", a, b);
			add(&v, buf, TT_NORMAL);
			snprintf(buf, sizeof(buf), "\xe2\x96\x81%c%c", a, b);
			add(&v, buf, TT_NORMAL);
		}
	for (uint32_t i = 0; v.n < n_vocab; i++) {
		snprintf(buf, sizeof(buf), "\xe2\x96\x81%c%c%c", 'a' + i % 26, 'a' + i / 26 % 26,
			 'a' + i / 676 % 26);
		if (i >= 17576) /* all triples used: numbered pieces */
			snprintf(buf, sizeof(buf), "<x%u>", i);
		add(&v, buf, TT_NORMAL);
	}
	hyb_gguf_set_str(w, "tokenizer.ggml.model", "llama");
	hyb_gguf_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v.tok, v.n);
	hyb_gguf_set_arr(w, "tokenizer.ggml.scores", HYB_GGUF_VT_FLOAT32, v.score, v.n);
	hyb_gguf_set_arr(w, "tokenizer.ggml.token_type", HYB_GGUF_VT_INT32, v.type, v.n);
	hyb_gguf_set_u32(w, "tokenizer.ggml.unknown_token_id", 0);
	hyb_gguf_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
	hyb_gguf_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
	hyb_gguf_set_bool(w, "tokenizer.ggml.add_bos_token", true);
	hyb_gguf_set_bool(w, "tokenizer.ggml.add_eos_token", false);
	rc = 0;
out:
	for (uint32_t i = 0; i < v.n; i++)
		free(v.tok[i]);
	free(v.tok);
	free(v.score);
	free(v.type);
	return rc;
}

int synth_vocab_from(struct hyb_gguf_writer *w, const char *path, uint32_t *n_vocab)
{
	struct hyb_gguf_file *f;
	const struct hyb_gguf_kv *tokens;

	if (hyb_gguf_open(path, &f)) {
		fprintf(stderr, "hybctl: %s\n", hyb_last_error());
		return -1;
	}
	tokens = hyb_gguf_get_arr(f, "tokenizer.ggml.tokens", HYB_GGUF_VT_STRING);
	if (!tokens) {
		fprintf(stderr, "hybctl: %s has no tokenizer.ggml.tokens\n", path);
		hyb_gguf_close(f);
		return -1;
	}
	*n_vocab = (uint32_t)tokens->v.arr.n;
	/* the tokenizer and, when it has one, its chat template */
	for (uint64_t i = 0; i < f->n_kv; i++)
		if ((f->kv[i].key.len > 16 && !memcmp(f->kv[i].key.ptr, "tokenizer.ggml.", 15)) ||
		    (f->kv[i].key.len == 23 &&
		     !memcmp(f->kv[i].key.ptr, "tokenizer.chat_template", 23)))
			hyb_gguf_writer_copy_kv(w, &f->kv[i]);
	hyb_gguf_close(f);
	return 0;
}

