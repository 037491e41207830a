// SPDX-License-Identifier: MIT
/*
 * Host functions and graphs on the CPU device (hyb/device.h; docs/DEVICE.md
 * "Graphs"): a host function runs in its stream's order and sees what the
 * copies before it landed (strict mode lands downloads at completion, so a
 * function run too early would read NaNs); a captured graph runs nothing
 * until launched and then does its work again at every launch, on the
 * current contents of its host buffers; the capture's rules refuse what
 * CUDA's stream capture refuses, and a refusal spoils the capture.
 */
#include <errno.h>
#include <string.h>
#include <time.h>

#include "hyb/device.h"
#include "hyb/tensor_type.h"
#include "test.h"

/* A slow device (10 MB/s link and memory): work takes milliseconds, the host is ahead. */
static const struct hyb_device_config slow = {
	.pcie_gbps = 0.01, .pcie_lat_us = 8, .hbm_gbps = 0.01, .launch_us = 5
};
#define N 4096u /* floats */

static struct hyb_device *open_dev(const struct hyb_device_config *cfg)
{
	struct hyb_device *d;

	setenv("HYB_DEVICE_STRICT", "1", 1);
	d = hyb_device_open("cpu", cfg);
	CHECK_MSG(d, "open: %s", hyb_last_error());
	return d;
}

static hyb_dptr dalloc(struct hyb_device *d, uint64_t n)
{
	hyb_dptr p;

	CHECK_MSG(hyb_device_alloc(d, n, &p) == 0, "alloc: %s", hyb_device_error(d));
	return p;
}

static void finish(struct hyb_device *d, enum hyb_stream s)
{
	struct hyb_device_event *ev = hyb_device_event_new(d);

	CHECK(ev);
	CHECK_MSG(hyb_device_record(d, s, ev) == 0 && hyb_device_sync(d, ev) == 0, "%s",
		  hyb_device_error(d));
	hyb_device_event_free(d, ev);
}

/* What the test's host function saw and did. */
struct fn_state {
	const float *read;     /* a download's destination */
	float *write;          /* an upload's source */
	float seen[8];
	int calls;
	double sleep_s, work_s;
	struct hyb_device *d;  /* for hyb_device_host_work only */
};

static void fn_body(void *arg)
{
	struct fn_state *f = arg;

	f->seen[f->calls % 8] = f->read ? f->read[N - 1] : 0;
	if (f->write)
		for (uint32_t i = 0; i < N; i++)
			f->write[i] = (float)(f->calls + 1) * 1000 + (float)i;
	if (f->sleep_s > 0) {
		struct timespec ts = { 0, (long)(f->sleep_s * 1e9) };

		nanosleep(&ts, NULL);
	}
	if (f->work_s > 0)
		hyb_device_host_work(f->d, f->work_s);
	f->calls++;
}

