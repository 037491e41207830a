// SPDX-License-Identifier: MIT
/*
 * The "cuda" device (kernels/cuda/device_cuda.cu, sparse_ffn.cu) against
 * the "cpu" device (libhyb/device_cpu.c) through hyb/device.h: the same op
 * sequences on both - bundles built by hyb_bundles_build, uploaded to
 * scrambled cache slots, random lists of resident neurons, every activation,
 * F16 / Q8_0 / Q4_0, y = and y +=, the 4096 x 11008 layer and small odd
 * shapes - give the same y within 1e-3 of its norm. Copies round trip on
 * every stream, events order streams, capacity gives -ENOMEM, a neuron of
 * a non-resident group faults the device. gpu_dev_timing prints the sparse
 * FFN's time and bandwidth at 10% active on 4096 x 11008. Skipped without a
 * GPU.
 */
#include <cuda_runtime_api.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_kernels.h"
#include "hyb/device.h"
#include "sparse_ffn.h"
#include "test.h"

#define MiB (1ull << 20)

/* ---- helpers --------------------------------------------------------------------- */

static uint64_t rng_state = 88172645463325252ull;

static uint64_t rnd(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return rng_state;
}

/* uniform in [-1, 1) */
static float rndf(void)
{
	return (float)((double)(rnd() >> 11) / (double)(1ull << 53) * 2 - 1);
}

static void need_gpu(void)
{
	if (hyb_cuda_device_count() == 0)
		SKIP("no CUDA device");
}

static struct hyb_device *open_kind(const char *kind, uint64_t capacity, uint64_t chunk)
{
	struct hyb_device_config cfg = { .capacity = capacity, .chunk_bytes = chunk };
	char err[256];
	struct hyb_device *d = hyb_device_open(kind, &cfg, err, sizeof(err));

	CHECK_MSG(d, "open %s: %s", kind, err);
	CHECK(!strcmp(hyb_device_kind(d), kind));
	return d;
}

#define OK(d, call)                                                                      \
	do {                                                                             \
		int rc_ = (call);                                                        \
		CHECK_MSG(rc_ == 0, "%s: %s -> %d (%s)", hyb_device_kind(d), #call, rc_, \
			  hyb_device_error(d));                                          \
	} while (0)

static hyb_dptr dalloc(struct hyb_device *d, uint64_t bytes)
{
	hyb_dptr p = 0;

	OK(d, hyb_device_alloc(d, bytes, &p));
	CHECK(p && p % 256 == 0);
	return p;
}

/* Wait for everything queued on s so far. */
static void drain(struct hyb_device *d, enum hyb_stream s)
{
	struct hyb_device_event *ev = hyb_device_event_new(d);

	CHECK_MSG(ev, "event: %s", hyb_device_error(d));
	OK(d, hyb_device_record(d, s, ev));
	OK(d, hyb_device_sync(d, ev));
	CHECK(hyb_device_done(d, ev));
	hyb_device_event_free(d, ev);
}

static double norm(const float *a, const float *b, uint32_t n)
{
	double s = 0;

	for (uint32_t i = 0; i < n; i++) {
		const double v = (double)a[i] - (b ? b[i] : 0.0);

		s += v * v;
	}
	return sqrt(s);
}

/* ---- a layer in a cache --------------------------------------------------------------- */

struct layer {
	uint32_t type, n_embd, n_ff, gs, n_groups, n_slots;
	uint64_t rb, slot_bytes;
	uint8_t *bundles;     /* hyb_bundles_build, bundle order */
	int32_t *table;       /* slot of group g, or -1 */
	float *gate;          /* the float matrices (for counting positive gates) */
};

/* gate, up [n_ff][n_embd], down [n_embd][n_ff], scaled so h and y stay near 1 */
static void make_mats(uint32_t n_embd, uint32_t n_ff, float **gate, float **up, float **down)
{
	const size_t n = (size_t)n_embd * n_ff;
	const float sc = 2.0f / sqrtf((float)n_embd), sd = 2.0f / sqrtf((float)n_ff);

	*gate = malloc(n * sizeof(float));
	*up = malloc(n * sizeof(float));
	*down = malloc(n * sizeof(float));
	CHECK(*gate && *up && *down);
	for (size_t i = 0; i < n; i++) {
		(*gate)[i] = rndf() * sc;
		(*up)[i] = rndf() * sc;
		(*down)[i] = rndf() * sd;
	}
}

