/* SPDX-License-Identifier: MIT */
/*
 * The block table of a paged KV cache shared by several sequences
 * (PagedAttention, Kwon et al. 2023, section 4.2): the cache is cut into
 * blocks of HYB_KV_BLOCK positions, a sequence maps its positions to
 * blocks through its table, and a block goes back to the free list when its
 * sequence closes. A sequence reserves at open the blocks it may fill
 * (prompt plus tokens to generate), so a step never runs out mid-batch; the
 * blocks themselves are taken as positions are written (docs/SERVE.md).
 *
 * Prefix cache: a sequence may keep its first positions under the tokens
 * they hold when it closes; a later sequence opened with tokens that start
 * the same way shares those blocks instead of computing them again. Kept
 * blocks no open sequence uses are given up, least recently used first,
 * when a sequence needs a block and none is free.
 */
#ifndef HYB_KV_PAGES_H
#define HYB_KV_PAGES_H

#include <stdbool.h>
#include <stdint.h>

struct hyb_kv_pages;

/* n_seq sequences of up to max_pos positions each over n_blocks blocks; NULL: out of memory */
struct hyb_kv_pages *hyb_kv_pages_new(uint32_t n_seq, uint32_t n_blocks, uint32_t max_pos);
void hyb_kv_pages_free(struct hyb_kv_pages *kp);
/* A sequence that may hold n_pos positions: its id, or -ENOSPC (no free sequence or blocks). */
int hyb_kv_pages_open(struct hyb_kv_pages *kp, uint32_t n_pos);
/*
 * The same, sharing the longest kept prefix of tokens[0 .. n_tokens) that
 * is a multiple of align positions (align a multiple of HYB_KV_BLOCK; 0:
 * none) and leaves one token or more to evaluate: *reused positions, at
 * which the sequence starts.
 */
int hyb_kv_pages_open_prefix(struct hyb_kv_pages *kp, uint32_t n_pos, const int32_t *tokens,
			     uint32_t n_tokens, uint32_t align, uint32_t *reused);
/*
 * Keep the sequence's first n positions (whole blocks, at most those
 * written), holding tokens[0 .. n), for later sequences. 0, -EINVAL (not
 * open), -ENOMEM. The caller vouches that they are what a sequence opened
 * afresh would compute for these tokens.
 */
int hyb_kv_pages_keep(struct hyb_kv_pages *kp, int seq, const int32_t *tokens, uint32_t n);
/* 0, or -EINVAL for a sequence that is not open. Its blocks are free again. */
int hyb_kv_pages_close(struct hyb_kv_pages *kp, int seq);
bool hyb_kv_pages_is_open(const struct hyb_kv_pages *kp, int seq);
/* Positions written so far, and the most it may hold. */
uint32_t hyb_kv_pages_pos(const struct hyb_kv_pages *kp, int seq);
uint32_t hyb_kv_pages_cap(const struct hyb_kv_pages *kp, int seq);
/*
 * Blocks for positions pos(seq) .. pos(seq) + n - 1 (taken from the
 * sequence's reservation), then its table; NULL when past its capacity.
 */
const uint32_t *hyb_kv_pages_extend(struct hyb_kv_pages *kp, int seq, uint32_t n);
/* The positions were written (after a successful step). */
void hyb_kv_pages_advance(struct hyb_kv_pages *kp, int seq, uint32_t n);

struct hyb_kv_pages_stats {
	uint32_t blocks;    /* in the cache */
	uint32_t used;      /* holding positions of open sequences */
	uint32_t kept;      /* held only by kept prefixes: given up when needed */
	uint32_t reserved;  /* promised to open sequences (used included) */
	uint32_t seqs;      /* open sequences */
	uint32_t max_seqs;
};
void hyb_kv_pages_stats(const struct hyb_kv_pages *kp, struct hyb_kv_pages_stats *out);

#endif
