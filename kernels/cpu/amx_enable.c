// SPDX-License-Identifier: MIT
/*
 * Whether this process may use AMX tiles. Three conditions: cpuid reports
 * AMX-TILE and AMX-INT8, the OS saves the tile state (XCR0 bits 17 and 18),
 * and Linux grants that state to the process. Linux 5.16+ enables the 8 KiB
 * of tile data per process on request (Documentation/arch/x86/xstate.rst):
 * without the request the first tile instruction raises SIGILL. The grant
 * covers every thread, so asking once, before the kernel tables are built,
 * is enough for the thread pool's workers.
 *
 * Its own file so that tests/amxemu can stand in for it on CPUs without AMX.
 */
#include <cpuid.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cpu_internal.h"

#define ARCH_GET_XCOMP_PERM 0x1022
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILECFG 17
#define XFEATURE_XTILEDATA 18

int hyb_cpu_amx_usable(void)
{
	unsigned a, b, c, d;
	uint32_t lo, hi;
	uint64_t perm = 0;

	if (__get_cpuid_max(0, NULL) < 7 || !__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1))
		return 0; /* no cpuid leaf 7 or no OSXSAVE (xgetbv would fault) */
	__get_cpuid_count(7, 0, &a, &b, &c, &d);
	if (!((d >> 24) & 1) || !((d >> 25) & 1)) /* AMX-TILE, AMX-INT8 */
		return 0;
	__asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
	const uint64_t tiles = 1ull << XFEATURE_XTILECFG | 1ull << XFEATURE_XTILEDATA;

	const uint64_t xcr0 = (uint64_t)hi << 32 | lo;

	if ((xcr0 & tiles) != tiles)
		return 0;
	/* kernels before 5.16 refuse the request: they do not save the tiles */
	if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA))
		return 0;
	if (syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &perm))
		return 0;
	return (perm & tiles) == tiles;
}
