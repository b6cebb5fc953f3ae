"""The rank's side of one example, written once for every protocol.

A protocol's runner supplies the steps and what happens at each (``Hooks``);
``run_example`` does the rest in one order: the oracles attach, each step's
polls are held, its hooks run (holds, the call, releases), the churn runs
(unseen), then the final synchronize, the gates' timeouts and the oracles'
findings. The observations say which rank-side oracles really ran here: an
oracle that is asked for but cannot run on these streams (the reuse watch
off CUDA) is not claimed.

Holds are placed, released and timed out by ``Harness`` alone, so a protocol
only says which stream to hold, until when, and when that point is reached.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

import torch

from streamfuzz.fuzz import stages
from streamfuzz.fuzz.dispatch_mode import unobserved
from streamfuzz.fuzz.options import Hold, Oracle, RunOptions
from streamfuzz.fuzz.protocol.scenario import spin_cycles
from streamfuzz.fuzz.verdict import Failure

HELD_GATE, HELD_GATE_TIMEOUT = "gate", "gate-timeout"
"""How a stream was held, as ``Observations.held`` says: these, or a spin's own word."""


class Step(Protocol):
    """What the skeleton reads of a protocol's step."""

    @property
    def pending_polls(self) -> int: ...


class ChurnOp(Protocol):
    """One allocation the runner makes after the call (each protocol's ``Churn``)."""

    numel: int
    dtype: str
    fill: int
    keep: bool


class Hooks(Protocol):
    """A protocol's runner, as the skeleton drives it: ``steps`` in order,
    each ``before_step`` -> (its polls held) -> ``before_call`` -> ``call``
    -> ``after_call`` -> churn -> ``after_churn``; then ``after_steps``;
    then ``observations`` from what the run collected (read once the
    oracles are done)."""

    def steps(self) -> Sequence[Any]: ...
    def before_step(self, i: int, step: Any) -> None: ...
    def before_call(self, i: int, step: Any) -> None: ...
    def call(self, i: int, step: Any) -> None: ...
    def after_call(self, i: int, step: Any) -> None: ...
    def churn(self, step: Any) -> Iterable[tuple[ChurnOp, Any]]: ...
    def after_churn(self, i: int, step: Any) -> None: ...
    def after_steps(self) -> None: ...
    def observations(self, report: Report) -> Any: ...


@dataclass(frozen=True)
class Report:
    """What the skeleton hands a protocol's ``observations``: the fields every
    protocol's ``streamfuzz.fuzz.messages.Observations`` has."""

    rank: int
    held: tuple[str, ...]
    oracles: tuple[str, ...]
    findings: tuple[Failure, ...]

    def fields(self) -> dict[str, Any]:
        return {"rank": self.rank, "held": self.held, "oracles": self.oracles,
                "findings": self.findings}


def lifetime_checker(streams: Any, rank: int, options: RunOptions) -> Any:
    """The lifetime oracle for ``streams``, attached, or None when it is off."""
    if not options.runs(Oracle.LIFETIME):
        return None
    if streams.kind == "sim":
        from streamfuzz.fuzz.oracles.lifetime import LifetimeChecker

        return LifetimeChecker(streams, rank=rank, group_rank=rank).attach()
    # Imported only here: a mistake in the CUDA adapter cannot break CPU runs.
    from streamfuzz.fuzz.oracles.lifetime_cuda import CudaLifetimeChecker

    return CudaLifetimeChecker(streams, rank=rank, group_rank=rank).attach()


@dataclass
class _Open:
    gate: Any
    until: str
    opener: Any
    """The stream whose work up to the release point the gate waits for; None: the host."""
    placed: int


