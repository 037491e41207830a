// SPDX-License-Identifier: MIT
/*
 * A conversation in a chat template, written as llama.cpp's
 * llm_chat_apply_template writes it (tests/unit/test_chat.c compares every
 * template with its output byte for byte, quirks included: some templates
 * trim contents, some ignore add_assistant, orion always ends with an
 * assistant turn).
 */
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>

#include "hyb/chat.h"
#include "util/error.h"

/* Bounded output that keeps counting past its capacity, as snprintf does. */
struct out {
	char *buf;
	size_t cap, n;
};

static void put_n(struct out *o, const char *s, size_t n)
{
	if (o->n < o->cap) {
		size_t k = o->cap - o->n < n ? o->cap - o->n : n;

		memcpy(o->buf + o->n, s, k);
	}
	o->n += n;
}

static void put(struct out *o, const char *s)
{
	put_n(o, s, strlen(s));
}

static bool is_space(char c)
{
	return c == ' ' || (c >= '\t' && c <= '\r');
}

/* s without leading and trailing whitespace (C locale isspace, as llama.cpp's trim). */
static void put_trim(struct out *o, const char *s)
{
	size_t a = 0, b = strlen(s);

	while (a < b && is_space(s[a]))
		a++;
	while (b > a && is_space(s[b - 1]))
		b--;
	put_n(o, s + a, b - a);
}

static char upper(char c)
{
	return c >= 'a' && c <= 'z' ? (char)(c - 'a' + 'A') : c;
}

static bool is(const char *role, const char *want)
{
	return !strcmp(role, want);
}

/* Byte offset of the first invalid UTF-8 sequence in s, or -1. */
static long bad_utf8(const char *s)
{
	const unsigned char *p = (const unsigned char *)s;

	for (size_t i = 0; p[i];) {
		unsigned c = p[i], len, min;
		uint32_t cp;

		if (c < 0x80) {
			i++;
			continue;
		}
		if (c >= 0xc2 && c <= 0xdf)
			len = 2, min = 0x80, cp = c & 0x1f;
		else if (c >= 0xe0 && c <= 0xef)
			len = 3, min = 0x800, cp = c & 0x0f;
		else if (c >= 0xf0 && c <= 0xf4)
			len = 4, min = 0x10000, cp = c & 0x07;
		else
			return (long)i;
		for (unsigned k = 1; k < len; k++) {
			if ((p[i + k] & 0xc0) != 0x80)
				return (long)i;
			cp = cp << 6 | (p[i + k] & 0x3f);
		}
		if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
			return (long)i;
		i += len;
	}
	return -1;
}

static void llama2(struct out *o, int t, const struct hyb_chat_msg *m, size_t n)
{
	bool sys = t != HYB_CHAT_LLAMA2, bos_inside = t == HYB_CHAT_LLAMA2_SYS_BOS;
	bool strip = t == HYB_CHAT_LLAMA2_SYS_STRIP, inside = true;

	put(o, "[INST] ");
	for (size_t i = 0; i < n; i++) {
		void (*body)(struct out *, const char *) = strip ? put_trim : put;

		if (!inside) {
			inside = true;
			put(o, bos_inside ? "<s>[INST] " : "[INST] ");
		}
		if (is(m[i].role, "system")) {
			/* without <<SYS>> support the system text still leads the first turn */
			put(o, sys ? "<<SYS>>\n" : "");
			body(o, m[i].content);
			put(o, sys ? "\n<</SYS>>\n\n" : "\n");
		} else if (is(m[i].role, "user")) {
			body(o, m[i].content);
			put(o, " [/INST]");
		} else {
			body(o, m[i].content);
			put(o, "</s>");
			inside = false;
		}
	}
}

