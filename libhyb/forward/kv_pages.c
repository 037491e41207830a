// SPDX-License-Identifier: MIT
/*
 * The block table of the paged KV cache (kv_pages.h), and the prefix cache
 * over it: the blocks of finished prompts kept under their tokens, shared
 * by later sequences that start with the same tokens (vLLM's automatic
 * prefix caching, Kwon et al. 2023 section 4.4 on shared prefixes). A
 * block counts its users: open sequences and kept prefixes. One that only
 * kept prefixes hold is evictable; the least recently used prefix goes
 * first when a sequence needs a block and none is free.
 */
#include "kv_pages.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"

struct kv_seq {
	bool open;
	uint32_t pos;       /* positions written */
	uint32_t cap;       /* positions reserved */
	uint32_t n_blocks;  /* blocks in its table (shared ones first) */
	uint32_t owed;      /* blocks still to take of its reservation */
	uint32_t *table;    /* max_blocks entries */
};

/* A kept prefix: n_pos positions (whole blocks) and the tokens they hold. */
struct kv_prefix {
	uint32_t n_pos;     /* 0: slot unused */
	uint64_t last_use;
	int32_t *tokens;
	uint32_t *blocks;
};

struct hyb_kv_pages {
	uint32_t n_blocks, max_blocks, n_seq;
	uint32_t n_free;    /* free[0 .. n_free): no user at all */
	uint32_t owed;      /* blocks promised to open sequences, not taken yet */
	uint32_t n_kept;    /* blocks only kept prefixes hold (evictable) */
	uint32_t *free;     /* a stack: the block freed last is used first (still in cache) */
	uint16_t *seq_refs; /* per block: open sequences using it */
	uint16_t *pre_refs; /* per block: kept prefixes holding it */
	struct kv_seq *seqs;
	uint32_t *tables;
	struct kv_prefix *pre;
	uint32_t n_pre;     /* slots in pre (one per block: every prefix holds one or more) */
	uint64_t clock;
};

static uint32_t blocks_for(uint32_t n_pos)
{
	return (n_pos + HYB_KV_BLOCK - 1) >> HYB_KV_BLOCK_SHIFT;
}

struct hyb_kv_pages *hyb_kv_pages_new(uint32_t n_seq, uint32_t n_blocks, uint32_t max_pos)
{
	struct hyb_kv_pages *kp = calloc(1, sizeof(*kp));
	const size_t nb = n_blocks ? n_blocks : 1;

	if (!kp)
		return NULL;
	kp->n_blocks = n_blocks;
	kp->max_blocks = blocks_for(max_pos);
	kp->n_seq = n_seq;
	kp->n_pre = (uint32_t)nb;
	kp->free = malloc(sizeof(uint32_t) * nb);
	kp->seq_refs = calloc(nb, sizeof(*kp->seq_refs));
	kp->pre_refs = calloc(nb, sizeof(*kp->pre_refs));
	kp->pre = calloc(nb, sizeof(*kp->pre));
	kp->seqs = calloc(n_seq ? n_seq : 1, sizeof(*kp->seqs));
	kp->tables = malloc(sizeof(uint32_t) * n_seq * (size_t)(kp->max_blocks ? kp->max_blocks : 1));
	if (!kp->free || !kp->seq_refs || !kp->pre_refs || !kp->pre || !kp->seqs || !kp->tables) {
		hyb_kv_pages_free(kp);
		return NULL;
	}
	/* popped from the top: block 0 first */
	for (uint32_t i = 0; i < n_blocks; i++)
		kp->free[i] = n_blocks - 1 - i;
	kp->n_free = n_blocks;
	for (uint32_t s = 0; s < n_seq; s++)
		kp->seqs[s].table = kp->tables + (size_t)s * kp->max_blocks;
	return kp;
}

void hyb_kv_pages_free(struct hyb_kv_pages *kp)
{
	if (!kp)
		return;
	for (uint32_t i = 0; kp->pre && i < kp->n_pre; i++) {
		free(kp->pre[i].tokens);
		free(kp->pre[i].blocks);
	}
	free(kp->pre);
	free(kp->seq_refs);
	free(kp->pre_refs);
	free(kp->free);
	free(kp->seqs);
	free(kp->tables);
	free(kp);
}

