"""Polls that answer "not done" on simulated streams (``pending_polls``): on
CPU every op has already run, so without them a program's path for work
still in flight (``query()`` False, ``is_completed()`` False) never runs."""

import dataclasses
from pathlib import Path

import pytest
import torch

from fuzz import driver
from fuzz.oracles.lifetime import LifetimeChecker
from fuzz.scenario import Scenario, ScenarioError, Step
from fuzz.streams import SimStreams

_STEP = Step(idx_mapping=(1, 0), final=(True, True), num_sampled=(2, 1), num_rejected=(0, 1))


def _scenario(*polls: int) -> Scenario:
    return Scenario(world_size=2, max_num_reqs=2, pipeline_depth=1,
                    steps=tuple(dataclasses.replace(_STEP, pending_polls=p) for p in polls))


def test_only_polls_of_work_the_host_has_not_synchronized_with_answer_not_done():
    api = SimStreams()
    checker = LifetimeChecker(api).attach()
    try:
        with api.session():
            side = torch.cuda.Stream()
            never = torch.cuda.Event()
            api.hold_polls(3)
            assert never.query() and side.query()  # nothing to wait for: done
            with torch.cuda.stream(side):
                torch.ones(4, device="cuda").add_(1)
                ev = torch.cuda.Event()
                ev.record()
            assert not ev.query() and not side.query()  # two of three held
            assert not ev.query()
            assert ev.query()  # the count is spent: done, and a host sync
            with torch.cuda.stream(side):
                torch.ones(4, device="cuda").add_(1)
            api.hold_polls(5)
            side.synchronize()
            assert side.query() and ev.query()  # synchronized with: done
    finally:
        checker.detach()
    assert api.unfinished is None


def test_without_the_lifetime_checker_every_poll_says_done():
    api = SimStreams()
    with api.session():
        api.hold_polls(3)
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            torch.ones(4, device="cuda").add_(1)
        assert side.query()


def test_a_bug_on_the_not_done_path_is_found_where_a_poll_says_not_done(cpu_pool):
    assert driver.evaluate(cpu_pool, "tests.targets:polled_counts", _scenario(0, 0, 0)).ok
    verdict = driver.evaluate(cpu_pool, "tests.targets:polled_counts", _scenario(0, 1, 0))
    assert not verdict.ok
    first = verdict.failures[0]
    assert first.kind == "race" and first.rank == 0, verdict.summary()
    assert "the host writes it (aten.zero_" in first.message, first.message
    assert driver.evaluate(cpu_pool, "tests.targets:polled_counts_fixed",
                           _scenario(0, 1, 2)).ok


@pytest.mark.parametrize("seed", [0, 1])
def test_the_fuzzer_finds_it_and_shrinks_to_one_held_poll(cpu_pool, ci_settings, seed):
    result = driver.fuzz(cpu_pool, "tests.targets:polled_counts", ci_settings,
                         max_examples=300, seed=seed)
    assert result.failure is not None and result.failure.kind == "race", "not found"
    # One poll held, on the step after the first copy: the smallest case.
    polls = [s.pending_polls for s in result.scenario.steps]
    assert polls == [0, 1], polls
    assert f"pending polls {','.join(map(str, polls))}" in result.scenario.describe()


def test_a_step_without_held_polls_writes_and_hashes_as_before():
    from fuzz.corpus import path_of

    data = _scenario(0, 2).to_dict()
    assert "pending_polls" not in data["steps"][0] and data["steps"][1]["pending_polls"] == 2
    assert Scenario.from_dict(data) == _scenario(0, 2)
    committed = {"world_size": 1, "max_num_reqs": 1, "num_spec_steps": 1, "pipeline_depth": 1,
                 "steps": [{"idx_mapping": [0], "idx_dtype": "int64", "final": [True],
                            "num_sampled": [1], "num_rejected": [0], "churn": [],
                            "delays": []}]}
    assert Scenario.from_dict(committed).to_dict() == committed
    assert path_of(Path("c"), "t", "race", Scenario.from_dict(committed)) == path_of(
        Path("c"), "t", "race", committed)


def test_the_not_done_path_done_right_stays_clean(cpu_pool, ci_settings):
    result = driver.fuzz(cpu_pool, "tests.targets:polled_counts_fixed", ci_settings,
                         max_examples=150, seed=0)
    assert result.failure is None and result.examples == 150, result.failure


@pytest.mark.parametrize("value", [-1, 65, True, "1"])
def test_a_bad_count_names_its_field(value):
    data = _scenario(0).to_dict()
    data["steps"][0]["pending_polls"] = value
    with pytest.raises(ScenarioError, match=r"steps\[0\]\.pending_polls must be in 0\.\.64"):
        Scenario.from_dict(data)


def test_a_weight_sync_names_its_count_too():
    from fuzz.weight_sync.scenario import WeightSyncScenario

    data = WeightSyncScenario().to_dict()
    assert "pending_polls" not in data["syncs"][0]  # none held: left out
    data["syncs"][0]["pending_polls"] = 2
    assert WeightSyncScenario.from_dict(data).syncs[0].pending_polls == 2
    data["syncs"][0]["pending_polls"] = 65
    with pytest.raises(ScenarioError, match=r"syncs\[0\]\.pending_polls must be in 0\.\.64"):
        WeightSyncScenario.from_dict(data)
