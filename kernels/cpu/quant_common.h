/* SPDX-License-Identifier: MIT */
/* What the reference quantizers (quant_ref.c, quant_ref_k_extra.c) share, as ggml-quants.c has it. */
#ifndef HYB_QUANT_COMMON_H
#define HYB_QUANT_COMMON_H

#include <string.h>

#define GROUP_MAX_EPS 1e-15f

static inline int imin(int a, int b)
{
	return a < b ? a : b;
}

static inline int imax(int a, int b)
{
	return a > b ? a : b;
}

/* Round to nearest (ties to even) by the 1.5*2^23 trick; |fval| < 2^22 (nearest_int). */
static inline int nearest_int(float fval)
{
	float val = fval + 12582912.f;
	int i;

	memcpy(&i, &val, sizeof(int));
	return (i & 0x007fffff) - 0x00400000;
}

#endif
