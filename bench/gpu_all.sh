#!/usr/bin/env bash
# Everything the one-GPU evidence needs, bounded to about 7 minutes:
# GPU tests, detection over 5 seeds from cold starts (corpus kept), a long
# clean run of main-gather, then the bench for as long as time is left.
# Usage, from the repository root: PYTHONPATH=. bash bench/gpu_all.sh OUTDIR
set -u
out=${1:?usage: bench/gpu_all.sh OUTDIR}
w="$out/work"; mkdir -p "$w"
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-.}
pack() { tar czf "$out/all.tgz" -C "$w" . ; }
start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$w/machine.txt"
python3 -c 'import torch, hypothesis; print("torch", torch.__version__, "hypothesis", hypothesis.__version__)' >> "$w/machine.txt"
timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/ > "$w/gpu-tests.log" 2>&1
echo "gpu tests: exit $? ($(tail -1 "$w/gpu-tests.log"))"
pack
for s in 1 2 3 4 5; do
  t0=$(date +%s)
  timeout 45 python3 -m streamfuzz run --device cuda --world-size 1 --target pre-fix --target pr-fix \
    --max-examples 300 --budget 10 --shrink-budget 6 --timeout 30 --seed "$s" --profile ci \
    --corpus "$w/corpus" --report "$w/detect-$s.json" > "$w/detect-$s.log" 2>&1
  echo "seed $s: exit $? in $(( $(date +%s) - t0 ))s; $(grep -E '^(pre-fix|pr-fix):' "$w/detect-$s.log" | tr '\n' ' ')"
done
pack
timeout 75 python3 -m streamfuzz run --device cuda --world-size 1 --target main-gather \
  --max-examples 5000 --budget 55 --seed 7 --profile ci --corpus "$w/corpus" \
  --report "$w/clean.json" > "$w/clean.log" 2>&1
echo "main-gather: exit $?; $(grep -E '^main-gather:' "$w/clean.log")"
pack
left=$(( 430 - ($(date +%s) - start) ))
echo "bench gets ${left}s"
if [ "$left" -gt 40 ]; then
  timeout "$left" python3 -m streamfuzz bench --device cuda --cuda-world-size 1 --examples 100 \
    --oracle-examples 20 --detect-examples 100 --random-examples 50 --seeds 3 \
    --ff-examples 500 --ff-budget 10 --shrink-budget 5 --timeout 30 --out "$w/bench" \
    > "$w/bench.log" 2>&1
  echo "bench: exit $?"
fi
pack
echo "total $(( $(date +%s) - start ))s"
