#!/usr/bin/env bash
# The precision probes and the gate patterns on one GPU, in one bounded command (the
# steps' own timeouts add up to under 600 s): tests/test_precision.py and the gate tests on
# CUDA; bench/patterns.py on this tree and, where BEFORE names an older tree of the project
# (a folder with its fuzz/), on that tree too, the same patterns and seeds.
# Usage, from the repository root: bash bench/gpu_precision.sh OUTDIR [BEFORE]
set -uo pipefail
out=${1:?usage: bench/gpu_precision.sh OUTDIR [BEFORE]}
before=${2:-}
source "$(dirname "$0")/_steps.sh"
venv
machine

timeout 120 "$py" -m pytest -q -p no:cacheprovider -rxs tests/test_precision.py \
    tests/test_gates.py tests/test_findings_text.py > "$w/precision.log" 2>&1
say "precision probes: exit $? ($(tail -1 "$w/precision.log"))"
grep -E '^(FAILED|ERROR|XPASS)' "$w/precision.log" | tee -a "$out/summary.txt"

patterns() {  # patterns TREE NAME SECONDS EXAMPLES SEEDS
  ( cd "$1" && PYTHONPATH="$1:$(pwd)" timeout "$3" "$py" "$OLDPWD/bench/patterns.py" \
      --device cuda --examples "$4" --seeds "$5" --out "$w/$2" ) > "$w/$2.log" 2>&1
  say "patterns ($2): exit $?"; cat "$w/$2/patterns.md" 2>/dev/null | tee -a "$out/summary.txt"
}
patterns "$(pwd)" patterns-after 200 200 2
if [ -n "$before" ]; then
  patterns "$(cd "$before" && pwd)" patterns-before 200 40 1
fi
pack
