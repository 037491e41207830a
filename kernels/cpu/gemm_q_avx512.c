// SPDX-License-Identifier: MIT
/*
 * AVX-512 (F/BW/VL/DQ, no VNNI) level: quantized kernels from the shared
 * body with the int8 dot emulated by vpmaddubsw + vpmaddwd, the float
 * kernels of gemm_f_avx512.c, the AVX2 activation converters, and the
 * predictor, popcount and threshold kernels of pred_avx512.c, popcount_avx512.c
 * and select_avx512.c.
 */
#define HYB_VNNI 0
#include "gemm_q_avx512_body.h"

void hyb_cpu_fill_avx512(struct hyb_cpu_kernels *k)
{
	fill_q_avx512(k);
	hyb_fill_f_avx512(k);
	hyb_fill_vec_avx512(k);
	hyb_fill_pred_avx512(k);
	hyb_fill_popcount_avx512(k);
	hyb_fill_select_avx512(k);
}
