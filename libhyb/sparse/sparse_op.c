// SPDX-License-Identifier: MIT
/*
 * The threaded sparse FFN operator (sparse/sparse_op.h) and the bundle builder.
 *
 * PowerInfer §5.4 splits the neurons "into small batches across multiple
 * cores; each core checks activations and computes only the active
 * neurons of its batch". Here a batch is a unit of consecutive listed
 * neurons (bundle order) taken from a shared counter, so threads are
 * balanced by listed work, not by bundles, and a thread the OS delays
 * leaves its units to the others. Each unit adds into its own partial y,
 * and one reduction sums the partials in unit order. The units depend on
 * the list alone (at most UNITS of them, whole chunks each), so which
 * thread ran which unit changes nothing: every call with the same list
 * gives the same bits, with any number of threads (docs/DETERMINISM.md).
 *
 * A thread cuts its neurons into chunks of HYB_SPARSE_MAX_ROWS (across
 * groups and units) and runs each chunk in three kernel calls: gate dots;
 * for the ReLU family only the neurons whose gate is > 0 go on (exact: h
 * is 0 for the others); up dots; h; the down axpy for h != 0. Row pointers
 * go to the kernels as lists, so their prefetch runs ahead across neurons
 * (scattered rows give the hardware prefetcher no stream), and every call
 * passes the first rows of the next call as look-ahead, so that none
 * starts on rows still in DRAM. Nothing else is touched: no dense copy,
 * no conversion of the weights.
 */
#include "sparse_op.h"

#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "forward/ops.h"
#include "sparse_ffn_kernels.h"

#define CH HYB_SPARSE_MAX_ROWS
/* Work units of a call at most: enough for a few threads to balance, few
 * enough that their partial outputs stay in L2 and their sum costs little. */
#define UNITS 16

/* per thread counters, a cache line each */
struct tslot {
	uint64_t n_gate, n_up, n_nz;
	uint64_t pad[5];
};

struct hyb_sparse_ffn_ctx {
	uint32_t n_embd, n_ff;
	int n_threads;
	const struct hyb_cpu_kernels *ck;
	const struct hyb_sparse_kernels *sk;
	void *xbuf;       /* xn prepared for the dots */
	float *ypart;     /* partial y of units 1..UNITS-1 (unit 0 adds into y) */
	float *h;         /* [n_ff] hyb_sparse_ffn_pi: h, then its coefficients */
	void *hq;         /* h in the down rows' dot type */
	uint32_t *nz;     /* [n_ff] neurons whose coefficient is not 0 */
	size_t ystride;   /* floats between two partials, a multiple of 16 */
	uint32_t *gstart; /* [n_ff + 1] first position in the active list of group g */
	uint64_t *cum;    /* [n_ff + 1] listed neurons of present groups before group g */
	struct tslot *slot;
	char err[160];
};

/* What a pass computes (hyb_sparse_ffn_pi runs MODE_H, then MODE_DOWN). */
enum pass_mode {
	MODE_FUSED, /* gate, up, h, down: y */
	MODE_H,     /* gate, up: h of each listed neuron into hout[neuron] */
	MODE_DOWN,  /* down rows only, each listed neuron's coefficient coef[neuron]: y */
};

struct job {
	struct hyb_sparse_ffn_ctx *c;
	enum pass_mode mode;
	float *hout;            /* MODE_H */
	const float *coef;      /* MODE_DOWN */
	const struct hyb_ffn_bundles *b;
	enum hyb_ffn_act act;
	struct hyb_sparse_x x;
	const uint32_t *active; /* NULL: every neuron */
	uint32_t n_groups;
	uint64_t total;         /* listed neurons of present groups */
	uint64_t unit;          /* positions per work unit, a multiple of CH */
	uint64_t n_units;
	atomic_ullong next;     /* the next unit to take */
	int nth;
	float thr;              /* CATS threshold (0: none) */
	float *y;
};

/* ---- context ------------------------------------------------------------- */

