#!/usr/bin/env bash
# Installs the Debian packages hyb builds and tests with, when missing.
# Used by `make run`, `make test` and .ci/run; `make bench` passes "bench" for
# what only the benchmarks use. Quiet when all are present.
set -euo pipefail

pkgs=(
	build-essential pkg-config   # compiler, make, library flags
	liburing-dev                 # io_uring streaming (daemon, loader)
	libnuma-dev                  # NUMA placement of pools
	libmetis-dev                 # co-activation grouping (hybctl plan)
	libutf8proc-dev              # Unicode categories for the BPE pre-tokenizer
	libmicrohttpd-dev            # hyb serve's HTTP server
	libjansson-dev               # hyb serve's JSON
	curl                         # hyb serve's tests (a plain HTTP client)
	clang libclang-rt-dev        # libFuzzer for the parser fuzz targets
	python3 python3-venv         # test oracles only (numpy + gguf in .venv)
)
if [ "${1:-}" = bench ]; then
	pkgs+=(fio)                  # the drive's own read rate, the load benchmarks' roofline
fi

missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "hyb: installing missing packages: ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
	if command -v sudo >/dev/null; then
		SUDO=sudo
	else
		echo "hyb: need root to install: apt-get install ${missing[*]}" >&2
		exit 1
	fi
fi
export DEBIAN_FRONTEND=noninteractive
${SUDO:-} apt-get update -qq
${SUDO:-} apt-get install -y -qq --no-install-recommends "${missing[@]}"
