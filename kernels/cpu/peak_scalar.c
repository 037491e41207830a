// SPDX-License-Identifier: MIT
/*
 * Peak rate of plain scalar code: eight independent float multiply-add
 * chains (the compiler may not fuse or vectorise them: no ISA flags and the
 * accumulators pass through an empty asm each step). The int8 kind uses
 * integer multiply-adds the same way.
 */
#include "peak_common.h"

static void loop_float(long n)
{
	float a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
	float m = 1.0f, c = 0.5f;

	for (long i = 0; i < n; i++) {
		a0 = a0 * m + c; a1 = a1 * m + c; a2 = a2 * m + c; a3 = a3 * m + c;
		a4 = a4 * m + c; a5 = a5 * m + c; a6 = a6 * m + c; a7 = a7 * m + c;
		__asm__ volatile("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4),
				 "+x"(a5), "+x"(a6), "+x"(a7));
	}
}

static void loop_int(long n)
{
	/* unsigned: the products wrap, by design */
	unsigned a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
	unsigned m = 3, c = 1;

	__asm__ volatile("" : "+r"(m), "+r"(c));
	for (long i = 0; i < n; i++) {
		a0 = a0 * m + c; a1 = a1 * m + c; a2 = a2 * m + c; a3 = a3 * m + c;
		a4 = a4 * m + c; a5 = a5 * m + c; a6 = a6 * m + c; a7 = a7 * m + c;
		__asm__ volatile("" : "+r"(a0), "+r"(a1), "+r"(a2), "+r"(a3), "+r"(a4),
				 "+r"(a5), "+r"(a6), "+r"(a7));
	}
}

double hyb_peak_scalar(enum hyb_peak_kind kind)
{
	static _Atomic double fl, in;

	if (kind == HYB_PEAK_FMA)
		return peak_cached(&fl, loop_float, 2000000, 8);
	return peak_cached(&in, loop_int, 2000000, 8);
}
