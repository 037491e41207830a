// SPDX-License-Identifier: MIT
/*
 * The "cuda" device (libhyb/device/device_cuda.cu, sparse_ffn.cu) against
 * the "cpu" device (libhyb/device/device_cpu.c) through hyb/device.h: the same op
 * sequences on both - bundles built by hyb_bundles_build, uploaded to
 * scrambled cache slots, random lists of resident neurons, every activation,
 * F16 / Q8_0 / Q4_0, y = and y +=, the 4096 x 11008 layer and small odd
 * shapes - give the same y within 1e-3 of its norm. Copies round trip on
 * every stream, events order streams, capacity gives -ENOMEM, a neuron of
 * a non-resident group faults the device. gpu_dev_timing prints the sparse
 * FFN's time and bandwidth at 10% active on 4096 x 11008.
 *
 * The dense kernels (kernels/cuda/dense.cu) against the CPU device on the
 * same inputs: rmsnorm (to 2 ulp); matvec for F32 / F16 / Q8_0 / Q4_0 and
 * the K-quants Q4_K / Q6_K, y = and y +=, 4096 x 4096, 4099 x 4096, 4096 x
 * 11008 and small unaligned shapes (float summation order only; x staged as
 * Q8_0 / Q8_K to the CPU's bits); attention with 32/8 and 32/32 heads
 * of 128, positions 0, 1, 511, 2047, normal and neox RoPE, and odd shapes
 * (roped q, k and the stored cache row to the bit; out against an exact
 * double reference and the CPU's F16-accumulated result).
 * gpu_dev_dense_timing prints the Q4_0 / Q4_K / Q6_K matvecs' and the
 * attention's time and bandwidth. HYB_GPU_TEST_SMALL=1 shrinks the dense shapes (for a host
 * emulation of CUDA). Skipped without a GPU.
 */
#include <cuda_runtime_api.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu_kernels.h"
#include "cuda_kernels.h"
#include "gpu_test.h"
#include "hyb/device.h"
#include "forward/ops.h"
#include "sparse/sparse_op.h"
#include "test.h"

#define MiB (1ull << 20)

static const struct hyb_rope plain_rope = { .base = 10000.0f, .freq_scale = 1.0f,
					    .attn_factor = 1.0f };
/* YaRN-scaled angles (the host computes the table the device rotates with) */
static const struct hyb_rope yarn_rope = { .base = 10000.0f, .freq_scale = 0.25f,
					   .ext_factor = 1.0f, .attn_factor = 0.9f,
					   .corr_dims = { 4, 24 } };

/* ---- helpers --------------------------------------------------------------------- */

static struct hyb_device *open_kind(const char *kind, uint64_t capacity, uint64_t chunk)
{
	struct hyb_device_config cfg = { .capacity = capacity, .chunk_bytes = chunk };
	struct hyb_device *d = hyb_device_open(kind, &cfg);

	CHECK_MSG(d, "open %s: %s", kind, hyb_last_error());
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

/* CATS threshold of the calls (SiLU and GeGLU only; 0: none) */
static float ffn_thr;

static struct hyb_dev_ffn ffn_of(const struct side *s, const struct layer *L,
				 enum hyb_ffn_act act, uint32_t n_active, bool acc)
{
	return (struct hyb_dev_ffn){
		.type = L->type, .n_embd = L->n_embd, .n_ff = L->n_ff, .group_size = L->gs,
		.act = act, .thr = act == HYB_ACT_SILU || act == HYB_ACT_GELU ? ffn_thr : 0,
		.table = s->table, .cache = s->cache, .slot_bytes = L->slot_bytes,
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
	static const enum hyb_ffn_act all[] = { HYB_ACT_SILU, HYB_ACT_GELU, HYB_ACT_RELU,
						 HYB_ACT_RELU2, HYB_ACT_DRELU };
	struct hyb_device *gpu, *cpu;
	float *gate, *up, *down;
	struct layer L;

	need_gpu();
	gpu = open_kind("cuda", 2048 * MiB, 64 * 1024);
	cpu = open_kind("cpu", 2048 * MiB, 0);
	make_mats(n_embd, n_ff, &gate, &up, &down);
	make_layer(&L, type, n_embd, n_ff, gs, gate, up, down, resident_pct, slot_pad);
	compare_layer(gpu, cpu, &L, all, n_embd * n_ff > 1000000 ? 2 : 5);
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
/*
 * The types the kernels run through kernels/cuda/deq8.h (gen_dot.h): a
 * quarter of the 7B shape for each (the reference quantizers of the
 * K-quants are slow on the host: the full shape would take minutes of the
 * device's time), an unaligned slot pad (rows 2-byte aligned only) and a
 * small shape of a few blocks.
 */
TEST(gpu_dev_ffn_other_types)
{
	static const uint32_t types[] = { HYB_TYPE_Q4_1, HYB_TYPE_Q5_0, HYB_TYPE_Q5_1,
					  HYB_TYPE_IQ4_NL, HYB_TYPE_Q2_K, HYB_TYPE_Q3_K,
					  HYB_TYPE_Q4_K, HYB_TYPE_Q5_K, HYB_TYPE_Q6_K,
					  HYB_TYPE_IQ4_XS };

	for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
		compare_shape(types[i], 2048, 2752, 32, 85, 0);
		compare_shape(types[i], 512, 1000, 24, 80, 2);
		compare_shape(types[i], 256, 77, 32, 100, 0);
	}
}

/* CATS on SiLU and GeGLU (Gemma's FFN, with ggml's F16 GELU table on the device) */
TEST(gpu_dev_ffn_cats_silu_and_geglu)
{
	ffn_thr = 0.05f;
	compare_shape(HYB_TYPE_Q8_0, 640, 2048, 32, 85, 0);
	compare_shape(HYB_TYPE_Q4_K, 512, 1000, 24, 80, 2);
	compare_shape(HYB_TYPE_F16, 264, 77, 32, 100, 16);
	ffn_thr = 0;
}

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
	/*
	 * done() polls without blocking and turns true; a poll that said "not
	 * yet" leaves no error behind for the next launch (the decode loop
	 * polls loads and then launches kernels in the same step)
	 */
	bool saw_busy = false;

