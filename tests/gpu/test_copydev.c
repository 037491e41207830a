// SPDX-License-Identifier: MIT
/*
 * The CUDA copy device (daemon/copydev_cuda.cu, daemon/copydev_cuda.h)
 * on a real GPU: pool ranges uploaded at every priority land byte for byte in
 * the cache slots (pinned pool, odd offsets and lengths), bounds and evictions
 * behave as the CPU device's; the reload service drives it from the queue;
 * the cache is shared with another process through CUDA IPC. Skipped without
 * a GPU. Latency of a critical upload behind queued prefetch copies is
 * printed (stream priorities do not promise an order for copies, so it is
 * measured, not asserted).
 */
#include <cuda_runtime_api.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "daemon/copydev_cuda.h"
#include "daemon/reload.h"
#include "cuda_kernels.h"
#include "hyb/pool.h"
#include "test.h"

#define MiB (1ull << 20)

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* A local pool of bytes filled with a pattern; *base its mapping. */
static struct hyb_mempool *pattern_pool(struct hyb_backend *b, const char *name, uint64_t bytes,
					uint8_t **base)
{
	struct hyb_mempool *p;
	uint32_t s = 2463534242u;
	size_t len;

	CHECK_MSG(!hyb_mempool_create(b, name, bytes, HYB_MEMPOOL_NODE_LOCAL, 0, 0, &p), "%s",
		  hyb_last_error());
	CHECK(!hyb_mempool_map(p, (void **)base, &len) && len >= bytes);
	for (uint64_t i = 0; i < bytes; i++) {
		s ^= s << 13, s ^= s >> 17, s ^= s << 5;
		(*base)[i] = (uint8_t)s;
	}
	return p;
}

static void check_slot(struct hyb_copydev *d, uint32_t slot, uint64_t off, const uint8_t *want,
		       uint64_t len)
{
	uint8_t *got = malloc(len);

	CHECK(got);
	CHECK(cudaMemcpy(got, (uint8_t *)hyb_copydev_cuda_slot(d, slot) + off, len,
			 cudaMemcpyDeviceToHost) == cudaSuccess);
	CHECK_MSG(!memcmp(got, want, len), "slot %u [%llu, +%llu) differs from the pool", slot,
		  (unsigned long long)off, (unsigned long long)len);
	free(got);
}

static struct hyb_copydev *open_dev(uint32_t slots, uint64_t slot_bytes)
{
	struct hyb_copydev_cuda_config cfg = { .device = 0, .n_slots = slots,
					       .slot_bytes = slot_bytes };
	char err[256];
	struct hyb_copydev *d;

	if (hyb_cuda_device_count() == 0)
		SKIP("no CUDA device");
	d = hyb_copydev_cuda_open(&cfg, err, sizeof(err));
	CHECK_MSG(d, "%s", err);
	CHECK(!strcmp(d->name, "cuda") && d->n_slots == slots && d->slot_bytes == slot_bytes);
	return d;
}

