// SPDX-License-Identifier: MIT
/*
 * A layer's activation predictor on CUDA (hyb/device.h hyb_device_predict;
 * PowerInfer 4.3, KAIROX 5.1 runs it on the GPU beside the attention output
 * it reads). The arithmetic is libhyb's: hyb_unit_rms (libhyb/sparse/sparse_layer.c)
 * then hyb_predictor_run (libhyb/sparse/predictor.c), and each sum is taken in the
 * order of the CPU's AVX-512 kernels, so on an AVX-512 host the logits are
 * the CPU device's to the bit but for the unit-RMS scale (below; with
 * raw_x, x is taken as it is: the scale is 1 and the sum of squares goes
 * unused). Two kernels on the stream:
 *
 * 1. pred_fc1: 4 warps a block, one fc1 row per warp. Every block first
 *    issues its rows' first loads, then computes sum x_i^2 in double (a
 *    fixed tree: per-thread strided sums, warp butterflies, 4 warp sums in
 *    order), scale = (float)(1 / sqrt(sum / n)) (0 when sum == 0), and
 *    x16 = f16(x * scale) into shared memory - each block redoes this from
 *    L2 (16 KiB at n_in 4096) rather than pay a third launch. The row dot is
 *    the AVX-512 ggml_vec_dot_f16 of kernels/cpu/gemm_f_avx512.c: 64 float
 *    accumulators (4 vectors x 16 lanes), accumulator e taking elements
 *    e, e + 64, e + 128, ... by fused multiply-add in that order. Lane l
 *    holds accumulators 2l and 2l + 1 (it loads elements 2l, 2l + 1 of
 *    every 64: one 128-byte line per warp load), 32 steps of 64 elements
 *    loaded ahead of the FMAs and the next 32 loaded while they run. The 64
 *    accumulators are then added exactly as the CPU adds them: vectors
 *    (0 + 2) + (1 + 3), then _mm512_reduce_add_ps's halving (lanes j and
 *    j + 8, j + 4, j + 2, j + 1), which is a shuffle-xor butterfly over
 *    16, 8, 4, 2, 1 and a last add of the lane's two registers. When n_in %
 *    64 == 32 the last 32 products are rounded to float and added in double
 *    in order, as the CPU's leftover loop does. h = relu(dot + b1).
 *
 * 2. pred_fc2: a block per tile of 64 outputs (256 threads). The block
 *    lists the hidden units with h > 0 in increasing order (ballots), then
 *    stages their fc2 rows' 64-column slices in shared memory, 128 rows a
 *    batch (16 KiB; all 256 threads load, 16 bytes each when n_out % 8 == 0
 *    and fc2 is 16-byte aligned, the next batch loaded while the current
 *    one is summed). Thread c of the first 64 owns column c and walks the
 *    staged rows in unit order: logit = b2, then logit = fma(h_u, w_u,
 *    logit) for each unit, the AVX-512 fc2 loop's order; columns from
 *    n_out & ~15 on take a separate multiply and add, as that loop's scalar
 *    leftovers do. A 64-bit mask of logit > 0 per tile goes to the
 *    workspace; the block that finishes last (a ticket counter, zeroed by
 *    pred_fc1) scans the masks' popcounts and writes the active indices in
 *    increasing order and their count. Deterministic: every sum has a fixed
 *    order and the compaction depends only on the masks.
 *
 * Where results can differ from the CPU device: (a) the double sum of
 * squares is a tree, not the CPU's sequential loop; the two differ in the
 * last bits of a double (~1e-15 relative), so the float scale differs only
 * when the exact value lies that close to a float rounding boundary (~1e-7
 * of inputs), and then by one float ulp, which moves an x16 element by one
 * F16 ulp only where x * scale lay within 2^-13 ulp of an F16 rounding
 * boundary. (b) On a host without AVX-512 (AVX2 or scalar kernels) the CPU
 * sums in other orders: h and the logits differ by float rounding (~1e-7
 * relative to sum |h_u fc2[u][c]|). Either way only a logit within that
 * rounding of 0 can land on the other side of the threshold;
 * tests/gpu/test_predict.c allows a difference only where the host logit
 * is within 1e-3 of 0.
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>

#include "predict_cuda.h"

#define WARP 32
#define FULL 0xffffffffu

#define P1_WARPS 4              /* fc1: rows (warps) per block */
#define P1_THREADS (P1_WARPS * WARP)
#define P1_CH 32                /* fc1: steps of 64 elements a lane loads ahead */

