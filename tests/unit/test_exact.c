// SPDX-License-Identifier: MIT
/*
 * hyb's logits are llama.cpp's, bit for bit, on this CPU class.
 *
 * Golden values from llama.cpp (stock CPU build, GGML_NATIVE on an
 * AVX-512 VNNI Xeon, flash attention auto, F16 KV cache, 2 threads,
 * n_ctx 4096, one batch for the prompt) on models written by
 *   hybctl synth -o M --hidden 256 --ffn 512 --layers 2 --heads 4 --kv-heads 2
 *                --vocab V --type T --seed 5
 * and the prompt below, through llama.cpp's C API: one llama_decode of the
 * whole prompt with logits for every row, hashed with FNV-1a over their
 * float32 bytes (llama_get_logits_ith per row), then greedy ids (first
 * maximum) with one llama_decode per token.
 *
 * The cases cover every weight type with GQA; Q4_0/Q4_K weights llama.cpp
 * repacks (rows % 8 == 0) and, through vocab 500/501, output heads it does
 * not (rows % 8 == 4 and rows % 4 != 0); attention's small-batch path (12
 * tokens), its tiled path (70 and 200) and the single-token path that
 * splits 257+ cache positions between 2 threads (F16_long).
 *
 * Exactness is per ISA level, as llama.cpp's own results are: the test
 * runs on hyb's two AVX-512 levels (their integer sums are the same, so
 * are their logits) and skips elsewhere.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu_kernels.h"
#include "hyb/model.h"
#include "test.h"

struct golden {
	const char *name;
	uint32_t type, vocab, n_prompt;
	uint64_t hash;      /* FNV-1a of the prompt rows' logits */
	int n_ids;
	int32_t ids[80];    /* greedy continuation */
};

/* --routing random: the goldens were made on synth's plain random MoE weights */
#define QWEN3MOE "--routing random --arch qwen3moe --experts 32 --experts-used 8 --expert-ffn "
#define DEEPSEEK2 "--arch deepseek2 --layers 3 --experts 16 --experts-used 4 --expert-ffn 64 " \
		  "--head-dim 96 "

#define GPTOSS "--routing random --arch gpt-oss --experts 16 --experts-used 4 --expert-ffn 128 " \
	       "--head-dim 64"

/* RoPE variants: 96-wide heads (key_length != embd/heads), scaled 4x from 32 positions */
#define ROPE_ARGS "--head-dim 96 --rope-factor 4 --rope-orig-ctx 32 --rope-scaling "