TEST(copydev_cuda_uploads_by_priority_land_exactly)
{
	struct hyb_backend *b = hyb_backend_open(HYB_BACKEND_LOCAL);
	struct hyb_copydev *d;
	struct hyb_mempool *p;
	uint8_t *pool;
	uint64_t copied = 0;
	char err[256];

	CHECK(b);
	d = open_dev(8, 1 * MiB);
	p = pattern_pool(b, "gpu-pat", 16 * MiB, &pool);
	/* through the device's pin op, as the reload service does (counted) */
	CHECK_MSG(!hyb_copydev_pin(d, pool, 16 * MiB, false, err, sizeof(err)), "%s", err);
	CHECK_EQ_INT(d->pinned, 1);
	CHECK_EQ_INT(hyb_copydev_cuda_register(d, pool, 16 * MiB, false, err, sizeof(err)),
		     -EEXIST);
	CHECK_EQ_INT(hyb_copydev_pin(d, pool, 16 * MiB, true, err, sizeof(err)), -EEXIST);
	/* every priority, two slots each: whole slots and odd pieces */
	for (unsigned int prio = 0; prio < HYB_RQ_PRIO_LEVELS; prio++) {
		uint32_t s0 = 2 * prio, s1 = s0 + 1;
		uint64_t src = prio * 3 * MiB + 4093 * prio;

		CHECK_EQ_INT(d->ops->upload(d, s0, 0, pool + src, MiB, prio), 0);
		for (uint64_t off = 0; off < MiB; off += 65537) {
			uint64_t len = off + 65537 > MiB ? MiB - off : 65537;

			CHECK_EQ_INT(d->ops->upload(d, s1, off, pool + src + 7 + off, len, prio), 0);
			copied += len;
		}
		copied += MiB;
		CHECK_EQ_INT(d->ops->sync(d, prio), 0);
		check_slot(d, s0, 0, pool + src, MiB);
		check_slot(d, s1, 0, pool + src + 7, MiB);
		CHECK_EQ_INT(hyb_copydev_cuda_valid(d, s1), MiB);
	}
	CHECK_EQ_INT(d->bytes_copied, copied);
	/* bounds and evictions, as the CPU device */
	CHECK_EQ_INT(d->ops->upload(d, 8, 0, pool, 16, 0), -EINVAL);
	CHECK_EQ_INT(d->ops->upload(d, 0, MiB - 8, pool, 16, 0), -EINVAL);
	CHECK_EQ_INT(d->ops->evict(d, 3), 0);
	CHECK_EQ_INT(hyb_copydev_cuda_valid(d, 3), 0);
	CHECK_EQ_INT(d->ops->evict(d, 99), -EINVAL);
	CHECK(!hyb_copydev_cuda_slot(d, 8));
	/* unregistered (pageable) source memory works too, through staging */
	{
		uint8_t *heap = malloc(MiB);

		CHECK(heap);
		memcpy(heap, pool + 5 * MiB, MiB);
		CHECK_EQ_INT(d->ops->upload(d, 7, 0, heap, MiB, HYB_RQ_LOW), 0);
		CHECK_EQ_INT(d->ops->sync(d, HYB_RQ_LOW), 0);
		check_slot(d, 7, 0, pool + 5 * MiB, MiB);
		free(heap);
	}
	hyb_copydev_unpin(d, pool, 16 * MiB);
	CHECK_EQ_INT(d->pinned, 0);
	CHECK_EQ_INT(hyb_copydev_cuda_unregister(d, pool), -ENOENT);
	hyb_copydev_close(d);
	hyb_mempool_close(p);
	hyb_backend_close(b);
}

TEST(copydev_cuda_critical_upload_behind_prefetch_measured)
{
	struct hyb_backend *b = hyb_backend_open(HYB_BACKEND_LOCAL);
	struct hyb_copydev *d;
	struct hyb_mempool *p;
	uint8_t *pool;
	double t0, t_crit, t_all;
	char err[256];

	CHECK(b);
	d = open_dev(9, 64 * MiB);
	p = pattern_pool(b, "gpu-big", 64 * MiB, &pool);
	CHECK_MSG(!hyb_copydev_cuda_register(d, pool, 64 * MiB, false, err, sizeof(err)), "%s",
		  err);
	/* warm up both streams */
	CHECK_EQ_INT(d->ops->upload(d, 8, 0, pool, MiB, HYB_RQ_LOW), 0);
	CHECK_EQ_INT(d->ops->upload(d, 8, MiB, pool, MiB, HYB_RQ_CRITICAL), 0);
	CHECK(!d->ops->sync(d, HYB_RQ_LOW) && !d->ops->sync(d, HYB_RQ_CRITICAL));

	t0 = now_s();
	for (uint32_t s = 0; s < 8; s++)
		CHECK_EQ_INT(d->ops->upload(d, s, 0, pool, 64 * MiB, HYB_RQ_LOW), 0);
	CHECK_EQ_INT(d->ops->upload(d, 8, 0, pool + 12345, 256 * 1024, HYB_RQ_CRITICAL), 0);
	CHECK_EQ_INT(d->ops->sync(d, HYB_RQ_CRITICAL), 0);
	t_crit = now_s() - t0;
	CHECK_EQ_INT(d->ops->sync(d, HYB_RQ_LOW), 0);
	t_all = now_s() - t0;
	check_slot(d, 8, 0, pool + 12345, 256 * 1024);
	check_slot(d, 5, 0, pool, 64 * MiB);
	printf("    512 MiB of prefetch uploads queued: a 256 KiB critical upload landed after "
	       "%.2f ms, the prefetch after %.2f ms (%.1f GB/s)\n", t_crit * 1e3, t_all * 1e3,
	       512.0 * MiB / t_all / 1e9);
	hyb_copydev_close(d);
	hyb_mempool_close(p);
	hyb_backend_close(b);
}

