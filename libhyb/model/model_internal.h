/* SPDX-License-Identifier: MIT */
/* What the model loaders share: model_load.c (files) and model_box.c (hybd's pools). */
#ifndef HYB_MODEL_INTERNAL_H
#define HYB_MODEL_INTERNAL_H

#include <stddef.h>

struct hyb_model;

/*
 * Once m->gguf describes the model and each tensor's data points at its
 * bytes: hyperparameters, binding and shape checks, the tokenizer. label
 * prefixes errors (the file or the manifest). 0, or a negative errno with
 * the reason in err.
 */
int hyb_model_finish(struct hyb_model *m, const char *label, char *err, size_t errlen);
/* Box mode's part of hyb_model_free (nothing for other models). */
void hyb_model_box_release(struct hyb_model *m);

#endif
