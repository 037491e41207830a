// SPDX-License-Identifier: MIT
/*
 * The device layer's front end (hyb/device.h): argument checks, the sticky
 * fault, the capacity accounting and the table of live allocations, the
 * copy and kernel counters, then the implementation's ops
 * (device_internal.h says what each op may take for granted).
 *
 * Every device range a copy or kernel names is checked against the live
 * allocations here, for both implementations: an engine bug then fails with
 * a message naming the argument instead of a GPU memory fault (CUDA) or a
 * silent overwrite of host memory (cpu device).
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device_graph.h"
#include "device_internal.h"
#include "sparse_ffn_kernels.h"
#include "util/error.h"
#include "hyb/tensor_type.h"

/* Live allocations, sorted by base: a handful, made at set-up. */
struct hyb_device_allocs {
	size_t n, cap;
	struct {
		hyb_dptr base;
		uint64_t size;
		bool adopted;	/* another owner's memory (hyb_device_adopt): never freed here */
	} a[];
};

int hyb_device_fail(struct hyb_device *d, int rc, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	hyb_error_vset(rc, fmt, ap);
	va_end(ap);
	if (!d)
		return rc;
	/* the device keeps its own copy: a fault is sticky (hyb_device_error) */
	snprintf(d->err, sizeof(d->err), "%s", hyb_last_error());
	if (rc == -EIO)
		d->faulted = true;
	if (d->cap)
		hyb_capture_spoil(d, rc);
	return rc;
}

/*
 * A CUDA build links kernels/cuda/device_cuda.o, whose strong definition
 * replaces this one. (It must be linked as an object: a weak definition
 * already satisfies the symbol, so the linker would not pull it from an
 * archive.)
 */
__attribute__((weak)) struct hyb_device *hyb_device_cuda_open(const struct hyb_device_config *cfg,
							      char *err, size_t errlen)
{
	(void)cfg;
	snprintf(err, errlen, "libhyb was built without CUDA (no nvcc)");
	return NULL;
}

static bool bad_num(double v)
{
	return !isfinite(v) || v < 0;
}

static struct hyb_device *device_open(const char *kind, const struct hyb_device_config *cfg,
				      char *err, size_t errlen)
{
	struct hyb_device_config c = { 0 };
	struct hyb_device *d;
	char buf[256];
	bool cpu;

	if (!err || !errlen) {
		err = buf;
		errlen = sizeof(buf);
	}
	err[0] = 0;
	if (!kind) {
		snprintf(err, errlen, "device: no kind given (cpu, cuda)");
		return NULL;
	}
	cpu = !strcmp(kind, "cpu");
	if (!cpu && strcmp(kind, "cuda")) {
		snprintf(err, errlen, "device: unknown kind '%.64s' (cpu, cuda)", kind);
		return NULL;
	}
	if (cfg)
		c = *cfg;
	if (bad_num(c.pcie_gbps) || bad_num(c.pcie_lat_us) || bad_num(c.hbm_gbps) ||
	    bad_num(c.launch_us) || bad_num(c.tflops) || bad_num(c.host_gbps)) {
		snprintf(err, errlen,
			 "device: bad config (pcie %g GB/s, lat %g us, hbm %g GB/s, launch %g us, "
			 "%g TFLOP/s, host %g GB/s)", c.pcie_gbps, c.pcie_lat_us, c.hbm_gbps,
			 c.launch_us, c.tflops, c.host_gbps);
		return NULL;
	}
	if (!cpu && c.virtual_clock) {
		snprintf(err, errlen, "device: a virtual clock is the cpu device's (a GPU's time is "
			 "real)");
		return NULL;
	}
	if (c.ordinal < 0) {
		snprintf(err, errlen, "device: bad CUDA device number %d", c.ordinal);
		return NULL;
	}
	if (cpu && !c.capacity)
		c.capacity = 1ull << 30;
	if (!c.chunk_bytes)
		c.chunk_bytes = 1ull << 20;
	if (c.pcie_gbps == 0)
		c.pcie_gbps = 25;
	if (c.pcie_lat_us == 0)
		c.pcie_lat_us = 8;
	if (c.hbm_gbps == 0)
		c.hbm_gbps = 2000;
	if (c.launch_us == 0)
		c.launch_us = 5;
	if (c.tflops == 0)
		c.tflops = 200;
	if (c.host_gbps == 0)
		c.host_gbps = 50;

	d = cpu ? hyb_device_cpu_open(&c, err, errlen) : hyb_device_cuda_open(&c, err, errlen);
	if (!d) {
		if (!err[0])
			snprintf(err, errlen, "device: cannot open a %s device", kind);
		return NULL;
	}
	d->used = 0;
	d->faulted = false;
	d->allocs = NULL;
	d->err[0] = 0;
	memset(&d->st, 0, sizeof(d->st));
	return d;
}

/* The reason of a failure goes to hyb_last_error() (hyb/error.h). */
struct hyb_device *hyb_device_open(const char *kind, const struct hyb_device_config *cfg)
{
	char msg[512] = "";
	struct hyb_device *r = device_open(kind, cfg, msg, sizeof(msg));

	if (!r)
		hyb_error_set(-EINVAL, "%s", msg);
	return r;
}

void hyb_device_close(struct hyb_device *d)
{
	if (!d)
		return;
	hyb_capture_drop(d);
	if (d->allocs) {
		/* last first, so each free finds its entry still listed */
		while (d->allocs->n) {
			if (!d->allocs->a[d->allocs->n - 1].adopted)
				d->ops->free(d, d->allocs->a[d->allocs->n - 1].base);
			d->allocs->n--;
		}
		free(d->allocs);
		d->allocs = NULL;
	}
	d->used = 0;
	d->ops->close(d);
}

const char *hyb_device_kind(const struct hyb_device *d)
{
	return d ? d->ops->kind : "none";
}

const char *hyb_device_error(const struct hyb_device *d)
{
	return d ? d->err : "no device";
}

uint64_t hyb_device_capacity(const struct hyb_device *d)
{
	return d ? d->capacity : 0;
}

void hyb_device_get_config(const struct hyb_device *d, struct hyb_device_config *out)
{
	if (!out)
		return;
	if (d)
		*out = d->cfg;
	else
		memset(out, 0, sizeof(*out));
}

uint64_t hyb_device_used(const struct hyb_device *d)
{
	return d ? d->used : 0;
}

double hyb_device_now(struct hyb_device *d)
{
	return d ? d->ops->now(d) : 0;
}

