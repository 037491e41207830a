// SPDX-License-Identifier: MIT
/*
 * io_uring streaming of a file range into memory (see
 * stream.h for the contract). One ring per call, owned by the calling thread.
 *
 * The range is walked as its 4096-aligned superset. A piece goes straight to
 * the destination when it is whole blocks inside the range and the
 * destination is aligned like the file offset ("phase"); otherwise (head and
 * tail blocks, or every chunk when the phases differ) it lands in the slot's
 * bounce buffer and the wanted part is copied out on completion.
 *
 * A read that fails with a device error (EIO; ENODATA, Linux's errno for a
 * medium error such as an NVMe "unrecovered read error") names a range of up
 * to a chunk, and the block layer merges neighbouring reads into one request
 * and fails them together, so the failed read may not even hold the bad
 * sector. After draining, the failed ranges are read again alone, lowest
 * first, halving until the first block that fails by itself: the report
 * names it (where the file or the drive is damaged).
 */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "hyb/pool.h"
#include "hyb/stream.h"
#include "hyb/testing.h"
#include "preader.h"
#include "util/error.h"

#define BLK		4096u
#define MAX_DEPTH	256u
#define MAX_CHUNK	(64u << 20)
#define REG_MAX		(1ull << 30)	/* io_uring refuses fixed buffers over 1 GiB */
#define MAX_IOV		64
#define SCRATCH		(1u << 20)	/* the probes' buffer */
/*
 * Halving stops after this long: a sick drive may take seconds per failed
 * read (its own retries), and a reload lane waits meanwhile. The report then
 * names the range the bad block was narrowed to.
 */
#define PROBE_NS	2000000000ull

/* A simulated bad byte (HYB_STREAM_FAULT, tests); span 0: none. */
struct fault {
	uint64_t off, span;
	bool transient;
};

struct slot {
	uint64_t foff;		/* file offset of the read */
	uint32_t len;		/* bytes asked */
	uint32_t need;		/* bytes that must arrive (< len: the block holding EOF) */
	uint32_t done;
	uint8_t *buf;		/* read target: the destination or bounce */
	uint8_t *bounce;	/* chunk bytes, made on first use */
	uint8_t *copy_dst;	/* bounce pieces: where the wanted bytes go, else NULL */
	uint32_t copy_from, copy_len;
	int buf_index;		/* fixed buffer index, -1: plain read */
	int res;		/* -errno of a failed read, else 0 */
	bool busy;
};

struct streamer {
	struct io_uring ring;
	struct hyb_preader *pr;	/* io_uring refused: pread threads instead of the ring */
	bool force_pread;	/* opts.pread */
	const char *path, *label;
	char *err;
	size_t errlen;
	uint64_t off, end;	/* the range in the file */
	uint64_t next, stop;	/* next piece, end of the aligned superset */
	uint64_t body_end;	/* end of what may go straight to dst */
	uint8_t *dst;
	uint32_t chunk, align;
	unsigned int depth, in_flight;
	bool phase_ok, failed, lazy_dst;
	int fd;
	int read_err;		/* the reported failure is this errno of a read */
	int rc;			/* the first failure's -errno */
	struct fault fault;	/* HYB_STREAM_FAULT (tests) */
	struct iovec iov[MAX_IOV];
	unsigned int n_iov;
	struct slot *slots;
	struct hyb_stream_stats *st;
	int (*landed)(void *arg, uint64_t bytes);
	void *landed_arg;
	uint64_t landed_bytes;	/* the prefix last reported */
	int progress, last_quarter;
	uint64_t t0, t_draw;
};

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t down(uint64_t x, uint64_t a)
{
	return x / a * a;
}

static uint64_t up(uint64_t x, uint64_t a)
{
	return (x + a - 1) / a * a;
}

