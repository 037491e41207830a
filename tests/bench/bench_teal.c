// SPDX-License-Identifier: MIT
/*
 * TEAL's input-sparse GEMV against the dense GEMV of the same matrix
 * (docs/SPARSITY.md#teal; TEAL §5.1 measures its kernel the same way: one
 * projection, speedup vs sparsity).
 *
 * One projection of n_in inputs and n_out outputs (default 4096 -> 22016,
 * gate|up of a 4096/11008 model, and 11008 -> 4096, its down) per weight
 * type. Dense: the forward pass's GEMV (hyb_gemm_pick) on the row-major
 * matrix, x converted to the kernel's activation type, rows split over the
 * pool. TEAL: hyb_teal_gemv on the transposed matrix with the inputs of
 * magnitude at or below the s-quantile skipped. Every timed run starts with
 * the caches flushed; speedup is the median of per-repetition ratios; the
 * roofline is DRAM read bandwidth over the bytes each side reads.
 *
 * --rows B: B one-token rows at once (a batched pass's decode steps, each
 * row's inputs drawn on its own: the least overlap, so the fewest shared
 * reads), three ways alternating: B GEMVs one after another (engines of
 * their own), hyb_teal_gemv_rows (the rows share the slices they have in
 * common), and the dense GEMM of B columns (a batched pass on the dense
 * kernels, inputs masked). Bytes: the union of the rows' inputs, read once.
 *
 *   bench_teal [--type F16|Q8_0|Q4_0|F32] [--threads N] [--reps N]
 *              [--in N --out N] [--sparsity 0,30,50,70] [--rows B]
 */
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "hyb/generate.h"
#include "hyb/membw.h"
#include "hyb/tensor_type.h"
#include "hyb/threadpool.h"
#include "sparse/teal.h"

