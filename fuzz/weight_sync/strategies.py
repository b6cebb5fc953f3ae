"""Weight-sync scenarios: parameters, buffers, the optimizer's writes, holds, churn.

Sizes stay small by default (up to a few hundred elements a parameter, tens
of KiB an example), so CPU runs many examples; ``scale`` multiplies every
parameter's elements for GPU soaks. The buffer size is drawn relative to the
parameters' total bytes, so chunks split, straddle, or hold everything.
Everything shrinks toward one float32 parameter, one sync that writes it, one
buffer, and no holds or churn.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from hypothesis import strategies as st

from streamfuzz.fuzz.weight_sync.scenario import (
    CHURN_DTYPES,
    DTYPES,
    Churn,
    Hold,
    Param,
    Sync,
    WeightSyncScenario,
)

CYCLES = (100_000, 1_000_000, 5_000_000)
_DTYPE_NAMES = tuple(DTYPES)
_UNTIL = ("broadcast", "after_call", "")


def _param(dims: list[int], dtype: str, scale: int) -> Param:
    # Every parameter a whole number of 4-byte words: a packed buffer's views
    # stay aligned for every dtype, as real parameters' sizes keep them.
    dims = [d * scale if i == 0 else d for i, d in enumerate(dims)]
    dims[-1] *= 4 // DTYPES[dtype]
    return Param(shape=tuple(dims), dtype=dtype)


@cache
def _params(scale: int) -> st.SearchStrategy[Param]:
    dims = st.lists(st.integers(1, 16), min_size=1, max_size=2)
    return st.builds(_param, dims, st.sampled_from(_DTYPE_NAMES), st.just(scale))


_HOLDS = st.builds(Hold, cycles=st.sampled_from(CYCLES), until=st.sampled_from(_UNTIL))
_CHURN = st.builds(Churn, numel=st.integers(1, 1024), dtype=st.sampled_from(CHURN_DTYPES),
                   fill=st.integers(0, 255), keep=st.booleans())


@st.composite
def _sync(draw: Any, num_params: int) -> Sync:
    # Bit i clear: the optimizer writes parameter i (shrinks toward writing all).
    mask = draw(st.integers(0, (1 << num_params) - 1))
    writes = tuple(i for i in range(num_params) if not (mask >> i) & 1)
    holds = tuple(draw(st.lists(_HOLDS, max_size=2)))
    churn = tuple(draw(st.lists(_CHURN, max_size=3)))
    return Sync(writes=writes, holds=holds, churn=churn)


@st.composite
def weight_sync_scenarios(draw: Any, world_size: int = 1, max_params: int = 6,
                          max_syncs: int = 3, scale: int = 1) -> WeightSyncScenario:
    """Scenarios for a fixed world size (the ranks are already running)."""
    params = tuple(draw(st.lists(_params(scale), min_size=1, max_size=max_params)))
    total = sum(p.nbytes for p in params)
    # Up to twice the total: one buffer for all, or chunks that split anywhere.
    buffer_bytes = draw(st.integers(1, 2 * total)) if total > 1 else 1
    num_buffers = draw(st.integers(1, 3))
    syncs = tuple(draw(st.lists(_sync(len(params)), min_size=1, max_size=max_syncs)))
    return WeightSyncScenario(world_size=world_size, params=params, buffer_bytes=buffer_bytes,
                              num_buffers=num_buffers, syncs=syncs)