/*
 * Bundles of `type`, slots scrambled over n_groups + spare slots, about
 * resident_pct of the groups resident (all when 100). slot_pad is added to
 * 3 * gs * rb (an odd pad makes F16 rows not 16-byte aligned).
 */
static void make_layer(struct layer *L, uint32_t type, uint32_t n_embd, uint32_t n_ff,
		       uint32_t gs, const float *gate, const float *up, const float *down,
		       int resident_pct, uint64_t slot_pad)
{
	char err[256];
	uint32_t *perm;

	memset(L, 0, sizeof(*L));
	L->type = type;
	L->n_embd = n_embd;
	L->n_ff = n_ff;
	L->gs = gs;
	L->gate = (float *)gate;
	L->rb = hyb_row_bytes(type, n_embd);
	CHECK(L->rb);
	L->n_groups = (n_ff + gs - 1) / gs;
	L->n_slots = L->n_groups + L->n_groups / 8 + 1;
	L->slot_bytes = 3ull * gs * L->rb + slot_pad;
	L->bundles = malloc(hyb_bundles_bytes(type, n_embd, n_ff));
	L->table = malloc(sizeof(int32_t) * L->n_groups);
	perm = malloc(sizeof(uint32_t) * L->n_slots);
	CHECK(L->bundles && L->table && perm);
	CHECK_MSG(!hyb_bundles_build(type, n_embd, n_ff, gs, gate, up, down, NULL, L->bundles, err,
				     sizeof(err)), "%s", err);
	for (uint32_t i = 0; i < L->n_slots; i++)
		perm[i] = i;
	for (uint32_t i = L->n_slots - 1; i > 0; i--) {
		uint32_t j = (uint32_t)(rnd() % (i + 1)), t = perm[i];

		perm[i] = perm[j];
		perm[j] = t;
	}
	for (uint32_t g = 0; g < L->n_groups; g++)
		L->table[g] = (int)(rnd() % 100) < resident_pct ? (int32_t)perm[g] : -1;
	free(perm);
}

static void free_layer(struct layer *L)
{
	free(L->bundles);
	free(L->table);
}

/* A random strictly increasing list of resident neurons, about pct % of them. */
static uint32_t make_active(const struct layer *L, double pct, uint32_t *out)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < L->n_ff; i++)
		if (L->table[i / L->gs] >= 0 && (double)(rnd() % 1000000) < pct * 1e4)
			out[n++] = i;
	return n;
}

/* One device's copy of a layer and the vectors of a call. */
struct side {
	struct hyb_device *d;
	hyb_dptr cache, table, xn, active, y;
};

static void upload(struct side *s, struct hyb_device *d, const struct layer *L)
{
	s->d = d;
	s->cache = dalloc(d, (uint64_t)L->n_slots * L->slot_bytes);
	s->table = dalloc(d, 4ull * L->n_groups);
	s->xn = dalloc(d, 4ull * L->n_embd);
	s->y = dalloc(d, 4ull * L->n_embd);
	s->active = dalloc(d, 4ull * L->n_ff);
	for (uint32_t g = 0; g < L->n_groups; g++) {
		const uint64_t g0 = (uint64_t)g * L->gs;
		const uint64_t ng = L->n_ff - g0 < L->gs ? L->n_ff - g0 : L->gs;

		if (L->table[g] < 0)
			continue;
		OK(d, hyb_device_h2d(d, HYB_STREAM_RELOAD,
				     s->cache + (uint64_t)L->table[g] * L->slot_bytes,
				     L->bundles + 3 * g0 * L->rb, 3 * ng * L->rb));
	}
	OK(d, hyb_device_h2d(d, HYB_STREAM_RELOAD, s->table, L->table, 4ull * L->n_groups));
	drain(d, HYB_STREAM_RELOAD);
}

