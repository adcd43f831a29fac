#!/usr/bin/env bash
# YCSB through `nvstore serve` against redis-server (appendonly yes,
# appendfsync always, files on /dev/shm), same client, alternated per
# workload: nvstore first, then redis, each on a fresh pool / empty AOF.
# usage: ycsb_vs_redis.sh [path/to/nvstore] [workloads] [rounds] [serve args...]
#   (defaults: target/release/nvstore, "a b c d f", 1). Environment:
#   RECORDS (100000), OPS (200000), THREADS (16), NICE (19: every server and
#   client runs under `nice -n $NICE`, so both sides get the same priority).
# Per workload and server it prints ops/s of the run phase and the server's
# CPU per command over both phases (load and run): task-clock and context
# switches from `perf stat -p` (if perf works), user and system time from
# /proc/PID/stat, commands from INFO's total_commands_processed.
set -euo pipefail
bin=${1:-target/release/nvstore}
workloads=${2:-a b c d f}
rounds=${3:-1}
shift $(($# < 3 ? $# : 3))
records=${RECORDS:-100000}
ops=${OPS:-200000}
threads=${THREADS:-16}
nice=${NICE:-19}
dir=$(mktemp -d /dev/shm/ycsb-vs-redis.XXXXXX)
np=6390
rp=6391
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
tck=$(getconf CLK_TCK)

wait_port() { for _ in $(seq 200); do redis-cli -p "$1" ping >/dev/null 2>&1 && return; sleep 0.05; done; echo "port $1 never answered" >&2; exit 1; }
cpu_ticks() { awk '{print $14, $15}' "/proc/$1/stat"; } # utime stime

# measure NAME PORT: bench against the server $pid listens on; prints a row.
measure() {
  local name=$1 port=$2
  local perf_out="$dir/perf.$name" perfpid= t0 t1
  t0=$(cpu_ticks "$pid")
  if perf stat -e task-clock,context-switches -x, -o "$perf_out" -p "$pid" 2>/dev/null & then
    perfpid=$!
  fi
  local json
  json=$(nice -n "$nice" "$bin" bench ycsb --workload "$w" --records "$records" --ops "$ops" \
    --threads "$threads" --target "resp://127.0.0.1:$port" --json)
  t1=$(cpu_ticks "$pid")
  local cmds
  cmds=$(redis-cli -p "$port" info stats | tr -d '\r' | awk -F: '/^total_commands_processed/{print $2}')
  if [ -n "$perfpid" ]; then kill -INT "$perfpid" 2>/dev/null || true; wait "$perfpid" 2>/dev/null || true; fi
  python3 - "$name" "$w" "$json" "$t0" "$t1" "$cmds" "$tck" "$perf_out" <<'EOF'
import json, sys, os
name, w, js, t0, t1, cmds, tck, perf = sys.argv[1:]
j = json.loads(js)
u0, s0 = map(int, t0.split()); u1, s1 = map(int, t1.split())
cmds = int(cmds); tck = int(tck)
user = (u1 - u0) / tck / cmds * 1e6
sys_ = (s1 - s0) / tck / cmds * 1e6
task = cs = float('nan')
if os.path.exists(perf):
    for line in open(perf):
        f = line.strip().split(',')
        if len(f) > 2 and f[2].startswith('task-clock'):
            task = float(f[0]) * 1e3 / cmds  # msec -> us
        if len(f) > 2 and f[2].startswith('context-switches'):
            cs = float(f[0]) / cmds
print(f"| {w.upper()} | {name} | {j['ops_per_sec']:,.0f} | {j['load_ops_per_sec']:,.0f} | {cmds} | {task:.2f} | {user:.2f} | {sys_:.2f} | {cs:.3f} |")
EOF
}

echo "# $(date -u +%FT%TZ) load: $(cut -d' ' -f1-3 /proc/loadavg) records=$records ops=$ops threads=$threads"
echo "| workload | server | run ops/s | load ops/s | commands | server task-clock us/cmd | user us/cmd | sys us/cmd | ctx switches/cmd |"
echo "|---|---|---|---|---|---|---|---|---|"
for r in $(seq "$rounds"); do
  for w in $workloads; do
    rm -f "$dir/nv.nvs"
    nice -n "$nice" "$bin" serve --pool "$dir/nv.nvs" --port "$np" "$@" 2>>"$dir/nv.log" &
    pid=$!
    wait_port "$np"
    measure nvstore "$np"
    kill -INT "$pid"; wait "$pid" || true; pid=
    rm -rf "$dir/redis"; mkdir -p "$dir/redis"
    nice -n "$nice" redis-server --port "$rp" --bind 127.0.0.1 --dir "$dir/redis" --save '' \
      --appendonly yes --appendfsync always --daemonize no >"$dir/redis.log" 2>&1 &
    pid=$!
    wait_port "$rp"
    measure redis "$rp"
    kill "$pid"; wait "$pid" || true; pid=
  done
done
