/* SPDX-License-Identifier: MIT */
/*
 * The pair-merging core both encoders share: symbols in a linked list, a
 * priority queue of adjacent pairs, and the loop that merges the best pair
 * until none is left. SentencePiece ranks a pair by the score of its
 * concatenation, BPE by its merge rank; ties go to the leftmost pair, as in
 * llama.cpp's llm_tokenizer_spm and llm_tokenizer_bpe.
 */
#ifndef HYB_TOKENIZER_MERGE_H
#define HYB_TOKENIZER_MERGE_H

#include <stdbool.h>
#include <stddef.h>

struct tok_sym {
	int prev, next;  /* -1 at the ends */
	size_t off, n;   /* bytes of the text; n == 0 once merged into its left neighbour */
};

/*
 * Whether the adjacent symbols l, r may merge, and with what priority
 * (smaller merges first).
 */
typedef bool (*tok_pair_fn)(void *ctx, const struct tok_sym *l, const struct tok_sym *r,
			    float *prio);

struct tok_bigram {
	int left, right;
	float prio;
	size_t size; /* l->n + r->n when queued: a mismatch later marks the entry stale */
};

struct tok_merger {
	struct tok_sym *sym;  /* the caller's symbols */
	tok_pair_fn pair;
	void *ctx;
	/* private */
	struct tok_bigram *heap;
	size_t n_heap, cap_heap;
	bool oom;
};

/* Merge the symbols linked from index first to the end of the list; -1 when out of memory. */
int hyb_tok_merge(struct tok_merger *m, int first);
void hyb_tok_merger_release(struct tok_merger *m);

#endif
