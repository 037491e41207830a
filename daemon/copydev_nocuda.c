// SPDX-License-Identifier: MIT
/*
 * copydev_cuda.h in a build without CUDA: every call fails with -ENODEV and
 * says why, so hybd can ask for the CUDA device unconditionally and fall back
 * to the CPU one. The definitions are weak: when daemon/copydev_cuda.cu
 * is linked in (nvcc present), its definitions replace these.
 *
 * hyb_copydev_cuda_open is a weak alias of a static stub, so
 * hyb_copydev_cuda_built() can tell which one the link picked by comparing
 * addresses (a weak symbol may be replaced: the compiler cannot fold that
 * comparison). The descriptor file is libhyb/box/gpucache.c's.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "copydev_cuda.h"

#define WEAK __attribute__((weak))

static int no_cuda(char *err, size_t errlen)
{
	if (err && errlen)
		snprintf(err, errlen, "built without CUDA (nvcc was not found when this program "
			 "was built)");
	return -ENODEV;
}

static struct hyb_copydev *stub_open(const struct hyb_copydev_cuda_config *cfg, char *err,
				     size_t errlen)
{
	(void)cfg;
	no_cuda(err, errlen);
	return NULL;
}

struct hyb_copydev *hyb_copydev_cuda_open(const struct hyb_copydev_cuda_config *cfg, char *err,
					  size_t errlen) __attribute__((weak, alias("stub_open")));

bool hyb_copydev_cuda_built(void)
{
	/* volatile: read the (possibly replaced) symbol's address at run time */
	struct hyb_copydev *(*volatile open_fn)(const struct hyb_copydev_cuda_config *, char *,
						size_t) = hyb_copydev_cuda_open;

	return open_fn != stub_open;
}

WEAK int hyb_copydev_cuda_register(struct hyb_copydev *d, void *addr, size_t len,
				   bool read_only, char *err, size_t errlen)
{
	(void)d, (void)addr, (void)len, (void)read_only;
	return no_cuda(err, errlen);
}

WEAK int hyb_copydev_cuda_unregister(struct hyb_copydev *d, void *addr)
{
	(void)d, (void)addr;
	return -ENODEV;
}

WEAK void *hyb_copydev_cuda_slot(struct hyb_copydev *d, uint32_t slot)
{
	(void)d, (void)slot;
	return NULL;
}

WEAK uint64_t hyb_copydev_cuda_valid(struct hyb_copydev *d, uint32_t slot)
{
	(void)d, (void)slot;
	return 0;
}

WEAK int hyb_copydev_cuda_export(struct hyb_copydev *d, struct hyb_gpucache_desc *out,
				 char *err, size_t errlen)
{
	(void)d, (void)out;
	return no_cuda(err, errlen);
}
