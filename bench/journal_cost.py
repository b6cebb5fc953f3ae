"""What a soak driver's journal costs per example, against the rule of reports.

A soak rewrites ``journal.json`` at every example it dispatches, with the
examples in flight. This times the soak's writer (``soak.Journal``: one
``pwrite`` into a file kept open) against the rule reports and corpus entries
follow (``corpus.write_json_atomic``: a fresh temporary file, fsync, rename,
fsync of the folder), on the same drawn scenarios, two in flight at a time,
in interleaved rounds; per writer the median over rounds of wall and CPU µs
per example. The file system under ``--dir`` is what is measured (an fsync
costs what the disk makes it cost): give the soak's own ``--out`` disk.

    PYTHONPATH=. python bench/journal_cost.py --out reports/journal-cost --dir soak

Writes ``journal_cost.json`` and ``journal_cost.md`` into ``--out``.
"""

from __future__ import annotations

import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _script  # bench/_script.py, beside this script
from hypothesis import HealthCheck, given, seed, settings

from streamfuzz.fuzz.corpus import write_json_atomic
from streamfuzz.fuzz.soak import Journal
from streamfuzz.strategies import scenarios


def _scenarios(n: int) -> list[Any]:
    drawn: list[Any] = []

    @seed(0)
    @settings(max_examples=n, database=None, suppress_health_check=list(HealthCheck))
    @given(scenarios())
    def collect(sc: Any) -> None:
        drawn.append(sc)

    collect()
    return drawn


def _writers(folder: Path) -> dict[str, Callable[[list[Any]], None]]:
    journal = Journal(folder / "journal.json")

    def atomic(pair: list[Any]) -> None:
        write_json_atomic(folder / "atomic.json", {
            "target": "main-gather", "round": 1, "scenarios": [s.to_dict() for s in pair],
            "replays": 0})

    return {"soak journal (pwrite)": lambda pair: journal.write("main-gather", 1, pair),
            "atomic write (fsync, rename)": atomic}


def main() -> int:
    p = _script.parser(__doc__)
    p.add_argument("--dir", type=Path, default=None, help="where the files go (default --out)")
    p.add_argument("--examples", type=int, default=300)
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    if (why := _script.error("cpu", examples=args.examples, rounds=args.rounds)):
        print(f"journal_cost: {why}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    base = args.dir or args.out
    base.mkdir(parents=True, exist_ok=True)
    drawn = _scenarios(args.examples)
    folder = Path(tempfile.mkdtemp(prefix="journal-cost.", dir=base))
    rounds: dict[str, list[dict[str, float]]] = {}
    try:
        writers = _writers(folder)
        for _ in range(args.rounds):
            for name, write in writers.items():
                w0, c0 = time.perf_counter(), time.process_time()
                for i in range(1, len(drawn)):
                    write(drawn[i - 1:i + 1])
                n = len(drawn) - 1
                rounds.setdefault(name, []).append(
                    {"wall_us": (time.perf_counter() - w0) / n * 1e6,
                     "cpu_us": (time.process_time() - c0) / n * 1e6})
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    med = {k: {m: statistics.median(r[m] for r in rs) for m in ("wall_us", "cpu_us")}
           for k, rs in rounds.items()}
    report = {"host": platform.node(), "python": platform.python_version(),
              "cpus": os.cpu_count(), "examples": len(drawn), "rounds": rounds, "medians": med}
    lines = [f"Journal writes per example ({len(drawn)} scenarios, two in flight, medians of "
             f"{args.rounds} interleaved rounds, {os.cpu_count()} CPUs):", "",
             "| writer | wall µs/example | CPU µs/example |", "|---|---|---|"]
    lines += [f"| {k} | {v['wall_us']:.0f} | {v['cpu_us']:.0f} |" for k, v in med.items()]
    _script.write_report(args.out, "journal_cost", report, lines + [""])
    return 0


if __name__ == "__main__":
    sys.exit(main())
