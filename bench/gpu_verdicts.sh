#!/usr/bin/env bash
# The verdict harnesses of docs/scan.md (bench/verdicts/) on one GPU, real streams:
# pytest with --streamfuzz-device cuda, the releases' wheels in WHEELS (a node without
# network: the harnesses load the release's source files from them).
# Usage, from the repository root: bash bench/gpu_verdicts.sh OUTDIR WHEELS [PYTEST_ARGS...]
set -uo pipefail
out=${1:?usage: bench/gpu_verdicts.sh OUTDIR WHEELS}
wheels=$(cd "${2:?usage: bench/gpu_verdicts.sh OUTDIR WHEELS}" && pwd)
shift 2
source "$(dirname "$0")/_steps.sh"
venv
machine
STREAMFUZZ_SCAN_WHEELS=$wheels timeout 400 "$py" -m pytest -p no:cacheprovider -rA \
    --streamfuzz-device cuda "${@:-bench/verdicts}" > "$w/verdicts.log" 2>&1
say "verdicts --streamfuzz-device cuda: exit $?"
grep -E '^(PASSED|FAILED|ERROR)|passed|failed' "$w/verdicts.log" | tee -a "$out/summary.txt"
pack
