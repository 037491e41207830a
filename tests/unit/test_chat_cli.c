// SPDX-License-Identifier: MIT
/*
 * `hyb chat` and `hyb run --chat` end to end on a synthetic model whose
 * tokenizer.chat_template is set by `hybctl synth --chat-template`: two turns
 * on one KV cache, /reset, a template override, unknown templates, a full
 * context, invalid UTF-8, and Ctrl-C stopping a reply and then quitting.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test.h"

/* A small model with the given tokenizer.chat_template (NULL: none), made once per name. */
static const char *model(const char *name, const char *tmpl, const char *extra)
{
	char path[512];
	char log[600];
	int rc;

	snprintf(path, sizeof(path), "%s/%s.gguf", hyb_test_tmpdir(), name);
	if (!access(path, R_OK))
		return strdup(path);
	snprintf(log, sizeof(log), "%s/synth-%s.log", hyb_test_tmpdir(), name);
	rc = hyb_test_sh(log, "%s synth -o %s --hidden 64 --ffn 128 --layers 2 --heads 2 -t 1 %s%s%s %s",
			 hyb_test_hybctl(), path, tmpl ? "--chat-template '" : "", tmpl ? tmpl : "",
			 tmpl ? "'" : "", extra ? extra : "");
	if (rc)
		hyb_test_show_log(log);
	CHECK_EQ_INT(rc, 0);
	return strdup(path);
}

static char *slurp(const char *path)
{
	FILE *f = fopen(path, "rb");
	static char buf[1 << 16];
	size_t n;

	CHECK_MSG(f, "%s missing", path);
	n = fread(buf, 1, sizeof(buf) - 1, f);
	buf[n] = 0;
	fclose(f);
	return buf;
}

/* The [prompt P tokens, reply R tokens, ...; context C/N] lines of a log. */
struct turn {
	int prompt, reply, ctx;
};

static int turns(const char *log, struct turn *t, int max)
{
	const char *p = log;
	int n = 0;
	double s;
	int total;

	while (n < max && (p = strstr(p, "[prompt "))) {
		CHECK(sscanf(p, "[prompt %d tokens, reply %d tokens, %lf s; context %d/%d]",
			     &t[n].prompt, &t[n].reply, &s, &t[n].ctx, &total) == 5);
		n++;
		p++;
	}
	return n;
}

#define HYB "build/hyb"

TEST(chat_cli_two_turns_and_reset)
{
	const char *m = model("chatml", "chatml", NULL);
	char out[600], err[600], *text, *all;
	struct turn t[4];

	snprintf(out, sizeof(out), "%s/out", hyb_test_tmpdir());
	snprintf(err, sizeof(err), "%s/err", hyb_test_tmpdir());
	/* { } so hyb's stdout goes to out and its stderr to err */
	CHECK_EQ_INT(hyb_test_sh(err, "{ printf 'hello there\\nand again\\n/reset\\nhello there\\n"
				 "/exit\\nnot read\\n' | " HYB " chat -m %s -n 6 -t 1 >%s; }", m, out),
		     0);
	text = slurp(err);
	CHECK_MSG(strstr(text, "chat template chatml (tokenizer.chat_template)"), "%s", text);
	CHECK_MSG(strstr(text, "conversation cleared"), "%s", text);
	CHECK_EQ_INT(turns(text, t, 4), 3);
	/* turn 2 evaluated only its own text: the cache grew by its prompt and reply */
	CHECK_EQ_INT(t[0].ctx, t[0].prompt + t[0].reply);
	CHECK_EQ_INT(t[1].ctx, t[0].ctx + t[1].prompt + t[1].reply);
	CHECK(t[1].prompt < t[1].ctx - t[0].reply - t[1].reply);
	/* after /reset the cache starts over, and greedy replies repeat */
	CHECK_EQ_INT(t[2].ctx, t[2].prompt + t[2].reply);
	CHECK_EQ_INT(t[2].prompt, t[0].prompt);
	/* greedy: the reply after /reset is the first reply again (a reply may hold newlines) */
	all = strdup(slurp(out));
	CHECK_EQ_INT(hyb_test_sh(err, "{ printf 'hello there\\n' | " HYB " chat -m %s -n 6 -t 1 >%s; }",
				 m, out), 0);
	text = slurp(out);
	CHECK(strlen(all) > 2 * strlen(text));
	CHECK_MSG(!strncmp(all, text, strlen(text)) &&
		  !strcmp(all + strlen(all) - strlen(text), text), "\"%s\" vs \"%s\"", all, text);
	free(all);
}

