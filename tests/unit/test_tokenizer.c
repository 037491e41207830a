// SPDX-License-Identifier: MIT
/*
 * Tokenizer tests: token ids compared with llama.cpp (its own vocab test
 * vectors, fetched by tests/data/fetch-vocab.sh, and hard-coded ids for the
 * shared LLaMA-2 vocabulary), the merge rules on tiny hand-made vocabularies,
 * decoding, bad input and speed.
 */
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "test.h"
#include "hyb/gguf.h"
#include "hyb/tokenizer.h"
#include "tokenizer/tokenizer_internal.h"

#define VOCAB_DIR ".cache/vocab"

static struct hyb_gguf_file *open_file;

static struct hyb_tokenizer *load_path(const char *path)
{
	struct hyb_tokenizer *t;

	CHECK_MSG(hyb_gguf_open(path, &open_file) == 0, "%s: %s", path, hyb_last_error());
	t = hyb_tokenizer_load(open_file);
	CHECK_MSG(t, "%s: %s", path, hyb_last_error());
	return t;
}

static struct hyb_tokenizer *load_tiny(void)
{
	const char *path = hyb_test_shared("models/llama-2-tiny-random.gguf");

	if (access(path, R_OK))
		SKIP("%s not found (set HYB_SHARED)", path);
	return load_path(path);
}

/* .cache/vocab/ggml-vocab-NAME.gguf, fetched on first use; SKIP when that fails. */
static const char *vocab_path(const char *name)
{
	static char path[512];
	char cmd[1024], why[256] = "", log[300];
	FILE *f;

	snprintf(path, sizeof(path), VOCAB_DIR "/ggml-vocab-%s.gguf.out", name);
	if (access(path, R_OK)) {
		snprintf(log, sizeof(log), "%s/fetch.log", hyb_test_tmpdir());
		snprintf(cmd, sizeof(cmd), "bash tests/data/fetch-vocab.sh " VOCAB_DIR " 2>'%s'",
			 log);
		if (system(cmd) != 0) {
			f = fopen(log, "r");
			if (f) {
				if (!fgets(why, sizeof(why), f))
					why[0] = '\0';
				fclose(f);
			}
			why[strcspn(why, "\n")] = '\0';
			SKIP("llama.cpp vocab files unavailable: %s",
			     why[0] ? why : "tests/data/fetch-vocab.sh failed");
		}
	}
	snprintf(path, sizeof(path), VOCAB_DIR "/ggml-vocab-%s.gguf", name);
	return path;
}

static char *slurp(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	char *buf;
	long len;

	CHECK_MSG(f, "cannot open %s", path);
	fseek(f, 0, SEEK_END);
	len = ftell(f);
	fseek(f, 0, SEEK_SET);
	buf = malloc((size_t)len + 1);
	CHECK(buf);
	*n = fread(buf, 1, (size_t)len, f);
	buf[*n] = '\0';
	fclose(f);
	return buf;
}

static void print_ids(const char *what, const int32_t *ids, int n)
{
	fprintf(stderr, "    %s:", what);
	for (int i = 0; i < n; i++)
		fprintf(stderr, " %d", ids[i]);
	fputc('\n', stderr);
}

static void check_ids(const struct hyb_tokenizer *t, const char *text, size_t len, bool special,
		      const int32_t *want, int n_want)
{
	int32_t got[512];
	int n = hyb_tokenize(t, text, len, special, got, 512);

	if (n != n_want || (n && memcmp(got, want, (size_t)n * sizeof(*got)))) {
		print_ids("want", want, n_want);
		print_ids("got ", got, n < 512 ? n : 512);
		CHECK_MSG(0, "ids differ for '%.*s' (add_special %d)", (int)len, text, special);
	}
}

#define IDS(...) ((const int32_t[]){ __VA_ARGS__ })
#define N_IDS(...) ((int)(sizeof((const int32_t[]){ __VA_ARGS__ }) / sizeof(int32_t)))
#define EXPECT(t, text, special, ...)                                                  \
	check_ids(t, text, sizeof(text) - 1, special, IDS(__VA_ARGS__), N_IDS(__VA_ARGS__))

/*
 * Run llama.cpp's .inp/.out pairs (its tests/test-tokenizer-0.cpp format:
 * cases split by "\n__ggml_vocab_test__\n", one line of ids per case,
 * tokenized with add_special = false, parse_special = false).
 */
