#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# hyb serve against llama.cpp's llama-server (the version the exactness tests
# use, tests/oracle/llama-ref.sh): total generated tokens/s and p50/p99 time to
# first token at concurrency 1, 4 and 16, same threads, same model, same
# client (tests/bench/serve_load.py: N streamed completions of NGEN tokens,
# C at a time, 2C requests per run). llama-server gets -np C and C x 512
# positions (its -c is shared by its slots); hyb serve --parallel C -c 512.
# Rounds alternate the two servers; medians. The roofline: C sequences per
# pass read the weights once, so C x hyb bench's one-sequence decode roofline.
#
#   bash tests/bench/serve.sh     (THREADS, ROUNDS, NGEN, LAYERS, CONC override)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source tests/bench/common.sh

threads=${THREADS:-$(nproc)}
rounds=${ROUNDS:-2}
ng=${NGEN:-32}
layers=${LAYERS:-4}
conc=${CONC:-"1 4 16"}
py=.venv/bin/python
[[ -x $py ]] || py=python3

if ! ref=$(bash tests/oracle/llama-ref.sh 2>/tmp/hyb-llama-ref.log); then
	echo "serve.sh: llama.cpp could not be built (tail of /tmp/hyb-llama-ref.log):"
	tail -n 3 /tmp/hyb-llama-ref.log
	exit 0
fi
lsrv=$(dirname "$ref")/build/bin/llama-server
[[ -x $lsrv ]] || { echo "serve.sh: no llama-server in $(dirname "$lsrv")"; exit 0; }

mkdir -p .cache/bench
shape=.cache/bench/serve-4096x11008x$layers.Q4_0.gguf
[[ -f $shape ]] || build/hybctl synth -o "$shape" --hidden 4096 --ffn 11008 --layers "$layers" \
	--heads 32 --vocab 32000 --type Q4_0 --seed 7 >/dev/null
models=("$shape")
if bash tests/data/fetch-models.sh smollm2 >/dev/null 2>&1; then
	models+=(models/SmolLM2-135M-Instruct.Q4_1.gguf)
fi

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# run_hyb MODEL C N: one load run against a fresh hyb serve; prints the client's line
run_hyb() {
	local log=/tmp/hyb-bench-serve.log port pid
	build/hyb serve -m "$1" --port 0 --parallel "$2" -c 512 -t "$threads" --queue 256 2>"$log" &
	pid=$!
	for _ in $(seq 600); do
		port=$(sed -n 's|.*listening on http://[^:]*:\([0-9]*\).*|\1|p' "$log")
		[[ -n $port ]] && break
		sleep 0.1
	done
	$py tests/bench/serve_load.py --port "$port" -c "$2" -N "$3" -n "$ng"
	kill -TERM "$pid"; wait "$pid" || true
}

run_llama() {
	local log=/tmp/llama-bench-serve.log port pid
	port=$(free_port)
	"$lsrv" -m "$1" --host 127.0.0.1 --port "$port" -np "$2" -c $(($2 * 512)) -t "$threads" \
		-tb "$threads" >"$log" 2>&1 &
	pid=$!
	for _ in $(seq 600); do
		curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
		sleep 0.1
	done
	$py tests/bench/serve_load.py --port "$port" -c "$2" -N "$3" -n "$ng"
	kill -TERM "$pid"; wait "$pid" || true
}

echo "serve.sh: $threads threads, $rounds rounds, $ng tokens per request, 2C requests per run"
printf '%-34s %3s %9s %9s %6s %9s %15s %15s\n' model C hyb_tok/s llama_tok/s ratio roof_tok/s \
	"ttft50/99 hyb" "ttft50/99 llama"
for m in "${models[@]}"; do
	roof1=$(build/hyb bench -m "$m" -p 8 -n 8 -r 1 -t "$threads" 2>/dev/null |
		awk '/^decode/ {for (i = 1; i <= NF; i++) if ($i == "roofline") print $(i + 1)}')
	for c in $conc; do
		n=$((2 * c < 4 ? 4 : 2 * c))
		ht=() h5=() h9=() lt=() l5=() l9=() errs=0
		for ((r = 0; r < rounds; r++)); do
			read -r t p5 p9 e < <(run_hyb "$m" "$c" "$n")
			ht+=("$t"); h5+=("$p5"); h9+=("$p9"); errs=$((errs + e))
			read -r t p5 p9 e < <(run_llama "$m" "$c" "$n")
			lt+=("$t"); l5+=("$p5"); l9+=("$p9"); errs=$((errs + e))
		done
		H=$(printf '%s\n' "${ht[@]}" | median)
		L=$(printf '%s\n' "${lt[@]}" | median)
		printf '%-34s %3d %9.1f %9.1f %6.2f %9.0f %7.2f/%-7.2f %7.2f/%-7.2f%s\n' \
			"$(basename "$m")" "$c" "$H" "$L" "$(ratio "$H" "$L")" \
			"$(awk -v r="${roof1:-0}" -v c="$c" 'BEGIN {print r * c}')" \
			"$(printf '%s\n' "${h5[@]}" | median)" "$(printf '%s\n' "${h9[@]}" | median)" \
			"$(printf '%s\n' "${l5[@]}" | median)" "$(printf '%s\n' "${l9[@]}" | median)" \
			"$( ((errs)) && echo "  ($errs failed requests)")"
	done
done