static void mistral(struct out *o, int t, const struct hyb_chat_msg *m, size_t n)
{
	const char *lead = t == HYB_CHAT_MISTRAL_V1 ? " " : "";
	const char *trail = t == HYB_CHAT_MISTRAL_V3_TEKKEN ? "" : " ";
	bool inside = false;

	for (size_t i = 0; i < n; i++) {
		if (!inside) {
			put(o, lead);
			put(o, "[INST]");
			put(o, trail);
			inside = true;
		}
		if (is(m[i].role, "system")) {
			put(o, m[i].content);
			put(o, "\n\n");
		} else if (is(m[i].role, "user")) {
			put(o, m[i].content);
			put(o, lead);
			put(o, "[/INST]");
		} else {
			put(o, trail);
			if (t == HYB_CHAT_MISTRAL_V3)
				put_trim(o, m[i].content);
			else
				put(o, m[i].content);
			put(o, "</s>");
			inside = false;
		}
	}
}

/* "<pre>role<mid>content<post>" for every message, then the assistant's opening. */
static void simple(struct out *o, const struct hyb_chat_msg *m, size_t n, bool add_ass,
		   const char *pre, const char *mid, const char *post, bool trim,
		   const char *assistant)
{
	for (size_t i = 0; i < n; i++) {
		put(o, pre);
		put(o, m[i].role);
		put(o, mid);
		if (trim)
			put_trim(o, m[i].content);
		else
			put(o, m[i].content);
		put(o, post);
	}
	if (add_ass)
		put(o, assistant);
}

/* Per-role prefix and suffix (NULL: the role is skipped). */
struct role_fmt {
	const char *role, *pre, *post;
};

