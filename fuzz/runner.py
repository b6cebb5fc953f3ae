"""One rank's side of one example: a miniature model runner around the handler.

It makes each step's batch the way the real runner does (fresh device tensors
copied on the main stream from pinned memory), runs the drafter on the last
rank, calls the handler, drops every reference to the batch, then applies the
scenario's delays and allocation churn. Outputs are copied on the main stream
and read only after a final synchronize, so the harness adds no ordering of its
own between the streams.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import torch

from fuzz.reference import token_rows
from fuzz.scenario import Scenario, Step
from fuzz.targets import Batch, Factory, TargetContext

_DTYPES = {"int32": torch.int32, "int64": torch.int64, "float32": torch.float32,
           "uint8": torch.uint8}


def run_scenario(scenario: Scenario, factory: Factory, ctx: TargetContext,
                 options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run every step on this rank; returns plain observations for the oracles.

    ``options`` come from the driver unchanged (which oracles run on the rank,
    how streams are held); rank-side oracles add their ``findings``.
    """
    streams = ctx.streams
    with streams.session():
        return _Run(scenario, factory, ctx, options or {}).run()


def _lifetime_checker(ctx: TargetContext, options: dict[str, Any]) -> Any:
    """The lifetime oracle for this rank's streams, or None when it is off."""
    if "lifetime" not in (options.get("oracles") or ()):
        return None
    if ctx.streams.kind == "sim":
        from fuzz.oracles.lifetime import LifetimeChecker

        return LifetimeChecker(ctx.streams, rank=ctx.rank, group_rank=ctx.rank).attach()
    # Imported only here: a mistake in the CUDA adapter cannot break CPU runs.
    from fuzz.oracles.lifetime_cuda import CudaLifetimeChecker

    return CudaLifetimeChecker(ctx.streams, rank=ctx.rank, group_rank=ctx.rank).attach()


class _Run:
    def __init__(self, scenario: Scenario, factory: Factory, ctx: TargetContext,
                 options: dict[str, Any]) -> None:
        self.sc = scenario
        self.options = options
        self.ctx = ctx
        self.streams = ctx.streams
        self.dev = ctx.device
        self.pin = ctx.device.type == "cuda"
        self.main = self.streams.current_stream()
        self.checker = _lifetime_checker(ctx, options)
        self.handler = factory(ctx)
        k = scenario.num_spec_steps
        self.table = torch.zeros((scenario.max_num_reqs, k), dtype=torch.int64, device=self.dev)
        self._name(self.table, "draft_table")
        self.sent: list[tuple[int, torch.Tensor]] = []
        self.applied: list[tuple[int, tuple[torch.Tensor, ...]]] = []
        self.parked: deque[int] = deque()
        self.held: list[str] = []

    def run(self) -> dict[str, Any]:
        try:
            return self._steps()
        finally:
            if self.checker is not None:
                self.checker.detach()

    def _steps(self) -> dict[str, Any]:
        for i, step in enumerate(self.sc.steps):
            if self.checker is not None:
                self.checker.step = i
            if not self.ctx.is_last_rank:
                self._apply_due(i)
            self._delays(step, "pre_call")
            self._call(i, step)
            self._delays(step, "post_call")
            self._churn(step)
        if not self.ctx.is_last_rank:
            self._apply_due(None)
        self.streams.synchronize()
        return {
            "rank": self.ctx.rank,
            "sent": [[i, t.tolist()] for i, t in self.sent],
            "applied": [[i] + [t.tolist() for t in ts] for i, ts in self.applied],
            "held": sorted(set(self.held)),
            "findings": self.checker.finish() if self.checker is not None else [],
        }

    def _name(self, t: torch.Tensor | None, name: str) -> None:
        """Name a storage for the lifetime oracle's reports; keeps no reference."""
        if self.checker is not None and t is not None:
            self.checker.name(t, name, self.main)

    # -- the step -----------------------------------------------------------
    def _call(self, i: int, step: Step) -> None:
        batch = self._batch(i, step)
        if self.ctx.is_last_rank:
            if step.num_reqs:
                self._drafter(i, batch.idx_mapping)
            out = self.handler.broadcast_drafts(self.table, batch)
            if out is not None:
                self.sent.append((i, out))
        else:
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
            received = self.handler.apply_received(self.table)
            # Copies on main: ordered after the apply, never after the side stream.
            snap = (self.table.clone(),) + tuple(t.clone() for t in received)
            self.applied.append((i, snap))

    def _batch(self, i: int, step: Step) -> Batch:
        k = self.sc.num_spec_steps
        idx = self._to_device(list(step.idx_mapping), _DTYPES[step.idx_dtype])
        batch = Batch(step=i, idx_mapping=idx, final=list(step.final))
        if self.ctx.is_last_rank:
            rows = token_rows(i, step, k) if step.num_reqs else []
            batch.sampled_tokens = self._to_device(rows, torch.int64, shape=(step.num_reqs, k + 1))
            batch.num_sampled = self._to_device(list(step.num_sampled), torch.int32)
            batch.num_rejected = self._to_device(list(step.num_rejected), torch.int32)
        for name in ("idx_mapping", "sampled_tokens", "num_sampled", "num_rejected"):
            self._name(getattr(batch, name), name)
        return batch

    def _to_device(self, values: list, dtype: torch.dtype,
                   shape: tuple | None = None) -> torch.Tensor:
        host = torch.tensor(values, dtype=dtype)
        if shape is not None:
            host = host.reshape(shape)
        if self.dev.type == "cpu":
            return host
        return host.pin_memory().to(self.dev, non_blocking=True)

    def _drafter(self, i: int, idx: torch.Tensor) -> None:
        """The draft model writing this step's rows, on the main stream."""
        k = self.sc.num_spec_steps
        pos = torch.arange(k, dtype=torch.int64, device=self.dev)
        rows = (i + 1) * 100_000 + idx.to(torch.int64).unsqueeze(1) * 16 + pos
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
            if d.point == point and s is not None and d.cycles:
                self.held.append(self.streams.spin(s, d.cycles))

    def _churn(self, step: Step) -> None:
        kept = []
        for c in step.churn:
            s = self._stream(c.stream)
            with self.streams.stream(s):
                t = torch.empty((c.numel,), dtype=_DTYPES[c.dtype], device=self.dev)
                t.fill_(c.fill)
            if c.keep:
                kept.append(t)
            del t
        kept.clear()