TEST(dev_host_fn_runs_in_stream_order)
{
	struct hyb_device *d = open_dev(&slow);
	float *in = hyb_device_host_alloc(d, 4 * N), *out = hyb_device_host_alloc(d, 4 * N);
	float *out2 = hyb_device_host_alloc(d, 4 * N);
	const hyb_dptr p = dalloc(d, 4 * N), q = dalloc(d, 4 * N);
	struct hyb_device_event *a = hyb_device_event_new_timed(d);
	struct hyb_device_event *b = hyb_device_event_new_timed(d), *ev = hyb_device_event_new(d);
	/* it rewrites the first upload's source, which strict mode allows only after that ran */
	struct fn_state f = { .read = out, .write = in, .sleep_s = 0.02 };
	double el;

	CHECK(in && out && out2 && a && b && ev);
	for (uint32_t i = 0; i < N; i++)
		in[i] = (float)i;
	/* up, a kernel, down, then the function, which reads the download and writes an upload's source */
	CHECK(hyb_device_h2d(d, HYB_STREAM_COMPUTE, p, in, 4 * N) == 0);
	CHECK(hyb_device_add(d, HYB_STREAM_COMPUTE, q, p, N) == 0); /* q was zero: q = in */
	CHECK(hyb_device_add(d, HYB_STREAM_COMPUTE, q, p, N) == 0); /* 2 in */
	CHECK(hyb_device_d2h(d, HYB_STREAM_COMPUTE, out, q, 4 * N) == 0);
	CHECK(hyb_device_record(d, HYB_STREAM_COMPUTE, a) == 0);
	CHECK_MSG(hyb_device_host_fn(d, HYB_STREAM_COMPUTE, fn_body, &f) == 0, "%s",
		  hyb_device_error(d));
	CHECK(hyb_device_record(d, HYB_STREAM_COMPUTE, b) == 0);
	CHECK_EQ_INT(f.calls, 1);
	CHECK_MSG(f.seen[0] == 2.0f * (N - 1), "the function read %g before the download landed",
		  f.seen[0]);
	/* what it wrote goes up after it: a strict upload's source may change before it runs */
	CHECK(hyb_device_h2d(d, HYB_STREAM_COMPUTE, p, in, 4 * N) == 0);
	CHECK(hyb_device_d2h(d, HYB_STREAM_COMPUTE, out2, p, 4 * N) == 0);
	finish(d, HYB_STREAM_COMPUTE);
	CHECK(out2[0] == 1000.0f && out2[N - 1] == 1000.0f + (float)(N - 1));
	/* the function's time is a stretch of its stream's timeline */
	CHECK_MSG(hyb_device_elapsed(d, a, b, &el) == 0, "%s", hyb_device_error(d));
	CHECK_MSG(el >= 0.02 && el < 1, "the function took %.4f s of the timeline", el);

	/* on another stream, after a wait: it sees the download that the event follows */
	f.read = out;
	f.write = NULL;
	f.sleep_s = 0;
	CHECK(hyb_device_add(d, HYB_STREAM_COMPUTE, q, p, N) == 0); /* 2 in + the new in */
	CHECK(hyb_device_d2h(d, HYB_STREAM_COMPUTE, out, q, 4 * N) == 0);
	CHECK(hyb_device_record(d, HYB_STREAM_COMPUTE, ev) == 0);
	CHECK(hyb_device_wait(d, HYB_STREAM_CRITICAL, ev) == 0);
	CHECK(hyb_device_host_fn(d, HYB_STREAM_CRITICAL, fn_body, &f) == 0);
	CHECK_MSG(f.seen[1] == 2.0f * (N - 1) + 1000.0f + (float)(N - 1), "saw %g", f.seen[1]);
	finish(d, HYB_STREAM_CRITICAL);

	CHECK_EQ_INT(hyb_device_host_fn(d, HYB_STREAM_RELOAD, fn_body, &f), -EINVAL);
	CHECK_EQ_INT(hyb_device_host_fn(d, HYB_STREAM_COMPUTE, NULL, &f), -EINVAL);
	CHECK_EQ_INT(f.calls, 2);
	hyb_device_event_free(d, a);
	hyb_device_event_free(d, b);
	hyb_device_event_free(d, ev);
	hyb_device_host_free(d, in);
	hyb_device_host_free(d, out);
	hyb_device_host_free(d, out2);
	hyb_device_close(d);
}

/* Virtual clock: a function's duration is the host work it reports, not the host's. */
TEST(dev_host_fn_virtual_clock)
{
	struct hyb_device_config cfg = slow;
	struct hyb_device *d;
	struct hyb_device_event *a, *b;
	struct fn_state f = { .work_s = 0.125 };
	double el, t0;

	cfg.virtual_clock = true;
	d = open_dev(&cfg);
	a = hyb_device_event_new_timed(d);
	b = hyb_device_event_new_timed(d);
	f.d = d;
	t0 = hyb_device_now(d);
	CHECK(hyb_device_record(d, HYB_STREAM_COMPUTE, a) == 0);
	CHECK(hyb_device_host_fn(d, HYB_STREAM_COMPUTE, fn_body, &f) == 0);
	CHECK(hyb_device_record(d, HYB_STREAM_COMPUTE, b) == 0);
	CHECK(hyb_device_now(d) == t0); /* the host did not do it */
	finish(d, HYB_STREAM_COMPUTE);
	CHECK(hyb_device_elapsed(d, a, b, &el) == 0);
	CHECK_NEAR(el, 0.125, 1e-12);
	CHECK_NEAR(hyb_device_now(d) - t0, 0.125, 1e-12); /* the host waited for it */
	hyb_device_event_free(d, a);
	hyb_device_event_free(d, b);
	hyb_device_close(d);
}

