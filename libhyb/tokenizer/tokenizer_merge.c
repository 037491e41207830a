// SPDX-License-Identifier: MIT
#include "tokenizer_merge.h"

#include <stdlib.h>

/* Heap order: lower priority value first, then the leftmost pair. */
static bool before(const struct tok_bigram *a, const struct tok_bigram *b)
{
	return a->prio < b->prio || (a->prio == b->prio && a->left < b->left);
}

static void heap_push(struct tok_merger *m, struct tok_bigram b)
{
	size_t i;

	if (m->n_heap == m->cap_heap) {
		size_t cap = m->cap_heap ? m->cap_heap * 2 : 64;
		struct tok_bigram *h = realloc(m->heap, cap * sizeof(*h));

		if (!h) {
			m->oom = true;
			return;
		}
		m->heap = h;
		m->cap_heap = cap;
	}
	i = m->n_heap++;
	while (i > 0) {
		size_t parent = (i - 1) / 2;

		if (!before(&b, &m->heap[parent]))
			break;
		m->heap[i] = m->heap[parent];
		i = parent;
	}
	m->heap[i] = b;
}

static struct tok_bigram heap_pop(struct tok_merger *m)
{
	struct tok_bigram top = m->heap[0], last = m->heap[--m->n_heap];
	size_t i = 0, n = m->n_heap;

	for (;;) {
		size_t c = 2 * i + 1;

		if (c >= n)
			break;
		if (c + 1 < n && before(&m->heap[c + 1], &m->heap[c]))
			c++;
		if (!before(&m->heap[c], &last))
			break;
		m->heap[i] = m->heap[c];
		i = c;
	}
	if (n)
		m->heap[i] = last;
	return top;
}

static void try_pair(struct tok_merger *m, int left, int right)
{
	const struct tok_sym *l, *r;
	float prio;

	if (left < 0 || right < 0)
		return;
	l = &m->sym[left];
	r = &m->sym[right];
	if (m->pair(m->ctx, l, r, &prio))
		heap_push(m, (struct tok_bigram){ left, right, prio, l->n + r->n });
}

int hyb_tok_merge(struct tok_merger *m, int first)
{
	m->n_heap = 0;
	m->oom = false;
	for (int i = first; i >= 0 && m->sym[i].next >= 0; i = m->sym[i].next)
		try_pair(m, i, m->sym[i].next);
	while (m->n_heap && !m->oom) {
		struct tok_bigram b = heap_pop(m);
		struct tok_sym *l = &m->sym[b.left], *r = &m->sym[b.right];

		/* Stale entry: one side was merged away since it was queued. */
		if (l->n == 0 || r->n == 0 || l->n + r->n != b.size)
			continue;
		l->n += r->n;
		r->n = 0;
		l->next = r->next;
		if (r->next >= 0)
			m->sym[r->next].prev = b.left;
		try_pair(m, l->prev, b.left);
		try_pair(m, b.left, l->next);
	}
	return m->oom ? -1 : 0;
}

void hyb_tok_merger_release(struct tok_merger *m)
{
	free(m->heap);
	m->heap = NULL;
	m->n_heap = m->cap_heap = 0;
}
