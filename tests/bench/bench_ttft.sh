#!/usr/bin/env bash
# Time to first token: `hyb run` from the start of
# its work to the first generated token on stdout, cold (page cache dropped
# before the run) and warm (the file in the page cache), on the given models
# (make bench: the 1.1 GB Q4_0 and 2.0 GB Q8_0 bench models). Three ways, in
# the same rounds: hyb as it runs by default (the prompt computes each layer
# as soon as its weights are in, model_stream.c; a file wholly in the page
# cache loads whole first, so warm it matches --load-first), --load-first
# (every weight read before the prompt starts: the way hyb loaded before) and
# HYB_LOAD=mmap (computing on the file mapping, llama.cpp's default). Medians
# of $REPS (6).
#
# The floor it is held against: the file read at the drive's speed (fio, or
# the engine's own cold rate when fio is missing) and the prompt computed on
# weights already in memory (the warm run's prompt time); loading and the
# prompt overlap, so the floor is the larger of the two, not their sum.
set -euo pipefail
cd "$(dirname "$0")/../.."
reps=${REPS:-6}
bin=${BUILD:-build}
prompt=${TTFT_PROMPT:-"The history of the region begins with the first farmers who settled along the river valley, where the soil was rich and the water plentiful. Over the centuries small villages grew into market towns, and the towns"}

source tests/bench/common.sh
if ! drop 2>/dev/null; then
	echo "bench_ttft: cannot drop the page cache (needs root): cold figures skipped"
	exit 0
fi
# one run, cold or warm: "ttft load prompt n_prompt"
one() {
	local t=$1 mode=$2
	if [ "$t" = cold ]; then drop; else cat "$file" >/dev/null; fi
	case $mode in
	stream) set -- ;;
	load-first) set -- --load-first ;;
	mmap) set -- ;;
	esac
	HYB_LOAD=$([ "$mode" = mmap ] && echo mmap || echo hugepage) \
		"$bin/hyb" run -m "$file" -p "$prompt" -n 2 "$@" 2>&1 >/dev/null |
		awk '/^prompt:/ {n = $2} /^first token:/ {gsub(/[(),]/, ""); print $3, $6, $12, n}'
}
field() { awk -v k="$1" '{print $k}'; }

for file in "$@"; do
	[ -f "$file" ] || { echo "bench_ttft: $file: no such model"; continue; }
	size=$(stat -c %s "$file")
	declare -A R=()
	for ((i = 0; i < reps; i++)); do
		# round i runs the ways in the i-th of their 6 orders, so each follows
		# each other equally often: what a run inherits from the one before
		# (memory just freed or given back to a VM's host, a warmer drive) is
		# shared out evenly. REPS=6 covers every order once.
		perms=("stream load-first mmap" "mmap load-first stream" "load-first mmap stream"
		       "stream mmap load-first" "mmap stream load-first" "load-first stream mmap")
		read -ra modes <<< "${perms[i % 6]}"
		for t in cold warm; do
			for mode in "${modes[@]}"; do
				R[$mode.$t]+="$(one $t $mode)"$'\n'
			done
		done
	done
	if command -v fio >/dev/null; then
		drop
		io=$(fio_gbs "$file")
		io_src=fio
	else
		drop
		io=$("$bin/bench_load" engine "$file" | awk '{print $2}')
		io_src="the engine (no fio)"
	fi
	n_prompt=$(printf '%s' "${R[stream.warm]}" | head -1 | field 4)
	echo "time to first token of $file ($size bytes, $n_prompt prompt tokens), medians of $reps:"
	printf '  %-22s %8s %8s %8s\n' "" "first" "load" "prompt"
	for k in {stream,load-first,mmap}.{cold,warm}; do
		printf '  %-22s' "$k"
		for f in 1 2 3; do
			printf ' %7.3fs' "$(printf '%s' "${R[$k]}" | field $f | median)"
		done
		printf '   (first: %s)\n' "$(printf '%s' "${R[$k]}" | field 1 | tr '\n' ' ')"
	done
	for t in cold warm; do
		h=$(printf '%s' "${R[stream.$t]}" | field 1 | median)
		l=$(printf '%s' "${R[load-first.$t]}" | field 1 | median)
		m=$(printf '%s' "${R[mmap.$t]}" | field 1 | median)
		awk -v h="$h" -v l="$l" -v m="$m" -v t="$t" 'BEGIN {
			printf "  %s: hyb %.3f s; --load-first %.3f s (%.2fx), HYB_LOAD=mmap %.3f s (%.2fx)\n",
				t, h, l, l / h, m, m / h }'
	done
	p=$(printf '%s' "${R[load-first.warm]}" | field 3 | median)
	h=$(printf '%s' "${R[stream.cold]}" | field 1 | median)
	awk -v s="$size" -v io="$io" -v p="$p" -v h="$h" -v src="$io_src" 'BEGIN {
		r = s / io / 1e9; f = r > p ? r : p
		printf "  floor (cold): read %.3f s at %.2f GB/s (%s), prompt %.3f s in memory:", r, io, src, p
		printf " max %.3f s, sum %.3f s; hyb cold is %.2fx the floor\n", f, r + p, h / f
	}'
	unset R
done
