// SPDX-License-Identifier: MIT
/* NUMA placement of tensors into pools (see numa_place.h for the policies and why). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyb/manifest.h"
#include "log.h"
#include "numa_place.h"

#define BLK 4096u

int32_t hyb_numa_place_layer_of(const char *name)
{
	char *end;
	long l;

	if (strncmp(name, "blk.", 4) || name[4] < '0' || name[4] > '9')
		return -1;
	l = strtol(name + 4, &end, 10);
	if (*end != '.' || l < 0 || l > 1000000)
		return -1;
	return (int32_t)l;
}

bool hyb_numa_place_pageable(const char *name)
{
	return strstr(name, "ffn_gate") || strstr(name, "ffn_up") || strstr(name, "ffn_down") ||
	       strstr(name, "ffn_bundles");
}

int hyb_numa_place_parse_policy(const char *s, enum hyb_numa_place_policy *out)
{
	if (!strcmp(s, "layer"))
		*out = HYB_NUMA_PLACE_LAYER;
	else if (!strcmp(s, "interleave") || !strcmp(s, "interleaved"))
		*out = HYB_NUMA_PLACE_INTERLEAVE;
	else if (!strcmp(s, "explicit"))
		*out = HYB_NUMA_PLACE_EXPLICIT;
	else
		return -1;
	return 0;
}

const char *hyb_numa_place_policy_name(enum hyb_numa_place_policy p)
{
	return p == HYB_NUMA_PLACE_LAYER ? "layer" : p == HYB_NUMA_PLACE_INTERLEAVE ? "interleave" :
	       "explicit";
}

static int parse_node(const char *s, int *out)
{
	char *end;
	long v;

	if (*s < '0' || *s > '9')
		return -1;
	v = strtol(s, &end, 10);
	if (*end || v < 0 || v >= 1024)
		return -1;
	*out = (int)v;
	return 0;
}

/* Trim spaces in place; returns the start. */
static char *trim(char *s)
{
	char *e;

	while (*s == ' ' || *s == '\t')
		s++;
	e = s + strlen(s);
	while (e > s && (e[-1] == ' ' || e[-1] == '\t'))
		*--e = 0;
	return s;
}

int hyb_numa_place_parse_rules(struct hyb_numa_place_config *cfg, const char *s, char *err, size_t errlen)
{
	char buf[4096], *save = NULL, *tok;

	if (strlen(s) >= sizeof(buf))
		return hyb_errf(err, errlen, "placement rules too long");
	snprintf(buf, sizeof(buf), "%s", s);
	for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		char *r = trim(tok), *colon = strrchr(r, ':');
		struct hyb_numa_place_rule *rule;

		if (!*r)
			continue;
		if (!colon || colon == r)
			return hyb_errf(err, errlen, "placement rule '%s': expected PREFIX:NODE", r);
		*colon = 0;
		if (cfg->n_rules == HYB_NUMA_PLACE_MAX_RULES)
			return hyb_errf(err, errlen, "more than %d placement rules",
				    HYB_NUMA_PLACE_MAX_RULES);
		rule = &cfg->rules[cfg->n_rules];
		if (parse_node(trim(colon + 1), &rule->node))
			return hyb_errf(err, errlen, "placement rule '%s:%s': '%s' is not a node "
				    "number", r, colon + 1, trim(colon + 1));
		r = trim(r);
		if (strlen(r) >= HYB_NUMA_PLACE_PREFIX_LEN)
			return hyb_errf(err, errlen, "placement rule prefix '%s' is longer than %d", r,
				    HYB_NUMA_PLACE_PREFIX_LEN - 1);
		snprintf(rule->prefix, sizeof(rule->prefix), "%s", r);
		cfg->n_rules++;
	}
	return 0;
}

