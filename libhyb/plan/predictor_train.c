// SPDX-License-Identifier: MIT
/*
 * Activation predictors (PowerInfer 5.1): per layer an MLP with one hidden
 * layer, logit = fc2 · relu(fc1 · x + b1) + b2, trained here in C on the
 * profile's samples; libhyb/sparse/predictor.c runs them at decode time.
 *
 * Size: PowerInfer starts from a hidden size set by the layer's sparsity,
 * smaller for sparser and more skewed layers (Figure 9), then tunes it
 * against perplexity. We take one rule that covers both effects: H is one
 * unit per 16 bits of the layer's per-token activation entropy, the sum over
 * neurons of the binary entropy of their frequency. A neuron that is almost
 * always off (sparse) or always on (skewed, hot) carries little entropy and
 * needs little predictor; bounds [32, 1024], a multiple of 32. (For a 7B
 * ReLU-llama layer, 70% sparse, this lands near 500: about 4% of the model's
 * parameters, PowerInfer's Table 6 reports 5-9%.)
 *
 * Training: binary cross-entropy per neuron (positives optionally weighted),
 * Adam on minibatches of 128 (step 1e-2 decayed linearly to 1e-3), every
 * matrix product on the packed GEMM below, split over the thread pool.
 * The samples are split in sample order (sequences stay together): 80%
 * train, 10% validation, 10% test. Compute is capped per layer (200 GFLOP
 * and 10 epochs by default: about 4 s a layer on 2 cores, so 32 layers of
 * 4096 -> H -> 11008 train in a few minutes).
 *
 * Threshold: PowerInfer does not give one. We pick, per layer, the logit
 * threshold at which the validation recall reaches the target (0.95 by
 * default: a missed active neuron costs accuracy, an extra one only time),
 * computed with the F16-rounded weights the plan stores, and fold it into
 * fc2.bias so the runtime tests logit > 0. Recall and precision are then
 * measured on the test samples.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu_kernels.h"
#include "hyb/threadpool.h"
#include "plan_internal.h"

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void run_job(struct hyb_threadpool *pool, hyb_job_fn fn, void *arg)
{
	if (pool)
		hyb_threadpool_run(pool, fn, arg);
	else
		fn(arg, 0, 1);
}

/*
 * Training GEMM: Y[c][r] = sum_k W(r, k) X(c, k) in float, any strides, so
 * transposed operands (A^T G, G W, ...) need no transposed copies. The
 * kernels' F32 GEMM sums in llama.cpp's order (one reduction per output),
 * right for inference and slow for training; training needs no particular
 * order, so this is a packed outer-product kernel: W in panels of 32 rows
 * stored k-major, X broadcast one element at a time, 32 x NC outputs in
 * registers (the panel_gemm of kernels/cpu, per ISA level); blocked
 * GotoBLAS-style (k blocks, column blocks kept in L2).
 */
#define PANEL HYB_PANEL
#define KC 256   /* k per block */
#define NCB 128  /* columns per block */

struct mat {
	const float *p;
	size_t rs, ks; /* element (row or column i, k) at p[i * rs + k * ks] */
};

struct sgemm_job {
	const struct hyb_cpu_kernels *kern;
	int64_t k, rows, cols;
	struct mat w, x;
	float *y;
	size_t ys;
	float *pack;          /* per thread pack_stride floats, 64-byte aligned */
	size_t pack_stride;
};

/* ap[k][i] = W(r0 + i, kb + k) for one panel; rows past the end are zero */
static void pack_panel(const struct mat *w, int64_t r0, unsigned nr, int64_t kb, int64_t kc,
		       float *ap)
{
	if (w->ks == 1) {
		for (unsigned i = 0; i < PANEL; i++) {
			const float *wr = w->p + (size_t)(r0 + i) * w->rs + kb;

			for (int64_t k = 0; k < kc; k++)
				ap[k * PANEL + i] = i < nr ? wr[k] : 0.0f;
		}
		return;
	}
	for (int64_t k = 0; k < kc; k++) {
		const float *wk = w->p + (size_t)(kb + k) * w->ks + (size_t)r0 * w->rs;

		for (unsigned i = 0; i < PANEL; i++)
			ap[k * PANEL + i] = i < nr ? wk[i * w->rs] : 0.0f;
	}
}

