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

/* x = d * q + m; nibbles as Q4_0 */
struct hyb_block_q4_1 {
	uint16_t d;
	uint16_t m;
	uint8_t qs[HYB_QK4_0 / 2];
};

/* x = d * (q - 16), q 5-bit: the low 4 bits as Q4_0, bit 4 of element j in bit j of qh */
struct hyb_block_q5_0 {
	uint16_t d;
	uint8_t qh[4];
	uint8_t qs[HYB_QK4_0 / 2];
};

/* x = d * q + m, q 5-bit as Q5_0 */
struct hyb_block_q5_1 {
	uint16_t d;
	uint16_t m;
	uint8_t qh[4];
	uint8_t qs[HYB_QK4_0 / 2];
};

/* x = d * hyb_kvalues_iq4nl[q]; nibbles as Q4_0 */
struct hyb_block_iq4_nl {
	uint16_t d;
	uint8_t qs[HYB_QK4_0 / 2];
};

/*
 * x = hyb_e8m0_half(e) * hyb_kvalues_mxfp4[q]: OCP MX FP4 (E2M1 values,
 * doubled) with a power-of-two block scale; nibbles as Q4_0
 */
struct hyb_block_mxfp4 {
	uint8_t e;
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

/* Activations of Q4_1/Q5_1: x = d * q, and s = d * sum(q) (half) */
struct hyb_block_q8_1 {
	uint16_t d;
	uint16_t s;
	int8_t qs[HYB_QK8_0];
};

/*
 * Super-block of 16 sub-blocks of 16: x = d * (scales[j] & 15) * q -
 * dmin * (scales[j] >> 4), q 2-bit: element 128h + 32p + l is bits 2p..2p+1
 * of qs[32h + l]
 */
struct hyb_block_q2_k {
	uint8_t scales[HYB_QK_K / 16];
	uint8_t qs[HYB_QK_K / 4];
	uint16_t d;
	uint16_t dmin;
};

/*
 * Super-block of 16 sub-blocks of 16: x = d * (sc[j] - 32) * (q - 4), q 3-bit:
 * low 2 bits as Q2_K's qs, the high bit of element 128h + 32p + l is bit
 * 4h + p of hmask[l]; sc 6-bit, packed in `scales` (hyb_q3k_scale())
 */
struct hyb_block_q3_k {
	uint8_t hmask[HYB_QK_K / 8];
	uint8_t qs[HYB_QK_K / 4];
	uint8_t scales[12];
	uint16_t d;
};

/*
 * Super-block of 8 sub-blocks of 32, scales and mins as Q4_K's, 5-bit q: the
 * low 4 bits as Q4_K's qs, the high bit of element 64c + 32h + l is bit
 * 2c + h of qh[l]
 */
struct hyb_block_q5_k {
	uint16_t d;
	uint16_t dmin;
	uint8_t scales[HYB_K_SCALE_SIZE];
	uint8_t qh[HYB_QK_K / 8];
	uint8_t qs[HYB_QK_K / 2];
};

/*
 * Super-block of 8 sub-blocks of 32: x = d * (ls[j] - 32) *
 * hyb_kvalues_iq4nl[q], q 4-bit as Q4_0's per sub-block (qs[16j ..]), ls
 * 6-bit: low 4 bits in scales_l, high 2 in scales_h
 */
struct hyb_block_iq4_xs {
	uint16_t d;
	uint16_t scales_h;
	uint8_t scales_l[HYB_QK_K / 64];
	uint8_t qs[HYB_QK_K / 2];
};

/* Activations of the K-quants: x = d * q, with the sums of each 16 quants */
struct hyb_block_q8_k {
	float d;
	int8_t qs[HYB_QK_K];
	int16_t bsums[HYB_QK_K / 16];
};

_Static_assert(sizeof(struct hyb_block_q4_0) == 18, "q4_0 block layout");
_Static_assert(sizeof(struct hyb_block_q4_1) == 20, "q4_1 block layout");
_Static_assert(sizeof(struct hyb_block_q5_0) == 22, "q5_0 block layout");
_Static_assert(sizeof(struct hyb_block_q5_1) == 24, "q5_1 block layout");
_Static_assert(sizeof(struct hyb_block_iq4_nl) == 18, "iq4_nl block layout");
_Static_assert(sizeof(struct hyb_block_mxfp4) == 17, "mxfp4 block layout");
_Static_assert(sizeof(struct hyb_block_q8_0) == 34, "q8_0 block layout");
_Static_assert(sizeof(struct hyb_block_q8_1) == 36, "q8_1 block layout");
_Static_assert(sizeof(struct hyb_block_q4_k) == 144, "q4_K block layout");
_Static_assert(sizeof(struct hyb_block_q6_k) == 210, "q6_K block layout");
_Static_assert(sizeof(struct hyb_block_q8_k) == 292, "q8_K block layout");
_Static_assert(sizeof(struct hyb_block_q2_k) == 84, "q2_K block layout");
_Static_assert(sizeof(struct hyb_block_q3_k) == 110, "q3_K block layout");
_Static_assert(sizeof(struct hyb_block_q5_k) == 176, "q5_K block layout");
_Static_assert(sizeof(struct hyb_block_iq4_xs) == 136, "iq4_xs block layout");

/* The non-linear 4-bit levels of IQ4_NL and IQ4_XS (ggml-common.h kvalues_iq4nl) */
static const int8_t hyb_kvalues_iq4nl[16] = {
	-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
};

/* MXFP4's levels: E2M1's values times 2 (ggml-common.h kvalues_mxfp4) */
static const int8_t hyb_kvalues_mxfp4[16] = {
	0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12,
};

/* 2^(e - 128): half of the E8M0 scale, as the levels are doubled (ggml-impl.h) */
static inline float hyb_e8m0_half(uint8_t e)
{
	/* e < 2: the denormals 2^-128 and 2^-127 */
	const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
	float f;

	__builtin_memcpy(&f, &bits, sizeof(f));
	return f;
}

/* The 5-bit quant of element j (0..31) of a Q5_0/Q5_1 block. */
static inline int hyb_q5_quant(const uint8_t qs[16], const uint8_t qh[4], int j)
{
	const int lo = j < 16 ? qs[j] & 0xF : qs[j - 16] >> 4;

	return lo | (((qh[j / 8] >> (j % 8)) & 1) << 4);
}

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
