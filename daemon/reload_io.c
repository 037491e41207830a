// SPDX-License-Identifier: MIT
/*
 * The storage lane's persistent io_uring reader (see reload_io.h for why it
 * exists beside the streaming engine). One read is cut into pieces that are
 * all put in flight at once: with O_DIRECT, whole blocks go straight into the
 * destination when it is aligned like the file offset, the partial head and
 * tail blocks (or everything, when the alignments differ) land in a bounce
 * buffer and are copied out.
 */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hyb/testing.h"
#include "reload_io.h"
#include "hyb/stream.h"

#define BLK		4096ull
#define PIECE_MIN	(1ull << 20)
#define PIECE_MAX	(1ull << 20)

struct piece {
	uint64_t foff;		/* file offset of the read */
	uint32_t len;		/* bytes asked */
	uint32_t need;		/* bytes that must arrive (less at the end of the file) */
	uint32_t done;
	uint8_t *buf;
	uint8_t *copy_to;	/* bounce pieces: where the wanted bytes go */
	uint32_t copy_from, copy_len;
	bool fixed;		/* buf is in the registered bounce buffer */
};

struct hyb_rio {
	struct io_uring ring;
	int fd;
	bool direct;
	dev_t dev;
	ino_t ino;
	uint64_t size;
	char path[PATH_MAX];
	unsigned int depth;
	uint8_t *bounce;	/* [0, 4K) head, [4K, 8K) tail, [8K, ...) staging */
	size_t bounce_len;
	bool bounce_fixed;
	uint64_t max_len;
	struct piece *pieces;
	unsigned int max_pieces;
};

static uint64_t down(uint64_t x, uint64_t a)
{
	return x / a * a;
}

static uint64_t up(uint64_t x, uint64_t a)
{
	return (x + a - 1) / a * a;
}

void hyb_rio_close(struct hyb_rio *r)
{
	if (!r)
		return;
	io_uring_queue_exit(&r->ring);
	if (r->bounce)
		munmap(r->bounce, r->bounce_len);
	if (r->fd >= 0)
		close(r->fd);
	free(r->pieces);
	free(r);
}

struct hyb_rio *hyb_rio_open(const char *path, uint64_t max_len, unsigned int depth, char *err,
			     size_t errlen)
{
	struct hyb_rio *r = calloc(1, sizeof(*r));
	struct iovec iov;
	struct stat sb;
	int ret;

	if (!r) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	r->fd = -1;
	r->depth = depth < 2 ? 2 : depth > 64 ? 64 : depth;
	r->max_len = max_len;
	snprintf(r->path, sizeof(r->path), "%s", path);
	/* refused (or HYB_STREAM_NO_URING): the lane reads through the streaming engine */
	ret = getenv(HYB_TESTING_ENV_NO_URING) ? -ENOSYS :
	      io_uring_queue_init(r->depth, &r->ring, 0);
	if (ret < 0) {
		snprintf(err, errlen, "io_uring unavailable: %s", strerror(-ret));
		free(r);
		return NULL;
	}
	r->fd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
	r->direct = r->fd >= 0;
	if (r->fd < 0 && errno == EINVAL)	/* a filesystem without O_DIRECT */
		r->fd = open(path, O_RDONLY | O_CLOEXEC);
	if (r->fd < 0 || fstat(r->fd, &sb)) {
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		hyb_rio_close(r);
		return NULL;
	}
	r->size = (uint64_t)sb.st_size;
	r->dev = sb.st_dev;
	r->ino = sb.st_ino;
	ret = io_uring_register_files(&r->ring, &r->fd, 1);
	r->bounce_len = (size_t)up(2 * BLK + max_len + 2 * BLK, BLK);
	r->bounce = mmap(NULL, r->bounce_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
			 -1, 0);
	r->max_pieces = (unsigned int)(max_len / PIECE_MIN + 4);
	r->pieces = calloc(r->max_pieces, sizeof(*r->pieces));
	if (ret < 0 || r->bounce == MAP_FAILED || !r->pieces) {
		snprintf(err, errlen, "%s: reader set-up failed: %s", path,
			 ret < 0 ? strerror(-ret) : "out of memory");
		if (r->bounce == MAP_FAILED)
			r->bounce = NULL;
		hyb_rio_close(r);
		return NULL;
	}
	iov.iov_base = r->bounce;
	iov.iov_len = r->bounce_len;
	/* RLIMIT_MEMLOCK may refuse: plain reads into the bounce buffer then */
	r->bounce_fixed = io_uring_register_buffers(&r->ring, &iov, 1) == 0;
	return r;
}

