// SPDX-License-Identifier: MIT
/* AVX-512 (F/BW/VL/DQ) sparse FFN kernels: int8 dots by vpmaddubsw + vpmaddwd. */
#define HYB_SPARSE_VNNI 0
#include "sparse_ffn_avx512_body.h"

void hyb_sparse_fill_avx512(struct hyb_sparse_kernels *k)
{
	fill_sparse_avx512(k);
}
