# SPDX-License-Identifier: MIT
"""Compare hyb's logits with the independent reference (reference.py).

    check_logits.py MODEL --hyb build/hyb --tokens 1,2,3 [--decode] [-t N]
                    [--tol-rel X] [--atol A] [--self-test] [--expect]
                    [--ref-rope norm|neox] [--ref-act A] [--ref-omit FEATURE,...]
                    [--ref-llama3 FACTOR,ORIG_CTX[,LOW,HIGH]]

Runs `hyb logits -m MODEL --tokens ... -o OUT [--decode] [-t N]`, reads the
float32 [n_tokens][n_vocab] logits and checks, at every position p:

    max_v |hyb[p,v] - ref[p,v]|  <=  bound[p] = tol_rel * std(ref[p]) + atol

and that hyb's top-1 token is the reference's wherever the reference's top-2
margin exceeds bound[p].  Exit 0: pass; 1: mismatch (or a --self-test
control that should have failed passed); 2: usage, model or hyb error.

Tolerances.  The reference is exact (float64 on the dequantized weights);
the engine rounds like llama.cpp's CPU backend, and those roundings are the
error budget (measured with reference.py's emulate mode, see TOL_REL):
  * F32 weights: matmuls in F32, but the KV cache is F16 (K, V rounded,
    relative 2^-11), Q and the attention probabilities go to F16 for the
    attention products.  Those alone move logits by up to ~2e-3 std on 2-layer
    random models.
  * F16 weights: as F32 plus activations rounded to F16 (2^-11) before each
    matmul.  BF16: activations rounded to BF16 (2^-8): ~8x more.
  * Q8_0 / Q4_0: activations quantized to Q8_0 (int8, one scale per 32
    values: error up to amax/254 per value, ~1% of the RMS).
  * Q4_K / Q6_K: activations quantized to Q8_K (int8, one scale per 256
    values: larger blocks, larger amax, a little worse than Q8_0).
Random-weight models amplify these roundings through the layers (errors
grow ~10x from a matmul input to the logits), so the table is calibrated
on `hybctl synth` models (2 layers, hidden 256): each entry is about 3x the
largest error the emulated roundings produce over many seeds and
activations, and 2.4-3x the largest the real engine showed.  For other models
pass --tol-rel.  --self-test proves that the check can fail: a corrupted
logit must fail it, and so must a reference with the other RoPE type or
another FFN activation, wherever those move the logits by more than the
bound (on the tiny llama the RoPE type does not: its attention is too flat),
and so must a reference without any one of the model's architectural
features (reference.FEATURES: Q/K norms, biases, post norms, embedding
scale, sliding window, local RoPE, YaRN, RoPE scaling, rope_freqs, the
experts' top-K choice and renormalisation, the shared expert and its gate).

Mixtures of experts: the same table applies (the router is F32 and the
experts are matmuls like any other), but routing is discrete: where a
token's K-th and (K+1)-th router logits are closer than the engine's error
there, the engine may legitimately choose another expert and miss by far
more than any tolerance.  The smallest such gap is printed, and each failing
position's, and --expect names the positions where llama.cpp-like rounding
alone changes the choice, so that such a failure can be told from a bug.

--ref-rope, --ref-act and --ref-omit give the reference a deliberately wrong
model, for tests that the check fails then.  --ref-llama3 replaces the
file's rope_freqs.weight by the factors HF's llama3 rope type computes
(low_freq_factor 1, high_freq_factor 4 unless given), so that the tensor
itself is checked against the published formula.
"""

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference  # noqa: E402
from reference import QT, ModelError  # noqa: E402

