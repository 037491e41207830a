// SPDX-License-Identifier: MIT
/* and_popcount (cpu_kernels.h) with the POPCNT instruction (-mpopcnt: every AVX2 CPU has it) */
#include "popcount_common.h"

void hyb_fill_popcount_avx2(struct hyb_cpu_kernels *k)
{
	k->and_popcount = and_popcount_words;
}
