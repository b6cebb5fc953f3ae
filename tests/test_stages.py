"""The stage counters: exclusive times that add up, on a clock the test drives."""

import pytest

from fuzz import stages


@pytest.fixture
def clock(monkeypatch):
    """Enabled counters on a fake clock, put back as they were afterwards."""
    now = [100.0]
    monkeypatch.setattr(stages, "perf_counter", lambda: now[0])
    monkeypatch.setattr(stages, "_totals", {})
    monkeypatch.setattr(stages, "_stack", [])
    for name in ("enabled", "enter", "leave", "_mark"):
        monkeypatch.setattr(stages, name, getattr(stages, name))
    stages.enable("base")

    def tick(seconds):
        now[0] += seconds
    return tick


def test_a_nested_stage_pauses_the_one_around_it(clock):
    clock(1.0)
    stages.enter("outer")
    clock(2.0)
    stages.enter("inner")
    clock(4.0)
    stages.leave()
    clock(8.0)
    stages.leave()
    clock(16.0)
    assert stages.totals() == {"base": 17.0, "outer": 10.0, "inner": 4.0}
    assert sum(stages.totals().values()) == 31.0  # every second counted once


def test_restart_closes_what_an_exception_left_open(clock):
    stages.enter("runner")
    stages.enter("lifetime")
    clock(3.0)  # ...and an exception skips both leaves
    stages.restart("idle")
    clock(5.0)
    stages.leave()  # the base is never left
    clock(1.0)
    assert stages.totals() == {"lifetime": 3.0, "idle": 6.0}


def test_since_and_device_time_outside_the_stack(clock):
    clock(2.0)
    before = stages.totals()
    stages.add(stages.GPU, 0.5)
    stages.enter("x")
    clock(1.0)
    stages.leave()
    assert stages.since(before, stages.totals()) == {stages.GPU: 0.5, "x": 1.0}


def test_off_by_default_costs_nothing_and_counts_nothing(monkeypatch):
    monkeypatch.setattr(stages, "_totals", {})
    monkeypatch.setattr(stages, "enabled", False)
    monkeypatch.setattr(stages, "enter", stages._off)
    monkeypatch.setattr(stages, "leave", stages._off)
    stages.enter("x")
    stages.leave()
    stages.add("gpu", 1.0)
    stages.restart("idle")
    assert stages.totals() == {}