void hyb_device_host_work(struct hyb_device *d, double s)
{
	if (d && d->ops->host_work && s > 0 && isfinite(s))
		d->ops->host_work(d, s);
}

/* ---- the allocation table ---------------------------------------------------- */

/* Index of the last allocation with base <= p, or -1. */
static long find_le(const struct hyb_device_allocs *t, hyb_dptr p)
{
	size_t lo = 0, hi = t ? t->n : 0;

	while (lo < hi) {
		const size_t mid = lo + (hi - lo) / 2;

		if (t->a[mid].base <= p)
			lo = mid + 1;
		else
			hi = mid;
	}
	return (long)lo - 1;
}

uint64_t hyb_device_span(const struct hyb_device *d, hyb_dptr p)
{
	const long i = d ? find_le(d->allocs, p) : -1;

	if (i < 0 || p - d->allocs->a[i].base >= d->allocs->a[i].size)
		return 0;
	return d->allocs->a[i].base + d->allocs->a[i].size - p;
}

static int table_reserve(struct hyb_device *d)
{
	struct hyb_device_allocs *t = d->allocs;
	size_t cap;

	if (t && t->n < t->cap)
		return 0;
	cap = t ? 2 * t->cap : 16;
	t = realloc(t, sizeof(*t) + cap * sizeof(t->a[0]));
	if (!t)
		return hyb_device_fail(d, -ENOMEM, "device: out of host memory for the table");
	if (!d->allocs)
		t->n = 0;
	t->cap = cap;
	d->allocs = t;
	return 0;
}

/* 0 when [p, p + len) lies in one live allocation, else -EINVAL naming what. */
static int check_range(struct hyb_device *d, hyb_dptr p, uint64_t len, const char *what)
{
	const uint64_t span = hyb_device_span(d, p);

	if (span && len <= span)
		return 0;
	if (!span)
		return hyb_device_fail(d, -EINVAL, "%s: address %#llx is in no device allocation",
				       what, (unsigned long long)p);
	return hyb_device_fail(d, -EINVAL,
			       "%s: %llu bytes at %#llx overrun its allocation by %llu bytes", what,
			       (unsigned long long)len, (unsigned long long)p,
			       (unsigned long long)(len - span));
}

static int check_array(struct hyb_device *d, hyb_dptr p, uint64_t len, const char *what)
{
	if (p & 3)
		return hyb_device_fail(d, -EINVAL, "%s: address %#llx is not 4-byte aligned", what,
				       (unsigned long long)p);
	return check_range(d, p, len, what);
}

/* A batch of n vectors of `elems` floats whose byte size overflows (n >= 1). */
static bool batch_too_big(uint64_t elems, uint64_t n)
{
	return elems > UINT64_MAX / 16 / n;
}

/* The common checks: device present, not faulted, stream known. */
static int check_dev(struct hyb_device *d, int s, const char *what)
{
	if (!d)
		return -EINVAL;
	if (d->faulted)
		return -EIO; /* the fault's message stays */
	if (s < 0 || s >= HYB_N_STREAMS)
		return hyb_device_fail(d, -EINVAL, "%s: stream %d out of range", what, s);
	return 0;
}

/* ---- memory ------------------------------------------------------------------ */

int hyb_device_alloc(struct hyb_device *d, uint64_t bytes, hyb_dptr *out)
{
	struct hyb_device_allocs *t;
	hyb_dptr p = 0;
	long i;
	int rc;

	if (!d || !out)
		return -EINVAL;
	*out = 0;
	if (d->faulted)
		return -EIO;
	if ((rc = hyb_capture_busy(d, "device alloc")))
		return rc;
	if (!bytes)
		return hyb_device_fail(d, -EINVAL, "device alloc: zero bytes");
	if (bytes > d->capacity - d->used)
		return hyb_device_fail(d, -ENOMEM,
				       "device alloc: %llu bytes asked, %llu of %llu in use "
				       "(%llu free)",
				       (unsigned long long)bytes, (unsigned long long)d->used,
				       (unsigned long long)d->capacity,
				       (unsigned long long)(d->capacity - d->used));
	rc = table_reserve(d);
	if (rc)
		return rc;
	rc = d->ops->alloc(d, bytes, &p);
	if (rc)
		return rc;
	t = d->allocs;
	i = find_le(t, p);
	if (!p || (p & 255) || p + bytes < p || (i >= 0 && t->a[i].base + t->a[i].size > p) ||
	    ((size_t)(i + 1) < t->n && t->a[i + 1].base < p + bytes)) {
		/* an allocator bug: nothing sensible can follow */
		return hyb_device_fail(d, -EIO, "device alloc: bad address %#llx for %llu bytes",
				       (unsigned long long)p, (unsigned long long)bytes);
	}
	memmove(&t->a[i + 2], &t->a[i + 1], (t->n - (size_t)(i + 1)) * sizeof(t->a[0]));
	t->a[i + 1].base = p;
	t->a[i + 1].size = bytes;
	t->a[i + 1].adopted = false;
	t->n++;
	d->used += bytes;
	*out = p;
	return 0;
}

int hyb_device_adopt(struct hyb_device *d, hyb_dptr p, uint64_t bytes)
{
	struct hyb_device_allocs *t;
	long i;
	int rc = check_dev(d, 0, "device adopt");

	if (!rc)
		rc = hyb_capture_busy(d, "device adopt");
	if (rc)
		return rc;
	if (!p || !bytes || (p & 255) || p + bytes < p)
		return hyb_device_fail(d, -EINVAL, "device adopt: %llu bytes at %#llx (want a "
				       "256-byte aligned, non-empty range)",
				       (unsigned long long)bytes, (unsigned long long)p);
	rc = table_reserve(d);
	if (rc)
		return rc;
	t = d->allocs;
	i = find_le(t, p);
	if ((i >= 0 && t->a[i].base + t->a[i].size > p) ||
	    ((size_t)(i + 1) < t->n && t->a[i + 1].base < p + bytes))
		return hyb_device_fail(d, -EINVAL, "device adopt: %llu bytes at %#llx overlap an "
				       "allocation", (unsigned long long)bytes,
				       (unsigned long long)p);
	memmove(&t->a[i + 2], &t->a[i + 1], (t->n - (size_t)(i + 1)) * sizeof(t->a[0]));
	t->a[i + 1].base = p;
	t->a[i + 1].size = bytes;
	t->a[i + 1].adopted = true;
	t->n++;
	return 0;
}

