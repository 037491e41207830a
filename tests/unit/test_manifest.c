// SPDX-License-Identifier: MIT
/*
 * The model manifest (hyb/manifest.h, daemon/manifest_write.c) and NUMA
 * placement (daemon/numa_place.c): a manifest round-trips through the builder
 * and the reader, is found by name in any order of insertion, is refused
 * whole when any byte is wrong (never read out of bounds), is published
 * complete or not at all (pool state, file rename) and retired on shutdown;
 * placement policies put layers on the nodes they promise, keep every run
 * aligned like the file (O_DIRECT straight into the pool), never overlap
 * tensors, and page FFN weights out when the DRAM budget is short.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/manifest_write.h"
#include "daemon/numa_place.h"
#include "hyb/manifest.h"
#include "test.h"

/* -- a small manifest ---------------------------------------------------- */

static const char *const names[] = {
	"output.weight", "blk.1.ffn_up.weight", "token_embd.weight", "blk.0.attn_q.weight",
	"blk.0.ffn_bundles", "blk.1.attn_q.weight", "output_norm.weight",
};
#define N_NAMES (sizeof(names) / sizeof(names[0]))

static uint8_t *build(size_t *len, uint32_t pool_id)
{
	static const uint8_t meta[] = "GGUF....metadata";
	struct hyb_mf_model mm = {
		.path = "/models/m.gguf", .size = 123456789, .mtime_ns = 42, .alignment = 32,
		.n_layers = 2, .group_size = 4, .meta = meta, .meta_len = sizeof(meta),
		.name = "hyb", .placement = "layer nodes=0,1", .backend = HYB_BACKEND_LOCAL,
	};
	struct hyb_mf_builder *b = hyb_mf_builder_new(&mm);
	struct hyb_mf_pool p0 = { .id = pool_id, .node = 0, .role = HYB_MF_ROLE_WEIGHTS,
				  .bytes = 1 << 20, .used = 5000, .name = "hyb.n0" };
	struct hyb_mf_pool p1 = { .id = pool_id + 1, .node = 1, .role = HYB_MF_ROLE_PAGE,
				  .bytes = 2 << 20, .name = "hyb.page.n1" };
	uint8_t *buf;
	char err[256];

	CHECK(b);
	CHECK_EQ_INT(hyb_mf_add_pool(b, &p0), 0);
	CHECK_EQ_INT(hyb_mf_add_pool(b, &p1), 1);
	for (unsigned int i = 0; i < N_NAMES; i++) {
		struct hyb_mf_tensor t = {
			.type = i % 2, .n_dims = 2, .ne = { 8, i + 1, 1, 1 },
			.layer = hyb_numa_place_layer_of(names[i]), .node = i == 1 ? 1 : 0,
			.pool = i == 1 ? HYB_MF_NO_POOL : 0, .pool_off = 1000 * i, .bytes = 100 + i,
			.file_off = 4096 + 1000 * i,
		};

		CHECK(!hyb_mf_add_tensor(b, names[i], &t));
	}
	for (int g = 2; g >= 0; g--) {	/* out of order on purpose */
		struct hyb_mf_bundle bu = { .layer = 0, .group = (uint32_t)g,
					    .n_neurons = g == 2 ? 2 : 4, .pool = 0,
					    .pool_off = 4000 + 96 * g, .bytes = 96,
					    .file_off = 8096 + 96 * g };

		CHECK(!hyb_mf_add_bundle(b, &bu));
	}
	CHECK_MSG(!hyb_mf_build(b, &buf, len, err, sizeof(err)), "%s", err);
	hyb_mf_builder_free(b);
	return buf;
}

TEST(manifest_roundtrip_find_and_bundles)
{
	struct hyb_manifest_info mi;
	struct hyb_manifest *m;
	const struct hyb_mf_bundle *bu;
	size_t len;
	uint8_t *buf = build(&len, 7);

	m = hyb_manifest_parse(buf, len);
	CHECK_MSG(m, "%s", hyb_last_error());
	hyb_manifest_info(m, &mi);
	CHECK_EQ_INT(mi.version, HYB_MF_VERSION);
	CHECK_EQ_INT(mi.state, HYB_MF_READY);
	CHECK_EQ_INT(mi.n_tensors, N_NAMES);
	CHECK_EQ_INT(mi.n_pools, 2);
	CHECK_EQ_INT(mi.n_bundles, 3);
	CHECK_EQ_INT(mi.pid, getpid());
	CHECK(mi.pid_alive);
	CHECK(!strcmp(mi.model_path, "/models/m.gguf"));
	CHECK(!strcmp(mi.placement, "layer nodes=0,1"));
	CHECK(!strcmp(mi.name, "hyb"));
	CHECK_EQ_INT(mi.model_size, 123456789);
	CHECK(!memcmp(mi.meta, "GGUF....metadata", 17));
	CHECK_EQ_INT(mi.paged_bytes, 101);
	for (unsigned int i = 0; i < N_NAMES; i++) {
		const struct hyb_manifest_tensor *t = hyb_manifest_find(m, names[i]);

		CHECK_MSG(t, "%s not found", names[i]);
		CHECK(!strcmp(t->name, names[i]));
		CHECK_EQ_INT(t->ne[1], i + 1);
		CHECK_EQ_INT(t->bytes, 100 + i);
		CHECK_EQ_INT(t->file_off, 4096 + 1000 * i);
		if (i == 1) {
			CHECK_EQ_INT(t->pool, HYB_MF_NO_POOL);
			CHECK_EQ_INT(t->pool_id, 0);
			CHECK_EQ_INT(t->node, 1);
		} else {
			CHECK_EQ_INT(t->pool_id, 7);
			CHECK_EQ_INT(t->pool_off, 1000 * i);
		}
	}
	CHECK(!hyb_manifest_find(m, "blk.0.attn_k.weight"));
	CHECK(!hyb_manifest_find(m, ""));
	for (uint32_t i = 1; i < mi.n_tensors; i++)
		CHECK(strcmp(hyb_manifest_tensor(m, i - 1)->name,
			     hyb_manifest_tensor(m, i)->name) < 0);
	CHECK(!hyb_manifest_tensor(m, mi.n_tensors));
	bu = hyb_manifest_bundle(m, 0, 2);
	CHECK(bu && bu->n_neurons == 2 && bu->pool_off == 4000 + 192);
	CHECK(hyb_manifest_bundle(m, 0, 0)->file_off == 8096);
	CHECK(!hyb_manifest_bundle(m, 0, 3) && !hyb_manifest_bundle(m, 1, 0));
	CHECK(!strcmp(hyb_manifest_pool(m, 1)->name, "hyb.page.n1"));
	hyb_manifest_close(m);
	free(buf);
}

