// SPDX-License-Identifier: MIT
/*
 * TEAL's transposed layout and its input-sparse GEMV (teal.h,
 * docs/SPARSITY.md#teal).
 *
 * Transposing: a weight is read 32 output rows at a time (one block of the
 * transposed type), dequantized, and each input's 32 values are written as
 * one block of row `input`. F32 and F16 weights transpose exactly; Q8_0
 * and Q4_0 are quantized again along the other axis (their values move by
 * at most half a step of the new block's scale: hyb perplexity measures
 * what that costs). Other types are refused.
 */
#include "teal.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "cpu_kernels.h"
#include "sparse_ffn_kernels.h"
#include "util/error.h"

#define TILE 32 /* output rows transposed at a time: a block of every block type here */
#define HUGE (2u << 20)
#define UNIT_MIN 128 /* outputs a GEMV thread takes at a time, at least */

static pthread_mutex_t layout_lock = PTHREAD_MUTEX_INITIALIZER;

static bool type_ok(uint32_t t)
{
	return t == HYB_TYPE_F32 || t == HYB_TYPE_F16 || t == HYB_TYPE_Q8_0 || t == HYB_TYPE_Q4_0;
}

/* The (up to three) source weights of input `in` of layer L, side by side. */
static int sources(const struct hyb_layer *L, uint32_t in, const struct hyb_weight **w)
{
	switch (in) {
	case HYB_TEAL_QKV: w[0] = &L->wq; w[1] = &L->wk; w[2] = &L->wv; return 3;
	case HYB_TEAL_O: w[0] = &L->wo; return 1;
	case HYB_TEAL_GU: w[0] = &L->gate; w[1] = &L->up; return 2;
	default: w[0] = &L->down; return 1;
	}
}

int hyb_teal_check(const struct hyb_model *m)
{
	const struct hyb_hparams *hp = &m->hp;

	if (hp->n_expert)
		return hyb_error_set(-EINVAL, "TEAL covers dense FFNs; this model's are mixtures "
				     "of experts");
	if (hp->kv_lora)
		return hyb_error_set(-EINVAL, "TEAL covers plain attention; this model's is latent "
				     "(MLA)");
	if (m->group_size || m->powerinfer)
		return hyb_error_set(-EINVAL, "TEAL runs on a model in its own layout; this is a "
				     "%s file", m->group_size ? "plan" : "PowerInfer");
	if (hp->act != HYB_ACT_SILU && hp->act != HYB_ACT_GELU)
		return hyb_error_set(-EINVAL, "TEAL thresholds are for SiLU and GELU models; this "
				     "model's FFN is ReLU-family, sparse as it is");
	return 0;
}

int hyb_teal_layout_check(const struct hyb_model *m)
{
	int rc = hyb_teal_check(m);

	for (uint32_t l = 0; !rc && l < m->hp.n_layer; l++)
		for (uint32_t in = 0; in < HYB_TEAL_INPUTS; in++) {
			const struct hyb_weight *w[3];
			const int nw = sources(&m->layers[l], in, w);

			for (int i = 0; i < nw; i++) {
				const bool blocks = w[i]->type != HYB_TYPE_F32 &&
						    w[i]->type != HYB_TYPE_F16;

				if (!w[i]->data || !type_ok(w[i]->type) ||
				    w[i]->type != w[0]->type)
					return hyb_error_set(-EINVAL, "TEAL's transposed layout takes "
							     "F32, F16, Q8_0 and Q4_0 weights "
							     "of one type per input; layer %u's "
							     "%s input has %s", l,
							     hyb_teal_input_name(in),
							     hyb_type_name(w[i]->type));
				if (blocks && w[i]->ne1 % TILE)
					return hyb_error_set(-EINVAL, "layer %u: %llu outputs of %s "
							     "do not fill blocks of %u", l,
							     (unsigned long long)w[i]->ne1,
							     hyb_type_name(w[i]->type), TILE);
			}
		}
	return rc;
}

static uint32_t mat_out(const struct hyb_layer *L, uint32_t in)
{
	const struct hyb_weight *w[3];
	const int nw = sources(L, in, w);
	uint64_t n = 0;

	for (int i = 0; i < nw; i++)
		n += w[i]->ne1;
	return (uint32_t)n;
}