void hyb_device_free(struct hyb_device *d, hyb_dptr p)
{
	struct hyb_device_allocs *t;
	long i;

	if (!d || !p)
		return;
	/* a free waits for queued work: refused, the memory stays (the error says so) */
	if (hyb_capture_busy(d, "device free"))
		return;
	t = d->allocs;
	i = find_le(t, p);
	if (i < 0 || t->a[i].base != p) {
		hyb_device_fail(d, -EINVAL, "device free: %#llx is not an allocation",
				(unsigned long long)p);
		return;
	}
	if (!t->a[i].adopted) {
		d->ops->free(d, p);
		d->used -= t->a[i].size;
	}
	memmove(&t->a[i], &t->a[i + 1], (t->n - (size_t)i - 1) * sizeof(t->a[0]));
	t->n--;
}

int hyb_device_host_register(struct hyb_device *d, void *p, size_t len)
{
	int rc = check_dev(d, 0, "host register");

	if (!rc)
		rc = hyb_capture_busy(d, "host register");
	if (rc)
		return rc;
	if (!p || !len)
		return hyb_device_fail(d, -EINVAL, "host register: %s", p ? "zero length" : "NULL");
	return d->ops->host_register(d, p, len);
}

int hyb_device_host_unregister(struct hyb_device *d, void *p)
{
	if (!d)
		return -EINVAL;
	if (!p)
		return hyb_device_fail(d, -EINVAL, "host unregister: NULL");
	int rc = hyb_capture_busy(d, "host unregister");

	return rc ? rc : d->ops->host_unregister(d, p);
}

void *hyb_device_host_alloc(struct hyb_device *d, size_t len)
{
	if (!d || d->faulted || !len || hyb_capture_busy(d, "host alloc"))
		return NULL;
	return d->ops->host_alloc(d, len);
}

void hyb_device_host_free(struct hyb_device *d, void *p)
{
	if (d && p && !hyb_capture_busy(d, "host free"))
		d->ops->host_free(d, p);
}

/* ---- copies, events ------------------------------------------------------------ */

int hyb_device_h2d(struct hyb_device *d, enum hyb_stream s, hyb_dptr dst, const void *src,
		   uint64_t len)
{
	int rc = check_dev(d, (int)s, "h2d");

	if (rc || !len)
		return rc;
	if (!src)
		return hyb_device_fail(d, -EINVAL, "h2d: NULL source");
	rc = check_range(d, dst, len, "h2d destination");
	if (!rc && (rc = hyb_capture_take(d, s, &(struct hyb_cap_node){
				.kind = CAP_H2D, .u.copy = { dst, (void *)src, len } })))
		return rc < 0 ? rc : 0;
	if (!rc)
		rc = d->ops->h2d(d, s, dst, src, len);
	if (!rc) {
		d->st.h2d_bytes[s] += len;
		d->st.copies[s]++;
	}
	return rc;
}

int hyb_device_d2h(struct hyb_device *d, enum hyb_stream s, void *dst, hyb_dptr src,
		   uint64_t len)
{
	int rc = check_dev(d, (int)s, "d2h");

	if (rc || !len)
		return rc;
	if (!dst)
		return hyb_device_fail(d, -EINVAL, "d2h: NULL destination");
	rc = check_range(d, src, len, "d2h source");
	if (!rc && (rc = hyb_capture_take(d, s, &(struct hyb_cap_node){
				.kind = CAP_D2H, .u.copy = { src, dst, len } })))
		return rc < 0 ? rc : 0;
	if (!rc)
		rc = d->ops->d2h(d, s, dst, src, len);
	if (!rc) {
		d->st.d2h_bytes[s] += len;
		d->st.copies[s]++;
	}
	return rc;
}

struct hyb_device_event *hyb_device_event_new(struct hyb_device *d)
{
	return d ? d->ops->event_new(d, false) : NULL;
}

struct hyb_device_event *hyb_device_event_new_timed(struct hyb_device *d)
{
	return d ? d->ops->event_new(d, true) : NULL;
}

void hyb_device_event_free(struct hyb_device *d, struct hyb_device_event *ev)
{
	if (d && ev)
		d->ops->event_free(d, ev);
}

int hyb_device_record(struct hyb_device *d, enum hyb_stream s, struct hyb_device_event *ev)
{
	int rc = check_dev(d, (int)s, "record");

	if (rc)
		return rc;
	if (!ev)
		return hyb_device_fail(d, -EINVAL, "record: NULL event");
	if ((rc = hyb_capture_record(d, s, ev)))
		return rc < 0 ? rc : 0;
	return d->ops->record(d, s, ev);
}

int hyb_device_wait(struct hyb_device *d, enum hyb_stream s, struct hyb_device_event *ev)
{
	int rc = check_dev(d, (int)s, "wait");

	if (rc)
		return rc;
	if (!ev)
		return hyb_device_fail(d, -EINVAL, "wait: NULL event");
	if ((rc = hyb_capture_wait(d, s, ev)))
		return rc < 0 ? rc : 0;
	return d->ops->wait(d, s, ev);
}

bool hyb_device_done(struct hyb_device *d, struct hyb_device_event *ev)
{
	/* a faulted device completes nothing more: say done, the next sync says why */
	if (!d || !ev || d->faulted)
		return true;
	return d->ops->done(d, ev);
}

int hyb_device_sync(struct hyb_device *d, struct hyb_device_event *ev)
{
	int rc = check_dev(d, 0, "sync");

	if (!rc)
		rc = hyb_capture_busy(d, "sync");
	if (rc)
		return rc;
	if (!ev)
		return hyb_device_fail(d, -EINVAL, "sync: NULL event");
	return d->ops->sync(d, ev);
}

int hyb_device_elapsed(struct hyb_device *d, struct hyb_device_event *a,
		       struct hyb_device_event *b, double *s)
{
	int rc = check_dev(d, 0, "elapsed");

	if (!rc)
		rc = hyb_capture_busy(d, "elapsed");
	if (rc)
		return rc;
	if (!a || !b || !s)
		return hyb_device_fail(d, -EINVAL, "elapsed: NULL argument");
	return d->ops->elapsed(d, a, b, s);
}

