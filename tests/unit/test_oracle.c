// SPDX-License-Identifier: MIT
/*
 * The forward pass against an independent reference: tests/oracle/
 * check_logits.py runs `hyb logits` and compares every position's logits
 * with a float64 Python implementation of the llama graph (numpy + gguf in
 * .venv, made by tests/oracle/venv.sh). Each weight type gets a small
 * synthetic model from `hybctl synth`, checked through the batched prefill
 * and through token-by-token decode; --self-test makes each run also prove
 * that its tolerance is tight enough to fail on a corrupted logit, the wrong
 * RoPE type or the wrong activation.
 *
 * The other architectures (qwen2, qwen3, gemma3 with its sliding window)
 * and the RoPE variants (linear, YaRN, Llama 3.1 rope_freqs, a head size
 * other than embd/heads) are checked the same way on a 40-token prompt,
 * longer than gemma3's window; there --self-test also proves that a
 * reference without each of the model's features fails, and the
 * oracle_rejects_* tests show end to end that check_logits.py exits 1 when
 * its reference is told to leave one out (--ref-omit).
 *
 * The mixtures of experts (Mixtral-layout llama, qwen2moe, qwen3moe) are
 * checked the same way, with one caveat: routing is a discrete choice, so
 * wherever a token's K-th and (K+1)-th router logits are closer than the
 * engine's legitimate error, the engine may pick another expert and miss by
 * 0.5-1.2 std, far beyond any tolerance (seen: Q4_K Mixtral, seed 63, 40
 * tokens: at position 29 the gap was 3.6e-3, llama.cpp-like rounding moves
 * those logits by ~2e-2 and picks expert 1 for 7, and hyb missed by 0.72
 * std, as the emulated reference did). Such near-ties are common where
 * activations are quantized (Q8_0 / Q8_K rounding moves router logits by
 * 1e-2..5e-2: most seeds of a 40-token prompt have one), so each MoE model
 * here uses a seed where every token's gap is at least 1.8x twice the
 * largest change the emulated roundings make to its router logits
 * (check_logits.py --expect names positions where they change the choice),
 * and quantized experts get the 12-token prompt.
 *
 * Skips (saying why) when the Python environment cannot be built, e.g. with
 * no network for PyPI.
 */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "test.h"

#define ORACLE_PY ".venv/bin/python tests/oracle/check_logits.py"

static const char *build_dir(void)
{
	const char *b = getenv("HYB_BUILD");

	return b && *b ? b : "build";
}

static void need_tools(void)
{
	char p[512];

	snprintf(p, sizeof(p), "%s/hyb", build_dir());
	CHECK_MSG(access(p, X_OK) == 0, "%s is missing (run make all)", p);
	snprintf(p, sizeof(p), "%s/hybctl", build_dir());
	CHECK_MSG(access(p, X_OK) == 0, "%s is missing (run make all)", p);
}

/* Synthesizes DIR/NAME.gguf with hybctl; returns its path. */
static const char *synth(const char *name, const char *opts)
{
	static char model[512];
	char log[512];
	int rc;

	snprintf(model, sizeof(model), "%s/%s.gguf", hyb_test_tmpdir(), name);
	snprintf(log, sizeof(log), "%s/synth.log", hyb_test_tmpdir());
	rc = hyb_test_sh(log, "%s/hybctl synth -o '%s' --hidden 256 --ffn 512 --layers 2 "
			"--heads 4 --kv-heads 2 --vocab 512 -t 2 %s", build_dir(), model, opts);
	if (rc != 0)
		hyb_test_show_log(log);
	CHECK_MSG(rc == 0, "hybctl synth %s failed (exit %d)", opts, rc);
	return model;
}

/* check_logits.py on MODEL; returns its exit status (0 pass, 1 mismatch). */
static int oracle(const char *model, const char *tokens, bool decode, const char *extra,
		  bool show)
{
	char log[512];
	int rc;

	snprintf(log, sizeof(log), "%s/oracle-%s.log", hyb_test_tmpdir(),
		 decode ? "decode" : "prefill");
	rc = hyb_test_sh(log, ORACLE_PY " '%s' --hyb %s/hyb --tokens %s -t 2 %s %s", model,
			build_dir(), tokens, decode ? "--decode" : "", extra);
	if (rc != 0 && show)
		hyb_test_show_log(log);
	return rc;
}

