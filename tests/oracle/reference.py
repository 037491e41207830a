# SPDX-License-Identifier: MIT
"""Independent reference forward pass for llama-family GGUF models.

A test oracle only (hyb never runs Python): it computes the logits of every
position of a token sequence in float64 from the dequantized weights, the way
llama.cpp's llama graph defines the model:

    x = token_embd[tokens]
    per layer:  h = rmsnorm(x) * attn_norm
                q, k, v = h Wq, h Wk, h Wv;  rope(q), rope(k)  (positions 0..n-1)
                x += Wo . softmax(q k^T / sqrt(head_dim) + causal mask) v   (GQA)
                h = rmsnorm(x) * ffn_norm
                x += Wdown . act(Wgate h, Wup h)
    logits = output . (rmsnorm(x) * output_norm)      (output tied to token_embd if absent)

RoPE is NORM (rotate adjacent pairs (x[2i], x[2i+1]), what llama.cpp uses for
arch "llama", whose converter permutes Wq/Wk for it) or NeoX (rotate
(x[i], x[i + n_rot/2])), chosen by the key "hyb.rope_neox" or a parameter.
The FFN activation comes from "hyb.ffn_act" (silu, relu, relu2, dlrelu).

`emulate=True` additionally rounds what llama.cpp's CPU backend rounds (each
matmul's input to its weight's vec_dot type: F16, BF16, Q8_0 or Q8_K; the KV
cache to F16; Q and the attention probabilities to F16 for the attention
products, as its non-flash-attention path does).  It is not a model of
the engine, only a way to measure how large the engine's legitimate error is,
so that check_logits.py's tolerances can be derived rather than guessed.

What llama.cpp (this tree's ggml-cpu) does in attention, for comparison:
by default (flash_attn "auto") the CPU backend enables flash attention and
keeps K and V in F16.  Its FA kernel then has three paths: (1) fewer than 64
query rows (decode, short prompts): Q rounded to F16, K.q dot products of
F16 values summed in F32, online softmax with expf in F32, and the V
accumulator itself kept in F16 (rounded after every key), divided by the
sum at the end; (2) 64 or more query rows: tiles of 64x64, Q kept in F32,
K/V widened to F32, F32 GEMMs and softmax, F32 accumulator; (3) decode with
n_kv >= 512 (n_kv is padded to a multiple of 256): the keys split into one
chunk per thread, path (1) per chunk, partials merged in F32 -- so results
depend on the thread count.  Without FA: K.q with q rounded to F16,
softmax in F32 (sums in double), probabilities rounded to F16 for V.p with
V stored transposed.  emulate=True follows the non-FA path: against
llama.cpp without FA it agrees to ~1e-6 std on quantized models unless some
activation falls on the other side of a rounding boundary (F32 sums in
another order, its approximate expf/silu); such flips cost up to a few
1e-2 std on random models, as much as separates llama.cpp's own prefill
from its decode.

Usable as a module (Model(path).forward(tokens)) or as a CLI:
    reference.py MODEL --tokens 1,2,3 [-o OUT.bin] [--greedy N] [--neox yes|no] [--act A] [--emulate]
"""

import argparse
import math
import sys

import numpy as np

try:
    import gguf
    from gguf import GGMLQuantizationType as QT
except ImportError:  # pragma: no cover - reported to the user
    sys.stderr.write("reference.py: the gguf package is missing (run tests/oracle/venv.sh)\n")
    raise

ACTS = ("silu", "relu", "relu2", "dlrelu")


class ModelError(Exception):
    """A model file this reference cannot evaluate (bad or unsupported)."""


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    if not f.types:
        return default
    t = f.types[0]
    if t == gguf.GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8", "replace")
    if t == gguf.GGUFValueType.ARRAY:
        return [f.parts[i].tolist()[0] for i in f.data]
    v = f.parts[f.data[0]].tolist()[0]
    if t == gguf.GGUFValueType.BOOL:
        return bool(v)
    return v


# --- rounding of activations, as llama.cpp's CPU matmuls do (emulate=True) ---

def _round_f16(x):
    return x.astype(np.float16).astype(np.float64)