static const struct golden cases[] = {
	{ "F32", HYB_TYPE_F32, 500, 12, 0xc5145f454b3c7690ull, 48,
	  { 172, 235, 180, 111, 288, 240, 350, 371, 297, 158, 82, 30, 488, 211, 84, 462, 117,
	    442, 182, 342, 99, 394, 84, 462, 127, 341, 248, 315, 247, 237, 98, 464, 208, 155,
	    468, 324, 232, 350, 24, 244, 193, 228, 395, 172, 334, 52, 477, 338 } },
	{ "F16", HYB_TYPE_F16, 500, 12, 0x676c69474ddee847ull, 48,
	  { 172, 235, 180, 111, 288, 240, 350, 371, 297, 158, 82, 30, 488, 211, 84, 462, 117,
	    442, 182, 342, 99, 394, 84, 462, 127, 341, 248, 315, 247, 237, 98, 464, 208, 155,
	    468, 324, 232, 350, 24, 244, 193, 228, 395, 172, 334, 52, 477, 338 } },
	{ "BF16", HYB_TYPE_BF16, 500, 12, 0x84a5bd22a8803929ull, 48,
	  { 172, 235, 180, 111, 288, 240, 350, 371, 297, 158, 82, 30, 488, 211, 84, 462, 117,
	    442, 182, 342, 99, 394, 84, 462, 127, 341, 248, 315, 247, 237, 98, 464, 208, 155,
	    468, 324, 232, 350, 24, 244, 193, 228, 395, 172, 334, 52, 477, 338 } },
	{ "Q8_0", HYB_TYPE_Q8_0, 500, 12, 0x9065083cac076363ull, 48,
	  { 172, 235, 180, 111, 288, 240, 350, 371, 297, 158, 82, 30, 488, 211, 84, 462, 117,
	    442, 182, 342, 99, 394, 84, 462, 127, 341, 248, 315, 247, 237, 464, 208, 155, 468,
	    45, 319, 198, 156, 45, 319, 198, 41, 408, 363, 272, 84, 87, 250 } },
	{ "Q4_0", HYB_TYPE_Q4_0, 500, 12, 0x3d4a294bbeb0bb1aull, 48,
	  { 172, 235, 180, 111, 288, 240, 350, 371, 297, 158, 82, 30, 180, 111, 232, 82, 394,
	    84, 462, 127, 111, 288, 240, 350, 371, 297, 158, 418, 143, 413, 474, 167, 434, 262,
	    235, 180, 41, 408, 363, 147, 286, 132, 250, 279, 304, 458, 469, 395 } },
	{ "Q4_K", HYB_TYPE_Q4_K, 500, 12, 0x84b3bc9993aaf393ull, 48,
	  { 172, 235, 381, 473, 180, 111, 252, 14, 413, 358, 445, 358, 445, 358, 445, 316, 203,
	    499, 418, 143, 413, 144, 442, 152, 103, 351, 144, 442, 0, 412, 84, 462, 29, 423, 436,
	    280, 70, 318, 62, 121, 96, 143, 159, 357, 276, 202, 364, 50 } },
	{ "Q6_K", HYB_TYPE_Q6_K, 500, 12, 0x9970c08f7ffa2393ull, 48,
	  { 172, 235, 180, 111, 288, 240, 350, 371, 297, 158, 82, 30, 488, 211, 84, 462, 117,
	    442, 182, 342, 99, 394, 84, 462, 127, 341, 248, 315, 247, 237, 464, 208, 155, 468,
	    461, 52, 477, 338, 263, 444, 285, 15, 239, 449, 268, 74, 38, 259 } },
	{ "Q4_0_v501", HYB_TYPE_Q4_0, 501, 12, 0xacb1a9e581696f09ull, 48,
	  { 172, 235, 180, 111, 288, 240, 350, 371, 297, 158, 82, 30, 180, 111, 232, 82, 394,
	    84, 462, 127, 111, 288, 240, 350, 371, 297, 158, 418, 143, 413, 474, 167, 434, 262,
	    235, 180, 41, 408, 363, 147, 286, 132, 250, 279, 304, 458, 469, 395 } },
	{ "Q4_K_v501", HYB_TYPE_Q4_K, 501, 12, 0x94986382f6954c0full, 48,
	  { 172, 235, 381, 473, 180, 111, 252, 14, 413, 358, 445, 358, 445, 358, 445, 316, 203,
	    499, 418, 143, 413, 144, 442, 152, 103, 351, 144, 442, 0, 412, 84, 462, 29, 423, 436,
	    280, 70, 318, 62, 121, 96, 143, 159, 357, 276, 202, 364, 500 } },
	{ "F16_long", HYB_TYPE_F16, 500, 200, 0xa3230238c3036e81ull, 80,
	  { 284, 282, 303, 14, 69, 413, 144, 270, 255, 297, 158, 82, 250, 279, 304, 67, 399,
	    411, 416, 475, 14, 413, 144, 379, 447, 150, 45, 319, 198, 156, 382, 197, 78, 387,
	    253, 339, 153, 237, 58, 419, 284, 282, 153, 368, 63, 402, 394, 489, 59, 382, 197, 78,
	    387, 253, 339, 153, 368, 63, 95, 265, 237, 464, 340, 68, 227, 93, 201, 53, 140, 250,
	    279, 304, 67, 185, 412, 355, 302, 175, 280, 199 } },
	{ "Q4_K_70", HYB_TYPE_Q4_K, 500, 70, 0xa198e6960d6a61c7ull, 16,
	  { 250, 279, 304, 67, 185, 412, 140, 250, 279, 304, 458, 133, 167, 434, 262, 356 } },
	{ "Q8_0_70", HYB_TYPE_Q8_0, 500, 70, 0x5ef5d51ab22c2b49ull, 16,
	  { 250, 279, 304, 458, 469, 94, 143, 13, 438, 341, 340, 68, 227, 93, 54, 165 } },
};

/*
 * The same with more hybctl synth options: RoPE variants of the F16 model,
 * and the other architectures (gemma3: 6 layers, so five sliding-window
 * layers (window 16, under the 70-token prompt) and a global one).
 */