/* 12 ids below the synthetic vocabulary size (512), BOS first. */
static const char synth_tokens[] = "1,17,300,42,5,511,256,99,3,128,77,400";

static void check_synth(const char *name, const char *opts)
{
	const char *model;
	int rc;

	need_tools();
	hyb_test_need_venv();
	model = synth(name, opts);
	rc = oracle(model, synth_tokens, false, "--self-test", true);
	CHECK_MSG(rc == 0, "prefill logits differ from the reference (%s, exit %d)", opts, rc);
	rc = oracle(model, synth_tokens, true, "--self-test", true);
	CHECK_MSG(rc == 0, "decode logits differ from the reference (%s, exit %d)", opts, rc);
}

/* "<s> Hello world, my name is John and" in the LLaMA-2 vocabulary, and more. */
static const char tiny_tokens[] = "1,15043,3186,29892,590,1024,338,2259,322,306,29871,13";

static void check_tiny(bool decode)
{
	const char *model = hyb_test_shared("models/llama-2-tiny-random.gguf");
	int rc;

	if (access(model, R_OK))
		SKIP("%s not found", model);
	need_tools();
	hyb_test_need_venv();
	rc = oracle(model, tiny_tokens, decode, "--self-test", true);
	CHECK_MSG(rc == 0, "%s logits of the tiny llama differ from the reference (exit %d)",
		  decode ? "decode" : "prefill", rc);
}

TEST(oracle_tiny_prefill)
{
	check_tiny(false);
}

TEST(oracle_tiny_decode)
{
	check_tiny(true);
}

/* Between them the types cover every activation, both RoPE types, tied heads and GQA. */
TEST(oracle_synth_F32)
{
	check_synth("f32", "--type F32 --seed 11 --rope-neox");
}

TEST(oracle_synth_F16)
{
	check_synth("f16", "--type F16 --seed 12 --act relu --tied");
}

TEST(oracle_synth_BF16)
{
	check_synth("bf16", "--type BF16 --seed 13 --act dlrelu");
}

TEST(oracle_synth_Q8_0)
{
	check_synth("q8_0", "--type Q8_0 --seed 14");
}

TEST(oracle_synth_Q4_0)
{
	check_synth("q4_0", "--type Q4_0 --seed 15 --act relu2 --rope-neox");
}

TEST(oracle_synth_Q4_K)
{
	check_synth("q4_k", "--type Q4_K --seed 16 --tied");
}

TEST(oracle_synth_Q6_K)
{
	check_synth("q6_k", "--type Q6_K --seed 17 --act dlrelu --rope-neox");
}

/*
 * The check must be able to fail end to end: against a reference told to use
 * the other RoPE type, check_logits.py has to exit 1 (mismatch), not 0 and
 * not 2 (error).
 */
TEST(oracle_rejects_wrong_rope)
{
	const char *model;
	int rc;

	need_tools();
	hyb_test_need_venv();
	model = synth("wrong_rope", "--type F32 --seed 18");
	rc = oracle(model, synth_tokens, false, "--ref-rope neox", false);
	CHECK_MSG(rc == 1, "check_logits.py with the wrong RoPE type exited %d, want 1", rc);
}

/*
 * 40 ids, (37 i + 1) mod 512: longer than the window of the gemma3 models
 * (--swa 8), so that their local layers mask keys the global ones see.
 */
static const char long_tokens[] = "1,38,75,112,149,186,223,260,297,334,371,408,445,482,7,44,81,"
				  "118,155,192,229,266,303,340,377,414,451,488,13,50,87,124,"
				  "161,198,235,272,309,346,383,420";

/* Prefill and decode of long_tokens against the reference, with --self-test and EXTRA. */
static void check_long(const char *name, const char *opts, const char *extra)
{
	const char *model;
	char args[256];
	int rc;

	need_tools();
	hyb_test_need_venv();
	model = synth(name, opts);
	snprintf(args, sizeof(args), "--self-test %s", extra);
	rc = oracle(model, long_tokens, false, args, true);
	CHECK_MSG(rc == 0, "prefill logits differ from the reference (%s, exit %d)", opts, rc);
	rc = oracle(model, long_tokens, true, args, true);
	CHECK_MSG(rc == 0, "decode logits differ from the reference (%s, exit %d)", opts, rc);
}