int hyb_numa_place_parse_nodes(struct hyb_numa_place_config *cfg, const char *s, char *err, size_t errlen)
{
	char buf[1024], *save = NULL, *tok;
	unsigned int n = 0;

	if (strlen(s) >= sizeof(buf))
		return hyb_errf(err, errlen, "node list too long");
	snprintf(buf, sizeof(buf), "%s", s);
	for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		char *t = trim(tok), *dash = strchr(t, '-');
		int a, b;

		if (dash) {
			*dash = 0;
			if (parse_node(trim(t), &a) || parse_node(trim(dash + 1), &b) || b < a)
				return hyb_errf(err, errlen, "node range '%s-%s' is not N-M", t,
					    dash + 1);
		} else if (parse_node(t, &a)) {
			return hyb_errf(err, errlen, "'%s' is not a node number", t);
		} else {
			b = a;
		}
		for (int v = a; v <= b; v++) {
			for (unsigned int i = 0; i < n; i++)
				if (cfg->nodes[i] == v)
					return hyb_errf(err, errlen, "node %d listed twice", v);
			if (n == HYB_NUMA_PLACE_MAX_NODES)
				return hyb_errf(err, errlen, "more than %d nodes", HYB_NUMA_PLACE_MAX_NODES);
			cfg->nodes[n++] = v;
		}
	}
	if (!n)
		return hyb_errf(err, errlen, "empty node list");
	cfg->n_nodes = n;
	return 0;
}

/* -- node per tensor ----------------------------------------------------- */

static int rule_node(const struct hyb_numa_place_config *cfg, const char *name)
{
	int best = -1;
	size_t best_len = 0;

	for (unsigned int i = 0; i < cfg->n_rules; i++) {
		const char *p = cfg->rules[i].prefix;
		size_t len = strcmp(p, "*") ? strlen(p) : 0;

		if (len && strncmp(name, p, len))
			continue;
		if (best < 0 || len > best_len) {
			best = cfg->rules[i].node;
			best_len = len;
		}
	}
	return best;
}

static int assign_nodes(const struct hyb_numa_place_config *cfg, struct hyb_numa_place_tensor *t,
			unsigned int n, uint32_t n_layers, char *err, size_t errlen)
{
	uint64_t *lbytes, total = 0, acc = 0;
	int *lnode, last;

	if (cfg->policy == HYB_NUMA_PLACE_EXPLICIT) {
		if (!cfg->n_rules)
			return hyb_errf(err, errlen, "placement explicit needs rules (place = "
				    "PREFIX:NODE, ...)");
		for (unsigned int i = 0; i < n; i++) {
			t[i].node = rule_node(cfg, t[i].name);
			if (t[i].node < 0)
				return hyb_errf(err, errlen, "tensor %s matches no placement rule (add "
					    "a rule '*:NODE' for the rest)", t[i].name);
		}
		return 0;
	}
	if (!cfg->n_nodes)
		return hyb_errf(err, errlen, "placement needs at least one node");
	lbytes = calloc(n_layers + 1, sizeof(*lbytes));
	lnode = calloc(n_layers + 1, sizeof(*lnode));
	if (!lbytes || !lnode) {
		free(lbytes);
		free(lnode);
		return hyb_errf(err, errlen, "out of memory");
	}
	for (unsigned int i = 0; i < n; i++) {
		if (t[i].layer >= 0) {
			lbytes[t[i].layer] += t[i].bytes;
			total += t[i].bytes;
		}
	}
	for (uint32_t l = 0; l < n_layers; l++) {
		unsigned int k;

		if (cfg->policy == HYB_NUMA_PLACE_INTERLEAVE) {
			k = l % cfg->n_nodes;
		} else {
			/* the node whose share of the bytes holds this layer's midpoint */
			double mid = total ? (acc + lbytes[l] / 2.0) / total :
				     (l + 0.5) / n_layers;

			k = (unsigned int)(mid * cfg->n_nodes);
			if (k >= cfg->n_nodes)
				k = cfg->n_nodes - 1;
		}
		acc += lbytes[l];
		lnode[l] = cfg->nodes[k];
	}
	last = n_layers ? lnode[n_layers - 1] : cfg->nodes[0];
	for (unsigned int i = 0; i < n; i++) {
		if (t[i].layer >= 0)
			t[i].node = lnode[t[i].layer];
		else if (!strncmp(t[i].name, "token_embd", 10))
			t[i].node = cfg->nodes[0];	/* read first, by layer 0's node */
		else
			t[i].node = last;	/* output head, final norm: after the last layer */
	}
	free(lbytes);
	free(lnode);
	return 0;
}

