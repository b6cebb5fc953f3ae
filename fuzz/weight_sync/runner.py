"""One rank's side of a weight-sync example: a miniature trainer or worker.

Every rank makes its parameters (initial values, then one host sync: setup
is not under test). Per sync: holds go on the caller's stream; the producer
(group rank 0) writes the parameters this sync's optimizer step writes, on
its current stream, and calls ``handler.send``; the consumers call
``handler.receive`` and copy the received parameters aside on the caller's
stream. Then the churn. What was sent and received is read after one final
synchronize: the harness adds no ordering between the streams beyond what a
scenario's gates ask for.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch

from fuzz.draft.runner import lifetime_checker
from fuzz.draft.scenario import spin_cycles
from fuzz.options import Hold as HoldMode
from fuzz.options import RunOptions
from fuzz.protocol import RankEnv, check_handler, make_handler
from fuzz.weight_sync import CONSUMERS, PRODUCER, PROTOCOL, WeightSyncObservations
from fuzz.weight_sync.context import Group, WeightSyncContext
from fuzz.weight_sync.reference import TORCH_DTYPES, values
from fuzz.weight_sync.scenario import Sync, WeightSyncScenario


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
        return _Run(scenario, factory, ctx, options, env.calls).run()


class _Run:
    def __init__(self, sc: WeightSyncScenario, factory: Any, ctx: WeightSyncContext,
                 options: RunOptions, calls: Counter[str]) -> None:
        self.sc, self.ctx, self.options, self.calls = sc, ctx, options, calls
        self.streams = ctx.streams
        self.main = self.streams.current_stream()
        self.gates = self.streams.gates if options.hold is HoldMode.GATE else None
        self.open: list[tuple[Any, str]] = []
        self.held: set[str] = set()
        self.checker = lifetime_checker(ctx, options)
        self.params = [values(-1, i, p, ctx.device) for i, p in enumerate(sc.params)]
        for i, t in enumerate(self.params):
            self._name(t, f"p{i}")
        self.streams.synchronize()
        self.streams.hold_polls(0)  # none held before the first sync
        self.handler = make_handler(factory, ctx)
        check_handler(PROTOCOL, self.handler, PRODUCER if ctx.is_producer else CONSUMERS)
        self.sent: list[tuple[int, list[torch.Tensor]]] = []
        self.received: list[tuple[int, list[torch.Tensor]]] = []

    def _name(self, t: torch.Tensor, name: str) -> None:
        if self.checker is not None:
            self.checker.name(t, name, self.main)

    def run(self) -> WeightSyncObservations:
        try:
            for i, sync in enumerate(self.sc.syncs):
                if self.checker is not None:
                    self.checker.step = i
                self.streams.hold_polls(sync.pending_polls)
                self._holds(sync)
                if self.ctx.is_producer:
                    self._optimizer_step(i, sync)
                    self.ctx.group.on_first = lambda: self._release("broadcast")
                    self.calls["send"] += 1
                    self.handler.send(iter([(f"p{j}", t) for j, t in enumerate(self.params)]))
                    self.sent.append((i, self.ctx.group.sent))
                    self.ctx.group.sent = []
                else:
                    self.ctx.group.on_first = lambda: self._release("broadcast")
                    meta = [(f"p{j}", (list(p.shape), TORCH_DTYPES[p.dtype]))
                            for j, p in enumerate(self.sc.params)]
                    self.calls["receive"] += 1
                    self.handler.receive(iter(meta), self._load)
                    self.received.append((i, [t.clone() for t in self.params]))
                self._release("broadcast")
                self._release("after_call")
                self._churn(sync)
            self.streams.synchronize()
            gates = self.streams.gates
            if gates is not None and gates.finish_example():
                self.held.add("gate-timeout")
            findings = self.checker.finish() if self.checker is not None else []
            return WeightSyncObservations(
                rank=self.ctx.rank, held=tuple(sorted(self.held)),
                oracles=tuple(self.options.oracle_names()), findings=tuple(findings),
                sent=[(i, b"".join(_bytes(t) for t in ts)) for i, ts in self.sent],
                received=[(i, [_bytes(t) for t in ts]) for i, ts in self.received])
        finally:
            for gate, _ in self.open:
                gate.release()
            if self.checker is not None:
                self.checker.detach()

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

    def _holds(self, sync: Sync) -> None:
        for h in sync.holds:
            if h.until and self.gates is not None:
                gate = self.streams.hold(self.main)
                if gate is not None:
                    self.open.append((gate, h.until))
                    self.held.add("gate")
                    continue
            cycles = spin_cycles(h.cycles, h.until)
            if cycles:
                self.held.add(self.streams.spin(self.main, cycles))

    def _release(self, until: str) -> None:
        keep = []
        for gate, u in self.open:
            if u == until or until == "after_call":
                gate.release()
            else:
                keep.append((gate, u))
        self.open = keep

    def _churn(self, sync: Sync) -> None:
        kept = []
        for c in sync.churn:
            t = torch.empty((c.numel,), dtype=TORCH_DTYPES[c.dtype], device=self.ctx.device)
            t.fill_(c.fill)
            if c.keep:
                kept.append(t)
            del t
        kept.clear()


def _bytes(t: torch.Tensor) -> bytes:
    return t.detach().reshape(-1).view(torch.uint8).cpu().numpy().tobytes()
