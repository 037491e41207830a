/* SPDX-License-Identifier: MIT */
/*
 * amxemu: Intel AMX tiles emulated in C, so that the AMX kernel level runs
 * (and is checked bit for bit against the VNNI level) on CPUs without AMX.
 * docs/AMXEMU.md says what it models and what it cannot see.
 *
 * Force-included (-include) before a kernel file that uses the tile
 * intrinsics of <immintrin.h>: it includes <immintrin.h> first, then puts
 * the emulation behind the same names and arguments. Only the intrinsics the
 * kernels use are here; an unknown one stays GCC's and fails to assemble
 * without -mamx-tile, so nothing runs unemulated.
 */
#ifndef HYB_AMXEMU_H
#define HYB_AMXEMU_H

#include <immintrin.h>

void hyb_amxemu_loadconfig(const void *config);
void hyb_amxemu_storeconfig(void *config);
void hyb_amxemu_release(void);
void hyb_amxemu_loadd(int tile, const void *base, long stride);
void hyb_amxemu_stored(int tile, void *base, long stride);
void hyb_amxemu_zero(int tile);
/* a_signed, b_signed: how the bytes of src1 (A) and src2 (B) are read */
void hyb_amxemu_dp(int dst, int src1, int src2, int a_signed, int b_signed);
/* how many dot-product instructions ran so far, in every thread */
unsigned long hyb_amxemu_dp_count(void);

#undef _tile_loadd
#undef _tile_stream_loadd
#undef _tile_stored
#undef _tile_zero
#undef _tile_dpbssd
#undef _tile_dpbsud
#undef _tile_dpbusd
#undef _tile_dpbuud
/* GCC's are functions, not macros: a macro of the same name shadows them */
#define _tile_loadconfig(config) hyb_amxemu_loadconfig(config)
#define _tile_storeconfig(config) hyb_amxemu_storeconfig(config)
#define _tile_release() hyb_amxemu_release()
#define _tile_loadd(dst, base, stride) hyb_amxemu_loadd(dst, base, (long)(stride))
#define _tile_stream_loadd(dst, base, stride) hyb_amxemu_loadd(dst, base, (long)(stride))
#define _tile_stored(src, base, stride) hyb_amxemu_stored(src, base, (long)(stride))
#define _tile_zero(dst) hyb_amxemu_zero(dst)
#define _tile_dpbssd(dst, src1, src2) hyb_amxemu_dp(dst, src1, src2, 1, 1)
#define _tile_dpbsud(dst, src1, src2) hyb_amxemu_dp(dst, src1, src2, 1, 0)
#define _tile_dpbusd(dst, src1, src2) hyb_amxemu_dp(dst, src1, src2, 0, 1)
#define _tile_dpbuud(dst, src1, src2) hyb_amxemu_dp(dst, src1, src2, 0, 0)

#endif
