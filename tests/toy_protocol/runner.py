"""The toy protocol's runner: hooks on ``streamfuzz.fuzz.protocol.runner``'s skeleton."""

from __future__ import annotations

from typing import Any

import torch

from streamfuzz.fuzz.protocol import RankEnv, check_handler, make_handler
from streamfuzz.fuzz.protocol.runner import Harness, Report, run_example
from tests.toy_protocol import FILLER, PROTOCOL, ToyObservations
from tests.toy_protocol.scenario import Fill, ToyScenario

DTYPES = {"int32": torch.int32}


def run_on_rank(scenario: ToyScenario, factory: Any, env: RankEnv, options: Any) -> Any:
    streams = env.streams
    device = streams.device if streams.kind == "sim" else env.device
    with streams.session():
        run = _Run(scenario, streams, device, env, options)
        run.handler = make_handler(factory, {"streams": streams, "device": device})
        check_handler(PROTOCOL, run.handler, FILLER)
        return run_example(run.h, run, DTYPES)


class _Run:
    def __init__(self, sc: ToyScenario, streams: Any, device: Any, env: RankEnv,
                 options: Any) -> None:
        self.sc, self.device, self.env = sc, device, env
        self.h = Harness(streams, env.rank, options)
        self.read: list[tuple[int, torch.Tensor]] = []
        self.handler: Any = None

    def steps(self) -> tuple[Fill, ...]:
        return self.sc.fills

    def before_step(self, i: int, fill: Fill) -> None:
        pass

    def before_call(self, i: int, fill: Fill) -> None:
        pass

    def call(self, i: int, fill: Fill) -> None:
        out = torch.zeros(fill.numel, dtype=torch.int32, device=self.device)
        self.h.name(out, f"out{i}")
        self.env.calls["fill"] += 1
        with self.h.calling():
            self.handler.fill(out, i + 1)
        self.read.append((i, out.clone()))  # the caller reads it on its stream

    def after_call(self, i: int, fill: Fill) -> None:
        pass

    def churn(self, fill: Fill) -> list[tuple[Any, Any]]:
        return [(c, self.h.main) for c in fill.churn]

    def after_churn(self, i: int, fill: Fill) -> None:
        pass

    def after_steps(self) -> None:
        pass

    def observations(self, report: Report) -> ToyObservations:
        return ToyObservations(**report.fields(),
                               read=[(i, t.tolist()) for i, t in self.read])
