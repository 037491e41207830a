#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Load generator of tests/bench/serve.sh: N streamed completions, C at a time,
against an OpenAI-compatible server (hyb serve or llama-server) on loopback.

Prints one line: tokens/s over the whole run (generated tokens, from each
stream's usage or else its chunks), p50 and p99 time to first token, errors.
Standard library only (threads, http.client), so both servers meet the same
client.
"""
import argparse
import http.client
import json
import threading
import time

WORDS = ("the old lighthouse keeper watched ships pass while the storm grew "
         "over the harbour and children ran home along the quiet wet road").split()


def prompt(i):
    # a different prompt per request: no server reuses another's cached prefix
    return " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(24))


def one(port, i, n, out):
    body = json.dumps({"prompt": prompt(i), "max_tokens": n, "temperature": 0,
                       "stream": True, "stream_options": {"include_usage": True}})
    t0 = time.monotonic()
    first, chunks, usage = None, 0, None
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            out[i] = ("error", r.status)
            return
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                usage = ev["usage"].get("completion_tokens")
            for ch in ev.get("choices") or []:
                if ch.get("text"):
                    chunks += 1
                    if first is None:
                        first = time.monotonic()
        c.close()
    except OSError as e:
        out[i] = ("error", str(e))
        return
    out[i] = ("ok", (first or time.monotonic()) - t0, usage if usage else chunks)


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("-c", type=int, required=True, help="requests at a time")
    ap.add_argument("-N", type=int, required=True, help="requests")
    ap.add_argument("-n", type=int, default=32, help="max_tokens")
    a = ap.parse_args()
    out = [None] * a.N
    sem = threading.Semaphore(a.c)

    def run(i):
        with sem:
            one(a.port, i, a.n, out)

    t0 = time.monotonic()
    th = [threading.Thread(target=run, args=(i,)) for i in range(a.N)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    wall = time.monotonic() - t0
    ok = [o for o in out if o and o[0] == "ok"]
    toks = sum(o[2] for o in ok)
    ttft = [o[1] for o in ok] or [0.0]
    print(f"{toks / wall:.2f} {pct(ttft, 50):.3f} {pct(ttft, 99):.3f} {a.N - len(ok)}")


main()
