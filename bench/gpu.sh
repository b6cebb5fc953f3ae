#!/usr/bin/env bash
# The GPU numbers in one bounded command (at most 10 minutes: the steps' own timeouts add
# up to 570 s), each log written as it goes: the lifetime oracle's cost on CUDA and CPU,
# what a dispatch mode costs a broadcast, `make test` (the GPU tests running), the bench
# (throughput vs the hand loop with the stage breakdown, gates vs spins, cold time to
# first failure; pre-fix's throughput last; without the "waiting ex/s" column, which
# would run every fuzzer row twice: pre-fix's crashes make that half a minute more),
# and vLLM's packed-tensor weight sync with a gate.
# Usage, from the repository root: bash bench/gpu.sh OUTDIR [VLLM_TREES]
# VLLM_TREES holds vLLM source trees per version (VLLM_TREES/0.34.0/vllm/...); a node
# without network cannot fetch a wheel. Everything is packed into OUTDIR/all.tgz after
# each step; OUTDIR/summary.txt has the lines that matter.
set -uo pipefail
out=${1:?usage: bench/gpu.sh OUTDIR [VLLM_TREES]}
trees=${2:-}
source "$(dirname "$0")/_steps.sh"
venv
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  "$py" -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
} > "$w/machine.txt" 2>&1
say "machine: $(tr '\n' ' ' < "$w/machine.txt")"

for d in cuda cpu; do
  timeout 35 "$py" bench/lifetime_cost.py --device $d --examples 40 --rounds 5 \
      --out "$w/lifetime-$d" > "$w/lifetime-$d.log" 2>&1
  say "lifetime_cost $d: exit $?"; tail -12 "$w/lifetime-$d/lifetime_cost.md" 2>/dev/null \
      | tee -a "$out/summary.txt"
done

timeout 25 "$py" bench/broadcast_cost.py --device cuda --out "$w/broadcast" \
    > "$w/broadcast.log" 2>&1
say "broadcast_cost: exit $?"; tail -12 "$w/broadcast.log" | tee -a "$out/summary.txt"

t0=$(date +%s)
timeout 180 make test > "$w/test.log" 2>&1
rc=$?
if [ $rc = 124 ]; then  # what was still running when the bound came: tests or their teardown
  ps -eo pid,ppid,etime,args | grep -E 'pytest|fuzz' | grep -v grep >> "$w/test.log"
  pkill -f -- '-m pytest' ; sleep 2  # not left running beside the bench
fi
say "make test: exit $rc after $(( $(date +%s) - t0 ))s ($(tail -1 "$w/test.log"))"
grep -E '^(FAILED|ERROR)' "$w/test.log" | tee -a "$out/summary.txt"

timeout 255 "$py" -m streamfuzz bench --device cuda --cuda-world-size 1 \
    --target main-gather --target main-gather-synced --target pr-fix --target pre-fix --examples 80 \
    --oracle-examples 20 --detect-examples 100 --random-examples 50 --seeds 3 \
    --ff-examples 1000 --ff-budget 20 --shrink-budget 10 --timeout 30 --no-waiting --out "$w/bench" \
    > "$w/bench.log" 2>&1
say "bench: exit $?"; cat "$w/bench/bench.md" 2>/dev/null | head -60 | tee -a "$out/summary.txt"

if [ -n "$trees" ] && [ -d "$trees/0.34.0" ]; then
  timeout 40 "$py" -m streamfuzz run --target vllm-weights --upstream "$trees/0.34.0" --device cuda \
      --world-size 1 --hold gate --max-examples 200 --budget 20 --shrink-budget 10 --seed 1 \
      --profile ci --corpus "$w/corpus" --report "$w/vllm-weights.json" \
      > "$w/vllm-weights.log" 2>&1
  say "vllm-weights@0.34.0 gates on cuda: exit $?"
  grep -E '^  vllm|reproduces' "$w/vllm-weights.log" | head -4 | tee -a "$out/summary.txt"
fi
say "done"