#define P2_THREADS 256          /* fc2 */
#define P2_WARPS (P2_THREADS / WARP)
#define P2_TC 64                /* columns per tile: a 64-bit mask, two warps own them */
#define P2_R 128                /* fc2 rows staged per batch: 16 KiB */
#define P2_SEG 1024             /* hidden units whose fired list a block holds at once */
#define P2_VL (P2_R * P2_TC / 8 / P2_THREADS)  /* 16-byte loads per thread per batch */
#define P2_SL (P2_R * P2_TC / P2_THREADS)      /* 2-byte loads per thread per batch */

static_assert(P2_TC == 2 * WARP, "a tile's mask is two warp ballots");
static_assert(P2_VL * 8 * P2_THREADS == P2_R * P2_TC, "vector staging covers a batch");
static_assert(P2_THREADS % P2_TC == 0 && P2_THREADS % (P2_TC / 8) == 0, "staging layout");

static __device__ __forceinline__ float f16f(uint32_t bits)
{
	return __half2float(__ushort_as_half((unsigned short)(bits & 0xffff)));
}

static __device__ __forceinline__ uint32_t f16b(float f)
{
	return __half_as_ushort(__float2half_rn(f));
}

static __device__ __forceinline__ uint32_t umin32(uint32_t a, uint32_t b)
{
	return a < b ? a : b;
}

/* ---- fc1 ------------------------------------------------------------------------- */

/*
 * Steps s0 .. s0 + P1_CH - 1 of a lane's pairs (elements 64 s + 2 lane, + 1),
 * 0 past the row; WHOLE: none is past it (every chunk but a row's last, so
 * the loads go out unpredicated).
 */
template <bool W4, bool WHOLE>
static __device__ __forceinline__ void fc1_load_k(uint32_t *v, const uint16_t *wr, uint32_t s0,
						  uint32_t steps)
{
#pragma unroll
	for (int k = 0; k < P1_CH; k++) {
		const uint16_t *q = wr + (size_t)(s0 + k) * 64;

		v[k] = 0;
		if (WHOLE || s0 + k < steps)
			v[k] = W4 ? __ldg((const uint32_t *)q) :
				    (uint32_t)__ldg(q) | (uint32_t)__ldg(q + 1) << 16;
	}
}

template <bool W4>
static __device__ __forceinline__ void fc1_load(uint32_t *v, const uint16_t *wr, uint32_t s0,
						uint32_t steps)
{
	if (s0 + P1_CH <= steps)
		fc1_load_k<W4, true>(v, wr, s0, steps);
	else
		fc1_load_k<W4, false>(v, wr, s0, steps);
}

/* The FMA chains of steps s0 .. s0 + P1_CH - 1 (those before steps; all of them: WHOLE). */
template <bool WHOLE>
static __device__ __forceinline__ void fc1_fma(const uint32_t *v, const uint32_t *x2,
					       unsigned lane, uint32_t s0, uint32_t steps,
					       float *a0, float *a1)
{
#pragma unroll
	for (int k = 0; k < P1_CH; k++) {
		if (WHOLE || s0 + k < steps) {
			const uint32_t xv = x2[(s0 + k) * 32 + lane];

			*a0 = __fmaf_rn(f16f(v[k]), f16f(xv), *a0);
			*a1 = __fmaf_rn(f16f(v[k] >> 16), f16f(xv >> 16), *a1);
		}
	}
}

/*
 * h[row] = relu(fc1[row] . f16(unit_rms(x)) + b1[row]); raw: f16(x), the
 * scale 1 (x * 1 is x, so f16(x) is the CPU's conversion of x as it is).
 * W4: fc1 is 4-byte aligned (pairs read as one word). Block 0 zeroes
 * pred_fc2's ticket.
 */
