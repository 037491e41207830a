#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# PowerInfer's own CPU build, the reference of the pi_tokens_* goldens in
# tests/unit/test_powerinfer.c (make test uses the goldens; it never builds
# PowerInfer):
#
#   tests/oracle/powerinfer-ref.sh           builds it into .cache/powerinfer-ref
#                                            and prints the path of powerinfer_ids
#                                            (its main and quantize beside the build: bin/)
#   tests/oracle/powerinfer-ref.sh --main    ... and prints the path of its main
#   tests/oracle/powerinfer-ref.sh --check-index F.gpuidx
#                                            reads a GPU index with PowerInfer's reader
#   tests/oracle/powerinfer-ref.sh --record  prints the goldens
#
# Source: $HYB_POWERINFER_SRC (a checkout), else a clone of
# github.com/SJTU-IPADS/PowerInfer at the commit below; $HYB_POWERINFER_BUILD
# names a finished CMake build of it to use as it is. Stock CPU build
# (GGML_NATIVE: the goldens were recorded on an AVX-512 VNNI Xeon; ~10
# minutes on 2 cores). The models are made as the test makes them: a ReLU
# llama from hybctl synth, laid out by tests/oracle/powerinfer_gguf.py as
# PowerInfer's converter lays out its files (PWRI magic, ffn_down_t, fc1/fc2,
# powerinfer.sparse_threshold), which PowerInfer loads for sparse inference
# ("PowerInfer model loaded. Sparse inference will be used."). Prompts are
# hyb's token ids; the goldens are PowerInfer's greedy ids after them, one
# thread (its down axpy threads add into one output unsynchronised, so
# more threads would make its own ids vary).
set -euo pipefail

commit=d3ebd7c5666348cf43c22f0d62dfbc9a763cffb8
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dest=$root/.cache/powerinfer-ref
mkdir -p "$dest"
build=${HYB_POWERINFER_BUILD:-$dest/build}
src=${HYB_POWERINFER_SRC:-$dest/src}
if [[ ! -f $build/libllama.a ]]; then
	if [[ ! -d $src ]]; then
		git clone -q https://github.com/SJTU-IPADS/PowerInfer "$src"
		git -C "$src" checkout -q "$commit"
	fi
	cmake -S "$src" -B "$build" -DLLAMA_CUBLAS=OFF -DLLAMA_BUILD_TESTS=OFF \
		-DCMAKE_BUILD_TYPE=Release >"$dest/cmake.log"
	cmake --build "$build" --target llama main quantize -j"$(nproc)" >"$dest/build.log"
fi
bin=$dest/powerinfer_ids
if [[ ! -x $bin || $root/tests/oracle/powerinfer_ids.c -nt $bin ]]; then
	cc -O2 -I "$src" "$root/tests/oracle/powerinfer_ids.c" "$build/libllama.a" \
		-lstdc++ -lm -lpthread -o "$bin"
fi
if [[ ${1:-} == --check-index ]]; then
	# (verified: the index powerinfer_gguf.py writes, empty bucket included)
	cc -O2 -I "$src" "$root/tests/oracle/powerinfer_idx.c" "$build/libllama.a" \
		-lstdc++ -lm -lpthread -o "$dest/powerinfer_idx"
	exec "$dest/powerinfer_idx" "$2"
fi
if [[ ${1:-} == --main ]]; then
	echo "$build/bin/main"
	exit 0
fi
if [[ ${1:-} != --record ]]; then
	echo "$bin"
	exit 0
fi

cd "$root"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
build/hybctl synth -o "$tmp/src.gguf" --hidden 256 --ffn 1024 --layers 2 --heads 4 \
	--vocab 512 --act relu --type F16 -t 1 >/dev/null
.venv/bin/python tests/oracle/powerinfer_gguf.py "$tmp/src.gguf" "$tmp/exact.gguf" \
	--predictor exact --threshold 1e-6
.venv/bin/python tests/oracle/powerinfer_gguf.py "$tmp/src.gguf" "$tmp/random.gguf" \
	--predictor random --hidden 64
for model in exact random; do
	for prompt in "Once upon a time" "The quick brown fox" "In a hole in the ground" \
		"hello world, this is" "Paris is the capital"; do
		ids=$(build/hyb tokenize -m "$tmp/$model.gguf" -p "$prompt" | tr ' ' ',')
		echo "$model | $ids | $("$bin" "$tmp/$model.gguf" 32 1 "$ids" 2>/dev/null)"
	done
done
