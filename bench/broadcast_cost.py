"""What the lifetime oracle adds to one collective and to one plain op: a micro-bench.

The lifetime oracle on CUDA sees ops through a dispatch mode and stream
events through ``torch.cuda._gpu_trace``. Both reach into calls that never
return to Python on their own: a c10d broadcast runs its op through the
mode, and once the trace is on, every event record, wait and deletion (the
process group's own included) calls Python until the process ends. This
splits a call's host time into those parts, each measured alone, in this
order in one process (the trace cannot be switched off again):

* ``plain``: no mode, no trace;
* ``bare mode``: under a dispatch mode that only runs the op (the Python
  round trip every op pays under any mode);
* ``lifetime oracle``: the CUDA lifetime checker attached (mode, trace
  callbacks and the model's own work), CUDA only;
* ``plain, trace on``: no mode again, the trace left on by the checker,
  CUDA only: what every later op pays in a rank that ever ran the oracle;
* ``... behind a spin`` (CUDA only): each call made right after a
  ``SPIN``-cycle spin is queued on the same stream, its own host time only:
  a call that waits for the stream's earlier work (a host sync inside it)
  costs the spin here, one that only queues costs what it costs plain.

One rank (a one-rank group: NCCL on CUDA, gloo on CPU), median microseconds
per call over rounds, host wall time with a synchronize after each round.

    PYTHONPATH=. python bench/broadcast_cost.py --device auto --out reports/broadcast-cost
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import time
from collections.abc import Callable, Iterator

import _script  # bench/_script.py, beside this script
import torch
import torch.distributed as dist

from streamfuzz.fuzz.dispatch_mode import DispatchMode

CALLS = {
    "broadcast": lambda t, group: dist.broadcast(t, src=0, group=group),
    "add_": lambda t, group: t.add_(1),
    "empty": lambda t, group: torch.empty(64, device=t.device),
}
"""The calls timed: the collective the targets make, an in-place op, an allocation."""


class _Bare(DispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        return func(*args, **(kwargs or {}))


def _setup(device_kind: str) -> tuple[torch.device, dist.ProcessGroup]:
    if device_kind == "cuda":
        device = torch.device("cuda", 0)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1,
                                device_id=device)
        return device, dist.new_group(backend="nccl")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    return torch.device("cpu"), dist.new_group(backend="gloo")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _us_per_call(call: Callable, t: torch.Tensor, group: dist.ProcessGroup, calls: int,
                 rounds: int) -> float:
    out = []
    for _ in range(rounds):
        _sync(t.device)
        t0 = time.perf_counter()
        for _ in range(calls):
            call(t, group)
        _sync(t.device)
        out.append(1e6 * (time.perf_counter() - t0) / calls)
    return statistics.median(out)


SPIN = 2_000_000
"""Cycles of the spin queued before each call of a "behind a spin" row (about a millisecond)."""


def _us_behind_spin(call: Callable, t: torch.Tensor, group: dist.ProcessGroup, calls: int,
                    rounds: int) -> float:
    out = []
    for _ in range(rounds):
        _sync(t.device)
        spent = 0.0
        for _ in range(calls):
            torch.cuda._sleep(SPIN)
            t0 = time.perf_counter()
            call(t, group)
            spent += time.perf_counter() - t0
            _sync(t.device)
        out.append(1e6 * spent / calls)
    return statistics.median(out)


@contextlib.contextmanager
def _checker(device: torch.device) -> Iterator[None]:
    from streamfuzz.fuzz.oracles.lifetime_cuda import CudaLifetimeChecker
    from streamfuzz.fuzz.streams import CudaStreams

    checker = CudaLifetimeChecker(CudaStreams(device)).attach()
    try:
        yield
    finally:
        checker.detach()
        found = checker.finish()
        if found:
            raise SystemExit(f"the lifetime oracle found something: {found[0]}")


def main(argv: list[str] | None = None) -> int:
    p = _script.parser(__doc__)
    p.add_argument("--calls", type=int, default=200, help="calls per round (default 200)")
    p.add_argument("--rounds", type=int, default=7, help="rounds (default 7)")
    args = p.parse_args(argv)
    bad = _script.error(args.device, calls=args.calls, rounds=args.rounds)
    if bad:
        print(bad, file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    device_kind = _script.device_kind(args.device)
    device, group = _setup(device_kind)
    t = torch.zeros(16, dtype=torch.int64, device=device)
    conditions: dict[str, tuple[Callable[[], contextlib.AbstractContextManager], Callable]] = {
        "plain": (contextlib.nullcontext, _us_per_call), "bare mode": (_Bare, _us_per_call)}
    if device_kind == "cuda":
        conditions["lifetime oracle"] = (lambda: _checker(device), _us_per_call)
        conditions["lifetime oracle, behind a spin"] = (lambda: _checker(device),
                                                        _us_behind_spin)
        conditions["plain, trace on"] = (contextlib.nullcontext, _us_per_call)
        conditions["plain, trace on, behind a spin"] = (contextlib.nullcontext, _us_behind_spin)
    us: dict[str, dict[str, float]] = {}
    for condition, (enter, timed) in conditions.items():
        with enter():
            for call in CALLS.values():  # warm-up: first use, kernels, the group's streams
                call(t, group)
            us[condition] = {name: round(timed(call, t, group, args.calls, args.rounds), 2)
                             for name, call in CALLS.items()}
    report = {"device": device_kind, "device_name": torch.cuda.get_device_name(device)
              if device_kind == "cuda" else "cpu", "torch": torch.__version__,
              "calls": args.calls, "rounds": args.rounds, "us_per_call": us}
    lines = [f"# Host microseconds per call: {report['device_name']} ({device_kind}), torch "
             f"{report['torch']}", "", f"Median of {args.rounds} rounds of {args.calls} calls.",
             "", "| condition | " + " | ".join(CALLS) + " |",
             "|---|" + "---|" * len(CALLS),
             *(f"| {c} | " + " | ".join(f"{v:.1f}" for v in row.values()) + " |"
               for c, row in us.items()), ""]
    _script.write_report(args.out, "broadcast_cost", report, lines)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
