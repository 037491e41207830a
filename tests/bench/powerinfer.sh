#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# hyb's sparse decode against PowerInfer's own CPU main on the same
# PowerInfer files, CPU only, same threads, alternating runs, medians (a
# benchmark, not part of make test). The files are made by PowerInfer's own
# tools, as tests/oracle/powerinfer-convert.sh makes the test files: a ReLU
# llama of the 7B FFN shape (4096/11008, 32 heads, PI_LAYERS layers, default
# 2, vocabulary 512) with random predictors (hidden 1024, threshold 0.85)
# written as a Hugging Face checkpoint (tests/oracle/powerinfer_hf.py),
# converted by PowerInfer's convert.py to F16 and quantized by its quantize
# to Q4_0 (the two types PowerInfer's CPU axpy computes). PowerInfer is
# built by tests/oracle/powerinfer-ref.sh; its Python by powerinfer-convert.sh
# ($HYB_POWERINFER_VENV).
#   REPS (default 5) rounds per thread count; THREADS (default "1 2");
#   TYPES (default "F16 Q4_0"); N decoded tokens (default 64).
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/bench/common.sh
main=$(tests/oracle/powerinfer-ref.sh --main)
bin=$(dirname "$main")
src=${HYB_POWERINFER_SRC:-.cache/powerinfer-ref/src}
venv=${HYB_POWERINFER_VENV:-.cache/powerinfer-ref/venv}
layers=${PI_LAYERS:-2}
n=${N:-64}
dir=models/pi-bench-$layers
mkdir -p "$dir"
if [[ ! -f $dir/Q4_0.gguf ]]; then
	[[ -x $venv/bin/python ]] || { echo "no PowerInfer venv: run tests/oracle/powerinfer-convert.sh once"; exit 1; }
	"$venv/bin/python" tests/oracle/powerinfer_hf.py hf "$dir/hf" --corpus "$src/README.md" \
		--hidden 4096 --ffn 11008 --layers "$layers" --heads 32 --kv-heads 32 \
		--predictor random --pred-hidden 1024 --threshold 0.85
	"$venv/bin/python" "$src/convert.py" --outtype f16 --outfile "$dir/F16.gguf" \
		"$dir/hf/model" "$dir/hf/predictor" >"$dir/convert.log"
	"$bin/quantize" "$dir/F16.gguf" "$dir/Q4_0.gguf" Q4_0 >"$dir/quantize.log" 2>&1
	rm -rf "$dir/hf"
fi
prompt="Once upon a time"
for type in ${TYPES:-F16 Q4_0}; do
	pi=$dir/$type.gguf
	for t in ${THREADS:-1 2}; do
		pa=() ha=()
		for ((r = 0; r < ${REPS:-5}; r++)); do
			pa+=("$("$main" -m "$pi" -p "$prompt" -n "$n" --temp 0 --repeat-penalty 1.0 \
				-t "$t" --seed 1 --log-disable 2>&1 |
				sed -n 's/.*eval time.*, *\([0-9.]*\) tokens per second.*/\1/p' | tail -1)")
			ha+=("$(build/hyb run -m "$pi" -p "$prompt" -n "$n" -t "$t" 2>&1 |
				sed -n 's/^decode:.*(\([0-9.]*\) tokens\/s)/\1/p')")
		done
		p=$(printf '%s\n' "${pa[@]}" | median)
		h=$(printf '%s\n' "${ha[@]}" | median)
		echo "$type threads $t: PowerInfer ${pa[*]} -> median $p tokens/s; hyb ${ha[*]} ->" \
			"median $h tokens/s; hyb / PowerInfer" \
			"$(awk -v a="$h" -v b="$p" 'BEGIN {printf "%.2f", a / b}')"
	done
	echo "-- $type: hyb's bytes per token and roofline on this file (PowerInfer reads a gate"
	echo "   and an up row per predicted neuron and a down row per neuron whose h is not 0)"
	build/hyb bench -m "$pi" -p 8 -n 32 -r 1 -t 1 | grep -E '^(sparse|bytes|decode)'
done
