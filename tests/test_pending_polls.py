"""Polls that answer "not done" on simulated streams (``pending_polls``): on
CPU every op has already run, so without them a program's path for work
still in flight (``query()`` False, ``is_completed()`` False) never runs.
A step's delays, which hold nothing there, hold its polls instead."""

import dataclasses
import json

import pytest
import torch

from streamfuzz.fuzz import driver
from streamfuzz.fuzz.draft.scenario import Delay, Scenario, Step, polls_held
from streamfuzz.fuzz.oracles.lifetime import LifetimeChecker
from streamfuzz.fuzz.streams import SimStreams
from streamfuzz.fuzz.weight_sync.scenario import Hold, Sync

_STEP = Step(idx_mapping=(1, 0), final=(True, True), num_sampled=(2, 1), num_rejected=(0, 1))


def _scenario(*polls: int) -> Scenario:
    """Steps whose delays hold ``polls`` polls each (a spin of 1e5 cycles holds one)."""
    return Scenario(world_size=2, max_num_reqs=2, pipeline_depth=1, steps=tuple(
        dataclasses.replace(_STEP, delays=(Delay(cycles=100_000),) * p) for p in polls))


def test_a_delay_holds_polls_by_how_long_it_would_hold_a_gpu():
    assert [polls_held(c, "") for c in (0, 100_000, 1_000_000, 5_000_000)] == [0, 1, 2, 3]
    assert polls_held(0, "after_call") == 3  # a gate: held until a point of the step
    assert _scenario(0, 2).steps[1].pending_polls == 2
    # Derived, not stored: the corpus format and its hashes are as they were.
    assert "pending_polls" not in json.dumps(_scenario(0, 2).to_dict())
    sync = Sync(holds=(Hold(cycles=1_000_000), Hold(until="broadcast")))
    assert sync.pending_polls == 5


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


def test_the_not_done_path_done_right_stays_clean(cpu_pool, ci_settings):
    result = driver.fuzz(cpu_pool, "tests.targets:polled_counts_fixed", ci_settings,
                         max_examples=150, seed=0)
    assert result.failure is None and result.examples == 150, result.failure


def _copy_and_poll() -> None:
    """``tests.targets:polled_counts``'s pattern in plain torch.cuda: while the
    last copy is not done, the host zeroes the buffer it lands in (the bug)."""
    copier = torch.cuda.Stream()
    host = torch.zeros(4, dtype=torch.int32, pin_memory=True)
    copied = None
    for _ in range(2):
        counts = torch.ones(2, dtype=torch.int32, device="cuda")
        if copied is not None:
            if copied.query():
                host.tolist()
            else:
                host.zero_()
        copier.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(copier):
            host[:2].copy_(counts, non_blocking=True)
            counts.record_stream(copier)
            copied = torch.cuda.Event()
            copied.record()


def test_a_checked_block_holds_the_polls_it_is_told_to():
    import streamfuzz

    for polls, found in ((0, []), (1, ["race"])):
        with streamfuzz.checked(device="cpu", collect=True, pending_polls=polls) as check:
            _copy_and_poll()
        assert [f.kind for f in check.findings] == found, check.findings
    with pytest.raises(ValueError, match=r"pending_polls must be an integer in 0\.\.64"):
        streamfuzz.checked(pending_polls=-1)
