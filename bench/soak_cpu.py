"""Does a soak's cost per example grow? Examples per CPU-second, by quarter.

Runs ``python -m streamfuzz soak ARGS`` (give it ``--out``) as a child and,
every ``--every`` seconds, reads the CPU time of the child's whole process
tree from ``/proc`` (driver, zygote, ranks; children that ended count through
their parent's reaped time) and the examples so far from ``state.json``. A
wall-clock rate moves with the machine's other load; CPU time per example
moves much less, so a cost that grows per example shows here on a shared
machine too.

    nice -n 10 python bench/soak_cpu.py -- soak --device cpu --budget 10m --worlds 1 \\
        --out cpu-run --corpus cpu-run/corpus

Writes ``cpu.jsonl`` (one line a sample) into the soak's ``--out`` and prints,
per quarter of the samples: examples, CPU seconds, examples per CPU-second,
the driver's share of the CPU and the machine's mean load average (CPU time
per example still rises with the load: processes that share a core wait in
caches and spins).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

_TICK = os.sysconf("SC_CLK_TCK")


def _cpu(pid: int, reaped: bool = True) -> float:
    """Seconds of CPU of ``pid`` and (``reaped``) of the children it reaped; 0 once gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(f) for f in fields[11:15 if reaped else 13]) / _TICK  # utime stime cutime cstime


def _tree(root: int) -> list[int]:
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                kids = Path(f"/proc/{pid}/task/{task}/children").read_text().split()
                todo.extend(int(k) for k in kids)
        except OSError:
            continue
    return pids


def _examples(out: Path) -> int | None:
    try:
        return int(json.loads((out / "state.json").read_text())["examples"])
    except (OSError, ValueError, KeyError):
        return None


def quarters(samples: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Per quarter of the samples: examples, CPU seconds and their ratio."""
    rows = [s for s in samples if s["examples"] is not None]
    q = (len(rows) - 1) // 4
    out = []
    for i in range(4):
        a, b = rows[i * q], rows[(i + 1) * q]
        ex, cpu = b["examples"] - a["examples"], b["cpu"] - a["cpu"]
        drv = b["driver_cpu"] - a["driver_cpu"]
        load = [s.get("load", 0.0) for s in rows[i * q:(i + 1) * q + 1]]
        out.append({"t": round(b["t"]), "examples": ex, "cpu_s": round(cpu, 1),
                    "per_cpu_s": round(ex / cpu, 2) if cpu else 0.0,
                    "driver_share": round(drv / cpu, 3) if cpu else 0.0,
                    "load": round(sum(load) / len(load), 1)})
    return out


def main() -> int:
    args = sys.argv[1:]
    every = 10.0
    if args[:1] == ["--every"]:
        every, args = float(args[1]), args[2:]
    args = args[1:] if args[:1] == ["--"] else args
    if "--out" not in args or every <= 0:
        print("soak_cpu: give the soak's arguments, --out included, after --", file=sys.stderr)
        return 2
    out = Path(args[args.index("--out") + 1])
    out.mkdir(parents=True, exist_ok=True)
    child = subprocess.Popen([sys.executable, "-m", "streamfuzz", *args])
    t0, samples = time.monotonic(), []
    with open(out / "cpu.jsonl", "a") as log:
        while child.poll() is None:
            time.sleep(every)
            pids = _tree(child.pid)
            sample = {"t": round(time.monotonic() - t0, 1), "examples": _examples(out),
                      "cpu": round(sum(_cpu(p) for p in pids), 2),
                      "driver_cpu": round(_cpu(child.pid, reaped=False), 2), "pids": len(pids),
                      "load": os.getloadavg()[0]}
            if child.poll() is None:  # a process that ended mid-read gives a low sum
                samples.append(sample)
                log.write(json.dumps(sample) + "\n")
                log.flush()
    for row in quarters(samples):
        print(json.dumps(row))
    return child.returncode


if __name__ == "__main__":
    sys.exit(main())