uint32_t hyb_teal_max_in(const struct hyb_model *m)
{
	uint32_t n = 0;

	for (uint32_t l = 0; l < m->hp.n_layer; l++)
		for (uint32_t in = 0; in < HYB_TEAL_INPUTS; in++) {
			const struct hyb_weight *w[3];

			sources(&m->layers[l], in, w);
			n = w[0]->ne0 > n ? (uint32_t)w[0]->ne0 : n;
		}
	return n;
}

uint32_t hyb_teal_max_out(const struct hyb_model *m)
{
	uint32_t n = 0;

	for (uint32_t l = 0; l < m->hp.n_layer; l++)
		for (uint32_t in = 0; in < HYB_TEAL_INPUTS; in++) {
			const uint32_t o = mat_out(&m->layers[l], in);

			n = o > n ? o : n;
		}
	return n;
}

/* ---- transposing ----------------------------------------------------------- */

struct tile {
	const struct hyb_weight *w;
	const struct hyb_teal_mat *t;
	uint32_t col0; /* the weight's first column in the transposed rows */
	uint32_t r0;   /* its first output row in this tile */
};

struct transpose_job {
	const struct hyb_cpu_kernels *k;
	const struct tile *tiles;
	uint64_t n_tiles;
	uint32_t max_in;
	atomic_ullong next;
	atomic_int failed;
};

static void transpose_worker(void *arg, int ith, int nth)
{
	struct transpose_job *j = arg;
	float *buf = malloc(sizeof(float) * TILE * j->max_in);
	float v[TILE];

	(void)ith;
	(void)nth;
	if (!buf) {
		atomic_store(&j->failed, 1);
		return;
	}
	for (;;) {
		const uint64_t n = atomic_fetch_add(&j->next, 1);

		if (n >= j->n_tiles)
			break;
		const struct tile *tl = &j->tiles[n];
		const struct hyb_weight *w = tl->w;
		const uint32_t in = (uint32_t)w->ne0;
		const uint32_t nr = w->ne1 - tl->r0 < TILE ? (uint32_t)(w->ne1 - tl->r0) : TILE;
		const uint64_t off = hyb_row_bytes(tl->t->type, tl->col0 + tl->r0);

		for (uint32_t r = 0; r < nr; r++)
			j->k->dequantize[w->type]((const char *)w->data +
						  (tl->r0 + r) * w->row_bytes, buf + (size_t)r * in,
						  in);
		for (uint32_t i = 0; i < in; i++) {
			char *dst = (char *)tl->t->data + (uint64_t)i * tl->t->row_bytes + off;

			for (uint32_t r = 0; r < nr; r++)
				v[r] = buf[(size_t)r * in + i];
			if (hyb_quantize_row_ref(tl->t->type, v, dst, nr))
				atomic_store(&j->failed, 1);
		}
	}
	free(buf);
}

static void *anon(uint64_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED)
		return NULL;
	/* decode streams these rows every token: 2 MiB pages spare the TLB */
	madvise(p, len, MADV_HUGEPAGE);
	return p;
}

static struct hyb_teal *build(const struct hyb_model *m, struct hyb_threadpool *pool)
{
	const struct hyb_hparams *hp = &m->hp;
	const uint32_t NI = HYB_TEAL_INPUTS;
	struct hyb_teal *t = calloc(1, sizeof(*t));
	struct transpose_job j = { .k = hyb_cpu_best(), .max_in = hyb_teal_max_in(m) };
	struct tile *tiles = NULL;
	uint64_t bytes = 0, nt = 0;

