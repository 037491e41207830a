#!/bin/sh
# SPDX-License-Identifier: MIT
# Everything a GPU session runs, in one call of the device tool (a call
# starts the machine, which costs minutes of a small budget, so there is one):
#
#   run: timeout 590 sh tests/gpu/device_run.sh        carry: [".debs"]
#
# after `sh tests/gpu/carry.sh` here. In order: unpack the libraries, build,
# `make test-gpu`, then `make bench-gpu` at HYBRID_BUDGET (default 40%, the
# issue's budget; REPS default 2). Each step's log goes to $OUT (the device
# tool brings that folder back; ./gpu-out elsewhere) as it runs, so a call
# cut short by its time limit still returns what finished. The benchmark
# makes its 32-layer model on the machine (synth, profile, plan: a few
# minutes on 16 cores), since 3.8 GB cannot be carried.
set -u
out=${OUT:-gpu-out}
mkdir -p "$out"
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
step setup sh tests/gpu/setup.sh || exit 1
step test-gpu make -j"$(nproc)" test-gpu
TAIL=60 step bench-gpu env HYBRID_BUDGET="${HYBRID_BUDGET:-40%}" REPS="${REPS:-2}" make bench-gpu
