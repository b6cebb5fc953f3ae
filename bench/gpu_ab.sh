#!/usr/bin/env bash
# A change's before and after on one GPU in one bounded command (the steps' own
# timeouts add up to 810 s with the default rounds), the two trees alternating
# on the same node: the lifetime oracle's cost on CUDA and on the CPU simulation
# (bench/lifetime_cost.py), what a dispatch mode and the oracle cost one broadcast
# (bench/broadcast_cost.py), the bench's throughput and stage breakdown for
# main-gather, the cold start to pre-fix's first failure, then the GPU tests on the
# after tree. Each log is written as it goes, and everything (logs, tables,
# cProfiles) is packed into OUTDIR/all.tgz after each step; OUTDIR/summary.txt has
# the lines that matter.
# Usage, from the repository root of the after tree:
#   bash bench/gpu_ab.sh OUTDIR BEFORE_TREE
# BEFORE_TREE is a copy of the code before the change (`git archive REV | tar x -C DIR`),
# with the same layout; its `fuzz` is imported in place of this tree's for its runs.
# LIFETIME_ROUNDS (default 2) and BENCH_ROUNDS (default 1) repeat those steps, the trees
# alternating in each round; keep the sum of the timeouts under the node's bound.
set -uo pipefail
out=${1:?usage: bench/gpu_ab.sh OUTDIR BEFORE_TREE}
before=${2:?usage: bench/gpu_ab.sh OUTDIR BEFORE_TREE}
[ -d "$before/fuzz" ] || { echo "gpu_ab: $before has no fuzz/ package" >&2; exit 2; }
before=$(cd "$before" && pwd)
source "$(dirname "$0")/_steps.sh"
venv
tree() { if [ "$1" = before ]; then echo "$before"; else pwd; fi; }

for r in $(seq "${LIFETIME_ROUNDS:-2}"); do
  for t in before after; do
    for d in cuda cpu; do
      PYTHONPATH=$(tree $t) timeout 30 "$py" bench/lifetime_cost.py --device $d --examples 40 \
          --rounds 3 --out "$w/lifetime-$t-$d-$r" > "$w/lifetime-$t-$d-$r.log" 2>&1
      say "lifetime_cost $t $d round $r: exit $?; $(grep -E '^\| wall' \
          "$w/lifetime-$t-$d-$r/lifetime_cost.md" 2>/dev/null)"
    done
  done
done

for t in before after; do
  PYTHONPATH=$(tree $t) timeout 20 "$py" bench/broadcast_cost.py --device cuda \
      --out "$w/broadcast-$t" > "$w/broadcast-$t.log" 2>&1
  say "broadcast_cost $t: exit $?"; grep -E '^\|' "$w/broadcast-$t.log" | tee -a "$out/summary.txt"
done

for r in $(seq "${BENCH_ROUNDS:-1}"); do
  for t in before after; do
    # The bench from the tree itself: its own columns, its own stage counters.
    (cd "$(tree $t)" && PYTHONPATH=. timeout 100 "$py" -m streamfuzz bench --device cuda \
        --cuda-world-size 1 --target main-gather --examples 80 \
        --oracle-examples 20 --detect-examples 10 --random-examples 5 --seeds 3 \
        --ff-examples 1000 --ff-budget 20 --shrink-budget 10 --timeout 30 \
        --out "$w/bench-$t-$r") > "$w/bench-$t-$r.log" 2>&1
    say "bench $t round $r: exit $?"; head -24 "$w/bench-$t-$r/bench.md" 2>/dev/null \
        | tee -a "$out/summary.txt"
  done
done

# Cold start, process start to the first failure (pre-fix), the trees alternating per seed.
for seed in 0 1 2; do
  for t in before after; do
    (cd "$(tree $t)" && PYTHONPATH=. timeout 40 "$py" -c "import json
from streamfuzz.fuzz.bench import from_process_start
from streamfuzz.fuzz.options import DEFAULT
print(json.dumps(from_process_start('cuda', 1, 'pre-fix', $seed, 200, 20.0, DEFAULT, 20.0)))") \
        > "$w/cold-$t-$seed.log" 2>&1
    say "cold start $t seed $seed: exit $?; $(tail -1 "$w/cold-$t-$seed.log")"
  done
done

timeout 90 "$py" -m pytest -m gpu -n 8 -q -p no:cacheprovider tests > "$w/gpu-tests.log" 2>&1
say "GPU tests (after): exit $? ($(tail -1 "$w/gpu-tests.log"))"
grep -E '^(FAILED|ERROR)' "$w/gpu-tests.log" | tee -a "$out/summary.txt"
say "done"
