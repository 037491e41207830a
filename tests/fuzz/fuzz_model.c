// SPDX-License-Identifier: MIT
/*
 * libFuzzer target for the model loader on top of the GGUF reader: every
 * input the reader accepts goes through hyb_model_finish (hyperparameters
 * of every architecture, RoPE scaling keys, tensor shapes and types, fused
 * slices, the tokenizer), as hyb_model_load does for a file. A refusal must
 * say why; a model it takes has every weight inside the input, which the
 * target touches (first and last byte) so AddressSanitizer sees any that is
 * not. Seeds: tests/fuzz/corpus-model (tiny models of each architecture, the
 * mixtures of experts included, seed-gptoss with MXFP4 experts; seed-cats is seed-llama with CATS threshold
 * keys, hyb/sparsity.h; seed-powerinfer a PowerInfer file, PWRI magic,
 * Q4_0 ffn_down_t and fc1/fc2 predictors, tests/oracle/powerinfer_gguf.py).
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hyb/gguf.h"
#include "hyb/model.h"
#include "model/model_internal.h"

static volatile unsigned sink;

static unsigned touch(const struct hyb_weight *w)
{
	const volatile uint8_t *b = w->data;
	const uint64_t n = w->row_bytes * w->ne1 * (w->ne2 ? w->ne2 : 1);

	return b && n ? b[0] + b[n - 1] : 0;
}

static unsigned touch_vec(const float *v, uint64_t n)
{
	return v && n ? (unsigned)(v[0] + v[n - 1] != 0) : 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct hyb_gguf_file *f;
	struct hyb_model *m;
	char err[1024] = "";
	unsigned sum = 0;

	if (hyb_gguf_parse(data, size, &f))
		return 0; /* the reader's own target checks its refusals */
	m = calloc(1, sizeof(*m));
	if (!m) {
		hyb_gguf_close(f);
		return 0;
	}
	m->gguf = f;
	if (hyb_model_finish(m, "fuzz", err, sizeof(err))) {
		if (!err[0])
			abort(); /* a refusal says why */
		hyb_model_free(m);
		return 0;
	}
	const struct hyb_hparams *hp = &m->hp;

	sum += touch(&m->tok_embd) + touch(&m->output) + touch(&m->out_norm);
	sum += touch_vec(hp->rope.freq_factors, hp->n_rot / 2);
	sum += touch_vec(hp->rope_short, hp->n_rot / 2) + touch_vec(hp->rope_long, hp->n_rot / 2);
	for (uint32_t l = 0; l < hp->n_layer; l++) {
		const struct hyb_layer *L = &m->layers[l];
		const uint64_t q = (uint64_t)hp->n_head * hp->head_dim;
		const uint64_t kv = (uint64_t)hp->n_head_kv * hp->head_dim;

		sum += touch(&L->attn_norm) + touch(&L->wq) + touch(&L->wk) + touch(&L->wv) +
		       touch(&L->wo) + touch(&L->ffn_norm) + touch(&L->gate) + touch(&L->up) +
		       touch(&L->down) + touch(&L->down_t) + touch(&L->q_norm) + touch(&L->k_norm) +
		       touch(&L->post_attn_norm) + touch(&L->post_ffn_norm) + touch(&L->fc1) +
		       touch(&L->fc2);
		sum += touch_vec(L->bq, q) + touch_vec(L->bk, kv) + touch_vec(L->bv, kv);
		sum += touch(&L->wq_a) + touch(&L->q_a_norm) + touch(&L->wq_b) + touch(&L->wkv_a) +
		       touch(&L->kv_a_norm) + touch(&L->wk_b) + touch(&L->wv_b);
		sum += touch_vec(L->exp_probs_b, hp->n_expert);
		/* gpt-oss: the output bias, sinks, the router's and the experts' biases */
		sum += touch_vec(L->bo, hp->n_embd) + touch_vec(L->attn_sinks, hp->n_head) +
		       touch_vec(L->gate_inp_b, hp->n_expert);
		sum += touch_vec(L->gate_exps_b, (uint64_t)hp->n_expert * hp->n_ff_exp) +
		       touch_vec(L->up_exps_b, (uint64_t)hp->n_expert * hp->n_ff_exp) +
		       touch_vec(L->down_exps_b, (uint64_t)hp->n_expert * hp->n_embd);
		/* latent attention: one cached row per token, heads from 3-D tensors */
		if (hp->kv_lora &&
		    (hp->n_head_kv != 1 || hp->head_dim != hp->kv_lora + hp->n_rot ||
		     L->wk_b.ne2 != hp->n_head || L->wk_b.ne0 != hp->mla_nope ||
		     L->wk_b.ne1 != hp->kv_lora || L->wv_b.ne2 != hp->n_head ||
		     L->wv_b.ne0 != hp->kv_lora || L->wv_b.ne1 != hp->mla_v ||
		     L->wkv_a.ne1 != (uint64_t)hp->kv_lora + hp->n_rot ||
		     L->wo.ne0 != (uint64_t)hp->n_head * hp->mla_v))
			abort();
		sum += touch(&L->gate_inp) + touch(&L->gate_exps) + touch(&L->up_exps) +
		       touch(&L->down_exps) + touch(&L->gate_shexp) + touch(&L->up_shexp) +
		       touch(&L->down_shexp) + touch(&L->gate_inp_shexp);
		/* what the MoE forward pass indexes without checks (arch_moe.c) */
		if (hp->n_expert && l >= hp->n_dense_lead &&
		    (hp->n_expert_used < 1 || hp->n_expert_used > hp->n_expert ||
		     L->gate_inp.ne0 != hp->n_embd || L->gate_inp.ne1 != hp->n_expert ||
		     L->gate_exps.ne2 != hp->n_expert || L->up_exps.ne2 != hp->n_expert ||
		     L->down_exps.ne2 != hp->n_expert || L->gate_exps.ne1 != hp->n_ff_exp ||
		     L->up_exps.ne1 != hp->n_ff_exp || L->down_exps.ne0 != hp->n_ff_exp ||
		     L->down_exps.ne1 != hp->n_embd || L->gate.data))
			abort();
		/* the shapes the forward pass relies on */
		if ((!hp->kv_lora && (L->wq.ne0 != hp->n_embd || L->wq.ne1 != q ||
				      L->wk.ne1 != kv || L->wo.ne0 != q)) ||
		    (L->gate.data && L->gate.ne1 != hp->n_ff))
			abort();
	}
	sink = sum;
	hyb_model_free(m);
	return 0;
}
