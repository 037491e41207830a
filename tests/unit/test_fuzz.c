// SPDX-License-Identifier: MIT
/*
 * Short runs of the libFuzzer targets (built by `make fuzz` with clang's
 * ASan and UBSan) on copies of their seed corpora: the GGUF parser, the
 * model loader on top of it (every architecture's metadata and tensors),
 * hyb serve's request parser (completions and chat JSON), the manifest
 * reader (hybd's pools and split tensors, as apps take them) and the
 * tokenizers and chat templates over the text users send.
 * Any crash, leak or sanitizer report fails the test. Crash inputs are kept
 * as build/fuzz-crash-* for reproduction: build/fuzz_gguf <file>.
 */
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test.h"

static void run_fuzzer(const char *fuzzer, const char *seeds)
{
	const char *tmp = hyb_test_tmpdir();
	char cmd[2048], line[512], last[512] = "";
	FILE *fp;
	int rc;

	if (access(fuzzer, X_OK))
		SKIP("%s not built (make fuzz; needs clang)", fuzzer);
	if (access(seeds, R_OK))
		SKIP("%s not found (run from the repository root)", seeds);
	/* libFuzzer adds what it finds to its first corpus folder: give it a copy */
	snprintf(cmd, sizeof(cmd),
		 "cp -r '%s' '%s/corpus' && %s -max_total_time=20 -rss_limit_mb=1024 "
		 "-artifact_prefix=build/fuzz-crash- '%s/corpus' > '%s/log' 2>&1",
		 seeds, tmp, fuzzer, tmp, tmp);
	rc = system(cmd);
	snprintf(cmd, sizeof(cmd), "%s/log", tmp);
	fp = fopen(cmd, "r");
	CHECK(fp);
	while (fgets(line, sizeof(line), fp)) {
		if (rc)
			fputs(line, stderr); /* the sanitizer report, for the failure */
		else if (!strncmp(line, "Done ", 5))
			snprintf(last, sizeof(last), "%s", line);
	}
	fclose(fp);
	CHECK_MSG(rc == 0, "the fuzzer found a problem (exit status %d); see above",
		  WIFEXITED(rc) ? WEXITSTATUS(rc) : -1);
	if (last[0])
		fprintf(stderr, "    %s", last);
}

TEST(gguf_fuzz_smoke)
{
	run_fuzzer("build/fuzz_gguf", "tests/fuzz/corpus");
}

TEST(model_fuzz_smoke)
{
	run_fuzzer("build/fuzz_model", "tests/fuzz/corpus-model");
}

TEST(serve_fuzz_smoke)
{
	run_fuzzer("build/fuzz_serve", "tests/fuzz/corpus-serve");
}

TEST(manifest_fuzz_smoke)
{
	run_fuzzer("build/fuzz_manifest", "tests/fuzz/corpus-manifest");
}

TEST(text_fuzz_smoke)
{
	/* llama.cpp's vocabularies (SentencePiece, GPT-2, Llama 3), as test_tokenizer fetches them */
	if (access(".cache/vocab/ggml-vocab-llama-bpe.gguf", R_OK) &&
	    system("bash tests/data/fetch-vocab.sh .cache/vocab >/dev/null 2>&1") != 0)
		fprintf(stderr, "    (llama.cpp's vocabularies could not be fetched)\n");
	run_fuzzer("build/fuzz_text", "tests/fuzz/corpus-text");
}
