/* SPDX-License-Identifier: MIT */
/*
 * NUMA placement of a model's tensors into pools: which
 * node each tensor lives on, which tensors stay resident when the DRAM budget
 * is smaller than the model, and where each lands in its pool. Pure
 * computation on a tensor list, so every policy is testable on any machine
 * (the nodes need not exist until the pools are created).
 *
 * Policies:
 *   layer       contiguous blocks of layers per node, balanced by bytes (each
 *               node computes its own layers on local memory); token_embd on
 *               the first node, the other non-layer tensors (output head,
 *               final norm) with the last layer.
 *   interleave  layer L on nodes[L % n_nodes]; non-layer tensors as above.
 *   explicit    rules "PREFIX:NODE", the longest matching prefix wins, "*"
 *               matches everything; a tensor no rule matches is an error.
 *
 * Within a node, resident tensors keep their file order and are cut into
 * pools_per_node pools of about equal size. A run of tensors that follow each
 * other in the file is laid out exactly as in the file, and each run starts
 * at a pool offset congruent to its file offset modulo 4096: one streaming
 * read per run, and O_DIRECT reads land straight in the pool (no bounce).
 * Tensor alignment is the file's (GGUF alignment divides 4096).
 *
 * DRAM budget (0: none): when the model does not fit, the non-FFN tensors
 * stay resident, then FFN weights (ffn_gate/up/down/bundles) in file order
 * while they fit; the rest are "paged": no pool offset, loaded on demand by
 * reload requests (HYB_RQ_LOAD) into a page pool of page_pool bytes on their
 * node. Page pools count against the budget.
 */
#ifndef HYB_NUMA_PLACE_H
#define HYB_NUMA_PLACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define HYB_NUMA_PLACE_MAX_NODES	64
#define HYB_NUMA_PLACE_MAX_RULES	64
#define HYB_NUMA_PLACE_PREFIX_LEN	64
#define HYB_NUMA_PLACE_NO_POOL	UINT32_MAX

enum hyb_numa_place_policy {
	HYB_NUMA_PLACE_LAYER = 0,
	HYB_NUMA_PLACE_INTERLEAVE = 1,
	HYB_NUMA_PLACE_EXPLICIT = 2,
};

enum hyb_numa_place_role {
	HYB_NUMA_PLACE_WEIGHTS = 1,	/* = HYB_MF_ROLE_WEIGHTS */
	HYB_NUMA_PLACE_PAGE = 2,	/* = HYB_MF_ROLE_PAGE */
};

struct hyb_numa_place_rule {
	char prefix[HYB_NUMA_PLACE_PREFIX_LEN];	/* "*" matches every tensor */
	int node;
};

struct hyb_numa_place_config {
	enum hyb_numa_place_policy policy;
	int nodes[HYB_NUMA_PLACE_MAX_NODES];		/* layer/interleave: the nodes to use */
	unsigned int n_nodes;			/* >= 1 */
	struct hyb_numa_place_rule rules[HYB_NUMA_PLACE_MAX_RULES];	/* explicit */
	unsigned int n_rules;
	unsigned int pools_per_node;		/* >= 1 */
	uint64_t dram_budget;			/* 0: everything resident */
	uint64_t page_pool;			/* bytes per node with paged tensors */
	/*
	 * Expert tensors (3-D, "_exps" in the name) split by rows across the
	 * nodes (KTransformers section 3.3's NUMA tensor parallelism, by rows:
	 * docs/NUMA.md): each node holds its share of every expert's rows, so
	 * every node computes part of every routed expert on local memory.
	 * Layer/interleave policies only, 2 to HYB_MF_MAX_PARTS nodes, every
	 * expert tensor resident (no dram_budget).
	 */
	bool split_experts;
};

/* A node's rows of a split tensor (hyb_mf_part's meaning). */
struct hyb_numa_place_part {
	int node;
	uint32_t pool;
	uint64_t row0, rows;
	uint64_t pool_off;		/* expert e's rows at pool_off + e * stride */
	uint64_t stride;
};