/* Recompute the checksum after a deliberate change, so the structural checks are what fail. */
static void reseal(uint8_t *buf, size_t len)
{
	struct hyb_mf_header *h = (struct hyb_mf_header *)buf;

	h->checksum = hyb_mf_checksum(buf + sizeof(*h), len - sizeof(*h));
}

TEST(manifest_refuses_bad_bytes_without_crashing)
{
	size_t len;
	uint8_t *good = build(&len, 1), *b = malloc(len);
	struct hyb_mf_header *h = (struct hyb_mf_header *)b;
	struct hyb_mf_tensor *t;
	uint32_t x = 12345;
	int accepted = 0;

#define EXPECT_FAIL(what, l)                                                          \
	do {                                                                          \
		struct hyb_manifest *m_ = hyb_manifest_parse(b, l);                   \
		CHECK_MSG(!m_, "%s accepted", what);                                  \
		CHECK_MSG(strstr(hyb_last_error(), "manifest"), "%s: %s", what,       \
			  hyb_last_error());                                          \
	} while (0)

	memcpy(b, good, len);
	b[len - 3] ^= 1;
	EXPECT_FAIL("flipped byte", len);
	CHECK_MSG(strstr(hyb_last_error(), "checksum"), "%s", hyb_last_error());
	memcpy(b, good, len);
	EXPECT_FAIL("truncated", len - 8);
	EXPECT_FAIL("header only", 40);
	h->magic ^= 1;
	EXPECT_FAIL("bad magic", len);
	memcpy(b, good, len);
	h->version = 3;
	EXPECT_FAIL("version 3", len);
	CHECK_MSG(strstr(hyb_last_error(), "version 3"), "%s", hyb_last_error());
	memcpy(b, good, len);
	h->version = 1;	/* no parts: a version 1 manifest reads as before */
	reseal(b, len);
	{
		struct hyb_manifest *m1 = hyb_manifest_parse(b, len);

		CHECK_MSG(m1, "version 1: %s", hyb_last_error());
		hyb_manifest_close(m1);
	}
	memcpy(b, good, len);
	h->state = HYB_MF_WRITING;
	EXPECT_FAIL("writing", len);
	h->state = HYB_MF_RETIRED;
	EXPECT_FAIL("retired", len);
	CHECK_MSG(strstr(hyb_last_error(), "retired"), "%s", hyb_last_error());
	/* structure, with a valid checksum */
	memcpy(b, good, len);
	t = (struct hyb_mf_tensor *)(b + h->tensors_off);
	t[0].pool_off = (1 << 20) - 10;
	reseal(b, len);
	EXPECT_FAIL("tensor past its pool", len);
	memcpy(b, good, len);
	t[2].name = (uint32_t)h->strings_len + 5;
	reseal(b, len);
	EXPECT_FAIL("name out of bounds", len);
	memcpy(b, good, len);
	t[3].pool = 9;
	reseal(b, len);
	EXPECT_FAIL("pool index", len);
	memcpy(b, good, len);
	h->n_tensors = 1u << 30;
	EXPECT_FAIL("huge count", len);
	memcpy(b, good, len);
	h->strings_off = len - 2;
	EXPECT_FAIL("strings off", len);
	memcpy(b, good, len);
	h->tensor_entry_size = 8;
	EXPECT_FAIL("small entries", len);
	memcpy(b, good, len);
	{	/* two tensors swapped: not sorted, bsearch would lie */
		struct hyb_mf_tensor tmp = t[0];

		t[0] = t[1];
		t[1] = tmp;
		reseal(b, len);
		EXPECT_FAIL("unsorted", len);
	}
	/* random damage, resealed: refused or accepted, never a crash */
	for (int i = 0; i < 3000; i++) {
		struct hyb_manifest *m;

		memcpy(b, good, len);
		for (int k = 0; k < 3; k++) {
			x ^= x << 13, x ^= x >> 17, x ^= x << 5;
			b[x % len] ^= (uint8_t)(1u << (x >> 29));
		}
		reseal(b, len);
		m = hyb_manifest_parse(b, len);
		if (m) {
			struct hyb_manifest_info mi;

			hyb_manifest_info(m, &mi);
			for (uint32_t j = 0; j < mi.n_tensors; j++)
				CHECK(hyb_manifest_find(m, hyb_manifest_tensor(m, j)->name));
			accepted++;
			hyb_manifest_close(m);
		}
	}
	CHECK(accepted < 3000);
	CHECK(!hyb_manifest_open("/nonexistent/hyb.manifest"));
	CHECK_MSG(strstr(hyb_last_error(), "hyb.manifest") && strstr(hyb_last_error(), "No such file"), "%s", hyb_last_error());
#undef EXPECT_FAIL
	free(b);
	free(good);
}

TEST(manifest_publish_pool_and_file_then_retire)
{
	struct hyb_backend *owner, *app;
	struct hyb_mf_published pub;
	struct hyb_manifest *mp, *mf;
	struct hyb_manifest_info mi;
	char path[512], err[256];
	uint8_t *buf;
	size_t len;

	owner = hyb_backend_open(HYB_BACKEND_LOCAL);
	app = hyb_backend_open(HYB_BACKEND_LOCAL);
	CHECK(owner && app);
	buf = build(&len, 3);
	snprintf(path, sizeof(path), "%s/hyb.manifest", hyb_test_tmpdir());
	/* not there yet: a clear answer, no crash */
	CHECK(!hyb_manifest_open_pool(app, "t.manifest"));
	CHECK_MSG(strstr(hyb_last_error(), "t.manifest"), "%s", hyb_last_error());
	CHECK_MSG(!hyb_mf_publish(owner, "t.manifest", path, buf, len, &pub, err, sizeof(err)),
		  "%s", err);
	/* the app's handle maps the pool read-only */
	mp = hyb_manifest_open_pool(app, "t.manifest");
	CHECK_MSG(mp, "%s", hyb_last_error());
	mf = hyb_manifest_open(path);
	CHECK_MSG(mf, "%s", hyb_last_error());
	hyb_manifest_info(mf, &mi);
	CHECK_EQ_INT(mi.n_tensors, N_NAMES);
	CHECK(hyb_manifest_find(mp, "token_embd.weight"));
	CHECK_EQ_INT(hyb_manifest_live(mp), 1);
	CHECK_EQ_INT(hyb_manifest_live(mf), 1);
	/* a second publish under the same pool name fails and leaves nothing behind */
	{
		struct hyb_mf_published dup;
		char p2[600];

		snprintf(p2, sizeof(p2), "%s/other.manifest", hyb_test_tmpdir());
		CHECK(hyb_mf_publish(owner, "t.manifest", p2, buf, len, &dup, err, sizeof(err)));
		CHECK(access(p2, F_OK));
	}
	hyb_mf_retire(&pub);
	CHECK_EQ_INT(hyb_manifest_live(mp), 0);	/* retired, then destroyed */
	CHECK(access(path, F_OK) && errno == ENOENT);
	CHECK(!hyb_manifest_open_pool(app, "t.manifest"));
	/* the copy taken before stays readable */
	CHECK(hyb_manifest_find(mp, "output.weight"));
	hyb_mf_retire(&pub);	/* twice is fine */
	hyb_manifest_close(mp);
	hyb_manifest_close(mf);
	hyb_backend_close(app);
	hyb_backend_close(owner);
	free(buf);
}

