"""A checked Hypothesis test that fails, to show a finding and its shrink.

``pytest examples/check_overlap.py`` (named so that collecting ``examples/``
leaves it out). No GPU needed.
"""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import streamfuzz


def my_engine_step(n: int) -> torch.Tensor:
    """Gathers n rows of a table; large batches overlap the gather with main's work."""
    main = torch.cuda.current_stream()
    table = torch.arange(4 * 64, device="cuda").view(64, 4)
    idx_mapping = torch.arange(n).to("cuda", non_blocking=True)
    if n <= 8:
        return table[idx_mapping]
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        side.wait_stream(main)
        rows = table[idx_mapping]  # the side stream reads idx_mapping...
    del idx_mapping  # ...and main frees it: its block can be reused before the read
    main.wait_stream(side)
    return rows


@settings(database=None, deadline=None)
@given(st.integers(1, 64))
def test_my_overlap(n: int) -> None:
    with streamfuzz.checked():
        out = my_engine_step(n)
    assert out.shape[0] == n
