"""The outcome of one example: what went wrong, if anything, in plain data."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

KINDS = ("value", "crash", "hang", "lifetime", "race", "reuse")


@dataclass(frozen=True)
class Failure:
    """One finding. ``kind`` names the oracle or the way the rank failed."""

    kind: str
    message: str
    rank: int | None = None
    step: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Verdict:
    failures: list[Failure] = field(default_factory=list)
    held: list[str] = field(default_factory=list)
    calls: dict[int, dict[str, int]] = field(default_factory=dict)
    """Per rank that answered, what its runner called (``streamfuzz.fuzz.coverage``)."""

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def first(self) -> Failure:
        return self.failures[0]

    def summary(self) -> str:
        if self.ok:
            return "ok"
        f = self.first
        more = f" (+{len(self.failures) - 1} more)" if len(self.failures) > 1 else ""
        return f"{f.kind}: {f.message}{more}"
