#!/usr/bin/env bash
# make bench, sparse part: the neuron-aware operator against the
# dense kernels, then the whole offline + online pipeline on ReLU models of
# the 7B shape: synth -> profile -> plan -> dense vs sparse decode of
# the plan in the same run (hyb bench) -> greedy fidelity over 20 prompts.
# SPARSE_LAYERS (default 32) and SPARSE_TYPES (default "Q4_0 Q8_0") shrink it.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p models
layers=${SPARSE_LAYERS:-32}
shape="--hidden 4096 --ffn 11008 --layers $layers --heads 32 --vocab 32000 --seed 7"
if [ -x build/bench_sparse ]; then
	echo "== sparse FFN operator vs dense kernels (PowerInfer Fig. 16) =="
	build/bench_sparse
fi
for t in ${SPARSE_TYPES:-Q4_0 Q8_0}; do
	f=models/sparse-$layers-$t.gguf
	echo "== sparse pipeline: $t, $layers layers =="
	[ -f "$f" ] || build/hybctl synth -o "$f" $shape --act relu --type "$t"
	[ -f "${f%.gguf}.profile.gguf" ] || build/hybctl profile "$f" -o "${f%.gguf}.profile.gguf"
	[ -f "${f%.gguf}.plan.gguf" ] || /usr/bin/time -f "plan: %e s wall, %M KiB peak" \
		build/hybctl plan "$f" --profile "${f%.gguf}.profile.gguf" --gpu-budget 8G \
		-o "${f%.gguf}.plan.gguf"
	echo "-- plan: dense vs sparse, and the source model's dense decode, every round"
	build/hyb bench -m "${f%.gguf}.plan.gguf" --baseline "$f" -p 64 -n 32 -r "${REPS:-5}"
	build/bench_fidelity "${f%.gguf}.plan.gguf" 64 | tail -1
done
