#!/usr/bin/env bash
# Hybrid GPU-CPU decoding: every balancer policy on the drift
# workload, GPU budgets of HYBRID_BUDGET (default "40% 60%") of the model, in the
# same rounds as CPU-only sparse decoding of the same plan.
#   make bench      runs it on the CPU-executed device (modelled PCIe and
#                   device memory; HYBRID_LAYERS default 8)
#   make bench-gpu  runs it with --device cuda on the 7B shape (32 layers)
# Models come from tests/bench/sparse.sh's pipeline (synth -> profile -> plan).
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p models
device=${HYBRID_DEVICE:-cpu}
layers=${HYBRID_LAYERS:-8}
t=${HYBRID_TYPE:-Q4_0}
shape="--hidden 4096 --ffn 11008 --layers $layers --heads 32 --vocab 32000 --seed 7"
f=models/sparse-$layers-$t.gguf
[ -f "$f" ] || build/hybctl synth -o "$f" $shape --act relu --type "$t"
[ -f "${f%.gguf}.profile.gguf" ] || build/hybctl profile "$f" -o "${f%.gguf}.profile.gguf"
[ -f "${f%.gguf}.plan.gguf" ] || build/hybctl plan "$f" --profile "${f%.gguf}.profile.gguf" \
	--gpu-budget 8G -o "${f%.gguf}.plan.gguf"
# HYBRID_PREPARE_ONLY=1: the model and its plan, no benchmark (a GPU session
# makes them while its GPU tests run: tests/gpu/device_run.sh)
[ "${HYBRID_PREPARE_ONLY:-0}" = 1 ] && exit 0
# 40% is the benchmark's budget; at the 7B shape the attention blocks, head and
# predictors (placed first) take nearly all of it, so 60% shows the policies
# with room to move neuron groups.
for budget in ${HYBRID_BUDGET:-40% 60%}; do
	echo "== hybrid decode: $t, $layers layers, device $device, budget $budget =="
	build/hyb bench -m "${f%.gguf}.plan.gguf" --gpu-budget "$budget" \
		--device "$device" --policies all --drift "${HYBRID_DRIFT:-32}" \
		-n "${HYBRID_TOKENS:-256}" -r "${REPS:-3}" ${HYBRID_PCIE:+--pcie-gbps $HYBRID_PCIE}
done

# Time to first token of a 512-token prompt (docs/HYBRID.md "Prompts"):
# batches on the device, the FFN groups it does not cache streamed through
# it, against CPU-only prefill of the same plan in the same rounds (the
# baseline), --prefill-cpu (prompts on the CPU, attention and head placed for
# decoding) and the whole model on the device (100%).
echo "== time to first token: a ${HYBRID_PROMPT:-512}-token prompt, device $device =="
np=${HYBRID_PROMPT:-512}
for run in "40%" "40% --prefill-cpu" "60%" "100%"; do
	build/hyb bench -m "${f%.gguf}.plan.gguf" --gpu-budget $run --device "$device" \
		--policies static,layer -p "$np" -n 16 -r "${TTFT_REPS:-2}" \
		${HYBRID_PCIE:+--pcie-gbps $HYBRID_PCIE} |
	awk -v run="$run" -v np="$np" '
		/^baseline/ { for (i = 1; i < NF; i++) if ($i == "prompt") cpu = $(i + 1) }
		/^(static|layer) / && $4 > 0 {
			printf "%-20s %-7s TTFT %9.1f ms   CPU-only %9.1f ms   %7.1fx\n",
			       run, $1, 1000 * np / $4, 1000 * np / cpu, $4 / cpu
		}'
done