/*
 * COMPUTE: up, add, fork to CRITICAL (down, function), join; launched three
 * times with new host data: each launch adds the upload to q again.
 */
TEST(dev_graph_replays_captured_work)
{
	struct hyb_device *d = open_dev(&slow);
	float *in = hyb_device_host_alloc(d, 4 * N), *out = hyb_device_host_alloc(d, 4 * N);
	const hyb_dptr p = dalloc(d, 4 * N), q = dalloc(d, 4 * N);
	struct hyb_device_event *fork = hyb_device_event_new(d), *join = hyb_device_event_new(d);
	struct fn_state f = { .read = out };
	struct hyb_device_graph *g = NULL;
	struct hyb_device_stats st;
	float sum = 0;

	CHECK(in && out && fork && join);
	memset(out, 0, 4 * N);
	CHECK(!hyb_device_capturing(d));
	CHECK_MSG(hyb_device_capture_begin(d, HYB_STREAM_COMPUTE) == 0, "%s", hyb_device_error(d));
	CHECK(hyb_device_capturing(d));
	CHECK(hyb_device_h2d(d, HYB_STREAM_COMPUTE, p, in, 4 * N) == 0);
	CHECK(hyb_device_add(d, HYB_STREAM_COMPUTE, q, p, N) == 0);
	CHECK(hyb_device_record(d, HYB_STREAM_COMPUTE, fork) == 0);
	CHECK(hyb_device_wait(d, HYB_STREAM_CRITICAL, fork) == 0);
	CHECK(hyb_device_d2h(d, HYB_STREAM_CRITICAL, out, q, 4 * N) == 0);
	CHECK(hyb_device_host_fn(d, HYB_STREAM_CRITICAL, fn_body, &f) == 0);
	CHECK(hyb_device_record(d, HYB_STREAM_CRITICAL, join) == 0);
	CHECK(hyb_device_wait(d, HYB_STREAM_COMPUTE, join) == 0);
	CHECK_MSG(hyb_device_capture_end(d, &g) == 0 && g, "%s", hyb_device_error(d));
	CHECK(!hyb_device_capturing(d));
	/* nothing ran, nothing counted */
	finish(d, HYB_STREAM_COMPUTE);
	hyb_device_stats(d, &st);
	CHECK_EQ_INT(f.calls, 0);
	CHECK_EQ_INT(st.kernels, 0);
	CHECK_EQ_INT(st.copies[HYB_STREAM_COMPUTE] + st.copies[HYB_STREAM_CRITICAL], 0);
	/* the caller's events are its own again */
	hyb_device_event_free(d, fork);
	hyb_device_event_free(d, join);

	for (int it = 0; it < 3; it++) {
		for (uint32_t i = 0; i < N; i++)
			in[i] = (float)(it + 1) * 0.5f + (float)i;
		sum += (float)(it + 1) * 0.5f + (float)(N - 1);
		CHECK_MSG(hyb_device_graph_launch(d, g) == 0, "%s", hyb_device_error(d));
		CHECK_EQ_INT(f.calls, it + 1);
		CHECK_MSG(f.seen[it] == sum, "launch %d: the function saw %g, want %g", it,
			  f.seen[it], sum);
		finish(d, HYB_STREAM_COMPUTE); /* the join: CRITICAL's work is done too */
		CHECK(out[N - 1] == sum);
	}
	hyb_device_stats(d, &st);
	CHECK_EQ_INT(st.kernels, 3);
	CHECK_EQ_INT(st.h2d_bytes[HYB_STREAM_COMPUTE], 3ull * 4 * N);
	CHECK_EQ_INT(st.d2h_bytes[HYB_STREAM_CRITICAL], 3ull * 4 * N);

	/* the recorder checks again at launch: memory freed since is refused, not touched */
	hyb_device_free(d, q);
	CHECK_EQ_INT(hyb_device_graph_launch(d, g), -EINVAL);
	CHECK_MSG(strstr(hyb_device_error(d), "in no device allocation"), "%s",
		  hyb_device_error(d));
	hyb_device_graph_free(d, g);
	hyb_device_host_free(d, in);
	hyb_device_host_free(d, out);
	hyb_device_close(d);
}

