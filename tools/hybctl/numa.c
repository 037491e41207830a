// SPDX-License-Identifier: MIT
/*
 * hybctl numa: the machine's NUMA topology (libnuma: which node has which
 * CPUs and memory), where each pool's pages really are (the kernel answers
 * through move_pages in query mode, on a read-only mapping of the pool), and
 * a recommended placement. --move asks the backend to move a pool to
 * another node where it can (the module can, for any pool, as its owner or
 * with CAP_SYS_ADMIN).
 */
#include <errno.h>
#include <getopt.h>
#include <numa.h>
#include <numaif.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hybctl.h"

#define MAX_NODES 64

static const char usage[] =
	"usage: hybctl numa [--json] [--backend kmod|local] [--move POOL --node N] [--probe MIB]\n"
	"  topology (CPUs, memory and distances per node), the pages of every pool per\n"
	"  node (maps each pool read-only for a moment and asks the kernel), and a\n"
	"  recommended placement. Works without the module (topology and advice only).\n"
	"  --move POOL --node N   move POOL's pages to node N (module: the same addresses keep\n"
	"                         working in every process; needs CAP_SYS_ADMIN or ownership)\n"
	"  --probe MIB            first create a MIB pool on every node with memory (kept\n"
	"                         until exit): does memory land where asked, in huge pages?\n";

struct node {
	int id;
	bool present;
	int nr_cpus;
	char cpus[256];
	long long mem;
	long long free;
};

struct pool_pages {
	struct hyb_mempool_info info;
	uint64_t on[MAX_NODES];
	uint64_t absent;
	int err;		/* mapping or query failed: -errno */
};

/* Append "a" or "a-b" to the node's CPU list. */
static void cpus_add(struct node *nd, size_t *len, int a, int b)
{
	size_t room = sizeof(nd->cpus) - *len;
	int n;

	if (*len >= sizeof(nd->cpus))
		return;
	if (a == b)
		n = snprintf(nd->cpus + *len, room, "%s%d", *len ? "," : "", a);
	else
		n = snprintf(nd->cpus + *len, room, "%s%d-%d", *len ? "," : "", a, b);
	*len += n > 0 ? (size_t)n : 0;
}

static int topo_read(struct node *nodes)
{
	int max = numa_available() < 0 ? 0 : numa_max_node();
	struct bitmask *cm;
	char p[96];

	if (max >= MAX_NODES)
		max = MAX_NODES - 1;
	cm = numa_available() < 0 ? NULL : numa_allocate_cpumask();
	for (int n = 0; n <= max; n++) {
		struct node *nd = &nodes[n];
		size_t len = 0;
		int run = -1;

		memset(nd, 0, sizeof(*nd));
		nd->id = n;
		snprintf(p, sizeof(p), "/sys/devices/system/node/node%d", n);
		nd->present = !cm || access(p, F_OK) == 0;
		if (!nd->present)
			continue;
		if (!cm) {
			long ncpu = sysconf(_SC_NPROCESSORS_ONLN), ps = sysconf(_SC_PAGESIZE);

			nd->nr_cpus = (int)ncpu;
			snprintf(nd->cpus, sizeof(nd->cpus), "0-%ld", ncpu - 1);
			nd->mem = sysconf(_SC_PHYS_PAGES) * ps;
			nd->free = sysconf(_SC_AVPHYS_PAGES) * ps;
			continue;
		}
		nd->mem = numa_node_size64(n, &nd->free);
		if (nd->mem < 0)
			nd->mem = nd->free = 0;
		numa_bitmask_clearall(cm);
		if (numa_node_to_cpus(n, cm))
			continue;
		/* "0-7,16-23" */
		for (unsigned int c = 0; c <= cm->size; c++) {
			bool set = c < cm->size && numa_bitmask_isbitset(cm, c);

			if (set) {
				nd->nr_cpus++;
				if (run < 0)
					run = (int)c;
			} else if (run >= 0) {
				cpus_add(nd, &len, run, (int)c - 1);
				run = -1;
			}
		}
	}
	if (cm)
		numa_free_cpumask(cm);
	return max + 1;
}

static int distance(int a, int b)
{
	return numa_available() < 0 ? (a == b ? 10 : 20) : numa_distance(a, b);
}

