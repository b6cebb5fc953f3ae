#!/usr/bin/env bash
# The GPU numbers in one command: the gate and reuse tests, then the bench
# (throughput vs the hand loop, gates vs spins, cold time to first failure).
# Usage, from the repository root: PYTHONPATH=. bash bench/gpu.sh OUTDIR
# Writes OUTDIR/{gpu-tests.log,bench.log,bench.json,bench.md}; at most 8 minutes
# (cold starts run first, so a cut-short run still has them in bench.md; pre-fix's
# throughput comes last: its device-side asserts make every seventh example a rank start).
set -uo pipefail
out=${1:?usage: bench/gpu.sh OUTDIR}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$out/bench.log" 2>&1
"$py" -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' \
    >> "$out/bench.log" 2>&1
timeout 120 "$py" -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py \
    > "$out/gpu-tests.log" 2>&1
echo "gpu tests: exit $?" >> "$out/bench.log"
timeout 340 "$py" -m fuzz bench --device cuda --cuda-world-size 1 \
    --target main-gather --target main-gather-synced --target pr-fix --target pre-fix --examples 100 \
    --oracle-examples 30 --detect-examples 200 --random-examples 100 --seeds 5 \
    --ff-examples 1000 --ff-budget 20 --shrink-budget 20 --timeout 30 --out "$out" \
    >> "$out/bench.log" 2>&1
echo "bench: exit $?" >> "$out/bench.log"