/* Begin a capture on COMPUTE with one add in it. */
static void begin(struct hyb_device *d, hyb_dptr p)
{
	CHECK(hyb_device_capture_begin(d, HYB_STREAM_COMPUTE) == 0);
	CHECK(hyb_device_add(d, HYB_STREAM_COMPUTE, p + 4 * N, p, N) == 0);
}

/* End it: refused with the first error, which the message names. */
static void end_spoilt(struct hyb_device *d, int rc, const char *msg)
{
	struct hyb_device_graph *g = (struct hyb_device_graph *)&g;

	CHECK_EQ_INT(hyb_device_capture_end(d, &g), rc);
	CHECK(g == NULL && !hyb_device_capturing(d));
	CHECK_MSG(strstr(hyb_device_error(d), msg), "'%s' does not say '%s'", hyb_device_error(d),
		  msg);
}

TEST(dev_capture_refuses_what_a_gpu_refuses)
{
	struct hyb_device *d = open_dev(&slow);
	const hyb_dptr p = dalloc(d, 8 * N);
	struct hyb_device_event *ev = hyb_device_event_new(d), *ev2 = hyb_device_event_new(d);
	struct hyb_device_graph *g;
	float *buf = hyb_device_host_alloc(d, 4 * N);
	hyb_dptr x;

	CHECK(ev && ev2 && buf);
	CHECK_EQ_INT(hyb_device_capture_begin(d, HYB_STREAM_RELOAD), -EINVAL);
	CHECK_EQ_INT(hyb_device_capture_end(d, &g), -EINVAL); /* none under way */
	CHECK_EQ_INT(hyb_device_graph_launch(d, NULL), -EINVAL);

	/* calls that are not queued work */
	begin(d, p);
	CHECK_EQ_INT(hyb_device_alloc(d, 256, &x), -EBUSY);
	end_spoilt(d, -EBUSY, "device alloc during a capture");
	begin(d, p);
	CHECK(hyb_device_record(d, HYB_STREAM_COMPUTE, ev) == 0);
	CHECK_EQ_INT(hyb_device_sync(d, ev), -EBUSY);
	end_spoilt(d, -EBUSY, "sync during a capture");
	begin(d, p);
	CHECK(hyb_device_host_alloc(d, 64) == NULL);
	end_spoilt(d, -EBUSY, "host alloc during a capture");
	begin(d, p);
	CHECK_EQ_INT(hyb_device_capture_begin(d, HYB_STREAM_CRITICAL), -EBUSY);
	end_spoilt(d, -EBUSY, "a capture is under way");
	/* streams outside it */
	begin(d, p);
	CHECK_EQ_INT(hyb_device_add(d, HYB_STREAM_CRITICAL, p + 4 * N, p, N), -EBUSY);
	/* later work is refused with the first error */
	CHECK_EQ_INT(hyb_device_add(d, HYB_STREAM_COMPUTE, p + 4 * N, p, N), -EBUSY);
	end_spoilt(d, -EBUSY, "the CRITICAL stream is not in it");
	begin(d, p);
	CHECK_EQ_INT(hyb_device_h2d(d, HYB_STREAM_RELOAD, p, buf, 64), -EBUSY);
	end_spoilt(d, -EBUSY, "RELOAD stream is never captured");
	/* a wait for work outside the capture */
	CHECK(hyb_device_record(d, HYB_STREAM_CRITICAL, ev2) == 0);
	begin(d, p);
	CHECK_EQ_INT(hyb_device_wait(d, HYB_STREAM_COMPUTE, ev2), -EBUSY);
	end_spoilt(d, -EBUSY, "was not recorded in it");
	/* a joined stream left loose */
	begin(d, p);
	CHECK(hyb_device_record(d, HYB_STREAM_COMPUTE, ev) == 0);
	CHECK(hyb_device_wait(d, HYB_STREAM_CRITICAL, ev) == 0);
	CHECK(hyb_device_d2h(d, HYB_STREAM_CRITICAL, buf, p, 64) == 0);
	end_spoilt(d, -EINVAL, "CRITICAL stream's last work is not joined back");
	/* ... or joined before its last work */
	begin(d, p);
	CHECK(hyb_device_record(d, HYB_STREAM_COMPUTE, ev) == 0);
	CHECK(hyb_device_wait(d, HYB_STREAM_CRITICAL, ev) == 0);
	CHECK(hyb_device_d2h(d, HYB_STREAM_CRITICAL, buf, p, 64) == 0);
	CHECK(hyb_device_record(d, HYB_STREAM_CRITICAL, ev2) == 0);
	CHECK(hyb_device_wait(d, HYB_STREAM_COMPUTE, ev2) == 0);
	CHECK(hyb_device_d2h(d, HYB_STREAM_CRITICAL, buf + 16, p, 64) == 0);
	end_spoilt(d, -EINVAL, "not joined back");
	/* a bad argument spoils it too */
	begin(d, p);
	CHECK_EQ_INT(hyb_device_add(d, HYB_STREAM_COMPUTE, p + 8 * N, p, N), -EINVAL);
	end_spoilt(d, -EINVAL, "add y");
	/* and a launch inside a capture */
	begin(d, p);
	CHECK(hyb_device_capture_end(d, &g) == 0);
	begin(d, p);
	CHECK_EQ_INT(hyb_device_graph_launch(d, g), -EBUSY);
	end_spoilt(d, -EBUSY, "graph launch during a capture");
	/* the device works on after all of it, and the graph too */
	CHECK_MSG(hyb_device_graph_launch(d, g) == 0, "%s", hyb_device_error(d));
	finish(d, HYB_STREAM_COMPUTE);
	hyb_device_graph_free(d, g);
	hyb_device_event_free(d, ev);
	hyb_device_event_free(d, ev2);
	hyb_device_host_free(d, buf);
	/* a capture left open at close is let go */
	begin(d, p);
	CHECK(hyb_device_capturing(d));
	hyb_device_close(d);
}

