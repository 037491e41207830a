// SPDX-License-Identifier: MIT
/*
 * Special tokens written in text (HYB_TOKENIZE_PARSE_SPECIAL) and the
 * end-of-generation sets, against llama.cpp's llama_tokenize(parse_special =
 * true) and llama_vocab_is_eog recorded in tok_special_expected.h
 * (tests/oracle/chat_oracle.c): llama.cpp's test vocabularies
 * (.cache/vocab, tests/data/fetch-vocab.sh) and, when they are here, the
 * SmolLM2 and Gemma 3 model files (tests/data/fetch-models.sh). Also the strip attributes on a hand-made vocabulary.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hyb/gguf.h"
#include "hyb/tokenizer.h"
#include "test.h"
#include "tokenizer/tokenizer_internal.h"

#define EOG_ROW (-1)
#include "tok_special_expected.h"

/* The texts chat_oracle.c tokenized, in its order. */
static const char *const tok_texts[] = {
	"<|im_start|>system\nYou are helpful<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
	"<|im_start|>assistant\n",
	"<s>[INST] <<SYS>>\nBe brief\n<</SYS>>\n\nHello [/INST]Hi</s><s>[INST] Again [/INST]",
	"<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
	"<|start_header_id|>assistant<|end_header_id|>\n\n",
	"text<|endoftext|>more <|endoftext|>  <unk> end</s>",
	"<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
	"<|im_start|><|im_start|>x<|im_end",
};

static void check_vocab(const char *name, const char *path)
{
	struct hyb_gguf_file *f;
	struct hyb_tokenizer *t;
	int rows = 0;

	CHECK_MSG(hyb_gguf_open(path, &f) == 0, "%s: %s", path, hyb_last_error());
	t = hyb_tokenizer_load(f);
	CHECK_MSG(t, "%s: %s", path, hyb_last_error());
	for (size_t r = 0; r < sizeof(tok_cases) / sizeof(tok_cases[0]); r++) {
		const struct tok_case *c = &tok_cases[r];
		int32_t ids[256];
		int n, k = 0;

		if (strcmp(c->vocab, name))
			continue;
		rows++;
		if (c->text == EOG_ROW) {
			/* the end-of-generation set, id for id */
			for (int32_t id = 0; id < hyb_tokenizer_n_vocab(t); id++) {
				bool want = k < c->n && c->ids[k] == id;

				CHECK_MSG(hyb_tokenizer_is_eog(t, id) == want,
					  "%s: token %d: is_eog %d, llama.cpp %d", name, id,
					  hyb_tokenizer_is_eog(t, id), want);
				k += want;
			}
			CHECK_EQ_INT(k, c->n);
			continue;
		}
		n = hyb_tokenize_flags(t, tok_texts[c->text], strlen(tok_texts[c->text]),
				       HYB_TOKENIZE_PARSE_SPECIAL |
					       (c->add_special ? HYB_TOKENIZE_ADD_SPECIAL : 0),
				       ids, 256);
		CHECK_MSG(n == c->n, "%s text %d add %d: %d ids, llama.cpp %d", name, c->text,
			  c->add_special, n, c->n);
		for (int i = 0; i < n; i++)
			CHECK_MSG(ids[i] == c->ids[i], "%s text %d add %d: id %d is %d, llama.cpp %d",
				  name, c->text, c->add_special, i, ids[i], c->ids[i]);
	}
	CHECK_MSG(rows > 0, "no expected rows for %s", name);
	hyb_tokenizer_free(t);
	hyb_gguf_close(f);
}

static const char *fetched_vocab(const char *name)
{
	static char path[512];

	snprintf(path, sizeof(path), ".cache/vocab/ggml-vocab-%s.gguf", name);
	if (access(path, R_OK) &&
	    system("bash tests/data/fetch-vocab.sh .cache/vocab 2>/dev/null") != 0)
		SKIP("llama.cpp vocab files unavailable (tests/data/fetch-vocab.sh failed)");
	return path;
}

TEST(tok_parse_special_llama_spm)
{
	check_vocab("llama-spm", fetched_vocab("llama-spm"));
}

TEST(tok_parse_special_gpt2)
{
	check_vocab("gpt-2", fetched_vocab("gpt-2"));
}

