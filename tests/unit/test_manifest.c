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
	h->version = 2;
	EXPECT_FAIL("version 2", len);
	CHECK_MSG(strstr(hyb_last_error(), "version 2"), "%s", hyb_last_error());
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
