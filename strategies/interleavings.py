"""Stream interleavings: hold a stream at a point of the step.

On GPUs a hold makes one stream's queued work run late; delays are drawn in
decades so shrinking reports the smallest that still breaks the target.
"""

from __future__ import annotations

from hypothesis import strategies as st

from fuzz.scenario import Delay

CYCLES = (100_000, 1_000_000, 5_000_000)


def delays(max_size: int = 2) -> st.SearchStrategy[tuple[Delay, ...]]:
    one = st.builds(Delay, point=st.sampled_from(("pre_call", "post_call")),
                    stream=st.sampled_from(("side", "main")), cycles=st.sampled_from(CYCLES))
    return st.lists(one, max_size=max_size).map(tuple)