# max |diff| / std(ref logits) allowed, by the weight type of the matmuls
# (the loosest type in the file wins).  See the module comment.
TOL_REL = {
    # Measured worst (median) max|diff|/std: "emulated" = the reference's
    # emulate mode on 12 hybctl synth models x 2 token lists per type (3 seeds
    # x {silu, relu+tied, dlrelu, relu2+neox}; hidden 256, ffn 512, 2 layers,
    # 4/2 heads); "hyb" = the engine, 32 runs (2 seeds x those 4 variants x 2
    # token lists x prefill/decode), scalar and AVX-512 kernels alike;
    # "llama.cpp" = llama.cpp on the seed-1 silu model.
    #                emulated          hyb               llama.cpp
    QT.F32: 0.006,   # 1.9e-3 (1.0e-3)   2.3e-3 (1.6e-3)   1.8e-3
    QT.F16: 0.010,   # 3.0e-3 (1.9e-3)   3.7e-3 (2.2e-3)   2.7e-3
    QT.BF16: 0.06,   # 2.0e-2 (1.4e-2)   2.3e-2 (1.3e-2)   1.6e-2
    QT.Q8_0: 0.20,   # 6.8e-2 (4.2e-2)   6.7e-2 (4.5e-2)   4.5e-2
    QT.Q4_0: 0.20,   # 6.6e-2 (4.2e-2)   6.4e-2 (3.8e-2)   5.3e-2
    QT.Q4_K: 0.28,   # 9.4e-2 (5.7e-2)   1.2e-1 (5.4e-2)   7.2e-2
    QT.Q6_K: 0.25,   # 8.4e-2 (5.5e-2)   9.0e-2 (5.8e-2)   6.5e-2
}
# For scale: on those models the other RoPE type moves some logit by >= 1.09
# std and relu instead of silu by >= 0.76 std, so both fail every entry.
TOL_REL_OTHER = 0.5  # types the table does not know yet
ATOL = 1e-5          # floor for positions whose logits are all (nearly) equal

MATMUL_SUFFIXES = ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
                   "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight",
                   "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight",
                   "ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight",
                   "attn_q_a.weight", "attn_q_b.weight", "attn_kv_a_mqa.weight",
                   "attn_k_b.weight", "attn_v_b.weight")


def default_tol_rel(model):
    names = [n for n in model.tensors if n.endswith(MATMUL_SUFFIXES)] + [model.output_name]
    types = {model.qtype(n) for n in names}
    return max(TOL_REL.get(t, TOL_REL_OTHER) for t in types), sorted(t.name for t in types)


def run_hyb(hyb, model_path, tokens, decode, threads, n_vocab, timeout):
    with tempfile.TemporaryDirectory(prefix="hyb-oracle.") as d:
        out = os.path.join(d, "logits.bin")
        cmd = [hyb, "logits", "-m", model_path, "--tokens", ",".join(map(str, tokens)), "-o", out]
        if decode:
            cmd.append("--decode")
        if threads:
            cmd += ["-t", str(threads)]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except FileNotFoundError:
            raise ModelError(f"cannot run {hyb}: not found") from None
        except subprocess.TimeoutExpired:
            raise ModelError(f"{' '.join(cmd)}: no answer in {timeout} s") from None
        if p.returncode != 0:
            raise ModelError(f"{' '.join(cmd)} failed (exit {p.returncode}):\n"
                             f"{p.stderr.strip()}")
        return load_logits(out, len(tokens), n_vocab)


def load_logits(path, n_tokens, n_vocab):
    try:
        raw = np.fromfile(path, dtype="<f4")
    except OSError as e:
        raise ModelError(f"{path}: {e}") from None
    if raw.size != n_tokens * n_vocab:
        raise ModelError(f"{path}: {raw.size} floats, want {n_tokens} x {n_vocab} = "
                         f"{n_tokens * n_vocab}")
    return raw.reshape(n_tokens, n_vocab).astype(np.float64)


def compare(ref, got, tol_rel, atol):
    """Per-position statistics and the verdict (a list of dicts, bool)."""
    rows, ok = [], True
    for p in range(ref.shape[0]):
        r, g = ref[p], got[p]
        std = float(r.std())
        bound = tol_rel * std + atol
        finite = bool(np.isfinite(g).all())
        err = float(np.abs(g - r).max()) if finite else float("inf")
        top = np.argsort(r)[::-1][:2]
        margin = float(r[top[0]] - r[top[1]]) if r.size > 1 else float("inf")
        g_top = int(np.argmax(g)) if finite else -1
        top_ok = g_top == int(top[0]) or margin <= bound
        row_ok = finite and err <= bound and top_ok
        ok &= row_ok
        rows.append(dict(pos=p, err=err, rel=err / std if std > 0 else float("inf"), bound=bound,
                         r_top=int(top[0]), g_top=g_top, margin=margin, ok=row_ok))
    return rows, ok


