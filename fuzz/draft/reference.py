"""What every rank must produce, computed on the CPU from the scenario alone.

The values are arithmetic in (step, slot, position), so a mismatch can be read
by eye: 300042 is step 2's draft for slot 2, position 10 (slot*16 + position).
"""

from __future__ import annotations

from dataclasses import dataclass

from streamfuzz.fuzz.draft.scenario import Scenario, Step

_STEP = 100_000
_SLOT = 16


def draft_value(step: int, slot: int, j: int) -> int:
    return (step + 1) * _STEP + slot * _SLOT + j


def token_value(step: int, slot: int, k: int, num_sampled: int) -> int:
    return -draft_value(step, slot, k) if k < num_sampled else -1


def draft_rows(step_index: int, step: Step, num_spec_steps: int) -> list[list[int]]:
    return [[draft_value(step_index, slot, j) for j in range(num_spec_steps)]
            for slot in step.idx_mapping]


def token_rows(step_index: int, step: Step, num_spec_steps: int) -> list[list[int]]:
    return [[token_value(step_index, slot, k, ns) for k in range(num_spec_steps + 1)]
            for slot, ns in zip(step.idx_mapping, step.num_sampled)]


@dataclass(frozen=True)
class Applied:
    """A receiving rank's state right after one step's drafts are applied: the
    reference's expectation, and what a rank observed (``DraftObservations``)."""

    step: int
    table: list[list[int]]
    tokens: list[list[int]]
    num_sampled: list[int]
    num_rejected: list[int]


def expected_sent(scenario: Scenario) -> dict[int, list[list[int]]]:
    """Last rank: step -> the rows it broadcast (``table[idx_mapping]`` then)."""
    k = scenario.num_spec_steps
    return {i: draft_rows(i, st, k) for i, st in enumerate(scenario.steps) if st.broadcasts}


def expected_applied(scenario: Scenario, non_final: bool = True) -> list[Applied]:
    """Receiving ranks: their draft table after each apply, in apply order.

    With ``non_final`` False the rows of non-final prefill chunks are left as
    they were, as vLLM's handler does (those requests sample nothing).
    """
    k = scenario.num_spec_steps
    table = [[0] * k for _ in range(scenario.max_num_reqs)]
    out = []
    for i, st in enumerate(scenario.steps):
        if not st.broadcasts:
            continue
        for slot, row, final in zip(st.idx_mapping, draft_rows(i, st, k), st.final):
            if final or non_final:
                table[slot] = row
        out.append(Applied(i, [r[:] for r in table], token_rows(i, st, k),
                           list(st.num_sampled), list(st.num_rejected)))
    return out
