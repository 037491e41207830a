// SPDX-License-Identifier: MIT
/*
 * A model's weights streaming in behind its first prompt, for the time to
 * first token. hyb_model_load_streaming() returns once the GGUF header is in
 * the image; a thread of its own keeps the io_uring engine (model/stream.c)
 * filling the rest, and the engine reports the landed prefix: every byte below
 * it is in memory. The forward pass asks for the bytes of the embeddings, of
 * each layer and of the head just before it reads them, so the prompt's first
 * layers compute while the last ones are still on the drive: loading and the
 * prompt overlap instead of adding up.
 *
 * What waits: a plain model's prompt pass, per piece (forward.c); anything
 * else that reads weights waits for all of them (hyb_model_wait: plan and
 * PowerInfer files are never streamed, their binding reads tensors; nor is
 * a file wholly in the page cache, see hyb_model_load_streaming). A load
 * that fails makes every wait, present and future, fail with its error; the
 * model is then unusable but freeing it is safe. Freeing a model still
 * loading cancels the load and joins the thread.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "hyb/error.h"
#include "hyb/stream.h"
#include "hyb/gguf.h"
#include "hyb/model.h"
#include "model_stream.h"
#include "util/error.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

enum { LOADING, LOADED, FAILED };

#define PREFAULT_PIECE	(32ull << 20)
#define PREFAULT_MAX	7

struct hyb_model_stream {
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	_Atomic uint64_t landed;	/* file bytes [0, landed) are in the image */
	_Atomic int state;
	atomic_bool cancel;
	char *path;
	void *image;
	uint64_t size;
	uint64_t embd_end, head_end;	/* where the pieces' bytes end in the file */
	uint64_t *layer_end;
	uint32_t n_layer;
	struct hyb_stream_opts opts;
	struct hyb_stream_stats stats;
	char err[512];
	int rc;		/* the failed read's errno, negated */
	/* helpers zeroing the image's pages ahead of the reads */
	pthread_t prefault[PREFAULT_MAX];
	int n_prefault;
	_Atomic uint64_t prefault_next;
};

static int landed(void *arg, uint64_t bytes)
{
	struct hyb_model_stream *s = arg;

	pthread_mutex_lock(&s->lock);
	atomic_store_explicit(&s->landed, bytes, memory_order_release);
	pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
	return atomic_load(&s->cancel);
}

/*
 * The image is a lazy pool: each page is zeroed when first written. The
 * reads fault in their own pages as they are issued, one at a time on the
 * loading thread; these helpers fault in the pieces ahead of them in the same
 * order, on other cores (MADV_POPULATE_WRITE leaves a page that is already
 * there, data and all, as it is). Where zeroing is slow - a VM whose host
 * backs guest memory only on first touch took ~3 s/GB - it no longer holds
 * the reads to one core's rate.
 */
static void *prefault_thread(void *arg)
{
	struct hyb_model_stream *s = arg;
	uint64_t off;

	while (!atomic_load(&s->cancel) &&
	       (off = atomic_fetch_add(&s->prefault_next, PREFAULT_PIECE)) < s->size) {
		uint64_t n = s->size - off < PREFAULT_PIECE ? s->size - off : PREFAULT_PIECE;

		if (madvise((uint8_t *)s->image + off, n, MADV_POPULATE_WRITE))
			break;	/* (kernels before 5.14) the reads fault the pages in */
	}
	return NULL;
}

static void start_prefault(struct hyb_model_stream *s)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	int want = cpus > 1 ? (int)(cpus - 1) : 0;

	if (want > PREFAULT_MAX)
		want = PREFAULT_MAX;
	if ((uint64_t)want > s->size / PREFAULT_PIECE)
		want = (int)(s->size / PREFAULT_PIECE);
	while (s->n_prefault < want &&
	       !pthread_create(&s->prefault[s->n_prefault], NULL, prefault_thread, s))
		s->n_prefault++;
}

static void *load_thread(void *arg)
{
	struct hyb_model_stream *s = arg;
	int rc;

	start_prefault(s);
	rc = hyb_stream_read(s->path, 0, s->size, s->image, &s->opts, &s->stats);
	atomic_store(&s->cancel, true);	/* (helpers still going stop at their next piece) */
	for (int i = 0; i < s->n_prefault; i++)
		pthread_join(s->prefault[i], NULL);

	pthread_mutex_lock(&s->lock);
	s->rc = rc;
	if (rc)
		snprintf(s->err, sizeof(s->err), "%s", hyb_last_error());
	atomic_store_explicit(&s->state, rc ? FAILED : LOADED, memory_order_release);
	pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
	return NULL;
}

int hyb_model_stream_start(struct hyb_model *m, const char *path, void *image, uint64_t size,
			   char *err, size_t errlen)
{
	struct hyb_model_stream *s = calloc(1, sizeof(*s));
	int rc;

	if (!s || !(s->path = strdup(path))) {
		free(s);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	s->image = image;
	s->size = size;
	/* no bar: the prompt's output shares the terminal with it */
	s->opts = (struct hyb_stream_opts){ .progress = HYB_STREAM_QUIET, .label = s->path,
					    .lazy_dst = 1, .landed = landed, .landed_arg = s,
					    .pread = hyb_model_load_pread() };
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->cond, NULL);
	rc = pthread_create(&s->thread, NULL, load_thread, s);
	if (rc) {
		snprintf(err, errlen, "%s: cannot start the loading thread: %s", path,
			 strerror(rc));
		pthread_cond_destroy(&s->cond);
		pthread_mutex_destroy(&s->lock);
		free(s->path);
		free(s);
		return -rc;
	}
	m->stream = s;
	return 0;
}