TEST(chat_cli_run_chat_and_templates)
{
	const char *m = model("chatml", "chatml", NULL);
	const char *weird = model("weird", "{{ messages | weird }}", NULL);
	const char *none = model("none", NULL, NULL);
	char log[600], *text;

	snprintf(log, sizeof(log), "%s/run.log", hyb_test_tmpdir());
	CHECK_EQ_INT(hyb_test_sh(log, HYB " run -m %s --chat -p hi -n 4 -t 1 --system 'be brief'",
				 m), 0);
	CHECK(strstr(slurp(log), "chat template chatml (tokenizer.chat_template)"));
	/* an override by name */
	CHECK_EQ_INT(hyb_test_sh(log, HYB " run -m %s --chat --chat-template llama3 -p hi -n 4 -t 1",
				 m), 0);
	CHECK(strstr(slurp(log), "chat template llama3 (--chat-template)"));
	CHECK_EQ_INT(hyb_test_sh(log, "echo hi | " HYB " chat -m %s --chat-template gemma -n 2 -t 1",
				 m), 0);
	CHECK(strstr(slurp(log), "chat template gemma (--chat-template)"));
	/* an unknown name: an error naming the choices, no raw prompt */
	CHECK(hyb_test_sh(log, HYB " run -m %s --chat --chat-template nope -p hi -n 4", m) != 0);
	text = slurp(log);
	CHECK_MSG(strstr(text, "unknown chat template 'nope'") && strstr(text, "chatml") &&
		  strstr(text, "llama3") && strstr(text, "gemma"), "%s", text);
	CHECK(hyb_test_sh(log, "echo hi | " HYB " chat -m %s --chat-template nope", m) != 0);
	CHECK(strstr(slurp(log), "unknown chat template 'nope'"));
	/* a model template hyb does not know: the same, and how to go on */
	CHECK(hyb_test_sh(log, HYB " run -m %s --chat -p hi -n 4", weird) != 0);
	text = slurp(log);
	CHECK_MSG(strstr(text, "not a chat template hyb knows") && strstr(text, "chatml") &&
		  strstr(text, "--chat-template NAME"), "%s", text);
	/* no template: chatml, llama.cpp's default, said so */
	CHECK_EQ_INT(hyb_test_sh(log, HYB " run -m %s --chat -p hi -n 2 -t 1", none), 0);
	CHECK(strstr(slurp(log), "chat template chatml (no tokenizer.chat_template; chatml, "
				 "llama.cpp's default)"));
	/* chat-only options without --chat */
	CHECK(hyb_test_sh(log, HYB " run -m %s --system x -p hi", m) != 0);
	CHECK(strstr(slurp(log), "are for --chat"));
	CHECK(hyb_test_sh(log, "echo hi | " HYB " chat -m %s -p hi", m) != 0);
}

