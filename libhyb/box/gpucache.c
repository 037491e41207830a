// SPDX-License-Identifier: MIT
/* The GPU cache descriptor file hybd publishes for apps (hyb/gpucache.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "hyb/gpucache.h"
#include "hyb/manifest.h"

void hyb_gpucache_path(const char *name, char *buf, size_t len)
{
	char dir[4096];

	hyb_state_dir(dir, sizeof(dir));
	snprintf(buf, len, "%s/%s.gpucache", dir, name);
}

int hyb_gpucache_desc_write(const char *path, const struct hyb_gpucache_desc *desc, char *err,
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

int hyb_gpucache_desc_read(const char *path, struct hyb_gpucache_desc *desc, char *err,
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
	if (n != (ssize_t)sizeof(*desc) || desc->magic != HYB_GPUCACHE_MAGIC) {
		snprintf(err, errlen, "%s: not a GPU cache descriptor (%zu bytes of magic "
			 "HYBUGPC1 expected)", path, sizeof(*desc));
		memset(desc, 0, sizeof(*desc));
		return -EINVAL;
	}
	if (desc->version != HYB_GPUCACHE_VERSION || !desc->n_slots || !desc->slot_bytes) {
		snprintf(err, errlen, "%s: GPU cache descriptor version %u with %u slots of %llu "
			 "bytes (want version %u, non-empty)", path, desc->version, desc->n_slots,
			 (unsigned long long)desc->slot_bytes, HYB_GPUCACHE_VERSION);
		memset(desc, 0, sizeof(*desc));
		return -EINVAL;
	}
	if (desc->kind > HYB_GPUCACHE_HOST ||
	    (desc->kind == HYB_GPUCACHE_HOST &&
	     (!desc->pool[0] || !memchr(desc->pool, 0, sizeof(desc->pool))))) {
		snprintf(err, errlen, "%s: GPU cache descriptor of kind %u%s", path, desc->kind,
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

WEAK int hyb_cuda_cache_open(const struct hyb_gpucache_desc *desc, int ordinal, void **base,
			     char *err, size_t errlen)
{
	(void)desc, (void)ordinal;
	if (base)
		*base = NULL;
	if (err && errlen)
		snprintf(err, errlen, "built without CUDA (nvcc was not found when this program "
			 "was built)");
	return -ENODEV;
}

WEAK int hyb_cuda_cache_close(void *base)
{
	(void)base;
	return -ENODEV;
}