int hyb_device_host_fn(struct hyb_device *d, enum hyb_stream s, hyb_device_host_fn_t fn,
		       void *arg)
{
	int rc = check_dev(d, (int)s, "host fn");

	if (rc)
		return rc;
	if (!fn)
		return hyb_device_fail(d, -EINVAL, "host fn: NULL function");
	if (s == HYB_STREAM_RELOAD)
		return hyb_device_fail(d, -EINVAL, "host fn: not on the RELOAD stream (its work "
				       "is the copy lane's)");
	if (!d->ops->host_fn)
		return hyb_device_fail(d, -ENOSYS, "%s device: no host functions", d->ops->kind);
	if ((rc = hyb_capture_take(d, s, &(struct hyb_cap_node){ .kind = CAP_HOST_FN,
								.u.fn = { fn, arg } })))
		return rc < 0 ? rc : 0;
	return d->ops->host_fn(d, s, fn, arg);
}

/* ---- kernels -------------------------------------------------------------------- */

/* The CPU operator's types (sparse_ffn_kernels.h); CUDA: kernels/cuda/sparse_ffn.cu, but F32. */
bool hyb_device_ffn_type_ok(uint32_t t)
{
	return hyb_sparse_type_ok(t);
}

static int check_ffn(struct hyb_device *d, const struct hyb_dev_ffn *f)
{
	const uint32_t t = f->type;
	const uint64_t nb = f->batch ? f->batch : 1;
	uint64_t rb, n_groups;
	int rc;

	if (!hyb_device_ffn_type_ok(t))
		return hyb_device_fail(d, -EINVAL, "sparse ffn: weight type %s not supported (%s)",
				       hyb_type_name(t), hyb_sparse_type_list());
	if (!f->n_embd || !f->n_ff || !f->group_size)
		return hyb_device_fail(d, -EINVAL,
				       "sparse ffn: zero size (n_embd %u, n_ff %u, group size %u)",
				       f->n_embd, f->n_ff, f->group_size);
	rb = hyb_row_bytes(t, f->n_embd);
	if (!rb)
		return hyb_device_fail(d, -EINVAL,
				       "sparse ffn: n_embd %u not a multiple of the %s block",
				       f->n_embd, hyb_type_name(t));
	if ((unsigned)f->act > HYB_ACT_GELU)
		return hyb_device_fail(d, -EINVAL, "sparse ffn: unknown activation %d",
				       (int)f->act);
	if (!(f->thr >= 0) || !isfinite(f->thr) ||
	    (f->thr > 0 && f->act != HYB_ACT_SILU && f->act != HYB_ACT_GELU))
		return hyb_device_fail(d, -EINVAL, "sparse ffn: a threshold (%g) is for SiLU and "
				       "GeGLU FFNs (CATS), finite and >= 0", (double)f->thr);
	if (f->slot_bytes / 3 / f->group_size < rb)
		return hyb_device_fail(d, -EINVAL,
				       "sparse ffn: slot of %llu bytes < 3 x %u rows of %llu bytes",
				       (unsigned long long)f->slot_bytes, f->group_size,
				       (unsigned long long)rb);
	if (f->n_active > f->n_ff)
		return hyb_device_fail(d, -EINVAL, "sparse ffn: %u active neurons of %u",
				       f->n_active, f->n_ff);
	if (batch_too_big(f->n_embd, nb))
		return hyb_device_fail(d, -EINVAL, "sparse ffn: a batch of %u is too big",
				       f->batch);
	n_groups = ((uint64_t)f->n_ff + f->group_size - 1) / f->group_size;
	rc = check_array(d, f->xn, 4ull * f->n_embd * nb, "sparse ffn xn");
	if (!rc)
		rc = check_array(d, f->y, 4ull * f->n_embd * nb, "sparse ffn y");
	if (!rc && f->n_active) {
		rc = check_array(d, f->active, 4ull * f->n_active, "sparse ffn active");
		if (!rc)
			rc = check_array(d, f->table, 4 * n_groups, "sparse ffn table");
		if (!rc)
			rc = check_range(d, f->cache, 1, "sparse ffn cache");
	}
	return rc;
}

int hyb_device_sparse_ffn(struct hyb_device *d, enum hyb_stream s, const struct hyb_dev_ffn *f)
{
	int rc = check_dev(d, (int)s, "sparse ffn");

	if (rc)
		return rc;
	if (!f)
		return hyb_device_fail(d, -EINVAL, "sparse ffn: NULL arguments");
	rc = check_ffn(d, f);
	if (!rc && (rc = hyb_capture_take(d, s, &(struct hyb_cap_node){
				.kind = CAP_SPARSE_FFN, .u.ffn = *f })))
		return rc < 0 ? rc : 0;
	if (!rc)
		rc = d->ops->sparse_ffn(d, s, f);
	if (!rc)
		d->st.kernels++;
	return rc;
}

int hyb_device_add(struct hyb_device *d, enum hyb_stream s, hyb_dptr y, hyb_dptr x, uint32_t n)
{
	int rc = check_dev(d, (int)s, "add");

	if (rc || !n)
		return rc;
	rc = check_array(d, y, 4ull * n, "add y");
	if (!rc)
		rc = check_array(d, x, 4ull * n, "add x");
	if (!rc && (rc = hyb_capture_take(d, s, &(struct hyb_cap_node){
				.kind = CAP_ADD, .u.add = { y, x, n } })))
		return rc < 0 ? rc : 0;
	if (!rc)
		rc = d->ops->add(d, s, y, x, n);
	if (!rc)
		d->st.kernels++;
	return rc;
}

int hyb_device_ffn_act(struct hyb_device *d, enum hyb_stream s, hyb_dptr g, hyb_dptr u,
		       uint32_t n, enum hyb_ffn_act act)
{
	int rc = check_dev(d, (int)s, "ffn_act");

	if (rc)
		return rc;
	if (act != HYB_ACT_SILU && act != HYB_ACT_GELU && act != HYB_ACT_RELU &&
	    act != HYB_ACT_RELU2 && act != HYB_ACT_DRELU)
		return hyb_device_fail(d, -EINVAL, "ffn_act: activation %d", (int)act);
	if (!n)
		return 0;
	if (!d->ops->ffn_act)
		return hyb_device_fail(d, -ENOSYS, "%s device: no ffn_act kernel", d->ops->kind);
	rc = check_array(d, g, 4ull * n, "ffn_act g");
	if (!rc)
		rc = check_array(d, u, 4ull * n, "ffn_act u");
	if (!rc && g < u + 4ull * n && u < g + 4ull * n)
		rc = hyb_device_fail(d, -EINVAL, "ffn_act: g and u overlap");
	if (!rc && (rc = hyb_capture_take(d, s, &(struct hyb_cap_node){
				.kind = CAP_FFN_ACT, .u.act = { g, u, n, act } })))
		return rc < 0 ? rc : 0;
	if (!rc)
		rc = d->ops->ffn_act(d, s, g, u, n, act);
	if (!rc)
		d->st.kernels++;
	return rc;
}

