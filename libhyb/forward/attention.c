// SPDX-License-Identifier: MIT
/*
 * Attention as llama.cpp's CPU flash attention computes it (ggml-cpu
 * ops.cpp, ggml_compute_forward_flash_attn_ext_f16), its default on CPU with
 * an F16 cache. Its three paths give different roundings, and greedy tokens
 * only agree with llama.cpp's when the logits are its logits bit for bit:
 *
 *  - batches under 64 tokens (flash_attn_ext_f16_one_chunk): q rounded to
 *    F16, K.q by ggml_vec_dot_f16, an online softmax over the positions in
 *    order with the V sum kept in F16 (ggml_vec_scale_f16 when the maximum
 *    grows, ggml_vec_mad_f16 per position);
 *  - one token over 512 or more padded cache positions: the same per
 *    thread on contiguous position chunks, the partial results merged in
 *    chunk order (ggml_flash_attn_ext_reduce_partials);
 *  - batches of 64 or more (flash_attn_ext_tiled): F32 throughout, 64
 *    positions at a time: scores by simd_gemm, a per-tile maximum,
 *    exponentials by ggml_v_expf (ggml_vec_soft_max_f32), V by simd_gemm.
 *
 * Attention sinks (gpt-oss) join the softmax as llama.cpp adds them: after
 * the positions, to the first chunk only where a row is split, and per row
 * of a tile.
 *
 * Masked positions (after the query's own) are skipped where llama.cpp
 * skips them and zero where it multiplies them by zero; the results do not
 * depend on how rows are grouped, so each job is one row (or one head's
 * tile of rows) whatever llama.cpp's threads would have done.
 *
 * A PowerInfer file is attended as PowerInfer's llama.cpp (late-2023 ggml,
 * no flash attention) attends it instead (attend_row_ggml23): its softmax
 * takes each exponential from ggml's F16 table, which moves logits by about
 * 1e-3 of their size, enough to change greedy tokens (docs/DETERMINISM.md).
 */
#include "attention.h"

#include <math.h>
#include <string.h>

#define TILE 64 /* GGML_FA_TILE_Q and GGML_FA_TILE_KV */

size_t hyb_attend_tmp_bytes(uint32_t hd, uint32_t n_ctx_ggml23)
{
	/* tiled: q, K^T, V, VKQ tiles (TILE x hd each), scores, M and S, alignment */
	const size_t tiled_b = sizeof(float) * (4 * (size_t)TILE * hd + TILE * TILE + 2 * TILE);
	/* attend_row_ggml23: q in F16, a score per position, a V row, the output sum */
	const size_t g23 = sizeof(uint16_t) * hd + sizeof(float) * ((size_t)n_ctx_ggml23 + 2 * hd);

	return (tiled_b > g23 ? tiled_b : g23) + 8 * 64;
}

static uint32_t pad256(uint64_t n)
{
	return (uint32_t)((n + 255) / 256 * 256);
}

/* llama.cpp's n_kv for a batch ending at position p: the used cells padded to 256 */
static uint32_t kv_padded(const struct hyb_attn *a)
{
	uint32_t used = pad256((uint64_t)a->n_past + a->n_tokens), cap = pad256(a->n_ctx);

	if (used < 256)
		used = 256;
	return used < cap ? used : cap;
}

/* The first position a query at pos sees: a sliding window masks the older ones. */
static uint32_t first_visible(const struct hyb_attn *a, uint32_t pos)
{
	return a->n_swa && pos + 1 > a->n_swa ? pos + 1 - a->n_swa : 0;
}

static int tiled(const struct hyb_attn *a)
{
	return a->n_tokens >= TILE;
}

long hyb_attend_jobs(const struct hyb_attn *a)
{
	if (tiled(a) && !a->ggml23)
		return (long)a->n_head * ((a->n_tokens + TILE - 1) / TILE);
	return (long)a->n_tokens * a->n_head;
}

static void *align64(void *p)
{
	return (void *)(((uintptr_t)p + 63) & ~(uintptr_t)63);
}

/* ---- one chunk: the small-batch path ------------------------------------ */

struct partial {
	float M, S;
	float *v;  /* hd_v floats: the F16 sum widened, not yet divided by S */
};

/* Positions [p0, p1) for query q16: M, S and the F16 V sum, as one_chunk. */
static void one_chunk(const struct hyb_attn *a, const uint16_t *q16, const uint16_t *kc,
		      const uint16_t *vc, uint32_t p0, uint32_t p1, uint16_t *acc16,
		      struct partial *out)
{
	const struct hyb_cpu_kernels *k = a->k;
	const uint32_t hd = a->hd, hv = a->hd_v;
	float S = 0.0f, M = -INFINITY;

