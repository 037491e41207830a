#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The inputs PowerInfer's own tools take, for tests/oracle/powerinfer-convert.sh.

  hf DIR        a ReLU llama as a Hugging Face checkpoint (config.json,
                model.safetensors in F16, tokenizer.model) in DIR/model and
                its predictors as PowerInfer ships them (DIR/predictor/
                model_N.pt with fc1.weight and fc2.weight, config.json with
                sparse_threshold), the inputs of PowerInfer's convert.py
  activations PROFILE DIR
                the counts hybctl profile measured on the converted model
                (blk.N.count, I64, which PowerInfer's gguf-py cannot read:
                run with the test venv's gguf) as DIR/activation_N.npy
  pt DIR        those as PowerInfer's activation statistics (DIR/
                activation_N.pt, one count per neuron), the input of its ILP
                solver (python -m powerinfer) and export_split

The weights are Gaussian (seeded), scaled by 1/sqrt(fan-in); the norms
scatter around 1 so the exact predictor's fc1 differs from ffn_gate. The
tokenizer is a SentencePiece BPE model with byte fallback, as llama's,
trained on --corpus (one thread: the same model from the same text).

Predictors (--predictor):
  exact   fc1 = gate_proj rows times post_attention_layernorm's weight
          (H = n_ff), fc2 = the identity: score_i = relu(gate_i . (w * x)),
          > 0 exactly when neuron i fires for the residual x (rmsnorm only
          scales x), so with a tiny threshold it predicts every neuron that
          fires (up to F16 rounding near zero): robust to rounding
  random  dense Gaussian fc1 [H, n_embd] and fc2 [n_ff, H], no threshold
          (PowerInfer's default 0): scores with no ties

Needs numpy < 2 (PowerInfer's convert.py), torch (the .pt files, as
PowerInfer's tools read them), sentencepiece and safetensors.
"""
import argparse
import json
import os
import sys

import numpy as np


def gaussian(rng, shape, fan_in):
    return (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)


def write_tokenizer(path, corpus, vocab):
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        input=corpus, model_prefix=os.path.join(path, "tokenizer"), vocab_size=vocab,
        model_type="bpe", byte_fallback=True, character_coverage=1.0, num_threads=1,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, split_digits=True,
        remove_extra_whitespaces=False, normalization_rule_name="identity",
        minloglevel=2)
    os.remove(os.path.join(path, "tokenizer.vocab"))


def write_hf(args):
    from safetensors.numpy import save_file
    import torch

    rng = np.random.default_rng(args.seed)
    model = os.path.join(args.dir, "model")
    pred = os.path.join(args.dir, "predictor")
    os.makedirs(model, exist_ok=True)
    os.makedirs(pred, exist_ok=True)
    e, f, v = args.hidden, args.ffn, args.vocab
    hd = e // args.heads
    kv = args.kv_heads * hd
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "relu",
        "hidden_size": e, "intermediate_size": f, "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads, "num_key_value_heads": args.kv_heads,
        "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "vocab_size": v, "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False,
        "torch_dtype": "float16",
    }
    with open(os.path.join(model, "config.json"), "w") as fp:
        json.dump(config, fp, indent=2)
    t = {"model.embed_tokens.weight": gaussian(rng, (v, e), 1),
         "model.norm.weight": 1 + 0.1 * gaussian(rng, (e,), 1),
         "lm_head.weight": gaussian(rng, (v, e), e)}
    for l in range(args.layers):
        p = f"model.layers.{l}."
        t[p + "input_layernorm.weight"] = 1 + 0.1 * gaussian(rng, (e,), 1)
        t[p + "post_attention_layernorm.weight"] = 1 + 0.1 * gaussian(rng, (e,), 1)
        t[p + "self_attn.q_proj.weight"] = gaussian(rng, (e, e), e)
        t[p + "self_attn.k_proj.weight"] = gaussian(rng, (kv, e), e)
        t[p + "self_attn.v_proj.weight"] = gaussian(rng, (kv, e), e)
        t[p + "self_attn.o_proj.weight"] = gaussian(rng, (e, e), e)
        t[p + "mlp.gate_proj.weight"] = gaussian(rng, (f, e), e)
        t[p + "mlp.up_proj.weight"] = gaussian(rng, (f, e), e)
        t[p + "mlp.down_proj.weight"] = gaussian(rng, (e, f), f)
        # predictors are written from the F16 weights the checkpoint holds
        gate = t[p + "mlp.gate_proj.weight"].astype(np.float16).astype(np.float32)
        norm = t[p + "post_attention_layernorm.weight"].astype(np.float16).astype(np.float32)
        if args.predictor == "exact":
            fc1, fc2 = gate * norm[None, :], np.eye(f, dtype=np.float32)
        else:
            h = args.pred_hidden
            fc1, fc2 = gaussian(rng, (h, e), e), gaussian(rng, (f, h), h)
        torch.save({"fc1.weight": torch.from_numpy(fc1.astype(np.float16)),
                    "fc2.weight": torch.from_numpy(fc2.astype(np.float16))},
                   os.path.join(pred, f"model_{l}.pt"))
    save_file({k: a.astype(np.float16) for k, a in t.items()},
              os.path.join(model, "model.safetensors"), metadata={"format": "pt"})
    pconf = {} if args.threshold is None else {"sparse_threshold": args.threshold}
    with open(os.path.join(pred, "config.json"), "w") as fp:
        json.dump(pconf, fp)
    write_tokenizer(model, args.corpus, v)


def write_activations(args):
    import gguf

    r = gguf.GGUFReader(args.profile, "r")
    os.makedirs(args.dir, exist_ok=True)
    n = 0
    for t in r.tensors:
        name = t.name.split(".")
        if len(name) == 3 and name[0] == "blk" and name[2] == "count":
            np.save(os.path.join(args.dir, f"activation_{name[1]}.npy"),
                    np.array(t.data, dtype=np.int64))
            n += 1
    if not n:
        sys.exit(f"powerinfer_hf.py: {args.profile} has no blk.N.count")


def write_pt(args):
    import torch

    for f in sorted(os.listdir(args.dir)):
        if f.startswith("activation_") and f.endswith(".npy"):
            a = np.load(os.path.join(args.dir, f))
            torch.save(torch.from_numpy(a), os.path.join(args.dir, f[:-4] + ".pt"))
            os.remove(os.path.join(args.dir, f))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    h = sub.add_parser("hf")
    h.add_argument("dir")
    h.add_argument("--corpus", required=True)
    h.add_argument("--hidden", type=int, default=128)
    h.add_argument("--ffn", type=int, default=512)
    h.add_argument("--layers", type=int, default=2)
    h.add_argument("--heads", type=int, default=4)
    h.add_argument("--kv-heads", type=int, default=2)
    h.add_argument("--vocab", type=int, default=512)
    h.add_argument("--predictor", choices=("exact", "random"), default="exact")
    h.add_argument("--pred-hidden", type=int, default=64)
    h.add_argument("--threshold", type=float)
    h.add_argument("--seed", type=int, default=1)
    a = sub.add_parser("activations")
    a.add_argument("profile")
    a.add_argument("dir")
    sub.add_parser("pt").add_argument("dir")
    args = p.parse_args(argv)
    {"hf": write_hf, "activations": write_activations, "pt": write_pt}[args.cmd](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