/* -- expert tensors split by rows (docs/NUMA.md) -------------------------- */

static bool is_expert_tensor(const struct hyb_numa_place_tensor *t)
{
	return t->ne2 > 1 && t->ne1 && strstr(t->name, "_exps");
}

int hyb_numa_place_check_split(const struct hyb_numa_place_config *cfg, char *err, size_t errlen)
{
	char list[128] = "";
	size_t k = 0;

	if (cfg->policy == HYB_NUMA_PLACE_EXPLICIT)
		return hyb_errf(err, errlen, "split_experts needs placement layer or interleave, "
			    "not explicit");
	if (cfg->n_nodes < 2 || cfg->n_nodes > HYB_MF_MAX_PARTS) {
		for (unsigned int i = 0; i < cfg->n_nodes && k < sizeof(list); i++)
			k += (size_t)snprintf(list + k, sizeof(list) - k, "%s%d", i ? "," : "",
					      cfg->nodes[i]);
		return hyb_errf(err, errlen, "split_experts needs 2 to %d nodes; nodes = %s lists %u",
			    HYB_MF_MAX_PARTS, list, cfg->n_nodes);
	}
	if (cfg->dram_budget)
		return hyb_errf(err, errlen, "split_experts needs every expert tensor resident: "
			    "unset dram_budget");
	return 0;
}

/*
 * Each expert tensor's rows cut at the multiples of 16 (the CPU kernels'
 * tile) closest to ne1 * i / n, one part per node; a part's stride keeps
 * every expert's slice at its file phase modulo 4096 (one O_DIRECT run
 * each). Tensors too small for a part per node stay whole.
 */
static int split_experts(const struct hyb_numa_place_config *cfg, struct hyb_numa_place_tensor *t,
			 unsigned int n, char *err, size_t errlen)
{
	const unsigned int nn = cfg->n_nodes;

	if (hyb_numa_place_check_split(cfg, err, errlen))
		return -1;
	for (unsigned int i = 0; i < n; i++) {
		struct hyb_numa_place_tensor *x = &t[i];
		uint64_t rb, cut[HYB_MF_MAX_PARTS + 1];
		bool ok = true;

		x->n_parts = 0;
		if (!is_expert_tensor(x))
			continue;
		if (x->ne1 > x->bytes || x->ne2 > x->bytes / x->ne1 || x->bytes % (x->ne1 * x->ne2))
			return hyb_errf(err, errlen, "tensor %s: %llu bytes are not %llu x %llu whole "
				    "rows", x->name, (unsigned long long)x->bytes,
				    (unsigned long long)x->ne2, (unsigned long long)x->ne1);
		rb = x->bytes / (x->ne1 * x->ne2);
		cut[0] = 0;
		cut[nn] = x->ne1;
		for (unsigned int k = 1; k < nn; k++)
			cut[k] = (x->ne1 * k + 8 * nn) / (16 * nn) * 16;	/* round(ne1 k / 16 n) */
		for (unsigned int k = 0; k < nn; k++)
			ok &= cut[k + 1] > cut[k];
		if (!ok)
			continue;
		for (unsigned int k = 0; k < nn; k++) {
			struct hyb_numa_place_part *pt = &x->parts[k];
			const uint64_t bytes = (cut[k + 1] - cut[k]) * rb;

			pt->node = cfg->nodes[k];
			pt->row0 = cut[k];
			pt->rows = cut[k + 1] - cut[k];
			/* the least >= bytes that is = the file's expert stride mod 4096 */
			pt->stride = bytes + ((x->ne1 * rb) % BLK + BLK - bytes % BLK) % BLK;
			pt->pool = HYB_NUMA_PLACE_NO_POOL;
		}
		x->n_parts = nn;
	}
	return 0;
}

