#!/usr/bin/env bash
# The scan's 20 harnesses of docs/scan.md on one GPU, real streams, in one bounded command:
# `bench/harness_runs.py --device cuda` with the wheels in WHEELS (a node without network:
# copies of the two wheels holding their Python files are enough, since the harness loads
# the release's source files), then the table's lines into OUTDIR/summary.txt.
# Usage, from the repository root: bash bench/gpu_harness.sh OUTDIR WHEELS
set -uo pipefail
out=${1:?usage: bench/gpu_harness.sh OUTDIR WHEELS}
wheels=$(cd "${2:?usage: bench/gpu_harness.sh OUTDIR WHEELS}" && pwd)
source "$(dirname "$0")/_steps.sh"
venv
machine
STREAMFUZZ_SCAN_WHEELS=$wheels timeout 500 "$py" bench/harness_runs.py --device cuda --jobs 8 \
    --out "$w/harness" > "$w/harness.log" 2>&1
say "harness_runs --device cuda: exit $?"
grep -E '^(vllm|sglang) |run as written' "$w/harness.log" | tee -a "$out/summary.txt"
pack