static void release(struct side *s)
{
	hyb_device_free(s->d, s->cache);
	hyb_device_free(s->d, s->table);
	hyb_device_free(s->d, s->xn);
	hyb_device_free(s->d, s->y);
	hyb_device_free(s->d, s->active);
}

static struct hyb_dev_ffn ffn_of(const struct side *s, const struct layer *L,
				 enum hyb_ffn_act act, uint32_t n_active, bool acc)
{
	return (struct hyb_dev_ffn){
		.type = L->type, .n_embd = L->n_embd, .n_ff = L->n_ff, .group_size = L->gs,
		.act = act, .table = s->table, .cache = s->cache, .slot_bytes = L->slot_bytes,
		.xn = s->xn, .active = s->active, .n_active = n_active, .y = s->y,
		.accumulate = acc,
	};
}

/* y of one call: xn, active and y0 go up on CRITICAL, the kernel runs on COMPUTE after them */
static void run_ffn(struct side *s, const struct layer *L, enum hyb_ffn_act act,
		    const float *xn, const uint32_t *active, uint32_t n_active, const float *y0,
		    bool acc, float *y)
{
	struct hyb_device *d = s->d;
	struct hyb_device_event *in = hyb_device_event_new(d);
	struct hyb_dev_ffn f = ffn_of(s, L, act, n_active, acc);

	CHECK(in);
	OK(d, hyb_device_h2d(d, HYB_STREAM_CRITICAL, s->xn, xn, 4ull * L->n_embd));
	if (n_active)
		OK(d, hyb_device_h2d(d, HYB_STREAM_CRITICAL, s->active, active, 4ull * n_active));
	OK(d, hyb_device_h2d(d, HYB_STREAM_CRITICAL, s->y, y0, 4ull * L->n_embd));
	OK(d, hyb_device_record(d, HYB_STREAM_CRITICAL, in));
	OK(d, hyb_device_wait(d, HYB_STREAM_COMPUTE, in));
	OK(d, hyb_device_sparse_ffn(d, HYB_STREAM_COMPUTE, &f));
	OK(d, hyb_device_d2h(d, HYB_STREAM_COMPUTE, y, s->y, 4ull * L->n_embd));
	drain(d, HYB_STREAM_COMPUTE);
	hyb_device_event_free(d, in);
}

/*
 * Both devices, every activation, y = and y +=, a few activity levels:
 * the results agree within 1e-3 of the norm of what the call added, and
 * the CUDA result is the same bit for bit when run again.
 */
static void compare_layer(struct hyb_device *gpu, struct hyb_device *cpu, const struct layer *L,
			  const enum hyb_ffn_act *acts, int n_acts)
{
	const double pcts[] = { 10, 35, 100 };
	struct side sg, sc;
	uint32_t *active = malloc(sizeof(uint32_t) * L->n_ff);
	float *xn = malloc(4ull * L->n_embd), *y0 = malloc(4ull * L->n_embd);
	float *yg = malloc(4ull * L->n_embd), *yc = malloc(4ull * L->n_embd);
	float *yg2 = malloc(4ull * L->n_embd);
	double worst = 0;

	CHECK(active && xn && y0 && yg && yc && yg2);
	upload(&sg, gpu, L);
	upload(&sc, cpu, L);
	for (int a = 0; a < n_acts; a++) {
		for (int p = 0; p < 3; p++) {
			for (int acc = 0; acc < 2; acc++) {
				const uint32_t n = make_active(L, pcts[p], active);

				for (uint32_t i = 0; i < L->n_embd; i++) {
					xn[i] = rndf();
					y0[i] = acc ? rndf() : 12345.0f; /* must be overwritten */
				}
				run_ffn(&sc, L, acts[a], xn, active, n, y0, acc, yc);
				run_ffn(&sg, L, acts[a], xn, active, n, y0, acc, yg);
				run_ffn(&sg, L, acts[a], xn, active, n, y0, acc, yg2);

				const double ref = norm(yc, acc ? y0 : NULL, L->n_embd);
				const double diff = norm(yg, yc, L->n_embd);

				CHECK_MSG(diff <= 1e-3 * ref + 1e-6,
					  "%s %ux%u gs %u act %d %u active%s: |cuda - cpu| %g, "
					  "|y| %g", hyb_type_name(L->type), L->n_embd, L->n_ff,
					  L->gs, (int)acts[a], n, acc ? " (+=)" : "", diff, ref);
				CHECK_MSG(!memcmp(yg, yg2, 4ull * L->n_embd),
					  "cuda: two runs of one call differ");
				if (ref > 0 && diff / ref > worst)
					worst = diff / ref;
			}
		}
	}
	printf("    %s %ux%u gs %u: worst |cuda - cpu| / |y| = %.2g\n", hyb_type_name(L->type),
	       L->n_embd, L->n_ff, L->gs, worst);
	/* no neuron listed: y = 0, or y unchanged */
	for (uint32_t i = 0; i < L->n_embd; i++)
		y0[i] = rndf();
	run_ffn(&sg, L, acts[0], xn, active, 0, y0, false, yg);
	CHECK(norm(yg, NULL, L->n_embd) == 0);
	run_ffn(&sg, L, acts[0], xn, active, 0, y0, true, yg);
	CHECK(!memcmp(yg, y0, 4ull * L->n_embd));
	release(&sg);
	release(&sc);
	free(active);
	free(xn);
	free(y0);
	free(yg);
	free(yc);
	free(yg2);
}