	if (!t || !(t->mat = calloc((size_t)hp->n_layer * NI, sizeof(*t->mat))))
		goto nomem;
	for (uint32_t l = 0; l < hp->n_layer; l++)
		for (uint32_t in = 0; in < NI; in++) {
			struct hyb_teal_mat *mt = &t->mat[(size_t)l * NI + in];
			const struct hyb_weight *w[3];
			const int nw = sources(&m->layers[l], in, w);

			mt->type = w[0]->type;
			mt->n_in = (uint32_t)w[0]->ne0;
			mt->n_out = mat_out(&m->layers[l], in);
			/* rows on 64 bytes: each starts a cache line */
			mt->row_bytes = (hyb_row_bytes(mt->type, mt->n_out) + 63) & ~63ull;
			mt->data = (const void *)(uintptr_t)bytes; /* offset until mem exists */
			bytes += (mt->row_bytes * mt->n_in + 4095) & ~4095ull;
			for (int i = 0; i < nw; i++)
				nt += (w[i]->ne1 + TILE - 1) / TILE;
		}
	t->bytes = (bytes + HUGE - 1) & ~(uint64_t)(HUGE - 1);
	t->mem = anon(t->bytes);
	tiles = malloc(sizeof(*tiles) * nt);
	if (!t->mem || !tiles)
		goto nomem;
	nt = 0;
	for (uint32_t l = 0; l < hp->n_layer; l++)
		for (uint32_t in = 0; in < NI; in++) {
			struct hyb_teal_mat *mt = &t->mat[(size_t)l * NI + in];
			const struct hyb_weight *w[3];
			const int nw = sources(&m->layers[l], in, w);
			uint32_t col0 = 0;

			mt->data = (char *)t->mem + (uintptr_t)mt->data;
			for (int i = 0; i < nw; i++) {
				for (uint64_t r0 = 0; r0 < w[i]->ne1; r0 += TILE)
					tiles[nt++] = (struct tile){ .w = w[i], .t = mt,
								     .col0 = col0,
								     .r0 = (uint32_t)r0 };
				col0 += (uint32_t)w[i]->ne1;
			}
		}
	j.tiles = tiles;
	j.n_tiles = nt;
	atomic_init(&j.next, 0);
	atomic_init(&j.failed, 0);
	hyb_threadpool_run(pool, transpose_worker, &j);
	free(tiles);
	if (atomic_load(&j.failed)) {
		hyb_teal_free(t);
		hyb_error_set(-ENOMEM, "out of memory transposing the weights for TEAL");
		return NULL;
	}
	return t;
nomem:
	free(tiles);
	hyb_teal_free(t);
	hyb_error_set(-ENOMEM, "out of memory for TEAL's transposed weights (%llu MiB)",
		      (unsigned long long)(bytes >> 20));
	return NULL;
}

const struct hyb_teal *hyb_teal_layout(const struct hyb_model *m, struct hyb_threadpool *pool)
{
	/* made once per model, under a lock: contexts on several threads may ask */
	struct hyb_model *mm = (struct hyb_model *)m;
	struct hyb_teal *t;

	if (hyb_teal_layout_check(m))
		return NULL;
	/* a model still streaming in: the transposition reads every weight */
	if (hyb_model_wait(m))
		return NULL; /* the load's errno and message */
	pthread_mutex_lock(&layout_lock);
	if (!mm->teal)
		mm->teal = build(m, pool);
	t = mm->teal;
	pthread_mutex_unlock(&layout_lock);
	return t;
}

void hyb_teal_free(struct hyb_teal *t)
{
	if (!t)
		return;
	if (t->mem)
		munmap(t->mem, t->bytes);
	free(t->mat);
	free(t);
}

/* ---- the input-sparse GEMV ------------------------------------------------- */

void hyb_teal_mask(float *x, uint64_t n, float thr)
{
	for (uint64_t i = 0; i < n; i++)
		if (fabsf(x[i]) <= thr)
			x[i] = 0.0f;
}

/* One row's inputs above the threshold: their indexes and values. */
struct teal_list {
	const uint32_t *idx;
	const float *val;
	uint32_t n_act;
	float *y;
};

struct gemv_job {
	hyb_sparse_axpy_pf_fn axpy;
	const struct hyb_teal_mat *w;
	const struct teal_list *list; /* [n_list] */
	uint32_t n_list, unit, n_units;
	atomic_uint next;
};

/* Outputs [o0, o1) of one row: every listed input's slice, added in list order. */
static void gemv_slice(const struct gemv_job *j, const struct teal_list *t, uint32_t o0,
		       uint32_t o1)
{
	const struct hyb_teal_mat *w = j->w;
	const char *base = (const char *)w->data + hyb_row_bytes(w->type, o0);
	const void *rows[HYB_SPARSE_MAX_ROWS + HYB_SPARSE_PF_ROWS];

	memset(t->y + o0, 0, sizeof(float) * (o1 - o0));
	for (uint32_t a0 = 0; a0 < t->n_act; a0 += HYB_SPARSE_MAX_ROWS) {
		const uint32_t n = t->n_act - a0 < HYB_SPARSE_MAX_ROWS ? t->n_act - a0
								       : HYB_SPARSE_MAX_ROWS;
		uint32_t npf = t->n_act - a0 - n;

		npf = npf < HYB_SPARSE_PF_ROWS ? npf : HYB_SPARSE_PF_ROWS;
		for (uint32_t r = 0; r < n + npf; r++)
			rows[r] = base + (uint64_t)t->idx[a0 + r] * w->row_bytes;
		j->axpy((int64_t)(o1 - o0), rows, t->val + a0, (int)n, (int)npf, t->y + o0);
	}
}