/* -- residency ----------------------------------------------------------- */

static uint64_t padded(const struct hyb_numa_place_tensor *t)
{
	return t->bytes + BLK - 1;	/* worst case: a run start aligned to its file phase */
}

/* Mark paged tensors (pool = NO_POOL) when the budget is short; ord: file order. */
static int choose_resident(const struct hyb_numa_place_config *cfg, struct hyb_numa_place_tensor *t,
			   const unsigned int *ord, unsigned int n, char *err, size_t errlen)
{
	uint64_t total = 0, avail, used = 0, dense = 0;
	int nodes[HYB_NUMA_PLACE_MAX_NODES];
	unsigned int nn = 0;

	for (unsigned int i = 0; i < n; i++) {
		t[i].pool = 0;	/* resident until decided otherwise */
		total += padded(&t[i]);
	}
	if (!cfg->dram_budget || total <= cfg->dram_budget)
		return 0;
	/* every node with pageable tensors may need a page pool */
	for (unsigned int i = 0; i < n; i++) {
		unsigned int j;

		if (!hyb_numa_place_pageable(t[i].name))
			continue;
		for (j = 0; j < nn && nodes[j] != t[i].node; j++)
			;
		if (j == nn && nn < HYB_NUMA_PLACE_MAX_NODES)
			nodes[nn++] = t[i].node;
	}
	if (!cfg->page_pool)
		return hyb_errf(err, errlen, "the model (%llu bytes) is larger than dram_budget "
			    "(%llu) and page_pool is 0: nowhere to load the rest on demand",
			    (unsigned long long)total, (unsigned long long)cfg->dram_budget);
	if (cfg->page_pool * nn >= cfg->dram_budget)
		return hyb_errf(err, errlen, "dram_budget %llu cannot hold %u page pool(s) of %llu "
			    "bytes", (unsigned long long)cfg->dram_budget, nn,
			    (unsigned long long)cfg->page_pool);
	avail = cfg->dram_budget - cfg->page_pool * nn;
	for (unsigned int i = 0; i < n; i++)
		if (!hyb_numa_place_pageable(t[i].name))
			dense += padded(&t[i]);
	if (dense > avail)
		return hyb_errf(err, errlen, "dram_budget %llu is too small: the non-FFN tensors need "
			    "%llu bytes, plus %u page pool(s) of %llu",
			    (unsigned long long)cfg->dram_budget, (unsigned long long)dense, nn,
			    (unsigned long long)cfg->page_pool);
	used = dense;
	for (unsigned int k = 0; k < n; k++) {
		struct hyb_numa_place_tensor *x = &t[ord[k]];

		if (!hyb_numa_place_pageable(x->name))
			continue;
		if (used + padded(x) <= avail)
			used += padded(x);
		else
			x->pool = HYB_NUMA_PLACE_NO_POOL;
	}
	return 0;
}

/* -- pools and layout ---------------------------------------------------- */

static int cmp_file(const void *a, const void *b, void *base)
{
	const struct hyb_numa_place_tensor *x = (const struct hyb_numa_place_tensor *)base +
					   *(const unsigned int *)a;
	const struct hyb_numa_place_tensor *y = (const struct hyb_numa_place_tensor *)base +
					   *(const unsigned int *)b;

	if (x->file_off != y->file_off)
		return x->file_off < y->file_off ? -1 : 1;
	return *(const unsigned int *)a < *(const unsigned int *)b ? -1 : 1;
}

