/* SPDX-License-Identifier: MIT */
/* cudaemu stands in for the CUDA toolkit's header (docs/CUDAEMU.md). */
#include "../cudaemu.h"