/* The end, in the file, of every tensor whose name starts with prefix (0: none). */
static uint64_t tensors_end(const struct hyb_gguf_file *f, const char *prefix)
{
	size_t n = strlen(prefix);
	uint64_t end = 0;

	for (uint64_t i = 0; i < f->n_tensors; i++) {
		const struct hyb_gguf_tensor *t = &f->tensors[i];
		uint64_t e = (uint64_t)((const uint8_t *)t->data - f->base) + t->nbytes;

		if (t->name.len >= n && !memcmp(t->name.ptr, prefix, n) && e > end)
			end = e;
	}
	return end;
}

/*
 * The end of the model-wide tensors the layers read (rope_freqs,
 * rope_factors_*: anything not a layer's, the embedding's or the head's).
 */
static uint64_t other_tensors_end(const struct hyb_gguf_file *f)
{
	uint64_t end = 0;

	for (uint64_t i = 0; i < f->n_tensors; i++) {
		const struct hyb_gguf_tensor *t = &f->tensors[i];
		const struct hyb_gguf_str nm = t->name;
		uint64_t e = (uint64_t)((const uint8_t *)t->data - f->base) + t->nbytes;

		if ((nm.len >= 4 && !memcmp(nm.ptr, "blk.", 4)) ||
		    (nm.len >= 11 && !memcmp(nm.ptr, "token_embd.", 11)) ||
		    (nm.len >= 6 && !memcmp(nm.ptr, "output", 6)))
			continue;
		if (e > end)
			end = e;
	}
	return end;
}

int hyb_model_stream_index(struct hyb_model *m, char *err, size_t errlen)
{
	struct hyb_model_stream *s = m->stream;
	char prefix[32];

	s->n_layer = m->hp.n_layer;
	s->layer_end = calloc(s->n_layer ? s->n_layer : 1, sizeof(*s->layer_end));
	if (!s->layer_end) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	s->embd_end = tensors_end(m->gguf, "token_embd.");
	s->head_end = tensors_end(m->gguf, "output");	/* output_norm. and output. */
	if (s->head_end < s->embd_end && m->output.data == m->tok_embd.data)
		s->head_end = s->embd_end;	/* tied head */
	for (uint32_t l = 0; l < s->n_layer; l++) {
		snprintf(prefix, sizeof(prefix), "blk.%u.", l);
		s->layer_end[l] = tensors_end(m->gguf, prefix);
	}
	/* layer 0 is the first to read the model-wide RoPE factors */
	if (s->n_layer && other_tensors_end(m->gguf) > s->layer_end[0])
		s->layer_end[0] = other_tensors_end(m->gguf);
	return 0;
}

void hyb_model_stream_stop(struct hyb_model *m)
{
	struct hyb_model_stream *s = m->stream;

	if (!s)
		return;
	atomic_store(&s->cancel, true);
	pthread_join(s->thread, NULL);
	pthread_cond_destroy(&s->cond);
	pthread_mutex_destroy(&s->lock);
	free(s->layer_end);
	free(s->path);
	free(s);
	m->stream = NULL;
}

int hyb_model_wait_bytes(const struct hyb_model *m, uint64_t end, char *err, size_t errlen)
{
	struct hyb_model_stream *s = m->stream;
	int state;

	if (!s || atomic_load_explicit(&s->landed, memory_order_acquire) >= end)
		return 0;
	pthread_mutex_lock(&s->lock);
	while ((state = atomic_load(&s->state)) == LOADING &&
	       atomic_load_explicit(&s->landed, memory_order_acquire) < end)
		pthread_cond_wait(&s->cond, &s->lock);
	pthread_mutex_unlock(&s->lock);
	if (state != FAILED || atomic_load_explicit(&s->landed, memory_order_acquire) >= end)
		return 0;
	snprintf(err, errlen, "loading the model failed: %s", s->err);
	return s->rc;
}

/*
 * The whole load, not only its bytes: the last bytes land before the load
 * thread has finished (its helpers joined, its statistics final), and a
 * caller that waited for the model may ask hyb_model_loading() and
 * hyb_model_load_stats() next.
 */
int hyb_model_wait(const struct hyb_model *m)
{
	struct hyb_model_stream *s = m->stream;
	int state;

	if (!s)
		return 0;
	pthread_mutex_lock(&s->lock);
	while ((state = atomic_load(&s->state)) == LOADING)
		pthread_cond_wait(&s->cond, &s->lock);
	pthread_mutex_unlock(&s->lock);
	if (state != FAILED)
		return 0;
	return hyb_error_set(s->rc, "loading the model failed: %s", s->err);
}

int hyb_model_wait_layer(const struct hyb_model *m, uint32_t l, char *err, size_t errlen)
{
	const struct hyb_model_stream *s = m->stream;

	return hyb_model_wait_bytes(m, s && l < s->n_layer ? s->layer_end[l] : 0, err, errlen);
}

int hyb_model_wait_embd(const struct hyb_model *m, char *err, size_t errlen)
{
	return hyb_model_wait_bytes(m, m->stream ? m->stream->embd_end : 0, err, errlen);
}

int hyb_model_wait_head(const struct hyb_model *m, char *err, size_t errlen)
{
	return hyb_model_wait_bytes(m, m->stream ? m->stream->head_end : 0, err, errlen);
}

bool hyb_model_loading(const struct hyb_model *m)
{
	return m->stream && atomic_load(&m->stream->state) == LOADING;
}

void hyb_model_load_stats(const struct hyb_model *m, struct hyb_stream_stats *out)
{
	const struct hyb_model_stream *s = m->stream;

	memset(out, 0, sizeof(*out));
	if (s && atomic_load_explicit(&s->state, memory_order_acquire) != LOADING)
		*out = s->stats;
}