	OK(d, hyb_device_h2d(d, HYB_STREAM_RELOAD, buf, a, n));
	OK(d, hyb_device_record(d, HYB_STREAM_RELOAD, ev));
	t0 = hyb_device_now(d);
	while (!hyb_device_done(d, ev)) {
		saw_busy = true;
		CHECK(hyb_device_now(d) - t0 < 10);
	}
	OK(d, hyb_device_add(d, HYB_STREAM_COMPUTE, buf, buf + n / 2, 1024));
	drain(d, HYB_STREAM_COMPUTE);
	OK(d, hyb_device_sync(d, ev));
	if (!saw_busy)
		fprintf(stderr, "  (the 64 MiB upload was done at the first poll: not-ready unseen)\n");
	hyb_device_event_free(d, ev);
	hyb_device_event_free(d, never);
	hyb_device_free(d, buf);
	hyb_device_host_free(d, a);
	hyb_device_host_free(d, b);
	hyb_device_host_free(d, back);
	hyb_device_close(d);
}

/*
 * The roofline's bandwidths as hyb bench measures them (libhyb/device/device_bw.c):
 * a pinned upload and the add kernel. Loose bounds, any PCIe 3-6 link and
 * any GPU since Volta: they catch a unit slip or a copy that is not pinned.
 */
TEST(gpu_dev_measure_bw)
{
	struct hyb_device *d;
	struct hyb_device_bw bw;

	need_gpu_hardware();
	d = open_kind("cuda", 512 * MiB, 0);
	OK(d, hyb_device_measure_bw(d, 256 * MiB, 3, &bw));
	fprintf(stderr, "  link %.1f GB/s host to device (pinned), device memory %.0f GB/s "
		"(add kernel, 12 bytes an element)\n", bw.pcie_gbps, bw.hbm_gbps);
	CHECK_MSG(bw.pcie_gbps > 5 && bw.pcie_gbps < 130, "%g", bw.pcie_gbps);
	CHECK_MSG(bw.hbm_gbps > 300 && bw.hbm_gbps < 10000, "%g", bw.hbm_gbps);
	CHECK_EQ_INT(hyb_device_used(d), 0);
	hyb_device_close(d);
}

TEST(gpu_dev_capacity)
{
	struct hyb_device_config huge = { .capacity = 1ull << 50 };
	struct hyb_device *d;
	hyb_dptr p1, p2, p3;

	need_gpu();
	CHECK(!hyb_device_open("cuda", &huge));
	CHECK_MSG(strstr(hyb_last_error(), "capacity"), "%s", hyb_last_error());
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

/* The FFN activation, every kind, against the CPU's hyb_ffn_act within float rounding. */
TEST(gpu_dev_ffn_act)
{
	const uint32_t n = 100003;
	const enum hyb_ffn_act acts[] = { HYB_ACT_SILU, HYB_ACT_GELU, HYB_ACT_RELU, HYB_ACT_RELU2,
					  HYB_ACT_DRELU };
	struct hyb_device *d;
	float *g = malloc(4ull * n), *u = malloc(4ull * n), *out = malloc(4ull * n);
	hyb_dptr dg, du;

	need_gpu();
	CHECK(g && u && out);
	d = open_kind("cuda", 64 * MiB, 0);
	dg = dalloc(d, 4ull * n);
	du = dalloc(d, 4ull * n);
	for (size_t a = 0; a < sizeof(acts) / sizeof(acts[0]); a++) {
		double worst = 0;

		/* gates across GeGLU's table and past its +-10 ends, both signs of u */
		for (uint32_t i = 0; i < n; i++) {
			g[i] = 12 * rndf();
			u[i] = rndf();
		}
		OK(d, hyb_device_h2d(d, HYB_STREAM_CRITICAL, dg, g, 4ull * n));
		OK(d, hyb_device_h2d(d, HYB_STREAM_CRITICAL, du, u, 4ull * n));
		drain(d, HYB_STREAM_CRITICAL);
		OK(d, hyb_device_ffn_act(d, HYB_STREAM_COMPUTE, dg, du, n, acts[a]));
		OK(d, hyb_device_d2h(d, HYB_STREAM_COMPUTE, out, dg, 4ull * n));
		drain(d, HYB_STREAM_COMPUTE);
		hyb_ffn_act(g, u, n, acts[a]);
		for (uint32_t i = 0; i < n; i++)
			worst = fmax(worst, fabs((double)out[i] - g[i]) /
						    (fabs((double)g[i]) + 1e-6));
		printf("    activation %d: worst relative difference %.2e\n", (int)acts[a], worst);
		CHECK_MSG(worst < 1e-5, "activation %d differs by %.2e", (int)acts[a], worst);
	}
	CHECK_EQ_INT(hyb_device_ffn_act(d, HYB_STREAM_COMPUTE, dg, dg + 8, 16, HYB_ACT_SILU),
		     -EINVAL);
	hyb_device_close(d);
	free(g);
	free(u);
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
 * resident: microseconds per call (200 calls queued back to back, over
 * copies of the layer and 8 active lists, so the rows a cycle touches are
 * several times the L2) and the bandwidth of the
 * bytes it reads (gate rows of the listed neurons, up and down rows of those
 * that pass the gate) against the device-memory ceiling measured in the
 * same run (a device-to-device copy).
 */
#define TIMING_COPIES 8
#define TIMING_LISTS 8
static void put(struct hyb_device *d, hyb_dptr dst, const void *src, uint64_t len);
/*
 * Timed events on the GPU: a 256 MiB pinned upload measured by the device's
 * clock agrees with the host's wall time around it (within the launch and
 * sync slack) and implies a PCIe-like rate; untimed and never-recorded
 * events are refused without faulting the device.
 */
TEST(gpu_dev_elapsed)
{
	const uint64_t n = 256 * MiB;
	struct hyb_device *d;
	struct hyb_device_event *a, *b, *untimed, *never;
	void *host;
	hyb_dptr p;
	double s = -1, t0, wall;

	need_gpu();
	d = open_kind("cuda", n + 64 * MiB, 0);
	a = hyb_device_event_new_timed(d);
	b = hyb_device_event_new_timed(d);
	never = hyb_device_event_new_timed(d);
	untimed = hyb_device_event_new(d);
	host = hyb_device_host_alloc(d, n);
	CHECK(a && b && never && untimed && host);
	memset(host, 1, n);
	p = dalloc(d, n);
	drain(d, HYB_STREAM_CRITICAL);
	t0 = hyb_device_now(d);
	OK(d, hyb_device_record(d, HYB_STREAM_CRITICAL, a));
	OK(d, hyb_device_h2d(d, HYB_STREAM_CRITICAL, p, host, n));
	OK(d, hyb_device_record(d, HYB_STREAM_CRITICAL, b));
	OK(d, hyb_device_sync(d, b));
	wall = hyb_device_now(d) - t0;
	OK(d, hyb_device_elapsed(d, a, b, &s));
	fprintf(stderr, "    256 MiB h2d: %.3f ms by events (%.1f GB/s), %.3f ms by the host\n",
		1e3 * s, n / s / 1e9, 1e3 * wall);
	CHECK_MSG(s > 0 && s <= wall + 1e-4, "events %.6f s, host %.6f s", s, wall);
	CHECK_MSG(n / s > 1e9 && n / s < 200e9, "%.1f GB/s", n / s / 1e9);
	CHECK_EQ_INT(hyb_device_elapsed(d, untimed, b, &s), -EINVAL);
	CHECK_EQ_INT(hyb_device_elapsed(d, a, never, &s), -EINVAL);
	OK(d, hyb_device_h2d(d, HYB_STREAM_CRITICAL, p, host, MiB));
	drain(d, HYB_STREAM_CRITICAL);
	hyb_device_host_free(d, host);
	hyb_device_event_free(d, a);
	hyb_device_event_free(d, b);
	hyb_device_event_free(d, never);
	hyb_device_event_free(d, untimed);
	hyb_device_close(d);
}

TEST(gpu_dev_timing)
{
	static const uint32_t types[] = { HYB_TYPE_F16, HYB_TYPE_Q8_0, HYB_TYPE_Q4_0 };
	const uint32_t n_embd = 4096, n_ff = 11008, gs = 32, iters = 200;
	float *gate, *up, *down, *xn, *y;
	uint32_t *active, n[TIMING_LISTS];
	struct hyb_device_event *ev;
	struct hyb_device *d;
	hyb_dptr lists;
	double ceil_gbps;

	need_gpu_hardware();
	ceil_gbps = gpu_copy_gbps();
	CHECK(ceil_gbps > 0);
	d = open_kind("cuda", 1024 * MiB, 0);
	ev = hyb_device_event_new(d);
	CHECK(ev);
	make_mats(n_embd, n_ff, &gate, &up, &down);
	xn = malloc(4ull * n_embd);
	y = malloc(4ull * n_embd);
	active = malloc(4ull * n_ff * TIMING_LISTS);
	CHECK(xn && y && active);
	lists = dalloc(d, 4ull * n_ff * TIMING_LISTS);
	for (uint32_t i = 0; i < n_embd; i++)
		xn[i] = rndf();
	for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
		struct hyb_dev_ffn f[TIMING_COPIES][TIMING_LISTS];
		struct side s[TIMING_COPIES];
		struct layer L;
		uint64_t layer_bytes;
		uint32_t copies;

		make_layer(&L, types[t], n_embd, n_ff, gs, gate, up, down, 100, 0);
		layer_bytes = (uint64_t)L.n_slots * L.slot_bytes;
		copies = (uint32_t)((256ull * MiB + layer_bytes - 1) / layer_bytes);
		copies = copies > TIMING_COPIES ? TIMING_COPIES : copies;
		for (uint32_t r = 0; r < TIMING_LISTS; r++)
			n[r] = make_active(&L, 10, active + (size_t)r * n_ff);
		put(d, lists, active, 4ull * n_ff * TIMING_LISTS);
		for (uint32_t c = 0; c < copies; c++) {
			upload(&s[c], d, &L);
			OK(d, hyb_device_h2d(d, HYB_STREAM_CRITICAL, s[c].xn, xn, 4ull * n_embd));
		}
		drain(d, HYB_STREAM_CRITICAL);
		for (int a = 0; a < 2; a++) {
			const enum hyb_ffn_act act = a ? HYB_ACT_RELU : HYB_ACT_SILU;
			double t0, dt, lat, bytes = 0, n_mean = 0, pass_mean = 0;

			for (uint32_t c = 0; c < copies; c++) {
				for (uint32_t r = 0; r < TIMING_LISTS; r++) {
					f[c][r] = ffn_of(&s[c], &L, act, n[r], false);
					f[c][r].active = lists + 4ull * n_ff * r;
				}
			}
			/* neurons whose gate is positive (float weights: near enough for a count) */
			for (uint32_t r = 0; r < TIMING_LISTS; r++) {
				const uint32_t *al = active + (size_t)r * n_ff;
				uint32_t pass = 0;

				for (uint32_t i = 0; i < n[r]; i++) {
					double g = 0;

					for (uint32_t e = 0; e < n_embd; e++)
						g += (double)gate[(size_t)al[i] * n_embd + e] * xn[e];
					pass += act == HYB_ACT_SILU || g > 0;
				}
				n_mean += (double)n[r] / TIMING_LISTS;
				pass_mean += (double)pass / TIMING_LISTS;
			}
#define CALL(i) (&f[(i) % copies][(i) / copies % TIMING_LISTS])
			for (uint32_t w = 0; w < copies * TIMING_LISTS; w++)
				OK(d, hyb_device_sparse_ffn(d, HYB_STREAM_COMPUTE, CALL(w)));
			drain(d, HYB_STREAM_COMPUTE);
			t0 = hyb_device_now(d);
			for (uint32_t i = 0; i < iters; i++)
				OK(d, hyb_device_sparse_ffn(d, HYB_STREAM_COMPUTE, CALL(i)));
			drain(d, HYB_STREAM_COMPUTE);
			dt = (hyb_device_now(d) - t0) / iters;
			/* one call at a time: the latency a decode step sees, launches included */
			t0 = hyb_device_now(d);
			for (uint32_t i = 0; i < 50; i++) {
				OK(d, hyb_device_sparse_ffn(d, HYB_STREAM_COMPUTE, CALL(i)));
				OK(d, hyb_device_record(d, HYB_STREAM_COMPUTE, ev));
				OK(d, hyb_device_sync(d, ev));
			}
#undef CALL
			lat = (hyb_device_now(d) - t0) / 50;
			bytes = (n_mean + 2.0 * pass_mean) * L.rb;
			printf("    sparse ffn %-4s %-4s 4096x11008 %.0f active (%.0f pass the gate; "
			       "%u copies x %d lists): %6.1f us/call queued, %6.1f us alone, %6.3f MB "
			       "read, %5.0f GB/s (%4.1f%% of the %.0f GB/s copy; floor %.1f us)\n",
			       hyb_type_name(L.type), a ? "relu" : "silu", n_mean, pass_mean, copies,
			       TIMING_LISTS, dt * 1e6, lat * 1e6, bytes / 1e6, bytes / dt / 1e9,
			       100 * bytes / dt / 1e9 / ceil_gbps, ceil_gbps,
			       bytes / (ceil_gbps * 1e9) * 1e6);
			OK(d, hyb_device_d2h(d, HYB_STREAM_COMPUTE, y, s[0].y, 4ull * n_embd));
			drain(d, HYB_STREAM_COMPUTE);
		}
		for (uint32_t c = 0; c < copies; c++)
			release(&s[c]);
		free_layer(&L);
	}
	hyb_device_free(d, lists);
	hyb_device_event_free(d, ev);
	hyb_device_close(d);
	free(gate);
	free(up);
	free(down);
	free(xn);
	free(y);
	free(active);
}

/* ---- dense kernels: rmsnorm, matvec, attention ---------------------------------------- */

/*
 * The dense tests run the real shapes on a GPU. HYB_GPU_TEST_SMALL=1 shrinks
 * them (for a host emulation of CUDA, which runs a few thousand threads a
 * second): same code paths, fewer rows and positions.
 */
static bool small_shapes(void)
{
	const char *s = getenv("HYB_GPU_TEST_SMALL");

	return s && *s && strcmp(s, "0");
}

static void put(struct hyb_device *d, hyb_dptr dst, const void *src, uint64_t len)
{
	OK(d, hyb_device_h2d(d, HYB_STREAM_CRITICAL, dst, src, len));
	drain(d, HYB_STREAM_CRITICAL);
}

static void get(struct hyb_device *d, void *dst, hyb_dptr src, uint64_t len)
{
	drain(d, HYB_STREAM_COMPUTE);
	OK(d, hyb_device_d2h(d, HYB_STREAM_COMPUTE, dst, src, len));
	drain(d, HYB_STREAM_COMPUTE);
}

static double max_abs(const float *a, uint64_t n)
{
	double m = 0;

	for (uint64_t i = 0; i < n; i++)
		m = fabs(a[i]) > m ? fabs(a[i]) : m;
	return m;
}

static double max_diff(const float *a, const float *b, uint64_t n)
{
	double m = 0;

	for (uint64_t i = 0; i < n; i++) {
		const double v = fabs((double)a[i] - b[i]);

		m = v > m || v != v ? v : m;
	}
	return m;
}

/*
 * RMSNorm: the CUDA kernel rounds each square to float and sums in double
 * as hyb_rmsnorm does, so only the order of the double sum differs; after
 * rounding to float that changes the scale by at most one unit in the
 * last place, and y = (x * scale) * w by at most 3: |cuda - cpu| <= 4e-7
 * |y| (in the emulation and in practice the bits are the same). In place
 * (y == x) too.
 */
TEST(gpu_dev_rmsnorm)
{
	static const uint32_t ns[] = { 4096, 5120, 1, 33, 100003 };
	static const float eps[] = { 1e-5f, 1e-6f, 0.0f };
	struct hyb_device *gpu, *cpu;

	need_gpu();
	gpu = open_kind("cuda", 64 * MiB, 0);
	cpu = open_kind("cpu", 64 * MiB, 0);
	for (size_t t = 0; t < sizeof(ns) / sizeof(ns[0]); t++) {
		const uint32_t n = ns[t];
		float *x = malloc(4ull * n), *w = malloc(4ull * n);
		float *yg = malloc(4ull * n), *yc = malloc(4ull * n);
		hyb_dptr g[3], c[3];

		CHECK(x && w && yg && yc);
		for (uint32_t i = 0; i < n; i++) {
			x[i] = rndf() * (1 + (float)(t * 3));
			w[i] = rndf() + 0.5f;
		}
		for (int i = 0; i < 3; i++) {
			g[i] = dalloc(gpu, 4ull * n);
			c[i] = dalloc(cpu, 4ull * n);
		}
		put(gpu, g[0], x, 4ull * n);
		put(gpu, g[1], w, 4ull * n);
		put(cpu, c[0], x, 4ull * n);
		put(cpu, c[1], w, 4ull * n);
		for (size_t e = 0; e < sizeof(eps) / sizeof(eps[0]); e++) {
			for (int inplace = 0; inplace < 2; inplace++) {
				const hyb_dptr gy = inplace ? g[0] : g[2];
				const hyb_dptr cy = inplace ? c[0] : c[2];

				if (inplace) {
					put(gpu, g[0], x, 4ull * n);
					put(cpu, c[0], x, 4ull * n);
				}
				OK(gpu, hyb_device_rmsnorm(gpu, HYB_STREAM_COMPUTE, gy, g[0], g[1],
							   n, eps[e]));
				OK(cpu, hyb_device_rmsnorm(cpu, HYB_STREAM_COMPUTE, cy, c[0], c[1],
							   n, eps[e]));
				get(gpu, yg, gy, 4ull * n);
				get(cpu, yc, cy, 4ull * n);
				for (uint32_t i = 0; i < n; i++)
					CHECK_MSG(fabsf(yg[i] - yc[i]) <= 4e-7f * fabsf(yc[i]),
						  "n %u eps %g%s: y[%u] cuda %.9g cpu %.9g", n,
						  (double)eps[e], inplace ? " in place" : "", i,
						  (double)yg[i], (double)yc[i]);
			}
		}
		printf("    rmsnorm n %u: max |cuda - cpu| %.3g (|y| up to %.3g)\n", n,
		       max_diff(yg, yc, n), max_abs(yc, n));
		for (int i = 0; i < 3; i++) {
			hyb_device_free(gpu, g[i]);
			hyb_device_free(cpu, c[i]);
		}
		free(x);
		free(w);
		free(yg);
		free(yc);
	}
	hyb_device_close(gpu);
	hyb_device_close(cpu);
}

/*
 * y (= or +=) W x on both devices. x goes to the weight's dot format the
 * same way on both (Q8_0 for Q8_0/Q4_0, Q8_K for Q4_K/Q6_K, bit for bit;
 * F16; F32), and every
 * product is exact or rounded alike (integer block dots times the same two
 * f16 scales; f16 x f16 products are exact in float), so only the order of
 * the float sum differs: its error is about sqrt(terms) * 2^-24 of the sum
 * of the terms' squares, under 1e-5 for 4096 terms of random sign. The
 * test allows |cuda - cpu| <= 3e-5 * ||W x|| / sqrt(n_out) + 1e-5 * |W x|
 * per row, and asks the CUDA result to be the same bits when run again.
 * w_off shifts the weight off 16-byte alignment (the kernels' 2-byte path).
 */
static void matvec_case(struct hyb_device *gpu, struct hyb_device *cpu, uint32_t type,
			uint32_t n_in, uint32_t n_out, uint32_t w_off)
{
	const uint64_t rb = hyb_row_bytes(type, n_in), wb = rb * n_out;
	float *row = malloc(4ull * n_in), *x = malloc(4ull * n_in);
	float *y0 = malloc(4ull * n_out), *yg = malloc(4ull * n_out), *yg2 = malloc(4ull * n_out);
	float *yc = malloc(4ull * n_out), *dot = malloc(4ull * n_out);
	uint8_t *w = malloc(wb);
	const float sc = 1.0f / sqrtf((float)n_in);
	struct hyb_device *dev[2] = { gpu, cpu };
	hyb_dptr dw[2], dx[2], dy[2];
	double worst = 0;

	CHECK(rb && row && x && y0 && yg && yg2 && yc && dot && w);
	for (uint32_t r = 0; r < n_out; r++) {
		for (uint32_t i = 0; i < n_in; i++)
			row[i] = rndf() * sc * (r % 7 == 3 ? 8.0f : 1.0f);
		CHECK(hyb_quantize_row_ref(type, row, w + r * rb, n_in) == 0);
	}
	for (int k = 0; k < 2; k++) {
		dw[k] = dalloc(dev[k], wb + w_off);
		dx[k] = dalloc(dev[k], 4ull * n_in);
		dy[k] = dalloc(dev[k], 4ull * n_out);
		put(dev[k], dw[k] + w_off, w, wb);
	}
	for (int acc = 0; acc < 2; acc++) {
		struct hyb_dev_matvec m = {
			.type = type, .n_in = n_in, .n_out = n_out, .accumulate = acc,
		};
		double n2 = 0;

		for (uint32_t i = 0; i < n_in; i++)
			x[i] = rndf() * (i % 97 == 5 ? 30.0f : 1.0f); /* a few outliers per block */
		for (uint32_t r = 0; r < n_out; r++)
			y0[r] = acc ? rndf() : 12345.0f; /* must be overwritten */
		for (int k = 0; k < 2; k++) {
			float *out = k ? yc : yg;

			m.w = dw[k] + w_off;
			m.x = dx[k];
			m.y = dy[k];
			put(dev[k], dx[k], x, 4ull * n_in);
			put(dev[k], dy[k], y0, 4ull * n_out);
			OK(dev[k], hyb_device_matvec(dev[k], HYB_STREAM_COMPUTE, &m));
			get(dev[k], out, dy[k], 4ull * n_out);
			if (k == 0) {
				put(gpu, dy[0], y0, 4ull * n_out);
				OK(gpu, hyb_device_matvec(gpu, HYB_STREAM_COMPUTE, &m));
				get(gpu, yg2, dy[0], 4ull * n_out);
				CHECK_MSG(!memcmp(yg, yg2, 4ull * n_out),
					  "cuda matvec: two runs of one call differ");
			}
		}
		for (uint32_t r = 0; r < n_out; r++) {
			dot[r] = acc ? yc[r] - y0[r] : yc[r];
			n2 += (double)dot[r] * dot[r];
		}
		const double rms = sqrt(n2 / n_out);

		for (uint32_t r = 0; r < n_out; r++) {
			const double diff = fabs((double)yg[r] - yc[r]);

			CHECK_MSG(diff <= 3e-5 * rms + 1e-5 * fabs(dot[r]),
				  "%s %ux%u%s row %u: cuda %.9g cpu %.9g (rms of W x %g)",
				  hyb_type_name(type), n_out, n_in, acc ? " (+=)" : "", r,
				  (double)yg[r], (double)yc[r], rms);
			if (diff / rms > worst)
				worst = diff / rms;
		}
	}
	printf("    matvec %-4s %5u x %5u%s: worst |cuda - cpu| / rms(W x) = %.2g\n",
	       hyb_type_name(type), n_out, n_in, w_off ? " (unaligned)" : "", worst);
	for (int k = 0; k < 2; k++) {
		hyb_device_free(dev[k], dw[k]);
		hyb_device_free(dev[k], dx[k]);
		hyb_device_free(dev[k], dy[k]);
	}
	free(row);
	free(x);
	free(y0);
	free(yg);
	free(yg2);
	free(yc);
	free(dot);
	free(w);
}

static void matvec_type(uint32_t type)
{
	const uint32_t align = type == HYB_TYPE_F32 ? 4 : 2;
	struct hyb_device *gpu, *cpu;

	need_gpu();
	gpu = open_kind("cuda", 512 * MiB, 0);
	cpu = open_kind("cpu", 512 * MiB, 0);
	if (small_shapes()) {
		matvec_case(gpu, cpu, type, 256, 67, 0);
		matvec_case(gpu, cpu, type, 96, 5, align);
	} else {
		matvec_case(gpu, cpu, type, 4096, 4096, 0);
		matvec_case(gpu, cpu, type, 4096, 4099, 0);   /* an odd row count */
		matvec_case(gpu, cpu, type, 11008, 4096, 0);  /* the down projection's n_in */
		matvec_case(gpu, cpu, type, 96, 5, align);    /* unaligned rows, tiny */
		matvec_case(gpu, cpu, type, 4128, 333, align);
	}
	hyb_device_close(gpu);
	hyb_device_close(cpu);
}

TEST(gpu_dev_matvec_f32) { matvec_type(HYB_TYPE_F32); }
TEST(gpu_dev_matvec_f16) { matvec_type(HYB_TYPE_F16); }
TEST(gpu_dev_matvec_q8_0) { matvec_type(HYB_TYPE_Q8_0); }
TEST(gpu_dev_matvec_q4_0) { matvec_type(HYB_TYPE_Q4_0); }

/*
 * The K-quants (llama.cpp's Q4_K_M attention and head): rows of whole
 * super-blocks of 256, so their own shapes - the attention projection, an
 * odd row count, 11008 inputs (43 super-blocks: a partial step of the
 * kernel's four), and 2-byte aligned rows (Q6_K's 210-byte blocks are never
 * more). Q4_K's d sum sc q.x - dmin sum m bsum per super-block cancels
 * partly; its terms are still a few times |W x| at most, within the
 * tolerance above.
 */
static void matvec_kquant(uint32_t type)
{
	struct hyb_device *gpu, *cpu;

	need_gpu();
	gpu = open_kind("cuda", 512 * MiB, 0);
	cpu = open_kind("cpu", 512 * MiB, 0);
	if (small_shapes()) {
		matvec_case(gpu, cpu, type, 256, 67, 0);
		matvec_case(gpu, cpu, type, 1280, 5, 2);
	} else {
		matvec_case(gpu, cpu, type, 4096, 4096, 0);
		matvec_case(gpu, cpu, type, 4096, 4099, 0);
		matvec_case(gpu, cpu, type, 11008, 4096, 0);
		matvec_case(gpu, cpu, type, 256, 5, 2);     /* one super-block, unaligned */
		matvec_case(gpu, cpu, type, 5120, 333, 2);  /* 20 super-blocks, unaligned */
	}
	hyb_device_close(gpu);
	hyb_device_close(cpu);
}

TEST(gpu_dev_matvec_q4_k) { matvec_kquant(HYB_TYPE_Q4_K); }
TEST(gpu_dev_matvec_q6_k) { matvec_kquant(HYB_TYPE_Q6_K); }

/* The types of kernels/cuda/gen_dot.h: blocks of 32, then super-blocks of 256. */
TEST(gpu_dev_matvec_other_types)
{
	matvec_type(HYB_TYPE_Q4_1);
	matvec_type(HYB_TYPE_Q5_0);
	matvec_type(HYB_TYPE_Q5_1);
	matvec_type(HYB_TYPE_IQ4_NL);
	matvec_kquant(HYB_TYPE_Q2_K);
	matvec_kquant(HYB_TYPE_Q3_K);
	matvec_kquant(HYB_TYPE_Q5_K);
	matvec_kquant(HYB_TYPE_IQ4_XS);
}

/*
 * hyb_device_matvec_group on the GPU: 40 items (two launches of up to 32),
 * some sharing one input as a token's experts do, a batch of 1 and of 3,
 * each item's rows the bits its own hyb_device_matvec gives (every row is
 * one warp's sum whatever the grid), aligned and 2-byte aligned weights.
 */
static void matvec_group_case(struct hyb_device *gpu, uint32_t type, uint32_t n_in,
			      uint32_t n_out, uint32_t w_off)
{
	enum { N = 40 };
	const uint64_t rb = hyb_row_bytes(type, n_in), wb = rb * n_out;
	uint8_t *w = malloc(wb);
	float *row = malloc(4ull * n_in);

	CHECK(rb && w && row);
	for (uint32_t r = 0; r < n_out; r++) {
		for (uint32_t i = 0; i < n_in; i++)
			row[i] = rndf() / sqrtf((float)n_in);
		CHECK(hyb_quantize_row_ref(type, row, w + r * rb, n_in) == 0);
	}
	for (uint32_t nb = 1; nb <= 3; nb += 2)
		for (int acc = 0; acc < 2; acc++) {
			const uint64_t xl = 4ull * n_in * nb, yl = 4ull * n_out * nb;
			const hyb_dptr dw = dalloc(gpu, N * wb + w_off) + w_off;
			const hyb_dptr dx = dalloc(gpu, N * xl), dy = dalloc(gpu, N * yl);
			float *x = malloc(N * xl), *y0 = malloc(yl), *ya = malloc(N * yl);
			float *yb = malloc(N * yl);
			struct hyb_dev_matvec m[N];

			CHECK(x && y0 && ya && yb);
			for (uint64_t i = 0; i < N * xl / 4; i++)
				x[i] = rndf();
			for (uint64_t i = 0; i < yl / 4; i++)
				y0[i] = rndf();
			put(gpu, dx, x, N * xl);
			for (int i = 0; i < N; i++) {
				/* each item's own weights: the rows shifted by i */
				for (uint32_t r = 0; r < n_out; r++)
					put(gpu, dw + i * wb + r * rb, w + (size_t)((r + i) % n_out) * rb,
					    rb);
				m[i] = (struct hyb_dev_matvec){
					.type = type, .n_in = n_in, .n_out = n_out, .w = dw + i * wb,
					.x = dx + (i % 3 == 1 ? 0 : i) * xl, .y = dy + i * yl,
					.accumulate = acc, .batch = nb == 1 ? 0 : nb,
				};
			}
			for (int i = 0; i < N; i++) {
				put(gpu, m[i].y, y0, yl);
				OK(gpu, hyb_device_matvec(gpu, HYB_STREAM_COMPUTE, &m[i]));
			}
			get(gpu, ya, dy, N * yl);
			for (int i = 0; i < N; i++)
				put(gpu, m[i].y, y0, yl);
			OK(gpu, hyb_device_matvec_group(gpu, HYB_STREAM_COMPUTE, m, N));
			get(gpu, yb, dy, N * yl);
			CHECK_MSG(!memcmp(ya, yb, N * yl), "%s %ux%u batch %u acc %d w_off %u: the "
				  "group's outputs differ from the single launches'",
				  hyb_type_name(type), n_out, n_in, nb, acc, w_off);
			hyb_device_free(gpu, dw - w_off);
			hyb_device_free(gpu, dx);
			hyb_device_free(gpu, dy);
			free(x);
			free(y0);
			free(ya);
			free(yb);
		}
	free(w);
	free(row);
}

TEST(gpu_dev_matvec_group)
{
	struct hyb_device *gpu;

	need_gpu();
	gpu = open_kind("cuda", 512 * MiB, 0);
	matvec_group_case(gpu, HYB_TYPE_Q4_0, 256, 67, 0);
	matvec_group_case(gpu, HYB_TYPE_Q4_K, 512, 40, 0);
	matvec_group_case(gpu, HYB_TYPE_F16, 96, 33, 2);
	matvec_group_case(gpu, HYB_TYPE_F32, 128, 24, 0);
	if (!small_shapes())
		matvec_group_case(gpu, HYB_TYPE_Q4_0, 2048, 768, 0);
	hyb_device_close(gpu);
}

/* ---- attention ---- */

struct attn_side {
	struct hyb_device *d;
	hyb_dptr q, k, v, kc, vc, out;
	uint32_t off; /* kc and vc start this many bytes into their allocations */
};

/* off 2: caches only 2-byte aligned (the kernels' 16-bit load path) */
static void attn_alloc(struct attn_side *s, struct hyb_device *d, const struct hyb_dev_attn *a,
		       uint32_t off)
{
	const uint64_t qd = (uint64_t)a->n_head * a->head_dim;
	const uint64_t kvd = (uint64_t)a->n_head_kv * a->head_dim;

	s->d = d;
	s->q = dalloc(d, 4 * qd);
	s->k = dalloc(d, 4 * kvd);
	s->v = dalloc(d, 4 * kvd);
	s->out = dalloc(d, 4 * qd);
	s->off = off;
	s->kc = dalloc(d, 2 * kvd * a->n_ctx + off) + off;
	s->vc = dalloc(d, 2 * kvd * a->n_ctx + off) + off;
}

static void attn_free(struct attn_side *s)
{
	hyb_device_free(s->d, s->q);
	hyb_device_free(s->d, s->k);
	hyb_device_free(s->d, s->v);
	hyb_device_free(s->d, s->out);
	hyb_device_free(s->d, s->kc - s->off);
	hyb_device_free(s->d, s->vc - s->off);
}

/* q, k, v up, the op at a->pos, then roped q and k, the cache rows 0..pos and out back */
static void attn_run(struct attn_side *s, struct hyb_dev_attn a, const float *q,
		     const float *k, const float *v, float *qr, float *kr, uint16_t *kc,
		     uint16_t *vc, float *out)
{
	const uint64_t qd = (uint64_t)a.n_head * a.head_dim;
	const uint64_t kvd = (uint64_t)a.n_head_kv * a.head_dim;

	a.q = s->q;
	a.k = s->k;
	a.v = s->v;
	a.kcache = s->kc;
	a.vcache = s->vc;
	a.out = s->out;
	put(s->d, s->q, q, 4 * qd);
	put(s->d, s->k, k, 4 * kvd);
	put(s->d, s->v, v, 4 * kvd);
	OK(s->d, hyb_device_attention(s->d, HYB_STREAM_COMPUTE, &a));
	get(s->d, out, s->out, 4 * qd);
	get(s->d, qr, s->q, 4 * qd);
	get(s->d, kr, s->k, 4 * kvd);
	get(s->d, kc, s->kc, 2 * kvd * (a.pos + 1));
	get(s->d, vc, s->vc, 2 * kvd * (a.pos + 1));
}

/*
 * The exact answer for the GPU's inputs: q (roped, scaled) rounded to F16 as
 * both devices round it, the F16 cache rows of the window, softmax and the V
 * sum in double.
 */
static void attn_ref(const struct hyb_dev_attn *a, const float *qr, const uint16_t *kc,
		     const uint16_t *vc, double *ref)
{
	const uint32_t hd = a->head_dim, group = a->n_head / a->n_head_kv;
	const uint64_t kvd = (uint64_t)a->n_head_kv * hd;
	const double scale = a->q_scale ? 1.0 : 1.0 / sqrt((double)hd);
	const uint32_t first = a->n_swa && a->pos + 1 > a->n_swa ? a->pos + 1 - a->n_swa : 0;
	double *s = malloc(sizeof(double) * (a->pos + 1));

	CHECK(s);
	for (uint32_t h = 0; h < a->n_head; h++) {
		const uint64_t off = (uint64_t)(h / group) * hd;
		double mx = -INFINITY, sum = 0;

		for (uint32_t p = first; p <= a->pos; p++) {
			double dot = 0;

			for (uint32_t d = 0; d < hd; d++)
				dot += (double)hyb_f16_to_f32(hyb_f32_to_f16(qr[h * hd + d])) *
				       hyb_f16_to_f32(kc[p * kvd + off + d]);
			s[p] = dot * scale;
			mx = s[p] > mx ? s[p] : mx;
		}
		for (uint32_t p = first; p <= a->pos; p++) {
			s[p] = exp(s[p] - mx);
			sum += s[p];
		}
		for (uint32_t d = 0; d < hd; d++) {
			double o = 0;

			for (uint32_t p = first; p <= a->pos; p++)
				o += s[p] * hyb_f16_to_f32(vc[p * kvd + off + d]);
			ref[h * hd + d] = o / sum;
		}
	}
	free(s);
}

/*
 * Both devices on the same inputs: random F16 rows 0..n_ctx in both caches,
 * then the op at each position of the list (every earlier row is then a
 * random row or one an earlier call stored).
 *
 *  - RoPE uses the host's cos/sin (hyb_rope's libm calls) and its fused
 *    and rounded products: roped q and k, and the F16 row pos of both
 *    caches, are the CPU device's to the bit.
 *  - out against the exact answer (double, from the GPU's own q and
 *    caches): the CUDA kernels sum in float, <= 1e-5 * max|V| + 1e-6 per
 *    element (2048 terms: about 45 * 2^-24 relative, with margin).
 *  - out against the CPU device: the CPU keeps its V sum in F16 (llama.cpp's
 *    flash attention), one rounding of up to 2^-11 relative per position
 *    (and per rescale when the maximum grows), on a sum of at most max|V|
 *    times the weight seen so far; random-signed roundings add up like
 *    sqrt(positions), so the test allows 2^-11 * (2 + sqrt(pos + 1)) *
 *    max|V| and prints the measured worst of both devices against the
 *    exact answer (the CPU's stays near 2-4 * 2^-11 up to 2048 positions).
 *
 * q_scale and n_swa: Gemma's scaled q and sliding window (0: none).
 */
static void attn_case_gemma(uint32_t n_head, uint32_t n_head_kv, uint32_t hd, uint32_t n_rot,
			    bool neox, const uint32_t *pos, int n_pos, uint32_t n_ctx,
			    uint32_t off, float q_scale, uint32_t n_swa)
{
	struct hyb_dev_attn a = {
		.n_head = n_head, .n_head_kv = n_head_kv, .head_dim = hd, .n_rot = n_rot,
		.rope = neox ? &yarn_rope : &plain_rope, .rope_neox = neox, .n_ctx = n_ctx,
		.q_scale = q_scale, .n_swa = n_swa,
	};
	const uint64_t qd = (uint64_t)n_head * hd, kvd = (uint64_t)n_head_kv * hd;
	struct hyb_device *gpu, *cpu;
	struct attn_side sg, sc;

	need_gpu();
	float *q = malloc(4 * qd), *k = malloc(4 * kvd), *v = malloc(4 * kvd);
	float *qg = malloc(4 * qd), *qc = malloc(4 * qd), *kg = malloc(4 * kvd);
	float *kcpu = malloc(4 * kvd), *og = malloc(4 * qd), *oc = malloc(4 * qd);
	uint16_t *kcg = malloc(2 * kvd * n_ctx), *vcg = malloc(2 * kvd * n_ctx);
	uint16_t *kcc = malloc(2 * kvd * n_ctx), *vcc = malloc(2 * kvd * n_ctx);
	double *ref = malloc(sizeof(double) * qd);

	CHECK(q && k && v && qg && qc && kg && kcpu && og && oc && kcg && vcg && kcc && vcc && ref);
	gpu = open_kind("cuda", 512 * MiB, 0);
	cpu = open_kind("cpu", 512 * MiB, 0);
	attn_alloc(&sg, gpu, &a, off);
	attn_alloc(&sc, cpu, &a, off);
	for (uint64_t i = 0; i < kvd * n_ctx; i++) {
		kcg[i] = hyb_f32_to_f16(rndf() * 2);
		vcg[i] = hyb_f32_to_f16(rndf());
	}
	put(gpu, sg.kc, kcg, 2 * kvd * n_ctx);
	put(gpu, sg.vc, vcg, 2 * kvd * n_ctx);
	put(cpu, sc.kc, kcg, 2 * kvd * n_ctx);
	put(cpu, sc.vc, vcg, 2 * kvd * n_ctx);
	for (int i = 0; i < n_pos; i++) {
		double eg = 0, ec = 0, vmax = 0;

		a.pos = pos[i];
		for (uint64_t j = 0; j < qd; j++)
			q[j] = rndf() * 2;
		for (uint64_t j = 0; j < kvd; j++) {
			k[j] = rndf() * 2;
			v[j] = rndf();
		}
		attn_run(&sg, a, q, k, v, qg, kg, kcg, vcg, og);
		attn_run(&sc, a, q, k, v, qc, kcpu, kcc, vcc, oc);
		CHECK_MSG(!memcmp(qg, qc, 4 * qd) && !memcmp(kg, kcpu, 4 * kvd),
			  "pos %u %s: roped q or k differ from the CPU's (max %g, %g)", a.pos,
			  neox ? "neox" : "normal", max_diff(qg, qc, qd), max_diff(kg, kcpu, kvd));
		CHECK_MSG(!memcmp(kcg + a.pos * kvd, kcc + a.pos * kvd, 2 * kvd) &&
			  !memcmp(vcg + a.pos * kvd, vcc + a.pos * kvd, 2 * kvd),
			  "pos %u: the stored cache row differs from the CPU's", a.pos);
		attn_ref(&a, qg, kcg, vcg, ref);
		for (uint64_t j = 0; j < kvd * (a.pos + 1); j++) {
			const double av = fabs(hyb_f16_to_f32(vcg[j]));

			vmax = av > vmax ? av : vmax;
		}
		const double tol_g = 1e-5 * vmax + 1e-6;
		const double tol_c = (2 + sqrt((double)a.pos + 1)) * vmax / 2048;

		for (uint64_t j = 0; j < qd; j++) {
			const double dg = fabs(og[j] - ref[j]), dc = fabs((double)og[j] - oc[j]);

			CHECK_MSG(dg <= tol_g, "%u/%u heads hd %u pos %u %s: out[%llu] cuda %.9g, "
				  "exact %.9g", n_head, n_head_kv, hd, a.pos,
				  neox ? "neox" : "normal", (unsigned long long)j, (double)og[j],
				  ref[j]);
			CHECK_MSG(dc <= tol_c, "%u/%u heads hd %u pos %u %s: out[%llu] cuda %.9g, "
				  "cpu %.9g (tolerance %g)", n_head, n_head_kv, hd, a.pos,
				  neox ? "neox" : "normal", (unsigned long long)j, (double)og[j],
				  (double)oc[j], tol_c);
			eg = dg > eg ? dg : eg;
			ec = fabs(oc[j] - ref[j]) > ec ? fabs(oc[j] - ref[j]) : ec;
		}
		printf("    attention %2u/%2u heads hd %3u rot %3u %-6s pos %4u%s%s: "
		       "max |cuda - exact| %.2g, |cpu - exact| %.2g (max |V| %.2g)\n", n_head,
		       n_head_kv, hd, n_rot, neox ? "neox" : "normal", a.pos,
		       off ? " (2-aligned)" : "", n_swa ? " (window)" : "", eg, ec, vmax);
	}
	attn_free(&sg);
	attn_free(&sc);
	hyb_device_close(gpu);
	hyb_device_close(cpu);
	free(q);
	free(k);
	free(v);
	free(qg);
	free(qc);
	free(kg);
	free(kcpu);
	free(og);
	free(oc);
	free(kcg);
	free(vcg);
	free(kcc);
	free(vcc);
	free(ref);
}

static void attn_case(uint32_t n_head, uint32_t n_head_kv, uint32_t hd, uint32_t n_rot,
		      bool neox, const uint32_t *pos, int n_pos, uint32_t n_ctx, uint32_t off)
{
	attn_case_gemma(n_head, n_head_kv, hd, n_rot, neox, pos, n_pos, n_ctx, off, 0, 0);
}

static void attn_shape(uint32_t n_head, uint32_t n_head_kv)
{
	static const uint32_t big[] = { 0, 1, 511, 2047 }, tiny[] = { 0, 1, 70, 200 };
	const bool sm = small_shapes();
	const uint32_t *pos = sm ? tiny : big;
	const uint32_t n_ctx = sm ? 256 : 2048;

	if (sm) {
		n_head /= 4;
		n_head_kv = n_head_kv / 4 ? n_head_kv / 4 : 1;
	}
	for (int neox = 0; neox < 2; neox++)
		attn_case(n_head, n_head_kv, 128, 128, neox, pos, 4, n_ctx, 0);
}

TEST(gpu_dev_attention_gqa) { attn_shape(32, 8); }
TEST(gpu_dev_attention_mha) { attn_shape(32, 32); }
/* partial rotary (n_rot < head_dim), head_dim 80 (not a multiple of 64), groups of 12 */
TEST(gpu_dev_attention_odd)
{
	static const uint32_t pos[] = { 0, 5, 300 };

	attn_case(24, 2, 80, 32, false, pos, 3, 320, 0);
	attn_case(24, 2, 80, 32, true, pos, 3, 320, 2);
	attn_case(2, 1, 256, 64, true, pos, 3, 320, 0);
	attn_case(4, 4, 64, 64, false, pos, 3, 320, 2);
}

/*
 * TEAL's projection (kernels/cuda/teal.cu) against the exact sums (double,
 * the inputs above the threshold, the weights as the CPU dequantizes them)
 * and the CPU device (hyb_teal_gemv: int8-rounded products on a VNNI host),
 * at TEAL's shapes: q/k/v, gate|up and down of a 4096/11008 model; rows of
 * x at once (hyb_dev_teal.batch), each with its own inputs.
 */
static void teal_case(uint32_t type, uint32_t n_in, uint32_t n_out, float thr, uint32_t rows)
{
	const uint64_t rb = hyb_row_bytes(type, n_out);
	struct hyb_device *gpu = open_kind("cuda", 1024 * MiB, 0);
	struct hyb_device *cpu = open_kind("cpu", 1024 * MiB, 0);
	uint8_t *w = hyb_test_rand_rows(type, n_in, n_out, n_in * 7 + n_out);
	float *x = malloc(4ull * n_in * rows), *yg = malloc(4ull * n_out * rows);
	float *yc = malloc(4ull * n_out * rows), *deq = malloc(4ull * n_out * n_in);
	double *ref = calloc((size_t)n_out * rows, sizeof(double)), eg = 0, ec = 0;
	hyb_dptr gw = dalloc(gpu, rb * n_in), gx = dalloc(gpu, 4ull * n_in * rows);
	hyb_dptr gy = dalloc(gpu, 4ull * n_out * rows);
	hyb_dptr cw = dalloc(cpu, rb * n_in), cx = dalloc(cpu, 4ull * n_in * rows);
	hyb_dptr cy = dalloc(cpu, 4ull * n_out * rows);
	uint32_t n_act = 0;

	CHECK(x && yg && yc && deq && ref);
	for (uint64_t i = 0; i < (uint64_t)n_in * rows; i++)
		x[i] = rndf();
	for (uint32_t i = 0; i < n_in; i++)
		hyb_cpu_best()->dequantize[type](w + i * rb, deq + (uint64_t)i * n_out, n_out);
	for (uint32_t r = 0; r < rows; r++)
		for (uint32_t i = 0; i < n_in; i++) {
			const float v = x[(uint64_t)r * n_in + i];

			if (!(fabsf(v) > thr))
				continue;
			n_act++;
			for (uint32_t o = 0; o < n_out; o++)
				ref[(uint64_t)r * n_out + o] += (double)v * deq[(uint64_t)i * n_out + o];
		}
	put(gpu, gw, w, rb * n_in);
	put(gpu, gx, x, 4ull * n_in * rows);
	put(cpu, cw, w, rb * n_in);
	put(cpu, cx, x, 4ull * n_in * rows);
	{
		struct hyb_dev_teal t = { .type = type, .n_in = n_in, .n_out = n_out, .w = gw,
					  .x = gx, .thr = thr, .y = gy, .batch = rows };

		OK(gpu, hyb_device_teal_matvec(gpu, HYB_STREAM_COMPUTE, &t));
		t.w = cw;
		t.x = cx;
		t.y = cy;
		OK(cpu, hyb_device_teal_matvec(cpu, HYB_STREAM_COMPUTE, &t));
	}
	get(gpu, yg, gy, 4ull * n_out * rows);
	get(cpu, yc, cy, 4ull * n_out * rows);
	for (uint32_t r = 0; r < rows; r++) {
		double ymax = 0;

		for (uint32_t o = 0; o < n_out; o++)
			ymax = fmax(ymax, fabs(ref[(uint64_t)r * n_out + o]));
		if (ymax == 0) /* no input above the threshold: zeros */
			ymax = 1;
		for (uint64_t o = (uint64_t)r * n_out; o < (uint64_t)(r + 1) * n_out; o++) {
			eg = fmax(eg, fabs(yg[o] - ref[o]) / ymax);
			ec = fmax(ec, fabs((double)yg[o] - yc[o]) / ymax);
		}
	}
	printf("    teal %-5s %5u -> %5u, %2u rows, %u inputs above %.2f: max |cuda - exact| "
	       "%.2g, |cuda - cpu| %.2g (of max |y|)\n", hyb_type_name(type), n_in, n_out, rows,
	       n_act, (double)thr, eg, ec);
	/* float sums of up to 11008 products; the CPU's int8 products: 2^-8 each, random */
	CHECK_MSG(eg < 1e-5, "%s: cuda differs from the exact sums by %.2g", hyb_type_name(type),
		  eg);
	CHECK_MSG(ec < 2e-2, "%s: cuda differs from the CPU device by %.2g", hyb_type_name(type),
		  ec);
	hyb_device_close(gpu);
	hyb_device_close(cpu);
	free(w);
	free(x);
	free(yg);
	free(yc);
	free(deq);
	free(ref);
}

TEST(gpu_dev_teal)
{
	const uint32_t types[] = { HYB_TYPE_F32, HYB_TYPE_F16, HYB_TYPE_Q8_0, HYB_TYPE_Q4_0 };
	const bool sm = small_shapes();

	need_gpu();
	for (size_t k = 0; k < sizeof(types) / sizeof(types[0]); k++) {
		teal_case(types[k], sm ? 512 : 4096, sm ? 768 : 3 * 4096, 0.4f, 1);
		teal_case(types[k], sm ? 1376 : 11008, sm ? 512 : 4096, 0.6f, 1);
	}
	/* a threshold that keeps every input, and one that keeps none */
	teal_case(HYB_TYPE_Q8_0, 1000, 2048, 0.0f, 1);
	teal_case(HYB_TYPE_Q8_0, 1000, 2048, 2.0f, 1);
	/* a prompt's rows: 5 in one call, 20 in two (16 a call) */
	teal_case(HYB_TYPE_Q8_0, sm ? 512 : 4096, sm ? 768 : 3 * 4096, 0.4f, 5);
	teal_case(HYB_TYPE_F16, 1376, 512, 0.6f, 20);
}

/*
 * Gemma 3's options: q scaled after RoPE (query_pre_attn_scalar^-1/2),
 * scores unscaled; a sliding window of 512 positions (1B's), a kv head per
 * 4 query heads of 256.
 */
TEST(gpu_dev_attention_gemma)
{
	static const uint32_t pos[] = { 0, 5, 511, 512, 900 };

	attn_case_gemma(4, 1, 256, 256, true, pos, 5, 1024, 0, 0.0625f, 512);
	attn_case_gemma(8, 2, 128, 128, true, pos, 5, 1024, 2, 0.0883883f, 0);
}

/* A call that the checks refuse leaves the device usable. */
TEST(gpu_dev_dense_bad_args)
{
	struct hyb_device *d;
	hyb_dptr buf;

	need_gpu();
	d = open_kind("cuda", 64 * MiB, 0);
	buf = dalloc(d, MiB);
	struct hyb_dev_matvec m = {
		.type = HYB_TYPE_Q4_0, .n_in = 100, .n_out = 4, .w = buf, .x = buf + 4096,
		.y = buf + 8192,
	};

	CHECK(hyb_device_matvec(d, HYB_STREAM_COMPUTE, &m) < 0); /* n_in not a multiple of 32 */
	m.n_in = 64;
	m.w = buf + 1; /* odd: Q4_0 scales are f16 */
	CHECK(hyb_device_matvec(d, HYB_STREAM_COMPUTE, &m) < 0);
	m.w = buf;
	OK(d, hyb_device_matvec(d, HYB_STREAM_COMPUTE, &m));
	m.type = HYB_TYPE_Q4_K;
	m.n_in = 288; /* a multiple of 32, not of the K-quants' 256 */
	CHECK(hyb_device_matvec(d, HYB_STREAM_COMPUTE, &m) < 0);
	m.type = HYB_TYPE_Q6_K;
	CHECK(hyb_device_matvec(d, HYB_STREAM_COMPUTE, &m) < 0);
	m.n_in = 256;
	OK(d, hyb_device_matvec(d, HYB_STREAM_COMPUTE, &m));
	m.type = HYB_TYPE_BF16; /* the one type the device does not take */
	CHECK(hyb_device_matvec(d, HYB_STREAM_COMPUTE, &m) < 0);
	drain(d, HYB_STREAM_COMPUTE);
	hyb_device_free(d, buf);
	hyb_device_close(d);
}

/*
 * Dense timing: microseconds per call (200 calls queued back to back) and
 * the bandwidth of the bytes each call must read, against the device-memory
 * ceiling measured in the same run (a device-to-device copy): the 4096 x
 * 4096 matvec (an attention projection) and the 32000 x 4096 head in F16,
 * Q8_0, Q4_0, Q4_K, Q6_K and Q5_K (copies called in turn, so the weights come
 * from device memory, not the L2), and attention
 * over 2048 positions (32 heads of 128 over 8 and over 32 kv heads; K and V
 * rows 0..2047 are the bytes).
 */
TEST(gpu_dev_dense_timing)
{
	const bool sm = small_shapes();
	const uint32_t iters = sm ? 2 : 200, n_embd = sm ? 256 : 4096;
	struct hyb_device *d;
	double peak;

	need_gpu_hardware();
	peak = gpu_copy_gbps();
	CHECK(peak > 0);
	d = open_kind("cuda", 1024 * MiB, 0);
	for (int ti = 0; ti < 6; ti++) {
		/* Q5_K: the kernels of gen_dot.h */
		static const uint32_t types[6] = { HYB_TYPE_F16, HYB_TYPE_Q8_0, HYB_TYPE_Q4_0,
						   HYB_TYPE_Q4_K, HYB_TYPE_Q6_K, HYB_TYPE_Q5_K };
		/* block bytes and where its f16 scales are (random bytes elsewhere): d, dmin */
		static const uint32_t blk[6][3] = {
			{ 2, 0, 0 }, { 34, 0, 0 }, { 18, 0, 0 }, { 144, 0, 2 }, { 210, 208, 208 },
			{ 176, 0, 2 },
		};
		const uint32_t type = types[ti];
		const uint32_t rows[2] = { n_embd, sm ? 1000 : 32000 };
		const uint64_t rb = hyb_row_bytes(type, n_embd);
		uint8_t *w = malloc(rb * rows[1]);
		float *x = malloc(4ull * n_embd);
		hyb_dptr dx = dalloc(d, 4ull * n_embd), dy = dalloc(d, 4ull * rows[1]);

		CHECK(w && x);
		for (uint64_t i = 0; i < rb * rows[1]; i++)
			w[i] = (uint8_t)rnd();
		for (uint64_t r = 0; r < rows[1]; r++) { /* sane f16 scales (F16: every weight) */
			for (uint64_t o = 0; o < rb; o += blk[ti][0]) {
				const uint16_t d16 = hyb_f32_to_f16(type == HYB_TYPE_F16 ? rndf() : 0.01f);

				memcpy(w + r * rb + o + blk[ti][1], &d16, 2);
				memcpy(w + r * rb + o + blk[ti][2], &d16, 2);
			}
		}
		for (uint32_t i = 0; i < n_embd; i++)
			x[i] = rndf();
		put(d, dx, x, 4ull * n_embd);
		for (int t = 0; t < 2; t++) {
			/* copies called in turn, 256 MiB together at least: device memory, not L2 */
			const uint64_t mb = rb * rows[t];
			const uint32_t copies = sm ? 1 : (uint32_t)((256ull * MiB + mb - 1) / mb);
			const double bytes = (double)mb + 4.0 * n_embd;
			hyb_dptr dw = dalloc(d, mb * copies);
			double t0, dt;

			for (uint32_t c = 0; c < copies; c++)
				put(d, dw + mb * c, w, mb);
#define MV(i) (&(struct hyb_dev_matvec){ .type = type, .n_in = n_embd, .n_out = rows[t], \
					  .w = dw + mb * ((i) % copies), .x = dx, .y = dy })
			for (uint32_t i = 0; i < copies + 10; i++)
				OK(d, hyb_device_matvec(d, HYB_STREAM_COMPUTE, MV(i)));
			drain(d, HYB_STREAM_COMPUTE);
			t0 = hyb_device_now(d);
			for (uint32_t i = 0; i < iters; i++)
				OK(d, hyb_device_matvec(d, HYB_STREAM_COMPUTE, MV(i)));
			drain(d, HYB_STREAM_COMPUTE);
#undef MV
			dt = (hyb_device_now(d) - t0) / iters;
			printf("    matvec %-4s %5u x %u (%2u copies): %7.1f us/call, %6.2f MB, %5.0f "
			       "GB/s (%4.1f%% of the %.0f GB/s copy; floor %.1f us)\n",
			       hyb_type_name(type), rows[t], n_embd, copies, dt * 1e6, bytes / 1e6,
			       bytes / dt / 1e9, 100 * bytes / dt / 1e9 / peak, peak,
			       bytes / (peak * 1e9) * 1e6);
			hyb_device_free(d, dw);
		}
		hyb_device_free(d, dx);
		hyb_device_free(d, dy);
		free(w);
		free(x);
	}
	for (int kvh = 0; kvh < 2; kvh++) {
		const uint32_t n_head = sm ? 8 : 32, n_kv = kvh ? n_head : n_head / 4, hd = 128;
		const uint32_t n_pos = sm ? 200 : 2048;
		struct hyb_dev_attn a = {
			.n_head = n_head, .n_head_kv = n_kv, .head_dim = hd, .n_rot = hd,
			.rope = &plain_rope, .pos = n_pos - 1,
			.n_ctx = n_pos,
		};
		const uint64_t kvd = (uint64_t)n_kv * hd, cache = 2 * kvd * n_pos;
		uint16_t *c = malloc(cache);
		float *qkv = malloc(4ull * (n_head + 2 * n_kv) * hd);
		struct attn_side s;
		double t0, dt;

		CHECK(c && qkv);
		attn_alloc(&s, d, &a, 0);
		for (uint64_t i = 0; i < kvd * n_pos; i++)
			c[i] = hyb_f32_to_f16(rndf());
		for (uint64_t i = 0; i < (n_head + 2ull * n_kv) * hd; i++)
			qkv[i] = rndf();
		put(d, s.kc, c, cache);
		put(d, s.vc, c, cache);
		put(d, s.q, qkv, 4ull * n_head * hd);
		put(d, s.k, qkv + n_head * hd, 4 * kvd);
		put(d, s.v, qkv + n_head * hd + kvd, 4 * kvd);
		a.q = s.q;
		a.k = s.k;
		a.v = s.v;
		a.kcache = s.kc;
		a.vcache = s.vc;
		a.out = s.out;
		for (int i = 0; i < 10; i++)
			OK(d, hyb_device_attention(d, HYB_STREAM_COMPUTE, &a));
		drain(d, HYB_STREAM_COMPUTE);
		t0 = hyb_device_now(d);
		for (uint32_t i = 0; i < iters; i++)
			OK(d, hyb_device_attention(d, HYB_STREAM_COMPUTE, &a));
		drain(d, HYB_STREAM_COMPUTE);
		dt = (hyb_device_now(d) - t0) / iters;
		printf("    attention %u/%u heads hd %u, %u positions: %7.1f us/call, %6.2f MB of "
		       "K and V, %5.0f GB/s (%4.1f%% of the copy)\n", n_head, n_kv, hd, n_pos, dt * 1e6,
		       2.0 * cache / 1e6, 2.0 * cache / dt / 1e9,
		       100 * 2.0 * cache / dt / 1e9 / peak);
		attn_free(&s);
		free(c);
		free(qkv);
	}
	hyb_device_close(d);
}