/* One tensor: the caller fills the inputs, hyb_numa_place() the outputs. */
struct hyb_numa_place_tensor {
	const char *name;	/* in */
	int32_t layer;		/* in: N of "blk.N.", -1 otherwise */
	uint64_t file_off;	/* in: absolute offset in the file */
	uint64_t bytes;		/* in */
	uint64_t ne1, ne2;	/* in: rows and matrices (experts); 0: not a 3-D tensor */
	int node;		/* out */
	uint32_t pool;		/* out: index into placement.pools, or HYB_NUMA_PLACE_NO_POOL */
	uint64_t pool_off;	/* out */
	/*
	 * out: > 0: split by rows (split_experts), parts[] say where; then node
	 * is -1, pool the first part's (resident: never NO_POOL) and pool_off
	 * 0, neither of them meaning a place: look at n_parts first.
	 */
	unsigned int n_parts;
	struct hyb_numa_place_part parts[8];	/* HYB_MF_MAX_PARTS */
};

struct hyb_numa_place_pool {
	int node;
	uint32_t role;		/* enum hyb_numa_place_role */
	uint32_t k;		/* index among the node's pools of this role */
	uint64_t bytes;		/* needed (the backend rounds up to pages) */
	uint64_t used;		/* bytes of tensors in it */
};

/* A file range streamed into one pool range in one go. */
struct hyb_numa_place_run {
	uint32_t pool;
	uint64_t pool_off;
	uint64_t file_off;
	uint64_t len;
};

struct hyb_numa_placement {
	struct hyb_numa_place_pool *pools;
	unsigned int n_pools;
	struct hyb_numa_place_run *runs;	/* in file order */
	unsigned int n_runs;
	uint64_t resident;		/* tensor bytes in pools */
	uint64_t paged;			/* tensor bytes left to on-demand loads */
	char desc[256];			/* "layer nodes=0,1 ..." for logs and the manifest */
};

/*
 * Place n tensors (any order). n_layers: blocks of the model. 0, or -1 with
 * a one-line message (a rule that matches nothing, a budget too small...).
 */
int hyb_numa_place(const struct hyb_numa_place_config *cfg, struct hyb_numa_place_tensor *t, unsigned int n,
	      uint32_t n_layers, struct hyb_numa_placement *out, char *err, size_t errlen);
void hyb_numa_placement_free(struct hyb_numa_placement *p);

/* "layer", "interleave", "explicit": 0, or -1. */
int hyb_numa_place_parse_policy(const char *s, enum hyb_numa_place_policy *out);
const char *hyb_numa_place_policy_name(enum hyb_numa_place_policy p);
/*
 * Append rules "PREFIX:NODE[, PREFIX:NODE...]" to cfg. 0, or -1 with a
 * message naming the bad rule.
 */
int hyb_numa_place_parse_rules(struct hyb_numa_place_config *cfg, const char *s, char *err, size_t errlen);
/* "0,1,3" or "0-3" into cfg->nodes: 0, or -1 with a message. */
int hyb_numa_place_parse_nodes(struct hyb_numa_place_config *cfg, const char *s, char *err, size_t errlen);
/*
 * split_experts' conditions on cfg (layer/interleave, 2 to HYB_MF_MAX_PARTS
 * nodes, no dram_budget): 0, or -1 with a one-line message. hyb_numa_place()
 * checks them; a config check may too, before the nodes are resolved.
 */
int hyb_numa_place_check_split(const struct hyb_numa_place_config *cfg, char *err, size_t errlen);
/* FFN weight matrices: what a DRAM budget may leave on storage. */
bool hyb_numa_place_pageable(const char *name);
/* N of "blk.N." or -1. */
int32_t hyb_numa_place_layer_of(const char *name);

#endif
