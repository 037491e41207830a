// SPDX-License-Identifier: MIT
/*
 * hyb32: a 32-bit process against /dev/hybpool (the VM bench's compat
 * check). hybpool.ko refuses 32-bit callers with EOPNOTSUPP: mmap2()'s
 * 32-bit page offset cannot reach pools past id 15 (offsets are id << 40).
 * Freestanding i386 code (int $0x80), so no 32-bit libc is needed to build
 * it. Run with fd 3 open on the device (opened by a 64-bit shell); exits 0
 * when open(), ioctl() on the inherited file and mmap2() all fail with
 * EOPNOTSUPP, else 1, 2 or 3 for the first that did not.
 */
#define EOPNOTSUPP	95
#define NR_EXIT		1
#define NR_OPEN		5
#define NR_IOCTL	54
#define NR_MMAP2	192
/* HYB_IOC_DEV_INFO (any command would do: the compat handler refuses all) */
#define HYB_IOC_DEV_INFO_NR	((long)0xc038d600UL)

static long sys5(long n, long a, long b, long c, long d, long e)
{
	long r;

	/* ebp is mmap2's sixth argument, the page offset: 0 (asm cannot name ebp) */
	__asm__ volatile("push %%ebp\n\txor %%ebp, %%ebp\n\tint $0x80\n\tpop %%ebp"
			 : "=a"(r)
			 : "a"(n), "b"(a), "c"(b), "d"(c), "S"(d), "D"(e)
			 : "memory");
	return r;
}

void _start(void);
void _start(void)
{
	int code = 0;

	if (sys5(NR_OPEN, (long)"/dev/hybpool", 2, 0, 0, 0) != -EOPNOTSUPP)
		code = 1;
	else if (sys5(NR_IOCTL, 3, HYB_IOC_DEV_INFO_NR, 0, 0, 0) != -EOPNOTSUPP)
		code = 2;
	else if (sys5(NR_MMAP2, 0, 2L << 20, 1, 1, 3) != -EOPNOTSUPP)
		code = 3;
	sys5(NR_EXIT, code, 0, 0, 0, 0);
	for (;;)
		;
}
