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

from functools import cache

from hypothesis import strategies as st

from streamfuzz.fuzz.draft.scenario import Delay

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