static void compare_shape(uint32_t type, uint32_t n_embd, uint32_t n_ff, uint32_t gs,
			  int resident_pct, uint64_t slot_pad)
{
	static const enum hyb_ffn_act all[] = { HYB_ACT_SILU, HYB_ACT_RELU, HYB_ACT_RELU2,
						 HYB_ACT_DRELU };
	struct hyb_device *gpu, *cpu;
	float *gate, *up, *down;
	struct layer L;

	need_gpu();
	gpu = open_kind("cuda", 2048 * MiB, 64 * 1024);
	cpu = open_kind("cpu", 2048 * MiB, 0);
	make_mats(n_embd, n_ff, &gate, &up, &down);
	make_layer(&L, type, n_embd, n_ff, gs, gate, up, down, resident_pct, slot_pad);
	compare_layer(gpu, cpu, &L, all, n_embd * n_ff > 1000000 ? 2 : 4);
	free_layer(&L);
	free(gate);
	free(up);
	free(down);
	hyb_device_close(gpu);
	hyb_device_close(cpu);
}

TEST(gpu_dev_ffn_f16_4096x11008) { compare_shape(HYB_TYPE_F16, 4096, 11008, 32, 85, 0); }
TEST(gpu_dev_ffn_q8_0_4096x11008) { compare_shape(HYB_TYPE_Q8_0, 4096, 11008, 32, 85, 0); }
TEST(gpu_dev_ffn_q4_0_4096x11008) { compare_shape(HYB_TYPE_Q4_0, 4096, 11008, 32, 85, 0); }
/* odd shapes: partial last groups, n_embd not a multiple of a tile, unaligned F16 rows */
TEST(gpu_dev_ffn_f16_odd)
{
	compare_shape(HYB_TYPE_F16, 100, 1000, 24, 80, 6);
	compare_shape(HYB_TYPE_F16, 4096, 333, 7, 70, 2);
	compare_shape(HYB_TYPE_F16, 264, 77, 32, 100, 16);
}
TEST(gpu_dev_ffn_q8_0_odd)
{
	compare_shape(HYB_TYPE_Q8_0, 96, 1000, 24, 80, 2);
	compare_shape(HYB_TYPE_Q8_0, 4128, 333, 7, 70, 0);
	compare_shape(HYB_TYPE_Q8_0, 32, 77, 32, 100, 0);
}
TEST(gpu_dev_ffn_q4_0_odd)
{
	compare_shape(HYB_TYPE_Q4_0, 96, 1000, 24, 80, 2);
	compare_shape(HYB_TYPE_Q4_0, 4128, 333, 7, 70, 0);
	compare_shape(HYB_TYPE_Q4_0, 288, 77, 32, 100, 0);
}

