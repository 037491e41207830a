// SPDX-License-Identifier: MIT
/* The chat pieces `hyb run --chat` and `hyb chat` share: template, prompt text, tokens. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "hyb/chat.h"
#include "hyb/tokenizer.h"

int cli_chat_template(const struct hyb_model *m, const char *name)
{
	const char *how = "--chat-template";
	int t;

	if (name) {
		t = hyb_chat_template_from_name(name);
		if (t < 0)
			cli_die("--chat-template: %s", hyb_last_error());
	} else {
		t = hyb_chat_template_for_model(m->gguf, m->tok, &how);
		if (t < 0)
			cli_die("%s; or give one with --chat-template NAME", hyb_last_error());
	}
	fprintf(stderr, "hyb: chat template %s (%s)\n", hyb_chat_template_name(t), how);
	return t;
}

char *cli_chat_format(int tmpl, const struct hyb_chat_msg *msgs, size_t n, bool add_assistant)
{
	int len = hyb_chat_format(tmpl, msgs, n, add_assistant, NULL, 0);
	char *text;

	if (len < 0)
		return NULL;
	text = malloc((size_t)len + 1);
	if (!text)
		cli_die("out of memory for a %d-byte prompt", len);
	hyb_chat_format(tmpl, msgs, n, add_assistant, text, len + 1);
	return text;
}

int32_t *cli_tokenize_chat(const struct hyb_model *m, const char *text, bool bos, int *n)
{
	unsigned int flags = HYB_TOKENIZE_PARSE_SPECIAL | (bos ? HYB_TOKENIZE_ADD_SPECIAL : 0);
	size_t len = strlen(text);
	int32_t *ids;
	int got;

	if (!m->tok)
		cli_die("the model has no usable tokenizer (tokenizer.ggml.* metadata)");
	got = hyb_tokenize_flags(m->tok, text, len, flags, NULL, 0);
	if (got < 0)
		cli_die("cannot tokenize the chat prompt: %s", hyb_last_error());
	ids = malloc(sizeof(*ids) * (got ? (size_t)got : 1));
	if (!ids)
		cli_die("out of memory");
	hyb_tokenize_flags(m->tok, text, len, flags, ids, got);
	*n = got;
	return ids;
}
