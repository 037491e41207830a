// SPDX-License-Identifier: MIT
/*
 * IEEE half and bfloat16 <-> float, round-to-nearest-even, written with
 * integer operations so the result never depends on the FPU mode. NaN
 * handling follows ggml's portable converters (what its reference
 * quantizers use): a float NaN becomes the half quiet NaN 0x7e00 with the
 * sign kept; a bfloat16 NaN keeps its payload and is forced quiet.
 */
#include <string.h>

#include "cpu_internal.h"

static inline uint32_t f32_bits(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	return u;
}

static inline float bits_f32(uint32_t u)
{
	float f;

	memcpy(&f, &u, 4);
	return f;
}

float hyb_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16;
	uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;

	if (e == 0) {
		/* zero or subnormal: m * 2^-24 is exact in float */
		float v = (float)m * 0x1p-24f;

		return bits_f32(f32_bits(v) | sign);
	}
	if (e == 31)
		return bits_f32(sign | 0x7f800000 | (m << 13));
	return bits_f32(sign | ((e + 112) << 23) | (m << 13));
}

uint16_t hyb_f32_to_f16(float f)
{
	uint32_t u = f32_bits(f);
	uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
	uint32_t a = u & 0x7fffffff;

	if (a > 0x7f800000)
		return sign | 0x7e00;
	/* 65520 is halfway between the largest half (65504) and 2^16: ties go to even = inf */
	if (a >= 0x477ff000)
		return sign | 0x7c00;
	if (a < 0x38800000) {
		/* below 2^-14: a half subnormal, m * 2^(e-126) units of 2^-24 */
		uint32_t e = a >> 23, m = (a & 0x7fffff) | 0x800000;
		uint32_t s = 126 - e, n, rem, half;

		if (e == 0 || s >= 25)
			return sign;
		n = m >> s;
		rem = m & ((1u << s) - 1);
		half = 1u << (s - 1);
		n += rem > half || (rem == half && (n & 1));
		return sign | (uint16_t)n; /* n == 0x400 is the smallest normal: still right */
	}
	uint32_t h = ((a >> 23) - 112) << 10 | ((a & 0x7fffff) >> 13);
	uint32_t rem = a & 0x1fff;

	h += rem > 0x1000 || (rem == 0x1000 && (h & 1));
	return sign | (uint16_t)h;
}

float hyb_bf16_to_f32(uint16_t h)
{
	return bits_f32((uint32_t)h << 16);
}

uint16_t hyb_f32_to_bf16(float f)
{
	uint32_t u = f32_bits(f);

	if ((u & 0x7fffffff) > 0x7f800000)
		return (uint16_t)((u >> 16) | 64);
	return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}