/*
 * One attention block of the 7B shape as the hybrid decode step issues it
 * (hybrid/dense.c: rmsnorm, q, k, v, attention at position 255, o into x,
 * ffn_norm; Q4_0 weights, 8 layers' copies called in turn so they come from
 * device memory): microseconds per block queued back to back (the kernels'
 * own time and the gaps between them), alone (then an event and a host wait:
 * what a layer pays before the CPU can start), and alone with x and xn
 * copied down first (the hybrid step's wait); each with q, k and v as three
 * matvecs and as one (hybrid/dense.c fuses them). Against the floor of the bytes
 * (the four matrices, once) at the measured copy bandwidth: where a layer's
 * time goes, launches and waits or reads.
 */
TEST(gpu_dev_layer_chain_timing)
{
	const uint32_t E = small_shapes() ? 256 : 4096, H = small_shapes() ? 4 : 32, hd = E / H;
	const uint32_t n_ctx = 512, pos = 255, copies = small_shapes() ? 1 : 8, iters = 100;
	const uint64_t rb = hyb_row_bytes(HYB_TYPE_Q4_0, E), mb = rb * E;
	struct hyb_dev_attn a = {
		.n_head = H, .n_head_kv = H, .head_dim = hd, .n_rot = hd, .rope = &plain_rope,
		.pos = pos, .n_ctx = n_ctx,
	};
	struct hyb_device_event *ev;
	struct attn_side as;
	struct hyb_device *d;
	hyb_dptr w, x, xn, norm, qkv;
	uint8_t *hw = malloc(mb);
	float *hx = malloc(8ull * E), *down;
	uint16_t *c = malloc(2ull * E * n_ctx);
	double peak, t0 = 0, dt[6];

	need_gpu_hardware();
	CHECK(hw && hx && c);
	peak = gpu_copy_gbps();
	CHECK(peak > 0);
	d = open_kind("cuda", 1024 * MiB, 0);
	down = hyb_device_host_alloc(d, 8ull * E); /* pinned, as the hybrid step's */
	CHECK(down);
	ev = hyb_device_event_new(d);
	CHECK(ev);
	for (uint64_t i = 0; i < mb; i++)
		hw[i] = (uint8_t)rnd();
	for (uint64_t o = 0; o < mb; o += 18) {
		const uint16_t d16 = hyb_f32_to_f16(0.01f);

		memcpy(hw + o, &d16, 2);
	}
	for (uint64_t i = 0; i < 2ull * E; i++)
		hx[i] = rndf();
	for (uint64_t i = 0; i < (uint64_t)E * n_ctx; i++)
		c[i] = hyb_f32_to_f16(rndf());
	w = dalloc(d, mb * 4 * copies);
	for (uint32_t i = 0; i < 4 * copies; i++)
		put(d, w + mb * i, hw, mb);
	x = dalloc(d, 8ull * E); /* x, then xn: one copy down, as hybrid/dense.c lays them out */
	xn = x + 4ull * E;
	norm = dalloc(d, 4ull * E);
	put(d, x, hx, 8ull * E);
	put(d, norm, hx, 4ull * E);
	attn_alloc(&as, d, &a, 0);
	qkv = dalloc(d, 12ull * E);	/* q | k | v, the fused matvec's rows */
	put(d, as.kc, c, 2ull * E * n_ctx);
	put(d, as.vc, c, 2ull * E * n_ctx);
	a.kcache = as.kc, a.vcache = as.vc, a.out = as.out;
	/* modes 0-2: q, k, v as three matvecs (queued, alone, with x down); 3-5: as one
	 * (hybrid/dense.c does that when the three share a type: rows and outputs back to back) */
	for (int mode = 0; mode < 6; mode++) {
		const bool fused = mode >= 3;

		a.q = fused ? qkv : as.q;
		a.k = fused ? qkv + 4ull * E : as.k;
		a.v = fused ? qkv + 8ull * E : as.v;
		for (uint32_t i = 0; i < iters + copies; i++) {
			const hyb_dptr lw = w + mb * 4 * (i % copies);
			/* (x grows by o each block, linearly: far from overflow in these calls) */
			const hyb_dptr in[4] = { xn, xn, xn, as.out };
			const hyb_dptr out[4] = { a.q, a.k, a.v, x };

			if (i == copies) {
				drain(d, HYB_STREAM_COMPUTE);
				t0 = hyb_device_now(d);
			}
			OK(d, hyb_device_rmsnorm(d, HYB_STREAM_COMPUTE, xn, x, norm, E, 1e-5f));
			for (int m = fused ? 2 : 0; m < 4; m++) {
				struct hyb_dev_matvec mv = {
					.type = HYB_TYPE_Q4_0, .n_in = E, .n_out = E,
					.w = lw + mb * (fused && m == 2 ? 0 : m), .x = in[m],
					.y = fused && m == 2 ? a.q : out[m], .accumulate = m == 3,
				};

				if (fused && m == 2)
					mv.n_out = 3 * E;
				OK(d, hyb_device_matvec(d, HYB_STREAM_COMPUTE, &mv));
				if (m == 2)
					OK(d, hyb_device_attention(d, HYB_STREAM_COMPUTE, &a));
			}
			OK(d, hyb_device_rmsnorm(d, HYB_STREAM_COMPUTE, xn, x, norm, E, 1e-5f));
			if (mode % 3 == 2)
				OK(d, hyb_device_d2h(d, HYB_STREAM_COMPUTE, down, x, 8ull * E));
			if (mode % 3 > 0) {
				OK(d, hyb_device_record(d, HYB_STREAM_COMPUTE, ev));
				OK(d, hyb_device_sync(d, ev));
			}
		}
		drain(d, HYB_STREAM_COMPUTE);
		dt[mode] = (hyb_device_now(d) - t0) / iters;
	}
	for (int f = 0; f < 2; f++)
		printf("    attention block %u x %u Q4_0, position %u, %u copies, q/k/v in %s: "
		       "%.1f us queued, %.1f us alone, %.1f us with x down; floor %.1f us "
		       "(%.1f MB of weights at the %.0f GB/s copy)\n", E, E, pos, copies,
		       f ? "one matvec" : "three", dt[3 * f] * 1e6, dt[3 * f + 1] * 1e6,
		       dt[3 * f + 2] * 1e6, 4.0 * mb / (peak * 1e9) * 1e6, 4.0 * mb / 1e6, peak);
	CHECK(dt[0] > 0 && dt[1] >= dt[0] * 0.5);
	attn_free(&as);
	hyb_device_free(d, qkv);
	hyb_device_free(d, w);
	hyb_device_free(d, x);
	hyb_device_free(d, norm);
	hyb_device_event_free(d, ev);
	hyb_device_host_free(d, down);
	hyb_device_close(d);
	free(hw);
	free(hx);
	free(c);
}