static void by_role(struct out *o, const struct hyb_chat_msg *m, size_t n, bool add_ass,
		    const struct role_fmt *f, size_t nf, bool trim, const char *assistant)
{
	for (size_t i = 0; i < n; i++) {
		for (size_t k = 0; k < nf; k++) {
			if (f[k].role && !is(m[i].role, f[k].role))
				continue;
			put(o, f[k].pre);
			if (trim)
				put_trim(o, m[i].content);
			else
				put(o, m[i].content);
			put(o, f[k].post);
			break;
		}
	}
	if (add_ass && assistant)
		put(o, assistant);
}

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static void format(struct out *o, int t, const struct hyb_chat_msg *m, size_t n, bool add_ass)
{
	switch (t) {
	case HYB_CHAT_CHATML:
		simple(o, m, n, add_ass, "<|im_start|>", "\n", "<|im_end|>\n", false,
		       "<|im_start|>assistant\n");
		break;
	case HYB_CHAT_MISTRAL_V7:
	case HYB_CHAT_MISTRAL_V7_TEKKEN: {
		const char *sp = t == HYB_CHAT_MISTRAL_V7 ? " " : "";

		for (size_t i = 0; i < n; i++) {
			if (is(m[i].role, "system")) {
				put(o, "[SYSTEM_PROMPT]");
				put(o, sp);
				put(o, m[i].content);
				put(o, "[/SYSTEM_PROMPT]");
			} else if (is(m[i].role, "user")) {
				put(o, "[INST]");
				put(o, sp);
				put(o, m[i].content);
				put(o, "[/INST]");
			} else {
				put(o, sp);
				put(o, m[i].content);
				put(o, "</s>");
			}
		}
		break;
	}
	case HYB_CHAT_MISTRAL_V1:
	case HYB_CHAT_MISTRAL_V3:
	case HYB_CHAT_MISTRAL_V3_TEKKEN:
		mistral(o, t, m, n);
		break;
	case HYB_CHAT_LLAMA2:
	case HYB_CHAT_LLAMA2_SYS:
	case HYB_CHAT_LLAMA2_SYS_BOS:
	case HYB_CHAT_LLAMA2_SYS_STRIP:
		llama2(o, t, m, n);
		break;
	case HYB_CHAT_PHI3:
		simple(o, m, n, add_ass, "<|", "|>\n", "<|end|>\n", false, "<|assistant|>\n");
		break;
	case HYB_CHAT_PHI4:
		simple(o, m, n, add_ass, "<|im_start|>", "<|im_sep|>", "<|im_end|>", false,
		       "<|im_start|>assistant<|im_sep|>");
		break;
	case HYB_CHAT_FALCON3:
		simple(o, m, n, add_ass, "<|", "|>\n", "\n", false, "<|assistant|>\n");
		break;
	case HYB_CHAT_ZEPHYR:
		simple(o, m, n, add_ass, "<|", "|>\n", "<|endoftext|>\n", false, "<|assistant|>\n");
		break;
	case HYB_CHAT_MONARCH:
		/* the first message goes without its <s> (the tokenizer adds BOS) */
		for (size_t i = 0; i < n; i++) {
			put(o, i ? "<s>" : "");
			put(o, m[i].role);
			put(o, "\n");
			put(o, m[i].content);
			put(o, "</s>\n");
		}
		if (add_ass)
			put(o, "<s>assistant\n");
		break;
	case HYB_CHAT_GEMMA: {
		/* no system role: system texts (trimmed) open the next user turn */
		size_t sys_from = 0, sys_n = 0;

		for (size_t i = 0; i < n; i++) {
			bool model;

			if (is(m[i].role, "system")) {
				if (!sys_n)
					sys_from = i;
				sys_n = i - sys_from + 1;
				continue;
			}
			model = is(m[i].role, "assistant") || is(m[i].role, "model");
			put(o, "<start_of_turn>");
			put(o, is(m[i].role, "assistant") ? "model" : m[i].role);
			put(o, "\n");
			if (sys_n && !model) {
				size_t before = o->n;

				for (size_t k = sys_from; k < sys_from + sys_n; k++)
					if (is(m[k].role, "system"))
						put_trim(o, m[k].content);
				/* llama.cpp keeps an all-empty system text pending */
				if (o->n != before) {
					put(o, "\n\n");
					sys_n = 0;
				}
			}
			put_trim(o, m[i].content);
			put(o, "<end_of_turn>\n");
		}
		if (add_ass)
			put(o, "<start_of_turn>model\n");
		break;
	}
	case HYB_CHAT_ORION: {
		const char *sys = NULL;
		size_t sys_at = 0;

		for (size_t i = 0; i < n; i++) {
			if (is(m[i].role, "system")) {
				if (!sys)
					sys_at = i;
				sys = m[i].content;
				continue;
			}
			if (is(m[i].role, "user")) {
				size_t before;

				put(o, "Human: ");
				before = o->n;
				for (size_t k = sys_at; sys && k < i; k++)
					if (is(m[k].role, "system"))
						put(o, m[k].content);
				if (o->n != before)
					put(o, "\n\n");
				if (o->n != before || sys)
					sys = NULL;
				put(o, m[i].content);
				put(o, "\n\nAssistant: </s>");
			} else {
				put(o, m[i].content);
				put(o, "</s>");
			}
		}
		break;
	}
	case HYB_CHAT_OPENCHAT:
		for (size_t i = 0; i < n; i++) {
			if (is(m[i].role, "system")) {
				put(o, m[i].content);
			} else {
				char first = upper(m[i].role[0]);

				put(o, "GPT4 Correct ");
				if (first)
					put_n(o, &first, 1);
				put(o, m[i].role[0] ? m[i].role + 1 : "");
				put(o, ": ");
				put(o, m[i].content);
			}
			put(o, "<|end_of_turn|>");
		}
		if (add_ass)
			put(o, "GPT4 Correct Assistant:");
		break;
	case HYB_CHAT_VICUNA:
	case HYB_CHAT_VICUNA_ORCA: {
		const struct role_fmt f[] = {
			{ "system", t == HYB_CHAT_VICUNA_ORCA ? "SYSTEM: " : "",
			  t == HYB_CHAT_VICUNA_ORCA ? "\n" : "\n\n" },
			{ "user", "USER: ", "\n" },
			{ "assistant", "ASSISTANT: ", "</s>\n" },
		};

		by_role(o, m, n, add_ass, f, N_OF(f), false, "ASSISTANT:");
		break;
	}
	case HYB_CHAT_DEEPSEEK: {
		const struct role_fmt f[] = {
			{ "system", "", "" },
			{ "user", "### Instruction:\n", "\n" },
			{ "assistant", "### Response:\n", "\n<|EOT|>\n" },
		};

		by_role(o, m, n, add_ass, f, N_OF(f), false, "### Response:\n");
		break;
	}
	case HYB_CHAT_COMMAND_R: {
		const struct role_fmt f[] = {
			{ "system", "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>", "<|END_OF_TURN_TOKEN|>" },
			{ "user", "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>", "<|END_OF_TURN_TOKEN|>" },
			{ "assistant", "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
			  "<|END_OF_TURN_TOKEN|>" },
		};

		by_role(o, m, n, add_ass, f, N_OF(f), true,
			"<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>");
		break;
	}
	case HYB_CHAT_LLAMA3:
		simple(o, m, n, add_ass, "<|start_header_id|>", "<|end_header_id|>\n\n", "<|eot_id|>",
		       true, "<|start_header_id|>assistant<|end_header_id|>\n\n");
		break;
	case HYB_CHAT_CHATGLM3:
		put(o, "[gMASK]sop");
		simple(o, m, n, add_ass, "<|", "|>\n ", "", false, "<|assistant|>");
		break;
	case HYB_CHAT_CHATGLM4:
		put(o, "[gMASK]<sop>");
		simple(o, m, n, add_ass, "<|", "|>\n", "", false, "<|assistant|>\n");
		break;
	case HYB_CHAT_GLMEDGE:
		simple(o, m, n, add_ass, "<|", "|>\n", "", false, "<|assistant|>");
		break;
	case HYB_CHAT_MINICPM: {
		const struct role_fmt f[] = { { "user", "<用户>", "<AI>" }, { NULL, "", "" } };

		by_role(o, m, n, false, f, N_OF(f), true, NULL);
		break;
	}
	case HYB_CHAT_DEEPSEEK2: {
		const struct role_fmt f[] = {
			{ "system", "", "\n\n" },
			{ "user", "User: ", "\n\n" },
			{ "assistant", "Assistant: ", "<｜end▁of▁sentence｜>" },
		};

		by_role(o, m, n, add_ass, f, N_OF(f), false, "Assistant:");
		break;
	}
	case HYB_CHAT_DEEPSEEK3: {
		const struct role_fmt f[] = {
			{ "system", "", "\n\n" },
			{ "user", "<｜User｜>", "" },
			{ "assistant", "<｜Assistant｜>", "<｜end▁of▁sentence｜>" },
		};

		by_role(o, m, n, add_ass, f, N_OF(f), false, "<｜Assistant｜>");
		break;
	}
	case HYB_CHAT_DEEPSEEK_OCR: {
		const struct role_fmt f[] = { { NULL, "", "" } };

		by_role(o, m, n, false, f, N_OF(f), false, NULL);
		break;
	}
	case HYB_CHAT_EXAONE3:
	case HYB_CHAT_EXAONE4: {
		const struct role_fmt f[] = {
			{ "system", "[|system|]", "[|endofturn|]\n" },
			{ "user", "[|user|]", "\n" },
			{ "assistant", "[|assistant|]", "[|endofturn|]\n" },
			{ "tool", "[|tool|]", "[|endofturn|]\n" },
		};

		by_role(o, m, n, add_ass, f, N_OF(f) - (t == HYB_CHAT_EXAONE3), true,
			"[|assistant|]");
		break;
	}
	case HYB_CHAT_EXAONE_MOE: {
		const struct role_fmt f[] = {
			{ "system", "<|system|>\n", "<|endofturn|>\n" },
			{ "user", "<|user|>\n", "<|endofturn|>\n" },
			{ "assistant", "<|assistant|>\n", "<|endofturn|>\n" },
			{ "tool", "<|tool|>\n", "<|endofturn|>\n" },
		};

		by_role(o, m, n, add_ass, f, N_OF(f), true, "<|assistant|>\n");
		break;
	}
	case HYB_CHAT_RWKV_WORLD:
		/* the generation prompt follows a last user message whatever add_assistant says */
		for (size_t i = 0; i < n; i++) {
			const char *pre = NULL;

			if (is(m[i].role, "system"))
				pre = "System: ";
			else if (is(m[i].role, "user"))
				pre = "User: ";
			else if (is(m[i].role, "assistant"))
				pre = "Assistant: ";
			if (!pre)
				continue;
			put(o, pre);
			put_trim(o, m[i].content);
			put(o, "\n\n");
			if (is(m[i].role, "user") && i + 1 == n)
				put(o, "Assistant:");
		}
		break;
	case HYB_CHAT_GRANITE:
		for (size_t i = 0; i < n; i++) {
			put(o, "<|start_of_role|>");
			put(o, m[i].role);
			put(o, "<|end_of_role|>");
			if (is(m[i].role, "assistant_tool_call"))
				put(o, "<|tool_call|>");
			put(o, m[i].content);
			put(o, "<|end_of_text|>\n");
		}
		if (add_ass)
			put(o, "<|start_of_role|>assistant<|end_of_role|>");
		break;
	case HYB_CHAT_GRANITE_4_0:
	case HYB_CHAT_GRANITE_4_1:
		for (size_t i = 0; i < n; i++) {
			if (is(m[i].role, "assistant_tool_call")) {
				put(o, "<|start_of_role|>assistant<|end_of_role|><|tool_call|>");
			} else {
				put(o, "<|start_of_role|>");
				put(o, m[i].role);
				put(o, "<|end_of_role|>");
			}
			put(o, m[i].content);
			put(o, "<|end_of_text|>\n");
		}
		if (add_ass)
			put(o, "<|start_of_role|>assistant<|end_of_role|>");
		break;
	case HYB_CHAT_GIGACHAT: {
		bool sys = n && is(m[0].role, "system");

		put(o, "<s>");
		if (sys) {
			put(o, m[0].content);
			put(o, "<|message_sep|>");
		}
		for (size_t i = sys; i < n; i++) {
			if (is(m[i].role, "user")) {
				put(o, "user<|role_sep|>");
				put(o, m[i].content);
				put(o, "<|message_sep|>available functions<|role_sep|>[]"
				       "<|message_sep|>");
			} else if (is(m[i].role, "assistant")) {
				put(o, "assistant<|role_sep|>");
				put(o, m[i].content);
				put(o, "<|message_sep|>");
			}
		}
		if (add_ass)
			put(o, "assistant<|role_sep|>");
		break;
	}
	case HYB_CHAT_MEGREZ:
		simple(o, m, n, add_ass, "<|role_start|>", "<|role_end|>", "<|turn_end|>", false,
		       "<|role_start|>assistant<|role_end|>");
		break;
	case HYB_CHAT_YANDEX: {
		const struct role_fmt f[] = {
			{ "user", " Пользователь: ", "\n\n" },
			{ "assistant", " Ассистент: ", "\n\n" },
		};

		by_role(o, m, n, add_ass, f, N_OF(f), false, " Ассистент:[SEP]");
		break;
	}
	case HYB_CHAT_BAILING:
	case HYB_CHAT_BAILING_THINK:
	case HYB_CHAT_BAILING2:
		if (t == HYB_CHAT_BAILING2 && !(n && is(m[0].role, "system")))
			put(o, "<role>SYSTEM</role>detailed thinking off<|role_end|>");
		for (size_t i = 0; i < n; i++) {
			put(o, "<role>");
			if (is(m[i].role, "user")) {
				put(o, "HUMAN");
			} else {
				for (const char *r = m[i].role; *r; r++) {
					char c = upper(*r);

					put_n(o, &c, 1);
				}
			}
			put(o, "</role>");
			put(o, m[i].content);
			if (t == HYB_CHAT_BAILING2)
				put(o, "<|role_end|>");
		}
		if (add_ass) {
			put(o, "<role>ASSISTANT</role>");
			if (t == HYB_CHAT_BAILING_THINK)
				put(o, "<think>");
		}
		break;
	case HYB_CHAT_LLAMA4:
		simple(o, m, n, add_ass, "<|header_start|>", "<|header_end|>\n\n", "<|eot|>", true,
		       "<|header_start|>assistant<|header_end|>\n\n");
		break;
	case HYB_CHAT_SMOLVLM: {
		const struct role_fmt f[] = {
			{ "system", "", "\n\n" },
			{ "user", "User: ", "<end_of_utterance>\n" },
			{ NULL, "Assistant: ", "<end_of_utterance>\n" },
		};

		put(o, "<|im_start|>");
		by_role(o, m, n, add_ass, f, N_OF(f), false, "Assistant:");
		break;
	}
	case HYB_CHAT_DOTS1: {
		const struct role_fmt f[] = {
			{ "system", "<|system|>", "<|endofsystem|>" },
			{ "user", "<|userprompt|>", "<|endofuserprompt|>" },
			{ NULL, "<|response|>", "<|endofresponse|>" },
		};

		by_role(o, m, n, add_ass, f, N_OF(f), false, "<|response|>");
		break;
	}
	case HYB_CHAT_HUNYUAN_MOE: {
		const struct role_fmt f[] = {
			{ "system", "<|startoftext|>", "<|extra_4|>" },
			{ "assistant", "", "<|eos|>" },
			{ NULL, "<|startoftext|>", "<|extra_0|>" },
		};

		by_role(o, m, n, false, f, N_OF(f), false, NULL);
		break;
	}
	case HYB_CHAT_GPT_OSS:
		for (size_t i = 0; i < n; i++) {
			put(o, "<|start|>");
			put(o, m[i].role);
			put(o, "<|message|>");
			put(o, m[i].content);
			put(o, is(m[i].role, "assistant") ? "<|return|>" : "<|end|>");
		}
		if (add_ass)
			put(o, "<|start|>assistant");
		break;
	case HYB_CHAT_HUNYUAN_DENSE:
		for (size_t i = 0; i < n; i++) {
			if (i == 0 && is(m[i].role, "system")) {
				put(o, m[i].content);
				put(o, "<｜hy_place▁holder▁no▁3｜>");
			}
			if (is(m[i].role, "assistant")) {
				put(o, "<｜hy_Assistant｜>");
				put(o, m[i].content);
				put(o, "<｜hy_place▁holder▁no▁2｜>");
			} else if (is(m[i].role, "user")) {
				put(o, "<｜hy_User｜>");
				put(o, m[i].content);
				put(o, "<｜hy_Assistant｜>");
			}
		}
		break;
	case HYB_CHAT_HUNYUAN_VL:
		put(o, "<｜hy_begin▁of▁sentence｜>");
		for (size_t i = 0; i < n; i++) {
			if (i == 0 && is(m[i].role, "system")) {
				put(o, m[i].content);
				put(o, "<｜hy_place▁holder▁no▁3｜>");
			} else if (is(m[i].role, "user")) {
				put(o, m[i].content);
				put(o, "<｜hy_User｜>");
			} else if (is(m[i].role, "assistant")) {
				put(o, m[i].content);
				put(o, "<｜hy_Assistant｜>");
			}
		}
		break;
	case HYB_CHAT_KIMI_K2:
		for (size_t i = 0; i < n; i++) {
			if (is(m[i].role, "system"))
				put(o, "<|im_system|>system<|im_middle|>");
			else if (is(m[i].role, "user"))
				put(o, "<|im_user|>user<|im_middle|>");
			else if (is(m[i].role, "assistant"))
				put(o, "<|im_assistant|>assistant<|im_middle|>");
			else if (is(m[i].role, "tool"))
				put(o, "<|im_system|>tool<|im_middle|>");
			put(o, m[i].content);
			put(o, "<|im_end|>");
		}
		if (add_ass)
			put(o, "<|im_assistant|>assistant<|im_middle|>");
		break;
	case HYB_CHAT_SEED_OSS:
		for (size_t i = 0; i < n; i++) {
			put(o, "<seed:bos>");
			put(o, m[i].role);
			put(o, "\n");
			if (is(m[i].role, "assistant"))
				put_trim(o, m[i].content);
			else
				put(o, m[i].content);
			put(o, "<seed:eos>");
		}
		if (add_ass)
			put(o, "<seed:bos>assistant\n");
		break;
	case HYB_CHAT_GROK2:
		for (size_t i = 0; i < n; i++) {
			if (is(m[i].role, "system")) {
				put(o, "System: ");
				put_trim(o, m[i].content);
			} else if (is(m[i].role, "user")) {
				put(o, "Human: ");
				put_trim(o, m[i].content);
			} else if (is(m[i].role, "assistant")) {
				put(o, "Assistant: ");
				put(o, m[i].content);
			} else {
				continue;
			}
			put(o, "<|separator|>\n\n");
		}
		if (add_ass)
			put(o, "Assistant:");
		break;
	case HYB_CHAT_PANGU_EMBEDDED: {
		static const struct role_fmt f[] = {
			{ "system", "[unused9]系统：", "[unused10]" },
			{ "user", "[unused9]用户：", "[unused10]" },
			{ "assistant", "[unused9]助手：", "[unused10]" },
			{ "tool", "[unused9]工具：", "[unused10]" },
			{ "function", "[unused9]方法：", "[unused10]" },
		};

		if (n && !is(m[0].role, "system"))
			put(o, "[unused9]系统：[unused10]");
		by_role(o, m, n, add_ass, f, N_OF(f), false, "[unused9]助手：");
		break;
	}
	case HYB_CHAT_SOLAR_OPEN:
		simple(o, m, n, add_ass, "<|begin|>", "<|content|>", "<|end|>", false,
		       "<|begin|>assistant");
		break;
	}
}