/* Drop kept prefix p: blocks no one else holds go back to the free list. */
static void drop_prefix(struct hyb_kv_pages *kp, struct kv_prefix *p)
{
	for (uint32_t i = blocks_for(p->n_pos); i-- > 0;) {
		const uint32_t b = p->blocks[i];

		if (--kp->pre_refs[b] == 0 && kp->seq_refs[b] == 0) {
			kp->n_kept--;
			kp->free[kp->n_free++] = b;
		}
	}
	free(p->tokens);
	free(p->blocks);
	memset(p, 0, sizeof(*p));
}

/* The least recently used kept prefix, or NULL when none is kept. */
static struct kv_prefix *lru_prefix(struct hyb_kv_pages *kp)
{
	struct kv_prefix *best = NULL;

	for (uint32_t i = 0; i < kp->n_pre; i++)
		if (kp->pre[i].n_pos && (!best || kp->pre[i].last_use < best->last_use))
			best = &kp->pre[i];
	return best;
}

static uint32_t common(const int32_t *a, uint32_t na, const int32_t *b, uint32_t nb)
{
	uint32_t n = 0, m = na < nb ? na : nb;

	while (n < m && a[n] == b[n])
		n++;
	return n;
}

/* The kept prefix sharing the most of tokens (its count in *shared), or NULL. */
static struct kv_prefix *find_prefix(struct hyb_kv_pages *kp, const int32_t *tokens, uint32_t n,
				     uint32_t *shared)
{
	struct kv_prefix *best = NULL;

	*shared = 0;
	for (uint32_t i = 0; tokens && i < kp->n_pre; i++) {
		const uint32_t c = kp->pre[i].n_pos ?
				   common(kp->pre[i].tokens, kp->pre[i].n_pos, tokens, n) : 0;

		if (c > *shared) {
			*shared = c;
			best = &kp->pre[i];
		}
	}
	return best;
}

int hyb_kv_pages_open_prefix(struct hyb_kv_pages *kp, uint32_t n_pos, const int32_t *tokens,
			     uint32_t n_tokens, uint32_t align, uint32_t *reused)
{
	const uint32_t need = blocks_for(n_pos);
	uint32_t shared = 0, r = 0, pinned = 0, seq;
	struct kv_prefix *p = NULL;

	*reused = 0;
	if (need > kp->max_blocks)
		return -ENOSPC;
	for (seq = 0; seq < kp->n_seq && kp->seqs[seq].open; seq++)
		;
	if (seq == kp->n_seq)
		return -ENOSPC;
	if (tokens && n_tokens > 1 && align && align % HYB_KV_BLOCK == 0) {
		p = find_prefix(kp, tokens, n_tokens, &shared);
		/* whole pieces, and at least one token left to evaluate for its logits */
		shared = shared < n_tokens - 1 ? shared : n_tokens - 1;
		shared = shared < n_pos ? shared : n_pos;
		r = shared / align * align;
	}
	for (uint32_t i = 0; i < r / HYB_KV_BLOCK; i++)
		pinned += kp->seq_refs[p->blocks[i]] == 0;
	/* the blocks it may still take, from free ones and ones only prefixes hold */
	if (need - r / HYB_KV_BLOCK + kp->owed > kp->n_free + kp->n_kept - pinned)
		return -ENOSPC;
	struct kv_seq *q = &kp->seqs[seq];

	q->open = true;
	q->cap = n_pos;
	q->n_blocks = r / HYB_KV_BLOCK;
	q->pos = r;
	q->owed = need - q->n_blocks;
	kp->owed += q->owed;
	for (uint32_t i = 0; i < q->n_blocks; i++) {
		const uint32_t b = p->blocks[i];

		q->table[i] = b;
		if (kp->seq_refs[b]++ == 0)
			kp->n_kept--;
	}
	if (r)
		p->last_use = ++kp->clock;
	*reused = r;
	return (int)seq;
}

int hyb_kv_pages_open(struct hyb_kv_pages *kp, uint32_t n_pos)
{
	uint32_t r;

	return hyb_kv_pages_open_prefix(kp, n_pos, NULL, 0, 0, &r);
}

bool hyb_kv_pages_is_open(const struct hyb_kv_pages *kp, int seq)
{
	return seq >= 0 && (uint32_t)seq < kp->n_seq && kp->seqs[seq].open;
}

