// SPDX-License-Identifier: MIT
/*
 * hybctl plan MODEL --profile PROFILE --gpu-budget BYTES -o PLAN: neuron
 * groups, initial GPU placement and predictors, written as a plan GGUF
 * (hyb/plan.h). The work is libhyb's hyb_plan_make (plan/write.c); this file
 * reads the options.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "hyb/profile.h"
#include "hybctl.h"
#include "hyb/planner.h"

static const char usage[] =
	"usage: hybctl plan MODEL --profile PROFILE --gpu-budget BYTES -o PLAN [options]\n"
	"  --profile F         activation profile of MODEL (hybctl profile)\n"
	"  --gpu-budget N      GPU bytes for dense tensors, predictors and groups;\n"
	"                      suffixes K M G T (powers of 1024), e.g. 6G or 1.5G\n"
	"  -o FILE             the plan (written to FILE.tmp-PID, then renamed)\n"
	"group size (KAIROX 5.2):\n"
	"  --group-size N      neurons per group (default: from the link model)\n"
	"  --pcie-latency US   transfer latency (default 1.36)\n"
	"  --pcie-bw GBPS      transfer bandwidth, GB/s (default 25.2; both fitted to\n"
	"                      KAIROX Table 2, PCIe 4.0)\n"
	"  --transfer-target F share of the bandwidth a bundle must reach (default 0.8)\n"
	"  --max-groups N      groups per layer at most (default 1024)\n"
	"  --grouping G        metis, contiguous or random (default metis)\n"
	"placement (PowerInfer 6.3):\n"
	"  --t-sync US         one CPU-GPU synchronisation of a split layer (default 20)\n"
	"  --cpu-bw GBPS       CPU memory bandwidth (default 50)\n"
	"  --gpu-bw GBPS       GPU memory bandwidth (default 1000)\n"
	"predictors (PowerInfer 5.1):\n"
	"  --recall F          target recall of the threshold (default 0.998; on an\n"
	"                      8-layer 4096/11008 synthetic ReLU model, 20 prompts x 64\n"
	"                      tokens, 0.995 kept 94.4% of greedy tokens equal to dense\n"
	"                      decoding with 32.7% of neurons predicted, 0.998 kept\n"
	"                      96.8% with 35.7%)\n"
	"  --hidden N          hidden size of every layer (default: from the layer's entropy)\n"
	"  --max-hidden N      upper bound of that rule (default 1024)\n"
	"  --train-gflop N     training compute per layer (default 200)\n"
	"  --epochs N          epochs at most (default 10)\n"
	"  --seed N            (default 1)\n"
	"  -t N                threads (default: all CPUs)\n"
	"  -q                  no report\n"
	"PowerInfer files (MODEL may be a PowerInfer GGUF: ffn_down_t, fc1/fc2):\n"
	"  --gpu-index F       a PowerInfer GPU index (*.gpuidx, PWRI magic): place\n"
	"                      groups to cover the neurons it puts on the GPU\n"
	"  --train-predictors  train predictors instead of keeping PowerInfer's own\n";

/* Bytes with an optional K/M/G/T suffix (1024-based; "KiB", "KB", "k" accepted). */
static int parse_bytes(const char *s, uint64_t *out)
{
	char *end;
	double v, mul = 1;

	errno = 0;
	v = strtod(s, &end);
	if (end == s || errno || !(v >= 0) || isinf(v))
		return -1;
	switch (*end) {
	case 'k': case 'K': mul = 1024.0; end++; break;
	case 'm': case 'M': mul = 1048576.0; end++; break;
	case 'g': case 'G': mul = 1073741824.0; end++; break;
	case 't': case 'T': mul = 1099511627776.0; end++; break;
	default: break;
	}
	if (mul > 1 && *end == 'i')
		end++;
	if (*end == 'B' || *end == 'b')
		end++;
	if (*end || v * mul >= 18446744073709549568.0)
		return -1;
	*out = (uint64_t)(v * mul);
	return 0;
}

static int parse_num(const char *opt, const char *s, double lo, double hi, double *out)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (end == s || *end || errno || !(v >= lo && v <= hi)) {
		fprintf(stderr, "hybctl plan: %s must be a number in [%g, %g], not '%s'\n", opt, lo,
			hi, s);
		return -1;
	}
	*out = v;
	return 0;
}

enum {
	OPT_PROFILE = 256, OPT_BUDGET, OPT_GS, OPT_LAT, OPT_BW, OPT_TARGET, OPT_MAXG, OPT_GROUPING,
	OPT_TSYNC, OPT_CPUBW, OPT_GPUBW, OPT_RECALL, OPT_HIDDEN, OPT_MAXH, OPT_GFLOP, OPT_EPOCHS,
	OPT_SEED, OPT_GPU_INDEX, OPT_TRAIN_PRED,
};