static const struct {
	struct golden g;
	const char *synth;
} rope_cases[] = {
	{ { "F16_rope_linear", HYB_TYPE_F16, 500, 70, 0x046ad497597d9a97ull, 40,
	  { 250, 279, 304, 67, 185, 412, 355, 302, 122, 27, 314, 230, 426, 100, 85, 284, 282, 153,
	    237, 419, 284, 282, 153, 237, 100, 100, 339, 38, 259, 66, 486, 217, 351, 121, 389, 423,
	    436, 280, 70, 424 } }, ROPE_ARGS "linear" },
	{ { "F16_rope_yarn", HYB_TYPE_F16, 500, 70, 0xef84190a4a4087acull, 40,
	  { 250, 279, 304, 458, 496, 342, 99, 101, 90, 220, 127, 111, 66, 486, 217, 351, 121, 177,
	    21, 246, 22, 161, 220, 127, 341, 33, 289, 284, 282, 153, 237, 100, 339, 38, 259, 66,
	    486, 217, 351, 121 } }, ROPE_ARGS "yarn" },
	{ { "F16_rope_llama3", HYB_TYPE_F16, 500, 70, 0x51044672eced6586ull, 40,
	  { 368, 102, 104, 477, 166, 75, 408, 283, 463, 310, 134, 282, 391, 355, 208, 283, 463,
	    310, 134, 282, 391, 207, 463, 310, 134, 282, 391, 355, 208, 189, 84, 269, 249, 196, 13,
	    40, 419, 438, 273, 403 } }, ROPE_ARGS "llama3" },
	{ { "F16_qwen2", HYB_TYPE_F16, 500, 70, 0x6226ac8ce91c5ebbull, 40,
	  { 307, 406, 239, 268, 430, 128, 325, 208, 155, 468, 222, 324, 348, 372, 409, 30, 54, 257,
	    468, 222, 324, 348, 372, 409, 30, 428, 182, 384, 318, 219, 440, 325, 208, 155, 468, 222,
	    324, 348, 372, 372 } }, "--arch qwen2" },
	{ { "F16_qwen3", HYB_TYPE_F16, 500, 70, 0x58a318f01fd394bbull, 40,
	  { 194, 444, 109, 371, 206, 367, 222, 81, 72, 358, 348, 438, 62, 121, 326, 368, 334, 20,
	    249, 340, 153, 411, 445, 320, 230, 366, 185, 36, 20, 283, 488, 460, 456, 37, 428, 472,
	    333, 228, 454, 364 } }, "--arch qwen3" },
	{ { "F16_gemma3", HYB_TYPE_F16, 500, 70, 0xbe5884299c9822dfull, 40,
	  { 194, 496, 249, 234, 307, 37, 391, 152, 253, 153, 237, 103, 86, 344, 242, 420, 479, 62,
	    121, 96, 336, 334, 98, 464, 77, 416, 385, 49, 262, 356, 450, 135, 218, 220, 389, 423,
	    17, 119, 75, 21 } }, "--arch gemma3 --layers 6" },
	{ { "F16_phi3", HYB_TYPE_F16, 500, 70, 0xb231216bc03c9a5aull, 40,
	  { 98, 137, 21, 246, 466, 491, 384, 491, 384, 491, 384, 491, 384, 108, 406, 418, 479, 93,
	    271, 202, 481, 331, 358, 321, 246, 42, 134, 164, 60, 203, 121, 96, 263, 354, 331, 358,
	    321, 246, 42, 134 } }, "--arch phi3" },
	{ { "F16_phi3_longrope", HYB_TYPE_F16, 500, 70, 0x36e14acfd2bc7e82ull, 40,
	  { 440, 327, 155, 468, 241, 447, 400, 97, 473, 102, 405, 425, 192, 203, 407, 476, 97, 255,
	    118, 134, 132, 330, 294, 405, 425, 192, 203, 425, 192, 203, 425, 192, 203, 407, 328, 265,
	    175, 115, 47, 28 } }, "--arch phi3 --rope-scaling longrope --rope-orig-ctx 32" },
	/* fused QKV and gate/up sliced from repacked Q4_0 tensors */
	{ { "Q4_0_phi3", HYB_TYPE_Q4_0, 500, 70, 0xbf157d881f0a460full, 40,
	  { 98, 137, 439, 234, 343, 30, 334, 27, 93, 294, 428, 358, 321, 380, 369, 159, 296, 42,
	    134, 164, 272, 84, 257, 184, 0, 263, 172, 323, 293, 63, 172, 323, 293, 224, 112, 74, 461,
	    71, 57, 466 } }, "--arch phi3" },
	/*
	 * Mixtures of experts (docs/MOE.md): 70 tokens over 32 experts, 8 each,
	 * give most experts 8+ tokens, so K-quant experts take llama.cpp's tiled
	 * path while the others sum column by column; F16 is qwen2moe's gated
	 * shared expert; llama with experts is Mixtral's layout.
	 */
	{ { "Q8_0_qwen3moe", HYB_TYPE_Q8_0, 500, 70, 0x6ab279776fcad14dull, 40,
	  { 98, 438, 63, 368, 337, 14, 271, 114, 232, 81, 199, 424, 139, 316, 461, 462, 206, 117,
	  44, 180, 466, 56, 87, 0, 312, 153, 302, 175, 341, 419, 373, 15, 377, 459, 39, 304, 458,
	  299, 247, 178 } }, QWEN3MOE "128" },
	{ { "Q4_0_qwen3moe", HYB_TYPE_Q4_0, 500, 70, 0x377e714917ef6712ull, 40,
	  { 98, 438, 262, 356, 358, 257, 38, 259, 478, 409, 201, 294, 351, 121, 52, 409, 201, 294,
	  443, 379, 233, 348, 438, 50, 408, 234, 307, 37, 391, 389, 88, 453, 433, 49, 262, 356,
	  450, 135, 392, 207 } }, QWEN3MOE "128" },
	{ { "Q4_K_qwen3moe", HYB_TYPE_Q4_K, 500, 70, 0x77143e017cf5c77cull, 40,
	  { 113, 241, 95, 331, 64, 22, 481, 419, 335, 33, 393, 137, 236, 138, 469, 240, 148, 112,
	  215, 355, 29, 29, 29, 29, 29, 29, 29, 29, 29, 29, 29, 29, 29, 29, 29, 29, 29, 29, 29, 29
	  } }, QWEN3MOE "256" },
	{ { "Q6_K_qwen3moe", HYB_TYPE_Q6_K, 500, 70, 0x3b3523cab227d99cull, 40,
	  { 113, 241, 303, 14, 271, 240, 89, 24, 274, 209, 15, 128, 90, 340, 68, 227, 202, 481,
	  234, 307, 3, 228, 425, 249, 340, 68, 227, 202, 481, 234, 95, 482, 211, 438, 262, 356,
	  450, 135, 25, 349 } }, QWEN3MOE "256" },
	{ { "F16_qwen2moe", HYB_TYPE_F16, 500, 70, 0xcebaffce104ec86bull, 40,
	  { 403, 381, 17, 142, 182, 342, 259, 17, 142, 259, 211, 92, 17, 142, 182, 342, 259, 492,
	  240, 403, 376, 204, 368, 334, 497, 6, 381, 17, 142, 174, 224, 421, 240, 390, 222, 17,
	  142, 174, 224, 421 } },
	  "--routing random --arch qwen2moe --experts 16 --experts-used 4 --expert-ffn 64 "
	  "--shared-experts 2" },
	{ { "Q4_0_mixtral", HYB_TYPE_Q4_0, 500, 70, 0xe52450192231481aull, 40,
	  { 219, 86, 392, 233, 426, 454, 390, 77, 186, 381, 416, 395, 353, 214, 327, 487, 339,
	  178, 233, 426, 94, 377, 387, 100, 171, 254, 275, 190, 443, 168, 79, 461, 462, 98, 35,
	  318, 219, 86, 392, 233 } }, "--routing random --experts 8 --experts-used 2" },
	{ { "IQ4_XS_mixtral", HYB_TYPE_IQ4_XS, 500, 70, 0xbbe421eeac73ecdbull, 40,
	  { 219, 86, 392, 233, 253, 7, 58, 119, 75, 21, 246, 104, 349, 234, 307, 414, 428, 472,
	  292, 193, 454, 139, 196, 256, 181, 9, 216, 491, 490, 107, 428, 160, 286, 144, 298, 325,
	  208, 49, 57, 428 } }, "--routing random --experts 8 --experts-used 2" },
	/*
	 * DeepSeek's latent attention (arch_deepseek2.c, attention_mla.c): V2
	 * with a q bottleneck; V3's routing (sigmoid scores, selection bias,
	 * expert groups, renormalised and scaled weights) in Q4_0, whose 3-D
	 * per-head tensors llama.cpp leaves unrepacked; V2-Lite (27 layers, no q
	 * bottleneck) with YaRN and its log multiplier; K-quant heads of 256.
	 * Every file has one dense layer first and two shared experts (synth's
	 * plain random weights: its routing design does not cover deepseek2).
	 */
	{ { "Q8_0_deepseek2", HYB_TYPE_Q8_0, 500, 70, 0x7a886b44f6881866ull, 40,
	  { 394, 273, 358, 279, 207, 267, 112, 258, 98, 238, 254, 414, 427, 101, 37, 121, 229,
	  185, 27, 56, 284, 388, 299, 143, 14, 413, 400, 115, 443, 293, 292, 459, 238, 254, 414,
	  471, 497, 185, 369, 213 } },
	  DEEPSEEK2 "--q-lora 64" },
	{ { "Q4_0_deepseek2_v3", HYB_TYPE_Q4_0, 500, 70, 0x78e170969aae9294ull, 40,
	  { 394, 408, 367, 211, 59, 484, 171, 396, 81, 340, 466, 47, 71, 98, 363, 264, 363, 424,
	  290, 247, 25, 350, 178, 233, 264, 363, 264, 92, 341, 374, 309, 211, 57, 291, 280, 70,
	  370, 73, 179, 133 } },
	  DEEPSEEK2 "--q-lora 64 --v3 --expert-groups 4:2" },
	{ { "F16_deepseek2_lite_yarn", HYB_TYPE_F16, 500, 70, 0x0339ab3f04ac3a67ull, 40,
	  { 314, 123, 412, 13, 342, 428, 278, 19, 331, 342, 159, 428, 278, 19, 201, 82, 120, 133,
	  304, 412, 210, 159, 428, 160, 27, 163, 27, 179, 464, 377, 201, 82, 120, 415, 345, 4,
	  340, 119, 304, 331 } },
	  DEEPSEEK2 "--layers 27 --rope-scaling yarn --rope-factor 40 --rope-orig-ctx 64" },
	{ { "Q4_K_deepseek2", HYB_TYPE_Q4_K, 500, 70, 0x04dec8bff19362a7ull, 40,
	  { 194, 444, 27, 69, 352, 311, 409, 14, 49, 226, 11, 66, 441, 87, 27, 268, 421, 55, 396,
	  497, 257, 38, 259, 66, 441, 87, 27, 98, 464, 72, 109, 229, 87, 27, 268, 421, 116, 73,
	  142, 100 } },
	  "--arch deepseek2 --experts 8 --experts-used 2 --expert-ffn 256 --heads 2 "
	  "--head-dim 320 --mla-rope 64 --q-lora 256 --kv-lora 256" },
	/* gate and up of the experts in one tensor (ffn_gate_up_exps) */
	{ { "Q4_0_deepseek2_gate_up", HYB_TYPE_Q4_0, 500, 70, 0x99bb6732725fad78ull, 40,
	  { 394, 84, 283, 453, 63, 235, 215, 292, 483, 215, 292, 483, 453, 242, 358, 69, 55, 396,
	  46, 3, 403, 367, 211, 438, 117, 161, 360, 432, 256, 394, 419, 335, 19, 192, 52, 290,
	  450, 135, 204, 443 } },
	  DEEPSEEK2 "--q-lora 64 --gate-up-exps" },
	/*
	 * GLM-4.5 (arch_glm4moe.c): biased GQA, NeoX RoPE on half of each head,
	 * post_attention_norm before the FFN, one dense layer, sigmoid routing
	 * with a selection bias and renormalised weights, a shared expert.
	 */
	{ { "Q4_K_glm4moe", HYB_TYPE_Q4_K, 500, 70, 0xc91fed2ec4c453e6ull, 40,
	  { 201, 410, 159, 22, 384, 477, 201, 410, 159, 22, 384, 457, 145, 133, 281, 404, 415,
	  281, 404, 415, 281, 404, 415, 281, 404, 415, 213, 141, 282, 254, 121, 404, 415, 281,
	  404, 186, 201, 2, 342, 331 } },
	  "--routing random --arch glm4moe --layers 3 --experts 16 --experts-used 4 "
	  "--expert-ffn 256" },
	/* dots.llm1: qwen3's attention, sigmoid routing scaled by 2.5, a shared expert */
	{ { "Q8_0_dots1", HYB_TYPE_Q8_0, 500, 70, 0xa936cedda8d46f07ull, 40,
	  { 456, 72, 353, 199, 433, 346, 468, 474, 355, 260, 341, 89, 431, 401, 411, 487, 132, 21,
	  96, 490, 278, 15, 184, 0, 295, 51, 198, 197, 358, 207, 214, 313, 382, 382, 382, 382,
	  424, 164, 132, 304 } },
	  "--routing random --arch dots1 --layers 3 --experts 16 --experts-used 4 "
	  "--expert-ffn 64" },
	/* OLMoE: Q and K normed over their whole projections, experts of --ffn */
	{ { "Q8_0_olmoe", HYB_TYPE_Q8_0, 500, 70, 0xe3510d54af3c6423ull, 40,
	  { 390, 419, 373, 66, 486, 299, 247, 178, 347, 29, 89, 406, 163, 57, 337, 326, 368, 337,
	  326, 293, 298, 325, 43, 99, 484, 171, 57, 337, 14, 271, 240, 458, 299, 247, 237, 103,
	  439, 340, 420, 370 } },
	  "--routing random --arch olmoe --experts 16 --experts-used 4 --ffn 128" },
	/*
	 * MXFP4 (gpt-oss's expert type) in every matrix: the layers' rows (% 8
	 * == 0) as llama.cpp's repacked GEMV/GEMM sums them, the 500-row head
	 * as its vec_dot, the embeddings dequantized
	 */
	{ { "MXFP4", HYB_TYPE_MXFP4, 500, 70, 0xc9a34905a740ca8bull, 40,
	  { 194, 407, 201, 294, 212, 475, 14, 413, 144, 219, 143, 13, 438, 341, 248, 81, 258, 0,
	  412, 84, 483, 40, 122, 27, 314, 230, 426, 44, 462, 29, 149, 415, 365, 294, 212, 60, 409,
	  151, 484, 417 } }, "" },
	/* 288 wide (9 blocks): the head's vec_dot ends with an odd block */
	{ { "MXFP4_odd_blocks", HYB_TYPE_MXFP4, 500, 70, 0x49d60ef442da8adaull, 40,
	  { 394, 424, 300, 137, 236, 307, 125, 464, 368, 334, 435, 173, 71, 197, 78, 425, 29, 423,
	  436, 182, 176, 465, 382, 83, 369, 450, 424, 30, 488, 154, 147, 107, 104, 174, 257, 38,
	  349, 4, 297, 158 } }, "--hidden 288 --ffn 544" },
	/* MXFP4 experts, as gpt-oss's: llama.cpp's mul_mat_id on the repacked experts */
	{ { "MXFP4_qwen3moe", HYB_TYPE_MXFP4, 500, 70, 0x44fec050f0b4863eull, 40,
	  { 98, 89, 98, 89, 98, 438, 262, 356, 59, 382, 239, 498, 174, 435, 433, 49, 4, 62, 353,
	  165, 113, 455, 156, 413, 403, 376, 204, 442, 182, 384, 23, 78, 456, 309, 458, 299, 247,
	  178, 206, 416 } }, QWEN3MOE "128" },
	/*
	 * gpt-oss (arch_gptoss.c): biased attention with a sink per head, layer
	 * 0 a 16-position window (under the 70-token prompt), biased experts with
	 * the clamped SwiGLU, weights the softmax of the chosen logits
	 */
	{ { "Q8_0_gptoss", HYB_TYPE_Q8_0, 500, 70, 0xf97f1114c9e8c955ull, 40,
	  { 130, 2, 469, 145, 16, 416, 134, 259, 424, 448, 98, 460, 169, 160, 246, 259, 480, 127,
	  272, 246, 39, 259, 424, 448, 285, 2, 469, 247, 387, 246, 53, 424, 448, 285, 2, 469, 407,
	  153, 153, 153 } }, GPTOSS },
	/*
	 * ... its experts in MXFP4 as its files have them, and 200 + 80 positions:
	 * decode rows past 256 split between 2 threads, the sink joining the
	 * first chunk, which the window masks entirely past position 271
	 */
	{ { "MXFP4_gptoss_long", HYB_TYPE_MXFP4, 500, 200, 0xac4e4ec97d3ecc51ull, 80,
	  { 466, 272, 98, 432, 58, 160, 172, 407, 448, 285, 2, 469, 104, 139, 300, 53, 424, 448,
	  285, 2, 469, 379, 209, 311, 490, 311, 490, 311, 490, 311, 490, 311, 490, 164, 153, 153,
	  153, 153, 153, 153, 153, 153, 153, 153, 209, 379, 153, 16, 259, 424, 16, 259, 416, 424,
	  153, 16, 259, 424, 269, 374, 160, 246, 16, 341, 304, 160, 246, 16, 341, 259, 143, 448,
	  246, 16, 341, 259, 153, 386, 313, 246 } }, GPTOSS },
};