/* Each thread owns a run of panels: it packs them once per k block, then sweeps columns. */
static void sgemm_worker(void *arg, int ith, int nth)
{
	struct sgemm_job *j = arg;
	float *pk = j->pack + (size_t)ith * j->pack_stride;
	const long n_panels = (long)((j->rows + PANEL - 1) / PANEL);
	const int64_t n_cb = (j->cols + NCB - 1) / NCB;
	const int64_t ncb = ((j->cols + n_cb - 1) / n_cb + 11) / 12 * 12;
	long p0, p1;

	hyb_split(n_panels, ith, nth, &p0, &p1);
	for (int64_t kb = 0; kb < j->k; kb += KC) {
		const int64_t kc = j->k - kb < KC ? j->k - kb : KC;
		const float *xk = j->x.p + (size_t)kb * j->x.ks;

		for (long p = p0; p < p1; p++) {
			const int64_t r0 = p * PANEL;
			const unsigned nr = (unsigned)(j->rows - r0 < PANEL ? j->rows - r0 : PANEL);

			pack_panel(&j->w, r0, nr, kb, kc, pk + (size_t)(p - p0) * PANEL * kc);
		}
		for (int64_t cb = 0; cb < j->cols; cb += ncb) {
			const int64_t ce = j->cols - cb < ncb ? j->cols : cb + ncb;

			for (long p = p0; p < p1; p++) {
				const int64_t r0 = p * PANEL;
				const unsigned nr = (unsigned)(j->rows - r0 < PANEL ? j->rows - r0
										: PANEL);
				const float *ap = pk + (size_t)(p - p0) * PANEL * kc;
				float *y = j->y + r0 + cb * j->ys;

				j->kern->panel_gemm(kc, ap, xk + cb * j->x.rs, j->x.rs, j->x.ks, y,
						    j->ys, nr, kb > 0, ce - cb);
			}
		}
	}
}

/* floats of packing space one thread needs for `rows` rows on nth threads */
static size_t sgemm_pack_floats(int64_t rows, int nth)
{
	size_t panels = (size_t)((rows + PANEL - 1) / PANEL + nth - 1) / (size_t)nth;

	return (panels * PANEL * KC + 15) & ~(size_t)15;
}

static void sgemm(struct hyb_threadpool *pool, float *pack, size_t pack_stride, int64_t k, struct mat w,
		  int64_t rows, struct mat x, int64_t cols, float *y, size_t ys)
{
	struct sgemm_job j = { .kern = hyb_cpu_best(), .k = k, .rows = rows, .cols = cols, .w = w,
			       .x = x, .y = y, .ys = ys, .pack = pack, .pack_stride = pack_stride };

	if (pool && rows > PANEL)
		hyb_threadpool_run(pool, sgemm_worker, &j);
	else
		sgemm_worker(&j, 0, 1);
}

/* A row-major [n][k] matrix read as rows (ROWS) or read transposed (COLS). */
static inline struct mat rows_of(const float *p, size_t ld)
{
	return (struct mat){ p, ld, 1 };
}

static inline struct mat cols_of(const float *p, size_t ld)
{
	return (struct mat){ p, 1, ld };
}

/* ---- size rule ------------------------------------------------------------- */

uint32_t hyb_plan_pred_hidden(const struct hyb_profile *p, uint32_t layer, uint32_t lo, uint32_t hi)
{
	const uint64_t *cnt = p->layers[layer].count;
	double bits = 0;
	uint64_t h;

	for (uint32_t i = 0; i < p->n_ff && p->n_tokens; i++) {
		double f = (double)cnt[i] / (double)p->n_tokens;

		if (f > 0 && f < 1)
			bits -= f * log2(f) + (1 - f) * log2(1 - f);
	}
	h = ((uint64_t)ceil(bits / 16.0) + 31) / 32 * 32;
	if (h < lo)
		h = lo;
	if (h > hi)
		h = hi;
	return (uint32_t)h;
}

/* ---- training ----------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static float unif(uint64_t *s)
{
	return (float)((splitmix64(s) >> 40) * (1.0 / 8388608.0) - 1.0);
}

struct trainer {
	const struct hyb_profile *p;
	uint32_t layer, n_in, H, n_out, B;
	struct hyb_threadpool *pool;
	int nth;
	hyb_dequantize_fn f16;  /* F16 -> F32 */
	float pos_w;

	/* parameters, gradients, Adam moments: one block each, [w1 | b1 | w2 | b2] */
	size_t n1, n2, np;
	float *w, *g, *m, *v;
	float *pack;            /* sgemm panels, pack_stride floats per thread */
	size_t pack_stride;
	/* minibatch */
	float *x;               /* [B][n_in] */
	float *a;               /* hidden after relu [B][H] */
	float *z2;              /* [B][n_out]: logits, then their gradients */
	float *da;              /* [B][H] */
	uint8_t *y;             /* [B][n_out] targets */
	double loss;
};