template <bool W4>
__global__ __launch_bounds__(P1_THREADS) void pred_fc1(const float *__restrict__ x,
						       const uint16_t *__restrict__ w1,
						       const float *__restrict__ b1,
						       float *__restrict__ h, unsigned *done,
						       uint32_t n_in, uint32_t hidden, bool raw)
{
	extern __shared__ __align__(16) unsigned char sm[];
	uint32_t *x2 = (uint32_t *)sm; /* x16 pairs: element 2i in the low half */
	__shared__ double red[P1_WARPS];
	__shared__ float s_scale;
	const unsigned t = threadIdx.x, lane = t % WARP, warp = t / WARP;
	const uint32_t row = blockIdx.x * P1_WARPS + warp, steps = n_in / 64;
	/* a warp past the last row loads the last row and drops it */
	const uint16_t *wrow = w1 + (size_t)umin32(row, hidden - 1) * n_in;
	uint32_t cur[P1_CH];
	double s = 0;

	if (blockIdx.x == 0 && t == 0)
		*done = 0;
	fc1_load<W4>(cur, wrow + 2 * lane, 0, steps);

	/* hyb_unit_rms: squares exact in double, summed in a fixed tree */
	for (uint32_t i = t; i < n_in; i += P1_THREADS) {
		const double v = x[i];

		s += v * v;
	}
	for (int o = 16; o > 0; o >>= 1)
		s += __shfl_xor_sync(FULL, s, o);
	if (lane == 0)
		red[warp] = s;
	__syncthreads();
	if (t == 0) {
		double sum = 0;

		for (int w = 0; w < P1_WARPS; w++)
			sum += red[w];
		s_scale = raw ? 1.0f : sum > 0 ? (float)(1.0 / sqrt(sum / n_in)) : 0.0f;
	}
	__syncthreads();
	{
		const float scale = s_scale;

		for (uint32_t i = t; i < n_in / 2; i += P1_THREADS)
			x2[i] = f16b(__fmul_rn(x[2 * i], scale)) |
				f16b(__fmul_rn(x[2 * i + 1], scale)) << 16;
	}
	__syncthreads();
	if (row >= hidden)
		return;

	/* two of the AVX-512 dot's 64 accumulators, their chains in element order */
	float a0 = 0.0f, a1 = 0.0f;

	for (uint32_t s0 = 0; s0 < steps; s0 += P1_CH) {
		uint32_t nxt[P1_CH];

		fc1_load<W4>(nxt, wrow + 2 * lane, s0 + P1_CH, steps);
		if (s0 + P1_CH <= steps)
			fc1_fma<true>(cur, x2, lane, s0, steps, &a0, &a1);
		else
			fc1_fma<false>(cur, x2, lane, s0, steps, &a0, &a1);
#pragma unroll
		for (int k = 0; k < P1_CH; k++)
			cur[k] = nxt[k];
	}
	/* (v0 + v2) + (v1 + v3), then lanes j + 8, + 4, + 2, + 1 of the sum vector */
	for (int o = 16; o > 0; o >>= 1) {
		a0 = __fadd_rn(a0, __shfl_xor_sync(FULL, a0, o));
		a1 = __fadd_rn(a1, __shfl_xor_sync(FULL, a1, o));
	}

	double d = (double)__fadd_rn(a0, a1);

	if (n_in % 64) {
		/* the CPU's leftovers: float products added in double, in order */
		const uint32_t e = steps * 64 + lane;
		const float p = __fmul_rn(f16f(__ldg(wrow + e)), f16f(x2[e / 2] >> (16 * (e % 2))));

		for (int i = 0; i < WARP; i++)
			d += (double)__shfl_sync(FULL, p, i);
	}
	if (lane == 0) {
		const float v = __fadd_rn((float)d, b1[row]);

		h[row] = v > 0 ? v : 0.0f;
	}
}

