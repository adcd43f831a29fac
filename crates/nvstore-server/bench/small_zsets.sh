#!/usr/bin/env bash
# Many small sorted sets through redis-benchmark: nvstore serve with the
# compact layout (default limits), nvstore serve with every sorted set one
# key pair per member (--zset-max-listpack-entries 0, the layout before
# small sorted sets existed), and redis-server (AOF on, appendfsync always,
# files on /dev/shm), all up at once and measured in turns.
# usage: small_zsets.sh [path/to/nvstore] [requests] [rounds]
#   (default: target/release/nvstore, 200000, 3). Keys zs:0..19999, so a
#   set gets about requests/20000 members: ZADD, then ZSCORE, ZRANGE 0 -1
#   WITHSCORES and ZRANK on the sets it built, -c 16.
# Prints one markdown table: requests/s per server and round, and ratios of
# the medians.
set -euo pipefail
bin=${1:-target/release/nvstore}
n=${2:-200000}
rounds=${3:-3}
dir=$(mktemp -d /dev/shm/small-zsets.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$dir"; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

small=$(free_port)
"$bin" serve --pool "$dir/small.nvs" --port "$small" 2>"$dir/small.log" &
pids+=($!)
large=$(free_port)
"$bin" serve --pool "$dir/large.nvs" --port "$large" --zset-max-listpack-entries 0 2>"$dir/large.log" &
pids+=($!)
rp=$(free_port)
redis-server --port "$rp" --bind 127.0.0.1 --dir "$dir" --save '' --appendonly yes --appendfsync always \
  --daemonize no >"$dir/redis.log" 2>&1 &
pids+=($!)
for p in "$small" "$large" "$rp"; do
  for _ in $(seq 100); do redis-cli -p "$p" ping >/dev/null 2>&1 && break; sleep 0.1; done
done

rps() { # port requests command... -> requests per second
  local p=$1 m=$2
  shift 2
  redis-benchmark -p "$p" -n "$m" -c 16 -r 20000 --csv "$@" 2>/dev/null |
    python3 -c 'import csv,sys; print(list(csv.reader(sys.stdin))[1][1])'
}

declare -A res
ops=(zadd zscore zrange zrank)
for r in $(seq "$rounds"); do
  for s in small large redis; do
    case $s in small) p=$small ;; large) p=$large ;; redis) p=$rp ;; esac
    # The first round's ZADDs build the sets the reads use; later rounds add to them.
    res[$s,zadd,$r]=$(rps "$p" "$n" zadd zs:__rand_int__ __rand_int__ m:__rand_int__)
    res[$s,zscore,$r]=$(rps "$p" "$n" zscore zs:__rand_int__ m:__rand_int__)
    res[$s,zrange,$r]=$(rps "$p" "$n" zrange zs:__rand_int__ 0 -1 withscores)
    res[$s,zrank,$r]=$(rps "$p" "$n" zrank zs:__rand_int__ m:__rand_int__)
  done
done

echo "| command | compact (req/s, per round) | one key pair per member | redis | compact / pairs | compact / redis |"
echo "|---|---|---|---|---|---|"
for o in "${ops[@]}"; do
  a=() b=() c=()
  for r in $(seq "$rounds"); do
    a+=("${res[small,$o,$r]}") b+=("${res[large,$o,$r]}") c+=("${res[redis,$o,$r]}")
  done
  python3 -c "
import statistics as st
a=[float(x) for x in '${a[*]}'.split()]; b=[float(x) for x in '${b[*]}'.split()]; c=[float(x) for x in '${c[*]}'.split()]
f=lambda v: ' / '.join(f'{x:,.0f}' for x in v)
print(f'| $o | {f(a)} | {f(b)} | {f(c)} | {st.median(a)/st.median(b):.2f}x | {st.median(a)/st.median(c):.2f}x |')"
done
redis-cli -p "$small" info nvstore | grep -E '^tree_keys' | sed 's/^/compact: /' || true
redis-cli -p "$large" info nvstore | grep -E '^tree_keys' | sed 's/^/pairs: /' || true