/* Where are the pool's pages? One query per page, or per 2 MiB for pools of huge pages. */
static void pool_pages(struct hyb_backend *b, struct pool_pages *pp)
{
	const struct hyb_mempool_info *pi = &pp->info;
	uint64_t step = (pi->flags & (HYB_MEMPOOL_F_KERNEL | HYB_MEMPOOL_F_HUGETLB)) ||
			pi->bytes > (4ULL << 30) ? pi->page_size : 4096;
	struct hyb_mempool *p;
	unsigned long n = (unsigned long)(pi->bytes / step), i;
	void **pages;
	int *status;
	char *a;

	if (hyb_mempool_open_id(b, pi->id, &p)) {
		pp->err = -ENOENT;
		return;
	}
	pages = calloc(n, sizeof(*pages));
	status = calloc(n, sizeof(*status));
	if (!pages || !status) {
		pp->err = -ENOMEM;
	} else if ((pp->err = hyb_mempool_map(p, (void **)&a, NULL)) == 0) {
		for (i = 0; i < n; i++)
			pages[i] = a + i * step;
		if (move_pages(0, n, pages, NULL, status, 0)) {
			pp->err = -errno;
		} else {
			for (i = 0; i < n; i++) {
				if (status[i] >= 0 && status[i] < MAX_NODES)
					pp->on[status[i]] += step;
				else
					pp->absent += step;
			}
		}
	}
	free(pages);
	free(status);
	hyb_mempool_close(p);
}

/* The node to run on: most CPUs, then most free memory. */
static int best_node(const struct node *nodes, int nn)
{
	int best = -1;

	for (int n = 0; n < nn; n++) {
		if (!nodes[n].present || !nodes[n].nr_cpus || nodes[n].mem <= 0)
			continue;
		if (best < 0 || nodes[n].nr_cpus > nodes[best].nr_cpus ||
		    (nodes[n].nr_cpus == nodes[best].nr_cpus && nodes[n].free > nodes[best].free))
			best = n;
	}
	return best < 0 ? 0 : best;
}

/* Nearest node that has CPUs and memory. */
static int nearest_cpu_node(const struct node *nodes, int nn, int from)
{
	int best = -1;

	for (int n = 0; n < nn; n++) {
		if (!nodes[n].present || !nodes[n].nr_cpus || nodes[n].mem <= 0)
			continue;
		if (best < 0 || distance(from, n) < distance(from, best))
			best = n;
	}
	return best < 0 ? from : best;
}

static void recommendation(const struct node *nodes, int nn, int best, char *buf, size_t len)
{
	int compute = 0, memonly = 0;
	size_t k;

	for (int n = 0; n < nn; n++) {
		if (!nodes[n].present)
			continue;
		compute += nodes[n].nr_cpus && nodes[n].mem > 0;
		memonly += !nodes[n].nr_cpus && nodes[n].mem > 0;
	}
	if (compute <= 1)
		k = (size_t)snprintf(buf, len, "one node with CPUs and memory: create every pool on "
				     "node %d and run the compute threads on its CPUs (%s)", best,
				     nodes[best].cpus);
	else
		k = (size_t)snprintf(buf, len, "%d nodes with CPUs: one process should create its "
				     "pools on node %d (most CPUs: %s) and pin its threads there; "
				     "to use every node, split the FFN neurons across nodes in "
				     "proportion to their CPUs (share) with one thread group per "
				     "node", compute, best, nodes[best].cpus);
	if (memonly && k < len)
		snprintf(buf + k, len - k, "; %d node(s) have memory but no CPUs (far memory): keep "
			 "only cold neurons there", memonly);
}

static void advice(const struct node *nodes, int nn, const struct pool_pages *pp, char *buf,
		   size_t len, int *to)
{
	const struct hyb_mempool_info *pi = &pp->info;
	uint64_t on_node = pi->node >= 0 && pi->node < MAX_NODES ? pp->on[pi->node] : 0;

	buf[0] = 0;
	*to = -1;
	if (pp->err)
		return;
	if (pi->node >= 0 && pi->node < nn && !nodes[pi->node].nr_cpus) {
		*to = nearest_cpu_node(nodes, nn, pi->node);
		snprintf(buf, len, "node %d has no CPUs: every access is remote; move it to node %d "
			 "(nearest with CPUs)", pi->node, *to);
	} else if (on_node + pp->absent < pi->bytes) {
		snprintf(buf, len, "%.0f%% of its pages are off node %d: recreate it there",
			 100.0 * (double)(pi->bytes - on_node - pp->absent) / (double)pi->bytes,
			 pi->node);
		*to = pi->node;
	}
}

