#!/usr/bin/env bash
# nvstore serve against redis-server (AOF on, appendfsync always, files on
# /dev/shm) under the same redis-benchmark runs from the same client.
# usage: serve_vs_redis.sh [path/to/nvstore] [requests] [serve args...]
#   (default: target/release/nvstore, 200000). Runs
#   redis-benchmark -t set,get,incr,hset,zadd,mset -n REQUESTS -c 16, then
#   redis-benchmark -t set,get -P 16 -n 5*REQUESTS -c 16, against each server.
# Prints one markdown table: requests/s and p99 per test, and nvstore/redis ratios.
set -euo pipefail
bin=${1:-target/release/nvstore}
n=${2:-200000}
shift $(( $# < 2 ? $# : 2 ))
dir=$(mktemp -d /dev/shm/serve-vs-redis.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$dir"; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

np=$(free_port)
"$bin" serve --pool "$dir/nv.nvs" --port "$np" "$@" 2>"$dir/nv.log" &
pids+=($!)
rp=$(free_port)
redis-server --port "$rp" --bind 127.0.0.1 --dir "$dir" --save '' --appendonly yes --appendfsync always \
  --daemonize no >"$dir/redis.log" 2>&1 &
pids+=($!)
for p in "$np" "$rp"; do
  for _ in $(seq 100); do redis-cli -p "$p" ping >/dev/null 2>&1 && break; sleep 0.1; done
done

run() { # port pipeline tests requests -> csv lines "test,rps,p99"
  redis-benchmark -p "$1" -t "$3" -n "$4" -c 16 -P "$2" --csv 2>/dev/null |
    python3 -c '
import csv, sys
rows = list(csv.reader(sys.stdin))
for r in rows[1:]:
    print(f"{r[0]},{r[1]},{r[6]}")'
}

echo "| test | pipeline | nvstore req/s | redis req/s | ratio | nvstore p99 ms | redis p99 ms | p99 ratio |"
echo "|---|---|---|---|---|---|---|---|"
for pl in 1 16; do
  # Interleaved: nvstore, redis, per pipeline depth.
  if [ "$pl" = 1 ]; then tests=set,get,incr,hset,zadd,mset; m=$n; else tests=set,get; m=$((5 * n)); fi
  nv=$(run "$np" "$pl" "$tests" "$m")
  rd=$(run "$rp" "$pl" "$tests" "$m")
  paste -d, <(echo "$nv") <(echo "$rd") | while IFS=, read -r t a ap99 _t2 b bp99; do
    python3 -c "
t,a,ap,b,bp='$t',float('$a'),float('$ap99'),float('$b'),float('$bp99')
print(f'| {t} | {$pl} | {a:,.0f} | {b:,.0f} | {a/b:.2f}x | {ap:.3f} | {bp:.3f} | {ap/bp:.2f}x |')"
  done
done