/*
 * KAIROX 5.1's bound on the GPU: a 16 KiB critical copy issued behind a
 * 64 MiB reload burst (1 MiB chunks through the lane, reload_lane.h) lands
 * after at most the two chunks the lane keeps outstanding, not after the
 * burst. Host clock from the critical copy's issue to its completion,
 * against the burst's own time; the burst is checked whole afterwards.
 */
TEST(gpu_dev_critical_copy_jumps_the_reload_burst)
{
	enum { BURST = 64 * MiB, SMALL = 16 << 10 };
	struct hyb_device *d;
	struct hyb_device_event *ev_c, *ev_r;
	uint8_t *hb, *hs, *back;
	hyb_dptr db, ds;
	struct timespec t0, t1, t2;
	double crit, burst;

	need_gpu_hardware();
	d = open_kind("cuda", 256 * MiB, 1 * MiB);
	hb = hyb_device_host_alloc(d, BURST);
	hs = hyb_device_host_alloc(d, SMALL);
	back = malloc(BURST);
	CHECK(hb && hs && back);
	fill(hb, BURST, 3);
	fill(hs, SMALL, 5);
	db = dalloc(d, BURST);
	ds = dalloc(d, SMALL);
	ev_c = hyb_device_event_new(d);
	ev_r = hyb_device_event_new(d);
	CHECK(ev_c && ev_r);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	OK(d, hyb_device_h2d(d, HYB_STREAM_RELOAD, db, hb, BURST));
	OK(d, hyb_device_record(d, HYB_STREAM_RELOAD, ev_r));
	OK(d, hyb_device_h2d(d, HYB_STREAM_CRITICAL, ds, hs, SMALL));
	OK(d, hyb_device_record(d, HYB_STREAM_CRITICAL, ev_c));
	OK(d, hyb_device_sync(d, ev_c));
	clock_gettime(CLOCK_MONOTONIC, &t1);
	OK(d, hyb_device_sync(d, ev_r));
	clock_gettime(CLOCK_MONOTONIC, &t2);
	crit = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
	burst = (t2.tv_sec - t0.tv_sec) + (t2.tv_nsec - t0.tv_nsec) * 1e-9;
	fprintf(stderr, "  critical 16 KiB copy behind a 64 MiB reload burst: %.1f us (the burst "
		"%.1f us; two 1 MiB chunks %.1f us)\n", crit * 1e6, burst * 1e6,
		burst * 1e6 * 2 / 64);
	/* two chunks and the copy's own latency, with room for the host's scheduling */
	CHECK_MSG(crit < burst / 4, "the critical copy waited %.1f us of the burst's %.1f us",
		  crit * 1e6, burst * 1e6);
	OK(d, hyb_device_d2h(d, HYB_STREAM_CRITICAL, back, db, BURST));
	drain(d, HYB_STREAM_CRITICAL);
	CHECK(!memcmp(back, hb, BURST));
	hyb_device_event_free(d, ev_c);
	hyb_device_event_free(d, ev_r);
	hyb_device_host_free(d, hb);
	hyb_device_host_free(d, hs);
	free(back);
	hyb_device_close(d);
}

