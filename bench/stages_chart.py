"""One stacked bar chart of several ``fuzz bench`` runs' stage breakdowns.

    PYTHONPATH=. python bench/stages_chart.py OUT.png before=DIR1/bench.json after=DIR2/bench.json \
        [--target main-gather] [--device cpu]

Each ``LABEL=PATH`` adds the driver's and every rank's bar of ``--target``
from that run, labelled ``target (LABEL)``; ``make bench`` draws one run's
chart by itself (``stages-DEVICE.png``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from streamfuzz.fuzz import stages_report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("runs", nargs="+", metavar="LABEL=PATH")
    ap.add_argument("--target", default="main-gather")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    breakdowns, world = [], None
    for spec in args.runs:
        label, _, path = spec.partition("=")
        report = json.loads(Path(path).read_text())
        run = next((r for r in report["runs"] if r["device"] == args.device), None)
        row = run and next((t for t in run["targets"] if t["target"] == args.target), None)
        if row is None:
            raise SystemExit(f"stages_chart: {path} has no {args.target} row on "
                             f"{args.device}; pass --device and --target as the run had them")
        world = run["world_size"]
        breakdowns.append(dict(row["stages"], target=f"{args.target} ({label})"))
    stages_report.plot(args.out, breakdowns, f"{args.device}, world size {world}: ms per "
                                             f"example by stage")
    print("\n".join(stages_report.table(breakdowns)))


if __name__ == "__main__":
    main()
