/* SPDX-License-Identifier: MIT */
/* DeepSeek's multi-head latent attention on the CPU (attention_mla.c). */
#ifndef HYB_ATTENTION_MLA_H
#define HYB_ATTENTION_MLA_H

#include <stdint.h>

struct hyb_ctx;
struct hyb_model;
struct hyb_mla_scratch;

/* Scratch for batches of up to nb tokens of model m (hparams kv_lora > 0); NULL: no memory. */
struct hyb_mla_scratch *hyb_mla_scratch_new(const struct hyb_model *m, uint32_t nb);
void hyb_mla_scratch_free(struct hyb_mla_scratch *s);
/* Layer l's latent attention block for n tokens at c->n_past: c->x += attention. */
void hyb_fwd_attention_mla(struct hyb_ctx *c, uint32_t l, uint32_t n);

#endif
