# Helpers the benchmarks share (sourced by bench_load.sh, bench_ttft.sh, real.sh, moe.sh).

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