/*
 * The dense kernels (rmsnorm, matvec, attention). Besides the ranges, the
 * arrays an op writes must not overlap what it reads (rmsnorm: y may equal
 * x exactly): a GPU kernel reads and writes them from many threads at once,
 * so an overlap would give a result that depends on their timing.
 */

/* An implementation without the kernel (a CUDA build in progress): -ENOSYS. */
static int check_op(struct hyb_device *d, bool have, const char *name)
{
	if (have)
		return 0;
	return hyb_device_fail(d, -ENOSYS, "%s device: no %s kernel", d->ops->kind, name);
}

static int check_aligned(struct hyb_device *d, hyb_dptr p, uint64_t len, unsigned align,
			 const char *what)
{
	if (p % align)
		return hyb_device_fail(d, -EINVAL, "%s: address %#llx is not %u-byte aligned",
				       what, (unsigned long long)p, align);
	return check_range(d, p, len, what);
}

/* A device array for the overlap checks. */
struct darr {
	hyb_dptr p;
	uint64_t len;
	const char *name;
};

static bool overlap(const struct darr *a, const struct darr *b)
{
	return a->p < b->p + b->len && b->p < a->p + a->len;
}

/* -EINVAL naming the first two of the n arrays that overlap; 0 when none. */
static int check_disjoint(struct hyb_device *d, const char *op, const struct darr *a, int n)
{
	for (int i = 0; i < n; i++)
		for (int j = i + 1; j < n; j++)
			if (overlap(&a[i], &a[j]))
				return hyb_device_fail(d, -EINVAL, "%s: %s overlaps %s", op,
						       a[j].name, a[i].name);
	return 0;
}

int hyb_device_rmsnorm(struct hyb_device *d, enum hyb_stream s, hyb_dptr y, hyb_dptr x,
		       hyb_dptr w, uint32_t n, float eps)
{
	return hyb_device_rmsnorm_rows(d, s, y, x, w, n, 1, eps);
}

int hyb_device_rmsnorm_rows(struct hyb_device *d, enum hyb_stream s, hyb_dptr y, hyb_dptr x,
			    hyb_dptr w, uint32_t n, uint32_t rows, float eps)
{
	const uint64_t len = batch_too_big(n, rows ? rows : 1) ? UINT64_MAX : 4ull * n * rows;
	const struct darr yw[2] = { { w, 4ull * n, "w" }, { y, len, "y" } };
	const struct darr yx[2] = { { x, len, "x" }, { y, len, "y" } };
	int rc = check_dev(d, (int)s, "rmsnorm");

	if (!rc)
		rc = check_op(d, d->ops->rmsnorm != NULL, "rmsnorm");
	if (rc)
		return rc;
	if (!n || !rows)
		return hyb_device_fail(d, -EINVAL, "rmsnorm: zero size (n %u, rows %u)", n, rows);
	if (len == UINT64_MAX)
		return hyb_device_fail(d, -EINVAL, "rmsnorm: %u rows of %u are too many", rows, n);
	if (!isfinite(eps) || eps < 0)
		return hyb_device_fail(d, -EINVAL, "rmsnorm: eps %g is not finite and >= 0",
				       (double)eps);
	rc = check_array(d, y, len, "rmsnorm y");
	if (!rc)
		rc = check_array(d, x, len, "rmsnorm x");
	if (!rc)
		rc = check_array(d, w, 4ull * n, "rmsnorm w");
	if (!rc && y != x)
		rc = check_disjoint(d, "rmsnorm", yx, 2);
	if (!rc)
		rc = check_disjoint(d, "rmsnorm", yw, 2);
	if (!rc && (rc = hyb_capture_take(d, s, &(struct hyb_cap_node){
				.kind = CAP_RMSNORM, .u.norm = { y, x, w, n, rows, eps } })))
		return rc < 0 ? rc : 0;
	if (!rc)
		rc = d->ops->rmsnorm(d, s, y, x, w, n, rows, eps);
	if (!rc)
		d->st.kernels++;
	return rc;
}

/* The weight types the dense kernels take (hyb/device.h struct hyb_dev_matvec). */
bool hyb_device_matvec_type_ok(uint32_t t)
{
	/* the sparse operator's types are exactly these (BF16 is neither's) */
	return hyb_sparse_type_ok(t);
}

/*
 * Weights: F16 and the 2-byte scales of the quantized blocks need 2 bytes
 * (Q8_0/Q4_0/Q4_K start with theirs; Q6_K's 210-byte blocks put it last, so
 * its rows are only ever 2-byte aligned).
 */
static int check_matvec(struct hyb_device *d, const struct hyb_dev_matvec *m)
{
	const uint32_t t = m->type;
	const uint64_t nb = m->batch ? m->batch : 1;
	struct darr a[3] = {
		{ m->w, 0, "w" }, { m->x, 4ull * m->n_in * nb, "x" },
		{ m->y, 4ull * m->n_out * nb, "y" },
	};
	uint64_t rb;
	int rc;

	if (!hyb_device_matvec_type_ok(t))
		return hyb_device_fail(d, -EINVAL, "matvec: weight type %s not supported (%s)",
				       hyb_type_name(t), hyb_sparse_type_list());
	if (!m->n_in || !m->n_out)
		return hyb_device_fail(d, -EINVAL, "matvec: zero size (n_in %u, n_out %u)",
				       m->n_in, m->n_out);
	if (batch_too_big(m->n_in > m->n_out ? m->n_in : m->n_out, nb))
		return hyb_device_fail(d, -EINVAL, "matvec: a batch of %u is too big", m->batch);
	rb = hyb_row_bytes(t, m->n_in);
	if (!rb)
		return hyb_device_fail(d, -EINVAL,
				       "matvec: n_in %u not a multiple of the %s block (%u)",
				       m->n_in, hyb_type_name(t), hyb_type_info(t)->blck);
	if (rb > UINT64_MAX / m->n_out)
		return hyb_device_fail(d, -EINVAL, "matvec: %u rows of %llu bytes are too many",
				       m->n_out, (unsigned long long)rb);
	a[0].len = rb * m->n_out;
	rc = check_aligned(d, m->w, a[0].len, t == HYB_TYPE_F32 ? 4 : 2, "matvec w");
	if (!rc)
		rc = check_array(d, m->x, a[1].len, "matvec x");
	if (!rc)
		rc = check_array(d, m->y, a[2].len, "matvec y");
	if (!rc)
		rc = check_disjoint(d, "matvec", a, 3);
	return rc;
}