	memset(acc16, 0, sizeof(uint16_t) * hv);
	for (uint32_t p = p0; p < p1; p++) {
		const size_t row = hyb_kv_row(a->blocks, p);
		const uint16_t *kr = kc + row * a->kv_stride;
		const uint16_t *vr = vc + row * a->v_stride;
		/* + 0.0f: the mask value of a visible position (it makes -0 +0) */
		const float s = k->dot_f16(hd, kr, q16) * a->scale + 0.0f;
		float ms = 1.0f, vs = 1.0f;

		if (s > M) {
			const float m_old = M;

			M = s;
			ms = expf(m_old - M);
			k->scale_f16(hv, acc16, ms);
		} else {
			vs = expf(s - M);
		}
		k->mad_f16(hv, acc16, vr, vs);
		S = fmaf(S, ms, vs); /* S*ms + vs, contracted by llama.cpp's compiler */
	}
	out->M = M;
	out->S = S;
	k->dequantize[HYB_TYPE_F16](acc16, out->v, hv);
}

static void scale_f32(float *v, uint32_t n, float s)
{
	for (uint32_t i = 0; i < n; i++)
		v[i] *= s;
}

/*
 * Head h's sink into a softmax so far (max *M, sum *S, value sum v):
 * llama.cpp's flash attention, S*ms + vs contracted as in the loop.
 */
static void add_sink(const struct hyb_attn *a, uint32_t h, float *M, float *S, float *v)
{
	const float s = a->sinks[h];
	float ms = 1.0f, vs = 1.0f;

	if (s > *M) {
		ms = expf(*M - s);
		*M = s;
		scale_f32(v, a->hd_v, ms);
	} else {
		vs = expf(s - *M);
	}
	*S = fmaf(*S, ms, vs);
}

/* One (token, head) row under 64-token batches, split or not. */
static void attend_row(const struct hyb_attn *a, uint32_t t, uint32_t h, void *tmp)
{
	const uint32_t hd = a->hd, hv = a->hd_v, group = a->n_head / a->n_head_kv;
	const uint32_t pos = a->n_past + t;
	const uint16_t *kc = a->kc + (size_t)(h / group) * hd;
	const uint16_t *vc = a->vc + (size_t)(h / group) * hv;
	float *out = a->out + (size_t)t * a->out_stride + (size_t)h * hv;
	uint16_t *q16 = align64(tmp), *acc16 = align64(q16 + hd);
	float *vf = align64(acc16 + hv), *vc32 = align64(vf + hv);
	const uint32_t n_kv = kv_padded(a), p_min = first_visible(a, pos);
	struct partial part = { .v = vc32 };

	a->k->quantize_act[HYB_TYPE_F16](a->q + (size_t)t * a->q_stride + (size_t)h * hd, q16, hd);
	if (a->n_tokens == 1 && n_kv >= 512 && a->n_split > 0) {
		/* ggml_flash_attn_ext_reduce_partials over the threads' chunks */
		const uint32_t cs = (n_kv + (uint32_t)a->n_split - 1) / (uint32_t)a->n_split;
		float M = -INFINITY, S = 0.0f;

		memset(vf, 0, sizeof(float) * hv);
		for (int c = 0; c < a->n_split; c++) {
			const uint32_t p0 = (uint32_t)c * cs;
			uint32_t p1 = p0 + cs < n_kv ? p0 + cs : n_kv;

			if (p1 > pos + 1)
				p1 = pos + 1;
			/* masked positions are skipped one by one: start past them */
			if ((p0 < p_min ? p_min >= p1 : p0 >= p1) && !(c == 0 && a->sinks))
				continue; /* every position masked: S == 0, skipped */
			one_chunk(a, q16, kc, vc, p0 < p_min ? p_min : p0, p1, acc16, &part);
			if (c == 0 && a->sinks)
				add_sink(a, h, &part.M, &part.S, part.v);
			if (part.S == 0.0f)
				continue;
			const float m_new = fmaxf(M, part.M);
			const float so = expf(M - m_new), sn = expf(part.M - m_new);

			for (uint32_t d = 0; d < hv; d++)
				vf[d] = fmaf(vf[d], so, part.v[d] * sn);
			S = fmaf(S, so, part.S * sn);
			M = m_new;
		}
		if (S != 0.0f)
			scale_f32(vf, hv, 1.0f / S);
		memcpy(out, vf, sizeof(float) * hv);
		return;
	}
	one_chunk(a, q16, kc, vc, p_min, pos + 1, acc16, &part);
	if (a->sinks)
		add_sink(a, h, &part.M, &part.S, part.v);
	scale_f32(part.v, hv, part.S == 0.0f ? 0.0f : 1.0f / part.S);
	memcpy(out, part.v, sizeof(float) * hv);
}