struct hyb_sparse_ffn_ctx *hyb_sparse_ffn_ctx_new(uint32_t n_embd, uint32_t n_ff,
						   int n_threads)
{
	struct hyb_sparse_ffn_ctx *c;

	if (n_embd == 0 || n_ff == 0)
		return NULL;
	if (n_threads <= 0) {
		long n = sysconf(_SC_NPROCESSORS_ONLN);

		n_threads = n > 0 ? (int)n : 1;
	}
	c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->n_embd = n_embd;
	c->n_ff = n_ff;
	c->n_threads = n_threads;
	c->ck = hyb_cpu_best();
	c->sk = hyb_sparse_best();
	c->ystride = ((size_t)n_embd + 15) & ~(size_t)15;
	c->xbuf = aligned_alloc(64, (hyb_sparse_x_bytes(n_embd) + 63) & ~(size_t)63);
	c->ypart = aligned_alloc(64, sizeof(float) * c->ystride * UNITS);
	c->gstart = malloc(sizeof(uint32_t) * ((size_t)n_ff + 1));
	c->cum = malloc(sizeof(uint64_t) * ((size_t)n_ff + 1));
	c->slot = aligned_alloc(64, sizeof(struct tslot) * (size_t)n_threads);
	c->h = malloc(sizeof(float) * n_ff);
	/* any dot type takes at most 4 bytes an element, plus a block's header */
	c->hq = malloc(4 * (size_t)n_ff + 64);
	c->nz = malloc(sizeof(uint32_t) * n_ff);
	if (!c->xbuf || !c->ypart || !c->gstart || !c->cum || !c->slot || !c->h || !c->hq ||
	    !c->nz) {
		hyb_sparse_ffn_ctx_free(c);
		return NULL;
	}
	return c;
}

void hyb_sparse_ffn_ctx_free(struct hyb_sparse_ffn_ctx *c)
{
	if (!c)
		return;
	free(c->xbuf);
	free(c->ypart);
	free(c->gstart);
	free(c->cum);
	free(c->slot);
	free(c->h);
	free(c->hq);
	free(c->nz);
	free(c);
}

int hyb_sparse_ffn_set_isa(struct hyb_sparse_ffn_ctx *c, enum hyb_isa isa)
{
	const struct hyb_sparse_kernels *sk = hyb_sparse_kernels(isa);

	if (!c || !sk)
		return -1;
	c->sk = sk;
	c->ck = hyb_cpu_kernels(isa);
	return 0;
}

const char *hyb_sparse_ffn_error(const struct hyb_sparse_ffn_ctx *c)
{
	return c ? c->err : "no context";
}

/* ---- the per-thread work --------------------------------------------------- */

static inline float act_h(enum hyb_ffn_act act, float g, float u)
{
	switch (act) {
	case HYB_ACT_SILU:
		return g / (1.0f + expf(-g)) * u;
	case HYB_ACT_RELU:
		return g * u; /* g > 0 here */
	case HYB_ACT_RELU2:
		return g * g * u;
	default:
		return u > 0 ? g * u : 0.0f;
	}
}

/* Rows of the neurons of one chunk, which may span groups; y: its unit's partial. */
struct chunk {
	int n;
	float *y;
	const void *gate[CH], *up[CH], *down[CH];
	uint32_t idx[CH]; /* bundle-order neuron index */
};

/*
 * Start fetching the first rows of a kernel call: the kernels prefetch each
 * tile's successor while they work, but nothing fetches the first tile,
 * and with scattered rows each call would otherwise begin with a full
 * memory latency per row. Into L2: four F16 rows would fill L1.
 */
static void prefetch_first(const void *const *rows, int n, uint64_t rb)
{
	for (int i = 0; i < n && i < 4; i++)
		for (uint64_t off = 0; off < rb; off += 64)
			__builtin_prefetch((const char *)rows[i] + off, 0, 2);
}

/* append up to HYB_SPARSE_PF_ROWS of src to rows[n..]: the rows of the next call */
static int lookahead(const void **rows, int n, const void *const *src, int n_src)
{
	const int m = n_src < HYB_SPARSE_PF_ROWS ? n_src : HYB_SPARSE_PF_ROWS;

	memcpy(rows + n, src, sizeof(*rows) * (size_t)m);
	return m;
}

/*
 * Gate dots; for the ReLU family keep the gates > 0; up dots; h; down axpy
 * for h != 0. Each call prefetches the first rows of the next one: the up
 * rows of the first listed neurons (most listed neurons are active when the
 * predictor is good), the down rows of the first survivors, the gate rows
 * of the next chunk (next, may be NULL).
 */
