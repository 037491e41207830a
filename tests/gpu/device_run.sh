#!/bin/bash
# SPDX-License-Identifier: MIT
# What a GPU session runs, through the device tool, after `sh tests/gpu/carry.sh`
# here (carry: [".debs"]). Two parts, each well inside one call's 10 minutes:
#
#   bash tests/gpu/device_run.sh test     (a) build, make test-gpu: ~4 min
#   bash tests/gpu/device_run.sh bench    (b) the benchmarks: ~5 min
#   bash tests/gpu/device_run.sh all      both in one call (the machine goes
#                                         back 30 s after a call, and (b)
#                                         needs the model (a) prepares)
#
# The machine: GPU, driver, runtime (Firecracker, or gVisor, which reports
# kernel 4.4.0 and may refuse io_uring: then the models load through their
# file mapping, HYB_LOAD=mmap, and the test that needs io_uring says so),
# libraries unpacked into a prefix (tests/gpu/setup.sh), Hopper code only.
# (a) starts the benchmark's model (7B shape: 32 layers, Q4_0; 3.8 GB cannot
# be carried, so synth -> profile -> plan run here on the other cores) while
# the GPU tests run, each test limited to TEST_TIMEOUT s.
# (b) each step under what is left of DEADLINE (s from the start, default
# 570): reload latency (bench_reload), then hybrid decoding against CPU-only
# sparse decoding (hybrid_all below: budgets, policies, the whole model on
# the device), each run with its own link and memory ceilings; then the
# expert cache on a MoE file (moe_all).
# Each step's log lands in $OUT (the device tool brings it back; ./gpu-out
# elsewhere) as it runs, so a call cut short still returns what finished.
set -u
what=${1:-all}
out=${OUT:-gpu-out}
mkdir -p "$out"
t0=$(date +%s)
deadline=${DEADLINE:-570}
mk="make -j$(nproc) WERROR= CUDA_ARCH=-gencode=arch=compute_90,code=sm_90"
left() { echo $((deadline - ($(date +%s) - t0))); }
step() {
	local name=$1 start rc s
	shift
	s=$(left)
	if [ "$s" -lt 15 ]; then
		echo "== $name: skipped, $s s left before the deadline"
		return 124
	fi
	start=$(date +%s)
	# bash -c: a step may be one of the functions below (exported)
	timeout -k 5 "$s" bash -c '"$@"' step "$@" > "$out/$name.log" 2>&1
	rc=$?
	echo "== $name: rc $rc, $(($(date +%s) - start)) s$([ $rc = 124 ] && echo ' (deadline)')"
	tail -n "${TAIL:-15}" "$out/$name.log"
	return $rc
}
machine() {
	nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,pcie.link.gen.max,pcie.link.width.max --format=csv
	echo "kernel $(uname -r): $(case $(uname -r) in 4.4.0*) echo gVisor;; *-fc-*) echo Firecracker;; *) echo unknown runtime;; esac)"
	nvcc --version | tail -n 1
	gcc --version | head -n 1
	echo "$(nproc) CPUs, $(free -g | awk '/Mem:/ { print $2 }') GiB"
}
# 0: io_uring works; else the errno io_uring_setup gave
uring_probe() {
	cat > /tmp/uring_probe.c <<'C'
#include <errno.h>
#include <linux/io_uring.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
int main(void)
{
	struct io_uring_params p;
	long fd;

	memset(&p, 0, sizeof(p));
	fd = syscall(__NR_io_uring_setup, 4, &p);
	if (fd < 0) {
		printf("io_uring_setup: %s\n", strerror(errno));
		return errno;
	}
	printf("io_uring_setup: ok\n");
	return 0;
}
C
	gcc -o /tmp/uring_probe /tmp/uring_probe.c && /tmp/uring_probe
}
prepare() {
	TAIL=8 step machine machine
	. tests/gpu/setup.sh || exit 1
	# (into machine.log: the device tool brings back 8 files at most)
	uring_probe > /tmp/uring.log 2>&1
	rc=$?
	cat /tmp/uring.log >> "$out/machine.log"
	if [ $rc != 0 ]; then
		echo "!! $(cat /tmp/uring.log): models load through their mapping (HYB_LOAD=mmap)"
		export HYB_LOAD=mmap
	fi
	[ -x build/hyb-gpu-tests ] && [ -x build/hyb ] || step build $mk all || exit 1
}
model() {
	HYBRID_PREPARE_ONLY=1 HYBRID_LAYERS=32 bash tests/bench/hybrid.sh > "$out/model.log" 2>&1
	echo "== model: rc $?, $(($(date +%s) - t0)) s from the start" >> "$out/model.log"
	moe_model >> "$out/model.log" 2>&1
	echo "== moe model: rc $?, $(($(date +%s) - t0)) s from the start" >> "$out/model.log"
}
# the expert cache's file of tests/bench/moe_cache.sh (Mixtral's layout, 128
# experts of 768, 8 a token, 4 layers, Q4_0, 1.5 GB) and its routing profile
moe_m=models/moe/mixtral-layout-128e-4l.routing.Q4_0.gguf
moe_p=models/moe/mixtral-layout-128e-4l.routing.prof.gguf
moe_model() {
	mkdir -p models/moe
	[ -f $moe_m ] || build/hybctl synth -o $moe_m --arch llama --ffn 768 --hidden 2048 \
		--heads 32 --kv-heads 4 --layers 4 --experts 128 --experts-used 8 --vocab 32000 \
		--type Q4_0 --seed 3 > /dev/null || return 1
	[ -f $moe_p ] || build/hybctl profile $moe_m -o $moe_p > /dev/null
}
# the expert cache on the GPU (docs/MOE.md): its dev ms a token with a layer's
# experts in one launch per matrix (0.10 ms in the CPU device's model)
# experts in one launch per matrix (0.10 ms in the CPU device's model); then
# each step one device graph (--graph, KTransformers 3.3), alternated with the
# queued steps twice: the graph's gain is the launches' and host waits' time
moe_all() {
	[ -f $moe_p ] || moe_model || return 1
	build/hyb bench -m $moe_m --routing $moe_p --device cuda --gpu-budget 25% \
		--policies static,lru,tam-adaptive -n 64 -r "${REPS:-1}"
	for i in 1 2; do
		for g in "" --graph; do
			echo "== steps ${g:-queued}"
			build/hyb bench -m $moe_m --routing $moe_p --device cuda --gpu-budget 25% \
				--policies static,tam-adaptive -n 64 $g 2>&1 | grep -E "^(static|tam)"
		done
	done
}
part_test() {
	[ "$what" = all ] && { model & echo $! > /tmp/hyb_model_pid; }
	TAIL=12 step test-gpu env HYB_TEST_TIMEOUT="${TEST_TIMEOUT:-90}" $mk test-gpu
	grep -q "no CUDA device" "$out/test-gpu.log" && echo "!! test-gpu: the tests saw no CUDA device"
	grep -E "^FAIL|killed by" "$out/test-gpu.log" | head -n 20
}
hybrid() {
	build/hyb bench -m models/sparse-32-Q4_0.plan.gguf --device cuda --drift 32 -n "${HYBRID_TOKENS:-256}" -r "${REPS:-1}" "$@"
}
# one log (the device tool brings back 8 files): the goal policies at the
# benchmark's budget, the whole model on the device, every policy with room
# to move groups (HYBRID_BUDGET2, default 60%), the other policies
hybrid_all() {
	b=${HYBRID_BUDGET:-40%}
	echo "### goal policies, budget $b"
	hybrid --gpu-budget "$b" --policies layer,static,tam-adaptive
	echo "### the whole model on the device (8 GiB budget, static)"
	hybrid --gpu-budget 8G --policies static
	echo "### every policy, budget ${HYBRID_BUDGET2:-60%}"
	hybrid --gpu-budget "${HYBRID_BUDGET2:-60%}" --policies all
	echo "### the other policies, budget $b"
	hybrid --gpu-budget "$b" --policies lru,topk,dynamic,tam
}
# chunks of 1 MiB (hybd's default), then 512 and 256 KiB: with two in flight
# the link stays busy, so smaller chunks may keep the throughput and halve
# the wait a critical upload can see
reload_all() {
	for c in 1024 512 256; do
		echo "### chunk $c KiB"
		build/bench_reload --upload cuda --chunk "$c"
	done
}
part_bench() {
	if [ -f /tmp/hyb_model_pid ]; then
		while kill -0 "$(cat /tmp/hyb_model_pid)" 2>/dev/null && [ "$(left)" -gt 60 ]; do sleep 2; done
		tail -n 4 "$out/model.log"
	else
		step model model
	fi
	TAIL=40 step reload reload_all
	TAIL=100 step hybrid hybrid_all
	TAIL=20 step moe moe_all
}
export out t0 moe_m moe_p
export -f machine model moe_model moe_all hybrid hybrid_all reload_all
prepare
case $what in
test) part_test ;;
bench) part_bench ;;
all) part_test; part_bench ;;
*) echo "usage: device_run.sh test|bench|all" >&2; exit 2 ;;
esac
echo "== done in $(($(date +%s) - t0)) s"
