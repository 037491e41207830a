// SPDX-License-Identifier: MIT
/*
 * hyb chat: a conversation on stdin (a terminal or a pipe), replies streamed
 * to stdout. The KV cache keeps the conversation: each turn evaluates only
 * the text the template adds after what the cache already holds.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "hyb/chat.h"
#include "hyb/clock.h"
#include "hyb/tokenizer.h"

static const char usage[] =
	"usage: hyb chat -m MODEL [-n MAX_REPLY] [-c CTX] [-t THREADS] [--chat-template NAME]\n"
	"                [--system TEXT] [--temp T] [--top-k K] [--top-p P] [--min-p P]\n"
	"                [--repeat-penalty R] [--repeat-last-n N] [--seed S]\n"
	"  Reads a user message per line from stdin and streams each reply to stdout.\n"
	"  The model's chat template (tokenizer.chat_template) formats the conversation;\n"
	"  --chat-template NAME overrides it (a wrong name lists the choices). A reply ends\n"
	"  at the model's end of turn, after -n tokens (default: no limit), or on Ctrl-C.\n"
	"  Lines: /reset forgets the conversation (and its cache), /exit or end of input\n"
	"  quits; Ctrl-C at the prompt quits too.\n";

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig)
{
	(void)sig;
	interrupted = 1;
}

struct chat {
	struct hyb_model *m;
	struct hyb_sampler_params sp;
	struct hyb_ctx *c;
	struct hyb_sampler *s;
	int tmpl;
	int n_predict;          /* < 0: no limit */
	struct hyb_chat_msg *msgs;
	size_t n_msgs, n_system; /* the first n_system messages survive /reset */
	char *cached;           /* the text whose tokens are in the KV cache */
	size_t cached_len;
	float *logits;
};

static void *xrealloc(void *p, size_t n)
{
	p = realloc(p, n ? n : 1);
	if (!p)
		cli_die("out of memory");
	return p;
}

static void push(struct chat *ch, const char *role, const char *content)
{
	ch->msgs = xrealloc(ch->msgs, (ch->n_msgs + 1) * sizeof(*ch->msgs));
	ch->msgs[ch->n_msgs].role = role;
	ch->msgs[ch->n_msgs].content = strdup(content);
	if (!ch->msgs[ch->n_msgs].content)
		cli_die("out of memory");
	ch->n_msgs++;
}

static void pop(struct chat *ch)
{
	free((char *)ch->msgs[--ch->n_msgs].content);
}

/* Empty the KV cache, and the sampler's repetition window with it. */
static void forget_cache(struct chat *ch)
{
	hyb_ctx_reset(ch->c);
	ch->cached_len = 0;
	hyb_sampler_free(ch->s);
	ch->s = hyb_sampler_new(&ch->sp, (int32_t)ch->m->hp.n_vocab);
	if (!ch->s)
		cli_die("%s", hyb_last_error());
}

static void append_cached(struct chat *ch, const char *s, size_t n)
{
	ch->cached = xrealloc(ch->cached, ch->cached_len + n + 1);
	memcpy(ch->cached + ch->cached_len, s, n);
	ch->cached_len += n;
	ch->cached[ch->cached_len] = 0;
}

/*
 * A reply as message text: bytes that are not valid UTF-8 (a reply cut in
 * the middle of a character, or a model's stray byte tokens) become U+FFFD,
 * so the next turn's template accepts it.
 */
static char *valid_utf8(const char *s, size_t n)
{
	size_t len;
	char *out = cli_utf8_clean(s, n, &len);

	if (!out)
		cli_die("out of memory");
	return out;
}

/* Evaluate tokens in slices so Ctrl-C is seen during a long prompt; -EINTR when it was. */
static int eval_prompt(struct chat *ch, const int32_t *ids, int n)
{
	const int slice = 128;

	for (int i = 0; i < n; i += slice) {
		int k = n - i < slice ? n - i : slice;

		if (interrupted)
			return -EINTR;
		if (hyb_ctx_eval(ch->c, ids + i, (uint32_t)k, ch->logits, false))
			cli_die("%s", hyb_last_error());
	}
	for (int i = 0; i < n; i++)
		hyb_sampler_accept(ch->s, ids[i]);
	return 0;
}

