// SPDX-License-Identifier: MIT
/* hyb: run GGUF models. Subcommands: run, chat, serve, bench, logits, tokenize, perplexity. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static const char usage[] =
	"usage: hyb <command> [options]\n"
	"  run      -m MODEL -p PROMPT [-n N] [sampling]   generate text, print tokens/s\n"
	"           [--chat [--chat-template NAME] [--system TEXT]]  PROMPT as a chat message\n"
	"  chat     -m MODEL [-n N] [--chat-template NAME] [--system TEXT] [sampling]\n"
	"                                                  a conversation on stdin\n"
	"  serve    -m MODEL [--host H] [--port P] [--parallel N] [--api-key-file F]\n"
	"                                                  an OpenAI-compatible HTTP server\n"
	"  bench    -m MODEL [-p N] [-n N] [-r REPS]        prefill/decode speed vs rooflines\n"
	"  logits   -m MODEL --tokens IDS -o FILE [--decode] every position's logits (float32)\n"
	"  tokenize -m MODEL -p TEXT                         print token ids\n"
	"  perplexity -m MODEL -f TEXT [-c 512] [--chunks N] perplexity as llama-perplexity\n"
	"           computes it\n"
	"common: --cats PROFILE [--sparsity S]  CATS activation sparsity (docs/SPARSITY.md)\n"
	"common: --teal PROFILE [--sparsity S]  TEAL: every projection's input sparse\n"
	"common: --defer N  MoE decode: the N lowest-ranked experts join a layer later\n"
	"        (KTransformers' expert deferral, docs/MOE.md)\n"
	"common: --no-numa-pin  experts split across nodes by hybd: threads unpinned\n"
	"        (docs/NUMA.md)\n"
	"common: -t THREADS  -c CONTEXT\n"
	"sampling: --temp T (0 = greedy, default)  --top-k K  --top-p P  --min-p P\n"
	"          --repeat-penalty R  --repeat-last-n N  --seed S\n";

int main(int argc, char **argv)
{
	if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
		fputs(usage, argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	if (!strcmp(argv[1], "run"))
		return cmd_run(argc - 1, argv + 1);
	if (!strcmp(argv[1], "chat"))
		return cmd_chat(argc - 1, argv + 1);
	if (!strcmp(argv[1], "serve"))
		return cmd_serve(argc - 1, argv + 1);
	if (!strcmp(argv[1], "bench"))
		return cmd_bench(argc - 1, argv + 1);
	if (!strcmp(argv[1], "logits"))
		return cmd_logits(argc - 1, argv + 1);
	if (!strcmp(argv[1], "perplexity"))
		return cmd_perplexity(argc - 1, argv + 1);
	if (!strcmp(argv[1], "tokenize"))
		return cmd_tokenize(argc - 1, argv + 1);
	fprintf(stderr, "hyb: unknown command '%s'\n%s", argv[1], usage);
	return 2;
}
