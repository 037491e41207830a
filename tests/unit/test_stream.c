// SPDX-License-Identifier: MIT
/*
 * The io_uring streaming engine: every byte it delivers is
 * compared with a pread() of the same range, over ranges chosen to hit the
 * unaligned head and tail, mismatched destination alignment, tiny files and
 * the empty range; and each failure (pool too small, range past EOF, EIO)
 * must name the file and offset.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hyb/stream.h"
#include "hyb/testing.h"
#include "hyb/pool.h"
#include "test.h"

#define CANARY 0xA5

static unsigned int last_direct;	/* the last check_range() went O_DIRECT */
static const struct hyb_stream_opts quiet = { .progress = HYB_STREAM_QUIET };

/* A file of size pseudo-random bytes in dir; returns its path (static per slot). */
static const char *make_file(const char *dir, const char *name, uint64_t size)
{
	static char paths[4][512];
	static int n;
	char *path = paths[n++ % 4];
	uint8_t *buf = malloc(size ? size : 1);
	uint32_t x = (uint32_t)size * 2654435761u + 1;
	int fd;

	CHECK(buf);
	for (uint64_t i = 0; i < size; i++) {
		x ^= x << 13, x ^= x >> 17, x ^= x << 5;
		buf[i] = (uint8_t)x;
	}
	snprintf(path, 512, "%s/%s", dir, name);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	CHECK_MSG(fd >= 0, "create %s: %s", path, strerror(errno));
	CHECK(write(fd, buf, size) == (ssize_t)size);
	/* out of the page cache, so the engine takes its O_DIRECT path (cold load) */
	CHECK(!fsync(fd));
	CHECK(!posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED));
	close(fd);
	free(buf);
	return path;
}

/* Stream [off, off + len) to a destination at `skew` bytes past a page and compare. */
static void check_range(const char *path, uint64_t off, uint64_t len, unsigned int skew,
			const struct hyb_stream_opts *o)
{
	size_t cap = len + skew + 2 * 4096;
	uint8_t *mem = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	uint8_t *ref = malloc(len ? len : 1), *dst = mem + 4096 + skew;
	struct hyb_stream_stats st;
	int fd = open(path, O_RDONLY);

	CHECK(mem != MAP_FAILED && ref && fd >= 0);
	CHECK(pread(fd, ref, len, (off_t)off) == (ssize_t)len);
	posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);	/* cold again: O_DIRECT */
	close(fd);
	memset(mem, CANARY, cap);
	CHECK_MSG(!hyb_stream_read(path, off, len, dst, o, &st),
		  "off %llu len %llu skew %u: %s", (unsigned long long)off,
		  (unsigned long long)len, skew, hyb_last_error());
	CHECK_EQ_INT(st.bytes, len);
	last_direct = st.direct;
	CHECK_MSG(!memcmp(dst, ref, len), "off %llu len %llu skew %u: bytes differ",
		  (unsigned long long)off, (unsigned long long)len, skew);
	/* nothing written outside [dst, dst + len) */
	for (uint8_t *p = mem; p < dst; p++)
		CHECK_MSG(*p == CANARY, "byte before the destination overwritten");
	for (uint8_t *p = dst + len; p < mem + cap; p++)
		CHECK_MSG(*p == CANARY, "byte after the destination overwritten");
	munmap(mem, cap);
	free(ref);
}

TEST(stream_odd_ranges_match_pread)
{
	uint64_t size = 3 * 1048576 + 12345;
	const char *path = make_file(hyb_test_tmpdir(), "odd.bin", size);
	struct hyb_stream_opts small = { .progress = HYB_STREAM_QUIET, .chunk = 65536, .depth = 8 };
	const uint64_t r[][2] = {
		{ 0, 0 }, { 0, 3 * 1048576 + 12345 }, { 1, 3 * 1048576 + 12344 }, { 4095, 8194 },
		{ 100, 10 }, { 4096, 4096 }, { 3 * 1048576 + 12344, 1 }, { 5000, 2 * 1048576 + 7 },
		{ 3 * 1048576, 12345 }, { 12288, 1048576 },
	};

	for (size_t i = 0; i < sizeof(r) / sizeof(r[0]); i++) {
		/* skew matching the file offset: direct body; 3 or 1000: everything bounced */
		unsigned int skews[] = { (unsigned int)(r[i][0] % 4096), 3, 1000 };

		for (int k = 0; k < 3; k++) {
			check_range(path, r[i][0], r[i][1], skews[k], &quiet);
			CHECK_MSG(last_direct || !r[i][1], "O_DIRECT not used on the test directory");
			check_range(path, r[i][0], r[i][1], skews[k], &small);
		}
	}
}

