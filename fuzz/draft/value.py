"""The value oracle: every rank's outputs equal the CPU reference."""

from __future__ import annotations

from streamfuzz.fuzz.draft import DraftObservations
from streamfuzz.fuzz.draft.reference import expected_applied, expected_sent
from streamfuzz.fuzz.draft.scenario import Scenario
from streamfuzz.fuzz.verdict import Failure

_MAX_ROWS = 4


def check(scenario: Scenario, observations: list[DraftObservations]) -> list[Failure]:
    """Compare what each rank sent or applied with what it should have."""
    last = scenario.world_size - 1
    failures: list[Failure] = []
    # The sender first: a wrong send explains every receiver's wrong table.
    for obs in sorted(observations, key=lambda o: o.rank != last):
        rank = obs.rank
        if rank == last:
            failures += _check_sender(scenario, obs, rank)
        else:
            failures += _check_receiver(scenario, obs, rank)
    return failures


def _check_sender(scenario: Scenario, obs: DraftObservations, rank: int) -> list[Failure]:
    want = expected_sent(scenario)
    got = {i: rows for i, rows in obs.sent}
    if sorted(got) != sorted(want):
        return [Failure("value", f"sent on steps {sorted(got)}, expected {sorted(want)}", rank)]
    for i in sorted(want):
        idx = scenario.steps[i].idx_mapping
        diff = _row_diff(want[i], got[i], labels=[f"row {r} (slot {s})" for r, s in enumerate(idx)])
        if diff:
            return [Failure("value", f"step {i}: rank {rank} sent wrong drafts: {diff}", rank, i)]
    return []


def _check_receiver(scenario: Scenario, obs: DraftObservations, rank: int) -> list[Failure]:
    want = expected_applied(scenario, obs.applies_non_final)
    got = obs.applied
    steps_got = [a.step for a in got]
    steps_want = [a.step for a in want]
    if steps_got != steps_want:
        return [Failure("value", f"applied steps {steps_got}, expected {steps_want}", rank)]
    for exp, a in zip(want, got):
        i = a.step
        idx = scenario.steps[i].idx_mapping
        rows = [f"row {r} (slot {s})" for r, s in enumerate(idx)]
        checks = (
            ("draft table", exp.table, a.table, [f"slot {s}" for s in range(len(a.table))]),
            ("sampled tokens", exp.tokens, a.tokens, rows),
            ("num_sampled", [exp.num_sampled], [a.num_sampled], ["counts"]),
            ("num_rejected", [exp.num_rejected], [a.num_rejected], ["counts"]),
        )
        for what, e, g, labels in checks:
            diff = _row_diff(e, g, labels)
            if diff:
                return [Failure("value", f"step {i}: rank {rank} {what} wrong after apply: {diff}",
                                rank, i)]
    return []


def _row_diff(expected: list, actual: list, labels: list[str]) -> str:
    if len(expected) != len(actual):
        return f"{len(actual)} rows, expected {len(expected)}"
    bad = [(lab, e, a) for lab, e, a in zip(labels, expected, actual) if e != a]
    if not bad:
        return ""
    shown = "; ".join(f"{lab}: expected {e} got {a}" for lab, e, a in bad[:_MAX_ROWS])
    more = f"; and {len(bad) - _MAX_ROWS} more rows" if len(bad) > _MAX_ROWS else ""
    return f"{len(bad)} row(s) differ: {shown}{more}"
