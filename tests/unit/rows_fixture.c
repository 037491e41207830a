// SPDX-License-Identifier: MIT
/*
 * Random weight rows for the kernels' tests (test.h): GGUF rows of the
 * plain types, from a seed, the same on the host and GPU test binaries.
 */
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "hyb/tensor_type.h"
#include "test.h"

static uint32_t next(uint64_t *s)
{
	*s = *s * 6364136223846793005ull + 1442695040888963407ull;
	return (uint32_t)(*s >> 33);
}

/* uniform in [-1, 1) */
static float unit(uint64_t *s)
{
	return (float)((double)next(s) / 2147483648.0 * 2 - 1);
}

uint8_t *hyb_test_rand_rows(uint32_t type, uint32_t n, uint32_t len, uint64_t seed)
{
	const uint64_t rb = hyb_row_bytes(type, len);
	const uint32_t qs = type == HYB_TYPE_Q8_0 ? 32 : 16, bb = 2 + qs;
	uint8_t *w = rb ? malloc(rb * n) : NULL;

	CHECK_MSG(w && (type == HYB_TYPE_F32 || type == HYB_TYPE_F16 || type == HYB_TYPE_Q8_0 ||
			type == HYB_TYPE_Q4_0), "random rows of %s x %u", hyb_type_name(type), len);
	for (uint64_t r = 0; r < n; r++) {
		uint8_t *row = w + r * rb;

		for (uint32_t o = 0; o < len; o++) {
			if (type == HYB_TYPE_F32) {
				((float *)row)[o] = unit(&seed);
			} else if (type == HYB_TYPE_F16) {
				((uint16_t *)row)[o] = hyb_f32_to_f16(unit(&seed));
			} else if (o % 32 == 0) {
				/* a block: its F16 scale, then 32 int8 or 16 bytes of nibbles */
				uint8_t *b = row + (o / 32) * bb;
				const uint16_t d = hyb_f32_to_f16(0.01f + 0.02f * (unit(&seed) + 1));

				memcpy(b, &d, 2);
				for (uint32_t j = 0; j < qs; j++)
					b[2 + j] = (uint8_t)next(&seed);
			}
		}
	}
	return w;
}
