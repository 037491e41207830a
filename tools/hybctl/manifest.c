// SPDX-License-Identifier: MIT
/*
 * hybctl manifest: where a loaded model lives - pools per NUMA node, the
 * placement policy, each tensor's pool and offset, each FFN bundle's. Reads
 * the manifest hybd publishes (hyb/manifest.h): its file in the state
 * directory, or its pool through the module. Read-only.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hyb/manifest.h"
#include "hyb/tensor_type.h"
#include "hybctl.h"

int cmd_manifest(int argc, char **argv);

static const char usage[] =
	"usage: hybctl manifest [FILE] [--name NAME] [--pool POOL] [--backend kmod|local]\n"
	"                       [--json] [--tensors] [--bundles] [--find TENSOR]\n"
	"  the model hybd loaded: pools per NUMA node and the placement policy, and with\n"
	"  --tensors / --bundles where each tensor / FFN bundle is (pool, offset, bytes).\n"
	"  FILE         a manifest file (default: STATE_DIR/NAME.manifest, STATE_DIR from\n"
	"               $HYB_STATE_DIR, /run/hybd for root, else $XDG_RUNTIME_DIR/hybd)\n"
	"  --name NAME  the hybd instance (default hyb)\n"
	"  --pool POOL  read the manifest pool instead (box mode; default NAME.manifest)\n"
	"  --find T     one tensor; exit status 1 when the model has none of that name\n";

static void human(char *buf, size_t len, uint64_t b)
{
	if (b >= (1ull << 30))
		snprintf(buf, len, "%.1f GiB", b / 1073741824.0);
	else if (b >= (1ull << 20))
		snprintf(buf, len, "%.1f MiB", b / 1048576.0);
	else if (b >= 1024)
		snprintf(buf, len, "%.0f KiB", b / 1024.0);
	else
		snprintf(buf, len, "%llu B", (unsigned long long)b);
}

static const char *state_name(uint32_t s)
{
	return s == HYB_MF_READY ? "ready" : s == HYB_MF_RETIRED ? "retired" : "writing";
}

static const char *role_name(uint32_t r)
{
	return r == HYB_MF_ROLE_PAGE ? "page" : "weights";
}

/* "0-3,8,10-11" from a sorted set of layer flags. */
static void layer_ranges(char *buf, size_t len, const unsigned char *has, uint32_t n)
{
	size_t k = 0;
	int first = 1;

	buf[0] = 0;
	for (uint32_t l = 0; l < n && k < len; l++) {
		uint32_t e = l;

		if (!has[l])
			continue;
		while (e + 1 < n && has[e + 1])
			e++;
		if (e == l)
			k += (size_t)snprintf(buf + k, len - k, "%s%u", first ? "" : ",", l);
		else
			k += (size_t)snprintf(buf + k, len - k, "%s%u-%u", first ? "" : ",", l, e);
		first = 0;
		l = e;
	}
	if (first)
		snprintf(buf, len, "-");
}

static void shape(char *buf, size_t len, const struct hyb_manifest_tensor *t)
{
	size_t k = 0;

	for (uint32_t d = 0; d < t->n_dims && k < len; d++)
		k += (size_t)snprintf(buf + k, len - k, "%s%llu", d ? "x" : "",
				      (unsigned long long)t->ne[d]);
}

/* Layers of the tensors in pool p (p == HYB_MF_NO_POOL with node: paged on that node). */
static void pool_layers(const struct hyb_manifest *m, const struct hyb_manifest_info *mi,
			uint32_t p, int node, char *buf, size_t len, uint32_t *count)
{
	unsigned char *has = calloc(mi->n_layers + 1, 1);
	uint32_t n = 0;

	for (uint32_t i = 0; i < mi->n_tensors; i++) {
		const struct hyb_manifest_tensor *t = hyb_manifest_tensor(m, i);

		bool in = t->pool == p && (p != HYB_MF_NO_POOL || t->node == node);

		for (uint32_t k = 0; k < t->n_parts; k++)
			in |= t->parts[k].pool == p; /* a part of a split tensor */
		if (!in)
			continue;
		n++;
		if (has && t->layer >= 0 && (uint32_t)t->layer < mi->n_layers)
			has[t->layer] = 1;
	}
	if (has)
		layer_ranges(buf, len, has, mi->n_layers);
	else
		snprintf(buf, len, "?");
	free(has);
	*count = n;
}

