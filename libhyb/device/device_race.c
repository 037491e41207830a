// SPDX-License-Identifier: MIT
/*
 * Device-memory race detection for the CPU device's strict mode (see
 * device_race.h). Vector clocks: fr[s] is what the next operation of
 * stream s is ordered after (fr[s][t]: operations 1..fr[s][t] of stream t),
 * host[] what the host has seen complete, which everything queued after it
 * follows. A footprint is dropped once every stream's frontier (or the
 * host's) has passed it: no later operation can race with it.
 */
#include "device_race.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N HYB_RACE_STREAMS
#define RING 4096          /* clocks of recent operations, for waits and observations */
#define MAX_FOOTPRINTS 65536

struct clock {
	uint64_t seq;
	uint64_t vc[N];
};

struct footprint {
	int s;
	uint64_t seq;
	const char *what;
	struct hyb_span *sp;
	uint32_t n;
};

struct hyb_race {
	uint64_t fr[N][N], host[N];
	struct clock ring[N][RING];
	struct footprint *fp;
	size_t n_fp, cap_fp;
};

static const char *const stream_name[N] = { "compute", "critical", "reload" };

struct hyb_race *hyb_race_new(void)
{
	return calloc(1, sizeof(struct hyb_race));
}

void hyb_race_free(struct hyb_race *r)
{
	if (!r)
		return;
	for (size_t i = 0; i < r->n_fp; i++)
		free(r->fp[i].sp);
	free(r->fp);
	free(r);
}

static uint64_t max_u64(uint64_t a, uint64_t b)
{
	return a > b ? a : b;
}

/*
 * What operation seq of stream t is ordered after, itself included. When
 * its clock has left the ring, stream t's current frontier stands in: it is
 * ordered after at least as much, so a race may be missed but none is made up.
 */
static void clock_of(const struct hyb_race *r, int t, uint64_t seq, uint64_t vc[N])
{
	const struct clock *c = &r->ring[t][seq % RING];

	if (c->seq == seq)
		memcpy(vc, c->vc, sizeof(c->vc));
	else
		memcpy(vc, r->fr[t], sizeof(r->fr[t]));
	vc[t] = max_u64(vc[t], seq);
}

static bool overlap(const struct footprint *f, const struct hyb_span *sp, uint32_t n,
		    const struct hyb_span **x, const struct hyb_span **y)
{
	for (uint32_t i = 0; i < f->n; i++)
		for (uint32_t j = 0; j < n; j++)
			if ((f->sp[i].write || sp[j].write) && f->sp[i].a < sp[j].b &&
			    sp[j].a < f->sp[i].b) {
				*x = &f->sp[i];
				*y = &sp[j];
				return true;
			}
	return false;
}

/* Drop the footprints every stream (or the host) is now ordered after. */
static void trim(struct hyb_race *r)
{
	size_t k = 0;

	for (size_t i = 0; i < r->n_fp; i++) {
		const struct footprint *f = &r->fp[i];
		bool past = true;

		for (int u = 0; u < N && past; u++)
			if (u != f->s && max_u64(r->fr[u][f->s], r->host[f->s]) < f->seq)
				past = false;
		if (past)
			free(f->sp);
		else
			r->fp[k++] = *f;
	}
	r->n_fp = k;
}

int hyb_race_op(struct hyb_race *r, int s, uint64_t seq, const struct hyb_span *sp, uint32_t n,
		const char *what, char *msg, size_t len)
{
	uint64_t vc[N];
	int rc = 0;

	for (int t = 0; t < N; t++)
		vc[t] = max_u64(r->fr[s][t], r->host[t]);
	vc[s] = seq - 1;
	for (size_t i = 0; i < r->n_fp && !rc; i++) {
		const struct footprint *f = &r->fp[i];
		const struct hyb_span *x, *y;

		if (f->s == s || f->seq <= vc[f->s] || !overlap(f, sp, n, &x, &y))
			continue;
		snprintf(msg, len, "%s on the %s stream %s device memory %#lx..%#lx, which %s "
			 "queued before it on the %s stream %s, and nothing orders the two (no "
			 "event waited for, not seen complete by the host)", what, stream_name[s],
			 y->write ? "writes" : "reads", (unsigned long)y->a, (unsigned long)y->b,
			 f->what, stream_name[f->s], x->write ? "writes" : "reads");
		rc = -1;
	}
	memcpy(r->fr[s], vc, sizeof(vc));
	r->fr[s][s] = seq;
	r->ring[s][seq % RING].seq = seq;
	memcpy(r->ring[s][seq % RING].vc, r->fr[s], sizeof(vc));
	if (n) {
		if (r->n_fp == MAX_FOOTPRINTS) { /* never expected: forget the oldest */
			free(r->fp[0].sp);
			memmove(r->fp, r->fp + 1, --r->n_fp * sizeof(*r->fp));
		}
		if (r->n_fp == r->cap_fp) {
			size_t cap = r->cap_fp ? 2 * r->cap_fp : 64;
			struct footprint *p = realloc(r->fp, cap * sizeof(*p));

			if (!p)
				return rc;
			r->fp = p;
			r->cap_fp = cap;
		}
		struct footprint *f = &r->fp[r->n_fp];

		f->sp = malloc(n * sizeof(*sp));
		if (f->sp) {
			memcpy(f->sp, sp, n * sizeof(*sp));
			f->s = s;
			f->seq = seq;
			f->what = what;
			f->n = n;
			r->n_fp++;
		}
	}
	trim(r);
	return rc;
}

void hyb_race_wait(struct hyb_race *r, int s, int t, uint64_t seq)
{
	uint64_t vc[N];

	if (!seq)
		return;
	clock_of(r, t, seq, vc);
	for (int u = 0; u < N; u++)
		r->fr[s][u] = max_u64(r->fr[s][u], vc[u]);
	trim(r);
}

void hyb_race_observed(struct hyb_race *r, int t, uint64_t seq)
{
	uint64_t vc[N];

	if (!seq)
		return;
	clock_of(r, t, seq, vc);
	for (int u = 0; u < N; u++)
		r->host[u] = max_u64(r->host[u], vc[u]);
	trim(r);
}
