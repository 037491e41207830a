// SPDX-License-Identifier: MIT
/*
 * Initial placement of neuron groups (PowerInfer 6.2-6.3).
 *
 * The ILP: maximise the impact on the GPU, sum of a_GPU,n * v_n with v_n = f_n
 * (eq. 1-2), under the memory constraint (eq. 6; we allow equality: a budget
 * is a budget) and, per layer, either no neuron on the GPU or at least C_l
 * (eq. 7-8). C_l comes from the communication constraint (eq. 4)
 *     C_l * T_GPU + T_sync <= C_l * T_CPU,  T_j = M_neuron / Bandwidth_j (eq. 5)
 * so C_l = ceil(T_sync / (M/BW_CPU - M/BW_GPU)): a split layer pays one
 * synchronisation, which the GPU's share must earn back. PowerInfer gives no
 * values; ours are flags of `hybctl plan`. Like PowerInfer's 64-neuron
 * batches (6.3.3) the unit here is a group, so C_l is rounded up to groups.
 *
 * Solvers: a greedy on impact per byte in which a layer enters with its best
 * min_groups groups at once, and an exact branch and bound over layers. In a
 * layer every group has the same size except the short last one, so among
 * same-size groups an optimal solution takes the most valuable ones; a layer's
 * choice is then just (full groups taken, short group taken), and the bound is
 * the LP relaxation (fractional knapsack) of the layers not yet decided.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "plan_internal.h"

uint32_t hyb_plan_min_neurons(const struct hyb_plan_sync_model *s, uint64_t neuron_bytes, uint32_t n_ff)
{
	double t_cpu = (double)neuron_bytes / s->bw_cpu, t_gpu = (double)neuron_bytes / s->bw_gpu;
	double c;

	if (!(s->t_sync > 0))
		return 1;
	if (!(t_cpu > t_gpu)) /* the GPU never earns a sync back: whole layers only */
		return n_ff;
	c = ceil(s->t_sync / (t_cpu - t_gpu));
	if (c < 1)
		return 1;
	return c > n_ff ? n_ff : (uint32_t)c;
}

struct item {
	double v;
	uint64_t b;
	uint32_t g;
};

/* impact per byte, descending; ties by value, then index */
static int cmp_ratio(const void *pa, const void *pb)
{
	const struct item *a = pa, *b = pb;
	double x = a->v * (double)b->b, y = b->v * (double)a->b;

	if (x != y)
		return x > y ? -1 : 1;
	if (a->v != b->v)
		return a->v > b->v ? -1 : 1;
	return a->g < b->g ? -1 : a->g > b->g;
}

static uint32_t min_of(const struct hyb_plan_place_layer *L)
{
	uint32_t m = L->min_groups ? L->min_groups : 1;

	return m > L->n ? L->n : m;
}

/* The LP relaxation: a fractional knapsack over every group, no per-layer minimum. */
static double lp_root(const struct hyb_plan_place_layer *L, uint32_t n_layer, uint64_t budget)
{
	uint64_t total = 0, left = budget;
	struct item *all;
	double v = 0;
	size_t k = 0;

	for (uint32_t l = 0; l < n_layer; l++)
		total += L[l].n;
	all = malloc((total ? total : 1) * sizeof(*all));
	if (!all)
		return NAN;
	for (uint32_t l = 0; l < n_layer; l++)
		for (uint32_t g = 0; g < L[l].n; g++)
			all[k++] = (struct item){ L[l].value[g], L[l].bytes[g], g };
	qsort(all, k, sizeof(*all), cmp_ratio);
	for (size_t q = 0; q < k; q++) {
		if (all[q].b <= left) {
			v += all[q].v;
			left -= all[q].b;
			continue;
		}
		v += all[q].v * (double)left / (double)all[q].b;
		break;
	}
	free(all);
	return v;
}

static void result_of(const struct hyb_plan_place_layer *L, uint32_t n_layer, int8_t *const *gpu,
		      struct hyb_plan_place_result *r)
{
	r->value = 0;
	r->bytes = 0;
	for (uint32_t l = 0; l < n_layer; l++)
		for (uint32_t g = 0; g < L[l].n; g++)
			if (gpu[l][g]) {
				r->value += L[l].value[g];
				r->bytes += L[l].bytes[g];
			}
}

