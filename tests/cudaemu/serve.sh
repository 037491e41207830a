#!/usr/bin/env bash
# hyb serve (build/cudaemu/hyb) on DEVICE: two greedy completions at once,
# batched, into OUT/DEVICE-1.json and OUT/DEVICE-2.json; then SIGTERM, and
# the server's exit status. Usage: serve.sh MODEL DEVICE OUT
set -u
model=$1 dev=$2 out=$3
log=$out/serve-$dev.log
build/cudaemu/hyb serve -m "$model" --port 0 --gpu-budget 70% --device "$dev" --parallel 2 \
	> "$log" 2>&1 &
pid=$!
port=
for _ in $(seq 600); do
	port=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$log")
	[ -n "$port" ] && break
	kill -0 $pid 2>/dev/null || break
	sleep 0.1
done
if [ -z "$port" ]; then
	echo "serve.sh: no port in $log" >&2
	cat "$log" >&2
	kill $pid 2>/dev/null
	exit 3
fi
body='{"prompt":"Once upon a time","max_tokens":4,"temperature":0}'
curl -s --max-time 300 "http://127.0.0.1:$port/v1/completions" \
	-H 'Content-Type: application/json' -d "$body" > "$out/$dev-1.json" & c1=$!
curl -s --max-time 300 "http://127.0.0.1:$port/v1/completions" \
	-H 'Content-Type: application/json' -d "$body" > "$out/$dev-2.json" & c2=$!
wait $c1 && wait $c2 || { kill $pid; exit 4; }
kill -TERM $pid
wait $pid
