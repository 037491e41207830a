#!/usr/bin/env bash
# make bench: the foundation benchmarks on generated models of the 7B
# shape (hidden 4096, FFN 11008, 8 layers, 32 heads, vocabulary 32000).
# Every figure is printed next to its roofline, measured in the same run.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p models
shape="--hidden 4096 --ffn 11008 --layers 8 --heads 32 --vocab 32000 --seed 7"
for t in Q8_0 Q4_0; do
	f=models/bench-$t.gguf
	[ -f "$f" ] || { echo "generating $f"; build/hybctl synth -o "$f" $shape --type $t; }
done
if [ -x build/bench_kernels ]; then
	echo "== kernels =="
	build/bench_kernels
fi
if [ -x build/bench_queue ]; then
	echo "== reload queue (local backend) =="
	build/bench_queue
fi
if [ -x build/bench_reload ]; then
	echo "== reload service: op latency by priority =="
	build/bench_reload
	# the UPLOAD half (pool -> neuron cache) on the CPU copy device: the queue's
	# own cost over a modelled link; make bench-gpu runs it on hybd's CUDA engine
	echo "== reload service: UPLOAD latency, CPU copy device =="
	build/bench_reload --upload cpu
fi
if [ -x build/bench_load ]; then
	echo "== cold load: io_uring streaming vs fio vs read() =="
	bash tests/bench/bench_load.sh models/bench-Q4_0.gguf
fi
echo "== time to first token: hyb run, cold and warm =="
bash tests/bench/bench_ttft.sh models/bench-Q4_0.gguf models/bench-Q8_0.gguf
for t in Q8_0 Q4_0; do
	echo "== end to end: $t =="
	build/hyb bench -m models/bench-$t.gguf -p 64 -n 32 -r ${REPS:-5}
done
echo "== real models against llama.cpp (SmolLM2 in every type, Gemma 3) =="
bash tests/bench/real.sh "${REPS:-5}"
echo "== mixtures of experts on the CPU against llama.cpp =="
bash tests/bench/moe.sh "${REPS:-5}"
echo "== the expert cache: hot experts on the (CPU-executed) device, every policy =="
bash tests/bench/moe_cache.sh "${REPS:-5}"
echo "== hyb serve against llama-server: continuous batching at concurrency 1, 4, 16 =="
bash tests/bench/serve.sh
echo "== hyb serve's prefix cache against llama-server's cache_prompt =="
bash tests/bench/prefix.sh
bash tests/bench/sparse.sh
echo "== CATS activation sparsity on real weights: quality and speed =="
bash tests/bench/sparsity.sh "${REPS:-5}"
echo "== TEAL input sparsity on real weights: quality and speed =="
bash tests/bench/teal.sh "${REPS:-5}"
bash tests/bench/hybrid.sh