/* The reply to the conversation so far (its last message is the user's). */
static void reply(struct chat *ch)
{
	uint32_t n_ctx = hyb_ctx_n_ctx(ch->c);
	char *prompt = cli_chat_format(ch->tmpl, ch->msgs, ch->n_msgs, true), *text = NULL;
	const char *delta;
	size_t text_len = 0;
	int32_t *ids;
	int n_ids, n_gen = 0;
	double t0;

	if (!prompt) {
		/* invalid UTF-8 in the line: say so, and the conversation goes on without it */
		fprintf(stderr, "hyb: %s; message ignored\n", hyb_last_error());
		pop(ch);
		return;
	}
	/* Only the text after what the cache holds is new. A template that
	 * rewrites earlier turns (trimming a reply, say) starts over. */
	if (ch->cached_len && strncmp(prompt, ch->cached, ch->cached_len))
		forget_cache(ch);
	delta = prompt + ch->cached_len;
	ids = cli_tokenize_chat(ch->m, delta, hyb_ctx_n_past(ch->c) == 0, &n_ids);
	if (hyb_ctx_n_past(ch->c) + (uint32_t)n_ids >= n_ctx) {
		if (hyb_ctx_n_past(ch->c))
			fprintf(stderr, "hyb: the context is full: %u of its %u tokens hold the "
				"conversation and this message needs %d more; /reset to start "
				"over (or a larger -c)\n", hyb_ctx_n_past(ch->c), n_ctx, n_ids);
		else
			fprintf(stderr, "hyb: this message is %d tokens, more than the context of "
				"%u holds with a reply; a shorter one, or a larger -c\n", n_ids, n_ctx);
		pop(ch);
		free(ids);
		free(prompt);
		return;
	}
	t0 = hyb_now();
	if (eval_prompt(ch, ids, n_ids)) {
		/* the cache now ends inside the prompt: forget it, and the message */
		fprintf(stderr, "\nhyb: interrupted; message dropped\n");
		forget_cache(ch);
		pop(ch);
		free(ids);
		free(prompt);
		return;
	}
	append_cached(ch, delta, strlen(delta));
	free(ids);
	free(prompt);

	while (ch->n_predict < 0 || n_gen < ch->n_predict) {
		char piece[256];
		int32_t tok;
		int len;

		if (interrupted) {
			fprintf(stderr, "\nhyb: interrupted\n");
			break;
		}
		tok = hyb_sampler_sample(ch->s, ch->logits);
		if (tok < 0)
			cli_die("%s", hyb_last_error());
		/* the end of turn stays out of the cache: the template writes it next turn */
		if (hyb_tokenizer_is_eog(ch->m->tok, tok))
			break;
		if (hyb_ctx_n_past(ch->c) >= n_ctx) {
			fprintf(stderr, "\nhyb: the context is full (%u tokens): reply cut; /reset "
				"to start over (or a larger -c)\n", n_ctx);
			break;
		}
		len = hyb_token_to_piece(ch->m->tok, tok, piece, sizeof(piece));
		len = len < 0 ? 0 : len < (int)sizeof(piece) ? len : (int)sizeof(piece);
		fwrite(piece, 1, (size_t)len, stdout);
		fflush(stdout);
		text = xrealloc(text, text_len + (size_t)len + 1);
		memcpy(text + text_len, piece, (size_t)len);
		text_len += (size_t)len;
		append_cached(ch, piece, (size_t)len);
		hyb_sampler_accept(ch->s, tok);
		if (hyb_ctx_eval(ch->c, &tok, 1, ch->logits, false))
			cli_die("%s", hyb_last_error());
		n_gen++;
	}
	fputc('\n', stdout);
	fflush(stdout);
	{
		char *content = valid_utf8(text ? text : "", text_len);

		/* The cache keeps the model's own tokens for the reply and the text
		 * says what the template will write, U+FFFD for its stray bytes, so
		 * the next turn still starts where this one ended. */
		ch->cached_len -= text_len;
		append_cached(ch, content, strlen(content));
		push(ch, "assistant", content);
		free(content);
	}
	free(text);
	double dt = hyb_now() - t0;

	fprintf(stderr, "[prompt %d tokens, reply %d tokens, %.1f s; context %u/%u]\n", n_ids,
		n_gen, dt, hyb_ctx_n_past(ch->c), n_ctx);
}

static void reset(struct chat *ch)
{
	while (ch->n_msgs > ch->n_system)
		pop(ch);
	forget_cache(ch);
	fprintf(stderr, "hyb: conversation cleared\n");
}

int cmd_chat(int argc, char **argv)
{
	struct cli_opts o = { .n_predict = -1, .stream_load = true };
	struct chat ch = { 0 };
	struct sigaction sa;
	bool tty = isatty(STDIN_FILENO);
	char *line = NULL;
	size_t cap = 0;

	cli_parse(argc, argv, &o, usage);
	if (o.prompt)
		cli_die("hyb chat reads its messages from stdin (for one prompt: hyb run --chat -p)");
	ch.m = cli_load_model(&o);
	ch.tmpl = cli_chat_template(ch.m, o.chat_template);
	ch.c = cli_new_ctx(ch.m, &o);
	ch.sp = o.sp;
	ch.s = hyb_sampler_new(&o.sp, (int32_t)ch.m->hp.n_vocab);
	if (!ch.s)
		cli_die("%s", hyb_last_error());
	ch.n_predict = o.n_predict;
	ch.logits = xrealloc(NULL, sizeof(float) * ch.m->hp.n_vocab);
	if (o.system) {
		push(&ch, "system", o.system);
		ch.n_system = 1;
	}
	/* no SA_RESTART: Ctrl-C at the prompt ends the read, which then quits */
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_sigint;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	fprintf(stderr, "hyb: chat with %s (context %u tokens); /reset, /exit\n", o.model,
		hyb_ctx_n_ctx(ch.c));

	for (;;) {
		ssize_t n;

		interrupted = 0;
		if (tty) {
			fputs("> ", stdout);
			fflush(stdout);
		}
		errno = 0;
		n = getline(&line, &cap, stdin);
		if (n < 0) {
			if (interrupted || errno == EINTR)
				fputc('\n', stderr);
			break;
		}
		while (n && (line[n - 1] == '\n' || line[n - 1] == '\r'))
			line[--n] = 0;
		if (!n)
			continue;
		if (!strcmp(line, "/exit") || !strcmp(line, "/quit"))
			break;
		if (!strcmp(line, "/reset")) {
			reset(&ch);
			continue;
		}
		if (strlen(line) != (size_t)n) {
			fprintf(stderr, "hyb: a NUL byte in the message; message ignored\n");
			continue;
		}
		push(&ch, "user", line);
		reply(&ch);
	}
	free(line);
	while (ch.n_msgs)
		pop(&ch);
	free(ch.msgs);
	free(ch.cached);
	free(ch.logits);
	hyb_sampler_free(ch.s);
	hyb_ctx_free(ch.c);
	hyb_model_free(ch.m);
	return 0;
}
