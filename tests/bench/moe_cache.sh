#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# The expert cache (docs/MOE.md): a Qwen3-30B-A3B-shaped MoE (4 layers, 128
# experts, 8 per token, Q4_0) with the routing design's skewed, drifting
# popularity (hybctl synth's default), profiled by hybctl profile; then
# hyb bench --gpu-budget on the CPU device (modelled PCIe and device memory):
# every policy against CPU-only decoding in the same rounds, on the drift
# workload (a forced topic change every 32 tokens).
#
#   tests/bench/moe_cache.sh [ROUNDS]     (THREADS, BUDGET, N_GEN from the environment)
set -euo pipefail
cd "$(dirname "$0")/../.."

rounds=${1:-3}
threads=${THREADS:-$(nproc)}
mkdir -p models/moe
m=models/moe/qwen3moe-30b-a3b-4l.routing.Q4_0.gguf
p=models/moe/qwen3moe-30b-a3b-4l.routing.prof.gguf
[[ -f $m ]] || build/hybctl synth -o "$m" --arch qwen3moe --hidden 2048 --heads 32 --kv-heads 4 \
	--head-dim 128 --layers 4 --experts 128 --experts-used 8 --expert-ffn 768 --ffn 6144 \
	--vocab 32000 --ctx 40960 --type Q4_0 --seed 3 >/dev/null
[[ -f $p ]] || build/hybctl profile "$m" -t "$threads" -o "$p" >/dev/null
build/hyb bench -m "$m" --gpu-budget "${BUDGET:-25%}" --routing "$p" \
	--policies static,layer,lru,dynamic,tam-adaptive -n "${N_GEN:-64}" -r "$rounds" -t "$threads"