static int add_pool(struct hyb_numa_placement *p, int node, uint32_t role, uint32_t k)
{
	struct hyb_numa_place_pool *np = realloc(p->pools, (p->n_pools + 1) * sizeof(*np));

	if (!np)
		return -1;
	p->pools = np;
	np[p->n_pools] = (struct hyb_numa_place_pool){ .node = node, .role = role, .k = k };
	return (int)p->n_pools++;
}

static int add_run(struct hyb_numa_placement *p, const struct hyb_numa_place_run *r)
{
	struct hyb_numa_place_run *nr;

	if (p->n_runs % 64 == 0) {
		nr = realloc(p->runs, (p->n_runs + 64) * sizeof(*nr));
		if (!nr)
			return -1;
		p->runs = nr;
	}
	p->runs[p->n_runs++] = *r;
	return 0;
}

/* Nodes in first-use order of the placement (cfg order first). */
static unsigned int used_nodes(const struct hyb_numa_place_config *cfg, const struct hyb_numa_place_tensor *t,
			       unsigned int n, int *nodes)
{
	unsigned int nn = 0, j;

	for (unsigned int i = 0; i < cfg->n_nodes; i++) {
		for (j = 0; j < nn && nodes[j] != cfg->nodes[i]; j++)
			;
		if (j == nn)
			nodes[nn++] = cfg->nodes[i];
	}
	for (unsigned int i = 0; i < n; i++) {
		for (j = 0; j < nn && nodes[j] != t[i].node; j++)
			;
		if (j == nn && nn < HYB_NUMA_PLACE_MAX_NODES * 2)
			nodes[nn++] = t[i].node;
	}
	return nn;
}

/*
 * Bytes of piece i of x resident on node: a whole tensor is one piece, a
 * split one has a piece per part (two parts may share a node).
 */
static uint64_t piece_on(const struct hyb_numa_place_tensor *x, int node, unsigned int i)
{
	if (x->n_parts)
		return i < x->n_parts && x->parts[i].node == node ?
		       (x->ne2 - 1) * x->parts[i].stride +
		       x->parts[i].rows * (x->bytes / (x->ne1 * x->ne2)) : 0;
	return !i && x->node == node && x->pool != HYB_NUMA_PLACE_NO_POOL ? x->bytes : 0;
}

/*
 * A split tensor's parts at the ends of their pools, each at its file
 * phase, then one run per (expert, part) in file order.
 */
static int lay_out_parts(struct hyb_numa_place_tensor *x, uint64_t *cur, struct hyb_numa_placement *p)
{
	const uint64_t rb = x->bytes / (x->ne1 * x->ne2);

	for (unsigned int i = 0; i < x->n_parts; i++) {
		struct hyb_numa_place_part *pt = &x->parts[i];
		const uint64_t c = cur[pt->pool], ph = (x->file_off + pt->row0 * rb) % BLK;
		const uint64_t span = (x->ne2 - 1) * pt->stride + pt->rows * rb;

		pt->pool_off = c + (ph + BLK - c % BLK) % BLK;
		cur[pt->pool] = pt->pool_off + span;
		p->pools[pt->pool].used += pt->rows * rb * x->ne2;
	}
	for (uint64_t e = 0; e < x->ne2; e++) {
		for (unsigned int i = 0; i < x->n_parts; i++) {
			const struct hyb_numa_place_part *pt = &x->parts[i];
			const struct hyb_numa_place_run r = {
				.pool = pt->pool,
				.pool_off = pt->pool_off + e * pt->stride,
				.file_off = x->file_off + (e * x->ne1 + pt->row0) * rb,
				.len = pt->rows * rb,
			};

			if (add_run(p, &r))
				return -1;
		}
	}
	p->resident += x->bytes;
	return 0;
}

