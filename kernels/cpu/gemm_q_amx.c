// SPDX-License-Identifier: MIT
/*
 * AMX level: the AVX-512 VNNI kernels with the packed prefill's integer dot
 * products on AMX tiles (gemm_q_avx512_packed.h, "AMX tiles"). The sums,
 * hence the results, are the VNNI level's bit for bit; only their speed
 * differs.
 */
#define HYB_VNNI 1
#define HYB_AMX 1
#include "gemm_q_avx512_body.h"

void hyb_cpu_fill_amx(struct hyb_cpu_kernels *k)
{
	fill_q_amx(k);
}
