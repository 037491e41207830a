// SPDX-License-Identifier: MIT
/* The GPU cache descriptor file hybd publishes for apps (hyb/gpucache.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "hyb/gpucache.h"
#include "hyb/manifest.h"
#include "util/error.h"
#include "util/file.h"

void hyb_gpucache_path(const char *name, char *buf, size_t len)
{
	char dir[4096];

	hyb_state_dir(dir, sizeof(dir));
	snprintf(buf, len, "%s/%s.gpucache", dir, name);
}

int hyb_gpucache_desc_write(const char *path, const struct hyb_gpucache_desc *desc)
{
	char tmp[4200];
	ssize_t n;
	int fd, e;

	snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid());
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		e = errno;
		return hyb_error_set(-e, "%s: %s", tmp, strerror(e));
	}
	n = write(fd, desc, sizeof(*desc));
	e = n < 0 ? errno : n != (ssize_t)sizeof(*desc) ? ENOSPC : fsync(fd) ? errno : 0;
	if (close(fd) && !e)
		e = errno;
	return hyb_file_commit(tmp, path, e);
}

int hyb_gpucache_desc_read(const char *path, struct hyb_gpucache_desc *desc)
{
	char extra;
	ssize_t n;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	memset(desc, 0, sizeof(*desc));
	if (fd < 0) {
		int e = errno;

		return hyb_error_set(-e, "%s: %s", path, strerror(e));
	}
	n = read(fd, desc, sizeof(*desc));
	if (n == (ssize_t)sizeof(*desc) && read(fd, &extra, 1) != 0)
		n = -2;		/* longer than a descriptor */
	close(fd);
	if (n != (ssize_t)sizeof(*desc) || desc->magic != HYB_GPUCACHE_MAGIC) {
		hyb_error_set(-EINVAL, "%s: not a GPU cache descriptor (%zu bytes of magic "
			 "HYBUGPC1 expected)", path, sizeof(*desc));
		memset(desc, 0, sizeof(*desc));
		return -EINVAL;
	}
	if (desc->version != HYB_GPUCACHE_VERSION || !desc->n_slots || !desc->slot_bytes) {
		hyb_error_set(-EINVAL, "%s: GPU cache descriptor version %u with %u slots of %llu "
			 "bytes (want version %u, non-empty)", path, desc->version, desc->n_slots,
			 (unsigned long long)desc->slot_bytes, HYB_GPUCACHE_VERSION);
		memset(desc, 0, sizeof(*desc));
		return -EINVAL;
	}
	if (desc->kind > HYB_GPUCACHE_HOST ||
	    (desc->kind == HYB_GPUCACHE_HOST &&
	     (!desc->pool[0] || !memchr(desc->pool, 0, sizeof(desc->pool))))) {
		hyb_error_set(-EINVAL, "%s: GPU cache descriptor of kind %u%s", path, desc->kind,
			 desc->kind > HYB_GPUCACHE_HOST ? " (unknown)" : " without a pool name");
		memset(desc, 0, sizeof(*desc));
		return -EINVAL;
	}
	return 0;
}

/*
 * Without CUDA in the program: box/gpucache_cuda.cu's strong definitions
 * replace these when nvcc built it.
 */
#define WEAK __attribute__((weak))

WEAK int hyb_cuda_cache_open(const struct hyb_gpucache_desc *desc, int ordinal, void **base)
{
	(void)desc, (void)ordinal;
	if (base)
		*base = NULL;
	return hyb_error_set(-ENODEV, "built without CUDA (nvcc was not found when this "
			     "program was built)");
}

WEAK int hyb_cuda_cache_close(void *base)
{
	(void)base;
	return -ENODEV;
}
