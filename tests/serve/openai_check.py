#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The real OpenAI client (the `openai` package) against a running `hyb serve`.

Run by tests/unit/test_serve.c, which starts the server on a free loopback
port and gives the greedy texts `hyb run` printed for the same prompt:

  openai_check.py --base http://127.0.0.1:PORT/v1 --prompt P -n N
                  [--run-out FILE] [--chat-out FILE] [--key K] [--wrong-key K]
                  [--load REQUESTS CONCURRENCY]

--run-out: `hyb run -p P -n N` stdout (the prompt, the text, a newline);
--chat-out: `hyb run --chat -p P -n N` stdout (the reply, a newline).
Checks completions, chat, both streamed, stop strings, seeds, log
probabilities, usage and errors; --load sends REQUESTS greedy requests, CONCURRENCY at a time, and
checks every answer. Prints one line per check; exits 1 on the first failure.
"""
import argparse
import concurrent.futures as cf
import re
import sys

import openai


def same(a, b):
    # Bytes that are not UTF-8 (a synthetic vocabulary's byte tokens) reach
    # the client as U+FFFD; hyb run prints them raw. One U+FFFD per run of them.
    return re.sub("\ufffd+", "\ufffd", a) == re.sub("\ufffd+", "\ufffd", b)


def check(cond, what):
    if not cond:
        print(f"FAILED: {what}", file=sys.stderr)
        sys.exit(1)


def expected(path, strip_prefix=None):
    if not path:
        return None
    data = open(path, "rb").read()
    if strip_prefix is not None:
        p = strip_prefix.encode()
        check(data.startswith(p), f"{path} starts with the prompt")
        data = data[len(p):]
    check(data.endswith(b"\n"), f"{path} ends with hyb run's newline")
    return data[:-1].decode("utf-8", errors="replace")


def complete(client, model, prompt, n, stream=False, chat=False, **kw):
    """(text, finish_reason, usage) of one request, streamed or not."""
    if chat:
        args = dict(model=model, messages=[{"role": "user", "content": prompt}], max_tokens=n,
                    **kw)
        if not stream:
            r = client.chat.completions.create(**args)
            return r.choices[0].message.content, r.choices[0].finish_reason, r.usage
        parts, finish, usage, first = [], None, None, True
        for ch in client.chat.completions.create(stream=True,
                                                 stream_options={"include_usage": True}, **args):
            if ch.usage:
                usage = ch.usage
            if not ch.choices:
                continue
            if first:
                check(ch.choices[0].delta.role == "assistant", "the first chat chunk has the role")
                first = False
            if ch.choices[0].delta.content:
                parts.append(ch.choices[0].delta.content)
            if ch.choices[0].finish_reason:
                finish = ch.choices[0].finish_reason
        return "".join(parts), finish, usage
    args = dict(model=model, prompt=prompt, max_tokens=n, **kw)
    if not stream:
        r = client.completions.create(**args)
        return r.choices[0].text, r.choices[0].finish_reason, r.usage
    parts, finish, usage = [], None, None
    for ch in client.completions.create(stream=True, stream_options={"include_usage": True},
                                        **args):
        if ch.usage:
            usage = ch.usage
        if not ch.choices:
            continue
        parts.append(ch.choices[0].text)
        if ch.choices[0].finish_reason:
            finish = ch.choices[0].finish_reason
    return "".join(parts), finish, usage


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--prompt", required=True)
    ap.add_argument("-n", type=int, default=16)
    ap.add_argument("--run-out")
    ap.add_argument("--chat-out")
    ap.add_argument("--key", default="no-key")
    ap.add_argument("--wrong-key")
    ap.add_argument("--load", nargs=2, type=int, metavar=("REQUESTS", "CONCURRENCY"))
    a = ap.parse_args()
    client = openai.OpenAI(base_url=a.base, api_key=a.key, max_retries=0, timeout=300)

    models = client.models.list().data
    check(len(models) == 1 and models[0].id, "GET /v1/models lists the one model")
    model = models[0].id
    print(f"ok: models: {model}")

    want = expected(a.run_out, a.prompt)
    want_chat = expected(a.chat_out)
    text, finish, usage = complete(client, model, a.prompt, a.n, temperature=0)
    if want is not None:
        check(same(text, want), f"greedy completion {text!r} == hyb run's {want!r}")
    check(usage.completion_tokens <= a.n and usage.prompt_tokens > 0 and
          usage.total_tokens == usage.prompt_tokens + usage.completion_tokens,
          f"completion usage {usage}")
    check(finish == ("length" if usage.completion_tokens == a.n else "stop"),
          f"finish_reason {finish} with {usage.completion_tokens}/{a.n} tokens")
    print(f"ok: completion ({usage.completion_tokens} tokens, {finish}): {text[:60]!r}")

    s_text, s_finish, s_usage = complete(client, model, a.prompt, a.n, stream=True,
                                         temperature=0)
    check(s_text == text and s_finish == finish, f"streamed {s_text!r}/{s_finish} == {text!r}")
    check(s_usage is not None and s_usage.completion_tokens == usage.completion_tokens,
          f"streamed usage {s_usage}")
    print("ok: streamed completion equals the plain one")

    c_text, c_finish, c_usage = complete(client, model, a.prompt, a.n, chat=True,
                                         temperature=0)
    if want_chat is not None:
        check(same(c_text, want_chat), f"greedy chat {c_text!r} == hyb run --chat's "
              f"{want_chat!r}")
    check(c_finish in ("stop", "length") and c_usage.completion_tokens <= a.n,
          f"chat finish {c_finish}, usage {c_usage}")
    cs_text, cs_finish, cs_usage = complete(client, model, a.prompt, a.n, chat=True,
                                            stream=True, temperature=0)
    check(cs_text == c_text and cs_finish == c_finish and
          cs_usage.completion_tokens == c_usage.completion_tokens,
          f"streamed chat {cs_text!r}/{cs_finish} == {c_text!r}/{c_finish}")
    print(f"ok: chat, plain and streamed ({c_usage.completion_tokens} tokens, {c_finish}): "
          f"{c_text[:60]!r}")

    # a stop string from the middle of the greedy text: the text ends just before it
    mid = [i for i in range(len(text) // 2, len(text) - 1) if text[i:i + 2].strip()]
    if mid:
        stop = text[mid[0]:mid[0] + 2]
        cut = text[:text.find(stop)]
        for stream in (False, True):
            t, f, _ = complete(client, model, a.prompt, a.n, stream=stream, temperature=0,
                               stop=[stop, "\x01never"])
            check(t == cut and f == "stop", f"stop {stop!r} (stream {stream}): {t!r}/{f} vs "
                  f"{cut!r}")
        print(f"ok: stop string {stop!r}, plain and streamed")

    # sampling: a seed repeats a draw
    t1 = complete(client, model, a.prompt, a.n, temperature=0.9, top_p=0.9, seed=42,
                  extra_body={"top_k": 20, "min_p": 0.01, "repeat_penalty": 1.1})[0]
    t2 = complete(client, model, a.prompt, a.n, temperature=0.9, top_p=0.9, seed=42,
                  extra_body={"top_k": 20, "min_p": 0.01, "repeat_penalty": 1.1})[0]
    check(t1 == t2, f"equal seeds, equal samples: {t1!r} vs {t2!r}")
    print("ok: seeded sampling repeats")

    # log probabilities, as the client parses them
    r = client.completions.create(model=model, prompt=a.prompt, max_tokens=4, temperature=0,
                                  logprobs=2)
    lp = r.choices[0].logprobs
    check(lp is not None and len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs)
          and "".join(lp.tokens) == r.choices[0].text and all(v <= 0 for v in lp.token_logprobs)
          and all(max(t.values()) == v for t, v in zip(lp.top_logprobs, lp.token_logprobs)),
          f"completion logprobs: {lp}")
    r = client.chat.completions.create(model=model, messages=[{"role": "user",
                                                               "content": a.prompt}],
                                       max_tokens=4, temperature=0, logprobs=True,
                                       top_logprobs=2)
    lc = r.choices[0].logprobs.content
    check(len(lc) == r.usage.completion_tokens and
          all(len(t.top_logprobs) == 2 and t.top_logprobs[0].logprob == t.logprob and
              bytes(t.bytes) for t in lc), f"chat logprobs: {lc}")
    streamed = []
    for ch in client.completions.create(model=model, prompt=a.prompt, max_tokens=4,
                                        temperature=0, logprobs=2, stream=True):
        if ch.choices and ch.choices[0].logprobs:
            streamed += ch.choices[0].logprobs.token_logprobs
    check(streamed == lp.token_logprobs, f"streamed logprobs {streamed} vs {lp.token_logprobs}")
    print("ok: log probabilities, plain and streamed")

    try:
        client.completions.create(model="no-such-model", prompt="x", max_tokens=1)
        check(False, "an unknown model is refused")
    except openai.NotFoundError as e:
        check(e.status_code == 404 and "no-such-model" in str(e), f"unknown model: {e}")
    try:
        client.completions.create(model=model, prompt="x", max_tokens=1 << 24)
        check(False, "max_tokens past the context is refused")
    except openai.BadRequestError as e:
        check("context" in str(e), f"max_tokens past the context: {e}")
    if a.wrong_key:
        bad = openai.OpenAI(base_url=a.base, api_key=a.wrong_key, max_retries=0)
        try:
            bad.completions.create(model=model, prompt="x", max_tokens=1)
            check(False, "a wrong key is refused")
        except openai.AuthenticationError as e:
            check(e.status_code == 401, f"wrong key: {e}")
    print("ok: errors (unknown model 404, context 400" + (", key 401)" if a.wrong_key else ")"))

    if a.load:
        total, conc = a.load

        def one(i):
            # alternate: completion/chat, plain/streamed; all greedy
            chat, stream = bool(i & 1), bool(i & 2)
            return i, complete(client, model, a.prompt, a.n, stream=stream, chat=chat,
                               temperature=0)

        with cf.ThreadPoolExecutor(conc) as ex:
            for i, (t, f, u) in ex.map(one, range(total)):
                ref = c_text if i & 1 else text
                check(t == ref, f"load request {i}: {t!r} == {ref!r}")
                check(u is not None and u.completion_tokens <= a.n, f"load request {i}: usage")
        print(f"ok: load: {total} requests, {conc} at a time, every answer as when alone")


if __name__ == "__main__":
    main()
