/* SPDX-License-Identifier: MIT */
/*
 * Block layouts of the quantized types hyb computes with. They are byte for
 * byte those of llama.cpp (ggml-common.h): GGUF tensors are used in place.
 * Scales are IEEE half (uint16_t bits) except Q8_K's float.
 */
#ifndef HYB_BLOCKS_H
#define HYB_BLOCKS_H

#include <stdint.h>

#define HYB_QK4_0 32
#define HYB_QK8_0 32
#define HYB_QK_K 256
#define HYB_K_SCALE_SIZE 12

/* x = d * (q - 8); element j in the low nibble of qs[j], j + 16 in the high one */
struct hyb_block_q4_0 {
	uint16_t d;
	uint8_t qs[HYB_QK4_0 / 2];
};

/* x = d * q */
struct hyb_block_q8_0 {
	uint16_t d;
	int8_t qs[HYB_QK8_0];
};

/*
 * Super-block of 8 sub-blocks of 32: x = d * sc[j] * q - dmin * m[j], with
 * 6-bit sc/m packed in `scales` (see hyb_q4k_scales()) and 4-bit q: the 32
 * bytes qs[32*i ..] hold sub-block 2i in the low nibbles, 2i+1 in the high.
 */
struct hyb_block_q4_k {
	uint16_t d;
	uint16_t dmin;
	uint8_t scales[HYB_K_SCALE_SIZE];
	uint8_t qs[HYB_QK_K / 2];
};

/* Super-block of 16 sub-blocks of 16: x = d * scales[j] * (q - 32), q 6-bit */
struct hyb_block_q6_k {
	uint8_t ql[HYB_QK_K / 2];
	uint8_t qh[HYB_QK_K / 4];
	int8_t scales[HYB_QK_K / 16];
	uint16_t d;
};

/* Activations of the K-quants: x = d * q, with the sums of each 16 quants */
struct hyb_block_q8_k {
	float d;
	int8_t qs[HYB_QK_K];
	int16_t bsums[HYB_QK_K / 16];
};

_Static_assert(sizeof(struct hyb_block_q4_0) == 18, "q4_0 block layout");
_Static_assert(sizeof(struct hyb_block_q8_0) == 34, "q8_0 block layout");
_Static_assert(sizeof(struct hyb_block_q4_k) == 144, "q4_K block layout");
_Static_assert(sizeof(struct hyb_block_q6_k) == 210, "q6_K block layout");
_Static_assert(sizeof(struct hyb_block_q8_k) == 292, "q8_K block layout");

/* Unpack the eight 6-bit scales and mins of a Q4_K super-block. */
static inline void hyb_q4k_scales(const uint8_t *s, uint8_t sc[8], uint8_t m[8])
{
	for (int j = 0; j < 4; j++) {
		sc[j] = s[j] & 63;
		m[j] = s[j + 4] & 63;
		sc[j + 4] = (s[j + 8] & 0xF) | ((s[j] >> 6) << 4);
		m[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4);
	}
}

#endif