/* -- placement ----------------------------------------------------------- */

#define NL 8

/* A llama-like tensor list in file order: token_embd, 8 layers, output_norm, output. */
static unsigned int model_tensors(struct hyb_numa_place_tensor *t, char names_out[][48])
{
	static const char *const per_layer[] = { "attn_norm.weight", "attn_q.weight",
						 "ffn_gate.weight", "ffn_up.weight",
						 "ffn_down.weight" };
	const uint64_t sizes[] = { 4096, 65536, 300000, 300000, 300000 };
	uint64_t off = 1000064;	/* data section: 32-aligned, not 4096-aligned */
	unsigned int n = 0;

#define ADD(nm, sz)                                                             \
	do {                                                                    \
		snprintf(names_out[n], 48, "%s", nm);                           \
		t[n] = (struct hyb_numa_place_tensor){ .name = names_out[n],         \
						  .layer = hyb_numa_place_layer_of(nm), \
						  .file_off = off, .bytes = (sz) }; \
		off += ((sz) + 31) / 32 * 32;                                   \
		n++;                                                            \
	} while (0)
	ADD("token_embd.weight", 500000);
	for (int l = 0; l < NL; l++) {
		for (int k = 0; k < 5; k++) {
			char nm[48];

			snprintf(nm, sizeof(nm), "blk.%d.%s", l, per_layer[k]);
			ADD(nm, sizes[k] + 32 * (uint64_t)l);
		}
	}
	ADD("output_norm.weight", 4096);
	ADD("output.weight", 500000);
#undef ADD
	return n;
}

/* Invariants of any placement: phase, no overlap, inside the pool, runs cover tensors. */
static void check_layout(const struct hyb_numa_placement *pl, const struct hyb_numa_place_tensor *t,
			 unsigned int n)
{
	for (unsigned int i = 0; i < n; i++) {
		if (t[i].pool == HYB_NUMA_PLACE_NO_POOL)
			continue;
		CHECK(t[i].pool < pl->n_pools);
		CHECK_MSG(t[i].pool_off % 4096 == t[i].file_off % 4096, "%s: pool off %llu, file "
			  "off %llu", t[i].name, (unsigned long long)t[i].pool_off,
			  (unsigned long long)t[i].file_off);
		CHECK(t[i].pool_off + t[i].bytes <= pl->pools[t[i].pool].bytes);
		CHECK_EQ_INT(pl->pools[t[i].pool].node, t[i].node);
		for (unsigned int j = 0; j < n; j++) {
			if (j == i || t[j].pool != t[i].pool)
				continue;
			CHECK_MSG(t[j].pool_off >= t[i].pool_off + t[i].bytes ||
				  t[i].pool_off >= t[j].pool_off + t[j].bytes,
				  "%s and %s overlap", t[i].name, t[j].name);
		}
		/* some run streams exactly this tensor's file bytes to its pool bytes */
		{
			bool covered = false;

			for (unsigned int r = 0; r < pl->n_runs && !covered; r++) {
				const struct hyb_numa_place_run *ru = &pl->runs[r];

				covered = ru->pool == t[i].pool && ru->file_off <= t[i].file_off &&
					  t[i].file_off + t[i].bytes <= ru->file_off + ru->len &&
					  t[i].pool_off - ru->pool_off ==
					  t[i].file_off - ru->file_off;
			}
			CHECK_MSG(covered, "%s: no run streams it", t[i].name);
		}
	}
}

TEST(manifest_placement_layer_and_interleave)
{
	struct hyb_numa_place_config cfg = { .policy = HYB_NUMA_PLACE_LAYER, .pools_per_node = 1 };
	struct hyb_numa_place_tensor t[64];
	static char nm[64][48];
	struct hyb_numa_placement pl;
	unsigned int n = model_tensors(t, nm);
	char err[256];

	CHECK(!hyb_numa_place_parse_nodes(&cfg, "0-1", err, sizeof(err)));
	CHECK_EQ_INT(cfg.n_nodes, 2);
	CHECK_MSG(!hyb_numa_place(&cfg, t, n, NL, &pl, err, sizeof(err)), "%s", err);
	check_layout(&pl, t, n);
	CHECK_EQ_INT(pl.n_pools, 2);
	for (unsigned int i = 0; i < n; i++) {
		int want = t[i].layer >= 0 ? (t[i].layer < NL / 2 ? 0 : 1) :
			   !strcmp(t[i].name, "token_embd.weight") ? 0 : 1;

		CHECK_MSG(t[i].node == want, "%s on node %d", t[i].name, t[i].node);
	}
	/* one run per pool: the file order is layer order */
	CHECK_EQ_INT(pl.n_runs, 2);
	CHECK(strstr(pl.desc, "layer nodes=0,1"));
	hyb_numa_placement_free(&pl);

	cfg.policy = HYB_NUMA_PLACE_INTERLEAVE;
	n = model_tensors(t, nm);
	CHECK_MSG(!hyb_numa_place(&cfg, t, n, NL, &pl, err, sizeof(err)), "%s", err);
	check_layout(&pl, t, n);
	for (unsigned int i = 0; i < n; i++)
		if (t[i].layer >= 0)
			CHECK_EQ_INT(t[i].node, t[i].layer % 2);
	/* embd + layer 0, then one run per layer (the head joins the last layer's) */
	CHECK_EQ_INT(pl.n_runs, NL);
	hyb_numa_placement_free(&pl);

	/* two pools per node, about equal */
	cfg.policy = HYB_NUMA_PLACE_LAYER;
	cfg.pools_per_node = 2;
	n = model_tensors(t, nm);
	CHECK_MSG(!hyb_numa_place(&cfg, t, n, NL, &pl, err, sizeof(err)), "%s", err);
	check_layout(&pl, t, n);
	CHECK_EQ_INT(pl.n_pools, 4);
	for (unsigned int i = 0; i < 4; i++) {
		CHECK_EQ_INT(pl.pools[i].k, i % 2);
		CHECK_MSG(pl.pools[i].used > 1500000 && pl.pools[i].used < 3500000,
			  "pool %u holds %llu", i, (unsigned long long)pl.pools[i].used);
	}
	hyb_numa_placement_free(&pl);
}