void hyb_rio_ident(const struct hyb_rio *r, dev_t *dev, ino_t *ino)
{
	*dev = r->dev;
	*ino = r->ino;
}

/* Piece [f0, f1) of the file into buf; copy (when copy_to) the wanted part out afterwards. */
static struct piece *add(struct hyb_rio *r, unsigned int *n, uint64_t f0, uint64_t f1,
			 uint8_t *buf, bool fixed)
{
	struct piece *p = &r->pieces[(*n)++];
	uint64_t end = f1 < r->size ? f1 : r->size;

	*p = (struct piece){ .foff = f0, .len = (uint32_t)(f1 - f0),
			     .need = (uint32_t)(end > f0 ? end - f0 : 0), .buf = buf,
			     .fixed = fixed };
	return p;
}

/* Cut [f0, f1) into pieces landing at buf (contiguous). */
static void add_span(struct hyb_rio *r, unsigned int *n, uint64_t f0, uint64_t f1, uint8_t *buf,
		     bool fixed)
{
	uint64_t piece = up((f1 - f0) / r->depth, BLK);

	piece = piece < PIECE_MIN ? PIECE_MIN : piece > PIECE_MAX ? PIECE_MAX : piece;
	for (uint64_t x = f0; x < f1; x += piece)
		add(r, n, x, x + piece < f1 ? x + piece : f1, buf + (x - f0), fixed);
}

static void submit_piece(struct hyb_rio *r, struct piece *p, unsigned int idx)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);

	if (p->fixed && r->bounce_fixed)
		io_uring_prep_read_fixed(sqe, 0, p->buf + p->done, p->len - p->done,
					 p->foff + p->done, 0);
	else
		io_uring_prep_read(sqe, 0, p->buf + p->done, p->len - p->done, p->foff + p->done);
	sqe->flags |= IOSQE_FIXED_FILE;
	io_uring_sqe_set_data64(sqe, idx);
}

/*
 * A device error: the failed piece may only have shared a block-layer request
 * with the bad sector. Name the request's first block that fails alone.
 */
static void locate(struct hyb_rio *r, uint64_t off, uint64_t len, int e, char *msg,
		   size_t msglen)
{
	const char *why = hyb_stream_device_error(e);
	uint64_t bad, bad_len;
	char where[160];
	size_t k;

	if (e == ETIMEDOUT || e == ENOLINK ||	/* (reading again would only wait again) */
	    hyb_stream_find_bad_block(r->fd, off, len, &bad, &bad_len, &e)) {
		k = strlen(msg);
		snprintf(msg + k, msglen - k, " (%s)%s", why, e == ETIMEDOUT || e == ENOLINK ? "" :
			 "; read again alone, every block was readable (an intermittent fault?)");
		return;
	}
	hyb_stream_bad_block_words(where, sizeof(where), bad, bad_len);
	snprintf(msg, msglen, "%s: read of %llu bytes at offset %llu failed: %s (%s); %s", r->path,
		 (unsigned long long)len, (unsigned long long)off, strerror(e),
		 hyb_stream_device_error(e) ? hyb_stream_device_error(e) : "read alone", where);
}

/*
 * Cut [off, off + len) into pieces: straight into dst where O_DIRECT's
 * alignment allows (a bounce block for an unaligned head and tail), else
 * all through the staging area. Returns the number of pieces.
 */
