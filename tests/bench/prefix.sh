#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# The prefix cache (docs/SERVE.md "Prefix cache"): time of a request whose
# prompt shares its first SHARED of N tokens with the request before it
# (max_tokens 1: about its time to first token), hyb serve with the cache,
# without it (--no-prefix-cache) and llama.cpp's llama-server (its slot's
# cache_prompt, one slot), same model, threads and client (curl). Rounds
# alternate the three; medians of ROUNDS x 2 requests. The bound: the
# tokens left to evaluate over the prefill speed without the cache.
#
#   bash tests/bench/prefix.sh     (THREADS, ROUNDS, N, SHARED override)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source tests/bench/common.sh

threads=${THREADS:-$(nproc)}
rounds=${ROUNDS:-3}
n=${N:-1100}
shared=${SHARED:-1060}

need_llama_speed prefix.sh
lsrv=$(dirname "$speed")/build/bin/llama-server
[[ -x $lsrv ]] || { echo "prefix.sh: no llama-server in $(dirname "$lsrv")"; exit 0; }
smol=$(bash tests/data/fetch-models.sh smollm2) || { echo "prefix.sh: models unavailable"; exit 0; }
bash tests/oracle/venv.sh >/dev/null 2>&1 || true
m=models/derived/SmolLM2-135M-Instruct.Q8_0.gguf
if [[ ! -f $m && -x .venv/bin/python ]]; then
	mkdir -p models/derived
	.venv/bin/python tests/oracle/requant.py "$smol" "$m.tmp" Q8_0 && mv "$m.tmp" "$m"
fi
[[ -f $m ]] || m=$smol
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# request k: the shared ids, then ids of its own
for k in 0 1 2; do
	python3 -c "import sys
n, s, k = map(int, sys.argv[1:])
ids = [(i * 37 + 11) % 40000 + 3 for i in range(s)] + [(i * 53 + k) % 40000 + 3 for i in range(n - s)]
print('{\"prompt\": %s, \"max_tokens\": 1, \"temperature\": 0}' % ids)" "$n" "$shared" "$k" \
		>"$tmp/req$k.json"
done
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# one server: the first request, then the two timed ones (seconds, one a line)
timed() {
	local port=$1
	curl -sf -o /dev/null "localhost:$port/v1/completions" -d @"$tmp/req0.json"
	for k in 1 2; do
		curl -sf -o "$tmp/out" -w '%{time_total}\n' "localhost:$port/v1/completions" \
			-d @"$tmp/req$k.json"
	done
	grep -o '"cached_tokens":[0-9]*' "$tmp/out" | cut -d: -f2 >"$tmp/cached"
}

run_hyb() { # extra options
	local log=$tmp/hyb.log port pid
	build/hyb serve -m "$m" --port 0 -c 2048 -t "$threads" "$@" 2>"$log" &
	pid=$!
	for _ in $(seq 600); do
		port=$(sed -n 's|.*listening on http://[^:]*:\([0-9]*\).*|\1|p' "$log")
		[[ -n $port ]] && break
		sleep 0.1
	done
	timed "$port"
	kill -TERM "$pid"; wait "$pid" || true
}

run_llama() {
	local port pid
	port=$(free_port)
	LD_LIBRARY_PATH=$(dirname "$lsrv") "$lsrv" -m "$m" --host 127.0.0.1 --port "$port" -np 1 \
		-c 2048 -t "$threads" >"$tmp/llama.log" 2>&1 &
	pid=$!
	for _ in $(seq 600); do
		curl -sf "localhost:$port/health" >/dev/null 2>&1 && break
		sleep 0.1
	done
	timed "$port"
	kill -TERM "$pid"; wait "$pid" || true
}

hc=() hn=() lc=()
for ((r = 0; r < rounds; r++)); do
	mapfile -t -O "${#hc[@]}" hc < <(run_hyb)
	hcached=$(cat "$tmp/cached")
	mapfile -t -O "${#hn[@]}" hn < <(run_hyb --no-prefix-cache)
	mapfile -t -O "${#lc[@]}" lc < <(run_llama)
	lcached=$(cat "$tmp/cached")
done
H=$(printf '%s\n' "${hc[@]}" | median)
N0=$(printf '%s\n' "${hn[@]}" | median)
L=$(printf '%s\n' "${lc[@]}" | median)
printf '%s: %d-token prompts sharing their first %d, %s threads\n' "$(basename "$m" .gguf)" \
	"$n" "$shared" "$threads"
printf '  hyb serve, prefix cache     %7.3f s  (%s tokens reused; %.2fx faster than without)\n' \
	"$H" "$hcached" "$(ratio "$N0" "$H")"
printf '  hyb serve, --no-prefix-cache %6.3f s\n' "$N0"
printf '  llama-server, cache_prompt  %7.3f s  (%s tokens reused; hyb %.2fx its speed)\n' \
	"$L" "$lcached" "$(ratio "$L" "$H")"
printf '  bound: %d tokens left at the uncached prefill rate: %.3f s\n' "$((n - hcached))" \
	"$(awk -v t="$N0" -v n="$n" -v k="$((n - hcached))" 'BEGIN {print t * k / n}')"
