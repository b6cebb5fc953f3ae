#!/usr/bin/env bash
# The README's commands on one GPU node as a user has it, in one bounded command (the
# steps' own timeouts add up to under 600 s): `make fuzz`, `make test` (GPU tests
# included), then `make soak BUDGET=60s`; each step's exit status and last line go to
# OUTDIR/summary.txt, its log to OUTDIR/all.tgz.
# Usage, from the repository root: bash bench/gpu_readme.sh OUTDIR
set -uo pipefail
out=${1:?usage: bench/gpu_readme.sh OUTDIR}
source "$(dirname "$0")/_steps.sh"
venv
machine

step() {  # step NAME SECONDS COMMAND...
  local name=$1 secs=$2; shift 2
  local t0; t0=$(date +%s)
  timeout "$secs" "$@" > "$w/$name.log" 2>&1
  say "$name: exit $? in $(( $(date +%s) - t0 ))s ($(grep -v '^\s*$' "$w/$name.log" | tail -1))"
}
step make-fuzz 120 make fuzz
grep -E '^\s*\S+\s*:' "$w/make-fuzz.log" | tail -25 >> "$out/summary.txt"
step make-test 330 make test
grep -E '^(FAILED|ERROR)' "$w/make-test.log" | tee -a "$out/summary.txt"
step make-soak 110 make soak BUDGET=60s SOAK_OUT="$w/soak"
pack
