// SPDX-License-Identifier: MIT
/* hybctl: make synthetic models (synth); later: pools, stalls, numa, profile, plan. */
#include <stdio.h>
#include <string.h>

#include "hybctl.h"

static const char usage[] =
	"usage: hybctl <command> [options]\n"
	"  synth -o FILE [shape and type options]   write a llama GGUF with random weights\n"
	"run 'hybctl <command> --help' for its options\n";

int main(int argc, char **argv)
{
	if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
		fputs(usage, argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	if (!strcmp(argv[1], "synth"))
		return cmd_synth(argc - 1, argv + 1);
	fprintf(stderr, "hybctl: unknown command '%s'\n%s", argv[1], usage);
	return 2;
}
