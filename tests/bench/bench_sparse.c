// SPDX-License-Identifier: MIT
/*
 * The sparse FFN operator against the dense FFN (PowerInfer Fig. 16 style,
 * digest_003 §4: speedup vs sparsity on one layer's FFN).
 *
 * One [n_embd x n_ff] FFN (gate, up, down; default 4096 x 11008) per
 * weight type, ReLU. Dense baseline, measured in the same run and on the
 * same thread pool: the dense kernels (hyb_gemm_pick) as the forward pass
 * runs them: xn converted, gate and up in one row-chunked job, the
 * activation, h converted, down. Sparse: hyb_sparse_ffn() over the bundle
 * layout with the active list of sparsity s, neurons drawn at random, and
 * the gate weights signed so that exactly the listed neurons have h != 0
 * (gate rows of listed neurons >= 0 and the others <= 0, xn > 0); the
 * bench checks that the operator's counts say so.
 *
 * Every timed run starts with the caches flushed (a pass over twice the
 * last-level cache), so neither side is served from L3 by the run before.
 * Speedup is the median over repetitions of each repetition's dense/sparse
 * ratio (this machine is shared; adjacent runs see the same load).
 *
 * Also printed, to tell memory-bound from compute-bound: the DRAM read
 * bandwidth (hyb/membw.h) with the same thread count; the single-thread
 * rates of the sparse dot and axpy and of the dense GEMV on rows resident
 * in L2 (when a pass is compute-bound, sparse at s = 0 runs at roughly
 * 3 / (2 / dot + 1 / axpy) against dense's GEMV rate); and the time an
 * empty job takes on the pool (on a shared machine a worker is not always
 * on a CPU, and short sparse jobs wait for it like every other job).
 *
 *   bench_sparse [--type Q4_0|Q8_0|F16|F32] [--threads N] [--reps N] [--isa NAME]
 *                [--embd N] [--ff N] [--gs N] [--sparsity 0,50,80,90,95]
 */
#include <emmintrin.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cpu_kernels.h"
#include "hyb/generate.h"
#include "hyb/membw.h"
#include "hyb/threadpool.h"
#include "forward/ops.h"
#include "sparse/sparse_op.h"
#include "sparse_ffn_kernels.h"

