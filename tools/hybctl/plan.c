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
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "hyb/gguf.h"
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

/*
 * The numeric options: the range a value must be in, the factor to the unit
 * the planner takes (us -> s, GB/s -> B/s) and the field it sets.
 */
struct num_opt {
	int id;
	const char *name;
	double lo, hi, scale;
	size_t off;
	enum { NUM_U32, NUM_U64, NUM_F64 } kind;
};

#define NUM(id, name, lo, hi, scale, field, kind) \
	{ id, name, lo, hi, scale, offsetof(struct hyb_plan_opts, field), kind }
static const struct num_opt nums[] = {
	NUM(OPT_GS, "--group-size", 1, 1u << 24, 1, group_size, NUM_U32),
	NUM(OPT_LAT, "--pcie-latency", 0, 1e6, 1e-6, link.latency_s, NUM_F64),
	NUM(OPT_BW, "--pcie-bw", 1e-3, 1e6, 1e9, link.bw, NUM_F64),
	NUM(OPT_TARGET, "--transfer-target", 0, 0.999, 1, target_efficiency, NUM_F64),
	NUM(OPT_MAXG, "--max-groups", 1, 1u << 24, 1, max_groups, NUM_U32),
	NUM(OPT_TSYNC, "--t-sync", 0, 1e6, 1e-6, sync.t_sync, NUM_F64),
	NUM(OPT_CPUBW, "--cpu-bw", 1e-3, 1e6, 1e9, sync.bw_cpu, NUM_F64),
	NUM(OPT_GPUBW, "--gpu-bw", 1e-3, 1e6, 1e9, sync.bw_gpu, NUM_F64),
	NUM(OPT_RECALL, "--recall", 0.01, 1, 1, pred.target_recall, NUM_F64),
	NUM(OPT_HIDDEN, "--hidden", 1, 65536, 1, pred.hidden, NUM_U32),
	NUM(OPT_MAXH, "--max-hidden", 32, 65536, 1, pred_hidden_hi, NUM_U32),
	NUM(OPT_GFLOP, "--train-gflop", 1e-3, 1e9, 1, pred.gflop, NUM_F64),
	NUM(OPT_EPOCHS, "--epochs", 1, 1e6, 1, pred.max_epochs, NUM_U32),
	NUM(OPT_SEED, "--seed", 0, 1e15, 1, group.seed, NUM_U64),
};

/* A numeric option into o: 0, -1 when not one, 2 (the exit status) when out of range. */
static int set_num(struct hyb_plan_opts *o, int id, const char *arg)
{
	for (size_t i = 0; i < sizeof(nums) / sizeof(nums[0]); i++) {
		const struct num_opt *n = &nums[i];
		char *field = (char *)o + n->off;
		double v;

		if (n->id != id)
			continue;
		if (parse_num(n->name, arg, n->lo, n->hi, &v))
			return 2;
		v *= n->scale;
		if (n->kind == NUM_U32)
			*(uint32_t *)field = (uint32_t)v;
		else if (n->kind == NUM_U64)
			*(uint64_t *)field = (uint64_t)v;
		else
			*(double *)field = v;
		if (id == OPT_SEED)	/* one seed for grouping and training */
			o->pred.seed = o->group.seed;
		return 0;
	}
	return -1;
}

static int set_grouping(struct hyb_plan_opts *o, const char *arg)
{
	if (!strcmp(arg, "metis")) {
		o->grouping = HYB_PLAN_GROUP_METIS;
	} else if (!strcmp(arg, "contiguous")) {
		o->grouping = HYB_PLAN_GROUP_CONTIGUOUS;
	} else if (!strcmp(arg, "random")) {
		o->grouping = HYB_PLAN_GROUP_RANDOM;
	} else {
		fprintf(stderr, "hybctl plan: --grouping must be metis, contiguous or random\n");
		return 2;
	}
	return 0;
}

struct plan_args {
	struct hyb_plan_opts o;
	const char *profile, *out, *model;
	bool have_budget;
};

