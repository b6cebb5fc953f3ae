"""Allocation churn after the handler call: the runner's next allocations.

Sizes are biased toward the caching allocator's smallest size class (512
bytes), the class ``idx_mapping`` lives in, so that freed blocks are actually
handed out again; fills are biased toward valid request slots (silent wrong
drafts) with some out of range (device-side asserts).
"""

from __future__ import annotations

from hypothesis import strategies as st

from fuzz.scenario import FILL_RANGE, Churn

_SMALL_CLASS_BYTES = 512
_ITEMSIZE = {"int32": 4, "int64": 8, "float32": 4, "uint8": 1}


def _numels(dtype: str) -> st.SearchStrategy[int]:
    same_class = _SMALL_CLASS_BYTES // _ITEMSIZE[dtype]
    return st.one_of(st.integers(1, same_class), st.integers(same_class + 1, 8 * same_class))


def _fills(dtype: str, max_num_reqs: int) -> st.SearchStrategy[int]:
    lo, hi = FILL_RANGE[dtype]
    in_range = st.integers(0, max(0, max_num_reqs - 1))
    out_of_range = st.one_of(st.integers(max_num_reqs, hi), st.integers(lo, -1)) if lo < 0 \
        else st.integers(max_num_reqs, hi)
    return st.one_of(in_range, out_of_range)


@st.composite
def churn_op(draw, max_num_reqs: int) -> Churn:  # noqa: ANN001 - Hypothesis draw
    dtype = draw(st.sampled_from(("int32", "int64", "float32", "uint8")))
    return Churn(
        stream=draw(st.sampled_from(("main", "side"))),
        numel=draw(_numels(dtype)),
        dtype=dtype,
        fill=draw(_fills(dtype, max_num_reqs)),
        keep=draw(st.booleans().map(lambda b: not b)),
    )


def churn_ops(max_num_reqs: int, max_size: int = 4) -> st.SearchStrategy[tuple[Churn, ...]]:
    return st.lists(churn_op(max_num_reqs), max_size=max_size).map(tuple)