static unsigned int plan_pieces(struct hyb_rio *r, uint64_t off, uint64_t len, uint8_t *dst)
{
	uint64_t a = r->direct ? BLK : 1, end = off + len;
	unsigned int n = 0;

	if (!r->direct) {
		add_span(r, &n, off, end, dst, false);
	} else if (((uintptr_t)dst - off) % BLK == 0 && up(off, BLK) < down(end, BLK)) {
		uint64_t b0 = up(off, BLK), b1 = down(end, BLK);
		struct piece *p;

		if (off < b0) {	/* head block */
			p = add(r, &n, b0 - BLK, b0, r->bounce, true);
			p->copy_to = dst;
			p->copy_from = (uint32_t)(off - (b0 - BLK));
			p->copy_len = (uint32_t)(b0 - off);
		}
		if (end > b1) {	/* tail block */
			p = add(r, &n, b1, b1 + BLK, r->bounce + BLK, true);
			p->copy_to = dst + (b1 - off);
			p->copy_from = 0;
			p->copy_len = (uint32_t)(end - b1);
		}
		add_span(r, &n, b0, b1, dst + (b0 - off), false);
	} else {
		/* alignments differ (or no whole block): all through the staging area */
		uint64_t s0 = down(off, a), s1 = up(end, a);

		add_span(r, &n, s0, s1, r->bounce + 2 * BLK, true);
		for (unsigned int i = 0; i < n; i++) {
			struct piece *p = &r->pieces[i];
			uint64_t w0 = p->foff > off ? p->foff : off;
			uint64_t w1 = p->foff + p->len < end ? p->foff + p->len : end;

			p->copy_to = dst + (w0 - off);
			p->copy_from = (uint32_t)(w0 - p->foff);
			p->copy_len = (uint32_t)(w1 - w0);
		}
	}
	return n;
}

/*
 * One completion of piece i: done, resubmitted (EINTR, EAGAIN, a short read)
 * or the read's failure into *status and msg. Returns 1 when it went back to
 * the ring.
 */
static int complete_piece(struct hyb_rio *r, unsigned int i, int res, int *status,
			  int *read_err, char *msg, size_t msglen)
{
	struct piece *p = &r->pieces[i];

	if (*status)
		return 0;	/* draining */
	if (res == -EINTR || res == -EAGAIN) {
		submit_piece(r, p, i);
		return 1;
	}
	if (res < 0) {
		snprintf(msg, msglen, "%s: read of %u bytes at offset %llu failed: %s", r->path,
			 p->len - p->done, (unsigned long long)(p->foff + p->done),
			 strerror(-res));
		*status = -EIO;
		*read_err = -res;
		return 0;
	}
	p->done += (uint32_t)res;
	if (p->done >= p->need)
		return 0;
	if (!res) {
		snprintf(msg, msglen, "%s: the file ends at %llu (changed on disk?)", r->path,
			 (unsigned long long)(p->foff + p->done));
		*status = -ERANGE;
		return 0;
	}
	submit_piece(r, p, i);	/* a short read: the rest */
	return 1;
}

int hyb_rio_read(struct hyb_rio *r, uint64_t off, uint64_t len, uint8_t *dst, char *msg,
		 size_t msglen)
{
	unsigned int n, next = 0, in_flight = 0;
	int status = 0, read_err = 0;

	if (!len)
		return 0;
	if (len > r->max_len || off + len > r->size) {
		snprintf(msg, msglen, "%s: read [%llu, +%llu) is past the file end (%llu) or the "
			 "reader's size", r->path, (unsigned long long)off,
			 (unsigned long long)len, (unsigned long long)r->size);
		return -ERANGE;
	}
	n = plan_pieces(r, off, len, dst);
	while (next < n || in_flight) {
		struct io_uring_cqe *cqe;
		int ret;

		while (next < n && in_flight < r->depth && !status) {
			submit_piece(r, &r->pieces[next], next);
			next++;
			in_flight++;
		}
		if (!in_flight)
			break;
		ret = io_uring_submit_and_wait(&r->ring, 1);
		if (ret < 0 && ret != -EINTR && ret != -EAGAIN && ret != -EBUSY) {
			snprintf(msg, msglen, "%s: io_uring: %s", r->path, strerror(-ret));
			return -EIO;	/* the ring is unusable: the service falls back */
		}
		while (io_uring_peek_cqe(&r->ring, &cqe) == 0) {
			unsigned int i = (unsigned int)io_uring_cqe_get_data64(cqe);
			int res = cqe->res;

			io_uring_cqe_seen(&r->ring, cqe);
			in_flight--;
			in_flight += complete_piece(r, i, res, &status, &read_err, msg, msglen);
		}
		if (in_flight)
			io_uring_submit(&r->ring);
	}
	if (status == -EIO && hyb_stream_device_error(read_err))
		locate(r, off, len, read_err, msg, msglen);
	if (status)
		return status;
	for (unsigned int i = 0; i < n; i++)
		if (r->pieces[i].copy_to)
			memcpy(r->pieces[i].copy_to, r->pieces[i].buf + r->pieces[i].copy_from,
			       r->pieces[i].copy_len);
	return 0;
}