static void run_chunk(const struct job *j, const struct chunk *ch, const struct chunk *next,
		      float *y, struct tslot *st)
{
	const struct hyb_sparse_kernels *sk = j->c->sk;
	const uint32_t t = j->b->type;
	const int64_t k = j->b->n_embd;
	const int relu = j->act != HYB_ACT_SILU && j->act != HYB_ACT_GELU;
	const int gelu = j->act == HYB_ACT_GELU;
	const int cats = !relu && j->thr > 0;
	const int n = ch->n;
	const void *rows[CH + HYB_SPARSE_PF_ROWS];
	float gv[CH], uv[CH], hv[CH], gg[CH];
	int sel[CH], m = 0, nz = 0, npf;

	if (j->mode == MODE_DOWN) {
		memcpy(rows, ch->down, sizeof(*rows) * (size_t)n);
		for (int i = 0; i < n; i++)
			hv[i] = j->coef[ch->idx[i]];
		npf = next ? lookahead(rows, n, next->down, next->n) : 0;
		sk->axpy_pf[t](k, rows, hv, n, npf, y);
		st->n_nz += (uint64_t)n;
		return;
	}
	memcpy(rows, ch->gate, sizeof(*rows) * (size_t)n);
	npf = lookahead(rows, n, ch->up, n);
	sk->dot_pf[t](k, rows, n, npf, &j->x, gv);
	for (int i = 0; i < n; i++) {
		if (relu && !(gv[i] > 0))
			continue; /* relu(gate) == 0: h == 0 whatever up is */
		if (cats && gelu) { /* CATS: |act(gate)| at or below the threshold counts as 0 */
			if (!(fabsf(hyb_act_gate(HYB_ACT_GELU, gv[i])) > j->thr))
				continue;
		} else if (cats) {
			gv[i] = gv[i] / (1.0f + expf(-gv[i]));
			if (!(fabsf(gv[i]) > j->thr))
				continue;
		}
		sel[m] = i;
		gg[m] = gv[i];
		rows[m++] = ch->up[i];
	}
	if (m) {
		const void *dn[HYB_SPARSE_PF_ROWS];

		for (npf = 0; npf < m && npf < HYB_SPARSE_PF_ROWS; npf++)
			dn[npf] = ch->down[sel[npf]];
		npf = lookahead(rows, m, dn, npf);
		sk->dot_pf[t](k, rows, m, npf, &j->x, uv);
	}
	/* GeGLU as the dense pass computes it (ggml's F16 GELU table: forward/ops.c) */
	if (gelu && m)
		hyb_ffn_act(gg, uv, (uint64_t)m, HYB_ACT_GELU);
	for (int i = 0; i < m; i++) {
		const float h = gelu ? gg[i]
			      : cats ? gv[sel[i]] * uv[i]
				     : act_h(j->act, gv[sel[i]], uv[i]);

		if (j->mode == MODE_H) {
			j->hout[ch->idx[sel[i]]] = h;
			continue;
		}
		if (h == 0.0f)
			continue;
		hv[nz] = h;
		rows[nz++] = ch->down[sel[i]];
	}
	if (nz) {
		npf = next ? lookahead(rows, nz, next->gate, next->n) : 0;
		sk->axpy_pf[t](k, rows, hv, nz, npf, y);
	}
	st->n_gate += (uint64_t)n;
	st->n_up += (uint64_t)m;
	st->n_nz += (uint64_t)nz;
}

/* the group holding position pos: the last g with cum[g] <= pos */
static uint32_t group_of(const struct hyb_sparse_ffn_ctx *c, uint32_t n_groups, uint64_t pos)
{
	uint32_t g = 0, gh = n_groups;

	while (gh - g > 1) {
		uint32_t mid = g + (gh - g) / 2;

		if (c->cum[mid] <= pos)
			g = mid;
		else
			gh = mid;
	}
	return g;
}

/* f = ch[*cur] is complete: run the chunk before it (which prefetches f's first rows). */
static void chunk_done(const struct job *j, struct chunk *ch, int *cur, struct tslot *st,
		       uint64_t rb)
{
	struct chunk *f = &ch[*cur];

	*cur ^= 1;
	if (ch[*cur].n)
		run_chunk(j, &ch[*cur], f, ch[*cur].y, st);
	else /* the first: nothing ran before it to fetch its rows */
		prefetch_first(j->mode == MODE_DOWN ? f->down : f->gate, f->n, rb);
	ch[*cur].n = 0;
}

/*
 * Threads take units of consecutive positions (bundle order) from a shared
 * counter. A unit's positions go into chunks of CH neurons whatever their
 * group; two chunks in turn, so that a chunk's first gate rows are
 * requested when it is filled and it runs after the one before it.
 */
