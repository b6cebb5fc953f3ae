#!/usr/bin/env bash
# Parallel worlds and gate kinds on one GPU node, in bounded steps (each under 600 s).
# Usage, from the repository root: bash bench/gpu_worlds.sh OUTDIR STEP...
#   tests   the GPU tests (gates of every kind, the pools, the probes on CUDA)
#   busy    GPU-busy ms per example and crafted-case rates, per gate kind
#   patterns bench/patterns.py: the correct patterns, examples/s and gate timeouts
#   curve   soak throughput with CURVE_WORLDS worlds (default 1,2,4,8), and 8 with the
#           PTX kernel gates unless CURVE_PTX=0; CURVE_MPS is the campaigns' --mps (off),
#           CURVE_LABEL names the variant's files
#   fuzz    `make fuzz` as the README says, on the node's default worlds
#   soak    a soak of SOAK_MIN minutes (default 9) with SOAK_WORLDS worlds (default 8)
#   soak-start  the same soak, started in the background into build/soak-bg (so that
#           the calling shell may return first; SOAK_WORLDS=best takes the curve step's
#           fastest); the step returns SOAK_START_UNTIL s (575) after the script started
#   soak-wait   waits for that soak to end and brings its report here
#   cpu     where the node's cores go with CPU_WORLDS worlds (default 8), as the soak runs
#           and with each CPU_VARIANTS entry (label:KEY=VALUE,...) set for the campaign
#   spy     bench/spy.py on one CUDA world (py-spy at build/tools/py-spy or on PATH)
set -uo pipefail
out=${1:?usage: bench/gpu_worlds.sh OUTDIR STEP...}; shift
source "$(dirname "$0")/_steps.sh"
venv
machine
for step in "$@"; do
  case $step in
    tests)
      timeout 200 "$py" -m pytest -q -p no:cacheprovider -rxs -m gpu tests/test_gpu.py \
        tests/test_gates.py tests/test_precision.py tests/test_sim_fidelity.py \
        > "$w/tests.log" 2>&1
      say "gpu tests: exit $? ($(tail -1 "$w/tests.log"))"
      grep -E '^(FAILED|ERROR|XPASS)' "$w/tests.log" | tee -a "$out/summary.txt" ;;
    busy)
      PYTHONPATH=. timeout 170 "$py" bench/worlds.py busy --out "$w/busy" > "$w/busy.log" 2>&1
      say "busy: exit $?"; cat "$w/busy/busy.md" 2>/dev/null | tee -a "$out/summary.txt" ;;
    patterns)
      PYTHONPATH=. timeout 170 "$py" bench/patterns.py --device cuda --examples 200 --seeds 1 \
        --out "$w/patterns" > "$w/patterns.log" 2>&1
      say "patterns: exit $?"; cat "$w/patterns/patterns.md" 2>/dev/null | tee -a "$out/summary.txt" ;;
    curve)
      label=${CURVE_LABEL:-}
      PYTHONPATH=. timeout 420 "$py" bench/worlds.py curve --seconds 35 --out "$w/curve" \
        --worlds "${CURVE_WORLDS:-1,2,4,8}" --mps "${CURVE_MPS:-off}" --label "$label" \
        > "$w/curve${label:+-$label}.log" 2>&1
      say "curve $label: exit $?"
      cat "$w/curve/curve${label:+-$label}.md" 2>/dev/null | tee -a "$out/summary.txt"
      [ "${CURVE_PTX:-1}" = 0 ] && continue
      PYTHONPATH=. timeout 120 "$py" bench/worlds.py curve --worlds 8 --seconds 35 --gates ptx \
        --out "$w/curve" > "$w/curve-ptx.log" 2>&1
      say "curve (ptx gates): exit $?"; cat "$w/curve/curve-ptx.md" 2>/dev/null | tee -a "$out/summary.txt" ;;
    fuzz)
      timeout 240 make fuzz > "$w/fuzz.log" 2>&1
      say "make fuzz: exit $?"; tail -12 "$w/fuzz.log" | tee -a "$out/summary.txt" ;;
    soak)
      PYTHONPATH=. timeout 590 "$py" bench/worlds.py soak --minutes "${SOAK_MIN:-9}" \
        --worlds "${SOAK_WORLDS:-8}" --out "$w/soak" > "$w/soak-run.log" 2>&1
      say "soak: exit $?"; tail -3 "$w/soak/soak.log" | tee -a "$out/summary.txt"
      sed -n '1,20p' "$w/soak/soak/report.md" >> "$out/summary.txt"
      sed -n '/## Worlds/,$p' "$w/soak/soak/report.md" | tee -a "$out/summary.txt" ;;
    soak-start)
      rm -rf build/soak-bg; mkdir -p build/soak-bg
      n=${SOAK_WORLDS:-8}
      if [ "$n" = best ]; then  # the curve step's fastest world count
        n=$("$py" -c "import json,sys; r=json.load(open(sys.argv[1]))
b = max(r, key=lambda x: x['total_ex_s'] or 0); assert b['total_ex_s']; print(b['worlds'])" \
          "$w/curve/curve.json") || { say "soak-start: no curve to pick from"; continue; }
      fi
      PYTHONPATH=. setsid nohup "$py" bench/worlds.py soak --minutes "${SOAK_MIN:-10}" \
        --worlds "$n" --mps "${SOAK_MPS:-off}" --out build/soak-bg > build/soak-bg/run.log 2>&1 < /dev/null &
      echo $! > build/soak-bg/pid
      say "soak-start: pid $(cat build/soak-bg/pid), ${SOAK_MIN:-10} min, $n worlds"
      # SOAK_START_UNTIL: the step returns that many seconds after the script started.
      sleep $(( ${SOAK_START_UNTIL:-575} - ($(date +%s) - start) ))
      cp -r build/soak-bg "$w/soak-bg"; say "soak-start: $(tail -2 build/soak-bg/soak/soak.log 2>/dev/null)" ;;
    soak-wait)
      pid=$(cat build/soak-bg/pid 2>/dev/null)
      while [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; do sleep 2; done
      rm -rf "$w/soak-bg"; cp -r build/soak-bg "$w/soak-bg"
      say "soak-wait: $(tail -1 build/soak-bg/run.log)"
      sed -n '1,20p' build/soak-bg/soak/report.md >> "$out/summary.txt"
      sed -n '/## Worlds/,$p' build/soak-bg/soak/report.md | tee -a "$out/summary.txt" ;;
    cpu)
      for v in ${CPU_VARIANTS:-base:}; do
        label=${v%%:*}; envs=()
        for kv in $(tr ',' ' ' <<< "${v#*:}"); do envs+=(--env "$kv"); done
        PYTHONPATH=. timeout 150 "$py" bench/worlds.py curve --worlds "${CPU_WORLDS:-8}" \
          --seconds "${CPU_SECONDS:-30}" --label "$label" "${envs[@]}" --out "$w/cpu" \
          > "$w/cpu-$label.log" 2>&1
        say "cpu $label: exit $? $(tail -1 "$w/cpu/curve-$label.md" 2>/dev/null)"
      done ;;
    spy)
      spy=build/tools/py-spy; [ -x "$spy" ] || spy=$(command -v py-spy)
      PYTHONPATH=. timeout 200 "$py" bench/spy.py --device cuda --target main-gather \
        --seconds 10 --out "$w/spy" ${spy:+--py-spy "$spy"} > "$w/spy.log" 2>&1
      say "spy: exit $?"; head -40 "$w/spy/spy.md" 2>/dev/null >> "$out/summary.txt" ;;
  esac
done
pack