static float *W1(struct trainer *t, float *base)
{
	(void)t;
	return base;
}

static float *B1(struct trainer *t, float *base)
{
	return base + t->n1;
}

static float *W2(struct trainer *t, float *base)
{
	return base + t->n1 + t->H;
}

static float *B2(struct trainer *t, float *base)
{
	return base + t->n1 + t->H + t->n2;
}

/* logits -> gradients of the mean loss; per-thread loss partials */
struct loss_job {
	struct trainer *t;
	uint32_t nb;
	bool want_loss;
	double part[64];
};

static void loss_worker(void *arg, int ith, int nth)
{
	struct loss_job *j = arg;
	struct trainer *t = j->t;
	const float inv = 1.0f / (float)j->nb;
	const float *b2 = B2(t, t->w);
	double sum = 0;
	long lo, hi;

	hyb_split(j->nb, ith, nth, &lo, &hi);
	for (long b = lo; b < hi; b++) {
		float *z = t->z2 + (size_t)b * t->n_out;
		const uint8_t *y = t->y + (size_t)b * t->n_out;

		for (uint32_t r = 0; r < t->n_out; r++) {
			/* e = exp(-|z|): sigmoid and softplus from one exp, no overflow */
			float zz = z[r] + b2[r], e = expf(-fabsf(zz)), sg;

			sg = zz >= 0 ? 1.0f / (1.0f + e) : e / (1.0f + e);
			if (j->want_loss) /* softplus(-z) for a positive, softplus(z) else */
				sum += (y[r] ? t->pos_w : 1.0f) *
				       (log1pf(e) + (y[r] ? fmaxf(-zz, 0) : fmaxf(zz, 0)));
			z[r] = y[r] ? t->pos_w * (sg - 1.0f) * inv : sg * inv;
		}
	}
	if (ith < 64)
		j->part[ith] = sum;
}

struct adam_job {
	float *w, *g, *m, *v;
	size_t n;
	float lr, c1, c2;
};

static void adam_worker(void *arg, int ith, int nth)
{
	struct adam_job *j = arg;
	long lo, hi;

	hyb_split((long)j->n, ith, nth, &lo, &hi);
	hyb_cpu_best()->adam(j->w, j->g, j->m, j->v, lo, hi, j->lr, j->c1, j->c2);
}

/* gather samples idx[0..nb) into t->x and t->y */
static void gather(struct trainer *t, const uint32_t *idx, uint32_t nb)
{
	const struct hyb_profile *p = t->p;

	for (uint32_t b = 0; b < nb; b++) {
		const uint64_t *a = p->layers[t->layer].active + (size_t)idx[b] * p->active_words;
		uint8_t *y = t->y + (size_t)b * t->n_out;

		t->f16(p->layers[t->layer].input + (size_t)idx[b] * p->n_embd,
		       t->x + (size_t)b * t->n_in, t->n_in);
		for (uint32_t r = 0; r < t->n_out; r++)
			y[r] = (uint8_t)((a[r / 64] >> (r % 64)) & 1);
	}
}

#define SGEMM(t, ...) sgemm((t)->pool, (t)->pack, (t)->pack_stride, __VA_ARGS__)

/* z2 = fc2 · relu(fc1 · x + b1), without b2; leaves a */
static void forward(struct trainer *t, const float *w, uint32_t nb)
{
	const float *b1 = w + t->n1;

	/* A[b][j] = W1[j] · X[b] */
	SGEMM(t, t->n_in, rows_of(w, t->n_in), t->H, rows_of(t->x, t->n_in), nb, t->a, t->H);
	for (size_t q = 0; q < (size_t)nb * t->H; q++) {
		float v = t->a[q] + b1[q % t->H];

		t->a[q] = v > 0 ? v : 0;
	}
	/* Z[b][r] = W2[r] · A[b] */
	SGEMM(t, t->H, rows_of(w + t->n1 + t->H, t->H), t->n_out, rows_of(t->a, t->H), nb, t->z2,
	      t->n_out);
}

