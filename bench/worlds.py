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
utilization. ``soak`` runs one long campaign and keeps its merged report. ``curve`` and
``soak`` also give the cores each role used (drivers, ranks, controller) and
the host's busy share.
Each writes ``DIR/<command>.json`` and ``.md`` as it goes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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
        if shutil.which("nvidia-smi") is None:  # a CPU node: nothing to sample
            return self
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
        if self._proc is None:
            return
        self._proc.terminate()
        self._proc.wait()

    def mean_util(self) -> float | None:
        return statistics.mean(self.util) if self.util else None


class _CpuSampler:
    """Which processes of a campaign use the node's cores: every second, the CPU time
    of each process under ``root`` (from ``/proc``), summed by role, and the host's
    busy share (``/proc/stat``). A driver is a process started with ``--world-of``;
    the controller is ``root``; every other descendant is a rank (or its zygote)."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.first: dict[int, tuple[str, int]] = {}
        self.last: dict[int, int] = {}
        self.host0 = self._host()
        self.t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    @staticmethod
    def _host() -> tuple[int, int]:
        f = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        idle = f[3] + f[4]
        return sum(f) - idle, sum(f)

    def _loop(self) -> None:
        while not self._stop.wait(1.0):
            self.sample()

    def sample(self) -> None:
        parent: dict[int, int] = {}
        ticks: dict[int, int] = {}
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                rest = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parent[int(d.name)] = int(rest[1])
            ticks[int(d.name)] = int(rest[11]) + int(rest[12])
        for pid in ticks:
            p, seen = pid, 0
            while p and p != self.root and seen < 64:
                p, seen = parent.get(p, 0), seen + 1
            if p != self.root:
                continue
            if pid not in self.first:
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
                except OSError:
                    continue
                role = ("controller" if pid == self.root else
                        "driver" if "--world-of" in cmd else "rank")
                self.first[pid] = (role, ticks[pid])
            self.last[pid] = ticks[pid]

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join()
        wall = time.monotonic() - self.t0
        hz = os.sysconf("SC_CLK_TCK")
        cores: dict[str, float] = {}
        count: dict[str, int] = {}
        for pid, (role, t) in self.first.items():
            cores[role] = cores.get(role, 0.0) + (self.last[pid] - t) / hz / wall
            count[role] = count.get(role, 0) + 1
        busy, total = (b - a for a, b in zip(self.host0, self._host()))
        return {"cores_by_role": {k: round(v, 2) for k, v in sorted(cores.items())},
                "processes_by_role": count, "host_busy_pct": round(100 * busy / max(total, 1), 1),
                "host_cores": os.cpu_count()}


def _fuzz(args: list[str], env: dict[str, str] | None = None,
          timeout: float = 600, cpu: list[dict[str, Any]] | None = None,
          ) -> subprocess.CompletedProcess[str]:
    """``python -m streamfuzz ARGS``; with ``cpu``, its processes' CPU use is appended there."""
    proc = subprocess.Popen([sys.executable, "-m", "streamfuzz", *args], cwd=_ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, **(env or {})})
    sampler = _CpuSampler(proc.pid) if cpu is not None else None
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    if sampler is not None and cpu is not None:
        cpu.append(sampler.stop())
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


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