static int fail(struct streamer *s, int rc, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static int fail(struct streamer *s, int rc, const char *fmt, ...)
{
	va_list ap;

	if (s->failed)
		return -1;	/* keep the first reason */
	s->failed = true;
	s->rc = rc;
	va_start(ap, fmt);
	vsnprintf(s->err, s->errlen, fmt, ap);
	va_end(ap);
	return -1;
}

/* -- progress ------------------------------------------------------------ */

static void draw(struct streamer *s, bool final)
{
	uint64_t total = s->end - s->off, done = s->st->bytes, t = now_ns();
	double secs = (t - s->t0) / 1e9, gbs = secs > 0 ? done / secs / 1e9 : 0;
	int pct = total ? (int)(done * 100 / total) : 100;

	if (s->progress == HYB_STREAM_BAR) {
		char bar[31];
		int fill = pct * 30 / 100;

		if (!final && t - s->t_draw < 100000000ull)
			return;	/* ten frames a second is plenty */
		s->t_draw = t;
		memset(bar, '#', fill);
		memset(bar + fill, ' ', 30 - fill);
		bar[30] = 0;
		fprintf(stderr, "\r%s [%s] %3d%% %.0f/%.0f MiB %.2f GB/s%s", s->label, bar, pct,
			done / 1048576.0, total / 1048576.0, gbs, final ? "\n" : "");
	} else if (s->progress == HYB_STREAM_LINES) {
		if (pct / 25 <= s->last_quarter && !final)
			return;
		s->last_quarter = pct / 25;
		if (final)
			fprintf(stderr, "hyb: %s: loaded %.0f MiB in %.2f s (%.2f GB/s)\n",
				s->label, done / 1048576.0, secs, gbs);
		else
			fprintf(stderr, "hyb: %s: %d%% (%.0f/%.0f MiB)\n", s->label, pct,
				done / 1048576.0, total / 1048576.0);
	}
}

/* -- pieces -------------------------------------------------------------- */

/* Cut the next piece of the aligned superset into slot sl; false when none is left. */
static bool next_piece(struct streamer *s, struct slot *sl)
{
	uint64_t c0 = s->next, c1, w0, w1;
	bool direct;

	if (c0 >= s->stop)
		return false;
	direct = s->phase_ok && c0 >= s->off && c0 + s->align <= s->end;
	if (direct)
		c1 = c0 + s->chunk < s->body_end ? c0 + s->chunk : s->body_end;
	else if (s->phase_ok)
		c1 = c0 + s->align;	/* a head or tail block */
	else
		c1 = c0 + s->chunk < s->stop ? c0 + s->chunk : s->stop;
	s->next = c1;
	w0 = c0 > s->off ? c0 : s->off;	/* the wanted part [w0, w1) */
	w1 = c1 < s->end ? c1 : s->end;
	sl->foff = c0;
	sl->len = (uint32_t)(c1 - c0);
	sl->need = (uint32_t)(w1 - c0);
	sl->done = 0;
	sl->res = 0;
	sl->buf_index = -1;
	if (direct) {
		sl->buf = s->dst + (c0 - s->off);
		sl->copy_dst = NULL;
		for (unsigned int i = 0; i < s->n_iov; i++) {
			uint8_t *b = s->iov[i].iov_base;

			if (sl->buf >= b && sl->buf + sl->len <= b + s->iov[i].iov_len)
				sl->buf_index = (int)i;
		}
		return true;
	}
	if (!sl->bounce) {
		sl->bounce = mmap(NULL, s->chunk, PROT_READ | PROT_WRITE,
				  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (sl->bounce == MAP_FAILED) {
			sl->bounce = NULL;
			s->next = c0;	/* not cut: the landed prefix stops here */
			fail(s, -errno, "%s: cannot allocate a bounce buffer: %s", s->path,
			     strerror(errno));
			return false;
		}
	}
	sl->buf = sl->bounce;
	sl->copy_dst = s->dst + (w0 - s->off);
	sl->copy_from = (uint32_t)(w0 - c0);
	sl->copy_len = (uint32_t)(w1 - w0);
	return true;
}

static int submit_slot(struct streamer *s, unsigned int idx)
{
	struct slot *sl = &s->slots[idx];
	struct io_uring_sqe *sqe;

	if (s->pr) {
		if (hyb_preader_submit(s->pr, idx, sl->buf + sl->done, sl->len - sl->done,
				       sl->foff + sl->done))	/* cannot happen: depth slots */
			return fail(s, -EAGAIN, "%s: pread queue full", s->path);
		goto queued;
	}
	sqe = io_uring_get_sqe(&s->ring);
	if (!sqe)	/* cannot happen: the ring holds depth entries */
		return fail(s, -EAGAIN, "%s: io_uring submission queue full", s->path);
	if (sl->buf_index >= 0)
		io_uring_prep_read_fixed(sqe, 0, sl->buf + sl->done, sl->len - sl->done,
					 sl->foff + sl->done, sl->buf_index);
	else
		io_uring_prep_read(sqe, 0, sl->buf + sl->done, sl->len - sl->done,
				   sl->foff + sl->done);
	sqe->flags |= IOSQE_FIXED_FILE;
	io_uring_sqe_set_data64(sqe, idx);
queued:
	sl->busy = true;
	s->in_flight++;
	s->st->reads++;
	if (s->in_flight > s->st->max_in_flight)
		s->st->max_in_flight = s->in_flight;
	return 0;
}

/*
 * HYB_STREAM_FAULT=OFF[,SPAN[,1]] (tests): a bad byte at file offset OFF. A
 * ring read over it fails with EIO, and so does one within SPAN bytes of it
 * while the read over it is in flight (the block layer merged them into one
 * request); reads alone (the probes) fail over OFF only, or never with ",1"
 * (an intermittent fault).
 */
static bool fault_at(const struct fault *f, uint64_t off, uint64_t len, uint64_t span)
{
	return f->span && span && off <= f->off + span - 1 && f->off < off + len + span - 1;
}

static bool fault(const struct streamer *s, const struct slot *sl)
{
	uint64_t off = sl->foff + sl->done, len = sl->len - sl->done;

	if (fault_at(&s->fault, off, len, 1))
		return true;
	if (!fault_at(&s->fault, off, len, s->fault.span))
		return false;
	for (unsigned int i = 0; i < s->depth; i++) {
		const struct slot *o = &s->slots[i];

		if ((o->busy || o->res) &&
		    fault_at(&s->fault, o->foff + o->done, o->len - o->done, 1))
			return true;
	}
	return false;
}

/* Errors worth reading again to find the bad block (not timeouts: too slow). */
static bool locatable(int e)
{
	return e == EIO || e == ENODATA || e == EILSEQ || e == EREMOTEIO;
}

const char *hyb_stream_device_error(int e)
{
	switch (e) {
	case ENODATA:
		return "a medium error: the drive cannot read these sectors; see the kernel log";
	case EIO:
	case EILSEQ:
	case EREMOTEIO:
	case ETIMEDOUT:
	case ENOLINK:
		return "the device failed the read; see the kernel log";
	default:
		return NULL;
	}
}

/* A whole read's wanted bytes into the destination (bounce pieces copied out). */
static void land(struct streamer *s, struct slot *sl)
{
	if (sl->copy_dst) {
		memcpy(sl->copy_dst, sl->buf + sl->copy_from, sl->copy_len);
		s->st->bounced += sl->copy_len;
		s->st->bytes += sl->copy_len;
	} else {
		s->st->bytes += sl->need;
	}
}

/*
 * One completion. Returns 1 when the slot is free again, 0 when it was
 * resubmitted, -1 on error, -2 when O_DIRECT reads are refused (EINVAL on the
 * very first read: the caller retries buffered).
 */
static int complete(struct streamer *s, unsigned int idx, int res)
{
	struct slot *sl = &s->slots[idx];
	const char *why;

	sl->busy = false;
	s->in_flight--;
	if (res >= 0 && fault(s, sl))
		res = -EIO;
	if (res < 0 && res != -EINTR && res != -EAGAIN)
		sl->res = res;	/* (also while draining: the bad block may be in this one) */
	if (s->failed) {
		/*
		 * Draining: a read that came back whole still lands (what landed
		 * before the failure is good); a short or failed one is not read
		 * again, and the landed prefix stops at it.
		 */
		if (res >= 0 && sl->done + (uint32_t)res >= sl->need) {
			sl->done += (uint32_t)res;
			land(s, sl);
		} else if (!sl->res) {
			sl->res = -ECANCELED;
		}
		return 1;
	}
	if (res == -EINTR || res == -EAGAIN) {
		s->st->resubmits++;
		return submit_slot(s, idx);
	}
	if (res == -EINVAL && s->align > 1 && s->st->bytes == 0)
		return -2;
	if (res < 0) {
		why = hyb_stream_device_error(-res);
		fail(s, res, "%s: read of %u bytes at offset %llu failed: %s%s%s%s", s->path,
		     sl->len - sl->done, (unsigned long long)(sl->foff + sl->done),
		     strerror(-res), why ? " (" : "", why ? why : "", why ? ")" : "");
		s->read_err = why ? -res : 0;
		return -1;
	}
	sl->done += (uint32_t)res;
	if (sl->done < sl->need) {
		/* a short read: more to come, unless the file ended under us */
		if (res == 0 || sl->done % s->align)
			return fail(s, -EIO, "%s: file ends at byte %llu, before the range end %llu "
				    "(changed while loading?)", s->path,
				    (unsigned long long)(sl->foff + sl->done),
				    (unsigned long long)s->end);
		s->st->resubmits++;
		return submit_slot(s, idx);
	}
	land(s, sl);
	return 1;
}

/*
 * Report the landed prefix when it grew. Pieces are cut in file order and a
 * slot is free only once its bytes are in the destination (bounce copies
 * included) or its read failed (res), so everything below the lowest busy or
 * failed piece, or below the next piece to cut, has landed - after a failure
 * too, while the rest drains: what landed before the bad read is good.
 */
static void report_landed(struct streamer *s)
{
	uint64_t lo = s->next, bytes;

	if (!s->landed || (s->failed && s->rc == -ECANCELED))
		return;	/* (the caller said stop: no more reports) */
	for (unsigned int i = 0; i < s->depth; i++)
		if ((s->slots[i].busy || s->slots[i].res) && s->slots[i].foff < lo)
			lo = s->slots[i].foff;
	lo = lo < s->off ? s->off : lo > s->end ? s->end : lo;
	bytes = lo - s->off;
	if (bytes <= s->landed_bytes)
		return;
	s->landed_bytes = bytes;
	if (s->landed(s->landed_arg, bytes))
		fail(s, -ECANCELED, "%s: loading was cancelled", s->path);
}

/* The pread threads' completions, as the ring's loop below takes them; rc: the first failure. */
static int reap_preads(struct streamer *s, int rc)
{
	struct hyb_preader_cqe c[64];
	unsigned int n = hyb_preader_reap(s->pr, c, 64);

	for (unsigned int i = 0; i < n; i++) {
		int r = complete(s, (unsigned int)c[i].tag, c[i].res);

		if (r < 0 && rc == 0)
			rc = r;
		report_landed(s);	/* threads finish in bursts: report as each lands */
	}
	return rc;
}

/* Fill the ring, reap, refill, until every piece is in or something failed. */
static int pump(struct streamer *s)
{
	int rc = 0;

	for (;;) {
		struct io_uring_cqe *cqe;
		unsigned int head, n = 0;
		int ret;

		for (unsigned int i = 0; i < s->depth && !s->failed && rc == 0; i++)
			if (!s->slots[i].busy && next_piece(s, &s->slots[i]))
				submit_slot(s, i);
		if (!s->in_flight)
			break;
		if (s->pr) {
			rc = reap_preads(s, rc);
			goto reaped;
		}
		ret = io_uring_submit_and_wait(&s->ring, 1);
		if (ret < 0 && ret != -EINTR && ret != -EAGAIN && ret != -EBUSY) {
			/* stop issuing and drain what the kernel took; give up if it fails again */
			if (s->failed)
				return -1;
			fail(s, ret, "%s: io_uring submit failed: %s", s->path, strerror(-ret));
		}
		io_uring_for_each_cqe(&s->ring, head, cqe) {
			int r = complete(s, (unsigned int)io_uring_cqe_get_data64(cqe), cqe->res);

			if (r < 0 && rc == 0)
				rc = r;
			n++;
		}
		io_uring_cq_advance(&s->ring, n);
reaped:
		report_landed(s);
		if (s->progress != HYB_STREAM_QUIET)
			draw(s, false);
		if (rc == -2)
			s->failed = true;	/* stop issuing, drain; the caller retries */
	}
	if (rc == -2)
		return -2;
	return s->failed ? -1 : 0;
}

/*
 * Read [off, off + len) of fd alone, through short reads, into scratch. -1
 * when it all reads (or the file ends), else the offset where a read failed
 * (errno in *e).
 */
static int64_t probe(int fd, bool direct, const struct fault *f, uint8_t *scratch, uint64_t off,
		     uint64_t len, int *e)
{
	uint64_t done = 0;

	while (done < len) {
		size_t n = len - done < SCRATCH ? (size_t)(len - done) : SCRATCH;
		ssize_t got;

		if (f && !f->transient && fault_at(f, off + done, n, 1)) {
			*e = EIO;
			return (int64_t)(off + done);
		}
		got = pread(fd, scratch, n, (off_t)(off + done));
		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0) {
			*e = errno;
			return (int64_t)(off + done);
		}
		if (got == 0 || (direct && (uint64_t)got % BLK))
			break;	/* the end of the file */
		done += (uint64_t)got;
	}
	return -1;
}

/*
 * The first block of [off, off + len) that fails when read alone: halve the
 * range, keeping the half that fails (the lower one first). 0 with the
 * block's offset in *bad and the errno in *e (*bad_len 4096; more when
 * PROBE_NS ran out first); -1 when every block reads.
 */
static int find_bad(int fd, const struct fault *f, uint64_t off, uint64_t len, uint64_t *bad,
		    uint64_t *bad_len, int *e)
{
	uint64_t lo = down(off, BLK), hi = up(off + len, BLK), t0 = now_ns();
	int fl = fcntl(fd, F_GETFL);
	bool direct = fl >= 0 && (fl & O_DIRECT), failed = false;
	uint8_t *scratch = mmap(NULL, SCRATCH, PROT_READ | PROT_WRITE,
				MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	int64_t at;
	int ret = -1;

	if (scratch == MAP_FAILED || !len)
		return -1;
	while (hi - lo > BLK) {
		uint64_t mid = lo + up((hi - lo) / 2, BLK);

		if (failed && now_ns() - t0 > PROBE_NS)
			break;	/* [lo, hi) holds a failed read: name that */

		at = probe(fd, direct, f, scratch, lo, mid - lo, e);
		failed = at >= 0;
		if (failed) {
			hi = mid;
			lo = down((uint64_t)at, BLK);	/* (buffered: up to there it read) */
		} else {
			lo = mid;
		}
	}
	if (failed || probe(fd, direct, f, scratch, lo, hi - lo, e) >= 0) {
		*bad = lo;
		*bad_len = hi - lo;
		ret = 0;
	}
	munmap(scratch, SCRATCH);
	return ret;
}

int hyb_stream_find_bad_block(int fd, uint64_t off, uint64_t len, uint64_t *bad,
			      uint64_t *bad_len, int *e)
{
	return find_bad(fd, NULL, off, len, bad, bad_len, e);
}

int hyb_stream_bad_block_words(char *buf, size_t len, uint64_t bad, uint64_t bad_len)
{
	if (bad_len <= BLK)
		return snprintf(buf, len, "the first bad block is bytes [%llu, %llu) of the file",
				(unsigned long long)bad, (unsigned long long)(bad + bad_len));
	return snprintf(buf, len, "the first bad block is within bytes [%llu, %llu) of the file "
			"(not narrowed further: the drive is slow to fail reads)",
			(unsigned long long)bad, (unsigned long long)(bad + bad_len));
}

/*
 * After a device error: re-read the failed reads alone, lowest offset first,
 * until a block fails by itself, and rewrite the report to name that read
 * and the block.
 */
static void locate(struct streamer *s)
{
	uint64_t bad, bad_len;
	char where[160];
	size_t n;
	int e;

	for (;;) {
		struct slot *sl = NULL;

		for (unsigned int i = 0; i < s->depth; i++)
			if (s->slots[i].res && locatable(-s->slots[i].res) &&
			    (!sl || s->slots[i].foff < sl->foff))
				sl = &s->slots[i];
		if (!sl)
			break;
		sl->res = 0;
		if (find_bad(s->fd, &s->fault, sl->foff + sl->done, sl->len - sl->done, &bad,
			     &bad_len, &e))
			continue;
		hyb_stream_bad_block_words(where, sizeof(where), bad, bad_len);
		snprintf(s->err, s->errlen, "%s: read of %u bytes at offset %llu failed: %s (%s); %s",
			 s->path, sl->len - sl->done, (unsigned long long)(sl->foff + sl->done),
			 strerror(e), hyb_stream_device_error(e) ? hyb_stream_device_error(e) :
			 "read alone", where);
		return;
	}
	n = strlen(s->err);
	snprintf(s->err + n, s->errlen - n, "; read again alone, every block was readable "
		 "(an intermittent fault?)");
}

/* Register the part of dst that reads land in directly, in pieces of <= 1 GiB. */
static void register_dst(struct streamer *s)
{
	uint64_t b0, b1;

	if (!s->phase_ok || s->align == 1 || s->lazy_dst)
		return;
	b0 = up(s->off, s->align);
	b1 = s->body_end;
	if (b1 <= b0)
		return;
	for (uint64_t o = b0; o < b1 && s->n_iov < MAX_IOV; o += REG_MAX) {
		s->iov[s->n_iov].iov_base = s->dst + (o - s->off);
		s->iov[s->n_iov].iov_len = b1 - o < REG_MAX ? b1 - o : REG_MAX;
		s->n_iov++;
	}
	/* file-backed memory (kmod pools) or RLIMIT_MEMLOCK: plain reads then */
	if (io_uring_register_buffers(&s->ring, s->iov, s->n_iov))
		s->n_iov = 0;
	s->st->fixed_bufs = s->n_iov > 0;
}

/*
 * Where the kernel refuses io_uring (a container's seccomp profile, gVisor,
 * io_uring_disabled): the same pieces read by pread threads, a notice once
 * per process, never a failure for that reason. Threads: enough to keep an
 * NVMe drive's queue busy (its reads block), at most the depth.
 */
static int run_preads(struct streamer *s, int why)
{
	static bool told;
	int ret;

	if (!told && why) {	/* (why 0: asked for, nothing to tell) */
		told = true;
		fprintf(stderr, "hyb: io_uring unavailable (%s): reading with pread threads\n",
			strerror(-why));
	}
	s->pr = hyb_preader_new(s->fd, s->depth < 16 ? s->depth : 16, s->depth);
	if (!s->pr)
		return fail(s, -ENOMEM, "%s: %s", s->path, hyb_last_error());
	s->st->uring = 0;
	ret = pump(s);
	hyb_preader_free(s->pr);	/* after the drain: no read is in flight */
	s->pr = NULL;
	if (ret == -1 && locatable(s->read_err))
		locate(s);
	return ret;
}

/* One attempt with the given fd; -2: O_DIRECT refused at the first read. */
static int run(struct streamer *s, int fd, bool direct)
{
	int ret;

	s->align = direct ? BLK : 1;
	s->phase_ok = ((uintptr_t)s->dst - s->off) % s->align == 0;
	s->next = down(s->off, s->align);
	s->stop = up(s->end, s->align);
	s->body_end = down(s->end, s->align);
	s->n_iov = 0;
	s->in_flight = 0;
	s->failed = false;
	s->read_err = 0;
	s->fd = fd;
	for (unsigned int i = 0; i < s->depth; i++)
		s->slots[i].res = 0;	/* (from an attempt before) */
	s->st->direct = direct;
	if (s->force_pread)
		return run_preads(s, 0);
	ret = getenv(HYB_TESTING_ENV_NO_URING) ? -ENOSYS :
	      io_uring_queue_init(s->depth, &s->ring, 0);
	if (ret < 0)
		return run_preads(s, ret);
	s->st->uring = 1;
	ret = io_uring_register_files(&s->ring, &fd, 1);
	if (ret < 0) {
		fail(s, ret, "%s: cannot register the file with io_uring: %s", s->path,
		     strerror(-ret));
		io_uring_queue_exit(&s->ring);
		return -1;
	}
	register_dst(s);
	ret = pump(s);
	io_uring_queue_exit(&s->ring);
	if (ret == -1 && locatable(s->read_err))
		locate(s);
	return ret;
}

static int open_file(struct streamer *s, bool direct, uint64_t *size)
{
	struct stat sb;
	int fd;

	if (direct && getenv(HYB_TESTING_ENV_REFUSE_DIRECT)) {
		errno = EINVAL;
		return -1;
	}
	fd = open(s->path, O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0));
	if (fd < 0)
		return -1;
	if (fstat(fd, &sb)) {
		close(fd);
		return -1;
	}
	if (!S_ISREG(sb.st_mode)) {
		close(fd);
		errno = S_ISDIR(sb.st_mode) ? EISDIR : ENOTSUP; /* not EINVAL: no fallback */
		return -1;
	}
	*size = (uint64_t)sb.st_size;
	return fd;
}

/*
 * True when the whole range sits in the page cache already (a warm load):
 * buffered reads then copy at memory speed, where O_DIRECT would go to the
 * disk again. mincore() on a mapping of the range tells without faulting.
 */
static bool cached(int fd, uint64_t off, uint64_t len)
{
	long pg = sysconf(_SC_PAGESIZE);
	uint64_t o0 = down(off, (uint64_t)pg), n = (up(off + len, (uint64_t)pg) - o0) / pg;
	unsigned char *vec;
	bool all = false;
	void *map;

	if (!len)
		return false;
	map = mmap(NULL, n * pg, PROT_READ, MAP_SHARED, fd, (off_t)o0);
	if (map == MAP_FAILED)
		return false;
	vec = malloc(n);
	if (vec && !mincore(map, n * pg, vec)) {
		all = true;
		for (uint64_t i = 0; i < n && all; i++)
			all = vec[i] & 1;
	}
	free(vec);
	munmap(map, n * pg);
	return all;
}

bool hyb_stream_cached(const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	struct stat sb;
	bool all;

	if (fd < 0)
		return false;
	all = !fstat(fd, &sb) && S_ISREG(sb.st_mode) && cached(fd, 0, (uint64_t)sb.st_size);
	close(fd);
	return all;
}

/* open(O_DIRECT) says EINVAL for directories too: fall back only for files */
static bool regular_file(const char *path)
{
	struct stat sb;

	if (stat(path, &sb))
		return false;
	if (!S_ISREG(sb.st_mode))
		errno = S_ISDIR(sb.st_mode) ? EISDIR : ENOTSUP;
	else
		errno = EINVAL;
	return S_ISREG(sb.st_mode);
}

int hyb_stream_read(const char *path, uint64_t file_off, uint64_t len, void *dst,
		    const struct hyb_stream_opts *opts, struct hyb_stream_stats *stats)
{
	char msg[1024] = "";
	struct hyb_stream_opts o = opts ? *opts : (struct hyb_stream_opts){ 0 };
	struct hyb_stream_stats local;
	struct streamer s = { .path = path, .err = msg, .errlen = sizeof(msg), .dst = dst };
	bool direct = !o.buffered;
	uint64_t size = 0;
	int fd, ret;

	s.st = stats ? stats : &local;
	memset(s.st, 0, sizeof(*s.st));
	s.depth = o.depth ? (o.depth < MAX_DEPTH ? o.depth : MAX_DEPTH) : 32;
	s.chunk = o.chunk ? o.chunk : 1u << 20;
	if (s.chunk % BLK || s.chunk > MAX_CHUNK) {
		return hyb_error_set(-EINVAL, "stream chunk %u is not a multiple of %u up to %u",
				     s.chunk, BLK, MAX_CHUNK);
	}
	s.label = o.label ? o.label : path;
	s.lazy_dst = o.lazy_dst;
	s.force_pread = o.pread;
	s.landed = o.landed;
	s.landed_arg = o.landed_arg;
	if (getenv(HYB_TESTING_ENV_STREAM_FAULT)) {
		char *end;

		s.fault.off = strtoull(getenv(HYB_TESTING_ENV_STREAM_FAULT), &end, 10);
		s.fault.span = *end == ',' ? strtoull(end + 1, &end, 10) : 1;
		s.fault.transient = *end == ',' && end[1] == '1';
	}
	s.progress = o.progress == HYB_STREAM_AUTO ?
		     (isatty(2) ? HYB_STREAM_BAR : HYB_STREAM_LINES) : o.progress;
	s.off = file_off;
	s.end = file_off + len;
	if (s.end < file_off) {
		return hyb_error_set(-EINVAL, "%s: range at offset %llu overflows", path,
				     (unsigned long long)file_off);
	}
	fd = open_file(&s, direct, &size);
	if (fd < 0 && direct && errno == EINVAL && regular_file(path)) {
		fprintf(stderr, "hyb: %s: O_DIRECT refused by the filesystem: buffered reads\n",
			path);
		direct = false;
		fd = open_file(&s, false, &size);
	}
	if (fd < 0)
		return hyb_error_set(-errno, "%s: cannot open: %s", path, strerror(errno));
	if (s.end > size) {
		close(fd);
		return hyb_error_set(-ERANGE, "%s: range [%llu, %llu) ends past the end of the "
				     "file (%llu bytes)", path, (unsigned long long)s.off,
				     (unsigned long long)s.end, (unsigned long long)size);
	}
	if (direct && cached(fd, s.off, len)) {
		close(fd);
		direct = false;
		fd = open_file(&s, false, &size);
		if (fd < 0)
			return hyb_error_set(-errno, "%s: cannot open: %s", path, strerror(errno));
	}
	s.slots = calloc(s.depth, sizeof(*s.slots));
	if (!s.slots) {
		close(fd);
		return hyb_error_set(-ENOMEM, "out of memory");
	}
	s.t0 = now_ns();
	ret = len ? run(&s, fd, direct) : 0;
	if (ret == -2) {
		fprintf(stderr, "hyb: %s: O_DIRECT reads refused: buffered reads\n", path);
		close(fd);
		fd = open_file(&s, false, &size);
		if (fd < 0) {
			s.rc = -errno;
			snprintf(msg, sizeof(msg), "%s: cannot open: %s", path, strerror(errno));
			ret = -1;
		} else {
			s.st->bytes = 0;
			ret = run(&s, fd, false);
		}
	}
	s.st->ns = now_ns() - s.t0;
	if (!ret && s.progress != HYB_STREAM_QUIET)
		draw(&s, true);
	else if (ret && s.progress == HYB_STREAM_BAR)
		fputc('\n', stderr);
	for (unsigned int i = 0; i < s.depth; i++)
		if (s.slots[i].bounce)
			munmap(s.slots[i].bounce, s.chunk);
	free(s.slots);
	if (fd >= 0)
		close(fd);
	return ret ? hyb_error_set(s.rc ? s.rc : -EIO, "%s", msg) : 0;
}

int hyb_stream_to_pool(struct hyb_mempool *p, uint64_t pool_off, const char *path,
		       uint64_t file_off, uint64_t len, const struct hyb_stream_opts *opts,
		       struct hyb_stream_stats *stats)
{
	struct hyb_mempool_info info;
	void *base;
	size_t plen;
	int ret = hyb_mempool_info(p, &info);

	if (!ret)
		ret = hyb_mempool_map(p, &base, &plen);
	if (ret) {
		char why[256];

		snprintf(why, sizeof(why), "%s", hyb_last_error());
		return hyb_error_set(ret, "%s: pool: %s", path, why);
	}
	if (!hyb_mempool_writable(p))
		return hyb_error_set(-EPERM, "%s: pool '%s' is mapped read-only (not its owner)",
				     path, info.name);
	if (pool_off > plen || len > plen - pool_off)
		return hyb_error_set(-ERANGE, "%s: pool '%s' holds %zu bytes: cannot hold %llu "
				     "bytes at offset %llu (file offset %llu)", path, info.name,
				     plen, (unsigned long long)len, (unsigned long long)pool_off,
				     (unsigned long long)file_off);
	return hyb_stream_read(path, file_off, len, (uint8_t *)base + pool_off, opts, stats);
}