static void step(struct trainer *t, uint32_t nb, float lr, uint64_t it, bool want_loss)
{
	float *g = t->g, *gb;
	struct loss_job lj = { .t = t, .nb = nb, .want_loss = want_loss };
	struct adam_job aj;

	forward(t, t->w, nb);
	run_job(t->pool, loss_worker, &lj);
	t->loss = 0;
	for (int q = 0; q < 64; q++)
		t->loss += lj.part[q];
	t->loss /= (double)nb * t->n_out;

	/* fc2: dW2[r][j] = sum_b G[b][r] A[b][j], db2 = sum_b G[b], dA[b] = sum_r G[b][r] W2[r] */
	SGEMM(t, nb, cols_of(t->a, t->H), t->H, cols_of(t->z2, t->n_out), t->n_out, W2(t, g), t->H);
	gb = B2(t, g);
	memset(gb, 0, t->n_out * sizeof(float));
	for (uint32_t b = 0; b < nb; b++)
		for (uint32_t r = 0; r < t->n_out; r++)
			gb[r] += t->z2[(size_t)b * t->n_out + r];
	SGEMM(t, t->n_out, cols_of(W2(t, t->w), t->H), t->H, rows_of(t->z2, t->n_out), nb, t->da,
	      t->H);
	/* through the relu */
	gb = B1(t, g);
	memset(gb, 0, t->H * sizeof(float));
	for (uint32_t b = 0; b < nb; b++)
		for (uint32_t j = 0; j < t->H; j++) {
			float *d = t->da + (size_t)b * t->H + j;

			if (t->a[(size_t)b * t->H + j] <= 0)
				*d = 0;
			gb[j] += *d;
		}
	/* fc1: dW1[j][e] = sum_b dZ[b][j] X[b][e] */
	SGEMM(t, nb, cols_of(t->x, t->n_in), t->n_in, cols_of(t->da, t->H), t->H, W1(t, g),
	      t->n_in);

	aj = (struct adam_job){ t->w, t->g, t->m, t->v, t->np, lr,
				(float)(1.0 / (1.0 - pow(0.9, (double)it))),
				(float)(1.0 / (1.0 - pow(0.999, (double)it))) };
	run_job(t->pool, adam_worker, &aj);
}

static void trainer_free(struct trainer *t)
{
	free(t->w);
	free(t->g);
	free(t->m);
	free(t->v);
	free(t->pack);
	free(t->x);
	free(t->a);
	free(t->z2);
	free(t->da);
	free(t->y);
}

void hyb_plan_predictor_free(struct hyb_plan_predictor *pr)
{
	if (!pr)
		return;
	free(pr->fc1_w);
	free(pr->fc1_b);
	free(pr->fc2_w);
	free(pr->fc2_b);
	memset(pr, 0, sizeof(*pr));
}

static int cmp_float(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;

	return x < y ? -1 : x > y;
}

/* Logits (b2 included) of samples [s0, s1) with the weights in t->w, batch by batch. */
typedef void (*logit_fn)(void *user, uint32_t sample, const float *z, const uint8_t *y);

static void eval_range(struct trainer *t, uint32_t s0, uint32_t s1, logit_fn fn, void *user)
{
	uint32_t *idx = malloc((size_t)t->B * sizeof(*idx));
	const float *b2 = B2(t, t->w);

	if (!idx)
		return;
	for (uint32_t s = s0; s < s1; s += t->B) {
		uint32_t nb = s1 - s < t->B ? s1 - s : t->B;

		for (uint32_t b = 0; b < nb; b++)
			idx[b] = s + b;
		gather(t, idx, nb);
		forward(t, t->w, nb);
		for (uint32_t b = 0; b < nb; b++) {
			float *z = t->z2 + (size_t)b * t->n_out;

			for (uint32_t r = 0; r < t->n_out; r++)
				z[r] += b2[r];
			fn(user, s + b, z, t->y + (size_t)b * t->n_out);
		}
	}
	free(idx);
}

struct confusion {
	uint32_t n_out;
	float thr;
	uint64_t tp, fp, fn, pos;
};

static void count_conf(void *user, uint32_t sample, const float *z, const uint8_t *y)
{
	struct confusion *c = user;
	(void)sample;

	for (uint32_t r = 0; r < c->n_out; r++) {
		bool pred = z[r] > c->thr;

		c->tp += pred && y[r];
		c->fp += pred && !y[r];
		c->fn += !pred && y[r];
		c->pos += y[r];
	}
}

