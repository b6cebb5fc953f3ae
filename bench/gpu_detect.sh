#!/usr/bin/env bash
# Detection evidence on one GPU (NCCL, world size 1): pre-fix and pr-fix over
# seeds with the value oracle, then main-gather over many examples.
# Usage: bench/gpu_detect.sh OUTDIR [SEEDS] [CLEAN_EXAMPLES]
set -u
out=${1:?output directory}; seeds=${2:-"1 2 3 4 5"}; clean=${3:-5000}
mkdir -p "$out/work"
export PYTHONPATH=${PYTHONPATH:-.} PYTHONUNBUFFERED=1
for s in $seeds; do
  for t in pre-fix pr-fix; do
    timeout 150 python3 -m streamfuzz run --device cuda --world-size 1 --target "$t" \
      --max-examples 1000 --seed "$s" --profile ci --corpus "$out/work/corpus" \
      --report "$out/work/r-$t-$s.json" > "$out/work/log-$t-$s.txt" 2>&1
    echo "$t seed $s rc=$?: $(grep -E 'FOUND|clean over' "$out/work/log-$t-$s.txt" | head -1)"
  done
done
timeout 300 python3 -m streamfuzz run --device cuda --world-size 1 --target main-gather \
  --max-examples "$clean" --seed 7 --profile ci --corpus "$out/work/corpus" \
  --report "$out/work/r-main-gather.json" 2>&1 | tee "$out/work/log-main-gather.txt" | tail -3
tar czf "$out/detect.tgz" -C "$out/work" .
