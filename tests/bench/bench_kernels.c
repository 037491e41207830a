// SPDX-License-Identifier: MIT
/*
 * Kernel microbenchmark. For each weight type:
 *  - decode GEMV (ncols 1) on 11008x4096 and 4096x11008, with 1 and 2
 *    threads each taking a contiguous half of the rows, in GB/s of weights
 *    streamed, against a plain streaming read of a buffer of the same size
 *    measured in the same run (interleaved repetitions, medians). Several
 *    copies of each buffer are rotated so that nothing is served from L3;
 *    they are on huge pages where the kernel gives them, as the model
 *    loader's weights are. The ratio is the median of per-repetition
 *    ratios (on a shared machine the bandwidth a thread gets moves by 2x
 *    from one second to the next); "cpu" is the same ratio in thread CPU
 *    time (the slower thread's), which time slices lost to other processes
 *    do not enter.
 *  - prefill GEMM: a 4096x4096 weight times 64 columns on one thread, in
 *    GMAC/s of thread CPU time, against hyb_cpu_peak_macs() for the type
 *    (also CPU time), so that other processes' time slices do not count.
 *
 *   bench_kernels [--isa scalar|avx2|avx512|avx512vnni] [--type Q4_0] [--reps N]
 *                 [--cols N] [--no-gemv] [--no-gemm]
 */
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "blocks.h"
#include "cpu_kernels.h"

#define MAX_THREADS 2

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* CPU time of the calling thread: the single-thread GEMM is not charged for preemption */
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

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(double), cmp_double);
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* a buffer of whole 2 MiB pages, on huge pages where the kernel gives them */
static void *huge_alloc(size_t n)
{
	const size_t len = (n + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1);
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED) {
		fprintf(stderr, "bench_kernels: out of memory (%zu bytes)\n", n);
		exit(1);
	}
	madvise(p, len, MADV_HUGEPAGE);
	return p;
}

static void huge_free(void *p, size_t n)
{
	munmap(p, (n + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1));
}

static uint64_t rng = 88172645463325252ULL;

static uint32_t rnd(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)rng;
}

static void *xalloc(size_t n)
{
	void *p = aligned_alloc(64, (n + 63) & ~(size_t)63);

	if (!p) {
		fprintf(stderr, "bench_kernels: out of memory (%zu bytes)\n", n);
		exit(1);
	}
	return p;
}

/* Random but well-formed weights: random codes, block scales in a sane range. */
static void fill_weights(uint32_t type, uint8_t *w, size_t bytes)
{
	for (size_t i = 0; i < bytes; i += 4) {
		uint32_t r = rnd();

		memcpy(w + i, &r, bytes - i < 4 ? bytes - i : 4);
	}
	if (type == HYB_TYPE_F32) {
		for (size_t i = 0; i + 4 <= bytes; i += 4) {
			float f = (float)(int32_t)rnd() * 0x1p-31f;

			memcpy(w + i, &f, 4);
		}
		return;
	}
	if (type == HYB_TYPE_F16 || type == HYB_TYPE_BF16) {
		for (size_t i = 0; i + 2 <= bytes; i += 2) {
			uint16_t h = (uint16_t)(rnd() & 0xbfff);

			if (type == HYB_TYPE_BF16)
				h |= 0x0800;
			memcpy(w + i, &h, 2);
		}
		return;
	}
	const size_t bs = hyb_type_info(type)->size;
	/* where d (and Q4_K/Q5_K/Q2_K's dmin after it) sits in the block */
	const size_t doff = type == HYB_TYPE_Q6_K ? 208 : type == HYB_TYPE_Q3_K ? 108 :
			    type == HYB_TYPE_Q2_K ? 80 : 0;

	for (size_t off = 0; off + bs <= bytes; off += bs) {
		uint16_t d = (uint16_t)(0x2000 | (rnd() & 0x3ff));

		memcpy(w + off + doff, &d, 2);
		if (type == HYB_TYPE_Q4_K || type == HYB_TYPE_Q5_K || type == HYB_TYPE_Q2_K)
			memcpy(w + off + doff + 2, &d, 2);
	}
}

/* ---- a two-thread runner: workers wait on a barrier for each job ---- */

