#!/usr/bin/env bash
# The cold start on a GPU, in one bounded command (the steps' timeouts add up to 520 s with
# 3 seeds): the GPU tests first (so that the code measured is the code that passes them),
# then `python -m streamfuzz run` from process start to its first failure, with rank 0's start
# phases, for pre-fix and pr-fix, early CUDA ranks on, context only and off
# (STREAMFUZZ_EARLY_CUDA=1, context, 0), alternating; then bench/start_pieces.py, which
# splits a start further (bench/cold_start.py too).
# Usage, from the repository root: [SEEDS="0 1 2"] bash bench/gpu_cold.sh OUTDIR
set -uo pipefail
out=${1:?usage: bench/gpu_cold.sh OUTDIR}
source "$(dirname "$0")/_steps.sh"
venv
say "machine: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) $(nproc) cores"

timeout 100 "$py" -m pytest -m gpu -n 8 -q -p no:cacheprovider tests > "$w/gpu-tests.log" 2>&1
say "GPU tests: exit $? ($(tail -1 "$w/gpu-tests.log"))"
grep -E '^(FAILED|ERROR)' "$w/gpu-tests.log" | tee -a "$out/summary.txt"

for seed in ${SEEDS:-0 1 2}; do  # early CUDA ranks on, context only, and off, alternating
  for early in 1 context 0; do
    for target in pre-fix pr-fix; do
      STREAMFUZZ_EARLY_CUDA=$early cold "$target" "$seed" "$w/cold-$target-$seed-early$early.log"
      say "cold start $target seed $seed early $early: exit $?; $(tail -1 "$w/cold-$target-$seed-early$early.log")"
    done
  done
done
timeout 150 "$py" bench/start_pieces.py --repeat 3 --out "$w/start-pieces" > "$w/start-pieces.log" 2>&1
say "start_pieces: exit $?"; cat "$w/start-pieces.log" >> "$out/summary.txt"
say "done"