static struct hyb_rq_req upload_req(uint32_t pool, uint64_t off, uint64_t len, uint32_t slot,
				    uint8_t prio, uint64_t tag)
{
	struct hyb_rq_req r = { 0 };

	r.op = HYB_RQ_UPLOAD;
	r.prio = prio;
	r.pool_id = pool;
	r.pool_off = off;
	r.len = len;
	r.aux = slot;
	r.tag = tag;
	return r;
}

TEST(copydev_cuda_driven_by_the_reload_service)
{
	struct hyb_backend *b = hyb_backend_open(HYB_BACKEND_LOCAL);
	struct hyb_reload_config rc = { 0 };
	struct hyb_reload_stats st;
	struct hyb_rq_req q[8];
	struct hyb_rq_cqe cqe[8];
	struct hyb_copydev *d;
	struct hyb_reload *r;
	struct hyb_mempool *p;
	struct hyb_rq *c;
	uint8_t *pool;
	uint32_t id;
	char err[256];
	int got = 0;

	CHECK(b);
	d = open_dev(8, 2 * MiB);
	p = pattern_pool(b, "gpu-rl", 8 * MiB, &pool);
	id = hyb_mempool_id(p);
	CHECK_MSG(!hyb_copydev_cuda_register(d, pool, 8 * MiB, false, err, sizeof(err)), "%s",
		  err);
	rc.backend = b;
	rc.queue = 5;
	rc.chunk = 256 * 1024;
	rc.dev = d;
	r = hyb_reload_start(&rc, err, sizeof(err));
	CHECK_MSG(r, "%s", err);
	CHECK_MSG(!hyb_rq_attach_client(b, 5, HYB_RQ_EVENTFD_NONE, &c), "%s", hyb_last_error());
	for (int i = 0; i < 8; i++)
		q[i] = upload_req(id, (uint64_t)i * 777777, 2 * MiB - (uint64_t)i * 4099, (uint32_t)i,
				  (uint8_t)(i % HYB_RQ_PRIO_LEVELS), (uint64_t)i);
	CHECK(!hyb_rq_submit(c, q, 8));
	while (got < 8) {
		int n = hyb_rq_reap(c, cqe + got, 8 - (unsigned int)got, 1, 10000000000ull);

		CHECK_MSG(n > 0, "reap: %d", n);
		got += n;
	}
	for (int i = 0; i < 8; i++) {
		CHECK_MSG(cqe[i].status == 0, "upload %llu: %d", (unsigned long long)cqe[i].tag,
			  cqe[i].status);
	}
	for (int i = 0; i < 8; i++)
		check_slot(d, (uint32_t)i, 0, pool + q[i].pool_off, q[i].len);
	/* an evict, then a slot out of range */
	/* (an evict names its slot's pool range: an empty range is refused at submit) */
	q[0] = upload_req(id, 0, 4096, 2, HYB_RQ_HIGH, 100);
	q[0].op = HYB_RQ_EVICT;
	q[1] = upload_req(id, 0, 4096, 99, HYB_RQ_CRITICAL, 101);
	CHECK(!hyb_rq_submit(c, q, 2));
	for (got = 0; got < 2;) {
		int n = hyb_rq_reap(c, cqe + got, 2 - (unsigned int)got, 1, 10000000000ull);

		CHECK(n > 0);
		got += n;
	}
	for (int i = 0; i < 2; i++)
		CHECK_EQ_INT(cqe[i].status, cqe[i].tag == 100 ? 0 : -EINVAL);
	CHECK_EQ_INT(hyb_copydev_cuda_valid(d, 2), 0);
	hyb_rq_close(c);
	hyb_reload_stop(r, &st);
	CHECK(st.cls[HYB_RELOAD_CRITICAL].done >= 2 && st.cls[HYB_RELOAD_PREFETCH].done >= 2);
	hyb_copydev_close(d);
	hyb_mempool_close(p);
	hyb_backend_close(b);
}

/*
 * Box mode: another process maps the cache through the exported descriptor
 * and sees the uploaded bytes. The child is forked before this process
 * touches CUDA (a CUDA context does not survive fork).
 */
