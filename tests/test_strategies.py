"""How the strategies shrink and what the first examples are, checked on
Hypothesis alone (no ranks): properties that stand in for bugs, on several
seeds each."""

import gc
import random
from math import comb

import pytest
from hypothesis import Phase, find, given, seed, settings

from streamfuzz.fuzz import profiles
from streamfuzz.fuzz.draft.strategies.batches import _combination
from streamfuzz.strategies import scenarios


def test_every_subset_has_exactly_one_rank():
    for n in range(7):
        got = {tuple(_combination(r, n)) for r in range(comb(6, n))}
        assert len(got) == comb(6, n) and all(max(s, default=0) < 6 for s in got)
    assert _combination(0, 3) == [0, 1, 2]


def _shrink(condition, seed_):
    return find(scenarios(world_size=2), condition,
                settings=settings(profiles.get("ci"), max_examples=300),
                random=random.Random(seed_))


def _slots(s):
    return [step.idx_mapping for step in s.steps]


@pytest.mark.parametrize("seed_", range(5))
def test_a_batch_of_three_shrinks_to_three_slots_in_a_table_of_three(seed_):
    s = _shrink(lambda s: any(step.num_reqs >= 3 for step in s.steps), seed_)
    assert (s.max_num_reqs, _slots(s)) == (3, [(0, 1, 2)])


@pytest.mark.parametrize("seed_", range(3))
def test_a_step_that_reuses_the_last_steps_slot_shrinks_to_two_steps_of_slot_0(seed_):
    def reuse(s):
        return any(a.broadcasts and set(a.idx_mapping) & set(b.idx_mapping)
                   for a, b in zip(s.steps, s.steps[1:]))

    s = _shrink(reuse, seed_)
    assert (s.max_num_reqs, _slots(s)) == (1, [(0,), (0,)])


@pytest.mark.parametrize("seed_", range(3))
def test_any_step_can_be_deleted_not_only_the_last(seed_):
    s = _shrink(lambda s: len(s.steps) >= 3 and s.steps[2].num_reqs >= 2, seed_)
    assert _slots(s) == [(0,), (0,), (0, 1)]


@pytest.mark.parametrize("seed_", range(5))
def test_the_first_examples_broadcast(seed_):
    """Hypothesis fills its first examples with the simplest choices: those
    must exercise the protocol, not send nothing."""
    drawn = []

    @seed(seed_)
    @settings(profiles.get("ci"), max_examples=20)
    @given(scenarios(world_size=2))
    def record(s):
        drawn.append(s)

    with profiles.seed_only():
        record()
    broadcast = [any(step.broadcasts for step in s.steps) for s in drawn]
    assert broadcast[0] and sum(broadcast) >= 0.75 * len(broadcast), broadcast
    assert any(len(s.steps) > 1 for s in drawn[:10])


def test_hypothesis_copies_whole_steps_between_steps():
    """Hypothesis's mutator copies a span over another span with the same
    label; a step that is one span of its own gets copied into another step
    (``pr-fix`` is found that way). Steps drawn inline, without a span of
    their own, gave 0-5 such scenarios in 300 examples of a seed; with one
    span a step, 20-40. Steps of one request without churn or delays are the
    simplest ones, equal without any copying, and do not count."""
    copied = []

    @settings(profiles.get("ci"), max_examples=300, phases=(Phase.generate,))
    @given(scenarios(world_size=1))
    def record(s):
        rich = [step for step in s.steps if step.churn or step.delays or step.num_reqs > 1]
        copied.append(len(set(rich)) < len(rich))

    with profiles.seed_only():
        for seed_ in range(3):
            seed(seed_)(record)()
    assert sum(copied) >= 30, sum(copied)


def test_rare_collections_nests_and_puts_the_collectors_thresholds_back():
    before = gc.get_threshold()
    with profiles.rare_collections():
        with profiles.rare_collections():
            assert gc.get_threshold()[0] >= profiles.YOUNG_THRESHOLD
        assert gc.get_threshold()[0] >= profiles.YOUNG_THRESHOLD
    assert gc.get_threshold() == before
