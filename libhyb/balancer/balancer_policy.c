// SPDX-License-Identifier: MIT
/*
 * The moving policies of the balancer (hyb/balancer.h). Each one ranks the
 * groups that may be cached next step (the resident ones and its candidates)
 * by a priority; one rule then turns the ranking into loads and evictions:
 *
 *   target  T = the first K_l groups of the ranking;
 *   loads   the groups of T not resident, in ranking order, at most `cap`
 *           (the communication window, balancer.c);
 *   evicts  as many as the loads need beyond the free slots, the resident
 *           groups outside T from the bottom of the ranking up.
 *
 * Eviction only makes room: slots are per layer and a resident group costs
 * nothing to keep, so a freed slot would only sit empty until the next load.
 * The victims always exist: with n_load <= |T \ C|, the resident groups
 * outside T number |C| - |C n T| >= n_load - (K_l - |C|).
 *
 * Rankings (all break ties resident first, then by profiled freq, then by
 * index, so decisions are deterministic and a tie never causes a reload):
 *   lru      KAIROX 3.2 strawman / Neuralink: the active groups first (by
 *            A_g, so the window keeps the most active), then the resident
 *            ones by the step they were last active. Every active group not
 *            resident is a load (within K_l and the window), the least
 *            recently active resident the victim.
 *   topk     KAIROX 9.3 "Top-K", Q-Infer-like: by this step's A_g alone;
 *            candidates are the active groups (an inactive group is never
 *            loaded, it would be a reload for nothing).
 *   dynamic  DynamicInfer E.3: v = a + lambda f over every group (history
 *            alone may bring a group in, the paper's macro level), pinned
 *            groups above all: the start set's profiled-hot groups while
 *            their running f stays at least phi_high (balancer.c).
 *   tam      KAIROX Algorithm 1 phase 2: S <- lambda S + (1 - lambda) A_g for
 *            every group; candidates S > (1 - lambda) + eps; ranking by S.
 *            C_{t+1} = TopK(candidates, K_l) as in line 16, except that a
 *            resident group whose score fell under the threshold stays while
 *            no load needs its slot (the paper evicts it at once, leaving the
 *            slot empty; keeping it costs no I/O, and it is the first victim
 *            anyway since its S is below every candidate's). This matters with
 *            A_g a fraction: the warm-start groups have S = freq, often under
 *            1 - lambda, and the paper's rule would empty the cache at step 1.
 *            A_g is the group's share of active neurons over a reference,
 *            capped at 1: by default the layer's start set's mean profiled
 *            share (balancer.c, start_reference), or a fixed a_ref. Why a
 *            reference: the threshold's reasoning (one isolated activation
 *            of a cold neuron gives S = 1 - lambda) is for binary A. With a
 *            share, an isolated activation still gives at most 1 - lambda and
 *            is filtered, but a group active every step at share r only
 *            reaches S = r, so it is never a candidate when r <= 1 - lambda +
 *            eps, and tam-adaptive's CPU_BOUND move (lower lambda) then makes
 *            it *less* eager. A reference near the share of the groups worth
 *            a slot makes such groups count as fully active and the loop acts
 *            in the paper's direction; a fixed one holds at one sparsity only
 *            (test_balancer: bal_tam_adaptive_direction_at_two_sparsities).
 */
#include <math.h>
#include <stdbool.h>

#include "balancer_internal.h"

/* a ranks before b (the order of the header comment) */
static inline bool before(const struct bal_item *a, const struct bal_item *b)
{
	if (a->k1 != b->k1)
		return a->k1 > b->k1;
	if (a->k2 != b->k2)
		return a->k2 > b->k2;
	if (a->res != b->res)
		return a->res;
	if (a->freq != b->freq)
		return a->freq > b->freq;
	return a->g < b->g;
}

static inline void swap_items(struct bal_item *a, struct bal_item *b)
{
	const struct bal_item t = *a;

	*a = *b;
	*b = t;
}

/*
 * Hoare partition of it[lo..hi] (inclusive, hi - lo >= 2) around the median
 * of three; returns p with it[lo..p] ranking before it[p+1..hi]. The order
 * is total (ties end at the index), so no run of equal keys degrades it.
 */
static uint32_t partition(struct bal_item *it, uint32_t lo, uint32_t hi)
{
	const uint32_t mid = lo + (hi - lo) / 2;
	struct bal_item pivot;
	uint32_t i = lo - 1, j = hi + 1;

	if (before(&it[mid], &it[lo]))
		swap_items(&it[mid], &it[lo]);
	if (before(&it[hi], &it[lo]))
		swap_items(&it[hi], &it[lo]);
	if (before(&it[hi], &it[mid]))
		swap_items(&it[hi], &it[mid]);
	pivot = it[mid];
	for (;;) {
		do
			i++;
		while (before(&it[i], &pivot));
		do
			j--;
		while (before(&pivot, &it[j]));
		if (i >= j)
			return j;
		swap_items(&it[i], &it[j]);
	}
}

static void insertion_sort(struct bal_item *it, uint32_t n)
{
	for (uint32_t i = 1; i < n; i++) {
		const struct bal_item x = it[i];
		uint32_t j = i;

		for (; j > 0 && before(&x, &it[j - 1]); j--)
			it[j] = it[j - 1];
		it[j] = x;
	}
}

/* Sort it[0..n) by rank; loops on the larger side so the stack stays O(log n). */
static void sort_items(struct bal_item *it, uint32_t n)
{
	while (n > 16) {
		const uint32_t p = partition(it, 0, n - 1) + 1;

		if (p < n - p) {
			sort_items(it, p);
			it += p;
			n -= p;
		} else {
			sort_items(it + p, n - p);
			n = p;
		}
	}
	insertion_sort(it, n);
}

