// SPDX-License-Identifier: MIT
/*
 * The AMX level against the AVX-512 VNNI level, bit for bit: the AMX
 * level changes only where the packed prefill's integer dot products are
 * formed (kernels/cpu/gemm_q_avx512_packed.h), and integers are exact in any
 * grouping, so every output must be the VNNI level's exactly (and hence
 * llama.cpp's where the VNNI level is). Runs natively on a CPU with AMX and
 * on amxemu elsewhere (build/amxemu/hyb-tests, docs/AMXEMU.md); skips when
 * neither is there.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "test.h"

static uint64_t rng;

static float urand(void)
{
	rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
	return (float)((rng ^ (rng >> 29)) >> 40) * 0x1p-23f - 1.0f;
}

/* every type with a packed prefill kernel (Q8_0's stays on vpdpbusd, checked too) */
static const uint32_t packed_types[] = {
	HYB_TYPE_Q4_0, HYB_TYPE_IQ4_NL, HYB_TYPE_Q8_0, HYB_TYPE_Q4_K, HYB_TYPE_Q2_K,
	HYB_TYPE_Q6_K, HYB_TYPE_Q3_K, HYB_TYPE_Q5_K, HYB_TYPE_IQ4_XS,
};

struct case_buf {
	uint8_t *w, *x;
	size_t ws, xs;
	float *ya, *yb;
	size_t ys, ylen;
};

/* rows of weights quantized from floats with outliers, activations in the dot type */
static void make(struct case_buf *b, uint32_t type, int64_t k, int64_t rows, int64_t cols,
		 uint64_t seed)
{
	const uint32_t at = hyb_vec_dot_type(type);
	const struct hyb_cpu_kernels *s = hyb_cpu_kernels(HYB_ISA_SCALAR);
	float *f = malloc(sizeof(float) * (size_t)k);

	CHECK(f);
	rng = seed;
	b->ws = hyb_row_bytes(type, (uint64_t)k);
	b->xs = hyb_row_bytes(at, (uint64_t)k) + 64; /* a gap between columns */
	b->w = malloc(b->ws * (size_t)rows);
	b->x = calloc((size_t)cols, b->xs);
	b->ys = (size_t)rows + 3;
	b->ylen = b->ys * (size_t)cols;
	b->ya = malloc(sizeof(float) * b->ylen);
	b->yb = malloc(sizeof(float) * b->ylen);
	CHECK(b->w && b->x && b->ya && b->yb);
	for (int64_t r = 0; r < rows; r++) {
		const float scale = r % 7 == 3 ? 40.0f : 1.0f;

		for (int64_t i = 0; i < k; i++)
			f[i] = urand() * scale * (i % 97 == 5 ? 8.0f : 1.0f);
		CHECK_EQ_INT(hyb_quantize_row_ref(type, f, b->w + (size_t)r * b->ws, k), 0);
	}
	for (int64_t c = 0; c < cols; c++) {
		for (int64_t i = 0; i < k; i++)
			f[i] = urand() * (i % 61 == 7 ? 16.0f : 1.0f);
		s->quantize_act[at](f, b->x + (size_t)c * b->xs, k);
	}
	for (size_t i = 0; i < b->ylen; i++)
		b->ya[i] = b->yb[i] = -1234.5f; /* the gap rows must stay untouched */
	free(f);
}

static void drop(struct case_buf *b)
{
	free(b->w);
	free(b->x);
	free(b->ya);
	free(b->yb);
}

TEST(kern_amx_gemm_equals_vnni_bitwise)
{
	const struct hyb_cpu_kernels *amx = hyb_cpu_kernels(HYB_ISA_AMX);
	const struct hyb_cpu_kernels *vn = hyb_cpu_kernels(HYB_ISA_AVX512_VNNI);
	/* k: one packed chunk, several (Q4_0's 8 units, the K-quants' 2 super-blocks) */
	const int64_t ks32[] = { 64, 608, 2048 }, ks256[] = { 256, 1280 };
	/* rows: part of a 16-row group, several 48-row panels with a ragged end */
	const int64_t rows[] = { 8, 44, 112 };
	/* columns: the tiles take 16 (a group), then what is left; the column tiles 4 */
	const int64_t cols[] = { 4, 7, 16, 37 };
	int n = 0;

	if (!amx)
		SKIP("no AMX here (build/amxemu/hyb-tests runs this on amxemu)");
	CHECK(vn);
	for (size_t t = 0; t < sizeof(packed_types) / sizeof(packed_types[0]); t++) {
		const uint32_t type = packed_types[t];
		const int kq = hyb_type_info(type)->blck == 256;

		for (int ik = 0; ik < (kq ? 2 : 3); ik++)
			for (int ir = 0; ir < 3; ir++)
				for (int ic = 0; ic < 4; ic++)
					for (int tab = 0; tab < 3; tab++) {
						const int64_t k = kq ? ks256[ik] : ks32[ik];
						/* the three summations: rows % 8 == 0, % 8 == 4, odd */
						const uint64_t ne1 = tab == 0 ? 8 : tab == 1 ? 4 : 3;
						struct case_buf b;

						make(&b, type, k, rows[ir], cols[ic],
						     (uint64_t)(1000 * t + 100 * ik + 10 * ir + ic));
						hyb_gemm_pick(vn, type, ne1)(k, b.w, b.ws, rows[ir], b.x,
									     b.xs, cols[ic], b.ya, b.ys);
						hyb_gemm_pick(amx, type, ne1)(k, b.w, b.ws, rows[ir], b.x,
									      b.xs, cols[ic], b.yb, b.ys);
						CHECK_MSG(!memcmp(b.ya, b.yb, sizeof(float) * b.ylen),
							  "%s k %lld rows %lld cols %lld (table %d): the AMX "
							  "level's sums differ from the VNNI level's",
							  hyb_type_name(type), (long long)k,
							  (long long)rows[ir], (long long)cols[ic], tab);
						drop(&b);
						n++;
					}
	}
	CHECK(n > 0);
}

/* HYB_ISA names the level; without AMX the request falls back with a note */
TEST(kern_amx_level_named)
{
	CHECK(!strcmp(hyb_isa_name(HYB_ISA_AMX), "amx"));
	if (hyb_cpu_kernels(HYB_ISA_AMX))
		CHECK(hyb_cpu_kernels(HYB_ISA_AVX512_VNNI));
}
