#!/usr/bin/env bash
# The cold start on a GPU, piece by piece, in one bounded command (the steps' timeouts add
# up to 420 s): the GPU tests first (so that the code measured is the code that passes them),
# then bench/start_pieces.py (CUDA's and NCCL's start after `import torch`, NCCL settings,
# a context started beside the import), bench/cold_start.py's process-group rows, and
# `python -m fuzz run` from process start to its first failure with rank 0's start phases.
# Usage, from the repository root: bash bench/gpu_cold.sh OUTDIR
set -uo pipefail
out=${1:?usage: bench/gpu_cold.sh OUTDIR}
source "$(dirname "$0")/_steps.sh"
venv
say "machine: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) $(nproc) cores"

timeout 100 "$py" -m pytest -m gpu -n 8 -q -p no:cacheprovider tests > "$w/gpu-tests.log" 2>&1
say "GPU tests: exit $? ($(tail -1 "$w/gpu-tests.log"))"
grep -E '^(FAILED|ERROR)' "$w/gpu-tests.log" | tee -a "$out/summary.txt"

timeout 150 "$py" bench/start_pieces.py --repeat 3 --out "$w/pieces" > "$w/pieces.log" 2>&1
say "start_pieces: exit $?"; cat "$w/pieces.log" >> "$out/summary.txt"

timeout 70 "$py" bench/cold_start.py --device cuda --repeat 3 --only "process group" \
    --out "$w/pg" > "$w/pg.log" 2>&1
say "cold_start process group: exit $?"; cat "$w/pg.log" >> "$out/summary.txt"

for seed in 0 1 2; do
  for target in pre-fix pr-fix; do
    timeout 15 "$py" -c "import json
from fuzz.bench import from_process_start
from fuzz.options import DEFAULT
print(json.dumps(from_process_start('cuda', 1, '$target', $seed, 200, 10.0, DEFAULT, 10.0)))" \
        > "$w/cold-$target-$seed.log" 2>&1
    say "cold start $target seed $seed: exit $?; $(tail -1 "$w/cold-$target-$seed.log")"
  done
done
say "done"