static void json_tensor(const struct hyb_manifest_tensor *t, const struct hyb_manifest *m)
{
	const struct hyb_mf_pool *p = t->pool == HYB_MF_NO_POOL ? NULL :
				      hyb_manifest_pool(m, t->pool);

	printf("{\"name\": ");
	ctl_json_str(stdout, t->name);
	printf(", \"type\": \"%s\", \"shape\": [", hyb_type_name(t->type));
	for (uint32_t d = 0; d < t->n_dims; d++)
		printf("%s%llu", d ? ", " : "", (unsigned long long)t->ne[d]);
	printf("], \"layer\": %d, \"node\": %d, \"pool\": ", t->layer, t->node);
	if (p) {
		ctl_json_str(stdout, p->name);
		printf(", \"pool_id\": %u, \"pool_off\": %llu", p->id,
		       (unsigned long long)t->pool_off);
	} else {
		printf("null, \"pool_id\": null, \"pool_off\": null");
	}
	printf(", \"bytes\": %llu, \"file_off\": %llu", (unsigned long long)t->bytes,
	       (unsigned long long)t->file_off);
	if (t->n_parts) {
		printf(", \"parts\": [");
		for (uint32_t k = 0; k < t->n_parts; k++) {
			const struct hyb_mf_part *q = &t->parts[k];

			printf("%s{\"row0\": %llu, \"rows\": %llu, \"node\": %d, \"pool\": ",
			       k ? ", " : "", (unsigned long long)q->row0,
			       (unsigned long long)q->rows, q->node);
			ctl_json_str(stdout, hyb_manifest_pool(m, q->pool)->name);
			printf(", \"pool_off\": %llu, \"stride\": %llu}",
			       (unsigned long long)q->pool_off, (unsigned long long)q->stride);
		}
		printf("]");
	}
	printf("}");
}

/* Bytes of a split tensor's parts on node (docs/NUMA.md). */
static uint64_t part_bytes(const struct hyb_manifest_tensor *t, int node)
{
	uint64_t b = 0;

	for (uint32_t k = 0; k < t->n_parts; k++)
		if (t->parts[k].node == node)
			b += t->bytes / t->ne[1] * t->parts[k].rows;
	return b;
}

static void text_tensor(const struct hyb_manifest_tensor *t, const struct hyb_manifest *m)
{
	const struct hyb_mf_pool *p = t->pool == HYB_MF_NO_POOL ? NULL :
				      hyb_manifest_pool(m, t->pool);
	char sh[96], off[32];

	shape(sh, sizeof(sh), t);
	snprintf(off, sizeof(off), "%llu", (unsigned long long)t->pool_off);
	printf("  %-36s %-6s %-18s %4d %-20s %12s %12llu %12llu\n", t->name, hyb_type_name(t->type),
	       sh, t->node, p ? p->name : t->n_parts ? "(split by rows)" : "(on demand)",
	       p ? off : "-", (unsigned long long)t->bytes, (unsigned long long)t->file_off);
	for (uint32_t k = 0; k < t->n_parts; k++) {
		const struct hyb_mf_part *q = &t->parts[k];
		char rows[48];

		snprintf(rows, sizeof(rows), "rows %llu-%llu", (unsigned long long)q->row0,
			 (unsigned long long)(q->row0 + q->rows - 1));
		printf("    %-55s %4d %-20s %12llu stride %llu\n", rows, q->node,
		       hyb_manifest_pool(m, q->pool)->name, (unsigned long long)q->pool_off,
		       (unsigned long long)q->stride);
	}
}

static void print_json(const struct hyb_manifest *m, const struct hyb_manifest_info *mi,
		       const char *source, int bundles)
{
	printf("{\"source\": ");
	ctl_json_str(stdout, source);
	printf(", \"version\": %u, \"state\": \"%s\", \"pid\": %d, \"pid_alive\": %s, "
	       "\"created_ns\": %llu, \"backend\": \"%s\", \"name\": ", mi->version,
	       state_name(mi->state), mi->pid, mi->pid_alive ? "true" : "false",
	       (unsigned long long)mi->created_ns, hyb_backend_name(mi->backend));
	ctl_json_str(stdout, mi->name);
	printf(",\n \"model\": {\"path\": ");
	ctl_json_str(stdout, mi->model_path);
	printf(", \"size\": %llu, \"mtime_ns\": %llu, \"layers\": %u, \"group_size\": %u, "
	       "\"alignment\": %u, \"meta_bytes\": %llu},\n \"placement\": ",
	       (unsigned long long)mi->model_size, (unsigned long long)mi->model_mtime_ns,
	       mi->n_layers, mi->group_size, mi->alignment, (unsigned long long)mi->meta_len);
	ctl_json_str(stdout, mi->placement);
	printf(", \"resident_bytes\": %llu, \"paged_bytes\": %llu,\n \"pools\": [",
	       (unsigned long long)mi->resident_bytes, (unsigned long long)mi->paged_bytes);
	for (uint32_t i = 0; i < mi->n_pools; i++) {
		const struct hyb_mf_pool *p = hyb_manifest_pool(m, i);
		char layers[512];
		uint32_t n;

		pool_layers(m, mi, i, p->node, layers, sizeof(layers), &n);
		printf("%s\n  {\"index\": %u, \"id\": %u, \"name\": ", i ? "," : "", i, p->id);
		ctl_json_str(stdout, p->name);
		printf(", \"node\": %d, \"role\": \"%s\", \"bytes\": %llu, \"used\": %llu, "
		       "\"tensors\": %u, \"layers\": \"%s\"}", p->node, role_name(p->role),
		       (unsigned long long)p->bytes, (unsigned long long)p->used, n, layers);
	}
	printf("],\n \"tensors\": [");
	for (uint32_t i = 0; i < mi->n_tensors; i++) {
		printf("%s\n  ", i ? "," : "");
		json_tensor(hyb_manifest_tensor(m, i), m);
	}
	printf("]");
	if (bundles) {
		printf(",\n \"bundles\": [");
		for (uint32_t i = 0; i < mi->n_bundles; i++) {
			const struct hyb_mf_bundle *b = hyb_manifest_bundle_at(m, i);

			printf("%s\n  {\"layer\": %u, \"group\": %u, \"neurons\": %u, \"pool\": ",
			       i ? "," : "", b->layer, b->group, b->n_neurons);
			if (b->pool == HYB_MF_NO_POOL)
				printf("null, \"pool_off\": null");
			else
				printf("%u, \"pool_off\": %llu", b->pool,
				       (unsigned long long)b->pool_off);
			printf(", \"bytes\": %llu, \"file_off\": %llu}",
			       (unsigned long long)b->bytes, (unsigned long long)b->file_off);
		}
		printf("]");
	}
	printf("}\n");
}