/*
 * The attention's position from device memory (pos_at): the by-value
 * call's bits at that position; refused with a batch, misaligned or
 * overlapping an output; a position past the cache found there faults.
 */
TEST(dev_attention_pos_at)
{
	static const struct hyb_rope rope = { .base = 10000.0f, .freq_scale = 1.0f,
					      .attn_factor = 1.0f };
	const uint32_t qd = 64, kvd = 32, n_ctx = 8;
	struct hyb_device *d = open_dev(NULL);
	const hyb_dptr buf = dalloc(d, 4 * (2 * qd + 2 * kvd)), pos_at = dalloc(d, 256);
	struct hyb_dev_attn a = { .n_head = 2, .n_head_kv = 1, .head_dim = 32, .n_rot = 32,
				  .rope = &rope, .n_ctx = n_ctx, .q = buf, .k = buf + 4 * qd,
				  .v = buf + 4 * (qd + kvd), .out = buf + 4 * (qd + 2 * kvd) };
	float in[64 + 2 * 32], out[2][64];
	uint32_t pos;

	a.kcache = dalloc(d, 2 * kvd * n_ctx);
	a.vcache = dalloc(d, 2 * kvd * n_ctx);
	for (int side = 0; side < 2; side++) {
		for (uint32_t i = 0; i < qd + 2 * kvd; i++)
			in[i] = (float)((i * 37 + 11) % 23) / 11.0f - 1;
		CHECK(hyb_device_h2d(d, HYB_STREAM_COMPUTE, buf, in, sizeof(in)) == 0);
		a.pos = side ? 0 : 5;
		pos = 5;
		a.pos_at = side ? pos_at : 0;
		CHECK(hyb_device_h2d(d, HYB_STREAM_COMPUTE, pos_at, &pos, 4) == 0);
		CHECK_MSG(hyb_device_attention(d, HYB_STREAM_COMPUTE, &a) == 0, "%s",
			  hyb_device_error(d));
		CHECK(hyb_device_d2h(d, HYB_STREAM_COMPUTE, out[side], a.out, sizeof(out[0])) == 0);
		finish(d, HYB_STREAM_COMPUTE);
	}
	CHECK(!memcmp(out[0], out[1], sizeof(out[0])));
	a.batch = 2;
	CHECK_EQ_INT(hyb_device_attention(d, HYB_STREAM_COMPUTE, &a), -EINVAL);
	CHECK(strstr(hyb_device_error(d), "with its position in device memory"));
	a.batch = 0;
	a.pos_at = pos_at + 2;
	CHECK_EQ_INT(hyb_device_attention(d, HYB_STREAM_COMPUTE, &a), -EINVAL);
	CHECK(strstr(hyb_device_error(d), "not 4-byte aligned"));
	a.pos_at = a.out + 8;
	CHECK_EQ_INT(hyb_device_attention(d, HYB_STREAM_COMPUTE, &a), -EINVAL);
	CHECK(strstr(hyb_device_error(d), "pos_at overlaps out"));
	a.pos_at = pos_at;
	pos = n_ctx;
	CHECK(hyb_device_h2d(d, HYB_STREAM_COMPUTE, pos_at, &pos, 4) == 0);
	finish(d, HYB_STREAM_COMPUTE);
	CHECK_EQ_INT(hyb_device_attention(d, HYB_STREAM_COMPUTE, &a), -EIO);
	CHECK_MSG(strstr(hyb_device_error(d), "position 8 read from device memory"), "%s",
		  hyb_device_error(d));
	hyb_device_close(d);
}