def _round_bf16(x):
    # round to nearest even on the top 16 bits of the float32 pattern
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16 << 16
    return b.astype(np.uint32).view(np.float32).astype(np.float64)


def _round_q8(x, block, f16_scale):
    """Q8_0 (block 32, F16 scale) or Q8_K (block 256, F32 scale) round trip."""
    shp = x.shape
    xb = x.astype(np.float32).reshape(-1, block)
    amax = np.abs(xb).max(axis=1, keepdims=True)
    d = (amax / np.float32(127.0)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(d > 0, np.round(xb * np.where(d > 0, np.float32(1.0) / d, 0)), 0)
    q = np.clip(q, -127, 127)
    if f16_scale:  # the integers are found with the F32 scale, stored with an F16 one
        d = d.astype(np.float16).astype(np.float32)
    return (q * d.astype(np.float64)).reshape(shp)


def _vec_dot_round(qtype):
    """The rounding llama.cpp applies to a matmul's activations for this weight type."""
    if qtype == QT.F32:
        return None
    if qtype == QT.F16:
        return _round_f16
    if qtype == QT.BF16:
        return _round_bf16
    if qtype in (QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1):
        return lambda x: _round_q8(x, 32, True)
    if qtype in (QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K):
        return lambda x: _round_q8(x, 256, False)
    return None


class Model:
    """A llama-family GGUF file, ready for reference forward passes."""

    def __init__(self, path):
        try:
            self.reader = gguf.GGUFReader(path, "r")
        except Exception as e:  # noqa: BLE001 - any parse failure is "bad file"
            raise ModelError(f"{path}: not a readable GGUF file ({e})") from e
        r = self.reader
        self.tensors = {t.name: t for t in r.tensors}
        self.arch = _field(r, "general.architecture")
        if self.arch is None:
            raise ModelError(f"{path}: no general.architecture")
        a = self.arch

        def need(key):
            v = _field(r, f"{a}.{key}")
            if v is None:
                raise ModelError(f"{path}: missing {a}.{key}")
            return v

        self.n_embd = int(need("embedding_length"))
        self.n_layer = int(need("block_count"))
        self.n_ff = int(need("feed_forward_length"))
        self.n_head = int(need("attention.head_count"))
        self.n_head_kv = int(_field(r, f"{a}.attention.head_count_kv", self.n_head))
        self.eps = float(_field(r, f"{a}.attention.layer_norm_rms_epsilon", 1e-5))
        self.head_dim = int(_field(r, f"{a}.attention.key_length", self.n_embd // self.n_head))
        self.n_rot = int(_field(r, f"{a}.rope.dimension_count", self.head_dim))
        self.freq_base = float(_field(r, f"{a}.rope.freq_base", 10000.0))
        self.n_ctx_train = int(_field(r, f"{a}.context_length", 0))
        scaling = _field(r, f"{a}.rope.scaling.type", "none")
        factor = float(_field(r, f"{a}.rope.scaling.factor", 0.0) or 0.0)
        if scaling == "linear" and factor > 0:
            self.freq_scale = 1.0 / factor
        elif scaling in ("none", "linear"):
            self.freq_scale = 1.0
        else:
            raise ModelError(f"{path}: rope scaling '{scaling}' is not supported by the reference")
        self.rope_neox = bool(_field(r, "hyb.rope_neox", False))
        self.ffn_act = _field(r, "hyb.ffn_act", "silu")
        if self.ffn_act not in ACTS:
            raise ModelError(f"{path}: hyb.ffn_act '{self.ffn_act}' is not one of {ACTS}")
        if self.n_head % self.n_head_kv or self.n_rot > self.head_dim or self.n_rot % 2:
            raise ModelError(f"{path}: inconsistent heads ({self.n_head}/{self.n_head_kv}) "
                             f"or rope dims ({self.n_rot} of {self.head_dim})")

        emb = self._tensor("token_embd.weight")
        self.n_vocab = int(emb.shape[-1])  # GGUF ne1: rows of the [vocab][embd] matrix
        self.output_name = "output.weight" if "output.weight" in self.tensors else "token_embd.weight"
        ff = self.tensors.get("rope_freqs.weight")
        self.freq_factors = self.deq("rope_freqs.weight").reshape(-1) if ff is not None else None

    # --- weights ---

    def _tensor(self, name):
        t = self.tensors.get(name)
        if t is None:
            raise ModelError(f"missing tensor {name}")
        return t

    def qtype(self, name):
        return self._tensor(name).tensor_type

    def deq(self, name, rows=None):
        """Dequantized tensor as float64, numpy shape (GGUF dims reversed); rows selects rows."""
        t = self._tensor(name)
        data = t.data
        shape = [int(d) for d in reversed(t.shape.tolist())]
        if rows is not None:
            data = data.reshape(shape[0], -1)[rows]
            shape = [len(rows)] + shape[1:]
        try:
            w = gguf.quants.dequantize(np.ascontiguousarray(data), t.tensor_type)
        except NotImplementedError as e:
            raise ModelError(f"{name}: type {t.tensor_type.name} is not supported") from e
        return np.asarray(w, dtype=np.float64).reshape(shape)

    # --- building blocks ---

    def _matmul(self, x, name, emulate):
        """x [n, in] times weight [out, in]^T, with llama.cpp's input rounding if emulating."""
        w = self.deq(name)
        if w.ndim != 2 or w.shape[1] != x.shape[1]:
            raise ModelError(f"{name}: shape {w.shape} does not fit input width {x.shape[1]}")
        if emulate:
            rnd = _vec_dot_round(self.qtype(name))
            if rnd is not None:
                x = rnd(x)
        return x @ w.T

    def _rmsnorm(self, x, name):
        w = self.deq(name).reshape(-1)
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def _rope(self, x, pos, neox):
        """Rotary embedding of x [n, heads, head_dim] at positions pos [n]."""
        n_rot = self.n_rot
        i = np.arange(n_rot // 2, dtype=np.float64)
        inv = self.freq_scale * self.freq_base ** (-2.0 * i / n_rot)
        if self.freq_factors is not None:
            inv = inv / self.freq_factors[: n_rot // 2]
        theta = pos[:, None].astype(np.float64) * inv[None, :]  # [n, n_rot/2]
        c = np.cos(theta)[:, None, :]
        s = np.sin(theta)[:, None, :]
        out = x.copy()
        if neox:
            a = x[..., : n_rot // 2]
            b = x[..., n_rot // 2 : n_rot]
            out[..., : n_rot // 2] = a * c - b * s
            out[..., n_rot // 2 : n_rot] = a * s + b * c
        else:
            a = x[..., 0:n_rot:2]
            b = x[..., 1:n_rot:2]
            out[..., 0:n_rot:2] = a * c - b * s
            out[..., 1:n_rot:2] = a * s + b * c
        return out

    def _ffn_act(self, g, u, act):
        if act == "silu":
            return g / (1.0 + np.exp(-g)) * u
        if act == "relu":
            return np.maximum(g, 0.0) * u
        if act == "relu2":
            return np.maximum(g, 0.0) ** 2 * u
        if act == "dlrelu":
            return np.maximum(g, 0.0) * np.maximum(u, 0.0)
        raise ModelError(f"unknown activation {act}")

    # --- the forward pass ---

    def forward(self, tokens, rope_neox=None, act=None, emulate=False):
        """Logits [len(tokens), n_vocab] (float64) for every position, causal attention.

        rope_neox / act override the file's hyb.rope_neox / hyb.ffn_act (None: use the file).
        emulate: False (exact), True (llama.cpp's roundings), "act" (matmul inputs only).
        """
        toks = np.asarray(tokens, dtype=np.int64)
        if toks.ndim != 1 or len(toks) == 0:
            raise ModelError("need at least one token")
        if toks.min() < 0 or toks.max() >= self.n_vocab:
            raise ModelError(f"token id out of range 0..{self.n_vocab - 1}")
        neox = self.rope_neox if rope_neox is None else bool(rope_neox)
        act = self.ffn_act if act is None else act
        n, hd, nh, nkv = len(toks), self.head_dim, self.n_head, self.n_head_kv
        pos = np.arange(n)
        # the embedding rows are exact (get_rows dequantizes, no rounding)
        x = self.deq("token_embd.weight", rows=toks)
        causal = np.triu(np.full((n, n), -np.inf), k=1)
        for il in range(self.n_layer):
            p = f"blk.{il}."
            h = self._rmsnorm(x, p + "attn_norm.weight")
            q = self._matmul(h, p + "attn_q.weight", emulate).reshape(n, nh, hd)
            k = self._matmul(h, p + "attn_k.weight", emulate).reshape(n, nkv, hd)
            v = self._matmul(h, p + "attn_v.weight", emulate).reshape(n, nkv, hd)
            q = self._rope(q, pos, neox)
            k = self._rope(k, pos, neox)
            if emulate and emulate != "act":  # F16 KV cache; FA converts Q to F16 for the dots
                k, v, q = _round_f16(k), _round_f16(v), _round_f16(q)
            # GQA: consecutive query heads share one KV head
            kk = np.repeat(k, nh // nkv, axis=1)
            vv = np.repeat(v, nh // nkv, axis=1)
            s = np.einsum("qhd,khd->hqk", q, kk) / math.sqrt(hd) + causal[None]
            s -= s.max(axis=-1, keepdims=True)
            pr = np.exp(s)
            pr /= pr.sum(axis=-1, keepdims=True)
            if emulate and emulate != "act":  # without FA, V·p takes p as F16
                pr = _round_f16(pr)
            o = np.einsum("hqk,khd->qhd", pr, vv).reshape(n, nh * hd)
            x = x + self._matmul(o, p + "attn_output.weight", emulate)
            h = self._rmsnorm(x, p + "ffn_norm.weight")
            g = self._matmul(h, p + "ffn_gate.weight", emulate)
            u = self._matmul(h, p + "ffn_up.weight", emulate)
            x = x + self._matmul(self._ffn_act(g, u, act), p + "ffn_down.weight", emulate)
        h = self._rmsnorm(x, "output_norm.weight")
        return self._matmul(h, self.output_name, emulate)

    def greedy(self, tokens, n_new, **kw):
        """Greedy continuation (argmax, first index on ties), recomputed from scratch."""
        seq = list(tokens)
        out = []
        for _ in range(n_new):
            t = int(np.argmax(self.forward(seq, **kw)[-1]))
            out.append(t)
            seq.append(t)
        return out


def parse_tokens(s):
    try:
        toks = [int(t) for t in s.replace(" ", "").split(",") if t != ""]
    except ValueError:
        raise ModelError(f"bad token list '{s}' (want comma-separated integers)") from None
    if not toks:
        raise ModelError("empty token list")
    return toks


def main(argv=None):
    ap = argparse.ArgumentParser(description="reference llama forward pass (test oracle)")
    ap.add_argument("model")
    ap.add_argument("--tokens", required=True, help="comma-separated token ids")
    ap.add_argument("-o", "--out", help="write float32 logits [n_tokens][n_vocab] here")
    ap.add_argument("--greedy", type=int, default=0, help="print N greedy tokens")
    ap.add_argument("--neox", choices=("file", "yes", "no"), default="file")
    ap.add_argument("--act", choices=ACTS)
    ap.add_argument("--emulate", action="store_true", help="round like llama.cpp's CPU backend")
    a = ap.parse_args(argv)
    try:
        m = Model(a.model)
        toks = parse_tokens(a.tokens)
        neox = None if a.neox == "file" else a.neox == "yes"
        logits = m.forward(toks, rope_neox=neox, act=a.act, emulate=a.emulate)
        if a.out:
            logits.astype("<f4").tofile(a.out)
        print("top1:", ",".join(str(int(i)) for i in logits.argmax(axis=1)))
        if a.greedy:
            g = m.greedy(toks, a.greedy, rope_neox=neox, act=a.act, emulate=a.emulate)
            print("greedy:", ",".join(map(str, g)))
    except ModelError as e:
        sys.stderr.write(f"reference.py: {e}\n")
        return 2
    except Exception as e:  # noqa: BLE001 - one line, not a traceback
        sys.stderr.write(f"reference.py: {a.model}: {type(e).__name__}: {e}\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