TEST(stream_tiny_files)
{
	const uint64_t sizes[] = { 1, 100, 4095, 4096, 4097, 8191, 65537 };

	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		const char *path = make_file(hyb_test_tmpdir(), "tiny.bin", sizes[i]);

		check_range(path, 0, sizes[i], 0, &quiet);
		check_range(path, 0, sizes[i], 7, &quiet);
		if (sizes[i] > 1)
			check_range(path, 1, sizes[i] - 1, 1, &quiet);
	}
}

TEST(stream_deep_queue_direct_fixed)
{
	const char *path = make_file(hyb_test_tmpdir(), "deep.bin", 8 << 20);
	struct hyb_stream_opts o = { .progress = HYB_STREAM_QUIET, .chunk = 65536, .depth = 32 };
	void *dst = mmap(NULL, 8 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct hyb_stream_stats st;

	CHECK(dst != MAP_FAILED);
	CHECK_MSG(!hyb_stream_read(path, 0, 8 << 20, dst, &o, &st), "%s", hyb_last_error());
	CHECK_EQ_INT(st.max_in_flight, 32);	/* 128 pieces: the ring fills up */
	CHECK_EQ_INT(st.bounced, 0);		/* aligned range: no bounce */
	if (!st.direct)
		SKIP("the test directory's filesystem refuses O_DIRECT");
	/* others may hit RLIMIT_MEMLOCK: plain reads then; pread threads have no fixed buffers */
	if (geteuid() == 0 && st.uring)
		CHECK_MSG(st.fixed_bufs, "anonymous memory was not registered as fixed buffers");
	check_range(path, 0, 8 << 20, 0, &o);
	munmap(dst, 8 << 20);
}

TEST(stream_warm_file_reads_buffered)
{
	const char *path = make_file(hyb_test_tmpdir(), "warm.bin", 1 << 20);
	uint8_t *dst = malloc(1 << 20), *ref = malloc(1 << 20);
	struct hyb_stream_stats st;
	int fd = open(path, O_RDONLY);

	CHECK(dst && ref && fd >= 0);
	CHECK(pread(fd, ref, 1 << 20, 0) == 1 << 20);	/* now every page is cached */
	close(fd);
	CHECK_MSG(!hyb_stream_read(path, 0, 1 << 20, dst, &quiet, &st), "%s",
		  hyb_last_error());
	CHECK_EQ_INT(st.direct, 0);
	CHECK(!memcmp(dst, ref, 1 << 20));
	free(dst);
	free(ref);
}

TEST(stream_pool_load_and_too_small)
{
	const char *path = make_file(hyb_test_tmpdir(), "pool.bin", 3 << 20);
	struct hyb_backend *b = hyb_backend_open(HYB_BACKEND_LOCAL);
	struct hyb_mempool *p;
	char name[32];
	uint8_t *base, ref[4096];
	size_t plen;
	int fd = open(path, O_RDONLY);

	CHECK(b && fd >= 0);
	snprintf(name, sizeof(name), "t-stream-%d", (int)getpid());
	CHECK_EQ_INT(hyb_mempool_create(b, name, 2 << 20, HYB_MEMPOOL_NODE_LOCAL, 0, 0, &p), 0);
	CHECK_EQ_INT(hyb_mempool_map(p, (void **)&base, &plen), 0);
	/* the whole file does not fit: refused before any I/O, nothing written */
	CHECK(hyb_stream_to_pool(p, 0, path, 0, 3 << 20, &quiet, NULL) < 0);
	CHECK_MSG(strstr(hyb_last_error(), "holds") && strstr(hyb_last_error(), name) && strstr(hyb_last_error(), "pool.bin"), "%s", hyb_last_error());
	CHECK_EQ_INT(base[0], 0);
	CHECK(hyb_stream_to_pool(p, (2 << 20) - 10, path, 0, 11, &quiet, NULL) < 0);
	CHECK_MSG(strstr(hyb_last_error(), "offset 2097142"), "%s", hyb_last_error());
	/* a range that fits lands at the pool offset */
	CHECK_MSG(!hyb_stream_to_pool(p, 8192, path, 4096 + 17, 4096, &quiet, NULL), "%s", hyb_last_error());
	CHECK(pread(fd, ref, 4096, 4096 + 17) == 4096);
	CHECK(!memcmp(base + 8192, ref, 4096));
	close(fd);
	hyb_mempool_close(p);
	hyb_backend_close(b);
}

TEST(stream_tmpfs_and_buffered_fallback)
{
	char dir[] = "/dev/shm/hyb-stream-XXXXXX";
	struct hyb_stream_opts buffered = { .progress = HYB_STREAM_QUIET, .buffered = 1 };
	struct hyb_stream_stats st;
	const char *path;
	void *dst;

	if (!mkdtemp(dir))
		SKIP("no /dev/shm: %s", strerror(errno));
	path = make_file(dir, "f.bin", 1048576 + 333);
	check_range(path, 5, 1048576 + 300, 5, &quiet);	/* whatever tmpfs does */
	check_range(path, 5, 1048576 + 300, 0, &buffered);
	/* a filesystem that refuses O_DIRECT (simulated): one note, buffered reads */
	setenv("HYB_STREAM_REFUSE_DIRECT", "1", 1);
	check_range(path, 0, 1048576 + 333, 0, &quiet);
	dst = malloc(1048576 + 333);
	CHECK(!hyb_stream_read(path, 0, 1048576 + 333, dst, &quiet, &st));
	CHECK_EQ_INT(st.direct, 0);
	unsetenv("HYB_STREAM_REFUSE_DIRECT");
	free(dst);
	unlink(path);
	rmdir(dir);
}

TEST(stream_errors_name_file_and_offset)
{
	const char *path = make_file(hyb_test_tmpdir(), "short.bin", 10000);
	uint8_t *dst = malloc(20000);

	CHECK(hyb_stream_read(path, 0, 20000, dst, &quiet, NULL) < 0);
	CHECK_MSG(strstr(hyb_last_error(), "short.bin") && strstr(hyb_last_error(), "past the end") &&
		  strstr(hyb_last_error(), "10000 bytes"), "%s", hyb_last_error());
	CHECK(hyb_stream_read(path, 9999, 2, dst, &quiet, NULL) < 0);
	CHECK_MSG(strstr(hyb_last_error(), "[9999, 10001)"), "%s", hyb_last_error());
	CHECK(hyb_stream_read("/nonexistent/x.gguf", 0, 1, dst, &quiet, NULL) < 0);
	CHECK_MSG(strstr(hyb_last_error(), "x.gguf") && strstr(hyb_last_error(), "No such file"), "%s", hyb_last_error());
	CHECK(hyb_stream_read(hyb_test_tmpdir(), 0, 1, dst, &quiet, NULL) < 0);
	CHECK_MSG(strstr(hyb_last_error(), "directory"), "%s", hyb_last_error());
	free(dst);
}

/* err names path and a read "of N bytes at offset X" that holds byte bad. */
static void check_bad_read(const char *err, const char *path, uint64_t bad)
{
	const char *p = strstr(err, "read of ");
	unsigned long long x = 0;
	unsigned int n = 0;

	CHECK_MSG(strstr(err, path) && p &&
		  sscanf(p, "read of %u bytes at offset %llu", &n, &x) == 2 &&
		  x <= bad && bad < x + n, "%s", err);
}

/*
 * A device error (HYB_STREAM_FAULT: EIO for the ring read over the bad byte
 * and, while it is in flight, for reads within SPAN bytes of it, as the block
 * layer fails reads merged into one request; only over the byte for reads
 * alone): the report names the file, a failed read holding the bad byte and
 * the 4096-byte block that fails alone, whichever neighbour failed first,
 * O_DIRECT or buffered, bounced or not.
 */
/*
 * Where the kernel refuses io_uring (HYB_STREAM_NO_URING stands in for a
 * container's seccomp profile): pread threads read the same pieces, the bytes
 * are the file's, the queue still fills, and a device error still names its
 * bad block.
 */
TEST(stream_without_io_uring)
{
	const uint64_t size = 3 * 1048576 + 12345;
	const char *path = make_file(hyb_test_tmpdir(), "nouring.bin", size);
	struct hyb_stream_opts o = { .progress = HYB_STREAM_QUIET, .chunk = 65536, .depth = 16 };
	uint8_t *mem = malloc(size + 4096);
	struct hyb_stream_stats st;

	CHECK(mem);
	setenv(HYB_TESTING_ENV_NO_URING, "1", 1);
	CHECK_MSG(!hyb_stream_read(path, 0, size, mem, &o, &st), "%s", hyb_last_error());
	CHECK_EQ_INT(st.uring, 0);
	CHECK_EQ_INT(st.max_in_flight, 16);
	CHECK(st.bytes == size);
	check_range(path, 0, size, 0, &o);
	check_range(path, 100, size - 300, 7, &o);
	check_range(path, 1, 4095, 1, &quiet);
	setenv("HYB_STREAM_FAULT", "1793344,300000", 1);
	CHECK(hyb_stream_read(path, 100, size - 100, mem + 100, &o, NULL) < 0);
	CHECK_MSG(strstr(hyb_last_error(), "the first bad block is bytes [1789952, 1794048)"),
		  "%s", hyb_last_error());
	unsetenv("HYB_STREAM_FAULT");
	unsetenv(HYB_TESTING_ENV_NO_URING);
	CHECK(!hyb_stream_read(path, 0, size, mem, &o, &st) && st.uring);
	o.pread = 1;	/* asked for (HYB_LOAD=pread): the threads, where io_uring works too */
	CHECK(!hyb_stream_read(path, 0, size, mem, &o, &st) && !st.uring && st.bytes == size);
	check_range(path, 3, size - 3, 5, &o);
	free(mem);
	unlink(path);
}

TEST(stream_device_error_names_the_bad_block)
{
	uint64_t size = 3 * 1048576 + 12345, bad = 1793344;
	const char *path = make_file(hyb_test_tmpdir(), "bad.bin", size);
	struct hyb_stream_opts small = { .progress = HYB_STREAM_QUIET, .chunk = 65536, .depth = 8 };
	struct hyb_stream_opts buffered = { .progress = HYB_STREAM_QUIET, .buffered = 1 };
	const struct hyb_stream_opts *opts[] = { &quiet, &small, &buffered };
	const char *spans[] = { "", ",1", ",300000", ",2000000" };
	uint8_t *mem = mmap(NULL, size + 8192, PROT_READ | PROT_WRITE,
			    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	char env[64], err[512];

	CHECK(mem != MAP_FAILED);
	for (size_t s = 0; s < sizeof(spans) / sizeof(spans[0]); s++) {
		snprintf(env, sizeof(env), "%llu%s", (unsigned long long)bad, spans[s]);
		setenv("HYB_STREAM_FAULT", env, 1);
		for (size_t k = 0; k < 3; k++) {
			for (unsigned int skew = 0; skew < 2; skew++) {
				/* (skew 100: the phases differ, every chunk bounced) */
				CHECK_MSG(hyb_stream_read(path, 100, size - 100,
							  mem + 4096 + 100 * skew, opts[k], NULL) < 0,
					  "fault %s: the read succeeded", env);
				check_bad_read(hyb_last_error(), path, bad);
				CHECK_MSG(strstr(hyb_last_error(), "Input/output error") &&
					  strstr(hyb_last_error(), "the device failed the read") &&
					  strstr(hyb_last_error(), "the first bad block is bytes "
						      "[1789952, 1794048) of the file"),
					  "fault %s opts %zu skew %u: %s", env, k, skew, hyb_last_error());
			}
		}
	}
	/* an intermittent fault: the reads fail in the ring, not alone */
	setenv("HYB_STREAM_FAULT", "1793344,200000,1", 1);
	CHECK(hyb_stream_read(path, 0, size, mem, &small, NULL) < 0);
	CHECK_MSG(strstr(hyb_last_error(), "Input/output error") && strstr(hyb_last_error(), "every block was readable") &&
		  !strstr(hyb_last_error(), "first bad block"), "%s", hyb_last_error());
	/* the bad byte alone, at the end of the range */
	setenv("HYB_STREAM_FAULT", "1793344", 1);
	CHECK(hyb_stream_read(path, 1000, bad + 1 - 1000, mem, &quiet, NULL) < 0);
	check_bad_read(hyb_last_error(), path, bad);
	CHECK_MSG(strstr(hyb_last_error(), "[1789952, 1794048)"), "%s", hyb_last_error());
	unsetenv("HYB_STREAM_FAULT");
	CHECK(!hyb_stream_read(path, 0, size, mem, &quiet, NULL));
	munmap(mem, size + 8192);
	/* the helper the reload reader shares: a sound file has no bad block */
	{
		int fd = open(path, O_RDONLY | O_DIRECT), e = 0;
		uint64_t b = 0, bl = 0;

		if (fd < 0)
			fd = open(path, O_RDONLY);
		CHECK(fd >= 0);
		CHECK_EQ_INT(hyb_stream_find_bad_block(fd, 5, size - 5, &b, &bl, &e), -1);
		close(fd);
	}
	hyb_stream_bad_block_words(err, sizeof(err), 8192, 4096);
	CHECK_MSG(!strcmp(err, "the first bad block is bytes [8192, 12288) of the file"), "%s",
		  err);
	hyb_stream_bad_block_words(err, sizeof(err), 8192, 65536);
	CHECK_MSG(strstr(err, "within bytes [8192, 73728)") && strstr(err, "slow"), "%s", err);
	unlink(path);
}

/*
 * The landed prefix (what a model streaming behind its first prompt computes
 * on): every report grows, the bytes it covers are already the file's when it
 * is made, the last one is the whole range; and a nonzero return cancels.
 */
struct landed_check {
	const uint8_t *dst, *ref;
	uint64_t last, cancel_at;
	int bad;	/* a report whose bytes were not (all) there */
};

static int on_landed(void *arg, uint64_t bytes)
{
	struct landed_check *lc = arg;

	if (bytes <= lc->last || memcmp(lc->dst, lc->ref, bytes))
		lc->bad++;
	lc->last = bytes;
	return lc->cancel_at && bytes >= lc->cancel_at;
}

TEST(stream_reports_the_landed_prefix)
{
	const uint64_t size = (40ull << 20) + 12345;	/* 41 chunks, an unaligned tail */
	const char *path = make_file(hyb_test_tmpdir(), "landed.bin", size);
	uint8_t *dst = mmap(NULL, size + 4096, PROT_READ | PROT_WRITE,
			    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	uint8_t *ref = malloc(size);
	struct landed_check lc = { .ref = ref };
	struct hyb_stream_opts o = quiet;
	int fd = open(path, O_RDONLY);

	CHECK(dst != MAP_FAILED && ref && fd >= 0);
	CHECK(pread(fd, ref, size, 0) == (ssize_t)size);
	posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
	o.landed = on_landed;
	o.landed_arg = &lc;
	for (unsigned int skew = 0; skew <= 100; skew += 100) {	/* direct, then bounced */
		lc = (struct landed_check){ .dst = dst + skew, .ref = ref };
		memset(dst, 0, size + 4096);
		CHECK_MSG(!hyb_stream_read(path, 0, size, dst + skew, &o, NULL),
			  "%s", hyb_last_error());
		CHECK_MSG(!lc.bad, "skew %u: %llu reports were not landed bytes", skew,
			  (unsigned long long)lc.bad);
		CHECK_EQ_INT(lc.last, size);
		posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
	}
	/* a nonzero return stops the load: drained, and reported as cancelled (so
	 * reports also come before the end) */
	lc = (struct landed_check){ .dst = dst, .ref = ref, .cancel_at = 8u << 20 };
	CHECK(hyb_stream_read(path, 0, size, dst, &o, NULL) < 0);
	CHECK_MSG(strstr(hyb_last_error(), "landed.bin") && strstr(hyb_last_error(), "cancelled"), "%s", hyb_last_error());
	CHECK_MSG(lc.last >= 8u << 20 && lc.last < size && !lc.bad, "last %llu of %llu, %d bad",
		  (unsigned long long)lc.last, (unsigned long long)size, lc.bad);
	close(fd);
	free(ref);
	munmap(dst, size + 4096);
}

/* `hyb run` where the kernel refuses io_uring: a one-line notice, then text, exit 0. */
TEST(stream_hyb_run_without_io_uring)
{
	char model[512], cmd[1400], out[8192] = "";
	size_t n;
	FILE *p;
	int fd;

	snprintf(model, sizeof(model), "%s/nouring.gguf", hyb_test_tmpdir());
	snprintf(cmd, sizeof(cmd), "build/hybctl synth -o %s --hidden 256 --ffn 512 --layers 2 "
		 "--heads 4 --type Q4_0 -t 2 >/dev/null", model);
	CHECK_MSG(system(cmd) == 0, "%s failed", cmd);
	fd = open(model, O_RDONLY);	/* cold: the loader reads the file */
	CHECK(fd >= 0 && !posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED));
	close(fd);
	snprintf(cmd, sizeof(cmd), "%s=1 build/hyb run -m %s -p 'Once upon a time' -n 8 2>&1",
		 HYB_TESTING_ENV_NO_URING, model);
	p = popen(cmd, "r");
	CHECK(p);
	n = fread(out, 1, sizeof(out) - 1, p);
	out[n] = 0;
	CHECK_MSG(pclose(p) == 0, "hyb run failed: %s", out);
	CHECK_MSG(strstr(out, "io_uring unavailable") && strstr(out, "pread threads"), "%s", out);
	CHECK_MSG(strstr(out, "Once upon a time") && strstr(out, "decode: "), "%s", out);
}

/* HYB_LOAD=pread: the threads by choice, quietly; a bad value is one clear error. */
TEST(stream_hyb_load_pread)
{
	char model[512], cmd[1400], out[8192] = "";
	size_t n;
	FILE *p;

	snprintf(model, sizeof(model), "%s/pread.gguf", hyb_test_tmpdir());
	snprintf(cmd, sizeof(cmd), "build/hybctl synth -o %s --hidden 256 --ffn 512 --layers 2 "
		 "--heads 4 --type Q8_0 -t 2 >/dev/null", model);
	CHECK_MSG(system(cmd) == 0, "%s failed", cmd);
	snprintf(cmd, sizeof(cmd), "HYB_LOAD=pread build/hyb run -m %s -p 'Once upon a time' "
		 "-n 8 2>&1", model);
	p = popen(cmd, "r");
	CHECK(p);
	n = fread(out, 1, sizeof(out) - 1, p);
	out[n] = 0;
	CHECK_MSG(pclose(p) == 0, "hyb run failed: %s", out);
	CHECK_MSG(!strstr(out, "io_uring unavailable") && strstr(out, "decode: "), "%s", out);
	snprintf(cmd, sizeof(cmd), "HYB_LOAD=uring build/hyb run -m %s -p 'x' -n 1 2>&1", model);
	p = popen(cmd, "r");
	CHECK(p);
	n = fread(out, 1, sizeof(out) - 1, p);
	out[n] = 0;
	CHECK_MSG(pclose(p) != 0 && strstr(out, "HYB_LOAD=uring") &&
		  strstr(out, "hugepage, mmap or pread"), "%s", out);
}