/* ---- graphs (docs/DEVICE.md "Graphs") ------------------------------------------------ */

/* The step's host function: the CPU's share, part = 2 down + 1, from what came down. */
struct step_host {
	const float *down;
	float *part;
	uint32_t n, calls;
};

static void step_fn(void *arg)
{
	struct step_host *h = arg;

	for (uint32_t i = 0; i < h->n; i++)
		h->part[i] = 2 * h->down[i] + 1;
	h->calls++;
}

struct step {
	uint32_t n;
	hyb_dptr w, nw, x, xn, y, p, y2;
	float *hx, *hdown, *hpart, *hout; /* pinned: a graph's copies need it */
	struct hyb_device_event *fork, *join;
	struct step_host host;
};

static void step_init(struct step *s, struct hyb_device *d, uint32_t n, const uint8_t *w,
		      const float *nw)
{
	const uint64_t wb = hyb_row_bytes(HYB_TYPE_Q4_0, n) * n;

	s->n = n;
	s->w = dalloc(d, wb);
	s->nw = dalloc(d, 4ull * n);
	s->x = dalloc(d, 4ull * n);
	s->xn = dalloc(d, 4ull * n);
	s->y = dalloc(d, 4ull * n);
	s->p = dalloc(d, 4ull * n);
	s->y2 = dalloc(d, 8ull * n);
	put(d, s->w, w, wb);
	put(d, s->nw, nw, 4ull * n);
	s->hx = hyb_device_host_alloc(d, 4ull * n);
	s->hdown = hyb_device_host_alloc(d, 4ull * n);
	s->hpart = hyb_device_host_alloc(d, 4ull * n);
	s->hout = hyb_device_host_alloc(d, 8ull * n);
	s->fork = hyb_device_event_new(d);
	s->join = hyb_device_event_new(d);
	CHECK(s->hx && s->hdown && s->hpart && s->hout && s->fork && s->join);
	s->host = (struct step_host){ s->hdown, s->hpart, n, 0 };
}