struct val_collect {
	uint32_t n_out;
	float *v;
	size_t n, cap;
	int oom;
};

static void collect_val(void *user, uint32_t sample, const float *z, const uint8_t *y)
{
	struct val_collect *c = user;
	(void)sample;

	for (uint32_t r = 0; r < c->n_out; r++) {
		if (!y[r])
			continue;
		if (c->n == c->cap) {
			size_t cap = c->cap ? 2 * c->cap : 4096;
			float *nv = realloc(c->v, cap * sizeof(*nv));

			if (!nv) {
				c->oom = 1;
				return;
			}
			c->v = nv;
			c->cap = cap;
		}
		c->v[c->n++] = z[r];
	}
}

/*
 * The trainer for one layer: shapes, the thread pool and every buffer of a
 * minibatch of B samples (B at most the training samples). 0, or -1 when
 * out of memory (trainer_free then frees what came).
 */
static int trainer_init(struct trainer *t, const struct hyb_profile *p, uint32_t layer,
			uint32_t hidden, const struct hyb_plan_pred_opts *o, uint32_t n_train)
{
	int64_t rows;

	t->p = p;
	t->layer = layer;
	t->n_in = p->n_embd;
	t->H = hidden;
	t->n_out = p->n_ff;
	t->B = o->batch ? o->batch : 128;
	if (t->B > n_train)
		t->B = n_train;
	t->pool = o->pool;
	t->f16 = hyb_cpu_best()->dequantize[HYB_TYPE_F16];
	t->n1 = (size_t)t->H * t->n_in;
	t->n2 = (size_t)t->n_out * t->H;
	t->np = t->n1 + t->H + t->n2 + t->n_out;
	t->w = calloc(t->np, sizeof(float));
	t->g = calloc(t->np, sizeof(float));
	t->m = calloc(t->np, sizeof(float));
	t->v = calloc(t->np, sizeof(float));
	t->x = malloc((size_t)t->B * t->n_in * sizeof(float));
	t->a = malloc((size_t)t->B * t->H * sizeof(float));
	t->z2 = malloc((size_t)t->B * t->n_out * sizeof(float));
	t->da = malloc((size_t)t->B * t->H * sizeof(float));
	t->y = malloc((size_t)t->B * t->n_out);
	/* packing space for the largest row count any of the products has */
	rows = t->n_in > t->n_out ? t->n_in : t->n_out;
	t->nth = o->pool ? hyb_threadpool_size(o->pool) : 1;
	t->pack_stride = sgemm_pack_floats(rows > t->H ? rows : t->H, t->nth);
	t->pack = aligned_alloc(64, (size_t)t->nth * t->pack_stride * sizeof(float));
	return t->w && t->g && t->m && t->v && t->x && t->a && t->z2 && t->da && t->y && t->pack
	       ? 0 : -1;
}

/*
 * Initial weights: He-uniform fc1, small fc2, and b2 at each neuron's prior
 * log-odds over the training samples, so training starts from the base
 * rates rather than from 1/2 for every neuron.
 */
static void init_weights(struct trainer *t, uint32_t n_train, uint64_t *seed)
{
	const struct hyb_profile *p = t->p;
	const float a1 = sqrtf(6.0f / (float)t->n_in);
	const float a2 = sqrtf(6.0f / (float)(t->H + t->n_out));
	float *b2 = B2(t, t->w);

	for (size_t q = 0; q < t->n1; q++)
		W1(t, t->w)[q] = a1 * unif(seed);
	for (size_t q = 0; q < t->n2; q++)
		W2(t, t->w)[q] = a2 * unif(seed);
	/* b2 holds counts first */
	for (uint32_t s = 0; s < n_train; s++) {
		const uint64_t *a = p->layers[t->layer].active + (size_t)s * p->active_words;

		for (uint32_t w = 0; w < p->active_words; w++)
			for (uint64_t bits = a[w]; bits; bits &= bits - 1) {
				uint32_t r = w * 64 + (uint32_t)__builtin_ctzll(bits);

				if (r < t->n_out)
					b2[r] += 1.0f;
			}
	}
	for (uint32_t r = 0; r < t->n_out; r++) {
		double pr = ((double)b2[r] + 0.5) / ((double)n_train + 1.0);

		b2[r] = (float)log(pr / (1.0 - pr));
	}
}

