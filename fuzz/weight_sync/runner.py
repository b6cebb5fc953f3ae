"""One rank's side of a weight-sync example: a miniature trainer or worker.

Every rank makes its parameters (initial values, then one host sync: setup
is not under test). Per sync: holds go on the caller's stream; the producer
(group rank 0) writes the parameters this sync's optimizer step writes, on
its current stream, and calls ``handler.send``; the consumers call
``handler.receive`` and copy the received parameters aside on the caller's
stream. Then the churn, on the caller's stream. The skeleton
(``streamfuzz.fuzz.protocol.runner``) holds, releases, churns and reads the outputs
after one final synchronize: the harness adds no ordering between the
streams beyond what a scenario's gates ask for.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch

from streamfuzz.fuzz.options import RunOptions
from streamfuzz.fuzz.protocol import RankEnv, check_handler, make_handler
from streamfuzz.fuzz.protocol.runner import Harness, Report, run_example
from streamfuzz.fuzz.weight_sync import CONSUMERS, PRODUCER, PROTOCOL, WeightSyncObservations
from streamfuzz.fuzz.weight_sync.group import Group, WeightSyncContext
from streamfuzz.fuzz.weight_sync.reference import TORCH_DTYPES, values
from streamfuzz.fuzz.weight_sync.scenario import Sync, WeightSyncScenario

BROADCAST, AFTER_CALL = "broadcast", "after_call"
"""Where a hold's gate opens (``streamfuzz.fuzz.weight_sync.scenario.HOLD_UNTIL``)."""


def run_on_rank(scenario: WeightSyncScenario, factory: Any, env: RankEnv,
                options: RunOptions) -> WeightSyncObservations:
    """Run every sync on this rank; returns its observations for the oracles."""
    streams = env.streams
    device = streams.device if streams.kind == "sim" else env.device
    group = Group(env.group, env.rank)
    ctx = WeightSyncContext(rank=env.rank, world_size=env.world_size, device=device,
                            group=group, buffer_bytes=scenario.buffer_bytes,
                            num_buffers=scenario.num_buffers, streams=streams)
    with streams.session():
        run = _Run(scenario, ctx, options, env.calls)
        try:
            run.start(factory)
        except BaseException:
            run.h.detach()
            raise
        return run_example(run.h, run, TORCH_DTYPES)


class _Run:
    """The weight sync's hooks (``streamfuzz.fuzz.protocol.runner.Hooks``)."""

    def __init__(self, sc: WeightSyncScenario, ctx: WeightSyncContext,
                 options: RunOptions, calls: Counter[str]) -> None:
        self.sc, self.ctx, self.calls = sc, ctx, calls
        self.h = Harness(ctx.streams, ctx.rank, options)
        self.main = self.h.main
        self.params: list[torch.Tensor] = []
        self.sent: list[tuple[int, list[torch.Tensor]]] = []
        self.received: list[tuple[int, list[torch.Tensor]]] = []
        self.handler: Any = None

    def start(self, factory: Any) -> None:
        self.params = [values(-1, i, p, self.ctx.device) for i, p in enumerate(self.sc.params)]
        for i, t in enumerate(self.params):
            self.h.name(t, f"p{i}")
        self.ctx.streams.synchronize()
        self.ctx.streams.hold_polls(0)  # none held before the first sync
        self.handler = make_handler(factory, self.ctx)
        check_handler(PROTOCOL, self.handler, PRODUCER if self.ctx.is_producer else CONSUMERS)

    # -- the hooks -----------------------------------------------------------
    def steps(self) -> tuple[Sync, ...]:
        return self.sc.syncs

    def before_step(self, i: int, sync: Sync) -> None:
        pass

    def before_call(self, i: int, sync: Sync) -> None:
        for hold in sync.holds:  # the host opens each gate
            self.h.hold(self.main, hold.cycles, hold.until)

    def call(self, i: int, sync: Sync) -> None:
        group = self.ctx.group
        group.on_first = lambda: self._release(BROADCAST)
        if self.ctx.is_producer:
            self._optimizer_step(i, sync)
            self.calls["send"] += 1
            with self.h.calling():
                self.handler.send(iter([(f"p{j}", t) for j, t in enumerate(self.params)]))
            self.sent.append((i, group.sent))
            group.sent = []
        else:
            meta = [(f"p{j}", (list(p.shape), TORCH_DTYPES[p.dtype]))
                    for j, p in enumerate(self.sc.params)]
            self.calls["receive"] += 1
            with self.h.calling():
                self.handler.receive(iter(meta), self._load)
            self.received.append((i, [t.clone() for t in self.params]))

    def after_call(self, i: int, sync: Sync) -> None:
        self._release(AFTER_CALL)

    def churn(self, sync: Sync) -> list[tuple[Any, Any]]:
        return [(c, self.main) for c in sync.churn]

    def after_churn(self, i: int, sync: Sync) -> None:
        pass

    def after_steps(self) -> None:
        pass

    def observations(self, report: Report) -> WeightSyncObservations:
        return WeightSyncObservations(
            **report.fields(),
            sent=[(i, b"".join(_bytes(t) for t in ts)) for i, ts in self.sent],
            received=[(i, [_bytes(t) for t in ts]) for i, ts in self.received])

    # -- the sync -------------------------------------------------------------
    def _optimizer_step(self, i: int, sync: Sync) -> None:
        """The trainer's writes, on its current stream, queued behind its holds."""
        for j in sync.writes:
            self.params[j].copy_(values(i, j, self.sc.params[j], self.ctx.device))

    def _load(self, tensors: list[tuple[str, torch.Tensor]]) -> None:
        """The post-unpack callback: into this worker's own parameters, on the
        current stream (the one the consumer calls it on)."""
        self.calls["load"] += 1
        for name, t in tensors:
            self.params[int(name[1:])].copy_(t)

    def _release(self, until: str) -> None:
        """``after_call`` opens every gate still held; ``broadcast`` its own."""
        self.h.release(lambda u, placed: until == AFTER_CALL or u == until)


def _bytes(t: torch.Tensor) -> bytes:
    return t.detach().reshape(-1).view(torch.uint8).cpu().numpy().tobytes()