static void step_free(struct step *s, struct hyb_device *d)
{
	hyb_device_event_free(d, s->fork);
	hyb_device_event_free(d, s->join);
	hyb_device_host_free(d, s->hx);
	hyb_device_host_free(d, s->hdown);
	hyb_device_host_free(d, s->hpart);
	hyb_device_host_free(d, s->hout);
}

/*
 * A decode step's shape: x up, rmsnorm, a matvec whose output goes down to
 * the host function on CRITICAL, its result up and added on COMPUTE after
 * the join, a group of two matvecs, the result down.
 */
static void step_queue(struct hyb_device *d, struct step *s)
{
	const uint32_t n = s->n;
	const struct hyb_dev_matvec mv = { .type = HYB_TYPE_Q4_0, .n_in = n, .n_out = n,
					   .w = s->w, .x = s->xn, .y = s->y };
	const struct hyb_dev_matvec grp[2] = {
		{ .type = HYB_TYPE_Q4_0, .n_in = n, .n_out = n, .w = s->w, .x = s->y, .y = s->y2 },
		{ .type = HYB_TYPE_Q4_0, .n_in = n, .n_out = n, .w = s->w, .x = s->xn,
		  .y = s->y2 + 4ull * n },
	};

	OK(d, hyb_device_h2d(d, HYB_STREAM_COMPUTE, s->x, s->hx, 4ull * n));
	OK(d, hyb_device_rmsnorm(d, HYB_STREAM_COMPUTE, s->xn, s->x, s->nw, n, 1e-5f));
	OK(d, hyb_device_matvec(d, HYB_STREAM_COMPUTE, &mv));
	OK(d, hyb_device_record(d, HYB_STREAM_COMPUTE, s->fork));
	OK(d, hyb_device_wait(d, HYB_STREAM_CRITICAL, s->fork));
	OK(d, hyb_device_d2h(d, HYB_STREAM_CRITICAL, s->hdown, s->y, 4ull * n));
	OK(d, hyb_device_host_fn(d, HYB_STREAM_CRITICAL, step_fn, &s->host));
	OK(d, hyb_device_h2d(d, HYB_STREAM_CRITICAL, s->p, s->hpart, 4ull * n));
	OK(d, hyb_device_record(d, HYB_STREAM_CRITICAL, s->join));
	OK(d, hyb_device_wait(d, HYB_STREAM_COMPUTE, s->join));
	OK(d, hyb_device_add(d, HYB_STREAM_COMPUTE, s->y, s->p, n));
	OK(d, hyb_device_matvec_group(d, HYB_STREAM_COMPUTE, grp, 2));
	OK(d, hyb_device_d2h(d, HYB_STREAM_COMPUTE, s->hout, s->y2, 8ull * n));
}