/* ---- fc2 ------------------------------------------------------------------------- */

/*
 * Stage rows b0 .. b0 + P2_R - 1 of the fired list, columns c0 .. c0 + 63,
 * into registers. VEC: thread t loads 16 bytes (part t % 8) of rows
 * t / 8 + 32 m; else one element (column t % 64) of rows t / 64 + 4 m.
 */
template <bool VEC>
static __device__ __forceinline__ void fc2_load(uint4 *sv, uint16_t *ss,
						const uint16_t *__restrict__ w2,
						const uint32_t *fu, uint32_t b0, uint32_t nf,
						uint32_t c0, uint32_t n_out, unsigned t)
{
	if constexpr (VEC) {
		const uint32_t c = c0 + (t % 8) * 8;

#pragma unroll
		for (int m = 0; m < P2_VL; m++) {
			const uint32_t k = b0 + t / 8 + 32 * m;

			if (k < nf && c < n_out)
				sv[m] = __ldg((const uint4 *)(w2 + (size_t)fu[k] * n_out + c));
		}
	} else {
		const uint32_t c = c0 + t % P2_TC;

#pragma unroll
		for (int m = 0; m < P2_SL; m++) {
			const uint32_t k = b0 + t / P2_TC + (P2_THREADS / P2_TC) * m;

			if (k < nf && c < n_out)
				ss[m] = __ldg(w2 + (size_t)fu[k] * n_out + c);
		}
	}
}

template <bool VEC>
static __device__ __forceinline__ void fc2_store(const uint4 *sv, const uint16_t *ss,
						 uint16_t *rows, unsigned t)
{
	if constexpr (VEC) {
#pragma unroll
		for (int m = 0; m < P2_VL; m++)
			((uint4 *)rows)[(t / 8 + 32 * m) * (P2_TC / 8) + t % 8] = sv[m];
	} else {
#pragma unroll
		for (int m = 0; m < P2_SL; m++)
			rows[(t / P2_TC + (P2_THREADS / P2_TC) * m) * P2_TC + t % P2_TC] = ss[m];
	}
}

/*
 * The last block: active = the set bits of the tiles' masks in order,
 * *count their number. masks[2 k], masks[2 k + 1]: bits 0-31, 32-63 of tile k.
 */
static __device__ void fc2_compact(const uint32_t *masks, uint32_t n_tiles,
				   uint32_t *__restrict__ active, uint32_t *__restrict__ count,
				   uint32_t *s_cnt)
{
	__shared__ uint32_t s_off[P2_THREADS];
	__shared__ unsigned long long s_mask[P2_THREADS];
	const unsigned t = threadIdx.x, lane = t % WARP, warp = t / WARP;
	uint32_t carry = 0;

	for (uint32_t k0 = 0; k0 < n_tiles; k0 += P2_THREADS) {
		const uint32_t k = k0 + t, nk = umin32(P2_THREADS, n_tiles - k0);
		unsigned long long m = 0;
		uint32_t c, inc, base = carry, tot = carry;

		if (k < n_tiles) /* written by other blocks: read from L2 */
			m = (unsigned long long)__ldcg(masks + 2 * k) |
			    (unsigned long long)__ldcg(masks + 2 * k + 1) << 32;
		c = (uint32_t)__popcll(m);
		inc = c;
		for (int o = 1; o < WARP; o <<= 1) {
			const uint32_t v = __shfl_up_sync(FULL, inc, o);

			if (lane >= (unsigned)o)
				inc += v;
		}
		if (lane == WARP - 1)
			s_cnt[warp] = inc;
		__syncthreads();
		for (unsigned w = 0; w < P2_WARPS; w++) {
			base += w < warp ? s_cnt[w] : 0;
			tot += s_cnt[w];
		}
		s_off[t] = base + inc - c;
		s_mask[t] = m;
		__syncthreads();
		for (uint32_t j = warp; j < nk; j += P2_WARPS) {
			const unsigned long long mj = s_mask[j];

			for (unsigned b = lane; b < 64; b += WARP)
				if (mj >> b & 1)
					active[s_off[j] + __popcll(mj & ((1ull << b) - 1))] =
						(k0 + j) * 64 + b;
		}
		carry = tot;
		__syncthreads();
	}
	if (t == 0)
		*count = carry;
}

