"""Allocation churn after the handler call: the runner's next allocations.

Sizes are biased toward the caching allocator's smallest size class (512
bytes), the class ``idx_mapping`` lives in, so that freed blocks are actually
handed out again; fills are biased toward valid request slots (silent wrong
drafts) with some out of range (device-side asserts).
"""

from __future__ import annotations

from functools import cache

from hypothesis import strategies as st

from streamfuzz.fuzz.draft.scenario import CHURN_DTYPES, FILL_RANGE, ITEMSIZE, Churn

_SMALL_CLASS_BYTES = 512


_COMBOS = st.sampled_from([(dtype, stream, keep)
                           for keep in (True, False) for stream in ("main", "side")
                           for dtype in CHURN_DTYPES])
_OUT_OF_RANGE = st.booleans()


@cache
def _numel_codes(dtype: str) -> st.SearchStrategy[int]:
    return st.integers(0, 2 * (_SMALL_CLASS_BYTES // ITEMSIZE[dtype]) - 1)


@cache
def _fills(dtype: str, max_num_reqs: int, out_of_range: bool) -> st.SearchStrategy[int]:
    lo, hi = FILL_RANGE[dtype]
    if not out_of_range:
        return st.integers(0, max(0, max_num_reqs - 1))
    above = st.integers(max_num_reqs, hi)
    return st.one_of(above, st.integers(lo, -1)) if lo < 0 else above


@st.composite
def churn_op(draw, max_num_reqs: int) -> Churn:  # noqa: ANN001 - Hypothesis draw
    """Four or five draws: (dtype, stream, keep) together, size, range, fill."""
    dtype, stream, keep = draw(_COMBOS)
    same_class = _SMALL_CLASS_BYTES // ITEMSIZE[dtype]
    code = draw(_numel_codes(dtype))
    # Half the codes land in idx_mapping's size class, the rest spread up to 8x.
    numel = code + 1 if code < same_class else same_class + 1 + (code - same_class) * 7
    out = draw(_OUT_OF_RANGE)
    return Churn(stream=stream, numel=numel, dtype=dtype,
                 fill=draw(_fills(dtype, max_num_reqs, out)), keep=keep)


MAX_OPS = 4


@cache
def churn_lists(max_num_reqs: int, max_size: int = MAX_OPS) -> st.SearchStrategy[list[Churn]]:
    """Cached per parameters: fresh strategy objects per draw cost more than the draw.
    A list, not mapped to a tuple: a step draws it in its own composite, where a
    ``.map`` would add one more draw layer and span around the same choices."""
    return st.lists(churn_op(max_num_reqs), max_size=max_size)


@cache
def churn_ops(max_num_reqs: int, max_size: int = MAX_OPS) -> st.SearchStrategy[tuple[Churn, ...]]:
    """The churn after one handler call, as a step holds it."""
    return churn_lists(max_num_reqs, max_size).map(tuple)
