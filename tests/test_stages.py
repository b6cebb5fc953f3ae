"""The stage counters: exclusive times that add up, on a clock the test drives."""

import pytest

from streamfuzz.fuzz import stages


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


def test_gpu_time_is_the_span_to_the_last_streams_end(clock, monkeypatch):
    """CUDA-only code, checked here with fake events: the span runs from the
    start event to the latest end event over the main and the target's streams."""
    import torch

    from streamfuzz.fuzz.streams import _GpuSpan

    recorded = []

    class FakeEvent:
        def __init__(self, enable_timing=False):
            assert enable_timing
            self.at = None

        def record(self, stream):
            self.at = {"main": 0.0, "side": 7.0}[stream] + 3.0 * (len(recorded) > 0)
            recorded.append(stream)

        def synchronize(self):
            pass

        def elapsed_time(self, end):  # ms, as torch's
            return end.at - self.at

    class FakeStreams:
        created = ["side"]

        def current_stream(self):
            return "main"

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    span = _GpuSpan(FakeStreams())
    span.stop()
    assert recorded == ["main", "main", "side"]
    assert stages.totals()[stages.GPU] == pytest.approx(0.010)  # side ended last: 10 ms


def test_gpu_time_is_left_out_when_events_fail(clock, monkeypatch):
    import torch

    from streamfuzz.fuzz.streams import _GpuSpan

    def broken(**_):
        raise RuntimeError("no CUDA here")

    monkeypatch.setattr(torch.cuda, "Event", broken)
    _GpuSpan(object()).stop()  # nothing raised
    assert stages.GPU not in stages.totals()