static void run_vectors(const char *name)
{
	const char *gguf = vocab_path(name);
	const char *sep = "\n__ggml_vocab_test__\n";
	char path[600];
	size_t n_inp, n_out;
	char *inp, *out, *p, *q;
	struct hyb_tokenizer *t = load_path(gguf);
	int cases = 0;
	static int32_t want[4096], got[4096];

	snprintf(path, sizeof(path), "%s.inp", gguf);
	inp = slurp(path, &n_inp);
	snprintf(path, sizeof(path), "%s.out", gguf);
	out = slurp(path, &n_out);
	p = inp;
	q = out;
	while (p < inp + n_inp) {
		char *end = strstr(p, sep), *line_end = strchr(q, '\n'), *s;
		size_t len = end ? (size_t)(end - p) : strlen(p);
		int n_want = 0, n;

		CHECK_MSG(line_end, "%s.out has fewer cases than .inp", name);
		*line_end = '\0';
		for (s = q; *s;) {
			char *e;
			long v = strtol(s, &e, 10);

			if (e == s)
				break;
			CHECK(n_want < 4096);
			want[n_want++] = (int32_t)v;
			s = e;
		}
		n = hyb_tokenize(t, p, len, false, got, 4096);
		if (n != n_want || memcmp(got, want, (size_t)n * sizeof(*got))) {
			print_ids("want", want, n_want);
			print_ids("got ", got, n < 4096 ? n : 4096);
			CHECK_MSG(0, "%s case %d differs: '%.*s'", name, cases, (int)len, p);
		}
		cases++;
		q = line_end + 1;
		p = end ? end + strlen(sep) : inp + n_inp;
	}
	CHECK_MSG(q >= out + n_out, "%s.out has more cases than .inp", name);
	CHECK(cases >= 40);
	fprintf(stderr, "    %s: %d cases match llama.cpp\n", name, cases);
	free(inp);
	free(out);
	hyb_tokenizer_free(t);
}

TEST(tok_vectors_llama_spm)
{
	run_vectors("llama-spm");
}

TEST(tok_vectors_gpt2)
{
	run_vectors("gpt-2");
}

TEST(tok_vectors_llama_bpe)
{
	run_vectors("llama-bpe");
}

/*
 * Ids below were produced by llama.cpp's llama-tokenize (--no-parse-special,
 * with and without --no-bos) on this model; they agree with llama.cpp's
 * test-tokenizer-0 vectors for the same LLaMA vocabulary.
 */
TEST(tok_tiny_llama_ids)
{
	struct hyb_tokenizer *t = load_tiny();

	CHECK_EQ_INT(hyb_tokenizer_kind(t), HYB_TOK_SPM);
	CHECK_EQ_INT(hyb_tokenizer_n_vocab(t), 32000);
	CHECK_EQ_INT(hyb_tokenizer_bos(t), 1);
	CHECK_EQ_INT(hyb_tokenizer_eos(t), 2);
	CHECK(hyb_tokenizer_add_bos(t));
	CHECK(hyb_tokenizer_is_eog(t, 2));
	CHECK(!hyb_tokenizer_is_eog(t, 1));
	CHECK(!hyb_tokenizer_is_eog(t, 15043));
	CHECK(!hyb_tokenizer_is_eog(t, -1));
	CHECK(!hyb_tokenizer_is_eog(t, 32000));

	EXPECT(t, "Hello world", false, 15043, 3186);
	EXPECT(t, "Hello world", true, 1, 15043, 3186);
	EXPECT(t, " Hello world", false, 29871, 15043, 3186);
	EXPECT(t, "Hello, world!", true, 1, 15043, 29892, 3186, 29991);
	EXPECT(t, "\n", false, 29871, 13);
	EXPECT(t, "   Hello", false, 1678, 15043);
	EXPECT(t, " this is \xf0\x9f\xa6\x99.cpp", false, 29871, 445, 338, 29871, 243, 162, 169,
	       156, 29889, 8223);
	EXPECT(t, "3333", false, 29871, 29941, 29941, 29941, 29941);
	EXPECT(t, "\xc3\x84pfel", false, 11585, 7810, 295);
	EXPECT(t, "w048 7tuijk dsdfhu", false, 281, 29900, 29946, 29947, 29871, 29955, 9161,
	       13535, 18031, 2176, 6905);
	/* Control-token text is plain text when special tokens are not parsed. */
	EXPECT(t, "<s>", false, 529, 29879, 29958);
	check_ids(t, "", 0, false, NULL, 0);
	EXPECT(t, "", true, 1);
	EXPECT(t, "bad\xff\xfe!bytes\xc3x\xe2\x82y end\x80", false, 4319, 258, 257, 36, 101,
	       29891, 2167, 198, 123, 229, 133, 124, 1095, 131);
	hyb_tokenizer_free(t);
}

