// SPDX-License-Identifier: MIT
/*
 * AVX-512 VNNI sparse FFN kernels: the body of the AVX-512 level with
 * vpdpbusd for the int8 dots (one instruction instead of three per block
 * and row). Float kernels and axpys are the same code as the level below.
 */
#define HYB_SPARSE_VNNI 1
#include "sparse_ffn_avx512_body.h"

void hyb_sparse_fill_avx512vnni(struct hyb_sparse_kernels *k)
{
	fill_sparse_avx512(k);
}