/*
 * lg[c] = b2[c] + sum over u with h_u > 0, increasing, of h_u fc2[u][c] for
 * the block's 64 columns; then the masks, and the last block compacts.
 */
template <bool VEC>
__global__ __launch_bounds__(P2_THREADS) void pred_fc2(const float *__restrict__ h,
						       const uint16_t *__restrict__ w2,
						       const float *__restrict__ b2,
						       float *__restrict__ lg, uint32_t *masks,
						       unsigned *done,
						       uint32_t *__restrict__ active,
						       uint32_t *__restrict__ count,
						       uint32_t hidden, uint32_t n_out)
{
	__shared__ __align__(16) uint16_t rows[P2_R * P2_TC];
	__shared__ uint32_t fu[P2_SEG];
	__shared__ float fh[P2_SEG];
	__shared__ uint32_t s_cnt[P2_WARPS];
	__shared__ bool s_last;
	const unsigned t = threadIdx.x, lane = t % WARP, warp = t / WARP;
	const uint32_t c0 = blockIdx.x * P2_TC, col = c0 + t;
	const bool own = t < P2_TC && col < n_out;
	/* the AVX-512 loop fuses whole vectors of 16; its scalar leftovers do not */
	const bool fused = col < (n_out & ~15u);
	uint4 sv[VEC ? P2_VL : 1] = {};
	uint16_t ss[VEC ? 1 : P2_SL] = {};
	float acc = own ? b2[col] : 0.0f;

	for (uint32_t s0 = 0; s0 < hidden; s0 += P2_SEG) {
		const uint32_t s1 = umin32(hidden, s0 + P2_SEG);
		uint32_t nf = 0;

		/* the fired units of [s0, s1) in increasing order */
		for (uint32_t u0 = s0; u0 < s1; u0 += P2_THREADS) {
			const uint32_t u = u0 + t;
			const float hv = u < s1 ? h[u] : 0.0f;
			const bool f = hv > 0;
			const unsigned bal = __ballot_sync(FULL, f);
			uint32_t pos = nf;

			if (lane == 0)
				s_cnt[warp] = (uint32_t)__popc(bal);
			__syncthreads();
			for (unsigned w = 0; w < P2_WARPS; w++) {
				pos += w < warp ? s_cnt[w] : 0;
				nf += s_cnt[w];
			}
			if (f) {
				pos += (uint32_t)__popc(bal & ((1u << lane) - 1));
				fu[pos] = u;
				fh[pos] = hv;
			}
			__syncthreads();
		}

		fc2_load<VEC>(sv, ss, w2, fu, 0, nf, c0, n_out, t);
		for (uint32_t b0 = 0; b0 < nf; b0 += P2_R) {
			const uint32_t nr = umin32(P2_R, nf - b0);

			if (b0)
				__syncthreads(); /* the previous batch is summed */
			fc2_store<VEC>(sv, ss, rows, t);
			__syncthreads();
			if (b0 + P2_R < nf)
				fc2_load<VEC>(sv, ss, w2, fu, b0 + P2_R, nf, c0, n_out, t);
			if (own && fused) {
				for (uint32_t k = 0; k < nr; k++)
					acc = __fmaf_rn(fh[b0 + k], f16f(rows[k * P2_TC + t]), acc);
			} else if (own) {
				for (uint32_t k = 0; k < nr; k++)
					acc = __fadd_rn(acc, __fmul_rn(fh[b0 + k],
								       f16f(rows[k * P2_TC + t])));
			}
		}
		__syncthreads(); /* before the next segment's list and rows */
	}

	if (own)
		lg[col] = acc;
	if (t < P2_TC) {
		const unsigned bal = __ballot_sync(FULL, own && acc > 0);

		if (lane == 0) {
			masks[2 * blockIdx.x + warp] = bal;
			__threadfence();
		}
	}
	__syncthreads();
	if (t == 0)
		s_last = atomicAdd(done, 1u) == gridDim.x - 1;
	__syncthreads();
	if (!s_last)
		return;
	__threadfence();
	fc2_compact(masks, gridDim.x, active, count, s_cnt);
}