TEST(copydev_cuda_cache_shared_through_ipc)
{
	int to_child[2], to_parent[2];
	struct hyb_gpucache_desc desc;
	pid_t pid;
	int st;

	CHECK(!pipe(to_child) && !pipe(to_parent));
	pid = fork();
	CHECK(pid >= 0);
	if (!pid) {
		char verdict[300] = "ok";
		uint8_t *host = malloc(MiB);
		uint8_t want[64];
		void *base;

		close(to_child[1]);
		close(to_parent[0]);
		if (read(to_child[0], &desc, sizeof(desc)) != sizeof(desc) ||
		    read(to_child[0], want, sizeof(want)) != sizeof(want))
			_exit(0);	/* the parent skipped */
		if (hyb_cuda_cache_open(&desc, -1, &base))
			snprintf(verdict, sizeof(verdict), "open: %s", hyb_last_error());
		else if (cudaMemcpy(host, (uint8_t *)base + 3 * desc.slot_bytes, MiB,
				    cudaMemcpyDeviceToHost) != cudaSuccess)
			snprintf(verdict, sizeof(verdict), "copy from the shared cache failed");
		else if (memcmp(host, want, sizeof(want)))
			snprintf(verdict, sizeof(verdict), "slot 3 differs in the other process");
		else if (hyb_cuda_cache_close(base))
			snprintf(verdict, sizeof(verdict), "close failed");
		if (write(to_parent[1], verdict, sizeof(verdict)) != sizeof(verdict))
			_exit(1);
		_exit(0);
	}
	{
		struct hyb_backend *b = hyb_backend_open(HYB_BACKEND_LOCAL);
		struct hyb_copydev *d;
		struct hyb_mempool *p;
		char err[256], verdict[300];
		uint8_t *pool;

		close(to_child[0]);
		close(to_parent[1]);
		if (hyb_cuda_device_count() == 0) {
			close(to_child[1]);
			waitpid(pid, &st, 0);
			SKIP("no CUDA device");
		}
		CHECK(b);
		d = open_dev(4, MiB);
		p = pattern_pool(b, "gpu-ipc", 4 * MiB, &pool);
		CHECK_EQ_INT(d->ops->upload(d, 3, 0, pool + MiB, MiB, HYB_RQ_HIGH), 0);
		CHECK_EQ_INT(d->ops->sync(d, HYB_RQ_HIGH), 0);
		CHECK_MSG(!hyb_copydev_cuda_export(d, &desc, err, sizeof(err)), "%s", err);
		CHECK(desc.magic == HYB_GPUCACHE_MAGIC && desc.n_slots == 4 &&
		      desc.slot_bytes == MiB && desc.pid == getpid() && desc.pci_bus_id[0]);
		CHECK(write(to_child[1], &desc, sizeof(desc)) == sizeof(desc) &&
		      write(to_child[1], pool + MiB, 64) == 64);
		CHECK(read(to_parent[0], verdict, sizeof(verdict)) == sizeof(verdict));
		CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && !WEXITSTATUS(st));
		CHECK_MSG(!strcmp(verdict, "ok"), "other process: %s", verdict);
		/* another GPU than the app's is refused before any mapping */
		{
			void *base = &desc;

			CHECK_EQ_INT(hyb_cuda_cache_open(&desc, 1 << 20, &base),
				     -EXDEV);
			CHECK_MSG(!base && strstr(hyb_last_error(), "use the same GPU"), "%s",
				  hyb_last_error());
		}
		/* a bad descriptor is refused with a message */
		desc.magic = 0;
		{
			void *base;

			CHECK_EQ_INT(hyb_cuda_cache_open(&desc, -1, &base), -EINVAL);
			CHECK(!base && strstr(hyb_last_error(), "descriptor"));
		}
		hyb_copydev_close(d);
		hyb_mempool_close(p);
		hyb_backend_close(b);
	}
}

/*
 * mark/wait (what the reload service's device lane keeps two chunks in flight
 * with): a wait returns once the uploads before its mark landed, tokens are
 * freed by their wait, -EBUSY past HYB_COPYDEV_MARKS outstanding, -EINVAL for
 * a token not outstanding. Unregistering a pool with a copy from it still
 * queued drains the streams first: the copy lands whole. The link's speed in
 * 1 MiB chunks, a sync after each against two in flight, is printed.
 */
