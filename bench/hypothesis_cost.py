"""What Hypothesis costs the driver per example, without ranks: a micro-bench.

The driver's loop with a body that does nothing: ``@given`` over the
protocol's scenarios (world size 1), the ``ci`` profile, the generate phase
only, under ``profiles.seed_only()``, as ``python -m streamfuzz bench`` runs it.
Seeds 0..K-1, in interleaved rounds with the collector's default thresholds
and with the driver's (``profiles.rare_collections()``); per mode the medians
over rounds of wall and CPU ms per example, and the collector's own time per
example (``gc.callbacks``). How many draws, spans and choices an example
takes comes from one untimed pass. It measures the tree it runs from: run it
before and after a change.

    PYTHONPATH=. python bench/hypothesis_cost.py --out reports/hypothesis-cost

Writes ``hypothesis_cost.json`` and ``hypothesis_cost.md`` into ``--out``.
About a minute with the defaults.
"""

from __future__ import annotations

import contextlib
import gc
import os
import platform
import statistics
import sys
import time
from typing import Any

import _script  # bench/_script.py, beside this script
import hypothesis
from hypothesis import Phase, given, seed, settings

from streamfuzz.fuzz import profiles
from streamfuzz.strategies import scenarios

MODES = ("default gc", "driver gc")


def _loop(seed_: int, examples: int) -> tuple[list[int], Any]:
    """The test, and [examples run, choices they took] once it has run."""
    count = [0, 0]

    def body(_: Any) -> None:
        count[0] += 1
        count[1] += len(hypothesis.control.current_build_context().data.choices)

    test = settings(profiles.get("ci"), max_examples=examples, phases=(Phase.generate,))(
        given(scenarios(world_size=1))(body))
    return count, seed(seed_)(test)


def _round(mode: str, seeds: int, examples: int) -> dict[str, float]:
    """Every seed once in ``mode``: ms per example (wall, CPU, collector)."""
    paused = [0.0, 0.0]

    def on_gc(phase: str, _: dict[str, Any]) -> None:
        if phase == "start":
            paused[1] = time.perf_counter()
        else:
            paused[0] += time.perf_counter() - paused[1]

    n = wall = cpu = 0.0
    gc.collect()
    gc.callbacks.append(on_gc)
    try:
        for s in range(seeds):
            count, test = _loop(s, examples)
            gcm = profiles.rare_collections() if mode == "driver gc" else contextlib.nullcontext()
            with profiles.seed_only(), gcm:
                w0, c0 = time.perf_counter(), time.process_time()
                test()
                wall += time.perf_counter() - w0
                cpu += time.process_time() - c0
            n += count[0]
    finally:
        gc.callbacks.remove(on_gc)
    return {"wall_ms": wall / n * 1e3, "cpu_ms": cpu / n * 1e3, "gc_ms": paused[0] / n * 1e3,
            "examples": n}


def _structure(seeds: int, examples: int) -> dict[str, float]:
    """Draws, spans and choices per example, from one untimed pass."""
    from hypothesis.internal.conjecture import data as conjecture

    calls = {"draws": 0, "spans": 0}
    n = choices = 0
    real_draw, real_span = conjecture.ConjectureData.draw, conjecture.ConjectureData.start_span

    def draw(self: Any, *a: Any, **k: Any) -> Any:
        calls["draws"] += 1
        return real_draw(self, *a, **k)

    def start_span(self: Any, *a: Any, **k: Any) -> Any:
        calls["spans"] += 1
        return real_span(self, *a, **k)

    conjecture.ConjectureData.draw, conjecture.ConjectureData.start_span = draw, start_span
    try:
        for s in range(seeds):
            count, test = _loop(s, examples)
            with profiles.seed_only():
                test()
            n, choices = n + count[0], choices + count[1]
    finally:
        conjecture.ConjectureData.draw, conjecture.ConjectureData.start_span = real_draw, real_span
    return {"draws": calls["draws"] / n, "spans": calls["spans"] / n, "choices": choices / n}


def main() -> int:
    p = _script.parser(__doc__)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--examples", type=int, default=300, help="per seed")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    if (why := _script.error("cpu", seeds=args.seeds, examples=args.examples,
                             rounds=args.rounds)):
        print(f"hypothesis_cost: {why}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    load = [os.getloadavg()[0]]
    rounds: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    for _ in range(args.rounds):
        for mode in MODES:
            rounds[mode].append(_round(mode, args.seeds, args.examples))
            load.append(os.getloadavg()[0])
    med = {m: {k: statistics.median(r[k] for r in rs) for k in ("wall_ms", "cpu_ms", "gc_ms")}
           for m, rs in rounds.items()}
    shape = _structure(args.seeds, args.examples)
    report = {"host": platform.node(), "python": platform.python_version(),
              "hypothesis": hypothesis.__version__, "cpus": os.cpu_count(),
              "load_1min": {"min": min(load), "max": max(load)},
              "seeds": args.seeds, "examples_per_seed": args.examples, "rounds": rounds,
              "medians": med, "per_example": shape}
    lines = [f"Hypothesis per example, driver loop without ranks ({args.seeds} seeds x "
             f"{args.examples} examples, medians of {args.rounds} interleaved rounds; "
             f"Hypothesis {hypothesis.__version__}, {os.cpu_count()} CPUs, 1-min load "
             f"{min(load):.1f}-{max(load):.1f}):", "",
             "| collector | wall ms/ex | CPU ms/ex | collector ms/ex |", "|---|---|---|---|"]
    lines += [f"| {m} | {v['wall_ms']:.2f} | {v['cpu_ms']:.2f} | {v['gc_ms']:.2f} |"
              for m, v in med.items()]
    lines += ["", f"Per example: {shape['draws']:.1f} draws, {shape['spans']:.1f} spans, "
              f"{shape['choices']:.1f} choices.", ""]
    _script.write_report(args.out, "hypothesis_cost", report, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
