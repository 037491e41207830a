// SPDX-License-Identifier: MIT
/*
 * AVX-512 VNNI level: the quantized kernels of the shared body with
 * vpdpbusd / vpdpwssd. Float kernels have nothing to gain from VNNI and
 * come from the AVX-512 level below.
 */
#define HYB_VNNI 1
#include "gemm_q_avx512_body.h"

void hyb_cpu_fill_avx512vnni(struct hyb_cpu_kernels *k)
{
	fill_q_avx512vnni(k);
}
