// SPDX-License-Identifier: MIT
/* hybd's life: start, serve, stop (see server.h). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <numa.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "copydev_cuda.h"
#include "hyb/gguf.h"
#include "hyb/manifest.h"
#include "load.h"
#include "manifest_write.h"
#include "reload.h"
#include "server.h"

struct hybd {
	struct hybd_config cfg;
	struct hyb_backend *b;
	struct hyb_loaded model;
	struct hyb_copydev *dev;
	struct hyb_reload *reload;
	struct hyb_mf_published pub;
	char manifest_path[PATH_MAX + 64];
	char stats_path[PATH_MAX + 64];
	char gpucache_path[PATH_MAX + 64];	/* STATE_DIR/NAME.gpucache (hyb/gpucache.h) */
	struct hyb_mempool *slots_pool;		/* the CPU device's slots, shared with apps */
	bool gpucache_written;
	bool stats_written;
	int progress_mode;		/* 1 bar, 2 lines, 0 quiet */
	int last_quarter;
	bool (*cancelled)(void *arg);
	void *cancel_arg;
	uint64_t last_fetched;		/* at the last statistics log lines */
	uint64_t file_fetched, file_finished;	/* at the last statistics file */
	uint64_t last_log_ns;
};

static const char *const op_names[] = { "nop", "load", "upload", "evict" };

/* -- helpers ------------------------------------------------------------- */

int hybd_mkdirs(const char *dir)
{
	char buf[PATH_MAX];

	snprintf(buf, sizeof(buf), "%s", dir);
	for (char *p = buf + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = 0;
		if (mkdir(buf, 0755) && errno != EEXIST)
			return -1;
		*p = '/';
	}
	return mkdir(buf, 0755) && errno != EEXIST ? -1 : 0;
}

/* nodes = all: every node with memory (node 0 where NUMA is unavailable). */
static void resolve_nodes(struct hyb_numa_place_config *pc)
{
	pc->n_nodes = 0;
	if (numa_available() >= 0) {
		for (int n = 0; n <= numa_max_node() && pc->n_nodes < HYB_NUMA_PLACE_MAX_NODES; n++) {
			long long free_b;

			if (numa_node_size64(n, &free_b) > 0)
				pc->nodes[pc->n_nodes++] = n;
		}
	}
	if (!pc->n_nodes)
		pc->nodes[pc->n_nodes++] = 0;
}

/*
 * A manifest file left behind: another live hybd with this name (refuse), or
 * a dead one's (remove it: its pools died with it).
 */