TEST(manifest_placement_explicit_rules)
{
	struct hyb_numa_place_config cfg = { .policy = HYB_NUMA_PLACE_EXPLICIT, .pools_per_node = 1 };
	struct hyb_numa_place_tensor t[64];
	static char nm[64][48];
	struct hyb_numa_placement pl;
	unsigned int n = model_tensors(t, nm);
	char err[256];

	CHECK(!hyb_numa_place_parse_rules(&cfg, "blk.:1, blk.3.:0", err, sizeof(err)));
	CHECK(hyb_numa_place(&cfg, t, n, NL, &pl, err, sizeof(err)) < 0);
	CHECK_MSG(strstr(err, "token_embd.weight") && strstr(err, "'*:NODE'"), "%s", err);
	CHECK(!hyb_numa_place_parse_rules(&cfg, " * : 2 ,blk.3.ffn_:3", err, sizeof(err)));
	CHECK_EQ_INT(cfg.n_rules, 4);
	n = model_tensors(t, nm);
	CHECK_MSG(!hyb_numa_place(&cfg, t, n, NL, &pl, err, sizeof(err)), "%s", err);
	check_layout(&pl, t, n);
	for (unsigned int i = 0; i < n; i++) {
		int want = t[i].layer < 0 ? 2 : t[i].layer != 3 ? 1 :
			   strstr(t[i].name, "ffn_") ? 3 : 0;

		CHECK_MSG(t[i].node == want, "%s on node %d, expected %d", t[i].name, t[i].node,
			  want);
	}
	CHECK_EQ_INT(pl.n_pools, 4);
	hyb_numa_placement_free(&pl);
	/* bad input: clear messages */
	CHECK(hyb_numa_place_parse_rules(&cfg, "blk.0", err, sizeof(err)) < 0);
	CHECK_MSG(strstr(err, "PREFIX:NODE"), "%s", err);
	CHECK(hyb_numa_place_parse_rules(&cfg, "blk.0:x", err, sizeof(err)) < 0);
	CHECK_MSG(strstr(err, "'x' is not a node"), "%s", err);
	CHECK(hyb_numa_place_parse_nodes(&cfg, "0,0", err, sizeof(err)) < 0);
	CHECK_MSG(strstr(err, "twice"), "%s", err);
	CHECK(hyb_numa_place_parse_nodes(&cfg, "3-1", err, sizeof(err)) < 0);
	CHECK(hyb_numa_place_parse_nodes(&cfg, "", err, sizeof(err)) < 0);
	CHECK(hyb_numa_place_parse_policy("stripes", &cfg.policy) < 0);
}

TEST(manifest_placement_dram_budget_pages_ffn)
{
	struct hyb_numa_place_config cfg = { .policy = HYB_NUMA_PLACE_LAYER, .pools_per_node = 1,
					.n_nodes = 1, .page_pool = 1 << 20 };
	struct hyb_numa_place_tensor t[64];
	static char nm[64][48];
	struct hyb_numa_placement pl;
	unsigned int n = model_tensors(t, nm), paged = 0;
	uint64_t total = 0, dense = 0;
	char err[256];

	for (unsigned int i = 0; i < n; i++) {
		total += t[i].bytes;
		if (!hyb_numa_place_pageable(t[i].name))
			dense += t[i].bytes;
	}
	cfg.dram_budget = total / 2;
	CHECK_MSG(!hyb_numa_place(&cfg, t, n, NL, &pl, err, sizeof(err)), "%s", err);
	check_layout(&pl, t, n);
	for (unsigned int i = 0; i < n; i++) {
		if (t[i].pool != HYB_NUMA_PLACE_NO_POOL)
			continue;
		paged++;
		CHECK_MSG(hyb_numa_place_pageable(t[i].name), "%s paged", t[i].name);
	}
	CHECK(paged > 0);
	CHECK_EQ_INT(pl.n_pools, 2);
	CHECK_EQ_INT(pl.pools[1].role, HYB_NUMA_PLACE_PAGE);
	CHECK_EQ_INT(pl.pools[1].bytes, 1 << 20);
	CHECK(pl.resident + pl.paged == total);
	CHECK(pl.pools[0].bytes + pl.pools[1].bytes <= cfg.dram_budget);
	/* in file order: the early layers' FFNs stay, the late ones page */
	CHECK(t[2].pool != HYB_NUMA_PLACE_NO_POOL);
	CHECK(t[n - 3].pool == HYB_NUMA_PLACE_NO_POOL);
	hyb_numa_placement_free(&pl);

	cfg.dram_budget = dense / 2;
	cfg.page_pool = 65536;
	n = model_tensors(t, nm);
	CHECK(hyb_numa_place(&cfg, t, n, NL, &pl, err, sizeof(err)) < 0);
	CHECK_MSG(strstr(err, "dram_budget") && strstr(err, "too small"), "%s", err);
	cfg.dram_budget = total / 2;
	cfg.page_pool = 0;
	CHECK(hyb_numa_place(&cfg, t, n, NL, &pl, err, sizeof(err)) < 0);
	CHECK_MSG(strstr(err, "page_pool"), "%s", err);
}

/* -- experts split by rows across nodes (docs/NUMA.md) -------------------- */

#define SP_ROWS 100
#define SP_EXPERTS 4
#define SP_RB 64

/*
 * A manifest with one split tensor [64, 100, 4] of 64-byte rows: rows
 * [0, 48) in pool 0 (node 0), [48, 100) in pool 2 (node 1), the parts added
 * in reverse order; gap > 0 leaves rows [48, 48 + gap) out. NULL with err.
 */