static uint64_t fnv1a(const void *p, size_t n)
{
	const uint8_t *b = p;
	uint64_t h = 0xcbf29ce484222325ull;

	for (size_t i = 0; i < n; i++) {
		h ^= b[i];
		h *= 0x100000001b3ull;
	}
	return h;
}

static void run_case_with(const struct golden *g, const char *synth)
{
	const struct hyb_cpu_kernels *k = hyb_cpu_best();
	char path[512], cmd[1024];
	struct hyb_ctx_params cp = { .n_ctx = 512, .n_threads = 2, .n_batch = 512 };
	int32_t toks[200];
	float *lg;

	/* the AVX-512 levels without VNNI and with AMX form the same integers: the same logits */
	if (k->isa < HYB_ISA_AVX512)
		SKIP("golden logits are llama.cpp's on AVX-512; this run uses %s", k->name);
	if (access("build/hybctl", X_OK))
		SKIP("build/hybctl not built (run from the repository root after make)");
	snprintf(path, sizeof(path), "%s/%s.gguf", hyb_test_tmpdir(), g->name);
	snprintf(cmd, sizeof(cmd), "build/hybctl synth -o %s --hidden 256 --ffn 512 --layers 2 "
		 "--heads 4 --kv-heads 2 --vocab %u --type %s --seed 5 -t 2 %s >/dev/null", path,
		 g->vocab, hyb_type_name(g->type), synth);
	CHECK_MSG(system(cmd) == 0, "%s failed", cmd);

	struct hyb_model *m = hyb_model_load(path);

	CHECK_MSG(m, "%s: %s", path, hyb_last_error());
	struct hyb_ctx *c = hyb_ctx_new(m, &cp);

	CHECK_MSG(c, "%s", hyb_last_error());
	toks[0] = 1;
	for (uint32_t i = 1; i < g->n_prompt; i++)
		toks[i] = (int32_t)((i * 37 + 11) % 497 + 3);
	lg = malloc(sizeof(float) * g->vocab * g->n_prompt);
	CHECK(lg);
	CHECK(!hyb_ctx_eval(c, toks, g->n_prompt, lg, true));
	const uint64_t h = fnv1a(lg, sizeof(float) * g->vocab * g->n_prompt);

	CHECK_MSG(h == g->hash, "%s: prompt logits hash %016llx, llama.cpp %016llx", g->name,
		  (unsigned long long)h, (unsigned long long)g->hash);
	int32_t next = hyb_test_argmax(lg + (size_t)(g->n_prompt - 1) * g->vocab, g->vocab);

	for (int i = 0; i < g->n_ids; i++) {
		CHECK_MSG(next == g->ids[i], "%s: greedy token %d is %d, llama.cpp's %d", g->name, i,
			  next, g->ids[i]);
		CHECK(!hyb_ctx_eval(c, &next, 1, lg, false));
		next = hyb_test_argmax(lg, g->vocab);
	}
	free(lg);
	hyb_ctx_free(c);
	hyb_model_free(m);
}

