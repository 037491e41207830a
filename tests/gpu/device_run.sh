#!/bin/sh
# SPDX-License-Identifier: MIT
# Everything a GPU session runs, in one call of the device tool (a call
# starts the machine, which costs minutes of a small budget, so there is one):
#
#   run: timeout 590 sh tests/gpu/device_run.sh        carry: [".debs"]
#
# after `sh tests/gpu/carry.sh` here. In order: what the machine has, unpack
# the libraries, build (Hopper code only, and another compiler's new warnings
# do not stop it: it is the one build there is time for), then `make
# test-gpu` while the benchmark's 32-layer model is made on the other cores
# (synth, profile, plan: 3.8 GB cannot be carried), then `make bench-gpu` at
# HYBRID_BUDGET (default 40%, the benchmark's budget), REPS rounds (default 1:
# one round of every policy at 256 tokens is what fits). Each step's log goes
# to $OUT (the device tool brings that folder back; ./gpu-out elsewhere) as it
# runs, so a call cut short by its time limit still returns what finished.
set -u
out=${OUT:-gpu-out}
mkdir -p "$out"
mk="make -j$(nproc) WERROR= CUDA_ARCH=-gencode=arch=compute_90,code=sm_90"
step() {
	name=$1
	shift
	start=$(date +%s)
	"$@" > "$out/$name.log" 2>&1
	rc=$?
	echo "== $name: rc $rc, $(($(date +%s) - start)) s"
	tail -n "${TAIL:-15}" "$out/$name.log"
	return $rc
}
machine() {
	nvidia-smi -L
	command -v nvcc || ls /usr/local/cuda/bin/nvcc
	nvcc --version 2>/dev/null | tail -n 1
	gcc --version | head -n 1
	echo "$(nproc) CPUs, $(free -g | awk '/Mem:/ { print $2 }') GiB"
}
TAIL=8 step machine machine
step setup sh tests/gpu/setup.sh || exit 1
step build $mk all || exit 1
(HYBRID_PREPARE_ONLY=1 HYBRID_LAYERS=32 bash tests/bench/hybrid.sh > "$out/model.log" 2>&1
 echo "== model: rc $?" >> "$out/model.log") &
model=$!
TAIL=25 step test-gpu env HYB_TEST_TIMEOUT=120 $mk test-gpu
grep -q "no CUDA device" "$out/test-gpu.log" && echo "!! test-gpu: the tests saw no CUDA device"
wait $model
tail -n 8 "$out/model.log"
TAIL=60 step bench-gpu env HYBRID_BUDGET="${HYBRID_BUDGET:-40%}" REPS="${REPS:-1}" $mk bench-gpu
