// SPDX-License-Identifier: MIT
/* AMX level's Q2_K, Q3_K, Q5_K, IQ4_XS kernels: gemm_k_extra_avx512_body.h */
#define HYB_VNNI 1
#define HYB_AMX 1
#include "gemm_k_extra_avx512_body.h"