TEST(tok_tiny_llama_pieces)
{
	struct hyb_tokenizer *t = load_tiny();
	char buf[64];
	int32_t ids[] = { 1, 15043, 29892, 3186, 29991, 2 };

	CHECK_EQ_INT(hyb_token_to_piece(t, 15043, buf, sizeof(buf)), 6);
	CHECK(!strcmp(buf, " Hello"));
	CHECK_EQ_INT(hyb_token_to_piece(t, 29871, buf, sizeof(buf)), 1);
	CHECK(!strcmp(buf, " "));
	CHECK_EQ_INT(hyb_token_to_piece(t, 13, buf, sizeof(buf)), 1); /* <0x0A> */
	CHECK_EQ_INT(buf[0], '\n');
	CHECK_EQ_INT(hyb_token_to_piece(t, 243, buf, sizeof(buf)), 1); /* <0xF0> */
	CHECK_EQ_INT((unsigned char)buf[0], 0xf0);
	CHECK_EQ_INT(hyb_token_to_piece(t, 1, buf, sizeof(buf)), 0);  /* control */
	CHECK_EQ_INT(hyb_token_to_piece(t, 2, buf, sizeof(buf)), 0);
	CHECK_EQ_INT(hyb_token_to_piece(t, 0, buf, sizeof(buf)), 0);  /* unknown */
	/* truncation: the first cap bytes */
	CHECK_EQ_INT(hyb_token_to_piece(t, 15043, buf, 3), 3);
	CHECK(!memcmp(buf, " He", 3));
	/* llama_detokenize keeps the space after a BOS; without BOS it drops it */
	CHECK_EQ_INT(hyb_detokenize(t, ids, 6, buf, sizeof(buf)), 14);
	CHECK(!strcmp(buf, " Hello, world!"));
	CHECK_EQ_INT(hyb_detokenize(t, ids + 1, 4, buf, sizeof(buf)), 13);
	CHECK(!strcmp(buf, "Hello, world!"));
	CHECK_EQ_INT(hyb_detokenize(t, ids, 0, buf, sizeof(buf)), 0);
	CHECK_EQ_INT(hyb_detokenize(t, ids + 1, 4, buf, 5), 13);
	CHECK(!memcmp(buf, "Hello", 5));
	hyb_tokenizer_free(t);
}

static void roundtrip(const struct hyb_tokenizer *t, const char *text)
{
	static int32_t ids[4096];
	static char back[16384];
	size_t len = strlen(text);
	int n = hyb_tokenize(t, text, len, false, ids, 4096), m;

	CHECK(n >= 0 && n <= 4096);
	m = hyb_detokenize(t, ids, n, back, sizeof(back));
	CHECK_MSG(m == (int)len && !memcmp(back, text, len), "round trip '%s' -> '%.*s'", text,
		  m > 0 ? m : 0, back);
}

static const char *const round_texts[] = {
	"Hello world",
	" leading space and trailing  ",
	"tabs\tand\nnew\n\nlines\r\n",
	"\xd0\xbd\xd0\xb5\xd1\x89\xd0\xbe \xe2\x82\xac 42 \xe4\xb8\xad\xe6\x96\x87 "
	"\xf0\x9f\xa6\x99\xf0\x9f\x9a\x80",
	"code: for (int i = 0; i < n; i++) { x[i] = y[i]*2; }",
	"   ",
	"a",
	"\xe1\x9e\x80\xe1\x9e\xb6\xe1\x9e\x93\xe1\x9f\x8b",
};

#define N_TEXTS (sizeof(round_texts) / sizeof(round_texts[0]))