static void print_text(const struct hyb_manifest *m, const struct hyb_manifest_info *mi,
		       const char *source, int tensors, int bundles)
{
	char a[32], b[32], when[64], layers[512];
	time_t t = (time_t)(mi->created_ns / 1000000000ull);
	struct tm tm;
	int nodes[256], nn = 0;

	gmtime_r(&t, &tm);
	strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S UTC", &tm);
	printf("manifest %s: version %u, %s, written by pid %d (%s) at %s\n", source, mi->version,
	       state_name(mi->state), mi->pid, mi->pid_alive ? "running" : "gone: stale", when);
	human(a, sizeof(a), mi->model_size);
	printf("model    %s: %s, %u tensors, %u layers%s, backend %s, instance '%s'\n",
	       mi->model_path, a, mi->n_tensors, mi->n_layers,
	       mi->group_size ? ", plan" : "", hyb_backend_name(mi->backend), mi->name);
	if (mi->group_size)
		printf("bundles  %u (group size %u)\n", mi->n_bundles, mi->group_size);
	human(a, sizeof(a), mi->resident_bytes);
	human(b, sizeof(b), mi->paged_bytes);
	printf("placement %s\nresident %s, on demand %s\n", mi->placement, a, b);
	printf("pools:\n  %5s %-24s %4s %-8s %10s %10s %7s  %s\n", "ID", "NAME", "NODE", "ROLE",
	       "BYTES", "USED", "TENSORS", "LAYERS");
	for (uint32_t i = 0; i < mi->n_pools; i++) {
		const struct hyb_mf_pool *p = hyb_manifest_pool(m, i);
		uint32_t n;
		int k;

		pool_layers(m, mi, i, p->node, layers, sizeof(layers), &n);
		human(a, sizeof(a), p->bytes);
		human(b, sizeof(b), p->used);
		printf("  %5u %-24s %4d %-8s %10s %10s %7u  %s\n", p->id, p->name, p->node,
		       role_name(p->role), a, b, n, p->role == HYB_MF_ROLE_PAGE ? "-" : layers);
		for (k = 0; k < nn && nodes[k] != p->node; k++)
			;
		if (k == nn && nn < 256)
			nodes[nn++] = p->node;
	}
	/* per node: what computes where */
	for (int k = 0; k < nn; k++) {
		uint64_t res = 0, pag = 0, spl = 0;
		uint32_t nt = 0, np = 0, ns = 0;

		for (uint32_t i = 0; i < mi->n_tensors; i++) {
			const struct hyb_manifest_tensor *x = hyb_manifest_tensor(m, i);
			const uint64_t pb = part_bytes(x, nodes[k]);

			spl += pb;
			ns += pb != 0;
			if (x->node != nodes[k])
				continue;
			if (x->pool == HYB_MF_NO_POOL) {
				pag += x->bytes;
				np++;
			} else {
				res += x->bytes;
				nt++;
			}
		}
		human(a, sizeof(a), res);
		printf("node %d: %s resident in %u tensors", nodes[k], a, nt);
		if (ns) {
			human(b, sizeof(b), spl);
			printf(", %s in its rows of %u split expert tensors", b, ns);
		}
		if (np) {
			human(b, sizeof(b), pag);
			pool_layers(m, mi, HYB_MF_NO_POOL, nodes[k], layers, sizeof(layers), &np);
			printf(", %s on demand in %u tensors (layers %s)", b, np, layers);
		}
		printf("\n");
	}
	if (tensors) {
		printf("tensors:\n  %-36s %-6s %-18s %4s %-20s %12s %12s %12s\n", "NAME", "TYPE",
		       "SHAPE", "NODE", "POOL", "OFFSET", "BYTES", "FILE_OFF");
		for (uint32_t i = 0; i < mi->n_tensors; i++)
			text_tensor(hyb_manifest_tensor(m, i), m);
	}
	if (bundles && mi->n_bundles) {
		printf("bundles:\n  %6s %6s %7s %-20s %12s %10s %12s\n", "LAYER", "GROUP",
		       "NEURONS", "POOL", "OFFSET", "BYTES", "FILE_OFF");
		for (uint32_t i = 0; i < mi->n_bundles; i++) {
			const struct hyb_mf_bundle *bu = hyb_manifest_bundle_at(m, i);
			const struct hyb_mf_pool *p = bu->pool == HYB_MF_NO_POOL ? NULL :
						      hyb_manifest_pool(m, bu->pool);

			printf("  %6u %6u %7u %-20s %12llu %10llu %12llu\n", bu->layer, bu->group,
			       bu->n_neurons, p ? p->name : "(on demand)",
			       (unsigned long long)bu->pool_off, (unsigned long long)bu->bytes,
			       (unsigned long long)bu->file_off);
		}
	}
}