static uint8_t *build_split(size_t *len, unsigned int gap, char *err, size_t errlen)
{
	struct hyb_mf_model mm = { .path = "/m.gguf", .size = 1 << 20, .n_layers = 1,
				   .name = "s", .placement = "layer nodes=0,1 split_experts" };
	struct hyb_mf_builder *b = hyb_mf_builder_new(&mm);
	struct hyb_mf_pool p0 = { .id = 3, .node = 0, .role = HYB_MF_ROLE_WEIGHTS,
				  .bytes = 1 << 20, .used = 1 << 16, .name = "s.n0" };
	struct hyb_mf_pool p1 = { .id = 4, .node = 1, .role = HYB_MF_ROLE_PAGE,
				  .bytes = 1 << 20, .name = "s.page.n1" };
	struct hyb_mf_pool p2 = { .id = 5, .node = 1, .role = HYB_MF_ROLE_WEIGHTS,
				  .bytes = 1 << 20, .used = 1 << 16, .name = "s.n1" };
	struct hyb_mf_tensor split = { .type = 0, .n_dims = 3, .ne = { 16, SP_ROWS, SP_EXPERTS, 1 },
				       .layer = 0, .node = -1, .pool = HYB_MF_SPLIT,
				       .bytes = SP_ROWS * SP_EXPERTS * SP_RB, .file_off = 8192 };
	struct hyb_mf_tensor norm = { .type = 0, .n_dims = 1, .ne = { 16, 1, 1, 1 }, .layer = 0,
				      .pool = 0, .pool_off = 0, .bytes = 64, .file_off = 4096 };
	struct hyb_mf_part a = { .pool = 2, .node = 1, .row0 = 48 + gap, .rows = 52 - gap,
				 .pool_off = 4096, .stride = 52 * SP_RB + 1000 };
	struct hyb_mf_part c = { .pool = 0, .node = 0, .row0 = 0, .rows = 48, .pool_off = 8192,
				 .stride = 48 * SP_RB };
	uint8_t *buf = NULL;

	CHECK(b);
	CHECK(hyb_mf_add_pool(b, &p0) == 0 && hyb_mf_add_pool(b, &p1) == 1 &&
	      hyb_mf_add_pool(b, &p2) == 2);
	CHECK(!hyb_mf_add_tensor(b, "blk.0.ffn_up_exps.weight", &split));
	CHECK(!hyb_mf_add_tensor(b, "blk.0.attn_norm.weight", &norm));
	CHECK(!hyb_mf_add_part(b, "blk.0.ffn_up_exps.weight", &a));
	CHECK(!hyb_mf_add_part(b, "blk.0.ffn_up_exps.weight", &c));
	if (hyb_mf_build(b, &buf, len, err, errlen))
		buf = NULL;
	hyb_mf_builder_free(b);
	return buf;
}

TEST(manifest_split_parts_roundtrip_and_refusals)
{
	char err[256];
	size_t len;
	uint8_t *good = build_split(&len, 0, err, sizeof(err)), *b;
	struct hyb_mf_header *h;
	struct hyb_mf_part *pt;
	const struct hyb_manifest_tensor *t;
	struct hyb_manifest_info mi;
	struct hyb_manifest *m;

	CHECK_MSG(good, "%s", err);
	m = hyb_manifest_parse(good, len);
	CHECK_MSG(m, "%s", hyb_last_error());
	hyb_manifest_info(m, &mi);
	CHECK_EQ_INT(mi.n_parts, 2);
	t = hyb_manifest_find(m, "blk.0.ffn_up_exps.weight");
	CHECK(t && t->pool == HYB_MF_SPLIT && t->pool_id == 0 && t->n_parts == 2);
	CHECK(t->parts[0].row0 == 0 && t->parts[0].rows == 48 && t->parts[0].node == 0 &&
	      t->parts[0].pool == 0 && t->parts[0].pool_off == 8192);
	CHECK(t->parts[1].row0 == 48 && t->parts[1].rows == 52 && t->parts[1].node == 1 &&
	      t->parts[1].pool == 2 && t->parts[1].stride == 52 * SP_RB + 1000);
	CHECK_EQ_INT(hyb_manifest_find(m, "blk.0.attn_norm.weight")->n_parts, 0);
	CHECK_EQ_INT(mi.resident_bytes, SP_ROWS * SP_EXPERTS * SP_RB + 64);
	hyb_manifest_close(m);

	/* the builder: parts that leave rows out, or name an unsplit tensor */
	CHECK(!build_split(&len, 16, err, sizeof(err)));
	CHECK_MSG(strstr(err, "ffn_up_exps") && strstr(err, "cover"), "%s", err);

	b = malloc(len);
	CHECK(b);
	h = (struct hyb_mf_header *)b;
	pt = (struct hyb_mf_part *)(b + ((struct hyb_mf_header *)good)->parts_off);
#define EXPECT_BAD(what, needle)                                                      \
	do {                                                                          \
		reseal(b, len);                                                       \
		m = hyb_manifest_parse(b, len);                                       \
		CHECK_MSG(!m, "%s accepted", what);                                   \
		CHECK_MSG(strstr(hyb_last_error(), needle), "%s: %s", what,           \
			  hyb_last_error());                                          \
		memcpy(b, good, len);                                                 \
	} while (0)
	memcpy(b, good, len);
	pt[1].row0 = 40;
	EXPECT_BAD("overlapping rows", "rows");
	pt[1].rows = 40;
	EXPECT_BAD("rows left out", "cover");
	pt[0].rows = 0;
	EXPECT_BAD("empty part", "rows");
	pt[1].stride = 10;
	EXPECT_BAD("stride below the rows", "stride");
	pt[1].stride = 1ull << 62;
	EXPECT_BAD("huge stride", "stride");
	pt[1].pool_off = (1 << 20) - 100;
	EXPECT_BAD("past the pool", "outside");
	pt[1].pool_off = UINT64_MAX - 10;
	EXPECT_BAD("offset overflow", "outside");
	pt[1].pool = 1;
	EXPECT_BAD("a page pool", "weight pool");
	pt[1].pool = 77;
	EXPECT_BAD("pool index", "weight pool");
	pt[1].node = 0;
	EXPECT_BAD("node of another pool", "node");
	pt[0].tensor = 0; /* the model path string: no tensor */
	EXPECT_BAD("no such tensor", "names no tensor");
	h->n_parts = 1;
	EXPECT_BAD("a part missing", "cover");
	h->n_parts = 0;
	EXPECT_BAD("no parts", "no parts");
	h->part_entry_size = 8;
	EXPECT_BAD("small entries", "smaller");
	h->parts_off = len - 8;
	EXPECT_BAD("parts out of bounds", "out of bounds");
	{	/* parts of the unsplit tensor: point them at the norm's name */
		struct hyb_mf_tensor *tt = (struct hyb_mf_tensor *)(b + h->tensors_off);

		pt[0].tensor = tt[0].name; /* blk.0.attn_norm.weight sorts first */
		EXPECT_BAD("a part of an unsplit tensor", "not a split tensor");
	}
	{	/* a 2-D tensor marked split */
		struct hyb_mf_tensor *tt = (struct hyb_mf_tensor *)(b + h->tensors_off);

		tt[1].n_dims = 2;
		EXPECT_BAD("split 2-D", "3-D");
	}
#undef EXPECT_BAD
	free(b);
	free(good);
}