TEST(tok_roundtrip_spm)
{
	struct hyb_tokenizer *t = load_tiny();

	for (size_t i = 0; i < N_TEXTS; i++)
		roundtrip(t, round_texts[i]);
	/*
	 * SPM keeps invalid UTF-8 exactly, through byte tokens. (A stray lead
	 * byte swallows the bytes after it, as in llama.cpp, so one before a
	 * space would turn that space's U+2581 into literal bytes.)
	 */
	roundtrip(t, "bad\xff\xfe!bytes\xc3x\xe2\x82y end\x80");
	hyb_tokenizer_free(t);
}

TEST(tok_roundtrip_bpe)
{
	const char *names[] = { "gpt-2", "llama-bpe" };

	for (int k = 0; k < 2; k++) {
		struct hyb_tokenizer *t = load_path(vocab_path(names[k]));

		CHECK_EQ_INT(hyb_tokenizer_kind(t), HYB_TOK_BPE);
		for (size_t i = 0; i < N_TEXTS; i++)
			roundtrip(t, round_texts[i]);
		hyb_tokenizer_free(t);
		hyb_gguf_close(open_file);
	}
}

TEST(tok_bpe_specials_and_bytes)
{
	struct hyb_tokenizer *t = load_path(vocab_path("llama-bpe"));
	char buf[16], seen[256] = { 0 };
	int32_t ids[8];

	/* llama-bpe: BOS 128000 added by default, EOS 128001, <|eot_id|> ends generation */
	CHECK(hyb_tokenizer_add_bos(t));
	CHECK_EQ_INT(hyb_tokenizer_bos(t), 128000);
	CHECK_EQ_INT(hyb_tokenizer_eos(t), 128001);
	CHECK(hyb_tokenizer_is_eog(t, 128001));
	CHECK(hyb_tokenizer_is_eog(t, 128009));
	CHECK(!hyb_tokenizer_is_eog(t, 128000));
	/* produced by llama.cpp's test-tokenizer-0 vectors: "Hello world" = 9906 1917 */
	EXPECT(t, "Hello world", true, 128000, 9906, 1917);
	CHECK_EQ_INT(hyb_token_to_piece(t, 128000, buf, sizeof(buf)), 0);
	hyb_tokenizer_free(t);
	hyb_gguf_close(open_file);

	/* gpt-2: ids 0..255 are the 256 single bytes, each decoding to one distinct byte */
	t = load_path(vocab_path("gpt-2"));
	CHECK(!hyb_tokenizer_add_bos(t));
	CHECK(hyb_tokenizer_is_eog(t, 50256));
	for (int id = 0; id < 256; id++) {
		CHECK_EQ_INT(hyb_token_to_piece(t, id, buf, sizeof(buf)), 1);
		seen[(unsigned char)buf[0]] = 1;
	}
	CHECK(memchr(seen, 0, 256) == NULL);
	/* invalid UTF-8 is read as U+FFFD, as llama.cpp does */
	int n1 = hyb_tokenize(t, "\xff", 1, false, ids, 8);
	int32_t ids2[8];
	int n2 = hyb_tokenize(t, "\xef\xbf\xbd", 3, false, ids2, 8);

	CHECK(n1 > 0 && n1 == n2 && !memcmp(ids, ids2, (size_t)n1 * sizeof(*ids)));
	/* <|endoftext|> is a control token: plain text when special tokens are not parsed */
	CHECK(hyb_tokenize(t, "<|endoftext|>", 13, false, ids, 8) > 1);
	hyb_tokenizer_free(t);
}

/* ---- hand-made vocabularies ---- */

static struct hyb_gguf_str S(const char *s)
{
	return (struct hyb_gguf_str){ strlen(s), s };
}