int cmd_plan(int argc, char **argv)
{
	static const struct option longs[] = {
		{ "profile", required_argument, NULL, OPT_PROFILE },
		{ "gpu-budget", required_argument, NULL, OPT_BUDGET },
		{ "group-size", required_argument, NULL, OPT_GS },
		{ "pcie-latency", required_argument, NULL, OPT_LAT },
		{ "pcie-bw", required_argument, NULL, OPT_BW },
		{ "transfer-target", required_argument, NULL, OPT_TARGET },
		{ "max-groups", required_argument, NULL, OPT_MAXG },
		{ "grouping", required_argument, NULL, OPT_GROUPING },
		{ "t-sync", required_argument, NULL, OPT_TSYNC },
		{ "cpu-bw", required_argument, NULL, OPT_CPUBW },
		{ "gpu-bw", required_argument, NULL, OPT_GPUBW },
		{ "recall", required_argument, NULL, OPT_RECALL },
		{ "hidden", required_argument, NULL, OPT_HIDDEN },
		{ "max-hidden", required_argument, NULL, OPT_MAXH },
		{ "train-gflop", required_argument, NULL, OPT_GFLOP },
		{ "epochs", required_argument, NULL, OPT_EPOCHS },
		{ "seed", required_argument, NULL, OPT_SEED },
		{ "gpu-index", required_argument, NULL, OPT_GPU_INDEX },
		{ "train-predictors", no_argument, NULL, OPT_TRAIN_PRED },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *profile = NULL, *out = NULL, *model;
	struct hyb_plan_opts o;
	struct hyb_profile *prof;
	bool have_budget = false;
	char err[1024];
	double v;
	int c, rc;

	hyb_plan_opts_default(&o);
	optind = 1;
	while ((c = getopt_long(argc, argv, "o:t:qh", longs, NULL)) != -1) {
		switch (c) {
		case 'o':
			out = optarg;
			break;
		case 't':
			if (parse_num("-t", optarg, 1, 4096, &v))
				return 2;
			o.n_threads = (int)v;
			break;
		case 'q':
			o.quiet = true;
			break;
		case 'h':
			fputs(usage, stdout);
			return 0;
		case OPT_PROFILE:
			profile = optarg;
			break;
		case OPT_BUDGET:
			if (parse_bytes(optarg, &o.gpu_budget)) {
				fprintf(stderr, "hybctl plan: --gpu-budget '%s' is not a byte "
					"count (e.g. 8G, 512M, 1073741824)\n", optarg);
				return 2;
			}
			have_budget = true;
			break;
		case OPT_GS:
			if (parse_num("--group-size", optarg, 1, 1u << 24, &v))
				return 2;
			o.group_size = (uint32_t)v;
			break;
		case OPT_LAT:
			if (parse_num("--pcie-latency", optarg, 0, 1e6, &v))
				return 2;
			o.link.latency_s = v * 1e-6;
			break;
		case OPT_BW:
			if (parse_num("--pcie-bw", optarg, 1e-3, 1e6, &v))
				return 2;
			o.link.bw = v * 1e9;
			break;
		case OPT_TARGET:
			if (parse_num("--transfer-target", optarg, 0, 0.999, &v))
				return 2;
			o.target_efficiency = v;
			break;
		case OPT_MAXG:
			if (parse_num("--max-groups", optarg, 1, 1u << 24, &v))
				return 2;
			o.max_groups = (uint32_t)v;
			break;
		case OPT_GROUPING:
			if (!strcmp(optarg, "metis")) {
				o.grouping = HYB_PLAN_GROUP_METIS;
			} else if (!strcmp(optarg, "contiguous")) {
				o.grouping = HYB_PLAN_GROUP_CONTIGUOUS;
			} else if (!strcmp(optarg, "random")) {
				o.grouping = HYB_PLAN_GROUP_RANDOM;
			} else {
				fprintf(stderr, "hybctl plan: --grouping must be metis, "
					"contiguous or random\n");
				return 2;
			}
			break;
		case OPT_TSYNC:
			if (parse_num("--t-sync", optarg, 0, 1e6, &v))
				return 2;
			o.sync.t_sync = v * 1e-6;
			break;
		case OPT_CPUBW:
			if (parse_num("--cpu-bw", optarg, 1e-3, 1e6, &v))
				return 2;
			o.sync.bw_cpu = v * 1e9;
			break;
		case OPT_GPUBW:
			if (parse_num("--gpu-bw", optarg, 1e-3, 1e6, &v))
				return 2;
			o.sync.bw_gpu = v * 1e9;
			break;
		case OPT_RECALL:
			if (parse_num("--recall", optarg, 0.01, 1, &v))
				return 2;
			o.pred.target_recall = v;
			break;
		case OPT_HIDDEN:
			if (parse_num("--hidden", optarg, 1, 65536, &v))
				return 2;
			o.pred.hidden = (uint32_t)v;
			break;
		case OPT_MAXH:
			if (parse_num("--max-hidden", optarg, 32, 65536, &v))
				return 2;
			o.pred_hidden_hi = (uint32_t)v;
			break;
		case OPT_GFLOP:
			if (parse_num("--train-gflop", optarg, 1e-3, 1e9, &v))
				return 2;
			o.pred.gflop = v;
			break;
		case OPT_EPOCHS:
			if (parse_num("--epochs", optarg, 1, 1e6, &v))
				return 2;
			o.pred.max_epochs = (uint32_t)v;
			break;
		case OPT_SEED:
			if (parse_num("--seed", optarg, 0, 1e15, &v))
				return 2;
			o.group.seed = o.pred.seed = (uint64_t)v;
			break;
		case OPT_GPU_INDEX:
			o.gpu_index = optarg;
			break;
		case OPT_TRAIN_PRED:
			o.train_predictors = true;
			break;
		default:
			fputs(usage, stderr);
			return 2;
		}
	}
	if (optind != argc - 1 || !profile || !out || !have_budget) {
		fprintf(stderr, "hybctl plan: %s\n%s",
			optind != argc - 1 ? "give exactly one MODEL"
			: !profile ? "--profile is required"
			: !out ? "-o is required" : "--gpu-budget is required", usage);
		return 2;
	}
	model = argv[optind];
	prof = hyb_profile_load(profile, err, sizeof(err));
	if (!prof) {
		fprintf(stderr, "hybctl plan: %s\n", err);
		return 1;
	}
	rc = hyb_plan_make(model, prof, &o, out, err, sizeof(err));
	hyb_profile_free(prof);
	if (rc) {
		fprintf(stderr, "hybctl plan: %s\n", err);
		return 1;
	}
	return 0;
}
