// SPDX-License-Identifier: MIT
/*
 * The two device-side bandwidths of the hybrid roofline (each bandwidth
 * measured in the same run), measured through the device layer
 * itself, so they are what the engine's own copies and kernels get:
 *
 *   link: one host-to-device copy of `bytes` from pinned host memory on the
 *         CRITICAL stream (not cut into chunks as RELOAD is), timed by events;
 *   device memory: hyb_device_add over bytes / 8 floats (y += x: it reads
 *         two floats and writes one, 12 bytes an element, as the CPU device
 *         also counts it), timed by events.
 *
 * Each is the best of reps after one untimed warm-up (first use pays for
 * lazy set-up): a roofline is the most the hardware gives. On the CPU device
 * the clock is its model's, so this returns the modelled figures back, which
 * is what a roofline of modelled runs must use.
 */
#include <errno.h>
#include <string.h>

#include "hyb/device.h"

static int timed(struct hyb_device *d, enum hyb_stream s, struct hyb_device_event *a,
		 struct hyb_device_event *b, int op, void *host, hyb_dptr buf, uint64_t bytes,
		 double *secs)
{
	int rc = hyb_device_record(d, s, a);

	if (!rc)
		rc = op ? hyb_device_add(d, s, buf, buf + bytes / 2, (uint32_t)(bytes / 8))
			: hyb_device_h2d(d, s, buf, host, bytes);
	if (!rc)
		rc = hyb_device_record(d, s, b);
	if (!rc)
		rc = hyb_device_sync(d, b);
	if (!rc)
		rc = hyb_device_elapsed(d, a, b, secs);
	return rc;
}

int hyb_device_measure_bw(struct hyb_device *d, uint64_t bytes, int reps,
			  struct hyb_device_bw *out)
{
	struct hyb_device_event *a = NULL, *b = NULL;
	hyb_dptr buf = 0;
	void *host = NULL;
	int rc = -ENOMEM;

	memset(out, 0, sizeof(*out));
	bytes &= ~(uint64_t)511; /* two halves of whole floats, 256-byte aligned */
	if (!d || bytes < 4096 || bytes / 8 > UINT32_MAX || reps < 1)
		return -EINVAL;
	host = hyb_device_host_alloc(d, bytes);
	a = hyb_device_event_new_timed(d);
	b = hyb_device_event_new_timed(d);
	if (!host || !a || !b)
		goto out;
	memset(host, 0, bytes); /* floats of 0: the add reads numbers, never NaNs */
	rc = hyb_device_alloc(d, bytes, &buf);
	if (rc)
		goto out;
	for (int op = 0; op < 2 && !rc; op++) {
		const enum hyb_stream s = op ? HYB_STREAM_COMPUTE : HYB_STREAM_CRITICAL;
		const double moved = op ? 1.5 * (double)bytes : (double)bytes;
		double best = 0, t;

		for (int r = 0; r <= reps && !rc; r++) {
			rc = timed(d, s, a, b, op, host, buf, bytes, &t);
			if (!rc && r > 0 && t > 0 && moved / t > best)
				best = moved / t;
		}
		if (op)
			out->hbm_gbps = best / 1e9;
		else
			out->pcie_gbps = best / 1e9;
	}
out:
	if (buf)
		hyb_device_free(d, buf);
	hyb_device_event_free(d, a);
	hyb_device_event_free(d, b);
	hyb_device_host_free(d, host);
	return rc;
}