int hyb_device_matvec(struct hyb_device *d, enum hyb_stream s, const struct hyb_dev_matvec *m)
{
	int rc = check_dev(d, (int)s, "matvec");

	if (!rc)
		rc = check_op(d, d->ops->matvec != NULL, "matvec");
	if (rc)
		return rc;
	if (!m)
		return hyb_device_fail(d, -EINVAL, "matvec: NULL arguments");
	rc = check_matvec(d, m);
	if (!rc && (rc = hyb_capture_take(d, s, &(struct hyb_cap_node){
				.kind = CAP_MATVEC, .u.mv = *m })))
		return rc < 0 ? rc : 0;
	if (!rc)
		rc = d->ops->matvec(d, s, m);
	if (!rc)
		d->st.kernels++;
	return rc;
}

/* item j's y against item i's arrays (and i's y against j's w and x) */
static int check_group_pair(struct hyb_device *d, const struct hyb_dev_matvec *a,
			    const struct hyb_dev_matvec *b, uint32_t i, uint32_t j)
{
	const uint64_t nb = a->batch ? a->batch : 1, rb = hyb_row_bytes(a->type, a->n_in);
	const struct darr wa = { a->w, rb * a->n_out, "w" }, xa = { a->x, 4ull * a->n_in * nb, "x" };
	const struct darr ya = { a->y, 4ull * a->n_out * nb, "y" };
	const struct darr wb = { b->w, rb * b->n_out, "w" }, xb = { b->x, 4ull * b->n_in * nb, "x" };
	const struct darr yb = { b->y, 4ull * b->n_out * nb, "y" };

	if (overlap(&yb, &wa) || overlap(&yb, &xa) || overlap(&yb, &ya) || overlap(&ya, &wb) ||
	    overlap(&ya, &xb))
		return hyb_device_fail(d, -EINVAL, "matvec group: item %u's arrays overlap item "
				       "%u's (an output must be no other item's input or output)",
				       j, i);
	return 0;
}

int hyb_device_matvec_group(struct hyb_device *d, enum hyb_stream s,
			    const struct hyb_dev_matvec *m, uint32_t n)
{
	int rc = check_dev(d, (int)s, "matvec group");

	if (!rc)
		rc = check_op(d, d->ops->matvec != NULL, "matvec");
	if (rc)
		return rc;
	if (!m && n)
		return hyb_device_fail(d, -EINVAL, "matvec group: NULL arguments");
	if (n > HYB_DEVICE_GROUP_MAX)
		return hyb_device_fail(d, -EINVAL, "matvec group: %u items (at most %u)", n,
				       HYB_DEVICE_GROUP_MAX);
	for (uint32_t i = 0; i < n && !rc; i++) {
		if (m[i].type != m[0].type || m[i].n_in != m[0].n_in || m[i].n_out != m[0].n_out ||
		    m[i].accumulate != m[0].accumulate || (m[i].batch ? m[i].batch : 1) !=
		    (m[0].batch ? m[0].batch : 1))
			return hyb_device_fail(d, -EINVAL, "matvec group: item %u is not item 0's "
					       "type and shape", i);
		rc = check_matvec(d, &m[i]);
	}
	for (uint32_t i = 0; i < n && !rc; i++)
		for (uint32_t j = i + 1; j < n && !rc; j++)
			rc = check_group_pair(d, &m[i], &m[j], i, j);
	if (rc || !n)
		return rc;
	if (!rc && (rc = hyb_capture_take(d, s, &(struct hyb_cap_node){
				.kind = CAP_MATVEC_GROUP, .u.group = { m, n } })))
		return rc < 0 ? rc : 0;
	if (d->ops->matvec_group) {
		rc = d->ops->matvec_group(d, s, m, n);
		if (!rc)
			d->st.kernels++;
		return rc;
	}
	for (uint32_t i = 0; i < n && !rc; i++) {
		rc = d->ops->matvec(d, s, &m[i]);
		if (!rc)
			d->st.kernels++;
	}
	return rc;
}

int hyb_device_matvec_table(struct hyb_device *d, enum hyb_stream s,
			    const struct hyb_dev_matvec_table *t)
{
	int rc = check_dev(d, (int)s, "matvec table");
	uint64_t slot, wlen;

	if (!rc)
		rc = check_op(d, d->ops->matvec_table != NULL, "matvec table");
	if (rc)
		return rc;
	if (!t)
		return hyb_device_fail(d, -EINVAL, "matvec table: NULL arguments");
	if (!t->max || t->max > HYB_DEVICE_GROUP_MAX)
		return hyb_device_fail(d, -EINVAL, "matvec table: max %u items (1 to %u)", t->max,
				       HYB_DEVICE_GROUP_MAX);
	if (!t->n_w || !t->n_x || !t->n_y)
		return hyb_device_fail(d, -EINVAL, "matvec table: %u slots, %u x rows, %u y rows",
				       t->n_w, t->n_x, t->n_y);
	/* slot 0 and row 0 as one matvec: type, shape, alignment */
	const struct hyb_dev_matvec m0 = { .type = t->type, .n_in = t->n_in, .n_out = t->n_out,
					   .w = t->w, .x = t->x, .y = t->y,
					   .accumulate = t->accumulate };

	if ((rc = check_matvec(d, &m0)))
		return rc;
	slot = hyb_row_bytes(t->type, t->n_in) * t->n_out;
	if (t->n_w > 1 && (t->w_stride % 16 || t->w_stride < slot ||
			   t->w_stride > (UINT64_MAX - slot) / (t->n_w - 1)))
		return hyb_device_fail(d, -EINVAL, "matvec table: w_stride %llu (a multiple of 16, "
				       "at least a slot's %llu bytes)",
				       (unsigned long long)t->w_stride, (unsigned long long)slot);
	if (batch_too_big(t->n_in, t->n_x) || batch_too_big(t->n_out, t->n_y))
		return hyb_device_fail(d, -EINVAL, "matvec table: %u x rows or %u y rows are too "
				       "many", t->n_x, t->n_y);
	wlen = (t->n_w - 1) * t->w_stride + slot;
	const struct darr a[4] = {
		{ t->w, wlen, "w" }, { t->x, 4ull * t->n_in * t->n_x, "x" },
		{ t->y, 4ull * t->n_out * t->n_y, "y" }, { t->items, 4 + 12ull * t->max, "items" },
	};

	rc = check_range(d, t->w, wlen, "matvec table w");
	if (!rc)
		rc = check_array(d, t->x, a[1].len, "matvec table x");
	if (!rc)
		rc = check_array(d, t->y, a[2].len, "matvec table y");
	if (!rc)
		rc = check_array(d, t->items, a[3].len, "matvec table items");
	for (int i = 0; i < 4 && !rc; i++) /* only y is written */
		if (i != 2 && overlap(&a[2], &a[i]))
			rc = hyb_device_fail(d, -EINVAL, "matvec table: y overlaps %s", a[i].name);
	if (!rc && (rc = hyb_capture_take(d, s, &(struct hyb_cap_node){
				.kind = CAP_MATVEC_TABLE, .u.table = *t })))
		return rc < 0 ? rc : 0;
	if (!rc)
		rc = d->ops->matvec_table(d, s, t);
	if (!rc)
		d->st.kernels++;
	return rc;
}

