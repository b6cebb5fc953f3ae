#!/usr/bin/env bash
# The GPU node's evidence in one bounded command (about 6 minutes), most important
# first, each log written as it goes:
#   make fuzz (the README's first command, through the Makefile's bootstrap),
#   vLLM's own PPHandler on CUDA (seeds 1-3, all oracles, gates),
#   the GPU tests, the weight-sync reproducer, then a short make soak.
# Usage, from the repository root:
#   bash bench/gpu_evidence.sh OUTDIR VLLM_TREES
# VLLM_TREES holds one vLLM source tree per version (VLLM_TREES/0.32.0/vllm/...),
# each with at least vllm/v1/worker/gpu/pp_utils.py and vllm/_version.py (a node
# without network cannot fetch a wheel).
set -u
out=${1:?usage: bench/gpu_evidence.sh OUTDIR VLLM_TREES}
trees=${2:?usage: bench/gpu_evidence.sh OUTDIR VLLM_TREES}
# Logs go to OUTDIR/work, packed into OUTDIR/all.tgz after every step (a run cut
# short still brings back what it did); OUTDIR/summary.txt has the lines that matter.
w="$out/work"; mkdir -p "$w"
pack() { tar czf "$out/all.tgz" -C "$w" . ; }
export PYTHONUNBUFFERED=1
start=$(date +%s)
say() { echo "[$(( $(date +%s) - start ))s] $*" | tee -a "$out/summary.txt"; pack; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import torch, hypothesis; print("torch", torch.__version__, "hypothesis", hypothesis.__version__)'
} > "$w/machine.txt" 2>&1
say "machine: $(tr '\n' ' ' < "$w/machine.txt")"

timeout 150 make fuzz BUDGET=20 > "$w/fuzz.log" 2>&1
say "make fuzz: exit $?"; grep -A5 '^streamfuzz on' "$w/fuzz.log" | tee -a "$out/summary.txt"

py=.venv/bin/python
for v in 0.32.0 0.34.0; do
  seeds="1 2 3"; [ "$v" = 0.34.0 ] && seeds=1
  for s in $seeds; do
    timeout 60 "$py" -m fuzz run --upstream "$trees/$v" --device cuda --world-size 1 \
      --max-examples 300 --budget 15 --shrink-budget 10 --seed "$s" --profile ci \
      --corpus "$w/corpus" --report "$w/vllm-$v-$s.json" > "$w/vllm-$v-$s.log" 2>&1
    say "vllm $v seed $s: exit $?"
    grep -E '^  vllm' "$w/vllm-$v-$s.log" | tee -a "$out/summary.txt"
  done
done

timeout 120 "$py" -m pytest -q -m gpu -n 4 -rf -p no:cacheprovider > "$w/gpu-tests.log" 2>&1
say "gpu tests: exit $? ($(tail -1 "$w/gpu-tests.log"))"; grep -E '^(FAILED|ERROR)' "$w/gpu-tests.log" | tee -a "$out/summary.txt"

# The reproducer imports packed_tensor.py from a vllm package; a tree holding only
# that file gets empty package markers here, outside the repository.
pkg=$(mktemp -d); mkdir -p "$pkg/vllm/distributed/weight_transfer"
cp "$trees/0.34.0/vllm/distributed/weight_transfer/packed_tensor.py" "$pkg/vllm/distributed/weight_transfer/"
echo '__version__ = "0.34.0 (packed_tensor.py only)"' > "$pkg/vllm/__init__.py"
touch "$pkg/vllm/distributed/__init__.py" "$pkg/vllm/distributed/weight_transfer/__init__.py"
PYTHONPATH="$pkg" timeout 60 "$py" examples/weight_sync_stale.py > "$w/weight-sync-stale.log" 2>&1
say "weight_sync_stale: exit $?"; tee -a "$out/summary.txt" < "$w/weight-sync-stale.log"

timeout 100 make soak BUDGET=1m SOAK_OUT="$w/soak" > "$w/soak.log" 2>&1
say "make soak BUDGET=1m: exit $?"; tail -8 "$w/soak.log" | tee -a "$out/summary.txt"
say "done"
