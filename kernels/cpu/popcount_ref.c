// SPDX-License-Identifier: MIT
/* and_popcount (cpu_kernels.h) in plain C, for CPUs without AVX2 */
#include "popcount_common.h"

void hyb_fill_popcount_ref(struct hyb_cpu_kernels *k)
{
	k->and_popcount = and_popcount_words;
}
