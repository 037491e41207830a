// SPDX-License-Identifier: MIT
/*
 * Neuron groups: the group size, and which neurons share a group.
 *
 * Group size (KAIROX 5.2 "Granularity Trade-offs"): a group is one bundle and
 * one DMA, so it must be big enough to use the link well but no bigger, since
 * a whole group moves when one of its neurons is wanted. The link is modelled
 * as t(b) = latency + b / bw; fitted to KAIROX Table 2 this model reproduces
 * the measured PCIe 4.0 curve (5.8 -> 22.8 GB/s for GS 1 -> 32 at 10 KB per
 * neuron) with latency 1.36 us and bw 25.2 GB/s. GS is the smallest size whose
 * efficiency b / bw / t(b) reaches the target, and at least n_ff / 1024 so a
 * layer has at most 1024 groups (KAIROX's argsort limit).
 *
 * Grouping (KAIROX 5.2 "Problem Formulation"): maximise the co-activation
 * weight inside groups of exactly GS neurons, approximated with METIS. The
 * graph is never the dense n_ff x n_ff matrix: each neuron's samples are a
 * column bitset, the co-activation of two neurons a popcount of their AND,
 * and each neuron keeps only its top_k neighbours by Jaccard similarity
 * |A_i & A_j| / |A_i | A_j| (symmetrised). Jaccard rather than the raw count:
 * raw counts make every neuron's best neighbours the hot neurons, while the
 * quantity a grouping should shrink is the number of groups a token touches,
 * which for a pair is exactly its union |A_i | A_j|.
 */
#include <errno.h>
#include <math.h>
#include <metis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu_kernels.h"
#include "hyb/threadpool.h"
#include "plan_internal.h"

double hyb_plan_link_efficiency(const struct hyb_plan_link *k, uint64_t bytes)
{
	double t = (double)bytes / k->bw;

	return t / (k->latency_s + t);
}

