// SPDX-License-Identifier: MIT
/*
 * Which chat template: by name, from a tokenizer.chat_template text (the
 * marker tests of llama.cpp's llm_chat_detect_template, in its order: the
 * first that matches wins, so the order is part of the rule), or for a model
 * file that has no template.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "hyb/chat.h"
#include "hyb/gguf.h"
#include "hyb/tokenizer.h"
#include "tokenizer/tokenizer_internal.h"
#include "util/error.h"

static const char *const names[HYB_CHAT_N_TEMPLATES] = {
	[HYB_CHAT_CHATML] = "chatml",
	[HYB_CHAT_LLAMA2] = "llama2",
	[HYB_CHAT_LLAMA2_SYS] = "llama2-sys",
	[HYB_CHAT_LLAMA2_SYS_BOS] = "llama2-sys-bos",
	[HYB_CHAT_LLAMA2_SYS_STRIP] = "llama2-sys-strip",
	[HYB_CHAT_MISTRAL_V1] = "mistral-v1",
	[HYB_CHAT_MISTRAL_V3] = "mistral-v3",
	[HYB_CHAT_MISTRAL_V3_TEKKEN] = "mistral-v3-tekken",
	[HYB_CHAT_MISTRAL_V7] = "mistral-v7",
	[HYB_CHAT_MISTRAL_V7_TEKKEN] = "mistral-v7-tekken",
	[HYB_CHAT_PHI3] = "phi3",
	[HYB_CHAT_PHI4] = "phi4",
	[HYB_CHAT_FALCON3] = "falcon3",
	[HYB_CHAT_ZEPHYR] = "zephyr",
	[HYB_CHAT_MONARCH] = "monarch",
	[HYB_CHAT_GEMMA] = "gemma",
	[HYB_CHAT_ORION] = "orion",
	[HYB_CHAT_OPENCHAT] = "openchat",
	[HYB_CHAT_VICUNA] = "vicuna",
	[HYB_CHAT_VICUNA_ORCA] = "vicuna-orca",
	[HYB_CHAT_DEEPSEEK] = "deepseek",
	[HYB_CHAT_DEEPSEEK2] = "deepseek2",
	[HYB_CHAT_DEEPSEEK3] = "deepseek3",
	[HYB_CHAT_DEEPSEEK_OCR] = "deepseek-ocr",
	[HYB_CHAT_COMMAND_R] = "command-r",
	[HYB_CHAT_LLAMA3] = "llama3",
	[HYB_CHAT_CHATGLM3] = "chatglm3",
	[HYB_CHAT_CHATGLM4] = "chatglm4",
	[HYB_CHAT_GLMEDGE] = "glmedge",
	[HYB_CHAT_MINICPM] = "minicpm",
	[HYB_CHAT_EXAONE3] = "exaone3",
	[HYB_CHAT_EXAONE4] = "exaone4",
	[HYB_CHAT_EXAONE_MOE] = "exaone-moe",
	[HYB_CHAT_RWKV_WORLD] = "rwkv-world",
	[HYB_CHAT_GRANITE] = "granite",
	[HYB_CHAT_GRANITE_4_0] = "granite-4.0",
	[HYB_CHAT_GRANITE_4_1] = "granite-4.1",
	[HYB_CHAT_GIGACHAT] = "gigachat",
	[HYB_CHAT_MEGREZ] = "megrez",
	[HYB_CHAT_YANDEX] = "yandex",
	[HYB_CHAT_BAILING] = "bailing",
	[HYB_CHAT_BAILING_THINK] = "bailing-think",
	[HYB_CHAT_BAILING2] = "bailing2",
	[HYB_CHAT_LLAMA4] = "llama4",
	[HYB_CHAT_SMOLVLM] = "smolvlm",
	[HYB_CHAT_DOTS1] = "dots1",
	[HYB_CHAT_HUNYUAN_MOE] = "hunyuan-moe",
	[HYB_CHAT_GPT_OSS] = "gpt-oss",
	[HYB_CHAT_HUNYUAN_DENSE] = "hunyuan-dense",
	[HYB_CHAT_HUNYUAN_VL] = "hunyuan-vl",
	[HYB_CHAT_KIMI_K2] = "kimi-k2",
	[HYB_CHAT_SEED_OSS] = "seed_oss",
	[HYB_CHAT_GROK2] = "grok-2",
	[HYB_CHAT_PANGU_EMBEDDED] = "pangu-embedded",
	[HYB_CHAT_SOLAR_OPEN] = "solar-open",
};

const char *hyb_chat_template_name(int tmpl)
{
	return tmpl >= 0 && tmpl < HYB_CHAT_N_TEMPLATES ? names[tmpl] : NULL;
}

const char *hyb_chat_template_names(void)
{
	/* every name fits: 55 names of at most 17 bytes, ", " between */
	static char list[HYB_CHAT_N_TEMPLATES * 20];
	static int done;

	if (!__atomic_load_n(&done, __ATOMIC_ACQUIRE)) {
		char tmp[sizeof(list)];
		size_t n = 0;

		for (int i = 0; i < HYB_CHAT_N_TEMPLATES; i++)
			n += (size_t)snprintf(tmp + n, sizeof(tmp) - n, "%s%s", i ? ", " : "",
					      names[i]);
		/* racing threads write the same bytes */
		memcpy(list, tmp, n + 1);
		__atomic_store_n(&done, 1, __ATOMIC_RELEASE);
	}
	return list;
}