static void print_json(const struct node *nodes, int nn, const struct pool_pages *pp, int np,
		       const char *backend, const char *note, int best)
{
	char rec[512], adv[256];
	double total = 0;
	int first = 1, to;

	for (int n = 0; n < nn; n++)
		if (nodes[n].present && nodes[n].mem > 0)
			total += nodes[n].nr_cpus;
	printf("{\"nodes\": [");
	for (int n = 0; n < nn; n++) {
		if (!nodes[n].present)
			continue;
		printf("%s\n  {\"node\": %d, \"cpus\": \"%s\", \"nr_cpus\": %d, \"mem_bytes\": %lld, "
		       "\"free_bytes\": %lld, \"share\": %.3f, \"distances\": [", first ? "" : ",", n,
		       nodes[n].cpus, nodes[n].nr_cpus, nodes[n].mem, nodes[n].free,
		       total > 0 && nodes[n].mem > 0 ? nodes[n].nr_cpus / total : 0.0);
		for (int m = 0, f2 = 1; m < nn; m++) {
			if (!nodes[m].present)
				continue;
			printf("%s%d", f2 ? "" : ", ", distance(n, m));
			f2 = 0;
		}
		printf("]}");
		first = 0;
	}
	printf("],\n \"backend\": ");
	if (backend)
		printf("\"%s\"", backend);
	else
		printf("null");
	printf(", \"pools\": [");
	for (int i = 0; i < np; i++) {
		const struct hyb_mempool_info *pi = &pp[i].info;

		printf("%s\n  {\"id\": %u, \"name\": ", i ? "," : "", pi->id);
		ctl_json_str(stdout, pi->name);
		printf(", \"node\": %d, \"bytes\": %llu, \"huge_bytes\": %llu, \"backing\": ",
		       pi->node, (unsigned long long)pi->bytes,
		       (unsigned long long)pi->huge_bytes);
		ctl_json_flags(stdout, pi->flags);
		printf(", \"bytes_on_node\": {");
		for (int n = 0, f2 = 1; n < MAX_NODES; n++) {
			if (!pp[i].on[n])
				continue;
			printf("%s\"%d\": %llu", f2 ? "" : ", ", n,
			       (unsigned long long)pp[i].on[n]);
			f2 = 0;
		}
		printf("}, \"not_present_bytes\": %llu, \"error\": ",
		       (unsigned long long)pp[i].absent);
		if (pp[i].err)
			ctl_json_str(stdout, strerror(-pp[i].err));
		else
			printf("null");
		advice(nodes, nn, &pp[i], adv, sizeof(adv), &to);
		printf(", \"advice\": ");
		if (adv[0]) {
			ctl_json_str(stdout, adv);
			printf(", \"move_to\": %d}", to);
		} else {
			printf("null, \"move_to\": null}");
		}
	}
	recommendation(nodes, nn, best, rec, sizeof(rec));
	printf("%s],\n \"recommended\": {\"node\": %d, \"cpus\": \"%s\", \"reason\": ",
	       np ? "\n" : "", best, nodes[best].cpus);
	ctl_json_str(stdout, rec);
	printf("},\n \"note\": ");
	if (note)
		ctl_json_str(stdout, note);
	else
		printf("null");
	printf("}\n");
}

static void print_text(const struct node *nodes, int nn, const struct pool_pages *pp, int np,
		       const char *backend, const char *note, int best)
{
	char mem[32], fr[32], sz[32], rec[512], adv[256], back[64];
	int present = 0, to;

	for (int n = 0; n < nn; n++)
		present += nodes[n].present;
	printf("NUMA topology: %d node%s\n", present, present == 1 ? "" : "s");
	for (int n = 0; n < nn; n++) {
		if (!nodes[n].present)
			continue;
		ctl_bytes(mem, sizeof(mem), (uint64_t)nodes[n].mem);
		ctl_bytes(fr, sizeof(fr), (uint64_t)nodes[n].free);
		printf("  node %d: cpus %s (%d), memory %s, %s free, distances", n,
		       nodes[n].nr_cpus ? nodes[n].cpus : "none", nodes[n].nr_cpus, mem, fr);
		for (int m = 0; m < nn; m++)
			if (nodes[m].present)
				printf(" %d", distance(n, m));
		printf("\n");
	}
	if (backend)
		printf("pools (backend %s): %s\n", backend, np ? "" : "none");
	if (note)
		printf("%s\n", note);
	for (int i = 0; i < np; i++) {
		const struct hyb_mempool_info *pi = &pp[i].info;

		ctl_bytes(sz, sizeof(sz), pi->bytes);
		ctl_pool_flags(back, sizeof(back), pi->flags);
		printf("  %-24s node %d, %s (%s, %.0f%% huge):", pi->name, pi->node, sz, back,
		       100.0 * pi->huge_bytes / pi->bytes);
		if (pp[i].err)
			printf(" cannot look (%s)", strerror(-pp[i].err));
		for (int n = 0; n < MAX_NODES; n++) {
			if (!pp[i].on[n])
				continue;
			ctl_bytes(sz, sizeof(sz), pp[i].on[n]);
			printf(" node%d %s (%.0f%%)", n, sz, 100.0 * pp[i].on[n] / pi->bytes);
		}
		if (pp[i].absent)
			printf(" not present %.0f%%", 100.0 * pp[i].absent / pi->bytes);
		printf("\n");
		advice(nodes, nn, &pp[i], adv, sizeof(adv), &to);
		if (adv[0])
			printf("    advice: %s (hybctl numa --move %s --node %d)\n", adv, pi->name,
			       to);
	}
	recommendation(nodes, nn, best, rec, sizeof(rec));
	printf("recommended: %s\n", rec);
}