TEST(copydev_cuda_marks_and_unregister_drain)
{
	struct hyb_backend *b = hyb_backend_open(HYB_BACKEND_LOCAL);
	uint32_t tok[HYB_COPYDEV_MARKS + 1], extra;
	struct hyb_copydev *d;
	struct hyb_mempool *p;
	uint8_t *pool;
	double t0, t_sync, t_two;
	char err[256];

	CHECK(b);
	d = open_dev(4, 64 * MiB);
	CHECK(d->ops->mark && d->ops->wait);
	p = pattern_pool(b, "gpu-marks", 64 * MiB, &pool);
	CHECK_MSG(!hyb_copydev_cuda_register(d, pool, 64 * MiB, false, err, sizeof(err)), "%s",
		  err);
	/* two chunks, a mark behind each; the first wait covers the first alone */
	CHECK_EQ_INT(d->ops->upload(d, 0, 0, pool, 32 * MiB, HYB_RQ_LOW), 0);
	CHECK_EQ_INT(d->ops->mark(d, HYB_RQ_LOW, &tok[0]), 0);
	CHECK_EQ_INT(d->ops->upload(d, 0, 32 * MiB, pool + 32 * MiB, 32 * MiB, HYB_RQ_LOW), 0);
	CHECK_EQ_INT(d->ops->mark(d, HYB_RQ_LOW, &tok[1]), 0);
	CHECK_EQ_INT(d->ops->wait(d, tok[0]), 0);
	check_slot(d, 0, 0, pool, 32 * MiB);
	CHECK_EQ_INT(d->ops->wait(d, tok[1]), 0);
	check_slot(d, 0, 32 * MiB, pool + 32 * MiB, 32 * MiB);
	CHECK_EQ_INT(d->ops->wait(d, tok[1]), -EINVAL);	/* freed by its wait */
	/* the ring: HYB_COPYDEV_MARKS outstanding, then -EBUSY until one is waited for */
	for (int i = 0; i < HYB_COPYDEV_MARKS; i++)
		CHECK_EQ_INT(d->ops->mark(d, HYB_RQ_CRITICAL, &tok[i]), 0);
	CHECK_EQ_INT(d->ops->mark(d, HYB_RQ_CRITICAL, &extra), -EBUSY);
	for (int i = 0; i < HYB_COPYDEV_MARKS; i++)
		CHECK_EQ_INT(d->ops->wait(d, tok[i]), 0);
	CHECK_EQ_INT(d->ops->mark(d, HYB_RQ_CRITICAL, &extra), 0);
	CHECK_EQ_INT(d->ops->wait(d, extra), 0);

	/* the link in 1 MiB chunks: a sync after each, then two in flight */
	t0 = now_s();
	for (int i = 0; i < 256; i++) {
		CHECK_EQ_INT(d->ops->upload(d, 1 + i % 3, (uint64_t)(i % 64) * MiB,
					    pool + (uint64_t)(i % 64) * MiB, MiB, HYB_RQ_LOW), 0);
		CHECK_EQ_INT(d->ops->sync(d, HYB_RQ_LOW), 0);
	}
	t_sync = now_s() - t0;
	t0 = now_s();
	for (int i = 0; i < 256; i++) {
		CHECK_EQ_INT(d->ops->upload(d, 1 + i % 3, (uint64_t)(i % 64) * MiB,
					    pool + (uint64_t)(i % 64) * MiB, MiB, HYB_RQ_LOW), 0);
		CHECK_EQ_INT(d->ops->mark(d, HYB_RQ_LOW, &tok[i % 2]), 0);
		if (i)
			CHECK_EQ_INT(d->ops->wait(d, tok[(i - 1) % 2]), 0);
	}
	CHECK_EQ_INT(d->ops->wait(d, tok[255 % 2]), 0);
	t_two = now_s() - t0;
	printf("    256 MiB in 1 MiB chunks: %.1f GB/s with a sync per chunk, %.1f GB/s with two "
	       "in flight\n", 256.0 * MiB / t_sync / 1e9, 256.0 * MiB / t_two / 1e9);
	check_slot(d, 1, 0, pool, 64 * MiB);

	/* unregister with a 64 MiB copy from the pool still queued: it lands first */
	CHECK_EQ_INT(d->ops->upload(d, 3, 0, pool, 64 * MiB, HYB_RQ_LOW), 0);
	CHECK_EQ_INT(hyb_copydev_cuda_unregister(d, pool), 0);
	check_slot(d, 3, 0, pool, 64 * MiB);
	hyb_copydev_close(d);
	hyb_mempool_close(p);
	hyb_backend_close(b);
}