/* Steps within the compute cap: ~6 flops per weight per sample (forward 2, backward 4). */
static uint64_t train_steps(const struct trainer *t, const struct hyb_plan_pred_opts *o,
			    uint32_t n_train)
{
	const double flops = 6.0 * ((double)t->n1 + (double)t->n2);
	const uint64_t max_epochs = o->max_epochs ? o->max_epochs : 10;
	const uint64_t max_steps = max_epochs * (n_train / t->B);
	uint64_t steps = (uint64_t)((o->gflop > 0 ? o->gflop : 200.0) * 1e9 / (flops * t->B));

	if (steps > max_steps)
		steps = max_steps;
	return steps < 1 ? 1 : steps;
}

/*
 * Adam on minibatches drawn without replacement, reshuffled every epoch,
 * the step decayed linearly to 10% over the run. Returns the mean loss of
 * the last few steps (computing it costs a log1p per output, so only those).
 */
static double train_loop(struct trainer *t, uint32_t *order, uint32_t n_train, uint64_t steps,
			 float lr0, uint64_t *seed)
{
	uint32_t pos_in_epoch = n_train; /* reshuffle at the first step */
	double loss_sum = 0;
	uint64_t loss_n = 0, tail = n_train / t->B < 8 ? n_train / t->B : 8;

	for (uint32_t s = 0; s < n_train; s++)
		order[s] = s;
	for (uint64_t it = 1; it <= steps; it++) {
		float lr = lr0 * (1.0f - 0.9f * (float)(it - 1) / (float)steps);

		if (pos_in_epoch + t->B > n_train) {
			for (uint32_t s = n_train; s > 1; s--) {
				uint32_t j = (uint32_t)(splitmix64(seed) % s);
				uint32_t tmp = order[s - 1];

				order[s - 1] = order[j];
				order[j] = tmp;
			}
			pos_in_epoch = 0;
		}
		gather(t, order + pos_in_epoch, t->B);
		pos_in_epoch += t->B;
		step(t, t->B, lr, it, steps - it < tail);
		if (steps - it < tail) {
			loss_sum += t->loss;
			loss_n++;
		}
	}
	return loss_n ? loss_sum / loss_n : t->loss;
}

/* The weights as the plan stores them (F16), so the threshold is the runtime's. */
static void round_to_f16(struct trainer *t)
{
	for (size_t q = 0; q < t->n1; q++)
		W1(t, t->w)[q] = hyb_f16_to_f32(hyb_f32_to_f16(W1(t, t->w)[q]));
	for (size_t q = 0; q < t->n2; q++)
		W2(t, t->w)[q] = hyb_f16_to_f32(hyb_f32_to_f16(W2(t, t->w)[q]));
}

/*
 * The logit threshold at which the validation samples [v0, v1) reach the
 * target recall (PowerInfer 5.1 gives none), folded into b2 so the
 * runtime tests logit > 0. 0, or -1 when out of memory.
 */
static int fold_threshold(struct trainer *t, uint32_t v0, uint32_t v1, double target, float *thr)
{
	struct val_collect vc = { .n_out = t->n_out };

	*thr = 0;
	eval_range(t, v0, v1, collect_val, &vc);
	if (vc.oom) {
		free(vc.v);
		return -1;
	}
	if (vc.n) {
		size_t miss = (size_t)floor((1.0 - target) * (double)vc.n);

		qsort(vc.v, vc.n, sizeof(float), cmp_float);
		if (miss >= vc.n)
			miss = vc.n - 1;
		/* every positive from index miss on must score above thr */
		*thr = miss ? 0.5f * (vc.v[miss - 1] + vc.v[miss]) : vc.v[0] - 1e-3f;
		if (!(*thr < vc.v[miss]))
			*thr = nextafterf(vc.v[miss], -INFINITY);
	}
	free(vc.v);
	for (uint32_t r = 0; r < t->n_out; r++)
		B2(t, t->w)[r] -= *thr;
	return 0;
}

/* Recall and precision on the test samples [s0, s1), threshold folded in. */
static void test_metrics(struct trainer *t, uint32_t s0, uint32_t s1,
			 struct hyb_plan_pred_stats *st)
{
	struct confusion c = { .n_out = t->n_out, .thr = 0 };
	const double n = (double)(s1 - s0) * t->n_out;

