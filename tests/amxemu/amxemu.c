// SPDX-License-Identifier: MIT
/*
 * amxemu's tiles (amxemu.h, docs/AMXEMU.md): palette 1 of the Intel SDM
 * (8 tiles of at most 16 rows of 64 bytes), per thread as the hardware
 * keeps them, with the instructions' checks. A check the hardware makes
 * with #GP or #UD (the process dies of SIGSEGV or SIGILL) ends the process
 * here too, with a line saying which instruction and why.
 *
 * Linked ahead of libhyb.a, its hyb_cpu_amx_usable() stands in for
 * kernels/cpu/amx_enable.c's: the AMX level is offered wherever AVX-512
 * VNNI is.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/amxemu/amxemu.h"

#define NTILES 8
#define MAX_ROWS 16
#define MAX_COLSB 64

struct tilecfg {
	uint8_t palette, start_row, reserved[14];
	uint16_t colsb[16];
	uint8_t rows[16];
};

/* dot-product instructions run, all threads (hyb_amxemu_dp_count) */
static unsigned long n_dp;

static __thread struct {
	int configured;
	struct tilecfg cfg;
	uint8_t t[NTILES][MAX_ROWS][MAX_COLSB];
} st;

_Static_assert(sizeof(struct tilecfg) == 64, "LDTILECFG reads 64 bytes");

static void fault(const char *insn, const char *exc, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "amxemu: %s raises %s: ", insn, exc);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	abort();
}

static void need_tile(const char *insn, int tile)
{
	if (!st.configured)
		fault(insn, "#UD", "the tiles are not configured (no LDTILECFG since the last "
		      "TILERELEASE)");
	if ((unsigned)tile >= NTILES)
		fault(insn, "#UD", "tmm%d: palette 1 has %d tiles", tile, NTILES);
}

void hyb_amxemu_loadconfig(const void *config)
{
	struct tilecfg c;

	memcpy(&c, config, sizeof(c));
	if (c.palette == 0) { /* the init state */
		memset(&st, 0, sizeof(st));
		return;
	}
	if (c.palette != 1)
		fault("LDTILECFG", "#GP", "palette %u (this CPU has palettes 0 and 1)", c.palette);
	for (int i = 0; i < 14; i++)
		if (c.reserved[i])
			fault("LDTILECFG", "#GP", "reserved byte %d is %u", 2 + i, c.reserved[i]);
	for (int i = 0; i < 16; i++) {
		if (i >= NTILES && (c.rows[i] || c.colsb[i]))
			fault("LDTILECFG", "#GP", "tile %d (reserved) has rows %u, colsb %u", i,
			      c.rows[i], c.colsb[i]);
		if (c.rows[i] > MAX_ROWS || c.colsb[i] > MAX_COLSB)
			fault("LDTILECFG", "#GP", "tile %d: %u rows of %u bytes (at most %d of %d)",
			      i, c.rows[i], c.colsb[i], MAX_ROWS, MAX_COLSB);
		if (!c.rows[i] != !c.colsb[i])
			fault("LDTILECFG", "#GP", "tile %d: %u rows of %u bytes (both or neither)", i,
			      c.rows[i], c.colsb[i]);
	}
	memset(&st, 0, sizeof(st));
	st.configured = 1;
	st.cfg = c;
}

void hyb_amxemu_storeconfig(void *config)
{
	if (st.configured)
		memcpy(config, &st.cfg, sizeof(st.cfg));
	else
		memset(config, 0, sizeof(st.cfg));
}

void hyb_amxemu_release(void)
{
	memset(&st, 0, sizeof(st));
}

void hyb_amxemu_loadd(int tile, const void *base, long stride)
{
	need_tile("TILELOADD", tile);
	const int rows = st.cfg.rows[tile], colsb = st.cfg.colsb[tile];

	memset(st.t[tile], 0, sizeof(st.t[tile]));
	for (int r = 0; r < rows; r++)
		memcpy(st.t[tile][r], (const uint8_t *)base + (long)r * stride, (size_t)colsb);
}

void hyb_amxemu_stored(int tile, void *base, long stride)
{
	need_tile("TILESTORED", tile);
	const int rows = st.cfg.rows[tile], colsb = st.cfg.colsb[tile];

	for (int r = 0; r < rows; r++)
		memcpy((uint8_t *)base + (long)r * stride, st.t[tile][r], (size_t)colsb);
}

void hyb_amxemu_zero(int tile)
{
	need_tile("TILEZERO", tile);
	memset(st.t[tile], 0, sizeof(st.t[tile]));
}

/*
 * TDPB[SU][SU]D dst, src1, src2: for each row m of dst and dword n of it,
 * add over k < src1.colsb / 4 the four byte products of src1 row m, dword k
 * and src2 row k, dword n (src1 is M x K bytes, src2 is K/4 rows of N
 * dwords: 4 consecutive k per dword). Wrapping 32-bit adds, no saturation.
 */
void hyb_amxemu_dp(int dst, int src1, int src2, int a_signed, int b_signed)
{
	static const char *const names[2][2] = { { "TDPBUUD", "TDPBUSD" },
						  { "TDPBSUD", "TDPBSSD" } };
	const char *insn = names[a_signed][b_signed];

	need_tile(insn, dst);
	need_tile(insn, src1);
	need_tile(insn, src2);
	if (dst == src1 || dst == src2 || src1 == src2)
		fault(insn, "#UD", "tmm%d, tmm%d, tmm%d: the three tiles must differ", dst, src1,
		      src2);
	const struct tilecfg *c = &st.cfg;
	const int M = c->rows[dst], N = c->colsb[dst] / 4, K4 = c->colsb[src1] / 4;

	if (c->colsb[dst] % 4 || c->colsb[src1] % 4 || c->colsb[src2] % 4)
		fault(insn, "#UD", "a tile's bytes per row is not a multiple of 4");
	if (c->rows[src1] != M)
		fault(insn, "#UD", "tmm%d has %u rows, tmm%d (A) %u", dst, M, src1, c->rows[src1]);
	if (c->rows[src2] != K4)
		fault(insn, "#UD", "tmm%d (A) has %d dwords a row, tmm%d (B) %u rows", src1, K4, src2,
		      c->rows[src2]);
	if (c->colsb[src2] != c->colsb[dst])
		fault(insn, "#UD", "tmm%d has %u bytes a row, tmm%d (B) %u", dst, c->colsb[dst], src2,
		      c->colsb[src2]);
	__atomic_fetch_add(&n_dp, 1, __ATOMIC_RELAXED);
	for (int m = 0; m < M; m++)
		for (int n = 0; n < N; n++) {
			uint32_t acc;

			memcpy(&acc, &st.t[dst][m][4 * n], 4);
			for (int k = 0; k < K4; k++)
				for (int i = 0; i < 4; i++) {
					const uint8_t a = st.t[src1][m][4 * k + i];
					const uint8_t b = st.t[src2][k][4 * n + i];
					const int32_t av = a_signed ? (int8_t)a : (int32_t)a;
					const int32_t bv = b_signed ? (int8_t)b : (int32_t)b;

					acc += (uint32_t)(av * bv);
				}
			memcpy(&st.t[dst][m][4 * n], &acc, 4);
		}
}

unsigned long hyb_amxemu_dp_count(void)
{
	return __atomic_load_n(&n_dp, __ATOMIC_RELAXED);
}

/* the AMX level wherever AVX-512 VNNI is (kernels/cpu/dispatch.c asks after VNNI) */
int hyb_cpu_amx_usable(void)
{
	return 1;
}