TEST(tok_spm_merge_order)
{
	/* "▁" "a" "b" "ab" "ba" "<0x41>" ... */
	struct hyb_gguf_str toks[] = { S("<unk>"), S("<s>"), S("</s>"), S("\xe2\x96\x81"), S("a"),
				   S("b"), S("ab"), S("ba"), S("<0x78>"), S("<0xC3>") };
	float scores[] = { 0, 0, 0, -1, -2, -2, -5, -5, 0, 0 };
	int32_t types[] = { 2, 3, 3, 1, 1, 1, 1, 1, 6, 6 };
	struct hyb_tok_desc d;
	struct hyb_tokenizer *t;
	char err[128];
	char buf[8];

	hyb_tok_desc_init(&d);
	d.model = "llama";
	d.n_tokens = 10;
	d.tokens = toks;
	d.scores = scores;
	d.types = types;
	t = hyb_tokenizer_from_desc(&d, err, sizeof(err));
	CHECK_MSG(t, "%s", err);
	/* equal scores: the leftmost pair merges first */
	EXPECT(t, "aba", false, 3, 6, 4);
	EXPECT(t, "bab", false, 3, 7, 5);
	hyb_tokenizer_free(t);

	scores[7] = -4; /* now "ba" beats "ab" */
	t = hyb_tokenizer_from_desc(&d, err, sizeof(err));
	CHECK(t);
	EXPECT(t, "aba", false, 3, 4, 7);
	/* byte fallback; a byte without a <0xXX> token becomes <unk> */
	EXPECT(t, "x\xc3", false, 3, 8, 9);
	EXPECT(t, "y", false, 3, 0);
	CHECK_EQ_INT(hyb_token_to_piece(t, 8, buf, sizeof(buf)), 1);
	CHECK_EQ_INT(buf[0], 'x');
	hyb_tokenizer_free(t);

	/* add_space_prefix = false, add_bos = false, add_eos = true */
	d.add_space_prefix = 0;
	d.add_bos = 0;
	d.add_eos = 1;
	t = hyb_tokenizer_from_desc(&d, err, sizeof(err));
	CHECK(t);
	EXPECT(t, "ab", true, 6, 2);
	hyb_tokenizer_free(t);
}

TEST(tok_spm_segmenting_is_exact)
{
	/* Encoding in independent segments must equal one pass over the text. */
	struct hyb_tokenizer *t = load_tiny();
	static char text[60000];
	static int32_t a[60000], b[60000];
	size_t n = 0;
	int na, nb;
	struct tok_pair *pairs;

	while (n + 200 < sizeof(text)) {
		for (size_t i = 0; i < N_TEXTS; i++) {
			size_t l = strlen(round_texts[i]);

			if (n + l >= sizeof(text))
				break;
			memcpy(text + n, round_texts[i], l);
			n += l;
		}
	}
	na = hyb_tokenize(t, text, n, true, a, 60000);
	pairs = t->pairs;
	t->pairs = NULL;
	nb = hyb_tokenize(t, text, n, true, b, 60000);
	t->pairs = pairs;
	CHECK(na > 1000);
	CHECK_EQ_INT(na, nb);
	CHECK(!memcmp(a, b, (size_t)na * sizeof(*a)));
	hyb_tokenizer_free(t);
}

/* A small byte-level BPE vocabulary: the 256 byte characters, then extras. */
static struct hyb_tokenizer *tiny_bpe(const char *pre, const char *const *extra, int n_extra,
				      const int32_t *extra_types, const char *const *merges,
				      int n_merges)
{
	static char bytes[256][4];
	static struct hyb_gguf_str toks[300], mg[16];
	static int32_t types[300];
	struct hyb_tok_desc d;
	char err[128];
	struct hyb_tokenizer *t;
	int n = 0;
	uint32_t next = 256;

	/* token b is byte b's GPT-2 character */
	for (int b = 0; b < 256; b++) {
		bool self = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
		int len = hyb_tok_utf8_encode(self ? (uint32_t)b : next++, bytes[b]);

		toks[n] = (struct hyb_gguf_str){ (uint64_t)len, bytes[b] };
		types[n++] = TOK_TYPE_NORMAL;
	}
	for (int i = 0; i < n_extra; i++) {
		toks[n] = S(extra[i]);
		types[n++] = extra_types ? extra_types[i] : TOK_TYPE_NORMAL;
	}
	for (int i = 0; i < n_merges; i++)
		mg[i] = S(merges[i]);
	hyb_tok_desc_init(&d);
	d.model = "gpt2";
	d.pre = pre;
	d.n_tokens = (uint32_t)n;
	d.tokens = toks;
	d.types = types;
	d.n_merges = (uint64_t)n_merges;
	d.merges = mg;
	t = hyb_tokenizer_from_desc(&d, err, sizeof(err));
	CHECK_MSG(t, "%s", err);
	return t;
}

