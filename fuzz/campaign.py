"""What a run of one target came to: the driver's result, read by every command."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamfuzz.fuzz.coverage import Coverage
from streamfuzz.fuzz.stop import StopReason
from streamfuzz.fuzz.verdict import Failure

Scenario = Any
"""Any protocol's scenario type (``streamfuzz.fuzz.protocol``)."""


@dataclass
class CampaignResult:
    target: str
    examples: int = 0
    elapsed_s: float = 0.0
    failure: Failure | None = None
    scenario: Scenario | None = None
    corpus_path: Path | None = None
    flaky: bool = False
    first_failure_examples: int | None = None
    first_failure_s: float | None = None
    first_failure_at: float | None = None
    """When the first failure was seen (``time.time()``): a benchmark that
    started this process measures from the process's start to it."""
    failures: int = 0
    reason: StopReason | None = None
    """Why the run ended (``streamfuzz.fuzz.stop``); None while it runs."""
    held: list[str] = field(default_factory=list)
    gate_timeouts: int = 0
    """Examples a gate ran out its bound in: the program waited for gated work
    in a way the gates could not see (a bug of streamfuzz's on correct code)."""
    coverage: Coverage | None = None
    """What the examples judged called on the ranks (``streamfuzz.fuzz.coverage``)."""

    def end(self, reason: StopReason) -> None:
        """Record why the run ended: the first reason stands, but for Ctrl-C."""
        if self.reason is None or reason is StopReason.INTERRUPTED:
            self.reason = reason

    @property
    def interrupted(self) -> bool:
        """Ctrl-C ended the run; a failure found is saved as shrunk so far."""
        return self.reason is StopReason.INTERRUPTED

    @property
    def stopped(self) -> bool:
        """Cut short from outside: its budget, its caller, another world's claim."""
        return self.reason in (StopReason.BUDGET, StopReason.ASKED, StopReason.CLAIMED)

    @property
    def shrink_truncated(self) -> bool:
        return self.reason is StopReason.SHRINK_BUDGET

    @property
    def duplicate(self) -> bool:
        """Another world claimed this run's failure first (``fuzz(claim=...)``):
        nothing was saved, and the finding is that world's."""
        return self.reason is StopReason.CLAIMED

    @property
    def examples_per_s(self) -> float:
        return self.examples / self.elapsed_s if self.elapsed_s else 0.0
