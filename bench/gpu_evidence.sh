#!/usr/bin/env bash
# The GPU node's three commands from a fresh copy, as the README gives them, in one
# bounded command (about 9 minutes), each log written as it goes:
#   make fuzz (through the Makefile's bootstrap), make test (GPU tests running),
#   the user-code example on CUDA, make soak BUDGET=2m.
# Usage, from the repository root of a fresh copy: bash bench/gpu_evidence.sh OUTDIR [SOAK]
# SOAK is the soak's budget (default 2m); 0 leaves the soak out.
set -u
out=${1:?usage: bench/gpu_evidence.sh OUTDIR [SOAK]}
soak=${2:-2m}
source "$(dirname "$0")/_steps.sh"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import torch, hypothesis; print("torch", torch.__version__, "hypothesis", hypothesis.__version__)'
  nproc; git log -1 --format='%h %s' 2>/dev/null
} > "$w/machine.txt" 2>&1
say "machine: $(tr '\n' ' ' < "$w/machine.txt")"

timeout 150 make fuzz BUDGET=20 > "$w/fuzz.log" 2>&1
say "make fuzz: exit $?"; grep -A5 '^streamfuzz on' "$w/fuzz.log" | tee -a "$out/summary.txt"

timeout 330 make test > "$w/test.log" 2>&1
say "make test: exit $? ($(tail -1 "$w/test.log"))"
grep -E '^(FAILED|ERROR)' "$w/test.log" | tee -a "$out/summary.txt"

timeout 60 .venv/bin/python -m pytest -q -p no:cacheprovider examples/test_user_code.py \
    --streamfuzz-device cuda > "$w/user-code.log" 2>&1
say "examples/test_user_code.py on cuda: exit $? ($(tail -1 "$w/user-code.log"))"

if [ "$soak" != 0 ]; then
  timeout 600 make soak BUDGET="$soak" SOAK_OUT="$w/soak" > "$w/soak.log" 2>&1
  say "make soak BUDGET=$soak: exit $?"; tail -6 "$w/soak.log" | tee -a "$out/summary.txt"
fi
say "done"
