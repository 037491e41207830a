/* SPDX-License-Identifier: MIT */
/*
 * Chat templates: a conversation of {role, content} messages as the prompt
 * text a model was trained on. hyb has no Jinja engine; like llama.cpp's
 * llama_chat_apply_template it knows a table of templates by name and tells
 * which one a model's tokenizer.chat_template is from marker strings in its
 * text. Output is byte for byte what llama.cpp's llm_chat_apply_template
 * gives. Tokenize it with HYB_TOKENIZE_PARSE_SPECIAL (hyb/tokenizer.h) so the
 * markers become their control tokens. docs/CHAT.md has the details.
 *
 * Failures return a negative errno with a one-line message in
 * hyb_last_error() (hyb/error.h).
 */
#ifndef HYB_CHAT_H
#define HYB_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include "hyb/error.h"

#ifdef __cplusplus
extern "C" {
#endif

struct hyb_gguf_file;
struct hyb_tokenizer;

/* The templates, named as llama.cpp names them (hyb_chat_template_name). */
enum hyb_chat_template {
	HYB_CHAT_CHATML,
	HYB_CHAT_LLAMA2,
	HYB_CHAT_LLAMA2_SYS,
	HYB_CHAT_LLAMA2_SYS_BOS,
	HYB_CHAT_LLAMA2_SYS_STRIP,
	HYB_CHAT_MISTRAL_V1,
	HYB_CHAT_MISTRAL_V3,
	HYB_CHAT_MISTRAL_V3_TEKKEN,
	HYB_CHAT_MISTRAL_V7,
	HYB_CHAT_MISTRAL_V7_TEKKEN,
	HYB_CHAT_PHI3,
	HYB_CHAT_PHI4,
	HYB_CHAT_FALCON3,
	HYB_CHAT_ZEPHYR,
	HYB_CHAT_MONARCH,
	HYB_CHAT_GEMMA,
	HYB_CHAT_ORION,
	HYB_CHAT_OPENCHAT,
	HYB_CHAT_VICUNA,
	HYB_CHAT_VICUNA_ORCA,
	HYB_CHAT_DEEPSEEK,
	HYB_CHAT_DEEPSEEK2,
	HYB_CHAT_DEEPSEEK3,
	HYB_CHAT_DEEPSEEK_OCR,
	HYB_CHAT_COMMAND_R,
	HYB_CHAT_LLAMA3,
	HYB_CHAT_CHATGLM3,
	HYB_CHAT_CHATGLM4,
	HYB_CHAT_GLMEDGE,
	HYB_CHAT_MINICPM,
	HYB_CHAT_EXAONE3,
	HYB_CHAT_EXAONE4,
	HYB_CHAT_EXAONE_MOE,
	HYB_CHAT_RWKV_WORLD,
	HYB_CHAT_GRANITE,
	HYB_CHAT_GRANITE_4_0,
	HYB_CHAT_GRANITE_4_1,
	HYB_CHAT_GIGACHAT,
	HYB_CHAT_MEGREZ,
	HYB_CHAT_YANDEX,
	HYB_CHAT_BAILING,
	HYB_CHAT_BAILING_THINK,
	HYB_CHAT_BAILING2,
	HYB_CHAT_LLAMA4,
	HYB_CHAT_SMOLVLM,
	HYB_CHAT_DOTS1,
	HYB_CHAT_HUNYUAN_MOE,
	HYB_CHAT_GPT_OSS,
	HYB_CHAT_HUNYUAN_DENSE,
	HYB_CHAT_HUNYUAN_VL,
	HYB_CHAT_KIMI_K2,
	HYB_CHAT_SEED_OSS,
	HYB_CHAT_GROK2,
	HYB_CHAT_PANGU_EMBEDDED,
	HYB_CHAT_SOLAR_OPEN,
	HYB_CHAT_N_TEMPLATES
};

struct hyb_chat_msg {
	const char *role;    /* "system", "user", "assistant" (any text; templates key on these) */
	const char *content;
};

/* The template called name ("chatml", "llama3", ...); -ENOENT naming the choices. */
int hyb_chat_template_from_name(const char *name);
/* A template's name; NULL for an id out of range. */
const char *hyb_chat_template_name(int tmpl);
/* Every name, ", "-separated (help texts, error messages). */
const char *hyb_chat_template_names(void);

/*
 * The template of a tokenizer.chat_template text (or a name), found as
 * llama.cpp's llm_chat_detect_template finds it. -ENOENT when the text is
 * none hyb knows; the message shows its start and names the choices.
 */
int hyb_chat_template_detect(const char *text);

/*
 * The template to use for a model file: its tokenizer.chat_template when
 * present (detected as above; -ENOENT when unknown). Without one: llama.cpp's
 * one fix-up (a tekken vocabulary with 40 layers: mistral-v7-tekken), then
 * hyb looks for a template's marker tokens in the vocabulary (gemma's
 * <start_of_turn>, llama3's <|start_header_id|>, chatml's <|im_start|>), and
 * else chatml, llama.cpp's default. *how (may be NULL) gets a static phrase
 * saying where the choice came from. tok may be NULL (no vocabulary check).
 */
int hyb_chat_template_for_model(const struct hyb_gguf_file *f, const struct hyb_tokenizer *tok,
				const char **how);

/*
 * The conversation msgs[0..n) in template tmpl; add_assistant ends it with
 * the start of an assistant turn (the generation prompt). Writes at most cap
 * bytes (NUL-terminated when there is room) and returns the full length, as
 * snprintf does. -EINVAL for a bad template id or a message without role or
 * content, -EILSEQ for a role or content that is not valid UTF-8 (the message
 * names which and the byte), -E2BIG past INT_MAX bytes.
 */
int hyb_chat_format(int tmpl, const struct hyb_chat_msg *msgs, size_t n, bool add_assistant,
		    char *buf, int cap);

#ifdef __cplusplus
}
#endif

#endif