/* Invariants of a split placement: parts, phases, strides, runs that copy every byte once. */
TEST(manifest_placement_split_experts)
{
	struct hyb_numa_place_config cfg = { .policy = HYB_NUMA_PLACE_LAYER, .pools_per_node = 1,
					     .split_experts = true };
	/* gate [8 x 100 x 1152-byte rows], down [8 x 2048], a too-small one, two dense */
	struct hyb_numa_place_tensor t[5] = {
		{ .name = "blk.0.attn_q.weight", .layer = 0, .file_off = 1000032, .bytes = 70000 },
		{ .name = "blk.0.ffn_gate_exps.weight", .layer = 0, .file_off = 1070048,
		  .bytes = 8 * 100 * 1152, .ne1 = 100, .ne2 = 8 },
		{ .name = "blk.0.ffn_down_exps.weight", .layer = 0, .file_off = 1991648,
		  .bytes = 8 * 2048 * 432, .ne1 = 2048, .ne2 = 8 },
		{ .name = "blk.1.ffn_up_exps.weight", .layer = 1, .file_off = 9069600,
		  .bytes = 8 * 8 * 64, .ne1 = 8, .ne2 = 8 },
		{ .name = "output.weight", .layer = -1, .file_off = 9073696, .bytes = 50000 },
	};
	struct hyb_numa_placement pl;
	uint64_t total = 0, copied = 0;
	char err[256];

	for (int pools = 1; pools <= 2; pools++) {
		cfg.pools_per_node = (unsigned int)pools;
		CHECK(!hyb_numa_place_parse_nodes(&cfg, "0,1", err, sizeof(err)));
		CHECK_MSG(!hyb_numa_place(&cfg, t, 5, 2, &pl, err, sizeof(err)), "%s", err);
		CHECK(strstr(pl.desc, "split_experts"));
		CHECK(t[0].n_parts == 0 && t[3].n_parts == 0 && t[4].n_parts == 0);
		CHECK(t[1].n_parts == 2 && t[2].n_parts == 2);
		CHECK(t[1].parts[1].row0 == 48 && t[2].parts[1].row0 == 1024);
		for (int i = 1; i <= 2; i++) {
			const uint64_t rb = t[i].bytes / (t[i].ne1 * t[i].ne2);

			CHECK_EQ_INT(t[i].node, -1);
			for (unsigned int k = 0; k < 2; k++) {
				const struct hyb_numa_place_part *q = &t[i].parts[k];

				CHECK_EQ_INT(q->node, (int)k);
				CHECK_EQ_INT(pl.pools[q->pool].node, (int)k);
				CHECK(q->stride >= q->rows * rb && q->stride - q->rows * rb < 4096);
				CHECK_EQ_INT(q->stride % 4096, t[i].ne1 * rb % 4096);
			}
		}
		/* every run keeps the file's phase, lies in its pool, and runs never overlap */
		total = copied = 0;
		for (int i = 0; i < 5; i++)
			total += t[i].bytes;
		for (unsigned int r = 0; r < pl.n_runs; r++) {
			const struct hyb_numa_place_run *ru = &pl.runs[r];

			CHECK_EQ_INT(ru->pool_off % 4096, ru->file_off % 4096);
			CHECK(ru->pool < pl.n_pools && ru->pool_off + ru->len <= pl.pools[ru->pool].bytes);
			if (r)
				CHECK(ru->file_off >= pl.runs[r - 1].file_off + pl.runs[r - 1].len);
			for (unsigned int q = 0; q < r; q++)
				CHECK(pl.runs[q].pool != ru->pool ||
				      pl.runs[q].pool_off + pl.runs[q].len <= ru->pool_off ||
				      ru->pool_off + ru->len <= pl.runs[q].pool_off);
			copied += ru->len;
		}
		CHECK_EQ_INT(copied, total);
		CHECK_EQ_INT(pl.resident, total);
		CHECK_EQ_INT(pl.n_pools, 2 * (unsigned int)pools);
		hyb_numa_placement_free(&pl);
	}
	/* refusals */
	cfg.pools_per_node = 1;
	CHECK(!hyb_numa_place_parse_nodes(&cfg, "0", err, sizeof(err)));
	CHECK(hyb_numa_place(&cfg, t, 5, 2, &pl, err, sizeof(err)) < 0);
	CHECK_MSG(strstr(err, "2 to 8 nodes"), "%s", err);
	CHECK(!hyb_numa_place_parse_nodes(&cfg, "0,1", err, sizeof(err)));
	cfg.dram_budget = 1 << 20;
	cfg.page_pool = 1 << 16;
	CHECK(hyb_numa_place(&cfg, t, 5, 2, &pl, err, sizeof(err)) < 0);
	CHECK_MSG(strstr(err, "dram_budget"), "%s", err);
	cfg.dram_budget = 0;
	cfg.policy = HYB_NUMA_PLACE_EXPLICIT;
	CHECK(!hyb_numa_place_parse_rules(&cfg, "*:0", err, sizeof(err)));
	CHECK(hyb_numa_place(&cfg, t, 5, 2, &pl, err, sizeof(err)) < 0);
	CHECK_MSG(strstr(err, "explicit"), "%s", err);
	cfg.policy = HYB_NUMA_PLACE_LAYER;
	t[1].bytes += 1;	/* not whole rows */
	CHECK(hyb_numa_place(&cfg, t, 5, 2, &pl, err, sizeof(err)) < 0);
	CHECK_MSG(strstr(err, "ffn_gate_exps") && strstr(err, "whole rows"), "%s", err);
}

/*
 * Every byte of every tensor lands once where the placement says, with 3
 * nodes and 2 pools each: the runs are "streamed" from a file image into
 * pool images, then each expert's rows are read back through its part and
 * each whole tensor through its pool offset.
 */
