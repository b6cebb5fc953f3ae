#!/usr/bin/env bash
# Where a GPU node's time goes, in one bounded command (the steps' timeouts add up to
# 560 s), logs written as it goes: `make test` with its slowest tests listed and, while it
# runs past 90 s, the test processes still alive and their Python stacks every 20 s; py-spy
# on a CUDA campaign's driver and rank (Python frames, then native ones); the cold start
# split into phases.
# Usage, from the repository root: bash bench/gpu_probe.sh OUTDIR [PY_SPY]
set -uo pipefail
out=${1:?usage: bench/gpu_probe.sh OUTDIR [PY_SPY]}
spy=${2:-}
source "$(dirname "$0")/_steps.sh"
venv
say "machine: $(nvidia-smi --query-gpu=name --format=csv,noheader) $(nproc) cores"

watch_tests() {  # the test processes left after 90 s, and what each one is doing
  sleep 90
  while :; do
    { echo "=== $(( $(date +%s) - start ))s"
      ps -eo pid,ppid,etime,pcpu,args | grep -E 'pytest|fuzz' | grep -v -E 'grep|ps -eo'
      if [ -n "$spy" ]; then
        for p in $(pgrep -f -- '-m pytest|streamfuzz.fuzz.zygote|streamfuzz.fuzz.rank_main'); do
          echo "--- $p"; timeout 10 "$spy" dump --pid "$p" 2>&1 | head -60
        done
      fi
    } >> "$w/test-watch.log" 2>&1
    sleep 20
  done
}
watch_tests & watcher=$!
t0=$(date +%s)
PYTEST_ADDOPTS="--durations=40" timeout 240 make test > "$w/test.log" 2>&1
rc=$?
kill $watcher 2>/dev/null
[ $rc = 124 ] && { pkill -f -- '-m pytest'; sleep 2; }
say "make test: exit $rc after $(( $(date +%s) - t0 ))s ($(grep -E 'passed|failed' "$w/test.log" | tail -1))"
grep -E '^(FAILED|ERROR)' "$w/test.log" | tee -a "$out/summary.txt"

if [ -n "$spy" ]; then
  timeout 70 "$py" bench/spy.py --device cuda --target main-gather --seconds 10 --py-spy "$spy" \
      --out "$w/spy" > "$w/spy.log" 2>&1
  say "spy: exit $?"; head -60 "$w/spy/spy.md" 2>/dev/null >> "$out/summary.txt"
  timeout 70 "$py" bench/spy.py --device cuda --target main-gather --seconds 10 --native \
      --py-spy "$spy" --out "$w/spy-native" > "$w/spy-native.log" 2>&1
  say "spy --native: exit $?"
fi

timeout 180 "$py" bench/cold_start.py --device cuda --repeat 2 --seeds 2 --out "$w/cold" \
    > "$w/cold.log" 2>&1
say "cold_start: exit $?"; tail -30 "$w/cold.log" >> "$out/summary.txt"; pack