/* The greedy's state: per layer its groups by impact per byte, and how far it has taken them. */
struct greedy {
	const struct hyb_plan_place_layer *L;
	uint32_t n_layer;
	uint64_t left;         /* budget not yet spent */
	struct item **ord;     /* [l]: groups, best impact per byte first */
	uint32_t *ptr;         /* [l]: groups taken */
	uint8_t *open, *dead;  /* [l]: has entered; can take nothing more */
	uint32_t *short_in;    /* [l]: index in ord of the one smaller group, UINT32_MAX: none */
};

static int greedy_setup(struct greedy *G, int8_t *const *gpu)
{
	const uint32_t n = G->n_layer ? G->n_layer : 1;

	G->ord = calloc(n, sizeof(*G->ord));
	G->ptr = calloc(n, sizeof(*G->ptr));
	G->open = calloc(n, 1);
	G->dead = calloc(n, 1);
	G->short_in = calloc(n, sizeof(*G->short_in));
	if (!G->ord || !G->ptr || !G->open || !G->dead || !G->short_in)
		return -1;
	for (uint32_t l = 0; l < G->n_layer; l++) {
		const struct hyb_plan_place_layer *L = &G->L[l];
		uint32_t lo = 0, hi = 0;

		memset(gpu[l], 0, L->n);
		G->ord[l] = malloc((L->n ? L->n : 1) * sizeof(**G->ord));
		if (!G->ord[l])
			return -1;
		for (uint32_t g = 0; g < L->n; g++)
			G->ord[l][g] = (struct item){ L->value[g], L->bytes[g], g };
		qsort(G->ord[l], L->n, sizeof(**G->ord), cmp_ratio);
		G->dead[l] = L->n == 0;
		/* the one group smaller than the others, if any (the short last group) */
		G->short_in[l] = UINT32_MAX;
		for (uint32_t q = 1; q < L->n; q++) {
			if (G->ord[l][q].b < G->ord[l][lo].b)
				lo = q;
			if (G->ord[l][q].b > G->ord[l][hi].b)
				hi = q;
		}
		if (L->n && G->ord[l][lo].b < G->ord[l][hi].b)
			G->short_in[l] = lo;
	}
	return 0;
}

static void greedy_free(struct greedy *G)
{
	for (uint32_t l = 0; G->ord && l < G->n_layer; l++)
		free(G->ord[l]);
	free(G->ord);
	free(G->ptr);
	free(G->open);
	free(G->dead);
	free(G->short_in);
}

/*
 * What layer l would take next, value v for b bytes: a closed layer its
 * best min_groups groups at once (the short group in for a full one when
 * that fits and they do not), an open one its next group that fits.
 * false when nothing of it fits any more (it is then dead).
 */
static bool greedy_offer(struct greedy *G, uint32_t l, double *v, uint64_t *b)
{
	const struct hyb_plan_place_layer *L = &G->L[l];
	const struct item *ord = G->ord[l];

	*v = 0;
	*b = 0;
	if (!G->open[l]) {
		for (uint32_t q = 0; q < min_of(L); q++) {
			*v += ord[q].v;
			*b += ord[q].b;
		}
		if (*b > G->left && G->short_in[l] != UINT32_MAX &&
		    G->short_in[l] >= min_of(L)) {
			const struct item *sh = &ord[G->short_in[l]];
			uint32_t last = min_of(L) - 1;

			*v += sh->v - ord[last].v;
			*b += sh->b - ord[last].b;
		}
	} else {
		/* the budget only shrinks: a group that does not fit never will */
		while (G->ptr[l] < L->n && ord[G->ptr[l]].b > G->left)
			G->ptr[l]++;
		if (G->ptr[l] == L->n)
			return false;
		*v = ord[G->ptr[l]].v;
		*b = ord[G->ptr[l]].b;
	}
	return *b <= G->left;
}

/* Layer l takes what greedy_offer offered. */
static void greedy_take(struct greedy *G, uint32_t l, int8_t *const *gpu)
{
	struct item *ord = G->ord[l];

	if (!G->open[l]) {
		uint32_t m = min_of(&G->L[l]), sh = G->short_in[l];
		uint64_t b = 0;

		for (uint32_t q = 0; q < m; q++)
			b += ord[q].b;
		if (b > G->left && sh != UINT32_MAX && sh >= m) {
			/* the short group replaces the m-th: move it into the block */
			struct item t = ord[sh];

			memmove(&ord[m], &ord[m - 1], (sh - m + 1) * sizeof(struct item));
			ord[m - 1] = t;
		}
		for (uint32_t q = 0; q < m; q++) {
			gpu[l][ord[q].g] = 1;
			G->left -= ord[q].b;
		}
		G->ptr[l] = m;
		G->open[l] = 1;
	} else {
		gpu[l][ord[G->ptr[l]].g] = 1;
		G->left -= ord[G->ptr[l]].b;
		G->ptr[l]++;
	}
	if (G->ptr[l] == G->L[l].n)
		G->dead[l] = 1;
}

