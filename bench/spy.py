"""Where a running campaign's processes spend their CPU: py-spy on the driver and on each rank.

Starts ``python -m streamfuzz run`` on one target (its own corpus, in ``--out``), waits
until its ranks are up and a few seconds of examples have run, then samples
the driver and every rank with py-spy (``--nonblocking``: the processes are
never paused) for ``--seconds``, and stops the campaign with a Ctrl-C. Native
frames (gloo, NCCL, the CUDA driver) show as the Python call that made them,
unless ``--native`` asks for them (each sample then pauses the process).

The report ranks functions by their share of each process's samples: inclusive
(time under the function) and own (the function itself was on top). py-spy
counts only threads that are running, so a process's samples over its elapsed
samples is the share of one core it used.

    PYTHONPATH=. python bench/spy.py --device auto --target main-gather --out DIR

Needs py-spy (``pip install py-spy``: a PyPI package, a static binary), on PATH,
beside the interpreter or at ``--py-spy``; attaching needs ptrace rights over
the campaign (as its parent's user under the usual ``ptrace_scope``). Writes
``spy.md``, ``spy.json``, ``campaign.log`` and each process's raw stacks
(``PROC.raw``, py-spy's collapsed format, for a flame graph) into ``--out``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import _script  # bench/_script.py, beside this script

_READY_S = 120.0  # the ranks' start, NCCL's and the gate pool's included


def _py_spy(given: str | None) -> str | None:
    if given:
        return given if os.access(given, os.X_OK) else None
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if os.access(beside, os.X_OK) else shutil.which("py-spy")


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def _ranks(driver: int) -> list[int]:
    """The driver's rank processes: the zygote's children, or spawned ones."""
    out = []
    for child in _children(driver):
        if "streamfuzz.fuzz.zygote" in _cmdline(child):
            out += _children(child)
        elif "streamfuzz.fuzz.rank_main" in _cmdline(child):
            out.append(child)
    return sorted(out)


def _frame(f: str) -> str:
    """``func (path/to/file.py:LINE)`` as ``func (file.py)``: lines summed."""
    name, _, where = f.partition(" (")
    file = where.removesuffix(")").rsplit(":", 1)[0].rsplit("/", 1)[-1]
    return f"{name} ({file})" if file else name


def _profile(raw: Path) -> tuple[int, Counter, Counter]:
    total, incl, own = 0, Counter(), Counter()
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        frames = [_frame(f) for f in stack.split(";")[1:] if f]  # [0]: process or thread
        total += int(n)
        for f in set(frames):
            incl[f] += int(n)
        if frames:
            own[frames[-1]] += int(n)
    return total, incl, own


def main() -> int:
    p = _script.parser(__doc__)
    p.add_argument("--target", default="main-gather")
    p.add_argument("--world-size", type=int, default=0, help="default: 2 on cpu, 1 on cuda")
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--warm", type=float, default=3.0, help="seconds of examples before sampling")
    p.add_argument("--rate", type=int, default=250, help="samples per second")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--py-spy", dest="py_spy", default=None)
    p.add_argument("--native", action="store_true",
                   help="C and C++ frames too (py-spy then pauses each process per sample)")
    args = p.parse_args()
    spy = _py_spy(args.py_spy)
    problem = _script.error(args.device, seconds=int(args.seconds), rate=args.rate)
    if spy is None:
        problem = "py-spy not found: pip install py-spy, or give --py-spy PATH"
    if problem:
        print(f"spy: {problem}", file=sys.stderr)
        return 2
    device = _script.device_kind(args.device)
    world = args.world_size or (2 if device == "cpu" else 1)
    args.out.mkdir(parents=True, exist_ok=True)
    budget = _READY_S + args.warm + args.seconds + 30
    cmd = [sys.executable, "-m", "streamfuzz", "run", "--target", args.target, "--device", device,
           "--world-size", str(world), "--worlds", "1", "--max-examples", "1000000",
           "--budget", str(budget),
           "--seed", "0", "--profile", "ci", "--corpus", str(args.out / "corpus")]
    with open(args.out / "campaign.log", "wb") as log:
        campaign = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + _READY_S
        ranks: list[int] = []
        while len(ranks) < world and time.monotonic() < deadline and campaign.poll() is None:
            time.sleep(0.2)
            ranks = _ranks(campaign.pid)
        if len(ranks) < world:
            print(f"spy: the campaign's {world} ranks did not start (see campaign.log)",
                  file=sys.stderr)
            return 1
        time.sleep(args.warm)
        if campaign.poll() is not None:
            print("spy: the campaign ended before sampling began: it found something, or"
                  " failed (see campaign.log)", file=sys.stderr)
            return 1
        procs = {"driver": campaign.pid, **{f"rank{i}": pid for i, pid in enumerate(ranks)}}
        spies = {name: subprocess.Popen(
            [spy, "record", "--pid", str(pid), "--native" if args.native else "--nonblocking",
             "--rate", str(args.rate),
             "--duration", str(int(args.seconds)), "--format", "raw",
             "--output", str(args.out / f"{name}.raw")],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for name, pid in procs.items()}
        errors = {name: s.communicate()[1].decode(errors="replace") for name, s in spies.items()}
    finally:
        if campaign.poll() is None:
            campaign.send_signal(signal.SIGINT)
            try:
                campaign.wait(30)
            except subprocess.TimeoutExpired:
                campaign.kill()
    elapsed = args.seconds * args.rate
    report: dict = {"device": device, "target": args.target, "world_size": world,
                    "seconds": args.seconds, "rate": args.rate, "processes": {}}
    lines = [f"# Where the CPU goes: `{args.target}` on {device}, world size {world}",
             f"py-spy, {args.rate} samples/s for {args.seconds:g} s, after {args.warm:g} s of"
             " examples; % of the process's samples (busy: % of one core).", ""]
    for name in procs:
        raw = args.out / f"{name}.raw"
        if not raw.exists():
            lines.append(f"{name}: no samples ({errors[name].strip()[-300:]})")
            continue
        total, incl, own = _profile(raw)
        # The frames every sample passes through (the entry point down to the
        # campaign's loop) say nothing: the table starts below them.
        incl = Counter({f: n for f, n in incl.items() if n < 0.9 * total})
        report["processes"][name] = {"samples": total, "inclusive": incl.most_common(args.top),
                                     "own": own.most_common(args.top)}
        lines += [f"## {name}: {total} samples, busy {100 * total / elapsed:.0f}%", "",
                  "| inclusive % | function | | own % | function |", "|---|---|---|---|---|"]
        for (fi, ni), (fo, no) in zip(incl.most_common(args.top), own.most_common(args.top)):
            lines.append(f"| {100 * ni / total:.1f} | {fi} | | {100 * no / total:.1f} | {fo} |")
        lines.append("")
    _script.write_report(args.out, "spy", report, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