/*
 * Threads claim units of outputs as they come (a thread the OS wakes late
 * is not waited for: on a shared machine that is tens of microseconds, as
 * long as a small projection takes); which thread computes a unit does not
 * change its sums. With several rows, a unit is every row's slice of it in
 * turn: the first row reads the weights' slices from memory, the others
 * find those they share in the cache.
 */
static void gemv_worker(void *arg, int ith, int nth)
{
	struct gemv_job *j = arg;

	(void)ith;
	(void)nth;
	for (;;) {
		const uint32_t u = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
		const uint32_t o0 = u * j->unit;

		if (u >= j->n_units)
			return;
		for (uint32_t r = 0; r < j->n_list; r++)
			gemv_slice(j, &j->list[r], o0,
				   o0 + j->unit < j->w->n_out ? o0 + j->unit : j->w->n_out);
	}
}

/* The inputs of x[n_in] above thr into idx/val; returns how many. */
static uint32_t select_inputs(const float *x, uint32_t n_in, float thr, uint32_t *idx, float *val)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < n_in; i++)
		if (fabsf(x[i]) > thr) {
			idx[n] = i;
			val[n++] = x[i];
		}
	return n;
}

static void run_gemv(struct hyb_threadpool *pool, struct gemv_job *j, uint32_t unit)
{
	const struct hyb_sparse_kernels *sk = hyb_sparse_best();
	const uint32_t type = j->w->type;

	/* the rounding axpy where a level has one: TEAL's inputs are already cut
	 * to a threshold, and the dense path rounds x to Q8_0 likewise */
	j->axpy = sk->axpy_i8_pf[type] ? sk->axpy_i8_pf[type] : sk->axpy_pf[type];
	j->unit = unit < UNIT_MIN ? UNIT_MIN : unit;
	j->n_units = (j->w->n_out + j->unit - 1) / j->unit;
	atomic_init(&j->next, 0);
	if (hyb_threadpool_size(pool) == 1 || j->n_units == 1)
		gemv_worker(j, 0, 1);
	else
		hyb_threadpool_run_dynamic(pool, gemv_worker, j);
}

uint32_t hyb_teal_gemv(struct hyb_threadpool *pool, const struct hyb_teal_mat *w, const float *x,
		       float thr, uint32_t *idx, float *val, float *y)
{
	const uint32_t nth = (uint32_t)hyb_threadpool_size(pool);
	struct teal_list t = { .idx = idx, .val = val, .y = y };
	struct gemv_job j = { .w = w, .list = &t, .n_list = 1 };

	t.n_act = select_inputs(x, w->n_in, thr, idx, val);
	/* a unit a thread, whole blocks: the longer the slice of a row, the
	 * closer its reads come to streaming (tests/bench/bench_teal.c) */
	run_gemv(pool, &j, (w->n_out / nth + TILE - 1) / TILE * TILE);
	return t.n_act;
}

void hyb_teal_gemv_rows(struct hyb_threadpool *pool, const struct hyb_teal_mat *w,
			const float *x, size_t ldx, uint32_t n, float thr, uint32_t *idx,
			float *val, uint32_t *n_act, float *y, size_t ldy)
{
	struct teal_list t[HYB_TEAL_ROWS];
	struct gemv_job j = { .w = w, .list = t, .n_list = n };
	uint64_t slice;

	for (uint32_t r = 0; r < n; r++) {
		t[r].idx = idx + (size_t)r * w->n_in;
		t[r].val = val + (size_t)r * w->n_in;
		t[r].y = y + r * ldy;
		t[r].n_act = n_act[r] = select_inputs(x + r * ldx, w->n_in, thr,
						      idx + (size_t)r * w->n_in,
						      val + (size_t)r * w->n_in);
	}
	/*
	 * Units whose slices of every input row fit in a quarter of a 32 MiB L3,
	 * so that the rows after the first find them there, but 2 KiB of a row
	 * at least, a run the prefetcher follows (tests/bench/bench_teal.c
	 * --rows measured both: shorter runs lost more than the cache won).
	 */
	slice = (8u << 20) / w->n_in;
	slice = slice < 2048 ? 2048 : slice;
	slice = slice / hyb_row_bytes(w->type, TILE) * TILE;
	run_gemv(pool, &j, (uint32_t)(slice < w->n_out ? slice : w->n_out));
}
