/* SPDX-License-Identifier: MIT */
/*
 * Test-only switches: what hyb's own tests turn on to check the engine or to
 * inject faults. Applications leave them off; docs/ENVIRONMENT.md lists
 * them with every other switch.
 */
#ifndef HYB_TESTING_H
#define HYB_TESTING_H

/*
 * hyb_ctx_params.testing bits.
 *
 * HYB_TESTING_FFN_ORACLE: sparse and hybrid decoding sum the FFN output
 * group by group in group order, each group's partial from one
 * single-threaded operator call, so a correct schedule - every listed neuron
 * computed exactly once, from the right bytes - gives bit-identical output
 * whatever the balancer moved where (on the CPU device).
 */
#define HYB_TESTING_FFN_ORACLE		(1u << 0)
/*
 * HYB_TESTING_CHECK_ROUTERS: where the expert cache computed routers'
 * logits on the device (this layer's and, for prefetch, the next one's),
 * the CPU computes them too and a step whose logits differ by a bit fails
 * (-EIO). For the CPU device, whose kernels are the CPU's.
 */
#define HYB_TESTING_CHECK_ROUTERS	(1u << 1)

/*
 * Environment variables read as fault injection or checking (set = on):
 *
 * HYB_TESTING_ENV_STREAM_FAULT "OFF[,SPAN[,1]]": the streaming engine's reads
 *   covering file bytes [OFF, OFF + SPAN) fail with EIO (",1": once only).
 * HYB_TESTING_ENV_REFUSE_DIRECT: opening with O_DIRECT fails as on a
 *   filesystem without it, so the buffered fallback runs.
 * HYB_TESTING_ENV_NO_URING: the streaming engine behaves as where the kernel
 *   refuses io_uring (ENOSYS): its pread threads read instead.
 * HYB_TESTING_ENV_RELOAD_STREAM: hybd's reload service sends every LOAD chunk
 *   through the streaming engine instead of its batched reader.
 * HYB_TESTING_ENV_DEVICE_STRICT "1": the CPU device holds the host to a GPU's
 *   rules (docs/DEVICE.md): copies land when their modelled time completes,
 *   device-memory races between streams are faults.
 */
#define HYB_TESTING_ENV_STREAM_FAULT	"HYB_STREAM_FAULT"
#define HYB_TESTING_ENV_REFUSE_DIRECT	"HYB_STREAM_REFUSE_DIRECT"
#define HYB_TESTING_ENV_RELOAD_STREAM	"HYB_RELOAD_STREAM"
#define HYB_TESTING_ENV_NO_URING	"HYB_STREAM_NO_URING"
#define HYB_TESTING_ENV_DEVICE_STRICT	"HYB_DEVICE_STRICT"

#endif
