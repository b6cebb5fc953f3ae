"""Hypothesis draws the next scenario while the ranks run the last one
(``driver._Campaign``'s ahead mode), and the run is the one a driver that
waits for every verdict would make: the same examples, first failure, shrunk
case and corpus file; a Ctrl-C in the draw keeps a finding already in."""

import hashlib
import pickle

import pytest

from streamfuzz.fuzz import driver, targets
from streamfuzz.fuzz.ranks import RankPool


def _campaign(pool, settings, target, pipeline, tmp_path, **kw):
    dispatched = []
    res = driver.fuzz(pool, target, settings, max_examples=60, seed=3,
                      corpus_dir=tmp_path / ("ahead" if pipeline else "sync"),
                      shrink_budget_s=None, pipeline=pipeline,
                      on_example=lambda f: dispatched.append(
                          hashlib.sha1(pickle.dumps(f[-1])).hexdigest()), **kw)
    return {"dispatched": dispatched, "examples": res.examples,
            "first": res.first_failure_examples, "failures": res.failures,
            "kind": res.failure.kind if res.failure else None,
            "scenario": res.scenario,
            "corpus": res.corpus_path.name if res.corpus_path else None,
            "flaky": res.flaky, "stopped": res.stopped}


@pytest.mark.parametrize("target", ["tests.targets:shifted_rows", "pr-fix", "pre-fix",
                                    "tests.targets:kills_rank", "main-gather"])
def test_drawing_ahead_makes_the_same_run_as_waiting(cpu_pool, ci_settings, target, tmp_path):
    sync = _campaign(cpu_pool, ci_settings, target, False, tmp_path)
    ahead = _campaign(cpu_pool, ci_settings, target, True, tmp_path)
    extra = len(ahead["dispatched"]) - len(sync["dispatched"])
    if sync["first"] is not None and extra == 1:
        # Sent behind the first failure before its verdict was read, then
        # dropped unjudged: a run that waited never drew it.
        del ahead["dispatched"][sync["first"]]
    assert ahead == sync
    assert (sync["kind"] is None) == (target == "main-gather")


def test_counting_failures_ahead_counts_the_same(cpu_pool, ci_settings, tmp_path):
    kw = {"stop_on_failure": False}
    sync = _campaign(cpu_pool, ci_settings, "tests.targets:shifted_rows", False, tmp_path, **kw)
    ahead = _campaign(cpu_pool, ci_settings, "tests.targets:shifted_rows", True, tmp_path, **kw)
    assert ahead == sync and sync["failures"] > 0 and sync["examples"] == 60


def _logged(monkeypatch, target):
    """The default strategy, with each draw, send and collection logged in order."""
    log = []
    real_submit, real_collect = RankPool.submit, RankPool.collect

    def submit(self, *a, **k):
        log.append("send")
        return real_submit(self, *a, **k)

    def collect(self, *a, **k):
        outcome = real_collect(self, *a, **k)
        log.append("got")
        return outcome

    monkeypatch.setattr(RankPool, "submit", submit)
    monkeypatch.setattr(RankPool, "collect", collect)
    strategy = targets.protocol_of(target).part("strategy")(world_size=2)
    return log, strategy.map(lambda s: log.append("draw") or s)


@pytest.mark.parametrize("pipeline", [True, False])
def test_the_next_draw_happens_while_the_ranks_run(cpu_pool, ci_settings, monkeypatch,
                                                   pipeline):
    log, strategy = _logged(monkeypatch, "main-gather")
    driver.fuzz(cpu_pool, "main-gather", ci_settings, max_examples=20, seed=1,
                strategy=strategy, pipeline=pipeline)
    sends = [i for i, e in enumerate(log) if e == "send"]
    gots = [i for i, e in enumerate(log) if e == "got"]
    draws = [i for i, e in enumerate(log) if e == "draw"]
    assert len(sends) == len(gots) == 20
    # Ahead, example n+1 is drawn after example n was sent, and sent before
    # n's verdict is read (the ranks go on to it without waiting for the
    # driver); waiting, only after.
    overlapped = [sends[n] < draws[n + 1] < sends[n + 1] < gots[n] for n in range(19)]
    assert all(overlapped) if pipeline else not any(overlapped)


def test_ctrl_c_in_the_draw_keeps_the_failure_in_flight(cpu_pool, ci_settings, tmp_path):
    draws = []

    def interrupt_second(s):
        draws.append(s)
        if len(draws) == 2:  # pre-fix fails its first example on CPU, every seed
            raise KeyboardInterrupt
        return s

    strategy = targets.protocol_of("pre-fix").part("strategy")(world_size=2)
    # The ranks load the target first, so that its first example is quick.
    driver.fuzz(cpu_pool, "pre-fix", ci_settings, max_examples=1, seed=0, pipeline=False)
    res = driver.fuzz(cpu_pool, "pre-fix", ci_settings, max_examples=50, seed=0,
                      strategy=strategy.map(interrupt_second), corpus_dir=tmp_path)
    assert res.interrupted and res.examples == 1
    assert res.failure.kind == "lifetime" and res.scenario is draws[0]
    assert res.corpus_path.exists()


def test_ctrl_c_while_a_verdict_is_read_keeps_it_and_drops_the_one_sent_behind(
        cpu_pool, ci_settings, tmp_path, monkeypatch):
    """Example 2 is already with the ranks when example 1's verdict is read:
    a Ctrl-C there keeps 1's finding, and 2 is not counted."""
    driver.fuzz(cpu_pool, "pre-fix", ci_settings, max_examples=1, seed=0, pipeline=False)
    real, read = driver._settle, []

    def interrupted_once(pool, ticket):
        read.append(ticket)
        if len(read) == 1:
            raise KeyboardInterrupt
        return real(pool, ticket)

    monkeypatch.setattr(driver, "_settle", interrupted_once)
    res = driver.fuzz(cpu_pool, "pre-fix", ci_settings, max_examples=50, seed=0,
                      corpus_dir=tmp_path)
    assert res.interrupted and res.examples == 1 and res.failure.kind == "lifetime"
    assert res.corpus_path.exists()
    main = targets.resolve_target("main-gather")
    assert cpu_pool.run(main, res.scenario).failure is None  # the pool still answers
