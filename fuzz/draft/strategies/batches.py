"""Scheduled batches: which request slots run, in which order, who samples.

Each choice that can be one draw is one draw: the slots are a count, a
combination rank and a permutation rank, the per-request flags and counts are
packed integers. Every draw costs tens of microseconds in Hypothesis, and a
batch of sixteen requests drawn element by element was most of the fuzzer's
time per example. Strategies are built once per parameter set and cached, for
the same reason.

The encodings are chosen for how they shrink and for what the simplest
example is. Any smaller combination rank is another valid set of the same
size, so the slots shrink straight to ``0..n-1`` (a bitmask did not: from
``[0, 1, 7]`` every smaller mask with three bits set was several steps away,
and shrinking stopped there, with ``max_num_reqs`` held up by slot 7). Once
the slots are low, ``max_num_reqs`` shrinks too: the count and rank stay
valid under a smaller table. The simplest batch, the one Hypothesis tries
first and completes its first examples with, holds one final request, so it
broadcasts; an empty batch is the largest count code.
"""

from __future__ import annotations

from functools import cache
from math import comb, factorial
from typing import Any

from hypothesis import strategies as st

_IDX_DTYPES = st.sampled_from(("int64", "int32"))


@cache
def _ints(lo: int, hi: int) -> st.SearchStrategy[int]:
    return st.integers(lo, hi)


def _unrank(items: list[int], rank: int) -> tuple[int, ...]:
    """The ``rank``-th permutation of ``items`` in lexicographic order (0: as given)."""
    items = list(items)
    out = []
    for i in range(len(items), 0, -1):
        f = factorial(i - 1)
        out.append(items.pop(rank // f))
        rank %= f
    return tuple(out)


def _digits(value: int, base: int, n: int) -> list[int]:
    out = []
    for _ in range(n):
        value, d = divmod(value, base)
        out.append(d)
    return out


def _combination(rank: int, n: int) -> list[int]:
    """The ``rank``-th ``n``-subset of the naturals in colex order (0: ``0..n-1``)."""
    out = []
    for i in range(n, 0, -1):
        c = i - 1
        while comb(c + 1, i) <= rank:
            c += 1
        out.append(c)
        rank -= comb(c, i)
    return out[::-1]


def _sizes(max_num_reqs: int, min_size: int) -> tuple[int, ...]:
    """Batch sizes in shrink order: one request first (the simplest batch
    broadcasts), up to the largest, then the sizes below one (empty)."""
    first = max(min_size, 1)
    return tuple(range(first, max_num_reqs + 1)) + tuple(range(min_size, first))


@st.composite
def _idx(draw: Any, max_num_reqs: int, min_size: int) -> tuple[int, ...]:
    # Three draws whatever the size: a draw that comes and goes with the size
    # would shift every later choice when the size shrinks.
    sizes = _sizes(max_num_reqs, min_size)
    n = sizes[draw(_ints(0, len(sizes) - 1))]
    slots = _combination(draw(_ints(0, comb(max_num_reqs, n) - 1)), n)
    return _unrank(slots, draw(_ints(0, factorial(n) - 1)))


@cache
def idx_mappings(max_num_reqs: int, min_size: int = 0) -> st.SearchStrategy[tuple[int, ...]]:
    """Distinct request slots; shrinks toward one slot, then few low slots in
    ascending order."""
    return _idx(max_num_reqs, min_size)


@st.composite
def _batch(draw: Any, max_num_reqs: int, num_spec_steps: int) -> dict[str, Any]:
    idx = draw(idx_mappings(max_num_reqs))
    n = len(idx)
    k = num_spec_steps
    # Bit r set: request r is a non-final prefill chunk (shrinks to all final).
    mask = draw(_ints(0, (1 << n) - 1)) if n else 0
    final = tuple(not (mask >> r) & 1 for r in range(n))
    nf = sum(final)
    sampled = iter(d + 1 for d in _digits(draw(_ints(0, (k + 1) ** nf - 1)), k + 1, nf)) \
        if nf else iter(())
    num_sampled = tuple(next(sampled) if f else 0 for f in final)
    num_rejected = tuple(_digits(draw(_ints(0, (k + 1) ** n - 1)), k + 1, n)) if n else ()
    return {
        "idx_mapping": idx,
        "idx_dtype": draw(_IDX_DTYPES),
        "final": final,
        "num_sampled": num_sampled,
        "num_rejected": num_rejected,
    }


@cache
def batches(max_num_reqs: int, num_spec_steps: int) -> st.SearchStrategy[dict[str, Any]]:
    """One batch: slots, index dtype, and per request final/num_sampled/num_rejected.

    A request that is not the final chunk of a prefill samples nothing; a batch
    of only such requests broadcasts nothing, which both sides must agree on.
    """
    return _batch(max_num_reqs, num_spec_steps)