/* ---- copies, events, capacity, add ------------------------------------------------- */

static void fill(uint8_t *p, uint64_t n, uint8_t seed)
{
	for (uint64_t i = 0; i < n; i++)
		p[i] = (uint8_t)(i * 131 + seed + (i >> 12));
}

TEST(gpu_dev_copies_round_trip)
{
	static const uint64_t lens[] = { 1, 255, 4096 + 3, MiB + 13, 5 * MiB + 7 };
	struct hyb_device *d;
	const uint64_t big = 6 * MiB;
	uint8_t *pinned, *reg, *heap, *back;
	hyb_dptr buf;

	need_gpu();
	d = open_kind("cuda", 256 * MiB, 64 * 1024);
	pinned = hyb_device_host_alloc(d, big);
	CHECK_MSG(pinned && (uintptr_t)pinned % 64 == 0, "host alloc: %s", hyb_device_error(d));
	CHECK(!posix_memalign((void **)&reg, 4096, big));
	heap = malloc(big);
	back = malloc(big);
	CHECK(heap && back);
	OK(d, hyb_device_host_register(d, reg, big));
	CHECK(hyb_device_host_register(d, reg, big) < 0); /* already pinned */
	buf = dalloc(d, big + 4096);
	for (int s = 0; s < HYB_N_STREAMS; s++) {
		uint8_t *srcs[3] = { pinned, reg, heap };

		for (int k = 0; k < 3; k++) {
			for (size_t l = 0; l < sizeof(lens) / sizeof(lens[0]); l++) {
				const uint64_t off = 4096 - 17 * (uint64_t)(l + 1); /* odd device offsets */

				fill(srcs[k], lens[l], (uint8_t)(s * 16 + k * 4 + l));
				OK(d, hyb_device_h2d(d, s, buf + off, srcs[k], lens[l]));
				memset(back, 0xee, lens[l]);
				OK(d, hyb_device_d2h(d, s, back, buf + off, lens[l]));
				drain(d, s);
				CHECK_MSG(!memcmp(back, srcs[k], lens[l]),
					  "stream %d source %d: %llu bytes differ", s, k,
					  (unsigned long long)lens[l]);
			}
		}
	}
	/* h2d on one stream, d2h on another behind an event, into pinned memory */
	fill(heap, big, 99);
	OK(d, hyb_device_h2d(d, HYB_STREAM_RELOAD, buf, heap, big));
	{
		struct hyb_device_event *ev = hyb_device_event_new(d);

		CHECK(ev);
		OK(d, hyb_device_record(d, HYB_STREAM_RELOAD, ev));
		OK(d, hyb_device_wait(d, HYB_STREAM_CRITICAL, ev));
		OK(d, hyb_device_d2h(d, HYB_STREAM_CRITICAL, pinned, buf, big));
		drain(d, HYB_STREAM_CRITICAL);
		CHECK(!memcmp(pinned, heap, big));
		hyb_device_event_free(d, ev);
	}
	struct hyb_device_stats st;

	hyb_device_stats(d, &st);
	CHECK(st.copies[HYB_STREAM_RELOAD] > 0 && st.h2d_bytes[HYB_STREAM_CRITICAL] > 0);
	OK(d, hyb_device_host_unregister(d, reg));
	CHECK(hyb_device_host_unregister(d, reg) < 0);
	/* beyond the allocation: refused before CUDA sees it */
	CHECK_EQ_INT(hyb_device_h2d(d, HYB_STREAM_COMPUTE, buf + big, heap, 8192), -EINVAL);
	hyb_device_free(d, buf);
	hyb_device_host_free(d, pinned);
	hyb_device_close(d);
	free(reg);
	free(heap);
	free(back);
}

/*
 * A 64 MiB upload on RELOAD (64 KiB chunks, several milliseconds), then a
 * read-back on COMPUTE that waits for it by an event: it sees only the new
 * bytes. An event never recorded is done; a recorded one becomes done.
 */
