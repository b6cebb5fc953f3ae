"""One rank's side of one example: a miniature model runner around the handler.

It makes each step's batch the way the real runner does (fresh device tensors
copied on the main stream from pinned memory), runs the drafter on the last
rank, calls the handler, drops every reference to the batch, then applies the
scenario's delays and allocation churn. Outputs are copied on the main stream
and read only after a final synchronize, so the harness adds no ordering of its
own between the streams — except what a scenario's gates ask for.

Options (``fuzz.options.RunOptions``, from the driver, unchanged) say how
delays hold streams and which rank-side oracles run; the observations say
back which oracles ran (``oracles``) and how streams were actually held
(``held``: ``gate``, ``gate-timeout`` (a gate nobody opened in time),
``spin``, ``none``).
"""

from __future__ import annotations

import dataclasses
from collections import Counter, deque
from typing import Any

import torch

from fuzz import stages
from fuzz.dispatch_mode import unobserved
from fuzz.draft import LAST_RANK, OTHER_RANKS, PROTOCOL, DraftObservations
from fuzz.draft.reference import Applied, draft_rows, token_rows
from fuzz.draft.scenario import GATE_UNTIL, ITEMSIZE, Scenario, Step, spin_cycles
from fuzz.options import DEFAULT, Hold, Oracle, RunOptions
from fuzz.oracles.lifetime import DEVICE, PINNED
from fuzz.protocol import check_handler, make_handler
from fuzz.targets import Batch, Factory, TargetContext

_DTYPES = {name: getattr(torch, name) for name in ITEMSIZE}
_UNTIL_ORDER = {until: rank for rank, until in enumerate(GATE_UNTIL) if until}
"""A gate's release point ranked in step order (1 after the call ... 3 before the next)."""


def run_scenario(scenario: Scenario, factory: Factory, ctx: TargetContext,
                 options: RunOptions = DEFAULT,
                 calls: Counter[str] | None = None) -> DraftObservations:
    """Run every step on this rank; returns its observations for the oracles.

    ``options`` come from the driver unchanged (which oracles run on the rank,
    how streams are held); rank-side oracles add their ``findings``. Each
    handler call is counted in ``calls`` before it is made (``RankEnv.calls``).
    """
    streams = ctx.streams
    if streams.kind == "sim" and ctx.device.type == "cpu":
        # Simulated streams stand for a CUDA device: a target allocates on it.
        ctx = dataclasses.replace(ctx, device=streams.device)
    with streams.session():
        return _Run(scenario, factory, ctx, options, calls).run()


def lifetime_checker(ctx: Any, options: RunOptions) -> Any:
    """The lifetime oracle for a protocol context's streams (any context with
    ``streams`` and ``rank``), or None when it is off."""
    if not options.runs(Oracle.LIFETIME):
        return None
    if ctx.streams.kind == "sim":
        from fuzz.oracles.lifetime import LifetimeChecker

        return LifetimeChecker(ctx.streams, rank=ctx.rank, group_rank=ctx.rank).attach()
    # Imported only here: a mistake in the CUDA adapter cannot break CPU runs.
    from fuzz.oracles.lifetime_cuda import CudaLifetimeChecker

    return CudaLifetimeChecker(ctx.streams, rank=ctx.rank, group_rank=ctx.rank).attach()