#define MAX_S 16

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static float urand(void) /* [-1, 1) */
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static int cmp_f(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;

	return x < y ? -1 : x > y;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	qsort(v, n, sizeof(*v), cmp_d);
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static char *flush_buf;
static size_t flush_len = 128u << 20;

static void flush(void)
{
	if (getenv("BENCH_TEAL_HOT")) /* rows stay in cache: the kernels' compute rate */
		return;
	for (size_t i = 0; i < flush_len; i += 64)
		flush_buf[i]++;
}

struct dense_job {
	hyb_gemm_fn fn;
	const char *w;
	uint64_t rb, n_out;
	uint32_t n_in;
	const void *xq;
	uint64_t xqs;  /* bytes per column of xq */
	uint32_t cols; /* 0: one */
	float *y;
	atomic_ullong next;
};

static void dense_worker(void *arg, int ith, int nth)
{
	struct dense_job *j = arg;

	(void)ith;
	(void)nth;
	for (;;) {
		const uint64_t r0 = atomic_fetch_add(&j->next, 64);

		if (r0 >= j->n_out)
			return;
		const uint64_t nr = j->n_out - r0 < 64 ? j->n_out - r0 : 64;

		j->fn(j->n_in, j->w + r0 * j->rb, j->rb, (int64_t)nr, j->xq, j->xqs,
		      j->cols ? j->cols : 1, j->y + r0, j->n_out);
	}
}

/* --rows B: one by one, the rows at once, and the dense GEMM of B columns. */
static void run_rows(struct hyb_threadpool *pool, const struct hyb_teal_mat *m, const char *w,
		     uint64_t rb, float *x, void *xq, uint64_t xqs, float *y, uint32_t *idx,
		     float *val, uint32_t *n_act, uint32_t B, const float *ax, int reps,
		     const double *sp, int n_sp, double bw)
{
	const struct hyb_cpu_kernels *k = hyb_cpu_best();
	const uint32_t n_in = m->n_in, n_out = m->n_out, type = m->type;
	const double dense_bytes = (double)rb * n_out;
	float *xm = malloc(sizeof(float) * n_in * B);

	if (!xm)
		exit(1);
	printf("%s %u -> %u, %u rows, %d threads: dense %.1f MB\n", hyb_type_name(type), n_in,
	       n_out, B, hyb_threadpool_size(pool), dense_bytes / 1e6);
	for (int s = 0; s < n_sp; s++) {
		const float thr = sp[s] > 0 ? ax[(size_t)(sp[s] * n_in) - 1] : -1.0f;
		double t1[64], tr[64], td[64], r1[64], rd[64];
		uint32_t uni = 0, act = 0;

		for (uint32_t i = 0; i < n_in; i++) { /* the union of the rows' inputs */
			bool any = false;

			for (uint32_t r = 0; r < B; r++)
				any |= fabsf(x[(size_t)r * n_in + i]) > thr;
			uni += any;
		}
		for (size_t i = 0; i < (size_t)n_in * B; i++)
			xm[i] = fabsf(x[i]) > thr ? x[i] : 0.0f;
		for (int r = 0; r < reps && r < 64; r++) {
			double t0;

			flush();
			t0 = hyb_now();
			act = 0;
			for (uint32_t b = 0; b < B; b++)
				act += hyb_teal_gemv(pool, m, x + (size_t)b * n_in, thr, idx, val,
						     y + (size_t)b * n_out);
			t1[r] = hyb_now() - t0;
			flush();
			t0 = hyb_now();
			hyb_teal_gemv_rows(pool, m, x, n_in, B, thr, idx, val, n_act, y, n_out);
			tr[r] = hyb_now() - t0;
			flush();
			t0 = hyb_now();
			for (uint32_t b = 0; b < B; b++)
				k->quantize_act[hyb_vec_dot_type(type)](xm + (size_t)b * n_in,
									(char *)xq + b * xqs, n_in);
			struct dense_job j = { .fn = hyb_gemm_pick(k, type, n_out), .w = w, .rb = rb,
					       .n_out = n_out, .n_in = n_in, .xq = xq, .xqs = xqs,
					       .cols = B, .y = y };
			atomic_init(&j.next, 0);
			hyb_threadpool_run_dynamic(pool, dense_worker, &j);
			td[r] = hyb_now() - t0;
			r1[r] = t1[r] / tr[r];
			rd[r] = td[r] / tr[r];
		}
		const double ub = (double)uni * hyb_row_bytes(type, n_out);
		const double t = median(tr, reps);

		printf("  sparsity %.2f (union %.2f): one by one %7.1f us, rows %7.1f us (%5.1f "
		       "GB/s of the union, %.0f%% of DRAM read), dense GEMM %7.1f us: rows %.2fx "
		       "one by one, %.2fx dense (bound from bytes %.2fx)\n",
		       1.0 - (double)act / B / n_in, (double)uni / n_in, median(t1, reps) * 1e6,
		       t * 1e6, ub / t / 1e9, 100 * ub / t / bw, median(td, reps) * 1e6,
		       median(r1, reps), median(rd, reps), (double)n_in / uni);
	}
	free(xm);
}

static void run(uint32_t type, uint32_t n_in, uint32_t n_out, int nth, int reps,
		const double *sp, int n_sp, double bw, uint32_t B)
{
	const struct hyb_cpu_kernels *k = hyb_cpu_best();
	struct hyb_threadpool *pool = hyb_threadpool_new(nth);
	const uint64_t rb = hyb_row_bytes(type, n_in);
	const uint64_t rbt = (hyb_row_bytes(type, n_out) + 63) & ~63ull;
	char *w = aligned_alloc(64, rb * n_out), *wt = aligned_alloc(64, rbt * n_in);
	float *row = malloc(sizeof(float) * (n_in > n_out ? n_in : n_out));
	float *col = malloc(sizeof(float) * n_in * 32), *x = malloc(sizeof(float) * n_in * B);
	float *ax = malloc(sizeof(float) * n_in * B), *y = malloc(sizeof(float) * n_out * B);
	float *val = malloc(sizeof(float) * n_in * B);
	uint32_t *idx = malloc(sizeof(uint32_t) * n_in * B), n_acts[64];
	const uint64_t xqs = hyb_row_bytes(hyb_vec_dot_type(type), n_in);
	void *xq = aligned_alloc(64, xqs * B + 64);
	struct hyb_teal_mat m = { .type = type, .n_in = n_in, .n_out = n_out, .row_bytes = rbt,
				  .data = wt };

	if (!pool || !w || !wt || !row || !col || !x || !ax || !y || !val || !idx || !xq) {
		fprintf(stderr, "bench_teal: out of memory\n");
		exit(1);
	}
	/* the same matrix both ways: W rows, and W^T rows built from them 32 outputs at a time */
	for (uint32_t o = 0; o < n_out; o += 32) {
		for (uint32_t r = 0; r < 32; r++) {
			for (uint32_t i = 0; i < n_in; i++)
				row[i] = urand() * 0.05f;
			hyb_quantize_row_ref(type, row, w + (uint64_t)(o + r) * rb, n_in);
			k->dequantize[type](w + (uint64_t)(o + r) * rb, col + (size_t)r * n_in,
					    n_in);
		}
		for (uint32_t i = 0; i < n_in; i++) {
			float v[32];

			for (uint32_t r = 0; r < 32; r++)
				v[r] = col[(size_t)r * n_in + i];
			hyb_quantize_row_ref(type, v, wt + (uint64_t)i * rbt +
						      hyb_row_bytes(type, o), 32);
		}
	}
	for (uint32_t i = 0; i < n_in * B; i++) /* Laplacian-like, as TEAL §3 finds */
		x[i] = logf(fabsf(urand()) + 1e-6f) * (urand() < 0 ? -1.0f : 1.0f);
	for (uint32_t i = 0; i < n_in; i++)
		ax[i] = fabsf(x[i]);
	qsort(ax, n_in, sizeof(float), cmp_f);
	if (B > 1) {
		run_rows(pool, &m, w, rb, x, xq, xqs, y, idx, val, n_acts, B, ax, reps, sp, n_sp,
			 bw);
		goto out;
	}

	printf("%s %u -> %u, %d threads: dense %.1f MB\n", hyb_type_name(type), n_in, n_out, nth,
	       rb * n_out / 1e6);
	for (int s = 0; s < n_sp; s++) {
		const float thr = sp[s] > 0 ? ax[(size_t)(sp[s] * n_in) - 1] : -1.0f;
		double td[64], tt[64], ratio[64];
		uint32_t n_act = 0;

		for (int r = 0; r < reps && r < 64; r++) {
			struct dense_job j = { .fn = hyb_gemm_pick(k, type, n_out), .w = w, .rb = rb,
					       .n_out = n_out, .n_in = n_in, .xq = xq, .y = y };
			double t0;

			flush();
			t0 = hyb_now();
			k->quantize_act[hyb_vec_dot_type(type)](x, xq, n_in);
			atomic_init(&j.next, 0);
			hyb_threadpool_run_dynamic(pool, dense_worker, &j);
			td[r] = hyb_now() - t0;
			flush();
			t0 = hyb_now();
			n_act = hyb_teal_gemv(pool, &m, x, thr, idx, val, y);
			tt[r] = hyb_now() - t0;
			ratio[r] = td[r] / tt[r];
		}
		const double bytes = (double)n_act * hyb_row_bytes(type, n_out);
		const double d = median(td, reps), t = median(tt, reps);

		printf("  sparsity %.2f: dense %7.1f us (%5.1f GB/s), teal %7.1f us (%5.1f GB/s, "
		       "%.0f%% of DRAM read): %.2fx (bound %.2fx)\n", 1.0 - (double)n_act / n_in,
		       d * 1e6, rb * n_out / d / 1e9, t * 1e6, bytes / t / 1e9,
		       100 * bytes / t / bw, median(ratio, reps), (double)n_in / n_act);
	}
out:
	hyb_threadpool_free(pool);
	free(w);
	free(wt);
	free(row);
	free(col);
	free(x);
	free(ax);
	free(y);
	free(val);
	free(idx);
	free(xq);
}

int main(int argc, char **argv)
{
	uint32_t types[4] = { HYB_TYPE_F16, HYB_TYPE_Q8_0 }, n_types = 2;
	uint32_t n_in = 0, n_out = 0;
	int nth = 2, reps = 7, n_sp = 4;
	uint32_t rows = 1;
	double sp[MAX_S] = { 0, 0.3, 0.5, 0.7 };

	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--type")) {
			n_types = 1;
			types[0] = !strcmp(argv[i + 1], "F32")	  ? HYB_TYPE_F32
				   : !strcmp(argv[i + 1], "F16")  ? HYB_TYPE_F16
				   : !strcmp(argv[i + 1], "Q4_0") ? HYB_TYPE_Q4_0
								  : HYB_TYPE_Q8_0;
		} else if (!strcmp(argv[i], "--threads")) {
			nth = atoi(argv[i + 1]);
		} else if (!strcmp(argv[i], "--reps")) {
			reps = atoi(argv[i + 1]);
		} else if (!strcmp(argv[i], "--rows")) {
			rows = (uint32_t)atoi(argv[i + 1]);
		} else if (!strcmp(argv[i], "--in")) {
			n_in = (uint32_t)atoi(argv[i + 1]);
		} else if (!strcmp(argv[i], "--out")) {
			n_out = (uint32_t)atoi(argv[i + 1]);
		} else if (!strcmp(argv[i], "--sparsity")) {
			char *p = argv[i + 1];

			for (n_sp = 0; *p && n_sp < MAX_S; n_sp++) {
				sp[n_sp] = strtod(p, &p) / 100.0;
				p += *p == ',';
			}
		} else {
			fprintf(stderr, "usage: bench_teal [--type T] [--threads N] [--reps N] "
				"[--in N --out N] [--sparsity 0,30,50,70] [--rows B]\n");
			return 2;
		}
	}
	if (nth < 1 || reps < 1 || reps > 64 || rows < 1 || rows > HYB_TEAL_ROWS) {
		fprintf(stderr, "bench_teal: bad --threads, --reps or --rows\n");
		return 2;
	}
	flush_buf = malloc(flush_len);
	if (!flush_buf)
		return 1;
	memset(flush_buf, 1, flush_len);
	const double bw = hyb_measure_read_bw(nth, (size_t)512 << 20, 3);

	printf("DRAM read %.2f GB/s (%d threads); %s kernels\n", bw / 1e9, nth,
	       hyb_cpu_best()->name);
	for (uint32_t t = 0; t < n_types; t++) {
		if (n_in && n_out) {
			run(types[t], n_in, n_out, nth, reps, sp, n_sp, bw, rows);
			continue;
		}
		run(types[t], 4096, 22016, nth, reps, sp, n_sp, bw, rows);
		run(types[t], 11008, 4096, nth, reps, sp, n_sp, bw, rows);
	}
	free(flush_buf);
	return 0;
}
