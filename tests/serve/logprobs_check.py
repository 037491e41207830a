#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""hyb serve's logprobs against the numpy reference forward pass.

Run by tests/unit/test_serve.c with a completion reply to a prompt given as
token ids, greedy, "logprobs": K:

  logprobs_check.py MODEL --tokens 1,17,300 --reply FILE -k K [--tol T]

The first generated token's logprob and its K alternatives' depend on the
prompt alone: they must be the K largest of log_softmax(logits) at the
prompt's last position (tests/oracle/reference.py), within --tol, best
first, the chosen token's the largest (greedy). Exits 1 with the reason.
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "oracle"))
import reference  # noqa: E402


def fail(msg):
    print(f"FAILED: {msg}", file=sys.stderr)
    sys.exit(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--reply", required=True)
    ap.add_argument("-k", type=int, required=True)
    ap.add_argument("--tol", type=float, default=1e-3)
    a = ap.parse_args()

    lp = json.load(open(a.reply))["choices"][0]["logprobs"]
    got_top = sorted(lp["top_logprobs"][0].values(), reverse=True)
    got = lp["token_logprobs"][0]

    logits = reference.Model(a.model).forward(reference.parse_tokens(a.tokens))[-1]
    logits = logits.astype(np.float64)
    m = logits.max()
    ls = logits - (m + np.log(np.exp(logits - m).sum()))
    want_top = np.sort(ls)[::-1][: a.k]

    if len(lp["top_logprobs"][0]) > a.k:
        fail(f"{len(lp['top_logprobs'][0])} alternatives, asked for {a.k}")
    if len(got_top) == a.k:
        for i, (g, w) in enumerate(zip(got_top, want_top)):
            if abs(g - w) > a.tol:
                fail(f"alternative {i}: {g} against the reference's {w}")
    else:
        # alternatives whose pieces print alike share one key of the object
        for g in got_top:
            if not any(abs(g - w) <= a.tol for w in want_top):
                fail(f"alternative {g} is none of the reference's {list(want_top)}")
    if abs(got - want_top[0]) > a.tol:
        fail(f"the greedy token's logprob {got} against the reference's best {want_top[0]}")
    diff = max(min(abs(g - w) for w in want_top) for g in got_top)
    print(f"logprobs: the first token's {len(got_top)} distinct alternatives of {a.k} within "
          f"{a.tol} of the reference (largest difference {diff:.2e})")


if __name__ == "__main__":
    main()