/*
 * The step queued call by call and as a graph launched three times with new
 * inputs, on the CUDA device and on the CPU device: the graph gives its
 * device's stream bits, and the host function runs once a launch, after
 * the download it reads has landed.
 */
TEST(gpu_dev_graph_is_the_stream_work)
{
	enum { K = 3 };
	const uint32_t n = 256;
	const uint64_t rb = hyb_row_bytes(HYB_TYPE_Q4_0, n);
	struct hyb_device *dev[2];
	uint8_t *w = malloc(rb * n);
	float *nw = malloc(4ull * n), *x = malloc(4ull * n * K), *ref[2][K];
	struct step st[2];

	need_gpu();
	CHECK(w && nw && x);
	for (uint32_t r = 0; r < n; r++) {
		float row[256];

		for (uint32_t i = 0; i < n; i++)
			row[i] = rndf() / 16;
		CHECK(hyb_quantize_row_ref(HYB_TYPE_Q4_0, row, w + r * rb, n) == 0);
	}
	for (uint32_t i = 0; i < n; i++)
		nw[i] = 1 + rndf() / 4;
	for (uint32_t i = 0; i < n * K; i++)
		x[i] = rndf();
	dev[0] = open_kind("cuda", 64 * MiB, 0);
	dev[1] = open_kind("cpu", 64 * MiB, 0);
	for (int k = 0; k < 2; k++) {
		struct hyb_device *d = dev[k];
		struct hyb_device_graph *g = NULL;

		step_init(&st[k], d, n, w, nw);
		for (int i = 0; i < K; i++) {
			ref[k][i] = malloc(8ull * n);
			CHECK(ref[k][i]);
			memcpy(st[k].hx, x + (size_t)i * n, 4ull * n);
			step_queue(d, &st[k]);
			drain(d, HYB_STREAM_COMPUTE);
			memcpy(ref[k][i], st[k].hout, 8ull * n);
		}
		CHECK_EQ_INT(st[k].host.calls, K);
		OK(d, hyb_device_capture_begin(d, HYB_STREAM_COMPUTE));
		step_queue(d, &st[k]);
		OK(d, hyb_device_capture_end(d, &g));
		CHECK_EQ_INT(st[k].host.calls, K); /* captured, not run */
		for (int rep = 0; rep < 2; rep++)
			for (int i = 0; i < K; i++) {
				memcpy(st[k].hx, x + (size_t)i * n, 4ull * n);
				memset(st[k].hout, 0, 8ull * n);
				OK(d, hyb_device_graph_launch(d, g));
				drain(d, HYB_STREAM_COMPUTE);
				CHECK_MSG(!memcmp(st[k].hout, ref[k][i], 8ull * n), "%s: launch %d of "
					  "input %d: not the stream's bits", hyb_device_kind(d), rep, i);
			}
		CHECK_EQ_INT(st[k].host.calls, 3 * K);
		hyb_device_graph_free(d, g);
	}
	/* the two devices agree (the matvec's float order aside) */
	for (int i = 0; i < K; i++) {
		const double e = max_diff(ref[0][i], ref[1][i], 2ull * n), m = max_abs(ref[1][i], 2ull * n);

		CHECK_MSG(e <= 1e-3 * m, "input %d: cuda and cpu differ by %g (max %g)", i, e, m);
		free(ref[0][i]);
		free(ref[1][i]);
	}
	for (int k = 0; k < 2; k++) {
		step_free(&st[k], dev[k]);
		hyb_device_close(dev[k]);
	}
	free(w);
	free(nw);
	free(x);
}

/*
 * A workspace cannot grow inside a capture (that waits for the stream and
 * allocates): the attention's first call on a stream is refused there, and
 * captured once the same call ran before. A pageable copy CUDA cannot
 * capture spoils the capture, not the device.
 */
TEST(gpu_dev_graph_refuses_growth)
{
	const struct hyb_dev_attn base = { .n_head = 4, .n_head_kv = 2, .head_dim = 64,
					   .n_rot = 64, .rope = &plain_rope, .n_ctx = 16 };
	struct hyb_device *d;
	struct hyb_device_graph *g = NULL;
	struct hyb_dev_attn a = base;
	float *q = malloc(4 * 256);

	need_gpu();
	CHECK(q);
	d = open_kind("cuda", 64 * MiB, 0);
	a.q = dalloc(d, 4 * 256);
	a.k = dalloc(d, 4 * 128);
	a.v = dalloc(d, 4 * 128);
	a.kcache = dalloc(d, 2 * 128 * 16);
	a.vcache = dalloc(d, 2 * 128 * 16);
	a.out = dalloc(d, 4 * 256);
	for (int i = 0; i < 256; i++)
		q[i] = rndf();
	put(d, a.q, q, 4 * 256);
	put(d, a.k, q, 4 * 128);
	put(d, a.v, q + 128, 4 * 128);
	OK(d, hyb_device_capture_begin(d, HYB_STREAM_COMPUTE));
	CHECK_EQ_INT(hyb_device_attention(d, HYB_STREAM_COMPUTE, &a), -EBUSY);
	CHECK_EQ_INT(hyb_device_capture_end(d, &g), -EBUSY);
	CHECK_MSG(strstr(hyb_device_error(d), "attention workspace would grow") && !g, "%s",
		  hyb_device_error(d));
	OK(d, hyb_device_attention(d, HYB_STREAM_COMPUTE, &a));
	OK(d, hyb_device_capture_begin(d, HYB_STREAM_COMPUTE));
	a.pos = 1;
	OK(d, hyb_device_attention(d, HYB_STREAM_COMPUTE, &a));
	OK(d, hyb_device_capture_end(d, &g));
	OK(d, hyb_device_graph_launch(d, g));
	drain(d, HYB_STREAM_COMPUTE);
	hyb_device_graph_free(d, g);
	/* a copy CUDA cannot capture (pageable memory) spoils the capture, not the device */
	OK(d, hyb_device_capture_begin(d, HYB_STREAM_COMPUTE));
	CHECK_EQ_INT(hyb_device_h2d(d, HYB_STREAM_COMPUTE, a.q, q, 4 * 256), -EBUSY);
	CHECK(hyb_device_capture_end(d, &g) != 0 && !g);
	OK(d, hyb_device_attention(d, HYB_STREAM_COMPUTE, &a));
	drain(d, HYB_STREAM_COMPUTE);
	free(q);
	hyb_device_close(d);
}

/*
 * What a graph saves on a GPU (KTransformers 3.3): the host time of 256
 * small kernels queued one by one against one launch of the same kernels
 * captured, each to completion, medians of 7, alternated.
 */
TEST(gpu_dev_graph_launch_cost)
{
	enum { NK = 256, REPS = 7 };
	struct hyb_device *d;
	struct hyb_device_graph *g = NULL;
	double ts[REPS], tg[REPS];
	struct timespec t0, t1;
	hyb_dptr y, x;

	need_gpu_hardware();
	d = open_kind("cuda", 64 * MiB, 0);
	y = dalloc(d, 4096);
	x = dalloc(d, 4096);
	OK(d, hyb_device_capture_begin(d, HYB_STREAM_COMPUTE));
	for (int i = 0; i < NK; i++)
		OK(d, hyb_device_add(d, HYB_STREAM_COMPUTE, y, x, 1024));
	OK(d, hyb_device_capture_end(d, &g));
	for (int r = 0; r < REPS; r++) {
		clock_gettime(CLOCK_MONOTONIC, &t0);
		for (int i = 0; i < NK; i++)
			OK(d, hyb_device_add(d, HYB_STREAM_COMPUTE, y, x, 1024));
		drain(d, HYB_STREAM_COMPUTE);
		clock_gettime(CLOCK_MONOTONIC, &t1);
		ts[r] = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		OK(d, hyb_device_graph_launch(d, g));
		drain(d, HYB_STREAM_COMPUTE);
		clock_gettime(CLOCK_MONOTONIC, &t1);
		tg[r] = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
	}
	for (int i = 1; i < REPS; i++)
		for (int j = i; j > 0 && ts[j] < ts[j - 1]; j--) {
			double t = ts[j];
			ts[j] = ts[j - 1];
			ts[j - 1] = t;
		}
	for (int i = 1; i < REPS; i++)
		for (int j = i; j > 0 && tg[j] < tg[j - 1]; j--) {
			double t = tg[j];
			tg[j] = tg[j - 1];
			tg[j - 1] = t;
		}
	fprintf(stderr, "  %d kernels: one by one %.1f us, a graph %.1f us (%.2fx; %.2f vs %.2f us "
		"a kernel)\n", NK, ts[REPS / 2] * 1e6, tg[REPS / 2] * 1e6,
		ts[REPS / 2] / tg[REPS / 2], ts[REPS / 2] * 1e6 / NK, tg[REPS / 2] * 1e6 / NK);
	CHECK_MSG(tg[REPS / 2] < ts[REPS / 2], "the graph (%.1f us) is no faster than the launches "
		  "(%.1f us)", tg[REPS / 2] * 1e6, ts[REPS / 2] * 1e6);
	hyb_device_graph_free(d, g);
	hyb_device_close(d);
}