/* ---- PowerInfer's llama.cpp ------------------------------------------------ */

/* x rounded to F16 and back, as ggml's GGML_FP32_TO_FP16 / GGML_FP16_TO_FP32 */
static inline float f16r(float x)
{
	return hyb_f16_to_f32(hyb_f32_to_f16(x));
}

/*
 * One (token, head) row as PowerInfer's ggml computes it, any batch size:
 * kq = K.q with q rounded to F16, times the scale; ggml_soft_max_f32 with
 * the exponential of each F16-rounded difference from the maximum read
 * from ggml_table_exp_f16 (expf of the F16 value, rounded to F16), summed
 * in double, each scaled by (float)(1 / sum); then V^T . kq with kq rounded
 * to F16 (ggml_mul_mat converts it to V's type). Its dot products sum in
 * another order than hyb's kernels (ggml's AVX build of the time): last
 * bits only.
 */
static void attend_row_ggml23(const struct hyb_attn *a, uint32_t t, uint32_t h, void *tmp)
{
	const uint32_t hd = a->hd, hv = a->hd_v, group = a->n_head / a->n_head_kv;
	const uint32_t pos = a->n_past + t, p_min = first_visible(a, pos);
	const uint16_t *kc = a->kc + (size_t)(h / group) * hd;
	const uint16_t *vc = a->vc + (size_t)(h / group) * hv;
	float *out = a->out + (size_t)t * a->out_stride + (size_t)h * hv;
	float *acc = align64(tmp), *vf = align64(acc + hv), *sc = align64(vf + hv);
	uint16_t *q16 = align64(sc + (pos + 1 - p_min));
	float mx = -INFINITY, inv;
	double sum = 0.0;

	a->k->quantize_act[HYB_TYPE_F16](a->q + (size_t)t * a->q_stride + (size_t)h * hd, q16, hd);
	for (uint32_t p = p_min; p <= pos; p++) {
		const uint16_t *kr = kc + hyb_kv_row(a->blocks, p) * a->kv_stride;
		const float s = a->k->dot_f16(hd, kr, q16) * a->scale + 0.0f;

		sc[p - p_min] = s;
		mx = s > mx ? s : mx;
	}
	for (uint32_t p = p_min; p <= pos; p++) {
		const float e = f16r(expf(f16r(sc[p - p_min] - mx)));

		sum += (double)e;
		sc[p - p_min] = e;
	}
	inv = (float)(1.0 / sum);
	memset(acc, 0, sizeof(float) * hv);
	for (uint32_t p = p_min; p <= pos; p++) {
		const uint16_t *vr = vc + hyb_kv_row(a->blocks, p) * a->v_stride;
		const float w = f16r(sc[p - p_min] * inv);

		a->k->dequantize[HYB_TYPE_F16](vr, vf, hv);
		for (uint32_t d = 0; d < hv; d++)
			acc[d] += w * vf[d];
	}
	memcpy(out, acc, sizeof(float) * hv);
}

/* ---- tiled: batches of 64 tokens or more --------------------------------- */

