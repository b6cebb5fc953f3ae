"""Parallel worlds on one GPU node: what a held stream costs the GPU, and how
worlds scale.

    python bench/worlds.py busy  --out DIR   # GPU-busy ms per example, per gate kind
    python bench/worlds.py curve --out DIR   # soak throughput for N = 1, 2, 4, 8 worlds
    python bench/worlds.py soak  --out DIR --minutes 10 --worlds 8

``busy`` runs main-gather with each gate kind (``STREAMFUZZ_GATES``) while
``nvidia-smi`` samples the GPU's utilization (the share of time a kernel
ran): busy ms per example = utilization x seconds / examples. It also counts
what the gates force, with each kind: the crafted reuse and write-after-read
cases of ``fuzz bench`` (value and reuse oracles: what manifests), and gate
timeouts. ``curve`` runs ``fuzz soak --worlds N`` over the built-ins for
each N and gives the total examples/s, the speed-up and the GPU's
utilization. ``soak`` runs one long campaign and keeps its merged report.
Each writes ``DIR/<command>.json`` and ``.md`` as it goes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parent.parent


class _GpuSampler:
    """``nvidia-smi`` utilization and memory, sampled every 200 ms in a thread."""

    def __init__(self) -> None:
        self.util: list[float] = []
        self.mem_mib: list[float] = []
        self._proc: subprocess.Popen[str] | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> _GpuSampler:
        self._proc = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used",
             "--format=csv,noheader,nounits", "-lms", "200"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        return self

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            try:
                u, m = (float(x) for x in line.split(","))
            except ValueError:
                continue
            self.util.append(u)
            self.mem_mib.append(m)

    def __exit__(self, *exc: object) -> None:
        assert self._proc is not None
        self._proc.terminate()
        self._proc.wait()

    def mean_util(self) -> float | None:
        return statistics.mean(self.util) if self.util else None


def _fuzz(args: list[str], env: dict[str, str] | None = None,
          timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "streamfuzz", *args], cwd=_ROOT, text=True,
                          capture_output=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def _save(out: Path, name: str, data: Any, md: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(data, indent=1))
    (out / f"{name}.md").write_text("\n".join(md) + "\n")


def busy(out: Path, kinds: list[str], examples: int, detect: int) -> None:
    rows: list[dict[str, Any]] = []
    for kind in kinds:
        env = {"STREAMFUZZ_GATES": kind}
        with tempfile.TemporaryDirectory() as tmp:
            report = Path(tmp) / "r.json"
            t0 = time.monotonic()
            with _GpuSampler() as gpu:
                proc = _fuzz(["run", "--device", "cuda", "--worlds", "1", "--target",
                              "main-gather", "--max-examples", str(examples), "--profile",
                              "ci", "--seed", "1", "--corpus", str(Path(tmp) / "c"),
                              "--report", str(report)], env)
            wall = time.monotonic() - t0
            rep = json.loads(report.read_text()) if report.exists() else {}
        t = (rep.get("targets") or [{}])[0]
        util = gpu.mean_util()
        n = t.get("examples") or 0
        row = {"kind": kind, "exit": proc.returncode, "examples": n,
               "examples_per_s": t.get("examples_per_s"), "gate_timeouts": t.get("gate_timeouts"),
               "held_by": t.get("held_by"), "gpu_util_pct": util, "wall_s": round(wall, 1),
               # The GPU was busy util% of the run's wall time, start-up included: an
               # upper bound per example.
               "busy_ms_per_example": round(util / 100 * wall * 1000 / n, 3)
               if util is not None and n else None,
               "error": None if rep else proc.stderr[-400:]}
        row["detection"] = _detection(kind, detect)
        rows.append(row)
        _save(out, "busy", rows, _busy_md(rows))
        print(json.dumps(row), flush=True)


def _detection(kind: str, n: int) -> dict[str, Any]:
    """The crafted cases of ``fuzz bench`` with this gate kind: failures out of ``n``."""
    code = f"""
import json, os
os.environ["STREAMFUZZ_GATES"] = {kind!r}
from streamfuzz.fuzz.bench import crafted, detection
from streamfuzz.fuzz.ranks import RankPool
with RankPool(1, "cuda", timeout=60.0) as pool:
    out = {{"gates": pool.info[0].gates}}
    for target, bug in (("pre-fix", "reuse"), ("pr-fix", "war")):
        out[target] = detection(pool, target, [crafted(bug, 1)] * {n})
print(json.dumps(out))
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=_ROOT, text=True,
                          capture_output=True, timeout=300)
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": proc.stderr[-400:]}


