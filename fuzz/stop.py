"""Why a run ended: one reason per run, as Hypothesis's ``ExitReason`` is.

A run of one target (``driver.fuzz``) and a soak campaign each end for
exactly one of these; reports carry the value, and ``describe()`` says it
in words. The values of the campaign's reasons are the words its reports
have always used.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import Enum
from typing import Any


class StopReason(str, Enum):
    MAX_EXAMPLES = "max examples"
    BUDGET = "budget spent"
    SHRUNK = "shrunk"
    SHRINK_BUDGET = "shrink budget spent"
    INTERRUPTED = "interrupted"
    ASKED = "asked to stop"
    CLAIMED = "claimed by another world"
    RANKS_LOST = "ranks lost"
    ROUNDS_DONE = "rounds done"
    SIGINT = "SIGINT"
    SIGTERM = "SIGTERM"

    # Printed and formatted as its value, as in the reports.
    __str__ = str.__str__
    __format__ = str.__format__  # type: ignore[assignment]

    def describe(self) -> str:
        return _SAID[self]

    @property
    def cut_short(self) -> bool:
        """Whether the run ended before it had run or shrunk all it meant to."""
        return self not in (StopReason.MAX_EXAMPLES, StopReason.SHRUNK)


_SAID = {
    StopReason.MAX_EXAMPLES: "ran every example it was given, nothing found",
    StopReason.BUDGET: "its time budget was spent",
    StopReason.SHRUNK: "found a failure and shrunk it",
    StopReason.SHRINK_BUDGET: "found a failure; shrinking stopped at its budget, "
                              "saved as shrunk so far",
    StopReason.INTERRUPTED: "interrupted (Ctrl-C or SIGTERM); what was found is saved",
    StopReason.ASKED: "its caller asked it to stop (a soak round's end, a campaign's stop)",
    StopReason.CLAIMED: "another world claimed its failure first, and shrinks and saves it",
    StopReason.RANKS_LOST: "the external ranks were lost",
    StopReason.ROUNDS_DONE: "ran the rounds it was given",
    StopReason.SIGINT: "stopped by SIGINT (Ctrl-C)",
    StopReason.SIGTERM: "stopped by SIGTERM",
}


@contextmanager
def handled(handler: Callable[[int, Any], None]) -> Iterator[None]:
    """``handler`` for SIGINT and SIGTERM inside the block; the handlers before
    it again after."""
    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


_signalled = False


def note_signal() -> None:
    """A signal asked this process to stop. Kept as well as raised: Python only
    prints an interrupt raised inside a gc callback (Hypothesis times its
    collections with one), and the run must still end at its next example."""
    global _signalled
    _signalled = True


def signalled() -> bool:
    return _signalled


def clear_signal() -> None:
    global _signalled
    _signalled = False
