// SPDX-License-Identifier: MIT
/*
 * Chat templates against llama.cpp: every template formats two fixed
 * conversations byte for byte as llama_chat_apply_template does (by name),
 * real tokenizer.chat_template texts (tests/data/chat/) detect to the
 * template that gives llama.cpp's output for them, and the errors. The
 * expected strings are in chat_expected.h (tests/oracle/chat_oracle.c).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hyb/chat.h"
#include "hyb/gguf.h"
#include "hyb/tokenizer.h"
#include "test.h"

#include "chat_expected.h"

/* The conversations chat_oracle.c formats. */
static const struct hyb_chat_msg conv_a[] = {
	{ "system", "You are a helpful assistant" },
	{ "user", "Hello" },
	{ "assistant", "Hi there" },
	{ "user", "Who are you" },
	{ "assistant", "   I am an assistant   " },
	{ "user", "Another question" },
};
static const struct hyb_chat_msg conv_b[] = {
	{ "user", " What is 2+2?\n" },
	{ "assistant", "4" },
};
/* Edge cases: system texts around other turns, an empty one, two users, other roles. */
static const struct hyb_chat_msg conv_c[] = {
	{ "system", "  S1 " },
	{ "assistant", "A" },
	{ "system", "" },
	{ "system", "S2\n" },
	{ "user", "U" },
	{ "user", " V" },
	{ "tool", "T" },
	{ "system", "" },
	{ "user", "W" },
};

/* The formatted text, allocated (NULL with the error left for the caller). */
static char *fmt(int tmpl, const struct hyb_chat_msg *m, size_t n, bool add_ass)
{
	int len = hyb_chat_format(tmpl, m, n, add_ass, NULL, 0);
	char *buf;

	if (len < 0)
		return NULL;
	buf = malloc((size_t)len + 1);
	CHECK(buf);
	CHECK_EQ_INT(hyb_chat_format(tmpl, m, n, add_ass, buf, len + 1), len);
	CHECK(strlen(buf) == (size_t)len);
	return buf;
}

static void same(const char *what, const char *got, const char *want)
{
	size_t i = 0;

	if (!strcmp(got, want))
		return;
	while (got[i] && got[i] == want[i])
		i++;
	CHECK_MSG(0, "%s differs from llama.cpp at byte %zu:\n  hyb:       \"%.60s\"\n"
		  "  llama.cpp: \"%.60s\"", what, i, got + i, want + i);
}

TEST(chat_templates_match_llama_cpp)
{
	int seen = 0;

	for (size_t i = 0; i < sizeof(chat_cases) / sizeof(chat_cases[0]); i++) {
		const struct chat_case *c = &chat_cases[i];
		int t = hyb_chat_template_from_name(c->name);
		char what[64], *a, *b, *cc;

		CHECK_MSG(t >= 0, "%s: %s", c->name, hyb_last_error());
		CHECK(!strcmp(hyb_chat_template_name(t), c->name));
		a = fmt(t, conv_a, 6, true);
		b = fmt(t, conv_b, 2, false);
		cc = fmt(t, conv_c, sizeof(conv_c) / sizeof(conv_c[0]), true);
		CHECK_MSG(a && b && cc, "%s: %s", c->name, hyb_last_error());
		snprintf(what, sizeof(what), "%s (conversation a)", c->name);
		same(what, a, c->a);
		snprintf(what, sizeof(what), "%s (conversation b)", c->name);
		same(what, b, c->b);
		snprintf(what, sizeof(what), "%s (conversation c)", c->name);
		same(what, cc, c->c);
		/* detecting a name gives the template itself */
		CHECK_EQ_INT(hyb_chat_template_detect(c->name), t);
		free(a);
		free(b);
		free(cc);
		seen++;
	}
	/* every llama.cpp name is here; hyb's one more is dots1 (llama.cpp detects it, names it not) */
	CHECK_EQ_INT(seen, HYB_CHAT_N_TEMPLATES - 1);
	CHECK_EQ_INT(hyb_chat_template_from_name("dots1"), HYB_CHAT_DOTS1);
}

