# Helpers the benchmarks share (sourced by bench_load.sh, bench_ttft.sh, real.sh, moe.sh, serve.sh,
# sparsity.sh, teal.sh).

# Drop the page cache (needs root): the next read of a file goes to the drive.
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
# The median of the numbers on stdin, one per line.
median() { sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
# fio's sequential read of FILE in GB/s: io_uring, O_DIRECT, 1 MiB blocks, depth 32.
fio_gbs() {
	fio --name=seq --filename="$1" --readonly --rw=read --ioengine=io_uring --direct=1 \
		--bs=1M --iodepth=32 --output-format=json |
		python3 -c 'import json,sys; print(json.load(sys.stdin)["jobs"][0]["read"]["bw_bytes"] / 1e9)'
}

# --- against llama.cpp (real.sh, moe.sh): rounds, threads, np, ng set by the caller ---

# $speed: llama.cpp's llama_speed (tests/oracle/llama-ref.sh builds it); when it
# cannot be built, says why as SCRIPT and ends the caller (exit 0: no figures).
need_llama_speed() {
	local ref
	if ! ref=$(bash tests/oracle/llama-ref.sh 2>/tmp/hyb-llama-ref.log); then
		echo "$1: llama.cpp could not be built (tail of /tmp/hyb-llama-ref.log):"
		tail -n 3 /tmp/hyb-llama-ref.log
		exit 0
	fi
	speed=$(dirname "$ref")/llama_speed
}

# MODEL in $rounds rounds alternating `hyb bench` and llama_speed (same threads,
# prompt and decode lengths): medians in HP HT (hyb) LP LT (llama.cpp), hyb's
# decode roofline in ROOF, each round's hyb bench output in HYB_OUT[].
alternate() {
	local m=$1 r out p t hp=() ht=() lp=() lt=()
	HYB_OUT=()
	for ((r = 0; r < rounds; r++)); do
		out=$(build/hyb bench -m "$m" -p "$np" -n "$ng" -r 1 -t "$threads" 2>/dev/null)
		HYB_OUT+=("$out")
		hp+=("$(awk '/^prefill/ {print $2}' <<<"$out")")
		ht+=("$(awk '/^decode/ {print $2}' <<<"$out")")
		ROOF=$(awk '/^decode/ {for (i = 1; i <= NF; i++) if ($i == "roofline") print $(i + 1)}' <<<"$out")
		read -r _ p _ t < <("$speed" "$m" "$threads" "$np" "$ng" 1)
		lp+=("$p")
		lt+=("$t")
	done
	HP=$(printf '%s\n' "${hp[@]}" | median)
	HT=$(printf '%s\n' "${ht[@]}" | median)
	LP=$(printf '%s\n' "${lp[@]}" | median)
	LT=$(printf '%s\n' "${lt[@]}" | median)
}

# a / b
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {print a / b}'; }

# --- activation sparsity (sparsity.sh, teal.sh): hyb, text, threads and kind
# (--cats or --teal) set by the caller ---

# The real models, the held-out text and SmolLM2 in F16 and Q8_0: smol, gemma,
# f16, q8 (sets them; says why and ends the caller with 0 when they cannot be had).
sparse_models() { # SCRIPT
	smol=$(bash tests/data/fetch-models.sh smollm2) || { echo "$1: models unavailable"; exit 0; }
	gemma=$(bash tests/data/fetch-models.sh gemma3) || { echo "$1: models unavailable"; exit 0; }
	[[ -r $text ]] || { echo "$1: $text (base-files) is missing"; exit 0; }
	bash tests/oracle/venv.sh >/dev/null 2>&1 || true
	local t d
	for t in F16 Q8_0; do
		d=models/derived/SmolLM2-135M-Instruct.$t.gguf
		if [[ ! -f $d && -x .venv/bin/python ]]; then
			mkdir -p models/derived
			.venv/bin/python tests/oracle/requant.py "$smol" "$d.tmp" "$t" && mv "$d.tmp" "$d"
		fi
	done
	f16=models/derived/SmolLM2-135M-Instruct.F16.gguf
	q8=models/derived/SmolLM2-135M-Instruct.Q8_0.gguf
}

sparse_prompts=("The history of the Roman Empire spans" "def quicksort(arr):"
		"The three most important inventions of the twentieth century are")
# The flags for PROFILE at SPARSITY (none at 0: the dense model).
sparse_args() { [[ $2 == 0 ]] || echo "$kind $1 --sparsity $2"; }
# MODEL's perplexity on $text (-c 512) with PROFILE's thresholds at SPARSITY.
sparse_ppl() { # MODEL PROFILE SPARSITY
	# shellcheck disable=SC2046
	$hyb perplexity -m "$1" -f "$text" -c 512 -t "$threads" $(sparse_args "$2" "$3") \
		2>/dev/null | sed -n 's/^Final estimate: PPL = \([0-9.]*\).*/\1/p'
}
sparse_ids() { # MODEL PROFILE SPARSITY PROMPT
	# shellcheck disable=SC2046
	$hyb run -m "$1" -p "$4" -n 64 -t "$threads" $(sparse_args "$2" "$3") --print-ids \
		2>&1 >/dev/null | sed -n 's/^ids://p'
}
# Tokens equal to dense decoding's before the first difference, summed over the prompts, of 64 each.
sparse_agree() { # MODEL PROFILE SPARSITY
	local total=0 p a b
	for p in "${sparse_prompts[@]}"; do
		a=$(sparse_ids "$1" "$2" 0 "$p")
		b=$(sparse_ids "$1" "$2" "$3" "$p")
		total=$((total + $(python3 -c 'import sys
a, b = sys.argv[1].split(), sys.argv[2].split()
n = 0
while n < min(len(a), len(b)) and a[n] == b[n]: n += 1
print(n)' "$a" "$b")))
	done
	echo "$total/$((64 * ${#sparse_prompts[@]}))"
}
# The table of perplexity and greedy agreement at each SPARSITY; SPARSE_BEST: the
# largest whose perplexity is within 2% of dense.
sparse_quality() { # MODEL PROFILE SPARSITY...
	local model=$1 prof=$2 dense s p r a
	shift 2
	dense=$(sparse_ppl "$model" "$prof" 0)
	SPARSE_BEST=0
	printf "%-34s sparsity  PPL       vs dense  greedy agreement (tokens before the first difference)\n" \
		"$(basename "$model" .gguf)"
	for s in 0 "$@"; do
		p=$([[ $s == 0 ]] && echo "$dense" || sparse_ppl "$model" "$prof" "$s")
		r=$(python3 -c "print(f'{$p / $dense:.4f}')")
		a=$([[ $s == 0 ]] && echo "-" || sparse_agree "$model" "$prof" "$s")
		printf "%-34s %-9s %-9s %-9s %s\n" "" "$s" "$p" "${r}x" "$a"
		if python3 -c "import sys; sys.exit(0 if $p <= 1.02 * $dense else 1)"; then
			SPARSE_BEST=$s
		fi
	done
	echo "$(basename "$model" .gguf): largest sparsity with perplexity within 2% of dense: $SPARSE_BEST"
}
