# Sourced by the bench/gpu*.sh scripts once $out names their output folder: logs go to
# $w (OUTDIR/work); `say` writes a step's line to OUTDIR/summary.txt and, like `pack`,
# packs every log into OUTDIR/all.tgz, so that a run cut short still brings back what it did;
# `venv` bootstraps the project's environment.
mkdir -p "$out/work" && out=$(cd "$out" && pwd)
w="$out/work"
export PYTHONUNBUFFERED=1
start=$(date +%s)
pack() { tar czf "$out/all.tgz" -C "$w" . ; }
say() { echo "[$(( $(date +%s) - start ))s] $*" | tee -a "$out/summary.txt"; pack; }
# The project's own environment (the Makefile's bootstrap, its pytest plugin installed)
# and its interpreter as $py, an absolute path that holds in any folder a step cd's into.
venv() { make -s .venv/.ready > /dev/null || exit 1; py=$(pwd)/.venv/bin/python; }
# cold TARGET SEED LOG: `python -m streamfuzz run` on one GPU from process start to its first
# failure (streamfuzz.fuzz.bench.from_process_start), its JSON as LOG's last line.
cold() {
  timeout 15 "$py" -c "import json
from streamfuzz.fuzz.bench import from_process_start
from streamfuzz.fuzz.options import DEFAULT
print(json.dumps(from_process_start('cuda', 1, '$1', $2, 200, 10.0, DEFAULT, 10.0)))" > "$3" 2>&1
}
# The node's card, driver, torch and cores, as the first line of the summary.
machine() {
  { nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    "$py" -c 'import torch; print("torch", torch.__version__)'; nproc
  } > "$w/machine.txt" 2>&1
  say "machine: $(tr '\n' ' ' < "$w/machine.txt")"
}