TEST(gpu_dev_events_order_streams)
{
	const uint64_t n = 64 * MiB;
	struct hyb_device *d;
	struct hyb_device_event *ev, *never;
	uint8_t *a, *b, *back;
	hyb_dptr buf;
	double t0;

	need_gpu();
	d = open_kind("cuda", 256 * MiB, 64 * 1024);
	a = hyb_device_host_alloc(d, n);
	b = hyb_device_host_alloc(d, n);
	back = hyb_device_host_alloc(d, n);
	ev = hyb_device_event_new(d);
	never = hyb_device_event_new(d);
	CHECK(a && b && back && ev && never);
	CHECK(hyb_device_done(d, never));
	OK(d, hyb_device_sync(d, never));
	OK(d, hyb_device_wait(d, HYB_STREAM_COMPUTE, never));
	memset(a, 0x11, n);
	memset(b, 0x22, n);
	buf = dalloc(d, n);
	for (int round = 0; round < 3; round++) {
		OK(d, hyb_device_h2d(d, HYB_STREAM_RELOAD, buf, a, n));
		drain(d, HYB_STREAM_RELOAD);
		OK(d, hyb_device_h2d(d, HYB_STREAM_RELOAD, buf, b, n));
		OK(d, hyb_device_record(d, HYB_STREAM_RELOAD, ev));
		OK(d, hyb_device_wait(d, HYB_STREAM_COMPUTE, ev));
		OK(d, hyb_device_d2h(d, HYB_STREAM_COMPUTE, back, buf, n));
		drain(d, HYB_STREAM_COMPUTE);
		CHECK(hyb_device_done(d, ev));
		CHECK_MSG(!memcmp(back, b, n), "round %d: the read-back overtook the upload",
			  round);
	}
	/* done() polls without blocking and turns true */
	OK(d, hyb_device_h2d(d, HYB_STREAM_RELOAD, buf, a, n));
	OK(d, hyb_device_record(d, HYB_STREAM_RELOAD, ev));
	t0 = hyb_device_now(d);
	while (!hyb_device_done(d, ev))
		CHECK(hyb_device_now(d) - t0 < 10);
	OK(d, hyb_device_sync(d, ev));
	hyb_device_event_free(d, ev);
	hyb_device_event_free(d, never);
	hyb_device_free(d, buf);
	hyb_device_host_free(d, a);
	hyb_device_host_free(d, b);
	hyb_device_host_free(d, back);
	hyb_device_close(d);
}

TEST(gpu_dev_capacity)
{
	struct hyb_device_config huge = { .capacity = 1ull << 50 };
	struct hyb_device *d;
	hyb_dptr p1, p2, p3;
	char err[256];

	need_gpu();
	CHECK(!hyb_device_open("cuda", &huge, err, sizeof(err)));
	CHECK_MSG(strstr(err, "capacity"), "%s", err);
	d = open_kind("cuda", 64 * MiB, 0);
	CHECK_EQ_INT(hyb_device_capacity(d), 64 * MiB);
	p1 = dalloc(d, 40 * MiB);
	CHECK_EQ_INT(hyb_device_alloc(d, 30 * MiB, &p2), -ENOMEM);
	p2 = dalloc(d, 24 * MiB - 1000);
	CHECK_EQ_INT(hyb_device_used(d), 64 * MiB - 1000);
	CHECK_EQ_INT(hyb_device_alloc(d, 4096, &p3), -ENOMEM);
	hyb_device_free(d, p1);
	p3 = dalloc(d, 39 * MiB); /* first fit: the freed range */
	CHECK(p3 == p1);
	p1 = dalloc(d, MiB);
	CHECK(p1 == p3 + 39 * MiB);
	hyb_device_free(d, p2);
	hyb_device_free(d, p3);
	hyb_device_free(d, p1);
	CHECK_EQ_INT(hyb_device_used(d), 0);
	p1 = dalloc(d, 64 * MiB); /* merged back into one range */
	hyb_device_free(d, p1);
	hyb_device_close(d);
	/* the default: most of the free memory */
	d = open_kind("cuda", 0, 0);
	CHECK(hyb_device_capacity(d) > 256 * MiB);
	hyb_device_close(d);
}

