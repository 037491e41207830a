/* SPDX-License-Identifier: MIT */
/*
 * Graphs, the front end's side (device_graph.c; docs/DEVICE.md "Graphs"):
 * the rules of a capture, checked for every implementation, and the
 * recorder that gives an implementation without graphs of its own (the CPU
 * device) recorded calls replayed through the front end.
 *
 * device.c calls hyb_capture_take after an op's checks, before its
 * implementation: < 0 refused (the capture is spoilt), 0 go on (no capture,
 * or the implementation captures), 1 recorded here (the op returns 0).
 */
#ifndef HYB_DEVICE_GRAPH_H
#define HYB_DEVICE_GRAPH_H

#include "device_internal.h"

enum hyb_cap_kind {
	CAP_H2D, CAP_D2H, CAP_HOST_FN, CAP_SPARSE_FFN, CAP_ADD, CAP_FFN_ACT, CAP_RMSNORM,
	CAP_MATVEC, CAP_MATVEC_GROUP, CAP_MATVEC_TABLE, CAP_ATTENTION, CAP_PREDICT, CAP_TEAL,
	CAP_RECORD, CAP_WAIT, /* the recorder's own: slot is the graph's event */
};

struct hyb_cap_node {
	uint8_t kind, s;
	union {
		struct { hyb_dptr dev; void *host; uint64_t len; } copy;
		struct { hyb_device_host_fn_t fn; void *arg; } fn;
		struct hyb_dev_ffn ffn;
		struct { hyb_dptr y, x; uint32_t n; } add;
		struct { hyb_dptr g, u; uint32_t n; enum hyb_ffn_act act; } act;
		struct { hyb_dptr y, x, w; uint32_t n, rows; float eps; } norm;
		struct hyb_dev_matvec mv;
		struct { const struct hyb_dev_matvec *items; uint32_t n; } group; /* copied */
		struct hyb_dev_matvec_table table;
		struct hyb_dev_attn attn;
		struct hyb_dev_predict pred;
		struct hyb_dev_teal teal;
		uint32_t slot;
	} u;
};

/* Queued work on stream s (n: its arguments, for the recorder). */
int hyb_capture_take(struct hyb_device *d, int s, const struct hyb_cap_node *n);
/* A call that is not queued work: -EBUSY while a capture is under way. */
int hyb_capture_busy(struct hyb_device *d, const char *what);
/* record / wait during a capture (the event table, joins): as take. */
int hyb_capture_record(struct hyb_device *d, int s, struct hyb_device_event *ev);
int hyb_capture_wait(struct hyb_device *d, int s, struct hyb_device_event *ev);
/* hyb_device_fail during a capture: it is spoilt, capture_end will say why. */
void hyb_capture_spoil(struct hyb_device *d, int rc);
/* close: a capture left open is abandoned. */
void hyb_capture_drop(struct hyb_device *d);

#endif