#define MAX_S 16
static double sparsity[MAX_S] = { 0, 0.5, 0.8, 0.9, 0.95 };
static int n_sparsity = 5;

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t rnd64(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

/*
 * Buffers of 2 MiB or more are whole huge pages where the kernel gives them
 * (MADV_HUGEPAGE), as the engine holds weights (model_load.c, the pools):
 * scattered bundle rows on 4 KiB pages would cost the sparse side a TLB
 * miss per row that the engine does not pay.
 */
static void *xalloc(size_t n)
{
	const size_t huge = 2u << 20;
	const size_t align = n >= huge ? huge : 64;
	void *p = aligned_alloc(align, (n + align - 1) & ~(align - 1));

	if (p && align == huge)
		madvise(p, (n + huge - 1) & ~(huge - 1), MADV_HUGEPAGE);
	if (!p) {
		fprintf(stderr, "bench_sparse: out of memory (%zu bytes)\n", n);
		exit(1);
	}
	return p;
}

/* CPU time of the calling thread: the kernel rates are not charged for preemption */
static double thread_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double median(const double *v, int n)
{
	double *t = xalloc(sizeof(double) * (size_t)n), m;

	memcpy(t, v, sizeof(double) * (size_t)n);
	qsort(t, (size_t)n, sizeof(double), cmp_double);
	m = n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
	free(t);
	return m;
}

/* ---- weights ----------------------------------------------------------------- */

static void fill_random(void *p, size_t bytes)
{
	uint8_t *b = p;
	size_t i = 0;

	for (; i + 8 <= bytes; i += 8) {
		uint64_t r = rnd64();

		memcpy(b + i, &r, 8);
	}
	for (; i < bytes; i++)
		b[i] = (uint8_t)rnd64();
}

/*
 * Rows of well-formed random weights: codes random, block scales in a sane
 * range, F16 values below 2 in magnitude. nonneg: every weight >= 0 (the
 * gate rows of the bundles; their sign is then set by set_gate_signs()).
 */
static void make_rows(uint32_t type, uint8_t *w, size_t rb, size_t nrows, int nonneg)
{
	fill_random(w, rb * nrows);
	if (type == HYB_TYPE_F16) {
		uint16_t *h = (uint16_t *)w;

		for (size_t i = 0; i < rb * nrows / 2; i++)
			h[i] &= nonneg ? 0x3fff : 0xbfff;
		return;
	}
	if (type == HYB_TYPE_F32) {
		float *f = (float *)w;

		for (size_t i = 0; i < rb * nrows / 4; i++) {
			f[i] = (float)(rnd64() >> 40) * 0x1p-24f;
			if (!nonneg)
				f[i] -= 0.5f;
		}
		return;
	}
	const size_t bs = hyb_type_info(type)->size;

	for (size_t off = 0; off < rb * nrows; off += bs) {
		const uint16_t d = (uint16_t)(0x2000 | (rnd64() & 0x3ff));

		memcpy(w + off, &d, 2);
		if (!nonneg)
			continue;
		for (size_t j = 2; j < bs; j++) /* Q4_0 nibbles 9..15, Q8_0 quants 1..127 */
			w[off + j] = type == HYB_TYPE_Q4_0 ? (uint8_t)(0x99 | (w[off + j] & 0x66))
							   : (uint8_t)(1 | (w[off + j] & 0x7f));
	}
}

/* Make row w all >= 0 (on) or all <= 0: the sign bit of every scale or value. */
static void set_row_sign(uint32_t type, uint8_t *w, size_t rb, int on)
{
	size_t step = 2, n = rb;

	if (type == HYB_TYPE_Q4_0 || type == HYB_TYPE_Q8_0)
		step = hyb_type_info(type)->size;
	if (type == HYB_TYPE_F32)
		step = 4;
	for (size_t off = 0; off < n; off += step) {
		uint8_t *hi = w + off + (type == HYB_TYPE_F32 ? 3 : 1);

		*hi = on ? (uint8_t)(*hi & 0x7f) : (uint8_t)(*hi | 0x80);
	}
}

/*
 * n neurons at random (a partial shuffle), the sorted list of them, and
 * the gate rows signed so that exactly they have h != 0: rows whose state
 * changes get their sign bits flipped.
 */
static uint32_t draw_active(uint32_t type, const void **ptrs, uint32_t F, uint32_t GS,
			    size_t rb, uint32_t n, uint32_t *order, uint8_t *on, uint8_t *next,
			    uint32_t *list)
{
	uint32_t m = 0;

	for (uint32_t i = 0; i < F; i++) {
		order[i] = i;
		next[i] = 0;
	}
	for (uint32_t i = 0; i < n; i++) {
		uint32_t j = i + (uint32_t)(rnd64() % (F - i)), t = order[i];

		order[i] = order[j];
		order[j] = t;
		next[order[i]] = 1;
	}
	for (uint32_t i = 0; i < F; i++) {
		uint8_t *row = (uint8_t *)ptrs[i / GS] + (size_t)(i % GS) * rb;

		if (next[i] != on[i]) {
			set_row_sign(type, row, rb, next[i]);
			/* written rows would still be in cache for the sparse run */
			for (size_t off = 0; off < rb; off += 64)
				_mm_clflush(row + off);
		}
		on[i] = next[i];
		if (on[i])
			list[m++] = i;
	}
	return m;
}

/* ---- the dense FFN as the forward pass computes it ----------------------------- */

struct mm_job {
	const struct hyb_cpu_kernels *k;
	uint32_t type;
	int nw;
	const uint8_t *w[2];
	uint64_t rows[2], kdim;
	size_t rb;
	float *y[2];
	const void *x;
	uint64_t chunk, chunks[2], total;
	atomic_ullong next;
};

static void mm_worker(void *arg, int ith, int nth)
{
	struct mm_job *j = arg;

	(void)ith;
	(void)nth;
	for (;;) {
		uint64_t c = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
		int i = 0;

		if (c >= j->total)
			return;
		while (c >= j->chunks[i])
			c -= j->chunks[i++];
		const uint64_t r0 = c * j->chunk;
		const uint64_t nr = j->rows[i] - r0 < j->chunk ? j->rows[i] - r0 : j->chunk;

		const hyb_gemm_fn gemm = hyb_gemm_pick(j->k, j->type, j->rows[i]);

		gemm((int64_t)j->kdim, j->w[i] + r0 * j->rb, j->rb, (int64_t)nr, j->x, 0, 1,
		     j->y[i] + r0, j->rows[i]);
	}
}

/* Y_i = W_i · x for nw weights of `rows` rows of kdim, row-chunked as forward.c's matmul(). */
static void dense_mm(struct hyb_threadpool *pool, const struct hyb_cpu_kernels *k, uint32_t type,
		     int nw, const uint8_t *const *w, uint64_t rows, uint64_t kdim, const void *x,
		     float *const *y)
{
	const int nth = hyb_threadpool_size(pool);
	struct mm_job j = { .k = k, .type = type, .nw = nw, .kdim = kdim, .x = x,
			    .rb = hyb_row_bytes(type, kdim) };

	j.chunk = ((rows * nw) / ((uint64_t)nth * 8) + 15) & ~15ull;
	if (j.chunk < 16)
		j.chunk = 16;
	for (int i = 0; i < nw; i++) {
		j.w[i] = w[i];
		j.y[i] = y[i];
		j.rows[i] = rows;
		j.chunks[i] = (rows + j.chunk - 1) / j.chunk;
		j.total += j.chunks[i];
	}
	atomic_init(&j.next, 0);
	hyb_threadpool_run(pool, mm_worker, &j);
}

struct dense {
	uint32_t type, E, F;
	uint8_t *gate, *up, *down; /* [F][E], [F][E], [E][F] */
	void *xq, *hq;
	float *g, *u;
};

static void dense_ffn(struct hyb_threadpool *pool, const struct hyb_cpu_kernels *k, struct dense *d,
		      const float *xn, float *y)
{
	const uint32_t vt = hyb_vec_dot_type(d->type);
	const uint8_t *gu[2] = { d->gate, d->up };
	float *gu_out[2] = { d->g, d->u };

	k->quantize_act[vt](xn, d->xq, d->E);
	dense_mm(pool, k, d->type, 2, gu, d->F, d->E, d->xq, gu_out);
	hyb_ffn_act(d->g, d->u, d->F, HYB_ACT_RELU);
	k->quantize_act[vt](d->g, d->hq, d->F);
	dense_mm(pool, k, d->type, 1, (const uint8_t *const *)&d->down, d->E, d->F, d->hq, &y);
}

/* ---- cache flush ------------------------------------------------------------------ */

struct flush_job {
	const uint64_t *buf;
	size_t words;
	uint64_t sink[64];
};

static void flush_worker(void *arg, int ith, int nth)
{
	struct flush_job *j = arg;
	long lo, hi;
	uint64_t s = 0;

	hyb_split((long)j->words, ith, nth, &lo, &hi);
	for (long i = lo; i < hi; i += 8)
		s += j->buf[i];
	j->sink[ith % 64] = s;
}

static struct flush_job g_flush;

static void flush_caches(struct hyb_threadpool *pool)
{
	hyb_threadpool_run(pool, flush_worker, &g_flush);
}

/* ---- how long the pool takes to run nothing ----------------------------------------- */

static void nop_job(void *arg, int ith, int nth)
{
	(void)arg;
	(void)ith;
	(void)nth;
}

/*
 * Median and 90th percentile of an empty hyb_threadpool_run: on a machine shared
 * with other work a worker thread is not always on a CPU when a job starts,
 * and every job (dense or sparse) then waits for it; short sparse jobs feel
 * it most.
 */
static void pool_latency(struct hyb_threadpool *pool, double *med, double *p90)
{
	enum { N = 200 };
	double t[N];

	for (int i = 0; i < N; i++) {
		double t0 = hyb_now();

		hyb_threadpool_run(pool, nop_job, NULL);
		t[i] = hyb_now() - t0;
		for (double t1 = hyb_now(); hyb_now() - t1 < 20e-6;)
			; /* the gap between two jobs of a decode step */
	}
	qsort(t, N, sizeof(double), cmp_double);
	*med = t[N / 2];
	*p90 = t[N * 9 / 10];
}

/* ---- L2-resident kernel rates (one thread) ------------------------------------- */

/*
 * GB/s of weights one thread gets through with the rows in L2 (thread CPU
 * time, best of 5 x iters passes over about 512 KiB of rows): the sparse
 * dot and axpy, and the dense GEMV on the same rows for comparison.
 */
struct rates {
	double dot, axpy, gemv;
};

static void kernel_rates(const struct hyb_sparse_kernels *sk, const struct hyb_cpu_kernels *ck,
			 uint32_t type, uint32_t E, struct rates *out)
{
	const size_t rb = hyb_row_bytes(type, E);
	const int n = HYB_SPARSE_MAX_ROWS, rows_total = (int)((512 * 1024) / rb);
	const int nr = rows_total < n ? rows_total : n;
	uint8_t *w = xalloc(rb * (size_t)nr);
	float *xn = xalloc(4 * (size_t)E), *y = xalloc(4 * (size_t)E), o[HYB_SPARSE_MAX_ROWS];
	float h[HYB_SPARSE_MAX_ROWS];
	void *xb = xalloc(hyb_sparse_x_bytes(E));
	const void *rows[HYB_SPARSE_MAX_ROWS];
	const hyb_gemm_fn gemv = hyb_gemm_pick(ck, type, (uint64_t)nr);
	struct hyb_sparse_x x;
	double best[3] = { 1e30, 1e30, 1e30 };
	const int iters = 200;

	make_rows(type, w, rb, (size_t)nr, 0);
	for (uint32_t i = 0; i < E; i++)
		xn[i] = y[i] = 0.5f + (float)(rnd64() >> 40) * 0x1p-24f;
	for (int i = 0; i < nr; i++) {
		rows[i] = w + (size_t)((i * 7) % nr) * rb;
		h[i] = 0.25f;
	}
	hyb_sparse_prep_x(ck, type, xn, E, xb, &x);
	for (int rep = 0; rep < 5; rep++) {
		const double t0 = thread_now();
		double t1, t2, t3;

		for (int it = 0; it < iters; it++)
			sk->dot[type](E, rows, nr, &x, o);
		t1 = thread_now();
		for (int it = 0; it < iters; it++)
			sk->axpy[type](E, rows, h, nr, y);
		t2 = thread_now();
		for (int it = 0; it < iters; it++)
			gemv(E, w, rb, nr, x.q, 0, 1, o, (size_t)nr);
		t3 = thread_now();
		best[0] = fmin(best[0], t1 - t0);
		best[1] = fmin(best[1], t2 - t1);
		best[2] = fmin(best[2], t3 - t2);
	}
	out->dot = (double)rb * nr * iters / best[0] / 1e9;
	out->axpy = (double)rb * nr * iters / best[1] / 1e9;
	out->gemv = (double)rb * nr * iters / best[2] / 1e9;
	if (!isfinite(o[0]) || !isfinite(y[0]))
		fprintf(stderr, "bench_sparse: kernel produced a non-finite value\n");
	free(w);
	free(xn);
	free(y);
	free(xb);
}

/* ---- one weight type ---------------------------------------------------------------- */

struct opts {
	int reps, threads;
	uint32_t E, F, GS;
	const char *isa;
};

static int bench_type(struct hyb_threadpool *pool, const struct hyb_cpu_kernels *k, uint32_t type,
		      const struct opts *o, double dram)
{
	const uint32_t E = o->E, F = o->F, GS = o->GS, n_groups = (F + GS - 1) / GS;
	const size_t rb = hyb_row_bytes(type, E), rbf = hyb_row_bytes(type, F);
	struct dense d = { .type = type, .E = E, .F = F };
	struct hyb_sparse_ffn_ctx *c = hyb_sparse_ffn_ctx_new(E, F, hyb_threadpool_size(pool));
	uint8_t *bundles = xalloc(hyb_bundles_bytes(type, E, F));
	const void **ptrs = xalloc(sizeof(void *) * n_groups);
	struct hyb_ffn_bundles b;
	float *xn = xalloc(4 * (size_t)E), *yd = xalloc(4 * (size_t)E), *ys = xalloc(4 * (size_t)E);
	uint32_t *list = xalloc(4 * (size_t)F), *order = xalloc(4 * (size_t)F);
	uint8_t *on = xalloc(F), *next = xalloc(F);
	double *td = xalloc(8 * (size_t)o->reps), *tsp = xalloc(8 * (size_t)o->reps);
	double *ratio = xalloc(8 * (size_t)o->reps);
	struct rates kr;
	const double dense_bytes = 2.0 * F * rb + (double)E * rbf;

	if (!c || !rb || !rbf) {
		fprintf(stderr, "bench_sparse: %s: bad shape %ux%u\n", hyb_type_name(type), E, F);
		return -1;
	}
	if (o->isa && hyb_sparse_ffn_set_isa(c, k->isa)) {
		fprintf(stderr, "bench_sparse: no sparse kernels for %s\n", k->name);
		return -1;
	}
	/* dense layout */
	d.gate = xalloc(rb * F);
	d.up = xalloc(rb * F);
	d.down = xalloc(rbf * E);
	d.xq = xalloc(4 * (size_t)E + 64);
	d.hq = xalloc(4 * (size_t)F + 64);
	d.g = xalloc(4 * (size_t)F);
	d.u = xalloc(4 * (size_t)F);
	make_rows(type, d.gate, rb, F, 0);
	make_rows(type, d.up, rb, F, 0);
	make_rows(type, d.down, rbf, E, 0);
	/* bundle layout: gate rows non-negative, signs set per sparsity below */
	hyb_bundles_view(&b, type, E, F, GS, bundles, ptrs);
	for (uint32_t g = 0; g < n_groups; g++) {
		const uint32_t ng = F - g * GS < GS ? F - g * GS : GS;
		uint8_t *base = (uint8_t *)ptrs[g];

		make_rows(type, base, rb, ng, 1); /* all active until draw_active() */
		make_rows(type, base + (size_t)ng * rb, rb, 2 * (size_t)ng, 0);
	}
	memset(on, 1, F);
	for (uint32_t i = 0; i < E; i++)
		xn[i] = 0.5f + (float)(rnd64() >> 40) * 0x1p-24f;
	kernel_rates(hyb_sparse_kernels(k->isa), k, type, E, &kr);

	printf("\n%s: dense %.1f MB per FFN; row %zu B; one thread, rows in L2: sparse dot "
	       "%.1f GB/s, sparse axpy %.1f GB/s, dense GEMV %.1f GB/s\n", hyb_type_name(type),
	       dense_bytes / 1e6, rb, kr.dot, kr.axpy, kr.gemv);
	printf("   s%%   dense ms  sparse ms  speedup  ideal  dense GB/s  sparse GB/s  "
	       "sparse/DRAM\n");
	for (int si = 0; si < n_sparsity; si++) {
		const uint32_t n = (uint32_t)lround((1.0 - sparsity[si]) * F);
		struct hyb_sparse_ffn_stats st = { 0 };
		uint32_t m = 0, bad = 0;

		for (int r = -1; r < o->reps; r++) { /* r = -1: warm-up */
			double t0;

			/* a new set every run: a set used again might be kept in L3
			 * (adaptive replacement resists the flush's scan) */
			m = draw_active(type, ptrs, F, GS, rb, n, order, on, next, list);
			flush_caches(pool);
			t0 = hyb_now();
			dense_ffn(pool, k, &d, xn, yd);
			t0 = hyb_now() - t0;
			if (r >= 0)
				td[r] = t0;
			flush_caches(pool);
			t0 = hyb_now();
			if (hyb_sparse_ffn(c, pool, &b, HYB_ACT_RELU, xn, list, m, ys, &st)) {
				fprintf(stderr, "bench_sparse: %s\n", hyb_sparse_ffn_error(c));
				return -1;
			}
			t0 = hyb_now() - t0;
			if (r >= 0) {
				tsp[r] = t0;
				ratio[r] = td[r] / t0;
			}
			bad += st.n_gate != m || st.n_nz != m;
		}
		if (bad)
			printf("  (!) in %u runs not exactly the %u listed neurons had h != 0\n",
			       bad, m);
		const double md = median(td, o->reps), ms = median(tsp, o->reps);
		const double sbytes = 3.0 * rb * m;

		printf("%5.1f %10.2f %10.2f %8.2f %6.1f %11.2f %12.2f %11.0f%%\n",
		       100 * sparsity[si], md * 1e3, ms * 1e3, median(ratio, o->reps),
		       1.0 / (1.0 - sparsity[si]), dense_bytes / md / 1e9, sbytes / ms / 1e9,
		       100 * sbytes / ms / dram);
		fflush(stdout);
	}
	hyb_sparse_ffn_ctx_free(c);
	free(bundles);
	free(ptrs);
	free(xn);
	free(yd);
	free(ys);
	free(list);
	free(order);
	free(on);
	free(next);
	free(td);
	free(tsp);
	free(ratio);
	free(d.gate);
	free(d.up);
	free(d.down);
	free(d.xq);
	free(d.hq);
	free(d.g);
	free(d.u);
	return 0;
}

static uint32_t type_by_name(const char *s)
{
	static const uint32_t ok[] = { HYB_TYPE_Q4_0, HYB_TYPE_Q8_0, HYB_TYPE_F16, HYB_TYPE_F32 };

	for (size_t i = 0; i < sizeof(ok) / sizeof(*ok); i++)
		if (!strcmp(s, hyb_type_name(ok[i])))
			return ok[i];
	return HYB_TYPE_COUNT;
}

int main(int argc, char **argv)
{
	struct opts o = { .reps = 7, .threads = 0, .E = 4096, .F = 11008, .GS = 64 };
	uint32_t types[4] = { HYB_TYPE_Q4_0, HYB_TYPE_Q8_0, HYB_TYPE_F16 };
	int ntypes = 3;
	const struct hyb_cpu_kernels *k = hyb_cpu_best();
	struct hyb_threadpool *pool;
	long l3;
	size_t fbytes;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--type") && i + 1 < argc) {
			types[0] = type_by_name(argv[++i]);
			ntypes = 1;
			if (types[0] == HYB_TYPE_COUNT) {
				fprintf(stderr, "bench_sparse: type '%s' is not one of "
					"Q4_0 Q8_0 F16 F32\n", argv[i]);
				return 1;
			}
		} else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
			o.threads = atoi(argv[++i]);
		} else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
			o.reps = atoi(argv[++i]);
		} else if (!strcmp(argv[i], "--embd") && i + 1 < argc) {
			o.E = (uint32_t)atoi(argv[++i]);
		} else if (!strcmp(argv[i], "--ff") && i + 1 < argc) {
			o.F = (uint32_t)atoi(argv[++i]);
		} else if (!strcmp(argv[i], "--gs") && i + 1 < argc) {
			o.GS = (uint32_t)atoi(argv[++i]);
		} else if (!strcmp(argv[i], "--sparsity") && i + 1 < argc) {
			char *e = argv[++i];

			for (n_sparsity = 0; n_sparsity < MAX_S && *e;) {
				double v = strtod(e, &e);

				if (v < 0 || v >= 100 || (*e && *e != ',')) {
					fprintf(stderr, "bench_sparse: --sparsity wants "
						"percentages in [0, 100) separated by commas\n");
					return 1;
				}
				sparsity[n_sparsity++] = v / 100;
				if (*e == ',')
					e++;
			}
		} else if (!strcmp(argv[i], "--isa") && i + 1 < argc) {
			o.isa = argv[++i];
			k = NULL;
			for (int l = 0; l < HYB_ISA_COUNT; l++)
				if (!strcmp(o.isa, hyb_isa_name((enum hyb_isa)l)))
					k = hyb_cpu_kernels((enum hyb_isa)l);
			if (!k) {
				fprintf(stderr, "bench_sparse: ISA '%s' unknown or not on "
					"this CPU\n", o.isa);
				return 1;
			}
		} else {
			fprintf(stderr, "usage: %s [--type Q4_0|Q8_0|F16|F32] [--threads N] "
				"[--reps N] [--isa NAME] [--embd N] [--ff N] [--gs N] "
				"[--sparsity LIST]\n", argv[0]);
			return 1;
		}
	}
	if (o.reps < 1 || o.threads < 0 || o.E == 0 || o.F == 0 || o.GS == 0) {
		fprintf(stderr, "bench_sparse: --reps, --embd, --ff, --gs must be positive\n");
		return 1;
	}
	pool = hyb_threadpool_new(o.threads);
	if (!pool) {
		fprintf(stderr, "bench_sparse: cannot start threads\n");
		return 1;
	}
	l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
	fbytes = (size_t)(l3 > 0 ? 2 * l3 : 0);
	if (fbytes < (64u << 20))
		fbytes = 64u << 20;
	g_flush.buf = xalloc(fbytes);
	g_flush.words = fbytes / 8;
	memset((void *)g_flush.buf, 1, fbytes);

	const double dram = hyb_measure_read_bw(hyb_threadpool_size(pool), 256u << 20, 7);

	printf("bench_sparse: FFN %u x %u, ReLU, groups of %u, %d threads, kernels %s, "
	       "median of %d reps, caches flushed before each run\n", o.E, o.F, o.GS,
	       hyb_threadpool_size(pool), k->name, o.reps);
	double lat_med, lat_p90;

	pool_latency(pool, &lat_med, &lat_p90);
	printf("DRAM read bandwidth (%d threads): %.2f GB/s; empty pool job: median %.1f us, "
	       "p90 %.1f us\n", hyb_threadpool_size(pool), dram / 1e9, lat_med * 1e6, lat_p90 * 1e6);
	for (int t = 0; t < ntypes; t++)
		if (bench_type(pool, k, types[t], &o, dram))
			return 1;
	free((void *)g_flush.buf);
	hyb_threadpool_free(pool);
	return 0;
}
