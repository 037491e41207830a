// SPDX-License-Identifier: MIT
/*
 * Tokenizer common part: building the vocabulary from GGUF metadata (or from
 * plain arrays), the special-token rules, splitting special tokens out of
 * the text before encoding, and decoding ids back to text. The rules mirror
 * llama.cpp's llama-vocab.cpp so ids and text match it; where llama.cpp
 * would abort on a malformed vocabulary we warn and carry on.
 */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"
#include "util/error.h"

#define U2581 "\xe2\x96\x81" /* LOWER ONE EIGHTH BLOCK: SentencePiece's space */

__attribute__((format(printf, 1, 2))) static void warn(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "hyb: tokenizer: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

int hyb_tok_ids_push(struct tok_ids *a, int32_t id)
{
	if (a->n == a->cap) {
		size_t cap = a->cap ? a->cap * 2 : 256;
		int32_t *v = realloc(a->v, cap * sizeof(*v));

		if (!v)
			return -1;
		a->v = v;
		a->cap = cap;
	}
	a->v[a->n++] = id;
	return 0;
}

/* ---- hash tables ---- */

static uint64_t hyb_tok_hash(const char *s, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */

	for (size_t i = 0; i < n; i++) {
		h ^= (unsigned char)s[i];
		h *= 0x100000001b3ull;
	}
	return h ^ (h >> 29);
}

static const char *tok_text(const struct hyb_tokenizer *t, int32_t id)
{
	return t->arena + t->tok[id].off;
}

int32_t hyb_tok_lookup(const struct hyb_tokenizer *t, const char *s, size_t n)
{
	uint32_t i;

	if (n > t->max_token_len)
		return -1;
	for (i = (uint32_t)hyb_tok_hash(s, n) & t->map_mask;; i = (i + 1) & t->map_mask) {
		uint32_t v = t->map[i];

		if (!v)
			return -1;
		if (t->tok[v - 1].len == n && !memcmp(tok_text(t, (int32_t)v - 1), s, n))
			return (int32_t)v - 1;
	}
}

static uint64_t pair_hash(const char *l, size_t ln, const char *r, size_t rn)
{
	uint64_t a = hyb_tok_hash(l, ln), b = hyb_tok_hash(r, rn);

	return (a * 0x9e3779b97f4a7c15ull) ^ (b + 0x632be59bd9b4e019ull + (a >> 7));
}

int32_t hyb_tok_merge_rank(const struct hyb_tokenizer *t, const char *l, size_t ln, const char *r,
		       size_t rn)
{
	uint32_t i;

	if (!t->merge_map)
		return -1;
	for (i = (uint32_t)pair_hash(l, ln, r, rn) & t->merge_mask;; i = (i + 1) & t->merge_mask) {
		uint32_t v = t->merge_map[i];
		const struct hyb_tok_merge *m;

		if (!v)
			return -1;
		m = &t->merges[v - 1];
		if (m->left_len == ln && m->right_len == rn &&
		    !memcmp(t->arena + m->left_off, l, ln) &&
		    !memcmp(t->arena + m->right_off, r, rn))
			return (int32_t)v - 1;
	}
}

static uint32_t table_mask(uint64_t n)
{
	uint64_t cap = 16;

	while (cap < 2 * n)
		cap *= 2;
	return (uint32_t)(cap - 1);
}

static bool pack_pair(const char *a, size_t n, struct tok_pair *p)
{
	if (n > 8)
		return false;
	p->bytes = 0;
	memcpy(&p->bytes, a, n);
	p->len = (uint32_t)n;
	return true;
}

static uint32_t pair_slot(const struct tok_pair *p)
{
	uint64_t h = (p->bytes ^ p->len) * 0x9e3779b97f4a7c15ull;

	return (uint32_t)(h >> 32);
}

/* Characters are at most 4 bytes, so a pair always fits in 8. */
bool hyb_tok_pair_possible(const struct hyb_tokenizer *t, const char *a, size_t na, size_t nb)
{
	struct tok_pair p;

	if (!t->pairs)
		return true;
	if (!pack_pair(a, na + nb, &p))
		return true;
	for (uint32_t i = pair_slot(&p) & t->pair_mask;; i = (i + 1) & t->pair_mask) {
		const struct tok_pair *q = &t->pairs[i];

		if (!q->len)
			return false;
		if (q->len == p.len && q->bytes == p.bytes)
			return true;
	}
}

static void pair_insert(struct hyb_tokenizer *t, const struct tok_pair *p)
{
	for (uint32_t i = pair_slot(p) & t->pair_mask;; i = (i + 1) & t->pair_mask) {
		struct tok_pair *q = &t->pairs[i];

		if (!q->len) {
			*q = *p;
			return;
		}
		if (q->len == p->len && q->bytes == p->bytes)
			return;
	}
}

/* Split each token into characters the way the SPM encoder splits its input. */
static int build_pairs(struct hyb_tokenizer *t)
{
	uint64_t n = 0;

	for (int pass = 0; pass < 2; pass++) {
		for (int32_t id = 0; id < t->n_vocab; id++) {
			const char *s = tok_text(t, id);
			size_t len = t->tok[id].len, off = 0, prev = 0, prev_n = 0;

			while (off < len) {
				size_t k = tok_utf8_len((unsigned char)s[off]);
				struct tok_pair p;

				if (k > len - off)
					k = len - off;
				if (prev_n && pack_pair(s + prev, prev_n + k, &p)) {
					if (pass)
						pair_insert(t, &p);
					else
						n++;
				}
				prev = off;
				prev_n = k;
				off += k;
			}
		}
		if (!pass) {
			t->pair_mask = table_mask(n);
			t->pairs = calloc((size_t)t->pair_mask + 1, sizeof(*t->pairs));
			if (!t->pairs)
				return -1;
		}
	}
	return 0;
}


/* Later ids replace earlier ones with the same text, as llama.cpp's token_to_id map. */
static void map_insert(struct hyb_tokenizer *t, int32_t id)
{
	const struct tok_entry *e = &t->tok[id];
	uint32_t i;

	for (i = (uint32_t)hyb_tok_hash(tok_text(t, id), e->len) & t->map_mask;;
	     i = (i + 1) & t->map_mask) {
		uint32_t v = t->map[i];

		if (!v || (t->tok[v - 1].len == e->len &&
			   !memcmp(tok_text(t, (int32_t)v - 1), tok_text(t, id), e->len))) {
			t->map[i] = (uint32_t)id + 1;
			return;
		}
	}
}

/* The first occurrence of a pair keeps its rank (llama.cpp uses map::emplace). */
static void merge_insert(struct hyb_tokenizer *t, int32_t rank)
{
	const struct hyb_tok_merge *m = &t->merges[rank];
	const char *l = t->arena + m->left_off, *r = t->arena + m->right_off;
	uint32_t i;

	for (i = (uint32_t)pair_hash(l, m->left_len, r, m->right_len) & t->merge_mask;;
	     i = (i + 1) & t->merge_mask) {
		uint32_t v = t->merge_map[i];

		if (!v) {
			t->merge_map[i] = (uint32_t)rank + 1;
			return;
		}
		if (hyb_tok_merge_rank(t, l, m->left_len, r, m->right_len) >= 0)
			return;
	}
}

/* ---- construction ---- */

void hyb_tok_desc_init(struct hyb_tok_desc *d)
{
	memset(d, 0, sizeof(*d));
	d->scores_type = HYB_GGUF_VT_FLOAT32;
	for (int i = 0; i < TOK_SP_COUNT; i++)
		d->special[i] = TOK_ID_ABSENT;
	d->add_bos = d->add_eos = d->add_space_prefix = -1;
}

struct pre_name {
	const char *name;
	enum tok_pre pre;
	bool ignore_merges, add_bos, no_clean_spaces;
};

/* tokenizer.ggml.pre values whose regexes we implement, with llama.cpp's per-name flags. */
static const struct pre_name pre_names[] = {
	{ "default", TOK_PRE_DEFAULT, false, false, false },
	{ "llama3", TOK_PRE_LLAMA3, true, true, false },
	{ "llama-v3", TOK_PRE_LLAMA3, true, true, false },
	{ "llama-bpe", TOK_PRE_LLAMA3, true, true, false },
	{ "falcon3", TOK_PRE_LLAMA3, true, true, false },
	{ "falcon-h1", TOK_PRE_LLAMA3, true, true, false },
	{ "pixtral", TOK_PRE_LLAMA3, true, true, false },
	{ "midm-2.0", TOK_PRE_LLAMA3, true, true, false },
	{ "lfm2", TOK_PRE_LLAMA3, true, true, false },
	{ "dbrx", TOK_PRE_LLAMA3, false, false, false },
	{ "smaug-bpe", TOK_PRE_LLAMA3, false, false, false },
	{ "gpt-2", TOK_PRE_GPT2, false, false, false },
	{ "gpt2", TOK_PRE_GPT2, false, false, false },
	{ "phi-2", TOK_PRE_GPT2, false, false, false },
	{ "mpt", TOK_PRE_GPT2, false, false, false },
	{ "olmo", TOK_PRE_GPT2, false, false, false },
	{ "jais", TOK_PRE_GPT2, false, false, false },
	{ "exaone4", TOK_PRE_GPT2, false, false, false },
	{ "qwen2", TOK_PRE_QWEN2, false, false, true },
	{ "deepseek-r1-qwen", TOK_PRE_QWEN2, false, false, true },
	{ "stablelm2", TOK_PRE_QWEN2, false, false, false },
	{ "starcoder", TOK_PRE_STARCODER, false, false, false },
	{ "refact", TOK_PRE_STARCODER, false, false, false },
	{ "codeshell", TOK_PRE_STARCODER, false, false, false },
	{ "exaone", TOK_PRE_STARCODER, false, false, false },
	{ "command-r", TOK_PRE_STARCODER, false, false, true },
	{ "smollm", TOK_PRE_STARCODER, false, false, true },
};

__attribute__((format(printf, 3, 4))) static void set_err(char *err, size_t errlen,
							   const char *fmt, ...)
{
	va_list ap;

	if (!err || !errlen)
		return;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

static float read_score(const struct hyb_tok_desc *d, uint32_t i)
{
	if (!d->scores)
		return 0.0f;
	if (d->scores_type == HYB_GGUF_VT_INT32) {
		int32_t v;

		memcpy(&v, (const char *)d->scores + 4 * (size_t)i, 4);
		return (float)v;
	}
	float f;

	memcpy(&f, (const char *)d->scores + 4 * (size_t)i, 4);
	return f;
}

static uint32_t read_attr(const struct hyb_tok_desc *d, uint32_t i)
{
	int32_t type;

	if (!d->types)
		return TOK_ATTR_NORMAL;
	memcpy(&type, (const char *)d->types + 4 * (size_t)i, 4);
	switch (type) {
	case TOK_TYPE_NORMAL: return TOK_ATTR_NORMAL;
	case TOK_TYPE_UNKNOWN: return TOK_ATTR_UNKNOWN;
	case TOK_TYPE_CONTROL: return TOK_ATTR_CONTROL;
	case TOK_TYPE_USER_DEFINED: return TOK_ATTR_USER_DEFINED;
	case TOK_TYPE_UNUSED: return TOK_ATTR_UNUSED;
	case TOK_TYPE_BYTE: return TOK_ATTR_BYTE;
	default: return 0;
	}
}

static int32_t find_text(const struct hyb_tokenizer *t, const char *s)
{
	return hyb_tok_lookup(t, s, strlen(s));
}

/*
 * llama.cpp finds some special tokens by their text, walking its vocabulary
 * map in text order: of several candidates present, the smallest text wins.
 * The token found is forced to be a control token.
 */
static int32_t find_by_text(struct hyb_tokenizer *t, const char *const *texts, size_t n)
{
	const char *best = NULL;
	int32_t id = -1;

	for (size_t i = 0; i < n; i++) {
		int32_t k = find_text(t, texts[i]);

		if (k >= 0 && (!best || strcmp(texts[i], best) < 0)) {
			best = texts[i];
			id = k;
		}
	}
	if (id >= 0)
		t->tok[id].attr |= TOK_ATTR_CONTROL;
	return id;
}

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static void detect_special(struct hyb_tokenizer *t)
{
	static const char *const eot[] = {
		"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
		"<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<\xef\xbd\x9c" "end" "\xe2\x96\x81"
		"of" "\xe2\x96\x81" "sentence\xef\xbd\x9c>", "<end_of_utterance>",
	};
	static const char *const eom[] = { "<|eom_id|>" };
	static const char *const fim_pad[] = { "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>",
					       "[PAD]" };
	static const char *const fim_rep[] = { "<|fim_repo|>", "<|repo_name|>", "<fim-repo>",
					       "<REPO>", "<reponame>" };
	static const char *const fim_sep[] = { "<|file_sep|>" };
	static const char *const eog[] = {
		"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
		"<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>",
		"_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>",
		"<turn|>", "<|tool_response>", "<\xef\xbd\x9c" "end" "\xe2\x96\x81" "of"
		"\xe2\x96\x81" "sentence\xef\xbd\x9c>", "[e~[",
	};
	static const char *const render[] = { "<|channel|>", "<|message|>", "<|start|>",
					      "<|constrain|>" };
	int32_t *sp = t->special;

	if (sp[TOK_SP_EOT] < 0)
		sp[TOK_SP_EOT] = find_by_text(t, eot, N_OF(eot));
	if (sp[TOK_SP_EOM] < 0)
		sp[TOK_SP_EOM] = find_by_text(t, eom, N_OF(eom));
	if (sp[TOK_SP_FIM_PAD] < 0)
		sp[TOK_SP_FIM_PAD] = find_by_text(t, fim_pad, N_OF(fim_pad));
	if (sp[TOK_SP_FIM_REP] < 0)
		sp[TOK_SP_FIM_REP] = find_by_text(t, fim_rep, N_OF(fim_rep));
	if (sp[TOK_SP_FIM_SEP] < 0)
		sp[TOK_SP_FIM_SEP] = find_by_text(t, fim_sep, N_OF(fim_sep));

	/* End-of-generation set: FIM pad/repo/sep, the known texts, then EOS/EOT/EOM. */
	static const int fixed[] = { TOK_SP_FIM_PAD, TOK_SP_FIM_REP, TOK_SP_FIM_SEP, TOK_SP_EOS,
				     TOK_SP_EOT, TOK_SP_EOM };
	for (size_t i = 0; i < N_OF(fixed); i++)
		if (sp[fixed[i]] >= 0)
			t->is_eog[sp[fixed[i]]] = 1;
	for (size_t i = 0; i < N_OF(eog); i++) {
		int32_t id = find_text(t, eog[i]);

		if (id >= 0) {
			t->is_eog[id] = 1;
			t->tok[id].attr |= TOK_ATTR_CONTROL;
		}
	}
	/* gpt-oss tokens that are always rendered */
	for (size_t i = 0; i < N_OF(render); i++) {
		int32_t id = find_text(t, render[i]);

		if (id >= 0)
			t->tok[id].attr = TOK_ATTR_USER_DEFINED;
	}
	/* o200k_harmony / solar-open: "<|end|>" ends a message, not the generation. */
	{
		int32_t end = find_text(t, "<|end|>"), ret = find_text(t, "<|return|>");
		int32_t call = find_text(t, "<|call|>"), calls = find_text(t, "<|calls|>");
		int32_t flush = find_text(t, "<|flush|>");
		bool has_call = (call >= 0 && t->is_eog[call]) || (calls >= 0 && t->is_eog[calls]);
		bool has_ret = ret >= 0 && t->is_eog[ret];
		bool has_flush = flush >= 0 && t->is_eog[flush];

		if (end >= 0 && t->is_eog[end] && has_call && (has_ret || has_flush)) {
			t->is_eog[end] = 0;
			t->tok[end].attr = TOK_ATTR_USER_DEFINED;
		}
	}
	/* gemma4 and plamo: "</s>" is an ordinary token there. */
	{
		int32_t s = find_text(t, "</s>"), tr = find_text(t, "<|tool_response>");
		int32_t pe = find_text(t, "<|plamo:eos|>");

		if (s >= 0 && t->is_eog[s] &&
		    ((tr >= 0 && t->is_eog[tr]) || (pe >= 0 && t->is_eog[pe]))) {
			t->is_eog[s] = 0;
			t->tok[s].attr = TOK_ATTR_NORMAL;
		}
	}
}

static int cmp_split_tokens(const void *a, const void *b, void *ctx)
{
	const struct hyb_tokenizer *t = ctx;
	int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;

	if (t->tok[x].len != t->tok[y].len)
		return t->tok[x].len > t->tok[y].len ? -1 : 1;
	return x < y ? -1 : x > y;
}

#define SPLIT_ATTRS (TOK_ATTR_CONTROL | TOK_ATTR_USER_DEFINED | TOK_ATTR_UNKNOWN)

static int build_split_tokens(struct hyb_tokenizer *t)
{
	int32_t n = 0;

	for (int32_t i = 0; i < t->n_vocab; i++)
		if (t->tok[i].attr & SPLIT_ATTRS)
			n++;
	if (!n)
		return 0;
	t->split_tokens = malloc(n * sizeof(*t->split_tokens));
	if (!t->split_tokens)
		return -1;
	for (int32_t i = 0; i < t->n_vocab; i++)
		if (t->tok[i].attr & SPLIT_ATTRS)
			t->split_tokens[t->n_split_tokens++] = i;
	qsort_r(t->split_tokens, n, sizeof(*t->split_tokens), cmp_split_tokens, t);
	return 0;
}

static void set_attr(struct hyb_tokenizer *t, const char *text, uint32_t attr, bool on)
{
	int32_t id = find_text(t, text);

	if (id >= 0)
		t->tok[id].attr = on ? t->tok[id].attr | attr : t->tok[id].attr & ~attr;
}

/*
 * Attributes GGUF files do not carry, set by model name as llama.cpp does:
 * Phi-3's special tokens eat the whitespace after them (its template puts a
 * newline after <|user|> that the model never saw as a token).
 */
static void model_attrs(struct hyb_tokenizer *t, const char *name)
{
	char low[256];
	size_t n = 0;

	if (!name)
		return;
	for (; name[n] && n + 1 < sizeof(low); n++)
		low[n] = (char)((name[n] >= 'A' && name[n] <= 'Z') ? name[n] - 'A' + 'a' : name[n]);
	low[n] = 0;
	if (!strstr(low, "phi-3") && !strstr(low, "phi3"))
		return;
	for (int32_t i = 0; i < t->n_split_tokens; i++)
		t->tok[t->split_tokens[i]].attr |= TOK_ATTR_RSTRIP;
	set_attr(t, "</s>", TOK_ATTR_RSTRIP, true);
	set_attr(t, "<unk>", TOK_ATTR_RSTRIP, false);
	set_attr(t, "<s>", TOK_ATTR_RSTRIP, false);
	set_attr(t, "<|endoftext|>", TOK_ATTR_RSTRIP, false);
}

static void set_specials(struct hyb_tokenizer *t, const struct hyb_tok_desc *d)
{
	static const char *const key[TOK_SP_COUNT] = {
		"bos_token_id", "eos_token_id", "eot_token_id", "eom_token_id",
		"unknown_token_id", "padding_token_id", "fim_pad_token_id", "fim_rep_token_id",
		"fim_sep_token_id",
	};

	for (int i = 0; i < TOK_SP_COUNT; i++)
		t->special[i] = -1;
	if (t->kind == HYB_TOK_SPM) {
		t->special[TOK_SP_BOS] = 1;
		t->special[TOK_SP_EOS] = 2;
		t->special[TOK_SP_UNK] = 0;
	} else {
		t->special[TOK_SP_BOS] = 11;
		t->special[TOK_SP_EOS] = 11;
	}
	for (int i = 0; i < TOK_SP_COUNT; i++) {
		if (t->special[i] >= t->n_vocab) {
			warn("default special token '%s' = %d out of vocab range, disabling",
			     key[i], t->special[i]);
			t->special[i] = -1;
		}
		if (d->special[i] == TOK_ID_ABSENT)
			continue;
		if (d->special[i] < 0 || d->special[i] >= t->n_vocab)
			warn("bad special token '%s' = %lld, using the default", key[i],
			     (long long)d->special[i]);
		else
			t->special[i] = (int32_t)d->special[i];
	}
}

/* Copy token and merge texts into one arena; empty tokens get llama.cpp's placeholder. */
static int build_arena(struct hyb_tokenizer *t, const struct hyb_tok_desc *d, char *err,
		       size_t errlen)
{
	uint64_t size = 0, off = 0;

	for (uint32_t i = 0; i < d->n_tokens; i++)
		size += d->tokens[i].len ? d->tokens[i].len : 24;
	for (uint64_t i = 0; i < d->n_merges; i++)
		size += d->merges[i].len;
	if (size >= UINT32_MAX) {
		set_err(err, errlen, "tokenizer: vocabulary text too large (%llu bytes)",
			(unsigned long long)size);
		return -1;
	}
	t->arena = malloc(size ? size : 1);
	if (!t->arena)
		return -1;
	for (uint32_t i = 0; i < d->n_tokens; i++) {
		struct tok_entry *e = &t->tok[i];

		if (!d->tokens[i].ptr && d->tokens[i].len) {
			set_err(err, errlen, "tokenizer: token %u has no text", i);
			return -1;
		}
		e->off = (uint32_t)off;
		if (d->tokens[i].len) {
			memcpy(t->arena + off, d->tokens[i].ptr, d->tokens[i].len);
			e->len = (uint32_t)d->tokens[i].len;
		} else {
			warn("empty token at index %u", i);
			e->len = (uint32_t)snprintf(t->arena + off, 24, "[EMPTY_%u]", i);
		}
		off += e->len;
		if (e->len > t->max_token_len)
			t->max_token_len = e->len;
	}
	for (uint64_t i = 0; i < d->n_merges; i++) {
		struct hyb_tok_merge *m = &t->merges[i];
		const char *s = d->merges[i].ptr;
		uint64_t len = d->merges[i].len, sp;

		if (!s && len) {
			set_err(err, errlen, "tokenizer: merge %llu has no text",
				(unsigned long long)i);
			return -1;
		}
		if (len)
			memcpy(t->arena + off, s, len);
		/* "left right", split at the first space after the first byte */
		for (sp = 1; sp < len && s[sp] != ' '; sp++)
			;
		if (sp >= len) {
			*m = (struct hyb_tok_merge){ 0 };
		} else {
			m->left_off = (uint32_t)off;
			m->left_len = (uint32_t)sp;
			m->right_off = (uint32_t)(off + sp + 1);
			m->right_len = (uint32_t)(len - sp - 1);
		}
		off += len;
	}
	return 0;
}

static int set_kind(struct hyb_tokenizer *t, const struct hyb_tok_desc *d, char *err,
		    size_t errlen)
{
	if (d->model && !strcmp(d->model, "llama")) {
		t->kind = HYB_TOK_SPM;
		t->pre = TOK_PRE_DEFAULT;
		t->add_space_prefix = true;
		t->add_bos = true;
		return 0;
	}
	if (!d->model || strcmp(d->model, "gpt2")) {
		set_err(err, errlen, "tokenizer: unsupported tokenizer.ggml.model '%s'",
			d->model ? d->model : "(missing)");
		return -1;
	}
	t->kind = HYB_TOK_BPE;
	t->clean_spaces = true;
	t->pre = TOK_PRE_DEFAULT;
	if (!d->pre) {
		warn("missing tokenizer.ggml.pre, using 'default' (generation quality may suffer)");
		return 0;
	}
	for (size_t i = 0; i < N_OF(pre_names); i++) {
		if (strcmp(d->pre, pre_names[i].name))
			continue;
		t->pre = pre_names[i].pre;
		t->ignore_merges = pre_names[i].ignore_merges;
		t->add_bos = pre_names[i].add_bos;
		t->clean_spaces = !pre_names[i].no_clean_spaces;
		return 0;
	}
	warn("unknown pre-tokenizer '%s', using the default regexes", d->pre);
	return 0;
}

struct hyb_tokenizer *hyb_tokenizer_from_desc(const struct hyb_tok_desc *d, char *err,
					      size_t errlen)
{
	struct hyb_tokenizer *t;

	if (!d || !d->tokens || d->n_tokens == 0 || d->n_tokens > INT32_MAX / 2) {
		set_err(err, errlen, "tokenizer: empty or oversized vocabulary (%u tokens)",
			d ? d->n_tokens : 0);
		return NULL;
	}
	if (d->n_merges > INT32_MAX / 2 || (d->n_merges && !d->merges)) {
		set_err(err, errlen, "tokenizer: bad merges array (%llu entries)",
			(unsigned long long)d->n_merges);
		return NULL;
	}
	t = calloc(1, sizeof(*t));
	if (!t)
		goto oom;
	if (set_kind(t, d, err, errlen) < 0)
		goto fail;
	if (t->kind == HYB_TOK_BPE && !d->merges) {
		set_err(err, errlen, "tokenizer: missing tokenizer.ggml.merges");
		goto fail;
	}
	t->n_vocab = (int32_t)d->n_tokens;
	t->n_merges = (int32_t)d->n_merges;
	t->tok = calloc(d->n_tokens, sizeof(*t->tok));
	t->merges = calloc(d->n_merges ? d->n_merges : 1, sizeof(*t->merges));
	t->is_eog = calloc(d->n_tokens, 1);
	t->map_mask = table_mask(d->n_tokens);
	t->map = calloc((size_t)t->map_mask + 1, sizeof(*t->map));
	if (!t->tok || !t->merges || !t->is_eog || !t->map)
		goto oom;
	if (build_arena(t, d, err, errlen) < 0) {
		if (!t->arena)
			goto oom;
		goto fail;
	}
	for (uint32_t i = 0; i < d->n_tokens; i++) {
		t->tok[i].score = read_score(d, i);
		t->tok[i].attr = read_attr(d, i);
		map_insert(t, (int32_t)i);
	}
	if (d->n_merges) {
		t->merge_mask = table_mask(d->n_merges);
		t->merge_map = calloc((size_t)t->merge_mask + 1, sizeof(*t->merge_map));
		if (!t->merge_map)
			goto oom;
		for (int32_t i = 0; i < t->n_merges; i++)
			if (t->merges[i].left_len)
				merge_insert(t, i);
	}
	if (d->add_space_prefix >= 0)
		t->add_space_prefix = d->add_space_prefix;
	set_specials(t, d);
	if (d->add_bos >= 0)
		t->add_bos = d->add_bos;
	if (d->add_eos >= 0)
		t->add_eos = d->add_eos;
	detect_special(t);
	if (build_split_tokens(t) < 0)
		goto oom;
	model_attrs(t, d->name);
	if (t->kind == HYB_TOK_SPM && build_pairs(t) < 0)
		goto oom;
	for (int b = 0; b < 256; b++) {
		char hex[8];

		t->byte_tok[b] = -1;
		if (t->kind != HYB_TOK_SPM)
			continue;
		snprintf(hex, sizeof(hex), "<0x%02X>", b);
		t->byte_tok[b] = find_text(t, hex);
		if (t->byte_tok[b] < 0) {
			char c = (char)b;

			t->byte_tok[b] = hyb_tok_lookup(t, &c, 1);
		}
	}
	return t;
oom:
	set_err(err, errlen, "tokenizer: out of memory");
fail:
	hyb_tokenizer_free(t);
	return NULL;
}

/* ---- GGUF ---- */

static const struct hyb_gguf_kv *find_arr(const struct hyb_gguf_file *f, const char *key, char *err,
				      size_t errlen, bool *bad)
{
	const struct hyb_gguf_kv *kv = hyb_gguf_find(f, key);

	*bad = false;
	if (kv && kv->type != HYB_GGUF_VT_ARRAY) {
		set_err(err, errlen, "tokenizer: %s is not an array", key);
		*bad = true;
		return NULL;
	}
	return kv;
}

static struct hyb_tokenizer *tokenizer_load(const struct hyb_gguf_file *f, char *err, size_t errlen)
{
	static const char *const sp_keys[TOK_SP_COUNT] = {
		"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
		"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id",
		"tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id",
		"tokenizer.ggml.fim_pad_token_id", "tokenizer.ggml.fim_rep_token_id",
		"tokenizer.ggml.fim_sep_token_id",
	};
	struct hyb_tok_desc d;
	const struct hyb_gguf_kv *kv;
	char model[64], pre[128], name[256];
	bool bad, b;

	if (!f) {
		set_err(err, errlen, "tokenizer: no GGUF file");
		return NULL;
	}
	hyb_tok_desc_init(&d);
	if (!hyb_gguf_get_str(f, "tokenizer.ggml.model", model, sizeof(model))) {
		set_err(err, errlen, "tokenizer: missing or bad tokenizer.ggml.model");
		return NULL;
	}
	d.model = model;
	if (hyb_gguf_get_str(f, "tokenizer.ggml.pre", pre, sizeof(pre)))
		d.pre = pre;
	else if (hyb_gguf_find(f, "tokenizer.ggml.pre"))
		warn("tokenizer.ggml.pre is not a short string, ignored");

	if (hyb_gguf_get_str(f, "general.name", name, sizeof(name)))
		d.name = name;

	kv = find_arr(f, "tokenizer.ggml.tokens", err, errlen, &bad);
	if (!kv || kv->v.arr.type != HYB_GGUF_VT_STRING || kv->v.arr.n > UINT32_MAX) {
		if (!bad)
			set_err(err, errlen, "tokenizer: missing or bad tokenizer.ggml.tokens");
		return NULL;
	}
	d.n_tokens = (uint32_t)kv->v.arr.n;
	d.tokens = kv->v.arr.strs;

	kv = find_arr(f, "tokenizer.ggml.scores", err, errlen, &bad);
	if (bad)
		return NULL;
	if (kv) {
		if ((kv->v.arr.type != HYB_GGUF_VT_FLOAT32 && kv->v.arr.type != HYB_GGUF_VT_INT32) ||
		    kv->v.arr.n < d.n_tokens) {
			set_err(err, errlen,
				"tokenizer: bad tokenizer.ggml.scores (type %s, %llu entries)",
				hyb_gguf_vtype_name(kv->v.arr.type), (unsigned long long)kv->v.arr.n);
			return NULL;
		}
		d.scores = kv->v.arr.data;
		d.scores_type = kv->v.arr.type;
	}
	kv = find_arr(f, "tokenizer.ggml.token_type", err, errlen, &bad);
	if (bad)
		return NULL;
	if (kv) {
		if (kv->v.arr.type != HYB_GGUF_VT_INT32 || kv->v.arr.n < d.n_tokens) {
			set_err(err, errlen,
				"tokenizer: bad tokenizer.ggml.token_type (type %s, %llu entries)",
				hyb_gguf_vtype_name(kv->v.arr.type), (unsigned long long)kv->v.arr.n);
			return NULL;
		}
		d.types = kv->v.arr.data;
	}
	kv = find_arr(f, "tokenizer.ggml.merges", err, errlen, &bad);
	if (bad)
		return NULL;
	if (kv) {
		if (kv->v.arr.type != HYB_GGUF_VT_STRING) {
			set_err(err, errlen,
				"tokenizer: tokenizer.ggml.merges is not a string array");
			return NULL;
		}
		d.n_merges = kv->v.arr.n;
		d.merges = kv->v.arr.strs;
	}
	for (int i = 0; i < TOK_SP_COUNT; i++) {
		int64_t v;

		if (hyb_gguf_get_i64(f, sp_keys[i], &v))
			d.special[i] = v < 0 ? INT64_MAX : v;
		else if (hyb_gguf_find(f, sp_keys[i]))
			warn("%s is not an integer, ignored", sp_keys[i]);
	}
	if (hyb_gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &b))
		d.add_bos = b;
	if (hyb_gguf_get_bool(f, "tokenizer.ggml.add_eos_token", &b))
		d.add_eos = b;
	if (hyb_gguf_get_bool(f, "tokenizer.ggml.add_space_prefix", &b))
		d.add_space_prefix = b;
	return hyb_tokenizer_from_desc(&d, err, errlen);
}

/* The reason of a failure goes to hyb_last_error() (hyb/error.h). */
struct hyb_tokenizer *hyb_tokenizer_load(const struct hyb_gguf_file *f)
{
	char msg[512] = "";
	struct hyb_tokenizer *r = tokenizer_load(f, msg, sizeof(msg));

	if (!r)
		hyb_error_set(-EINVAL, "%s", msg);
	return r;
}

void hyb_tokenizer_free(struct hyb_tokenizer *t)
{
	if (!t)
		return;
	free(t->arena);
	free(t->tok);
	free(t->map);
	free(t->merges);
	free(t->merge_map);
	free(t->is_eog);
	free(t->split_tokens);
	free(t->pairs);
	free(t);
}

enum hyb_tok_kind hyb_tokenizer_kind(const struct hyb_tokenizer *t)
{
	return t ? t->kind : HYB_TOK_SPM;
}

int32_t hyb_tokenizer_n_vocab(const struct hyb_tokenizer *t)
{
	return t ? t->n_vocab : 0;
}

int32_t hyb_tokenizer_bos(const struct hyb_tokenizer *t)
{
	return t ? t->special[TOK_SP_BOS] : -1;
}

int32_t hyb_tokenizer_eos(const struct hyb_tokenizer *t)
{
	return t ? t->special[TOK_SP_EOS] : -1;
}

bool hyb_tokenizer_add_bos(const struct hyb_tokenizer *t)
{
	return t && t->add_bos;
}

bool hyb_tokenizer_is_eog(const struct hyb_tokenizer *t, int32_t id)
{
	return t && id >= 0 && id < t->n_vocab && t->is_eog[id];
}

/* ---- encoding ---- */

struct frag {
	int32_t tok;    /* >= 0: a special token split out; -1: raw text */
	size_t off, len;
};

struct frags {
	struct frag *v;
	size_t n, cap;
};

static int frags_push(struct frags *f, struct frag x)
{
	if (x.tok < 0 && !x.len)
		return 0;
	if (f->n == f->cap) {
		size_t cap = f->cap ? f->cap * 2 : 16;
		struct frag *v = realloc(f->v, cap * sizeof(*v));

		if (!v)
			return -1;
		f->v = v;
		f->cap = cap;
	}
	f->v[f->n++] = x;
	return 0;
}

static bool is_space(char c)
{
	return c == ' ' || (c >= '\t' && c <= '\r');
}

/*
 * Split special tokens out of the text before encoding, longest text first,
 * as llama.cpp's tokenizer_st_partition does: with parse_special control and
 * unknown tokens too, without it only user-defined ones (control tokens are
 * then ordinary text). LSTRIP/RSTRIP tokens drop the whitespace beside them.
 */
static int partition(const struct hyb_tokenizer *t, const char *text, size_t len,
		     bool parse_special, struct frags *out)
{
	struct frags cur = { 0 }, next = { 0 };

	if (frags_push(&cur, (struct frag){ -1, 0, len }) < 0)
		return -1;
	for (int32_t u = 0; u < t->n_split_tokens; u++) {
		int32_t id = t->split_tokens[u];
		const char *s = tok_text(t, id);
		size_t n = t->tok[id].len;
		uint32_t attr = t->tok[id].attr;

		if (!parse_special && (attr & (TOK_ATTR_CONTROL | TOK_ATTR_UNKNOWN)))
			continue;
		if (!n)
			continue;
		next.n = 0;
		for (size_t i = 0; i < cur.n; i++) {
			struct frag f = cur.v[i];
			size_t pos = f.off, end = f.off + f.len;
			const char *m;

			if (f.tok >= 0) {
				if (frags_push(&next, f) < 0)
					goto oom;
				continue;
			}
			while ((m = memmem(text + pos, end - pos, s, n))) {
				size_t at = (size_t)(m - text), left = at;

				if (attr & TOK_ATTR_LSTRIP)
					while (left > pos && is_space(text[left - 1]))
						left--;
				if (frags_push(&next, (struct frag){ -1, pos, left - pos }) < 0 ||
				    frags_push(&next, (struct frag){ id, at, n }) < 0)
					goto oom;
				pos = at + n;
				if (attr & TOK_ATTR_RSTRIP)
					while (pos < end && is_space(text[pos]))
						pos++;
			}
			if (frags_push(&next, (struct frag){ -1, pos, end - pos }) < 0)
				goto oom;
		}
		struct frags tmp = cur;

		cur = next;
		next = tmp;
	}
	free(next.v);
	*out = cur;
	return 0;
oom:
	free(cur.v);
	free(next.v);
	return -1;
}

/* SPM input: optional leading space, then every space escaped to U+2581. */
static char *spm_escape(const char *s, size_t len, bool lead, size_t *out_len)
{
	size_t n = lead ? 3 : 0;
	char *buf, *p;

	for (size_t i = 0; i < len; i++)
		n += s[i] == ' ' ? 3 : 1;
	buf = malloc(n ? n : 1);
	if (!buf)
		return NULL;
	p = buf;
	if (lead) {
		memcpy(p, U2581, 3);
		p += 3;
	}
	for (size_t i = 0; i < len; i++) {
		if (s[i] == ' ') {
			memcpy(p, U2581, 3);
			p += 3;
		} else {
			*p++ = s[i];
		}
	}
	*out_len = n;
	return buf;
}

static int encode(const struct hyb_tokenizer *t, const char *text, size_t len, bool add_special,
		  bool parse_special, struct tok_ids *ids)
{
	struct frags frags = { 0 };
	bool prev_special = true; /* SPM: a space goes before the first text fragment */
	int rc = 0;

	if (add_special && t->add_bos && t->special[TOK_SP_BOS] >= 0 &&
	    hyb_tok_ids_push(ids, t->special[TOK_SP_BOS]) < 0)
		return -1;
	if (len && partition(t, text, len, parse_special, &frags) < 0)
		return -1;
	for (size_t i = 0; i < frags.n && rc == 0; i++) {
		const struct frag *f = &frags.v[i];

		if (f->tok >= 0) {
			rc = hyb_tok_ids_push(ids, f->tok);
			prev_special = true;
		} else if (t->kind == HYB_TOK_SPM) {
			size_t n;
			char *s = spm_escape(text + f->off, f->len,
					     t->add_space_prefix && prev_special, &n);

			rc = s ? hyb_tok_spm_encode(t, s, n, ids) : -1;
			free(s);
			prev_special = false;
		} else {
			rc = hyb_tok_bpe_encode(t, text + f->off, f->len, ids);
		}
	}
	free(frags.v);
	if (rc == 0 && add_special && t->add_eos && t->special[TOK_SP_EOS] >= 0)
		rc = hyb_tok_ids_push(ids, t->special[TOK_SP_EOS]);
	return rc;
}

int hyb_tokenize(const struct hyb_tokenizer *t, const char *text, size_t len, bool add_special,
		 int32_t *out, int cap)
{
	return hyb_tokenize_flags(t, text, len, add_special ? HYB_TOKENIZE_ADD_SPECIAL : 0, out,
				  cap);
}

int hyb_tokenize_flags(const struct hyb_tokenizer *t, const char *text, size_t len,
		       unsigned int flags, int32_t *out, int cap)
{
	const unsigned int known = HYB_TOKENIZE_ADD_SPECIAL | HYB_TOKENIZE_PARSE_SPECIAL;
	struct tok_ids ids = { 0 };
	int n;

	if (!t || (!text && len) || cap < 0 || (!out && cap > 0))
		return hyb_error_set(-EINVAL, "tokenize: no tokenizer, text or output buffer");
	if (flags & ~known)
		return hyb_error_set(-EINVAL, "tokenize: unknown flags 0x%x", flags & ~known);
	if (len > INT_MAX / 2)
		return hyb_error_set(-E2BIG, "tokenize: %zu bytes of text is more than %d", len,
				     INT_MAX / 2);
	if (encode(t, text, len, flags & HYB_TOKENIZE_ADD_SPECIAL,
		   flags & HYB_TOKENIZE_PARSE_SPECIAL, &ids) < 0 ||
	    ids.n > INT_MAX) {
		free(ids.v);
		return hyb_error_set(-ENOMEM, "tokenize: out of memory for %zu bytes of text",
				     len);
	}
	n = (int)ids.n;
	if (n && cap)
		memcpy(out, ids.v, (size_t)(n < cap ? n : cap) * sizeof(*out));
	free(ids.v);
	return n;
}

/* ---- decoding ---- */

/* Bounded output that keeps counting past its capacity; drops `skip` bytes first. */
struct sink {
	char *buf;
	size_t cap, n, skip;
	int first; /* first byte offered, -1 before any */
};

static void put(struct sink *s, const void *p, size_t n)
{
	const char *c = p;

	if (n && s->first < 0)
		s->first = (unsigned char)c[0];
	if (s->skip) {
		size_t k = n < s->skip ? n : s->skip;

		s->skip -= k;
		c += k;
		n -= k;
	}
	if (s->n < s->cap) {
		size_t room = s->cap - s->n;

		memcpy(s->buf + s->n, c, n < room ? n : room);
	}
	s->n += n;
}

/*
 * GPT-2 stand-in character -> byte, or -1 when cpt is not one. Code points
 * 256.. stand for the 68 non-printable bytes in order: 0x00-0x20, 0x7f-0xa0, 0xad.
 */
static int unmap_byte(uint32_t cpt)
{
	if ((cpt >= 0x21 && cpt <= 0x7e) || (cpt >= 0xa1 && cpt <= 0xac) ||
	    (cpt >= 0xae && cpt <= 0xff))
		return (int)cpt;
	if (cpt < 256 || cpt >= 256 + 68)
		return -1;
	cpt -= 256;
	if (cpt < 33)
		return (int)cpt;
	if (cpt < 67)
		return (int)(0x7f + cpt - 33);
	return 0xad;
}

/* A BPE token's text back to bytes (llama.cpp's llama_decode_text, oddities kept). */
static void put_bpe_text(struct sink *s, const char *text, size_t len)
{
	uint32_t stack[64], *cpts = len <= 64 ? stack : malloc(len * sizeof(*cpts));
	size_t n;

	if (!cpts)
		return;
	n = hyb_tok_utf8_decode(text, len, cpts);
	for (size_t i = 0; i < n; i++) {
		int b = unmap_byte(cpts[i]);
		char u[4], hex[3];
		int m;

		if (b >= 0) {
			unsigned char c = (unsigned char)b;

			put(s, &c, 1);
			continue;
		}
		m = hyb_tok_utf8_encode(cpts[i], u);
		put(s, "[UNK_BYTE_0x", 12);
		for (int k = 0; k < m; k++) {
			snprintf(hex, sizeof(hex), "%02x", (unsigned char)u[k]);
			put(s, hex, 2);
		}
		put(s, text, len);
		put(s, "]", 1);
	}
	if (cpts != stack)
		free(cpts);
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* The byte of a <0xXX> token (0 when the text is not of that form). */
static unsigned char byte_of(const char *s, size_t n)
{
	int v = 0;

	for (size_t i = 3; i < 5 && i < n; i++) {
		int h = hexval(s[i]);

		if (h < 0)
			break;
		v = v * 16 + h;
	}
	return (unsigned char)v;
}

/* llama_token_to_piece(special = false): control and unknown tokens are silent. */
static void put_piece(const struct hyb_tokenizer *t, int32_t id, struct sink *s)
{
	const struct tok_entry *e = &t->tok[id];
	const char *text = tok_text(t, id);

	if (e->attr & (TOK_ATTR_UNKNOWN | TOK_ATTR_CONTROL))
		return;
	if (e->attr & TOK_ATTR_USER_DEFINED) {
		put(s, text, e->len);
	} else if (e->attr & TOK_ATTR_NORMAL) {
		if (t->kind == HYB_TOK_BPE) {
			put_bpe_text(s, text, e->len);
			return;
		}
		for (size_t i = 0; i < e->len; i++) {
			if (i + 3 <= e->len && !memcmp(text + i, U2581, 3)) {
				put(s, " ", 1);
				i += 2;
			} else {
				put(s, text + i, 1);
			}
		}
	} else if (e->attr & TOK_ATTR_BYTE) {
		unsigned char c = byte_of(text, e->len);

		put(s, &c, 1);
	}
}

/* The piece with one leading space removed (llama.cpp's lstrip = 1). */
static void put_piece_lstrip(const struct hyb_tokenizer *t, int32_t id, struct sink *s)
{
	struct sink probe = { NULL, 0, 0, 0, -1 };

	put_piece(t, id, &probe);
	if (probe.first == ' ')
		s->skip = 1;
	put_piece(t, id, s);
	s->skip = 0;
}

int hyb_token_to_piece(const struct hyb_tokenizer *t, int32_t id, char *buf, int cap)
{
	struct sink s = { buf, cap > 0 ? (size_t)cap : 0, 0, 0, -1 };

	if (!t || cap < 0 || (!buf && cap > 0))
		return hyb_error_set(-EINVAL, "token to piece: no tokenizer or buffer");
	if (id < 0 || id >= t->n_vocab)
		return hyb_error_set(-EINVAL, "token id %d is outside 0..%d", id, t->n_vocab - 1);
	put_piece(t, id, &s);
	if (s.n < s.cap)
		buf[s.n] = '\0';
	return (int)(s.n < s.cap ? s.n : s.cap);
}

/* llama.cpp's clean_up_tokenization_spaces passes, done in place on the same indices. */
static size_t clean_spaces(char *text, size_t total)
{
	size_t n, i;

	n = total ? 1 : 0;
	for (i = 1; i < total; i++) {
		char x = text[i];

		if (text[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ','))
			n--;
		text[n++] = x;
	}
	total = n;
	n = total ? 1 : 0;
	for (i = 1; i < total; i++) {
		char x = text[i];

		if (x == '\'' && i + 1 < total && text[i - 1] == ' ' && text[i + 1] == ' ') {
			n--;
			text[++i] = '\0';
		}
		text[n++] = x;
	}
	total = n;
	n = total ? 1 : 0;
	for (i = 1; i < total; i++) {
		char x = text[i];

		if (text[i - 1] == ' ' && x == '\'' && i + 1 < total) {
			char x1 = text[i + 1];

			if (x1 == 's' || x1 == 'm')
				n--;
			else if (i + 2 < total && ((x1 == 'r' && text[i + 2] == 'e') ||
						   (x1 == 'v' && text[i + 2] == 'e')))
				n--;
		}
		text[n++] = x;
	}
	return n;
}

int hyb_detokenize(const struct hyb_tokenizer *t, const int32_t *ids, int n_ids, char *buf,
		   int cap)
{
	struct sink s = { NULL, 0, 0, 0, -1 };
	size_t total;

	if (!t || n_ids < 0 || (!ids && n_ids) || cap < 0 || (!buf && cap > 0))
		return hyb_error_set(-EINVAL, "detokenize: no tokenizer, ids or buffer");
	for (int i = 0; i < n_ids; i++)
		if (ids[i] < 0 || ids[i] >= t->n_vocab)
			return hyb_error_set(-EINVAL, "detokenize: id %d (position %d) is outside "
					     "0..%d", ids[i], i, t->n_vocab - 1);
	/* First pass counts, second writes: the space cleanup needs the whole text. */
	for (int pass = 0; pass < 2; pass++) {
		bool strip = t->add_space_prefix;

		s.n = 0;
		for (int i = 0; i < n_ids; i++) {
			if (strip)
				put_piece_lstrip(t, ids[i], &s);
			else
				put_piece(t, ids[i], &s);
			strip = false;
		}
		if (pass == 0) {
			if (s.n > INT_MAX)
				return -1;
			s.buf = malloc(s.n ? s.n : 1);
			if (!s.buf)
				return -1;
			s.cap = s.n;
		}
	}
	total = s.n;
	if (t->clean_spaces)
		total = clean_spaces(s.buf, total);
	if (cap)
		memcpy(buf, s.buf, total < (size_t)cap ? total : (size_t)cap);
	if (total < (size_t)cap)
		buf[total] = '\0';
	free(s.buf);
	return (int)total;
}