	eval_range(t, s0, s1, count_conf, &c);
	st->recall = c.pos ? (double)c.tp / (double)c.pos : 1.0;
	st->precision = c.tp + c.fp ? (double)c.tp / (double)(c.tp + c.fp) : 1.0;
	st->pred_frac = (double)(c.tp + c.fp) / n;
	st->true_frac = (double)c.pos / n;
}

/* The predictor in the plan's form: F16 weights, fc2 transposed, outputs in perm order. */
static int export_predictor(struct trainer *t, const int32_t *perm,
			    struct hyb_plan_predictor *out)
{
	out->n_in = t->n_in;
	out->hidden = t->H;
	out->n_out = t->n_out;
	out->fc1_w = malloc(t->n1 * 2);
	out->fc1_b = malloc((size_t)t->H * 4);
	out->fc2_w = malloc(t->n2 * 2);
	out->fc2_b = malloc((size_t)t->n_out * 4);
	if (!out->fc1_w || !out->fc1_b || !out->fc2_w || !out->fc2_b) {
		hyb_plan_predictor_free(out);
		return -1;
	}
	for (size_t q = 0; q < t->n1; q++)
		out->fc1_w[q] = hyb_f32_to_f16(W1(t, t->w)[q]);
	memcpy(out->fc1_b, B1(t, t->w), (size_t)t->H * 4);
	for (uint32_t i = 0; i < t->n_out; i++) {
		uint32_t src = perm ? (uint32_t)perm[i] : i;
		const float *row = W2(t, t->w) + (size_t)src * t->H;

		for (uint32_t j = 0; j < t->H; j++) /* stored transposed: plan.h */
			out->fc2_w[(size_t)j * t->n_out + i] = hyb_f32_to_f16(row[j]);
		out->fc2_b[i] = B2(t, t->w)[src];
	}
	return 0;
}

int hyb_plan_pred_train(const struct hyb_profile *p, uint32_t layer, uint32_t hidden,
		    const int32_t *perm, const struct hyb_plan_pred_opts *o,
		    struct hyb_plan_predictor *out, struct hyb_plan_pred_stats *st, char *err,
		    size_t errlen)
{
	const uint32_t S = p->n_samples;
	/* split in sample order (sequences stay together): 80% train, 10% validation, 10% test */
	const uint32_t n_test = S / 10, n_val = S / 10, n_train = S - n_val - n_test;
	const double t0 = now_s();
	struct trainer t = { 0 };
	uint32_t *order = NULL;
	uint64_t steps, seed = o->seed * 0x9e3779b97f4a7c15ull + layer + 1;
	float thr;
	int rc = -ENOMEM;

	memset(out, 0, sizeof(*out));
	memset(st, 0, sizeof(*st));
	if (S < 20 || n_val == 0 || n_test == 0) {
		snprintf(err, errlen, "profile has %u samples; predictors need at least 20", S);
		return -EINVAL;
	}
	if (!hidden) {
		snprintf(err, errlen, "predictor hidden size is 0");
		return -EINVAL;
	}
	order = malloc((size_t)n_train * sizeof(*order));
	if (trainer_init(&t, p, layer, hidden, o, n_train) || !order) {
		snprintf(err, errlen, "out of memory for the layer %u predictor (H %u)", layer,
			 hidden);
		goto out;
	}
	init_weights(&t, n_train, &seed);
	/* auto: plain BCE; the recall target is met by the threshold, not the weight */
	t.pos_w = o->pos_weight > 0 ? o->pos_weight : 1.0f;
	steps = train_steps(&t, o, n_train);
	st->loss = train_loop(&t, order, n_train, steps, o->lr > 0 ? o->lr : 1e-2f, &seed);
	round_to_f16(&t);
	if (fold_threshold(&t, n_train, n_train + n_val,
			   o->target_recall > 0 ? o->target_recall : 0.95, &thr)) {
		snprintf(err, errlen, "out of memory");
		goto out;
	}
	st->threshold = thr;
	test_metrics(&t, n_train + n_val, S, st);
	if (export_predictor(&t, perm, out)) {
		snprintf(err, errlen, "out of memory");
		goto out;
	}
	st->hidden = t.H;
	st->epochs = (double)steps * t.B / n_train;
	st->n_train = n_train;
	st->n_val = n_val;
	st->n_test = n_test;
	st->seconds = now_s() - t0;
	rc = 0;
out:
	trainer_free(&t);
	free(order);
	return rc;
}
