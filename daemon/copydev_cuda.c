// SPDX-License-Identifier: MIT
/*
 * copydev_cuda.h in a build without CUDA: every call fails with -ENODEV and
 * says why, so hybd can ask for the CUDA device unconditionally and fall back
 * to the CPU one. The definitions are weak: when kernels/cuda/copydev_cuda.cu
 * is linked in (nvcc present), its definitions replace these.
 *
 * hyb_copydev_cuda_open is a weak alias of a static stub, so
 * hyb_copydev_cuda_built() can tell which one the link picked by comparing
 * addresses (a weak symbol may be replaced: the compiler cannot fold that
 * comparison). The descriptor file functions are plain C in every build.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

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

WEAK int hyb_copydev_cuda_export(struct hyb_copydev *d, struct hyb_cuda_cache_desc *out,
				 char *err, size_t errlen)
{
	(void)d, (void)out;
	return no_cuda(err, errlen);
}

WEAK int hyb_cuda_cache_open(const struct hyb_cuda_cache_desc *desc, void **base, char *err,
			     size_t errlen)
{
	(void)desc;
	if (base)
		*base = NULL;
	return no_cuda(err, errlen);
}

WEAK int hyb_cuda_cache_close(void *base)
{
	(void)base;
	return -ENODEV;
}

/* -- the descriptor file ------------------------------------------------- */

int hyb_cuda_cache_desc_write(const char *path, const struct hyb_cuda_cache_desc *desc, char *err,
			      size_t errlen)
{
	char tmp[4200];
	ssize_t n;
	int fd, e;

	snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid());
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		e = errno;
		snprintf(err, errlen, "%s: %s", tmp, strerror(e));
		return -e;
	}
	n = write(fd, desc, sizeof(*desc));
	e = n < 0 ? errno : n != (ssize_t)sizeof(*desc) ? ENOSPC : fsync(fd) ? errno : 0;
	if (close(fd) && !e)
		e = errno;
	if (!e && rename(tmp, path))
		e = errno;
	if (e) {
		snprintf(err, errlen, "%s: %s", path, strerror(e));
		unlink(tmp);
		return -e;
	}
	return 0;
}

int hyb_cuda_cache_desc_read(const char *path, struct hyb_cuda_cache_desc *desc, char *err,
			     size_t errlen)
{
	char extra;
	ssize_t n;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	memset(desc, 0, sizeof(*desc));
	if (fd < 0) {
		int e = errno;

		snprintf(err, errlen, "%s: %s", path, strerror(e));
		return -e;
	}
	n = read(fd, desc, sizeof(*desc));
	if (n == (ssize_t)sizeof(*desc) && read(fd, &extra, 1) != 0)
		n = -2;		/* longer than a descriptor */
	close(fd);
	if (n != (ssize_t)sizeof(*desc) || desc->magic != HYB_CUDA_CACHE_MAGIC) {
		snprintf(err, errlen, "%s: not a GPU cache descriptor (%zu bytes of magic "
			 "HYBUGPC1 expected)", path, sizeof(*desc));
		memset(desc, 0, sizeof(*desc));
		return -EINVAL;
	}
	if (desc->version != HYB_CUDA_CACHE_VERSION || !desc->n_slots || !desc->slot_bytes) {
		snprintf(err, errlen, "%s: GPU cache descriptor version %u with %u slots of %llu "
			 "bytes (want version %u, non-empty)", path, desc->version, desc->n_slots,
			 (unsigned long long)desc->slot_bytes, HYB_CUDA_CACHE_VERSION);
		memset(desc, 0, sizeof(*desc));
		return -EINVAL;
	}
	return 0;
}
