// SPDX-License-Identifier: MIT
/* Block layouts of every ggml tensor type (ggml/include/ggml.h, ggml-common.h). */
#include "hyb/tensor_type.h"

#include <stdio.h>

#define T(id, nm, b, s, c) [id] = { .name = nm, .blck = b, .size = s, .computable = c }

static const struct hyb_type_info type_table[HYB_TYPE_COUNT] = {
	T(0, "F32", 1, 4, true),
	T(1, "F16", 1, 2, true),
	T(2, "Q4_0", 32, 18, true),
	T(3, "Q4_1", 32, 20, true),
	T(6, "Q5_0", 32, 22, true),
	T(7, "Q5_1", 32, 24, true),
	T(8, "Q8_0", 32, 34, true),
	T(9, "Q8_1", 32, 36, false),
	T(10, "Q2_K", 256, 84, true),
	T(11, "Q3_K", 256, 110, true),
	T(12, "Q4_K", 256, 144, true),
	T(13, "Q5_K", 256, 176, true),
	T(14, "Q6_K", 256, 210, true),
	T(15, "Q8_K", 256, 292, false),
	T(16, "IQ2_XXS", 256, 66, false),
	T(17, "IQ2_XS", 256, 74, false),
	T(18, "IQ3_XXS", 256, 98, false),
	T(19, "IQ1_S", 256, 50, false),
	T(20, "IQ4_NL", 32, 18, true),
	T(21, "IQ3_S", 256, 110, false),
	T(22, "IQ2_S", 256, 82, false),
	T(23, "IQ4_XS", 256, 136, true),
	T(24, "I8", 1, 1, false),
	T(25, "I16", 1, 2, false),
	T(26, "I32", 1, 4, false),
	T(27, "I64", 1, 8, false),
	T(28, "F64", 1, 8, false),
	T(29, "IQ1_M", 256, 56, false),
	T(30, "BF16", 1, 2, true),
	T(34, "TQ1_0", 256, 54, false),
	T(35, "TQ2_0", 256, 66, false),
	T(39, "MXFP4", 32, 17, true),
};

const struct hyb_type_info *hyb_type_info(uint32_t type)
{
	if (type >= HYB_TYPE_COUNT || !type_table[type].name)
		return NULL;
	return &type_table[type];
}

const char *hyb_type_name(uint32_t type)
{
	static _Thread_local char buf[24];
	const struct hyb_type_info *ti = hyb_type_info(type);

	if (ti)
		return ti->name;
	snprintf(buf, sizeof(buf), "type#%u", type);
	return buf;
}

uint64_t hyb_row_bytes(uint32_t type, uint64_t n)
{
	const struct hyb_type_info *ti = hyb_type_info(type);

	if (!ti || n % ti->blck)
		return 0;
	n /= ti->blck;
	if (n > UINT64_MAX / ti->size)
		return 0;
	return n * ti->size;
}
