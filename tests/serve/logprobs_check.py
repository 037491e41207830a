#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""hyb serve's logprobs against the numpy reference forward pass.

Run by tests/unit/test_serve.c with a completion reply to a prompt given as
token ids, greedy, "logprobs": K:

  logprobs_check.py MODEL --tokens 1,17,300 --reply FILE -k K [--tol T] [--echo]

The first generated token's logprob and its K alternatives' depend on the
prompt alone: they must be the K largest of log_softmax(logits) at the
prompt's last position (tests/oracle/reference.py), best first, the chosen
token's the largest (greedy). Tolerance per position: twice the logits'
bound of check_logits.py (a logprob is a logit less log-sum-exp, each
within it), tol_rel(weight types) * std(logits) + ATOL; --tol overrides. --echo: a reply to "echo":
true, "max_tokens": 0: every prompt token's logprob but the first (null)
is log_softmax at the position before it, of that token. Exits 1 with the
reason.
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "oracle"))
import check_logits  # noqa: E402
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
    ap.add_argument("--tol", type=float)
    ap.add_argument("--echo", action="store_true")
    a = ap.parse_args()

    lp = json.load(open(a.reply))["choices"][0]["logprobs"]
    model = reference.Model(a.model)
    ids = reference.parse_tokens(a.tokens)
    logits = model.forward(ids).astype(np.float64)
    tol_rel = check_logits.default_tol_rel(model)[0]
    tol = [a.tol if a.tol is not None else 2 * (tol_rel * row.std() + check_logits.ATOL)
           for row in logits]
    m = logits.max(axis=1, keepdims=True)
    ls = logits - (m + np.log(np.exp(logits - m).sum(axis=1, keepdims=True)))
    if a.echo:
        got = lp["token_logprobs"]
        if len(got) != len(ids) or got[0] is not None or lp["top_logprobs"][0] is not None:
            fail(f"echo: {len(got)} logprobs for {len(ids)} prompt tokens, the first {got[0]}")
        worst = max(abs(got[t] - ls[t - 1][ids[t]]) / tol[t - 1] for t in range(1, len(ids)))
        if worst > 1:
            fail(f"echo: a prompt token's logprob {worst:.2f} tolerances from the reference's")
        print(f"logprobs: {len(ids) - 1} prompt tokens' within {worst:.2f} of their "
              f"tolerance ({tol_rel:g} x std + {check_logits.ATOL:g}, twice) of the reference")
        return
    got_top = sorted(lp["top_logprobs"][0].values(), reverse=True)
    got = lp["token_logprobs"][0]

    want_top = np.sort(ls[-1])[::-1][: a.k]
    a.tol = tol[-1]

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
          f"{a.tol:.2e} of the reference (largest difference {diff:.2e})")


if __name__ == "__main__":
    main()