#define GEMMA3 "--arch gemma3 --layers 6 --swa 8"

TEST(oracle_qwen2)
{
	check_long("qwen2", "--arch qwen2 --type F16 --seed 21", "");
}

TEST(oracle_qwen3)
{
	check_long("qwen3", "--arch qwen3 --type Q8_0 --seed 22", "");
}

/* Q, K, V in one attn_qkv and gate, up in one ffn_up, sliced */
TEST(oracle_phi3)
{
	check_long("phi3", "--arch phi3 --type Q4_0 --seed 24", "");
}

/* 6 layers: 0-4 local (window 8, rope.freq_base_swa), 5 global */
TEST(oracle_gemma3)
{
	check_long("gemma3", GEMMA3 " --type F32 --seed 23", "");
}

/* as Gemma 3 4B+: linear scaling on the global layers only */
TEST(oracle_gemma3_rope_linear)
{
	check_long("gemma3_linear", GEMMA3 " --type Q4_K --seed 24 --rope-scaling linear", "");
}

TEST(oracle_rope_linear)
{
	check_long("rope_linear", "--type F32 --seed 25 --rope-scaling linear --rope-factor 4", "");
}

/* original context 256: the ramp spans rotary pairs 0..13 of 32 */
TEST(oracle_rope_yarn)
{
	check_long("rope_yarn", "--type F16 --seed 26 --rope-scaling yarn --rope-orig-ctx 256", "");
}

/*
 * The file's rope_freqs.weight, and then instead the factors the reference
 * computes from HF's llama3 formula (factor 8, original context 64, so that
 * most pairs are scaled within 40 positions): both must pass.
 */
TEST(oracle_rope_llama3)
{
	check_long("rope_llama3", "--type Q8_0 --seed 27 --rope-scaling llama3 --rope-orig-ctx 64",
		   "");
	check_long("rope_llama3", "--type Q8_0 --seed 27 --rope-scaling llama3 --rope-orig-ctx 64",
		   "--ref-llama3 8,64");
}

/* attention.key_length 96 with 256 / 4 heads: Q is 384 wide */
TEST(oracle_head_dim_96)
{
	check_long("head_dim_96", "--type BF16 --seed 28 --head-dim 96 --rope-neox", "");
}

/*
 * Mixtral's layout: arch llama with 8 experts, 2 per token, renormalised.
 * synth's plain random routing (the seeds were chosen on it). Seeds chosen for decisive routing (see the top comment): the smallest
 * router gap is 22x (F32, 40 tokens), 3.3x (Q8_0) and 1.8x (Q4_K, 12 tokens)
 * twice the router-logit change of llama.cpp-like rounding.
 */
#define MIXTRAL "--routing random --experts 8 --experts-used 2"

TEST(oracle_mixtral)
{
	check_long("mixtral", MIXTRAL " --type F32 --seed 311", "");
	check_synth("mixtral_q8_0", MIXTRAL " --type Q8_0 --seed 249");
	check_synth("mixtral_q4_k", MIXTRAL " --type Q4_K --seed 227");
}

/*
 * 32 experts, 8 per token, renormalised; Q/K norms. Router gaps >= 2.7x. F16,
 * not qwen3's Q8_0: the 8th and 9th of 32 logits are close, and Q8_0 rounding
 * changed some token's choice on 18 of 20 seeds.
 */
#define QWEN3MOE "--routing random --arch qwen3moe --experts 32 --experts-used 8 " \
		 "--expert-ffn 128 --type F16 " \
		 "--seed 72"

TEST(oracle_qwen3moe)
{
	check_long("qwen3moe", QWEN3MOE, "");
}

/*
 * 16 experts, 4 per token, not renormalised, and a gated shared expert of
 * 256 neurons; Q/K/V biases. Router gaps >= 7x.
 */