TEST(manifest_placement_split_rows_land_where_the_parts_say)
{
	struct hyb_numa_place_config cfg = { .policy = HYB_NUMA_PLACE_INTERLEAVE,
					     .pools_per_node = 2, .split_experts = true };
	/* 100 rows / 3: cuts 32, 64 (the multiples of 16 closest to 33.3, 66.7) */
	struct hyb_numa_place_tensor t[6] = {
		{ .name = "token_embd.weight", .layer = -1, .file_off = 4128, .bytes = 30000 },
		{ .name = "blk.0.ffn_gate_exps.weight", .layer = 0, .file_off = 34144,
		  .bytes = 8 * 100 * 1152, .ne1 = 100, .ne2 = 8 },
		{ .name = "blk.0.ffn_down_exps.weight", .layer = 0, .file_off = 955744,
		  .bytes = 8 * 200 * 72, .ne1 = 200, .ne2 = 8 },
		{ .name = "blk.1.ffn_up_exps.weight", .layer = 1, .file_off = 1070944,
		  .bytes = 4 * 20 * 32, .ne1 = 20, .ne2 = 4 },
		{ .name = "blk.1.ffn_gate_inp.weight", .layer = 1, .file_off = 1076064,
		  .bytes = 2048, .ne1 = 0, .ne2 = 0 },
		{ .name = "output.weight", .layer = -1, .file_off = 1078112, .bytes = 40000 },
	};
	const uint64_t flen = 1078112 + 40000;
	static const uint64_t cuts_gate[] = { 0, 32, 64, 100 }, cuts_down[] = { 0, 64, 128, 200 };
	struct hyb_numa_placement pl;
	uint8_t *file = malloc(flen), *pools[16] = { 0 };
	uint32_t x = 99;
	char err[256];

	CHECK(file);
	for (uint64_t i = 0; i < flen; i++) {
		x ^= x << 13, x ^= x >> 17, x ^= x << 5;
		file[i] = (uint8_t)x;
	}
	CHECK(!hyb_numa_place_parse_nodes(&cfg, "0,2,5", err, sizeof(err)));
	CHECK_MSG(!hyb_numa_place(&cfg, t, 6, 2, &pl, err, sizeof(err)), "%s", err);
	CHECK(pl.n_pools <= 16);
	for (unsigned int k = 0; k < 3; k++) {
		CHECK_EQ_INT(t[1].parts[k].row0, cuts_gate[k]);
		CHECK_EQ_INT(t[1].parts[k].rows, cuts_gate[k + 1] - cuts_gate[k]);
		CHECK_EQ_INT(t[2].parts[k].row0, cuts_down[k]);
		CHECK_EQ_INT(t[1].parts[k].node, cfg.nodes[k]);
	}
	/* 20 rows: the cuts round to 0, 16, 16, 20 - an empty part: whole, on its layer's node */
	CHECK(t[3].n_parts == 0 && t[3].node == 2 && t[3].pool < pl.n_pools);
	CHECK(t[4].n_parts == 0 && t[4].node == 2);
	/* one run per (expert, part), never merged with a neighbour */
	{
		unsigned int runs = 0;

		for (unsigned int r = 0; r < pl.n_runs; r++)
			runs += pl.runs[r].file_off >= t[1].file_off &&
				pl.runs[r].file_off < t[2].file_off + t[2].bytes;
		CHECK_EQ_INT(runs, 2 * 8 * 3);
	}
	{
		uint64_t used = 0;

		for (unsigned int i = 0; i < pl.n_pools; i++) {
			CHECK(pl.pools[i].role == HYB_NUMA_PLACE_WEIGHTS);
			CHECK(pl.pools[i].used <= pl.pools[i].bytes);
			used += pl.pools[i].used;
			pools[i] = calloc(1, pl.pools[i].bytes);
			CHECK(pools[i]);
		}
		for (int i = 0; i < 6; i++)
			used -= t[i].bytes;
		CHECK_EQ_INT(used, 0);
		CHECK_EQ_INT(pl.resident, 30000 + 8 * 100 * 1152 + 8 * 200 * 72 +
			     4 * 20 * 32 + 2048 + 40000);
	}
	for (unsigned int r = 0; r < pl.n_runs; r++) {
		const struct hyb_numa_place_run *ru = &pl.runs[r];

		CHECK(ru->pool_off + ru->len <= pl.pools[ru->pool].bytes &&
		      ru->file_off + ru->len <= flen);
		memcpy(pools[ru->pool] + ru->pool_off, file + ru->file_off, ru->len);
	}
	for (int i = 0; i < 6; i++) {
		const struct hyb_numa_place_tensor *y = &t[i];

		if (!y->n_parts) {
			CHECK_MSG(!memcmp(pools[y->pool] + y->pool_off, file + y->file_off, y->bytes),
				  "%s differs", y->name);
			continue;
		}
		for (unsigned int k = 0; k < y->n_parts; k++) {
			const struct hyb_numa_place_part *q = &y->parts[k];
			const uint64_t rb = y->bytes / (y->ne1 * y->ne2);

			CHECK_EQ_INT(pl.pools[q->pool].node, q->node);
			CHECK_EQ_INT(q->pool_off % 4096, (y->file_off + q->row0 * rb) % 4096);
			for (uint64_t e = 0; e < y->ne2; e++)
				CHECK_MSG(!memcmp(pools[q->pool] + q->pool_off + e * q->stride,
						  file + y->file_off + (e * y->ne1 + q->row0) * rb,
						  q->rows * rb), "%s: expert %llu part %u differs",
					  y->name, (unsigned long long)e, k);
		}
	}
	for (unsigned int i = 0; i < pl.n_pools; i++)
		free(pools[i]);
	hyb_numa_placement_free(&pl);
	free(file);

	/* 8 nodes are the most */
	cfg.pools_per_node = 1;
	CHECK(!hyb_numa_place_parse_nodes(&cfg, "0-7", err, sizeof(err)));
	t[2].ne1 = 256;
	t[2].bytes = 8 * 256 * 72;
	CHECK_MSG(!hyb_numa_place(&cfg, t, 3, 2, &pl, err, sizeof(err)), "%s", err);
	CHECK_EQ_INT(t[2].n_parts, 8);
	CHECK_EQ_INT(t[1].n_parts, 0);	/* 100 rows: cuts 2 and 3 both round to 32 */
	for (unsigned int k = 0; k < 8; k++)
		CHECK_EQ_INT(t[2].parts[k].row0, 32 * k);
	hyb_numa_placement_free(&pl);
	CHECK(!hyb_numa_place_parse_nodes(&cfg, "0-8", err, sizeof(err)));
	CHECK(hyb_numa_place(&cfg, t, 3, 2, &pl, err, sizeof(err)) < 0);
	CHECK_MSG(strstr(err, "split_experts needs 2 to 8 nodes; nodes = 0,1,2,3,4,5,6,7,8 lists 9"),
		  "%s", err);
	CHECK(!hyb_numa_place_parse_nodes(&cfg, "3", err, sizeof(err)));
	CHECK(hyb_numa_place(&cfg, t, 3, 2, &pl, err, sizeof(err)) < 0);
	CHECK_MSG(strstr(err, "nodes = 3 lists 1"), "%s", err);
}