static void print_on_nodes(const struct pool_pages *pp, int json)
{
	char sz[32];

	for (int n = 0, first = 1; n < MAX_NODES; n++) {
		if (!pp->on[n])
			continue;
		if (json) {
			printf("%s\"%d\": %llu", first ? "" : ", ", n,
			       (unsigned long long)pp->on[n]);
		} else {
			ctl_bytes(sz, sizeof(sz), pp->on[n]);
			printf(" node%d %s (%.0f%%)", n, sz, 100.0 * pp->on[n] / pp->info.bytes);
		}
		first = 0;
	}
	if (!json && pp->err)
		printf(" cannot look (%s)", strerror(-pp->err));
}

/*
 * Move a pool, saying where its pages are before and after (the kernel
 * answers, as for the listing). The module moves pools of other processes
 * for CAP_SYS_ADMIN; the local backend only in the process that made them.
 */
static int do_move(enum hyb_backend_kind kind, const char *name, int node, int json)
{
	struct hyb_backend *b = ctl_backend("numa", kind, false);
	static struct pool_pages before, after;
	struct hyb_mempool *p;
	int ret;

	if (!b)
		return 1;
	if (hyb_mempool_open(b, name, &p)) {
		fprintf(stderr, "hybctl numa: %s%s\n", hyb_last_error(),
			hyb_backend_kind(b) == HYB_BACKEND_LOCAL ? " (local pools live inside the "
			"process that made them: it calls hyb_mempool_move)" : "");
		hyb_backend_close(b);
		return 1;
	}
	memset(&before, 0, sizeof(before));
	memset(&after, 0, sizeof(after));
	hyb_mempool_info(p, &before.info);
	pool_pages(b, &before);
	ret = hyb_mempool_move(p, node);
	if (ret == -EOPNOTSUPP || ret == -EPERM)
		fprintf(stderr, "hybctl numa: %s: ask its owner (pid %d) to move '%s' to node "
			"%d\n", hyb_last_error(), before.info.owner_pid, name, node);
	else if (ret)
		fprintf(stderr, "hybctl numa: %s\n", hyb_last_error());
	if (ret) {
		hyb_mempool_close(p);
		hyb_backend_close(b);
		return 1;
	}
	hyb_mempool_info(p, &after.info);
	pool_pages(b, &after);
	if (json) {
		printf("{\"pool\": ");
		ctl_json_str(stdout, name);
		printf(", \"id\": %u, \"bytes\": %llu, \"from\": %d, \"to\": %d, "
		       "\"bytes_on_node_before\": {", before.info.id,
		       (unsigned long long)before.info.bytes, before.info.node, after.info.node);
		print_on_nodes(&before, 1);
		printf("}, \"bytes_on_node_after\": {");
		print_on_nodes(&after, 1);
		printf("}, \"not_present_bytes_after\": %llu, \"error\": ",
		       (unsigned long long)after.absent);
		if (after.err)
			ctl_json_str(stdout, strerror(-after.err));
		else
			printf("null");
		printf("}\n");
	} else {
		printf("pool '%s' moved from node %d to node %d\n  before:", name, before.info.node,
		       after.info.node);
		print_on_nodes(&before, 0);
		printf("\n  after: ");
		print_on_nodes(&after, 0);
		printf("\n");
	}
	hyb_mempool_close(p);
	hyb_backend_close(b);
	return after.err ? 1 : 0;
}

