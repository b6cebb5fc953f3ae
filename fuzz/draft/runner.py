"""One rank's side of one draft-broadcast example: a miniature model runner around the handler.

It makes each step's batch the way the real runner does (fresh device tensors
copied on the main stream from pinned memory), runs the drafter on the last
rank, calls the handler, drops every reference to the batch; the skeleton
(``streamfuzz.fuzz.protocol.runner``) places the scenario's delays and runs its churn.
Outputs are copied on the main stream and read only after a final
synchronize, so the harness adds no ordering of its own between the streams
— except what a scenario's gates ask for.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, deque
from typing import Any

import torch

from streamfuzz.fuzz.draft import LAST_RANK, OTHER_RANKS, PROTOCOL, DraftObservations
from streamfuzz.fuzz.draft.context import Batch, Factory, TargetContext
from streamfuzz.fuzz.draft.reference import Applied, draft_rows, token_rows
from streamfuzz.fuzz.draft.scenario import GATE_UNTIL, ITEMSIZE, Scenario, Step
from streamfuzz.fuzz.options import DEFAULT, RunOptions
from streamfuzz.fuzz.protocol import RankEnv, check_handler, make_handler
from streamfuzz.fuzz.protocol.runner import Harness, Report, run_example, unseen
from streamfuzz.fuzz.tensors import DEVICE, PINNED

_DTYPES = {name: getattr(torch, name) for name in ITEMSIZE}
_UNTIL_ORDER = {until: rank for rank, until in enumerate(GATE_UNTIL) if until}
"""A gate's release point ranked in step order (``AFTER_CALL`` ... ``BEFORE_NEXT``)."""
AFTER_CALL, AFTER_CHURN, BEFORE_NEXT = 1, 2, 3


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
        run = _Run(scenario, ctx, options, calls)
        try:
            run.start(factory)
        except BaseException:
            run.h.detach()
            raise
        return run_example(run.h, run, _DTYPES)


def run_on_rank(scenario: Any, factory: Any, env: RankEnv, options: Any) -> DraftObservations:
    """``run_scenario`` with the draft broadcast's target context (the protocol's ``run``)."""
    ctx = TargetContext(rank=env.rank, world_size=env.world_size, last_rank=env.world_size - 1,
                        device=env.device, group=env.group, max_num_reqs=scenario.max_num_reqs,
                        num_spec_steps=scenario.num_spec_steps, streams=env.streams,
                        pipeline_depth=scenario.pipeline_depth)
    return run_scenario(scenario, factory, ctx, options, calls=env.calls)


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
    """The draft broadcast's hooks (``streamfuzz.fuzz.protocol.runner.Hooks``)."""

    def __init__(self, scenario: Scenario, ctx: TargetContext, options: RunOptions,
                 calls: Counter[str] | None = None) -> None:
        self.sc = scenario
        self.calls = Counter() if calls is None else calls
        self.ctx = ctx
        self.streams = ctx.streams
        self.dev = ctx.device
        self.h = Harness(self.streams, ctx.rank, options)
        self.memory = self.h.memory
        self.staging = _Staging.begin(self.dev) if self.dev.type == "cuda" and (
            self.memory is None) else None
        self.main = self.h.main
        self.sent: list[tuple[int, torch.Tensor]] = []
        self.applied: list[tuple[int, tuple[torch.Tensor, ...]]] = []
        self.parked: deque[int] = deque()
        self.values = options.values
        self.handler: Any = None

    def start(self, factory: Factory) -> None:
        self.handler = make_handler(factory, self.ctx)
        check_handler(PROTOCOL, self.handler,
                      LAST_RANK if self.ctx.is_last_rank else OTHER_RANKS)
        k = self.sc.num_spec_steps
        self.table = torch.zeros((self.sc.max_num_reqs, k), dtype=torch.int64, device=self.dev)
        self.h.name(self.table, "draft_table")

    # -- the hooks -----------------------------------------------------------
    def steps(self) -> tuple[Step, ...]:
        return self.sc.steps

    def before_step(self, i: int, step: Step) -> None:
        if not self.ctx.is_last_rank:
            self._release(BEFORE_NEXT, before_step=i)
            self._apply_due(i)

    def before_call(self, i: int, step: Step) -> None:
        self._delays(step, "pre_call")

    def after_call(self, i: int, step: Step) -> None:
        self._release(AFTER_CALL)
        self._delays(step, "post_call")

    def churn(self, step: Step) -> list[tuple[Any, Any]]:
        return [(c, self._stream(c.stream)) for c in step.churn]

    def after_churn(self, i: int, step: Step) -> None:
        self._release(AFTER_CHURN)

    def after_steps(self) -> None:
        self._release(BEFORE_NEXT, before_step=len(self.sc.steps))
        if not self.ctx.is_last_rank:
            self._apply_due(None)

    def observations(self, report: Report) -> DraftObservations:
        if self.staging is not None:
            self.staging.done()
        sent = [(i, t.tolist()) for i, t in self.sent]
        applied = [Applied(i, *[t.tolist() for t in ts]) for i, ts in self.applied]
        return DraftObservations(
            **report.fields(), sent=sent, applied=applied,
            applies_non_final=getattr(self.handler, "applies_non_final", True))

    # -- the step -----------------------------------------------------------
    def call(self, i: int, step: Step) -> None:
        batch = self._batch(i, step)
        if self.ctx.is_last_rank:
            if step.num_reqs:
                self._drafter(i, step, batch.idx_mapping)
            # Earlier steps' gates held "until the next call": after this drafter.
            self._release(BEFORE_NEXT, before_step=i)
            self.calls["broadcast_drafts"] += 1
            with self.h.calling():
                out = self.handler.broadcast_drafts(self.table, batch)
            if out is not None and self.values:
                self.sent.append((i, out))
        else:
            self.calls["receive_drafts"] += 1
            with self.h.calling():
                self.handler.receive_drafts(batch)
            if step.broadcasts:
                self.parked.append(i)
        # The runner keeps nothing of the batch once the call returns.
        del batch
        self.h.poll()  # so a report's free frame is this line, not a later op

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
        for name in ("idx_mapping", "sampled_tokens", "num_sampled", "num_rejected"):
            self.h.fresh(getattr(batch, name), f"step {i}'s {name}")
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
        with unseen():
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
        if name is not None:
            # Called from here, so that the frames a report shows start at this line.
            self.h.name(made, name, made_by="aten._to_copy")
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
            other = self._stream("side" if d.stream == "main" else "main")
            self.h.hold(s, d.cycles, d.until, opener=other)

    def _release(self, upto: int, before_step: int | None = None) -> None:
        """Open the gates due by this point, in the opening stream's order.

        ``upto`` ranks the point (``_UNTIL_ORDER``); ``before_step`` limits it
        to gates placed in earlier steps (``before_next_call``).
        """
        self.h.release(lambda until, placed: _UNTIL_ORDER[until] <= upto and (
            before_step is None or placed < before_step))