static int check_stale(struct hybd *d, char *err, size_t errlen)
{
	struct hyb_mf_header h;
	ssize_t got;
	int fd = open(d->manifest_path, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return 0;
	got = read(fd, &h, sizeof(h));
	close(fd);
	/* our own pid too: another server of this process (tests run several) */
	if (got == (ssize_t)sizeof(h) && h.magic == HYB_MF_MAGIC && h.pid > 0 &&
	    (kill(h.pid, 0) == 0 || errno == EPERM)) {
		snprintf(err, errlen, "another hybd (pid %d) serves '%s' (manifest %s); set "
			 "another name or state_dir", h.pid, d->cfg.name, d->manifest_path);
		return -1;
	}
	hlog_msg(HLOG_WARN, "stale_manifest", "removed %s left by pid %d", d->manifest_path,
		 got == (ssize_t)sizeof(h) ? h.pid : 0);
	unlink(d->manifest_path);
	return 0;
}

/*
 * Statistics files of box-mode apps (hyb/app_stats.h) whose process is gone:
 * an app killed before it let the cache go leaves one. hybctl skips them;
 * removing them here keeps a reused pid from reading as the old app.
 */
static void remove_dead_apps(const struct hybd *d)
{
	char prefix[HYB_LOAD_NAME_MAX + 8], path[PATH_MAX + 300];
	const size_t np = (size_t)snprintf(prefix, sizeof(prefix), "%s.app.", d->cfg.name);
	DIR *dir = opendir(d->cfg.state_dir);
	struct dirent *e;

	while (dir && (e = readdir(dir))) {
		char *end;
		long pid;

		if (strncmp(e->d_name, prefix, np))
			continue;
		pid = strtol(e->d_name + np, &end, 10);
		if (pid <= 0 || (*end && strcmp(end, ".tmp")) ||
		    (kill((pid_t)pid, 0) && errno == ESRCH)) {
			snprintf(path, sizeof(path), "%s/%s", d->cfg.state_dir, e->d_name);
			if (pid > 0 && !*end)
				hlog_msg(HLOG_INFO, "stale_app", "removed %s of pid %ld (gone)", path,
					 pid);
			unlink(path);
		}
	}
	if (dir)
		closedir(dir);
}

static void on_progress(uint64_t done, uint64_t total, uint64_t ns, void *arg)
{
	struct hybd *d = arg;
	double gbs = ns ? (double)done / (double)ns : 0;
	int pct = total ? (int)(done * 100 / total) : 100;

	if (d->progress_mode == 1) {
		char bar[31];
		int fill = pct * 30 / 100;

		memset(bar, '#', (size_t)fill);
		memset(bar + fill, ' ', (size_t)(30 - fill));
		bar[30] = 0;
		fprintf(stderr, "\rhybd: loading [%s] %3d%% %.0f/%.0f MiB %.2f GB/s%s", bar, pct,
			done / 1048576.0, total / 1048576.0, gbs, done == total ? "\n" : "");
	} else if (d->progress_mode == 2 && (pct / 25 > d->last_quarter || done == total)) {
		struct hlog l;

		d->last_quarter = pct / 25;
		hlog_begin(&l, HLOG_INFO, "load_progress");
		hlog_i64(&l, "pct", pct);
		hlog_u64(&l, "bytes", done);
		hlog_u64(&l, "total", total);
		hlog_f64(&l, "gbps", gbs);
		hlog_end(&l);
	}
}

static bool load_cancelled(void *arg)
{
	struct hybd *d = arg;

	return d->cancelled && d->cancelled(d->cancel_arg);
}

static void on_reload_done(const struct hyb_reload_event *ev, void *arg)
{
	const struct hyb_rq_req *q = ev->req;
	enum hlog_level lvl = ev->status ? HLOG_WARN : HLOG_DEBUG;
	struct hlog l;

	(void)arg;
	if (!hlog_enabled(lvl))
		return;
	hlog_begin(&l, lvl, ev->status ? "reload_error" : "reload");
	hlog_u64(&l, "id", q->id);
	hlog_u64(&l, "client", q->client_id);
	hlog_str(&l, "op", q->op < 4 ? op_names[q->op] : "?");
	hlog_str(&l, "class", hyb_reload_class_name(hyb_reload_class_of(q->prio)));
	hlog_u64(&l, "pool", q->pool_id);
	hlog_u64(&l, "off", q->pool_off);
	hlog_u64(&l, "len", q->len);
	hlog_u64(&l, "aux", q->aux);
	hlog_u64(&l, "wait_us", (ev->started_ns - ev->queued_ns) / 1000);
	hlog_u64(&l, "service_us", (ev->done_ns - ev->started_ns) / 1000);
	hlog_u64(&l, "slices", ev->slices);
	if (ev->status) {
		hlog_i64(&l, "status", ev->status);
		hlog_str(&l, "error", strerror(-ev->status));
		hlog_str(&l, "msg", ev->msg);
	}
	hlog_end(&l);
}

static void log_pools(const struct hybd *d)
{
	const struct hyb_loaded *m = &d->model;

	for (unsigned int i = 0; i < m->n_pools; i++) {
		struct hyb_mempool_info pi;
		struct hlog l;

		if (hyb_mempool_info(m->pools[i], &pi))
			continue;
		hlog_begin(&l, HLOG_INFO, "pool");
		hlog_str(&l, "name", pi.name);
		hlog_u64(&l, "id", pi.id);
		hlog_i64(&l, "node", pi.node);
		hlog_str(&l, "role", m->placement.pools[i].role == HYB_NUMA_PLACE_PAGE ? "page" :
			 "weights");
		hlog_u64(&l, "bytes", pi.bytes);
		hlog_u64(&l, "used", m->placement.pools[i].used);
		hlog_u64(&l, "huge_bytes", pi.huge_bytes);
		hlog_end(&l);
	}
}

/* -- statistics file ----------------------------------------------------- */

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* STATE_DIR/NAME.stats (reload.h: hyb_reload_stats_write); hybctl stalls reads it. */
static void write_stats_file(struct hybd *d, const struct hyb_reload_stats *st)
{
	if (hyb_reload_stats_write(st, d->stats_path)) {
		hlog_msg(HLOG_WARN, "stats", "%s", hyb_last_error());
		return;
	}
	d->stats_written = true;
	d->file_fetched = st->fetched;
	d->file_finished = st->fetched - st->backlog;
}

/* Rewrite it only when requests came or finished since (an idle hybd writes nothing). */
static void refresh_stats_file(struct hybd *d)
{
	struct hyb_reload_stats st;

	if (!d->reload)
		return;
	hyb_reload_stats(d->reload, &st);
	if (st.fetched != d->file_fetched || st.fetched - st.backlog != d->file_finished)
		write_stats_file(d, &st);
}

/* -- start --------------------------------------------------------------- */

static void undo(struct hybd *d)
{
	hyb_mf_retire(&d->pub);
	if (d->reload)
		hyb_reload_stop(d->reload, NULL);
	d->reload = NULL;
	if (d->stats_written)
		unlink(d->stats_path);
	d->stats_written = false;
	/* apps stop finding the GPU cache before it goes */
	if (d->gpucache_written)
		unlink(d->gpucache_path);
	d->gpucache_written = false;
	hyb_copydev_close(d->dev);
	d->dev = NULL;
	if (d->slots_pool) {
		hyb_mempool_destroy(d->slots_pool);
		hyb_mempool_close(d->slots_pool);
		d->slots_pool = NULL;
	}
	hyb_loaded_free(&d->model);
	if (d->b)
		hyb_backend_close(d->b);
	d->b = NULL;
}

/*
 * The CUDA device in box mode: hybd's pool mappings pinned for DMA, and the
 * cache exported to STATE_DIR/NAME.gpucache for apps (copydev_cuda.h).
 *
 * Registration covers the mappings hybd holds (load.c streamed into them).
 * On the local backend the reload service uploads from those same mappings
 * (an owner's handles share one), so every UPLOAD is a single DMA; on the
 * kmod backend the service maps its own view of the pools and pins that
 * itself (reload.c, ref_pin). A failed registration is a warning: uploads
 * still land, through CUDA's staging copy. -1 with the bare reason in err
 * (the caller says which device setting it was).
 */
static int start_cuda(struct hybd *d, char *err, size_t errlen)
{
	struct hyb_copydev_cuda_config cc = {
		.device = d->cfg.cuda_device, .n_slots = d->cfg.gpu_slots,
		.slot_bytes = d->cfg.slot_bytes,
	};
	struct hyb_gpucache_desc desc;
	uint64_t pinned = 0;
	unsigned int n_pinned = 0;
	char why[256];
	struct hlog l;

	if (!hyb_copydev_cuda_built()) {
		snprintf(err, errlen, "hybd was built without CUDA (nvcc was not found when it "
			 "was built)");
		return -1;
	}
	d->dev = hyb_copydev_cuda_open(&cc, err, errlen);
	if (!d->dev)
		return -1;
	for (unsigned int i = 0; i < d->model.n_pools; i++) {
		size_t len;
		void *base;
		int ret = hyb_mempool_map(d->model.pools[i], &base, &len);

		if (!ret)
			ret = hyb_copydev_pin(d->dev, base, len, false, why, sizeof(why));
		else
			snprintf(why, sizeof(why), "%s", hyb_last_error());
		if (ret) {
			hlog_msg(HLOG_WARN, "device", "pool %u not pinned for DMA (uploads from it "
				 "go through CUDA's staging copy): %s", i, why);
			continue;
		}
		n_pinned++;
		pinned += len;
	}
	snprintf(d->gpucache_path, sizeof(d->gpucache_path), "%s/%s.gpucache", d->cfg.state_dir,
		 d->cfg.name);
	if (hyb_copydev_cuda_export(d->dev, &desc, why, sizeof(why))) {
		snprintf(err, errlen, "cannot publish the GPU cache: %s", why);
		return -1;
	}
	desc.queue = d->cfg.queue;
	if (hyb_gpucache_desc_write(d->gpucache_path, &desc)) {
		snprintf(err, errlen, "cannot publish the GPU cache: %s", hyb_last_error());
		return -1;
	}
	d->gpucache_written = true;
	hlog_begin(&l, HLOG_INFO, "device");
	hlog_str(&l, "name", "cuda");
	hlog_i64(&l, "cuda_device", d->cfg.cuda_device);
	hlog_str(&l, "pci_bus_id", desc.pci_bus_id);
	hlog_u64(&l, "slots", d->cfg.gpu_slots);
	hlog_u64(&l, "slot_bytes", d->cfg.slot_bytes);
	hlog_u64(&l, "pinned_pools", n_pinned);
	hlog_u64(&l, "pinned_bytes", pinned);
	hlog_str(&l, "gpucache", d->gpucache_path);
	hlog_end(&l);
	return 0;
}

/*
 * slot_bytes = auto: a plan's largest group bundle (gate | up | down rows,
 * rounded up to 256 bytes as an app's own cache does), so a slot holds one
 * group and wastes nothing; 2 MiB for a model without a plan.
 */
static uint64_t auto_slot_bytes(const struct hybd *d)
{
	struct hyb_manifest *mf;
	struct hyb_manifest_info mi;
	uint64_t max = 0;

	mf = hyb_manifest_parse(d->model.manifest, d->model.manifest_len);
	if (!mf)
		return 2ull << 20;
	hyb_manifest_info(mf, &mi);
	for (uint32_t i = 0; i < mi.n_bundles; i++) {
		const struct hyb_mf_bundle *b = hyb_manifest_bundle_at(mf, i);

		if (b && b->bytes > max)
			max = b->bytes;
	}
	hyb_manifest_close(mf);
	return max ? (max + 255) / 256 * 256 : 2ull << 20;
}

/*
 * The CPU device. Its slots are a shared pool, NAME.gpucache, published
 * like the CUDA cache (hyb/gpucache.h, kind host), so that box-mode apps
 * on the CPU device layer compute on what hybd's copies wrote. Without the
 * pool (over the pinned cap, say) the slots are private memory: uploads
 * still work, apps keep their own cache, and the log says why.
 */
static int start_cpu(struct hybd *d, char *err, size_t errlen)
{
	const uint64_t bytes = (uint64_t)d->cfg.gpu_slots * d->cfg.slot_bytes;
	struct hyb_gpucache_desc desc = {
		.magic = HYB_GPUCACHE_MAGIC, .version = HYB_GPUCACHE_VERSION,
		.pid = (int32_t)getpid(), .n_slots = d->cfg.gpu_slots, .kind = HYB_GPUCACHE_HOST,
		.slot_bytes = d->cfg.slot_bytes, .queue = d->cfg.queue,
	};
	void *mem = NULL;
	size_t len;
	int ret;

	/* the name is at most HYB_LOAD_NAME_MAX (22): NAME.gpucache fits */
	if (snprintf(desc.pool, sizeof(desc.pool), "%.22s.gpucache", d->cfg.name) >=
	    (int)sizeof(desc.pool)) {
		snprintf(err, errlen, "name %s: too long for the cache pool's name", d->cfg.name);
		return -1;
	}
	ret = hyb_mempool_create(d->b, desc.pool, bytes, HYB_MEMPOOL_NODE_LOCAL, 0,
				 HYB_MEMPOOL_SHARED, &d->slots_pool);
	if (!ret)
		ret = hyb_mempool_map(d->slots_pool, &mem, &len);
	if (ret) {
		hlog_msg(HLOG_WARN, "device", "cpu device: no shared pool for the slots (apps "
			 "keep their own cache): %s", hyb_last_error());
		if (d->slots_pool) {
			hyb_mempool_destroy(d->slots_pool);
			hyb_mempool_close(d->slots_pool);
			d->slots_pool = NULL;
		}
		d->dev = hyb_copydev_cpu_open(d->cfg.gpu_slots, d->cfg.slot_bytes,
					      d->cfg.copy_bandwidth, err, errlen);
		return d->dev ? 0 : -1;
	}
	d->dev = hyb_copydev_cpu_open_at(mem, d->cfg.gpu_slots, d->cfg.slot_bytes,
					 d->cfg.copy_bandwidth, err, errlen);
	if (!d->dev)
		return -1;
	snprintf(d->gpucache_path, sizeof(d->gpucache_path), "%s/%s.gpucache", d->cfg.state_dir,
		 d->cfg.name);
	if (hyb_gpucache_desc_write(d->gpucache_path, &desc)) {
		snprintf(err, errlen, "cannot publish the GPU cache: %s", hyb_last_error());
		return -1;
	}
	d->gpucache_written = true;
	return 0;
}

static int start_device(struct hybd *d, char *err, size_t errlen)
{
	char why[512] = "";
	struct hlog l;

	if (!d->cfg.slot_bytes)
		d->cfg.slot_bytes = auto_slot_bytes(d);
	if (d->cfg.gpu_cache) {
		const uint64_t n = d->cfg.gpu_cache / d->cfg.slot_bytes;

		if (!n || n > (1u << 20)) {
			snprintf(err, errlen, "gpu_cache %llu holds %llu slots of %llu bytes (1 .. %u)",
				 (unsigned long long)d->cfg.gpu_cache, (unsigned long long)n,
				 (unsigned long long)d->cfg.slot_bytes, 1u << 20);
			return -1;
		}
		d->cfg.gpu_slots = (uint32_t)n;
	}
	if (d->cfg.device == HYBD_DEV_NONE) {
		hlog_msg(HLOG_INFO, "device", "no copy device: UPLOAD and EVICT requests fail "
			 "with ENODEV");
		return 0;
	}
	if (d->cfg.device == HYBD_DEV_CUDA || d->cfg.device == HYBD_DEV_AUTO) {
		if (!start_cuda(d, why, sizeof(why)))
			return 0;
		if (d->cfg.device == HYBD_DEV_CUDA) {
			snprintf(err, errlen, "device = cuda: %s%s", why, hyb_copydev_cuda_built() ?
				 "" : "; use device = cpu or auto");
			return -1;
		}
		/* auto: the CPU device, and the log says why */
		hyb_copydev_close(d->dev);
		d->dev = NULL;
	}
	if (start_cpu(d, err, errlen))
		return -1;
	hlog_begin(&l, HLOG_INFO, "device");
	hlog_str(&l, "name", "cpu");
	hlog_u64(&l, "slots", d->cfg.gpu_slots);
	hlog_u64(&l, "slot_bytes", d->cfg.slot_bytes);
	hlog_u64(&l, "bandwidth", d->cfg.copy_bandwidth);
	if (d->gpucache_written)
		hlog_str(&l, "gpucache", d->gpucache_path);
	if (why[0]) {
		hlog_str(&l, "cuda", why);
		hlog_str(&l, "msg", "no GPU to use: GPU cache slots are host memory (CPU device)");
	} else {
		hlog_str(&l, "msg", "device = cpu: GPU cache slots are host memory (CPU device)");
	}
	hlog_end(&l);
	return 0;
}

/* The backend, the state folder and its files, and no other daemon on the queue. */
static int start_backend(struct hybd *d, char *err, size_t errlen)
{
	struct hyb_backend_info bi;
	struct hyb_rq_stats qs;
	struct hlog l;

	d->b = hyb_backend_open(d->cfg.backend);
	if (!d->b) {
		snprintf(err, errlen, "%s", hyb_last_error());
		return -1;
	}
	hyb_backend_info(d->b, &bi);
	hlog_begin(&l, HLOG_INFO, "backend");
	hlog_str(&l, "kind", hyb_backend_name(bi.kind));
	hlog_u64(&l, "abi", bi.abi_version);
	hlog_u64(&l, "pinned_cap", bi.pinned_cap);
	if (bi.kind == HYB_BACKEND_LOCAL)
		hlog_str(&l, "msg", "local backend: pools and queue live in this process only");
	hlog_end(&l);
	if (hybd_mkdirs(d->cfg.state_dir)) {
		snprintf(err, errlen, "state_dir %s: %s", d->cfg.state_dir, strerror(errno));
		return -1;
	}
	snprintf(d->manifest_path, sizeof(d->manifest_path), "%s/%s.manifest", d->cfg.state_dir,
		 d->cfg.name);
	snprintf(d->stats_path, sizeof(d->stats_path), "%s/%s.stats", d->cfg.state_dir,
		 d->cfg.name);
	if (check_stale(d, err, errlen))
		return -1;
	remove_dead_apps(d);
	/* before minutes of loading: is the queue taken? (attaching decides, later) */
	if (!hyb_rq_stats(d->b, d->cfg.queue, &qs) && qs.live) {
		snprintf(err, errlen, "reload queue %u has a daemon already (pid %d): set "
			 "another queue", d->cfg.queue, qs.daemon_pid);
		return -1;
	}
	return 0;
}

/* The model into its pools (the minutes of a start). */
static int start_load(struct hybd *d, char *err, size_t errlen)
{
	struct hyb_load_config lc = { 0 };
	struct hlog l;

	lc.backend = d->b;
	lc.model_path = d->cfg.model;
	lc.name = d->cfg.name;
	lc.place = &d->cfg.place;
	lc.io_depth = d->cfg.io_depth;
	lc.io_chunk = d->cfg.io_chunk;
	lc.cancelled = load_cancelled;
	lc.progress = on_progress;
	lc.arg = d;
	d->progress_mode = d->cfg.progress == HYBD_PROGRESS_BAR ? 1 :
			   d->cfg.progress == HYBD_PROGRESS_LINES ? 2 :
			   d->cfg.progress == HYBD_PROGRESS_QUIET ? 0 : isatty(2) ? 1 : 2;
	d->last_quarter = 0;
	if (hyb_load_model(&lc, &d->model, err, errlen))
		return -1;
	hlog_begin(&l, HLOG_INFO, "load_done");
	hlog_str(&l, "model", d->cfg.model);
	hlog_u64(&l, "tensors", d->model.gguf->n_tensors);
	hlog_u64(&l, "layers", d->model.n_layers);
	hlog_u64(&l, "bytes", d->model.bytes);
	hlog_u64(&l, "resident", d->model.placement.resident);
	hlog_u64(&l, "paged", d->model.placement.paged);
	hlog_f64(&l, "seconds", d->model.ns / 1e9);
	hlog_f64(&l, "gbps", d->model.ns ? (double)d->model.bytes / (double)d->model.ns : 0);
	hlog_u64(&l, "reads_direct", d->model.direct_runs);
	hlog_u64(&l, "reads", d->model.runs);
	hlog_str(&l, "placement", d->model.placement.desc);
	hlog_end(&l);
	log_pools(d);
	return 0;
}

/* The copy device and the reload service on the queue; the statistics file from the start. */
static int start_reload(struct hybd *d, char *err, size_t errlen)
{
	struct hyb_reload_config rc = { 0 };
	struct hyb_reload_stats st;
	struct hlog l;

	if (start_device(d, err, errlen))
		return -1;
	rc.backend = d->b;
	rc.queue = d->cfg.queue;
	rc.model_path = d->cfg.model;
	rc.chunk = d->cfg.chunk;
	rc.dev = d->dev;
	rc.clients = d->cfg.clients;
	rc.on_done = on_reload_done;
	d->reload = hyb_reload_start(&rc, err, errlen);
	if (!d->reload)
		return -1;
	hlog_begin(&l, HLOG_INFO, "reload_ready");
	hlog_u64(&l, "queue", d->cfg.queue);
	hlog_u64(&l, "chunk", d->cfg.chunk);
	hlog_str(&l, "stats", d->stats_path);
	hlog_end(&l);
	/* hybctl stalls finds a running hybd by this file: there from the start */
	hyb_reload_stats(d->reload, &st);
	write_stats_file(d, &st);
	d->last_log_ns = now_ns();
	return 0;
}

/* Last: a published manifest means a model completely in its pools. */
static int start_publish(struct hybd *d, char *err, size_t errlen)
{
	char pool[HYB_MEMPOOL_NAME_LEN + 16];
	struct hlog l;

	snprintf(pool, sizeof(pool), "%s.manifest", d->cfg.name);
	if (hyb_mf_publish(d->b, pool, d->manifest_path, d->model.manifest,
			   d->model.manifest_len, &d->pub, err, errlen))
		return -1;
	hlog_begin(&l, HLOG_INFO, "ready");
	hlog_str(&l, "manifest", d->manifest_path);
	hlog_str(&l, "manifest_pool", pool);
	hlog_u64(&l, "manifest_bytes", d->model.manifest_len);
	hlog_u64(&l, "pools", d->model.n_pools);
	hlog_end(&l);
	return 0;
}

int hybd_start(const struct hybd_config *cfg, bool (*cancelled)(void *arg), void *arg,
	       struct hybd **out, char *err, size_t errlen)
{
	struct hybd *d = calloc(1, sizeof(*d));
	struct hlog l;

	*out = NULL;
	if (!d) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	d->cfg = *cfg;
	d->cancelled = cancelled;
	d->cancel_arg = arg;
	if (hybd_config_check(&d->cfg, err, errlen))
		goto fail;
	if (d->cfg.nodes_all)
		resolve_nodes(&d->cfg.place);
	hlog_begin(&l, HLOG_INFO, "start");
	hlog_i64(&l, "pid", getpid());
	hlog_str(&l, "model", d->cfg.model);
	hlog_str(&l, "name", d->cfg.name);
	hlog_u64(&l, "queue", d->cfg.queue);
	hlog_end(&l);
	if (start_backend(d, err, errlen) || start_load(d, err, errlen) ||
	    start_reload(d, err, errlen) || start_publish(d, err, errlen))
		goto fail;
	*out = d;
	return 0;

fail:
	hlog_msg(HLOG_ERROR, "error", "%s", err);
	undo(d);
	free(d);
	return -1;
}

/* -- serve and stop ------------------------------------------------------ */

static void log_lat(struct hlog *l, const char *name, const struct hyb_lat_stat *s)
{
	char k[32];

	snprintf(k, sizeof(k), "%s_p50_us", name);
	hlog_f64(l, k, s->p50_ns / 1e3);
	snprintf(k, sizeof(k), "%s_p99_us", name);
	hlog_f64(l, k, s->p99_ns / 1e3);
}

static void log_stats(const struct hyb_reload_stats *st, const char *event)
{
	for (int c = 0; c < HYB_RELOAD_CLASSES; c++) {
		const struct hyb_reload_class_stats *cs = &st->cls[c];
		struct hlog l;

		hlog_begin(&l, HLOG_INFO, event);
		hlog_str(&l, "class", hyb_reload_class_name(c));
		hlog_u64(&l, "done", cs->done);
		hlog_u64(&l, "failed", cs->failed);
		hlog_u64(&l, "bytes", cs->bytes);
		hlog_u64(&l, "preemptions", cs->preemptions);
		hlog_u64(&l, "max_slices_waited", cs->max_slices_waited);
		log_lat(&l, "wait", &cs->wait);
		log_lat(&l, "service", &cs->service);
		log_lat(&l, "total", &cs->total);
		hlog_u64(&l, "backlog", st->backlog);
		hlog_end(&l);
	}
}

void hybd_stats_tick(struct hybd *d)
{
	struct hyb_reload_stats st;

	if (!d->reload)
		return;
	hyb_reload_stats(d->reload, &st);
	/* a line per class when there was traffic since the last one; the file always */
	if (st.fetched != d->last_fetched)
		log_stats(&st, "stats");
	d->last_fetched = st.fetched;
	d->last_log_ns = now_ns();
	write_stats_file(d, &st);
}

/*
 * Every second the statistics file, when requests came or finished since
 * the last one (hybctl stalls -w refreshes every second); every
 * stats_interval the log lines.
 */
int hybd_serve(struct hybd *d, int sigfd)
{
	struct pollfd pfd = { .fd = sigfd, .events = POLLIN };
	uint64_t interval_ns = (uint64_t)d->cfg.stats_interval * 1000000000ull;

	for (;;) {
		struct signalfd_siginfo si;
		int r = poll(&pfd, 1, 1000);

		if (r < 0 && errno != EINTR)
			return SIGTERM;	/* cannot wait for signals: shut down cleanly */
		if (r == 0) {
			if (interval_ns && now_ns() - d->last_log_ns >= interval_ns - 500000000ull)
				hybd_stats_tick(d);
			else
				refresh_stats_file(d);
			continue;
		}
		if (r < 0 || read(sigfd, &si, sizeof(si)) != (ssize_t)sizeof(si))
			continue;
		if (si.ssi_signo == SIGHUP) {
			hlog_reopen();
			hlog_msg(HLOG_INFO, "reopen", "log file reopened (SIGHUP)");
			continue;
		}
		if (si.ssi_signo == SIGTERM || si.ssi_signo == SIGINT)
			return (int)si.ssi_signo;
	}
}

void hybd_stop(struct hybd *d, const char *why)
{
	struct hyb_reload_stats st;
	struct hlog l;

	if (!d)
		return;
	hlog_msg(HLOG_INFO, "shutdown", "%s", why);
	/* first: nobody finds the model any more, while its pools still exist */
	hyb_mf_retire(&d->pub);
	hlog_msg(HLOG_INFO, "manifest_retired", "%s", d->manifest_path);
	if (d->reload) {
		hyb_reload_stop(d->reload, &st);
		d->reload = NULL;
		hlog_begin(&l, HLOG_INFO, "reload_stopped");
		hlog_u64(&l, "fetched", st.fetched);
		hlog_u64(&l, "slices", st.slices);
		hlog_end(&l);
		log_stats(&st, "final_stats");
	}
	undo(d);
	hlog_msg(HLOG_INFO, "stopped", "pools destroyed, manifest removed");
	free(d);
}

const char *hybd_manifest_path(const struct hybd *d)
{
	return d->manifest_path;
}

struct hyb_backend *hybd_backend(const struct hybd *d)
{
	return d->b;
}
