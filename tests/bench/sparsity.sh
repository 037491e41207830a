#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# CATS activation sparsity on real weights (docs/SPARSITY.md): what each
# sparsity costs in quality and buys in speed, all in one run.
#
#  1. Calibration: `hybctl profile --sparsity 0.5` on its built-in prompts
#     (its quantiles give the thresholds of every other sparsity).
#  2. Quality: `hyb perplexity` on the GPL-3 text of Debian's base-files
#     (held out: no calibration prompt comes from it) at sparsity 0 to 0.5,
#     as a ratio to dense; and greedy agreement: of 64 tokens decoded from
#     each of 3 prompts, how many equal dense decoding's before the first
#     difference.
#  3. Speed: a plan of SmolLM2 F16 and Q8_0 and of a synthetic 4096/11008
#     SiLU model; `hyb bench` alternates dense and sparse decoding of the
#     plan in each round, at the largest sparsity whose perplexity rose by
#     at most 2% and at 0.5, with the byte bound it is held against.
#
#   tests/bench/sparsity.sh [ROUNDS]   (THREADS from the environment; QUICK=1
#                                       skips the synthetic 4096/11008 model)
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/bench/common.sh

rounds=${1:-5}
threads=${THREADS:-$(nproc)}
text=/usr/share/common-licenses/GPL-3
out=models/sparsity
hyb=build/hyb
ctl=build/hybctl
kind=--cats
mkdir -p "$out"

sparse_models sparsity.sh

profile() { # MODEL PROFILE
	[[ -f $2 && $2 -nt $1 && $2 -nt $ctl ]] ||
		$ctl profile "$1" --sparsity 0.5 -t "$threads" -o "$2" >/dev/null
}
declare -A best
echo "== quality: perplexity on $text (-c 512), CATS thresholds from hybctl profile --sparsity 0.5"
for model in "$smol" "$gemma"; do
	name=$(basename "$model" .gguf)
	prof=$out/$name.profile.gguf
	profile "$model" "$prof"
	sparse_quality "$model" "$prof" 0.1 0.2 0.3 0.4 0.5
	best[$name]=$SPARSE_BEST
done

bench() { # SOURCE PROFILE PLAN SPARSITY
	$hyb bench -m "$3" --baseline "$1" --cats "$2" --sparsity "$4" -p 16 -n 64 -r "$rounds" \
		-t "$threads" 2>/dev/null | grep -E "^(dense|sparse|baseline) "
}
echo
echo "== speed: plan decode, sparse against dense of the same weights, $rounds rounds, $threads threads"
sname=$(basename "$smol" .gguf)
models=("$f16" "$q8")
if [[ -z ${QUICK:-} ]]; then
	synth=$out/silu-4096x11008.Q8_0.gguf
	[[ -f $synth ]] || $ctl synth -o "$synth" --hidden 4096 --ffn 11008 --layers 4 --heads 32 \
		--vocab 512 --act silu --type Q8_0 -t "$threads" >/dev/null
	models+=("$synth")
fi
for model in "${models[@]}"; do
	[[ -f $model ]] || continue
	name=$(basename "$model" .gguf)
	prof=$out/$name.profile.gguf
	plan=$out/$name.plan.gguf
	if [[ $model == "$synth" ]]; then
		[[ -f $prof && $prof -nt $ctl ]] || $ctl profile "$model" --sparsity 0.5 --gen 16 \
			-t "$threads" -o "$prof" >/dev/null
		s_ok=0.5
	else
		profile "$model" "$prof"
		s_ok=${best[$sname]}
	fi
	[[ -f $plan && $plan -nt $prof ]] || $ctl plan "$model" --profile "$prof" --gpu-budget 64G \
		-o "$plan" -t "$threads" >/dev/null
	for s in $(printf "%s\n" "$s_ok" 0.5 | sort -u); do
		[[ $s == 0 ]] && continue
		echo "-- $name, sparsity $s"
		bench "$model" "$prof" "$plan" "$s"
	done
done