/* ---- launcher ------------------------------------------------------------------ */

struct pred_layout {
	size_t h, masks, lg, total;
};

static size_t a256(size_t n)
{
	return (n + 255) & ~(size_t)255;
}

static struct pred_layout pred_layout_of(const struct hyb_dev_predict *p)
{
	const size_t n_tiles = ((size_t)p->n_out + P2_TC - 1) / P2_TC;
	struct pred_layout l;

	l.h = 256; /* the ticket counter first */
	l.masks = l.h + a256(4 * (size_t)p->hidden);
	l.lg = l.masks + a256(8 * n_tiles);
	l.total = l.lg + a256(4 * (size_t)p->n_out);
	return l;
}

extern "C" size_t hyb_cuda_predict_workspace(const struct hyb_dev_predict *p)
{
	return pred_layout_of(p).total;
}

extern "C" int hyb_cuda_predict(const struct hyb_dev_predict *p, void *workspace,
				size_t ws_bytes, void *stream)
{
	if (!p || !workspace || !p->n_in || p->n_in % 32 || p->n_in > HYB_CUDA_PREDICT_MAX_IN ||
	    !p->hidden || !p->n_out)
		return -EINVAL;
	if (p->fc1_w % 2 || p->fc2_w % 2 || p->fc1_b % 4 || p->fc2_b % 4 || p->x % 4 ||
	    p->active % 4 || p->count % 4 || p->logits % 4 || (uintptr_t)workspace % 256)
		return -EINVAL;

	const struct pred_layout l = pred_layout_of(p);
	char *ws = (char *)workspace;
	unsigned *done = (unsigned *)ws;
	float *h = (float *)(ws + l.h);
	/* the scores in the caller's array when asked for, else in the workspace */
	float *lg = p->logits ? (float *)(uintptr_t)p->logits : (float *)(ws + l.lg);
	uint32_t *masks = (uint32_t *)(ws + l.masks);
	const float *x = (const float *)(uintptr_t)p->x;
	const uint16_t *w1 = (const uint16_t *)(uintptr_t)p->fc1_w;
	const uint16_t *w2 = (const uint16_t *)(uintptr_t)p->fc2_w;
	const float *b1 = (const float *)(uintptr_t)p->fc1_b;
	const float *b2 = (const float *)(uintptr_t)p->fc2_b;
	uint32_t *active = (uint32_t *)(uintptr_t)p->active;
	uint32_t *count = (uint32_t *)(uintptr_t)p->count;
	const unsigned g1 = (p->hidden + P1_WARPS - 1) / P1_WARPS;
	const unsigned g2 = (unsigned)((p->n_out + P2_TC - 1) / P2_TC);
	const size_t smem1 = 2 * (size_t)p->n_in;
	cudaStream_t s = (cudaStream_t)stream;

	if (ws_bytes < l.total)
		return -EINVAL;
	if (p->fc1_w % 4 == 0)
		pred_fc1<true><<<g1, P1_THREADS, smem1, s>>>(x, w1, b1, h, done, p->n_in,
							     p->hidden, p->raw_x);
	else
		pred_fc1<false><<<g1, P1_THREADS, smem1, s>>>(x, w1, b1, h, done, p->n_in,
							      p->hidden, p->raw_x);
	if (p->fc2_w % 16 == 0 && p->n_out % 8 == 0)
		pred_fc2<true><<<g2, P2_THREADS, 0, s>>>(h, w2, b2, lg, masks, done, active, count,
							p->hidden, p->n_out);
	else
		pred_fc2<false><<<g2, P2_THREADS, 0, s>>>(h, w2, b2, lg, masks, done, active, count,
							 p->hidden, p->n_out);
	return (int)cudaGetLastError();
}
