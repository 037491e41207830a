/* SPDX-License-Identifier: MIT */
/*
 * libhyb, the whole public API: `#include <hyb/hyb.h>` and link with
 * `pkg-config --libs hyb`. Every exported name starts with hyb_ (HYB_ for
 * constants). Errors: 0 or a negative errno (or a pointer, NULL on failure)
 * and a one-line message - docs/API.md says where each object keeps it.
 *
 * The offline planner is a library of its own (libhybplan: hyb/planner.h,
 * hyb/profile.h); test-only switches are in hyb/testing.h.
 */
#ifndef HYB_HYB_H
#define HYB_HYB_H

#include "hyb/error.h"		/* hyb_last_error */
#include "hyb/tensor_type.h"	/* tensor element types */
#include "hyb/gguf.h"		/* GGUF read and write */
#include "hyb/model.h"		/* models and contexts: the forward pass */
#include "hyb/tokenizer.h"
#include "hyb/chat.h"		/* chat templates */
#include "hyb/sampler.h"
#include "hyb/generate.h"	/* the generation loop */
#include "hyb/threadpool.h"
#include "hyb/clock.h"
#include "hyb/plan.h"		/* the plan file: groups, predictors, placement */
#include "hyb/hybrid.h"		/* hybrid GPU-CPU decoding of a plan */
#include "hyb/balancer.h"	/* the online neuron balancer */
#include "hyb/device.h"		/* the device layer: CPU-executed and CUDA */
#include "hyb/stream.h"		/* io_uring streaming of file ranges */
#include "hyb/pool.h"		/* memory pools and the reload queue */
#include "hyb/manifest.h"	/* box mode: where hybd put a model */
#include "hyb/gpucache.h"	/* box mode: hybd's GPU neuron cache */
#include "hyb/app_stats.h"	/* box mode: what an app publishes */
#include "hyb/stalls.h"		/* box mode: hybd's reload statistics */
#include "hyb/membw.h"		/* DRAM bandwidth, measured */
#include "hyb/roofline.h"	/* CPU kernel peaks, measured */

#endif
