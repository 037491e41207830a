# Helpers the load benchmarks share (sourced by bench_load.sh, bench_ttft.sh).

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