static void ffn_worker(void *arg, int ith, int nth)
{
	struct job *j = arg;
	struct hyb_sparse_ffn_ctx *c = j->c;
	const struct hyb_ffn_bundles *b = j->b;
	const uint32_t gs = b->group_size;
	const uint64_t rb = b->row_bytes;
	struct tslot *st = &c->slot[ith];
	struct chunk ch[2];
	int cur = 0;

	(void)nth;
	if (ith >= j->nth)
		return;
	ch[0].n = ch[1].n = 0;
	for (;;) {
		const uint64_t u = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);

		if (u >= j->n_units)
			break;
		const uint64_t lo = u * j->unit;
		const uint64_t hi = lo + j->unit < j->total ? lo + j->unit : j->total;
		float *y = j->mode == MODE_H ? NULL
			   : u == 0	      ? j->y
					      : c->ypart + (size_t)u * c->ystride;
		uint32_t g = group_of(c, j->n_groups, lo);

		if (y)
			memset(y, 0, sizeof(float) * b->n_embd);
		ch[cur].y = y;
		for (uint64_t p = lo; p < hi; p++) {
			while (p >= c->cum[g + 1])
				g++; /* absent and empty groups have cum[g + 1] == cum[g] */
			const uint32_t g0 = g * gs, ng = b->n_ff - g0 < gs ? b->n_ff - g0 : gs;
			const uint64_t at = p - c->cum[g];
			const uint32_t l = j->active ? j->active[c->gstart[g] + at] - g0
						     : (uint32_t)at;
			struct chunk *f = &ch[cur];

			f->idx[f->n] = g0 + l;
			if (b->bundle) {
				const uint8_t *base = b->bundle[g];

				f->gate[f->n] = base + (uint64_t)l * rb;
				f->up[f->n] = base + (uint64_t)(ng + l) * rb;
				f->down[f->n] = base + (uint64_t)(2 * ng + l) * rb;
			} else {
				const uint64_t off = (uint64_t)(g0 + l) * rb;

				f->gate[f->n] = (const uint8_t *)b->rows[0] + off;
				f->up[f->n] = (const uint8_t *)b->rows[1] + off;
				f->down[f->n] = (const uint8_t *)b->rows[2] + off;
			}
			if (++f->n == CH) {
				chunk_done(j, ch, &cur, st, rb);
				ch[cur].y = y;
			}
		}
		if (ch[cur].n) /* the unit's last, short chunk (only the last unit has one) */
			chunk_done(j, ch, &cur, st, rb);
	}
	if (ch[cur ^ 1].n)
		run_chunk(j, &ch[cur ^ 1], NULL, ch[cur ^ 1].y, st);
}

struct reduce_job {
	float *y;
	const float *parts;
	size_t stride;
	uint32_t n;
	int nparts;
};

static void reduce_worker(void *arg, int ith, int nth)
{
	const struct reduce_job *r = arg;
	long lo, hi;

	/* slices of 16 floats: no two threads write one cache line */
	hyb_split((long)(r->n + 15) / 16, ith, nth, &lo, &hi);
	lo *= 16;
	hi = hi * 16 < (long)r->n ? hi * 16 : (long)r->n;
	for (int p = 1; p < r->nparts; p++) {
		const float *src = r->parts + (size_t)p * r->stride;

		for (long i = lo; i < hi; i++)
			r->y[i] += src[i];
	}
}

/* ---- the operator ------------------------------------------------------------ */

