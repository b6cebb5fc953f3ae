#!/usr/bin/env bash
# Whole suites and programs under the checker on one GPU (issue: pytest --streamfuzz,
# check), in one bounded command, each log written as it goes:
#   tests/plain_suite.py plainly, under --streamfuzz --streamfuzz-device cuda, and under
#   PyTorch's CUDA Sanitizer (TORCH_CUDA_SANITIZER=1): verdicts and wall times;
#   streamfuzz check --device cuda on tests/checked_program.py (buggy, fixed, a child);
#   make bench-checked (plain, checked and csan on real streams);
#   the suites of bench/suites.py where bench/.suites holds them (fetched beforehand);
#   make test, the README's command.
# Usage, from the repository root: bash bench/gpu_checked.sh OUTDIR [STEPS]
# STEPS: any of plain,check,bench,suites,test (default all, in that order).
set -u
out=${1:?usage: bench/gpu_checked.sh OUTDIR [STEPS]}
steps=${2:-plain,check,bench,suites,test}
source "$(dirname "$0")/_steps.sh"
venv
machine
has() { [[ ",$steps," == *",$1,"* ]]; }
timed() { local t0 rc; t0=$(date +%s%N); "$@"; rc=$?; echo "wall_ms=$(( ($(date +%s%N) - t0) / 1000000 )) rc=$rc"; }

if has plain; then
  for mode in plain streamfuzz csan; do
    args=(-q -p no:cacheprovider -o addopts= --junitxml "$w/plain-$mode.xml" tests/plain_suite.py -rA)
    case $mode in
      plain) timed timeout 200 "$py" -m pytest "${args[@]}" ;;
      streamfuzz) timed timeout 200 "$py" -m pytest --streamfuzz --streamfuzz-device cuda "${args[@]}" ;;
      csan) TORCH_CUDA_SANITIZER=1 timed timeout 200 "$py" -m pytest "${args[@]}" ;;
    esac > "$w/plain-$mode.log" 2>&1
    say "plain_suite.py, $mode: $(tail -1 "$w/plain-$mode.log") $(grep -E '^[0-9]+ passed|^[0-9]+ failed|failed,|passed,' "$w/plain-$mode.log" | tail -1)"
    grep -E '^(PASSED|FAILED|SKIPPED|ERROR)' "$w/plain-$mode.log" | cut -c1-160 >> "$out/summary.txt"
  done
fi

if has check; then
  for a in "" "--fixed" "--only-child --child spawn" "--fixed --only-child --child spawn"; do
    # shellcheck disable=SC2086
    timed timeout 120 "$py" -m streamfuzz check --device cuda tests/checked_program.py $a \
      > "$w/check.log" 2>&1
    say "check --device cuda checked_program.py $a: $(grep -E '^streamfuzz check' "$w/check.log" | cut -c1-150) $(tail -1 "$w/check.log")"
  done
fi

if has bench; then
  timeout 400 make bench-checked BENCH_OUT="$w" > "$w/bench-checked.log" 2>&1
  say "make bench-checked: exit $?"; grep -E '^\||overhead' "$w/bench-checked.log" | tee -a "$out/summary.txt"
fi

if has suites && [ -f bench/suites.py ] && [ -d bench/.suites ]; then
  timeout 540 "$py" bench/suites.py run --device cuda --out "$w/suites" > "$w/suites.log" 2>&1
  say "suites on cuda: exit $?"; tail -30 "$w/suites.log" >> "$out/summary.txt"
fi

if has test; then
  timeout 540 make test > "$w/test.log" 2>&1
  say "make test: exit $? ($(tail -1 "$w/test.log"))"
  grep -E '^(FAILED|ERROR)' "$w/test.log" | tee -a "$out/summary.txt"
fi
say "done"
