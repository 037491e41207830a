#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# How tests/data/powerinfer/ was made: PowerInfer's own tools, as its README
# tells a user to run them, on a small synthetic ReLU llama (make test uses
# the committed files; it never runs this):
#
#   tests/oracle/powerinfer-convert.sh [OUT]     (default tests/data/powerinfer)
#
#   1. tests/oracle/powerinfer_hf.py writes a Hugging Face checkpoint
#      (config.json, model.safetensors, a SentencePiece tokenizer.model trained
#      on PowerInfer's README) and its predictors as PowerInfer ships them
#      (model_N.pt, config.json with sparse_threshold): exact predictors
#      (robust to rounding) and random ones;
#   2. PowerInfer's convert.py --outtype f16 makes the model files (PWRI magic,
#      ffn_down_t, fc1/fc2, powerinfer.sparse_threshold), its quantize makes a
#      Q4_0 one;
#   3. hybctl profile counts each neuron's activations on the converted model
#      (64 generated tokens), written as PowerInfer's activation_N.pt; its ILP
#      solver (python -m powerinfer, which also runs export_split) makes the
#      GPU index;
#   4. PowerInfer's CPU build (tests/oracle/powerinfer-ref.sh) tokenizes the
#      prompts below and decodes 32 greedy tokens after each, one thread (its
#      down axpy threads add into one output unsynchronised): goldens.txt.
#
# Python: $HYB_POWERINFER_VENV, else .cache/powerinfer-ref/venv made here
# with PowerInfer's requirements (its gguf-py and powerinfer-py: torch,
# cvxopt; numpy < 2 for its convert.py; no transformers, which convert.py
# does not import). PyPI's torch brings its CUDA libraries: about 5.5 GB,
# a few minutes. The profile counts are read with the test venv's gguf
# (.venv: PowerInfer's gguf-py predates I64 tensors).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
ids=$(tests/oracle/powerinfer-ref.sh)
main=$(tests/oracle/powerinfer-ref.sh --main)
build=$(dirname "$(dirname "$main")")
src=${HYB_POWERINFER_SRC:-$root/.cache/powerinfer-ref/src}
venv=${HYB_POWERINFER_VENV:-$root/.cache/powerinfer-ref/venv}
out=${1:-$root/tests/data/powerinfer}
if [[ ! -x $venv/bin/python ]]; then
	python3 -m venv "$venv"
	"$venv/bin/pip" install -q "numpy<2" sentencepiece safetensors "$src/gguf-py" \
		"$src/powerinfer-py"
fi
py=$venv/bin/python
[[ -x build/hybctl ]] || make -s build/hybctl
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$out"

for kind in exact random; do
	opts=(--predictor "$kind")
	[[ $kind == exact ]] && opts+=(--threshold 1e-6)
	"$py" tests/oracle/powerinfer_hf.py hf "$tmp/$kind" --corpus "$src/README.md" "${opts[@]}"
	"$py" "$src/convert.py" --outtype f16 --outfile "$out/$kind.powerinfer.gguf" \
		"$tmp/$kind/model" "$tmp/$kind/predictor" >"$tmp/convert-$kind.log"
done
"$build/bin/quantize" "$out/exact.powerinfer.gguf" "$out/exact.q4_0.powerinfer.gguf" Q4_0 \
	>"$tmp/quantize.log" 2>&1

# the GPU index of the exact model: a quarter of its neurons on the GPU
build/hybctl profile "$out/exact.powerinfer.gguf" -o "$tmp/exact.profile.gguf" --gen 64 \
	-t 1 >"$tmp/profile.log"
tests/oracle/venv.sh >/dev/null
.venv/bin/python tests/oracle/powerinfer_hf.py activations "$tmp/exact.profile.gguf" \
	"$tmp/activation"
"$py" tests/oracle/powerinfer_hf.py pt "$tmp/activation"
(cd "$tmp" && "$py" -m powerinfer --activation "$tmp/activation" --neuron 512 \
	--capacity 256 --layer 2 --batch 32 --vram-capacity $((1 << 20)) \
	--output "$out/exact.gpuidx" >"$tmp/solver.log")

{
	echo "# PowerInfer $(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo d3ebd7c)" \
		"CPU build, one thread: its tokenization of each prompt (BOS first) and"
	echo "# its 32 greedy ids after it (tests/oracle/powerinfer-convert.sh)"
	echo "# model | prompt | prompt ids | greedy ids"
	for model in exact.powerinfer.gguf random.powerinfer.gguf exact.q4_0.powerinfer.gguf; do
		for prompt in "Once upon a time" "The quick brown fox" "In a hole in the ground" \
			"hello world, this is" "Paris is the capital" "PowerInfer runs 11x faster"; do
			echo "$model | $prompt | $("$ids" "$out/$model" 32 1 "text:$prompt" 2>/dev/null)"
		done
	done
} >"$out/goldens.txt"
ls -l "$out"
