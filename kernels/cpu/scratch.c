// SPDX-License-Identifier: MIT
/*
 * Per-thread scratch buffers for the packing GEMMs. They grow on demand and
 * are freed when the thread exits (pthread key destructor), so short-lived
 * threads do not leak.
 */
#include <pthread.h>
#include <stdlib.h>

#include "cpu_internal.h"

struct scratch {
	void *buf[HYB_SCRATCH_N];
	size_t size[HYB_SCRATCH_N];
};

static pthread_key_t key;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int key_ok;

static void scratch_free(void *p)
{
	struct scratch *s = p;

	for (int i = 0; i < HYB_SCRATCH_N; i++)
		free(s->buf[i]);
	free(s);
}

static void make_key(void)
{
	key_ok = pthread_key_create(&key, scratch_free) == 0;
}

void *hyb_cpu_scratch(int slot, size_t bytes)
{
	struct scratch *s;

	pthread_once(&once, make_key);
	if (!key_ok || slot < 0 || slot >= HYB_SCRATCH_N)
		return NULL;
	s = pthread_getspecific(key);
	if (!s) {
		s = calloc(1, sizeof(*s));
		if (!s || pthread_setspecific(key, s)) {
			free(s);
			return NULL;
		}
	}
	if (s->size[slot] < bytes) {
		/* round up so that slowly growing requests do not reallocate each time */
		size_t sz = (bytes + bytes / 4 + 4095) & ~(size_t)4095;
		void *p = aligned_alloc(64, sz);

		if (!p)
			return NULL;
		free(s->buf[slot]);
		s->buf[slot] = p;
		s->size[slot] = sz;
	}
	return s->buf[slot];
}