/* A template by exact name over len bytes; -1 when none. */
static int by_name(const char *s, size_t len)
{
	for (int i = 0; i < HYB_CHAT_N_TEMPLATES; i++)
		if (strlen(names[i]) == len && !memcmp(names[i], s, len))
			return i;
	return -1;
}

int hyb_chat_template_from_name(const char *name)
{
	int t;

	if (!name)
		return hyb_error_set(-EINVAL, "chat template: no name");
	t = by_name(name, strlen(name));
	if (t < 0)
		return hyb_error_set(-ENOENT, "unknown chat template '%.64s'; known: %s", name,
				     hyb_chat_template_names());
	return t;
}

struct text {
	const char *s;
	size_t n;
};

static bool has(struct text t, const char *needle)
{
	return memmem(t.s, t.n, needle, strlen(needle)) != NULL;
}

/* llm_chat_detect_template's tests, in its order; -1 when none matches. */
static int detect(struct text t)
{
	int byname = by_name(t.s, t.n);

	if (byname >= 0)
		return byname;
	if (has(t, "<|im_start|>")) {
		if (has(t, "<|im_sep|>"))
			return HYB_CHAT_PHI4;
		/* SmolVLM starts with <|im_start|> but is not chatml */
		return has(t, "<end_of_utterance>") ? HYB_CHAT_SMOLVLM : HYB_CHAT_CHATML;
	}
	if ((t.n >= 7 && !memcmp(t.s, "mistral", 7)) || has(t, "[INST]")) {
		if (has(t, "[SYSTEM_PROMPT]"))
			return HYB_CHAT_MISTRAL_V7;
		/* Mistral's official v1 and v3 (tekken) templates */
		if (has(t, "' [INST] ' + system_message") || has(t, "[AVAILABLE_TOOLS]")) {
			if (has(t, " [INST]"))
				return HYB_CHAT_MISTRAL_V1;
			if (has(t, "\"[INST]\""))
				return HYB_CHAT_MISTRAL_V3_TEKKEN;
			return HYB_CHAT_MISTRAL_V3;
		}
		/* llama2 and its variants */
		if (has(t, "content.strip()"))
			return HYB_CHAT_LLAMA2_SYS_STRIP;
		if (has(t, "bos_token + '[INST]"))
			return HYB_CHAT_LLAMA2_SYS_BOS;
		if (has(t, "<<SYS>>"))
			return HYB_CHAT_LLAMA2_SYS;
		return HYB_CHAT_LLAMA2;
	}
	if (has(t, "<|assistant|>") && has(t, "<|end|>"))
		return HYB_CHAT_PHI3;
	if (has(t, "[gMASK]<sop>"))
		return HYB_CHAT_CHATGLM4;
	if (has(t, "<|assistant|>") && has(t, "<|user|>")) {
		if (has(t, "<|tool_declare|>"))
			return HYB_CHAT_EXAONE_MOE;
		return has(t, "</s>") ? HYB_CHAT_FALCON3 : HYB_CHAT_GLMEDGE;
	}
	if (has(t, "<|{{ item['role'] }}|>") && has(t, "<|begin_of_image|>"))
		return HYB_CHAT_GLMEDGE;
	if (has(t, "<|user|>") && has(t, "<|endoftext|>"))
		return HYB_CHAT_ZEPHYR;
	if (has(t, "bos_token + message['role']"))
		return HYB_CHAT_MONARCH;
	if (has(t, "<start_of_turn>"))
		return HYB_CHAT_GEMMA;
	if (has(t, "'\\n\\nAssistant: ' + eos_token"))
		return HYB_CHAT_ORION;
	if (has(t, "GPT4 Correct "))
		return HYB_CHAT_OPENCHAT;
	if (has(t, "USER: ") && has(t, "ASSISTANT: "))
		return has(t, "SYSTEM: ") ? HYB_CHAT_VICUNA_ORCA : HYB_CHAT_VICUNA;
	if (has(t, "### Instruction:") && has(t, "<|EOT|>"))
		return HYB_CHAT_DEEPSEEK;
	if (has(t, "<|START_OF_TURN_TOKEN|>") && has(t, "<|USER_TOKEN|>"))
		return HYB_CHAT_COMMAND_R;
	if (has(t, "<|start_header_id|>") && has(t, "<|end_header_id|>"))
		return HYB_CHAT_LLAMA3;
	if (has(t, "[gMASK]sop"))
		return HYB_CHAT_CHATGLM3;
	if (has(t, "<用户>"))
		return HYB_CHAT_MINICPM;
	if (has(t, "'Assistant: ' + message['content'] + eos_token"))
		return HYB_CHAT_DEEPSEEK2;
	if (has(t, "<｜Assistant｜>") && has(t, "<｜User｜>") && has(t, "<｜end▁of▁sentence｜>"))
		return HYB_CHAT_DEEPSEEK3;
	if (has(t, "[|system|]") && has(t, "[|assistant|]") && has(t, "[|endofturn|]"))
		return has(t, "[|tool|]") ? HYB_CHAT_EXAONE4 : HYB_CHAT_EXAONE3;
	if (has(t, "rwkv-world") || has(t, "{{- 'User: ' + message['content']|trim + '\\n\\n' -}}"))
		return HYB_CHAT_RWKV_WORLD;
	if (has(t, "<|start_of_role|>")) {
		if (has(t, "<tool_call>") || has(t, "<tools>"))
			return has(t, "g4_default_system_message") ? HYB_CHAT_GRANITE_4_0
								    : HYB_CHAT_GRANITE_4_1;
		return HYB_CHAT_GRANITE;
	}
	if (has(t, "message['role'] + additional_special_tokens[0] + message['content'] + "
		   "additional_special_tokens[1]"))
		return HYB_CHAT_GIGACHAT;
	if (has(t, "<|role_start|>"))
		return HYB_CHAT_MEGREZ;
	if (has(t, " Ассистент:"))
		return HYB_CHAT_YANDEX;
	if (has(t, "<role>ASSISTANT</role>") && has(t, "'HUMAN'"))
		return HYB_CHAT_BAILING;
	if (has(t, "<role>ASSISTANT</role>") && has(t, "\"HUMAN\"") && has(t, "<think>"))
		return HYB_CHAT_BAILING_THINK;
	if (has(t, "<role>ASSISTANT</role>") && has(t, "<role>HUMAN</role>") &&
	    has(t, "<|role_end|>"))
		return HYB_CHAT_BAILING2;
	if (has(t, "<|header_start|>") && has(t, "<|header_end|>"))
		return HYB_CHAT_LLAMA4;
	if (has(t, "<|endofuserprompt|>"))
		return HYB_CHAT_DOTS1;
	if (has(t, "<|extra_0|>") && has(t, "<|extra_4|>"))
		return HYB_CHAT_HUNYUAN_MOE;
	if (has(t, "<|start|>") && has(t, "<|channel|>"))
		return HYB_CHAT_GPT_OSS;
	if (has(t, "<｜hy_Assistant｜>") && has(t, "<｜hy_begin▁of▁sentence｜>"))
		return HYB_CHAT_HUNYUAN_VL;
	if (has(t, "<｜hy_Assistant｜>") && has(t, "<｜hy_place▁holder▁no▁3｜>"))
		return HYB_CHAT_HUNYUAN_DENSE;
	if (has(t, "<|im_assistant|>assistant<|im_middle|>"))
		return HYB_CHAT_KIMI_K2;
	if (has(t, "<seed:bos>"))
		return HYB_CHAT_SEED_OSS;
	if (has(t, "'Assistant: '  + message['content'] + '<|separator|>"))
		return HYB_CHAT_GROK2;
	if (has(t, "[unused9]系统：[unused10]"))
		return HYB_CHAT_PANGU_EMBEDDED;
	if (has(t, "<|begin|>") && has(t, "<|end|>") && has(t, "<|content|>"))
		return HYB_CHAT_SOLAR_OPEN;
	return -1;
}