/* The command line into a: -1 to go on, else the exit status. */
static int parse_args(int argc, char **argv, struct plan_args *a)
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
	double v;
	int c, rc;

	optind = 1;
	while ((c = getopt_long(argc, argv, "o:t:qh", longs, NULL)) != -1) {
		if ((rc = set_num(&a->o, c, optarg)) >= 0) {
			if (rc)
				return rc;
			continue;
		}
		switch (c) {
		case 'o':
			a->out = optarg;
			break;
		case 't':
			if (parse_num("-t", optarg, 1, 4096, &v))
				return 2;
			a->o.n_threads = (int)v;
			break;
		case 'q':
			a->o.quiet = true;
			break;
		case 'h':
			fputs(usage, stdout);
			return 0;
		case OPT_PROFILE:
			a->profile = optarg;
			break;
		case OPT_BUDGET:
			if (parse_bytes(optarg, &a->o.gpu_budget)) {
				fprintf(stderr, "hybctl plan: --gpu-budget '%s' is not a byte "
					"count (e.g. 8G, 512M, 1073741824)\n", optarg);
				return 2;
			}
			a->have_budget = true;
			break;
		case OPT_GROUPING:
			if (set_grouping(&a->o, optarg))
				return 2;
			break;
		case OPT_GPU_INDEX:
			a->o.gpu_index = optarg;
			break;
		case OPT_TRAIN_PRED:
			a->o.train_predictors = true;
			break;
		default:
			fputs(usage, stderr);
			return 2;
		}
	}
	if (optind != argc - 1 || !a->profile || !a->out || !a->have_budget) {
		fprintf(stderr, "hybctl plan: %s\n%s",
			optind != argc - 1 ? "give exactly one MODEL"
			: !a->profile ? "--profile is required"
			: !a->out ? "-o is required" : "--gpu-budget is required", usage);
		return 2;
	}
	a->model = argv[optind];
	return -1;
}

/*
 * Plans place neurons of dense FFNs; mixtures of experts (a routing profile,
 * or a model with experts) have none yet: said plainly rather than failing
 * somewhere inside the planner. 1 when refused.
 */
static int refuse_moe(const struct plan_args *a)
{
	struct hyb_gguf_file *f;
	char arch[64] = "", key[96];
	uint32_t n_expert = 0;
	bool moe_prof;

	if (!hyb_gguf_open(a->profile, &f)) {
		moe_prof = hyb_gguf_get_str(f, "general.architecture", arch, sizeof(arch)) &&
			   !strcmp(arch, "hyb-moe-profile");
		hyb_gguf_close(f);
		if (moe_prof) {
			fprintf(stderr, "hybctl plan: %s is a mixture-of-experts routing profile: "
				"plans for MoE models do not exist yet (docs/MOE.md)\n", a->profile);
			return 1;
		}
	}
	if (!hyb_gguf_open(a->model, &f)) {
		if (hyb_gguf_get_str(f, "general.architecture", arch, sizeof(arch))) {
			snprintf(key, sizeof(key), "%s.expert_count", arch);
			if (!hyb_gguf_get_u32(f, key, &n_expert))
				n_expert = 0;
		}
		hyb_gguf_close(f);
		if (n_expert) {
			fprintf(stderr, "hybctl plan: %s is a mixture of %u experts: plans for MoE "
				"models do not exist yet (docs/MOE.md)\n", a->model, n_expert);
			return 1;
		}
	}
	return 0;
}

int cmd_plan(int argc, char **argv)
{
	struct plan_args a = { 0 };
	struct hyb_profile *prof;
	int rc;

	hyb_plan_opts_default(&a.o);
	if ((rc = parse_args(argc, argv, &a)) >= 0)
		return rc;
	if (refuse_moe(&a))
		return 1;
	prof = hyb_profile_load(a.profile);
	if (!prof) {
		fprintf(stderr, "hybctl plan: %s\n", hyb_last_error());
		return 1;
	}
	rc = hyb_plan_make(a.model, prof, &a.o, a.out);
	hyb_profile_free(prof);
	if (rc) {
		fprintf(stderr, "hybctl plan: %s\n", hyb_last_error());
		return 1;
	}
	return 0;
}
