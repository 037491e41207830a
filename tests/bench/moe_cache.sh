#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# The expert cache (docs/MOE.md): Qwen3-30B-A3B-shaped experts (128 per
# layer, 8 per token, 768 neurons, hidden 2048, 4 layers, Q4_0) with the
# routing design's skewed, drifting popularity (hybctl synth's default),
# profiled by hybctl profile, in two layouts: qwen3moe (attention with its
# Q/K norms) and Mixtral's llama layout, attention and head on the device in
# both. hyb bench --gpu-budget on the CPU device
# (modelled PCIe and device memory): every policy against CPU-only decoding
# in the same rounds, on the drift workload (a forced topic change every 32
# tokens).
#
#   tests/bench/moe_cache.sh [ROUNDS]     (THREADS, BUDGET, N_GEN from the environment)
set -euo pipefail
cd "$(dirname "$0")/../.."

rounds=${1:-3}
threads=${THREADS:-$(nproc)}
mkdir -p models/moe
experts="--hidden 2048 --heads 32 --kv-heads 4 --layers 4 --experts 128 --experts-used 8 \
--vocab 32000 --type Q4_0 --seed 3"
for arch in qwen3moe llama; do
	if [[ $arch == qwen3moe ]]; then
		m=models/moe/qwen3moe-30b-a3b-4l.routing.Q4_0.gguf
		shape="--arch qwen3moe --head-dim 128 --expert-ffn 768 --ffn 6144 --ctx 40960"
	else
		m=models/moe/mixtral-layout-128e-4l.routing.Q4_0.gguf
		shape="--arch llama --ffn 768"
	fi
	p=${m%.Q4_0.gguf}.prof.gguf
	[[ -f $m ]] || build/hybctl synth -o "$m" $shape $experts >/dev/null
	[[ -f $p ]] || build/hybctl profile "$m" -t "$threads" -o "$p" >/dev/null
	echo "-- $arch layout --"
	build/hyb bench -m "$m" --gpu-budget "${BUDGET:-25%}" --routing "$p" \
		--policies static,layer,lru,dynamic,tam-adaptive -n "${N_GEN:-64}" -r "$rounds" \
		-t "$threads"
done
