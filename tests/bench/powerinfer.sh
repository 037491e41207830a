#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# hyb's sparse decode against PowerInfer's own CPU main on the same
# PowerInfer file, CPU only, same threads, alternating runs, medians (a
# benchmark, not part of make test). The file: a ReLU llama of the 7B FFN
# shape (4096/11008, PI_LAYERS layers, default 2, vocab 512) from hybctl
# synth, laid out by tests/oracle/powerinfer_gguf.py as PowerInfer's
# converter lays out an F16 file (PowerInfer's CPU axpy reads ffn_down_t as
# F16 or Q4_0 only), with random predictors (hidden 1024) and a threshold
# that predicts about 13% of the neurons. PowerInfer is built by
# tests/oracle/powerinfer-ref.sh (HYB_POWERINFER_SRC / HYB_POWERINFER_BUILD).
#   REPS (default 5) rounds per thread count; THREADS (default "1 2").
set -euo pipefail
cd "$(dirname "$0")/../.."
main=$(tests/oracle/powerinfer-ref.sh --main)
layers=${PI_LAYERS:-2}
src=models/pi-bench-$layers.src.gguf
pi=models/pi-bench-$layers.gguf
mkdir -p models
if [[ ! -f $pi ]]; then
	build/hybctl synth -o "$src" --hidden 4096 --ffn 11008 --layers "$layers" --heads 32 \
		--vocab 512 --act relu --type F16 >/dev/null
	.venv/bin/python tests/oracle/powerinfer_gguf.py "$src" "$pi" --predictor random \
		--hidden 1024 --threshold 0.85
	rm -f "$src"
fi
prompt="Once upon a time"
median() { sort -g | awk '{v[NR] = $1} END {print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
for t in ${THREADS:-1 2}; do
	pa=() ha=()
	for ((r = 0; r < ${REPS:-5}; r++)); do
		pa+=("$("$main" -m "$pi" -p "$prompt" -n 64 --temp 0 --repeat-penalty 1.0 -t "$t" \
			--seed 1 --log-disable 2>&1 | sed -n 's/.*eval time.*, *\([0-9.]*\) tokens per second.*/\1/p' |
			tail -1)")
		ha+=("$(build/hyb run -m "$pi" -p "$prompt" -n 64 -t "$t" 2>&1 |
			sed -n 's/^decode:.*(\([0-9.]*\) tokens\/s)/\1/p')")
	done
	p=$(printf '%s\n' "${pa[@]}" | median)
	h=$(printf '%s\n' "${ha[@]}" | median)
	echo "threads $t: PowerInfer ${pa[*]} -> median $p tokens/s; hyb ${ha[*]} -> median $h" \
		"tokens/s; hyb / PowerInfer $(awk -v a="$h" -v b="$p" 'BEGIN {printf "%.2f", a / b}')"
done
echo "-- hyb's bytes per token on this file (PowerInfer reads a gate and an up row per"
echo "   predicted neuron and a down row per predicted neuron whose activation is not 0)"
build/hyb bench -m "$pi" -p 8 -n 32 -r 1 -t 1 | grep -E '^(sparse|bytes)'