static char *slurp(const char *path)
{
	FILE *f = fopen(path, "rb");
	char *s;
	long n;

	CHECK_MSG(f, "%s missing", path);
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	rewind(f);
	s = malloc((size_t)n + 1);
	CHECK(s && fread(s, 1, (size_t)n, f) == (size_t)n);
	s[n] = 0;
	fclose(f);
	return s;
}

TEST(chat_detects_real_templates)
{
	for (size_t i = 0; i < sizeof(chat_detect_cases) / sizeof(chat_detect_cases[0]); i++) {
		const struct chat_detect_case *c = &chat_detect_cases[i];
		char path[256], *text, *a;
		int t;

		snprintf(path, sizeof(path), "tests/data/chat/%s", c->file);
		text = slurp(path);
		t = hyb_chat_template_detect(text);
		if (!c->a) {
			/* llama.cpp knows it not either: a clear error naming the choices */
			CHECK_MSG(t == -ENOENT, "%s: detected as %s, llama.cpp knows it not",
				  c->file, hyb_chat_template_name(t));
			CHECK(strstr(hyb_last_error(), "chatml, llama2"));
			free(text);
			continue;
		}
		CHECK_MSG(t >= 0, "%s: %s", c->file, hyb_last_error());
		a = fmt(t, conv_a, 6, true);
		CHECK(a);
		same(c->file, a, c->a);
		free(a);
		free(text);
	}
}