TEST(tok_bpe_merge_ranks)
{
	const char *extra[] = { "ab", "bc", "abc" };
	const char *m1[] = { "b c", "a b", "a bc" };
	const char *m2[] = { "a b", "b c", "ab c" };
	const char *m3[] = { "b c", "a b" };
	struct hyb_tokenizer *t;

	/* ids: bytes 0..255, then "ab" 256, "bc" 257, "abc" 258 */
	t = tiny_bpe("gpt-2", extra, 3, NULL, m1, 3);
	EXPECT(t, "abc", false, 258);
	EXPECT(t, "abcab", false, 258, 256);
	hyb_tokenizer_free(t);
	t = tiny_bpe("gpt-2", extra, 3, NULL, m2, 3);
	EXPECT(t, "abc", false, 258);
	hyb_tokenizer_free(t);
	t = tiny_bpe("gpt-2", extra, 3, NULL, m3, 2);
	/* "b c" ranks first; "a bc" is no merge: a + bc */
	EXPECT(t, "abc", false, 'a', 257);
	hyb_tokenizer_free(t);
}

TEST(tok_bpe_user_defined_split)
{
	const char *extra[] = { "<tag>", "<ctl>" };
	const int32_t types[] = { TOK_TYPE_USER_DEFINED, TOK_TYPE_CONTROL };
	struct hyb_tokenizer *t = tiny_bpe("gpt-2", extra, 2, types, NULL, 0);
	int32_t ids[32];
	int n;
	char buf[16];

	/* user-defined tokens are split out of the text; control tokens are not */
	EXPECT(t, "x<tag>y", false, 'x', 256, 'y');
	n = hyb_tokenize(t, "<ctl>", 5, false, ids, 32);
	CHECK_EQ_INT(n, 5);
	CHECK_EQ_INT(hyb_token_to_piece(t, 256, buf, sizeof(buf)), 5);
	CHECK(!strcmp(buf, "<tag>"));
	CHECK_EQ_INT(hyb_token_to_piece(t, 257, buf, sizeof(buf)), 0);
	hyb_tokenizer_free(t);
	/* an unknown pre-tokenizer falls back to the default regexes with a warning */
	t = tiny_bpe("no-such-pre", extra, 2, types, NULL, 0);
	CHECK_EQ_INT(t->pre, TOK_PRE_DEFAULT);
	hyb_tokenizer_free(t);
}

/* ---- pre-tokenizer splits ---- */

static void check_split(enum tok_pre pre, const char *text, const char *const *want, int n_want)
{
	uint32_t cpts[256];
	size_t n = hyb_tok_utf8_decode(text, strlen(text), cpts), *lens, n_words, at = 0;
	char word[256];

	CHECK(hyb_tok_pretok_split(pre, cpts, n, &lens, &n_words) == 0);
	CHECK_MSG((int)n_words == n_want, "'%s': %zu words, want %d", text, n_words, n_want);
	for (size_t i = 0; i < n_words; i++) {
		size_t wl = 0;

		for (size_t k = 0; k < lens[i]; k++)
			wl += (size_t)hyb_tok_utf8_encode(cpts[at + k], word + wl);
		word[wl] = '\0';
		at += lens[i];
		CHECK_MSG(!strcmp(word, want[i]), "'%s' word %zu: '%s', want '%s'", text, i, word,
			  want[i]);
	}
	free(lens);
}

#define SPLIT(pre, text, ...)                                                           \
	check_split(pre, text, (const char *const[]){ __VA_ARGS__ },                     \
		    (int)(sizeof((const char *const[]){ __VA_ARGS__ }) / sizeof(char *)))

TEST(tok_pretok_splits)
{
	SPLIT(TOK_PRE_GPT2, "Hello world's  test", "Hello", " world", "'s", " ", " test");
	SPLIT(TOK_PRE_GPT2, "a1 22!! \xc3\xa9t\xc3\xa9", "a", "1", " 22", "!!",
	      " \xc3\xa9t\xc3\xa9");
	SPLIT(TOK_PRE_LLAMA3, "abc 12345\n\n x", "abc", " ", "123", "45", "\n\n", " x");
	SPLIT(TOK_PRE_LLAMA3, "I'LL go...\n", "I", "'LL", " go", "...\n");
	SPLIT(TOK_PRE_QWEN2, "x123", "x", "1", "2", "3");
	SPLIT(TOK_PRE_DEFAULT, "a,b 1234", "a", ",", "b", " ", "123", "4");
	SPLIT(TOK_PRE_STARCODER, "v12 z", "v", "1", "2", " z");
}