/* Reorder it[0..n) so its first k items are the k that rank first (in any order). */
static void select_top(struct bal_item *it, uint32_t n, uint32_t k)
{
	uint32_t lo = 0, hi = n - 1;

	if (k == 0 || k >= n)
		return;
	while (hi - lo > 16) {
		const uint32_t p = partition(it, lo, hi);

		if (k - 1 <= p)
			hi = p;
		else
			lo = p + 1;
	}
	insertion_sort(it + lo, hi - lo + 1);
}

static uint32_t rank_lru(struct hyb_balancer *b, uint32_t l)
{
	const size_t o = (size_t)l * b->G;
	uint32_t n = 0;

	for (uint32_t g = 0; g < b->G; g++) {
		const bool on = b->count[g] > 0;

		if (on || b->res[o + g])
			b->items[n++] = (struct bal_item){
				on ? 1 : 0, on ? b->act[g] : (double)b->last[o + g],
				b->freq[o + g], g, b->res[o + g] };
	}
	return n;
}

static uint32_t rank_topk(struct hyb_balancer *b, uint32_t l)
{
	const size_t o = (size_t)l * b->G;
	uint32_t n = 0;

	for (uint32_t g = 0; g < b->G; g++)
		if (b->count[g] || b->res[o + g])
			b->items[n++] = (struct bal_item){ b->act[g], 0, b->freq[o + g], g,
							   b->res[o + g] };
	return n;
}

static uint32_t rank_dynamic(struct hyb_balancer *b, uint32_t l)
{
	const size_t o = (size_t)l * b->G;
	const double lam = b->lambda[l];

	for (uint32_t g = 0; g < b->G; g++) {
		/* a profiled-hot group is pinned while its running f is >= phi_high (balancer.c) */
		const double v = b->pinnable[o + g] && b->score[o + g] >= b->phi_high ? INFINITY :
				 b->act[g] + lam * b->score[o + g];

		b->items[g] = (struct bal_item){ v, 0, b->freq[o + g], g, b->res[o + g] };
	}
	return b->G;
}

static uint32_t rank_tam(struct hyb_balancer *b, uint32_t l)
{
	const size_t o = (size_t)l * b->G;
	const double lam = b->lambda[l], tau = (1 - lam) + b->eps;
	uint32_t n = 0;

	for (uint32_t g = 0; g < b->G; g++) {
		const float s = (float)(lam * b->score[o + g] + (1 - lam) * b->act_n[g]);

		b->score[o + g] = s;
		if (s > tau || b->res[o + g])
			b->items[n++] = (struct bal_item){ s, 0, b->freq[o + g], g,
							   b->res[o + g] };
	}
	return n;
}

void hyb_bal_decide(struct hyb_balancer *b, uint32_t l, uint32_t cap, uint32_t *load,
		uint32_t *n_load, uint32_t *evict, uint32_t *n_evict)
{
	const size_t o = (size_t)l * b->G;
	const uint32_t k = b->k[l];
	uint32_t n, top, nl = 0, ne = 0, need, free_slots;

	switch (b->policy) {
	case HYB_POLICY_LRU:
		n = rank_lru(b, l);
		break;
	case HYB_POLICY_TOPK:
		n = rank_topk(b, l);
		break;
	case HYB_POLICY_DYNAMIC:
		n = rank_dynamic(b, l);
		break;
	case HYB_POLICY_TAM:
	case HYB_POLICY_TAM_ADAPTIVE:
		n = rank_tam(b, l);
		break;
	default:
		n = 0;
		break;
	}
	/*
	 * O(n) selection of the target, then sorts of the two small parts that
	 * matter: the target's groups not resident (the loads, best first) and
	 * the resident groups outside it (the victims, worst first).
	 */
	top = n < k ? n : k;
	select_top(b->items, n, top);
	for (uint32_t q = 0, m = 0; q < top; q++)
		if (!b->items[q].res)
			swap_items(&b->items[m++], &b->items[q]);
	for (uint32_t q = 0; q < top && !b->items[q].res; q++)
		nl++;
	if (nl > cap) {
		select_top(b->items, nl, cap);
		nl = cap;
	}
	sort_items(b->items, nl);
	for (uint32_t q = 0; q < nl; q++)
		load[q] = b->items[q].g;
	free_slots = k - b->n_res[l];
	need = nl > free_slots ? nl - free_slots : 0;
	if (need) {
		struct bal_item *out = b->items + top;
		uint32_t r = 0;

		for (uint32_t q = 0; q < n - top; q++)
			if (out[q].res)
				swap_items(&out[r++], &out[q]);
		if (r < need) { /* cannot happen (header comment); never break K_l anyway */
			nl -= need - r;
			need = r;
		}
		/* the r residents outside the target, worst `need` of them last */
		select_top(out, r, r - need);
		sort_items(out + (r - need), need);
		for (uint32_t q = 0; q < need; q++)
			evict[ne++] = out[r - 1 - q].g;
	}
	/* ne == need by the count in the header comment */
	for (uint32_t i = 0; i < ne; i++)
		b->res[o + evict[i]] = 0;
	for (uint32_t i = 0; i < nl; i++)
		b->res[o + load[i]] = 1;
	b->n_res[l] = b->n_res[l] + nl - ne;
	*n_load = nl;
	*n_evict = ne;

	/* history after the decision: this step's activity is not counted twice */
	if (b->policy == HYB_POLICY_LRU) {
		for (uint32_t g = 0; g < b->G; g++)
			if (b->count[g])
				b->last[o + g] = b->steps[l];
	} else if (b->policy == HYB_POLICY_DYNAMIC) {
		for (uint32_t g = 0; g < b->G; g++)
			b->score[o + g] += (float)(BAL_DYN_RATE * (b->act[g] - b->score[o + g]));
	}
}