int hyb_chat_format(int tmpl, const struct hyb_chat_msg *msgs, size_t n, bool add_assistant,
		    char *buf, int cap)
{
	struct out o;

	if (tmpl < 0 || tmpl >= HYB_CHAT_N_TEMPLATES)
		return hyb_error_set(-EINVAL, "chat template %d out of range [0, %d)", tmpl,
				     HYB_CHAT_N_TEMPLATES);
	if ((n && !msgs) || cap < 0 || (cap && !buf))
		return hyb_error_set(-EINVAL, "chat format: no messages or output buffer");
	for (size_t i = 0; i < n; i++) {
		long at;

		if (!msgs[i].role || !msgs[i].content)
			return hyb_error_set(-EINVAL, "chat message %zu has no %s", i,
					     msgs[i].role ? "content" : "role");
		if ((at = bad_utf8(msgs[i].role)) >= 0)
			return hyb_error_set(-EILSEQ,
					     "chat message %zu: the role is not valid UTF-8 "
					     "(byte %ld)", i, at);
		if ((at = bad_utf8(msgs[i].content)) >= 0)
			return hyb_error_set(-EILSEQ,
					     "chat message %zu (%.32s): invalid UTF-8 at byte %ld",
					     i, msgs[i].role, at);
	}
	o = (struct out){ buf, (size_t)cap, 0 };
	format(&o, tmpl, msgs, n, add_assistant);
	if (o.n > INT_MAX)
		return hyb_error_set(-E2BIG, "chat format: %zu bytes of prompt is more than %d",
				     o.n, INT_MAX);
	if (o.n < o.cap)
		buf[o.n] = 0;
	return (int)o.n;
}