def print_rows(rows, tokens):
    print(" pos  token   max|diff|  /std      bound     ref_top1 hyb_top1 margin/bound")
    for r in rows:
        print(f"{r['pos']:4d} {tokens[r['pos']]:6d}  {r['err']:.3e}  {r['rel']:.2e}  "
              f"{r['bound']:.3e}  {r['r_top']:8d} {r['g_top']:8d} {r['margin'] / r['bound']:9.2f}"
              f"  {'ok' if r['ok'] else 'FAIL'}")


def self_test(model, tokens, ref, got, tol_rel, atol, neox, act, omit):
    """Controls that must fail; returns False when one of them passes."""
    ok = True
    # 1. one corrupted logit, moved just past the bound at the middle position
    bad = got.copy()
    p = len(tokens) // 2
    v = int(np.argmin(np.abs(got[p] - ref[p])))
    bound = tol_rel * ref[p].std() + atol
    bad[p, v] = ref[p, v] + 1.5 * bound
    _, passed = compare(ref, bad, tol_rel, atol)
    print(f"self-test: one logit off by 1.5x the bound: {'PASSED (bad)' if passed else 'fails (good)'}")
    ok &= not passed
    # 2. and 3. a reference with the other RoPE type / another activation
    other_act = "relu" if act != "relu" else "silu"
    controls = [("other RoPE type", dict(rope_neox=not neox, act=act, omit=omit)),
                (f"activation {other_act}", dict(rope_neox=neox, act=other_act, omit=omit))]
    # 4. a reference without one of the model's features
    controls += [(f"no {f}", dict(rope_neox=neox, act=act, omit=set(omit) | {f}))
                 for f in model.features() if f not in omit]
    for what, kw in controls:
        wrong = model.forward(tokens, **kw)
        effect = max(float(np.abs(wrong[i] - ref[i]).max() / (tol_rel * ref[i].std() + atol))
                     for i in range(len(tokens)))
        _, passed = compare(wrong, got, tol_rel, atol)
        if effect < 1.0:
            # e.g. the tiny llama: its attention scores are so small that
            # the rotation hardly matters; no tolerance could see it there
            print(f"self-test: reference with {what} moves logits by only {effect:.2f}x "
                  "the bound on this model (not informative)")
            continue
        print(f"self-test: reference with {what} (moves logits by {effect:.1f}x the bound): "
              f"{'PASSED (bad)' if passed else 'fails (good)'}")
        ok &= not passed
    return ok


def set_llama3(model, spec):
    """--ref-llama3: rope_freqs recomputed with reference.llama3_freq_factors()."""
    try:
        v = [float(x) for x in spec.split(",")]
    except ValueError:
        v = []
    if len(v) not in (2, 4) or v[0] <= 0 or v[1] <= 0:
        raise ModelError(f"--ref-llama3 '{spec}': want FACTOR,ORIG_CTX[,LOW,HIGH]")
    lo, hi = (v[2], v[3]) if len(v) == 4 else (1.0, 4.0)
    if model.freq_factors is None:
        raise ModelError("--ref-llama3: the model has no rope_freqs.weight to replace")
    model.freq_factors = reference.llama3_freq_factors(model.n_rot, model.freq_base, v[0], v[1],
                                                       lo, hi)