/* ---- matvecs listed in device memory ---------------------------------------------------- */

#define T_IN 64u
#define T_OUT 48u
#define T_SLOTS 6u
#define T_ROWS 5u

struct tab {
	struct hyb_device *d;
	hyb_dptr w, x, y, items;
	struct hyb_dev_matvec_table t;
	uint64_t stride;
	uint32_t list[1 + 3 * 17]; /* what goes up: a copy's source stays until it ran */
};

/* Q4_0 weights in 6 slots (stride: a slot rounded up to 16 and 32 more), 5 x and y rows. */
static void tab_init(struct tab *b)
{
	const uint64_t rb = hyb_row_bytes(HYB_TYPE_Q4_0, T_IN), slot = rb * T_OUT;
	uint8_t *w;
	float x[T_ROWS * T_IN], y[T_ROWS * T_OUT];

	b->d = open_dev(NULL);
	b->stride = (slot + 15) / 16 * 16 + 32;
	w = malloc(b->stride * T_SLOTS);
	CHECK(w);
	for (uint64_t i = 0; i < b->stride * T_SLOTS; i++)
		w[i] = (uint8_t)(i * 131 + 7);
	for (uint32_t s = 0; s < T_SLOTS; s++) /* sane scales: F16 0.01 at each block's head */
		for (uint32_t r = 0; r < T_OUT * T_IN / 32; r++)
			memcpy(w + s * b->stride + r * 18, &(uint16_t){ 0x211f }, 2);
	for (uint32_t i = 0; i < T_ROWS * T_IN; i++)
		x[i] = (float)((i * 29) % 17) / 8 - 1;
	for (uint32_t i = 0; i < T_ROWS * T_OUT; i++)
		y[i] = (float)i;
	b->w = dalloc(b->d, b->stride * T_SLOTS);
	b->x = dalloc(b->d, sizeof(x));
	b->y = dalloc(b->d, sizeof(y));
	b->items = dalloc(b->d, 4 + 12 * 16);
	CHECK(hyb_device_h2d(b->d, HYB_STREAM_COMPUTE, b->w, w, b->stride * T_SLOTS) == 0);
	CHECK(hyb_device_h2d(b->d, HYB_STREAM_COMPUTE, b->x, x, sizeof(x)) == 0);
	CHECK(hyb_device_h2d(b->d, HYB_STREAM_COMPUTE, b->y, y, sizeof(y)) == 0);
	finish(b->d, HYB_STREAM_COMPUTE);
	free(w);
	b->t = (struct hyb_dev_matvec_table){
		.type = HYB_TYPE_Q4_0, .n_in = T_IN, .n_out = T_OUT, .w = b->w,
		.w_stride = b->stride, .n_w = T_SLOTS, .x = b->x, .n_x = T_ROWS, .y = b->y,
		.n_y = T_ROWS, .items = b->items, .max = 16,
	};
}