TEST(chat_detects_by_name_and_markers)
{
	static const struct {
		const char *text;
		int want;
	} cases[] = {
		{ "{{ '<|im_start|>' + role }}", HYB_CHAT_CHATML },
		{ "<|im_start|><|im_sep|>", HYB_CHAT_PHI4 },
		{ "<start_of_turn>user", HYB_CHAT_GEMMA },
		{ "mistral-whatever", HYB_CHAT_LLAMA2 },
		{ "[INST] <<SYS>>", HYB_CHAT_LLAMA2_SYS },
		{ "<|start_header_id|>x<|end_header_id|>", HYB_CHAT_LLAMA3 },
		{ "<|assistant|><|end|>", HYB_CHAT_PHI3 },
		{ "<|user|><|endoftext|>", HYB_CHAT_ZEPHYR },
		{ "<|user|><|assistant|></s>", HYB_CHAT_FALCON3 },
		{ "<|endofuserprompt|>", HYB_CHAT_DOTS1 },
		{ "<用户>", HYB_CHAT_MINICPM },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		CHECK_MSG(hyb_chat_template_detect(cases[i].text) == cases[i].want,
			  "\"%s\": %d, want %s", cases[i].text,
			  hyb_chat_template_detect(cases[i].text),
			  hyb_chat_template_name(cases[i].want));
}

TEST(chat_errors)
{
	const struct hyb_chat_msg bad_utf8[] = { { "user", "ok \xc3\x28 no" } };
	const struct hyb_chat_msg no_content[] = { { "user", NULL } };
	const struct hyb_chat_msg overlong[] = { { "user", "\xc0\xaf" } };
	const struct hyb_chat_msg surrogate[] = { { "user", "\xed\xa0\x80" } };
	char buf[8];

	CHECK_EQ_INT(hyb_chat_template_from_name("nope"), -ENOENT);
	CHECK(strstr(hyb_last_error(), "'nope'") && strstr(hyb_last_error(), "chatml") &&
	      strstr(hyb_last_error(), "gemma"));
	CHECK_EQ_INT(hyb_chat_template_from_name(NULL), -EINVAL);
	CHECK_EQ_INT(hyb_chat_template_detect("{{ messages }}\n{% for m in x %}"), -ENOENT);
	CHECK(strstr(hyb_last_error(), "\"{{ messages }}...\"") &&
	      strstr(hyb_last_error(), "llama3"));
	CHECK_EQ_INT(hyb_chat_template_detect(NULL), -EINVAL);
	CHECK(hyb_chat_template_name(-1) == NULL);
	CHECK(hyb_chat_template_name(HYB_CHAT_N_TEMPLATES) == NULL);
	CHECK_EQ_INT(hyb_chat_format(HYB_CHAT_N_TEMPLATES, conv_a, 1, true, buf, 8), -EINVAL);
	CHECK_EQ_INT(hyb_chat_format(HYB_CHAT_CHATML, bad_utf8, 1, true, buf, 8), -EILSEQ);
	CHECK(strstr(hyb_last_error(), "byte 3"));
	CHECK_EQ_INT(hyb_chat_format(HYB_CHAT_CHATML, overlong, 1, true, buf, 8), -EILSEQ);
	CHECK_EQ_INT(hyb_chat_format(HYB_CHAT_CHATML, surrogate, 1, true, buf, 8), -EILSEQ);
	CHECK_EQ_INT(hyb_chat_format(HYB_CHAT_CHATML, no_content, 1, true, buf, 8), -EINVAL);
	CHECK_EQ_INT(hyb_chat_format(HYB_CHAT_CHATML, NULL, 1, true, buf, 8), -EINVAL);
	/* a short buffer: truncated, NUL-terminated, the full length returned */
	CHECK_EQ_INT(hyb_chat_format(HYB_CHAT_CHATML, conv_b, 1, false, buf, 8), 42);
	CHECK(!memcmp(buf, "<|im_sta", 8));
	CHECK_EQ_INT(hyb_chat_format(HYB_CHAT_CHATML, NULL, 0, true, buf, 8), 22);
}

/* A GGUF with only the keys hyb_chat_template_for_model reads. */
static const char *write_meta(const char *name, const char *tmpl, const char *pre,
			      uint32_t layers)
{
	static char path[512];
	struct hyb_gguf_writer *w;

	snprintf(path, sizeof(path), "%s/%s.gguf", hyb_test_tmpdir(), name);
	w = hyb_gguf_writer_new();
	CHECK(w);
	hyb_gguf_set_str(w, "general.architecture", "llama");
	hyb_gguf_set_u32(w, "llama.block_count", layers);
	if (tmpl)
		hyb_gguf_set_str(w, "tokenizer.chat_template", tmpl);
	if (pre)
		hyb_gguf_set_str(w, "tokenizer.ggml.pre", pre);
	CHECK_MSG(hyb_gguf_writer_write_file(w, path) == 0, "%s", hyb_last_error());
	hyb_gguf_writer_free(w);
	return path;
}

static int for_model(const char *path, const struct hyb_tokenizer *t, const char **how)
{
	struct hyb_gguf_file *f;
	int r;

	CHECK_MSG(hyb_gguf_open(path, &f) == 0, "%s", hyb_last_error());
	r = hyb_chat_template_for_model(f, t, how);
	hyb_gguf_close(f);
	return r;
}

TEST(chat_template_for_model)
{
	const char *how, *gemma;
	struct hyb_gguf_file *gf;
	struct hyb_tokenizer *gt;

	CHECK_EQ_INT(for_model(write_meta("a", "{{ '<|im_start|>' }}", NULL, 2), NULL, &how),
		     HYB_CHAT_CHATML);
	CHECK(!strcmp(how, "tokenizer.chat_template"));
	CHECK_EQ_INT(for_model(write_meta("b", "{{ unknown }}", NULL, 2), NULL, &how), -ENOENT);
	CHECK(strstr(hyb_last_error(), "tokenizer.chat_template") &&
	      strstr(hyb_last_error(), "chatml"));
	/* llama.cpp's fix-up for Mistral-Small-2503 */
	CHECK_EQ_INT(for_model(write_meta("c", NULL, "tekken", 40), NULL, &how),
		     HYB_CHAT_MISTRAL_V7_TEKKEN);
	CHECK_EQ_INT(for_model(write_meta("d", NULL, "tekken", 30), NULL, &how), HYB_CHAT_CHATML);
	CHECK(strstr(how, "default"));
	CHECK_EQ_INT(hyb_chat_template_for_model(NULL, NULL, NULL), -EINVAL);

	/* Gemma 3 ships without a template: its vocabulary's <start_of_turn> picks gemma */
	gemma = hyb_test_real_model("gemma3");
	CHECK_MSG(hyb_gguf_open(gemma, &gf) == 0, "%s", hyb_last_error());
	gt = hyb_tokenizer_load(gf);
	CHECK(gt);
	CHECK_EQ_INT(hyb_chat_template_for_model(gf, gt, &how), HYB_CHAT_GEMMA);
	CHECK(strstr(how, "<start_of_turn>"));
	hyb_tokenizer_free(gt);
	hyb_gguf_close(gf);
}