TEST(chat_cli_full_context_and_bad_input)
{
	const char *m = model("chatml", "chatml", NULL);
	char log[600], *text;
	struct turn t[8];
	int n;

	snprintf(log, sizeof(log), "%s/full.log", hyb_test_tmpdir());
	/* 160 positions: the first turns fit, then the context is full; /reset recovers */
	CHECK_EQ_INT(hyb_test_sh(log, "printf 'one two\\n\\303\\050 bad\\nthree four\\nfive six\\n"
				 "seven eight\\n/reset\\nnine\\n' | " HYB " chat -m %s -c 160 -n 8 -t 1",
				 m), 0);
	text = slurp(log);
	CHECK_MSG(strstr(text, "invalid UTF-8 at byte 0; message ignored"), "%s", text);
	CHECK_MSG(strstr(text, "the context is full") && strstr(text, "/reset"), "%s", text);
	n = turns(text, t, 8);
	CHECK_MSG(n >= 2, "%s", text);
	CHECK_EQ_INT(t[n - 1].ctx, t[n - 1].prompt + t[n - 1].reply);
	/* one message longer than the whole context */
	CHECK_EQ_INT(hyb_test_sh(log, "printf '%%0300d\\n' 0 | " HYB " chat -m %s -c 160 -n 8 -t 1",
				 m), 0);
	CHECK_MSG(strstr(slurp(log), "more than the context"), "%s", slurp(log));
}

/* Reads what the child wrote into buf (appending) until `want` appears or 20 s pass. */
static bool wait_for(int fd, char *buf, size_t cap, size_t *len, const char *want)
{
	time_t end = time(NULL) + 20;

	while (!strstr(buf, want) && time(NULL) < end) {
		struct pollfd p = { fd, POLLIN, 0 };
		ssize_t n;

		if (poll(&p, 1, 200) <= 0)
			continue;
		n = read(fd, buf + *len, cap - 1 - *len);
		if (n <= 0)
			return false;
		*len += (size_t)n;
		buf[*len] = 0;
	}
	return strstr(buf, want) != NULL;
}

TEST(chat_cli_sigint)
{
	/* a long context, so the reply is still running when Ctrl-C comes */
	const char *m = model("long", "chatml", "--ctx 65536");
	int in[2], out[2], st = 0;
	static char buf[1 << 20];
	size_t len = 0;
	pid_t pid;
	const char *banner;

	CHECK(pipe(in) == 0 && pipe(out) == 0);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		dup2(in[0], 0);
		dup2(out[1], 1);
		dup2(out[1], 2);
		close(in[1]);
		close(out[0]);
		execl(HYB, HYB, "chat", "-m", m, "-c", "65536", "-t", "1", (char *)NULL);
		_exit(127);
	}
	close(in[0]);
	close(out[1]);
	CHECK(write(in[1], "tell me a story\n", 16) == 16);
	/* the reply has started once bytes follow the banner */
	CHECK_MSG(wait_for(out[0], buf, sizeof(buf), &len, "/reset, /exit\n"), "%s", buf);
	banner = strstr(buf, "/reset, /exit\n") + 14;
	for (time_t end = time(NULL) + 20; strlen(banner) < 8 && time(NULL) < end;)
		wait_for(out[0], buf, sizeof(buf), &len, "\x01never");
	kill(pid, SIGINT);
	CHECK_MSG(wait_for(out[0], buf, sizeof(buf), &len, "hyb: interrupted\n"), "%.2000s", buf);
	CHECK_MSG(wait_for(out[0], buf, sizeof(buf), &len, "[prompt "), "%.2000s", buf);
	CHECK_MSG(!strstr(buf, "context is full"), "the reply ended before Ctrl-C");
	/* back at the prompt: a second Ctrl-C quits */
	usleep(200 * 1000);
	kill(pid, SIGINT);
	for (int i = 0; i < 100 && waitpid(pid, &st, WNOHANG) == 0; i++)
		usleep(100 * 1000);
	if (waitpid(pid, &st, WNOHANG) == 0) {
		kill(pid, SIGKILL);
		waitpid(pid, &st, 0);
		CHECK_MSG(0, "hyb chat did not quit on Ctrl-C at the prompt");
	}
	close(in[1]);
	close(out[0]);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}