static void tab_list(struct tab *b, const uint32_t *list, uint32_t n)
{
	b->list[0] = n;
	memcpy(b->list + 1, list, 12ull * (n <= 16 ? n : 0));
	CHECK(hyb_device_h2d(b->d, HYB_STREAM_COMPUTE, b->items, b->list,
			     4 + 12ull * (n <= 16 ? n : 0)) == 0);
}

static void tab_y(struct tab *b, float *y)
{
	CHECK(hyb_device_d2h(b->d, HYB_STREAM_COMPUTE, y, b->y, 4 * T_ROWS * T_OUT) == 0);
	finish(b->d, HYB_STREAM_COMPUTE);
}

/*
 * The list's items are hyb_device_matvec's, bit for bit, rows not listed
 * untouched; accumulate too; a bad list found when it runs faults and
 * writes nothing; bad arguments are refused when queued.
 */
TEST(dev_matvec_table)
{
	static const uint32_t list[] = { 3, 0, 4, /* slot, x row, y row */ 0, 0, 1, 5, 2, 0 };
	struct tab b;
	float y[T_ROWS * T_OUT], want[T_ROWS * T_OUT], row[T_OUT];

	for (int acc = 0; acc < 2; acc++) {
		tab_init(&b);
		b.t.accumulate = acc;
		tab_y(&b, want);
		for (int i = 0; i < 3; i++) {
			const uint32_t *e = list + 3 * i;
			const hyb_dptr tmp = dalloc(b.d, 4 * T_OUT);
			const struct hyb_dev_matvec m = {
				.type = HYB_TYPE_Q4_0, .n_in = T_IN, .n_out = T_OUT,
				.w = b.w + e[0] * b.stride, .x = b.x + 4ull * T_IN * e[1], .y = tmp,
				.accumulate = acc,
			};

			memcpy(row, want + e[2] * T_OUT, sizeof(row));
			CHECK(hyb_device_h2d(b.d, HYB_STREAM_COMPUTE, tmp, row, sizeof(row)) == 0);
			CHECK(hyb_device_matvec(b.d, HYB_STREAM_COMPUTE, &m) == 0);
			CHECK(hyb_device_d2h(b.d, HYB_STREAM_COMPUTE, want + e[2] * T_OUT, tmp,
					     sizeof(row)) == 0);
			finish(b.d, HYB_STREAM_COMPUTE);
			hyb_device_free(b.d, tmp);
		}
		tab_list(&b, list, 3);
		CHECK_MSG(hyb_device_matvec_table(b.d, HYB_STREAM_COMPUTE, &b.t) == 0, "%s",
			  hyb_device_error(b.d));
		tab_y(&b, y);
		CHECK_MSG(!memcmp(y, want, sizeof(y)), "accumulate %d: not the matvecs' bits", acc);
		hyb_device_close(b.d);
	}

	/* refused when queued */
	tab_init(&b);
	struct hyb_dev_matvec_table t = b.t;

	t.max = 0;
	CHECK_EQ_INT(hyb_device_matvec_table(b.d, HYB_STREAM_COMPUTE, &t), -EINVAL);
	t.max = HYB_DEVICE_GROUP_MAX + 1;
	CHECK_EQ_INT(hyb_device_matvec_table(b.d, HYB_STREAM_COMPUTE, &t), -EINVAL);
	t = b.t;
	t.w_stride = b.stride - 8;
	CHECK_EQ_INT(hyb_device_matvec_table(b.d, HYB_STREAM_COMPUTE, &t), -EINVAL);
	CHECK(strstr(hyb_device_error(b.d), "w_stride"));
	t = b.t;
	t.n_w = T_SLOTS + 1; /* the last slot past the allocation */
	CHECK_EQ_INT(hyb_device_matvec_table(b.d, HYB_STREAM_COMPUTE, &t), -EINVAL);
	t = b.t;
	t.y = b.x;
	t.n_y = 1;
	CHECK_EQ_INT(hyb_device_matvec_table(b.d, HYB_STREAM_COMPUTE, &t), -EINVAL);
	CHECK(strstr(hyb_device_error(b.d), "y overlaps x"));
	hyb_device_close(b.d);

	/* bad lists: the device faults */
	static const uint32_t bad[][6] = {
		{ 6, 0, 0, 0, 0, 1 },  /* slot 6 of 6 */
		{ 0, 5, 0, 0, 0, 1 },  /* x row 5 of 5 */
		{ 0, 0, 1, 1, 1, 1 },  /* y row 1 twice */
	};
	for (int k = 0; k < 4; k++) {
		tab_init(&b);
		tab_y(&b, want);
		if (k < 3)
			tab_list(&b, bad[k], 2);
		else
			tab_list(&b, list, 17); /* a count above max */
		CHECK_EQ_INT(hyb_device_matvec_table(b.d, HYB_STREAM_COMPUTE, &b.t), -EIO);
		CHECK_MSG(strstr(hyb_device_error(b.d), "matvec table"), "%s", hyb_device_error(b.d));
		hyb_device_close(b.d);
	}
}

