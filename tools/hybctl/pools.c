// SPDX-License-Identifier: MIT
/* hybctl pools: the neuron pools of the box, their placement and use. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#include "hybctl.h"

static const char usage[] =
	"usage: hybctl pools [--json] [--backend kmod|local]\n"
	"  lists the pools of hybpool.ko (box mode): node, size, backing memory, mappings,\n"
	"  faults, reload requests, owner. --backend local shows this process's own\n"
	"  (embedded pools live inside the process that made them: none here).\n";

static void print_json(const struct hyb_backend_info *bi, const struct hyb_mempool_info *pi,
		       int n)
{
	printf("{\"backend\": \"%s\", \"abi_version\": %u, \"nr_pools\": %u, \"nr_zombies\": %u, "
	       "\"nr_queues\": %u, \"nr_requests\": %llu, \"pinned_bytes\": %llu, "
	       "\"pinned_cap\": %llu, \"pools\": [", hyb_backend_name(bi->kind), bi->abi_version,
	       bi->nr_pools, bi->nr_zombies, bi->nr_queues, (unsigned long long)bi->nr_requests,
	       (unsigned long long)bi->pinned_bytes, (unsigned long long)bi->pinned_cap);
	for (int i = 0; i < n; i++) {
		const struct hyb_mempool_info *p = &pi[i];

		printf("%s\n  {\"id\": %u, \"name\": ", i ? "," : "", p->id);
		ctl_json_str(stdout, p->name);
		printf(", \"node\": %d, \"bytes\": %llu, \"page_size\": %llu, \"huge_bytes\": %llu, "
		       "\"backing\": ", p->node, (unsigned long long)p->bytes,
		       (unsigned long long)p->page_size, (unsigned long long)p->huge_bytes);
		ctl_json_flags(stdout, p->flags);
		printf(", \"mappers\": %u, \"faults\": %llu, \"reloads\": %llu, \"owner_pid\": %d, "
		       "\"create_ns\": %llu}", p->mappers, (unsigned long long)p->faults,
		       (unsigned long long)p->reloads, p->owner_pid,
		       (unsigned long long)p->create_ns);
	}
	printf("%s]}\n", n ? "\n" : "");
}

static void print_text(const struct hyb_backend_info *bi, const struct hyb_mempool_info *pi,
		       int n)
{
	char pinned[32], cap[32], size[32], back[64], ct[32];

	ctl_bytes(pinned, sizeof(pinned), bi->pinned_bytes);
	ctl_bytes(cap, sizeof(cap), bi->pinned_cap);
	printf("backend %s: %u pools (%u destroyed, still mapped), %s pinned of %s cap, "
	       "%u queues, %llu requests alive\n", hyb_backend_name(bi->kind), bi->nr_pools,
	       bi->nr_zombies, pinned, cap, bi->nr_queues, (unsigned long long)bi->nr_requests);
	if (!n) {
		printf("no pools%s\n", bi->kind == HYB_BACKEND_LOCAL ?
		       " (local pools live inside the process that made them)" : "");
		return;
	}
	printf("%5s  %-24s %4s %9s %5s  %-24s %7s %9s %9s %7s %9s\n", "ID", "NAME", "NODE", "SIZE",
	       "HUGE", "BACKING", "MAPPERS", "FAULTS", "RELOADS", "OWNER", "CREATE");
	for (int i = 0; i < n; i++) {
		const struct hyb_mempool_info *p = &pi[i];

		ctl_bytes(size, sizeof(size), p->bytes);
		ctl_pool_flags(back, sizeof(back), p->flags);
		ctl_ns(ct, sizeof(ct), p->create_ns);
		printf("%5u  %-24s %4d %9s %4.0f%%  %-24s %7u %9llu %9llu %7d %9s\n", p->id,
		       p->name, p->node, size, p->bytes ? 100.0 * p->huge_bytes / p->bytes : 0.0,
		       back, p->mappers, (unsigned long long)p->faults,
		       (unsigned long long)p->reloads, p->owner_pid, ct);
	}
}

int cmd_pools(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "json", 0, 0, 'j' }, { "backend", 1, 0, 'b' }, { "help", 0, 0, 'h' },
		{ 0, 0, 0, 0 },
	};
	enum hyb_backend_kind kind = HYB_BACKEND_AUTO;
	struct hyb_mempool_info pi[HYB_MEMPOOL_MAX];
	uint32_t ids[HYB_MEMPOOL_MAX];
	struct hyb_backend_info bi;
	struct hyb_backend *b;
	int c, json = 0, n, k = 0;

	optind = 1;
	while ((c = getopt_long(argc, argv, "jh", opts, NULL)) != -1) {
		switch (c) {
		case 'j': json = 1; break;
		case 'b':
			if (ctl_parse_backend("pools", optarg, &kind))
				return 2;
			break;
		case 'h': fputs(usage, stdout); return 0;
		default: fputs(usage, stderr); return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "hybctl pools: unexpected argument '%s'\n%s", argv[optind], usage);
		return 2;
	}
	b = ctl_backend("pools", kind, false);
	if (!b)
		return 1;
	if (hyb_backend_info(b, &bi)) {
		fprintf(stderr, "hybctl pools: %s\n", hyb_last_error());
		hyb_backend_close(b);
		return 1;
	}
	n = hyb_mempool_list(b, ids, HYB_MEMPOOL_MAX);
	if (n < 0) {
		fprintf(stderr, "hybctl pools: %s\n", hyb_last_error());
		hyb_backend_close(b);
		return 1;
	}
	/* A pool destroyed between list and info is simply gone. */
	for (int i = 0; i < n && i < HYB_MEMPOOL_MAX; i++)
		if (!hyb_mempool_stat(b, ids[i], &pi[k]))
			k++;
	if (json)
		print_json(&bi, pi, k);
	else
		print_text(&bi, pi, k);
	hyb_backend_close(b);
	return 0;
}
