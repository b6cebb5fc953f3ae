"""What a campaign runs: its targets, budgets, rounds and sampling."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamfuzz.fuzz.options import DEFAULT, RunOptions

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_budget(text: str) -> float:
    """``30s``, ``10m``, ``8h``, ``1d`` or plain seconds -> seconds (> 0)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text or "")
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"{text!r} is not a duration like 30s, 10m or 8h")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


@dataclass
class SoakConfig:
    """What a campaign runs; ``out`` holds its journal, state, log and report."""

    targets: list[str]
    budget_s: float
    out: Path
    corpus: Path
    database: Path | None = None
    round_s: float = 300.0
    """A round's length at most; ``round_len`` shortens it to the budget's share
    per target, so that a short campaign still runs every target."""
    round_examples: int = 2000
    """Examples per round at most. Hypothesis keeps every example of a run in
    memory (about 50 KB each) until the run ends, and the allocator keeps the
    high-water mark, so the driver's RSS follows the largest round: capping it
    keeps a fast GPU campaign's memory flat."""
    shrink_s: float | None = None
    """Time a round may spend shrinking past its budget (default ``round_s``): a
    hang costs a full timeout per attempt, and must not starve the other targets.
    A failure cut short is saved as shrunk so far, and replayed."""
    stats_every_s: float = 10.0
    stats_every_examples: int | None = None
    """Also sample every this many examples, so that what a short campaign
    decides from its samples (recycling) does not depend on its speed."""
    max_rounds: int | None = None
    """Stop after this many rounds in all (default: only the budget stops)."""
    recycle_mib: float = 32.0
    """Replace healthy ranks once one of them has grown this much since its world
    warmed up (0: never). torch 2.11's NCCL broadcast keeps about 1 KB a call, so
    a CUDA rank grows ~2 MiB per 1,000 examples for as long as it lives; with
    recycling, no rank outgrows its start by more than this, however long the run."""
    seed: int | None = None
    options: RunOptions = DEFAULT
    """What every example runs with, the replay of one left in flight included."""
    profile: str = "default"
    replay_failures: bool = True
    strategy: Any = None
    """Scenarios to draw (default: ``streamfuzz.fuzz.draft.strategies.scenarios`` for the
    pool's world)."""
    extra: dict[str, Any] = field(default_factory=dict)
    claims: Any = None
    """Where this campaign is one of parallel worlds: their ``streamfuzz.fuzz.worlds.Claims``."""

    def round_len(self) -> float:
        """``round_s``, or the budget's share per target where that is shorter: a
        50-second soak of two targets in 5-minute rounds never reached the second,
        and said nothing of the targets after the first but their names."""
        return min(self.round_s, self.budget_s / max(1, len(self.targets)))