int hyb_plan_place_greedy(const struct hyb_plan_place_layer *L, uint32_t n_layer, uint64_t budget,
		      int8_t *const *gpu, struct hyb_plan_place_result *r)
{
	struct greedy G = { .L = L, .n_layer = n_layer, .left = budget };
	int rc = -1;

	memset(r, 0, sizeof(*r));
	if (greedy_setup(&G, gpu))
		goto out;
	for (;;) {
		int best = -1;
		double bv = 0, bb = 1;

		for (uint32_t l = 0; l < n_layer; l++) {
			double v;
			uint64_t b;

			if (G.dead[l])
				continue;
			if (!greedy_offer(&G, l, &v, &b)) {
				G.dead[l] = 1;
				continue;
			}
			if (best < 0 || v * bb > bv * (double)b) {
				best = (int)l;
				bv = v;
				bb = (double)b;
			}
		}
		if (best < 0)
			break;
		greedy_take(&G, (uint32_t)best, gpu);
	}
	result_of(L, n_layer, gpu, r);
	r->bound = lp_root(L, n_layer, budget);
	rc = 0;
out:
	greedy_free(&G);
	return rc;
}

/* ---- branch and bound ------------------------------------------------------- */

struct bb_layer {
	uint32_t id;            /* index into the caller's layers */
	uint32_t n[2];          /* groups of each size class */
	uint64_t b[2];          /* bytes of a group of the class */
	double *pre[2];         /* prefix sums of values, most valuable first [n+1] */
	uint32_t *idx[2];       /* the class's groups, most valuable first */
	uint32_t m;             /* min groups when any */
	double best_ratio;
};

struct bb_opt {
	double ub, v;
	uint64_t b;
	uint32_t a0, a1;
};

struct bb {
	struct bb_layer *ly;
	uint32_t n_layer;
	/* suffix d: the items of layers d.. by ratio, cumulative bytes/values */
	uint64_t **cb;
	double **cv, **ratio;
	uint32_t *cn;
	struct bb_opt **opts;   /* per depth */
	uint32_t *cur0, *cur1, *best0, *best1;
	double best;
	uint64_t nodes, max_nodes;
	bool stopped;
};

static double lp_bound(const struct bb *s, uint32_t d, uint64_t left)
{
	const uint64_t *cb = s->cb[d];
	uint32_t lo = 0, hi = s->cn[d];

	/* largest t with cb[t] <= left */
	while (lo < hi) {
		uint32_t mid = (lo + hi + 1) / 2;

		if (cb[mid] <= left)
			lo = mid;
		else
			hi = mid - 1;
	}
	if (lo == s->cn[d])
		return s->cv[d][lo];
	return s->cv[d][lo] + (double)(left - cb[lo]) * s->ratio[d][lo];
}

static int cmp_opt(const void *pa, const void *pb)
{
	const struct bb_opt *a = pa, *b = pb;

	if (a->ub != b->ub)
		return a->ub > b->ub ? -1 : 1;
	return a->v > b->v ? -1 : a->v < b->v;
}

static void bb_dfs(struct bb *s, uint32_t d, uint64_t left, double v)
{
	const struct bb_layer *ly;
	struct bb_opt *op;
	uint32_t n_op = 0;
	const double eps = 1e-12 * (1.0 + fabs(s->best));

	if (s->stopped)
		return;
	if (++s->nodes > s->max_nodes) {
		s->stopped = true;
		return;
	}
	if (d == s->n_layer) {
		if (v > s->best + eps) {
			s->best = v;
			memcpy(s->best0, s->cur0, s->n_layer * sizeof(*s->cur0));
			memcpy(s->best1, s->cur1, s->n_layer * sizeof(*s->cur1));
		}
		return;
	}
	ly = &s->ly[d];
	op = s->opts[d];
	for (uint32_t a0 = 0; a0 <= ly->n[0]; a0++) {
		for (uint32_t a1 = 0; a1 <= ly->n[1]; a1++) {
			uint32_t k = a0 + a1;
			uint64_t b = a0 * ly->b[0] + a1 * ly->b[1];
			double val;

			if ((k && k < ly->m) || b > left)
				continue;
			val = ly->pre[0][a0] + ly->pre[1][a1];
			op[n_op] = (struct bb_opt){ 0, val, b, a0, a1 };
			op[n_op++].ub = v + val + lp_bound(s, d + 1, left - b);
		}
	}
	qsort(op, n_op, sizeof(*op), cmp_opt);
	for (uint32_t q = 0; q < n_op && !s->stopped; q++) {
		if (op[q].ub <= s->best + eps)
			break;
		s->cur0[d] = op[q].a0;
		s->cur1[d] = op[q].a1;
		bb_dfs(s, d + 1, left - op[q].b, v + op[q].v);
		/* opts[d] is this depth's own array: later entries are intact */
	}
}