bool hyb_device_teal_type_ok(uint32_t t)
{
	/* TEAL's transposed layout's types (libhyb/sparse/teal.c) */
	return t == HYB_TYPE_F32 || t == HYB_TYPE_F16 || t == HYB_TYPE_Q8_0 || t == HYB_TYPE_Q4_0;
}

static int check_teal(struct hyb_device *d, const struct hyb_dev_teal *t)
{
	const uint64_t nb = t->batch ? t->batch : 1;
	struct darr a[3] = {
		{ t->w, 0, "w" }, { t->x, 4ull * t->n_in * nb, "x" },
		{ t->y, 4ull * t->n_out * nb, "y" },
	};
	uint64_t rb;
	int rc;

	if (!hyb_device_teal_type_ok(t->type))
		return hyb_device_fail(d, -EINVAL, "teal: weight type %s not supported (F32, F16, "
				       "Q8_0, Q4_0)", hyb_type_name(t->type));
	if (!t->n_in || !t->n_out)
		return hyb_device_fail(d, -EINVAL, "teal: zero size (n_in %u, n_out %u)", t->n_in,
				       t->n_out);
	if (!isfinite(t->thr) || t->thr < 0)
		return hyb_device_fail(d, -EINVAL, "teal: threshold %g: must be finite and >= 0",
				       (double)t->thr);
	if (batch_too_big(t->n_in > t->n_out ? t->n_in : t->n_out, nb))
		return hyb_device_fail(d, -EINVAL, "teal: a batch of %u is too big", t->batch);
	rb = hyb_row_bytes(t->type, t->n_out);
	if (!rb)
		return hyb_device_fail(d, -EINVAL, "teal: n_out %u not a multiple of the %s block "
				       "(%u)", t->n_out, hyb_type_name(t->type),
				       hyb_type_info(t->type)->blck);
	if (t->row_bytes && (t->row_bytes < rb || t->row_bytes % 4 || t->row_bytes > 1ull << 40))
		return hyb_device_fail(d, -EINVAL, "teal: a row stride of %llu bytes for rows of "
				       "%llu", (unsigned long long)t->row_bytes,
				       (unsigned long long)rb);
	/* the last row's n_out elements end the rows read (a stride may run past them) */
	a[0].len = (t->row_bytes ? t->row_bytes : rb) * (t->n_in - 1ull) + rb;
	rc = check_aligned(d, t->w, a[0].len, t->type == HYB_TYPE_F32 ? 4 : 2, "teal w");
	if (!rc)
		rc = check_array(d, t->x, a[1].len, "teal x");
	if (!rc)
		rc = check_array(d, t->y, a[2].len, "teal y");
	if (!rc)
		rc = check_disjoint(d, "teal", a, 3);
	return rc;
}

int hyb_device_teal_matvec(struct hyb_device *d, enum hyb_stream s, const struct hyb_dev_teal *t)
{
	int rc = check_dev(d, (int)s, "teal");

	if (!rc)
		rc = check_op(d, d->ops->teal != NULL, "teal");
	if (rc)
		return rc;
	if (!t)
		return hyb_device_fail(d, -EINVAL, "teal: NULL arguments");
	rc = check_teal(d, t);
	if (!rc && (rc = hyb_capture_take(d, s, &(struct hyb_cap_node){
				.kind = CAP_TEAL, .u.teal = *t })))
		return rc < 0 ? rc : 0;
	if (!rc)
		rc = d->ops->teal(d, s, t);
	if (!rc)
		d->st.kernels++;
	return rc;
}

