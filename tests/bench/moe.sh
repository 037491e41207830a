#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# Mixture-of-experts models on the CPU against llama.cpp (the llama-cpp-python
# 0.3.36 llama.cpp the exactness goldens come from; docs/MOE.md): a file of
# Qwen3-30B-A3B's shape (2048 wide, 32/4 heads of 128, 128 experts of 768,
# 8 per token) with 8 of its 48 layers and a 32000-token vocabulary, in Q8_0
# and Q4_0, DeepSeek-V2-Lite's (2048 wide, 16 heads of latent attention with
# a 512-dim cache row, one dense layer, 64 experts of 1408, 6 per token, 2
# shared) with 8 of its 27 layers in Q4_0 (and V2's q bottleneck of 1536:
# llama.cpp takes a file without one only at V2-Lite's 26 or 27 layers), and Mixtral 8x7B's layer shape
# (4096 wide, 8 experts of 14336, 2 per token) with 2 layers, and gpt-oss-20b's
# (below) with 4 of its 24 layers in MXFP4. Routing is
# synth's plain random (--routing random): speed does not depend on it, and
# the figures stay comparable from run to run. Per model, ROUNDS rounds alternate `hyb bench`
# and llama_speed (same threads, prompt and decode lengths); medians, their
# ratio, hyb's DRAM roofline for decode and the routed experts' share of it.
#
#   tests/bench/moe.sh [ROUNDS]     (THREADS, N_PROMPT, N_GEN from the environment)
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/bench/common.sh

rounds=${1:-5}
threads=${THREADS:-$(nproc)}
np=${N_PROMPT:-128}
ng=${N_GEN:-64}

need_llama_speed moe.sh
mkdir -p models/moe
qwen3="--arch qwen3moe --hidden 2048 --heads 32 --kv-heads 4 --head-dim 128 --layers 8 \
--experts 128 --experts-used 8 --expert-ffn 768 --ffn 6144 --vocab 32000 --ctx 40960"
dsv2lite="--arch deepseek2 --hidden 2048 --heads 16 --head-dim 192 --mla-rope 64 --kv-lora 512 \
--q-lora 1536 \
--layers 8 --dense-lead 1 --ffn 10944 --experts 64 --experts-used 6 --expert-ffn 1408 \
--shared-experts 2 --vocab 32000 --ctx 32768"
mixtral="--hidden 4096 --heads 32 --kv-heads 8 --layers 2 --experts 8 --experts-used 2 \
--ffn 14336 --vocab 32000"
# gpt-oss-20b's layer (2880 wide, 64 heads of 64, 32 experts of 2880, 4 per token,
# windows of 128 on every other layer) with 4 of its 24 layers; MXFP4 throughout
# as its experts are (its attention is BF16 in the released files), a Q8_0 head
gptoss="--arch gpt-oss --hidden 2880 --ffn 2880 --expert-ffn 2880 --heads 64 --kv-heads 8 \
--head-dim 64 --layers 4 --experts 32 --experts-used 4 --swa 128 --vocab 32000 \
--output-type Q8_0"
models=()
for t in Q8_0 Q4_0; do
	f=models/moe/qwen3moe-30b-a3b-8l.$t.gguf
	[[ -f $f ]] || build/hybctl synth -o "$f" $qwen3 --type "$t" --seed 3 --routing random \
		>/dev/null
	models+=("$f")
done
f=models/moe/deepseek-v2-lite-8l.Q4_0.gguf
[[ -f $f ]] || build/hybctl synth -o "$f" $dsv2lite --type Q4_0 --seed 3 >/dev/null
models+=("$f")
f=models/moe/mixtral-8x7b-2l.Q4_0.gguf
[[ -f $f ]] || build/hybctl synth -o "$f" $mixtral --type Q4_0 --seed 3 --routing random >/dev/null
models+=("$f")
f=models/moe/gpt-oss-20b-4l.MXFP4.gguf
[[ -f $f ]] || build/hybctl synth -o "$f" $gptoss --type MXFP4 --seed 3 --routing random >/dev/null
models+=("$f")

printf '%-28s %8s %8s %6s   %8s %8s %6s %8s %8s\n' model "hyb pp" "llama pp" ratio "hyb tg" \
	"llama tg" ratio roofline experts
for m in "${models[@]}"; do
	alternate "$m"
	# the routed experts' decode read rate, % of DRAM (hyb bench's experts line)
	EX=$(for out in "${HYB_OUT[@]}"; do
		awk '/routed experts read at/ {sub("%", "", $8); print $8}' <<<"$out"
	done | median)
	printf '%-28s %8.1f %8.1f %5.2fx   %8.1f %8.1f %5.2fx %8.1f %7.0f%%\n' \
		"$(basename "$m" .gguf)" "$HP" "$LP" "$(ratio "$HP" "$LP")" "$HT" "$LT" \
		"$(ratio "$HT" "$LT")" "$ROOF" "$EX"
done
echo "(tokens/s; pp: a $np-token prompt in one batch, tg: $ng decode steps; $threads threads;"
echo " medians of $rounds alternating rounds; roofline: hyb's bytes per token at its measured"
echo " DRAM read; experts: the routed experts' read rate in decode as a share of it)"