struct job {
	int kind; /* 0 read, 1 gemm */
	int nth;
	const uint8_t *buf;
	size_t bytes;
	const struct hyb_cpu_kernels *k;
	uint32_t type;
	int64_t kdim, nrows, ncols;
	size_t ws, xs;
	const void *x;
	float *y;
	volatile uint64_t sink[MAX_THREADS * 8];
	double cpu[MAX_THREADS * 8]; /* thread CPU seconds of each part */
};

static struct job g_job;
static pthread_barrier_t g_start, g_done;
static int g_quit;

/*
 * The reference streaming read: AVX-512 loads into four independent add
 * chains (the loads, not the adds, limit it), as a GEMV would issue them.
 * Plain 64-bit loads where the CPU has no AVX-512.
 */
__attribute__((target("avx512f"))) static uint64_t read_avx512(const uint8_t *p, size_t n)
{
	__m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
	size_t i = 0;

	for (; i + 256 <= n; i += 256) {
		a = _mm512_add_epi64(a, _mm512_load_si512(p + i));
		b = _mm512_add_epi64(b, _mm512_load_si512(p + i + 64));
		c = _mm512_add_epi64(c, _mm512_load_si512(p + i + 128));
		d = _mm512_add_epi64(d, _mm512_load_si512(p + i + 192));
	}
	uint64_t s = (uint64_t)_mm512_reduce_add_epi64(
		_mm512_add_epi64(_mm512_add_epi64(a, b), _mm512_add_epi64(c, d)));

	for (; i < n; i++)
		s += p[i];
	return s;
}

static uint64_t read_plain(const uint8_t *p, size_t n)
{
	const uint64_t *q = (const uint64_t *)p;
	uint64_t a = 0, b = 0, c = 0, d = 0, s;
	size_t i = 0;

	for (; i + 4 <= n / 8; i += 4) {
		a += q[i];
		b += q[i + 1];
		c += q[i + 2];
		d += q[i + 3];
	}
	s = a + b + c + d;
	for (i *= 8; i < n; i++)
		s += p[i];
	return s;
}

static int has_avx512;

static uint64_t read_all(const uint8_t *p, size_t n)
{
	return has_avx512 ? read_avx512(p, n) : read_plain(p, n);
}

static void run_part(int ith)
{
	struct job *j = &g_job;
	const double t0 = thread_now();

	if (ith >= j->nth)
		return;
	if (j->kind == 0) {
		size_t per = (j->bytes / j->nth) & ~(size_t)127;
		size_t lo = per * ith, hi = ith == j->nth - 1 ? j->bytes : lo + per;

		j->sink[ith * 8] = read_all(j->buf + lo, hi - lo);
	} else {
		int64_t per = (j->nrows / j->nth + 3) & ~(int64_t)3;
		int64_t lo = per * ith, hi = ith == j->nth - 1 ? j->nrows : lo + per;

		if (hi > j->nrows)
			hi = j->nrows;
		if (hi > lo)
			j->k->gemm[j->type](j->kdim, j->buf + (size_t)lo * j->ws, j->ws, hi - lo,
					    j->x, j->xs, j->ncols, j->y + lo, (size_t)j->nrows);
	}
	j->cpu[ith * 8] = thread_now() - t0;
}

static void *worker(void *arg)
{
	const int ith = (int)(intptr_t)arg;
	cpu_set_t set;

	CPU_ZERO(&set);
	CPU_SET(ith, &set);
	pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
	for (;;) {
		pthread_barrier_wait(&g_start);
		if (g_quit)
			return NULL;
		run_part(ith);
		pthread_barrier_wait(&g_done);
	}
}

/*
 * runs g_job on nth threads (the main thread is thread 0), returns seconds;
 * *cpu: the largest thread CPU time of the parts
 */
static double run_job(int nth, double *cpu)
{
	double t;

	g_job.nth = nth;
	t = now();
	pthread_barrier_wait(&g_start);
	run_part(0);
	pthread_barrier_wait(&g_done);
	t = now() - t;
	*cpu = 0;
	for (int i = 0; i < nth; i++)
		if (g_job.cpu[i * 8] > *cpu)
			*cpu = g_job.cpu[i * 8];
	return t;
}

/* ---- measurements ---- */

struct opts {
	int reps, cols, gemv, gemm;
	const char *type;
};

