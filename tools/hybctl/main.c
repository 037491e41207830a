// SPDX-License-Identifier: MIT
/*
 * hybctl: synthetic models (synth), the offline sparse pipeline (profile, plan)
 * and the box-mode pools (pools, stalls, numa).
 */
#include <stdio.h>
#include <string.h>

#include "hybctl.h"

static const char usage[] =
	"usage: hybctl <command> [options]\n"
	"  synth -o FILE [shape and type options]   write a llama GGUF with random weights\n"
	"  profile MODEL [-o FILE] [--prompts FILE] activation statistics of a model\n"
	"  plan MODEL --gpu-budget BYTES -o PLAN    neuron groups, placement, predictors\n"
	"  manifest [FILE] [--json] [--tensors] [--bundles] [--find T]\n"
	"                                           where hybd put every tensor\n"
	"  pools [--json]                           neuron pools of hybpool.ko\n"
	"  stalls [-w] [--json]                     reload queues and app stall times\n"
	"  numa [--json] [--move POOL --node N]     topology, pool pages per node, advice\n"
	"run 'hybctl <command> --help' for its options\n";

int main(int argc, char **argv)
{
	if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
		fputs(usage, argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	if (!strcmp(argv[1], "synth"))
		return cmd_synth(argc - 1, argv + 1);
	if (!strcmp(argv[1], "profile"))
		return cmd_profile(argc - 1, argv + 1);
	if (!strcmp(argv[1], "plan"))
		return cmd_plan(argc - 1, argv + 1);
	if (!strcmp(argv[1], "manifest"))
		return cmd_manifest(argc - 1, argv + 1);
	if (!strcmp(argv[1], "pools"))
		return cmd_pools(argc - 1, argv + 1);
	if (!strcmp(argv[1], "stalls"))
		return cmd_stalls(argc - 1, argv + 1);
	if (!strcmp(argv[1], "numa"))
		return cmd_numa(argc - 1, argv + 1);
	fprintf(stderr, "hybctl: unknown command '%s'\n%s", argv[1], usage);
	return 2;
}
