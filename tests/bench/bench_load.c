// SPDX-License-Identifier: MIT
/*
 * Cold-load throughput of the io_uring streaming engine (its
 * performance figure): one load of FILE into a local pool, timed, either with the
 * engine or with a plain read() loop into the same memory. tests/bench/
 * bench_load.sh drops the page cache before each run and puts the figures
 * next to fio's on the same file.
 *
 *   bench_load engine|read FILE [chunk_kib depth]   prints "<mode> <GB/s> <s>"
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "hyb/stream.h"
#include "hyb/pool.h"

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* The read() baseline: 1 MiB reads, the usual size of a copy loop. */
static int read_loop(const char *path, uint8_t *dst, uint64_t size)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return -1;
	for (uint64_t off = 0; off < size;) {
		size_t n = size - off < (1u << 20) ? size - off : (1u << 20);
		ssize_t r = read(fd, dst + off, n);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			close(fd);
			return -1;
		}
		off += (uint64_t)r;
	}
	close(fd);
	return 0;
}

int main(int argc, char **argv)
{
	struct hyb_stream_opts o = { .progress = HYB_STREAM_QUIET };
	struct hyb_stream_stats st = { 0 };
	struct hyb_backend *b;
	struct hyb_mempool *p;
	struct stat sb;
	char err[512], name[32];
	void *dst;
	size_t len;
	double t;
	int ret;

	if (argc < 3 || (strcmp(argv[1], "engine") && strcmp(argv[1], "read"))) {
		fprintf(stderr, "usage: bench_load engine|read FILE [chunk_kib depth]\n");
		return 2;
	}
	if (argc > 3)
		o.chunk = (uint32_t)atoi(argv[3]) * 1024;
	if (argc > 4)
		o.depth = (unsigned int)atoi(argv[4]);
	if (stat(argv[2], &sb)) {
		fprintf(stderr, "bench_load: %s: %s\n", argv[2], strerror(errno));
		return 1;
	}
	b = hyb_backend_open(HYB_BACKEND_LOCAL);
	snprintf(name, sizeof(name), "bench-load-%d", (int)getpid());
	if (!b || hyb_mempool_create(b, name, (uint64_t)sb.st_size, HYB_MEMPOOL_NODE_LOCAL, 0, 0,
				     &p) || hyb_mempool_map(p, &dst, &len)) {
		fprintf(stderr, "bench_load: pool: %s\n", hyb_last_error());
		return 1;
	}
	t = now();
	if (!strcmp(argv[1], "engine"))
		ret = hyb_stream_read(argv[2], 0, (uint64_t)sb.st_size, dst, &o, &st);
	else
		ret = read_loop(argv[2], dst, (uint64_t)sb.st_size);
	t = now() - t;
	if (ret) {
		fprintf(stderr, "bench_load: %s\n", !strcmp(argv[1], "engine") ? err :
			strerror(errno));
		return 1;
	}
	struct hyb_mempool_info info;

	hyb_mempool_info(p, &info);
	printf("%s %.3f %.3f pool_create=%.3f", argv[1], sb.st_size / t / 1e9, t,
	       info.create_ns / 1e9);
	if (!strcmp(argv[1], "engine"))
		printf(" direct=%u fixed=%u in_flight=%u", st.direct, st.fixed_bufs,
		       st.max_in_flight);
	printf("\n");
	hyb_mempool_close(p);
	hyb_backend_close(b);
	return 0;
}