static int fail(struct hyb_sparse_ffn_ctx *c, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static int fail(struct hyb_sparse_ffn_ctx *c, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(c->err, sizeof(c->err), fmt, ap);
	va_end(ap);
	return -1;
}

static int check_args(struct hyb_sparse_ffn_ctx *c, const struct hyb_ffn_bundles *b,
		      enum hyb_ffn_act act, const float *xn, const uint32_t *active,
		      uint32_t n_active, const float *y)
{
	if (!b || !xn || !y ||
	    (!b->bundle && (!b->rows[0] || !b->rows[1] || !b->rows[2])))
		return fail(c, "sparse ffn: NULL argument");
	if (!hyb_sparse_type_ok(b->type))
		return fail(c, "sparse ffn: weight type %s not supported (%s)",
			    hyb_type_name(b->type), hyb_sparse_type_list());
	if (b->n_embd == 0 || b->n_ff == 0 || b->group_size == 0)
		return fail(c, "sparse ffn: zero size (n_embd %u, n_ff %u, group size %u)",
			    b->n_embd, b->n_ff, b->group_size);
	if (!hyb_row_bytes(b->type, b->n_embd))
		return fail(c, "sparse ffn: n_embd %u is not a multiple of the %s block size (%u)",
			    b->n_embd, hyb_type_name(b->type), hyb_type_info(b->type)->blck);
	if (b->row_bytes != hyb_row_bytes(b->type, b->n_embd))
		return fail(c, "sparse ffn: row_bytes %llu, expected %llu for %u %s",
			    (unsigned long long)b->row_bytes,
			    (unsigned long long)hyb_row_bytes(b->type, b->n_embd), b->n_embd,
			    hyb_type_name(b->type));
	if (b->n_embd > c->n_embd || b->n_ff > c->n_ff)
		return fail(c, "sparse ffn: shape %ux%u exceeds the context's %ux%u", b->n_embd,
			    b->n_ff, c->n_embd, c->n_ff);
	if ((unsigned)act > HYB_ACT_GELU)
		return fail(c, "sparse ffn: unknown activation %d", (int)act);
	if (!c->sk->dot_pf[b->type] || !c->sk->axpy_pf[b->type])
		return fail(c, "sparse ffn: no %s kernel at level %s", hyb_type_name(b->type),
			    c->sk->name);
	if (!active)
		return 0;
	if (n_active > b->n_ff)
		return fail(c, "sparse ffn: %u active neurons of %u", n_active, b->n_ff);
	for (uint32_t i = 0; i < n_active; i++) {
		if (active[i] >= b->n_ff)
			return fail(c, "sparse ffn: active[%u] = %u is not below n_ff %u", i,
				    active[i], b->n_ff);
		if (i && active[i] <= active[i - 1])
			return fail(c, "sparse ffn: active list not strictly increasing at %u", i);
	}
	return 0;
}

int hyb_sparse_ffn(struct hyb_sparse_ffn_ctx *c, struct hyb_threadpool *pool,
		   const struct hyb_ffn_bundles *b, enum hyb_ffn_act act, const float *xn,
		   const uint32_t *active, uint32_t n_active, float *y,
		   struct hyb_sparse_ffn_stats *st)
{
	return hyb_sparse_ffn_cats(c, pool, b, act, xn, active, n_active, 0.0f, y, st);
}

/*
 * One pass of j over the listed neurons (j->b, j->active, arguments
 * checked): units of whole chunks, UNITS at most, cut from the list alone
 * (not the thread count); their partial y summed in unit order.
 */
static void run_pass(struct hyb_sparse_ffn_ctx *c, struct hyb_threadpool *pool, struct job *j,
		     uint32_t n_active, struct hyb_sparse_ffn_stats *st)
{
	const struct hyb_ffn_bundles *b = j->b;
	int nth;

	j->n_groups = (uint32_t)(((uint64_t)b->n_ff + b->group_size - 1) / b->group_size);

	/* where each group's neurons start in the list, and the listed work before it */
	uint32_t pos = 0;

	c->cum[0] = 0;
	for (uint32_t g = 0; g < j->n_groups; g++) {
		const uint64_t g0 = (uint64_t)g * b->group_size;
		const uint64_t g1 = g0 + b->group_size < b->n_ff ? g0 + b->group_size : b->n_ff;
		uint64_t n;

		if (j->active) {
			while (pos < n_active && j->active[pos] < g0)
				pos++;
			c->gstart[g] = pos;
			uint32_t q = pos;

			while (q < n_active && j->active[q] < g1)
				q++;
			n = q - pos;
		} else {
			c->gstart[g] = (uint32_t)g0;
			n = g1 - g0;
		}
		c->cum[g + 1] = c->cum[g] + (!b->bundle || b->bundle[g] ? n : 0);
	}
	j->total = c->cum[j->n_groups];
	j->unit = (j->total + (uint64_t)CH * UNITS - 1) / ((uint64_t)CH * UNITS) * CH;
	if (!j->unit)
		j->unit = CH;
	j->n_units = (j->total + j->unit - 1) / j->unit;
	if (!j->n_units && j->y)
		memset(j->y, 0, sizeof(float) * b->n_embd);
	/* a few rows are not worth waking threads for */
	nth = pool ? hyb_threadpool_size(pool) : 1;
	if (nth > c->n_threads)
		nth = c->n_threads;
	if ((uint64_t)nth > j->total / 8)
		nth = j->total / 8 > 0 ? (int)(j->total / 8) : 1;
	if ((uint64_t)nth > j->n_units)
		nth = j->n_units ? (int)j->n_units : 1;
	j->nth = nth;
	memset(c->slot, 0, sizeof(*c->slot) * (size_t)nth);
	atomic_init(&j->next, 0);
	/* a thread that has not started when the units run out is not waited for */
	if (nth == 1)
		ffn_worker(j, 0, 1);
	else
		hyb_threadpool_run_dynamic(pool, ffn_worker, j);

	if (j->y && j->n_units > 1) {
		struct reduce_job r = { .y = j->y, .parts = c->ypart, .stride = c->ystride,
					.n = b->n_embd, .nparts = (int)j->n_units };

		/* each slice of y summed by one thread, in unit order */
		if (nth > 2)
			hyb_threadpool_run(pool, reduce_worker, &r);
		else
			reduce_worker(&r, 0, 1);
	}
	if (st) {
		for (int t = 0; t < nth; t++) {
			st->n_gate += c->slot[t].n_gate;
			st->n_up += c->slot[t].n_up;
			st->n_nz += c->slot[t].n_nz;
		}
	}
}

int hyb_sparse_ffn_cats(struct hyb_sparse_ffn_ctx *c, struct hyb_threadpool *pool,
			const struct hyb_ffn_bundles *b, enum hyb_ffn_act act, const float *xn,
			const uint32_t *active, uint32_t n_active, float thr, float *y,
			struct hyb_sparse_ffn_stats *st)
{
	struct job j = { .c = c, .b = b, .act = act, .active = active, .y = y, .thr = thr };

	if (!c)
		return -1;
	c->err[0] = 0;
	if (check_args(c, b, act, xn, active, n_active, y))
		return -1;
	if (!(thr >= 0) || !isfinite(thr) ||
	    (thr > 0 && act != HYB_ACT_SILU && act != HYB_ACT_GELU))
		return fail(c, "sparse ffn: a threshold (%g) is for SiLU and GELU FFNs, finite and "
			    ">= 0", (double)thr);
	if (hyb_sparse_prep_x(c->ck, b->type, xn, b->n_embd, c->xbuf, &j.x))
		return fail(c, "sparse ffn: cannot convert the input for %s",
			    hyb_type_name(b->type));
	if (st)
		memset(st, 0, sizeof(*st));
	run_pass(c, pool, &j, n_active, st);
	return 0;
}

int hyb_sparse_ffn_pi(struct hyb_sparse_ffn_ctx *c, struct hyb_threadpool *pool,
		      const struct hyb_ffn_bundles *b, enum hyb_ffn_act act, const float *xn,
		      const uint32_t *active, uint32_t n_active, float *y,
		      struct hyb_sparse_ffn_stats *st)
{
	struct job j = { .c = c, .b = b, .act = act, .active = active, .mode = MODE_H };
	uint32_t vdt, n = 0;

	if (!c)
		return -1;
	c->err[0] = 0;
	if (check_args(c, b, act, xn, active, n_active, y))
		return -1;
	if (b->bundle)
		return fail(c, "sparse ffn: PowerInfer's arithmetic is for a file's own rows");
	vdt = hyb_vec_dot_type(b->type);
	if (b->n_ff % hyb_type_info(vdt)->blck)
		return fail(c, "sparse ffn: n_ff %u is not a multiple of the %s block size (%u)",
			    b->n_ff, hyb_type_name(vdt), hyb_type_info(vdt)->blck);
	if (hyb_sparse_prep_x(c->ck, b->type, xn, b->n_embd, c->xbuf, &j.x))
		return fail(c, "sparse ffn: cannot convert the input for %s",
			    hyb_type_name(b->type));
	if (st)
		memset(st, 0, sizeof(*st));
	/* h of every neuron, 0 where not listed, as ggml's sparse mul_mat leaves it */
	memset(c->h, 0, sizeof(float) * b->n_ff);
	j.hout = c->h;
	run_pass(c, pool, &j, n_active, st);
	/* ggml's axpy reads h converted to the down rows' dot type */
	if (vdt != HYB_TYPE_F32 && c->ck->quantize_act[vdt] && c->ck->dequantize[vdt]) {
		c->ck->quantize_act[vdt](c->h, c->hq, b->n_ff);
		c->ck->dequantize[vdt](c->hq, c->h, b->n_ff);
	}
	for (uint32_t i = 0; i < b->n_ff; i++)
		if (c->h[i] != 0.0f)
			c->nz[n++] = i;
	j = (struct job){ .c = c, .b = b, .act = act, .active = c->nz, .mode = MODE_DOWN,
			  .coef = c->h, .y = y };
	run_pass(c, pool, &j, n, st);
	return 0;
}

/* ---- bundles ----------------------------------------------------------------- */

uint64_t hyb_bundles_bytes(uint32_t type, uint32_t n_embd, uint32_t n_ff)
{
	const uint64_t rb = hyb_row_bytes(type, n_embd);

	if (!rb || n_ff == 0 || rb > UINT64_MAX / 3 / n_ff)
		return 0;
	return 3 * (uint64_t)n_ff * rb;
}

static int berr(char *err, size_t errlen, const char *msg, uint64_t v)
{
	if (err && errlen)
		snprintf(err, errlen, "bundles: %s (%llu)", msg, (unsigned long long)v);
	return -1;
}

int hyb_bundles_build(uint32_t type, uint32_t n_embd, uint32_t n_ff, uint32_t group_size,
		      const float *gate, const float *up, const float *down,
		      const int32_t *perm, void *out, char *err, size_t errlen)
{
	const uint64_t rb = hyb_row_bytes(type, n_embd);
	uint8_t *seen = NULL;
	float *col = NULL;
	int rc = -1;

	if (!gate || !up || !down || !out)
		return berr(err, errlen, "NULL matrix or output", 0);
	if (!rb)
		return berr(err, errlen, "n_embd is zero or not a multiple of the type's block",
			    n_embd);
	if (n_ff == 0 || group_size == 0)
		return berr(err, errlen, "n_ff and group size must be positive", group_size);
	if (!hyb_bundles_bytes(type, n_embd, n_ff))
		return berr(err, errlen, "tensor too large", n_ff);
	seen = calloc(n_ff, 1);
	col = malloc(sizeof(float) * n_embd);
	if (!seen || !col) {
		berr(err, errlen, "out of memory", n_ff);
		goto out;
	}
	for (uint32_t i = 0; perm && i < n_ff; i++) {
		if (perm[i] < 0 || (uint32_t)perm[i] >= n_ff || seen[perm[i]]) {
			berr(err, errlen, "perm is not a permutation of [0, n_ff) at entry", i);
			goto out;
		}
		seen[perm[i]] = 1;
	}
	for (uint64_t g0 = 0; g0 < n_ff; g0 += group_size) {
		const uint64_t ng = n_ff - g0 < group_size ? n_ff - g0 : group_size;
		uint8_t *base = (uint8_t *)out + 3 * g0 * rb;

		for (uint64_t i = 0; i < ng; i++) {
			const uint64_t src = perm ? (uint64_t)perm[g0 + i] : g0 + i;

			for (uint32_t e = 0; e < n_embd; e++)
				col[e] = down[(uint64_t)e * n_ff + src];
			uint8_t *row = base + i * rb;

			if (hyb_quantize_row_ref(type, gate + src * n_embd, row, n_embd) ||
			    hyb_quantize_row_ref(type, up + src * n_embd, row + ng * rb, n_embd) ||
			    hyb_quantize_row_ref(type, col, row + 2 * ng * rb, n_embd)) {
				berr(err, errlen, "cannot quantize rows to this type", type);
				goto out;
			}
		}
	}
	rc = 0;
out:
	free(seen);
	free(col);
	return rc;
}

int hyb_bundles_view(struct hyb_ffn_bundles *b, uint32_t type, uint32_t n_embd, uint32_t n_ff,
		     uint32_t group_size, const void *data, const void **ptrs)
{
	const uint64_t rb = hyb_row_bytes(type, n_embd);

	if (!b || !data || !ptrs || !rb || n_ff == 0 || group_size == 0)
		return -1;
	for (uint64_t g0 = 0, g = 0; g0 < n_ff; g0 += group_size, g++)
		ptrs[g] = (const uint8_t *)data + 3 * g0 * rb;
	*b = (struct hyb_ffn_bundles){ .type = type, .n_embd = n_embd, .n_ff = n_ff,
				       .group_size = group_size, .row_bytes = rb,
				       .bundle = ptrs };
	return 0;
}
