"""A third protocol, written only against ``streamfuzz.fuzz.protocol``: each rank's handler
fills a fresh tensor the runner made on its stream, and the runner reads it
back there. What adding a protocol takes, and all it takes: these modules and
one line (``streamfuzz.fuzz.protocol.ENV`` names ``tests.toy_protocol:PROTOCOL``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from streamfuzz.fuzz.messages import Observations
from streamfuzz.fuzz.protocol import Protocol

FILLER = "every rank"

PROTOCOL = Protocol(
    name="toy-fill",
    scenario="tests.toy_protocol.scenario:ToyScenario",
    strategy="tests.toy_protocol.scenario:toy_scenarios",
    run="tests.toy_protocol.runner:run_on_rank",
    values="tests.toy_protocol.scenario:check",
    behaviours="tests.toy_protocol.scenario:behaviours",
    smallest="tests.toy_protocol.scenario:smallest",
    versions={"toy-synced": "tests.toy_protocol.targets:synced"},
    mutants={"toy-unsynced": "tests.toy_protocol.targets:unsynced"},
    correct="toy-synced",
    handler_methods={FILLER: ("fill",)},
    alone=FILLER,
)


@dataclass(frozen=True)
class ToyObservations(Observations):
    read: list[tuple[int, list[int]]] = field(default_factory=list)