def curve(out: Path, counts: list[int], seconds: int, kind: str | None,
          env: dict[str, str], label: str, device: str = "cuda", mps: str = "off") -> None:
    rows: list[dict[str, Any]] = []
    for n in counts:
        cpu: list[dict[str, Any]] = []
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.monotonic()
            with _GpuSampler() as gpu:
                proc = _fuzz(["soak", "--device", device, "--worlds", str(n), "--budget",
                              f"{seconds}s", "--stats-every", "5s", "--mps", mps, "--out",
                              str(Path(tmp) / "soak"), "--corpus", str(Path(tmp) / "c")],
                             {**env, **({"STREAMFUZZ_GATES": kind} if kind else {})},
                             timeout=seconds + 240, cpu=cpu)
            wall = time.monotonic() - t0
            try:
                rep = json.loads((Path(tmp) / "soak" / "report.json").read_text())
            except (OSError, ValueError):
                rep = {}
        per = [w["examples_per_s"] for w in rep.get("worlds", ())] if n > 1 else \
            [rep.get("examples_per_s")]
        total = rep.get("examples_per_s")
        row = {"worlds": n, "gates": kind or "default", "exit": proc.returncode,
               "gpu_sharing": rep.get("config", {}).get("gpu_sharing"),
               "examples": rep.get("examples"), "total_ex_s": total, "per_world_ex_s": per,
               "gpu_util_pct": gpu.mean_util(), "gpu_mem_max_mib": max(gpu.mem_mib, default=None),
               "held_by": rep.get("held_by"), "memory_growing": rep.get("memory_growing"),
               "failures": len(rep.get("distinct_failures", ())), "wall_s": round(wall, 1),
               "cpu": cpu[0] if cpu else None, "env": env,
               "error": None if rep else proc.stderr[-600:]}
        rows.append(row)
        base = rows[0]["total_ex_s"] or 0
        md = ["| worlds | gates | GPU shared by | total examples/s | speed-up | per world | "
              "GPU busy | GPU memory max | distinct failures | cores: drivers / ranks / "
              "controller | host busy |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            up = f"{r['total_ex_s'] / base:.2f}x" if base and r["total_ex_s"] else "?"
            pw = ", ".join(f"{x:.0f}" for x in r["per_world_ex_s"] if x is not None)
            util = f"{r['gpu_util_pct']:.0f}%" if r["gpu_util_pct"] is not None else "?"
            c = r["cpu"] or {}
            by = c.get("cores_by_role", {})
            shared = "MPS" if "MPS server" in (r["gpu_sharing"] or "") else "time slices"
            md.append(f"| {r['worlds']} | {r['gates']} | {shared} | {r['total_ex_s']} | {up} | "
                      f"{pw} | "
                      f"{util} | {r['gpu_mem_max_mib']} MiB | {r['failures']} | "
                      f"{by.get('driver', 0):.1f} / {by.get('rank', 0):.1f} / "
                      f"{by.get('controller', 0):.1f} | {c.get('host_busy_pct', '?')}% |")
        _save(out, "curve" + (f"-{kind}" if kind else "") + (f"-{label}" if label else ""),
              rows, md)
        print(json.dumps(row), flush=True)


def soak(out: Path, minutes: float, worlds: int, mps: str = "off") -> None:
    soak_dir = out / "soak"
    cpu: list[dict[str, Any]] = []
    with _GpuSampler() as gpu:
        proc = _fuzz(["soak", "--device", "cuda", "--worlds", str(worlds), "--budget",
                      f"{minutes * 60:.0f}s", "--stats-every", "10s", "--mps", mps,
                      "--out", str(soak_dir),
                      "--corpus", str(out / "corpus")], timeout=minutes * 60 + 240, cpu=cpu)
    (out / "soak.log").write_text(proc.stdout + proc.stderr)
    summary = {"exit": proc.returncode, "gpu_util_pct": gpu.mean_util(),
               "cpu": cpu[0] if cpu else None,
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
    c.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="an environment variable for the campaign (repeatable)")
    c.add_argument("--label", default="", help="a name for this variant's files")
    c.add_argument("--device", default="cuda")
    s = sub.add_parser("soak")
    s.add_argument("--minutes", type=float, default=10.0)
    s.add_argument("--worlds", type=int, default=8)
    for q in (c, s):
        q.add_argument("--mps", default="off", help="the campaign's --mps (default off)")
    for q in (b, c, s):
        q.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    if a.command == "busy":
        busy(a.out, a.kinds.split(","), a.examples, a.detect)
    elif a.command == "curve":
        env = dict(kv.split("=", 1) for kv in a.env)
        curve(a.out, [int(x) for x in a.worlds.split(",")], a.seconds, a.gates, env, a.label,
              a.device, a.mps)
    else:
        soak(a.out, a.minutes, a.worlds, a.mps)


if __name__ == "__main__":
    main()