def _busy_md(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| gate kind | examples/s | GPU busy | busy ms/example | gate timeouts | "
             "crafted reuse (pre-fix): gates / spins | crafted WAR (pr-fix): gates / spins |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        def cell(t: str, d: dict[str, Any] = r["detection"]) -> str:
            x = d.get(t) or {}
            return f"{x.get('gate', '?')} / {x.get('spin', '?')} of {x.get('examples', '?')}"
        lines.append(f"| {r['kind']} | {r['examples_per_s']} | {r['gpu_util_pct']:.0f}% | "
                     f"{r['busy_ms_per_example']} | {r['gate_timeouts']} | {cell('pre-fix')} | "
                     f"{cell('pr-fix')} |" if r["gpu_util_pct"] is not None else
                     f"| {r['kind']} | {r['examples_per_s']} | ? | ? | {r['gate_timeouts']} | "
                     f"{cell('pre-fix')} | {cell('pr-fix')} |")
    return lines


def curve(out: Path, counts: list[int], seconds: int, kind: str | None) -> None:
    rows: list[dict[str, Any]] = []
    for n in counts:
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.monotonic()
            with _GpuSampler() as gpu:
                proc = _fuzz(["soak", "--device", "cuda", "--worlds", str(n), "--budget",
                              f"{seconds}s", "--stats-every", "5s", "--out",
                              str(Path(tmp) / "soak"), "--corpus", str(Path(tmp) / "c")],
                             {"STREAMFUZZ_GATES": kind} if kind else None,
                             timeout=seconds + 240)
            wall = time.monotonic() - t0
            try:
                rep = json.loads((Path(tmp) / "soak" / "report.json").read_text())
            except (OSError, ValueError):
                rep = {}
        per = [w["examples_per_s"] for w in rep.get("worlds", ())] if n > 1 else \
            [rep.get("examples_per_s")]
        total = rep.get("examples_per_s")
        row = {"worlds": n, "gates": kind or "default", "exit": proc.returncode,
               "examples": rep.get("examples"), "total_ex_s": total, "per_world_ex_s": per,
               "gpu_util_pct": gpu.mean_util(), "gpu_mem_max_mib": max(gpu.mem_mib, default=None),
               "held_by": rep.get("held_by"), "memory_growing": rep.get("memory_growing"),
               "failures": len(rep.get("distinct_failures", ())), "wall_s": round(wall, 1),
               "error": None if rep else proc.stderr[-600:]}
        rows.append(row)
        base = rows[0]["total_ex_s"] or 0
        md = ["| worlds | gates | total examples/s | speed-up | per world | GPU busy | "
              "GPU memory max | distinct failures |", "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            up = f"{r['total_ex_s'] / base:.2f}x" if base and r["total_ex_s"] else "?"
            pw = ", ".join(f"{x:.0f}" for x in r["per_world_ex_s"] if x is not None)
            util = f"{r['gpu_util_pct']:.0f}%" if r["gpu_util_pct"] is not None else "?"
            md.append(f"| {r['worlds']} | {r['gates']} | {r['total_ex_s']} | {up} | {pw} | "
                      f"{util} | {r['gpu_mem_max_mib']} MiB | {r['failures']} |")
        _save(out, "curve" + (f"-{kind}" if kind else ""), rows, md)
        print(json.dumps(row), flush=True)


def soak(out: Path, minutes: float, worlds: int) -> None:
    soak_dir = out / "soak"
    with _GpuSampler() as gpu:
        proc = _fuzz(["soak", "--device", "cuda", "--worlds", str(worlds), "--budget",
                      f"{minutes * 60:.0f}s", "--stats-every", "10s", "--out", str(soak_dir),
                      "--corpus", str(out / "corpus")], timeout=minutes * 60 + 240)
    (out / "soak.log").write_text(proc.stdout + proc.stderr)
    summary = {"exit": proc.returncode, "gpu_util_pct": gpu.mean_util(),
               "gpu_mem_mib": {"first": gpu.mem_mib[:3], "last": gpu.mem_mib[-3:],
                               "max": max(gpu.mem_mib, default=None)}}
    _save(out, "soak-gpu", summary, [json.dumps(summary)])
    print(json.dumps(summary), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("busy")
    b.add_argument("--kinds", default="wait,ptx")
    b.add_argument("--examples", type=int, default=1200)
    b.add_argument("--detect", type=int, default=40)
    c = sub.add_parser("curve")
    c.add_argument("--worlds", default="1,2,4,8")
    c.add_argument("--seconds", type=int, default=40)
    c.add_argument("--gates", default=None, help="a gate kind (default: the ranks' first)")
    s = sub.add_parser("soak")
    s.add_argument("--minutes", type=float, default=10.0)
    s.add_argument("--worlds", type=int, default=8)
    for q in (b, c, s):
        q.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    if a.command == "busy":
        busy(a.out, a.kinds.split(","), a.examples, a.detect)
    elif a.command == "curve":
        curve(a.out, [int(x) for x in a.worlds.split(",")], a.seconds, a.gates)
    else:
        soak(a.out, a.minutes, a.worlds)


if __name__ == "__main__":
    main()
