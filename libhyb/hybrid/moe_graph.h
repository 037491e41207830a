/* SPDX-License-Identifier: MIT */
/*
 * One device graph a decode step of a MoE model (KTransformers 3.3;
 * docs/MOE.md "One graph a step"): the device's part of a token - every
 * attention block, router, the device's experts through lists in device
 * memory, the shared experts, the head - captured once and launched each
 * step; the CPU's part runs on an executor thread that the graph's host
 * functions hand each layer to and wait for.
 */
#ifndef HYB_MOE_GRAPH_H
#define HYB_MOE_GRAPH_H

#include <stddef.h>
#include <stdint.h>

struct hyb_ctx;
struct hyb_moe_graph;

/* NULL with a one-line reason in err (the placement, out of memory, no thread). */
struct hyb_moe_graph *hyb_moe_graph_new(struct hyb_ctx *c, char *err, size_t errlen);
void hyb_moe_graph_free(struct hyb_moe_graph *g);
/*
 * A decode step: the first one queued as it goes (it sizes the device's
 * workspaces), the second captured, every later one a launch. 0, or -1
 * with err; after a failure the context decodes without graphs.
 */
int hyb_moe_graph_step(struct hyb_moe_graph *g, int32_t token, float *logits, char *err,
		       size_t errlen);
/* The executor's side (moe_hybrid.c's begin and end): the layer's lists are written; wait
 * for the device's expert outputs (-1: the step failed). */
void hyb_moe_graph_list_ready(struct hyb_moe_graph *g);
int hyb_moe_graph_outputs(struct hyb_moe_graph *g);

#endif