/* ---- bad input ---- */

TEST(tok_bad_input)
{
	struct hyb_tokenizer *t = load_tiny();
	int32_t ids[8], bad[] = { 1, 32000 };
	char buf[8];

	CHECK_EQ_INT(hyb_tokenize(t, NULL, 3, false, ids, 8), -EINVAL);
	CHECK_EQ_INT(hyb_tokenize(t, "abc", 3, false, ids, -1), -EINVAL);
	CHECK_EQ_INT(hyb_tokenize(t, "abc", 3, false, NULL, 8), -EINVAL);
	CHECK_EQ_INT(hyb_tokenize(NULL, "abc", 3, false, ids, 8), -EINVAL);
	CHECK_EQ_INT(hyb_tokenize(t, NULL, 0, true, ids, 8), 1);
	/* counting only, and a short output buffer */
	CHECK_EQ_INT(hyb_tokenize(t, "Hello world", 11, true, NULL, 0), 3);
	ids[1] = -7;
	CHECK_EQ_INT(hyb_tokenize(t, "Hello world", 11, true, ids, 1), 3);
	CHECK_EQ_INT(ids[0], 1);
	CHECK_EQ_INT(ids[1], -7);
	CHECK_EQ_INT(hyb_token_to_piece(t, -1, buf, 8), -EINVAL);
	CHECK_EQ_INT(hyb_token_to_piece(t, 32000, buf, 8), -EINVAL);
	CHECK_MSG(strstr(hyb_last_error(), "token id 32000 is outside 0..31999"), "%s",
		  hyb_last_error());
	CHECK_EQ_INT(hyb_token_to_piece(t, 5, buf, -1), -EINVAL);
	CHECK_EQ_INT(hyb_detokenize(t, bad, 2, buf, 8), -EINVAL);
	CHECK_MSG(strstr(hyb_last_error(), "id 32000 (position 1)"), "%s", hyb_last_error());
	/* invalid UTF-8 goes through byte tokens (U+2581, then <0xFF>) */
	EXPECT(t, "\xff", false, 29871, 258);
	EXPECT(t, "\xe2\x82", false, 29871, 229, 133);
	hyb_tokenizer_free(t);
}

TEST(tok_bad_metadata)
{
	struct hyb_gguf_str toks[] = { S("a"), S("b") };
	float scores[] = { 0, 0 };
	struct hyb_tok_desc d;
	char err[160] = "";

	hyb_tok_desc_init(&d);
	d.tokens = toks;
	d.n_tokens = 2;
	d.model = "bert";
	CHECK(!hyb_tokenizer_from_desc(&d, err, sizeof(err)));
	CHECK_MSG(strstr(err, "bert"), "%s", err);
	d.model = "gpt2";
	CHECK(!hyb_tokenizer_from_desc(&d, err, sizeof(err)));
	CHECK_MSG(strstr(err, "merges"), "%s", err);
	d.model = "llama";
	d.n_tokens = 0;
	CHECK(!hyb_tokenizer_from_desc(&d, err, sizeof(err)));
	d.n_tokens = 2;
	d.scores = scores;
	CHECK(hyb_tokenizer_from_desc(&d, err, sizeof(err)) != NULL);
	/* out-of-range special ids fall back to the defaults (which are disabled here) */
	d.special[TOK_SP_BOS] = 99;
	struct hyb_tokenizer *t = hyb_tokenizer_from_desc(&d, err, sizeof(err));

	CHECK(t);
	CHECK_EQ_INT(hyb_tokenizer_bos(t), 1);
	CHECK_EQ_INT(hyb_tokenizer_eos(t), -1);
	hyb_tokenizer_free(t);
}

