// SPDX-License-Identifier: MIT
/* The MXFP4 kernels on AVX2 (gemm_mxfp4_simd.h); AVX-512 without VNNI inherits them. */
#define MXFP4_VNNI 0
#define SFX(f) f##_avx2
#include "gemm_mxfp4_simd.h"