int cmd_manifest(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "json", 0, 0, 'j' }, { "tensors", 0, 0, 't' }, { "bundles", 0, 0, 'B' },
		{ "find", 1, 0, 'f' }, { "name", 1, 0, 'n' }, { "pool", 1, 0, 'p' },
		{ "backend", 1, 0, 'b' }, { "help", 0, 0, 'h' }, { 0, 0, 0, 0 },
	};
	enum hyb_backend_kind kind = HYB_BACKEND_AUTO;
	const char *name = "hyb", *pool = NULL, *find = NULL;
	char path[4200], dir[4096], pname[64];
	struct hyb_manifest_info mi;
	struct hyb_backend *b = NULL;
	struct hyb_manifest *m;
	int c, json = 0, tensors = 0, bundles = 0, ret = 0, use_pool = 0;

	optind = 1;
	while ((c = getopt_long(argc, argv, "jh", opts, NULL)) != -1) {
		switch (c) {
		case 'j': json = 1; break;
		case 't': tensors = 1; break;
		case 'B': bundles = 1; break;
		case 'f': find = optarg; break;
		case 'n': name = optarg; break;
		case 'p': pool = optarg; use_pool = 1; break;
		case 'b':
			if (ctl_parse_backend("manifest", optarg, &kind))
				return 2;
			use_pool = 1;
			break;
		case 'h': fputs(usage, stdout); return 0;
		default: fputs(usage, stderr); return 2;
		}
	}
	if (argc - optind > 1 || (optind < argc && use_pool)) {
		fprintf(stderr, "hybctl manifest: give a FILE or --pool, not both\n%s", usage);
		return 2;
	}
	if (optind < argc) {
		snprintf(path, sizeof(path), "%s", argv[optind]);
	} else {
		hyb_state_dir(dir, sizeof(dir));
		snprintf(path, sizeof(path), "%s/%s.manifest", dir, name);
		/* no file here but the module is loaded: its manifest pool */
		if (!use_pool && access(path, F_OK) && !access("/dev/hybpool", F_OK))
			use_pool = 1;
	}
	if (use_pool) {
		snprintf(pname, sizeof(pname), "%s", pool ? pool : "");
		if (!pool)
			snprintf(pname, sizeof(pname), "%.50s.manifest", name);
		b = ctl_backend("manifest", kind, false);
		if (!b)
			return 1;
		m = hyb_manifest_open_pool(b, pname);
		snprintf(path, sizeof(path), "pool %s", pname);
	} else {
		m = hyb_manifest_open(path);
	}
	if (!m) {
		fprintf(stderr, "hybctl manifest: %s\n", hyb_last_error());
		hyb_backend_close(b);
		return 1;
	}
	hyb_manifest_info(m, &mi);
	if (find) {
		const struct hyb_manifest_tensor *t = hyb_manifest_find(m, find);

		if (!t) {
			fprintf(stderr, "hybctl manifest: the model has no tensor '%s'\n", find);
			ret = 1;
		} else if (json) {
			json_tensor(t, m);
			printf("\n");
		} else {
			text_tensor(t, m);
		}
	} else if (json) {
		print_json(m, &mi, path, bundles);
	} else {
		print_text(m, &mi, path, tensors, bundles);
	}
	hyb_manifest_close(m);
	hyb_backend_close(b);
	return ret;
}
