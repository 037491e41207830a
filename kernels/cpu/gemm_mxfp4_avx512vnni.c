// SPDX-License-Identifier: MIT
/* The MXFP4 kernels with VNNI's vpdpbusd on 256-bit vectors (gemm_mxfp4_simd.h); AMX inherits them. */
#define MXFP4_VNNI 1
#define SFX(f) f##_avx512vnni
#include "gemm_mxfp4_simd.h"
