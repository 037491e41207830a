#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# Fetch llama.cpp's tokenizer test vocabularies (ggml-vocab-*.gguf with their
# .inp/.out vectors) from the llama-cpp-python source distribution on PyPI,
# which vendors llama.cpp. Only the three vocabularies hyb's tests use are
# extracted.
#
#   tests/data/fetch-vocab.sh [DEST]    (default: .cache/vocab, kept by make clean)
#
# HYB_LLAMA_SDIST=/path/llama_cpp_python-0.3.36.tar.gz uses a local copy
# instead of downloading. Idempotent (does nothing when the files are there),
# quiet, and exits non-zero when they cannot be had (offline, no pip).
set -euo pipefail

VERSION=0.3.36
DEST=${1:-.cache/vocab}
SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
VOCABS=(llama-spm gpt-2 llama-bpe)

have_all() {
	local v ext
	for v in "${VOCABS[@]}"; do
		for ext in "" .inp .out; do
			[[ -s "$DEST/ggml-vocab-$v.gguf$ext" ]] || return 1
		done
	done
}

have_all && exit 0

mkdir -p "$DEST"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hyb-vocab.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

sdist=${HYB_LLAMA_SDIST:-}
# The archive straight from the package index (seconds), checked against its
# known hash; pip download is the fallback (minutes: it prepares metadata).
if [[ -z "$sdist" ]] && command -v curl >/dev/null; then
	url=$(curl -fsS --max-time 30 https://pypi.org/simple/llama-cpp-python/ 2>/dev/null |
		grep -o "https://[^\"#]*llama_cpp_python-$VERSION.tar.gz" | head -n 1) || true
	if [[ -n "$url" ]] && curl -fsS --max-time 300 -o "$tmp/sdist.tar.gz" "$url" 2>/dev/null &&
		echo "$SHA256  $tmp/sdist.tar.gz" | sha256sum -c --quiet - 2>/dev/null; then
		sdist=$tmp/sdist.tar.gz
	fi
fi
if [[ -z "$sdist" ]]; then
	pip=(python3 -m pip)
	"${pip[@]}" --version >/dev/null 2>&1 || pip=(pip)
	if ! "${pip[@]}" download --quiet --no-deps --no-binary :all: \
		"llama-cpp-python==$VERSION" -d "$tmp" >"$tmp/pip.log" 2>&1; then
		echo "fetch-vocab: could not download llama-cpp-python $VERSION from PyPI" \
			"(offline?): $(tail -n 1 "$tmp/pip.log")" >&2
		exit 1
	fi
	sdist=$(ls "$tmp"/llama_cpp_python-*.tar.gz 2>/dev/null | head -n 1)
fi
if [[ ! -f "$sdist" ]]; then
	echo "fetch-vocab: no llama-cpp-python source archive found" >&2
	exit 1
fi

patterns=()
for v in "${VOCABS[@]}"; do
	patterns+=("*/vendor/llama.cpp/models/ggml-vocab-$v.gguf"
		   "*/vendor/llama.cpp/models/ggml-vocab-$v.gguf.inp"
		   "*/vendor/llama.cpp/models/ggml-vocab-$v.gguf.out")
done
if ! tar -xzf "$sdist" -C "$tmp" --wildcards --no-anchored "${patterns[@]}" 2>"$tmp/tar.log"; then
	echo "fetch-vocab: extracting from $sdist failed: $(tail -n 1 "$tmp/tar.log")" >&2
	exit 1
fi
find "$tmp" -path '*/vendor/llama.cpp/models/ggml-vocab-*' -type f -exec mv -f {} "$DEST/" \;

if ! have_all; then
	echo "fetch-vocab: $sdist lacks some of the vocabularies" >&2
	exit 1
fi
