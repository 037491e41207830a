// SPDX-License-Identifier: MIT
/* The block table of the paged KV cache (kv_pages.h). */
#include "kv_pages.h"

#include <errno.h>
#include <stdlib.h>

#include "attention.h"

struct kv_seq {
	bool open;
	uint32_t pos;       /* positions written */
	uint32_t cap;       /* positions reserved */
	uint32_t n_blocks;  /* blocks taken so far */
	uint32_t *table;    /* max_blocks entries */
};

struct hyb_kv_pages {
	uint32_t n_blocks, max_blocks, n_seq;
	uint32_t n_free;    /* free[0 .. n_free) */
	uint32_t reserved;  /* blocks promised to open sequences */
	uint32_t *free;     /* a stack: the block freed last is used first (still in cache) */
	struct kv_seq *seqs;
	uint32_t *tables;
};

static uint32_t blocks_for(uint32_t n_pos)
{
	return (n_pos + HYB_KV_BLOCK - 1) >> HYB_KV_BLOCK_SHIFT;
}

struct hyb_kv_pages *hyb_kv_pages_new(uint32_t n_seq, uint32_t n_blocks, uint32_t max_pos)
{
	struct hyb_kv_pages *kp = calloc(1, sizeof(*kp));

	if (!kp)
		return NULL;
	kp->n_blocks = n_blocks;
	kp->max_blocks = blocks_for(max_pos);
	kp->n_seq = n_seq;
	kp->free = malloc(sizeof(uint32_t) * (n_blocks ? n_blocks : 1));
	kp->seqs = calloc(n_seq ? n_seq : 1, sizeof(*kp->seqs));
	kp->tables = malloc(sizeof(uint32_t) * n_seq * (size_t)(kp->max_blocks ? kp->max_blocks : 1));
	if (!kp->free || !kp->seqs || !kp->tables) {
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
	free(kp->free);
	free(kp->seqs);
	free(kp->tables);
	free(kp);
}

int hyb_kv_pages_open(struct hyb_kv_pages *kp, uint32_t n_pos)
{
	const uint32_t need = blocks_for(n_pos);

	if (need > kp->max_blocks || need > kp->n_blocks - kp->reserved)
		return -ENOSPC;
	for (uint32_t s = 0; s < kp->n_seq; s++) {
		struct kv_seq *q = &kp->seqs[s];

		if (q->open)
			continue;
		q->open = true;
		q->pos = 0;
		q->cap = n_pos;
		q->n_blocks = 0;
		kp->reserved += need;
		return (int)s;
	}
	return -ENOSPC;
}

bool hyb_kv_pages_is_open(const struct hyb_kv_pages *kp, int seq)
{
	return seq >= 0 && (uint32_t)seq < kp->n_seq && kp->seqs[seq].open;
}

int hyb_kv_pages_close(struct hyb_kv_pages *kp, int seq)
{
	struct kv_seq *q;

	if (!hyb_kv_pages_is_open(kp, seq))
		return -EINVAL;
	q = &kp->seqs[seq];
	/* back in reverse so that the next sequence takes them in the same order */
	while (q->n_blocks)
		kp->free[kp->n_free++] = q->table[--q->n_blocks];
	kp->reserved -= blocks_for(q->cap);
	q->open = false;
	q->pos = q->cap = 0;
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
	/* within the reservation: the free list cannot be empty here */
	while (q->n_blocks < need)
		q->table[q->n_blocks++] = kp->free[--kp->n_free];
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
	out->used = kp->n_blocks - kp->n_free;
	out->reserved = kp->reserved;
	out->max_seqs = kp->n_seq;
	out->seqs = 0;
	for (uint32_t s = 0; s < kp->n_seq; s++)
		out->seqs += kp->seqs[s].open;
}
