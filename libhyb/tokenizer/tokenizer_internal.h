/* SPDX-License-Identifier: MIT */
/*
 * Internals shared by the tokenizer files (tokenizer.c: vocabulary, special
 * tokens, decoding; tokenizer_spm.c and tokenizer_bpe.c: the two encoders;
 * tokenizer_pretok.c: Unicode classes and the BPE pre-tokenizer splitters).
 * Tests include this header to build tokenizers from plain arrays.
 */
#ifndef HYB_TOKENIZER_INTERNAL_H
#define HYB_TOKENIZER_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hyb/gguf.h"
#include "hyb/tokenizer.h"

/* Token attributes, as llama.cpp derives them from tokenizer.ggml.token_type. */
enum {
	TOK_ATTR_UNKNOWN = 1 << 0,
	TOK_ATTR_UNUSED = 1 << 1,
	TOK_ATTR_NORMAL = 1 << 2,
	TOK_ATTR_CONTROL = 1 << 3,
	TOK_ATTR_USER_DEFINED = 1 << 4,
	TOK_ATTR_BYTE = 1 << 5,
	/* Whitespace next to the token is dropped when it is split out of text. */
	TOK_ATTR_LSTRIP = 1 << 7,
	TOK_ATTR_RSTRIP = 1 << 8,
};

/* GGUF token_type values. */
enum {
	TOK_TYPE_UNDEFINED = 0,
	TOK_TYPE_NORMAL = 1,
	TOK_TYPE_UNKNOWN = 2,
	TOK_TYPE_CONTROL = 3,
	TOK_TYPE_USER_DEFINED = 4,
	TOK_TYPE_UNUSED = 5,
	TOK_TYPE_BYTE = 6,
};

/* The pre-tokenizer regex families we implement (tokenizer.ggml.pre). */
enum tok_pre {
	TOK_PRE_DEFAULT,   /* llama.cpp's fallback set of four regexes */
	TOK_PRE_GPT2,      /* 's|'t|...| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S) */
	TOK_PRE_LLAMA3,    /* (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|... */
	TOK_PRE_QWEN2,     /* as LLAMA3 with \p{N} instead of \p{N}{1,3} */
	TOK_PRE_STARCODER, /* \p{N} isolated, then GPT2 */
};

/* Unicode code point classes (the bits match llama.cpp's unicode_cpt_flags). */
enum {
	TOK_CPT_UNDEFINED = 0x0001,
	TOK_CPT_NUMBER = 0x0002,
	TOK_CPT_LETTER = 0x0004,
	TOK_CPT_SEPARATOR = 0x0008,
	TOK_CPT_MARK = 0x0010,
	TOK_CPT_PUNCT = 0x0020,
	TOK_CPT_SYMBOL = 0x0040,
	TOK_CPT_CONTROL = 0x0080,
	TOK_CPT_CATEGORIES = 0x00ff,
	TOK_CPT_SPACE = 0x0100,
};

/* Special token ids carried in a description; TOK_ID_ABSENT when the key is missing. */
enum tok_special {
	TOK_SP_BOS,
	TOK_SP_EOS,
	TOK_SP_EOT,
	TOK_SP_EOM,
	TOK_SP_UNK,
	TOK_SP_PAD,
	TOK_SP_FIM_PAD,
	TOK_SP_FIM_REP,
	TOK_SP_FIM_SEP,
	TOK_SP_COUNT
};
#define TOK_ID_ABSENT (-1)

/*
 * Everything the constructor needs, independent of where it came from.
 * Arrays are read with memcpy (GGUF array data need not be aligned) and
 * copied: nothing here has to outlive hyb_tokenizer_from_desc().
 */
struct hyb_tok_desc {
	const char *model;             /* "llama" (SPM) or "gpt2" (BPE) */
	const char *pre;               /* tokenizer.ggml.pre; NULL when absent */
	uint32_t n_tokens;
	const struct hyb_gguf_str *tokens;
	const void *scores;            /* n_tokens values or NULL (all 0) */
	uint32_t scores_type;          /* HYB_GGUF_VT_FLOAT32 or HYB_GGUF_VT_INT32 */
	const void *types;             /* n_tokens int32 token types or NULL (all normal) */
	uint64_t n_merges;
	const struct hyb_gguf_str *merges; /* "left right" strings (BPE) */
	int64_t special[TOK_SP_COUNT]; /* ids from the metadata, TOK_ID_ABSENT if missing */
	int8_t add_bos, add_eos, add_space_prefix; /* -1: key absent */
	const char *name;              /* general.name (per-model token attributes); NULL when absent */
};