TEST(gpu_dev_add)
{
	const uint32_t n = 100003;
	struct hyb_device *d;
	float *x = malloc(4ull * n), *y = malloc(4ull * n), *out = malloc(4ull * n);
	hyb_dptr dx, dy;

	need_gpu();
	CHECK(x && y && out);
	d = open_kind("cuda", 64 * MiB, 0);
	dx = dalloc(d, 4ull * n);
	dy = dalloc(d, 4ull * n);
	for (uint32_t i = 0; i < n; i++) {
		x[i] = rndf();
		y[i] = rndf();
	}
	OK(d, hyb_device_h2d(d, HYB_STREAM_CRITICAL, dx, x, 4ull * n));
	OK(d, hyb_device_h2d(d, HYB_STREAM_CRITICAL, dy, y, 4ull * n));
	drain(d, HYB_STREAM_CRITICAL);
	OK(d, hyb_device_add(d, HYB_STREAM_COMPUTE, dy + 4, dx, n - 1)); /* y[1..] += x[..n-1) */
	OK(d, hyb_device_d2h(d, HYB_STREAM_COMPUTE, out, dy, 4ull * n));
	drain(d, HYB_STREAM_COMPUTE);
	CHECK(out[0] == y[0]);
	for (uint32_t i = 1; i < n; i++)
		CHECK(out[i] == y[i] + x[i - 1]);
	CHECK_EQ_INT(hyb_device_add(d, HYB_STREAM_COMPUTE, dy + 8, dx, n), -EINVAL);
	hyb_device_close(d);
	free(x);
	free(y);
	free(out);
}

/* A listed neuron whose group is not resident: the next sync fails and the device is faulted. */
TEST(gpu_dev_ffn_nonresident_faults)
{
	float *gate, *up, *down, xn[256] = { 0 };
	struct hyb_device *d;
	struct hyb_dev_ffn f;
	struct hyb_device_event *ev;
	struct layer L;
	struct side s;
	uint32_t bad = 0;

	need_gpu();
	d = open_kind("cuda", 64 * MiB, 0);
	make_mats(256, 256, &gate, &up, &down);
	make_layer(&L, HYB_TYPE_Q8_0, 256, 256, 32, gate, up, down, 100, 0);
	L.table[3] = -1;
	upload(&s, d, &L);
	bad = 3 * 32 + 5;
	OK(d, hyb_device_h2d(d, HYB_STREAM_COMPUTE, s.active, &bad, 4));
	OK(d, hyb_device_h2d(d, HYB_STREAM_COMPUTE, s.xn, xn, sizeof(xn)));
	f = ffn_of(&s, &L, HYB_ACT_SILU, 1, false);
	OK(d, hyb_device_sparse_ffn(d, HYB_STREAM_COMPUTE, &f));
	ev = hyb_device_event_new(d);
	CHECK(ev);
	OK(d, hyb_device_record(d, HYB_STREAM_COMPUTE, ev));
	CHECK_EQ_INT(hyb_device_sync(d, ev), -EIO);
	CHECK_MSG(strstr(hyb_device_error(d), "101"), "%s", hyb_device_error(d));
	CHECK_EQ_INT(hyb_device_sparse_ffn(d, HYB_STREAM_COMPUTE, &f), -EIO);
	hyb_device_event_free(d, ev);
	release(&s);
	hyb_device_close(d);
	free_layer(&L);
	free(gate);
	free(up);
	free(down);
}

/* ---- timing ------------------------------------------------------------------------------ */

/*
 * The sparse FFN at 10% active on the 4096 x 11008 layer, every group
 * resident: microseconds per call (200 calls queued back to back) and the
 * bandwidth of the bytes it reads (gate rows of the listed neurons, up and
 * down rows of those that pass the gate) against the device's HBM peak.
 */