int hyb_kv_pages_keep(struct hyb_kv_pages *kp, int seq, const int32_t *tokens, uint32_t n)
{
	struct kv_prefix *p, *slot = NULL;
	struct kv_seq *q;
	uint32_t shared;

	if (!hyb_kv_pages_is_open(kp, seq) || !tokens)
		return -EINVAL;
	q = &kp->seqs[seq];
	n = n < q->pos ? n : q->pos;
	n &= ~(HYB_KV_BLOCK - 1);
	if (!n)
		return 0;
	/* already kept: a prefix holding all of it */
	p = find_prefix(kp, tokens, n, &shared);
	if (p && shared == n) {
		p->last_use = ++kp->clock;
		return 0;
	}
	/* prefixes this one starts with are no longer needed: lookups find this one */
	for (uint32_t i = 0; i < kp->n_pre; i++) {
		struct kv_prefix *o = &kp->pre[i];

		if (o->n_pos && o->n_pos <= n && common(o->tokens, o->n_pos, tokens, n) == o->n_pos)
			drop_prefix(kp, o);
	}
	for (uint32_t i = 0; i < kp->n_pre && !slot; i++)
		if (!kp->pre[i].n_pos)
			slot = &kp->pre[i];
	if (!slot) {
		slot = lru_prefix(kp);
		drop_prefix(kp, slot);
	}
	slot->tokens = malloc(sizeof(int32_t) * n);
	slot->blocks = malloc(sizeof(uint32_t) * blocks_for(n));
	if (!slot->tokens || !slot->blocks) {
		free(slot->tokens);
		free(slot->blocks);
		slot->tokens = NULL;
		slot->blocks = NULL;
		return -ENOMEM;
	}
	memcpy(slot->tokens, tokens, sizeof(int32_t) * n);
	memcpy(slot->blocks, q->table, sizeof(uint32_t) * blocks_for(n));
	for (uint32_t i = 0; i < blocks_for(n); i++)
		kp->pre_refs[slot->blocks[i]]++; /* the sequence uses them: not evictable yet */
	slot->n_pos = n;
	slot->last_use = ++kp->clock;
	return 0;
}

int hyb_kv_pages_close(struct hyb_kv_pages *kp, int seq)
{
	struct kv_seq *q;

	if (!hyb_kv_pages_is_open(kp, seq))
		return -EINVAL;
	q = &kp->seqs[seq];
	/* back in reverse so that the next sequence takes them in the same order */
	while (q->n_blocks) {
		const uint32_t b = q->table[--q->n_blocks];

		if (--kp->seq_refs[b])
			continue;
		if (kp->pre_refs[b])
			kp->n_kept++;
		else
			kp->free[kp->n_free++] = b;
	}
	kp->owed -= q->owed;
	q->open = false;
	q->pos = q->cap = q->owed = 0;
	return 0;
}

uint32_t hyb_kv_pages_pos(const struct hyb_kv_pages *kp, int seq)
{
	return hyb_kv_pages_is_open(kp, seq) ? kp->seqs[seq].pos : 0;
}

uint32_t hyb_kv_pages_cap(const struct hyb_kv_pages *kp, int seq)
{
	return hyb_kv_pages_is_open(kp, seq) ? kp->seqs[seq].cap : 0;
}

const uint32_t *hyb_kv_pages_extend(struct hyb_kv_pages *kp, int seq, uint32_t n)
{
	struct kv_seq *q;
	uint32_t need;

	if (!hyb_kv_pages_is_open(kp, seq))
		return NULL;
	q = &kp->seqs[seq];
	if ((uint64_t)q->pos + n > q->cap)
		return NULL;
	need = blocks_for(q->pos + n);
	while (q->n_blocks < need) {
		uint32_t b;

		/* within the reservation: free blocks, or ones kept prefixes give up */
		while (!kp->n_free) {
			struct kv_prefix *p = lru_prefix(kp);

			if (!p)
				return NULL; /* not reached: open counted the blocks */
			drop_prefix(kp, p);
		}
		b = kp->free[--kp->n_free];
		kp->seq_refs[b] = 1;
		q->table[q->n_blocks++] = b;
		q->owed--;
		kp->owed--;
	}
	return q->table;
}

void hyb_kv_pages_advance(struct hyb_kv_pages *kp, int seq, uint32_t n)
{
	if (hyb_kv_pages_is_open(kp, seq))
		kp->seqs[seq].pos += n;
}

void hyb_kv_pages_stats(const struct hyb_kv_pages *kp, struct hyb_kv_pages_stats *out)
{
	out->blocks = kp->n_blocks;
	out->kept = kp->n_kept;
	out->used = kp->n_blocks - kp->n_free - kp->n_kept;
	out->reserved = out->used + kp->owed;
	out->max_seqs = kp->n_seq;
	out->seqs = 0;
	for (uint32_t s = 0; s < kp->n_seq; s++)
		out->seqs += kp->seqs[s].open;
}