class _Staging:
    """Page-locked host memory the runner copies each example's batch from.

    Registered with CUDA once per rank (``cudaHostRegister``), where a fresh
    ``pin_memory()`` per tensor went through the caching host allocator: an
    allocation, and an event recorded at every copy out of it (each event
    one more trace callback for the oracles). Slices are handed out in order
    and reused only once the example's final synchronize has run; an example
    that ended without one synchronizes before the next reuses them. Where
    registering fails, the runner pins each tensor as before.
    """

    _BYTES = 1 << 20
    _by_device: dict[Any, _Staging | None] = {}

    def __init__(self) -> None:
        self._buf = torch.empty(self._BYTES, dtype=torch.uint8)
        self._used = 0

    @classmethod
    def begin(cls, device: torch.device) -> _Staging | None:
        """This device's staging, empty, for a new example; None where registering failed."""
        if device not in cls._by_device:
            cls._by_device[device] = cls._make(device)
        staging = cls._by_device[device]
        if staging is not None and staging._used:
            torch.cuda.synchronize(device)  # the last example's copies may still read it
            staging.done()
        return staging

    @classmethod
    def _make(cls, device: torch.device) -> _Staging | None:
        staging = cls()
        try:
            err = torch.cuda.cudart().cudaHostRegister(staging._buf.data_ptr(), cls._BYTES, 0)
        except Exception:  # no runtime binding in this torch
            return None
        return staging if int(err) == 0 and staging._buf.is_pinned() else None

    def put(self, host: torch.Tensor) -> torch.Tensor | None:
        """``host`` copied into the next slice, or None when the slices are used up."""
        n = host.numel() * host.element_size()
        if self._used + n > self._BYTES:
            return None
        view = self._buf[self._used:self._used + n].view(host.dtype).view(host.shape)
        view.copy_(host)
        self._used += (n + 15) & ~15  # the next slice 16-byte aligned, for any dtype
        return view

    def done(self) -> None:
        """After a synchronize: every slice is free again."""
        self._used = 0