/* The builder refuses parts that do not describe their tensor's rows. */
TEST(manifest_builder_checks_parts)
{
	struct hyb_mf_model mm = { .path = "/m.gguf", .name = "s", .placement = "p" };
	struct hyb_mf_pool p0 = { .node = 0, .role = HYB_MF_ROLE_WEIGHTS, .bytes = 1 << 20,
				  .name = "s.n0" };
	struct hyb_mf_tensor split = { .n_dims = 3, .ne = { 16, 64, 4, 1 }, .node = -1,
				       .pool = HYB_MF_SPLIT, .bytes = 64 * 4 * 32 };
	struct hyb_mf_tensor whole = { .n_dims = 1, .ne = { 16, 1, 1, 1 }, .pool = 0, .bytes = 64 };
	struct hyb_mf_part q = { .pool = 0, .rows = 8, .stride = 8 * 32 };
	char err[256];
	uint8_t *buf;
	size_t len;

	/* (rows of each case's parts; 0 ends) */
	static const struct {
		const char *what;
		unsigned int rows[10];
		const char *want;
	} cases[] = {
		{ "no parts", { 0 }, "cover" },
		{ "short", { 32, 16, 0 }, "cover" },
		{ "nine parts", { 8, 8, 8, 8, 8, 8, 8, 4, 4, 0 }, "at most 8" },
		{ "eight parts", { 8, 8, 8, 8, 8, 8, 8, 8, 0 }, NULL },
	};

	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		struct hyb_mf_builder *b = hyb_mf_builder_new(&mm);
		uint64_t row = 0;

		CHECK(b && !hyb_mf_add_pool(b, &p0));
		CHECK(!hyb_mf_add_tensor(b, "blk.0.ffn_up_exps.weight", &split));
		CHECK(!hyb_mf_add_tensor(b, "blk.0.ffn_norm.weight", &whole));
		for (unsigned int k = 0; cases[c].rows[k]; k++) {
			q.row0 = row;
			q.rows = cases[c].rows[k];
			q.pool_off = row * 32;
			row += q.rows;
			CHECK(!hyb_mf_add_part(b, "blk.0.ffn_up_exps.weight", &q));
		}
		buf = NULL;
		if (!cases[c].want) {
			CHECK_MSG(!hyb_mf_build(b, &buf, &len, err, sizeof(err)), "%s: %s",
				  cases[c].what, err);
			free(buf);
		} else {
			CHECK_MSG(hyb_mf_build(b, &buf, &len, err, sizeof(err)) < 0, "%s accepted",
				  cases[c].what);
			CHECK_MSG(strstr(err, cases[c].want) && strstr(err, "ffn_up_exps"), "%s: %s",
				  cases[c].what, err);
		}
		hyb_mf_builder_free(b);
	}
	/* parts of a tensor that is not split, or not there; a part in no weight pool */
	for (int c = 0; c < 3; c++) {
		struct hyb_mf_builder *b = hyb_mf_builder_new(&mm);

		CHECK(b && !hyb_mf_add_pool(b, &p0));
		CHECK(!hyb_mf_add_tensor(b, "blk.0.ffn_norm.weight", &whole));
		CHECK(!hyb_mf_add_tensor(b, "blk.0.ffn_up_exps.weight", &split));
		q.row0 = 0;
		q.rows = 64;
		q.pool = c == 2 ? 1 : 0;
		CHECK(!hyb_mf_add_part(b, c == 0 ? "blk.0.ffn_norm.weight" : c == 1 ? "blk.0.nope" :
				       "blk.0.ffn_up_exps.weight", &q));
		CHECK(hyb_mf_build(b, &buf, &len, err, sizeof(err)) < 0);
		CHECK_MSG(strstr(err, c == 0 ? "not split" : c == 1 ? "not in it" :
				 "not a weight pool"), "%s", err);
		hyb_mf_builder_free(b);
	}
}

/*
 * Random damage to a split manifest, resealed: refused or accepted, never a
 * crash, and what is accepted keeps the reader's promises (parts cover the
 * rows in order, every expert's slice inside a weight pool on its node).
 */
TEST(manifest_split_parts_random_damage)
{
	char err[256];
	size_t len;
	uint8_t *good = build_split(&len, 0, err, sizeof(err)), *b;
	const struct hyb_mf_header *gh = (const struct hyb_mf_header *)good;
	uint64_t lo, hi;
	uint32_t x = 777;
	int accepted = 0;

	CHECK_MSG(good, "%s", err);
	b = malloc(len);
	CHECK(b);
	/* the tensor entries and the parts table: where damage meets the new checks */
	lo = gh->tensors_off;
	hi = gh->parts_off + (uint64_t)gh->n_parts * gh->part_entry_size;
	for (int i = 0; i < 4000; i++) {
		struct hyb_manifest *m;

		memcpy(b, good, len);
		for (int k = 0; k < 1 + i % 3; k++) {
			x ^= x << 13, x ^= x >> 17, x ^= x << 5;
			if (i % 2)
				b[lo + x % (hi - lo)] ^= (uint8_t)(1u << (x >> 29));
			else
				b[lo + x % (hi - lo)] = (uint8_t)(x >> 24);
		}
		reseal(b, len);
		m = hyb_manifest_parse(b, len);
		if (!m)
			continue;
		accepted++;
		for (uint32_t j = 0;; j++) {
			const struct hyb_manifest_tensor *t = hyb_manifest_tensor(m, j);
			uint64_t row = 0, rb;

			if (!t)
				break;
			CHECK((t->pool == HYB_MF_SPLIT) == (t->n_parts > 0));
			if (!t->n_parts)
				continue;
			CHECK(t->n_parts <= HYB_MF_MAX_PARTS && t->n_dims == 3);
			rb = t->bytes / (t->ne[1] * t->ne[2]);
			for (uint32_t k = 0; k < t->n_parts; k++) {
				const struct hyb_mf_part *q = &t->parts[k];
				const struct hyb_mf_pool *p = hyb_manifest_pool(m, q->pool);

				CHECK(q->row0 == row && q->rows && p && p->node == q->node &&
				      p->role == HYB_MF_ROLE_WEIGHTS);
				CHECK(q->pool_off + (t->ne[2] - 1) * q->stride + q->rows * rb <=
				      p->bytes);
				row += q->rows;
			}
			CHECK(row == t->ne[1]);
		}
		hyb_manifest_close(m);
	}
	CHECK(accepted < 4000);
	/* rows x experts that wrap to 0 in 64 bits: refused, not a division by zero */
	memcpy(b, good, len);
	{
		struct hyb_mf_tensor *tt = (struct hyb_mf_tensor *)(b + gh->tensors_off);

		tt[1].ne[1] = 1ull << 44;
		tt[1].ne[2] = 1ull << 20;
		reseal(b, len);
		CHECK(!hyb_manifest_parse(b, len));
		CHECK_MSG(strstr(hyb_last_error(), "3-D"), "%s", hyb_last_error());
	}
	/* a version 1 manifest has no parts table */
	memcpy(b, good, len);
	((struct hyb_mf_header *)b)->version = 1;
	reseal(b, len);
	CHECK(!hyb_manifest_parse(b, len));
	CHECK_MSG(strstr(hyb_last_error(), "version 1 has 2 parts"), "%s", hyb_last_error());
	free(b);
	free(good);
}