/* A description with every optional field absent. */
void hyb_tok_desc_init(struct hyb_tok_desc *d);
struct hyb_tokenizer *hyb_tokenizer_from_desc(const struct hyb_tok_desc *d, char *err,
					      size_t errlen);

struct tok_entry {
	uint32_t off;  /* text in t->arena */
	uint32_t len;
	float score;
	uint32_t attr;
};

struct hyb_tok_merge {
	uint32_t left_off, left_len;   /* in t->arena */
	uint32_t right_off, right_len;
};

/* Two adjacent UTF-8 characters, bytes packed little-end first; len 0 = empty slot. */
struct tok_pair {
	uint64_t bytes;
	uint32_t len;
};

struct hyb_tokenizer {
	enum hyb_tok_kind kind;
	enum tok_pre pre;
	int32_t n_vocab;
	char *arena;                 /* token texts, then merge texts */
	struct tok_entry *tok;
	uint32_t *map;               /* open addressing: id + 1, 0 = empty */
	uint32_t map_mask;
	uint32_t max_token_len;

	int32_t n_merges;
	struct hyb_tok_merge *merges;
	uint32_t *merge_map;         /* rank + 1, 0 = empty */
	uint32_t merge_mask;

	int32_t special[TOK_SP_COUNT];
	uint8_t *is_eog;             /* n_vocab flags */
	/*
	 * Tokens split out of text before encoding, longest text first: control,
	 * user-defined and unknown ones (llama.cpp's cache_special_tokens);
	 * without parse_special only the user-defined ones among them.
	 */
	int32_t *split_tokens;
	int32_t n_split_tokens;
	int32_t byte_tok[256];       /* SPM byte fallback ids (<0xXX>), -1 when missing */
	/*
	 * SPM: every pair of adjacent characters found inside some token. No
	 * merge can cross a boundary between characters not in this set, so
	 * the encoder works on such segments independently (same result,
	 * small heaps).
	 */
	struct tok_pair *pairs;
	uint32_t pair_mask;

	bool add_bos, add_eos, add_space_prefix;
	bool ignore_merges, clean_spaces;
};

/* A growing array of token ids. */
struct tok_ids {
	int32_t *v;
	size_t n, cap;
};
int hyb_tok_ids_push(struct tok_ids *a, int32_t id);

/* Exact-text vocabulary lookup: the id or -1. */
int32_t hyb_tok_lookup(const struct hyb_tokenizer *t, const char *s, size_t n);

/* Encoders: append ids for one raw text fragment; 0 or -1 on allocation failure. */
int hyb_tok_spm_encode(const struct hyb_tokenizer *t, const char *text, size_t len,
		   struct tok_ids *out);
int hyb_tok_bpe_encode(const struct hyb_tokenizer *t, const char *text, size_t len,
		   struct tok_ids *out);
/* SPM: can a token contain characters a (na bytes) and b (nb bytes) side by side? */
bool hyb_tok_pair_possible(const struct hyb_tokenizer *t, const char *a, size_t na, size_t nb);
/* BPE merge rank of the pair (left, right), or -1. */
int32_t hyb_tok_merge_rank(const struct hyb_tokenizer *t, const char *l, size_t ln, const char *r,
		       size_t rn);

/* ---- Unicode helpers (tokenizer_pretok.c) ---- */

/* Length of the UTF-8 sequence a lead byte announces (1 for stray bytes), as llama.cpp. */
static inline size_t tok_utf8_len(unsigned char c)
{
	static const unsigned char len[16] = { 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4 };

	return len[c >> 4];
}

/*
 * Decode UTF-8 into code points (out needs len entries). A byte that does not
 * start a complete sequence becomes U+FFFD and decoding resumes at the next
 * byte, as llama.cpp's unicode_cpts_from_utf8 does. Returns the count.
 */
size_t hyb_tok_utf8_decode(const char *s, size_t len, uint32_t *out);
/* Encode one code point (values past U+10FFFF encode as U+FFFD); returns 1..4. */
int hyb_tok_utf8_encode(uint32_t cpt, char *buf);

/*
 * Split code points into pre-tokenizer words. On return *lens holds *n_words
 * word lengths (in code points), allocated with malloc. 0 or -1 (no memory).
 */
int hyb_tok_pretok_split(enum tok_pre pre, const uint32_t *cpts, size_t n, size_t **lens,
		     size_t *n_words);

#endif