static int build_pools(const struct hyb_numa_place_config *cfg, struct hyb_numa_place_tensor *t,
		       const unsigned int *ord, unsigned int n, struct hyb_numa_placement *p)
{
	int nodes[HYB_NUMA_PLACE_MAX_NODES * 2];
	unsigned int nn = used_nodes(cfg, t, n, nodes);
	unsigned int kmax = cfg->pools_per_node ? cfg->pools_per_node : 1;
	uint64_t *cur;
	uint32_t last_pool = HYB_NUMA_PLACE_NO_POOL;
	struct hyb_numa_place_run run = { 0 };

	/* split each node's resident tensors (file order) into kmax pools by bytes */
	for (unsigned int j = 0; j < nn; j++) {
		uint64_t node_total = 0, acc = 0;
		int first = -1, prev_k = -1;

		for (unsigned int i = 0; i < n; i++)
			for (unsigned int q = 0; q < HYB_MF_MAX_PARTS; q++)
				node_total += piece_on(&t[i], nodes[j], q);
		for (unsigned int k = 0; k < n * HYB_MF_MAX_PARTS; k++) {
			struct hyb_numa_place_tensor *x = &t[ord[k / HYB_MF_MAX_PARTS]];
			const unsigned int part = k % HYB_MF_MAX_PARTS;
			const uint64_t bytes = piece_on(x, nodes[j], part);
			unsigned int pk;

			if (!bytes)
				continue;
			pk = node_total ?
			     (unsigned int)((acc + bytes / 2.0) * kmax / node_total) : 0;
			if (pk >= kmax)
				pk = kmax - 1;
			acc += bytes;
			if ((int)pk != prev_k) {
				int idx = add_pool(p, nodes[j], HYB_NUMA_PLACE_WEIGHTS,
						   first < 0 ? 0 : p->pools[p->n_pools - 1].k + 1);

				if (idx < 0)
					return -1;
				if (first < 0)
					first = idx;
				prev_k = (int)pk;
			}
			if (x->n_parts)
				x->parts[part].pool = p->n_pools - 1;
			else
				x->pool = p->n_pools - 1;
		}
	}
	/* page pools where something is left on storage */
	for (unsigned int j = 0; j < nn; j++) {
		for (unsigned int i = 0; i < n; i++) {
			if (t[i].node != nodes[j] || t[i].pool != HYB_NUMA_PLACE_NO_POOL)
				continue;
			if (add_pool(p, nodes[j], HYB_NUMA_PLACE_PAGE, 0) < 0)
				return -1;
			p->pools[p->n_pools - 1].bytes = cfg->page_pool;
			break;
		}
	}
	/* lay out runs in file order */
	cur = calloc(p->n_pools + 1, sizeof(*cur));
	if (!cur)
		return -1;
	for (unsigned int k = 0; k < n; k++) {
		struct hyb_numa_place_tensor *x = &t[ord[k]];
		struct hyb_numa_place_pool *pp;
		uint64_t end;

		if (x->n_parts) {
			if (lay_out_parts(x, cur, p))
				goto oom;
			last_pool = HYB_NUMA_PLACE_NO_POOL;	/* the next tensor starts a run */
			continue;
		}
		if (x->pool == HYB_NUMA_PLACE_NO_POOL) {
			x->pool_off = 0;
			last_pool = HYB_NUMA_PLACE_NO_POOL;
			continue;
		}
		pp = &p->pools[x->pool];
		if (x->pool == last_pool && x->file_off >= run.file_off) {
			/* continues the run: the file's layout, gaps included */
			x->pool_off = run.pool_off + (x->file_off - run.file_off);
			if (x->file_off + x->bytes > run.file_off + run.len)
				run.len = x->file_off + x->bytes - run.file_off;
			p->runs[p->n_runs - 1].len = run.len;
		} else {
			uint64_t c = cur[x->pool];

			x->pool_off = c + ((x->file_off % BLK) + BLK - (c % BLK)) % BLK;
			run = (struct hyb_numa_place_run){ .pool = x->pool, .pool_off = x->pool_off,
						      .file_off = x->file_off, .len = x->bytes };
			if (add_run(p, &run))
				goto oom;
		}
		end = x->pool_off + x->bytes;
		if (end > cur[x->pool])
			cur[x->pool] = end;
		pp->used += x->bytes;
		last_pool = x->pool;
		p->resident += x->bytes;
	}
	for (unsigned int i = 0; i < p->n_pools; i++)
		if (p->pools[i].role == HYB_NUMA_PLACE_WEIGHTS)
			p->pools[i].bytes = cur[i] ? cur[i] : 1;
	free(cur);
	return 0;
oom:
	free(cur);
	return -1;
}

