"""Whole scenarios: a world, table shape, pipeline depth and a few steps."""

from __future__ import annotations

from functools import cache
from typing import Any

from hypothesis import strategies as st

from streamfuzz.fuzz.draft.scenario import Scenario, Step
from streamfuzz.fuzz.draft.strategies.batches import batches
from streamfuzz.fuzz.draft.strategies.churn import churn_lists
from streamfuzz.fuzz.draft.strategies.interleavings import delay_lists

_REQS = st.integers(1, 16)
_SPEC = st.integers(1, 4)
_DEPTH = st.integers(1, 3)


@cache
def _counts(max_steps: int) -> st.SearchStrategy[int]:
    return st.integers(1, max_steps)


@st.composite
def _step(draw: Any, max_num_reqs: int, num_spec_steps: int) -> Step:
    return Step(**draw(batches(max_num_reqs, num_spec_steps)),
                churn=tuple(draw(churn_lists(max_num_reqs))), delays=tuple(draw(delay_lists())))


@cache
def steps(max_num_reqs: int, num_spec_steps: int) -> st.SearchStrategy[Step]:
    """One span a step (Hypothesis's mutator copies a step into another), with
    the batch, each churn op and each delay its own span inside; no wrapper
    layer (``builds``, ``.map``) around the same choices, each of which costs
    a draw call and a span per example."""
    return _step(max_num_reqs, num_spec_steps)


@st.composite
def scenarios(draw: Any, world_size: int = 1, max_steps: int = 6,
              max_num_reqs: st.SearchStrategy[int] | None = None) -> Scenario:
    """Scenarios for a fixed world size (the ranks are already running).

    The number of steps is drawn first, as a count. Hypothesis's first
    examples vary their first few choices and leave the rest at the simplest
    (one step's simplest batch is one final request in slot 0): drawn first,
    the count gives those examples several steps that broadcast the same
    slot. A count also lets any step be deleted while shrinking (Hypothesis
    lowers it and drops a step's choices), where a list's continue flags only
    let it drop steps shorter than a few choices.
    """
    count = draw(_counts(max_steps))
    reqs = draw(max_num_reqs if max_num_reqs is not None else _REQS)
    k = draw(_SPEC)
    depth = draw(_DEPTH)
    step = steps(reqs, k)
    body = [draw(step) for _ in range(count)]
    return Scenario(world_size=world_size, max_num_reqs=reqs, num_spec_steps=k,
                    pipeline_depth=depth, steps=tuple(body))