static void bench_gemv(const struct hyb_cpu_kernels *k, uint32_t type, int64_t kdim,
		       int64_t nrows, const struct opts *o)
{
	const size_t rb = hyb_row_bytes(type, (uint64_t)kdim), bytes = rb * (size_t)nrows;
	/* enough copies that the rotation cycles through > 100 MB: no L3 reuse */
	const int ncopy = (int)(100000000 / bytes) + 2;
	uint8_t **w = calloc((size_t)ncopy, sizeof(*w)), **rd = calloc((size_t)ncopy, sizeof(*rd));
	const uint32_t at = hyb_vec_dot_type(type);
	float *xf = xalloc((size_t)kdim * sizeof(float));
	void *x = xalloc(hyb_row_bytes(at, (uint64_t)kdim));
	float *y = xalloc((size_t)nrows * sizeof(float));
	double *tr = calloc((size_t)o->reps, sizeof(double)), *tg = calloc((size_t)o->reps, 8);
	double *rw = calloc((size_t)o->reps, sizeof(double)), *rc = calloc((size_t)o->reps, 8);

	if (!w || !rd || !tr || !tg || !rw || !rc) {
		fprintf(stderr, "bench_kernels: out of memory\n");
		exit(1);
	}
	for (int i = 0; i < ncopy; i++) {
		w[i] = huge_alloc(bytes);
		rd[i] = huge_alloc(bytes);
		fill_weights(type, w[i], bytes);
		memset(rd[i], i + 1, bytes);
	}
	for (int64_t i = 0; i < kdim; i++)
		xf[i] = (float)(int32_t)rnd() * 0x1p-31f;
	k->quantize_act[at](xf, x, kdim);
	for (int nth = 1; nth <= MAX_THREADS; nth++) {
		int c = 0;

		for (int r = -1; r < o->reps; r++) { /* r = -1: warm-up */
			double c0, c1;

			g_job = (struct job){ .kind = 0, .buf = rd[c], .bytes = bytes };
			double t0 = run_job(nth, &c0);

			g_job = (struct job){ .kind = 1, .buf = w[c], .k = k, .type = type,
					      .kdim = kdim, .nrows = nrows, .ncols = 1, .ws = rb,
					      .x = x, .xs = 0, .y = y };
			double t1 = run_job(nth, &c1);

			c = (c + 1) % ncopy;
			if (r >= 0) {
				tr[r] = t0;
				tg[r] = t1;
				rw[r] = t0 / t1;
				rc[r] = c0 / c1;
			}
		}
		const double bw_read = bytes / median(tr, o->reps) / 1e9;
		const double bw_gemv = bytes / median(tg, o->reps) / 1e9;

		printf("  gemv %5lldx%-5lld %d thr: %6.2f GB/s  read %6.2f GB/s  ratio %5.1f%%"
		       "  cpu %5.1f%%\n", (long long)nrows, (long long)kdim, nth, bw_gemv, bw_read,
		       100 * median(rw, o->reps), 100 * median(rc, o->reps));
		fflush(stdout);
	}
	for (int i = 0; i < ncopy; i++) {
		huge_free(w[i], bytes);
		huge_free(rd[i], bytes);
	}
	free(w);
	free(rd);
	free(xf);
	free(x);
	free(y);
	free(tr);
	free(tg);
	free(rw);
	free(rc);
}

static void bench_gemm(const struct hyb_cpu_kernels *k, uint32_t type, int64_t kdim,
		       int64_t nrows, const struct opts *o)
{
	const int64_t ncols = o->cols;
	const size_t rb = hyb_row_bytes(type, (uint64_t)kdim);
	const uint32_t at = hyb_vec_dot_type(type);
	const size_t xs = hyb_row_bytes(at, (uint64_t)kdim);
	uint8_t *w = xalloc(rb * (size_t)nrows), *x = xalloc(xs * (size_t)ncols);
	float *xf = xalloc((size_t)kdim * sizeof(float));
	float *y = xalloc((size_t)nrows * (size_t)ncols * sizeof(float));
	double *t = calloc((size_t)o->reps, sizeof(double));
	const double peak = hyb_cpu_peak_macs(k, type);

	fill_weights(type, w, rb * (size_t)nrows);
	for (int64_t c = 0; c < ncols; c++) {
		for (int64_t i = 0; i < kdim; i++)
			xf[i] = (float)(int32_t)rnd() * 0x1p-31f;
		k->quantize_act[at](xf, x + (size_t)c * xs, kdim);
	}
	for (int r = -1; r < o->reps; r++) {
		double t0 = thread_now();

		k->gemm[type](kdim, w, rb, nrows, x, xs, ncols, y, (size_t)nrows);
		t0 = thread_now() - t0;
		if (r >= 0)
			t[r] = t0;
	}
	const double macs = (double)kdim * nrows * ncols / median(t, o->reps);

	printf("  gemm %lldx%lld x %lld cols, 1 thr: %7.2f GMAC/s  peak %7.2f  ratio %5.1f%%\n",
	       (long long)nrows, (long long)kdim, (long long)ncols, macs / 1e9, peak / 1e9,
	       100 * macs / peak);
	fflush(stdout);
	free(w);
	free(x);
	free(xf);
	free(y);
	free(t);
}