/* The work queued on COMPUTE faulted the device, and the message says msg. */
static void expect_fault(struct hyb_device *d, const char *msg)
{
	struct hyb_device_event *ev = hyb_device_event_new(d);

	hyb_device_record(d, HYB_STREAM_COMPUTE, ev);
	CHECK_EQ_INT(hyb_device_sync(d, ev), -EIO);
	CHECK_MSG(strstr(hyb_device_error(d), msg), "'%s' does not say '%s'", hyb_device_error(d),
		  msg);
	hyb_device_event_free(d, ev);
}

/*
 * The attention of a graph's step (pos_at): a graph of the step's copies
 * and its attention, launched at positions in any order with the position
 * uploaded from pinned memory, against the by-value call at each, on CUDA
 * and on the CPU device, bit for bit: out, the roped q, the cache row
 * written. Long positions take several chunks on CUDA; a sliding window
 * moves the first row. A position past the cache faults the device.
 */
static void pos_at_case(const char *kind, uint32_t n_swa)
{
	const uint32_t nh = 8, nkv = 2, hd = 64, qd = nh * hd, kvd = nkv * hd;
	const uint32_t n_ctx = small_shapes() ? 1024 : 4096;
	const uint32_t order[] = { 0, 1, 2, 63, 64, 65, 200, n_ctx / 2 + 7, n_ctx - 1, 5 };
	const uint64_t cache = 2ull * n_ctx * kvd;
	struct hyb_device *d = open_kind(kind, 256 * MiB, 0);
	struct hyb_dev_attn a = { .n_head = nh, .n_head_kv = nkv, .head_dim = hd, .n_rot = hd,
				  .rope = &yarn_rope, .n_ctx = n_ctx, .n_swa = n_swa };
	struct hyb_dev_attn b;
	struct hyb_device_graph *g = NULL;
	uint16_t *kc = malloc(cache);
	float *in = hyb_device_host_alloc(d, 4ull * (qd + 2 * kvd));
	float *oa = malloc(4ull * qd), *ob = hyb_device_host_alloc(d, 4ull * qd);
	uint32_t *hpos = hyb_device_host_alloc(d, 4);
	uint16_t *ra = malloc(4ull * kvd), *rb = malloc(4ull * kvd);
	hyb_dptr ia, ib;

	CHECK(kc && in && oa && ob && hpos && ra && rb);
	for (uint64_t i = 0; i < cache / 2; i++) /* finite F16 of magnitude < 2 */
		kc[i] = (uint16_t)((rnd() & 0x3bff) | (rnd() & 1) << 15);
	/* side a: q, k, v, out, caches; side b the same and the position */
	ia = dalloc(d, 4ull * (2 * qd + 2 * kvd));
	ib = dalloc(d, 4ull * (2 * qd + 2 * kvd) + 256);
	a.q = ia;
	a.k = ia + 4ull * qd;
	a.v = a.k + 4ull * kvd;
	a.out = a.v + 4ull * kvd;
	a.kcache = dalloc(d, cache);
	a.vcache = dalloc(d, cache);
	b = a;
	b.q = ib;
	b.k = ib + 4ull * qd;
	b.v = b.k + 4ull * kvd;
	b.out = b.v + 4ull * kvd;
	b.pos_at = b.out + 4ull * qd;
	b.kcache = dalloc(d, cache);
	b.vcache = dalloc(d, cache);
	put(d, a.kcache, kc, cache);
	put(d, b.kcache, kc, cache);
	for (uint64_t i = 0; i < cache / 2; i++)
		kc[i] = (uint16_t)((rnd() & 0x3bff) | (rnd() & 1) << 15);
	put(d, a.vcache, kc, cache);
	put(d, b.vcache, kc, cache);
	/* the step once before capturing: CUDA sizes its workspace and RoPE table then */
	*hpos = 0;
	put(d, b.pos_at, hpos, 4);
	OK(d, hyb_device_attention(d, HYB_STREAM_COMPUTE, &b));
	drain(d, HYB_STREAM_COMPUTE);
	OK(d, hyb_device_capture_begin(d, HYB_STREAM_COMPUTE));
	OK(d, hyb_device_h2d(d, HYB_STREAM_COMPUTE, b.q, in, 4ull * (qd + 2 * kvd)));
	OK(d, hyb_device_h2d(d, HYB_STREAM_COMPUTE, b.pos_at, hpos, 4));
	OK(d, hyb_device_attention(d, HYB_STREAM_COMPUTE, &b));
	OK(d, hyb_device_d2h(d, HYB_STREAM_COMPUTE, ob, b.out, 4ull * qd));
	OK(d, hyb_device_capture_end(d, &g));
	for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
		const uint32_t pos = order[i];

		for (uint32_t e = 0; e < qd + 2 * kvd; e++)
			in[e] = rndf() * 2;
		put(d, a.q, in, 4ull * (qd + 2 * kvd));
		a.pos = pos;
		OK(d, hyb_device_attention(d, HYB_STREAM_COMPUTE, &a));
		get(d, oa, a.out, 4ull * qd);
		*hpos = pos;
		OK(d, hyb_device_graph_launch(d, g));
		drain(d, HYB_STREAM_COMPUTE);
		CHECK_MSG(!memcmp(oa, ob, 4ull * qd), "%s, window %u: position %u: the graph's "
			  "attention differs from the call's", kind, n_swa, pos);
		get(d, ra, a.kcache + 2ull * pos * kvd, 2ull * kvd);
		get(d, rb, b.kcache + 2ull * pos * kvd, 2ull * kvd);
		CHECK_MSG(!memcmp(ra, rb, 2ull * kvd), "%s: position %u: cache rows differ", kind,
			  pos);
		get(d, oa, a.q, 4ull * qd);
		get(d, ob, b.q, 4ull * qd);
		CHECK_MSG(!memcmp(oa, ob, 4ull * qd), "%s: position %u: roped q differs", kind, pos);
	}
	/* a position past the cache: a device fault naming it, nothing written */
	*hpos = n_ctx;
	CHECK(hyb_device_graph_launch(d, g) == 0 || !strcmp(kind, "cpu"));
	expect_fault(d, "read from device memory");
	hyb_device_graph_free(d, g);
	hyb_device_host_free(d, in);
	hyb_device_host_free(d, ob);
	hyb_device_host_free(d, hpos);
	free(kc);
	free(oa);
	free(ra);
	free(rb);
	hyb_device_close(d);
}

TEST(gpu_dev_attention_pos_at_in_a_graph)
{
	need_gpu();
	pos_at_case("cuda", 0);
	pos_at_case("cuda", 100);
	pos_at_case("cpu", 0);
	pos_at_case("cpu", 100);
}

/*
 * Matvecs listed in device memory (hyb_dev_matvec_table) on CUDA: each
 * listed item is hyb_device_matvec's launch, bit for bit, unlisted rows
 * untouched, with the list changing between launches of a graph, as a
 * router's choice does; a bad list faults the device naming the item.
 */
static void table_case(uint32_t type, uint32_t n_in, uint32_t n_out, uint32_t w_off)
{
	enum { SLOTS = 7, ROWS = 6, MAX = 12 };
	static const uint32_t lists[3][1 + 3 * MAX] = {
		{ 3, 6, 0, 5, 0, 1, 0, 2, 5, 2 },
		{ 1, 3, 3, 3 },
		{ 6, 0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4, 5, 5, 5 },
	};
	const uint64_t rb = hyb_row_bytes(type, n_in), stride = (rb * n_out + 15) / 16 * 16 + 16;
	struct hyb_device *d = open_kind("cuda", 256 * MiB, 0);
	uint8_t *w = malloc(stride * SLOTS);
	float *row = malloc(4ull * n_in), *x = malloc(4ull * n_in * ROWS);
	/* a graph's copies need pinned memory */
	float *y0 = hyb_device_host_alloc(d, 4ull * n_out * ROWS), *want = malloc(4ull * n_out * ROWS);
	float *got = hyb_device_host_alloc(d, 4ull * n_out * ROWS);
	uint32_t *hl = hyb_device_host_alloc(d, 4 * (1 + 3 * MAX));
	const hyb_dptr dw = dalloc(d, stride * SLOTS + w_off) + w_off;
	const hyb_dptr dx = dalloc(d, 4ull * n_in * ROWS), dy = dalloc(d, 4ull * n_out * ROWS);
	const hyb_dptr items = dalloc(d, 4 * (1 + 3 * MAX)), tmp = dalloc(d, 4ull * n_out);
	const struct hyb_dev_matvec_table t = {
		.type = type, .n_in = n_in, .n_out = n_out, .w = dw, .w_stride = stride,
		.n_w = SLOTS, .x = dx, .n_x = ROWS, .y = dy, .n_y = ROWS, .items = items, .max = MAX,
	};
	struct hyb_device_graph *g = NULL;

	CHECK(w && row && x && y0 && want && got && hl);
	memset(w, 0, stride * SLOTS);
	for (uint32_t s = 0; s < SLOTS; s++)
		for (uint32_t r = 0; r < n_out; r++) {
			for (uint32_t i = 0; i < n_in; i++)
				row[i] = rndf() / sqrtf((float)n_in);
			CHECK(hyb_quantize_row_ref(type, row, w + s * stride + r * rb, n_in) == 0);
		}
	for (uint64_t i = 0; i < (uint64_t)n_in * ROWS; i++)
		x[i] = rndf();
	for (uint64_t i = 0; i < (uint64_t)n_out * ROWS; i++)
		y0[i] = rndf();
	put(d, dw, w, stride * SLOTS);
	put(d, dx, x, 4ull * n_in * ROWS);
	OK(d, hyb_device_capture_begin(d, HYB_STREAM_COMPUTE));
	OK(d, hyb_device_h2d(d, HYB_STREAM_COMPUTE, dy, y0, 4ull * n_out * ROWS));
	OK(d, hyb_device_h2d(d, HYB_STREAM_COMPUTE, items, hl, 4 * (1 + 3 * MAX)));
	OK(d, hyb_device_matvec_table(d, HYB_STREAM_COMPUTE, &t));
	OK(d, hyb_device_d2h(d, HYB_STREAM_COMPUTE, got, dy, 4ull * n_out * ROWS));
	OK(d, hyb_device_capture_end(d, &g));
	for (int k = 0; k < 3; k++) {
		memcpy(want, y0, 4ull * n_out * ROWS);
		for (uint32_t i = 0; i < lists[k][0]; i++) {
			const uint32_t *e = lists[k] + 1 + 3 * i;
			const struct hyb_dev_matvec m = { .type = type, .n_in = n_in, .n_out = n_out,
							  .w = dw + e[0] * stride,
							  .x = dx + 4ull * n_in * e[1], .y = tmp };

			OK(d, hyb_device_matvec(d, HYB_STREAM_COMPUTE, &m));
			get(d, want + (uint64_t)e[2] * n_out, tmp, 4ull * n_out);
		}
		memcpy(hl, lists[k], sizeof(lists[k]));
		OK(d, hyb_device_graph_launch(d, g));
		drain(d, HYB_STREAM_COMPUTE);
		CHECK_MSG(!memcmp(got, want, 4ull * n_out * ROWS), "%s %ux%u w_off %u list %d: the "
			  "table's outputs are not the matvecs'", hyb_type_name(type), n_out, n_in,
			  w_off, k);
	}
	/* y row 2 twice: the second is refused, the device faults */
	memcpy(hl, (const uint32_t[]){ 2, 0, 0, 2, 1, 1, 2 }, 7 * 4);
	OK(d, hyb_device_graph_launch(d, g));
	expect_fault(d, "matvec table: item 1");
	hyb_device_graph_free(d, g);
	hyb_device_host_free(d, hl);
	hyb_device_host_free(d, y0);
	hyb_device_host_free(d, got);
	hyb_device_close(d);
	free(w);
	free(row);
	free(x);
	free(want);
}

TEST(gpu_dev_matvec_table)
{
	need_gpu();
	table_case(HYB_TYPE_Q4_0, 256, 67, 0);
	table_case(HYB_TYPE_Q4_K, 512, 40, 0);
	table_case(HYB_TYPE_F16, 96, 33, 2);
	table_case(HYB_TYPE_Q8_0, 128, 24, 0);
	if (!small_shapes())
		table_case(HYB_TYPE_Q4_0, 2048, 768, 0);
}
