"""What the lifetime oracle costs per example, on this machine's device: a micro-bench.

One process, one rank (a one-rank process group: gloo on CPU, NCCL on CUDA),
no driver and no pipe: the runner of ``streamfuzz.fuzz.draft.runner`` on the same random
scenarios (``streamfuzz.fuzz.bench.random_scenario``), in rounds in which each scenario
runs with the value and reuse oracles and with every oracle, one after the
other (``_paired_round``). The lifetime oracle's cost is the difference, per
round; the median of the rounds is reported. On CPU the
lifetime oracle is the simulation's listener, on CUDA the adapter of
``streamfuzz.fuzz.oracles.lifetime_cuda``, so running it on both gives the CUDA cost
against the CPU cost for the same scenarios. It measures the tree it runs
from: run it before and after a change.

Besides the timings: how much the oracle handled per example (ops, stream
and event callbacks, storages followed), from one untimed pass, and a
cProfile of a pass with every oracle and of one with value and reuse only
(``profile.txt``, by own time and by cumulative time).

    PYTHONPATH=. python bench/lifetime_cost.py --device auto --out reports/lifetime-cost

Writes ``lifetime_cost.json``, ``lifetime_cost.md`` and ``profile.txt`` into
``--out``. About a minute with the defaults.
"""

from __future__ import annotations

import contextlib
import cProfile
import io
import platform
import pstats
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import _script  # bench/_script.py, beside this script
import torch
import torch.distributed as dist

from streamfuzz.fuzz import targets
from streamfuzz.fuzz.bench import random_scenario
from streamfuzz.fuzz.draft.runner import run_on_rank
from streamfuzz.fuzz.options import Hold, Oracle, RunOptions
from streamfuzz.fuzz.oracles import lifetime
from streamfuzz.fuzz.protocol import RankEnv
from streamfuzz.fuzz.streams import CudaStreams, SimStreams

MODES = {"value+reuse": frozenset({Oracle.VALUE, Oracle.REUSE}), "all": frozenset(Oracle)}


def _pass(batch: list[Any], factory: Any, device: torch.device, group: Any, gates: Any,
          oracles: frozenset[Oracle], hold: Hold) -> tuple[float, float]:
    """Run every scenario once: (wall s, this process's CPU s); each example
    ends in a synchronize. CPU time moves less than wall time on a shared host."""
    options = RunOptions(oracles=oracles, hold=hold)
    t0, c0 = time.perf_counter(), time.process_time()
    for scn in batch:
        streams = CudaStreams(device, gates) if device.type == "cuda" else SimStreams()
        obs = run_on_rank(scn, factory, RankEnv(rank=0, world_size=1, device=device,
                                                group=group, streams=streams), options)
        if obs.findings:
            raise SystemExit(f"a finding on a correct target: {obs.findings[0]}")
    return time.perf_counter() - t0, time.process_time() - c0


def _paired_round(batch: list[Any], factory: Any, device: torch.device, group: Any,
                  gates: Any, hold: Hold) -> dict[str, tuple[float, float]]:
    """One round: each scenario under every oracle set in turn, the order
    alternating from one scenario to the next; (wall s, CPU s) summed per set.
    A slow spell of a shared host (seconds long) then falls on both sets alike,
    where whole passes one after the other each caught a different spell."""
    totals = {name: [0.0, 0.0] for name in MODES}
    names = list(MODES)
    for i, scn in enumerate(batch):
        for name in (names if i % 2 == 0 else names[::-1]):
            wall, cpu = _pass([scn], factory, device, group, gates, MODES[name], hold)
            totals[name][0] += wall
            totals[name][1] += cpu
    return {name: (wall, cpu) for name, (wall, cpu) in totals.items()}


@contextlib.contextmanager
def _counting(counts: Counter) -> Iterator[None]:
    """Count what the checker handles: ops, polls, trace callbacks, storages."""
    patched: list[tuple[Any, str, Any]] = []

    def wrap(cls: Any, name: str, key: str) -> None:
        original = cls.__dict__[name]

        def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
            counts[key] += 1
            return original(self, *args, **kwargs)
        patched.append((cls, name, original))
        setattr(cls, name, counted)

    op = lifetime.TensorTracker.op

    def named(self: Any, func: Any, *args: Any) -> Any:  # every op, and by overload
        counts["ops"] += 1
        counts[f"op {func}"] += 1
        return op(self, func, *args)
    patched.append((lifetime.TensorTracker, "op", op))
    lifetime.TensorTracker.op = named  # type: ignore[method-assign]
    wrap(lifetime.TensorTracker, "poll", "polls")
    wrap(lifetime.LifetimeModel, "allocate", "storages")
    if torch.cuda.is_available():
        from streamfuzz.fuzz.oracles import lifetime_cuda

        for name in ("_on_event_record", "_on_event_wait", "_on_event_sync", "_on_stream_sync",
                     "_on_device_sync", "_on_record_stream"):
            wrap(lifetime_cuda.CudaLifetimeChecker, name, "trace callbacks")
    try:
        yield
    finally:
        for cls, name, original in patched:
            setattr(cls, name, original)


