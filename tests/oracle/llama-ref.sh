#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# Builds llama.cpp as llama-cpp-python 0.3.36 vendors it (the reference every
# exactness golden in tests/unit was recorded from) and tests/oracle/llama_ref.c
# against it, into .cache/llama-ref (kept by make clean):
#
#   tests/oracle/llama-ref.sh          prints the path of the llama_ref binary
#
# (llama_speed, the benchmark baseline of tests/bench/real.sh, beside it, and
# llama.cpp's own llama-perplexity and llama-server in build/bin, the
# references of hyb perplexity and of tests/bench/serve.sh)
#
# Stock CPU build, GGML_NATIVE (the goldens are per ISA level: they were
# recorded on AVX-512 VNNI machines). Takes ~10 minutes on 2 cores the first
# time; a developer's tool for recording goldens and for make bench, not run by make test.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dest=$root/.cache/llama-ref
bin=$dest/llama_ref
if [[ -x $bin && $bin -nt $root/tests/oracle/llama_ref.c &&
	$bin -nt $root/tests/oracle/llama_oracle.h &&
	$dest/llama_speed -nt $root/tests/oracle/llama_speed.c &&
	-x $dest/build/bin/llama-perplexity && -x $dest/build/bin/llama-server ]]; then
	echo "$bin"
	exit 0
fi
mkdir -p "$dest"
if [[ ! -d $dest/src ]]; then
	# the archive tests/data/fetch-vocab.sh takes its vocabularies from
	sdist=${HYB_LLAMA_SDIST:-}
	if [[ -z $sdist ]]; then
		python3 -m pip download --quiet --no-deps --no-binary :all: \
			llama-cpp-python==0.3.36 -d "$dest" >&2 || exit 3
		sdist=$dest/llama_cpp_python-0.3.36.tar.gz
	fi
	echo "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e  $sdist" |
		sha256sum -c --quiet - || exit 1
	tar -C "$dest" -xzf "$sdist"
	mv "$dest"/llama_cpp_python-*/vendor/llama.cpp "$dest/src"
	rm -rf "$dest"/llama_cpp_python-*
fi
cmake -S "$dest/src" -B "$dest/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
	-DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
	-DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON -DBUILD_SHARED_LIBS=ON \
	-DCMAKE_BUILD_RPATH_USE_ORIGIN=ON >&2
cmake --build "$dest/build" -j"$(nproc)" --target llama llama-perplexity llama-server >&2
for prog in llama_ref llama_speed; do
	cc -O2 -std=c11 -Wall -Wextra -I"$dest/src/include" -I"$dest/src/ggml/include" \
		"$root/tests/oracle/$prog.c" -L"$dest/build/bin" -Wl,-rpath,"$dest/build/bin" \
		-lllama -lggml -lggml-base -o "$dest/$prog"
done
echo "$bin"
