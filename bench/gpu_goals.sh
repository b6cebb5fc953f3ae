#!/usr/bin/env bash
# The GPU tests, then the performance goals measured side by side, in one bounded command
# (the steps' own timeouts add up to 600 s), with more examples and seeds than bench/gpu.sh
# gives a row, so that a median over seeds is not one slow seed: main-gather's fuzzer and
# hand loop on CUDA (5 seeds of 200 examples, all oracles); the lifetime oracle's cost on
# CUDA and on the CPU simulation; process start to the first failure for pre-fix and
# pr-fix (5 seeds each, the two alternating); and the CPU world of two ranks on this host's
# cores (the same bench, gloo), which says what the CPU rows get where cores are not shared.
# Usage, from the repository root: bash bench/gpu_goals.sh OUTDIR
# Everything is packed into OUTDIR/all.tgz after each step; OUTDIR/summary.txt has the
# lines that matter.
set -uo pipefail
out=${1:?usage: bench/gpu_goals.sh OUTDIR}
source "$(dirname "$0")/_steps.sh"
venv
machine

timeout 90 "$py" -m pytest -m gpu -n 8 -q -p no:cacheprovider tests > "$w/gpu-tests.log" 2>&1
say "GPU tests: exit $? ($(tail -1 "$w/gpu-tests.log"))"
grep -E '^(FAILED|ERROR)' "$w/gpu-tests.log" | tee -a "$out/summary.txt"
timeout 30 "$py" bench/nccl_trace.py > "$w/nccl-trace.log" 2>&1
say "nccl_trace: exit $?"; cat "$w/nccl-trace.log" >> "$out/summary.txt"

bench() {  # bench DEVICE OUT SECONDS EXTRA...: main-gather, 5 seeds of 200 examples
  local device=$1 dir=$2 limit=$3; shift 3
  timeout "$limit" "$py" -m streamfuzz bench --device "$device" --target main-gather --examples 200 \
      --seeds 5 --oracle-examples 20 --detect-examples 10 --random-examples 5 \
      --ff-examples 1000 --ff-budget 20 --shrink-budget 10 --timeout 30 --no-waiting \
      --out "$w/$dir" "$@" > "$w/$dir.log" 2>&1
  say "bench $device: exit $?"; head -12 "$w/$dir/bench.md" 2>/dev/null | tee -a "$out/summary.txt"
  grep -E 'reserved MiB|fuzzer .* ex/s' "$w/$dir.log" | tee -a "$out/summary.txt"
}
bench cuda bench-cuda 130 --cuda-world-size 1

for d in cuda cpu; do
  timeout 35 "$py" bench/lifetime_cost.py --device $d --examples 40 --rounds 5 \
      --out "$w/lifetime-$d" > "$w/lifetime-$d.log" 2>&1
  say "lifetime_cost $d: exit $?; $(grep -E '^\| wall' "$w/lifetime-$d/lifetime_cost.md" 2>/dev/null)"
done

for seed in 0 1 2 3 4; do
  for target in pre-fix pr-fix; do
    cold "$target" "$seed" "$w/cold-$target-$seed.log"
    say "cold start $target seed $seed: exit $?; $(tail -1 "$w/cold-$target-$seed.log")"
  done
done

bench cpu bench-cpu 130 --cpu-world-size 2
say "done"
