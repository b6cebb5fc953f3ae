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

from hypothesis import strategies as st

from fuzz.scenario import Delay

CYCLES = (100_000, 1_000_000, 5_000_000)
UNTIL = ("after_churn", "before_next_call", "after_call", "")


def delays(max_size: int = 2) -> st.SearchStrategy[tuple[Delay, ...]]:
    points = st.sampled_from(("pre_call", "post_call"))
    side = st.builds(Delay, point=points, stream=st.just("side"),
                     cycles=st.sampled_from(CYCLES), until=st.sampled_from(UNTIL))
    main = st.builds(Delay, point=points, stream=st.just("main"),
                     cycles=st.sampled_from(CYCLES))
    return st.lists(st.one_of(side, main), max_size=max_size).map(tuple)