#define QWEN2MOE "--routing random --arch qwen2moe --experts 16 --experts-used 4 " \
		 "--expert-ffn 128 " \
		 "--shared-experts 2 --type F16 --seed 85"

TEST(oracle_qwen2moe)
{
	check_long("qwen2moe", QWEN2MOE, "");
}

/*
 * DeepSeek's latent attention against HF's DeepseekV2Attention, which
 * decompresses K and V per head (the reference never absorbs): V2 with a q
 * bottleneck; V3's sigmoid scores, selection bias, expert groups and scaled
 * weights; V2-Lite's straight q with YaRN x40 and its log multiplier (the
 * score scale mscale^2). One dense layer first, two shared experts. Seeds
 * with routing gaps of 1e-2 or more (F16).
 */
#define DEEPSEEK2 "--arch deepseek2 --layers 3 --experts 16 --experts-used 4 --expert-ffn 64 " \
		  "--head-dim 96 --type F16 "

/*
 * GLM-4.5 against HF's Glm4Moe: biased GQA with NeoX RoPE on half of each
 * head, post_attention_layernorm before the FFN, a dense first layer,
 * sigmoid routing with the selection bias, renormalised weights, a shared
 * expert. F16; the seed's smallest routing gap is 7.6e-3 in sigmoid scores
 * (about 3e-2 in logits).
 */
TEST(oracle_glm4moe)
{
	check_synth("glm4moe", "--routing random --arch glm4moe --layers 3 --experts 16 "
		    "--experts-used 4 --expert-ffn 64 --type F16 --seed 44");
}

/* dots.llm1 against HF's Dots1: qwen3's attention, GLM's routing. Gap 5.9e-3 in scores. */
TEST(oracle_dots1)
{
	check_synth("dots1", "--routing random --arch dots1 --layers 3 --experts 16 "
		    "--experts-used 4 --expert-ffn 64 --type F16 --seed 53");
}

/* OLMoE against HF's Olmoe: Q and K normed over whole rows. Router gap 1.6e-2. */
TEST(oracle_olmoe)
{
	check_synth("olmoe", "--routing random --arch olmoe --experts 16 --experts-used 4 "
		    "--ffn 128 --type F16 --seed 61");
}

TEST(oracle_deepseek2)
{
	check_synth("deepseek2", DEEPSEEK2 "--q-lora 64 --seed 34");
	check_synth("deepseek2_v3", DEEPSEEK2 "--q-lora 64 --v3 --expert-groups 4:2 --seed 37");
	check_synth("deepseek2_yarn", DEEPSEEK2 "--rope-scaling yarn --rope-factor 40 "
		    "--rope-orig-ctx 16 --seed 34");
}

/*
 * A reference told to leave WRONG's feature out must make check_logits.py
 * exit 1 (mismatch, not 2: error), on a model the right reference passes.
 */
static void check_rejects(const char *name, const char *opts, const char *wrong)
{
	const char *model;
	int rc;

	need_tools();
	hyb_test_need_venv();
	model = synth(name, opts);
	rc = oracle(model, long_tokens, false, "", true);
	CHECK_MSG(rc == 0, "the right reference fails (%s, exit %d)", opts, rc);
	rc = oracle(model, long_tokens, false, wrong, false);
	CHECK_MSG(rc == 1, "check_logits.py %s exited %d, want 1 (%s)", wrong, rc, opts);
}

TEST(oracle_rejects_qwen2_without_biases)
{
	check_rejects("no_bias", "--arch qwen2 --type F32 --seed 41", "--ref-omit bias");
}

TEST(oracle_rejects_qwen3_without_qk_norms)
{
	check_rejects("no_qk_norm", "--arch qwen3 --type F32 --seed 42", "--ref-omit qk_norm");
}

TEST(oracle_rejects_gemma3_without_post_norms)
{
	check_rejects("no_post_norms", GEMMA3 " --type F32 --seed 43", "--ref-omit post_norms");
}

TEST(oracle_rejects_gemma3_without_window)
{
	check_rejects("no_window", GEMMA3 " --type F32 --seed 44", "--ref-omit swa");
}