static void run_case(const struct golden *g)
{
	run_case_with(g, "");
}

TEST(exact_f32) { run_case(&cases[0]); }
TEST(exact_f16) { run_case(&cases[1]); }
TEST(exact_bf16) { run_case(&cases[2]); }
TEST(exact_q8_0) { run_case(&cases[3]); }
TEST(exact_q4_0) { run_case(&cases[4]); }
TEST(exact_q4_k) { run_case(&cases[5]); }
TEST(exact_q6_k) { run_case(&cases[6]); }
TEST(exact_q4_0_unrepacked_head) { run_case(&cases[7]); }
TEST(exact_q4_k_unrepacked_head) { run_case(&cases[8]); }
TEST(exact_f16_long_context) { run_case(&cases[9]); }
TEST(exact_q4_k_tiled_attention) { run_case(&cases[10]); }
TEST(exact_q8_0_tiled_attention) { run_case(&cases[11]); }
TEST(exact_rope_linear_head_dim) { run_case_with(&rope_cases[0].g, rope_cases[0].synth); }
TEST(exact_rope_yarn) { run_case_with(&rope_cases[1].g, rope_cases[1].synth); }
TEST(exact_rope_llama3_freqs) { run_case_with(&rope_cases[2].g, rope_cases[2].synth); }
TEST(exact_arch_qwen2) { run_case_with(&rope_cases[3].g, rope_cases[3].synth); }
TEST(exact_arch_qwen3) { run_case_with(&rope_cases[4].g, rope_cases[4].synth); }
TEST(exact_arch_gemma3_sliding_window) { run_case_with(&rope_cases[5].g, rope_cases[5].synth); }
TEST(exact_arch_phi3) { run_case_with(&rope_cases[6].g, rope_cases[6].synth); }
TEST(exact_arch_phi3_longrope) { run_case_with(&rope_cases[7].g, rope_cases[7].synth); }
TEST(exact_arch_phi3_fused_q4_0) { run_case_with(&rope_cases[8].g, rope_cases[8].synth); }
TEST(exact_moe_qwen3moe_q8_0) { run_case_with(&rope_cases[9].g, rope_cases[9].synth); }
TEST(exact_moe_qwen3moe_q4_0_repacked) { run_case_with(&rope_cases[10].g, rope_cases[10].synth); }
TEST(exact_moe_qwen3moe_q4_k) { run_case_with(&rope_cases[11].g, rope_cases[11].synth); }
TEST(exact_moe_qwen3moe_q6_k_tiled) { run_case_with(&rope_cases[12].g, rope_cases[12].synth); }
TEST(exact_moe_qwen2moe_shared_expert) { run_case_with(&rope_cases[13].g, rope_cases[13].synth); }
TEST(exact_moe_mixtral_q4_0) { run_case_with(&rope_cases[14].g, rope_cases[14].synth); }
TEST(exact_moe_mixtral_iq4_xs) { run_case_with(&rope_cases[15].g, rope_cases[15].synth); }
TEST(exact_deepseek2_mla_q8_0) { run_case_with(&rope_cases[16].g, rope_cases[16].synth); }
TEST(exact_deepseek2_v3_routing_q4_0) { run_case_with(&rope_cases[17].g, rope_cases[17].synth); }
TEST(exact_deepseek2_lite_yarn_f16) { run_case_with(&rope_cases[18].g, rope_cases[18].synth); }
TEST(exact_deepseek2_q4_k) { run_case_with(&rope_cases[19].g, rope_cases[19].synth); }
TEST(exact_deepseek2_gate_up_exps) { run_case_with(&rope_cases[20].g, rope_cases[20].synth); }
TEST(exact_glm4moe_q4_k) { run_case_with(&rope_cases[21].g, rope_cases[21].synth); }
TEST(exact_dots1_q8_0) { run_case_with(&rope_cases[22].g, rope_cases[22].synth); }
TEST(exact_olmoe_q8_0) { run_case_with(&rope_cases[23].g, rope_cases[23].synth); }
TEST(exact_mxfp4) { run_case_with(&rope_cases[24].g, rope_cases[24].synth); }
TEST(exact_mxfp4_odd_blocks) { run_case_with(&rope_cases[25].g, rope_cases[25].synth); }
TEST(exact_moe_mxfp4_experts) { run_case_with(&rope_cases[26].g, rope_cases[26].synth); }
TEST(exact_gptoss_q8_0) { run_case_with(&rope_cases[27].g, rope_cases[27].synth); }
TEST(exact_gptoss_mxfp4_long) { run_case_with(&rope_cases[28].g, rope_cases[28].synth); }
