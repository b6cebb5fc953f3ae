# Sourced by the bench/gpu*.sh scripts once $out names their output folder: logs go to
# $w (OUTDIR/work); `say` writes a step's line to OUTDIR/summary.txt and, like `pack`,
# packs every log into OUTDIR/all.tgz, so that a run cut short still brings back what it did.
mkdir -p "$out/work" && out=$(cd "$out" && pwd)
w="$out/work"
export PYTHONUNBUFFERED=1
start=$(date +%s)
pack() { tar czf "$out/all.tgz" -C "$w" . ; }
say() { echo "[$(( $(date +%s) - start ))s] $*" | tee -a "$out/summary.txt"; pack; }