TEST(gpu_dev_timing)
{
	static const uint32_t types[] = { HYB_TYPE_F16, HYB_TYPE_Q8_0, HYB_TYPE_Q4_0 };
	const uint32_t n_embd = 4096, n_ff = 11008, gs = 32, iters = 200;
	int clk_khz = 0, bus_bits = 0;
	float *gate, *up, *down, *xn, *y;
	uint32_t *active;
	struct hyb_device_event *ev;
	struct hyb_device *d;
	double peak;

	need_gpu();
	CHECK(cudaDeviceGetAttribute(&clk_khz, cudaDevAttrMemoryClockRate, 0) == cudaSuccess);
	CHECK(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, 0) ==
	      cudaSuccess);
	peak = 2.0 * clk_khz * 1e3 * bus_bits / 8 / 1e9;
	d = open_kind("cuda", 1024 * MiB, 0);
	ev = hyb_device_event_new(d);
	CHECK(ev);
	make_mats(n_embd, n_ff, &gate, &up, &down);
	xn = malloc(4ull * n_embd);
	y = malloc(4ull * n_embd);
	active = malloc(4ull * n_ff);
	CHECK(xn && y && active);
	for (uint32_t i = 0; i < n_embd; i++)
		xn[i] = rndf();
	for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
		struct layer L;
		struct side s;
		uint32_t n;

		make_layer(&L, types[t], n_embd, n_ff, gs, gate, up, down, 100, 0);
		upload(&s, d, &L);
		n = make_active(&L, 10, active);
		OK(d, hyb_device_h2d(d, HYB_STREAM_CRITICAL, s.xn, xn, 4ull * n_embd));
		OK(d, hyb_device_h2d(d, HYB_STREAM_CRITICAL, s.active, active, 4ull * n));
		drain(d, HYB_STREAM_CRITICAL);
		for (int a = 0; a < 2; a++) {
			const enum hyb_ffn_act act = a ? HYB_ACT_RELU : HYB_ACT_SILU;
			struct hyb_dev_ffn f = ffn_of(&s, &L, act, n, false);
			uint32_t pass = 0;
			double t0, dt, lat, bytes;

			/* neurons whose gate is positive (float weights: near enough for a count) */
			for (uint32_t i = 0; i < n; i++) {
				double g = 0;

				for (uint32_t e = 0; e < n_embd; e++)
					g += (double)gate[(size_t)active[i] * n_embd + e] * xn[e];
				pass += act == HYB_ACT_SILU || g > 0;
			}
			for (int w = 0; w < 10; w++)
				OK(d, hyb_device_sparse_ffn(d, HYB_STREAM_COMPUTE, &f));
			drain(d, HYB_STREAM_COMPUTE);
			t0 = hyb_device_now(d);
			for (uint32_t i = 0; i < iters; i++)
				OK(d, hyb_device_sparse_ffn(d, HYB_STREAM_COMPUTE, &f));
			drain(d, HYB_STREAM_COMPUTE);
			dt = (hyb_device_now(d) - t0) / iters;
			/* one call at a time: the latency a decode step sees, launches included */
			t0 = hyb_device_now(d);
			for (int i = 0; i < 50; i++) {
				OK(d, hyb_device_sparse_ffn(d, HYB_STREAM_COMPUTE, &f));
				OK(d, hyb_device_record(d, HYB_STREAM_COMPUTE, ev));
				OK(d, hyb_device_sync(d, ev));
			}
			lat = (hyb_device_now(d) - t0) / 50;
			bytes = ((double)n + 2.0 * pass) * L.rb;
			printf("    sparse ffn %-4s %-4s 4096x11008 %u active (%u pass the gate): "
			       "%6.1f us/call queued, %6.1f us alone, %6.3f MB read, %5.0f GB/s "
			       "(%4.1f%% of %.0f GB/s HBM)\n",
			       hyb_type_name(L.type), a ? "relu" : "silu", n, pass, dt * 1e6,
			       lat * 1e6, bytes / 1e6, bytes / dt / 1e9, 100 * bytes / dt / 1e9 / peak,
			       peak);
			OK(d, hyb_device_d2h(d, HYB_STREAM_COMPUTE, y, s.y, 4ull * n_embd));
			drain(d, HYB_STREAM_COMPUTE);
		}
		release(&s);
		free_layer(&L);
	}
	hyb_device_event_free(d, ev);
	hyb_device_close(d);
	free(gate);
	free(up);
	free(down);
	free(xn);
	free(y);
	free(active);
}