int main(int argc, char **argv)
{
	static const uint32_t types[] = { HYB_TYPE_Q8_0, HYB_TYPE_Q4_0, HYB_TYPE_Q4_K,
					  HYB_TYPE_Q6_K, HYB_TYPE_Q5_K, HYB_TYPE_Q3_K,
					  HYB_TYPE_Q2_K, HYB_TYPE_IQ4_XS, HYB_TYPE_IQ4_NL,
					  HYB_TYPE_F16,
					  HYB_TYPE_BF16, HYB_TYPE_F32 };
	struct opts o = { .reps = 7, .cols = 64, .gemv = 1, .gemm = 1 };
	const struct hyb_cpu_kernels *k = hyb_cpu_best();
	pthread_t th[MAX_THREADS];

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--isa") && i + 1 < argc) {
			const char *n = argv[++i];

			k = NULL;
			for (int l = 0; l < HYB_ISA_COUNT; l++)
				if (!strcmp(n, hyb_isa_name((enum hyb_isa)l)))
					k = hyb_cpu_kernels((enum hyb_isa)l);
			if (!k) {
				fprintf(stderr, "bench_kernels: ISA '%s' unknown or not on this CPU\n",
					n);
				return 1;
			}
		} else if (!strcmp(argv[i], "--type") && i + 1 < argc) {
			o.type = argv[++i];
		} else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
			o.reps = atoi(argv[++i]);
		} else if (!strcmp(argv[i], "--cols") && i + 1 < argc) {
			o.cols = atoi(argv[++i]);
		} else if (!strcmp(argv[i], "--no-gemv")) {
			o.gemv = 0;
		} else if (!strcmp(argv[i], "--no-gemm")) {
			o.gemm = 0;
		} else {
			fprintf(stderr, "usage: %s [--isa NAME] [--type T] [--reps N] [--cols N]"
				" [--no-gemv] [--no-gemm]\n", argv[0]);
			return 1;
		}
	}
	if (o.reps < 1 || o.cols < 1) {
		fprintf(stderr, "bench_kernels: --reps and --cols must be positive\n");
		return 1;
	}
	__builtin_cpu_init();
	has_avx512 = __builtin_cpu_supports("avx512f");
	pthread_barrier_init(&g_start, NULL, MAX_THREADS);
	pthread_barrier_init(&g_done, NULL, MAX_THREADS);
	for (int i = 1; i < MAX_THREADS; i++)
		pthread_create(&th[i], NULL, worker, (void *)(intptr_t)i);
	{
		cpu_set_t set;

		CPU_ZERO(&set);
		CPU_SET(0, &set);
		pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
	}
	printf("kernels: %s; medians of %d repetitions; streaming read with %s loads\n",
	       k->name, o.reps, has_avx512 ? "AVX-512" : "64-bit");
	for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
		if (o.type && strcmp(o.type, hyb_type_name(types[i])))
			continue;
		printf("%s\n", hyb_type_name(types[i]));
		if (o.gemv) {
			bench_gemv(k, types[i], 4096, 11008, &o);
			bench_gemv(k, types[i], 11008, 4096, &o);
		}
		if (o.gemm)
			bench_gemm(k, types[i], 4096, 4096, &o);
	}
	g_quit = 1;
	pthread_barrier_wait(&g_start);
	for (int i = 1; i < MAX_THREADS; i++)
		pthread_join(th[i], NULL);
	return 0;
}
