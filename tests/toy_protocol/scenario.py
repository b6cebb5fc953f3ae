"""The toy protocol's scenario, strategy, reference and behaviours."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from hypothesis import strategies as st

from streamfuzz.fuzz.protocol.scenario import check as ensure
from streamfuzz.fuzz.protocol.scenario import fields_of, plain
from streamfuzz.fuzz.verdict import Failure


@dataclass(frozen=True)
class Churn:
    numel: int = 1
    dtype: str = "int32"
    fill: int = 0
    keep: bool = False


@dataclass(frozen=True)
class Fill:
    numel: int = 1
    churn: tuple[Churn, ...] = ()

    @property
    def pending_polls(self) -> int:
        return 0


@dataclass(frozen=True)
class ToyScenario:
    world_size: int = 1
    fills: tuple[Fill, ...] = field(default_factory=lambda: (Fill(),))

    def to_dict(self) -> dict[str, Any]:
        return plain(asdict(self))

    @classmethod
    def from_dict(cls, data: Any) -> ToyScenario:
        d = fields_of(data, cls, "scenario")
        fills = tuple(Fill(numel=f["numel"], churn=tuple(Churn(**c) for c in f.get("churn", ())))
                      for f in d.get("fills", ()))
        ensure(bool(fills), "scenario.fills must not be empty")
        return cls(world_size=d.get("world_size", 1), fills=fills)

    def describe(self) -> str:
        return f"{len(self.fills)} fills, world_size={self.world_size}"


@st.composite
def toy_scenarios(draw: Any, world_size: int = 1) -> ToyScenario:
    fills = draw(st.lists(st.builds(Fill, numel=st.integers(1, 64), churn=st.lists(
        st.builds(Churn, numel=st.integers(1, 64)), max_size=2).map(tuple)),
        min_size=1, max_size=3))
    return ToyScenario(world_size=world_size, fills=tuple(fills))


def smallest(world_size: int) -> ToyScenario:
    return ToyScenario(world_size=world_size)


def behaviours(scenario: ToyScenario) -> list[str]:
    return [f"fills {len(scenario.fills)}"]


def check(scenario: ToyScenario, observations: list[Any]) -> list[Failure]:
    """Fill ``i`` of every rank reads back ``i + 1`` in each element."""
    out = []
    for obs in observations:
        for i, values in obs.read:
            if values != [i + 1] * scenario.fills[i].numel:
                out.append(Failure("value", f"fill {i} read {values[:4]}...", obs.rank, i))
    return out