static int cmp_desc_value(const void *pa, const void *pb)
{
	const struct item *a = pa, *b = pb;

	if (a->v != b->v)
		return a->v > b->v ? -1 : 1;
	return a->g < b->g ? -1 : a->g > b->g;
}

static int cmp_layer_ratio(const void *pa, const void *pb)
{
	const struct bb_layer *a = pa, *b = pb;

	if (a->best_ratio != b->best_ratio)
		return a->best_ratio > b->best_ratio ? -1 : 1;
	return a->id < b->id ? -1 : a->id > b->id;
}

static void bb_free(struct bb *s)
{
	for (uint32_t l = 0; s->ly && l < s->n_layer; l++)
		for (int c = 0; c < 2; c++) {
			free(s->ly[l].pre[c]);
			free(s->ly[l].idx[c]);
		}
	for (uint32_t d = 0; s->cb && d <= s->n_layer; d++) {
		free(s->cb[d]);
		free(s->cv[d]);
		free(s->ratio[d]);
		if (d < s->n_layer)
			free(s->opts[d]);
	}
	free(s->ly);
	free(s->cb);
	free(s->cv);
	free(s->ratio);
	free(s->cn);
	free(s->opts);
	free(s->cur0);
	free(s->cur1);
	free(s->best0);
	free(s->best1);
}

/*
 * The LP bounds' suffix lists: for each depth d, every group of the layers
 * from d on (in the search's layer order) by value per byte, with prefix
 * sums of bytes and values.
 */
static int bb_suffixes(struct bb *s, const struct hyb_plan_place_layer *L, uint32_t n_layer,
		       uint32_t total)
{
	struct item *all = malloc((total ? total : 1) * sizeof(*all));

	if (!all)
		return -1;
	for (uint32_t d = 0; d <= n_layer; d++) {
		uint32_t k = 0;

		for (uint32_t e = d; e < n_layer; e++) {
			const struct hyb_plan_place_layer *src = &L[s->ly[e].id];

			for (uint32_t g = 0; g < src->n; g++)
				all[k++] = (struct item){ src->value[g], src->bytes[g], g };
		}
		qsort(all, k, sizeof(*all), cmp_ratio);
		s->cn[d] = k;
		s->cb[d] = malloc(((size_t)k + 1) * sizeof(uint64_t));
		s->cv[d] = malloc(((size_t)k + 1) * sizeof(double));
		s->ratio[d] = malloc(((size_t)k + 1) * sizeof(double));
		if (!s->cb[d] || !s->cv[d] || !s->ratio[d]) {
			free(all);
			return -1;
		}
		s->cb[d][0] = 0;
		s->cv[d][0] = 0;
		for (uint32_t q = 0; q < k; q++) {
			s->cb[d][q + 1] = s->cb[d][q] + all[q].b;
			s->cv[d][q + 1] = s->cv[d][q] + all[q].v;
			s->ratio[d][q] = all[q].v / (double)all[q].b;
		}
		s->ratio[d][k] = 0;
	}
	free(all);
	return 0;
}

