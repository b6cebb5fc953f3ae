"""Scheduled batches: which request slots run, in which order, who samples."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st


def idx_mappings(max_num_reqs: int, min_size: int = 0) -> st.SearchStrategy[tuple[int, ...]]:
    """Distinct request slots; shrinks toward few slots in ascending order."""
    return st.integers(min_size, max_num_reqs).flatmap(
        lambda n: st.permutations(range(max_num_reqs)).map(lambda p: tuple(p[:n])))


@st.composite
def batches(draw: Any, max_num_reqs: int, num_spec_steps: int) -> dict[str, Any]:
    """One batch: slots, index dtype, and per request final/num_sampled/num_rejected.

    A request that is not the final chunk of a prefill samples nothing; a batch
    of only such requests broadcasts nothing, which both sides must agree on.
    """
    idx = draw(idx_mappings(max_num_reqs))
    n = len(idx)
    final = tuple(draw(st.lists(st.booleans(), min_size=n, max_size=n).map(
        lambda xs: [not x for x in xs])))
    num_sampled = tuple(draw(st.integers(1, num_spec_steps + 1)) if f else 0 for f in final)
    num_rejected = tuple(draw(st.integers(0, num_spec_steps)) for _ in range(n))
    return {
        "idx_mapping": idx,
        "idx_dtype": draw(st.sampled_from(("int64", "int32"))),
        "final": final,
        "num_sampled": num_sampled,
        "num_rejected": num_rejected,
    }