def main(argv: list[str] | None = None) -> int:
    p = _script.parser(__doc__)
    p.add_argument("--target", default="main-gather", help="a correct target (default main-gather)")
    p.add_argument("--examples", type=int, default=60, help="scenarios per pass (default 60)")
    p.add_argument("--rounds", type=int, default=7, help="rounds (default 7)")
    p.add_argument("--seed", type=int, default=1234)
    args = p.parse_args(argv)
    bad = _script.error(args.device, examples=args.examples, rounds=args.rounds)
    if bad:
        print(bad, file=sys.stderr)
        return 2
    if args.target not in targets.CORRECT:
        print(f"--target must be a correct built-in target: {', '.join(sorted(targets.CORRECT))}",
              file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    device_kind = _script.device_kind(args.device)
    device, group, gates, gate_kind = _script.one_rank_group(device_kind)
    hold = Hold.GATE if gates is not None else Hold.SPIN
    factory = targets.load(args.target)
    rng = random.Random(args.seed)
    batch = [random_scenario(rng, 1) for _ in range(args.examples)]

    for oracles in MODES.values():  # warm-up: imports, kernels, allocator, caches
        _pass(batch, factory, device, group, gates, oracles, hold)
    ms: dict[str, list[float]] = {name: [] for name in MODES}
    cpu_ms: dict[str, list[float]] = {name: [] for name in MODES}
    for _ in range(args.rounds):
        for name, (wall, cpu) in _paired_round(batch, factory, device, group, gates,
                                               hold).items():
            ms[name].append(1000 * wall / len(batch))
            cpu_ms[name].append(1000 * cpu / len(batch))
    cost = [a - b for a, b in zip(ms["all"], ms["value+reuse"], strict=True)]
    cpu_cost = [a - b for a, b in zip(cpu_ms["all"], cpu_ms["value+reuse"], strict=True)]

    counts: Counter = Counter()
    with _counting(counts):
        _pass(batch, factory, device, group, gates, MODES["all"], hold)
    ops = {k[3:]: round(v / len(batch), 2) for k, v in counts.most_common() if k[:3] == "op "}
    per_example = {k: round(v / len(batch), 1) for k, v in sorted(counts.items())
                   if k[:3] != "op "}

    text = io.StringIO()
    for name in ("all", "value+reuse"):
        prof = cProfile.Profile()
        prof.enable()
        _pass(batch, factory, device, group, gates, MODES[name], hold)
        prof.disable()
        for order in ("tottime", "cumulative"):
            text.write(f"== {name}, by {order} ({len(batch)} examples) ==\n")
            pstats.Stats(prof, stream=text).sort_stats(order).print_stats(40)
    (args.out / "profile.txt").write_text(text.getvalue())

    report = {
        "device": device_kind,
        "device_name": torch.cuda.get_device_name(device) if device_kind == "cuda" else
        platform.processor() or platform.machine(),
        "torch": torch.__version__, "python": platform.python_version(),
        "host": platform.node(), "gates": gate_kind, "hold": hold.value, "target": args.target,
        "examples": len(batch), "rounds": args.rounds, "seed": args.seed,
        "ms_per_example": {k: [round(x, 3) for x in v] for k, v in ms.items()},
        "median_ms_per_example": {k: round(statistics.median(v), 3) for k, v in ms.items()},
        "lifetime_ms_per_example": round(statistics.median(cost), 3),
        "lifetime_ms_per_round": [round(c, 3) for c in cost],
        "cpu_ms_per_example": {k: [round(x, 3) for x in v] for k, v in cpu_ms.items()},
        "lifetime_cpu_ms_per_example": round(statistics.median(cpu_cost), 3),
        "handled_per_example": per_example,
        "ops_per_example": ops,
    }
    lines = [f"# Lifetime oracle cost: {report['device_name']} ({device_kind}), torch "
             f"{report['torch']}, gates: {gate_kind}", "",
             f"{len(batch)} random scenarios of `{args.target}` (world size 1, seed {args.seed}),"
             f" {args.rounds} rounds, each scenario with both oracle sets in turn, median ms per"
             " example:", "",
             "| clock | value+reuse | all | lifetime (all - value+reuse) | rounds of lifetime |",
             "|---|---|---|---|---|",
             *(f"| {clock} | {statistics.median(table['value+reuse']):.2f} | "
               f"{statistics.median(table['all']):.2f} | {statistics.median(diff):.2f} | "
               f"{', '.join(f'{c:.2f}' for c in diff)} |"
               for clock, table, diff in (("wall", ms, cost), ("process CPU", cpu_ms, cpu_cost))),
             "",
             "Handled per example (one untimed pass): " +
             ", ".join(f"{k} {v}" for k, v in per_example.items()), "",
             "Ops per example, by overload: " +
             ", ".join(f"`{k}` {v}" for k, v in list(ops.items())[:15]), ""]
    _script.write_report(args.out, "lifetime_cost", report, lines)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