TEST(oracle_rejects_gemma3_global_rope_on_local_layers)
{
	check_rejects("no_swa_rope", GEMMA3 " --type F32 --seed 45", "--ref-omit swa_rope");
}

TEST(oracle_rejects_gemma3_without_embd_scale)
{
	check_rejects("no_embd_scale", GEMMA3 " --type F32 --seed 46", "--ref-omit embd_scale");
}

TEST(oracle_rejects_gemma3_without_qk_norms)
{
	check_rejects("g3_no_qk_norm", GEMMA3 " --type F32 --seed 47", "--ref-omit qk_norm");
}

TEST(oracle_rejects_yarn_as_linear)
{
	check_rejects("yarn_linear", "--type F32 --seed 48 --rope-scaling yarn --rope-orig-ctx 256",
		      "--ref-omit yarn");
}

TEST(oracle_rejects_unscaled_linear)
{
	check_rejects("linear_none", "--type F32 --seed 49 --rope-scaling linear --rope-factor 4",
		      "--ref-omit rope_scaling");
}

TEST(oracle_rejects_llama3_without_freqs)
{
	check_rejects("llama3_none", "--type F32 --seed 50 --rope-scaling llama3 --rope-orig-ctx 64",
		      "--ref-omit rope_freqs");
}

/* HF's llama3 factors for another original context (128, not 64) */
TEST(oracle_rejects_llama3_wrong_context)
{
	check_rejects("llama3_ctx", "--type F32 --seed 51 --rope-scaling llama3 --rope-orig-ctx 64",
		      "--ref-llama3 8,128");
}

/* linear scaling applied to gemma3's local layers too */
TEST(oracle_rejects_gemma3_scaled_local_layers)
{
	check_rejects("g3_local_scaled", GEMMA3 " --type F32 --seed 52 --rope-scaling linear",
		      "--ref-omit swa_rope");
}

/* The top-K weights used as they are, as Qwen2-MoE does. */
TEST(oracle_rejects_qwen3moe_without_renormalisation)
{
	check_rejects("no_topk_norm", QWEN3MOE, "--ref-omit topk_norm");
}

/* The shared expert added in full, without its sigmoid gate. */
TEST(oracle_rejects_qwen2moe_without_shared_expert_gate)
{
	check_rejects("no_shexp_gate", QWEN2MOE, "--ref-omit shexp_gate");
}

/* Every expert weighted by its probability: no top-K choice. */
TEST(oracle_rejects_mixtral_without_top_k)
{
	check_rejects("no_topk", MIXTRAL " --type F32 --seed 311", "--ref-omit topk");
}

/* An architecture the reference does not know is refused by name (exit 2). */
TEST(oracle_refuses_unknown_arch)
{
	char model[512], log[512], grep_log[512];
	int rc;

	hyb_test_need_venv();
	snprintf(grep_log, sizeof(grep_log), "%s/grep.log", hyb_test_tmpdir());
	snprintf(model, sizeof(model), "%s/mamba.gguf", hyb_test_tmpdir());
	snprintf(log, sizeof(log), "%s/unknown-arch.log", hyb_test_tmpdir());
	rc = hyb_test_sh(log, ".venv/bin/python -c \"import gguf, numpy as np; "
			 "w = gguf.GGUFWriter('%s', 'mamba'); w.add_block_count(1); "
			 "w.add_tensor('token_embd.weight', np.zeros((4, 8), dtype=np.float32)); "
			 "w.write_header_to_file(); w.write_kv_data_to_file(); "
			 "w.write_tensors_to_file(); w.close()\"", model);
	if (rc != 0)
		hyb_test_show_log(log);
	CHECK_MSG(rc == 0, "writing a mamba GGUF failed (exit %d)", rc);
	rc = hyb_test_sh(log, ".venv/bin/python tests/oracle/reference.py '%s' --tokens 1,2", model);
	CHECK_MSG(rc == 2, "reference.py on a mamba model exited %d, want 2", rc);
	rc = hyb_test_sh(grep_log, "grep -q \"architecture 'mamba' is not supported\" '%s'", log);
	if (rc != 0)
		hyb_test_show_log(log);
	CHECK_MSG(rc == 0, "reference.py did not name the unsupported architecture");
}
