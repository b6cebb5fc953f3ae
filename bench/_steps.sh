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
