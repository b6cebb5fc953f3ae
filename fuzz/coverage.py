"""What a run exercised: which of its protocol's handler methods ran, how often, where.

A "clean" means nothing about code that never ran: at world size 1 no rank
receives, so a receiver's bugs cannot show. The counts come from the ranks
(``RankEnv.calls``, sent back with every answer); this module adds them up
over a run and says, in words, what never ran and why. It knows the
protocol's methods only, never the lines of a user's handler.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from streamfuzz.fuzz.protocol import Protocol


@dataclass
class Coverage:
    """Counts per name (``Protocol.counted``) and rank over one run of one target."""

    protocol: Protocol
    world_size: int
    device: str = "cpu"
    examples: int = 0
    calls: dict[str, dict[int, int]] = field(default_factory=dict)

    def add(self, per_rank: Mapping[int, Mapping[str, int]]) -> None:
        """One example's counts, as the ranks that answered sent them."""
        self.examples += 1
        for rank, counts in per_rank.items():
            for name, n in counts.items():
                if n:
                    by_rank = self.calls.setdefault(name, {})
                    by_rank[rank] = by_rank.get(rank, 0) + n

    def _absent(self, role: str) -> bool:
        """Whether no rank of this world plays ``role``: the receiver side of a world of one."""
        return self.world_size < 2 and role != self.protocol.alone

    def never_ran(self) -> dict[str, str]:
        """Each counted name that never ran, with why, in the protocol's order."""
        out: dict[str, str] = {}
        for role, names in self.protocol.counted.items():
            for name in names:
                if name in self.calls:
                    continue
                if self._absent(role):
                    out[name] = f"world size {self.world_size}"
                elif not self.examples:
                    out[name] = "no example ran to its end"
                else:
                    out[name] = f"not called on {role} in {self.examples} examples"
        return out

    def note(self) -> str:
        """`` (receive_drafts never ran: world size 1; ...)``, or ``""``."""
        gaps = self.never_ran()
        return f" ({'; '.join(f'{n} never ran: {why}' for n, why in gaps.items())})" \
            if gaps else ""

    def unchecked(self) -> str | None:
        """The line that says the receiver side is unchecked, and how to check it."""
        roles = [r for r in self.protocol.counted if self._absent(r)]
        if not roles:
            return None
        names = ", ".join(n for r in roles for n in self.protocol.counted[r])
        how = ("check it with --world-size 2 on two GPUs, or on one GPU with --device cpu "
               "--world-size 2" if self.device == "cuda" else "check it with --world-size 2")
        return (f"the receiver side ({names}, on {' and '.join(roles)}) is unchecked: "
                f"world size {self.world_size} has no receiving rank; {how}")

    def to_dict(self) -> dict[str, Any]:
        """For reports: counts per name and rank (every counted name, zero or not)."""
        names = [n for ns in self.protocol.counted.values() for n in ns]
        return {"protocol": self.protocol.name, "world_size": self.world_size,
                "examples": self.examples,
                "calls": {n: {str(r): c for r, c in sorted(self.calls.get(n, {}).items())}
                          for n in names},
                "never_ran": self.never_ran(), "unchecked": self.unchecked()}
