// SPDX-License-Identifier: MIT
/*
 * kernels/cuda/deq8.h, the CUDA kernels' weights of the types without a
 * kernel of their own, built here as host C: every 8 elements of every row
 * must be the CPU's scalar dequantizer's bits (the device build rounds each
 * operation as the host one does: __fmul_rn, __fadd_rn). Rows: quantized
 * from random floats, and random bytes (every code and scale pattern).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "hyb/tensor_type.h"
#include "kernels/cuda/deq8.h"
#include "test.h"

static uint64_t rng = 88172645463325252ull;

static uint32_t rnd(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)(rng >> 11);
}

static bool same(float a, float b)
{
	return (isnan(a) && isnan(b)) || !memcmp(&a, &b, sizeof(a));
}

TEST(deq8_matches_the_cpu_dequantizers)
{
	const uint32_t types[] = { HYB_TYPE_Q4_1, HYB_TYPE_Q5_0, HYB_TYPE_Q5_1, HYB_TYPE_IQ4_NL,
				   HYB_TYPE_Q2_K, HYB_TYPE_Q3_K, HYB_TYPE_Q4_K, HYB_TYPE_Q5_K,
				   HYB_TYPE_Q6_K, HYB_TYPE_IQ4_XS };
	const struct hyb_cpu_kernels *ks = hyb_cpu_kernels(HYB_ISA_SCALAR);
	const uint32_t n = 1024;
	float src[1024], ref[1024], w[8];
	uint8_t row[1024 * 2];
	uint32_t checked = 0;

	for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
		const uint32_t t = types[ti];
		const uint64_t rb = hyb_row_bytes(t, n);
		uint32_t qk;

		CHECK_MSG(rb && rb <= sizeof(row), "%s", hyb_type_name(t));
		CHECK_EQ_INT(hyb_deq8_block(t, &qk) * (n / qk), rb);
		CHECK_EQ_INT(qk, hyb_type_info(t)->blck);
		for (int pass = 0; pass < 8; pass++) {
			if (pass < 4) { /* well-formed: quantized floats of several scales */
				for (uint32_t i = 0; i < n; i++)
					src[i] = ((float)(rnd() % 20001) - 10000.0f) *
						 powf(10.0f, (float)pass - 6.0f);
				CHECK(hyb_quantize_row_ref(t, src, row, n) == 0);
			} else {
				for (uint64_t i = 0; i < rb; i++)
					row[i] = (uint8_t)rnd();
			}
			ks->dequantize[t](row, ref, n);
			for (uint32_t c0 = 0; c0 < n; c0 += 8) {
				hyb_deq8(t, row, c0, w);
				for (int i = 0; i < 8; i++)
					CHECK_MSG(same(w[i], ref[c0 + i]),
						  "%s pass %d element %u: %.9g, the CPU %.9g",
						  hyb_type_name(t), pass, c0 + i, w[i], ref[c0 + i]);
				checked += 8;
				if (t == HYB_TYPE_Q4_1 || t == HYB_TYPE_Q5_1) {
					float m;

					/* apart: q * d, then + m is the CPU's value */
					hyb_deq8_q1(t, row, c0, w, &m);
					for (int i = 0; i < 8; i++)
						CHECK_MSG(same(w[i] + m, ref[c0 + i]),
							  "%s apart, element %u: %.9g + %.9g, the "
							  "CPU %.9g", hyb_type_name(t), c0 + i,
							  w[i], m, ref[c0 + i]);
				}
			}
		}
	}
	/* a type it does not take: zeros, and no block size */
	{
		uint32_t qk;

		memset(w, 0xff, sizeof(w));
		hyb_deq8(HYB_TYPE_Q8_0, row, 0, w);
		for (int i = 0; i < 8; i++)
			CHECK(w[i] == 0.0f);
		CHECK(hyb_deq8_block(HYB_TYPE_Q8_0, &qk) == 0 && qk == 0);
	}
	printf("    %u weights of 10 types, each the CPU's bits\n", checked);
}