class Harness:
    """The oracles and holds of one example on one rank."""

    def __init__(self, streams: Any, rank: int, options: RunOptions) -> None:
        self.streams = streams
        self.rank = rank
        self.options = options
        self.main = streams.current_stream()
        # The harness's own ops (``unseen``) run outside the simulation, on
        # the CPU tensors that stand for device memory there.
        self.memory = streams.memory if streams.kind == "sim" else None
        self.raw_device = torch.device("cpu") if self.memory is not None else streams.device
        self.checker = lifetime_checker(streams, rank, options)
        self.watch: Any = None
        if options.runs(Oracle.REUSE) and streams.kind == "cuda":
            from streamfuzz.fuzz.oracles.reuse import ReuseWatch

            self.watch = ReuseWatch(self.main, rank)
            if self.checker is not None:
                self.watch.share(self.checker.mode)
        self.gates = streams.gates if options.hold is Hold.GATE else None
        self.open: list[_Open] = []
        self.held: set[str] = set()
        self.step = 0
        streams.hold_polls(0)  # none held before the first step

    def ran(self) -> tuple[str, ...]:
        """The oracles that judge this example: the rank-side ones attached
        here, and the value oracle, which the driver runs on the outputs."""
        ran = self.options.running_on("cuda" if self.streams.kind == "cuda" else "cpu")
        assert (Oracle.LIFETIME.value in ran) == (self.checker is not None)
        assert (Oracle.REUSE.value in ran) == (self.watch is not None)
        return tuple(ran)

    # -- per step ------------------------------------------------------------
    def begin_step(self, i: int) -> None:
        self.step = i
        if self.checker is not None:
            self.checker.step = i
        if self.watch is not None:
            self.watch.step = i

    def name(self, t: torch.Tensor | None, name: str, **how: Any) -> None:
        """Name a storage for the lifetime oracle's reports; keeps no reference."""
        if self.checker is not None and t is not None:
            self.checker.name(t, name, self.main, **how)

    def poll(self) -> None:
        """Let the lifetime oracle notice frees now, so that a report's free
        frame is the caller's line, not a later op."""
        if self.checker is not None:
            self.checker.poll()

    def calling(self) -> contextlib.AbstractContextManager[object]:
        """What a handler call runs under: the reuse watch, where it runs."""
        return self.watch.call() if self.watch is not None else contextlib.nullcontext()

    def fresh(self, t: torch.Tensor | None, what: str) -> None:
        """``t`` was just allocated on the main stream (the reuse watch's question)."""
        if self.watch is not None and t is not None:
            self.watch.check(t, what)

    # -- holds ---------------------------------------------------------------
    def hold(self, stream: Any, cycles: int, until: str, opener: Any = None) -> None:
        """Hold ``stream``: a gate opened at ``until`` (after ``opener``'s work
        up to that point, or by the host), where gates are on; else a spin."""
        if until and self.gates is not None:
            gate = self.streams.hold(stream, opener)
            if gate is not None:
                self.open.append(_Open(gate, until, opener, self.step))
                self.held.add(HELD_GATE)
                return
        spun = spin_cycles(cycles, until)
        if spun:  # with gates on, a spin that leaves the GPU free where it can
            self.held.add(self.streams.spin(stream, spun, idle=self.gates is not None))

    def release(self, due: Callable[[str, int], bool]) -> None:
        """Open the gates ``due(until, step placed)`` names, in placing order."""
        keep = []
        for o in self.open:
            if not due(o.until, o.placed):
                keep.append(o)
            elif o.opener is None:
                o.gate.release()
            else:
                o.gate.release_after(o.opener)
        self.open = keep

    def release_all(self) -> None:
        """From the host: nothing is ever left held."""
        for o in self.open:
            o.gate.release()
        self.open = []

    # -- churn ---------------------------------------------------------------
    def churn(self, ops: Iterable[tuple[ChurnOp, Any]], dtypes: dict[str, torch.dtype]) -> None:
        """The runner's next allocations, each on its stream. Only that stream
        touches them and the runner frees them, so no oracle can judge them:
        they are unseen (on a GPU they still take the caching allocator's
        blocks, which the reuse watch checks for main's)."""
        ops = list(ops)
        if ops:
            self.poll()  # where the first churn op would have seen what was freed since
        kept = []
        for c, stream in ops:
            with self.streams.stream(stream), unseen():
                t = torch.empty((c.numel,), dtype=dtypes[c.dtype], device=self.raw_device)
                if stream is self.main:
                    self.fresh(t, "churn")
                t.fill_(c.fill)
            if c.keep:
                kept.append(t)
            del t
        kept.clear()

    # -- the end -------------------------------------------------------------
    def finish(self) -> Report:
        """After the last step: synchronize, open every gate, then the
        gates' timeouts and the oracles' findings."""
        stages.enter(stages.HOST_WAIT)
        self.streams.synchronize()
        stages.leave()
        self.release_all()
        if self.gates is not None and self.streams.gates.finish_example():
            self.held.add(HELD_GATE_TIMEOUT)
        findings = list(self.watch.findings) if self.watch is not None else []
        if self.checker is not None:
            stages.enter(stages.LIFETIME)
            findings = self.checker.finish() + findings
            stages.leave()
        return Report(rank=self.rank, held=tuple(sorted(self.held)), oracles=self.ran(),
                      findings=tuple(findings))

    def detach(self) -> None:
        self.release_all()
        if self.checker is not None:
            self.checker.detach()


def run_example(harness: Harness, hooks: Hooks, dtypes: dict[str, torch.dtype]) -> Any:
    """Every step of ``hooks`` on this rank, under ``harness``; the observations."""
    try:
        for i, step in enumerate(hooks.steps()):
            harness.begin_step(i)
            hooks.before_step(i, step)
            harness.streams.hold_polls(step.pending_polls)
            hooks.before_call(i, step)
            hooks.call(i, step)
            hooks.after_call(i, step)
            harness.churn(hooks.churn(step), dtypes)
            hooks.after_churn(i, step)
        hooks.after_steps()
        report = harness.finish()
        with harness_reads():
            # The outputs, once the oracles are done: read as the harness's own.
            return hooks.observations(report)
    finally:
        harness.detach()


class unseen:  # noqa: N801 - used as a context manager, like torch's own
    """The harness's own ops, outside every torch-function and dispatch mode:
    not simulated, not seen by any oracle. Only for tensors no oracle could
    judge: no vector clock depends on them (each clock read joins the host's
    clock, which every later enqueue joins too), and a free their first op
    would have noticed is noticed at the same point of the same runner
    function (by the next op the oracles see, or by a poll)."""

    __slots__ = ("_functions", "_dispatch")

    def __enter__(self) -> None:
        self._functions = torch._C.DisableTorchFunction()
        self._functions.__enter__()
        self._dispatch = unobserved()
        self._dispatch.__enter__()  # type: ignore[no-untyped-call]  # torch's stub: untyped __enter__

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._dispatch.__exit__(exc_type, exc, tb)
        self._functions.__exit__(exc_type, exc, tb)


@contextlib.contextmanager
def harness_reads() -> Iterator[None]:
    """The value oracle's reads of the outputs (``stages.VALUE``), outside every
    torch-function and dispatch mode: once the oracles have judged the example,
    routing each read through the simulation's and the oracles' bookkeeping
    costs per op and changes no verdict."""
    from torch.utils._python_dispatch import _disable_current_modes

    stages.enter(stages.VALUE)
    try:
        with _disable_current_modes(), torch._C.DisableTorchFunction():
            yield
    finally:
        stages.leave()
