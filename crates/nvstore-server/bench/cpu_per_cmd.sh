#!/usr/bin/env bash
# Server CPU per command under redis-benchmark, for `nvstore serve` or
# redis-server (appendonly yes, appendfsync always, files on /dev/shm).
# usage: cpu_per_cmd.sh [path/to/nvstore | redis] [port] [serve args...]
#   (defaults: target/release/nvstore, 6392). Environment: N (200000),
#   NICE (19: server and client both run under `nice -n $NICE`).
# Runs, one after the other against one fresh server: SET, GET, HSET with
# `-c 16 -n N`, then GET with `-c 16 -P 16 -n 5N`. For each it prints
# requests/s and, per command (commands from INFO's
# total_commands_processed): task-clock and context switches from
# `perf stat -p` over the run, user and system time from /proc/PID/stat.
# CPU per command is the figure that stays comparable on a loaded machine;
# requests/s is not.
set -euo pipefail
bin=${1:-target/release/nvstore}
port=${2:-6392}
shift $(($# < 2 ? $# : 2))
n=${N:-200000}
nice=${NICE:-19}
dir=$(mktemp -d /dev/shm/cpu-per-cmd.XXXXXX)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
if [ "$bin" = redis ]; then
  name=redis
  nice -n "$nice" redis-server --port "$port" --bind 127.0.0.1 --dir "$dir" --save '' --appendonly yes \
    --appendfsync always --daemonize no >"$dir/log" 2>&1 &
else
  name=nvstore
  nice -n "$nice" "$bin" serve --pool "$dir/p.nvs" --port "$port" "$@" >"$dir/log" 2>&1 &
fi
pid=$!
for _ in $(seq 200); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done
tck=$(getconf CLK_TCK)
cmds() { redis-cli -p "$port" info stats | tr -d '\r' | awk -F: '/^total_commands_processed/{print $2}'; }
echo "# $(date -u +%FT%TZ) load: $(cut -d' ' -f1-3 /proc/loadavg) $name $*"
echo "| test | server | req/s | task-clock us/cmd | user us/cmd | sys us/cmd | ctx switches/cmd |"
echo "|---|---|---|---|---|---|---|"
for tp in set:1 get:1 hset:1 get:16; do
  t=${tp%:*} p=${tp#*:} m=$n
  [ "$p" = 16 ] && m=$((5 * n))
  c0=$(cmds)
  read -r u0 s0 < <(awk '{print $14, $15}' "/proc/$pid/stat")
  perfpid=
  if perf stat -e task-clock,context-switches -x, -o "$dir/perf" -p "$pid" 2>/dev/null & then perfpid=$!; fi
  rps=$(nice -n "$nice" redis-benchmark -p "$port" -t "$t" -n "$m" -c 16 -P "$p" --csv 2>/dev/null |
    tail -1 | cut -d, -f2 | tr -d '"')
  if [ -n "$perfpid" ]; then kill -INT "$perfpid" 2>/dev/null || true; wait "$perfpid" 2>/dev/null || true; fi
  read -r u1 s1 < <(awk '{print $14, $15}' "/proc/$pid/stat")
  c1=$(cmds)
  python3 - "$t" "$p" "$name" "$rps" "$c0" "$c1" "$u0" "$u1" "$s0" "$s1" "$tck" "$dir/perf" <<'PY'
import os, sys
t, p, name, rps, c0, c1, u0, u1, s0, s1, tck, perf = sys.argv[1:]
n = int(c1) - int(c0) - 1  # the INFO call itself
tck = int(tck)
user = (int(u1) - int(u0)) / tck / n * 1e6
sys_ = (int(s1) - int(s0)) / tck / n * 1e6
task = cs = float('nan')
if os.path.exists(perf):
    for line in open(perf):
        f = line.strip().split(',')
        if len(f) > 2 and f[2].startswith('task-clock'):
            task = float(f[0]) * 1e3 / n
        if len(f) > 2 and f[2].startswith('context-switches'):
            cs = float(f[0]) / n
print(f"| {t.upper()} -P {p} | {name} | {float(rps):,.0f} | {task:.2f} | {user:.2f} | {sys_:.2f} | {cs:.3f} |")
PY
done