TEST(tok_parse_special_llama_bpe)
{
	check_vocab("llama-bpe", fetched_vocab("llama-bpe"));
}

TEST(tok_parse_special_smollm2)
{
	check_vocab("smollm2", hyb_test_real_model("smollm2"));
}

TEST(tok_parse_special_gemma3)
{
	check_vocab("gemma3", hyb_test_real_model("gemma3"));
}

/* A byte-level BPE vocabulary of the 256 byte characters and `extra`. */
static struct hyb_tokenizer *tiny(const char *name, const char *const *extra,
				  const int32_t *types_in, int n_extra)
{
	static char bytes[256][4];
	static struct hyb_gguf_str toks[300];
	static int32_t types[300];
	struct hyb_tok_desc d;
	char err[128];
	struct hyb_tokenizer *t;
	int n = 0;
	uint32_t next = 256;

	for (int b = 0; b < 256; b++) {
		bool self = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
		int len = hyb_tok_utf8_encode(self ? (uint32_t)b : next++, bytes[b]);

		toks[n] = (struct hyb_gguf_str){ (uint64_t)len, bytes[b] };
		types[n++] = TOK_TYPE_NORMAL;
	}
	for (int i = 0; i < n_extra; i++) {
		toks[n] = (struct hyb_gguf_str){ strlen(extra[i]), (char *)extra[i] };
		types[n++] = types_in[i];
	}
	hyb_tok_desc_init(&d);
	d.model = "gpt2";
	d.pre = "gpt-2";
	d.n_tokens = (uint32_t)n;
	d.tokens = toks;
	d.types = types;
	d.n_merges = 0;
	d.merges = toks; /* no merges; any non-NULL array */
	d.name = name;
	t = hyb_tokenizer_from_desc(&d, err, sizeof(err));
	CHECK_MSG(t, "%s", err);
	return t;
}

#define IDS(t, flags, text, ...)                                                         \
	do {                                                                             \
		const int32_t want_[] = { __VA_ARGS__ };                                 \
		const int nw_ = (int)(sizeof(want_) / sizeof(want_[0]));                 \
		int32_t got_[64];                                                        \
		int n_ = hyb_tokenize_flags(t, text, strlen(text), flags, got_, 64);     \
		CHECK_MSG(n_ == nw_, "\"%s\": %d ids, want %d", text, n_, nw_);          \
		for (int i_ = 0; i_ < nw_; i_++)                                         \
			CHECK_MSG(got_[i_] == want_[i_], "\"%s\": id %d is %d, want %d", \
				  text, i_, got_[i_], want_[i_]);                        \
	} while (0)

TEST(tok_parse_special_rules)
{
	const char *extra[] = { "<|user|>", "<|end|>", "<tag>", "<s>" };
	const int32_t types[] = { TOK_TYPE_CONTROL, TOK_TYPE_CONTROL, TOK_TYPE_USER_DEFINED,
				  TOK_TYPE_CONTROL };
	const unsigned P = HYB_TOKENIZE_PARSE_SPECIAL;
	struct hyb_tokenizer *t = tiny("Some Model", extra, types, 4);
	int32_t ids[4];

	/* parse_special: control tokens are split out; without it they are text */
	IDS(t, P, "<|user|>\nx<|end|>", 256, '\n', 'x', 257);
	IDS(t, 0, "<|user|>x", '<', '|', 'u', 's', 'e', 'r', '|', '>', 'x');
	IDS(t, 0, "a<tag>b", 'a', 258, 'b');
	IDS(t, P, "<|end|><|end|>", 257, 257);
	CHECK_EQ_INT(hyb_tokenize_flags(t, "x", 1, 1u << 5, ids, 4), -EINVAL);
	CHECK(strstr(hyb_last_error(), "flags"));
	hyb_tokenizer_free(t);

	/* Phi-3 by name: special tokens eat the whitespace after them, <s> does not */
	t = tiny("Phi-3 Mini 4k Instruct", extra, types, 4);
	IDS(t, P, "<|user|>\n x <|end|> \n", 256, 'x', ' ', 257);
	IDS(t, P, "<s> y", 259, ' ', 'y');
	hyb_tokenizer_free(t);
}
