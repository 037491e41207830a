// SPDX-License-Identifier: MIT
/*
 * Peak rates with AVX2: vfmadd231ps ymm (8 multiply-adds) for float types,
 * vpmaddubsw ymm (32 u8*s8 products) for int8.
 */
#include "peak_common.h"

#define R12(op) op(0) op(1) op(2) op(3) op(4) op(5) op(6) op(7) op(8) op(9) op(10) op(11)
#define FMA(i) "vfmadd231ps %%ymm14, %%ymm15, %%ymm" #i "\n\t"
#define MADDUBS(i) "vpmaddubsw %%ymm14, %%ymm15, %%ymm" #i "\n\t"
#define CLOBBER12 "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", \
	"xmm9", "xmm10", "xmm11"

static void zero_sources(void)
{
	__asm__ volatile("vpxor %%ymm14, %%ymm14, %%ymm14\n\t"
			 "vpxor %%ymm15, %%ymm15, %%ymm15\n\t" ::: "xmm14", "xmm15");
}

static void loop_fma(long n)
{
	zero_sources();
	for (long i = 0; i < n; i++)
		__asm__ volatile(R12(FMA) R12(FMA) ::: CLOBBER12);
	__asm__ volatile("vzeroupper");
}

static void loop_maddubs(long n)
{
	zero_sources();
	for (long i = 0; i < n; i++)
		__asm__ volatile(R12(MADDUBS) R12(MADDUBS) ::: CLOBBER12);
	__asm__ volatile("vzeroupper");
}

double hyb_peak_avx2(enum hyb_peak_kind kind)
{
	static _Atomic double fma, int8;

	if (kind == HYB_PEAK_FMA)
		return peak_cached(&fma, loop_fma, 400000, 24.0 * 8);
	return peak_cached(&int8, loop_maddubs, 400000, 24.0 * 32);
}
