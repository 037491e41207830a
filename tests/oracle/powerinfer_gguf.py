#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Write a llama GGUF (F16 or F32 matrices) out the way PowerInfer's own tools
lay their files out, for the import tests (tests/unit/test_powerinfer.c).

The model file follows convert-hf-to-powerinfer-gguf.py: the per-layer
predictors (ReluMLP, no biases) come first as blk.N.fc1.weight (torch shape
[H, n_embd]) and blk.N.fc2.weight ([n_ff, H]); every ffn_down becomes
ffn_down_t, transposed ([n_ff, n_embd]: a row per neuron); the optional
threshold is powerinfer.sparse_threshold; like convert.py, "PWRI" is
written over the magic (--magic gguf keeps GGUF's). The GPU index follows
powerinfer-py export_split.py: GGUF of architecture "generic.gpu_index" with
blk.N.gpu_idx (I32 [n_ff], 1 = on the GPU) and blk.N.gpu_bucket (those
indices, ascending; empty for a layer without GPU neurons, --gpu-none L),
split.vram_capacity, I32 numbered 18 as PowerInfer's own gguf-py numbers it
(the gguf package's 26 is a type PowerInfer's ggml does not know), and then
"PWRI" and version 3 written over the first 8 bytes.

Predictors (--predictor):
  exact   fc1 = ffn_gate rows times ffn_norm's weight (H = n_ff), fc2 = the
          identity: score_i = relu(gate_i . (w * x)), which is > 0 exactly when
          neuron i fires for the raw residual x (rmsnorm only scales x by a
          positive number), so with a tiny threshold it predicts every neuron
          that fires (up to F16 rounding near zero)
  random  dense Gaussian fc1 [H, n_embd] and fc2 [n_ff, H]: scores with no
          ties, for checking the arithmetic and the input they are fed

--type Q4_0|Q8_0 quantizes every layer matrix (the predictors stay F16).
PowerInfer's CPU axpy reads ffn_down_t as F16 or Q4_0 only: it loads a
Q8_0 file but computes it wrongly (hyb computes it right); its own tools
(tests/oracle/powerinfer-ref.sh) take the F16 and Q4_0 files.

--break names a defect to write instead (bad input tests): fc2-shape,
gpu-idx-value, gpu-bucket.
"""
import argparse
import struct
import sys

import numpy as np

try:
    import gguf
except ImportError:  # pragma: no cover - reported to the user
    sys.stderr.write("powerinfer_gguf.py: the gguf package is missing (tests/oracle/venv.sh)\n")
    raise


def field(reader, key):
    f = reader.get_field(key)
    return f.contents() if f else None


def copy_kv(reader, writer, skip):
    for f in reader.fields.values():
        if f.name == "general.architecture" or f.name.startswith("GGUF.") or f.name in skip:
            continue
        vt = f.types[0]
        sub = f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(f.name, f.contents(), vt, sub_type=sub)


def matrix(reader, name):
    for t in reader.tensors:
        if t.name == name:
            if t.tensor_type not in (gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.F32):
                sys.exit(f"powerinfer_gguf.py: {name} is {t.tensor_type.name}; need F16 or F32")
            return np.array(t.data)
    sys.exit(f"powerinfer_gguf.py: {name} is missing")


def write_model(args):
    r = gguf.GGUFReader(args.src, "r")
    arch = field(r, "general.architecture")
    n_layer = field(r, f"{arch}.block_count")
    rng = np.random.default_rng(args.seed)
    w = gguf.GGUFWriter(args.out, arch)
    # PowerInfer's files carry no hyb.* activation key: the loader must know them
    copy_kv(r, w, skip={"hyb.ffn_act"})
    if args.threshold is not None:
        w.add_float32("powerinfer.sparse_threshold", args.threshold)
    dtype = np.float16
    for l in range(n_layer):
        gate = matrix(r, f"blk.{l}.ffn_gate.weight").astype(np.float32)
        n_ff, n_embd = gate.shape
        if args.predictor == "exact":
            norm = matrix(r, f"blk.{l}.ffn_norm.weight").astype(np.float32)
            fc1 = gate * norm[None, :]
            fc2 = np.eye(n_ff, dtype=np.float32)
        else:
            h = args.hidden
            fc1 = rng.standard_normal((h, n_embd)).astype(np.float32) / np.sqrt(n_embd)
            fc2 = rng.standard_normal((n_ff, h)).astype(np.float32) / np.sqrt(h)
        if args.break_ == "fc2-shape" and l == n_layer - 1:
            fc2 = fc2[:, :-1]
        w.add_tensor(f"blk.{l}.fc1.weight", fc1.astype(dtype))
        w.add_tensor(f"blk.{l}.fc2.weight", fc2.astype(dtype))
    qtype = gguf.GGMLQuantizationType[args.type] if args.type else None
    for t in r.tensors:
        data = np.array(t.data)
        name = t.name
        ttype = t.tensor_type
        if name.endswith(".ffn_down.weight"):
            if ttype not in (gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.F32):
                sys.exit(f"powerinfer_gguf.py: {name} is {ttype.name}; need F16 or F32")
            name = name.replace("ffn_down", "ffn_down_t")
            data = np.ascontiguousarray(data.T)
        if qtype is not None and name.startswith("blk.") and data.ndim == 2:
            # like PowerInfer's quantize: the layer matrices, down_t along n_embd
            data = gguf.quants.quantize(data.astype(np.float32), qtype)
            ttype = qtype
        w.add_tensor(name, data, raw_dtype=ttype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if args.magic == "pwri":
        set_magic(args.out, 3)


def set_magic(path, version):
    with open(path, "r+b") as f:
        f.write(struct.pack("<I", int.from_bytes(b"PWRI", "little")))
        f.write(struct.pack("<I", version))


PI_I32 = 18  # PowerInfer's gguf-py: I8 16, I16 17, I32 18


def pi_int_types(path):
    """Renumber the I32 tensors as PowerInfer's gguf-py writes them."""
    r = gguf.GGUFReader(path, "r+")
    for t in r.tensors:
        if t.tensor_type == gguf.GGMLQuantizationType.I32:
            t.field.parts[4][0] = PI_I32
    r.data.flush()
    del r


def write_gpu_index(args):
    r = gguf.GGUFReader(args.src, "r")
    arch = field(r, "general.architecture")
    n_layer = field(r, f"{arch}.block_count")
    n_ff = field(r, f"{arch}.feed_forward_length")
    rng = np.random.default_rng(args.seed + 1)
    w = gguf.GGUFWriter(args.gpu_index, "generic.gpu_index")
    for l in range(n_layer):
        k = 0 if l in args.gpu_none else int(round(args.gpu_frac * n_ff))
        hot = np.sort(rng.choice(n_ff, size=k, replace=False)).astype(np.int32)
        idx = np.zeros(n_ff, dtype=np.int32)
        idx[hot] = 1
        if args.break_ == "gpu-idx-value" and l == 0:
            idx[0] = 2
        if args.break_ == "gpu-bucket" and l == 0:
            hot = hot[::-1].copy()
        w.add_tensor(f"blk.{l}.gpu_idx", idx, raw_dtype=gguf.GGMLQuantizationType.I32)
        w.add_tensor(f"blk.{l}.gpu_bucket", hot, raw_dtype=gguf.GGMLQuantizationType.I32)
    w.add_block_count(n_layer)
    w.add_uint64("split.vram_capacity", args.vram)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    pi_int_types(args.gpu_index)
    set_magic(args.gpu_index, 3)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src")
    p.add_argument("out")
    p.add_argument("--predictor", choices=("exact", "random"), default="exact")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--threshold", type=float)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--type", choices=("Q8_0", "Q4_0"), help="quantize the layer matrices")
    p.add_argument("--gpu-index")
    p.add_argument("--gpu-frac", type=float, default=0.25)
    p.add_argument("--vram", type=int, default=1 << 30)
    p.add_argument("--gpu-none", type=int, action="append", default=[],
                   help="a layer with no GPU neurons (an empty gpu_bucket)")
    p.add_argument("--magic", choices=("pwri", "gguf"), default="pwri")
    p.add_argument("--break", dest="break_", choices=("fc2-shape", "gpu-idx-value", "gpu-bucket"))
    args = p.parse_args(argv)
    write_model(args)
    if args.gpu_index:
        write_gpu_index(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