static void attend_tile(const struct hyb_attn *a, uint32_t tile, uint32_t h, void *tmp)
{
	const struct hyb_cpu_kernels *k = a->k;
	const uint32_t hd = a->hd, hv = a->hd_v, group = a->n_head / a->n_head_kv;
	const uint32_t t0 = tile * TILE;
	const uint32_t nq = a->n_tokens - t0 < TILE ? a->n_tokens - t0 : TILE;
	const uint32_t last = a->n_past + t0 + nq - 1; /* the tile's last visible position */
	const size_t kv_off = (size_t)(h / group) * hd, v_off = (size_t)(h / group) * hv;
	float *qt = align64(tmp), *kt = align64(qt + (size_t)TILE * hd);
	float *vt = align64(kt + (size_t)TILE * hd), *acc = align64(vt + (size_t)TILE * hd);
	float *kq = align64(acc + (size_t)TILE * hd), *M = align64(kq + TILE * TILE);
	float *S = M + TILE;

	for (uint32_t i = 0; i < nq; i++) {
		memcpy(qt + (size_t)i * hd, a->q + (size_t)(t0 + i) * a->q_stride + (size_t)h * hd,
		       sizeof(float) * hd);
		M[i] = -INFINITY;
		S[i] = 0.0f;
	}
	memset(acc, 0, sizeof(float) * nq * hv);
	/* KV tiles from position 0; those past every row's position are skipped */
	for (uint32_t ic = 0; ic <= last; ic += TILE) {
		const uint32_t nv = last - ic + 1 < TILE ? last - ic + 1 : TILE;

		/* K transposed [dk][position]; masked positions are zeros (a fresh cache) */
		memset(kt, 0, sizeof(float) * TILE * hd);
		for (uint32_t tk = 0; tk < nv; tk++) {
			/* widened into the V tile's space first: it is filled after the scores */
			k->dequantize[HYB_TYPE_F16](a->kc + hyb_kv_row(a->blocks, ic + tk) *
							    a->kv_stride + kv_off,
						    vt, hd);
			for (uint32_t d = 0; d < hd; d++)
				kt[(size_t)d * TILE + tk] = vt[d];
		}
		memset(kq, 0, sizeof(float) * nq * TILE);
		k->gemm_acc(kq, qt, kt, (int)nq, (int)hd, TILE);
		for (uint32_t i = 0; i < nq; i++) {
			float *row = kq + (size_t)i * TILE;
			const uint32_t pos = a->n_past + t0 + i, p_min = first_visible(a, pos);
			float mx = -INFINITY;

			for (uint32_t tk = 0; tk < TILE; tk++) {
				/* scale, then the mask: + 0 where visible, -inf after pos
				 * (and before a sliding window) */
				row[tk] = ic + tk <= pos && ic + tk >= p_min ?
					  row[tk] * a->scale + 0.0f : -INFINITY;
				mx = mx > row[tk] ? mx : row[tk];
			}
			if (mx == -INFINITY) {
				memset(row, 0, sizeof(float) * TILE);
				continue;
			}
			const float m_new = fmaxf(M[i], mx);

			if (m_new > M[i]) {
				const float ms = expf(M[i] - m_new);

				scale_f32(acc + (size_t)i * hv, hv, ms);
				S[i] *= ms;
			}
			M[i] = m_new;
			S[i] = (float)((double)S[i] + k->soft_max(TILE, row, row, m_new));
		}
		memset(vt, 0, sizeof(float) * TILE * hv);
		for (uint32_t tk = 0; tk < nv; tk++)
			k->dequantize[HYB_TYPE_F16](a->vc + hyb_kv_row(a->blocks, ic + tk) *
							    a->v_stride + v_off,
						    vt + (size_t)tk * hv, hv);
		k->gemm_acc(acc, kq, vt, (int)nq, TILE, (int)hv);
	}
	for (uint32_t i = 0; a->sinks && i < nq; i++)
		add_sink(a, h, &M[i], &S[i], acc + (size_t)i * hv);
	for (uint32_t i = 0; i < nq; i++) {
		float *o = a->out + (size_t)(t0 + i) * a->out_stride + (size_t)h * hv;

		memcpy(o, acc + (size_t)i * hv, sizeof(float) * hv);
		scale_f32(o, hv, S[i] == 0.0f ? 0.0f : 1.0f / S[i]);
	}
}

void hyb_attend_run(const struct hyb_attn *attn, long lo, long hi, void *tmp)
{
	struct hyb_attn b = *attn;
	const struct hyb_attn *a = &b;

	/* V as wide as K, outputs laid out as q, V rows as K's: unless told otherwise */
	b.hd_v = b.hd_v ? b.hd_v : b.hd;
	b.out_stride = b.out_stride ? b.out_stride : b.q_stride;
	b.v_stride = b.v_stride ? b.v_stride : b.kv_stride;
	for (long j = lo; j < hi; j++) {
		if (a->ggml23)
			attend_row_ggml23(a, (uint32_t)(j / a->n_head), (uint32_t)(j % a->n_head),
					  tmp);
		else if (tiled(a))
			attend_tile(a, (uint32_t)(j / a->n_head), (uint32_t)(j % a->n_head), tmp);
		else
			attend_row(a, (uint32_t)(j / a->n_head), (uint32_t)(j % a->n_head), tmp);
	}
}