/* --probe: a pool of `mib` MiB on every node with memory (the page counts show where it landed) */
static int make_probes(struct hyb_backend *b, const struct node *nodes, int nn,
		       unsigned long long mib, struct hyb_mempool **probes)
{
	int n = 0;

	for (int i = 0; i < nn; i++) {
		char name[HYB_MEMPOOL_NAME_LEN];

		if (!nodes[i].present || nodes[i].mem <= 0)
			continue;
		snprintf(name, sizeof(name), "hybctl-probe-%d-%d", (int)getpid() % 100000, i);
		if (hyb_mempool_create(b, name, mib << 20, i, 0, 0, &probes[n])) {
			fprintf(stderr, "hybctl numa: probe on node %d: %s\n", i,
				hyb_last_error());
			continue;
		}
		n++;
	}
	return n;
}

/* Every pool of the backend with its pages per node; returns how many. */
static int list_pools(struct hyb_backend *b, struct pool_pages *pp)
{
	uint32_t ids[HYB_MEMPOOL_MAX];
	int n = hyb_mempool_list(b, ids, HYB_MEMPOOL_MAX), np = 0;

	for (int i = 0; i < n && i < HYB_MEMPOOL_MAX; i++) {
		memset(&pp[np], 0, sizeof(pp[np]));
		if (hyb_mempool_stat(b, ids[i], &pp[np].info))
			continue;
		pool_pages(b, &pp[np]);
		np++;
	}
	return np;
}

int cmd_numa(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "json", 0, 0, 'j' }, { "backend", 1, 0, 'b' }, { "move", 1, 0, 'm' },
		{ "node", 1, 0, 'N' }, { "probe", 1, 0, 'p' }, { "help", 0, 0, 'h' },
		{ 0, 0, 0, 0 },
	};
	static struct hyb_mempool *probes[MAX_NODES];
	unsigned long long probe = 0;
	int nprobe = 0;
	enum hyb_backend_kind kind = HYB_BACKEND_AUTO;
	static struct node nodes[MAX_NODES];
	static struct pool_pages pp[HYB_MEMPOOL_MAX];
	const char *move = NULL, *note = NULL, *backend = NULL;
	int c, json = 0, node = -1, have_node = 0, nn, np = 0;
	struct hyb_backend *b;
	char *end;

	optind = 1;
	while ((c = getopt_long(argc, argv, "jh", opts, NULL)) != -1) {
		switch (c) {
		case 'j': json = 1; break;
		case 'm': move = optarg; break;
		case 'N':
			node = (int)strtol(optarg, &end, 10);
			if (*end || !*optarg || node < 0) {
				fprintf(stderr, "hybctl numa: --node '%s' is not a node number\n",
					optarg);
				return 2;
			}
			have_node = 1;
			break;
		case 'p':
			probe = strtoull(optarg, &end, 10);
			if (*end || !probe || probe > (1ULL << 20)) {
				fprintf(stderr, "hybctl numa: --probe '%s' is not a size in MiB\n",
					optarg);
				return 2;
			}
			break;
		case 'b':
			if (ctl_parse_backend("numa", optarg, &kind))
				return 2;
			break;
		case 'h': fputs(usage, stdout); return 0;
		default: fputs(usage, stderr); return 2;
		}
	}
	if (optind < argc || !move != !have_node || (move && probe)) {
		fprintf(stderr, "hybctl numa: %s\n%s", optind < argc ? "unexpected argument" :
			"--move POOL and --node N go together (without --probe)", usage);
		return 2;
	}
	if (move)
		return do_move(kind, move, node, json);

	nn = topo_read(nodes);
	/* The module's pools if it is loaded; the topology and advice work without it. */
	b = ctl_backend("numa", kind, kind == HYB_BACKEND_AUTO && !probe);
	if (!b && (kind != HYB_BACKEND_AUTO || probe))
		return 1;
	nprobe = probe ? make_probes(b, nodes, nn, probe, probes) : 0;
	if (!b) {
		note = "hybpool module not loaded: no shared pools to show (embedded pools live "
		       "inside the process that made them)";
	} else {
		backend = hyb_backend_name(hyb_backend_kind(b));
		np = list_pools(b, pp);
		if (hyb_backend_kind(b) == HYB_BACKEND_LOCAL && !np && !probe)
			note = "local backend: pools live inside the process that made them; none "
			       "here";
	}
	if (json)
		print_json(nodes, nn, pp, np, backend, note, best_node(nodes, nn));
	else
		print_text(nodes, nn, pp, np, backend, note, best_node(nodes, nn));
	for (int i = 0; i < nprobe; i++)
		hyb_mempool_close(probes[i]);
	hyb_backend_close(b);	/* destroys the probes */
	return probe && !nprobe ? 1 : 0;
}