uint32_t hyb_plan_pick_group_size(const struct hyb_plan_link *k, uint64_t neuron_bytes, uint32_t n_ff,
			      double target, uint32_t max_groups)
{
	uint32_t gs = 1;

	while (gs < n_ff && hyb_plan_link_efficiency(k, (uint64_t)gs * neuron_bytes) < target)
		gs++;
	if (max_groups && gs < (n_ff + max_groups - 1) / max_groups)
		gs = (n_ff + max_groups - 1) / max_groups;
	if (gs > n_ff)
		gs = n_ff;
	return gs ? gs : 1;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t splitmix64(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static void shuffle_u32(uint32_t *a, uint32_t n, uint64_t seed)
{
	uint64_t s = seed ^ 0x5eed5eedull;

	for (uint32_t i = n; i > 1; i--) {
		uint32_t j = (uint32_t)(splitmix64(&s) % i), t = a[i - 1];

		a[i - 1] = a[j];
		a[j] = t;
	}
}

/* ---- co-activation graph ------------------------------------------------ */

/*
 * Top-k neighbours by Jaccard similarity, ties to the smaller index so the
 * result does not depend on the thread count. Each pair is counted once
 * (j > i, rows dealt round-robin so threads get equal work) and offered to
 * both ends' lists, which are per thread and merged at the end.
 */
struct topk {
	uint32_t *id;   /* [n_live][k] live indices; kept[i] of them valid */
	float *s;
	uint32_t *kept, *worst;
};

/* (s, id) better than (t, jd): larger similarity, then smaller index */
static inline bool better(float s, uint32_t id, float t, uint32_t jd)
{
	return s > t || (s == t && id < jd);
}

static void topk_offer(struct topk *t, uint32_t k, uint32_t i, uint32_t id, float s)
{
	uint32_t *nb = t->id + (size_t)i * k, kept = t->kept[i], w = t->worst[i];
	float *sm = t->s + (size_t)i * k;

	if (kept < k) {
		nb[kept] = id;
		sm[kept] = s;
		if (kept == 0 || better(sm[w], nb[w], s, id))
			w = kept;
		t->kept[i] = kept + 1;
		t->worst[i] = w;
		return;
	}
	if (!better(s, id, sm[w], nb[w]))
		return;
	nb[w] = id;
	sm[w] = s;
	for (uint32_t q = 0; q < k; q++)
		if (better(sm[w], nb[w], sm[q], nb[q]))
			w = q;
	t->worst[i] = w;
}

struct knn_job {
	const uint64_t *cols;  /* [n][W] */
	uint32_t W, k, n_live;
	const uint32_t *cnt;   /* [n] samples each neuron is active in */
	const uint32_t *live;  /* neurons with cnt > 0 */
	struct topk *part;     /* per thread */
	uint32_t *nbr;         /* [n][k] neuron ids, UINT32_MAX: empty */
	float *sim;            /* [n][k] */
	int nth, failed;
};

#define KNN_BLK 64

/*
 * Tiles of KNN_BLK x KNN_BLK neuron pairs above the diagonal; a thread takes
 * block rows round-robin. A tile's counts are offered to its 2 * KNN_BLK
 * lists, which stay in cache while it does.
 */
static void knn_worker(void *arg, int ith, int nth)
{
	struct knn_job *j = arg;
	const struct hyb_cpu_kernels *kern = hyb_cpu_best();
	const uint32_t n_blk = (j->n_live + KNN_BLK - 1) / KNN_BLK;
	uint32_t *c = malloc((size_t)KNN_BLK * KNN_BLK * sizeof(*c));
	struct topk *t = &j->part[ith];

	if (!c || ith >= j->nth) {
		j->failed = 1;
		free(c);
		return;
	}
	for (uint32_t bi = (uint32_t)ith; bi < n_blk; bi += (uint32_t)nth) {
		const uint32_t i0 = bi * KNN_BLK;
		const uint32_t i1 = i0 + KNN_BLK < j->n_live ? i0 + KNN_BLK : j->n_live;

		for (uint32_t bj = bi; bj < n_blk; bj++) {
			const uint32_t j0 = bj * KNN_BLK;
			const uint32_t j1 = j0 + KNN_BLK < j->n_live ? j0 + KNN_BLK : j->n_live;

			for (uint32_t ii = i0; ii < i1; ii++) {
				/* the diagonal tile: only pairs jj > ii */
				const uint32_t js = bi == bj ? ii + 1 : j0;
				const uint32_t i = j->live[ii];
				const uint64_t *a = j->cols + (size_t)i * j->W;
				uint32_t *ci = c + (size_t)(ii - i0) * KNN_BLK;

				if (js >= j1)
					continue;
				kern->and_popcount(a, j->cols, j->W, j->live + js, j1 - js, ci);
				for (uint32_t jj = js; jj < j1; jj++) {
					uint32_t cc = ci[jj - js], v = j->live[jj];
					float sim;

					if (!cc)
						continue;
					sim = (float)cc / (float)(j->cnt[i] + j->cnt[v] - cc);
					topk_offer(t, j->k, ii, jj, sim);
					topk_offer(t, j->k, jj, ii, sim);
				}
			}
		}
	}
	free(c);
}

/* the per-thread lists of each neuron into one */
static void knn_merge(void *arg, int ith, int nth)
{
	struct knn_job *j = arg;
	struct topk m;
	uint32_t kept = 0, worst = 0;
	long lo, hi;

	m.id = malloc((size_t)j->k * sizeof(*m.id));
	m.s = malloc((size_t)j->k * sizeof(*m.s));
	if (!m.id || !m.s) {
		j->failed = 1;
		free(m.id);
		free(m.s);
		return;
	}
	m.kept = &kept;
	m.worst = &worst;
	hyb_split(j->n_live, ith, nth, &lo, &hi);
	for (long ii = lo; ii < hi; ii++) {
		const uint32_t i = j->live[ii];

		kept = 0;
		for (int p = 0; p < j->nth; p++) {
			const struct topk *t = &j->part[p];

			for (uint32_t q = 0; q < t->kept[ii]; q++)
				topk_offer(&m, j->k, 0, t->id[(size_t)ii * j->k + q],
					   t->s[(size_t)ii * j->k + q]);
		}
		for (uint32_t q = 0; q < kept; q++) {
			j->nbr[(size_t)i * j->k + q] = j->live[m.id[q]];
			j->sim[(size_t)i * j->k + q] = m.s[q];
		}
	}
	free(m.id);
	free(m.s);
}

/* Column bitsets over an evenly spread subset of S samples: bit s of cols[i] is sample s. */
static void sample_columns(const struct hyb_profile *p, uint32_t layer, uint32_t S, uint32_t W,
			   uint64_t *cols)
{
	const uint32_t n = p->n_ff;

	for (uint32_t s = 0; s < S; s++) {
		uint32_t src = (uint32_t)((uint64_t)s * p->n_samples / S);
		const uint64_t *a = p->layers[layer].active + (size_t)src * p->active_words;

		for (uint32_t w = 0; w < p->active_words; w++)
			for (uint64_t bits = a[w]; bits; bits &= bits - 1) {
				uint32_t i = w * 64 + (uint32_t)__builtin_ctzll(bits);

				if (i < n)
					cols[(size_t)i * W + s / 64] |= 1ull << (s % 64);
			}
	}
}

/* cnt[i]: the samples neuron i is active in; live: the neurons active in any (their count). */
static uint32_t live_neurons(const uint64_t *cols, uint32_t n, uint32_t W, uint32_t *cnt,
			     uint32_t *live)
{
	uint32_t n_live = 0;

	for (uint32_t i = 0; i < n; i++) {
		for (uint32_t w = 0; w < W; w++)
			cnt[i] += (uint32_t)__builtin_popcountll(cols[(size_t)i * W + w]);
		if (cnt[i])
			live[n_live++] = i;
	}
	return n_live;
}

/*
 * Every live neuron's top-k list (j->nbr, j->sim) over the pool: per-thread
 * lists first (knn_worker), then merged (knn_merge). 0, or -1 when out of memory.
 */
static int knn_lists(struct knn_job *j, struct hyb_threadpool *pool)
{
	const size_t lists = (size_t)j->n_live * j->k;

	j->part = calloc((size_t)j->nth, sizeof(*j->part));
	for (int q = 0; j->part && q < j->nth; q++) {
		j->part[q].id = malloc(lists * sizeof(uint32_t) + 1);
		j->part[q].s = malloc(lists * sizeof(float) + 1);
		j->part[q].kept = calloc((size_t)j->n_live + 1, sizeof(uint32_t));
		j->part[q].worst = calloc((size_t)j->n_live + 1, sizeof(uint32_t));
		if (!j->part[q].id || !j->part[q].s || !j->part[q].kept || !j->part[q].worst)
			j->failed = 1;
	}
	if (!j->part)
		j->failed = 1;
	if (!j->failed) {
		if (pool) {
			hyb_threadpool_run(pool, knn_worker, j);
			if (!j->failed)
				hyb_threadpool_run(pool, knn_merge, j);
		} else {
			knn_worker(j, 0, 1);
			if (!j->failed)
				knn_merge(j, 0, 1);
		}
	}
	for (int q = 0; j->part && q < j->nth; q++) {
		free(j->part[q].id);
		free(j->part[q].s);
		free(j->part[q].kept);
		free(j->part[q].worst);
	}
	free(j->part);
	j->part = NULL;
	return j->failed ? -1 : 0;
}

struct graph {
	idx_t *xadj, *adjncy, *adjwgt;
	uint64_t n_edges; /* undirected */
};

static void graph_free(struct graph *g)
{
	free(g->xadj);
	free(g->adjncy);
	free(g->adjwgt);
}

struct half_edge {
	uint32_t to;
	idx_t w;
};

static int cmp_half_edge(const void *a, const void *b)
{
	const struct half_edge *x = a, *y = b;

	return x->to < y->to ? -1 : x->to > y->to;
}

/* Symmetrise the top-k lists into METIS's CSR form (integer weights 1..1000). */
static int build_csr(uint32_t n, uint32_t k, const uint32_t *nbr, const float *sim,
		     struct graph *g)
{
	uint64_t *deg = calloc((size_t)n + 1, sizeof(*deg)), total = 0;
	struct half_edge *he = NULL;
	int rc = -1;

	memset(g, 0, sizeof(*g));
	if (!deg)
		return -1;
	for (uint32_t i = 0; i < n; i++)
		for (uint32_t q = 0; q < k; q++)
			if (nbr[(size_t)i * k + q] != UINT32_MAX) {
				deg[i]++;
				deg[nbr[(size_t)i * k + q]]++;
			}
	for (uint32_t i = 0; i < n; i++) {
		uint64_t d = deg[i];

		deg[i] = total;
		total += d;
	}
	deg[n] = total;
	he = malloc((total ? total : 1) * sizeof(*he));
	g->xadj = malloc(((size_t)n + 1) * sizeof(idx_t));
	g->adjncy = malloc((total ? total : 1) * sizeof(idx_t));
	g->adjwgt = malloc((total ? total : 1) * sizeof(idx_t));
	if (!he || !g->xadj || !g->adjncy || !g->adjwgt || total > INT32_MAX)
		goto out;
	{
		uint64_t *fill = calloc((size_t)n, sizeof(*fill));

		if (!fill)
			goto out;
		for (uint32_t i = 0; i < n; i++)
			for (uint32_t q = 0; q < k; q++) {
				uint32_t v = nbr[(size_t)i * k + q];
				idx_t w;

				if (v == UINT32_MAX)
					continue;
				w = (idx_t)lrintf(sim[(size_t)i * k + q] * 1000.0f);
				if (w < 1)
					w = 1;
				he[deg[i] + fill[i]++] = (struct half_edge){ v, w };
				he[deg[v] + fill[v]++] = (struct half_edge){ i, w };
			}
		free(fill);
	}
	/* sort each row, merge duplicates (both directions listed the pair) */
	{
		uint64_t out = 0;

		for (uint32_t i = 0; i < n; i++) {
			uint64_t a = deg[i], b = deg[i + 1];

			g->xadj[i] = (idx_t)out;
			qsort(he + a, b - a, sizeof(*he), cmp_half_edge);
			for (uint64_t e = a; e < b; e++) {
				if (out > (uint64_t)g->xadj[i] &&
				    g->adjncy[out - 1] == (idx_t)he[e].to) {
					if (he[e].w > g->adjwgt[out - 1])
						g->adjwgt[out - 1] = he[e].w;
					continue;
				}
				g->adjncy[out] = (idx_t)he[e].to;
				g->adjwgt[out] = he[e].w;
				out++;
			}
		}
		g->xadj[n] = (idx_t)out;
		g->n_edges = out / 2;
	}
	rc = 0;
out:
	free(deg);
	free(he);
	if (rc)
		graph_free(g);
	return rc;
}

/* ---- exact group sizes ------------------------------------------------------ */

/*
 * METIS balances parts only to within its imbalance tolerance. Make every
 * part exactly its capacity: an overfull part gives up the members least
 * attached to it (smallest edge weight into the part), and each of those
 * goes to the part with room it is most attached to (the one with the most
 * room when it is attached to none). Returns the number of neurons moved.
 */
struct attach {
	uint32_t v;
	int64_t w;
};

static int cmp_attach(const void *a, const void *b)
{
	const struct attach *x = a, *y = b;

	if (x->w != y->w)
		return x->w < y->w ? -1 : 1;
	return x->v < y->v ? -1 : x->v > y->v;
}

static int repair_sizes(uint32_t n, uint32_t M, const struct graph *g, idx_t *part,
			const uint32_t *cap, uint32_t *moved)
{
	uint32_t *size = calloc(M, sizeof(*size)), n_ev = 0;
	uint32_t *ev = malloc((size_t)n * sizeof(*ev));
	struct attach *at = malloc((size_t)n * sizeof(*at));
	int64_t *acc = calloc(M, sizeof(*acc));
	uint32_t *touched = malloc((size_t)M * sizeof(*touched));
	int rc = -1;

	if (!size || !ev || !at || !acc || !touched)
		goto out;
	for (uint32_t i = 0; i < n; i++)
		size[part[i]]++;
	for (uint32_t p = 0; p < M; p++) {
		uint32_t na = 0;

		if (size[p] <= cap[p])
			continue;
		for (uint32_t i = 0; i < n; i++) {
			int64_t w = 0;

			if ((uint32_t)part[i] != p)
				continue;
			for (idx_t e = g->xadj[i]; e < g->xadj[i + 1]; e++)
				if (part[g->adjncy[e]] == (idx_t)p)
					w += g->adjwgt[e];
			at[na++] = (struct attach){ i, w };
		}
		qsort(at, na, sizeof(*at), cmp_attach);
		for (uint32_t q = 0; q < size[p] - cap[p]; q++) {
			ev[n_ev++] = at[q].v;
			part[at[q].v] = -1;
		}
		size[p] = cap[p];
	}
	for (uint32_t q = 0; q < n_ev; q++) {
		uint32_t v = ev[q], nt = 0, best = UINT32_MAX;

		for (idx_t e = g->xadj[v]; e < g->xadj[v + 1]; e++) {
			idx_t p = part[g->adjncy[e]];

			if (p < 0 || size[p] >= cap[p])
				continue;
			if (!acc[p])
				touched[nt++] = (uint32_t)p;
			acc[p] += g->adjwgt[e];
		}
		for (uint32_t t = 0; t < nt; t++)
			if (best == UINT32_MAX || acc[touched[t]] > acc[best] ||
			    (acc[touched[t]] == acc[best] && touched[t] < best))
				best = touched[t];
		for (uint32_t t = 0; t < nt; t++)
			acc[touched[t]] = 0;
		for (uint32_t p = 0; best == UINT32_MAX && p < M; p++)
			if (size[p] < cap[p])
				best = p;
		for (uint32_t p = 0; !nt && p < M; p++) /* attached to none: the most room */
			if (size[p] < cap[p] && cap[p] - size[p] > cap[best] - size[best])
				best = p;
		part[v] = (idx_t)best;
		size[best]++;
	}
	*moved = n_ev;
	rc = 0;
out:
	free(size);
	free(ev);
	free(at);
	free(acc);
	free(touched);
	return rc;
}

/* ---- ordering ----------------------------------------------------------------- */

struct order_key {
	uint32_t id;
	double f;
};

static int cmp_order_key(const void *a, const void *b)
{
	const struct order_key *x = a, *y = b;

	if (x->f != y->f)
		return x->f > y->f ? -1 : 1;
	return x->id < y->id ? -1 : x->id > y->id;
}

/*
 * part[i] in [0, M) with exact sizes; `last` is the part that goes last
 * (the short one, or M when all are full). Groups by mean frequency, then
 * neurons by frequency, both descending.
 */
static int order_groups(const struct hyb_profile *p, uint32_t layer, uint32_t M, uint32_t gs,
			const idx_t *part, uint32_t last, int32_t *perm)
{
	const uint32_t n = p->n_ff;
	const uint64_t *cnt = p->layers[layer].count;
	struct order_key *g = calloc(M, sizeof(*g));
	struct order_key *nk = malloc((size_t)n * sizeof(*nk));
	uint32_t *gsize = calloc(M, sizeof(*gsize)), *start = calloc((size_t)M + 1, sizeof(*start));
	uint32_t *rank = malloc((size_t)M * sizeof(*rank));
	int rc = -1;

	if (!g || !nk || !gsize || !start || !rank)
		goto out;
	for (uint32_t q = 0; q < M; q++)
		g[q].id = q;
	for (uint32_t i = 0; i < n; i++) {
		g[part[i]].f += (double)cnt[i];
		gsize[part[i]]++;
	}
	for (uint32_t q = 0; q < M; q++) {
		/* the format's groups are exact: GS each, n_ff % GS for the last */
		if (gsize[q] != (q == last ? n % gs : gs)) {
			rc = -2;
			goto out;
		}
		g[q].f = q == last ? -1.0 : g[q].f / gsize[q];
	}
	qsort(g, M, sizeof(*g), cmp_order_key);
	for (uint32_t r = 0; r < M; r++) {
		rank[g[r].id] = r;
		start[r + 1] = start[r] + gsize[g[r].id];
	}
	/* neurons sorted by (group rank, count desc, index) */
	for (uint32_t i = 0; i < n; i++)
		nk[i] = (struct order_key){ i, (double)cnt[i] };
	qsort(nk, n, sizeof(*nk), cmp_order_key);
	{
		uint32_t *fill = calloc(M, sizeof(*fill));

		if (!fill)
			goto out;
		for (uint32_t q = 0; q < n; q++) {
			uint32_t i = nk[q].id, r = rank[part[i]];

			perm[start[r] + fill[r]++] = (int32_t)i;
		}
		free(fill);
	}
	rc = 0;
out:
	free(g);
	free(nk);
	free(gsize);
	free(start);
	free(rank);
	return rc;
}

/* ---- METIS ---------------------------------------------------------------------- */

static const struct {
	bool kway;
	idx_t ufactor;
} variants[] = {
	{ false, 1 },  /* recursive bisection, 0.1% imbalance per cut */
	{ true, 30 },  /* k-way, METIS's default 3% */
	{ false, 30 },
};

#define N_VARIANTS ((int)(sizeof(variants) / sizeof(variants[0])))

const char *hyb_plan_group_variant_name(int v)
{
	static const char *names[] = { "recursive/1.001", "kway/1.03", "recursive/1.03" };

	return v >= 0 && v < N_VARIANTS ? names[v] : "none";
}

/* One METIS try on the graph, with the buffers it works in and what it yields. */
struct metis_try {
	const struct graph *g;
	uint32_t n, M, gs;
	idx_t *part;            /* [n] */
	uint32_t *size, *cap;   /* [M] */
	uint32_t small;         /* the part that takes the short group, when GS does not divide n */
	uint32_t moved;         /* neurons repair_sizes moved */
	int64_t inside;         /* edge weight inside parts after the repair */
};

/*
 * Partition with METIS setting v, then make the sizes exact (KAIROX 5.2
 * wants groups of exactly GS): capacities GS each, the short remainder for
 * the smallest METIS part, which disturbs the fewest neurons. 0, or -1 with
 * a reason.
 */
static int metis_try(struct metis_try *t, int v, uint64_t seed, uint32_t layer, char *err,
		     size_t errlen)
{
	const struct graph *g = t->g;
	idx_t nv = (idx_t)t->n, ncon = 1, np = (idx_t)t->M, cut = 0;
	idx_t opts[METIS_NOPTIONS];
	int mrc;

	METIS_SetDefaultOptions(opts);
	opts[METIS_OPTION_SEED] = (idx_t)(seed & 0x7fffffff);
	opts[METIS_OPTION_UFACTOR] = variants[v].ufactor;
	opts[METIS_OPTION_NUMBERING] = 0;
	mrc = (variants[v].kway ? METIS_PartGraphKway : METIS_PartGraphRecursive)(
		&nv, &ncon, g->xadj, g->adjncy, NULL, NULL, g->adjwgt, &np, NULL, NULL, opts, &cut,
		t->part);
	if (mrc != METIS_OK) {
		snprintf(err, errlen, "METIS failed on layer %u (code %d)", layer, mrc);
		return mrc == METIS_ERROR_MEMORY ? -ENOMEM :
		       mrc == METIS_ERROR_INPUT ? -EINVAL : -EIO;
	}
	memset(t->size, 0, (size_t)t->M * sizeof(*t->size));
	for (uint32_t i = 0; i < t->n; i++)
		t->size[t->part[i]]++;
	t->small = 0;
	for (uint32_t q = 0; q < t->M; q++) {
		t->cap[q] = t->gs;
		if (t->size[q] < t->size[t->small])
			t->small = q;
	}
	if (t->n % t->gs)
		t->cap[t->small] = t->n % t->gs;
	t->moved = 0;
	if (repair_sizes(t->n, t->M, g, t->part, t->cap, &t->moved)) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	t->inside = 0;
	for (uint32_t i = 0; i < t->n; i++)
		for (idx_t e = g->xadj[i]; e < g->xadj[i + 1]; e++)
			if (t->part[g->adjncy[e]] == t->part[i])
				t->inside += g->adjwgt[e];
	return 0;
}

/*
 * Exact-size groups of co-activated neurons (KAIROX 5.2): the top-k
 * Jaccard graph of the sampled columns, partitioned by METIS under a few
 * settings, keeping the repaired partition with the most weight inside.
 */
static int metis_parts(const struct hyb_profile *p, uint32_t layer,
		       const struct hyb_plan_group_opts *o, uint32_t M, uint32_t gs, idx_t *part,
		       uint32_t *last, struct hyb_plan_group_info *info, char *err, size_t errlen)
{
	const uint32_t n = p->n_ff, k = o->top_k ? o->top_k : 32;
	const uint32_t max_s = o->max_samples ? o->max_samples : 16384;
	const uint32_t S = p->n_samples < max_s ? p->n_samples : max_s;
	const uint32_t W = (S + 63) / 64;
	uint64_t *cols = calloc((size_t)n * (W ? W : 1), sizeof(*cols));
	uint32_t *cnt = calloc(n, sizeof(*cnt)), *live = malloc((size_t)n * sizeof(*live));
	uint32_t *nbr = malloc((size_t)n * k * sizeof(*nbr)), n_live;
	float *sim = malloc((size_t)n * k * sizeof(*sim));
	struct graph g = { 0 };
	struct metis_try t = { .g = &g, .n = n, .M = M, .gs = gs, .part = part };
	idx_t *best = NULL;
	int64_t best_inside = 0;
	int rc = -ENOMEM;

	if (!cols || !cnt || !live || !nbr || !sim) {
		snprintf(err, errlen, "out of memory building the co-activation graph");
		goto out;
	}
	sample_columns(p, layer, S, W, cols);
	n_live = live_neurons(cols, n, W, cnt, live);
	for (size_t q = 0; q < (size_t)n * k; q++)
		nbr[q] = UINT32_MAX;
	{
		struct knn_job j = { .cols = cols, .W = W, .k = k, .n_live = n_live, .cnt = cnt,
				     .live = live, .nbr = nbr, .sim = sim,
				     .nth = o->pool ? hyb_threadpool_size(o->pool) : 1 };

		if (knn_lists(&j, o->pool)) {
			snprintf(err, errlen, "out of memory building the co-activation graph");
			goto out;
		}
	}
	free(cols);
	cols = NULL;
	if (build_csr(n, k, nbr, sim, &g)) {
		snprintf(err, errlen, "out of memory building the co-activation graph");
		goto out;
	}
	info->edges = g.n_edges;
	best = malloc((size_t)n * sizeof(*best));
	t.size = malloc((size_t)M * sizeof(*t.size));
	t.cap = malloc((size_t)M * sizeof(*t.cap));
	if (!best || !t.size || !t.cap) {
		snprintf(err, errlen, "out of memory");
		goto out;
	}
	/*
	 * METIS balances parts to within UFACTOR; tight k-way balance (1.001)
	 * cuts far worse than recursive bisection on small parts, and neither
	 * wins everywhere, so try a few settings and keep the partition whose
	 * exact-size repair keeps the most edge weight inside groups.
	 */
	for (int v = 0; v < N_VARIANTS; v++) {
		int r = metis_try(&t, v, o->seed, layer, err, errlen);

		if (r) {
			rc = r;
			goto out;
		}
		if (v == 0 || t.inside > best_inside) {
			best_inside = t.inside;
			memcpy(best, part, (size_t)n * sizeof(*best));
			*last = n % gs ? t.small : M;
			info->moved = t.moved;
			info->variant = v;
		}
	}
	memcpy(part, best, (size_t)n * sizeof(*best));
	rc = 0;
out:
	free(cols);
	free(cnt);
	free(live);
	free(nbr);
	free(sim);
	free(t.cap);
	free(best);
	free(t.size);
	graph_free(&g);
	return rc;
}

int hyb_plan_group_layer(const struct hyb_profile *p, uint32_t layer, enum hyb_plan_grouping how,
		     const struct hyb_plan_group_opts *o, int32_t *perm, struct hyb_plan_group_info *info,
		     char *err, size_t errlen)
{
	const uint32_t n = p->n_ff, gs = o->group_size;
	struct hyb_plan_group_info dummy;
	uint32_t M, last;
	idx_t *part;
	double t0 = now_s();
	int rc;

	if (!info)
		info = &dummy;
	memset(info, 0, sizeof(*info));
	info->variant = -1;
	if (!gs || gs > n || layer >= p->n_layer) {
		snprintf(err, errlen, "bad group size %u for %u neurons", gs, n);
		return -EINVAL;
	}
	M = (n + gs - 1) / gs;
	last = n % gs ? M - 1 : M;
	part = malloc((size_t)n * sizeof(*part));
	if (!part) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	if (how == HYB_PLAN_GROUP_METIS && M > 1 && gs > 1 && p->n_samples > 0) {
		rc = metis_parts(p, layer, o, M, gs, part, &last, info, err, errlen);
		if (rc)
			goto out;
	} else if (how == HYB_PLAN_GROUP_RANDOM) {
		uint32_t *rp = malloc((size_t)n * sizeof(*rp));

		if (!rp) {
			snprintf(err, errlen, "out of memory");
			rc = -ENOMEM;
			goto out;
		}
		for (uint32_t i = 0; i < n; i++)
			rp[i] = i;
		shuffle_u32(rp, n, o->seed + layer);
		for (uint32_t i = 0; i < n; i++)
			part[rp[i]] = (idx_t)(i / gs);
		free(rp);
	} else {
		for (uint32_t i = 0; i < n; i++)
			part[i] = (idx_t)(i / gs);
	}
	rc = order_groups(p, layer, M, gs, part, last, perm);
	if (rc) {
		if (rc == -2)
			snprintf(err, errlen, "layer %u: group sizes not exact (internal)", layer);
		else
			snprintf(err, errlen, "out of memory");
		rc = rc == -2 ? -EINVAL : -ENOMEM;
		goto out;
	}
	info->seconds = now_s() - t0;
	rc = 0;
out:
	free(part);
	return rc;
}

void hyb_plan_group_quality(const struct hyb_profile *p, uint32_t layer, const int32_t *perm,
			uint32_t group_size, struct hyb_plan_group_quality *q)
{
	const uint32_t n = p->n_ff, M = (n + group_size - 1) / group_size;
	uint32_t *grp = malloc((size_t)n * sizeof(*grp)), *k = calloc(M, sizeof(*k));
	uint32_t *touched = malloc((size_t)M * sizeof(*touched));
	double pairs = 0, inside = 0, groups = 0, neurons = 0;

	memset(q, 0, sizeof(*q));
	if (!grp || !k || !touched || !p->n_samples)
		goto out;
	for (uint32_t i = 0; i < n; i++)
		grp[perm[i]] = i / group_size;
	for (uint32_t s = 0; s < p->n_samples; s++) {
		const uint64_t *a = p->layers[layer].active + (size_t)s * p->active_words;
		uint32_t nt = 0, na = 0;

		for (uint32_t w = 0; w < p->active_words; w++)
			for (uint64_t bits = a[w]; bits; bits &= bits - 1) {
				uint32_t i = w * 64 + (uint32_t)__builtin_ctzll(bits), g;

				if (i >= n)
					continue;
				g = grp[i];
				if (!k[g]++)
					touched[nt++] = g;
				na++;
			}
		for (uint32_t t = 0; t < nt; t++) {
			inside += 0.5 * k[touched[t]] * (k[touched[t]] - 1.0);
			k[touched[t]] = 0;
		}
		pairs += 0.5 * na * (na - 1.0);
		groups += nt;
		neurons += na;
	}
	q->inside = pairs > 0 ? inside / pairs : 0;
	q->active_groups = groups / p->n_samples;
	q->active_neurons = neurons / p->n_samples;
out:
	free(grp);
	free(k);
	free(touched);
}