/* 1: a layer has more than two group sizes (not this solver's structure); -1: no memory */
static int bb_setup(struct bb *s, const struct hyb_plan_place_layer *L, uint32_t n_layer)
{
	const size_t nl = n_layer ? n_layer : 1;
	uint64_t total = 0;

	s->n_layer = n_layer;
	s->ly = calloc(nl, sizeof(*s->ly));
	s->cb = calloc(nl + 1, sizeof(*s->cb));
	s->cv = calloc(nl + 1, sizeof(*s->cv));
	s->ratio = calloc(nl + 1, sizeof(*s->ratio));
	s->cn = calloc(nl + 1, sizeof(*s->cn));
	s->opts = calloc(nl, sizeof(*s->opts));
	s->cur0 = calloc(nl, sizeof(uint32_t));
	s->cur1 = calloc(nl, sizeof(uint32_t));
	s->best0 = calloc(nl, sizeof(uint32_t));
	s->best1 = calloc(nl, sizeof(uint32_t));
	if (!s->ly || !s->cb || !s->cv || !s->ratio || !s->cn || !s->opts || !s->cur0 ||
	    !s->cur1 || !s->best0 || !s->best1)
		return -1;
	for (uint32_t l = 0; l < n_layer; l++) {
		struct bb_layer *y = &s->ly[l];
		struct item *it = malloc((L[l].n ? L[l].n : 1) * sizeof(*it));

		if (!it)
			return -1;
		y->id = l;
		y->m = min_of(&L[l]);
		for (uint32_t g = 0; g < L[l].n; g++) {
			uint64_t b = L[l].bytes[g];
			double r = L[l].value[g] / (double)b;

			if (!y->n[0] || b == y->b[0]) {
				y->b[0] = b;
				y->n[0]++;
			} else if (!y->n[1] || b == y->b[1]) {
				y->b[1] = b;
				y->n[1]++;
			} else {
				free(it);
				return 1;
			}
			if (r > y->best_ratio)
				y->best_ratio = r;
		}
		for (int c = 0; c < 2; c++) {
			uint32_t k = 0;

			y->pre[c] = calloc(y->n[c] + 1, sizeof(double));
			y->idx[c] = malloc((y->n[c] + 1) * sizeof(uint32_t));
			if (!y->pre[c] || !y->idx[c]) {
				free(it);
				return -1;
			}
			for (uint32_t g = 0; g < L[l].n; g++)
				if (L[l].bytes[g] == y->b[c] && (c == 0 || y->b[1] != y->b[0]))
					it[k++] = (struct item){ L[l].value[g], y->b[c], g };
			qsort(it, k, sizeof(*it), cmp_desc_value);
			for (uint32_t q = 0; q < k; q++) {
				y->idx[c][q] = it[q].g;
				y->pre[c][q + 1] = y->pre[c][q] + it[q].v;
			}
		}
		free(it);
		total += L[l].n;
	}
	qsort(s->ly, n_layer, sizeof(*s->ly), cmp_layer_ratio);
	for (uint32_t d = 0; d < n_layer; d++) {
		s->opts[d] = malloc((size_t)(s->ly[d].n[0] + 1) * (s->ly[d].n[1] + 1) *
				    sizeof(struct bb_opt));
		if (!s->opts[d])
			return -1;
	}
	return bb_suffixes(s, L, n_layer, total);
}

int hyb_plan_place_solve(const struct hyb_plan_place_layer *L, uint32_t n_layer, uint64_t budget,
		     uint64_t max_nodes, int8_t *const *gpu, struct hyb_plan_place_result *r)
{
	struct bb s = { 0 };
	uint64_t total = 0;
	int rc;

	if (hyb_plan_place_greedy(L, n_layer, budget, gpu, r))
		return -1;
	for (uint32_t l = 0; l < n_layer; l++)
		total += L[l].n;
	/* the suffix lists hold n_layer * groups entries of 24 bytes: no search past ~100 MB */
	if ((uint64_t)(n_layer + 1) * total > (4u << 20))
		return 0;
	rc = bb_setup(&s, L, n_layer);
	if (rc) {
		bb_free(&s);
		return rc < 0 ? -1 : 0;
	}
	r->bound = lp_bound(&s, 0, budget);
	s.best = r->value;
	s.max_nodes = max_nodes;
	bb_dfs(&s, 0, budget, 0);
	r->nodes = s.nodes;
	r->optimal = !s.stopped;
	if (s.best > r->value + 1e-12 * (1.0 + fabs(r->value))) {
		for (uint32_t d = 0; d < n_layer; d++) {
			const struct bb_layer *y = &s.ly[d];

			memset(gpu[y->id], 0, L[y->id].n);
			for (uint32_t q = 0; q < s.best0[d]; q++)
				gpu[y->id][y->idx[0][q]] = 1;
			for (uint32_t q = 0; q < s.best1[d]; q++)
				gpu[y->id][y->idx[1][q]] = 1;
		}
		result_of(L, n_layer, gpu, r);
	}
	bb_free(&s);
	return 0;
}
