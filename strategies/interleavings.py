"""Stream interleavings: hold a stream at a point of the step.

The broadcast stream is held by a gate opened by the main stream at a named
point (the churn written, the next step's drafter run, ...), which forces the
interleaving on every run; where gates are unavailable the same delay is a
spin of ``cycles``. The main stream is only ever spun: a gate on it would be
opened from the broadcast stream, which waits on main in every target and so
could only time out. Cycles are drawn in decades so shrinking reports the
smallest spin that still breaks the target.
"""

from __future__ import annotations

import dataclasses
from functools import cache
from typing import TypeVar

from hypothesis import strategies as st

from fuzz.scenario import Delay

T = TypeVar("T")

CYCLES = (100_000, 1_000_000, 5_000_000)
UNTIL = ("after_churn", "before_next_call", "after_call", "")


_HOLDS = st.sampled_from(
    [(point, "side", until) for until in UNTIL for point in ("pre_call", "post_call")]
    + [(point, "main", "") for point in ("pre_call", "post_call")])
_CYCLES = st.sampled_from(CYCLES)


@st.composite
def _delay(draw) -> Delay:  # noqa: ANN001 - Hypothesis draw
    point, stream, until = draw(_HOLDS)
    return Delay(point=point, stream=stream, cycles=draw(_CYCLES), until=until)


MAX_DELAYS = 2


@cache
def delay_lists(max_size: int = MAX_DELAYS) -> st.SearchStrategy[list[Delay]]:
    """Two draws a delay: (point, stream, until) together, and the cycles. A
    list, for the same reason as ``churn_lists``."""
    return st.lists(_delay(), max_size=max_size)


@cache
def delays(max_size: int = MAX_DELAYS) -> st.SearchStrategy[tuple[Delay, ...]]:
    """The delays of one step, as a step holds them."""
    return delay_lists(max_size).map(tuple)


PENDING_POLLS = 3
"""The most polls of a step drawn to answer "not done"."""


@cache
def pending_polls(steps: int) -> st.SearchStrategy[list[int]]:
    """How many polls of each of the first steps answer "not done" on
    simulated streams; a list that shrinks to none."""
    return st.lists(st.integers(0, PENDING_POLLS), max_size=steps)


def with_pending_polls(counts: list[int], steps: list[T]) -> list[T]:
    """``steps`` (dataclasses with ``pending_polls``: draft steps, weight
    syncs), the first ones given ``counts``. Draw the counts first: a step
    left over once the number of steps is lowered is then the last choices,
    which the shrinker drops (after the steps, the counts would take those
    choices as their own), and the simplest counts, none, leave the steps'
    first examples and their shrinking as they were."""
    return [dataclasses.replace(s, pending_polls=n) if n else s
            for s, n in zip(steps, counts)] + steps[len(counts):]