/* The start of a template's first line, printable, for messages (cap >= 8). */
static void excerpt(struct text t, char *out, size_t cap)
{
	size_t o = 0, i = 0;

	for (; i < t.n && t.s[i] != '\n' && o + 4 < cap; i++) {
		unsigned char c = (unsigned char)t.s[i];

		out[o++] = c < 0x20 || c == 0x7f ? '?' : (char)c;
	}
	if (i < t.n) {
		/* no half a UTF-8 character before the dots */
		while (o && ((unsigned char)out[o - 1] & 0xc0) == 0x80)
			o--;
		if (o && (unsigned char)out[o - 1] >= 0xc0)
			o--;
		memcpy(out + o, "...", 3);
		o += 3;
	}
	out[o] = 0;
}

static int detect_or_fail(struct text t, const char *what)
{
	int r = detect(t);
	char ex[64];

	if (r >= 0)
		return r;
	excerpt(t, ex, sizeof(ex));
	return hyb_error_set(-ENOENT,
			     "%s is not a chat template hyb knows (\"%s\"); pick one by name: %s",
			     what, ex, hyb_chat_template_names());
}

int hyb_chat_template_detect(const char *text)
{
	if (!text)
		return hyb_error_set(-EINVAL, "chat template: no text");
	return detect_or_fail((struct text){ text, strlen(text) }, "the template");
}