static void describe(const struct hyb_numa_place_config *cfg, struct hyb_numa_placement *p)
{
	size_t len = sizeof(p->desc), k;

	k = (size_t)snprintf(p->desc, len, "%s", hyb_numa_place_policy_name(cfg->policy));
	if (cfg->policy == HYB_NUMA_PLACE_EXPLICIT) {
		for (unsigned int i = 0; i < cfg->n_rules && k < len; i++)
			k += (size_t)snprintf(p->desc + k, len - k, "%s%s:%d", i ? "," : " rules=",
					      cfg->rules[i].prefix, cfg->rules[i].node);
	} else {
		for (unsigned int i = 0; i < cfg->n_nodes && k < len; i++)
			k += (size_t)snprintf(p->desc + k, len - k, "%s%d", i ? "," : " nodes=",
					      cfg->nodes[i]);
	}
	if (cfg->pools_per_node > 1 && k < len)
		k += (size_t)snprintf(p->desc + k, len - k, " pools_per_node=%u",
				      cfg->pools_per_node);
	if (cfg->split_experts && k < len)
		k += (size_t)snprintf(p->desc + k, len - k, " split_experts");
	if (cfg->dram_budget && k < len)
		snprintf(p->desc + k, len - k, " dram_budget=%llu page_pool=%llu",
			 (unsigned long long)cfg->dram_budget, (unsigned long long)cfg->page_pool);
}

int hyb_numa_place(const struct hyb_numa_place_config *cfg, struct hyb_numa_place_tensor *t, unsigned int n,
	      uint32_t n_layers, struct hyb_numa_placement *out, char *err, size_t errlen)
{
	unsigned int *ord;

	memset(out, 0, sizeof(*out));
	for (unsigned int i = 0; i < n; i++) {
		if (t[i].layer >= 0 && (uint32_t)t[i].layer >= n_layers)
			n_layers = (uint32_t)t[i].layer + 1;
		if (t[i].file_off + t[i].bytes < t[i].file_off)
			return hyb_errf(err, errlen, "tensor %s: range overflows", t[i].name);
	}
	ord = malloc((n + 1) * sizeof(*ord));
	if (!ord)
		return hyb_errf(err, errlen, "out of memory");
	for (unsigned int i = 0; i < n; i++)
		ord[i] = i;
	qsort_r(ord, n, sizeof(*ord), cmp_file, t);
	for (unsigned int i = 0; i < n; i++)
		t[i].n_parts = 0;
	if (assign_nodes(cfg, t, n, n_layers, err, errlen) ||
	    (cfg->split_experts && split_experts(cfg, t, n, err, errlen)) ||
	    choose_resident(cfg, t, ord, n, err, errlen)) {
		free(ord);
		return -1;
	}
	if (build_pools(cfg, t, ord, n, out)) {
		free(ord);
		hyb_numa_placement_free(out);
		return hyb_errf(err, errlen, "out of memory");
	}
	for (unsigned int i = 0; i < n; i++) {
		if (t[i].n_parts) {
			t[i].node = -1;		/* on every node: its parts say where */
			t[i].pool = t[i].parts[0].pool;
			t[i].pool_off = 0;
		} else if (t[i].pool == HYB_NUMA_PLACE_NO_POOL) {
			out->paged += t[i].bytes;
		}
	}
	describe(cfg, out);
	free(ord);
	return 0;
}

void hyb_numa_placement_free(struct hyb_numa_placement *p)
{
	free(p->pools);
	free(p->runs);
	memset(p, 0, sizeof(*p));
}