static int check_attn(struct hyb_device *d, const struct hyb_dev_attn *a)
{
	const uint64_t q_dim = (uint64_t)a->n_head * a->head_dim; /* < 2^40 */
	const uint64_t kv_dim = (uint64_t)a->n_head_kv * a->head_dim;
	const uint64_t cache = a->n_ctx && kv_dim <= UINT64_MAX / 4 / a->n_ctx ?
			       2 * kv_dim * a->n_ctx : UINT64_MAX;
	const uint64_t nb = a->batch ? a->batch : 1;
	const struct darr arr[6] = {
		{ a->q, 4 * q_dim * nb, "q" },      { a->k, 4 * kv_dim * nb, "k" },
		{ a->v, 4 * kv_dim * nb, "v" },     { a->kcache, cache, "kcache" },
		{ a->vcache, cache, "vcache" },     { a->out, 4 * q_dim * nb, "out" },
	};
	int rc;

	if (!a->n_head || !a->n_head_kv || !a->head_dim || !a->n_ctx)
		return hyb_device_fail(d, -EINVAL,
				       "attention: zero size (n_head %u, n_head_kv %u, head_dim "
				       "%u, n_ctx %u)", a->n_head, a->n_head_kv, a->head_dim,
				       a->n_ctx);
	if (a->n_head % a->n_head_kv)
		return hyb_device_fail(d, -EINVAL,
				       "attention: n_head %u not a multiple of n_head_kv %u",
				       a->n_head, a->n_head_kv);
	if (a->head_dim % 2 || a->head_dim > 256)
		return hyb_device_fail(d, -EINVAL, "attention: head_dim %u not even and <= 256",
				       a->head_dim);
	if (a->n_rot % 2 || a->n_rot > a->head_dim)
		return hyb_device_fail(d, -EINVAL,
				       "attention: n_rot %u not even and <= head_dim %u", a->n_rot,
				       a->head_dim);
	if (a->pos_at && nb > 1)
		return hyb_device_fail(d, -EINVAL, "attention: a batch of %u with its position in "
				       "device memory", a->batch);
	if (!a->pos_at && (a->pos >= a->n_ctx || nb > a->n_ctx - a->pos))
		return hyb_device_fail(d, -EINVAL,
				       "attention: pos %u (a batch of %llu) outside a cache of %u rows",
				       a->pos, (unsigned long long)nb, a->n_ctx);
	if (batch_too_big(q_dim > kv_dim ? q_dim : kv_dim, nb))
		return hyb_device_fail(d, -EINVAL, "attention: a batch of %u is too big", a->batch);
	if (!a->rope)
		return hyb_device_fail(d, -EINVAL, "attention: no rope parameters");
	if (!isfinite(a->rope->base) || !(a->rope->base > 0) || !isfinite(a->rope->freq_scale) ||
	    !isfinite(a->rope->ext_factor) || !isfinite(a->rope->attn_factor))
		return hyb_device_fail(d, -EINVAL, "attention: bad rope base %g or scale %g",
				       (double)a->rope->base, (double)a->rope->freq_scale);
	if (!isfinite(a->q_scale) || a->q_scale < 0)
		return hyb_device_fail(d, -EINVAL, "attention: bad q_scale %g", (double)a->q_scale);
	if (cache == UINT64_MAX)
		return hyb_device_fail(d, -EINVAL, "attention: a cache of %u rows of %llu is too big",
				       a->n_ctx, (unsigned long long)kv_dim);
	rc = check_array(d, a->q, arr[0].len, "attention q");
	if (!rc)
		rc = check_array(d, a->k, arr[1].len, "attention k");
	if (!rc)
		rc = check_array(d, a->v, arr[2].len, "attention v");
	if (!rc)
		rc = check_aligned(d, a->kcache, cache, 2, "attention kcache");
	if (!rc)
		rc = check_aligned(d, a->vcache, cache, 2, "attention vcache");
	if (!rc)
		rc = check_array(d, a->out, arr[5].len, "attention out");
	if (!rc)
		rc = check_disjoint(d, "attention", arr, 6);
	if (!rc && a->pos_at) {
		const struct darr pa[7] = { arr[0], arr[1], arr[2], arr[3], arr[4], arr[5],
					    { a->pos_at, 4, "pos_at" } };

		rc = check_aligned(d, a->pos_at, 4, 4, "attention pos_at");
		if (!rc)
			rc = check_disjoint(d, "attention", pa, 7);
	}
	return rc;
}

int hyb_device_attention(struct hyb_device *d, enum hyb_stream s, const struct hyb_dev_attn *a)
{
	int rc = check_dev(d, (int)s, "attention");

	if (!rc)
		rc = check_op(d, d->ops->attention != NULL, "attention");
	if (rc)
		return rc;
	if (!a)
		return hyb_device_fail(d, -EINVAL, "attention: NULL arguments");
	rc = check_attn(d, a);
	if (!rc && (rc = hyb_capture_take(d, s, &(struct hyb_cap_node){
				.kind = CAP_ATTENTION, .u.attn = *a })))
		return rc < 0 ? rc : 0;
	if (!rc)
		rc = d->ops->attention(d, s, a);
	if (!rc)
		d->st.kernels++;
	return rc;
}

/* ---- statistics ------------------------------------------------------------------ */

void hyb_device_stats(const struct hyb_device *d, struct hyb_device_stats *out)
{
	if (!out)
		return;
	if (d)
		*out = d->st;
	else
		memset(out, 0, sizeof(*out));
}

void hyb_device_stats_reset(struct hyb_device *d)
{
	if (d)
		memset(&d->st, 0, sizeof(d->st));
}

int hyb_device_predict(struct hyb_device *d, enum hyb_stream s, const struct hyb_dev_predict *p)
{
	int rc = check_dev(d, (int)s, "predict");

	if (!rc)
		rc = check_op(d, d->ops->predict != NULL, "predict");
	if (rc)
		return rc;
	if (!p)
		return hyb_device_fail(d, -EINVAL, "predict: NULL arguments");
	if (!p->n_in || !p->hidden || !p->n_out || p->n_in % 32)
		return hyb_device_fail(d, -EINVAL,
				       "predict: bad shape %u -> %u -> %u (n_in a multiple of 32)",
				       p->n_in, p->hidden, p->n_out);

	const struct darr arr[8] = {
		{ p->fc1_w, 2ull * p->hidden * p->n_in, "fc1_w" },
		{ p->fc1_b, 4ull * p->hidden, "fc1_b" },
		{ p->fc2_w, 2ull * p->hidden * p->n_out, "fc2_w" },
		{ p->fc2_b, 4ull * p->n_out, "fc2_b" },
		{ p->x, 4ull * p->n_in, "x" },
		{ p->active, 4ull * p->n_out, "active" },
		{ p->count, 4, "count" },
		{ p->logits, p->logits ? 4ull * p->n_out : 0, "logits" },
	};

	rc = check_aligned(d, p->fc1_w, arr[0].len, 2, "predict fc1_w");
	if (!rc)
		rc = check_array(d, p->fc1_b, arr[1].len, "predict fc1_b");
	if (!rc)
		rc = check_aligned(d, p->fc2_w, arr[2].len, 2, "predict fc2_w");
	if (!rc)
		rc = check_array(d, p->fc2_b, arr[3].len, "predict fc2_b");
	if (!rc)
		rc = check_array(d, p->x, arr[4].len, "predict x");
	if (!rc)
		rc = check_array(d, p->active, arr[5].len, "predict active");
	if (!rc)
		rc = check_array(d, p->count, arr[6].len, "predict count");
	if (!rc && p->logits)
		rc = check_array(d, p->logits, arr[7].len, "predict logits");
	/* the outputs apart from everything; the inputs may share memory */
	for (int i = 0; !rc && i < 8; i++) {
		if (i != 5 && overlap(&arr[i], &arr[5]))
			rc = hyb_device_fail(d, -EINVAL, "predict: active overlaps %s", arr[i].name);
		else if (i != 6 && overlap(&arr[i], &arr[6]))
			rc = hyb_device_fail(d, -EINVAL, "predict: count overlaps %s", arr[i].name);
		else if (p->logits && i != 7 && overlap(&arr[i], &arr[7]))
			rc = hyb_device_fail(d, -EINVAL, "predict: logits overlap %s", arr[i].name);
	}
	if (!rc && (rc = hyb_capture_take(d, s, &(struct hyb_cap_node){
				.kind = CAP_PREDICT, .u.pred = *p })))
		return rc < 0 ? rc : 0;
	if (!rc)
		rc = d->ops->predict(d, s, p);
	if (!rc)
		d->st.kernels++;
	return rc;
}