int hyb_chat_template_for_model(const struct hyb_gguf_file *f, const struct hyb_tokenizer *tok,
				const char **how)
{
	static const struct {
		const char *token, *how;
		int tmpl;
	} marks[] = {
		{ "<start_of_turn>", "no tokenizer.chat_template; the vocabulary has <start_of_turn>",
		  HYB_CHAT_GEMMA },
		{ "<|start_header_id|>",
		  "no tokenizer.chat_template; the vocabulary has <|start_header_id|>",
		  HYB_CHAT_LLAMA3 },
		{ "<|im_start|>", "no tokenizer.chat_template; the vocabulary has <|im_start|>",
		  HYB_CHAT_CHATML },
	};
	const struct hyb_gguf_kv *kv;
	const char *dummy;
	char arch[64], key[128], pre[64];
	uint32_t n_layer = 0;

	if (!how)
		how = &dummy;
	if (!f)
		return hyb_error_set(-EINVAL, "chat template: no model file");
	kv = hyb_gguf_find(f, "tokenizer.chat_template");
	if (kv) {
		if (kv->type != HYB_GGUF_VT_STRING)
			return hyb_error_set(-EINVAL, "tokenizer.chat_template is not a string");
		*how = "tokenizer.chat_template";
		return detect_or_fail((struct text){ kv->v.str.ptr, kv->v.str.len },
				      "the model's tokenizer.chat_template");
	}
	/* llama.cpp's one fix-up: Mistral-Small-2503 ships without a template */
	if (hyb_gguf_get_str(f, "general.architecture", arch, sizeof(arch))) {
		snprintf(key, sizeof(key), "%s.block_count", arch);
		hyb_gguf_get_u32(f, key, &n_layer);
	}
	if (hyb_gguf_get_str(f, "tokenizer.ggml.pre", pre, sizeof(pre)) && !strcmp(pre, "tekken") &&
	    n_layer == 40) {
		*how = "no tokenizer.chat_template; a tekken vocabulary with 40 layers "
		       "(Mistral-Small-2503)";
		return HYB_CHAT_MISTRAL_V7_TEKKEN;
	}
	/*
	 * llama.cpp would take chatml here, whose markers a Gemma vocabulary
	 * does not have (they become plain text): the vocabulary says better.
	 */
	for (size_t i = 0; tok && i < sizeof(marks) / sizeof(marks[0]); i++) {
		if (hyb_tok_lookup(tok, marks[i].token, strlen(marks[i].token)) >= 0) {
			*how = marks[i].how;
			return marks[i].tmpl;
		}
	}
	*how = "no tokenizer.chat_template; chatml, llama.cpp's default";
	return HYB_CHAT_CHATML;
}
