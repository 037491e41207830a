/* SPDX-License-Identifier: MIT */
/*
 * Element and scale accessors of Q2_K, Q3_K, Q5_K and IQ4_XS (block layouts
 * in blocks.h), shared by their scalar kernels, dequantizers, quantizers
 * and tests. Simple on purpose: the SIMD kernels unpack whole vectors.
 */
#ifndef HYB_KQUANT_EXTRA_H
#define HYB_KQUANT_EXTRA_H

#include "blocks.h"

/* the 2-bit code of element e (0..255) of Q2_K / the low bits of Q3_K */
static inline int hyb_q2k_code(const uint8_t *qs, int e)
{
	return (qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
}

/* the 3-bit code of element e of Q3_K, 0..7 (the value is code - 4) */
static inline int hyb_q3k_code(const struct hyb_block_q3_k *b, int e)
{
	const int hbit = (b->hmask[e % 32] >> (4 * (e / 128) + (e % 128) / 32)) & 1;

	return hyb_q2k_code(b->qs, e) | hbit << 2;
}

/* 6-bit scale j (0..15) of Q3_K less 32: -32..31 (ggml's kmask unpacking) */
static inline int hyb_q3k_scale(const uint8_t *s, int j)
{
	const int lo = j < 8 ? s[j] & 0xF : s[j - 8] >> 4;

	return (lo | ((s[8 + j % 4] >> (2 * (j / 4))) & 3) << 4) - 32;
}

/* the 5-bit code of element e of Q5_K, 0..31 */
static inline int hyb_q5k_code(const struct hyb_block_q5_k *b, int e)
{
	const int c = e / 64, h = (e % 64) / 32, l = e % 32;

	return ((b->qs[32 * c + l] >> (4 * h)) & 0xF) | ((b->qh[l] >> (2 * c + h)) & 1) << 4;
}

/* the 4-bit index of element e of IQ4_XS, 0..15 */
static inline int hyb_iq4xs_index(const struct hyb_block_iq4_xs *b, int e)
{
	const int j = e % 32;

	return (b->qs[16 * (e / 32) + j % 16] >> (4 * (j / 16))) & 0xF;
}

/* sub-block scale of IQ4_XS less 32: -32..31 */
static inline int hyb_iq4xs_scale(const struct hyb_block_iq4_xs *b, int ib)
{
	return (((b->scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) |
		((b->scales_h >> (2 * ib)) & 3) << 4) - 32;
}

#endif
