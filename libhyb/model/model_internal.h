/* SPDX-License-Identifier: MIT */
/* What the model loaders share: model_load.c (files) and model_box.c (hybd's pools). */
#ifndef HYB_MODEL_INTERNAL_H
#define HYB_MODEL_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

struct hyb_model;
struct hyb_gguf_tensor;
struct hyb_weight_split;

/*
 * Once m->gguf describes the model and each tensor's data points at its
 * bytes: hyperparameters, binding and shape checks, the tokenizer. label
 * prefixes errors (the file or the manifest). 0, or a negative errno with
 * the reason in err.
 */
int hyb_model_finish(struct hyb_model *m, const char *label, char *err, size_t errlen);
/* Box mode's part of hyb_model_free (nothing for other models). */
void hyb_model_box_release(struct hyb_model *m);
/* A box-mode tensor's rows split across nodes (docs/NUMA.md), or NULL. */
const struct hyb_weight_split *hyb_model_box_split(const struct hyb_model *m,
						  const struct hyb_gguf_tensor *t);
/* The parts of rows [r0, r0 + n) of sp (a fused tensor's slice), kept with the model; NULL: out of memory. */
const struct hyb_weight_split *hyb_model_box_split_rows(const struct hyb_model *m,
						       const struct hyb_weight_split *sp,
						       uint64_t r0, uint64_t n,
						       uint64_t row_bytes);

#endif
