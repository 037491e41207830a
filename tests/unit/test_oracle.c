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