/* In a graph: the list changes between launches, as a router's choice does. */
TEST(dev_matvec_table_in_a_graph)
{
	static const uint32_t lists[3][7] = {
		{ 2, 1, 0, 0, 2, 1, 1 }, { 1, 5, 4, 4, 0, 0, 0 }, { 2, 0, 1, 2, 3, 2, 3 },
	};
	struct tab b, r;
	struct hyb_device_graph *g = NULL;
	uint32_t *hl;
	float y[T_ROWS * T_OUT], want[T_ROWS * T_OUT];

	tab_init(&b);
	tab_init(&r);
	hl = hyb_device_host_alloc(b.d, 4 + 12 * 16);
	CHECK(hl);
	CHECK(hyb_device_capture_begin(b.d, HYB_STREAM_COMPUTE) == 0);
	CHECK(hyb_device_h2d(b.d, HYB_STREAM_COMPUTE, b.items, hl, 4 + 12 * 16) == 0);
	CHECK(hyb_device_matvec_table(b.d, HYB_STREAM_COMPUTE, &b.t) == 0);
	CHECK_MSG(hyb_device_capture_end(b.d, &g) == 0, "%s", hyb_device_error(b.d));
	for (int i = 0; i < 3; i++) {
		memcpy(hl, lists[i], sizeof(lists[i]));
		CHECK(hyb_device_graph_launch(b.d, g) == 0);
		tab_y(&b, y);
		tab_list(&r, lists[i] + 1, lists[i][0]);
		CHECK(hyb_device_matvec_table(r.d, HYB_STREAM_COMPUTE, &r.t) == 0);
		tab_y(&r, want);
		CHECK_MSG(!memcmp(y, want, sizeof(y)), "launch %d", i);
	}
	hyb_device_graph_free(b.d, g);
	hyb_device_host_free(b.d, hl);
	hyb_device_close(b.d);
	hyb_device_close(r.d);
}
