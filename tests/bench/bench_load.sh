#!/usr/bin/env bash
# Cold-load throughput of the io_uring streaming engine:
# the engine, fio (sequential read, io_uring, O_DIRECT, 1 MiB blocks, depth 32)
# and a plain read() loop into the same pool memory, on the same file, in the
# same run, the page cache dropped before every run; medians of $REPS (3).
# Also the engine where io_uring is refused (its pread threads,
# HYB_STREAM_NO_URING), the fallback a container without io_uring gets.
# Targets: engine >= 90% of fio and >= 2x read().
set -euo pipefail
cd "$(dirname "$0")/../.."
file=${1:-models/bench-Q4_0.gguf}
reps=${REPS:-3}
bin=${BUILD:-build}/bench_load

source tests/bench/common.sh
if ! drop 2>/dev/null; then
	echo "bench_load: cannot drop the page cache (needs root): cold-load figures skipped"
	exit 0
fi

have_fio=1
command -v fio >/dev/null || { have_fio=0; echo "bench_load: fio not installed (apt-get install fio): no fio figure"; }
e=() r=() f=() p=()
for ((i = 0; i < reps; i++)); do
	if ((have_fio)); then drop; f+=("$(fio_gbs "$file")"); fi
	drop; e+=("$("$bin" engine "$file" | awk '{print $2}')")
	drop; r+=("$("$bin" read "$file" | awk '{print $2}')")
	drop; p+=("$(HYB_STREAM_NO_URING=1 "$bin" engine "$file" 2>/dev/null | awk '{print $2}')")
done
E=$(printf '%s\n' "${e[@]}" | median)
R=$(printf '%s\n' "${r[@]}" | median)
P=$(printf '%s\n' "${p[@]}" | median)
echo "cold load of $file ($(stat -c %s "$file") bytes), medians of $reps:"
echo "  engine  $E GB/s   (runs: ${e[*]})"
echo "  read()  $R GB/s   (runs: ${r[*]})"
awk -v e="$E" -v r="$R" 'BEGIN {printf "  engine / read() = %.2fx (target >= 2x)\n", e / r}'
echo "  engine without io_uring (pread threads)  $P GB/s   (runs: ${p[*]})"
awk -v e="$E" -v p="$P" 'BEGIN {printf "  pread threads / engine = %.2fx\n", p / e}'
if ((have_fio)); then
	F=$(printf '%s\n' "${f[@]}" | median)
	echo "  fio     $F GB/s   (runs: ${f[*]})"
	awk -v e="$E" -v f="$F" 'BEGIN {printf "  engine / fio = %.0f%% (target >= 90%%)\n", 100 * e / f}'
fi
