/* SPDX-License-Identifier: MIT */
/*
 * Tokenizer built from a GGUF file's tokenizer.ggml.* metadata:
 *   - "llama": SentencePiece-style: tokens + scores, greedy best-score bigram
 *     merging, byte fallback (<0xXX> tokens), space -> U+2581 with a leading
 *     space added (tokenizer.ggml.add_space_prefix, default true);
 *   - "gpt2": byte-level BPE with tokenizer.ggml.merges and the pre-tokenizer
 *     named by tokenizer.ggml.pre (default, llama3/llama-bpe, ...).
 * Behaviour (BOS/EOS insertion, special tokens, decoding) follows llama.cpp's
 * llama-vocab.cpp so token ids match it.
 */
#ifndef HYB_TOKENIZER_H
#define HYB_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hyb/error.h"

struct hyb_gguf_file;
struct hyb_tokenizer;

enum hyb_tok_kind { HYB_TOK_SPM, HYB_TOK_BPE };

/* NULL with a one-line message in hyb_last_error() when the metadata is missing or invalid. */
struct hyb_tokenizer *hyb_tokenizer_load(const struct hyb_gguf_file *f);
void hyb_tokenizer_free(struct hyb_tokenizer *t);

enum hyb_tok_kind hyb_tokenizer_kind(const struct hyb_tokenizer *t);
int32_t hyb_tokenizer_n_vocab(const struct hyb_tokenizer *t);
int32_t hyb_tokenizer_bos(const struct hyb_tokenizer *t); /* -1 when none */
int32_t hyb_tokenizer_eos(const struct hyb_tokenizer *t);
bool hyb_tokenizer_add_bos(const struct hyb_tokenizer *t);
/* True for EOS/EOT and other end-of-generation tokens. */
bool hyb_tokenizer_is_eog(const struct hyb_tokenizer *t, int32_t id);

/*
 * Encode UTF-8 text. add_special: prepend BOS (when the model wants it) as
 * llama.cpp's llama_tokenize(add_special=true, parse_special=false) does
 * (and append EOS when tokenizer.ggml.add_eos_token asks for it). Invalid
 * UTF-8 is tokenized as llama.cpp does (byte tokens for SPM, U+FFFD for BPE).
 * Writes at most cap ids; returns the total count needed (may exceed cap),
 * or a negative errno (hyb_last_error()) on invalid input.
 */
int hyb_tokenize(const struct hyb_tokenizer *t, const char *text, size_t len, bool add_special,
		 int32_t *out, int cap);

/* hyb_tokenize_flags' flags. */
enum {
	HYB_TOKENIZE_ADD_SPECIAL = 1u << 0,   /* BOS/EOS as the model wants: add_special above */
	/*
	 * Special tokens written in the text become their ids, as llama.cpp's
	 * parse_special = true: "<|im_start|>" is its one control token, not
	 * characters. For prompts made by a chat template (hyb/chat.h), never for
	 * text a user typed into a plain prompt.
	 */
	HYB_TOKENIZE_PARSE_SPECIAL = 1u << 1,
};

/* hyb_tokenize with flags (HYB_TOKENIZE_*; an unknown bit is -EINVAL). */
int hyb_tokenize_flags(const struct hyb_tokenizer *t, const char *text, size_t len,
		       unsigned int flags, int32_t *out, int cap);

/*
 * The bytes token `id` contributes to the output text (leading-space rules
 * as llama_token_to_piece with special=false, lstrip=0: control and unknown
 * tokens give nothing, SPM's U+2581 becomes a space and is kept at the
 * start). Returns length written (< cap truncates), or -EINVAL for an invalid
 * id (hyb_last_error() names it).
 * The piece is NUL-terminated when it is shorter than cap. Streaming callers
 * concatenate pieces; pieces may be partial UTF-8 sequences (byte tokens).
 */
int hyb_token_to_piece(const struct hyb_tokenizer *t, int32_t id, char *buf, int cap);

/*
 * Decode a whole sequence as llama_detokenize(remove_special = false,
 * unparse_special = false): pieces concatenated, the first one's leading
 * space dropped when the model adds one (SPM), and for most BPE models
 * Hugging Face's clean_up_tokenization_spaces applied. Writes at most cap
 * bytes (NUL-terminated when there is room); returns the full length, or
 * -EINVAL for an invalid id (hyb_last_error() names it).
 */
int hyb_detokenize(const struct hyb_tokenizer *t, const int32_t *ids, int n_ids, char *buf,
		   int cap);

#endif
