// SPDX-License-Identifier: MIT
/* Peak int8 rate with AVX-512 VNNI: vpdpbusd zmm, 64 u8*s8 multiply-adds each. */
#include "peak_common.h"

#define R24(op) op(0) op(1) op(2) op(3) op(4) op(5) op(6) op(7) op(8) op(9) op(10) op(11) \
	op(12) op(13) op(14) op(15) op(16) op(17) op(18) op(19) op(20) op(21) op(22) op(23)
#define DPBUSD(i) "vpdpbusd %%zmm30, %%zmm31, %%zmm" #i "\n\t"
#define CLOBBER24 "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", \
	"xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", \
	"xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23"

static void loop_dpbusd(long n)
{
	__asm__ volatile("vpxord %%zmm30, %%zmm30, %%zmm30\n\t"
			 "vpxord %%zmm31, %%zmm31, %%zmm31\n\t" ::: "xmm30", "xmm31");
	for (long i = 0; i < n; i++)
		__asm__ volatile(R24(DPBUSD) ::: CLOBBER24);
	__asm__ volatile("vzeroupper");
}

double hyb_peak_avx512vnni(enum hyb_peak_kind kind)
{
	static _Atomic double cache;

	if (kind == HYB_PEAK_FMA)
		return hyb_peak_avx512(kind);
	return peak_cached(&cache, loop_dpbusd, 400000, 24.0 * 64);
}
