#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# Real models against llama.cpp (the llama-cpp-python 0.3.36 llama.cpp that
# the exactness goldens come from, built by tests/oracle/llama-ref.sh):
# SmolLM2-135M-Instruct as shipped (Q4_1) and in every type the tests derive,
# Gemma 3 270M, and synthetic models of the remaining types. Per model, ROUNDS rounds alternate `hyb bench` and
# llama_speed (same threads, same prompt and decode lengths); medians and
# their ratio, with hyb's DRAM roofline for decode.
#
#   tests/bench/real.sh [ROUNDS]     (THREADS, N_PROMPT, N_GEN from the environment;
#                                     ONLY=REGEX keeps the models whose path matches)
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/bench/common.sh

rounds=${1:-5}
threads=${THREADS:-$(nproc)}
np=${N_PROMPT:-128}
ng=${N_GEN:-64}

need_llama_speed real.sh
smol=$(bash tests/data/fetch-models.sh smollm2) || { echo "real.sh: models unavailable"; exit 0; }
gemma=$(bash tests/data/fetch-models.sh gemma3) || { echo "real.sh: models unavailable"; exit 0; }
bash tests/oracle/venv.sh >/dev/null 2>&1 || true
models=("$smol")
for t in F16 Q8_0 Q4_0 Q5_0 Q5_1; do
	d=models/derived/SmolLM2-135M-Instruct.$t.gguf
	if [[ ! -f $d && -x .venv/bin/python ]]; then
		mkdir -p models/derived
		.venv/bin/python tests/oracle/requant.py "$smol" "$d.tmp" "$t" && mv "$d.tmp" "$d"
	fi
	[[ -f $d ]] && models+=("$d")
done
models+=("$gemma")
# The types no registry file or gguf-package derivation gives here (the
# K-quants need rows of 256: SmolLM2's 576 is not): synthetic models of a
# small real shape (768 wide, 12 layers, GQA 12/4, FFN 2048, 32000 tokens).
# Speed does not depend on the weights' values.
for t in IQ4_NL Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_XS; do
	d=models/derived/synth-768x12.$t.gguf
	[[ -f $d ]] || build/hybctl synth -o "$d" --hidden 768 --ffn 2048 --layers 12 --heads 12 \
		--kv-heads 4 --vocab 32000 --type "$t" --seed 3 >/dev/null
	models+=("$d")
done
[[ -n ${ONLY:-} ]] && mapfile -t models < <(printf '%s\n' "${models[@]}" | grep -E "$ONLY")

printf '%-40s %9s %9s %6s   %9s %9s %6s %9s\n' model "hyb pp" "llama pp" ratio "hyb tg" \
	"llama tg" ratio roofline
for m in "${models[@]}"; do
	alternate "$m"
	printf '%-40s %9.1f %9.1f %5.2fx   %9.1f %9.1f %5.2fx %9.1f\n' "$(basename "$m" .gguf)" \
		"$HP" "$LP" "$(ratio "$HP" "$LP")" "$HT" "$LT" "$(ratio "$HT" "$LT")" "$ROOF"
done
echo "(tokens/s; pp: a $np-token prompt in one batch, tg: $ng decode steps; $threads threads;"
echo " medians of $rounds alternating rounds; roofline: hyb's bytes per token at its measured DRAM read)"