class _Run:
    def __init__(self, scenario: Scenario, factory: Factory, ctx: TargetContext,
                 options: RunOptions, calls: Counter[str] | None = None) -> None:
        self.sc = scenario
        self.calls = Counter() if calls is None else calls
        self.options = options
        self.ctx = ctx
        self.streams = ctx.streams
        self.dev = ctx.device
        # The harness's own ops (``_unseen``) run outside the simulation, on
        # the CPU tensors that stand for device memory there.
        self.memory = self.streams.memory if self.streams.kind == "sim" else None
        self.raw_dev = torch.device("cpu") if self.memory is not None else self.dev
        self.staging = _Staging.begin(self.dev) if self.dev.type == "cuda" and (
            self.memory is None) else None
        self.main = self.streams.current_stream()
        self.checker = lifetime_checker(ctx, options)
        self.streams.hold_polls(0)  # none held before the first step
        self.handler = make_handler(factory, ctx)
        check_handler(PROTOCOL, self.handler, LAST_RANK if ctx.is_last_rank else OTHER_RANKS)
        k = scenario.num_spec_steps
        self.table = torch.zeros((scenario.max_num_reqs, k), dtype=torch.int64, device=self.dev)
        self._name(self.table, "draft_table")
        self.sent: list[tuple[int, torch.Tensor]] = []
        self.applied: list[tuple[int, tuple[torch.Tensor, ...]]] = []
        self.parked: deque[int] = deque()
        self.held: set[str] = set()
        self.values = options.values
        self.gates = self.streams.gates if options.hold is Hold.GATE else None
        # Gates not yet opened: (gate, until, stream that opens it, step placed).
        self.open: list[tuple[Any, str, Any, int]] = []
        self.step = 0
        self.watch = None
        if options.runs(Oracle.REUSE) and self.streams.kind == "cuda":
            from fuzz.oracles.reuse import ReuseWatch

            self.watch = ReuseWatch(self.main, ctx.rank)
            if self.checker is not None:
                self.watch.share(self.checker.mode)

    def run(self) -> DraftObservations:
        last = self.ctx.is_last_rank
        try:
            for i, step in enumerate(self.sc.steps):
                self.step = i
                if self.checker is not None:
                    self.checker.step = i
                if self.watch is not None:
                    self.watch.step = i
                if not last:
                    self._release(3, before_step=i)
                    self._apply_due(i)
                self.streams.hold_polls(step.pending_polls)
                self._delays(step, "pre_call")
                self._call(i, step)
                self._release(1)
                self._delays(step, "post_call")
                self._churn(step)
                self._release(2)
            self._release(3, before_step=len(self.sc.steps))
            if not last:
                self._apply_due(None)
            stages.enter(stages.HOST_WAIT)
            self.streams.synchronize()
            stages.leave()
            if self.staging is not None:
                self.staging.done()
            for gate, *_ in self.open:
                gate.release()
            if self.gates is not None and self.streams.gates.finish_example():
                self.held.add("gate-timeout")
            findings = self.watch.findings if self.watch is not None else []
            if self.checker is not None:
                stages.enter(stages.LIFETIME)
                findings = self.checker.finish() + findings
                stages.leave()
            with _HarnessReads():
                # The outputs, once the oracles are done: read as the harness's own.
                sent = [(i, t.tolist()) for i, t in self.sent]
                applied = [Applied(i, *[t.tolist() for t in ts]) for i, ts in self.applied]
            return DraftObservations(
                rank=self.ctx.rank, held=tuple(sorted(self.held)),
                oracles=tuple(self.options.oracle_names()), findings=tuple(findings),
                sent=sent, applied=applied,
                applies_non_final=getattr(self.handler, "applies_non_final", True))
        finally:
            # Nothing is ever left held: on an error, open every gate from the host.
            for gate, *_ in self.open:
                gate.release()
            if self.checker is not None:
                self.checker.detach()

    def _name(self, t: torch.Tensor | None, name: str) -> None:
        """Name a storage for the lifetime oracle's reports; keeps no reference."""
        if self.checker is not None and t is not None:
            self.checker.name(t, name, self.main)

    # -- the step -----------------------------------------------------------
    def _call(self, i: int, step: Step) -> None:
        batch = self._batch(i, step)
        if self.ctx.is_last_rank:
            if step.num_reqs:
                self._drafter(i, step, batch.idx_mapping)
            # Earlier steps' gates held "until the next call": after this drafter.
            self._release(3, before_step=i)
            self.calls["broadcast_drafts"] += 1
            if self.watch is not None:
                with self.watch.call():
                    out = self.handler.broadcast_drafts(self.table, batch)
            else:
                out = self.handler.broadcast_drafts(self.table, batch)
            if out is not None and self.values:
                self.sent.append((i, out))
        elif self.watch is not None:
            self.calls["receive_drafts"] += 1
            with self.watch.call():
                self.handler.receive_drafts(batch)
            if step.broadcasts:
                self.parked.append(i)
        else:
            self.calls["receive_drafts"] += 1
            self.handler.receive_drafts(batch)
            if step.broadcasts:
                self.parked.append(i)
        # The runner keeps nothing of the batch once the call returns.
        del batch
        if self.checker is not None:
            self.checker.poll()  # so a report's free frame is this line, not a later op

    def _apply_due(self, now: int | None) -> None:
        depth = self.sc.pipeline_depth
        while self.parked and (now is None or self.parked[0] + depth <= now):
            i = self.parked.popleft()
            self.calls["apply_received"] += 1
            received = self.handler.apply_received(self.table)
            # A runner reads what it received, on main, then drops it: these
            # copies are that read, whatever the oracles (without them nothing
            # would use the received tensors on main, and a missing
            # record_stream(main) on them could not show). Ordered after the
            # apply, never after the side stream.
            copies = tuple(t.clone() for t in received)
            if self.values:
                self.applied.append((i, (self.table.clone(),) + copies))

    def _batch(self, i: int, step: Step) -> Batch:
        k = self.sc.num_spec_steps
        idx = self._to_device(list(step.idx_mapping), _DTYPES[step.idx_dtype],
                              name="idx_mapping")
        batch = Batch(step=i, idx_mapping=idx, final=list(step.final),
                      host_idx_mapping=tuple(step.idx_mapping))
        if self.ctx.is_last_rank:
            rows = token_rows(i, step, k) if step.num_reqs else []
            batch.sampled_tokens = self._to_device(rows, torch.int64, (step.num_reqs, k + 1),
                                                   name="sampled_tokens")
            batch.num_sampled = self._to_device(list(step.num_sampled), torch.int32,
                                                name="num_sampled")
            batch.num_rejected = self._to_device(list(step.num_rejected), torch.int32,
                                                 name="num_rejected")
        if self.watch is not None:
            for name in ("idx_mapping", "sampled_tokens", "num_sampled", "num_rejected"):
                t = getattr(batch, name)
                if t is not None:
                    self.watch.check(t, f"step {i}'s {name}")
        return batch

    def _to_device(self, values: list, dtype: torch.dtype, shape: tuple | None = None,
                   name: str | None = None) -> torch.Tensor:
        """A fresh device tensor, copied non-blocking on the current stream
        from pinned memory that is the harness's (making it is unseen). With
        a ``name`` the oracles see the tensor made, a write on the current
        stream: the simulation sees the copy itself (stream work there,
        ordered with held streams); on CUDA the copy runs unseen and the
        lifetime oracle is handed its result, so the runner's own
        copies make no trip through the oracle's dispatch mode."""
        with _unseen():
            host = torch.tensor(values, dtype=dtype)
            if shape is not None:
                host = host.reshape(shape)
            if self.memory is None:
                staged = self.staging.put(host) if self.staging is not None else None
                host = staged if staged is not None else host.pin_memory()
                made = host.to(self.dev, non_blocking=True)
            elif name is None:
                return host  # the simulation's device memory is CPU memory
        if self.memory is not None:
            self.memory.mark(host, PINNED)
            made = host.to(self.dev, non_blocking=True)
        if name is not None and self.checker is not None:
            # Called from here, so that the frames a report shows start at this line.
            self.checker.name(made, name, self.main, made_by="aten._to_copy")
        return made

    def _drafter(self, i: int, step: Step, idx: torch.Tensor) -> None:
        """The draft model writing this step's rows (``reference.draft_rows``)
        on the main stream. The oracles see the write (what a race can
        involve); the rows' own copy from the host is the harness's, unseen."""
        k = self.sc.num_spec_steps
        rows = self._to_device(draft_rows(i, step, k), torch.int64, (step.num_reqs, k))
        if self.memory is not None:
            self.memory.mark(rows, DEVICE)
        self.table[idx] = rows

    # -- around the call ------------------------------------------------------
    def _stream(self, name: str) -> Any:
        if name == "main":
            return self.main
        created = self.streams.created
        return created[0] if created else None

    def _delays(self, step: Step, point: str) -> None:
        for d in step.delays:
            s = self._stream(d.stream)
            if d.point != point or s is None:
                continue
            if d.until and self.gates is not None:
                other = self._stream("side" if d.stream == "main" else "main")
                gate = self.streams.hold(s, other)
                if gate is not None:
                    self.open.append((gate, d.until, other, self.step))
                    self.held.add("gate")
                    continue
            cycles = spin_cycles(d.cycles, d.until)
            if cycles:
                self.held.add(self.streams.spin(s, cycles))

    def _release(self, upto: int, before_step: int | None = None) -> None:
        """Open the gates due by this point, in the opening stream's order.

        ``upto`` ranks the point (``_UNTIL_ORDER``); ``before_step`` limits it
        to gates placed in earlier steps (``before_next_call``).
        """
        if not self.open:
            return
        keep = []
        for entry in self.open:
            gate, until, other, placed = entry
            if _UNTIL_ORDER[until] > upto or (before_step is not None and placed >= before_step):
                keep.append(entry)
            elif other is None:
                gate.release()
            else:
                gate.release_after(other)
        self.open = keep

    def _churn(self, step: Step) -> None:
        """The runner's next allocations. Only their own stream touches them and
        the runner frees them, so no oracle can judge them: they are unseen
        (on a GPU they still take the caching allocator's blocks)."""
        if step.churn and self.checker is not None:
            # Where the first churn op would have seen what was freed since the call.
            self.checker.poll()
        kept = []
        for c in step.churn:
            s = self._stream(c.stream)
            with self.streams.stream(s), _unseen():
                t = torch.empty((c.numel,), dtype=_DTYPES[c.dtype], device=self.raw_dev)
                if self.watch is not None and c.stream == "main":
                    self.watch.check(t, "churn")
                t.fill_(c.fill)
            if c.keep:
                kept.append(t)
            del t
        kept.clear()


class _unseen:  # noqa: N801 - used as a context manager, like torch's own
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
        self._dispatch.__enter__()

    def __exit__(self, *exc: object) -> None:
        self._dispatch.__exit__(*exc)
        self._functions.__exit__(*exc)


class _HarnessReads:
    """The value oracle's reads of the outputs (``stages.VALUE``), outside every
    torch-function and dispatch mode: once the oracles have judged the example,
    routing each read through the simulation's and the oracles' bookkeeping
    costs per op and changes no verdict."""

    def __enter__(self) -> None:
        from torch.utils._python_dispatch import _disable_current_modes

        stages.enter(stages.VALUE)
        self._modes = _disable_current_modes()
        self._modes.__enter__()
        self._functions = torch._C.DisableTorchFunction()
        self._functions.__enter__()

    def __exit__(self, *exc: object) -> None:
        self._functions.__exit__(*exc)
        self._modes.__exit__(*exc)
        stages.leave()
