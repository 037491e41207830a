/* SPDX-License-Identifier: MIT */
/* Kernels that test cudaemu itself (selftest_kernels.cu), callable from C. */
#ifndef HYB_CUDAEMU_SELFTEST_H
#define HYB_CUDAEMU_SELFTEST_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* out = in with each block's n values reversed through shared memory */
int emu_reverse(const int *in, int *out, int n, int blocks, int barrier);
/* per thread of one 64-thread block: 6 warp-op results (selftest_kernels.cu) */
int emu_warp_ops(int *out);
/* lanes 16-31 leave while lanes 0-15 shuffle with a full mask */
int emu_divergent_shuffle(int *out);
/* lane 0 waits at __syncthreads, lanes 1-31 in __syncwarp for it */
int emu_deadlock(void);
/* a 32-thread block reverses through smem bytes of dynamic shared memory */
int emu_dyn_smem(int *out, size_t smem, int set_attr);
/* thread 1 of a kernel writes 4 KiB past the end of p's n ints */
int emu_write_past_end(int *p, int n);
/* a launch of the given shape (a kernel that does nothing) */
int emu_launch_shape(unsigned gx, unsigned gy, unsigned bx, unsigned by, unsigned bz);
/* y = a * x + b over n ints, on stream s, 64 threads a block (n = 0: an empty grid) */
int emu_axpb(const int *x, int *y, int n, int a, int b, struct CUstream_st *s);

#ifdef __cplusplus
}
#endif

#endif