def main(argv=None):
    ap = argparse.ArgumentParser(description="compare hyb's logits with the reference")
    ap.add_argument("model")
    ap.add_argument("--hyb", help="the hyb binary (runs `hyb logits`)")
    ap.add_argument("--logits", help="compare this float32 file instead of running hyb")
    ap.add_argument("--tokens", required=True, help="comma-separated token ids")
    ap.add_argument("--decode", action="store_true", help="hyb evaluates token by token")
    ap.add_argument("-t", "--threads", type=int, default=0)
    ap.add_argument("--tol-rel", type=float, help="max |diff| / std(ref); default by weight type")
    ap.add_argument("--atol", type=float, default=ATOL)
    ap.add_argument("--ref-rope", choices=("file", "norm", "neox"), default="file",
                    help="RoPE type of the reference (default: the file's)")
    ap.add_argument("--ref-act", choices=reference.ACTS, help="FFN activation of the reference")
    ap.add_argument("--ref-omit", default="",
                    help="comma-separated features the reference leaves out: "
                    + ", ".join(reference.FEATURES))
    ap.add_argument("--ref-llama3", metavar="FACTOR,ORIG_CTX[,LOW,HIGH]",
                    help="the reference's rope_freqs from HF's llama3 formula, not the file")
    ap.add_argument("--self-test", action="store_true", help="also check that the check can fail")
    ap.add_argument("--expect", action="store_true",
                    help="also print the error that llama.cpp-like rounding alone gives")
    ap.add_argument("--timeout", type=int, default=120)
    a = ap.parse_args(argv)
    if bool(a.hyb) == bool(a.logits):
        ap.error("give exactly one of --hyb and --logits")
    try:
        model = reference.Model(a.model)
        tokens = reference.parse_tokens(a.tokens)
        if max(tokens) >= model.n_vocab or min(tokens) < 0:
            raise ModelError(f"token id out of range 0..{model.n_vocab - 1}")
        tol_rel, types = default_tol_rel(model)
        if a.tol_rel is not None:
            tol_rel = a.tol_rel
        neox = model.rope_neox if a.ref_rope == "file" else a.ref_rope == "neox"
        act = a.ref_act or model.ffn_act
        omit = reference.parse_features(a.ref_omit)
        if a.ref_llama3:
            set_llama3(model, a.ref_llama3)
        if a.logits:
            got = load_logits(a.logits, len(tokens), model.n_vocab)
        else:
            got = run_hyb(a.hyb, a.model, tokens, a.decode, a.threads, model.n_vocab, a.timeout)
        ref = model.forward(tokens, rope_neox=neox, act=act, omit=omit)
    except ModelError as e:
        print(f"check_logits.py: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - a broken file must not read as "mismatch"
        print(f"check_logits.py: {a.model}: reference failed: {type(e).__name__}: {e}",
              file=sys.stderr)
        return 2
    print(f"model {os.path.basename(a.model)}: {model.arch}, weights {','.join(types)}, "
          f"rope {'neox' if neox else 'norm'} (scaling {model.rope_scaling}"
          f"{'' if model.rope_factor == 1 else f' x{model.rope_factor:g}'}"
          f"{', rope_freqs' if model.freq_factors is not None else ''}), act {act}, "
          f"features [{' '.join(model.features())}]"
          f"{' without ' + ','.join(omit) if omit else ''}, {len(tokens)} tokens, "
          f"{'decode' if a.decode else 'prefill'}; tol_rel {tol_rel:g}, atol {a.atol:g}")
    rows, ok = compare(ref, got, tol_rel, a.atol)
    print_rows(rows, tokens)
    routes, gap = model.routes, model.route_gap
    if routes:
        p = int(np.argmin(gap))
        print(f"experts: {model.n_expert_used} of {model.n_expert} per token"
              f"{', renormalised' if model.expert_norm else ''}; smallest gap between a "
              f"token's K-th and (K+1)-th router logits {gap[p]:.3e} (position {p})")
        for r in rows:
            if not r["ok"]:
                print(f"  position {r['pos']} fails with a routing gap of {gap[r['pos']]:.3e}: "
                      "a small one means the engine may have chosen another expert")
    worst = max(r["rel"] for r in rows)
    agree = sum(r["g_top"] == r["r_top"] for r in rows)
    print(f"worst max|diff|/std {worst:.3e} (allowed {tol_rel:g}), "
          f"top-1 agrees at {agree}/{len(rows)} positions")
    if a.expect:
        emu = model.forward(tokens, rope_neox=neox, act=act, emulate=True, omit=omit)
        e = max(float(np.abs(emu[i] - ref[i]).max() / ref[i].std()) for i in range(len(tokens)))
        print(f"expected from llama.cpp-like rounding alone: max|diff|/std {e:.3e}")
        if routes:
            moved = sorted({int(i) for exact, emul in zip(routes, model.routes)
                            for i in np.nonzero((exact != emul).any(axis=1))[0]})
            print("llama.cpp-like rounding changes the experts chosen at positions "
                  f"{','.join(map(str, moved)) if moved else 'none'}")
    if a.self_test and not self_test(model, tokens, ref, got, tol_rel, a.atol, neox, act,
                                     omit):
        print("check_logits.py: a self-test control passed: the check is too loose")
        return 1
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