TEST(tok_gguf_errors)
{
	char path[512];
	const char *toks[] = { "a", "b", "c" };
	float scores[] = { 0, 0 };
	struct hyb_gguf_writer *w;
	struct hyb_gguf_file *f;

	snprintf(path, sizeof(path), "%s/v.gguf", hyb_test_tmpdir());
	/* no tokenizer.ggml.model */
	w = hyb_gguf_writer_new();
	hyb_gguf_set_arr_str(w, "tokenizer.ggml.tokens", toks, 3);
	CHECK(hyb_gguf_writer_write_file(w, path) == 0);
	hyb_gguf_writer_free(w);
	CHECK(hyb_gguf_open(path, &f) == 0);
	CHECK(!hyb_tokenizer_load(f));
	CHECK_MSG(strstr(hyb_last_error(), "tokenizer.ggml.model"), "%s", hyb_last_error());
	hyb_gguf_close(f);
	/* scores shorter than the vocabulary */
	w = hyb_gguf_writer_new();
	hyb_gguf_set_str(w, "tokenizer.ggml.model", "llama");
	hyb_gguf_set_arr_str(w, "tokenizer.ggml.tokens", toks, 3);
	hyb_gguf_set_arr(w, "tokenizer.ggml.scores", HYB_GGUF_VT_FLOAT32, scores, 2);
	CHECK(hyb_gguf_writer_write_file(w, path) == 0);
	hyb_gguf_writer_free(w);
	CHECK(hyb_gguf_open(path, &f) == 0);
	CHECK(!hyb_tokenizer_load(f));
	CHECK_MSG(strstr(hyb_last_error(), "scores"), "%s", hyb_last_error());
	hyb_gguf_close(f);
	/* tokens not an array */
	w = hyb_gguf_writer_new();
	hyb_gguf_set_str(w, "tokenizer.ggml.model", "llama");
	hyb_gguf_set_str(w, "tokenizer.ggml.tokens", "abc");
	CHECK(hyb_gguf_writer_write_file(w, path) == 0);
	hyb_gguf_writer_free(w);
	CHECK(hyb_gguf_open(path, &f) == 0);
	CHECK(!hyb_tokenizer_load(f));
	CHECK_MSG(strstr(hyb_last_error(), "tokenizer.ggml.tokens"), "%s", hyb_last_error());
	hyb_gguf_close(f);
	/* a good minimal one: add_bos_token false is honoured */
	w = hyb_gguf_writer_new();
	hyb_gguf_set_str(w, "tokenizer.ggml.model", "llama");
	hyb_gguf_set_arr_str(w, "tokenizer.ggml.tokens", toks, 3);
	hyb_gguf_set_bool(w, "tokenizer.ggml.add_bos_token", false);
	hyb_gguf_set_u32(w, "tokenizer.ggml.eos_token_id", 0);
	CHECK(hyb_gguf_writer_write_file(w, path) == 0);
	hyb_gguf_writer_free(w);
	CHECK(hyb_gguf_open(path, &f) == 0);
	struct hyb_tokenizer *t = hyb_tokenizer_load(f);

	CHECK_MSG(t, "%s", hyb_last_error());
	CHECK(!hyb_tokenizer_add_bos(t));
	CHECK_EQ_INT(hyb_tokenizer_eos(t), 0);
	CHECK(hyb_tokenizer_is_eog(t, 0));
	hyb_tokenizer_free(t);
	hyb_gguf_close(f);
}

/* ---- speed ---- */

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void time_1mb(struct hyb_tokenizer *t, const char *name)
{
	size_t n = 0, cap = 1 << 20;
	char *text = malloc(cap);
	int32_t *ids = malloc(cap * sizeof(*ids));
	double t0, dt;
	int k;

	CHECK(text && ids);
	while (n < cap) {
		for (size_t i = 0; i < N_TEXTS && n < cap; i++) {
			size_t l = strlen(round_texts[i]);

			if (l > cap - n)
				l = cap - n;
			memcpy(text + n, round_texts[i], l);
			n += l;
		}
	}
	t0 = now();
	k = hyb_tokenize(t, text, n, true, ids, (int)cap);
	dt = now() - t0;
	fprintf(stderr, "    %s: 1 MiB -> %d tokens in %.3f s\n", name, k, dt);
	CHECK(k > 100000);
	CHECK_MSG(dt < 1.0, "%s: 1 MiB took %.2f s", name, dt);
	free(text);
	free(ids);
}

TEST(tok_speed_1mb)
{
	struct hyb_tokenizer *t = load_tiny();

	time_1mb(t, "llama spm");
	hyb_tokenizer_free(t);
	hyb_gguf_close(open_file);
	t = load_path(vocab_path("llama-bpe"));
	time_1mb(t, "llama-bpe");
	hyb_tokenizer_free(t);
	hyb_gguf_close(open_file);
	t = load_path(vocab_path("gpt-2"));
	time_1mb(t, "gpt-2");
	hyb_tokenizer_free(t);
}
